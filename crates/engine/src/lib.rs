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
pub mod spec;
mod stop;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::sync::Arc;
use std::time::Instant;

use models::{Batch, LogitsWanted, NextStep, Runner, SeqChunk, SeqId};
use tokenizer::{Detokenizer, Tokenizer};

pub use models::KvUsage;
pub use models::kv_cache::BLOCK_TOKENS as KV_BLOCK_TOKENS;
pub use request::{Event, FinishReason, GenerateRequest, RequestId, TokenConstraint, TokenLogprobs, Usage};
pub use sampler::{Sampler, SamplingParams};
pub use spec::SpecConfig;
pub use stop::StopStrings;

use spec::proposer::Proposers;
use spec::{CostModel, Draft, DraftModel, Hidden, PassCosts, Proposer, SeqView, StepPlan, Verified};

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
    /// Speculative decoding (its proposers: n-gram, the draft model, and any added).
    pub spec: SpecConfig,
    /// Sample from each row's largest logits when that decides the pick exactly (top-k sampling without
    /// log-probabilities or an awake constraint): a GPU runner then selects them on the device and copies back a few
    /// hundred bytes per row instead of the row. Off: every sampled row comes back whole (the same tokens).
    /// Default on; `SPLASH_SAMPLE_CANDIDATES=0` turns it off.
    pub sample_on_candidates: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch_tokens: 512,
            max_prefill_tokens_while_decoding: 128,
            spec: SpecConfig::default(),
            sample_on_candidates: std::env::var("SPLASH_SAMPLE_CANDIDATES").map_or(true, |v| v != "0"),
        }
    }
}

/// Counters of speculative decoding since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecStats {
    /// Target passes of decoding sequences (one per sequence per step), and the tokens they produced.
    pub decode_passes: u64,
    pub decode_tokens: u64,
    /// Draft tokens proposed and accepted, by proposer (see [`SpecStats::proposers`]).
    pub by_proposer: [ProposerStats; spec::CostsView::MAX_PROPOSERS],
    pub num_proposers: usize,
    /// Depth chosen in the last step, averaged over its decoding sequences.
    pub last_depth: f64,
    /// Wall time of steps, split into draft-model passes (drafting and prompt catch-up), target passes, and the
    /// rest (scheduling, sampling and verification), in seconds.
    pub draft_s: f64,
    pub target_s: f64,
    pub other_s: f64,
    /// The pass costs the depth chooser is using, and when and how often each was measured.
    pub costs: spec::CostsView,
}

/// One proposer's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProposerStats {
    pub name: &'static str,
    /// Draft tokens proposed (padding that times a pass excluded) and accepted.
    pub proposed: u64,
    pub accepted: u64,
}

impl SpecStats {
    /// Each proposer the engine has (prompt lookup, the draft model when there is one, any added), in order.
    pub fn proposers(&self) -> &[ProposerStats] {
        &self.by_proposer[..self.num_proposers]
    }

    /// The counts of the proposer called `name` (zeros when there is none).
    pub fn of(&self, name: &str) -> ProposerStats {
        self.proposers().iter().copied().find(|p| p.name == name).unwrap_or_default()
    }

    /// Draft tokens proposed and accepted, all proposers together.
    pub fn proposed(&self) -> u64 {
        self.proposers().iter().map(|p| p.proposed).sum()
    }

    pub fn accepted(&self) -> u64 {
        self.proposers().iter().map(|p| p.accepted).sum()
    }

    pub fn acceptance_rate(&self) -> f64 {
        self.accepted() as f64 / self.proposed().max(1) as f64
    }

    pub fn tokens_per_pass(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_passes.max(1) as f64
    }
}

