//! Multi-tensor optimizers on CUDA: one launch per dtype group covers every tensor (a table of
//! pointers and chunks in device memory), in place, honouring `noop_flag` on the device (no
//! host round trip).

use std::collections::BTreeMap;

use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use crate::{Defines, Variant};

use super::host::{Arg, Grid, OnDevice, cty, empty, ptr, zeros};

/// The kernels of `simt/optimizer.cu` these ops launch.
const BLOCK: u32 = 512;
const CHUNK: usize = 65536;
const ENTRY: usize = 7;

#[derive(Clone, Copy)]
enum Kind {
    Scale = 0,
    L2Norm = 1,
    Adam = 2,
    AdamMaster = 3,
    Sgd = 4,
    ComputeScale = 5,
    /// The kernels that touch no tensor list (the noop snapshot, the norms' finish): a small
    /// all-f32 build of their own.
    Flags = 6,
}

/// One launch's worth: a dtype signature and the tensor indices that share it.
struct Group {
    kernel: OnDevice,
    table: Tensor,
    ntensors: usize,
    chunks: usize,
}

/// Groups tensor index i of `lists` by the dtypes of list[0][i], list[1][i], ... and uploads
/// one table per group.
fn groups(op: &'static str, ctx: &KernelCtx<'_>, kind: Kind, lists: &[&[Tensor]]) -> Result<Vec<Group>> {
    let mut out = Vec::new();
    for idx in by_signature(lists).values() {
        let variant = group_variant(op, kind, lists, idx[0])?;
        let mut table: Vec<u64> = Vec::with_capacity(idx.len() * (ENTRY + 2));
        let mut chunk_list: Vec<u64> = Vec::new();
        for (local, &i) in idx.iter().enumerate() {
            let mut entry = [0u64; ENTRY];
            for (slot, l) in lists.iter().enumerate() {
                entry[slot] = ptr(&l[i])?;
            }
            let numel = lists[0][i].numel();
            entry[5] = numel as u64;
            entry[6] = i as u64;
            table.extend_from_slice(&entry);
            for start in (0..numel).step_by(CHUNK) {
                chunk_list.extend_from_slice(&[local as u64, start as u64]);
            }
        }
        let chunks = chunk_list.len() / 2;
        table.extend(chunk_list);
        // The kernel reads the table as 64-bit words (addresses and counts): i64 carries the bits.
        let words: Vec<i64> = table.iter().map(|&w| w as i64).collect();
        // Only this op's launches read it, on the queue the upload goes on: no host wait.
        let table = Tensor::from_slice(&words, [words.len()], DType::I64)?.to_device_queued(&ctx.device)?;
        if u32::try_from(chunks).is_err() {
            return Err(super::host::unsupported(ctx, op, format!("'tensors': {chunks} chunks exceed one launch")));
        }
        out.push(Group { kernel: OnDevice::new(ctx.device, variant)?, table, ntensors: idx.len(), chunks });
    }
    Ok(out)
}

/// The tensor indices of `lists` by dtype signature (the dtypes of list[0][i], list[1][i], ...).
fn by_signature(lists: &[&[Tensor]]) -> BTreeMap<Vec<u8>, Vec<usize>> {
    let n = lists.first().map_or(0, |l| l.len());
    let mut by_sig: BTreeMap<Vec<u8>, Vec<usize>> = BTreeMap::new();
    for i in 0..n {
        let sig = lists.iter().map(|l| l[i].dtype() as u8).collect();
        by_sig.entry(sig).or_default().push(i);
    }
    by_sig
}

/// The variant of the group whose first tensor index is `first`.
fn group_variant(op: &'static str, kind: Kind, lists: &[&[Tensor]], first: usize) -> Result<Variant> {
    let mut types = ["float"; 5];
    for (slot, l) in lists.iter().enumerate().take(5) {
        types[slot] = cty(op, "tensor list", l[first].dtype())?;
    }
    Ok(variant(kind, types))
}

