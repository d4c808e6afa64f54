//! Llama (and SmolLM2, which is a llama): no biases, GQA, RoPE over adjacent pairs (GGUF conversion permutes Q and K
//! so that llama.cpp's "normal" rotation applies), embeddings tied when the file has no `output.weight`.

use backend::{NormKind, RopeStyle};

use super::{FfnKind, LLAMA_NAMES, MixerKind, Recipe};
use crate::Arch;

pub const RECIPE: Recipe = Recipe {
    arch: Arch::Llama,
    names: &LLAMA_NAMES,
    mixer: MixerKind::Attention { qkv_bias: false, qk_norm: false },
    ffn: FfnKind::SwiGlu,
    norm: NormKind::Plain,
    rope_style: RopeStyle::Interleaved,
    default_rope_theta: 10_000.0,
};
