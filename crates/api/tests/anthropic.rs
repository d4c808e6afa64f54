//! Anthropic Messages through the whole router: real Qwen2.5-Coder tokenizer and template, a scripted model. Checks
//! the message and event-stream shapes Claude Code accepted (agent-clients.md §3.4, §12.1), its request quirks
//! (system blocks with the billing header, `role: "system"` turns, `?beta=true`), count_tokens, and errors in
//! Anthropic's shape.

mod common;

use api::ServerConfig;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Options, body_text, harness, named_events};
use serde_json::{Value, json};

const MESSAGES: &str = "/v1/messages?beta=true";

fn bash_tool() -> Value {
    json!({"name": "Bash", "description": "Run a shell command",
           "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}})
}

fn assert_error(status: StatusCode, body: &Value, expected: StatusCode, kind: &str) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
}

#[tokio::test]
async fn non_streaming_text() {
    let h = harness(Options::default());
    h.reply("Hi! How can I help?");
    let body = json!({"model": "claude-sonnet", "max_tokens": 100, "messages": [{"role": "user", "content": "Hello"}]});
    let (status, r) = h.post_json(MESSAGES, &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(
        (r["type"].as_str(), r["role"].as_str(), r["model"].as_str()),
        (Some("message"), Some("assistant"), Some("claude-sonnet"))
    );
    assert!(r["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(r["content"], json!([{"type": "text", "text": "Hi! How can I help?"}]));
    assert_eq!(r["stop_reason"], "end_turn");
    assert_eq!(r["stop_sequence"], Value::Null);
    // count_tokens gives the same prompt size as the request used.
    let (status, count) = h.post_json("/v1/messages/count_tokens?beta=true", &body).await;
    assert_eq!(status, StatusCode::OK, "{count}");
    assert_eq!(count["input_tokens"], r["usage"]["input_tokens"]);
    assert!(h.last_prompt_text().ends_with("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"));
    let num_reply = common::assets().tokenizer.encode("Hi! How can I help?", true).unwrap().len();
    assert_eq!(r["usage"]["output_tokens"], num_reply + 1);
}

#[tokio::test]
async fn streaming_text_event_sequence() {
    let h = harness(Options::default());
    h.reply("Line one.\nLine two.");
    let body = json!({"model": "m", "max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": "x"}]});
    let response = h.send(Request::post(MESSAGES).body(Body::from(body.to_string())).unwrap()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let events = named_events(&body_text(response).await);
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str());
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(&names[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(&names[names.len() - 3..], ["content_block_stop", "message_delta", "message_stop"]);
    assert!(names[3..names.len() - 3].iter().all(|n| *n == "content_block_delta"));
    let start = &events[0].1["message"];
    assert_eq!((start["content"].as_array().map(Vec::len), &start["stop_reason"]), (Some(0), &Value::Null));
    assert!(start["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(events[2].1["content_block"], json!({"type": "text", "text": ""}));
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(text, "Line one.\nLine two.");
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert!(delta["usage"]["output_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn tool_use_in_both_modes() {
    let h = harness(Options::default());
    h.reply("I'll list the files.\n```json\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n```");
    let body = json!({"model": "m", "max_tokens": 80, "tools": [bash_tool()], "messages": [{"role": "user", "content": "ls"}]});
    let (_, r) = h.post_json(MESSAGES, &body).await;
    assert_eq!(r["stop_reason"], "tool_use", "{r}");
    assert_eq!(r["content"][0], json!({"type": "text", "text": "I'll list the files.\n"}));
    let tool = &r["content"][1];
    assert_eq!((tool["type"].as_str(), tool["name"].as_str()), (Some("tool_use"), Some("Bash")));
    assert!(tool["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(tool["input"], json!({"command": "ls"}));

    let mut body = body;
    body["stream"] = json!(true);
    let response = h.send(Request::post(MESSAGES).body(Body::from(body.to_string())).unwrap()).await;
    let events = named_events(&body_text(response).await);
    let starts: Vec<&Value> = events.iter().filter(|(n, _)| n == "content_block_start").map(|(_, d)| d).collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[1]["index"], 1);
    assert_eq!(starts[1]["content_block"]["type"], "tool_use");
    assert_eq!(starts[1]["content_block"]["input"], json!({}));
    // The arguments stream as the model writes them (several deltas), and join to the input.
    let deltas: Vec<&str> = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert!(deltas.len() > 1, "{deltas:?}");
    let input: Value = serde_json::from_str(&deltas.concat()).unwrap();
    assert_eq!(input, json!({"command": "ls"}));
    let stops = events.iter().filter(|(n, _)| n == "content_block_stop").count();
    assert_eq!(stops, 2, "every block is closed");
    let delta = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
}

#[tokio::test]
async fn claude_code_request_with_tool_result() {
    let h = harness(Options::default());
    h.reply("Done.");
    let body = json!({
        "model": "local-model", "max_tokens": 32000,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332; cch=abc;"},
                   {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "write a file"}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "Bash",
                                               "input": {"command": "echo hi > out.txt"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a",
                                          "content": "(Bash completed with no output)", "is_error": false}]}
        ],
        "tools": [bash_tool(), {"name": "DeferredToolPlaceholder", "defer_loading": true, "input_schema": {}}],
        "metadata": {"user_id": "{\"device_id\":\"x\"}"}, "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"}
    });
    let (status, r) = h.post_json(MESSAGES, &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["content"][0]["text"], "Done.");
    let prompt = h.last_prompt_text();
    assert!(!prompt.contains("billing-header"), "{prompt}");
    assert!(!prompt.contains("DeferredToolPlaceholder"), "{prompt}");
    assert!(prompt.starts_with("<|im_start|>system\nYou are a Claude agent.\n\n# Tools"), "{prompt}");
    assert!(prompt.contains("<|im_start|>system\n# Environment<|im_end|>"), "{prompt}");
    assert!(prompt.contains("{\"name\": \"Bash\", \"arguments\": {\"command\": \"echo hi > out.txt\"}}"), "{prompt}");
    assert!(prompt.contains("<tool_response>\n(Bash completed with no output)\n</tool_response>"), "{prompt}");
}

#[tokio::test]
async fn named_tool_choice_is_forced() {
    let h = harness(Options::default());
    h.reply("{\"name\": \"Bash\", \"arguments\": {\"command\": \"pwd\"}}\n</tool_call>");
    let body = json!({"model": "m", "max_tokens": 40, "tools": [bash_tool()], "tool_choice": {"type": "tool", "name": "Bash"},
                      "messages": [{"role": "user", "content": "where am I"}]});
    let (_, r) = h.post_json(MESSAGES, &body).await;
    // The prompt opens the call; the grammar (name Bash, its input schema) constrains the rest.
    assert!(h.last_prompt_text().ends_with("<|im_start|>assistant\n<tool_call>\n"));
    assert_eq!(
        r["content"],
        json!([{"type": "tool_use", "id": r["content"][0]["id"], "name": "Bash", "input": {"command": "pwd"}}])
    );
    assert_eq!(r["stop_reason"], "tool_use");
}

#[tokio::test]
async fn max_tokens_is_the_max_tokens_stop_reason() {
    let h = harness(Options::default());
    h.reply("a b c d e f g");
    let (_, r) = h.post_json(MESSAGES, &json!({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})).await;
    assert_eq!((r["stop_reason"].as_str(), r["usage"]["output_tokens"].as_u64()), (Some("max_tokens"), Some(2)));
}

#[tokio::test]
async fn errors_in_anthropic_shape() {
    let h = harness(Options { max_context: 64, ..Default::default() });
    for body in ["{not json", r#"{"messages": "nope"}"#, "{}", r#"{"messages": [{"role": "user", "content": 1}]}"#] {
        let (status, r) = h.post_raw(MESSAGES, body).await;
        assert_error(status, &r, StatusCode::BAD_REQUEST, "invalid_request_error");
    }
    let long = json!({"max_tokens": 10, "messages": [{"role": "user", "content": "word ".repeat(100)}]});
    let (status, r) = h.post_json(MESSAGES, &long).await;
    assert_error(status, &r, StatusCode::BAD_REQUEST, "invalid_request_error");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("prompt is too long: ") && message.ends_with(" tokens > 64 maximum"), "{message}");
    let (status, r) = h.post_raw("/v1/messages/batches", "{}").await;
    assert_error(status, &r, StatusCode::NOT_FOUND, "not_found_error");
    let (status, r) = h.get("/v1/messages").await;
    assert_error(status, &r, StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error");
}

#[tokio::test]
async fn api_key_errors_in_anthropic_shape() {
    let h = harness(Options {
        server: ServerConfig { api_key: Some("k".into()), ..Default::default() },
        ..Default::default()
    });
    h.reply("ok");
    let body = json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let (status, r) =
        common::json_of(h.send(Request::post(MESSAGES).body(Body::from(body.clone())).unwrap()).await).await;
    assert_error(status, &r, StatusCode::UNAUTHORIZED, "authentication_error");
    let ok = Request::post(MESSAGES).header("x-api-key", "k").body(Body::from(body)).unwrap();
    assert_eq!(h.send(ok).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn model_list_serves_both_sdks() {
    let h = harness(Options::default());
    let (_, r) = h.get("/v1/models?limit=1000").await;
    assert_eq!((r["has_more"].as_bool(), r["first_id"].as_str()), (Some(false), Some(common::MODEL_ID)));
    let m = &r["data"][0];
    assert_eq!((m["type"].as_str(), m["display_name"].as_str()), (Some("model"), Some(common::MODEL_ID)));
    assert!(m["created_at"].as_str().unwrap().ends_with('Z'));
}
