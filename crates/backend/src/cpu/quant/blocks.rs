//! Byte layouts of the ggml blocks the kernels read, and of the quantized activation rows they produce.
//!
//! Weight blocks are exactly ggml's (`block_q4_0` ... `block_q6_K`). An activation row is a run of ggml blocks
//! (`block_q8_0`, `block_q8_1` or `block_q8_K`, bit-identical to ggml's `quantize_row_q8_*_ref`) followed by a
//! small trailer of derived sums that the SIMD kernels would otherwise recompute for every weight row:
//!
//! * Q8_0 rows: per 32-block, `i32 -Σq` (folds the zero point of Q4_0 (8), Q5_0 (16) and offset Q8_0 (128)
//!   into the integer accumulator) and the block scale `d` as `f32`.
//! * Q8_1 rows: per 32-block, `d` and `s` (ggml's f16 `d·Σq`) widened to `f32`.
//! * Q8_K rows: per 256-block, 8 × `i16` sums of each 32-quant sub-block (Q4_K / Q5_K mins), then 16 × `i32`
//!   `-32 · Σq` over each 16-quant sub-block (Q6_K's zero point).

/// Elements per legacy block (Q4_0 ... Q8_1).
pub const QK: usize = 32;
/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;
pub const Q8_0_BYTES: usize = 34;
pub const Q8_1_BYTES: usize = 36;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;
pub const Q8_K_BYTES: usize = 292;

/// Offsets inside `block_q8_K`: `f32 d`, `i8 qs[256]`, `i16 bsums[16]`.
pub const Q8K_QS: usize = 4;
pub const Q8K_BSUMS: usize = 260;

/// Trailer bytes per Q8_0 block: `i32 -Σq`, `f32 d`.
pub const Q8_0_EXTRA: usize = 8;
/// Trailer bytes per Q8_1 block: `f32 d`, `f32 s`.
pub const Q8_1_EXTRA: usize = 8;
/// Trailer bytes per Q8_K block: `i16 Σq` per 32 (8 of them), then `i32 -32·Σq` per 16 (16 of them).
pub const Q8_K_EXTRA: usize = 16 + 64;

#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

#[inline(always)]
pub fn f32_to_f16(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

#[inline(always)]
pub fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline(always)]
pub fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(rd_u16(b, off))
}

#[inline(always)]
pub fn rd_f32(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline(always)]
pub fn rd_i16(b: &[u8], off: usize) -> i16 {
    i16::from_le_bytes([b[off], b[off + 1]])
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K / Q5_K block (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// All 8 scales and 8 mins of a Q4_K / Q5_K block, as ggml's SIMD paths unpack them.
#[inline(always)]
pub fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        (sc[j], mn[j]) = scale_min_k4(j, q);
    }
    (sc, mn)
}
