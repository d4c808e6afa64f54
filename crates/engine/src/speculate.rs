//! The speculation chooser of a step: which proposer drafts for each decoding sequence and how deep, the draft
//! model's passes, and the padding that times row counts for the cost model.

use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};

use crate::sequence::Sequence;
use crate::spec::{self, Method};
use crate::step::Verified;
use crate::{Engine, Result, runner_argmax, unix_now};

/// What a decoding sequence sends to the target this step: the method and its draft tokens (with the draft's
/// sampling weights per token when they were sampled).
#[derive(Default)]
pub(crate) struct Proposal {
    pub(crate) method: Option<Method>,
    pub(crate) tokens: Vec<u32>,
    pub(crate) weights: Vec<Option<Vec<(u32, f64)>>>,
    /// The proposer's measured acceptance for this sequence.
    pub(crate) rate: f64,
    /// The n-gram proposal when the draft model was chosen instead: checked against the tokens that come out, so the
    /// n-gram acceptance keeps being measured (it costs nothing) and the choice can switch back.
    pub(crate) shadow: Vec<u32>,
    /// Length of the suffix match behind the n-gram proposal (or the shadow).
    pub(crate) ngram_match: usize,
    /// The depth is this sequence's own and the step may not trim it (seeded sampling, see [`Engine::costs_for`],
    /// and probes).
    pub(crate) fixed: bool,
    /// Tokens at the end of `tokens` that pad the pass to a row count the cost model wants timed
    /// ([`Engine::explore`]): verified like any draft, counted for no proposer.
    pub(crate) pad: usize,
    /// A probe of the draft model that its measured acceptance alone would not have chosen.
    pub(crate) probe: bool,
    /// A greedy draft whose depth follows the draft's confidence: `tokens` is the most it may draft, and it stops
    /// earlier when one more token would not pay ([`spec::draft_more`]).
    pub(crate) guided: bool,
    /// The draft model's probability for each token it proposed (guided drafts).
    pub(crate) conf: Vec<f32>,
}

/// The softmax probability of token `t` in `logits`.
fn token_prob(logits: &[f32], t: u32) -> f32 {
    let (top, p_top) = models::top_prob(logits);
    match logits.get(t as usize) {
        Some(&l) => p_top * (l - logits[top as usize]).exp(),
        None => 0.0,
    }
}

/// Probing the draft model. Acceptance is only measured while a proposer proposes, so one early rejection (or a
/// stretch of prose in a code reply) could push the draft's estimate below the point where drafting pays and keep
/// it there for the rest of the request. A sequence that has not used the draft for `draft_probe_gap` target
/// passes, and would propose nothing this step, proposes `DRAFT_PROBE_DEPTH` draft tokens anyway (a step with an
/// n-gram proposal keeps it); a fully accepted probe resets the gap to the minimum, any other doubles it (up to the
/// maximum), so a draft that really does not fit costs at most one probe in `DRAFT_PROBE_GAP_MAX` passes.
pub(crate) const DRAFT_PROBE_DEPTH: usize = 2;
pub(crate) const DRAFT_PROBE_GAP_MIN: usize = 8;
pub(crate) const DRAFT_PROBE_GAP_MAX: usize = 256;

impl<R: Runner> Engine<R> {
    /// Whether speculation may ever propose drafts for `s` (it then may change the shape of its next step).
    pub(crate) fn may_propose(&self, s: &Sequence) -> bool {
        let spec = &self.config.spec;
        spec.max_draft_tokens > 0 && (spec.ngram || s.uses_draft)
    }

    /// The most drafts `s` may have verified in one step: they must fit the context (the target holds them until
    /// verified) and the output limit (the step emits up to k + 1 tokens).
    pub(crate) fn max_drafts(&self, s: &Sequence) -> usize {
        let max_context = self.runner.config().max_context;
        self.config
            .spec
            .max_draft_tokens
            .min(max_context.saturating_sub(s.tokens.len()))
            .min(s.max_tokens.saturating_sub(s.num_output_tokens() + 1))
    }

