//! The f32 reference forward pass: the oracle that every backend's correctness is measured against.
//!
//! A plain transformer over any GGUF file an `arch/` reader accepts (qwen2, llama, qwen3, qwen3moe, qwen35,
//! qwen35moe): weights are dequantized with `gguf::quant` (the scalar decoders that are bit-identical with ggml's),
//! activations stay f32 (the norms, RoPE angles and softmax sums in f64) and the KV cache is f32, one growing vector
//! per sequence and layer. It shares nothing with the backends' kernels (no quantized activations, no packed layouts,
//! no paged cache): written from the maths, llama2.c style, so that a backend's distance to it is the backend's own
//! error.
//!
//! Matrices stay quantized in the mapped file; each product dequantizes panels of rows into a small buffer per
//! thread (plain `std::thread::scope` threads) and multiplies them with every row of the batch, so a long prompt
//! reads each weight once and the memory held is a few panels, not an f32 copy of the model. The dot products keep
//! eight partial sums in a fixed order, so the result does not depend on the machine's vector width.
//!
//! It implements [`Runner`], so anything that drives a runner (teacher-forced logits, greedy decoding, the KL
//! divergence report of `splash bench --kld`) can run on it; it is slow (a full-precision product per weight per
//! batch) and meant for measuring, not serving.

use std::collections::HashMap;
use std::sync::Arc;

use backend::cpu::ops::RopeStyle;
use gguf::{GgmlType, GgufFile};

use backend::RecurrentSpec;

use crate::arch::FfnKind;
use crate::arch::qwen3moe::ExpertNames;
use crate::weights::{tensor, values, vector};
use crate::{Batch, Error, LogitsWanted, ModelConfig, Result, Runner, SeqId};

/// A `[rows, cols]` matrix left in the file in its stored type.
#[derive(Clone, Copy)]
struct Matrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Byte range of the data within the file.
    start: usize,
    row_bytes: usize,
}

