pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] gguf::Error),
    #[error("unsupported architecture {0:?} (supported: qwen2, llama, qwen3, qwen3moe, qwen35)")]
    UnsupportedArch(String),
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    #[error("metadata key {key:?}: {reason}")]
    BadKey { key: String, reason: String },
    #[error("tensor {0:?} is missing")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    BadShape { name: String, found: Vec<u64>, expected: Vec<u64> },
    #[error("tensor {name:?} has type {ty}, which the CPU backend does not support")]
    UnsupportedType { name: String, ty: gguf::GgmlType },
    #[error("GPU backend: {0}")]
    Backend(String),
    #[error(transparent)]
    Compute(#[from] backend::Error),
    #[error("unsupported: {0}")]
    Unsupported(String),
    // Request-scoped errors: the batch was wrong, the model is fine.
    #[error("sequence {0} would exceed the model's context of {1} tokens")]
    ContextOverflow(u64, usize),
    #[error("sequence {seq}: chunk starts at position {start} but the sequence holds {len} tokens")]
    BadPosition { seq: u64, start: usize, len: usize },
    #[error("sequence {0} appears twice in one batch")]
    DuplicateSeq(u64),
    #[error("token id {0} is outside the vocabulary")]
    BadToken(u32),
    #[error("sequence {seq}: a recurrent state cannot be cut back from {len} to {to} tokens (no checkpoint there)")]
    StateRollback { seq: u64, len: usize, to: usize },
    #[error("the KV cache is full: {needed} more blocks needed, {available} available")]
    KvCacheFull { needed: usize, available: usize },
}