    /// Chooses the proposer for a decoding sequence (the one faster for it alone) and proposes as many tokens as it
    /// may; [`Self::choose_depths`] then trims them for the whole step.
    pub(crate) fn propose(&self, s: &Sequence, max_rows: usize) -> Proposal {
        let spec = &self.config.spec;
        let max_k = self.max_drafts(s).min(max_rows.saturating_sub(1));
        if max_k == 0 || s.constraint.as_ref().is_some_and(|c| !c.is_dormant()) {
            return Proposal::default();
        }
        let costs = self.costs_for(s);
        let fixed = s.sampler.params.is_seeded_sampling();
        let pick = |method: Method, acc: f64, max: usize| {
            if spec.adaptive { costs.best_depth(method, acc, max) } else { max }
        };
        let mut best: Option<(f64, Method, usize)> = None;
        let mut consider_speed = |method: Method, speed: f64, k: usize| {
            if k > 0 && best.is_none_or(|b| speed > b.0) {
                best = Some((speed, method, k));
            }
        };
        let mut consider = |method: Method, acc: f64, k: usize| consider_speed(method, costs.speed(method, acc, k), k);
        let (ngram, ngram_match) = if spec.ngram {
            spec::ngram_match(&s.tokens, spec.ngram_min_match, spec.ngram_max_match, max_k)
        } else {
            (Vec::new(), 0)
        };
        let ngram_rate = s.ngram.rate(ngram_match);
        if !ngram.is_empty() {
            consider(Method::Ngram, ngram_rate, pick(Method::Ngram, ngram_rate, ngram.len()));
        }
        // The draft first catches up on the tokens it has not seen; a long gap is closed without proposing.
        let lag = s.tokens.len() - s.num_draft_tokens;
        let guided = spec.adaptive
            && spec.draft_confidence
            && !fixed
            && s.sampler.params.is_greedy()
            && self.draft.as_ref().is_some_and(|d| d.top_prob_is_cheap());
        if s.uses_draft && lag <= self.config.max_batch_tokens {
            // A guided draft's depth follows its confidence, so its average acceptance understates it: what its
            // verifications really yielded is the better estimate, once there are some.
            match s.guided.speed(costs).filter(|_| guided) {
                // Only where it beats plain decoding; otherwise the probes below keep measuring it.
                Some(speed) if speed > 1.0 / costs.target(1) => consider_speed(Method::Draft, speed, max_k),
                Some(_) => {}
                None => consider(Method::Draft, s.draft.rate, pick(Method::Draft, s.draft.rate, max_k)),
            }
        }
        // Adaptive: the depth is settled for the whole step later; propose all that is allowed.
        let cap = |k: usize, max: usize| if spec.adaptive && !fixed { max } else { k };
        // A probe also replaces an n-gram proposal while the draft pass's cost rests on too few timings: a draft
        // that a bad calibration made look dear would otherwise never run where n-gram proposals are frequent.
        let unconfirmed = !fixed && spec.measure_costs && self.cost_model.draft_unconfirmed();
        let probe = spec.adaptive
            && s.uses_draft
            && lag <= self.config.max_batch_tokens
            && s.draft_idle >= s.draft_probe_gap
            && best.is_none_or(|b| b.1 == Method::Ngram && unconfirmed);
        if probe {
            best = Some((0.0, Method::Draft, DRAFT_PROBE_DEPTH.min(max_k)));
        }
        match best {
            Some((_, Method::Ngram, k)) => {
                let k = cap(k, ngram.len());
                let tokens = ngram[..k].to_vec();
                let weights = vec![None; k];
                Proposal {
                    method: Some(Method::Ngram),
                    tokens,
                    weights,
                    rate: ngram_rate,
                    shadow: Vec::new(),
                    ngram_match,
                    fixed,
                    pad: 0,
                    probe: false,
                    guided: false,
                    conf: Vec::new(),
                }
            }
            Some((_, Method::Draft, k)) => {
                let k = if probe { k } else { cap(k, max_k) };
                let rate = s.draft.rate;
                let tokens = vec![0; k];
                Proposal {
                    method: Some(Method::Draft),
                    tokens,
                    weights: Vec::new(),
                    rate,
                    shadow: ngram,
                    ngram_match,
                    fixed: fixed || probe,
                    pad: 0,
                    probe,
                    guided: guided && !probe,
                    conf: Vec::new(),
                }
            }
            None => Proposal::default(),
        }
    }

