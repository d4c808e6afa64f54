//! AVX2 + FMA + F16C kernels (x86-64 without AVX-512).
//!
//! Row-streaming only: each weight row is read front to back and its blocks are unpacked once for up to 4
//! activation rows. Without VNNI the 8-bit products go through `maddubs` (u8 × i8 pairs to i16) and `madd`
//! (i16 pairs to i32, optionally against the sub-block scales), which is ggml's AVX2 math.

#![allow(unsafe_op_in_unsafe_fn)]
#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

use super::ActFormat;
use super::blocks::*;
use gguf::GgmlType;
use std::arch::x86_64::*;
use std::ops::Range;

pub fn supported() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rdf(p: *const u8) -> f32 {
    (p as *const f32).read_unaligned()
}

/// The f16 at `p`, widened. (Inserted into a zeroed register: LLVM turns a plain 16-bit load into `vpinsrw`
/// over whatever register is free, which can be a loop's accumulator, and then the loop runs at FMA latency.)
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16x1(p: *const u8) -> f32 {
    let h = (p as *const u16).read_unaligned() as i32;
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_insert_epi16::<0>(_mm_setzero_si128(), h)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
}

// ---------------------------------------------------------------------------------------------------------------
// Activation quantization (bit-identical to ggml's reference quantizers).

/// ggml's `roundf` (halves away from zero): trunc(v + copysign(0.5 - 2^-25, v)).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_away(v: __m256) -> __m256i {
    let sign = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN)));
    let half = _mm256_or_ps(sign, _mm256_castsi256_ps(_mm256_set1_epi32(0x3EFF_FFFF)));
    _mm256_cvttps_epi32(_mm256_add_ps(v, half))
}

/// Packs 4 × 8 i32 (within i8 range) into 32 bytes in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack32(q: [__m256i; 4]) -> __m256i {
    let ab = _mm256_packs_epi32(q[0], q[1]);
    let cd = _mm256_packs_epi32(q[2], q[3]);
    let v = _mm256_packs_epi16(ab, cd);
    _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn abs_max(x: *const f32, n: usize) -> f32 {
    let mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let mut m = _mm256_setzero_ps();
    for i in (0..n).step_by(8) {
        m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x.add(i)), mask));
    }
    let s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)))
}

/// One 32-block of Q8_0 / Q8_1 quants: returns (d, Σq).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_32(x: *const f32, qs: *mut u8) -> (f32, i32) {
    let amax = abs_max(x, 32);
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    let q: [__m256i; 4] = std::array::from_fn(|i| round_away(_mm256_mul_ps(_mm256_loadu_ps(x.add(8 * i)), id)));
    _mm256_storeu_si256(qs as *mut __m256i, pack32(q));
    let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    (d, hsum_epi32(s))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_k_block(x: *const f32, ob: *mut u8) {
    let amax = abs_max(x, QK_K);
    if amax == 0.0 {
        std::ptr::write_bytes(ob, 0, Q8_K_BYTES);
        return;
    }
    // ggml keeps the first element of largest magnitude, with its sign.
    let mut max = amax;
    for i in 0..QK_K {
        if (*x.add(i)).abs() == amax {
            max = *x.add(i);
            break;
        }
    }
    let iscale = -127.0 / max;
    let vs = _mm256_set1_ps(iscale);
    let v127 = _mm256_set1_epi32(127);
    for j in 0..8 {
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            let v = _mm256_mul_ps(_mm256_loadu_ps(x.add(32 * j + 8 * i)), vs);
            // Round half to even (the default MXCSR mode), like ggml's nearest_int.
            _mm256_min_epi32(
                _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)),
                v127,
            )
        });
        _mm256_storeu_si256(ob.add(Q8K_QS + 32 * j) as *mut __m256i, pack32(q));
        let s0 = hsum_epi32(_mm256_add_epi32(q[0], q[1])) as i16;
        let s1 = hsum_epi32(_mm256_add_epi32(q[2], q[3])) as i16;
        (ob.add(Q8K_BSUMS + 4 * j) as *mut i16).write_unaligned(s0);
        (ob.add(Q8K_BSUMS + 4 * j + 2) as *mut i16).write_unaligned(s1);
    }
    (ob as *mut f32).write_unaligned(1.0 / iscale);
}

