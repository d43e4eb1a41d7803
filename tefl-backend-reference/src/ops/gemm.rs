//! `generic_gemm` on the CPU: a cache-blocked, multi-threaded f32 GEMM (our AVX-512 kernel, or
//! the `gemm` crate's elsewhere; half and FP8 inputs are widened, so they accumulate in f32),
//! then the epilogue, and for an FP8 D the output quantizer. `te_general_grouped_gemm` runs it
//! per group.

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::device::try_zeroed;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use super::activation::{act, dact};
use crate::kernels::sgemm::{MatRef, sgemm, sgemm_set};
use crate::util::{row_major_column_sums, scalar_tensor, store, store_fp8, uninit_f32, view};

/// The one-element value of an optional f32 scale (1 when absent).
fn scale_of(t: Option<&Tensor>) -> Result<f32> {
    Ok(match t {
        Some(t) => t.to_vec::<f32>()?[0],
        None => 1.0,
    })
}

/// The catalogue op `generic_gemm` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn generic_gemm(_: &KernelCtx<'_>, a: &GemmArgs) -> Result<GemmOut> {
    let (m, k, n) = gemm_dims(a)?;
    // FP8 codes are decoded by `view`; their scales fold into alpha.
    let alpha = a.alpha * scale_of(a.a_scale_inv.as_ref())? * scale_of(a.b_scale_inv.as_ref())?;
    let lhs = view(&a.a)?;
    let rhs = view(&a.b)?;
    // The product's size comes from the user's shapes (k = 0 makes tiny inputs with a huge
    // product): allocate it fallibly, so that too much is an error, not an abort. It is a
    // tensor from the start, so that an f32 D is returned without a copy, and uninitialised:
    // it is written in full (set from the product, or C and then the product added).
    let d_tensor = uninit_f32(&[m, n], || format!("generic_gemm output d [{m}, {n}]"))?;
    let mut d_guard = d_tensor.host_bytes_mut()?;
    let d: &mut [f32] = bytemuck::cast_slice_mut(&mut d_guard);
    let am = if a.transa { MatRef { data: &lhs, rs: 1, cs: m } } else { MatRef { data: &lhs, rs: k, cs: 1 } };
    let bm = if a.transb { MatRef { data: &rhs, rs: 1, cs: k } } else { MatRef { data: &rhs, rs: n, cs: 1 } };
    if let (Some(c), true) = (&a.c, a.accumulate) {
        d.copy_from_slice(&view(c)?);
        sgemm(m, n, k, alpha, am, bm, d);
    } else {
        sgemm_set(m, n, k, alpha, am, bm, d);
    }
    drop((lhs, rhs));

    let bias = a.bias.as_ref().map(view).transpose()?;
    let aux_in = a.aux.as_ref().map(view).transpose()?;
    let mut aux_out = match a.epilogue.writes_aux() {
        true => Some(try_zeroed::<f32>(m * n, || format!("generic_gemm output aux_out [{m}, {n}]"))?),
        false => None,
    };
    let ep = a.epilogue;
    if n > 0 {
        let rows = d.par_chunks_mut(n).enumerate();
        match aux_out.as_mut() {
            Some(aux) => rows.zip(aux.par_chunks_mut(n)).for_each(|((i, dr), ar)| {
                for j in 0..n {
                    let pre = dr[j] + bias.as_ref().map_or(0.0, |b| b[j]);
                    ar[j] = pre;
                    dr[j] = act(Activation::Gelu, pre);
                }
                let _ = i;
            }),
            None => rows.for_each(|(i, dr)| match ep {
                GemmEpilogue::Bias => {
                    let b = bias.as_ref().map_or(&[][..], |b| &b[..]);
                    dr.iter_mut().zip(b).for_each(|(v, bv)| *v += bv);
                }
                GemmEpilogue::DGelu | GemmEpilogue::DGeluBiasGrad => {
                    let x = aux_in.as_ref().map_or(&[][..], |x| &x[i * n..(i + 1) * n]);
                    dr.iter_mut().zip(x).for_each(|(v, xv)| *v *= dact(Activation::Gelu, *xv));
                }
                _ => {}
            }),
        }
    }
    let bias_grad = if ep.writes_bias_grad() {
        let sums = row_major_column_sums(d, n, "generic_gemm output bias_grad")?;
        Some(Tensor::from_slice(&sums, [n], DType::F32)?)
    } else {
        None
    };
    let aux_out = aux_out.map(|x| store(&x, &[m, n], aux_dtype(a.out_dtype))).transpose()?;
    if a.out_dtype.is_fp8() {
        let (d, amax) = store_fp8(d, &[m, n], a.out_dtype, scale_of(a.d_scale.as_ref())?)?;
        return Ok(GemmOut { d, aux_out, bias_grad, d_amax: Some(scalar_tensor(amax)?) });
    }
    if a.out_dtype != DType::F32 {
        return Ok(GemmOut { d: store(d, &[m, n], a.out_dtype)?, aux_out, bias_grad, d_amax: None });
    }
    drop(d_guard);
    Ok(GemmOut { d: d_tensor, aux_out, bias_grad, d_amax: None })
}

/// `te_general_grouped_gemm`: `generic_gemm` per group (bias epilogue when the group has one).
pub fn grouped_gemm(ctx: &KernelCtx<'_>, a: &GroupedGemmArgs) -> Result<GroupedGemmOut> {
    a.each_group(|g| generic_gemm(ctx, g))
}
