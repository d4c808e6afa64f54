//! The CPU backend's Gated DeltaNet sub-layer (`Backend::recurrent_sublayer`) against a plain f64 recurrence
//! written here from the maths of `backend::RecurrentWeights`, with f32 weights (so `linear` is exact f32), key
//! heads < value heads, two sequences in one batch; and the state's exactness: a sequence's rows in one call, in
//! several calls and one at a time give bit-identical outputs.
//!
//! `cargo test --release -p splash-backend --test deltanet`

use backend::cpu::matmul::Bytes;
use backend::cpu::quant::Layout;
use backend::cpu::{CpuBackend, CpuTensor, QMatrix};
use backend::{Backend, Norm, NormKind, RecurrentSpec, RecurrentWeights, SeqRows, StateSnapshot, Widths, Workspace};
use gguf::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const HIDDEN: usize = 32;
const SPEC: RecurrentSpec =
    RecurrentSpec { num_k_heads: 2, num_v_heads: 6, head_k_dim: 8, head_v_dim: 4, conv_kernel: 4, l2_eps: 1e-6 };

/// Host copies of the weights: `[rows, cols]` row-major matrices and the vectors.
struct Host {
    norm: Vec<f32>,
    qkv: Vec<f32>,
    z: Vec<f32>,
    beta: Vec<f32>,
    alpha: Vec<f32>,
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    a: Vec<f32>,
    out_norm: Vec<f32>,
    out: Vec<f32>,
}

fn random(r: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(lo..hi)).collect()
}

fn host() -> Host {
    let mut r = StdRng::seed_from_u64(28);
    let (cd, vd, nv) = (SPEC.conv_dim(), SPEC.value_dim(), SPEC.num_v_heads);
    Host {
        norm: random(&mut r, HIDDEN, 0.8, 1.2),
        qkv: random(&mut r, cd * HIDDEN, -0.3, 0.3),
        z: random(&mut r, vd * HIDDEN, -0.3, 0.3),
        beta: random(&mut r, nv * HIDDEN, -0.3, 0.3),
        alpha: random(&mut r, nv * HIDDEN, -0.3, 0.3),
        conv: random(&mut r, cd * SPEC.conv_kernel, -0.5, 0.5),
        dt_bias: random(&mut r, nv, -2.0, 0.0),
        // −exp(A_log) with A in [0.02, 0.3]: decays near 1, the state remembers.
        a: random(&mut r, nv, -0.3, -0.02),
        out_norm: random(&mut r, SPEC.head_v_dim, 0.8, 1.2),
        out: random(&mut r, HIDDEN * vd, -0.3, 0.3),
    }
}

fn matrix(b: &mut CpuBackend, v: &[f32], rows: usize) -> QMatrix {
    let cols = v.len() / rows;
    let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let m = QMatrix { ty: GgmlType::F32, rows, cols, layout: Layout::Gguf, bytes: Bytes::from_vec(bytes) };
    b.load_matrix(&m, backend::MatrixUse::Linear).expect("f32 matrix")
}

fn weights(b: &mut CpuBackend, h: &Host) -> RecurrentWeights<CpuBackend> {
    let (cd, vd, nv) = (SPEC.conv_dim(), SPEC.value_dim(), SPEC.num_v_heads);
    let norm = |w: &[f32]| Norm { weight: w.to_vec(), dim: w.len(), eps: 1e-6, kind: NormKind::Plain };
    RecurrentWeights {
        norm: norm(&h.norm),
        qkv: matrix(b, &h.qkv, cd),
        z: matrix(b, &h.z, vd),
        beta: matrix(b, &h.beta, nv),
        alpha: matrix(b, &h.alpha, nv),
        conv: h.conv.clone(),
        dt_bias: h.dt_bias.clone(),
        a: h.a.clone(),
        out_norm: norm(&h.out_norm),
        out: matrix(b, &h.out, HIDDEN),
    }
}

fn dot(w: &[f32], x: &[f64]) -> f64 {
    w.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum()
}

fn rms(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(w).map(|(v, &g)| v * inv * g as f64).collect()
}

