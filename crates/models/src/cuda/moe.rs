//! The expert-routed FFN sub-layer on the fused backend, for the rows of one segment: the router's product, its
//! softmax and top-k and the assignments sorted by expert on the device (`moe_route`, `moe_group`: the used experts'
//! list and each assignment's row), then
//! - matrix-vector rows (decode, verification, short chunks; captured in the pass's CUDA graph): the input rows
//!   gathered in expert order by their RMSNorm (on 8-bit activations: by its quantization), gate/up and down as
//!   grouped products whose blocks each take one used expert and read its weight rows once for all the rows that
//!   picked it (`moe.cu`), the mix in the router's slot order added to the residual;
//! - long chunks (tensor cores, never in a graph): every expert's matrices dequantized to f16 and one cuBLAS GEMM
//!   per used expert over its rows, the assignments' counts read back once per layer.
//!
//! In: the segment's rows of the residual stream. Out: the same rows with the FFN added. The scratch is sized by the
//! pass's row count when the pass is planned (`FusedBackend::ensure_scratch`), so a captured pass allocates nothing.

use backend::cuda::{BlasMat, BlasType, DevBuf, Gpu};
use backend::{ExpertGateUp, ExpertWeights, ExpertsSpec, Norm};

use super::fused::{FusedBackend, GMat};
use super::kernels::Kernel as K;
use super::layer::{Args, SegRows, i};
use super::layout::device_row_bytes;
use super::tactics::{pick_mr, q8_threads};
use crate::{Error, ModelConfig, Result};

/// The most experts a router may have (`MOE_MAX_EXPERTS` in experts.cu: `moe_route` keeps the probabilities in
/// shared memory).
pub(super) const MAX_EXPERTS: usize = 1024;

/// Threads per weight row of an expert's grouped 8-bit product of rows of `k` values: as for a dense matrix of the
/// rows all `num_used` picked experts compute in a decode step (`rows` each), at most one warp.
pub(super) fn moe_threads(k: usize, rows: usize, num_used: usize, iters: usize) -> usize {
    q8_threads(k, rows * num_used, iters, 32)
}

/// The matrix-vector path's buffers for `cap_m` rows (the pass scratch's capacity) (`cap_m * num_used` assignments), with their shapes.
pub(super) struct MoeScratch {
    /// `[m, num_experts]` the router's logits.
    logits: DevBuf,
    /// `[m * k]` each assignment's expert and weight (assignment a = row * k + slot).
    pick_e: DevBuf,
    pick_w: DevBuf,
    /// `[num_experts + 1]` where each expert's assignments start in expert order; `[n]` assignment of each place,
    /// place of each assignment, row of each place; `[1 + num_experts]` the used experts (count first).
    offsets: DevBuf,
    order: DevBuf,
    at: DevBuf,
    tok: DevBuf,
    used: DevBuf,
    /// `[n, hidden]` the input rows in expert order (f32, and as 8-bit activations with their per-32 scales).
    xg: DevBuf,
    xq: DevBuf,
    xd: DevBuf,
    /// `[n, 2 * expert_ffn]` gate/up outputs: silu(gate) * up in the first `expert_ffn` of each row of
    /// `expert_ffn` (the matrix-vector path), or gate then up per row of `2 * expert_ffn` (the GEMM path); and the
    /// former as 8-bit activations.
    hid: DevBuf,
    hq: DevBuf,
    hd: DevBuf,
    /// `[n, hidden]` each assignment's down output.
    y: DevBuf,
}