impl Matrix {
    fn load(file: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Self> {
        Self::view(file, name, &[cols as u64, rows as u64], rows, cols)
    }

    /// The tensor of ggml dims `dims` seen as `[rows, cols]` (a 3-D expert tensor as its experts stacked).
    fn view(file: &GgufFile, name: &str, dims: &[u64], rows: usize, cols: usize) -> Result<Self> {
        let t = tensor(file, name, dims)?;
        let row_bytes = t.ty.row_bytes(cols).filter(|_| gguf::quant::is_supported(t.ty));
        let row_bytes = row_bytes.ok_or_else(|| Error::UnsupportedType { name: name.into(), ty: t.ty })?;
        if row_bytes * rows != t.size_bytes as usize {
            return Err(Error::BadShape { name: name.into(), found: t.dims.clone(), expected: vec![cols as u64] });
        }
        Ok(Matrix { ty: t.ty, rows, cols, start: (file.data_offset + t.offset) as usize, row_bytes })
    }

    /// Rows `r0..r0 + rows` as a matrix of their own (one expert of a stacked tensor).
    fn rows(&self, r0: usize, rows: usize) -> Matrix {
        Matrix { rows, start: self.start + r0 * self.row_bytes, ..*self }
    }

    /// Rows `r0..r0 + out.len() / cols` as f32.
    fn rows_f32(&self, file: &GgufFile, r0: usize, out: &mut [f32]) {
        let n = out.len() / self.cols;
        let bytes = &file.bytes()[self.start + r0 * self.row_bytes..][..n * self.row_bytes];
        gguf::quant::dequantize(self.ty, bytes, out).expect("INVARIANT: type and sizes were checked at load");
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    mixer: Mixer,
    ffn_norm: Vec<f32>,
    ffn: Ffn,
}

enum Ffn {
    SwiGlu { gate: Matrix, up: Matrix, down: Matrix },
    Experts(Experts),
}

/// An expert-routed FFN: every expert's gate, up (`[ffn, hidden]`) and down (`[hidden, ffn]`), and the shared
/// expert with its sigmoid gate (`[hidden]`), if any.
struct Experts {
    spec: backend::ExpertsSpec,
    router: Matrix,
    experts: Vec<[Matrix; 3]>,
    shared: Option<([Matrix; 3], Option<Vec<f32>>)>,
}

impl Experts {
    fn load(f: &GgufFile, cfg: &ModelConfig, names: &ExpertNames, i: usize) -> Result<Self> {
        let spec = crate::arch::qwen3moe::experts_spec(f, cfg.arch)?;
        let (h, ne, ff) = (cfg.hidden_size as u64, spec.num_experts, spec.expert_ffn);
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        let stack = |s: &str, rows: usize, cols: usize| {
            Matrix::view(f, &n(s), &[cols as u64, rows as u64, ne as u64], ne * rows, cols)
        };
        let down = stack(names.down, h as usize, ff)?;
        let gate_up = match f.tensor(&n(names.gate_up)) {
            Some(_) => (stack(names.gate_up, 2 * ff, h as usize)?, None),
            None => (stack(names.gate, ff, h as usize)?, Some(stack(names.up, ff, h as usize)?)),
        };
        let experts = (0..ne)
            .map(|e| {
                let [g, u] = match &gate_up {
                    (fused, None) => [fused.rows(2 * e * ff, ff), fused.rows((2 * e + 1) * ff, ff)],
                    (g, Some(u)) => [g.rows(e * ff, ff), u.rows(e * ff, ff)],
                };
                [g, u, down.rows(e * h as usize, h as usize)]
            })
            .collect();
        let shared = match f.tensor(&n(names.shared_gate)) {
            None => None,
            Some(t) => {
                let sf = t.dims.get(1).copied().unwrap_or(0) as usize;
                // `[hidden]` in qwen2moe files, `[hidden, 1]` in qwen35moe ones: either way one row of weights.
                let gate = match f.tensor(&n(names.shared_gate_inp)) {
                    Some(t) if t.dims.iter().product::<u64>() == h => {
                        Some(values(f, &n(names.shared_gate_inp), &t.dims)?)
                    }
                    Some(t) => {
                        return Err(Error::BadShape {
                            name: n(names.shared_gate_inp),
                            found: t.dims.clone(),
                            expected: vec![h, 1],
                        });
                    }
                    None => None,
                };
                let m = [
                    Matrix::load(f, &n(names.shared_gate), sf, h as usize)?,
                    Matrix::load(f, &n(names.shared_up), sf, h as usize)?,
                    Matrix::load(f, &n(names.shared_down), h as usize, sf)?,
                ];
                Some((m, gate))
            }
        };
        Ok(Experts { spec, router: Matrix::load(f, &n(names.router), ne, h as usize)?, experts, shared })
    }
}

enum Mixer {
    Attention(Attention),
    DeltaNet(DeltaNet),
}

struct Attention {
    /// `[q_dim, hidden]`, or `[2 * q_dim, hidden]` with each head's output gate after its query (`gated`).
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    bias: Option<[Vec<f32>; 3]>,
    qk_norm: Option<[Vec<f32>; 2]>,
    wo: Matrix,
    gated: bool,
}

/// A Gated DeltaNet layer (`backend::RecurrentWeights` says the maths).
struct DeltaNet {
    spec: RecurrentSpec,
    qkv: Matrix,
    z: Matrix,
    beta: Matrix,
    alpha: Matrix,
    /// `[conv_dim, conv_kernel]`
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    a: Vec<f32>,
    norm: Vec<f32>,
    norm_eps: f32,
    out: Matrix,
}

/// One sequence's keys and values (per layer, `[len, kv_dim]` each; empty for recurrent layers) and recurrent state
/// (per layer, `RecurrentSpec::state_len` f32; empty for attention layers).
struct SeqKv {
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    state: Vec<Vec<f32>>,
    /// Set when `truncate` cut a sequence with recurrent state back: its state is that of this length, not `len`.
    state_len: Option<usize>,
}

/// The f32 reference model (see the module documentation).
pub struct Reference {
    cfg: ModelConfig,
    file: Arc<GgufFile>,
    token_embd: Matrix,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    output: Matrix,
    /// Inverse frequency of each rotated pair.
    inv_freq: Vec<f64>,
    threads: usize,
    seqs: HashMap<SeqId, SeqKv>,
    logits: Vec<f32>,
}

impl Attention {
    fn load(f: &GgufFile, cfg: &ModelConfig, i: usize, gated: bool) -> Result<Self> {
        let (h, qd, kvd, hd) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let n = |s: &str| format!("blk.{i}.{s}");
        let bias = if cfg.qkv_bias {
            Some([
                vector(f, &n("attn_q.bias"), qd)?,
                vector(f, &n("attn_k.bias"), kvd)?,
                vector(f, &n("attn_v.bias"), kvd)?,
            ])
        } else {
            None
        };
        let qk_norm = if cfg.qk_norm {
            Some([vector(f, &n("attn_q_norm.weight"), hd)?, vector(f, &n("attn_k_norm.weight"), hd)?])
        } else {
            None
        };
        Ok(Attention {
            wq: Matrix::load(f, &n("attn_q.weight"), if gated { 2 * qd } else { qd }, h)?,
            wk: Matrix::load(f, &n("attn_k.weight"), kvd, h)?,
            wv: Matrix::load(f, &n("attn_v.weight"), kvd, h)?,
            bias,
            qk_norm,
            wo: Matrix::load(f, &n("attn_output.weight"), h, qd)?,
            gated,
        })
    }
}

impl DeltaNet {
    fn load(f: &GgufFile, i: usize, spec: RecurrentSpec, cfg: &ModelConfig) -> Result<Self> {
        let h = cfg.hidden_size;
        use crate::arch::qwen35::DeltaNetNames as N;
        let n = |s: &str| format!("blk.{i}.{s}");
        let (nv, vd, cd) = (spec.num_v_heads, spec.value_dim(), spec.conv_dim());
        Ok(DeltaNet {
            spec,
            qkv: Matrix::load(f, &n(N::QKV), cd, h)?,
            z: Matrix::load(f, &n(N::Z), vd, h)?,
            beta: Matrix::load(f, &n(N::BETA), nv, h)?,
            alpha: Matrix::load(f, &n(N::ALPHA), nv, h)?,
            conv: values(f, &n(N::CONV), &[spec.conv_kernel as u64, cd as u64])?,
            dt_bias: vector(f, &n(N::DT_BIAS), nv)?,
            a: vector(f, &n(N::A), nv)?,
            norm: vector(f, &n(N::NORM), spec.head_v_dim)?,
            norm_eps: cfg.rms_eps,
            out: Matrix::load(f, &n(N::OUT), h, vd)?,
        })
    }

    /// One token of one sequence: `qkv` (`[conv_dim]`, the projection before the conv), `z` (`[value_dim]`), `b`
    /// and `a` (`[num_v_heads]`) in, the gated output (`[value_dim]`) out; `state` advanced by the token. Sums and
    /// the state update in f64, the state stored as f32 (as the engine keeps it).
    fn step(&self, state: &mut [f32], qkv: &[f32], z: &[f32], b: &[f32], a: &[f32], out: &mut [f32]) {
        let s = &self.spec;
        let (kw, cd, dk, dv) = (s.conv_kernel, s.conv_dim(), s.head_k_dim, s.head_v_dim);
        let (conv_state, mats) = state.split_at_mut(s.conv_state_len());
        // Causal depthwise conv over the last `kw` inputs of each channel (the state holds the `kw - 1` before).
        let mut x = vec![0f64; cd];
        for (c, xc) in x.iter_mut().enumerate() {
            let w = &self.conv[c * kw..(c + 1) * kw];
            let mut acc = w[kw - 1] as f64 * qkv[c] as f64;
            for j in 0..kw - 1 {
                acc += w[j] as f64 * conv_state[j * cd + c] as f64;
            }
            *xc = acc / (1.0 + (-acc).exp());
        }
        conv_state.copy_within(cd.., 0);
        conv_state[(kw - 2) * cd..].copy_from_slice(qkv);

        let l2 = |v: &mut [f64]| {
            let inv = 1.0 / (v.iter().map(|x| x * x).sum::<f64>() + s.l2_eps as f64).sqrt();
            v.iter_mut().for_each(|x| *x *= inv);
        };
        let (q, rest) = x.split_at_mut(s.key_dim());
        let (k, v) = rest.split_at_mut(s.key_dim());
        for (qh, kh) in q.chunks_exact_mut(dk).zip(k.chunks_exact_mut(dk)) {
            l2(qh);
            l2(kh);
            qh.iter_mut().for_each(|x| *x /= (dk as f64).sqrt());
        }
        for h in 0..s.num_v_heads {
            let kh = h % s.num_k_heads;
            let (qh, kv) = (&q[kh * dk..][..dk], &k[kh * dk..][..dk]);
            let vh = &v[h * dv..][..dv];
            let beta = 1.0 / (1.0 + (-(b[h] as f64)).exp());
            let xa = a[h] as f64 + self.dt_bias[h] as f64;
            let softplus = if xa > 20.0 { xa } else { xa.exp().ln_1p() };
            let decay = (self.a[h] as f64 * softplus).exp();
            let m = &mut mats[h * dk * dv..][..dk * dv];
            let mut sm: Vec<f64> = m.iter().map(|&x| x as f64 * decay).collect();
            for j in 0..dv {
                let mem: f64 = (0..dk).map(|i| sm[i * dv + j] * kv[i]).sum();
                let delta = (vh[j] - mem) * beta;
                for i in 0..dk {
                    sm[i * dv + j] += kv[i] * delta;
                }
            }
            for (d, &x) in m.iter_mut().zip(&sm) {
                *d = x as f32;
            }
            // Read the output from the stored (f32) state, as a kernel that keeps it in f32 does.
            let o: Vec<f64> = (0..dv).map(|j| (0..dk).map(|i| m[i * dv + j] as f64 * qh[i]).sum()).collect();
            let ms = o.iter().map(|x| x * x).sum::<f64>() / dv as f64;
            let inv = 1.0 / (ms + self.norm_eps as f64).sqrt();
            for j in 0..dv {
                let zj = z[h * dv + j] as f64;
                out[h * dv + j] = (o[j] * inv * self.norm[j] as f64 * zj / (1.0 + (-zj).exp())) as f32;
            }
        }
    }
}

impl Reference {
    /// Reads the model from a parsed GGUF file; `threads == 0` uses every core.
    pub fn new(file: Arc<GgufFile>, threads: usize) -> Result<Self> {
        let cfg = crate::arch::config_from_gguf(&file)?;
        let (h, ffn) = (cfg.hidden_size, cfg.ffn_size);
        let f = &*file;
        let token_embd = Matrix::load(f, "token_embd.weight", cfg.vocab_size, h)?;
        let output = match f.tensor("output.weight") {
            Some(_) => Matrix::load(f, "output.weight", cfg.vocab_size, h)?,
            None => Matrix::load(f, "token_embd.weight", cfg.vocab_size, h)?,
        };
        let hybrid = crate::arch::qwen35::hybrid_from_gguf(f, &cfg)?;
        let ffn_norm_name = cfg.arch.recipe().names.ffn_norm;
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}");
                let mixer = match &hybrid {
                    Some(hy) if hy.recurrent[i] => Mixer::DeltaNet(DeltaNet::load(f, i, hy.spec, &cfg)?),
                    _ => Mixer::Attention(Attention::load(f, &cfg, i, hybrid.is_some())?),
                };
                Ok(Layer {
                    attn_norm: vector(f, &n("attn_norm.weight"), h)?,
                    mixer,
                    ffn_norm: vector(f, &n(&format!("{ffn_norm_name}.weight")), h)?,
                    ffn: match cfg.arch.recipe().ffn {
                        FfnKind::SwiGlu => Ffn::SwiGlu {
                            gate: Matrix::load(f, &n("ffn_gate.weight"), ffn, h)?,
                            up: Matrix::load(f, &n("ffn_up.weight"), ffn, h)?,
                            down: Matrix::load(f, &n("ffn_down.weight"), h, ffn)?,
                        },
                        FfnKind::Experts { names } => Ffn::Experts(Experts::load(f, &cfg, names, i)?),
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let output_norm = vector(f, "output_norm.weight", h)?;
        let inv_freq = (0..cfg.rope_dim / 2)
            .map(|i| (cfg.rope_theta as f64).powf(-2.0 * i as f64 / cfg.rope_dim as f64))
            .collect();
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads };
        Ok(Reference {
            cfg,
            file,
            token_embd,
            layers,
            output_norm,
            output,
            inv_freq,
            threads,
            seqs: HashMap::new(),
            logits: Vec::new(),
        })
    }

    /// `out[t, r] = Σ_c x[t, c] · w[r, c]` for the `m` rows of `x` (`[m, w.cols]`); `out` is `[m, w.rows]`.
    fn linear(&self, w: &Matrix, x: &[f32], m: usize, out: &mut [f32]) {
        let (rows, cols) = (w.rows, w.cols);
        // Rows of x padded to a multiple of the tile, so the kernel never has a ragged edge.
        let m4 = m.div_ceil(TILE) * TILE;
        let mut xp = vec![0f32; m4 * cols];
        xp[..m * cols].copy_from_slice(&x[..m * cols]);
        // Transposed result: each thread owns a contiguous range of weight rows.
        let mut out_t = vec![0f32; rows * m4];
        let per = rows.div_ceil(self.threads).div_ceil(PANEL) * PANEL;
        std::thread::scope(|s| {
            for (j, part) in out_t.chunks_mut(per * m4).enumerate() {
                let (xp, file) = (&xp, &*self.file);
                s.spawn(move || {
                    let mut panel = vec![0f32; PANEL * cols];
                    let r_begin = j * per;
                    for (p, dst) in part.chunks_mut(PANEL * m4).enumerate() {
                        let r0 = r_begin + p * PANEL;
                        let n = dst.len() / m4;
                        panel[n * cols..].fill(0.0);
                        w.rows_f32(file, r0, &mut panel[..n * cols]);
                        products(&panel, xp, cols, m4, n, dst);
                    }
                });
            }
        });
        for t in 0..m {
            for (r, o) in out[t * rows..(t + 1) * rows].iter_mut().enumerate() {
                *o = out_t[r * m4 + t];
            }
        }
    }

    fn rope(&self, v: &mut [f32], pos: usize) {
        let (hd, rd) = (self.cfg.head_dim, self.cfg.rope_dim);
        for head in v.chunks_exact_mut(hd) {
            for (i, &f) in self.inv_freq.iter().enumerate() {
                let (sin, cos) = (pos as f64 * f).sin_cos();
                let (a, b) = match self.cfg.rope_style {
                    RopeStyle::Neox => (i, i + rd / 2),
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                };
                let (x, y) = (head[a] as f64, head[b] as f64);
                head[a] = (x * cos - y * sin) as f32;
                head[b] = (x * sin + y * cos) as f32;
            }
        }
    }

    /// Causal attention of each row over its sequence's cached keys and values (which already hold the row itself).
    fn attention(&self, q: &[f32], rows: &[(SeqId, usize)], li: usize, out: &mut [f32]) {
        let cfg = &self.cfg;
        let (qd, kvd, hd) = (cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let group = cfg.num_heads / cfg.num_kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let per = rows.len().div_ceil(self.threads).max(1);
        std::thread::scope(|s| {
            for (j, part) in out[..rows.len() * qd].chunks_mut(per * qd).enumerate() {
                s.spawn(move || {
                    let mut scores = Vec::new();
                    for (i, o) in part.chunks_exact_mut(qd).enumerate() {
                        let t = j * per + i;
                        let (seq, pos) = rows[t];
                        let kv = &self.seqs[&seq];
                        let (k, v) = (&kv.k[li], &kv.v[li]);
                        for hh in 0..cfg.num_heads {
                            let qh = &q[t * qd + hh * hd..][..hd];
                            let off = (hh / group) * hd;
                            scores.clear();
                            scores.extend((0..=pos).map(|p| dot(qh, &k[p * kvd + off..][..hd]) * scale));
                            let max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                            let mut sum = 0f64;
                            for s in scores.iter_mut() {
                                let e = ((*s - max) as f64).exp();
                                sum += e;
                                *s = e as f32;
                            }
                            let oh = &mut o[hh * hd..][..hd];
                            let mut acc = vec![0f64; hd];
                            for (p, &w) in scores.iter().enumerate() {
                                for (a, &x) in acc.iter_mut().zip(&v[p * kvd + off..][..hd]) {
                                    *a += w as f64 * x as f64;
                                }
                            }
                            for (o, a) in oh.iter_mut().zip(acc) {
                                *o = (a / sum) as f32;
                            }
                        }
                    }
                });
            }
        });
    }

    /// `out = down · (silu(gate · x) * (up · x))` for the `m` rows of `x`.
    fn swiglu(&self, [gate, up, down]: [&Matrix; 3], x: &[f32], m: usize, out: &mut [f32]) {
        let (mut g, mut u) = (vec![0f32; m * gate.rows], vec![0f32; m * gate.rows]);
        self.linear(gate, x, m, &mut g);
        self.linear(up, x, m, &mut u);
        for (a, &b) in g.iter_mut().zip(&u) {
            *a = (*a as f64 / (1.0 + (-*a as f64).exp()) * b as f64) as f32;
        }
        self.linear(down, &g, m, &mut out[..m * down.rows]);
    }

    /// The expert-routed FFN of the `m` rows of `x`: softmax over the router's logits (f64), the top `num_used`
    /// (ties to the lower index), renormalised when the file says so; each expert over the rows that picked it.
    fn experts(&self, e: &Experts, x: &[f32], m: usize, out: &mut [f32]) {
        let (h, ne, k) = (self.cfg.hidden_size, e.spec.num_experts, e.spec.num_used);
        let mut logits = vec![0f32; m * ne];
        self.linear(&e.router, x, m, &mut logits);
        let mut acc = vec![0f64; m * h];
        // Per expert, the rows that picked it and their weights.
        let mut picked: Vec<Vec<(usize, f64)>> = vec![Vec::new(); ne];
        for (t, row) in logits.chunks_exact(ne).enumerate() {
            let max = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let p: Vec<f64> = row.iter().map(|&l| (l as f64 - max).exp()).collect();
            let sum: f64 = p.iter().sum();
            let mut idx: Vec<usize> = (0..ne).collect();
            idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let top = &idx[..k];
            let norm = if e.spec.normalise_weights { top.iter().map(|&i| p[i]).sum() } else { sum };
            for &i in top {
                picked[i].push((t, p[i] / norm));
            }
        }
        let mut y = Vec::new();
        for (ex, rows) in e.experts.iter().zip(&picked).filter(|(_, r)| !r.is_empty()) {
            let xs: Vec<f32> = rows.iter().flat_map(|&(t, _)| x[t * h..(t + 1) * h].iter().copied()).collect();
            y.resize(rows.len() * h, 0.0);
            self.swiglu([&ex[0], &ex[1], &ex[2]], &xs, rows.len(), &mut y);
            for (i, &(t, w)) in rows.iter().enumerate() {
                for (a, &v) in acc[t * h..(t + 1) * h].iter_mut().zip(&y[i * h..(i + 1) * h]) {
                    *a += w * v as f64;
                }
            }
        }
        if let Some(([g, u, d], gate)) = &e.shared {
            y.resize(m * h, 0.0);
            self.swiglu([g, u, d], x, m, &mut y);
            for t in 0..m {
                let xt = &x[t * h..(t + 1) * h];
                let s = gate.as_ref().map_or(1.0, |w| {
                    let z: f64 = w.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                    1.0 / (1.0 + (-z).exp())
                });
                for (a, &v) in acc[t * h..(t + 1) * h].iter_mut().zip(&y[t * h..(t + 1) * h]) {
                    *a += s * v as f64;
                }
            }
        }
        for (o, a) in out[..m * h].iter_mut().zip(acc) {
            *o = a as f32;
        }
    }

    /// One attention layer over the batch's rows (`xn` normalised), appending their keys and values to each
    /// sequence's cache: `out = Wo · attention` (`[m, hidden]`).
    fn attention_layer(&mut self, a: &Attention, li: usize, xn: &[f32], rows: &[(SeqId, usize)], out: &mut [f32]) {
        let cfg = &self.cfg;
        let (m, qd, kvd, hd) = (rows.len(), cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let (mut q, mut k, mut v) = (vec![0f32; m * qd], vec![0f32; m * kvd], vec![0f32; m * kvd]);
        let mut gate = Vec::new();
        if a.gated {
            // Each head's query, then its output gate.
            let mut qg = vec![0f32; m * 2 * qd];
            self.linear(&a.wq, xn, m, &mut qg);
            gate = vec![0f32; m * qd];
            for ((pair, qh), gh) in qg.chunks_exact(2 * hd).zip(q.chunks_exact_mut(hd)).zip(gate.chunks_exact_mut(hd)) {
                qh.copy_from_slice(&pair[..hd]);
                gh.copy_from_slice(&pair[hd..]);
            }
        } else {
            self.linear(&a.wq, xn, m, &mut q);
        }
        self.linear(&a.wk, xn, m, &mut k);
        self.linear(&a.wv, xn, m, &mut v);
        if let Some([bq, bk, bv]) = &a.bias {
            for (y, b) in [(&mut q, bq), (&mut k, bk), (&mut v, bv)] {
                for row in y.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                }
            }
        }
        if let Some([qn, kn]) = &a.qk_norm {
            for (y, w) in [(&mut q, qn), (&mut k, kn)] {
                let tmp = y.clone();
                rms_norm(&tmp, w, cfg.rms_eps, y);
            }
        }
        for (t, &(_, pos)) in rows.iter().enumerate() {
            self.rope(&mut q[t * qd..(t + 1) * qd], pos);
            self.rope(&mut k[t * kvd..(t + 1) * kvd], pos);
        }
        // Rows arrive in position order within each sequence, so appending keeps the cache in order.
        for (t, &(seq, _)) in rows.iter().enumerate() {
            let kv = self.seqs.get_mut(&seq).expect("INVARIANT: inserted by run");
            kv.k[li].extend_from_slice(&k[t * kvd..(t + 1) * kvd]);
            kv.v[li].extend_from_slice(&v[t * kvd..(t + 1) * kvd]);
        }
        let mut att = vec![0f32; m * qd];
        self.attention(&q, rows, li, &mut att);
        if a.gated {
            for (o, &g) in att.iter_mut().zip(&gate) {
                *o = (*o as f64 / (1.0 + (-(g as f64)).exp())) as f32;
            }
        }
        self.linear(&a.wo, &att, m, out);
    }

    /// One Gated DeltaNet layer over the batch's rows, token by token within each sequence (the recurrence as
    /// written: this is the oracle of the chunked forms): `out = W_out · gated output` (`[m, hidden]`).
    fn deltanet_layer(&mut self, d: &DeltaNet, li: usize, xn: &[f32], rows: &[(SeqId, usize)], out: &mut [f32]) {
        let s = d.spec;
        let (m, cd, vd, nv) = (rows.len(), s.conv_dim(), s.value_dim(), s.num_v_heads);
        let (mut qkv, mut z) = (vec![0f32; m * cd], vec![0f32; m * vd]);
        let (mut b, mut a) = (vec![0f32; m * nv], vec![0f32; m * nv]);
        self.linear(&d.qkv, xn, m, &mut qkv);
        self.linear(&d.z, xn, m, &mut z);
        self.linear(&d.beta, xn, m, &mut b);
        self.linear(&d.alpha, xn, m, &mut a);
        let mut o = vec![0f32; m * vd];
        for (t, &(seq, _)) in rows.iter().enumerate() {
            let state = &mut self.seqs.get_mut(&seq).expect("INVARIANT: inserted by run").state[li];
            d.step(
                state,
                &qkv[t * cd..][..cd],
                &z[t * vd..][..vd],
                &b[t * nv..][..nv],
                &a[t * nv..][..nv],
                &mut o[t * vd..][..vd],
            );
        }
        self.linear(&d.out, &o, m, out);
    }

    fn run(&mut self, batch: &Batch<'_>) -> Result<()> {
        batch.validate(&self.cfg, |s| self.seq_len(s))?;
        for c in &batch.chunks {
            if let Some(kv) = self.seqs.get(&c.seq)
                && let Some(len) = kv.state_len
            {
                return Err(Error::StateRollback { seq: c.seq.0, len, to: kv.len });
            }
        }
        let cfg = self.cfg.clone();
        let h = cfg.hidden_size;
        let m = batch.num_tokens();
        let rows: Vec<(SeqId, usize)> =
            batch.chunks.iter().flat_map(|c| (0..c.tokens.len()).map(move |i| (c.seq, c.start_pos + i))).collect();
        let mut x = vec![0f32; m * h];
        for (t, tok) in batch.chunks.iter().flat_map(|c| c.tokens.iter()).enumerate() {
            self.token_embd.rows_f32(&self.file, *tok as usize, &mut x[t * h..(t + 1) * h]);
        }
        for c in &batch.chunks {
            let layers = &self.layers;
            let kv = self.seqs.entry(c.seq).or_insert_with(|| SeqKv {
                len: 0,
                k: vec![Vec::new(); cfg.num_layers],
                v: vec![Vec::new(); cfg.num_layers],
                state: layers
                    .iter()
                    .map(|l| match &l.mixer {
                        Mixer::DeltaNet(d) => vec![0f32; d.spec.state_len()],
                        Mixer::Attention(_) => Vec::new(),
                    })
                    .collect(),
                state_len: None,
            });
            kv.len += c.tokens.len();
        }
        let (mut xn, mut proj) = (vec![0f32; m * h], vec![0f32; m * h]);
        // The layers are moved out while they run, so that a layer can update the sequences' caches.
        let layers = std::mem::take(&mut self.layers);
        for (li, l) in layers.iter().enumerate() {
            rms_norm(&x, &l.attn_norm, cfg.rms_eps, &mut xn);
            match &l.mixer {
                Mixer::Attention(a) => self.attention_layer(a, li, &xn, &rows, &mut proj),
                Mixer::DeltaNet(d) => self.deltanet_layer(d, li, &xn, &rows, &mut proj),
            }
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);

            rms_norm(&x, &l.ffn_norm, cfg.rms_eps, &mut xn);
            match &l.ffn {
                Ffn::SwiGlu { gate, up, down } => self.swiglu([gate, up, down], &xn, m, &mut proj),
                Ffn::Experts(e) => self.experts(e, &xn, m, &mut proj),
            }
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
        }
        self.layers = layers;

        let mut want = Vec::new();
        let mut t0 = 0;
        for c in &batch.chunks {
            let n = c.tokens.len();
            match c.logits {
                LogitsWanted::None => {}
                LogitsWanted::Last => want.extend((n > 0).then(|| t0 + n - 1)),
                LogitsWanted::All => want.extend(t0..t0 + n),
            }
            t0 += n;
        }
        let mut xr = vec![0f32; want.len() * h];
        for (i, &t) in want.iter().enumerate() {
            rms_norm(&x[t * h..(t + 1) * h], &self.output_norm, cfg.rms_eps, &mut xr[i * h..(i + 1) * h]);
        }
        let mut logits = std::mem::take(&mut self.logits);
        logits.clear();
        logits.resize(want.len() * cfg.vocab_size, 0.0);
        if !want.is_empty() {
            self.linear(&self.output, &xr, want.len(), &mut logits);
        }
        self.logits = logits;
        Ok(())
    }
}

/// Rows of weights dequantized at a time per thread.
const PANEL: usize = 16;
/// Rows of weights and of activations per register tile.
const TILE: usize = 4;
/// Partial sums per dot product.
const LANES: usize = 8;

/// `dst[r, t] = panel[r] · x[t]` for `n` panel rows (padded with zero rows to a multiple of [`TILE`] inside
/// `panel`) and `m4` activation rows (a multiple of [`TILE`]).
fn products(panel: &[f32], x: &[f32], cols: usize, m4: usize, n: usize, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { products_avx2(panel, x, cols, m4, n, dst) };
    }
    products_plain(panel, x, cols, m4, n, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn products_avx2(panel: &[f32], x: &[f32], cols: usize, m4: usize, n: usize, dst: &mut [f32]) {
    products_plain(panel, x, cols, m4, n, dst)
}

/// The same arithmetic, in the same order, whatever the instruction set it is compiled for.
#[inline(always)]
fn products_plain(panel: &[f32], x: &[f32], cols: usize, m4: usize, n: usize, dst: &mut [f32]) {
    let body = cols / LANES * LANES;
    for r0 in (0..n).step_by(TILE) {
        let w: [&[f32]; TILE] = std::array::from_fn(|i| &panel[(r0 + i) * cols..][..cols]);
        for t0 in (0..m4).step_by(TILE) {
            let xs: [&[f32]; TILE] = std::array::from_fn(|i| &x[(t0 + i) * cols..][..cols]);
            let mut acc = [[[0f32; LANES]; TILE]; TILE];
            for c in (0..body).step_by(LANES) {
                for (i, wi) in w.iter().enumerate() {
                    let wv = &wi[c..c + LANES];
                    for (j, xj) in xs.iter().enumerate() {
                        let xv = &xj[c..c + LANES];
                        for l in 0..LANES {
                            acc[i][j][l] += wv[l] * xv[l];
                        }
                    }
                }
            }
            for (i, wi) in w.iter().enumerate() {
                if r0 + i >= n {
                    break;
                }
                for (j, xj) in xs.iter().enumerate() {
                    let mut s = reduce(&acc[i][j]);
                    for c in body..cols {
                        s += wi[c] * xj[c];
                    }
                    dst[(r0 + i) * m4 + t0 + j] = s;
                }
            }
        }
    }
}

fn reduce(a: &[f32; LANES]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let body = a.len() / LANES * LANES;
    for c in (0..body).step_by(LANES) {
        for l in 0..LANES {
            acc[l] += a[c + l] * b[c + l];
        }
    }
    let mut s = reduce(&acc);
    for c in body..a.len() {
        s += a[c] * b[c];
    }
    s
}

/// RMSNorm of each `w.len()`-wide row of `x` into `out`, the mean of squares in f64.
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(w.len()).zip(out.chunks_exact_mut(w.len())) {
        let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / w.len() as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v as f64 * inv * g as f64) as f32;
        }
    }
}

impl Runner for Reference {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<&[f32]> {
        self.run(batch)?;
        Ok(&self.logits)
    }

    fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.len)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) {
        let kvd = self.cfg.kv_dim();
        if let Some(s) = self.seqs.get_mut(&seq) {
            // A recurrent state cannot be cut back; the next forward of the sequence says so.
            if len < s.len && s.state.iter().any(|st| !st.is_empty()) {
                s.state_len.get_or_insert(s.len);
            }
            s.len = s.len.min(len);
            for buf in s.k.iter_mut().chain(s.v.iter_mut()) {
                buf.truncate(s.len * kvd);
            }
        }
    }

    fn release(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiled products equal plain f64 dot products (to f32 rounding), for shapes with ragged rows and columns.
    #[test]
    fn products_are_dot_products() {
        let mut s = 7u64;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for (n, m, cols) in [(16, 4, 64), (13, 8, 37), (3, 4, 5), (1, 4, 8)] {
            let mut panel: Vec<f32> = (0..PANEL * cols).map(|_| next()).collect();
            panel[n * cols..].fill(0.0);
            let x: Vec<f32> = (0..m * cols).map(|_| next()).collect();
            let mut dst = vec![f32::NAN; n * m];
            products(&panel, &x, cols, m, n, &mut dst);
            for r in 0..n {
                for t in 0..m {
                    let want: f64 = (0..cols).map(|c| panel[r * cols + c] as f64 * x[t * cols + c] as f64).sum();
                    let got = dst[r * m + t] as f64;
                    assert!((got - want).abs() < 1e-5, "n {n} m {m} cols {cols}: [{r},{t}] {got} vs {want}");
                }
            }
        }
    }
}
