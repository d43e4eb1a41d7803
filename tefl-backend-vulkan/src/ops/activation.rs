//! Activations on Vulkan (`shaders/activation.wgsl`): plain forward and backward, the gated
//! forms over the [a | b] halves of the last dim, and the clamped SwiGLU. One shader variant
//! per (input dtype, gradient dtype, workgroup size); the activation and the form are push
//! constants. Where every tensor is one 16-bit dtype and the counts are whole chunks of 8,
//! `shaders/activation_vec.wgsl` does the same with 16-byte loads and stores, one variant per
//! activation too (a switch on the push constant for each element cost its gelu a third of its
//! speed on the H200). The dbias forms
//! add the column sums of the unrounded input gradient (`shaders/activation_dbias.wgsl`, two
//! passes through an f32 workspace); with the identity, the same passes give `bgrad_quantize`
//! its plain column sums (`column_sums`).

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};

use super::{MAX_GROUPS, dtype_name};
use crate::gpu::gpu;

/// Bytes of the shader's push constants (six 32-bit fields).
const PUSH_BYTES: u32 = 24;

fn act_code(kind: Activation) -> u32 {
    match kind {
        Activation::Gelu => 0,
        Activation::Qgelu => 1,
        Activation::Relu => 2,
        Activation::Srelu => 3,
        Activation::Silu => 4,
    }
}

/// The shader's `act` for the clamped SwiGLU.
const CLAMPED: u32 = 5;
/// The shader's `act` for the identity (derivative 1): [`column_sums`] of the gradient alone.
pub(crate) const IDENTITY: u32 = 6;

/// The form (`Params.mode`).
#[derive(Clone, Copy)]
enum Mode {
    Fwd = 0,
    Bwd = 1,
    GatedFwd = 2,
    GatedBwd = 3,
}

/// The 16-byte shader's variant for 16-bit dtype `tx`, activation `act` (0 to [`CLAMPED`]) and
/// workgroup size `wg`.
fn vec_variant(tx: &str, act: u32, wg: u32) -> String {
    format!("activation_vec.tx={tx}.act={act}.wg={wg}")
}

/// Writes `out` (every element) from x and, for the backward forms, the gradient g.
#[allow(clippy::too_many_arguments)]
fn launch(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    mode: Mode,
    act: u32,
    x: &Tensor,
    g: Option<&Tensor>,
    out: &Tensor,
    clamp: (f32, f32),
) -> Result<()> {
    let total = out.numel();
    let too_big = |what: &str| Error::Unsupported {
        op,
        impl_id: ctx.impl_id.to_string(),
        reason: format!("{what} has {total} elements; the Vulkan shaders index with 32 bits"),
    };
    if total >= (1usize << 31) || x.numel() >= (1usize << 31) {
        return Err(too_big("the output"));
    }
    if total == 0 {
        return Ok(());
    }
    let n = (x.last_dim() / 2) as u32;
    let wg = crate::heuristics::elementwise_workgroup(ctx.device)?;
    let tg = g.map_or(x.dtype(), Tensor::dtype);
    // The 16-byte path: one 16-bit dtype, and whole chunks of 8 (per row for the gated forms).
    let gated = matches!(mode, Mode::GatedFwd | Mode::GatedBwd);
    let chunked = total.is_multiple_of(8) && (!gated || n.is_multiple_of(8));
    let vec_name = super::half_name(x.dtype())
        .filter(|_| chunked && tg == x.dtype() && out.dtype() == x.dtype() && act <= CLAMPED);
    let name = match vec_name {
        Some(tx) => vec_variant(tx, act, wg),
        None => {
            format!("activation.tx={}.tg={}.wg={wg}", dtype_name(op, "input", x.dtype())?, dtype_name(op, "grad", tg)?)
        }
    };
    let gpu = gpu(ctx.device)?;
    let pipeline = gpu.pipeline(&name, 3, PUSH_BYTES)?;
    let bind = super::binding;
    let bindings = [bind(x)?, bind(g.unwrap_or(x))?, bind(out)?];
    let mut push = Vec::with_capacity(PUSH_BYTES as usize);
    for v in [mode as u32, act, total as u32, n] {
        push.extend_from_slice(&v.to_le_bytes());
    }
    push.extend_from_slice(&clamp.0.to_le_bytes());
    push.extend_from_slice(&clamp.1.to_le_bytes());
    let per_item = if vec_name.is_some() {
        8
    } else if out.dtype() == DType::F32 {
        1
    } else {
        2
    };
    let items = total.div_ceil(per_item) as u32;
    let groups = items.div_ceil(wg).clamp(1, MAX_GROUPS);
    gpu.run(|r| r.dispatch(&pipeline, &bindings, &push, (groups, 1, 1)))
}

