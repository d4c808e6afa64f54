//! The transformer forward pass on the CUDA backend: [`CudaRunner`], the GPU twin of [`crate::cpu::CpuRunner`].
//!
//! At load the kernel library is specialised with the model's constants (hidden size, heads, head_dim, FFN, the
//! (type, row length) of every matrix), compiled with NVRTC for the device and cached on disk; weights are uploaded in
//! their GGUF quantized form. A batch's rows go through each matrix together (every weight read once for up to 8
//! rows per pass, more rows in parallel passes), attention reads a paged f16 KV cache, and each batch shape with at
//! most [`MAX_GRAPH_ROWS`] rows is captured once as a CUDA graph and replayed: per-step data (tokens, positions,
//! page tables) lives in fixed device buffers that the host rewrites before each launch. Chunks of at least
//! [`GEMM_MIN_ROWS`] tokens (prefill) instead run on tensor cores: each weight matrix dequantized to f16 into scratch
//! and multiplied with cuBLAS, attention as cuBLAS GEMMs around a causal softmax over the gathered paged cache.
//!
//! Decode-sized chunks of layers whose matrices all have such kernels (`CudaOptions::q8`) multiply on 8-bit
//! activations: each activation row is quantized per 32 values (fused with the RMSNorm, or written by the attention
//! and gate/up kernels themselves) and the weights are consumed with dp4a, several threads per weight row, never
//! converted to f32 (Q4_K, Q6_K, Q8_0, Q5_0). Q4_K and Q6_K rows are regrouped field by field on upload (neighbouring
//! threads load neighbouring 16 bytes), Q8_0 and Q5_0 blocks padded (aligned fields), see `device_layout`. Other types
//! keep the f32-activation kernels. Greedy callers ([`Runner::forward_argmax`]) get each row's argmax picked on the
//! device at the end of the graph and copy back one id per row instead of the logits; a lone greedy sequence
//! ([`Runner::forward_argmax_ahead`]) has its next step enqueued before that id comes back, fed with it on the device.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::Arc;

use backend::cpu::ops::RopeStyle;
use backend::cuda::{Blas, BlasMat, BlasType, CudaError, DevBuf, Gpu};
use cudarc::driver::{CudaFunction, CudaGraph, CudaModule};
use gguf::{GgmlType, GgufFile};

use crate::{Batch, Error, LogitsWanted, ModelConfig, Result, Runner, SeqId, Weights};

/// Tokens per KV page.
pub const PAGE_SIZE: usize = 64;
/// How many of each row's largest logits `topk_rows` selects on the device ([`Runner::forward_candidates`]): top-k
/// sampling with k + the penalised tokens (20 + 64 with the packs' defaults) at most this.
const DEVICE_CANDIDATES: usize = 256;

/// Blocks that reduce one logit row together in `argmax_rows` (256 threads each) and `topk_rows` (1,024 each, one
/// segment of the row each).
const ARGMAX_BLOCKS: usize = 32;
const TOPK_BLOCKS: usize = 8;

/// Batches of at most this many rows are captured as CUDA graphs.
pub const MAX_GRAPH_ROWS: usize = 64;
/// Default warps of an attention block (`CudaOptions::att_warps`).
const ATT_WARPS: usize = 4;
/// Default splits of a clustered attention launch (`CudaOptions::att_cl`) and the most rows it runs for: on the
/// H200 it paid at batch 1 (1.5B +3%, 0.5B +4% at context 512) and cost 2-6% from 2 rows on (BENCHMARKS.md,
/// stretch 11).
const ATT_CL: usize = 8;
const ATT_CL_ROWS: usize = 1;
/// Threads of a `rope_kv` block; the rotation pairs of a row are spread over as many blocks as they fill.
const ROPE_THREADS: u32 = 256;
/// Chunks of at least this many tokens run on tensor cores (weights dequantized to f16, cuBLAS GEMMs, GEMM
/// attention); shorter ones (decode, speculative verification) on the matrix-vector kernels. Chosen per chunk, so a
/// sequence's results never depend on what else is in its batch. Above [`MAX_GRAPH_ROWS`]: graphs hold no cuBLAS call.
pub const GEMM_MIN_ROWS: usize = 128;
/// Query rows per block of the GEMM attention (bounds the score matrices; later blocks see more positions).
const ATT_BLOCK_ROWS: usize = 512;

impl From<CudaError> for Error {
    fn from(e: CudaError) -> Self {
        Error::Backend(e.to_string())
    }
}

#[derive(Debug, Clone)]
pub struct CudaOptions {
    pub device: usize,
    /// KV cache capacity in tokens over all sequences (0: up to half the free memory, at most 256k tokens).
    pub kv_tokens: usize,
    /// Capture and replay CUDA graphs for small batches.
    pub graphs: bool,
    /// Where compiled kernels are cached (None: no cache).
    pub cache_dir: Option<PathBuf>,
    /// Apply RoPE and write the KV cache inside the fused QKV kernel (two rows per warp) instead of a separate
    /// launch.
    pub fuse_rope: bool,
    /// Round activations to 8 bits before quantized matrix products exactly as the CPU backend and ggml do
    /// (Q8_0 / Q8_1 / Q8_K), so both backends compute the same function. Off: f32 activations.
    pub exact_activations: bool,
    /// Run chunks of at least [`GEMM_MIN_ROWS`] tokens on tensor cores through cuBLAS (when libcublas loads).
    pub gemm: bool,
    /// Launch kernels outside CUDA graphs (prefill) with programmatic dependent launch (Hopper and later): each
    /// kernel's start and weight prefetch overlap the previous kernel's end. Measured on the H200: prefill 512
    /// +10%, 4096 +2.5%; inside decode graphs on every kernel it was slower (1.5B 441 vs 450 tok/s, 0.5B 640 vs
    /// 718), so graphs use it only where `graph_pdl_att` says.
    pub pdl: bool,
    /// Fuse the FFN RMSNorm into the gate/up kernel where the QKV kernel fuses the attention norm.
    pub fuse_ffn_norm: bool,
    /// Profiling only (wrong results): stages left out of every layer, to time the others by difference.
    pub skip: Vec<String>,
    /// Matrix-vector products of Q4_K / Q6_K layers on 8-bit activations with dp4a (like ggml's mmvq) instead of
    /// dequantizing every weight to f32. Chosen per model, so a sequence's results do not depend on its batch.
    pub q8: bool,
    /// Target pairs of 32-blocks per thread in those kernels (sets how many threads split one weight row) ...
    pub q8_iters: usize,
    /// ... and in those of matrices under `Q8_SMALL_VALUES` values.
    pub q8_iters_small: usize,
    /// Programmatic dependent launch inside CUDA graphs too (the 8-bit kernels load their weights before waiting
    /// for the previous kernel).
    pub graph_pdl: bool,
    /// ... for the kernels whose names contain one of these (`SPLASH_CUDA_GRAPH_PDL_K=a,b`; experiments) ...
    pub graph_pdl_kernels: Vec<String>,
    /// ... for the attention kernel and the output projection after it (`SPLASH_CUDA_GRAPH_PDL_ATT=0` turns it off):
    /// the attention's metadata and page-table reads and K/V prefetch, then the projection's weight loads, overlap
    /// the kernel before each. Measured on the H200 (stretch 12, call F): 1.5B decode 1,194 vs 1,145 tok/s, 0.5B
    /// 1,796 vs 1,672; with the QKV kernel too 1,083, every kernel 1,129.
    pub graph_pdl_att: bool,
    /// Select the largest logits for sampling on the device (`topk_rows`) instead of copying rows back
    /// (`SPLASH_CUDA_CANDIDATES=0` turns it off).
    pub device_candidates: bool,
    /// The gate/up kernel writes the down projection's 8-bit input itself (else a separate quantization launch).
    pub gu_fuse: bool,
    /// The attention kernel writes the output projection's 8-bit input itself.
    pub att_q8: bool,
    /// Q4_K and Q6_K rows stored on the device field by field (all first halves of the 32-byte quant runs, then all
    /// second halves, then the headers) so that neighbouring threads' 16-byte loads are neighbours in memory.
    pub repack: bool,
    /// Attention at short context: as many splits over the positions as the context needs (at least
    /// 32 positions per warp of a block each) rather than always the launch's full count.
    pub att_dyn: bool,
    /// 8-bit activation rows stored with their 16-byte chunks permuted so that the matrix-vector kernels' loads of
    /// them are coalesced (same values, same sums).
    pub xperm: bool,
    /// The 8-bit QKV and gate/up kernels RMS-normalise and quantize their input rows themselves, in their prologue
    /// (the same bits as the `quant_q8` launch they replace; models with hidden size up to
    /// [`FUSE_NORM_MAX_HIDDEN`], whose rows fit the shared memory). Off: `SPLASH_CUDA_FUSE_NORM=0`.
    pub fuse_norm: bool,
    /// The 8-bit QKV kernel applies RoPE and writes K and V into the paged cache in its epilogue (the same bits as
    /// the `rope_kv` launch it replaces; models without a per-head q/k norm). Off: `SPLASH_CUDA_QKV_ROPE=0`.
    pub qkv_rope: bool,
    /// The Q4_K gate/up kernels that also write the down projection's input hold the up rows' weights in shared
    /// memory (cp.async) rather than registers, and ask for 3 blocks per multiprocessor (`SPLASH_CUDA_GU_SMEM=1`;
    /// the same sums). Off by default: slower on the H200 (1.5B 964-979 vs 999-1001 tok/s; BENCHMARKS.md, stretch 7).
    pub gu_smem: bool,
    /// Warps of an attention block (1..=32; each takes 32 positions per pass, and a split covers at least one pass
    /// of all of them): `SPLASH_CUDA_ATT_WARPS`. One split needs no second pass over partials. Default 4: 1, 2, 8
    /// and 16 were all slower on the 1.5B at contexts 16, 512 and 2048 (BENCHMARKS.md, stretch 7).
    pub att_warps: usize,
    /// The gate/up kernels take pair i of the gate and the up row in turn and load the activations they share once
    /// (`SPLASH_CUDA_GU_DOT2`, default on; the same sums in the same order). 32B 138.3 vs 133.0-135.3 tok/s, 1.5B
    /// 1,013-1,022 vs 999-1,008 (BENCHMARKS.md, stretch 8).
    pub gu_dot2: bool,
    /// The 8-bit input of a Q6_K down projection or output matrix is written in a layout of its own (the
    /// chunks a Q6_K pair multiplies, which are not consecutive, sit where one load instruction of a warp reads 512
    /// contiguous bytes: see `xpos6` in kernels.cu). `SPLASH_CUDA_X6=1`; same values, same sums. Off by default: no
    /// measurable gain on the H200 (32B 138.1-138.4 vs 138.3 tok/s, 1.5B equal; BENCHMARKS.md, stretch 8).
    pub x6: bool,
    /// Weights are loaded with `ld.global.cg` (cached in L2 only), so that they do not evict from L1 the activation
    /// rows that every block re-reads (`SPLASH_CUDA_WCG=1`; 16-byte loads only; same bytes, same sums). Off by
    /// default: slower on the H200 (1.5B 1,002-1,015 vs 1,015-1,023, 32B 136.4 vs 137.8; BENCHMARKS.md, stretch 8).
    pub wcg: bool,
    /// Attention of passes whose contexts need at most this many splits (of 32 x `att_warps` positions) runs
    /// them as one thread-block cluster per (row, head), merged through distributed shared memory rather than
    /// global memory and a counter; the same bits (`SPLASH_CUDA_ATT_CL`: 0 off, 2, 4, 8 or 16; 16 needs the
    /// non-portable cluster size). Longer contexts keep the launch with more splits (its own CUDA graph).
    pub att_cl: usize,
    /// ... in passes of at most this many rows (`SPLASH_CUDA_ATT_CL_ROWS`).
    pub att_cl_rows: usize,
    /// Attention splits of a decode pass (up to 16 rows) past what `att_cl` covers (`SPLASH_CUDA_ATT_SPLITS`, default
    /// 16, 1..=128). More splits: fewer positions per warp at long contexts, more partials to merge. Rows keep their
    /// bits across batches either way; a different count changes them past `count x 128` positions.
    pub att_splits: usize,
    /// Past `att_splits` x this many positions, a decode row's attention takes one split per this many positions
    /// (`SPLASH_CUDA_ATT_LONG`, default 512; 0: never more than `att_splits`), in a launch sized by the pass's
    /// longest context (a power of two, its own CUDA graph). A row's splits still depend on its own context alone.
    /// Measured on the H200 (1.5B, stretch 12): at 16K positions 32 splits of 512 decode 5% faster than 16 of 1,024;
    /// at 4K, 16 of 256 are 6% faster than 32 of 128.
    pub att_long: usize,
    /// Decode ahead ([`Runner::forward_argmax_ahead`]): the next step of a single greedy sequence is enqueued before
    /// the caller asks for it, its token written by the pick of the pass before, so the GPU does not wait for the
    /// host between steps (`SPLASH_CUDA_AHEAD=0` turns it off).
    pub ahead: bool,
}

impl CudaOptions {
    fn q8_its(&self) -> (usize, usize) {
        (self.q8_iters, self.q8_iters_small)
    }
}

impl Default for CudaOptions {
    fn default() -> Self {
        let graphs = std::env::var("SPLASH_CUDA_GRAPHS").map(|v| v != "0").unwrap_or(true);
        let exact_activations = std::env::var("SPLASH_CUDA_EXACT").is_ok_and(|v| v == "1");
        let fuse_rope = std::env::var("SPLASH_CUDA_FUSE_ROPE").is_ok_and(|v| v == "1");
        let gemm = std::env::var("SPLASH_CUDA_GEMM").map(|v| v != "0").unwrap_or(true);
        let pdl = std::env::var("SPLASH_CUDA_PDL").map(|v| v != "0").unwrap_or(true);
        let skip = std::env::var("SPLASH_CUDA_PROFILE_SKIP")
            .map(|v| v.split(',').map(str::to_string).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default();
        let fuse_ffn_norm = std::env::var("SPLASH_CUDA_FUSE_FFN_NORM").is_ok_and(|v| v == "1");
        let q8 = std::env::var("SPLASH_CUDA_Q8").map(|v| v != "0").unwrap_or(true);
        let q8_iters =
            std::env::var("SPLASH_CUDA_Q8_IT").ok().and_then(|v| v.parse().ok()).unwrap_or(3usize).clamp(1, 8);
        CudaOptions {
            device: 0,
            kv_tokens: 0,
            graphs,
            cache_dir: None,
            exact_activations,
            fuse_rope,
            gemm,
            pdl,
            skip,
            fuse_ffn_norm,
            q8,
            q8_iters,
            q8_iters_small: env_usize("SPLASH_CUDA_Q8_IT_SMALL", q8_iters).clamp(1, 8),
            graph_pdl: std::env::var("SPLASH_CUDA_GRAPH_PDL").is_ok_and(|v| v == "1"),
            graph_pdl_att: std::env::var("SPLASH_CUDA_GRAPH_PDL_ATT").map_or(true, |v| v != "0"),
            graph_pdl_kernels: std::env::var("SPLASH_CUDA_GRAPH_PDL_K")
                .map(|v| v.split(',').map(str::to_string).filter(|s| !s.is_empty()).collect())
                .unwrap_or_default(),
            device_candidates: std::env::var("SPLASH_CUDA_CANDIDATES").map_or(true, |v| v != "0"),
            gu_fuse: std::env::var("SPLASH_CUDA_GU_FUSE").map(|v| v != "0").unwrap_or(true),
            att_q8: std::env::var("SPLASH_CUDA_ATT_Q8").map(|v| v != "0").unwrap_or(true),
            repack: std::env::var("SPLASH_CUDA_REPACK").map(|v| v != "0").unwrap_or(true),
            att_dyn: std::env::var("SPLASH_CUDA_ATT_DYN").map(|v| v != "0").unwrap_or(true),
            xperm: std::env::var("SPLASH_CUDA_XPERM").map(|v| v != "0").unwrap_or(true),
            fuse_norm: std::env::var("SPLASH_CUDA_FUSE_NORM").map(|v| v != "0").unwrap_or(true),
            qkv_rope: std::env::var("SPLASH_CUDA_QKV_ROPE").map(|v| v != "0").unwrap_or(true),
            gu_smem: std::env::var("SPLASH_CUDA_GU_SMEM").is_ok_and(|v| v == "1"),
            att_warps: env_usize("SPLASH_CUDA_ATT_WARPS", ATT_WARPS).clamp(1, 32),
            gu_dot2: std::env::var("SPLASH_CUDA_GU_DOT2").map(|v| v != "0").unwrap_or(true),
            x6: std::env::var("SPLASH_CUDA_X6").is_ok_and(|v| v == "1"),
            wcg: std::env::var("SPLASH_CUDA_WCG").is_ok_and(|v| v == "1"),
            att_cl: match env_usize("SPLASH_CUDA_ATT_CL", ATT_CL) {
                c @ (2 | 4 | 8 | 16) => c,
                _ => 0,
            },
            att_cl_rows: env_usize("SPLASH_CUDA_ATT_CL_ROWS", ATT_CL_ROWS),
            att_splits: env_usize("SPLASH_CUDA_ATT_SPLITS", 16).clamp(1, 128),
            att_long: env_usize("SPLASH_CUDA_ATT_LONG", 512),
            ahead: std::env::var("SPLASH_CUDA_AHEAD").map_or(true, |v| v != "0"),
        }
    }
}

/// The environment variable `name` as a number, or `default` when unset or not a number.
fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What loading cost: NVRTC compile seconds (0 on a cache hit), upload seconds.
#[derive(Debug, Clone, Default)]
pub struct CudaLoadStats {
    pub compile_s: f64,
    pub cache_hit: bool,
    pub upload_s: f64,
    pub weight_bytes: usize,
    pub kv_tokens: usize,
    pub gpu: String,
    pub arch: String,
    /// Why long chunks do not use tensor cores (None: they do).
    pub no_gemm: Option<String>,
}

fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q6_K)
}

