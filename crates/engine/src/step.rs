//! One step of the engine: schedule, run the batch, and turn what came back into tokens and events.

use models::{Batch, LogitsWanted, NextStep, Runner, SeqChunk, SeqId};

use crate::scheduler::{Scheduled, StepLimits};
use crate::spec;
use crate::speculate::Proposal;
use crate::{Engine, Event, FinishReason, RequestId, Result, runner_argmax, unix_now};

/// What a target pass returned for its logit rows.
pub(crate) enum RowsOut {
    /// Whole rows, `vocab` floats each.
    Logits(Vec<f32>),
    /// The runner's argmax per row.
    Picks(Vec<u32>),
    /// Each row's largest logits ([`Runner::forward_candidates`]).
    Candidates(Vec<Vec<(u32, f32)>>),
}

impl RowsOut {
    fn rows(&self, vocab: usize) -> usize {
        match self {
            RowsOut::Logits(l) => l.len() / vocab.max(1),
            RowsOut::Picks(p) => p.len(),
            RowsOut::Candidates(c) => c.len(),
        }
    }
}

/// What the target pass of a step returned, and where each chunk sat in it.
pub(crate) struct Executed {
    out: RowsOut,
    /// Each chunk's first row in the batch and first position in its sequence (for the hidden rows proposers read).
    starts: Vec<(usize, usize)>,
    /// Tokens in the batch.
    num_tokens: usize,
}

/// What verifying one sequence's rows produced.
pub(crate) struct Verified {
    /// Tokens emitted, and of them the drafts accepted.
    pub(crate) emitted: usize,
    pub(crate) accepted: usize,
    /// The target disagreed with a draft.
    pub(crate) rejected: bool,
    /// The request ended.
    pub(crate) finished: bool,
}

/// Where a step's time went, in seconds since the engine started ([`Engine::step_times`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    pub steps: u64,
    /// Admission, the token budget, proposals and the choice of depths.
    pub schedule_s: f64,
    /// Proposers' passes (drafting and their prompt catch-up).
    pub draft_s: f64,
    /// The target runner's pass (on a GPU: launching it and waiting for what it copies back).
    pub runner_s: f64,
    /// Sampling, verification, detokenisation and stop strings, rollbacks and releases.
    pub update_s: f64,
    /// Sequences preempted (their KV released, to be recomputed) for lack of KV memory.
    pub preemptions: u64,
}

impl<R: Runner> Engine<R> {
    /// Runs one step and returns the events it produced, in order: schedule (who runs, how many tokens, which
    /// drafts), execute (the proposers' passes, then one target pass over the batch), update (sample and verify,
    /// emit tokens and text, roll back rejected drafts, release finished sequences).
    pub fn step(&mut self) -> Result<Vec<(RequestId, Event)>> {
        let t0 = (self.clock)();
        let mut events = Vec::new();
        let mut scheduled = self.schedule(&mut events);
        if scheduled.is_empty() {
            return Ok(events);
        }
        let mut props: Vec<(usize, Proposal)> =
            scheduled.iter_mut().map(|x| (x.index, std::mem::take(&mut x.proposal))).collect();
        let base_rows: usize = scheduled.iter().map(|x| x.num_tokens).sum();
        let num_decoding = scheduled.iter().filter(|x| !self.seqs[x.index].is_prefill()).count();
        self.choose_depths(&mut props, base_rows, num_decoding);
        let t1 = (self.clock)();
        self.run_proposers(&mut props, base_rows, num_decoding)?;
        let prefills: Vec<(usize, usize)> =
            scheduled.iter().filter(|x| self.seqs[x.index].is_prefill()).map(|x| (x.index, x.num_tokens)).collect();
        self.prefill_proposers(&prefills)?;
        let t2 = (self.clock)();
        if prefills.is_empty() {
            self.explore(&mut props, base_rows);
        }
        let out = self.execute(&scheduled, &props, !prefills.is_empty())?;
        let t3 = (self.clock)();
        self.update(&scheduled, props, out, &mut events);
        let t4 = (self.clock)();
        let times = &mut self.step_times;
        times.steps += 1;
        times.schedule_s += t1 - t0;
        times.draft_s += t2 - t1;
        times.runner_s += t3 - t2;
        times.update_s += t4 - t3;
        self.stats.draft_s += t2 - t1;
        self.stats.target_s += t3 - t2;
        self.stats.other_s += (t1 - t0) + (t4 - t3);
        Ok(events)
    }

