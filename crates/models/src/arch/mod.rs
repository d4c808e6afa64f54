//! Per-architecture knowledge, one file each: a [`Recipe`] naming the architecture's weights, its layer and FFN
//! kinds and its RoPE, over the shared forward pass (`crate::transformer`). Nothing else in the crate is
//! model-specific; a new architecture is a new file here (plus backend ops for any kind it adds).

mod llama;
mod qwen2;
mod qwen3;
pub mod qwen35;
pub mod qwen35moe;
pub mod qwen3moe;

use backend::{NormKind, RopeStyle};
use gguf::GgufFile;

use crate::{Arch, Error, ModelConfig, ModelShapes, Result};

/// How one architecture builds its layers.
#[derive(Debug, PartialEq)]
pub struct Recipe {
    pub arch: Arch,
    /// GGUF tensor names of each weight.
    pub names: &'static TensorNames,
    pub mixer: MixerKind,
    pub ffn: FfnKind,
    /// Which RMSNorm every norm of the model is.
    pub norm: NormKind,
    pub rope_style: RopeStyle,
    /// `rope.freq_base` when the file does not say.
    pub default_rope_theta: f32,
}

impl Recipe {
    /// A dense llama-family recipe: the converter's tensor names, `mixer` attention, SwiGLU FFN, plain RMSNorm.
    pub const fn dense(arch: Arch, mixer: MixerKind, rope_style: RopeStyle, default_rope_theta: f32) -> Recipe {
        Recipe {
            arch,
            names: &LLAMA_NAMES,
            mixer,
            ffn: FfnKind::SwiGlu,
            norm: NormKind::Plain,
            rope_style,
            default_rope_theta,
        }
    }
}

/// A layer's token mixer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixerKind {
    /// Grouped-query self-attention with RoPE, optionally with Q/K/V biases and per-head Q/K norms.
    Attention { qkv_bias: bool, qk_norm: bool },
    /// Gated DeltaNet layers and gated attention layers (per-head Q/K norms, a sigmoid output gate from the query
    /// projection), laid out by [`qwen35::hybrid_from_gguf`].
    Hybrid,
}

/// A layer's feed-forward network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnKind {
    /// `down · (silu(gate · x) * (up · x))`
    SwiGlu,
    /// Expert-routed SwiGLU experts (`qwen3moe`), with a shared expert where the file has one (`qwen35moe`).
    Experts { names: &'static qwen3moe::ExpertNames },
}

/// The GGUF names of a llama-family model's tensors: `blk.{i}.{layer name}.weight` (biases `.bias`), and the
/// model-level ones whole.
#[derive(Debug, PartialEq)]
pub struct TensorNames {
    pub token_embd: &'static str,
    pub output_norm: &'static str,
    pub output: &'static str,
    pub attn_norm: &'static str,
    pub attn_q: &'static str,
    pub attn_k: &'static str,
    pub attn_v: &'static str,
    pub attn_q_norm: &'static str,
    pub attn_k_norm: &'static str,
    pub attn_output: &'static str,
    pub ffn_norm: &'static str,
    pub ffn_gate: &'static str,
    pub ffn_up: &'static str,
    pub ffn_down: &'static str,
}

/// The names llama.cpp's converter gives every llama-family architecture.
pub const LLAMA_NAMES: TensorNames = TensorNames {
    token_embd: "token_embd.weight",
    output_norm: "output_norm.weight",
    output: "output.weight",
    attn_norm: "attn_norm",
    attn_q: "attn_q",
    attn_k: "attn_k",
    attn_v: "attn_v",
    attn_q_norm: "attn_q_norm",
    attn_k_norm: "attn_k_norm",
    attn_output: "attn_output",
    ffn_norm: "ffn_norm",
    ffn_gate: "ffn_gate",
    ffn_up: "ffn_up",
    ffn_down: "ffn_down",
};

impl Arch {
    /// This architecture's recipe.
    pub fn recipe(self) -> &'static Recipe {
        match self {
            Arch::Qwen2 => &qwen2::RECIPE,
            Arch::Llama => &llama::RECIPE,
            Arch::Qwen3 => &qwen3::RECIPE,
            Arch::Qwen3Moe => &qwen3moe::RECIPE,
            Arch::Qwen35 => &qwen35::RECIPE,
            Arch::Qwen35Moe => &qwen35moe::RECIPE,
        }
    }
}

