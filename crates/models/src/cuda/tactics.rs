//! Shape decisions the runner makes per model or per pass: which types the kernels cover, threads per weight row
//! of the 8-bit kernels, activation rows per pass, attention splits. Each depends on shapes alone (never on the other
//! sequences of a batch beyond what is stated), so a sequence's results do not depend on its batch.

use gguf::GgmlType;

use super::{CudaOptions, GEMM_MIN_ROWS};

/// Whether the CUDA kernels cover matrices of this type.
pub(super) fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q6_K)
}

/// Whether a `ty` matrix with rows of `cols` has an 8-bit-activation (dp4a) matrix-vector kernel (weights are taken
/// 64 at a time).
pub(super) fn q8_ok(ty: GgmlType, cols: usize) -> bool {
    use GgmlType::*;
    match ty {
        Q4_K | Q6_K => cols.is_multiple_of(256),
        Q8_0 | Q5_0 => cols.is_multiple_of(64),
        _ => false,
    }
}

/// Threads that split one weight row of length `k` (`n` rows) in the 8-bit-activation kernels: enough that each
/// takes at most `iters` pairs of 32-blocks, more for small matrices (at least ~32k threads in all), at most `cap`.
pub(super) fn q8_threads(k: usize, n: usize, iters: usize, cap: usize) -> usize {
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

/// Attention splits over the positions for a batch of `m` rows: many for decode (`decode`, up to 16 rows), where
/// rows x heads alone would leave most of the GPU idle. A row's splits depend on its context only (each split takes
/// at least `ATT_MIN_SPLIT` positions), never on the other rows of its batch up to 16.
pub(super) fn att_splits(m: usize, decode: usize) -> usize {
    match m {
        0..=16 => decode,
        17..=64 => 4,
        _ => 1,
    }
}

/// Room for the decode attention splits of contexts up to `longest` positions: `att_splits`, or past `att_splits` x
/// `att_long` positions one split per `att_long` positions, rounded up to a power of two (at most 128), so that few
/// graphs cover every context. The kernel takes as many of them as each row's own context needs.
pub(super) fn decode_splits(opts: &CudaOptions, longest: usize) -> usize {
    let base = opts.att_splits.max(1);
    if opts.att_long == 0 || longest <= base * opts.att_long {
        return base;
    }
    longest.div_ceil(opts.att_long).next_power_of_two().clamp(base, 128)
}

/// How the CPU backend rounds activations for a weight type: None (f32), Some(0) Q8_0/Q8_1, Some(1) Q8_K.
pub(super) fn act_fmt(ty: GgmlType) -> Option<u32> {
    use GgmlType::*;
    match ty {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 => Some(0),
        Q4_K | Q5_K | Q6_K => Some(1),
        _ => None,
    }
}

/// Activation rows per pass of the matrix-vector kernels (one of `kernels::MRS`) for `m` rows.
pub(super) fn pick_mr(m: usize) -> usize {
    match m {
        0 | 1 => 1,
        2 => 2,
        3 | 4 => 4,
        _ => 8,
    }
}

/// Past this many positions, chunks of more than [`LONG_CHUNK_MIN_ROWS`] rows run on tensor cores too.
pub(super) const LONG_CONTEXT: usize = 4096;
/// Rows a chunk needs beyond [`LONG_CONTEXT`] positions to run on tensor cores (decode and speculative
/// verification rows stay on the matrix-vector kernels).
pub(super) const LONG_CHUNK_MIN_ROWS: usize = 16;

/// Whether a chunk of `n` tokens from position `start_pos` runs on tensor cores: from [`GEMM_MIN_ROWS`] rows, or
/// past [`LONG_CONTEXT`] positions from [`LONG_CHUNK_MIN_ROWS`] + 1 (the tail of a prompt after a long cached prefix:
/// on the matrix-vector kernels its attention takes one split per row over every position, 13.6% of the cold
/// request's time for 74 rows after 16K cached on the H200, benchmarks/2026-12-01-cuda-core-cuda.txt). Chosen per
/// chunk alone, so a sequence's results never depend on what else is in its batch.
pub(super) fn on_tensor_cores(n: usize, start_pos: usize) -> bool {
    n >= GEMM_MIN_ROWS || (n > LONG_CHUNK_MIN_ROWS && start_pos + n >= LONG_CONTEXT)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short chunks stay on the matrix-vector kernels until the context is long; decode and verification rows
    /// always do.
    #[test]
    fn long_context_tails_run_on_tensor_cores() {
        assert!(on_tensor_cores(GEMM_MIN_ROWS, 0));
        assert!(!on_tensor_cores(GEMM_MIN_ROWS - 1, 0));
        assert!(!on_tensor_cores(74, LONG_CONTEXT - 75));
        assert!(on_tensor_cores(74, LONG_CONTEXT - 74));
        assert!(on_tensor_cores(LONG_CHUNK_MIN_ROWS + 1, 16_192));
        assert!(!on_tensor_cores(LONG_CHUNK_MIN_ROWS, 16_192));
        assert!(!on_tensor_cores(1, 1 << 20));
    }
}
