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
//! crates/models/tests/batch_invariance.rs). The kernel is written once, generically, and compiled for each
//! [`AttnKernel`] (AVX-512 with bf16 dot products, AVX-512, AVX2+FMA, portable); one is picked once at start, so runs
//! on one machine always use the same one.
//!
//! The cache holds f16 values ([`KvType::F16`]) or, for unquantized models, f32 ones ([`KvType::F32`], stored as two
//! u16 words each). With an f16 cache, as in llama.cpp, queries are rounded to f16 before the key dot products; with
//! an f32 cache nothing is rounded (f32 queries, f32 products: the f32 kernels below; no bf16). On CPUs with
//! AVX512_BF16 the default kernel ([`AttnKernel::Bf16Values`]) computes P·V with `vdpbf16ps` (weights and values
//! rounded to bf16, f32 sums: twice the f32 FMA rate) and keeps Q·K in f32: bf16 Q·K ([`AttnKernel::Bf16`],
//! `SPLASH_ATTN_BF16=all`) is faster still but flips enough near-ties to drop the 1.5B below the llama.cpp parity bar
//! (98.9% teacher-forced top-1; benchmarks/log/2026-11-30-stretch-5.md).

use std::sync::OnceLock;

use super::{ThreadPool, simd};
use crate::KvType;

/// One sequence's rows in the batch and its KV cache, stored in blocks: block `j` of `k` / `v` holds the keys /
/// values of positions `j * block_tokens ..` as `[block_tokens, num_kv_heads * head_dim]` values of `kv_type` in
/// u16 words ([`KvType::words`]; the last block may be shorter). The blocks cover at least `start_pos + num_rows`
/// positions. Row `i` of the run is at position `start_pos + i`.
#[derive(Clone)]
pub struct SeqAttn<'a> {
    pub k: Vec<&'a [u16]>,
    pub v: Vec<&'a [u16]>,
    pub kv_type: KvType,
    pub block_tokens: usize,
    pub start_pos: usize,
    pub num_rows: usize,
}

impl SeqAttn<'_> {
    /// Words of one position's keys (or values).
    fn token_words(&self, kv_dim: usize) -> usize {
        kv_dim * self.kv_type.words()
    }

    fn num_keys(&self, kv_dim: usize) -> usize {
        let whole = self.k.len().saturating_sub(1) * self.block_tokens;
        whole + self.k.last().map_or(0, |b| b.len() / self.token_words(kv_dim))
    }
}

pub use crate::AttnShape;

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
    attention_with(AttnKernel::selected(), pool, shape, q, seqs, out)
}