struct GMat {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    buf: DevBuf,
}

struct GLayer {
    attn_norm: DevBuf,
    wq: GMat,
    wk: GMat,
    wv: GMat,
    bq: Option<DevBuf>,
    bk: Option<DevBuf>,
    bv: Option<DevBuf>,
    q_norm: Option<DevBuf>,
    k_norm: Option<DevBuf>,
    wo: GMat,
    ffn_norm: DevBuf,
    gate: GMat,
    up: GMat,
    down: GMat,
}

struct SeqState {
    len: usize,
    pages: Vec<u32>,
}

/// Activations and per-step metadata, sized for `cap_m` rows, `cap_chunks` sequences and `cap_r` logit rows.
struct Scratch {
    cap_m: usize,
    cap_chunks: usize,
    cap_r: usize,
    x: DevBuf,
    xn: DevBuf,
    q: DevBuf,
    k: DevBuf,
    v: DevBuf,
    att: DevBuf,
    gate: DevBuf,
    up: DevBuf,
    /// Rounded activations (see `CudaOptions::exact_activations`).
    xq: DevBuf,
    /// 8-bit activations (int8) and their per-32 {scale, scale * sum} of the dp4a kernels.
    xq8: DevBuf,
    xds: DevBuf,
    /// A second pair for kernels that read one set and write the next (gate/up writes the down projection's input).
    xq8b: DevBuf,
    xdsb: DevBuf,
    /// Attention partials of the splits.
    part: DevBuf,
    /// Per (row, head): splits finished (the last one merges); zero between launches.
    counters: DevBuf,
    logits: DevBuf,
    /// Greedy token of each logit row (`Runner::forward_argmax`).
    ids: DevBuf,
    /// Each greedy pick's softmax probability (`Runner::forward_top`).
    probs: DevBuf,
    /// The [`DEVICE_CANDIDATES`] largest logits of each segment of each row (`topk_rows`, for
    /// `Runner::forward_candidates`), in one buffer so that one copy brings them back: a flag per (row, segment), set
    /// when the device could not select them (too many ties; the host then selects from the row), then the
    /// segments' sorted keys.
    cand: DevBuf,
    /// Partials of the blocks that reduce one logit row together in `argmax_rows`, and per row the count of blocks
    /// done (zero between launches).
    row_part: DevBuf,
    row_counters: DevBuf,
    /// A pass's metadata (tokens, positions, slots, logit rows, page tables: [`Meta`]), copied in one piece from
    /// `meta_host` (page-locked, so the copy is asynchronous; `meta_copied` marks its end before the next rewrite).
    meta: DevBuf,
    meta_host: backend::cuda::Pinned<u32>,
    meta_copied: cudarc::driver::CudaEvent,
}

/// Where a pass's metadata lies in `Scratch::meta` (device addresses), packed for its rows `m`, logit rows `r` and
/// sequences: tokens, positions and slots (`m` each), logit rows (`r`), then a page table per sequence. Graphs are
/// kept per (m, r, sequences), so a replay finds the same places.
#[derive(Debug, Clone, Copy, Default)]
struct Meta {
    tokens: u64,
    pos: u64,
    slot: u64,
    out_rows: u64,
    table: u64,
}

impl Meta {
    /// The layout for `m` rows, `r` logit rows, from `base`; and the u32 words it takes with `nchunks` page tables of
    /// `max_pages`.
    fn packed(base: u64, m: usize, r: usize, nchunks: usize, max_pages: usize) -> (Meta, usize) {
        let at = |words: usize| base + 4 * words as u64;
        let meta = Meta { tokens: at(0), pos: at(m), slot: at(2 * m), out_rows: at(3 * m), table: at(3 * m + r) };
        (meta, 3 * m + r + nchunks * max_pages)
    }
}

/// Writes a pass's metadata in the [`Meta::packed`] layout into `w`: each row's token, position and sequence slot,
/// the logit rows, then each sequence's page table (`pages(chunk)`, zero-padded to `max_pages`).
fn pack_meta<'p>(batch: &Batch<'_>, pages: impl Fn(usize) -> &'p [u32], max_pages: usize, w: &mut [u32]) {
    let (m, r) = (batch.num_tokens(), batch.num_logit_rows());
    let mut put = |at: usize, v: u32| w[at] = v;
    let (mut t0, mut o) = (0usize, 0usize);
    for (ci, c) in batch.chunks.iter().enumerate() {
        for (j, &tok) in c.tokens.iter().enumerate() {
            put(t0 + j, tok);
            put(m + t0 + j, (c.start_pos + j) as u32);
            put(2 * m + t0 + j, ci as u32);
        }
        let pg = pages(ci);
        for p in 0..max_pages {
            put(3 * m + r + ci * max_pages + p, pg.get(p).copied().unwrap_or(0));
        }
        let n = c.tokens.len();
        let rows = match c.logits {
            LogitsWanted::Last if n > 0 => t0 + n - 1..t0 + n,
            LogitsWanted::None | LogitsWanted::Last => 0..0,
            LogitsWanted::All => t0..t0 + n,
        };
        for t in rows {
            put(3 * m + o, t as u32);
            o += 1;
        }
        t0 += n;
    }
}

/// A run of batch rows that goes through the layers together.
#[derive(Debug, Clone, Copy)]
struct Seg {
    r0: usize,
    n: usize,
    /// Some: one long chunk, on tensor cores.
    gemm: Option<GemmChunk>,
}

#[derive(Debug, Clone, Copy)]
struct GemmChunk {
    /// Index of the chunk in the batch (its page table row).
    ci: usize,
    start_pos: usize,
}

/// Buffers of the tensor-core path, for `cap_m` rows and sequences up to `cap_kv` positions.
struct GemmScratch {
    cap_m: usize,
    cap_kv: usize,
    /// f16 activations.
    xh: DevBuf,
    /// One dequantized weight matrix (f16).
    wh: DevBuf,
    /// f16 queries.
    qh: DevBuf,
    /// The chunk's sequence's K and V, contiguous f16.
    kg: DevBuf,
    vg: DevBuf,
    /// Attention scores (f32) and probabilities (f16) of one block of query rows.
    s: DevBuf,
    p: DevBuf,
}

struct Graph(CudaGraph);
// SAFETY: the graph is only launched from the thread that owns the runner; CUDA handles may move between threads.
unsafe impl Send for Graph {}

pub struct CudaRunner {
    cfg: ModelConfig,
    gpu: Gpu,
    _module: Arc<CudaModule>,
    funcs: HashMap<String, CudaFunction>,
    embd: GMat,
    /// None: tied to `embd`.
    output: Option<GMat>,
    output_norm: DevBuf,
    layers: Vec<GLayer>,
    inv_freq: DevBuf,
    kc: Vec<DevBuf>,
    vc: Vec<DevBuf>,
    max_pages: usize,
    free_pages: Vec<u32>,
    seqs: HashMap<SeqId, SeqState>,
    scratch: Option<Scratch>,
    /// Per (rows, logit rows, sequences, pick on the device: `pick`, clustered attention: `att_cl`, decode
    /// attention splits: `att_sg`).
    graphs: HashMap<(usize, usize, usize, u8, bool, usize), Graph>,
    /// This pass's attention runs in clusters (`CudaOptions::att_cl`): set by `run` when every sequence's context
    /// needs at most that many splits.
    att_cl: std::cell::Cell<bool>,
    /// This pass's decode attention launch has room for this many splits (`CudaOptions::att_long`): set by `run`
    /// from its longest context.
    att_sg: std::cell::Cell<usize>,
    /// Where this pass's metadata lies (set by `run` before its kernels are enqueued or its graph captured).
    meta: std::cell::Cell<Meta>,
    /// Logits of the last forward pass (page-locked: copied straight from the device).
    logits: Option<backend::cuda::PinnedF32>,
    opts: CudaOptions,
    /// Layers whose products run on 8-bit activations (every matrix Q4_K / Q6_K, `CudaOptions::q8`).
    q8_layers: Vec<bool>,
    /// The output matrix runs on 8-bit activations.
    q8_out: bool,
    blas: Option<Blas>,
    segs: Vec<Seg>,
    gemm_scratch: Option<GemmScratch>,
    /// A CUDA graph is being captured (programmatic dependent launch inside graphs only where chosen).
    capturing: std::cell::Cell<bool>,
    /// The kernels launched now may use programmatic dependent launch inside graphs too (`CudaOptions::graph_pdl_att`).
    pdl_scope: std::cell::Cell<bool>,
    /// What the pass ends with: 0 the logits, 1 their argmax per row (`Runner::forward_argmax`), 2 also its
    /// probability (`Runner::forward_top`), 3 each row's largest logits (`Runner::forward_candidates`).
    pick: std::cell::Cell<u8>,
    /// Rows whose largest logits the device could not select (`forward_candidates` fell back to the host).
    host_selected: std::cell::Cell<usize>,
    /// `SPLASH_CUDA_TIME_STEPS=1`: the device's time per pass, split into the copies of the pass's metadata and the
    /// pass itself (CUDA events; each pass then waits for its end, so for measuring only).
    step_timer: Option<StepTimer>,
    /// The pass started ahead by [`Runner::forward_argmax_ahead`], not yet asked for.
    ahead: Option<Ahead>,
    /// Where one-row passes leave their pick for the host (`argmax_rows`' ring: page-locked, two u64 slots keyed by
    /// the pass's position), and an event per slot marking the pass's end.
    ahead_ring: backend::cuda::Pinned<u32>,
    ahead_done: [cudarc::driver::CudaEvent; 2],
    pub stats: CudaLoadStats,
}

/// A decode pass enqueued ahead of its call: position `pos` of `seq`, whose token is the pick of the pass before,
/// written on the device (`argmax_rows`' feed). The sequence's length counts it only once a call asks for it.
struct Ahead {
    seq: SeqId,
    pos: usize,
    /// The pick it was fed, which the call that takes it must hold as its token.
    token: u32,
}

impl Drop for CudaRunner {
    /// A pass started ahead may still be running, and it writes the page-locked ring.
    fn drop(&mut self) {
        let _ = self.gpu.sync();
    }
}

// SAFETY: every CUDA object here is used only through &mut self, from one thread at a time; the context is bound
// to the calling thread before each use.
unsafe impl Send for CudaRunner {}

/// CUDA events around each pass (`SPLASH_CUDA_TIME_STEPS=1`) and what they measured.
struct StepTimer {
    start: cudarc::driver::CudaEvent,
    copied: cudarc::driver::CudaEvent,
    end: cudarc::driver::CudaEvent,
    steps: usize,
    copies_ms: f64,
    pass_ms: f64,
}

fn event_err(e: cudarc::driver::DriverError) -> Error {
    Error::Backend(format!("CUDA event: {e:?}"))
}

/// The logit a `topk_rows` key came from (`fkey` in the kernels: its `total_cmp` order as an unsigned number), bit
/// for bit.
fn from_total_key(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 { k & 0x7FFF_FFFF } else { !k })
}

/// The `n` largest of a row from its segments' lists (`words`: the lists of `c` keys each, as little-endian pairs of
/// u32; each list sorted descending, 0 padding): largest first, ties in id order, as [`crate::top_candidates`].
fn merge_segment_keys(words: &[u32], c: usize, n: usize) -> Vec<(u32, f32)> {
    let lists: Vec<Vec<u64>> = words
        .chunks_exact(2 * c)
        .map(|l| l.chunks_exact(2).map(|w| w[0] as u64 | (w[1] as u64) << 32).take_while(|&k| k != 0).collect())
        .collect();
    let mut at = vec![0usize; lists.len()];
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let best = (0..lists.len()).filter(|&b| at[b] < lists[b].len()).max_by_key(|&b| lists[b][at[b]]);
        let Some(b) = best else { break };
        let key = lists[b][at[b]];
        at[b] += 1;
        out.push((!(key as u32), from_total_key((key >> 32) as u32)));
    }
    out
}

fn type_id(ty: GgmlType) -> u32 {
    ty.to_u32()
}

fn mmv_name(ty: GgmlType, k: usize, mr: usize, mode: u32) -> String {
    format!("mmv_{}_{k}_{mr}_{mode}", type_id(ty))
}
fn gu_name(ty: GgmlType, k: usize, mr: usize) -> String {
    format!("mmvgu_{}_{k}_{mr}", type_id(ty))
}
fn gun_name(ty: GgmlType, k: usize, mr: usize) -> String {
    format!("mmvgun_{}_{k}_{mr}", type_id(ty))
}
fn qkv_name(tq: GgmlType, tk: GgmlType, tv: GgmlType, mr: usize) -> String {
    format!("qkv_{}_{}_{}_{mr}", type_id(tq), type_id(tk), type_id(tv))
}
fn qkvn_name(tq: GgmlType, tk: GgmlType, tv: GgmlType, mr: usize) -> String {
    format!("qkvn_{}_{}_{}_{mr}", type_id(tq), type_id(tk), type_id(tv))
}
fn dequant_name(ty: GgmlType, k: usize) -> String {
    format!("dequant_{}_{k}", type_id(ty))
}
fn embed_name(ty: GgmlType, k: usize) -> String {
    format!("embed_{}_{k}", type_id(ty))
}

const MRS: [usize; 4] = [1, 2, 4, 8];

/// Whether a `ty` matrix with rows of `cols` has an 8-bit-activation (dp4a) matrix-vector kernel (weights are taken
/// 64 at a time).
fn q8_ok(ty: GgmlType, cols: usize) -> bool {
    use GgmlType::*;
    match ty {
        Q4_K | Q6_K => cols.is_multiple_of(256),
        Q8_0 | Q5_0 => cols.is_multiple_of(64),
        _ => false,
    }
}

