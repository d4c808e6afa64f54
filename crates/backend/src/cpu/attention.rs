//! Causal grouped-query attention over a KV cache, on the CPU.
//!
//! In: query rows `[m, num_heads * head_dim]`, grouped by sequence: each [`SeqAttn`] names a run of consecutive query
//! rows of one sequence (a prefill chunk, one decode token, or k+1 rows to verify) and that sequence's cache, which
//! already holds the keys and values of those rows. Out: `[m, num_heads * head_dim]`.
//!
//! Flash-attention style: a task is a tile of up to [`ROW_BLOCK`] rows of one sequence and one KV head, with the
//! query heads that share that KV head as extra tile rows. The tile walks the keys in blocks of [`KEY_BLOCK`]: each
//! block's keys and values are converted from f16 once for the whole tile, and each query vector keeps a running
//! maximum, sum and output (online softmax), so nothing of size `num_keys` is materialised and the working set stays
//! in L2.
//!
//! Batch invariance: key blocks start at absolute multiples of [`KEY_BLOCK`], and every number a query vector
//! computes (each score's dot product in head-dimension order, the block maximum, the lane-wise block sum, each
//! output element's accumulation in key order) is a fixed sequence of operations that depends only on that vector
//! and the keys it sees — never on which other rows share its tile or call. Prefill, decode and the k+1 rows of a
//! speculative verification therefore compute a position bitwise identically (tested in
//! crates/models/tests/batch_invariance.rs). The kernel is written once, generically, and compiled three times (AVX-512,
//! AVX2+FMA, portable) and picked once at start; runs on one machine always use the same one.
//!
//! The cache holds f16 values. As in llama.cpp, queries are rounded to f16 before the key dot products.

use std::sync::OnceLock;

use super::{ThreadPool, simd};

/// One sequence's rows in the batch and its KV cache, stored in blocks: block `j` of `k` / `v` holds the keys /
/// values of positions `j * block_tokens ..` as `[block_tokens, num_kv_heads * head_dim]` f16 values (the last block
/// may be shorter). The blocks cover at least `start_pos + num_rows` positions. Row `i` of the run is at position
/// `start_pos + i`.
#[derive(Clone)]
pub struct SeqAttn<'a> {
    pub k: Vec<&'a [u16]>,
    pub v: Vec<&'a [u16]>,
    pub block_tokens: usize,
    pub start_pos: usize,
    pub num_rows: usize,
}

impl<'a> SeqAttn<'a> {
    /// A cache held in one contiguous `[num_keys, kv_dim]` run.
    pub fn contiguous(k: &'a [u16], v: &'a [u16], kv_dim: usize, start_pos: usize, num_rows: usize) -> Self {
        let block_tokens = (k.len() / kv_dim.max(1)).max(1);
        SeqAttn { k: vec![k], v: vec![v], block_tokens, start_pos, num_rows }
    }