    /// Trims the proposals of one step to the depths that maximise the step's expected tokens per second: starting
    /// from no drafts, repeatedly add the draft token that raises (expected tokens) / (target pass time for all
    /// rows plus draft passes) the most, while it does. A draft token `j` of a sequence adds `rate^j` expected tokens; rows
    /// cost what `calibrate` measured, so with many sequences or a long prefill in the step (where the machine is
    /// already busy) fewer drafts pay, and alone on a memory-bound machine more do.
    pub(crate) fn choose_depths(&self, props: &mut [(usize, Proposal)], base_rows: usize, num_decoding: usize) {
        if !self.config.spec.adaptive {
            return;
        }
        // Fixed depths stay as proposed and count as already chosen.
        let mut depth: Vec<usize> = props.iter().map(|(_, p)| if p.fixed { p.tokens.len() } else { 0 }).collect();
        let mut expected = num_decoding.max(1) as f64;
        let mut rows = base_rows;
        let mut draft_depth = 0;
        for (_, p) in props.iter().filter(|(_, p)| p.fixed) {
            expected += spec::expected_tokens(p.rate, p.tokens.len()) - 1.0;
            rows += p.tokens.len();
            if p.method == Some(Method::Draft) {
                draft_depth = draft_depth.max(p.tokens.len());
            }
        }
        let costs = self.cost_model.costs();
        let time = |rows: usize, draft_depth: usize| costs.target(rows) + draft_depth as f64 * costs.draft_s;
        let mut speed = expected / time(rows, draft_depth);
        loop {
            let mut best: Option<(f64, usize, usize)> = None; // (speed, proposal, draft depth)
            for (j, (_, p)) in props.iter().enumerate() {
                if depth[j] >= p.tokens.len() {
                    continue;
                }
                let dd = if p.method == Some(Method::Draft) { draft_depth.max(depth[j] + 1) } else { draft_depth };
                let gain = p.rate.clamp(0.0, 0.999).powi(depth[j] as i32 + 1);
                let v = (expected + gain) / time(rows + 1, dd);
                if best.is_none_or(|b| v > b.0) {
                    best = Some((v, j, dd));
                }
            }
            match best {
                Some((v, j, dd)) if v > speed * 1.0001 => {
                    expected += props[j].1.rate.clamp(0.0, 0.999).powi(depth[j] as i32 + 1);
                    depth[j] += 1;
                    rows += 1;
                    draft_depth = dd;
                    speed = v;
                }
                _ => break,
            }
        }
        for ((_, p), d) in props.iter_mut().zip(depth) {
            // A guided draft that pays for one token may go on as far as its confidence carries it.
            let d = if p.guided && d > 0 { p.tokens.len() } else { d };
            p.tokens.truncate(d);
            p.weights.truncate(d);
            if d == 0 {
                p.method = None;
            }
        }
    }

    /// Times a row count the chooser would not have run, when the cost model says one is due
    /// ([`CostModel::explore_rows`]): pads the drafts of the decoding sequence with the most room so that this
    /// step's target pass has that many rows. The padding continues the sequence's text where an earlier occurrence
    /// of its last tokens does (so it is sometimes accepted), else repeats the last token; it is verified like any
    /// draft, so the output is what it would have been. Never for seeded sampling (its tokens may not depend on
    /// timings) or a sequence under an awake constraint. Call only for steps without prompt chunks (those are not
    /// timed).
    pub(crate) fn explore(&mut self, props: &mut [(usize, Proposal)], base_rows: usize) {
        let spec = &self.config.spec;
        if !(spec.measure_costs && spec.adaptive) || spec.max_draft_tokens == 0 {
            return;
        }
        let rows_now = base_rows + props.iter().map(|(_, p)| p.tokens.len()).sum::<usize>();
        let room = props
            .iter()
            .enumerate()
            .filter(|(_, (i, _))| {
                let s = &self.seqs[*i];
                !s.is_prefill()
                    && !s.sampler.params.is_seeded_sampling()
                    && s.constraint.as_ref().is_none_or(|c| c.is_dormant())
            })
            .map(|(j, (i, p))| (self.max_drafts(&self.seqs[*i]).saturating_sub(p.tokens.len()), j))
            .max_by_key(|&(extra, j)| (extra, std::cmp::Reverse(j)));
        let Some((extra, j)) = room.filter(|r| r.0 > 0) else { return };
        let extra = extra.min(self.config.max_batch_tokens.saturating_sub(rows_now));
        let Some(rows) = self.cost_model.explore_rows(rows_now, extra) else { return };
        let pad = rows - rows_now;
        let (i, p) = &mut props[j];
        let mut hist = self.seqs[*i].tokens.clone();
        hist.extend_from_slice(&p.tokens);
        let mut fill = spec::ngram_propose(&hist, 1, spec.ngram_max_match.max(1), pad);
        let last = fill.last().or(hist.last()).copied().expect("INVARIANT: a decoding sequence has tokens");
        fill.resize(pad, last);
        p.tokens.extend_from_slice(&fill);
        p.weights.resize(p.tokens.len(), None);
        p.pad = pad;
        self.cost_model.explored();
    }

