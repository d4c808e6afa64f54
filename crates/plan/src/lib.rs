//! The memory planner: a pure function from model shapes, weight sizes, device memory and user caps to the limits a
//! server runs with — KV pages, max context per sequence, max concurrent sequences, batch token limit — or a refusal
//! that says what did not fit.
//!
//! In: [`PlanInput`]. Out: [`Plan`] (with a readable [`Breakdown`]) or [`PlanError::DoesNotFit`]. Reading the live
//! machine is separate ([`memory::cpu_memory`]); nothing here allocates or touches a model.
//!
//! The rule, in order:
//! 1. budget = available memory, lowered by `--max-memory`;
//! 2. minus a safety margin ([`Margin`], default 256 MiB + 5 % of the budget), target and draft weights;
//! 3. minus workspaces sized for the batch: activations of the largest prefill chunk, attention scores, logits rows,
//!    the sampler's per-sequence buffers and the constrained-decoding masks (target and draft);
//! 4. the rest is KV cache, in pages of [`PAGE_TOKENS`] tokens (f16 keys and values of every layer, target and draft
//!    together). Context comes first: the largest context (≤ the model's, ≤ `--max-context`) whose pages fit one
//!    sequence; then as many sequences as fit *each at that full context* (so nothing is over-committed even while the
//!    runner keeps per-sequence KV), up to the device's default or `--max-sequences`;
//! 5. with a prefix-cache cap ([`PlanInput::prefix_cache_bytes`]; `splash serve` and `splash plan` set
//!    [`default_prefix_cache_bytes`] unless told otherwise), the pool is only what those sequences need plus the cap:
//!    the in-memory prefix cache keeps at most the cap's pages, the rest of the prefixes live on the disk tier, and
//!    the machine keeps the memory no plan line asked for. Without a cap the pool takes everything left.
//!
//! If not even [`MIN_USEFUL_CONTEXT`] tokens (or the model's or user's smaller maximum) fit one sequence, the plan is
//! refused with the breakdown and a suggestion.

mod error;
pub mod memory;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use error::PlanError;
pub use memory::{DeviceMemory, cpu_memory};

/// Tokens per KV page. 16 keeps the waste of a sequence's last, partly used page small (≤ 15 tokens) while a page of
/// the 1.5B model (28 KiB/token) is still 448 KiB, far above allocation overhead.
pub const PAGE_TOKENS: usize = 16;
/// The smallest context worth starting with: a system prompt, a few tool definitions and a short exchange.
pub const MIN_USEFUL_CONTEXT: usize = 2048;
/// Speculative tokens per step the workspaces are sized for when a draft is present.
pub const NUM_SPECULATIVE_TOKENS: usize = 8;

/// Recurrent states one sequence of a hybrid model holds at once: its own, one per row a verification of
/// [`NUM_SPECULATIVE_TOKENS`] drafts may be rolled back to, and its last two block boundaries'.
pub const STATES_PER_SEQUENCE: usize = NUM_SPECULATIVE_TOKENS + 3;

/// State checkpoints a hybrid model keeps per planned sequence (its prompt's end, its request's end, periodic ones
/// of a long prefill), least recently used first out.
pub const CHECKPOINTS_PER_SEQUENCE: usize = 4;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Share of the device's memory the in-memory prefix cache may take by default (the smaller of this and
/// [`DEFAULT_PREFIX_CACHE_MAX_BYTES`]).
pub const DEFAULT_PREFIX_CACHE_SHARE: u64 = 8;
/// The default prefix-cache cap's ceiling.
pub const DEFAULT_PREFIX_CACHE_MAX_BYTES: u64 = 4 * GIB;

/// The default in-memory prefix-cache cap: an eighth of the device's memory, at most 4 GiB (3 GiB on a 24 GiB
/// machine), so a laptop that also runs an IDE, a browser and a build keeps its memory.
pub fn default_prefix_cache_bytes(memory: &DeviceMemory) -> u64 {
    (memory.total_bytes / DEFAULT_PREFIX_CACHE_SHARE).min(DEFAULT_PREFIX_CACHE_MAX_BYTES)
}

/// Which device the plan is for; it sets the default sequence and batch ceilings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
}

impl Device {
    /// Sequences decoded together by default: a CPU is compute-bound well before 8; a GPU wants many.
    pub fn default_max_sequences(self) -> usize {
        match self {
            Device::Cpu => 8,
            Device::Cuda => 64,
        }
    }

