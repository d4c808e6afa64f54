//! Compute backends behind one trait, [`Backend`]. `cpu` is the reference implementation and the test oracle for
//! every other backend; `cuda` holds the device plumbing of the GPU one.
//!
//! Backend operations are named after the maths (`rms_norm`, `rope`, `linear`, `paged_attention`); they take numbers
//! and buffers, never model names. The model crate writes the forward pass once over this trait
//! (`models::transformer`): an architecture is a recipe of weights and layer kinds, the backend decides how to fuse.
//!
//! Two levels of operation:
//! - **primitive ops** ([`Backend::embedding`], [`Backend::rms_norm`], [`Backend::linear`], [`Backend::rope`],
//!   [`Backend::paged_attention`], [`Backend::swiglu`], [`Backend::experts`], ...): one piece of maths each, tested
//!   one by one against a plain f32 reference (crates/backend/tests/ops.rs);
//! - **sub-layer ops** ([`Backend::attention_sublayer`], [`Backend::ffn_sublayer`],
//!   [`Backend::recurrent_sublayer`]): `x += f(norm(x))` for one layer kind, with default bodies composed of the
//!   primitives. The forward pass calls only these (plus embedding and the output head), so a backend that fuses
//!   (the CUDA one: Q/K/V matrix-vector + bias + RoPE + KV write in one kernel, gate/up + SwiGLU + activation
//!   quantization in one, RMSNorm fused into the next input's quantization, the residual add into the last matvec)
//!   overrides a sub-layer and keeps every number the trait promises.
//!
//! Buffers are the backend's own ([`Backend::Tensor`], [`Backend::Matrix`], [`Backend::Vector`],
//! [`Backend::KvPages`]): host memory on the CPU, device memory on the GPU. Every op may run asynchronously (enqueued
//! on a stream, or recorded into a graph between [`Backend::begin_forward`] and [`Backend::finish_forward`]); results
//! are observable only through [`Backend::read`] (or the backend's own accessors), which waits for them.
//!
//! Shapes: a tensor is `[rows, cols]` f32 activations (a backend may keep other forms beside them, e.g. 8-bit
//! quantized copies, as long as the f32 view reads back what the maths says). Ops take the number of rows in use;
//! a tensor's capacity (the rows it was allocated with) may be larger.

pub mod cpu;
pub mod cuda;

