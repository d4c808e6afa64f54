//! AVX-512 row-streaming kernels for few activation rows (decode, speculative verification).
//!
//! On the build machine (Zen 4) one core streams 21 GB/s from DRAM when it reads one contiguous run, but only 6-11
//! GB/s when it interleaves 2-16 row streams, even with software prefetch or a sequential staging copy. So for small
//! `m` each weight row is read front to back, one row at a time; its blocks are unpacked once into registers and
//! meet up to 4 activation rows. The integer math is ggml's AVX2 `vec_dot` math widened to 512 bits:
//! `maddubs` (u8 × i8 pairs) then `vpdpwssd` against the sub-block scales. Activation rows are first rearranged
//! per call ("prepared") so that no shuffles are needed per weight row.

#![allow(unsafe_op_in_unsafe_fn)]
#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

use super::blocks::*;
use std::arch::x86_64::*;
use std::ops::Range;

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn ld(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn rd_f32p(p: *const u8) -> f32 {
    (p as *const f32).read_unaligned()
}

/// Both f16 at `p` (d, dmin) widened.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn f16x2(p: *const u8) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The f16 at `p`, widened. (Inserted into a zeroed register: LLVM turns a plain 16-bit load into `vpinsrw`
/// over whatever register is free, which can be a loop's accumulator, and then the loop runs at FMA latency.)
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn f16x1(p: *const u8) -> f32 {
    let h = (p as *const u16).read_unaligned() as i32;
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_insert_epi16::<0>(_mm_setzero_si128(), h)))
}

/// The 8 scales and 8 mins of a Q4_K / Q5_K block as 16 × i16 `[sc0..sc7, m0..m7]` (ggml's `utmp` unpacking).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn k4_scales(q: *const u8) -> __m256i {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let u0 = (q as *const u32).read_unaligned();
    let u1 = (q.add(4) as *const u32).read_unaligned();
    let u2 = (q.add(8) as *const u32).read_unaligned();
    let m_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let m_lo = u1 & KMASK1;
    let s_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let s_lo = u0 & KMASK1;
    _mm256_cvtepu8_epi16(_mm_setr_epi32(s_lo as i32, s_hi as i32, m_lo as i32, m_hi as i32))
}

/// i16 index vector: lanes 0..16 = `a`, lanes 16..32 = `b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn idx2(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_set1_epi16(a), _mm256_set1_epi16(b))
}

/// i16 index vector: lanes 8i..8i+8 = `b + i`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn idx4(b: i16) -> __m512i {
    _mm512_add_epi16(
        _mm512_set1_epi16(b),
        _mm512_set_epi64(
            0x0003_0003_0003_0003,
            0x0003_0003_0003_0003,
            0x0002_0002_0002_0002,
            0x0002_0002_0002_0002,
            0x0001_0001_0001_0001,
            0x0001_0001_0001_0001,
            0,
            0,
        ),
    )
}

/// Every lane of each 128-bit chunk: the sum of that chunk's 4 lanes (exact integer sums).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn hsum4_epi32(v: __m512i) -> __m512i {
    let v = _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b01_00_11_10>(v));
    _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b10_11_00_01>(v))
}

/// One step of the canonical K-quant accumulation: `acc + fmsub(fi, dd, round(fm·dm))`, as the panel kernels do.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn canon_k_step(acc: f32, fi: f32, dd: f32, fm: f32, dm: f32) -> f32 {
    let v = _mm_fmsub_ss(_mm_set_ss(fi), _mm_set_ss(dd), _mm_mul_ss(_mm_set_ss(fm), _mm_set_ss(dm)));
    _mm_cvtss_f32(_mm_add_ss(_mm_set_ss(acc), v))
}

// The number of running sums of the canonical order and their combination (see `super::avx512::SLOTS`).
use super::avx512::SLOTS;

#[inline]
fn combine_slots(s: &[f32; SLOTS]) -> f32 {
    (s[0] + s[1]) + (s[2] + s[3])
}

/// One step of the canonical accumulation without a min term: `acc + fi·dd`, fused.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn canon_step(acc: f32, fi: f32, dd: f32) -> f32 {
    _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(fi), _mm_set_ss(dd), _mm_set_ss(acc)))
}

// ---------------------------------------------------------------------------------------------------------------
// K-quants against Q8_K.

/// Prepared Q8_K block for Q4_K / Q5_K: the 256 quants in nibble order (32-byte pieces 0,2,1,3,4,6,5,7), d, and
/// the 8 sums of 32 as i16.
const PK4: usize = 320;
const PK4_D: usize = 256;
const PK4_BS: usize = 272;

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn prep_k4(a: *const u8, x: *const u8, nsb: usize, dst: *mut u8) {
    const ORDER: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];
    for s in 0..nsb {
        let ab = a.add(s * Q8_K_BYTES);
        let d = dst.add(s * PK4);
        for (i, &o) in ORDER.iter().enumerate() {
            let v = _mm256_loadu_si256(ab.add(Q8K_QS + 32 * o) as *const __m256i);
            _mm256_storeu_si256(d.add(32 * i) as *mut __m256i, v);
        }
        (d.add(PK4_D) as *mut f32).write_unaligned(rd_f32p(ab));
        let bs = _mm_loadu_si128(x.add(s * Q8_K_EXTRA) as *const __m128i);
        _mm_storeu_si128(d.add(PK4_BS) as *mut __m128i, bs);
    }
}

/// One Q4_K (or, with `FIVE`, Q5_K) row against R prepared activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn row_k4<const R: usize, const FIVE: bool>(w: *const u8, nsb: usize, pa: &[*const u8; R]) -> [f32; R] {
    let m4 = _mm512_set1_epi8(0x0f);
    let idx = [idx2(0, 2), idx2(1, 3), idx2(4, 6), idx2(5, 7)];
    let mut facc = [[0f32; SLOTS]; R];
    let bb = if FIVE { Q5_K_BYTES } else { Q4_K_BYTES };
    let qs_off = if FIVE { 48 } else { 16 };
    for s in 0..nsb {
        let b = w.add(s * bb);
        let (dw, dmin) = f16x2(b);
        let s16 = k4_scales(b.add(4));
        let s512 = _mm512_castsi256_si512(s16);
        let mins = _mm256_extracti128_si256::<1>(s16);
        let q0 = ld(b.add(qs_off));
        let q1 = ld(b.add(qs_off + 64));
        let mut v = [
            _mm512_and_si512(q0, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q0), m4),
            _mm512_and_si512(q1, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q1), m4),
        ];
        if FIVE {
            // qh[l] bit j is the fifth bit of sub-block j, position l. v[0] holds sub-blocks (0, 2), v[1] (1, 3),
            // v[2] (4, 6), v[3] (5, 7): shift each half so that its bit lands on bit 4.
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(16) as *const __m256i));
            let m10 = _mm512_set1_epi8(0x10);
            let shifts = [(4, 2), (3, 1), (0, -2), (-1, -3)];
            for (j, &(lo, hi)) in shifts.iter().enumerate() {
                // left shifts by (lo, hi) per 256-bit half; negative = right shift.
                let l = _mm512_inserti64x4::<1>(_mm512_set1_epi16(lo.max(0)), _mm256_set1_epi16(hi.max(0)));
                let r = _mm512_inserti64x4::<1>(_mm512_set1_epi16((-lo).max(0)), _mm256_set1_epi16((-hi).max(0)));
                let hb = _mm512_srlv_epi16(_mm512_sllv_epi16(qh, l), r);
                v[j] = _mm512_ternarylogic_epi32::<0xEC>(hb, v[j], m10);
            }
        }
        let sv = [
            _mm512_permutexvar_epi16(idx[0], s512),
            _mm512_permutexvar_epi16(idx[1], s512),
            _mm512_permutexvar_epi16(idx[2], s512),
            _mm512_permutexvar_epi16(idx[3], s512),
        ];
        for r in 0..R {
            let a = pa[r].add(s * PK4);
            let mut isum = _mm512_setzero_si512();
            for j in 0..4 {
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(v[j], ld(a.add(64 * j))), sv[j]);
            }
            let da = rd_f32p(a.add(PK4_D));
            let prod = _mm_madd_epi16(mins, _mm_loadu_si128(a.add(PK4_BS) as *const __m128i));
            let p2 = _mm_add_epi32(prod, _mm_shuffle_epi32::<0b01_00_11_10>(prod));
            let imin = _mm_cvtsi128_si32(_mm_add_epi32(p2, _mm_shuffle_epi32::<0b10_11_00_01>(p2)));
            // Canonical order (`NOTES.md`, "Batch invariance"), as the panels.
            let sl = &mut facc[r][s % SLOTS];
            *sl = canon_k_step(*sl, _mm512_reduce_add_epi32(isum) as f32, dw * da, imin as f32, dmin * da);
        }
    }
    facc.map(|f| combine_slots(&f))
}

/// One Q6_K row against R Q8_K activation rows (used as they are).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q6k<const R: usize>(w: *const u8, nsb: usize, pa: &[*const u8; R]) -> [f32; R] {
    let m0f = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let sl42 = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
    let sr02 = _mm512_inserti64x4::<1>(_mm512_set1_epi16(0), _mm256_set1_epi16(2));
    let idx = [idx4(0), idx4(4), idx4(8), idx4(12)];
    let mut facc = [[0f32; SLOTS]; R];
    for s in 0..nsb {
        let b = w.add(s * Q6_K_BYTES);
        let ql0 = ld(b);
        let ql1 = ld(b.add(64));
        let qha = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(128) as *const __m256i));
        let qhb = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(160) as *const __m256i));
        // Values 0..64: ql0 low nibbles | qh[0..32] bits (0,1) for the first 32, bits (2,3) for the next 32, ...
        let v = [
            _mm512_ternarylogic_epi32::<0xEC>(ql0, _mm512_and_si512(_mm512_sllv_epi16(qha, sl42), m30), m0f),
            _mm512_ternarylogic_epi32::<0xEC>(
                _mm512_srli_epi16::<4>(ql0),
                _mm512_and_si512(_mm512_srlv_epi16(qha, sr02), m30),
                m0f,
            ),
            _mm512_ternarylogic_epi32::<0xEC>(ql1, _mm512_and_si512(_mm512_sllv_epi16(qhb, sl42), m30), m0f),
            _mm512_ternarylogic_epi32::<0xEC>(
                _mm512_srli_epi16::<4>(ql1),
                _mm512_and_si512(_mm512_srlv_epi16(qhb, sr02), m30),
                m0f,
            ),
        ];
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
        let s512 = _mm512_castsi256_si512(sc16);
        let sv = [
            _mm512_permutexvar_epi16(idx[0], s512),
            _mm512_permutexvar_epi16(idx[1], s512),
            _mm512_permutexvar_epi16(idx[2], s512),
            _mm512_permutexvar_epi16(idx[3], s512),
        ];
        let dw = f16x1(b.add(208));
        for r in 0..R {
            let a = pa[r].add(s * Q8_K_BYTES);
            // The -32 offset: -32 · Σ_j sc_j · bsum_j.
            let corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256(a.add(Q8K_BSUMS) as *const __m256i));
            let mut isum =
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(_mm256_slli_epi32::<5>(corr)));
            for j in 0..4 {
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(v[j], ld(a.add(Q8K_QS + 64 * j))), sv[j]);
            }
            let sl = &mut facc[r][s % SLOTS];
            *sl = canon_step(*sl, _mm512_reduce_add_epi32(isum) as f32, dw * rd_f32p(a));
        }
    }
    facc.map(|f| combine_slots(&f))
}

/// Prepared Q8_K block for [`row_q6k_t`]: `a[d]` (lane 4p+L = quant dword d of sub-block 4p+L... see below), the
/// accumulator start `-32·bsum` per lane, `d`, and the next super-block's `d`.
const PQ6: usize = 384;
const PQ6_INIT: usize = 256;
const PQ6_D: usize = 320;

