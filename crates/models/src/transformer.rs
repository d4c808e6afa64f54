//! The forward pass, written once over [`backend::Backend`]: token embedding, then for every layer its token mixer
//! and its FFN (each `x += f(norm(x))`, the kinds named by the architecture's recipe in `arch/`), then the final
//! norm and the output head on the rows that want logits.
//!
//! In: a batch's tokens, where each row sits ([`AttnRows`]: positions, KV slots, each sequence's blocks) and which
//! rows want logits. Out: those rows' logits, `[num_logit_rows, head rows]`, in a tensor of the backend. Which KV
//! blocks a sequence owns is the runner's (`kv_cache`); this module only passes them to the backend.

use backend::{
    AttentionSpec, AttentionWeights, AttnRows, AttnShape, Backend, ExpertGateUp, ExpertWeights, FfnWeights,
    LayerWeights, MatrixUse, MixerWeights, Norm, RecurrentSpec, RecurrentWeights, RopeSpec, SharedExpert,
    StateSnapshot, Widths, Workspace,
};

use crate::state::{StateRefs, StateShape};
use crate::weights::Ffn;
use crate::{ModelConfig, Result, Weights};

/// A model's weights on a backend, and the activation buffers of its forward pass.
pub struct Transformer<B: Backend> {
    attention: AttentionSpec,
    /// Per layer, its slot: the KV cache's layer for an attention layer, the index of its state among the
    /// sequence's recurrent states for a Gated DeltaNet layer.
    slots: Vec<usize>,
    /// The Gated DeltaNet layers' numbers (hybrids).
    recurrent: Option<RecurrentSpec>,
    num_kv_layers: usize,
    /// `[vocab, hidden]`, read a row per token.
    token_embd: B::Matrix,
    layers: Vec<LayerWeights<B>>,
    output_norm: Norm<B::Vector>,
    /// `[vocab, hidden]`; the token embedding when tied.
    output: B::Matrix,
    hidden: usize,
    /// `[rows, hidden]` the residual stream, with its capacity in rows.
    x: B::Tensor,
    x_rows: usize,
    ws: Workspace<B>,
    /// `[rows, head rows]` the logits of the last forward, with its capacity `(rows, head rows)`.
    logits: B::Tensor,
    logits_shape: (usize, usize),
    /// Layers whose output rows each forward keeps on the host ([`Transformer::keep_hidden`]), and those rows.
    keep_layers: Vec<usize>,
    hidden_rows: Vec<f32>,
}

fn norm<B: Backend>(b: &mut B, cfg: &ModelConfig, w: &[f32]) -> Result<Norm<B::Vector>> {
    Ok(Norm { weight: b.load_vector(w)?, dim: w.len(), eps: cfg.rms_eps, kind: cfg.arch.recipe().norm })
}

fn vector<B: Backend>(b: &mut B, v: &Option<Vec<f32>>) -> Result<Option<B::Vector>> {
    Ok(match v {
        Some(v) => Some(b.load_vector(v)?),
        None => None,
    })
}

/// The host's expert weights ([`Ffn::Experts`]) on the backend: the experts' matrices as [`MatrixUse::Experts`].
fn experts<B: Backend>(b: &mut B, e: &ExpertWeights<backend::cpu::CpuBackend>) -> Result<ExpertWeights<B>> {
    let mut ex = |m| b.load_matrix(m, MatrixUse::Experts);
    let gate_up = match &e.gate_up {
        ExpertGateUp::Separate { gate, up } => ExpertGateUp::Separate { gate: ex(gate)?, up: ex(up)? },
        ExpertGateUp::Fused(m) => ExpertGateUp::Fused(ex(m)?),
    };
    let down = ex(&e.down)?;
    let shared = match &e.shared {
        None => None,
        Some(s) => Some(SharedExpert {
            gate: b.load_matrix(&s.gate, MatrixUse::Linear)?,
            up: b.load_matrix(&s.up, MatrixUse::Linear)?,
            down: b.load_matrix(&s.down, MatrixUse::Linear)?,
            gate_inp: s.gate_inp.as_ref().map(|g| b.load_matrix(g, MatrixUse::Linear)).transpose()?,
        }),
    };
    Ok(ExpertWeights { router: b.load_matrix(&e.router, MatrixUse::Linear)?, gate_up, down, shared, spec: e.spec })
}

