//! AVX-512 (F, BW, VL, DQ, VNNI: Zen 4, Ice Lake and later) activation quantization and the many-row GEMM path.
//!
//! `m <= 4` activation rows go to the row-streaming kernels of `avx512_rows`. Larger `m` (prefill, long
//! verification) uses 16-row panels: the panel's rows are copied in order into a per-thread buffer and regrouped,
//! a few blocks at a time, so that one 512-bit vector holds 4 consecutive weights (as unsigned bytes) of each of
//! the 16 rows. One `vpdpbusd` against 4 broadcast activation bytes then adds a 4-term dot product to every row's
//! lane; per-sub-block scales multiply whole lanes and nothing is reduced horizontally; every panel vector meets up
//! to `RMAX` activation rows held in registers.
//!
//! Signed weights and zero points are handled by making every weight unsigned (Q4_0 `q`, Q8_0 `q+128`, Q6_K
//! `q`...) and starting the integer accumulator at `-zero_point·Σa` from the activation row's trailer.

#![allow(unsafe_op_in_unsafe_fn)]
#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

use super::blocks::*;
use super::{ActFormat, Layout};
use gguf::GgmlType;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

pub fn supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

// ---------------------------------------------------------------------------------------------------------------
// Small helpers.

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn ld(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn st(p: *mut u8, v: __m512i) {
    _mm512_storeu_si512(p as *mut _, v)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn ldps(p: *const u8) -> __m512 {
    _mm512_loadu_ps(p as *const f32)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn stps(p: *mut u8, v: __m512) {
    _mm512_storeu_ps(p as *mut f32, v)
}

/// Broadcast of the 4 bytes at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn bc(p: *const u8) -> __m512i {
    _mm512_set1_epi32((p as *const i32).read_unaligned())
}

/// Broadcast of the f32 at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn bcf(p: *const u8) -> __m512 {
    _mm512_set1_ps((p as *const f32).read_unaligned())
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn dp(acc: __m512i, w: __m512i, a: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(acc, w, a)
}

/// `out[j] = [a.lane j, b.lane j, c.lane j, d.lane j]` over 128-bit lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn tr_lanes(a: __m512i, b: __m512i, c: __m512i, d: __m512i) -> [__m512i; 4] {
    let t0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(a, b);
    let t1 = _mm512_shuffle_i32x4::<0b11_10_11_10>(a, b);
    let t2 = _mm512_shuffle_i32x4::<0b01_00_01_00>(c, d);
    let t3 = _mm512_shuffle_i32x4::<0b11_10_11_10>(c, d);
    [
        _mm512_shuffle_i32x4::<0b10_00_10_00>(t0, t2),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(t0, t2),
        _mm512_shuffle_i32x4::<0b10_00_10_00>(t1, t3),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(t1, t3),
    ]
}

/// Transposes 16 rows of 64 bytes at `src[i] + off`: `out[t]` lane `i` = dword `t` of row `i`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn transpose16(src: &[*const u8; 16], off: usize) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        let a = ld(src[2 * i].add(off));
        let b = ld(src[2 * i + 1].add(off));
        t[2 * i] = _mm512_unpacklo_epi32(a, b);
        t[2 * i + 1] = _mm512_unpackhi_epi32(a, b);
    }
    let mut u = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    let mut z = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        let o = tr_lanes(u[j], u[4 + j], u[8 + j], u[12 + j]);
        for l in 0..4 {
            z[4 * l + j] = o[l];
        }
    }
    z
}

/// Transposes 16 rows of 16 bytes at `src[i] + off`: `out[u]` lane `i` = dword `u` of row `i`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn transpose4(src: &[*const u8; 16], off: usize) -> [__m512i; 4] {
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut z = [_mm512_setzero_si512(); 4];
    for g in 0..4 {
        let mut v = _mm512_castsi128_si512(_mm_loadu_si128(src[4 * g].add(off) as *const __m128i));
        v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(src[4 * g + 1].add(off) as *const __m128i));
        v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(src[4 * g + 2].add(off) as *const __m128i));
        v = _mm512_inserti32x4::<3>(v, _mm_loadu_si128(src[4 * g + 3].add(off) as *const __m128i));
        z[g] = _mm512_permutexvar_epi32(idx, v);
    }
    tr_lanes(z[0], z[1], z[2], z[3])
}

/// The 16 rows' f16 at `src[i] + off`, widened.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn gather_f16(src: &[*const u8; 16], off: usize) -> __m512 {
    let mut h = [0u16; 16];
    for i in 0..16 {
        h[i] = (src[i].add(off) as *const u16).read_unaligned();
    }
    _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr() as *const __m256i))
}

/// The 16 rows' u32 at `src[i] + off`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn gather_u32(src: &[*const u8; 16], off: usize) -> __m512i {
    let mut h = [0u32; 16];
    for i in 0..16 {
        h[i] = (src[i].add(off) as *const u32).read_unaligned();
    }
    ld(h.as_ptr() as *const u8)
}

/// Per dword lane: byte `b` (0..4) = 0x10 if bit `bit0 + b` of the lane is set, else 0 (`bit0` a multiple of 4).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn bits_to_0x10(qh: __m512i, bit0: u32) -> __m512i {
    let byte = (bit0 / 8) as i32;
    let nib = bit0 % 8;
    let idx = _mm512_add_epi32(
        _mm512_set1_epi32(byte * 0x0101_0101),
        _mm512_set4_epi32(0x0c0c_0c0c, 0x0808_0808, 0x0404_0404, 0),
    );
    let rep = _mm512_shuffle_epi8(qh, idx);
    let pat = _mm512_set1_epi32(i32::from_le_bytes([1 << nib, 2 << nib, 4 << nib, 8 << nib]));
    let k = _mm512_test_epi8_mask(rep, pat);
    _mm512_maskz_mov_epi8(k, _mm512_set1_epi8(0x10))
}

// ---------------------------------------------------------------------------------------------------------------
// Activation quantization (bit-identical to ggml's reference quantizers).

