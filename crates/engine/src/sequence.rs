//! One request inside the engine: its tokens, how far the runner has computed them, and how its output is sampled,
//! detokenised and stopped.

use std::sync::Arc;
use std::time::Instant;

use tokenizer::{Detokenizer, Tokenizer};

use crate::sampler::Sampler;
use crate::spec::Hidden;
use crate::{Event, FinishReason, RequestId, StopStrings, TokenConstraint, TokenLogprobs, Usage};

pub(crate) struct Sequence {
    pub(crate) id: RequestId,
    /// Prompt followed by generated tokens.
    pub(crate) tokens: Vec<u32>,
    pub(crate) num_prompt_tokens: usize,
    /// Tokens whose KV the runner holds.
    pub(crate) num_computed_tokens: usize,
    /// Tokens computed as a prompt (chunk by chunk, no drafts) before the sequence decodes: its prompt, or after a
    /// preemption every token it had.
    pub(crate) prefill_len: usize,
    /// The scheduler's step count when the sequence was (last) admitted, and whether it ever was.
    pub(crate) admitted_step: u64,
    pub(crate) was_admitted: bool,
    /// Prompt tokens whose KV came from the prefix cache.
    pub(crate) num_cached_tokens: usize,
    pub(crate) max_tokens: usize,
    pub(crate) sampler: Sampler,
    pub(crate) constraint: Option<Box<dyn TokenConstraint>>,
    pub(crate) detok: Detokenizer<Arc<Tokenizer>>,
    pub(crate) stops: StopStrings,
    pub(crate) stop_tokens: Vec<u32>,
    pub(crate) ignore_eos: bool,
    /// Text released so far.
    pub(crate) text: String,
    /// The target's hidden rows of this sequence's tokens that its last pass computed and kept, for the layers the
    /// proposers read (`[layers][rows][hidden]`), and the position of the first.
    pub(crate) hidden: Vec<f32>,
    pub(crate) hidden_pos: usize,
    pub(crate) t_admitted: Instant,
    pub(crate) t_first_token: Option<Instant>,
}

impl Sequence {
    pub(crate) fn num_output_tokens(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }

    pub(crate) fn is_prefill(&self) -> bool {
        self.num_computed_tokens < self.prefill_len
    }

    /// [`Self::hidden`] as proposers see it, `width` floats per row.
    pub(crate) fn hidden_rows<'a>(&'a self, layers: &'a [usize], width: usize) -> Hidden<'a> {
        hidden_view(&self.hidden, self.hidden_pos, layers, width)
    }

    pub(crate) fn usage(&self) -> Usage {
        let now = Instant::now();
        let first = self.t_first_token.unwrap_or(now);
        Usage {
            prompt_tokens: self.num_prompt_tokens,
            cached_tokens: self.num_cached_tokens,
            completion_tokens: self.num_output_tokens(),
            prefill_ms: (first - self.t_admitted).as_secs_f64() * 1000.0,
            decode_ms: (now - first).as_secs_f64() * 1000.0,
        }
    }

