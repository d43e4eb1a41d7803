//! FP8 per-tensor scaling on CUDA: quantize (with amax and scale_inv in the same pass, and
//! an optional transpose), dequantize, amax, transpose of codes and the delayed-scaling update.

use tefl_core::catalogue::*;
use tefl_core::fp8::Fp8Format;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};

use crate::{Defines, Variant};

use super::host::{Arg, Grid, OnDevice, blocks_for, cty, empty, i32_of, opt_ptr, ptr, sm_count, zeros};

const BLOCK: u32 = 256;
/// The transpose's tile edge (`TILE` in `simt/quantize.cu`).
const TILE: usize = 32;
/// `cast_transpose_vec`'s tile edge (`VT`) and block (256 threads).
const VEC_TILE: usize = 64;
/// `cast_transpose_8x8`'s tile (`T8_ROWS` x `T8_COLS`; a block of 256 threads, 8 x 8 elements each).
const T8_TILE: (usize, usize) = (128, 128);

/// The cast-transposes' grid: about this many blocks an SM, each striding over the row tiles of
/// its column tile. Fewer, longer blocks beat a block a tile: on an H200 (16384 x 8192 bf16 ->
/// e4m3, `cast_transpose_8x8` at 48 registers, 2026-12-06) 16 an SM took 0.158-0.159 ms, 10 an
/// SM 0.163-0.164 and a block a tile 0.177-0.178. At the kernel's 56 registers 24 beat 16 on
/// three H100s (2026-12-07, in turns: 0.199-0.200 against 0.202-0.203, 0.203-0.204 against
/// 0.208-0.209, and 0.7-1.3% in an earlier session); 32 and 48 an SM tied it, a block a tile was
/// about 1% slower than 32; not timed on an H200 since. The performance log has the runs.
const CT_BLOCKS_PER_SM: usize = 24;

/// `defines` with the FP8 format's parameters for the prelude's `fp8_encode` / `fp8_decode`
/// (MANT, BIAS, MAXV, MAXCODE): every kernel that casts to or from FP8 takes them.
pub(crate) fn fp8_format(op: &'static str, defines: Defines, fp8: DType) -> Result<Defines> {
    let f = Fp8Format::of(fp8).ok_or_else(|| Error::invalid(op, "fp8_dtype", format!("{fp8} is not an fp8 dtype")))?;
    Ok(defines
        .set("MANT", f.mantissa_bits())
        .set("BIAS", f.bias())
        .set("MAXV", format!("{:.1}f", f.max()))
        .set("MAXCODE", f.max_code()))
}

/// The variant of `simt/quantize.cu` for a float dtype and an FP8 format (launches and the
/// compile test).
fn variant(op: &'static str, float: DType, fp8: DType) -> Result<Variant> {
    let defines = fp8_format(op, Defines::new().set("TX", cty(op, "x", float)?), fp8)?.set("BLOCK", BLOCK);
    let entries = &[
        "quantize",
        "compute_amax",
        "dequantize",
        "transpose_u8",
        "cast_transpose",
        "cast_transpose_vec",
        "cast_transpose_8x8",
        "colsum_ws",
        "delayed_scaling",
    ];
    Ok(Variant::new(&tefl_kernels::QUANTIZE, entries, defines))
}

fn kernel(op: &'static str, ctx: &KernelCtx<'_>, float: DType, fp8: DType) -> Result<OnDevice> {
    OnDevice::new(ctx.device, variant(op, float, fp8)?)
}

fn grid(ctx: &KernelCtx<'_>, n: usize) -> Grid {
    Grid::linear(blocks_for(n, BLOCK as usize, sm_count(ctx.device) * 8), BLOCK)
}

/// The elementwise kernels' (quantize, compute_amax, dequantize) launch over `n` elements of
/// a float tensor of `float` dtype: its grid and whether the vector path takes it (`vec`:
/// 16-byte steps of the float tensor, two a thread an iteration; tensors start 16-byte
/// aligned).
fn elementwise(ctx: &KernelCtx<'_>, n: usize, float: DType) -> (Grid, Arg) {
    let nv = 16 / float.size_in_bytes();
    if n.is_multiple_of(nv) { (grid(ctx, (n / nv).div_ceil(2)), Arg::I32(1)) } else { (grid(ctx, n), Arg::I32(0)) }
}