    /// Tokens in one forward batch by default (the largest prefill chunk).
    pub fn default_max_batch_tokens(self) -> usize {
        match self {
            Device::Cpu => 512,
            Device::Cuda => 2048,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

/// A model's shapes: the one definition, read from the GGUF header by `models` (inside `models::ModelConfig`),
/// recorded in pack manifests (`pack::Shapes`) and planned with here. Everything derived from them
/// ([`ModelShapes::kv_bytes_per_token`], ...) is computed here once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShapes {
    pub num_layers: usize,
    pub hidden_size: usize,
    pub ffn_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// The context length the model was trained for.
    pub max_context: usize,
}

impl ModelShapes {
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// KV cache values per token: keys and values of every layer.
    pub fn kv_values_per_token(&self) -> u64 {
        (2 * self.num_layers * self.kv_dim()) as u64
    }

    /// KV cache per token at f16 (every quantized model's cache).
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.kv_values_per_token() * 2
    }

    /// Activations per batch row: f32 residual, normalised input and projection `[hidden]` ×3, queries and attention
    /// output `[q_dim]` ×2, new keys and values `[kv_dim]` ×2, gate and up `[ffn]` ×2, plus one byte per element of
    /// the widest input for the quantized copy the matmuls read.
    pub fn activation_bytes_per_token(&self) -> u64 {
        let f32s = 3 * self.hidden_size + 2 * self.q_dim() + 2 * self.kv_dim() + 2 * self.ffn_size;
        (4 * f32s + self.hidden_size.max(self.ffn_size)) as u64
    }

    fn validate(&self, which: &str) -> Result<(), PlanError> {
        let s = self;
        if [s.num_layers, s.hidden_size, s.ffn_size, s.num_heads, s.num_kv_heads, s.head_dim, s.vocab_size].contains(&0)
            || s.max_context == 0
        {
            return Err(PlanError::BadShapes(format!("{which}: a zero dimension in {s:?}")));
        }
        Ok(())
    }
}

/// One model to place: its shapes and the bytes its weights occupy in memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelInput {
    pub shapes: ModelShapes,
    pub weight_bytes: u64,
    /// Bytes of one cached key or value: 2 (f16), or 4 for the f32 cache of an unquantized file
    /// (`backend::KvType::for_weights`).
    pub kv_value_bytes: u64,
    /// The expert-routed FFN of a mixture-of-experts model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts: Option<ExpertShapes>,
    /// The recurrent layers of a hybrid model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recurrent: Option<RecurrentShapes>,
}

/// The Gated DeltaNet layers of a hybrid model (qwen35): they keep no KV cache but a fixed-size state per sequence,
/// and the state's checkpoints for prefix reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RecurrentShapes {
    /// Layers with a KV cache (the attention layers), of [`ModelShapes::num_layers`].
    pub num_kv_layers: usize,
    /// Bytes of one sequence's state: every recurrent layer's conv tail and state matrices (f32).
    pub state_bytes: u64,
}

/// The experts of a mixture-of-experts model: their part of the weights and the numbers that size its activations
/// (read from the GGUF header, or recorded in a pack manifest's `[*.shapes.experts]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertShapes {
    pub num_experts: usize,
    /// Experts each token runs.
    pub num_used: usize,
    /// Rows of one expert's gate and up projections.
    pub expert_ffn: usize,
    /// Bytes of the experts' tensors, within [`ModelInput::weight_bytes`] (memory-mapped on the CPU, not copied).
    pub bytes: u64,
}

impl ModelInput {
    /// KV cache per token at this model's KV type (a hybrid's attention layers only).
    pub fn kv_bytes_per_token(&self) -> u64 {
        let values = match self.recurrent {
            Some(r) => (2 * r.num_kv_layers * self.shapes.kv_dim()) as u64,
            None => self.shapes.kv_values_per_token(),
        };
        values * self.kv_value_bytes
    }

    /// Activations per batch row ([`ModelShapes::activation_bytes_per_token`]), plus an expert-routed FFN's: per
    /// picked expert the gathered input, gate | up, SwiGLU and output rows (f32) and its quantized input, and the
    /// router's logits.
    pub fn activation_bytes_per_token(&self) -> u64 {
        let dense = self.shapes.activation_bytes_per_token();
        let Some(e) = self.experts else { return dense };
        let (h, f) = (self.shapes.hidden_size, e.expert_ffn);
        dense + (e.num_used * (4 * (2 * h + 3 * f) + h.max(f)) + 4 * e.num_experts) as u64
    }
}

