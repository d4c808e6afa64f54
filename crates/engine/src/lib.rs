//! The engine: admits generation requests and advances all of them one step at a time over a model runner.
//!
//! Each step schedules, for every live sequence, the tokens it has not computed yet (the whole prompt chunk by
//! chunk, then one token per step), runs them as one batch, samples where logits came back, and turns new tokens into
//! text and events. Prefill and decode fall out of that one rule. Who runs and how many of their tokens is the
//! scheduler's (`scheduler.rs`: admission by KV memory, the step's token budget, chunked prefill, preemption); the
//! step itself (`step.rs`) is schedule → execute → update; speculation's choices are `speculate.rs`'s (over the
//! proposers of `spec`).

mod request;
pub mod sampler;
mod scheduler;
mod sequence;
pub mod service;
pub mod spec;
mod speculate;
mod step;
mod stop;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::sync::Arc;
use std::time::Instant;

use models::{Batch, LogitsWanted, Runner, SeqChunk, SeqId};
use tokenizer::{Detokenizer, Tokenizer};

use scheduler::Scheduler;
use sequence::Sequence;

pub use models::KvUsage;
pub use models::kv_cache::BLOCK_TOKENS as KV_BLOCK_TOKENS;
pub use request::{Event, FinishReason, GenerateRequest, RequestId, TokenConstraint, TokenLogprobs, Usage};
pub use sampler::{Sampler, SamplingParams};
pub use spec::SpecConfig;
pub use step::StepTimes;
pub use stop::StopStrings;

use spec::proposer::Proposers;
use spec::{CostModel, DraftModel, PassCosts, Proposer};

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
    /// Running sequences (holding KV), in admission order.
    seqs: Vec<Sequence>,
    /// The requests waiting for KV memory, and admission.
    scheduler: Scheduler,
    step_times: StepTimes,
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
            scheduler: Scheduler::new(),
            step_times: StepTimes::default(),
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

    /// Validates a request and queues it: the scheduler admits it when its prompt fits the KV memory, reusing the KV
    /// of the longest cached prefix of its prompt.
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
        self.scheduler.waiting.push_back(Sequence {
            id,
            num_prompt_tokens: req.prompt.len(),
            prefill_len: req.prompt.len(),
            tokens: req.prompt,
            num_computed_tokens: 0,
            admitted_step: 0,
            was_admitted: false,
            num_cached_tokens: 0,
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

    /// Prompt tokens of a running request whose KV came from the prefix cache (None for an unknown request, or one
    /// not admitted yet).
    pub fn cached_tokens(&self, id: RequestId) -> Option<usize> {
        self.seqs
            .iter()
            .chain(&self.scheduler.waiting)
            .find(|s| s.id == id && s.was_admitted)
            .map(|s| s.num_cached_tokens)
    }

    /// Requests admitted for the first time since the last call, with their prompt tokens served from the prefix
    /// cache (what a service reports once a request runs).
    pub fn take_admitted(&mut self) -> Vec<(RequestId, usize)> {
        self.scheduler.take_admitted()
    }

    /// Caps the number of requests running at once (the scheduler admits fewer when KV memory runs short).
    pub fn set_max_running(&mut self, n: usize) {
        self.scheduler.max_running = n.max(1);
    }

    /// Where the steps' time went so far.
    pub fn step_times(&self) -> StepTimes {
        self.step_times
    }

    /// Cancels a request, running or waiting, and frees its sequence at once; returns its `Finished` event (None for
    /// an unknown or finished request). No further events come for it.
    pub fn abort(&mut self, id: RequestId) -> Option<Event> {
        let mut s = if let Some(i) = self.seqs.iter().position(|s| s.id == id) {
            let s = self.seqs.remove(i);
            self.release(&s);
            s
        } else {
            let i = self.scheduler.waiting.iter().position(|s| s.id == id)?;
            let s = self.scheduler.waiting.remove(i).expect("INVARIANT: found above");
            // A preempted request: its runner KV is gone already, the proposers still know it.
            if s.was_admitted {
                for slot in 0..self.proposers.len() {
                    if let Some(p) = self.proposers.get_mut(slot) {
                        p.release(SeqId(s.id.0));
                    }
                }
            }
            s
        };
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
        !self.seqs.is_empty() || !self.scheduler.waiting.is_empty()
    }

    /// Requests running or waiting for memory.
    pub fn num_requests(&self) -> usize {
        self.seqs.len() + self.scheduler.waiting.len()
    }

    /// Requests waiting for KV memory (new, or preempted to be recomputed).
    pub fn num_waiting(&self) -> usize {
        self.scheduler.waiting.len()
    }

    /// Whether speculation may ever propose drafts for `s` (it then may change the shape of its next step).
    /// Runs one request to completion (CLI use), calling `on_text` with each piece of released text.
    pub fn generate(
        &mut self,
        req: GenerateRequest,
        mut on_text: impl FnMut(&str),
    ) -> Result<(Vec<u32>, FinishReason, Usage)> {
        let id = self.add_request(req)?;
        let mut out = Vec::new();
        loop {
            if !self.seqs.iter().chain(&self.scheduler.waiting).any(|s| s.id == id) {
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