/// Lane `i` of the transposed Q6_K vectors holds sub-block `4·(i % 4) + i / 4`.
#[inline]
fn q6_lane_sub_block(i: usize) -> usize {
    4 * (i % 4) + i / 4
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn prep_q6k_t(a: *const u8, x: *const u8, nsb: usize, dst: *mut u8) {
    let mut idx = [0i32; 16];
    for (i, v) in idx.iter_mut().enumerate() {
        *v = q6_lane_sub_block(i) as i32;
    }
    let perm = _mm512_loadu_si512(idx.as_ptr() as *const _);
    for s in 0..nsb {
        let ab = a.add(s * Q8_K_BYTES);
        let d = dst.add(s * PQ6);
        // Vector j lane 4s'+dw = dword dw of sub-block 4j+s'; the same in-lane 4x4 transpose as the weights.
        let v: [__m512i; 4] = std::array::from_fn(|j| ld(ab.add(Q8K_QS + 64 * j)));
        let t0 = _mm512_unpacklo_epi32(v[0], v[1]);
        let t1 = _mm512_unpackhi_epi32(v[0], v[1]);
        let t2 = _mm512_unpacklo_epi32(v[2], v[3]);
        let t3 = _mm512_unpackhi_epi32(v[2], v[3]);
        _mm512_storeu_si512(d as *mut _, _mm512_unpacklo_epi64(t0, t2));
        _mm512_storeu_si512(d.add(64) as *mut _, _mm512_unpackhi_epi64(t0, t2));
        _mm512_storeu_si512(d.add(128) as *mut _, _mm512_unpacklo_epi64(t1, t3));
        _mm512_storeu_si512(d.add(192) as *mut _, _mm512_unpackhi_epi64(t1, t3));
        let init = _mm512_permutexvar_epi32(perm, ld(x.add(s * Q8_K_EXTRA + 16)));
        _mm512_storeu_si512(d.add(PQ6_INIT) as *mut _, init);
        (d.add(PQ6_D) as *mut f32).write_unaligned(rd_f32p(ab));
        // Also the next super-block's d (0 past the end), so that one 64-bit load serves a pair.
        let next = if s + 1 < nsb { rd_f32p(a.add((s + 1) * Q8_K_BYTES)) } else { 0.0 };
        (d.add(PQ6_D + 4) as *mut f32).write_unaligned(next);
    }
}

/// Q6_K super-block `b` unpacked for [`row_q6k_t`]: the 4 value vectors (lane i of every vector belongs to
/// sub-block `q6_lane_sub_block(i)`), the scales in the same lane order (i32), and `d`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q6t_unpack(b: *const u8) -> ([__m512i; 4], __m512i, f32) {
    let m0f = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let sl42 = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
    let sr02 = _mm512_inserti64x4::<1>(_mm512_set1_epi16(0), _mm256_set1_epi16(2));
    // Scale bytes in lane order: lane i <- sub-block 4(i%4) + i/4.
    let sc_order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let ql0 = ld(b);
    let ql1 = ld(b.add(64));
    let qha = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(128) as *const __m256i));
    let qhb = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(160) as *const __m256i));
    let v0 = _mm512_ternarylogic_epi32::<0xEC>(ql0, _mm512_and_si512(_mm512_sllv_epi16(qha, sl42), m30), m0f);
    let v1 = _mm512_ternarylogic_epi32::<0xEC>(
        _mm512_srli_epi16::<4>(ql0),
        _mm512_and_si512(_mm512_srlv_epi16(qha, sr02), m30),
        m0f,
    );
    let v2 = _mm512_ternarylogic_epi32::<0xEC>(ql1, _mm512_and_si512(_mm512_sllv_epi16(qhb, sl42), m30), m0f);
    let v3 = _mm512_ternarylogic_epi32::<0xEC>(
        _mm512_srli_epi16::<4>(ql1),
        _mm512_and_si512(_mm512_srlv_epi16(qhb, sr02), m30),
        m0f,
    );
    let t0 = _mm512_unpacklo_epi32(v0, v1);
    let t1 = _mm512_unpackhi_epi32(v0, v1);
    let t2 = _mm512_unpacklo_epi32(v2, v3);
    let t3 = _mm512_unpackhi_epi32(v2, v3);
    let tv = [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ];
    let sc = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(_mm_loadu_si128(b.add(192) as *const __m128i), sc_order));
    (tv, sc, f16x1(b.add(208)))
}

/// The integer dot of one unpacked Q6_K super-block with a prepared activation block, before the lane sum.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q6t_dot(tv: &[__m512i; 4], sc: __m512i, a: *const u8) -> __m512i {
    let mut acc = ld(a.add(PQ6_INIT));
    for (d, v) in tv.iter().enumerate() {
        acc = _mm512_dpbusd_epi32(acc, *v, ld(a.add(64 * d)));
    }
    _mm512_mullo_epi32(acc, sc)
}

/// One Q6_K row against R activation rows prepared by [`prep_q6k_t`]: the 4 unpacked value vectors (lane i =
/// dword i%4 of sub-block 4q + i/4 in vector q) are transposed within 128-bit lanes, so that lane i of every vector
/// belongs to sub-block `q6_lane_sub_block(i)` and one `vpmulld` applies all 16 scales.
///
/// Canonical order (`NOTES.md`, "Batch invariance"): super-block s's exact integer sum meets `d·da` in one fused
/// step on running sum `s % 4`. Super-blocks go two at a time (2q to sums 2q%4 and 2q%4+1, lanes 0 and 1 of
/// `sums[q % 2]`), so that one lane reduction serves both.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q6k_t<const R: usize>(w: *const u8, nsb: usize, pa: &[*const u8; R]) -> [f32; R] {
    let mut sums = [[_mm_setzero_ps(); 2]; R];
    // Full quads of rows: lane 2j+i of `qsums[q][h]` is row 4q+j's running sum 2h+i.
    let mut qsums = [[_mm256_setzero_ps(); 2]; 2];
    let mut s = 0;
    while s + 2 <= nsb {
        let (tv0, sc0, dw0) = q6t_unpack(w.add(s * Q6_K_BYTES));
        let (tv1, sc1, dw1) = q6t_unpack(w.add((s + 1) * Q6_K_BYTES));
        let dwv = _mm_unpacklo_ps(_mm_set_ss(dw0), _mm_set_ss(dw1));
        let h = (s / 2) % 2;
        for q in 0..R / 4 {
            let a0: [*const u8; 4] = std::array::from_fn(|j| pa[4 * q + j].add(s * PQ6));
            let p: [[__m512i; 2]; 4] =
                std::array::from_fn(|j| [q6t_dot(&tv0, sc0, a0[j]), q6t_dot(&tv1, sc1, a0[j].add(PQ6))]);
            // Exact lane sums of the eight vectors: [row j: Σ p[j][0], Σ p[j][1]] for j = 0..4.
            let t: [__m512i; 4] = std::array::from_fn(|j| {
                _mm512_add_epi32(_mm512_unpacklo_epi32(p[j][0], p[j][1]), _mm512_unpackhi_epi32(p[j][0], p[j][1]))
            });
            let u01 = _mm512_add_epi32(_mm512_unpacklo_epi64(t[0], t[1]), _mm512_unpackhi_epi64(t[0], t[1]));
            let u23 = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2], t[3]), _mm512_unpackhi_epi64(t[2], t[3]));
            let v = _mm512_add_epi32(
                _mm512_shuffle_i32x4::<0b10_00_10_00>(u01, u23),
                _mm512_shuffle_i32x4::<0b11_01_11_01>(u01, u23),
            );
            let x = _mm512_add_epi32(
                _mm512_shuffle_i32x4::<0b00_00_10_00>(v, v),
                _mm512_shuffle_i32x4::<0b00_00_11_01>(v, v),
            );
            let fi = _mm256_cvtepi32_ps(_mm512_castsi512_si256(x));
            let da = |j: usize| _mm_castpd_ps(_mm_load_sd(a0[j].add(PQ6_D) as *const f64));
            let dav = _mm256_set_m128(_mm_movelh_ps(da(2), da(3)), _mm_movelh_ps(da(0), da(1)));
            let dwq = _mm256_set_m128(_mm_movelh_ps(dwv, dwv), _mm_movelh_ps(dwv, dwv));
            qsums[q][h] = _mm256_fmadd_ps(fi, _mm256_mul_ps(dwq, dav), qsums[q][h]);
        }
        for r in R / 4 * 4..R {
            let a0 = pa[r].add(s * PQ6);
            let a1 = a0.add(PQ6);
            let p0 = q6t_dot(&tv0, sc0, a0);
            let p1 = q6t_dot(&tv1, sc1, a1);
            // Lane 0: Σ p0, lane 1: Σ p1 (exact).
            let s1 = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
            let s2 = _mm512_add_epi32(s1, _mm512_shuffle_epi32::<0b01_00_11_10>(s1));
            let s3 = _mm512_add_epi32(s2, _mm512_shuffle_i32x4::<0b01_00_11_10>(s2, s2));
            let s4 = _mm512_add_epi32(s3, _mm512_shuffle_i32x4::<0b10_11_00_01>(s3, s3));
            let fi = _mm_cvtepi32_ps(_mm512_castsi512_si128(s4));
            let dav =
                _mm_unpacklo_ps(_mm_load_ss(a0.add(PQ6_D) as *const f32), _mm_load_ss(a1.add(PQ6_D) as *const f32));
            sums[r][h] = _mm_fmadd_ps(fi, _mm_mul_ps(dwv, dav), sums[r][h]);
        }
        s += 2;
    }
    for q in 0..R / 4 {
        for h in 0..2 {
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), qsums[q][h]);
            for j in 0..4 {
                sums[4 * q + j][h] = _mm_setr_ps(l[2 * j], l[2 * j + 1], 0.0, 0.0);
            }
        }
    }
    let mut res = [0f32; R];
    for r in 0..R {
        let mut sl = [0f32; SLOTS];
        sl[0] = _mm_cvtss_f32(sums[r][0]);
        sl[1] = _mm_cvtss_f32(_mm_movehdup_ps(sums[r][0]));
        sl[2] = _mm_cvtss_f32(sums[r][1]);
        sl[3] = _mm_cvtss_f32(_mm_movehdup_ps(sums[r][1]));
        if s < nsb {
            let (tv, sc, dw) = q6t_unpack(w.add(s * Q6_K_BYTES));
            let a = pa[r].add(s * PQ6);
            let isum = _mm512_reduce_add_epi32(q6t_dot(&tv, sc, a));
            sl[s % SLOTS] = canon_step(sl[s % SLOTS], isum as f32, dw * rd_f32p(a.add(PQ6_D)));
        }
        res[r] = combine_slots(&sl);
    }
    res
}

/// Both rows' unpacked super-block (`ta`, `tb`) against a quad of prepared activation blocks: lane `2j+h` of the
/// result is the exact integer sum of row `h` of the pair with activation row `j`, as f32 (the lane reduction of
/// [`row_q6k_t`], with the pair's rows where it has two super-blocks). (Out of line it was slower: the unpacked
/// values went through memory.)
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_pair_quad_fi(ta: &([__m512i; 4], __m512i), tb: &([__m512i; 4], __m512i), a: &[*const u8; 4]) -> __m256 {
    let z = _mm512_setzero_si512();
    let (mut pa, mut pb) = ([z; 4], [z; 4]);
    for j in 0..4 {
        pa[j] = q6t_dot(&ta.0, ta.1, a[j]);
        pb[j] = q6t_dot(&tb.0, tb.1, a[j]);
    }
    let mut t = [z; 4];
    for j in 0..4 {
        t[j] = _mm512_add_epi32(_mm512_unpacklo_epi32(pa[j], pb[j]), _mm512_unpackhi_epi32(pa[j], pb[j]));
    }
    let u01 = _mm512_add_epi32(_mm512_unpacklo_epi64(t[0], t[1]), _mm512_unpackhi_epi64(t[0], t[1]));
    let u23 = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2], t[3]), _mm512_unpackhi_epi64(t[2], t[3]));
    let v = _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0b10_00_10_00>(u01, u23),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(u01, u23),
    );
    let x = _mm512_add_epi32(_mm512_shuffle_i32x4::<0b00_00_10_00>(v, v), _mm512_shuffle_i32x4::<0b00_00_11_01>(v, v));
    _mm256_cvtepi32_ps(_mm512_castsi512_si256(x))
}

/// `[d, d, 0, 0]` for the prepared activation block at `a`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_da2(a: *const u8) -> __m128 {
    _mm_moveldup_ps(_mm_load_ss(a.add(PQ6_D) as *const f32))
}

