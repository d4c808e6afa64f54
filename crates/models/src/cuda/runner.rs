//! [`CudaRunner`]: the model on the device, its KV pages and scratch, and how a batch becomes one pass (segments,
//! metadata, a CUDA graph per batch shape); [`Runner`] on top.

use std::collections::HashMap;
use std::sync::Arc;

use backend::cuda::{Blas, DevBuf, Gpu};
use cudarc::driver::{CudaGraph, CudaModule};
use gguf::GgmlType;

use super::kernels::KernelTable;
use super::meta::{GemmChunk, Meta, Seg, pack_meta};
use super::prefill::GemmScratch;
use super::tactics::{att_splits, decode_splits, on_tensor_cores};
use super::{ARGMAX_BLOCKS, CudaOptions, DEVICE_CANDIDATES, GEMM_MIN_ROWS, MAX_GRAPH_ROWS, PAGE_SIZE, TOPK_BLOCKS};
use crate::kv_cache::{BlockTable, KvUsage};
use crate::prefix_store::PrefixStore;
use crate::{Batch, Error, ModelConfig, NextStep, Result, Runner, SeqId};

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

pub(super) struct GMat {
    pub(super) ty: GgmlType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) buf: DevBuf,
}

pub(super) struct GLayer {
    pub(super) attn_norm: DevBuf,
    pub(super) wq: GMat,
    pub(super) wk: GMat,
    pub(super) wv: GMat,
    pub(super) bq: Option<DevBuf>,
    pub(super) bk: Option<DevBuf>,
    pub(super) bv: Option<DevBuf>,
    pub(super) q_norm: Option<DevBuf>,
    pub(super) k_norm: Option<DevBuf>,
    pub(super) wo: GMat,
    pub(super) ffn_norm: DevBuf,
    pub(super) gate: GMat,
    pub(super) up: GMat,
    pub(super) down: GMat,
}

/// Activations and per-step metadata, sized for `cap_m` rows, `cap_chunks` sequences and `cap_r` logit rows.
pub(super) struct Scratch {
    pub(super) cap_m: usize,
    pub(super) cap_chunks: usize,
    pub(super) cap_r: usize,
    pub(super) x: DevBuf,
    pub(super) xn: DevBuf,
    pub(super) q: DevBuf,
    pub(super) k: DevBuf,
    pub(super) v: DevBuf,
    pub(super) att: DevBuf,
    pub(super) gate: DevBuf,
    pub(super) up: DevBuf,
    /// Rounded activations (see `CudaOptions::exact_activations`).
    pub(super) xq: DevBuf,
    /// 8-bit activations (int8) and their per-32 {scale, scale * sum} of the dp4a kernels.
    pub(super) xq8: DevBuf,
    pub(super) xds: DevBuf,
    /// A second pair for kernels that read one set and write the next (gate/up writes the down projection's input).
    pub(super) xq8b: DevBuf,
    pub(super) xdsb: DevBuf,
    /// Attention partials of the splits.
    pub(super) part: DevBuf,
    /// Per (row, head): splits finished (the last one merges); zero between launches.
    pub(super) counters: DevBuf,
    pub(super) logits: DevBuf,
    /// Greedy token of each logit row (`Runner::forward_argmax`).
    pub(super) ids: DevBuf,
    /// Each greedy pick's softmax probability (`Runner::forward_top`).
    pub(super) probs: DevBuf,
    /// The [`DEVICE_CANDIDATES`] largest logits of each segment of each row (`topk_rows`, for
    /// `Runner::forward_candidates`), in one buffer so that one copy brings them back: a flag per (row, segment), set
    /// when the device could not select them (too many ties; the host then selects from the row), then the
    /// segments' sorted keys.
    pub(super) cand: DevBuf,
    /// Partials of the blocks that reduce one logit row together in `argmax_rows`, and per row the count of blocks
    /// done (zero between launches).
    pub(super) row_part: DevBuf,
    pub(super) row_counters: DevBuf,
    /// A pass's metadata (tokens, positions, slots, logit rows, page tables: [`Meta`]), copied in one piece from
    /// `meta_host` (page-locked, so the copy is asynchronous; `meta_copied` marks its end before the next rewrite).
    pub(super) meta: DevBuf,
    pub(super) meta_host: backend::cuda::Pinned<u32>,
    pub(super) meta_copied: cudarc::driver::CudaEvent,
}