/// An error of a backend operation. Operations on valid shapes do not fail on the CPU; a device can (launch, memory).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend does not implement this op (or this form of it: a weight type, a layer kind).
    #[error("{op}: not supported by the {backend} backend: {reason}")]
    Unsupported { backend: &'static str, op: &'static str, reason: String },
    /// Arguments whose shapes disagree (a bug in the caller, reported instead of a panic).
    #[error("{op}: {reason}")]
    Shape { op: &'static str, reason: String },
    /// The device failed (a launch, an allocation, a copy).
    #[error("{op}: {message}")]
    Device { op: &'static str, message: String },
}

pub type Result<T> = std::result::Result<T, Error>;

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)` (GGUF llama files, whose Q/K weights were permuted at conversion).
    Interleaved,
    /// Halves `(i, i + rope_dim/2)` (GPT-NeoX, Qwen2, Qwen3).
    Neox,
}

/// Rotary position embedding of each head of a `[rows, num_heads * head_dim]` tensor: the first `rope_dim` dimensions
/// of every head are rotated by `pos * theta^(-2i / rope_dim)` (full RoPE when `rope_dim == head_dim`, partial
/// otherwise: the rest pass through). The inverse frequencies are computed as ggml does (a running product of
/// `theta^(-2 / rope_dim)` in f32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    pub style: RopeStyle,
    pub head_dim: usize,
    /// Even, at most `head_dim`.
    pub rope_dim: usize,
    pub theta: f32,
}

/// Which RMSNorm: `y = x / sqrt(mean(x²) + eps) * w` ([`NormKind::Plain`]), or the zero-centred form whose stored
/// weight is `w - 1` (`y = ... * (1 + w)`, [`NormKind::OnePlus`]: Qwen3-Next/Qwen3.5, Gemma).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    Plain,
    OnePlus,
}

/// An RMSNorm's weight (`[dim]`, on the backend) and numbers. Applied to every consecutive run of `dim` values of a
/// tensor's rows, so a `[head_dim]` weight over a `[rows, num_heads * head_dim]` tensor is a per-head norm.
pub struct Norm<V> {
    pub weight: V,
    /// `dim`, the length of `weight`.
    pub dim: usize,
    pub eps: f32,
    pub kind: NormKind,
}

/// Which ops read a matrix ([`Backend::load_matrix`]): a token embedding is read a row at a time, a linear layer's
/// matrix whole; a tied output head is both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixUse {
    Linear,
    Embedding,
    Both,
    /// An expert-strided matrix ([`ExpertGateUp`]), read one expert's rows at a time: the CPU leaves it in the
    /// memory-mapped file.
    Experts,
}

/// The numbers of grouped-query attention.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies each query·key product (`1 / sqrt(head_dim)` unless the model says otherwise).
    pub scale: f32,
}

impl AttnShape {
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

/// The element type of the KV cache's keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    /// What llama.cpp stores, and every quantized model here: half the memory of f32, and attention rounds its
    /// queries to f16 to match.
    F16,
    /// For unquantized (f32) weights, whose logits are checked against an f32 reference (< 1e-4 relative): keys,
    /// values, queries and both attention products in f32.
    F32,
}

impl KvType {
    /// The KV type for a model whose K and V projection weights have the types `tys`: f32 when all are f32 (an
    /// unquantized file), else f16. Every backend picks by this rule, so a file's cache has one host form.
    pub fn for_weights(tys: impl IntoIterator<Item = gguf::GgmlType>) -> KvType {
        let mut tys = tys.into_iter().peekable();
        let any = tys.peek().is_some();
        if any && tys.all(|t| t == gguf::GgmlType::F32) { KvType::F32 } else { KvType::F16 }
    }

    pub fn bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }

    /// u16 words per value in the host form: an f16's bits, or an f32's bits as two words, low half first.
    pub fn words(self) -> usize {
        self.bytes() / 2
    }
}

/// How the paged KV cache is laid out: blocks of `block_tokens` positions, each holding, for every layer, that
/// layer's keys then its values, `[num_layers][k | v][block_tokens][kv_dim]` values of `kv_type`, as u16 words
/// ([`KvType::words`]). This is also the host form of a block ([`Backend::kv_block_to_host`]), which the prefix
/// cache's disk tier stores, so a block written by one backend reads back on another of the same layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub num_layers: usize,
    pub kv_dim: usize,
    pub block_tokens: usize,
    pub kv_type: KvType,
}

impl KvLayout {
    /// Values (keys and values of every layer) in one block.
    pub fn block_values(&self) -> usize {
        self.num_layers * 2 * self.block_tokens * self.kv_dim
    }

    /// u16 words of one block's host form.
    pub fn block_words(&self) -> usize {
        self.block_values() * self.kv_type.words()
    }

    pub fn block_bytes(&self) -> usize {
        self.block_values() * self.kv_type.bytes()
    }

    /// Offset in words of layer `layer`'s keys in a block (its values follow at `+ block_tokens * kv_dim` values).
    pub fn layer_offset(&self, layer: usize) -> usize {
        layer * 2 * self.block_tokens * self.kv_dim * self.kv_type.words()
    }
}

/// One sequence's run of consecutive rows in a batch and its KV blocks: row `i` of the run is at position
/// `start_pos + i`; `blocks[j]` holds positions `j * block_tokens ..`, and covers at least `start_pos + num_rows`.
#[derive(Debug, Clone, Copy)]
pub struct SeqRows<'a> {
    pub blocks: &'a [u32],
    pub start_pos: usize,
    pub num_rows: usize,
}

/// Where the rows of a batch sit: per row its position and the `(block, offset in block)` slot its key and value go
/// to; per sequence its run of rows (in row order: the runs tile `0..num_rows`).
#[derive(Debug, Clone, Copy)]
pub struct AttnRows<'a> {
    /// `[num_rows]`
    pub positions: &'a [usize],
    /// `[num_rows]`
    pub slots: &'a [(u32, usize)],
    pub seqs: &'a [SeqRows<'a>],
}

impl AttnRows<'_> {
    pub fn num_rows(&self) -> usize {
        self.positions.len()
    }
}

/// The weights of a self-attention sub-layer: `x += Wo · attn(rope(norm_qk(Wq·n + bq)), rope(norm_qk(Wk·n + bk)),
/// Wv·n + bv)` with `n = norm(x)`; gated attention (qwen35) multiplies the attention output by `sigmoid(Wg·n)`
/// before `Wo`.
pub struct AttentionWeights<B: Backend + ?Sized> {
    pub norm: Norm<B::Vector>,
    /// `[q_dim, hidden]`
    pub wq: B::Matrix,
    /// `[kv_dim, hidden]`
    pub wk: B::Matrix,
    /// `[kv_dim, hidden]`
    pub wv: B::Matrix,
    /// `[q_dim]`, `[kv_dim]`, `[kv_dim]` (qwen2)
    pub bq: Option<B::Vector>,
    pub bk: Option<B::Vector>,
    pub bv: Option<B::Vector>,
    /// Per-head RMSNorm of queries and keys before RoPE, `[head_dim]` each (qwen3).
    pub q_norm: Option<Norm<B::Vector>>,
    pub k_norm: Option<Norm<B::Vector>>,
    /// `[q_dim, hidden]`: the output gate of gated attention (qwen35: the second half of each head's rows of the
    /// file's `attn_q`).
    pub wg: Option<B::Matrix>,
    /// `[hidden, q_dim]`
    pub wo: B::Matrix,
}

/// The numbers of a self-attention sub-layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionSpec {
    pub shape: AttnShape,
    pub rope: RopeSpec,
}