/// A warm-up (`tefl_core::Manager::warmup`): starts compiling, on other threads, the builds a
/// call over these lists launches (the noop snapshot's and each dtype group's), without
/// uploading a table or launching anything.
fn warmup(op: &'static str, ctx: &KernelCtx<'_>, kind: Kind, lists: &[&[Tensor]]) -> Result<()> {
    let target = crate::target::target_of(ctx.device)?;
    target.compile_ahead(ctx.device, &flags_variant());
    for idx in by_signature(lists).values() {
        target.compile_ahead(ctx.device, &group_variant(op, kind, lists, idx[0])?);
    }
    Ok(())
}

/// `multi_tensor_adam`'s lists, in the kernel's order (the op and its warm-up group them alike).
fn adam_lists(a: &MultiTensorAdamArgs) -> [&[Tensor]; 4] {
    [&a.grads, &a.params, &a.exp_avg, &a.exp_avg_sq]
}

/// `multi_tensor_adam_master`'s lists, in the kernel's order.
fn adam_master_lists(a: &MultiTensorAdamMasterArgs) -> [&[Tensor]; 5] {
    [&a.grads, &a.model_params, &a.master_params, &a.exp_avg, &a.exp_avg_sq]
}

/// `multi_tensor_adam`'s warm-up (see `warmup`).
pub fn warmup_adam(ctx: &KernelCtx<'_>, a: &MultiTensorAdamArgs) -> Result<()> {
    warmup("multi_tensor_adam", ctx, Kind::Adam, &adam_lists(a))
}

/// `multi_tensor_adam_master`'s warm-up (see `warmup`).
pub fn warmup_adam_master(ctx: &KernelCtx<'_>, a: &MultiTensorAdamMasterArgs) -> Result<()> {
    warmup("multi_tensor_adam_master", ctx, Kind::AdamMaster, &adam_master_lists(a))
}

/// The variant of `simt/optimizer.cu` for a kernel kind and the five list dtypes (launches
/// and the compile test).
fn variant(kind: Kind, types: [&str; 5]) -> Variant {
    let defines = Defines::new().set("KIND", kind as u8).set("BLOCK", BLOCK).set("CHUNK", CHUNK);
    let defines = ["T0", "T1", "T2", "T3", "T4"].into_iter().zip(types).fold(defines, |d, (n, t)| d.set(n, t));
    Variant::new(&tefl_kernels::OPTIMIZER, entries(kind), defines)
}

/// The kernels a build of `kind` holds (optimizer.cu compiles only those: a cold start's
/// first Adam step compiles the Adam kernel and the small l2norm build, not every kernel twice).
fn entries(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Scale => &["mt_scale"],
        Kind::L2Norm => &["mt_l2norm"],
        Kind::Adam | Kind::AdamMaster => &["mt_adam"],
        Kind::Sgd => &["mt_sgd"],
        Kind::ComputeScale => &["mt_compute_scale"],
        Kind::Flags => &["noop_snapshot", "mt_l2norm_finish"],
    }
}

/// The build of the kernels that touch no tensor list (the noop snapshot, the norms' finish).
fn flags_kernel(ctx: &KernelCtx<'_>) -> Result<OnDevice> {
    OnDevice::new(ctx.device, flags_variant())
}

/// The variant of [`flags_kernel`].
fn flags_variant() -> Variant {
    variant(Kind::Flags, ["float"; 5])
}

/// The noop flag as it is before the op (device to device, no host round trip). On the first
/// call the `groups`' builds, which the op launches next, are compiled on other threads
/// meanwhile.
fn snapshot(ctx: &KernelCtx<'_>, noop: &Tensor, groups: &[Group]) -> Result<Tensor> {
    let snap = empty(ctx.device, &[1], DType::I32)?;
    let k = flags_kernel(ctx)?;
    k.compile_ahead(|| Ok(groups.iter().map(|g| g.kernel.variant().clone()).collect()));
    k.launch("noop_snapshot", Grid::linear(1, 1), &[Arg::Ptr(ptr(noop)?), Arg::Ptr(ptr(&snap)?)])?;
    Ok(snap)
}