/// Both rows of one pair in the Q6_K pairs layout (`super::q6k_pairs`; `w`: the pair's first byte) against R
/// activation rows prepared by [`prep_q6k_t`]. The same integer sums and f32 steps, in the same order, as
/// [`row_q6k_t`], so the results are bitwise those of the GGUF layout.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q6k_pair<const R: usize>(w: *const u8, nsb: usize, pa: &[*const u8; R]) -> [[f32; R]; 2] {
    // Running sums per slot: quads in lanes 2j+h (activation row 4q+j, row h of the pair), leftover rows in lanes h.
    let mut qs = [[_mm256_setzero_ps(); SLOTS]; 2];
    let mut rs = [[_mm_setzero_ps(); SLOTS]; R];
    for s in 0..nsb {
        let blk = w.add(2 * s * Q6_K_BYTES);
        if R > 1 && nsb >= 16 && prefetch_ahead_on() {
            // As in `q4k_pair`: four block pairs (1.6 KB) ahead into L2. (For one row it costs; see NOTES.md.)
            let ahead = blk.wrapping_add(4 * 2 * Q6_K_BYTES) as *const i8;
            for l in 0..(2 * Q6_K_BYTES).div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * l));
            }
        }
        let (tva, sca, dwa) = q6t_unpack(blk);
        let (tvb, scb, dwb) = q6t_unpack(blk.add(Q6_K_BYTES));
        let (ta, tb) = ((tva, sca), (tvb, scb));
        let dwv = _mm_unpacklo_ps(_mm_set_ss(dwa), _mm_set_ss(dwb));
        let slot = s % SLOTS;
        for q in 0..R / 4 {
            let mut a = [pa[0]; 4];
            for j in 0..4 {
                a[j] = pa[4 * q + j].add(s * PQ6);
            }
            let fi = q6_pair_quad_fi(&ta, &tb, &a);
            let dav =
                _mm256_set_m128(_mm_movelh_ps(q6_da2(a[2]), q6_da2(a[3])), _mm_movelh_ps(q6_da2(a[0]), q6_da2(a[1])));
            let dwq = _mm256_set_m128(_mm_movelh_ps(dwv, dwv), _mm_movelh_ps(dwv, dwv));
            qs[q][slot] = _mm256_fmadd_ps(fi, _mm256_mul_ps(dwq, dav), qs[q][slot]);
        }
        for r in R / 4 * 4..R {
            let a = pa[r].add(s * PQ6);
            let p0 = q6t_dot(&ta.0, ta.1, a);
            let p1 = q6t_dot(&tb.0, tb.1, a);
            // Lane 0: Σ p0, lane 1: Σ p1 (exact).
            let s1 = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
            let s2 = _mm512_add_epi32(s1, _mm512_shuffle_epi32::<0b01_00_11_10>(s1));
            let s3 = _mm512_add_epi32(s2, _mm512_shuffle_i32x4::<0b01_00_11_10>(s2, s2));
            let s4 = _mm512_add_epi32(s3, _mm512_shuffle_i32x4::<0b10_11_00_01>(s3, s3));
            let fi = _mm_cvtepi32_ps(_mm512_castsi512_si128(s4));
            rs[r][slot] = _mm_fmadd_ps(fi, _mm_mul_ps(dwv, q6_da2(a)), rs[r][slot]);
        }
    }
    let mut res = [[0f32; R]; 2];
    let mut sl = [[0f32; SLOTS]; 2];
    for q in 0..R / 4 {
        let mut l = [[0f32; 8]; SLOTS];
        for (slot, v) in l.iter_mut().enumerate() {
            _mm256_storeu_ps(v.as_mut_ptr(), qs[q][slot]);
        }
        for j in 0..4 {
            for h in 0..2 {
                for slot in 0..SLOTS {
                    sl[h][slot] = l[slot][2 * j + h];
                }
                res[h][4 * q + j] = combine_slots(&sl[h]);
            }
        }
    }
    for r in R / 4 * 4..R {
        let mut l = [[0f32; 4]; SLOTS];
        for (slot, v) in l.iter_mut().enumerate() {
            _mm_storeu_ps(v.as_mut_ptr(), rs[r][slot]);
        }
        for h in 0..2 {
            for slot in 0..SLOTS {
                sl[h][slot] = l[slot][h];
            }
            res[h][r] = combine_slots(&sl[h]);
        }
    }
    res
}

// ---------------------------------------------------------------------------------------------------------------
// Q4_K in groups of 4 super-blocks: lane 4g+c of a vector holds chunk c (32 packed bytes = sub-blocks 2c, 2c+1)
// of super-block g, so every lane meets a single scale per nibble half and the integer sums need one `vpmulld`
// per group and activation row.

/// Prepared Q8_K group (4 super-blocks) for [`row_q4k_g4`]: `lo[d]` / `hi[d]` (lane 4g+c = quant dword d of
/// sub-block 2c / 2c+1 of super-block g), the 32-sums of sub-blocks (2c, 2c+1) as an i16 pair, and `d` per lane.
const PG4: usize = 1152;
const PG4_BS: usize = 1024;
const PG4_D: usize = 1088;

static ZERO_BLOCK: [u8; 512] = [0; 512];

/// One prepared group: slot `g` holds the activation's super-block `slots[g]` (zeros for `None`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn prep_q4k_group(a: *const u8, x: *const u8, slots: [Option<usize>; 4], d: *mut u8) {
    let zero = ZERO_BLOCK.as_ptr();
    let mut rows = [zero; 16];
    let mut bs = _mm512_setzero_si512();
    let mut da = [0f32; 16];
    for (g, slot) in slots.iter().enumerate() {
        let Some(s) = *slot else { continue };
        let ab = a.add(s * Q8_K_BYTES);
        for c in 0..4 {
            rows[4 * g + c] = ab.add(Q8K_QS + 64 * c);
            da[4 * g + c] = rd_f32p(ab);
        }
        let b = _mm512_castsi128_si512(_mm_loadu_si128(x.add(s * Q8_K_EXTRA) as *const __m128i));
        bs = _mm512_mask_shuffle_i32x4::<0>(bs, 0xF << (4 * g), b, b);
    }
    let z = super::avx512::transpose16(&rows, 0);
    for (t, v) in z.iter().enumerate() {
        _mm512_storeu_si512(d.add(64 * t) as *mut _, *v);
    }
    _mm512_storeu_si512(d.add(PG4_BS) as *mut _, bs);
    std::ptr::copy_nonoverlapping(da.as_ptr() as *const u8, d.add(PG4_D), 64);
}

/// `total` virtual super-blocks are prepared, super-block `i` being the activation's `i % nsb` (`total = 2·nsb` when
/// two weight rows are streamed as one run).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn prep_q4k_g4(a: *const u8, x: *const u8, nsb: usize, total: usize, dst: *mut u8) {
    for grp in 0..total.div_ceil(4) {
        let mut slots = [None; 4];
        for (g, slot) in slots.iter_mut().enumerate() {
            *slot = (4 * grp + g < total).then_some((4 * grp + g) % nsb);
        }
        prep_q4k_group(a, x, slots, dst.add(grp * PG4));
    }
}

/// Prepared groups for the pairs layout (`super::q4k_pairs`): the full groups, then one tail group whose slots
/// match the tail groups of both rows (`[t, t+1, t, t+1]` for two leftover super-blocks, `[t, t+1, t+2, -]` for
/// three).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn prep_q4k_pairs(a: *const u8, x: *const u8, nsb: usize, dst: *mut u8) {
    let (full, rem) = (nsb / 4, nsb % 4);
    for grp in 0..full {
        let t = 4 * grp;
        prep_q4k_group(a, x, [Some(t), Some(t + 1), Some(t + 2), Some(t + 3)], dst.add(grp * PG4));
    }
    let t = 4 * full;
    let slots = match rem {
        0 => return,
        1 => [Some(t), None, Some(t), None],
        2 => [Some(t), Some(t + 1), Some(t), Some(t + 1)],
        _ => [Some(t), Some(t + 1), Some(t + 2), None],
    };
    prep_q4k_group(a, x, slots, dst.add(full * PG4));
}

/// The exact integer sums of one group (before the lane reduction) against prepared activation group `a`: lane
/// 4g+c = chunk c of super-block g, scales applied.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_g4_isum(
    lo: &[__m512i; 8],
    hi: &[__m512i; 8],
    sc_even: __m512i,
    sc_odd: __m512i,
    a: *const u8,
) -> __m512i {
    // SAFETY: `a` points at a prepared group (PG4 bytes).
    unsafe {
        let mut al = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[0], ld(a));
        let mut ah = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[0], ld(a.add(512)));
        for d in 1..8 {
            al = _mm512_dpbusd_epi32(al, lo[d], ld(a.add(64 * d)));
            ah = _mm512_dpbusd_epi32(ah, hi[d], ld(a.add(512 + 64 * d)));
        }
        _mm512_add_epi32(_mm512_mullo_epi32(al, sc_even), _mm512_mullo_epi32(ah, sc_odd))
    }
}

/// Lane 4g+j of the result: the sum of lanes 4g..4g+4 of `v[j]` (four 128-bit lane reductions at once, exact).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn quad_sum_epi32(v: &[__m512i; 4]) -> __m512i {
    {
        // [v0 c0+c2, v1 c0+c2, v0 c1+c3, v1 c1+c3] per 128-bit lane, and the same for v2, v3.
        let s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
        let s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
        _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23))
    }
}

/// A Q4_K group's decoded heads: per lane `4g+c`, the scales of sub-blocks `2c` / `2c+1` and the i16 mins pair of
/// super-block `g`, and its `d` / `dmin` as f32.
struct K4Head {
    sc_even: __m512i,
    sc_odd: __m512i,
    mins: __m512i,
    dv: __m512,
    dmv: __m512,
}

/// Decodes four Q4_K heads (128-bit lane `g` = bytes 0..16 of super-block `g`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_head(h: __m512i) -> K4Head {
    let sh_s = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
    let z = -128i8;
    let sh_m = _mm512_broadcast_i32x4(_mm_setr_epi8(8, z, 9, z, 10, z, 11, z, 12, z, 13, z, 14, z, 15, z));
    let ff = _mm512_set1_epi32(0xff);
    let u0 = _mm512_bsrli_epi128::<4>(h);
    let u1 = _mm512_bsrli_epi128::<8>(h);
    let u2 = _mm512_bsrli_epi128::<12>(h);
    let c3f = _mm512_set1_epi8(0x3f);
    let c0f = _mm512_set1_epi8(0x0f);
    let c30 = _mm512_set1_epi8(0x30);
    let s_lo = _mm512_and_si512(u0, c3f);
    let s_hi = _mm512_ternarylogic_epi32::<0xEA>(_mm512_srli_epi32::<2>(u0), c30, _mm512_and_si512(u2, c0f));
    let m_lo = _mm512_and_si512(u1, c3f);
    let m_hi = _mm512_ternarylogic_epi32::<0xEA>(
        _mm512_srli_epi32::<2>(u1),
        c30,
        _mm512_and_si512(_mm512_srli_epi32::<4>(u2), c0f),
    );
    // Per lane: bytes [sc0..sc7, m0..m7]; then per chunk c: [sc2c, sc2c+1, m2c, m2c+1].
    let sm = _mm512_unpacklo_epi64(_mm512_unpacklo_epi32(s_lo, s_hi), _mm512_unpacklo_epi32(m_lo, m_hi));
    let sc = _mm512_shuffle_epi8(sm, sh_s);
    let sc_even = _mm512_and_si512(sc, ff);
    let sc_odd = _mm512_and_si512(_mm512_srli_epi32::<8>(sc), ff);
    let mins = _mm512_shuffle_epi8(sm, sh_m);
    let dd = _mm512_shuffle_epi32::<0>(h);
    let dv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
    let dmv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dd)));
    K4Head { sc_even, sc_odd, mins, dv, dmv }
}

/// The canonical f32 step of one group for a quad of activation rows (`isv[j]`: row `j`'s scaled integer sums,
/// lanes `4g+c`): lane `4g+j` of the result is super-block `g`'s `fmsub(isum, d·da, imin·(dmin·da))` for row `j`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_quad_step(isv: &[__m512i; 4], hd: &K4Head, a: &[*const u8; 4]) -> __m512 {
    let mut imv = [_mm512_setzero_si512(); 4];
    let mut dav = [_mm512_setzero_ps(); 4];
    for j in 0..4 {
        imv[j] = _mm512_madd_epi16(hd.mins, ld(a[j].add(PG4_BS)));
        dav[j] = _mm512_loadu_ps(a[j].add(PG4_D) as *const f32);
    }
    let fi = _mm512_cvtepi32_ps(quad_sum_epi32(isv));
    let fm = _mm512_cvtepi32_ps(quad_sum_epi32(&imv));
    let da = _mm512_mask_mov_ps(
        _mm512_mask_mov_ps(_mm512_mask_mov_ps(dav[0], 0x2222, dav[1]), 0x4444, dav[2]),
        0x8888,
        dav[3],
    );
    _mm512_fmsub_ps(fi, _mm512_mul_ps(hd.dv, da), _mm512_mul_ps(fm, _mm512_mul_ps(hd.dmv, da)))
}

