//! Every op of the `Backend` trait, on every available backend, over the fixture shapes (Qwen2.5-Coder 0.5B, 1.5B,
//! 32B and an odd small one), against plain f32/f64 references written here (llm.c's `dev/cuda` habit). Outputs are
//! poisoned (NaN-filled) before each op, so a row the op forgets to write fails the test.
//!
//! `cargo test --release -p splash-backend --test ops` (the CUDA half skips without a GPU; `SPLASH_CUDA_CACHE=DIR`
//! keeps its compiled kernels).
//!
//! Tolerances, per op (the numbers `Backend` promises):
//! - embedding, gather_rows, add: exact;
//! - rms_norm (both kinds, per row and per head), rope (full and partial, both styles), swiglu: `1e-5 · max|ref|`
//!   (rope `1e-3`: the angle `pos · f` is rounded to f32, as in ggml);
//! - linear: `|y − ref| ≤ Σ_i |w_i| · amax(x's activation block of i) / 127 + 1e-4 · Σ_i |w_i x_i|`, the input's
//!   8-bit quantization error bound (Q8_0 blocks of 32, Q8_K of 256; none for f16/f32 weights);
//! - paged_attention: queries, keys and values rounded to f16 in the reference; `1e-2 · max|v|` (the default kernel on
//!   AVX512_BF16 rounds the softmax weights and values to bf16 for P·V);
//! - ffn_sublayer: `2e-2 · Σ_j |down_ij h_j|` per output (the input quantization of three products compounds).

use backend::cpu::matmul::Bytes;
use backend::cpu::quant::Layout;
use backend::cpu::{CpuBackend, QMatrix};
use backend::{
    AttnRows, AttnShape, Backend, FfnWeights, KvLayout, KvType, MatrixUse, Norm, NormKind, RopeSpec, RopeStyle,
    SeqRows, Widths, Workspace,
};
use gguf::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The shapes of one model.
#[derive(Debug, Clone, Copy)]
struct Fixture {
    name: &'static str,
    hidden: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    rope_dim: usize,
}

const FIXTURES: [Fixture; 4] = [
    Fixture { name: "0.5b", hidden: 896, num_heads: 14, num_kv_heads: 2, head_dim: 64, ffn: 4864, rope_dim: 64 },
    Fixture { name: "1.5b", hidden: 1536, num_heads: 12, num_kv_heads: 2, head_dim: 128, ffn: 8960, rope_dim: 128 },
    Fixture { name: "32b", hidden: 5120, num_heads: 40, num_kv_heads: 8, head_dim: 128, ffn: 27648, rope_dim: 128 },
    // Odd: 5 query heads over 1 KV head, partial RoPE, row lengths that are no multiple of 256.
    Fixture { name: "odd", hidden: 320, num_heads: 5, num_kv_heads: 1, head_dim: 64, ffn: 608, rope_dim: 32 },
];

fn q_dim(f: &Fixture) -> usize {
    f.num_heads * f.head_dim
}

fn kv_dim(f: &Fixture) -> usize {
    f.num_kv_heads * f.head_dim
}

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

fn random(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// A tensor of `rows × cols` NaNs.
fn poisoned<B: Backend>(b: &mut B, rows: usize, cols: usize) -> B::Tensor {
    let mut t = b.alloc(rows, cols).expect("alloc");
    b.write(&mut t, &vec![f32::NAN; rows * cols]).expect("write");
    t
}

fn tensor<B: Backend>(b: &mut B, cols: usize, data: &[f32]) -> B::Tensor {
    let mut t = b.alloc(data.len() / cols, cols).expect("alloc");
    b.write(&mut t, data).expect("write");
    t
}

/// Every value finite and within `tol` of the reference.
fn assert_close(what: &str, got: &[f32], want: &[f64], tol: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}[{i}]: {g} (not written?)");
        let e = (g as f64 - w).abs();
        assert!(e <= tol(i), "{what}[{i}]: {g} vs {w} (error {e:.3e} > {:.3e})", tol(i));
    }
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// A `[rows, cols]` matrix of type `ty` from random values, and its dequantized f32 rows.
fn matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut StdRng) -> (QMatrix, Vec<f32>) {
    let vals = random(rng, rows * cols, 0.5);
    let bytes: Vec<u8> = vals.chunks(cols).flat_map(|r| gguf::quant::quantize(ty, r).expect("quantize")).collect();
    let mut deq = vec![0f32; rows * cols];
    gguf::quant::dequantize(ty, &bytes, &mut deq).expect("dequantize");
    (QMatrix { ty, rows, cols, layout: Layout::Gguf, bytes: Bytes::from_vec(bytes) }, deq)
}

