//! Gated attention (the full-attention layers of the Qwen3.5/3.6 hybrids) on the CPU backend, against a plain f64
//! reference written here from the maths: `x += Wo · (attn(rope(norm_q(Wq·n)), rope(norm_k(Wk·n)), Wv·n) ·
//! sigmoid(Wg·n))` with `n = norm(x)`, zero-centred norms (`x̂ · (1 + w)`), per-head q/k norms, partial NeoX RoPE
//! over 64 of 256 dims (the multi-section layout with one position for every section, as text has), head_dim 256,
//! grouped queries. Also the `sigmoid_mul` primitive alone.
//!
//! f32 weights and an f32 KV cache, so every product is exact f32: `1e-4 · max|ref|` (RoPE's angle `pos · f` is
//! rounded to f32 as in ggml). Two sequences in one call, then one of them continued in a second call.
//!
//! `cargo test --release -p splash-backend --test gated_attention`

use backend::cpu::matmul::Bytes;
use backend::cpu::quant::Layout;
use backend::cpu::{CpuBackend, QMatrix};
use backend::{
    AttentionSpec, AttentionWeights, AttnRows, AttnShape, Backend, KvLayout, KvType, MatrixUse, Norm, NormKind,
    RopeSpec, RopeStyle, SeqRows, Widths, Workspace,
};
use gguf::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const HIDDEN: usize = 48;
/// 4 query heads over 2 KV heads of 256 (scale 1/16); RoPE over 64 of the 256 dims.
const SHAPE: AttnShape = AttnShape { num_heads: 4, num_kv_heads: 2, head_dim: 256, scale: 0.0625 };
const ROPE: RopeSpec = RopeSpec { style: RopeStyle::Neox, head_dim: 256, rope_dim: 64, theta: 10_000_000.0 };
const EPS: f32 = 1e-6;

fn random(r: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(lo..hi)).collect()
}

/// Host copies of the weights: `[rows, cols]` row-major matrices and the zero-centred norms' stored weights.
struct Host {
    norm: Vec<f32>,
    wq: Vec<f32>,
    wg: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    wo: Vec<f32>,
}

fn host() -> Host {
    let mut r = StdRng::seed_from_u64(35);
    let (qd, kvd) = (SHAPE.num_heads * SHAPE.head_dim, SHAPE.num_kv_heads * SHAPE.head_dim);
    Host {
        norm: random(&mut r, HIDDEN, -0.2, 0.2),
        wq: random(&mut r, qd * HIDDEN, -0.3, 0.3),
        wg: random(&mut r, qd * HIDDEN, -0.5, 0.5),
        wk: random(&mut r, kvd * HIDDEN, -0.3, 0.3),
        wv: random(&mut r, kvd * HIDDEN, -0.3, 0.3),
        q_norm: random(&mut r, SHAPE.head_dim, -0.2, 0.2),
        k_norm: random(&mut r, SHAPE.head_dim, -0.2, 0.2),
        wo: random(&mut r, HIDDEN * qd, -0.1, 0.1),
    }
}

fn matrix(b: &mut CpuBackend, v: &[f32], rows: usize) -> QMatrix {
    let cols = v.len() / rows;
    let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let m = QMatrix { ty: GgmlType::F32, rows, cols, layout: Layout::Gguf, bytes: Bytes::from_vec(bytes) };
    b.load_matrix(&m, MatrixUse::Linear).expect("f32 matrix")
}

fn weights(b: &mut CpuBackend, h: &Host) -> AttentionWeights<CpuBackend> {
    let (qd, kvd) = (SHAPE.num_heads * SHAPE.head_dim, SHAPE.num_kv_heads * SHAPE.head_dim);
    let norm = |w: &[f32]| Norm { weight: w.to_vec(), dim: w.len(), eps: EPS, kind: NormKind::OnePlus };
    AttentionWeights {
        norm: norm(&h.norm),
        wq: matrix(b, &h.wq, qd),
        wk: matrix(b, &h.wk, kvd),
        wv: matrix(b, &h.wv, kvd),
        bq: None,
        bk: None,
        bv: None,
        q_norm: Some(norm(&h.q_norm)),
        k_norm: Some(norm(&h.k_norm)),
        wg: Some(matrix(b, &h.wg, qd)),
        wo: matrix(b, &h.wo, HIDDEN),
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Zero-centred RMSNorm of each `w.len()`-wide run of `x`.
fn norm(x: &[f64], w: &[f32]) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|r| {
            let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / r.len() as f64 + EPS as f64).sqrt();
            r.iter().zip(w).map(move |(v, &g)| v * inv * (1.0 + g as f64))
        })
        .collect()
}

fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len()).map(|r| r.iter().zip(x).map(|(&a, b)| a as f64 * b).sum()).collect()
}

/// NeoX RoPE over the first `rope_dim` dims of each head, the pairs `(i, i + rope_dim / 2)`, frequencies in f64.
fn rope(x: &mut [f64], pos: usize) {
    let half = ROPE.rope_dim / 2;
    for head in x.chunks_mut(SHAPE.head_dim) {
        for i in 0..half {
            let f = (ROPE.theta as f64).powf(-2.0 * i as f64 / ROPE.rope_dim as f64);
            let (s, c) = (pos as f64 * f).sin_cos();
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * c - b * s;
            head[i + half] = a * s + b * c;
        }
    }
}

/// `x + sublayer(x)` for every row of one sequence (`[n, HIDDEN]`, positions from 0), causal.
fn reference(h: &Host, xs: &[f32]) -> Vec<f64> {
    let (mut ks, mut vs, mut out) = (Vec::new(), Vec::new(), Vec::new());
    let group = SHAPE.num_heads / SHAPE.num_kv_heads;
    for (pos, x) in xs.chunks(HIDDEN).enumerate() {
        let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let n = norm(&x, &h.norm);
        let mut q = norm(&matvec(&h.wq, &n), &h.q_norm);
        let mut k = norm(&matvec(&h.wk, &n), &h.k_norm);
        rope(&mut q, pos);
        rope(&mut k, pos);
        ks.push(k);
        vs.push(matvec(&h.wv, &n));
        let gate = matvec(&h.wg, &n);
        let mut att = vec![0f64; SHAPE.num_heads * SHAPE.head_dim];
        for hd in 0..SHAPE.num_heads {
            let kvh = hd / group;
            let qh = &q[hd * SHAPE.head_dim..][..SHAPE.head_dim];
            let scores: Vec<f64> = ks
                .iter()
                .map(|k| qh.iter().zip(&k[kvh * SHAPE.head_dim..][..SHAPE.head_dim]).map(|(a, b)| a * b).sum::<f64>())
                .map(|s| s / (SHAPE.head_dim as f64).sqrt())
                .collect();
            let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
            let p: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = p.iter().sum();
            for (pj, v) in p.iter().zip(&vs) {
                for d in 0..SHAPE.head_dim {
                    att[hd * SHAPE.head_dim + d] += pj / sum * v[kvh * SHAPE.head_dim + d];
                }
            }
        }
        for (a, g) in att.iter_mut().zip(&gate) {
            *a *= sigmoid(*g);
        }
        out.extend(x.iter().zip(matvec(&h.wo, &att)).map(|(a, b)| a + b));
    }
    out
}

#[test]
fn sigmoid_mul_is_the_gate() {
    let mut b = CpuBackend::new(1);
    let mut r = StdRng::seed_from_u64(1);
    let (x, g) = (random(&mut r, 3 * 40, -4.0, 4.0), random(&mut r, 3 * 40, -30.0, 30.0));
    let mut xt = b.alloc(4, 40).expect("x");
    let mut gt = b.alloc(4, 40).expect("gate");
    b.write(&mut xt, &[x.clone(), vec![f32::NAN; 40]].concat()).expect("write");
    b.write(&mut gt, &[g.clone(), vec![0.0; 40]].concat()).expect("write");
    b.sigmoid_mul(&mut xt, &gt, 3).expect("sigmoid_mul");
    let got = b.read(&xt, 4).expect("read");
    for (i, ((&y, &x), &g)) in got.iter().zip(&x).zip(&g).enumerate() {
        let want = x as f64 * sigmoid(g as f64);
        assert!((y as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()), "[{i}] {y} vs {want}");
    }
    assert!(got[120..].iter().all(|v| v.is_nan()), "rows past `rows` are left alone");
    let narrow = b.alloc(3, 39).expect("narrow");
    assert!(b.sigmoid_mul(&mut xt, &narrow, 3).is_err(), "widths differ");
}