struct Sequence {
    id: RequestId,
    /// Prompt followed by generated tokens.
    tokens: Vec<u32>,
    num_prompt_tokens: usize,
    /// Tokens whose KV the runner holds.
    num_computed_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    num_cached_tokens: usize,
    max_tokens: usize,
    sampler: Sampler,
    constraint: Option<Box<dyn TokenConstraint>>,
    detok: Detokenizer<Arc<Tokenizer>>,
    stops: StopStrings,
    stop_tokens: Vec<u32>,
    ignore_eos: bool,
    /// Text released so far.
    text: String,
    /// The target's hidden rows of this sequence's tokens that its last pass computed and kept, for the layers the
    /// proposers read (`[layers][rows][hidden]`), and the position of the first.
    hidden: Vec<f32>,
    hidden_pos: usize,
    t_admitted: Instant,
    t_first_token: Option<Instant>,
}

impl Sequence {
    fn num_output_tokens(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }

    fn is_prefill(&self) -> bool {
        self.num_computed_tokens < self.num_prompt_tokens
    }

    /// [`Self::hidden`] as proposers see it, `width` floats per row.
    fn hidden_rows<'a>(&'a self, layers: &'a [usize], width: usize) -> Hidden<'a> {
        hidden_view(&self.hidden, self.hidden_pos, layers, width)
    }

