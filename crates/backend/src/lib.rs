//! Compute backends. `cpu` is the reference implementation and the test oracle for every other backend.
//!
//! Backend operations are named after the math (`rms_norm`, `rope`, `matmul`, `attention`); they take numbers and
//! buffers, never model names.

pub mod cpu;
pub mod cuda;
