//! Qwen3.5 / Qwen3.6 MoE hybrids (`qwen35moe`, Qwen3.6-35B-A3B): the layers of `qwen35` (Gated DeltaNet, every
//! `full_attention_interval`-th layer gated attention, the converter's changes to the checkpoint listed there) with
//! the expert-routed FFN of `qwen3moe` in every layer, plus its shared expert: `ffn_{gate,up,down}_shexp` (width
//! `expert_shared_feed_forward_length`) scaled by `sigmoid(ffn_gate_inp_shexp · x)` and added to the routed
//! experts' mix. The router is softmax over all experts, top `expert_used_count`, renormalised (transformers'
//! `Qwen3_5MoeTopKRouter` always renormalises, and the converter writes no `expert_weights_norm`).
//!
//! The converter writes no `feed_forward_length` (the checkpoint has no dense FFN): the model's FFN width is the
//! widest of its experts' and its shared expert's (`arch::read_config`).

use backend::{NormKind, RopeStyle};

use super::qwen3moe::EXPERT_NAMES;
use super::qwen35::NAMES;
use super::{FfnKind, MixerKind, Recipe};
use crate::Arch;

pub const RECIPE: Recipe = Recipe {
    arch: Arch::Qwen35Moe,
    names: &NAMES,
    mixer: MixerKind::Hybrid,
    ffn: FfnKind::Experts { names: &EXPERT_NAMES },
    norm: NormKind::Plain,
    rope_style: RopeStyle::Neox,
    default_rope_theta: 10_000_000.0,
};