/// The f64 recurrence over one sequence's inputs (`[n, HIDDEN]`): `x + mixer(x)` per row.
fn reference(h: &Host, xs: &[f32]) -> Vec<f64> {
    let s = SPEC;
    let (cd, kd, dk, dv, kw) = (s.conv_dim(), s.key_dim(), s.head_k_dim, s.head_v_dim, s.conv_kernel);
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let mut hist: Vec<Vec<f64>> = vec![vec![0.0; cd]; kw - 1];
    let mut st = vec![vec![0f64; dk * dv]; s.num_v_heads];
    let mut out = Vec::new();
    for x in xs.chunks_exact(HIDDEN) {
        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let n = rms(&x64, &h.norm, 1e-6);
        let proj =
            |w: &[f32], rows: usize| -> Vec<f64> { (0..rows).map(|r| dot(&w[r * HIDDEN..][..HIDDEN], &n)).collect() };
        let (qkv, z, b, a) =
            (proj(&h.qkv, cd), proj(&h.z, s.value_dim()), proj(&h.beta, s.num_v_heads), proj(&h.alpha, s.num_v_heads));
        hist.push(qkv);
        let c: Vec<f64> = (0..cd)
            .map(|ch| {
                let v: f64 = (0..kw).map(|j| h.conv[ch * kw + j] as f64 * hist[hist.len() - kw + j][ch]).sum();
                v * sig(v)
            })
            .collect();
        hist.remove(0);
        let l2 = |v: &[f64]| -> Vec<f64> {
            let inv = 1.0 / (v.iter().map(|x| x * x).sum::<f64>() + 1e-6).sqrt();
            v.iter().map(|x| x * inv).collect()
        };
        let mut mixed = vec![0f64; s.value_dim()];
        for (hd, sm) in st.iter_mut().enumerate() {
            let kh = hd % s.num_k_heads;
            let q: Vec<f64> = l2(&c[kh * dk..][..dk]).iter().map(|v| v / (dk as f64).sqrt()).collect();
            let k = l2(&c[kd + kh * dk..][..dk]);
            let v = &c[2 * kd + hd * dv..][..dv];
            let xa = a[hd] + h.dt_bias[hd] as f64;
            let decay = (h.a[hd] as f64 * (xa.exp()).ln_1p()).exp();
            sm.iter_mut().for_each(|e| *e *= decay);
            for j in 0..dv {
                let mem: f64 = (0..dk).map(|i| sm[i * dv + j] * k[i]).sum();
                let delta = sig(b[hd]) * (v[j] - mem);
                (0..dk).for_each(|i| sm[i * dv + j] += k[i] * delta);
            }
            let o: Vec<f64> = (0..dv).map(|j| (0..dk).map(|i| sm[i * dv + j] * q[i]).sum()).collect();
            for (j, e) in rms(&o, &h.out_norm, 1e-6).into_iter().enumerate() {
                let g = z[hd * dv + j];
                mixed[hd * dv + j] = e * g * sig(g);
            }
        }
        out.extend((0..HIDDEN).map(|r| x64[r] + dot(&h.out[r * s.value_dim()..][..s.value_dim()], &mixed)));
    }
    out
}

/// Runs `calls` (per call, the rows of each sequence) and returns each sequence's outputs in row order.
fn run(
    b: &mut CpuBackend,
    w: &RecurrentWeights<CpuBackend>,
    inputs: &[Vec<f32>],
    calls: &[Vec<usize>],
) -> Vec<Vec<f32>> {
    run_with_states(b, w, inputs, calls, &[]).0
}

/// [`run`], taking in every call a snapshot of sequence `seq` after `rows_done` of that call's rows for each
/// `(seq, rows_done)` of `snaps`; also returns those snapshots (per call, in order) and each sequence's state after
/// every call.
#[allow(clippy::type_complexity)]
fn run_with_states(
    b: &mut CpuBackend,
    w: &RecurrentWeights<CpuBackend>,
    inputs: &[Vec<f32>],
    calls: &[Vec<usize>],
    snaps: &[(usize, usize)],
) -> (Vec<Vec<f32>>, Vec<Vec<Vec<f32>>>, Vec<Vec<Vec<f32>>>) {
    let (mut taken, mut after) = (Vec::new(), Vec::new());
    let mut states: Vec<CpuTensor> = inputs.iter().map(|_| b.alloc(1, SPEC.state_len()).expect("state")).collect();
    for st in &mut states {
        b.write(st, &vec![0.0; SPEC.state_len()]).expect("zero state");
    }
    let widths = Widths { hidden: HIDDEN, q_dim: 8, kv_dim: 8, ffn: 8 };
    let mut ws = Workspace::new(b, widths, 32).expect("workspace");
    let mut done = vec![0usize; inputs.len()];
    let mut outs = vec![Vec::new(); inputs.len()];
    for call in calls {
        let mut x_data = Vec::new();
        for (i, &n) in call.iter().enumerate() {
            x_data.extend_from_slice(&inputs[i][done[i] * HIDDEN..(done[i] + n) * HIDDEN]);
        }
        let m = x_data.len() / HIDDEN;
        let mut x = b.alloc(m.max(1), HIDDEN).expect("x");
        b.write(&mut x, &x_data).expect("write");
        let seqs: Vec<SeqRows<'_>> =
            call.iter().enumerate().map(|(i, &n)| SeqRows { blocks: &[], start_pos: done[i], num_rows: n }).collect();
        let mut refs: Vec<&mut CpuTensor> = states.iter_mut().collect();
        let mut dst: Vec<CpuTensor> = snaps.iter().map(|_| b.alloc(1, SPEC.state_len()).expect("snapshot")).collect();
        let mut snapshots: Vec<StateSnapshot<'_, CpuBackend>> = snaps
            .iter()
            .zip(dst.iter_mut())
            .map(|(&(seq, rows_done), state)| StateSnapshot { seq, rows_done, state })
            .collect();
        b.recurrent_sublayer(&mut x, w, &SPEC, &seqs, &mut refs, &mut snapshots, &mut ws).expect("recurrent_sublayer");
        drop(snapshots);
        taken.push(dst.iter().map(|t| b.read(t, 1).expect("read")).collect());
        after.push(states.iter().map(|t| b.read(t, 1).expect("read")).collect());
        let y = b.read(&x, m).expect("read");
        let mut at = 0;
        for (i, &n) in call.iter().enumerate() {
            outs[i].extend_from_slice(&y[at * HIDDEN..(at + n) * HIDDEN]);
            at += n;
            done[i] += n;
        }
    }
    (outs, taken, after)
}

