//! `generic_gemm` on the CPU: the cache-blocked, SIMD, multi-threaded kernels of the `gemm`
//! crate in f32 (half inputs are widened, so they accumulate in f32), then the epilogue.

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use super::activation::{act, dact};
use crate::util::{store, view};

pub fn generic_gemm(_: &KernelCtx<'_>, a: &GemmArgs) -> Result<GemmOut> {
    let (m, k, n) = gemm_dims(a)?;
    let lhs = view(&a.a)?;
    let rhs = view(&a.b)?;
    let mut d = match (&a.c, a.accumulate) {
        (Some(c), true) => view(c)?.to_vec(),
        _ => vec![0.0f32; m * n],
    };
    let (lhs_rs, lhs_cs) = if a.transa { (1isize, m as isize) } else { (k as isize, 1isize) };
    let (rhs_rs, rhs_cs) = if a.transb { (1isize, k as isize) } else { (n as isize, 1isize) };
    if m > 0 && n > 0 && k > 0 {
        // SAFETY: `d` holds m·n f32 with row stride n; `lhs` holds the m·k elements of op(A) at
        // (i·lhs_rs + l·lhs_cs) and `rhs` the k·n elements of op(B) at (l·rhs_rs + j·rhs_cs), as
        // `gemm_dims` checked the shapes; the three buffers do not overlap (d is a fresh Vec).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                d.as_mut_ptr(),
                1,
                n as isize,
                a.accumulate,
                lhs.as_ptr(),
                lhs_cs,
                lhs_rs,
                rhs.as_ptr(),
                rhs_cs,
                rhs_rs,
                1.0f32,
                a.alpha,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(rayon::current_num_threads()),
            );
        }
    } else if !a.accumulate {
        d.iter_mut().for_each(|v| *v = 0.0);
    }
    drop((lhs, rhs));

    let bias = a.bias.as_ref().map(view).transpose()?;
    let aux_in = a.aux.as_ref().map(view).transpose()?;
    let mut aux_out = a.epilogue.writes_aux().then(|| vec![0.0f32; m * n]);
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
        let sums = if n == 0 {
            Vec::new()
        } else {
            d.par_chunks(n)
                .fold(
                    || vec![0.0f32; n],
                    |mut acc, r| {
                        acc.iter_mut().zip(r).for_each(|(s, v)| *s += v);
                        acc
                    },
                )
                .reduce(
                    || vec![0.0f32; n],
                    |mut x, y| {
                        x.iter_mut().zip(&y).for_each(|(s, v)| *s += v);
                        x
                    },
                )
        };
        Some(Tensor::from_slice(&sums, [n], DType::F32)?)
    } else {
        None
    };
    Ok(GemmOut {
        d: store(&d, &[m, n], a.out_dtype)?,
        aux_out: aux_out.map(|x| store(&x, &[m, n], a.out_dtype)).transpose()?,
        bias_grad,
    })
}
