"""Qwen3-Coder's XML tool calls as the official `openai` and `anthropic` Python SDKs read them.

No model the e2e server can run writes the XML form (Qwen3-Coder needs the MoE architecture), so this cannot run
against `splash serve`. Instead `cargo test -p splash-api --test xml_tools xml_calls_in_all_three_apis` writes the
router's replies (the Qwen3-Coder chat template, a scripted model writing the XML call under the lazy tool grammar,
streamed and not) to a folder, and the SDKs parse them through a mock HTTP transport with their stream accumulators:
`chat.completions.stream()`, `responses.stream()` and `messages.stream()`. Checks that every API gives the call with
arguments typed by the tool's schema ({"command": "echo 42 > n.txt", "timeout": 30, "description": "42"}: the number
parameter a number, the string parameter that looks like one a string).

Usage: scripts/e2e/sdk_xml_tools.py [BODIES_DIR]   (without a folder, runs the cargo test into a temporary one)
Run with the e2e SDK venv's python ($SPLASH_HOME/sdkvenv, see run.sh). Prints one line per check and a final
"N passed, M failed"; exits 1 if any failed.
"""

import json

from sdk_mock import Bodies, run_checks


ARGS = {"command": "echo 42 > n.txt", "timeout": 30, "description": "42"}
TEXT = "I'll run it."
USER = [{"role": "user", "content": "Write 42 to n.txt"}]
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"},
                                           "description": {"type": "string"}}, "required": ["command"]}


BODIES = Bodies("xml_tools", "xml_calls_in_all_three_apis", "SPLASH_XML_TOOLS_BODIES")
oai = BODIES.oai
ant = BODIES.ant

CHAT_TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": SCHEMA}}]


def check_chat():
    r = oai("chat").chat.completions.create(model="m", messages=USER, tools=CHAT_TOOLS)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", r
    assert m.content.strip() == TEXT, m
    assert (m.tool_calls[0].function.name, json.loads(m.tool_calls[0].function.arguments)) == ("Bash", ARGS), m


def check_chat_stream():
    with oai("chat").chat.completions.stream(model="m", messages=USER, tools=CHAT_TOOLS) as s:
        deltas = [e.arguments_delta for e in s if e.type == "tool_calls.function.arguments.delta"]
        r = s.get_final_completion()
    assert len(deltas) >= 4, deltas
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", r
    assert (m.tool_calls[0].function.name, json.loads(m.tool_calls[0].function.arguments)) == ("Bash", ARGS), m


def check_messages():
    m = ant("messages").messages.create(model="m", max_tokens=200, messages=USER,
                                        tools=[{"name": "Bash", "input_schema": SCHEMA}])
    assert [b.type for b in m.content] == ["text", "tool_use"], m
    assert (m.content[0].text.strip(), m.content[1].name, m.content[1].input) == (TEXT, "Bash", ARGS), m
    assert m.stop_reason == "tool_use", m


def check_messages_stream():
    with ant("messages").messages.stream(model="m", max_tokens=200, messages=USER,
                                         tools=[{"name": "Bash", "input_schema": SCHEMA}]) as s:
        partial = [e.partial_json for e in s if e.type == "input_json"]
        m = s.get_final_message()
    assert len(partial) >= 4, partial
    assert [b.type for b in m.content] == ["text", "tool_use"], m
    assert (m.content[1].name, m.content[1].input) == ("Bash", ARGS), m
    assert m.stop_reason == "tool_use", m


RESPONSES_TOOLS = [{"type": "function", "name": "Bash", "parameters": SCHEMA}]


def check_responses():
    r = oai("responses").responses.create(model="m", input="Write 42 to n.txt", tools=RESPONSES_TOOLS)
    assert [o.type for o in r.output] == ["message", "function_call"], r
    assert (r.output[1].name, json.loads(r.output[1].arguments)) == ("Bash", ARGS), r


def check_responses_stream():
    with oai("responses").responses.stream(model="m", input="Write 42 to n.txt", tools=RESPONSES_TOOLS) as s:
        deltas = [e.delta for e in s if e.type == "response.function_call_arguments.delta"]
        r = s.get_final_response()
    assert len(deltas) >= 4, deltas
    assert [o.type for o in r.output] == ["message", "function_call"], r
    assert (r.output[1].name, json.loads(r.output[1].arguments)) == ("Bash", ARGS), r


if __name__ == "__main__":
    run_checks(globals())