/// The weight types whose blocks divide `cols`.
fn types_for(cols: usize) -> Vec<GgmlType> {
    let mut t = vec![GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0];
    if cols.is_multiple_of(256) {
        t.extend([GgmlType::Q4_K, GgmlType::Q6_K]);
    }
    t
}

/// Elements per block of the activation format `ty`'s kernels quantize the input to (0: none).
fn act_block(ty: GgmlType) -> usize {
    match ty {
        GgmlType::F16 | GgmlType::F32 | GgmlType::BF16 => 0,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => 256,
        _ => 32,
    }
}

// --- The ops ---

fn embedding<B: Backend>(b: &mut B) {
    let mut r = rng(1);
    for f in FIXTURES {
        for ty in types_for(f.hidden) {
            let (m, deq) = matrix(ty, 300, f.hidden, &mut r);
            let table = b.load_matrix(&m, MatrixUse::Embedding).expect("load");
            let tokens = [7u32, 0, 299, 7, 123];
            let mut out = poisoned(b, tokens.len(), f.hidden);
            b.embedding(&table, &tokens, &mut out).expect("embedding");
            let want: Vec<f64> =
                tokens.iter().flat_map(|&t| &deq[t as usize * f.hidden..][..f.hidden]).map(|&v| v as f64).collect();
            assert_close(&format!("{} {ty} embedding", f.name), &b.read(&out, tokens.len()).unwrap(), &want, |_| 0.0);
        }
    }
}

fn gather_rows_and_add<B: Backend>(b: &mut B) {
    let mut r = rng(2);
    for f in FIXTURES {
        let x = random(&mut r, 9 * f.hidden, 3.0);
        let y = random(&mut r, 9 * f.hidden, 3.0);
        let xt = tensor(b, f.hidden, &x);
        let rows = [8usize, 0, 3];
        let mut out = poisoned(b, rows.len(), f.hidden);
        b.gather_rows(&xt, &rows, &mut out).expect("gather_rows");
        let want: Vec<f64> = rows.iter().flat_map(|&i| &x[i * f.hidden..][..f.hidden]).map(|&v| v as f64).collect();
        assert_close(&format!("{} gather_rows", f.name), &b.read(&out, 3).unwrap(), &want, |_| 0.0);

        let mut s = tensor(b, f.hidden, &x);
        let yt = tensor(b, f.hidden, &y);
        b.add(&mut s, &yt, 9).expect("add");
        let want: Vec<f64> = x.iter().zip(&y).map(|(a, c)| (a + c) as f64).collect();
        assert_close(&format!("{} add", f.name), &b.read(&s, 9).unwrap(), &want, |_| 0.0);
    }
}

fn rms_ref(x: &[f32], w: &[f32], eps: f32, kind: NormKind) -> Vec<f64> {
    let d = w.len();
    x.chunks(d)
        .flat_map(|r| {
            let ms = r.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64;
            let s = 1.0 / (ms + eps as f64).sqrt();
            r.iter().zip(w).map(move |(&v, &w)| {
                let w = if kind == NormKind::OnePlus { 1.0 + w as f64 } else { w as f64 };
                v as f64 * s * w
            })
        })
        .collect()
}

fn rms_norm<B: Backend>(b: &mut B) {
    let mut r = rng(3);
    for f in FIXTURES {
        for kind in [NormKind::Plain, NormKind::OnePlus] {
            // Per row over [rows, hidden], then per head over [rows, q_dim] in place.
            for (dim, cols) in [(f.hidden, f.hidden), (f.head_dim, q_dim(&f))] {
                let rows = 7;
                let x = random(&mut r, rows * cols, 4.0);
                let w = random(&mut r, dim, 1.5);
                let norm = Norm { weight: b.load_vector(&w).unwrap(), dim, eps: 1e-6, kind };
                let want = rms_ref(&x, &w, 1e-6, kind);
                let tol = 1e-5 * max_abs(&want);
                let xt = tensor(b, cols, &x);
                let mut out = poisoned(b, rows, cols);
                b.rms_norm(&xt, rows, &norm, &mut out).expect("rms_norm");
                let what = format!("{} rms_norm {kind:?} dim {dim}", f.name);
                assert_close(&what, &b.read(&out, rows).unwrap(), &want, |_| tol);
                let mut xt = tensor(b, cols, &x);
                b.rms_norm_in_place(&mut xt, rows, &norm).expect("rms_norm_in_place");
                assert_close(&format!("{what} in place"), &b.read(&xt, rows).unwrap(), &want, |_| tol);
            }
        }
    }
}

