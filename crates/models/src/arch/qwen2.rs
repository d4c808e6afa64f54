//! Qwen2 / Qwen2.5: biases on Q, K and V, GQA, NeoX-style RoPE (θ = 1e6 in the released models), untied output
//! (the small ones tie it; the file then has no `output.weight`).

use backend::cpu::ops::RopeStyle;
use gguf::GgufFile;

use crate::{Arch, ModelConfig, Result};

pub fn config(file: &GgufFile) -> Result<ModelConfig> {
    let mut c = super::read_common(file, Arch::Qwen2, RopeStyle::Neox, 1_000_000.0)?;
    c.qkv_bias = true;
    c.tied_embeddings = file.tensor("output.weight").is_none();
    Ok(c)
}