    /// The scheduler's answer for this step ([`crate::scheduler`]), with each decoding sequence's proposal. Running
    /// sequences that cannot fit the KV pool even alone end here with `Length` (their events go to `events`).
    fn schedule(&mut self, events: &mut Vec<(RequestId, Event)>) -> Vec<Scheduled> {
        let limits = StepLimits {
            max_batch_tokens: self.config.max_batch_tokens,
            max_prefill_tokens_while_decoding: self.config.max_prefill_tokens_while_decoding,
        };
        let num_decoding = self.seqs.iter().filter(|s| !s.is_prefill()).count();
        // Drafts share what the step can hold; with many streams each gets less, since batching already fills the
        // machine.
        let draft_rows =
            (self.config.max_batch_tokens / num_decoding.max(1)).min(self.config.spec.max_draft_tokens + 1);
        let mut proposals: Vec<Proposal> = (0..self.seqs.len())
            .map(|i| if self.seqs[i].is_prefill() { Proposal::default() } else { self.propose(i, draft_rows) })
            .collect();
        let out = self.scheduler.schedule(
            &limits,
            &mut self.seqs,
            &mut proposals,
            &mut self.runner,
            &mut self.proposers,
            &self.config.spec,
        );
        self.step_times.preemptions = self.scheduler.num_preemptions;
        let mut scheduled = out.scheduled;
        for &i in out.cannot_fit.iter().rev() {
            let mut s = self.seqs.remove(i);
            self.release(&s);
            events.push((s.id, s.finish(FinishReason::Length, false)));
            for x in &mut scheduled {
                x.index -= usize::from(x.index > i);
            }
        }
        scheduled
    }

