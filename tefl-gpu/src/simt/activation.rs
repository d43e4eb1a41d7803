//! Activations: vectorised grid-stride kernels (16-byte access), gated forms reading both
//! halves of a row, and the dbias forms (input gradient, then column sums of the unrounded
//! values in two small kernels).

use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use crate::tune::{self, ElementwiseConfig};
use crate::{Defines, Variant};

use super::host::{Arg, Grid, OnDevice, blocks_for, cty, empty, i32_of, info, ptr, sm_count, tune_table};

/// The kernels of `simt/activation.cu` these ops launch.
const ENTRIES: &[&str] =
    &["act_fwd", "act_bwd", "gated_fwd", "gated_fwd_kept", "gated_bwd", "dbias_partial", "sum_parts"];

fn act_code(kind: Activation) -> u8 {
    match kind {
        Activation::Gelu => 0,
        Activation::Qgelu => 1,
        Activation::Relu => 2,
        Activation::Srelu => 3,
        Activation::Silu => 4,
    }
}

struct Launch {
    k: OnDevice,
    cfg: ElementwiseConfig,
    nv: usize,
    sms: u32,
}

/// The variant of `activation.cu` for these dtypes, activation and launch config: the one
/// place its defines are built (launches and the compile test both call it).
fn variant(
    op: &'static str,
    x: DType,
    g: DType,
    kind: Activation,
    clamped: bool,
    cfg: ElementwiseConfig,
) -> Result<Variant> {
    let defines = Defines::new()
        .set("TX", cty(op, "input", x)?)
        .set("TG", cty(op, "grad", g)?)
        .set("ACT", act_code(kind))
        .flag("CLAMPED", clamped)
        .set("BLOCK", cfg.block)
        .set("UNROLL", cfg.unroll)
        .set("VEC_BYTES", cfg.vec_bytes);
    Ok(Variant::new(&tefl_kernels::ACTIVATION, ENTRIES, defines))
}

fn setup(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    x: DType,
    g: DType,
    kind: Activation,
    clamped: bool,
    cfg: ElementwiseConfig,
) -> Result<Launch> {
    let k = OnDevice::new(ctx.device, variant(op, x, g, kind, clamped, cfg)?)?;
    let nv = (cfg.vec_bytes as usize / x.size_in_bytes()).max(1);
    Ok(Launch { k, cfg, nv, sms: sm_count(ctx.device) })
}

impl Launch {
    fn grid(&self, items: usize) -> Grid {
        let per_block = (self.cfg.block * self.cfg.unroll) as usize;
        // One block per `per_block` items, not a capped grid-stride: on an H100 (2026-11-25,
        // 16384x8192 bf16, same build) gelu took 0.190 ms with 16 blocks per SM, 0.184 with
        // 64 and 0.183 uncapped (swiglu 0.278 / 0.272 / 0.271).
        Grid::linear(blocks_for(items, per_block, i32::MAX as u32), self.cfg.block)
    }
}

/// Runs `body` with the launch config the heuristic picks, or (`TEFL_AUTOTUNE=1`) the
/// fastest candidate of the tune table for this op, dtype and size bucket.
#[allow(clippy::too_many_arguments)]
fn launch_tuned(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    x: DType,
    g: DType,
    kind: Activation,
    clamped: bool,
    items: usize,
    body: impl Fn(&Launch) -> Result<()>,
) -> Result<()> {
    let run = |cfg: ElementwiseConfig| setup(op, ctx, x, g, kind, clamped, cfg).and_then(|l| body(&l));
    let (table, info) = (tune_table(ctx.device)?, info(ctx.device)?);
    let cfg = tune::tuned_elementwise(&table, op, &info, x, items, |cfg| tune::measure(ctx.device, &|| run(cfg)));
    run(cfg)
}

/// An activation forward's warm-up (`tefl_core::Manager::warmup`): starts compiling, on other
/// threads, the build a call of `fwd` on `x` launches and the one its backward `bwd` launches
/// with a gradient of x's dtype (the same build where both take the same launch config),
/// launching nothing. `gated`: x holds [gate | value] halves.
fn warmup(
    fwd: &'static str,
    bwd: &'static str,
    ctx: &KernelCtx<'_>,
    x: &Tensor,
    kind: Activation,
    clamped: bool,
    gated: bool,
) -> Result<()> {
    let items = if gated { x.rows() * (x.last_dim() / 2) } else { x.numel() };
    let (table, info) = (tune_table(ctx.device)?, info(ctx.device)?);
    let target = crate::target::target_of(ctx.device)?;
    for op in [fwd, bwd] {
        let cfg = tune::elementwise_ahead(&table, op, &info, x.dtype(), items);
        target.compile_ahead(ctx.device, &variant(op, x.dtype(), x.dtype(), kind, clamped, cfg)?);
    }
    Ok(())
}