#[test]
fn gated_attention_matches_the_reference() {
    let mut b = CpuBackend::new(0);
    let h = host();
    let w = weights(&mut b, &h);
    let shape = SHAPE;
    assert_eq!(shape.scale, 1.0 / (shape.head_dim as f32).sqrt());
    let spec = AttentionSpec { shape, rope: ROPE };
    let layout = KvLayout { num_layers: 1, kv_dim: shape.kv_dim(), block_tokens: 16, kv_type: KvType::F32 };
    let mut kv = b.kv_pages(layout).expect("kv");
    b.kv_grow(&mut kv, 3).expect("grow");
    let widths = Widths { hidden: HIDDEN, q_dim: shape.q_dim(), kv_dim: shape.kv_dim(), ffn: 8 };
    let mut ws = Workspace::new(&mut b, widths, 1).expect("workspace");
    let mut r = StdRng::seed_from_u64(2);
    // Sequence 0: 20 rows (two blocks), sequence 1: 5 rows; sequence 0 goes on in a second call.
    let inputs = [random(&mut r, 23 * HIDDEN, -1.0, 1.0), random(&mut r, 5 * HIDDEN, -1.0, 1.0)];
    let tables: [&[u32]; 2] = [&[2, 0], &[1]];
    let mut got = [Vec::new(), Vec::new()];
    for call in [vec![(0usize, 0usize, 20usize), (1, 0, 5)], vec![(0, 20, 3)]] {
        let mut x_data = Vec::new();
        let (mut positions, mut slots, mut seqs) = (Vec::new(), Vec::new(), Vec::new());
        for &(s, start, n) in &call {
            x_data.extend_from_slice(&inputs[s][start * HIDDEN..(start + n) * HIDDEN]);
            for pos in start..start + n {
                positions.push(pos);
                slots.push((tables[s][pos / 16], pos % 16));
            }
            seqs.push(SeqRows { blocks: tables[s], start_pos: start, num_rows: n });
        }
        let m = positions.len();
        ws.fit(&mut b, m).expect("fit");
        let mut x = b.alloc(m, HIDDEN).expect("x");
        b.write(&mut x, &x_data).expect("write");
        let rows = AttnRows { positions: &positions, slots: &slots, seqs: &seqs };
        b.attention_sublayer(&mut x, &w, &spec, &mut kv, 0, &rows, &mut ws).expect("attention_sublayer");
        let y = b.read(&x, m).expect("read");
        let mut at = 0;
        for &(s, _, n) in &call {
            got[s].extend_from_slice(&y[at * HIDDEN..(at + n) * HIDDEN]);
            at += n;
        }
    }
    for (s, (got, x)) in got.iter().zip(&inputs).enumerate() {
        let want = reference(&h, x);
        let tol = 1e-4 * want.iter().fold(0f64, |m, v| m.max(v.abs()));
        assert_eq!(got.len(), want.len());
        for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
            assert!((g as f64 - e).abs() <= tol, "sequence {s} value {i}: {g} vs {e}");
        }
    }
    // The gate matters: without it the same layer gives other outputs.
    let ungated = AttentionWeights { wg: None, ..weights(&mut b, &h) };
    let mut x = b.alloc(1, HIDDEN).expect("x");
    b.write(&mut x, &inputs[1][..HIDDEN]).expect("write");
    let before = b.read(&x, 1).expect("read");
    let rows =
        AttnRows { positions: &[0], slots: &[(1, 0)], seqs: &[SeqRows { blocks: &[1], start_pos: 0, num_rows: 1 }] };
    b.attention_sublayer(&mut x, &ungated, &spec, &mut kv, 0, &rows, &mut ws).expect("ungated");
    let ungated_out = b.read(&x, 1).expect("read");
    assert_ne!(ungated_out, got[1][..HIDDEN], "the gate changes the output");
    assert_ne!(ungated_out, before);
}
