//! Dropout with Philox 4x32-10 (the stream of `tefl_core::philox`).

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::device::try_zeroed;
use tefl_core::philox::uniforms4;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use crate::util::{CHUNK, store, view};

/// The catalogue op `dropout_fwd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn dropout_fwd(_: &KernelCtx<'_>, a: &DropoutFwdArgs) -> Result<DropoutFwdOut> {
    let x = view(&a.x)?;
    let keep_scale = 1.0 / (1.0 - a.p);
    let mut y = try_zeroed::<f32>(x.len(), || format!("dropout_fwd output y [{}]", x.len()))?;
    let mut mask = try_zeroed::<u8>(x.len(), || format!("dropout_fwd mask [{}]", x.len()))?;
    // CHUNK is a multiple of 4, so every chunk starts at a Philox block boundary.
    y.par_chunks_mut(CHUNK).zip(mask.par_chunks_mut(CHUNK)).zip(x.par_chunks(CHUNK)).enumerate().for_each(
        |(c, ((yc, mc), xc))| {
            let base = (c * CHUNK) as u64;
            for (blk, ((yb, mb), xb)) in yc.chunks_mut(4).zip(mc.chunks_mut(4)).zip(xc.chunks(4)).enumerate() {
                let u = uniforms4(a.seed, a.offset, base / 4 + blk as u64);
                for l in 0..xb.len() {
                    let keep = u[l] >= a.p;
                    mb[l] = u8::from(keep);
                    // A product, as torch's: a dropped NaN stays NaN.
                    yb[l] = xb[l] * if keep { keep_scale } else { 0.0 };
                }
            }
        },
    );
    Ok(DropoutFwdOut {
        y: store(&y, a.x.shape(), a.x.dtype())?,
        mask: Tensor::from_slice(&mask, a.x.shape(), DType::U8)?,
    })
}

/// The catalogue op `dropout_bwd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn dropout_bwd(_: &KernelCtx<'_>, a: &DropoutBwdArgs) -> Result<DropoutBwdOut> {
    let dy = view(&a.dy)?;
    let mask = a.mask.host_bytes()?;
    let keep_scale = 1.0 / (1.0 - a.p);
    let mut dx = try_zeroed::<f32>(dy.len(), || format!("dropout_bwd output dx [{}]", dy.len()))?;
    dx.par_chunks_mut(CHUNK).zip(dy.par_chunks(CHUNK).zip(mask.par_chunks(CHUNK))).for_each(|(o, (d, m))| {
        for ((x, dv), mv) in o.iter_mut().zip(d).zip(m) {
            *x = dv * if *mv != 0 { keep_scale } else { 0.0 };
        }
    });
    Ok(DropoutBwdOut { dx: store(&dx, a.dy.shape(), a.dy.dtype())? })
}
