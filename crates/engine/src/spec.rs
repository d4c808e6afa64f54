//! Speculative decoding: where draft tokens come from, how they are checked against the target, and how deep to
//! draft.
//!
//! Proposers implement [`Proposer`] ([`proposer`] describes the interface): prompt lookup ([`NgramProposer`]: the
//! tokens that followed the latest earlier occurrence of the sequence's last few tokens — free, and strong when a
//! reply copies what it was shown), a small draft model run on the same backend ([`DraftModel`]), and any other
//! added with `Engine::add_proposer` (an MTP head or a block drafter reading the target's hidden rows). The target scores the pending token and the k drafts in one pass (k+1 rows that read each weight once).
//! Greedy requests keep the longest prefix of drafts equal to the target's own choices, so the output is token for
//! token what plain decoding gives. Sampled requests use exact rejection sampling (Leviathan et al. 2023): accept a
//! draft `d` with probability min(1, p(d)/q(d)), otherwise draw from the normalised residual max(0, p − q); the
//! output distribution is then exactly the target's. Depth is chosen per sequence from its measured acceptance and
//! the measured cost of target and draft passes, and is 0 whenever drafting would not pay; a greedy draft then goes on
//! token by token for as long as the draft's own confidence in its tokens says one more pays ([`Confidence`],
//! [`draft_more`]).

use crate::sampler::Sampler;

mod costs;
mod draft;
mod ngram;
pub mod proposer;
pub use costs::{CostModel, CostPoint, CostsView};
pub use draft::DraftModel;
pub use ngram::NgramProposer;
pub use proposer::{Draft, Hidden, Offer, Proposer, SeqView, StepPlan, Verified};

/// Speculation settings.
#[derive(Debug, Clone)]
pub struct SpecConfig {
    /// Most draft tokens per verification; 0 turns speculation off.
    pub max_draft_tokens: usize,
    /// Propose from the sequence's own tokens (prompt lookup).
    pub ngram: bool,
    /// Use the draft model when the engine has one.
    pub draft_model: bool,
    /// Longest and shortest suffix the n-gram proposer matches.
    pub ngram_max_match: usize,
    pub ngram_min_match: usize,
    /// Pick the depth from measured acceptance and costs; when false, always draft `max_draft_tokens`.
    pub adaptive: bool,
    /// The draft model sees at most this many prompt tokens (the end of the prompt; 0 = all): a draft needs the
    /// recent context, and prefilling a long agent prompt twice would cost a third more time to first token.
    pub draft_window: usize,
    /// The draft model's output head covers this many token ids (0 = all): the most frequent in source code and
    /// documentation where Splash has a ranking for the tokenizer, else the lowest ids ([`models::draft_head`]).
    /// For Qwen2's tokenizer the ranked 32K cover 99.7% of the ranking's corpus, where the lowest 32K ids cover 92%
    /// (BPE ids are only roughly in frequency order); the head over all 151,936 ids is ~37% of the 0.5B draft's
    /// weight reads. A token the draft cannot propose is still produced by the target's own pass; rejection
    /// sampling stays exact (its `q` is 0 there).
    pub draft_vocab: usize,
    /// Keep the pass costs current from the passes that run (see [`PassCosts`]); off, the calibrated (or set) costs
    /// decide alone, which tests need to be deterministic.
    pub measure_costs: bool,
    /// Greedy drafts stop as soon as one more token would not pay, judged from the draft's own probability for each
    /// token it proposed ([`Confidence`]) instead of the sequence's average acceptance alone; off, the depth chosen
    /// before drafting is drafted in full.
    pub draft_confidence: bool,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            max_draft_tokens: 8,
            ngram: true,
            draft_model: true,
            ngram_max_match: 4,
            ngram_min_match: 2,
            adaptive: true,
            draft_window: 1024,
            draft_vocab: 32768,
            measure_costs: true,
            draft_confidence: true,
        }
    }
}