/// [`q4k_quad_step`] for one activation row: every lane of 128-bit lane `g` holds super-block `g`'s step.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_row_step(isum: __m512i, hd: &K4Head, a: *const u8) -> __m512 {
    let imin = _mm512_madd_epi16(hd.mins, ld(a.add(PG4_BS)));
    let da = _mm512_loadu_ps(a.add(PG4_D) as *const f32);
    // Canonical order (`NOTES.md`, "Batch invariance"): per super-block, the exact integer sums (the 4 chunk lanes
    // added) give `fmsub(isum, d·da, imin·dmin·da)`, added to running sum `i % 4`, exactly as the 16-row panels do.
    // Every lane of chunk g computes super-block g's step on slot g's sum.
    let fi = _mm512_cvtepi32_ps(hsum4_epi32(isum));
    let fm = _mm512_cvtepi32_ps(hsum4_epi32(imin));
    _mm512_fmsub_ps(fi, _mm512_mul_ps(hd.dv, da), _mm512_mul_ps(fm, _mm512_mul_ps(hd.dmv, da)))
}

/// One Q4_K row (or, with `PAIR`, two consecutive rows: one contiguous run of `2·nsb` super-blocks, `nsb % 4 ==
/// 2`) against R activation rows prepared by [`prep_q4k_g4`] (for `2·nsb` virtual super-blocks with `PAIR`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_g4<const R: usize, const PAIR: bool>(w: *const u8, nsb: usize, pa: &[*const u8; R]) -> [[f32; R]; 2] {
    let total = if PAIR { 2 * nsb } else { nsb };
    let m4 = _mm512_set1_epi8(0x0f);
    // Stage-1 / stage-2 permutations of the 16x8 dword transpose (see the comments below).
    let mut i1 = [[0i32; 16]; 2];
    let mut i2 = [[0i32; 16]; 2];
    for t in 0..2 {
        for cc in 0..4 {
            for rr in 0..4 {
                i1[t][4 * cc + rr] = ((rr / 2) * 16 + 8 * (rr % 2) + 4 * t + cc) as i32;
            }
        }
    }
    for u in 0..2 {
        for e in 0..2 {
            for rr in 0..8 {
                i2[u][8 * e + rr] = ((rr / 4) * 16 + 4 * (2 * u + e) + rr % 4) as i32;
            }
        }
    }
    let idx1 = [ld(i1[0].as_ptr() as *const u8), ld(i1[1].as_ptr() as *const u8)];
    let idx2 = [ld(i2[0].as_ptr() as *const u8), ld(i2[1].as_ptr() as *const u8)];
    let mut facc = [_mm512_setzero_ps(); R];
    let mut facc2 = [_mm512_setzero_ps(); R];
    let mut qacc = [_mm512_setzero_ps(); 2];
    let mut qacc2 = [_mm512_setzero_ps(); 2];
    let zero = ZERO_BLOCK.as_ptr();
    for grp in 0..total.div_ceil(4) {
        // Long rows: prefetch four groups ahead (past the row end too: the next row usually follows; a prefetch
        // never faults). Measured from DRAM: k = 8960 GEMV 16 -> 18-20 GB/s per thread (before the canonical
        // order: ~23); it slows the paired k = 1536 rows (23 -> 19 GB/s), so those go without.
        if !PAIR {
            let ahead = (w as *const i8).wrapping_add((4 * grp + 16) * Q4_K_BYTES);
            for l in 0..(4 * Q4_K_BYTES).div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l));
            }
        }
        let mut blk = [zero; 4];
        for (g, b) in blk.iter_mut().enumerate() {
            if 4 * grp + g < total {
                *b = w.add((4 * grp + g) * Q4_K_BYTES);
            }
        }
        // Headers: lane g = [d|dmin, scales 0..12] of super-block g.
        let mut h = _mm512_castsi128_si512(_mm_loadu_si128(blk[0] as *const __m128i));
        h = _mm512_inserti32x4::<1>(h, _mm_loadu_si128(blk[1] as *const __m128i));
        h = _mm512_inserti32x4::<2>(h, _mm_loadu_si128(blk[2] as *const __m128i));
        h = _mm512_inserti32x4::<3>(h, _mm_loadu_si128(blk[3] as *const __m128i));
        let hd = q4k_head(h);
        // Quants: y[2g+h] = bytes 64h..64h+64 of super-block g's qs (chunks 2h, 2h+1; zeros past the row end),
        // transposed so that r[d] lane 4g+c = dword d of chunk c of super-block g.
        let mut y = [_mm512_setzero_si512(); 8];
        for g in 0..4 {
            y[2 * g] = ld(blk[g].add(16));
            y[2 * g + 1] = ld(blk[g].add(80));
        }
        // Stage 1: zq[p][t] lane 4c'+r' = row 4p+r', column 4t+c'.
        let mut zq = [[_mm512_setzero_si512(); 2]; 4];
        for p in 0..4 {
            for t in 0..2 {
                zq[p][t] = _mm512_permutex2var_epi32(y[2 * p], idx1[t], y[2 * p + 1]);
            }
        }
        // Stage 2: wq[q][j] lane 8e+r'' = row 8q+r'', column 2j+e.
        let mut wq = [[_mm512_setzero_si512(); 4]; 2];
        for q in 0..2 {
            for t in 0..2 {
                for u in 0..2 {
                    wq[q][2 * t + u] = _mm512_permutex2var_epi32(zq[2 * q][t], idx2[u], zq[2 * q + 1][t]);
                }
            }
        }
        // Stage 3: r[2j+e] = rows 0..16 of column 2j+e.
        let mut lo = [_mm512_setzero_si512(); 8];
        let mut hi = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            let r0 = _mm512_shuffle_i64x2::<0b01_00_01_00>(wq[0][j], wq[1][j]);
            let r1 = _mm512_shuffle_i64x2::<0b11_10_11_10>(wq[0][j], wq[1][j]);
            lo[2 * j] = _mm512_and_si512(r0, m4);
            hi[2 * j] = _mm512_and_si512(_mm512_srli_epi16::<4>(r0), m4);
            lo[2 * j + 1] = _mm512_and_si512(r1, m4);
            hi[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(r1), m4);
        }
        // Chunks (super-blocks) of this group that belong to the first row (m1) and to the second (m2).
        let (mut m1, mut m2) = (0u16, 0u16);
        for g in 0..4 {
            let i = 4 * grp + g;
            if i < total.min(if PAIR { nsb } else { total }) {
                m1 |= 0xF << (4 * g);
            } else if PAIR && i < total {
                m2 |= 0xF << (4 * g);
            }
        }
        // Full quads of activation rows share the lane reductions and the f32 step: lane 4g+j of a quad's vectors
        // holds super-block g of row 4q+j (the same operations on the same values as the per-row path below, so the
        // canonical order and the results are unchanged).
        for q in 0..R / 4 {
            let a: [*const u8; 4] = std::array::from_fn(|j| pa[4 * q + j].add(grp * PG4));
            // (A loop, not `array::from_fn`: a closure has no target features, so the kernel would not inline.)
            let mut isv = [_mm512_setzero_si512(); 4];
            for j in 0..4 {
                isv[j] = q4k_g4_isum(&lo, &hi, hd.sc_even, hd.sc_odd, a[j]);
            }
            let v = q4k_quad_step(&isv, &hd, &a);
            if m1 == 0xFFFF {
                qacc[q] = _mm512_add_ps(qacc[q], v);
            } else if m1 != 0 {
                qacc[q] = _mm512_mask_add_ps(qacc[q], m1, qacc[q], v);
            }
            if PAIR && m2 != 0 {
                qacc2[q] = _mm512_mask_add_ps(qacc2[q], m2, qacc2[q], v);
            }
        }
        for r in R / 4 * 4..R {
            let a = pa[r].add(grp * PG4);
            let v = q4k_row_step(q4k_g4_isum(&lo, &hi, hd.sc_even, hd.sc_odd, a), &hd, a);
            if m1 == 0xFFFF {
                facc[r] = _mm512_add_ps(facc[r], v);
            } else if m1 != 0 {
                facc[r] = _mm512_mask_add_ps(facc[r], m1, facc[r], v);
            }
            if PAIR && m2 != 0 {
                facc2[r] = _mm512_mask_add_ps(facc2[r], m2, facc2[r], v);
            }
        }
    }
    let mut res = [[0f32; R]; 2];
    let mut l = [0f32; 16];
    for q in 0..R / 4 {
        _mm512_storeu_ps(l.as_mut_ptr(), qacc[q]);
        for j in 0..4 {
            res[0][4 * q + j] = (l[j] + l[4 + j]) + (l[8 + j] + l[12 + j]);
        }
        if PAIR {
            _mm512_storeu_ps(l.as_mut_ptr(), qacc2[q]);
            for j in 0..4 {
                res[1][4 * q + j] = (l[8 + j] + l[12 + j]) + (l[j] + l[4 + j]);
            }
        }
    }
    for r in R / 4 * 4..R {
        // Slot j of the first row is in chunk j.
        _mm512_storeu_ps(l.as_mut_ptr(), facc[r]);
        res[0][r] = (l[0] + l[4]) + (l[8] + l[12]);
        if PAIR {
            // The second row starts at virtual super-block nsb (nsb % 4 == 2): slot j is in chunk (j + 2) % 4.
            _mm512_storeu_ps(l.as_mut_ptr(), facc2[r]);
            res[1][r] = (l[8] + l[12]) + (l[0] + l[4]);
        }
    }
    res
}

// ---------------------------------------------------------------------------------------------------------------
// Q4_K in the pairs layout (`super::q4k_pairs`): the groups come regrouped from load, and the two rows of a pair
// share every activation load.

/// Integer sums of one packed unit (both nibble halves, scales applied) for rows `A` and `B` (`wa` / `wb`: their
/// quant vector 0; the vectors of a unit alternate, 128 bytes apart) against `N` activation rows `a` (prepared
/// groups): `(A's, B's)` per activation row, lanes `4g+c`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn pair_isums<const N: usize>(
    wa: *const u8,
    wb: *const u8,
    ha: &K4Head,
    hb: &K4Head,
    a: &[*const u8; N],
) -> ([__m512i; N], [__m512i; N]) {
    let m4 = _mm512_set1_epi8(0x0f);
    let z = _mm512_setzero_si512();
    let (mut la, mut ua, mut lb, mut ub) = ([z; N], [z; N], [z; N], [z; N]);
    for d in 0..8 {
        let qa = ld(wa.add(128 * d));
        let qb = ld(wb.add(128 * d));
        let (qa_lo, qa_hi) = (_mm512_and_si512(qa, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(qa), m4));
        let (qb_lo, qb_hi) = (_mm512_and_si512(qb, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(qb), m4));
        for j in 0..N {
            let al = ld(a[j].add(64 * d));
            let ah = ld(a[j].add(512 + 64 * d));
            la[j] = _mm512_dpbusd_epi32(la[j], qa_lo, al);
            ua[j] = _mm512_dpbusd_epi32(ua[j], qa_hi, ah);
            lb[j] = _mm512_dpbusd_epi32(lb[j], qb_lo, al);
            ub[j] = _mm512_dpbusd_epi32(ub[j], qb_hi, ah);
        }
    }
    let (mut ia, mut ib) = ([z; N], [z; N]);
    for j in 0..N {
        ia[j] = _mm512_add_epi32(_mm512_mullo_epi32(la[j], ha.sc_even), _mm512_mullo_epi32(ua[j], ha.sc_odd));
        ib[j] = _mm512_add_epi32(_mm512_mullo_epi32(lb[j], hb.sc_even), _mm512_mullo_epi32(ub[j], hb.sc_odd));
    }
    (ia, ib)
}

