//! The CUDA runner's switches: one field each, with one default (each may be set from its `SPLASH_CUDA_*` variable
//! for measuring, in `Default`). The experiments measured not faster were deleted; their numbers stay in
//! benchmarks/log (RoPE in the f32 QKV kernel, the FFN norm in the f32 gate/up kernel, PDL on every kernel in graphs,
//! gate/up weights in shared memory, the xpos6 layout, L2-only weight loads, a second thread count for small
//! matrices).

use std::path::PathBuf;

use super::{ATT_CL, ATT_CL_ROWS, ATT_WARPS, FLASH_WARPS};

#[derive(Debug, Clone)]
pub struct CudaOptions {
    pub device: usize,
    /// KV cache capacity in tokens over all sequences (0: up to half the free memory, at most 256k tokens).
    pub kv_tokens: usize,
    /// Capture and replay CUDA graphs for small batches.
    pub graphs: bool,
    /// Where compiled kernels are cached (None: no cache).
    pub cache_dir: Option<PathBuf>,
    /// Round activations to 8 bits before quantized matrix products exactly as the CPU backend and ggml do
    /// (Q8_0 / Q8_1 / Q8_K), so both backends compute the same function. Off: f32 activations.
    pub exact_activations: bool,
    /// Run chunks of at least [`GEMM_MIN_ROWS`] tokens on tensor cores through cuBLAS (when libcublas loads).
    pub gemm: bool,
    /// Launch kernels outside CUDA graphs (prefill) with programmatic dependent launch (Hopper and later): each
    /// kernel's start and weight prefetch overlap the previous kernel's end. Measured on the H200: prefill 512
    /// +10%, 4096 +2.5%; inside decode graphs on every kernel it was slower (1.5B 441 vs 450 tok/s, 0.5B 640 vs
    /// 718; benchmarks/log, stretches 3 and 12), so graphs use it only where `graph_pdl_att` says.
    pub pdl: bool,
    /// Profiling only (wrong results): stages left out of every layer, to time the others by difference.
    pub skip: Vec<String>,
    /// Matrix-vector products of Q4_K / Q6_K layers on 8-bit activations with dp4a (like ggml's mmvq) instead of
    /// dequantizing every weight to f32. Chosen per model, so a sequence's results do not depend on its batch.
    pub q8: bool,
    /// Target pairs of 32-blocks per thread in those kernels (sets how many threads split one weight row;
    /// `SPLASH_CUDA_Q8_IT`, default 3: 1, 2, 4, 5 and 6 were no faster, and a separate count for the small matrices
    /// made no measurable difference: benchmarks/log, stretches 10 and 11).
    pub q8_iters: usize,
    /// Programmatic dependent launch inside CUDA graphs for the attention kernel and the output projection after it
    /// (`SPLASH_CUDA_GRAPH_PDL_ATT=0` turns it off):
    /// the attention's metadata and page-table reads and K/V prefetch, then the projection's weight loads, overlap
    /// the kernel before each. Measured on the H200 (benchmarks/log, stretch 12, call F): 1.5B decode 1,194 vs 1,145 tok/s, 0.5B
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
    /// Warps of an attention block (1..=32; each takes 32 positions per pass, and a split covers at least one pass
    /// of all of them): `SPLASH_CUDA_ATT_WARPS`. One split needs no second pass over partials. Default 4: 1, 2, 8
    /// and 16 were all slower on the 1.5B at contexts 16, 512 and 2048 (benchmarks/log, stretch 7).
    pub att_warps: usize,
    /// The gate/up kernels take pair i of the gate and the up row in turn and load the activations they share once
    /// (`SPLASH_CUDA_GU_DOT2`, default on; the same sums in the same order). 32B 138.3 vs 133.0-135.3 tok/s, 1.5B
    /// 1,013-1,022 vs 999-1,008 (benchmarks/log, stretch 8).
    pub gu_dot2: bool,
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
    /// Measured on the H200 (1.5B, benchmarks/log, stretch 12): at 16K positions 32 splits of 512 decode 5% faster than 16 of 1,024;
    /// at 4K, 16 of 256 are 6% faster than 32 of 128.
    pub att_long: usize,
    /// Decode ahead ([`Runner::forward_argmax_then`] with `NextStep::FedPicks`): the next step of a single greedy sequence is enqueued before
    /// the caller asks for it, its token written by the pick of the pass before, so the GPU does not wait for the
    /// host between steps (`SPLASH_CUDA_AHEAD=0` turns it off).
    pub ahead: bool,
    /// Warps of a `flash_attention` block (the prefill attention; 16 flattened query rows each): 4 or 8
    /// (`SPLASH_CUDA_FLASH_WARPS`, default `FLASH_WARPS`). More warps: each K/V tile loaded once for more rows,
    /// fewer blocks per SM (~240 registers a thread: one block of 8 warps or two of 4).
    pub flash_warps: usize,
}

