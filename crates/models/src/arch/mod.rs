//! Per-architecture knowledge: which GGUF keys describe the model and how it departs from the shared transformer.

mod llama;
mod qwen2;
mod qwen3;

use gguf::GgufFile;

use backend::cpu::ops::RopeStyle;

use crate::{Arch, Error, ModelConfig, Result};

/// Reads the model configuration of any supported architecture.
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig> {
    let arch = file.get_str("general.architecture")?.ok_or_else(|| Error::MissingKey("general.architecture".into()))?;
    match arch {
        "qwen2" => qwen2::config(file),
        "llama" => llama::config(file),
        "qwen3" => qwen3::config(file),
        other => Err(Error::UnsupportedArch(other.into())),
    }
}

/// Values above this are not a real model's and would only make allocations explode.
const MAX_DIM: u64 = 1 << 20;

/// Reads the hyper-parameters every llama-family GGUF stores under `<arch>.`; the architecture's own flags (biases,
/// q/k norms, tied output) start off and are set by the caller.
pub(crate) fn read_common(
    file: &GgufFile,
    arch: Arch,
    rope_style: RopeStyle,
    default_theta: f32,
) -> Result<ModelConfig> {
    let prefix = arch.name();
    let req = |k: &str| -> Result<usize> {
        let key = format!("{prefix}.{k}");
        let v = file.get_u64(&key)?.ok_or_else(|| Error::MissingKey(key.clone()))?;
        if v == 0 || v > MAX_DIM * 64 {
            return Err(Error::BadKey { key, reason: format!("value {v} is out of range") });
        }
        Ok(v as usize)
    };
    let opt = |k: &str| -> Result<Option<usize>> { Ok(file.get_u64(&format!("{prefix}.{k}"))?.map(|v| v as usize)) };
    let num_layers = req("block_count")?;
    let hidden_size = req("embedding_length")?;
    let ffn_size = req("feed_forward_length")?;
    let num_heads = req("attention.head_count")?;
    let num_kv_heads = opt("attention.head_count_kv")?.unwrap_or(num_heads);
    let head_dim = opt("attention.key_length")?.unwrap_or(hidden_size / num_heads);
    let max_context = req("context_length")?;
    let rope_dim = opt("rope.dimension_count")?.unwrap_or(head_dim);
    let eps_key = format!("{prefix}.attention.layer_norm_rms_epsilon");
    let rms_eps = file.get_f64(&eps_key)?.ok_or(Error::MissingKey(eps_key))? as f32;
    let rope_theta = file.get_f64(&format!("{prefix}.rope.freq_base"))?.map(|v| v as f32).unwrap_or(default_theta);
    let vocab_size = match opt("vocab_size")? {
        Some(v) => v,
        None => file
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| Error::MissingTensor("token_embd.weight".into()))? as usize,
    };
    if num_kv_heads == 0 || num_heads % num_kv_heads != 0 || rope_dim > head_dim || rope_dim % 2 != 0 {
        return Err(Error::BadKey {
            key: format!("{prefix}.attention"),
            reason: format!(
                "inconsistent heads: {num_heads} query, {num_kv_heads} kv, head_dim {head_dim}, rope_dim {rope_dim}"
            ),
        });
    }
    Ok(ModelConfig {
        arch,
        num_layers,
        hidden_size,
        ffn_size,
        num_heads,
        num_kv_heads,
        head_dim,
        vocab_size,
        rms_eps,
        rope_theta,
        rope_dim,
        rope_style,
        max_context,
        qkv_bias: false,
        qk_norm: false,
        tied_embeddings: false,
    })
}
