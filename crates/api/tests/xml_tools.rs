//! Qwen3-Coder's XML tool calls through the whole router, in all three APIs: the Qwen3-Coder chat template (the
//! vendored llama.cpp's `models/templates/Qwen3-Coder.jinja`, `crates/chat/templates`) over the real Qwen2.5-Coder
//! tokenizer (Qwen3-Coder's ids are the same) and a scripted model that writes the XML form, token by token, under the
//! lazy tool grammar the server puts on it. Checks that the call comes out as the protocol's tool call with arguments
//! typed by the tool's schema (a string that looks like a number stays a string, a number is a number), streamed
//! (arguments as they are written) and not; that the history renders the call back in the XML form; that a call to
//! an undeclared tool, or one that breaks the schema, never reaches the client as a call. Also writes the replies
//! for `scripts/e2e/sdk_xml_tools.py` (the official SDKs' accumulators over the same bodies).

mod common;

use api::ServerConfig;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Harness, Options, body_text, harness, named_events, sse_data};
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const RESPONSES: &str = "/v1/responses";

const QWEN3_CODER: &str = include_str!("../../chat/templates/qwen3-coder.jinja");

/// What Qwen3-Coder writes for "write 42 to n.txt, 30 s at most": text, then the XML call.
const CALL_REPLY: &str = "I'll run it.\n<tool_call>\n<function=Bash>\n<parameter=command>\necho 42 > n.txt\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n<parameter=description>\n42\n</parameter>\n</function>\n</tool_call>";

fn arguments() -> Value {
    json!({"command": "echo 42 > n.txt", "timeout": 30, "description": "42"})
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"},
           "description": {"type": "string"}}, "required": ["command"]})
}

fn server(tool_grammar: bool) -> Harness {
    let server = ServerConfig { tool_grammar, ..Default::default() };
    harness(Options { template: Some(QWEN3_CODER.into()), server, ..Default::default() })
}

fn user() -> Value {
    json!([{"role": "user", "content": "Write 42 to n.txt"}])
}

/// The request body of each API with the Bash tool.
fn request(path: &str, stream: bool) -> Value {
    match path {
        CHAT => json!({"messages": user(), "stream": stream,
                       "tools": [{"type": "function", "function": {"name": "Bash", "parameters": schema()}}]}),
        MESSAGES => json!({"max_tokens": 200, "messages": user(), "stream": stream,
                           "tools": [{"name": "Bash", "input_schema": schema()}]}),
        _ => json!({"input": "Write 42 to n.txt", "stream": stream,
                    "tools": [{"type": "function", "name": "Bash", "parameters": schema()}]}),
    }
}

async fn post(h: &Harness, path: &str, body: &Value) -> String {
    let request =
        Request::post(path).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap();
    let response = h.send(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    body_text(response).await
}

/// Text, calls (name, arguments) and how many argument pieces each call was streamed in, from a reply of any API,
/// streamed or not.
fn read(path: &str, body: &str, stream: bool) -> (String, Vec<(String, Value)>, Vec<usize>) {
    let (mut text, mut calls, mut pieces) = (String::new(), Vec::new(), Vec::new());
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap_or_else(|e| panic!("{e}: {s:?} in {body}"));
    if !stream {
        let r = parse(body);
        match path {
            CHAT => {
                let m = &r["choices"][0]["message"];
                text = m["content"].as_str().unwrap_or_default().to_owned();
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    let f = &c["function"];
                    calls.push((f["name"].as_str().unwrap().to_owned(), parse(f["arguments"].as_str().unwrap())));
                }
            }
            MESSAGES => {
                for b in r["content"].as_array().unwrap() {
                    match b["type"].as_str() {
                        Some("text") => text.push_str(b["text"].as_str().unwrap()),
                        Some("tool_use") => calls.push((b["name"].as_str().unwrap().to_owned(), b["input"].clone())),
                        other => panic!("{other:?}"),
                    }
                }
            }
            _ => {
                for o in r["output"].as_array().unwrap() {
                    match o["type"].as_str() {
                        Some("message") => text.push_str(o["content"][0]["text"].as_str().unwrap()),
                        Some("function_call") => calls
                            .push((o["name"].as_str().unwrap().to_owned(), parse(o["arguments"].as_str().unwrap()))),
                        other => panic!("{other:?}"),
                    }
                }
            }
        }
        return (text, calls, pieces);
    }
    let mut args: Vec<String> = Vec::new();
    match path {
        CHAT => {
            for data in sse_data(body).into_iter().filter(|d| d != "[DONE]") {
                let delta = &parse(&data)["choices"][0]["delta"];
                text.push_str(delta["content"].as_str().unwrap_or_default());
                for c in delta["tool_calls"].as_array().into_iter().flatten() {
                    if let Some(name) = c["function"]["name"].as_str() {
                        calls.push((name.to_owned(), Value::Null));
                        args.push(String::new());
                        pieces.push(0);
                    }
                    let a = c["function"]["arguments"].as_str().unwrap_or_default();
                    if !a.is_empty() {
                        args.last_mut().unwrap().push_str(a);
                        *pieces.last_mut().unwrap() += 1;
                    }
                }
            }
        }
        MESSAGES => {
            for (name, e) in named_events(body) {
                match (name.as_str(), e["delta"]["type"].as_str()) {
                    ("content_block_start", _) if e["content_block"]["type"] == "tool_use" => {
                        calls.push((e["content_block"]["name"].as_str().unwrap().to_owned(), Value::Null));
                        args.push(String::new());
                        pieces.push(0);
                    }
                    ("content_block_delta", Some("text_delta")) => text.push_str(e["delta"]["text"].as_str().unwrap()),
                    ("content_block_delta", Some("input_json_delta")) => {
                        args.last_mut().unwrap().push_str(e["delta"]["partial_json"].as_str().unwrap());
                        *pieces.last_mut().unwrap() += 1;
                    }
                    _ => {}
                }
            }
        }
        _ => {
            for (name, e) in named_events(body) {
                match name.as_str() {
                    "response.output_text.delta" => text.push_str(e["delta"].as_str().unwrap()),
                    "response.output_item.added" if e["item"]["type"] == "function_call" => {
                        calls.push((e["item"]["name"].as_str().unwrap().to_owned(), Value::Null));
                        args.push(String::new());
                        pieces.push(0);
                    }
                    "response.function_call_arguments.delta" => {
                        args.last_mut().unwrap().push_str(e["delta"].as_str().unwrap());
                        *pieces.last_mut().unwrap() += 1;
                    }
                    "response.function_call_arguments.done" => {
                        assert_eq!(parse(e["arguments"].as_str().unwrap()), parse(args.last().unwrap()));
                    }
                    _ => {}
                }
            }
        }
    }
    for (call, a) in calls.iter_mut().zip(&args) {
        call.1 = parse(a);
    }
    (text, calls, pieces)
}

