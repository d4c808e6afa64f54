use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can be wrong with a GGUF file. Each variant says where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("not a GGUF file: magic is {found:#010x}, expected 0x46554747 (\"GGUF\")")]
    BadMagic { found: u32 },
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("file is truncated: {what} needs bytes {start}..{end} but the file has {len} bytes")]
    Truncated { what: String, start: u64, end: u64, len: u64 },
    #[error("{what} is {value}, which exceeds the limit {limit}")]
    TooLarge { what: String, value: u64, limit: u64 },
    #[error("invalid UTF-8 in {what}")]
    BadUtf8 { what: String },
    #[error("unknown metadata value type {ty} for key {key:?}")]
    BadValueType { key: String, ty: u32 },
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    #[error("tensor {name:?}: unknown ggml type {ty}")]
    UnknownTensorType { name: String, ty: u32 },
    #[error("tensor {name:?}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("general.alignment must be a non-zero power of two, got {0}")]
    BadAlignment(u64),
    #[error("metadata key {key:?}: {reason}")]
    Metadata { key: String, reason: String },
    #[error("{0}")]
    Quant(String),
}
