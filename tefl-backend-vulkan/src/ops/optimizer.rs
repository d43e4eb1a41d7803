//! The multi-tensor optimizers on Vulkan (`shaders/optimizer.wgsl`), in place: a snapshot of
//! the noop flag, then one dispatch per tensor of the lists (submissions of at most
//! `PER_SUBMISSION` dispatches), every dispatch returning when the snapshot is set. The
//! l2 norms sum f32 partials of a fixed number of workgroups per tensor, then one workgroup
//! finishes the per-tensor and total norms.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};

use super::{MAX_GROUPS, dtype_code};
use crate::gpu::{Binding, gpu};

/// Bytes of the shader's push constants (26 32-bit fields).
const PUSH_BYTES: u32 = 104;
/// Workgroups (f32 partial sums) per tensor of an l2 norm.
const PARTS: usize = 128;
/// Dispatches per submission (each takes a descriptor set of the device's per-submission pool).
const PER_SUBMISSION: usize = 200;

/// Every field of the shader's `Params`.
#[derive(Default, Clone, Copy)]
struct Params {
    stage: u32,
    n: u32,
    t0: u32,
    t1: u32,
    tensor: u32,
    ntensors: u32,
    parts: u32,
    mode: u32,
    master: u32,
    nesterov: u32,
    first_run: u32,
    wd_after_momentum: u32,
    per_tensor: u32,
    force_pow_2: u32,
    has_inv_scale: u32,
    scale: f32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    wd: f32,
    bc1: f32,
    bc2: f32,
    momentum: f32,
    dampening: f32,
    fp8_max: f32,
}

impl Params {
    fn bytes(&self) -> Vec<u8> {
        let ints = [
            self.stage,
            self.n,
            self.t0,
            self.t1,
            self.tensor,
            self.ntensors,
            self.parts,
            self.mode,
            self.master,
            self.nesterov,
            self.first_run,
            self.wd_after_momentum,
            self.per_tensor,
            self.force_pow_2,
            self.has_inv_scale,
        ];
        let floats = [
            self.scale,
            self.lr,
            self.beta1,
            self.beta2,
            self.eps,
            self.wd,
            self.bc1,
            self.bc2,
            self.momentum,
            self.dampening,
            self.fp8_max,
        ];
        ints.iter().flat_map(|v| v.to_le_bytes()).chain(floats.iter().flat_map(|v| v.to_le_bytes())).collect()
    }
}

/// One dispatch: its bindings (lists a0..a4; absent ones are the workspace), params and
/// workgroups.
struct Dispatch {
    lists: [Option<Tensor>; 5],
    inv_scale: Option<Tensor>,
    params: Params,
    groups: u32,
}

