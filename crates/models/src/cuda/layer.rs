//! One pass's launches on the matrix-vector kernels: per layer the attention RMSNorm and the Q, K, V products (fused
//! into one launch where the model allows), RoPE and the KV write, the paged attention, the output projection, the
//! FFN RMSNorm, gate/up and down; then the output head and what the pass picks. Long chunks go to `prefill`.

use std::ffi::c_void;

use backend::cuda::DevBuf;

use super::kernels::{Kernel as K, guq_fused, warps_per_row};
use super::meta::Seg;
use super::runner::GLayer;
use super::runner::GMat;
use super::tactics::{act_fmt, att_splits, pick_mr, q8_threads};
use super::{ARGMAX_BLOCKS, CudaRunner, DEVICE_CANDIDATES, GEMM_MIN_ROWS, ROPE_THREADS, TOPK_BLOCKS};
use crate::Result;

/// Kernel arguments: each stored in 8 bytes (ints in the low half, little-endian), passed by address.
pub(super) struct Args(pub(super) Vec<u64>);

impl Args {
    fn ptrs(&mut self) -> Vec<*mut c_void> {
        self.0.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect()
    }
}

pub(super) fn i(v: usize) -> u64 {
    v as u32 as u64
}

/// Device addresses of one segment's rows in the scratch buffers and the pass's metadata.
#[derive(Debug, Clone, Copy)]
pub(super) struct SegRows {
    pub m: usize,
    pub x: u64,
    pub xn: u64,
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub att: u64,
    pub gate: u64,
    pub up: u64,
    pub pos: u64,
    pub slot: u64,
    pub table: u64,
}

impl CudaRunner {
    pub(super) fn launch(&self, kernel: K, grid: (u32, u32, u32), block: u32, mut args: Args) -> Result<()> {
        let f = self.kernels.get(kernel)?;
        if !self.opts.skip.is_empty() && self.opts.skip.iter().any(|s| kernel.name().contains(s.as_str())) {
            return Ok(());
        }
        let mut p = args.ptrs();
        // Inside graphs only where `pdl_scope` says (every kernel there was slower: benchmarks/log, stretch 12).
        let pdl = self.opts.pdl && (!self.capturing.get() || self.pdl_scope.get());
        self.gpu.launch_pdl(f, grid, block, &mut p, pdl)?;
        Ok(())
    }

    /// The activations to multiply `w` with: `x` itself, or `x` rounded as the CPU backend would (into `xq`, reused
    /// while `memo` says it already holds `x` in that format).
    pub(super) fn act(&self, w: &GMat, x: u64, m: usize, memo: &mut Option<(u64, u32)>) -> Result<u64> {
        let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
        let Some(fmt) = act_fmt(w.ty).filter(|_| self.opts.exact_activations) else { return Ok(x) };
        if *memo == Some((x, fmt)) {
            return Ok(s.xq.ptr);
        }
        let k = w.cols;
        let bl = if fmt == 0 { 32 } else { 256 };
        let grid = (m as u32, (k / bl).div_ceil(8) as u32, 1);
        let kernel = if fmt == 0 { K::ActQ8_0 } else { K::ActQ8K };
        self.launch(kernel, grid, 256, Args(vec![x, s.xq.ptr, i(k)]))?;
        *memo = Some((x, fmt));
        Ok(s.xq.ptr)
    }

