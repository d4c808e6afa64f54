//! aarch64 Advanced SIMD kernels: row by row, one activation row at a time, with ggml's integer math.
//!
//! Every weight value is brought to a signed byte (zero points subtracted, or unsigned values below 64), products
//! of 16 bytes are widened with `vmull_s8`/`vmlal_s8` (two products per i16 lane cannot overflow) and pairwise
//! added into i32 lanes. Float weights and activation quantization use the portable code.
//!
//! Compiled (`cargo check --target aarch64-unknown-linux-gnu`) but not run on the build machine, which is x86-64.

#![allow(unsafe_op_in_unsafe_fn)]
#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

use super::blocks::*;
use gguf::GgmlType;
use std::arch::aarch64::*;
use std::ops::Range;

pub fn supported() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
}

/// Σ w[i]·a[i] over 16 signed bytes, as 4 partial i32 sums.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot16(w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let p = vmull_s8(vget_low_s8(w), vget_low_s8(a));
    let p = vmlal_s8(p, vget_high_s8(w), vget_high_s8(a));
    vpaddlq_s16(p)
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn ld_s8(p: *const u8) -> int8x16_t {
    vld1q_s8(p as *const i8)
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn lo_nib(q: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f)))
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn hi_nib(q: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(vshrq_n_u8::<4>(q))
}

fn rd_f32p(p: *const u8) -> f32 {
    // SAFETY: callers pass pointers inside the activation row.
    unsafe { (p as *const f32).read_unaligned() }
}

fn rd_f16p(p: *const u8) -> f32 {
    // SAFETY: callers pass pointers inside the weight row.
    f16_to_f32(unsafe { (p as *const u16).read_unaligned() })
}

#[target_feature(enable = "neon")]
unsafe fn dot_q4_k(w: *const u8, a: *const u8, x: *const u8, nb: usize, five: bool) -> f32 {
    let bb = if five { Q5_K_BYTES } else { Q4_K_BYTES };
    let qs_off = if five { 48 } else { 16 };
    let mut sum = 0f32;
    for s in 0..nb {
        let b = w.add(s * bb);
        let ab = a.add(s * Q8_K_BYTES);
        let (sc, mn) = scales_mins_k4(std::slice::from_raw_parts(b.add(4), 12));
        let qa = ab.add(Q8K_QS);
        let (h0, h1) = if five { (vld1q_u8(b.add(16)), vld1q_u8(b.add(32))) } else { (vdupq_n_u8(0), vdupq_n_u8(0)) };
        let mut isum = 0i32;
        for c in 0..4 {
            let q0 = vld1q_u8(b.add(qs_off + 32 * c));
            let q1 = vld1q_u8(b.add(qs_off + 32 * c + 16));
            let (mut l0, mut l1, mut u0, mut u1) = (lo_nib(q0), lo_nib(q1), hi_nib(q0), hi_nib(q1));
            if five {
                // qh[l] bit j: fifth bit of sub-block j at position l.
                let bit = |h: uint8x16_t, j: usize| -> int8x16_t {
                    let m = vdupq_n_u8(1 << j);
                    let set = vtstq_u8(h, m);
                    vreinterpretq_s8_u8(vandq_u8(set, vdupq_n_u8(0x10)))
                };
                l0 = vorrq_s8(l0, bit(h0, 2 * c));
                l1 = vorrq_s8(l1, bit(h1, 2 * c));
                u0 = vorrq_s8(u0, bit(h0, 2 * c + 1));
                u1 = vorrq_s8(u1, bit(h1, 2 * c + 1));
            }
            let a0 = qa.add(64 * c);
            let s_lo = vaddvq_s32(vaddq_s32(dot16(l0, ld_s8(a0)), dot16(l1, ld_s8(a0.add(16)))));
            let s_hi = vaddvq_s32(vaddq_s32(dot16(u0, ld_s8(a0.add(32))), dot16(u1, ld_s8(a0.add(48)))));
            isum += sc[2 * c] as i32 * s_lo + sc[2 * c + 1] as i32 * s_hi;
        }
        let mut imin = 0i32;
        for j in 0..8 {
            imin += mn[j] as i32 * (x.add(s * Q8_K_EXTRA + 2 * j) as *const i16).read_unaligned() as i32;
        }
        let da = rd_f32p(ab);
        sum += da * rd_f16p(b) * isum as f32 - da * rd_f16p(b.add(2)) * imin as f32;
    }
    sum
}

