//! Flash attention on CUDA (`attention.cu`): forward and backward, every layout, mask, GQA
//! and window option, dropout from the reference's Philox stream. Tensor-core MMA for
//! f16/bf16, the same tiling with f32 FMAs for f32.

use tefl_core::catalogue::*;
use tefl_core::{DType, Device, Error, KernelCtx, Result, Tensor};

use tefl_gpu::Variant;
use tefl_gpu::simt::attention::AttnBuild;

use crate::launch::{Arg, Grid, OnDevice, blocks_for, empty, info, opt_ptr, ptr, sm_count, tune_table, zeros};

/// Which kernels of `cuda/attention/attention.cu` a variant holds (`ATTN_FWD`, `ATTN_DKDV`,
/// `ATTN_DQ`): each part is compiled alone, so that a forward's first call compiles no
/// backward kernel and starts the backward's compile on another thread, to overlap the
/// forward's work (on a fresh H200 the whole source took 1.5 s to compile for f32,
/// 2026-11-30), and the usual backward does not wait for the deterministic dQ pass's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// `attn_fwd`.
    Fwd,
    /// `attn_bwd_dkdv`, the backward's tiles.
    Dkdv,
    /// `attn_bwd_dq`, the deterministic backward's dQ pass.
    Dq,
    /// The small kernels every path shares (also the Hopper kernels'): Σ dO·O with the dQ
    /// accumulator's zeros, dQ's conversion, the fill of thd's lse rows, and for thd lengths
    /// left on the device their clamp and the fill of the rows past the last sequence.
    Aux,
}

impl Part {
    /// The entry points the ops launch from the part.
    fn entries(self) -> &'static [&'static str] {
        match self {
            Part::Fwd => &["attn_fwd"],
            Part::Dkdv => &["attn_bwd_dkdv"],
            Part::Dq => &["attn_bwd_dq"],
            Part::Aux => &["attn_bwd_delta", "attn_bwd_dq_out", "fill_f32", "attn_cu_clamp", "attn_thd_tail"],
        }
    }
}

/// Lanes of the warps the tensor-core tiles are laid out for (the kernels assert it).
const MMA_WARP: usize = 32;

/// Queries per forward block (4 warps): 128 on tensor cores (32 per warp), 64 for f32 and for
/// head dims over 128 (whose 32-row accumulators would not fit in registers).
fn fwd_br(dtype: DType, dp: usize) -> usize {
    if dtype == DType::F32 || dp > 128 { 64 } else { 128 }
}

/// Keys per forward tile (`FWD_BC`): 64, or 32 for f32 head dims over 128 (shared memory).
fn fwd_bc(dtype: DType, dp: usize) -> usize {
    if dtype == DType::F32 && dp > 128 { 32 } else { 64 }
}

/// Keys per dK/dV block (`DKV_KB`, a dV and a dK warp per 32): 128 for 16-bit tiles of head
/// dim up to 128 (fewer query-tile loads and dQ atomics per key), else 64 (shared memory).
fn dkv_keys(dtype: DType, dp: usize) -> usize {
    if dtype != DType::F32 && dp <= 128 { 128 } else { 64 }
}

/// Queries per dK/dV tile (`DKV_BR`): 64, or 32 for f32 head dims over 128 (shared memory).
fn dkv_rows(dtype: DType, dp: usize) -> usize {
    if dtype == DType::F32 && dp > 128 { 32 } else { 64 }
}

/// m-tiles of 16 keys per dK/dV warp (`DKV_MT`): 2 (every Q and dO fragment serves 32 keys),
/// or 1 for head dims over 128, whose 32-key accumulators would not fit in registers.
fn dkv_mtiles(dp: usize) -> usize {
    if dp > 128 { 1 } else { 2 }
}

/// The most shared memory a block can have on the device (its opt-in limit).
fn smem_limit(ctx: &KernelCtx<'_>) -> Result<usize> {
    Ok(info(ctx.device)?.shared_memory_per_block_optin.max(48 * 1024))
}

/// Checks a kernel's shared memory against the device's opt-in per-block limit.
fn check_smem(op: &'static str, ctx: &KernelCtx<'_>, bytes: usize) -> Result<u32> {
    let limit = smem_limit(ctx)?;
    if bytes > limit {
        return Err(crate::launch::unsupported(
            op,
            format!("this head dim and dtype need {bytes} bytes of shared memory per block; the device has {limit}"),
        ));
    }
    Ok(bytes as u32)
}

