//! # tefl-backend-nvidia
//!
//! tefl's CUDA backend (vendor `nvidia`, impl ids `vendor.nvidia`, device `cuda`).
//!
//! This crate currently holds the vendor description, the driver availability check and
//! the CUDA device runtime (memory and copies, so tensors can live on `cuda:N` and the
//! reference serves them through host staging); it registers no op yet, so the coverage
//! table lists no nvidia impl. Kernels
//! (NVRTC-compiled CUDA C++ under `src/ops/`, GEMM through cuBLASLt) come with the
//! NVIDIA backend issue.
//!
//! Loading is dynamic (cudarc's `dynamic-loading`): a binary built with this feature
//! starts on a machine without the driver and reports the backend unavailable.

pub mod runtime;
pub mod vendor;

pub use vendor::{availability, vendor_info};

/// The backend's name (`TE_BACKEND`, `cargo xtask test-backend`).
pub const BACKEND: &str = vendor::VENDOR;
