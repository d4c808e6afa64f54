//! The 2- and 3-bit K formats, Q2_K and Q3_K: 256-element super-blocks of sixteen 16-element sub-blocks.
//!
//! Both store 2-bit fields in `qs: [u8; 64]` the same way: element `e = 128n + 32j + r` (`j` in 0..4, `r` in
//! 0..32) is bits `2j..2j+2` of `qs[32n + r]`. Sub-block `e / 16` gives the scale.
//!
//! * **Q2_K**: `scales[s]` holds a 4-bit scale (low nibble) and a 4-bit min (high nibble); value
//!   `d·sc·q − dmin·m`.
//! * **Q3_K**: the third bit is bit `e / 32` of `hmask[e % 32]`; a *clear* bit subtracts 4, so
//!   `q = qs bits − (bit ? 0 : 4)` in −4..3. Sixteen 6-bit scales (minus 32) are packed into 12 bytes (see
//!   [`q3_k_scale`]); value `d·(scale − 32)·q`.
//!
//! Quantization follows ggml's `quantize_row_q2_K_ref` / `quantize_row_q3_K_ref` (no importance matrix).

use super::fit::{Qkx2Search, make_q3_quants, make_qkx2_quants, nearest_int};
use super::{array_at, f16_at, put_f16};

/// The signed scale of sub-block `j` (0..16) of a Q3_K block, from its 12 packed bytes: the low 4 bits are the
/// low (`j < 8`) or high (`j ≥ 8`) nibble of byte `j % 8`; the high 2 bits are bits `2(j / 4)..` of byte
/// `8 + j % 4`. Returns the 6-bit value minus 32.
pub fn q3_k_scale(j: usize, scales: &[u8; 12]) -> i8 {
    let lo = if j < 8 { scales[j] & 0x0F } else { scales[j - 8] >> 4 };
    let hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    (lo | hi << 4) as i8 - 32
}

/// The 2-bit field of element `e` in Q2_K / Q3_K's `qs` (which starts at `qs_off` in block `b`).
fn two_bits(b: &[u8], qs_off: usize, e: usize) -> u8 {
    let (n, j, r) = (e / 128, (e % 128) / 32, e % 32);
    (b[qs_off + 32 * n + r] >> (2 * j)) & 3
}

pub(super) fn dequantize_q2_k(b: &[u8; 84], y: &mut [f32; 256]) {
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (s, ys) in y.chunks_exact_mut(16).enumerate() {
        let sc = b[s];
        let (dl, ml) = (d * (sc & 0x0F) as f32, dmin * (sc >> 4) as f32);
        for (i, v) in ys.iter_mut().enumerate() {
            *v = dl * two_bits(b, 16, 16 * s + i) as f32 - ml;
        }
    }
}

pub(super) fn dequantize_q3_k(b: &[u8; 110], y: &mut [f32; 256]) {
    let d = f16_at(b, 108);
    let scales = array_at::<12>(b, 96);
    for (s, ys) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * q3_k_scale(s, scales) as f32;
        for (i, v) in ys.iter_mut().enumerate() {
            let e = 16 * s + i;
            let high = b[e % 32] & (1 << (e / 32)) != 0;
            let q = two_bits(b, 32, e) as i32 - if high { 0 } else { 4 };
            *v = dl * q as f32;
        }
    }
}

/// Packs 2-bit levels (`0..4`) into `qs` (64 bytes) in the order [`two_bits`] reads.
fn pack_two_bits(levels: &[u8; 256], qs: &mut [u8]) {
    for n in 0..2 {
        for r in 0..32 {
            let l = |j: usize| levels[128 * n + 32 * j + r];
            qs[32 * n + r] = l(0) | l(1) << 2 | l(2) << 4 | l(3) << 6;
        }
    }
}

const Q2_K_SEARCH: Qkx2Search = Qkx2Search { nmax: 3, rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: true };

pub(super) fn quantize_q2_k(x: &[f32; 256], b: &mut [u8; 84]) {
    let mut levels = [0u8; 256];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    let (mut weights, mut scratch) = ([0f32; 16], [0u8; 16]);
    for (j, (xs, ls)) in x.chunks_exact(16).zip(levels.chunks_exact_mut(16)).enumerate() {
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(&Q2_K_SEARCH, xs, &weights, ls, &mut scratch);
    }
    let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    b[..16].fill(0);
    put_f16(b, 80, 0.0);
    put_f16(b, 82, 0.0);
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            b[j] = nearest_int(iscale * scales[j]) as u8;
        }
        put_f16(b, 80, max_scale / 15.0);
    }
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            b[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        put_f16(b, 82, max_min / 15.0);
    }
    for j in 0..16 {
        let d = f16_at(b, 80) * (b[j] & 0x0F) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = f16_at(b, 82) * (b[j] >> 4) as f32;
        for i in 16 * j..16 * j + 16 {
            levels[i] = nearest_int((x[i] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_two_bits(&levels, &mut b[16..80]);
}

pub(super) fn quantize_q3_k(x: &[f32; 256], b: &mut [u8; 110]) {
    let mut levels = [0i8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for (j, (xs, ls)) in x.chunks_exact(16).zip(levels.chunks_exact_mut(16)).enumerate() {
        scales[j] = make_q3_quants(4, xs, ls);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    b[96..108].fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &scale) in scales.iter().enumerate() {
            let l = ((nearest_int(iscale * scale) as i8).clamp(-32, 31) + 32) as u8;
            pack_q3_k_scale(j, l, b);
        }
        put_f16(b, 108, 1.0 / iscale);
    } else {
        put_f16(b, 108, 0.0);
    }
    let scales = *array_at::<12>(b, 96);
    for j in 0..16 {
        let d = f16_at(b, 108) * q3_k_scale(j, &scales) as f32;
        if d == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            levels[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    let mut low = [0u8; 256];
    b[..32].fill(0);
    for (e, (&l, lo)) in levels.iter().zip(&mut low).enumerate() {
        let l = l as u8;
        if l > 3 {
            b[e % 32] |= 1 << (e / 32);
        }
        *lo = l & 3;
    }
    pack_two_bits(&low, &mut b[32..96]);
}

/// Stores the 6-bit scale `l` of sub-block `j` into the packed bytes 96..108 (the inverse of [`q3_k_scale`]).
fn pack_q3_k_scale(j: usize, l: u8, b: &mut [u8]) {
    let packed = &mut b[96..108];
    if j < 8 {
        packed[j] = l & 0x0F;
    } else {
        packed[j - 8] |= (l & 0x0F) << 4;
    }
    packed[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
}