/// Memory kept free for everything the plan does not count (allocator slack, the HTTP server, the OS).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Margin {
    pub fixed_bytes: u64,
    /// Share of the budget, 0..1.
    pub fraction: f64,
}

impl Default for Margin {
    fn default() -> Self {
        Margin { fixed_bytes: 256 * MIB, fraction: 0.05 }
    }
}

/// Everything the plan depends on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanInput {
    pub target: ModelInput,
    pub draft: Option<ModelInput>,
    pub memory: DeviceMemory,
    pub device: Device,
    pub margin: Margin,
    /// `--max-memory`: only lowers the budget.
    pub max_memory_bytes: Option<u64>,
    /// `--max-context`: only lowers the context.
    pub max_context: Option<usize>,
    /// `--max-sequences`: the sequence ceiling instead of the device default; memory may lower it.
    pub max_sequences: Option<usize>,
    /// Tokens in one forward batch instead of the device default; never above the context.
    pub max_batch_tokens: Option<usize>,
    /// Threads that each keep a row of attention scores.
    pub num_threads: usize,
    /// Most memory the in-memory prefix cache (KV pages no running sequence holds) may keep, on top of the pages
    /// the planned sequences need; `None` = every page the budget leaves.
    pub prefix_cache_bytes: Option<u64>,
}

impl PlanInput {
    /// An input with the defaults: no draft, default margin, no caps, one thread.
    pub fn new(target: ModelInput, memory: DeviceMemory, device: Device) -> PlanInput {
        PlanInput {
            target,
            draft: None,
            memory,
            device,
            margin: Margin::default(),
            max_memory_bytes: None,
            max_context: None,
            max_sequences: None,
            max_batch_tokens: None,
            num_threads: 1,
            prefix_cache_bytes: None,
        }
    }
}

/// One line of the breakdown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    pub label: String,
    pub bytes: u64,
}

/// Where the memory goes: budget, then every deduction, then what is left for KV.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    pub available_bytes: u64,
    pub memory_source: String,
    pub budget_bytes: u64,
    /// Margin, weights and workspaces, in that order.
    pub items: Vec<Item>,
    /// What the items leave for the KV cache (0 if they exceed the budget).
    pub kv_bytes: u64,
    /// The items' sum minus the budget, when they exceed it.
    pub over_bytes: u64,
}

impl Breakdown {
    pub fn deducted_bytes(&self) -> u64 {
        self.items.iter().map(|i| i.bytes).sum()
    }
}

impl fmt::Display for Breakdown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  available      {:>10}  ({})", human_bytes(self.available_bytes), self.memory_source)?;
        writeln!(f, "  budget         {:>10}", human_bytes(self.budget_bytes))?;
        for i in &self.items {
            writeln!(f, "  - {:<40} {:>10}", i.label, human_bytes(i.bytes))?;
        }
        if self.over_bytes > 0 {
            write!(f, "  = over budget by {}", human_bytes(self.over_bytes))
        } else {
            write!(f, "  = KV cache     {:>10}", human_bytes(self.kv_bytes))
        }
    }
}

/// What stopped the context from being larger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextLimit {
    /// The model's trained context (or the draft's, if shorter).
    Model,
    /// `--max-context`.
    User,
    /// Memory.
    Memory,
}

/// The limits to run with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub device: Device,
    /// Tokens per KV page ([`PAGE_TOKENS`]).
    pub page_tokens: usize,
    /// KV bytes per token, target and draft together.
    pub kv_bytes_per_token: u64,
    /// Pages in the KV pool: `max_sequences` × pages of `max_context`, plus the prefix cache's cap (or, without a
    /// cap, all memory the deductions leave).
    pub num_kv_pages: usize,
    /// Most pages the in-memory prefix cache keeps when no sequence holds them (`None`: no cap beyond the pool).
    pub max_cached_pages: Option<usize>,
    /// Most tokens of prompt and output per sequence (≤ the model's).
    pub max_context: usize,
    pub model_max_context: usize,
    pub context_limit: ContextLimit,
    /// Sequences that can each hold `max_context` tokens at once.
    pub max_sequences: usize,
    /// Most tokens in one forward batch (largest prefill chunk).
    pub max_batch_tokens: usize,
    /// Recurrent state checkpoints kept in memory (hybrid models; 0 for others).
    pub max_state_checkpoints: usize,
    pub breakdown: Breakdown,
}

