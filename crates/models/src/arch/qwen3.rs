//! Qwen3 (dense): like Qwen2 without Q/K/V biases, plus a per-head RMSNorm of queries and keys before RoPE
//! (`attn_q_norm` / `attn_k_norm`, `[head_dim]`).

use backend::{NormKind, RopeStyle};

use super::{FfnKind, LLAMA_NAMES, MixerKind, Recipe};
use crate::Arch;

pub const RECIPE: Recipe = Recipe {
    arch: Arch::Qwen3,
    names: &LLAMA_NAMES,
    mixer: MixerKind::Attention { qkv_bias: false, qk_norm: true },
    ffn: FfnKind::SwiGlu,
    norm: NormKind::Plain,
    rope_style: RopeStyle::Neox,
    default_rope_theta: 1_000_000.0,
};
