//! Endpoints outside the chat protocols (`/`, `/ready`, `/status`, `/metrics`, `/tokenize`, `/detokenize`,
//! `/apply-template`) and the guards at the door (Host / Origin, API key on every route).

mod common;

use api::ServerConfig;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Options, assets, body_text, harness, json_of};
use serde_json::json;

#[tokio::test]
async fn status_metrics_ready_and_index() {
    let h = harness(Options { max_context: 1000, ..Default::default() });
    h.reply("Hello.");
    let (status, _) =
        h.post_json("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}]})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, s) = h.get("/status").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((s["model"].as_str(), s["alive"].as_bool()), (Some(common::MODEL_ID), Some(true)));
    assert_eq!(s["limits"]["max_context_tokens"], 1000);
    assert_eq!((s["queue"]["num_running"].as_u64(), s["queue"]["num_waiting"].as_u64()), (Some(0), Some(0)));
    assert_eq!((s["requests"]["num_submitted"].as_u64(), s["requests"]["num_finished"].as_u64()), (Some(1), Some(1)));
    let num_reply = assets().tokenizer.encode("Hello.", true).unwrap().len() as u64 + 1;
    assert_eq!(s["engine"]["num_generated_tokens"], num_reply);

    let response = h.send(Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = body_text(response).await;
    assert!(text.contains("# TYPE splash_requests_total counter"), "{text}");
    assert!(text.contains("splash_requests_total{outcome=\"finished\"} 1"), "{text}");
    assert!(text.contains(&format!("splash_generated_tokens_total {num_reply}")), "{text}");
    assert!(text.contains("splash_context_tokens_max 1000"), "{text}");

    let (status, r) = h.get("/ready").await;
    assert_eq!((status, r["status"].as_str()), (StatusCode::OK, Some("ready")));
    let response = h.send(Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(body_text(response).await.contains("Splash"));
}

#[tokio::test]
async fn tokenize_detokenize_apply_template() {
    let h = harness(Options::default());
    let text = "Hello <|im_start|>world ✓";
    let (status, r) = h.post_json("/tokenize", &json!({"content": text})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let expected = assets().tokenizer.encode(text, true).unwrap();
    let ids: Vec<u32> = serde_json::from_value(r["tokens"].clone()).unwrap();
    assert_eq!(ids, expected);
    assert!(ids.contains(&assets().tokenizer.token_id("<|im_start|>").unwrap()), "special tokens are parsed");
    let (_, r) = h.post_json("/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(r["content"], text);
    let (_, r) = h.post_json("/tokenize", &json!({"content": "hi there", "with_pieces": true})).await;
    assert_eq!(r["tokens"][1]["piece"], " there");
    let (status, r) = h.post_json("/detokenize", &json!({"tokens": [999_999_999u32]})).await;
    assert_eq!((status, r["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("tokens")));
    let (status, _) = h.post_json("/tokenize", &json!({"text": "wrong field"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let messages = json!([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]);
    let (status, r) = h.post_json("/apply-template", &json!({"messages": messages})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["prompt"], "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
}

async fn status_with(h: &common::Harness, path: &str, headers: &[(&str, &str)]) -> (StatusCode, serde_json::Value) {
    let mut r = Request::get(path);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let response = h.send(r.body(Body::empty()).unwrap()).await;
    let status = response.status();
    let text = body_text(response).await;
    (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}

#[tokio::test]
async fn host_and_origin_guard() {
    let server = ServerConfig { allowed_hosts: vec!["box.lan".into()], ..Default::default() };
    let h = harness(Options { server, ..Default::default() });
    for host in ["localhost:8000", "127.0.0.1:8000", "[::1]:8000", "localhost", "box.lan:8000", "BOX.LAN"] {
        let (status, _) = status_with(&h, "/v1/models", &[("host", host)]).await;
        assert_eq!(status, StatusCode::OK, "{host}");
    }
    let (status, r) = status_with(&h, "/v1/models", &[("host", "evil.example:8000")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(r["error"]["message"].as_str().unwrap().contains("--allowed-host evil.example"), "{r}");
    // A rebinding page: the Host names loopback but the Origin is foreign.
    let (status, _) =
        status_with(&h, "/v1/models", &[("host", "localhost:8000"), ("origin", "http://evil.example")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) =
        status_with(&h, "/v1/models", &[("host", "localhost:8000"), ("origin", "http://localhost:8000")]).await;
    assert_eq!(status, StatusCode::OK);
    // Anthropic routes refuse in Anthropic's shape.
    let request = Request::post("/v1/messages").header("host", "evil.example").body(Body::from("{}")).unwrap();
    let (status, r) = json_of(h.send(request).await).await;
    assert_eq!(
        (status, r["type"].as_str(), r["error"]["type"].as_str()),
        (StatusCode::FORBIDDEN, Some("error"), Some("permission_error"))
    );
}

#[tokio::test]
async fn api_key_covers_every_route_but_health() {
    let h = harness(Options {
        server: ServerConfig { api_key: Some("k".into()), ..Default::default() },
        ..Default::default()
    });
    for path in ["/", "/health", "/ready"] {
        let response = h.send(Request::get(path).body(Body::empty()).unwrap()).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    for path in ["/status", "/metrics", "/v1/models", "/v1/responses/x"] {
        let response = h.send(Request::get(path).body(Body::empty()).unwrap()).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let request = Request::post("/tokenize")
        .header("authorization", "Bearer k")
        .body(Body::from("{\"content\": \"a\"}"))
        .unwrap();
    assert_eq!(h.send(request).await.status(), StatusCode::OK);
}

/// A Mistral-style template that refuses a later system message and turns that do not alternate.
const STRICT_TEMPLATE: &str = "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}\
{%- set loop_messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- set loop_messages = messages %}{%- endif %}\
{{ system }}{%- for message in loop_messages %}\
{%- if message['role'] == 'system' %}{{ raise_exception('System message must be at the beginning') }}{%- endif %}\
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}\
{%- if message['role'] == 'user' %}[INST] {{ message['content'] }} [/INST]{%- else %}{{ message['content'] }}</s>{%- endif %}\
{%- endfor %}";

#[tokio::test]
async fn strict_templates_get_a_reshaped_conversation() {
    let h = harness(Options { template: Some(STRICT_TEMPLATE.into()), ..Default::default() });
    h.reply("ok");
    let messages = json!([
        {"role": "system", "content": "S1"}, {"role": "system", "content": "S2"},
        {"role": "user", "content": "U1"}, {"role": "system", "content": "mid"}, {"role": "user", "content": "U2"},
        {"role": "assistant", "content": "A1"}, {"role": "assistant", "content": "A2"}, {"role": "user", "content": "U3"}
    ]);
    let (status, r) = h.post_json("/v1/chat/completions", &json!({"messages": messages})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(
        h.last_prompt_text(),
        "S1\n\nS2[INST] U1\n\n[System note]\nmid\n\nU2 [/INST]A1\n\nA2</s>[INST] U3 [/INST]"
    );
    // What cannot be reshaped is a 400 that quotes the template.
    let (status, r) =
        h.post_json("/v1/chat/completions", &json!({"messages": [{"role": "assistant", "content": "A"}]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("roles must alternate"), "{r}");
}

#[tokio::test]
async fn web_ui_is_served_offline_and_opens_without_the_key() {
    let server = ServerConfig { api_key: Some("k".into()), ..Default::default() };
    let h = harness(Options { server, ..Default::default() });
    let response = h.send(Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let csp = response.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"), "{csp}");
    let html = body_text(response).await;
    assert!(html.contains(r#"<script src="/ui/app.js">"#) && html.contains(r#"href="/ui/style.css""#), "{html}");
    for (path, kind) in [("/ui/app.js", "text/javascript"), ("/ui/style.css", "text/css")] {
        let response = h.send(Request::get(path).body(Body::empty()).unwrap()).await;
        assert_eq!(response.status(), StatusCode::OK, "{path} stays open so the page can ask for the key");
        assert!(response.headers()["content-type"].to_str().unwrap().starts_with(kind));
        assert!(!body_text(response).await.is_empty());
    }
    // The data the page shows still needs the key.
    let (status, _) = h.get("/status").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = h.get("/ui/other.js").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "only the two assets are open");
}

#[tokio::test]
async fn no_webui_leaves_a_text_page() {
    let server = ServerConfig { webui: false, ..Default::default() };
    let h = harness(Options { server, ..Default::default() });
    let response = h.send(Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = body_text(response).await;
    assert!(text.contains("--no-webui") && !text.contains("/ui/app.js"), "{text}");
    let (status, _) = h.get("/ui/app.js").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