/// [`attention`] with a given kernel (tests and benchmarks compare them).
///
/// # Panics
/// If `kernel` is not in [`AttnKernel::available`], or the sizes of `q`, `out` and the caches disagree.
pub fn attention_with(
    kernel: AttnKernel,
    pool: &ThreadPool,
    shape: AttnShape,
    q: &[f32],
    seqs: &[SeqAttn<'_>],
    out: &mut [f32],
) {
    assert!(AttnKernel::available().contains(&kernel), "attention kernel {kernel:?} not supported by this CPU");
    let q_dim = shape.num_heads * shape.head_dim;
    let m: usize = seqs.iter().map(|s| s.num_rows).sum();
    assert!(q.len() >= m * q_dim && out.len() >= m * q_dim);
    let mut tasks = Vec::new();
    let mut row0 = 0;
    for (si, s) in seqs.iter().enumerate() {
        let kv_dim = shape.num_kv_heads * shape.head_dim;
        assert!(s.k.len() == s.v.len() && s.k.iter().zip(&s.v).all(|(k, v)| k.len() == v.len()));
        assert!(s.k.iter().rev().skip(1).all(|b| b.len() == s.block_tokens * s.token_words(kv_dim)));
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
    let tile_fns: Vec<TileFn> = seqs.iter().map(|s| kernel.tile_fn(shape.head_dim, s.kv_type)).collect();
    pool.for_each_chunk(tasks.len(), 1, &|range| {
        let mut scratch = Scratch::default();
        for t in &tasks[range] {
            tile_fns[t.seq](TileIn { shape, q, s: &seqs[t.seq], t, out: out_ptr }, &mut scratch);
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
    /// bf16 pairs (low half first), for the `vdpbf16ps` kernels: `[vectors, hd / 2]` queries, `[hd / 2, KEY_BLOCK]`
    /// keys (pairs along the head dimension, transposed), `[KEY_BLOCK / 2, hd]` values (pairs of consecutive keys),
    /// `[vectors, KEY_BLOCK / 2]` attention weights.
    qb: Vec<u32>,
    ktb: Vec<u32>,
    vb: Vec<u32>,
    pb: Vec<u32>,
}

/// The bf16 nearest to `x` (ties to even), as its 16 bits. No NaN reaches here (inputs are finite f16 values,
/// queries and exponentials).
#[inline(always)]
fn bf16_bits(x: f32) -> u32 {
    let b = x.to_bits();
    b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16
}

/// Two numbers as one bf16 pair word, `lo` in the low half.
#[inline(always)]
fn bf16_pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | (bf16_bits(hi) << 16)
}

/// The attention kernels, fastest first. Every one is deterministic and batch-invariant on its own; they differ from
/// each other in rounding, so one process uses one ([`AttnKernel::selected`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKernel {
    /// AVX-512 with `vdpbf16ps` for both products: queries and keys rounded to bf16 for Q·K, attention weights and
    /// values rounded to bf16 for P·V (f32 accumulation).
    Bf16,
    /// AVX-512, Q·K in f32 FMA (queries rounded to f16 as in llama.cpp), P·V with `vdpbf16ps`.
    Bf16Values,
    /// AVX-512 f32 FMA for both products.
    Avx512,
    /// AVX2 + FMA, f32.
    Avx2,
    /// No SIMD intrinsics, f32 (the compiler vectorises what it can).
    Portable,
}

impl AttnKernel {
    /// The kernels this CPU can run, fastest first.
    pub fn available() -> Vec<AttnKernel> {
        let mut out = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let f512 = std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512vl")
                && std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma");
            if f512 && std::is_x86_feature_detected!("avx512bf16") && std::is_x86_feature_detected!("avx512bw") {
                out.extend([AttnKernel::Bf16, AttnKernel::Bf16Values]);
            }
            if f512 {
                out.push(AttnKernel::Avx512);
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                out.push(AttnKernel::Avx2);
            }
        }
        out.push(AttnKernel::Portable);
        out
    }

    /// The kernel this process uses, chosen once: the best available that `SPLASH_CPU_KERNELS`
    /// (`scalar` / `avx2` / `avx512`, the last meaning f32 AVX-512) allows; `SPLASH_ATTN_BF16=off|values|all`
    /// picks among the AVX-512 ones (default `values`: bf16 only for P·V).
    pub fn selected() -> AttnKernel {
        static K: OnceLock<AttnKernel> = OnceLock::new();
        *K.get_or_init(|| {
            let avail = AttnKernel::available();
            let cap = std::env::var("SPLASH_CPU_KERNELS").unwrap_or_default();
            let bf16 = std::env::var("SPLASH_ATTN_BF16").unwrap_or_default();
            let allowed = |k: &AttnKernel| match k {
                AttnKernel::Bf16 => cap.is_empty() && bf16 == "all",
                AttnKernel::Bf16Values => cap.is_empty() && (bf16.is_empty() || bf16 == "values"),
                AttnKernel::Avx512 => cap.is_empty() || cap == "avx512",
                AttnKernel::Avx2 => cap != "scalar",
                AttnKernel::Portable => true,
            };
            avail.into_iter().find(allowed).unwrap_or(AttnKernel::Portable)
        })
    }

    /// The function that runs one tile over a cache of `kv` values; the bf16 kernels need an f16 cache and a head
    /// dimension that is a multiple of 16, and fall back to f32 AVX-512 otherwise (fixed per model, so still one
    /// kernel per process and model).
    fn tile_fn(self, head_dim: usize, kv: KvType) -> TileFn {
        match kv {
            KvType::F16 => self.tile_fn_for::<false>(head_dim.is_multiple_of(16)),
            KvType::F32 => self.tile_fn_for::<true>(false),
        }
    }

    fn tile_fn_for<const F32_KV: bool>(self, bf16_ok: bool) -> TileFn {
        #[cfg(target_arch = "x86_64")]
        match self {
            AttnKernel::Bf16 if bf16_ok => return x86::tile_bf16,
            AttnKernel::Bf16Values if bf16_ok => return x86::tile_bf16_values,
            AttnKernel::Bf16 | AttnKernel::Bf16Values | AttnKernel::Avx512 => return x86::tile_avx512::<F32_KV>,
            AttnKernel::Avx2 => return x86::tile_avx2::<F32_KV>,
            AttnKernel::Portable => {}
        }
        let _ = bf16_ok;
        tile_portable::<F32_KV>
    }
}

/// What one tile reads and where it writes: the attention's numbers, every query row of the call, the task's
/// sequence and the task.
#[derive(Clone, Copy)]
struct TileIn<'a> {
    shape: AttnShape,
    q: &'a [f32],
    s: &'a SeqAttn<'a>,
    t: &'a Task,
    out: OutPtr,
}

type TileFn = fn(TileIn<'_>, &mut Scratch);

fn tile_portable<const F32_KV: bool>(x: TileIn<'_>, sc: &mut Scratch) {
    tile::<F32_KV, false, false, false, 8>(x, sc)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512bf16,avx2,fma")]
    unsafe fn tile_512bf16<const QK: bool>(x: TileIn<'_>, sc: &mut Scratch) {
        tile::<false, true, QK, true, 64>(x, sc)
    }
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    unsafe fn tile_512<const F32_KV: bool>(x: TileIn<'_>, sc: &mut Scratch) {
        tile::<F32_KV, true, false, false, 64>(x, sc)
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_256<const F32_KV: bool>(x: TileIn<'_>, sc: &mut Scratch) {
        tile::<F32_KV, true, false, false, 16>(x, sc)
    }
    // SAFETY (all): installed only after the features were detected at run time (`AttnKernel::available`).
    pub fn tile_bf16(x: TileIn<'_>, sc: &mut Scratch) {
        unsafe { tile_512bf16::<true>(x, sc) }
    }
    pub fn tile_bf16_values(x: TileIn<'_>, sc: &mut Scratch) {
        unsafe { tile_512bf16::<false>(x, sc) }
    }
    pub fn tile_avx512<const F32_KV: bool>(x: TileIn<'_>, sc: &mut Scratch) {
        unsafe { tile_512::<F32_KV>(x, sc) }
    }
    pub fn tile_avx2<const F32_KV: bool>(x: TileIn<'_>, sc: &mut Scratch) {
        unsafe { tile_256::<F32_KV>(x, sc) }
    }

    /// One online-softmax step of one query vector over a block of scores (`nk_v` of them seen): updates the
    /// running maximum and sum, writes the block's weights `exp(s - max)` rounded to bf16 as pairs into `pb` (zero
    /// past `nk_v`), and returns the factor that rescales the running output. The sum adds exactly the rounded
    /// weights the value product uses. All in AVX-512 registers; a fixed order of operations per vector.
    ///
    /// # Safety
    /// Needs AVX-512F/BW/BF16.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512bf16")]
    pub unsafe fn softmax_block_bf16(
        srow: &[f32; KEY_BLOCK],
        nk_v: usize,
        max: &mut f32,
        sum: &mut f32,
        pb: &mut [u32; KEY_BLOCK / 2],
    ) -> f32 {
        const { assert!(KEY_BLOCK == 64) };
        unsafe {
            let seen: u64 = if nk_v >= 64 { u64::MAX } else { (1u64 << nk_v) - 1 };
            let masks: [__mmask16; 4] = std::array::from_fn(|c| (seen >> (16 * c)) as __mmask16);
            let s: [__m512; 4] = std::array::from_fn(|c| _mm512_loadu_ps(srow.as_ptr().add(16 * c)));
            let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
            let mut m = ninf;
            for c in 0..4 {
                m = _mm512_mask_max_ps(m, masks[c], m, s[c]);
            }
            let block_max = _mm512_reduce_max_ps(m);
            let new_max = max.max(block_max);
            let alpha = if *max == f32::NEG_INFINITY { 0.0 } else { simd::exp_approx(*max - new_max) };
            *max = new_max;
            let nm = _mm512_set1_ps(new_max);
            let p: [__m512; 4] =
                std::array::from_fn(|c| _mm512_maskz_mov_ps(masks[c], exp512(_mm512_sub_ps(s[c], nm))));
            let w0 = _mm512_cvtne2ps_pbh(p[1], p[0]);
            let w1 = _mm512_cvtne2ps_pbh(p[3], p[2]);
            _mm512_storeu_si512(pb.as_mut_ptr().cast(), std::mem::transmute::<__m512bh, __m512i>(w0));
            _mm512_storeu_si512(pb.as_mut_ptr().add(16).cast(), std::mem::transmute::<__m512bh, __m512i>(w1));
            let hi_mask = _mm512_set1_epi32(0xffff_0000u32 as i32);
            let unpack = |w: __m512bh| {
                let w: __m512i = std::mem::transmute(w);
                let lo = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w));
                let hi = _mm512_castsi512_ps(_mm512_and_si512(w, hi_mask));
                _mm512_add_ps(lo, hi)
            };
            let block_sum = _mm512_reduce_add_ps(_mm512_add_ps(unpack(w0), unpack(w1)));
            *sum = sum.mul_add(alpha, block_sum);
            alpha
        }
    }

    /// [`load_block`] for f32 keys and bf16 value pairs (the [`AttnKernel::Bf16Values`] kernel), with the same
    /// results: keys are transposed 16 × 16 in registers instead of one scattered store per element, and values go
    /// from f16 to bf16 pairs 16 columns at a time (`vcvtneps2bf16` rounds to nearest even like [`bf16_bits`]; the
    /// f32 values from f16 are never denormal, which it would flush). A decode row reads a whole key block per query
    /// vector group, so this conversion, not the products, was most of its attention time.
    ///
    /// # Safety
    /// Needs AVX-512F/BW/VL/BF16; `hd` a multiple of 16; `kt` at least `hd · KEY_BLOCK` and `vb` `KEY_BLOCK / 2 · hd`
    /// long.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512bf16,avx2,fma,f16c")]
    pub unsafe fn load_block_f32_keys_bf16_values(
        s: &SeqAttn<'_>,
        kb: usize,
        nk: usize,
        col: usize,
        hd: usize,
        kv_dim: usize,
        kt: &mut [f32],
        vb: &mut [u32],
    ) {
        assert!(hd.is_multiple_of(16) && kt.len() >= hd * KEY_BLOCK && vb.len() >= KEY_BLOCK / 2 * hd);
        let row = |cache: &[&[u16]], j: usize| -> *const u16 {
            let (blk, r) = ((kb + j) / s.block_tokens, (kb + j) % s.block_tokens);
            cache[blk][r * kv_dim + col..][..hd].as_ptr()
        };
        unsafe {
            let load = |p: *const u16, c: usize| _mm512_cvtph_ps(_mm256_loadu_si256(p.add(c).cast()));
            for j0 in (0..KEY_BLOCK).step_by(16) {
                let n = nk.saturating_sub(j0).min(16);
                let rows: [*const u16; 16] =
                    std::array::from_fn(|j| if j < n { row(&s.k, j0 + j) } else { row(&s.k, 0) });
                for c in (0..hd).step_by(16) {
                    let mut r = [_mm512_setzero_ps(); 16];
                    for (j, rj) in r.iter_mut().enumerate().take(n) {
                        *rj = load(rows[j], c);
                    }
                    if n > 0 {
                        transpose16(&mut r);
                    }
                    for (i, ri) in r.iter().enumerate() {
                        _mm512_storeu_ps(kt.as_mut_ptr().add((c + i) * KEY_BLOCK + j0), *ri);
                    }
                }
            }
            let bf = |x: __m512| _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(x)));
            for i in 0..KEY_BLOCK / 2 {
                let (j0, j1) = (2 * i, 2 * i + 1);
                let dst = vb.as_mut_ptr().add(i * hd);
                if j0 >= nk {
                    std::slice::from_raw_parts_mut(dst, hd).fill(0);
                    continue;
                }
                let (p0, p1) = (row(&s.v, j0), if j1 < nk { row(&s.v, j1) } else { std::ptr::null() });
                for c in (0..hd).step_by(16) {
                    let lo = bf(load(p0, c));
                    let hi = if j1 < nk { _mm512_slli_epi32::<16>(bf(load(p1, c))) } else { _mm512_setzero_si512() };
                    _mm512_storeu_si512(dst.add(c).cast(), _mm512_or_si512(lo, hi));
                }
            }
        }
    }

    /// The keys of [`load_block`] for the f32 kernels (AVX2 and AVX-512 f32), transposed 8 × 8 in registers instead
    /// of one scattered store per element; the same values.
    ///
    /// # Safety
    /// Needs AVX2, FMA and F16C; `hd` a multiple of 8; `kt` at least `hd · KEY_BLOCK` long.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn load_keys_f32(
        s: &SeqAttn<'_>,
        kb: usize,
        nk: usize,
        col: usize,
        hd: usize,
        kv_dim: usize,
        kt: &mut [f32],
    ) {
        assert!(hd.is_multiple_of(8) && kt.len() >= hd * KEY_BLOCK);
        let row = |j: usize| -> *const u16 {
            let (blk, r) = ((kb + j) / s.block_tokens, (kb + j) % s.block_tokens);
            s.k[blk][r * kv_dim + col..][..hd].as_ptr()
        };
        unsafe {
            for j0 in (0..KEY_BLOCK).step_by(8) {
                let n = nk.saturating_sub(j0).min(8);
                let rows: [*const u16; 8] = std::array::from_fn(|j| if j < n { row(j0 + j) } else { row(0) });
                for c in (0..hd).step_by(8) {
                    let mut r = [_mm256_setzero_ps(); 8];
                    for (j, rj) in r.iter_mut().enumerate().take(n) {
                        *rj = _mm256_cvtph_ps(_mm_loadu_si128(rows[j].add(c).cast()));
                    }
                    if n > 0 {
                        transpose8(&mut r);
                    }
                    for (i, ri) in r.iter().enumerate() {
                        _mm256_storeu_ps(kt.as_mut_ptr().add((c + i) * KEY_BLOCK + j0), *ri);
                    }
                }
            }
        }
    }

    /// Transposes 8 rows of 8 floats in place.
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn transpose8(r: &mut [__m256; 8]) {
        // Pairs of rows, then quads within 128-bit lanes: s[4h + b] holds rows 4h..4h + 4 of column b (low lane) and
        // 4 + b (high lane); then the lanes are recombined.
        let t: [__m256; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 { _mm256_unpacklo_ps(a, b) } else { _mm256_unpackhi_ps(a, b) }
        });
        let s: [__m256; 8] = std::array::from_fn(|i| {
            let (h, b) = (i / 4, i % 4);
            let (x, y) = (t[4 * h + b / 2], t[4 * h + 2 + b / 2]);
            if b % 2 == 0 { _mm256_shuffle_ps::<0x44>(x, y) } else { _mm256_shuffle_ps::<0xEE>(x, y) }
        });
        for b in 0..4 {
            r[b] = _mm256_permute2f128_ps::<0x20>(s[b], s[4 + b]);
            r[4 + b] = _mm256_permute2f128_ps::<0x31>(s[b], s[4 + b]);
        }
    }

    /// Transposes 16 rows of 16 floats in place (row `j`, column `i` -> row `i`, column `j`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn transpose16(r: &mut [__m512; 16]) {
        // Within 128-bit lanes: pairs of rows, then quads: u[4a + b] holds, in lane L, rows 4a..4a + 4 of column
        // 4L + b.
        let t: [__m512; 16] = std::array::from_fn(|i| {
            let (a, b) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 { _mm512_unpacklo_ps(a, b) } else { _mm512_unpackhi_ps(a, b) }
        });
        let u: [__m512; 16] = std::array::from_fn(|i| {
            let (a, b) = (i / 4 * 4 + (i % 4) / 2, i / 4 * 4 + 2 + (i % 4) / 2);
            let (a, b) = (_mm512_castps_pd(t[a]), _mm512_castps_pd(t[b]));
            _mm512_castpd_ps(if i % 2 == 0 { _mm512_unpacklo_pd(a, b) } else { _mm512_unpackhi_pd(a, b) })
        });
        // Across lanes: x[b] / y[b] gather rows 0..8 / 8..16 of columns b, 8 + b (even) and 4 + b, 12 + b (odd).
        for b in 0..4 {
            let xe = _mm512_shuffle_f32x4::<0x88>(u[b], u[4 + b]);
            let xo = _mm512_shuffle_f32x4::<0xdd>(u[b], u[4 + b]);
            let ye = _mm512_shuffle_f32x4::<0x88>(u[8 + b], u[12 + b]);
            let yo = _mm512_shuffle_f32x4::<0xdd>(u[8 + b], u[12 + b]);
            r[b] = _mm512_shuffle_f32x4::<0x88>(xe, ye);
            r[8 + b] = _mm512_shuffle_f32x4::<0xdd>(xe, ye);
            r[4 + b] = _mm512_shuffle_f32x4::<0x88>(xo, yo);
            r[12 + b] = _mm512_shuffle_f32x4::<0xdd>(xo, yo);
        }
    }

    /// [`simd::exp_approx`]'s polynomial on 16 lanes (the same constants, FMA-evaluated).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn exp512(x: __m512) -> __m512 {
        let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0)), _mm512_set1_ps(88.0));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_fmadd_ps(
            x,
            _mm512_set1_ps(std::f32::consts::LOG2_E),
            _mm512_set1_ps(0.5),
        ));
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.0e-1] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0)));
        _mm512_scalef_ps(y, n)
    }

    /// `acc[v][c] += Σ_{i in i0..i1} a[v][i] · b[i][c]` for `NV` vectors and `16 · NC` columns, where each `a[v][i]`
    /// and `b[i][c]` is a pair of bf16 numbers (low half first) and `·` is their two-term dot product
    /// (`vdpbf16ps`). `a` rows are `a_stride` words apart, `b` rows `b_stride`, `acc` rows `acc_stride` floats.
    /// Each output element is one chain over `i` in order, whatever `NV` and `NC` are.
    ///
    /// # Safety
    /// Needs AVX-512F/BW/BF16; all indices touched must be in bounds of the pointers' allocations.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512bf16")]
    pub unsafe fn dp_rows<const NV: usize, const NC: usize>(
        a: *const u32,
        a_stride: usize,
        b: *const u32,
        b_stride: usize,
        i0: usize,
        i1: usize,
        acc: *mut f32,
        acc_stride: usize,
    ) {
        unsafe {
            let mut c = [[_mm512_setzero_ps(); NC]; NV];
            for (v, cv) in c.iter_mut().enumerate() {
                for (k, ck) in cv.iter_mut().enumerate() {
                    *ck = _mm512_loadu_ps(acc.add(v * acc_stride + 16 * k));
                }
            }
            for i in i0..i1 {
                let bv: [__m512bh; NC] = std::array::from_fn(|k| {
                    std::mem::transmute(_mm512_loadu_si512(b.add(i * b_stride + 16 * k).cast()))
                });
                for (v, cv) in c.iter_mut().enumerate() {
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(v * a_stride + i) as i32));
                    for (ck, bk) in cv.iter_mut().zip(&bv) {
                        *ck = _mm512_dpbf16_ps(*ck, av, *bk);
                    }
                }
            }
            for (v, cv) in c.iter().enumerate() {
                for (k, ck) in cv.iter().enumerate() {
                    _mm512_storeu_ps(acc.add(v * acc_stride + 16 * k), *ck);
                }
            }
        }
    }
}