/// A feed-forward sub-layer, `x += ffn(norm(x))`.
pub enum FfnWeights<B: Backend + ?Sized> {
    /// `down · (silu(gate · n) * (up · n))`
    SwiGlu {
        norm: Norm<B::Vector>,
        /// `[ffn, hidden]`
        gate: B::Matrix,
        /// `[ffn, hidden]`
        up: B::Matrix,
        /// `[hidden, ffn]`
        down: B::Matrix,
    },
    /// Expert-routed (mixture of experts, [`ExpertWeights`]): `down_e(silu(gate_e · n) * (up_e · n))` of the experts
    /// the router picks for each row, mixed by the router's weights, plus the shared expert when there is one.
    Experts { norm: Norm<B::Vector>, experts: ExpertWeights<B> },
}

/// The numbers of an expert-routed FFN: softmax of the router's logits over all `num_experts`, the `num_used`
/// largest kept (ties to the lower index), their weights renormalised to sum to 1 when `normalise_weights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertsSpec {
    pub num_experts: usize,
    pub num_used: usize,
    /// Rows of one expert's gate and up projections (`expert_feed_forward_length`).
    pub expert_ffn: usize,
    pub normalise_weights: bool,
}

/// The gate and up projections of every expert. An expert-strided matrix holds one projection of all experts back to
/// back, as the GGUF 3-D tensor `[cols, rows, num_experts]` does: `[num_experts * rows, cols]`, expert `e`'s rows
/// at `e * rows ..`. One matrix per projection (not one per expert) is what a grouped kernel reads.
pub enum ExpertGateUp<M> {
    /// `ffn_gate_exps` and `ffn_up_exps`: `[num_experts * expert_ffn, hidden]` each.
    Separate { gate: M, up: M },
    /// `ffn_gate_up_exps`: `[num_experts * 2 * expert_ffn, hidden]`, each expert's gate rows then its up rows.
    Fused(M),
}

impl<M> ExpertGateUp<M> {
    /// The matrices and first rows of expert `e`'s gate and up projections.
    pub fn rows_of(&self, e: usize, expert_ffn: usize) -> [(&M, usize); 2] {
        match self {
            ExpertGateUp::Separate { gate, up } => [(gate, e * expert_ffn), (up, e * expert_ffn)],
            ExpertGateUp::Fused(m) => [(m, 2 * e * expert_ffn), (m, (2 * e + 1) * expert_ffn)],
        }
    }
}

/// An always-on SwiGLU expert beside the routed ones (qwen2moe, qwen35moe: `*_shexp`), its output scaled by
/// `sigmoid(gate_inp · n)` when the model has that gate.
pub struct SharedExpert<B: Backend + ?Sized> {
    /// `[shared_ffn, hidden]`
    pub gate: B::Matrix,
    pub up: B::Matrix,
    /// `[hidden, shared_ffn]`
    pub down: B::Matrix,
    /// `[1, hidden]` (`ffn_gate_inp_shexp`)
    pub gate_inp: Option<B::Matrix>,
}

/// The weights of an expert-routed FFN ([`ExpertsSpec`]).
pub struct ExpertWeights<B: Backend + ?Sized> {
    /// `[num_experts, hidden]` (`ffn_gate_inp`)
    pub router: B::Matrix,
    pub gate_up: ExpertGateUp<B::Matrix>,
    /// `[num_experts * hidden, expert_ffn]`, expert-strided (`ffn_down_exps`).
    pub down: B::Matrix,
    pub shared: Option<SharedExpert<B>>,
    pub spec: ExpertsSpec,
}

