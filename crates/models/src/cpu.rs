//! The CPU runner: the CPU backend ([`backend::cpu::CpuBackend`]) and the KV plumbing (block tables, prefix reuse,
//! the disk tier) driving the shared forward pass ([`crate::transformer`]), for every architecture in `arch/`.
//!
//! All rows of a batch (from any number of sequences) go through each matrix product together, so a batch of decode
//! steps or a verification of k+1 draft tokens reads every weight once. Attention is per row, over the row's own
//! sequence. KV cache: paged (see `kv_cache`), each block holding `[layer][k | v][BLOCK_TOKENS][kv_dim]` f16 values
//! (as llama.cpp stores them; f32 for an unquantized file, [`KvType::for_weights`]), with prefix reuse across
//! sequences.

use std::sync::Arc;

use backend::cpu::{CpuBackend, CpuKvPages, KvBlock, QMatrix};
use backend::{AttnRows, Backend, KvLayout, KvType, SeqRows};
use gguf::GgufFile;

use crate::kv_cache::{self, BLOCK_TOKENS, BlockTable, KvUsage};
use crate::prefix_store::{PrefixStore, model_identity};
use crate::state::{StateCache, StateRefs};
use crate::transformer::Transformer;
use crate::{Batch, Error, LogitsWanted, ModelConfig, Result, Runner, SeqId, Weights, argmax, top_prob};

mod hybrid;

/// Writes the blocks `table` evicted to the disk tier (while their storage still holds them: a block the idle writer
/// has not reached yet would be lost to a warm restart), then allocates storage for the blocks `table` now needs
/// (referenced or cached) and gives back that of the blocks it no longer does, so a free block holds no memory.
fn sync_kv(table: &mut BlockTable, kv: &mut CpuKvPages, store: &mut Option<PrefixStore>) -> Result<()> {
    for (h, b) in table.take_spills() {
        save_block(store, table, &h, &kv.blocks[b as usize]);
    }
    let len = kv.layout.block_words();
    kv.blocks.resize_with(table.num_created(), KvBlock::default);
    // Every change is applied even after a failed allocation (that block stays empty, and a forward pass over it is
    // refused), so no free is lost.
    let mut result = Ok(());
    for b in table.take_storage_changes() {
        kv.blocks[b as usize] = if table.is_stored(b) {
            KvBlock::zeroed(len).unwrap_or_else(|e| {
                result = Err(e.into());
                KvBlock::default()
            })
        } else {
            KvBlock::default()
        };
    }
    result
}

/// Writes block `h` to the disk tier; on an error the tier is turned off (a full or read-only disk only costs the
/// warm restart). False when there is no tier (any more).
fn save_block(store: &mut Option<PrefixStore>, table: &mut BlockTable, h: &kv_cache::BlockHash, data: &[u16]) -> bool {
    let Some(s) = store.as_mut() else { return false };
    if let Err(e) = s.save(h, data) {
        eprintln!("warning: prefix cache on disk disabled: {e}");
        *store = None;
        table.set_spill(false);
        return false;
    }
    true
}

/// The KV type of `file`'s cache: [`KvType::for_weights`] over every layer's K and V projections (the planner
/// counts its bytes from this too).
pub fn kv_type(file: &GgufFile, cfg: &ModelConfig) -> KvType {
    let names = cfg.arch.recipe().names;
    let ty = |i: usize, name: &str| file.tensor(&format!("blk.{i}.{name}.weight")).map(|t| t.ty);
    // A hybrid's recurrent layers have no K and V projections (and no KV cache).
    KvType::for_weights((0..cfg.num_layers).flat_map(|i| [ty(i, names.attn_k), ty(i, names.attn_v)]).flatten())
}

pub struct CpuRunner {
    cfg: ModelConfig,
    backend: CpuBackend,
    model: Transformer<CpuBackend>,
    table: BlockTable,
    /// Storage of the KV blocks the table hands out.
    kv: CpuKvPages,
    /// The output head's rows for the ids [`Runner::limit_logits`] narrowed it to.
    output_head: Option<QMatrix>,
    /// The token id of each row of `output_head`, when they are not its first rows.
    head_ids: Option<Vec<u32>>,
    /// Cached prefix blocks on disk, when enabled.
    store: Option<PrefixStore>,
    /// Each sequence's recurrent state and the checkpoints (hybrid models; `crate::state`).
    state: Option<StateCache<CpuBackend>>,
    /// `[rows, logits_width()]`: the head's logits by token id, when its rows are not the first ids.
    wide: Vec<f32>,
    /// Keeps the mapping alive for the matrices that borrow it.
    _file: Arc<GgufFile>,
}

