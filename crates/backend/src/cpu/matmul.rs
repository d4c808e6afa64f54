//! Quantized matrix products `y = x · Wᵀ` on the CPU, spread over the thread pool.
//!
//! Several matrices that share one input (Q, K and V; gate and up) run as one pool job, and the input is quantized
//! once per activation format. Work is split into chunks of weight rows handed out dynamically; inside a chunk the
//! kernel walks the input rows in blocks that stay in cache. Each output element is bitwise independent of `m`, the
//! chunking and the thread count (the kernels' canonical order), so batching never changes a sequence's results.

use std::ops::Range;
use std::sync::Arc;

use gguf::GgmlType;

use super::ThreadPool;
use super::quant::{self, ActFormat, Layout, q4k_pairs, q6k_pairs, q50_quads};

/// Bytes kept alive by their owner (a memory-mapped file, or a buffer of prepared weights).
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl Bytes {
    /// A view of `range` inside `owner`; `None` if the range is out of bounds.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Option<Self> {
        ((*owner).as_ref().get(range.clone()).is_some()).then_some(Bytes { owner, range })
    }

    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        Bytes { owner: Arc::new(v), range: 0..len }
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }

    /// The first `len` bytes (all of them if there are fewer).
    pub fn prefix(&self, len: usize) -> Bytes {
        let end = self.range.start + len.min(self.range.len());
        Bytes { owner: self.owner.clone(), range: self.range.start..end }
    }
}

/// A weight matrix of `rows` rows of `cols` elements each, stored as GGUF blocks of type `ty`, either as they are in
/// the file or repacked for this machine's kernels (`layout`).
#[derive(Clone)]
pub struct QMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub layout: Layout,
    pub bytes: Bytes,
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QMatrix({} {}x{})", self.ty, self.rows, self.cols)
    }
}

impl QMatrix {
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.cols).expect("INVARIANT: validated at construction")
    }

    /// The matrix of its first `rows` rows (all of them if it has fewer), sharing the bytes.
    pub fn first_rows(&self, rows: usize) -> QMatrix {
        let rows = rows.min(self.rows);
        let len = self.layout.matrix_bytes(self.ty, rows, self.cols).expect("INVARIANT: validated at construction");
        QMatrix { rows, bytes: self.bytes.prefix(len), ..self.clone() }
    }

    /// Copies row `r` in the file's (GGUF) block layout into `out` (`row_bytes()` long), whatever this matrix's layout.
    pub fn copy_row_gguf(&self, r: usize, out: &mut [u8]) {
        let rb = self.row_bytes();
        match self.layout {
            Layout::Gguf => out[..rb].copy_from_slice(&self.bytes.as_slice()[r * rb..(r + 1) * rb]),
            Layout::Q4KPairs => q4k_pairs::unpack_row(self.bytes.as_slice(), self.cols, r, &mut out[..rb]),
            Layout::Q6KPairs => q6k_pairs::unpack_row(self.bytes.as_slice(), self.cols, r, &mut out[..rb]),
            Layout::Q50Quads => q50_quads::unpack_row(&self.bytes.as_slice()[r * rb..(r + 1) * rb], &mut out[..rb]),
        }
    }

    /// The matrix of rows `rows` of this one, in that order (a copy, in the layout this machine prefers).
    pub fn gathered(&self, rows: &[u32], pool: &ThreadPool) -> QMatrix {
        let rb = self.row_bytes();
        let mut bytes = vec![0u8; rows.len() * rb];
        for (out, &r) in bytes.chunks_exact_mut(rb).zip(rows) {
            self.copy_row_gguf(r as usize, out);
        }
        let m = QMatrix { rows: rows.len(), layout: Layout::Gguf, bytes: Bytes::from_vec(bytes), ..self.clone() };
        m.repacked(pool).unwrap_or(m)
    }

    /// Dequantizes row `r` into `out` (embedding lookups).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        let mut restored = Vec::new();
        let bytes = if self.layout == Layout::Gguf {
            &self.bytes.as_slice()[r * rb..(r + 1) * rb]
        } else {
            restored.resize(rb, 0);
            self.copy_row_gguf(r, &mut restored);
            &restored
        };
        gguf::quant::dequantize(self.ty, bytes, &mut out[..self.cols])
            .expect("INVARIANT: supported type, exact length");
    }

    /// This matrix in the layout this machine's kernels prefer for its type ([`quant::preferred_layout`]), packed on
    /// `pool`; `None` when that is the layout it has.
    pub fn repacked(&self, pool: &ThreadPool) -> Option<QMatrix> {
        if self.layout != Layout::Gguf {
            return None;
        }
        let layout = quant::preferred_layout(self.ty);
        if layout == Layout::Gguf {
            return None;
        }
        let (rows, k) = (self.rows, self.cols);
        let len = layout.matrix_bytes(self.ty, rows, k)?;
        // Anonymous pages (page-aligned, so no vector load of the kernels splits a cache line), on huge pages where
        // the kernel allows: the kernels stream every byte once per token, and 4 KiB pages cost TLB misses and
        // half a million page faults at load for a 1.5B model. Out of memory: keep the file's layout.
        let mut buf = memmap2::MmapMut::map_anon(len.max(1)).ok()?;
        #[cfg(target_os = "linux")]
        let _ = buf.advise(memmap2::Advice::HugePage);
        let dst = OutPtr(buf.as_mut_ptr() as *mut f32);
        let src = self.bytes.as_slice();
        let ty = self.ty;
        let unit_rows = layout.unit_rows();
        let unit_bytes = layout.matrix_bytes(ty, unit_rows, k)?;
        pool.for_each_chunk(rows.div_ceil(unit_rows), 64, &|units| {
            #[allow(clippy::redundant_locals)]
            let dst = dst;
            // SAFETY: each chunk writes its own units' bytes, inside the mapping.
            let out = unsafe {
                std::slice::from_raw_parts_mut(
                    (dst.0 as *mut u8).add(units.start * unit_bytes),
                    units.len() * unit_bytes,
                )
            };
            quant::pack(layout, ty, src, rows, k, units, out);
        });
        let bytes = Bytes::new(Arc::new(buf.make_read_only().ok()?), 0..len).expect("INVARIANT: within the mapping");
        Some(QMatrix { layout, bytes, ..self.clone() })
    }
}

