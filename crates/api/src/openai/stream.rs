//! A reply as a Chat Completions event stream: a first chunk with the role as soon as the request is queued, text
//! and tool-call chunks as the output parser releases them, a chunk with `finish_reason` (and llama-server
//! `timings`), a usage chunk when `stream_options.include_usage` is set, then `data: [DONE]`. A failure after the
//! stream has begun is sent as one `{"error": {...}}` event, which the OpenAI SDKs raise.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;

use super::{convert, error, wire};
use crate::generate::{Output, Reply};

/// What every chunk of one reply shares.
#[derive(Debug, Clone)]
pub struct ChunkMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
}

impl ChunkMeta {
    fn chunk(&self, delta: wire::Delta, finish_reason: Option<&'static str>) -> wire::Chunk {
        wire::Chunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: super::SYSTEM_FINGERPRINT,
            choices: vec![wire::ChunkChoice { index: 0, delta, logprobs: None, finish_reason }],
            usage: None,
            timings: None,
        }
    }
}

struct State {
    reply: Reply,
    meta: ChunkMeta,
    queue: VecDeque<Event>,
    num_calls: usize,
    ended: bool,
}

fn data(value: &impl serde::Serialize) -> Event {
    Event::default().data(serde_json::to_string(value).expect("INVARIANT: wire types serialize"))
}

/// The SSE response for `reply`.
pub fn sse(reply: Reply, meta: ChunkMeta, keep_alive: Duration) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let first =
        meta.chunk(wire::Delta { role: Some("assistant"), content: Some(String::new()), ..Default::default() }, None);
    let state = State { queue: VecDeque::from([data(&first)]), reply, meta, num_calls: 0, ended: false };
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(event) = s.queue.pop_front() {
                return Some((Ok(event), s));
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
    /// Turns the reply's next output into events.
    async fn fill(&mut self) {
        match self.reply.next().await {
            Some(Ok(Output::Text(text))) => {
                let chunk = self.meta.chunk(wire::Delta { content: Some(text), ..Default::default() }, None);
                self.queue.push_back(data(&chunk));
            }
            Some(Ok(Output::ToolCall(call))) => {
                let call = convert::tool_call(call, Some(self.num_calls));
                self.num_calls += 1;
                let chunk = self.meta.chunk(wire::Delta { tool_calls: vec![call], ..Default::default() }, None);
                self.queue.push_back(data(&chunk));
            }
            Some(Ok(Output::Done { reason, usage })) => {
                let mut chunk = self.meta.chunk(wire::Delta::default(), Some(convert::finish_reason(reason)));
                chunk.timings = Some(convert::timings(&usage));
                self.queue.push_back(data(&chunk));
                if self.meta.include_usage {
                    let mut chunk = self.meta.chunk(wire::Delta::default(), None);
                    chunk.choices.clear();
                    chunk.usage = Some(convert::usage(&usage));
                    self.queue.push_back(data(&chunk));
                }
                self.queue.push_back(Event::default().data("[DONE]"));
                self.ended = true;
            }
            Some(Err(e)) => {
                self.queue.push_back(data(&error::body(&e)));
                self.ended = true;
            }
            None => self.ended = true,
        }
    }
}