impl<B: Backend + ?Sized> ExpertWeights<B> {
    /// Checks the matrices against the numbers and the input width `hidden` (`dims`: a matrix's rows and columns);
    /// the reason when they disagree. Every backend checks by this before it routes.
    pub fn check_shapes(
        &self,
        hidden: usize,
        dims: impl Fn(&B::Matrix) -> (usize, usize),
    ) -> std::result::Result<(), String> {
        let s = &self.spec;
        let (ne, f, h) = (s.num_experts, s.expert_ffn, hidden);
        if s.num_used == 0 || s.num_used > ne || f == 0 {
            return Err(format!("{s:?}"));
        }
        let want = |m: &B::Matrix, rows: usize, cols: usize, what: &str| match dims(m) {
            (r, c) if (r, c) == (rows, cols) => Ok(()),
            (r, c) => Err(format!("{what} is {r}x{c}, not {rows}x{cols}")),
        };
        want(&self.router, ne, h, "the router")?;
        match &self.gate_up {
            ExpertGateUp::Separate { gate, up } => {
                want(gate, ne * f, h, "the experts' gate")?;
                want(up, ne * f, h, "the experts' up")?;
            }
            ExpertGateUp::Fused(m) => want(m, ne * 2 * f, h, "the experts' gate_up")?,
        }
        want(&self.down, ne * h, f, "the experts' down")?;
        if let Some(sh) = &self.shared {
            let sf = dims(&sh.gate).0;
            want(&sh.gate, sf, h, "the shared gate")?;
            want(&sh.up, sf, h, "the shared up")?;
            want(&sh.down, h, sf, "the shared down")?;
            if let Some(g) = &sh.gate_inp {
                want(g, 1, h, "the shared expert's gate")?;
            }
        }
        Ok(())
    }
}

/// A Gated DeltaNet mixer (the linear-attention layers of the Qwen3.5/3.6 hybrids), in the GGUF's layout (value
/// heads in the converter's tiled order: value head `h` reads key head `h % num_k_heads`). Per token, with
/// `n = norm(x)`: `qkv = silu(conv1d(W_qkv·n))` over the last `conv_kernel` inputs of each channel; `q`, `k`
/// L2-normalised per key head, `q` scaled by `1/√d_k`; `β = sigmoid(W_β·n)`, `g = a · softplus(W_α·n + dt_bias)`;
/// per value head the `d_k × d_v` state `S ← exp(g)·S`, `S ← S + k ⊗ β(v − Sᵀk)`, `o = Sᵀq`; then
/// `x += W_out · (rms_norm(o) · silu(W_z·n))` per value head. Its per-sequence state (the conv's last inputs and
/// every head's `S`, f32) is the runner's, beside the sequence's KV blocks ([`RecurrentSpec::state_len`]).
pub struct RecurrentWeights<B: Backend + ?Sized> {
    pub norm: Norm<B::Vector>,
    /// `[conv_dim, hidden]`: queries, keys, values (the conv's channels, in that order).
    pub qkv: B::Matrix,
    /// `[value_dim, hidden]`: the output gate.
    pub z: B::Matrix,
    /// `[num_v_heads, hidden]` each: the update strength and the decay's input.
    pub beta: B::Matrix,
    pub alpha: B::Matrix,
    /// `[conv_dim * conv_kernel]`: each channel's taps, oldest input first.
    pub conv: B::Vector,
    /// `[num_v_heads]` each: `dt_bias`, and `a = −exp(A_log)` (stored so by the converter).
    pub dt_bias: B::Vector,
    pub a: B::Vector,
    /// `[head_v_dim]`: the plain RMSNorm of each head's output before the gate.
    pub out_norm: Norm<B::Vector>,
    /// `[hidden, value_dim]`
    pub out: B::Matrix,
}

/// The numbers of a Gated DeltaNet mixer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecurrentSpec {
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    pub conv_kernel: usize,
    /// Added to the sum of squares in the L2 normalisation of queries and keys.
    pub l2_eps: f32,
}

impl RecurrentSpec {
    pub fn key_dim(&self) -> usize {
        self.num_k_heads * self.head_k_dim
    }

    pub fn value_dim(&self) -> usize {
        self.num_v_heads * self.head_v_dim
    }

