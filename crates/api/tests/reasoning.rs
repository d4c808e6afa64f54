//! Thinking models through the whole router, in all three APIs: a Qwen3 chat template (the model thinks in
//! `<think>` … `</think>` and has the `enable_thinking` switch) and a QwQ / DeepSeek-R1-style one (the generation
//! prompt opens `<think>`), over the real Qwen2.5-Coder tokenizer (which spells the tags in several tokens, so every
//! tag arrives split across tokens) and a scripted model. Checks that the reasoning comes out apart from the content
//! (`reasoning_content`, reasoning items, thinking blocks), streamed and not, with tool calls after it; that the
//! switches turn thinking off in the prompt; that earlier reasoning reaches the template; and that output without
//! think tags, or a model whose template does not think, is unchanged.

mod common;

use api::{ReasoningFormat, ServerConfig};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Harness, Options, assets, body_text, harness, named_events, sse_data};
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const RESPONSES: &str = "/v1/responses";

/// Qwen3's chat template (as published with the Qwen3 models).
const QWEN3: &str = include_str!("fixtures/qwen3_chat_template.jinja");

/// A QwQ-style template: ChatML whose generation prompt opens the reasoning, so the model writes only `</think>`;
/// earlier assistant turns are shown without their reasoning.
const OPENS_THINK: &str = "{%- for m in messages %}{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + \
     m.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>' + m.role + '\\n' + \
     m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}\
     {{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}";

const REASONING: &str = "The user greets me. I could answer with\n{\"name\": \"nope\"}\nbut a greeting is better.";
const THINKING_REPLY: &str = "<think>\nThe user greets me. I could answer with\n{\"name\": \"nope\"}\nbut a greeting is better.\n</think>\n\nHello! <b>Hi</b>";
const CONTENT: &str = "Hello! <b>Hi</b>";

const CALL_REPLY: &str = "<think>\nI need the weather in Paris.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

fn qwen3() -> Harness {
    harness(Options { template: Some(QWEN3.into()), ..Default::default() })
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather", "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

/// The generated tokens of `reply` that lie (at least partly) before the end of its `</think>`: the reasoning
/// tokens, counted on the tokenizer's own split of the reply.
fn num_reasoning_tokens(reply: &str) -> usize {
    let end = reply.find("</think>").expect("a think block") + "</think>".len();
    let mut start = 0;
    let mut n = 0;
    for id in assets().tokenizer.encode(reply, true).unwrap() {
        if start < end {
            n += 1;
        }
        start += assets().tokenizer.token_bytes(id).len();
    }
    n
}

async fn stream_body(h: &Harness, path: &str, body: &Value) -> String {
    let request =
        Request::post(path).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap();
    let response = h.send(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    body_text(response).await
}

/// Joined `reasoning_content` and `content` deltas of a Chat Completions stream, the tool-call deltas, and the
/// finish reason; checks that no reasoning follows content.
fn chat_stream(body: &str) -> (String, String, Vec<Value>, String) {
    let (mut reasoning, mut content, mut calls, mut finish) = (String::new(), String::new(), Vec::new(), String::new());
    for data in sse_data(body) {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&data).unwrap();
        let Some(choice) = chunk["choices"].get(0) else { continue };
        let delta = &choice["delta"];
        if let Some(r) = delta["reasoning_content"].as_str() {
            assert!(content.is_empty() && calls.is_empty(), "reasoning after content: {body}");
            assert!(delta.get("content").is_none(), "one kind per chunk: {data}");
            reasoning.push_str(r);
        }
        if let Some(c) = delta["content"].as_str() {
            content.push_str(c);
        }
        if let Some(tc) = delta["tool_calls"].as_array() {
            calls.extend(tc.iter().cloned());
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_owned();
        }
    }
    (reasoning, content, calls, finish)
}

#[tokio::test]
async fn chat_completions_reasoning_content() {
    let h = qwen3();
    h.reply(THINKING_REPLY);
    let messages = json!([{"role": "user", "content": "Hi"}]);
    let (status, r) = h.post_json(CHAT, &json!({"messages": messages})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let m = &r["choices"][0]["message"];
    assert_eq!((m["reasoning_content"].as_str(), m["content"].as_str()), (Some(REASONING), Some(CONTENT)), "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let num_reply = assets().tokenizer.encode(THINKING_REPLY, true).unwrap().len();
    assert_eq!(r["usage"]["completion_tokens"], num_reply + 1, "reasoning tokens are output tokens");
    let num_reasoning = num_reasoning_tokens(THINKING_REPLY);
    assert_eq!(r["usage"]["completion_tokens_details"]["reasoning_tokens"], num_reasoning, "{r}");
    // Qwen3 thinks by default: the prompt ends with the bare assistant header.
    assert!(h.last_prompt_text().ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));

    let streaming = json!({"messages": messages, "stream": true, "stream_options": {"include_usage": true}});
    let body = stream_body(&h, CHAT, &streaming).await;
    let (reasoning, content, calls, finish) = chat_stream(&body);
    assert_eq!((reasoning.as_str(), content.as_str(), calls.len(), finish.as_str()), (REASONING, CONTENT, 0, "stop"));
    let usage: Value = sse_data(&body)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|c| c["usage"].is_object())
        .expect("a usage chunk")["usage"]
        .clone();
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], num_reasoning, "{usage}");
    // Streamed piece by piece (the tags span several tokens), none holding a part of a tag.
    let num_reasoning_chunks = body.matches("\"reasoning_content\"").count();
    assert!(num_reasoning_chunks > 5, "{num_reasoning_chunks} reasoning chunks");
    for data in sse_data(&body) {
        assert!(!data.contains("think>") && !data.contains("<think"), "{data}");
    }
}

