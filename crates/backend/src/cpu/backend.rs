//! [`CpuBackend`]: the [`Backend`] trait over this module's kernels (the thread pool, the quantized matmul, the
//! flash-style attention). Every op runs synchronously on the calling thread and the pool; it is the reference the
//! other backends are tested against.

use super::attention::{self, SeqAttn};
use super::deltanet;
use super::experts;
use super::ops::{self, Rope};
use super::{QMatrix, ThreadPool, matmul};
use crate::{
    AttnRows, AttnShape, Backend, Error, ExpertGateUp, ExpertWeights, KvLayout, KvType, MatrixUse, Norm, NormKind,
    RecurrentSpec, RecurrentWeights, Result, RopeSpec, SeqRows, StateSnapshot, Workspace,
};

/// `[rows, cols]` f32 values in host memory.
#[derive(Debug, Clone, Default)]
pub struct CpuTensor {
    data: Vec<f32>,
    cols: usize,
}

impl CpuTensor {
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Rows of capacity.
    pub fn capacity_rows(&self) -> usize {
        self.data.len().checked_div(self.cols).unwrap_or(0)
    }

    /// The first `rows` rows, `[rows, cols]`.
    pub fn rows(&self, rows: usize) -> &[f32] {
        &self.data[..rows * self.cols]
    }

    pub fn rows_mut(&mut self, rows: usize) -> &mut [f32] {
        &mut self.data[..rows * self.cols]
    }
}

/// KV blocks in host memory: block `b` is `[layer][k | v][block_tokens][kv_dim]` values in the host form's words
/// ([`KvLayout`]: f16 bits, or f32 bits as two words).
pub struct CpuKvPages {
    pub layout: KvLayout,
    pub blocks: Vec<KvBlock>,
}

/// One KV block's storage, `[u16]` (empty: none). Each block is its own anonymous mapping, so dropping it returns its
/// memory to the system at once: as heap chunks of this size, glibc keeps freed blocks (its mmap threshold rises
/// after the first free) and the process's RSS would stay at the prefix cache's high-water mark.
#[derive(Default)]
pub struct KvBlock(Option<memmap2::MmapMut>);

impl KvBlock {
    /// Storage for `values` zeroed values (the kernel hands out zero pages on first touch).
    pub fn zeroed(values: usize) -> Result<Self> {
        if values == 0 {
            return Ok(KvBlock(None));
        }
        let map = memmap2::MmapMut::map_anon(values * 2)
            .map_err(|e| Error::Device { op: "kv block", message: format!("{} bytes: {e}", values * 2) })?;
        Ok(KvBlock(Some(map)))
    }
}

impl std::ops::Deref for KvBlock {
    type Target = [u16];
    fn deref(&self) -> &[u16] {
        match &self.0 {
            // SAFETY: the mapping is page-aligned, `len` bytes long with `len` even, and any bits are a valid u16.
            Some(m) => unsafe { std::slice::from_raw_parts(m.as_ptr() as *const u16, m.len() / 2) },
            None => &[],
        }
    }
}

impl std::ops::DerefMut for KvBlock {
    fn deref_mut(&mut self) -> &mut [u16] {
        match &mut self.0 {
            // SAFETY: as in `deref`, and the mapping is borrowed mutably.
            Some(m) => unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr() as *mut u16, m.len() / 2) },
            None => &mut [],
        }
    }
}

pub struct CpuBackend {
    pool: ThreadPool,
    /// The RoPE tables asked for so far (a model asks for one or two).
    ropes: Vec<(RopeSpec, Rope)>,
}

