//! A small draft model on the same backend as a [`Proposer`]. It sees each sequence from `draft_window` tokens
//! before the end of its prompt (catching up on prompt chunks as the target computes them), drafts all its
//! sequences in one pass per draft position, and for greedy requests goes on token by token for as long as its own
//! confidence says one more pays ([`super::Confidence`], [`super::draft_more`]). Sampled requests draw from the
//! draft's distribution, whose weights travel with the proposal for exact rejection sampling.

use std::collections::HashMap;

use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};

use super::proposer::{Draft, Offer, Proposer, SeqView, StepPlan, Verified};
use super::{Acceptance, Confidence, GuidedYield, SpecConfig};

/// A sequence that has not used the draft for this many target passes (at first; see [`Verified::pays`]) is due
/// for a probe ([`Offer::probe`]); a fully accepted probe resets the gap to the minimum, any other doubles it up
/// to the maximum, so a draft that really does not fit costs at most one probe in `PROBE_GAP_MAX` passes.
/// Acceptance is only measured while a proposer proposes, so one early rejection (or a stretch of prose in a code
/// reply) could otherwise push the estimate below the point where drafting pays and keep it there.
const PROBE_GAP_MIN: usize = 8;
const PROBE_GAP_MAX: usize = 256;

struct SeqState {
    /// Tokens whose KV the draft runner holds, counted from the sequence's start.
    num_draft_tokens: usize,
    /// The draft sees the sequence from this token on (its position 0): only the end of a long prompt, so drafting
    /// adds little to prefill.
    offset: usize,
    acceptance: Acceptance,
    /// What this sequence's guided drafts yielded per verification.
    guided: GuidedYield,
    /// Target passes since the draft last proposed, and how many to wait before probing again.
    idle: usize,
    probe_gap: usize,
    /// The last proposal: guided, and the draft's probability for each token it proposed (guided drafts).
    last_guided: bool,
    conf: Vec<f32>,
}

/// The draft model; see the module docs.
pub struct DraftModel<R: Runner> {
    runner: R,
    seqs: HashMap<SeqId, SeqState>,
    /// Acceptance of greedy draft tokens by the draft's confidence in them.
    confidence: Confidence,
    /// What the target can emit, and how the engine runs its own passes (the same choices for the draft's).
    target_vocab: usize,
    max_batch_tokens: usize,
    sample_on_candidates: bool,
}

