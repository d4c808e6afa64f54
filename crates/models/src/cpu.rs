//! The transformer forward pass on the CPU backend, for every architecture in `arch/`.
//!
//! All rows of a batch (from any number of sequences) go through each matrix product together, so a batch of decode
//! steps or a verification of k+1 draft tokens reads every weight once. Attention is per row, over the row's own
//! sequence. KV cache: per sequence and layer, `[num_tokens, kv_dim]` f16 rows (as llama.cpp stores it).

use std::collections::HashMap;
use std::sync::Arc;

use backend::cpu::attention::{self, AttnShape, SeqAttn};
use backend::cpu::ops::{self, Rope};
use backend::cpu::{ThreadPool, matmul};
use gguf::GgufFile;

use crate::{Batch, Error, LogitsWanted, ModelConfig, Result, Runner, SeqId, Weights};

/// KV cache of one sequence: per layer, keys and values `[len, kv_dim]` as f16 bits.
#[derive(Default)]
struct SeqKv {
    len: usize,
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
}

fn append_f16(dst: &mut Vec<u16>, src: &[f32]) {
    dst.extend(src.iter().map(|&x| half::f16::from_f32(x).to_bits()));
}

/// Activation buffers, grown to the largest batch seen and reused.
#[derive(Default)]
struct Scratch {
    /// [m, hidden] residual stream
    x: Vec<f32>,
    /// [m, hidden] normalised input of the current sub-layer
    xn: Vec<f32>,
    /// [m, q_dim]
    q: Vec<f32>,
    /// [m, kv_dim]
    k: Vec<f32>,
    /// [m, kv_dim]
    v: Vec<f32>,
    /// [m, q_dim]
    att: Vec<f32>,
    /// [m, hidden]
    proj: Vec<f32>,
    /// [m, ffn]
    gate: Vec<f32>,
    /// [m, ffn]
    up: Vec<f32>,
    /// [rows, vocab]
    logits: Vec<f32>,
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

pub struct CpuRunner {
    cfg: ModelConfig,
    weights: Weights,
    rope: Rope,
    pool: ThreadPool,
    seqs: HashMap<SeqId, SeqKv>,
    scratch: Scratch,
    /// Keeps the mapping alive for the matrices that borrow it.
    _file: Arc<GgufFile>,
}

impl CpuRunner {
    /// Loads a model from a parsed GGUF file. `num_threads == 0` uses every core.
    pub fn new(file: Arc<GgufFile>, num_threads: usize) -> Result<Self> {
        let cfg = crate::arch::config_from_gguf(&file)?;
        let weights = Weights::load(&file, &cfg)?;
        let rope = Rope::new(cfg.rope_style, cfg.head_dim, cfg.rope_dim, cfg.rope_theta);
        Ok(CpuRunner {
            cfg,
            weights,
            rope,
            pool: ThreadPool::new(num_threads),
            seqs: HashMap::new(),
            scratch: Scratch::default(),
            _file: file,
        })
    }

    /// Lowers the context a sequence may reach (the memory plan's), which also bounds its KV cache. Never raises it
    /// past the model's own.
    pub fn limit_context(&mut self, max_context: usize) {
        self.cfg.max_context = self.cfg.max_context.min(max_context.max(1));
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    pub fn num_threads(&self) -> usize {
        self.pool.num_threads()
    }

    fn validate(&self, batch: &Batch<'_>) -> Result<()> {
        let mut ids: Vec<SeqId> = batch.chunks.iter().map(|c| c.seq).collect();
        ids.sort();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::DuplicateSeq(w[0].0));
        }
        for c in &batch.chunks {
            let len = self.seq_len(c.seq);
            if c.start_pos != len {
                return Err(Error::BadPosition { seq: c.seq.0, start: c.start_pos, len });
            }
            if len + c.tokens.len() > self.cfg.max_context {
                return Err(Error::ContextOverflow(c.seq.0, self.cfg.max_context));
            }
            if let Some(&t) = c.tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
                return Err(Error::BadToken(t));
            }
        }
        Ok(())
    }
}

impl Runner for CpuRunner {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<&[f32]> {
        self.validate(batch)?;
        let cfg = &self.cfg;
        let (h, qd, kvd, ffn) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.ffn_size);
        let m = batch.num_tokens();
        let s = &mut self.scratch;
        for (buf, n) in [
            (&mut s.x, h),
            (&mut s.xn, h),
            (&mut s.q, qd),
            (&mut s.k, kvd),
            (&mut s.v, kvd),
            (&mut s.att, qd),
            (&mut s.proj, h),
            (&mut s.gate, ffn),
            (&mut s.up, ffn),
        ] {
            grow(buf, m * n);
        }

        // Row t of the batch: its sequence and position.
        let mut rows: Vec<(SeqId, usize)> = Vec::with_capacity(m);
        for c in &batch.chunks {
            rows.extend((0..c.tokens.len()).map(|i| (c.seq, c.start_pos + i)));
            let kv = self.seqs.entry(c.seq).or_default();
            if kv.k.is_empty() {
                kv.k = vec![Vec::new(); cfg.num_layers];
                kv.v = vec![Vec::new(); cfg.num_layers];
            }
            // Grow geometrically ahead of time so appending a layer's rows never copies the cache mid-forward, but never
            // past the model's context: the memory plan counts exactly that much per sequence.
            let need = (c.start_pos + c.tokens.len()) * kvd;
            let most = cfg.max_context * kvd;
            for l in kv.k.iter_mut().chain(kv.v.iter_mut()) {
                if l.capacity() < need {
                    l.reserve_exact(need.max(2 * l.capacity()).min(most) - l.len());
                }
            }
        }
        let tokens = batch.chunks.iter().flat_map(|c| c.tokens.iter().copied());
        for (t, tok) in tokens.enumerate() {
            self.weights.token_embd.dequantize_row(tok as usize, &mut s.x[t * h..(t + 1) * h]);
        }

