"""End-to-end checks of `splash serve` through the official `openai` Python SDK (see run.sh).

Environment: SPLASH_URL (server root), SPLASH_KEY (its --api-key), SPLASH_MODEL (its --served-model-name),
SPLASH_MAX_CONTEXT (its --max-context). The server runs the real Qwen2.5-Coder-0.5B, so the checks are about
protocol behaviour (shapes, finish reasons, usage, tool calls, error classes), never about the wording of a reply.
Prints one line per check and a final "N passed, M failed"; exits 1 if any failed.
"""

import concurrent.futures
import json
import os
import sys
import time
import traceback
import urllib.error
import urllib.request

import openai

URL = os.environ["SPLASH_URL"]
KEY = os.environ["SPLASH_KEY"]
MODEL = os.environ["SPLASH_MODEL"]
MAX_CONTEXT = int(os.environ["SPLASH_MAX_CONTEXT"])

client = openai.OpenAI(base_url=f"{URL}/v1", api_key=KEY, max_retries=0, timeout=300)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]

CHECKS = []


class Skip(Exception):
    """A check that chose not to run."""


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def models_list_reports_the_served_model_and_context():
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL], models
    extra = models[0].model_extra or {}
    assert extra.get("context_length") == MAX_CONTEXT, extra
    assert client.models.retrieve(MODEL).id == MODEL


@check
def plain_completion():
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}],
        max_tokens=24,
        temperature=0,
    )
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r
    assert choice.message.role == "assistant" and choice.message.content, choice
    assert choice.finish_reason in ("stop", "length"), choice
    assert choice.message.tool_calls is None, choice
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 24, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u


@check
def greedy_is_deterministic_and_max_tokens_gives_length():
    def ask():
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Count from 1 to 50."}], max_tokens=12, temperature=0
        )
        return r.choices[0]

    a, b = ask(), ask()
    assert a.message.content == b.message.content, (a, b)
    assert a.finish_reason == "length", a


@check
def seeded_sampling_repeats():
    def ask():
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=10,
            temperature=1.0,
            seed=1234,
        )
        return r.choices[0].message.content

    assert ask() == ask()


@check
def streaming_with_usage():
    messages = [{"role": "user", "content": "Write one short sentence about the sea."}]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text and finishes in (["stop"], ["length"]), (text, finishes)
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == [], chunks[-1]
    # The same text and usage as without streaming.
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    assert r.choices[0].message.content == text, (r.choices[0].message.content, text)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens)


@check
def tool_call_round_trip_with_required_choice():
    r = client.chat.completions.create(
        model=MODEL, messages=QUESTION, tools=[WEATHER], tool_choice="required", max_tokens=60, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_"), call
    assert call.function.name == "get_weather", call
    args = json.loads(call.function.arguments)
    assert "paris" in args["city"].lower(), args
    # Send the result back and get a final answer.
    messages = QUESTION + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21, "sky": "sunny"})},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=40, temperature=0
    )
    final = r.choices[0]
    assert final.message.content and not final.message.tool_calls, final
    assert final.finish_reason in ("stop", "length"), final


@check
def tool_call_with_auto_choice_untagged_json_is_parsed():
    # Qwen2.5-Coder-0.5B writes this call as fenced or bare JSON, not in <tool_call> tags (models.md §11).
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[WEATHER], max_tokens=80, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls[0].function.name == "get_weather", choice
    assert "```" not in (choice.message.content or ""), choice


@check
def named_tool_choice_streaming():
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
        temperature=0,
        stream=True,
    )
    calls, finish = {}, None
    for c in stream:
        if not c.choices:
            continue
        for tc in c.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather", (finish, calls)
    assert "city" in json.loads(calls[0]["arguments"]), calls


@check
def concurrent_greedy_requests_match_single_ones():
    """Issue 5's batching acceptance test: eight greedy requests at once give the same text as each alone (the CPU
    kernels and attention compute a row identically whatever else is in the batch)."""
    prompts = [f"Write a haiku about the number {i}." for i in range(8)]

    def ask(prompt):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=24, temperature=0
        )
        return r.choices[0].message.content

    alone = [ask(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(ask, prompts))
    mismatches = [i for i, (a, b) in enumerate(zip(alone, together)) if a != b]
    assert not mismatches, [(alone[i], together[i]) for i in mismatches]


RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": WEATHER["function"]["parameters"],
}


@check
def responses_text_stream_and_previous_response_id():
    r = client.responses.create(model=MODEL, input="Say hello.", instructions="Be terse.", max_output_tokens=20, temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete") and r.id.startswith("resp_"), r
    assert r.output[0].type == "message" and r.output_text, r
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage
    assert client.responses.retrieve(r.id).id == r.id
    # Streaming: the SDK assembles the final response from the events.
    with client.responses.stream(model=MODEL, input="Say hello.", instructions="Be terse.", max_output_tokens=20, temperature=0) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_response()
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] in ("response.completed", "response.incomplete"), types
    assert final.output_text == r.output_text, (final.output_text, r.output_text)
    # Continue from the stored response.
    follow = client.responses.create(
        model=MODEL, input="And again.", previous_response_id=r.id, max_output_tokens=8, temperature=0
    )
    assert follow.previous_response_id == r.id
    assert follow.usage.input_tokens > r.usage.input_tokens, (follow.usage, r.usage)
    client.responses.delete(r.id)
    expect(openai.NotFoundError, lambda: client.responses.retrieve(r.id), 404)


