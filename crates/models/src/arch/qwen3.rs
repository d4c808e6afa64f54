//! Qwen3 (dense): like Qwen2 without Q/K/V biases, plus a per-head RMSNorm of queries and keys before RoPE.

use backend::cpu::ops::RopeStyle;
use gguf::GgufFile;

use crate::{Arch, ModelConfig, Result};

pub fn config(file: &GgufFile) -> Result<ModelConfig> {
    let mut c = super::read_common(file, Arch::Qwen3, RopeStyle::Neox, 1_000_000.0)?;
    c.qk_norm = true;
    c.tied_embeddings = file.tensor("output.weight").is_none();
    Ok(c)
}
