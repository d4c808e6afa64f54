//! Elementwise and per-row operations of a transformer layer. Rows are contiguous `[num_rows, dim]` buffers.

/// `out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight`, for every row of length `weight.len()`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        // As ggml: f32 products summed in f64.
        let sum: f64 = xr.iter().map(|&v| (v * v) as f64).sum();
        let scale = 1.0 / ((sum / dim as f64) as f32 + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// The zero-centred RMSNorm: `out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * (1 + weight)` (the file stores `w - 1`).
pub fn rms_norm_one_plus(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let sum: f64 = xr.iter().map(|&v| (v * v) as f64).sum();
        let scale = 1.0 / ((sum / dim as f64) as f32 + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * (1.0 + w);
        }
    }
}

/// [`rms_norm`] (or [`rms_norm_one_plus`]) in place, with the same numbers.
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32, one_plus: bool) {
    let dim = weight.len();
    for xr in x.chunks_exact_mut(dim) {
        let sum: f64 = xr.iter().map(|&v| (v * v) as f64).sum();
        let scale = 1.0 / ((sum / dim as f64) as f32 + eps).sqrt();
        for (v, &w) in xr.iter_mut().zip(weight) {
            *v = if one_plus { *v * scale * (1.0 + w) } else { *v * scale * w };
        }
    }
}

/// In place: `x[r] += bias` for every row of length `bias.len()`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// In place: `x += y`.
pub fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// In place: `gate = silu(gate) * up` (SwiGLU).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    super::simd::silu_mul(gate, up)
}

pub use crate::RopeStyle;

/// Precomputed inverse frequencies for rotary embeddings over the first `rope_dim` dims of each head.
#[derive(Debug, Clone)]
pub struct Rope {
    pub style: RopeStyle,
    pub head_dim: usize,
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(style: RopeStyle, head_dim: usize, rope_dim: usize, theta: f32) -> Self {
        let half = rope_dim / 2;
        // theta_i = base^(-2i/d), computed as ggml does: a running product of base^(-2/d).
        let step = theta.powf(-2.0 / rope_dim as f32);
        let mut inv_freq = Vec::with_capacity(half);
        let mut f = 1.0f32;
        for _ in 0..half {
            inv_freq.push(f);
            f *= step;
        }
        Rope { style, head_dim, inv_freq }
    }

    /// Rotates every head of `x` (`[num_heads, head_dim]`) for position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        let cs: Vec<(f32, f32)> =
            self.inv_freq.iter().map(|&f| (pos as f32 * f).sin_cos()).map(|(s, c)| (c, s)).collect();
        for head in x.chunks_exact_mut(self.head_dim) {
            match self.style {
                RopeStyle::Neox => {
                    let rope_dim = 2 * half;
                    for (i, &(c, s)) in cs.iter().enumerate() {
                        let (a, b) = (head[i], head[i + rope_dim / 2]);
                        head[i] = a * c - b * s;
                        head[i + rope_dim / 2] = a * s + b * c;
                    }
                }
                RopeStyle::Interleaved => {
                    for (i, &(c, s)) in cs.iter().enumerate() {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * c - b * s;
                        head[2 * i + 1] = a * s + b * c;
                    }
                }
            }
        }
    }
}

/// `Σ e^(x[i] - shift)` for `shift` at least every `x[i]` (softmax's denominator when `shift` is the maximum), with
/// an approximate `exp` (relative error ~1e-7) summed in 16 lanes so the loop vectorizes: ~20 µs for a 32K-entry
/// row. For confidences, not for sampling.
pub fn sum_exp(x: &[f32], shift: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the feature was just detected.
        return unsafe { sum_exp_avx512(x, shift) };
    }
    sum_exp_lanes(x, shift)
}

/// [`sum_exp_lanes`] compiled for AVX-512 (the same operations in the same order, 16 lanes at once).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_exp_avx512(x: &[f32], shift: f32) -> f32 {
    sum_exp_lanes(x, shift)
}

#[inline(always)]
fn sum_exp_lanes(x: &[f32], shift: f32) -> f32 {
    use super::simd::exp_nonpositive;
    let mut lanes = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += exp_nonpositive(v - shift);
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|&v| exp_nonpositive(v - shift)).sum();
    lanes.iter().sum::<f32>() + tail
}

/// In place softmax of `x`.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_pairs_and_keeps_norm() {
        let rope = Rope::new(RopeStyle::Neox, 8, 8, 10000.0);
        let mut x: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
        let norm0: f32 = x.iter().map(|v| v * v).sum();
        rope.apply(&mut x, 7);
        let norm1: f32 = x.iter().map(|v| v * v).sum();
        assert!((norm0 - norm1).abs() < 1e-4);
        // Position 0 is the identity.
        let mut y: Vec<f32> = (0..16).map(|i| i as f32).collect();
        rope.apply(&mut y, 0);
        assert_eq!(y, (0..16).map(|i| i as f32).collect::<Vec<_>>());
        // Neox pairs dim 0 with dim 4: at pos p, freq 1, (1, 0) -> (cos p, sin p).
        let mut z = vec![0f32; 8];
        z[0] = 1.0;
        rope.apply(&mut z, 3);
        assert!((z[0] - 3f32.cos()).abs() < 1e-6 && (z[4] - 3f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn sum_exp_matches_f64() {
        for n in [0usize, 1, 15, 16, 17, 1000, 32768] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 0.03 - 25.0).collect();
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let want: f64 = x.iter().map(|&v| (v as f64 - max as f64).exp()).sum();
            let got = sum_exp(&x, max) as f64;
            assert!((got - want).abs() <= 1e-5 * want.max(1e-30), "n={n}: {got} vs {want}");
        }
        // Far below the maximum: underflows to zero rather than wrapping the exponent.
        assert_eq!(sum_exp(&[-1000.0, 0.0], 0.0), 1.0);
    }

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, -4.0];
        let w = [1.0f32, 0.5, 2.0, 1.0];
        let mut out = [0f32; 4];
        rms_norm(&x, &w, 1e-6, &mut out);
        let rms = ((1.0 + 4.0 + 9.0 + 16.0) / 4.0f32 + 1e-6).sqrt();
        for i in 0..4 {
            assert!((out[i] - x[i] / rms * w[i]).abs() < 1e-6);
        }
    }
}