fn transpose(ctx: &KernelCtx<'_>, k: &OnDevice, op: &'static str, q: &Tensor) -> Result<Tensor> {
    let (m, n) = (q.shape()[0], q.shape()[1]);
    let qt = empty(q.device(), &[n, m], q.dtype())?;
    k.launch(
        "transpose_u8",
        Grid { blocks: (n.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, 1), threads: (TILE as u32, 8, 1), smem: 0 },
        &[
            Arg::Ptr(ptr(q)?),
            Arg::Ptr(ptr(&qt)?),
            Arg::I32(i32_of(ctx, op, "q", m)?),
            Arg::I32(i32_of(ctx, op, "q", n)?),
        ],
    )?;
    Ok(qt)
}

/// The fused cast + transpose (+ column sums) of a 2-D `x`: (q, q_t when `transpose`, amax,
/// scale_inv, dbias when `dbias`), one read of x.
struct CastTranspose {
    q: Tensor,
    q_t: Option<Tensor>,
    amax: Tensor,
    scale_inv: Tensor,
    dbias: Option<Tensor>,
}

fn cast_transpose(
    ctx: &KernelCtx<'_>,
    op: &'static str,
    x: &Tensor,
    scale: &Tensor,
    fp8: DType,
    transpose: bool,
    dbias: bool,
) -> Result<CastTranspose> {
    let k = kernel(op, ctx, x.dtype(), fp8)?;
    let (m, n) = (x.shape()[0], x.shape()[1]);
    let dev = ctx.device;
    let q = empty(dev, &[m, n], fp8)?;
    let q_t = if transpose { Some(empty(dev, &[n, m], fp8)?) } else { None };
    let amax = zeros(dev, &[1], DType::F32)?;
    let scale_inv = empty(dev, &[1], DType::F32)?;
    // m and n multiples of 8 take the register transpose (128 x 128 tiles, 8 x 8 elements a
    // thread), other rows of whole 16-byte vectors the vector kernel (64 x 64 tiles through
    // shared memory, 256 threads in a line), the rest the scalar one (32 x 32 tiles, 32 x 8
    // threads).
    let vec = n.is_multiple_of(16 / x.dtype().size_in_bytes());
    let (entry, (tile_rows, tile_cols), threads) = if m.is_multiple_of(8) && n.is_multiple_of(8) {
        ("cast_transpose_8x8", T8_TILE, (256, 1, 1))
    } else if vec {
        ("cast_transpose_vec", (VEC_TILE, VEC_TILE), (256, 1, 1))
    } else {
        ("cast_transpose", (TILE, TILE), (TILE as u32, 8, 1))
    };
    let col_tiles = n.div_ceil(tile_cols);
    // About CT_BLOCKS_PER_SM blocks an SM, each striding over the row tiles.
    let row_blocks =
        m.div_ceil(tile_rows).clamp(1, (sm_count(dev) as usize * CT_BLOCKS_PER_SM).div_ceil(col_tiles.max(1)).max(1));
    let ws = if dbias { Some(empty(dev, &[row_blocks, n], DType::F32)?) } else { None };
    // No rows: the column sums are zero.
    let out = if m == 0 {
        zeros(dev, &[if dbias { n } else { 0 }], x.dtype())?
    } else {
        empty(dev, &[if dbias { n } else { 0 }], x.dtype())?
    };
    if m == 0 || n == 0 {
        reciprocal(ctx, scale, &scale_inv)?;
    } else {
        k.launch(
            entry,
            Grid { blocks: (u32::try_from(col_tiles).unwrap_or(u32::MAX), row_blocks as u32, 1), threads, smem: 0 },
            &[
                Arg::Ptr(ptr(x)?),
                Arg::Ptr(ptr(scale)?),
                Arg::Ptr(ptr(&q)?),
                Arg::Ptr(opt_ptr(q_t.as_ref())?),
                Arg::Ptr(ptr(&amax)?),
                Arg::Ptr(ptr(&scale_inv)?),
                Arg::Ptr(opt_ptr(ws.as_ref())?),
                Arg::I32(i32_of(ctx, op, "x", m)?),
                Arg::I32(i32_of(ctx, op, "x", n)?),
            ],
        )?;
        if let Some(ws) = &ws {
            k.launch(
                "colsum_ws",
                Grid::linear(n.div_ceil(256) as u32, 256),
                &[Arg::Ptr(ptr(ws)?), Arg::Ptr(ptr(&out)?), Arg::I32(row_blocks as i32), Arg::I32(n as i32)],
            )?;
        }
    }
    Ok(CastTranspose { q, q_t, amax, scale_inv, dbias: dbias.then_some(out) })
}

