//! A reply as a Responses event stream, in the order Codex needs: `response.created`, `response.in_progress`, then
//! per output item `response.output_item.added`, its content events (`response.content_part.added`,
//! `response.output_text.delta` … `.done`, `response.content_part.done`; for a thinking model's reasoning item, first,
//! the same with `response.reasoning_text.delta` … `.done`; or `response.function_call_arguments.delta` / `.done`;
//! for a custom tool's call, `response.custom_tool_call_input.delta` / `.done` once the call is complete, as its input
//! is a string inside the JSON arguments the model writes) and `response.output_item.done`, and finally `response.completed` (or `response.incomplete` when the
//! output limit was hit) with usage. Every event carries `sequence_number`. A failure after the start is one
//! `response.failed`. The finished response is stored when the request asked for it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use chat::{Message, ToolCall};
use futures::Stream;
use serde_json::{Map, Value, json};

use super::{convert, wire};
use crate::AppState;
use crate::generate::{Output, Reply, StopReason, random_id};

/// The response being streamed and what is needed to finish and store it.
pub struct Pending {
    pub state: Arc<AppState>,
    /// The response as created (status `in_progress`, no output yet).
    pub response: wire::Response,
    /// The conversation so far, stored with the response when `store` is set.
    pub conversation: Vec<Message>,
    /// How calls of the declared tools go back ([`convert::ToolIndex`]).
    pub tools: convert::ToolIndex,
}

struct State {
    reply: Reply,
    pending: Pending,
    queue: VecDeque<Event>,
    sequence_number: u64,
    /// The open message item: id, output index, text so far.
    text: Option<(String, usize, String)>,
    /// The open reasoning item: id, output index, reasoning so far.
    reasoning: Option<(String, usize, String)>,
    all_reasoning: String,
    output: Vec<Value>,
    calls: Vec<ToolCall>,
    all_text: String,
    /// A function call whose arguments are being streamed: item id, call id, output index, name, arguments so far.
    open_call: Option<(String, String, usize, String, String)>,
    ended: bool,
}

/// The SSE response for `reply`.
pub fn sse(reply: Reply, pending: Pending, keep_alive: Duration) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut state = State {
        reply,
        pending,
        queue: VecDeque::new(),
        sequence_number: 0,
        text: None,
        reasoning: None,
        all_reasoning: String::new(),
        output: Vec::new(),
        calls: Vec::new(),
        open_call: None,
        all_text: String::new(),
        ended: false,
    };
    let created = serde_json::to_value(&state.pending.response).expect("INVARIANT: wire types serialize");
    state.push("response.created", json!({"response": created}));
    state.push("response.in_progress", json!({"response": created}));
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.queue.pop_front() {
                return Some((Ok(e), s));
            }
            if s.ended {
                return None;
            }
            s.fill().await;
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(keep_alive))
}

