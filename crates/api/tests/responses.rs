//! OpenAI Responses through the whole router: real Qwen2.5-Coder tokenizer and template, a scripted model. Checks the
//! stream event order Codex needs (agent-clients.md §4.4, §12.2), Codex's request shapes (developer messages,
//! function_call / function_call_output items, namespace and hosted tools, reasoning items, the warm-up probe),
//! stored responses with `previous_response_id`, GET and DELETE.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Options, body_text, harness, named_events};
use serde_json::{Value, json};

const RESPONSES: &str = "/v1/responses";

fn exec_tool() -> Value {
    json!({"type": "function", "name": "exec_command", "description": "Runs a command", "strict": false,
           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}})
}

async fn stream(h: &common::Harness, body: &Value) -> Vec<(String, Value)> {
    let response = h.send(Request::post(RESPONSES).body(Body::from(body.to_string())).unwrap()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let events = named_events(&body_text(response).await);
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i, "sequence numbers count from 0 without gaps");
    }
    events
}

#[tokio::test]
async fn text_response_is_stored_retrieved_and_deleted() {
    let h = harness(Options::default());
    h.reply("Hello from Splash.");
    let (status, r) = h.post_json(RESPONSES, &json!({"model": "m", "input": "Hi", "instructions": "Be nice."})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!((r["object"].as_str(), r["status"].as_str()), (Some("response"), Some("completed")));
    let id = r["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("resp_"));
    let item = &r["output"][0];
    assert_eq!(
        (item["type"].as_str(), item["role"].as_str(), item["status"].as_str()),
        (Some("message"), Some("assistant"), Some("completed"))
    );
    assert_eq!(item["content"][0]["type"], "output_text");
    assert_eq!(item["content"][0]["text"], "Hello from Splash.");
    let u = &r["usage"];
    assert_eq!(u["total_tokens"], u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap());
    assert!(h.last_prompt_text().starts_with("<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nHi<|im_end|>"));

    let (status, got) = h.get(&format!("{RESPONSES}/{id}")).await;
    assert_eq!((status, &got), (StatusCode::OK, &r));
    let request = Request::delete(format!("{RESPONSES}/{id}")).body(Body::empty()).unwrap();
    let (status, deleted) = common::json_of(h.send(request).await).await;
    assert_eq!((status, deleted["deleted"].as_bool()), (StatusCode::OK, Some(true)));
    let (status, err) = h.get(&format!("{RESPONSES}/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(err["error"]["message"].is_string());
}

#[tokio::test]
async fn previous_response_id_continues_the_conversation() {
    let h = harness(Options::default());
    h.reply("My name is Splash.");
    let (_, first) =
        h.post_json(RESPONSES, &json!({"input": "What is your name?", "instructions": "first only"})).await;
    h.reply("You asked my name.");
    let body = json!({"input": [{"role": "user", "content": "What did I ask?"}], "previous_response_id": first["id"]});
    let (status, second) = h.post_json(RESPONSES, &body).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["previous_response_id"], first["id"]);
    let prompt = h.last_prompt_text();
    assert!(
        prompt.contains("<|im_start|>user\nWhat is your name?<|im_end|>\n<|im_start|>assistant\nMy name is Splash.<|im_end|>\n<|im_start|>user\nWhat did I ask?"),
        "{prompt}"
    );
    assert!(!prompt.contains("first only"), "instructions are not carried over: {prompt}");
    // A chain of three, and an unknown id.
    h.reply("Third.");
    let (status, _) = h.post_json(RESPONSES, &json!({"input": "again", "previous_response_id": second["id"]})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(h.last_prompt_text().contains("What is your name?"));
    let (status, err) = h.post_json(RESPONSES, &json!({"input": "x", "previous_response_id": "resp_nope"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(err["error"]["param"], "previous_response_id");
    // store: false is not kept.
    let (_, unstored) = h.post_json(RESPONSES, &json!({"input": "x", "store": false})).await;
    let (status, _) = h.get(&format!("{RESPONSES}/{}", unstored["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn streamed_text_event_order() {
    let h = harness(Options::default());
    h.reply("Streaming works.");
    let ev = stream(&h, &json!({"input": "x", "stream": true})).await;
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        &names[..4],
        ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    );
    assert_eq!(
        &names[names.len() - 4..],
        ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    );
    assert!(names[4..names.len() - 4].iter().all(|n| *n == "response.output_text.delta"));
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
    let text: String = ev.iter().filter_map(|(_, d)| d["delta"].as_str()).collect();
    assert_eq!(text, "Streaming works.");
    let done = &ev[names.len() - 4].1;
    assert_eq!(done["text"], "Streaming works.");
    let completed = &ev.last().unwrap().1["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"][0]["content"][0]["text"], "Streaming works.");
    assert!(completed["usage"]["output_tokens"].as_u64().unwrap() > 0);
    let item_id = &ev[2].1["item"]["id"];
    assert!(ev[3..names.len() - 1].iter().all(|(_, d)| d["item_id"] == *item_id || d["item"]["id"] == *item_id));
}

#[tokio::test]
async fn codex_turn_with_function_call() {
    let h = harness(Options::default());
    h.reply("{\"name\": \"exec_command\", \"arguments\": {\"cmd\": \"echo hi > out.txt\"}}");
    let body = json!({
        "model": "local-model", "stream": true, "store": false, "parallel_tool_calls": true,
        "input": [
            {"type": "message", "id": "m1", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "write a file"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": null}
        ],
        "tools": [exec_tool(),
                  {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
                   "tools": [{"type": "function", "name": "close_agent", "parameters": {"type": "object"}}]},
                  {"type": "web_search", "external_web_access": false}],
        "tool_choice": "auto", "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "session", "client_metadata": {"turn_id": "t1"}
    });
    let ev = stream(&h, &body).await;
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    // The arguments stream in several deltas as the model writes them.
    let num_deltas = names.len() - 6;
    assert!(num_deltas > 1, "{names:?}");
    let mut want = vec!["response.created", "response.in_progress", "response.output_item.added"];
    want.extend(std::iter::repeat_n("response.function_call_arguments.delta", num_deltas));
    want.extend(["response.function_call_arguments.done", "response.output_item.done", "response.completed"]);
    assert_eq!(names, want);
    let joined: String = ev[3..3 + num_deltas].iter().map(|(_, d)| d["delta"].as_str().unwrap()).collect();
    assert_eq!(ev[3 + num_deltas].1["arguments"].as_str(), Some(joined.as_str()));
    let item = &ev[names.len() - 2].1["item"];
    assert_eq!(
        (item["type"].as_str(), item["name"].as_str(), item["status"].as_str()),
        (Some("function_call"), Some("exec_command"), Some("completed"))
    );
    assert!(item["call_id"].as_str().unwrap().starts_with("call_"));
    let args: Value = serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"cmd": "echo hi > out.txt"}));
    assert_eq!(ev[names.len() - 1].1["response"]["output"][0], *item);
    let prompt = h.last_prompt_text();
    assert!(prompt.contains("\"name\": \"close_agent\"") && !prompt.contains("web_search"), "{prompt}");

    // The next turn sends the call and its output back.
    h.reply("Done: the file is written.");
    let mut body = body;
    let input = body["input"].as_array_mut().unwrap();
    input.push(json!({"type": "function_call", "status": "completed", "id": item["id"], "name": "exec_command",
                      "arguments": item["arguments"], "call_id": item["call_id"]}));
    input.push(json!({"type": "function_call_output", "id": "fco_1", "call_id": item["call_id"], "output": "Process exited with code 0"}));
    let ev = stream(&h, &body).await;
    assert_eq!(ev.last().unwrap().1["response"]["output"][0]["content"][0]["text"], "Done: the file is written.");
    assert!(h.last_prompt_text().contains("<tool_response>\nProcess exited with code 0\n</tool_response>"));
}

#[tokio::test]
async fn calls_in_the_small_models_own_forms_are_calls() {
    let h = harness(Options::default());
    let exec = json!({"cmd": "printf 'hi' > hello.txt"});
    for reply in [
        // Qwen2.5-Coder-0.5B to Codex's "create hello.txt", about half the time: exec_command's arguments without
        // the tool's name, in a tag of its own.
        "<commands>\n{\"cmd\": \"printf 'hi' > hello.txt\"}\n</commands>",
        // Qwen2.5-Coder-1.5B to Codex (e2e rounds T7bqhB, zGItad): the call as an XML element inside the `<tools>`
        // wrapper its template puts around the tool list, or that list's entry with the value in `properties`.
        "<tools>\n  <function name=\"exec_command\" arguments='{\"cmd\": \"printf &apos;hi&apos; > hello.txt\"}'/>\n</tools>",
        "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"exec_command\", \"parameters\": {\"type\": \"object\", \"properties\": {\"cmd\": \"printf 'hi' > hello.txt\"}}}}\n</tools>",
    ] {
        h.reply(reply);
        let body =
            json!({"model": "m", "stream": true, "input": "create hello.txt holding hi", "tools": [exec_tool()]});
        let ev = stream(&h, &body).await;
        let output = ev.last().unwrap().1["response"]["output"].as_array().unwrap().clone();
        assert_eq!(output.len(), 1, "one call and no text for {reply:?}: {output:?}");
        assert_eq!(
            (output[0]["type"].as_str(), output[0]["name"].as_str()),
            (Some("function_call"), Some("exec_command")),
            "{reply:?}"
        );
        let args: Value = serde_json::from_str(output[0]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, exec, "{reply:?}");
        assert!(ev.iter().all(|(n, _)| n != "response.output_text.delta"), "no text streamed for {reply:?}: {ev:?}");
    }

    // The same object followed by prose is the model talking about a command; the tool list echoed back is an echo:
    // text, as written.
    for said in [
        "{\"cmd\": \"ls\"}\nThat command lists the files.",
        "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"exec_command\", \"parameters\": {\"type\": \"object\", \"properties\": {\"cmd\": {\"type\": \"string\"}}}}}\n</tools>",
    ] {
        h.reply(said);
        let (status, r) = h.post_json(RESPONSES, &json!({"model": "m", "input": "how?", "tools": [exec_tool()]})).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        assert_eq!(r["output"][0]["content"][0]["text"], said);
    }
}

#[tokio::test]
async fn probe_and_limits() {
    let h = harness(Options::default());
    h.reply("Hello there, this is long.");
    let (status, r) = h.post_json(RESPONSES, &json!({"model": "m", "input": "", "max_output_tokens": 1})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(
        (r["status"].as_str(), r["incomplete_details"]["reason"].as_str()),
        (Some("incomplete"), Some("max_output_tokens"))
    );
    let ev = stream(&h, &json!({"input": "x", "max_output_tokens": 2, "stream": true})).await;
    assert_eq!(ev.last().unwrap().0, "response.incomplete");
    // A title request with a JSON schema format is accepted.
    let format = json!({"format": {"type": "json_schema", "strict": true, "name": "codex_output_schema",
                                   "schema": {"type": "object", "properties": {"title": {"type": "string"}}}}});
    let (status, _) = h.post_json(RESPONSES, &json!({"input": "title?", "text": format, "tools": []})).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn bad_requests() {
    let h = harness(Options::default());
    for body in [
        "{oops",
        r#"{"input": 5}"#,
        r#"{"input": [{"type": "message", "role": "alien", "content": "x"}]}"#,
        r#"{"input": "x", "tool_choice": "sometimes"}"#,
    ] {
        let (status, r) = h.post_raw(RESPONSES, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {r}");
        assert_eq!(r["error"]["type"], "invalid_request_error");
    }
}

#[tokio::test]
async fn custom_tool_call_streams_and_comes_back() {
    // Codex's freeform apply_patch tool (a lark grammar); the model calls it as a function taking `input`.
    let grammar = "start: begin_patch hunk+ end_patch\nbegin_patch: \"*** Begin Patch\" LF\n";
    let apply_patch = json!({"type": "custom", "name": "apply_patch",
                             "description": "Use the `apply_patch` tool to edit files.",
                             "format": {"type": "grammar", "syntax": "lark", "definition": grammar}});
    let patch = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n";
    let h = harness(Options::default());
    h.reply(&format!("<tool_call>\n{}\n</tool_call>", json!({"name": "apply_patch", "arguments": {"input": patch}})));
    let body = json!({
        "model": "local-model", "stream": true, "store": false,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "write hello.txt"}]}],
        "tools": [exec_tool(), apply_patch], "tool_choice": "auto"
    });
    let ev = stream(&h, &body).await;
    let prompt = h.last_prompt_text();
    assert!(prompt.contains("\"name\": \"apply_patch\"") && prompt.contains("matches this Lark grammar"), "{prompt}");
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.custom_tool_call_input.delta",
            "response.custom_tool_call_input.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let added = &ev[2].1["item"];
    assert_eq!(
        (added["type"].as_str(), added["name"].as_str(), added["input"].as_str(), added["status"].as_str()),
        (Some("custom_tool_call"), Some("apply_patch"), Some(""), Some("in_progress"))
    );
    assert_eq!(ev[3].1["delta"], patch);
    assert_eq!(ev[4].1["input"], patch);
    for (_, d) in &ev[3..5] {
        assert_eq!((&d["item_id"], d["output_index"].as_u64()), (&added["id"], Some(0)));
    }
    let item = &ev[5].1["item"];
    assert_eq!(
        *item,
        json!({"type": "custom_tool_call", "id": added["id"], "call_id": added["call_id"], "name": "apply_patch",
               "input": patch, "status": "completed"})
    );
    assert_eq!(ev[6].1["response"]["output"], json!([item]));

    // Not streamed: the same item.
    h.reply(&format!("<tool_call>\n{}\n</tool_call>", json!({"name": "apply_patch", "arguments": {"input": patch}})));
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    let (status, r) = h.post_json(RESPONSES, &plain).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(
        (r["output"][0]["type"].as_str(), r["output"][0]["input"].as_str()),
        (Some("custom_tool_call"), Some(patch))
    );

    // Codex sends the call and its output back.
    h.reply("Created hello.txt.");
    let mut body = body;
    let input = body["input"].as_array_mut().unwrap();
    input.push(json!({"type": "custom_tool_call", "id": item["id"], "status": "completed", "call_id": item["call_id"],
                      "name": "apply_patch", "input": patch}));
    input.push(json!({"type": "custom_tool_call_output", "call_id": item["call_id"],
                      "output": "Success. Updated the following files:\nA hello.txt\n"}));
    let ev = stream(&h, &body).await;
    assert_eq!(ev.last().unwrap().1["response"]["output"][0]["content"][0]["text"], "Created hello.txt.");
    let prompt = h.last_prompt_text();
    let call = r#"{"name": "apply_patch", "arguments": {"input": "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n"}}"#;
    assert!(prompt.contains(&format!("<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call>")), "{prompt}");
    assert!(
        prompt.contains("<tool_response>\nSuccess. Updated the following files:\nA hello.txt\n\n</tool_response>"),
        "{prompt}"
    );
}
