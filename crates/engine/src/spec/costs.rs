//! The cost model the depth chooser reads: an estimate per target row count and one per draft pass of each
//! proposer that runs passes of its own (its cost track; the draft model's is the calibration's `draft_s`), that
//! keeps being measured.
//!
//! A calibration (measured at start, or the estimates a previous run saved) is only the prior. Every pass the engine
//! runs is one observation of its row count; after [`TRUSTED_SAMPLES`] observations a count's estimate is the median
//! of its last [`WINDOW`] observations, whatever the prior said, so a machine that really is slower is measured as
//! slower, and a calibration taken during a busy minute is replaced by what the machine does now. Before that, fewer
//! observations may only lower the prior (other work on the machine only ever slows a pass, so one fast pass proves
//! the prior too high; one slow pass proves nothing). The chooser only runs the passes it picks, so the model also
//! says which row count is due to be measured ([`CostModel::explore_rows`]): each count the chooser may use is timed
//! a few times soon after start and again whenever its last timing grows old, and the engine pads one step's drafts
//! to that many rows to time it.

use super::PassCosts;

/// Observations of one row count kept for its median.
pub const WINDOW: usize = 7;
/// Observations after which a count's estimate is its own median, the prior no longer counts.
pub const TRUSTED_SAMPLES: u32 = 3;
/// While a count has fewer than [`TRUSTED_SAMPLES`] observations, one decoding pass in this many may explore it.
pub const BOOTSTRAP_GAP: u64 = 4;
/// A count last observed this many passes ago is stale and measured again, at most once per [`EXPLORE_GAP`] passes.
pub const STALE_PASSES: u64 = 512;
pub const EXPLORE_GAP: u64 = 64;

/// What the chooser uses for one pass shape, and how it was learned (for /status, /metrics and `--stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CostPoint {
    /// Target rows (0 for a proposer's draft pass).
    pub rows: usize,
    /// The estimate in use, in seconds.
    pub secs: f64,
    /// What the calibration (or the saved estimates) said.
    pub prior_secs: f64,
    /// Passes observed since the engine started.
    pub samples: u64,
    /// Unix time (seconds) of the last observation, else of the prior's measurement; 0 when unknown.
    pub measured_unix: f64,
}

