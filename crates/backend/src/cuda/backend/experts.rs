//! [`crate::Backend::experts`] on the GPU: the kernels of `experts.cu`, five launches (six to eight with a shared
//! expert) and no host round trip, so the routing indices stay on the device (a graph can capture the pass).
//!
//! In: the normalised rows `x` (`[m, hidden]`) and the FFN's weights (dequantized to f32 at load, as every matrix of
//! this backend). Out: `[m, hidden]`. Steps: the router's logits (`matvec`), the picks of each row (`moe_route`:
//! softmax, top-k, renormalised per the file), the `m * k` assignments sorted by expert (`moe_group`), gate/up with
//! SiLU (`moe_gate_up`) and down (`moe_down`) over one grid of (rows of an expert, expert) whose blocks read their
//! expert's weight rows once per tile of its assignments (decode and verification: once per pass), then each row's
//! mix in the router's slot order plus the shared expert (`moe_mix`). The scratch is one buffer, grown (after a
//! sync) when a call needs more.

use cudarc::driver::CudaFunction;

use super::{CudaBackend, CudaMatrix, CudaTensor, blocks_of, dev, fits, int, shape_err};
use crate::{Error, ExpertGateUp, ExpertWeights, Result};

/// The experts' kernels, after ops.cu's.
pub(super) const SOURCE: &str = include_str!("../experts.cu");

/// The largest router `moe_route` takes (`MOE_MAX_EXPERTS` in experts.cu).
const MAX_EXPERTS: usize = 1024;

pub(super) struct ExpertKernels {
    route: CudaFunction,
    group: CudaFunction,
    gate_up: CudaFunction,
    down: CudaFunction,
    mix: CudaFunction,
}

impl ExpertKernels {
    pub(super) fn load(f: &dyn Fn(&str) -> Result<CudaFunction>) -> Result<Self> {
        Ok(ExpertKernels {
            route: f("moe_route")?,
            group: f("moe_group")?,
            gate_up: f("moe_gate_up")?,
            down: f("moe_down")?,
            mix: f("moe_mix")?,
        })
    }
}

/// Byte offsets of one call's scratch parts, each 256-aligned.
struct Scratch {
    logits: usize,
    pick_e: usize,
    pick_w: usize,
    offsets: usize,
    order: usize,
    at: usize,
    hid: usize,
    y: usize,
    shared_gate: usize,
    shared_up: usize,
    shared_out: usize,
    shared_z: usize,
    bytes: usize,
}

impl Scratch {
    /// For `m` rows, `ne` experts, `k` picks, expert rows `f`, hidden `h`, shared expert rows `sf` (0: none).
    fn new(m: usize, ne: usize, k: usize, f: usize, h: usize, sf: usize) -> Self {
        let n = m * k;
        let mut at = 0;
        let mut part = |values: usize| {
            let off = at;
            at += (values * 4).div_ceil(256) * 256;
            off
        };
        Scratch {
            logits: part(m * ne),
            pick_e: part(n),
            pick_w: part(n),
            offsets: part(ne + 1),
            order: part(n),
            at: part(n),
            hid: part(n * f),
            y: part(n * h),
            shared_gate: part(m * sf),
            shared_up: part(m * sf),
            shared_out: part(m * h),
            shared_z: part(m),
            bytes: at,
        }
    }
}

impl CudaBackend {
    /// The scratch of the experts, at least `bytes` long; its address.
    fn experts_scratch(&mut self, op: &'static str, bytes: usize) -> Result<u64> {
        if self.moe.as_ref().is_none_or(|b| b.bytes < bytes) {
            self.gpu.sync().map_err(dev(op))?;
            self.moe = Some(self.gpu.alloc(bytes.next_power_of_two()).map_err(dev(op))?);
        }
        Ok(self.moe.as_ref().expect("INVARIANT: allocated above").ptr)
    }