#[target_feature(enable = "neon")]
unsafe fn dot_q6_k(w: *const u8, a: *const u8, nb: usize) -> f32 {
    let m4 = vdupq_n_u8(0x0f);
    let m3 = vdupq_n_u8(0x03);
    let off = vdupq_n_s8(32);
    let mut sum = 0f32;
    for s in 0..nb {
        let b = w.add(s * Q6_K_BYTES);
        let ab = a.add(s * Q8_K_BYTES);
        let qa = ab.add(Q8K_QS);
        let mut isum = 0i32;
        for h in 0..2 {
            for half in 0..2 {
                // positions l = 16·half .. +16 of this 128-value half
                let l0 = vld1q_u8(b.add(64 * h + 16 * half));
                let l1 = vld1q_u8(b.add(64 * h + 32 + 16 * half));
                let qh = vld1q_u8(b.add(128 + 32 * h + 16 * half));
                let v = [
                    vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8::<4>(vandq_u8(qh, m3))),
                    vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qh), m3))),
                    vorrq_u8(vshrq_n_u8::<4>(l0), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qh), m3))),
                    vorrq_u8(vshrq_n_u8::<4>(l1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qh))),
                ];
                for (q, vq) in v.iter().enumerate() {
                    // values 128h + 32q + 16·half .. +16 = sub-block 8h + 2q + half
                    let sb = 8 * h + 2 * q + half;
                    let wv = vsubq_s8(vreinterpretq_s8_u8(*vq), off);
                    let d = vaddvq_s32(dot16(wv, ld_s8(qa.add(16 * sb))));
                    isum += (*b.add(192 + sb) as i8) as i32 * d;
                }
            }
        }
        sum += rd_f32p(ab) * rd_f16p(b.add(208)) * isum as f32;
    }
    sum
}

/// The 32 weights of a legacy block as signed bytes (zero point subtracted), with its d and m.
#[target_feature(enable = "neon")]
unsafe fn legacy_block(wty: GgmlType, b: *const u8) -> (int8x16_t, int8x16_t, f32, f32) {
    use GgmlType::*;
    match wty {
        Q4_0 => {
            let q = vld1q_u8(b.add(2));
            let z = vdupq_n_s8(8);
            (vsubq_s8(lo_nib(q), z), vsubq_s8(hi_nib(q), z), rd_f16p(b), 0.0)
        }
        Q4_1 => {
            let q = vld1q_u8(b.add(4));
            (lo_nib(q), hi_nib(q), rd_f16p(b), rd_f16p(b.add(2)))
        }
        Q5_0 | Q5_1 => {
            let (qh_off, qs_off) = if wty == Q5_0 { (2, 6) } else { (4, 8) };
            let q = vld1q_u8(b.add(qs_off));
            let qh = (b.add(qh_off) as *const u32).read_unaligned();
            let mut hb = [0u8; 32];
            for (j, h) in hb.iter_mut().enumerate() {
                *h = (((qh >> j) & 1) << 4) as u8;
            }
            let lo = vorrq_s8(lo_nib(q), ld_s8(hb.as_ptr()));
            let hi = vorrq_s8(hi_nib(q), ld_s8(hb.as_ptr().add(16)));
            if wty == Q5_0 {
                let z = vdupq_n_s8(16);
                (vsubq_s8(lo, z), vsubq_s8(hi, z), rd_f16p(b), 0.0)
            } else {
                (lo, hi, rd_f16p(b), rd_f16p(b.add(2)))
            }
        }
        _ => (ld_s8(b.add(2)), ld_s8(b.add(18)), rd_f16p(b), 0.0),
    }
}

#[target_feature(enable = "neon")]
unsafe fn dot_legacy(wty: GgmlType, w: *const u8, a: *const u8, x: *const u8, nb: usize) -> f32 {
    let has_min = matches!(wty, GgmlType::Q4_1 | GgmlType::Q5_1);
    let (ab, qo) = if has_min { (Q8_1_BYTES, 4) } else { (Q8_0_BYTES, 2) };
    let bb = wty.block_bytes();
    let mut sum = 0f32;
    for i in 0..nb {
        let (lo, hi, dw, mw) = legacy_block(wty, w.add(i * bb));
        let qa = a.add(i * ab + qo);
        let d = vaddvq_s32(vaddq_s32(dot16(lo, ld_s8(qa)), dot16(hi, ld_s8(qa.add(16)))));
        let e = x.add(8 * i);
        if has_min {
            sum += dw * rd_f32p(e) * d as f32 + mw * rd_f32p(e.add(4));
        } else {
            sum += dw * rd_f32p(e.add(4)) * d as f32;
        }
    }
    sum
}

/// # Safety
/// As `super::matmul_rows`.
#[target_feature(enable = "neon")]
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
    use GgmlType::*;
    let Some(fmt) = super::act_format(wty) else { return };
    if matches!(wty, F32 | F16 | BF16) {
        return super::scalar::matmul_rows(wty, w, k, rows, acts, act_rb, m, out, ldo);
    }
    let rb = wty.row_bytes(k).expect("INVARIANT: checked by the caller");
    let nb = k / wty.block_len();
    let xoff = fmt.ggml_row_bytes(k);
    for r in rows {
        let wr = w.as_ptr().add(r * rb);
        for t in 0..m {
            let a = acts.as_ptr().add(t * act_rb);
            let x = a.add(xoff);
            let v = match wty {
                Q4_K => dot_q4_k(wr, a, x, nb, false),
                Q5_K => dot_q4_k(wr, a, x, nb, true),
                Q6_K => dot_q6_k(wr, a, nb),
                _ => dot_legacy(wty, wr, a, x, nb),
            };
            *out.add(t * ldo + r) = v;
        }
    }
}