/// Integer sums of one packed group (a mixed tail: `w` its quant vector 0, vectors 64 bytes apart) against `N`
/// activation rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn group_isums<const N: usize>(w: *const u8, h: &K4Head, a: &[*const u8; N]) -> [__m512i; N] {
    let m4 = _mm512_set1_epi8(0x0f);
    let z = _mm512_setzero_si512();
    let (mut lo, mut hi) = ([z; N], [z; N]);
    for d in 0..8 {
        let q = ld(w.add(64 * d));
        let (q_lo, q_hi) = (_mm512_and_si512(q, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
        for j in 0..N {
            lo[j] = _mm512_dpbusd_epi32(lo[j], q_lo, ld(a[j].add(64 * d)));
            hi[j] = _mm512_dpbusd_epi32(hi[j], q_hi, ld(a[j].add(512 + 64 * d)));
        }
    }
    let mut is = [z; N];
    for j in 0..N {
        is[j] = _mm512_add_epi32(_mm512_mullo_epi32(lo[j], h.sc_even), _mm512_mullo_epi32(hi[j], h.sc_odd));
    }
    is
}

/// Both rows' steps of one group pair for a quad of activation rows, added to their sums (not inlined: inside the
/// kernel the compiler keeps the unpacked weights of both quads alive and spills).
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn pair_quad(
    wa: *const u8,
    wb: *const u8,
    ha: &K4Head,
    hb: &K4Head,
    a: &[*const u8; 4],
    mask: u16,
    acc_a: &mut __m512,
    acc_b: &mut __m512,
) {
    let (ia, ib) = pair_isums::<4>(wa, wb, ha, hb, a);
    add_masked(acc_a, mask, q4k_quad_step(&ia, ha, a));
    add_masked(acc_b, mask, q4k_quad_step(&ib, hb, a));
}

/// [`pair_quad`] for the `N < 4` activation rows left over after the quads, one row's sums each.
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn pair_rest<const N: usize>(
    wa: *const u8,
    wb: *const u8,
    ha: &K4Head,
    hb: &K4Head,
    a: &[*const u8; N],
    mask: u16,
    acc_a: &mut [__m512],
    acc_b: &mut [__m512],
) {
    let (ia, ib) = pair_isums::<N>(wa, wb, ha, hb, a);
    for j in 0..N {
        add_masked(&mut acc_a[j], mask, q4k_row_step(ia[j], ha, a[j]));
        add_masked(&mut acc_b[j], mask, q4k_row_step(ib[j], hb, a[j]));
    }
}

/// `acc += v` on the lanes of `mask` (all of them without a branch when the mask is full).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn add_masked(acc: &mut __m512, mask: u16, v: __m512) {
    *acc = if mask == 0xFFFF { _mm512_add_ps(*acc, v) } else { _mm512_mask_add_ps(*acc, mask, *acc, v) };
}

/// Both rows of one pair in the pairs layout (`w`: the pair's first byte) against R activation rows prepared by
/// [`prep_q4k_pairs`]. The same canonical f32 steps as [`q4k_g4`], so the results are bitwise those of the GGUF
/// layout's kernels.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_pair<const R: usize>(w: *const u8, nsb: usize, pa: &[*const u8; R]) -> [[f32; R]; 2] {
    use super::q4k_pairs::GROUP_BYTES;
    let (full, rem) = (nsb / 4, nsb % 4);
    let zf = _mm512_setzero_ps();
    // [row of the pair][quad] sums (lane 4g+j: slot g, activation row 4q+j) and per-row sums of the leftover
    // activation rows (every lane of 128-bit lane g: slot g).
    let mut qacc = [[zf; 2]; 2];
    let mut facc = [[zf; R]; 2];
    // Full groups, and for rem == 3 each row's own tail group (slot 3 empty): A and B at the same super-blocks.
    for g in 0..full + (rem == 3) as usize {
        let mask: u16 = if g < full { 0xFFFF } else { 0x0FFF };
        // A unit: head A, head B, then quant vector d of A and of B, d = 0..8.
        let unit = w.add(2 * g * GROUP_BYTES);
        let (wa, wb) = (unit.add(128), unit.add(192));
        if R > 1 && nsb >= 16 && prefetch_ahead_on() {
            // Several activation rows make the unit compute-bound, and then the hardware prefetchers alone let
            // memory and compute take turns: fetch two units ahead into L2 (see NOTES.md, "Prefetch for m > 1").
            let ahead = unit.wrapping_add(2 * 2 * GROUP_BYTES) as *const i8;
            for l in 0..2 * GROUP_BYTES / 64 {
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * l));
            }
        } else if nsb >= 16 {
            // Long rows: fetch the next unit while this one computes. Measured from DRAM at k = 8960 (one thread,
            // shared machine): m = 8 25 -> 20.6 ns per block-row, m = 1 6.8 -> 7.4; further ahead was no better,
            // and at k = 1536 it costs.
            let ahead = unit.wrapping_add(2 * GROUP_BYTES) as *const i8;
            for l in 0..2 * GROUP_BYTES / 64 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l));
            }
        }
        let ha = q4k_head(ld(unit));
        let hb = q4k_head(ld(unit.add(64)));
        for q in 0..R / 4 {
            let mut a = [pa[0]; 4];
            for j in 0..4 {
                a[j] = pa[4 * q + j].add(g * PG4);
            }
            let [acc_a, acc_b] = &mut qacc;
            pair_quad(wa, wb, &ha, &hb, &a, mask, &mut acc_a[q], &mut acc_b[q]);
        }
        let r0 = R / 4 * 4;
        let [fa, fb] = &mut facc;
        let (fa, fb) = (&mut fa[r0..], &mut fb[r0..]);
        match R % 4 {
            1 => pair_rest::<1>(wa, wb, &ha, &hb, &[pa[r0].add(g * PG4)], mask, fa, fb),
            2 => pair_rest::<2>(wa, wb, &ha, &hb, &[pa[r0].add(g * PG4), pa[r0 + 1].add(g * PG4)], mask, fa, fb),
            3 => {
                let a = [pa[r0].add(g * PG4), pa[r0 + 1].add(g * PG4), pa[r0 + 2].add(g * PG4)];
                pair_rest::<3>(wa, wb, &ha, &hb, &a, mask, fa, fb)
            }
            _ => {}
        }
    }
    if rem == 1 || rem == 2 {
        // The mixed tail group: A's leftover super-blocks in slots 0..rem, B's in slots 2..2+rem, moved down to
        // B's slots 0..rem before they are added.
        let unit = w.add(2 * full * GROUP_BYTES);
        let (h, wm) = (q4k_head(ld(unit)), unit.add(64));
        let mask: u16 = if rem == 2 { 0x00FF } else { 0x000F };
        for q in 0..R / 4 {
            let mut a = [pa[0]; 4];
            for j in 0..4 {
                a[j] = pa[4 * q + j].add(full * PG4);
            }
            let v = q4k_quad_step(&group_isums::<4>(wm, &h, &a), &h, &a);
            add_masked(&mut qacc[0][q], mask, v);
            add_masked(&mut qacc[1][q], mask, _mm512_shuffle_f32x4::<0b11_10_11_10>(v, v));
        }
        for r in R / 4 * 4..R {
            let a = [pa[r].add(full * PG4)];
            let v = q4k_row_step(group_isums::<1>(wm, &h, &a)[0], &h, a[0]);
            add_masked(&mut facc[0][r], mask, v);
            add_masked(&mut facc[1][r], mask, _mm512_shuffle_f32x4::<0b11_10_11_10>(v, v));
        }
    }
    let mut res = [[0f32; R]; 2];
    let mut l = [0f32; 16];
    for (half, out) in res.iter_mut().enumerate() {
        for q in 0..R / 4 {
            _mm512_storeu_ps(l.as_mut_ptr(), qacc[half][q]);
            for j in 0..4 {
                out[4 * q + j] = (l[j] + l[4 + j]) + (l[8 + j] + l[12 + j]);
            }
        }
        for r in R / 4 * 4..R {
            _mm512_storeu_ps(l.as_mut_ptr(), facc[half][r]);
            out[r] = (l[0] + l[4]) + (l[8] + l[12]);
        }
    }
    res
}

/// A kernel for both rows of one pair of a pairs layout against R prepared activation rows.
trait PairKernel {
    unsafe fn pair<const R: usize>(w: *const u8, nsb: usize, pa: &[*const u8; R]) -> [[f32; R]; 2];
}

struct Q4KPair;
impl PairKernel for Q4KPair {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair<const R: usize>(w: *const u8, nsb: usize, pa: &[*const u8; R]) -> [[f32; R]; 2] {
        q4k_pair::<R>(w, nsb, pa)
    }
}

struct Q6KPair;
impl PairKernel for Q6KPair {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair<const R: usize>(w: *const u8, nsb: usize, pa: &[*const u8; R]) -> [[f32; R]; 2] {
        q6k_pair::<R>(w, nsb, pa)
    }
}

/// Pairs covering `rows` (`pb` bytes each) against the R prepared activation rows at `base` (`prep_rb` apart);
/// only rows inside `rows` are written.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn pairs_r<K: PairKernel, const R: usize>(
    w: *const u8,
    pb: usize,
    nsb: usize,
    rows: Range<usize>,
    base: *const u8,
    prep_rb: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut pa = [base; R];
    for (i, p) in pa.iter_mut().enumerate() {
        *p = base.add(i * prep_rb);
    }
    for p in rows.start / 2..rows.end.div_ceil(2) {
        let v = K::pair::<R>(w.add(p * pb), nsb, &pa);
        for (half, vals) in v.iter().enumerate() {
            let r = 2 * p + half;
            if rows.contains(&r) {
                for (i, &x) in vals.iter().enumerate() {
                    *out.add(i * ldo + r) = x;
                }
            }
        }
    }
}

/// [`pairs_r`] for the `m <= 8` rows at `prep`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn run_pairs<K: PairKernel>(
    w: *const u8,
    pb: usize,
    nsb: usize,
    rows: Range<usize>,
    prep: *const u8,
    prep_rb: usize,
    m: usize,
    out: *mut f32,
    ldo: usize,
) {
    match m {
        1 => pairs_r::<K, 1>(w, pb, nsb, rows, prep, prep_rb, out, ldo),
        2 => pairs_r::<K, 2>(w, pb, nsb, rows, prep, prep_rb, out, ldo),
        3 => pairs_r::<K, 3>(w, pb, nsb, rows, prep, prep_rb, out, ldo),
        4 => pairs_r::<K, 4>(w, pb, nsb, rows, prep, prep_rb, out, ldo),
        5 => pairs_r::<K, 5>(w, pb, nsb, rows, prep, prep_rb, out, ldo),
        6 => pairs_r::<K, 6>(w, pb, nsb, rows, prep, prep_rb, out, ldo),
        7 => pairs_r::<K, 7>(w, pb, nsb, rows, prep, prep_rb, out, ldo),
        8 => pairs_r::<K, 8>(w, pb, nsb, rows, prep, prep_rb, out, ldo),
        _ => panic!("pairs rows: m = {m} > 8"),
    }
}

