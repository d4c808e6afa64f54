//! [`CudaBackend`]: the [`Backend`] trait on one GPU, every op a kernel of `ops.cu` (the expert-routed FFN:
//! `experts.cu`, driven from `backend/experts.rs`) on the GPU's stream.
//!
//! Its kernels take every shape at run time, so one small module (compiled once per machine, cached like the
//! runner's) serves any model and the per-op tests' shapes; matrices are dequantized to f32 at load and multiplied
//! on f32 activations (exact to f32 rounding, within the quantized products' promise). The sub-layer ops are the
//! trait's compositions of these primitives: this is the GPU half of the per-op tests and a second oracle, not the
//! runner's fast path (`models::cuda`'s fused backend, whose per-model kernels fuse the sub-layers).
//!
//! Ops enqueue and return; [`Backend::read`] waits. The small per-op tables (tokens, rows, slots, page tables) go
//! through one device buffer, rewritten by a copy ordered on the stream after the kernels that read it before.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};

use super::{CudaError, DevBuf, Gpu};
use crate::cpu::QMatrix;
use crate::{
    AttnRows, AttnShape, Backend, Error, KvLayout, KvType, MatrixUse, Norm, NormKind, Result, RopeSpec, RopeStyle,
};

mod experts;

/// The kernels of this backend (the experts' after the rest).
fn ops_source() -> String {
    [include_str!("prelude.cu"), include_str!("ops.cu"), experts::SOURCE].concat()
}

/// `[rows, cols]` f32 values on the device (`rows` of capacity).
pub struct CudaTensor {
    buf: DevBuf,
    rows: usize,
    cols: usize,
}

/// A weight matrix, dequantized: `[rows, cols]` f32 on the device.
pub struct CudaMatrix {
    buf: DevBuf,
    rows: usize,
    cols: usize,
}

pub struct CudaVector {
    buf: DevBuf,
    len: usize,
}

/// KV blocks (the [`KvLayout`] form, f16 or f32 values) in one device buffer: block `b` at `b * block_bytes`.
pub struct CudaKvPages {
    layout: KvLayout,
    buf: Option<DevBuf>,
    /// Blocks that exist, and blocks the buffer has room for.
    blocks: usize,
    capacity: usize,
}

impl CudaKvPages {
    fn block_bytes(&self) -> usize {
        self.layout.block_bytes()
    }

    /// 1 for an f32 cache (the kernels' `kv_f32`).
    fn f32_flag(&self) -> u64 {
        int(usize::from(self.layout.kv_type == KvType::F32))
    }

    fn base(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| b.ptr)
    }

    /// `block` exists and `len` is a block's host form in u16 words.
    fn check_block(&self, op: &'static str, block: u32, len: usize) -> Result<()> {
        if block as usize >= self.blocks || len != self.layout.block_words() {
            return Err(shape_err(
                op,
                format!("block {block} ({len} words) of {} blocks of {:?}", self.blocks, self.layout),
            ));
        }
        Ok(())
    }
}

struct Kernels {
    gather: CudaFunction,
    add: CudaFunction,
    swiglu: CudaFunction,
    rms_norm: CudaFunction,
    matvec: CudaFunction,
    rope: CudaFunction,
    kv_write: CudaFunction,
    attention: CudaFunction,
}

pub struct CudaBackend {
    gpu: Gpu,
    _module: Arc<CudaModule>,
    k: Kernels,
    moe_k: experts::ExpertKernels,
    /// The experts' scratch (routing, groups, hidden rows), grown when a call needs more.
    moe: Option<DevBuf>,
    /// The per-op tables (u32 words), and the attention's scores.
    meta: DevBuf,
    scores: DevBuf,
}

// SAFETY: used through &mut self from one thread at a time; the context is bound to the calling thread on use.
unsafe impl Send for CudaBackend {}

fn shape_err(op: &'static str, reason: String) -> Error {
    Error::Shape { op, reason }
}

fn dev(op: &'static str) -> impl Fn(CudaError) -> Error {
    move |e| Error::Device { op, message: e.to_string() }
}

/// A kernel argument in 8 bytes (ints and floats in the low half, little-endian), passed by address.
fn int(v: usize) -> u64 {
    v as u32 as u64
}

fn float(v: f32) -> u64 {
    v.to_bits() as u64
}

/// `rows` rows fit `t`'s capacity.
fn fits(op: &'static str, t: &CudaTensor, rows: usize) -> Result<()> {
    if rows > t.rows {
        return Err(shape_err(op, format!("{rows} rows of {} exceed the tensor's {}", t.cols, t.rows)));
    }
    Ok(())
}

