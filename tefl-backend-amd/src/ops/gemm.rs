//! `generic_gemm` on HIP: hipBLASLt when it is installed and has an algorithm for the shape
//! (through the shared host logic of `tefl_gpu::blaslt`, fused epilogues included), otherwise
//! the portable tiled kernel with the shared epilogue (`tefl_gpu::simt::gemm`). FP8 inputs
//! always take the portable kernel, which decodes the OCP codes itself: hipBLASLt's FP8 types
//! are the FNUZ formats on gfx942 and the OCP ones only on gfx950 and gfx12, and
//! `hipblaslt.rs` maps float types only. `te_general_grouped_gemm` runs `generic_gemm` per group.

use tefl_core::catalogue::{GemmArgs, GemmOut, GroupedGemmArgs, GroupedGemmOut};
use tefl_core::{KernelCtx, Result};

use crate::hipblaslt::{HipBlasLt, usable};

/// `generic_gemm`: hipBLASLt, or the portable kernel where hipBLASLt cannot serve.
pub fn generic_gemm(ctx: &KernelCtx<'_>, a: &GemmArgs) -> Result<GemmOut> {
    if a.a.dtype().is_fp8() {
        return tefl_gpu::simt::gemm::generic_gemm(ctx, a);
    }
    match usable(ctx.device) {
        Ok(()) => match tefl_gpu::blaslt::generic_gemm(ctx, a, &HipBlasLt)? {
            Some(out) => return Ok(out),
            None => tracing::debug!(target: "TE-FL", "generic_gemm: hipBLASLt has no algorithm; portable kernel"),
        },
        Err(e) => tracing::debug!(target: "TE-FL", "generic_gemm: {e}; portable kernel"),
    }
    tefl_gpu::simt::gemm::generic_gemm(ctx, a)
}

/// `te_general_grouped_gemm`: [`generic_gemm`] per group, in order on the op's queue.
pub fn grouped_gemm(ctx: &KernelCtx<'_>, a: &GroupedGemmArgs) -> Result<GroupedGemmOut> {
    a.each_group(|g| generic_gemm(ctx, g))
}
