"""End-to-end checks of structured output, log-probabilities, `n` and stop sequences through the official SDKs
(see run.sh; same environment as sdk_openai.py). The server runs the real Qwen2.5-Coder-0.5B; each check compares
against something independent of the server's own code path: `jsonschema` validation, the greedy reply of a plain
request, or the invariants of a log-softmax.
"""

import json
import math

import anthropic
import jsonschema

from sdk_openai import KEY, MODEL, QUESTION, URL, WEATHER, Skip, client  # noqa: F401

aclient = anthropic.Anthropic(base_url=URL, api_key=KEY, max_retries=0, timeout=300)

CHECKS = []
# anthropic 2.14.0 has no `temperature` argument; the server reads it from the body.
GREEDY = {"temperature": 0}


def check(fn):
    CHECKS.append(fn)
    return fn


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "languages": {"type": "array", "items": {"type": "string", "enum": ["rust", "python", "go", "c"]}, "maxItems": 4},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "languages", "employed"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Invent a programmer and describe them: name, age, languages, whether employed."}]


@check
def json_schema_output_validates():
    for stream in (False, True):
        kwargs = dict(model=MODEL, messages=ASK, max_tokens=200, temperature=0,
                      response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs) if c.choices)
        else:
            r = client.chat.completions.create(**kwargs)
            assert r.choices[0].finish_reason == "stop", r
            text = r.choices[0].message.content
        jsonschema.validate(json.loads(text), PERSON)
    # json_object: any JSON object, from the first token (the 0.5B would otherwise open with prose or a fence).
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=200, temperature=0,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict), r.choices[0].message.content


@check
def responses_text_format_json_schema_validates():
    r = client.responses.create(model=MODEL, input=ASK[0]["content"], max_output_tokens=200, temperature=0,
                                text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), PERSON)


@check
def forced_tool_arguments_validate_against_the_tool_schema():
    tool = {"type": "function", "function": {"name": "add_person", "description": "Store a person", "parameters": PERSON}}
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[tool], temperature=0, max_tokens=200,
                                       tool_choice={"type": "function", "function": {"name": "add_person"}})
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "add_person" and r.choices[0].finish_reason == "tool_calls", r
    jsonschema.validate(json.loads(call.function.arguments), PERSON)
    # Anthropic tool_choice any: the same grammar.
    m = aclient.messages.create(model=MODEL, max_tokens=200, messages=ASK, tool_choice={"type": "any"},
                                tools=[{"name": "add_person", "description": "Store a person", "input_schema": PERSON}])
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses and m.stop_reason == "tool_use", m
    jsonschema.validate(uses[0].input, PERSON)


@check
def logprobs_are_a_log_softmax_and_greedy_picks_the_top():
    for stream in (False, True):
        kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Name three fruits."}], max_tokens=16,
                      temperature=0, logprobs=True, top_logprobs=5)
        if stream:
            text, entries = "", []
            for c in client.chat.completions.create(stream=True, **kwargs):
                if c.choices:
                    text += c.choices[0].delta.content or ""
                    if c.choices[0].logprobs and c.choices[0].logprobs.content:
                        entries += c.choices[0].logprobs.content
        else:
            r = client.chat.completions.create(**kwargs)
            text, entries = r.choices[0].message.content, r.choices[0].logprobs.content
        assert entries and "".join(e.token for e in entries) == text, (text, [e.token for e in entries])
        for e in entries:
            assert len(e.top_logprobs) == 5, e
            top = [t.logprob for t in e.top_logprobs]
            assert all(lp <= 1e-6 for lp in top) and top == sorted(top, reverse=True), top
            assert sum(math.exp(lp) for lp in top) <= 1.0 + 1e-4, top
            # Greedy: the chosen token is the most likely one.
            assert e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5, e
            assert bytes(e.bytes).decode("utf-8", "replace") == e.token or e.bytes == list(e.token.encode()), e


@check
def n_greedy_choices_equal_the_single_reply():
    messages = [{"role": "user", "content": "Write a haiku about Rust."}]
    one = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2], r
    assert all(c.message.content == one.choices[0].message.content for c in r.choices), r
    assert r.usage.completion_tokens == 3 * one.usage.completion_tokens, (r.usage, one.usage)
    # Sampled with a seed: each choice is reproducible (seed + index).
    a = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=1.0, seed=11, n=2)
    b = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=1.0, seed=11, n=2)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]


