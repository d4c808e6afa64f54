//! Long chunks (prefill) on tensor cores: each weight matrix dequantized to f16 into scratch and multiplied with
//! cuBLAS, attention as one fused causal flash-attention kernel over the sequence's paged cache
//! (`flash_attention.cu`, split over the positions for short chunks after a long context).

use backend::cuda::{BlasMat, BlasType, DevBuf};
use backend::{AttentionWeights, Norm};

use super::PAGE_SIZE;
use super::fused::{FusedBackend, GMat, KvPool};
use super::kernels::Kernel as K;
use super::layer::{Args, SegRows, i};
use super::meta::GemmChunk;
use super::moe::MoeGemmScratch;
use crate::{Error, Result};

/// `flash_attention` blocks a chunk's attention should fill the GPU with (two per SM of an H200) before it is split
/// over the positions too; from the chunk's shape alone, so a sequence's results never depend on its batch.
const FLASH_MIN_BLOCKS: usize = 264;
/// Fewest positions one split takes.
const FLASH_MIN_SPLIT_KEYS: usize = 512;

/// How `flash_attention` covers `m` query rows at positions `start_pos..`: (row blocks, splits, positions per
/// split, a multiple of [`PAGE_SIZE`]); `group` query heads per KV head, `warps` warps of 16 flattened (position,
/// head) rows per block. Mirrored by `flash_plan` in scripts/cuda/flash_attn_test.py.
pub(super) fn flash_plan(
    m: usize,
    start_pos: usize,
    group: usize,
    kv_heads: usize,
    warps: usize,
) -> (usize, usize, usize) {
    let row_blocks = (m * group).div_ceil(16 * warps);
    let keys = (start_pos + m).next_multiple_of(PAGE_SIZE);
    let mut splits = 1;
    if kv_heads * row_blocks < FLASH_MIN_BLOCKS {
        splits = FLASH_MIN_BLOCKS.div_ceil(kv_heads * row_blocks).min(keys / FLASH_MIN_SPLIT_KEYS).max(1);
    }
    let per_split = keys.div_ceil(splits).next_multiple_of(PAGE_SIZE);
    (row_blocks, keys.div_ceil(per_split), per_split)
}

/// Partial-output rows (splits x rows x heads) the split attention needs at most for `warps`: splits only happen
/// below [`FLASH_MIN_BLOCKS`] blocks, so fewer than twice that many blocks' rows.
fn flash_part_rows(warps: usize) -> usize {
    2 * FLASH_MIN_BLOCKS * 16 * warps
}

/// Buffers of the tensor-core path, for `cap_m` rows.
pub(super) struct GemmScratch {
    pub(super) cap_m: usize,
    /// f16 activations.
    pub(super) xh: DevBuf,
    /// One dequantized weight matrix (f16).
    pub(super) wh: DevBuf,
    /// The split attention's partial outputs `[split][row][head][head_dim]` and their log2 softmax denominators
    /// `[split][row][head]` (f32), [`flash_part_rows`] rows of each.
    pub(super) part: DevBuf,
    pub(super) lse: DevBuf,
}

impl FusedBackend {
    /// The attention sub-layer of layer `li` for the rows of one long chunk (`gc`) on tensor cores: each matrix
    /// dequantized to f16 and multiplied with cuBLAS, attention fused over the paged cache
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
    /// cache into `att`: one `flash_attention` launch (tensor cores, online softmax), plus `flash_combine` when the
    /// chunk is split over the positions ([`flash_plan`]).
    pub(super) fn gemm_attention(
        &self,
        (kv, li): (&KvPool, usize),
        gc: GemmChunk,
        q: u64,
        att: u64,
        m: usize,
    ) -> Result<()> {
        let gs = self.gemm_scratch.as_ref().expect("INVARIANT: ensure_gemm_scratch ran");
        let c = &self.cfg;
        let warps = self.opts.flash_warps;
        let table = self.meta.table + (gc.ci * self.max_pages * 4) as u64;
        let (row_blocks, splits, per_split) =
            flash_plan(m, gc.start_pos, c.num_heads / c.num_kv_heads, c.num_kv_heads, warps);
        if splits > 1 && splits * m * c.num_heads > flash_part_rows(warps) {
            return Err(Error::Backend(format!(
                "flash attention: {splits} splits of {m} rows exceed the scratch ({} rows)",
                flash_part_rows(warps)
            )));
        }
        self.launch(
            K::FlashAttention,
            (c.num_kv_heads as u32, row_blocks as u32, splits as u32),
            32 * warps as u32,
            Args(vec![
                q,
                kv.kc[li].ptr,
                kv.vc[li].ptr,
                table,
                att,
                gs.part.ptr,
                gs.lse.ptr,
                i(m),
                i(gc.start_pos),
                i(per_split),
            ]),
        )?;
        if splits > 1 {
            self.launch(
                K::FlashCombine,
                (m as u32, c.num_heads as u32, 1),
                c.head_dim as u32,
                Args(vec![gs.part.ptr, gs.lse.ptr, att, i(m), i(splits)]),
            )?;
        }
        Ok(())
    }

