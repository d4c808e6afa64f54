//! A reply as an Anthropic Messages event stream: `message_start` and a `ping` as soon as the request is queued,
//! then content blocks (`content_block_start` / `content_block_delta` with `thinking_delta` (a thinking model's
//! reasoning, first, closed by a `signature_delta`), `text_delta` or `input_json_delta` / `content_block_stop`),
//! `message_delta` with the stop reason and output tokens, `message_stop`. A failure after the stream has begun is one
//! `error` event. While nothing else is sent (a long prompt being read), `ping` events keep
//! the connection alive.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde_json::{Value, json};

use super::{convert, error, wire};
use crate::generate::{Output, Reply, random_id};

struct State {
    reply: Reply,
    queue: VecDeque<Event>,
    /// Index of the next content block.
    num_blocks: usize,
    /// A text block is open (its index is `num_blocks - 1`).
    text_open: bool,
    /// A thinking block is open (its index is `num_blocks - 1`).
    thinking_open: bool,
    /// A tool_use block whose input is being streamed.
    open_call: bool,
    ended: bool,
}

fn event(name: &str, data: &Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// The SSE response for `reply`; `start` is the `message` of `message_start`.
pub fn sse(
    reply: Reply,
    start: wire::MessageResponse,
    keep_alive: Duration,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let start = json!({"type": "message_start", "message": start});
    let queue = VecDeque::from([event("message_start", &start), event("ping", &json!({"type": "ping"}))]);
    let state =
        State { reply, queue, num_blocks: 0, text_open: false, thinking_open: false, open_call: false, ended: false };
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
    let ping = Event::default().event("ping").data(json!({"type": "ping"}).to_string());
    Sse::new(stream).keep_alive(KeepAlive::new().interval(keep_alive).event(ping))
}

impl State {
    fn close_thinking(&mut self) {
        if self.thinking_open {
            let index = self.num_blocks - 1;
            let delta = json!({"type": "content_block_delta", "index": index,
                               "delta": {"type": "signature_delta", "signature": convert::THINKING_SIGNATURE}});
            self.queue.push_back(event("content_block_delta", &delta));
            self.queue.push_back(event("content_block_stop", &json!({"type": "content_block_stop", "index": index})));
            self.thinking_open = false;
        }
    }

    fn close_text(&mut self) {
        if self.text_open {
            let index = self.num_blocks - 1;
            self.queue.push_back(event("content_block_stop", &json!({"type": "content_block_stop", "index": index})));
            self.text_open = false;
        }
    }

    fn close_call(&mut self) {
        if self.open_call {
            let index = self.num_blocks - 1;
            self.queue.push_back(event("content_block_stop", &json!({"type": "content_block_stop", "index": index})));
            self.open_call = false;
        }
    }

    async fn fill(&mut self) {
        let next = self.reply.next().await;
        if !matches!(next, Some(Ok(Output::Reasoning(_) | Output::Logprobs(_)))) {
            // The reasoning comes first: anything else ends it.
            self.close_thinking();
        }
        match next {
            Some(Ok(Output::Reasoning(thinking))) => {
                if !self.thinking_open {
                    let start = json!({"type": "content_block_start", "index": self.num_blocks,
                                       "content_block": {"type": "thinking", "thinking": "", "signature": ""}});
                    self.queue.push_back(event("content_block_start", &start));
                    self.num_blocks += 1;
                    self.thinking_open = true;
                }
                let delta = json!({"type": "content_block_delta", "index": self.num_blocks - 1,
                                   "delta": {"type": "thinking_delta", "thinking": thinking}});
                self.queue.push_back(event("content_block_delta", &delta));
            }
            Some(Ok(Output::Text(text))) => {
                if !self.text_open {
                    let start = json!({"type": "content_block_start", "index": self.num_blocks,
                                       "content_block": {"type": "text", "text": ""}});
                    self.queue.push_back(event("content_block_start", &start));
                    self.num_blocks += 1;
                    self.text_open = true;
                }
                let delta = json!({"type": "content_block_delta", "index": self.num_blocks - 1,
                                   "delta": {"type": "text_delta", "text": text}});
                self.queue.push_back(event("content_block_delta", &delta));
            }
            Some(Ok(Output::ToolCall(_))) if self.open_call => self.close_call(),
            Some(Ok(Output::ToolCall(call))) => {
                self.close_text();
                let index = self.num_blocks;
                self.num_blocks += 1;
                let arguments = call.arguments.to_string();
                let wire::ContentBlock::ToolUse { id, name, .. } = convert::tool_use(call) else {
                    unreachable!("INVARIANT: tool_use builds a tool_use block")
                };
                let start = json!({"type": "content_block_start", "index": index,
                                   "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}});
                let delta = json!({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "input_json_delta", "partial_json": arguments}});
                self.queue.push_back(event("content_block_start", &start));
                self.queue.push_back(event("content_block_delta", &delta));
                self.queue
                    .push_back(event("content_block_stop", &json!({"type": "content_block_stop", "index": index})));
            }
            Some(Ok(Output::Logprobs(_))) => {}
            Some(Ok(Output::ToolCallBegin { name })) => {
                self.close_text();
                let index = self.num_blocks;
                self.num_blocks += 1;
                let start = json!({"type": "content_block_start", "index": index,
                                   "content_block": {"type": "tool_use", "id": random_id("toolu_"), "name": name, "input": {}}});
                self.queue.push_back(event("content_block_start", &start));
                self.open_call = true;
            }
            Some(Ok(Output::ToolCallArgs(partial_json))) => {
                let delta = json!({"type": "content_block_delta", "index": self.num_blocks - 1,
                                   "delta": {"type": "input_json_delta", "partial_json": partial_json}});
                self.queue.push_back(event("content_block_delta", &delta));
            }
            Some(Ok(Output::Done { reason, usage, matched_stop, .. })) => {
                self.close_text();
                self.close_call();
                let u = convert::usage(&usage);
                let delta = json!({"type": "message_delta",
                                   "delta": {"stop_reason": convert::stop_reason(reason, matched_stop.as_deref()),
                                             "stop_sequence": matched_stop},
                                   "usage": {"output_tokens": u.output_tokens, "input_tokens": u.input_tokens,
                                             "cache_read_input_tokens": u.cache_read_input_tokens}});
                self.queue.push_back(event("message_delta", &delta));
                self.queue.push_back(event("message_stop", &json!({"type": "message_stop"})));
                self.ended = true;
            }
            Some(Err(e)) => {
                self.queue.push_back(event("error", &error::body(&e)));
                self.ended = true;
            }
            None => self.ended = true,
        }
    }
}
