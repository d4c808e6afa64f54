"""End-to-end checks of `splash serve` through the official `anthropic` Python SDK (see run.sh).

Same environment and output as sdk_openai.py: SPLASH_URL, SPLASH_KEY, SPLASH_MODEL, SPLASH_MAX_CONTEXT; one line per
check and a final "N passed, M failed"; exit 1 if any failed. Checks protocol behaviour, never reply wording.
"""

import json
import os
import sys
import time
import traceback

import anthropic

URL = os.environ["SPLASH_URL"]
KEY = os.environ["SPLASH_KEY"]
MODEL = os.environ["SPLASH_MODEL"]
MAX_CONTEXT = int(os.environ["SPLASH_MAX_CONTEXT"])

client = anthropic.Anthropic(base_url=URL, api_key=KEY, max_retries=0, timeout=300)

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
    },
}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
# This SDK version has no sampling arguments; the server still reads `temperature` from the body.
GREEDY = {"temperature": 0}

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def text_message_and_count_tokens():
    kwargs = dict(
        model=MODEL,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "Say hello."}],
    )
    m = client.messages.create(max_tokens=24, extra_body=GREEDY, **kwargs)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), m
    assert m.content and m.content[0].type == "text" and m.content[0].text, m
    assert m.stop_reason in ("end_turn", "max_tokens"), m
    assert 0 < m.usage.output_tokens <= 24, m.usage
    count = client.messages.count_tokens(**kwargs)
    # Anthropic's accounting: input_tokens are the prompt tokens computed, cache_read_input_tokens those reused from
    # the prefix cache; together they are the prompt count_tokens reports.
    assert count.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens, (count, m.usage)


@check
def streaming_text_matches_non_streaming():
    kwargs = dict(model=MODEL, max_tokens=20, extra_body=GREEDY, messages=[{"role": "user", "content": "Describe the sea."}])
    with client.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text, (text, final)
    assert final.stop_reason == "max_tokens", final
    m = client.messages.create(**kwargs)
    assert m.content[0].text == text, (m.content[0].text, text)
    prompt = lambda u: u.input_tokens + (u.cache_read_input_tokens or 0)  # noqa: E731
    assert (prompt(m.usage), m.usage.output_tokens) == (prompt(final.usage), final.usage.output_tokens), (m.usage, final.usage)
    # The second identical prompt reuses the first one's KV (all but its last token).
    assert m.usage.cache_read_input_tokens > 0, m.usage


@check
def tool_round_trip_with_any_choice():
    m = client.messages.create(
        model=MODEL, max_tokens=60, extra_body=GREEDY, messages=QUESTION, tools=[WEATHER], tool_choice={"type": "any"}
    )
    assert m.stop_reason == "tool_use", m
    use = [b for b in m.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and "paris" in use.input["city"].lower(), use
    messages = QUESTION + [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": json.dumps({"sky": "sunny"})}],
        },
    ]
    final = client.messages.create(
        model=MODEL, max_tokens=40, extra_body=GREEDY, messages=messages, tools=[WEATHER], tool_choice={"type": "none"}
    )
    assert final.stop_reason in ("end_turn", "max_tokens"), final
    assert final.content[0].type == "text" and final.content[0].text, final


@check
def streaming_tool_use_with_auto_choice():
    with client.messages.stream(model=MODEL, max_tokens=80, extra_body=GREEDY, messages=QUESTION, tools=[WEATHER]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use", final
    use = [b for b in final.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and "city" in use.input, use


@check
def claude_code_quirks_are_accepted():
    m = client.messages.create(
        model=MODEL,
        max_tokens=16,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0; cch=0;"},
            {"type": "text", "text": "You are an agent."},
        ],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": "# Environment\nlinux"},
        ],
        extra_query={"beta": "true"},
        extra_body={"temperature": 0, "thinking": {"type": "adaptive"}, "context_management": {"edits": []}},
    )
    assert m.content[0].text, m


def expect(error_class, fn, status):
    try:
        fn()
    except error_class as e:
        assert e.status_code == status, (e.status_code, e)
        assert e.body["type"] == "error" and e.body["error"]["message"], e.body
        return e
    raise AssertionError(f"expected {error_class.__name__}")


@check
def errors_raise_the_right_classes():
    create = client.messages.create
    e = expect(
        anthropic.BadRequestError,
        lambda: create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "word " * (MAX_CONTEXT * 2)}]),
        400,
    )
    message = e.body["error"]["message"]
    assert message.startswith("prompt is too long: ") and message.endswith(f" > {MAX_CONTEXT} maximum"), message
    expect(anthropic.BadRequestError, lambda: create(model=MODEL, max_tokens=5, messages="nope"), 400)
    expect(
        anthropic.BadRequestError,
        lambda: create(model=MODEL, max_tokens=5, messages=QUESTION, tool_choice={"type": "tool", "name": "nope"}),
        400,
    )
    wrong = anthropic.Anthropic(base_url=URL, api_key="wrong", max_retries=0)
    expect(anthropic.AuthenticationError, lambda: wrong.messages.create(model=MODEL, max_tokens=5, messages=QUESTION), 401)


def main():
    passed = failed = 0
    for fn in CHECKS:
        t0 = time.time()
        try:
            fn()
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
