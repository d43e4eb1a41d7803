//! The reference kernels, one file per op family, and their registrations.

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
    impl_id: crate::IMPL_ID, kind: Reference, device: tefl_core::DeviceKind::CPU, ops: all + fp8
}