impl MoeScratch {
    pub(super) fn new(gpu: &Gpu, cfg: &ModelConfig, s: &ExpertsSpec, cap_m: usize) -> Result<Self> {
        let (h, f, ne) = (cfg.hidden_size, s.expert_ffn, s.num_experts);
        let n = cap_m * s.num_used;
        Ok(MoeScratch {
            logits: gpu.alloc(cap_m * ne * 4)?,
            pick_e: gpu.alloc(n * 4)?,
            pick_w: gpu.alloc(n * 4)?,
            offsets: gpu.alloc((ne + 1) * 4)?,
            order: gpu.alloc(n * 4)?,
            at: gpu.alloc(n * 4)?,
            tok: gpu.alloc(n * 4)?,
            used: gpu.alloc((ne + 1) * 4)?,
            xg: gpu.alloc(n * h * 4)?,
            xq: gpu.alloc(n * h)?,
            xd: gpu.alloc(n * h / 32 * 8)?,
            hid: gpu.alloc(n * 2 * f * 4)?,
            hq: gpu.alloc(n * f)?,
            hd: gpu.alloc(n * f / 32 * 8)?,
            y: gpu.alloc(n * h * 4)?,
        })
    }
}

/// The tensor-core path's f16 copies of one layer's expert matrices: `[num_experts * 2 * expert_ffn, hidden]` gate
/// then up (a fused `gate_up` as it is stored; separate ones one after the other) and `[num_experts * hidden,
/// expert_ffn]` down; plus the f16 inputs `[n, hidden]` and SwiGLU outputs `[n, expert_ffn]`.
pub(super) struct MoeGemmScratch {
    pub(super) cap_m: usize,
    wgu: DevBuf,
    wd: DevBuf,
    xh: DevBuf,
    hh: DevBuf,
}

impl MoeGemmScratch {
    pub(super) fn new(gpu: &Gpu, cfg: &ModelConfig, s: &ExpertsSpec, cap_m: usize) -> Result<Self> {
        let (h, f, ne) = (cfg.hidden_size, s.expert_ffn, s.num_experts);
        let n = cap_m * s.num_used;
        Ok(MoeGemmScratch {
            cap_m,
            wgu: gpu.alloc(ne * 2 * f * h * 2)?,
            wd: gpu.alloc(ne * h * f * 2)?,
            xh: gpu.alloc(n * h * 2)?,
            hh: gpu.alloc(n * f * 2)?,
        })
    }
}

/// The experts' gate and up as the grouped kernels read them: the gate matrix, the address of expert 0's up rows
/// and the rows between two experts' first rows.
fn gate_up(e: &ExpertWeights<FusedBackend>) -> (&GMat, u64, usize) {
    let f = e.spec.expert_ffn;
    match &e.gate_up {
        ExpertGateUp::Separate { gate, up } => (gate, up.buf.ptr, f),
        ExpertGateUp::Fused(m) => (m, m.buf.ptr + (f * device_row_bytes(m.ty, m.cols)) as u64, 2 * f),
    }
}

impl FusedBackend {
    fn moe_scratch(&self) -> &MoeScratch {
        self.moe_scratch.as_ref().expect("INVARIANT: ensure_scratch sized the experts' scratch")
    }

    /// The router's picks of the segment's `m` rows, sorted by expert: `norm(x)` into `xn`, the router's product,
    /// `moe_route`, `moe_group`.
    fn route(&self, norm: &Norm<DevBuf>, e: &ExpertWeights<Self>, x: u64, xn: u64, m: usize) -> Result<()> {
        let s = self.moe_scratch();
        let sp = e.spec;
        let (ne, k) = (sp.num_experts, sp.num_used);
        self.launch(K::RmsNorm, (m as u32, 1, 1), 256, Args(vec![x, norm.weight.ptr, xn, 0]))?;
        self.mmv(&e.router, xn, s.logits.ptr, None, m, false)?;
        let normalise = i(usize::from(sp.normalise_weights));
        let args = vec![s.logits.ptr, i(ne), i(k), normalise, s.pick_e.ptr, s.pick_w.ptr];
        self.launch(K::MoeRoute, (m as u32, 1, 1), 32, Args(args))?;
        let (p, n) = (&[s.offsets.ptr, s.order.ptr, s.at.ptr, s.tok.ptr, s.used.ptr], m * k);
        self.launch(K::MoeGroup, (1, 1, 1), 256, Args([&[s.pick_e.ptr, i(n), i(ne), i(k)][..], p].concat()))
    }

