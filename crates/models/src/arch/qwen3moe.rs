//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen3's attention (per-head Q/K norms, no biases) with an
//! expert-routed FFN in every layer: `ffn_gate_inp` (the router, `[num_experts, hidden]`), the experts' SwiGLU as
//! 3-D tensors `ffn_{gate,up,down}_exps` (or `gate` and `up` fused into `ffn_gate_up_exps`), softmax over all
//! experts, the top `expert_used_count`, renormalised. The shared expert of qwen2moe / qwen35moe (`*_shexp` behind a
//! sigmoid gate `ffn_gate_inp_shexp`) is a flag of the same FFN kind, read when a file has it.

use backend::{ExpertsSpec, NormKind, RopeStyle};
use gguf::GgufFile;

use super::{FfnKind, LLAMA_NAMES, MixerKind, Recipe};
use crate::{Arch, Error, Result};

pub const RECIPE: Recipe = Recipe {
    arch: Arch::Qwen3Moe,
    names: &LLAMA_NAMES,
    mixer: MixerKind::Attention { qkv_bias: false, qk_norm: true },
    ffn: FfnKind::Experts { names: &EXPERT_NAMES },
    norm: NormKind::Plain,
    rope_style: RopeStyle::Neox,
    default_rope_theta: 1_000_000.0,
};

/// The GGUF names of an expert-routed FFN's tensors (`blk.{i}.{name}.weight`), as llama.cpp names them for every
/// MoE architecture.
#[derive(Debug, PartialEq, Eq)]
pub struct ExpertNames {
    pub router: &'static str,
    pub gate: &'static str,
    pub up: &'static str,
    pub gate_up: &'static str,
    pub down: &'static str,
    pub shared_gate: &'static str,
    pub shared_up: &'static str,
    pub shared_down: &'static str,
    pub shared_gate_inp: &'static str,
}

pub const EXPERT_NAMES: ExpertNames = ExpertNames {
    router: "ffn_gate_inp",
    gate: "ffn_gate_exps",
    up: "ffn_up_exps",
    gate_up: "ffn_gate_up_exps",
    down: "ffn_down_exps",
    shared_gate: "ffn_gate_shexp",
    shared_up: "ffn_up_shexp",
    shared_down: "ffn_down_shexp",
    shared_gate_inp: "ffn_gate_inp_shexp",
};

/// The router's numbers from `<arch>.expert_*`. Renormalisation is llama.cpp's `expert_weights_norm`; a qwen3moe file
/// without it renormalises, as llama.cpp's qwen3moe graph always does (the converter does not write the key for
/// qwen3moe: a `norm_topk_prob: false` checkpoint needs it added).
pub fn experts_spec(file: &GgufFile, arch: Arch) -> Result<ExpertsSpec> {
    let prefix = arch.name();
    let req = |k: &str| -> Result<usize> {
        let key = format!("{prefix}.{k}");
        match file.get_u64(&key)? {
            None => Err(Error::MissingKey(key)),
            Some(v) if v == 0 || v > 1 << 20 => {
                Err(Error::BadKey { key, reason: format!("value {v} is out of range") })
            }
            Some(v) => Ok(v as usize),
        }
    };
    let spec = ExpertsSpec {
        num_experts: req("expert_count")?,
        num_used: req("expert_used_count")?,
        expert_ffn: req("expert_feed_forward_length")?,
        normalise_weights: file.get_bool(&format!("{prefix}.expert_weights_norm"))?.unwrap_or(true),
    };
    if spec.num_used > spec.num_experts {
        return Err(Error::BadKey {
            key: format!("{prefix}.expert_used_count"),
            reason: format!("{} experts used of {}", spec.num_used, spec.num_experts),
        });
    }
    // Only softmax routing is implemented (llama.cpp's gating function 1); sigmoid routers are other models'.
    if let Some(g) = file.get_u64(&format!("{prefix}.expert_gating_func"))?
        && g != 1
    {
        return Err(Error::BadKey {
            key: format!("{prefix}.expert_gating_func"),
            reason: format!("{g} (softmax is 1)"),
        });
    }
    Ok(spec)
}