/// The catalogue op `bgrad_quantize` on a GPU through the portable kernels of `simt/quantize.cu` (every SIMT backend's impl).
pub fn bgrad_quantize(ctx: &KernelCtx<'_>, a: &BgradQuantizeArgs) -> Result<BgradQuantizeOut> {
    let c = cast_transpose(ctx, "bgrad_quantize", &a.x, &a.scale, a.fp8_dtype, a.want_transpose, true)?;
    let dbias = c.dbias.ok_or_else(|| Error::Tensor("bgrad_quantize: no dbias".into()))?;
    Ok(BgradQuantizeOut { dbias, q: c.q, q_t: c.q_t, amax: c.amax, scale_inv: c.scale_inv })
}

/// The catalogue op `quantize` on a GPU through the portable kernels of `simt/quantize.cu` (every SIMT backend's impl).
pub fn quantize(ctx: &KernelCtx<'_>, a: &QuantizeArgs) -> Result<QuantizeOut> {
    const OP: &str = "quantize";
    if a.want_transpose {
        // TE's fused cast + transpose: both orientations and the amax from one read of x.
        let c = cast_transpose(ctx, OP, &a.x, &a.scale, a.fp8_dtype, true, false)?;
        return Ok(QuantizeOut { q: c.q, q_t: c.q_t, amax: c.amax, scale_inv: c.scale_inv });
    }
    let k = kernel(OP, ctx, a.x.dtype(), a.fp8_dtype)?;
    let n = a.x.numel();
    let q = empty(ctx.device, a.x.shape(), a.fp8_dtype)?;
    let amax = zeros(ctx.device, &[1], DType::F32)?;
    let scale_inv = empty(ctx.device, &[1], DType::F32)?;
    let (grid, vec) = elementwise(ctx, n, a.x.dtype());
    k.launch(
        "quantize",
        grid,
        &[
            Arg::Ptr(ptr(&a.x)?),
            Arg::Ptr(ptr(&a.scale)?),
            Arg::Ptr(ptr(&q)?),
            Arg::Ptr(ptr(&amax)?),
            Arg::Ptr(ptr(&scale_inv)?),
            Arg::U64(n as u64),
            vec,
        ],
    )?;
    Ok(QuantizeOut { q, q_t: None, amax, scale_inv })
}

/// Writes 1/scale into `scale_inv` (both f32 `[1]` on the device): the quantize kernel over no
/// elements, for an FP8 output of an op with nothing to quantize.
pub(crate) fn reciprocal(ctx: &KernelCtx<'_>, scale: &Tensor, scale_inv: &Tensor) -> Result<()> {
    let k = kernel(ctx.op, ctx, DType::F32, DType::F8E4M3)?;
    k.launch(
        "quantize",
        Grid::linear(1, BLOCK),
        &[
            Arg::Ptr(0),
            Arg::Ptr(ptr(scale)?),
            Arg::Ptr(0),
            Arg::Ptr(0),
            Arg::Ptr(ptr(scale_inv)?),
            Arg::U64(0),
            Arg::I32(0),
        ],
    )
}