fn linear_ref(deq: &[f32], cols: usize, x: &[f32], bias: Option<&[f32]>, ty: GgmlType) -> (Vec<f64>, Vec<f64>) {
    let blk = act_block(ty);
    let mut want = Vec::new();
    let mut tol = Vec::new();
    for xr in x.chunks(cols) {
        let amax: Vec<f64> = match blk {
            0 => vec![0.0; cols],
            n => xr.chunks(n).flat_map(|c| vec![c.iter().fold(0f64, |m, &v| m.max(v.abs() as f64)); c.len()]).collect(),
        };
        for (j, wr) in deq.chunks(cols).enumerate() {
            let dot: f64 = wr.iter().zip(xr).map(|(&w, &v)| w as f64 * v as f64).sum();
            let abs: f64 = wr.iter().zip(xr).map(|(&w, &v)| (w as f64 * v as f64).abs()).sum();
            let quant: f64 = wr.iter().zip(&amax).map(|(&w, &a)| w.abs() as f64 * a / 127.0).sum();
            want.push(dot + bias.map_or(0.0, |b| b[j] as f64));
            tol.push(quant + 1e-4 * abs + 1e-6);
        }
    }
    (want, tol)
}

fn linear<B: Backend>(b: &mut B) {
    let mut r = rng(4);
    for f in FIXTURES {
        // The row lengths every matrix of the model has (hidden: Q/K/V, gate/up; q_dim: output; ffn: down), with
        // enough output rows to fill every kernel's tiles without the 32B's full matrices.
        let shapes = [(kv_dim(&f) + 5 * 8, f.hidden), (f.hidden.min(1024), q_dim(&f)), (256, f.ffn)];
        for (rows_out, cols) in shapes {
            for ty in types_for(cols) {
                // Decode (1), verification (5) and prefill-sized (70) inputs.
                for m in [1, 5, 33] {
                    let x = random(&mut r, m * cols, 2.0);
                    let (w1, d1) = matrix(ty, rows_out, cols, &mut r);
                    let (w2, d2) = matrix(ty, 96, cols, &mut r);
                    let bias = random(&mut r, 96, 1.0);
                    let w1 = b.load_matrix(&w1, MatrixUse::Linear).expect("load");
                    let w2 = b.load_matrix(&w2, MatrixUse::Linear).expect("load");
                    let bv = b.load_vector(&bias).unwrap();
                    let xt = tensor(b, cols, &x);
                    let mut o1 = poisoned(b, m, rows_out);
                    let mut o2 = poisoned(b, m, 96);
                    // Two matrices over one input, the second with a bias.
                    b.linear(&xt, m, &[&w1, &w2], &[None, Some(&bv)], &mut [&mut o1, &mut o2]).expect("linear");
                    let what = format!("{} {ty} linear [{rows_out}, {cols}] × {m} rows", f.name);
                    let (want, tol) = linear_ref(&d1, cols, &x, None, ty);
                    assert_close(&what, &b.read(&o1, m).unwrap(), &want, |i| tol[i]);
                    let (want, tol) = linear_ref(&d2, cols, &x, Some(&bias), ty);
                    assert_close(&format!("{what} (biased)"), &b.read(&o2, m).unwrap(), &want, |i| tol[i]);
                }
            }
        }
    }
}

fn rope_ref(x: &[f32], positions: &[usize], spec: &RopeSpec) -> Vec<f64> {
    let half = spec.rope_dim / 2;
    let step = spec.theta.powf(-2.0 / spec.rope_dim as f32);
    let mut inv = Vec::new();
    let mut f = 1f32;
    for _ in 0..half {
        inv.push(f);
        f *= step;
    }
    let cols = x.len() / positions.len();
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (t, &pos) in positions.iter().enumerate() {
        for head in out[t * cols..(t + 1) * cols].chunks_mut(spec.head_dim) {
            for (i, &fr) in inv.iter().enumerate() {
                let (s, c) = (pos as f64 * fr as f64).sin_cos();
                let (a, b) = match spec.style {
                    RopeStyle::Neox => (i, i + half),
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                };
                let (va, vb) = (head[a], head[b]);
                head[a] = va * c - vb * s;
                head[b] = va * s + vb * c;
            }
        }
    }
    out
}