/// The variant of `attention.cu` for a call's build, the forward's minimum resident blocks and
/// a part: the one place its defines are made (launches and the compile test both call it).
fn variant(op: &'static str, b: &AttnBuild, fwd_min_blocks: u32, part: Part) -> Result<Variant> {
    let dp = padded(b.d);
    let defines = b
        .defines(op)?
        .set("DP", dp)
        .set("FWD_BR", fwd_br(b.dtype, dp))
        .set("FWD_BC", fwd_bc(b.dtype, dp))
        .flag("HALF", b.dtype != DType::F32)
        .set("FWD_MIN_BLOCKS", fwd_min_blocks)
        .set("DKV_KB", dkv_keys(b.dtype, dp))
        .set("DKV_BR", dkv_rows(b.dtype, dp))
        .set("DKV_MT", dkv_mtiles(dp))
        .flag("ATTN_FWD", part == Part::Fwd)
        .flag("ATTN_DKDV", part == Part::Dkdv)
        .flag("ATTN_DQ", part == Part::Dq);
    Ok(Variant::new(&tefl_kernels::ATTENTION_CUDA, part.entries(), defines))
}

/// One call's geometry and the variants it launches.
struct Plan {
    op: &'static str,
    device: Device,
    g: AttnGeometry,
    build: AttnBuild,
    dp: usize,
    fwd_min_blocks: u32,
}

impl Plan {
    /// The variant of one part of `attention.cu` for this call.
    fn variant(&self, part: Part) -> Result<Variant> {
        variant(self.op, &self.build, self.fwd_min_blocks, part)
    }

    /// One part of `attention.cu` for this call, on its device.
    fn kernel(&self, part: Part) -> Result<OnDevice> {
        Ok(OnDevice::new(self.device, self.variant(part)?))
    }

    /// The grid of the tiled kernels: a block of `threads` per `tile` of `rows` positions, per
    /// head (of `heads`) and sequence.
    fn tile_grid(&self, rows: usize, tile: usize, heads: usize, threads: u32, smem: u32) -> Grid {
        Grid {
            blocks: (rows.div_ceil(tile).max(1) as u32, heads as u32, self.g.batch as u32),
            threads: (threads, 1, 1),
            smem,
        }
    }
}

fn padded(d: usize) -> usize {
    d.div_ceil(16) * 16
}

/// The call's geometry and build, for the forward's or the backward's arguments (`call`: their
/// shared part).
fn setup(op: &'static str, ctx: &KernelCtx<'_>, call: &AttnQkv<'_>) -> Result<Plan> {
    // thd lengths may stay on the device (both bounds given): every kernel here reads them
    // through `on_device_lengths`' clamped copies, so none leaves q, k or v whatever they hold.
    let bounds = (call.max, true);
    let (g, build) = AttnBuild::checked(op, ctx, call, 256, "the CUDA kernels", bounds)?;
    let dp = padded(g.d);
    let fwd_min_blocks = crate::heuristics::attention_fwd_min_blocks(&*tune_table(ctx.device)?);
    Ok(Plan { op, device: ctx.device, g, build, dp, fwd_min_blocks })
}

fn fill(s: &Plan, ctx: &KernelCtx<'_>, t: &Tensor, v: f32) -> Result<()> {
    let n = t.numel();
    s.kernel(Part::Aux)?.launch(
        "fill_f32",
        Grid::linear(blocks_for(n, 256, sm_count(ctx.device) * 8), 256),
        &[Arg::Ptr(ptr(t)?), Arg::U64(n as u64), Arg::F32(v)],
    )
}