/// ggml's `roundf` (halves away from zero) of `v`, as i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn round_away(v: __m512) -> __m512i {
    // trunc(v + copysign(0.5 - 2^-25, v)) equals roundf(v) for every finite f32.
    let sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(i32::MIN));
    let half = _mm512_or_si512(sign, _mm512_set1_epi32(0x3EFF_FFFF));
    _mm512_cvttps_epi32(_mm512_add_ps(v, _mm512_castsi512_ps(half)))
}

/// One 32-block of Q8_0 / Q8_1 quants: returns (d, Σq).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_32(x: *const f32, qs: *mut u8) -> (f32, i32) {
    let x0 = _mm512_loadu_ps(x);
    let x1 = _mm512_loadu_ps(x.add(16));
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let vid = _mm512_set1_ps(id);
    let q0 = round_away(_mm512_mul_ps(x0, vid));
    let q1 = round_away(_mm512_mul_ps(x1, vid));
    _mm_storeu_si128(qs as *mut __m128i, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(qs.add(16) as *mut __m128i, _mm512_cvtepi32_epi8(q1));
    (d, _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_k_block(x: *const f32, ob: *mut u8) {
    let mut vmax = _mm512_setzero_ps();
    for j in 0..16 {
        vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x.add(16 * j))));
    }
    let amax = _mm512_reduce_max_ps(vmax);
    if amax == 0.0 {
        std::ptr::write_bytes(ob, 0, Q8_K_BYTES);
        return;
    }
    // ggml keeps the first element of largest magnitude, with its sign.
    let vamax = _mm512_set1_ps(amax);
    let mut max = amax;
    for j in 0..16 {
        let k = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(_mm512_loadu_ps(x.add(16 * j))), vamax);
        if k != 0 {
            max = *x.add(16 * j + k.trailing_zeros() as usize);
            break;
        }
    }
    let iscale = -127.0 / max;
    let vs = _mm512_set1_ps(iscale);
    let v127 = _mm512_set1_epi32(127);
    for j in 0..16 {
        let v = _mm512_mul_ps(_mm512_loadu_ps(x.add(16 * j)), vs);
        let q =
            _mm512_min_epi32(_mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v), v127);
        _mm_storeu_si128(ob.add(Q8K_QS + 16 * j) as *mut __m128i, _mm512_cvtepi32_epi8(q));
        let s = _mm512_reduce_add_epi32(q) as i16;
        (ob.add(Q8K_BSUMS + 2 * j) as *mut i16).write_unaligned(s);
    }
    (ob as *mut f32).write_unaligned(1.0 / iscale);
}

/// # Safety
/// Requires the CPU features of [`supported`]; `out` is `act_row_bytes(fmt, x.len())` long.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn quantize_act_row(fmt: ActFormat, x: &[f32], out: &mut [u8]) {
    let k = x.len();
    let o = out.as_mut_ptr();
    match fmt {
        ActFormat::F32 => std::ptr::copy_nonoverlapping(x.as_ptr() as *const u8, o, 4 * k),
        ActFormat::Q8_0 => {
            let nb = k / QK;
            for i in 0..nb {
                let ob = o.add(i * Q8_0_BYTES);
                let (d, s) = q8_32(x.as_ptr().add(i * QK), ob.add(2));
                let dh = f32_to_f16(d);
                (ob as *mut u16).write_unaligned(dh);
                let e = o.add(nb * Q8_0_BYTES + i * Q8_0_EXTRA);
                (e as *mut i32).write_unaligned(-s);
                (e.add(4) as *mut f32).write_unaligned(f16_to_f32(dh));
            }
        }
        ActFormat::Q8_1 => {
            let nb = k / QK;
            for i in 0..nb {
                let ob = o.add(i * Q8_1_BYTES);
                let (d, s) = q8_32(x.as_ptr().add(i * QK), ob.add(4));
                let dh = f32_to_f16(d);
                let sh = f32_to_f16(s as f32 * d);
                (ob as *mut u16).write_unaligned(dh);
                (ob.add(2) as *mut u16).write_unaligned(sh);
                let e = o.add(nb * Q8_1_BYTES + i * Q8_1_EXTRA);
                (e as *mut f32).write_unaligned(f16_to_f32(dh));
                (e.add(4) as *mut f32).write_unaligned(f16_to_f32(sh));
            }
        }
        ActFormat::Q8_K => {
            let nb = k / QK_K;
            for i in 0..nb {
                q8_k_block(x.as_ptr().add(i * QK_K), o.add(i * Q8_K_BYTES));
            }
            super::scalar::fill_trailer(fmt, out, k);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Panel driver.

/// A weight type's panel format and micro-kernel.
trait Panel {
    /// Elements per packing unit (one ggml block).
    const UNIT: usize;
    /// Weight bytes per unit and row.
    const WBYTES: usize;
    /// Activation bytes per unit (the ggml block) and trailer bytes per unit.
    const ABYTES: usize;
    const XBYTES: usize;
    /// Packed bytes per unit of a 16-row panel (a multiple of 64).
    const PBYTES: usize;
    /// Units packed at a time.
    const KC: usize;
    /// Most activation rows per micro-kernel call.
    const RMAX: usize;
    /// Packs unit `u` (its index in the row) of 16 rows (`src[i]` points at row `i`'s unit: `u · WBYTES` past the
    /// row's start).
    unsafe fn pack(src: &[*const u8; 16], u: usize, dst: *mut u8);
    /// `acc[r][slot(u)] += unit u of panel · activation row r` over `n` packed units, in unit order, with the
    /// canonical per-unit step (`NOTES.md`, "Batch invariance"); `u0` is the first unit's index in the row,
    /// `slot(u) = (u0 + u) % SLOTS`; `a[r]` / `x[r]` point at the first unit's activation block / trailer.
    unsafe fn kernel<const R: usize>(
        pk: *const u8,
        n: usize,
        u0: usize,
        a: &[*const u8; R],
        x: &[*const u8; R],
        acc: *mut [__m512; SLOTS],
    );
}

/// Running sums per (weight row, activation row): block or super-block `u` of a row is added to sum `u % SLOTS`,
/// and the sums are combined as `(s0 + s1) + (s2 + s3)` (the canonical order shared with the row kernels, so a
/// result does not depend on the path, `m`, the row range or the thread count).
pub(super) const SLOTS: usize = 4;

/// The canonical combination of the `SLOTS` running sums.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn combine_slots(s: &[__m512; SLOTS]) -> __m512 {
    _mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]))
}