fn plain_fwd(op: &'static str, ctx: &KernelCtx<'_>, x: &Tensor, kind: Activation) -> Result<ActOut> {
    let y = empty(ctx.device, x.shape(), x.dtype())?;
    let total = x.numel();
    let (xp, yp) = (ptr(x)?, ptr(&y)?);
    launch_tuned(op, ctx, x.dtype(), x.dtype(), kind, false, total, |l| {
        let vec = total.is_multiple_of(l.nv);
        let grid = l.grid(if vec { total / l.nv } else { total });
        l.k.launch("act_fwd", grid, &[Arg::Ptr(xp), Arg::Ptr(yp), Arg::U64(total as u64), Arg::I32(i32::from(vec))])
    })?;
    Ok(ActOut { y })
}

fn plain_bwd(op: &'static str, ctx: &KernelCtx<'_>, g: &Tensor, x: &Tensor, kind: Activation) -> Result<Tensor> {
    let gi = empty(ctx.device, x.shape(), x.dtype())?;
    let total = x.numel();
    let (gp, xp, gip) = (ptr(g)?, ptr(x)?, ptr(&gi)?);
    launch_tuned(op, ctx, x.dtype(), g.dtype(), kind, false, total, |l| {
        let vec = total.is_multiple_of(l.nv);
        let grid = l.grid(if vec { total / l.nv } else { total });
        l.k.launch(
            "act_bwd",
            grid,
            &[Arg::Ptr(gp), Arg::Ptr(xp), Arg::Ptr(gip), Arg::U64(total as u64), Arg::I32(i32::from(vec))],
        )
    })?;
    Ok(gi)
}

fn half_shape(t: &Tensor) -> Vec<usize> {
    let mut s = t.shape().to_vec();
    if let Some(l) = s.last_mut() {
        *l /= 2;
    }
    s
}

/// Launches `gated_fwd` or `gated_bwd` over x's rows (each [gate | value], n wide per half):
/// `ptrs`, then rows, n, whether rows are vector-aligned, and the clamp's limit and alpha.
/// `arg` names x in errors. `kept` (the forward only): `gated_fwd_kept` takes vector-aligned
/// rows instead, holding x in L2 and releasing the rows from that one on ([`fwd_keep_l2`]).
#[allow(clippy::too_many_arguments)]
fn launch_gated(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    kernel: &'static str,
    x: &Tensor,
    arg: &'static str,
    g: DType,
    kind: Activation,
    clamp: Option<(f32, f32)>,
    ptrs: &[Arg],
    kept: Option<usize>,
) -> Result<()> {
    let (rows, n) = (x.rows(), x.last_dim() / 2);
    let (limit, alpha) = clamp.unwrap_or((0.0, 0.0));
    let (rows_i, n_i) = (i32_of(ctx, op, arg, rows)?, i32_of(ctx, op, arg, n)?);
    let release_from = kept.map(|r| i32_of(ctx, op, arg, r)).transpose()?;
    launch_tuned(op, ctx, x.dtype(), g, kind, clamp.is_some(), rows * n, |l| {
        let vec = n.is_multiple_of(l.nv);
        let grid = l.grid(if vec { rows * n / l.nv } else { rows * n });
        let mut args = ptrs.to_vec();
        args.extend([Arg::I32(rows_i), Arg::I32(n_i), Arg::I32(i32::from(vec)), Arg::F32(limit), Arg::F32(alpha)]);
        match release_from.filter(|_| vec) {
            Some(from) => {
                args.push(Arg::I32(from));
                l.k.launch("gated_fwd_kept", grid, &args)
            }
            None => l.k.launch(kernel, grid, &args),
        }
    })
}

/// Whether the gated forward of `x` holds x in L2 while its rows are in use, and the first row
/// it releases: [`tune::l2_keep`] with the tune configs' `gated_fwd_l2` entry (the Hopper file
/// sets it; its comment has the figures).
fn fwd_keep_l2(ctx: &KernelCtx<'_>, x: &Tensor) -> Result<Option<usize>> {
    let row_bytes = x.last_dim() * x.dtype().size_in_bytes();
    Ok(tune::l2_keep(&*tune_table(ctx.device)?, "gated_fwd_l2", x.rows(), row_bytes))
}

