//! The output pipeline of a running request: engine token events in, [`Output`]s out. For a thinking model the
//! reasoning is split off first (`chat::ReasoningParser`), then the content goes through the output parser (text /
//! tool calls); the arguments of forced and grammar-held calls stream as they are written (`calls`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use chat::{ParseEvent, ReasoningEvent, ReasoningParser, ToolCallParser};
use engine::service::RequestStream;
use engine::{Event, FinishReason, Usage};

use super::calls::{AutoCalls, ForcedCall};
use super::prepare::{Prepared, prepare};
use super::{ChatTurn, Collected, Output, StopReason, TokenLogprob};
use crate::AppState;
use crate::error::ApiError;

/// Prepares and submits a turn.
pub async fn start(state: &Arc<AppState>, turn: ChatTurn) -> Result<Reply, ApiError> {
    let s = state.clone();
    let prepared = tokio::task::spawn_blocking(move || prepare(&s, turn))
        .await
        .map_err(|e| ApiError::internal(format!("preparing the prompt failed: {e}")))??;
    let Prepared { request, prefill, tools, parallel_tool_calls, streams_call, call_starts, reasoning } = prepared;
    let stream = state.engine.submit(request)?;
    let mut reply = Reply::new(stream, &prefill, &tools, parallel_tool_calls);
    if streams_call {
        reply.forced_call = Some(ForcedCall::default());
    }
    reply.auto_calls = call_starts.map(|starts| {
        // Call starts count the reply's text from the prefill (a forced XML call's `<tool_call>`; empty otherwise).
        let mut calls = AutoCalls::new(starts, &tools);
        calls.push(&prefill, &mut reply.pending);
        calls
    });
    reply.reasoning = reasoning.map(ReasoningParser::new);
    reply.tokenizer = Some(state.tokenizer.clone());
    reply.loop_guard = state.config.max_repeated_chars.map(LoopGuard::new);
    Ok(reply)
}

/// The outputs of one running request. Dropping it aborts the request.
#[derive(Debug)]
pub struct Reply {
    stream: Option<RequestStream>,
    parser: Option<ToolCallParser>,
    parallel_tool_calls: bool,
    pending: VecDeque<Output>,
    finished: bool,
    num_prompt_tokens: usize,
    num_output_tokens: usize,
    num_calls: usize,
    /// Name and arguments of each call of this reply so far.
    calls_made: Vec<(String, serde_json::Value)>,
    t_start: Instant,
    t_first_token: Option<Instant>,
    /// Stops a reply that has started repeating itself.
    pub loop_guard: Option<LoopGuard>,
    /// Spells out the tokens of log-probabilities.
    pub tokenizer: Option<Arc<tokenizer::Tokenizer>>,
    /// Streams the arguments of a grammar-forced call.
    forced_call: Option<ForcedCall>,
    /// Streams the arguments of the calls the lazy grammar holds.
    auto_calls: Option<AutoCalls>,
    /// Splits a thinking model's reasoning from its content.
    reasoning: Option<ReasoningParser>,
    num_reasoning_tokens: usize,
    /// Tokens at the start whose text may still open the reasoning (blanks, part of `<think>`).
    num_undecided_tokens: usize,
}