fn run(g: &Group, name: &'static str, snap: &Tensor, extra: &[Arg]) -> Result<()> {
    let mut args = vec![Arg::Ptr(ptr(&g.table)?), Arg::I32(g.ntensors as i32), Arg::Ptr(ptr(snap)?)];
    args.extend_from_slice(extra);
    g.kernel.launch(name, Grid::linear(g.chunks as u32, BLOCK), &args)
}

/// The catalogue op `multi_tensor_scale` on a GPU through the portable kernels of `simt/optimizer.cu` (every SIMT backend's impl).
pub fn multi_tensor_scale(ctx: &KernelCtx<'_>, a: &MultiTensorScaleArgs) -> Result<MultiTensorScaleOut> {
    const OP: &str = "multi_tensor_scale";
    let groups = groups(OP, ctx, Kind::Scale, &[&a.src, &a.dst])?;
    let snap = snapshot(ctx, &a.noop_flag, &groups)?;
    for g in &groups {
        run(g, "mt_scale", &snap, &[Arg::Ptr(ptr(&a.noop_flag)?), Arg::F32(a.scale)])?;
    }
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
    let n = tensors.len();
    let groups = groups(op, ctx, Kind::L2Norm, &[tensors])?;
    let snap = snapshot(ctx, noop, &groups)?;
    let ws = zeros(ctx.device, &[n.max(1)], DType::F64)?;
    let total = empty(ctx.device, &[1], DType::F32)?;
    let per = if per_tensor { Some(empty(ctx.device, &[n], DType::F32)?) } else { None };
    let inv = inv_scale.map(ptr).transpose()?.unwrap_or(0);
    for g in &groups {
        run(g, "mt_l2norm", &snap, &[Arg::Ptr(ptr(noop)?), Arg::Ptr(inv), Arg::Ptr(ptr(&ws)?)])?;
    }
    flags_kernel(ctx)?.launch(
        "mt_l2norm_finish",
        Grid::linear(1, 32),
        &[
            Arg::Ptr(ptr(&ws)?),
            Arg::I32(n as i32),
            Arg::Ptr(ptr(&snap)?),
            Arg::Ptr(ptr(&total)?),
            Arg::Ptr(per.as_ref().map(ptr).transpose()?.unwrap_or(0)),
        ],
    )?;
    Ok((total, per))
}

/// The catalogue op `multi_tensor_l2norm` on a GPU through the portable kernels of `simt/optimizer.cu` (every SIMT backend's impl).
pub fn multi_tensor_l2norm(ctx: &KernelCtx<'_>, a: &MultiTensorL2NormArgs) -> Result<MultiTensorL2NormOut> {
    let (total, per_tensor_norms) = l2norm("multi_tensor_l2norm", ctx, &a.noop_flag, &a.tensors, None, a.per_tensor)?;
    Ok(MultiTensorL2NormOut { total, per_tensor_norms })
}

/// The catalogue op `multi_tensor_unscale_l2norm` on a GPU through the portable kernels of `simt/optimizer.cu` (every SIMT backend's impl).
pub fn multi_tensor_unscale_l2norm(
    ctx: &KernelCtx<'_>,
    a: &MultiTensorUnscaleL2NormArgs,
) -> Result<MultiTensorUnscaleL2NormOut> {
    let (total, per_tensor_norms) =
        l2norm("multi_tensor_unscale_l2norm", ctx, &a.noop_flag, &a.tensors, Some(&a.inv_scale), a.per_tensor)?;
    Ok(MultiTensorUnscaleL2NormOut { total, per_tensor_norms })
}

fn adam_args(h: &AdamHyper) -> Vec<Arg> {
    let (bc1, bc2) = h.bias_corrections();
    let mode = match h.mode {
        AdamMode::L2 => 0,
        AdamMode::AdamW => 1,
    };
    vec![
        Arg::F32(h.lr),
        Arg::F32(h.beta1),
        Arg::F32(h.beta2),
        Arg::F32(h.eps),
        Arg::F32(h.weight_decay),
        Arg::F32(bc1),
        Arg::F32(bc2),
        Arg::I32(mode),
    ]
}