impl Plan {
    pub fn kv_pool_bytes(&self) -> u64 {
        self.num_kv_pages as u64 * self.page_tokens as u64 * self.kv_bytes_per_token
    }

    /// Bytes of the in-memory prefix cache's cap, when there is one.
    pub fn prefix_cache_bytes(&self) -> Option<u64> {
        self.max_cached_pages.map(|n| n as u64 * self.page_tokens as u64 * self.kv_bytes_per_token)
    }

    /// Pages one sequence needs to hold `num_tokens`.
    pub fn pages_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.page_tokens)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = match self.context_limit {
            ContextLimit::Model => "the model's maximum",
            ContextLimit::User => "--max-context",
            ContextLimit::Memory => "memory",
        };
        writeln!(f, "device           {}", self.device.name())?;
        writeln!(
            f,
            "max context      {} tokens per sequence (limited by {limit}; model: {})",
            self.max_context, self.model_max_context
        )?;
        writeln!(f, "max sequences    {} at full context", self.max_sequences)?;
        writeln!(f, "batch limit      {} tokens per step", self.max_batch_tokens)?;
        writeln!(
            f,
            "KV cache         {} pages of {} tokens ({} tokens, {}/token, {})",
            self.num_kv_pages,
            self.page_tokens,
            self.num_kv_pages * self.page_tokens,
            human_bytes(self.kv_bytes_per_token),
            human_bytes(self.kv_pool_bytes())
        )?;
        match self.prefix_cache_bytes() {
            Some(bytes) => writeln!(
                f,
                "prefix cache     at most {} pages in memory ({}; --prefix-cache-memory), the rest on disk",
                self.max_cached_pages.unwrap_or(0),
                human_bytes(bytes)
            )?,
            None => writeln!(f, "prefix cache     every page no sequence holds (no cap)")?,
        }
        if self.max_state_checkpoints > 0 {
            writeln!(f, "state            {} recurrent state checkpoints in memory", self.max_state_checkpoints)?;
        }
        writeln!(f, "memory breakdown:")?;
        write!(f, "{}", self.breakdown)
    }
}

/// Workspace bytes of one model for `num_seqs` sequences, `batch` tokens per step, `context` tokens per sequence.
fn workspaces(
    input: &ModelInput,
    num_seqs: u64,
    batch: u64,
    context: u64,
    threads: u64,
    spec: u64,
) -> [(String, u64); 5] {
    let m = &input.shapes;
    let vocab = m.vocab_size as u64;
    let logits_rows = batch.min(num_seqs * spec);
    [
        (format!("activations ({batch}-token chunk)"), batch * input.activation_bytes_per_token()),
        (format!("attention scores ({threads} threads)"), threads * m.num_heads as u64 * context * 4),
        (format!("logits ({logits_rows} rows)"), logits_rows * vocab * 4),
        (format!("sampler ({num_seqs} sequences)"), num_seqs * vocab * 8),
        (format!("constrained-decoding masks ({num_seqs})"), num_seqs * vocab.div_ceil(8)),
    ]
}

