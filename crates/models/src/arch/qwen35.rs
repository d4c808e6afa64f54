//! Qwen3.5 / Qwen3.6 / Qwen3.8 dense hybrids (`qwen35`): three of every four layers are Gated DeltaNet
//! (`backend::RecurrentWeights`), the others gated full attention; a dense SwiGLU FFN after each. What the GGUF
//! converter (llama.cpp's conversion/qwen.py) changes from the checkpoint, and so what the recipe reads:
//! - the zero-centred norms (`x̂ · (1 + w)`) are stored with the `+1` added (every `*norm.weight` except the
//!   DeltaNet's output norm `ssm_norm`, which is plain in the checkpoint too), so every norm here is plain;
//! - `A_log` is stored as `ssm_a = −exp(A_log)`, `dt_bias` as `ssm_dt.bias`, the conv as `[conv_dim, kernel]`;
//! - value heads are reordered from grouped-by-key-head to tiled (`_reorder_v_heads`): value head `h` of the
//!   file reads key head `h % num_k_heads`;
//! - `attn_q` holds each head's query then its output gate (`[2 · heads · head_dim, hidden]`, per head);
//! - the FFN's norm is `post_attention_norm`;
//! - `block_count` counts the MTP (`nextn`) blocks appended after the trunk.
//!
//! RoPE is NeoX-style over the first `rope.dimension_count` (64 of 256) dims of each head. The file's
//! multi-section (IMROPE) layout gives each rotated pair the position of its section; for text every section
//! carries the same position, so it is exactly NeoX.

use backend::{NormKind, RecurrentSpec, RopeStyle};
use gguf::GgufFile;

use super::{FfnKind, LLAMA_NAMES, MixerKind, Recipe, TensorNames};
use crate::{Arch, Error, ModelConfig, Result};

pub const RECIPE: Recipe = Recipe {
    arch: Arch::Qwen35,
    names: &NAMES,
    mixer: MixerKind::Hybrid,
    ffn: FfnKind::SwiGlu,
    norm: NormKind::Plain,
    rope_style: RopeStyle::Neox,
    default_rope_theta: 10_000_000.0,
};

pub(super) const NAMES: TensorNames = TensorNames { ffn_norm: "post_attention_norm", ..LLAMA_NAMES };

/// The GGUF names of a Gated DeltaNet layer's weights (`blk.{i}.{name}`).
pub struct DeltaNetNames;

impl DeltaNetNames {
    pub const QKV: &str = "attn_qkv.weight";
    pub const Z: &str = "attn_gate.weight";
    pub const BETA: &str = "ssm_beta.weight";
    pub const ALPHA: &str = "ssm_alpha.weight";
    pub const CONV: &str = "ssm_conv1d.weight";
    pub const DT_BIAS: &str = "ssm_dt.bias";
    pub const A: &str = "ssm_a";
    pub const NORM: &str = "ssm_norm.weight";
    pub const OUT: &str = "ssm_out.weight";
}

/// Which layers of a hybrid are Gated DeltaNet, and their numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Hybrid {
    /// Per trunk layer: Gated DeltaNet (true) or gated attention.
    pub recurrent: Vec<bool>,
    pub spec: RecurrentSpec,
}

/// The hybrid layout of a `qwen35` or `qwen35moe` file (`None` for architectures without Gated DeltaNet layers).
pub fn hybrid_from_gguf(file: &GgufFile, cfg: &ModelConfig) -> Result<Option<Hybrid>> {
    if cfg.arch.recipe().mixer != MixerKind::Hybrid {
        return Ok(None);
    }
    let p = cfg.arch.name();
    let req = |k: &str| -> Result<usize> {
        let key = format!("{p}.{k}");
        match file.get_u64(&key)? {
            Some(v) if v > 0 && v <= 1 << 20 => Ok(v as usize),
            Some(v) => Err(Error::BadKey { key, reason: format!("value {v} is out of range") }),
            None => Err(Error::MissingKey(key)),
        }
    };
    let conv_kernel = req("ssm.conv_kernel")?;
    let head_k_dim = req("ssm.state_size")?;
    let num_k_heads = req("ssm.group_count")?;
    let num_v_heads = req("ssm.time_step_rank")?;
    let inner = req("ssm.inner_size")?;
    let bad = |reason: String| Error::BadKey { key: format!("{p}.ssm"), reason };
    if inner % num_v_heads != 0 || num_v_heads % num_k_heads != 0 || conv_kernel < 2 {
        return Err(bad(format!(
            "inner size {inner}, {num_k_heads} key heads, {num_v_heads} value heads, conv kernel {conv_kernel}"
        )));
    }
    let spec = RecurrentSpec {
        num_k_heads,
        num_v_heads,
        head_k_dim,
        head_v_dim: inner / num_v_heads,
        conv_kernel,
        l2_eps: cfg.rms_eps,
    };
    let n = cfg.num_layers;
    let key = format!("{p}.attention.recurrent_layers");
    let recurrent = match file.get(&key) {
        Some(v) => {
            let arr = v.as_array().ok_or_else(|| Error::BadKey { key: key.clone(), reason: "not an array".into() })?;
            let flags = arr.iter().map(|e| e.as_bool()).collect::<Option<Vec<bool>>>();
            let mut flags = flags.ok_or_else(|| Error::BadKey { key: key.clone(), reason: "not bools".into() })?;
            if flags.len() < n {
                return Err(Error::BadKey { key, reason: format!("{} entries for {n} layers", flags.len()) });
            }
            flags.truncate(n);
            flags
        }
        None => {
            let every = file.get_u64(&format!("{p}.full_attention_interval"))?.unwrap_or(4).max(1) as usize;
            (0..n).map(|i| (i + 1) % every != 0).collect()
        }
    };
    Ok(Some(Hybrid { recurrent, spec }))
}
