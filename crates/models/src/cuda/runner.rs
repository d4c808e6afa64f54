//! [`CudaRunner`]: the model on the GPU ([`FusedBackend`] and the shared forward pass, `transformer.rs`), its KV
//! pages under the shared block table, and how a batch becomes one pass (pages reserved, the pass planned, the
//! forward run, full pages registered); [`Runner`] on top.

use backend::{AttnRows, Backend, SeqRows};

use super::PAGE_SIZE;
use super::fused::{FusedBackend, KvPool, Pick};
use crate::kv_cache::{BlockTable, KvUsage};
use crate::prefix_store::PrefixStore;
use crate::transformer::Transformer;
use crate::{Batch, Error, LogitsWanted, ModelConfig, NextStep, Result, Runner, SeqId};

/// What loading cost: NVRTC compile seconds (0 on a cache hit), upload seconds.
#[derive(Debug, Clone, Default)]
pub struct CudaLoadStats {
    pub compile_s: f64,
    pub cache_hit: bool,
    pub upload_s: f64,
    pub weight_bytes: usize,
    pub kv_tokens: usize,
    pub gpu: String,
    pub arch: String,
    /// Why long chunks do not use tensor cores (None: they do).
    pub no_gemm: Option<String>,
}

pub struct CudaRunner {
    pub(super) cfg: ModelConfig,
    pub(super) backend: FusedBackend,
    pub(super) model: Transformer<FusedBackend>,
    pub(super) kv: KvPool,
    /// Which pages each sequence holds, their reference counts and the prefix cache ([`BlockTable`] with pages of
    /// [`PAGE_SIZE`] positions).
    pub(super) table: BlockTable,
    /// Prefix pages on disk, when enabled (`kv.rs`).
    pub(super) store: Option<PrefixStore>,
    /// Page-locked staging for pages read back from disk (allocated when the disk tier opens with pages on it, else
    /// at the first read: `kv.rs`).
    pub(super) stage: Option<backend::cuda::Pinned<u16>>,
    /// The model's identity for the disk tier (`prefix_store::model_identity`, with the device's KV layout).
    pub(super) identity: String,
    /// Logits of the last forward pass (page-locked: copied straight from the device).
    pub(super) logits: Option<backend::cuda::PinnedF32>,
    /// Rows whose largest logits the device could not select (`forward_candidates` fell back to the host).
    pub(super) host_selected: usize,
    /// The pass started ahead by [`Runner::forward_argmax_then`] with `NextStep::FedPicks`, not yet asked for.
    pub(super) ahead: Option<Ahead>,
    /// An event per slot of the backend's pick ring (`FusedBackend::ahead_ring`) marking the end of the one-row pass
    /// that writes it.
    pub(super) ahead_done: [cudarc::driver::CudaEvent; 2],
    pub stats: CudaLoadStats,
}

/// A decode pass enqueued ahead of its call: position `pos` of `seq`, whose token is the pick of the pass before,
/// written on the device (`argmax_rows`' feed). The sequence's length counts it only once a call asks for it.
pub(super) struct Ahead {
    pub(super) seq: SeqId,
    pub(super) pos: usize,
    /// The pick it was fed, which the call that takes it must hold as its token.
    pub(super) token: u32,
}

impl Drop for CudaRunner {
    /// A pass started ahead may still be running, and it writes the page-locked ring.
    fn drop(&mut self) {
        let _ = self.backend.gpu.sync();
    }
}

// SAFETY: every CUDA object here is used only through &mut self, from one thread at a time; the context is bound
// to the calling thread before each use.
unsafe impl Send for CudaRunner {}

impl CudaRunner {
    /// Lowers the context a sequence may reach. Never raises it past the model's own.
    pub fn limit_context(&mut self, max_context: usize) {
        self.cfg.max_context = self.cfg.max_context.min(max_context.max(1));
        self.backend.cfg.max_context = self.cfg.max_context;
    }

    /// With `SPLASH_CUDA_TIME_STEPS=1`: passes timed since the last call, and the device's mean milliseconds per pass
    /// for the metadata copies and for the pass itself; the counts start again.
    pub fn take_step_times(&mut self) -> Option<(usize, f64, f64)> {
        let t = self.backend.step_timer.as_mut()?;
        let n = t.steps.max(1) as f64;
        let out = (t.steps, t.copies_ms / n, t.pass_ms / n);
        (t.steps, t.copies_ms, t.pass_ms) = (0, 0.0, 0.0);
        Some(out)
    }

    /// Rows of [`Runner::forward_candidates`] selected on the host because the device gave up (more than 2,048
    /// logits tied at a segment's threshold), since the runner started.
    pub fn host_selected_rows(&self) -> usize {
        self.host_selected
    }

    pub fn device_name(&self) -> &str {
        &self.backend.gpu.name
    }

    pub(super) fn validate(&self, batch: &Batch<'_>) -> Result<()> {
        batch.validate(&self.cfg, |seq| self.seq_len(seq))?;
        let new_pages: usize =
            batch.chunks.iter().map(|c| self.table.blocks_needed(c.seq, c.start_pos + c.tokens.len())).sum();
        let available = self.table.num_available();
        if new_pages > available {
            return Err(Error::Backend(format!(
                "the GPU KV cache is full ({available} pages of {PAGE_SIZE} tokens free, {new_pages} needed)"
            )));
        }
        Ok(())
    }