/// Plans `input`; see the module docs for the rule.
pub fn plan(input: &PlanInput) -> Result<Plan, PlanError> {
    input.target.shapes.validate("target")?;
    if let Some(d) = &input.draft {
        d.shapes.validate("draft")?;
    }
    let available = input.memory.available_bytes;
    let budget = input.max_memory_bytes.map_or(available, |m| m.min(available));
    let model_max = input
        .draft
        .as_ref()
        .map_or(input.target.shapes.max_context, |d| d.shapes.max_context.min(input.target.shapes.max_context));
    let ctx_cap = input.max_context.map_or(model_max, |c| c.clamp(1, model_max));
    let min_ctx = MIN_USEFUL_CONTEXT.min(ctx_cap);
    let seq_cap = input.max_sequences.unwrap_or(input.device.default_max_sequences()).max(1);
    let batch_cap = input.max_batch_tokens.unwrap_or(input.device.default_max_batch_tokens()).max(1);
    let kv_per_token = input.target.kv_bytes_per_token() + input.draft.as_ref().map_or(0, |d| d.kv_bytes_per_token());
    let page_bytes = PAGE_TOKENS as u64 * kv_per_token;

    // The deductions for `num_seqs` sequences of `context` tokens, and the KV those sequences need.
    let breakdown = |num_seqs: usize, context: usize, kv_needed: u64| -> Breakdown {
        let margin = (input.margin.fixed_bytes + (budget as f64 * input.margin.fraction) as u64).min(budget);
        let mut items = vec![Item {
            label: format!(
                "safety margin ({} + {:.0}%)",
                human_bytes(input.margin.fixed_bytes),
                input.margin.fraction * 100.0
            ),
            bytes: margin,
        }];
        match &input.target.experts {
            None => items.push(Item { label: "target weights".into(), bytes: input.target.weight_bytes }),
            Some(e) => {
                let rest = input.target.weight_bytes.saturating_sub(e.bytes);
                items.push(Item { label: "target weights (all but the experts)".into(), bytes: rest });
                let label = format!("target experts ({} of {} per token)", e.num_used, e.num_experts);
                items.push(Item { label, bytes: e.bytes });
            }
        }
        if let Some(d) = &input.draft {
            items.push(Item { label: "draft weights".into(), bytes: d.weight_bytes });
        }
        let batch = batch_cap.min(context) as u64;
        let threads = input.num_threads.max(1) as u64;
        let spec = if input.draft.is_some() { NUM_SPECULATIVE_TOKENS as u64 + 1 } else { 1 };
        for (label, bytes) in workspaces(&input.target, num_seqs as u64, batch, context as u64, threads, spec) {
            items.push(Item { label: format!("target {label}"), bytes });
        }
        if let Some(d) = &input.draft {
            for (label, bytes) in workspaces(d, num_seqs as u64, batch, context as u64, threads, 1) {
                items.push(Item { label: format!("draft {label}"), bytes });
            }
        }
        // On a GPU, long chunks multiply a layer's experts from f16 copies of all of them (cuda/moe.rs), their
        // inputs and SwiGLU rows in f16 too.
        if input.device == Device::Cuda
            && let Some(e) = &input.target.experts
        {
            let (h, f, ne, k) =
                (input.target.shapes.hidden_size as u64, e.expert_ffn as u64, e.num_experts as u64, e.num_used as u64);
            let label = "target experts' f16 copies (one layer, tensor-core prefill)".into();
            items.push(Item { label, bytes: ne * 3 * f * h * 2 + batch * k * (h + f) * 2 });
        }
        if let Some(r) = &input.target.recurrent {
            let states = num_seqs * STATES_PER_SEQUENCE;
            let label =
                format!("recurrent state ({num_seqs} x {STATES_PER_SEQUENCE} of {})", human_bytes(r.state_bytes));
            items.push(Item { label, bytes: states as u64 * r.state_bytes });
            let checkpoints = num_seqs * CHECKPOINTS_PER_SEQUENCE;
            let label = format!("state checkpoints ({checkpoints})");
            items.push(Item { label, bytes: checkpoints as u64 * r.state_bytes });
        }
        let deducted: u64 = items.iter().map(|i| i.bytes).sum();
        let left = budget.saturating_sub(deducted);
        let over = (deducted + kv_needed).saturating_sub(budget);
        Breakdown {
            available_bytes: available,
            memory_source: input.memory.source.clone(),
            budget_bytes: budget,
            items,
            kv_bytes: left,
            over_bytes: over,
        }
    };
    let kv_needed =
        |num_seqs: usize, context: usize| num_seqs as u64 * context.div_ceil(PAGE_TOKENS) as u64 * page_bytes;
    let fits =
        |num_seqs: usize, context: usize| breakdown(num_seqs, context, kv_needed(num_seqs, context)).over_bytes == 0;

    if !fits(1, min_ctx) {
        let mut b = breakdown(1, min_ctx, kv_needed(1, min_ctx));
        b.items.push(Item { label: format!("KV cache ({min_ctx} tokens, 1 sequence)"), bytes: kv_needed(1, min_ctx) });
        let mut hints = Vec::new();
        if let Some(d) = &input.draft {
            let mut no_draft = input.clone();
            no_draft.draft = None;
            if plan(&no_draft).is_ok() {
                hints.push(format!("run without the draft model (its weights take {})", human_bytes(d.weight_bytes)));
            }
        }
        if input.max_memory_bytes.is_some_and(|m| m < available) {
            hints.push(format!("raise --max-memory (up to {} is available)", human_bytes(available)));
        }
        hints.push(format!(
            "free {} of memory, or choose a smaller model or quantization (weights and KV cache are what need room)",
            human_bytes(b.over_bytes)
        ));
        return Err(PlanError::DoesNotFit {
            min_context: min_ctx,
            short_bytes: b.over_bytes,
            breakdown: b,
            suggestion: hints.join("; or "),
        });
    }

    // Context first: the largest that fits one sequence (binary search; a fit is monotone in context).
    let context = if fits(1, ctx_cap) {
        ctx_cap
    } else {
        let (mut lo, mut hi) = (min_ctx, ctx_cap); // fits(lo) && !fits(hi)
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(1, mid) { lo = mid } else { hi = mid }
        }
        // Whole pages, unless that would drop below the minimum.
        let paged = lo / PAGE_TOKENS * PAGE_TOKENS;
        if paged >= min_ctx { paged } else { lo }
    };
    let context_limit = if context < ctx_cap {
        ContextLimit::Memory
    } else if input.max_context.is_some_and(|c| c < model_max) {
        ContextLimit::User
    } else {
        ContextLimit::Model
    };
    // Then sequences: the most that each hold the full context.
    let (mut lo, mut hi) = (1usize, seq_cap + 1); // fits(lo) && !fits(hi) (hi = cap + 1 counts as not fitting)
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid, context) { lo = mid } else { hi = mid }
    }
    let num_seqs = lo;
    let mut b = breakdown(num_seqs, context, 0);
    let all_pages = (b.kv_bytes / page_bytes) as usize;
    let (num_kv_pages, max_cached_pages) = match input.prefix_cache_bytes {
        None => (all_pages, None),
        Some(cap) => {
            // `fits` guarantees the sequences' pages; the cache gets what is left up to its cap.
            let active_pages = num_seqs * context.div_ceil(PAGE_TOKENS);
            let num_pages = all_pages.min(active_pages.saturating_add((cap / page_bytes) as usize));
            (num_pages, Some(num_pages.saturating_sub(active_pages)))
        }
    };
    b.over_bytes = 0;
    Ok(Plan {
        device: input.device,
        page_tokens: PAGE_TOKENS,
        kv_bytes_per_token: kv_per_token,
        num_kv_pages,
        max_cached_pages,
        max_context: context,
        model_max_context: model_max,
        context_limit,
        max_sequences: num_seqs,
        max_batch_tokens: batch_cap.min(context),
        max_state_checkpoints: if input.target.recurrent.is_some() { num_seqs * CHECKPOINTS_PER_SEQUENCE } else { 0 },
        breakdown: b,
    })
}

