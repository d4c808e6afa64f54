//! OpenAI Chat Completions through the whole router (tower `oneshot`): real Qwen2.5-Coder tokenizer and chat
//! template, a scripted model. Checks the response and stream shapes clients rely on (agent-clients.md §12.3), tool
//! calls in the forms the real models write, and an OpenAI-shaped error with the right status for every bad input.

mod common;

use std::time::{Duration, Instant};

use api::ServerConfig;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{MODEL_ID, Options, assets, body_text, harness, sse_data};
use engine::service::ServiceConfig;
use http_body_util::BodyExt;
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather", "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// The prompt the template itself gives for `messages` (and `tools`), tokenized: what usage must count.
fn expected_prompt_tokens(messages: &Value, tools: Option<&Value>) -> usize {
    let a = assets();
    let template = chat::ChatTemplate::new(a.template_source.clone(), a.bos.clone(), a.eos.clone()).unwrap();
    let input = chat::RenderInput {
        messages: messages.as_array().unwrap().clone(),
        tools: tools.map(|t| t.as_array().unwrap().clone()),
        add_generation_prompt: true,
        extra: Default::default(),
    };
    a.tokenizer.encode(&template.render(&input).unwrap(), true).unwrap().len()
}

fn assert_error(status: StatusCode, body: &Value, expected: StatusCode, param: Option<&str>) {
    assert_eq!(status, expected, "{body}");
    let e = &body["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(e["type"].is_string(), "{body}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{body}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{body}");
    }
}

#[tokio::test]
async fn non_streaming_text() {
    let h = harness(Options::default());
    h.reply("Hello there!");
    let (status, body) = h.post_json(CHAT, &json!({"model": "anything", "messages": user("Hi")})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["model"], MODEL_ID);
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "Hello there!");
    assert!(choice["message"].get("tool_calls").is_none());
    assert_eq!(choice["finish_reason"], "stop");
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"], expected_prompt_tokens(&user("Hi"), None));
    // The reply's tokens plus the end-of-turn token.
    let num_reply = assets().tokenizer.encode("Hello there!", true).unwrap().len();
    assert_eq!(usage["completion_tokens"], num_reply + 1);
    assert_eq!(
        usage["total_tokens"],
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(body["timings"]["predicted_n"], usage["completion_tokens"]);
    // The model saw the template's rendering of the conversation.
    assert!(h.last_prompt_text().ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
}

#[tokio::test]
async fn streaming_text_with_usage() {
    let h = harness(Options::default());
    h.reply("One, two, three. ✓");
    let body = json!({"messages": user("Count"), "stream": true, "stream_options": {"include_usage": true}});
    let request =
        Request::post(CHAT).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap();
    let response = h.send(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let events = sse_data(&body_text(response).await);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], chunks[0]["id"]);
        if let Some(t) = c["choices"].get(0).and_then(|ch| ch["delta"]["content"].as_str()) {
            text.push_str(t);
        }
    }
    assert_eq!(text, "One, two, three. ✓");
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], expected_prompt_tokens(&user("Count"), None));
    // Without include_usage there is no usage chunk.
    let body = json!({"messages": user("Count"), "stream": true});
    let request = Request::post(CHAT).body(Body::from(body.to_string())).unwrap();
    let events = sse_data(&body_text(h.send(request).await).await);
    assert!(events.iter().all(|e| !e.contains("\"usage\"")));
}