/// Runs the noop snapshot and then `dispatches`, on `noop` and a workspace of `ws_words`.
fn run(ctx: &KernelCtx<'_>, noop: &Tensor, ws: &Tensor, dispatches: Vec<Dispatch>) -> Result<()> {
    let wg = crate::heuristics::elementwise_workgroup(ctx.device)?;
    let gpu = gpu(ctx.device)?;
    let pipeline = gpu.pipeline(&format!("optimizer.wg={wg}"), 8, PUSH_BYTES)?;
    let bind = super::binding;
    let (noop_b, ws_b) = (bind(noop)?, bind(ws)?);
    let bindings = |d: &Dispatch| -> Result<[Binding; 8]> {
        let l = |i: usize| d.lists[i].as_ref().map_or(Ok(ws_b), bind);
        Ok([l(0)?, l(1)?, l(2)?, l(3)?, l(4)?, noop_b, ws_b, d.inv_scale.as_ref().map_or(Ok(ws_b), bind)?])
    };
    let snapshot = Dispatch { lists: Default::default(), inv_scale: None, params: Params::default(), groups: 1 };
    let all: Vec<Dispatch> = std::iter::once(snapshot).chain(dispatches).collect();
    for chunk in all.chunks(PER_SUBMISSION) {
        let prepared =
            chunk.iter().map(|d| Ok((bindings(d)?, d.params.bytes(), d.groups))).collect::<Result<Vec<_>>>()?;
        gpu.run(|r| {
            for (b, push, groups) in &prepared {
                r.dispatch(&pipeline, b, push, (*groups, 1, 1))?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

fn check_size(op: &'static str, ctx: &KernelCtx<'_>, t: &Tensor) -> Result<u32> {
    let n = t.numel();
    if n >= (1usize << 31) {
        return Err(Error::Unsupported {
            op,
            impl_id: ctx.impl_id.to_string(),
            reason: format!("a tensor of {n} elements; the Vulkan shaders index with 32 bits"),
        });
    }
    Ok(n as u32)
}

/// Workgroups for one word per invocation over `n` elements of dtype `d`.
fn word_groups(ctx: &KernelCtx<'_>, n: u32, d: DType) -> Result<u32> {
    let wg = crate::heuristics::elementwise_workgroup(ctx.device)?;
    let per = if d == DType::F32 { 1 } else { 2 };
    Ok(n.div_ceil(per).div_ceil(wg).clamp(1, MAX_GROUPS))
}

fn workspace(ctx: &KernelCtx<'_>, words: usize) -> Result<Tensor> {
    Tensor::uninit([words.max(1)], DType::I32, &ctx.device)
}

/// `multi_tensor_scale`.
pub fn multi_tensor_scale(ctx: &KernelCtx<'_>, a: &MultiTensorScaleArgs) -> Result<MultiTensorScaleOut> {
    const OP: &str = "multi_tensor_scale";
    let mut d = Vec::new();
    for (s, t) in a.src.iter().zip(&a.dst) {
        let n = check_size(OP, ctx, t)?;
        let params = Params {
            stage: 1,
            n,
            t0: dtype_code(OP, "src", s.dtype())?,
            t1: dtype_code(OP, "dst", t.dtype())?,
            scale: a.scale,
            ..Default::default()
        };
        d.push(Dispatch {
            lists: [Some(s.clone()), Some(t.clone()), None, None, None],
            inv_scale: None,
            params,
            groups: word_groups(ctx, n, t.dtype())?,
        });
    }
    run(ctx, &a.noop_flag, &workspace(ctx, 1)?, d)?;
    Ok(MultiTensorScaleOut {})
}

fn l2norm(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    noop: &Tensor,
    tensors: &[Tensor],
    inv_scale: Option<&Tensor>,
    per_tensor: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let total = Tensor::uninit([1], DType::F32, &ctx.device)?;
    let per = if per_tensor { Some(Tensor::uninit([tensors.len()], DType::F32, &ctx.device)?) } else { None };
    let ws = workspace(ctx, 1 + tensors.len() * PARTS)?;
    let mut d = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let n = check_size(op, ctx, t)?;
        let params = Params {
            stage: 2,
            n,
            t0: dtype_code(op, "tensors", t.dtype())?,
            tensor: i as u32,
            parts: PARTS as u32,
            has_inv_scale: u32::from(inv_scale.is_some()),
            ..Default::default()
        };
        d.push(Dispatch {
            lists: [Some(t.clone()), None, None, None, None],
            inv_scale: inv_scale.cloned(),
            params,
            groups: PARTS as u32,
        });
    }
    let finish = Params {
        stage: 3,
        ntensors: tensors.len() as u32,
        parts: PARTS as u32,
        per_tensor: u32::from(per_tensor),
        ..Default::default()
    };
    d.push(Dispatch {
        lists: [Some(total.clone()), per.clone(), None, None, None],
        inv_scale: None,
        params: finish,
        groups: 1,
    });
    run(ctx, noop, &ws, d)?;
    Ok((total, per))
}

/// `multi_tensor_l2norm`.
pub fn multi_tensor_l2norm(ctx: &KernelCtx<'_>, a: &MultiTensorL2NormArgs) -> Result<MultiTensorL2NormOut> {
    let (total, per_tensor_norms) = l2norm("multi_tensor_l2norm", ctx, &a.noop_flag, &a.tensors, None, a.per_tensor)?;
    Ok(MultiTensorL2NormOut { total, per_tensor_norms })
}

/// `multi_tensor_unscale_l2norm`.
pub fn multi_tensor_unscale_l2norm(
    ctx: &KernelCtx<'_>,
    a: &MultiTensorUnscaleL2NormArgs,
) -> Result<MultiTensorUnscaleL2NormOut> {
    let (total, per_tensor_norms) =
        l2norm("multi_tensor_unscale_l2norm", ctx, &a.noop_flag, &a.tensors, Some(&a.inv_scale), a.per_tensor)?;
    Ok(MultiTensorUnscaleL2NormOut { total, per_tensor_norms })
}

fn adam_params(h: &AdamHyper) -> Params {
    let (bc1, bc2) = h.bias_corrections();
    Params {
        stage: 4,
        mode: match h.mode {
            AdamMode::L2 => 0,
            AdamMode::AdamW => 1,
        },
        lr: h.lr,
        beta1: h.beta1,
        beta2: h.beta2,
        eps: h.eps,
        wd: h.weight_decay,
        bc1,
        bc2,
        ..Default::default()
    }
}

/// `multi_tensor_adam`.
pub fn multi_tensor_adam(ctx: &KernelCtx<'_>, a: &MultiTensorAdamArgs) -> Result<MultiTensorAdamOut> {
    const OP: &str = "multi_tensor_adam";
    let base = adam_params(&a.hyper);
    let mut d = Vec::new();
    for i in 0..a.params.len() {
        let p = &a.params[i];
        let n = check_size(OP, ctx, p)?;
        let params = Params {
            n,
            t0: dtype_code(OP, "grads", a.grads[i].dtype())?,
            t1: dtype_code(OP, "params", p.dtype())?,
            ..base
        };
        d.push(Dispatch {
            lists: [
                Some(a.grads[i].clone()),
                Some(p.clone()),
                Some(a.exp_avg[i].clone()),
                Some(a.exp_avg_sq[i].clone()),
                None,
            ],
            inv_scale: None,
            params,
            groups: word_groups(ctx, n, p.dtype())?,
        });
    }
    run(ctx, &a.noop_flag, &workspace(ctx, 1)?, d)?;
    Ok(MultiTensorAdamOut {})
}

/// `multi_tensor_adam_master`.
pub fn multi_tensor_adam_master(
    ctx: &KernelCtx<'_>,
    a: &MultiTensorAdamMasterArgs,
) -> Result<MultiTensorAdamMasterOut> {
    const OP: &str = "multi_tensor_adam_master";
    let base = Params { master: 1, ..adam_params(&a.hyper) };
    let mut d = Vec::new();
    for i in 0..a.model_params.len() {
        let p = &a.model_params[i];
        let n = check_size(OP, ctx, p)?;
        let params = Params {
            n,
            t0: dtype_code(OP, "grads", a.grads[i].dtype())?,
            t1: dtype_code(OP, "model_params", p.dtype())?,
            ..base
        };
        d.push(Dispatch {
            lists: [
                Some(a.grads[i].clone()),
                Some(p.clone()),
                Some(a.master_params[i].clone()),
                Some(a.exp_avg[i].clone()),
                Some(a.exp_avg_sq[i].clone()),
            ],
            inv_scale: None,
            params,
            groups: word_groups(ctx, n, p.dtype())?,
        });
    }
    run(ctx, &a.noop_flag, &workspace(ctx, 1)?, d)?;
    Ok(MultiTensorAdamMasterOut {})
}

/// `multi_tensor_sgd`.
pub fn multi_tensor_sgd(ctx: &KernelCtx<'_>, a: &MultiTensorSgdArgs) -> Result<MultiTensorSgdOut> {
    const OP: &str = "multi_tensor_sgd";
    let base = Params {
        stage: 5,
        wd: a.weight_decay,
        momentum: a.momentum,
        dampening: a.dampening,
        lr: a.lr,
        nesterov: u32::from(a.nesterov),
        first_run: u32::from(a.first_run),
        wd_after_momentum: u32::from(a.wd_after_momentum),
        scale: a.scale,
        ..Default::default()
    };
    let mut d = Vec::new();
    for i in 0..a.params.len() {
        let p = &a.params[i];
        let n = check_size(OP, ctx, p)?;
        let params = Params {
            n,
            t0: dtype_code(OP, "grads", a.grads[i].dtype())?,
            t1: dtype_code(OP, "params", p.dtype())?,
            ..base
        };
        d.push(Dispatch {
            lists: [Some(a.grads[i].clone()), Some(p.clone()), Some(a.momentum_buf[i].clone()), None, None],
            inv_scale: None,
            params,
            groups: word_groups(ctx, n, p.dtype())?,
        });
    }
    run(ctx, &a.noop_flag, &workspace(ctx, 1)?, d)?;
    Ok(MultiTensorSgdOut {})
}

/// `multi_tensor_compute_scale_and_scale_inv`.
pub fn multi_tensor_compute_scale_and_scale_inv(ctx: &KernelCtx<'_>, a: &ComputeScaleArgs) -> Result<ComputeScaleOut> {
    const OP: &str = "multi_tensor_compute_scale_and_scale_inv";
    let base = Params {
        stage: 6,
        fp8_max: a.fp8_max,
        force_pow_2: u32::from(a.force_pow_2),
        eps: a.epsilon,
        ..Default::default()
    };
    let mut d = Vec::new();
    for i in 0..a.amax.len() {
        let n = check_size(OP, ctx, &a.amax[i])?;
        d.push(Dispatch {
            lists: [Some(a.amax[i].clone()), None, Some(a.scale[i].clone()), Some(a.scale_inv[i].clone()), None],
            inv_scale: None,
            params: Params { n, ..base },
            groups: word_groups(ctx, n, DType::F32)?,
        });
    }
    run(ctx, &a.noop_flag, &workspace(ctx, 1)?, d)?;
    Ok(ComputeScaleOut {})
}