/// A 64-byte aligned line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct A64(pub(super) [u8; 64]);

thread_local! {
    static SCRATCH: RefCell<Vec<A64>> = const { RefCell::new(Vec::new()) };
}

/// The largest `m` that goes to the row-streaming kernels (`SPLASH_ROWS_MAX` overrides it, for benchmarks).
fn rows_max_m(wty: GgmlType) -> usize {
    static V: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    V.get_or_init(|| std::env::var("SPLASH_ROWS_MAX").ok().and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| super::avx512_rows::max_m(wty))
}

/// Activation rows per outer block: their panel sums stay in L1 and their blocks in L2.
const MC: usize = 64;

/// A per-thread buffer of at least `n` 64-byte lines. Valid until the next call on this thread.
fn scratch(n: usize) -> *mut A64 {
    SCRATCH.with_borrow_mut(|v| {
        if v.len() < n {
            v.resize(n, A64([0; 64]));
        }
        v.as_mut_ptr()
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn group<T: Panel, const R: usize>(
    pk: *const u8,
    n: usize,
    u0: usize,
    a0: *const u8,
    x0: *const u8,
    act_rb: usize,
    facc: *mut [__m512; SLOTS],
) {
    let mut a = [a0; R];
    let mut x = [x0; R];
    for r in 0..R {
        a[r] = a0.add(r * act_rb);
        x[r] = x0.add(r * act_rb);
    }
    T::kernel::<R>(pk, n, u0, &a, &x, facc);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn drive<T: Panel>(
    src_layout: Layout,
    w: &[u8],
    k: usize,
    rows: Range<usize>,
    acts: &[u8],
    act_rb: usize,
    m: usize,
    out: *mut f32,
    ldo: usize,
) {
    let nu = k / T::UNIT;
    let rb = nu * T::WBYTES;
    let xoff = nu * T::ABYTES;
    let stage_lines = (16 * rb).div_ceil(64);
    let pk_lines = T::KC * T::PBYTES / 64;
    let buf = scratch(stage_lines + pk_lines + MC * SLOTS);
    let stage = buf as *mut u8;
    let pk = buf.add(stage_lines) as *mut u8;
    let facc = buf.add(stage_lines + pk_lines) as *mut [__m512; SLOTS];
    let mut t0 = 0;
    while t0 < m {
        let mc = MC.min(m - t0);
        let mut p0 = rows.start;
        while p0 < rows.end {
            let nvalid = (rows.end - p0).min(16);
            // The panel's rows are one contiguous run of bytes. Reading it in order and packing from this copy
            // streams from DRAM at full speed; packing straight from 16 interleaved rows runs at a third of it.
            match src_layout {
                // Q5_0 quads rows keep their place and size; their panel type (`Q50Q`) reads the groups.
                Layout::Gguf | Layout::Q50Quads => {
                    std::ptr::copy_nonoverlapping(w.as_ptr().add(p0 * rb), stage, nvalid * rb)
                }
                Layout::Q4KPairs => {
                    for i in 0..nvalid {
                        q4k_pairs_unpack_row(w.as_ptr(), k, p0 + i, stage.add(i * rb));
                    }
                }
                Layout::Q6KPairs => {
                    let stage_rows = std::slice::from_raw_parts_mut(stage, nvalid * rb);
                    for (i, row) in stage_rows.chunks_exact_mut(rb).enumerate() {
                        super::q6k_pairs::unpack_row(w, k, p0 + i, row);
                    }
                }
            }
            let mut src = [stage as *const u8; 16];
            for (i, s) in src.iter_mut().enumerate() {
                *s = stage.add(i.min(nvalid - 1) * rb);
            }
            for t in 0..mc {
                *facc.add(t) = [_mm512_setzero_ps(); SLOTS];
            }
            // Meanwhile, keep DRAM busy with the next panel, a slice per packed unit.
            // (Past `rows.end` too: the caller's next chunk of rows usually follows.)
            // (In the pairs layout 16 rows from an even row are 8 whole pairs, as many bytes give or take the tails.)
            let (row_bytes, w_rows) = match src_layout.pair_bytes(k) {
                None => (rb, w.len() / rb),
                Some(pb) => (pb / 2, 2 * (w.len() / pb)),
            };
            let next = w.as_ptr().add((p0 + 16).min(w_rows) * row_bytes);
            let next_len = w_rows.saturating_sub(p0 + 16).min(16) * row_bytes;
            let mut u0 = 0;
            while u0 < nu {
                let nc = T::KC.min(nu - u0);
                for u in 0..nc {
                    let (pf0, pf1) = (next_len * (u0 + u) / nu, next_len * (u0 + u + 1) / nu);
                    let mut o = pf0 & !63;
                    while o < pf1 {
                        _mm_prefetch::<_MM_HINT_T0>(next.add(o) as *const i8);
                        o += 64;
                    }
                    let mut s = src;
                    for p in s.iter_mut() {
                        *p = p.add((u0 + u) * T::WBYTES);
                    }
                    T::pack(&s, u0 + u, pk.add(u * T::PBYTES));
                }
                let ng = mc.div_ceil(T::RMAX);
                let mut t = 0;
                for g in 0..ng {
                    let r = (mc - t).div_ceil(ng - g);
                    let a0 = acts.as_ptr().add((t0 + t) * act_rb + u0 * T::ABYTES);
                    let x0 = acts.as_ptr().add((t0 + t) * act_rb + xoff + u0 * T::XBYTES);
                    let f = facc.add(t);
                    match r {
                        1 => group::<T, 1>(pk, nc, u0, a0, x0, act_rb, f),
                        2 => group::<T, 2>(pk, nc, u0, a0, x0, act_rb, f),
                        3 => group::<T, 3>(pk, nc, u0, a0, x0, act_rb, f),
                        4 => group::<T, 4>(pk, nc, u0, a0, x0, act_rb, f),
                        5 => group::<T, 5>(pk, nc, u0, a0, x0, act_rb, f),
                        6 => group::<T, 6>(pk, nc, u0, a0, x0, act_rb, f),
                        _ => unreachable!("RMAX is at most 6"),
                    }
                    t += r;
                }
                u0 += nc;
            }
            let mask: __mmask16 = if nvalid == 16 { 0xFFFF } else { (1u16 << nvalid) - 1 };
            for t in 0..mc {
                _mm512_mask_storeu_ps(out.add((t0 + t) * ldo + p0), mask, combine_slots(&*facc.add(t)));
            }
            p0 += nvalid;
        }
        t0 += mc;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Q4_K: packed unit = qs nibbles (32 vectors: vector t holds qs dword t of each row; low nibbles are sub-block
// 2·(t/8), high nibbles sub-block 2·(t/8)+1, positions 4·(t%8)..+4), 8 scale vectors (i32), 4 min-pair vectors
// (i16 pairs m[2p], m[2p+1]), d and dmin (f32).

struct Q4K;

const Q4K_SC: usize = 2048;
const Q4K_MN: usize = Q4K_SC + 512;
const Q4K_D: usize = Q4K_MN + 256;

/// Unpacks the 12 scale bytes of 16 K-quant rows (`h[1..4]` from [`transpose4`]) into 8 scale vectors (i32) and 4
/// min-pair vectors, stored at `dst_sc` and `dst_mn`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn unpack_k4_scales(h: &[__m512i; 4], dst_sc: *mut u8, dst_mn: *mut u8) {
    let m3f = _mm512_set1_epi8(0x3f);
    let m0f = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let sc_lo = _mm512_and_si512(h[1], m3f);
    let mn_lo = _mm512_and_si512(h[2], m3f);
    let sc_hi = _mm512_or_si512(_mm512_and_si512(h[3], m0f), _mm512_and_si512(_mm512_srli_epi32::<2>(h[1]), m30));
    let mn_hi = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi32::<4>(h[3]), m0f),
        _mm512_and_si512(_mm512_srli_epi32::<2>(h[2]), m30),
    );
    let ff = _mm512_set1_epi32(0xff);
    for (i, v) in [sc_lo, sc_hi].into_iter().enumerate() {
        st(dst_sc.add(256 * i), _mm512_and_si512(v, ff));
        st(dst_sc.add(256 * i + 64), _mm512_and_si512(_mm512_srli_epi32::<8>(v), ff));
        st(dst_sc.add(256 * i + 128), _mm512_and_si512(_mm512_srli_epi32::<16>(v), ff));
        st(dst_sc.add(256 * i + 192), _mm512_srli_epi32::<24>(v));
    }
    // Bytes [m0 m1 m2 m3] of each lane -> pair 0 = [m0, m1] as i16, pair 1 = [m2, m3].
    let z = -128i8;
    let sh0 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, z, 1, z, 4, z, 5, z, 8, z, 9, z, 12, z, 13, z));
    let sh1 = _mm512_broadcast_i32x4(_mm_setr_epi8(2, z, 3, z, 6, z, 7, z, 10, z, 11, z, 14, z, 15, z));
    for (i, v) in [mn_lo, mn_hi].into_iter().enumerate() {
        st(dst_mn.add(128 * i), _mm512_shuffle_epi8(v, sh0));
        st(dst_mn.add(128 * i + 64), _mm512_shuffle_epi8(v, sh1));
    }
}

impl Panel for Q4K {
    const UNIT: usize = QK_K;
    const WBYTES: usize = Q4_K_BYTES;
    const ABYTES: usize = Q8_K_BYTES;
    const XBYTES: usize = Q8_K_EXTRA;
    const PBYTES: usize = Q4K_D + 128;
    const KC: usize = 4;
    const RMAX: usize = 4;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn pack(src: &[*const u8; 16], _u: usize, dst: *mut u8) {
        for h in 0..2 {
            let z = transpose16(src, 16 + 64 * h);
            for (t, v) in z.iter().enumerate() {
                st(dst.add(64 * (16 * h + t)), *v);
            }
        }
        let hd = transpose4(src, 0);
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hd[0]));
        let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(hd[0])));
        stps(dst.add(Q4K_D), d);
        stps(dst.add(Q4K_D + 64), dmin);
        unpack_k4_scales(&hd, dst.add(Q4K_SC), dst.add(Q4K_MN));
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn kernel<const R: usize>(
        pk: *const u8,
        n: usize,
        u0: usize,
        a: &[*const u8; R],
        x: &[*const u8; R],
        acc: *mut [__m512; SLOTS],
    ) {
        let m4 = _mm512_set1_epi8(0x0f);
        for u in 0..n {
            let p = pk.add(u * Self::PBYTES);
            let ao = u * Q8_K_BYTES + Q8K_QS;
            let mut isum = [_mm512_setzero_si512(); R];
            for c in 0..4 {
                let mut al = [_mm512_setzero_si512(); R];
                let mut ah = [_mm512_setzero_si512(); R];
                for t in 0..8 {
                    let wv = ld(p.add(64 * (8 * c + t)));
                    let wl = _mm512_and_si512(wv, m4);
                    let wh = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), m4);
                    for r in 0..R {
                        let ap = a[r].add(ao + 64 * c + 4 * t);
                        al[r] = dp(al[r], wl, bc(ap));
                        ah[r] = dp(ah[r], wh, bc(ap.add(32)));
                    }
                }
                let sl = ld(p.add(Q4K_SC + 128 * c));
                let sh = ld(p.add(Q4K_SC + 128 * c + 64));
                for r in 0..R {
                    isum[r] = _mm512_add_epi32(
                        isum[r],
                        _mm512_add_epi32(_mm512_mullo_epi32(al[r], sl), _mm512_mullo_epi32(ah[r], sh)),
                    );
                }
            }
            let dv = ldps(p.add(Q4K_D));
            let dmv = ldps(p.add(Q4K_D + 64));
            for r in 0..R {
                let xp = x[r].add(u * Q8_K_EXTRA);
                let mut im = _mm512_dpwssd_epi32(_mm512_setzero_si512(), ld(p.add(Q4K_MN)), bc(xp));
                for q in 1..4 {
                    im = _mm512_dpwssd_epi32(im, ld(p.add(Q4K_MN + 64 * q)), bc(xp.add(4 * q)));
                }
                let da = bcf(a[r].add(u * Q8_K_BYTES));
                let sl = &mut (*acc.add(r))[(u0 + u) % SLOTS];
                let v = _mm512_fmsub_ps(
                    _mm512_cvtepi32_ps(isum[r]),
                    _mm512_mul_ps(dv, da),
                    _mm512_mul_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dmv, da)),
                );
                *sl = _mm512_add_ps(*sl, v);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Q5_K: packed unit = unpacked 5-bit values (64 vectors: vector 8j+t holds positions 4t..4t+4 of sub-block j),
