//! Dropout: one thread per Philox block of four elements (the reference's stream).

use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result};

use crate::{Defines, Variant};

use super::host::{Arg, Grid, OnDevice, blocks_for, cty, empty, ptr, sm_count};

const BLOCK: u32 = 256;

/// The variant of `simt/dropout.cu` for a dtype (launches and the compile test).
fn variant(op: &'static str, dtype: DType) -> Result<Variant> {
    let defines = Defines::new().set("TX", cty(op, "x", dtype)?).set("BLOCK", BLOCK);
    Ok(Variant::new(&tefl_kernels::DROPOUT, &["dropout_fwd", "dropout_bwd"], defines))
}

fn kernel(op: &'static str, ctx: &KernelCtx<'_>, dtype: DType) -> Result<OnDevice> {
    OnDevice::new(ctx.device, variant(op, dtype)?)
}

/// The catalogue op `dropout_fwd` on a GPU through the portable kernels of `simt/dropout.cu` (every SIMT backend's impl).
pub fn dropout_fwd(ctx: &KernelCtx<'_>, a: &DropoutFwdArgs) -> Result<DropoutFwdOut> {
    let k = kernel("dropout_fwd", ctx, a.x.dtype())?;
    let y = empty(ctx.device, a.x.shape(), a.x.dtype())?;
    let mask = empty(ctx.device, a.x.shape(), DType::U8)?;
    let total = a.x.numel();
    k.launch(
        "dropout_fwd",
        Grid::linear(blocks_for(total.div_ceil(4), BLOCK as usize, sm_count(ctx.device) * 16), BLOCK),
        &[
            Arg::Ptr(ptr(&a.x)?),
            Arg::Ptr(ptr(&y)?),
            Arg::Ptr(ptr(&mask)?),
            Arg::U64(total as u64),
            Arg::F32(a.p),
            Arg::U64(a.seed),
            Arg::U64(a.offset),
        ],
    )?;
    Ok(DropoutFwdOut { y, mask })
}

/// The catalogue op `dropout_bwd` on a GPU through the portable kernels of `simt/dropout.cu` (every SIMT backend's impl).
pub fn dropout_bwd(ctx: &KernelCtx<'_>, a: &DropoutBwdArgs) -> Result<DropoutBwdOut> {
    let k = kernel("dropout_bwd", ctx, a.dy.dtype())?;
    let dx = empty(ctx.device, a.dy.shape(), a.dy.dtype())?;
    let total = a.dy.numel();
    k.launch(
        "dropout_bwd",
        Grid::linear(blocks_for(total, BLOCK as usize, sm_count(ctx.device) * 16), BLOCK),
        &[Arg::Ptr(ptr(&a.dy)?), Arg::Ptr(ptr(&a.mask)?), Arg::Ptr(ptr(&dx)?), Arg::U64(total as u64), Arg::F32(a.p)],
    )?;
    Ok(DropoutBwdOut { dx })
}

/// Variants covering every code path (the NVRTC compile test).
pub fn variants() -> Vec<Variant> {
    [DType::F32, DType::F16, DType::BF16].into_iter().filter_map(|d| variant("dropout", d).ok()).collect()
}