/// Matrices of fewer values than this take `CudaOptions::q8_iters_small` pairs per thread.
const Q8_SMALL_VALUES: usize = 64 << 20;

/// Threads that split one weight row of length `k` (`n` rows) in the 8-bit-activation kernels: enough that each
/// takes at most `iters` pairs of 32-blocks (`(large, small)` by the matrix's size), more for small matrices (at
/// least ~32k threads in all), at most `cap`.
fn q8_threads(k: usize, n: usize, (large, small): (usize, usize), cap: usize) -> usize {
    let iters = if k * n < Q8_SMALL_VALUES { small } else { large };
    let pairs = k / 64;
    let mut p = 4;
    while p < cap && pairs.div_ceil(p) > iters {
        p *= 2;
    }
    while p < cap.min(32) && n * p < 32768 && pairs.div_ceil(p) > 1 {
        p *= 2;
    }
    p
}

fn mmvq_name(ty: GgmlType, k: usize, p: usize, mr: usize, mode: u32) -> String {
    format!("mmvq_{}_{k}_{p}_{mr}_{mode}", type_id(ty))
}
/// A Q6_K matrix (the down projection, the output matrix) on its input in the xpos6 layout (`CudaOptions::x6`).
fn mmvq6_name(k: usize, p: usize, mr: usize, mode: u32) -> String {
    format!("mmvq6_{k}_{p}_{mr}_{mode}")
}
fn guq_name(ty: GgmlType, k: usize, p: usize, mr: usize) -> String {
    format!("guq_{}_{k}_{p}_{mr}", type_id(ty))
}
/// The gate/up kernel also writes its output as 8-bit activations (blocks of 32 rows, 32 * p threads). Not above 8
/// threads per row: with 1024-thread blocks (p = 32, the 32B's gate/up) ptxas keeps 32 registers per thread and
/// spills the loaded weights (580 bytes of spill stores, `--ptxas-options=-v`).
fn guq_fused(p: usize) -> bool {
    p <= 8
}
fn qkvq_name(tq: GgmlType, tk: GgmlType, tv: GgmlType, p: usize, mr: usize) -> String {
    format!("qkvq_{}_{}_{}_{p}_{mr}", type_id(tq), type_id(tk), type_id(tv))
}

/// The 8-bit-activation kernels a model needs: (type, row length, threads per row) for plain and gate/up products,
/// (q, k, v types, threads per row) for the fused QKV.
#[derive(Debug, Clone, Default)]
pub struct Q8Kernels {
    pub mats: Vec<(GgmlType, usize, usize)>,
    pub gu: Vec<(GgmlType, usize, usize)>,
    pub qkv: Vec<(GgmlType, GgmlType, GgmlType, usize)>,
    /// Gate/up kernels with p <= 8 also write the down projection's 8-bit input.
    pub gu_fuse: bool,
    /// Q4_K / Q6_K matrices in the repacked device layout (see [`device_layout`]).
    pub repack: bool,
    /// The attention kernel uses only as many of its splits as the context needs.
    pub att_dyn: bool,
    /// 8-bit activation rows in the permuted layout (`xpos` in kernels.cu): coalesced loads in the kernels above.
    pub xperm: bool,
    /// QKV and gate/up normalise and quantize their input in the prologue (`CudaOptions::fuse_norm`).
    pub fuse_norm: bool,
    /// QKV applies RoPE and writes the KV cache in the epilogue (`CudaOptions::qkv_rope`).
    pub qkv_rope: bool,
    /// Q4_K gate/up kernels that write the down input (up to 4 rows per block) keep the up rows' weights in shared
    /// memory (`CudaOptions::gu_smem`).
    pub gu_smem: bool,
    /// Warps of an attention block (`CudaOptions::att_warps`; 0 reads as the default).
    pub att_warps: usize,
    /// `CudaOptions::gu_dot2`.
    pub gu_dot2: bool,
    /// `CudaOptions::x6` (needs `xperm`).
    pub x6: bool,
    /// `CudaOptions::wcg`.
    pub wcg: bool,
    /// `CudaOptions::att_cl` (0: no cluster kernel).
    pub att_cl: usize,
    /// Decode attention splits a row takes at most while its context is short (`CudaOptions::att_splits`) ...
    pub att_splits: usize,
    /// ... and positions per split past that (`CudaOptions::att_long`; 0: no more splits).
    pub att_long: usize,
}

/// Largest hidden size whose 8 rows of 8-bit activations (with their scales) the fused-norm kernels keep in static
/// shared memory (48 KiB per block in all).
pub const FUSE_NORM_MAX_HIDDEN: usize = 4096;

/// The device layout of a matrix's bytes (rows of `cols` values): Q6_K blocks padded from 210 to 224 bytes (every
/// block 16-byte aligned); Q8_0 and Q5_0 blocks with two zero bytes after the f16 scale (36 and 24 bytes: the rest
/// 4-byte aligned); other types as stored. With `repack`, Q4_K and Q6_K rows are regrouped field by field instead
/// (same row sizes, [`repack_row`]).
fn device_layout(ty: GgmlType, cols: usize, bytes: &[u8], repack: bool) -> std::borrow::Cow<'_, [u8]> {
    if repack && matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) && cols.is_multiple_of(256) {
        let (from, to) = if ty == GgmlType::Q4_K { (144, 144) } else { (210, 224) };
        let nsb = cols / 256;
        let mut out = vec![0u8; bytes.len() / from * to];
        for (src, dst) in bytes.chunks_exact(nsb * from).zip(out.chunks_exact_mut(nsb * to)) {
            repack_row(ty, nsb, src, dst);
        }
        return std::borrow::Cow::Owned(out);
    }
    let (from, to, at) = match ty {
        GgmlType::Q6_K => (210, 224, 210),
        GgmlType::Q8_0 => (34, 36, 2),
        GgmlType::Q5_0 => (22, 24, 2),
        _ => return std::borrow::Cow::Borrowed(bytes),
    };
    let mut out = Vec::with_capacity(bytes.len() / from * to);
    for b in bytes.chunks_exact(from) {
        out.extend_from_slice(&b[..at]);
        out.extend(std::iter::repeat_n(0u8, to - from));
        out.extend_from_slice(&b[at..]);
    }
    std::borrow::Cow::Owned(out)
}

/// One row of `nsb` Q4_K or Q6_K superblocks (`src`, as stored) into the repacked layout (`dst`, zeroed). Pair p of
/// the row is its 64 weights that one thread of the 8-bit kernels takes (superblock p / 4); its 32 quant bytes are
/// split into two 16-byte halves stored in two regions, so threads p and p + 1 load neighbouring 16 bytes.
/// Q4_K: [first halves: nsb * 64][second halves: nsb * 64][headers d, dmin, scales: nsb * 16].
/// Q6_K: [ql first halves: nsb * 64][ql second halves: nsb * 64][qh first halves: nsb * 32][qh second halves:
/// nsb * 32][scales: nsb * 16][d: nsb * 2][zero padding: nsb * 14] (qh run r = 2 sb + hf is shared by two pairs).
fn repack_row(ty: GgmlType, nsb: usize, src: &[u8], dst: &mut [u8]) {
    let mut put = |at: usize, from: &[u8]| dst[at..at + from.len()].copy_from_slice(from);
    if ty == GgmlType::Q4_K {
        for (sb, b) in src.chunks_exact(144).enumerate() {
            for j in 0..4 {
                let p = 4 * sb + j;
                put(16 * p, &b[16 + 32 * j..32 + 32 * j]);
                put(nsb * 64 + 16 * p, &b[32 + 32 * j..48 + 32 * j]);
            }
            put(nsb * 128 + 16 * sb, &b[..16]);
        }
    } else {
        for (sb, b) in src.chunks_exact(210).enumerate() {
            for p4 in 0..4 {
                let p = 4 * sb + p4;
                put(16 * p, &b[32 * p4..32 * p4 + 16]);
                put(nsb * 64 + 16 * p, &b[32 * p4 + 16..32 * p4 + 32]);
            }
            for hf in 0..2 {
                let r = 2 * sb + hf;
                put(nsb * 128 + 16 * r, &b[128 + 32 * hf..144 + 32 * hf]);
                put(nsb * 160 + 16 * r, &b[144 + 32 * hf..160 + 32 * hf]);
            }
            put(nsb * 192 + 16 * sb, &b[192..208]);
            put(nsb * 208 + 2 * sb, &b[208..210]);
        }
    }
}

/// Warps that share one weight row of length `k` in the matrix-vector kernels (long rows: more loads in flight).
fn warps_per_row(k: usize) -> usize {
    if k >= 4096 { 4 } else { 1 }
}

/// Attention splits over the positions for a batch of `m` rows: many for decode (`decode`, up to 16 rows), where
/// rows x heads alone would leave most of the GPU idle. A row's splits depend on its context only (each split takes
/// at least `ATT_MIN_SPLIT` positions), never on the other rows of its batch up to 16.
fn att_splits(m: usize, decode: usize) -> usize {
    match m {
        0..=16 => decode,
        17..=64 => 4,
        _ => 1,
    }
}

/// Room for the decode attention splits of contexts up to `longest` positions: `att_splits`, or past `att_splits` x
/// `att_long` positions one split per `att_long` positions, rounded up to a power of two (at most 128), so that few
/// graphs cover every context. The kernel takes as many of them as each row's own context needs.
fn decode_splits(opts: &CudaOptions, longest: usize) -> usize {
    let base = opts.att_splits.max(1);
    if opts.att_long == 0 || longest <= base * opts.att_long {
        return base;
    }
    longest.div_ceil(opts.att_long).next_power_of_two().clamp(base, 128)
}

/// How the CPU backend rounds activations for a weight type: None (f32), Some(0) Q8_0/Q8_1, Some(1) Q8_K.
fn act_fmt(ty: GgmlType) -> Option<u32> {
    use GgmlType::*;
    match ty {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 => Some(0),
        Q4_K | Q5_K | Q6_K => Some(1),
        _ => None,
    }
}

fn pick_mr(m: usize) -> usize {
    match m {
        0 | 1 => 1,
        2 => 2,
        3 | 4 => 4,
        _ => 8,
    }
}

/// The kernel source for `cfg`: constants, the library, and one instantiation per (type, row length) in use.
pub fn kernel_source(
    cfg: &ModelConfig,
    mats: &[(GgmlType, usize)],
    gu: &[(GgmlType, usize)],
    qkv: &[(GgmlType, GgmlType, GgmlType)],
    embd: (GgmlType, usize),
    q8: &Q8Kernels,
) -> String {
    let max_pages = cfg.max_context.div_ceil(PAGE_SIZE);
    let att_warps = if q8.att_warps == 0 { ATT_WARPS } else { q8.att_warps };
    let mut s = String::new();
    let defs = [
        ("HIDDEN", cfg.hidden_size),
        ("Q_DIM", cfg.q_dim()),
        ("KV_DIM", cfg.kv_dim()),
        ("HEAD_DIM", cfg.head_dim),
        ("NUM_HEADS", cfg.num_heads),
        ("NUM_KV_HEADS", cfg.num_kv_heads),
        ("FFN", cfg.ffn_size),
        ("ROPE_DIM", cfg.rope_dim),
        ("ROPE_NEOX", usize::from(cfg.rope_style == RopeStyle::Neox)),
        ("PAGE_SIZE", PAGE_SIZE),
        ("MAX_PAGES", max_pages),
        ("ATT_WARPS", att_warps),
    ];
    for (k, v) in defs {
        s.push_str(&format!("#define {k} {v}\n"));
    }
    s.push_str(&format!("#define RMS_EPS {:e}f\n", cfg.rms_eps));
    s.push_str(&format!("#define REPACK {}\n#define ATT_DYN {}\n", u8::from(q8.repack), u8::from(q8.att_dyn)));
    s.push_str(&format!("#define XPERM {}\n", u8::from(q8.xperm)));
    s.push_str(&format!("#define FUSE_NORM {}\n#define QKV_ROPE {}\n", u8::from(q8.fuse_norm), u8::from(q8.qkv_rope)));
    s.push_str(&format!("#define ATT_MIN_SPLIT {}\n#define ATT_CL {}\n", 32 * att_warps, q8.att_cl));
    s.push_str(&format!("#define ATT_SPLITS {}\n#define ATT_LONG {}\n", q8.att_splits.max(1), q8.att_long));
    s.push_str(&format!("#define GU_DOT2 {}\n#define WCG {}\n", u8::from(q8.gu_dot2), u8::from(q8.wcg)));
    s.push_str(backend::cuda::KERNELS);
    s.push('\n');
    for &(ty, k) in mats {
        let t = type_id(ty);
        for mr in MRS {
            for mode in 0..2 {
                s.push_str(&format!(
                    "extern \"C\" __global__ void __launch_bounds__(128) {}(const u8* W, const float* X, float* Y, \
                     const float* bias, int m, int N) {{ pdl_trigger(); mmv_body<{t}, {k}, {mr}, {mode}, {}>(W, X, Y, bias, m, N); }}\n",
                    mmv_name(ty, k, mr, mode),
                    warps_per_row(k)
                ));
            }
        }
    }
    for &(ty, k) in mats {
        s.push_str(&format!(
            "extern \"C\" __global__ void __launch_bounds__(256) {}(const u8* W, u16* out, int N) {{ \
             PDL_ENTER dequant_body<{}, {k}>(W, out, N); }}\n",
            dequant_name(ty, k),
            type_id(ty)
        ));
    }
    for &(ty, k) in gu {
        let t = type_id(ty);
        for mr in MRS {
            s.push_str(&format!(
                "extern \"C\" __global__ void __launch_bounds__(128) {}(const u8* Wg, const u8* Wu, const float* X, \
                 float* Y, int m, int N) {{ pdl_trigger(); mmv_gu_body<{t}, {k}, {mr}, false>(Wg, Wu, X, Y, m, N, \
                 nullptr); }}\n",
                gu_name(ty, k, mr)
            ));
            s.push_str(&format!(
                "extern \"C\" __global__ void __launch_bounds__(128) {}(const u8* Wg, const u8* Wu, const float* X, \
                 float* Y, int m, int N, const float* g) {{ pdl_trigger(); mmv_gu_body<{t}, {k}, {mr}, true>(Wg, Wu, \
                 X, Y, m, N, g); }}\n",
                gun_name(ty, k, mr)
            ));
        }
    }
    for &(tq, tk, tv) in qkv {
        for mr in MRS {
            s.push_str(&format!(
                "extern \"C\" __global__ void __launch_bounds__(128) {}(const u8* Wq, const u8* Wk, const u8* Wv, \
                 const float* X, const float* g, const float* bq, const float* bk, const float* bv, float* q, float* k, \
                 float* v, int m) {{ PDL_ENTER qkv_body<{}, {}, {}, {mr}>(Wq, Wk, Wv, X, g, bq, bk, bv, q, k, v, m); }}\n",
                qkvn_name(tq, tk, tv, mr),
                type_id(tq),
                type_id(tk),
                type_id(tv)
            ));
            s.push_str(&format!(
                "extern \"C\" __global__ void __launch_bounds__(128) {}(const u8* Wq, const u8* Wk, const u8* Wv, \
                 const float* X, const float* g, const float* bq, const float* bk, const float* bv, float* q, \
                 const float* inv_freq, const u32* pos, const u32* slot, const u32* table, u16* kc, u16* vc, int m) \
                 {{ PDL_ENTER qkv_rope_body<{}, {}, {}, {mr}>(Wq, Wk, Wv, X, g, bq, bk, bv, q, inv_freq, pos, slot, table, kc, \
                 vc, m); }}\n",
                qkv_name(tq, tk, tv, mr),
                type_id(tq),
                type_id(tk),
                type_id(tv)
            ));
        }
    }
    let (ty, k) = embd;
    s.push_str(&format!(
        "extern \"C\" __global__ void {}(const u8* W, const u32* tokens, float* out) {{ PDL_ENTER embed_body<{}, {k}>(W, tokens, \
         out); }}\n",
        embed_name(ty, k),
        type_id(ty)
    ));
    for &(ty, k, p) in &q8.mats {
        for mr in MRS {
            for mode in 0..2 {
                s.push_str(&format!(
                    "extern \"C\" __global__ void __launch_bounds__(128) {}(const u8* W, const i8* Xq, const float2* Xd, \
                     float* Y, const float* bias, int m, int N) {{ pdl_trigger(); mmvq_body<{}, {k}, {mr}, {mode}, {p}>(W, \
                     Xq, Xd, Y, bias, m, N); }}\n",
                    mmvq_name(ty, k, p, mr, mode),
                    type_id(ty)
                ));
                if q8.x6 && ty == GgmlType::Q6_K {
                    s.push_str(&format!(
                        "extern \"C\" __global__ void __launch_bounds__(128) {}(const u8* W, const i8* Xq, const float2* \
                         Xd, float* Y, const float* bias, int m, int N) {{ pdl_trigger(); mmvq_body<{}, {k}, {mr}, {mode}, \
                         {p}, true>(W, Xq, Xd, Y, bias, m, N); }}\n",
                        mmvq6_name(k, p, mr, mode),
                        type_id(ty)
                    ));
                }
            }
        }
    }
    for &(ty, k, p) in &q8.gu {
        for mr in MRS {
            let (threads, fused) = if guq_fused(p) && q8.gu_fuse { (32 * p, "true") } else { (128, "false") };
            let norm = q8.fuse_norm && k == cfg.hidden_size;
            let us = q8.gu_smem && ty == GgmlType::Q4_K && fused == "true" && mr <= 4;
            let bounds = if us { format!("{threads}, 3") } else { format!("{threads}") };
            s.push_str(&format!(
                "extern \"C\" __global__ void __launch_bounds__({bounds}) {}(const u8* Wg, const u8* Wu, const i8* Xq, \
                 const float2* Xd, float* Y, int m, int N, i8* Qo, float2* Do, const float* X, const float* gn, int l6) \
                 {{ pdl_trigger(); guq_body<{}, {k}, {mr}, {p}, {fused}, {norm}, {us}>(Wg, Wu, Xq, Xd, Y, m, N, Qo, Do, \
                 X, gn, l6); }}\n",
                guq_name(ty, k, p, mr),
                type_id(ty)
            ));
        }
    }
    for &(tq, tk, tv, p) in &q8.qkv {
        for mr in MRS {
            s.push_str(&format!(
                "extern \"C\" __global__ void __launch_bounds__(128) {}(const u8* Wq, const u8* Wk, const u8* Wv, \
                 const i8* Xq, const float2* Xd, const float* bq, const float* bk, const float* bv, float* q, float* k, \
                 float* v, int m, const float* X, const float* g, const float* inv_freq, const u32* pos, const u32* slot, \
                 const u32* table, u16* kc, u16* vc) {{ pdl_trigger(); qkvq_body<{}, {}, {}, {mr}, {p}>(Wq, Wk, Wv, Xq, \
                 Xd, bq, bk, bv, q, k, v, m, X, g, inv_freq, pos, slot, table, kc, vc); }}\n",
                qkvq_name(tq, tk, tv, p, mr),
                type_id(tq),
                type_id(tk),
                type_id(tv)
            ));
        }
    }
    s
}