/// A layer's FFN (and its norm) on the backend.
fn ffn<B: Backend>(b: &mut B, cfg: &ModelConfig, l: &crate::LayerWeights) -> Result<FfnWeights<B>> {
    let ffn_norm = norm(b, cfg, &l.ffn_norm)?;
    Ok(match &l.ffn {
        Ffn::SwiGlu { gate, up, down } => FfnWeights::SwiGlu {
            norm: ffn_norm,
            gate: b.load_matrix(gate, MatrixUse::Linear)?,
            up: b.load_matrix(up, MatrixUse::Linear)?,
            down: b.load_matrix(down, MatrixUse::Linear)?,
        },
        Ffn::Experts(e) => FfnWeights::Experts { norm: ffn_norm, experts: experts(b, e)? },
    })
}

/// The host's Gated DeltaNet weights on the backend.
fn recurrent<B: Backend>(b: &mut B, r: &RecurrentWeights<backend::cpu::CpuBackend>) -> Result<RecurrentWeights<B>> {
    let mut lin = |m| b.load_matrix(m, MatrixUse::Linear);
    let (qkv, z, beta, alpha, out) = (lin(&r.qkv)?, lin(&r.z)?, lin(&r.beta)?, lin(&r.alpha)?, lin(&r.out)?);
    let mut norm = |n: &Norm<Vec<f32>>| -> Result<Norm<B::Vector>> {
        Ok(Norm { weight: b.load_vector(&n.weight)?, dim: n.dim, eps: n.eps, kind: n.kind })
    };
    let (norm_in, out_norm) = (norm(&r.norm)?, norm(&r.out_norm)?);
    Ok(RecurrentWeights {
        norm: norm_in,
        qkv,
        z,
        beta,
        alpha,
        conv: b.load_vector(&r.conv)?,
        dt_bias: b.load_vector(&r.dt_bias)?,
        a: b.load_vector(&r.a)?,
        out_norm,
        out,
    })
}

