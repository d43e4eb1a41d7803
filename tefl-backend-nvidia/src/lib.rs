//! # tefl-backend-nvidia
//!
//! tefl's CUDA backend (vendor `nvidia`, impl id `vendor.nvidia`, device `cuda`). Laid out
//! like a FlagGems vendor folder:
//!
//! - `vendor.rs`: the [`VendorInfo`](tefl_core::VendorInfo) and the driver check;
//! - `runtime.rs`: the CUDA device runtime (memory, copies, the stream, event timing);
//! - `compiler.rs`: NVRTC compilation of the kernel sources with the embedded prelude
//!   (`kernels/prelude.cuh`), the on-disk cubin cache and kernel launch;
//! - `ops/`: one Rust file and one `.cu` file per op family, registered with `inventory`;
//! - `tune_configs.toml`, `hopper/tune_configs.toml` and `heuristics.rs`: launch parameters.
//!
//! GEMM goes through cuBLASLt. Loading is dynamic (cudarc's `dynamic-loading`): a binary
//! built with this backend starts on a machine without the driver and reports the backend
//! unavailable; without libnvrtc the kernels report unavailable too, and the manager picks
//! another impl.

pub mod compiler;
pub mod heuristics;
pub mod ops;
pub mod runtime;
pub mod vendor;

pub use ops::OPS;
pub use vendor::{availability, vendor_info};

/// The backend's name (`TE_BACKEND`, `cargo xtask test-backend`).
pub const BACKEND: &str = vendor::VENDOR;

/// The impl id every op registers.
pub const IMPL_ID: &str = "vendor.nvidia";

/// Whether the kernels can run: a CUDA device is usable and libnvrtc loads.
pub fn kernels_available() -> Result<(), String> {
    availability()?;
    compiler::nvrtc_available()
}