    /// `out[t, j] = w[j] · x[t]` for `rows` rows: the ops' `matvec` (no bias) between raw device addresses.
    fn matvec_raw(&self, op: &'static str, w: &CudaMatrix, x: u64, rows: usize, out: u64) -> Result<()> {
        let args = vec![w.buf.ptr, x, 0, out, int(w.rows), int(w.cols)];
        self.launch(op, &self.k.matvec, (blocks_of(w.rows, 4), rows as u32, 1), 128, args)
    }

    pub(super) fn experts_op(
        &mut self,
        x: &CudaTensor,
        m: usize,
        w: &ExpertWeights<CudaBackend>,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let op = "experts";
        fits(op, x, m)?;
        fits(op, out, m)?;
        let h = x.cols;
        w.check_shapes(h, |mat| (mat.rows, mat.cols)).map_err(|reason| shape_err(op, reason))?;
        if out.cols != h {
            return Err(shape_err(op, format!("rows of {h} into rows of {}", out.cols)));
        }
        let s = w.spec;
        let (ne, k, f) = (s.num_experts, s.num_used, s.expert_ffn);
        if ne > MAX_EXPERTS {
            return Err(Error::Unsupported {
                backend: "cuda",
                op,
                reason: format!("{ne} experts (at most {MAX_EXPERTS})"),
            });
        }
        if m == 0 {
            return Ok(());
        }
        let sf = w.shared.as_ref().map_or(0, |sh| sh.gate.rows);
        let sc = Scratch::new(m, ne, k, f, h, sf);
        let base = self.experts_scratch(op, sc.bytes)?;
        let at = |off: usize| base + off as u64;
        let n = m * k;

        self.matvec_raw(op, &w.router, x.buf.ptr, m, at(sc.logits))?;
        let normalise = int(usize::from(s.normalise_weights));
        let args = vec![at(sc.logits), int(ne), int(k), normalise, at(sc.pick_e), at(sc.pick_w)];
        self.launch(op, &self.moe_k.route, (m as u32, 1, 1), 32, args)?;
        let args = vec![at(sc.pick_e), int(n), int(ne), int(k), at(sc.offsets), at(sc.order), at(sc.at), 0, 0];
        self.launch(op, &self.moe_k.group, (1, 1, 1), 256, args)?;

        // Expert e's gate row j at (e * stride + j) rows of `gate`, its up row as many rows into `up`.
        let (gate, up, stride) = match &w.gate_up {
            ExpertGateUp::Separate { gate, up } => (gate.buf.ptr, up.buf.ptr, f),
            ExpertGateUp::Fused(g) => (g.buf.ptr, g.buf.ptr + (f * h * 4) as u64, 2 * f),
        };
        let args =
            vec![gate, up, int(stride), x.buf.ptr, at(sc.offsets), at(sc.order), int(k), int(f), int(h), at(sc.hid)];
        self.launch(op, &self.moe_k.gate_up, (blocks_of(f, 4), ne as u32, 1), 128, args)?;
        let args = vec![w.down.buf.ptr, at(sc.hid), at(sc.offsets), int(h), int(f), at(sc.y)];
        self.launch(op, &self.moe_k.down, (blocks_of(h, 4), ne as u32, 1), 128, args)?;

        let (mut shared, mut z) = (0, 0);
        if let Some(sh) = &w.shared {
            let (g, u) = (at(sc.shared_gate), at(sc.shared_up));
            self.matvec_raw(op, &sh.gate, x.buf.ptr, m, g)?;
            self.matvec_raw(op, &sh.up, x.buf.ptr, m, u)?;
            let len = m * sf;
            self.launch(op, &self.k.swiglu, (blocks_of(len, 256), 1, 1), 256, vec![g, u, int(len)])?;
            shared = at(sc.shared_out);
            self.matvec_raw(op, &sh.down, g, m, shared)?;
            if let Some(gi) = &sh.gate_inp {
                z = at(sc.shared_z);
                self.matvec_raw(op, gi, x.buf.ptr, m, z)?;
            }
        }
        let args = vec![at(sc.y), at(sc.at), at(sc.pick_w), int(k), int(h), shared, z, out.buf.ptr];
        self.launch(op, &self.moe_k.mix, (m as u32, 1, 1), 256, args)
    }
}