/// Kernel arguments: each stored in 8 bytes (ints in the low half, little-endian), passed by address.
struct Args(Vec<u64>);

impl Args {
    fn ptrs(&mut self) -> Vec<*mut c_void> {
        self.0.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect()
    }
}

fn i(v: usize) -> u64 {
    v as u32 as u64
}

impl CudaRunner {
    pub fn new(file: Arc<GgufFile>, opts: CudaOptions) -> Result<Self> {
        let cfg = crate::arch::config_from_gguf(&file)?;
        if cfg.head_dim % 32 != 0 || cfg.hidden_size % 32 != 0 || cfg.ffn_size % 32 != 0 {
            return Err(Error::Backend(format!(
                "the CUDA backend needs head_dim, hidden and FFN sizes that are multiples of 32 (got {}, {}, {})",
                cfg.head_dim, cfg.hidden_size, cfg.ffn_size
            )));
        }
        let weights = Weights::load(&file, &cfg)?;
        let gpu = Gpu::new(opts.device)?;
        let mut opts = opts;
        opts.pdl &= gpu.cc.0 >= 9;
        let mut stats = CudaLoadStats { gpu: gpu.name.clone(), arch: gpu.arch(), ..Default::default() };

        // Which (type, row length) pairs the kernels must cover.
        let mut mats: Vec<(GgmlType, usize)> = Vec::new();
        let mut gu: Vec<(GgmlType, usize)> = Vec::new();
        let add = |v: &mut Vec<(GgmlType, usize)>, ty: GgmlType, k: usize| {
            if !v.contains(&(ty, k)) {
                v.push((ty, k));
            }
        };
        for m in weights.matrices() {
            if !supported(m.ty) {
                return Err(Error::Backend(format!("the CUDA backend does not support {} matrices yet", m.ty)));
            }
        }
        for l in &weights.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                add(&mut mats, m.ty, m.cols);
            }
            if l.w_gate.ty == l.w_up.ty {
                add(&mut gu, l.w_gate.ty, l.w_gate.cols);
            }
        }
        add(&mut mats, weights.output.ty, weights.output.cols);
        let mut qkv: Vec<(GgmlType, GgmlType, GgmlType)> = Vec::new();
        for l in &weights.layers {
            let t = (l.wq.ty, l.wk.ty, l.wv.ty);
            if !qkv.contains(&t) {
                qkv.push(t);
            }
        }
        // Layers (and the output matrix) on the 8-bit-activation kernels, and the instantiations they need.
        let q8_on = opts.q8 && !opts.exact_activations;
        let it = opts.q8_its();
        opts.x6 &= opts.xperm;
        opts.fuse_norm &= q8_on && cfg.hidden_size <= FUSE_NORM_MAX_HIDDEN && cfg.hidden_size.is_multiple_of(64);
        opts.qkv_rope &= q8_on
            && !cfg.qk_norm
            && cfg.q_dim().is_multiple_of(32)
            && cfg.kv_dim().is_multiple_of(32)
            && cfg.head_dim.is_multiple_of(2)
            && cfg.rope_dim <= cfg.head_dim;
        let mut q8k = Q8Kernels {
            gu_fuse: opts.gu_fuse,
            repack: opts.repack,
            att_dyn: opts.att_dyn,
            xperm: opts.xperm,
            fuse_norm: opts.fuse_norm,
            qkv_rope: opts.qkv_rope,
            gu_smem: opts.gu_smem,
            att_warps: opts.att_warps,
            gu_dot2: opts.gu_dot2,
            x6: opts.x6,
            wcg: opts.wcg,
            att_cl: opts.att_cl,
            att_splits: opts.att_splits,
            att_long: opts.att_long,
            ..Q8Kernels::default()
        };
        let mut q8_layers = Vec::with_capacity(weights.layers.len());
        let add3 = |v: &mut Vec<(GgmlType, usize, usize)>, e: (GgmlType, usize, usize)| {
            if !v.contains(&e) {
                v.push(e);
            }
        };
        for l in &weights.layers {
            let all = [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down];
            let on = q8_on
                && all.iter().all(|m| q8_ok(m.ty, m.cols))
                && [&l.wq, &l.wk, &l.wv].iter().all(|m| m.cols == cfg.hidden_size);
            q8_layers.push(on);
            if !on {
                continue;
            }
            let t = (l.wq.ty, l.wk.ty, l.wv.ty, q8_threads(cfg.hidden_size, cfg.q_dim() + 2 * cfg.kv_dim(), it, 32));
            if !q8k.qkv.contains(&t) {
                q8k.qkv.push(t);
            }
            for m in [&l.wo, &l.w_down] {
                add3(&mut q8k.mats, (m.ty, m.cols, q8_threads(m.cols, m.rows, it, 128)));
            }
            if l.w_gate.ty == l.w_up.ty {
                add3(&mut q8k.gu, (l.w_gate.ty, l.w_gate.cols, q8_threads(l.w_gate.cols, l.w_gate.rows, it, 32)));
            } else {
                for m in [&l.w_gate, &l.w_up] {
                    add3(&mut q8k.mats, (m.ty, m.cols, q8_threads(m.cols, m.rows, it, 128)));
                }
            }
        }
        let q8_out = q8_on && q8_ok(weights.output.ty, weights.output.cols);
        if q8_out {
            let m = &weights.output;
            add3(&mut q8k.mats, (m.ty, m.cols, q8_threads(m.cols, m.rows, it, 128)));
        }
        let src = kernel_source(&cfg, &mats, &gu, &qkv, (weights.token_embd.ty, cfg.hidden_size), &q8k);
        let (module, compile_s, hit) = gpu.compile(&src, opts.cache_dir.clone())?;
        stats.compile_s = compile_s;
        stats.cache_hit = hit;
        let mut funcs = HashMap::new();
        let mut names: Vec<String> = vec!["rms_norm".into(), "silu_mul".into(), "qk_norm".into(), "rope_kv".into()];
        names.extend(["attention", "attn_combine", "act_q8_0", "act_q8_k"].map(String::from));
        names.extend(
            ["to_f16", "add_bias", "kv_gather", "softmax_causal", "argmax_rows", "topk_rows"].map(String::from),
        );
        for &(ty, k) in &mats {
            names.push(dequant_name(ty, k));
            for mr in MRS {
                names.push(mmv_name(ty, k, mr, 0));
                names.push(mmv_name(ty, k, mr, 1));
            }
        }
        for &(ty, k) in &gu {
            for mr in MRS {
                names.push(gu_name(ty, k, mr));
                names.push(gun_name(ty, k, mr));
            }
        }
        for &(tq, tk, tv) in &qkv {
            for mr in MRS {
                names.push(qkv_name(tq, tk, tv, mr));
                names.push(qkvn_name(tq, tk, tv, mr));
            }
        }
        names.push(embed_name(weights.token_embd.ty, cfg.hidden_size));
        names.push("quant_q8".into());
        for &(ty, k, p) in &q8k.mats {
            for mr in MRS {
                names.push(mmvq_name(ty, k, p, mr, 0));
                names.push(mmvq_name(ty, k, p, mr, 1));
                if q8k.x6 && ty == GgmlType::Q6_K {
                    names.push(mmvq6_name(k, p, mr, 0));
                    names.push(mmvq6_name(k, p, mr, 1));
                }
            }
        }
        for &(ty, k, p) in &q8k.gu {
            names.extend(MRS.map(|mr| guq_name(ty, k, p, mr)));
        }
        for &(tq, tk, tv, p) in &q8k.qkv {
            names.extend(MRS.map(|mr| qkvq_name(tq, tk, tv, p, mr)));
        }
        if q8k.att_cl > 1 {
            names.push("attention_cl".into());
        }
        for n in names {
            let f = module.load_function(&n).map_err(|e| Error::Backend(format!("kernel {n}: {e:?}")))?;
            if n == "attention_cl" && q8k.att_cl > 8 {
                use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED;
                f.set_attribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
                    .map_err(|e| Error::Backend(format!("kernel {n}: cluster size {}: {e:?}", q8k.att_cl)))?;
            }
            funcs.insert(n, f);
        }

        let t0 = std::time::Instant::now();
        let mut weight_bytes = 0usize;
        let mut up_mat = |m: &backend::cpu::QMatrix| -> Result<GMat> {
            weight_bytes += m.bytes.as_slice().len();
            let buf = gpu.upload(&device_layout(m.ty, m.cols, m.bytes.as_slice(), opts.repack))?;
            Ok(GMat { ty: m.ty, rows: m.rows, cols: m.cols, buf })
        };
        let embd = up_mat(&weights.token_embd)?;
        let output = if cfg.tied_embeddings { None } else { Some(up_mat(&weights.output)?) };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in &weights.layers {
            let opt = |v: &Option<Vec<f32>>| -> Result<Option<DevBuf>> {
                v.as_ref().map(|v| gpu.upload(v)).transpose().map_err(Error::from)
            };
            layers.push(GLayer {
                attn_norm: gpu.upload(&l.attn_norm)?,
                wq: up_mat(&l.wq)?,
                wk: up_mat(&l.wk)?,
                wv: up_mat(&l.wv)?,
                bq: opt(&l.bq)?,
                bk: opt(&l.bk)?,
                bv: opt(&l.bv)?,
                q_norm: opt(&l.q_norm)?,
                k_norm: opt(&l.k_norm)?,
                wo: up_mat(&l.wo)?,
                ffn_norm: gpu.upload(&l.ffn_norm)?,
                gate: up_mat(&l.w_gate)?,
                up: up_mat(&l.w_up)?,
                down: up_mat(&l.w_down)?,
            });
        }
        let output_norm = gpu.upload(&weights.output_norm)?;
        // RoPE inverse frequencies computed exactly as the CPU's `Rope` does: a running product of theta^(-2/d) in f32.
        let half = cfg.rope_dim / 2;
        let step = cfg.rope_theta.powf(-2.0 / cfg.rope_dim as f32);
        let inv_freq: Vec<f32> = std::iter::successors(Some(1.0f32), |f| Some(f * step)).take(half.max(1)).collect();
        let inv_freq = gpu.upload(&inv_freq)?;
        gpu.sync()?;
        stats.upload_s = t0.elapsed().as_secs_f64();
        stats.weight_bytes = weight_bytes;

        // KV pool.
        let kvd = cfg.kv_dim();
        let page_bytes = PAGE_SIZE * kvd * 2;
        let kv_tokens = if opts.kv_tokens > 0 {
            opts.kv_tokens
        } else {
            let (free, _) = gpu.mem_info()?;
            let per_token = cfg.kv_bytes_per_token().max(1);
            (free / 2 / per_token).min(256 * 1024)
        };
        let num_pages = kv_tokens.div_ceil(PAGE_SIZE).max(1);
        let mut kc = Vec::new();
        let mut vc = Vec::new();
        for _ in 0..cfg.num_layers {
            kc.push(gpu.alloc(num_pages * page_bytes)?);
            vc.push(gpu.alloc(num_pages * page_bytes)?);
        }
        stats.kv_tokens = num_pages * PAGE_SIZE;
        let max_pages = cfg.max_context.div_ceil(PAGE_SIZE);
        let blas = if !opts.gemm {
            stats.no_gemm = Some("turned off (SPLASH_CUDA_GEMM=0)".into());
            None
        } else if cfg.num_heads % cfg.num_kv_heads != 0 {
            stats.no_gemm = Some("query heads are not a multiple of the KV heads".into());
            None
        } else {
            match Blas::new(&gpu) {
                Ok(b) => Some(b),
                Err(e) => {
                    stats.no_gemm = Some(e.to_string());
                    None
                }
            }
        };
        let step_timer = if std::env::var("SPLASH_CUDA_TIME_STEPS").is_ok_and(|v| v == "1") {
            let ev =
                || gpu.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(event_err);
            Some(StepTimer { start: ev()?, copied: ev()?, end: ev()?, steps: 0, copies_ms: 0.0, pass_ms: 0.0 })
        } else {
            None
        };
        let blocking =
            || gpu.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(event_err);
        let ahead_done = [blocking()?, blocking()?];
        let ahead_ring = gpu.alloc_pinned::<u32>(4)?;
        Ok(CudaRunner {
            cfg,
            gpu,
            _module: module,
            funcs,
            embd,
            output,
            output_norm,
            layers,
            inv_freq,
            kc,
            vc,
            max_pages,
            free_pages: (0..num_pages as u32).rev().collect(),
            seqs: HashMap::new(),
            scratch: None,
            graphs: HashMap::new(),
            meta: std::cell::Cell::new(Meta::default()),
            logits: None,
            opts,
            q8_layers,
            q8_out,
            blas,
            segs: Vec::new(),
            gemm_scratch: None,
            capturing: std::cell::Cell::new(false),
            pdl_scope: std::cell::Cell::new(false),
            pick: std::cell::Cell::new(0),
            att_cl: std::cell::Cell::new(false),
            att_sg: std::cell::Cell::new(0),
            host_selected: std::cell::Cell::new(0),
            step_timer,
            ahead: None,
            ahead_ring,
            ahead_done,
            stats,
        })
    }

    /// Enqueues position `pos` of `seq` behind the pass in the stream, fed with that pass's pick ([`Ahead`]). Nothing
    /// when the sequence may not grow (its context or the KV cache is full): a call for that step then runs it and
    /// reports why it cannot.
    fn start_ahead(&mut self, seq: SeqId, pos: usize) -> Result<()> {
        let fed_on_device = [0u32];
        let chunk = crate::SeqChunk { seq, tokens: &fed_on_device, start_pos: pos, logits: LogitsWanted::Last };
        let next = Batch { chunks: vec![chunk] };
        if self.validate(&next).is_err() {
            return Ok(());
        }
        self.run_picking(&next, true, 1)?;
        self.ahead_done[pos % 2].record(&self.gpu.stream).map_err(event_err)?;
        self.ahead = Some(Ahead { seq, pos, token: u32::MAX });
        Ok(())
    }

    /// [`Self::run`] with `pick` selecting on the device (the `pick` cell is set for that pass only).
    fn run_picking(&mut self, batch: &Batch<'_>, ahead: bool, pick: u8) -> Result<usize> {
        self.pick.set(pick);
        let res = self.run(batch, ahead);
        self.pick.set(0);
        res
    }

    /// The pass started ahead, when `batch` is exactly its step (one chunk: its sequence, the pick it was fed, its
    /// position, a logit row): it counts from now, and its position is returned (its pick: [`Self::ring_pick`]).
    /// Otherwise it stays where it is (any later pass drops it).
    fn take_ahead(&mut self, batch: &Batch<'_>) -> Option<usize> {
        let a = self.ahead.as_ref()?;
        let [c] = batch.chunks.as_slice() else { return None };
        let same = c.seq == a.seq
            && c.start_pos == a.pos
            && c.tokens == [a.token]
            && c.logits != LogitsWanted::None
            && self.seq_len(a.seq) == a.pos;
        if !same {
            return None;
        }
        let pos = a.pos;
        self.ahead = None;
        self.seqs.get_mut(&c.seq).expect("INVARIANT: started ahead for a held sequence").len += 1;
        Some(pos)
    }

    /// The pick of the one-row pass at position `pos` once it is done (`ahead_done[pos % 2]` recorded after it),
    /// from the ring `argmax_rows` writes.
    fn ring_pick(&self, pos: usize) -> Result<u32> {
        self.ahead_done[pos % 2].synchronize().map_err(event_err)?;
        // A little-endian u64: the pick, then the position. (The next pass may be writing the other slot.)
        let (pick, at) =
            (self.ahead_ring.read_volatile(2 * (pos % 2)), self.ahead_ring.read_volatile(2 * (pos % 2) + 1));
        if at as usize != pos {
            return Err(Error::Backend(format!("decode ahead: no pick for position {pos} (found {at})")));
        }
        Ok(pick)
    }

    /// Lowers the context a sequence may reach. Never raises it past the model's own.
    pub fn limit_context(&mut self, max_context: usize) {
        self.cfg.max_context = self.cfg.max_context.min(max_context.max(1));
    }

    /// With `SPLASH_CUDA_TIME_STEPS=1`: passes timed since the last call, and the device's mean milliseconds per pass
    /// for the metadata copies and for the pass itself; the counts start again.
    pub fn take_step_times(&mut self) -> Option<(usize, f64, f64)> {
        let t = self.step_timer.as_mut()?;
        let n = t.steps.max(1) as f64;
        let out = (t.steps, t.copies_ms / n, t.pass_ms / n);
        (t.steps, t.copies_ms, t.pass_ms) = (0, 0.0, 0.0);
        Some(out)
    }

    /// Rows of [`Runner::forward_candidates`] selected on the host because the device gave up (more than 2,048
    /// logits tied at a segment's threshold), since the runner started.
    pub fn host_selected_rows(&self) -> usize {
        self.host_selected.get()
    }

    pub fn device_name(&self) -> &str {
        &self.gpu.name
    }

    fn validate(&self, batch: &Batch<'_>) -> Result<()> {
        batch.validate(&self.cfg, |seq| self.seq_len(seq))?;
        let new_pages: usize = batch
            .chunks
            .iter()
            .map(|c| {
                let have = self.seqs.get(&c.seq).map_or(0, |s| s.pages.len());
                (c.start_pos + c.tokens.len()).div_ceil(PAGE_SIZE).saturating_sub(have)
            })
            .sum();
        if new_pages > self.free_pages.len() {
            return Err(Error::Backend(format!(
                "the GPU KV cache is full ({} pages of {PAGE_SIZE} tokens free, {new_pages} needed)",
                self.free_pages.len()
            )));
        }
        Ok(())
    }

    fn ensure_scratch(&mut self, m: usize, chunks: usize, r: usize) -> Result<()> {
        if let Some(s) = &self.scratch
            && s.cap_m >= m
            && s.cap_chunks >= chunks
            && s.cap_r >= r
        {
            return Ok(());
        }
        let old = self.scratch.as_ref().map_or((0, 0, 0), |s| (s.cap_m, s.cap_chunks, s.cap_r));
        let (m, chunks, r) = (m.max(old.0).max(8), chunks.max(old.1).max(8), r.max(old.2).max(8));
        self.graphs.clear();
        // A copy from the old page-locked metadata may still be in flight.
        self.gpu.sync()?;
        self.scratch = None;
        let c = &self.cfg;
        let g = &self.gpu;
        let f = 4usize;
        let meta_words = Meta::packed(0, m, r, chunks, self.max_pages).1;
        self.scratch = Some(Scratch {
            cap_m: m,
            cap_chunks: chunks,
            cap_r: r,
            x: g.alloc(m * c.hidden_size * f)?,
            xn: g.alloc(m.max(r) * c.hidden_size * f)?,
            q: g.alloc(m * c.q_dim() * f)?,
            k: g.alloc(m * c.kv_dim() * f)?,
            v: g.alloc(m * c.kv_dim() * f)?,
            att: g.alloc(m * c.q_dim() * f)?,
            gate: g.alloc(m * c.ffn_size * f)?,
            up: g.alloc(m * c.ffn_size * f)?,
            xq: g.alloc(m.max(r) * c.hidden_size.max(c.q_dim()).max(c.ffn_size) * f)?,
            xq8: g.alloc(m.max(r) * c.hidden_size.max(c.q_dim()).max(c.ffn_size))?,
            xds: g.alloc(m.max(r) * c.hidden_size.max(c.q_dim()).max(c.ffn_size) / 32 * 8)?,
            xq8b: g.alloc(m * c.ffn_size)?,
            xdsb: g.alloc(m * c.ffn_size / 32 * 8)?,
            part: g.alloc(
                (1..=m).map(|k| k * att_splits(k, decode_splits(&self.opts, self.cfg.max_context))).max().unwrap_or(1)
                    * c.num_heads
                    * (c.head_dim + 2)
                    * f,
            )?,
            counters: g.upload(&vec![0u32; m * c.num_heads])?,
            logits: g.alloc(r * c.vocab_size * f)?,
            ids: g.alloc(r * 4)?,
            probs: g.alloc(r * 4)?,
            cand: g.alloc(r * TOPK_BLOCKS * (4 + DEVICE_CANDIDATES * 8))?,
            row_part: g.alloc(r * ARGMAX_BLOCKS * 16)?,
            row_counters: g.upload(&vec![0u32; r])?,
            meta: g.alloc(meta_words * 4)?,
            meta_host: g.alloc_pinned(meta_words)?,
            meta_copied: g
                .ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(event_err)?,
        });
        Ok(())
    }

    fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, mut args: Args) -> Result<()> {
        let f = self.funcs.get(name).ok_or_else(|| Error::Backend(format!("kernel {name} was not compiled")))?;
        if !self.opts.skip.is_empty() && self.opts.skip.iter().any(|s| name.contains(s.as_str())) {
            return Ok(());
        }
        let mut p = args.ptrs();
        let in_graph = self.opts.graph_pdl
            || self.pdl_scope.get()
            || self.opts.graph_pdl_kernels.iter().any(|k| name.contains(k.as_str()));
        let pdl = self.opts.pdl && (!self.capturing.get() || in_graph);
        self.gpu.launch_pdl(f, grid, block, &mut p, pdl)?;
        Ok(())
    }

    /// The activations to multiply `w` with: `x` itself, or `x` rounded as the CPU backend would (into `xq`, reused
    /// while `memo` says it already holds `x` in that format).
    fn act(&self, w: &GMat, x: u64, m: usize, memo: &mut Option<(u64, u32)>) -> Result<u64> {
        let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
        let Some(fmt) = act_fmt(w.ty).filter(|_| self.opts.exact_activations) else { return Ok(x) };
        if *memo == Some((x, fmt)) {
            return Ok(s.xq.ptr);
        }
        let k = w.cols;
        let bl = if fmt == 0 { 32 } else { 256 };
        let grid = (m as u32, (k / bl).div_ceil(8) as u32, 1);
        let name = if fmt == 0 { "act_q8_0" } else { "act_q8_k" };
        self.launch(name, grid, 256, Args(vec![x, s.xq.ptr, i(k)]))?;
        *memo = Some((x, fmt));
        Ok(s.xq.ptr)
    }

    /// Y[m, N] (+)= W X[m, K] (+ bias).
    fn mmv(&self, w: &GMat, x: u64, y: u64, bias: Option<&DevBuf>, m: usize, residual: bool) -> Result<()> {
        let mut memo = None;
        self.mmv_m(w, x, y, bias, m, residual, &mut memo)
    }

    #[allow(clippy::too_many_arguments)]
    fn mmv_m(
        &self,
        w: &GMat,
        x: u64,
        y: u64,
        bias: Option<&DevBuf>,
        m: usize,
        residual: bool,
        memo: &mut Option<(u64, u32)>,
    ) -> Result<()> {
        let x = self.act(w, x, m, memo)?;
        let mr = pick_mr(m);
        let name = mmv_name(w.ty, w.cols, mr, u32::from(residual));
        let grid = (w.rows.div_ceil(4 / warps_per_row(w.cols)) as u32, m.div_ceil(mr) as u32, 1);
        let b = bias.map_or(0, |b| b.ptr);
        self.launch(&name, grid, 128, Args(vec![w.buf.ptr, x, y, b, i(m), i(w.rows)]))
    }

    /// Rows [0, m) of `x` (width `k`; with `norm`, RMS-normalised with those weights first; with `rows`, the rows
    /// that table names) quantized to 8 bits into `xq` (int8) and `xd` (a float2 per 32 values).
    #[allow(clippy::too_many_arguments)]
    fn quant(&self, x: u64, norm: u64, rows: u64, xq: u64, xd: u64, m: usize, k: usize) -> Result<()> {
        self.quant_l(x, norm, rows, xq, xd, m, k, false)
    }
    /// `quant`, in the xpos6 layout with `l6` (the input of a Q6_K down projection, `CudaOptions::x6`).
    #[allow(clippy::too_many_arguments)]
    fn quant_l(&self, x: u64, norm: u64, rows: u64, xq: u64, xd: u64, m: usize, k: usize, l6: bool) -> Result<()> {
        let args = Args(vec![x, norm, rows, xq, xd, i(k), u64::from(l6)]);
        self.launch("quant_q8", (m as u32, k.div_ceil(256) as u32, 1), 256, args)
    }

    /// The per-head q/k RMSNorm where the layer has one (Qwen3), then RoPE and the K/V write into layer `li`'s cache,
    /// for `mu` rows at `[q, k, v]` with their `[positions, cache slots, block table]`.
    fn qk_norm_rope_kv(
        &self,
        l: &GLayer,
        li: usize,
        [q, k, v]: [u64; 3],
        [pos, slot, table]: [u64; 3],
        mu: u32,
    ) -> Result<()> {
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            self.launch("qk_norm", (mu, 1, 1), 128, Args(vec![q, k, qn.ptr, kn.ptr]))?;
        }
        let pairs = (self.cfg.num_heads + self.cfg.num_kv_heads) * self.cfg.head_dim / 2;
        self.launch(
            "rope_kv",
            (mu, pairs.div_ceil(ROPE_THREADS as usize) as u32, 1),
            ROPE_THREADS,
            Args(vec![q, k, v, self.inv_freq.ptr, pos, slot, table, self.kc[li].ptr, self.vc[li].ptr]),
        )
    }

    /// Y[m, N] (+)= W X[m, K] (+ bias) on 8-bit activations (`quant` output).
    #[allow(clippy::too_many_arguments)]
    fn mmvq(&self, w: &GMat, xq: u64, xd: u64, y: u64, bias: Option<&DevBuf>, m: usize, residual: bool) -> Result<()> {
        self.mmvq_l(w, xq, xd, y, bias, m, residual, false)
    }
    /// `mmvq` on an input in the xpos6 layout with `l6` (a Q6_K down projection, `CudaOptions::x6`).
    #[allow(clippy::too_many_arguments)]
    fn mmvq_l(
        &self,
        w: &GMat,
        xq: u64,
        xd: u64,
        y: u64,
        bias: Option<&DevBuf>,
        m: usize,
        residual: bool,
        l6: bool,
    ) -> Result<()> {
        let pt = q8_threads(w.cols, w.rows, self.opts.q8_its(), 128);
        let mr = pick_mr(m);
        let name = if l6 {
            mmvq6_name(w.cols, pt, mr, u32::from(residual))
        } else {
            mmvq_name(w.ty, w.cols, pt, mr, u32::from(residual))
        };
        let grid = (w.rows.div_ceil((128 / pt).max(1)) as u32, m.div_ceil(mr) as u32, 1);
        let b = bias.map_or(0, |b| b.ptr);
        self.launch(&name, grid, 128, Args(vec![w.buf.ptr, xq, xd, y, b, i(m), i(w.rows)]))
    }

    /// Enqueues the whole forward pass for the batch's segments (`self.segs`, covering `m` rows) and `r` logit rows
    /// (metadata already on the device).
    fn enqueue(&self, m: usize, r: usize) -> Result<()> {
        for seg in &self.segs {
            self.enqueue_rows(seg)?;
        }
        if r > 0 && self.q8_out && !(r >= GEMM_MIN_ROWS && self.blas.is_some() && self.opts.gemm) {
            let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
            let out = self.output.as_ref().unwrap_or(&self.embd);
            let l6 = self.opts.x6 && out.ty == GgmlType::Q6_K;
            let h = self.cfg.hidden_size;
            self.quant_l(s.x.ptr, self.output_norm.ptr, self.meta.get().out_rows, s.xq8.ptr, s.xds.ptr, r, h, l6)?;
            self.mmvq_l(out, s.xq8.ptr, s.xds.ptr, s.logits.ptr, None, r, false, l6)?;
        } else if r > 0 {
            let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
            self.launch(
                "rms_norm",
                (r as u32, 1, 1),
                256,
                Args(vec![s.x.ptr, self.output_norm.ptr, s.xn.ptr, self.meta.get().out_rows]),
            )?;
            let out = self.output.as_ref().unwrap_or(&self.embd);
            if r >= GEMM_MIN_ROWS && self.blas.is_some() && self.opts.gemm {
                let gs = self.gemm_scratch.as_ref().expect("INVARIANT: ensure_gemm_scratch ran for r rows");
                self.to_f16(s.xn.ptr, gs.xh.ptr, r * self.cfg.hidden_size)?;
                self.linear(out, gs.xh.ptr, s.logits.ptr, None, r, false)?;
            } else {
                self.mmv(out, s.xn.ptr, s.logits.ptr, None, r, false)?;
            }
        }
        if r > 0 && self.pick.get() == 3 {
            let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
            let (vocab, c) = (self.cfg.vocab_size, DEVICE_CANDIDATES.min(self.cfg.vocab_size));
            let (flags, keys) = (s.cand.ptr, s.cand.ptr + (r * TOPK_BLOCKS * 4) as u64);
            let args = vec![s.logits.ptr, i(vocab), i(c), keys, flags];
            self.launch("topk_rows", (r as u32, TOPK_BLOCKS as u32, 1), 1024, Args(args))?;
        } else if r > 0 && self.pick.get() > 0 {
            let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
            let vocab = self.cfg.vocab_size;
            let probs = if self.pick.get() == 2 { s.probs.ptr } else { 0 };
            // One row of one token: its pick also feeds the next pass, should that pass have started ahead.
            let (feed, ring) = if m == 1 && r == 1 { (self.meta.get().tokens, self.ahead_ring.addr()) } else { (0, 0) };
            let args = vec![s.logits.ptr, i(vocab), s.ids.ptr, probs, s.row_part.ptr, s.row_counters.ptr, feed, ring];
            self.launch("argmax_rows", (r as u32, ARGMAX_BLOCKS as u32, 1), 256, Args(args))?;
        }
        Ok(())
    }

    /// Every layer for the rows of one segment: matrix-vector kernels, or tensor-core GEMMs for a long chunk.
    fn enqueue_rows(&self, seg: &Seg) -> Result<()> {
        let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
        let c = &self.cfg;
        let (r0, m) = (seg.r0, seg.n);
        let mu = m as u32;
        let f = 4u64;
        let row = |b: &DevBuf, width: usize| b.ptr + (r0 * width) as u64 * f;
        let (x, xn) = (row(&s.x, c.hidden_size), row(&s.xn, c.hidden_size));
        let (q, k, v) = (row(&s.q, c.q_dim()), row(&s.k, c.kv_dim()), row(&s.v, c.kv_dim()));
        let att = row(&s.att, c.q_dim());
        let (gate, up) = (row(&s.gate, c.ffn_size), row(&s.up, c.ffn_size));
        let meta = self.meta.get();
        let (tokens, pos, slot) = (meta.tokens + 4 * r0 as u64, meta.pos + 4 * r0 as u64, meta.slot + 4 * r0 as u64);
        self.launch(
            &embed_name(self.embd.ty, c.hidden_size),
            (mu, 1, 1),
            128,
            Args(vec![self.embd.buf.ptr, tokens, x]),
        )?;
        let p = |b: &Option<DevBuf>| b.as_ref().map_or(0, |b| b.ptr);
        for (li, l) in self.layers.iter().enumerate() {
            if let Some(gc) = seg.gemm {
                let gs = self.gemm_scratch.as_ref().expect("INVARIANT: ensure_gemm_scratch ran");
                self.launch("rms_norm", (mu, 1, 1), 256, Args(vec![x, l.attn_norm.ptr, xn, 0]))?;
                self.to_f16(xn, gs.xh.ptr, m * c.hidden_size)?;
                self.linear(&l.wq, gs.xh.ptr, q, l.bq.as_ref(), m, false)?;
                self.linear(&l.wk, gs.xh.ptr, k, l.bk.as_ref(), m, false)?;
                self.linear(&l.wv, gs.xh.ptr, v, l.bv.as_ref(), m, false)?;
                self.qk_norm_rope_kv(l, li, [q, k, v], [pos, slot, meta.table], mu)?;
                self.gemm_attention(li, gc, q, att, m)?;
                self.to_f16(att, gs.xh.ptr, m * c.q_dim())?;
                self.linear(&l.wo, gs.xh.ptr, x, None, m, true)?;
                self.launch("rms_norm", (mu, 1, 1), 256, Args(vec![x, l.ffn_norm.ptr, xn, 0]))?;
                self.to_f16(xn, gs.xh.ptr, m * c.hidden_size)?;
                self.linear(&l.gate, gs.xh.ptr, gate, None, m, false)?;
                self.linear(&l.up, gs.xh.ptr, up, None, m, false)?;
                let n = m * c.ffn_size;
                self.launch("silu_mul", (n.div_ceil(256) as u32, 1, 1), 256, Args(vec![gate, up, i(n)]))?;
                self.to_f16(gate, gs.xh.ptr, n)?;
                self.linear(&l.down, gs.xh.ptr, x, None, m, true)?;
                continue;
            }
            // The fused kernel re-reads the activations and norm weights per weight row (from L1): it pays for small
            // models only (measured: 1.5B faster, 32B slower). Chosen per model, never per batch, so a sequence's
            // results do not depend on the batch it runs in.
            let fused = !self.opts.exact_activations
                && c.hidden_size <= 2048
                && c.rope_dim == c.head_dim
                && !c.qk_norm
                && c.head_dim.is_multiple_of(2);
            let q8 = self.q8_layers[li];
            // Rows of the 8-bit activation scratch for an input of width k (this segment's rows).
            let qb = |k: usize| (s.xq8.ptr + (r0 * k) as u64, s.xds.ptr + (r0 * (k / 32) * 8) as u64);
            if q8 {
                // Attention RMSNorm + 8-bit quantization (in the QKV kernel's prologue with `fuse_norm`), then Q, K,
                // V in one launch (dp4a), with RoPE and the KV write in its epilogue (`qkv_rope`).
                let (xq, xd) = qb(c.hidden_size);
                if !self.opts.fuse_norm {
                    self.quant(x, l.attn_norm.ptr, 0, xq, xd, m, c.hidden_size)?;
                }
                let rows = c.q_dim() + 2 * c.kv_dim();
                let pt = q8_threads(c.hidden_size, rows, self.opts.q8_its(), 32);
                let mr = pick_mr(m);
                self.launch(
                    &qkvq_name(l.wq.ty, l.wk.ty, l.wv.ty, pt, mr),
                    (rows.div_ceil(128 / pt) as u32, m.div_ceil(mr) as u32, 1),
                    128,
                    Args(vec![
                        l.wq.buf.ptr,
                        l.wk.buf.ptr,
                        l.wv.buf.ptr,
                        xq,
                        xd,
                        p(&l.bq),
                        p(&l.bk),
                        p(&l.bv),
                        q,
                        k,
                        v,
                        i(m),
                        x,
                        l.attn_norm.ptr,
                        self.inv_freq.ptr,
                        pos,
                        slot,
                        meta.table,
                        self.kc[li].ptr,
                        self.vc[li].ptr,
                    ]),
                )?;
                if !self.opts.qkv_rope {
                    self.qk_norm_rope_kv(l, li, [q, k, v], [pos, slot, meta.table], mu)?;
                }
            } else if !fused || !self.opts.fuse_rope {
                if fused {
                    // RMSNorm fused into one launch of the three projections.
                    let mr = pick_mr(m);
                    let rows = c.q_dim() + 2 * c.kv_dim();
                    self.launch(
                        &qkvn_name(l.wq.ty, l.wk.ty, l.wv.ty, mr),
                        (rows.div_ceil(4) as u32, m.div_ceil(mr) as u32, 1),
                        128,
                        Args(vec![
                            l.wq.buf.ptr,
                            l.wk.buf.ptr,
                            l.wv.buf.ptr,
                            x,
                            l.attn_norm.ptr,
                            p(&l.bq),
                            p(&l.bk),
                            p(&l.bv),
                            q,
                            k,
                            v,
                            i(m),
                        ]),
                    )?;
                } else {
                    self.launch("rms_norm", (mu, 1, 1), 256, Args(vec![x, l.attn_norm.ptr, xn, 0]))?;
                    let mut memo = None;
                    self.mmv_m(&l.wq, xn, q, l.bq.as_ref(), m, false, &mut memo)?;
                    self.mmv_m(&l.wk, xn, k, l.bk.as_ref(), m, false, &mut memo)?;
                    self.mmv_m(&l.wv, xn, v, l.bv.as_ref(), m, false, &mut memo)?;
                }
                self.qk_norm_rope_kv(l, li, [q, k, v], [pos, slot, meta.table], mu)?;
            } else {
                // RMSNorm, biases, RoPE and the KV write fused into one launch of the three projections.
                let mr = pick_mr(m);
                let pairs = (c.q_dim() + 2 * c.kv_dim()) / 2;
                self.launch(
                    &qkv_name(l.wq.ty, l.wk.ty, l.wv.ty, mr),
                    (pairs.div_ceil(4) as u32, m.div_ceil(mr) as u32, 1),
                    128,
                    Args(vec![
                        l.wq.buf.ptr,
                        l.wk.buf.ptr,
                        l.wv.buf.ptr,
                        x,
                        l.attn_norm.ptr,
                        p(&l.bq),
                        p(&l.bk),
                        p(&l.bv),
                        q,
                        self.inv_freq.ptr,
                        pos,
                        slot,
                        meta.table,
                        self.kc[li].ptr,
                        self.vc[li].ptr,
                        i(m),
                    ]),
                )?;
            }
            // Decode batches split the positions most: into one cluster of `att_cl` splits while the contexts fit.
            let splits = att_splits(m, self.att_sg.get());
            let cl = self.att_cl.get() && m <= self.opts.att_cl_rows && splits >= self.opts.att_cl;
            // From the attention to its output projection, kernels start while the one before drains, in graphs too.
            self.pdl_scope.set(self.opts.graph_pdl_att);
            self.launch(
                if cl { "attention_cl" } else { "attention" },
                (mu, c.num_heads as u32, if cl { self.opts.att_cl } else { splits } as u32),
                (32 * self.opts.att_warps) as u32,
                Args(vec![
                    q,
                    self.kc[li].ptr,
                    self.vc[li].ptr,
                    pos,
                    slot,
                    meta.table,
                    s.part.ptr,
                    att,
                    s.counters.ptr,
                    if q8 && self.opts.att_q8 { qb(c.q_dim()).0 } else { 0 },
                    if q8 && self.opts.att_q8 { qb(c.q_dim()).1 } else { 0 },
                ]),
            )?;
            if q8 {
                // The attention kernel also wrote its output as 8-bit activations (unless turned off).
                let (aq, ad) = qb(c.q_dim());
                if !self.opts.att_q8 {
                    self.quant(att, 0, 0, aq, ad, m, c.q_dim())?;
                }
                self.mmvq(&l.wo, aq, ad, x, None, m, true)?;
                self.pdl_scope.set(false);
                let (fq, fd) = qb(c.hidden_size);
                // The gate/up kernel normalises and quantizes its input itself with `fuse_norm`.
                if !(self.opts.fuse_norm && l.gate.ty == l.up.ty) {
                    self.quant(x, l.ffn_norm.ptr, 0, fq, fd, m, c.hidden_size)?;
                }
                let (dq, dd) =
                    (s.xq8b.ptr + (r0 * c.ffn_size) as u64, s.xdsb.ptr + (r0 * (c.ffn_size / 32) * 8) as u64);
                let mut down_in_q8 = false;
                let l6 = self.opts.x6 && l.down.ty == GgmlType::Q6_K && l.down.cols == c.ffn_size;
                if l.gate.ty == l.up.ty {
                    let pt = q8_threads(l.gate.cols, l.gate.rows, self.opts.q8_its(), 32);
                    let mr = pick_mr(m);
                    down_in_q8 = guq_fused(pt) && self.opts.gu_fuse;
                    let (ty, kc, n) = (l.gate.ty, l.gate.cols, l.gate.rows);
                    let args = Args(vec![
                        l.gate.buf.ptr,
                        l.up.buf.ptr,
                        fq,
                        fd,
                        gate,
                        i(m),
                        i(n),
                        dq,
                        dd,
                        x,
                        l.ffn_norm.ptr,
                        u64::from(l6),
                    ]);
                    let (rows_per_block, threads) = if down_in_q8 { (32, 32 * pt) } else { (128 / pt, 128) };
                    self.launch(
                        &guq_name(ty, kc, pt, mr),
                        (n.div_ceil(rows_per_block) as u32, m.div_ceil(mr) as u32, 1),
                        threads as u32,
                        args,
                    )?;
                } else {
                    self.mmvq(&l.gate, fq, fd, gate, None, m, false)?;
                    self.mmvq(&l.up, fq, fd, up, None, m, false)?;
                    let n = m * c.ffn_size;
                    self.launch("silu_mul", (n.div_ceil(256) as u32, 1, 1), 256, Args(vec![gate, up, i(n)]))?;
                }
                if !down_in_q8 {
                    self.quant_l(gate, 0, 0, dq, dd, m, c.ffn_size, l6)?;
                }
                self.mmvq_l(&l.down, dq, dd, x, None, m, true, l6)?;
                continue;
            }
            self.mmv(&l.wo, att, x, None, m, true)?;
            self.pdl_scope.set(false);
            let mut memo = None;
            if l.gate.ty == l.up.ty && fused && self.opts.fuse_ffn_norm {
                // The FFN RMSNorm fused into the gate/up kernel (as the attention norm is into QKV).
                let mr = pick_mr(m);
                let grid = (l.gate.rows.div_ceil(4) as u32, m.div_ceil(mr) as u32, 1);
                self.launch(
                    &gun_name(l.gate.ty, l.gate.cols, mr),
                    grid,
                    128,
                    Args(vec![l.gate.buf.ptr, l.up.buf.ptr, x, gate, i(m), i(l.gate.rows), l.ffn_norm.ptr]),
                )?;
            } else if l.gate.ty == l.up.ty {
                self.launch("rms_norm", (mu, 1, 1), 256, Args(vec![x, l.ffn_norm.ptr, xn, 0]))?;
                let xin = self.act(&l.gate, xn, m, &mut memo)?;
                let mr = pick_mr(m);
                let grid = (l.gate.rows.div_ceil(4) as u32, m.div_ceil(mr) as u32, 1);
                self.launch(
                    &gu_name(l.gate.ty, l.gate.cols, mr),
                    grid,
                    128,
                    Args(vec![l.gate.buf.ptr, l.up.buf.ptr, xin, gate, i(m), i(l.gate.rows)]),
                )?;
            } else {
                self.launch("rms_norm", (mu, 1, 1), 256, Args(vec![x, l.ffn_norm.ptr, xn, 0]))?;
                self.mmv_m(&l.gate, xn, gate, None, m, false, &mut memo)?;
                self.mmv_m(&l.up, xn, up, None, m, false, &mut memo)?;
                let n = m * c.ffn_size;
                self.launch("silu_mul", (n.div_ceil(256) as u32, 1, 1), 256, Args(vec![gate, up, i(n)]))?;
            }
            self.mmv(&l.down, gate, x, None, m, true)?;
        }
        Ok(())
    }

    /// Runs the batch up to its logits and what `pick` asks for, enqueued on the stream without waiting; the
    /// sequences' lengths are advanced. Returns the number of logit rows. `ahead`: a decode pass started ahead
    /// ([`Ahead`]): its token and position are already on the device (written by the pass before), and no length is
    /// advanced.
    fn run(&mut self, batch: &Batch<'_>, ahead: bool) -> Result<usize> {
        self.validate(batch)?;
        self.pdl_scope.set(false);
        if !ahead {
            // Whatever was started ahead is not this batch: dropped (it wrote nothing a later pass reads before
            // rewriting it, and the stream runs it before them).
            self.ahead = None;
        }
        self.gpu.bind()?;
        let m = batch.num_tokens();
        let r = batch.num_logit_rows();
        let nchunks = batch.chunks.len();
        if m == 0 {
            return Ok(0);
        }
        self.ensure_scratch(m, nchunks, r)?;
        // Segments: each long chunk alone on tensor cores, runs of short chunks together.
        let gemm_ok = self.blas.is_some() && self.opts.gemm;
        self.segs.clear();
        let mut r0 = 0;
        let mut max_kv = 0;
        for (ci, c) in batch.chunks.iter().enumerate() {
            let n = c.tokens.len();
            if gemm_ok && n >= GEMM_MIN_ROWS {
                self.segs.push(Seg { r0, n, gemm: Some(GemmChunk { ci, start_pos: c.start_pos }) });
                max_kv = max_kv.max(c.start_pos + n);
            } else if let Some(last) = self.segs.last_mut().filter(|s| s.gemm.is_none()) {
                last.n += n;
            } else if n > 0 {
                self.segs.push(Seg { r0, n, gemm: None });
            }
            r0 += n;
        }
        if gemm_ok && (max_kv > 0 || r >= GEMM_MIN_ROWS) {
            self.ensure_gemm_scratch(m, r, max_kv)?;
        }
        // Pages for the new tokens.
        let mut new_pages = false;
        for c in &batch.chunks {
            let st = self.seqs.entry(c.seq).or_insert_with(|| SeqState { len: 0, pages: Vec::new() });
            let need = (c.start_pos + c.tokens.len()).div_ceil(PAGE_SIZE);
            while st.pages.len() < need {
                st.pages.push(self.free_pages.pop().expect("INVARIANT: validate counted the free pages"));
                new_pages = true;
            }
        }
        // Per-row metadata, packed into the page-locked buffer (once the previous pass's copy out of it is done) and
        // copied in one piece. A pass started ahead follows one row of the same sequence, whose pick already wrote
        // its token and advanced the position: nothing is copied unless its page table grew, and then not the
        // token.
        let s = self.scratch.as_mut().expect("INVARIANT: ensured above");
        let (meta, words) = Meta::packed(s.meta.ptr, m, r, nchunks, self.max_pages);
        if !ahead || new_pages {
            s.meta_copied.synchronize().map_err(event_err)?;
            let seqs = &self.seqs;
            pack_meta(
                batch,
                |ci| &seqs[&batch.chunks[ci].seq].pages,
                self.max_pages,
                &mut s.meta_host.as_mut_slice()[..words],
            );
            if let Some(t) = &self.step_timer {
                t.start.record(&self.gpu.stream).map_err(event_err)?;
            }
            if ahead {
                self.gpu.htod_at(&s.meta, 4, &s.meta_host.as_slice()[1..words])?;
            } else {
                self.gpu.htod(&s.meta, &s.meta_host.as_slice()[..words])?;
            }
            s.meta_copied.record(&self.gpu.stream).map_err(event_err)?;
        }
        self.meta.set(meta);
        if let Some(t) = &self.step_timer {
            t.copied.record(&self.gpu.stream).map_err(event_err)?;
        }
        // Clustered attention while every context fits its splits (the same bits as the global merge there; past
        // that the kernel with more splits runs: another graph).
        let att_cap = self.opts.att_cl * 32 * self.opts.att_warps;
        self.att_cl.set(att_cap > 0 && batch.chunks.iter().all(|c| c.start_pos + c.tokens.len() <= att_cap));
        let longest = batch.chunks.iter().map(|c| c.start_pos + c.tokens.len()).max().unwrap_or(0);
        self.att_sg.set(decode_splits(&self.opts, longest));
        let key = (m, r, nchunks, self.pick.get(), self.att_cl.get(), self.att_sg.get());
        if self.opts.graphs && m <= MAX_GRAPH_ROWS {
            if !self.graphs.contains_key(&key) {
                use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
                self.gpu
                    .stream
                    .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .map_err(|e| Error::Backend(format!("graph capture: {e:?}")))?;
                self.capturing.set(true);
                let res = self.enqueue(m, r);
                self.capturing.set(false);
                let g = self.gpu.stream.end_capture(CUgraphInstantiate_flags(0));
                res?;
                match g {
                    Ok(Some(g)) => {
                        self.graphs.insert(key, Graph(g));
                    }
                    Ok(None) => return Err(Error::Backend("graph capture produced no graph".into())),
                    Err(e) => return Err(Error::Backend(format!("graph capture: {e:?}"))),
                }
            }
            self.graphs[&key].0.launch().map_err(|e| Error::Backend(format!("graph launch: {e:?}")))?;
        } else {
            self.enqueue(m, r)?;
        }
        if let Some(t) = self.step_timer.as_mut() {
            t.end.record(&self.gpu.stream).map_err(event_err)?;
            t.copies_ms += t.start.elapsed_ms(&t.copied).map_err(event_err)? as f64;
            t.pass_ms += t.copied.elapsed_ms(&t.end).map_err(event_err)? as f64;
            t.steps += 1;
        }
        if !ahead {
            for c in &batch.chunks {
                if let Some(st) = self.seqs.get_mut(&c.seq) {
                    st.len += c.tokens.len();
                }
            }
        }
        Ok(r)
    }

    /// out[0..n) = f16(x[0..n)).
    fn to_f16(&self, x: u64, out: u64, n: usize) -> Result<()> {
        self.launch("to_f16", (n.div_ceil(4 * 256) as u32, 1, 1), 256, Args(vec![x, out, i(n)]))
    }

    /// Y[m, N] (+)= X[m, K] W^T (+ bias) on tensor cores: W dequantized to f16 into scratch, X already f16 at `xh`.
    fn linear(&self, w: &GMat, xh: u64, y: u64, bias: Option<&DevBuf>, m: usize, residual: bool) -> Result<()> {
        let gs = self.gemm_scratch.as_ref().expect("INVARIANT: ensure_gemm_scratch ran");
        let blas = self.blas.as_ref().expect("INVARIANT: GEMM segments only exist with cuBLAS");
        let units = w.rows * (w.cols / 32);
        self.launch(
            &dequant_name(w.ty, w.cols),
            (units.div_ceil(256) as u32, 1, 1),
            256,
            Args(vec![w.buf.ptr, gs.wh.ptr, i(w.rows)]),
        )?;
        blas.gemm(
            true,
            false,
            (w.rows, m, w.cols),
            1.0,
            BlasMat::new(gs.wh.ptr, BlasType::F16, w.cols),
            BlasMat::new(xh, BlasType::F16, w.cols),
            if residual { 1.0 } else { 0.0 },
            BlasMat::new(y, BlasType::F32, w.rows),
            1,
        )?;
        if let Some(b) = bias {
            let n = m * w.rows;
            self.launch("add_bias", (n.div_ceil(256) as u32, 1, 1), 256, Args(vec![y, b.ptr, i(w.rows), i(n)]))?;
        }
        Ok(())
    }

    /// Causal attention of the `m` rows of one long chunk (queries `q`, rotated, f32) over its sequence's paged
    /// cache, on tensor cores: K and V gathered into contiguous f16 matrices, then per block of query rows scores
    /// (cuBLAS, f32), a causal softmax to f16 probabilities and the weighted sum of V (cuBLAS) into `att`.
    fn gemm_attention(&self, li: usize, gc: GemmChunk, q: u64, att: u64, m: usize) -> Result<()> {
        let gs = self.gemm_scratch.as_ref().expect("INVARIANT: ensure_gemm_scratch ran");
        let blas = self.blas.as_ref().expect("INVARIANT: GEMM segments only exist with cuBLAS");
        let c = &self.cfg;
        let (d, kvd, qd) = (c.head_dim, c.kv_dim(), c.q_dim());
        let group = c.num_heads / c.num_kv_heads;
        let kv_len = gc.start_pos + m;
        let table = self.meta.get().table + (gc.ci * self.max_pages * 4) as u64;
        self.launch(
            "kv_gather",
            (kv_len as u32, 1, 1),
            128,
            Args(vec![self.kc[li].ptr, self.vc[li].ptr, table, gs.kg.ptr, gs.vg.ptr]),
        )?;
        self.to_f16(q, gs.qh.ptr, m * qd)?;
        let scale = 1.0 / (d as f32).sqrt();
        let (h2, f4) = (2u64, 4u64);
        let mut i0 = 0;
        while i0 < m {
            let nb = ATT_BLOCK_ROWS.min(m - i0);
            let kv = gc.start_pos + i0 + nb;
            // Score rows padded to 8 elements (16-byte aligned f16 rows for the tensor cores).
            let ld = kv.next_multiple_of(8);
            for g in 0..c.num_kv_heads {
                blas.gemm(
                    true,
                    false,
                    (kv, nb, d),
                    scale,
                    BlasMat::new(gs.kg.ptr + (g * d) as u64 * h2, BlasType::F16, kvd),
                    BlasMat::new(gs.qh.ptr + (i0 * qd + g * group * d) as u64 * h2, BlasType::F16, qd).strided(d),
                    0.0,
                    BlasMat::new(gs.s.ptr + (g * group * nb * ld) as u64 * f4, BlasType::F32, ld).strided(nb * ld),
                    group,
                )?;
            }
            self.launch(
                "softmax_causal",
                (nb as u32, c.num_heads as u32, 1),
                256,
                Args(vec![gs.s.ptr, gs.p.ptr, i(ld), i(gc.start_pos + i0)]),
            )?;
            for g in 0..c.num_kv_heads {
                blas.gemm(
                    false,
                    false,
                    (d, nb, kv),
                    1.0,
                    BlasMat::new(gs.vg.ptr + (g * d) as u64 * h2, BlasType::F16, kvd),
                    BlasMat::new(gs.p.ptr + (g * group * nb * ld) as u64 * h2, BlasType::F16, ld).strided(nb * ld),
                    0.0,
                    BlasMat::new(att + (i0 * qd + g * group * d) as u64 * f4, BlasType::F32, qd).strided(d),
                    group,
                )?;
            }
            i0 += nb;
        }
        Ok(())
    }

    /// GEMM scratch for `m` rows, `r` logit rows and sequences up to `kv` positions.
    fn ensure_gemm_scratch(&mut self, m: usize, r: usize, kv: usize) -> Result<()> {
        let c = &self.cfg;
        let rows = m.max(r);
        let kv = kv.next_multiple_of(1024);
        if let Some(g) = &self.gemm_scratch
            && g.cap_m >= rows
            && g.cap_kv >= kv
        {
            return Ok(());
        }
        let (old_m, old_kv) = self.gemm_scratch.as_ref().map_or((0, 0), |g| (g.cap_m, g.cap_kv));
        let (rows, kv) = (rows.max(old_m), kv.max(old_kv));
        self.gemm_scratch = None;
        let mut max_w = self.output.as_ref().unwrap_or(&self.embd).rows * c.hidden_size;
        for l in &self.layers {
            for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down] {
                max_w = max_w.max(w.rows * w.cols);
            }
        }
        let g = &self.gpu;
        let width = c.hidden_size.max(c.q_dim()).max(c.ffn_size);
        let att = c.num_heads * ATT_BLOCK_ROWS.min(rows) * kv;
        self.gemm_scratch = Some(GemmScratch {
            cap_m: rows,
            cap_kv: kv,
            xh: g.alloc(rows * width * 2)?,
            wh: g.alloc(max_w * 2)?,
            qh: g.alloc(rows * c.q_dim() * 2)?,
            kg: g.alloc(kv * c.kv_dim() * 2)?,
            vg: g.alloc(kv * c.kv_dim() * 2)?,
            s: g.alloc(att * 4)?,
            p: g.alloc(att * 2)?,
        });
        Ok(())
    }
}

