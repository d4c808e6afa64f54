"""Thinking-model output as the official `openai` and `anthropic` Python SDKs read it.

No served model thinks (Qwen2.5-Coder has no `<think>` in its template), so this cannot run against `splash serve`.
Instead `cargo test -p splash-api --test reasoning bodies_for_the_sdk_check` writes the router's replies (Qwen3's
chat template over a scripted model, streamed and not, with and without a tool call) to a folder, and the SDKs parse
them through a mock HTTP transport: `reasoning_content` in Chat Completions, reasoning items and
`response.reasoning_text.*` events in Responses (with the SDK's stream accumulator), thinking blocks with
`thinking_delta` / `signature_delta` in Messages (with the SDK's message accumulator).

Usage: scripts/e2e/sdk_reasoning.py [BODIES_DIR]   (without a folder, runs the cargo test into a temporary one)
Run with the e2e SDK venv's python ($SPLASH_HOME/sdkvenv, see run.sh). Prints one line per check and a final
"N passed, M failed"; exits 1 if any failed.
"""

import json

from sdk_mock import Bodies, run_checks


REASONING = "The user greets me. I could answer with\n{\"name\": \"nope\"}\nbut a greeting is better."
CONTENT = "Hello! <b>Hi</b>"
CALL_REASONING = "I need the weather in Paris."
USER = [{"role": "user", "content": "Hi"}]


BODIES = Bodies("reasoning", "bodies_for_the_sdk_check", "SPLASH_REASONING_BODIES")
oai = BODIES.oai
ant = BODIES.ant


def check_chat():
    r = oai("chat").chat.completions.create(model="m", messages=USER)
    m = r.choices[0].message
    assert (m.reasoning_content, m.content) == (REASONING, CONTENT), m
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens, r.usage


def check_chat_stream():
    reasoning = content = ""
    for chunk in oai("chat").chat.completions.create(model="m", messages=USER, stream=True):
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
    assert (reasoning, content) == (REASONING, CONTENT), (reasoning, content)


def check_chat_tool():
    m = oai("chat_tool").chat.completions.create(model="m", messages=USER).choices[0].message
    assert m.reasoning_content == CALL_REASONING, m
    assert json.loads(m.tool_calls[0].function.arguments) == {"city": "Paris"}, m


def check_messages():
    m = ant("messages").messages.create(model="m", max_tokens=10, messages=USER)
    assert [b.type for b in m.content] == ["thinking", "text"], m
    assert (m.content[0].thinking, m.content[1].text) == (REASONING, CONTENT), m


def check_messages_stream():
    with ant("messages").messages.stream(model="m", max_tokens=10, messages=USER) as s:
        thinking = "".join(e.thinking for e in s if e.type == "thinking")
        m = s.get_final_message()
    assert thinking == REASONING, thinking
    assert [b.type for b in m.content] == ["thinking", "text"], m
    assert (m.content[0].thinking, m.content[1].text) == (REASONING, CONTENT), m
    assert m.content[0].signature, m


def check_messages_tool_stream():
    with ant("messages_tool").messages.stream(model="m", max_tokens=10, messages=USER) as s:
        m = s.get_final_message()
    assert [b.type for b in m.content] == ["thinking", "tool_use"], m
    assert (m.content[0].thinking, m.content[1].input) == (CALL_REASONING, {"city": "Paris"}), m
    assert m.stop_reason == "tool_use", m


def check_responses():
    r = oai("responses").responses.create(model="m", input="Hi")
    assert [o.type for o in r.output] == ["reasoning", "message"], r
    assert (r.output[0].content[0].text, r.output_text) == (REASONING, CONTENT), r
    assert r.output[0].id.startswith("rs_") and r.usage.output_tokens_details.reasoning_tokens > 0, r


def check_responses_stream():
    with oai("responses").responses.stream(model="m", input="Hi") as s:
        deltas = "".join(e.delta for e in s if e.type == "response.reasoning_text.delta")
        r = s.get_final_response()
    assert deltas == REASONING, deltas
    assert [o.type for o in r.output] == ["reasoning", "message"], r
    assert (r.output[0].content[0].text, r.output_text) == (REASONING, CONTENT), r


def check_responses_tool_stream():
    with oai("responses_tool").responses.stream(model="m", input="Hi") as s:
        r = s.get_final_response()
    assert [o.type for o in r.output] == ["reasoning", "function_call"], r
    assert json.loads(r.output[1].arguments) == {"city": "Paris"}, r


if __name__ == "__main__":
    run_checks(globals())
