//! RMSNorm and LayerNorm: one block per row, the row kept in registers and read once
//! (16-byte vectors) when it fits, a two-pass scalar path otherwise. The backward sums
//! dgamma/dbeta per block in registers and reduces the partials across the blocks: in the
//! same kernel where the target launches it cooperatively (CUDA; the blocks wait for each
//! other's flags), else in a second small kernel. Its blocks stride over the rows, fetching
//! ahead either the next row into registers or, where the tune configs ask for it
//! (`norm_bwd.stages`, Hopper), several rows into a ring in shared memory by asynchronous
//! copies.

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use tefl_core::catalogue::*;
use tefl_core::tuning::TuneTable;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use crate::tune::{self, RowConfig};
use crate::{Defines, Variant};

use super::host::{
    Arg, Grid, OnDevice, blocks_for, cty, empty, i32_of, info, opt_ptr, ptr, sm_count, tune_table, zeros,
};

/// The kernels of `simt/norm.cu` these ops launch.
const ENTRIES: &[&str] = &["norm_fwd", "norm_bwd", "norm_bwd_cols", "norm_reduce_ws"];

struct Types {
    x: DType,
    g: DType,
    y: DType,
    add: Option<DType>,
}

/// The fused backward's ring of rows in shared memory: its row buffers (0: none, the next row
/// waits in registers) and the blocks an SM its launch bounds are for.
#[derive(Clone, Copy)]
struct Ring {
    stages: u32,
    blocks_per_sm: u32,
}

impl Ring {
    /// No ring (the forward, and backwards that fetch ahead in registers).
    const NONE: Ring = Ring { stages: 0, blocks_per_sm: 1 };
}

/// The variant of `norm.cu` for these dtypes, norm kind, zero-centred gamma (`zc`), row config
/// and ring (`keep_l2`: the forward holds x in L2 while its rows are in use, [`keep_l2`]): the
/// one place its defines are built (launches and the compile test both call it).
fn variant(
    op: &'static str,
    t: &Types,
    is_ln: bool,
    zc: bool,
    cfg: RowConfig,
    ring: Ring,
    keep_l2: bool,
) -> Result<Variant> {
    let mut defines = Defines::new()
        .set("TX", cty(op, "x", t.x)?)
        .set("TG", cty(op, "gamma", t.g)?)
        .set("TY", cty(op, "y", t.y)?)
        .set("TA", t.add.map(|d| cty(op, "add", d)).transpose()?.unwrap_or("float"))
        .flag("IS_LN", is_ln)
        .flag("ZC", zc)
        .flag("HAS_ADD", t.add.is_some())
        .set("BLOCK", cfg.block)
        .set("ROW_VECS", cfg.row_vecs.max(1))
        .flag("FUSED", cfg.fused())
        .set("VEC_BYTES", cfg.vec_bytes)
        .set("STAGES", ring.stages)
        .set("RING_BLOCKS", ring.blocks_per_sm)
        .flag("OUT_FP8", t.y.is_fp8())
        // (the forward's grid: a block per row, except for an FP8 output; see `forward`)
        .flag("ROW_PER_BLOCK", !t.y.is_fp8())
        .flag("KEEP_L2", keep_l2);
    if t.y.is_fp8() {
        defines = super::quantize::fp8_format(op, defines, t.y)?;
    }
    Ok(Variant::new(&tefl_kernels::NORM, ENTRIES, defines))
}

/// Whether the norm forward (RMSNorm or LayerNorm) of `x` loads x with an L2 evict_last policy,
/// and if so the first row whose lines it puts back to the normal priority once the row is stored
/// (`load_kept` / `release_after` in the prelude; plain loads on targets without them): kept
/// where the tune configs' `norm_fwd_l2.keep_min_mib` is set (the Hopper file) and x has at
/// least that many MiB. Not for FP8 outputs, which were no faster with it on an H100 and mixed on
/// an H200 (the Hopper tune configs have the figures, the LayerNorm forward's gain too).
///
/// Released are the rows of x's last `norm_fwd_l2.release_last_mib` MiB (every row where that is
/// unset). Only lines loaded that late can still be in L2 when the kernel ends (the earlier ones
/// have made room for later evict_last lines), and releasing the others costs time: on an H200
/// (2026-12-03, scripts/l2_policy_bench.cu, 16384 x 8192 bf16, three rounds) releasing every row
/// took 0.1304-0.1306 ms, the last 8192 rows (128 MiB) 0.1295-0.1296, the last 4096 (64 MiB)
/// 0.1289-0.1292, none 0.1287-0.1292; a 24 MB buffer read twice right after took 0.0069-0.0070
/// ms for its second read after each released form, 0.0093 after the unreleased one. In tefl
/// (`bench --backend nvidia --only "rmsnorm_fwd 16384"`, each form twice in turns): every row
/// released 0.132 / 0.132 ms, the last 64 MiB 0.131 / 0.130, none 0.130 / 0.130.
fn keep_l2(ctx: &KernelCtx<'_>, out_dtype: DType, x: &Tensor) -> Result<Option<usize>> {
    if out_dtype.is_fp8() {
        return Ok(None);
    }
    let row_bytes = x.last_dim() * x.dtype().size_in_bytes();
    Ok(tune::l2_keep(&*tune_table(ctx.device)?, "norm_fwd_l2", x.rows(), row_bytes))
}