impl<B: Backend> Transformer<B> {
    /// Loads the host weights (`Weights::load`) onto the backend as the architecture's recipe lays them out.
    pub fn new(b: &mut B, cfg: &ModelConfig, w: &Weights) -> Result<Self> {
        let mut layers = Vec::with_capacity(w.layers.len());
        let (mut slots, mut num_kv_layers, mut num_states) = (Vec::new(), 0, 0);
        for l in &w.layers {
            let qk = |b: &mut B, v: &Option<Vec<f32>>| -> Result<Option<Norm<B::Vector>>> {
                v.as_deref().map(|v| norm(b, cfg, v)).transpose()
            };
            if let Some(r) = &l.recurrent {
                slots.push(num_states);
                num_states += 1;
                let ffn = ffn(b, cfg, l)?;
                layers.push(LayerWeights { mixer: MixerWeights::Recurrent(recurrent(b, r)?), ffn });
                continue;
            }
            slots.push(num_kv_layers);
            num_kv_layers += 1;
            let mixer = MixerWeights::Attention(AttentionWeights {
                norm: norm(b, cfg, &l.attn_norm)?,
                wq: b.load_matrix(&l.wq, MatrixUse::Linear)?,
                wk: b.load_matrix(&l.wk, MatrixUse::Linear)?,
                wv: b.load_matrix(&l.wv, MatrixUse::Linear)?,
                bq: vector(b, &l.bq)?,
                bk: vector(b, &l.bk)?,
                bv: vector(b, &l.bv)?,
                q_norm: qk(b, &l.q_norm)?,
                k_norm: qk(b, &l.k_norm)?,
                wg: l.wg.as_ref().map(|g| b.load_matrix(g, MatrixUse::Linear)).transpose()?,
                wo: b.load_matrix(&l.wo, MatrixUse::Linear)?,
            });
            layers.push(LayerWeights { mixer, ffn: ffn(b, cfg, l)? });
        }
        let (embd_use, out_use) = if cfg.tied_embeddings {
            (MatrixUse::Both, MatrixUse::Both)
        } else {
            (MatrixUse::Embedding, MatrixUse::Linear)
        };
        let attention = AttentionSpec {
            shape: AttnShape {
                num_heads: cfg.num_heads,
                num_kv_heads: cfg.num_kv_heads,
                head_dim: cfg.head_dim,
                scale: 1.0 / (cfg.head_dim as f32).sqrt(),
            },
            rope: RopeSpec {
                style: cfg.rope_style,
                head_dim: cfg.head_dim,
                rope_dim: cfg.rope_dim,
                theta: cfg.rope_theta,
            },
        };
        let widths = Widths { hidden: cfg.hidden_size, q_dim: cfg.q_dim(), kv_dim: cfg.kv_dim(), ffn: cfg.ffn_size };
        Ok(Transformer {
            attention,
            slots,
            recurrent: w.hybrid.as_ref().map(|h| h.spec),
            num_kv_layers,
            token_embd: b.load_matrix(&w.token_embd, embd_use)?,
            layers,
            output_norm: norm(b, cfg, &w.output_norm)?,
            output: b.load_matrix(&w.output, out_use)?,
            hidden: cfg.hidden_size,
            x: b.alloc(1, cfg.hidden_size)?,
            x_rows: 1,
            ws: Workspace::new(b, widths, 1)?,
            logits: b.alloc(0, 0)?,
            logits_shape: (0, 0),
            keep_layers: Vec::new(),
            hidden_rows: Vec::new(),
        })
    }

    /// Layers the KV cache holds keys and values of (the attention layers).
    pub fn num_kv_layers(&self) -> usize {
        self.num_kv_layers
    }

    /// The recurrent state of one sequence (`None` for a model without Gated DeltaNet layers).
    pub fn state_shape(&self) -> Option<StateShape> {
        let spec = self.recurrent?;
        let n = self.layers.iter().filter(|l| matches!(l.mixer, MixerWeights::Recurrent(_))).count();
        Some(StateShape { layers: vec![spec; n] })
    }

    /// Each later forward keeps the residual stream after each of `layers` (checked against the layer count by
    /// the runner) on the host: `[layers][tokens][hidden]`, for proposers that draft from the target's states.
    pub fn keep_hidden(&mut self, layers: &[usize]) {
        self.keep_layers = layers.to_vec();
        self.hidden_rows.clear();
    }

    /// The rows [`Transformer::keep_hidden`] asked for, from the last forward.
    pub fn hidden_rows(&self) -> &[f32] {
        &self.hidden_rows
    }

    /// The full output head, `[vocab, hidden]`.
    pub fn output(&self) -> &B::Matrix {
        &self.output
    }

    /// The logits of the last [`Transformer::forward`].
    pub fn logits(&self) -> &B::Tensor {
        &self.logits
    }

    /// Runs `tokens` (row `t` placed by `rows`) through every layer, storing their keys and values in `kv`, and
    /// the output head over the rows `logit_rows` (indices into the batch, in the order wanted). `head` replaces
    /// the full output head (a narrowed one: its matrix and its number of rows). Returns the logits,
    /// `[logit_rows.len(), head rows]`. A model with recurrent layers needs [`Transformer::forward_states`].
    pub fn forward(
        &mut self,
        b: &mut B,
        kv: &mut B::KvPages,
        tokens: &[u32],
        rows: &AttnRows<'_>,
        logit_rows: &[usize],
        head: (Option<&B::Matrix>, usize),
    ) -> Result<&B::Tensor> {
        self.forward_states(b, kv, StateRefs::none(), tokens, rows, logit_rows, head)
    }

