//! # tefl-backend-vulkan
//!
//! tefl's portable backend (kind `flagos`, impl ids `default.vulkan`, vendor name `vulkan`,
//! device `vulkan`): Vulkan compute through `ash`, with the loader opened at run time.
//!
//! This crate currently holds the backend description and the availability check; it
//! registers no op yet (WGSL kernels compiled by naga come with the Vulkan backend issue).

pub mod vendor;

pub use vendor::{availability, vendor_info};

/// The backend's name (`TE_BACKEND`, `cargo xtask test-backend`).
pub const BACKEND: &str = vendor::VENDOR;
