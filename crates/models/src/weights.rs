//! The weights of a llama-family transformer as the host reads them, by the names of the architecture's recipe
//! (`arch/`, `blk.N.attn_q.weight`, ...). Matrices stay in the memory-mapped file in their quantized form; the small
//! vectors (norms, biases) are copied out as f32. A backend then loads them in its own form (`transformer`).

use std::sync::Arc;

use backend::cpu::matmul::Bytes;
use backend::cpu::{CpuBackend, QMatrix};
use backend::{ExpertGateUp, ExpertWeights, Norm, RecurrentWeights, SharedExpert};
use gguf::GgufFile;

use crate::arch::qwen3moe::{ExpertNames, experts_spec};
use crate::arch::qwen35::{DeltaNetNames, Hybrid, hybrid_from_gguf};
use crate::arch::{FfnKind, MixerKind};
use crate::{Error, ModelConfig, Result};

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// [q_dim, hidden]
    pub wq: QMatrix,
    /// [kv_dim, hidden]
    pub wk: QMatrix,
    /// [kv_dim, hidden]
    pub wv: QMatrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// [head_dim] each (qwen3)
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// [hidden, q_dim]
    pub wo: QMatrix,
    /// [q_dim, hidden]: gated attention's output gate (qwen35), split from each head's rows of `attn_q`.
    pub wg: Option<QMatrix>,
    /// A Gated DeltaNet layer's mixer (hybrids, [`Weights::load_hybrid`]); its attention matrices above are then
    /// empty (0 rows).
    pub recurrent: Option<RecurrentWeights<CpuBackend>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
}

/// A layer's feed-forward weights, of the recipe's kind.
pub enum Ffn {
    /// [ffn, hidden], [ffn, hidden], [hidden, ffn]
    SwiGlu { gate: QMatrix, up: QMatrix, down: QMatrix },
    /// The host form of the backend's expert weights (the CPU backend's matrices are the file's).
    Experts(ExpertWeights<CpuBackend>),
}

impl LayerWeights {
    /// The dense FFN's gate, up and down; `None` for an expert-routed layer.
    pub fn dense_ffn(&self) -> Option<[&QMatrix; 3]> {
        match &self.ffn {
            Ffn::SwiGlu { gate, up, down } => Some([gate, up, down]),
            Ffn::Experts(_) => None,
        }
    }
}

pub struct Weights {
    /// [vocab, hidden]
    pub token_embd: QMatrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// [vocab, hidden]; the token embedding when tied.
    pub output: QMatrix,
    /// Which layers are Gated DeltaNet, and their numbers (hybrids only).
    pub hybrid: Option<Hybrid>,
}

impl Weights {
    /// Loads the weights the architecture's recipe names (`arch/`), checking every shape against `cfg`. Refuses
    /// the hybrids ([`Weights::load_hybrid`] loads them for runners whose backend runs Gated DeltaNet layers).
    pub fn load(file: &Arc<GgufFile>, cfg: &ModelConfig) -> Result<Self> {
        if cfg.arch.recipe().mixer == MixerKind::Hybrid {
            return Err(Error::UnsupportedArch(format!(
                "{} on this backend (its Gated DeltaNet layers run on the CPU runner and in models::reference only \
                 so far)",
                cfg.arch.name()
            )));
        }
        Self::load_hybrid(file, cfg)
    }