/// A thd call whose lengths tefl did not read on the host (`AttnGeometry::spans_on_device`):
/// the call's small-kernel part and `attn_cu_clamp`'s copies of its cu_seqlens (each entry
/// clamped to the rows of q or k, then made non-decreasing), which every kernel the call
/// launches reads in place of the caller's (one copy for both where they are one tensor over
/// as many rows); `None` for every other call. Lengths the host check would pass come out the
/// same; others give unspecified values in their rows, never an access outside the tensors.
fn on_device_lengths(
    s: &Plan,
    ctx: &KernelCtx<'_>,
    cu_q: Option<&Tensor>,
    cu_k: Option<&Tensor>,
    k_rows: usize,
) -> Result<Option<(OnDevice, Tensor, Tensor)>> {
    let (true, Some(cu_q), Some(cu_k)) = (s.g.spans_on_device, cu_q, cu_k) else { return Ok(None) };
    let int = |what: &'static str, n: usize| {
        i32::try_from(n)
            .map_err(|_| crate::launch::unsupported(s.op, format!("{what} {n} is past the kernels' 32-bit range")))
    };
    let shared = ptr(cu_q)? == ptr(cu_k)? && s.g.tq == k_rows;
    let out_q = empty(ctx.device, cu_q.shape(), DType::I32)?;
    let out_k = if shared { out_q.clone() } else { empty(ctx.device, cu_k.shape(), DType::I32)? };
    let aux = s.kernel(Part::Aux)?;
    aux.launch(
        "attn_cu_clamp",
        Grid { blocks: (if shared { 1 } else { 2 }, 1, 1), threads: (1024, 1, 1), smem: 0 },
        &[
            Arg::Ptr(ptr(cu_q)?),
            Arg::Ptr(ptr(&out_q)?),
            Arg::I32(int("rows", s.g.tq)?),
            Arg::Ptr(ptr(cu_k)?),
            Arg::Ptr(ptr(&out_k)?),
            Arg::I32(int("rows", k_rows)?),
            Arg::I32(int("cu_seqlens entries", cu_q.numel())?),
        ],
    )?;
    Ok(Some((aux, out_q, out_k)))
}

/// One tensor of [`fill_past_sequences`]: the kernel's `TailFill`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct TailFill {
    p: u64,
    cu: u64,
    rows: i64,
    row_len: i64,
    planes: i32,
    pattern: u32,
}

/// `attn_thd_tail`'s parameter.
#[repr(C)]
struct TailFills {
    f: [TailFill; 2],
    batch: i32,
}

/// One tensor's rows past the last sequence for [`fill_past_sequences`].
struct Tail<'t> {
    /// The tensor: `planes` planes of `rows` rows.
    t: &'t Tensor,
    /// `on_device_lengths`' copy of its lengths.
    cu: &'t Tensor,
    rows: usize,
    planes: usize,
    /// 0, or f32 -inf's bits (lse).
    pattern: u32,
}

impl<'t> Tail<'t> {
    /// Zeros in the rows of `t` (one plane) past the last of `cu`'s sequences.
    fn zeros(t: &'t Tensor, cu: &'t Tensor) -> Self {
        Tail { t, cu, rows: t.shape()[0], planes: 1, pattern: 0 }
    }
}

/// `attn_thd_tail`: in `first` and `second`, the rows from their lengths' last entry on set to
/// their pattern, in one launch.
fn fill_past_sequences(
    s: &Plan,
    ctx: &KernelCtx<'_>,
    aux: &OnDevice,
    first: Tail<'_>,
    second: Option<Tail<'_>>,
) -> Result<()> {
    let mut f = [TailFill::default(); 2];
    let mut units_max = 0;
    let mut used = 0;
    for Tail { t, cu, rows, planes, pattern } in std::iter::once(first).chain(second) {
        let units = t.numel() * t.dtype().size_in_bytes() / 2;
        if units == 0 || rows == 0 || planes == 0 {
            continue;
        }
        units_max = units_max.max(units);
        f[used] = TailFill {
            p: ptr(t)?,
            cu: ptr(cu)?,
            rows: rows as i64,
            row_len: (units / planes / rows) as i64,
            planes: planes as i32,
            pattern,
        };
        used += 1;
    }
    if used == 0 {
        return Ok(());
    }
    let params = TailFills { f, batch: s.g.batch as i32 };
    let grid = Grid {
        blocks: (blocks_for(units_max, 256, sm_count(ctx.device) * 8), used as u32, 1),
        threads: (256, 1, 1),
        smem: 0,
    };
    // SAFETY: `TailFills` is the kernel's parameter struct (repr(C): two `TailFill`s of two
    // u64 addresses, two i64, an i32 and a u32, then an i32, as in attention.cu); the grid's y
    // dimension covers only the filled entries, whose addresses are live tensors of this device
    // (the tensor and its clamped lengths, batch + 1 ints) that stream ordering keeps alive
    // until the kernel has run; each writes only rows [cu[batch], rows) of its own planes, and
    // cu[batch] is at most rows (attn_cu_clamp).
    unsafe { crate::launch::launch_struct(ctx.device, &aux.variant, "attn_thd_tail", grid, &params) }
}

