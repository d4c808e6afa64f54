//! Issue 22's protocol checks on all three APIs: a POST body must be declared JSON (or come with no type and no
//! `Origin`), an `Origin` must name this server's port too, tool names follow `[a-zA-Z0-9_-]{1,64}`, and a forced
//! call of a tool whose parameters schema cannot be compiled is a 400 in the protocol's shape.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Options, harness, json_of};
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";
const RESPONSES: &str = "/v1/responses";
const MESSAGES: &str = "/v1/messages";

fn user() -> Value {
    json!([{"role": "user", "content": "x"}])
}

/// A minimal valid body of each API.
fn bodies() -> [(&'static str, Value); 3] {
    [
        (CHAT, json!({"messages": user(), "max_tokens": 5})),
        (RESPONSES, json!({"input": "x", "max_output_tokens": 5})),
        (MESSAGES, json!({"messages": user(), "max_tokens": 5})),
    ]
}

/// The error's type in the protocol's shape: OpenAI `{"error": {"type"}}`, Anthropic `{"type": "error", ...}`.
fn error_type(path: &str, r: &Value) -> String {
    if path == MESSAGES {
        assert_eq!(r["type"], "error", "{r}");
    }
    r["error"]["type"].as_str().unwrap_or_else(|| panic!("no error type in {r}")).to_owned()
}

async fn post(h: &common::Harness, path: &str, headers: &[(&str, &str)], body: &Value) -> (StatusCode, Value) {
    let mut r = Request::post(path);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    json_of(h.send(r.body(Body::from(body.to_string())).unwrap()).await).await
}

#[tokio::test]
async fn a_text_plain_post_from_another_localhost_port_drives_no_generation() {
    let h = harness(Options::default());
    h.reply("ok");
    for (path, body) in bodies() {
        // What a page on http://localhost:3000 can send without a CORS preflight.
        for headers in [
            &[("host", "localhost:8000"), ("origin", "http://localhost:3000"), ("content-type", "text/plain")][..],
            &[("host", "localhost:8000"), ("origin", "http://localhost:3000")],
            &[("host", "localhost:8000"), ("origin", "http://localhost:3000"), ("content-type", "application/json")],
            &[("host", "localhost:8000"), ("origin", "http://localhost")],
        ] {
            let (status, r) = post(&h, path, headers, &body).await;
            assert!(status == StatusCode::FORBIDDEN || status == StatusCode::UNSUPPORTED_MEDIA_TYPE, "{path} {status}");
            error_type(path, &r);
        }
        // Without an Origin (a script), a text/plain or form body is refused too, with a clear 415.
        for kind in ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data"] {
            let (status, r) = post(&h, path, &[("content-type", kind)], &body).await;
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{path} {kind}");
            assert_eq!(error_type(path, &r), "invalid_request_error");
            assert!(r["error"]["message"].as_str().unwrap().contains("application/json"), "{r}");
        }
        // The page's own origin (the web UI), SDKs (JSON) and scripts that send no type at all still work.
        for headers in [
            &[("host", "localhost:8000"), ("origin", "http://localhost:8000"), ("content-type", "application/json")][..],
            &[("content-type", "application/json; charset=utf-8")],
            &[],
        ] {
            let (status, r) = post(&h, path, headers, &body).await;
            assert_eq!(status, StatusCode::OK, "{path} {headers:?}: {r}");
        }
    }
    assert_eq!(h.state.engine.stats().num_submitted, 9, "only the accepted requests reached the engine");
}

#[tokio::test]
async fn tool_names_outside_the_hosted_rule_are_a_400_on_all_three_apis() {
    let h = harness(Options::default());
    h.reply("ok");
    let schema = json!({"type": "object", "properties": {}});
    for name in ["has space", "<|im_start|>system", "dot.name", &"x".repeat(65)] {
        let cases = [
            (
                CHAT,
                json!({"messages": user(), "tools": [{"type": "function", "function": {"name": name, "parameters": schema}}]}),
                "tools[0].function.name",
            ),
            (
                RESPONSES,
                json!({"input": "x", "tools": [{"type": "function", "name": name, "parameters": schema}]}),
                "tools[0].name",
            ),
            (RESPONSES, json!({"input": "x", "tools": [{"type": "custom", "name": name}]}), "tools[0].name"),
            (
                RESPONSES,
                json!({"input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": name}]}]}),
                "tools[0].tools[0].name",
            ),
            (
                MESSAGES,
                json!({"messages": user(), "max_tokens": 5, "tools": [{"name": name, "input_schema": schema}]}),
                "tools[0].name",
            ),
        ];
        for (path, body, param) in cases {
            for stream in [false, true] {
                let mut body = body.clone();
                body["stream"] = json!(stream);
                let (status, r) = common::post_json_status(&h, path, &body).await;
                assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {name}: {r}");
                assert_eq!(error_type(path, &r), "invalid_request_error");
                let message = r["error"]["message"].as_str().unwrap();
                assert!(message.contains("^[a-zA-Z0-9_-]{1,64}$"), "{message}");
                if path != MESSAGES {
                    assert_eq!(r["error"]["param"], param, "{r}");
                }
            }
        }
    }
    let ok = json!({"messages": user(), "tools": [{"type": "function", "function": {"name": "mcp__fs__read-file_2", "parameters": schema}}]});
    assert_eq!(common::post_json_status(&h, CHAT, &ok).await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_forced_call_of_a_tool_with_an_unusable_schema_is_a_400_not_any_object() {
    let h = harness(Options::default());
    h.reply("ok");
    // A reference to a definition that does not exist: no grammar can follow it (nor can a response_format).
    let bad = json!({"type": "object", "properties": {"path": {"$ref": "#/$defs/missing"}}, "required": ["path"]});
    let cases = [
        (
            CHAT,
            json!({"messages": user(), "tools": [{"type": "function", "function": {"name": "read", "parameters": bad}}], "tool_choice": "required"}),
        ),
        (
            CHAT,
            json!({"messages": user(), "tools": [{"type": "function", "function": {"name": "read", "parameters": bad}}], "tool_choice": {"type": "function", "function": {"name": "read"}}}),
        ),
        (
            RESPONSES,
            json!({"input": "x", "tools": [{"type": "function", "name": "read", "parameters": bad}], "tool_choice": "required"}),
        ),
        (
            MESSAGES,
            json!({"messages": user(), "max_tokens": 5, "tools": [{"name": "read", "input_schema": bad}], "tool_choice": {"type": "any"}}),
        ),
    ];
    for (path, body) in cases {
        for stream in [false, true] {
            let mut body = body.clone();
            body["stream"] = json!(stream);
            let (status, r) = common::post_json_status(&h, path, &body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path} stream {stream}: {r}");
            assert_eq!(error_type(path, &r), "invalid_request_error");
            let message = r["error"]["message"].as_str().unwrap();
            assert!(message.contains("tool 'read'"), "{message}");
        }
    }
    // The same schema as a response_format is refused the same way.
    let format = json!({"messages": user(), "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": bad}}});
    assert_eq!(common::post_json_status(&h, CHAT, &format).await.0, StatusCode::BAD_REQUEST);
    // With tool_choice auto nothing is forced: the request runs (agents' large schemas are not refused).
    let auto =
        json!({"messages": user(), "tools": [{"type": "function", "function": {"name": "read", "parameters": bad}}]});
    assert_eq!(common::post_json_status(&h, CHAT, &auto).await.0, StatusCode::OK);
    assert_eq!(h.state.engine.stats().num_submitted, 1);
}
