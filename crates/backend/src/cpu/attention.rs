//! Causal grouped-query attention over a KV cache, on the CPU.
//!
//! In: query rows `[m, num_heads * head_dim]` and, for each query row, the keys and values it may see (its sequence's
//! cache up to and including its own position). Out: `[m, num_heads * head_dim]`. Query heads that share a KV head
//! are processed together so each key and value row is read once per group.

use super::{ThreadPool, ops, simd};

/// The KV cache rows one query row attends to: `num_keys` rows of `[num_kv_heads * head_dim]` each.
#[derive(Clone, Copy)]
pub struct KvRows<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
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
        for task in tasks {
            let (t, g) = (task / num_kv_heads, task % num_kv_heads);
            let kv = rows[t];
            let n = kv.num_keys;
            scores.clear();
            scores.resize(group * n, 0.0);
            for h in 0..group {
                let head = g * group + h;
                let qh = &q[t * q_dim + head * head_dim..][..head_dim];
                let s = &mut scores[h * n..(h + 1) * n];
                for (j, sj) in s.iter_mut().enumerate() {
                    *sj = simd::dot(qh, &kv.k[j * kv_dim + g * head_dim..][..head_dim]) * scale;
                }
                ops::softmax(s);
            }
            for h in 0..group {
                let head = g * group + h;
                // SAFETY: (t, head) is written by this task alone.
                let oh = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(t * q_dim + head * head_dim), head_dim) };
                oh.fill(0.0);
                let s = &scores[h * n..(h + 1) * n];
                for (j, &p) in s.iter().enumerate() {
                    simd::axpy(oh, p, &kv.v[j * kv_dim + g * head_dim..][..head_dim]);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Straightforward f64 attention for one query row.
    fn reference(shape: AttnShape, q: &[f32], kv: KvRows<'_>) -> Vec<f64> {
        let (hd, kvd) = (shape.head_dim, shape.num_kv_heads * shape.head_dim);
        let group = shape.num_heads / shape.num_kv_heads;
        let mut out = vec![0f64; shape.num_heads * hd];
        for h in 0..shape.num_heads {
            let g = h / group;
            let s: Vec<f64> = (0..kv.num_keys)
                .map(|j| (0..hd).map(|d| q[h * hd + d] as f64 * kv.k[j * kvd + g * hd + d] as f64).sum::<f64>() * shape.scale as f64)
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for j in 0..kv.num_keys {
                for d in 0..hd {
                    out[h * hd + d] += e[j] / z * kv.v[j * kvd + g * hd + d] as f64;
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
        let k: Vec<f32> = (0..n * kvd).map(|i| f(i, 1.0)).collect();
        let v: Vec<f32> = (0..n * kvd).map(|i| f(i + 7, 2.0)).collect();
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
                assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
    }
}