    /// `x += Σ_j w_j · y_j` over each row's slots in order.
    fn mix(&self, x: u64, m: usize, k: usize) -> Result<()> {
        let s = self.moe_scratch();
        self.launch(K::MoeMixAdd, (m as u32, 1, 1), 256, Args(vec![s.y.ptr, s.at.ptr, s.pick_w.ptr, i(k), x]))
    }

    /// The expert-routed FFN of one segment's rows on the grouped matrix-vector kernels.
    pub(super) fn experts_rows(&self, norm: &Norm<DevBuf>, e: &ExpertWeights<Self>, rows: &SegRows) -> Result<()> {
        let s = self.moe_scratch();
        let SegRows { m, x, xn, .. } = *rows;
        let (h, f, k) = (self.cfg.hidden_size, e.spec.expert_ffn, e.spec.num_used);
        let n = m * k;
        self.route(norm, e, x, xn, m)?;
        let (gate, up, stride) = gate_up(e);
        // Block rows: one per expert some row picked (at most n of them).
        let (slots, mr) = (e.spec.num_experts.min(n) as u32, pick_mr(m));
        let grouped = [s.used.ptr, s.offsets.ptr];
        if gate.q8 && e.down.q8 {
            // The rows in expert order, normalised and quantized in one launch.
            self.quant(x, norm.weight.ptr, s.tok.ptr, s.xq.ptr, s.xd.ptr, n, h)?;
            let p = moe_threads(h, f, k, self.opts.q8_iters);
            let args = [&[gate.buf.ptr, up, i(stride), s.xq.ptr, s.xd.ptr][..], &grouped, &[s.hid.ptr, i(f)]].concat();
            let kernel = K::MoeMmvq { ty: gate.ty, k: h, p, mr, gu: true };
            self.launch(kernel, (f.div_ceil(128 / p) as u32, slots, 1), 128, Args(args))?;
            self.quant(s.hid.ptr, 0, 0, s.hq.ptr, s.hd.ptr, n, f)?;
            let p = moe_threads(f, h, k, self.opts.q8_iters);
            let args = [&[e.down.buf.ptr, 0, i(h), s.hq.ptr, s.hd.ptr][..], &grouped, &[s.y.ptr, i(h)]].concat();
            let kernel = K::MoeMmvq { ty: e.down.ty, k: f, p, mr, gu: false };
            self.launch(kernel, (h.div_ceil(128 / p) as u32, slots, 1), 128, Args(args))?;
        } else {
            self.launch(K::RmsNorm, (n as u32, 1, 1), 256, Args(vec![x, norm.weight.ptr, s.xg.ptr, s.tok.ptr]))?;
            let args = [&[gate.buf.ptr, up, i(stride), s.xg.ptr][..], &grouped, &[s.hid.ptr, i(f)]].concat();
            let kernel = K::MoeMmv { ty: gate.ty, k: h, mr, gu: true };
            self.launch(kernel, (f.div_ceil(4) as u32, slots, 1), 128, Args(args))?;
            let args = [&[e.down.buf.ptr, 0, i(h), s.hid.ptr][..], &grouped, &[s.y.ptr, i(h)]].concat();
            let kernel = K::MoeMmv { ty: e.down.ty, k: f, mr, gu: false };
            self.launch(kernel, (h.div_ceil(4) as u32, slots, 1), 128, Args(args))?;
        }
        self.mix(x, m, k)
    }

    /// `w` (all its rows) dequantized to f16 at `out`.
    fn dequant_all(&self, w: &GMat, out: u64) -> Result<()> {
        let units = w.rows * (w.cols / 32);
        let args = Args(vec![w.buf.ptr, out, i(w.rows)]);
        self.launch(K::Dequant { ty: w.ty, k: w.cols }, (units.div_ceil(256) as u32, 1, 1), 256, args)
    }

