//! The speculation chooser of a step: which proposer drafts for each decoding sequence and how deep, the proposers'
//! passes, the padding that times row counts for the cost model, and what the proposers learn from verification.

use models::{Runner, SeqId};

use crate::scheduler::Scheduled;
use crate::sequence::{Sequence, hidden_view};
use crate::spec::{self, CostModel, Draft, Proposer, SeqView, StepPlan};
use crate::step::Verified;
use crate::{Engine, Result, unix_now};

/// What a decoding sequence sends to the target this step: the proposer (its slot in [`Proposers`]) and its draft
/// tokens (placeholders until it drafts them), with the draft's sampling weights per token when they were sampled.
#[derive(Default)]
pub(crate) struct Proposal {
    pub(crate) proposer: Option<usize>,
    pub(crate) tokens: Vec<u32>,
    pub(crate) weights: Vec<Option<Vec<(u32, f64)>>>,
    /// The proposer's measured acceptance for this sequence.
    pub(crate) rate: f64,
    /// The depth is this sequence's own and the step may not trim it (seeded sampling, see [`Engine::costs_for`],
    /// and probes).
    pub(crate) fixed: bool,
    /// Tokens at the end of `tokens` that pad the pass to a row count the cost model wants timed
    /// ([`Engine::explore`]): verified like any draft, counted for no proposer.
    pub(crate) pad: usize,
    /// A probe of a proposer that its measured acceptance alone would not have chosen ([`spec::Offer::probe`]).
    pub(crate) probe: bool,
    /// A draft whose depth follows the proposer's confidence: `tokens` is the most it may draft, and it stops
    /// earlier when one more token would not pay ([`spec::draft_more`]).
    pub(crate) guided: bool,
}

/// A proposer's cost per draft pass as a sequence's depth is chosen (see `Engine::costs_for`): calibrated for
/// seeded sampling, live otherwise; 0 for one that runs no passes.
fn pass_cost(cost_model: &CostModel, p: &dyn Proposer, seeded: bool) -> f64 {
    match (p.runs_passes(), seeded) {
        (false, _) => 0.0,
        (true, true) => cost_model.prior_pass_s(p.name()),
        (true, false) => cost_model.pass_s(p.name()),
    }
}

/// Draft tokens of a probe ([`spec::Offer::probe`]): a proposer that has not proposed for a sequence for a while,
/// where nothing else proposes, proposes this many anyway (a step with a proposal from one that runs no passes
/// keeps it, unless the prober's own cost is still unconfirmed).
const PROBE_DEPTH: usize = 2;

