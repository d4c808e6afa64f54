//! `Backend::experts` (the expert-routed FFN) on every backend against a plain f64 reference written here: routing
//! (softmax, top-k with ties to the lower index, renormalised or not), the picked experts' SwiGLU from the
//! dequantized weights, the shared expert and its sigmoid gate. Expert matrices are the expert-strided ones of a GGUF
//! file (`[num_experts * rows, cols]`), separate and fused gate/up, of every quant type a real MoE file uses. Outputs
//! are poisoned (NaN) before each call.
//!
//! Tolerance per output, with `B = Σ_slots w · Σ_i |down_oi h_i|` (+ the shared expert's):
//! - the CPU against the reference: `2e-2 · B`, the 8-bit input quantization of three products compounding, as for
//!   `ffn_sublayer` in ops.rs;
//! - CUDA (f32 activations on the dequantized weights) against the reference: `1e-4 · B`, f32 rounding only;
//! - CUDA against the CPU backend on the same weights and inputs: the CPU's `2e-2 · B`.
//!
//! And on both backends every row's result is bitwise the same whether it runs alone, in a decode-sized batch or in a
//! prefill-sized one (the rows of an expert share its weight reads, not their sums).
//!
//! `cargo test --release -p splash-backend --test experts` (the CUDA half skips without a GPU;
//! `SPLASH_CUDA_CACHE=DIR` keeps its compiled kernels).

use backend::cpu::QMatrix;
use backend::cpu::matmul::Bytes;
use backend::cpu::quant::Layout;
use backend::{Backend, ExpertGateUp, ExpertWeights, ExpertsSpec, MatrixUse, SharedExpert};
use gguf::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A `[rows, cols]` matrix of type `ty` from random values, and its dequantized rows.
fn matrix(ty: GgmlType, rows: usize, cols: usize, scale: f32, rng: &mut StdRng) -> (QMatrix, Vec<f32>) {
    let vals: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-scale..scale)).collect();
    let bytes: Vec<u8> = vals.chunks(cols).flat_map(|r| gguf::quant::quantize(ty, r).expect("quantize")).collect();
    let mut deq = vec![0f32; rows * cols];
    gguf::quant::dequantize(ty, &bytes, &mut deq).expect("dequantize");
    (QMatrix { ty, rows, cols, layout: Layout::Gguf, bytes: Bytes::from_vec(bytes) }, deq)
}

/// One FFN's weights on the backend and, dequantized, for the reference.
struct Case<B: Backend> {
    w: ExpertWeights<B>,
    router: Vec<f32>,
    /// Per expert: gate, up `[f, h]`, down `[h, f]`.
    experts: Vec<[Vec<f32>; 3]>,
    /// Gate, up, down and the sigmoid gate's row.
    shared: Option<([Vec<f32>; 3], Option<Vec<f32>>)>,
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    hidden: usize,
    spec: ExpertsSpec,
    fused: bool,
    /// Rows of the shared expert (0: none), and whether it has a gate.
    shared: usize,
    gated: bool,
}