fn common_args(s: &Plan, a_scale: f32, p: f32, seed: u64, offset: u64) -> Vec<Arg> {
    let g = &s.g;
    vec![
        Arg::I32(g.batch as i32),
        Arg::I32(g.sq as i32),
        Arg::I32(g.sk as i32),
        Arg::I32(g.hq as i32),
        Arg::I32(g.hk as i32),
        Arg::I32(g.tq as i32),
        Arg::F32(a_scale),
        Arg::F32(p),
        Arg::U64(seed),
        Arg::U64(offset),
    ]
}

/// The catalogue op `fused_attn_fwd` on CUDA (the Hopper wgmma kernels where they apply, else the mma.sync ones).
pub fn fused_attn_fwd(ctx: &KernelCtx<'_>, a: &AttnFwdArgs) -> Result<AttnFwdOut> {
    const OP: &str = "fused_attn_fwd";
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let s = setup(OP, ctx, &a.qkv())?;
    // thd rows past the last sequence belong to none: zero them (and -inf their lse). Either
    // kernel writes every other row, so sequences that end at the last row (the usual packing)
    // need no fill (134 MB of o at the bench's shape). Lengths left on the device: their clamped
    // copies for every kernel, and the fill from the last one's end on the device.
    let on_device = on_device_lengths(&s, ctx, cu_q, cu_k, a.k.shape()[0])?;
    let clamped;
    let a = match &on_device {
        Some((_, cq, ck)) => {
            clamped = AttnFwdArgs { cu_seqlens_q: Some(cq.clone()), cu_seqlens_kv: Some(ck.clone()), ..a.clone() };
            &clamped
        }
        None => a,
    };
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let on_device = on_device.map(|(aux, ..)| aux);
    let thd_tail = on_device.is_none() && s.g.has_rows_past_sequences(false, a.q.shape()[0]);
    let o = if thd_tail {
        zeros(ctx.device, a.q.shape(), a.q.dtype())?
    } else {
        empty(ctx.device, a.q.shape(), a.q.dtype())?
    };
    let lse = empty(ctx.device, &s.g.lse_shape(), DType::F32)?;
    if thd_tail {
        fill(&s, ctx, &lse, f32::NEG_INFINITY)?;
    }
    if let (Some(aux), Some(cq)) = (&on_device, cu_q) {
        let lse_tail = Tail { t: &lse, cu: cq, rows: s.g.tq, planes: s.g.hq, pattern: f32::NEG_INFINITY.to_bits() };
        fill_past_sequences(&s, ctx, aux, Tail::zeros(&o, cq), Some(lse_tail))?;
    }
    if super::attention_sm90::fwd(ctx, a, &s.g, &s.build, &o, &lse, &|| s.variant(Part::Aux))? {
        return Ok(AttnFwdOut { o, softmax_lse: lse });
    }
    let kernel = s.kernel(Part::Fwd)?;
    // The backward of this call's build (the same part the Hopper backward's small kernels
    // come from), compiled on other threads on the forward's first call.
    kernel.compile_ahead(|| Ok(vec![s.variant(Part::Dkdv)?, s.variant(Part::Aux)?]));
    let elem = a.q.dtype().size_in_bytes();
    let (br, bc) = (fwd_br(a.q.dtype(), s.dp), fwd_bc(a.q.dtype(), s.dp));
    let (ld, ldp) = (s.dp + 16 / elem, bc + 16 / elem);
    // 16-bit tiles keep the probabilities in registers; f32 tiles stage them per warp.
    let p_tile = if a.q.dtype() == DType::F32 { br * ldp } else { 0 };
    let smem = check_smem(OP, ctx, ((br + 4 * bc) * ld + p_tile) * elem)?;
    let mut args = vec![
        Arg::Ptr(ptr(&a.q)?),
        Arg::Ptr(ptr(&a.k)?),
        Arg::Ptr(ptr(&a.v)?),
        Arg::Ptr(ptr(&o)?),
        Arg::Ptr(ptr(&lse)?),
        Arg::Ptr(opt_ptr(cu_q)?),
        Arg::Ptr(opt_ptr(cu_k)?),
    ];
    args.extend(common_args(&s, a.scale, a.dropout_p, a.seed, a.offset));
    kernel.launch("attn_fwd", s.tile_grid(s.g.sq, br, s.g.hq, 4 * MMA_WARP as u32, smem), &args)?;
    Ok(AttnFwdOut { o, softmax_lse: lse })
}