// then scales / mins / d / dmin as Q4_K.

struct Q5K;

const Q5K_SC: usize = 4096;
const Q5K_MN: usize = Q5K_SC + 512;
const Q5K_D: usize = Q5K_MN + 256;

impl Panel for Q5K {
    const UNIT: usize = QK_K;
    const WBYTES: usize = Q5_K_BYTES;
    const ABYTES: usize = Q8_K_BYTES;
    const XBYTES: usize = Q8_K_EXTRA;
    const PBYTES: usize = Q5K_D + 128;
    const KC: usize = 2;
    const RMAX: usize = 4;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn pack(src: &[*const u8; 16], _u: usize, dst: *mut u8) {
        let qa = transpose4(src, 16);
        let qb = transpose4(src, 32);
        let qh = [qa[0], qa[1], qa[2], qa[3], qb[0], qb[1], qb[2], qb[3]];
        let m0f = _mm512_set1_epi8(0x0f);
        let m01 = _mm512_set1_epi8(0x01);
        for h in 0..2 {
            let z = transpose16(src, 48 + 64 * h);
            for (i, wv) in z.iter().enumerate() {
                // qs dword i of half h: chunk c = 2h + i/8, positions 4(i%8)..
                let c = 2 * h + i / 8;
                let t = i % 8;
                let hv = qh[t];
                let j0 = 2 * c;
                let lo = _mm512_and_si512(*wv, m0f);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(*wv), m0f);
                let b0 = _mm512_and_si512(_mm512_srlv_epi32(hv, _mm512_set1_epi32(j0 as i32)), m01);
                let b1 = _mm512_and_si512(_mm512_srlv_epi32(hv, _mm512_set1_epi32(j0 as i32 + 1)), m01);
                st(dst.add(64 * (8 * j0 + t)), _mm512_or_si512(lo, _mm512_slli_epi32::<4>(b0)));
                st(dst.add(64 * (8 * (j0 + 1) + t)), _mm512_or_si512(hi, _mm512_slli_epi32::<4>(b1)));
            }
        }
        let hd = transpose4(src, 0);
        stps(dst.add(Q5K_D), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hd[0])));
        stps(dst.add(Q5K_D + 64), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(hd[0]))));
        unpack_k4_scales(&hd, dst.add(Q5K_SC), dst.add(Q5K_MN));
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn kernel<const R: usize>(
        pk: *const u8,
        n: usize,
        u0: usize,
        a: &[*const u8; R],
        x: &[*const u8; R],
        acc: *mut [__m512; SLOTS],
    ) {
        for u in 0..n {
            let p = pk.add(u * Self::PBYTES);
            let ao = u * Q8_K_BYTES + Q8K_QS;
            let mut isum = [_mm512_setzero_si512(); R];
            for j in 0..8 {
                let mut aj = [_mm512_setzero_si512(); R];
                for t in 0..8 {
                    let wv = ld(p.add(64 * (8 * j + t)));
                    for r in 0..R {
                        aj[r] = dp(aj[r], wv, bc(a[r].add(ao + 32 * j + 4 * t)));
                    }
                }
                let sc = ld(p.add(Q5K_SC + 64 * j));
                for r in 0..R {
                    isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(aj[r], sc));
                }
            }
            let dv = ldps(p.add(Q5K_D));
            let dmv = ldps(p.add(Q5K_D + 64));
            for r in 0..R {
                let xp = x[r].add(u * Q8_K_EXTRA);
                let mut im = _mm512_dpwssd_epi32(_mm512_setzero_si512(), ld(p.add(Q5K_MN)), bc(xp));
                for q in 1..4 {
                    im = _mm512_dpwssd_epi32(im, ld(p.add(Q5K_MN + 64 * q)), bc(xp.add(4 * q)));
                }
                let da = bcf(a[r].add(u * Q8_K_BYTES));
                let sl = &mut (*acc.add(r))[(u0 + u) % SLOTS];
                let v = _mm512_fmsub_ps(
                    _mm512_cvtepi32_ps(isum[r]),
                    _mm512_mul_ps(dv, da),
                    _mm512_mul_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dmv, da)),
                );
                *sl = _mm512_add_ps(*sl, v);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Q6_K: packed unit = unpacked 6-bit values (64 vectors: vector u holds values 4u..4u+4), 16 × 16 scale bytes
