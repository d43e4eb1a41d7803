//! Multi-tensor optimizers on the CPU, in place, honouring `noop_flag`.

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use crate::kernels::vmath;
use crate::util::{CHUNK, noop_set, set_noop, view, write_into};

/// The catalogue op `multi_tensor_scale` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn multi_tensor_scale(_: &KernelCtx<'_>, a: &MultiTensorScaleArgs) -> Result<MultiTensorScaleOut> {
    if noop_set(&a.noop_flag)? {
        return Ok(MultiTensorScaleOut {});
    }
    let mut found_bad = false;
    for (src, dst) in a.src.iter().zip(&a.dst) {
        // The source view is dropped before the destination is written: dst may be src.
        let s = view(src)?;
        found_bad |= !vmath::all_finite(&s);
        let out: Vec<f32> = s.par_iter().map(|v| v * a.scale).collect();
        drop(s);
        write_into(dst, &out)?;
    }
    if found_bad {
        set_noop(&a.noop_flag)?;
    }
    Ok(MultiTensorScaleOut {})
}

/// (Σ x² per tensor in f64, any non-finite value) with x = t·factor.
fn sums_of_squares(tensors: &[Tensor], factor: f32) -> Result<(Vec<f64>, bool)> {
    let mut sums = Vec::with_capacity(tensors.len());
    let mut bad = false;
    for t in tensors {
        let v = view(t)?;
        let (s, b) = v
            .par_chunks(CHUNK)
            .map(|c| {
                c.iter().fold((0.0f64, false), |(s, b), x| {
                    let y = x * factor;
                    (s + f64::from(y) * f64::from(y), b || !y.is_finite())
                })
            })
            .reduce(|| (0.0, false), |x, y| (x.0 + y.0, x.1 || y.1));
        sums.push(s);
        bad |= b;
    }
    Ok((sums, bad))
}

fn norms(noop: &Tensor, tensors: &[Tensor], factor: f32, per_tensor: bool) -> Result<(Tensor, Option<Tensor>)> {
    let (sums, bad) = sums_of_squares(tensors, factor)?;
    if bad {
        set_noop(noop)?;
    }
    let total = sums.iter().sum::<f64>().sqrt() as f32;
    let per = per_tensor
        .then(|| {
            let v: Vec<f32> = sums.iter().map(|s| s.sqrt() as f32).collect();
            Tensor::from_slice(&v, [v.len()], DType::F32)
        })
        .transpose()?;
    Ok((Tensor::from_slice(&[total], [1], DType::F32)?, per))
}

/// The catalogue op `multi_tensor_l2norm` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn multi_tensor_l2norm(_: &KernelCtx<'_>, a: &MultiTensorL2NormArgs) -> Result<MultiTensorL2NormOut> {
    if noop_set(&a.noop_flag)? {
        let n = a.tensors.len();
        return Ok(MultiTensorL2NormOut {
            total: Tensor::from_slice(&[0.0f32], [1], DType::F32)?,
            per_tensor_norms: a
                .per_tensor
                .then(|| Tensor::from_slice(&vec![0.0f32; n], [n], DType::F32))
                .transpose()?,
        });
    }
    let (total, per_tensor_norms) = norms(&a.noop_flag, &a.tensors, 1.0, a.per_tensor)?;
    Ok(MultiTensorL2NormOut { total, per_tensor_norms })
}

/// The catalogue op `multi_tensor_unscale_l2norm` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn multi_tensor_unscale_l2norm(
    _: &KernelCtx<'_>,
    a: &MultiTensorUnscaleL2NormArgs,
) -> Result<MultiTensorUnscaleL2NormOut> {
    let n = a.tensors.len();
    if noop_set(&a.noop_flag)? {
        return Ok(MultiTensorUnscaleL2NormOut {
            total: Tensor::from_slice(&[0.0f32], [1], DType::F32)?,
            per_tensor_norms: a
                .per_tensor
                .then(|| Tensor::from_slice(&vec![0.0f32; n], [n], DType::F32))
                .transpose()?,
        });
    }
    let inv = a.inv_scale.to_vec::<f32>()?[0];
    let (total, per_tensor_norms) = norms(&a.noop_flag, &a.tensors, inv, a.per_tensor)?;
    Ok(MultiTensorUnscaleL2NormOut { total, per_tensor_norms })
}

