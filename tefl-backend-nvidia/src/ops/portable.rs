//! The portable kernels of `tefl-gpu` (the ones the HIP backend runs for GEMM), registered on
//! CUDA as `vendor.nvidia.portable` so that the conformance suite checks them on real hardware.
//! Selected only by id (`TE_FL_PER_OP='generic_gemm=impl:vendor.nvidia.portable'`) and by the
//! conformance suite: cuBLASLt stays the CUDA backend's GEMM.

use tefl_core::catalogue::GenericGemm;
use tefl_core::registry::ImplRegistration;
use tefl_core::{BackendImplKind, DType, DeviceKind, OpImpl};

/// The impl id of the portable kernels on CUDA.
pub const PORTABLE_IMPL_ID: &str = "vendor.nvidia.portable";

fn portable_gemm() -> OpImpl {
    OpImpl::new::<GenericGemm>(PORTABLE_IMPL_ID, BackendImplKind::Vendor, tefl_gpu::simt::gemm::generic_gemm)
        .vendor(crate::vendor::VENDOR)
        .device(DeviceKind::CUDA)
        .dtypes(&[DType::F32, DType::F16, DType::BF16])
        .available(crate::kernels_available)
        .compiled_in()
        .by_name_only()
}

inventory::submit! { ImplRegistration { make: portable_gemm } }
