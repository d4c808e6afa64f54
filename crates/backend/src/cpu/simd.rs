//! f32 vector primitives with runtime SIMD dispatch (AVX-512, AVX2+FMA, portable fallback).
//!
//! The portable versions are written with independent accumulators so the compiler vectorizes them; the x86 versions
//! are the same code compiled with wider target features, chosen once at start.

use std::sync::OnceLock;

#[derive(Clone, Copy)]
struct Table {
    dot: fn(&[f32], &[f32]) -> f32,
    axpy: fn(&mut [f32], f32, &[f32]),
    dot_f16: fn(&[f32], &[u16]) -> f32,
    axpy_f16: fn(&mut [f32], f32, &[u16]),
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
                return Table {
                    dot: x86::dot_avx512,
                    axpy: x86::axpy_avx512,
                    dot_f16: x86::dot_f16_avx512,
                    axpy_f16: x86::axpy_f16_avx512,
                    silu_mul: x86::silu_mul_avx512,
                    round_to_f16: x86::round_to_f16_avx512,
                };
            }
            if forced != "scalar"
                && std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                return Table {
                    dot: x86::dot_avx2,
                    axpy: x86::axpy_avx2,
                    dot_f16: x86::dot_f16_avx2,
                    axpy_f16: x86::axpy_f16_avx2,
                    silu_mul: x86::silu_mul_avx2,
                    round_to_f16: x86::round_to_f16_f16c,
                };
            }
        }
        Table {
            dot: dot_portable,
            axpy: axpy_portable,
            dot_f16: dot_f16_portable,
            axpy_f16: axpy_f16_portable,
            silu_mul: silu_mul_portable,
            round_to_f16: round_to_f16_portable,
        }
    })
}

/// `sum(a[i] * b[i])` over the shorter length.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    (table().dot)(a, b)
}

/// `y[i] += alpha * x[i]`.
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    (table().axpy)(y, alpha, x)
}

/// `a * b + c`, fused only where the target has FMA (a software fma would be far slower than two operations).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `sum(a[i] * b[i])` with `b` in IEEE half precision (raw bits), accumulated in f32.
#[inline]
pub fn dot_f16(a: &[f32], b: &[u16]) -> f32 {
    (table().dot_f16)(a, b)
}

/// `y[i] += alpha * x[i]` with `x` in IEEE half precision (raw bits).
#[inline]
pub fn axpy_f16(y: &mut [f32], alpha: f32, x: &[u16]) {
    (table().axpy_f16)(y, alpha, x)
}

/// In place `gate[i] = silu(gate[i]) * up[i]` (SwiGLU), with a vectorizable exp accurate to ~2 ulp.
#[inline]
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    (table().silu_mul)(gate, up)
}

/// `e^x` for the range SwiGLU needs: Cephes' `expf` (x = n ln2 + r, a degree-6 polynomial in r, scaled by 2^n),
/// written without branches so loops over it vectorize. Inputs are clamped to where the result is finite.
#[inline(always)]
fn exp_approx(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.0e-1;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
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

fn dot_f16_portable(a: &[f32], b: &[u16]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * half::f16::from_bits(*y).to_f32()).sum()
}

fn axpy_f16_portable(y: &mut [f32], alpha: f32, x: &[u16]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * half::f16::from_bits(*x).to_f32();
    }
}

#[inline(always)]
fn dot_generic<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 32;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; L];
    let mut ca = a.chunks_exact(L);
    let mut cb = b.chunks_exact(L);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..L {
            acc[i] = madd::<FMA>(x[i], y[i], acc[i]);
        }
    }
    let mut s = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s = madd::<FMA>(*x, *y, s);
    }
    // Pairwise reduction keeps rounding close to a tree sum.
    let mut w = L;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0] + s
}

#[inline(always)]
fn axpy_generic<const FMA: bool>(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y = madd::<FMA>(alpha, *x, *y);
    }
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    dot_generic::<false>(a, b)
}

