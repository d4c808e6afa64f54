//! [`FusedBackend`]: the [`Backend`] of one model on the GPU, which the CUDA runner drives the shared forward pass
//! (`transformer.rs`) over. Its kernels are the model's own (`kernels`: NVRTC source specialised with its shapes),
//! its matrices the file's quantized blocks in their device layout (`layout`), and it runs whole sub-layers: each
//! sub-layer op launches the fused kernels of the rows' segment kind (`layer`: matrix-vector kernels on 8-bit or
//! f32 activations, QKV + bias + RoPE + KV write in one launch, gate/up + SwiGLU + quantization in one, RMSNorm in
//! the next input's quantization, the residual add in the last product; `prefill`: tensor-core GEMMs for long
//! chunks), and the output head ends the pass with the pick the runner asked for (`pick`).
//!
//! A pass is planned by the runner first ([`FusedBackend::prepare_pass`]: the batch's metadata copied to fixed
//! device buffers, its segments, its graph key); then between [`Backend::begin_forward`] and
//! [`Backend::finish_forward`] a pass of at most [`MAX_GRAPH_ROWS`] matrix-vector rows is recorded into a CUDA graph
//! the first time its shape is seen and replayed after that (the ops then launch nothing: the graph holds them).
//! Every allocation drops the graphs (their addresses moved), which the forward pass makes before `begin_forward`.
//!
//! The primitive ops other than the embedding are not run here (a fused backend has no kernel for one piece of a
//! sub-layer): they answer [`backend::Error::Unsupported`]; `backend::cuda::CudaBackend` runs each of them and is
//! the per-op oracle.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;

use backend::cpu::QMatrix;
use backend::cuda::{Blas, DevBuf, Gpu};
use backend::{
    AttentionSpec, AttentionWeights, AttnRows, AttnShape, Backend, ExpertsSpec, FfnWeights, KvLayout, KvType,
    MatrixUse, Norm, RopeSpec, Workspace,
};
use cudarc::driver::{CudaGraph, CudaModule};
use gguf::GgmlType;

use super::kernels::{Kernel as K, KernelTable};
use super::layer::{Args, SegRows};
use super::layout::device_layout;
use super::meta::{GemmChunk, Meta, Seg, pack_meta};
use super::moe::{MoeGemmScratch, MoeScratch};
use super::prefill::GemmScratch;
use super::tactics::{att_splits, decode_splits, on_tensor_cores};
use super::{ARGMAX_BLOCKS, CudaOptions, DEVICE_CANDIDATES, GEMM_MIN_ROWS, MAX_GRAPH_ROWS, PAGE_SIZE, TOPK_BLOCKS};
use crate::{Batch, Error, ModelConfig, Result};