impl Runner for CudaRunner {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<&[f32]> {
        let r = self.run_picking(batch, false, 0)?;
        let vocab = self.cfg.vocab_size;
        if self.logits.as_ref().is_none_or(|l| l.len() < r * vocab) {
            self.logits = None;
            let cap = self.scratch.as_ref().map_or(r, |s| s.cap_r).max(r);
            self.logits = Some(self.gpu.alloc_pinned(cap * vocab)?);
        }
        let s = self.scratch.as_ref().expect("INVARIANT: run ensured it");
        let logits = self.logits.as_mut().expect("INVARIANT: allocated above");
        if r > 0 {
            self.gpu.dtoh_pinned(logits, s.logits.ptr, r * vocab)?;
        } else {
            self.gpu.sync()?;
        }
        Ok(&self.logits.as_ref().expect("INVARIANT: allocated above").as_slice()[..r * vocab])
    }

    /// The greedy token of each logit row, picked on the device (`argmax_rows` at the end of the graph): one u32
    /// per row comes back instead of the row's logits.
    fn forward_argmax(&mut self, batch: &Batch<'_>) -> Result<Vec<u32>> {
        if let Some(pos) = self.take_ahead(batch) {
            return Ok(vec![self.ring_pick(pos)?]);
        }
        let r = self.run_picking(batch, false, 1)?;
        let mut ids = vec![0u32; r];
        if r > 0 {
            let s = self.scratch.as_ref().expect("INVARIANT: run ensured it");
            self.gpu.dtoh(&mut ids, s.ids.ptr)?;
        } else {
            self.gpu.sync()?;
        }
        Ok(ids)
    }

