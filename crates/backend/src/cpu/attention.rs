//! Causal grouped-query attention over a KV cache, on the CPU.
//!
//! In: query rows `[m, num_heads * head_dim]` and, for each query row, the keys and values it may see (its sequence's
//! cache up to and including its own position). Out: `[m, num_heads * head_dim]`. Query heads that share a KV head
//! are processed together so each key and value row is read once per group.
//!
//! The cache holds f16 values. As in llama.cpp's (non flash-attention) CPU path, queries are rounded to f16 before
//! the key dot products and attention weights are rounded to f16 before they multiply the values; doing the same
//! keeps our tokens identical to llama.cpp's where the two are near a tie.

use super::{ThreadPool, ops, simd};

/// The KV cache rows one query row attends to: `num_keys` rows of `[num_kv_heads * head_dim]` f16 values each.
#[derive(Clone, Copy)]
pub struct KvRows<'a> {
    pub k: &'a [u16],
    pub v: &'a [u16],
    pub num_keys: usize,
}

#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes the output of its own (row, head group) only.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

pub fn attention(pool: &ThreadPool, shape: AttnShape, q: &[f32], rows: &[KvRows<'_>], out: &mut [f32]) {
    let AttnShape { num_heads, num_kv_heads, head_dim, scale } = shape;
    let q_dim = num_heads * head_dim;
    let kv_dim = num_kv_heads * head_dim;
    let group = num_heads / num_kv_heads;
    let m = rows.len();
    assert!(q.len() >= m * q_dim && out.len() >= m * q_dim);
    let out_ptr = OutPtr(out.as_mut_ptr());
    pool.for_each_chunk(m * num_kv_heads, 1, &|tasks| {
        let out_ptr = out_ptr;
        let mut scores: Vec<f32> = Vec::new();
        let mut qh = vec![0f32; head_dim];
        for task in tasks {
            let (t, g) = (task / num_kv_heads, task % num_kv_heads);
            let kv = rows[t];
            let n = kv.num_keys;
            scores.clear();
            scores.resize(group * n, 0.0);
            for h in 0..group {
                let head = g * group + h;
                qh.copy_from_slice(&q[t * q_dim + head * head_dim..][..head_dim]);
                simd::round_to_f16(&mut qh);
                let s = &mut scores[h * n..(h + 1) * n];
                for (j, sj) in s.iter_mut().enumerate() {
                    *sj = simd::dot_f16(&qh, &kv.k[j * kv_dim + g * head_dim..][..head_dim]) * scale;
                }
                ops::softmax(s);
                simd::round_to_f16(s);
            }
            for h in 0..group {
                let head = g * group + h;
                // SAFETY: (t, head) is written by this task alone.
                let oh = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(t * q_dim + head * head_dim), head_dim) };
                oh.fill(0.0);
                let s = &scores[h * n..(h + 1) * n];
                for (j, &p) in s.iter().enumerate() {
                    simd::axpy_f16(oh, p, &kv.v[j * kv_dim + g * head_dim..][..head_dim]);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16(bits: u16) -> f64 {
        half::f16::from_bits(bits).to_f64()
    }

    /// Straightforward f64 attention for one query row (f16 rounding of q and weights aside).
    fn reference(shape: AttnShape, q: &[f32], kv: KvRows<'_>) -> Vec<f64> {
        let (hd, kvd) = (shape.head_dim, shape.num_kv_heads * shape.head_dim);
        let group = shape.num_heads / shape.num_kv_heads;
        let mut out = vec![0f64; shape.num_heads * hd];
        for h in 0..shape.num_heads {
            let g = h / group;
            let s: Vec<f64> = (0..kv.num_keys)
                .map(|j| (0..hd).map(|d| q[h * hd + d] as f64 * f16(kv.k[j * kvd + g * hd + d])).sum::<f64>() * shape.scale as f64)
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for j in 0..kv.num_keys {
                for d in 0..hd {
                    out[h * hd + d] += e[j] / z * f16(kv.v[j * kvd + g * hd + d]);
                }
            }
        }
        out
    }

    #[test]
    fn matches_reference_gqa() {
        let shape = AttnShape { num_heads: 6, num_kv_heads: 2, head_dim: 16, scale: 0.25 };
        let n = 9;
        let kvd = 32;
        let f = |i: usize, s: f32| ((i * 2654435761 % 1000) as f32 / 500.0 - 1.0) * s;
        let h = |x: f32| half::f16::from_f32(x).to_bits();
        let k: Vec<u16> = (0..n * kvd).map(|i| h(f(i, 1.0))).collect();
        let v: Vec<u16> = (0..n * kvd).map(|i| h(f(i + 7, 2.0))).collect();
        let m = 3;
        let q: Vec<f32> = (0..m * 96).map(|i| f(i + 3, 1.5)).collect();
        // Causal: row t sees n - m + t + 1 keys.
        let rows: Vec<KvRows> = (0..m).map(|t| KvRows { k: &k, v: &v, num_keys: n - m + t + 1 }).collect();
        let mut out = vec![f32::NAN; m * 96];
        let pool = ThreadPool::new(2);
        attention(&pool, shape, &q, &rows, &mut out);
        for t in 0..m {
            let want = reference(shape, &q[t * 96..(t + 1) * 96], rows[t]);
            for (a, b) in out[t * 96..(t + 1) * 96].iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 2e-3 * b.abs().max(1.0), "{a} vs {b}");
            }
        }
    }
}
