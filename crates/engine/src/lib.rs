//! The engine: admits generation requests and advances all of them one step at a time over a model runner.
//!
//! Each step schedules, for every live sequence, the tokens it has not computed yet (the whole prompt chunk by
//! chunk, then one token per step), runs them as one batch, samples where logits came back, and turns new tokens into
//! text and events. Prefill and decode fall out of that one rule. Decoding sequences are scheduled first, and while
//! any sequence decodes, prompts get at most `max_prefill_tokens_while_decoding` tokens per step, so a long prompt
//! never stalls streams already running; among prompts the one with the fewest tokens left goes first, so a short
//! request arriving during a long prefill starts streaming at once.

mod request;
pub mod sampler;
pub mod service;
mod stop;

use std::sync::Arc;
use std::time::Instant;

use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};
use tokenizer::{Detokenizer, Tokenizer};

pub use request::{Event, FinishReason, GenerateRequest, RequestId, Usage};
pub use sampler::{Sampler, SamplingParams};
pub use stop::StopStrings;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error(transparent)]
    Model(#[from] models::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Most tokens in one forward batch (caps prefill chunks). 0 is taken as 1 (nothing could ever run).
    pub max_batch_tokens: usize,
    /// Most prompt tokens in a step that also decodes: bounds the time between two tokens of a running stream.
    pub max_prefill_tokens_while_decoding: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { max_batch_tokens: 512, max_prefill_tokens_while_decoding: 128 }
    }
}

struct Sequence {
    id: RequestId,
    /// Prompt followed by generated tokens.
    tokens: Vec<u32>,
    num_prompt_tokens: usize,
    /// Tokens whose KV the runner holds.
    num_computed_tokens: usize,
    max_tokens: usize,
    sampler: Sampler,
    detok: Detokenizer<Arc<Tokenizer>>,
    stops: StopStrings,
    stop_tokens: Vec<u32>,
    ignore_eos: bool,
    /// Text released so far.
    text: String,
    t_admitted: Instant,
    t_first_token: Option<Instant>,
}

impl Sequence {
    fn num_output_tokens(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }

    fn usage(&self) -> Usage {
        let now = Instant::now();
        let first = self.t_first_token.unwrap_or(now);
        Usage {
            prompt_tokens: self.num_prompt_tokens,
            completion_tokens: self.num_output_tokens(),
            prefill_ms: (first - self.t_admitted).as_secs_f64() * 1000.0,
            decode_ms: (now - first).as_secs_f64() * 1000.0,
        }
    }
}

pub struct Engine<R: Runner> {
    runner: R,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    seqs: Vec<Sequence>,
    next_id: u64,
}