impl SpecConfig {
    pub fn off() -> Self {
        SpecConfig { max_draft_tokens: 0, ngram: false, draft_model: false, ..Default::default() }
    }
}

/// The tokens that followed the most recent earlier occurrence of the longest suffix of `tokens` (between
/// `min_match` and `max_match` tokens long), at most `max_tokens` of them.
pub fn ngram_propose(tokens: &[u32], min_match: usize, max_match: usize, max_tokens: usize) -> Vec<u32> {
    ngram_match(tokens, min_match, max_match, max_tokens).0
}

/// [`ngram_propose`] and the length of the suffix that matched (0 when nothing did).
pub fn ngram_match(tokens: &[u32], min_match: usize, max_match: usize, max_tokens: usize) -> (Vec<u32>, usize) {
    let len = tokens.len();
    if max_tokens == 0 || min_match == 0 {
        return (Vec::new(), 0);
    }
    for n in (min_match..=max_match.min(len.saturating_sub(1))).rev() {
        let pattern = &tokens[len - n..];
        // Latest start j < len - n whose n tokens equal the suffix and that has a continuation.
        if let Some(j) = (0..len - n).rev().find(|&j| &tokens[j..j + n] == pattern) {
            let from = j + n;
            return (tokens[from..(from + max_tokens).min(len)].to_vec(), n);
        }
    }
    (Vec::new(), 0)
}

/// N-gram acceptance kept apart by the length of the match that made the proposal: a proposal from a 4-token match
/// (copying a passage) is far likelier to hold than one from a 2-token match, so one running rate would make the
/// depth too shallow for the first and too deep for the second.
#[derive(Debug, Clone, Copy)]
pub struct NgramAcceptance {
    /// Match lengths 1, 2, 3 and 4 or more.
    by_len: [Acceptance; 4],
}

impl NgramAcceptance {
    pub fn new() -> Self {
        NgramAcceptance {
            by_len: [Acceptance::new(0.3), Acceptance::new(0.45), Acceptance::new(0.55), Acceptance::new(0.65)],
        }
    }

    fn bucket(match_len: usize) -> usize {
        match_len.clamp(1, 4) - 1
    }

    pub fn rate(&self, match_len: usize) -> f64 {
        self.by_len[Self::bucket(match_len)].rate
    }

    pub fn update(&mut self, match_len: usize, proposed: usize, accepted: usize) {
        self.by_len[Self::bucket(match_len)].update(proposed, accepted);
    }
}

impl Default for NgramAcceptance {
    fn default() -> Self {
        Self::new()
    }
}

/// Running acceptance of one proposer for one sequence: the chance that a draft token is accepted, given that the
/// ones before it were.
#[derive(Debug, Clone, Copy)]
pub struct Acceptance {
    pub rate: f64,
}

impl Acceptance {
    pub fn new(prior: f64) -> Self {
        Acceptance { rate: prior }
    }

    /// Folds in one verification: `accepted` of `proposed` drafts kept.
    pub fn update(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        // Each kept draft is a success; the first rejected one (if any) a failure.
        let trials = accepted + usize::from(accepted < proposed);
        let sample = accepted as f64 / trials as f64;
        let w = 0.3f64.min(trials as f64 * 0.1);
        self.rate = (1.0 - w) * self.rate + w * sample;
    }
}

/// How often a greedy draft token is accepted, by the draft model's own softmax probability for it (its
/// "confidence"), learned from the verifications that ran.
///
/// The average acceptance of a sequence hides what matters for the depth: most tokens of code are ones the draft is
/// all but sure of (measured on the 0.5B drafting for the 1.5B: a probability of at least 0.98 for two thirds of the
/// draft tokens, 99.5% of them accepted), while those below 0.7 are accepted about half the time. A draft that
/// continues through sure tokens and stops after an unsure one proposes deeper where that pays and wastes fewer draft
/// passes and verification rows where it does not.
#[derive(Debug, Clone)]
pub struct Confidence {
    /// Per bucket: (tokens verified, tokens accepted), decayed so the table follows the current draft and target.
    counts: [(f64, f64); CONFIDENCE_EDGES.len() + 1],
}