impl CpuBackend {
    /// A backend on `num_threads` threads (`0`: every core).
    pub fn new(num_threads: usize) -> Self {
        CpuBackend { pool: ThreadPool::new(num_threads), ropes: Vec::new() }
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    fn rope_table(&mut self, spec: &RopeSpec) -> &Rope {
        let i = match self.ropes.iter().position(|(s, _)| s == spec) {
            Some(i) => i,
            None => {
                self.ropes.push((*spec, Rope::new(spec.style, spec.head_dim, spec.rope_dim, spec.theta)));
                self.ropes.len() - 1
            }
        };
        &self.ropes[i].1
    }
}

fn shape_err(op: &'static str, reason: String) -> Error {
    Error::Shape { op, reason }
}

fn check_rows(op: &'static str, t: &CpuTensor, rows: usize) -> Result<()> {
    if rows * t.cols > t.data.len() {
        return Err(shape_err(op, format!("{rows} rows of {} exceed the tensor's {}", t.cols, t.capacity_rows())));
    }
    Ok(())
}

/// Both tensors hold at least `rows` rows, of one width.
fn check_pair(op: &'static str, a: &CpuTensor, b: &CpuTensor, rows: usize) -> Result<()> {
    check_rows(op, a, rows)?;
    check_rows(op, b, rows)?;
    if a.cols != b.cols {
        return Err(shape_err(op, format!("rows of {} and {}", a.cols, b.cols)));
    }
    Ok(())
}

/// Stores `src` as values of `kv` (`dst`: `src.len() * kv.words()` words).
fn write_kv(kv: KvType, dst: &mut [u16], src: &[f32]) {
    match kv {
        KvType::F16 => {
            for (d, &x) in dst.iter_mut().zip(src) {
                *d = half::f16::from_f32(x).to_bits();
            }
        }
        KvType::F32 => {
            for (d, &x) in dst.chunks_exact_mut(2).zip(src) {
                let b = x.to_bits();
                d.copy_from_slice(&[b as u16, (b >> 16) as u16]);
            }
        }
    }
}

fn norm_rows(op: &'static str, x: &CpuTensor, rows: usize, norm: &Norm<Vec<f32>>) -> Result<()> {
    check_rows(op, x, rows)?;
    if norm.dim == 0 || norm.weight.len() != norm.dim || !x.cols.is_multiple_of(norm.dim) {
        return Err(shape_err(op, format!("a norm of {} over rows of {}", norm.dim, x.cols)));
    }
    Ok(())
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Matrix = QMatrix;
    type Vector = Vec<f32>;
    type KvPages = CpuKvPages;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn alloc(&mut self, rows: usize, cols: usize) -> Result<CpuTensor> {
        Ok(CpuTensor { data: vec![0.0; rows * cols], cols })
    }

    fn write(&mut self, t: &mut CpuTensor, data: &[f32]) -> Result<()> {
        if data.len() > t.data.len() || (t.cols > 0 && !data.len().is_multiple_of(t.cols)) {
            return Err(shape_err(
                "write",
                format!("{} values into a tensor of {} rows of {}", data.len(), t.capacity_rows(), t.cols),
            ));
        }
        t.data[..data.len()].copy_from_slice(data);
        Ok(())
    }

    fn read(&mut self, t: &CpuTensor, rows: usize) -> Result<Vec<f32>> {
        check_rows("read", t, rows)?;
        Ok(t.rows(rows).to_vec())
    }

    fn load_matrix(&mut self, m: &QMatrix, usage: MatrixUse) -> Result<QMatrix> {
        if super::quant::act_format(m.ty).is_none() {
            return Err(Error::Unsupported { backend: "cpu", op: "load_matrix", reason: format!("type {}", m.ty) });
        }
        // Rows looked up one at a time stay in the file's layout; matrices only multiplied get the layout this
        // machine's kernels read faster (Q4_K on AVX-512: `quant::q4k_pairs`). Experts stay in the mapped file: a
        // 30B-A3B model's experts are most of its bytes, and a token reads a few of them.
        Ok(match usage {
            MatrixUse::Linear => m.repacked(&self.pool).unwrap_or_else(|| m.clone()),
            MatrixUse::Embedding | MatrixUse::Both | MatrixUse::Experts => m.clone(),
        })
    }

    fn load_vector(&mut self, v: &[f32]) -> Result<Vec<f32>> {
        Ok(v.to_vec())
    }

    fn kv_pages(&mut self, layout: KvLayout) -> Result<CpuKvPages> {
        Ok(CpuKvPages { layout, blocks: Vec::new() })
    }

    fn kv_grow(&mut self, kv: &mut CpuKvPages, num_blocks: usize) -> Result<()> {
        let len = kv.layout.block_words();
        while kv.blocks.len() < num_blocks {
            kv.blocks.push(KvBlock::zeroed(len)?);
        }
        Ok(())
    }

    fn kv_copy_block(&mut self, kv: &mut CpuKvPages, from: u32, to: u32) -> Result<()> {
        let n = kv.blocks.len();
        if from as usize >= n || to as usize >= n {
            return Err(shape_err("kv_copy_block", format!("blocks {from} -> {to} of {n}")));
        }
        if from != to {
            let src = kv.blocks[from as usize].to_vec();
            kv.blocks[to as usize].copy_from_slice(&src);
        }
        Ok(())
    }

    fn kv_block_to_host(&mut self, kv: &CpuKvPages, block: u32, out: &mut [u16]) -> Result<()> {
        let b = kv.blocks.get(block as usize).ok_or_else(|| shape_err("kv_block_to_host", format!("block {block}")))?;
        if out.len() != b.len() {
            return Err(shape_err("kv_block_to_host", format!("{} values for a block of {}", out.len(), b.len())));
        }
        out.copy_from_slice(b);
        Ok(())
    }

    fn kv_block_from_host(&mut self, kv: &mut CpuKvPages, block: u32, data: &[u16]) -> Result<()> {
        let b = kv
            .blocks
            .get_mut(block as usize)
            .ok_or_else(|| shape_err("kv_block_from_host", format!("block {block}")))?;
        if data.len() != b.len() {
            return Err(shape_err("kv_block_from_host", format!("{} values for a block of {}", data.len(), b.len())));
        }
        b.copy_from_slice(data);
        Ok(())
    }

    fn embedding(&mut self, table: &QMatrix, tokens: &[u32], out: &mut CpuTensor) -> Result<()> {
        check_rows("embedding", out, tokens.len())?;
        if out.cols != table.cols {
            return Err(shape_err("embedding", format!("rows of {} into a tensor of {}", table.cols, out.cols)));
        }
        let h = table.cols;
        for (t, &tok) in tokens.iter().enumerate() {
            if tok as usize >= table.rows {
                return Err(shape_err("embedding", format!("token {tok} of a table of {} rows", table.rows)));
            }
            table.dequantize_row(tok as usize, &mut out.data[t * h..(t + 1) * h]);
        }
        Ok(())
    }

    fn gather_rows(&mut self, x: &CpuTensor, rows: &[usize], out: &mut CpuTensor) -> Result<()> {
        check_rows("gather_rows", out, rows.len())?;
        let c = x.cols;
        if out.cols != c || rows.iter().any(|&r| r >= x.capacity_rows()) {
            return Err(shape_err("gather_rows", format!("rows {rows:?} of a tensor of {} rows", x.capacity_rows())));
        }
        for (i, &r) in rows.iter().enumerate() {
            out.data[i * c..(i + 1) * c].copy_from_slice(&x.data[r * c..(r + 1) * c]);
        }
        Ok(())
    }

    fn rms_norm(&mut self, x: &CpuTensor, rows: usize, norm: &Norm<Vec<f32>>, out: &mut CpuTensor) -> Result<()> {
        norm_rows("rms_norm", x, rows, norm)?;
        check_rows("rms_norm", out, rows)?;
        if out.cols != x.cols {
            return Err(shape_err("rms_norm", format!("rows of {} into rows of {}", x.cols, out.cols)));
        }
        let (x, out) = (x.rows(rows), out.rows_mut(rows));
        match norm.kind {
            NormKind::Plain => ops::rms_norm(x, &norm.weight, norm.eps, out),
            NormKind::OnePlus => ops::rms_norm_one_plus(x, &norm.weight, norm.eps, out),
        }
        Ok(())
    }

    fn rms_norm_in_place(&mut self, x: &mut CpuTensor, rows: usize, norm: &Norm<Vec<f32>>) -> Result<()> {
        norm_rows("rms_norm_in_place", x, rows, norm)?;
        let one_plus = norm.kind == NormKind::OnePlus;
        ops::rms_norm_in_place(x.rows_mut(rows), &norm.weight, norm.eps, one_plus);
        Ok(())
    }

    fn linear(
        &mut self,
        x: &CpuTensor,
        rows: usize,
        ws: &[&QMatrix],
        biases: &[Option<&Vec<f32>>],
        outs: &mut [&mut CpuTensor],
    ) -> Result<()> {
        check_rows("linear", x, rows)?;
        if ws.is_empty() || ws.len() != outs.len() || !(biases.is_empty() || biases.len() == ws.len()) {
            return Err(shape_err(
                "linear",
                format!("{} matrices, {} outputs, {} biases", ws.len(), outs.len(), biases.len()),
            ));
        }
        for (i, (w, o)) in ws.iter().zip(outs.iter()).enumerate() {
            if w.cols != x.cols || o.cols != w.rows || rows > o.capacity_rows() {
                return Err(shape_err("linear", format!("{w:?} from rows of {} into rows of {}", x.cols, o.cols)));
            }
            if let Some(Some(b)) = biases.get(i)
                && b.len() != w.rows
            {
                return Err(shape_err("linear", format!("a bias of {} for {w:?}", b.len())));
            }
        }
        if rows == 0 {
            return Ok(());
        }
        let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.rows_mut(rows)).collect();
        matmul(&self.pool, ws, x.rows(rows), rows, &mut slices);
        for (o, b) in slices.iter_mut().zip(biases) {
            if let Some(b) = b {
                ops::add_bias(o, b);
            }
        }
        Ok(())
    }