#[test]
fn recurrent_sublayer_matches_the_recurrence_and_is_exact_across_calls() {
    let mut b = CpuBackend::new(0);
    let h = host();
    let w = weights(&mut b, &h);
    let mut r = StdRng::seed_from_u64(5);
    let inputs = vec![random(&mut r, 12 * HIDDEN, -1.0, 1.0), random(&mut r, 5 * HIDDEN, -1.0, 1.0)];
    // Both sequences in every call, with other row counts each time (a prefill chunk, a decode step, k+1 rows).
    let mixed = run(&mut b, &w, &inputs, &[vec![4, 2], vec![1, 1], vec![7, 2]]);
    for (i, (got, x)) in mixed.iter().zip(&inputs).enumerate() {
        let want = reference(&h, x);
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        for (j, (&g, &e)) in got.iter().zip(&want).enumerate() {
            assert!((g as f64 - e).abs() <= 1e-5 * scale, "seq {i} value {j}: {g} vs {e}");
        }
    }
    let whole = run(&mut b, &w, &inputs, &[vec![12, 5]]);
    let steps: Vec<Vec<usize>> = (0..12).map(|t| vec![1, usize::from(t < 5)]).collect();
    assert_eq!(whole, mixed, "one call vs three");
    assert_eq!(run(&mut b, &w, &inputs, &steps), whole, "token by token vs one call");
}

#[test]
fn recurrent_sublayer_refuses_a_missing_state() {
    let mut b = CpuBackend::new(1);
    let w = weights(&mut b, &host());
    let widths = Widths { hidden: HIDDEN, q_dim: 8, kv_dim: 8, ffn: 8 };
    let mut ws = Workspace::new(&mut b, widths, 1).expect("workspace");
    let mut x = b.alloc(1, HIDDEN).expect("x");
    let seqs = [SeqRows { blocks: &[], start_pos: 0, num_rows: 1 }];
    let e = b.recurrent_sublayer(&mut x, &w, &SPEC, &seqs, &mut [], &mut [], &mut ws).expect_err("no state");
    assert!(matches!(e, backend::Error::Shape { .. }), "{e}");
    // A snapshot past the sequence's rows, and two out of order.
    let mut st = b.alloc(1, SPEC.state_len()).expect("state");
    let (mut s1, mut s2) = (b.alloc(1, SPEC.state_len()).expect("s"), b.alloc(1, SPEC.state_len()).expect("s"));
    for bad in [vec![(0, 2)], vec![(0, 1), (0, 1)]] {
        let mut dst = [&mut s1, &mut s2].into_iter();
        let mut snaps: Vec<StateSnapshot<'_, CpuBackend>> = bad
            .iter()
            .map(|&(seq, rows_done)| StateSnapshot { seq, rows_done, state: dst.next().expect("two") })
            .collect();
        let e = b.recurrent_sublayer(&mut x, &w, &SPEC, &seqs, &mut [&mut st], &mut snaps, &mut ws);
        assert!(matches!(e, Err(backend::Error::Shape { .. })), "{bad:?}: {e:?}");
    }
}

/// A snapshot taken inside a call after some of a sequence's rows is bitwise the state a token-by-token run has
/// after that many rows (the state checkpoints and speculative rollback rely on this), and taking snapshots
/// changes neither the outputs nor the final states.
#[test]
fn snapshots_are_the_states_after_their_rows() {
    let mut b = CpuBackend::new(0);
    let w = weights(&mut b, &host());
    let mut r = StdRng::seed_from_u64(9);
    let inputs = vec![random(&mut r, 7 * HIDDEN, -1.0, 1.0), random(&mut r, 3 * HIDDEN, -1.0, 1.0)];
    let snaps = [(0, 2), (0, 7), (1, 1), (1, 3)];
    let (outs, taken, after) = run_with_states(&mut b, &w, &inputs, &[vec![7, 3]], &snaps);
    let steps: Vec<Vec<usize>> = (0..7).map(|t| vec![1, usize::from(t < 3)]).collect();
    let (step_outs, _, step_states) = run_with_states(&mut b, &w, &inputs, &steps, &[]);
    assert_eq!(outs, step_outs, "outputs with snapshots vs token by token");
    for (k, &(seq, rows)) in snaps.iter().enumerate() {
        assert!(taken[0][k] == step_states[rows - 1][seq], "snapshot of sequence {seq} after {rows} rows");
    }
    assert!(after[0] == step_states[6], "the final states");
}