pub(super) struct Graph(pub(super) CudaGraph);
// SAFETY: the graph is only launched from the thread that owns the runner; CUDA handles may move between threads.
unsafe impl Send for Graph {}

pub struct CudaRunner {
    pub(super) cfg: ModelConfig,
    pub(super) gpu: Gpu,
    pub(super) _module: Arc<CudaModule>,
    pub(super) kernels: KernelTable,
    pub(super) embd: GMat,
    /// None: tied to `embd`.
    pub(super) output: Option<GMat>,
    pub(super) output_norm: DevBuf,
    pub(super) layers: Vec<GLayer>,
    pub(super) inv_freq: DevBuf,
    pub(super) kc: Vec<DevBuf>,
    pub(super) vc: Vec<DevBuf>,
    pub(super) max_pages: usize,
    /// Which pages each sequence holds, their reference counts and the prefix cache ([`BlockTable`] with pages of
    /// [`PAGE_SIZE`] positions): page `b` of layer `l` is `PAGE_SIZE` rows of `kc[l]` / `vc[l]` at `b * page_bytes`.
    pub(super) table: BlockTable,
    /// Bytes of one page of one layer's K (or V).
    pub(super) page_bytes: usize,
    /// Prefix pages on disk, when enabled (`kv.rs`).
    pub(super) store: Option<PrefixStore>,
    /// Page-locked staging for pages read back from disk (allocated at the first read: `kv.rs`).
    pub(super) stage: Option<backend::cuda::Pinned<u16>>,
    /// The model's identity for the disk tier (`prefix_store::model_identity`, with the device's KV layout).
    pub(super) identity: String,
    pub(super) scratch: Option<Scratch>,
    /// Per (rows, logit rows, sequences, pick on the device: `pick`, clustered attention: `att_cl`, decode
    /// attention splits: `att_sg`).
    pub(super) graphs: HashMap<(usize, usize, usize, u8, bool, usize), Graph>,
    /// This pass's attention runs in clusters (`CudaOptions::att_cl`): set by `run` when every sequence's context
    /// needs at most that many splits.
    pub(super) att_cl: std::cell::Cell<bool>,
    /// This pass's decode attention launch has room for this many splits (`CudaOptions::att_long`): set by `run`
    /// from its longest context.
    pub(super) att_sg: std::cell::Cell<usize>,
    /// Where this pass's metadata lies (set by `run` before its kernels are enqueued or its graph captured).
    pub(super) meta: std::cell::Cell<Meta>,
    /// Logits of the last forward pass (page-locked: copied straight from the device).
    pub(super) logits: Option<backend::cuda::PinnedF32>,
    pub(super) opts: CudaOptions,
    /// Layers whose products run on 8-bit activations (every matrix Q4_K / Q6_K, `CudaOptions::q8`).
    pub(super) q8_layers: Vec<bool>,
    /// The output matrix runs on 8-bit activations.
    pub(super) q8_out: bool,
    pub(super) blas: Option<Blas>,
    pub(super) segs: Vec<Seg>,
    pub(super) gemm_scratch: Option<GemmScratch>,
    /// A CUDA graph is being captured (programmatic dependent launch inside graphs only where chosen).
    pub(super) capturing: std::cell::Cell<bool>,
    /// The kernels launched now may use programmatic dependent launch inside graphs too (`CudaOptions::graph_pdl_att`).
    pub(super) pdl_scope: std::cell::Cell<bool>,
    /// What the pass ends with: 0 the logits, 1 their argmax per row (`Runner::forward_argmax`), 2 also its
    /// probability (`Runner::forward_top`), 3 each row's largest logits (`Runner::forward_candidates`).
    pub(super) pick: std::cell::Cell<u8>,
    /// Rows whose largest logits the device could not select (`forward_candidates` fell back to the host).
    pub(super) host_selected: std::cell::Cell<usize>,
    /// `SPLASH_CUDA_TIME_STEPS=1`: the device's time per pass, split into the copies of the pass's metadata and the
    /// pass itself (CUDA events; each pass then waits for its end, so for measuring only).
    pub(super) step_timer: Option<StepTimer>,
    /// The pass started ahead by [`Runner::forward_argmax_then`] with `NextStep::FedPicks`, not yet asked for.
    pub(super) ahead: Option<Ahead>,
    /// Where one-row passes leave their pick for the host (`argmax_rows`' ring: page-locked, two u64 slots keyed by
    /// the pass's position), and an event per slot marking the pass's end.
    pub(super) ahead_ring: backend::cuda::Pinned<u32>,
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
        let _ = self.gpu.sync();
    }
}

