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

use spec::{Acceptance, CostModel, Method, NgramAcceptance, PassCosts};

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
    /// Speculative decoding (n-gram and draft model).
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
    /// Draft tokens proposed and accepted, by proposer.
    pub ngram_proposed: u64,
    pub ngram_accepted: u64,
    pub draft_proposed: u64,
    pub draft_accepted: u64,
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

impl SpecStats {
    pub fn acceptance_rate(&self) -> f64 {
        let proposed = self.ngram_proposed + self.draft_proposed;
        (self.ngram_accepted + self.draft_accepted) as f64 / (proposed.max(1)) as f64
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
    /// Tokens whose KV the draft runner holds (when this sequence uses the draft model).
    num_draft_tokens: usize,
    /// The draft sees the sequence from this token on (its position 0): only the end of a long prompt, so drafting
    /// adds little to prefill.
    draft_offset: usize,
    uses_draft: bool,
    max_tokens: usize,
    sampler: Sampler,
    constraint: Option<Box<dyn TokenConstraint>>,
    detok: Detokenizer<Arc<Tokenizer>>,
    stops: StopStrings,
    stop_tokens: Vec<u32>,
    ignore_eos: bool,
    /// Text released so far.
    text: String,
    ngram: NgramAcceptance,
    draft: Acceptance,
    /// What this sequence's guided drafts yielded per verification.
    guided: spec::GuidedYield,
    /// Target passes since the draft model last proposed for this sequence, and how many to wait before probing it
    /// again (see [`DRAFT_PROBE_GAP_MIN`]).
    draft_idle: usize,
    draft_probe_gap: usize,
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

/// What a decoding sequence sends to the target this step: the method and its draft tokens (with the draft's
/// sampling weights per token when they were sampled).
#[derive(Default)]
struct Proposal {
    method: Option<Method>,
    tokens: Vec<u32>,
    weights: Vec<Option<Vec<(u32, f64)>>>,
    /// The proposer's measured acceptance for this sequence.
    rate: f64,
    /// The n-gram proposal when the draft model was chosen instead: checked against the tokens that come out, so the
    /// n-gram acceptance keeps being measured (it costs nothing) and the choice can switch back.
    shadow: Vec<u32>,
    /// Length of the suffix match behind the n-gram proposal (or the shadow).
    ngram_match: usize,
    /// The depth is this sequence's own and the step may not trim it (seeded sampling, see [`Engine::costs_for`],
    /// and probes).
    fixed: bool,
    /// Tokens at the end of `tokens` that pad the pass to a row count the cost model wants timed
    /// ([`Engine::explore`]): verified like any draft, counted for no proposer.
    pad: usize,
    /// A probe of the draft model that its measured acceptance alone would not have chosen.
    probe: bool,
    /// A greedy draft whose depth follows the draft's confidence: `tokens` is the most it may draft, and it stops
    /// earlier when one more token would not pay ([`spec::draft_more`]).
    guided: bool,
    /// The draft model's probability for each token it proposed (guided drafts).
    conf: Vec<f32>,
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

/// Probing the draft model. Acceptance is only measured while a proposer proposes, so one early rejection (or a
/// stretch of prose in a code reply) could push the draft's estimate below the point where drafting pays and keep
/// it there for the rest of the request. A sequence that has not used the draft for `draft_probe_gap` target
/// passes, and would propose nothing this step, proposes `DRAFT_PROBE_DEPTH` draft tokens anyway (a step with an
/// n-gram proposal keeps it); a fully accepted probe resets the gap to the minimum, any other doubles it (up to the
/// maximum), so a draft that really does not fit costs at most one probe in `DRAFT_PROBE_GAP_MAX` passes.
const DRAFT_PROBE_DEPTH: usize = 2;
const DRAFT_PROBE_GAP_MIN: usize = 8;
const DRAFT_PROBE_GAP_MAX: usize = 256;

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
    draft: Option<R>,
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
    /// Acceptance of greedy draft tokens by the draft's confidence in them.
    confidence: spec::Confidence,
    stats: SpecStats,
}

impl<R: Runner> Engine<R> {
    pub fn new(runner: R, tokenizer: Arc<Tokenizer>, mut config: EngineConfig) -> Self {
        config.max_batch_tokens = config.max_batch_tokens.max(1);
        Engine {
            runner,
            draft: None,
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
            confidence: spec::Confidence::default(),
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
        self.draft = Some(draft);
        self.apply_draft_vocab();
        Ok(())
    }

    /// Narrows the draft's output head to `spec.draft_vocab` ids (at most as many as the target can emit).
    fn apply_draft_vocab(&mut self) {
        let target = self.runner.config().vocab_size;
        if let Some(d) = self.draft.as_mut() {
            let n = self.config.spec.draft_vocab;
            d.limit_logits(if n == 0 { target } else { n.min(target) });
        }
    }

    pub fn draft(&self) -> Option<&R> {
        self.draft.as_ref()
    }

    pub fn draft_mut(&mut self) -> Option<&mut R> {
        self.draft.as_mut()
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
        SpecStats { costs: self.cost_model.view(self.draft.is_some()), ..self.stats }
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

    /// Acceptance of greedy draft tokens by the draft's confidence, as learned so far.
    pub fn confidence(&self) -> &spec::Confidence {
        &self.confidence
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
            if let Some(d) = self.draft.as_mut() {
                let t = time(d, 1)?;
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
        let spec = &self.config.spec;
        let uses_draft =
            spec.max_draft_tokens > 0 && spec.draft_model && req.constraint.as_ref().is_none_or(|c| c.is_dormant());
        let draft_offset = if spec.draft_window == 0 { 0 } else { reusable.len().saturating_sub(spec.draft_window) };
        let num_draft = match self.draft.as_mut() {
            Some(d) if uses_draft => draft_offset + d.attach_prefix(seq, &reusable[draft_offset..]),
            _ => 0,
        };
        self.seqs.push(Sequence {
            id,
            num_prompt_tokens: req.prompt.len(),
            tokens: req.prompt,
            num_computed_tokens: num_cached,
            num_cached_tokens: num_cached,
            num_draft_tokens: num_draft,
            draft_offset,
            uses_draft: uses_draft && self.draft.is_some(),
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
            ngram: NgramAcceptance::new(),
            draft: Acceptance::new(0.6),
            guided: spec::GuidedYield::default(),
            draft_idle: 0,
            draft_probe_gap: DRAFT_PROBE_GAP_MIN,
            t_admitted: Instant::now(),
            t_first_token: None,
        });
        Ok(id)
    }

    fn release(&mut self, s: &Sequence) {
        self.runner.release(SeqId(s.id.0));
        if let Some(d) = self.draft.as_mut() {
            d.release(SeqId(s.id.0));
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
        let target = self.runner.idle_work();
        let draft = self.draft.as_mut().is_some_and(|d| d.idle_work());
        target || draft
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
        spec.max_draft_tokens > 0 && (spec.ngram || s.uses_draft)
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

    /// Chooses the proposer for a decoding sequence (the one faster for it alone) and proposes as many tokens as it
    /// may; [`Self::choose_depths`] then trims them for the whole step.
    fn propose(&self, s: &Sequence, max_rows: usize) -> Proposal {
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
    fn choose_depths(&self, props: &mut [(usize, Proposal)], base_rows: usize, num_decoding: usize) {
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

    /// Runs the draft model for the sequences whose proposal uses it: one pass over each one's unseen tokens, then
    /// one pass per further draft token. Fills in the proposals' tokens (and sampling weights); guided proposals stop
    /// early where one more token would not pay for the step (`base_rows` target rows without drafts, for
    /// `num_decoding` decoding sequences).
    fn run_draft(&mut self, props: &mut [(usize, Proposal)], base_rows: usize, num_decoding: usize) -> Result<()> {
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
    fn stop_guided_drafts(
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
    fn draft_prefill(&mut self, chunks: &[(usize, usize)]) -> Result<()> {
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