fn gated_fwd(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    x: &Tensor,
    kind: Activation,
    clamp: Option<(f32, f32)>,
) -> Result<ActOut> {
    let y = empty(ctx.device, &half_shape(x), x.dtype())?;
    let kept = fwd_keep_l2(ctx, x)?;
    let ptrs = [Arg::Ptr(ptr(x)?), Arg::Ptr(ptr(&y)?)];
    launch_gated(op, ctx, "gated_fwd", x, "x", x.dtype(), kind, clamp, &ptrs, kept)?;
    Ok(ActOut { y })
}

fn gated_bwd(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    g: &Tensor,
    x: &Tensor,
    kind: Activation,
    clamp: Option<(f32, f32)>,
) -> Result<DActOut> {
    let gi = empty(ctx.device, x.shape(), x.dtype())?;
    let ptrs = [Arg::Ptr(ptr(g)?), Arg::Ptr(ptr(x)?), Arg::Ptr(ptr(&gi)?)];
    launch_gated(op, ctx, "gated_bwd", x, "input", g.dtype(), kind, clamp, &ptrs, None)?;
    Ok(DActOut { grad_input: gi })
}

fn dbias(op: &'static str, ctx: &KernelCtx<'_>, a: &DActArgs, kind: Activation) -> Result<DBiasOut> {
    let grad_input = plain_bwd(op, ctx, &a.grad, &a.input, kind)?;
    let cfg = tune::elementwise_for(&*tune_table(ctx.device)?, op);
    let l = setup(op, ctx, a.input.dtype(), a.grad.dtype(), kind, false, cfg)?;
    let (rows, n) = (a.input.rows(), a.input.last_dim());
    let dbias = empty(ctx.device, &[n], a.input.dtype())?;
    if n == 0 {
        return Ok(DBiasOut { dbias, grad_input });
    }
    let col_blocks = n.div_ceil(256) as u32;
    let parts = (l.sms * 4).div_ceil(col_blocks).clamp(1, rows.max(1) as u32);
    let ws = empty(ctx.device, &[parts as usize, n], DType::F32)?;
    let (rows_i, n_i) = (i32_of(ctx, op, "input", rows)?, i32_of(ctx, op, "input", n)?);
    l.k.launch(
        "dbias_partial",
        Grid { blocks: (col_blocks, parts, 1), threads: (256, 1, 1), smem: 0 },
        &[Arg::Ptr(ptr(&a.grad)?), Arg::Ptr(ptr(&a.input)?), Arg::Ptr(ptr(&ws)?), Arg::I32(rows_i), Arg::I32(n_i)],
    )?;
    l.k.launch(
        "sum_parts",
        Grid::linear(col_blocks, 256),
        &[Arg::Ptr(ptr(&ws)?), Arg::Ptr(ptr(&dbias)?), Arg::I32(parts as i32), Arg::I32(n_i)],
    )?;
    Ok(DBiasOut { dbias, grad_input })
}

macro_rules! plain {
    ($( $fwd:ident, $bwd:ident, $db:ident, $warm:ident => $kind:ident; )*) => {
        $(
            #[doc = concat!("`", stringify!($fwd), "`'s warm-up: compiles what its calls and its backward's would launch, ahead (see `Manager::warmup`).")]
            pub fn $warm(ctx: &KernelCtx<'_>, a: &ActArgs) -> Result<()> {
                warmup(stringify!($fwd), stringify!($bwd), ctx, &a.x, Activation::$kind, false, false)
            }
            #[doc = concat!("The catalogue op `", stringify!($fwd), "` on a GPU through the portable kernels of `simt/activation.cu` (every SIMT backend's impl).")]
            pub fn $fwd(ctx: &KernelCtx<'_>, a: &ActArgs) -> Result<ActOut> {
                plain_fwd(stringify!($fwd), ctx, &a.x, Activation::$kind)
            }
            #[doc = concat!("The catalogue op `", stringify!($bwd), "` on a GPU through the portable kernels of `simt/activation.cu` (every SIMT backend's impl).")]
            pub fn $bwd(ctx: &KernelCtx<'_>, a: &DActArgs) -> Result<DActOut> {
                Ok(DActOut { grad_input: plain_bwd(stringify!($bwd), ctx, &a.grad, &a.input, Activation::$kind)? })
            }
            #[doc = concat!("The catalogue op `", stringify!($db), "` on a GPU through the portable kernels of `simt/activation.cu` (every SIMT backend's impl).")]
            pub fn $db(ctx: &KernelCtx<'_>, a: &DActArgs) -> Result<DBiasOut> {
                dbias(stringify!($db), ctx, a, Activation::$kind)
            }
        )*
    };
}