/// The catalogue op `fused_attn_bwd` on CUDA (the Hopper wgmma kernels where they apply, else the
/// mma.sync ones). Both add each key block's dQ share into an f32 accumulator as the blocks
/// finish, in an order that varies from run to run; a call that asks for a deterministic dQ
/// (`AttnBwdArgs::deterministic`) runs the dK/dV kernel without its dQ shares (the Hopper one
/// where it takes the call, else the mma.sync one without its atomics) and then a dQ pass that
/// sums each query row's dQ in key order in one block's registers: the Hopper one
/// (`attn_bwd_dq_sm90`, 16-bit head dims 64 and 128) or `attn_bwd_dq` (mma.sync). H200,
/// 2026-11-30, `bench --backend nvidia --only attn_bwd`, causal b4 h32 s4096 d128: 4.485 ms
/// deterministic against 3.532 (the mma.sync pair took 7.665). Where `attn_bwd_dq`'s tiles do
/// not fit the device's shared memory (on Hopper, f32 head dims over 208: d 256 needs 275,456
/// bytes) a deterministic call runs the portable kernels' backward instead (`tefl-gpu`'s SIMT
/// kernels: dQ row by row, no atomics; far slower).
pub fn fused_attn_bwd(ctx: &KernelCtx<'_>, a: &AttnBwdArgs) -> Result<AttnBwdOut> {
    const OP: &str = "fused_attn_bwd";
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let s = setup(OP, ctx, &a.qkv())?;
    if a.d_o.dtype() != a.q.dtype() {
        return Err(Error::DType {
            op: OP,
            arg: "d_o",
            got: a.d_o.dtype(),
            expected: format!("{} (that of q)", a.q.dtype()),
        });
    }
    let hopper_dq = a.deterministic && super::attention_sm90::takes_dq(ctx, a, &s.g, &s.build)?;
    if a.deterministic && !hopper_dq && dq_pass_smem(a.q.dtype(), s.dp) > smem_limit(ctx)? {
        // (With the caller's lengths: the portable kernels read and check them.)
        return tefl_gpu::simt::attention::fused_attn_bwd(ctx, a);
    }
    // The kernels write every row a sequence owns (keys no query sees as zeros); thd rows past
    // the last sequence belong to none and are zeroed here, a fill skipped when the sequences
    // end at the last row (the usual packing: 2 x 134 MB of dK and dV at the bench's shape).
    // Lengths left on the device: their clamped copies for every kernel, and the fill from the
    // last one's end on the device (`tails`).
    let on_device = on_device_lengths(&s, ctx, cu_q, cu_k, a.k.shape()[0])?;
    let clamped;
    let a = match &on_device {
        Some((_, cq, ck)) => {
            clamped = AttnBwdArgs { cu_seqlens_q: Some(cq.clone()), cu_seqlens_kv: Some(ck.clone()), ..a.clone() };
            &clamped
        }
        None => a,
    };
    let on_device = on_device.map(|(aux, ..)| aux);
    let thd_tail = on_device.is_none()
        && (s.g.has_rows_past_sequences(false, a.q.shape()[0]) || s.g.has_rows_past_sequences(true, a.k.shape()[0]));
    let dev = ctx.device;
    let mk = |t: &Tensor| if thd_tail { zeros(dev, t.shape(), t.dtype()) } else { empty(dev, t.shape(), t.dtype()) };
    let tails = |dq: Option<&Tensor>, dk: &Tensor, dv: &Tensor| -> Result<()> {
        if let (Some(aux), Some(cq), Some(ck)) = (&on_device, a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref()) {
            fill_past_sequences(&s, ctx, aux, Tail::zeros(dk, ck), Some(Tail::zeros(dv, ck)))?;
            if let Some(dq) = dq {
                fill_past_sequences(&s, ctx, aux, Tail::zeros(dq, cq), None)?;
            }
        }
        Ok(())
    };
    if a.deterministic {
        let (dq, dk, dv) = (mk(&a.q)?, mk(&a.k)?, mk(&a.v)?);
        tails(Some(&dq), &dk, &dv)?;
        let delta = delta_kernel(&s, &s.kernel(Part::Aux)?, a, dev, None)?;
        let hopper = super::attention_sm90::BwdBuffers { delta: &delta, dq_acc: None, dk: &dk, dv: &dv };
        if !super::attention_sm90::bwd(ctx, a, &s.g, &s.build, &hopper)? {
            dkdv(ctx, a, &s, &delta, None, &dk, &dv)?;
        }
        if !(hopper_dq && super::attention_sm90::dq(ctx, a, &s.g, &s.build, &delta, &dq)?) {
            dq_pass(ctx, a, &s, &delta, &dq)?;
        }
        return Ok(AttnBwdOut { dq, dk, dv });
    }
    // dQ is summed over key blocks in f32 by atomics or the Hopper kernel's tensor reduce-adds
    // (the delta kernel zeroes it), then scaled and converted; every element is written, rows
    // outside the sequences as zeros.
    let dq_acc = empty(dev, &[a.q.numel()], DType::F32)?;
    let dq = empty(dev, a.q.shape(), a.q.dtype())?;
    let (dk, dv) = (mk(&a.k)?, mk(&a.v)?);
    tails(None, &dk, &dv)?;
    let aux = s.kernel(Part::Aux)?;
    let delta = delta_kernel(&s, &aux, a, dev, Some(&dq_acc))?;
    let hopper = super::attention_sm90::BwdBuffers { delta: &delta, dq_acc: Some(&dq_acc), dk: &dk, dv: &dv };
    if !super::attention_sm90::bwd(ctx, a, &s.g, &s.build, &hopper)? {
        dkdv(ctx, a, &s, &delta, Some(&dq_acc), &dk, &dv)?;
    }
    let n = a.q.numel();
    aux.launch(
        "attn_bwd_dq_out",
        Grid::linear(blocks_for(n, 256, sm_count(dev) * 8), 256),
        &[Arg::Ptr(ptr(&dq_acc)?), Arg::Ptr(ptr(&dq)?), Arg::U64(n as u64), Arg::F32(a.scale)],
    )?;
    Ok(AttnBwdOut { dq, dk, dv })
}