/// # Safety
/// Requires the CPU features of [`supported`]; `out` is `act_row_bytes(fmt, x.len())` long.
#[target_feature(enable = "avx2,fma,f16c")]
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
            for i in 0..k / QK_K {
                q8_k_block(x.as_ptr().add(i * QK_K), o.add(i * Q8_K_BYTES));
            }
            super::scalar::fill_trailer(fmt, out, k);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Row kernels. `a[r]` points at activation row r's ggml blocks, `x[r]` at its trailer.

trait RowKernel {
    /// Elements per block.
    const UNIT: usize;
    unsafe fn row<const R: usize>(w: *const u8, nb: usize, a: &[*const u8; R], x: &[*const u8; R]) -> [f32; R];
}

/// `madd` of u8 × i8 pairs, summed to 8 × i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u8i8(q: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), _mm256_set1_epi16(1))
}

/// The 8 scales and 8 mins of a Q4_K / Q5_K block (ggml's `utmp` unpacking): bytes [sc0..sc7, m0..m7].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_scales(q: *const u8) -> [u8; 16] {
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
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&s_lo.to_le_bytes());
    out[4..8].copy_from_slice(&s_hi.to_le_bytes());
    out[8..12].copy_from_slice(&m_lo.to_le_bytes());
    out[12..16].copy_from_slice(&m_hi.to_le_bytes());
    out
}

struct K4<const FIVE: bool>;

impl<const FIVE: bool> RowKernel for K4<FIVE> {
    const UNIT: usize = QK_K;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row<const R: usize>(w: *const u8, nb: usize, a: &[*const u8; R], x: &[*const u8; R]) -> [f32; R] {
        let m4 = _mm256_set1_epi8(0x0f);
        let bb = if FIVE { Q5_K_BYTES } else { Q4_K_BYTES };
        let qs_off = if FIVE { 48 } else { 16 };
        let mut facc = [_mm256_setzero_ps(); R];
        let mut fmin = [_mm_setzero_ps(); R];
        for s in 0..nb {
            let b = w.add(s * bb);
            let dw = f16x1(b);
            let dmin = f16x1(b.add(2));
            let sm = k4_scales(b.add(4));
            let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(sm.as_ptr().add(8) as *const __m128i));
            let qh = if FIVE { ld(b.add(16)) } else { _mm256_setzero_si256() };
            let mut v = [_mm256_setzero_si256(); 8];
            let mut sc = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let q = ld(b.add(qs_off + 32 * c));
                v[2 * c] = _mm256_and_si256(q, m4);
                v[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                if FIVE {
                    // qh[l] bit j is the fifth bit of sub-block j.
                    let m10 = _mm256_set1_epi8(0x10);
                    let sh0 = _mm_cvtsi32_si128(4 - 2 * c as i32);
                    let h0 = if 2 * c <= 4 {
                        _mm256_sll_epi16(qh, sh0)
                    } else {
                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 - 4))
                    };
                    let h1 = if 2 * c < 4 {
                        _mm256_sll_epi16(qh, _mm_cvtsi32_si128(3 - 2 * c as i32))
                    } else {
                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 - 3))
                    };
                    v[2 * c] = _mm256_or_si256(v[2 * c], _mm256_and_si256(h0, m10));
                    v[2 * c + 1] = _mm256_or_si256(v[2 * c + 1], _mm256_and_si256(h1, m10));
                }
                sc[2 * c] = _mm256_set1_epi16(sm[2 * c] as i16);
                sc[2 * c + 1] = _mm256_set1_epi16(sm[2 * c + 1] as i16);
            }
            for r in 0..R {
                let ab = a[r].add(s * Q8_K_BYTES);
                let mut isum = _mm256_setzero_si256();
                for j in 0..8 {
                    let p = _mm256_maddubs_epi16(v[j], ld(ab.add(Q8K_QS + 32 * j)));
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, sc[j]));
                }
                let da = rdf(ab);
                facc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * da), facc[r]);
                let bs = _mm_loadu_si128(x[r].add(s * Q8_K_EXTRA) as *const __m128i);
                let prod = _mm_madd_epi16(mins, bs);
                fmin[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(prod), _mm_set1_ps(dmin * da), fmin[r]);
            }
        }
        let mut res = [0f32; R];
        for r in 0..R {
            let m = _mm_add_ps(fmin[r], _mm_movehl_ps(fmin[r], fmin[r]));
            let m = _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
            res[r] = hsum_ps(facc[r]) - m;
        }
        res
    }
}