@check
def anthropic_stop_sequence_is_reported():
    messages = [{"role": "user", "content": "Count from one to ten in words, separated by spaces."}]
    full = aclient.messages.create(model=MODEL, max_tokens=60, extra_body=GREEDY, messages=messages)
    text = full.content[0].text
    words = text.split()
    if len(words) < 4:
        raise Skip(f"reply too short to pick a stop sequence: {text!r}")
    stop = words[len(words) // 2]
    m = aclient.messages.create(model=MODEL, max_tokens=60, extra_body=GREEDY, messages=messages, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop, m
    assert m.content[0].text == text[: text.index(stop)], (m.content[0].text, text, stop)
    with aclient.messages.stream(model=MODEL, max_tokens=60, extra_body=GREEDY, messages=messages,
                                 stop_sequences=[stop]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop, final


def tool_call_deltas(stream):
    """A streamed Chat Completion's tool-call deltas: (argument pieces, names, finish reason)."""
    pieces, names, finish = [], [], None
    for c in stream:
        if not c.choices:
            continue
        for d in c.choices[0].delta.tool_calls or []:
            if d.function and d.function.name:
                names.append(d.function.name)
            if d.function and d.function.arguments:
                pieces.append(d.function.arguments)
        finish = c.choices[0].finish_reason or finish
    return pieces, names, finish


@check
def forced_call_arguments_stream_in_pieces():
    tool = {"type": "function", "function": {"name": "add_person", "description": "Store a person", "parameters": PERSON}}
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[tool], temperature=0, max_tokens=200,
                                            stream=True, tool_choice={"type": "function", "function": {"name": "add_person"}})
    pieces, names, finish = tool_call_deltas(stream)
    assert names == ["add_person"] and finish == "tool_calls", (names, finish)
    assert len(pieces) >= 3, pieces
    jsonschema.validate(json.loads("".join(pieces)), PERSON)
    # Anthropic: input_json_delta events; the SDK's accumulated input validates.
    with aclient.messages.stream(model=MODEL, max_tokens=200, messages=ASK, tool_choice={"type": "any"}, extra_body=GREEDY,
                                 tools=[{"name": "add_person", "description": "Store a person", "input_schema": PERSON}]) as s:
        num_deltas = sum(1 for e in s if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
        final = s.get_final_message()
    assert num_deltas >= 3, num_deltas
    uses = [b for b in final.content if b.type == "tool_use"]
    assert uses and final.stop_reason == "tool_use", final
    jsonschema.validate(uses[0].input, PERSON)


@check
def auto_call_arguments_stream_in_pieces():
    # tool_choice auto: the model starts the call itself (the lazy tool grammar holds it from there); its arguments
    # stream as they are written, in Chat Completions, Anthropic Messages and Responses alike.
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[WEATHER], temperature=0,
                                            max_tokens=120, stream=True)
    pieces, names, finish = tool_call_deltas(stream)
    assert names == ["get_weather"] and finish == "tool_calls", (names, finish)
    assert len(pieces) >= 3, pieces
    jsonschema.validate(json.loads("".join(pieces)), WEATHER["function"]["parameters"])
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"],
            "input_schema": WEATHER["function"]["parameters"]}
    with aclient.messages.stream(model=MODEL, max_tokens=120, messages=QUESTION, tools=[tool], extra_body=GREEDY) as s:
        num_deltas = sum(1 for e in s if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert uses and final.stop_reason == "tool_use" and num_deltas >= 3, (num_deltas, final)
    jsonschema.validate(uses[0].input, WEATHER["function"]["parameters"])
    rtool = {"type": "function", "name": "get_weather", "description": WEATHER["function"]["description"],
             "parameters": WEATHER["function"]["parameters"]}
    events = list(client.responses.create(model=MODEL, input=QUESTION[0]["content"], tools=[rtool], temperature=0,
                                          max_output_tokens=120, stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(deltas) >= 3 and done and "".join(deltas) == done[0].arguments, (deltas, done)
    jsonschema.validate(json.loads(done[0].arguments), WEATHER["function"]["parameters"])


@check
def cached_prompt_tokens_are_reported():
    messages = [{"role": "system", "content": "You are a careful assistant. " * 20},
                {"role": "user", "content": "Say yes."}]
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    r = raw.parse()
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < r.usage.prompt_tokens, r.usage
    timings = json.loads(raw.text)["timings"]
    assert timings["cache_n"] == cached and timings["prompt_n"] == r.usage.prompt_tokens - cached, timings
    m = aclient.messages.create(model=MODEL, max_tokens=4, extra_body=GREEDY, system=messages[0]["content"],
                                messages=messages[1:])
    assert m.usage.cache_read_input_tokens > 0, m.usage
