//! A reply as a Chat Completions event stream: a first chunk with the role as soon as the request is queued (one per
//! choice when `n` > 1), a thinking model's reasoning (`delta.reasoning_content`), text and tool-call chunks as the
//! output parser releases them (with their tokens'
//! `logprobs` when asked for), a chunk with `finish_reason` (and llama-server `timings`) per choice, a usage chunk
//! when `stream_options.include_usage` is set, then `data: [DONE]`. Choices are interleaved as they produce output.
//! A failure after the stream has begun is sent as one `{"error": {...}}` event, which the OpenAI SDKs raise.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};

use super::{convert, error, wire};
use crate::error::ApiError;
use crate::generate::{Output, Reply, TokenLogprob};

/// What every chunk of one reply shares.
#[derive(Debug, Clone)]
pub struct ChunkMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    /// The request asked for log-probabilities.
    pub logprobs: bool,
}

impl ChunkMeta {
    fn chunk(&self, index: u32, delta: wire::Delta, finish_reason: Option<&'static str>) -> wire::Chunk {
        wire::Chunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: super::SYSTEM_FINGERPRINT,
            choices: vec![wire::ChunkChoice { index, delta, logprobs: None, finish_reason }],
            usage: None,
            timings: None,
        }
    }
}

/// What one choice's stream yields.
enum Item {
    Chunk(Box<wire::Chunk>),
    /// The usage, and how many of the output tokens were reasoning.
    Finished(engine::Usage, usize),
    Failed(ApiError),
}

/// One choice.
struct Choice {
    reply: Reply,
    meta: ChunkMeta,
    index: u32,
    queue: VecDeque<Item>,
    num_calls: usize,
    /// Log-probabilities of tokens whose text has not been sent yet.
    logprobs: Vec<TokenLogprob>,
    /// A call whose arguments are being streamed.
    open_call: bool,
    ended: bool,
}

fn data(value: &impl serde::Serialize) -> Event {
    Event::default().data(serde_json::to_string(value).expect("INVARIANT: wire types serialize"))
}

/// The SSE response for the replies of one request (choice `i` is `replies[i]`).
pub fn sse(
    replies: Vec<Reply>,
    meta: ChunkMeta,
    keep_alive: Duration,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let num_choices = replies.len();
    let choices: Vec<Pin<Box<dyn Stream<Item = Item> + Send>>> = replies
        .into_iter()
        .enumerate()
        .map(|(i, reply)| {
            Box::pin(choice_stream(reply, meta.clone(), i as u32)) as Pin<Box<dyn Stream<Item = Item> + Send>>
        })
        .collect();
    let merged = futures::stream::select_all(choices);
    struct Merge<S> {
        merged: S,
        meta: ChunkMeta,
        usages: Vec<engine::Usage>,
        num_reasoning_tokens: usize,
        num_choices: usize,
        tail: VecDeque<Event>,
        done: bool,
    }
    let state = Merge {
        merged,
        meta,
        usages: Vec::new(),
        num_reasoning_tokens: 0,
        num_choices,
        tail: VecDeque::new(),
        done: false,
    };
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.tail.pop_front() {
                return Some((Ok(e), s));
            }
            if s.done {
                return None;
            }
            match s.merged.next().await {
                Some(Item::Chunk(c)) => return Some((Ok(data(&c)), s)),
                Some(Item::Finished(u, num_reasoning_tokens)) => {
                    s.usages.push(u);
                    s.num_reasoning_tokens += num_reasoning_tokens;
                    if s.usages.len() == s.num_choices {
                        if s.meta.include_usage {
                            let mut chunk = s.meta.chunk(0, wire::Delta::default(), None);
                            chunk.choices.clear();
                            let total = convert::combined_usage(&s.usages);
                            chunk.usage = Some(convert::usage(&total, s.num_reasoning_tokens));
                            s.tail.push_back(data(&chunk));
                        }
                        s.tail.push_back(Event::default().data("[DONE]"));
                        s.done = true;
                    }
                }
                Some(Item::Failed(e)) => {
                    // Dropping the other choices aborts them.
                    s.tail.push_back(data(&error::body(&e)));
                    s.done = true;
                }
                None => s.done = true,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(keep_alive))
}