/// Lower edges of the confidence buckets after the first (which starts at 0).
const CONFIDENCE_EDGES: [f32; 8] = [0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.995];
/// Weight of the prior (the bucket's middle probability: a draft's probabilities are roughly calibrated) in
/// verified tokens.
const CONFIDENCE_PRIOR: f64 = 8.0;
/// Counts are scaled down past this many tokens per bucket, so old verifications fade.
const CONFIDENCE_MEMORY: f64 = 2000.0;

impl Default for Confidence {
    fn default() -> Self {
        Confidence { counts: [(0.0, 0.0); CONFIDENCE_EDGES.len() + 1] }
    }
}

impl Confidence {
    fn bucket(conf: f32) -> usize {
        CONFIDENCE_EDGES.iter().filter(|&&e| conf >= e).count()
    }

    /// The confidences of `bucket`: `lo..hi`.
    fn range(bucket: usize) -> (f32, f32) {
        let lo = if bucket == 0 { 0.0 } else { CONFIDENCE_EDGES[bucket - 1] };
        (lo, CONFIDENCE_EDGES.get(bucket).copied().unwrap_or(1.0))
    }

    fn prior(bucket: usize) -> f64 {
        let (lo, hi) = Self::range(bucket);
        f64::from(lo + hi) / 2.0
    }

    /// The chance that a draft token proposed with probability `conf` is accepted (given the ones before it were).
    pub fn acceptance(&self, conf: f32) -> f64 {
        let b = Self::bucket(conf);
        let (n, a) = self.counts[b];
        (a + CONFIDENCE_PRIOR * Self::prior(b)) / (n + CONFIDENCE_PRIOR)
    }

    /// Per bucket: its confidence range, the (decayed) number of verified draft tokens in it and how many of them
    /// were accepted.
    pub fn buckets(&self) -> impl Iterator<Item = (f32, f32, f64, f64)> + '_ {
        self.counts.iter().enumerate().map(|(b, &(n, a))| {
            let (lo, hi) = Self::range(b);
            (lo, hi, n, a)
        })
    }

    /// Folds in one verified draft token.
    pub fn update(&mut self, conf: f32, accepted: bool) {
        let c = &mut self.counts[Self::bucket(conf)];
        if c.0 >= CONFIDENCE_MEMORY {
            *c = (c.0 * 0.5, c.1 * 0.5);
        }
        *c = (c.0 + 1.0, c.1 + f64::from(u8::from(accepted)));
    }
}

/// What one sequence's guided drafts ([`draft_more`]) yield: running means of the tokens each verification produced
/// and of the draft tokens it checked. Their depth follows the draft's confidence, so the sequence's average
/// acceptance ([`Acceptance`]) with [`expected_tokens`] understates them; choosing between them and an n-gram
/// proposal goes by this instead.
#[derive(Debug, Clone, Copy, Default)]
pub struct GuidedYield {
    tokens: f64,
    drafts: f64,
    num_seen: usize,
}

impl GuidedYield {
    /// Folds in one verification of `drafts` guided draft tokens that produced `tokens` tokens.
    pub fn update(&mut self, tokens: usize, drafts: usize) {
        let w = if self.num_seen == 0 { 1.0 } else { 0.2 };
        self.tokens += w * (tokens as f64 - self.tokens);
        self.drafts += w * (drafts as f64 - self.drafts);
        self.num_seen += 1;
    }

    /// Mean tokens produced and drafts verified per verification, once a few verifications were seen.
    pub fn means(&self) -> Option<(f64, f64)> {
        (self.num_seen >= 3).then_some((self.tokens, self.drafts))
    }
}

