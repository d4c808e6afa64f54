//! Engine hooks surfaced in the protocols, over the scripted model (`common`): OpenAI `logprobs` / `top_logprobs`
//! (stream and not) and `n` choices; Anthropic `stop_sequence`. The scripted model puts logit 10 on the next reply
//! token and 0 on every other token, so the expected log-probabilities are computed here in closed form:
//! chosen = 10 - ln(e^10 + V - 1), any other = -ln(e^10 + V - 1).

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Options, assets, body_text, harness, sse_data};
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn expected_logprobs() -> (f64, f64) {
    let v = assets().tokenizer.vocab_size() as f64;
    let z = (10f64.exp() + v - 1.0).ln();
    (10.0 - z, -z)
}

async fn sse(h: &common::Harness, path: &str, body: &Value) -> Vec<String> {
    let request =
        Request::post(path).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap();
    let response = h.send(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    sse_data(&body_text(response).await)
}

/// Checks one choice's `logprobs.content` against the reply text and the closed form.
fn check_logprobs(content: &[Value], text: &str, num_top: usize) {
    let (chosen, other) = expected_logprobs();
    let joined: String = content.iter().map(|e| e["token"].as_str().expect("token")).collect();
    assert_eq!(joined, text, "the tokens spell the reply");
    for e in content {
        let bytes: Vec<u8> = e["bytes"].as_array().expect("bytes").iter().map(|b| b.as_u64().unwrap() as u8).collect();
        assert_eq!(String::from_utf8(bytes).expect("UTF-8"), e["token"].as_str().unwrap());
        assert!((e["logprob"].as_f64().unwrap() - chosen).abs() < 1e-3, "{e}");
        let top = e["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), num_top, "{e}");
        if num_top > 0 {
            assert_eq!(top[0]["token"], e["token"]);
            assert!((top[0]["logprob"].as_f64().unwrap() - chosen).abs() < 1e-3);
            for t in &top[1..] {
                assert!((t["logprob"].as_f64().unwrap() - other).abs() < 1e-3, "{t}");
            }
        }
    }
}

#[tokio::test]
async fn logprobs_non_streaming() {
    let h = harness(Options::default());
    h.reply("alpha beta gamma");
    let body = json!({"messages": user("x"), "logprobs": true, "top_logprobs": 3});
    let (status, r) = h.post_json(CHAT, &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let content = r["choices"][0]["logprobs"]["content"].as_array().expect("content").clone();
    assert_eq!(content.len(), r["usage"]["completion_tokens"].as_u64().unwrap() as usize - 1, "all but the EOS");
    check_logprobs(&content, "alpha beta gamma", 3);
    // logprobs without alternatives; and none when not asked.
    let (_, r) = h.post_json(CHAT, &json!({"messages": user("x"), "logprobs": true})).await;
    check_logprobs(r["choices"][0]["logprobs"]["content"].as_array().unwrap(), "alpha beta gamma", 0);
    let (_, r) = h.post_json(CHAT, &json!({"messages": user("x")})).await;
    assert!(r["choices"][0]["logprobs"].is_null());
    // More than 20 alternatives, or alternatives without logprobs: 400 naming the field.
    for body in [
        json!({"messages": user("x"), "logprobs": true, "top_logprobs": 21}),
        json!({"messages": user("x"), "top_logprobs": 2}),
    ] {
        let (status, r) = h.post_json(CHAT, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{r}");
        assert_eq!(r["error"]["param"], "top_logprobs");
    }
    let (status, _) = h.post_json(CHAT, &json!({"messages": user("x"), "logprobs": true, "top_logprobs": 20})).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn logprobs_streaming() {
    let h = harness(Options::default());
    h.reply("one two three four");
    let events =
        sse(&h, CHAT, &json!({"messages": user("x"), "stream": true, "logprobs": true, "top_logprobs": 2})).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut text = String::new();
    let mut content = Vec::new();
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).expect("JSON chunk");
        let choice = &v["choices"][0];
        text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        if let Some(c) = choice["logprobs"]["content"].as_array() {
            content.extend(c.iter().cloned());
        }
    }
    assert_eq!(text, "one two three four");
    check_logprobs(&content, &text, 2);
}

#[tokio::test]
async fn n_choices() {
    let h = harness(Options::default());
    h.reply("same reply");
    let (status, r) = h.post_json(CHAT, &json!({"messages": user("x"), "n": 3, "seed": 5})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let choices = r["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], "same reply");
        assert_eq!(c["finish_reason"], "stop");
    }
    // Three engine requests of one prompt: the prompt counted once, the outputs summed.
    let (_, one) = h.post_json(CHAT, &json!({"messages": user("x")})).await;
    assert_eq!(r["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
    assert_eq!(r["usage"]["completion_tokens"].as_u64(), one["usage"]["completion_tokens"].as_u64().map(|n| 3 * n));
    let prompts = h.seen().prompts.len();
    assert_eq!(prompts, 4, "n = 3 ran three sequences, then one more");

    // Streaming: every choice gets its role chunk, its text and its finish reason; one usage chunk; one [DONE].
    let body = json!({"messages": user("x"), "n": 2, "stream": true, "stream_options": {"include_usage": true}});
    let events = sse(&h, CHAT, &body).await;
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut texts = [String::new(), String::new()];
    let mut finishes = [0, 0];
    let mut roles = [0, 0];
    let mut usage = None;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
            continue;
        }
        let c = &v["choices"][0];
        let i = c["index"].as_u64().expect("index") as usize;
        texts[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
        roles[i] += usize::from(c["delta"]["role"] == "assistant");
        finishes[i] += usize::from(c["finish_reason"] == "stop");
    }
    assert_eq!(texts, ["same reply", "same reply"]);
    assert_eq!((roles, finishes), ([1, 1], [1, 1]));
    let usage = usage.expect("usage chunk");
    assert_eq!(usage["completion_tokens"].as_u64(), one["usage"]["completion_tokens"].as_u64().map(|n| 2 * n));
}

#[tokio::test]
async fn anthropic_stop_sequence() {
    let h = harness(Options::default());
    h.reply("alpha beta gamma delta");
    let body = json!({"model": "m", "max_tokens": 50, "messages": user("x"), "stop_sequences": ["zeta", "gamma"]});
    let (status, r) = h.post_json("/v1/messages", &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!((r["stop_reason"].as_str(), r["stop_sequence"].as_str()), (Some("stop_sequence"), Some("gamma")));
    assert_eq!(r["content"][0]["text"], "alpha beta ");
    assert_eq!(r["usage"]["cache_read_input_tokens"], 0);
    // No stop sequence hit: end_turn and null.
    let (_, r) = h.post_json("/v1/messages", &json!({"model": "m", "max_tokens": 50, "messages": user("x")})).await;
    assert_eq!(r["stop_reason"], "end_turn");
    assert!(r["stop_sequence"].is_null());
    // Streamed: message_delta carries both.
    let mut body = body;
    body["stream"] = json!(true);
    let events = sse(&h, "/v1/messages", &body).await;
    let delta: Value = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find(|v| v["type"] == "message_delta")
        .expect("message_delta");
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(delta["delta"]["stop_sequence"], "gamma");
    // OpenAI reports the same stop as "stop".
    let (_, r) = h.post_json(CHAT, &json!({"messages": user("x"), "stop": ["gamma"]})).await;
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
}

/// The scripted model writes free text where the schema wants JSON: every token it prefers is masked, so what comes
/// out is what the grammar leaves (the lowest allowed id at each tie), and it must still be valid under the schema.
#[tokio::test]
async fn json_schema_is_enforced_from_the_first_token() {
    let h = harness(Options::default());
    h.reply("Sure! Here is the answer you asked for, in prose rather than JSON.");
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                        "additionalProperties": false});
    let body = json!({"messages": user("x"), "max_tokens": 30, "temperature": 0,
                      "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}});
    let (status, r) = h.post_json(CHAT, &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let text = r["choices"][0]["message"]["content"].as_str().expect("content");
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    assert!(v["ok"].is_boolean() && v.as_object().unwrap().len() == 1, "{text}");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");

    // Without a format the same model writes its prose.
    let (_, r) = h.post_json(CHAT, &json!({"messages": user("x"), "max_tokens": 30})).await;
    assert!(r["choices"][0]["message"]["content"].as_str().unwrap().starts_with("Sure!"));

    // json_object: any object. Responses text.format json_schema: the same grammar.
    let body = json!({"messages": user("x"), "max_tokens": 30, "response_format": {"type": "json_object"}});
    let (_, r) = h.post_json(CHAT, &body).await;
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with('{'), "{text}");
    let body = json!({"input": "x", "max_output_tokens": 30, "stream": false,
                      "text": {"format": {"type": "json_schema", "name": "r", "schema": schema, "strict": true}}});
    let (status, r) = h.post_json("/v1/responses", &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let text = r["output"][0]["content"][0]["text"].as_str().expect("output text");
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    assert!(v["ok"].is_boolean(), "{text}");

    // A schema llguidance cannot compile is a 400 naming the field.
    let bad = json!({"messages": user("x"), "response_format": {"type": "json_schema",
                     "json_schema": {"name": "r", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}});
    let (status, r) = h.post_json(CHAT, &bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{r}");
    assert_eq!(r["error"]["param"], "response_format");
}

/// A required call while the model would rather chat: the grammar makes the reply a call of a declared tool whose
/// arguments follow its schema.
#[tokio::test]
async fn required_tool_call_is_enforced_from_the_first_token() {
    let h = harness(Options::default());
    h.reply("I think I should just answer in text instead.");
    let tool = json!({"type": "function", "function": {"name": "set_flag", "parameters": {
        "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"], "additionalProperties": false}}});
    let body = json!({"messages": user("x"), "tools": [tool], "tool_choice": "required", "max_tokens": 40});
    let (status, r) = h.post_json(CHAT, &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let call = &r["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "set_flag", "{r}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).expect("JSON arguments");
    assert!(args["on"].is_boolean(), "{args}");
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");
}

/// A forced call streams its arguments as they are generated, in all three protocols; the pieces join to the
/// arguments the non-streamed reply gives.
#[tokio::test]
async fn forced_call_arguments_stream_incrementally() {
    let h = harness(Options::default());
    let args = json!({"path": "src/main.rs", "content": "fn main() {\n    println!(\"hello, world\");\n}\n"});
    h.reply(&format!("{{\"name\": \"write_file\", \"arguments\": {}}}\n</tool_call>", python_json(&args)));
    let tool = json!({"type": "function", "function": {"name": "write_file", "parameters": {"type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}}});

    // OpenAI: the first piece names the call, the rest carry only arguments.
    let body = json!({"messages": user("x"), "tools": [tool], "tool_choice": "required", "stream": true});
    let events = sse(&h, CHAT, &body).await;
    let pieces: Vec<Value> = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["choices"][0]["delta"]["tool_calls"][0].as_object().map(|o| Value::Object(o.clone())))
        .collect();
    assert!(pieces.len() >= 3, "{pieces:?}");
    assert_eq!(pieces[0]["function"]["name"], "write_file");
    assert!(pieces[0]["id"].is_string());
    assert!(pieces[1..].iter().all(|p| p.get("id").is_none() && p["function"].get("name").is_none()), "{pieces:?}");
    let joined: String = pieces.iter().map(|p| p["function"]["arguments"].as_str().unwrap()).collect();
    assert_eq!(serde_json::from_str::<Value>(&joined).expect("JSON"), args);
    let finish = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find_map(|v| v["choices"][0]["finish_reason"].as_str().map(str::to_string));
    assert_eq!(finish.as_deref(), Some("tool_calls"));

    // Anthropic: tool_use block, several input_json_delta, one stop.
    let body = json!({"model": "m", "max_tokens": 200, "stream": true, "messages": user("x"), "tool_choice": {"type": "any"},
                      "tools": [{"name": "write_file", "input_schema": tool["function"]["parameters"]}]});
    let events: Vec<Value> =
        sse(&h, "/v1/messages", &body).await.iter().filter_map(|e| serde_json::from_str(e).ok()).collect();
    let start = events.iter().find(|v| v["type"] == "content_block_start").expect("block start");
    assert_eq!(start["content_block"]["type"], "tool_use");
    let deltas: Vec<&str> = events
        .iter()
        .filter(|v| v["delta"]["type"] == "input_json_delta")
        .map(|v| v["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert!(deltas.len() >= 2, "{deltas:?}");
    assert_eq!(serde_json::from_str::<Value>(&deltas.concat()).expect("JSON"), args);
    assert_eq!(events.iter().filter(|v| v["type"] == "content_block_stop").count(), 1);
    let stop = events.iter().find(|v| v["type"] == "message_delta").expect("message_delta");
    assert_eq!(stop["delta"]["stop_reason"], "tool_use");

    // Responses: argument deltas, then done with the joined arguments.
    let body = json!({"input": "x", "stream": true, "tool_choice": "required",
                      "tools": [{"type": "function", "name": "write_file", "parameters": tool["function"]["parameters"]}]});
    let events: Vec<Value> =
        sse(&h, "/v1/responses", &body).await.iter().filter_map(|e| serde_json::from_str(e).ok()).collect();
    let deltas: Vec<&str> = events
        .iter()
        .filter(|v| v["type"] == "response.function_call_arguments.delta")
        .map(|v| v["delta"].as_str().unwrap())
        .collect();
    assert!(deltas.len() >= 2, "{deltas:?}");
    let done = events.iter().find(|v| v["type"] == "response.function_call_arguments.done").expect("done");
    assert_eq!(done["arguments"].as_str(), Some(deltas.concat().as_str()));
    assert_eq!(done["name"], "write_file");
    let completed = events.iter().find(|v| v["type"] == "response.completed").expect("completed");
    let item = &completed["response"]["output"][0];
    assert_eq!((item["type"].as_str(), item["status"].as_str()), (Some("function_call"), Some("completed")));
    assert_eq!(serde_json::from_str::<Value>(item["arguments"].as_str().unwrap()).unwrap(), args);
}

/// JSON as the grammar writes it (Python's `json.dumps` separators: ", " and ": ").
fn python_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let items: Vec<String> =
                m.iter().map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), python_json(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(python_json).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// Odd or broken schemas from clients: each is either used (200, output valid JSON) or refused with a 400 that
/// names `response_format`; never a 500, never a stuck request.
#[tokio::test]
async fn odd_schemas_are_used_or_refused_cleanly() {
    let h = harness(Options::default());
    h.reply("plain words");
    let schemas = [
        json!({"type": ["string", "number"]}),
        json!({"$ref": "#/$defs/missing"}),
        json!({"oneOf": []}),
        json!({"anyOf": []}),
        json!({"type": "string", "pattern": "(unclosed"}),
        json!({"enum": []}),
        json!({"type": "string", "minLength": 5, "maxLength": 2}),
        json!({"type": "array", "minItems": 3, "maxItems": 1}),
        json!({"type": "integer", "minimum": 10, "maximum": 1}),
        json!({"not": {}}),
        json!({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}),
        json!({"const": {"deep": [1, 2, {"x": null}]}}),
        json!({}),
    ];
    for schema in schemas {
        let body = json!({"messages": user("x"), "max_tokens": 20,
                          "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}});
        let (status, r) = h.post_json(CHAT, &body).await;
        match status {
            StatusCode::OK => {
                let text = r["choices"][0]["message"]["content"].as_str().unwrap_or_default();
                assert!(!text.starts_with("plain"), "{schema}: the prose got through: {text:?}");
            }
            StatusCode::BAD_REQUEST => assert_eq!(r["error"]["param"], "response_format", "{schema}: {r}"),
            other => panic!("{schema}: {other} {r}"),
        }
    }
}