fn rope<B: Backend>(b: &mut B) {
    let mut r = rng(5);
    for f in FIXTURES {
        for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
            // Full (the fixture's own) and partial (half the head) rotation.
            for rope_dim in [f.rope_dim, f.head_dim / 2] {
                let spec = RopeSpec { style, head_dim: f.head_dim, rope_dim, theta: 1e6 };
                let positions = [0usize, 1, 17, 4095, 4096];
                let cols = q_dim(&f);
                let x = random(&mut r, positions.len() * cols, 2.0);
                let mut xt = tensor(b, cols, &x);
                b.rope(&mut xt, &positions, &spec).expect("rope");
                let want = rope_ref(&x, &positions, &spec);
                let tol = 1e-3 * max_abs(&want);
                let what = format!("{} rope {style:?} {rope_dim}/{}", f.name, f.head_dim);
                assert_close(&what, &b.read(&xt, positions.len()).unwrap(), &want, |_| tol);
            }
        }
    }
}

fn swiglu<B: Backend>(b: &mut B) {
    let mut r = rng(6);
    for f in FIXTURES {
        let g = random(&mut r, 3 * f.ffn, 8.0);
        let u = random(&mut r, 3 * f.ffn, 2.0);
        let mut gt = tensor(b, f.ffn, &g);
        let ut = tensor(b, f.ffn, &u);
        b.swiglu(&mut gt, &ut, 3).expect("swiglu");
        let want: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| g as f64 / (1.0 + (-g as f64).exp()) * u as f64).collect();
        let tol = 1e-5 * max_abs(&want);
        assert_close(&format!("{} swiglu", f.name), &b.read(&gt, 3).unwrap(), &want, |_| tol);
    }
}

/// `x` in the host form of a `kv` cache: f16 bits, or f32 bits as two words (low half first).
fn kv_words(kv: KvType, x: &[f32]) -> Vec<u16> {
    match kv {
        KvType::F16 => x.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect(),
        KvType::F32 => x.iter().flat_map(|v| [v.to_bits() as u16, (v.to_bits() >> 16) as u16]).collect(),
    }
}

/// The values of host-form words of a `kv` cache.
fn kv_values(kv: KvType, words: &[u16]) -> Vec<f64> {
    match kv {
        KvType::F16 => words.iter().map(|&b| half::f16::from_bits(b).to_f64()).collect(),
        KvType::F32 => {
            words.chunks_exact(2).map(|w| f32::from_bits(w[0] as u32 | (w[1] as u32) << 16) as f64).collect()
        }
    }
}