impl Reply {
    /// `tools`: the declared tools (name, parameter schema) whose calls are read out of the output.
    pub fn new(
        stream: RequestStream,
        prefill: &str,
        tools: &[(String, serde_json::Value)],
        parallel_tool_calls: bool,
    ) -> Self {
        let mut parser = (!tools.is_empty())
            .then(|| ToolCallParser::new(tools.iter().map(|(name, _)| name.clone())).with_schemas(tools));
        if let Some(p) = &mut parser {
            // The forced start of a call is part of the reply as far as the parser is concerned; it yields no text.
            let _ = p.push(prefill);
        }
        Reply {
            num_prompt_tokens: stream.num_prompt_tokens(),
            stream: Some(stream),
            parser,
            parallel_tool_calls,
            pending: VecDeque::new(),
            finished: false,
            num_output_tokens: 0,
            num_calls: 0,
            calls_made: Vec::new(),
            t_start: Instant::now(),
            t_first_token: None,
            loop_guard: None,
            tokenizer: None,
            forced_call: None,
            auto_calls: None,
            reasoning: None,
            num_reasoning_tokens: 0,
            num_undecided_tokens: 0,
        }
    }

    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    /// The next output; `None` after `Done` or an error.
    pub async fn next(&mut self) -> Option<Result<Output, ApiError>> {
        loop {
            if let Some(o) = self.pending.pop_front() {
                return Some(Ok(o));
            }
            if self.finished {
                return None;
            }
            let Some(stream) = self.stream.as_mut() else {
                self.finished = true;
                return None;
            };
            match stream.next().await {
                Some(Ok(Event::Token { id, text, logprobs })) => {
                    self.num_output_tokens += 1;
                    // End-of-generation tokens are not part of the reply (OpenAI leaves them out too).
                    if let (Some(lp), Some(tok)) = (&logprobs, &self.tokenizer)
                        && !tok.is_eog(id)
                    {
                        self.pending.push_back(Output::Logprobs(vec![TokenLogprob::new(tok, id, lp)]));
                    }
                    self.t_first_token.get_or_insert_with(Instant::now);
                    let was_reasoning = self.reasoning.as_ref().is_some_and(ReasoningParser::in_reasoning);
                    self.feed(&text);
                    self.count_reasoning_token(was_reasoning);
                    if self.loop_guard.as_mut().is_some_and(|g| g.push(&text)) {
                        // The model is looping: stop it and report the output limit.
                        let usage = self.cut_short();
                        self.finish_reasoning();
                        if let Some(p) = &mut self.parser {
                            let events = p.finish();
                            self.take(events);
                        }
                        let reason = if self.num_calls > 0 { StopReason::ToolCalls } else { StopReason::Length };
                        self.finish(reason, usage, None);
                    } else if self.parser.as_ref().is_some_and(ToolCallParser::is_done) {
                        // The calls are complete and the model has moved on: stop it here.
                        let usage = self.cut_short();
                        self.finish(StopReason::ToolCalls, usage, None);
                    }
                }
                Some(Ok(Event::Finished { reason, text, usage, matched_stop })) => {
                    self.stream = None;
                    self.feed(&text);
                    self.finish_reasoning();
                    if let Some(p) = &mut self.parser {
                        let events = p.finish();
                        self.take(events);
                    }
                    let reason = match reason {
                        _ if self.num_calls > 0 => StopReason::ToolCalls,
                        FinishReason::Length => StopReason::Length,
                        FinishReason::Stop | FinishReason::Aborted => StopReason::EndTurn,
                    };
                    let matched_stop = matched_stop.filter(|_| reason == StopReason::EndTurn);
                    self.finish(reason, usage, matched_stop);
                }
                Some(Err(e)) => {
                    self.finished = true;
                    self.stream = None;
                    return Some(Err(e.into()));
                }
                None => {
                    self.finished = true;
                    self.stream = None;
                    return Some(Err(ApiError::internal("The engine ended the request without finishing it.")));
                }
            }
        }
    }

    /// Reads the whole reply: text, calls, and how it ended.
    pub async fn collect(mut self) -> Result<Collected, ApiError> {
        let mut out = Collected {
            reasoning: String::new(),
            num_reasoning_tokens: 0,
            text: String::new(),
            tool_calls: Vec::new(),
            reason: StopReason::EndTurn,
            usage: Usage::default(),
            matched_stop: None,
            logprobs: Vec::new(),
        };
        while let Some(item) = self.next().await {
            match item? {
                Output::Reasoning(t) => out.reasoning.push_str(&t),
                Output::Text(t) => out.text.push_str(&t),
                Output::ToolCall(c) => out.tool_calls.push(c),
                Output::Logprobs(l) => out.logprobs.extend(l),
                Output::ToolCallBegin { .. } | Output::ToolCallArgs(_) => {}
                Output::Done { reason, usage, matched_stop, num_reasoning_tokens } => {
                    out.num_reasoning_tokens = num_reasoning_tokens;
                    out.reason = reason;
                    out.usage = usage;
                    out.matched_stop = matched_stop;
                }
            }
        }
        Ok(out)
    }

    fn feed(&mut self, text: &str) {
        let content = match &mut self.reasoning {
            Some(r) => {
                let events = r.push(text);
                self.split_reasoning(events)
            }
            None => text.to_string(),
        };
        if let Some(f) = &mut self.forced_call {
            f.push(text, &mut self.pending);
        }
        // The lazy grammar's call starts are offsets in the whole output, reasoning included.
        if let Some(a) = &mut self.auto_calls {
            a.push(text, &mut self.pending);
        }
        self.feed_content(&content);
    }

    /// Queues the reasoning of `events`; returns their content.
    fn split_reasoning(&mut self, events: Vec<ReasoningEvent>) -> String {
        let mut content = String::new();
        for e in events {
            match e {
                ReasoningEvent::Reasoning(t) => self.pending.push_back(Output::Reasoning(t)),
                ReasoningEvent::Content(t) => content.push_str(&t),
            }
        }
        content
    }

    /// The output has ended: releases what the reasoning splitter holds.
    fn finish_reasoning(&mut self) {
        if let Some(r) = &mut self.reasoning {
            let events = r.finish();
            let content = self.split_reasoning(events);
            self.feed_content(&content);
        }
    }

    /// Counts a generated token as reasoning when it was written inside the reasoning (or ended it). Tokens of an
    /// undecided start count once the start is decided.
    fn count_reasoning_token(&mut self, was_reasoning: bool) {
        let Some(r) = &self.reasoning else { return };
        if r.is_undecided() {
            self.num_undecided_tokens += 1;
        } else if was_reasoning || r.in_reasoning() {
            self.num_reasoning_tokens += 1 + std::mem::take(&mut self.num_undecided_tokens);
        } else {
            self.num_undecided_tokens = 0;
        }
    }

