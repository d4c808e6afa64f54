//! The expert-routed FFN on the CPU ([`crate::Backend::experts`]): routing, then grouped products that read only the
//! picked experts' rows, each expert's once per call.
//!
//! Every row picks `num_used` experts; its (row, slot) assignments are sorted by expert, so the rows that picked one
//! expert sit together and its gate/up and down products run over all of them in one pass of its weights (decode:
//! one row per expert; a verification or several sequences: the rows that share an expert share the read; prefill:
//! a GEMM per expert, in the matmul's blocks of input rows). The products are the matmul's kernels over the expert's
//! slice of the expert-strided matrix, left where it is (the memory-mapped file). A row's picked outputs are summed
//! in the router's slot order, and every product element is independent of the other rows (the kernels' canonical
//! order), so a row's result is bitwise the same in any batch.

use std::ops::Range;

use gguf::GgmlType;

use super::matmul::{M_BLOCK, OutPtr};
use super::quant::{self, ActFormat, Layout};
use super::{CpuBackend, QMatrix, ThreadPool, matmul, ops};
use crate::{ExpertWeights, ExpertsSpec};

/// The router's picks for each of `m` rows of `logits` (`[m, num_experts]`): `[m * num_used]` (expert, weight), in
/// order of decreasing probability (ties to the lower index). Softmax in f32, as llama.cpp's graph computes it.
pub fn route(logits: &[f32], m: usize, spec: &ExpertsSpec) -> Vec<(u32, f32)> {
    let (ne, k) = (spec.num_experts, spec.num_used);
    let mut picks = Vec::with_capacity(m * k);
    let mut p = vec![0f32; ne];
    for row in logits[..m * ne].chunks_exact(ne) {
        let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut sum = 0f32;
        for (p, &l) in p.iter_mut().zip(row) {
            *p = (l - max).exp();
            sum += *p;
        }
        let first = picks.len();
        for _ in 0..k {
            // The largest not yet picked; `>` keeps the lower index on ties. NaN logits pick the lowest free index.
            let mut best: Option<usize> = None;
            for (e, &v) in p.iter().enumerate() {
                if v >= 0.0 && best.is_none_or(|b| v > p[b]) {
                    best = Some(e);
                }
            }
            let e = best.unwrap_or_else(|| (0..ne).find(|&e| p[e] >= 0.0).unwrap_or(0));
            picks.push((e as u32, p[e] / sum));
            p[e] = -1.0;
        }
        if spec.normalise_weights {
            let total: f32 = picks[first..].iter().map(|&(_, w)| w).sum();
            picks[first..].iter_mut().for_each(|(_, w)| *w /= total);
        }
    }
    picks
}

/// Quantizes the `n` rows of `x` (`[n, k]`) to `fmt`, on the pool.
fn quantize_rows(pool: &ThreadPool, fmt: ActFormat, x: &[f32], n: usize, k: usize) -> Vec<u8> {
    let rb = quant::act_row_bytes(fmt, k);
    let mut buf = vec![0u8; rb * n];
    let ptr = OutPtr(buf.as_mut_ptr() as *mut f32);
    pool.for_each_chunk(n, 16, &|rows| {
        #[allow(clippy::redundant_locals)]
        let ptr = ptr;
        for t in rows {
            // SAFETY: each row is written by exactly one chunk, inside the buffer.
            let dst = unsafe { std::slice::from_raw_parts_mut((ptr.0 as *mut u8).add(t * rb), rb) };
            quant::quantize_act_row(fmt, &x[t * k..(t + 1) * k], dst);
        }
    });
    buf
}

/// One product of a grouped pass: weight rows `rows` of an expert's slice (`w`, rows from 0) times the group's `n`
/// activation rows, into `out[p * ldo + r]`.
struct Task<'a> {
    ty: GgmlType,
    layout: Layout,
    w: &'a [u8],
    rows: Range<usize>,
    acts: &'a [u8],
    n: usize,
    out: OutPtr,
    ldo: usize,
}

/// A part of an expert's projection: `count` rows from row `row0` of `m`, written at column `col` of the output.
struct Part<'a> {
    m: &'a QMatrix,
    row0: usize,
    count: usize,
    col: usize,
}