/// Over an f16 cache (queries rounded to f16, 1e-2 of the largest value) and an f32 one (nothing rounded, 1e-5); a
/// backend without an f32 cache says so from `kv_pages`.
fn paged_attention<B: Backend>(b: &mut B) {
    let mut r = rng(7);
    for (f, kv_type) in FIXTURES.iter().flat_map(|f| [(f, KvType::F16), (f, KvType::F32)]) {
        let (qd, kvd) = (q_dim(f), kv_dim(f));
        let layout = KvLayout { num_layers: 2, kv_dim: kvd, block_tokens: 16, kv_type };
        let w = kv_type.words();
        let layer = 1;
        // Three sequences: a prefill of 37 rows from 0, a decode row at 70, a verification of 5 rows at 16.
        let runs = [(0usize, 37usize), (70, 1), (16, 5)];
        let num_blocks: Vec<usize> = runs.iter().map(|&(s, n)| (s + n).div_ceil(16)).collect();
        let total: usize = num_blocks.iter().sum();
        // Blocks handed out in a scrambled order, as a long-running cache does.
        let mut ids: Vec<u32> = (0..total as u32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, r.random_range(0..=i));
        }
        let mut tables = Vec::new();
        let mut next = 0;
        for &n in &num_blocks {
            tables.push(ids[next..next + n].to_vec());
            next += n;
        }
        let mut kv = match b.kv_pages(layout) {
            Err(backend::Error::Unsupported { reason, .. }) if kv_type == KvType::F32 => {
                eprintln!("{} paged_attention: no f32 KV cache on {}: {reason}", f.name, b.name());
                continue;
            }
            kv => kv.expect("kv_pages"),
        };
        b.kv_grow(&mut kv, total).expect("kv_grow");
        // Host mirror of every block; earlier positions get random keys and values (written through the host form).
        let mut host: Vec<Vec<u16>> = (0..total).map(|_| vec![0u16; layout.block_words()]).collect();
        let lk = layout.layer_offset(layer);
        let lv = lk + 16 * kvd * w;
        for (s, &(start, _)) in runs.iter().enumerate() {
            for pos in 0..start {
                let blk = &mut host[tables[s][pos / 16] as usize];
                for off in [lk, lv] {
                    let x: Vec<f32> = (0..kvd).map(|_| r.random_range(-2.0..2.0)).collect();
                    blk[off + (pos % 16) * kvd * w..][..kvd * w].copy_from_slice(&kv_words(kv_type, &x));
                }
            }
        }
        for (i, blk) in host.iter().enumerate() {
            b.kv_block_from_host(&mut kv, i as u32, blk).expect("kv_block_from_host");
        }
        let m: usize = runs.iter().map(|&(_, n)| n).sum();
        let q = random(&mut r, m * qd, 2.0);
        let k = random(&mut r, m * kvd, 2.0);
        let v = random(&mut r, m * kvd, 2.0);
        let mut positions = Vec::new();
        let mut slots = Vec::new();
        for (s, &(start, n)) in runs.iter().enumerate() {
            for pos in start..start + n {
                positions.push(pos);
                slots.push((tables[s][pos / 16], pos % 16));
            }
        }
        // The new rows' keys and values, as the cache will hold them.
        for (t, &(blk, row)) in slots.iter().enumerate() {
            for (off, src) in [(lk, &k), (lv, &v)] {
                let words = kv_words(kv_type, &src[t * kvd..][..kvd]);
                host[blk as usize][off + row * kvd * w..][..kvd * w].copy_from_slice(&words);
            }
        }
        let seqs: Vec<SeqRows> = runs
            .iter()
            .zip(&tables)
            .map(|(&(start_pos, num_rows), t)| SeqRows { blocks: t, start_pos, num_rows })
            .collect();
        let rows = AttnRows { positions: &positions, slots: &slots, seqs: &seqs };
        let shape = AttnShape {
            num_heads: f.num_heads,
            num_kv_heads: f.num_kv_heads,
            head_dim: f.head_dim,
            scale: 1.0 / (f.head_dim as f64).sqrt() as f32,
        };
        let (qt, kt, vt) = (tensor(b, qd, &q), tensor(b, kvd, &k), tensor(b, kvd, &v));
        let mut out = poisoned(b, m, qd);
        b.paged_attention(&mut kv, layer, shape, &qt, &kt, &vt, &rows, &mut out).expect("paged_attention");

        // Reference: causal softmax over each row's own sequence, in f64.
        let hd = f.head_dim;
        let group = f.num_heads / f.num_kv_heads;
        let mut want = vec![0f64; m * qd];
        let mut vmax = 0f64;
        let mut t = 0;
        for (s, &(start, n)) in runs.iter().enumerate() {
            for i in 0..n {
                let pos = start + i;
                for h in 0..f.num_heads {
                    let g = h / group;
                    let qv: Vec<f64> = q[t * qd + h * hd..][..hd]
                        .iter()
                        .map(|&x| if kv_type == KvType::F16 { half::f16::from_f32(x).to_f64() } else { x as f64 })
                        .collect();
                    let head = |p: usize, off: usize| {
                        let blk = &host[tables[s][p / 16] as usize];
                        kv_values(kv_type, &blk[off + ((p % 16) * kvd + g * hd) * w..][..hd * w])
                    };
                    let scores: Vec<f64> = (0..=pos)
                        .map(|p| head(p, lk).iter().zip(&qv).map(|(kx, qx)| kx * qx).sum::<f64>() * shape.scale as f64)
                        .collect();
                    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for (p, wt) in e.iter().enumerate() {
                        for (d, val) in head(p, lv).into_iter().enumerate() {
                            vmax = vmax.max(val.abs());
                            want[t * qd + h * hd + d] += wt / sum * val;
                        }
                    }
                }
                t += 1;
            }
        }
        let tol = if kv_type == KvType::F16 { 1e-2 } else { 1e-5 } * vmax;
        let what = format!("{} {kv_type:?} paged_attention", f.name);
        assert_close(&what, &b.read(&out, m).unwrap(), &want, |_| tol);
        // The new rows' keys and values are in their slots, in the host form.
        let mut blk = vec![0u16; layout.block_words()];
        for &(id, _) in &slots {
            b.kv_block_to_host(&kv, id, &mut blk).expect("kv_block_to_host");
            assert!(blk == host[id as usize], "{what}: block {id} as stored");
        }
    }
}