#[tokio::test]
async fn xml_calls_in_all_three_apis_streamed_and_not() {
    let h = server(true);
    h.reply(CALL_REPLY);
    let dir = std::env::var_os("SPLASH_XML_TOOLS_BODIES").map(std::path::PathBuf::from);
    for (name, path) in [("chat", CHAT), ("messages", MESSAGES), ("responses", RESPONSES)] {
        for stream in [false, true] {
            let body = post(&h, path, &request(path, stream)).await;
            let (text, calls, pieces) = read(path, &body, stream);
            assert_eq!(text.trim(), "I'll run it.", "{name} stream={stream}: {body}");
            assert_eq!(calls, vec![("Bash".to_owned(), arguments())], "{name} stream={stream}: {body}");
            if stream {
                // The command streamed as it was written: in several pieces, not in one at the end.
                assert!(pieces[0] >= 4, "{name}: {pieces:?} pieces: {body}");
            }
            let finish = match path {
                CHAT if !stream => json!(serde_json::from_str::<Value>(&body).unwrap()["choices"][0]["finish_reason"]),
                MESSAGES if !stream => json!(serde_json::from_str::<Value>(&body).unwrap()["stop_reason"]),
                _ => Value::Null,
            };
            assert!(finish.is_null() || finish == "tool_calls" || finish == "tool_use", "{name}: {finish}");
            if let Some(dir) = &dir {
                std::fs::create_dir_all(dir).unwrap();
                std::fs::write(dir.join(format!("{name}.{}", if stream { "sse" } else { "json" })), &body).unwrap();
            }
        }
    }
    // The prompt is Qwen3-Coder's: the tool list with parameter types, and the XML call format.
    let prompt = h.last_prompt_text();
    assert!(prompt.contains("<name>timeout</name>\n<type>number</type>"), "{prompt}");
    assert!(prompt.contains("<tool_call>\n<function=example_function_name>"), "{prompt}");
}