struct Q6;

impl RowKernel for Q6 {
    const UNIT: usize = QK_K;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row<const R: usize>(w: *const u8, nb: usize, a: &[*const u8; R], x: &[*const u8; R]) -> [f32; R] {
        let _ = x;
        let m4 = _mm256_set1_epi8(0x0f);
        let m3 = _mm256_set1_epi8(0x30);
        let mut facc = [_mm256_setzero_ps(); R];
        for s in 0..nb {
            let b = w.add(s * Q6_K_BYTES);
            let dw = f16x1(b.add(208));
            let scales = _mm_loadu_si128(b.add(192) as *const __m128i);
            let sc16 = _mm256_cvtepi8_epi16(scales);
            // values in order: v[4h + q] = values 128h + 32q .. + 32
            let mut v = [_mm256_setzero_si256(); 8];
            for h in 0..2 {
                let l0 = ld(b.add(64 * h));
                let l1 = ld(b.add(64 * h + 32));
                let qh = ld(b.add(128 + 32 * h));
                v[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m3));
                v[4 * h + 1] =
                    _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m3));
                v[4 * h + 2] =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4), _mm256_and_si256(qh, m3));
                v[4 * h + 3] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m3),
                );
            }
            // Scale vector for the 32 values v[j]: sub-blocks 2j, 2j+1 (8 i16 lanes each, lanes 0..8 | 8..16).
            let mut sc = [_mm256_setzero_si256(); 8];
            for (j, scj) in sc.iter_mut().enumerate() {
                let lo = _mm_set1_epi16(_mm256_extract_epi16_dyn(sc16, 2 * j));
                let hi = _mm_set1_epi16(_mm256_extract_epi16_dyn(sc16, 2 * j + 1));
                *scj = _mm256_set_m128i(hi, lo);
            }
            for r in 0..R {
                let ab = a[r].add(s * Q8_K_BYTES);
                // -32 · Σ_j sc_j · bsum_j
                let corr = _mm256_madd_epi16(sc16, ld(ab.add(Q8K_BSUMS)));
                let mut isum = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(corr));
                for (j, vj) in v.iter().enumerate() {
                    let p = _mm256_maddubs_epi16(*vj, ld(ab.add(Q8K_QS + 32 * j)));
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, sc[j]));
                }
                facc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * rdf(ab)), facc[r]);
            }
        }
        let mut res = [0f32; R];
        for r in 0..R {
            res[r] = hsum_ps(facc[r]);
        }
        res
    }
}

/// Lane `i` (0..16) of a 256-bit vector of i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn _mm256_extract_epi16_dyn(v: __m256i, i: usize) -> i16 {
    let mut t = [0i16; 16];
    _mm256_storeu_si256(t.as_mut_ptr() as *mut __m256i, v);
    t[i]
}

/// The legacy 32-blocks: `unpack` gives the 32 unsigned values and the block's d (and m).
trait Legacy {
    const BYTES: usize;
    /// Q8_1 activations with a min term (`m·s`) instead of a zero point.
    const HAS_MIN: bool;
    /// Zero point subtracted from the unsigned values (0 with a min).
    const ZERO: i32;
    /// Signed values (Q8_0): the dot uses ggml's sign trick instead of a zero point.
    const SIGNED: bool = false;
    unsafe fn unpack(b: *const u8) -> (__m256i, f32, f32);
}