/// `[rows, cols]` f32 activations on the device (`rows` of capacity).
pub struct DevTensor {
    pub(super) buf: DevBuf,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

/// A weight matrix in its device layout (`layout::device_layout`).
pub struct GMat {
    pub(super) ty: GgmlType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Shared by a tied embedding and output head.
    pub(super) buf: Arc<DevBuf>,
    /// Multiplied on 8-bit activations (`CudaOptions::q8`: every matrix of its layer, or the output head, has such
    /// kernels).
    pub(super) q8: bool,
}

/// The paged KV cache: per layer one buffer of K and one of V, page `b` at `b * page_bytes` (`PAGE_SIZE` rows of
/// `kv_dim` f16 values each).
pub struct KvPool {
    pub(super) layout: KvLayout,
    pub(super) kc: Vec<DevBuf>,
    pub(super) vc: Vec<DevBuf>,
    pub(super) pages: usize,
}

impl KvPool {
    /// Bytes of one page of one layer's K (or V).
    pub(super) fn page_bytes(&self) -> usize {
        PAGE_SIZE * self.layout.kv_dim * 2
    }
}

/// The fused kernels' scratch beyond the forward pass's tensors, sized for `cap_m` rows, `cap_chunks` sequences
/// and `cap_r` logit rows.
pub(super) struct Scratch {
    /// Capacity: rows, sequences (page tables), logit rows.
    pub(super) cap_m: usize,
    pub(super) cap_chunks: usize,
    pub(super) cap_r: usize,
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

/// What a pass ends with besides its logits, picked on the device by the output head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Pick {
    /// The logits only.
    None,
    /// Each row's argmax (`Runner::forward_argmax`).
    Argmax,
    /// ... and its probability (`Runner::forward_top`).
    Top,
    /// Each row's largest logits (`Runner::forward_candidates`).
    Candidates,
}

/// What a pass's launches depend on beyond the fixed buffers: (rows, logit rows, sequences, pick, clustered
/// attention: `att_cl`, decode attention splits: `att_sg`). One CUDA graph per key.
type GraphKey = (usize, usize, usize, Pick, bool, usize);

struct Graph(CudaGraph);
// SAFETY: the graph is only launched from the thread that owns the backend; CUDA handles may move between threads.
unsafe impl Send for Graph {}

/// How the ops of the pass between `begin_forward` and `finish_forward` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Enqueued on the stream as they come.
    Eager,
    /// Recorded into the graph of the pass's key.
    Capture,
    /// Not launched: the graph of the pass's key holds them.
    Replay,
}

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

pub struct FusedBackend {
    /// The model's shapes: the constants its kernels were written with.
    pub(super) cfg: ModelConfig,
    pub(super) gpu: Gpu,
    /// The compiled library and its launch table (`kernels`).
    _module: Arc<CudaModule>,
    pub(super) kernels: KernelTable,
    /// The switches, as the loader settled them for the model.
    pub(super) opts: CudaOptions,
    /// `[rope_dim / 2]` RoPE inverse frequencies.
    pub(super) inv_freq: DevBuf,
    /// Page-table entries per sequence in a pass's metadata (the model's context in pages).
    pub(super) max_pages: usize,
    pub(super) blas: Option<Blas>,
    /// Host matrices (by the address of their bytes) whose products run on 8-bit activations, and the device copies
    /// made so far by the same address (a tied output head is the embedding's copy).
    q8_mats: std::collections::HashSet<usize>,
    uploads: HashMap<usize, Arc<DevBuf>>,
    pub(super) weight_bytes: usize,
    /// Values of the largest matrix (the tensor-core path dequantizes one at a time into scratch).
    pub(super) max_matrix: usize,
    pub(super) scratch: Option<Scratch>,
    pub(super) gemm_scratch: Option<GemmScratch>,
    /// The largest numbers of the model's expert-routed layers (None: a dense model), and their scratch on the
    /// matrix-vector and the tensor-core paths (`moe`).
    pub(super) moe: Option<ExpertsSpec>,
    pub(super) moe_scratch: Option<MoeScratch>,
    pub(super) moe_gemm: Option<MoeGemmScratch>,
    /// This pass's segments: runs of rows that go through each layer together.
    segs: Vec<Seg>,
    /// Where this pass's metadata lies (set by `prepare_pass`).
    pub(super) meta: Meta,
    /// What this pass ends with.
    pub(super) pick: Pick,
    /// This pass's attention runs in clusters (`CudaOptions::att_cl`): every sequence's context needs at most that
    /// many splits.
    pub(super) att_cl: bool,
    /// This pass's decode attention launch has room for this many splits (`CudaOptions::att_long`), from its
    /// longest context.
    pub(super) att_sg: usize,
    /// This pass's graph key, when it runs as a graph.
    key: Option<GraphKey>,
    graphs: HashMap<GraphKey, Graph>,
    mode: Mode,
    /// A CUDA graph is being captured (programmatic dependent launch inside graphs only where chosen).
    pub(super) capturing: Cell<bool>,
    /// The kernels launched now may use programmatic dependent launch inside graphs too (`CudaOptions::graph_pdl_att`).
    pub(super) pdl_scope: Cell<bool>,
    /// Where one-row passes leave their pick for the host (`argmax_rows`' ring: page-locked, two u64 slots keyed by
    /// the pass's position).
    pub(super) ahead_ring: backend::cuda::Pinned<u32>,
    /// `SPLASH_CUDA_TIME_STEPS=1`: the device's time per pass, split into the copies of the pass's metadata and the
    /// pass itself (CUDA events; each pass then waits for its end, so for measuring only).
    pub(super) step_timer: Option<StepTimer>,
}

