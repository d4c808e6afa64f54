//! The proposer interface: what a source of draft tokens tells the engine, and what the engine gives it.
//!
//! Each step the engine asks every proposer what it can offer each decoding sequence ([`Proposer::offer`]: how many
//! tokens, at what measured acceptance), picks the fastest offer per sequence, lets the cost model settle the depths
//! of the whole step, then has the chosen proposers draft, batched: one [`Proposer::propose`] call per proposer
//! with every sequence it drafts for, so a draft model runs one pass per draft position for all of them. The target
//! verifies as before (greedy: the longest prefix equal to its own picks; sampled: exact rejection sampling against
//! the draft probabilities a proposal carries), and each proposer hears how its proposal (or its untaken offer) did
//! ([`Proposer::verified`]). A proposer that drafts from the target's own states (an MTP head, a block drafter)
//! names the layers it reads ([`Proposer::hidden_layers`]); the engine asks the target runner to keep those rows
//! ([`models::Runner::set_hidden_layers`]) and hands each sequence's rows of the last pass to the proposer.
//!
//! A proposer that runs passes of its own reports their times; they are its cost track in the
//! [`super::CostModel`], which the depth chooser reads as the price of each of its draft positions.

use models::SeqId;

use super::{PassCosts, SpecConfig};
use crate::sampler::Sampler;

/// What a proposer sees of one decoding sequence.
pub struct SeqView<'a> {
    pub seq: SeqId,
    /// Prompt and output so far; the last token is the pending one (the target has not computed it yet).
    pub tokens: &'a [u32],
    pub num_prompt_tokens: usize,
    pub sampler: &'a Sampler,
    /// Whether the step may trim the depth it is offered (not for seeded sampling, whose depth may not depend on
    /// timings or on other sequences).
    pub adjustable: bool,
    /// The target's hidden rows of this sequence from its last pass (empty before the first, or when no proposer
    /// asked for any).
    pub hidden: Hidden<'a>,
}

/// The target's hidden rows of one sequence's tokens that its last pass computed and kept (accepted), for the layers
/// the engine's proposers asked for together.
#[derive(Clone, Copy, Default)]
pub struct Hidden<'a> {
    /// The layers, in the order of `rows`.
    pub layers: &'a [usize],
    /// `[layers][num_rows][width]`.
    pub rows: &'a [f32],
    pub num_rows: usize,
    pub width: usize,
    /// Position in the sequence of the first row.
    pub first_pos: usize,
}

impl<'a> Hidden<'a> {
    /// The rows after `layer`, `[num_rows][width]`; `None` when that layer's were not kept.
    pub fn layer(&self, layer: usize) -> Option<&'a [f32]> {
        let i = self.layers.iter().position(|&l| l == layer)?;
        let n = self.num_rows * self.width;
        self.rows.get(i * n..(i + 1) * n)
    }
}

/// What a proposer can propose for a sequence now, as the chooser needs it.
#[derive(Debug, Clone, Default)]
pub struct Offer {
    /// The draft tokens when they are known before drafting (prompt lookup); empty when they come from
    /// [`Proposer::propose`].
    pub tokens: Vec<u32>,
    /// The most tokens it may propose (`tokens.len()` when they are known).
    pub max_k: usize,
    /// The chance that a draft token is accepted given the ones before it were, measured for this sequence.
    pub rate: f64,
    /// What this sequence's verifications of its drafts yielded, when the rate alone would misjudge them (drafts
    /// whose depth follows the proposer's confidence): mean tokens produced and drafts verified per verification.
    pub yields: Option<(f64, f64)>,
    /// The depth follows the proposer's confidence as it drafts ([`Draft::guided`]): the chooser only decides
    /// whether it drafts at all.
    pub guided: bool,
    /// Due for a probe: its rate would not pay, but it has not proposed for a while and the rate may be stale, so it
    /// proposes [`Offer::max_k`] tokens anyway where nothing else proposes.
    pub probe: bool,
}

/// One sequence's draft for [`Proposer::propose`] to fill in.
pub struct Draft<'a> {
    pub seq: SeqId,
    /// Prompt and output so far (the last is pending).
    pub tokens: &'a [u32],
    /// The sequence's sampler: a draft for a sampled request samples from its own distribution with it and returns
    /// those probabilities, for exact rejection sampling.
    pub sampler: &'a mut Sampler,
    pub hidden: Hidden<'a>,
    /// The most tokens to draft, and the acceptance the chooser counted them at.
    pub k: usize,
    pub rate: f64,
    /// Stop early where one more token would not pay for the step ([`StepPlan`]).
    pub guided: bool,
    /// Filled in: the draft tokens, and per token the draft's sampling weights when it was sampled (`None` for a
    /// deterministic proposal).
    pub out: Vec<u32>,
    pub weights: Vec<Option<Vec<(u32, f64)>>>,
}