/// `matmul_rows` for Q4_K or Q6_K weights in their pairs layout (`layout`) and `m <= 8`.
///
/// # Safety
/// As `super::matmul_rows` (with `w` in `layout`, long enough for `rows`), plus the CPU features of
/// `super::avx512::supported`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_rows_pairs(
    layout: super::Layout,
    w: &[u8],
    k: usize,
    rows: Range<usize>,
    acts: &[u8],
    act_rb: usize,
    m: usize,
    out: *mut f32,
    ldo: usize,
) {
    let nsb = k / QK_K;
    let pb = layout.pair_bytes(k).expect("INVARIANT: a pairs layout");
    assert!(w.len() >= rows.end.div_ceil(2) * pb, "pairs rows: weights too short");
    let (wp, acts_m) = (w.as_ptr(), &acts[..m * act_rb]);
    let a = |t: usize| acts.as_ptr().add(t * act_rb);
    if layout == super::Layout::Q4KPairs {
        let prep_rb = nsb.div_ceil(4) * PG4;
        let kind = (gguf::GgmlType::Q4_K.to_u32() << 1) | 0x100;
        let prep = prepared(kind, acts_m, k, m, prep_rb * m, |prep| {
            for t in 0..m {
                prep_q4k_pairs(a(t), a(t).add(nsb * Q8_K_BYTES), nsb, prep.add(t * prep_rb));
            }
        });
        run_pairs::<Q4KPair>(wp, pb, nsb, rows, prep, prep_rb, m, out, ldo);
    } else {
        let prep_rb = nsb * PQ6;
        // The same preparation as the GGUF layout's transposed kernel, so the two share cache entries.
        let kind = gguf::GgmlType::Q6_K.to_u32() << 1;
        let prep = prepared(kind, acts_m, k, m, prep_rb * m, |prep| {
            for t in 0..m {
                prep_q6k_t(a(t), a(t).add(nsb * Q8_K_BYTES), nsb, prep.add(t * prep_rb));
            }
        });
        run_pairs::<Q6KPair>(wp, pb, nsb, rows, prep, prep_rb, m, out, ldo);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Legacy 32-blocks, two blocks per vector.

/// Prepared activation pair of 32-blocks: 64 quants; the accumulator start `-zero·Σq` (i32) in lanes 0 and 8 (or,
/// for the types with a min, `s` as f32 there); `d` (f32) in each block's 8 lanes.
const PL: usize = 192;

/// Prepares Q8_0 (`HAS_MIN` false) or Q8_1 rows for two-block kernels; an odd last block gets a zero partner.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn prep_legacy<const HAS_MIN: bool>(a: *const u8, x: *const u8, nb: usize, zshift: u32, dst: *mut u8) {
    let (ab, qo) = if HAS_MIN { (Q8_1_BYTES, 4) } else { (Q8_0_BYTES, 2) };
    // Trailer pairs (t0, u0, t1, u1) per two blocks: Q8_0 (-Σq, d), Q8_1 (d, s).
    let (d_idx, t_idx) = if HAS_MIN { (0, 1) } else { (1, 0) };
    let spread = _mm512_setr_epi32(
        d_idx,
        d_idx,
        d_idx,
        d_idx,
        d_idx,
        d_idx,
        d_idx,
        d_idx,
        d_idx + 2,
        d_idx + 2,
        d_idx + 2,
        d_idx + 2,
        d_idx + 2,
        d_idx + 2,
        d_idx + 2,
        d_idx + 2,
    );
    let firsts = _mm512_setr_epi32(t_idx, 0, 0, 0, 0, 0, 0, 0, t_idx + 2, 0, 0, 0, 0, 0, 0, 0);
    let shift = _mm_cvtsi32_si128(if HAS_MIN { 0 } else { zshift as i32 });
    for p in 0..nb.div_ceil(2) {
        let d = dst.add(p * PL);
        let two = 2 * p + 1 < nb;
        let q0 = _mm256_loadu_si256(a.add(2 * p * ab + qo) as *const __m256i);
        let q1 = if two {
            _mm256_loadu_si256(a.add((2 * p + 1) * ab + qo) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        _mm512_storeu_si512(d as *mut _, _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q0), q1));
        let t = _mm512_castsi128_si512(_mm_maskz_loadu_epi32(if two { 0xF } else { 0x3 }, x.add(16 * p) as *const i32));
        _mm512_storeu_si512(d.add(128) as *mut _, _mm512_permutexvar_epi32(spread, t));
        let first = _mm512_maskz_permutexvar_epi32(0x0101, firsts, t);
        _mm512_storeu_si512(d.add(64) as *mut _, _mm512_sll_epi32(first, shift));
    }
    // Pairs 2q and 2q+1 are reduced together by `row_legacy`: pair 2q's trailer vectors become the quad layout of
    // the reduced sums (lanes 0, 8, 1, 9 = blocks 4q, 4q+1, 4q+2, 4q+3; the rest unused).
    let np = nb.div_ceil(2);
    for p in (0..np).step_by(2) {
        let d = dst.add(p * PL);
        let (fb, db) = if p + 1 < np {
            let e = dst.add((p + 1) * PL);
            (ld(e.add(64)), ld(e.add(128)))
        } else {
            (_mm512_setzero_si512(), _mm512_setzero_si512())
        };
        _mm512_storeu_si512(d.add(64) as *mut _, _mm512_unpacklo_epi32(ld(d.add(64)), fb));
        _mm512_storeu_si512(d.add(128) as *mut _, _mm512_unpacklo_epi32(ld(d.add(128)), db));
    }
}

/// Weight pair unpacking for the legacy types: 64 unsigned values (block 2p in the low half) and, for the types
/// with a min, the two mins in lanes 0 and 8; and the two scales per lane.
trait LegacyW {
    const BYTES: usize;
    const HAS_MIN: bool;
    const ZSHIFT: u32;
    /// `(values, d per lane, m in lanes 0/8)` of blocks `b` and `b+1` (`two` false: only `b`, the rest zero).
    unsafe fn pair(b: *const u8, two: bool) -> (__m512i, __m512, __m512);
}

/// Nibbles of two 16-byte quant arrays as [lo0, hi0, lo1, hi1] (128-bit lanes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn nibbles2(q0: *const u8, q1: *const u8, two: bool) -> __m512i {
    let x0 = _mm512_broadcast_i32x4(_mm_loadu_si128(q0 as *const __m128i));
    let x1 = if two { _mm512_broadcast_i32x4(_mm_loadu_si128(q1 as *const __m128i)) } else { _mm512_setzero_si512() };
    let x = _mm512_mask_blend_epi64(0xF0, x0, x1);
    let sh = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    _mm512_and_si512(_mm512_srlv_epi64(x, sh), _mm512_set1_epi8(0x0f))
}

/// Per-lane scale vector from the f16 at `b + off` and `b + stride + off` (8 lanes each; the second 0 unless
/// `two`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn d_pair(b: *const u8, stride: usize, off: usize, two: bool) -> __m512 {
    let h0 = (b.add(off) as *const u16).read_unaligned() as i32;
    let h1 = if two { (b.add(stride + off) as *const u16).read_unaligned() as i32 } else { 0 };
    let h = _mm_insert_epi16::<1>(_mm_insert_epi16::<0>(_mm_setzero_si128(), h0), h1);
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(h)))
}

/// 0x10 in every byte whose bit is set in the two 32-bit masks at `h0` and `h1`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn high_bits2(h0: *const u8, h1: *const u8, two: bool) -> __m512i {
    let lo = (h0 as *const u32).read_unaligned() as u64;
    let hi = if two { (h1 as *const u32).read_unaligned() as u64 } else { 0 };
    _mm512_maskz_mov_epi8(lo | (hi << 32), _mm512_set1_epi8(0x10))
}

struct LQ40;
struct LQ41;
struct LQ50;
struct LQ51;
struct LQ80;

impl LegacyW for LQ40 {
    const BYTES: usize = Q4_0_BYTES;
    const HAS_MIN: bool = false;
    const ZSHIFT: u32 = 3;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair(b: *const u8, two: bool) -> (__m512i, __m512, __m512) {
        (nibbles2(b.add(2), b.add(Self::BYTES + 2), two), d_pair(b, Self::BYTES, 0, two), _mm512_setzero_ps())
    }
}

impl LegacyW for LQ41 {
    const BYTES: usize = Q4_1_BYTES;
    const HAS_MIN: bool = true;
    const ZSHIFT: u32 = 0;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair(b: *const u8, two: bool) -> (__m512i, __m512, __m512) {
        let (d0, m0) = f16x2(b);
        let (d1, m1) = if two { f16x2(b.add(Self::BYTES)) } else { (0.0, 0.0) };
        let d = _mm512_insertf32x8::<1>(_mm512_set1_ps(d0), _mm256_set1_ps(d1));
        let m = _mm512_maskz_mov_ps(0x0101, _mm512_insertf32x8::<1>(_mm512_set1_ps(m0), _mm256_set1_ps(m1)));
        (nibbles2(b.add(4), b.add(Self::BYTES + 4), two), d, m)
    }
}

impl LegacyW for LQ50 {
    const BYTES: usize = Q5_0_BYTES;
    const HAS_MIN: bool = false;
    const ZSHIFT: u32 = 4;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair(b: *const u8, two: bool) -> (__m512i, __m512, __m512) {
        let n = nibbles2(b.add(6), b.add(Self::BYTES + 6), two);
        let h = high_bits2(b.add(2), b.add(Self::BYTES + 2), two);
        (_mm512_or_si512(n, h), d_pair(b, Self::BYTES, 0, two), _mm512_setzero_ps())
    }
}

impl LegacyW for LQ51 {
    const BYTES: usize = Q5_1_BYTES;
    const HAS_MIN: bool = true;
    const ZSHIFT: u32 = 0;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair(b: *const u8, two: bool) -> (__m512i, __m512, __m512) {
        let (d0, m0) = f16x2(b);
        let (d1, m1) = if two { f16x2(b.add(Self::BYTES)) } else { (0.0, 0.0) };
        let d = _mm512_insertf32x8::<1>(_mm512_set1_ps(d0), _mm256_set1_ps(d1));
        let m = _mm512_maskz_mov_ps(0x0101, _mm512_insertf32x8::<1>(_mm512_set1_ps(m0), _mm256_set1_ps(m1)));
        let n = nibbles2(b.add(8), b.add(Self::BYTES + 8), two);
        let h = high_bits2(b.add(4), b.add(Self::BYTES + 4), two);
        (_mm512_or_si512(n, h), d, m)
    }
}

impl LegacyW for LQ80 {
    const BYTES: usize = Q8_0_BYTES;
    const HAS_MIN: bool = false;
    const ZSHIFT: u32 = 7;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair(b: *const u8, two: bool) -> (__m512i, __m512, __m512) {
        let lo = _mm256_loadu_si256(b.add(2) as *const __m256i);
        let hi =
            if two { _mm256_loadu_si256(b.add(Self::BYTES + 2) as *const __m256i) } else { _mm256_set1_epi8(-128) };
        let q = _mm512_xor_si512(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi), _mm512_set1_epi8(-128));
        (q, d_pair(b, Self::BYTES, 0, two), _mm512_setzero_ps())
    }
}

/// One legacy row (nb blocks) against R prepared activation rows.
///
/// Canonical order (`NOTES.md`, "Batch invariance"): per block, the exact integer sum times `d·da` (rounded),
/// plus `m·s` fused for the types with a min, added to running sum `block % 4`, exactly as the 16-row panels do.
/// Two pairs (4 blocks) are reduced together: lanes 0, 8, 1, 9 of the result hold blocks 4q, 4q+1, 4q+2, 4q+3
/// (sums 0, 1, 2, 3). A missing block adds +0 (zero weights and scale), which leaves a sum unchanged (never -0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn row_legacy<T: LegacyW, const R: usize>(w: *const u8, nb: usize, pa: &[*const u8; R]) -> [f32; R] {
    let mut facc = [_mm512_setzero_ps(); R];
    let np = nb.div_ceil(2);
    let mut p = 0;
    while p < np {
        let (qa, qb, dwq, mwq) = legacy_quad_pairs::<T>(w, nb, p);
        legacy_quad_rows::<T, R>(qa, qb, dwq, mwq, p + 1 < np, pa, p, &mut facc);
        p += 2;
    }
    legacy_finish(&facc)
}

/// Blocks 2p..2p+4 (fewer at the end) unpacked pair by pair: the values of pairs p and p+1, the scales (lanes 0, 8,
/// 1, 9 = blocks 2p..2p+4) and the mins in the same lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn legacy_quad_pairs<T: LegacyW>(w: *const u8, nb: usize, p: usize) -> (__m512i, __m512i, __m512, __m512) {
    let (zi, zf) = (_mm512_setzero_si512(), _mm512_setzero_ps());
    let has_b = p + 1 < nb.div_ceil(2);
    let (qa, dwa, mwa) = T::pair(w.add(2 * p * T::BYTES), 2 * p + 1 < nb);
    let (qb, dwb, mwb) = if has_b { T::pair(w.add(2 * (p + 1) * T::BYTES), 2 * p + 3 < nb) } else { (zi, zf, zf) };
    (qa, qb, _mm512_unpacklo_ps(dwa, dwb), _mm512_unpacklo_ps(mwa, mwb))
}

/// The canonical steps of pairs p and p+1 (`has_b`) for every activation row.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn legacy_quad_rows<T: LegacyW, const R: usize>(
    qa: __m512i,
    qb: __m512i,
    dwq: __m512,
    mwq: __m512,
    has_b: bool,
    pa: &[*const u8; R],
    p: usize,
    facc: &mut [__m512; R],
) {
    let zi = _mm512_setzero_si512();
    for r in 0..R {
        let a = pa[r].add(p * PL);
        let va = _mm512_dpbusd_epi32(zi, qa, ld(a));
        let vb = if has_b { _mm512_dpbusd_epi32(zi, qb, ld(a.add(PL))) } else { zi };
        let s1 = _mm512_add_epi32(_mm512_unpacklo_epi32(va, vb), _mm512_unpackhi_epi32(va, vb));
        let s2 = _mm512_add_epi32(s1, _mm512_shuffle_epi32::<0b01_00_11_10>(s1));
        let mut s3 = _mm512_add_epi32(s2, _mm512_shuffle_i32x4::<0b10_11_00_01>(s2, s2));
        let first = ld(a.add(64));
        if !T::HAS_MIN {
            s3 = _mm512_add_epi32(s3, first);
        }
        let daq = _mm512_loadu_ps(a.add(128) as *const f32);
        let mut v = _mm512_mul_ps(_mm512_cvtepi32_ps(s3), _mm512_mul_ps(dwq, daq));
        if T::HAS_MIN {
            v = _mm512_fmadd_ps(mwq, _mm512_castsi512_ps(first), v);
        }
        facc[r] = _mm512_add_ps(facc[r], v);
    }
}