/// A raw output pointer shared by threads that write disjoint elements.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);
// SAFETY: every thread writes a disjoint set of indices (its own weight rows), see `matmul`.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Input rows per kernel call: keeps the quantized input block in L2 while a chunk of weight rows streams past it.
pub(super) const M_BLOCK: usize = 64;

/// `outs[i][t * ws[i].rows + r] = x[t] · ws[i][r]` for every matrix `i`, input row `t < m` and weight row `r`.
///
/// `x` is `[m, cols]`; every matrix must have the same `cols`; `outs[i]` is `[m, ws[i].rows]`.
pub fn matmul(pool: &ThreadPool, ws: &[&QMatrix], x: &[f32], m: usize, outs: &mut [&mut [f32]]) {
    assert_eq!(ws.len(), outs.len());
    let k = ws[0].cols;
    assert!(ws.iter().all(|w| w.cols == k), "matmul: matrices disagree on the input size");
    assert!(x.len() >= m * k);
    for (w, o) in ws.iter().zip(outs.iter()) {
        assert!(o.len() >= m * w.rows, "matmul: output too small for {w:?}");
    }

    // Quantize the input once per distinct activation format.
    let mut formats: Vec<(ActFormat, usize, Vec<u8>)> = Vec::new();
    for w in ws {
        let fmt = quant::act_format(w.ty).expect("INVARIANT: weight types are checked at model load");
        if formats.iter().all(|(f, ..)| *f != fmt) {
            let rb = quant::act_row_bytes(fmt, k);
            let mut buf = vec![0u8; rb * m];
            let ptr = OutPtr(buf.as_mut_ptr() as *mut f32);
            pool.for_each_chunk(m, 16, &|rows| {
                // Captures the whole `OutPtr` (Sync), not its raw pointer field.
                #[allow(clippy::redundant_locals)]
                let ptr = ptr;
                for t in rows {
                    // SAFETY: each input row is written by exactly one chunk.
                    let dst = unsafe { std::slice::from_raw_parts_mut((ptr.0 as *mut u8).add(t * rb), rb) };
                    quant::quantize_act_row(fmt, &x[t * k..(t + 1) * k], dst);
                }
            });
            formats.push((fmt, rb, buf));
        }
    }
    let acts: Vec<(&[u8], usize)> = ws
        .iter()
        .map(|w| {
            let fmt = quant::act_format(w.ty).expect("INVARIANT: checked above");
            let (_, rb, buf) = formats.iter().find(|(f, ..)| *f == fmt).expect("INVARIANT: quantized above");
            (buf.as_slice(), *rb)
        })
        .collect();

    // One virtual row space over all matrices, cut into chunks that never straddle two matrices. Up to 8 input rows
    // the kernels stream each weight row once: long contiguous runs keep the hardware prefetchers busy (many short
    // runs read DRAM at half speed), while a few chunks per thread still even out a slow thread.
    let chunk_rows = if m <= 8 { 256 } else { 16 };
    let mut chunks: Vec<(usize, Range<usize>)> = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        let mut r = 0;
        while r < w.rows {
            let end = (r + chunk_rows).min(w.rows);
            chunks.push((i, r..end));
            r = end;
        }
    }
    let out_ptrs: Vec<OutPtr> = outs.iter_mut().map(|o| OutPtr(o.as_mut_ptr())).collect();
    pool.for_each_chunk(chunks.len(), 1, &|range| {
        for c in range {
            let (i, ref rows) = chunks[c];
            let w = ws[i];
            let (act, act_rb) = acts[i];
            let out = out_ptrs[i];
            let mut t0 = 0;
            while t0 < m {
                let mb = M_BLOCK.min(m - t0);
                // SAFETY: this chunk alone writes rows `rows` of matrix `i`, for input rows t0..t0+mb.
                unsafe {
                    quant::matmul_rows_in(
                        w.layout,
                        w.ty,
                        w.bytes.as_slice(),
                        k,
                        rows.clone(),
                        &act[t0 * act_rb..(t0 + mb) * act_rb],
                        mb,
                        out.0.add(t0 * w.rows),
                        w.rows,
                    );
                }
                t0 += mb;
            }
        }
    });
}