plain! {
    gelu, dgelu, dbias_dgelu, warmup_gelu => Gelu;
    qgelu, dqgelu, dbias_dqgelu, warmup_qgelu => Qgelu;
    relu, drelu, dbias_drelu, warmup_relu => Relu;
    srelu, dsrelu, dbias_dsrelu, warmup_srelu => Srelu;
    silu, dsilu, dbias_dsilu, warmup_silu => Silu;
}

macro_rules! gated {
    ($( $fwd:ident, $bwd:ident, $warm:ident => $kind:ident; )*) => {
        $(
            #[doc = concat!("`", stringify!($fwd), "`'s warm-up: compiles what its calls and its backward's would launch, ahead (see `Manager::warmup`).")]
            pub fn $warm(ctx: &KernelCtx<'_>, a: &ActArgs) -> Result<()> {
                warmup(stringify!($fwd), stringify!($bwd), ctx, &a.x, Activation::$kind, false, true)
            }
            #[doc = concat!("The catalogue op `", stringify!($fwd), "` on a GPU through the portable kernels of `simt/activation.cu` (every SIMT backend's impl).")]
            pub fn $fwd(ctx: &KernelCtx<'_>, a: &ActArgs) -> Result<ActOut> {
                gated_fwd(stringify!($fwd), ctx, &a.x, Activation::$kind, None)
            }
            #[doc = concat!("The catalogue op `", stringify!($bwd), "` on a GPU through the portable kernels of `simt/activation.cu` (every SIMT backend's impl).")]
            pub fn $bwd(ctx: &KernelCtx<'_>, a: &DActArgs) -> Result<DActOut> {
                gated_bwd(stringify!($bwd), ctx, &a.grad, &a.input, Activation::$kind, None)
            }
        )*
    };
}

gated! {
    geglu, dgeglu, warmup_geglu => Gelu;
    qgeglu, dqgeglu, warmup_qgeglu => Qgelu;
    reglu, dreglu, warmup_reglu => Relu;
    sreglu, dsreglu, warmup_sreglu => Srelu;
    swiglu, dswiglu, warmup_swiglu => Silu;
}

/// The catalogue op `clamped_swiglu` on a GPU through the portable kernels of `simt/activation.cu` (every SIMT backend's impl).
pub fn clamped_swiglu(ctx: &KernelCtx<'_>, a: &ClampedSwigluArgs) -> Result<ActOut> {
    gated_fwd("clamped_swiglu", ctx, &a.x, Activation::Silu, Some((a.limit, a.alpha)))
}

/// The catalogue op `clamped_dswiglu` on a GPU through the portable kernels of `simt/activation.cu` (every SIMT backend's impl).
pub fn clamped_dswiglu(ctx: &KernelCtx<'_>, a: &ClampedDSwigluArgs) -> Result<DActOut> {
    gated_bwd("clamped_dswiglu", ctx, &a.grad, &a.input, Activation::Silu, Some((a.limit, a.alpha)))
}

/// `clamped_swiglu`'s warm-up (see `warmup_swiglu`).
pub fn warmup_clamped_swiglu(ctx: &KernelCtx<'_>, a: &ClampedSwigluArgs) -> Result<()> {
    warmup("clamped_swiglu", "clamped_dswiglu", ctx, &a.x, Activation::Silu, true, true)
}

/// Variants covering every code path (the NVRTC compile test).
pub fn variants() -> Vec<Variant> {
    use DType::{BF16, F16, F32};
    let cfg = ElementwiseConfig { block: 256, unroll: 2, vec_bytes: 16 };
    let mut v = Vec::new();
    for (x, g) in [(BF16, BF16), (F16, F32), (F32, BF16)] {
        for kind in [Activation::Gelu, Activation::Qgelu, Activation::Relu, Activation::Srelu, Activation::Silu] {
            for clamped in [false, true] {
                v.extend(variant("activation", x, g, kind, clamped, cfg));
            }
        }
    }
    v
}