    fn num_keys(&self, kv_dim: usize) -> usize {
        let whole = self.k.len().saturating_sub(1) * self.block_tokens;
        whole + self.k.last().map_or(0, |b| b.len() / kv_dim)
    }
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
// SAFETY: each task writes the outputs of its own (rows, head group) only.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Query rows per task. With the group's heads that is up to 32 × 7 query vectors (0.5B): big enough to amortise
/// converting each key block, small enough that tile and block stay in L2.
const ROW_BLOCK: usize = 64;
/// Keys per online-softmax step (4 AVX-512 vectors of scores per query vector).
const KEY_BLOCK: usize = 64;
/// Query vectors per register tile of the two inner products.
const VEC_TILE: usize = 6;

/// A unit of work: rows `row0..row0 + num_rows` of the batch, all of sequence `seq`, for KV head `g`.
struct Task {
    seq: usize,
    row0: usize,
    first: usize,
    num_rows: usize,
    g: usize,
}

pub fn attention(pool: &ThreadPool, shape: AttnShape, q: &[f32], seqs: &[SeqAttn<'_>], out: &mut [f32]) {
    let q_dim = shape.num_heads * shape.head_dim;
    let m: usize = seqs.iter().map(|s| s.num_rows).sum();
    assert!(q.len() >= m * q_dim && out.len() >= m * q_dim);
    let mut tasks = Vec::new();
    let mut row0 = 0;
    for (si, s) in seqs.iter().enumerate() {
        let kv_dim = shape.num_kv_heads * shape.head_dim;
        assert!(s.k.len() == s.v.len() && s.k.iter().zip(&s.v).all(|(k, v)| k.len() == v.len()));
        assert!(s.k.iter().rev().skip(1).all(|b| b.len() == s.block_tokens * kv_dim));
        assert!(s.num_keys(kv_dim) >= s.start_pos + s.num_rows);
        let mut first = 0;
        while first < s.num_rows {
            let n = ROW_BLOCK.min(s.num_rows - first);
            for g in 0..shape.num_kv_heads {
                tasks.push(Task { seq: si, row0: row0 + first, first, num_rows: n, g });
            }
            first += n;
        }
        row0 += s.num_rows;
    }
    let out_ptr = OutPtr(out.as_mut_ptr());
    // Bigger tasks first, so the dynamic split ends evenly.
    tasks.sort_by_key(|t| std::cmp::Reverse(t.num_rows * (seqs[t.seq].start_pos + t.first + t.num_rows)));
    let kernel = kernel();
    pool.for_each_chunk(tasks.len(), 1, &|range| {
        let mut scratch = Scratch::default();
        for t in &tasks[range] {
            let s = &seqs[t.seq];
            kernel(shape, q, s, t, out_ptr, &mut scratch);
        }
    });
}

#[derive(Default)]
struct Scratch {
    /// `[vectors, hd]`: the tile's query vectors (row-major over (row, head in group)), rounded to f16.
    q: Vec<f32>,
    /// `[vectors, hd]`: running outputs, not yet divided by the sum.
    acc: Vec<f32>,
    /// Running maximum and sum per query vector.
    max: Vec<f32>,
    sum: Vec<f32>,
    /// `[vectors, KEY_BLOCK]`: the current block's scores, then their exponentials.
    scores: Vec<f32>,
    /// `[hd, KEY_BLOCK]`: the current block's keys, transposed; `[KEY_BLOCK, hd]`: its values.
    kt: Vec<f32>,
    v: Vec<f32>,
    row: Vec<f32>,
}

type Kernel = fn(AttnShape, &[f32], &SeqAttn<'_>, &Task, OutPtr, &mut Scratch);

fn kernel() -> Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    *K.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let forced = std::env::var("SPLASH_CPU_KERNELS").unwrap_or_default();
            if forced != "scalar" && forced != "avx2" && std::is_x86_feature_detected!("avx512f") {
                return x86::tile_avx512;
            }
            if forced != "scalar" && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return x86::tile_avx2;
            }
        }
        tile_portable
    })
}