/// `fused_attn_fwd`'s warm-up (`tefl_core::Manager::warmup`): starts compiling, on another
/// thread, the kernel a call with these arguments launches (Hopper's where it takes the call),
/// running nothing. (Its backward's variants start compiling at the forward's first call.)
pub fn warmup_fwd(ctx: &KernelCtx<'_>, a: &AttnFwdArgs) -> Result<()> {
    let s = setup("fused_attn_fwd", ctx, &a.qkv())?;
    let fwd = match super::attention_sm90::fwd_warmup_variant(ctx, a, &s.g, &s.build)? {
        Some(v) => v,
        None => s.variant(Part::Fwd)?,
    };
    crate::launch::compile_ahead(ctx.device, &fwd);
    Ok(())
}

/// `fused_attn_bwd`'s warm-up (`tefl_core::Manager::warmup`): starts compiling, on other
/// threads, the kernels a call with these arguments launches (the small kernels, the dK/dV
/// tiles and, deterministic, the dQ pass; Hopper's where they take the call), running nothing.
pub fn warmup_bwd(ctx: &KernelCtx<'_>, a: &AttnBwdArgs) -> Result<()> {
    let s = setup("fused_attn_bwd", ctx, &a.qkv())?;
    let mut variants = vec![s.variant(Part::Aux)?];
    let hopper = super::attention_sm90::bwd_warmup_variants(ctx, a, &s.g, &s.build)?;
    let hopper_dq = hopper.len() > 1;
    if hopper.is_empty() {
        variants.push(s.variant(Part::Dkdv)?);
    }
    variants.extend(hopper);
    if a.deterministic && !hopper_dq {
        variants.push(s.variant(Part::Dq)?);
    }
    for v in &variants {
        crate::launch::compile_ahead(ctx.device, v);
    }
    Ok(())
}