    /// Runs the batch up to its logits and `pick`, enqueued on the stream without waiting; the sequences' lengths
    /// are advanced. Returns the number of logit rows. `ahead`: a decode pass started ahead ([`Ahead`]): its token
    /// and position are already on the device (written by the pass before), and no length is advanced.
    pub(super) fn run(&mut self, batch: &Batch<'_>, ahead: bool, pick: Pick) -> Result<usize> {
        self.validate(batch)?;
        if !ahead {
            // Whatever was started ahead is not this batch: dropped (it wrote nothing a later pass reads before
            // rewriting it, and the stream runs it before them).
            self.ahead = None;
        }
        let m = batch.num_tokens();
        if m == 0 {
            return Ok(0);
        }
        // Pages for the new tokens.
        let mut new_pages = false;
        for c in &batch.chunks {
            let end = c.start_pos + c.tokens.len();
            new_pages |= self.table.blocks_needed(c.seq, end) > 0;
            self.table.reserve(c.seq, end).expect("INVARIANT: validate counted the free pages");
        }
        let table = &self.table;
        let pages = |ci: usize| table.blocks(batch.chunks[ci].seq);
        self.backend.prepare_pass(batch, pages, ahead, new_pages, pick)?;
        // Where each row sits, and the rows that want logits (the backend reads them from the pass's metadata).
        let (mut tokens, mut positions, mut slots) = (Vec::with_capacity(m), Vec::with_capacity(m), Vec::new());
        let mut logit_rows = Vec::new();
        let mut t0 = 0;
        for c in &batch.chunks {
            let n = c.tokens.len();
            tokens.extend_from_slice(c.tokens);
            positions.extend(c.start_pos..c.start_pos + n);
            let blocks = table.blocks(c.seq);
            slots.extend((c.start_pos..c.start_pos + n).map(|p| (blocks[p / PAGE_SIZE], p % PAGE_SIZE)));
            match c.logits {
                LogitsWanted::None => {}
                LogitsWanted::Last => logit_rows.extend((n > 0).then(|| t0 + n - 1)),
                LogitsWanted::All => logit_rows.extend(t0..t0 + n),
            }
            t0 += n;
        }
        let seqs: Vec<SeqRows> = (batch.chunks.iter())
            .map(|c| SeqRows { blocks: table.blocks(c.seq), start_pos: c.start_pos, num_rows: c.tokens.len() })
            .collect();
        let rows = AttnRows { positions: &positions, slots: &slots, seqs: &seqs };
        let head = (None, self.cfg.vocab_size);
        let res = self.model.forward(&mut self.backend, &mut self.kv, &tokens, &rows, &logit_rows, head).map(|_| ());
        if res.is_err() {
            self.backend.abort_pass();
        }
        res?;
        drop(seqs);
        if !ahead {
            // The pages the pass fills: full ones are registered for prefix reuse (any reader runs after this pass
            // in the stream).
            for c in &batch.chunks {
                self.table.commit(c.seq, c.tokens);
            }
        }
        Ok(logit_rows.len())
    }
}

impl Runner for CudaRunner {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<&[f32]> {
        let r = self.run(batch, false, Pick::None)?;
        let vocab = self.cfg.vocab_size;
        let gpu = &self.backend.gpu;
        if self.logits.as_ref().is_none_or(|l| l.len() < r * vocab) {
            self.logits = None;
            let cap = self.backend.scratch.as_ref().map_or(r, |s| s.cap_r).max(r);
            self.logits = Some(gpu.alloc_pinned(cap * vocab)?);
        }
        let logits = self.logits.as_mut().expect("INVARIANT: allocated above");
        if r > 0 {
            gpu.dtoh_pinned(logits, self.model.logits().buf.ptr, r * vocab)?;
        } else {
            gpu.sync()?;
        }
        Ok(&self.logits.as_ref().expect("INVARIANT: allocated above").as_slice()[..r * vocab])
    }

    /// Picked on the device (`pick.rs`): each row's argmax.
    fn forward_argmax(&mut self, batch: &Batch<'_>) -> Result<Vec<u32>> {
        self.picks_argmax(batch)
    }

    /// Picked on the device (`pick.rs`): with decode ahead when the picks are fed back.
    fn forward_argmax_then(&mut self, batch: &Batch<'_>, next: NextStep) -> Result<Vec<u32>> {
        match next {
            NextStep::FedPicks => self.picks_argmax_ahead(batch),
            NextStep::Unknown => self.picks_argmax(batch),
        }
    }

    /// Picked on the device (`pick.rs`): argmax and probability.
    fn forward_top(&mut self, batch: &Batch<'_>) -> Result<Vec<(u32, f32)>> {
        self.picks_top(batch)
    }

    /// Picked on the device (`pick.rs`): largest logits.
    fn forward_candidates(&mut self, batch: &Batch<'_>, n: usize) -> Result<Vec<Vec<(u32, f32)>>> {
        self.picks_candidates(batch, n)
    }

    fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> usize {
        self.attach_cached_prefix(seq, tokens)
    }

    fn idle_work(&mut self) -> bool {
        self.save_idle_pages()
    }

    fn kv_usage(&self) -> KvUsage {
        self.table.usage()
    }

    /// The pick's probability is computed on the device ([`Runner::forward_top`]).
    fn top_prob_is_cheap(&self) -> bool {
        true
    }

    fn seq_len(&self, seq: SeqId) -> usize {
        self.table.seq_len(seq)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) {
        self.ahead = None;
        if let Some(copy) = self.table.truncate(seq, len)
            && let Err(e) = self.backend.kv_copy_block(&mut self.kv, copy.from, copy.to)
        {
            // The rows kept would be missing from the copy: the sequence cannot go on from here.
            eprintln!("warning: copying a KV page on the GPU failed ({e}); sequence {seq} dropped");
            self.table.release(seq);
        }
    }

    fn release(&mut self, seq: SeqId) {
        self.ahead = None;
        self.table.release(seq);
    }
}
