//! f32 vector primitives with runtime SIMD dispatch (AVX-512, AVX2+F16C/FMA, portable fallback): SwiGLU and f16
//! rounding. The portable versions are branch-free loops the compiler vectorizes; the x86 versions are the same code
//! compiled with wider target features (or explicit conversion intrinsics), chosen once at start.

use std::sync::OnceLock;

#[derive(Clone, Copy)]
struct Table {
    silu_mul: fn(&mut [f32], &[f32]),
    round_to_f16: fn(&mut [f32]),
}

fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let forced = std::env::var("SPLASH_CPU_KERNELS").unwrap_or_default();
            if forced != "scalar" && forced != "avx2" && std::is_x86_feature_detected!("avx512f") {
                return Table { silu_mul: x86::silu_mul_avx512, round_to_f16: x86::round_to_f16_avx512 };
            }
            if forced != "scalar"
                && std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                return Table { silu_mul: x86::silu_mul_avx2, round_to_f16: x86::round_to_f16_f16c };
            }
        }
        Table { silu_mul: silu_mul_portable, round_to_f16: round_to_f16_portable }
    })
}

pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    (table().silu_mul)(gate, up)
}

/// `e^x` for the range SwiGLU needs: Cephes' `expf` (x = n ln2 + r, a degree-6 polynomial in r, scaled by 2^n),
/// written without branches so loops over it vectorize. Inputs are clamped to where the result is finite.
#[inline(always)]
pub(crate) fn exp_approx(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    exp_reduced(x, (x * std::f32::consts::LOG2_E + 0.5).floor())
}

/// `e^x` for `x` in [-87, 0] with the same polynomial, rounding `x / ln 2` by a truncating conversion instead of
/// `floor` (which baseline x86-64 has no vector instruction for), so loops over it vectorize without AVX.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    let x = x.clamp(-87.0, 0.0);
    // Truncating `t` (negative) rounds it up: this is the integer nearest to x / ln 2. Done as round-to-nearest by
    // adding and taking away 1.5 * 2^23, then up by one where that went down (a cast would not vectorize; see below).
    let t = x * std::f32::consts::LOG2_E - 0.5;
    let r = (t + 12_582_912.0) - 12_582_912.0;
    exp_reduced(x, if r < t { r + 1.0 } else { r })
}

/// `e^x` given `n`, an integer near `x / ln 2`: `2^n · e^r` with `r = x - n ln 2` (in two parts for precision).
#[inline(always)]
fn exp_reduced(x: f32, n: f32) -> f32 {
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.0e-1;
    let y = p * r * r + r + 1.0;
    // 2^n, n an integer in [-126, 127]: adding 1.5 * 2^23 puts n in the low mantissa bits exactly. (`n as i32` is
    // Rust's saturating cast, which LLVM turned into one scalar conversion per lane: SwiGLU ran at 1.2 ns/element.)
    let n_bits = (n + 12_582_912.0).to_bits().wrapping_sub(0x4B40_0000);
    y * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

fn silu_mul_portable(gate: &mut [f32], up: &[f32]) {
    silu_mul_generic(gate, up)
}

#[inline(always)]
fn silu_mul_generic(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp_approx(-*g)) * u;
    }
}

/// Rounds every value to the nearest f16 (what storing into an f16 buffer and reading back gives).
#[inline]
pub fn round_to_f16(x: &mut [f32]) {
    (table().round_to_f16)(x)
}

fn round_to_f16_portable(x: &mut [f32]) {
    for v in x {
        *v = half::f16::from_f32(*v).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    // Without the feature the loop is built for baseline x86-64: `floor` becomes a call to libm's `floorf` per
    // element, which cost 3-6% of a 5-row decode pass of the 1.5B.
    #[target_feature(enable = "avx512f")]
    unsafe fn silu_mul_512(gate: &mut [f32], up: &[f32]) {
        super::silu_mul_generic(gate, up)
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn silu_mul_256(gate: &mut [f32], up: &[f32]) {
        super::silu_mul_generic(gate, up)
    }
    #[target_feature(enable = "avx512f")]
    unsafe fn round_to_f16_512(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(16);
        for c in &mut chunks {
            // SAFETY: the chunk holds exactly 16 floats.
            unsafe {
                let v = _mm512_loadu_ps(c.as_ptr());
                let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                _mm512_storeu_ps(c.as_mut_ptr(), _mm512_cvtph_ps(h));
            }
        }
        super::round_to_f16_portable(chunks.into_remainder());
    }
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn round_to_f16_256(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: the chunk holds exactly 8 floats.
            unsafe {
                let v = _mm256_loadu_ps(c.as_ptr());
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
        super::round_to_f16_portable(chunks.into_remainder());
    }
    pub fn round_to_f16_avx512(x: &mut [f32]) {
        unsafe { round_to_f16_512(x) }
    }
    pub fn round_to_f16_f16c(x: &mut [f32]) {
        unsafe { round_to_f16_256(x) }
    }

    // SAFETY (all four): installed only after the features were detected at run time.
    pub fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) {
        unsafe { silu_mul_512(gate, up) }
    }
    pub fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
        unsafe { silu_mul_256(gate, up) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn round_to_f16_matches_half() {
        let mut x: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 1.37e-3 + (i as f32).sin() * 3e4).collect();
        x.extend([0.0, -0.0, 65504.0, 70000.0, 1e-8, f32::INFINITY, 2.0f32.powi(-15) * 1.5]);
        let want: Vec<u32> = x.iter().map(|&v| half::f16::from_f32(v).to_f32().to_bits()).collect();
        round_to_f16(&mut x);
        assert_eq!(x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
    }

    #[test]
    fn exp_scales_without_a_cast_are_the_casts_bits() {
        // The exponent's integer and 2^n built from float bits give exactly what the float-to-int casts gave.
        let cast_exp = |x: f32, n: f32| -> f32 {
            let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
            let mut p = 1.987_569_1e-4f32;
            for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.0e-1] {
                p = p * r + c;
            }
            (p * r * r + r + 1.0) * f32::from_bits(((n as i32 + 127) << 23) as u32)
        };
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let grid = (-8800..=8900).map(|i| i as f32 * 0.01);
        let random = (0..100_000).map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 180.0 - 90.0
        });
        for x in grid.chain(random).chain([-87.0, 88.0, 0.0, -0.5 * std::f32::consts::LN_2]) {
            let c = x.clamp(-87.0, 88.0);
            let n = (c * std::f32::consts::LOG2_E + 0.5).floor();
            assert_eq!(exp_approx(x).to_bits(), cast_exp(c, n).to_bits(), "exp_approx({x})");
            let c = x.clamp(-87.0, 0.0);
            let n = ((c * std::f32::consts::LOG2_E - 0.5) as i32) as f32;
            assert_eq!(exp_nonpositive(x).to_bits(), cast_exp(c, n).to_bits(), "exp_nonpositive({x})");
        }
    }

    #[test]
    fn silu_mul_matches_libm() {
        let xs: Vec<f32> = (-2000..2000).map(|i| i as f32 * 0.05).chain([-1e4, 1e4, -88.5, 89.0, 0.0]).collect();
        let up: Vec<f32> = xs.iter().map(|x| 1.0 + x.abs() * 0.01).collect();
        let mut g = xs.clone();
        silu_mul(&mut g, &up);
        for ((x, u), got) in xs.iter().zip(&up).zip(&g) {
            let want = (*x as f64 / (1.0 + (-*x as f64).exp())) * *u as f64;
            assert!((*got as f64 - want).abs() <= 4e-7 * want.abs().max(1e-3), "silu({x}): {got} vs {want}");
        }
    }
}