    /// Runs the draft model for the sequences whose proposal uses it: one pass over each one's unseen tokens, then
    /// one pass per further draft token. Fills in the proposals' tokens (and sampling weights); guided proposals stop
    /// early where one more token would not pay for the step (`base_rows` target rows without drafts, for
    /// `num_decoding` decoding sequences).
    pub(crate) fn run_draft(
        &mut self,
        props: &mut [(usize, Proposal)],
        base_rows: usize,
        num_decoding: usize,
    ) -> Result<()> {
        let Some(vocab) = self.draft.as_ref().map(|d| d.logits_width()) else { return Ok(()) };
        let want: Vec<usize> = (0..props.len()).filter(|&j| props[j].1.method == Some(Method::Draft)).collect();
        if want.is_empty() {
            return Ok(());
        }
        let max_k = want.iter().map(|&j| props[j].1.tokens.len()).max().unwrap_or(0);
        // Per sequence: the history the draft's sampler sees (tokens plus drafts so far).
        let mut hist: Vec<Vec<u32>> = want.iter().map(|&j| self.seqs[props[j].0].tokens.clone()).collect();
        for step in 0..max_k {
            let live: Vec<usize> = (0..want.len()).filter(|&w| props[want[w]].1.tokens.len() > step).collect();
            if live.is_empty() {
                break;
            }
            let feeds: Vec<(SeqId, usize, Vec<u32>)> = live
                .iter()
                .map(|&w| {
                    let s = &self.seqs[props[want[w]].0];
                    let start = if step == 0 { s.num_draft_tokens } else { hist[w].len() - 1 };
                    (SeqId(s.id.0), start - s.draft_offset, hist[w][start..].to_vec())
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
            let argmax_only = runner_argmax()
                && vocab <= self.runner.config().vocab_size
                && live.iter().all(|&w| self.seqs[props[want[w]].0].sampler.params.is_plain_greedy());
            let guided = live.iter().any(|&w| props[want[w]].1.guided);
            // Sampled drafting from each row's largest logits, as the target's rows are sampled.
            let candidates =
                if argmax_only || !self.config.sample_on_candidates || vocab > self.runner.config().vocab_size {
                    None
                } else {
                    live.iter().try_fold(0, |n, &w| {
                        let sampler = &self.seqs[props[want[w]].0].sampler;
                        let c =
                            if sampler.params.is_greedy() { None } else { sampler.candidates_wanted(&hist[w], &[]) };
                        c.map(|c| n.max(c))
                    })
                };
            let clock = self.clock.clone();
            let draft = self.draft.as_mut().expect("INVARIANT: checked above");
            let pass_start = clock();
            let (logits, picks, cands) = match (argmax_only, guided, candidates) {
                (true, true, _) => (Vec::new(), Some(draft.forward_top(&batch)?), None),
                (true, false, _) => {
                    (Vec::new(), Some(draft.forward_argmax(&batch)?.into_iter().map(|t| (t, 0.0)).collect()), None)
                }
                (false, _, Some(n)) => (Vec::new(), None, Some(draft.forward_candidates(&batch, n)?)),
                (false, _, None) => (draft.forward(&batch)?.to_vec(), None, None),
            };
            // Only one-row passes measure the draft's price per token: a catch-up pass over many unseen tokens
            // costs more, and counting it as one draft token would make drafting look dearer each time it resumes.
            if batch.num_tokens() == 1 && self.config.spec.measure_costs {
                self.cost_model.observe_draft(clock() - pass_start, unix_now());
            }
            for (r, &w) in live.iter().enumerate() {
                let (i, prop) = &mut props[want[w]];
                let s = &mut self.seqs[*i];
                let (token, conf, weights) = if let Some(picks) = &picks {
                    (picks[r].0, picks[r].1, None)
                } else if let Some(cands) = &cands {
                    let q = s.sampler.weights_from_candidates(&cands[r], &hist[w]);
                    (s.sampler.draw(&q), 0.0, Some(q))
                } else {
                    // Only tokens the target can emit.
                    let raw = &logits[r * vocab..r * vocab + self.runner.config().vocab_size.min(vocab)];
                    let mut row = raw.to_vec();
                    if s.sampler.params.is_greedy() {
                        let t = s.sampler.sample(&mut row, &hist[w]);
                        let conf = if prop.guided { token_prob(raw, t) } else { 0.0 };
                        (t, conf, None)
                    } else {
                        let q = s.sampler.weights(&mut row, &hist[w]);
                        (s.sampler.draw(&q), 0.0, Some(q))
                    }
                };
                prop.tokens[step] = token;
                prop.weights.push(weights);
                if prop.guided {
                    prop.conf.push(conf);
                }
                hist[w].push(token);
            }
            self.stop_guided_drafts(props, step + 1, base_rows, num_decoding);
        }
        for (w, &j) in want.iter().enumerate() {
            let s = &mut self.seqs[props[j].0];
            // The draft holds everything it was fed: the tokens and all drafts but the last.
            s.num_draft_tokens = hist[w].len() - 1;
        }
        Ok(())
    }

    /// After `drafted` draft passes: ends each guided draft (trims its proposal to what it has) for which one more
    /// token would not raise the step's expected tokens per second ([`spec::draft_more`]). The step's expectation
    /// counts guided drafts by their tokens' learned acceptance ([`spec::Confidence`]) and the others by their
    /// sequence's rate, as [`Self::choose_depths`] did.
    pub(crate) fn stop_guided_drafts(
        &self,
        props: &mut [(usize, Proposal)],
        drafted: usize,
        base_rows: usize,
        num_decoding: usize,
    ) {
        // Per proposal: (chance that all its drafts so far are accepted, acceptance of its last one, expected
        // accepted drafts: the sum of the chances of each prefix).
        let chains: Vec<(f64, f64, f64)> = props
            .iter()
            .map(|(_, p)| {
                p.conf.iter().fold((1.0, 1.0, 0.0), |(chain, _, sum), &c| {
                    let a = self.confidence.acceptance(c);
                    (chain * a, a, sum + chain * a)
                })
            })
            .collect();
        let mut expected = num_decoding.max(1) as f64;
        let mut rows = base_rows;
        let mut draft_depth = drafted;
        for ((_, p), &(_, _, gain)) in props.iter().zip(&chains) {
            if p.guided {
                expected += gain;
                rows += p.conf.len();
            } else if p.method.is_some() {
                expected += spec::expected_tokens(p.rate, p.tokens.len()) - 1.0;
                rows += p.tokens.len();
                if p.method == Some(Method::Draft) {
                    draft_depth = draft_depth.max(p.tokens.len());
                }
            }
        }
        for ((_, p), &(chain, last, _)) in props.iter_mut().zip(&chains) {
            if !p.guided || p.tokens.len() <= drafted || p.conf.len() != drafted {
                continue;
            }
            let max_more = p.tokens.len() - drafted;
            if !spec::draft_more(self.cost_model.costs(), expected, rows, draft_depth, drafted, chain, last, max_more) {
                p.tokens.truncate(drafted);
                p.weights.truncate(drafted);
            }
        }
    }

    /// Feeds the draft model the prompt chunks the target computes this step, so it is ready when decoding starts.
    pub(crate) fn draft_prefill(&mut self, chunks: &[(usize, usize)]) -> Result<()> {
        let Some(draft) = self.draft.as_mut() else { return Ok(()) };
        let max = self.config.max_batch_tokens;
        let feeds: Vec<(usize, usize, usize)> = chunks
            .iter()
            .filter_map(|&(i, n)| {
                let s = &self.seqs[i];
                let end = s.num_computed_tokens + n;
                (s.uses_draft && s.num_draft_tokens < end)
                    .then(|| (i, s.num_draft_tokens, end.min(s.num_draft_tokens + max)))
            })
            .collect();
        if feeds.is_empty() {
            return Ok(());
        }
        let batch = Batch {
            chunks: feeds
                .iter()
                .map(|&(i, a, b)| {
                    let s = &self.seqs[i];
                    let start_pos = a - s.draft_offset;
                    SeqChunk { seq: SeqId(s.id.0), tokens: &s.tokens[a..b], start_pos, logits: LogitsWanted::None }
                })
                .collect(),
        };
        draft.forward(&batch)?;
        for &(i, _, b) in &feeds {
            self.seqs[i].num_draft_tokens = b;
        }
        Ok(())
    }

    /// What sequence `i`'s proposers learn from how its drafts fared: acceptance per proposer and by confidence,
    /// the n-gram shadow, the draft probes' gap, and the counters.
    pub(crate) fn learn(&mut self, i: usize, prop: &Proposal, v: &Verified, was_decoding: bool) {
        let s = &mut self.seqs[i];
        let (emitted, accepted, rejected) = (v.emitted, v.accepted, v.rejected);
        let k = prop.tokens.len();
        // Padding (to time the pass, see `explore`) is no proposer's: the proposer's drafts are the first
        // `k - pad`, and a rejection within the padding rejected none of them.
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
                        let costs =
                            if s.sampler.params.is_seeded_sampling() { &self.costs } else { self.cost_model.costs() };
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
    }
}
