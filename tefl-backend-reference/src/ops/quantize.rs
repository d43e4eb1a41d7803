//! FP8 per-tensor scaling on the CPU.

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::device::try_zeroed_bytes;
use tefl_core::{KernelCtx, Result, Tensor};

use crate::util::{amax, column_sums, scalar_tensor, store, store_fp8, view};

fn transpose_codes(q: &[u8], m: usize, n: usize) -> Result<Vec<u8>> {
    let mut t = try_zeroed_bytes(q.len(), || format!("the transposed codes [{n}, {m}]"))?;
    t.par_chunks_mut(m.max(1)).enumerate().for_each(|(j, col)| {
        for (i, v) in col.iter_mut().enumerate() {
            *v = q[i * n + j];
        }
    });
    Ok(t)
}

/// The catalogue op `quantize` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn quantize(_: &KernelCtx<'_>, a: &QuantizeArgs) -> Result<QuantizeOut> {
    let x = view(&a.x)?;
    let scale = a.scale.to_vec::<f32>()?[0];
    // The codes and the amax in one pass.
    let (q, amax) = store_fp8(&x, a.x.shape(), a.fp8_dtype, scale)?;
    let q_t = if a.want_transpose {
        let (m, n) = (a.x.shape()[0], a.x.shape()[1]);
        Some(Tensor::from_slice(&transpose_codes(&q.host_bytes()?, m, n)?, [n, m], a.fp8_dtype)?)
    } else {
        None
    };
    Ok(QuantizeOut { q, q_t, amax: scalar_tensor(amax)?, scale_inv: scalar_tensor(1.0 / scale)? })
}

/// The catalogue op `bgrad_quantize` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn bgrad_quantize(_: &KernelCtx<'_>, a: &BgradQuantizeArgs) -> Result<BgradQuantizeOut> {
    let (m, n) = (a.x.shape()[0], a.x.shape()[1]);
    let x = view(&a.x)?;
    let scale = a.scale.to_vec::<f32>()?[0];
    let (q, amax) = store_fp8(&x, &[m, n], a.fp8_dtype, scale)?;
    // Column sums in f64 then rounded once: the oracle's sum, whatever the row count (the
    // tasks' partial sums are added in f64 too, so their order moves only f64 roundings).
    let sums: Vec<f64> = column_sums(m, n, "bgrad_quantize output dbias", |r, acc| {
        acc.iter_mut().zip(&x[r * n..(r + 1) * n]).for_each(|(s, v)| *s += f64::from(*v));
    })?;
    let sums: Vec<f32> = sums.into_iter().map(|v| v as f32).collect();
    let q_t = if a.want_transpose {
        Some(Tensor::from_slice(&transpose_codes(&q.host_bytes()?, m, n)?, [n, m], a.fp8_dtype)?)
    } else {
        None
    };
    Ok(BgradQuantizeOut {
        dbias: store(&sums, &[n], a.x.dtype())?,
        q,
        q_t,
        amax: scalar_tensor(amax)?,
        scale_inv: scalar_tensor(1.0 / scale)?,
    })
}

/// The catalogue op `dequantize` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn dequantize(_: &KernelCtx<'_>, a: &DequantizeArgs) -> Result<DequantizeOut> {
    let q = view(&a.q)?;
    let s = a.scale_inv.to_vec::<f32>()?[0];
    let y: Vec<f32> = q.par_iter().map(|v| v * s).collect();
    Ok(DequantizeOut { y: store(&y, a.q.shape(), a.out_dtype)? })
}

/// The catalogue op `compute_amax` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn compute_amax(_: &KernelCtx<'_>, a: &ComputeAmaxArgs) -> Result<ComputeAmaxOut> {
    Ok(ComputeAmaxOut { amax: scalar_tensor(amax(&view(&a.x)?))? })
}

/// The catalogue op `fp8_transpose` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn fp8_transpose(_: &KernelCtx<'_>, a: &Fp8TransposeArgs) -> Result<Fp8TransposeOut> {
    let (m, n) = (a.q.shape()[0], a.q.shape()[1]);
    let q = a.q.host_bytes()?;
    Ok(Fp8TransposeOut { q_t: Tensor::from_slice(&transpose_codes(&q, m, n)?, [n, m], a.q.dtype())? })
}

/// The catalogue op `delayed_scaling` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn delayed_scaling(_: &KernelCtx<'_>, a: &DelayedScalingArgs) -> Result<DelayedScalingOut> {
    let (hist, n) = (a.amax_history.shape()[0], a.amax_history.shape()[1]);
    let mut h = a.amax_history.to_vec::<f32>()?;
    let mut scale = a.scale.to_vec::<f32>()?;
    let mut scale_inv = a.scale_inv.to_vec::<f32>()?;
    for j in 0..n {
        let amax = match a.algo {
            AmaxAlgo::Max => (0..hist)
                .map(|r| h[r * n + j])
                .fold(0.0f32, |m, v| if m.is_nan() || v.is_nan() { f32::NAN } else { m.max(v) }),
            AmaxAlgo::MostRecent => h[j],
        };
        if amax.is_finite() && amax > 0.0 {
            let s = a.fp8_max / amax / 2f32.powf(a.margin);
            if s.is_finite() && s > 0.0 {
                scale[j] = s;
            }
        }
        scale_inv[j] = 1.0 / scale[j];
    }
    // Roll the history up by one row (row 0 moves to the end), then clear row 0.
    h.rotate_left(n);
    h[..n].iter_mut().for_each(|v| *v = 0.0);
    crate::util::write_into(&a.amax_history, &h)?;
    crate::util::write_into(&a.scale, &scale)?;
    crate::util::write_into(&a.scale_inv, &scale_inv)?;
    Ok(DelayedScalingOut {})
}
