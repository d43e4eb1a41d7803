//! The HIP backend's ops, registered under `vendor.amd`: the SIMT families are the shared
//! host code of `tefl_gpu::simt` (the same launch plans as CUDA's), compiled by hiprtc from the
//! `tefl-kernels` sources and launched through this crate's `GpuTarget` (`launch.rs`).
//! GEMM is hipBLASLt when it is installed (`gemm.rs`), else the portable tiled kernel with the
//! shared epilogue.
//! Attention is the portable flash attention (forward and backward). So `vendor.amd` serves
//! every op of the catalogue: `bgrad_quantize` through the shared cast kernel, the GEMMs (the
//! grouped one per group) for float and FP8 inputs.

pub mod gemm;

pub use tefl_gpu::simt::{activation, attention, dropout, norm, optimizer, quantize, rope, softmax};

use tefl_core::catalogue::*;

// Every op of the catalogue, each served by `<family>::<op>` of the shared modules above (the
// FP8 training set too: FP8 GEMM inputs on the portable kernel).
tefl_core::register_backend! {
    impl_id: crate::IMPL_ID, kind: Vendor, vendor: crate::vendor::VENDOR, device: tefl_core::DeviceKind::HIP,
    available: crate::kernels_available, ops: all + fp8
}
