//! Qwen3 (dense): like Qwen2 without Q/K/V biases, plus a per-head RMSNorm of queries and keys before RoPE
//! (`attn_q_norm` / `attn_k_norm`, `[head_dim]`).

use backend::RopeStyle::Neox;

use super::MixerKind::Attention;
use super::Recipe;
use crate::Arch;

pub const RECIPE: Recipe = Recipe::dense(Arch::Qwen3, Attention { qkv_bias: false, qk_norm: true }, Neox, 1e6);