/// [`row_legacy`] for Q4_0 with AVX-512 VBMI: each group of 4 whole blocks is unpacked with byte permutes from two
/// loads (two `vpermi2b` instead of four scalar loads, four broadcasts and the inserts); the values and scales that
/// meet the activations are exactly those of the pair path, so results are bitwise the same. Cache-resident, one
/// thread, m = 1: 1.36 -> 1.17 ns per block (k = 896), 1.33 -> 1.10 (k = 4864).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c")]
unsafe fn row_legacy_vbmi<T: LegacyQuad, const R: usize>(w: *const u8, nb: usize, pa: &[*const u8; R]) -> [f32; R] {
    let mut facc = [_mm512_setzero_ps(); R];
    let np = nb.div_ceil(2);
    let idx = QuadIdx::new::<T>();
    let mut p = 0;
    while p < np {
        let (qa, qb, dwq, mwq) = if 2 * p + 4 <= nb {
            let (qa, qb, dwq) = quad_vbmi::<T>(w.add(2 * p * T::BYTES), &idx);
            (qa, qb, dwq, _mm512_setzero_ps())
        } else {
            legacy_quad_pairs::<T>(w, nb, p)
        };
        legacy_quad_rows::<T, R>(qa, qb, dwq, mwq, p + 1 < np, pa, p, &mut facc);
        p += 2;
    }
    legacy_finish(&facc)
}

/// 4-bit legacy types without a min whose 4-block groups [`quad_vbmi`] unpacks. (Q5_0 measured no faster this way:
/// merging its high bits, by permutes and byte tests or by scalar masks, costs what the permutes save.)
trait LegacyQuad: LegacyW {
    /// Offset of the 16 packed nibble bytes in a block.
    const QS: usize;
}

impl LegacyQuad for LQ40 {
    const QS: usize = 2;
}

/// Byte-permute indices for [`quad_vbmi`] (into the 128 bytes starting at the group's first block).
struct QuadIdx {
    qs: __m512i,
    d: __m512i,
    d_mask: u64,
    lo_hi_a: __m512i,
    lo_hi_b: __m512i,
}

impl QuadIdx {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn new<T: LegacyQuad>() -> Self {
        let mut qs = [0u8; 64];
        let mut d = [0u8; 64];
        for j in 0..4 {
            for i in 0..16 {
                qs[16 * j + i] = (j * T::BYTES + T::QS + i) as u8;
            }
        }
        // The scales' halves land where the pair path puts them after `unpacklo_ps`: f16 lanes 0, 8, 1, 9 hold
        // blocks 0, 1, 2, 3.
        let mut d_mask = 0u64;
        for (j, lane) in [0usize, 8, 1, 9].into_iter().enumerate() {
            for b in 0..2 {
                d[2 * lane + b] = (j * T::BYTES + b) as u8;
                d_mask |= 1 << (2 * lane + b);
            }
        }
        let v = |a: &[u8; 64]| _mm512_loadu_si512(a.as_ptr() as *const _);
        QuadIdx {
            qs: v(&qs),
            d: v(&d),
            d_mask,
            // [lo0, hi0, lo1, hi1] and [lo2, hi2, lo3, hi3] from lo = [lo0..lo3], hi = [hi0..hi3] (qwords).
            lo_hi_a: _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11),
            lo_hi_b: _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15),
        }
    }
}

/// Blocks 0..4 at `b` as [`legacy_quad_pairs`] gives them (without mins): values of blocks 0-1 and 2-3, scales in
/// lanes 0, 8, 1, 9 (the other lanes 0).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c")]
unsafe fn quad_vbmi<T: LegacyQuad>(b: *const u8, idx: &QuadIdx) -> (__m512i, __m512i, __m512) {
    let x0 = ld(b);
    // Only the group's own bytes past the first 64 (never past the matrix).
    let tail = 4 * T::BYTES - 64;
    let x1 = _mm512_maskz_loadu_epi8(u64::MAX >> (64 - tail), b.add(64) as *const i8);
    let q = _mm512_permutex2var_epi8(x0, idx.qs, x1);
    let m0f = _mm512_set1_epi8(0x0f);
    let lo = _mm512_and_si512(q, m0f);
    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m0f);
    let qa = _mm512_permutex2var_epi64(lo, idx.lo_hi_a, hi);
    let qb = _mm512_permutex2var_epi64(lo, idx.lo_hi_b, hi);
    let dh = _mm512_maskz_permutex2var_epi8(idx.d_mask, x0, idx.d, x1);
    (qa, qb, _mm512_cvtph_ps(_mm512_castsi512_si256(dh)))
}

/// The 4 canonical running sums of a legacy row are in lanes 0, 8, 1, 9.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn legacy_finish<const R: usize>(facc: &[__m512; R]) -> [f32; R] {
    let mut res = [0f32; R];
    for r in 0..R {
        let mut l = [0f32; 16];
        _mm512_storeu_ps(l.as_mut_ptr(), facc[r]);
        res[r] = combine_slots(&[l[0], l[8], l[1], l[9]]);
    }
    res
}

// ---------------------------------------------------------------------------------------------------------------
// Driver.

/// Rows per block: a block of weight rows is re-read from L1/L2 by each group of activation rows.
const ROW_BLOCK: usize = 32;

// ---------------------------------------------------------------------------------------------------------------
// Q5_0 in the quads layout (`super::q50_quads`).

/// Prepared Q8_0 activations per quads group (four blocks): quants 0..16 of each block (block `j` at `16 j`), then
/// quants 16..32, then each block's `-16·Σq` (i32) and its `d` (f32), each in all four lanes of 128-bit lane `j`.
const PQ50: usize = 256;

/// Prepares one Q8_0 row (`a`: blocks, `x`: their `(-Σq, d)` trailers) for [`row_q50_quads`]; `ng` groups.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn prep_q50_quads(a: *const u8, x: *const u8, ng: usize, dst: *mut u8) {
    let shift = _mm_cvtsi32_si128(LQ50::ZSHIFT as i32);
    for g in 0..ng {
        let d = dst.add(g * PQ50);
        for j in 0..4 {
            let q = a.add((4 * g + j) * Q8_0_BYTES + 2);
            std::ptr::copy_nonoverlapping(q, d.add(16 * j), 16);
            std::ptr::copy_nonoverlapping(q.add(16), d.add(64 + 16 * j), 16);
        }
        // Trailer dwords (-Σq, d) of the four blocks, spread to the four lanes of each block's 128-bit lane.
        let t = _mm512_castsi256_si512(_mm256_loadu_si256(x.add(32 * g) as *const __m256i));
        let neg_sum = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6), t);
        let da = _mm512_permutexvar_epi32(_mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7), t);
        _mm512_storeu_si512(d.add(128) as *mut _, _mm512_sll_epi32(neg_sum, shift));
        _mm512_storeu_si512(d.add(192) as *mut _, da);
    }
}

/// One Q5_0 quads row (`ng` groups) against R activation rows prepared by [`prep_q50_quads`].
///
/// The canonical order of the legacy types ([`row_legacy`]): per block its exact integer sum (plus `-16·Σq`) times
/// `d·da`, added to running sum `block % 4`; a group's blocks are sums 0..4, kept in lanes 0, 4, 8 and 12.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q50_quads<const R: usize>(w: *const u8, ng: usize, pa: &[*const u8; R]) -> [f32; R] {
    use super::q50_quads::GROUP_BYTES;
    let mut facc = [_mm512_setzero_ps(); R];
    let (zi, m0f, c10) = (_mm512_setzero_si512(), _mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x10));
    let spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let halves = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    for g in 0..ng {
        let b = w.add(g * GROUP_BYTES);
        let q = ld(b);
        // Low 16 bits of each block's qh (weights 0..16) to the mask of `lo`, high 16 bits to that of `hi`.
        let qh = _mm_shuffle_epi8(_mm_loadu_si128(b.add(64) as *const __m128i), halves);
        let lo = _mm512_and_si512(q, m0f);
        let lo = _mm512_mask_add_epi8(lo, _mm_cvtsi128_si64(qh) as u64, lo, c10);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m0f);
        let hi = _mm512_mask_add_epi8(hi, _mm_extract_epi64::<1>(qh) as u64, hi, c10);
        let d4 = _mm_cvtph_ps(_mm_loadl_epi64(b.add(80) as *const __m128i));
        let dw = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
        for r in 0..R {
            let a = pa[r].add(g * PQ50);
            let v = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zi, lo, ld(a)), hi, ld(a.add(64)));
            let s1 = _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b10_11_00_01>(v));
            let s2 = _mm512_add_epi32(s1, _mm512_shuffle_epi32::<0b01_00_11_10>(s1));
            let s3 = _mm512_add_epi32(s2, ld(a.add(128)));
            let daq = _mm512_loadu_ps(a.add(192) as *const f32);
            facc[r] = _mm512_add_ps(facc[r], _mm512_mul_ps(_mm512_cvtepi32_ps(s3), _mm512_mul_ps(dw, daq)));
        }
    }
    let mut res = [0f32; R];
    for r in 0..R {
        let mut l = [0f32; 16];
        _mm512_storeu_ps(l.as_mut_ptr(), facc[r]);
        res[r] = combine_slots(&[l[0], l[4], l[8], l[12]]);
    }
    res
}

struct KQ50Q;
impl RowKernel for KQ50Q {
    const RMAX: usize = 8;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn run<const R: usize>(w: *const u8, n: usize, pa: &[*const u8; R]) -> [f32; R] {
        row_q50_quads::<R>(w, n, pa)
    }
}

/// Row-streaming product for Q5_0 weights in the quads layout (`k` a multiple of 128).
///
/// # Safety
/// As `super::matmul_rows`, plus the CPU features of `super::avx512::supported`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_rows_q50_quads(
    w: &[u8],
    k: usize,
    rows: Range<usize>,
    acts: &[u8],
    act_rb: usize,
    m: usize,
    out: *mut f32,
    ldo: usize,
) {
    let nb = k / QK;
    let ng = nb / 4;
    let prep_rb = ng * PQ50;
    // Its own preparation kind: the legacy one of Q5_0 is `Q5_0 << 1`.
    let kind = (gguf::GgmlType::Q5_0.to_u32() << 1) | (1 << 16);
    let prep = prepared(kind, &acts[..m * act_rb], k, m, prep_rb * m, |prep| {
        for t in 0..m {
            let a = acts.as_ptr().add(t * act_rb);
            prep_q50_quads(a, a.add(nb * Q8_0_BYTES), ng, prep.add(t * prep_rb));
        }
    });
    run_rows::<KQ50Q, false>(w.as_ptr(), nb * Q5_0_BYTES, ng, rows, prep, prep_rb, m, out, ldo);
}

/// A row kernel: one weight row (or, with `PAIR`, two consecutive ones) against R prepared activation rows.
trait RowKernel {
    /// Most activation rows per call (the register budget).
    const RMAX: usize;
    unsafe fn run<const R: usize>(w: *const u8, n: usize, pa: &[*const u8; R]) -> [f32; R];
    unsafe fn run2<const R: usize>(_w: *const u8, _n: usize, _pa: &[*const u8; R]) -> [[f32; R]; 2] {
        unreachable!("no paired kernel")
    }
}

macro_rules! row_kernel {
    ($name:ident, $rmax:expr, $f:ident $(, $extra:tt)*) => {
        struct $name;
        impl RowKernel for $name {
            const RMAX: usize = $rmax;
            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
            unsafe fn run<const R: usize>(w: *const u8, n: usize, pa: &[*const u8; R]) -> [f32; R] {
                $f::<R $(, $extra)*>(w, n, pa)
            }
        }
    };
}

row_kernel!(KQ6, 4, row_q6k);
struct KQ6T;
impl RowKernel for KQ6T {
    const RMAX: usize = 8;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn run<const R: usize>(w: *const u8, n: usize, pa: &[*const u8; R]) -> [f32; R] {
        row_q6k_t::<R>(w, n, pa)
    }
}
row_kernel!(KQ5K, 4, row_k4, true);

struct KQ4;
impl RowKernel for KQ4 {
    const RMAX: usize = 8;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn run<const R: usize>(w: *const u8, n: usize, pa: &[*const u8; R]) -> [f32; R] {
        q4k_g4::<R, false>(w, n, pa)[0]
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn run2<const R: usize>(w: *const u8, n: usize, pa: &[*const u8; R]) -> [[f32; R]; 2] {
        q4k_g4::<R, true>(w, n, pa)
    }
}

/// [`KLeg`] with the VBMI unpacking of [`row_legacy_vbmi`].
struct KLegV<T: LegacyQuad>(std::marker::PhantomData<T>);
impl<T: LegacyQuad> RowKernel for KLegV<T> {
    const RMAX: usize = 4;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn run<const R: usize>(w: *const u8, n: usize, pa: &[*const u8; R]) -> [f32; R] {
        row_legacy_vbmi::<T, R>(w, n, pa)
    }
}

/// AVX-512 VBMI (byte permutes; Ice Lake and Zen 4 on, not Skylake-X or Cascade Lake). `SPLASH_NO_VBMI=1` turns it
/// off (to compare).
fn vbmi() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        is_x86_feature_detected!("avx512vbmi") && std::env::var("SPLASH_NO_VBMI").map_or(true, |v| v != "1")
    })
}