// (sub-block j's scales of rows 0..15), d (f32).

struct Q6K;

const Q6K_SC: usize = 4096;
const Q6K_D: usize = Q6K_SC + 256;

impl Panel for Q6K {
    const UNIT: usize = QK_K;
    const WBYTES: usize = Q6_K_BYTES;
    const ABYTES: usize = Q8_K_BYTES;
    const XBYTES: usize = Q8_K_EXTRA;
    const PBYTES: usize = Q6K_D + 64;
    const KC: usize = 3;
    const RMAX: usize = 4;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn pack(src: &[*const u8; 16], _u: usize, dst: *mut u8) {
        let qh = transpose16(src, 128);
        let m0f = _mm512_set1_epi8(0x0f);
        let m30 = _mm512_set1_epi8(0x30);
        for h in 0..2 {
            let ql = transpose16(src, 64 * h);
            for j in 0..8 {
                let (av, bv, hv) = (ql[j], ql[8 + j], qh[8 * h + j]);
                let a4 = _mm512_srli_epi16::<4>(av);
                let b4 = _mm512_srli_epi16::<4>(bv);
                let v0 = _mm512_or_si512(_mm512_and_si512(av, m0f), _mm512_and_si512(_mm512_slli_epi16::<4>(hv), m30));
                let v1 = _mm512_or_si512(_mm512_and_si512(bv, m0f), _mm512_and_si512(_mm512_slli_epi16::<2>(hv), m30));
                let v2 = _mm512_or_si512(_mm512_and_si512(a4, m0f), _mm512_and_si512(hv, m30));
                let v3 = _mm512_or_si512(_mm512_and_si512(b4, m0f), _mm512_and_si512(_mm512_srli_epi16::<2>(hv), m30));
                st(dst.add(64 * (32 * h + j)), v0);
                st(dst.add(64 * (32 * h + 8 + j)), v1);
                st(dst.add(64 * (32 * h + 16 + j)), v2);
                st(dst.add(64 * (32 * h + 24 + j)), v3);
            }
        }
        // Scales: lane i of sc[u] holds bytes 4u..4u+4 of row i; regroup to 16 bytes per sub-block.
        let sc = transpose4(src, 192);
        let byte_tr = _mm512_set4_epi32(0x0f0b_0703, 0x0e0a_0602, 0x0d09_0501, 0x0c08_0400);
        let dw_tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        for (u, v) in sc.iter().enumerate() {
            let t = _mm512_permutexvar_epi32(dw_tr, _mm512_shuffle_epi8(*v, byte_tr));
            st(dst.add(Q6K_SC + 64 * u), t);
        }
        stps(dst.add(Q6K_D), gather_f16(src, 208));
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn kernel<const R: usize>(
        pk: *const u8,
        n: usize,
        u0: usize,
        a: &[*const u8; R],
        x: &[*const u8; R],
        acc: *mut [__m512; SLOTS],
    ) {
        for u in 0..n {
            let p = pk.add(u * Self::PBYTES);
            let ao = u * Q8_K_BYTES + Q8K_QS;
            let xo = u * Q8_K_EXTRA + 16;
            let mut isum = [_mm512_setzero_si512(); R];
            for j in 0..16 {
                let mut aj = [_mm512_setzero_si512(); R];
                for r in 0..R {
                    aj[r] = bc(x[r].add(xo + 4 * j));
                }
                for q in 0..4 {
                    let wv = ld(p.add(64 * (4 * j + q)));
                    for r in 0..R {
                        aj[r] = dp(aj[r], wv, bc(a[r].add(ao + 16 * j + 4 * q)));
                    }
                }
                let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(Q6K_SC + 16 * j) as *const __m128i));
                for r in 0..R {
                    isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(aj[r], sc));
                }
            }
            let dv = ldps(p.add(Q6K_D));
            for r in 0..R {
                let da = bcf(a[r].add(u * Q8_K_BYTES));
                let sl = &mut (*acc.add(r))[(u0 + u) % SLOTS];
                *sl = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(dv, da), *sl);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Legacy 32-blocks: packed unit = 8 vectors of unsigned values (vector v holds positions 4v..4v+4), then d (f32)
// and, for the types with a min, m (f32). The accumulator starts at `-zero·Σa`, `zero` = 2^ZSHIFT.

/// Shared kernel for the 32-blocks. `ZSHIFT` = log2 of the zero point (0: none; Q4_1 / Q5_1 add `m·s` instead).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn legacy_kernel<const R: usize, const ZSHIFT: u32, const HAS_MIN: bool, const PB: usize, const AB: usize>(
    pk: *const u8,
    n: usize,
    u0: usize,
    a: &[*const u8; R],
    x: &[*const u8; R],
    acc: *mut [__m512; SLOTS],
) {
    for u in 0..n {
        let p = pk.add(u * PB);
        let mut ai = [_mm512_setzero_si512(); R];
        if ZSHIFT > 0 {
            for r in 0..R {
                ai[r] = _mm512_sll_epi32(bc(x[r].add(8 * u)), _mm_cvtsi32_si128(ZSHIFT as i32));
            }
        }
        for v in 0..8 {
            let wv = ld(p.add(64 * v));
            for r in 0..R {
                ai[r] = dp(ai[r], wv, bc(a[r].add(u * AB + (AB - 32) + 4 * v)));
            }
        }
        let dv = ldps(p.add(512));
        for r in 0..R {
            // Q8_0 trailer: (-Σq, d); Q8_1 trailer: (d, s).
            let da = if HAS_MIN { bcf(x[r].add(8 * u)) } else { bcf(x[r].add(8 * u + 4)) };
            // The canonical per-block step shared with the row kernels (`NOTES.md`, "Batch invariance").
            let mut v = _mm512_mul_ps(_mm512_cvtepi32_ps(ai[r]), _mm512_mul_ps(dv, da));
            if HAS_MIN {
                v = _mm512_fmadd_ps(ldps(p.add(576)), bcf(x[r].add(8 * u + 4)), v);
            }
            let sl = &mut (*acc.add(r))[(u0 + u) % SLOTS];
            *sl = _mm512_add_ps(*sl, v);
        }
    }
}