    /// Y[m, N] (+)= W X[m, K] (+ bias).
    pub(super) fn mmv(&self, w: &GMat, x: u64, y: u64, bias: Option<&DevBuf>, m: usize, residual: bool) -> Result<()> {
        let mut memo = None;
        self.mmv_m(w, x, y, bias, m, residual, &mut memo)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn mmv_m(
        &self,
        w: &GMat,
        x: u64,
        y: u64,
        bias: Option<&DevBuf>,
        m: usize,
        residual: bool,
        memo: &mut Option<(u64, u32)>,
    ) -> Result<()> {
        let x = self.act(w, x, m, memo)?;
        let mr = pick_mr(m);
        let kernel = K::Mmv { ty: w.ty, k: w.cols, mr, residual };
        let grid = (w.rows.div_ceil(4 / warps_per_row(w.cols)) as u32, m.div_ceil(mr) as u32, 1);
        let b = bias.map_or(0, |b| b.ptr);
        self.launch(kernel, grid, 128, Args(vec![w.buf.ptr, x, y, b, i(m), i(w.rows)]))
    }

    /// Rows [0, m) of `x` (width `k`; with `norm`, RMS-normalised with those weights first; with `rows`, the rows
    /// that table names) quantized to 8 bits into `xq` (int8) and `xd` (a float2 per 32 values).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn quant(&self, x: u64, norm: u64, rows: u64, xq: u64, xd: u64, m: usize, k: usize) -> Result<()> {
        let args = Args(vec![x, norm, rows, xq, xd, i(k)]);
        self.launch(K::QuantQ8, (m as u32, k.div_ceil(256) as u32, 1), 256, args)
    }