impl Default for CudaOptions {
    fn default() -> Self {
        let graphs = flag("SPLASH_CUDA_GRAPHS", true);
        let exact_activations = flag("SPLASH_CUDA_EXACT", false);
        let gemm = flag("SPLASH_CUDA_GEMM", true);
        let pdl = flag("SPLASH_CUDA_PDL", true);
        let skip = std::env::var("SPLASH_CUDA_PROFILE_SKIP")
            .map(|v| v.split(',').map(str::to_string).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default();
        let q8 = flag("SPLASH_CUDA_Q8", true);
        let q8_iters =
            std::env::var("SPLASH_CUDA_Q8_IT").ok().and_then(|v| v.parse().ok()).unwrap_or(3usize).clamp(1, 8);
        CudaOptions {
            device: 0,
            kv_tokens: 0,
            graphs,
            cache_dir: None,
            exact_activations,
            gemm,
            pdl,
            skip,
            q8,
            q8_iters,
            graph_pdl_att: flag("SPLASH_CUDA_GRAPH_PDL_ATT", true),
            device_candidates: flag("SPLASH_CUDA_CANDIDATES", true),
            gu_fuse: flag("SPLASH_CUDA_GU_FUSE", true),
            att_q8: flag("SPLASH_CUDA_ATT_Q8", true),
            repack: flag("SPLASH_CUDA_REPACK", true),
            att_dyn: flag("SPLASH_CUDA_ATT_DYN", true),
            xperm: flag("SPLASH_CUDA_XPERM", true),
            fuse_norm: flag("SPLASH_CUDA_FUSE_NORM", true),
            qkv_rope: flag("SPLASH_CUDA_QKV_ROPE", true),
            att_warps: env_usize("SPLASH_CUDA_ATT_WARPS", ATT_WARPS).clamp(1, 32),
            gu_dot2: flag("SPLASH_CUDA_GU_DOT2", true),
            att_cl: match env_usize("SPLASH_CUDA_ATT_CL", ATT_CL) {
                c @ (2 | 4 | 8 | 16) => c,
                _ => 0,
            },
            att_cl_rows: env_usize("SPLASH_CUDA_ATT_CL_ROWS", ATT_CL_ROWS),
            att_splits: env_usize("SPLASH_CUDA_ATT_SPLITS", 16).clamp(1, 128),
            att_long: env_usize("SPLASH_CUDA_ATT_LONG", 512),
            ahead: flag("SPLASH_CUDA_AHEAD", true),
            flash_warps: if env_usize("SPLASH_CUDA_FLASH_WARPS", FLASH_WARPS) == 4 { 4 } else { 8 },
        }
    }
}

/// The environment variable `name` as a switch: "0" off, "1" on, else `default`.
fn flag(name: &str, default: bool) -> bool {
    std::env::var(name).map_or(default, |v| if default { v != "0" } else { v == "1" })
}

/// The environment variable `name` as a number, or `default` when unset or not a number.
pub(super) fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::super::tactics::decode_splits;
    use super::*;

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
}
