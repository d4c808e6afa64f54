//! Llama (and SmolLM2, which is a llama): no biases, GQA, RoPE over adjacent pairs (GGUF conversion permutes Q and K
//! so that llama.cpp's "normal" rotation applies), embeddings tied when the file has no `output.weight`.

use backend::RopeStyle::Interleaved;

use super::MixerKind::Attention;
use super::Recipe;
use crate::Arch;

pub const RECIPE: Recipe = Recipe::dense(Arch::Llama, Attention { qkv_bias: false, qk_norm: false }, Interleaved, 1e4);