impl<R: Runner> DraftModel<R> {
    pub fn new(runner: R, target_vocab: usize, max_batch_tokens: usize, sample_on_candidates: bool) -> Self {
        DraftModel {
            runner,
            seqs: HashMap::new(),
            confidence: Confidence::default(),
            target_vocab,
            max_batch_tokens,
            sample_on_candidates,
        }
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    pub fn runner_mut(&mut self) -> &mut R {
        &mut self.runner
    }

    /// Acceptance of greedy draft tokens by the draft's confidence, as learned so far.
    pub fn confidence(&self) -> &Confidence {
        &self.confidence
    }

    /// Narrows the output head to `n` ids (0: all the target can emit).
    pub fn limit_vocab(&mut self, n: usize) {
        self.runner.limit_logits(if n == 0 { self.target_vocab } else { n.min(self.target_vocab) });
    }

    /// After `drafted` draft passes: ends each guided draft (trims it to what it has) for which one more token would
    /// not raise the step's expected tokens per second ([`super::draft_more`]). The step's expectation counts guided
    /// drafts by their tokens' learned acceptance and the others by their rate, as the chooser did.
    fn stop_guided(&self, drafts: &mut [Draft<'_>], confs: &[Vec<f32>], drafted: usize, plan: &StepPlan<'_>) {
        // Per draft: (chance that all its tokens so far are accepted, acceptance of its last one, expected accepted
        // tokens: the sum of the chances of each prefix).
        let chains: Vec<(f64, f64, f64)> = confs
            .iter()
            .map(|conf| {
                conf.iter().fold((1.0, 1.0, 0.0), |(chain, _, sum), &c| {
                    let a = self.confidence.acceptance(c);
                    (chain * a, a, sum + chain * a)
                })
            })
            .collect();
        let (mut expected, mut rows, mut depth) = (plan.expected, plan.rows, drafted);
        for (d, &(_, _, gain)) in drafts.iter().zip(&chains) {
            if d.guided {
                expected += gain;
                rows += d.out.len();
            } else {
                expected += super::expected_tokens(d.rate, d.k) - 1.0;
                rows += d.k;
                depth = depth.max(d.k);
            }
        }
        for (d, &(chain, last, _)) in drafts.iter_mut().zip(&chains) {
            if !d.guided || d.k <= drafted || d.out.len() != drafted {
                continue;
            }
            if !super::draft_more(plan.costs, expected, rows, depth, drafted, chain, last, d.k - drafted) {
                d.k = drafted;
            }
        }
    }
}

impl<R: Runner> Proposer for DraftModel<R> {
    fn name(&self) -> &'static str {
        "draft"
    }

    fn admit(&mut self, seq: SeqId, prompt: &[u32], _cached: usize, cfg: &SpecConfig, constrained: bool) {
        if cfg.max_draft_tokens == 0 || !cfg.draft_model || constrained {
            return;
        }
        // At least the last prompt token is computed: its logits give the first output token.
        let reusable = &prompt[..prompt.len() - 1];
        let offset = if cfg.draft_window == 0 { 0 } else { reusable.len().saturating_sub(cfg.draft_window) };
        let num_draft_tokens = offset + self.runner.attach_prefix(seq, &reusable[offset..]);
        self.seqs.insert(
            seq,
            SeqState {
                num_draft_tokens,
                offset,
                acceptance: Acceptance::new(0.6),
                guided: GuidedYield::default(),
                idle: 0,
                probe_gap: PROBE_GAP_MIN,
                last_guided: false,
                conf: Vec::new(),
            },
        );
    }

    fn proposes_for(&self, seq: SeqId, _cfg: &SpecConfig) -> bool {
        self.seqs.contains_key(&seq)
    }

    fn offer(&mut self, s: &SeqView<'_>, max_k: usize, cfg: &SpecConfig) -> Option<Offer> {
        let st = self.seqs.get(&s.seq)?;
        // The draft first catches up on the tokens it has not seen; a long gap is closed without proposing.
        if s.tokens.len() - st.num_draft_tokens > self.max_batch_tokens {
            return None;
        }
        let guided = cfg.adaptive
            && cfg.draft_confidence
            && s.adjustable
            && s.sampler.params.is_greedy()
            && self.runner.top_prob_is_cheap();
        Some(Offer {
            tokens: Vec::new(),
            max_k,
            rate: st.acceptance.rate,
            yields: st.guided.means().filter(|_| guided),
            guided,
            probe: cfg.adaptive && st.idle >= st.probe_gap,
        })
    }

    fn propose(&mut self, drafts: &mut [Draft<'_>], plan: &StepPlan<'_>) -> models::Result<Vec<f64>> {
        let vocab = self.runner.logits_width();
        let mut timings = Vec::new();
        let max_k = drafts.iter().map(|d| d.k).max().unwrap_or(0);
        // Per draft: the history its sampler sees (tokens plus drafts so far), and its confidences.
        let mut hist: Vec<Vec<u32>> = drafts.iter().map(|d| d.tokens.to_vec()).collect();
        let mut confs: Vec<Vec<f32>> = vec![Vec::new(); drafts.len()];
        for step in 0..max_k {
            let live: Vec<usize> = (0..drafts.len()).filter(|&w| drafts[w].k > step).collect();
            if live.is_empty() {
                break;
            }
            let feeds: Vec<(SeqId, usize, Vec<u32>)> = live
                .iter()
                .map(|&w| {
                    let st = &self.seqs[&drafts[w].seq];
                    let start = if step == 0 { st.num_draft_tokens } else { hist[w].len() - 1 };
                    (drafts[w].seq, start - st.offset, hist[w][start..].to_vec())
                })
                .collect();
            let batch = Batch {
                chunks: feeds
                    .iter()
                    .map(|(seq, start, toks)| SeqChunk {
                        seq: *seq,
                        tokens: toks,
                        start_pos: *start,
                        logits: LogitsWanted::Last,
                    })
                    .collect(),
            };
            // Plain greedy drafting (and a draft head no wider than the target's vocabulary): the runner picks, with
            // its confidence when a guided draft needs it.
            let argmax_only = crate::runner_argmax()
                && vocab <= self.target_vocab
                && live.iter().all(|&w| drafts[w].sampler.params.is_plain_greedy());
            let guided = live.iter().any(|&w| drafts[w].guided);
            // Sampled drafting from each row's largest logits, as the target's rows are sampled.
            let candidates = if argmax_only || !self.sample_on_candidates || vocab > self.target_vocab {
                None
            } else {
                live.iter().try_fold(0, |n, &w| {
                    let sampler = &drafts[w].sampler;
                    let c = if sampler.params.is_greedy() { None } else { sampler.candidates_wanted(&hist[w], &[]) };
                    c.map(|c| n.max(c))
                })
            };
            let pass_start = (plan.clock)();
            let (logits, picks, cands) = match (argmax_only, guided, candidates) {
                (true, true, _) => (Vec::new(), Some(self.runner.forward_top(&batch)?), None),
                (true, false, _) => {
                    let picks = self.runner.forward_argmax(&batch)?.into_iter().map(|t| (t, 0.0)).collect();
                    (Vec::new(), Some(picks), None)
                }
                (false, _, Some(n)) => (Vec::new(), None, Some(self.runner.forward_candidates(&batch, n)?)),
                (false, _, None) => (self.runner.forward(&batch)?.to_vec(), None, None),
            };
            // Only one-row passes measure the draft's price per token: a catch-up pass over many unseen tokens
            // costs more, and counting it as one draft token would make drafting look dearer each time it resumes.
            if batch.num_tokens() == 1 {
                timings.push((plan.clock)() - pass_start);
            }
            for (r, &w) in live.iter().enumerate() {
                let d = &mut drafts[w];
                let (token, conf, weights) = if let Some(picks) = &picks {
                    (picks[r].0, picks[r].1, None)
                } else if let Some(cands) = &cands {
                    let q = d.sampler.weights_from_candidates(&cands[r], &hist[w]);
                    (d.sampler.draw(&q), 0.0, Some(q))
                } else {
                    // Only tokens the target can emit.
                    let raw = &logits[r * vocab..r * vocab + self.target_vocab.min(vocab)];
                    let mut row = raw.to_vec();
                    if d.sampler.params.is_greedy() {
                        let t = d.sampler.sample(&mut row, &hist[w]);
                        let conf = if d.guided { crate::token_prob(raw, t) } else { 0.0 };
                        (t, conf, None)
                    } else {
                        let q = d.sampler.weights(&mut row, &hist[w]);
                        (d.sampler.draw(&q), 0.0, Some(q))
                    }
                };
                d.out.push(token);
                d.weights.push(weights);
                if d.guided {
                    confs[w].push(conf);
                }
                hist[w].push(token);
            }
            self.stop_guided(drafts, &confs, step + 1, plan);
        }
        for ((d, h), conf) in drafts.iter().zip(&hist).zip(confs) {
            let st = self.seqs.get_mut(&d.seq).expect("INVARIANT: drafts are for admitted sequences");
            // The draft holds everything it was fed: the tokens and all drafts but the last.
            st.num_draft_tokens = h.len() - 1;
            st.last_guided = d.guided;
            st.conf = conf;
        }
        Ok(timings)
    }

    fn prefill(&mut self, chunks: &[(SeqId, &[u32], usize)]) -> models::Result<()> {
        let max = self.max_batch_tokens;
        let feeds: Vec<(SeqId, &[u32], usize, usize)> = chunks
            .iter()
            .filter_map(|&(seq, tokens, end)| {
                let st = self.seqs.get(&seq)?;
                (st.num_draft_tokens < end).then(|| {
                    let b = end.min(st.num_draft_tokens + max);
                    (seq, &tokens[st.num_draft_tokens..b], st.num_draft_tokens - st.offset, b)
                })
            })
            .collect();
        if feeds.is_empty() {
            return Ok(());
        }
        let batch = Batch {
            chunks: feeds
                .iter()
                .map(|&(seq, tokens, start_pos, _)| SeqChunk { seq, tokens, start_pos, logits: LogitsWanted::None })
                .collect(),
        };
        self.runner.forward(&batch)?;
        for &(seq, _, _, b) in &feeds {
            if let Some(st) = self.seqs.get_mut(&seq) {
                st.num_draft_tokens = b;
            }
        }
        Ok(())
    }

    fn verified(&mut self, seq: SeqId, v: &Verified<'_>) {
        let Some(st) = self.seqs.get_mut(&seq) else { return };
        if !v.chosen {
            st.idle += 1;
            return;
        }
        st.idle = 0;
        let k = v.proposed;
        if st.last_guided || (v.probe && v.greedy) {
            st.guided.update(v.output.len().min(k + 1), k);
        }
        if st.last_guided {
            for &c in &st.conf[..v.accepted.min(st.conf.len())] {
                self.confidence.update(c, true);
            }
            if let Some(&c) = st.conf.get(v.accepted).filter(|_| v.rejected) {
                self.confidence.update(c, false);
            }
        }
        st.acceptance.update(k, v.accepted);
        if v.probe {
            if v.accepted == k {
                // The draft fits again: judge it afresh rather than by the yields that stopped it.
                st.guided = GuidedYield::default();
            }
            // Probe again soon only where drafting could pay at all.
            st.probe_gap =
                if v.accepted == k && v.pays { PROBE_GAP_MIN } else { (2 * st.probe_gap).min(PROBE_GAP_MAX) };
        }
    }

    fn truncate(&mut self, seq: SeqId, len: usize) {
        // Below the window's start (a preempted sequence) the draft holds nothing and catches up from there.
        if let Some(st) = self.seqs.get_mut(&seq).filter(|st| st.num_draft_tokens > len) {
            st.num_draft_tokens = len.max(st.offset);
            self.runner.truncate(seq, len.saturating_sub(st.offset));
        }
    }

    fn release(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
        self.runner.release(seq);
    }

    fn idle_work(&mut self) -> bool {
        self.runner.idle_work()
    }
}