/// The catalogue op `multi_tensor_adam` on a GPU through the portable kernels of `simt/optimizer.cu` (every SIMT backend's impl).
pub fn multi_tensor_adam(ctx: &KernelCtx<'_>, a: &MultiTensorAdamArgs) -> Result<MultiTensorAdamOut> {
    const OP: &str = "multi_tensor_adam";
    let groups = groups(OP, ctx, Kind::Adam, &adam_lists(a))?;
    let snap = snapshot(ctx, &a.noop_flag, &groups)?;
    for g in &groups {
        run(g, "mt_adam", &snap, &adam_args(&a.hyper))?;
    }
    Ok(MultiTensorAdamOut {})
}

/// The catalogue op `multi_tensor_adam_master` on a GPU through the portable kernels of `simt/optimizer.cu` (every SIMT backend's impl).
pub fn multi_tensor_adam_master(
    ctx: &KernelCtx<'_>,
    a: &MultiTensorAdamMasterArgs,
) -> Result<MultiTensorAdamMasterOut> {
    const OP: &str = "multi_tensor_adam_master";
    let groups = groups(OP, ctx, Kind::AdamMaster, &adam_master_lists(a))?;
    let snap = snapshot(ctx, &a.noop_flag, &groups)?;
    for g in &groups {
        run(g, "mt_adam", &snap, &adam_args(&a.hyper))?;
    }
    Ok(MultiTensorAdamMasterOut {})
}

/// The catalogue op `multi_tensor_sgd` on a GPU through the portable kernels of `simt/optimizer.cu` (every SIMT backend's impl).
pub fn multi_tensor_sgd(ctx: &KernelCtx<'_>, a: &MultiTensorSgdArgs) -> Result<MultiTensorSgdOut> {
    const OP: &str = "multi_tensor_sgd";
    let groups = groups(OP, ctx, Kind::Sgd, &[&a.grads, &a.params, &a.momentum_buf])?;
    let snap = snapshot(ctx, &a.noop_flag, &groups)?;
    for g in &groups {
        run(
            g,
            "mt_sgd",
            &snap,
            &[
                Arg::F32(a.weight_decay),
                Arg::F32(a.momentum),
                Arg::F32(a.dampening),
                Arg::F32(a.lr),
                Arg::I32(i32::from(a.nesterov)),
                Arg::I32(i32::from(a.first_run)),
                Arg::I32(i32::from(a.wd_after_momentum)),
                Arg::F32(a.scale),
            ],
        )?;
    }
    Ok(MultiTensorSgdOut {})
}

/// The catalogue op `multi_tensor_compute_scale_and_scale_inv` on a GPU through the portable kernels of `simt/optimizer.cu` (every SIMT backend's impl).
pub fn multi_tensor_compute_scale_and_scale_inv(ctx: &KernelCtx<'_>, a: &ComputeScaleArgs) -> Result<ComputeScaleOut> {
    const OP: &str = "multi_tensor_compute_scale_and_scale_inv";
    let groups = groups(OP, ctx, Kind::ComputeScale, &[&a.amax, &a.scale, &a.scale_inv])?;
    let snap = snapshot(ctx, &a.noop_flag, &groups)?;
    for g in &groups {
        run(
            g,
            "mt_compute_scale",
            &snap,
            &[Arg::F32(a.fp8_max), Arg::I32(i32::from(a.force_pow_2)), Arg::F32(a.epsilon)],
        )?;
    }
    Ok(ComputeScaleOut {})
}

/// Variants covering every code path (the NVRTC compile test).
pub fn variants() -> Vec<Variant> {
    [Kind::Scale, Kind::L2Norm, Kind::Adam, Kind::AdamMaster, Kind::Sgd, Kind::ComputeScale, Kind::Flags]
        .into_iter()
        .map(|kind| variant(kind, ["bf16", "f16", "float", "float", "float"]))
        .collect()
}
