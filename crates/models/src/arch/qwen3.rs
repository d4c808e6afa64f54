//! Qwen3 (dense): like Qwen2 without Q/K/V biases, plus a per-head RMSNorm of queries and keys before RoPE.

use backend::cpu::ops::RopeStyle;
use gguf::GgufFile;

use crate::{Arch, ModelConfig, Result};

pub fn config(file: &GgufFile) -> Result<ModelConfig> {
    let mut c = super::read_common(file, "qwen3", 1_000_000.0)?.into_config(Arch::Qwen3, RopeStyle::Neox);
    c.qk_norm = true;
    c.tied_embeddings = file.tensor("output.weight").is_none();
    Ok(c)
}