fn empty(ctx: &KernelCtx<'_>, shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::uninit(shape, dtype, &ctx.device)
}

fn half_shape(t: &Tensor) -> Vec<usize> {
    let mut s = t.shape().to_vec();
    if let Some(l) = s.last_mut() {
        *l /= 2;
    }
    s
}

fn plain_fwd(op: &'static str, ctx: &KernelCtx<'_>, x: &Tensor, kind: Activation) -> Result<ActOut> {
    let y = empty(ctx, x.shape(), x.dtype())?;
    launch(op, ctx, Mode::Fwd, act_code(kind), x, None, &y, (0.0, 0.0))?;
    Ok(ActOut { y })
}

fn plain_bwd(op: &'static str, ctx: &KernelCtx<'_>, a: &DActArgs, kind: Activation) -> Result<DActOut> {
    let gi = empty(ctx, a.input.shape(), a.input.dtype())?;
    launch(op, ctx, Mode::Bwd, act_code(kind), &a.input, Some(&a.grad), &gi, (0.0, 0.0))?;
    Ok(DActOut { grad_input: gi })
}

fn gated_fwd(op: &'static str, ctx: &KernelCtx<'_>, x: &Tensor, act: u32, clamp: (f32, f32)) -> Result<ActOut> {
    let y = empty(ctx, &half_shape(x), x.dtype())?;
    launch(op, ctx, Mode::GatedFwd, act, x, None, &y, clamp)?;
    Ok(ActOut { y })
}

fn gated_bwd(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    g: &Tensor,
    x: &Tensor,
    act: u32,
    clamp: (f32, f32),
) -> Result<DActOut> {
    let gi = empty(ctx, x.shape(), x.dtype())?;
    launch(op, ctx, Mode::GatedBwd, act, x, Some(g), &gi, clamp)?;
    Ok(DActOut { grad_input: gi })
}

/// Column parts the first dbias pass splits the rows into, at most (more parts: more
/// parallelism, a larger f32 workspace).
const DBIAS_PARTS: usize = 128;

fn dbias(op: &'static str, ctx: &KernelCtx<'_>, a: &DActArgs, kind: Activation) -> Result<DBiasOut> {
    let grad_input = plain_bwd(op, ctx, a, kind)?.grad_input;
    let dbias = column_sums(op, ctx, &a.input, &a.grad, act_code(kind))?;
    Ok(DBiasOut { dbias, grad_input })
}

/// Σ_r grad[r, c]·act'(input[r, c]) for each column c of the last dim (`act`: the shader's code,
/// [`IDENTITY`] for plain sums of `grad`), accumulated in f32 over the unrounded products and
/// stored in `input`'s dtype; `grad` has `input`'s shape.
pub(crate) fn column_sums(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    input: &Tensor,
    grad: &Tensor,
    act: u32,
) -> Result<Tensor> {
    let (rows, n) = (input.rows(), input.last_dim());
    let dbias = empty(ctx, &[n], input.dtype())?;
    if n == 0 {
        return Ok(dbias);
    }
    let wg = crate::heuristics::elementwise_workgroup(ctx.device)?;
    let col_groups = n.div_ceil(wg as usize);
    if col_groups > MAX_GROUPS as usize {
        return Err(Error::Unsupported {
            op,
            impl_id: ctx.impl_id.to_string(),
            reason: format!("{n} columns need {col_groups} workgroups, over {MAX_GROUPS}"),
        });
    }
    let parts = DBIAS_PARTS.div_ceil(col_groups).clamp(1, rows.max(1));
    let ws = empty(ctx, &[parts, n], DType::F32)?;
    let name = format!(
        "activation_dbias.tx={}.tg={}.wg={wg}",
        dtype_name(op, "input", input.dtype())?,
        dtype_name(op, "grad", grad.dtype())?
    );
    let gpu = gpu(ctx.device)?;
    let pipeline = gpu.pipeline(&name, 4, PUSH_BYTES)?;
    let bind = super::binding;
    let bindings = [bind(input)?, bind(grad)?, bind(&ws)?, bind(&dbias)?];
    let push = |stage: u32| -> Vec<u8> {
        [stage, act, rows as u32, n as u32, parts as u32, 0].iter().flat_map(|v| v.to_le_bytes()).collect()
    };
    let per_word = if input.dtype() == DType::F32 { 1 } else { 2 };
    let out_groups = (n.div_ceil(per_word) as u32).div_ceil(wg).clamp(1, MAX_GROUPS);
    gpu.run(|r| {
        r.dispatch(&pipeline, &bindings, &push(0), (col_groups as u32, parts as u32, 1))?;
        r.dispatch(&pipeline, &bindings, &push(1), (out_groups, 1, 1))
    })?;
    Ok(dbias)
}