    /// Runs the target over the scheduled tokens and drafts, asking for as little as decides every pick: the argmax
    /// (greedy), each row's largest logits (top-k sampling), or whole rows.
    fn execute(&mut self, scheduled: &[Scheduled], props: &[(usize, Proposal)], has_prefill: bool) -> Result<Executed> {
        // One buffer for every chunk that adds drafts to its tokens; the others are read where they are.
        let mut fed = Vec::new();
        for (x, (_, p)) in scheduled.iter().zip(props).filter(|(_, (_, p))| !p.tokens.is_empty()) {
            let s = &self.seqs[x.index];
            fed.extend_from_slice(&s.tokens[s.num_computed_tokens..s.num_computed_tokens + x.num_tokens]);
            fed.extend_from_slice(&p.tokens);
        }
        let mut at = 0;
        let mut starts = Vec::with_capacity(scheduled.len());
        let mut row = 0;
        let batch = Batch {
            chunks: scheduled
                .iter()
                .zip(props)
                .map(|(x, (_, p))| {
                    let s = &self.seqs[x.index];
                    let start = s.num_computed_tokens;
                    starts.push((row, start));
                    row += x.num_tokens + p.tokens.len();
                    let tokens = if p.tokens.is_empty() {
                        &s.tokens[start..start + x.num_tokens]
                    } else {
                        at += x.num_tokens + p.tokens.len();
                        &fed[at - x.num_tokens - p.tokens.len()..at]
                    };
                    let logits = match (x.wants_logits(s), p.tokens.is_empty()) {
                        (false, _) => LogitsWanted::None,
                        (true, true) => LogitsWanted::Last,
                        (true, false) => LogitsWanted::All,
                    };
                    SeqChunk { seq: SeqId(s.id.0), tokens, start_pos: start, logits }
                })
                .collect(),
        };
        // When every row this step reads is a plain greedy pick (no penalties, log-probabilities or constraint), the
        // runner picks the argmax itself: a GPU then copies back one id per row instead of the logits.
        let argmax_only = runner_argmax()
            && scheduled.iter().all(|x| {
                let s = &self.seqs[x.index];
                s.sampler.params.is_plain_greedy() && s.sampler.params.logprobs.is_none() && s.constraint.is_none()
            });
        // Otherwise, when every row's pick is decided by its largest logits (a top-k limit, no log-probabilities,
        // no awake constraint), only those come back.
        let candidates = if argmax_only || !self.config.sample_on_candidates {
            None
        } else {
            scheduled
                .iter()
                .zip(props)
                .filter(|(x, _)| x.wants_logits(&self.seqs[x.index]))
                .try_fold(0, |n, (x, (_, p))| self.seqs[x.index].candidates_wanted(&p.tokens).map(|c| n.max(c)))
        };
        let start = (self.clock)();
        // One sequence decoding alone, with no speculation that could turn its next step into more rows and a next
        // step to come (this pick is not its last by the output limit): its pick is fed back next, and the runner is
        // told so (a GPU may then start that step before this one's pick comes back).
        let feeds_picks = argmax_only
            && !has_prefill
            && batch.num_tokens() == 1
            && scheduled.iter().all(|x| {
                let s = &self.seqs[x.index];
                !self.may_propose(s) && s.num_output_tokens() + 1 < s.max_tokens
            });
        let out = if argmax_only {
            let next = if feeds_picks { NextStep::FedPicks } else { NextStep::Unknown };
            RowsOut::Picks(self.runner.forward_argmax_then(&batch, next)?)
        } else if let Some(n) = candidates.filter(|&n| n > 0) {
            RowsOut::Candidates(self.runner.forward_candidates(&batch, n)?)
        } else {
            RowsOut::Logits(self.runner.forward(&batch)?.to_vec())
        };
        let secs = (self.clock)() - start;
        let (num_tokens, num_rows) = (batch.num_tokens(), batch.num_logit_rows());
        drop(batch);
        if !has_prefill && self.config.spec.measure_costs {
            self.cost_model.observe_target(num_tokens, secs, unix_now());
            self.observed();
        }
        debug_assert_eq!(out.rows(self.runner.config().vocab_size), num_rows);
        Ok(Executed { out, starts, num_tokens })
    }

    /// Takes in what the pass returned: advances every scheduled sequence, samples (and verifies drafts) where rows
    /// came back, emits tokens and text, lets the proposers learn from the drafts' fate, rolls back rejected drafts,
    /// keeps the hidden rows proposers read and releases the requests that ended.
    fn update(
        &mut self,
        scheduled: &[Scheduled],
        props: Vec<(usize, Proposal)>,
        executed: Executed,
        events: &mut Vec<(RequestId, Event)>,
    ) {
        let mut finished = Vec::new();
        let mut row = 0;
        let mut depth_sum = 0;
        let mut num_verified = 0;
        for (x, (i, prop)) in scheduled.iter().zip(props) {
            let s = &mut self.seqs[i];
            let was_decoding = !s.is_prefill();
            s.num_computed_tokens += x.num_tokens;
            if s.num_computed_tokens < s.tokens.len() {
                continue;
            }
            let v = self.verify(i, &prop, &executed.out, row, events);
            row += prop.tokens.len() + 1;
            if v.finished {
                finished.push(i);
            }
            if was_decoding {
                self.stats.decode_passes += 1;
                self.stats.decode_tokens += v.emitted as u64;
                depth_sum += prop.tokens.len() - prop.pad;
                num_verified += 1;
                self.learn(i, &prop, &v);
            }
            if !prop.tokens.is_empty() {
                self.roll_back(i);
            }
        }
        if num_verified > 0 {
            self.stats.last_depth = depth_sum as f64 / num_verified as f64;
        }
        if !self.hidden_layers.is_empty() {
            self.keep_hidden(scheduled, &executed.starts, executed.num_tokens);
        }
        finished.sort_unstable();
        for i in finished.into_iter().rev() {
            let s = self.seqs.remove(i);
            self.release(&s);
        }
    }

