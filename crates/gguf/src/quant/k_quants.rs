//! The K formats of the real models (Q4_K, Q5_K, Q6_K) and the activation format Q8_K: 256-element super-blocks
//! with one `f16` scale (and min) refined by small per-sub-block integer scales.
//!
//! Element order, for element `e` of a super-block:
//!
//! * **Q4_K**: sub-block `s = e / 32` has 6-bit `sc`, `m` from [`k_scale_min`]; `e = 64c + r`: `q` is the low
//!   nibble of `qs[32c + r]` for `r < 32`, the high nibble of `qs[32c + r − 32]` otherwise. Value
//!   `d·sc·q − dmin·m`.
//! * **Q5_K**: as Q4_K, plus 16 when bit `e / 32` of `qh[e % 32]` is set.
//! * **Q6_K**: `e = 128n + 32g + l` (`g` in 0..4, `l` in 0..32): the low 4 bits are nibble `g / 2` of
//!   `ql[64n + 32(g % 2) + l]`, the high 2 bits are bits `2g..2g+2` of `qh[32n + l]`; value
//!   `d·scales[e / 16]·(q − 32)`.
//! * **Q8_K**: `d·qs[e]` (`d` is an `f32`); `bsums[i]` is the sum of `qs[16i..16i+16]`.
//!
//! Quantization follows ggml's `quantize_row_q{4,5,6,8}_K_ref` (no importance matrix): per sub-block fits by
//! [`super::fit`], sub-block scales rounded to 6 (Q4/Q5) or 8 (Q6) bits against the largest, then every element
//! requantized against the rounded scales.

use super::fit::{GROUP_MAX_EPS, Qkx2Search, make_qkx2_quants, make_qx_quants, nearest_int};
use super::{array_at, f16_at, put_f16};