/// Transposed nibbles of 16 bytes at `off` -> 8 value vectors (low nibbles: positions 0..16, high: 16..32).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn pack_nibbles(src: &[*const u8; 16], off: usize) -> [__m512i; 8] {
    let q = transpose4(src, off);
    let m0f = _mm512_set1_epi8(0x0f);
    let mut v = [_mm512_setzero_si512(); 8];
    for i in 0..4 {
        v[i] = _mm512_and_si512(q[i], m0f);
        v[4 + i] = _mm512_and_si512(_mm512_srli_epi16::<4>(q[i]), m0f);
    }
    v
}

macro_rules! legacy_panel {
    ($name:ident, $wbytes:expr, $abytes:expr, $xbytes:expr, $zshift:expr, $has_min:expr, |$src:ident, $u:ident, $dst:ident| $pack:block) => {
        struct $name;
        impl Panel for $name {
            const UNIT: usize = QK;
            const WBYTES: usize = $wbytes;
            const ABYTES: usize = $abytes;
            const XBYTES: usize = $xbytes;
            const PBYTES: usize = 512 + 64 + if $has_min { 64 } else { 0 };
            const KC: usize = 16;
            const RMAX: usize = 4;

            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
            unsafe fn pack($src: &[*const u8; 16], $u: usize, $dst: *mut u8) $pack

            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
            unsafe fn kernel<const R: usize>(
                pk: *const u8,
                n: usize,
                u0: usize,
                a: &[*const u8; R],
                x: &[*const u8; R],
                acc: *mut [__m512; SLOTS],
            ) {
                legacy_kernel::<R, $zshift, $has_min, { Self::PBYTES }, $abytes>(pk, n, u0, a, x, acc)
            }
        }
    };
}