fn ffn_sublayer<B: Backend>(b: &mut B) {
    let mut r = rng(8);
    for f in FIXTURES.iter().filter(|f| f.name != "32b") {
        let ty = if f.hidden % 256 == 0 && f.ffn % 256 == 0 { GgmlType::Q4_K } else { GgmlType::Q8_0 };
        let (g, dg) = matrix(ty, f.ffn, f.hidden, &mut r);
        let (u, du) = matrix(ty, f.ffn, f.hidden, &mut r);
        let (d, dd) = matrix(GgmlType::Q8_0, f.hidden, f.ffn, &mut r);
        let nw = random(&mut r, f.hidden, 1.0);
        let w = FfnWeights::<B>::SwiGlu {
            norm: Norm { weight: b.load_vector(&nw).unwrap(), dim: f.hidden, eps: 1e-6, kind: NormKind::Plain },
            gate: b.load_matrix(&g, MatrixUse::Linear).unwrap(),
            up: b.load_matrix(&u, MatrixUse::Linear).unwrap(),
            down: b.load_matrix(&d, MatrixUse::Linear).unwrap(),
        };
        let rows = 3;
        let x = random(&mut r, rows * f.hidden, 1.0);
        let widths = Widths { hidden: f.hidden, q_dim: q_dim(f), kv_dim: kv_dim(f), ffn: f.ffn };
        let mut ws = Workspace::new(b, widths, rows).unwrap();
        let mut xt = tensor(b, f.hidden, &x);
        b.ffn_sublayer(&mut xt, rows, &w, &mut ws).expect("ffn_sublayer");
        let n = rms_ref(&x, &nw, 1e-6, NormKind::Plain);
        let mut want = Vec::new();
        let mut bound = Vec::new();
        for (t, nr) in n.chunks(f.hidden).enumerate() {
            let dot = |w: &[f32], j: usize, v: &[f64]| -> f64 {
                w[j * v.len()..][..v.len()].iter().zip(v).map(|(&a, &b)| a as f64 * b).sum()
            };
            let h: Vec<f64> = (0..f.ffn)
                .map(|j| {
                    let (gv, uv) = (dot(&dg, j, nr), dot(&du, j, nr));
                    gv / (1.0 + (-gv).exp()) * uv
                })
                .collect();
            for j in 0..f.hidden {
                let y = dot(&dd, j, &h);
                bound.push(dd[j * f.ffn..][..f.ffn].iter().zip(&h).map(|(&a, &b)| (a as f64 * b).abs()).sum::<f64>());
                want.push(x[t * f.hidden + j] as f64 + y);
            }
        }
        assert_close(&format!("{} ffn_sublayer", f.name), &b.read(&xt, rows).unwrap(), &want, |i| 2e-2 * bound[i]);
    }
}

/// Writes each test once for every backend: `mod cpu { fn op() }`, `mod cuda { fn op() }`.
macro_rules! backend_tests {
    ($($op:ident),* $(,)?) => {
        mod cpu {
            $(
                #[test]
                fn $op() {
                    super::$op(&mut super::CpuBackend::new(0));
                }
            )*
        }
        mod cuda {
            $(
                #[test]
                fn $op() {
                    if let Err(e) = backend::cuda::available() {
                        eprintln!("skipped: no GPU ({e})");
                        return;
                    }
                    let cache = std::env::var_os("SPLASH_CUDA_CACHE").map(std::path::PathBuf::from);
                    super::$op(&mut backend::cuda::CudaBackend::new(0, cache).expect("CUDA backend"));
                }
            )*
        }
    };
}

backend_tests!(embedding, gather_rows_and_add, rms_norm, linear, rope, swiglu, paged_attention, ffn_sublayer);