    /// Channels of the conv: queries, keys and values.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// f32 values of one sequence's state in one layer: the conv's last `conv_kernel - 1` inputs
    /// (`[conv_kernel - 1, conv_dim]`, oldest first), then every value head's `[head_k_dim, head_v_dim]` matrix.
    pub fn state_len(&self) -> usize {
        self.conv_state_len() + self.num_v_heads * self.head_k_dim * self.head_v_dim
    }

    /// The conv part of [`RecurrentSpec::state_len`].
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }
}

/// A copy of one sequence's recurrent state taken inside [`Backend::recurrent_sublayer`]: after the first
/// `rows_done` rows (1 ..= its row count) of `seqs[seq]`, into `state` (at least [`RecurrentSpec::state_len`]
/// values). What exact checkpoints at block boundaries and speculative rollback to any accepted length are made of.
pub struct StateSnapshot<'a, B: Backend + ?Sized> {
    pub seq: usize,
    pub rows_done: usize,
    pub state: &'a mut B::Tensor,
}

/// The token mixer of a layer.
pub enum MixerWeights<B: Backend + ?Sized> {
    Attention(AttentionWeights<B>),
    Recurrent(RecurrentWeights<B>),
}

/// One layer: a token mixer and a feed-forward sub-layer, each `x += f(norm(x))`.
pub struct LayerWeights<B: Backend + ?Sized> {
    pub mixer: MixerWeights<B>,
    pub ffn: FfnWeights<B>,
}

/// The widths of a forward pass's activations, for [`Workspace::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Widths {
    pub hidden: usize,
    pub q_dim: usize,
    pub kv_dim: usize,
    pub ffn: usize,
}

/// Activation buffers of the sub-layer ops, allocated once for up to `rows` rows and grown with [`Workspace::fit`].
pub struct Workspace<B: Backend + ?Sized> {
    pub widths: Widths,
    /// Capacity in rows.
    pub rows: usize,
    /// `[rows, hidden]` normalised input of the current sub-layer
    pub xn: B::Tensor,
    /// `[rows, q_dim]`
    pub q: B::Tensor,
    /// `[rows, kv_dim]`
    pub k: B::Tensor,
    /// `[rows, kv_dim]`
    pub v: B::Tensor,
    /// `[rows, q_dim]` attention output
    pub att: B::Tensor,
    /// `[rows, hidden]` a sub-layer's output before the residual add
    pub proj: B::Tensor,
    /// `[rows, ffn]`
    pub gate: B::Tensor,
    /// `[rows, ffn]`
    pub up: B::Tensor,
    /// `[rows, q_dim]` the output gate of gated attention, allocated by the first gated layer after
    /// [`Workspace::new`] (models without one never pay for it).
    pub att_gate: Option<B::Tensor>,
}

impl<B: Backend + ?Sized> Workspace<B> {
    pub fn new(backend: &mut B, widths: Widths, rows: usize) -> Result<Self> {
        let rows = rows.max(1);
        let Widths { hidden, q_dim, kv_dim, ffn } = widths;
        Ok(Workspace {
            widths,
            rows,
            xn: backend.alloc(rows, hidden)?,
            q: backend.alloc(rows, q_dim)?,
            k: backend.alloc(rows, kv_dim)?,
            v: backend.alloc(rows, kv_dim)?,
            att: backend.alloc(rows, q_dim)?,
            proj: backend.alloc(rows, hidden)?,
            gate: backend.alloc(rows, ffn)?,
            up: backend.alloc(rows, ffn)?,
            att_gate: None,
        })
    }

    /// Grows the buffers to hold at least `rows` rows (contents are not kept).
    pub fn fit(&mut self, backend: &mut B, rows: usize) -> Result<()> {
        if rows > self.rows {
            *self = Workspace::new(backend, self.widths, rows)?;
        }
        Ok(())
    }
}

