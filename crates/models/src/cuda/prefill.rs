//! Long chunks (prefill) on tensor cores: each weight matrix dequantized to f16 into scratch and multiplied with
//! cuBLAS, attention as cuBLAS GEMMs around a causal softmax over the sequence's gathered paged cache.

use backend::cuda::{BlasMat, BlasType, DevBuf};
use backend::{AttentionWeights, Norm};

use super::ATT_BLOCK_ROWS;
use super::fused::{FusedBackend, GMat, KvPool};
use super::kernels::Kernel as K;
use super::layer::{Args, SegRows, i};
use super::meta::GemmChunk;
use crate::Result;

/// Buffers of the tensor-core path, for `cap_m` rows and sequences up to `cap_kv` positions.
pub(super) struct GemmScratch {
    pub(super) cap_m: usize,
    pub(super) cap_kv: usize,
    /// f16 activations.
    pub(super) xh: DevBuf,
    /// One dequantized weight matrix (f16).
    pub(super) wh: DevBuf,
    /// f16 queries.
    pub(super) qh: DevBuf,
    /// The chunk's sequence's K and V, contiguous f16.
    pub(super) kg: DevBuf,
    pub(super) vg: DevBuf,
    /// Attention scores (f32) and probabilities (f16) of one block of query rows.
    pub(super) s: DevBuf,
    pub(super) p: DevBuf,
}

impl FusedBackend {
    /// The attention sub-layer of layer `li` for the rows of one long chunk (`gc`) on tensor cores: each matrix
    /// dequantized to f16 and multiplied with cuBLAS, attention as GEMMs over the gathered cache
    /// ([`Self::gemm_attention`]).
    pub(super) fn gemm_attention_rows(
        &self,
        li: usize,
        w: &AttentionWeights<Self>,
        kv: &KvPool,
        gc: GemmChunk,
        rows: &SegRows,
    ) -> Result<()> {
        let c = &self.cfg;
        let SegRows { m, x, xn, q, k, v, att, pos, slot, table, .. } = *rows;
        let mu = m as u32;
        let gs = self.gemm_scratch.as_ref().expect("INVARIANT: ensure_gemm_scratch ran");
        self.launch(K::RmsNorm, (mu, 1, 1), 256, Args(vec![x, w.norm.weight.ptr, xn, 0]))?;
        self.to_f16(xn, gs.xh.ptr, m * c.hidden_size)?;
        self.gemm_linear(&w.wq, gs.xh.ptr, q, w.bq.as_ref(), m, false)?;
        self.gemm_linear(&w.wk, gs.xh.ptr, k, w.bk.as_ref(), m, false)?;
        self.gemm_linear(&w.wv, gs.xh.ptr, v, w.bv.as_ref(), m, false)?;
        self.qk_norm_rope_kv(w, (kv, li), [q, k, v], [pos, slot, table], mu)?;
        self.gemm_attention((kv, li), gc, q, att, m)?;
        self.to_f16(att, gs.xh.ptr, m * c.q_dim())?;
        self.gemm_linear(&w.wo, gs.xh.ptr, x, None, m, true)
    }

    /// The FFN sub-layer for the rows of one long chunk on tensor cores.
    pub(super) fn gemm_ffn_rows(&self, norm: &Norm<DevBuf>, [wg, wu, wd]: [&GMat; 3], rows: &SegRows) -> Result<()> {
        let c = &self.cfg;
        let SegRows { m, x, xn, gate, up, .. } = *rows;
        let gs = self.gemm_scratch.as_ref().expect("INVARIANT: ensure_gemm_scratch ran");
        self.launch(K::RmsNorm, (m as u32, 1, 1), 256, Args(vec![x, norm.weight.ptr, xn, 0]))?;
        self.to_f16(xn, gs.xh.ptr, m * c.hidden_size)?;
        self.gemm_linear(wg, gs.xh.ptr, gate, None, m, false)?;
        self.gemm_linear(wu, gs.xh.ptr, up, None, m, false)?;
        let n = m * c.ffn_size;
        self.launch(K::SiluMul, (n.div_ceil(256) as u32, 1, 1), 256, Args(vec![gate, up, i(n)]))?;
        self.to_f16(gate, gs.xh.ptr, n)?;
        self.gemm_linear(wd, gs.xh.ptr, x, None, m, true)
    }

    /// out[0..n) = f16(x[0..n)).
    pub(super) fn to_f16(&self, x: u64, out: u64, n: usize) -> Result<()> {
        self.launch(K::ToF16, (n.div_ceil(4 * 256) as u32, 1, 1), 256, Args(vec![x, out, i(n)]))
    }

    /// Y[m, N] (+)= X[m, K] W^T (+ bias) on tensor cores: W dequantized to f16 into scratch, X already f16 at `xh`.
    pub(super) fn gemm_linear(
        &self,
        w: &GMat,
        xh: u64,
        y: u64,
        bias: Option<&DevBuf>,
        m: usize,
        residual: bool,
    ) -> Result<()> {
        let gs = self.gemm_scratch.as_ref().expect("INVARIANT: ensure_gemm_scratch ran");
        let blas = self.blas.as_ref().expect("INVARIANT: GEMM segments only exist with cuBLAS");
        let units = w.rows * (w.cols / 32);
        self.launch(
            K::Dequant { ty: w.ty, k: w.cols },
            (units.div_ceil(256) as u32, 1, 1),
            256,
            Args(vec![w.buf.ptr, gs.wh.ptr, i(w.rows)]),
        )?;
        blas.gemm(
            true,
            false,
            (w.rows, m, w.cols),
            1.0,
            BlasMat::new(gs.wh.ptr, BlasType::F16, w.cols),
            BlasMat::new(xh, BlasType::F16, w.cols),
            if residual { 1.0 } else { 0.0 },
            BlasMat::new(y, BlasType::F32, w.rows),
            1,
        )?;
        if let Some(b) = bias {
            let n = m * w.rows;
            self.launch(K::AddBias, (n.div_ceil(256) as u32, 1, 1), 256, Args(vec![y, b.ptr, i(w.rows), i(n)]))?;
        }
        Ok(())
    }

