//! GGUF model files: reading (zero-copy over a memory map), writing, and the quantized block formats.
//!
//! In: a path or a byte buffer. Out: the file's metadata, its tensor table and borrowed views of each tensor's
//! raw bytes. Every length, count and offset in the file is checked against the file's size before it is used, so a
//! truncated, corrupt or hostile file yields an [`Error`] that names what is wrong, never a panic or an
//! out-of-bounds read.

mod error;
pub mod quant;
mod reader;
mod types;
mod value;
mod writer;

pub use error::{Error, Result};
pub use reader::{GgufFile, TensorInfo};
pub use types::GgmlType;
pub use value::{Value, ValueType};
pub use writer::GgufWriter;

/// `GGUF` in little-endian byte order.
pub const MAGIC: u32 = 0x4655_4747;
/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
