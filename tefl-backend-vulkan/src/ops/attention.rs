//! `fused_attn_fwd` and `fused_attn_bwd` on Vulkan (`shaders/attn_*.wgsl`): flash attention
//! with an online softmax per query row, and a backward that recomputes P from lse (delta =
//! Σ dO·O, then dK/dV per key row and dQ per query row; no atomics in the sums, so results do
//! not change from run to run). On a device with cooperative matrices, 16-bit inputs with head
//! dim 64 or 128 run on them both ways (`attn_*_coop.wgsl`: 64 query or key rows per workgroup,
//! the other side staged in shared memory by steps of 32 rows); everything else runs one row per
//! invocation (keys by steps of 16, K and V read through the caches rather than staged in shared
//! memory: see `attn_rows.wgsl`). Every layout, mask,
//! window, GQA and dropout option; no sq × sk buffer; head dims up to 256 (variants built for
//! 32, 64, 128 and 256, a call takes the smallest that fits). The geometry and checks are the
//! ones every GPU backend shares (`tefl_gpu::simt::attention::AttnBuild`).

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};
use tefl_gpu::simt::attention::AttnBuild;

use super::{MAX_GROUPS, binding as bind, dtype_name};
use crate::gpu::{Binding, Gpu, declared_shared_bytes, gpu};

/// The largest head dims the shaders are built for (`build.rs`'s ATTN_HEAD_DIMS).
const HEAD_DIMS: [usize; 4] = [32, 64, 128, 256];
/// The head dims the cooperative-matrix forward is built for (exactly; `build.rs`).
const COOP_HEAD_DIMS: [usize; 2] = [64, 128];
/// Query (or key) rows per workgroup (`build.rs`'s ATTN_ROWS).
const ROWS: usize = 64;
/// Keys per step of the forward's online softmax (`attn_common.wgsl`'s BC).
const KEY_STEP: u64 = 16;
/// Bytes of the stages' push constants (seventeen 32-bit fields of `AttnParams`).
const PUSH_BYTES: u32 = 68;
/// Bytes of the delta stage's push constants.
const DELTA_PUSH_BYTES: u32 = 8;
/// Invocations per workgroup of the delta stage.
const DELTA_WG: u32 = 256;

/// One call's geometry, shader build and push constants.
struct Plan {
    g: AttnGeometry,
    /// The variant suffix: `.tx=bf16.dm=128.br=64`.
    suffix: String,
    push: Vec<u8>,
}

/// The call's geometry, shader variant and push constants, for the forward's or the backward's
/// arguments (`call`: their shared part).
fn plan(op: &'static str, ctx: &KernelCtx<'_>, call: &AttnQkv<'_>) -> Result<Plan> {
    let max_d = HEAD_DIMS[HEAD_DIMS.len() - 1];
    // The lengths are read and checked on the host (the shaders trust them).
    let read = (MaxSeqlen::default(), false);
    let (g, build) = AttnBuild::checked(op, ctx, call, max_d, "the Vulkan kernels", read)?;
    let AttnQkv { q, k, layout, mask, scale, dropout_p: p, seed, offset, .. } = *call;
    let unsupported = |reason: String| Error::Unsupported { op, impl_id: ctx.impl_id.to_string(), reason };
    for (what, n) in [("q", q.numel()), ("k", k.numel())] {
        if n >= 1 << 31 {
            return Err(unsupported(format!("{what} has {n} elements; the Vulkan shaders index with 32 bits")));
        }
    }
    // Dropout's element index is 64-bit, its (sequence, head, query) part 32-bit.
    if g.batch.saturating_mul(g.hq).saturating_mul(g.sq) >= 1 << 31 {
        return Err(unsupported(format!("batch·hq·sq = {}·{}·{} is past 32 bits", g.batch, g.hq, g.sq)));
    }
    let groups = [g.sq.max(g.sk).div_ceil(ROWS), g.hq, g.batch];
    if groups.iter().any(|&n| n > MAX_GROUPS as usize) {
        return Err(unsupported(format!("{groups:?} workgroups, over {MAX_GROUPS} per dimension")));
    }
    let dm = HEAD_DIMS.iter().copied().find(|&dm| dm >= g.d).unwrap_or(max_d);
    if let Some(limit) = gpu(ctx.device)?.physical.loop_iteration_limit() {
        let need = loop_iterations(&g, p > 0.0, op == "fused_attn_bwd");
        if need > limit {
            return Err(unsupported(format!(
                "an invocation would run up to {need} loop iterations; this driver ends them after {limit}"
            )));
        }
    }
    let suffix = format!(".tx={}.dm={dm}.br={ROWS}", dtype_name(op, "q", q.dtype())?);
    let win = |w: Option<usize>| w.map_or(-1i32, |x| x as i32);
    let flags = u32::from(mask.is_causal())
        | u32::from(mask.bottom_right()) << 1
        | u32::from(mask.is_padding()) << 2
        | u32::from(build.dropout) << 3;
    let words: [u32; 17] = [
        g.batch as u32,
        g.sq as u32,
        g.sk as u32,
        g.hq as u32,
        g.hk as u32,
        g.tq as u32,
        g.d as u32,
        layout as u32,
        flags,
        win(build.window.0) as u32,
        win(build.window.1) as u32,
        scale.to_bits(),
        p.to_bits(),
        seed as u32,
        (seed >> 32) as u32,
        offset as u32,
        (offset >> 32) as u32,
    ];
    let push = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    Ok(Plan { g, suffix, push })
}