        let shape = AttnShape {
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            scale: 1.0 / (cfg.head_dim as f32).sqrt(),
        };
        let pool = &self.pool;
        for (li, lw) in self.weights.layers.iter().enumerate() {
            // Attention block.
            ops::rms_norm(&s.x[..m * h], &lw.attn_norm, cfg.rms_eps, &mut s.xn[..m * h]);
            matmul(
                pool,
                &[&lw.wq, &lw.wk, &lw.wv],
                &s.xn,
                m,
                &mut [&mut s.q[..m * qd], &mut s.k[..m * kvd], &mut s.v[..m * kvd]],
            );
            if let (Some(bq), Some(bk), Some(bv)) = (&lw.bq, &lw.bk, &lw.bv) {
                ops::add_bias(&mut s.q[..m * qd], bq);
                ops::add_bias(&mut s.k[..m * kvd], bk);
                ops::add_bias(&mut s.v[..m * kvd], bv);
            }
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                let (q, k) = (&mut s.q[..m * qd], &mut s.k[..m * kvd]);
                let tmp = q.to_vec();
                ops::rms_norm(&tmp, qn, cfg.rms_eps, q);
                let tmp = k.to_vec();
                ops::rms_norm(&tmp, kn, cfg.rms_eps, k);
            }
            for (t, &(_, pos)) in rows.iter().enumerate() {
                self.rope.apply(&mut s.q[t * qd..(t + 1) * qd], pos);
                self.rope.apply(&mut s.k[t * kvd..(t + 1) * kvd], pos);
            }
            for (t, &(seq, _)) in rows.iter().enumerate() {
                let kv = self.seqs.get_mut(&seq).expect("INVARIANT: created above");
                append_f16(&mut kv.k[li], &s.k[t * kvd..(t + 1) * kvd]);
                append_f16(&mut kv.v[li], &s.v[t * kvd..(t + 1) * kvd]);
            }
            let seq_attn: Vec<SeqAttn> = batch
                .chunks
                .iter()
                .map(|c| {
                    let kv = &self.seqs[&c.seq];
                    SeqAttn { k: &kv.k[li], v: &kv.v[li], start_pos: c.start_pos, num_rows: c.tokens.len() }
                })
                .collect();
            attention::attention(pool, shape, &s.q[..m * qd], &seq_attn, &mut s.att[..m * qd]);
            matmul(pool, &[&lw.wo], &s.att, m, &mut [&mut s.proj[..m * h]]);
            ops::add(&mut s.x[..m * h], &s.proj[..m * h]);

            // Feed-forward block.
            ops::rms_norm(&s.x[..m * h], &lw.ffn_norm, cfg.rms_eps, &mut s.xn[..m * h]);
            matmul(pool, &[&lw.w_gate, &lw.w_up], &s.xn, m, &mut [&mut s.gate[..m * ffn], &mut s.up[..m * ffn]]);
            ops::silu_mul(&mut s.gate[..m * ffn], &s.up[..m * ffn]);
            matmul(pool, &[&lw.w_down], &s.gate, m, &mut [&mut s.proj[..m * h]]);
            ops::add(&mut s.x[..m * h], &s.proj[..m * h]);
        }
        for c in &batch.chunks {
            self.seqs.get_mut(&c.seq).expect("INVARIANT: created above").len += c.tokens.len();
        }

        // Logits for the rows that want them.
        let mut out_rows = Vec::new();
        let mut t0 = 0;
        for c in &batch.chunks {
            let n = c.tokens.len();
            match c.logits {
                LogitsWanted::None => {}
                LogitsWanted::Last => out_rows.extend((n > 0).then(|| t0 + n - 1)),
                LogitsWanted::All => out_rows.extend(t0..t0 + n),
            }
            t0 += n;
        }
        let r = out_rows.len();
        for (i, &t) in out_rows.iter().enumerate() {
            ops::rms_norm(
                &s.x[t * h..(t + 1) * h],
                &self.weights.output_norm,
                cfg.rms_eps,
                &mut s.xn[i * h..(i + 1) * h],
            );
        }
        let vocab = cfg.vocab_size;
        grow(&mut s.logits, r * vocab);
        if r > 0 {
            matmul(pool, &[&self.weights.output], &s.xn, r, &mut [&mut s.logits[..r * vocab]]);
        }
        Ok(&s.logits[..r * vocab])
    }

    fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.len)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) {
        let kvd = self.cfg.kv_dim();
        if let Some(s) = self.seqs.get_mut(&seq)
            && len < s.len
        {
            s.len = len;
            for l in s.k.iter_mut().chain(s.v.iter_mut()) {
                l.truncate(len * kvd);
            }
        }
    }

    fn release(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }
}