// SAFETY: every CUDA object here is used only through &mut self, from one thread at a time; the context is bound
// to the calling thread before each use.
unsafe impl Send for FusedBackend {}

fn unsupported(op: &'static str) -> backend::Error {
    backend::Error::Unsupported {
        backend: "cuda (fused)",
        op,
        reason: "this backend runs whole sub-layers (backend::cuda::CudaBackend runs each op alone)".into(),
    }
}

fn dev(op: &'static str) -> impl Fn(Error) -> backend::Error {
    move |e| backend::Error::Device { op, message: e.to_string() }
}

impl FusedBackend {
    /// [`Backend::kv_block_from_host`] for several pages at once, in one batch of copies (`Gpu::htod_many`).
    pub(super) fn kv_blocks_from_host(&mut self, kv: &mut KvPool, pages: &[(u32, &[u16])]) -> backend::Result<()> {
        let n = kv.page_bytes() / 2;
        let mut copies = Vec::with_capacity(pages.len() * 2 * kv.kc.len());
        for &(block, data) in pages {
            if data.len() != 2 * n * kv.kc.len() {
                let message = format!("a page of {} values, not {}", data.len(), 2 * n * kv.kc.len());
                return Err(backend::Error::Device { op: "kv_blocks_from_host", message });
            }
            let at = block as u64 * kv.page_bytes() as u64;
            for (li, (k, v)) in kv.kc.iter().zip(&kv.vc).enumerate() {
                copies.push((k.ptr + at, &data[2 * li * n..(2 * li + 1) * n]));
                copies.push((v.ptr + at, &data[(2 * li + 1) * n..(2 * li + 2) * n]));
            }
        }
        self.gpu.htod_many(&copies).map_err(|e| dev("kv_blocks_from_host")(e.into()))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        cfg: ModelConfig,
        gpu: Gpu,
        module: Arc<CudaModule>,
        kernels: KernelTable,
        opts: CudaOptions,
        blas: Option<Blas>,
        q8_mats: std::collections::HashSet<usize>,
        step_timer: Option<StepTimer>,
        moe: Option<ExpertsSpec>,
    ) -> Result<Self> {
        // RoPE inverse frequencies computed exactly as the CPU's `Rope` does: a running product of theta^(-2/d) in f32.
        let half = cfg.rope_dim / 2;
        let step = cfg.rope_theta.powf(-2.0 / cfg.rope_dim as f32);
        let inv_freq: Vec<f32> = std::iter::successors(Some(1.0f32), |f| Some(f * step)).take(half.max(1)).collect();
        let inv_freq = gpu.upload(&inv_freq)?;
        let ahead_ring = gpu.alloc_pinned::<u32>(4)?;
        Ok(FusedBackend {
            max_pages: cfg.max_context.div_ceil(PAGE_SIZE),
            cfg,
            gpu,
            _module: module,
            kernels,
            opts,
            inv_freq,
            blas,
            q8_mats,
            uploads: HashMap::new(),
            weight_bytes: 0,
            max_matrix: 0,
            scratch: None,
            gemm_scratch: None,
            moe,
            moe_scratch: None,
            moe_gemm: None,
            segs: Vec::new(),
            meta: Meta::default(),
            pick: Pick::None,
            att_cl: false,
            att_sg: 0,
            key: None,
            graphs: HashMap::new(),
            mode: Mode::Eager,
            capturing: Cell::new(false),
            pdl_scope: Cell::new(false),
            ahead_ring,
            step_timer,
        })
    }