    /// Decode ahead: one sequence's single token is run (or found under way, started by the call before), the next
    /// position is enqueued behind it, fed on the device with this pick ([`Ahead`]), and only then is this pick
    /// waited for. The GPU goes from one step to the next without waiting for the host.
    fn forward_argmax_ahead(&mut self, batch: &Batch<'_>) -> Result<Vec<u32>> {
        let one = match batch.chunks.as_slice() {
            [c] if c.tokens.len() == 1 && c.logits != LogitsWanted::None => Some(c),
            _ => None,
        };
        let Some(c) = one.filter(|_| self.opts.ahead && self.step_timer.is_none()) else {
            return self.forward_argmax(batch);
        };
        let (seq, pos) = (c.seq, c.start_pos);
        if self.take_ahead(batch).is_none() {
            self.run_picking(batch, false, 1)?;
            self.ahead_done[pos % 2].record(&self.gpu.stream).map_err(event_err)?;
        }
        self.start_ahead(seq, pos + 1)?;
        let pick = self.ring_pick(pos)?;
        if let Some(a) = self.ahead.as_mut() {
            a.token = pick;
        }
        Ok(vec![pick])
    }

    /// The greedy token of each logit row and its softmax probability, both computed on the device (`argmax_rows`
    /// with its second pass over the row): two values per row come back instead of the logits.
    fn forward_top(&mut self, batch: &Batch<'_>) -> Result<Vec<(u32, f32)>> {
        let r = self.run_picking(batch, false, 2)?;
        let mut ids = vec![0u32; r];
        let mut probs = vec![0f32; r];
        if r > 0 {
            let s = self.scratch.as_ref().expect("INVARIANT: run ensured it");
            self.gpu.dtoh(&mut ids, s.ids.ptr)?;
            self.gpu.dtoh(&mut probs, s.probs.ptr)?;
        } else {
            self.gpu.sync()?;
        }
        Ok(ids.into_iter().zip(probs).collect())
    }