/// `1.5 GiB`, `448.0 KiB`, `12 B` (binary units).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// A size: `8G`, `8GiB`, `8GB`, `1.5g`, `512M`, `64K`, or plain bytes. All units are binary (G = 2^30): memory is
/// sold and reported that way, and a few percent either side must never be the difference that over-commits.
pub fn parse_bytes(s: &str) -> Result<u64, PlanError> {
    let bad = || PlanError::BadSize(s.to_string());
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let stripped = lower.trim_end_matches('b').trim_end_matches('i');
    let (digits, scale) = match stripped.chars().last() {
        Some('k') => (&stripped[..stripped.len() - 1], 1u64 << 10),
        Some('m') => (&stripped[..stripped.len() - 1], 1 << 20),
        Some('g') => (&stripped[..stripped.len() - 1], 1 << 30),
        Some('t') => (&stripped[..stripped.len() - 1], 1 << 40),
        _ if lower.ends_with('b') || lower.ends_with('i') => {
            return if lower == "b" {
                Err(bad())
            } else {
                // "512b"/"512B": bytes.
                stripped.parse::<u64>().map_err(|_| bad())
            };
        }
        _ => (stripped, 1),
    };
    let v: f64 = digits.trim().parse().map_err(|_| bad())?;
    if !v.is_finite() || v <= 0.0 || v * scale as f64 > u64::MAX as f64 / 2.0 {
        return Err(bad());
    }
    Ok((v * scale as f64) as u64)
}

#[cfg(test)]
mod tests;
