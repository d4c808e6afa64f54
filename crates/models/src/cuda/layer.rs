//! The fused backend's launches on the matrix-vector kernels, for the rows of one segment: the attention sub-layer
//! (its RMSNorm and the Q, K, V products fused into one launch where the model allows, RoPE and the KV write, the
//! paged attention, the output projection with the residual add), the FFN sub-layer (RMSNorm, gate/up, down with
//! the residual add); and the output head with what the pass picks. Long chunks go to `prefill`.

use std::ffi::c_void;

use backend::cuda::DevBuf;

use backend::{AttentionWeights, Norm};

use super::fused::{FusedBackend, GMat, KvPool, Pick};
use super::kernels::{Kernel as K, guq_fused, warps_per_row};
use super::tactics::{act_fmt, att_splits, pick_mr, q8_threads};
use super::{ARGMAX_BLOCKS, DEVICE_CANDIDATES, GEMM_MIN_ROWS, ROPE_THREADS, TOPK_BLOCKS};
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
    /// The segment's first row in the pass, and its rows.
    pub r0: usize,
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

impl FusedBackend {
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
        let s = self.scratch();
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
        w: &AttentionWeights<Self>,
        (kv, li): (&KvPool, usize),
        [q, k, v]: [u64; 3],
        [pos, slot, table]: [u64; 3],
        mu: u32,
    ) -> Result<()> {
        if let (Some(qn), Some(kn)) = (&w.q_norm, &w.k_norm) {
            self.launch(K::QkNorm, (mu, 1, 1), 128, Args(vec![q, k, qn.weight.ptr, kn.weight.ptr]))?;
        }
        let pairs = (self.cfg.num_heads + self.cfg.num_kv_heads) * self.cfg.head_dim / 2;
        self.launch(
            K::RopeKv,
            (mu, pairs.div_ceil(ROPE_THREADS as usize) as u32, 1),
            ROPE_THREADS,
            Args(vec![q, k, v, self.inv_freq.ptr, pos, slot, table, kv.kc[li].ptr, kv.vc[li].ptr]),
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

    /// The output head over the pass's `r` logit rows (the metadata's `out_rows` of `x`, `m` rows in all): RMSNorm
    /// (fused into the 8-bit quantization of its input), the head's product into `logits`; then the pass's pick.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn head(
        &self,
        m: usize,
        r: usize,
        x: u64,
        xn: u64,
        norm: &Norm<DevBuf>,
        out: &GMat,
        logits: u64,
    ) -> Result<()> {
        let s = self.scratch();
        let h = self.cfg.hidden_size;
        let gemm = r >= GEMM_MIN_ROWS && self.blas.is_some() && self.opts.gemm;
        if out.q8 && !gemm {
            self.quant(x, norm.weight.ptr, self.meta.out_rows, s.xq8.ptr, s.xds.ptr, r, h)?;
            self.mmvq(out, s.xq8.ptr, s.xds.ptr, logits, None, r, false)?;
        } else {
            self.launch(K::RmsNorm, (r as u32, 1, 1), 256, Args(vec![x, norm.weight.ptr, xn, self.meta.out_rows]))?;
            if gemm {
                let gs = self.gemm_scratch.as_ref().expect("INVARIANT: ensure_gemm_scratch ran for r rows");
                self.to_f16(xn, gs.xh.ptr, r * h)?;
                self.gemm_linear(out, gs.xh.ptr, logits, None, r, false)?;
            } else {
                self.mmv(out, xn, logits, None, r, false)?;
            }
        }
        let vocab = self.cfg.vocab_size;
        match self.pick {
            Pick::None => {}
            Pick::Candidates => {
                let c = DEVICE_CANDIDATES.min(vocab);
                let (flags, keys) = (s.cand.ptr, s.cand.ptr + (r * TOPK_BLOCKS * 4) as u64);
                let args = vec![logits, i(vocab), i(c), keys, flags];
                self.launch(K::TopkRows, (r as u32, TOPK_BLOCKS as u32, 1), 1024, Args(args))?;
            }
            Pick::Argmax | Pick::Top => {
                let probs = if self.pick == Pick::Top { s.probs.ptr } else { 0 };
                // One row of one token: its pick also feeds the next pass, should that pass have started ahead.
                let (feed, ring) = if m == 1 && r == 1 { (self.meta.tokens, self.ahead_ring.addr()) } else { (0, 0) };
                let args = vec![logits, i(vocab), s.ids.ptr, probs, s.row_part.ptr, s.row_counters.ptr, feed, ring];
                self.launch(K::ArgmaxRows, (r as u32, ARGMAX_BLOCKS as u32, 1), 256, Args(args))?;
            }
        }
        Ok(())
    }

    /// The attention sub-layer of layer `li` for one segment's rows on the matrix-vector kernels: `x += Wo ·
    /// attention(...)`, keys and values written to `kv`.
    pub(super) fn attention_rows(
        &self,
        li: usize,
        w: &AttentionWeights<Self>,
        kv: &KvPool,
        rows: &SegRows,
    ) -> Result<()> {
        let s = self.scratch();
        let c = &self.cfg;
        let SegRows { r0, m, x, xn, q, k, v, att, pos, slot, table, .. } = *rows;
        let mu = m as u32;
        let p = |b: &Option<DevBuf>| b.as_ref().map_or(0, |b| b.ptr);
        // The fused kernel re-reads the activations and norm weights per weight row (from L1): it pays for small
        // models only (measured: 1.5B faster, 32B slower). Chosen per model, never per batch, so a sequence's
        // results do not depend on the batch it runs in.
        let fused = !self.opts.exact_activations
            && c.hidden_size <= 2048
            && c.rope_dim == c.head_dim
            && !c.qk_norm
            && c.head_dim.is_multiple_of(2);
        let q8 = w.wq.q8;
        // Rows of the 8-bit activation scratch for an input of width k (this segment's rows).
        let qb = |k: usize| (s.xq8.ptr + (r0 * k) as u64, s.xds.ptr + (r0 * (k / 32) * 8) as u64);
        let norm = w.norm.weight.ptr;
        // The arguments the QKV kernels share: the three matrices, then (after their input) the three biases.
        let (wqkv, bias) = ([w.wq.buf.ptr, w.wk.buf.ptr, w.wv.buf.ptr], [p(&w.bq), p(&w.bk), p(&w.bv)]);
        if q8 {
            // Attention RMSNorm + 8-bit quantization (in the QKV kernel's prologue with `fuse_norm`), then Q, K,
            // V in one launch (dp4a), with RoPE and the KV write in its epilogue (`qkv_rope`).
            let (xq, xd) = qb(c.hidden_size);
            if !self.opts.fuse_norm {
                self.quant(x, norm, 0, xq, xd, m, c.hidden_size)?;
            }
            let n = c.q_dim() + 2 * c.kv_dim();
            let pt = q8_threads(c.hidden_size, n, self.opts.q8_iters, 32);
            let mr = pick_mr(m);
            let rope_kv = [x, norm, self.inv_freq.ptr, pos, slot, table, kv.kc[li].ptr, kv.vc[li].ptr];
            self.launch(
                K::Qkvq { t: [w.wq.ty, w.wk.ty, w.wv.ty], p: pt, mr },
                (n.div_ceil(128 / pt) as u32, m.div_ceil(mr) as u32, 1),
                128,
                Args([&wqkv[..], &[xq, xd], &bias, &[q, k, v, i(m)], &rope_kv].concat()),
            )?;
            if !self.opts.qkv_rope {
                self.qk_norm_rope_kv(w, (kv, li), [q, k, v], [pos, slot, table], mu)?;
            }
        } else {
            if fused {
                // RMSNorm fused into one launch of the three projections.
                let mr = pick_mr(m);
                let n = c.q_dim() + 2 * c.kv_dim();
                self.launch(
                    K::Qkv { t: [w.wq.ty, w.wk.ty, w.wv.ty], mr },
                    (n.div_ceil(4) as u32, m.div_ceil(mr) as u32, 1),
                    128,
                    Args([&wqkv[..], &[x, norm], &bias, &[q, k, v, i(m)]].concat()),
                )?;
            } else {
                self.launch(K::RmsNorm, (mu, 1, 1), 256, Args(vec![x, norm, xn, 0]))?;
                let mut memo = None;
                self.mmv_m(&w.wq, xn, q, w.bq.as_ref(), m, false, &mut memo)?;
                self.mmv_m(&w.wk, xn, k, w.bk.as_ref(), m, false, &mut memo)?;
                self.mmv_m(&w.wv, xn, v, w.bv.as_ref(), m, false, &mut memo)?;
            }
            self.qk_norm_rope_kv(w, (kv, li), [q, k, v], [pos, slot, table], mu)?;
        }
        // Decode batches split the positions most: into one cluster of `att_cl` splits while the contexts fit.
        let splits = att_splits(m, self.att_sg);
        let cl = self.att_cl && m <= self.opts.att_cl_rows && splits >= self.opts.att_cl;
        // From the attention to its output projection, kernels start while the one before drains, in graphs too.
        self.pdl_scope.set(self.opts.graph_pdl_att);
        self.launch(
            if cl { K::AttentionCl } else { K::Attention },
            (mu, c.num_heads as u32, if cl { self.opts.att_cl } else { splits } as u32),
            (32 * self.opts.att_warps) as u32,
            Args(vec![
                q,
                kv.kc[li].ptr,
                kv.vc[li].ptr,
                pos,
                slot,
                table,
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
            self.mmvq(&w.wo, aq, ad, x, None, m, true)?;
        } else {
            self.mmv(&w.wo, att, x, None, m, true)?;
        }
        self.pdl_scope.set(false);
        Ok(())
    }

    /// The FFN sub-layer (`norm`, `[gate, up, down]`) for one segment's rows on the matrix-vector kernels:
    /// `x += down(silu(gate · n) * (up · n))`, `n = norm(x)`.
    pub(super) fn ffn_rows(&self, norm: &Norm<DevBuf>, [wg, wu, wd]: [&GMat; 3], rows: &SegRows) -> Result<()> {
        let s = self.scratch();
        let c = &self.cfg;
        let SegRows { r0, m, x, xn, gate, up, .. } = *rows;
        let mu = m as u32;
        let norm = norm.weight.ptr;
        if wg.q8 {
            let (fq, fd) =
                (s.xq8.ptr + (r0 * c.hidden_size) as u64, s.xds.ptr + (r0 * (c.hidden_size / 32) * 8) as u64);
            // The gate/up kernel normalises and quantizes its input itself with `fuse_norm`.
            if !(self.opts.fuse_norm && wg.ty == wu.ty) {
                self.quant(x, norm, 0, fq, fd, m, c.hidden_size)?;
            }
            let (dq, dd) = (s.xq8b.ptr + (r0 * c.ffn_size) as u64, s.xdsb.ptr + (r0 * (c.ffn_size / 32) * 8) as u64);
            let mut down_in_q8 = false;
            if wg.ty == wu.ty {
                let pt = q8_threads(wg.cols, wg.rows, self.opts.q8_iters, 32);
                let mr = pick_mr(m);
                down_in_q8 = guq_fused(pt) && self.opts.gu_fuse;
                let (ty, kc, n) = (wg.ty, wg.cols, wg.rows);
                let args = Args(vec![wg.buf.ptr, wu.buf.ptr, fq, fd, gate, i(m), i(n), dq, dd, x, norm]);
                let (rows_per_block, threads) = if down_in_q8 { (32, 32 * pt) } else { (128 / pt, 128) };
                self.launch(
                    K::Guq { ty, k: kc, p: pt, mr },
                    (n.div_ceil(rows_per_block) as u32, m.div_ceil(mr) as u32, 1),
                    threads as u32,
                    args,
                )?;
            } else {
                self.mmvq(wg, fq, fd, gate, None, m, false)?;
                self.mmvq(wu, fq, fd, up, None, m, false)?;
                let n = m * c.ffn_size;
                self.launch(K::SiluMul, (n.div_ceil(256) as u32, 1, 1), 256, Args(vec![gate, up, i(n)]))?;
            }
            if !down_in_q8 {
                self.quant(gate, 0, 0, dq, dd, m, c.ffn_size)?;
            }
            return self.mmvq(wd, dq, dd, x, None, m, true);
        }
        let mut memo = None;
        self.launch(K::RmsNorm, (mu, 1, 1), 256, Args(vec![x, norm, xn, 0]))?;
        if wg.ty == wu.ty {
            let xin = self.act(wg, xn, m, &mut memo)?;
            let mr = pick_mr(m);
            let grid = (wg.rows.div_ceil(4) as u32, m.div_ceil(mr) as u32, 1);
            self.launch(
                K::Gu { ty: wg.ty, k: wg.cols, mr },
                grid,
                128,
                Args(vec![wg.buf.ptr, wu.buf.ptr, xin, gate, i(m), i(wg.rows)]),
            )?;
        } else {
            self.mmv_m(wg, xn, gate, None, m, false, &mut memo)?;
            self.mmv_m(wu, xn, up, None, m, false, &mut memo)?;
            let n = m * c.ffn_size;
            self.launch(K::SiluMul, (n.div_ceil(256) as u32, 1, 1), 256, Args(vec![gate, up, i(n)]))?;
        }
        self.mmv(wd, gate, x, None, m, true)
    }
}