    /// The expert-routed FFN of one long chunk's rows on tensor cores: the routing as on the matrix-vector path,
    /// the rows in expert order in f16, every expert's matrices dequantized to f16, then per used expert (the
    /// assignments' counts copied back: this path is never captured) a GEMM for gate and up, the SwiGLU for all
    /// rows, a GEMM for down, and the mix.
    pub(super) fn gemm_experts_rows(&self, norm: &Norm<DevBuf>, e: &ExpertWeights<Self>, rows: &SegRows) -> Result<()> {
        let s = self.moe_scratch();
        let g = self.moe_gemm.as_ref().expect("INVARIANT: ensure_gemm_scratch sized the experts' GEMM scratch");
        let blas = self.blas.as_ref().expect("INVARIANT: GEMM segments only exist with cuBLAS");
        let SegRows { m, x, xn, .. } = *rows;
        let sp = e.spec;
        let (h, f, k, ne) = (self.cfg.hidden_size, sp.expert_ffn, sp.num_used, sp.num_experts);
        let n = m * k;
        self.route(norm, e, x, xn, m)?;
        self.launch(K::RmsNorm, (n as u32, 1, 1), 256, Args(vec![x, norm.weight.ptr, s.xg.ptr, s.tok.ptr]))?;
        self.to_f16(s.xg.ptr, g.xh.ptr, n * h)?;
        // Gate rows of expert x at x * 2f (fused: its up rows follow) or x * f with the up matrix after all gates.
        let (fused, up_at) = match &e.gate_up {
            ExpertGateUp::Fused(m) => {
                self.dequant_all(m, g.wgu.ptr)?;
                (true, 0)
            }
            ExpertGateUp::Separate { gate, up } => {
                self.dequant_all(gate, g.wgu.ptr)?;
                self.dequant_all(up, g.wgu.ptr + (ne * f * h * 2) as u64)?;
                (false, ne * f * h)
            }
        };
        self.dequant_all(&e.down, g.wd.ptr)?;
        let mut offsets = vec![0u32; ne + 1];
        self.gpu.dtoh(&mut offsets, s.offsets.ptr)?;
        let bad = offsets.windows(2).any(|w| w[0] > w[1]) || offsets[ne] as usize != n;
        if bad {
            return Err(Error::Backend(format!("moe_group wrote inconsistent offsets for {n} assignments")));
        }
        let used = || {
            (0..ne).filter(|&x| offsets[x] < offsets[x + 1]).map(|x| (x, offsets[x] as usize, offsets[x + 1] as usize))
        };
        let h16 = |ptr: u64, at: usize, ld: usize| BlasMat::new(ptr + 2 * at as u64, BlasType::F16, ld);
        let f32m = |ptr: u64, at: usize, ld: usize| BlasMat::new(ptr + 4 * at as u64, BlasType::F32, ld);
        for (x, p0, p1) in used() {
            let (c, xin) = (p1 - p0, h16(g.xh.ptr, p0 * h, h));
            if fused {
                let w = h16(g.wgu.ptr, x * 2 * f * h, h);
                blas.gemm(true, false, (2 * f, c, h), 1.0, w, xin, 0.0, f32m(s.hid.ptr, p0 * 2 * f, 2 * f), 1)?;
            } else {
                let (wg, wu) = (h16(g.wgu.ptr, x * f * h, h), h16(g.wgu.ptr, up_at + x * f * h, h));
                blas.gemm(true, false, (f, c, h), 1.0, wg, xin, 0.0, f32m(s.hid.ptr, p0 * 2 * f, 2 * f), 1)?;
                blas.gemm(true, false, (f, c, h), 1.0, wu, xin, 0.0, f32m(s.hid.ptr, p0 * 2 * f + f, 2 * f), 1)?;
            }
        }
        let args = Args(vec![s.hid.ptr, i(f), i(n), g.hh.ptr]);
        self.launch(K::MoeSiluF16, ((n * f).div_ceil(256) as u32, 1, 1), 256, args)?;
        for (x, p0, p1) in used() {
            let (w, hin) = (h16(g.wd.ptr, x * h * f, f), h16(g.hh.ptr, p0 * f, f));
            blas.gemm(true, false, (h, p1 - p0, f), 1.0, w, hin, 0.0, f32m(s.y.ptr, p0 * h, h), 1)?;
        }
        self.mix(x, m, k)
    }
}
