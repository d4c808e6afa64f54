//! Qwen2 / Qwen2.5: biases on Q, K and V, GQA, NeoX-style RoPE (θ = 1e6 in the released models), untied output
//! (the small ones tie it; the file then has no `output.weight`).

use backend::RopeStyle::Neox;

use super::MixerKind::Attention;
use super::Recipe;
use crate::Arch;

pub const RECIPE: Recipe = Recipe::dense(Arch::Qwen2, Attention { qkv_bias: true, qk_norm: false }, Neox, 1e6);