/// 16 bytes of nibbles -> [low nibbles (16 bytes), high nibbles (16 bytes)].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(q: *const u8) -> __m256i {
    let x = _mm_loadu_si128(q as *const __m128i);
    let v = _mm256_set_m128i(_mm_srli_epi16::<4>(x), x);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// 0x10 in byte j where bit j of the 32-bit mask at `h` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits_0x10(h: *const u8) -> __m256i {
    let m = (h as *const u32).read_unaligned() as i32;
    let rep = _mm256_shuffle_epi8(
        _mm256_set1_epi32(m),
        _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

struct L40;
struct L41;
struct L50;
struct L51;
struct L80;

impl Legacy for L40 {
    const BYTES: usize = Q4_0_BYTES;
    const HAS_MIN: bool = false;
    const ZERO: i32 = 8;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(b: *const u8) -> (__m256i, f32, f32) {
        (nibbles(b.add(2)), f16x1(b), 0.0)
    }
}

impl Legacy for L41 {
    const BYTES: usize = Q4_1_BYTES;
    const HAS_MIN: bool = true;
    const ZERO: i32 = 0;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(b: *const u8) -> (__m256i, f32, f32) {
        (nibbles(b.add(4)), f16x1(b), f16x1(b.add(2)))
    }
}

impl Legacy for L50 {
    const BYTES: usize = Q5_0_BYTES;
    const HAS_MIN: bool = false;
    const ZERO: i32 = 16;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(b: *const u8) -> (__m256i, f32, f32) {
        (_mm256_or_si256(nibbles(b.add(6)), bits_0x10(b.add(2))), f16x1(b), 0.0)
    }
}

impl Legacy for L51 {
    const BYTES: usize = Q5_1_BYTES;
    const HAS_MIN: bool = true;
    const ZERO: i32 = 0;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(b: *const u8) -> (__m256i, f32, f32) {
        (_mm256_or_si256(nibbles(b.add(8)), bits_0x10(b.add(4))), f16x1(b), f16x1(b.add(2)))
    }
}

impl Legacy for L80 {
    const BYTES: usize = Q8_0_BYTES;
    const HAS_MIN: bool = false;
    const ZERO: i32 = 0;
    const SIGNED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(b: *const u8) -> (__m256i, f32, f32) {
        (ld(b.add(2)), f16x1(b), 0.0)
    }
}

struct Leg<T: Legacy>(std::marker::PhantomData<T>);

impl<T: Legacy> RowKernel for Leg<T> {
    const UNIT: usize = QK;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row<const R: usize>(w: *const u8, nb: usize, a: &[*const u8; R], x: &[*const u8; R]) -> [f32; R] {
        let (ab, qo) = if T::HAS_MIN { (Q8_1_BYTES, 4) } else { (Q8_0_BYTES, 2) };
        // Two chains (even and odd blocks) per row, added at the end: one chain waits on the previous block's FMA
        // and scalar add every block, which bounded this kernel (Q8_0 ~11 GB/s on one core).
        let mut facc = [[_mm256_setzero_ps(); 2]; R];
        let mut fs = [[0f32; 2]; R];
        for i in 0..nb {
            let (q, dw, mw) = T::unpack(w.add(i * T::BYTES));
            let (qu, qs) = if T::SIGNED { (_mm256_sign_epi8(q, q), q) } else { (q, q) };
            for r in 0..R {
                let av = ld(a[r].add(i * ab + qo));
                let av = if T::SIGNED { _mm256_sign_epi8(av, qs) } else { av };
                let e = x[r].add(i * 8);
                let (da, extra) = if T::HAS_MIN {
                    (rdf(e), mw * rdf(e.add(4)))
                } else {
                    // Q8_0 trailer: (-Σa, d); the zero point adds -ZERO·Σa to the integer dot.
                    let da = rdf(e.add(4));
                    (da, dw * da * (T::ZERO * (e as *const i32).read_unaligned()) as f32)
                };
                let c = i % 2;
                facc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8i8(qu, av)), _mm256_set1_ps(dw * da), facc[r][c]);
                fs[r][c] += extra;
            }
        }
        let mut res = [0f32; R];
        for r in 0..R {
            res[r] = hsum_ps(_mm256_add_ps(facc[r][0], facc[r][1])) + (fs[r][0] + fs[r][1]);
        }
        res
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Float weights.

trait FloatW {
    const BYTES: usize;
    unsafe fn load8(p: *const u8) -> __m256;
    unsafe fn load1(p: *const u8) -> f32;
}

struct WF32;
struct WF16;
struct WBF16;

impl FloatW for WF32 {
    const BYTES: usize = 4;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p as *const f32)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load1(p: *const u8) -> f32 {
        rdf(p)
    }
}

impl FloatW for WF16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load1(p: *const u8) -> f32 {
        f16_to_f32((p as *const u16).read_unaligned())
    }
}

impl FloatW for WBF16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i))))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load1(p: *const u8) -> f32 {
        f32::from_bits(((p as *const u16).read_unaligned() as u32) << 16)
    }
}

struct Flt<W: FloatW>(std::marker::PhantomData<W>);