impl<R: Runner> Engine<R> {
    /// Whether speculation may ever propose drafts for `s` (it then may change the shape of its next step).
    pub(crate) fn may_propose(&self, s: &Sequence) -> bool {
        let spec = &self.config.spec;
        spec.max_draft_tokens > 0
            && (0..self.proposers.len())
                .any(|slot| self.proposers.get(slot).is_some_and(|p| p.proposes_for(SeqId(s.id.0), spec)))
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

    /// Asks every proposer what it offers the decoding sequence `i`, takes the one faster for it alone and proposes
    /// as many tokens as it may (placeholders: the proposer drafts them once [`Self::choose_depths`] has trimmed
    /// them for the whole step).
    pub(crate) fn propose(&mut self, i: usize, max_rows: usize) -> Proposal {
        let s = &self.seqs[i];
        let spec = &self.config.spec;
        let max_k = self.max_drafts(s).min(max_rows.saturating_sub(1));
        if max_k == 0 || s.constraint.as_ref().is_some_and(|c| !c.is_dormant()) {
            return Proposal::default();
        }
        let costs = self.costs_for(s).clone();
        let fixed = s.sampler.params.is_seeded_sampling();
        let width = self.runner.config().hidden_size;
        let view = SeqView {
            seq: SeqId(s.id.0),
            tokens: &s.tokens,
            num_prompt_tokens: s.num_prompt_tokens,
            sampler: &s.sampler,
            adjustable: !fixed,
            hidden: s.hidden_rows(&self.hidden_layers, width),
        };
        // (speed, slot, depth, offer) of the fastest, and the first due for a probe.
        let mut best: Option<(f64, usize, usize, spec::Offer)> = None;
        let mut probe: Option<(usize, spec::Offer)> = None;
        for slot in 0..self.proposers.len() {
            let Some(p) = self.proposers.get_mut(slot) else { continue };
            let Some(offer) = p.offer(&view, max_k, spec) else { continue };
            let Some(p) = self.proposers.get(slot) else { continue };
            let pass_s = pass_cost(&self.cost_model, p, fixed);
            if offer.probe && probe.is_none() {
                probe = Some((slot, offer.clone()));
            }
            let (speed, k) = match offer.yields {
                // A guided draft's depth follows its confidence, so its rate understates it: what its verifications
                // really yielded is the better estimate, once there are some. Only where it beats plain decoding;
                // otherwise probes keep measuring it.
                Some((tokens, drafts)) => match costs.yield_speed(pass_s, tokens, drafts) {
                    speed if speed > 1.0 / costs.target(1) => (speed, offer.max_k),
                    _ => continue,
                },
                None => {
                    let k = if spec.adaptive { costs.best_depth(pass_s, offer.rate, offer.max_k) } else { offer.max_k };
                    (costs.speed(pass_s, offer.rate, k), k)
                }
            };
            if k > 0 && best.as_ref().is_none_or(|b| speed > b.0) {
                best = Some((speed, slot, k, offer));
            }
        }
        // A probe also replaces a proposal that costs no passes while the prober's cost rests on too few timings: a
        // draft that a bad calibration made look dear would otherwise never run where n-gram proposals are frequent.
        let probe = probe.filter(|(slot, _)| {
            let name = self.proposers.get(*slot).map_or("", |p| p.name());
            let unconfirmed = !fixed && spec.measure_costs && self.cost_model.unconfirmed(name);
            best.as_ref().is_none_or(|b| {
                let free = self.proposers.get(b.1).is_some_and(|p| !p.runs_passes());
                free && unconfirmed
            })
        });
        // Adaptive: the depth is settled for the whole step later; propose all that is allowed.
        let cap = |k: usize, max: usize| if spec.adaptive && !fixed { max } else { k };
        let (slot, k, offer, probing) = match (probe, best) {
            (Some((slot, offer)), _) => (slot, PROBE_DEPTH.min(max_k), offer, true),
            (None, Some((_, slot, k, offer))) => (slot, cap(k, offer.max_k), offer, false),
            (None, None) => return Proposal::default(),
        };
        Proposal {
            proposer: Some(slot),
            tokens: vec![0; k],
            weights: Vec::new(),
            rate: offer.rate,
            fixed: fixed || probing,
            pad: 0,
            probe: probing,
            guided: offer.guided && !probing,
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
        // Per proposer: its cost per draft pass, and the passes the step runs (its deepest draft).
        let pass_s: Vec<f64> = (0..self.proposers.len())
            .map(|slot| match self.proposers.get(slot) {
                Some(p) if p.runs_passes() => self.cost_model.pass_s(p.name()),
                _ => 0.0,
            })
            .collect();
        let mut passes = vec![0usize; pass_s.len()];
        for (_, p) in props.iter().filter(|(_, p)| p.fixed) {
            expected += spec::expected_tokens(p.rate, p.tokens.len()) - 1.0;
            rows += p.tokens.len();
            if let Some(slot) = p.proposer {
                passes[slot] = passes[slot].max(p.tokens.len());
            }
        }
        let costs = self.cost_model.costs();
        let mut draft_time: f64 = passes.iter().zip(&pass_s).map(|(&n, &s)| n as f64 * s).sum();
        let mut speed = expected / (costs.target(rows) + draft_time);
        loop {
            let mut best: Option<(f64, usize, f64)> = None; // (speed, proposal, draft time)
            for (j, (_, p)) in props.iter().enumerate() {
                let Some(slot) = p.proposer.filter(|_| depth[j] < p.tokens.len()) else { continue };
                let dt = draft_time + passes[slot].max(depth[j] + 1).saturating_sub(passes[slot]) as f64 * pass_s[slot];
                let gain = p.rate.clamp(0.0, 0.999).powi(depth[j] as i32 + 1);
                let v = (expected + gain) / (costs.target(rows + 1) + dt);
                if best.is_none_or(|b| v > b.0) {
                    best = Some((v, j, dt));
                }
            }
            match best {
                Some((v, j, dt)) if v > speed * 1.0001 => {
                    let p = &props[j].1;
                    expected += p.rate.clamp(0.0, 0.999).powi(depth[j] as i32 + 1);
                    depth[j] += 1;
                    if let Some(slot) = p.proposer {
                        passes[slot] = passes[slot].max(depth[j]);
                    }
                    rows += 1;
                    draft_time = dt;
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
                p.proposer = None;
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

    /// Has each chosen proposer draft its proposals, all its sequences in one call: fills in the proposals' tokens
    /// (and sampling weights) and times its passes into its cost track. A guided proposal may come back shorter
    /// than asked, judged against the rest of the step (`base_rows` target rows without drafts, for `num_decoding`
    /// decoding sequences).
    pub(crate) fn run_proposers(
        &mut self,
        props: &mut [(usize, Proposal)],
        base_rows: usize,
        num_decoding: usize,
    ) -> Result<()> {
        let width = self.runner.config().hidden_size;
        for slot in 0..self.proposers.len() {
            let mine: Vec<usize> = (0..props.len())
                .filter(|&j| props[j].1.proposer == Some(slot) && !props[j].1.tokens.is_empty())
                .collect();
            let Some(p) = self.proposers.get_mut(slot).filter(|_| !mine.is_empty()) else { continue };
            // What the rest of the step expects and holds, for guided drafts.
            let mut expected = num_decoding.max(1) as f64;
            let mut rows = base_rows;
            for (_, q) in props.iter().filter(|(_, q)| q.proposer.is_some_and(|o| o != slot)) {
                expected += spec::expected_tokens(q.rate, q.tokens.len()) - 1.0;
                rows += q.tokens.len();
            }
            let mut costs = self.cost_model.costs().clone();
            costs.draft_s = if p.runs_passes() { self.cost_model.pass_s(p.name()) } else { 0.0 };
            let plan = StepPlan { costs: &costs, expected, rows, clock: &*self.clock };
            let mut by_index: Vec<Option<&mut Sequence>> = self.seqs.iter_mut().map(Some).collect();
            let mut drafts: Vec<Draft<'_>> = mine
                .iter()
                .map(|&j| {
                    let s = by_index[props[j].0].take().expect("INVARIANT: one proposal per sequence");
                    let Sequence { id, tokens, sampler, hidden, hidden_pos, .. } = s;
                    let (prop, hidden) = (&props[j].1, hidden_view(hidden, *hidden_pos, &self.hidden_layers, width));
                    Draft {
                        seq: SeqId(id.0),
                        tokens,
                        sampler,
                        hidden,
                        k: prop.tokens.len(),
                        rate: prop.rate,
                        guided: prop.guided,
                        out: Vec::new(),
                        weights: Vec::new(),
                    }
                })
                .collect();
            let timings = p.propose(&mut drafts, &plan)?;
            for (&j, mut d) in mine.iter().zip(drafts) {
                // At most what was asked; a token without weights counts as proposed deterministically.
                d.out.truncate(d.k);
                d.weights.resize(d.out.len(), None);
                let prop = &mut props[j].1;
                prop.tokens = d.out;
                prop.weights = d.weights;
            }
            if self.config.spec.measure_costs {
                let name = p.name();
                for t in timings {
                    self.cost_model.observe_pass(name, t, unix_now());
                }
            }
        }
        Ok(())
    }

    /// Tells the proposers which prompt chunks the target computes this step (`(sequence, tokens)`), so a draft
    /// model is ready when decoding starts.
    pub(crate) fn prefill_proposers(&mut self, chunks: &[(usize, usize)]) -> Result<()> {
        let chunks: Vec<(SeqId, &[u32], usize)> = chunks
            .iter()
            .map(|&(i, n)| {
                let s = &self.seqs[i];
                (SeqId(s.id.0), &s.tokens[..], s.num_computed_tokens + n)
            })
            .collect();
        if chunks.is_empty() {
            return Ok(());
        }
        for slot in 0..self.proposers.len() {
            if let Some(p) = self.proposers.get_mut(slot) {
                p.prefill(&chunks)?;
            }
        }
        Ok(())
    }

    /// Keeps each scheduled sequence's hidden rows of the pass that just ran, for the tokens it still holds (the
    /// pending token and the accepted drafts, or the prompt chunk), from the rows the target kept for the proposers'
    /// layers. `starts`: each chunk's first row in the batch and first position; `num_tokens`: the batch's.
    pub(crate) fn keep_hidden(&mut self, scheduled: &[Scheduled], starts: &[(usize, usize)], num_tokens: usize) {
        let width = self.runner.config().hidden_size;
        let rows = self.runner.hidden_rows();
        let layers = self.hidden_layers.len();
        if rows.len() != layers * num_tokens * width {
            return;
        }
        for (x, &(row0, pos)) in scheduled.iter().zip(starts) {
            let s = &mut self.seqs[x.index];
            let kept = s.num_computed_tokens.saturating_sub(pos);
            s.hidden.clear();
            for l in 0..layers {
                let at = (l * num_tokens + row0) * width;
                s.hidden.extend_from_slice(&rows[at..at + kept * width]);
            }
            s.hidden_pos = pos;
        }
    }

    /// What the proposers learn from how decoding sequence `i`'s drafts fared: the counters per proposer, and every
    /// proposer hears the step's outcome (the chosen one its proposal's fate, the others what came out, to measure
    /// untaken offers and how long since they last proposed).
    pub(crate) fn learn(&mut self, i: usize, prop: &Proposal, v: &Verified) {
        let s = &self.seqs[i];
        // Padding (to time the pass, see `explore`) is no proposer's: the proposer's drafts are the first
        // `k - pad`, and a rejection within the padding rejected none of them.
        let k = prop.tokens.len() - prop.pad;
        let rejected = v.rejected && v.accepted < k;
        let accepted = v.accepted.min(k);
        if let Some(slot) = prop.proposer {
            let st = &mut self.stats.by_proposer[slot];
            st.proposed += k as u64;
            st.accepted += accepted as u64;
        }
        let seeded = s.sampler.params.is_seeded_sampling();
        let costs = if seeded { &self.costs } else { self.cost_model.costs() };
        let max_k = self.config.spec.max_draft_tokens;
        for slot in 0..self.proposers.len() {
            let Some(p) = self.proposers.get_mut(slot) else { continue };
            let chosen = prop.proposer == Some(slot);
            let pays = chosen && costs.best_depth(pass_cost(&self.cost_model, p, seeded), 0.9, max_k) > 0;
            let verified = spec::Verified {
                chosen,
                others: prop.proposer.is_some() && !chosen,
                probe: prop.probe,
                proposed: k,
                accepted,
                rejected,
                output: &s.tokens[s.tokens.len() - v.emitted..],
                greedy: s.sampler.params.is_greedy(),
                pays,
            };
            p.verified(SeqId(s.id.0), &verified);
        }
    }
}