struct KLeg<T: LegacyW>(std::marker::PhantomData<T>);
impl<T: LegacyW> RowKernel for KLeg<T> {
    const RMAX: usize = 4;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
    unsafe fn run<const R: usize>(w: *const u8, n: usize, pa: &[*const u8; R]) -> [f32; R] {
        row_legacy::<T, R>(w, n, pa)
    }
}

/// Rows `r0..r1` (two at a time with `PAIR`, an odd last one alone) against the R activation rows at `base`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_r<K: RowKernel, const R: usize, const PAIR: bool>(
    w: *const u8,
    rb: usize,
    n_units: usize,
    r0: usize,
    r1: usize,
    base: *const u8,
    prep_rb: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut pa = [base; R];
    for (i, p) in pa.iter_mut().enumerate() {
        *p = base.add(i * prep_rb);
    }
    let mut r = r0;
    if PAIR {
        while r + 2 <= r1 {
            let v = K::run2::<R>(w.add(r * rb), n_units, &pa);
            for i in 0..R {
                *out.add(i * ldo + r) = v[0][i];
                *out.add(i * ldo + r + 1) = v[1][i];
            }
            r += 2;
        }
    }
    while r < r1 {
        let v = K::run::<R>(w.add(r * rb), n_units, &pa);
        for i in 0..R {
            *out.add(i * ldo + r) = v[i];
        }
        r += 1;
    }
}

/// Runs kernel `K` over `rows` for every group of at most `K::RMAX` prepared activation rows (`prep_rb` bytes
/// apart), a block of rows at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn run_rows<K: RowKernel, const PAIR: bool>(
    w: *const u8,
    rb: usize,
    n_units: usize,
    rows: Range<usize>,
    prep: *const u8,
    prep_rb: usize,
    m: usize,
    out: *mut f32,
    ldo: usize,
) {
    let ng = m.div_ceil(K::RMAX);
    let mut r0 = rows.start;
    while r0 < rows.end {
        let r1 = (r0 + ROW_BLOCK).min(rows.end);
        let mut t = 0;
        for g in 0..ng {
            let gs = (m - t).div_ceil(ng - g);
            let (base, o) = (prep.add(t * prep_rb), out.add(t * ldo));
            match gs {
                1 => rows_r::<K, 1, PAIR>(w, rb, n_units, r0, r1, base, prep_rb, o, ldo),
                2 => rows_r::<K, 2, PAIR>(w, rb, n_units, r0, r1, base, prep_rb, o, ldo),
                3 => rows_r::<K, 3, PAIR>(w, rb, n_units, r0, r1, base, prep_rb, o, ldo),
                4 => rows_r::<K, 4, PAIR>(w, rb, n_units, r0, r1, base, prep_rb, o, ldo),
                5 => rows_r::<K, 5, PAIR>(w, rb, n_units, r0, r1, base, prep_rb, o, ldo),
                6 => rows_r::<K, 6, PAIR>(w, rb, n_units, r0, r1, base, prep_rb, o, ldo),
                7 => rows_r::<K, 7, PAIR>(w, rb, n_units, r0, r1, base, prep_rb, o, ldo),
                _ => rows_r::<K, 8, PAIR>(w, rb, n_units, r0, r1, base, prep_rb, o, ldo),
            }
            t += gs;
        }
        r0 = r1;
    }
}

/// Prepared activations of the last few calls on this thread. The rearrangement is a pure function of the
/// activation bytes, so an entry is reused only when the bytes are identical (compared in full; much cheaper than
/// preparing again), which makes small row chunks and matrices sharing an input (Q/K/V, gate/up) cheap.
struct PrepEntry {
    key: (u32, usize, usize, usize),
    acts: Vec<u8>,
    prep: Vec<super::avx512::A64>,
    last_use: u64,
}

thread_local! {
    static PREP_CACHE: std::cell::RefCell<(Vec<PrepEntry>, u64)> = const { std::cell::RefCell::new((Vec::new(), 0)) };
}

const PREP_CACHE_ENTRIES: usize = 4;

/// The prepared form (`prep_bytes` long) of the activation rows `acts` for preparation `kind` (weight type and
/// variant), computed with `fill` unless this thread prepared the same bytes the same way recently. The pointer
/// is valid until the next call on this thread.
unsafe fn prepared(
    kind: u32,
    acts: &[u8],
    k: usize,
    m: usize,
    prep_bytes: usize,
    fill: impl FnOnce(*mut u8),
) -> *const u8 {
    let key = (kind, k, m, acts.len());
    let (ptr, hit) = PREP_CACHE.with_borrow_mut(|(entries, clock)| {
        *clock += 1;
        if let Some(e) = entries.iter_mut().find(|e| e.key == key && e.acts.as_slice() == acts) {
            e.last_use = *clock;
            return (e.prep.as_mut_ptr() as *mut u8, true);
        }
        let slot = if entries.len() < PREP_CACHE_ENTRIES {
            entries.push(PrepEntry { key, acts: Vec::new(), prep: Vec::new(), last_use: 0 });
            entries.len() - 1
        } else {
            (0..entries.len()).min_by_key(|&i| entries[i].last_use).expect("INVARIANT: the cache is full")
        };
        let e = &mut entries[slot];
        e.key = key;
        e.last_use = *clock;
        e.acts.clear();
        e.acts.extend_from_slice(acts);
        let lines = prep_bytes.div_ceil(64);
        if e.prep.len() < lines {
            e.prep.resize(lines, super::avx512::A64([0; 64]));
        }
        (e.prep.as_mut_ptr() as *mut u8, false)
    });
    if !hit {
        fill(ptr);
    }
    ptr
}

/// Most activation rows for which the row-streaming kernels are used (past it the 16-row panels win, measured
/// cache-resident on the build machine; streaming from DRAM favours the rows further).
pub fn max_m(wty: gguf::GgmlType) -> usize {
    use gguf::GgmlType::*;
    // Legacy types: since the rows reduce every block to its canonical integer sum (batch invariance), the panels
    // win from m = 2 (m = 3 for Q8_0), measured cache-resident at k = 1536.
    match wty {
        // Measured in the model (1.5B, 2 threads, quiet): with Q4_K on panels from m = 5, a 5-row pass cost 3.0 and a
        // 9-row pass 5.1 single-row passes; rows up to 8 stay cheaper. Row kernels of 9-12 rows (tried 2026-11-30)
        // tied with the panels at 9 rows (3.25 vs 3.26 single passes) and lost at 12 and 16 (4.3 / 5.2 vs 3.8 /
        // 4.5), so the panels keep m > 8.
        Q4_K | Q6_K => 8,
        Q5_K => 4,
        Q8_0 => 2,
        _ => 1,
    }
}

/// Row-streaming `matmul_rows` for `m <= max_m(wty)`; returns false if `wty` has no row kernel here.
///
/// # Safety
/// As `super::matmul_rows`, plus the CPU features of `super::avx512::supported`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn matmul_rows(
    wty: gguf::GgmlType,
    w: &[u8],
    k: usize,
    rows: Range<usize>,
    acts: &[u8],
    act_rb: usize,
    m: usize,
    out: *mut f32,
    ldo: usize,
) -> bool {
    use gguf::GgmlType::*;
    let rb = wty.row_bytes(k).expect("INVARIANT: checked by the caller");
    let rows_acts = &acts[..m * act_rb];
    let kind = wty.to_u32() << 1;
    let wp = w.as_ptr();
    match wty {
        // The transposed kernel wins while the prepared activations stay in L2 (measured cache-resident, one
        // thread, k = 8960: m = 4 17.8 -> 15.6 ns per block-row, m = 8 35.8 -> 29.3 against the plain kernel).
        Q6_K if m * (k / QK_K) * PQ6 > 256 << 10 => {
            run_rows::<KQ6, false>(wp, rb, k / QK_K, rows, acts.as_ptr(), act_rb, m, out, ldo);
        }
        Q6_K => {
            let nsb = k / QK_K;
            let prep_rb = nsb * PQ6;
            let prep = prepared(kind, rows_acts, k, m, prep_rb * m, |prep| {
                for t in 0..m {
                    let a = acts.as_ptr().add(t * act_rb);
                    prep_q6k_t(a, a.add(nsb * Q8_K_BYTES), nsb, prep.add(t * prep_rb));
                }
            });
            run_rows::<KQ6T, false>(wp, rb, nsb, rows, prep, prep_rb, m, out, ldo);
        }
        Q4_K => {
            let nsb = k / QK_K;
            // With nsb % 4 == 2, rows go in pairs so that no group of 4 super-blocks is half empty.
            let pair = nsb % 4 == 2 && rows.len() >= 2;
            let total = if pair { 2 * nsb } else { nsb };
            let prep_rb = total.div_ceil(4) * PG4;
            let prep = prepared(kind | pair as u32, rows_acts, k, m, prep_rb * m, |prep| {
                for t in 0..m {
                    let a = acts.as_ptr().add(t * act_rb);
                    prep_q4k_g4(a, a.add(nsb * Q8_K_BYTES), nsb, total, prep.add(t * prep_rb));
                }
            });
            if pair {
                run_rows::<KQ4, true>(wp, rb, nsb, rows, prep, prep_rb, m, out, ldo);
            } else {
                run_rows::<KQ4, false>(wp, rb, nsb, rows, prep, prep_rb, m, out, ldo);
            }
        }
        Q5_K => {
            let nsb = k / QK_K;
            let prep_rb = nsb * PK4;
            let prep = prepared(kind, rows_acts, k, m, prep_rb * m, |prep| {
                for t in 0..m {
                    let a = acts.as_ptr().add(t * act_rb);
                    prep_k4(a, a.add(nsb * Q8_K_BYTES), nsb, prep.add(t * prep_rb));
                }
            });
            run_rows::<KQ5K, false>(wp, rb, nsb, rows, prep, prep_rb, m, out, ldo);
        }
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 => {
            let nb = k / QK;
            let prep_rb = nb.div_ceil(2) * PL;
            let (has_min, zshift, ab) = match wty {
                Q4_0 => (false, LQ40::ZSHIFT, Q8_0_BYTES),
                Q5_0 => (false, LQ50::ZSHIFT, Q8_0_BYTES),
                Q8_0 => (false, LQ80::ZSHIFT, Q8_0_BYTES),
                _ => (true, 0, Q8_1_BYTES),
            };
            let prep = prepared(kind, rows_acts, k, m, prep_rb * m, |prep| {
                for t in 0..m {
                    let a = acts.as_ptr().add(t * act_rb);
                    let x = a.add(nb * ab);
                    if has_min {
                        prep_legacy::<true>(a, x, nb, zshift, prep.add(t * prep_rb));
                    } else {
                        prep_legacy::<false>(a, x, nb, zshift, prep.add(t * prep_rb));
                    }
                }
            });
            match wty {
                Q4_0 if vbmi() => run_rows::<KLegV<LQ40>, false>(wp, rb, nb, rows, prep, prep_rb, m, out, ldo),
                Q4_0 => run_rows::<KLeg<LQ40>, false>(wp, rb, nb, rows, prep, prep_rb, m, out, ldo),
                Q4_1 => run_rows::<KLeg<LQ41>, false>(wp, rb, nb, rows, prep, prep_rb, m, out, ldo),
                Q5_0 => run_rows::<KLeg<LQ50>, false>(wp, rb, nb, rows, prep, prep_rb, m, out, ldo),
                Q5_1 => run_rows::<KLeg<LQ51>, false>(wp, rb, nb, rows, prep, prep_rb, m, out, ldo),
                _ => run_rows::<KLeg<LQ80>, false>(wp, rb, nb, rows, prep, prep_rb, m, out, ldo),
            }
        }
        _ => return false,
    }
    true
}

/// Whether the pairs kernels prefetch long rows ahead for several activation rows (`SPLASH_PREFETCH=0` turns it
/// off, for A/B measurements; results are the same either way).
fn prefetch_ahead_on() -> bool {
    static A: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *A.get_or_init(|| std::env::var("SPLASH_PREFETCH").map_or(true, |v| v != "0"))
}