#[tokio::test]
async fn chat_completions_tool_call_after_reasoning() {
    let h = qwen3();
    h.reply(CALL_REPLY);
    let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [weather_tool()]});
    let (status, r) = h.post_json(CHAT, &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let m = &r["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "I need the weather in Paris.");
    assert_eq!(m["content"], Value::Null, "{r}");
    assert_eq!(m["tool_calls"][0]["function"]["name"], "get_weather");
    let arguments: Value = serde_json::from_str(m["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (reasoning, content, calls, finish) = chat_stream(&stream_body(&h, CHAT, &streaming).await);
    assert_eq!(
        (reasoning.as_str(), content.as_str(), finish.as_str()),
        ("I need the weather in Paris.", "", "tool_calls")
    );
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let joined: String = calls.iter().filter_map(|c| c["function"]["arguments"].as_str()).collect();
    assert_eq!(serde_json::from_str::<Value>(&joined).unwrap(), json!({"city": "Paris"}));
}

#[tokio::test]
async fn a_call_sketched_inside_the_reasoning_is_not_held_by_the_tool_grammar() {
    // The reasoning starts a line with `{"name": "nope"`: were the lazy grammar watching the reasoning, it would
    // hold that to a declared tool and the scripted model could not write it.
    let h = qwen3();
    h.reply(&format!("<think>\n{REASONING}\n</think>\n\n{}", &CALL_REPLY[CALL_REPLY.find("<tool_call>").unwrap()..]));
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "tools": [weather_tool()], "stream": true});
    let (reasoning, content, calls, finish) = chat_stream(&stream_body(&h, CHAT, &body).await);
    assert_eq!((reasoning.as_str(), content.as_str(), finish.as_str()), (REASONING, "", "tool_calls"));
    // The call after the reasoning is held by the grammar: its arguments stream as they are generated.
    assert!(calls.len() > 2, "{calls:?}");
    let joined: String = calls.iter().filter_map(|c| c["function"]["arguments"].as_str()).collect();
    assert_eq!(serde_json::from_str::<Value>(&joined).unwrap(), json!({"city": "Paris"}));
}

#[tokio::test]
async fn switches_turn_thinking_off_in_the_prompt() {
    let off_prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    let h = qwen3();
    h.reply("Hello!");
    let messages = json!([{"role": "user", "content": "Hi"}]);
    for body in [
        json!({"messages": messages, "reasoning_effort": "none"}),
        json!({"messages": messages, "chat_template_kwargs": {"enable_thinking": false}}),
    ] {
        let (status, r) = h.post_json(CHAT, &body).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        assert!(h.last_prompt_text().ends_with(off_prompt), "{body}: {:?}", h.last_prompt_text());
        assert_eq!(r["choices"][0]["message"]["content"], "Hello!");
        assert!(r["choices"][0]["message"].get("reasoning_content").is_none(), "{r}");
    }
    let (status, r) =
        h.post_json(MESSAGES, &json!({"max_tokens": 50, "messages": messages, "thinking": {"type": "disabled"}})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert!(h.last_prompt_text().ends_with(off_prompt));
    assert_eq!(r["content"], json!([{"type": "text", "text": "Hello!"}]));
    let (status, r) = h.post_json(RESPONSES, &json!({"input": "Hi", "reasoning": {"effort": "none"}})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert!(h.last_prompt_text().ends_with(off_prompt));
    // Other efforts leave it on.
    let (status, _) = h.post_json(CHAT, &json!({"messages": messages, "reasoning_effort": "high"})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(h.last_prompt_text().ends_with("<|im_start|>assistant\n"));
    // A forced call is constrained from the first token: no thinking before it.
    h.reply("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
    let body = json!({"messages": messages, "tools": [weather_tool()], "tool_choice": "required"});
    let (status, r) = h.post_json(CHAT, &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert!(h.last_prompt_text().ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n"));
    assert_eq!(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
}

#[tokio::test]
async fn a_prompt_that_opens_the_reasoning() {
    let h = harness(Options { template: Some(OPENS_THINK.into()), ..Default::default() });
    h.reply("Two and two.\n</think>\n\nFour.");
    let messages = json!([{"role": "user", "content": "2+2?"}]);
    let (status, r) = h.post_json(CHAT, &json!({"messages": messages})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert!(h.last_prompt_text().ends_with("<|im_start|>assistant\n<think>\n"));
    let m = &r["choices"][0]["message"];
    assert_eq!((m["reasoning_content"].as_str(), m["content"].as_str()), (Some("Two and two."), Some("Four.")));
    let body = stream_body(&h, CHAT, &json!({"messages": messages, "stream": true})).await;
    let (reasoning, content, _, _) = chat_stream(&body);
    assert_eq!((reasoning.as_str(), content.as_str()), ("Two and two.", "Four."));
    // Cut off while thinking: all of it is reasoning.
    let (status, r) = h.post_json(CHAT, &json!({"messages": messages, "max_tokens": 3})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let m = &r["choices"][0]["message"];
    assert_eq!((m["reasoning_content"].as_str(), m["content"].as_str()), (Some("Two and two"), Some("")), "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    let (status, r) = h.post_json(MESSAGES, &json!({"messages": messages, "max_tokens": 3})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let content = r["content"].as_array().unwrap();
    assert_eq!((content.len(), &content[0]["thinking"]), (1, &json!("Two and two")), "only the thinking: {r}");
    assert_eq!(r["stop_reason"], "max_tokens");
    let (status, r) = h.post_json(RESPONSES, &json!({"input": "2+2?", "max_output_tokens": 3})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!((r["status"].as_str(), r["output"].as_array().map(Vec::len)), (Some("incomplete"), Some(1)), "{r}");
    assert_eq!(r["output"][0]["content"][0]["text"], "Two and two");
    // Off: the template has no switch, so the block the prompt opens is closed at once.
    h.reply("Four.");
    let (status, r) = h.post_json(CHAT, &json!({"messages": messages, "reasoning_effort": "none"})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert!(h.last_prompt_text().ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert_eq!(r["choices"][0]["message"]["content"], "Four.");
    assert!(r["choices"][0]["message"].get("reasoning_content").is_none(), "{r}");
}

#[tokio::test]
async fn anthropic_thinking_blocks() {
    let h = qwen3();
    h.reply(THINKING_REPLY);
    let body = json!({"max_tokens": 200, "messages": [{"role": "user", "content": "Hi"}],
                      "thinking": {"type": "enabled", "budget_tokens": 1024}});
    let (status, r) = h.post_json(MESSAGES, &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let content = r["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{r}");
    assert_eq!((content[0]["type"].as_str(), content[0]["thinking"].as_str()), (Some("thinking"), Some(REASONING)));
    assert!(content[0]["signature"].is_string());
    assert_eq!(content[1], json!({"type": "text", "text": CONTENT}));
    assert_eq!(r["stop_reason"], "end_turn");

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let events = named_events(&stream_body(&h, MESSAGES, &streaming).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let blocks: Vec<(String, Value)> =
        events.iter().filter(|(n, _)| n.starts_with("content_block")).map(|(n, d)| (n.clone(), d.clone())).collect();
    assert_eq!(&names[..2], ["message_start", "ping"]);
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
    // Block 0: thinking, its deltas, a signature, stop; block 1: text.
    assert_eq!(blocks[0].1["content_block"], json!({"type": "thinking", "thinking": "", "signature": ""}));
    assert_eq!(blocks[0].1["index"], 0);
    let mut thinking = String::new();
    let mut i = 1;
    while blocks[i].1["delta"]["type"] == "thinking_delta" {
        assert_eq!(blocks[i].1["index"], 0);
        thinking.push_str(blocks[i].1["delta"]["thinking"].as_str().unwrap());
        i += 1;
    }
    assert_eq!(thinking, REASONING);
    assert!(i > 3, "streamed in pieces");
    assert_eq!(blocks[i].1["delta"]["type"], "signature_delta");
    assert_eq!(blocks[i].1["delta"]["signature"], content[0]["signature"]);
    assert_eq!((blocks[i + 1].0.as_str(), &blocks[i + 1].1["index"]), ("content_block_stop", &json!(0)));
    assert_eq!(blocks[i + 2].1["content_block"], json!({"type": "text", "text": ""}));
    assert_eq!(blocks[i + 2].1["index"], 1);
    let text: String = blocks[i + 3..]
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, CONTENT);
    assert_eq!(blocks.last().unwrap().0, "content_block_stop");

    // A tool call after the thinking.
    h.reply(CALL_REPLY);
    let tool =
        json!({"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}});
    let body = json!({"max_tokens": 200, "messages": [{"role": "user", "content": "Weather?"}], "tools": [tool]});
    let (status, r) = h.post_json(MESSAGES, &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let kinds: Vec<&str> = r["content"].as_array().unwrap().iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["thinking", "tool_use"], "{r}");
    assert_eq!(r["content"][1]["input"], json!({"city": "Paris"}));
    assert_eq!(r["stop_reason"], "tool_use");
    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let events = named_events(&stream_body(&h, MESSAGES, &streaming).await);
    let starts: Vec<&str> = events
        .iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, d)| d["content_block"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(starts, ["thinking", "tool_use"]);
    let partial: String =
        events.iter().filter_map(|(_, d)| d["delta"]["partial_json"].as_str().map(str::to_owned)).collect();
    assert_eq!(serde_json::from_str::<Value>(&partial).unwrap(), json!({"city": "Paris"}));
}

#[tokio::test]
async fn responses_reasoning_items() {
    let h = qwen3();
    h.reply(THINKING_REPLY);
    let (status, r) = h.post_json(RESPONSES, &json!({"input": "Hi"})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let output = r["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{r}");
    assert_eq!(output[0]["type"], "reasoning");
    assert!(output[0]["id"].as_str().unwrap().starts_with("rs_"));
    assert_eq!(output[0]["summary"], json!([]));
    assert_eq!(output[0]["content"], json!([{"type": "reasoning_text", "text": REASONING}]));
    assert_eq!(
        (output[1]["type"].as_str(), output[1]["content"][0]["text"].as_str()),
        (Some("message"), Some(CONTENT))
    );
    let num_reasoning = num_reasoning_tokens(THINKING_REPLY);
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], num_reasoning, "{r}");
    assert!(num_reasoning > 10 && num_reasoning < r["usage"]["output_tokens"].as_u64().unwrap() as usize);

    let body = stream_body(&h, RESPONSES, &json!({"input": "Hi", "stream": true})).await;
    let events = named_events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = names.iter().filter(|n| **n == "response.reasoning_text.delta").count();
    assert!(deltas > 3, "{names:?}");
    let head =
        ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"];
    assert_eq!(&names[..4], head);
    assert!(names[4..4 + deltas].iter().all(|n| *n == "response.reasoning_text.delta"), "{names:?}");
    let after = [
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
    ];
    assert_eq!(&names[4 + deltas..9 + deltas], after);
    assert_eq!(events[2].1["item"]["type"], "reasoning");
    assert_eq!(events[3].1["part"], json!({"type": "reasoning_text", "text": ""}));
    let joined: String = events[4..4 + deltas].iter().map(|(_, d)| d["delta"].as_str().unwrap()).collect();
    assert_eq!(joined, REASONING);
    assert_eq!(events[4 + deltas].1["text"], REASONING);
    assert_eq!(events[6 + deltas].1["item"]["content"][0]["text"], REASONING);
    assert_eq!(events[7 + deltas].1["item"]["type"], "message");
    assert_eq!(events[7 + deltas].1["output_index"], 1);
    let (last, done) = events.last().unwrap();
    assert_eq!(last, "response.completed");
    assert_eq!(done["response"]["output"][0]["type"], "reasoning");
    assert_eq!(done["response"]["output"][1]["content"][0]["text"], CONTENT);
    assert_eq!(done["response"]["usage"]["output_tokens_details"]["reasoning_tokens"], num_reasoning);
    for (_, d) in &events {
        for key in ["delta", "text"] {
            if let Some(s) = d[key].as_str() {
                assert!(!s.contains("think>") && !s.contains("<think"), "{d}");
            }
        }
    }

    // A tool call after the reasoning, then the turn continued with the reasoning echoed back: Qwen3's template shows
    // it again (the turn is after the last user query).
    h.reply(CALL_REPLY);
    let tool = json!({"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}});
    let (status, r) = h.post_json(RESPONSES, &json!({"input": "Weather?", "tools": [tool]})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let kinds: Vec<&str> = r["output"].as_array().unwrap().iter().map(|o| o["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reasoning", "function_call"], "{r}");
    let call_id = r["output"][1]["call_id"].clone();
    h.reply("It is sunny.");
    let mut input = vec![json!({"role": "user", "content": "Weather?"})];
    input.extend(r["output"].as_array().unwrap().iter().cloned());
    input.push(json!({"type": "function_call_output", "call_id": call_id, "output": "sunny"}));
    let (status, r2) = h.post_json(RESPONSES, &json!({"input": input, "tools": [tool]})).await;
    assert_eq!(status, StatusCode::OK, "{r2}");
    let prompt = h.last_prompt_text();
    assert!(
        prompt.contains("<|im_start|>assistant\n<think>\nI need the weather in Paris.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
        "{prompt}"
    );
    // The same through previous_response_id (the stored turn keeps its reasoning).
    let (status, _) = h
        .post_json(
            RESPONSES,
            &json!({"previous_response_id": r["id"], "tools": [tool],
                    "input": [{"type": "function_call_output", "call_id": call_id, "output": "sunny"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h.last_prompt_text(), prompt);
}

#[tokio::test]
async fn earlier_reasoning_reaches_the_template() {
    let h = qwen3();
    h.reply("Done.");
    let want = "<|im_start|>assistant\n<think>\nLook it up.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nrain\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    let chat = json!({"tools": [weather_tool()], "messages": [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": null, "reasoning_content": "Look it up.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"}]});
    let (status, r) = h.post_json(CHAT, &chat).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert!(h.last_prompt_text().ends_with(want), "{}", h.last_prompt_text());
    let tool =
        json!({"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}});
    let anthropic = json!({"max_tokens": 10, "tools": [tool], "messages": [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Look it up.", "signature": "abc"},
            {"type": "redacted_thinking", "data": "xyz"},
            {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "rain"}]}]});
    let (status, r) = h.post_json(MESSAGES, &anthropic).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert!(h.last_prompt_text().ends_with(want), "{}", h.last_prompt_text());
    // A template with no use for it leaves it out, without an error.
    let plain = harness(Options::default());
    plain.reply("Done.");
    let (status, r) = plain.post_json(CHAT, &chat).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert!(!plain.last_prompt_text().contains("Look it up."));
    let (status, r) = plain.post_json(MESSAGES, &anthropic).await;
    assert_eq!(status, StatusCode::OK, "{r}");
}

#[tokio::test]
async fn output_without_think_tags_is_unchanged() {
    // A thinking template whose model answers straight away.
    let h = qwen3();
    let reply = "Plain answer, no <think> here.";
    h.reply(reply);
    let (status, r) = h.post_json(CHAT, &json!({"messages": [{"role": "user", "content": "Hi"}]})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["choices"][0]["message"]["content"], reply);
    assert!(r["choices"][0]["message"].get("reasoning_content").is_none(), "{r}");
    let (status, r) =
        h.post_json(MESSAGES, &json!({"max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["content"], json!([{"type": "text", "text": reply}]));
    let (status, r) = h.post_json(RESPONSES, &json!({"input": "Hi"})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["output"].as_array().unwrap().len(), 1);
    assert_eq!(r["output"][0]["type"], "message");
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 0);

    // A model whose template does not think (Qwen2.5-Coder): think tags it writes are plain content.
    let h = harness(Options::default());
    h.reply(THINKING_REPLY);
    let (status, r) = h.post_json(CHAT, &json!({"messages": [{"role": "user", "content": "Hi"}]})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["choices"][0]["message"]["content"], THINKING_REPLY);
    assert!(r["choices"][0]["message"].get("reasoning_content").is_none(), "{r}");
    let body = stream_body(&h, CHAT, &json!({"messages": [{"role": "user", "content": "Hi"}], "stream": true})).await;
    let (reasoning, content, _, _) = chat_stream(&body);
    assert_eq!((reasoning.as_str(), content.as_str()), ("", THINKING_REPLY));

    // `--reasoning-format none`: a thinking model's tags stay in the content.
    let server = ServerConfig { reasoning_format: ReasoningFormat::None, ..Default::default() };
    let h = harness(Options { template: Some(QWEN3.into()), server, ..Default::default() });
    h.reply(THINKING_REPLY);
    let (status, r) = h.post_json(CHAT, &json!({"messages": [{"role": "user", "content": "Hi"}]})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["choices"][0]["message"]["content"], THINKING_REPLY);
}

#[tokio::test]
async fn bad_reasoning_parameters_are_named() {
    let h = qwen3();
    h.reply("x");
    let messages = json!([{"role": "user", "content": "Hi"}]);
    // Effort levels and thinking types newer than this server are taken as "on" / the default, not refused.
    h.reply("x");
    let (status, r) = h.post_json(CHAT, &json!({"messages": messages, "reasoning_effort": "extreme"})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    h.reply("x");
    let (status, r) =
        h.post_json(MESSAGES, &json!({"max_tokens": 5, "messages": messages, "thinking": {"type": "maybe"}})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let (status, r) =
        h.post_json(MESSAGES, &json!({"max_tokens": 5, "messages": messages, "thinking": {"budget_tokens": 5}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{r}");
    assert_eq!(r["error"]["type"], "invalid_request_error");
    let (status, r) = h.post_json(RESPONSES, &json!({"input": "Hi", "reasoning": {"effort": 3}})).await;
    assert_eq!((status, &r["error"]["param"]), (StatusCode::BAD_REQUEST, &json!("reasoning.effort")), "{r}");
    let bad_item = json!({"input": [{"type": "reasoning", "id": "rs_1", "summary": [], "content": "text"}]});
    let (status, r) = h.post_json(RESPONSES, &bad_item).await;
    assert_eq!((status, &r["error"]["param"]), (StatusCode::BAD_REQUEST, &json!("input[0].content")), "{r}");
    let (status, r) = h.post_json(CHAT, &json!({"messages": messages, "chat_template_kwargs": {"messages": []}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{r}");
}

/// Every API's reply to a thinking model, streamed and not, plain and with a tool call: checked to be 200s here, and
/// written to the folder `$SPLASH_REASONING_BODIES` names (when set) for `scripts/e2e/sdk_reasoning.py`, which
/// parses them with the official OpenAI and Anthropic SDKs (`NAME.json`, `NAME.sse`).
#[tokio::test]
async fn bodies_for_the_sdk_check() {
    let dir = std::env::var_os("SPLASH_REASONING_BODIES").map(std::path::PathBuf::from);
    let h = qwen3();
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let user = json!([{"role": "user", "content": "Hi"}]);
    let cases = [
        ("chat", CHAT, json!({"messages": user}), THINKING_REPLY),
        ("chat_tool", CHAT, json!({"messages": user, "tools": [weather_tool()]}), CALL_REPLY),
        ("messages", MESSAGES, json!({"max_tokens": 100, "messages": user}), THINKING_REPLY),
        (
            "messages_tool",
            MESSAGES,
            json!({"max_tokens": 100, "messages": user, "tools": [{"name": "get_weather", "input_schema": schema}]}),
            CALL_REPLY,
        ),
        ("responses", RESPONSES, json!({"input": "Hi"}), THINKING_REPLY),
        (
            "responses_tool",
            RESPONSES,
            json!({"input": "Hi", "tools": [{"type": "function", "name": "get_weather", "parameters": schema}]}),
            CALL_REPLY,
        ),
    ];
    for (name, path, body, reply) in cases {
        h.reply(reply);
        for stream in [false, true] {
            let mut body = body.clone();
            body["stream"] = json!(stream);
            let text = stream_body(&h, path, &body).await;
            if let Some(dir) = &dir {
                std::fs::create_dir_all(dir).unwrap();
                std::fs::write(dir.join(format!("{name}.{}", if stream { "sse" } else { "json" })), text).unwrap();
            }
        }
    }
}