#[tokio::test]
async fn the_call_comes_back_as_xml_in_the_history() {
    let h = server(true);
    h.reply("Done.");
    let messages = json!([
        {"role": "user", "content": "Write 42 to n.txt"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "Bash", "arguments": arguments().to_string()}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": ""},
    ]);
    let tools = json!([{"type": "function", "function": {"name": "Bash", "parameters": schema()}}]);
    let (status, r) = h.post_json(CHAT, &json!({"messages": messages, "tools": tools})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let prompt = h.last_prompt_text();
    let turn = "<|im_start|>assistant\n<tool_call>\n<function=Bash>\n<parameter=command>\necho 42 > n.txt\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n<parameter=description>\n42\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n";
    assert!(prompt.ends_with(turn), "{prompt}");
}

#[tokio::test]
async fn calls_that_break_the_schema_never_reach_the_client() {
    let undeclared =
        "<tool_call>\n<function=Python>\n<parameter=code>\nprint(42)\n</parameter>\n</function>\n</tool_call>";
    let bad_number = "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n<parameter=timeout>\nsoon\n</parameter>\n</function>\n</tool_call>";
    let missing = "<tool_call>\n<function=Bash>\n<parameter=timeout>\n3\n</parameter>\n</function>\n</tool_call>";
    // Without the grammar (`--no-tool-grammar`) the parser reads such a call as text.
    let h = server(false);
    for reply in [undeclared, bad_number, missing] {
        h.reply(reply);
        for (path, stream) in [(CHAT, false), (CHAT, true), (MESSAGES, true), (RESPONSES, false)] {
            let (text, calls, _) = read(path, &post(&h, path, &request(path, stream)).await, stream);
            assert!(calls.is_empty(), "{path} {stream}: {calls:?}");
            assert_eq!(text, reply, "{path} {stream}");
        }
    }
    // With it, the model cannot write them: the grammar holds the call to a declared tool, its declared parameters
    // and their types, so what it writes instead reaches the client as a valid call or as text. (The scripted model
    // then loops inside a value until the output limit: a streamed call cut there is reported as cut, as OpenAI and
    // Anthropic report a call cut by `max_tokens`.)
    let h = server(true);
    let valid = |args: &Value| {
        args["command"].is_string()
            && args.get("timeout").is_none_or(Value::is_number)
            && args.as_object().unwrap().keys().all(|k| schema()["properties"].get(k).is_some())
    };
    for reply in [undeclared, bad_number, missing] {
        h.reply(reply);
        for path in [CHAT, MESSAGES, RESPONSES] {
            let mut body = request(path, false);
            let limit = match path {
                CHAT => "max_completion_tokens",
                MESSAGES => "max_tokens",
                _ => "max_output_tokens",
            };
            body[limit] = json!(60);
            let (_, calls, _) = read(path, &post(&h, path, &body).await, false);
            assert!(calls.iter().all(|(name, args)| name == "Bash" && valid(args)), "{path}: {calls:?}");
        }
        let mut body = request(CHAT, true);
        body["max_completion_tokens"] = json!(60);
        let sse = post(&h, CHAT, &body).await;
        let cut = sse_data(&sse).iter().any(|d| d.contains("\"finish_reason\":\"length\""));
        let (mut args, mut names) = (Vec::<String>::new(), Vec::new());
        for data in sse_data(&sse).into_iter().filter(|d| d != "[DONE]") {
            let chunk: Value = serde_json::from_str(&data).unwrap();
            for c in chunk["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten() {
                if let Some(name) = c["function"]["name"].as_str() {
                    names.push(name.to_owned());
                    args.push(String::new());
                }
                args.last_mut().unwrap().push_str(c["function"]["arguments"].as_str().unwrap_or_default());
            }
        }
        for (i, (name, a)) in names.iter().zip(&args).enumerate() {
            assert_eq!(name, "Bash");
            match serde_json::from_str::<Value>(a) {
                Ok(v) => assert!(valid(&v), "{v}"),
                Err(_) => assert!(cut && i + 1 == names.len(), "only a call cut by the limit is incomplete: {sse}"),
            }
        }
    }
}

#[tokio::test]
async fn hermes_json_calls_still_work_under_the_xml_template() {
    let h = server(true);
    h.reply("<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>");
    for (path, stream) in [(CHAT, false), (CHAT, true), (MESSAGES, true), (RESPONSES, true)] {
        let (_, calls, _) = read(path, &post(&h, path, &request(path, stream)).await, stream);
        assert_eq!(calls, vec![("Bash".to_owned(), json!({"command": "ls"}))], "{path} {stream}");
    }
}

/// A forced call (`tool_choice` required, or naming the tool) under the XML template is held to the XML form: the
/// prompt opens `<tool_call>\n`, the model writes `<function=Bash>` and its parameters, and the call reaches the client
/// typed by the schema, its arguments streamed as they are written, in all three APIs. (Under the JSON grammar of a
/// forced Hermes call the model could not write `<function=` at all.)
#[tokio::test]
async fn forced_calls_are_written_in_the_xml_form() {
    let h = server(true);
    let call = CALL_REPLY.split_once("<tool_call>\n").expect("a call").1;
    h.reply(call);
    let choices = |path: &str| match path {
        CHAT => [json!("required"), json!({"type": "function", "function": {"name": "Bash"}})],
        MESSAGES => [json!({"type": "any"}), json!({"type": "tool", "name": "Bash"})],
        _ => [json!("required"), json!({"type": "function", "name": "Bash"})],
    };
    for (name, path) in [("chat", CHAT), ("messages", MESSAGES), ("responses", RESPONSES)] {
        for choice in choices(path) {
            for stream in [false, true] {
                let mut body = request(path, stream);
                body["tool_choice"] = choice.clone();
                let reply = post(&h, path, &body).await;
                let (text, calls, pieces) = read(path, &reply, stream);
                assert_eq!(text, "", "{name} {choice} stream={stream}: {reply}");
                assert_eq!(calls, vec![("Bash".to_owned(), arguments())], "{name} {choice} stream={stream}: {reply}");
                if stream {
                    assert!(pieces[0] >= 4, "{name} {choice}: {pieces:?} pieces: {reply}");
                }
                assert!(h.last_prompt_text().ends_with("<|im_start|>assistant\n<tool_call>\n"), "{name} {choice}");
            }
        }
    }
}