impl State {
    fn push(&mut self, kind: &str, data: Value) {
        let mut map = match data {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        let mut event = Map::new();
        event.insert("type".into(), Value::from(kind));
        event.insert("sequence_number".into(), Value::from(self.sequence_number));
        event.append(&mut map);
        self.sequence_number += 1;
        self.queue.push_back(Event::default().event(kind).data(Value::Object(event).to_string()));
    }

    fn close_reasoning(&mut self) {
        let Some((id, index, text)) = self.reasoning.take() else { return };
        let part = json!({"type": "reasoning_text", "text": text});
        self.push(
            "response.reasoning_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
        );
        self.push(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        let item = convert::reasoning_item(&id, &text, "completed");
        self.push("response.output_item.done", json!({"output_index": index, "item": item}));
        self.output.push(item);
    }

    fn close_text(&mut self) {
        let Some((id, index, text)) = self.text.take() else { return };
        let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
        self.push(
            "response.output_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
        );
        self.push(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        let item = convert::message_item(&id, &text, "completed");
        self.push("response.output_item.done", json!({"output_index": index, "item": item}));
        self.output.push(item);
    }

    /// Ends the streamed call: `call` is the parsed call (its arguments as streamed), `None` when the reply ended
    /// inside it.
    fn close_call(&mut self, call: Option<ToolCall>, status: &str) {
        let Some((id, call_id, index, name, streamed)) = self.open_call.take() else { return };
        // A custom tool's input comes from the parsed arguments when the call is complete.
        let arguments = match &call {
            Some(c) if self.pending.tools.custom.contains(&name) => c.arguments.to_string(),
            _ => streamed,
        };
        self.finish_call_item(&id, &call_id, index, &name, &arguments, status);
        if let Some(call) = call {
            self.calls.push(ToolCall { id: Some(call_id), ..call });
        }
    }

    /// The closing events of a call item whose arguments are `arguments`: for a function, the arguments are done (their
    /// deltas went out as they came); for a custom tool, its whole input as one delta, then done.
    fn finish_call_item(&mut self, id: &str, call_id: &str, index: usize, name: &str, arguments: &str, status: &str) {
        if self.pending.tools.custom.contains(name) {
            let input = convert::custom_input(arguments);
            if !input.is_empty() {
                self.push(
                    "response.custom_tool_call_input.delta",
                    json!({"item_id": id, "output_index": index, "delta": input}),
                );
            }
            self.push(
                "response.custom_tool_call_input.done",
                json!({"item_id": id, "output_index": index, "input": input}),
            );
        } else {
            self.push(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments}),
            );
        }
        let item = convert::call_item(id, call_id, name, arguments, status, &self.pending.tools);
        self.push("response.output_item.done", json!({"output_index": index, "item": item}));
        self.output.push(item);
    }

    /// A new call item: its id (`fc_` or, for a custom tool, `ctc_`), call id and output index, after the `added`
    /// event.
    fn open_call_item(&mut self, name: &str) -> (String, String, usize) {
        let prefix = if self.pending.tools.custom.contains(name) { "ctc_" } else { "fc_" };
        let (id, call_id, index) = (random_id(prefix), random_id("call_"), self.output.len());
        let added = convert::call_item(&id, &call_id, name, "", "in_progress", &self.pending.tools);
        self.push("response.output_item.added", json!({"output_index": index, "item": added}));
        (id, call_id, index)
    }

    async fn fill(&mut self) {
        let next = self.reply.next().await;
        if !matches!(next, Some(Ok(Output::Reasoning(_) | Output::Logprobs(_)))) {
            // The reasoning comes first: anything else ends it.
            self.close_reasoning();
        }
        match next {
            Some(Ok(Output::Reasoning(delta))) => {
                if self.reasoning.is_none() {
                    let id = random_id("rs_");
                    let index = self.output.len();
                    let item = convert::reasoning_item(&id, "", "in_progress");
                    self.push("response.output_item.added", json!({"output_index": index, "item": item}));
                    let part = json!({"type": "reasoning_text", "text": ""});
                    self.push(
                        "response.content_part.added",
                        json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                    );
                    self.reasoning = Some((id, index, String::new()));
                }
                let (id, index, text) = self.reasoning.as_mut().expect("INVARIANT: opened above");
                text.push_str(&delta);
                self.all_reasoning.push_str(&delta);
                let data = json!({"item_id": id, "output_index": *index, "content_index": 0, "delta": delta});
                self.push("response.reasoning_text.delta", data);
            }
            Some(Ok(Output::Text(delta))) => {
                if self.text.is_none() {
                    let id = random_id("msg_");
                    let index = self.output.len();
                    let item = convert::message_item(&id, "", "in_progress");
                    self.push("response.output_item.added", json!({"output_index": index, "item": item}));
                    let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
                    self.push(
                        "response.content_part.added",
                        json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                    );
                    self.text = Some((id, index, String::new()));
                }
                let (id, index, text) = self.text.as_mut().expect("INVARIANT: opened above");
                text.push_str(&delta);
                self.all_text.push_str(&delta);
                let data =
                    json!({"item_id": id, "output_index": *index, "content_index": 0, "delta": delta, "logprobs": []});
                self.push("response.output_text.delta", data);
            }
            Some(Ok(Output::ToolCall(call))) if self.open_call.is_some() => self.close_call(Some(call), "completed"),
            Some(Ok(Output::ToolCall(call))) => {
                self.close_text();
                let (id, call_id, index) = self.open_call_item(&call.name);
                let arguments = call.arguments.to_string();
                if !self.pending.tools.custom.contains(&call.name) {
                    self.push(
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": index, "delta": arguments}),
                    );
                }
                self.finish_call_item(&id, &call_id, index, &call.name, &arguments, "completed");
                self.calls.push(ToolCall { id: Some(call_id), ..call });
            }
            Some(Ok(Output::Logprobs(_))) => {}
            Some(Ok(Output::ToolCallBegin { name })) => {
                self.close_text();
                let (id, call_id, index) = self.open_call_item(&name);
                self.open_call = Some((id, call_id, index, name, String::new()));
            }
            Some(Ok(Output::ToolCallArgs(delta))) => {
                if let Some((id, _, index, name, arguments)) = self.open_call.as_mut() {
                    arguments.push_str(&delta);
                    // A custom tool's input is a string inside these arguments: it goes out once the call is done.
                    if !self.pending.tools.custom.contains(name.as_str()) {
                        let data = json!({"item_id": id, "output_index": *index, "delta": delta});
                        self.push("response.function_call_arguments.delta", data);
                    }
                }
            }
            Some(Ok(Output::Done { reason, usage, num_reasoning_tokens, .. })) => {
                self.close_text();
                self.close_call(None, "incomplete");
                let response = &mut self.pending.response;
                response.output = std::mem::take(&mut self.output);
                response.usage = Some(super::usage(&usage, num_reasoning_tokens));
                let kind = if reason == StopReason::Length {
                    response.status = "incomplete";
                    response.incomplete_details = Some(json!({"reason": "max_output_tokens"}));
                    "response.incomplete"
                } else {
                    response.status = "completed";
                    "response.completed"
                };
                let value = serde_json::to_value(&*response).expect("INVARIANT: wire types serialize");
                if response.store {
                    let text = std::mem::take(&mut self.all_text);
                    let calls = std::mem::take(&mut self.calls);
                    let mut message = if calls.is_empty() {
                        Message::assistant(text)
                    } else {
                        Message::assistant_tool_calls((!text.is_empty()).then_some(text), calls)
                    };
                    let reasoning = std::mem::take(&mut self.all_reasoning);
                    message.reasoning_content = (!reasoning.is_empty()).then_some(reasoning);
                    let mut conversation = std::mem::take(&mut self.pending.conversation);
                    conversation.push(message);
                    self.pending.state.responses.put(response.id.clone(), value.clone(), conversation);
                }
                self.push(kind, json!({"response": value}));
                self.ended = true;
            }
            Some(Err(e)) => {
                self.close_text();
                let response = &mut self.pending.response;
                response.status = "failed";
                response.output = std::mem::take(&mut self.output);
                response.error = Some(json!({"code": e.code.unwrap_or("server_error"), "message": e.message}));
                let value = serde_json::to_value(&*response).expect("INVARIANT: wire types serialize");
                self.push("response.failed", json!({"response": value}));
                self.ended = true;
            }
            None => self.ended = true,
        }
    }
}