macro_rules! plain {
    ($( $fwd:ident, $bwd:ident, $db:ident => $kind:ident; )*) => {
        $(
            /// The forward activation.
            pub fn $fwd(ctx: &KernelCtx<'_>, a: &ActArgs) -> Result<ActOut> {
                plain_fwd(stringify!($fwd), ctx, &a.x, Activation::$kind)
            }
            /// The activation's backward.
            pub fn $bwd(ctx: &KernelCtx<'_>, a: &DActArgs) -> Result<DActOut> {
                plain_bwd(stringify!($bwd), ctx, a, Activation::$kind)
            }
            /// The backward and the bias gradient (column sums of the input gradient).
            pub fn $db(ctx: &KernelCtx<'_>, a: &DActArgs) -> Result<DBiasOut> {
                dbias(stringify!($db), ctx, a, Activation::$kind)
            }
        )*
    };
}

plain! {
    gelu, dgelu, dbias_dgelu => Gelu;
    qgelu, dqgelu, dbias_dqgelu => Qgelu;
    relu, drelu, dbias_drelu => Relu;
    srelu, dsrelu, dbias_dsrelu => Srelu;
    silu, dsilu, dbias_dsilu => Silu;
}

macro_rules! gated {
    ($( $fwd:ident, $bwd:ident => $kind:ident; )*) => {
        $(
            /// The gated forward.
            pub fn $fwd(ctx: &KernelCtx<'_>, a: &ActArgs) -> Result<ActOut> {
                gated_fwd(stringify!($fwd), ctx, &a.x, act_code(Activation::$kind), (0.0, 0.0))
            }
            /// The gated backward.
            pub fn $bwd(ctx: &KernelCtx<'_>, a: &DActArgs) -> Result<DActOut> {
                gated_bwd(stringify!($bwd), ctx, &a.grad, &a.input, act_code(Activation::$kind), (0.0, 0.0))
            }
        )*
    };
}

gated! {
    geglu, dgeglu => Gelu;
    qgeglu, dqgeglu => Qgelu;
    reglu, dreglu => Relu;
    sreglu, dsreglu => Srelu;
    swiglu, dswiglu => Silu;
}

/// The clamped SwiGLU forward.
pub fn clamped_swiglu(ctx: &KernelCtx<'_>, a: &ClampedSwigluArgs) -> Result<ActOut> {
    gated_fwd("clamped_swiglu", ctx, &a.x, CLAMPED, (a.limit, a.alpha))
}

/// The clamped SwiGLU backward.
pub fn clamped_dswiglu(ctx: &KernelCtx<'_>, a: &ClampedDSwigluArgs) -> Result<DActOut> {
    gated_bwd("clamped_dswiglu", ctx, &a.grad, &a.input, CLAMPED, (a.limit, a.alpha))
}

#[cfg(test)]
mod tests {
    use super::{CLAMPED, vec_variant};

    /// Every 16-byte variant the host may ask for was built: both 16-bit dtypes, every
    /// activation code up to the clamped SwiGLU, every workgroup size the heuristic picks from.
    #[test]
    fn every_vec_variant_the_host_may_pick_was_built() {
        for tx in ["f16", "bf16"] {
            for act in 0..=CLAMPED {
                for wg in crate::heuristics::WORKGROUPS {
                    let name = vec_variant(tx, act, wg);
                    assert!(crate::gpu::shader_names().any(|n| n == name), "{name} was not built");
                }
            }
        }
        assert!(!crate::gpu::shader_names().any(|n| n == vec_variant("bf16", CLAMPED + 1, 256)));
    }
}
