//! f32 vector primitives with runtime SIMD dispatch (AVX-512, AVX2+FMA, portable fallback).
//!
//! The portable versions are written with independent accumulators so the compiler vectorizes them; the x86 versions
//! are the same code compiled with wider target features, chosen once at start.

use std::sync::OnceLock;

#[derive(Clone, Copy)]
struct Table {
    dot: fn(&[f32], &[f32]) -> f32,
    axpy: fn(&mut [f32], f32, &[f32]),
}

fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let forced = std::env::var("SPLASH_CPU_KERNELS").unwrap_or_default();
            if forced != "scalar" && forced != "avx2" && std::is_x86_feature_detected!("avx512f") {
                return Table { dot: x86::dot_avx512, axpy: x86::axpy_avx512 };
            }
            if forced != "scalar" && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Table { dot: x86::dot_avx2, axpy: x86::axpy_avx2 };
            }
        }
        Table { dot: dot_portable, axpy: axpy_portable }
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
        }
    }
}