legacy_panel!(Q40, Q4_0_BYTES, Q8_0_BYTES, Q8_0_EXTRA, 3, false, |src, _u, dst| {
    let v = pack_nibbles(src, 2);
    for (i, x) in v.iter().enumerate() {
        st(dst.add(64 * i), *x);
    }
    stps(dst.add(512), gather_f16(src, 0));
});

legacy_panel!(Q41, Q4_1_BYTES, Q8_1_BYTES, Q8_1_EXTRA, 0, true, |src, _u, dst| {
    let v = pack_nibbles(src, 4);
    for (i, x) in v.iter().enumerate() {
        st(dst.add(64 * i), *x);
    }
    stps(dst.add(512), gather_f16(src, 0));
    stps(dst.add(576), gather_f16(src, 2));
});

legacy_panel!(Q50, Q5_0_BYTES, Q8_0_BYTES, Q8_0_EXTRA, 4, false, |src, _u, dst| {
    let v = pack_nibbles(src, 6);
    let qh = gather_u32(src, 2);
    for (i, x) in v.iter().enumerate() {
        st(dst.add(64 * i), _mm512_or_si512(*x, bits_to_0x10(qh, 4 * i as u32)));
    }
    stps(dst.add(512), gather_f16(src, 0));
});

// Q5_0 in the quads layout (`super::q50_quads`), packed into Q50's panel format: unit `u` is block `u % 4` of its
// group, and `src[i]` points `22 · (u % 4)` bytes into the group.
legacy_panel!(Q50Q, Q5_0_BYTES, Q8_0_BYTES, Q8_0_EXTRA, 4, false, |src, u, dst| {
    // Q50's packing, with each block's fields at its place in the group.
    let j = u % 4;
    let mut g = [std::ptr::null::<u8>(); 16];
    for (gi, si) in g.iter_mut().zip(src) {
        *gi = si.sub(Q5_0_BYTES * j);
    }
    let v = pack_nibbles(&g, 16 * j);
    let qh = gather_u32(&g, 64 + 4 * j);
    for (i, x) in v.iter().enumerate() {
        st(dst.add(64 * i), _mm512_or_si512(*x, bits_to_0x10(qh, 4 * i as u32)));
    }
    stps(dst.add(512), gather_f16(&g, 80 + 2 * j));
});

legacy_panel!(Q51, Q5_1_BYTES, Q8_1_BYTES, Q8_1_EXTRA, 0, true, |src, _u, dst| {
    let v = pack_nibbles(src, 8);
    let qh = gather_u32(src, 4);
    for (i, x) in v.iter().enumerate() {
        st(dst.add(64 * i), _mm512_or_si512(*x, bits_to_0x10(qh, 4 * i as u32)));
    }
    stps(dst.add(512), gather_f16(src, 0));
    stps(dst.add(576), gather_f16(src, 2));
});

legacy_panel!(Q80, Q8_0_BYTES, Q8_0_BYTES, Q8_0_EXTRA, 7, false, |src, _u, dst| {
    let lo = transpose4(src, 2);
    let hi = transpose4(src, 18);
    let flip = _mm512_set1_epi8(-128);
    for i in 0..4 {
        st(dst.add(64 * i), _mm512_xor_si512(lo[i], flip));
        st(dst.add(64 * (4 + i)), _mm512_xor_si512(hi[i], flip));
    }
    stps(dst.add(512), gather_f16(src, 0));
});

// ---------------------------------------------------------------------------------------------------------------
// Float weights against f32 activations: 4 weight rows x up to 4 activation rows, 16 columns at a time.

trait FloatW {
    const BYTES: usize;
    unsafe fn load(p: *const u8, mask: __mmask16) -> __m512;
}

struct WF32;
struct WF16;
struct WBF16;

impl FloatW for WF32 {
    const BYTES: usize = 4;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn load(p: *const u8, mask: __mmask16) -> __m512 {
        _mm512_maskz_loadu_ps(mask, p as *const f32)
    }
}

impl FloatW for WF16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn load(p: *const u8, mask: __mmask16) -> __m512 {
        _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p as *const i16))
    }
}

