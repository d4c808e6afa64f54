//! The model on the GPU: [`CudaRunner`], the GPU twin of [`crate::cpu::CpuRunner`], drives the shared forward pass
//! (`transformer.rs`) over `fused::FusedBackend`, a backend of the model's own kernels that fuses each sub-layer.
//!
//! At load the kernel library is specialised with the model's constants (hidden size, heads, head_dim, FFN, the
//! (type, row length) of every matrix), compiled with NVRTC for the device and cached on disk; weights are uploaded in
//! their GGUF quantized form. A batch's rows go through each matrix together (every weight read once for up to 8
//! rows per pass, more rows in parallel passes), attention reads a paged f16 KV cache, and each batch shape with at
//! most [`MAX_GRAPH_ROWS`] rows is captured once as a CUDA graph and replayed: per-step data (tokens, positions,
//! page tables) lives in fixed device buffers that the host rewrites before each launch. Chunks of at least
//! [`GEMM_MIN_ROWS`] tokens (prefill) instead run on tensor cores: each weight matrix dequantized to f16 into scratch
//! and multiplied with cuBLAS, attention as one fused causal flash-attention kernel over the paged cache.
//! Expert-routed FFN layers (`moe`) route on the device and run grouped products, one block row per used expert,
//! inside the same graphs; long chunks multiply each used expert's rows with cuBLAS.
//!
//! Decode-sized chunks of layers whose matrices all have such kernels (`CudaOptions::q8`) multiply on 8-bit
//! activations: each activation row is quantized per 32 values (fused with the RMSNorm, or written by the attention
//! and gate/up kernels themselves) and the weights are consumed with dp4a, several threads per weight row, never
//! converted to f32 (Q4_K, Q6_K, Q8_0, Q5_0). Q4_K and Q6_K rows are regrouped field by field on upload (neighbouring
//! threads load neighbouring 16 bytes), Q8_0 and Q5_0 blocks padded (aligned fields), see `device_layout`. Other types
//! keep the f32-activation kernels. Greedy callers ([`Runner::forward_argmax`]) get each row's argmax picked on the
//! device at the end of the graph and copy back one id per row instead of the logits; a lone greedy sequence
//! ([`Runner::forward_argmax_then`] with `NextStep::FedPicks`) has its next step enqueued before that id comes back, fed with it on the device.
//!
//! The files: [`options`] (the switches, one field and one default each), `kernels` (the kernel list: the generated
//! source and the table of loaded functions, both from one list), `load` (compiling, uploading), `fused` (the
//! backend: buffers, weights, KV pages, a pass's plan and its CUDA graph), `runner` (the [`Runner`] implementation:
//! batches, the KV pages' table), `layer` (a sub-layer's launches on the matrix-vector kernels, the output head),
//! `prefill` (long chunks on tensor cores), `moe` (the expert-routed FFN on both paths), `pick` (device picks and decode ahead), `meta` (a pass's metadata),
//! `tactics` (shape decisions: threads per row, attention splits) and `layout` (weights' device layout).

mod fused;
mod kernels;
mod kv;
mod layer;
mod layout;
mod load;
mod meta;
mod moe;
pub mod options;
mod pick;
mod prefill;
mod runner;
mod tactics;

use backend::cuda::CudaError;

use crate::Error;
#[allow(unused_imports)]
use crate::Runner;

pub use kernels::{Kernel, KernelSet, Q8Kernels, kernel_source};
pub use options::CudaOptions;
pub use runner::{CudaLoadStats, CudaRunner};

/// Tokens per KV page.
pub const PAGE_SIZE: usize = 64;
/// How many of each row's largest logits `topk_rows` selects on the device ([`Runner::forward_candidates`]): top-k
/// sampling with k + the penalised tokens (20 + 64 with the packs' defaults) at most this.
pub(crate) const DEVICE_CANDIDATES: usize = 256;

/// Blocks that reduce one logit row together in `argmax_rows` (256 threads each) and `topk_rows` (1,024 each, one
/// segment of the row each).
pub(crate) const ARGMAX_BLOCKS: usize = 32;
pub(crate) const TOPK_BLOCKS: usize = 8;

/// Batches of at most this many rows are captured as CUDA graphs.
pub const MAX_GRAPH_ROWS: usize = 64;
/// Default warps of an attention block (`CudaOptions::att_warps`).
pub(crate) const ATT_WARPS: usize = 4;
/// Default splits of a clustered attention launch (`CudaOptions::att_cl`) and the most rows it runs for: on the
/// H200 it paid at batch 1 (1.5B +3%, 0.5B +4% at context 512) and cost 2-6% from 2 rows on (benchmarks/log,
/// stretch 11).
pub(crate) const ATT_CL: usize = 8;
pub(crate) const ATT_CL_ROWS: usize = 1;
/// Threads of a `rope_kv` block; the rotation pairs of a row are spread over as many blocks as they fill.
pub(crate) const ROPE_THREADS: u32 = 256;
/// Chunks of at least this many tokens run on tensor cores (weights dequantized to f16, cuBLAS GEMMs, GEMM
/// attention); shorter ones (decode, speculative verification) on the matrix-vector kernels. Chosen per chunk, so a
/// sequence's results never depend on what else is in its batch. Above [`MAX_GRAPH_ROWS`]: graphs hold no cuBLAS call.
pub const GEMM_MIN_ROWS: usize = 128;
/// Default warps of a `flash_attention` block (`CudaOptions::flash_warps`): 8 on the H200 (1.5B Q4_K_M pp16384
/// 79,447 vs 75,709-75,939 tok/s with 4, pp4096 113,961 vs 111,738-112,052; the 74-row tail after 16K positions
/// 0.101 vs 0.090 ms per layer in scripts/cuda/flash_attn_test.py; benchmarks/2026-12-02-cuda-flash.txt).
pub(crate) const FLASH_WARPS: usize = 8;

impl From<CudaError> for Error {
    fn from(e: CudaError) -> Self {
        Error::Backend(e.to_string())
    }
}

/// Largest hidden size whose 8 rows of 8-bit activations (with their scales) the fused-norm kernels keep in static
/// shared memory (48 KiB per block in all).
pub const FUSE_NORM_MAX_HIDDEN: usize = 4096;
