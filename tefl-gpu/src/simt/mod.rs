//! The host side of the SIMT kernels of `tefl-kernels` (`simt/*.cu`), shared by every GPU
//! backend (including the portable tiled GEMM and the GEMM epilogue): one file per op family, each building its launch plans ([`Variant`]s, grids,
//! arguments) and launching them through the [`GpuTarget`](crate::target::GpuTarget) of the
//! call's device. A backend registers these functions under its own impl id (see the CUDA and
//! HIP crates' `ops/mod.rs`); `variants()` lists every variant they can build, for each
//! backend's compile-every-variant test.

pub(crate) mod host;

pub mod activation;
pub mod attention;
pub mod dropout;
pub mod gemm;
pub mod norm;
pub mod optimizer;
pub mod quantize;
pub mod rope;
pub mod softmax;

use crate::Variant;

/// Every variant the SIMT op files can launch (the compile tests build each of them).
pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    v.extend(norm::variants());
    v.extend(activation::variants());
    v.extend(softmax::variants());
    v.extend(dropout::variants());
    v.extend(rope::variants());
    v.extend(optimizer::variants());
    v.extend(quantize::variants());
    v.extend(gemm::variants());
    v.extend(attention::variants());
    v
}