impl FloatW for WBF16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn load(p: *const u8, mask: __mmask16) -> __m512 {
        let h = _mm256_maskz_loadu_epi16(mask, p as *const i16);
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn float_tile<W: FloatW, const NR: usize, const R: usize>(
    w: *const u8,
    rb: usize,
    a: *const u8,
    act_rb: usize,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); R]; NR];
    let mut i = 0;
    while i < k {
        let mask: __mmask16 = if k - i >= 16 { 0xFFFF } else { (1u16 << (k - i)) - 1 };
        let mut av = [_mm512_setzero_ps(); R];
        for t in 0..R {
            av[t] = _mm512_maskz_loadu_ps(mask, a.add(t * act_rb + 4 * i) as *const f32);
        }
        for j in 0..NR {
            let wv = W::load(w.add(j * rb + W::BYTES * i), mask);
            for t in 0..R {
                acc[j][t] = _mm512_fmadd_ps(wv, av[t], acc[j][t]);
            }
        }
        i += 16;
    }
    for j in 0..NR {
        for t in 0..R {
            *out.add(t * ldo + j) = _mm512_reduce_add_ps(acc[j][t]);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn float_rows<W: FloatW>(
    w: &[u8],
    k: usize,
    rows: Range<usize>,
    acts: &[u8],
    act_rb: usize,
    m: usize,
    out: *mut f32,
    ldo: usize,
) {
    let rb = k * W::BYTES;
    // Few activation rows: one weight row at a time, so that DRAM sees one sequential stream (see avx512_rows).
    let max_nr = if m <= 4 { 1 } else { 4 };
    let mut r0 = rows.start;
    while r0 < rows.end {
        let nr = (rows.end - r0).min(max_nr);
        let wp = w.as_ptr().add(r0 * rb);
        let mut t = 0;
        while t < m {
            let r = (m - t).min(4);
            let ap = acts.as_ptr().add(t * act_rb);
            let op = out.add(t * ldo + r0);
            macro_rules! tile {
                ($nr:literal) => {
                    match r {
                        1 => float_tile::<W, $nr, 1>(wp, rb, ap, act_rb, k, op, ldo),
                        2 => float_tile::<W, $nr, 2>(wp, rb, ap, act_rb, k, op, ldo),
                        3 => float_tile::<W, $nr, 3>(wp, rb, ap, act_rb, k, op, ldo),
                        _ => float_tile::<W, $nr, 4>(wp, rb, ap, act_rb, k, op, ldo),
                    }
                };
            }
            match nr {
                1 => tile!(1),
                2 => tile!(2),
                3 => tile!(3),
                _ => tile!(4),
            }
            t += r;
        }
        r0 += nr;
    }
}

/// `matmul_rows` for weights in a layout repacked at load: the row kernels for a few activation rows, else the
/// panels. Q4_K and Q6_K pairs (`super::q4k_pairs`, `super::q6k_pairs`): the row kernels read them directly, the
/// panels restore each panel's GGUF rows first. Q5_0 quads (`super::q50_quads`): rows up to m = 2, then the panels,
/// which pack straight from the groups (m = 3: 1.9 ns per block-row against 2.06 on the rows, one thread,
/// cache-resident).
///
/// # Safety
/// As `super::matmul_rows`, plus the CPU features of [`supported`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_rows_repacked(
    layout: Layout,
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
    match layout {
        Layout::Q50Quads if m <= 2 => super::avx512_rows::matmul_rows_q50_quads(w, k, rows, acts, act_rb, m, out, ldo),
        Layout::Q50Quads => drive::<Q50Q>(layout, w, k, rows, acts, act_rb, m, out, ldo),
        _ if m <= rows_max_m(wty).min(8) => {
            super::avx512_rows::matmul_rows_pairs(layout, w, k, rows, acts, act_rb, m, out, ldo)
        }
        Layout::Q4KPairs => drive::<Q4K>(layout, w, k, rows, acts, act_rb, m, out, ldo),
        _ => drive::<Q6K>(layout, w, k, rows, acts, act_rb, m, out, ldo),
    }
}

/// Restores row `r` of a Q4_K pairs matrix to GGUF blocks at `dst` (`k / 256 · 144` bytes): per super-block, the
/// 16 bytes of its slot in the four 128-bit lanes of the group's quant vectors hold chunk `c`'s dword `d` at
/// vector `d`, lane `c`; a 4×4 dword transpose per half restores the chunks in order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_pairs_unpack_row(packed: *const u8, k: usize, r: usize, dst: *mut u8) {
    use super::q4k_pairs::{locate, pair_bytes};
    let nsb = k / QK_K;
    let pair = packed.add((r / 2) * pair_bytes(k));
    for sb in 0..nsb {
        let (head, q0, stride, s) = locate(nsb, r % 2, sb);
        let blk = dst.add(sb * Q4_K_BYTES);
        std::ptr::copy_nonoverlapping(pair.add(head + 16 * s), blk, 16);
        // y[e] = [vector e's slot lane | vector e+4's slot lane]: dwords (d = e, c = 0..4 | d = e + 4, c = 0..4).
        let mut y = [_mm256_setzero_si256(); 4];
        for (e, v) in y.iter_mut().enumerate() {
            let lo = _mm_loadu_si128(pair.add(q0 + stride * e + 16 * s) as *const __m128i);
            let hi = _mm_loadu_si128(pair.add(q0 + stride * (e + 4) + 16 * s) as *const __m128i);
            *v = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi);
        }
        // Per 128-bit half, a 4×4 transpose: t[c] = (d = 0..4 | d = 4..8) of chunk c, i.e. chunk c's 32 bytes.
        let t01l = _mm256_unpacklo_epi32(y[0], y[1]);
        let t01h = _mm256_unpackhi_epi32(y[0], y[1]);
        let t23l = _mm256_unpacklo_epi32(y[2], y[3]);
        let t23h = _mm256_unpackhi_epi32(y[2], y[3]);
        let t = [
            _mm256_unpacklo_epi64(t01l, t23l),
            _mm256_unpackhi_epi64(t01l, t23l),
            _mm256_unpacklo_epi64(t01h, t23h),
            _mm256_unpackhi_epi64(t01h, t23h),
        ];
        for (c, v) in t.iter().enumerate() {
            _mm256_storeu_si256(blk.add(16 + 32 * c) as *mut __m256i, *v);
        }
    }
}

/// # Safety
/// As `super::matmul_rows`, plus the CPU features of [`supported`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
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
    if m <= rows_max_m(wty) && super::avx512_rows::matmul_rows(wty, w, k, rows.clone(), acts, act_rb, m, out, ldo) {
        return;
    }
    match wty {
        Q4_K => drive::<Q4K>(Layout::Gguf, w, k, rows, acts, act_rb, m, out, ldo),
        Q5_K => drive::<Q5K>(Layout::Gguf, w, k, rows, acts, act_rb, m, out, ldo),
        Q6_K => drive::<Q6K>(Layout::Gguf, w, k, rows, acts, act_rb, m, out, ldo),
        Q4_0 => drive::<Q40>(Layout::Gguf, w, k, rows, acts, act_rb, m, out, ldo),
        Q4_1 => drive::<Q41>(Layout::Gguf, w, k, rows, acts, act_rb, m, out, ldo),
        Q5_0 => drive::<Q50>(Layout::Gguf, w, k, rows, acts, act_rb, m, out, ldo),
        Q5_1 => drive::<Q51>(Layout::Gguf, w, k, rows, acts, act_rb, m, out, ldo),
        Q8_0 => drive::<Q80>(Layout::Gguf, w, k, rows, acts, act_rb, m, out, ldo),
        F32 => float_rows::<WF32>(w, k, rows, acts, act_rb, m, out, ldo),
        F16 => float_rows::<WF16>(w, k, rows, acts, act_rb, m, out, ldo),
        BF16 => float_rows::<WBF16>(w, k, rows, acts, act_rb, m, out, ldo),
        _ => super::scalar::matmul_rows(wty, w, k, rows, acts, act_rb, m, out, ldo),
    }
}