    fn usage(&self) -> Usage {
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
    fn sample(&mut self, logits: &[f32]) -> Result<u32, String> {
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
    fn candidates_wanted(&self, ahead: &[u32]) -> Option<usize> {
        if self.sampler.params.logprobs.is_some() || self.constraint.as_ref().is_some_and(|c| !c.is_dormant()) {
            return None;
        }
        self.sampler.candidates_wanted(&self.tokens, ahead)
    }

    /// [`Self::sample`] from the row's largest logits (asked for with [`Self::candidates_wanted`]).
    fn sample_from_candidates(&mut self, cand: &[(u32, f32)]) -> Result<u32, String> {
        let token = self.sampler.sample_from_candidates(cand, &self.tokens);
        if let Some(c) = self.constraint.as_mut() {
            c.commit(token)?;
        }
        Ok(token)
    }

    /// Appends a generated token; returns its event and, when it ends the request, the `Finished` event.
    fn push_token(
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
    fn finish(&mut self, reason: FinishReason, hit_stop: bool) -> Event {
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

/// A proposer's cost per draft pass as a sequence's depth is chosen (see `Engine::costs_for`): calibrated for
/// seeded sampling, live otherwise; 0 for one that runs no passes.
fn pass_cost(cost_model: &CostModel, p: &dyn Proposer, seeded: bool) -> f64 {
    match (p.runs_passes(), seeded) {
        (false, _) => 0.0,
        (true, true) => cost_model.prior_pass_s(p.name()),
        (true, false) => cost_model.pass_s(p.name()),
    }
}

/// Hidden rows of `layers` (`[layers][rows][width]`, the first at position `first_pos`) as proposers see them.
fn hidden_view<'a>(rows: &'a [f32], first_pos: usize, layers: &'a [usize], width: usize) -> Hidden<'a> {
    let num_rows = if layers.is_empty() || width == 0 { 0 } else { rows.len() / (layers.len() * width) };
    Hidden { layers, rows, num_rows, width, first_pos }
}

/// Log-probability of `token` and the `n` most likely tokens under the raw logits.
fn token_logprobs(logits: &[f32], token: u32, n: usize) -> TokenLogprobs {
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

/// What a decoding sequence sends to the target this step: the proposer (its slot in [`Proposers`]) and its draft
/// tokens (placeholders until it drafts them), with the draft's sampling weights per token when they were sampled.
#[derive(Default)]
struct Proposal {
    proposer: Option<usize>,
    tokens: Vec<u32>,
    weights: Vec<Option<Vec<(u32, f64)>>>,
    /// The proposer's measured acceptance for this sequence.
    rate: f64,
    /// The depth is this sequence's own and the step may not trim it (seeded sampling, see [`Engine::costs_for`],
    /// and probes).
    fixed: bool,
    /// Tokens at the end of `tokens` that pad the pass to a row count the cost model wants timed
    /// ([`Engine::explore`]): verified like any draft, counted for no proposer.
    pad: usize,
    /// A probe of a proposer that its measured acceptance alone would not have chosen ([`spec::Offer::probe`]).
    probe: bool,
    /// A draft whose depth follows the proposer's confidence: `tokens` is the most it may draft, and it stops
    /// earlier when one more token would not pay ([`spec::draft_more`]).
    guided: bool,
}

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

/// Whether greedy steps ask the runner for the argmax (`SPLASH_RUNNER_ARGMAX=0`: always copy the logits, to
/// compare).
fn runner_argmax() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SPLASH_RUNNER_ARGMAX").map_or(true, |v| v != "0"))
}

/// The softmax probability of token `t` in `logits`.
fn token_prob(logits: &[f32], t: u32) -> f32 {
    let (top, p_top) = models::top_prob(logits);
    match logits.get(t as usize) {
        Some(&l) => p_top * (l - logits[top as usize]).exp(),
        None => 0.0,
    }
}

/// Draft tokens of a probe ([`spec::Offer::probe`]): a proposer that has not proposed for a sequence for a while,
/// where nothing else proposes, proposes this many anyway (a step with a proposal from one that runs no passes
/// keeps it, unless the prober's own cost is still unconfirmed).
const PROBE_DEPTH: usize = 2;

/// Live cost estimates go to the cost sink ([`Engine::set_cost_sink`]) after this many observed passes (and when
/// the engine is dropped).
const PERSIST_EVERY: u64 = 256;

/// Seconds on the engine's clock ([`Engine::set_clock`]).
type Clock = Arc<dyn Fn() -> f64 + Send + Sync>;

/// Receives the live cost estimates to keep them for the next start.
type CostSink = Box<dyn FnMut(&PassCosts) + Send>;

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

pub struct Engine<R: Runner> {
    runner: R,
    proposers: Proposers<R>,
    /// The target layers whose hidden rows the proposers read, together.
    hidden_layers: Vec<usize>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    seqs: Vec<Sequence>,
    next_id: u64,
    /// Pass costs as calibrated (or set), and as kept current by the passes since.
    costs: PassCosts,
    cost_model: CostModel,
    /// Times passes for the cost model (a monotonic clock; tests substitute a simulated one).
    clock: Clock,
    cost_sink: Option<CostSink>,
    /// Observations since the cost sink last got the estimates.
    unsaved_observations: u64,
    stats: SpecStats,
}

impl<R: Runner> Engine<R> {
    pub fn new(runner: R, tokenizer: Arc<Tokenizer>, mut config: EngineConfig) -> Self {
        config.max_batch_tokens = config.max_batch_tokens.max(1);
        Engine {
            runner,
            proposers: Proposers::new(),
            hidden_layers: Vec::new(),
            tokenizer,
            config,
            seqs: Vec::new(),
            next_id: 0,
            costs: PassCosts::assumed(),
            cost_model: CostModel::new(&PassCosts::assumed(), 0.0),
            clock: {
                let origin = Instant::now();
                Arc::new(move || origin.elapsed().as_secs_f64())
            },
            cost_sink: None,
            unsaved_observations: 0,
            stats: SpecStats::default(),
        }
    }

    /// Adds a draft model for speculative decoding. It must share the target's vocabulary.
    pub fn set_draft(&mut self, draft: R) -> Result<()> {
        let (t, d) = (self.runner.config().vocab_size, draft.config().vocab_size);
        // Qwen pads its vocabulary differently per size; the tokens both can produce are what matters.
        let shared = t.min(d);
        if shared < self.tokenizer.vocab_size() {
            return Err(Error::InvalidRequest(format!(
                "the draft's vocabulary ({d}) does not cover the tokenizer's ({})",
                self.tokenizer.vocab_size()
            )));
        }
        let c = &self.config;
        self.proposers.draft = Some(DraftModel::new(draft, t, c.max_batch_tokens, c.sample_on_candidates));
        self.apply_draft_vocab();
        Ok(())
    }

    /// Adds a proposer (an MTP head, a block drafter, ...) after prompt lookup and the draft model: the step asks it
    /// for offers like the others, and the target keeps the hidden rows it reads. An error when the target runner
    /// cannot keep them, or when `max` proposers are already there.
    pub fn add_proposer(&mut self, p: Box<dyn Proposer>) -> Result<()> {
        if self.proposers.len() >= spec::CostsView::MAX_PROPOSERS {
            return Err(Error::InvalidRequest(format!("at most {} proposers", spec::CostsView::MAX_PROPOSERS)));
        }
        let mut layers = self.hidden_layers.clone();
        layers.extend_from_slice(p.hidden_layers());
        layers.sort_unstable();
        layers.dedup();
        self.runner.set_hidden_layers(&layers)?;
        self.hidden_layers = layers;
        self.cost_model.add_proposer(p.name(), 0.0);
        self.proposers.extra.push(p);
        Ok(())
    }

    /// Narrows the draft's output head to `spec.draft_vocab` ids (at most as many as the target can emit).
    fn apply_draft_vocab(&mut self) {
        if let Some(d) = self.proposers.draft.as_mut() {
            d.limit_vocab(self.config.spec.draft_vocab);
        }
    }

    pub fn draft(&self) -> Option<&R> {
        self.proposers.draft.as_ref().map(DraftModel::runner)
    }

    pub fn draft_mut(&mut self) -> Option<&mut R> {
        self.proposers.draft.as_mut().map(DraftModel::runner_mut)
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

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Changes the speculation settings; running sequences pick them up at their next step.
    pub fn set_spec(&mut self, spec: SpecConfig) {
        self.config.spec = spec;
        self.apply_draft_vocab();
    }

    pub fn spec_stats(&self) -> SpecStats {
        let mut stats = SpecStats { costs: self.cost_model.view(self.proposers.draft.is_some()), ..self.stats };
        let present = (0..self.proposers.len()).filter_map(|slot| Some((slot, self.proposers.get(slot)?.name())));
        stats.num_proposers = 0;
        for (slot, name) in present {
            stats.by_proposer[stats.num_proposers] = ProposerStats { name, ..self.stats.by_proposer[slot] };
            stats.num_proposers += 1;
        }
        stats
    }

    /// Times passes with `clock` (seconds, monotonic) instead of the system's: tests run on a simulated clock that
    /// their fake runners advance by known costs.
    pub fn set_clock(&mut self, clock: impl Fn() -> f64 + Send + Sync + 'static) {
        self.clock = Arc::new(clock);
    }

    /// Hands the live cost estimates to `sink` every few hundred observed passes and when the engine is dropped, so the
    /// next start begins from what this one learned.
    pub fn set_cost_sink(&mut self, sink: impl FnMut(&PassCosts) + Send + 'static) {
        self.cost_sink = Some(Box::new(sink));
    }

    /// Gives the cost sink the live estimates now, if anything was observed since it last got them.
    pub fn persist_costs(&mut self) {
        if self.unsaved_observations == 0 {
            return;
        }
        self.unsaved_observations = 0;
        if let Some(sink) = self.cost_sink.as_mut() {
            sink(self.cost_model.costs());
        }
    }

    fn observed(&mut self) {
        self.unsaved_observations += 1;
        if self.unsaved_observations >= PERSIST_EVERY {
            self.persist_costs();
        }
    }

    /// The pass costs as calibrated (or set).
    pub fn pass_costs(&self) -> &PassCosts {
        &self.costs
    }

    /// Acceptance of greedy draft tokens by the draft model's confidence, as learned so far (None without one).
    pub fn confidence(&self) -> Option<&spec::Confidence> {
        self.proposers.draft.as_ref().map(DraftModel::confidence)
    }

    /// The pass costs as the passes run since calibration measured them ([`CostModel`]): what the chooser uses.
    pub fn live_pass_costs(&self) -> &PassCosts {
        self.cost_model.costs()
    }

    /// The costs that choose `s`'s depth. A sampled request with a seed must give the same tokens every time it is
    /// run: which tokens rejection sampling keeps depends on the depth, so its depth comes from the calibrated costs
    /// and its own acceptance alone (never from pass timings or the other sequences of a step). Everything else
    /// follows the live costs.
    fn costs_for(&self, s: &Sequence) -> &PassCosts {
        if s.sampler.params.is_seeded_sampling() { &self.costs } else { self.cost_model.costs() }
    }

    /// Sets the pass costs (calibrated, or saved by an earlier run) as the prior of the live cost model.
    pub fn set_pass_costs(&mut self, costs: PassCosts) {
        self.set_pass_costs_measured_at(costs, 0.0);
    }

    /// [`Self::set_pass_costs`] for costs measured at Unix time `measured_unix` (shown until passes measure them
    /// again).
    pub fn set_pass_costs_measured_at(&mut self, costs: PassCosts, measured_unix: f64) {
        self.cost_model = CostModel::new(&costs, measured_unix);
        for p in &self.proposers.extra {
            self.cost_model.add_proposer(p.name(), 0.0);
        }
        self.costs = costs;
    }

    /// Measures target passes of 1 to 33 (and max_draft_tokens + 1) rows and a one-row draft pass, for choosing draft
    /// depths: three rounds over every count, so a burst of other work on the machine hits different counts in
    /// different rounds, and the fastest of each is kept ([`PassCosts::from_timings`]). Takes a few seconds; call
    /// once before serving. Decoding then keeps the costs current.
    pub fn calibrate(&mut self) -> Result<()> {
        let probe = SeqId(u64::MAX);
        let max_rows = self.config.spec.max_draft_tokens + 1;
        let clock = self.clock.clone();
        let time = |runner: &mut R, rows: usize| -> Result<f64> {
            let tokens = vec![0u32; rows];
            let batch = Batch {
                chunks: vec![SeqChunk { seq: probe, tokens: &tokens, start_pos: 0, logits: LogitsWanted::All }],
            };
            let t0 = clock();
            let r = runner.forward(&batch).map(|_| ());
            let secs = clock() - t0;
            runner.release(probe);
            r?;
            Ok(secs)
        };
        // Up to 33 rows whatever the depth: several sequences' drafts share a step. Every count up to 10: the CPU
        // kernels' cost steps at quads of rows and at their register limits, which interpolation would miss.
        let mut points: Vec<usize> = vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 17, 33, max_rows];
        points.sort_unstable();
        points.dedup();
        let mut target: Vec<(usize, Vec<f64>)> = points.iter().map(|&r| (r, Vec::new())).collect();
        let mut draft = Vec::new();
        // A first pass of each size warms caches and allocations without being counted. Costs that fail their
        // sanity check ([`PassCosts::check`]: a burst of other work hit some counts in every round) get up to two
        // more sets of three rounds; if they still fail, the machine may really be like that, and decoding measures
        // it again anyway.
        for round in 0..10 {
            if (round == 4 || round == 7) && PassCosts::from_timings(&target, &draft).check().is_ok() {
                break;
            }
            for (rows, times) in target.iter_mut() {
                let t = time(&mut self.runner, *rows)?;
                if round > 0 {
                    times.push(t);
                }
            }
            if let Some(d) = self.proposers.draft.as_mut() {
                let t = time(d.runner_mut(), 1)?;
                if round > 0 {
                    draft.push(t);
                }
            }
        }
        self.set_pass_costs_measured_at(PassCosts::from_timings(&target, &draft), unix_now());
        Ok(())
    }

    /// Validates and admits a request. KV for the longest cached prefix of the prompt is reused.
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
        let seq = SeqId(id.0);
        // At least the last prompt token is computed: its logits give the first output token.
        let reusable = &req.prompt[..req.prompt.len() - 1];
        let num_cached = self.runner.attach_prefix(seq, reusable);
        let constrained = req.constraint.as_ref().is_some_and(|c| !c.is_dormant());
        for slot in 0..self.proposers.len() {
            if let Some(p) = self.proposers.get_mut(slot) {
                p.admit(seq, &req.prompt, num_cached, &self.config.spec, constrained);
            }
        }
        self.seqs.push(Sequence {
            id,
            num_prompt_tokens: req.prompt.len(),
            tokens: req.prompt,
            num_computed_tokens: num_cached,
            num_cached_tokens: num_cached,
            max_tokens: req.max_tokens,
            sampler: Sampler::new(req.sampling),
            constraint: req.constraint,
            // Control tokens (`<|im_start|>`, `<|fim_prefix|>`, ...) add no text, as in llama.cpp's server: a model
            // that samples one would otherwise show the markup to the client (the 1.5B began a Codex reply with
            // `<|im_start|>`), and the tool-call grammar already reads the output without them.
            detok: Detokenizer::with_special(self.tokenizer.clone(), false),
            stops: StopStrings::new(req.stop_strings),
            stop_tokens: req.stop_tokens,
            ignore_eos: req.ignore_eos,
            text: String::new(),
            hidden: Vec::new(),
            hidden_pos: 0,
            t_admitted: Instant::now(),
            t_first_token: None,
        });
        Ok(id)
    }

    fn release(&mut self, s: &Sequence) {
        self.runner.release(SeqId(s.id.0));
        for slot in 0..self.proposers.len() {
            if let Some(p) = self.proposers.get_mut(slot) {
                p.release(SeqId(s.id.0));
            }
        }
    }

    /// Prompt tokens of a running request whose KV came from the prefix cache (None for an unknown request).
    pub fn cached_tokens(&self, id: RequestId) -> Option<usize> {
        self.seqs.iter().find(|s| s.id == id).map(|s| s.num_cached_tokens)
    }

    /// Cancels a request and frees its sequence at once; returns its `Finished` event (None for an unknown or
    /// finished request). No further events come for it.
    pub fn abort(&mut self, id: RequestId) -> Option<Event> {
        let i = self.seqs.iter().position(|s| s.id == id)?;
        let mut s = self.seqs.remove(i);
        self.release(&s);
        let text = s.stops.flush();
        Some(Event::Finished { reason: FinishReason::Aborted, text, usage: s.usage(), matched_stop: None })
    }

    /// Background work of the runners while no request runs (see `Runner::idle_work`); true if more remains.
    pub fn idle_work(&mut self) -> bool {
        let mut more = self.runner.idle_work();
        for slot in 0..self.proposers.len() {
            more |= self.proposers.get_mut(slot).is_some_and(|p| p.idle_work());
        }
        more
    }

    pub fn has_work(&self) -> bool {
        !self.seqs.is_empty()
    }

    pub fn num_requests(&self) -> usize {
        self.seqs.len()
    }

    /// Whether speculation may ever propose drafts for `s` (it then may change the shape of its next step).
    fn may_propose(&self, s: &Sequence) -> bool {
        let spec = &self.config.spec;
        spec.max_draft_tokens > 0
            && (0..self.proposers.len())
                .any(|slot| self.proposers.get(slot).is_some_and(|p| p.proposes_for(SeqId(s.id.0), spec)))
    }

    /// The most drafts `s` may have verified in one step: they must fit the context (the target holds them until
    /// verified) and the output limit (the step emits up to k + 1 tokens).
    fn max_drafts(&self, s: &Sequence) -> usize {
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
    fn propose(&mut self, i: usize, max_rows: usize) -> Proposal {
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
    fn choose_depths(&self, props: &mut [(usize, Proposal)], base_rows: usize, num_decoding: usize) {
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
    fn explore(&mut self, props: &mut [(usize, Proposal)], base_rows: usize) {
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
    fn run_proposers(&mut self, props: &mut [(usize, Proposal)], base_rows: usize, num_decoding: usize) -> Result<()> {
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
    fn prefill_proposers(&mut self, chunks: &[(usize, usize)]) -> Result<()> {
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
    fn keep_hidden(&mut self, scheduled: &[(usize, usize, Proposal)], starts: &[(usize, usize)], num_tokens: usize) {
        let width = self.runner.config().hidden_size;
        let rows = self.runner.hidden_rows();
        let layers = self.hidden_layers.len();
        if rows.len() != layers * num_tokens * width {
            return;
        }
        for (&(i, _, _), &(row0, pos)) in scheduled.iter().zip(starts) {
            let s = &mut self.seqs[i];
            let kept = s.num_computed_tokens.saturating_sub(pos);
            s.hidden.clear();
            for l in 0..layers {
                let at = (l * num_tokens + row0) * width;
                s.hidden.extend_from_slice(&rows[at..at + kept * width]);
            }
            s.hidden_pos = pos;
        }
    }

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
                let prop = self.propose(i, draft_rows.min(budget));
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
        self.run_proposers(&mut props, base_rows, num_decoding)?;
        let prefills: Vec<(usize, usize)> =
            scheduled.iter().filter(|(i, _, _)| self.seqs[*i].is_prefill()).map(|&(i, n, _)| (i, n)).collect();
        self.prefill_proposers(&prefills)?;
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
        // Where each chunk starts, in the batch's rows and in its sequence (for the hidden rows proposers read).
        let starts: Vec<(usize, usize)> = scheduled
            .iter()
            .zip(&feeds)
            .scan(0, |row, (&(i, _, _), t)| {
                let start = (*row, self.seqs[i].num_computed_tokens);
                *row += t.len();
                Some(start)
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
        // step to come (this pick is not its last by the output limit): its pick is fed back next, and the runner is
        // told so (a GPU may then start that step before this one's pick comes back).
        let feeds_picks = argmax_only
            && prefills.is_empty()
            && batch.num_tokens() == 1
            && scheduled.iter().all(|&(i, _, _)| {
                let s = &self.seqs[i];
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
            if was_decoding {
                self.stats.decode_passes += 1;
                self.stats.decode_tokens += emitted as u64;
                depth_sum += k;
                num_verified += 1;
                if let Some(slot) = prop.proposer {
                    let st = &mut self.stats.by_proposer[slot];
                    st.proposed += k as u64;
                    st.accepted += accepted as u64;
                }
                // Every proposer hears how the step went: the chosen one its proposal's fate, the others what came
                // out (to measure untaken offers, and how long since they last proposed).
                let costs = if s.sampler.params.is_seeded_sampling() { &self.costs } else { self.cost_model.costs() };
                let max_k = self.config.spec.max_draft_tokens;
                for slot in 0..self.proposers.len() {
                    let Some(p) = self.proposers.get_mut(slot) else { continue };
                    let chosen = prop.proposer == Some(slot);
                    let seeded = s.sampler.params.is_seeded_sampling();
                    let pays = chosen && costs.best_depth(pass_cost(&self.cost_model, p, seeded), 0.9, max_k) > 0;
                    let v = Verified {
                        chosen,
                        others: prop.proposer.is_some() && !chosen,
                        probe: prop.probe,
                        proposed: k,
                        accepted,
                        rejected,
                        output: &s.tokens[s.tokens.len() - emitted..],
                        greedy: s.sampler.params.is_greedy(),
                        pays,
                    };
                    p.verified(SeqId(s.id.0), &v);
                }
            }
            if rolled_back {
                // Roll back the rejected drafts: the runner and the proposers keep every token but the pending last.
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
        if num_verified > 0 {
            self.stats.last_depth = depth_sum as f64 / num_verified as f64;
        }
        if !self.hidden_layers.is_empty() {
            self.keep_hidden(&scheduled, &starts, feeds.iter().map(Vec::len).sum());
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
                    Event::Token { id, text, .. } => {
                        out.push(id);
                        on_text(&text);
                    }
                    Event::Finished { reason, text, usage, .. } => {
                        on_text(&text);
                        return Ok((out, reason, usage));
                    }
                }
            }
        }
    }
}

impl<R: Runner> Drop for Engine<R> {
    /// The cost sink gets what this engine learned about its passes.
    fn drop(&mut self) {
        self.persist_costs();
    }
}