/// The hyper-parameters of one Adam step.
#[derive(Clone, Copy)]
struct Adam {
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    mode: AdamMode,
    wd: f32,
    bc1: f32,
    bc2: f32,
}

impl Adam {
    fn new(h: &AdamHyper) -> Self {
        let (bc1, bc2) = h.bias_corrections();
        Adam { lr: h.lr, beta1: h.beta1, beta2: h.beta2, eps: h.eps, mode: h.mode, wd: h.weight_decay, bc1, bc2 }
    }

    /// One element: returns the new parameter, updating m and v.
    #[inline]
    fn step(&self, p: f32, g: f32, m: &mut f32, v: &mut f32) -> f32 {
        let g = if self.mode == AdamMode::L2 { g + self.wd * p } else { g };
        *m = self.beta1 * *m + (1.0 - self.beta1) * g;
        *v = self.beta2 * *v + (1.0 - self.beta2) * g * g;
        let denom = (*v / self.bc2).sqrt() + self.eps;
        let mut update = (*m / self.bc1) / denom;
        if self.mode == AdamMode::AdamW {
            update += self.wd * p;
        }
        p - self.lr * update
    }

    /// One chunk of params, gradients and moments, updated in place (zipped slices, so that
    /// the loop has no bounds checks and vectorises).
    #[inline(always)]
    fn chunk_generic(&self, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        for (((p, g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            *p = self.step(*p, *g, m, v);
        }
    }

    /// The same compiled for AVX-512 (picked at run time by `chunk`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn chunk_avx512(&self, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        self.chunk_generic(p, g, m, v)
    }

    /// The same compiled for AVX2 (picked at run time by `chunk` on CPUs without AVX-512).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn chunk_avx2(&self, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        self.chunk_generic(p, g, m, v)
    }

    fn chunk(&self, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        vmath::dispatch!(Self::chunk_generic, Self::chunk_avx512, Self::chunk_avx2, (self, p, g, m, v))
    }

    /// Updates one tensor's params and moments in place: an f32 param tensor directly; others
    /// through an f32 copy taken before the moments are borrowed and written back after.
    fn tensor(&self, grad: &Tensor, param: &Tensor, m: &Tensor, v: &Tensor) -> Result<()> {
        let g = view(grad)?;
        let in_place = param.dtype() == DType::F32;
        let mut copy: Vec<f32> = if in_place { Vec::new() } else { view(param)?.to_vec() };
        {
            let mut mw = m.host_bytes_mut()?;
            let mut vw = v.host_bytes_mut()?;
            let mut pw = if in_place { Some(param.host_bytes_mut()?) } else { None };
            let ms: &mut [f32] = bytemuck::cast_slice_mut(&mut mw);
            let vs: &mut [f32] = bytemuck::cast_slice_mut(&mut vw);
            let ps: &mut [f32] = match pw.as_mut() {
                Some(w) => bytemuck::cast_slice_mut(&mut w[..]),
                None => &mut copy,
            };
            ps.par_chunks_mut(CHUNK)
                .zip(g.par_chunks(CHUNK))
                .zip(ms.par_chunks_mut(CHUNK).zip(vs.par_chunks_mut(CHUNK)))
                .for_each(|((pc, gc), (mc, vc))| self.chunk(pc, gc, mc, vc));
        }
        if !in_place {
            write_into(param, &copy)?;
        }
        Ok(())
    }
}

