//! # tefl-backend-amd
//!
//! tefl's HIP backend (vendor `amd`, impl ids `vendor.amd`, device `hip`).
//!
//! The HIP runtime is loaded at run time with `libloading` (hip-sys links libamdhip64 at
//! build time and pins HIP 5.4, which would stop an all-features binary from starting
//! without ROCm). This crate currently holds the vendor description and the availability
//! check; it registers no op yet.

pub mod vendor;

pub use vendor::{availability, vendor_info};

/// The backend's name (`TE_BACKEND`, `cargo xtask test-backend`).
pub const BACKEND: &str = vendor::VENDOR;