    /// [`Transformer::forward`] with each sequence's recurrent state (`state.states[i]` for `rows.seqs[i]`), read
    /// and advanced by the Gated DeltaNet layers, which also take the snapshots `state` asks for.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_states(
        &mut self,
        b: &mut B,
        kv: &mut B::KvPages,
        mut state: StateRefs<'_, B>,
        tokens: &[u32],
        rows: &AttnRows<'_>,
        logit_rows: &[usize],
        head: (Option<&B::Matrix>, usize),
    ) -> Result<&B::Tensor> {
        if self.recurrent.is_some() && state.states.len() != rows.seqs.len() {
            return Err(backend::Error::Unsupported {
                backend: b.name(),
                op: "forward",
                reason: format!(
                    "recurrent layers need the state of each of the {} sequences from the runner ({} given)",
                    rows.seqs.len(),
                    state.states.len()
                ),
            }
            .into());
        }
        let m = tokens.len();
        let r = logit_rows.len();
        // Every buffer first: a backend that records the pass (CUDA graphs) sees no allocation inside it.
        if m > self.x_rows {
            self.x = b.alloc(m, self.hidden)?;
            self.x_rows = m;
        }
        self.ws.fit(b, m)?;
        let (head, head_rows) = match head {
            (Some(h), n) => (h, n),
            (None, n) => (&self.output, n),
        };
        if r > self.logits_shape.0 || head_rows != self.logits_shape.1 {
            let cap = r.max(self.logits_shape.0 * usize::from(head_rows == self.logits_shape.1));
            self.logits = b.alloc(cap, head_rows)?;
            self.logits_shape = (cap, head_rows);
        }
        let seq_rows: Vec<usize> = rows.seqs.iter().map(|s| s.num_rows).collect();
        b.begin_forward(&seq_rows)?;
        b.embedding(&self.token_embd, tokens, &mut self.x)?;
        let mut kept = vec![Vec::new(); self.keep_layers.len()];
        for (li, layer) in self.layers.iter().enumerate() {
            let slot = self.slots[li];
            match &layer.mixer {
                MixerWeights::Attention(w) => {
                    b.attention_sublayer(&mut self.x, w, &self.attention, kv, slot, rows, &mut self.ws)?
                }
                MixerWeights::Recurrent(w) => {
                    let spec = self.recurrent.expect("INVARIANT: a model with recurrent layers has their spec");
                    let mut states: Vec<&mut B::Tensor> =
                        state.states.iter_mut().map(|s| &mut s.layers[slot]).collect();
                    let mut snaps: Vec<StateSnapshot<'_, B>> = (state.snapshots.iter_mut())
                        .map(|(seq, rows_done, s)| StateSnapshot {
                            seq: *seq,
                            rows_done: *rows_done,
                            state: &mut s.layers[slot],
                        })
                        .collect();
                    b.recurrent_sublayer(&mut self.x, w, &spec, rows.seqs, &mut states, &mut snaps, &mut self.ws)?
                }
            }
            b.ffn_sublayer(&mut self.x, m, &layer.ffn, &mut self.ws)?;
            for (k, _) in self.keep_layers.iter().enumerate().filter(|(_, l)| **l == li) {
                kept[k] = b.read(&self.x, m)?;
            }
        }
        self.hidden_rows = kept.concat();

        // The output head, on the rows that want logits.
        if r > 0 {
            b.output_head(&self.x, logit_rows, &self.output_norm, head, &mut self.logits, &mut self.ws)?;
        }
        b.finish_forward()?;
        Ok(&self.logits)
    }
}