    /// Causal attention of the `m` rows of one long chunk (queries `q`, rotated, f32) over its sequence's paged
    /// cache, on tensor cores: K and V gathered into contiguous f16 matrices, then per block of query rows scores
    /// (cuBLAS, f32), a causal softmax to f16 probabilities and the weighted sum of V (cuBLAS) into `att`.
    pub(super) fn gemm_attention(
        &self,
        (kv, li): (&KvPool, usize),
        gc: GemmChunk,
        q: u64,
        att: u64,
        m: usize,
    ) -> Result<()> {
        let gs = self.gemm_scratch.as_ref().expect("INVARIANT: ensure_gemm_scratch ran");
        let blas = self.blas.as_ref().expect("INVARIANT: GEMM segments only exist with cuBLAS");
        let c = &self.cfg;
        let (d, kvd, qd) = (c.head_dim, c.kv_dim(), c.q_dim());
        let group = c.num_heads / c.num_kv_heads;
        let kv_len = gc.start_pos + m;
        let table = self.meta.table + (gc.ci * self.max_pages * 4) as u64;
        self.launch(
            K::KvGather,
            (kv_len as u32, 1, 1),
            128,
            Args(vec![kv.kc[li].ptr, kv.vc[li].ptr, table, gs.kg.ptr, gs.vg.ptr]),
        )?;
        self.to_f16(q, gs.qh.ptr, m * qd)?;
        let scale = 1.0 / (d as f32).sqrt();
        let (h2, f4) = (2u64, 4u64);
        let mut i0 = 0;
        while i0 < m {
            let nb = ATT_BLOCK_ROWS.min(m - i0);
            let kv = gc.start_pos + i0 + nb;
            // Score rows padded to 8 elements (16-byte aligned f16 rows for the tensor cores).
            let ld = kv.next_multiple_of(8);
            for g in 0..c.num_kv_heads {
                blas.gemm(
                    true,
                    false,
                    (kv, nb, d),
                    scale,
                    BlasMat::new(gs.kg.ptr + (g * d) as u64 * h2, BlasType::F16, kvd),
                    BlasMat::new(gs.qh.ptr + (i0 * qd + g * group * d) as u64 * h2, BlasType::F16, qd).strided(d),
                    0.0,
                    BlasMat::new(gs.s.ptr + (g * group * nb * ld) as u64 * f4, BlasType::F32, ld).strided(nb * ld),
                    group,
                )?;
            }
            self.launch(
                K::SoftmaxCausal,
                (nb as u32, c.num_heads as u32, 1),
                256,
                Args(vec![gs.s.ptr, gs.p.ptr, i(ld), i(gc.start_pos + i0)]),
            )?;
            for g in 0..c.num_kv_heads {
                blas.gemm(
                    false,
                    false,
                    (d, nb, kv),
                    1.0,
                    BlasMat::new(gs.vg.ptr + (g * d) as u64 * h2, BlasType::F16, kvd),
                    BlasMat::new(gs.p.ptr + (g * group * nb * ld) as u64 * h2, BlasType::F16, ld).strided(nb * ld),
                    0.0,
                    BlasMat::new(att + (i0 * qd + g * group * d) as u64 * f4, BlasType::F32, qd).strided(d),
                    group,
                )?;
            }
            i0 += nb;
        }
        Ok(())
    }

    /// GEMM scratch for `m` rows, `r` logit rows and sequences up to `kv` positions.
    pub(super) fn ensure_gemm_scratch(&mut self, m: usize, r: usize, kv: usize) -> Result<()> {
        let c = &self.cfg;
        let rows = m.max(r);
        let kv = kv.next_multiple_of(1024);
        if let Some(g) = &self.gemm_scratch
            && g.cap_m >= rows
            && g.cap_kv >= kv
        {
            return Ok(());
        }
        let (old_m, old_kv) = self.gemm_scratch.as_ref().map_or((0, 0), |g| (g.cap_m, g.cap_kv));
        let (rows, kv) = (rows.max(old_m), kv.max(old_kv));
        self.gemm_scratch = None;
        let max_w = self.max_matrix;
        let g = &self.gpu;
        let width = c.hidden_size.max(c.q_dim()).max(c.ffn_size);
        let att = c.num_heads * ATT_BLOCK_ROWS.min(rows) * kv;
        self.gemm_scratch = Some(GemmScratch {
            cap_m: rows,
            cap_kv: kv,
            xh: g.alloc(rows * width * 2)?,
            wh: g.alloc(max_w * 2)?,
            qh: g.alloc(rows * c.q_dim() * 2)?,
            kg: g.alloc(kv * c.kv_dim() * 2)?,
            vg: g.alloc(kv * c.kv_dim() * 2)?,
            s: g.alloc(att * 4)?,
            p: g.alloc(att * 2)?,
        });
        Ok(())
    }
}