    pub(super) fn scratch(&self) -> &Scratch {
        self.scratch.as_ref().expect("INVARIANT: prepare_pass ensured the scratch")
    }

    /// Drops the graphs (buffers they name are about to move), once nothing in flight reads those buffers.
    fn invalidate(&mut self) -> Result<()> {
        self.graphs.clear();
        self.gpu.sync()?;
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
        // A copy from the old page-locked metadata may still be in flight.
        self.invalidate()?;
        self.scratch = None;
        self.moe_scratch = None;
        if let Some(spec) = &self.moe {
            self.moe_scratch = Some(MoeScratch::new(&self.gpu, &self.cfg, spec, m)?);
        }
        let c = &self.cfg;
        let g = &self.gpu;
        let f = 4usize;
        let meta_words = Meta::packed(0, m, r, chunks, self.max_pages).1;
        let widest = c.hidden_size.max(c.q_dim()).max(c.ffn_size);
        self.scratch = Some(Scratch {
            cap_m: m,
            cap_chunks: chunks,
            cap_r: r,
            xq: g.alloc(m.max(r) * widest * f)?,
            xq8: g.alloc(m.max(r) * widest)?,
            xds: g.alloc(m.max(r) * widest / 32 * 8)?,
            xq8b: g.alloc(m * c.ffn_size)?,
            xdsb: g.alloc(m * c.ffn_size / 32 * 8)?,
            part: g.alloc(
                (1..=m).map(|k| k * att_splits(k, decode_splits(&self.opts, c.max_context))).max().unwrap_or(1)
                    * c.num_heads
                    * (c.head_dim + 2)
                    * f,
            )?,
            counters: g.upload(&vec![0u32; m * c.num_heads])?,
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

    /// Plans the pass of `batch` (whose pages `pages(chunk)` already hold its rows): scratch for its shape, its
    /// segments (each long chunk alone on tensor cores, runs of short chunks together), its metadata packed and
    /// copied to the device, the attention's splits, and whether it runs as a graph. `ahead`: a decode pass started
    /// ahead, whose token and position the pass before wrote on the device (nothing is copied unless its page table
    /// grew, `new_pages`, and then not the token).
    pub(super) fn prepare_pass<'p>(
        &mut self,
        batch: &Batch<'_>,
        pages: impl Fn(usize) -> &'p [u32],
        ahead: bool,
        new_pages: bool,
        pick: Pick,
    ) -> Result<()> {
        self.gpu.bind()?;
        self.pdl_scope.set(false);
        self.pick = pick;
        let (m, r, nchunks) = (batch.num_tokens(), batch.num_logit_rows(), batch.chunks.len());
        self.ensure_scratch(m, nchunks, r)?;
        let gemm_ok = self.blas.is_some() && self.opts.gemm;
        self.segs.clear();
        let (mut r0, mut max_kv) = (0, 0);
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
        // Per-row metadata, packed into the page-locked buffer (once the previous pass's copy out of it is done) and
        // copied in one piece.
        let s = self.scratch.as_mut().expect("INVARIANT: ensured above");
        let (meta, words) = Meta::packed(s.meta.ptr, m, r, nchunks, self.max_pages);
        if !ahead || new_pages {
            s.meta_copied.synchronize().map_err(event_err)?;
            pack_meta(batch, pages, self.max_pages, &mut s.meta_host.as_mut_slice()[..words]);
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
        self.meta = meta;
        if let Some(t) = &self.step_timer {
            t.copied.record(&self.gpu.stream).map_err(event_err)?;
        }
        // Clustered attention while every context fits its splits (the same bits as the global merge there; past
        // that the kernel with more splits runs: another graph).
        let att_cap = self.opts.att_cl * 32 * self.opts.att_warps;
        self.att_cl = att_cap > 0 && batch.chunks.iter().all(|c| c.start_pos + c.tokens.len() <= att_cap);
        let longest = batch.chunks.iter().map(|c| c.start_pos + c.tokens.len()).max().unwrap_or(0);
        self.att_sg = decode_splits(&self.opts, longest);
        // Graphs hold no cuBLAS call: a pass with a chunk on tensor cores is enqueued as it is.
        let graph = self.opts.graphs && m <= MAX_GRAPH_ROWS && self.segs.iter().all(|s| s.gemm.is_none());
        self.key = graph.then_some((m, r, nchunks, pick, self.att_cl, self.att_sg));
        Ok(())
    }

    /// Ends a pass that failed between `begin_forward` and `finish_forward` (a capture left open would take every
    /// later launch).
    pub(super) fn abort_pass(&mut self) {
        if self.mode == Mode::Capture {
            let _ = self.gpu.stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
            self.capturing.set(false);
        }
        self.mode = Mode::Eager;
    }

    /// The ops of this pass launch nothing (its graph holds them).
    fn replaying(&self) -> bool {
        self.mode == Mode::Replay
    }

    /// Device addresses of the rows of segment `seg` in the pass's tensors and metadata.
    fn seg_rows(&self, seg: &Seg, x: &DevTensor, ws: &Workspace<Self>) -> SegRows {
        let c = &self.cfg;
        let (r0, f) = (seg.r0, 4u64);
        let row = |t: &DevTensor, width: usize| t.buf.ptr + (r0 * width) as u64 * f;
        let meta = self.meta;
        SegRows {
            r0,
            m: seg.n,
            x: row(x, c.hidden_size),
            xn: row(&ws.xn, c.hidden_size),
            q: row(&ws.q, c.q_dim()),
            k: row(&ws.k, c.kv_dim()),
            v: row(&ws.v, c.kv_dim()),
            att: row(&ws.att, c.q_dim()),
            gate: row(&ws.gate, c.ffn_size),
            up: row(&ws.up, c.ffn_size),
            pos: meta.pos + 4 * r0 as u64,
            slot: meta.slot + 4 * r0 as u64,
            table: meta.table,
        }
    }
}

impl Backend for FusedBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    /// Activations in device memory, the forward pass's own (this backend's scratch is beside them).
    type Tensor = DevTensor;
    /// The file's quantized blocks in the device layout the model's kernels read.
    type Matrix = GMat;
    type Vector = DevBuf;
    /// f16 pages of `PAGE_SIZE` positions, one buffer per layer for K and one for V.
    type KvPages = KvPool;

    fn alloc(&mut self, rows: usize, cols: usize) -> backend::Result<DevTensor> {
        self.invalidate().map_err(dev("alloc"))?;
        let buf = self.gpu.alloc(rows * cols * 4).map_err(|e| dev("alloc")(e.into()))?;
        Ok(DevTensor { buf, rows, cols })
    }

    fn write(&mut self, t: &mut DevTensor, data: &[f32]) -> backend::Result<()> {
        if data.len() > t.rows * t.cols {
            return Err(backend::Error::Shape {
                op: "write",
                reason: format!("{} values into {}", data.len(), t.rows),
            });
        }
        self.gpu.htod(&t.buf, data).map_err(|e| dev("write")(e.into()))
    }

    fn read(&mut self, t: &DevTensor, rows: usize) -> backend::Result<Vec<f32>> {
        if self.mode != Mode::Eager {
            return Err(unsupported("read inside a recorded pass"));
        }
        let mut out = vec![0f32; rows.min(t.rows) * t.cols];
        self.gpu.dtoh(&mut out, t.buf.ptr).map_err(|e| dev("read")(e.into()))?;
        Ok(out)
    }

    fn load_matrix(&mut self, m: &QMatrix, usage: MatrixUse) -> backend::Result<GMat> {
        let host = m.bytes.as_slice();
        let addr = host.as_ptr() as usize;
        // The experts' matrices are dequantized into scratch of their own (`moe::MoeGemmScratch`).
        if usage != MatrixUse::Experts {
            self.max_matrix = self.max_matrix.max(m.rows * m.cols);
        }
        let buf = match self.uploads.get(&addr).cloned() {
            Some(b) => b,
            None => {
                self.weight_bytes += host.len();
                let bytes = device_layout(m.ty, m.cols, host, self.opts.repack);
                let b = Arc::new(self.gpu.upload(&bytes).map_err(|e| dev("load_matrix")(e.into()))?);
                self.uploads.insert(addr, b.clone());
                b
            }
        };
        Ok(GMat { ty: m.ty, rows: m.rows, cols: m.cols, buf, q8: self.q8_mats.contains(&addr) })
    }

    fn load_vector(&mut self, v: &[f32]) -> backend::Result<DevBuf> {
        self.gpu.upload(v).map_err(|e| dev("load_vector")(e.into()))
    }

    fn kv_pages(&mut self, layout: KvLayout) -> backend::Result<KvPool> {
        let c = &self.cfg;
        if layout.kv_type != KvType::F16
            || layout.block_tokens != PAGE_SIZE
            || layout.kv_dim != c.kv_dim()
            || layout.num_layers != c.num_layers
        {
            return Err(backend::Error::Unsupported {
                backend: self.name(),
                op: "kv_pages",
                reason: format!("the model's kernels keep f16 pages of {PAGE_SIZE} tokens, not {layout:?}"),
            });
        }
        Ok(KvPool { layout, kc: Vec::new(), vc: Vec::new(), pages: 0 })
    }

    fn kv_grow(&mut self, kv: &mut KvPool, num_blocks: usize) -> backend::Result<()> {
        if num_blocks <= kv.pages {
            return Ok(());
        }
        let op = "kv_grow";
        self.invalidate().map_err(dev(op))?;
        let (old, new, layers) = (kv.pages * kv.page_bytes(), num_blocks * kv.page_bytes(), kv.layout.num_layers);
        let grow = |gpu: &Gpu, bufs: &mut Vec<DevBuf>| -> Result<()> {
            for l in 0..layers {
                let b = gpu.alloc(new)?;
                gpu.memset_zero(b.ptr, new)?;
                if let Some(o) = bufs.get(l) {
                    gpu.dtod(b.ptr, o.ptr, old)?;
                }
                if l < bufs.len() {
                    bufs[l] = b;
                } else {
                    bufs.push(b);
                }
            }
            gpu.sync()?;
            Ok(())
        };
        grow(&self.gpu, &mut kv.kc).map_err(dev(op))?;
        grow(&self.gpu, &mut kv.vc).map_err(dev(op))?;
        kv.pages = num_blocks;
        Ok(())
    }

    /// Copies page `from` to page `to` in every layer (stream-ordered).
    fn kv_copy_block(&mut self, kv: &mut KvPool, from: u32, to: u32) -> backend::Result<()> {
        let pb = kv.page_bytes();
        let (f, t) = (from as u64 * pb as u64, to as u64 * pb as u64);
        for (k, v) in kv.kc.iter().zip(&kv.vc) {
            self.gpu.dtod(k.ptr + t, k.ptr + f, pb).map_err(|e| dev("kv_copy_block")(e.into()))?;
            self.gpu.dtod(v.ptr + t, v.ptr + f, pb).map_err(|e| dev("kv_copy_block")(e.into()))?;
        }
        Ok(())
    }

    /// Page `block` of every layer into `out` (`[layer][k | v][PAGE_SIZE][kv_dim]`), after the passes before it.
    fn kv_block_to_host(&mut self, kv: &KvPool, block: u32, out: &mut [u16]) -> backend::Result<()> {
        let (at, n) = (block as u64 * kv.page_bytes() as u64, kv.page_bytes() / 2);
        for (li, (k, v)) in kv.kc.iter().zip(&kv.vc).enumerate() {
            let e = |e: backend::cuda::CudaError| dev("kv_block_to_host")(e.into());
            self.gpu.dtoh(&mut out[2 * li * n..(2 * li + 1) * n], k.ptr + at).map_err(e)?;
            self.gpu.dtoh(&mut out[(2 * li + 1) * n..(2 * li + 2) * n], v.ptr + at).map_err(e)?;
        }
        Ok(())
    }

    /// `data` (as [`Backend::kv_block_to_host`] writes it) into page `block` of every layer (asynchronous: `data`
    /// must stay as it is until the stream has copied it when it is page-locked).
    fn kv_block_from_host(&mut self, kv: &mut KvPool, block: u32, data: &[u16]) -> backend::Result<()> {
        self.kv_blocks_from_host(kv, &[(block, data)])
    }

    /// The pass's tokens are its metadata's (on the device already: decode ahead writes them there), one launch per
    /// segment.
    fn embedding(&mut self, table: &GMat, tokens: &[u32], out: &mut DevTensor) -> backend::Result<()> {
        if self.replaying() {
            return Ok(());
        }
        let h = self.cfg.hidden_size;
        for seg in &self.segs {
            let (tok, x) = (self.meta.tokens + 4 * seg.r0 as u64, out.buf.ptr + (seg.r0 * h * 4) as u64);
            let kernel = K::Embed { ty: table.ty, k: h };
            self.launch(kernel, (seg.n as u32, 1, 1), 128, Args(vec![table.buf.ptr, tok, x]))
                .map_err(dev("embedding"))?;
        }
        let _ = tokens;
        Ok(())
    }

    fn gather_rows(&mut self, _: &DevTensor, _: &[usize], _: &mut DevTensor) -> backend::Result<()> {
        Err(unsupported("gather_rows"))
    }

    fn rms_norm(&mut self, _: &DevTensor, _: usize, _: &Norm<DevBuf>, _: &mut DevTensor) -> backend::Result<()> {
        Err(unsupported("rms_norm"))
    }

    fn rms_norm_in_place(&mut self, _: &mut DevTensor, _: usize, _: &Norm<DevBuf>) -> backend::Result<()> {
        Err(unsupported("rms_norm_in_place"))
    }

    fn linear(
        &mut self,
        _: &DevTensor,
        _: usize,
        _: &[&GMat],
        _: &[Option<&DevBuf>],
        _: &mut [&mut DevTensor],
    ) -> backend::Result<()> {
        Err(unsupported("linear"))
    }

    fn rope(&mut self, _: &mut DevTensor, _: &[usize], _: &RopeSpec) -> backend::Result<()> {
        Err(unsupported("rope"))
    }

    fn paged_attention(
        &mut self,
        _: &mut KvPool,
        _: usize,
        _: AttnShape,
        _: &DevTensor,
        _: &DevTensor,
        _: &DevTensor,
        _: &AttnRows<'_>,
        _: &mut DevTensor,
    ) -> backend::Result<()> {
        Err(unsupported("paged_attention"))
    }

    fn swiglu(&mut self, _: &mut DevTensor, _: &DevTensor, _: usize) -> backend::Result<()> {
        Err(unsupported("swiglu"))
    }

    fn add(&mut self, _: &mut DevTensor, _: &DevTensor, _: usize) -> backend::Result<()> {
        Err(unsupported("add"))
    }

    /// Each segment's rows: the fused matrix-vector launches (`layer`) or tensor-core GEMMs (`prefill`).
    fn attention_sublayer(
        &mut self,
        x: &mut DevTensor,
        w: &AttentionWeights<Self>,
        _spec: &AttentionSpec,
        kv: &mut KvPool,
        layer: usize,
        rows: &AttnRows<'_>,
        ws: &mut Workspace<Self>,
    ) -> backend::Result<()> {
        if self.replaying() {
            return Ok(());
        }
        debug_assert_eq!(rows.num_rows(), self.segs.iter().map(|s| s.n).sum::<usize>());
        for seg in &self.segs {
            let sr = self.seg_rows(seg, x, ws);
            let res = match seg.gemm {
                Some(gc) => self.gemm_attention_rows(layer, w, kv, gc, &sr),
                None => self.attention_rows(layer, w, kv, &sr),
            };
            res.map_err(dev("attention_sublayer"))?;
        }
        Ok(())
    }

    fn ffn_sublayer(
        &mut self,
        x: &mut DevTensor,
        _rows: usize,
        w: &FfnWeights<Self>,
        ws: &mut Workspace<Self>,
    ) -> backend::Result<()> {
        if self.replaying() {
            return Ok(());
        }
        for seg in &self.segs {
            let sr = self.seg_rows(seg, x, ws);
            let res = match (w, seg.gemm) {
                (FfnWeights::SwiGlu { norm, gate, up, down }, Some(_)) => {
                    self.gemm_ffn_rows(norm, [gate, up, down], &sr)
                }
                (FfnWeights::SwiGlu { norm, gate, up, down }, None) => self.ffn_rows(norm, [gate, up, down], &sr),
                (FfnWeights::Experts { norm, experts }, Some(_)) => self.gemm_experts_rows(norm, experts, &sr),
                (FfnWeights::Experts { norm, experts }, None) => self.experts_rows(norm, experts, &sr),
            };
            res.map_err(dev("ffn_sublayer"))?;
        }
        Ok(())
    }

    /// The head over the pass's logit rows (its metadata's), then the pass's pick (`layer::head`).
    fn output_head(
        &mut self,
        x: &DevTensor,
        rows: &[usize],
        norm: &Norm<DevBuf>,
        head: &GMat,
        logits: &mut DevTensor,
        ws: &mut Workspace<Self>,
    ) -> backend::Result<()> {
        if self.replaying() {
            return Ok(());
        }
        let m = self.segs.iter().map(|s| s.n).sum();
        self.head(m, rows.len(), x.buf.ptr, ws.xn.buf.ptr, norm, head, logits.buf.ptr).map_err(dev("output_head"))
    }

    fn begin_forward(&mut self, _rows_per_seq: &[usize]) -> backend::Result<()> {
        use cudarc::driver::sys::CUstreamCaptureMode;
        self.mode = match self.key {
            Some(k) if self.graphs.contains_key(&k) => Mode::Replay,
            Some(_) => {
                self.gpu.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(
                    |e| backend::Error::Device { op: "begin_forward", message: format!("graph capture: {e:?}") },
                )?;
                self.capturing.set(true);
                Mode::Capture
            }
            None => Mode::Eager,
        };
        Ok(())
    }

    fn finish_forward(&mut self) -> backend::Result<()> {
        let op = "finish_forward";
        let err = |m: String| backend::Error::Device { op, message: m };
        let mode = std::mem::replace(&mut self.mode, Mode::Eager);
        if mode == Mode::Capture {
            self.capturing.set(false);
            let g = self.gpu.stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
            match g {
                Ok(Some(g)) => {
                    self.graphs.insert(self.key.expect("INVARIANT: a capture has a key"), Graph(g));
                }
                Ok(None) => return Err(err("graph capture produced no graph".into())),
                Err(e) => return Err(err(format!("graph capture: {e:?}"))),
            }
        }
        if mode != Mode::Eager {
            let key = self.key.expect("INVARIANT: a graph pass has a key");
            self.graphs[&key].0.launch().map_err(|e| err(format!("graph launch: {e:?}")))?;
        }
        if let Some(t) = self.step_timer.as_mut() {
            let e = |e| err(format!("{:?}", event_err(e)));
            t.end.record(&self.gpu.stream).map_err(e)?;
            t.copies_ms += t.start.elapsed_ms(&t.copied).map_err(e)? as f64;
            t.pass_ms += t.copied.elapsed_ms(&t.end).map_err(e)? as f64;
            t.steps += 1;
        }
        Ok(())
    }
}