/// An upper bound of the loop iterations one invocation of the forward (or of the backward's
/// stages) runs: the shaders' loops take four head-dim elements per iteration plus up to three,
/// Philox runs ten rounds per dropout factor, then the per-key and per-query loops, row loads and
/// stores.
fn loop_iterations(g: &AttnGeometry, dropout: bool, backward: bool) -> u64 {
    let (d, sq, sk) = (g.d as u64, g.sq as u64, g.sk as u64);
    let group = (g.hq / g.hk.max(1)) as u64;
    let row = d.div_ceil(4) + 3;
    let philox = if dropout { 10 } else { 0 };
    let fwd = sk * (2 * row + 2 + philox) + sk.div_ceil(KEY_STEP) * (row + 1) + 3 * d;
    let dq = sk * (3 * row + 1 + philox) + 4 * d;
    let dkdv = group * (sq * (4 * row + 1 + philox) + 1) + 6 * d;
    if backward { dq.max(dkdv) } else { fwd }
}

/// The variant suffix of the cooperative-matrix `stages` (`.tx=bf16.dm=128.br=64`) where they
/// serve this call: the device has cooperative matrices for the dtype, the head dim is one they
/// are built for, and the device's shared memory holds what each of those stages declares.
/// `None`: the one-row-per-invocation stages.
fn coop_suffix(gpu: &Gpu, op: &'static str, stages: &[&str], dtype: DType, d: usize) -> Result<Option<String>> {
    let coop = match dtype {
        DType::F16 => gpu.coop,
        DType::BF16 => gpu.coop_bf16,
        _ => false,
    };
    if !coop || !COOP_HEAD_DIMS.contains(&d) {
        return Ok(None);
    }
    let suffix = format!(".tx={}.dm={d}.br={ROWS}", dtype_name(op, "q", dtype)?);
    let limit = gpu.physical.limits.max_compute_shared_memory_size;
    let fits =
        stages.iter().all(|s| declared_shared_bytes(&format!("{s}{suffix}")).is_some_and(|bytes| bytes <= limit));
    Ok(fits.then_some(suffix))
}

/// The cu_seqlens bindings (any buffer where the call has none: the shaders do not read it).
fn cu_bindings(cu_q: Option<&Tensor>, cu_k: Option<&Tensor>, any: &Tensor) -> Result<[Binding; 2]> {
    Ok([bind(cu_q.unwrap_or(any))?, bind(cu_k.unwrap_or(any))?])
}

/// `fused_attn_fwd`.
pub fn fused_attn_fwd(ctx: &KernelCtx<'_>, a: &AttnFwdArgs) -> Result<AttnFwdOut> {
    const OP: &str = "fused_attn_fwd";
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let p = plan(OP, ctx, &a.qkv())?;
    let (g, dev) = (&p.g, ctx.device);
    // thd rows past the last sequence belong to none: zero outputs, −inf lse (the shaders
    // write every row of every sequence, so sequences that end at the last row need neither).
    let tail = g.has_rows_past_sequences(false, a.q.shape()[0]);
    let o = if tail {
        Tensor::zeros(a.q.shape(), a.q.dtype(), &dev)?
    } else {
        Tensor::uninit(a.q.shape(), a.q.dtype(), &dev)?
    };
    let lse = Tensor::uninit(g.lse_shape(), DType::F32, &dev)?;
    let gpu = gpu(dev)?;
    let name = match coop_suffix(&gpu, OP, &["attn_fwd_coop"], a.q.dtype(), g.d)? {
        Some(suffix) => format!("attn_fwd_coop{suffix}"),
        None => format!("attn_fwd{}", p.suffix),
    };
    let pipeline = gpu.pipeline(&name, 8, PUSH_BYTES)?;
    let [cq, ck] = cu_bindings(cu_q, cu_k, &a.q)?;
    // Binding 5 (dO) is not read by the forward.
    let bindings = [cq, ck, bind(&a.q)?, bind(&a.k)?, bind(&a.v)?, bind(&a.q)?, bind(&o)?, bind(&lse)?];
    gpu.run(|r| {
        if tail {
            r.fill_word(bindings[7], f32::NEG_INFINITY.to_bits());
        }
        r.dispatch(&pipeline, &bindings, &p.push, (g.sq.div_ceil(ROWS) as u32, g.hq as u32, g.batch as u32))
    })?;
    Ok(AttnFwdOut { o, softmax_lse: lse })
}