fn tile_portable(shape: AttnShape, q: &[f32], s: &SeqAttn<'_>, t: &Task, out: OutPtr, sc: &mut Scratch) {
    tile::<false>(shape, q, s, t, out, sc)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    unsafe fn tile_512(shape: AttnShape, q: &[f32], s: &SeqAttn<'_>, t: &Task, out: OutPtr, sc: &mut Scratch) {
        tile::<true>(shape, q, s, t, out, sc)
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_256(shape: AttnShape, q: &[f32], s: &SeqAttn<'_>, t: &Task, out: OutPtr, sc: &mut Scratch) {
        tile::<true>(shape, q, s, t, out, sc)
    }
    // SAFETY (both): installed only after the features were detected at run time.
    pub fn tile_avx512(shape: AttnShape, q: &[f32], s: &SeqAttn<'_>, t: &Task, out: OutPtr, sc: &mut Scratch) {
        unsafe { tile_512(shape, q, s, t, out, sc) }
    }
    pub fn tile_avx2(shape: AttnShape, q: &[f32], s: &SeqAttn<'_>, t: &Task, out: OutPtr, sc: &mut Scratch) {
        unsafe { tile_256(shape, q, s, t, out, sc) }
    }
}

/// `c + a·b`, fused where the kernel is compiled with FMA (one rounding), else two roundings. Either way the same
/// for every call of one kernel, which is all batch invariance needs.
#[inline(always)]
fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// One tile: consecutive query rows of one sequence, all heads of KV group `t.g`, over the keys in blocks.
#[inline(always)]
fn tile<const FMA: bool>(shape: AttnShape, q: &[f32], s: &SeqAttn<'_>, t: &Task, out: OutPtr, sc: &mut Scratch) {
    let AttnShape { num_heads, num_kv_heads, head_dim: hd, scale } = shape;
    let (q_dim, kv_dim, group) = (num_heads * hd, num_kv_heads * hd, num_heads / num_kv_heads);
    let r = t.num_rows * group;
    let base = s.start_pos + t.first; // position of the tile's first row
    let n = base + t.num_rows; // keys visible to the last row
    sc.q.resize(r * hd, 0.0);
    for i in 0..t.num_rows {
        let src = &q[(t.row0 + i) * q_dim + t.g * group * hd..][..group * hd];
        sc.q[i * group * hd..(i + 1) * group * hd].copy_from_slice(src);
    }
    simd::round_to_f16(&mut sc.q);
    sc.acc.clear();
    sc.acc.resize(r * hd, 0.0);
    sc.max.clear();
    sc.max.resize(r, f32::NEG_INFINITY);
    sc.sum.clear();
    sc.sum.resize(r, 0.0);
    sc.scores.resize(r * KEY_BLOCK, 0.0);
    sc.kt.resize(hd * KEY_BLOCK, 0.0);
    sc.v.resize(KEY_BLOCK * hd, 0.0);
    sc.row.resize(hd, 0.0);
    let mut kb = 0;
    while kb < n {
        let nk = KEY_BLOCK.min(n - kb);
        for j in 0..nk {
            let (blk, row) = ((kb + j) / s.block_tokens, (kb + j) % s.block_tokens);
            half_to_f32(&s.k[blk][row * kv_dim + t.g * hd..][..hd], &mut sc.row);
            for (d, &x) in sc.row.iter().enumerate() {
                sc.kt[d * KEY_BLOCK + j] = x;
            }
            half_to_f32(&s.v[blk][row * kv_dim + t.g * hd..][..hd], &mut sc.v[j * hd..(j + 1) * hd]);
        }
        if nk < KEY_BLOCK {
            for d in 0..hd {
                sc.kt[d * KEY_BLOCK + nk..(d + 1) * KEY_BLOCK].fill(0.0);
            }
        }
        // Query vectors that see at least one key of this block: rows at positions >= kb.
        let v0 = kb.saturating_sub(base) * group;
        let keys_seen = |v: usize| KEY_BLOCK.min(base + v / group + 1 - kb);
        block_scores::<FMA>(hd, scale, &sc.q, &sc.kt, v0, r, &mut sc.scores);
        for v in v0..r {
            let nk_v = keys_seen(v);
            let srow: &mut [f32; KEY_BLOCK] = (&mut sc.scores[v * KEY_BLOCK..(v + 1) * KEY_BLOCK]).try_into().unwrap();
            // The maximum is exact in any order; lane-wise so it vectorises (`>` rather than `f32::max`: no NaN here).
            let mut lane_max = [f32::NEG_INFINITY; 16];
            for (c, chunk) in srow.chunks_exact(16).enumerate() {
                for (l, (m, &x)) in lane_max.iter_mut().zip(chunk).enumerate() {
                    let x = if c * 16 + l < nk_v { x } else { f32::NEG_INFINITY };
                    *m = if x > *m { x } else { *m };
                }
            }
            let block_max = lane_max.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
            let new_max = sc.max[v].max(block_max);
            let alpha = if sc.max[v] == f32::NEG_INFINITY { 0.0 } else { simd::exp_approx(sc.max[v] - new_max) };
            sc.max[v] = new_max;
            for (j, x) in srow.iter_mut().enumerate() {
                *x = if j < nk_v { simd::exp_approx(*x - new_max) } else { 0.0 };
            }
            // Lane-wise sums (16 lanes, fixed by the key's offset in its block), then the lanes in order.
            let mut lanes = [0f32; 16];
            for c in srow.chunks_exact(16) {
                for (l, x) in lanes.iter_mut().zip(c) {
                    *l += x;
                }
            }
            let block_sum = lanes.iter().fold(0f32, |a, &b| a + b);
            sc.sum[v] = fmadd::<FMA>(sc.sum[v], alpha, block_sum);
            for a in &mut sc.acc[v * hd..(v + 1) * hd] {
                *a *= alpha;
            }
        }
        block_values::<FMA>(hd, &sc.scores, &sc.v, v0, r, &keys_seen, &mut sc.acc);
        kb += KEY_BLOCK;
    }
    for i in 0..t.num_rows {
        // SAFETY: rows t.row0.., heads of group g are written by this task alone.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(out.0.add((t.row0 + i) * q_dim + t.g * group * hd), group * hd) };
        for (h, d) in dst.chunks_exact_mut(hd).enumerate() {
            let v = i * group + h;
            let inv = 1.0 / sc.sum[v];
            for (o, a) in d.iter_mut().zip(&sc.acc[v * hd..(v + 1) * hd]) {
                *o = a * inv;
            }
        }
    }
}

/// `scores[v, j] = scale · Σ_d q[v, d] · kt[d, j]` for query vectors `v0..r`, the sum in `d` order, [`VEC_TILE`]
/// vectors at a time (or one: the same operations per score either way).
#[inline(always)]
fn block_scores<const FMA: bool>(hd: usize, scale: f32, q: &[f32], kt: &[f32], v0: usize, r: usize, out: &mut [f32]) {
    let mut v = v0;
    while v + VEC_TILE <= r {
        let mut acc = [[0f32; KEY_BLOCK]; VEC_TILE];
        let qs: [&[f32]; VEC_TILE] = std::array::from_fn(|i| &q[(v + i) * hd..(v + i + 1) * hd]);
        for (d, k) in kt[..hd * KEY_BLOCK].chunks_exact(KEY_BLOCK).enumerate() {
            let k: [f32; KEY_BLOCK] = k.try_into().unwrap();
            for (a, qi) in acc.iter_mut().zip(&qs) {
                let x = qi[d];
                for j in 0..KEY_BLOCK {
                    a[j] = fmadd::<FMA>(x, k[j], a[j]);
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            for (o, x) in out[(v + i) * KEY_BLOCK..(v + i + 1) * KEY_BLOCK].iter_mut().zip(a) {
                *o = x * scale;
            }
        }
        v += VEC_TILE;
    }
    while v < r {
        let mut a = [0f32; KEY_BLOCK];
        for d in 0..hd {
            let k: &[f32; KEY_BLOCK] = kt[d * KEY_BLOCK..(d + 1) * KEY_BLOCK].try_into().unwrap();
            let x = q[v * hd + d];
            for j in 0..KEY_BLOCK {
                a[j] = fmadd::<FMA>(x, k[j], a[j]);
            }
        }
        for (o, x) in out[v * KEY_BLOCK..(v + 1) * KEY_BLOCK].iter_mut().zip(&a) {
            *o = x * scale;
        }
        v += 1;
    }
}

/// `acc[v, :] += Σ_j p[v, j] · vals[j, :]` over the `keys_seen(v)` keys vector `v` sees, in key order. Vectors go
/// [`VEC_TILE`] at a time over the keys all of them see, then each alone over the rest of its keys, which continues
/// the same per-element chains.
#[inline(always)]
fn block_values<const FMA: bool>(
    hd: usize,
    p: &[f32],
    vals: &[f32],
    v0: usize,
    r: usize,
    keys_seen: &dyn Fn(usize) -> usize,
    acc: &mut [f32],
) {
    let mut v = v0;
    while v < r {
        let nv = VEC_TILE.min(r - v);
        let common = (v..v + nv).map(keys_seen).min().unwrap_or(0);
        if nv == VEC_TILE && hd.is_multiple_of(64) {
            for d0 in (0..hd).step_by(64) {
                let mut a = [[0f32; 64]; VEC_TILE];
                for (i, ai) in a.iter_mut().enumerate() {
                    ai.copy_from_slice(&acc[(v + i) * hd + d0..][..64]);
                }
                let ps: [&[f32]; VEC_TILE] = std::array::from_fn(|i| &p[(v + i) * KEY_BLOCK..][..common]);
                for (j, x) in vals[..common * hd].chunks_exact(hd).enumerate() {
                    let x: [f32; 64] = x[d0..d0 + 64].try_into().unwrap();
                    for (ai, pi) in a.iter_mut().zip(&ps) {
                        let w = pi[j];
                        for d in 0..64 {
                            ai[d] = fmadd::<FMA>(w, x[d], ai[d]);
                        }
                    }
                }
                for (i, ai) in a.iter().enumerate() {
                    acc[(v + i) * hd + d0..][..64].copy_from_slice(ai);
                }
            }
        } else {
            values_one::<FMA>(hd, p, vals, v, nv, 0, common, acc);
        }
        for i in 0..nv {
            values_one::<FMA>(hd, p, vals, v + i, 1, common, keys_seen(v + i), acc);
        }
        v += nv;
    }
}

/// Vectors `v..v + nv`, keys `j0..j1`, one vector at a time.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn values_one<const FMA: bool>(
    hd: usize,
    p: &[f32],
    vals: &[f32],
    v: usize,
    nv: usize,
    j0: usize,
    j1: usize,
    acc: &mut [f32],
) {
    for vi in v..v + nv {
        let a = &mut acc[vi * hd..(vi + 1) * hd];
        for j in j0..j1 {
            let w = p[vi * KEY_BLOCK + j];
            for (ad, &x) in a.iter_mut().zip(&vals[j * hd..(j + 1) * hd]) {
                *ad = fmadd::<FMA>(w, x, *ad);
            }
        }
    }
}

fn half_to_f32(src: &[u16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    // SAFETY-free reinterpretation: f16 is a transparent u16.
    let src: &[half::f16] = bytemuck_cast(src);
    src.convert_to_f32_slice(dst);
}

fn bytemuck_cast(src: &[u16]) -> &[half::f16] {
    // SAFETY: half::f16 is #[repr(transparent)] over u16, so the layouts are identical.
    unsafe { std::slice::from_raw_parts(src.as_ptr() as *const half::f16, src.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16(bits: u16) -> f64 {
        half::f16::from_bits(bits).to_f64()
    }

    /// Straightforward f64 attention for one query row seeing `n` keys.
    fn reference(shape: AttnShape, q: &[f32], k: &[u16], v: &[u16], n: usize) -> Vec<f64> {
        let (hd, kvd) = (shape.head_dim, shape.num_kv_heads * shape.head_dim);
        let group = shape.num_heads / shape.num_kv_heads;
        let mut out = vec![0f64; shape.num_heads * hd];
        for h in 0..shape.num_heads {
            let g = h / group;
            let s: Vec<f64> = (0..n)
                .map(|j| {
                    (0..hd).map(|d| q[h * hd + d] as f64 * f16(k[j * kvd + g * hd + d])).sum::<f64>()
                        * shape.scale as f64
                })
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for j in 0..n {
                for d in 0..hd {
                    out[h * hd + d] += e[j] / z * f16(v[j * kvd + g * hd + d]);
                }
            }
        }
        out
    }

    #[test]
    fn matches_reference_for_decode_prefill_and_mixed_batches() {
        let shape = AttnShape { num_heads: 6, num_kv_heads: 2, head_dim: 16, scale: 0.25 };
        let (kvd, qd) = (32, 96);
        let f = |i: usize, s: f32| ((i * 2654435761 % 1000) as f32 / 500.0 - 1.0) * s;
        let h = |x: f32| half::f16::from_f32(x).to_bits();
        let n = 40;
        let k: Vec<u16> = (0..n * kvd).map(|i| h(f(i, 1.0))).collect();
        let v: Vec<u16> = (0..n * kvd).map(|i| h(f(i + 7, 2.0))).collect();
        let k2: Vec<u16> = (0..n * kvd).map(|i| h(f(i + 11, 1.3))).collect();
        let v2: Vec<u16> = (0..n * kvd).map(|i| h(f(i + 5, 0.7))).collect();
        // A 37-row prefill chunk at position 3, a single decode row, a 3-row verification run.
        let seqs = [
            SeqAttn::contiguous(&k, &v, kvd, 3, 37),
            // The same cache in blocks of 16 (the last one short).
            SeqAttn {
                k: k2.chunks(16 * kvd).collect(),
                v: v2.chunks(16 * kvd).collect(),
                block_tokens: 16,
                start_pos: 20,
                num_rows: 1,
            },
            SeqAttn::contiguous(&k2, &v2, kvd, 30, 3),
        ];
        let m = 41;
        let q: Vec<f32> = (0..m * qd).map(|i| f(i + 3, 1.5)).collect();
        let mut out = vec![f32::NAN; m * qd];
        let pool = ThreadPool::new(2);
        attention(&pool, shape, &q, &seqs, &mut out);
        let mut row = 0;
        for s in &seqs {
            for i in 0..s.num_rows {
                let (k, v) = (s.k.concat(), s.v.concat());
                let want = reference(shape, &q[row * qd..(row + 1) * qd], &k, &v, s.start_pos + i + 1);
                for (a, b) in out[row * qd..(row + 1) * qd].iter().zip(&want) {
                    assert!((*a as f64 - b).abs() < 3e-3 * b.abs().max(1.0), "row {row}: {a} vs {b}");
                }
                row += 1;
            }
        }
    }

    /// A row's output is bitwise the same whether it is computed alone (decode), in a long prefill call, or in
    /// uneven chunks next to another sequence: across key blocks, tile boundaries and both value-product paths.
    #[test]
    fn rows_are_bitwise_independent_of_batching_and_chunking() {
        for (num_heads, num_kv_heads, hd) in [(14, 2, 64), (6, 2, 128), (6, 3, 16)] {
            let shape = AttnShape { num_heads, num_kv_heads, head_dim: hd, scale: 1.0 / (hd as f32).sqrt() };
            let (kvd, qd) = (num_kv_heads * hd, num_heads * hd);
            let n = 150;
            let f = |i: usize, s: f32| ((i * 2654435761 % 1000) as f32 / 500.0 - 1.0) * s;
            let h = |x: f32| half::f16::from_f32(x).to_bits();
            let k: Vec<u16> = (0..n * kvd).map(|i| h(f(i, 2.0))).collect();
            let v: Vec<u16> = (0..n * kvd).map(|i| h(f(i + 7, 1.0))).collect();
            let q: Vec<f32> = (0..n * qd).map(|i| f(i + 3, 1.5)).collect();
            let paged = |start: usize, rows: usize| SeqAttn {
                k: k.chunks(16 * kvd).collect(),
                v: v.chunks(16 * kvd).collect(),
                block_tokens: 16,
                start_pos: start,
                num_rows: rows,
            };
            let pool = ThreadPool::new(2);
            let mut all = vec![f32::NAN; n * qd];
            attention(&pool, shape, &q, &[paged(0, n)], &mut all);
            // Each row alone.
            for i in [0, 1, 15, 16, 63, 64, 65, 100, 127, 128, 149] {
                let mut one = vec![f32::NAN; qd];
                attention(&pool, shape, &q[i * qd..(i + 1) * qd], &[paged(i, 1)], &mut one);
                assert_eq!(bits(&one), bits(&all[i * qd..(i + 1) * qd]), "shape {shape:?} row {i} alone");
            }
            // Uneven chunks, each next to an unrelated single row of another sequence.
            let mut start = 0;
            for len in [5, 40, 1, 70, 34] {
                let mut qq = q[start * qd..(start + len) * qd].to_vec();
                qq.extend_from_slice(&q[..qd]);
                let mut got = vec![f32::NAN; (len + 1) * qd];
                attention(&pool, shape, &qq, &[paged(start, len), paged(90, 1)], &mut got);
                assert_eq!(bits(&got[..len * qd]), bits(&all[start * qd..(start + len) * qd]), "chunk at {start}");
                start += len;
            }
            // And the whole run against the f64 reference.
            for i in [0, 64, 149] {
                let want = reference(shape, &q[i * qd..(i + 1) * qd], &k, &v, i + 1);
                for (a, b) in all[i * qd..(i + 1) * qd].iter().zip(&want) {
                    assert!((*a as f64 - b).abs() < 3e-3 * b.abs().max(1.0), "row {i}: {a} vs {b}");
                }
            }
        }
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }
}