fn choice_stream(reply: Reply, meta: ChunkMeta, index: u32) -> impl Stream<Item = Item> + Send {
    let first = meta.chunk(
        index,
        wire::Delta { role: Some("assistant"), content: Some(String::new()), ..Default::default() },
        None,
    );
    let choice = Choice {
        queue: VecDeque::from([Item::Chunk(Box::new(first))]),
        reply,
        meta,
        index,
        num_calls: 0,
        logprobs: Vec::new(),
        open_call: false,
        ended: false,
    };
    futures::stream::unfold(choice, |mut c| async move {
        loop {
            if let Some(item) = c.queue.pop_front() {
                return Some((item, c));
            }
            if c.ended {
                return None;
            }
            c.fill().await;
        }
    })
}

impl Choice {
    fn push(&mut self, delta: wire::Delta, finish_reason: Option<&'static str>) -> &mut wire::Chunk {
        let mut chunk = self.meta.chunk(self.index, delta, finish_reason);
        if self.meta.logprobs && (!self.logprobs.is_empty() || finish_reason.is_none()) {
            chunk.choices[0].logprobs = Some(convert::logprobs(&std::mem::take(&mut self.logprobs)));
        }
        self.queue.push_back(Item::Chunk(Box::new(chunk)));
        match self.queue.back_mut() {
            Some(Item::Chunk(c)) => c,
            _ => unreachable!("INVARIANT: a chunk was just pushed"),
        }
    }

    /// Turns the reply's next output into items.
    async fn fill(&mut self) {
        match self.reply.next().await {
            Some(Ok(Output::Reasoning(text))) => {
                self.push(wire::Delta { reasoning_content: Some(text), ..Default::default() }, None);
            }
            Some(Ok(Output::Text(text))) => {
                self.push(wire::Delta { content: Some(text), ..Default::default() }, None);
            }
            Some(Ok(Output::Logprobs(l))) => self.logprobs.extend(l),
            Some(Ok(Output::ToolCallBegin { name })) => {
                self.open_call = true;
                let call = wire::ToolCallDelta {
                    index: self.num_calls,
                    id: Some(crate::generate::random_id("call_")),
                    kind: Some("function"),
                    function: wire::FunctionDelta { name: Some(name), arguments: String::new() },
                };
                self.push(wire::Delta { tool_calls: vec![call], ..Default::default() }, None);
            }
            Some(Ok(Output::ToolCallArgs(arguments))) => {
                let call = wire::ToolCallDelta {
                    index: self.num_calls,
                    id: None,
                    kind: None,
                    function: wire::FunctionDelta { name: None, arguments },
                };
                self.push(wire::Delta { tool_calls: vec![call], ..Default::default() }, None);
            }
            Some(Ok(Output::ToolCall(_))) if self.open_call => {
                // Its arguments were streamed already.
                self.open_call = false;
                self.num_calls += 1;
            }
            Some(Ok(Output::ToolCall(call))) => {
                let call = convert::tool_call(call, Some(self.num_calls));
                self.num_calls += 1;
                let call = wire::ToolCallDelta {
                    index: self.num_calls - 1,
                    id: Some(call.id),
                    kind: Some(call.kind),
                    function: wire::FunctionDelta {
                        name: Some(call.function.name),
                        arguments: call.function.arguments,
                    },
                };
                self.push(wire::Delta { tool_calls: vec![call], ..Default::default() }, None);
            }
            Some(Ok(Output::Done { reason, usage, num_reasoning_tokens, .. })) => {
                if !self.logprobs.is_empty() {
                    // Tokens whose text never became a text chunk (e.g. held by the tool-call parser).
                    self.push(wire::Delta::default(), None);
                }
                let chunk = self.push(wire::Delta::default(), Some(convert::finish_reason(reason)));
                chunk.timings = Some(convert::timings(&usage));
                self.queue.push_back(Item::Finished(usage, num_reasoning_tokens));
                self.ended = true;
            }
            Some(Err(e)) => {
                self.queue.push_back(Item::Failed(e));
                self.ended = true;
            }
            None => self.ended = true,
        }
    }
}