/// Row config for `n` elements: the heuristic, or the autotuner's pick when asked for.
fn config(ctx: &KernelCtx<'_>, x: &Tensor, run: &dyn Fn(RowConfig) -> Result<()>) -> Result<RowConfig> {
    let (table, info) = (tune_table(ctx.device)?, info(ctx.device)?);
    Ok(tune::tuned_row_kernel(&table, "norm", &info, x.dtype(), x.last_dim(), |cfg| {
        tune::measure(ctx.device, &|| run(cfg))
    }))
}

#[allow(clippy::too_many_arguments)]
fn forward(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    x: &Tensor,
    gamma: &Tensor,
    beta: Option<&Tensor>,
    eps: f32,
    zc: bool,
    out_dtype: DType,
    qscale: Option<&Tensor>,
) -> Result<Forward> {
    let (rows, n) = (x.rows(), x.last_dim());
    let y = empty(ctx.device, x.shape(), out_dtype)?;
    let rsigma = empty(ctx.device, &[rows], DType::F32)?;
    let mu = empty(ctx.device, &[if beta.is_some() { rows } else { 0 }], DType::F32)?;
    // An FP8 output: the amax accumulator (zeroed) and scale_inv (written by block 0).
    let fp8 = match qscale.filter(|_| out_dtype.is_fp8()) {
        Some(_) => Some((zeros(ctx.device, &[1], DType::F32)?, empty(ctx.device, &[1], DType::F32)?)),
        None => None,
    };
    if rows == 0 || n == 0 {
        // No row writes scale_inv: it is still 1/scale.
        if let (Some(s), Some((_, si))) = (qscale, &fp8) {
            super::quantize::reciprocal(ctx, s, si)?;
        }
        return Ok(Forward { y, mu, rsigma, fp8 });
    }
    let types = Types { x: x.dtype(), g: gamma.dtype(), y: out_dtype, add: None };
    let release_from = keep_l2(ctx, out_dtype, x)?;
    let keep = release_from.is_some();
    let args = [
        Arg::Ptr(ptr(x)?),
        Arg::Ptr(ptr(gamma)?),
        Arg::Ptr(opt_ptr(beta)?),
        Arg::Ptr(ptr(&y)?),
        Arg::Ptr(ptr(&mu)?),
        Arg::Ptr(ptr(&rsigma)?),
        Arg::I32(i32_of(ctx, op, "x", rows)?),
        Arg::I32(i32_of(ctx, op, "x", n)?),
        Arg::F32(eps),
        Arg::Ptr(opt_ptr(qscale)?),
        Arg::Ptr(opt_ptr(fp8.as_ref().map(|f| &f.0))?),
        Arg::Ptr(opt_ptr(fp8.as_ref().map(|f| &f.1))?),
        Arg::I32(i32_of(ctx, op, "x", release_from.unwrap_or(rows))?),
    ];
    // An FP8 output reduces its amax once per block: a grid of a few waves of blocks that
    // stride over the rows, rather than a block per row, keeps that to a few thousand atomics.
    // On an H100 (2026-11-24, 16384x8192 bf16 to e4m3, 256-thread blocks) 64 blocks per SM
    // took 0.151 ms (90% of copy), 32 0.152, 16 0.154, 8 0.170, a block per row 0.155.
    // Any other output has a block per row, which `variant`'s ROW_PER_BLOCK relies on (its
    // blocks take no other row).
    let max_blocks = if fp8.is_some() { 64 * sm_count(ctx.device) } else { i32::MAX as u32 };
    let run = |cfg: RowConfig| -> Result<()> {
        let k = OnDevice::new(ctx.device, variant(op, &types, beta.is_some(), zc, cfg, Ring::NONE, keep)?)?;
        k.compile_ahead(|| backward_variants_of(ctx, x, gamma, beta.is_some(), zc, out_dtype));
        k.launch("norm_fwd", Grid::linear(blocks_for(rows, 1, max_blocks), cfg.block), &args)
    };
    // The autotuner's trial launches fold the same values into amax: a max, so no harm.
    let cfg = config(ctx, x, &run)?;
    run(cfg)?;
    Ok(Forward { y, mu, rsigma, fp8 })
}

