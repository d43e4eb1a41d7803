//! RMSNorm and LayerNorm on the CPU: rayon over rows, f32 accumulation.

use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use crate::kernels::vmath;
use crate::util::{map_rows_scaled, map_rows_summing, scalar_tensor, store, view};

fn gamma_eff(gamma: &[f32], zero_centered: bool) -> Vec<f32> {
    gamma.iter().map(|g| if zero_centered { 1.0 + g } else { *g }).collect()
}

/// An FP8 forward's scale (its quantizer's `scale`, required with an FP8 output); none for
/// float outputs.
fn fp8_scale(out: DType, scale: Option<&Tensor>) -> Result<Option<f32>> {
    match scale.filter(|_| out.is_fp8()) {
        Some(s) => Ok(Some(s.to_vec::<f32>()?.first().copied().unwrap_or(1.0))),
        None => Ok(None),
    }
}

/// The FP8 outputs `(amax, scale_inv)` of a forward with scale `s`.
fn fp8_outputs(s: Option<f32>, amax: f32) -> Result<(Option<Tensor>, Option<Tensor>)> {
    match s {
        Some(s) => Ok((Some(scalar_tensor(amax)?), Some(scalar_tensor(1.0 / s)?))),
        None => Ok((None, None)),
    }
}

/// The catalogue op `rmsnorm_fwd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn rmsnorm_fwd(_: &KernelCtx<'_>, a: &RmsNormFwdArgs) -> Result<RmsNormFwdOut> {
    let n = a.x.last_dim();
    let rows = a.x.rows();
    let g = gamma_eff(&view(&a.gamma)?, a.zero_centered_gamma);
    let s = fp8_scale(a.out_dtype, a.scale.as_ref())?;
    let (y, stats, amax) =
        map_rows_scaled([(&a.x, n)], rows, a.x.shape(), a.out_dtype, s.unwrap_or(1.0), n, |_, [xr], yr| {
            let ms = vmath::sum_f64([xr], |[v]| v * v) as f32 / n as f32;
            let r = 1.0 / (ms + a.eps).sqrt();
            vmath::map([xr, &g], yr, |[xv, gv]| xv * r * gv);
            [r, 0.0]
        })?;
    let rsigma: Vec<f32> = stats.iter().map(|s| s[0]).collect();
    let (amax, scale_inv) = fp8_outputs(s, amax)?;
    Ok(RmsNormFwdOut { y, rsigma: store(&rsigma, &[rows], DType::F32)?, amax, scale_inv })
}

/// dx (plus `add`, the residual's gradient) and dgamma of RMSNorm, in one pass over the rows:
/// each row widened once, its dx narrowed straight into the output, its dgamma terms added into
/// the task's column sums.
fn rms_bwd(
    dy: &Tensor,
    x: &Tensor,
    rsigma: &Tensor,
    gamma: &Tensor,
    zero_centered: bool,
    add: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let n = x.last_dim();
    let rows = x.rows();
    let rs = view(rsigma)?;
    let g = gamma_eff(&view(gamma)?, zero_centered);
    const WHAT: &str = "rmsnorm_bwd dgamma";
    // Row r's dx (into dxr) and its dgamma terms (into acc).
    let row = |r: usize, xr: &[f32], dyr: &[f32], dxr: &mut [f32], acc: &mut [f32]| {
        let rr = rs[r];
        let mean = vmath::sum_f64([xr, dyr, &g], |[x, dy, g]| dy * g * x * rr) as f32 / n as f32;
        vmath::map([xr, dyr, &g], dxr, |[x, dy, g]| rr * (dy * g - x * rr * mean));
        for ((s, dy), x) in acc.iter_mut().zip(dyr).zip(xr) {
            *s += dy * x * rr;
        }
    };
    let (dx, dgamma) = match add {
        None => {
            map_rows_summing([(x, n), (dy, n)], rows, n, n, WHAT, |r, [xr, dyr], dxr, acc| row(r, xr, dyr, dxr, acc))?
        }
        Some(add) => map_rows_summing([(x, n), (dy, n), (add, n)], rows, n, n, WHAT, |r, [xr, dyr, ar], dxr, acc| {
            row(r, xr, dyr, dxr, acc);
            dxr.iter_mut().zip(ar).for_each(|(d, a)| *d += a);
        })?,
    };
    Ok((dx, store(&dgamma, gamma.shape(), gamma.dtype())?))
}