/// `fused_attn_bwd`: delta = Σ dO·O per row and head, then dK/dV and dQ.
pub fn fused_attn_bwd(ctx: &KernelCtx<'_>, a: &AttnBwdArgs) -> Result<AttnBwdOut> {
    const OP: &str = "fused_attn_bwd";
    if a.d_o.dtype() != a.q.dtype() {
        return Err(Error::DType {
            op: OP,
            arg: "d_o",
            got: a.d_o.dtype(),
            expected: format!("{} (that of q)", a.q.dtype()),
        });
    }
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let p = plan(OP, ctx, &a.qkv())?;
    let (g, dev) = (&p.g, ctx.device);
    // thd rows outside every sequence get zero gradients (the shaders write every row of
    // every sequence).
    let tail = g.has_rows_past_sequences(false, a.q.shape()[0]) || g.has_rows_past_sequences(true, a.k.shape()[0]);
    let out = |t: &Tensor| {
        if tail { Tensor::zeros(t.shape(), t.dtype(), &dev) } else { Tensor::uninit(t.shape(), t.dtype(), &dev) }
    };
    let (dq, dk, dv) = (out(&a.q)?, out(&a.k)?, out(&a.v)?);
    let rows_heads = a.q.numel() / g.d;
    let delta = Tensor::uninit([rows_heads], DType::F32, &dev)?;
    let gpu = gpu(dev)?;
    let dtype = dtype_name(OP, "q", a.q.dtype())?;
    let delta_pipeline = gpu.pipeline(&format!("attn_delta.tx={dtype}.wg={DELTA_WG}"), 3, DELTA_PUSH_BYTES)?;
    let (dq_name, dkdv_name) = match coop_suffix(&gpu, OP, &["attn_dq_coop", "attn_dkdv_coop"], a.q.dtype(), g.d)? {
        Some(suffix) => (format!("attn_dq_coop{suffix}"), format!("attn_dkdv_coop{suffix}")),
        None => (format!("attn_dq{}", p.suffix), format!("attn_dkdv{}", p.suffix)),
    };
    let dq_pipeline = gpu.pipeline(&dq_name, 9, PUSH_BYTES)?;
    let dkdv_pipeline = gpu.pipeline(&dkdv_name, 10, PUSH_BYTES)?;
    let delta_push: Vec<u8> = [rows_heads as u32, g.d as u32].iter().flat_map(|w| w.to_le_bytes()).collect();
    let [cq, ck] = cu_bindings(cu_q, cu_k, &a.q)?;
    let inputs = [cq, ck, bind(&a.q)?, bind(&a.k)?, bind(&a.v)?, bind(&a.d_o)?, bind(&a.softmax_lse)?, bind(&delta)?];
    let mut dq_bindings = inputs.to_vec();
    dq_bindings.push(bind(&dq)?);
    let mut dkdv_bindings = inputs.to_vec();
    dkdv_bindings.extend([bind(&dk)?, bind(&dv)?]);
    let delta_groups = (rows_heads as u32).div_ceil(DELTA_WG).clamp(1, MAX_GROUPS);
    gpu.run(|r| {
        r.dispatch(&delta_pipeline, &[bind(&a.o)?, bind(&a.d_o)?, bind(&delta)?], &delta_push, (delta_groups, 1, 1))?;
        r.dispatch(&dkdv_pipeline, &dkdv_bindings, &p.push, (g.sk.div_ceil(ROWS) as u32, g.hk as u32, g.batch as u32))?;
        r.dispatch(&dq_pipeline, &dq_bindings, &p.push, (g.sq.div_ceil(ROWS) as u32, g.hq as u32, g.batch as u32))
    })?;
    Ok(AttnBwdOut { dq, dk, dv })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(sq: usize, hq: usize, hk: usize, d: usize) -> AttnGeometry {
        let span = |len| vec![SeqSpan { start: 0, len }];
        AttnGeometry {
            layout: QkvLayout::Bshd,
            batch: 1,
            sq,
            sk: sq,
            hq,
            hk,
            d,
            tq: sq,
            q_spans: span(sq),
            k_spans: span(sq),
            spans_on_device: false,
        }
    }

    #[test]
    fn loop_bounds_grow_with_keys_group_and_dropout() {
        // The conformance suite's long case fits lavapipe's 65535 both ways at 300 positions; at
        // 1024 the forward still does and the backward (2 query heads per key) does not.
        let limit = 65535;
        assert!(loop_iterations(&geometry(300, 2, 1, 64), false, false) <= limit);
        assert!(loop_iterations(&geometry(300, 2, 1, 64), false, true) <= limit);
        assert!(loop_iterations(&geometry(1024, 2, 1, 64), false, false) <= limit);
        assert!(loop_iterations(&geometry(1024, 2, 1, 64), false, true) > limit);
        let g = geometry(200, 4, 1, 128);
        assert!(loop_iterations(&g, true, true) > loop_iterations(&g, false, true));
        assert!(
            loop_iterations(&geometry(200, 4, 1, 128), false, true)
                > loop_iterations(&geometry(200, 2, 2, 128), false, true)
        );
    }
}