    /// [`Weights::load`] for every architecture, the hybrids' Gated DeltaNet and gated attention layers included.
    pub fn load_hybrid(file: &Arc<GgufFile>, cfg: &ModelConfig) -> Result<Self> {
        let recipe = cfg.arch.recipe();
        let n = recipe.names;
        let (qkv_bias, qk_norm) = match recipe.mixer {
            MixerKind::Attention { qkv_bias, qk_norm } => (qkv_bias, qk_norm),
            MixerKind::Hybrid => (false, true),
        };
        let hybrid = hybrid_from_gguf(file, cfg)?;
        let h = cfg.hidden_size;
        let token_embd = matrix(file, n.token_embd, cfg.vocab_size, h)?;
        let output = if cfg.tied_embeddings { token_embd.clone() } else { matrix(file, n.output, cfg.vocab_size, h)? };
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let weight = |s: &str| format!("blk.{i}.{s}.weight");
                let bias = |s: &str, len| {
                    if qkv_bias { vector(file, &format!("blk.{i}.{s}.bias"), len).map(Some) } else { Ok(None) }
                };
                let qk_norm =
                    |s: &str| if qk_norm { vector(file, &weight(s), cfg.head_dim).map(Some) } else { Ok(None) };
                let attn_norm = vector(file, &weight(n.attn_norm), h)?;
                let ffn_norm = vector(file, &weight(n.ffn_norm), h)?;
                let ffn = match recipe.ffn {
                    FfnKind::SwiGlu => Ffn::SwiGlu {
                        gate: matrix(file, &weight(n.ffn_gate), cfg.ffn_size, h)?,
                        up: matrix(file, &weight(n.ffn_up), cfg.ffn_size, h)?,
                        down: matrix(file, &weight(n.ffn_down), h, cfg.ffn_size)?,
                    },
                    FfnKind::Experts { names } => Ffn::Experts(experts(file, cfg, names, i)?),
                };
                if let Some(hy) = hybrid.as_ref().filter(|hy| hy.recurrent[i]) {
                    let recurrent = Some(deltanet(file, cfg, hy, i, &attn_norm)?);
                    let (wq, wk, wv, wo) =
                        (empty_matrix(h), empty_matrix(h), empty_matrix(h), empty_matrix(cfg.q_dim()));
                    let (bq, bk, bv, q_norm, k_norm, wg) = (None, None, None, None, None, None);
                    return Ok(LayerWeights {
                        attn_norm,
                        wq,
                        wk,
                        wv,
                        bq,
                        bk,
                        bv,
                        q_norm,
                        k_norm,
                        wo,
                        wg,
                        recurrent,
                        ffn_norm,
                        ffn,
                    });
                }
                // Gated attention: each head's query rows, then its gate's, in `attn_q`.
                let (wq, wg) = if hybrid.is_some() {
                    let both = matrix(file, &weight(n.attn_q), 2 * cfg.q_dim(), h)?;
                    let hd = cfg.head_dim as u32;
                    let rows = |gate: u32| -> Vec<u32> {
                        (0..cfg.num_heads as u32)
                            .flat_map(|hh| (0..hd).map(move |d| hh * 2 * hd + gate * hd + d))
                            .collect()
                    };
                    (gathered(&both, &rows(0)), Some(gathered(&both, &rows(1))))
                } else {
                    (matrix(file, &weight(n.attn_q), cfg.q_dim(), h)?, None)
                };
                Ok(LayerWeights {
                    attn_norm,
                    wq,
                    wk: matrix(file, &weight(n.attn_k), cfg.kv_dim(), h)?,
                    wv: matrix(file, &weight(n.attn_v), cfg.kv_dim(), h)?,
                    bq: bias(n.attn_q, cfg.q_dim())?,
                    bk: bias(n.attn_k, cfg.kv_dim())?,
                    bv: bias(n.attn_v, cfg.kv_dim())?,
                    q_norm: qk_norm(n.attn_q_norm)?,
                    k_norm: qk_norm(n.attn_k_norm)?,
                    wo: matrix(file, &weight(n.attn_output), h, cfg.q_dim())?,
                    wg,
                    recurrent: None,
                    ffn_norm,
                    ffn,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Weights { token_embd, layers, output_norm: vector(file, n.output_norm, h)?, output, hybrid })
    }

    /// Every matrix of the model, for size accounting.
    pub fn matrices(&self) -> impl Iterator<Item = &QMatrix> {
        let per_layer = self.layers.iter().flat_map(|l| {
            let ffn: Vec<&QMatrix> = match &l.ffn {
                Ffn::SwiGlu { gate, up, down } => vec![gate, up, down],
                Ffn::Experts(e) => {
                    let gate_up = match &e.gate_up {
                        ExpertGateUp::Separate { gate, up } => vec![gate, up],
                        ExpertGateUp::Fused(m) => vec![m],
                    };
                    let shared = e.shared.iter().flat_map(|s| [&s.gate, &s.up, &s.down].into_iter().chain(&s.gate_inp));
                    [&e.router, &e.down].into_iter().chain(gate_up).chain(shared).collect()
                }
            };
            let mixer = l.recurrent.iter().flat_map(|r| [&r.qkv, &r.z, &r.beta, &r.alpha, &r.out]);
            [&l.wq, &l.wk, &l.wv, &l.wo].into_iter().chain(&l.wg).chain(mixer).chain(ffn)
        });
        [&self.token_embd, &self.output].into_iter().chain(per_layer)
    }
}

pub(crate) fn tensor<'a>(file: &'a GgufFile, name: &str, dims: &[u64]) -> Result<&'a gguf::TensorInfo> {
    let t = file.tensor(name).ok_or_else(|| Error::MissingTensor(name.into()))?;
    if t.dims != dims {
        return Err(Error::BadShape { name: name.into(), found: t.dims.clone(), expected: dims.to_vec() });
    }
    Ok(t)
}