#[tokio::test]
async fn tagged_tool_call_non_streaming() {
    let h = harness(Options::default());
    h.reply("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    let tools = json!([weather_tool()]);
    let (status, body) = h.post_json(CHAT, &json!({"messages": user("Weather in Paris?"), "tools": tools})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    assert_eq!(body["usage"]["prompt_tokens"], expected_prompt_tokens(&user("Weather in Paris?"), Some(&tools)));
    assert!(
        h.last_prompt_text().contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"")
    );
}

#[tokio::test]
async fn untagged_calls_of_the_small_models_are_calls() {
    let h = harness(Options::default());
    let tools = json!([weather_tool()]);
    for reply in [
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n```",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n{\"tool_response\": \"invented\"}",
    ] {
        h.reply(reply);
        let (status, body) = h.post_json(CHAT, &json!({"messages": user("Oslo?"), "tools": tools})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls", "{reply}");
        assert_eq!(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
    }
    // Without tools the same text is just text.
    h.reply("{\"name\": \"get_weather\", \"arguments\": {}}");
    let (_, body) = h.post_json(CHAT, &json!({"messages": user("x")})).await;
    assert_eq!(body["choices"][0]["message"]["content"], "{\"name\": \"get_weather\", \"arguments\": {}}");
}

#[tokio::test]
async fn streaming_tool_call() {
    let h = harness(Options::default());
    h.reply("Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>");
    let body = json!({"messages": user("Rome?"), "tools": [weather_tool()], "stream": true});
    let request = Request::post(CHAT).body(Body::from(body.to_string())).unwrap();
    let events = sse_data(&body_text(h.send(request).await).await);
    let chunks: Vec<Value> =
        events.iter().filter(|e| *e != "[DONE]").map(|e| serde_json::from_str(e).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "Checking.\n");
    let calls: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    // The first delta names the call, then the arguments stream in pieces that join to the JSON the model wrote.
    assert!(calls.len() > 2, "{calls:?}");
    assert!(calls.iter().all(|c| c[0]["index"] == 0));
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    assert!(calls[0][0]["id"].as_str().unwrap().starts_with("call_"));
    assert!(calls[1..].iter().all(|c| c[0].get("id").is_none() && c[0]["function"].get("name").is_none()));
    let arguments: String = calls.iter().map(|c| c[0]["function"]["arguments"].as_str().unwrap()).collect();
    assert_eq!(arguments, "{\"city\": \"Rome\"}");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    assert!(!events.iter().any(|e| e.contains("<tool_call")), "no tag leaks into the text");
}

#[tokio::test]
async fn required_and_named_tool_choice_force_the_call() {
    let h = harness(Options::default());
    let bash = json!({"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}});
    let tools = json!([weather_tool(), bash]);
    // Required: the prompt ends with the start of a call; the model writes the rest under the call grammar.
    h.reply("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\"}}\n</tool_call>");
    let (status, body) =
        h.post_json(CHAT, &json!({"messages": user("Lima?"), "tools": tools, "tool_choice": "required"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(h.last_prompt_text().ends_with("<|im_start|>assistant\n<tool_call>\n"));
    assert_eq!(body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    // Named: the grammar allows only that tool's name.
    h.reply("{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>");
    let choice = json!({"type": "function", "function": {"name": "bash"}});
    let (status, body) =
        h.post_json(CHAT, &json!({"messages": user("ls"), "tools": tools, "tool_choice": choice})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(h.last_prompt_text().ends_with("<|im_start|>assistant\n<tool_call>\n"));
    let call = &body["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(
        (call["function"]["name"].as_str(), call["function"]["arguments"].as_str()),
        (Some("bash"), Some("{\"command\":\"ls\"}"))
    );
    // None: the tools are not shown and nothing is parsed.
    h.reply("<tool_call>\n{\"name\": \"bash\", \"arguments\": {}}\n</tool_call>");
    let (_, body) = h.post_json(CHAT, &json!({"messages": user("hi"), "tools": tools, "tool_choice": "none"})).await;
    assert!(!h.last_prompt_text().contains("<tools>"));
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(body["choices"][0]["message"]["content"].as_str().unwrap().contains("<tool_call>"));
}

#[tokio::test]
async fn parallel_tool_calls_false_keeps_the_first_call() {
    let h = harness(Options::default());
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n</tool_call>\n";
    h.reply(&format!("{call}{}", call.replace("\"A\"", "\"B\"")));
    let body = json!({"messages": user("x"), "tools": [weather_tool()]});
    let (_, both) = h.post_json(CHAT, &body).await;
    assert_eq!(both["choices"][0]["message"]["tool_calls"].as_array().unwrap().len(), 2);
    let mut body = body;
    body["parallel_tool_calls"] = json!(false);
    let (_, one) = h.post_json(CHAT, &body).await;
    assert_eq!(one["choices"][0]["message"]["tool_calls"].as_array().unwrap().len(), 1);
    assert_eq!(one["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn a_reply_that_repeats_a_call_stops_after_the_repeat() {
    let h = harness(Options::default());
    let call = |city: &str| {
        format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}\n</tool_call>\n")
    };
    // Two different calls are both kept; the same call again ends the reply there.
    h.reply(&format!("{}{}{}{}", call("A"), call("B"), call("A"), call("C")));
    let body = json!({"messages": user("x"), "tools": [weather_tool()]});
    let (_, reply) = h.post_json(CHAT, &body).await;
    let calls = reply["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    let cities: Vec<&str> = calls.iter().map(|c| c["function"]["arguments"].as_str().unwrap()).collect();
    assert_eq!(cities, [r#"{"city":"A"}"#, r#"{"city":"B"}"#, r#"{"city":"A"}"#]);
    assert_eq!(reply["choices"][0]["finish_reason"], "tool_calls");
    let all =
        assets().tokenizer.encode(&format!("{}{}{}{}", call("A"), call("B"), call("A"), call("C")), true).unwrap();
    assert!(reply["usage"]["completion_tokens"].as_u64().unwrap() < all.len() as u64);
}

#[tokio::test]
async fn tool_round_trip_renders_call_and_result() {
    let h = harness(Options::default());
    h.reply("It is sunny in Paris.");
    let messages = json!([
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}
    ]);
    let (status, body) = h.post_json(CHAT, &json!({"messages": messages, "tools": [weather_tool()]})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "It is sunny in Paris.");
    let prompt = h.last_prompt_text();
    assert!(
        prompt.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
        "{prompt}"
    );
    assert!(prompt.contains("<tool_response>\nsunny, 21 C\n</tool_response>"), "{prompt}");
    // A tool result without content and a mid-conversation system message still render.
    let messages = json!([
        {"role": "user", "content": "a"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c"},
        {"role": "system", "content": "reminder"},
        {"role": "assistant", "content": "x"},
        {"role": "assistant", "content": "y"}
    ]);
    let (status, body) = h.post_json(CHAT, &json!({"messages": messages, "tools": [weather_tool()]})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn stop_strings_and_max_tokens() {
    let h = harness(Options::default());
    h.reply("alpha beta gamma delta");
    let (_, body) = h.post_json(CHAT, &json!({"messages": user("x"), "stop": ["gamma"]})).await;
    assert_eq!(body["choices"][0]["message"]["content"], "alpha beta ");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let (_, body) = h.post_json(CHAT, &json!({"messages": user("x"), "max_tokens": 2})).await;
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 2);
    let (_, body) =
        h.post_json(CHAT, &json!({"messages": user("x"), "max_completion_tokens": 1, "max_tokens": 50})).await;
    assert_eq!(body["usage"]["completion_tokens"], 1);
}

#[tokio::test]
async fn max_tokens_beyond_the_context_is_clamped() {
    let h = harness(Options { max_context: 200, ..Default::default() });
    {
        let mut s = h.script.lock().unwrap();
        s.reply = assets().tokenizer.encode(" word", true).unwrap();
        s.no_eos = true;
    }
    let (status, body) = h.post_json(CHAT, &json!({"messages": user("x"), "max_tokens": 65536})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let usage = &body["usage"];
    assert_eq!(usage["total_tokens"], 200);
}

#[tokio::test]
async fn models_endpoints() {
    let h = harness(Options { max_context: 3000, ..Default::default() });
    let (status, body) = h.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["object"], "list");
    let m = &body["data"][0];
    assert_eq!(
        (m["id"].as_str(), m["object"].as_str(), m["owned_by"].as_str()),
        (Some(MODEL_ID), Some("model"), Some("splash"))
    );
    assert_eq!((m["context_length"].as_u64(), m["max_model_len"].as_u64()), (Some(3000), Some(3000)));
    let (status, body) = h.get(&format!("/v1/models/{MODEL_ID}")).await;
    assert_eq!((status, body["id"].as_str()), (StatusCode::OK, Some(MODEL_ID)));
    let (status, body) = h.get("/v1/models/other").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, None);
    assert_eq!(body["error"]["code"], "model_not_found");
    let (status, body) = h.get("/health").await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("ok")));
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let h = harness(Options::default());
    h.reply("ok");
    let cases: Vec<(&str, Option<&str>)> = vec![
        ("{not json", None),
        ("", None),
        ("[]", None),
        ("{}", None),
        (r#"{"messages": "nope"}"#, Some("messages")),
        (r#"{"messages": []}"#, Some("messages")),
        (r#"{"messages": [{"role": "bot", "content": "x"}]}"#, Some("messages[0].role")),
        (r#"{"messages": [{"content": "x"}]}"#, None),
        (r#"{"messages": [{"role": "user", "content": {"a": 1}}]}"#, Some("messages[0].content")),
        (r#"{"messages": [{"role": "user", "content": "x"}], "n": 0}"#, Some("n")),
        (r#"{"messages": [{"role": "user", "content": "x"}], "temperature": -1}"#, Some("temperature")),
        (r#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#, Some("temperature")),
        (r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}"#, Some("max_tokens")),
        (r#"{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}"#, Some("stream")),
        (r#"{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}"#, Some("tool_choice")),
        (
            r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a"}}], "tool_choice": {"type": "function", "function": {"name": "b"}}}"#,
            Some("tool_choice"),
        ),
        (r#"{"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}"#, Some("tools")),
    ];
    for (body, param) in cases {
        let (status, value) = h.post_raw(CHAT, body).await;
        assert_error(status, &value, StatusCode::BAD_REQUEST, param);
        assert_eq!(value["error"]["type"], "invalid_request_error", "{body}");
    }
}

#[tokio::test]
async fn over_long_prompt_is_a_400_with_openai_wording() {
    let h = harness(Options { max_context: 64, ..Default::default() });
    let (status, body) = h.post_json(CHAT, &json!({"messages": user(&"word ".repeat(100))})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, None);
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    assert!(body["error"]["message"].as_str().unwrap().contains("maximum context length is 64 tokens"));
}

#[tokio::test]
async fn routes_methods_and_sizes() {
    let h =
        harness(Options { server: ServerConfig { max_body_bytes: 1000, ..Default::default() }, ..Default::default() });
    let (status, body) = h.get("/v1/nothing").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, None);
    let (status, body) = h.get("/api/v1/models").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, None);
    let (status, body) = h.get(CHAT).await;
    assert_error(status, &body, StatusCode::METHOD_NOT_ALLOWED, None);
    let big = json!({"messages": user(&"x".repeat(2000))});
    let (status, body) = h.post_json(CHAT, &big).await;
    assert_error(status, &body, StatusCode::PAYLOAD_TOO_LARGE, None);
}

#[tokio::test]
async fn api_key_is_required_when_set() {
    let server = ServerConfig { api_key: Some("sekret".into()), ..Default::default() };
    let h = harness(Options { server, ..Default::default() });
    h.reply("ok");
    let body = json!({"messages": user("x")}).to_string();
    let post = |auth: Option<(&str, &str)>| {
        let mut r = Request::post(CHAT);
        if let Some((k, v)) = auth {
            r = r.header(k, v);
        }
        r.body(Body::from(body.clone())).unwrap()
    };
    for auth in [None, Some(("authorization", "Bearer wrong")), Some(("x-api-key", "sekre"))] {
        let (status, value) = common::json_of(h.send(post(auth)).await).await;
        assert_error(status, &value, StatusCode::UNAUTHORIZED, None);
        assert_eq!(value["error"]["code"], "invalid_api_key");
    }
    for auth in [("authorization", "Bearer sekret"), ("x-api-key", "sekret")] {
        let response = h.send(post(Some(auth))).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let (status, _) = h.get("/health").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = h.get("/v1/models").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn full_queue_is_429_with_retry_after() {
    let service = ServiceConfig { max_waiting: 0, ..Default::default() };
    let h = harness(Options { service, ..Default::default() });
    let request = Request::post(CHAT).body(Body::from(json!({"messages": user("x")}).to_string())).unwrap();
    let response = h.send(request).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "1");
    let (_, body) = common::json_of(response).await;
    assert_eq!(body["error"]["code"], "queue_full");
}

#[tokio::test]
async fn a_client_that_hangs_up_frees_its_sequence() {
    let h = harness(Options { delay: Duration::from_millis(5), ..Default::default() });
    {
        let mut s = h.script.lock().unwrap();
        s.reply = assets().tokenizer.encode(" on and on", true).unwrap();
        s.no_eos = true;
    }
    let body = json!({"messages": user("x"), "stream": true, "max_tokens": 100000});
    let response = h.send(Request::post(CHAT).body(Body::from(body.to_string())).unwrap()).await;
    let mut body = response.into_body();
    // Read a few events (the role chunk and some text), then hang up.
    let mut seen = String::new();
    while !seen.contains(" on") {
        let frame = body.frame().await.expect("a frame").expect("no error");
        if let Ok(data) = frame.into_data() {
            seen.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
    assert_eq!(h.state.engine.stats().num_running, 1);
    let t0 = Instant::now();
    drop(body);
    while h.state.engine.stats().num_running > 0 || !h.seen().live.is_empty() {
        assert!(t0.elapsed() < Duration::from_millis(200), "the sequence was not freed within 200 ms");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(h.state.engine.stats().num_aborted, 1);
}

#[tokio::test]
async fn a_looping_reply_is_stopped_as_length() {
    let server = ServerConfig { max_repeated_chars: Some(64), ..Default::default() };
    let h = harness(Options { server, ..Default::default() });
    {
        let mut s = h.script.lock().unwrap();
        s.reply = assets().tokenizer.encode("Start. again", true).unwrap();
        s.no_eos = true;
    }
    let (status, body) = h.post_json(CHAT, &json!({"messages": user("x"), "max_tokens": 1000})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let n = body["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(n < 100, "stopped after {n} tokens");
    assert!(body["choices"][0]["message"]["content"].as_str().unwrap().ends_with(" again again again"));
    // The engine drops the sequence at its next step.
    let t0 = Instant::now();
    while h.state.engine.stats().num_running > 0 {
        assert!(t0.elapsed() < Duration::from_secs(2), "the sequence was not freed");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(h.state.engine.stats().num_aborted, 1);
}
