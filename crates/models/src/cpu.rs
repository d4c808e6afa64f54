//! The transformer forward pass on the CPU backend, for every architecture in `arch/`.
//!
//! All rows of a batch (from any number of sequences) go through each matrix product together, so a batch of decode
//! steps or a verification of k+1 draft tokens reads every weight once. Attention is per row, over the row's own
//! sequence. KV cache: paged (see `kv_cache`), each block holding `[layer][k | v][BLOCK_TOKENS][kv_dim]` f16 values
//! (as llama.cpp stores them), with prefix reuse across sequences.

use std::sync::Arc;

use backend::cpu::attention::{self, AttnShape, SeqAttn};
use backend::cpu::ops::{self, Rope};
use backend::cpu::{QMatrix, ThreadPool, matmul};
use gguf::GgufFile;

use crate::kv_cache::{self, BLOCK_TOKENS, BlockTable, KvUsage};
use crate::prefix_store::{PrefixStore, model_identity};
use crate::{Batch, Error, LogitsWanted, ModelConfig, Result, Runner, SeqId, Weights, argmax, top_prob};

fn write_f16(dst: &mut [u16], src: &[f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(x).to_bits();
    }
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
    /// [rows, output head rows]
    logits: Vec<f32>,
    /// [rows, logits_width()]: the head's logits by token id, when its rows are not the first ids.
    wide: Vec<f32>,
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// Allocates storage (`len` values) for the blocks `table` now needs and frees it for those it no longer does.
fn sync_storage(table: &mut BlockTable, blocks: &mut Vec<Box<[u16]>>, len: usize) {
    blocks.resize_with(table.num_created(), Box::default);
    for b in table.take_storage_changes() {
        blocks[b as usize] = if table.is_stored(b) { vec![0u16; len].into_boxed_slice() } else { Box::default() };
    }
}

pub struct CpuRunner {
    cfg: ModelConfig,
    weights: Weights,
    rope: Rope,
    pool: ThreadPool,
    table: BlockTable,
    /// Storage of block `b`: `[layer][k | v][BLOCK_TOKENS][kv_dim]`.
    blocks: Vec<Box<[u16]>>,
    /// The output head's rows for the ids [`Runner::limit_logits`] narrowed it to.
    output_head: Option<QMatrix>,
    /// The token id of each row of `output_head`, when they are not its first rows.
    head_ids: Option<Vec<u32>>,
    /// Cached prefix blocks on disk, when enabled.
    store: Option<PrefixStore>,
    scratch: Scratch,
    /// Keeps the mapping alive for the matrices that borrow it.
    _file: Arc<GgufFile>,
}

/// Repacks the matrices whose type this machine's kernels read faster in another layout (Q4_K on AVX-512: the pairs
/// layout, `backend::cpu::quant::q4k_pairs`), replacing the views of the file by packed copies. The token embedding
/// stays as it is (rows are looked up one at a time), and so does a tied output head.
fn repack(weights: &mut Weights, tied: bool, pool: &ThreadPool) {
    let mut mats: Vec<&mut QMatrix> = Vec::new();
    for l in &mut weights.layers {
        mats.extend([&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo, &mut l.w_gate, &mut l.w_up, &mut l.w_down]);
    }
    if !tied {
        mats.push(&mut weights.output);
    }
    for m in mats {
        if let Some(p) = m.repacked(pool) {
            *m = p;
        }
    }
}

impl CpuRunner {
    /// Loads a model from a parsed GGUF file. `num_threads == 0` uses every core.
    pub fn new(file: Arc<GgufFile>, num_threads: usize) -> Result<Self> {
        let cfg = crate::arch::config_from_gguf(&file)?;
        let mut weights = Weights::load(&file, &cfg)?;
        let pool = ThreadPool::new(num_threads);
        repack(&mut weights, cfg.tied_embeddings, &pool);
        let rope = Rope::new(cfg.rope_style, cfg.head_dim, cfg.rope_dim, cfg.rope_theta);
        // Until the memory plan says otherwise: two full contexts, at least 256 blocks (blocks are allocated as they
        // are used).
        let table = BlockTable::new((2 * cfg.max_context.div_ceil(BLOCK_TOKENS)).max(256));
        Ok(CpuRunner {
            cfg,
            weights,
            rope,
            pool,
            table,
            blocks: Vec::new(),
            output_head: None,
            head_ids: None,
            store: None,
            scratch: Scratch::default(),
            _file: file,
        })
    }

    /// Lowers the context a sequence may reach (the memory plan's), which also bounds its KV cache. Never raises it
    /// past the model's own.
    pub fn limit_context(&mut self, max_context: usize) {
        self.cfg.max_context = self.cfg.max_context.min(max_context.max(1));
    }

    /// Sets how many KV blocks of [`BLOCK_TOKENS`] tokens the cache may hold (the memory plan's pages).
    pub fn set_kv_blocks(&mut self, num_blocks: usize) {
        self.table.set_max_blocks(num_blocks);
    }

    /// Caps the in-memory prefix cache (unreferenced cached blocks); `None` = the whole pool.
    pub fn set_prefix_cache_blocks(&mut self, max_blocks: Option<usize>) {
        self.table.set_max_cached_blocks(max_blocks);
        self.sync_storage();
    }

    /// Allocates storage for the blocks the table now needs and frees it for those it no longer does.
    fn sync_storage(&mut self) {
        let len = self.block_len();
        sync_storage(&mut self.table, &mut self.blocks, len);
    }

    /// Bytes of one KV block.
    pub fn kv_block_bytes(&self) -> usize {
        self.block_len() * 2
    }

    fn block_len(&self) -> usize {
        self.cfg.num_layers * 2 * BLOCK_TOKENS * self.cfg.kv_dim()
    }

    /// A short identity of the model file (see `prefix_store::model_identity`).
    pub fn identity(&self) -> String {
        model_identity(self._file.bytes())
    }

    /// Keeps cached prefix blocks on disk under `root` (at most `max_bytes`), in a directory of this model's own:
    /// written while idle, read back when a prompt's prefix is not in memory.
    pub fn enable_prefix_store(&mut self, root: &std::path::Path, max_bytes: u64) -> std::io::Result<&PrefixStore> {
        let identity = model_identity(self._file.bytes());
        Ok(self.store.insert(PrefixStore::open(root, &identity, max_bytes)?))
    }

    /// Drops every cached prefix block no sequence is using.
    pub fn evict_prefix_cache(&mut self) {
        self.table.evict_all();
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    pub fn num_threads(&self) -> usize {
        self.pool.num_threads()
    }

    /// Runs the batch through the layers and the output head (narrowed or not). Returns the head's logits,
    /// `[rows, output_rows()]`.
    fn forward_head(&mut self, batch: &Batch<'_>) -> Result<&[f32]> {
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
            self.table
                .reserve(c.seq, c.start_pos + c.tokens.len())
                .map_err(|e| Error::KvCacheFull { needed: e.needed, available: e.available })?;
        }
        let block_len = cfg.num_layers * 2 * BLOCK_TOKENS * kvd;
        sync_storage(&mut self.table, &mut self.blocks, block_len);
        // Where each row's keys and values go.
        let slots: Vec<(u32, usize)> = rows.iter().map(|&(seq, pos)| self.table.slot(seq, pos)).collect();
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
            let layer_k = li * 2 * BLOCK_TOKENS * kvd;
            let layer_v = layer_k + BLOCK_TOKENS * kvd;
            for (t, &(b, row)) in slots.iter().enumerate() {
                let blk = &mut self.blocks[b as usize];
                write_f16(&mut blk[layer_k + row * kvd..][..kvd], &s.k[t * kvd..(t + 1) * kvd]);
                write_f16(&mut blk[layer_v + row * kvd..][..kvd], &s.v[t * kvd..(t + 1) * kvd]);
            }
            let blocks = &self.blocks;
            let seq_attn: Vec<SeqAttn> = batch
                .chunks
                .iter()
                .map(|c| {
                    let ids = self.table.blocks(c.seq);
                    SeqAttn {
                        k: ids.iter().map(|&b| &blocks[b as usize][layer_k..layer_k + BLOCK_TOKENS * kvd]).collect(),
                        v: ids.iter().map(|&b| &blocks[b as usize][layer_v..layer_v + BLOCK_TOKENS * kvd]).collect(),
                        block_tokens: BLOCK_TOKENS,
                        start_pos: c.start_pos,
                        num_rows: c.tokens.len(),
                    }
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
            self.table.commit(c.seq, c.tokens);
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
        let head = self.output_head.as_ref().unwrap_or(&self.weights.output);
        let vocab = head.rows;
        grow(&mut s.logits, r * vocab);
        if r > 0 {
            matmul(pool, &[head], &s.xn, r, &mut [&mut s.logits[..r * vocab]]);
        }
        Ok(&s.logits[..r * vocab])
    }

    /// Rows of the output head the forward pass computes.
    fn output_rows(&self) -> usize {
        self.output_head.as_ref().map_or(self.weights.output.rows, |h| h.rows)
    }

    /// Runs the batch and picks from each row of the head's logits with `pick` (its index into the row, and a
    /// value), the index mapped back to a token id.
    fn forward_picks(&mut self, batch: &Batch<'_>, pick: fn(&[f32]) -> (u32, f32)) -> Result<Vec<(u32, f32)>> {
        let width = self.output_rows().max(1);
        self.forward_head(batch)?;
        let rows = batch.num_logit_rows();
        let picks = self.scratch.logits[..rows * width].chunks_exact(width).map(pick);
        Ok(match &self.head_ids {
            Some(ids) => picks.map(|(i, v)| (ids[i as usize], v)).collect(),
            None => picks.collect(),
        })
    }

    fn validate(&self, batch: &Batch<'_>) -> Result<()> {
        batch.validate(&self.cfg, |seq| self.seq_len(seq))?;
        let needed: usize =
            batch.chunks.iter().map(|c| self.table.blocks_needed(c.seq, c.start_pos + c.tokens.len())).sum();
        let available = self.table.num_available();
        if needed > available {
            return Err(Error::KvCacheFull { needed, available });
        }
        Ok(())
    }
}

impl Runner for CpuRunner {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<&[f32]> {
        let rows = self.forward_head(batch)?.len() / self.output_rows();
        let Some(ids) = &self.head_ids else { return Ok(&self.scratch.logits[..rows * self.output_rows()]) };
        // Logits by token id: the head's rows scattered, -inf for the ids it does not compute.
        let (width, head_rows) = (self.logits_width(), ids.len());
        let s = &mut self.scratch;
        s.wide.clear();
        s.wide.resize(rows * width, f32::NEG_INFINITY);
        for (wide, head) in s.wide.chunks_exact_mut(width).zip(s.logits.chunks_exact(head_rows)) {
            for (&id, &v) in ids.iter().zip(head) {
                wide[id as usize] = v;
            }
        }
        Ok(&s.wide)
    }

    fn forward_argmax(&mut self, batch: &Batch<'_>) -> Result<Vec<u32>> {
        Ok(self.forward_picks(batch, |row| (argmax(row), 0.0))?.into_iter().map(|(id, _)| id).collect())
    }

    fn forward_top(&mut self, batch: &Batch<'_>) -> Result<Vec<(u32, f32)>> {
        self.forward_picks(batch, top_prob)
    }

    fn logits_width(&self) -> usize {
        match &self.head_ids {
            Some(ids) => ids.last().map_or(0, |&id| id as usize + 1),
            None => self.output_head.as_ref().map_or(self.cfg.vocab_size, |h| h.rows),
        }
    }

    fn limit_logits(&mut self, n: usize) -> usize {
        let full = &self.weights.output;
        let rows = (n > 0 && n < full.rows).then_some(n);
        if self.output_head.as_ref().map(|h| h.rows) == rows {
            // Already this wide (the same `n` always picks the same ids): no second gather.
            return self.logits_width();
        }
        (self.output_head, self.head_ids) = if rows.is_none() {
            (None, None)
        } else {
            let ids = crate::draft_head::head_ids(&self._file, full.rows, n);
            if ids.iter().enumerate().all(|(i, &id)| id as usize == i) {
                (Some(full.first_rows(n)), None)
            } else {
                (Some(full.gathered(&ids, &self.pool)), Some(ids))
            }
        };
        self.logits_width()
    }

    fn seq_len(&self, seq: SeqId) -> usize {
        self.table.seq_len(seq)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) {
        if let Some(copy) = self.table.truncate(seq, len) {
            self.sync_storage();
            let from = self.blocks[copy.from as usize].clone();
            self.blocks[copy.to as usize].copy_from_slice(&from);
        }
    }

    fn release(&mut self, seq: SeqId) {
        self.table.release(seq);
        self.sync_storage();
    }

    fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        let mut n = self.table.attach_prefix(seq, tokens);
        let Some(store) = self.store.as_mut() else { return n };
        // Continue from disk, block by block, while the next block is there and intact.
        let block_len = self.cfg.num_layers * 2 * BLOCK_TOKENS * self.cfg.kv_dim();
        let mut buf = Vec::new();
        while n + BLOCK_TOKENS <= tokens.len() {
            let chunk = &tokens[n..n + BLOCK_TOKENS];
            let h = kv_cache::chain_hash(&self.table.last_hash(seq), chunk);
            if !store.contains(&h) {
                break;
            }
            buf.resize(block_len, 0);
            if !store.load(&h, &mut buf) {
                break;
            }
            let Some(b) = self.table.attach_loaded(seq, h, chunk) else { break };
            sync_storage(&mut self.table, &mut self.blocks, block_len);
            self.blocks[b as usize].copy_from_slice(&buf);
            n += BLOCK_TOKENS;
        }
        n
    }

    fn idle_work(&mut self) -> bool {
        let Some(store) = self.store.as_mut() else { return false };
        let pending: Vec<(kv_cache::BlockHash, u32)> =
            self.table.registered().filter(|(h, _)| !store.contains(h)).map(|(h, b)| (*h, b)).take(9).collect();
        for &(h, b) in pending.iter().take(8) {
            if let Err(e) = store.save(&h, &self.blocks[b as usize]) {
                // A full or read-only disk only costs the warm restart; stop trying.
                eprintln!("warning: prefix cache on disk disabled: {e}");
                self.store = None;
                return false;
            }
        }
        pending.len() > 8
    }

    fn kv_usage(&self) -> KvUsage {
        self.table.usage()
    }
}