/// `out[p * ldo + col + r] = a[p] · part.m[part.row0 + r]` for each group `(expert, positions)` and each of its
/// parts, with `a` the rows of `x` (`[n, k]`) quantized to each part's format. Runs every product of every group as
/// one pool job.
fn grouped<'a>(
    pool: &ThreadPool,
    x: &[f32],
    groups: &[(usize, Range<usize>)],
    parts: &dyn Fn(usize) -> Vec<Part<'a>>,
    out: &mut [f32],
    ldo: usize,
) {
    let k = groups.first().map_or(0, |(e, _)| parts(*e)[0].m.cols);
    let n = groups.last().map_or(0, |(_, p)| p.end);
    let mut acts: Vec<(ActFormat, usize, Vec<u8>)> = Vec::new();
    let all: Vec<(usize, Range<usize>, Part)> =
        groups.iter().flat_map(|(e, pos)| parts(*e).into_iter().map(move |p| (*e, pos.clone(), p))).collect();
    for (_, _, p) in &all {
        let fmt = quant::act_format(p.m.ty).expect("INVARIANT: weight types are checked at load");
        if acts.iter().all(|(f, ..)| *f != fmt) {
            acts.push((fmt, quant::act_row_bytes(fmt, k), quantize_rows(pool, fmt, x, n, k)));
        }
    }
    let base = out.as_mut_ptr();
    let mut tasks = Vec::new();
    for (_, pos, p) in &all {
        let fmt = quant::act_format(p.m.ty).expect("INVARIANT: checked above");
        let (_, rb, a) = acts.iter().find(|(f, ..)| *f == fmt).expect("INVARIANT: quantized above");
        let at = |rows| p.m.layout.matrix_bytes(p.m.ty, rows, k).expect("INVARIANT: whole units of the layout");
        let w = &p.m.bytes.as_slice()[at(p.row0)..at(p.row0 + p.count)];
        let chunk = if pos.len() <= 8 { 256 } else { 16 };
        for r in (0..p.count).step_by(chunk) {
            tasks.push(Task {
                ty: p.m.ty,
                layout: p.m.layout,
                w,
                rows: r..(r + chunk).min(p.count),
                acts: &a[pos.start * rb..pos.end * rb],
                n: pos.len(),
                // SAFETY (of the offset): inside `out`, which holds `n` rows of `ldo`.
                out: OutPtr(unsafe { base.add(pos.start * ldo + p.col) }),
                ldo,
            });
        }
    }
    pool.for_each_chunk(tasks.len(), 1, &|range| {
        for t in &tasks[range] {
            let rb = t.acts.len() / t.n;
            for p0 in (0..t.n).step_by(M_BLOCK) {
                let mb = M_BLOCK.min(t.n - p0);
                // SAFETY: this task alone writes rows `t.rows` of its part for its group's positions.
                unsafe {
                    quant::matmul_rows_in(
                        t.layout,
                        t.ty,
                        t.w,
                        k,
                        t.rows.clone(),
                        &t.acts[p0 * rb..(p0 + mb) * rb],
                        mb,
                        t.out.0.add(p0 * t.ldo),
                        t.ldo,
                    );
                }
            }
        }
    });
}

/// [`crate::Backend::experts`] over `m` rows of `x` (`[m, hidden]`) into `out` (`[m, hidden]`).
pub fn experts(pool: &ThreadPool, x: &[f32], m: usize, w: &ExpertWeights<CpuBackend>, out: &mut [f32]) {
    let spec = &w.spec;
    let (h, f, k) = (w.router.cols, spec.expert_ffn, spec.num_used);
    let mut logits = vec![0f32; m * spec.num_experts];
    matmul(pool, &[&w.router], x, m, &mut [&mut logits]);
    let picks = route(&logits, m, spec);

    // Assignments `a = t * k + j` sorted by expert (stable: row order within an expert): `order[p] = a`, `at[a] = p`.
    let mut start = vec![0usize; spec.num_experts + 1];
    for &(e, _) in &picks {
        start[e as usize + 1] += 1;
    }
    for e in 0..spec.num_experts {
        start[e + 1] += start[e];
    }
    let groups: Vec<(usize, Range<usize>)> =
        (0..spec.num_experts).filter(|&e| start[e + 1] > start[e]).map(|e| (e, start[e]..start[e + 1])).collect();
    let mut next = start.clone();
    let mut order = vec![0usize; picks.len()];
    let mut at = vec![0usize; picks.len()];
    for (a, &(e, _)) in picks.iter().enumerate() {
        let p = &mut next[e as usize];
        (order[*p], at[a]) = (a, *p);
        *p += 1;
    }
    let n = picks.len();
    let mut xg = vec![0f32; n * h];
    for (p, &a) in order.iter().enumerate() {
        xg[p * h..(p + 1) * h].copy_from_slice(&x[(a / k) * h..(a / k + 1) * h]);
    }

    // gate | up of each assignment, `[n, 2f]`, then silu(gate) * up in the first half.
    let mut gu = vec![0f32; n * 2 * f];
    let gate_up = |e: usize| {
        let [(g, g0), (u, u0)] = w.gate_up.rows_of(e, f);
        vec![Part { m: g, row0: g0, count: f, col: 0 }, Part { m: u, row0: u0, count: f, col: f }]
    };
    grouped(pool, &xg, &groups, &gate_up, &mut gu, 2 * f);
    let mut hid = vec![0f32; n * f];
    for (hr, row) in hid.chunks_exact_mut(f).zip(gu.chunks_exact(2 * f)) {
        hr.copy_from_slice(&row[..f]);
        ops::silu_mul(hr, &row[f..]);
    }
    let mut y = vec![0f32; n * h];
    let down = |e: usize| vec![Part { m: &w.down, row0: e * h, count: h, col: 0 }];
    grouped(pool, &hid, &groups, &down, &mut y, h);

    let shared = w.shared.as_ref().map(|s| {
        let sf = s.gate.rows;
        let (mut g, mut u, mut o) = (vec![0f32; m * sf], vec![0f32; m * sf], vec![0f32; m * h]);
        matmul(pool, &[&s.gate, &s.up], x, m, &mut [&mut g, &mut u]);
        ops::silu_mul(&mut g, &u);
        matmul(pool, &[&s.down], &g, m, &mut [&mut o]);
        let scale = s.gate_inp.as_ref().map(|gi| {
            let mut z = vec![0f32; m];
            matmul(pool, &[gi], x, m, &mut [&mut z]);
            z.iter().map(|&z| 1.0 / (1.0 + (-z).exp())).collect::<Vec<f32>>()
        });
        (o, scale)
    });
    for (t, o) in out[..m * h].chunks_exact_mut(h).enumerate() {
        o.fill(0.0);
        for j in 0..k {
            let (p, wt) = (at[t * k + j], picks[t * k + j].1);
            for (o, &v) in o.iter_mut().zip(&y[p * h..(p + 1) * h]) {
                *o += wt * v;
            }
        }
        if let Some((s, scale)) = &shared {
            let sc = scale.as_ref().map_or(1.0, |sc| sc[t]);
            for (o, &v) in o.iter_mut().zip(&s[t * h..(t + 1) * h]) {
                *o += sc * v;
            }
        }
    }
}