/// Layer `i`'s expert-routed FFN: the router, the experts' 3-D tensors as expert-strided matrices
/// (`[num_experts * rows, cols]`, ggml dims `[cols, rows, num_experts]`), and the shared expert when the file has one.
fn experts(file: &Arc<GgufFile>, cfg: &ModelConfig, n: &ExpertNames, i: usize) -> Result<ExpertWeights<CpuBackend>> {
    let spec = experts_spec(file, cfg.arch)?;
    let (h, ne, f) = (cfg.hidden_size, spec.num_experts, spec.expert_ffn);
    let name = |s: &str| format!("blk.{i}.{s}.weight");
    let stack = |s: &str, rows: usize, cols: usize| view(file, &name(s), &[cols, rows, ne], ne * rows, cols);
    let gate_up = if file.tensor(&name(n.gate_up)).is_some() {
        ExpertGateUp::Fused(stack(n.gate_up, 2 * f, h)?)
    } else {
        ExpertGateUp::Separate { gate: stack(n.gate, f, h)?, up: stack(n.up, f, h)? }
    };
    let shared = match file.tensor(&name(n.shared_gate)) {
        None => None,
        Some(t) => {
            let sf = t.dims.get(1).copied().unwrap_or(0) as usize;
            // The gate is a vector in the converter's files (`[hidden]`), a one-row matrix in others.
            let gate_inp = match file.tensor(&name(n.shared_gate_inp)).map(|t| t.dims.len()) {
                None => None,
                Some(1) => Some(view(file, &name(n.shared_gate_inp), &[h], 1, h)?),
                Some(_) => Some(matrix(file, &name(n.shared_gate_inp), 1, h)?),
            };
            Some(SharedExpert {
                gate: matrix(file, &name(n.shared_gate), sf, h)?,
                up: matrix(file, &name(n.shared_up), sf, h)?,
                down: matrix(file, &name(n.shared_down), h, sf)?,
                gate_inp,
            })
        }
    };
    Ok(ExpertWeights {
        router: matrix(file, &name(n.router), ne, h)?,
        gate_up,
        down: stack(n.down, h, f)?,
        shared,
        spec,
    })
}