@check
def responses_function_call_round_trip():
    r = client.responses.create(
        model=MODEL,
        input=QUESTION[0]["content"],
        tools=[RESPONSES_TOOL, {"type": "web_search"}],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
        store=False,
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather", r.output
    args = json.loads(calls[0].arguments)
    assert "paris" in args["city"].lower(), args
    final = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": QUESTION[0]["content"]},
            {"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name, "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"sky": "sunny"})},
        ],
        tools=[RESPONSES_TOOL],
        tool_choice="none",
        max_output_tokens=40,
        temperature=0,
        store=False,
    )
    assert final.output_text, final


# A custom (free-form) tool, as Codex declares its apply_patch: a grammar for the one string it takes.
NOTE_TOOL = {
    "type": "custom",
    "name": "save_note",
    "description": "Saves a short note for the user.",
    "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Za-z ,.]+"},
}


@check
def responses_custom_tool_round_trip():
    # The SDK parses every event of the stream into its types (custom_tool_call items, custom_tool_call_input events).
    with client.responses.stream(
        model=MODEL,
        input="Save a note that says: buy milk",
        tools=[NOTE_TOOL],
        tool_choice={"type": "custom", "name": "save_note"},
        max_output_tokens=80,
        temperature=0,
        store=False,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    calls = [o for o in final.output if o.type == "custom_tool_call"]
    assert calls and calls[0].name == "save_note" and calls[0].input.strip(), final.output
    done = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    assert len(done) == 1 and done[0].input == calls[0].input == deltas, (types, calls[0])
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "custom_tool_call"]
    assert added and added[0].id == calls[0].id == done[0].item_id, (added, calls[0])
    # The call and its output go back; the model answers in text.
    final = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Save a note that says: buy milk"},
            {"type": "custom_tool_call", "call_id": calls[0].call_id, "name": "save_note", "input": calls[0].input},
            {"type": "custom_tool_call_output", "call_id": calls[0].call_id, "output": "Saved."},
        ],
        tools=[NOTE_TOOL],
        tool_choice="none",
        max_output_tokens=40,
        temperature=0,
        store=False,
    )
    assert final.output_text, final


def http(method, path, body=None, headers=None):
    """(status, JSON body) of a raw request."""
    data = body.encode() if body is not None else None
    request = urllib.request.Request(f"{URL}{path}", data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def expect(error_class, fn, status):
    try:
        fn()
    except error_class as e:
        assert e.status_code == status, (e.status_code, e)
        body = e.body if isinstance(e.body, dict) else {}
        assert "message" in body and "type" in body, e.body
        return e
    raise AssertionError(f"expected {error_class.__name__}")


@check
def bad_requests_raise_the_right_error_classes():
    create = client.chat.completions.create
    expect(openai.BadRequestError, lambda: create(model=MODEL, messages=QUESTION, n=0), 400)
    expect(openai.BadRequestError, lambda: create(model=MODEL, messages=QUESTION, logprobs=True, top_logprobs=21), 400)
    expect(openai.BadRequestError, lambda: create(model=MODEL, messages=QUESTION, temperature=7), 400)
    expect(openai.BadRequestError, lambda: create(model=MODEL, messages=[]), 400)
    expect(openai.BadRequestError, lambda: create(model=MODEL, messages=[{"role": "wizard", "content": "x"}]), 400)
    expect(openai.BadRequestError, lambda: create(model=MODEL, messages=QUESTION, tool_choice="required"), 400)
    e = expect(
        openai.BadRequestError,
        lambda: create(model=MODEL, messages=[{"role": "user", "content": "word " * (MAX_CONTEXT * 2)}]),
        400,
    )
    assert e.code == "context_length_exceeded", e
    expect(openai.NotFoundError, lambda: client.models.retrieve("no-such-model"), 404)
    wrong = openai.OpenAI(base_url=f"{URL}/v1", api_key="wrong", max_retries=0)
    expect(openai.AuthenticationError, lambda: wrong.models.list(), 401)
    # Malformed JSON and a wrong type get OpenAI's error shape too, never a dropped connection or a 500.
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    for body in ["{not json", '{"messages": "nope"}', ""]:
        status, reply = http("POST", "/v1/chat/completions", body, headers)
        assert status == 400 and "message" in reply["error"], (body, status, reply)
    # Health stays open.
    assert http("GET", "/health") == (200, {"status": "ok"})


def main():
    passed = failed = 0
    for fn in CHECKS:
        t0 = time.time()
        try:
            fn()
        except Skip as e:
            print(f"skip {fn.__name__}: {e}")
            continue
        except Exception:
            failed += 1
            print(f"FAIL {fn.__name__} ({time.time() - t0:.1f} s)")
            traceback.print_exc()
        else:
            passed += 1
            print(f"ok   {fn.__name__} ({time.time() - t0:.1f} s)")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
