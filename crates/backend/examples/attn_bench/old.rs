//! The CPU attention kernel as it was before the flash-style tiles (commit 0b9a459), verbatim but for the import
//! path, kept only so attn_bench can compare the two on the same machine load.

//! Causal grouped-query attention over a KV cache, on the CPU.
//!
//! In: query rows `[m, num_heads * head_dim]`, grouped by sequence: each [`SeqAttn`] names a run of consecutive query
//! rows of one sequence (a prefill chunk, one decode token, or k+1 rows to verify) and that sequence's cache, which
//! already holds the keys and values of those rows. Out: `[m, num_heads * head_dim]`.
//!
//! Query heads that share a KV head are processed together, so each cached row is read once per group. A task is a
//! block of up to 64 rows of one sequence and one KV head: the block's keys and values are converted to f32 once, and
//! each row then takes two small matrix products — scores `Q·Kᵀ` and output `P·V` over exactly the keys it sees, with
//! its group's heads as matrix rows. A row's result therefore does not depend on the block it came in: prefill,
//! decode and the k+1 rows of a speculative verification all compute a position identically (tested bitwise in
//! crates/models/tests/batch_invariance.rs).
//!
//! The cache holds f16 values. As in llama.cpp's (non flash-attention) CPU path, queries are rounded to f16 before
//! the key dot products and attention weights are rounded to f16 before they multiply the values.

use backend::cpu::{ThreadPool, ops, simd};

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

/// Query rows per task: the keys are converted once per task, so longer blocks convert less in long prefills.
const ROW_BLOCK: usize = 64;

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
    pool.for_each_chunk(tasks.len(), 1, &|range| {
        let mut scratch = Scratch::default();
        for t in &tasks[range] {
            let s = &seqs[t.seq];
            block_task(shape, q, s, t, out_ptr, &mut scratch);
        }
    });
}

#[derive(Default)]
struct Scratch {
    qh: Vec<f32>,
    scores: Vec<f32>,
    kf: Vec<f32>,
    vf: Vec<f32>,
}

/// Consecutive query rows of one sequence, all heads of KV group `t.g`, as two matrix products.
fn block_task(shape: AttnShape, q: &[f32], s: &SeqAttn<'_>, t: &Task, out: OutPtr, sc: &mut Scratch) {
    let AttnShape { num_heads, num_kv_heads, head_dim: hd, scale } = shape;
    let (q_dim, kv_dim, group) = (num_heads * hd, num_kv_heads * hd, num_heads / num_kv_heads);
    let r = t.num_rows * group; // query vectors: row-major over (row, head in group)
    let n = s.start_pos + t.first + t.num_rows; // keys visible to the last row
    // Queries rounded to f16; keys and values of this group converted to f32.
    sc.qh.resize(r * hd, 0.0);
    for i in 0..t.num_rows {
        let src = &q[(t.row0 + i) * q_dim + t.g * group * hd..][..group * hd];
        sc.qh[i * group * hd..(i + 1) * group * hd].copy_from_slice(src);
    }
    simd::round_to_f16(&mut sc.qh);
    for (dst, src) in [(&mut sc.kf, &s.k), (&mut sc.vf, &s.v)] {
        dst.resize(n * hd, 0.0);
        for j in 0..n {
            let block = src[j / s.block_tokens];
            let row = j % s.block_tokens;
            half_to_f32(&block[row * kv_dim + t.g * hd..][..hd], &mut dst[j * hd..(j + 1) * hd]);
        }
    }
    // Row by row, each over exactly the keys it sees: the same two products, of the same shapes, as when that row
    // is decoded alone, so a row's output does not depend on which block (or verification run) it came in.
    for i in 0..t.num_rows {
        let visible = s.start_pos + t.first + i + 1;
        let qi = &sc.qh[i * group * hd..(i + 1) * group * hd];
        // Scores: [group, visible] = Q [group, hd] · Kᵀ [hd, visible].
        sc.scores.resize(group * visible, 0.0);
        gemm_f32(group, visible, hd, qi, (1, hd), &sc.kf, (hd, 1), &mut sc.scores, visible, scale);
        for row in sc.scores.chunks_exact_mut(visible) {
            ops::softmax(row);
            simd::round_to_f16(row);
        }
        // Output: [group, hd] = P [group, visible] · V [visible, hd], written in place.
        // SAFETY: rows t.row0.., heads of group g are written by this task alone.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(out.0.add((t.row0 + i) * q_dim + t.g * group * hd), group * hd) };
        gemm_f32(group, hd, visible, &sc.scores, (1, visible), &sc.vf, (1, hd), dst, hd, 1.0);
    }
}

/// `c[m, n] = alpha · a[m, k] · b[k, n]` in f32, single-threaded. Strides are (column, row) in elements; `c` is
/// row-major with row stride `ldc`.
#[allow(clippy::too_many_arguments)]
fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_strides: (usize, usize),
    b: &[f32],
    b_strides: (usize, usize),
    c: &mut [f32],
    ldc: usize,
    alpha: f32,
) {
    let extent = |rows: usize, cols: usize, (cs, rs): (usize, usize)| (rows - 1) * rs + (cols - 1) * cs + 1;
    assert!(a.len() >= extent(m, k, a_strides) && b.len() >= extent(k, n, b_strides) && c.len() >= (m - 1) * ldc + n);
    // SAFETY: the assertion above bounds every element the strides reach.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            false,
            a.as_ptr(),
            a_strides.0 as isize,
            a_strides.1 as isize,
            b.as_ptr(),
            b_strides.0 as isize,
            b_strides.1 as isize,
            0.0,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
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
