//! Model architectures: configuration read from GGUF metadata, weight-name tables, and the model runner that executes
//! a batch of token chunks on a backend.
//!
//! Model knowledge lives in `arch/<name>.rs` (which keys and tensors an architecture has, and how it differs from the
//! shared transformer); the forward pass itself is shared and takes only numbers from [`ModelConfig`].

pub mod arch;
mod config;
pub mod cpu;
pub mod cuda;
pub mod draft_head;
mod error;
pub mod kv_cache;
pub mod prefix_store;
pub mod reference;
mod runner;
mod weights;

pub use config::{Arch, ModelConfig};
pub use error::{Error, Result};
pub use kv_cache::KvUsage;
pub use runner::{Batch, LogitsWanted, Runner, SeqChunk, SeqId, argmax, top_candidates, top_prob};
pub use weights::{LayerWeights, Weights};
