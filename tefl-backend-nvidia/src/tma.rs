//! The tensor memory accelerator's tile maps (`cuTensorMapEncodeTiled`) for the Hopper kernels
//! (`cuda/hopper.h`'s `TensorMap`): row-major tensors of up to 5 dimensions, boxes written to
//! shared memory with the 128-byte swizzle that wgmma's descriptors read.

use std::ffi::c_void;

use cudarc::driver::sys;
use tefl_core::{DType, Error, KernelCtx, Result};

/// A `CUtensorMap`'s 128 bytes, aligned as the kernels' `TensorMap`.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct TensorMap(pub [u64; 16]);

impl TensorMap {
    /// An unused slot of a table (never read by the kernels).
    pub const UNUSED: TensorMap = TensorMap([0; 16]);
}

fn data_type(d: DType) -> sys::CUtensorMapDataType {
    match d {
        DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        _ => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
    }
}

/// The map of the tensor at `addr` with `dims` (innermost first, in elements) and the byte
/// `strides` of every dimension after the first, copied in boxes of `boxes` elements per
/// dimension with the 128-byte swizzle (zeros past the edges). The caller checks what the
/// driver needs: a 16-byte aligned `addr`, strides that are 16-byte multiples, an innermost box
/// of at most 128 bytes. `op` names the failing op in the error.
pub(crate) fn encode(
    ctx: &KernelCtx<'_>,
    op: &str,
    addr: u64,
    dtype: DType,
    dims: &[u64],
    strides: &[u64],
    boxes: &[u32],
) -> Result<TensorMap> {
    let rank = dims.len();
    if !(1..=5).contains(&rank) || strides.len() + 1 != rank || boxes.len() != rank {
        return Err(Error::DeviceFailure {
            device: ctx.device.to_string(),
            reason: format!(
                "{op}: a tensor map of rank {rank} with {} strides and {} boxes",
                strides.len(),
                boxes.len()
            ),
        });
    }
    let element_strides = [1u32; 5];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: `dims`, `boxes` and `element_strides` hold `rank` entries and `strides` rank - 1
    // (checked above); the driver only writes `map`. `addr` is a device address the caller
    // checked to be 16-byte aligned, with 16-byte-multiple strides; encoding reads no device
    // memory.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type(dtype),
            rank as u32,
            addr as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::DeviceFailure {
            device: ctx.device.to_string(),
            reason: format!("{op}: cuTensorMapEncodeTiled ({dims:?} {dtype}, boxes {boxes:?}): {r:?}"),
        });
    }
    Ok(TensorMap(map.opaque))
}

/// The map of a row-major `[outer, inner]` matrix, boxes of `box_inner x box_outer` elements.
pub(crate) fn encode_2d(
    ctx: &KernelCtx<'_>,
    op: &str,
    addr: u64,
    dtype: DType,
    (inner, outer): (usize, usize),
    (box_inner, box_outer): (u32, u32),
) -> Result<TensorMap> {
    let stride = (inner * dtype.size_in_bytes()) as u64;
    encode(ctx, op, addr, dtype, &[inner as u64, outer as u64], &[stride], &[box_inner, box_outer])
}