/// The step a guided draft is part of: whether one more draft token pays depends on everything else in it.
pub struct StepPlan<'a> {
    /// The target pass costs the chooser uses, with this proposer's cost per draft pass as `draft_s`.
    pub costs: &'a PassCosts,
    /// Expected tokens and target rows of the step without this proposer's drafts.
    pub expected: f64,
    pub rows: usize,
    /// Seconds on the engine's clock, to time passes with.
    pub clock: &'a (dyn Fn() -> f64 + Send + Sync),
}

/// How a proposal, or an offer that was not taken, fared.
pub struct Verified<'a> {
    /// Its proposal was the one verified.
    pub chosen: bool,
    /// Another proposer's proposal was verified: an untaken offer with tokens can be compared with the output.
    pub others: bool,
    /// The chosen proposal was a probe ([`Offer::probe`]).
    pub probe: bool,
    /// Drafts of the proposal (its own, padding excluded) and how many the target accepted.
    pub proposed: usize,
    pub accepted: usize,
    /// A draft was rejected (rather than the request ending).
    pub rejected: bool,
    /// The tokens the step produced for the sequence.
    pub output: &'a [u32],
    pub greedy: bool,
    /// Whether drafting from this proposer pays at all at a high acceptance with the costs in use (a probe that
    /// cannot pay backs off further).
    pub pays: bool,
}

/// A source of draft tokens; see the module docs.
pub trait Proposer: Send {
    /// Its name in statistics and metrics ("ngram", "draft", ...).
    fn name(&self) -> &'static str;

    /// Layers of the target whose hidden rows it reads; none by default.
    fn hidden_layers(&self) -> &[usize] {
        &[]
    }

    /// Whether its proposals cost passes of its own (timed into its cost track); prompt lookup's cost nothing.
    fn runs_passes(&self) -> bool {
        true
    }

    /// A sequence is admitted with `prompt`, of which the target reuses `cached` tokens from its prefix cache.
    /// `constrained`: its output is under an awake constraint (no drafts while it is).
    fn admit(&mut self, _seq: SeqId, _prompt: &[u32], _cached: usize, _cfg: &SpecConfig, _constrained: bool) {}

    /// Whether it may ever propose for `seq` (whose next steps may then change shape).
    fn proposes_for(&self, _seq: SeqId, _cfg: &SpecConfig) -> bool {
        true
    }

    /// What it offers `s` now, at most `max_k` tokens; `None` when nothing.
    fn offer(&mut self, s: &SeqView<'_>, max_k: usize, cfg: &SpecConfig) -> Option<Offer>;

    /// Drafts for several sequences at once; returns the seconds of each pass that measures its cost per draft
    /// position (passes of one row per sequence; a catch-up pass over many unseen tokens does not).
    fn propose(&mut self, drafts: &mut [Draft<'_>], plan: &StepPlan<'_>) -> models::Result<Vec<f64>>;

    /// The target computes prompt tokens this step: per sequence, its tokens and how many of them the target holds
    /// after this step. A draft model keeps up.
    fn prefill(&mut self, _chunks: &[(SeqId, &[u32], usize)]) -> models::Result<()> {
        Ok(())
    }

    /// How its proposal (or untaken offer) for `seq` fared.
    fn verified(&mut self, seq: SeqId, v: &Verified<'_>);

    /// The sequence keeps only its first `len` tokens (rejected drafts rolled back).
    fn truncate(&mut self, _seq: SeqId, _len: usize) {}

    /// The sequence is gone.
    fn release(&mut self, _seq: SeqId) {}

    /// Background work while no request runs; true if more remains.
    fn idle_work(&mut self) -> bool {
        false
    }
}

/// The engine's proposers, by slot: prompt lookup, the draft model (when there is one), then any added.
pub(crate) struct Proposers<R: models::Runner> {
    pub(crate) ngram: super::NgramProposer,
    pub(crate) draft: Option<super::DraftModel<R>>,
    pub(crate) extra: Vec<Box<dyn Proposer>>,
}

impl<R: models::Runner> Proposers<R> {
    pub(crate) fn new() -> Self {
        Proposers { ngram: super::NgramProposer::default(), draft: None, extra: Vec::new() }
    }

    /// The number of slots (some may be empty).
    pub(crate) fn len(&self) -> usize {
        2 + self.extra.len()
    }

    pub(crate) fn get(&self, slot: usize) -> Option<&dyn Proposer> {
        match slot {
            0 => Some(&self.ngram),
            1 => self.draft.as_ref().map(|d| d as &dyn Proposer),
            i => self.extra.get(i - 2).map(|p| p.as_ref()),
        }
    }

    pub(crate) fn get_mut(&mut self, slot: usize) -> Option<&mut dyn Proposer> {
        match slot {
            0 => Some(&mut self.ngram),
            1 => self.draft.as_mut().map(|d| d as &mut dyn Proposer),
            i => self.extra.get_mut(i - 2).map(|p| p.as_mut() as &mut dyn Proposer),
        }
    }
}
