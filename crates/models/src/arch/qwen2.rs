//! Qwen2 / Qwen2.5: biases on Q, K and V, GQA, NeoX-style RoPE (θ = 1e6 in the released models), untied output
//! (the small ones tie it; the file then has no `output.weight`).

use backend::{NormKind, RopeStyle};

use super::{FfnKind, LLAMA_NAMES, MixerKind, Recipe};
use crate::Arch;

pub const RECIPE: Recipe = Recipe {
    arch: Arch::Qwen2,
    names: &LLAMA_NAMES,
    mixer: MixerKind::Attention { qkv_bias: true, qk_norm: false },
    ffn: FfnKind::SwiGlu,
    norm: NormKind::Plain,
    rope_style: RopeStyle::Neox,
    default_rope_theta: 1_000_000.0,
};
