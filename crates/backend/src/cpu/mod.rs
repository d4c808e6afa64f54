//! The CPU backend: a persistent thread pool, quantized matrix kernels with runtime SIMD dispatch, and the small
//! elementwise and attention operations a transformer forward pass needs.

pub mod attention;
mod backend;
pub mod deltanet;
pub mod experts;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod quant;
pub mod simd;

pub use backend::{CpuBackend, CpuKvPages, CpuTensor, KvBlock};
pub use matmul::{QMatrix, matmul};
pub use pool::ThreadPool;