// SAFETY: every CUDA object here is used only through &mut self, from one thread at a time; the context is bound
// to the calling thread before each use.
unsafe impl Send for CudaRunner {}

/// CUDA events around each pass (`SPLASH_CUDA_TIME_STEPS=1`) and what they measured.
pub(super) struct StepTimer {
    pub(super) start: cudarc::driver::CudaEvent,
    pub(super) copied: cudarc::driver::CudaEvent,
    pub(super) end: cudarc::driver::CudaEvent,
    pub(super) steps: usize,
    pub(super) copies_ms: f64,
    pub(super) pass_ms: f64,
}

pub(super) fn event_err(e: cudarc::driver::DriverError) -> Error {
    Error::Backend(format!("CUDA event: {e:?}"))
}

impl CudaRunner {
    /// Lowers the context a sequence may reach. Never raises it past the model's own.
    pub fn limit_context(&mut self, max_context: usize) {
        self.cfg.max_context = self.cfg.max_context.min(max_context.max(1));
    }

    /// With `SPLASH_CUDA_TIME_STEPS=1`: passes timed since the last call, and the device's mean milliseconds per pass
    /// for the metadata copies and for the pass itself; the counts start again.
    pub fn take_step_times(&mut self) -> Option<(usize, f64, f64)> {
        let t = self.step_timer.as_mut()?;
        let n = t.steps.max(1) as f64;
        let out = (t.steps, t.copies_ms / n, t.pass_ms / n);
        (t.steps, t.copies_ms, t.pass_ms) = (0, 0.0, 0.0);
        Some(out)
    }

    /// Rows of [`Runner::forward_candidates`] selected on the host because the device gave up (more than 2,048
    /// logits tied at a segment's threshold), since the runner started.
    pub fn host_selected_rows(&self) -> usize {
        self.host_selected.get()
    }