/// Reads the model configuration of any supported architecture.
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig> {
    let name = file.get_str("general.architecture")?.ok_or_else(|| Error::MissingKey("general.architecture".into()))?;
    let recipe = [Arch::Qwen2, Arch::Llama, Arch::Qwen3, Arch::Qwen3Moe, Arch::Qwen35, Arch::Qwen35Moe]
        .into_iter()
        .find(|a| a.name() == name)
        .ok_or_else(|| Error::UnsupportedArch(name.into()))?
        .recipe();
    read_config(file, recipe)
}

/// Values above this are not a real model's and would only make allocations explode.
const MAX_DIM: u64 = 1 << 20;

/// Reads the hyper-parameters every llama-family GGUF stores under `<arch>.`, and the recipe's flags.
fn read_config(file: &GgufFile, recipe: &Recipe) -> Result<ModelConfig> {
    let prefix = recipe.arch.name();
    let req = |k: &str| -> Result<usize> {
        let key = format!("{prefix}.{k}");
        let v = file.get_u64(&key)?.ok_or_else(|| Error::MissingKey(key.clone()))?;
        if v == 0 || v > MAX_DIM * 64 {
            return Err(Error::BadKey { key, reason: format!("value {v} is out of range") });
        }
        Ok(v as usize)
    };
    let opt = |k: &str| -> Result<Option<usize>> { Ok(file.get_u64(&format!("{prefix}.{k}"))?.map(|v| v as usize)) };
    // The MTP blocks (`nextn`) follow the trunk's layers and count in `block_count`.
    let nextn = opt("nextn_predict_layers")?.unwrap_or(0);
    let num_layers = req("block_count")?.checked_sub(nextn).filter(|&n| n > 0).ok_or_else(|| Error::BadKey {
        key: format!("{prefix}.nextn_predict_layers"),
        reason: format!("{nextn} MTP layers leave no trunk"),
    })?;
    let hidden_size = req("embedding_length")?;
    // The widest FFN a row runs through. A MoE file whose layers are all expert-routed may have no dense width
    // (the converter writes no `feed_forward_length` for qwen35moe): its experts' and shared expert's then.
    let ffn_size = match (opt("feed_forward_length")?, recipe.ffn) {
        (Some(_), _) | (None, FfnKind::SwiGlu) => req("feed_forward_length")?,
        (None, FfnKind::Experts { .. }) => {
            let shared = opt("expert_shared_feed_forward_length")?.unwrap_or(0);
            req("expert_feed_forward_length")?.max(shared)
        }
    };
    let num_heads = req("attention.head_count")?;
    let num_kv_heads = opt("attention.head_count_kv")?.unwrap_or(num_heads);
    let head_dim = opt("attention.key_length")?.unwrap_or(hidden_size / num_heads);
    let max_context = req("context_length")?;
    let rope_dim = opt("rope.dimension_count")?.unwrap_or(head_dim);
    let eps_key = format!("{prefix}.attention.layer_norm_rms_epsilon");
    let rms_eps = file.get_f64(&eps_key)?.ok_or(Error::MissingKey(eps_key))? as f32;
    let rope_theta =
        file.get_f64(&format!("{prefix}.rope.freq_base"))?.map(|v| v as f32).unwrap_or(recipe.default_rope_theta);
    let vocab_size = match opt("vocab_size")? {
        Some(v) => v,
        None => file
            .tensor(recipe.names.token_embd)
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| Error::MissingTensor(recipe.names.token_embd.into()))? as usize,
    };
    if num_kv_heads == 0 || num_heads % num_kv_heads != 0 || rope_dim > head_dim || rope_dim % 2 != 0 {
        return Err(Error::BadKey {
            key: format!("{prefix}.attention"),
            reason: format!(
                "inconsistent heads: {num_heads} query, {num_kv_heads} kv, head_dim {head_dim}, rope_dim {rope_dim}"
            ),
        });
    }
    let (qkv_bias, qk_norm) = match recipe.mixer {
        MixerKind::Attention { qkv_bias, qk_norm } => (qkv_bias, qk_norm),
        MixerKind::Hybrid => (false, true),
    };
    Ok(ModelConfig {
        arch: recipe.arch,
        shapes: ModelShapes {
            num_layers,
            hidden_size,
            ffn_size,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            max_context,
        },
        rms_eps,
        rope_theta,
        rope_dim,
        rope_style: recipe.rope_style,
        qkv_bias,
        qk_norm,
        tied_embeddings: file.tensor(recipe.names.output).is_none(),
    })
}