/// The first [`CostsView::MAX_POINTS`] target estimates (rows ascending) and each proposer's draft pass (by name), in
/// a `Copy` value that travels with the engine's counters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostsView {
    pub target: [CostPoint; CostsView::MAX_POINTS],
    pub num_target: usize,
    /// The proposers that run passes and are present (the draft model when the engine has one).
    pub passes: [(&'static str, CostPoint); CostsView::MAX_PROPOSERS],
    pub num_passes: usize,
    /// Passes padded to time a row count the chooser would not have run ([`CostModel::explore_rows`]).
    pub explored_passes: u64,
}

impl CostsView {
    pub const MAX_POINTS: usize = 24;
    pub const MAX_PROPOSERS: usize = 8;

    pub fn target_points(&self) -> &[CostPoint] {
        &self.target[..self.num_target]
    }

    /// Each proposer's draft pass cost, by name.
    pub fn pass_points(&self) -> &[(&'static str, CostPoint)] {
        &self.passes[..self.num_passes]
    }

    /// The draft model's, when the engine has one.
    pub fn draft(&self) -> Option<&CostPoint> {
        self.pass_points().iter().find(|p| p.0 == DRAFT).map(|p| &p.1)
    }
}

impl Default for CostsView {
    fn default() -> Self {
        CostsView {
            target: [CostPoint::default(); Self::MAX_POINTS],
            num_target: 0,
            passes: [("", CostPoint::default()); Self::MAX_PROPOSERS],
            num_passes: 0,
            explored_passes: 0,
        }
    }
}

/// The draft model's track: the calibration's `draft_s`.
const DRAFT: &str = "draft";

/// One row count's prior and recent observations.
#[derive(Debug, Clone)]
struct Track {
    rows: usize,
    prior: f64,
    prior_unix: f64,
    window: [f64; WINDOW],
    next: usize,
    samples: u64,
    /// `CostModel::passes` at the last observation.
    last_pass: u64,
    last_unix: f64,
}

impl Track {
    fn new(rows: usize, prior: f64, prior_unix: f64) -> Self {
        Track { rows, prior, prior_unix, window: [0.0; WINDOW], next: 0, samples: 0, last_pass: 0, last_unix: 0.0 }
    }

    fn observe(&mut self, secs: f64, pass: u64, unix: f64) {
        self.window[self.next] = secs;
        self.next = (self.next + 1) % WINDOW;
        self.samples += 1;
        self.last_pass = pass;
        self.last_unix = unix;
    }

    fn estimate(&self) -> f64 {
        let n = (self.samples as usize).min(WINDOW);
        if n == 0 {
            return self.prior;
        }
        let mut w: Vec<f64> = self.window[..n].to_vec();
        w.sort_by(f64::total_cmp);
        if self.samples >= u64::from(TRUSTED_SAMPLES) {
            return if n % 2 == 1 { w[n / 2] } else { (w[n / 2 - 1] + w[n / 2]) / 2.0 };
        }
        // Not yet trusted: only evidence that the prior is too high counts (all observations below it).
        let highest = w[n - 1];
        if self.prior > 0.0 { self.prior.min(highest) } else { highest }
    }

    fn point(&self) -> CostPoint {
        CostPoint {
            rows: self.rows,
            secs: self.estimate(),
            prior_secs: self.prior,
            samples: self.samples,
            measured_unix: if self.samples > 0 { self.last_unix } else { self.prior_unix },
        }
    }
}

/// The live cost model; see the module docs.
#[derive(Debug, Clone)]
pub struct CostModel {
    target: Vec<Track>,
    /// Per proposer that runs passes, by name; the draft model's first.
    tracks: Vec<(&'static str, Track)>,
    /// Decoding target passes observed (the model's clock for staleness).
    passes: u64,
    last_explore: u64,
    explored: u64,
    /// The estimates as the chooser reads them, rebuilt after each observation.
    current: PassCosts,
}

impl CostModel {
    /// A model whose prior is `costs`, measured at `prior_unix` (0 when unknown).
    pub fn new(costs: &PassCosts, prior_unix: f64) -> Self {
        let target = costs.target.iter().map(|&(r, t)| Track::new(r, t, prior_unix)).collect();
        let mut m = CostModel {
            target,
            tracks: vec![(DRAFT, Track::new(0, costs.draft_s, prior_unix))],
            passes: 0,
            last_explore: 0,
            explored: 0,
            current: costs.clone(),
        };
        m.rebuild();
        m
    }

    /// The estimates in use.
    pub fn costs(&self) -> &PassCosts {
        &self.current
    }

    /// Folds in a target pass of `rows` rows (of decoding sequences only) that took `secs`, at Unix time `unix`.
    pub fn observe_target(&mut self, rows: usize, secs: f64, unix: f64) {
        if rows == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        self.passes += 1;
        let i = match self.target.binary_search_by_key(&rows, |t| t.rows) {
            Ok(i) => i,
            Err(i) => {
                let prior = self.current.target(rows);
                self.target.insert(i, Track::new(rows, prior, 0.0));
                i
            }
        };
        self.target[i].observe(secs, self.passes, unix);
        self.rebuild();
    }

    /// Gives proposer `name` a cost track starting from `prior_s` seconds per draft pass (0: unknown, its first
    /// timing decides), unless it has one.
    pub fn add_proposer(&mut self, name: &'static str, prior_s: f64) {
        if !self.tracks.iter().any(|p| p.0 == name) {
            self.tracks.push((name, Track::new(0, prior_s, 0.0)));
        }
    }

    fn track(&self, name: &str) -> Option<&Track> {
        self.tracks.iter().find(|p| p.0 == name).map(|p| &p.1)
    }

    /// Folds in the time of one draft pass of proposer `name` (one that [`Self::add_proposer`] gave a track, or the
    /// draft model).
    pub fn observe_pass(&mut self, name: &str, secs: f64, unix: f64) {
        let passes = self.passes;
        if let Some(t) = self.tracks.iter_mut().find(|p| p.0 == name).filter(|_| secs.is_finite() && secs > 0.0) {
            t.1.observe(secs, passes, unix);
            self.rebuild();
        }
    }

    /// Folds in the time of one draft pass of the draft model.
    pub fn observe_draft(&mut self, secs: f64, unix: f64) {
        self.observe_pass(DRAFT, secs, unix);
    }

    /// Proposer `name`'s cost per draft pass in use (0 for one without a track).
    pub fn pass_s(&self, name: &str) -> f64 {
        self.track(name).map_or(0.0, Track::estimate)
    }

    /// What the calibration (or the proposer's prior) says `name`'s draft pass costs.
    pub fn prior_pass_s(&self, name: &str) -> f64 {
        self.track(name).map_or(0.0, |t| t.prior)
    }

    /// Whether `name`'s cost still rests on fewer than [`TRUSTED_SAMPLES`] observations.
    pub fn unconfirmed(&self, name: &str) -> bool {
        self.track(name).is_some_and(|t| t.samples < u64::from(TRUSTED_SAMPLES))
    }

    /// Whether the draft pass's cost still rests on fewer than [`TRUSTED_SAMPLES`] observations.
    pub fn draft_unconfirmed(&self) -> bool {
        self.unconfirmed(DRAFT)
    }

    /// The row count to time in the coming step, if one is due: a step of `rows_now` rows that may grow by at most
    /// `max_extra` rows (padding one sequence's drafts). Counts with fewer than [`TRUSTED_SAMPLES`] observations are
    /// due every [`BOOTSTRAP_GAP`] passes, counts last timed [`STALE_PASSES`] ago every [`EXPLORE_GAP`]; the one
    /// with the fewest observations goes first, then the longest unobserved.
    pub fn explore_rows(&self, rows_now: usize, max_extra: usize) -> Option<usize> {
        let since = self.passes.saturating_sub(self.last_explore);
        self.target
            .iter()
            .filter(|t| t.rows > rows_now && t.rows <= rows_now + max_extra)
            .filter(|t| {
                if t.samples < u64::from(TRUSTED_SAMPLES) {
                    since >= BOOTSTRAP_GAP
                } else {
                    since >= EXPLORE_GAP && self.passes - t.last_pass >= STALE_PASSES
                }
            })
            .min_by_key(|t| (t.samples.min(u64::from(TRUSTED_SAMPLES)), t.last_pass))
            .map(|t| t.rows)
    }

    /// Records that the coming step was padded to time a row count.
    pub fn explored(&mut self) {
        self.last_explore = self.passes;
        self.explored += 1;
    }

    /// The estimates and how they were learned.
    pub fn view(&self, has_draft: bool) -> CostsView {
        let mut v = CostsView { explored_passes: self.explored, ..CostsView::default() };
        for (slot, t) in v.target.iter_mut().zip(&self.target) {
            *slot = t.point();
            v.num_target += 1;
        }
        // The estimates in use after the shape repair below.
        for p in &mut v.target[..v.num_target] {
            p.secs = self.current.target(p.rows);
        }
        for (name, t) in self.tracks.iter().filter(|p| has_draft || p.0 != DRAFT).take(CostsView::MAX_PROPOSERS) {
            v.passes[v.num_passes] = (name, t.point());
            v.num_passes += 1;
        }
        v
    }

    /// Rebuilds the estimates the chooser reads from each count's own, repaired by what holds for any machine: a
    /// pass over more rows does all the work of one over fewer. So a count timed cheaper proves every smaller
    /// count's estimate too high (it is lowered to that timing), and a trusted count proves every larger count
    /// that has no trusted estimate of its own too low (it is raised to it). Priors alone repair nothing.
    fn rebuild(&mut self) {
        let trusted = |t: &Track| t.samples >= u64::from(TRUSTED_SAMPLES);
        let mut target: Vec<(usize, f64)> = self.target.iter().map(|t| (t.rows, t.estimate())).collect();
        let mut floor = 0.0f64;
        for (p, t) in target.iter_mut().zip(&self.target) {
            if trusted(t) {
                floor = floor.max(p.1);
            } else {
                p.1 = p.1.max(floor);
            }
        }
        let mut ceiling = f64::INFINITY;
        for (p, t) in target.iter_mut().zip(&self.target).rev() {
            p.1 = p.1.min(ceiling);
            if t.samples > 0 {
                ceiling = ceiling.min(p.1);
            }
        }
        self.current = PassCosts { target, draft_s: self.pass_s(DRAFT) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prior() -> PassCosts {
        PassCosts { target: vec![(1, 1.0), (2, 4.0), (5, 6.0), (9, 8.0)], draft_s: 1.2 }
    }

    #[test]
    fn a_prior_falls_at_once_but_rises_only_on_repeated_evidence() {
        let mut m = CostModel::new(&prior(), 0.0);
        // One fast pass of 9 rows: the 9-row prior was too high, and so were the smaller counts above it.
        m.observe_target(9, 1.8, 1.0);
        assert_eq!(m.costs().target(9), 1.8);
        assert_eq!(m.costs().target(5), 1.8);
        assert_eq!(m.costs().target(1), 1.0);
        // One slow single-row pass moves nothing; three do (the median of what was seen).
        m.observe_target(1, 5.0, 2.0);
        assert_eq!(m.costs().target(1), 1.0);
        m.observe_target(1, 1.5, 3.0);
        assert_eq!(m.costs().target(1), 1.0);
        m.observe_target(1, 1.6, 4.0);
        assert_eq!(m.costs().target(1), 1.6);
        // The draft: the same rules.
        m.observe_draft(0.3, 5.0);
        assert_eq!(m.costs().draft_s, 0.3);
        assert!(m.draft_unconfirmed());
        for _ in 0..WINDOW {
            m.observe_draft(2.0, 6.0);
        }
        assert_eq!(m.costs().draft_s, 2.0, "a draft that really is slow is measured as slow");
        assert!(!m.draft_unconfirmed());
        // A one-off burst does not move a trusted estimate.
        m.observe_draft(50.0, 7.0);
        assert_eq!(m.costs().draft_s, 2.0);
        // Nonsense is ignored.
        let before = m.costs().clone();
        m.observe_target(0, 1.0, 8.0);
        m.observe_target(3, f64::NAN, 8.0);
        m.observe_draft(-1.0, 8.0);
        assert_eq!(m.costs().target, before.target);
        let v = m.view(true);
        assert_eq!(v.target_points().iter().map(|p| p.rows).collect::<Vec<_>>(), vec![1, 2, 5, 9]);
        assert_eq!(v.target_points()[0].samples, 3);
        assert_eq!(v.target_points()[0].measured_unix, 4.0);
        assert_eq!(v.draft().expect("has a draft").samples, WINDOW as u64 + 2);
        // Another proposer's track: unknown until timed, then its own.
        m.add_proposer("mtp", 0.0);
        assert_eq!((m.pass_s("mtp"), m.unconfirmed("mtp")), (0.0, true));
        m.observe_pass("mtp", 0.01, 9.0);
        assert_eq!(m.pass_s("mtp"), 0.01);
        assert_eq!(m.costs().draft_s, 2.0, "the draft's own track is untouched");
        assert_eq!(m.view(true).pass_points().iter().map(|p| p.0).collect::<Vec<_>>(), vec!["draft", "mtp"]);
    }

    #[test]
    fn every_count_is_timed_soon_and_again_when_stale() {
        let mut m = CostModel::new(&prior(), 0.0);
        // Nothing is due before BOOTSTRAP_GAP passes.
        assert_eq!(m.explore_rows(1, 8), None);
        let mut timed = Vec::new();
        for _ in 0..200 {
            if let Some(r) = m.explore_rows(1, 8) {
                m.explored();
                m.observe_target(r, 1.0, 0.0);
                timed.push(r);
            } else {
                m.observe_target(1, 1.0, 0.0);
            }
        }
        // Each count the step can reach is timed TRUSTED_SAMPLES times, in turn, then no more while fresh.
        let want = 3 * TRUSTED_SAMPLES as usize;
        assert_eq!(timed.len(), want, "{timed:?}");
        assert_eq!(&timed[..3], &[2, 5, 9]);
        // Beyond the step's reach nothing is due.
        assert_eq!(m.explore_rows(9, 8), None);
        for _ in 0..STALE_PASSES {
            m.observe_target(1, 1.0, 0.0);
        }
        assert_eq!(m.explore_rows(1, 8), Some(2), "stale again");
        m.explored();
        assert_eq!(m.explore_rows(1, 8), None, "one exploration per EXPLORE_GAP passes");
        assert_eq!(m.view(false).explored_passes, want as u64 + 1);
        assert!(m.view(false).draft().is_none());
    }
}
