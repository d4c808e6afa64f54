//! The Gated DeltaNet recurrence on the CPU ([`crate::RecurrentWeights`] says the maths): one token of one
//! sequence at a time, its state (conv tail and every value head's `d_k × d_v` matrix, f32) read and written once
//! per token. Prefill runs the same step over its rows in order, so a position's output does not depend on how
//! the prompt was cut into calls (bit-identical for one chunk, many chunks or token by token).

use crate::RecurrentSpec;

/// The per-layer vectors of the recurrence.
pub struct Params<'a> {
    /// `[conv_dim * conv_kernel]`, each channel's taps oldest first.
    pub conv: &'a [f32],
    pub dt_bias: &'a [f32],
    /// `−exp(A_log)` per value head.
    pub a: &'a [f32],
    /// `[head_v_dim]` of the output RMSNorm, and its epsilon.
    pub norm: &'a [f32],
    pub eps: f32,
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn softplus(x: f32) -> f32 {
    // As torch (threshold 20): exp would only add rounding there.
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// `v / sqrt(Σv² + eps)` in place.
fn l2_normalise(v: &mut [f32], eps: f32) {
    let inv = 1.0 / (v.iter().map(|x| x * x).sum::<f32>() + eps).sqrt();
    v.iter_mut().for_each(|x| *x *= inv);
}

/// One token: `qkv` (`[conv_dim]`, before the conv), `z` (`[value_dim]`), `beta`/`alpha` (`[num_v_heads]`, before
/// their activations) in; the gated, normalised output (`[value_dim]`) out; `state` (`[spec.state_len()]`)
/// advanced by the token. `scratch` holds `conv_dim + head_v_dim` values.
#[allow(clippy::too_many_arguments)]
pub fn step(
    spec: &RecurrentSpec,
    p: &Params<'_>,
    state: &mut [f32],
    qkv: &[f32],
    z: &[f32],
    beta: &[f32],
    alpha: &[f32],
    scratch: &mut [f32],
    out: &mut [f32],
) {
    let (kw, cd, dk, dv) = (spec.conv_kernel, spec.conv_dim(), spec.head_k_dim, spec.head_v_dim);
    let (conv_state, mats) = state.split_at_mut(spec.conv_state_len());
    let (x, o) = scratch.split_at_mut(cd);
    for (c, xc) in x.iter_mut().enumerate() {
        let w = &p.conv[c * kw..(c + 1) * kw];
        let mut acc = w[kw - 1] * qkv[c];
        for (j, &wj) in w[..kw - 1].iter().enumerate() {
            acc += wj * conv_state[j * cd + c];
        }
        *xc = silu(acc);
    }
    conv_state.copy_within(cd.., 0);
    conv_state[(kw - 2) * cd..].copy_from_slice(qkv);

    let kd = spec.key_dim();
    let (q, rest) = x.split_at_mut(kd);
    let (k, v) = rest.split_at_mut(kd);
    let scale = 1.0 / (dk as f32).sqrt();
    for (qh, kh) in q.chunks_exact_mut(dk).zip(k.chunks_exact_mut(dk)) {
        l2_normalise(qh, spec.l2_eps);
        l2_normalise(kh, spec.l2_eps);
        qh.iter_mut().for_each(|x| *x *= scale);
    }
    let o = &mut o[..dv];
    for h in 0..spec.num_v_heads {
        let kh = h % spec.num_k_heads;
        let (qh, kv, vh) = (&q[kh * dk..][..dk], &k[kh * dk..][..dk], &v[h * dv..][..dv]);
        let b = 1.0 / (1.0 + (-beta[h]).exp());
        let decay = (p.a[h] * softplus(alpha[h] + p.dt_bias[h])).exp();
        let s = &mut mats[h * dk * dv..][..dk * dv];
        s.iter_mut().for_each(|x| *x *= decay);
        // delta = β(v − Sᵀk), then S += k ⊗ delta, o = Sᵀq: row i of S is key dim i.
        o.copy_from_slice(vh);
        for (i, row) in s.chunks_exact(dv).enumerate() {
            for (oj, &sij) in o.iter_mut().zip(row) {
                *oj -= sij * kv[i];
            }
        }
        o.iter_mut().for_each(|d| *d *= b);
        for (row, &ki) in s.chunks_exact_mut(dv).zip(kv) {
            for (sij, &dj) in row.iter_mut().zip(o.iter()) {
                *sij += ki * dj;
            }
        }
        o.fill(0.0);
        for (row, &qi) in s.chunks_exact(dv).zip(qh) {
            for (oj, &sij) in o.iter_mut().zip(row) {
                *oj += sij * qi;
            }
        }
        let ms = o.iter().map(|x| x * x).sum::<f32>() / dv as f32;
        let inv = 1.0 / (ms + p.eps).sqrt();
        let zh = &z[h * dv..][..dv];
        for (j, dst) in out[h * dv..][..dv].iter_mut().enumerate() {
            *dst = o[j] * inv * p.norm[j] * silu(zh[j]);
        }
    }
}