/// Whether a greedy draft that has proposed `drafted` tokens should propose another.
///
/// `chain` is the chance that all of them are accepted and `last` the acceptance of the last one alone (the next
/// token is assumed as likely: sure tokens come in runs). The step now expects `expected` tokens from `rows` target
/// rows and `draft_depth` draft passes; one more draft adds `chain · last` expected tokens, `n` more add
/// `chain · (last + last² + … + lastⁿ)`, for one row and one draft pass each. Drafting goes on when some `n` up to
/// `max_more` raises the step's expected tokens per second: looking further than one token ahead matters because
/// pass costs are not convex (a row that crosses from memory-bound to compute-bound costs more than the next ones).
#[allow(clippy::too_many_arguments)]
pub fn draft_more(
    costs: &PassCosts,
    expected: f64,
    rows: usize,
    draft_depth: usize,
    drafted: usize,
    chain: f64,
    last: f64,
    max_more: usize,
) -> bool {
    let time = |rows: usize, depth: usize| costs.target(rows) + depth as f64 * costs.draft_s;
    let now = expected / time(rows, draft_depth);
    let last = last.clamp(0.0, 0.999);
    let mut gain = 0.0;
    let mut p = chain;
    (1..=max_more).any(|n| {
        p *= last;
        gain += p;
        (expected + gain) / time(rows + n, draft_depth.max(drafted + n)) > now * 1.0001
    })
}

/// Expected tokens produced by one verification of `k` drafts when each is accepted with probability `a` (given the
/// previous ones were): the accepted prefix plus the target's own next token.
pub fn expected_tokens(a: f64, k: usize) -> f64 {
    let a = a.clamp(0.0, 0.999);
    (1.0 - a.powi(k as i32 + 1)) / (1.0 - a)
}

/// Time of forward passes by number of rows, for the cost model: measured by `Engine::calibrate` (or assumed, or
/// saved by an earlier run), then kept current by the passes the engine really runs ([`CostModel`]): a calibration
/// taken while something else loaded the machine, or at a short context when requests run at a long one, would
/// otherwise decide every depth from wrong costs for as long as the process lives.
#[derive(Debug, Clone, Default)]
pub struct PassCosts {
    /// (rows, seconds) of target passes, rows ascending.
    pub target: Vec<(usize, f64)>,
    /// Draft pass time for one row, in seconds.
    pub draft_s: f64,
}

impl PassCosts {
    /// Before measuring: a pass of r rows costs 1 + 0.1 (r - 1) single-row passes (weights read once), and a draft
    /// pass a third of a target one.
    pub fn assumed() -> Self {
        PassCosts { target: vec![(1, 1.0), (17, 2.6)], draft_s: 0.33 }
    }

    /// Costs from repeated timings (`target`: rows and every timing of that many rows; `draft`: every draft timing).
    /// Interference only ever slows a pass, so each count keeps its fastest timing, and a count is never costlier
    /// than a larger one (a pass over more rows does all the work of one over fewer).
    pub fn from_timings(target: &[(usize, Vec<f64>)], draft: &[f64]) -> Self {
        let fastest = |t: &[f64]| t.iter().copied().fold(f64::INFINITY, f64::min);
        let mut points: Vec<(usize, f64)> = target.iter().map(|(r, t)| (*r, fastest(t))).collect();
        points.sort_by_key(|p| p.0);
        points.dedup_by_key(|p| p.0);
        for i in (0..points.len().saturating_sub(1)).rev() {
            points[i].1 = points[i].1.min(points[i + 1].1);
        }
        PassCosts { target: points, draft_s: if draft.is_empty() { 0.0 } else { fastest(draft) } }
    }