    fn rope(&mut self, x: &mut CpuTensor, positions: &[usize], spec: &RopeSpec) -> Result<()> {
        check_rows("rope", x, positions.len())?;
        if spec.head_dim == 0
            || !x.cols.is_multiple_of(spec.head_dim)
            || spec.rope_dim > spec.head_dim
            || !spec.rope_dim.is_multiple_of(2)
        {
            return Err(shape_err("rope", format!("{spec:?} over rows of {}", x.cols)));
        }
        let c = x.cols;
        let rope = self.rope_table(spec);
        for (t, &pos) in positions.iter().enumerate() {
            rope.apply(&mut x.data[t * c..(t + 1) * c], pos);
        }
        Ok(())
    }

    fn paged_attention(
        &mut self,
        kv: &mut CpuKvPages,
        layer: usize,
        shape: AttnShape,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        rows: &AttnRows<'_>,
        out: &mut CpuTensor,
    ) -> Result<()> {
        let m = rows.num_rows();
        let (qd, kvd) = (shape.q_dim(), shape.kv_dim());
        let layout = kv.layout;
        let bt = layout.block_tokens;
        for (t, name) in [(q, "q"), (k, "k"), (v, "v")] {
            check_rows("paged_attention", t, m)?;
            let want = if name == "q" { qd } else { kvd };
            if t.cols != want {
                return Err(shape_err("paged_attention", format!("{name} rows of {} for {shape:?}", t.cols)));
            }
        }
        check_rows("paged_attention", out, m)?;
        let covered: usize = rows.seqs.iter().map(|s| s.num_rows).sum();
        if out.cols != qd || kvd != layout.kv_dim || layer >= layout.num_layers || rows.slots.len() != m || covered != m
        {
            return Err(shape_err("paged_attention", format!("{m} rows, layer {layer}, {layout:?}, {shape:?}")));
        }
        let n = kv.blocks.len();
        // A block id past the pages, or one without storage (its allocation failed).
        let bad_block = |b: u32| kv.blocks.get(b as usize).is_none_or(|blk| blk.len() != layout.block_words());
        let bad_slot = rows.slots.iter().any(|&(b, r)| bad_block(b) || r >= bt);
        let bad_seq = rows
            .seqs
            .iter()
            .any(|s| s.blocks.iter().any(|&b| bad_block(b)) || s.blocks.len() * bt < s.start_pos + s.num_rows);
        if bad_slot || bad_seq {
            return Err(shape_err("paged_attention", format!("a slot or block outside the {n} blocks with storage")));
        }
        // Words of one token's keys (or values), of one layer's keys.
        let (ty, tok) = (layout.kv_type, kvd * layout.kv_type.words());
        let layer_k = layout.layer_offset(layer);
        let layer_v = layer_k + bt * tok;
        for (t, &(b, r)) in rows.slots.iter().enumerate() {
            let blk = &mut kv.blocks[b as usize];
            write_kv(ty, &mut blk[layer_k + r * tok..][..tok], &k.data[t * kvd..(t + 1) * kvd]);
            write_kv(ty, &mut blk[layer_v + r * tok..][..tok], &v.data[t * kvd..(t + 1) * kvd]);
        }
        let blocks = &kv.blocks;
        let seqs: Vec<SeqAttn> = rows
            .seqs
            .iter()
            .map(|s| SeqAttn {
                k: s.blocks.iter().map(|&b| &blocks[b as usize][layer_k..layer_k + bt * tok]).collect(),
                v: s.blocks.iter().map(|&b| &blocks[b as usize][layer_v..layer_v + bt * tok]).collect(),
                kv_type: ty,
                block_tokens: bt,
                start_pos: s.start_pos,
                num_rows: s.num_rows,
            })
            .collect();
        attention::attention(&self.pool, shape, q.rows(m), &seqs, out.rows_mut(m));
        Ok(())
    }