    /// The per-head q/k RMSNorm where the layer has one (Qwen3), then RoPE and the K/V write into layer `li`'s cache,
    /// for `mu` rows at `[q, k, v]` with their `[positions, cache slots, block table]`.
    pub(super) fn qk_norm_rope_kv(
        &self,
        l: &GLayer,
        li: usize,
        [q, k, v]: [u64; 3],
        [pos, slot, table]: [u64; 3],
        mu: u32,
    ) -> Result<()> {
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            self.launch(K::QkNorm, (mu, 1, 1), 128, Args(vec![q, k, qn.ptr, kn.ptr]))?;
        }
        let pairs = (self.cfg.num_heads + self.cfg.num_kv_heads) * self.cfg.head_dim / 2;
        self.launch(
            K::RopeKv,
            (mu, pairs.div_ceil(ROPE_THREADS as usize) as u32, 1),
            ROPE_THREADS,
            Args(vec![q, k, v, self.inv_freq.ptr, pos, slot, table, self.kc[li].ptr, self.vc[li].ptr]),
        )
    }

    /// Y[m, N] (+)= W X[m, K] (+ bias) on 8-bit activations (`quant` output).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mmvq(
        &self,
        w: &GMat,
        xq: u64,
        xd: u64,
        y: u64,
        bias: Option<&DevBuf>,
        m: usize,
        residual: bool,
    ) -> Result<()> {
        let pt = q8_threads(w.cols, w.rows, self.opts.q8_iters, 128);
        let mr = pick_mr(m);
        let kernel = K::Mmvq { ty: w.ty, k: w.cols, p: pt, mr, residual };
        let grid = (w.rows.div_ceil((128 / pt).max(1)) as u32, m.div_ceil(mr) as u32, 1);
        let b = bias.map_or(0, |b| b.ptr);
        self.launch(kernel, grid, 128, Args(vec![w.buf.ptr, xq, xd, y, b, i(m), i(w.rows)]))
    }

    /// Enqueues the whole forward pass for the batch's segments (`self.segs`, covering `m` rows) and `r` logit rows
    /// (metadata already on the device).
    pub(super) fn enqueue(&self, m: usize, r: usize) -> Result<()> {
        for seg in &self.segs {
            self.enqueue_rows(seg)?;
        }
        if r > 0 && self.q8_out && !(r >= GEMM_MIN_ROWS && self.blas.is_some() && self.opts.gemm) {
            let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
            let out = self.output.as_ref().unwrap_or(&self.embd);
            let h = self.cfg.hidden_size;
            self.quant(s.x.ptr, self.output_norm.ptr, self.meta.get().out_rows, s.xq8.ptr, s.xds.ptr, r, h)?;
            self.mmvq(out, s.xq8.ptr, s.xds.ptr, s.logits.ptr, None, r, false)?;
        } else if r > 0 {
            let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
            self.launch(
                K::RmsNorm,
                (r as u32, 1, 1),
                256,
                Args(vec![s.x.ptr, self.output_norm.ptr, s.xn.ptr, self.meta.get().out_rows]),
            )?;
            let out = self.output.as_ref().unwrap_or(&self.embd);
            if r >= GEMM_MIN_ROWS && self.blas.is_some() && self.opts.gemm {
                let gs = self.gemm_scratch.as_ref().expect("INVARIANT: ensure_gemm_scratch ran for r rows");
                self.to_f16(s.xn.ptr, gs.xh.ptr, r * self.cfg.hidden_size)?;
                self.linear(out, gs.xh.ptr, s.logits.ptr, None, r, false)?;
            } else {
                self.mmv(out, s.xn.ptr, s.logits.ptr, None, r, false)?;
            }
        }
        if r > 0 && self.pick.get() == 3 {
            let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
            let (vocab, c) = (self.cfg.vocab_size, DEVICE_CANDIDATES.min(self.cfg.vocab_size));
            let (flags, keys) = (s.cand.ptr, s.cand.ptr + (r * TOPK_BLOCKS * 4) as u64);
            let args = vec![s.logits.ptr, i(vocab), i(c), keys, flags];
            self.launch(K::TopkRows, (r as u32, TOPK_BLOCKS as u32, 1), 1024, Args(args))?;
        } else if r > 0 && self.pick.get() > 0 {
            let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
            let vocab = self.cfg.vocab_size;
            let probs = if self.pick.get() == 2 { s.probs.ptr } else { 0 };
            // One row of one token: its pick also feeds the next pass, should that pass have started ahead.
            let (feed, ring) = if m == 1 && r == 1 { (self.meta.get().tokens, self.ahead_ring.addr()) } else { (0, 0) };
            let args = vec![s.logits.ptr, i(vocab), s.ids.ptr, probs, s.row_part.ptr, s.row_counters.ptr, feed, ring];
            self.launch(K::ArgmaxRows, (r as u32, ARGMAX_BLOCKS as u32, 1), 256, Args(args))?;
        }
        Ok(())
    }

    /// Every layer for the rows of one segment: matrix-vector kernels, or tensor-core GEMMs for a long chunk.
    pub(super) fn enqueue_rows(&self, seg: &Seg) -> Result<()> {
        let s = self.scratch.as_ref().expect("INVARIANT: ensure_scratch ran");
        let c = &self.cfg;
        let (r0, m) = (seg.r0, seg.n);
        let mu = m as u32;
        let f = 4u64;
        let row = |b: &DevBuf, width: usize| b.ptr + (r0 * width) as u64 * f;
        let (x, xn) = (row(&s.x, c.hidden_size), row(&s.xn, c.hidden_size));
        let (q, k, v) = (row(&s.q, c.q_dim()), row(&s.k, c.kv_dim()), row(&s.v, c.kv_dim()));
        let att = row(&s.att, c.q_dim());
        let (gate, up) = (row(&s.gate, c.ffn_size), row(&s.up, c.ffn_size));
        let meta = self.meta.get();
        let (tokens, pos, slot) = (meta.tokens + 4 * r0 as u64, meta.pos + 4 * r0 as u64, meta.slot + 4 * r0 as u64);
        let rows = SegRows { m, x, xn, q, k, v, att, gate, up, pos, slot, table: meta.table };
        self.launch(
            K::Embed { ty: self.embd.ty, k: c.hidden_size },
            (mu, 1, 1),
            128,
            Args(vec![self.embd.buf.ptr, tokens, x]),
        )?;
        let p = |b: &Option<DevBuf>| b.as_ref().map_or(0, |b| b.ptr);
        for (li, l) in self.layers.iter().enumerate() {
            if let Some(gc) = seg.gemm {
                self.gemm_layer(li, l, gc, &rows)?;
                continue;
            }
            // The fused kernel re-reads the activations and norm weights per weight row (from L1): it pays for small
            // models only (measured: 1.5B faster, 32B slower). Chosen per model, never per batch, so a sequence's
            // results do not depend on the batch it runs in.
            let fused = !self.opts.exact_activations
                && c.hidden_size <= 2048
                && c.rope_dim == c.head_dim
                && !c.qk_norm
                && c.head_dim.is_multiple_of(2);
            let q8 = self.q8_layers[li];
            // Rows of the 8-bit activation scratch for an input of width k (this segment's rows).
            let qb = |k: usize| (s.xq8.ptr + (r0 * k) as u64, s.xds.ptr + (r0 * (k / 32) * 8) as u64);
            if q8 {
                // Attention RMSNorm + 8-bit quantization (in the QKV kernel's prologue with `fuse_norm`), then Q, K,
                // V in one launch (dp4a), with RoPE and the KV write in its epilogue (`qkv_rope`).
                let (xq, xd) = qb(c.hidden_size);
                if !self.opts.fuse_norm {
                    self.quant(x, l.attn_norm.ptr, 0, xq, xd, m, c.hidden_size)?;
                }
                let rows = c.q_dim() + 2 * c.kv_dim();
                let pt = q8_threads(c.hidden_size, rows, self.opts.q8_iters, 32);
                let mr = pick_mr(m);
                self.launch(
                    K::Qkvq { t: [l.wq.ty, l.wk.ty, l.wv.ty], p: pt, mr },
                    (rows.div_ceil(128 / pt) as u32, m.div_ceil(mr) as u32, 1),
                    128,
                    Args(vec![
                        l.wq.buf.ptr,
                        l.wk.buf.ptr,
                        l.wv.buf.ptr,
                        xq,
                        xd,
                        p(&l.bq),
                        p(&l.bk),
                        p(&l.bv),
                        q,
                        k,
                        v,
                        i(m),
                        x,
                        l.attn_norm.ptr,
                        self.inv_freq.ptr,
                        pos,
                        slot,
                        meta.table,
                        self.kc[li].ptr,
                        self.vc[li].ptr,
                    ]),
                )?;
                if !self.opts.qkv_rope {
                    self.qk_norm_rope_kv(l, li, [q, k, v], [pos, slot, meta.table], mu)?;
                }
            } else {
                if fused {
                    // RMSNorm fused into one launch of the three projections.
                    let mr = pick_mr(m);
                    let rows = c.q_dim() + 2 * c.kv_dim();
                    self.launch(
                        K::Qkv { t: [l.wq.ty, l.wk.ty, l.wv.ty], mr },
                        (rows.div_ceil(4) as u32, m.div_ceil(mr) as u32, 1),
                        128,
                        Args(vec![
                            l.wq.buf.ptr,
                            l.wk.buf.ptr,
                            l.wv.buf.ptr,
                            x,
                            l.attn_norm.ptr,
                            p(&l.bq),
                            p(&l.bk),
                            p(&l.bv),
                            q,
                            k,
                            v,
                            i(m),
                        ]),
                    )?;
                } else {
                    self.launch(K::RmsNorm, (mu, 1, 1), 256, Args(vec![x, l.attn_norm.ptr, xn, 0]))?;
                    let mut memo = None;
                    self.mmv_m(&l.wq, xn, q, l.bq.as_ref(), m, false, &mut memo)?;
                    self.mmv_m(&l.wk, xn, k, l.bk.as_ref(), m, false, &mut memo)?;
                    self.mmv_m(&l.wv, xn, v, l.bv.as_ref(), m, false, &mut memo)?;
                }
                self.qk_norm_rope_kv(l, li, [q, k, v], [pos, slot, meta.table], mu)?;
            }
            // Decode batches split the positions most: into one cluster of `att_cl` splits while the contexts fit.
            let splits = att_splits(m, self.att_sg.get());
            let cl = self.att_cl.get() && m <= self.opts.att_cl_rows && splits >= self.opts.att_cl;
            // From the attention to its output projection, kernels start while the one before drains, in graphs too.
            self.pdl_scope.set(self.opts.graph_pdl_att);
            self.launch(
                if cl { K::AttentionCl } else { K::Attention },
                (mu, c.num_heads as u32, if cl { self.opts.att_cl } else { splits } as u32),
                (32 * self.opts.att_warps) as u32,
                Args(vec![
                    q,
                    self.kc[li].ptr,
                    self.vc[li].ptr,
                    pos,
                    slot,
                    meta.table,
                    s.part.ptr,
                    att,
                    s.counters.ptr,
                    if q8 && self.opts.att_q8 { qb(c.q_dim()).0 } else { 0 },
                    if q8 && self.opts.att_q8 { qb(c.q_dim()).1 } else { 0 },
                ]),
            )?;
            if q8 {
                // The attention kernel also wrote its output as 8-bit activations (unless turned off).
                let (aq, ad) = qb(c.q_dim());
                if !self.opts.att_q8 {
                    self.quant(att, 0, 0, aq, ad, m, c.q_dim())?;
                }
                self.mmvq(&l.wo, aq, ad, x, None, m, true)?;
                self.pdl_scope.set(false);
                let (fq, fd) = qb(c.hidden_size);
                // The gate/up kernel normalises and quantizes its input itself with `fuse_norm`.
                if !(self.opts.fuse_norm && l.gate.ty == l.up.ty) {
                    self.quant(x, l.ffn_norm.ptr, 0, fq, fd, m, c.hidden_size)?;
                }
                let (dq, dd) =
                    (s.xq8b.ptr + (r0 * c.ffn_size) as u64, s.xdsb.ptr + (r0 * (c.ffn_size / 32) * 8) as u64);
                let mut down_in_q8 = false;
                if l.gate.ty == l.up.ty {
                    let pt = q8_threads(l.gate.cols, l.gate.rows, self.opts.q8_iters, 32);
                    let mr = pick_mr(m);
                    down_in_q8 = guq_fused(pt) && self.opts.gu_fuse;
                    let (ty, kc, n) = (l.gate.ty, l.gate.cols, l.gate.rows);
                    let args =
                        Args(vec![l.gate.buf.ptr, l.up.buf.ptr, fq, fd, gate, i(m), i(n), dq, dd, x, l.ffn_norm.ptr]);
                    let (rows_per_block, threads) = if down_in_q8 { (32, 32 * pt) } else { (128 / pt, 128) };
                    self.launch(
                        K::Guq { ty, k: kc, p: pt, mr },
                        (n.div_ceil(rows_per_block) as u32, m.div_ceil(mr) as u32, 1),
                        threads as u32,
                        args,
                    )?;
                } else {
                    self.mmvq(&l.gate, fq, fd, gate, None, m, false)?;
                    self.mmvq(&l.up, fq, fd, up, None, m, false)?;
                    let n = m * c.ffn_size;
                    self.launch(K::SiluMul, (n.div_ceil(256) as u32, 1, 1), 256, Args(vec![gate, up, i(n)]))?;
                }
                if !down_in_q8 {
                    self.quant(gate, 0, 0, dq, dd, m, c.ffn_size)?;
                }
                self.mmvq(&l.down, dq, dd, x, None, m, true)?;
                continue;
            }
            self.mmv(&l.wo, att, x, None, m, true)?;
            self.pdl_scope.set(false);
            let mut memo = None;
            if l.gate.ty == l.up.ty {
                self.launch(K::RmsNorm, (mu, 1, 1), 256, Args(vec![x, l.ffn_norm.ptr, xn, 0]))?;
                let xin = self.act(&l.gate, xn, m, &mut memo)?;
                let mr = pick_mr(m);
                let grid = (l.gate.rows.div_ceil(4) as u32, m.div_ceil(mr) as u32, 1);
                self.launch(
                    K::Gu { ty: l.gate.ty, k: l.gate.cols, mr },
                    grid,
                    128,
                    Args(vec![l.gate.buf.ptr, l.up.buf.ptr, xin, gate, i(m), i(l.gate.rows)]),
                )?;
            } else {
                self.launch(K::RmsNorm, (mu, 1, 1), 256, Args(vec![x, l.ffn_norm.ptr, xn, 0]))?;
                self.mmv_m(&l.gate, xn, gate, None, m, false, &mut memo)?;
                self.mmv_m(&l.up, xn, up, None, m, false, &mut memo)?;
                let n = m * c.ffn_size;
                self.launch(K::SiluMul, (n.div_ceil(256) as u32, 1, 1), 256, Args(vec![gate, up, i(n)]))?;
            }
            self.mmv(&l.down, gate, x, None, m, true)?;
        }
        Ok(())
    }
}