    /// GEMM scratch for `m` rows and `r` logit rows.
    pub(super) fn ensure_gemm_scratch(&mut self, m: usize, r: usize) -> Result<()> {
        let c = &self.cfg;
        let rows = m.max(r);
        if let Some(spec) = &self.moe
            && self.moe_gemm.as_ref().is_none_or(|g| g.cap_m < m)
        {
            self.moe_gemm = None;
            self.moe_gemm = Some(MoeGemmScratch::new(&self.gpu, c, spec, m)?);
        }
        if let Some(g) = &self.gemm_scratch
            && g.cap_m >= rows
        {
            return Ok(());
        }
        let rows = rows.max(self.gemm_scratch.as_ref().map_or(0, |g| g.cap_m));
        self.gemm_scratch = None;
        let max_w = self.max_matrix;
        let g = &self.gpu;
        let width = c.hidden_size.max(c.q_dim()).max(c.ffn_size);
        let part_rows = flash_part_rows(self.opts.flash_warps);
        self.gemm_scratch = Some(GemmScratch {
            cap_m: rows,
            xh: g.alloc(rows * width * 2)?,
            wh: g.alloc(max_w * 2)?,
            part: g.alloc(part_rows * c.head_dim * 4)?,
            lse: g.alloc(part_rows * 4)?,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long chunks fill the GPU with row blocks alone; short chunks after a long context are split over the
    /// positions (whole pages, every split non-empty, at least `FLASH_MIN_SPLIT_KEYS` each), and the partials always
    /// fit the scratch.
    #[test]
    fn flash_plan_splits_only_short_chunks_and_fits_the_scratch() {
        assert_eq!(flash_plan(16_384, 0, 6, 2, 4), (1536, 1, 16_384));
        assert_eq!(flash_plan(4096, 12_170, 5, 8, 8), (160, 1, 16_320));
        assert_eq!(flash_plan(74, 16_192, 6, 2, 4), (7, 19, 896));
        assert_eq!(flash_plan(17, 4096, 6, 2, 4), (2, 8, 576));
        assert_eq!(flash_plan(17, 0, 6, 2, 4), (2, 1, 64));
        for (group, kv_heads) in [(6, 2), (5, 8), (7, 2), (3, 3), (8, 1), (1, 16)] {
            for warps in [4, 8] {
                for m in [1, 17, 74, 100, 127, 128, 500, 4096] {
                    for start in [0, 63, 64, 1000, 4096, 16_192, 100_000] {
                        let (rb, splits, per) = flash_plan(m, start, group, kv_heads, warps);
                        let keys = (start + m).next_multiple_of(PAGE_SIZE);
                        assert!(rb * 16 * warps >= m * group && (rb - 1) * 16 * warps < m * group);
                        assert!(per % PAGE_SIZE == 0 && splits * per >= keys && (splits - 1) * per < keys);
                        if splits > 1 {
                            assert!(kv_heads * rb < FLASH_MIN_BLOCKS && per >= FLASH_MIN_SPLIT_KEYS);
                            assert!(splits * m * group * kv_heads <= flash_part_rows(warps), "{m} at {start}");
                        }
                    }
                }
            }
        }
    }
}