/// `c + a·b`, fused where the kernel is compiled with FMA (one rounding), else two roundings. Either way the same
/// for every call of one kernel, which is all batch invariance needs.
#[inline(always)]
fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// One tile: consecutive query rows of one sequence, all heads of KV group `t.g`, over the keys in blocks.
/// `F32_KV`: the cache holds f32 values (queries are not rounded; never with the bf16 products). `QK_BF16` /
/// `PV_BF16`: the score / value product with `vdpbf16ps` (only instantiated inside functions compiled with AVX-512
/// BF16, which [`x86::dp_rows`] needs).
#[inline(always)]
fn tile<const F32_KV: bool, const FMA: bool, const QK_BF16: bool, const PV_BF16: bool, const W: usize>(
    x: TileIn<'_>,
    sc: &mut Scratch,
) {
    let TileIn { shape, q, s, t, out } = x;
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
    const { assert!(!(F32_KV && (QK_BF16 || PV_BF16))) };
    if QK_BF16 {
        sc.qb.clear();
        sc.qb.extend(sc.q.chunks_exact(2).map(|p| bf16_pair(p[0], p[1])));
    } else if !F32_KV {
        simd::round_to_f16(&mut sc.q);
    }
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
    if QK_BF16 {
        sc.ktb.resize(hd / 2 * KEY_BLOCK, 0);
    }
    if PV_BF16 {
        sc.vb.resize(KEY_BLOCK / 2 * hd, 0);
        sc.pb.resize(r * KEY_BLOCK / 2, 0);
    }
    let mut kb = 0;
    while kb < n {
        let nk = KEY_BLOCK.min(n - kb);
        let col = t.g * hd;
        if PV_BF16 && !QK_BF16 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: PV_BF16 is instantiated only inside `x86::tile_512bf16` (features detected), whose head
            // dimension is a multiple of 16 (`AttnKernel::tile_fn`).
            unsafe {
                x86::load_block_f32_keys_bf16_values(s, kb, nk, col, hd, kv_dim, &mut sc.kt, &mut sc.vb)
            };
        } else if cfg!(target_arch = "x86_64") && !F32_KV && FMA && !QK_BF16 && hd.is_multiple_of(8) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: FMA kernels are instantiated only inside `x86::tile_512` / `x86::tile_256` (AVX2, FMA and F16C
            // detected); hd is a multiple of 8 and `sc.kt` holds `hd · KEY_BLOCK`.
            unsafe {
                x86::load_keys_f32(s, kb, nk, col, hd, kv_dim, &mut sc.kt)
            };
            load_block::<false, QK_BF16, PV_BF16, false>(s, kb, nk, col, hd, kv_dim, sc);
        } else {
            load_block::<F32_KV, QK_BF16, PV_BF16, true>(s, kb, nk, col, hd, kv_dim, sc);
        }
        // Query vectors that see at least one key of this block: rows at positions >= kb.
        let v0 = kb.saturating_sub(base) * group;
        let keys_seen = |v: usize| KEY_BLOCK.min(base + v / group + 1 - kb);
        if QK_BF16 {
            #[cfg(target_arch = "x86_64")]
            block_scores_bf16(hd, scale, &sc.qb, &sc.ktb, v0, r, &mut sc.scores);
        } else {
            block_scores::<FMA, W>(hd, scale, &sc.q, &sc.kt, v0, r, &mut sc.scores);
        }
        for v in v0..r {
            let nk_v = keys_seen(v);
            let srow: &mut [f32; KEY_BLOCK] = (&mut sc.scores[v * KEY_BLOCK..(v + 1) * KEY_BLOCK]).try_into().unwrap();
            let alpha;
            if PV_BF16 {
                #[cfg(target_arch = "x86_64")]
                {
                    let pb: &mut [u32; KEY_BLOCK / 2] =
                        (&mut sc.pb[v * KEY_BLOCK / 2..(v + 1) * KEY_BLOCK / 2]).try_into().unwrap();
                    // SAFETY: PV_BF16 is instantiated only inside `x86::tile_512bf16` (features detected).
                    alpha = unsafe { x86::softmax_block_bf16(srow, nk_v, &mut sc.max[v], &mut sc.sum[v], pb) };
                }
                #[cfg(not(target_arch = "x86_64"))]
                unreachable!("bf16 kernels exist on x86_64 only");
            } else {
                // The maximum is exact in any order; lane-wise so it vectorises (`>` rather than `f32::max`: no NaN
                // here).
                let mut lane_max = [f32::NEG_INFINITY; 16];
                for (c, chunk) in srow.chunks_exact(16).enumerate() {
                    for (l, (m, &x)) in lane_max.iter_mut().zip(chunk).enumerate() {
                        let x = if c * 16 + l < nk_v { x } else { f32::NEG_INFINITY };
                        *m = if x > *m { x } else { *m };
                    }
                }
                let block_max = lane_max.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
                let new_max = sc.max[v].max(block_max);
                alpha = if sc.max[v] == f32::NEG_INFINITY { 0.0 } else { simd::exp_approx(sc.max[v] - new_max) };
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
            }
            for a in &mut sc.acc[v * hd..(v + 1) * hd] {
                *a *= alpha;
            }
        }
        if PV_BF16 {
            #[cfg(target_arch = "x86_64")]
            block_values_bf16(hd, &sc.pb, &sc.vb, v0, r, &keys_seen, &mut sc.acc);
        } else {
            block_values::<FMA, W>(hd, &sc.scores, &sc.v, v0, r, &keys_seen, &mut sc.acc);
        }
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

/// Converts key block `kb..kb + nk` of KV head columns `col..col + hd` for the tile (from f32 values when `F32_KV`,
/// else f16): keys (unless `KEYS` is false: a vector loader did them) transposed into `sc.kt` (`[hd, KEY_BLOCK]`
/// f32) or as bf16 pairs into `sc.ktb`, values into `sc.v` (`[KEY_BLOCK, hd]` f32) and, for the bf16 value product,
/// as bf16 pairs of consecutive keys into `sc.vb`; everything past `nk` keys is zero.
#[inline(always)]
fn load_block<const F32_KV: bool, const QK_BF16: bool, const PV_BF16: bool, const KEYS: bool>(
    s: &SeqAttn<'_>,
    kb: usize,
    nk: usize,
    col: usize,
    hd: usize,
    kv_dim: usize,
    sc: &mut Scratch,
) {
    let words = if F32_KV { 2 } else { 1 };
    for j in 0..nk {
        let (blk, row) = ((kb + j) / s.block_tokens, (kb + j) % s.block_tokens);
        let at = (row * kv_dim + col) * words;
        if KEYS {
            kv_to_f32::<F32_KV>(&s.k[blk][at..][..hd * words], &mut sc.row);
            if QK_BF16 {
                for (e, p) in sc.row.chunks_exact(2).enumerate() {
                    sc.ktb[e * KEY_BLOCK + j] = bf16_pair(p[0], p[1]);
                }
            } else {
                for (d, &x) in sc.row.iter().enumerate() {
                    sc.kt[d * KEY_BLOCK + j] = x;
                }
            }
        }
        kv_to_f32::<F32_KV>(&s.v[blk][at..][..hd * words], &mut sc.v[j * hd..(j + 1) * hd]);
    }
    if KEYS && nk < KEY_BLOCK {
        if QK_BF16 {
            for e in 0..hd / 2 {
                sc.ktb[e * KEY_BLOCK + nk..(e + 1) * KEY_BLOCK].fill(0);
            }
        } else {
            for d in 0..hd {
                sc.kt[d * KEY_BLOCK + nk..(d + 1) * KEY_BLOCK].fill(0.0);
            }
        }
    }
    if PV_BF16 {
        // Pairs of consecutive keys; keys past the block's end are zero (their weights are zero too).
        let (v, vb) = (&sc.v, &mut sc.vb);
        for (i, out) in vb.chunks_exact_mut(hd).enumerate() {
            let (j0, j1) = (2 * i, 2 * i + 1);
            if j1 < nk {
                let (a, b) = (&v[j0 * hd..(j0 + 1) * hd], &v[j1 * hd..(j1 + 1) * hd]);
                for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                    *o = bf16_pair(x, y);
                }
            } else if j0 < nk {
                for (o, &x) in out.iter_mut().zip(&v[j0 * hd..(j0 + 1) * hd]) {
                    *o = bf16_bits(x);
                }
            } else {
                out.fill(0);
            }
        }
    }
}