    /// Each row's `n` largest logits, selected on the device (`topk_rows` at the end of the graph) when `n` is at
    /// most [`DEVICE_CANDIDATES`]: `n` pairs per row come back instead of the row. A row the device could not select
    /// from (more than 2,048 logits tied at its threshold) and a larger `n` are selected on the host from the copied
    /// logits; the pairs are the same either way ([`crate::top_candidates`]).
    fn forward_candidates(&mut self, batch: &Batch<'_>, n: usize) -> Result<Vec<Vec<(u32, f32)>>> {
        let vocab = self.cfg.vocab_size;
        if n > DEVICE_CANDIDATES || !self.opts.device_candidates {
            return Ok(self.forward(batch)?.chunks_exact(vocab).map(|row| crate::top_candidates(row, n)).collect());
        }
        let r = self.run_picking(batch, false, 3)?;
        let c = DEVICE_CANDIDATES.min(vocab);
        let s = self.scratch.as_ref().expect("INVARIANT: run ensured it");
        if r == 0 {
            self.gpu.sync()?;
            return Ok(Vec::new());
        }
        let mut buf = vec![0u32; r * TOPK_BLOCKS * (1 + 2 * c)];
        self.gpu.dtoh(&mut buf, s.cand.ptr)?;
        let (flags, keys) = buf.split_at(r * TOPK_BLOCKS);
        let mut out = Vec::with_capacity(r);
        for row in 0..r {
            if flags[row * TOPK_BLOCKS..(row + 1) * TOPK_BLOCKS].iter().any(|&f| f != 0) {
                self.host_selected.set(self.host_selected.get() + 1);
                let mut logits = vec![0f32; vocab];
                self.gpu.dtoh(&mut logits, s.logits.ptr + (row * vocab * 4) as u64)?;
                out.push(crate::top_candidates(&logits, n));
            } else {
                out.push(merge_segment_keys(&keys[row * TOPK_BLOCKS * 2 * c..(row + 1) * TOPK_BLOCKS * 2 * c], c, n));
            }
        }
        Ok(out)
    }