/// `attn_bwd_delta` (from `aux`, the call's small-kernel part): delta = Σ dO·O per row and
/// head (returned, f32), zeroing `dq_acc` when there is one.
fn delta_kernel(s: &Plan, aux: &OnDevice, a: &AttnBwdArgs, dev: Device, dq_acc: Option<&Tensor>) -> Result<Tensor> {
    let rows_heads = a.q.numel() / s.g.d;
    let delta = empty(dev, &[rows_heads], DType::F32)?;
    aux.launch(
        "attn_bwd_delta",
        Grid::linear((rows_heads * MMA_WARP).div_ceil(256).max(1) as u32, 256),
        &[
            Arg::Ptr(ptr(&a.o)?),
            Arg::Ptr(ptr(&a.d_o)?),
            Arg::Ptr(ptr(&delta)?),
            Arg::Ptr(opt_ptr(dq_acc)?),
            Arg::U64(rows_heads as u64),
        ],
    )?;
    Ok(delta)
}

/// The first arguments of the backward's tile kernels: q, k, v, dO, lse and delta.
fn bwd_inputs(a: &AttnBwdArgs, delta: &Tensor) -> Result<Vec<Arg>> {
    Ok(vec![
        Arg::Ptr(ptr(&a.q)?),
        Arg::Ptr(ptr(&a.k)?),
        Arg::Ptr(ptr(&a.v)?),
        Arg::Ptr(ptr(&a.d_o)?),
        Arg::Ptr(ptr(&a.softmax_lse)?),
        Arg::Ptr(ptr(delta)?),
    ])
}

/// Queries per `attn_bwd_dq` block (`DQ_BR` in attention.cu: 4 warps of 16).
const DQ_BR: usize = 64;

/// `attn_bwd_dq`'s shared memory for a dtype and padded head dim: Q and dO, two stages of K
/// and V; f32 tiles also stage dS per warp.
fn dq_pass_smem(dtype: DType, dp: usize) -> usize {
    let elem = dtype.size_in_bytes();
    let bc = fwd_bc(dtype, dp);
    let (ld, ldp) = (dp + 16 / elem, bc + 16 / elem);
    let ds_tile = if dtype == DType::F32 { DQ_BR * ldp } else { 0 };
    ((2 * DQ_BR + 4 * bc) * ld + ds_tile) * elem
}

/// `attn_bwd_dq`: the deterministic dQ, a block per 64 queries of a head, written to `dq`.
fn dq_pass(ctx: &KernelCtx<'_>, a: &AttnBwdArgs, s: &Plan, delta: &Tensor, dq: &Tensor) -> Result<()> {
    const OP: &str = "fused_attn_bwd";
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let smem = check_smem(OP, ctx, dq_pass_smem(a.q.dtype(), s.dp))?;
    let mut args = bwd_inputs(a, delta)?;
    args.extend([Arg::Ptr(ptr(dq)?), Arg::Ptr(opt_ptr(cu_q)?), Arg::Ptr(opt_ptr(cu_k)?)]);
    args.extend(common_args(s, a.scale, a.dropout_p, a.seed, a.offset));
    s.kernel(Part::Dq)?.launch("attn_bwd_dq", s.tile_grid(s.g.sq, DQ_BR, s.g.hq, (4 * MMA_WARP) as u32, smem), &args)
}