/// The catalogue op `rmsnorm_bwd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn rmsnorm_bwd(_: &KernelCtx<'_>, a: &RmsNormBwdArgs) -> Result<RmsNormBwdOut> {
    let (dx, dgamma) = rms_bwd(&a.dy, &a.x, &a.rsigma, &a.gamma, a.zero_centered_gamma, None)?;
    Ok(RmsNormBwdOut { dx, dgamma })
}

/// The catalogue op `rmsnorm_bwd_add` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn rmsnorm_bwd_add(_: &KernelCtx<'_>, a: &RmsNormBwdAddArgs) -> Result<RmsNormBwdAddOut> {
    let (dx, dgamma) = rms_bwd(&a.dy, &a.x, &a.rsigma, &a.gamma, a.zero_centered_gamma, Some(&a.add))?;
    Ok(RmsNormBwdAddOut { dx, dgamma })
}

/// The catalogue op `layernorm_fwd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn layernorm_fwd(_: &KernelCtx<'_>, a: &LayerNormFwdArgs) -> Result<LayerNormFwdOut> {
    let n = a.x.last_dim();
    let rows = a.x.rows();
    let g = gamma_eff(&view(&a.gamma)?, a.zero_centered_gamma);
    let beta = view(&a.beta)?;
    let s = fp8_scale(a.out_dtype, a.scale.as_ref())?;
    let (y, stats, amax) =
        map_rows_scaled([(&a.x, n)], rows, a.x.shape(), a.out_dtype, s.unwrap_or(1.0), n, |_, [xr], yr| {
            let mean = vmath::sum_f64([xr], |[v]| v) as f32 / n as f32;
            let var = vmath::sum_f64([xr], |[v]| (v - mean) * (v - mean)) as f32 / n as f32;
            let r = 1.0 / (var + a.eps).sqrt();
            vmath::map([xr, &g, &beta], yr, |[xv, gv, bv]| (xv - mean) * r * gv + bv);
            [r, mean]
        })?;
    let rsigma: Vec<f32> = stats.iter().map(|s| s[0]).collect();
    let mu: Vec<f32> = stats.iter().map(|s| s[1]).collect();
    let (amax, scale_inv) = fp8_outputs(s, amax)?;
    Ok(LayerNormFwdOut {
        y,
        mu: store(&mu, &[rows], DType::F32)?,
        rsigma: store(&rsigma, &[rows], DType::F32)?,
        amax,
        scale_inv,
    })
}

/// The catalogue op `layernorm_bwd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn layernorm_bwd(_: &KernelCtx<'_>, a: &LayerNormBwdArgs) -> Result<LayerNormBwdOut> {
    let n = a.x.last_dim();
    let rows = a.x.rows();
    let (mu, rs) = (view(&a.mu)?, view(&a.rsigma)?);
    let g = gamma_eff(&view(&a.gamma)?, a.zero_centered_gamma);
    // One pass over the rows: dx narrowed straight into the output, dgamma's and dbeta's terms
    // added into the task's column sums (dgamma in the first n, dbeta in the next n).
    let (dx, sums) = map_rows_summing(
        [(&a.x, n), (&a.dy, n)],
        rows,
        n,
        2 * n,
        "layernorm_bwd dgamma/dbeta",
        |r, [xr, dyr], dxr, acc| {
            let (m, rr) = (mu[r], rs[r]);
            let sd = vmath::sum_f64([dyr, &g], |[dy, g]| dy * g);
            let sdx = vmath::sum_f64([xr, dyr, &g], |[x, dy, g]| dy * g * (x - m) * rr);
            let (mean_d, mean_dx) = ((sd / n as f64) as f32, (sdx / n as f64) as f32);
            vmath::map([xr, dyr, &g], dxr, |[x, dy, g]| rr * (dy * g - mean_d - (x - m) * rr * mean_dx));
            let (dgamma, dbeta) = acc.split_at_mut(n);
            for ((s, dy), x) in dgamma.iter_mut().zip(dyr).zip(xr) {
                *s += dy * (x - m) * rr;
            }
            for (s, dy) in dbeta.iter_mut().zip(dyr) {
                *s += dy;
            }
        },
    )?;
    Ok(LayerNormBwdOut {
        dx,
        dgamma: store(&sums[..n], a.gamma.shape(), a.gamma.dtype())?,
        dbeta: store(&sums[n..], a.gamma.shape(), a.gamma.dtype())?,
    })
}