/// A compute backend. See the module docs for the contract shared by every op: buffers are the backend's, `rows`
/// says how many rows of each tensor are in use, ops may run asynchronously until [`Backend::read`].
///
/// Numbers each op promises (the per-op tests in crates/backend/tests/ops.rs check every backend against plain f32
/// references with these tolerances):
/// - `embedding`, `gather_rows`, `add`: exact;
/// - `rms_norm`, `rope`, `swiglu`: f32 rounding (relative 1e-5);
/// - `linear`: the product of the dequantized weight with the input quantized to the weight type's activation format
///   (Q8_K / Q8_0 / f32, as ggml), so relative to an f32 product of the dequantized weight within the quantization
///   of the input (stated per type in the tests);
/// - `paged_attention`: with an f16 cache ([`KvType::F16`]) queries rounded to f16, keys and values stored as f16,
///   softmax in f32; with an f32 cache f32 throughout. A backend without an f32 cache answers
///   [`Error::Unsupported`] from [`Backend::kv_pages`].
///
/// Batch invariance: on the CPU every row's result is bitwise independent of the other rows in the call (a decode
/// step, a prefill chunk and the k+1 rows of a speculative verification give a position the same logits). A GPU
/// backend keeps this for the rows of one call shape at least (batched = unbatched is checked end to end).
pub trait Backend {
    /// `[rows, cols]` f32 activations.
    type Tensor;
    /// A quantized weight matrix `[rows, cols]` (GGUF block types), in whatever layout the backend's kernels read.
    type Matrix;
    /// A small f32 vector (norm weights, biases).
    type Vector;
    /// The storage of the paged KV cache ([`KvLayout`]); which blocks a sequence owns is the runner's business
    /// (models::kv_cache), the backend only stores them.
    type KvPages;

    /// `"cpu"`, `"cuda"`: for messages.
    fn name(&self) -> &'static str;

    // --- Buffers ---

    /// A tensor of `rows` rows of `cols` values (contents unspecified).
    fn alloc(&mut self, rows: usize, cols: usize) -> Result<Self::Tensor>;
    /// Writes `data` (`[n, cols]`, `n` at most the capacity) to the first rows of `t`.
    fn write(&mut self, t: &mut Self::Tensor, data: &[f32]) -> Result<()>;
    /// The first `rows` rows of `t`, `[rows, cols]`, after every op enqueued before has finished.
    fn read(&mut self, t: &Self::Tensor, rows: usize) -> Result<Vec<f32>>;
    /// Brings a matrix of the host (a GGUF view or an owned copy) onto the backend, in the layout the ops named by
    /// `usage` read fastest. [`Error::Unsupported`] when the backend has no kernel for its type.
    fn load_matrix(&mut self, m: &cpu::QMatrix, usage: MatrixUse) -> Result<Self::Matrix>;
    fn load_vector(&mut self, v: &[f32]) -> Result<Self::Vector>;

    // --- KV pages ---

    /// Empty KV storage of this layout.
    fn kv_pages(&mut self, layout: KvLayout) -> Result<Self::KvPages>;
    /// Makes blocks `0..num_blocks` exist (new ones zeroed); never shrinks.
    fn kv_grow(&mut self, kv: &mut Self::KvPages, num_blocks: usize) -> Result<()>;
    /// Copies block `from` over block `to` (copy-on-write of a shared partial block).
    fn kv_copy_block(&mut self, kv: &mut Self::KvPages, from: u32, to: u32) -> Result<()>;
    /// Block `block` in its host form (`[layout.block_words()]` words, [`KvLayout`]).
    fn kv_block_to_host(&mut self, kv: &Self::KvPages, block: u32, out: &mut [u16]) -> Result<()>;
    /// Overwrites block `block` from its host form.
    fn kv_block_from_host(&mut self, kv: &mut Self::KvPages, block: u32, data: &[u16]) -> Result<()>;

    // --- Primitive ops ---