/// The 6-bit scale and min of 32-element sub-block `j` (0..8) of a Q4_K / Q5_K block, from its 12 packed scale
/// bytes: sub-blocks 0..4 use the low 6 bits of bytes `j` and `j + 4`; sub-blocks 4..8 take their low 4 bits from
/// byte `j + 4` and their high 2 bits from the top bits of bytes `j − 4` (scale) and `j` (min). ggml's
/// `get_scale_min_k4`.
pub fn k_scale_min(j: usize, scales: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        let sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

pub(super) fn dequantize_q4_k(b: &[u8; 144], y: &mut [f32; 256]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = array_at::<12>(b, 4);
    for c in 0..4 {
        let qs = &b[16 + 32 * c..16 + 32 * c + 32];
        let (sc1, m1) = k_scale_min(2 * c, scales);
        let (sc2, m2) = k_scale_min(2 * c + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        for (l, &q) in qs.iter().enumerate() {
            y[64 * c + l] = d1 * (q & 0x0F) as f32 - min1;
            y[64 * c + 32 + l] = d2 * (q >> 4) as f32 - min2;
        }
    }
}

pub(super) fn dequantize_q5_k(b: &[u8; 176], y: &mut [f32; 256]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = array_at::<12>(b, 4);
    let qh = &b[16..48];
    for c in 0..4 {
        let qs = &b[48 + 32 * c..48 + 32 * c + 32];
        let (sc1, m1) = k_scale_min(2 * c, scales);
        let (sc2, m2) = k_scale_min(2 * c + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for (l, &q) in qs.iter().enumerate() {
            let hi1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let hi2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[64 * c + l] = d1 * ((q & 0x0F) as i32 + hi1) as f32 - min1;
            y[64 * c + 32 + l] = d2 * ((q >> 4) as i32 + hi2) as f32 - min2;
        }
    }
}

pub(super) fn dequantize_q6_k(b: &[u8; 210], y: &mut [f32; 256]) {
    let d = f16_at(b, 208);
    for n in 0..2 {
        let (ql, qh) = (&b[64 * n..64 * n + 64], &b[128 + 32 * n..128 + 32 * n + 32]);
        let sc = |g: usize, l: usize| b[192 + 8 * n + 2 * g + l / 16] as i8 as f32;
        for l in 0..32 {
            let q = [
                (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (g, &q) in q.iter().enumerate() {
                y[128 * n + 32 * g + l] = d * sc(g, l) * (q as i32 - 32) as f32;
            }
        }
    }
}

pub(super) fn dequantize_q8_k(b: &[u8; 292], y: &mut [f32; 256]) {
    let d = f32::from_le_bytes(*array_at::<4>(b, 0));
    for (v, &q) in y.iter_mut().zip(&b[4..260]) {
        *v = d * q as i8 as f32;
    }
}

const Q4_K_SEARCH: Qkx2Search = Qkx2Search { nmax: 15, rmin: -1.0, rdelta: 0.1, nstep: 20, use_mad: false };
const Q5_K_SEARCH: Qkx2Search = Qkx2Search { nmax: 31, rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: false };

pub(super) fn quantize_q4_k(x: &[f32; 256], b: &mut [u8; 144]) {
    let mut levels = [0u8; 256];
    let (scales, mins) = fit_sub_blocks(&Q4_K_SEARCH, x, &mut levels);
    store_scales_mins(&scales, &mins, b);
    requantize(x, b, 15, &mut levels);
    for c in 0..4 {
        for l in 0..32 {
            b[16 + 32 * c + l] = levels[64 * c + l] | levels[64 * c + 32 + l] << 4;
        }
    }
}

pub(super) fn quantize_q5_k(x: &[f32; 256], b: &mut [u8; 176]) {
    let mut levels = [0u8; 256];
    let (scales, mins) = fit_sub_blocks(&Q5_K_SEARCH, x, &mut levels);
    store_scales_mins(&scales, &mins, b);
    requantize(x, b, 31, &mut levels);
    b[16..48].fill(0);
    for c in 0..4 {
        for l in 0..32 {
            let (lo, hi) = (levels[64 * c + l], levels[64 * c + 32 + l]);
            b[16 + l] |= (lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1);
            b[48 + 32 * c + l] = (lo & 0x0F) | (hi & 0x0F) << 4;
        }
    }
}

/// Fits each 32-element sub-block with weights `rms(sub-block) + |x|`; returns the scales and mins.
fn fit_sub_blocks(search: &Qkx2Search, x: &[f32; 256], levels: &mut [u8; 256]) -> ([f32; 8], [f32; 8]) {
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut weights, mut scratch) = ([0f32; 32], [0u8; 32]);
    for (j, (xs, ls)) in x.chunks_exact(32).zip(levels.chunks_exact_mut(32)).enumerate() {
        let sum_x2 = xs.iter().fold(0f32, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(search, xs, &weights, ls, &mut scratch);
    }
    (scales, mins)
}

/// Rounds the sub-block scales and mins to 6 bits against the largest of each, packs them into bytes 4..16 (see
/// [`k_scale_min`]) and stores `d`, `dmin` in bytes 0..4.
fn store_scales_mins(scales: &[f32; 8], mins: &[f32; 8], b: &mut [u8]) {
    let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let packed = &mut b[4..16];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0F) | (lm & 0x0F) << 4;
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(b, 0, max_scale / 63.0);
    put_f16(b, 2, max_min / 63.0);
}

/// Requantizes every element against the stored (rounded) `d·sc` and `dmin·m`, levels `0..=nmax`. Sub-blocks
/// whose scale rounded to zero keep the levels of the fit, as in ggml.
fn requantize(x: &[f32; 256], b: &[u8], nmax: i32, levels: &mut [u8; 256]) {
    let scales = array_at::<12>(b, 4);
    for j in 0..8 {
        let (sc, m) = k_scale_min(j, scales);
        let d = f16_at(b, 0) * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = f16_at(b, 2) * m as f32;
        for i in 32 * j..32 * j + 32 {
            levels[i] = nearest_int((x[i] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

pub(super) fn quantize_q6_k(x: &[f32; 256], b: &mut [u8; 210]) {
    let mut levels = [0i8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for (ib, (xs, ls)) in x.chunks_exact(16).zip(levels.chunks_exact_mut(16)).enumerate() {
        scales[ib] = make_qx_quants(32, xs, ls);
        if scales[ib].abs() > max_abs_scale {
            max_abs_scale = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        b.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(b, 208, 1.0 / iscale);
    for ib in 0..16 {
        b[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let d = f16_at(b, 208) * b[192 + j] as i8 as f32;
        if d == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            levels[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as i8;
        }
    }
    pack_q6_k(&levels, b);
}

/// Splits 6-bit levels into `ql` (low nibbles) and `qh` (high 2 bits) in Q6_K's element order.
fn pack_q6_k(levels: &[i8; 256], b: &mut [u8; 210]) {
    for n in 0..2 {
        let lv = |g: usize, l: usize| levels[128 * n + 32 * g + l] as u8;
        for l in 0..32 {
            b[64 * n + l] = (lv(0, l) & 0x0F) | (lv(2, l) & 0x0F) << 4;
            b[64 * n + 32 + l] = (lv(1, l) & 0x0F) | (lv(3, l) & 0x0F) << 4;
            b[128 + 32 * n + l] = lv(0, l) >> 4 | (lv(1, l) >> 4) << 2 | (lv(2, l) >> 4) << 4 | (lv(3, l) >> 4) << 6;
        }
    }
}

/// ggml's `quantize_row_q8_K_ref`: `q = round(−127·x/max)` against the signed element of largest magnitude.
/// An all-zero block is all zero bytes (ggml leaves its `bsums` unwritten).
pub(super) fn quantize_q8_k(x: &[f32; 256], b: &mut [u8; 292]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        b.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b[4..260].iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8 as u8;
    }
    for i in 0..16 {
        let sum: i32 = b[4 + 16 * i..4 + 16 * i + 16].iter().map(|&q| q as i8 as i32).sum();
        b[260 + 2 * i..262 + 2 * i].copy_from_slice(&(sum as i16).to_le_bytes());
    }
    b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}
