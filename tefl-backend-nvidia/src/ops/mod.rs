//! The CUDA kernels' host side, one file per op family (FlagGems' `ops/`), each building its
//! kernel variants from `tefl-kernels` sources and launching them; registered here under
//! `vendor.nvidia` for every op of the catalogue.

pub mod activation;
pub mod attention;
pub mod dropout;
pub mod gemm;
pub mod norm;
pub mod optimizer;
pub mod quantize;
pub mod rope;
pub mod softmax;

use tefl_core::catalogue::*;

// Every op of the catalogue, each served by `<family>::<op>` of the modules above.
tefl_core::register_backend! {
    impl_id: crate::IMPL_ID, kind: Vendor, vendor: crate::vendor::VENDOR, device: tefl_core::DeviceKind::CUDA,
    available: crate::kernels_available, ops: all
}