    /// `out[t] = table[tokens[t]]` (the row dequantized to f32).
    fn embedding(&mut self, table: &Self::Matrix, tokens: &[u32], out: &mut Self::Tensor) -> Result<()>;
    /// `out[i] = x[rows[i]]`.
    fn gather_rows(&mut self, x: &Self::Tensor, rows: &[usize], out: &mut Self::Tensor) -> Result<()>;
    /// `out = rms_norm(x)` over the first `rows` rows ([`Norm`]; `x` and `out` of the same width).
    fn rms_norm(
        &mut self,
        x: &Self::Tensor,
        rows: usize,
        norm: &Norm<Self::Vector>,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// [`Backend::rms_norm`] in place.
    fn rms_norm_in_place(&mut self, x: &mut Self::Tensor, rows: usize, norm: &Norm<Self::Vector>) -> Result<()>;
    /// Quantized linear layers sharing one input: `outs[i] = x · ws[i]ᵀ (+ biases[i])` for the first `rows` rows of
    /// `x` (`[rows, cols]`, every matrix `cols` wide). One op for every row count: the backend picks matrix-vector
    /// kernels for decode and verification rows and GEMM for prefill, and may fuse the matrices (Q/K/V, gate/up)
    /// into one pass over the input. `biases` is empty or one entry per matrix.
    fn linear(
        &mut self,
        x: &Self::Tensor,
        rows: usize,
        ws: &[&Self::Matrix],
        biases: &[Option<&Self::Vector>],
        outs: &mut [&mut Self::Tensor],
    ) -> Result<()>;
    /// RoPE in place over `x` (`[rows, num_heads * spec.head_dim]`), row `t` at position `positions[t]`.
    fn rope(&mut self, x: &mut Self::Tensor, positions: &[usize], spec: &RopeSpec) -> Result<()>;
    /// Writes each row's key and value (`k`, `v`: `[rows, kv_dim]`) to its slot of layer `layer`, then causal
    /// grouped-query attention of each row's query (`q`: `[rows, q_dim]`) over its sequence's keys up to and
    /// including its own position: `out` `[rows, q_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn paged_attention(
        &mut self,
        kv: &mut Self::KvPages,
        layer: usize,
        shape: AttnShape,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        rows: &AttnRows<'_>,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// In place: `gate = silu(gate) * up` over the first `rows` rows.
    fn swiglu(&mut self, gate: &mut Self::Tensor, up: &Self::Tensor, rows: usize) -> Result<()>;
    /// In place: `x += y` over the first `rows` rows.
    fn add(&mut self, x: &mut Self::Tensor, y: &Self::Tensor, rows: usize) -> Result<()>;
    /// In place: `x *= sigmoid(gate)` over the first `rows` rows (gated attention's output gate). Backends without
    /// it answer [`Error::Unsupported`].
    fn sigmoid_mul(&mut self, x: &mut Self::Tensor, gate: &Self::Tensor, rows: usize) -> Result<()> {
        let _ = (x, gate, rows);
        Err(Error::Unsupported { backend: self.name(), op: "sigmoid_mul", reason: "gated attention".into() })
    }
    /// The expert-routed FFN ([`ExpertWeights`]) of the first `rows` rows of `x` (`[rows, hidden]`) into `out`
    /// (`[rows, hidden]`): per row the router's softmax and top-k ([`ExpertsSpec`]), then the sum over the picked
    /// experts, in the router's order, of `weight · down_e(silu(gate_e · x) * (up_e · x))`, plus the shared expert.
    /// Each product is a [`Backend::linear`] (the input quantized to the weight's activation format); each row's
    /// result is independent of the other rows. Backends without it answer [`Error::Unsupported`].
    fn experts(
        &mut self,
        x: &Self::Tensor,
        rows: usize,
        w: &ExpertWeights<Self>,
        out: &mut Self::Tensor,
    ) -> Result<()> {
        let _ = (x, rows, w, out);
        Err(Error::Unsupported { backend: self.name(), op: "experts", reason: "expert-routed FFN".into() })
    }

    // --- Sub-layer ops (what the forward pass calls; override to fuse) ---

    /// `x += Wo · attention(...)` of one attention layer ([`AttentionWeights`]) for the `rows.num_rows()` rows of
    /// `x` (`[rows, hidden]`), storing their keys and values in `kv`.
    #[allow(clippy::too_many_arguments)]
    fn attention_sublayer(
        &mut self,
        x: &mut Self::Tensor,
        w: &AttentionWeights<Self>,
        spec: &AttentionSpec,
        kv: &mut Self::KvPages,
        layer: usize,
        rows: &AttnRows<'_>,
        ws: &mut Workspace<Self>,
    ) -> Result<()> {
        let m = rows.num_rows();
        if w.wg.is_some() && ws.att_gate.is_none() {
            ws.att_gate = Some(self.alloc(ws.rows, ws.widths.q_dim)?);
        }
        let Workspace { xn, q, k, v, att, proj, att_gate, .. } = ws;
        self.rms_norm(x, m, &w.norm, xn)?;
        let biases = [w.bq.as_ref(), w.bk.as_ref(), w.bv.as_ref()];
        let biases: &[Option<&Self::Vector>] = if biases.iter().any(Option::is_some) { &biases } else { &[] };
        match (&w.wg, att_gate.as_mut()) {
            (Some(wg), Some(g)) if biases.is_empty() => {
                self.linear(xn, m, &[&w.wq, wg, &w.wk, &w.wv], &[], &mut [&mut *q, g, &mut *k, &mut *v])?
            }
            (None, _) => self.linear(xn, m, &[&w.wq, &w.wk, &w.wv], biases, &mut [&mut *q, &mut *k, &mut *v])?,
            _ => {
                return Err(Error::Shape {
                    op: "attention_sublayer",
                    reason: "a gated layer with Q/K/V biases".into(),
                });
            }
        }
        if let Some(n) = &w.q_norm {
            self.rms_norm_in_place(q, m, n)?;
        }
        if let Some(n) = &w.k_norm {
            self.rms_norm_in_place(k, m, n)?;
        }
        self.rope(q, rows.positions, &spec.rope)?;
        self.rope(k, rows.positions, &spec.rope)?;
        self.paged_attention(kv, layer, spec.shape, q, k, v, rows, att)?;
        if let Some(g) = att_gate.as_ref().filter(|_| w.wg.is_some()) {
            self.sigmoid_mul(att, g, m)?;
        }
        self.linear(att, m, &[&w.wo], &[], &mut [proj])?;
        self.add(x, proj, m)
    }

    /// `x += ffn(norm(x))` for the first `rows` rows of `x` (`[rows, hidden]`).
    fn ffn_sublayer(
        &mut self,
        x: &mut Self::Tensor,
        rows: usize,
        w: &FfnWeights<Self>,
        ws: &mut Workspace<Self>,
    ) -> Result<()> {
        match w {
            FfnWeights::SwiGlu { norm, gate, up, down } => {
                let Workspace { xn, gate: g, up: u, proj, .. } = ws;
                self.rms_norm(x, rows, norm, xn)?;
                self.linear(xn, rows, &[gate, up], &[], &mut [&mut *g, &mut *u])?;
                self.swiglu(g, u, rows)?;
                self.linear(g, rows, &[down], &[], &mut [proj])?;
                self.add(x, proj, rows)
            }
            FfnWeights::Experts { norm, experts } => {
                let Workspace { xn, proj, .. } = ws;
                self.rms_norm(x, rows, norm, xn)?;
                self.experts(xn, rows, experts, proj)?;
                self.add(x, proj, rows)
            }
        }
    }

    /// The output head over the rows `rows` (indices into the batch) of `x`: `logits[i] = head · norm(x[rows[i]])`,
    /// `[rows.len(), head rows]`. The default gathers, normalises and multiplies; a backend may fuse them (and end
    /// the pass with what it picks from the logits on the device).
    fn output_head(
        &mut self,
        x: &Self::Tensor,
        rows: &[usize],
        norm: &Norm<Self::Vector>,
        head: &Self::Matrix,
        logits: &mut Self::Tensor,
        ws: &mut Workspace<Self>,
    ) -> Result<()> {
        let r = rows.len();
        let Workspace { xn, proj, .. } = ws;
        self.gather_rows(x, rows, proj)?;
        self.rms_norm(proj, r, norm, xn)?;
        self.linear(xn, r, &[head], &[], &mut [logits])
    }

    /// `x += mixer(norm(x))` of a Gated DeltaNet layer ([`RecurrentWeights`]) for the rows of `seqs` (in order),
    /// reading and advancing each sequence's state (`states[i]` for `seqs[i]`, at least
    /// [`RecurrentSpec::state_len`] values) once per row, and copying it out where `snapshots` ask (ordered by
    /// sequence, then row). The CPU backend runs it (cpu/deltanet.rs); the default is [`Error::Unsupported`].
    #[allow(clippy::too_many_arguments)]
    fn recurrent_sublayer(
        &mut self,
        x: &mut Self::Tensor,
        w: &RecurrentWeights<Self>,
        spec: &RecurrentSpec,
        seqs: &[SeqRows<'_>],
        states: &mut [&mut Self::Tensor],
        snapshots: &mut [StateSnapshot<'_, Self>],
        ws: &mut Workspace<Self>,
    ) -> Result<()> {
        let _ = (x, w, spec, seqs, states, snapshots, ws);
        Err(Error::Unsupported {
            backend: self.name(),
            op: "recurrent_sublayer",
            reason: "Gated DeltaNet layers (not implemented on this backend yet)".into(),
        })
    }

    // --- Forward hooks ---

    /// Called before the first op of a forward pass over a batch whose sequences have the given row counts (every
    /// buffer of the pass is allocated by then): a backend that captures graphs looks one up (or starts recording)
    /// for this shape here.
    fn begin_forward(&mut self, rows_per_seq: &[usize]) -> Result<()> {
        let _ = rows_per_seq;
        Ok(())
    }

    /// Called after the last op of a forward pass (the output head's): ends a recording, or launches the graph.
    fn finish_forward(&mut self) -> Result<()> {
        Ok(())
    }
}