    /// Picks the next token from `logits` (one row) with this request's sampler and constraint. `Err` when the
    /// constraint allows nothing or fails.
    pub(crate) fn sample(&mut self, logits: &[f32]) -> Result<u32, String> {
        let mut l = logits.to_vec();
        if let Some(c) = self.constraint.as_mut().filter(|c| !c.is_dormant()) {
            let mut allowed = vec![u32::MAX; l.len().div_ceil(32)];
            c.allowed_tokens(&mut allowed)?;
            if allowed.iter().all(|&w| w == 0) {
                return Err("the output constraint allows no token".into());
            }
            for (t, x) in l.iter_mut().enumerate() {
                if allowed[t / 32] >> (t % 32) & 1 == 0 {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        let token = self.sampler.sample(&mut l, &self.tokens);
        if let Some(c) = self.constraint.as_mut() {
            c.commit(token)?;
        }
        Ok(token)
    }

    /// How many of a row's largest logits decide this sequence's next pick ([`Sampler::candidates_wanted`]; `ahead`:
    /// drafts that may be accepted first), or None when it needs the whole row (log-probabilities, an awake
    /// constraint, no top-k limit).
    pub(crate) fn candidates_wanted(&self, ahead: &[u32]) -> Option<usize> {
        if self.sampler.params.logprobs.is_some() || self.constraint.as_ref().is_some_and(|c| !c.is_dormant()) {
            return None;
        }
        self.sampler.candidates_wanted(&self.tokens, ahead)
    }

    /// [`Self::sample`] from the row's largest logits (asked for with [`Self::candidates_wanted`]).
    pub(crate) fn sample_from_candidates(&mut self, cand: &[(u32, f32)]) -> Result<u32, String> {
        let token = self.sampler.sample_from_candidates(cand, &self.tokens);
        if let Some(c) = self.constraint.as_mut() {
            c.commit(token)?;
        }
        Ok(token)
    }

    /// Appends a generated token; returns its event and, when it ends the request, the `Finished` event.
    pub(crate) fn push_token(
        &mut self,
        token: u32,
        logits: &[f32],
        tokenizer: &Tokenizer,
        max_context: usize,
    ) -> (Event, Option<Event>) {
        let logprobs = self.sampler.params.logprobs.map(|n| token_logprobs(logits, token, n));
        self.t_first_token.get_or_insert_with(Instant::now);
        self.tokens.push(token);
        let is_eog = !self.ignore_eos && tokenizer.is_eog(token);
        let is_stop_token = self.stop_tokens.contains(&token);
        let piece = if is_eog || is_stop_token { String::new() } else { self.detok.push(token) };
        let (text, hit_stop) = self.stops.push(&piece);
        self.text.push_str(&text);
        let event = Event::Token { id: token, text, logprobs };
        let constraint_done = self.constraint.as_ref().is_some_and(|c| c.is_finished());
        let reason = if is_eog || is_stop_token || hit_stop || constraint_done {
            FinishReason::Stop
        } else if self.num_output_tokens() >= self.max_tokens || self.tokens.len() >= max_context {
            FinishReason::Length
        } else {
            return (event, None);
        };
        (event, Some(self.finish(reason, hit_stop)))
    }

    /// The `Finished` event: releases held text (none after a stop string, which ends the text).
    pub(crate) fn finish(&mut self, reason: FinishReason, hit_stop: bool) -> Event {
        let mut tail = if hit_stop { String::new() } else { self.detok.finish() };
        if !hit_stop {
            let (t, _) = self.stops.push(&tail);
            tail = t + &self.stops.flush();
        }
        self.text.push_str(&tail);
        let matched_stop = self.stops.matched().map(str::to_string);
        Event::Finished { reason, text: tail, usage: self.usage(), matched_stop }
    }
}

/// Hidden rows of `layers` (`[layers][rows][width]`, the first at position `first_pos`) as proposers see them.
pub(crate) fn hidden_view<'a>(rows: &'a [f32], first_pos: usize, layers: &'a [usize], width: usize) -> Hidden<'a> {
    let num_rows = if layers.is_empty() || width == 0 { 0 } else { rows.len() / (layers.len() * width) };
    Hidden { layers, rows, num_rows, width, first_pos }
}

/// Log-probability of `token` and the `n` most likely tokens under the raw logits.
pub(crate) fn token_logprobs(logits: &[f32], token: u32, n: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max as f64 + logits.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln();
    let lp = |t: u32| (logits[t as usize] as f64 - lse) as f32;
    let mut top: Vec<u32> = (0..logits.len() as u32).collect();
    let order = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    let n = n.min(top.len());
    if n > 0 && n < top.len() {
        top.select_nth_unstable_by(n - 1, order);
    }
    top.truncate(n);
    top.sort_unstable_by(order);
    TokenLogprobs { logprob: lp(token), top: top.into_iter().map(|t| (t, lp(t))).collect() }
}