    /// What is wrong with these costs as a calibration, if anything: none at all, a count that is not positive and
    /// finite, no one-row pass, costs that fall with rows (a pass over more rows does all the work of one over fewer),
    /// a count dearer than that many one-row passes, or one step between neighbouring counts that costs several times
    /// the typical step and more than a quarter of a one-row pass per row (a burst of other work during part of the
    /// measurement). A 10% tolerance covers timer noise.
    pub fn check(&self) -> Result<(), String> {
        let t = &self.target;
        if t.is_empty() {
            return Err("no target costs".into());
        }
        if let Some(&(r, s)) = t.iter().find(|&&(r, s)| r == 0 || !s.is_finite() || s <= 0.0) {
            return Err(format!("target cost {s} for {r} rows"));
        }
        if !self.draft_s.is_finite() || self.draft_s < 0.0 {
            return Err(format!("draft cost {}", self.draft_s));
        }
        if t.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err("row counts are not ascending".into());
        }
        let one = match t[0] {
            (1, s) => s,
            (r, _) => return Err(format!("no one-row cost (the first is for {r} rows)")),
        };
        for w in t.windows(2) {
            let ((r0, s0), (r1, s1)) = (w[0], w[1]);
            if s1 < 0.9 * s0 {
                return Err(format!("{r1} rows cost less than {r0} ({s1:.3e} s < {s0:.3e} s)"));
            }
        }
        if let Some(&(r, s)) = t.iter().find(|&&(r, s)| s > 1.1 * r as f64 * one) {
            return Err(format!("{r} rows cost more than {r} one-row passes ({s:.3e} s, one row {one:.3e} s)"));
        }
        let mut per_row: Vec<f64> = t.windows(2).map(|w| (w[1].1 - w[0].1) / (w[1].0 - w[0].0) as f64).collect();
        let steps = per_row.clone();
        per_row.sort_by(f64::total_cmp);
        if let Some(&median) = per_row.get(per_row.len() / 2) {
            for (w, &step) in t.windows(2).zip(&steps) {
                if step > 4.0 * median.max(0.0) + 1e-12 && step > 0.25 * one {
                    return Err(format!(
                        "an outlier step from {} to {} rows ({:.3e} s per row, typically {median:.3e})",
                        w[0].0, w[1].0, step
                    ));
                }
            }
        }
        Ok(())
    }

    /// Target pass time for `rows` rows: piecewise linear through the measured points, extended past the ends.
    pub fn target(&self, rows: usize) -> f64 {
        let t = &self.target;
        let x = rows as f64;
        match t.len() {
            0 => x,
            1 => t[0].1 * x / t[0].0 as f64,
            n => {
                let j = t.iter().position(|p| p.0 >= rows).unwrap_or(n - 1).clamp(1, n - 1);
                let ((x0, y0), (x1, y1)) = (t[j - 1], t[j]);
                let y = y0 + (y1 - y0) * (x - x0 as f64) / (x1 as f64 - x0 as f64).max(1.0);
                y.max(t[0].1 * 0.5)
            }
        }
    }

    /// Expected tokens per second of one sequence decoding alone with `k` drafts from a proposer whose draft passes
    /// cost `pass_s` each (0 for one that runs none; `draft_s` for the draft model).
    pub fn speed(&self, pass_s: f64, acceptance: f64, k: usize) -> f64 {
        expected_tokens(acceptance, k) / (self.target(k + 1) + k as f64 * pass_s)
    }

    /// Tokens per second of verifications that yield `tokens` tokens from `drafts` drafts (means), drafts costing
    /// `pass_s` each.
    pub fn yield_speed(&self, pass_s: f64, tokens: f64, drafts: f64) -> f64 {
        tokens / (self.target(drafts.round() as usize + 1) + drafts * pass_s)
    }

    /// The depth (0..=max_k) that maximises expected tokens per second for one sequence decoding alone, drafts
    /// costing `pass_s` each.
    pub fn best_depth(&self, pass_s: f64, acceptance: f64, max_k: usize) -> usize {
        let mut best = (self.speed(pass_s, acceptance, 0), 0);
        for k in 1..=max_k {
            let speed = self.speed(pass_s, acceptance, k);
            if speed > best.0 * 1.0001 {
                best = (speed, k);
            }
        }
        best.1
    }
}

