//! Model architectures: configuration read from GGUF metadata, weight-name tables, and the model runner that executes
//! a batch of token chunks on a backend.
//!
//! Model knowledge lives in `arch/<name>.rs` (a recipe: the architecture's weights, layer and FFN kinds); the forward
//! pass is written once in [`transformer`] over the `backend::Backend` trait and takes only numbers from
//! [`ModelConfig`]. [`cpu::CpuRunner`] drives it on the CPU backend, [`cuda::CudaRunner`] on the model's fused GPU
//! backend, both with the KV system of `kv_cache`.

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
pub mod state;
pub mod transformer;
mod weights;

pub use config::{Arch, ModelConfig, ModelShapes};
pub use error::{Error, Result};
pub use kv_cache::KvUsage;
pub use runner::{Batch, LogitsWanted, NextStep, Runner, SeqChunk, SeqId, argmax, top_candidates, top_prob};
pub use weights::{LayerWeights, Weights};
