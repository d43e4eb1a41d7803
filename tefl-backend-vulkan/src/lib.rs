//! # tefl-backend-vulkan
//!
//! tefl's portable tier (impl id `default.vulkan`, kind default, vendor name `vulkan`, device
//! `vulkan`): any GPU with a Vulkan 1.2 driver, and Mesa's lavapipe on a CPU. Laid out like a
//! FlagGems vendor folder:
//!
//! - `vendor.rs`: the [`VendorInfo`](tefl_core::VendorInfo) and the availability check;
//! - `context.rs`: the loader (opened at run time through `ash`), the instance, device order
//!   and `TEFL_VULKAN_DEVICE`, the validation-message counter; `gpu.rs`: an opened device
//!   (queue, `gpu-allocator` memory, pipelines, the command recorder); `runtime.rs`: the
//!   device runtime (`DeviceKind::VULKAN`);
//! - `shaders/*.wgsl`: the kernels, in WGSL, compiled to SPIR-V by naga in `build.rs` (no
//!   external tools), one module per variant (dtypes and workgroup size); `build/cm2.rs`
//!   assembles the GEMM on NVIDIA's workgroup-scope cooperative matrices as SPIR-V 1.6 (WGSL
//!   cannot spell them), and `coopmat2.rs` checks a device offers them;
//! - `ops/`: the registrations; `tune_configs.toml`, `lavapipe/` and `heuristics.rs`: launch
//!   parameters layered over the GPU defaults of `tefl-gpu`.
//!
//! Tensors are bound as arrays of 32-bit words: f16 and bf16 travel as 16-bit halves and are
//! converted on the bits, so no 16-bit storage feature is needed (lavapipe lacks some).
//! Submission is asynchronous (a ring of command buffers on a timeline semaphore; host reads
//! and `synchronize` wait); timestamp queries time it.

pub mod context;
pub mod coopmat2;
pub mod gpu;
pub mod heuristics;
pub mod ops;
pub mod runtime;
pub mod vendor;

pub use context::validation_messages;
pub use vendor::{availability, vendor_info};

/// The backend's name (`TE_BACKEND`, `cargo xtask test-backend`).
pub const BACKEND: &str = vendor::VENDOR;

/// The impl id every op registers.
pub const IMPL_ID: &str = "default.vulkan";