fn axpy_portable(y: &mut [f32], alpha: f32, x: &[f32]) {
    axpy_generic::<false>(y, alpha, x)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    unsafe fn dot_f16_512(a: &[f32], b: &[u16]) -> f32 {
        let n = a.len().min(b.len());
        let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = 0;
        while i + 32 <= n {
            // SAFETY: i + 32 <= n bounds both loads.
            unsafe {
                let b0 = _mm512_cvtph_ps(_mm256_loadu_si256(b.as_ptr().add(i) as *const __m256i));
                let b1 = _mm512_cvtph_ps(_mm256_loadu_si256(b.as_ptr().add(i + 16) as *const __m256i));
                acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a.as_ptr().add(i)), b0, acc0);
                acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a.as_ptr().add(i + 16)), b1, acc1);
            }
            i += 32;
        }
        let mut s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
        while i < n {
            s += a[i] * half::f16::from_bits(b[i]).to_f32();
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn axpy_f16_512(y: &mut [f32], alpha: f32, x: &[u16]) {
        let n = y.len().min(x.len());
        let va = _mm512_set1_ps(alpha);
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n bounds the loads and the store.
            unsafe {
                let xv = _mm512_cvtph_ps(_mm256_loadu_si256(x.as_ptr().add(i) as *const __m256i));
                let yp = y.as_mut_ptr().add(i);
                _mm512_storeu_ps(yp, _mm512_fmadd_ps(va, xv, _mm512_loadu_ps(yp)));
            }
            i += 16;
        }
        while i < n {
            y[i] += alpha * half::f16::from_bits(x[i]).to_f32();
            i += 1;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_f16_256(a: &[f32], b: &[u16]) -> f32 {
        let n = a.len().min(b.len());
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n bounds both loads.
            unsafe {
                let b0 = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i) as *const __m128i));
                let b1 = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i + 8) as *const __m128i));
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), b0, acc0);
                acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i + 8)), b1, acc1);
            }
            i += 16;
        }
        let acc = _mm256_add_ps(acc0, acc1);
        let mut lanes = [0f32; 8];
        // SAFETY: lanes holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
        let mut s: f32 = lanes.iter().sum();
        while i < n {
            s += a[i] * half::f16::from_bits(b[i]).to_f32();
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy_f16_256(y: &mut [f32], alpha: f32, x: &[u16]) {
        let n = y.len().min(x.len());
        let va = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n bounds the loads and the store.
            unsafe {
                let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i) as *const __m128i));
                let yp = y.as_mut_ptr().add(i);
                _mm256_storeu_ps(yp, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(yp)));
            }
            i += 8;
        }
        while i < n {
            y[i] += alpha * half::f16::from_bits(x[i]).to_f32();
            i += 1;
        }
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
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

    // SAFETY (all four above and these two): installed only after the features were detected at run time.
    pub fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) {
        unsafe { silu_mul_512(gate, up) }
    }
    pub fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
        unsafe { silu_mul_256(gate, up) }
    }

    // SAFETY (all four): the table only installs these after detecting the features at run time.
    pub fn dot_f16_avx512(a: &[f32], b: &[u16]) -> f32 {
        unsafe { dot_f16_512(a, b) }
    }
    pub fn axpy_f16_avx512(y: &mut [f32], alpha: f32, x: &[u16]) {
        unsafe { axpy_f16_512(y, alpha, x) }
    }
    pub fn dot_f16_avx2(a: &[f32], b: &[u16]) -> f32 {
        unsafe { dot_f16_256(a, b) }
    }
    pub fn axpy_f16_avx2(y: &mut [f32], alpha: f32, x: &[u16]) {
        unsafe { axpy_f16_256(y, alpha, x) }
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn dot_512(a: &[f32], b: &[f32]) -> f32 {
        super::dot_generic::<true>(a, b)
    }
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn axpy_512(y: &mut [f32], alpha: f32, x: &[f32]) {
        super::axpy_generic::<true>(y, alpha, x)
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_256(a: &[f32], b: &[f32]) -> f32 {
        super::dot_generic::<true>(a, b)
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn axpy_256(y: &mut [f32], alpha: f32, x: &[f32]) {
        super::axpy_generic::<true>(y, alpha, x)
    }
    // SAFETY (all four): the table only installs these after detecting the features at run time.
    pub fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
        unsafe { dot_512(a, b) }
    }
    pub fn axpy_avx512(y: &mut [f32], alpha: f32, x: &[f32]) {
        unsafe { axpy_512(y, alpha, x) }
    }
    pub fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        unsafe { dot_256(a, b) }
    }
    pub fn axpy_avx2(y: &mut [f32], alpha: f32, x: &[f32]) {
        unsafe { axpy_256(y, alpha, x) }
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

    #[test]
    fn dot_and_axpy_match_scalar() {
        for n in [0, 1, 7, 31, 32, 33, 64, 100, 1000] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.3).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-3, "n={n}");
            let mut y = b.clone();
            axpy(&mut y, 0.5, &a);
            for i in 0..n {
                assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
            }
            let bh: Vec<u16> = b.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
            let bf: Vec<f32> = bh.iter().map(|&v| half::f16::from_bits(v).to_f32()).collect();
            let want: f64 = a.iter().zip(&bf).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot_f16(&a, &bh) as f64 - want).abs() < 1e-3, "n={n}");
            let mut y = a.clone();
            axpy_f16(&mut y, -2.0, &bh);
            for i in 0..n {
                assert!((y[i] - (a[i] - 2.0 * bf[i])).abs() < 1e-5);
            }
        }
    }
}