/// Layer `i`'s Gated DeltaNet mixer, `attn_norm` its input norm.
fn deltanet(
    file: &Arc<GgufFile>,
    cfg: &ModelConfig,
    hy: &Hybrid,
    i: usize,
    attn_norm: &[f32],
) -> Result<RecurrentWeights<CpuBackend>> {
    type N = DeltaNetNames;
    let s = &hy.spec;
    let (h, cd, vd, nv) = (cfg.hidden_size, s.conv_dim(), s.value_dim(), s.num_v_heads);
    let name = |t: &str| format!("blk.{i}.{t}");
    let norm = |w: Vec<f32>| Norm { dim: w.len(), weight: w, eps: cfg.rms_eps, kind: cfg.arch.recipe().norm };
    Ok(RecurrentWeights {
        norm: norm(attn_norm.to_vec()),
        qkv: matrix(file, &name(N::QKV), cd, h)?,
        z: matrix(file, &name(N::Z), vd, h)?,
        beta: matrix(file, &name(N::BETA), nv, h)?,
        alpha: matrix(file, &name(N::ALPHA), nv, h)?,
        conv: values(file, &name(N::CONV), &[s.conv_kernel as u64, cd as u64])?,
        dt_bias: vector(file, &name(N::DT_BIAS), nv)?,
        a: vector(file, &name(N::A), nv)?,
        // The output norm is plain in the checkpoint too (qwen35.rs).
        out_norm: Norm { kind: backend::NormKind::Plain, ..norm(vector(file, &name(N::NORM), s.head_v_dim)?) },
        out: matrix(file, &name(N::OUT), h, vd)?,
    })
}

/// A matrix of no rows (the attention slots of a recurrent layer).
fn empty_matrix(cols: usize) -> QMatrix {
    QMatrix {
        ty: gguf::GgmlType::F32,
        rows: 0,
        cols,
        layout: backend::cpu::quant::Layout::Gguf,
        bytes: Bytes::from_vec(Vec::new()),
    }
}

/// The rows `rows` of a matrix in the file's layout, copied (no repacking: the backend lays it out when loading).
fn gathered(m: &QMatrix, rows: &[u32]) -> QMatrix {
    let rb = m.row_bytes();
    let mut bytes = vec![0u8; rows.len() * rb];
    for (out, &r) in bytes.chunks_exact_mut(rb).zip(rows) {
        m.copy_row_gguf(r as usize, out);
    }
    QMatrix { rows: rows.len(), bytes: Bytes::from_vec(bytes), ..m.clone() }
}

/// A `[rows, cols]` matrix (ggml dims `[cols, rows]`) left in the file.
fn matrix(file: &Arc<GgufFile>, name: &str, rows: usize, cols: usize) -> Result<QMatrix> {
    view(file, name, &[cols, rows], rows, cols)
}

/// The tensor of ggml dims `dims` seen as a `[rows, cols]` matrix, left in the file.
fn view(file: &Arc<GgufFile>, name: &str, dims: &[usize], rows: usize, cols: usize) -> Result<QMatrix> {
    let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    let t = tensor(file, name, &dims)?;
    if backend::cpu::quant::act_format(t.ty).is_none() {
        return Err(Error::UnsupportedType { name: name.into(), ty: t.ty });
    }
    let start = (file.data_offset + t.offset) as usize;
    let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = file.clone();
    let bytes =
        Bytes::new(owner, start..start + t.size_bytes as usize).expect("INVARIANT: the reader checked tensor bounds");
    Ok(QMatrix { ty: t.ty, rows, cols, layout: backend::cpu::quant::Layout::Gguf, bytes })
}

/// A vector of `n` values, converted to f32.
pub(crate) fn vector(file: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>> {
    values(file, name, &[n as u64])
}

/// A small tensor of ggml dims `dims` (a conv kernel), converted to f32 in its stored order.
pub(crate) fn values(file: &GgufFile, name: &str, dims: &[u64]) -> Result<Vec<f32>> {
    let t = tensor(file, name, dims)?;
    let mut out = vec![0f32; dims.iter().product::<u64>() as usize];
    gguf::quant::dequantize(t.ty, file.tensor_data(t), &mut out)
        .map_err(|_| Error::UnsupportedType { name: name.into(), ty: t.ty })?;
    Ok(out)
}
