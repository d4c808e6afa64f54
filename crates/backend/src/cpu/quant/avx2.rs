//! AVX2 + FMA + F16C kernels (x86-64 without AVX-512).

#![allow(unsafe_op_in_unsafe_fn)]
#![allow(clippy::too_many_arguments)]

use super::ActFormat;
use gguf::GgmlType;
use std::ops::Range;

pub fn supported() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// # Safety
/// Requires the CPU features of [`supported`].
pub unsafe fn quantize_act_row(fmt: ActFormat, x: &[f32], out: &mut [u8]) {
    super::scalar::quantize_act_row(fmt, x, out)
}

/// # Safety
/// As `super::matmul_rows`, plus the CPU features of [`supported`].
pub unsafe fn matmul_rows(
    wty: GgmlType,
    w: &[u8],
    k: usize,
    rows: Range<usize>,
    acts: &[u8],
    act_rb: usize,
    m: usize,
    out: *mut f32,
    ldo: usize,
) {
    super::scalar::matmul_rows(wty, w, k, rows, acts, act_rb, m, out, ldo)
}