    pub fn device_name(&self) -> &str {
        &self.gpu.name
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

    pub(super) fn ensure_scratch(&mut self, m: usize, chunks: usize, r: usize) -> Result<()> {
        if let Some(s) = &self.scratch
            && s.cap_m >= m
            && s.cap_chunks >= chunks
            && s.cap_r >= r
        {
            return Ok(());
        }
        let old = self.scratch.as_ref().map_or((0, 0, 0), |s| (s.cap_m, s.cap_chunks, s.cap_r));
        let (m, chunks, r) = (m.max(old.0).max(8), chunks.max(old.1).max(8), r.max(old.2).max(8));
        self.graphs.clear();
        // A copy from the old page-locked metadata may still be in flight.
        self.gpu.sync()?;
        self.scratch = None;
        let c = &self.cfg;
        let g = &self.gpu;
        let f = 4usize;
        let meta_words = Meta::packed(0, m, r, chunks, self.max_pages).1;
        self.scratch = Some(Scratch {
            cap_m: m,
            cap_chunks: chunks,
            cap_r: r,
            x: g.alloc(m * c.hidden_size * f)?,
            xn: g.alloc(m.max(r) * c.hidden_size * f)?,
            q: g.alloc(m * c.q_dim() * f)?,
            k: g.alloc(m * c.kv_dim() * f)?,
            v: g.alloc(m * c.kv_dim() * f)?,
            att: g.alloc(m * c.q_dim() * f)?,
            gate: g.alloc(m * c.ffn_size * f)?,
            up: g.alloc(m * c.ffn_size * f)?,
            xq: g.alloc(m.max(r) * c.hidden_size.max(c.q_dim()).max(c.ffn_size) * f)?,
            xq8: g.alloc(m.max(r) * c.hidden_size.max(c.q_dim()).max(c.ffn_size))?,
            xds: g.alloc(m.max(r) * c.hidden_size.max(c.q_dim()).max(c.ffn_size) / 32 * 8)?,
            xq8b: g.alloc(m * c.ffn_size)?,
            xdsb: g.alloc(m * c.ffn_size / 32 * 8)?,
            part: g.alloc(
                (1..=m).map(|k| k * att_splits(k, decode_splits(&self.opts, self.cfg.max_context))).max().unwrap_or(1)
                    * c.num_heads
                    * (c.head_dim + 2)
                    * f,
            )?,
            counters: g.upload(&vec![0u32; m * c.num_heads])?,
            logits: g.alloc(r * c.vocab_size * f)?,
            ids: g.alloc(r * 4)?,
            probs: g.alloc(r * 4)?,
            cand: g.alloc(r * TOPK_BLOCKS * (4 + DEVICE_CANDIDATES * 8))?,
            row_part: g.alloc(r * ARGMAX_BLOCKS * 16)?,
            row_counters: g.upload(&vec![0u32; r])?,
            meta: g.alloc(meta_words * 4)?,
            meta_host: g.alloc_pinned(meta_words)?,
            meta_copied: g
                .ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(event_err)?,
        });
        Ok(())
    }

    /// Runs the batch up to its logits and what `pick` asks for, enqueued on the stream without waiting; the
    /// sequences' lengths are advanced. Returns the number of logit rows. `ahead`: a decode pass started ahead
    /// ([`Ahead`]): its token and position are already on the device (written by the pass before), and no length is
    /// advanced.
    pub(super) fn run(&mut self, batch: &Batch<'_>, ahead: bool) -> Result<usize> {
        self.validate(batch)?;
        self.pdl_scope.set(false);
        if !ahead {
            // Whatever was started ahead is not this batch: dropped (it wrote nothing a later pass reads before
            // rewriting it, and the stream runs it before them).
            self.ahead = None;
        }
        self.gpu.bind()?;
        let m = batch.num_tokens();
        let r = batch.num_logit_rows();
        let nchunks = batch.chunks.len();
        if m == 0 {
            return Ok(0);
        }
        self.ensure_scratch(m, nchunks, r)?;
        // Segments: each long chunk alone on tensor cores, runs of short chunks together.
        let gemm_ok = self.blas.is_some() && self.opts.gemm;
        self.segs.clear();
        let mut r0 = 0;
        let mut max_kv = 0;
        for (ci, c) in batch.chunks.iter().enumerate() {
            let n = c.tokens.len();
            if gemm_ok && on_tensor_cores(n, c.start_pos) {
                self.segs.push(Seg { r0, n, gemm: Some(GemmChunk { ci, start_pos: c.start_pos }) });
                max_kv = max_kv.max(c.start_pos + n);
            } else if let Some(last) = self.segs.last_mut().filter(|s| s.gemm.is_none()) {
                last.n += n;
            } else if n > 0 {
                self.segs.push(Seg { r0, n, gemm: None });
            }
            r0 += n;
        }
        if gemm_ok && (max_kv > 0 || r >= GEMM_MIN_ROWS) {
            self.ensure_gemm_scratch(m, r)?;
        }
        // Pages for the new tokens.
        let mut new_pages = false;
        for c in &batch.chunks {
            let end = c.start_pos + c.tokens.len();
            new_pages |= self.table.blocks_needed(c.seq, end) > 0;
            self.table.reserve(c.seq, end).expect("INVARIANT: validate counted the free pages");
        }
        // Per-row metadata, packed into the page-locked buffer (once the previous pass's copy out of it is done) and
        // copied in one piece. A pass started ahead follows one row of the same sequence, whose pick already wrote
        // its token and advanced the position: nothing is copied unless its page table grew, and then not the
        // token.
        let s = self.scratch.as_mut().expect("INVARIANT: ensured above");
        let (meta, words) = Meta::packed(s.meta.ptr, m, r, nchunks, self.max_pages);
        if !ahead || new_pages {
            s.meta_copied.synchronize().map_err(event_err)?;
            let table = &self.table;
            pack_meta(
                batch,
                |ci| table.blocks(batch.chunks[ci].seq),
                self.max_pages,
                &mut s.meta_host.as_mut_slice()[..words],
            );
            if let Some(t) = &self.step_timer {
                t.start.record(&self.gpu.stream).map_err(event_err)?;
            }
            if ahead {
                self.gpu.htod_at(&s.meta, 4, &s.meta_host.as_slice()[1..words])?;
            } else {
                self.gpu.htod(&s.meta, &s.meta_host.as_slice()[..words])?;
            }
            s.meta_copied.record(&self.gpu.stream).map_err(event_err)?;
        }
        self.meta.set(meta);
        if let Some(t) = &self.step_timer {
            t.copied.record(&self.gpu.stream).map_err(event_err)?;
        }
        // Clustered attention while every context fits its splits (the same bits as the global merge there; past
        // that the kernel with more splits runs: another graph).
        let att_cap = self.opts.att_cl * 32 * self.opts.att_warps;
        self.att_cl.set(att_cap > 0 && batch.chunks.iter().all(|c| c.start_pos + c.tokens.len() <= att_cap));
        let longest = batch.chunks.iter().map(|c| c.start_pos + c.tokens.len()).max().unwrap_or(0);
        self.att_sg.set(decode_splits(&self.opts, longest));
        let key = (m, r, nchunks, self.pick.get(), self.att_cl.get(), self.att_sg.get());
        // Graphs hold no cuBLAS call: a pass with a chunk on tensor cores is enqueued as it is.
        if self.opts.graphs && m <= MAX_GRAPH_ROWS && self.segs.iter().all(|s| s.gemm.is_none()) {
            if !self.graphs.contains_key(&key) {
                use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
                self.gpu
                    .stream
                    .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .map_err(|e| Error::Backend(format!("graph capture: {e:?}")))?;
                self.capturing.set(true);
                let res = self.enqueue(m, r);
                self.capturing.set(false);
                let g = self.gpu.stream.end_capture(CUgraphInstantiate_flags(0));
                res?;
                match g {
                    Ok(Some(g)) => {
                        self.graphs.insert(key, Graph(g));
                    }
                    Ok(None) => return Err(Error::Backend("graph capture produced no graph".into())),
                    Err(e) => return Err(Error::Backend(format!("graph capture: {e:?}"))),
                }
            }
            self.graphs[&key].0.launch().map_err(|e| Error::Backend(format!("graph launch: {e:?}")))?;
        } else {
            self.enqueue(m, r)?;
        }
        if let Some(t) = self.step_timer.as_mut() {
            t.end.record(&self.gpu.stream).map_err(event_err)?;
            t.copies_ms += t.start.elapsed_ms(&t.copied).map_err(event_err)? as f64;
            t.pass_ms += t.copied.elapsed_ms(&t.end).map_err(event_err)? as f64;
            t.steps += 1;
        }
        if !ahead {
            // The pages the pass fills: full ones are registered for prefix reuse (any reader runs after this pass
            // in the stream).
            for c in &batch.chunks {
                self.table.commit(c.seq, c.tokens);
            }
        }
        Ok(r)
    }
}

impl Runner for CudaRunner {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<&[f32]> {
        let r = self.run_picking(batch, false, 0)?;
        let vocab = self.cfg.vocab_size;
        if self.logits.as_ref().is_none_or(|l| l.len() < r * vocab) {
            self.logits = None;
            let cap = self.scratch.as_ref().map_or(r, |s| s.cap_r).max(r);
            self.logits = Some(self.gpu.alloc_pinned(cap * vocab)?);
        }
        let s = self.scratch.as_ref().expect("INVARIANT: run ensured it");
        let logits = self.logits.as_mut().expect("INVARIANT: allocated above");
        if r > 0 {
            self.gpu.dtoh_pinned(logits, s.logits.ptr, r * vocab)?;
        } else {
            self.gpu.sync()?;
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
            && let Err(e) = self.copy_page(copy.from, copy.to)
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