impl CpuRunner {
    /// Loads a model from a parsed GGUF file. `num_threads == 0` uses every core.
    pub fn new(file: Arc<GgufFile>, num_threads: usize) -> Result<Self> {
        let cfg = crate::arch::config_from_gguf(&file)?;
        let weights = Weights::load_hybrid(&file, &cfg)?;
        let mut backend = CpuBackend::new(num_threads);
        let model = Transformer::new(&mut backend, &cfg, &weights)?;
        let state = model.state_shape().map(StateCache::new);
        let kv = backend.kv_pages(KvLayout {
            num_layers: model.num_kv_layers(),
            kv_dim: cfg.kv_dim(),
            block_tokens: BLOCK_TOKENS,
            kv_type: kv_type(&file, &cfg),
        })?;
        // Until the memory plan says otherwise: two full contexts, at least 256 blocks (blocks are allocated as they
        // are used).
        let table = BlockTable::new((2 * cfg.max_context.div_ceil(BLOCK_TOKENS)).max(256));
        Ok(CpuRunner {
            cfg,
            backend,
            model,
            table,
            kv,
            output_head: None,
            head_ids: None,
            store: None,
            state,
            wide: Vec::new(),
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
        self.free_kv_and_checkpoints();
    }

    /// Bytes of one KV block.
    pub fn kv_block_bytes(&self) -> usize {
        self.kv.layout.block_bytes()
    }

    pub fn kv_type(&self) -> KvType {
        self.kv.layout.kv_type
    }

    /// Spills evicted blocks and allocates storage for the blocks the table now needs: see [`sync_kv`].
    fn grow_kv(&mut self) -> Result<()> {
        sync_kv(&mut self.table, &mut self.kv, &mut self.store)
    }

    /// [`Self::grow_kv`] after the table only released or evicted blocks: nothing to allocate, so nothing can fail.
    fn free_kv(&mut self) {
        self.grow_kv().expect("INVARIANT: releasing and evicting allocate no block");
    }

    /// A short identity of the model file and its KV form (see `prefix_store::model_identity`): an f32 cache's
    /// blocks on disk live apart from (and are twice the length of) an f16 one's.
    pub fn identity(&self) -> String {
        let id = model_identity(self._file.bytes());
        match self.kv.layout.kv_type {
            KvType::F16 => id,
            KvType::F32 => format!("{id}-f32kv"),
        }
    }

    /// Keeps cached prefix blocks on disk under `root` (at most `max_bytes`), in a directory of this model's own:
    /// written while idle, read back when a prompt's prefix is not in memory.
    pub fn enable_prefix_store(&mut self, root: &std::path::Path, max_bytes: u64) -> std::io::Result<&PrefixStore> {
        self.table.set_spill(true);
        Ok(self.store.insert(PrefixStore::open(root, &self.identity(), max_bytes)?))
    }

    /// Drops every cached prefix block no sequence is using (written to the disk tier first) and gives back their
    /// storage.
    pub fn evict_prefix_cache(&mut self) {
        self.table.evict_all();
        self.free_kv_and_checkpoints();
    }

    /// [`Self::free_kv`], and the state checkpoints whose blocks it evicted go too.
    fn free_kv_and_checkpoints(&mut self) {
        self.free_kv();
        if let Some(st) = self.state.as_mut() {
            st.prune(&self.table);
        }
    }

    pub fn num_threads(&self) -> usize {
        self.backend.pool().num_threads()
    }

    /// Caps the recurrent state's checkpoints kept in memory (the memory plan's; hybrid models).
    pub fn set_max_checkpoints(&mut self, max: usize) {
        if let Some(s) = self.state.as_mut() {
            s.set_max_checkpoints(max);
        }
    }

    /// Checkpoints the recurrent state every `tokens` tokens of a prefill (hybrid models; 0: only at the end of
    /// prompts and requests).
    pub fn set_checkpoint_every(&mut self, tokens: usize) {
        if let Some(s) = self.state.as_mut() {
            s.set_checkpoint_every(tokens, BLOCK_TOKENS);
        }
    }

    /// `seq`'s recurrent state, every layer's values in order (hybrid models; for tests).
    pub fn recurrent_state(&mut self, seq: SeqId) -> Option<Vec<f32>> {
        let s = self.state.as_ref()?.state(seq)?;
        s.to_host(&mut self.backend).ok()
    }

    /// Runs the batch through the layers and the output head (narrowed or not). Returns the head's logits,
    /// `[rows, output_rows()]`.
    fn forward_head(&mut self, batch: &Batch<'_>) -> Result<&[f32]> {
        self.validate(batch)?;
        let m = batch.num_tokens();
        // Row t of the batch: its position and where its key and value go.
        let mut positions = Vec::with_capacity(m);
        for c in &batch.chunks {
            positions.extend(c.start_pos..c.start_pos + c.tokens.len());
            self.table
                .reserve(c.seq, c.start_pos + c.tokens.len())
                .map_err(|e| Error::KvCacheFull { needed: e.needed, available: e.available })?;
        }
        self.grow_kv()?;
        let slots: Vec<(u32, usize)> = (batch.chunks.iter())
            .flat_map(|c| (c.start_pos..c.start_pos + c.tokens.len()).map(|pos| self.table.slot(c.seq, pos)))
            .collect();
        let tokens: Vec<u32> = batch.chunks.iter().flat_map(|c| c.tokens.iter().copied()).collect();
        let seqs: Vec<SeqRows> = (batch.chunks.iter())
            .map(|c| SeqRows { blocks: self.table.blocks(c.seq), start_pos: c.start_pos, num_rows: c.tokens.len() })
            .collect();
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
        let rows = AttnRows { positions: &positions, slots: &slots, seqs: &seqs };
        let head = (self.output_head.as_ref(), self.output_rows());
        // The recurrent states, and the snapshots this pass takes (checkpoints, rollback rows): `crate::state`.
        let mut prepared = match self.state.as_mut() {
            Some(st) => {
                let chunks: Vec<(SeqId, usize, usize, bool)> = (batch.chunks.iter())
                    .map(|c| (c.seq, c.start_pos, c.tokens.len(), c.logits != LogitsWanted::None))
                    .collect();
                Some(st.prepare(&mut self.backend, &chunks, BLOCK_TOKENS)?)
            }
            None => None,
        };
        let refs = match (self.state.as_mut(), prepared.as_mut()) {
            (Some(st), Some(p)) => st.refs(p),
            _ => StateRefs::none(),
        };
        let result = self.model.forward_states(&mut self.backend, &mut self.kv, refs, &tokens, &rows, &out_rows, head);
        drop(seqs);
        if let Err(e) = result {
            if let (Some(st), Some(p)) = (self.state.as_mut(), prepared) {
                st.abandon(p);
            }
            return Err(e);
        }
        for c in &batch.chunks {
            self.table.commit(c.seq, c.tokens);
        }
        if let (Some(st), Some(p)) = (self.state.as_mut(), prepared) {
            st.finish(&mut self.backend, p, &self.table)?;
        }
        Ok(self.model.logits().rows(out_rows.len()))
    }

    /// Rows of the output head the forward pass computes.
    fn output_rows(&self) -> usize {
        self.output_head.as_ref().map_or(self.model.output().rows, |h| h.rows)
    }

    /// Runs the batch and picks from each row of the head's logits with `pick` (its index into the row, and a
    /// value), the index mapped back to a token id.
    fn forward_picks(&mut self, batch: &Batch<'_>, pick: fn(&[f32]) -> (u32, f32)) -> Result<Vec<(u32, f32)>> {
        let width = self.output_rows().max(1);
        self.forward_head(batch)?;
        let rows = batch.num_logit_rows();
        let picks = self.model.logits().rows(rows).chunks_exact(width).map(pick);
        Ok(match &self.head_ids {
            Some(ids) => picks.map(|(i, v)| (ids[i as usize], v)).collect(),
            None => picks.collect(),
        })
    }

    fn validate(&mut self, batch: &Batch<'_>) -> Result<()> {
        batch.validate(&self.cfg, |seq| self.seq_len(seq))?;
        // A state a failed pass left half-advanced is rebuilt first.
        let dirty: Vec<SeqId> = match &self.state {
            Some(st) => batch.chunks.iter().map(|c| c.seq).filter(|&s| st.is_dirty(s)).collect(),
            None => Vec::new(),
        };
        for seq in dirty {
            self.sync_state(seq)?;
        }
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
        let Some(ids) = &self.head_ids else { return Ok(self.model.logits().rows(rows)) };
        // Logits by token id: the head's rows scattered, -inf for the ids it does not compute.
        let (width, head_rows) = (self.logits_width(), ids.len());
        self.wide.clear();
        self.wide.resize(rows * width, f32::NEG_INFINITY);
        for (wide, head) in
            self.wide.chunks_exact_mut(width).zip(self.model.logits().rows(rows).chunks_exact(head_rows))
        {
            for (&id, &v) in ids.iter().zip(head) {
                wide[id as usize] = v;
            }
        }
        Ok(&self.wide)
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
        let full = self.model.output();
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
                (Some(full.gathered(&ids, self.backend.pool())), Some(ids))
            }
        };
        self.logits_width()
    }