/// The same weights on every backend for the same seed.
fn case<B: Backend>(b: &mut B, s: Shape, ty: GgmlType, seed: u64) -> Case<B> {
    let mut r = StdRng::seed_from_u64(seed);
    let (h, f, ne) = (s.hidden, s.spec.expert_ffn, s.spec.num_experts);
    let mut load = |m: &QMatrix, u| b.load_matrix(m, u).expect("load");
    // An f32 router, as llama.cpp's quantizer leaves it, with logits spread over a few units.
    let (router_q, router) = matrix(GgmlType::F32, ne, h, 2.0 / (h as f32).sqrt(), &mut r);
    let gu_rows = if s.fused { 2 * f } else { f };
    let (g_q, g) = matrix(ty, ne * gu_rows, h, 0.5, &mut r);
    let (u_q, u) = matrix(ty, ne * f, h, 0.5, &mut r);
    let (d_q, d) = matrix(ty, ne * h, f, 0.5, &mut r);
    let experts = (0..ne)
        .map(|e| {
            let rows = |v: &[f32], r0: usize, n: usize, cols: usize| v[r0 * cols..(r0 + n) * cols].to_vec();
            let (gate, up) = if s.fused {
                (rows(&g, 2 * e * f, f, h), rows(&g, (2 * e + 1) * f, f, h))
            } else {
                (rows(&g, e * f, f, h), rows(&u, e * f, f, h))
            };
            [gate, up, rows(&d, e * h, h, f)]
        })
        .collect();
    let gate_up = if s.fused {
        ExpertGateUp::Fused(load(&g_q, MatrixUse::Experts))
    } else {
        ExpertGateUp::Separate { gate: load(&g_q, MatrixUse::Experts), up: load(&u_q, MatrixUse::Experts) }
    };
    let (mut shared, mut shared_ref) = (None, None);
    if s.shared > 0 {
        let (sg_q, sg) = matrix(ty, s.shared, h, 0.5, &mut r);
        let (su_q, su) = matrix(ty, s.shared, h, 0.5, &mut r);
        let (sd_q, sd) = matrix(ty, h, s.shared, 0.5, &mut r);
        let (gi_q, gi) = matrix(GgmlType::F32, 1, h, 0.2, &mut r);
        shared = Some(SharedExpert {
            gate: load(&sg_q, MatrixUse::Linear),
            up: load(&su_q, MatrixUse::Linear),
            down: load(&sd_q, MatrixUse::Linear),
            gate_inp: s.gated.then(|| load(&gi_q, MatrixUse::Linear)),
        });
        shared_ref = Some(([sg, su, sd], s.gated.then_some(gi)));
    }
    let w = ExpertWeights {
        router: load(&router_q, MatrixUse::Linear),
        gate_up,
        down: load(&d_q, MatrixUse::Experts),
        shared,
        spec: s.spec,
    };
    Case { w, router, experts, shared: shared_ref }
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// `down · (silu(gate · x) * (up · x))` in f64, and per output the bound `Σ_i |down_oi h_i|`.
fn swiglu(x: &[f32], [g, u, d]: &[Vec<f32>; 3]) -> (Vec<f64>, Vec<f64>) {
    let (h, f) = (x.len(), g.len() / x.len());
    let hid: Vec<f64> = (0..f)
        .map(|i| {
            let a = dot(&g[i * h..(i + 1) * h], x);
            a / (1.0 + (-a).exp()) * dot(&u[i * h..(i + 1) * h], x)
        })
        .collect();
    let out = (0..h).map(|o| d[o * f..(o + 1) * f].iter().zip(&hid).map(|(&w, &v)| w as f64 * v).sum()).collect();
    let bound =
        (0..h).map(|o| d[o * f..(o + 1) * f].iter().zip(&hid).map(|(&w, &v)| (w as f64 * v).abs()).sum()).collect();
    (out, bound)
}

/// One row through the reference: the output and its bound `B` per element (module docs).
fn reference<B: Backend>(c: &Case<B>, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let s = &c.w.spec;
    let h = x.len();
    let logits: Vec<f64> = (0..s.num_experts).map(|e| dot(&c.router[e * h..(e + 1) * h], x)).collect();
    let max = logits.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
    let p: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let mut idx: Vec<usize> = (0..s.num_experts).collect();
    idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let picked = &idx[..s.num_used];
    let total: f64 = if s.normalise_weights { picked.iter().map(|&e| p[e]).sum() } else { p.iter().sum() };
    let (mut out, mut bound_all) = (vec![0f64; h], vec![0f64; h]);
    for &e in picked {
        let (y, bound) = swiglu(x, &c.experts[e]);
        let w = p[e] / total;
        for o in 0..h {
            out[o] += w * y[o];
            bound_all[o] += w * bound[o];
        }
    }
    if let Some((m, gate)) = &c.shared {
        let (y, bound) = swiglu(x, m);
        let sc = gate.as_ref().map_or(1.0, |g| 1.0 / (1.0 + (-dot(g, x)).exp()));
        for o in 0..h {
            out[o] += sc * y[o];
            bound_all[o] += sc * bound[o];
        }
    }
    (out, bound_all)
}

fn run<B: Backend>(b: &mut B, c: &Case<B>, x: &[f32], m: usize, h: usize) -> Vec<f32> {
    let mut xt = b.alloc(m, h).expect("alloc");
    b.write(&mut xt, &x[..m * h]).expect("write");
    let mut out = b.alloc(m, h).expect("alloc");
    b.write(&mut out, &vec![f32::NAN; m * h]).expect("poison");
    b.experts(&xt, m, &c.w, &mut out).expect("experts");
    b.read(&out, m).expect("read")
}

const fn spec(num_experts: usize, num_used: usize, expert_ffn: usize, normalise_weights: bool) -> ExpertsSpec {
    ExpertsSpec { num_experts, num_used, expert_ffn, normalise_weights }
}

/// K-quant shapes (rows of 256), Qwen3-30B-A3B's routing numbers over fewer experts; and a small odd one for Q8_0
/// and f32 with a shared expert (qwen2moe's form), fused gate/up, no renormalisation.
const SHAPES: [Shape; 4] = [
    Shape { hidden: 512, spec: spec(16, 8, 256, true), fused: false, shared: 0, gated: false },
    Shape { hidden: 256, spec: spec(6, 2, 256, false), fused: true, shared: 256, gated: true },
    Shape { hidden: 64, spec: spec(5, 3, 32, false), fused: true, shared: 64, gated: true },
    Shape { hidden: 96, spec: spec(4, 2, 64, true), fused: false, shared: 32, gated: false },
];

fn types_for(s: &Shape) -> Vec<GgmlType> {
    use GgmlType::*;
    let k_ok = s.hidden.is_multiple_of(256) && s.spec.expert_ffn.is_multiple_of(256) && s.shared % 256 == 0;
    if k_ok { vec![Q4_K, Q5_K, Q6_K, Q8_0] } else { vec![Q8_0, F32] }
}

/// Every row of an `m`-row call within `rel · B + 1e-5` of the reference (both backends: module docs).
fn matches_the_f64_reference<B: Backend>(b: &mut B, rel: f64) {
    for (i, s) in SHAPES.iter().enumerate() {
        for ty in types_for(s) {
            let c = case(b, *s, ty, 10 + i as u64);
            let mut r = StdRng::seed_from_u64(99);
            let m = 5;
            let x: Vec<f32> = (0..m * s.hidden).map(|_| r.random_range(-1.0..1.0)).collect();
            let got = run(b, &c, &x, m, s.hidden);
            for t in 0..m {
                let (want, bound) = reference(&c, &x[t * s.hidden..(t + 1) * s.hidden]);
                for (o, (&g, (&w, &e))) in got[t * s.hidden..].iter().zip(want.iter().zip(&bound)).enumerate() {
                    let tol = rel * e + 1e-5;
                    assert!(
                        g.is_finite() && (g as f64 - w).abs() <= tol,
                        "{} {s:?} {ty} row {t} [{o}]: {g} vs {w} (tolerance {tol:.2e})",
                        b.name()
                    );
                }
            }
        }
    }
}

/// A row's result is the same bits alone, among a decode batch's few rows and among a prefill's many, where its
/// experts' products run over other rows too.
fn batched_equals_unbatched<B: Backend>(b: &mut B) {
    for (i, s) in SHAPES.iter().enumerate() {
        let ty = types_for(s)[0];
        let c = case(b, *s, ty, 20 + i as u64);
        let mut r = StdRng::seed_from_u64(7);
        let m = 70;
        let h = s.hidden;
        let x: Vec<f32> = (0..m * h).map(|_| r.random_range(-1.0..1.0)).collect();
        let all = run(b, &c, &x, m, h);
        let few = run(b, &c, &x, 3, h);
        assert!(few == all[..3 * h], "{} {s:?} {ty}: 3 rows differ from the same rows among {m}", b.name());
        for t in [0, 1, 37, m - 1] {
            let alone = run(b, &c, &x[t * h..(t + 1) * h], 1, h);
            assert!(
                alone == all[t * h..(t + 1) * h],
                "{} {s:?} {ty}: row {t} alone differs from it among {m}",
                b.name()
            );
        }
    }
}

/// Weights that disagree with the numbers are a shape error, not a panic.
fn bad_shapes_are_errors<B: Backend>(b: &mut B) {
    let s = SHAPES[2];
    let mut c = case(b, s, GgmlType::Q8_0, 1);
    c.w.spec.num_used = c.w.spec.num_experts + 1;
    let x = b.alloc(1, s.hidden).expect("alloc");
    let mut out = b.alloc(1, s.hidden).expect("alloc");
    assert!(matches!(b.experts(&x, 1, &c.w, &mut out), Err(backend::Error::Shape { .. })));
    c.w.spec.num_used = 2;
    c.w.spec.expert_ffn += 32;
    assert!(matches!(b.experts(&x, 1, &c.w, &mut out), Err(backend::Error::Shape { .. })));
    c.w.spec.expert_ffn -= 32;
    let mut wide = b.alloc(1, s.hidden + 32).expect("alloc");
    assert!(matches!(b.experts(&x, 1, &c.w, &mut wide), Err(backend::Error::Shape { .. })));
}

mod cpu {
    use backend::cpu::CpuBackend;

    #[test]
    fn matches_the_f64_reference() {
        super::matches_the_f64_reference(&mut CpuBackend::new(0), 2e-2);
    }

    #[test]
    fn batched_equals_unbatched() {
        super::batched_equals_unbatched(&mut CpuBackend::new(0));
    }

    #[test]
    fn bad_shapes_are_errors() {
        super::bad_shapes_are_errors(&mut CpuBackend::new(1));
    }
}

mod cuda {
    use backend::Backend;
    use backend::cpu::CpuBackend;
    use backend::cuda::CudaBackend;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::{SHAPES, case, reference, run, types_for};

    fn gpu() -> Option<CudaBackend> {
        if let Err(e) = backend::cuda::available() {
            eprintln!("skipped: no GPU ({e})");
            return None;
        }
        let cache = std::env::var_os("SPLASH_CUDA_CACHE").map(std::path::PathBuf::from);
        Some(CudaBackend::new(0, cache).expect("CUDA backend"))
    }

    #[test]
    fn matches_the_f64_reference() {
        if let Some(mut g) = gpu() {
            super::matches_the_f64_reference(&mut g, 1e-4);
        }
    }

    /// The GPU against the CPU backend on the same weights and rows: a decode row, a verification's five, a prefill
    /// chunk's 70, within the CPU's tolerance (module docs).
    #[test]
    fn matches_the_cpu_backend() {
        let Some(mut g) = gpu() else { return };
        let mut cpu = CpuBackend::new(0);
        for (i, s) in SHAPES.iter().enumerate() {
            for ty in types_for(s) {
                let (on_gpu, on_cpu) = (case(&mut g, *s, ty, 30 + i as u64), case(&mut cpu, *s, ty, 30 + i as u64));
                let h = s.hidden;
                let mut r = StdRng::seed_from_u64(5);
                for m in [1, 5, 70] {
                    let x: Vec<f32> = (0..m * h).map(|_| r.random_range(-1.0..1.0)).collect();
                    let (got, want) = (run(&mut g, &on_gpu, &x, m, h), run(&mut cpu, &on_cpu, &x, m, h));
                    for t in 0..m {
                        let (_, bound) = reference(&on_cpu, &x[t * h..(t + 1) * h]);
                        for o in 0..h {
                            let (a, b) = (got[t * h + o], want[t * h + o]);
                            let tol = 2e-2 * bound[o] + 1e-5;
                            assert!(
                                a.is_finite() && ((a - b).abs() as f64) <= tol,
                                "{s:?} {ty} {m} rows, row {t} [{o}]: cuda {a} vs cpu {b} (tolerance {tol:.2e})"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(g.name(), "cuda");
    }

    #[test]
    fn batched_equals_unbatched() {
        if let Some(mut g) = gpu() {
            super::batched_equals_unbatched(&mut g);
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        if let Some(mut g) = gpu() {
            super::bad_shapes_are_errors(&mut g);
        }
    }
}