    fn feed_content(&mut self, text: &str) {
        match &mut self.parser {
            Some(p) => {
                let events = p.push(text);
                self.take(events);
            }
            None if !text.is_empty() => self.pending.push_back(Output::Text(text.to_string())),
            None => {}
        }
    }

    fn take(&mut self, events: Vec<ParseEvent>) {
        let mut repeated = false;
        for e in events {
            match e {
                ParseEvent::Text(t) => self.pending.push_back(Output::Text(t)),
                ParseEvent::ToolCall(_) if (!self.parallel_tool_calls && self.num_calls > 0) || repeated => {}
                ParseEvent::ToolCall(c) => {
                    if let Some(f) = &mut self.forced_call {
                        f.finish(&mut self.pending);
                    }
                    // A call the reply already made, word for word: the model is looping (the small models repeat
                    // a call dozens of times in one reply). It still goes out (its start may have been streamed),
                    // and generation stops after it.
                    repeated = self.calls_made.iter().any(|(name, args)| *name == c.name && *args == c.arguments);
                    self.calls_made.push((c.name.clone(), c.arguments.clone()));
                    self.num_calls += 1;
                    self.pending.push_back(Output::ToolCall(c));
                }
            }
        }
        if (repeated || (!self.parallel_tool_calls && self.num_calls > 0)) && self.stream.is_some() {
            // One call is all the client wants, or the calls repeat: stop generating.
            let usage = self.cut_short();
            self.finish(StopReason::ToolCalls, usage, None);
        }
    }

    fn finish(&mut self, reason: StopReason, usage: Usage, matched_stop: Option<String>) {
        if !self.finished {
            let num_reasoning_tokens = self.num_reasoning_tokens;
            self.pending.push_back(Output::Done { reason, usage, matched_stop, num_reasoning_tokens });
            self.finished = true;
        }
    }

    /// Stops the engine's stream (which aborts the request) and returns the usage measured here, for a reply cut
    /// short before the engine's `Finished`.
    fn cut_short(&mut self) -> Usage {
        let cached_tokens = self.stream.take().map_or(0, |s| s.num_cached_tokens());
        let now = Instant::now();
        let first = self.t_first_token.unwrap_or(now);
        Usage {
            prompt_tokens: self.num_prompt_tokens,
            cached_tokens,
            completion_tokens: self.num_output_tokens,
            prefill_ms: (first - self.t_start).as_secs_f64() * 1000.0,
            decode_ms: (now - first).as_secs_f64() * 1000.0,
        }
    }
}

/// Detects output that repeats itself exactly: the tail of the text is periodic (period up to
/// [`LoopGuard::MAX_PERIOD`] bytes) over at least `max_repeated_chars` bytes.
#[derive(Debug, Clone)]
pub struct LoopGuard {
    max_repeated_chars: usize,
    /// The last `max_repeated_chars + MAX_PERIOD` bytes of the output.
    tail: Vec<u8>,
}

impl LoopGuard {
    pub const MAX_PERIOD: usize = 512;

    pub fn new(max_repeated_chars: usize) -> Self {
        LoopGuard { max_repeated_chars: max_repeated_chars.max(1), tail: Vec::new() }
    }

    /// Adds output; true when the output now ends in a loop.
    pub fn push(&mut self, text: &str) -> bool {
        if text.is_empty() {
            return false;
        }
        self.tail.extend_from_slice(text.as_bytes());
        let keep = self.max_repeated_chars + Self::MAX_PERIOD;
        if self.tail.len() > 2 * keep {
            self.tail.drain(..self.tail.len() - keep);
        }
        let b = &self.tail;
        let n = b.len();
        (1..=Self::MAX_PERIOD.min(n / 2)).any(|p| {
            // Length of the periodic run ending at the end of the text.
            let run = (p..n).rev().take_while(|&i| b[i] == b[i - p]).count() + p;
            run >= self.max_repeated_chars && run >= 4 * p
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_guard_trips_on_exact_repetition_only() {
        let mut g = LoopGuard::new(200);
        let prose = "The quick brown fox jumps over the lazy dog while the cat sleeps. ";
        let varied: String = (0..40).map(|i| format!("{prose}{i}\n")).collect();
        assert!(!g.push(&varied), "text with a counter is not a loop");
        let line = "A thousand times,\n";
        let mut tripped_after = None;
        for i in 0..100 {
            if g.push(line) {
                tripped_after = Some(i);
                break;
            }
        }
        let n = tripped_after.expect("a repeated line trips the guard");
        assert!((n + 1) * line.len() >= 200 && n * line.len() < 200 + line.len(), "{n}");
        let mut g = LoopGuard::new(64);
        assert!(g.push(&"ab".repeat(40)));
        let mut g = LoopGuard::new(64);
        assert!(!g.push(&"ab".repeat(20)));
    }
}
