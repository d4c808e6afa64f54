use backend::cpu::ops::RopeStyle;

/// The architectures Splash runs. Each differs from the shared transformer only in the flags of [`ModelConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Qwen2,
    Llama,
    Qwen3,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
        }
    }
}

/// Everything the forward pass needs to know about a model, as numbers and flags.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub num_layers: usize,
    pub hidden_size: usize,
    pub ffn_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Dimensions of each head that are rotated (the first `rope_dim`).
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    /// The context length the model was trained for.
    pub max_context: usize,
    /// Q, K and V projections carry biases (qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of queries and keys before RoPE (qwen3).
    pub qk_norm: bool,
    /// The output projection reuses the token embedding.
    pub tied_embeddings: bool,
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Bytes of KV cache per token at f16 (keys and values of every layer).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.num_layers * self.kv_dim() * 2
    }
}