impl<R: Runner> Engine<R> {
    pub fn new(runner: R, tokenizer: Arc<Tokenizer>, mut config: EngineConfig) -> Self {
        config.max_batch_tokens = config.max_batch_tokens.max(1);
        Engine { runner, tokenizer, config, seqs: Vec::new(), next_id: 0 }
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    pub fn runner_mut(&mut self) -> &mut R {
        &mut self.runner
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Validates and admits a request.
    pub fn add_request(&mut self, req: GenerateRequest) -> Result<RequestId> {
        let cfg = self.runner.config();
        if req.prompt.is_empty() {
            return Err(Error::InvalidRequest("the prompt is empty".into()));
        }
        if req.max_tokens == 0 {
            // Otherwise the first step would still sample (and report) one token.
            return Err(Error::InvalidRequest("max_tokens must be at least 1".into()));
        }
        if let Some(t) = req.prompt.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(Error::InvalidRequest(format!("token id {t} is outside the vocabulary of {}", cfg.vocab_size)));
        }
        if req.prompt.len() >= cfg.max_context {
            return Err(Error::InvalidRequest(format!(
                "the prompt has {} tokens; the context holds {} (prompt and output together)",
                req.prompt.len(),
                cfg.max_context
            )));
        }
        req.sampling.validate().map_err(Error::InvalidRequest)?;
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.seqs.push(Sequence {
            id,
            num_prompt_tokens: req.prompt.len(),
            tokens: req.prompt,
            num_computed_tokens: 0,
            max_tokens: req.max_tokens,
            sampler: Sampler::new(req.sampling),
            detok: Detokenizer::new(self.tokenizer.clone()),
            stops: StopStrings::new(req.stop_strings),
            stop_tokens: req.stop_tokens,
            ignore_eos: req.ignore_eos,
            text: String::new(),
            t_admitted: Instant::now(),
            t_first_token: None,
        });
        Ok(id)
    }

    /// Cancels a request and frees its sequence at once; returns its `Finished` event (None for an unknown or
    /// finished request). No further events come for it.
    pub fn abort(&mut self, id: RequestId) -> Option<Event> {
        let i = self.seqs.iter().position(|s| s.id == id)?;
        let mut s = self.seqs.remove(i);
        self.runner.release(SeqId(s.id.0));
        let text = s.stops.flush();
        Some(Event::Finished { reason: FinishReason::Aborted, text, usage: s.usage() })
    }

    pub fn has_work(&self) -> bool {
        !self.seqs.is_empty()
    }

    pub fn num_requests(&self) -> usize {
        self.seqs.len()
    }

    /// Runs one batch and returns the events it produced, in order.
    pub fn step(&mut self) -> Result<Vec<(RequestId, Event)>> {
        // Schedule: decoding sequences first (one token each), then prompt chunks, fewest tokens left first (ties in
        // arrival order). While anything decodes, prompts share a smaller budget so streams keep flowing.
        let mut budget = self.config.max_batch_tokens;
        let remaining = |s: &Sequence| s.tokens.len() - s.num_computed_tokens;
        let is_prefill = |s: &Sequence| s.num_computed_tokens < s.num_prompt_tokens;
        let mut order: Vec<usize> = (0..self.seqs.len()).collect();
        order.sort_by_key(|&i| {
            let s = &self.seqs[i];
            if is_prefill(s) { (1, remaining(s)) } else { (0, 0) }
        });
        let mut scheduled: Vec<(usize, usize)> = Vec::new(); // (sequence index, number of tokens)
        let mut prefill_budget = None;
        for i in order {
            let s = &self.seqs[i];
            if is_prefill(s) && prefill_budget.is_none() {
                let cap =
                    if scheduled.is_empty() { budget } else { self.config.max_prefill_tokens_while_decoding.max(1) };
                prefill_budget = Some(cap.min(budget));
            }
            let limit = prefill_budget.unwrap_or(budget);
            let n = remaining(s).min(limit);
            if n == 0 {
                continue;
            }
            budget -= n;
            if let Some(p) = prefill_budget.as_mut() {
                *p -= n;
            }
            scheduled.push((i, n));
        }
        if scheduled.is_empty() {
            return Ok(Vec::new());
        }
        let batch = Batch {
            chunks: scheduled
                .iter()
                .map(|&(i, n)| {
                    let s = &self.seqs[i];
                    let done = s.num_computed_tokens + n == s.tokens.len();
                    SeqChunk {
                        seq: SeqId(s.id.0),
                        tokens: &s.tokens[s.num_computed_tokens..s.num_computed_tokens + n],
                        start_pos: s.num_computed_tokens,
                        logits: if done { LogitsWanted::Last } else { LogitsWanted::None },
                    }
                })
                .collect(),
        };
        let num_rows = batch.num_logit_rows();
        let logits = self.runner.forward(&batch)?.to_vec();
        drop(batch);
        let vocab = self.runner.config().vocab_size;
        debug_assert_eq!(logits.len(), num_rows * vocab);

        let mut events = Vec::new();
        let mut finished = Vec::new();
        let mut row = 0;
        for &(i, n) in &scheduled {
            let s = &mut self.seqs[i];
            s.num_computed_tokens += n;
            if s.num_computed_tokens < s.tokens.len() {
                continue;
            }
            let mut l = logits[row * vocab..(row + 1) * vocab].to_vec();
            row += 1;
            let token = s.sampler.sample(&mut l, &s.tokens);
            s.t_first_token.get_or_insert_with(Instant::now);
            s.tokens.push(token);
            let is_eog = !s.ignore_eos && self.tokenizer.is_eog(token);
            let is_stop_token = s.stop_tokens.contains(&token);
            let piece = if is_eog || is_stop_token { String::new() } else { s.detok.push(token) };
            let (text, hit_stop) = s.stops.push(&piece);
            s.text.push_str(&text);
            events.push((s.id, Event::Token { id: token, text }));
            let max_context = self.runner.config().max_context;
            let reason = if is_eog || is_stop_token || hit_stop {
                Some(FinishReason::Stop)
            } else if s.num_output_tokens() >= s.max_tokens || s.tokens.len() >= max_context {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                let mut tail = if hit_stop { String::new() } else { s.detok.finish() };
                if !hit_stop {
                    let (t, _) = s.stops.push(&tail);
                    tail = t + &s.stops.flush();
                }
                s.text.push_str(&tail);
                events.push((s.id, Event::Finished { reason, text: tail, usage: s.usage() }));
                finished.push(i);
            }
        }
        finished.sort_unstable();
        for i in finished.into_iter().rev() {
            let s = self.seqs.remove(i);
            self.runner.release(SeqId(s.id.0));
        }
        Ok(events)
    }

    /// Runs one request to completion (CLI use), calling `on_text` with each piece of released text.
    pub fn generate(
        &mut self,
        req: GenerateRequest,
        mut on_text: impl FnMut(&str),
    ) -> Result<(Vec<u32>, FinishReason, Usage)> {
        let id = self.add_request(req)?;
        let mut out = Vec::new();
        loop {
            if !self.seqs.iter().any(|s| s.id == id) {
                return Err(Error::InvalidRequest(format!("request {id} is no longer running")));
            }
            for (rid, ev) in self.step()? {
                if rid != id {
                    continue;
                }
                match ev {
                    Event::Token { id, text } => {
                        out.push(id);
                        on_text(&text);
                    }
                    Event::Finished { reason, text, usage } => {
                        on_text(&text);
                        return Ok((out, reason, usage));
                    }
                }
            }
        }
    }
}
