//! RMSNorm and LayerNorm on the CPU: rayon over rows, f32 accumulation.

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use crate::kernels::vmath;
use crate::util::{build_f32, column_sums, map_rows, scalar_tensor, store, store_fp8, view};

fn gamma_eff(gamma: &[f32], zero_centered: bool) -> Vec<f32> {
    gamma.iter().map(|g| if zero_centered { 1.0 + g } else { *g }).collect()
}

/// The dtype a forward computes its rows in: `out` itself, f32 for an FP8 output (cast after).
fn row_dtype(out: DType) -> DType {
    if out.is_fp8() { DType::F32 } else { out }
}

/// An FP8 forward's output quantizer: (codes, amax, scale_inv) of the f32 `y`; a float `y` as is.
fn quantize_out(y: Tensor, out: DType, scale: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>, Option<Tensor>)> {
    let Some(scale) = scale.filter(|_| out.is_fp8()) else { return Ok((y, None, None)) };
    let s = scale.to_vec::<f32>()?[0];
    let (q, amax) = store_fp8(&view(&y)?, y.shape(), out, s)?;
    Ok((q, Some(scalar_tensor(amax)?), Some(scalar_tensor(1.0 / s)?)))
}

/// The catalogue op `rmsnorm_fwd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn rmsnorm_fwd(_: &KernelCtx<'_>, a: &RmsNormFwdArgs) -> Result<RmsNormFwdOut> {
    let n = a.x.last_dim();
    let rows = a.x.rows();
    let g = gamma_eff(&view(&a.gamma)?, a.zero_centered_gamma);
    let (y, stats) = map_rows([(&a.x, n)], rows, a.x.shape(), row_dtype(a.out_dtype), n, |_, [xr], yr| {
        let ms = vmath::sum_f64([xr], |[v]| v * v) as f32 / n as f32;
        let r = 1.0 / (ms + a.eps).sqrt();
        vmath::map([xr, &g], yr, |[xv, gv]| xv * r * gv);
        [r, 0.0]
    })?;
    let rsigma: Vec<f32> = stats.iter().map(|s| s[0]).collect();
    let (y, amax, scale_inv) = quantize_out(y, a.out_dtype, a.scale.as_ref())?;
    Ok(RmsNormFwdOut { y, rsigma: store(&rsigma, &[rows], DType::F32)?, amax, scale_inv })
}

fn rms_bwd(
    dy: &tefl_core::Tensor,
    x: &tefl_core::Tensor,
    rsigma: &tefl_core::Tensor,
    gamma: &tefl_core::Tensor,
    zero_centered: bool,
    add: Option<&tefl_core::Tensor>,
) -> Result<(tefl_core::Tensor, tefl_core::Tensor)> {
    let n = x.last_dim();
    let rows = x.rows();
    let (dyv, xv, rs) = (view(dy)?, view(x)?, view(rsigma)?);
    let g = gamma_eff(&view(gamma)?, zero_centered);
    let addv = add.map(view).transpose()?;
    let (dx, ()) = build_f32(x.shape(), x.dtype(), "rmsnorm_bwd output dx", |dx| {
        dx.par_chunks_mut(n).enumerate().for_each(|(r, dxr)| {
            let (xr, dyr, rr) = (&xv[r * n..(r + 1) * n], &dyv[r * n..(r + 1) * n], rs[r]);
            let mean = vmath::sum_f64([xr, dyr, &g], |[x, dy, g]| dy * g * x * rr) as f32 / n as f32;
            let dx_of = move |x: f32, dy: f32, g: f32| rr * (dy * g - x * rr * mean);
            match &addv {
                Some(av) => {
                    vmath::map([xr, dyr, &g, &av[r * n..(r + 1) * n]], dxr, |[x, dy, g, ad]| dx_of(x, dy, g) + ad)
                }
                None => vmath::map([xr, dyr, &g], dxr, |[x, dy, g]| dx_of(x, dy, g)),
            }
        });
        Ok(())
    })?;
    let dgamma = column_sums(rows, n, "dgamma", |r, acc| {
        let rr = rs[r];
        let (dyr, xr) = (&dyv[r * n..(r + 1) * n], &xv[r * n..(r + 1) * n]);
        for ((s, dy), x) in acc.iter_mut().zip(dyr).zip(xr) {
            *s += dy * x * rr;
        }
    })?;
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
    let (y, stats) = map_rows([(&a.x, n)], rows, a.x.shape(), row_dtype(a.out_dtype), n, |_, [xr], yr| {
        let mean = vmath::sum_f64([xr], |[v]| v) as f32 / n as f32;
        let var = vmath::sum_f64([xr], |[v]| (v - mean) * (v - mean)) as f32 / n as f32;
        let r = 1.0 / (var + a.eps).sqrt();
        vmath::map([xr, &g, &beta], yr, |[xv, gv, bv]| (xv - mean) * r * gv + bv);
        [r, mean]
    })?;
    let rsigma: Vec<f32> = stats.iter().map(|s| s[0]).collect();
    let mu: Vec<f32> = stats.iter().map(|s| s[1]).collect();
    let (y, amax, scale_inv) = quantize_out(y, a.out_dtype, a.scale.as_ref())?;
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
    let (dyv, xv, mu, rs) = (view(&a.dy)?, view(&a.x)?, view(&a.mu)?, view(&a.rsigma)?);
    let g = gamma_eff(&view(&a.gamma)?, a.zero_centered_gamma);
    let (dx, ()) = build_f32(a.x.shape(), a.x.dtype(), "layernorm_bwd output dx", |dx| {
        dx.par_chunks_mut(n).enumerate().for_each(|(r, dxr)| {
            let (xr, dyr) = (&xv[r * n..(r + 1) * n], &dyv[r * n..(r + 1) * n]);
            let (m, rr) = (mu[r], rs[r]);
            let sd = vmath::sum_f64([dyr, &g], |[dy, g]| dy * g);
            let sdx = vmath::sum_f64([xr, dyr, &g], |[x, dy, g]| dy * g * (x - m) * rr);
            let (mean_d, mean_dx) = ((sd / n as f64) as f32, (sdx / n as f64) as f32);
            vmath::map([xr, dyr, &g], dxr, |[x, dy, g]| rr * (dy * g - mean_d - (x - m) * rr * mean_dx));
        });
        Ok(())
    })?;
    let sums = column_sums(rows, 2 * n, "dgamma/dbeta", |r, acc| {
        let (m, rr) = (mu[r], rs[r]);
        let (dyr, xr) = (&dyv[r * n..(r + 1) * n], &xv[r * n..(r + 1) * n]);
        let (dgamma, dbeta) = acc.split_at_mut(n);
        for ((s, dy), x) in dgamma.iter_mut().zip(dyr).zip(xr) {
            *s += dy * (x - m) * rr;
        }
        for (s, dy) in dbeta.iter_mut().zip(dyr) {
            *s += dy;
        }
    })?;
    Ok(LayerNormBwdOut {
        dx,
        dgamma: store(&sums[..n], a.gamma.shape(), a.gamma.dtype())?,
        dbeta: store(&sums[n..], a.gamma.shape(), a.gamma.dtype())?,
    })
}