/// The catalogue op `multi_tensor_adam` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn multi_tensor_adam(_: &KernelCtx<'_>, a: &MultiTensorAdamArgs) -> Result<MultiTensorAdamOut> {
    if noop_set(&a.noop_flag)? {
        return Ok(MultiTensorAdamOut {});
    }
    let adam = Adam::new(&a.hyper);
    for i in 0..a.grads.len() {
        adam.tensor(&a.grads[i], &a.params[i], &a.exp_avg[i], &a.exp_avg_sq[i])?;
    }
    Ok(MultiTensorAdamOut {})
}

/// The catalogue op `multi_tensor_adam_master` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn multi_tensor_adam_master(_: &KernelCtx<'_>, a: &MultiTensorAdamMasterArgs) -> Result<MultiTensorAdamMasterOut> {
    if noop_set(&a.noop_flag)? {
        return Ok(MultiTensorAdamMasterOut {});
    }
    let adam = Adam::new(&a.hyper);
    for i in 0..a.grads.len() {
        adam.tensor(&a.grads[i], &a.master_params[i], &a.exp_avg[i], &a.exp_avg_sq[i])?;
        write_into(&a.model_params[i], &view(&a.master_params[i])?)?;
    }
    Ok(MultiTensorAdamMasterOut {})
}

/// The catalogue op `multi_tensor_sgd` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn multi_tensor_sgd(_: &KernelCtx<'_>, a: &MultiTensorSgdArgs) -> Result<MultiTensorSgdOut> {
    if noop_set(&a.noop_flag)? {
        return Ok(MultiTensorSgdOut {});
    }
    for i in 0..a.grads.len() {
        let g = view(&a.grads[i])?;
        let mut p = view(&a.params[i])?.to_vec();
        {
            let mut bw = a.momentum_buf[i].host_bytes_mut()?;
            let buf: &mut [f32] = bytemuck::cast_slice_mut(&mut bw);
            p.par_chunks_mut(CHUNK).zip(g.par_chunks(CHUNK)).zip(buf.par_chunks_mut(CHUNK)).for_each(
                |((pc, gc), bc)| {
                    for j in 0..pc.len() {
                        let mut gv = gc[j] * a.scale;
                        if a.weight_decay != 0.0 && !a.wd_after_momentum {
                            gv += a.weight_decay * pc[j];
                        }
                        if a.momentum != 0.0 {
                            bc[j] = if a.first_run { gv } else { a.momentum * bc[j] + (1.0 - a.dampening) * gv };
                            gv = if a.nesterov { gv + a.momentum * bc[j] } else { bc[j] };
                        }
                        if a.weight_decay != 0.0 && a.wd_after_momentum {
                            gv += a.weight_decay * pc[j];
                        }
                        pc[j] -= a.lr * gv;
                    }
                },
            );
        }
        drop(g);
        write_into(&a.params[i], &p)?;
    }
    Ok(MultiTensorSgdOut {})
}

/// The catalogue op `multi_tensor_compute_scale_and_scale_inv` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn multi_tensor_compute_scale_and_scale_inv(_: &KernelCtx<'_>, a: &ComputeScaleArgs) -> Result<ComputeScaleOut> {
    if noop_set(&a.noop_flag)? {
        return Ok(ComputeScaleOut {});
    }
    for i in 0..a.amax.len() {
        let amax = a.amax[i].to_vec::<f32>()?;
        let mut scale = a.scale[i].to_vec::<f32>()?;
        let mut scale_inv = a.scale_inv[i].to_vec::<f32>()?;
        for j in 0..amax.len() {
            if amax[j].is_finite() {
                let mut s = a.fp8_max / amax[j].max(a.epsilon);
                if a.force_pow_2 && s.is_finite() && s > 0.0 {
                    s = 2f32.powi(s.log2().floor() as i32);
                }
                if s.is_finite() && s > 0.0 {
                    scale[j] = s;
                }
            }
            scale_inv[j] = 1.0 / scale[j];
        }
        write_into(&a.scale[i], &scale)?;
        write_into(&a.scale_inv[i], &scale_inv)?;
    }
    Ok(ComputeScaleOut {})
}