/// `scores[v, j] = scale · Σ_d q[v, d] · kt[d, j]` for query vectors `v0..r`, the sum in `d` order, [`VEC_TILE`]
/// vectors at a time (or one: the same operations per score either way).
#[inline(always)]
fn block_scores<const FMA: bool, const W: usize>(
    hd: usize,
    scale: f32,
    q: &[f32],
    kt: &[f32],
    v0: usize,
    r: usize,
    out: &mut [f32],
) {
    const { assert!(KEY_BLOCK.is_multiple_of(W)) };
    let mut v = v0;
    while v + VEC_TILE <= r {
        let qs: [&[f32]; VEC_TILE] = std::array::from_fn(|i| &q[(v + i) * hd..(v + i + 1) * hd]);
        // `W` keys at a time: `VEC_TILE` × `W` accumulators stay in registers (W = 64 on AVX-512's 32 registers, 16
        // on AVX2's 16: wider, they spill and the loop runs from memory).
        for c0 in (0..KEY_BLOCK).step_by(W) {
            let mut acc = [[0f32; W]; VEC_TILE];
            for d in 0..hd {
                let k: [f32; W] = kt[d * KEY_BLOCK + c0..][..W].try_into().unwrap();
                for (a, qi) in acc.iter_mut().zip(&qs) {
                    let x = qi[d];
                    for j in 0..W {
                        a[j] = fmadd::<FMA>(x, k[j], a[j]);
                    }
                }
            }
            for (i, a) in acc.iter().enumerate() {
                for (o, x) in out[(v + i) * KEY_BLOCK + c0..][..W].iter_mut().zip(a) {
                    *o = x * scale;
                }
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

/// [`block_scores`] with bf16 pairs: `qb` `[vectors, hd / 2]`, `ktb` `[hd / 2, KEY_BLOCK]`. Each score is one
/// `vdpbf16ps` chain over the head dimension in pair order, then scaled.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn block_scores_bf16(hd: usize, scale: f32, qb: &[u32], ktb: &[u32], v0: usize, r: usize, out: &mut [f32]) {
    let half = hd / 2;
    assert!(qb.len() >= r * half && ktb.len() >= half * KEY_BLOCK && out.len() >= r * KEY_BLOCK);
    out[v0 * KEY_BLOCK..r * KEY_BLOCK].fill(0.0);
    let mut v = v0;
    // SAFETY: the kernel runs only inside `x86::tile_512bf16` (features detected); the asserts above bound every
    // row touched (vectors < r, pairs < hd / 2, KEY_BLOCK = 64 columns).
    unsafe {
        while v + VEC_TILE <= r {
            let acc = out[v * KEY_BLOCK..].as_mut_ptr();
            x86::dp_rows::<VEC_TILE, 4>(
                qb[v * half..].as_ptr(),
                half,
                ktb.as_ptr(),
                KEY_BLOCK,
                0,
                half,
                acc,
                KEY_BLOCK,
            );
            v += VEC_TILE;
        }
        while v < r {
            let acc = out[v * KEY_BLOCK..].as_mut_ptr();
            x86::dp_rows::<1, 4>(qb[v * half..].as_ptr(), half, ktb.as_ptr(), KEY_BLOCK, 0, half, acc, KEY_BLOCK);
            v += 1;
        }
    }
    for x in &mut out[v0 * KEY_BLOCK..r * KEY_BLOCK] {
        *x *= scale;
    }
}

/// [`block_values`] with bf16 pairs: weights `pb` `[vectors, KEY_BLOCK / 2]`, values `vb` `[KEY_BLOCK / 2, hd]`.
/// Each output element is one `vdpbf16ps` chain over the key pairs a vector sees (a last odd key pairs with a zero
/// weight): [`VEC_TILE`] vectors at a time over the pairs all of them see, then each alone over the rest.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn block_values_bf16(
    hd: usize,
    pb: &[u32],
    vb: &[u32],
    v0: usize,
    r: usize,
    keys_seen: &dyn Fn(usize) -> usize,
    acc: &mut [f32],
) {
    const HALF: usize = KEY_BLOCK / 2;
    assert!(pb.len() >= r * HALF && vb.len() >= HALF * hd && acc.len() >= r * hd && hd.is_multiple_of(16));
    let pairs = |v: usize| keys_seen(v).div_ceil(2);
    // One group of vectors over pairs `i0..i1`, all columns.
    // SAFETY: inside `x86::tile_512bf16` only; vectors < r, pairs <= HALF, columns < hd (multiple of 16), as asserted.
    let run = |acc: &mut [f32], v: usize, nv: usize, i0: usize, i1: usize| unsafe {
        let (a, b, c) = (pb[v * HALF..].as_ptr(), vb.as_ptr(), acc[v * hd..].as_mut_ptr());
        let mut d0 = 0;
        while d0 + 64 <= hd {
            match nv {
                VEC_TILE => x86::dp_rows::<VEC_TILE, 4>(a, HALF, b.add(d0), hd, i0, i1, c.add(d0), hd),
                _ => x86::dp_rows::<1, 4>(a, HALF, b.add(d0), hd, i0, i1, c.add(d0), hd),
            }
            d0 += 64;
        }
        while d0 < hd {
            match nv {
                VEC_TILE => x86::dp_rows::<VEC_TILE, 1>(a, HALF, b.add(d0), hd, i0, i1, c.add(d0), hd),
                _ => x86::dp_rows::<1, 1>(a, HALF, b.add(d0), hd, i0, i1, c.add(d0), hd),
            }
            d0 += 16;
        }
    };
    let mut v = v0;
    while v < r {
        if v + VEC_TILE <= r {
            let common = (v..v + VEC_TILE).map(pairs).min().unwrap_or(0);
            run(acc, v, VEC_TILE, 0, common);
            for i in v..v + VEC_TILE {
                run(acc, i, 1, common, pairs(i));
            }
            v += VEC_TILE;
        } else {
            run(acc, v, 1, 0, pairs(v));
            v += 1;
        }
    }
}

/// `acc[v, :] += Σ_j p[v, j] · vals[j, :]` over the `keys_seen(v)` keys vector `v` sees, in key order. Vectors go
/// [`VEC_TILE`] at a time over the keys all of them see, then each alone over the rest of its keys, which continues
/// the same per-element chains.
#[inline(always)]
fn block_values<const FMA: bool, const W: usize>(
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
        // `W` columns at a time, so the `VEC_TILE` × `W` accumulators stay in registers (as in `block_scores`).
        if nv == VEC_TILE && hd.is_multiple_of(W) {
            for d0 in (0..hd).step_by(W) {
                let mut a = [[0f32; W]; VEC_TILE];
                for (i, ai) in a.iter_mut().enumerate() {
                    ai.copy_from_slice(&acc[(v + i) * hd + d0..][..W]);
                }
                let ps: [&[f32]; VEC_TILE] = std::array::from_fn(|i| &p[(v + i) * KEY_BLOCK..][..common]);
                for (j, x) in vals[..common * hd].chunks_exact(hd).enumerate() {
                    let x: [f32; W] = x[d0..d0 + W].try_into().unwrap();
                    for (ai, pi) in a.iter_mut().zip(&ps) {
                        let w = pi[j];
                        for d in 0..W {
                            ai[d] = fmadd::<FMA>(w, x[d], ai[d]);
                        }
                    }
                }
                for (i, ai) in a.iter().enumerate() {
                    acc[(v + i) * hd + d0..][..W].copy_from_slice(ai);
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

/// Cache words to f32 values: two words per f32 (low half first) when `F32_KV`, else one f16 each.
#[inline(always)]
fn kv_to_f32<const F32_KV: bool>(src: &[u16], dst: &mut [f32]) {
    if F32_KV {
        for (d, w) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *d = f32::from_bits(w[0] as u32 | (w[1] as u32) << 16);
        }
    } else {
        half_to_f32(src, dst);
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

    /// The vectorised loaders (bf16 values, f32 keys) write exactly what the portable one does: every key block length, block
    /// size, KV head column and value (incl. f16 subnormals, zeros and large magnitudes).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_block_loader_matches_the_portable_one_bitwise() {
        if !AttnKernel::available().contains(&AttnKernel::Bf16Values) {
            eprintln!("skipping: no AVX-512 BF16");
            return;
        }
        let (hd, kv_dim) = (64, 128);
        let num_keys = 200;
        let mut seed = 0x9e37_79b9u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        let mut vals = |n: usize| -> Vec<u16> {
            (0..n)
                .map(|i| match i % 11 {
                    0 => 0,
                    1 => (next() & 0x83ff) as u16, // subnormal or zero, either sign
                    _ => half::f16::from_f32((next() as i32 as f32) / 2e9 * 3000.0).to_bits(),
                })
                .collect()
        };
        let (k, v) = (vals(num_keys * kv_dim), vals(num_keys * kv_dim));
        for block_tokens in [16, 7, num_keys] {
            let s = paged(&k, &v, KvType::F16, kv_dim, block_tokens, 0, 1);
            for (kb, nk) in [(0, 64), (64, 64), (128, 1), (128, 17), (192, 8), (128, 63), (0, 33)] {
                for col in [0, 64] {
                    let mut want = Scratch::default();
                    want.kt.resize(hd * KEY_BLOCK, f32::NAN);
                    want.v.resize(KEY_BLOCK * hd, 0.0);
                    want.vb.resize(KEY_BLOCK / 2 * hd, 7);
                    want.row.resize(hd, 0.0);
                    load_block::<false, false, true, true>(&s, kb, nk, col, hd, kv_dim, &mut want);
                    let mut kt = vec![f32::NAN; hd * KEY_BLOCK];
                    let mut vb = vec![7u32; KEY_BLOCK / 2 * hd];
                    // SAFETY: features checked above; sizes as required.
                    unsafe { x86::load_block_f32_keys_bf16_values(&s, kb, nk, col, hd, kv_dim, &mut kt, &mut vb) };
                    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    let at = format!("block_tokens {block_tokens}, keys {kb}+{nk}, column {col}");
                    assert_eq!(bits(&kt), bits(&want.kt), "keys differ: {at}");
                    assert_eq!(vb, want.vb, "values differ: {at}");
                    // The f32 kernels' key loader (AVX2).
                    let mut kt = vec![f32::NAN; hd * KEY_BLOCK];
                    // SAFETY: AVX-512 BF16 implies AVX2, FMA and F16C here; sizes as required.
                    unsafe { x86::load_keys_f32(&s, kb, nk, col, hd, kv_dim, &mut kt) };
                    assert_eq!(bits(&kt), bits(&want.kt), "f32 keys differ: {at}");
                }
            }
        }
    }

    /// Straightforward f64 attention for one query row seeing `n` keys (`k`, `v`: the cache's values), with an error
    /// allowance per output element for `kernel` over a cache of `kv`: with f32 values 1e-5 relative (f32 products,
    /// the approximate exp); with f16 values 3e-3 (f16 queries too); for bf16 weights and values,
    /// `2^-7 · Σ_j p_j (|v_j| + |v_j - out|)` more (each rounding is at most 2^-9 relative); for bf16 queries and
    /// keys, each score off by up to `2^-8 · scale · Σ_d |q_d k_jd|`, which moves the output by up to
    /// `Σ_j p_j · 2 δ_j · |v_j - out|`.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        kernel: AttnKernel,
        kv: KvType,
        shape: AttnShape,
        q: &[f32],
        k: &[f64],
        v: &[f64],
        n: usize,
    ) -> Vec<(f64, f64)> {
        let (hd, kvd) = (shape.head_dim, shape.num_kv_heads * shape.head_dim);
        let group = shape.num_heads / shape.num_kv_heads;
        let scale = shape.scale as f64;
        let bf16 = kv == KvType::F16 && shape.head_dim.is_multiple_of(16);
        let mut out = vec![(0f64, 0f64); shape.num_heads * hd];
        for h in 0..shape.num_heads {
            let g = h / group;
            let qk = |j: usize, d: usize| q[h * hd + d] as f64 * k[j * kvd + g * hd + d];
            let s: Vec<f64> = (0..n).map(|j| (0..hd).map(|d| qk(j, d)).sum::<f64>() * scale).collect();
            let ds: Vec<f64> = (0..n).map(|j| (0..hd).map(|d| qk(j, d).abs()).sum::<f64>() * scale / 256.0).collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                let val = |j: usize| v[j * kvd + g * hd + d];
                let o: f64 = (0..n).map(|j| e[j] / z * val(j)).sum();
                let mut tol = if kv == KvType::F32 { 1e-5 } else { 3e-3 } * o.abs().max(1.0);
                if bf16 && matches!(kernel, AttnKernel::Bf16 | AttnKernel::Bf16Values) {
                    tol += (0..n).map(|j| e[j] / z * (val(j).abs() + (val(j) - o).abs())).sum::<f64>() / 128.0;
                }
                if bf16 && kernel == AttnKernel::Bf16 {
                    tol += (0..n).map(|j| e[j] / z * 2.0 * ds[j] * (val(j) - o).abs()).sum::<f64>();
                }
                out[h * hd + d] = (o, tol);
            }
        }
        out
    }

    /// `x` as a cache of `kv` values (words) and the values it holds.
    fn cache(kv: KvType, x: &[f32]) -> (Vec<u16>, Vec<f64>) {
        match kv {
            KvType::F16 => {
                let bits: Vec<u16> = x.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
                let vals = bits.iter().map(|&b| f16(b)).collect();
                (bits, vals)
            }
            KvType::F32 => (
                x.iter().flat_map(|v| [v.to_bits() as u16, (v.to_bits() >> 16) as u16]).collect(),
                x.iter().map(|&v| v as f64).collect(),
            ),
        }
    }

    /// Checks a row against the reference; returns the largest error and the largest error / allowance.
    fn check(got: &[f32], want: &[(f64, f64)], what: &str) -> (f64, f64) {
        let (mut max_err, mut max_ratio) = (0f64, 0f64);
        for (a, &(b, tol)) in got.iter().zip(want) {
            let err = (*a as f64 - b).abs();
            assert!(err <= tol, "{what}: {a} vs {b} (allowed {tol:.2e})");
            max_err = max_err.max(err);
            max_ratio = max_ratio.max(err / tol);
        }
        (max_err, max_ratio)
    }

    /// A paged cache: blocks of `block_tokens` positions of `kv_dim` values of `kv`.
    fn paged<'a>(
        k: &'a [u16],
        v: &'a [u16],
        kv: KvType,
        kv_dim: usize,
        block_tokens: usize,
        start_pos: usize,
        num_rows: usize,
    ) -> SeqAttn<'a> {
        let words = block_tokens * kv_dim * kv.words();
        SeqAttn {
            k: k.chunks(words).collect(),
            v: v.chunks(words).collect(),
            kv_type: kv,
            block_tokens,
            start_pos,
            num_rows,
        }
    }

    #[test]
    fn matches_reference_for_decode_prefill_and_mixed_batches() {
        for kv in [KvType::F16, KvType::F32] {
            for kernel in AttnKernel::available() {
                for hd in [16, 24, 64] {
                    let shape =
                        AttnShape { num_heads: 6, num_kv_heads: 2, head_dim: hd, scale: 1.0 / (hd as f32).sqrt() };
                    let (kvd, qd) = (2 * hd, 6 * hd);
                    let f = |i: usize, s: f32| ((i * 2654435761 % 1000) as f32 / 500.0 - 1.0) * s;
                    let n = 140;
                    let fill = |o: usize, s: f32| cache(kv, &(0..n * kvd).map(|i| f(i + o, s)).collect::<Vec<_>>());
                    let (k, v, k2, v2) = (fill(0, 2.0), fill(7, 2.0), fill(11, 2.6), fill(5, 0.7));
                    // A 97-row prefill chunk at position 3, a single decode row (the cache in blocks of 16, the last
                    // one short), a 3-row verification run.
                    let seqs = [
                        paged(&k.0, &v.0, kv, kvd, n, 3, 97),
                        paged(&k2.0, &v2.0, kv, kvd, 16, 120, 1),
                        paged(&k2.0, &v2.0, kv, kvd, n, 30, 3),
                    ];
                    let vals = [(&k.1, &v.1), (&k2.1, &v2.1), (&k2.1, &v2.1)];
                    let m = 101;
                    let q: Vec<f32> = (0..m * qd).map(|i| f(i + 3, 1.5)).collect();
                    let mut out = vec![f32::NAN; m * qd];
                    let pool = ThreadPool::new(2);
                    attention_with(kernel, &pool, shape, &q, &seqs, &mut out);
                    let (mut row, mut max_err, mut max_ratio) = (0, 0f64, 0f64);
                    for (s, (kv_k, kv_v)) in seqs.iter().zip(vals) {
                        for i in 0..s.num_rows {
                            let qr = &q[row * qd..(row + 1) * qd];
                            let want = reference(kernel, kv, shape, qr, kv_k, kv_v, s.start_pos + i + 1);
                            let what = format!("{kv:?} {kernel:?} hd {hd} row {row}");
                            let (e, r) = check(&out[row * qd..(row + 1) * qd], &want, &what);
                            (max_err, max_ratio) = (max_err.max(e), max_ratio.max(r));
                            row += 1;
                        }
                    }
                    eprintln!("{kv:?} {kernel:?} hd {hd}: max |err| {max_err:.2e}, max err / allowance {max_ratio:.2}");
                }
            }
        }
    }

    /// A row's output is bitwise the same whether it is computed alone (decode), in a long prefill call, or in
    /// uneven chunks next to another sequence: across key blocks, tile boundaries and both value-product paths;
    /// for every kernel this CPU has, over f16 and f32 caches.
    #[test]
    fn rows_are_bitwise_independent_of_batching_and_chunking() {
        for kv in [KvType::F16, KvType::F32] {
            for kernel in AttnKernel::available() {
                for (num_heads, num_kv_heads, hd) in [(14, 2, 64), (6, 2, 128), (6, 3, 16)] {
                    let shape = AttnShape { num_heads, num_kv_heads, head_dim: hd, scale: 1.0 / (hd as f32).sqrt() };
                    let (kvd, qd) = (num_kv_heads * hd, num_heads * hd);
                    let n = 150;
                    let f = |i: usize, s: f32| ((i * 2654435761 % 1000) as f32 / 500.0 - 1.0) * s;
                    let (k, kf) = cache(kv, &(0..n * kvd).map(|i| f(i, 2.0)).collect::<Vec<_>>());
                    let (v, vf) = cache(kv, &(0..n * kvd).map(|i| f(i + 7, 1.0)).collect::<Vec<_>>());
                    let q: Vec<f32> = (0..n * qd).map(|i| f(i + 3, 1.5)).collect();
                    let seq = |start: usize, rows: usize| paged(&k, &v, kv, kvd, 16, start, rows);
                    let pool = ThreadPool::new(2);
                    let run = |q: &[f32], seqs: &[SeqAttn<'_>], out: &mut [f32]| {
                        attention_with(kernel, &pool, shape, q, seqs, out)
                    };
                    let mut all = vec![f32::NAN; n * qd];
                    run(&q, &[seq(0, n)], &mut all);
                    let what = format!("{kv:?} {kernel:?} shape {shape:?}");
                    // Each row alone.
                    for i in [0, 1, 15, 16, 63, 64, 65, 100, 127, 128, 149] {
                        let mut one = vec![f32::NAN; qd];
                        run(&q[i * qd..(i + 1) * qd], &[seq(i, 1)], &mut one);
                        assert_eq!(bits(&one), bits(&all[i * qd..(i + 1) * qd]), "{what} row {i} alone");
                    }
                    // Uneven chunks, each next to an unrelated single row of another sequence.
                    let mut start = 0;
                    for len in [5, 40, 1, 70, 34] {
                        let mut qq = q[start * qd..(start + len) * qd].to_vec();
                        qq.extend_from_slice(&q[..qd]);
                        let mut got = vec![f32::NAN; (len + 1) * qd];
                        run(&qq, &[seq(start, len), seq(90, 1)], &mut got);
                        let want = &all[start * qd..(start + len) * qd];
                        assert_eq!(bits(&got[..len * qd]), bits(want), "{what} at {start}");
                        start += len;
                    }
                    // And the whole run against the f64 reference.
                    for i in [0, 64, 149] {
                        let want = reference(kernel, kv, shape, &q[i * qd..(i + 1) * qd], &kf, &vf, i + 1);
                        check(&all[i * qd..(i + 1) * qd], &want, &format!("{what} row {i}"));
                    }
                }
            }
        }
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }
}
