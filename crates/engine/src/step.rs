//! One step of the engine: schedule, run the batch, and turn what came back into tokens and events.

use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};

use crate::spec::{self, Method};
use crate::speculate::{DRAFT_PROBE_GAP_MAX, DRAFT_PROBE_GAP_MIN, Proposal};
use crate::{Engine, Event, FinishReason, RequestId, Result, runner_argmax, unix_now};

/// What a target pass returned for its logit rows.
enum RowsOut {
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

impl<R: Runner> Engine<R> {
    /// Runs one batch and returns the events it produced, in order.
    pub fn step(&mut self) -> Result<Vec<(RequestId, Event)>> {
        let step_start = (self.clock)();
        // Schedule: decoding sequences first (the pending token plus any drafts), then prompt chunks, fewest tokens
        // left first (ties in arrival order). While anything decodes, prompts share a smaller budget so streams keep
        // flowing.
        let mut budget = self.config.max_batch_tokens;
        let mut order: Vec<usize> = (0..self.seqs.len()).collect();
        order.sort_by_key(|&i| {
            let s = &self.seqs[i];
            if s.is_prefill() { (1, s.tokens.len() - s.num_computed_tokens) } else { (0, 0) }
        });
        let num_decoding = self.seqs.iter().filter(|s| !s.is_prefill()).count();
        // Drafts share what the step can hold; with many streams each gets less, since batching already fills the
        // machine.
        let draft_rows =
            (self.config.max_batch_tokens / num_decoding.max(1)).min(self.config.spec.max_draft_tokens + 1);
        let mut scheduled: Vec<(usize, usize, Proposal)> = Vec::new(); // (sequence, tokens, drafts)
        let mut prefill_budget = None;
        for i in order {
            let s = &self.seqs[i];
            let remaining = s.tokens.len() - s.num_computed_tokens;
            if !s.is_prefill() {
                let prop = self.propose(s, draft_rows.min(budget));
                let n = remaining.min(budget);
                if n == 0 {
                    continue;
                }
                budget -= n + prop.tokens.len();
                scheduled.push((i, n, prop));
                continue;
            }
            if prefill_budget.is_none() {
                let cap =
                    if scheduled.is_empty() { budget } else { self.config.max_prefill_tokens_while_decoding.max(1) };
                prefill_budget = Some(cap.min(budget));
            }
            let p = prefill_budget.as_mut().expect("INVARIANT: set above");
            let n = remaining.min(*p);
            if n == 0 {
                continue;
            }
            budget -= n;
            *p -= n;
            scheduled.push((i, n, Proposal::default()));
        }
        if scheduled.is_empty() {
            return Ok(Vec::new());
        }
        let mut props: Vec<(usize, Proposal)> = scheduled.iter_mut().map(|(i, _, p)| (*i, std::mem::take(p))).collect();
        let base_rows = scheduled.iter().map(|&(_, n, _)| n).sum();
        let num_decoding = scheduled.iter().filter(|(i, _, _)| !self.seqs[*i].is_prefill()).count();
        self.choose_depths(&mut props, base_rows, num_decoding);
        let draft_start = (self.clock)();
        self.run_draft(&mut props, base_rows, num_decoding)?;
        let prefills: Vec<(usize, usize)> =
            scheduled.iter().filter(|(i, _, _)| self.seqs[*i].is_prefill()).map(|&(i, n, _)| (i, n)).collect();
        self.draft_prefill(&prefills)?;
        let draft_s = (self.clock)() - draft_start;
        if prefills.is_empty() {
            self.explore(&mut props, base_rows);
        }

        let feeds: Vec<Vec<u32>> = scheduled
            .iter()
            .zip(&props)
            .map(|(&(i, n, _), (_, p))| {
                let s = &self.seqs[i];
                let mut t = s.tokens[s.num_computed_tokens..s.num_computed_tokens + n].to_vec();
                t.extend_from_slice(&p.tokens);
                t
            })
            .collect();
        let batch = Batch {
            chunks: scheduled
                .iter()
                .zip(&feeds)
                .zip(&props)
                .map(|((&(i, n, _), toks), (_, p))| {
                    let s = &self.seqs[i];
                    let done = s.num_computed_tokens + n == s.tokens.len();
                    let logits = match (done, p.tokens.is_empty()) {
                        (false, _) => LogitsWanted::None,
                        (true, true) => LogitsWanted::Last,
                        (true, false) => LogitsWanted::All,
                    };
                    SeqChunk { seq: SeqId(s.id.0), tokens: toks, start_pos: s.num_computed_tokens, logits }
                })
                .collect(),
        };
        let num_rows = batch.num_logit_rows();
        // When every row this step reads is a plain greedy pick (no penalties, log-probabilities or constraint), the
        // runner picks the argmax itself: a GPU then copies back one id per row instead of the logits.
        let argmax_only = runner_argmax()
            && scheduled.iter().all(|&(i, _, _)| {
                let s = &self.seqs[i];
                s.sampler.params.is_plain_greedy() && s.sampler.params.logprobs.is_none() && s.constraint.is_none()
            });
        // Otherwise, when every row's pick is decided by its largest logits (a top-k limit, no log-probabilities,
        // no awake constraint), only those come back.
        let candidates = if argmax_only || !self.config.sample_on_candidates {
            None
        } else {
            scheduled
                .iter()
                .zip(&props)
                .filter(|&(&(i, n, _), _)| self.seqs[i].num_computed_tokens + n == self.seqs[i].tokens.len())
                .try_fold(0, |n, (&(i, _, _), (_, p))| self.seqs[i].candidates_wanted(&p.tokens).map(|c| n.max(c)))
        };
        let target_start = (self.clock)();
        // One sequence decoding alone, with no speculation that could turn its next step into more rows and a next
        // step to come (this pick is not its last by the output limit): the runner may start that step before this
        // one's pick comes back (decode ahead).
        let ahead = argmax_only
            && prefills.is_empty()
            && batch.num_tokens() == 1
            && scheduled.iter().all(|&(i, _, _)| {
                let s = &self.seqs[i];
                !self.may_propose(s) && s.num_output_tokens() + 1 < s.max_tokens
            });
        let out = if ahead {
            RowsOut::Picks(self.runner.forward_argmax_ahead(&batch)?)
        } else if argmax_only {
            RowsOut::Picks(self.runner.forward_argmax(&batch)?)
        } else if let Some(n) = candidates.filter(|&n| n > 0) {
            RowsOut::Candidates(self.runner.forward_candidates(&batch, n)?)
        } else {
            RowsOut::Logits(self.runner.forward(&batch)?.to_vec())
        };
        let target_s = (self.clock)() - target_start;
        if prefills.is_empty() && self.config.spec.measure_costs {
            self.cost_model.observe_target(batch.num_tokens(), target_s, unix_now());
            self.observed();
        }
        drop(batch);
        let vocab = self.runner.config().vocab_size;
        let max_context = self.runner.config().max_context;
        debug_assert_eq!(out.rows(vocab), num_rows);

        let mut events = Vec::new();
        let mut finished = Vec::new();
        let mut row = 0;
        let mut depth_sum = 0;
        let mut num_verified = 0;
        for (&(i, n, _), (_, prop)) in scheduled.iter().zip(props) {
            let s = &mut self.seqs[i];
            let was_decoding = !s.is_prefill();
            s.num_computed_tokens += n;
            if s.num_computed_tokens < s.tokens.len() {
                continue;
            }
            let k = prop.tokens.len();
            let row0 = row;
            row += k + 1;
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
                            finished.push(i);
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
                            finished.push(i);
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
                    finished.push(i);
                    break;
                }
                if !is_draft {
                    rejected = j < k;
                    break;
                }
            }
            // Padding (to time the pass, see `explore`) is no proposer's: the proposer's drafts are the first
            // `k - pad`, and a rejection within the padding rejected none of them.
            let rolled_back = k > 0;
            let k = k - prop.pad;
            let rejected = rejected && accepted < k;
            let accepted = accepted.min(k);
            if prop.method == Some(Method::Draft) && (prop.guided || (prop.probe && s.sampler.params.is_greedy())) {
                s.guided.update(emitted.min(k + 1), k);
            }
            if prop.guided {
                for &c in &prop.conf[..accepted] {
                    self.confidence.update(c, true);
                }
                if let Some(&c) = prop.conf.get(accepted).filter(|_| rejected) {
                    self.confidence.update(c, false);
                }
            }
            if !prop.shadow.is_empty() {
                let out = &s.tokens[s.tokens.len() - emitted..];
                let matched = prop.shadow.iter().zip(out).take_while(|(a, b)| a == b).count();
                s.ngram.update(prop.ngram_match, prop.shadow.len().min(emitted), matched);
            }
            if was_decoding {
                self.stats.decode_passes += 1;
                self.stats.decode_tokens += emitted as u64;
                depth_sum += k;
                num_verified += 1;
            }
            if was_decoding {
                s.draft_idle = if prop.method == Some(Method::Draft) { 0 } else { s.draft_idle + 1 };
            }
            if let Some(method) = prop.method {
                match method {
                    Method::Ngram => {
                        s.ngram.update(prop.ngram_match, k, accepted);
                        self.stats.ngram_proposed += k as u64;
                        self.stats.ngram_accepted += accepted as u64;
                    }
                    Method::Draft => {
                        s.draft.update(k, accepted);
                        if prop.probe {
                            if accepted == k {
                                // The draft fits again: judge it afresh rather than by the yields that stopped it.
                                s.guided = spec::GuidedYield::default();
                            }
                            // Probe again soon only where drafting could pay at all: a draft whose passes cost so
                            // much that even a well-fitting one loses is probed ever more rarely.
                            let costs = if s.sampler.params.is_seeded_sampling() {
                                &self.costs
                            } else {
                                self.cost_model.costs()
                            };
                            let pays = costs.best_depth(Method::Draft, 0.9, self.config.spec.max_draft_tokens) > 0;
                            s.draft_probe_gap = if accepted == k && pays {
                                DRAFT_PROBE_GAP_MIN
                            } else {
                                (2 * s.draft_probe_gap).min(DRAFT_PROBE_GAP_MAX)
                            };
                        }
                        self.stats.draft_proposed += k as u64;
                        self.stats.draft_accepted += accepted as u64;
                    }
                }
            }
            if rolled_back {
                // Roll back the rejected drafts: the runners keep every token but the pending last one.
                let keep = s.tokens.len() - 1;
                s.num_computed_tokens = keep;
                self.runner.truncate(SeqId(s.id.0), keep);
                if s.num_draft_tokens > keep {
                    s.num_draft_tokens = keep;
                    if let Some(d) = self.draft.as_mut() {
                        d.truncate(SeqId(s.id.0), keep - s.draft_offset);
                    }
                }
            }
        }
        if num_verified > 0 {
            self.stats.last_depth = depth_sum as f64 / num_verified as f64;
        }
        self.stats.draft_s += draft_s;
        self.stats.target_s += target_s;
        self.stats.other_s += (self.clock)() - step_start - draft_s - target_s;
        finished.sort_unstable();
        for i in finished.into_iter().rev() {
            let s = self.seqs.remove(i);
            self.release(&s);
        }
        Ok(events)
    }
}