impl<W: FloatW> RowKernel for Flt<W> {
    const UNIT: usize = 1;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row<const R: usize>(w: *const u8, k: usize, a: &[*const u8; R], _x: &[*const u8; R]) -> [f32; R] {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut i = 0;
        while i + 16 <= k {
            let w0 = W::load8(w.add(W::BYTES * i));
            let w1 = W::load8(w.add(W::BYTES * (i + 8)));
            for r in 0..R {
                acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a[r].add(4 * i) as *const f32), acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a[r].add(4 * i + 32) as *const f32), acc[r][1]);
            }
            i += 16;
        }
        let mut res = [0f32; R];
        for r in 0..R {
            res[r] = hsum_ps(_mm256_add_ps(acc[r][0], acc[r][1]));
            for j in i..k {
                res[r] += W::load1(w.add(W::BYTES * j)) * rdf(a[r].add(4 * j));
            }
        }
        res
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Driver.

/// Rows per block: each group of activation rows re-reads a block of weight rows from L1/L2.
const ROW_BLOCK: usize = 32;

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_group<T: RowKernel, const R: usize>(
    w: *const u8,
    rb: usize,
    nb: usize,
    rows: Range<usize>,
    a0: *const u8,
    xoff: usize,
    act_rb: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut a = [a0; R];
    let mut x = [a0; R];
    for r in 0..R {
        a[r] = a0.add(r * act_rb);
        x[r] = a[r].add(xoff);
    }
    for row in rows {
        let v = T::row::<R>(w.add(row * rb), nb, &a, &x);
        for (t, val) in v.iter().enumerate() {
            *out.add(t * ldo + row) = *val;
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn drive<T: RowKernel>(
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
    let nb = k / T::UNIT;
    let rb = wty.row_bytes(k).expect("INVARIANT: checked by the caller");
    let xoff = act_format(wty).ggml_row_bytes(k);
    let ng = m.div_ceil(4);
    let mut r0 = rows.start;
    while r0 < rows.end {
        let r1 = (r0 + ROW_BLOCK).min(rows.end);
        let mut t = 0;
        for g in 0..ng {
            let gs = (m - t).div_ceil(ng - g);
            let a0 = acts.as_ptr().add(t * act_rb);
            let o = out.add(t * ldo);
            match gs {
                1 => rows_group::<T, 1>(w.as_ptr(), rb, nb, r0..r1, a0, xoff, act_rb, o, ldo),
                2 => rows_group::<T, 2>(w.as_ptr(), rb, nb, r0..r1, a0, xoff, act_rb, o, ldo),
                3 => rows_group::<T, 3>(w.as_ptr(), rb, nb, r0..r1, a0, xoff, act_rb, o, ldo),
                _ => rows_group::<T, 4>(w.as_ptr(), rb, nb, r0..r1, a0, xoff, act_rb, o, ldo),
            }
            t += gs;
        }
        r0 = r1;
    }
}

fn act_format(wty: GgmlType) -> ActFormat {
    super::act_format(wty).expect("INVARIANT: checked by the caller")
}

/// # Safety
/// As `super::matmul_rows`, plus the CPU features of [`supported`].
#[target_feature(enable = "avx2,fma,f16c")]
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
    match wty {
        Q4_K => drive::<K4<false>>(wty, w, k, rows, acts, act_rb, m, out, ldo),
        Q5_K => drive::<K4<true>>(wty, w, k, rows, acts, act_rb, m, out, ldo),
        Q6_K => drive::<Q6>(wty, w, k, rows, acts, act_rb, m, out, ldo),
        Q4_0 => drive::<Leg<L40>>(wty, w, k, rows, acts, act_rb, m, out, ldo),
        Q4_1 => drive::<Leg<L41>>(wty, w, k, rows, acts, act_rb, m, out, ldo),
        Q5_0 => drive::<Leg<L50>>(wty, w, k, rows, acts, act_rb, m, out, ldo),
        Q5_1 => drive::<Leg<L51>>(wty, w, k, rows, acts, act_rb, m, out, ldo),
        Q8_0 => drive::<Leg<L80>>(wty, w, k, rows, acts, act_rb, m, out, ldo),
        F32 => drive::<Flt<WF32>>(wty, w, k, rows, acts, act_rb, m, out, ldo),
        F16 => drive::<Flt<WF16>>(wty, w, k, rows, acts, act_rb, m, out, ldo),
        BF16 => drive::<Flt<WBF16>>(wty, w, k, rows, acts, act_rb, m, out, ldo),
        _ => super::scalar::matmul_rows(wty, w, k, rows, acts, act_rb, m, out, ldo),
    }
}