    fn set_hidden_layers(&mut self, layers: &[usize]) -> Result<()> {
        if let Some(&l) = layers.iter().find(|&&l| l >= self.cfg.num_layers) {
            return Err(Error::Unsupported(format!("hidden rows of layer {l}: the model has {}", self.cfg.num_layers)));
        }
        self.model.keep_hidden(layers);
        Ok(())
    }

    fn hidden_rows(&self) -> &[f32] {
        self.model.hidden_rows()
    }

    fn seq_len(&self, seq: SeqId) -> usize {
        self.table.seq_len(seq)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) {
        if let Some(copy) = self.table.truncate(seq, len) {
            // The trait's rollback cannot fail: no memory for the copy's block ends the process, as a Vec's would.
            self.grow_kv().expect("memory for the KV block of a rollback's copy");
            self.backend.kv_copy_block(&mut self.kv, copy.from, copy.to).expect("INVARIANT: the table's blocks exist");
        }
        if self.sync_state(seq).is_err() {
            // Only a failed replay gets here: the state is rebuilt again before the sequence's next pass, and that
            // pass reports the error if it persists.
            if let Some(st) = self.state.as_mut() {
                st.abandon_seq(seq);
            }
        }
    }

    fn release(&mut self, seq: SeqId) {
        if let Some(st) = self.state.as_mut() {
            st.release(seq, &self.table);
        }
        self.table.release(seq);
        self.free_kv();
    }

    fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        if self.state.is_some() {
            return self.attach_hybrid(seq, tokens);
        }
        let n = self.table.attach_prefix(seq, tokens);
        self.attach_from_disk(seq, tokens, n, tokens.len())
    }

    fn idle_work(&mut self) -> bool {
        let Some(store) = self.store.as_mut() else { return false };
        let blocks = &self.kv.blocks;
        let fetch = |b: u32, buf: &mut Vec<u16>| {
            buf.clear();
            buf.extend_from_slice(&blocks[b as usize]);
            Ok(())
        };
        match store.save_pending(&self.table, &mut Vec::new(), fetch) {
            Ok(true) => true,
            // The blocks first, then the state checkpoints that resume on them.
            Ok(false) => self.save_checkpoint(),
            Err(e) => {
                self.disable_store(&e);
                false
            }
        }
    }

    fn kv_usage(&self) -> KvUsage {
        KvUsage { state: self.state.as_ref().map(|s| s.usage()), ..self.table.usage() }
    }
}

impl CpuRunner {
    /// Turns the disk tier off after an error: a full or read-only disk only costs the warm restart (and spilling
    /// stops).
    fn disable_store(&mut self, e: &str) {
        eprintln!("warning: prefix cache on disk disabled: {e}");
        self.store = None;
        self.table.set_spill(false);
    }

    /// Continues `seq` (which holds `n` tokens, whole blocks) from the disk tier, block by block while the next
    /// block of `tokens` is there and intact, up to `limit` tokens; returns the tokens it holds then.
    fn attach_from_disk(&mut self, seq: SeqId, tokens: &[u32], mut n: usize, limit: usize) -> usize {
        let block_len = self.kv.layout.block_words();
        let mut buf = Vec::new();
        while n + BLOCK_TOKENS <= tokens.len().min(limit) {
            let Some(store) = self.store.as_mut() else { break };
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
            if self.grow_kv().is_err() || self.backend.kv_block_from_host(&mut self.kv, b, &buf).is_err() {
                self.table.detach_loaded(seq);
                self.free_kv();
                break;
            }
            n += BLOCK_TOKENS;
        }
        n
    }
}
