//! Portable kernels: activation quantization bit-identical to ggml's `quantize_row_q8_*_ref`, and one
//! weight-row × activation-row dot product per type with exactly ggml's integer math. The SIMD levels are checked
//! against the same math; this level is also the fallback on machines without them.

use super::ActFormat;
use super::blocks::*;
use gguf::GgmlType;
use std::ops::Range;

/// ggml's `roundf`: halves away from zero (Rust's `f32::round`).
#[inline(always)]
fn round_away(v: f32) -> i8 {
    v.round() as i8
}

pub fn quantize_q8_0_blocks(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for (o, v) in ob[2..].iter_mut().zip(xb) {
            *o = round_away(v * id) as u8;
        }
    }
}

pub fn quantize_q8_1_blocks(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_1_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (o, v) in ob[4..].iter_mut().zip(xb) {
            let q = round_away(v * id);
            sum += q as i32;
            *o = q as u8;
        }
        ob[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        ob[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d).to_le_bytes());
    }
}

pub fn quantize_q8_k_blocks(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (o, v) in ob[Q8K_QS..Q8K_QS + QK_K].iter_mut().zip(xb) {
            *o = ((iscale * v).round_ties_even() as i32).min(127) as i8 as u8;
        }
        for j in 0..16 {
            let s: i32 = ob[Q8K_QS + 16 * j..Q8K_QS + 16 * j + 16].iter().map(|&q| q as i8 as i32).sum();
            ob[Q8K_BSUMS + 2 * j..Q8K_BSUMS + 2 * j + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
        ob[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// Fills the trailer of a quantized activation row whose ggml blocks are already written (see `blocks`).
pub fn fill_trailer(fmt: ActFormat, row: &mut [u8], k: usize) {
    match fmt {
        ActFormat::Q8_0 => {
            let nb = k / QK;
            let (blocks, extra) = row.split_at_mut(nb * Q8_0_BYTES);
            for (b, e) in blocks.chunks_exact(Q8_0_BYTES).zip(extra.chunks_exact_mut(Q8_0_EXTRA)) {
                let s: i32 = b[2..].iter().map(|&q| q as i8 as i32).sum();
                e[0..4].copy_from_slice(&(-s).to_le_bytes());
                e[4..8].copy_from_slice(&rd_f16(b, 0).to_le_bytes());
            }
        }
        ActFormat::Q8_1 => {
            let nb = k / QK;
            let (blocks, extra) = row.split_at_mut(nb * Q8_1_BYTES);
            for (b, e) in blocks.chunks_exact(Q8_1_BYTES).zip(extra.chunks_exact_mut(Q8_1_EXTRA)) {
                e[0..4].copy_from_slice(&rd_f16(b, 0).to_le_bytes());
                e[4..8].copy_from_slice(&rd_f16(b, 2).to_le_bytes());
            }
        }
        ActFormat::Q8_K => {
            let nb = k / QK_K;
            let (blocks, extra) = row.split_at_mut(nb * Q8_K_BYTES);
            for (b, e) in blocks.chunks_exact(Q8_K_BYTES).zip(extra.chunks_exact_mut(Q8_K_EXTRA)) {
                for j in 0..8 {
                    let s = rd_i16(b, Q8K_BSUMS + 4 * j) as i32 + rd_i16(b, Q8K_BSUMS + 4 * j + 2) as i32;
                    e[2 * j..2 * j + 2].copy_from_slice(&(s as i16).to_le_bytes());
                }
                for j in 0..16 {
                    let s = rd_i16(b, Q8K_BSUMS + 2 * j) as i32;
                    e[16 + 4 * j..20 + 4 * j].copy_from_slice(&(-32 * s).to_le_bytes());
                }
            }
        }
        ActFormat::F32 => {}
    }
}

pub fn quantize_act_row(fmt: ActFormat, x: &[f32], out: &mut [u8]) {
    let k = x.len();
    match fmt {
        ActFormat::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        ActFormat::Q8_0 => quantize_q8_0_blocks(x, out),
        ActFormat::Q8_1 => quantize_q8_1_blocks(x, out),
        ActFormat::Q8_K => quantize_q8_k_blocks(x, out),
    }
    fill_trailer(fmt, out, k);
}

#[inline(always)]
fn aq(a: &[u8], i: usize) -> i32 {
    a[i] as i8 as i32
}

fn dot_q4_0(w: &[u8], a: &[u8], k: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..k / QK {
        let (wb, ab) = (&w[i * Q4_0_BYTES..], &a[i * Q8_0_BYTES..]);
        let mut s = 0i32;
        for j in 0..16 {
            s += ((wb[2 + j] & 15) as i32 - 8) * aq(ab, 2 + j) + ((wb[2 + j] >> 4) as i32 - 8) * aq(ab, 18 + j);
        }
        sum += rd_f16(wb, 0) * rd_f16(ab, 0) * s as f32;
    }
    sum
}

fn dot_q4_1(w: &[u8], a: &[u8], k: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..k / QK {
        let (wb, ab) = (&w[i * Q4_1_BYTES..], &a[i * Q8_1_BYTES..]);
        let mut s = 0i32;
        for j in 0..16 {
            s += (wb[4 + j] & 15) as i32 * aq(ab, 4 + j) + (wb[4 + j] >> 4) as i32 * aq(ab, 20 + j);
        }
        sum += rd_f16(wb, 0) * rd_f16(ab, 0) * s as f32 + rd_f16(wb, 2) * rd_f16(ab, 2);
    }
    sum
}

fn dot_q5_0(w: &[u8], a: &[u8], k: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..k / QK {
        let (wb, ab) = (&w[i * Q5_0_BYTES..], &a[i * Q8_0_BYTES..]);
        let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
        let mut s = 0i32;
        for j in 0..16 {
            let lo = ((wb[6 + j] & 15) as u32 | ((qh >> j) & 1) << 4) as i32 - 16;
            let hi = ((wb[6 + j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4) as i32 - 16;
            s += lo * aq(ab, 2 + j) + hi * aq(ab, 18 + j);
        }
        sum += rd_f16(wb, 0) * rd_f16(ab, 0) * s as f32;
    }
    sum
}

fn dot_q5_1(w: &[u8], a: &[u8], k: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..k / QK {
        let (wb, ab) = (&w[i * Q5_1_BYTES..], &a[i * Q8_1_BYTES..]);
        let qh = u32::from_le_bytes([wb[4], wb[5], wb[6], wb[7]]);
        let mut s = 0i32;
        for j in 0..16 {
            let lo = ((wb[8 + j] & 15) as u32 | ((qh >> j) & 1) << 4) as i32;
            let hi = ((wb[8 + j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4) as i32;
            s += lo * aq(ab, 4 + j) + hi * aq(ab, 20 + j);
        }
        sum += rd_f16(wb, 0) * rd_f16(ab, 0) * s as f32 + rd_f16(wb, 2) * rd_f16(ab, 2);
    }
    sum
}

fn dot_q8_0(w: &[u8], a: &[u8], k: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..k / QK {
        let (wb, ab) = (&w[i * Q8_0_BYTES..], &a[i * Q8_0_BYTES..]);
        let s: i32 = (0..32).map(|j| aq(wb, 2 + j) * aq(ab, 2 + j)).sum();
        sum += rd_f16(wb, 0) * rd_f16(ab, 0) * s as f32;
    }
    sum
}

fn dot_q4_k(w: &[u8], a: &[u8], k: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..k / QK_K {
        let (wb, ab) = (&w[i * Q4_K_BYTES..], &a[i * Q8_K_BYTES..]);
        let (sc, mn) = scales_mins_k4(&wb[4..16]);
        let qs = &wb[16..144];
        let (mut isum, mut imin) = (0i32, 0i32);
        for j in 0..8 {
            let (c, shift) = (j / 2, 4 * (j % 2));
            let s: i32 = (0..32).map(|l| ((qs[32 * c + l] >> shift) & 15) as i32 * aq(ab, Q8K_QS + 32 * j + l)).sum();
            isum += sc[j] as i32 * s;
            let bs = rd_i16(ab, Q8K_BSUMS + 4 * j) as i32 + rd_i16(ab, Q8K_BSUMS + 4 * j + 2) as i32;
            imin += mn[j] as i32 * bs;
        }
        let da = rd_f32(ab, 0);
        sum += da * rd_f16(wb, 0) * isum as f32 - da * rd_f16(wb, 2) * imin as f32;
    }
    sum
}

fn dot_q5_k(w: &[u8], a: &[u8], k: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..k / QK_K {
        let (wb, ab) = (&w[i * Q5_K_BYTES..], &a[i * Q8_K_BYTES..]);
        let (sc, mn) = scales_mins_k4(&wb[4..16]);
        let qh = &wb[16..48];
        let qs = &wb[48..176];
        let (mut isum, mut imin) = (0i32, 0i32);
        for j in 0..8 {
            let (c, shift) = (j / 2, 4 * (j % 2));
            let s: i32 = (0..32)
                .map(|l| {
                    let q = ((qs[32 * c + l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4);
                    q as i32 * aq(ab, Q8K_QS + 32 * j + l)
                })
                .sum();
            isum += sc[j] as i32 * s;
            let bs = rd_i16(ab, Q8K_BSUMS + 4 * j) as i32 + rd_i16(ab, Q8K_BSUMS + 4 * j + 2) as i32;
            imin += mn[j] as i32 * bs;
        }
        let da = rd_f32(ab, 0);
        sum += da * rd_f16(wb, 0) * isum as f32 - da * rd_f16(wb, 2) * imin as f32;
    }
    sum
}

/// The 6-bit value `v` (0..256) of a Q6_K block, before the `-32` offset.
#[inline(always)]
pub fn q6k_value(wb: &[u8], v: usize) -> u8 {
    let (h, r) = (v / 128, v % 128);
    let (quarter, l) = (r / 32, r % 32);
    let ql = wb[64 * h + l + 32 * (quarter & 1)];
    let lo = if quarter < 2 { ql & 15 } else { ql >> 4 };
    let hi = (wb[128 + 32 * h + l] >> (2 * quarter)) & 3;
    lo | (hi << 4)
}

fn dot_q6_k(w: &[u8], a: &[u8], k: usize) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..k / QK_K {
        let (wb, ab) = (&w[i * Q6_K_BYTES..], &a[i * Q8_K_BYTES..]);
        let mut isum = 0i32;
        for j in 0..16 {
            let s: i32 = (0..16).map(|l| (q6k_value(wb, 16 * j + l) as i32 - 32) * aq(ab, Q8K_QS + 16 * j + l)).sum();
            isum += (wb[192 + j] as i8 as i32) * s;
        }
        sum += rd_f32(ab, 0) * rd_f16(wb, 208) * isum as f32;
    }
    sum
}

fn dot_f32(w: &[u8], a: &[u8], k: usize) -> f32 {
    (0..k).map(|i| rd_f32(w, 4 * i) * rd_f32(a, 4 * i)).sum()
}

fn dot_f16(w: &[u8], a: &[u8], k: usize) -> f32 {
    (0..k).map(|i| rd_f16(w, 2 * i) * rd_f32(a, 4 * i)).sum()
}

fn dot_bf16(w: &[u8], a: &[u8], k: usize) -> f32 {
    (0..k).map(|i| f32::from_bits((rd_u16(w, 2 * i) as u32) << 16) * rd_f32(a, 4 * i)).sum()
}

/// A weight row · activation row dot product over `k` elements.
type DotFn = fn(&[u8], &[u8], usize) -> f32;

/// The scalar dot product for weight type `wty`, or `None` if unsupported.
pub fn dot_fn(wty: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    Some(match wty {
        Q4_0 => dot_q4_0,
        Q4_1 => dot_q4_1,
        Q5_0 => dot_q5_0,
        Q5_1 => dot_q5_1,
        Q8_0 => dot_q8_0,
        Q4_K => dot_q4_k,
        Q5_K => dot_q5_k,
        Q6_K => dot_q6_k,
        F32 => dot_f32,
        F16 => dot_f16,
        BF16 => dot_bf16,
        _ => return None,
    })
}

/// Scalar `matmul_rows`; see the module-level contract in `super::matmul_rows`.
///
/// # Safety
/// As `super::matmul_rows`.
#[allow(clippy::too_many_arguments)]
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
    let dot = dot_fn(wty).expect("INVARIANT: checked by the caller");
    let rb = wty.row_bytes(k).expect("INVARIANT: checked by the caller");
    for r in rows {
        let wr = &w[r * rb..(r + 1) * rb];
        for t in 0..m {
            let v = dot(wr, &acts[t * act_rb..(t + 1) * act_rb], k);
            // SAFETY: the caller guarantees `out` is writable at t * ldo + r for these t, r.
            unsafe { *out.add(t * ldo + r) = v };
        }
    }
}