    fn swiglu(&mut self, gate: &mut CpuTensor, up: &CpuTensor, rows: usize) -> Result<()> {
        check_pair("swiglu", gate, up, rows)?;
        ops::silu_mul(gate.rows_mut(rows), up.rows(rows));
        Ok(())
    }

    fn recurrent_sublayer(
        &mut self,
        x: &mut CpuTensor,
        w: &RecurrentWeights<Self>,
        spec: &RecurrentSpec,
        seqs: &[SeqRows<'_>],
        states: &mut [&mut CpuTensor],
        snapshots: &mut [StateSnapshot<'_, Self>],
        ws: &mut Workspace<Self>,
    ) -> Result<()> {
        const OP: &str = "recurrent_sublayer";
        let m: usize = seqs.iter().map(|s| s.num_rows).sum();
        let (cd, vd, nv) = (spec.conv_dim(), spec.value_dim(), spec.num_v_heads);
        if states.len() != seqs.len() || states.iter().any(|s| s.data.len() < spec.state_len()) {
            return Err(shape_err(
                OP,
                format!("{} states of {} values for {} sequences", states.len(), spec.state_len(), seqs.len()),
            ));
        }
        let ordered = snapshots.windows(2).all(|p| (p[0].seq, p[0].rows_done) < (p[1].seq, p[1].rows_done));
        let in_range = snapshots.iter().all(|s| {
            seqs.get(s.seq).is_some_and(|q| (1..=q.num_rows).contains(&s.rows_done))
                && s.state.data.len() >= spec.state_len()
        });
        if !ordered || !in_range {
            return Err(shape_err(OP, format!("{} snapshots out of order or range", snapshots.len())));
        }
        let shapes_ok = spec.num_k_heads > 0
            && nv.is_multiple_of(spec.num_k_heads)
            && spec.conv_kernel >= 2
            && w.conv.len() == cd * spec.conv_kernel
            && w.dt_bias.len() == nv
            && w.a.len() == nv
            && w.out_norm.weight.len() == spec.head_v_dim;
        if !shapes_ok {
            return Err(shape_err(
                OP,
                format!("{spec:?} with a conv of {} and {} heads' vectors", w.conv.len(), w.a.len()),
            ));
        }
        let mut qkv = CpuTensor { data: vec![0.0; m * cd], cols: cd };
        let mut z = CpuTensor { data: vec![0.0; m * vd], cols: vd };
        let mut beta = CpuTensor { data: vec![0.0; m * nv], cols: nv };
        let mut alpha = CpuTensor { data: vec![0.0; m * nv], cols: nv };
        let Workspace { xn, proj, .. } = ws;
        self.rms_norm(x, m, &w.norm, xn)?;
        self.linear(xn, m, &[&w.qkv, &w.z, &w.beta, &w.alpha], &[], &mut [&mut qkv, &mut z, &mut beta, &mut alpha])?;
        let mut o = CpuTensor { data: vec![0.0; m * vd], cols: vd };
        let p = deltanet::Params {
            conv: &w.conv,
            dt_bias: &w.dt_bias,
            a: &w.a,
            norm: &w.out_norm.weight,
            eps: w.out_norm.eps,
        };
        let mut scratch = vec![0f32; cd + spec.head_v_dim];
        let mut t = 0;
        let mut snaps = snapshots.iter_mut().peekable();
        for (i, (seq, state)) in seqs.iter().zip(states.iter_mut()).enumerate() {
            let state = &mut state.data[..spec.state_len()];
            for r in 0..seq.num_rows {
                deltanet::step(
                    spec,
                    &p,
                    state,
                    &qkv.data[t * cd..][..cd],
                    &z.data[t * vd..][..vd],
                    &beta.data[t * nv..][..nv],
                    &alpha.data[t * nv..][..nv],
                    &mut scratch,
                    &mut o.data[t * vd..][..vd],
                );
                t += 1;
                while let Some(s) = snaps.next_if(|s| (s.seq, s.rows_done) == (i, r + 1)) {
                    s.state.data[..state.len()].copy_from_slice(state);
                }
            }
        }
        self.linear(&o, m, &[&w.out], &[], &mut [proj])?;
        self.add(x, proj, m)
    }

    fn experts(&mut self, x: &CpuTensor, rows: usize, w: &ExpertWeights<Self>, out: &mut CpuTensor) -> Result<()> {
        check_rows("experts", x, rows)?;
        check_rows("experts", out, rows)?;
        check_experts(w, x.cols).map_err(|reason| shape_err("experts", reason))?;
        if out.cols != x.cols {
            return Err(shape_err("experts", format!("rows of {} into rows of {}", x.cols, out.cols)));
        }
        experts::experts(&self.pool, x.rows(rows), rows, w, out.rows_mut(rows));
        Ok(())
    }

    fn add(&mut self, x: &mut CpuTensor, y: &CpuTensor, rows: usize) -> Result<()> {
        check_pair("add", x, y, rows)?;
        ops::add(x.rows_mut(rows), y.rows(rows));
        Ok(())
    }

    fn sigmoid_mul(&mut self, x: &mut CpuTensor, gate: &CpuTensor, rows: usize) -> Result<()> {
        check_pair("sigmoid_mul", x, gate, rows)?;
        for (v, &g) in x.rows_mut(rows).iter_mut().zip(gate.rows(rows)) {
            *v /= 1.0 + (-g).exp();
        }
        Ok(())
    }
}

/// Checks an expert-routed FFN's matrices against its numbers and the input width `h`, and that each expert's slice
/// starts on a whole unit of its matrix's layout.
fn check_experts(w: &ExpertWeights<CpuBackend>, h: usize) -> std::result::Result<(), String> {
    w.check_shapes(h, |m| (m.rows, m.cols))?;
    let ne = w.spec.num_experts;
    let mut strided = vec![(&w.router, "the router"), (&w.down, "the experts' down")];
    match &w.gate_up {
        ExpertGateUp::Separate { gate, up } => strided.extend([(gate, "the experts' gate"), (up, "the experts' up")]),
        ExpertGateUp::Fused(m) => strided.push((m, "the experts' gate_up")),
    }
    for (m, what) in strided {
        let unit = m.layout.unit_rows();
        if !(m.rows / ne).is_multiple_of(unit) {
            return Err(format!("{what}: experts of {} rows in a layout of {unit}-row units", m.rows / ne));
        }
    }
    Ok(())
}