/// Verifies draft `d` against the target's sampling weights `p`; `q` is the draft's weights when it was sampled
/// from a distribution, `None` when it was proposed deterministically (n-gram, or a greedy draft). Returns the token to
/// emit and whether it is the draft.
pub fn verify_sampled(sampler: &mut Sampler, p: &[(u32, f64)], q: Option<&[(u32, f64)]>, d: u32) -> (u32, bool) {
    let zp: f64 = p.iter().map(|x| x.1).sum();
    let prob = |w: &[(u32, f64)], z: f64, t: u32| w.iter().find(|x| x.0 == t).map_or(0.0, |x| x.1 / z);
    let pd = if zp > 0.0 { prob(p, zp, d) } else { 0.0 };
    let (qd, zq) = match q {
        Some(q) => {
            let zq: f64 = q.iter().map(|x| x.1).sum();
            (if zq > 0.0 { prob(q, zq, d) } else { 0.0 }, zq)
        }
        None => (1.0, 1.0),
    };
    if qd > 0.0 && sampler.uniform() < pd / qd {
        return (d, true);
    }
    // Residual max(0, p - q) over p's support (q's mass outside it contributes nothing).
    let residual: Vec<(u32, f64)> = p
        .iter()
        .map(|&(t, w)| {
            let qt = match q {
                Some(q) => prob(q, zq, t),
                None => f64::from(u8::from(t == d)),
            };
            (t, (w / zp - qt).max(0.0))
        })
        .filter(|x| x.1 > 0.0)
        .collect();
    if residual.is_empty() {
        // Only reachable through rounding when p == q; p itself is then the right distribution.
        return (sampler.draw(p), false);
    }
    (sampler.draw(&residual), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SamplingParams;

    #[test]
    fn confidence_starts_at_the_draft_probability_and_learns_per_bucket() {
        let mut c = Confidence::default();
        assert!((c.acceptance(0.999) - 0.9975).abs() < 1e-6);
        assert!((c.acceptance(0.6) - 0.6).abs() < 1e-6);
        assert!((c.acceptance(0.1) - 0.15).abs() < 1e-6);
        // A draft overconfident in [0.9, 0.95): accepted one time in two.
        for i in 0..400 {
            c.update(0.92, i % 2 == 0);
        }
        assert!((c.acceptance(0.93) - 0.5).abs() < 0.02, "{c:?}");
        // Other buckets keep their prior; old verifications fade (the bucket follows a change within a few
        // thousand tokens).
        assert!((c.acceptance(0.999) - 0.9975).abs() < 1e-6);
        for _ in 0..6000 {
            c.update(0.92, true);
        }
        assert!(c.acceptance(0.92) > 0.85, "{c:?}");
    }

    #[test]
    fn drafting_goes_on_while_the_chain_is_likely_and_looks_past_a_dear_row() {
        // A pass of r rows costs 1 + 0.1 (r - 1), a draft pass 0.3: one more draft token pays when its chance of
        // being used is above ~0.4 × the step's tokens per unit of time.
        let costs = PassCosts { target: vec![(1, 1.0), (17, 2.6)], draft_s: 0.3 };
        // After 2 sure drafts (expected 1 + 0.99 + 0.98 tokens from 3 rows and 2 draft passes): go on.
        assert!(draft_more(&costs, 2.97, 3, 2, 2, 0.98, 0.99, 6));
        // The second draft was unsure: its chain is 0.2, and so is the next token's chance.
        assert!(!draft_more(&costs, 2.19, 3, 2, 2, 0.2, 0.2, 6));
        // Nothing more may be drafted.
        assert!(!draft_more(&costs, 2.97, 3, 2, 2, 0.98, 0.99, 0));
        // The next row is dear (it crosses to another kernel) but the ones after it are free: one token alone
        // would not pay, three do.
        let steep = PassCosts { target: vec![(1, 1.0), (3, 1.2), (4, 2.0), (8, 2.0)], draft_s: 0.05 };
        assert!(draft_more(&steep, 2.97, 3, 2, 2, 0.98, 0.99, 4));
        assert!(!draft_more(&steep, 2.97, 3, 2, 2, 0.98, 0.99, 1));
    }

    #[test]
    fn guided_yield_is_judged_after_a_few_verifications() {
        let costs = PassCosts { target: vec![(1, 1.0), (17, 2.6)], draft_s: 0.3 };
        let mut y = GuidedYield::default();
        y.update(6, 5);
        y.update(6, 5);
        let speed = |y: &GuidedYield| y.means().map(|(t, d)| costs.yield_speed(costs.draft_s, t, d));
        assert_eq!(speed(&y), None);
        y.update(6, 5);
        // 6 tokens from a pass of 6 rows (1.5) and 5 draft passes (1.5).
        assert!((speed(&y).expect("seen 3") - 2.0).abs() < 1e-9, "{y:?}");
        // Recent verifications count most.
        for _ in 0..20 {
            y.update(1, 1);
        }
        assert!(speed(&y).expect("seen") < 1.0 / 1.1 + 0.05, "{y:?}");
    }

    #[test]
    fn ngram_acceptance_is_kept_per_match_length() {
        let toks = [1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3];
        assert_eq!(ngram_match(&toks, 2, 3, 3), (vec![4, 9, 2], 3));
        assert_eq!(ngram_match(&toks, 2, 2, 3), (vec![5, 1, 2], 2));
        assert_eq!(ngram_match(&[7, 8], 2, 4, 3), (vec![], 0));
        let mut a = NgramAcceptance::new();
        let (short, long) = (a.rate(2), a.rate(4));
        for _ in 0..20 {
            a.update(4, 8, 8);
            a.update(2, 4, 0);
        }
        assert!(a.rate(4) > 0.95 && a.rate(6) == a.rate(4), "{a:?}");
        assert!(a.rate(2) < 0.1, "{a:?}");
        assert!(a.rate(3) == NgramAcceptance::new().rate(3) && short < long);
    }

    #[test]
    fn ngram_finds_latest_longest_match() {
        //                0  1  2  3  4  5  6  7  8  9
        let toks = [1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3];
        // Suffix [1,2,3] (n=3) occurs at 0 → continuation 4, 9, 2.
        assert_eq!(ngram_propose(&toks, 2, 3, 3), vec![4, 9, 2]);
        // Limited to n=2: suffix [2,3] latest earlier occurrence at 5 → 5, 1, 2.
        assert_eq!(ngram_propose(&toks, 2, 2, 3), vec![5, 1, 2]);
        assert_eq!(ngram_propose(&[7, 8, 9], 2, 4, 3), Vec::<u32>::new());
        assert_eq!(ngram_propose(&[], 2, 4, 3), Vec::<u32>::new());
        // Continuation runs up to the end of the sequence.
        assert_eq!(ngram_propose(&[5, 6, 5, 6], 2, 2, 8), vec![5, 6]);
    }

    #[test]
    fn calibration_keeps_the_fastest_timing_and_never_falls_with_rows() {
        // Round 2 of 4 rows hit a burst of other work; the 4-row point was slow in every round.
        let timings = vec![
            (1, vec![1.0, 1.3, 1.0]),
            (2, vec![1.1, 1.2, 1.15]),
            (4, vec![2.5, 2.0, 2.2]),
            (5, vec![1.6, 1.7, 1.65]),
        ];
        let costs = PassCosts::from_timings(&timings, &[0.4, 0.3, 0.9]);
        let points: Vec<(usize, f64)> = costs.target.clone();
        assert_eq!(points, vec![(1, 1.0), (2, 1.1), (4, 1.6), (5, 1.6)]);
        assert_eq!(costs.draft_s, 0.3);
        // Before the fix a draft pass of 0.48 and a 4-row pass of 1.68 (one noisy run) made drafting never pay at
        // the prior acceptance; with the costs cleaned it does.
        assert!(costs.best_depth(costs.draft_s, 0.8, 8) >= 1);
    }

    #[test]
    fn depth_follows_acceptance_and_cost() {
        // Verify of k+1 rows costs 1 + 0.1 k; drafts cost 0.3 each.
        let costs = PassCosts { target: vec![(1, 1.0), (17, 2.6)], draft_s: 0.3 };
        assert!((costs.target(5) - 1.4).abs() < 1e-12);
        assert_eq!(costs.best_depth(0.0, 0.0, 8), 0);
        assert!(costs.best_depth(0.0, 0.9, 8) >= 6);
        // A draft model with low acceptance does not pay.
        assert_eq!(costs.best_depth(costs.draft_s, 0.2, 8), 0);
        assert!(costs.best_depth(costs.draft_s, 0.8, 8) >= 2);
        assert!((expected_tokens(0.5, 2) - 1.75).abs() < 1e-12);
    }

    /// Total-variation distance between the empirical distribution of `f`'s output and `want`.
    fn tv(counts: &[u64], want: &[f64]) -> f64 {
        let n: u64 = counts.iter().sum();
        counts.iter().zip(want).map(|(&c, &w)| (c as f64 / n as f64 - w).abs()).sum::<f64>() / 2.0
    }

    #[test]
    fn rejection_sampling_is_exact() {
        let p = [(0u32, 0.5), (1, 0.3), (2, 0.15), (3, 0.05)];
        let q = [(0u32, 0.1), (1, 0.6), (2, 0.05), (3, 0.25)];
        let want: Vec<f64> = p.iter().map(|x| x.1).collect();
        let n = 400_000;
        let mut s = Sampler::new(SamplingParams { seed: Some(11), ..Default::default() });
        // Draft sampled from q.
        let mut counts = [0u64; 4];
        let mut accepted = 0;
        for _ in 0..n {
            let d = s.draw(&q);
            let (t, ok) = verify_sampled(&mut s, &p, Some(&q), d);
            counts[t as usize] += 1;
            accepted += u64::from(ok);
        }
        assert!(tv(&counts, &want) < 0.004, "{counts:?}");
        // Acceptance rate is Σ min(p, q) = 0.1 + 0.3 + 0.05 + 0.05 = 0.5.
        assert!((accepted as f64 / n as f64 - 0.5).abs() < 0.005);
        // Deterministic proposals of every token (n-gram): the output still follows p.
        for d in 0..4u32 {
            let mut counts = [0u64; 4];
            for _ in 0..n / 4 {
                counts[verify_sampled(&mut s, &p, None, d).0 as usize] += 1;
            }
            assert!(tv(&counts, &want) < 0.006, "draft {d}: {counts:?}");
        }
        // A draft whose output head covers only ids 0 and 1 (`draft_vocab`): q is 0 on the rest, which the residual
        // max(0, p - q) covers; the output still follows p.
        let q_narrow = [(0u32, 0.7), (1, 0.3)];
        let mut counts = [0u64; 4];
        for _ in 0..n {
            let d = s.draw(&q_narrow);
            counts[verify_sampled(&mut s, &p, Some(&q_narrow), d).0 as usize] += 1;
        }
        assert!(tv(&counts, &want) < 0.004, "narrow draft head: {counts:?}");
        // A draft outside p's support is always rejected.
        let p2 = [(0u32, 1.0), (1, 3.0)];
        for _ in 0..1000 {
            let (t, ok) = verify_sampled(&mut s, &p2, None, 7);
            assert!(!ok && t < 2);
        }
    }
}
