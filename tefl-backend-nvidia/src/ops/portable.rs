//! The portable kernels of `tefl-gpu` (the ones the HIP backend runs for GEMM and attention),
//! registered on CUDA as `vendor.nvidia.portable` so that the conformance suite checks them on
//! real hardware. Selected only by id (`TE_FL_PER_OP='generic_gemm=impl:vendor.nvidia.portable'`)
//! and by the conformance suite: cuBLASLt and the tensor-core attention stay the CUDA backend's.

use tefl_core::catalogue::{FusedAttnBwd, FusedAttnFwd, GenericGemm};
use tefl_core::op::Op;
use tefl_core::registry::ImplRegistration;
use tefl_core::{BackendImplKind, DType, DeviceKind, OpImpl};

/// The impl id of the portable kernels on CUDA.
pub const PORTABLE_IMPL_ID: &str = "vendor.nvidia.portable";

/// The float dtypes every portable kernel takes.
const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

fn portable<O: Op>(
    dtypes: &[DType],
    kernel: fn(&tefl_core::KernelCtx<'_>, &O::Args) -> tefl_core::Result<O::Output>,
) -> OpImpl {
    OpImpl::new::<O>(PORTABLE_IMPL_ID, BackendImplKind::Vendor, kernel)
        .vendor(crate::vendor::VENDOR)
        .device(DeviceKind::CUDA)
        .dtypes(dtypes)
        .available(crate::kernels_available)
        .compiled_in()
        .by_name_only()
}

// The GEMM with FP8 inputs too: the HIP backend's FP8 GEMMs run this kernel.
inventory::submit! {
    ImplRegistration {
        make: || {
            let dtypes = [FLOATS, &[DType::F8E4M3, DType::F8E5M2]].concat();
            portable::<GenericGemm>(&dtypes, tefl_gpu::simt::gemm::generic_gemm)
        },
    }
}
inventory::submit! {
    ImplRegistration { make: || portable::<FusedAttnFwd>(FLOATS, tefl_gpu::simt::attention::fused_attn_fwd) }
}
inventory::submit! {
    ImplRegistration { make: || portable::<FusedAttnBwd>(FLOATS, tefl_gpu::simt::attention::fused_attn_bwd) }
}
