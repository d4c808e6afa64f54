use backend::RopeStyle;
pub use plan::ModelShapes;

/// The architectures Splash runs. Each is a recipe in `arch/<name>.rs` (its weights and its layer and FFN kinds)
/// over the shared forward pass (`transformer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Qwen2,
    Llama,
    Qwen3,
    Qwen3Moe,
    /// The Qwen3.5/3.6 dense hybrids (Gated DeltaNet + gated attention).
    Qwen35,
    /// The Qwen3.5/3.6 MoE hybrids: `Qwen35`'s layers with an expert-routed FFN and a shared expert.
    Qwen35Moe,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
        }
    }
}

/// Everything the forward pass needs to know about a model, as numbers and flags: its shapes (the one shapes type,
/// [`ModelShapes`], also read through `Deref`: `cfg.hidden_size`) and the numbers of its layers.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub shapes: ModelShapes,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Dimensions of each head that are rotated (the first `rope_dim`).
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    /// Q, K and V projections carry biases (qwen2; from the architecture's recipe).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of queries and keys before RoPE (qwen3; from the architecture's recipe).
    pub qk_norm: bool,
    /// The output projection reuses the token embedding.
    pub tied_embeddings: bool,
}

impl std::ops::Deref for ModelConfig {
    type Target = ModelShapes;

    fn deref(&self) -> &ModelShapes {
        &self.shapes
    }
}

impl std::ops::DerefMut for ModelConfig {
    fn deref_mut(&mut self) -> &mut ModelShapes {
        &mut self.shapes
    }
}

impl ModelConfig {
    /// Bytes of KV cache per token at f16 (keys and values of every layer): [`ModelShapes::kv_bytes_per_token`].
    pub fn kv_bytes_per_token(&self) -> usize {
        self.shapes.kv_bytes_per_token() as usize
    }
}