    /// Samples sequence `i`'s rows from `row0` on: its pending token's pick, or its drafts verified in order until
    /// one is rejected (then the target's own pick there). Emits each token's events.
    fn verify(
        &mut self,
        i: usize,
        prop: &Proposal,
        out: &RowsOut,
        row0: usize,
        events: &mut Vec<(RequestId, Event)>,
    ) -> Verified {
        let vocab = self.runner.config().vocab_size;
        let max_context = self.runner.config().max_context;
        let s = &mut self.seqs[i];
        let k = prop.tokens.len();
        let mut finished = false;
        let mut accepted = 0;
        let mut emitted = 0;
        let mut rejected = false;
        for j in 0..=k {
            let l: &[f32] = match &out {
                RowsOut::Logits(logits) => &logits[(row0 + j) * vocab..(row0 + j + 1) * vocab],
                _ => &[],
            };
            // The target's choice at this position; for drafts, whether it is the draft.
            let (token, is_draft) = if let RowsOut::Picks(picks) = &out {
                let t = picks[row0 + j];
                (t, j < k && t == prop.tokens[j])
            } else if j < k {
                let d = prop.tokens[j];
                let cand = match &out {
                    RowsOut::Candidates(c) => Some(&c[row0 + j]),
                    _ => None,
                };
                let (t, ok) = match (s.sampler.params.is_greedy(), cand) {
                    (true, Some(c)) => {
                        let t = s.sampler.sample_from_candidates(c, &s.tokens);
                        (t, t == d)
                    }
                    (true, None) => {
                        let t = s.sampler.sample(&mut l.to_vec(), &s.tokens);
                        (t, t == d)
                    }
                    (false, _) => {
                        let p = match cand {
                            Some(c) => s.sampler.weights_from_candidates(c, &s.tokens),
                            None => s.sampler.weights(&mut l.to_vec(), &s.tokens),
                        };
                        spec::verify_sampled(&mut s.sampler, &p, prop.weights[j].as_deref(), d)
                    }
                };
                // A dormant constraint (drafts are only proposed then) sees every token; once it wakes up, the
                // drafts after this token were not checked against it and are dropped.
                let mut ok = ok;
                if let Some(c) = s.constraint.as_mut() {
                    if c.commit(t).is_err() {
                        events.push((s.id, s.finish(FinishReason::Stop, false)));
                        finished = true;
                        break;
                    }
                    ok &= c.is_dormant();
                }
                (t, ok)
            } else {
                let picked = match &out {
                    RowsOut::Candidates(c) => s.sample_from_candidates(&c[row0 + j]),
                    _ => s.sample(l),
                };
                match picked {
                    Ok(t) => (t, false),
                    Err(_) => {
                        // The constraint cannot continue: end here with what it accepted so far.
                        events.push((s.id, s.finish(FinishReason::Stop, false)));
                        finished = true;
                        break;
                    }
                }
            };
            accepted += usize::from(is_draft);
            emitted += 1;
            let (ev, fin) = s.push_token(token, l, &self.tokenizer, max_context);
            events.push((s.id, ev));
            if let Some(fin) = fin {
                events.push((s.id, fin));
                finished = true;
                break;
            }
            if !is_draft {
                rejected = j < k;
                break;
            }
        }
        Verified { emitted, accepted, rejected, finished }
    }

    /// Rolls back the rejected drafts of sequence `i`: the runner and the proposers keep every token but the pending
    /// last one.
    fn roll_back(&mut self, i: usize) {
        let s = &mut self.seqs[i];
        let keep = s.tokens.len() - 1;
        s.num_computed_tokens = keep;
        self.runner.truncate(SeqId(s.id.0), keep);
        for slot in 0..self.proposers.len() {
            if let Some(p) = self.proposers.get_mut(slot) {
                p.truncate(SeqId(s.id.0), keep);
            }
        }
    }
}