/// A forward's outputs; `fp8` holds (amax, scale_inv) for an FP8 `y`.
struct Forward {
    y: Tensor,
    mu: Tensor,
    rsigma: Tensor,
    fp8: Option<(Tensor, Tensor)>,
}

/// The backward's row config and its ring of rows in shared memory for rows of `n` elements
/// of `x` and `dy`. The backward holds more per vector (x̂, d, two column sums): fewer vectors
/// a thread. The fused kernel keeps a ring of rows in shared memory where the tune configs ask
/// for one (16-byte vectors only: the copies are whole vectors), in blocks of the ring's own
/// vectors a thread when its row takes them (`norm_bwd.row_vecs`), else of the register
/// path's; `norm_bwd.threads_per_sm` threads an SM, a grid of one wave. Otherwise four blocks
/// an SM, each keeping its next row in registers.
fn backward_config(ctx: &KernelCtx<'_>, table: &TuneTable, x: DType, dy: DType, n: usize) -> Result<(RowConfig, Ring)> {
    let elem = x.size_in_bytes();
    let cfg = tune::row_kernel(table, "norm", n, elem, 2);
    if tune::norm_bwd_ring(table) == 0 {
        return Ok((cfg, Ring::NONE));
    }
    let threads = tune::norm_bwd_threads_per_sm(table);
    let stage_bytes = n * (elem + dy.size_in_bytes());
    let optin = info(ctx.device)?.shared_memory_per_block_optin;
    let ring_vecs = tune::norm_bwd_ring_vecs(table);
    let own = tune::row_kernel(table, "norm", n, elem, ring_vecs);
    for c in [own].into_iter().filter(|c| c.row_vecs <= ring_vecs).chain([cfg]) {
        let blocks_per_sm = tune::norm_bwd_blocks_per_sm(c.block, threads);
        let stages = if c.fused() && c.vec_bytes == 16 {
            tune::norm_bwd_stages(table, optin, stage_bytes, blocks_per_sm)
        } else {
            0
        };
        if stages > 0 {
            return Ok((c, Ring { stages, blocks_per_sm }));
        }
    }
    Ok((cfg, Ring::NONE))
}