/// The catalogue op `dequantize` on a GPU through the portable kernels of `simt/quantize.cu` (every SIMT backend's impl).
pub fn dequantize(ctx: &KernelCtx<'_>, a: &DequantizeArgs) -> Result<DequantizeOut> {
    let k = kernel("dequantize", ctx, a.out_dtype, a.q.dtype())?;
    let n = a.q.numel();
    let y = empty(ctx.device, a.q.shape(), a.out_dtype)?;
    let (grid, vec) = elementwise(ctx, n, a.out_dtype);
    k.launch(
        "dequantize",
        grid,
        &[Arg::Ptr(ptr(&a.q)?), Arg::Ptr(ptr(&a.scale_inv)?), Arg::Ptr(ptr(&y)?), Arg::U64(n as u64), vec],
    )?;
    Ok(DequantizeOut { y })
}

/// The catalogue op `compute_amax` on a GPU through the portable kernels of `simt/quantize.cu` (every SIMT backend's impl).
pub fn compute_amax(ctx: &KernelCtx<'_>, a: &ComputeAmaxArgs) -> Result<ComputeAmaxOut> {
    let k = kernel("compute_amax", ctx, a.x.dtype(), DType::F8E4M3)?;
    let n = a.x.numel();
    let amax = zeros(ctx.device, &[1], DType::F32)?;
    let (grid, vec) = elementwise(ctx, n, a.x.dtype());
    k.launch("compute_amax", grid, &[Arg::Ptr(ptr(&a.x)?), Arg::Ptr(ptr(&amax)?), Arg::U64(n as u64), vec])?;
    Ok(ComputeAmaxOut { amax })
}

/// The transpose `[n, m]` of FP8 codes `[m, n]` (TN operands for the FP8 GEMMs).
pub fn transpose_codes(ctx: &KernelCtx<'_>, q: &Tensor) -> Result<Tensor> {
    let k = kernel(ctx.op, ctx, DType::F32, q.dtype())?;
    transpose(ctx, &k, ctx.op, q)
}

/// The catalogue op `fp8_transpose` on a GPU through the portable kernels of `simt/quantize.cu` (every SIMT backend's impl).
pub fn fp8_transpose(ctx: &KernelCtx<'_>, a: &Fp8TransposeArgs) -> Result<Fp8TransposeOut> {
    let k = kernel("fp8_transpose", ctx, DType::F32, a.q.dtype())?;
    Ok(Fp8TransposeOut { q_t: transpose(ctx, &k, "fp8_transpose", &a.q)? })
}

/// The catalogue op `delayed_scaling` on a GPU through the portable kernels of `simt/quantize.cu` (every SIMT backend's impl).
pub fn delayed_scaling(ctx: &KernelCtx<'_>, a: &DelayedScalingArgs) -> Result<DelayedScalingOut> {
    const OP: &str = "fused_amax_and_scale_update_after_reduction";
    let k = kernel(OP, ctx, DType::F32, DType::F8E4M3)?;
    let (hist, n) = (a.amax_history.shape()[0], a.amax_history.shape()[1]);
    k.launch(
        "delayed_scaling",
        Grid::linear(n.div_ceil(128) as u32, 128),
        &[
            Arg::Ptr(ptr(&a.amax_history)?),
            Arg::Ptr(ptr(&a.scale)?),
            Arg::Ptr(ptr(&a.scale_inv)?),
            Arg::I32(i32_of(ctx, OP, "amax_history", hist)?),
            Arg::I32(i32_of(ctx, OP, "amax_history", n)?),
            Arg::F32(a.fp8_max),
            Arg::F32(a.margin),
            Arg::I32(i32::from(matches!(a.algo, AmaxAlgo::Max))),
        ],
    )?;
    Ok(DelayedScalingOut {})
}

/// Variants covering every code path (the NVRTC compile test).
pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for t in [DType::F32, DType::F16, DType::BF16] {
        for fp8 in [DType::F8E4M3, DType::F8E5M2] {
            v.extend(variant("quantize", t, fp8));
        }
    }
    v
}