fn blocks_of(n: usize, threads: usize) -> u32 {
    n.div_ceil(threads) as u32
}

impl CudaBackend {
    /// The backend on GPU `ordinal`, its kernels compiled with NVRTC (or read from `cache_dir`).
    pub fn new(ordinal: usize, cache_dir: Option<std::path::PathBuf>) -> Result<Self> {
        let op = "new";
        let gpu = Gpu::new(ordinal).map_err(dev(op))?;
        let (module, _, _) = gpu.compile(&ops_source(), cache_dir).map_err(dev(op))?;
        let f = |name: &str| {
            module.load_function(name).map_err(|e| Error::Device { op, message: format!("kernel {name}: {e:?}") })
        };
        let k = Kernels {
            gather: f("gather")?,
            add: f("add")?,
            swiglu: f("swiglu")?,
            rms_norm: f("rms_norm")?,
            matvec: f("matvec")?,
            rope: f("rope")?,
            kv_write: f("kv_write")?,
            attention: f("attention")?,
        };
        let moe_k = experts::ExpertKernels::load(&f)?;
        let meta = gpu.alloc(4096).map_err(dev(op))?;
        let scores = gpu.alloc(4096).map_err(dev(op))?;
        Ok(CudaBackend { gpu, _module: module, k, moe_k, moe: None, meta, scores })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn launch(
        &self,
        op: &'static str,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        mut args: Vec<u64>,
    ) -> Result<()> {
        let mut p: Vec<*mut c_void> = args.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
        self.gpu.launch(f, grid, block, &mut p).map_err(dev(op))
    }

    /// `words` in the metadata buffer (grown when short, once the kernels reading it are done); its address.
    fn meta(&mut self, op: &'static str, words: &[u32]) -> Result<u64> {
        let bytes = std::mem::size_of_val(words);
        if bytes > self.meta.bytes {
            self.gpu.sync().map_err(dev(op))?;
            self.meta = self.gpu.alloc(bytes.next_power_of_two()).map_err(dev(op))?;
        }
        self.gpu.htod(&self.meta, words).map_err(dev(op))?;
        Ok(self.meta.ptr)
    }

    /// The scores scratch, at least `bytes` long.
    fn scores(&mut self, op: &'static str, bytes: usize) -> Result<u64> {
        if bytes > self.scores.bytes {
            self.gpu.sync().map_err(dev(op))?;
            self.scores = self.gpu.alloc(bytes.next_power_of_two()).map_err(dev(op))?;
        }
        Ok(self.scores.ptr)
    }

    /// `out[i] = src[idx[i]]`, rows of `cols`.
    fn gather(&mut self, op: &'static str, src: u64, idx: &[u32], out: u64, cols: usize) -> Result<()> {
        if idx.is_empty() {
            return Ok(());
        }
        let idx_ptr = self.meta(op, idx)?;
        self.launch(op, &self.k.gather, (idx.len() as u32, 1, 1), 256, vec![src, idx_ptr, out, int(cols)])
    }

    fn norm(
        &self,
        op: &'static str,
        x: u64,
        rows: usize,
        cols: usize,
        norm: &Norm<CudaVector>,
        out: u64,
    ) -> Result<()> {
        if norm.dim == 0 || norm.weight.len != norm.dim || !cols.is_multiple_of(norm.dim) {
            return Err(shape_err(op, format!("a norm of {} over rows of {cols}", norm.dim)));
        }
        let runs = rows * cols / norm.dim;
        if runs == 0 {
            return Ok(());
        }
        let one_plus = int(usize::from(norm.kind == NormKind::OnePlus));
        let args = vec![x, norm.weight.buf.ptr, out, int(norm.dim), float(norm.eps), one_plus];
        self.launch(op, &self.k.rms_norm, (runs as u32, 1, 1), 256, args)
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Matrix = CudaMatrix;
    type Vector = CudaVector;
    type KvPages = CudaKvPages;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn alloc(&mut self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor { buf: self.gpu.alloc(rows * cols * 4).map_err(dev("alloc"))?, rows, cols })
    }

    fn write(&mut self, t: &mut CudaTensor, data: &[f32]) -> Result<()> {
        if data.len() > t.rows * t.cols || (t.cols > 0 && !data.len().is_multiple_of(t.cols)) {
            return Err(shape_err(
                "write",
                format!("{} values into a tensor of {} rows of {}", data.len(), t.rows, t.cols),
            ));
        }
        self.gpu.htod(&t.buf, data).map_err(dev("write"))
    }

    fn read(&mut self, t: &CudaTensor, rows: usize) -> Result<Vec<f32>> {
        fits("read", t, rows)?;
        let mut out = vec![0f32; rows * t.cols];
        self.gpu.dtoh(&mut out, t.buf.ptr).map_err(dev("read"))?;
        Ok(out)
    }

    fn load_matrix(&mut self, m: &QMatrix, _usage: MatrixUse) -> Result<CudaMatrix> {
        let unsupported =
            |e: gguf::Error| Error::Unsupported { backend: "cuda", op: "load_matrix", reason: e.to_string() };
        let mut row = vec![0u8; m.row_bytes()];
        let mut values = vec![0f32; m.rows * m.cols];
        for (r, out) in values.chunks_exact_mut(m.cols.max(1)).enumerate() {
            m.copy_row_gguf(r, &mut row);
            gguf::quant::dequantize(m.ty, &row, out).map_err(unsupported)?;
        }
        let buf = self.gpu.upload(&values).map_err(dev("load_matrix"))?;
        Ok(CudaMatrix { buf, rows: m.rows, cols: m.cols })
    }

    fn load_vector(&mut self, v: &[f32]) -> Result<CudaVector> {
        Ok(CudaVector { buf: self.gpu.upload(v).map_err(dev("load_vector"))?, len: v.len() })
    }

    fn kv_pages(&mut self, layout: KvLayout) -> Result<CudaKvPages> {
        Ok(CudaKvPages { layout, buf: None, blocks: 0, capacity: 0 })
    }

    fn kv_grow(&mut self, kv: &mut CudaKvPages, num_blocks: usize) -> Result<()> {
        let op = "kv_grow";
        if num_blocks > kv.capacity {
            let capacity = num_blocks.max(2 * kv.capacity);
            let bb = kv.block_bytes();
            let buf = self.gpu.alloc(capacity * bb).map_err(dev(op))?;
            self.gpu.memset_zero(buf.ptr, capacity * bb).map_err(dev(op))?;
            if let Some(old) = &kv.buf {
                self.gpu.dtod(buf.ptr, old.ptr, kv.blocks * bb).map_err(dev(op))?;
                // The old buffer is freed below: nothing may still read or write it.
                self.gpu.sync().map_err(dev(op))?;
            }
            kv.buf = Some(buf);
            kv.capacity = capacity;
        }
        kv.blocks = kv.blocks.max(num_blocks);
        Ok(())
    }

    fn kv_copy_block(&mut self, kv: &mut CudaKvPages, from: u32, to: u32) -> Result<()> {
        let n = kv.layout.block_words();
        kv.check_block("kv_copy_block", from, n)?;
        kv.check_block("kv_copy_block", to, n)?;
        let bb = kv.block_bytes() as u64;
        let (src, dst) = (kv.base() + from as u64 * bb, kv.base() + to as u64 * bb);
        if from != to {
            self.gpu.dtod(dst, src, bb as usize).map_err(dev("kv_copy_block"))?;
        }
        Ok(())
    }

    fn kv_block_to_host(&mut self, kv: &CudaKvPages, block: u32, out: &mut [u16]) -> Result<()> {
        kv.check_block("kv_block_to_host", block, out.len())?;
        let src = kv.base() + block as u64 * kv.block_bytes() as u64;
        self.gpu.dtoh(out, src).map_err(dev("kv_block_to_host"))
    }

    fn kv_block_from_host(&mut self, kv: &mut CudaKvPages, block: u32, data: &[u16]) -> Result<()> {
        kv.check_block("kv_block_from_host", block, data.len())?;
        let buf = kv.buf.as_ref().expect("INVARIANT: a block exists, so the buffer does");
        self.gpu.htod_at(buf, block as usize * kv.block_bytes(), data).map_err(dev("kv_block_from_host"))
    }

    fn embedding(&mut self, table: &CudaMatrix, tokens: &[u32], out: &mut CudaTensor) -> Result<()> {
        let op = "embedding";
        fits(op, out, tokens.len())?;
        if out.cols != table.cols || tokens.iter().any(|&t| t as usize >= table.rows) {
            let what =
                format!("tokens {tokens:?} of a [{}, {}] table into rows of {}", table.rows, table.cols, out.cols);
            return Err(shape_err(op, what));
        }
        self.gather(op, table.buf.ptr, tokens, out.buf.ptr, table.cols)
    }

    fn gather_rows(&mut self, x: &CudaTensor, rows: &[usize], out: &mut CudaTensor) -> Result<()> {
        let op = "gather_rows";
        fits(op, out, rows.len())?;
        if out.cols != x.cols || rows.iter().any(|&r| r >= x.rows) {
            return Err(shape_err(op, format!("rows {rows:?} of a tensor of {} rows", x.rows)));
        }
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        self.gather(op, x.buf.ptr, &idx, out.buf.ptr, x.cols)
    }

    fn rms_norm(&mut self, x: &CudaTensor, rows: usize, norm: &Norm<CudaVector>, out: &mut CudaTensor) -> Result<()> {
        fits("rms_norm", x, rows)?;
        fits("rms_norm", out, rows)?;
        if out.cols != x.cols {
            return Err(shape_err("rms_norm", format!("rows of {} into rows of {}", x.cols, out.cols)));
        }
        self.norm("rms_norm", x.buf.ptr, rows, x.cols, norm, out.buf.ptr)
    }

    fn rms_norm_in_place(&mut self, x: &mut CudaTensor, rows: usize, norm: &Norm<CudaVector>) -> Result<()> {
        fits("rms_norm_in_place", x, rows)?;
        self.norm("rms_norm_in_place", x.buf.ptr, rows, x.cols, norm, x.buf.ptr)
    }

    fn linear(
        &mut self,
        x: &CudaTensor,
        rows: usize,
        ws: &[&CudaMatrix],
        biases: &[Option<&CudaVector>],
        outs: &mut [&mut CudaTensor],
    ) -> Result<()> {
        let op = "linear";
        fits(op, x, rows)?;
        if ws.is_empty() || ws.len() != outs.len() || !(biases.is_empty() || biases.len() == ws.len()) {
            return Err(shape_err(
                op,
                format!("{} matrices, {} outputs, {} biases", ws.len(), outs.len(), biases.len()),
            ));
        }
        for (i, (w, o)) in ws.iter().zip(outs.iter()).enumerate() {
            let bias = biases.get(i).copied().flatten();
            if w.cols != x.cols || o.cols != w.rows || rows > o.rows || bias.is_some_and(|b| b.len != w.rows) {
                let what = format!("[{}, {}] from rows of {} into rows of {}", w.rows, w.cols, x.cols, o.cols);
                return Err(shape_err(op, what));
            }
        }
        if rows == 0 {
            return Ok(());
        }
        for (i, (w, o)) in ws.iter().zip(outs.iter()).enumerate() {
            let bias = biases.get(i).copied().flatten().map_or(0, |b| b.buf.ptr);
            let args = vec![w.buf.ptr, x.buf.ptr, bias, o.buf.ptr, int(w.rows), int(w.cols)];
            self.launch(op, &self.k.matvec, (blocks_of(w.rows, 4), rows as u32, 1), 128, args)?;
        }
        Ok(())
    }

    fn rope(&mut self, x: &mut CudaTensor, positions: &[usize], spec: &RopeSpec) -> Result<()> {
        let op = "rope";
        fits(op, x, positions.len())?;
        if spec.head_dim == 0
            || !x.cols.is_multiple_of(spec.head_dim)
            || spec.rope_dim > spec.head_dim
            || !spec.rope_dim.is_multiple_of(2)
        {
            return Err(shape_err(op, format!("{spec:?} over rows of {}", x.cols)));
        }
        if positions.is_empty() || spec.rope_dim == 0 {
            return Ok(());
        }
        let pos: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
        let pos = self.meta(op, &pos)?;
        // theta^(-2i / rope_dim) as a running product of this step, as the CPU backend (and ggml).
        let step = spec.theta.powf(-2.0 / spec.rope_dim as f32);
        let neox = int(usize::from(spec.style == RopeStyle::Neox));
        let args = vec![x.buf.ptr, pos, int(x.cols), int(spec.head_dim), int(spec.rope_dim), float(step), neox];
        self.launch(op, &self.k.rope, (positions.len() as u32, 1, 1), 256, args)
    }

    fn paged_attention(
        &mut self,
        kv: &mut CudaKvPages,
        layer: usize,
        shape: AttnShape,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        rows: &AttnRows<'_>,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let op = "paged_attention";
        let m = rows.num_rows();
        let (qd, kvd, hd) = (shape.q_dim(), shape.kv_dim(), shape.head_dim);
        let layout = kv.layout;
        let bt = layout.block_tokens;
        for (t, want) in [(q, qd), (k, kvd), (v, kvd), (&*out, qd)] {
            fits(op, t, m)?;
            if t.cols != want {
                return Err(shape_err(op, format!("rows of {} for {shape:?}", t.cols)));
            }
        }
        let covered: usize = rows.seqs.iter().map(|s| s.num_rows).sum();
        let n = kv.blocks;
        let bad_slot = rows.slots.iter().any(|&(b, r)| b as usize >= n || r >= bt);
        let bad_seq = (rows.seqs.iter())
            .any(|s| s.blocks.iter().any(|&b| b as usize >= n) || s.blocks.len() * bt < s.start_pos + s.num_rows);
        let heads_ok = shape.num_kv_heads > 0 && shape.num_heads.is_multiple_of(shape.num_kv_heads);
        if kvd != layout.kv_dim || layer >= layout.num_layers || rows.slots.len() != m || covered != m || !heads_ok {
            return Err(shape_err(op, format!("{m} rows, layer {layer}, {layout:?}, {shape:?}")));
        }
        if bad_slot || bad_seq {
            return Err(shape_err(op, format!("a slot or block outside the {n} blocks")));
        }
        if hd > 256 {
            return Err(Error::Unsupported { backend: "cuda", op, reason: format!("head_dim {hd} (at most 256)") });
        }
        if m == 0 {
            return Ok(());
        }
        // One table: per row its slot, then per row (position, offset of its sequence's blocks), then the blocks.
        let mut words: Vec<u32> = rows.slots.iter().flat_map(|&(b, r)| [b, r as u32]).collect();
        let table0 = 4 * m;
        let mut off = 0;
        let mut t = 0;
        for s in rows.seqs {
            for i in 0..s.num_rows {
                words.extend([rows.positions[t + i] as u32, off as u32]);
            }
            t += s.num_rows;
            off += s.blocks.len();
        }
        words.extend(rows.seqs.iter().flat_map(|s| s.blocks.iter().copied()));
        let ctx = rows.positions.iter().max().map_or(1, |&p| p + 1);
        let meta = self.meta(op, &words)?;
        let scores = self.scores(op, m * shape.num_heads * ctx * 4)?;
        // Offsets in values (`layer_offset` counts u16 words).
        let (bv, lk) = (int(layout.block_values()), int(layout.layer_offset(layer) / layout.kv_type.words()));
        let args = vec![kv.base(), k.buf.ptr, v.buf.ptr, meta, int(kvd), int(bt), bv, lk, kv.f32_flag()];
        self.launch(op, &self.k.kv_write, (m as u32, 1, 1), 128, args)?;
        let args = vec![
            q.buf.ptr,
            kv.base(),
            meta + 8 * m as u64,
            meta + 4 * table0 as u64,
            scores,
            out.buf.ptr,
            int(shape.num_heads),
            int(shape.num_kv_heads),
            int(hd),
            float(shape.scale),
            int(bt),
            bv,
            lk,
            int(ctx),
            kv.f32_flag(),
        ];
        self.launch(op, &self.k.attention, (m as u32, shape.num_heads as u32, 1), 128, args)
    }

    fn swiglu(&mut self, gate: &mut CudaTensor, up: &CudaTensor, rows: usize) -> Result<()> {
        self.elementwise("swiglu", |k| &k.swiglu, gate, up, rows)
    }

    fn add(&mut self, x: &mut CudaTensor, y: &CudaTensor, rows: usize) -> Result<()> {
        self.elementwise("add", |k| &k.add, x, y, rows)
    }

    fn experts(
        &mut self,
        x: &CudaTensor,
        rows: usize,
        w: &crate::ExpertWeights<Self>,
        out: &mut CudaTensor,
    ) -> Result<()> {
        self.experts_op(x, rows, w, out)
    }
}

impl CudaBackend {
    /// `x = f(x, y)` over the first `rows` rows (`swiglu`, `add`).
    fn elementwise(
        &mut self,
        op: &'static str,
        kernel: fn(&Kernels) -> &CudaFunction,
        x: &mut CudaTensor,
        y: &CudaTensor,
        rows: usize,
    ) -> Result<()> {
        fits(op, x, rows)?;
        fits(op, y, rows)?;
        if x.cols != y.cols {
            return Err(shape_err(op, format!("rows of {} and {}", x.cols, y.cols)));
        }
        let n = rows * x.cols;
        if n == 0 {
            return Ok(());
        }
        self.launch(op, kernel(&self.k), (blocks_of(n, 256), 1, 1), 256, vec![x.buf.ptr, y.buf.ptr, int(n)])
    }
}