    /// The pick's probability is computed on the device ([`Runner::forward_top`]).
    fn top_prob_is_cheap(&self) -> bool {
        true
    }

    fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.len)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) {
        self.ahead = None;
        if let Some(s) = self.seqs.get_mut(&seq)
            && len < s.len
        {
            s.len = len;
            let keep = len.div_ceil(PAGE_SIZE);
            while s.pages.len() > keep {
                self.free_pages.push(s.pages.pop().expect("INVARIANT: longer than keep"));
            }
        }
    }

    fn release(&mut self, seq: SeqId) {
        self.ahead = None;
        if let Some(s) = self.seqs.remove(&seq) {
            self.free_pages.extend(s.pages);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Arch;

    /// Room for decode attention splits: the base count up to base x `att_long` positions, then one split per
    /// `att_long` positions rounded up to a power of two, at most 128; never more with `att_long` 0.
    #[test]
    fn decode_splits_grow_with_the_longest_context() {
        let o = |att_long| CudaOptions { att_splits: 16, att_long, ..CudaOptions::default() };
        let at = |att_long, ctx| decode_splits(&o(att_long), ctx);
        assert_eq!([at(512, 0), at(512, 4096), at(512, 8192)], [16, 16, 16]);
        assert_eq!([at(512, 8193), at(512, 12_288), at(512, 16_384)], [32, 32, 32]);
        assert_eq!([at(512, 16_385), at(512, 32_768), at(512, 1 << 20)], [64, 64, 128]);
        assert_eq!(at(0, 1 << 20), 16);
        assert_eq!(decode_splits(&CudaOptions { att_splits: 64, att_long: 512, ..o(512) }, 16_384), 64);
    }

    /// What decode ahead relies on: a one-row pass's metadata is its token in word 0 and its position in word 1
    /// (`argmax_rows` writes the pick and the next position there), and the next position's metadata differs from
    /// it in those two words alone while the page table is the same (so a pass started ahead needs no copy), and
    /// only in the table and those words when it needs a new page (the copy then leaves word 0, the fed token).
    #[test]
    fn a_one_row_pass_differs_from_the_next_in_its_token_and_position() {
        let (max_pages, pages) = (4, vec![3u32, 9]);
        let packed = |pos: usize, token: u32, pages: &[u32]| {
            let toks = [token];
            let chunk = crate::SeqChunk { seq: SeqId(7), tokens: &toks, start_pos: pos, logits: LogitsWanted::Last };
            let batch = Batch { chunks: vec![chunk] };
            let (meta, words) = Meta::packed(4096, 1, 1, 1, max_pages);
            assert_eq!((meta.tokens, meta.pos), (4096, 4100));
            let mut w = vec![u32::MAX; words];
            pack_meta(&batch, |_| pages, max_pages, &mut w);
            w
        };
        let (a, b) = (packed(100, 11, &pages), packed(101, 12, &pages));
        assert_eq!((a[0], a[1], b[0], b[1]), (11, 100, 12, 101));
        assert_eq!(a[2..], b[2..]);
        let grown = [3u32, 9, 5];
        let c = packed(128, 13, &grown);
        assert_eq!(c[1], 128);
        assert_ne!(c[2..], a[2..]);
    }

    /// A pass's metadata lands where the kernels look for it: for each row its token, position and slot, the logit
    /// rows each chunk asks for, and each sequence's pages then zeros (written out here without `pack_meta`).
    #[test]
    fn pass_metadata_is_packed_where_the_kernels_read_it() {
        let toks: [&[u32]; 4] = [&[11, 12, 13], &[21, 22], &[31], &[]];
        let wants = [LogitsWanted::Last, LogitsWanted::All, LogitsWanted::None, LogitsWanted::Last];
        let chunks = (0..4)
            .map(|i| crate::SeqChunk { seq: SeqId(i as u64), tokens: toks[i], start_pos: 100 * i, logits: wants[i] })
            .collect();
        let batch = Batch { chunks };
        let (m, r, max_pages) = (batch.num_tokens(), batch.num_logit_rows(), 3);
        assert_eq!((m, r), (6, 3));
        let pages: [Vec<u32>; 4] = [vec![7], vec![8, 9], vec![], vec![4, 5, 6]];
        let (meta, words) = Meta::packed(1000, m, r, 4, max_pages);
        let mut w = vec![u32::MAX; words];
        pack_meta(&batch, |ci| &pages[ci], max_pages, &mut w);
        let at = |addr: u64, i: usize| w[(addr - 1000) as usize / 4 + i];
        let (tokens, pos, slot): (Vec<u32>, Vec<u32>, Vec<u32>) = (
            (0..m).map(|i| at(meta.tokens, i)).collect(),
            (0..m).map(|i| at(meta.pos, i)).collect(),
            (0..m).map(|i| at(meta.slot, i)).collect(),
        );
        assert_eq!(tokens, [11, 12, 13, 21, 22, 31]);
        assert_eq!(pos, [0, 1, 2, 100, 101, 200]);
        assert_eq!(slot, [0, 0, 0, 1, 1, 2]);
        assert_eq!((0..r).map(|i| at(meta.out_rows, i)).collect::<Vec<_>>(), [2, 3, 4]);
        let table: Vec<u32> = (0..4 * max_pages).map(|i| at(meta.table, i)).collect();
        assert_eq!(table, [7, 0, 0, 8, 9, 0, 0, 0, 0, 4, 5, 6]);
        assert_eq!(words, 3 * m + r + 4 * max_pages);
    }

    /// The padded device layouts keep every field of every block, in order.
    /// `fkey` of the kernels.
    fn total_key(v: f32) -> u32 {
        let b = v.to_bits();
        if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 }
    }

    /// The host's half of `topk_rows`: each segment's largest keys (made here as the kernel makes them) merge into
    /// the row's largest logits, the same pairs and bits as `top_candidates`; keys give back their logits' bits.
    #[test]
    fn segment_lists_merge_into_the_rows_largest_logits() {
        for v in [0.0f32, -0.0, 1.5, -1.5, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, f32::MIN_POSITIVE] {
            assert_eq!(from_total_key(total_key(v)).to_bits(), v.to_bits());
        }
        let mut x = 0x1234_5678u64;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as u32
        };
        for (len, blocks, c) in [(151_936usize, 8usize, 256usize), (1000, 8, 64), (300, 8, 64), (20, 8, 16)] {
            let row: Vec<f32> = (0..len)
                .map(|_| if next() % 3 == 0 { (next() % 5) as f32 } else { next() as f32 / 1e9 - 2.0 })
                .collect();
            let seg = len.div_ceil(blocks);
            let mut words = Vec::new();
            for b in 0..blocks {
                let (s0, s1) = ((b * seg).min(len), ((b + 1) * seg).min(len));
                let top = crate::top_candidates(&row[s0..s1], c);
                for j in 0..c {
                    let key = top.get(j).map_or(0u64, |&(i, v)| (total_key(v) as u64) << 32 | !(s0 as u32 + i) as u64);
                    words.extend([key as u32, (key >> 32) as u32]);
                }
            }
            for n in [1, 20, c.min(len)] {
                let got = merge_segment_keys(&words, c, n);
                let want = crate::top_candidates(&row, n);
                let bits = |v: &[(u32, f32)]| v.iter().map(|&(i, l)| (i, l.to_bits())).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "len {len} n {n}");
            }
        }
    }

    #[test]
    fn device_layout_pads_blocks() {
        let q8: Vec<u8> = (0..68).map(|i| i as u8).collect();
        let out = device_layout(GgmlType::Q8_0, 64, &q8, true);
        assert_eq!(out.len(), 72);
        assert_eq!(&out[..4], &[0, 1, 0, 0]);
        assert_eq!(&out[4..36], &q8[2..34]);
        assert_eq!(&out[36..40], &[34, 35, 0, 0]);
        let q5: Vec<u8> = (0..22).map(|i| i as u8).collect();
        let out = device_layout(GgmlType::Q5_0, 32, &q5, true);
        assert_eq!((&out[..4], &out[4..]), (&[0u8, 1, 0, 0][..], &q5[2..]));
        let q6: Vec<u8> = (0..210).map(|i| i as u8).collect();
        let out = device_layout(GgmlType::Q6_K, 256, &q6, false);
        assert_eq!((out.len(), &out[..210], &out[210..]), (224, &q6[..], &[0u8; 14][..]));
        assert!(matches!(device_layout(GgmlType::Q4_K, 256, &q6[..144], false), std::borrow::Cow::Borrowed(_)));
    }

    /// The repacked Q4_K / Q6_K rows hold every byte of the row once, at the place the kernels read it from (the
    /// field offsets of ggml's block_q4_K / block_q6_K, written out here independently of `repack_row`).
    #[test]
    fn repacked_rows_are_permutations_with_fields_in_place() {
        let nsb = 3;
        for (ty, from, to) in [(GgmlType::Q4_K, 144usize, 144usize), (GgmlType::Q6_K, 210, 224)] {
            // Two rows; every byte distinct as a u16 tag (row, superblock, offset) kept in a side table.
            let rows = 2;
            let src: Vec<u8> = (0..rows * nsb * from).map(|i| (i * 7 % 251) as u8).collect();
            let out = device_layout(ty, nsb * 256, &src, true);
            assert_eq!(out.len(), rows * nsb * to);
            for r in 0..rows {
                let (s, o) = (&src[r * nsb * from..(r + 1) * nsb * from], &out[r * nsb * to..(r + 1) * nsb * to]);
                for sb in 0..nsb {
                    let b = &s[sb * from..(sb + 1) * from];
                    if ty == GgmlType::Q4_K {
                        // d, dmin, scales[12] at 0..16, qs[128] at 16..144; pair j of the superblock: qs[32j..32j+32).
                        assert_eq!(&o[nsb * 128 + 16 * sb..nsb * 128 + 16 * sb + 16], &b[0..16]);
                        for j in 0..4 {
                            let p = 4 * sb + j;
                            assert_eq!(&o[16 * p..16 * p + 16], &b[16 + 32 * j..16 + 32 * j + 16]);
                            assert_eq!(&o[nsb * 64 + 16 * p..nsb * 64 + 16 * p + 16], &b[32 + 32 * j..48 + 32 * j]);
                        }
                    } else {
                        // ql[128] at 0, qh[64] at 128, scales[16] at 192, d at 208.
                        for hf in 0..2 {
                            for pp in 0..2 {
                                let p = 4 * sb + 2 * hf + pp;
                                let ql = 64 * hf + 32 * pp;
                                assert_eq!(&o[16 * p..16 * p + 16], &b[ql..ql + 16]);
                                assert_eq!(&o[nsb * 64 + 16 * p..nsb * 64 + 16 * p + 16], &b[ql + 16..ql + 32]);
                            }
                            let q = 2 * sb + hf;
                            assert_eq!(
                                &o[nsb * 128 + 16 * q..nsb * 128 + 16 * q + 16],
                                &b[128 + 32 * hf..144 + 32 * hf]
                            );
                            assert_eq!(
                                &o[nsb * 160 + 16 * q..nsb * 160 + 16 * q + 16],
                                &b[144 + 32 * hf..160 + 32 * hf]
                            );
                        }
                        assert_eq!(&o[nsb * 192 + 16 * sb..nsb * 192 + 16 * sb + 16], &b[192..208]);
                        assert_eq!(&o[nsb * 208 + 2 * sb..nsb * 208 + 2 * sb + 2], &b[208..210]);
                    }
                }
                if ty == GgmlType::Q6_K {
                    assert!(o[nsb * 210..].iter().all(|&v| v == 0), "padding is zero");
                }
                let (mut a, mut c) = (s.to_vec(), o[..nsb * from].to_vec());
                a.sort_unstable();
                c.sort_unstable();
                assert_eq!(a, c, "{ty:?}: the same bytes");
            }
        }
    }

    /// The generated source compiles for Hopper with every supported type (runs where NVRTC can be loaded).
    #[test]
    fn kernels_compile_with_nvrtc() {
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("skipped: libnvrtc not found");
            return;
        }
        let cfg = ModelConfig {
            arch: Arch::Qwen2,
            shapes: crate::ModelShapes {
                num_layers: 2,
                hidden_size: 1536,
                ffn_size: 8960,
                num_heads: 12,
                num_kv_heads: 2,
                head_dim: 128,
                vocab_size: 1000,
                max_context: 4096,
            },
            rms_eps: 1e-6,
            rope_theta: 1e6,
            rope_dim: 128,
            rope_style: RopeStyle::Neox,
            qkv_bias: true,
            qk_norm: false,
            tied_embeddings: false,
        };
        use GgmlType::*;
        let mats: Vec<(GgmlType, usize)> =
            [F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K].iter().map(|&t| (t, 1536)).collect();
        let q8 = Q8Kernels {
            mats: vec![
                (Q4_K, 1536, 16),
                (Q6_K, 1536, 8),
                (Q4_K, 8960, 32),
                (Q6_K, 8960, 64),
                (Q6_K, 8960, 128),
                (Q8_0, 1536, 8),
                (Q5_0, 1536, 32),
            ],
            gu: vec![(Q4_K, 1536, 8), (Q6_K, 5120, 32), (Q5_0, 1536, 8)],
            qkv: vec![(Q4_K, Q4_K, Q6_K, 16), (Q5_0, Q5_0, Q8_0, 32)],
            gu_fuse: true,
            repack: true,
            att_dyn: true,
            xperm: true,
            fuse_norm: true,
            qkv_rope: true,
            gu_smem: true,
            att_warps: 16,
            gu_dot2: true,
            x6: true,
            wcg: true,
            att_cl: 16,
            att_splits: 16,
            att_long: 512,
        };
        let src = kernel_source(&cfg, &mats, &[(Q4_K, 1536), (Q5_0, 1536)], &[(Q4_K, Q4_K, Q6_K)], (Q6_K, 1536), &q8);
        if let Ok(p) = std::env::var("SPLASH_DUMP_KERNEL_SOURCE") {
            std::fs::write(p, &src).expect("writing the kernel source");
        }
        let t0 = std::time::Instant::now();
        let bin = backend::cuda::nvrtc_cubin(&src, "sm_90a").unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "compiled {} bytes of source to {} bytes in {:.1} s",
            src.len(),
            bin.len(),
            t0.elapsed().as_secs_f64()
        );
        assert!(bin.len() > 1000);
    }
}