/// The backward variants a forward's output implies (dy of y's dtype; without a residual add,
/// and for RMSNorm with one of x's dtype, `rmsnorm_bwd_add`): the forward compiles them ahead
/// on its first call. None for an FP8 output, whose gradient comes in another dtype.
fn backward_variants_of(
    ctx: &KernelCtx<'_>,
    x: &Tensor,
    gamma: &Tensor,
    is_ln: bool,
    zc: bool,
    y: DType,
) -> Result<Vec<Variant>> {
    if y.is_fp8() {
        return Ok(Vec::new());
    }
    let (cfg, ring) = backward_config(ctx, &*tune_table(ctx.device)?, x.dtype(), y, x.last_dim())?;
    let adds: &[Option<DType>] = if is_ln { &[None] } else { &[None, Some(x.dtype())] };
    adds.iter()
        .map(|&add| {
            let types = Types { x: x.dtype(), g: gamma.dtype(), y, add };
            variant("norm_bwd", &types, is_ln, zc, cfg, ring, false)
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn backward(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    dy: &Tensor,
    x: &Tensor,
    mu: Option<&Tensor>,
    rsigma: &Tensor,
    gamma: &Tensor,
    add: Option<&Tensor>,
    zc: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let (rows, n) = (x.rows(), x.last_dim());
    let is_ln = mu.is_some();
    let dx = empty(ctx.device, x.shape(), x.dtype())?;
    if rows == 0 || n == 0 {
        // No rows: the sums over them are zeros, and no kernel runs (the fused kernel's
        // variant writes its partial sums whatever the row count).
        let dgamma = zeros(ctx.device, gamma.shape(), gamma.dtype())?;
        let dbeta = if is_ln { Some(zeros(ctx.device, gamma.shape(), gamma.dtype())?) } else { None };
        return Ok((dx, dgamma, dbeta));
    }
    let dgamma = empty(ctx.device, gamma.shape(), gamma.dtype())?;
    let dbeta = if is_ln { Some(empty(ctx.device, gamma.shape(), gamma.dtype())?) } else { None };
    let types = Types { x: x.dtype(), g: gamma.dtype(), y: dy.dtype(), add: add.map(Tensor::dtype) };
    let table = tune_table(ctx.device)?;
    let elem = x.dtype().size_in_bytes();
    let (cfg, ring) = backward_config(ctx, &table, x.dtype(), dy.dtype(), n)?;
    let (rows_i, n_i) = (i32_of(ctx, op, "x", rows)?, i32_of(ctx, op, "x", n)?);
    let col_grid = Grid::linear(n.div_ceil(256) as u32, 256);
    let stage_bytes = n * (elem + dy.dtype().size_in_bytes());
    // Fused: a grid of `parts` blocks sums dgamma/dbeta per block into ws, reduced after.
    // Otherwise one block per row computes dx and a column kernel the sums.
    let fused = cfg.row_vecs > 0;
    let k = OnDevice::new(ctx.device, variant(op, &types, is_ln, zc, cfg, ring, false)?)?;
    let smem = ring.stages as usize * stage_bytes;
    let parts = match (fused, ring.stages) {
        (true, 0) => blocks_for(rows, 1, 4 * sm_count(ctx.device)),
        (true, _) => blocks_for(rows, 1, ring.blocks_per_sm * sm_count(ctx.device)),
        (false, _) => blocks_for(rows, 1, i32::MAX as u32),
    };
    let (ws, flags) = if fused {
        (
            Some(empty(ctx.device, &[if is_ln { 2 } else { 1 }, parts as usize, n], DType::F32)?),
            Some(empty(ctx.device, &[parts as usize], DType::I64)?),
        )
    } else {
        (None, None)
    };
    let args = |epoch: u64| -> Result<Vec<Arg>> {
        Ok(vec![
            Arg::Ptr(ptr(dy)?),
            Arg::Ptr(ptr(x)?),
            Arg::Ptr(opt_ptr(mu)?),
            Arg::Ptr(ptr(rsigma)?),
            Arg::Ptr(ptr(gamma)?),
            Arg::Ptr(opt_ptr(add)?),
            Arg::Ptr(ptr(&dx)?),
            Arg::Ptr(opt_ptr(ws.as_ref())?),
            Arg::I32(rows_i),
            Arg::I32(n_i),
            Arg::Ptr(opt_ptr(flags.as_ref())?),
            Arg::U64(epoch),
            Arg::Ptr(ptr(&dgamma)?),
            Arg::Ptr(opt_ptr(dbeta.as_ref())?),
        ])
    };
    // The fused kernel sums the blocks' partials itself in a cooperative launch (its slices
    // take 2 * block floats of shared memory after the ring); else the reduction's own launch.
    let grid = Grid { smem: smem as u32, ..Grid::linear(parts, cfg.block) };
    if fused {
        let coop = Grid { smem: smem.max(2 * cfg.block as usize * 4) as u32, ..grid };
        if k.launch_cooperative("norm_bwd", coop, &args(next_epoch())?)? {
            return Ok((dx, dgamma, dbeta));
        }
    }
    k.launch("norm_bwd", grid, &args(0)?)?;
    match &ws {
        // `norm_reduce_ws`: RED_COLS (32) columns a block of RED_COLS x RED_SLICES (8) threads.
        Some(ws) => k.launch(
            "norm_reduce_ws",
            Grid::linear(n.div_ceil(32) as u32, 32 * 8),
            &[
                Arg::Ptr(ptr(ws)?),
                Arg::Ptr(ptr(&dgamma)?),
                Arg::Ptr(opt_ptr(dbeta.as_ref())?),
                Arg::I32(parts as i32),
                Arg::I32(n_i),
            ],
        )?,
        None => k.launch(
            "norm_bwd_cols",
            col_grid,
            &[
                Arg::Ptr(ptr(dy)?),
                Arg::Ptr(ptr(x)?),
                Arg::Ptr(opt_ptr(mu)?),
                Arg::Ptr(ptr(rsigma)?),
                Arg::Ptr(ptr(&dgamma)?),
                Arg::Ptr(opt_ptr(dbeta.as_ref())?),
                Arg::I32(rows_i),
                Arg::I32(n_i),
            ],
        )?,
    }
    Ok((dx, dgamma, dbeta))
}

/// A norm forward's warm-up (`tefl_core::Manager::warmup`): starts compiling, on other
/// threads, the forward a call with these arguments launches (its row config as the call
/// would pick it, timing nothing) and the backward variants the forward's first call compiles
/// ahead, launching nothing.
fn warmup_forward(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    x: &Tensor,
    gamma: &Tensor,
    is_ln: bool,
    zc: bool,
    out_dtype: DType,
) -> Result<()> {
    if x.rows() == 0 || x.last_dim() == 0 {
        return Ok(());
    }
    let types = Types { x: x.dtype(), g: gamma.dtype(), y: out_dtype, add: None };
    let keep = keep_l2(ctx, out_dtype, x)?.is_some();
    let (table, info) = (tune_table(ctx.device)?, info(ctx.device)?);
    let cfg = tune::row_kernel_ahead(&table, "norm", &info, x.dtype(), x.last_dim());
    let target = crate::target::target_of(ctx.device)?;
    target.compile_ahead(ctx.device, &variant(op, &types, is_ln, zc, cfg, Ring::NONE, keep)?);
    for v in backward_variants_of(ctx, x, gamma, is_ln, zc, out_dtype)? {
        target.compile_ahead(ctx.device, &v);
    }
    Ok(())
}

/// `rmsnorm_fwd`'s warm-up (see `warmup_forward`).
pub fn warmup_rmsnorm_fwd(ctx: &KernelCtx<'_>, a: &RmsNormFwdArgs) -> Result<()> {
    warmup_forward("rmsnorm_fwd", ctx, &a.x, &a.gamma, false, a.zero_centered_gamma, a.out_dtype)
}

/// `layernorm_fwd`'s warm-up (see `warmup_forward`).
pub fn warmup_layernorm_fwd(ctx: &KernelCtx<'_>, a: &LayerNormFwdArgs) -> Result<()> {
    warmup_forward("layernorm_fwd", ctx, &a.x, &a.gamma, true, a.zero_centered_gamma, a.out_dtype)
}

/// The catalogue op `rmsnorm_fwd` on a GPU through the portable kernels of `simt/norm.cu` (every SIMT backend's impl).
pub fn rmsnorm_fwd(ctx: &KernelCtx<'_>, a: &RmsNormFwdArgs) -> Result<RmsNormFwdOut> {
    let f =
        forward("rmsnorm_fwd", ctx, &a.x, &a.gamma, None, a.eps, a.zero_centered_gamma, a.out_dtype, a.scale.as_ref())?;
    let (amax, scale_inv) = f.fp8.unzip();
    Ok(RmsNormFwdOut { y: f.y, rsigma: f.rsigma, amax, scale_inv })
}

/// The catalogue op `layernorm_fwd` on a GPU through the portable kernels of `simt/norm.cu` (every SIMT backend's impl).
pub fn layernorm_fwd(ctx: &KernelCtx<'_>, a: &LayerNormFwdArgs) -> Result<LayerNormFwdOut> {
    let f = forward(
        "layernorm_fwd",
        ctx,
        &a.x,
        &a.gamma,
        Some(&a.beta),
        a.eps,
        a.zero_centered_gamma,
        a.out_dtype,
        a.scale.as_ref(),
    )?;
    let (amax, scale_inv) = f.fp8.unzip();
    Ok(LayerNormFwdOut { y: f.y, mu: f.mu, rsigma: f.rsigma, amax, scale_inv })
}

/// The epoch of a cooperative `norm_bwd` launch: a value no earlier launch of this process
/// used, so that a flag buffer's earlier contents cannot pass for a flag raised in this one
/// (epochs step by 2 from a random odd start: never 0, which tells the kernel to leave the
/// sums to `norm_reduce_ws`, and data of another kind equals one by a 2^-63 chance).
fn next_epoch() -> u64 {
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU64::new(std::collections::hash_map::RandomState::new().build_hasher().finish() | 1))
        .fetch_add(2, Ordering::Relaxed)
}

/// The catalogue op `rmsnorm_bwd` on a GPU through the portable kernels of `simt/norm.cu` (every SIMT backend's impl).
pub fn rmsnorm_bwd(ctx: &KernelCtx<'_>, a: &RmsNormBwdArgs) -> Result<RmsNormBwdOut> {
    let (dx, dgamma, _) =
        backward("rmsnorm_bwd", ctx, &a.dy, &a.x, None, &a.rsigma, &a.gamma, None, a.zero_centered_gamma)?;
    Ok(RmsNormBwdOut { dx, dgamma })
}

/// The catalogue op `rmsnorm_bwd_add` on a GPU through the portable kernels of `simt/norm.cu` (every SIMT backend's impl).
pub fn rmsnorm_bwd_add(ctx: &KernelCtx<'_>, a: &RmsNormBwdAddArgs) -> Result<RmsNormBwdAddOut> {
    let (dx, dgamma, _) =
        backward("rmsnorm_bwd_add", ctx, &a.dy, &a.x, None, &a.rsigma, &a.gamma, Some(&a.add), a.zero_centered_gamma)?;
    Ok(RmsNormBwdAddOut { dx, dgamma })
}

/// The catalogue op `layernorm_bwd` on a GPU through the portable kernels of `simt/norm.cu` (every SIMT backend's impl).
pub fn layernorm_bwd(ctx: &KernelCtx<'_>, a: &LayerNormBwdArgs) -> Result<LayerNormBwdOut> {
    let (dx, dgamma, dbeta) =
        backward("layernorm_bwd", ctx, &a.dy, &a.x, Some(&a.mu), &a.rsigma, &a.gamma, None, a.zero_centered_gamma)?;
    let dbeta = dbeta.ok_or_else(|| tefl_core::Error::Tensor("layernorm_bwd: no dbeta".into()))?;
    Ok(LayerNormBwdOut { dx, dgamma, dbeta })
}

/// Variants covering every code path (the NVRTC compile test).
pub fn variants() -> Vec<Variant> {
    use DType::{BF16, F8E4M3, F8E5M2, F16, F32};
    let mut v = Vec::new();
    // (the last field: zero-centred gamma, on for half of them)
    for (x, g, y, add, ln, zc) in [
        (BF16, BF16, BF16, BF16, false, false),
        (F16, F32, F16, F16, true, true),
        (F32, F32, BF16, F32, false, true),
        (F32, BF16, F32, F32, true, false),
    ] {
        let types = Types { x, g, y, add: (!ln).then_some(add) };
        for cfg in [RowConfig { block: 256, vec_bytes: 16, row_vecs: 4 }, RowConfig::two_pass(256)] {
            v.extend(variant("norm", &types, ln, zc, cfg, Ring::NONE, false));
        }
        // The backward's ring of rows in shared memory: blocks of 512, two an SM and one (the
        // latter with twice the registers a thread), and of 1024.
        for (block, row_vecs, blocks_per_sm) in [(512, 2, 2), (512, 2, 1), (1024, 1, 1)] {
            let cfg = RowConfig { block, vec_bytes: 16, row_vecs };
            v.extend(variant("norm", &types, ln, zc, cfg, Ring { stages: 3, blocks_per_sm }, false));
        }
    }
    // The forwards holding their rows in L2 (RMSNorm and LayerNorm, 16-bit and f32 rows).
    for (x, y, ln) in [(BF16, BF16, false), (F32, F32, false), (BF16, BF16, true), (F32, F32, true)] {
        let types = Types { x, g: x, y, add: None };
        v.extend(variant(
            "norm",
            &types,
            ln,
            false,
            RowConfig { block: 256, vec_bytes: 16, row_vecs: 4 },
            Ring::NONE,
            true,
        ));
    }
    // The FP8 outputs (forward only: both formats, both norms, both paths).
    for (x, y, ln) in [(BF16, F8E4M3, false), (F32, F8E5M2, true), (F16, F8E4M3, true)] {
        let types = Types { x, g: x, y, add: None };
        for cfg in [RowConfig { block: 256, vec_bytes: 16, row_vecs: 4 }, RowConfig::two_pass(256)] {
            v.extend(variant("norm", &types, ln, ln, cfg, Ring::NONE, false));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::next_epoch;

    /// Epochs are never 0 (the kernel's "no cooperative sums") and never repeat within a
    /// process, from any thread.
    #[test]
    fn epochs_are_nonzero_and_distinct() {
        let mut seen: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4).map(|_| s.spawn(|| (0..1000).map(|_| next_epoch()).collect::<Vec<_>>())).collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        assert!(seen.iter().all(|&e| e != 0 && e % 2 == 1));
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 4000);
    }
}
