//! Llama (and SmolLM2, which is a llama): no biases, GQA, RoPE over adjacent pairs (GGUF conversion permutes Q and K
//! so that llama.cpp's "normal" rotation applies), embeddings tied when the file has no `output.weight`.

use backend::cpu::ops::RopeStyle;
use gguf::GgufFile;

use crate::{Arch, ModelConfig, Result};

pub fn config(file: &GgufFile) -> Result<ModelConfig> {
    let mut c = super::read_common(file, Arch::Llama, RopeStyle::Interleaved, 10_000.0)?;
    c.tied_embeddings = file.tensor("output.weight").is_none();
    Ok(c)
}