/// The mma.sync dK/dV kernel (`attn_bwd_dkdv`), adding each tile's dQ share to `dq_acc` (none:
/// the deterministic path, whose dQ is `attn_bwd_dq`'s).
fn dkdv(
    ctx: &KernelCtx<'_>,
    a: &AttnBwdArgs,
    s: &Plan,
    delta: &Tensor,
    dq_acc: Option<&Tensor>,
    dk: &Tensor,
    dv: &Tensor,
) -> Result<()> {
    const OP: &str = "fused_attn_bwd";
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let elem = a.q.dtype().size_in_bytes();
    let ld = s.dp + 16 / elem;
    let mut args = bwd_inputs(a, delta)?;
    args.extend([Arg::Ptr(ptr(dk)?), Arg::Ptr(ptr(dv)?), Arg::Ptr(opt_ptr(dq_acc)?)]);
    args.push(Arg::Ptr(opt_ptr(cu_q)?));
    args.push(Arg::Ptr(opt_ptr(cu_k)?));
    args.extend(common_args(s, a.scale, a.dropout_p, a.seed, a.offset));
    // K, V; two stages of Q and dO; two stages of lse and delta; per key, br (padded) elements
    // for P^T handed from the dV to the dK warps and then dS^T; f32 builds also stage P and dS
    // in a tile of their own.
    let (kb, br) = (dkv_keys(a.q.dtype(), s.dp), dkv_rows(a.q.dtype(), s.dp));
    let (own_tile, stages) = if a.q.dtype() == DType::F32 { (kb * (br + 16 / elem), 1) } else { (0, 2) };
    let handover = kb * (br + 16 / elem);
    let smem =
        check_smem(OP, ctx, ((2 * kb + 2 * stages * br) * ld + handover + own_tile) * elem + 2 * stages * br * 4)?;
    // A dV and a dK warp per 16 DKV_MT keys.
    let threads = (2 * kb / (16 * dkv_mtiles(s.dp)) * MMA_WARP) as u32;
    s.kernel(Part::Dkdv)?.launch("attn_bwd_dkdv", s.tile_grid(s.g.sk, kb, s.g.hk, threads, smem), &args)
}

/// Variants covering every code path (the NVRTC compile test).
///
/// `all_masks`: each dtype's head-dim tiers with each of four layout / mask / window / dropout
/// combinations; otherwise with two of them, alternating so that every dtype still meets all
/// four (the source has no arch-specific code, so a second arch needs only a sample: the
/// attention variants are most of the compile test's time).
pub fn variants(all_masks: bool) -> Vec<Variant> {
    use DType::{BF16, F16, F32};
    let mut v = Vec::new();
    for (i, (dtype, d)) in
        [(BF16, 128), (F16, 64), (F32, 64), (BF16, 8), (F16, 256), (F32, 40), (F32, 256)].into_iter().enumerate()
    {
        for (j, (layout, mask, win, dropout)) in [
            (QkvLayout::Bshd, AttnMask::Causal, None, false),
            (QkvLayout::Sbhd, AttnMask::CausalBottomRight, Some(5), true),
            (QkvLayout::Thd, AttnMask::Padding, Some(3), true),
            (QkvLayout::Bshd, AttnMask::Padding, None, false),
        ]
        .into_iter()
        .enumerate()
        {
            if all_masks || (i + j) % 2 == 0 {
                let build = AttnBuild { dtype, d, layout, mask, window: (win, win), dropout };
                // The small kernels read no layout, mask or window: one build of each tier.
                let parts: &[Part] = if j < 2 {
                    &[Part::Fwd, Part::Dkdv, Part::Dq, Part::Aux]
                } else {
                    &[Part::Fwd, Part::Dkdv, Part::Dq]
                };
                for &part in parts {
                    v.extend(variant("attention", &build, 2, part));
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hopper's per-block shared memory (227 KiB): `attn_bwd_dq` takes the 16-bit head dims up
    /// to 256 and the f32 ones up to 208; the f32 ones above (the conformance suite's f32 d256
    /// case) go to the portable kernels.
    #[test]
    fn the_deterministic_dq_tiles_fit_hopper_up_to_f32_d208() {
        const HOPPER: usize = 232_448;
        for d in [64, 128, 256] {
            assert!(dq_pass_smem(DType::BF16, d) <= HOPPER, "bf16 d{d}: {}", dq_pass_smem(DType::BF16, d));
            assert!(dq_pass_smem(DType::F16, d) <= HOPPER);
        }
        for d in [128, 144, 208] {
            assert!(dq_pass_smem(DType::F32, d) <= HOPPER, "f32 d{d}: {}", dq_pass_smem(DType::F32, d));
        }
        assert!(dq_pass_smem(DType::F32, 224) > HOPPER);
        assert_eq!(dq_pass_smem(DType::F32, 256), 275_456);
    }
}
