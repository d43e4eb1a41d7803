//! Flash attention on Hopper. The forward (`cuda/attention/attention_sm90.cu`): the copy engine
//! loads Q tiles of 128 rows and K / V tiles of 128 rows (64 at head dim 256) through 4-D
//! tensor maps over the bshd, sbhd or thd tensors (a bshd / sbhd sequence's tail reads zeros;
//! thd and padded sequences' tails, which read the next sequence's or padding rows, are
//! zeroed in shared memory wherever a product would multiply them), wgmma
//! multiplies them, a producer warp feeds two consumer warpgroups of 64 query rows; one
//! persistent CTA per SM claims work items (128 query rows of a head) from a counter. The
//! backward's dK/dV kernel (`attention_bwd_sm90.cu`): one CTA per 128 keys of a kv head (64 at
//! head dim 256, its own entry), query tiles of 64 rows of every head of the group streamed in
//! by the copy engine, the five products on wgmma, dQ shares added to the f32 accumulator by
//! tensor reduce-adds (the delta and dQ conversion kernels are `attention.cu`'s). The
//! deterministic backward runs that kernel without its dQ shares and then [`dq`]: the
//! forward's source built as a dQ pass (`attn_bwd_dq_sm90`, head dims 64 and 128: per query
//! tile, S, dP, dS and dQ += dS·K over its keys in order, in registers, written once).
//!
//! [`fwd`] and [`bwd`] decline (`Ok(false)`) a call the kernels do not take:
//! another arch than sm_90, the tune config's `fwd_wgmma` / `bwd_wgmma` off, f32, head dims
//! other than 64, 128 and 256, dropout, or tensors the copy engine cannot address;
//! `attention.rs` then runs the mma.sync kernels.

use tefl_core::catalogue::{AttnBwdArgs, AttnFwdArgs, AttnGeometry, QkvLayout};
use tefl_core::{DType, KernelCtx, Result, Tensor};
use tefl_gpu::simt::attention::AttnBuild;
use tefl_gpu::{Grid, Variant};

use crate::heuristics::{attention_bwd_persistent, attention_bwd_wgmma, attention_fwd_wgmma};
use crate::launch::{info, launch_struct, opt_ptr, ptr, sm_count, tune_table, zeros};
use crate::tma::{TensorMap, encode};

const OP: &str = "fused_attn_fwd";
const ENTRIES: &[&str] = &["attn_fwd_sm90"];
const BWD_OP: &str = "fused_attn_bwd";
const BWD_ENTRIES: &[&str] = &["attn_bwd_sm90"];
/// The backward's entry at head dim 256 (the same source: dK and dV split by head-dim halves
/// between the consumers, 64 keys a CTA).
const BWD_ENTRIES_D256: &[&str] = &["attn_bwd_sm90_d256"];
/// The deterministic backward's dQ pass (the forward's source with `DQ_PASS`).
const DQ_ENTRIES: &[&str] = &["attn_bwd_dq_sm90"];
/// Head dims the dQ pass takes: at 256 its Q and dO tiles and two K / V stages would take
/// 263 KB of shared memory.
const DQ_HEAD_DIMS: &[usize] = &[64, 128];
/// Query rows per CTA (two consumer warpgroups of 64) and the forward's keys per tile (see
/// [`key_rows`]); the backward's keys per CTA.
const ROWS: usize = 128;
/// Head dims the kernels take (both directions).
const HEAD_DIMS: &[usize] = &[64, 128, 256];
/// The backward's query rows per tile.
const BWD_ROWS: usize = 64;
/// K and V pipeline stages (forward); Q and dO stages (backward).
const STAGES: usize = 2;

/// Heads (of one sequence each) per scheduling group: both kernels order their work items
/// heaviest causal tile first within each group (`heavy_first` in `attention_mask.h`), so a
/// launch does not end on a few CTAs still working through long tiles. Four heads' K and V
/// (forward) or Q and dO (backward) are about what the CTAs of a full H100 / H200 read at once
/// anyway, so they stay in L2. Against one head a group (the order before): forward 1.002 /
/// 0.998 ms against 1.022 / 1.020, backward 3.453 / 3.538 against 3.537 / 3.616 (H200, causal
/// b4 h32 s4096 d128, alternating in one run); eight heads gave 1.003 / 3.471 and 1.003 / 3.560.
const HEAD_GROUP: usize = 4;

/// The fields the forward's and the dQ pass's `AttnParams` end with (from `counter` on; laid
/// out inside either struct as the kernel's flat fields are).
#[repr(C)]
struct Schedule {
    counter: u64,
    cu_q: u64,
    cu_k: u64,
    batch: i32,
    sq: i32,
    sk: i32,
    hq: i32,
    hk: i32,
    tiles_q: i32,
    tq: i32,
    scale: f32,
}

/// The persistent kernels' grid (one CTA per SM at most, each claiming work items from a
/// counter, then one slot per CTA for handing its item to its consumers), the counter (zeroed
/// ints, which must outlive the launch) and the `Schedule` that addresses it.
fn schedule(
    ctx: &KernelCtx<'_>,
    g: &AttnGeometry,
    cu_q: Option<&Tensor>,
    cu_k: Option<&Tensor>,
    scale: f32,
) -> Result<(u32, Tensor, Schedule)> {
    let ctas = work_items(g).min(sm_count(ctx.device) as usize);
    let counter = zeros(ctx.device, &[1 + ctas], DType::I32)?;
    let sched = Schedule {
        counter: ptr(&counter)?,
        cu_q: opt_ptr(cu_q)?,
        cu_k: opt_ptr(cu_k)?,
        batch: g.batch as i32,
        sq: g.sq as i32,
        sk: g.sk as i32,
        hq: g.hq as i32,
        hk: g.hk as i32,
        tiles_q: g.sq.div_ceil(ROWS) as i32,
        tq: g.tq as i32,
        scale,
    };
    Ok((ctas as u32, counter, sched))
}

/// The kernel's `AttnParams`.
#[repr(C)]
struct AttnParams {
    q: TensorMap,
    k: TensorMap,
    v: TensorMap,
    o: u64,
    lse: u64,
    sched: Schedule,
}

/// The dQ pass's `AttnParams` (built with `DQ_PASS`).
#[repr(C)]
struct DqParams {
    q: TensorMap,
    k: TensorMap,
    v: TensorMap,
    d_o: TensorMap,
    dq: u64,
    lse: u64,
    delta: u64,
    sched: Schedule,
}

/// The backward kernel's `BwdParams`.
#[repr(C)]
struct BwdParams {
    q: TensorMap,
    k: TensorMap,
    v: TensorMap,
    d_o: TensorMap,
    dq: TensorMap,
    lse: u64,
    delta: u64,
    dk: u64,
    dv: u64,
    cu_q: u64,
    cu_k: u64,
    counter: u64,
    batch: i32,
    sq: i32,
    sk: i32,
    hq: i32,
    hk: i32,
    tq: i32,
    scale: f32,
}

/// The forward kernel variant for a build (launches and the compile test), or with `dq_pass`
/// the same source as the deterministic backward's dQ pass.
fn variant_of(b: &AttnBuild, dq_pass: bool) -> Result<Variant> {
    let op = if dq_pass { BWD_OP } else { OP };
    let defines = b
        .defines(op)?
        .flag("T_F16", b.dtype == DType::F16)
        .set("STAGES", if dq_pass { DQ_STAGES } else { STAGES })
        .set("HEAD_GROUP", HEAD_GROUP)
        .flag("DQ_PASS", dq_pass);
    Ok(Variant::new(&tefl_kernels::ATTENTION_SM90, if dq_pass { DQ_ENTRIES } else { ENTRIES }, defines))
}

/// The forward kernel variant for a build.
fn variant(b: &AttnBuild) -> Result<Variant> {
    variant_of(b, false)
}

/// The backward kernel variant for a build: with the dQ shares, or (the deterministic path)
/// dK and dV only; as persistent CTAs or one per key block ([`attention_bwd_persistent`]).
fn bwd_variant(b: &AttnBuild, dq_shares: bool, persistent: bool) -> Result<Variant> {
    let defines = b
        .defines(BWD_OP)?
        .flag("T_F16", b.dtype == DType::F16)
        .set("STAGES", STAGES)
        .set("HEAD_GROUP", HEAD_GROUP)
        .flag("DQ_SHARES", dq_shares)
        .flag("PERSISTENT", persistent);
    Ok(Variant::new(&tefl_kernels::ATTENTION_BWD_SM90, bwd_entries(b.d), defines))
}

/// The backward's entry points for head dim `d`.
fn bwd_entries(d: usize) -> &'static [&'static str] {
    if d > 128 { BWD_ENTRIES_D256 } else { BWD_ENTRIES }
}

/// Work items of one call: 128 query rows of one head of one sequence each.
fn work_items(g: &AttnGeometry) -> usize {
    g.sq.div_ceil(ROWS) * g.hq * g.batch
}

/// The backward's CTAs: one per 128 (or at head dim 256, 64) keys of each kv head of each
/// sequence, in one dimension (the kernel decodes its item with `heavy_first`).
fn bwd_blocks(g: &AttnGeometry) -> Result<u32> {
    let keys = key_rows(g.d);
    let n = g.sk.div_ceil(keys) * g.hk * g.batch;
    u32::try_from(n).ok().filter(|&n| n <= i32::MAX as u32).ok_or_else(|| {
        tefl_core::Error::invalid(BWD_OP, "k", format!("{n} blocks of {keys} keys exceed a launch's grid (2^31 - 1)"))
    })
}

/// The forward's keys per K / V tile (the kernel's `BC`) and the backward's per CTA (`BN`): 128,
/// or 64 at head dim 256, where the forward's output accumulators take 128 registers a thread,
/// the tiles' shared memory doubles, and the backward's consumers split dK and dV by columns.
fn key_rows(d: usize) -> usize {
    if d > 128 { 64 } else { ROWS }
}

/// Dynamic shared memory: the alignment slack, the Q tile, STAGES K and V tiles, the barriers.
fn smem(d: usize) -> usize {
    1024 + ROWS * d * 2 + 2 * STAGES * key_rows(d) * d * 2 + 8 * (2 + 4 * STAGES)
}

/// The dQ pass's keys per K / V tile (its `BC`): 64 at every head dim, so that its S, dP and dQ
/// accumulators fit the registers ptxas allocates a consumer thread.
const DQ_KEY_ROWS: usize = 64;
/// The dQ pass's K and V stages.
const DQ_STAGES: usize = 2;

/// The dQ pass's dynamic shared memory: the alignment slack, the Q and dO tiles, STAGES K and
/// V tiles of 64 keys, the barriers.
fn dq_smem(d: usize) -> usize {
    1024 + 2 * ROWS * d * 2 + 2 * DQ_STAGES * DQ_KEY_ROWS * d * 2 + 8 * (2 + 4 * DQ_STAGES)
}

/// The backward's dynamic shared memory: the alignment slack, K and V (128 keys), STAGES Q and
/// dO tiles (64 rows), two dSᵀ buffers (128 x 64, 16-bit; three at head dim 64, where a tile's
/// dQ product reads its buffer a tile later), two consumers' dQ shares (64 x 64 f32), the two
/// consumers' lse and delta rows, the barriers (K / V full and empty, a full and an empty one
/// per stage and per dQ share buffer). At head dim 256: K and V of 64 keys, STAGES Q tiles and
/// one dO tile, two Pᵀ and two dSᵀ buffers (64 x 64), the same dQ shares and rows, three more
/// barriers.
fn bwd_smem(d: usize) -> usize {
    let tile = BWD_ROWS * d * 2;
    if d > 128 {
        return 1024
            + 2 * tile
            + (STAGES + 1) * tile
            + 4 * key_rows(d) * BWD_ROWS * 2
            + 2 * BWD_ROWS * 64 * 4
            + 2 * 2 * BWD_ROWS * 4
            + 8 * (4 + 2 * STAGES);
    }
    let ds_buffers = if d == 64 { 3 } else { 2 };
    1024 + 2 * ROWS * d * 2
        + 2 * STAGES * tile
        + ds_buffers * ROWS * BWD_ROWS * 2
        + 2 * BWD_ROWS * 64 * 4
        + 2 * 2 * BWD_ROWS * 4
        + 8 * (2 + 2 * STAGES + 2 * 2)
}

/// Why the kernel (forward or backward: `wgmma_on` is the tune config's choice, `head_dims`
/// those it takes, `smem` its shared memory) does not take a call on `tensors` (q, k, then the
/// others; `None`: it does).
fn declined(
    ctx: &KernelCtx<'_>,
    tensors: &[&Tensor],
    g: &AttnGeometry,
    b: &AttnBuild,
    wgmma_on: bool,
    head_dims: &[usize],
    smem: usize,
) -> Result<Option<String>> {
    let arch = &info(ctx.device)?.arch;
    if arch != "sm_90" {
        return Ok(Some(format!("{arch} is not sm_90")));
    }
    if !wgmma_on {
        return Ok(Some("the tune config (or TEFL_ATTN_WGMMA=0) keeps the mma.sync kernel".into()));
    }
    if !matches!(b.dtype, DType::BF16 | DType::F16) {
        return Ok(Some(format!("{} tensors", b.dtype)));
    }
    if !head_dims.contains(&g.d) {
        return Ok(Some(format!("head dim {}", g.d)));
    }
    if b.dropout {
        return Ok(Some("dropout".into()));
    }
    for t in tensors {
        if ptr(t)? % 16 != 0 {
            return Ok(Some("a tensor not 16-byte aligned".into()));
        }
    }
    // (thd: the maps address token rows; `tensors` starts with q and k.)
    let tokens = if g.layout == QkvLayout::Thd { tensors[0].shape()[0].max(tensors[1].shape()[0]) } else { 0 };
    if work_items(g).max(g.sq).max(g.sk).max(tokens) > i32::MAX as usize / 2
        || smem > info(ctx.device)?.shared_memory_per_block_optin
    {
        return Ok(Some("past the kernel's index range or shared memory".into()));
    }
    Ok(None)
}

/// The 4-D map of q, k, v, dO or the f32 dQ accumulator (`positions` rows of `heads` heads per
/// sequence): dimensions (head dim, heads, positions, batch) for bshd, (head dim, heads, batch,
/// positions) for sbhd, (head dim, heads, tokens, 1) for thd (the kernels address token rows;
/// `positions` is unused); boxes of 128 bytes of head dim x 1 head x `rows` positions (`op`
/// names a failure).
fn qkv_map(
    ctx: &KernelCtx<'_>,
    op: &str,
    t: &Tensor,
    g: &AttnGeometry,
    positions: usize,
    heads: usize,
    rows: usize,
) -> Result<TensorMap> {
    let es = t.dtype().size_in_bytes() as u64;
    let (d, h, s, b) = (g.d as u64, heads as u64, positions as u64, g.batch as u64);
    let inner = (128 / es) as u32;
    let (dims, strides, boxes) = match g.layout {
        QkvLayout::Bshd => ([d, h, s, b], [d * es, h * d * es, s * h * d * es], [inner, 1, rows as u32, 1]),
        QkvLayout::Sbhd => ([d, h, b, s], [d * es, h * d * es, b * h * d * es], [inner, 1, 1, rows as u32]),
        QkvLayout::Thd => {
            // (The dQ accumulator is flat, [t h d] f32: its tokens are its elements over h d.)
            let tokens = (t.numel() as u64) / (h * d);
            ([d, h, tokens, 1], [d * es, h * d * es, tokens * h * d * es], [inner, 1, rows as u32, 1])
        }
    };
    encode(ctx, op, ptr(t)?, t.dtype(), &dims, &strides, &boxes)
}

/// The forward on the Hopper kernel into `o` and `lse` (which the kernel fills for every row
/// a sequence owns; thd rows past the last sequence are the caller's), or `Ok(false)` when it
/// does not take the call (the reason is logged at debug level). On its first call for a build
/// it starts compiling the backward's variant and `aux` (the small kernels the backward
/// launches from `attention.cu`) on other threads.
pub fn fwd(
    ctx: &KernelCtx<'_>,
    a: &AttnFwdArgs,
    g: &AttnGeometry,
    b: &AttnBuild,
    o: &Tensor,
    lse: &Tensor,
    aux: &dyn Fn() -> Result<Variant>,
) -> Result<bool> {
    let tune = tune_table(ctx.device)?;
    let on = attention_fwd_wgmma(&tune);
    if let Some(reason) = declined(ctx, &[&a.q, &a.k, &a.v], g, b, on, HEAD_DIMS, smem(g.d))? {
        tracing::debug!(target: "TE-FL", "{OP}: Hopper wgmma kernel declined ({reason}); the mma.sync kernel runs");
        return Ok(false);
    }
    let (ctas, _counter, sched) = schedule(ctx, g, a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref(), a.scale)?;
    let params = AttnParams {
        q: qkv_map(ctx, OP, &a.q, g, g.sq, g.hq, ROWS)?,
        k: qkv_map(ctx, OP, &a.k, g, g.sk, g.hk, key_rows(g.d))?,
        v: qkv_map(ctx, OP, &a.v, g, g.sk, g.hk, key_rows(g.d))?,
        o: ptr(o)?,
        lse: ptr(lse)?,
        sched,
    };
    let grid = Grid { blocks: (ctas, 1, 1), threads: (384, 1, 1), smem: smem(g.d) as u32 };
    let forward = variant(b)?;
    let persistent = attention_bwd_persistent(&tune, g.d);
    crate::launch::compile_ahead_on_first_use(ctx.device, &forward, || {
        Ok(vec![bwd_variant(b, true, persistent)?, aux()?])
    });
    // SAFETY: `AttnParams` is the kernel's parameter struct (repr(C), the same field order,
    // 64-byte aligned maps); the maps and pointers address live tensors (q, k, v, o, lse and
    // the counter with its 1 + grid ints; the cumulative lengths, batch + 1 ints checked by the
    // op, or 0 where the build reads none) that stream ordering keeps alive until the kernel has
    // run: their frees are queued after it.
    unsafe { launch_struct(ctx.device, &forward, ENTRIES[0], grid, &params)? };
    Ok(true)
}

/// The gradients the backward's dK/dV kernel fills (with `attention.rs`'s delta kernel before
/// it, which zeroes `dq_acc`, and its dQ conversion after).
pub struct BwdBuffers<'t> {
    /// Σ dO·O per token row and head (f32, q's rows x heads).
    pub delta: &'t Tensor,
    /// The f32 dQ accumulator, laid out as q; `None`: dK and dV only (the deterministic path,
    /// whose dQ is [`dq`]'s or the mma.sync pass's).
    pub dq_acc: Option<&'t Tensor>,
    /// dK, as k.
    pub dk: &'t Tensor,
    /// dV, as v.
    pub dv: &'t Tensor,
}

/// The backward's dK/dV (and dQ shares) on the Hopper kernel: `Ok(false)` when it does not take
/// the call (the reason is logged at debug level; the mma.sync kernel then runs).
pub fn bwd(
    ctx: &KernelCtx<'_>,
    a: &AttnBwdArgs,
    g: &AttnGeometry,
    b: &AttnBuild,
    out: &BwdBuffers<'_>,
) -> Result<bool> {
    let tune = tune_table(ctx.device)?;
    let on = attention_bwd_wgmma(&tune);
    let mut tensors = vec![&a.q, &a.k, &a.v, &a.d_o];
    tensors.extend(out.dq_acc);
    if let Some(reason) = declined(ctx, &tensors, g, b, on, HEAD_DIMS, bwd_smem(g.d))? {
        tracing::debug!(target: "TE-FL", "{BWD_OP}: Hopper wgmma kernel declined ({reason}); the mma.sync kernel runs");
        return Ok(false);
    }
    // Persistent CTAs (at most one an SM, the kernel's shared memory allows no more) claiming
    // key blocks from a counter, each with a slot for its item after it, where the tune configs
    // ask for them; else a CTA per key block.
    let blocks = bwd_blocks(g)?;
    let persistent = attention_bwd_persistent(&tune, g.d);
    let ctas = if persistent { blocks.min(sm_count(ctx.device)) } else { blocks };
    let counter = if persistent { Some(zeros(ctx.device, &[1 + ctas as usize], DType::I32)?) } else { None };
    let params = BwdParams {
        q: qkv_map(ctx, BWD_OP, &a.q, g, g.sq, g.hq, BWD_ROWS)?,
        k: qkv_map(ctx, BWD_OP, &a.k, g, g.sk, g.hk, key_rows(g.d))?,
        v: qkv_map(ctx, BWD_OP, &a.v, g, g.sk, g.hk, key_rows(g.d))?,
        d_o: qkv_map(ctx, BWD_OP, &a.d_o, g, g.sq, g.hq, BWD_ROWS)?,
        // (Without an accumulator the kernel reads no dq map: q's stands in.)
        dq: qkv_map(ctx, BWD_OP, out.dq_acc.unwrap_or(&a.q), g, g.sq, g.hq, BWD_ROWS)?,
        lse: ptr(&a.softmax_lse)?,
        delta: ptr(out.delta)?,
        dk: ptr(out.dk)?,
        dv: ptr(out.dv)?,
        cu_q: opt_ptr(a.cu_seqlens_q.as_ref())?,
        cu_k: opt_ptr(a.cu_seqlens_kv.as_ref())?,
        counter: opt_ptr(counter.as_ref())?,
        batch: g.batch as i32,
        sq: g.sq as i32,
        sk: g.sk as i32,
        hq: g.hq as i32,
        hk: g.hk as i32,
        tq: g.tq as i32,
        scale: a.scale,
    };
    let grid = Grid { blocks: (ctas, 1, 1), threads: (384, 1, 1), smem: bwd_smem(g.d) as u32 };
    let variant = bwd_variant(b, out.dq_acc.is_some(), persistent)?;
    // SAFETY: `BwdParams` is the kernel's parameter struct (repr(C), the same field order,
    // 64-byte aligned maps); the maps and pointers address live tensors (q, k, v, dO, the f32
    // dQ accumulator where the build has dQ shares, lse, delta, dK and dV, of the geometry's
    // shapes, the cumulative lengths, checked by the op, or 0 where the build reads none, and
    // the counter with its 1 + grid ints where the kernel is persistent, else 0) that stream
    // ordering keeps alive until the kernel has run.
    unsafe { launch_struct(ctx.device, &variant, bwd_entries(g.d)[0], grid, &params)? };
    Ok(true)
}

/// The Hopper forward's variant for a call, or `None` where the kernel declines it (for a
/// warm-up: `attention::warmup_fwd`).
pub fn fwd_warmup_variant(
    ctx: &KernelCtx<'_>,
    a: &AttnFwdArgs,
    g: &AttnGeometry,
    b: &AttnBuild,
) -> Result<Option<Variant>> {
    let on = attention_fwd_wgmma(&*tune_table(ctx.device)?);
    if declined(ctx, &[&a.q, &a.k, &a.v], g, b, on, HEAD_DIMS, smem(g.d))?.is_some() {
        return Ok(None);
    }
    variant(b).map(Some)
}

/// The Hopper backward's variants for a call (the dK/dV kernel, and for a deterministic call
/// the dQ pass where it takes it), or none where the kernels decline it (for a warm-up:
/// `attention::warmup_bwd`).
pub fn bwd_warmup_variants(
    ctx: &KernelCtx<'_>,
    a: &AttnBwdArgs,
    g: &AttnGeometry,
    b: &AttnBuild,
) -> Result<Vec<Variant>> {
    let tune = tune_table(ctx.device)?;
    let on = attention_bwd_wgmma(&tune);
    if declined(ctx, &[&a.q, &a.k, &a.v, &a.d_o], g, b, on, HEAD_DIMS, bwd_smem(g.d))?.is_some() {
        return Ok(Vec::new());
    }
    let persistent = attention_bwd_persistent(&tune, g.d);
    let mut v = vec![bwd_variant(b, !a.deterministic, persistent)?];
    if a.deterministic && takes_dq(ctx, a, g, b)? {
        v.push(variant_of(b, true)?);
    }
    Ok(v)
}

/// Whether [`dq`] takes a call (the deterministic path asks before it runs anything).
pub fn takes_dq(ctx: &KernelCtx<'_>, a: &AttnBwdArgs, g: &AttnGeometry, b: &AttnBuild) -> Result<bool> {
    let on = attention_bwd_wgmma(&*tune_table(ctx.device)?);
    let declined = declined(ctx, &[&a.q, &a.k, &a.v, &a.d_o], g, b, on, DQ_HEAD_DIMS, dq_smem(g.d))?;
    if let Some(reason) = &declined {
        tracing::debug!(target: "TE-FL", "{BWD_OP}: Hopper dQ pass declined ({reason}); the mma.sync pass runs");
    }
    Ok(declined.is_none())
}

/// The deterministic backward's dQ on the Hopper dQ pass (`attn_bwd_dq_sm90`) into `dq` (every
/// row a sequence owns; thd rows past the last sequence are the caller's), from the forward's
/// lse and the delta kernel's `delta`; `Ok(false)` when it does not take the call.
pub fn dq(
    ctx: &KernelCtx<'_>,
    a: &AttnBwdArgs,
    g: &AttnGeometry,
    b: &AttnBuild,
    delta: &Tensor,
    dq: &Tensor,
) -> Result<bool> {
    if !takes_dq(ctx, a, g, b)? {
        return Ok(false);
    }
    let (ctas, _counter, sched) = schedule(ctx, g, a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref(), a.scale)?;
    let params = DqParams {
        q: qkv_map(ctx, BWD_OP, &a.q, g, g.sq, g.hq, ROWS)?,
        k: qkv_map(ctx, BWD_OP, &a.k, g, g.sk, g.hk, DQ_KEY_ROWS)?,
        v: qkv_map(ctx, BWD_OP, &a.v, g, g.sk, g.hk, DQ_KEY_ROWS)?,
        d_o: qkv_map(ctx, BWD_OP, &a.d_o, g, g.sq, g.hq, ROWS)?,
        dq: ptr(dq)?,
        lse: ptr(&a.softmax_lse)?,
        delta: ptr(delta)?,
        sched,
    };
    let grid = Grid { blocks: (ctas, 1, 1), threads: (384, 1, 1), smem: dq_smem(g.d) as u32 };
    // SAFETY: `DqParams` is the dQ pass's parameter struct (repr(C), the same field order,
    // 64-byte aligned maps); the maps and pointers address live tensors (q, k, v, dO, dq, lse,
    // delta and the counter with its 1 + grid ints; the cumulative lengths, checked by the op,
    // or 0 where the build reads none) that stream ordering keeps alive until the kernel has run.
    unsafe { launch_struct(ctx.device, &variant_of(b, true)?, DQ_ENTRIES[0], grid, &params)? };
    Ok(true)
}

/// Variants covering every code path (the NVRTC compile test, for sm_90a).
pub fn variants() -> Vec<Variant> {
    use tefl_core::catalogue::AttnMask;
    let mut v = Vec::new();
    for (dtype, d, layout, mask, win) in [
        (DType::BF16, 128, QkvLayout::Bshd, AttnMask::Causal, None),
        (DType::F16, 64, QkvLayout::Sbhd, AttnMask::CausalBottomRight, Some(5)),
        (DType::BF16, 64, QkvLayout::Bshd, AttnMask::None, None),
        // Ragged sequences: thd, and padding masks over bshd.
        (DType::BF16, 128, QkvLayout::Thd, AttnMask::PaddingCausal, None),
        (DType::F16, 64, QkvLayout::Bshd, AttnMask::Padding, None),
    ] {
        let build = AttnBuild { dtype, d, layout, mask, window: (win, win), dropout: false };
        v.extend(variant(&build));
        // The backward's both forms (persistent CTAs or one per key block), each with dQ shares
        // and, for the deterministic path, without; and that path's dQ pass.
        for persistent in [false, true] {
            v.extend(bwd_variant(&build, true, persistent));
            v.extend(bwd_variant(&build, false, persistent));
        }
        v.extend(variant_of(&build, true));
    }
    // Head dim 256: the forward's 64-key tiles and split P·V, the backward's own entry.
    let build = AttnBuild {
        dtype: DType::BF16,
        d: 256,
        layout: QkvLayout::Bshd,
        mask: AttnMask::Causal,
        window: (None, None),
        dropout: false,
    };
    v.extend(variant(&build));
    for persistent in [false, true] {
        v.extend(bwd_variant(&build, true, persistent));
        v.extend(bwd_variant(&build, false, persistent));
    }
    v.extend(variant(&AttnBuild { layout: QkvLayout::Thd, mask: AttnMask::Padding, ..build }));
    v.extend(bwd_variant(&AttnBuild { layout: QkvLayout::Thd, mask: AttnMask::Padding, ..build }, true, true));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's parameter block is laid out as the kernel's: three 128-byte maps, then the
    /// pointers and sizes, the whole a multiple of the maps' 64-byte alignment.
    #[test]
    fn the_parameters_match_the_kernels_layout() {
        let at = |field: usize| std::mem::offset_of!(AttnParams, sched) + field;
        assert_eq!(std::mem::offset_of!(AttnParams, o), 3 * 128);
        assert_eq!(at(std::mem::offset_of!(Schedule, batch)), 3 * 128 + 40);
        assert_eq!(at(std::mem::offset_of!(Schedule, scale)), 3 * 128 + 68);
        assert_eq!(std::mem::size_of::<AttnParams>(), 8 * 64);
    }

    /// The dQ pass's block: four maps, then the pointers and sizes.
    #[test]
    fn the_dq_pass_parameters_match_the_kernels_layout() {
        let at = |field: usize| std::mem::offset_of!(DqParams, sched) + field;
        assert_eq!(std::mem::offset_of!(DqParams, dq), 4 * 128);
        assert_eq!(at(std::mem::offset_of!(Schedule, batch)), 4 * 128 + 48);
        assert_eq!(at(std::mem::offset_of!(Schedule, scale)), 4 * 128 + 76);
        assert_eq!(std::mem::size_of::<DqParams>(), 10 * 64);
    }

    /// The backward's block: five maps, then the pointers and sizes.
    #[test]
    fn the_backward_parameters_match_the_kernels_layout() {
        assert_eq!(std::mem::offset_of!(BwdParams, lse), 5 * 128);
        assert_eq!(std::mem::offset_of!(BwdParams, counter), 5 * 128 + 48);
        assert_eq!(std::mem::offset_of!(BwdParams, batch), 5 * 128 + 56);
        assert_eq!(std::mem::offset_of!(BwdParams, scale), 5 * 128 + 80);
        assert_eq!(std::mem::size_of::<BwdParams>(), 12 * 64);
    }

    #[test]
    fn every_head_dim_fits_hoppers_shared_memory() {
        for f in [smem, bwd_smem] {
            for &d in HEAD_DIMS {
                assert!(f(d) <= 227 * 1024, "head dim {d}: {}", f(d));
            }
            assert!(f(64) < f(128));
        }
        assert!(smem(128) < smem(256));
        for &d in DQ_HEAD_DIMS {
            assert!(dq_smem(d) <= 227 * 1024, "dQ pass, head dim {d}: {}", dq_smem(d));
        }
        assert!(dq_smem(256) > 227 * 1024, "the dQ pass could take head dim 256");
    }
}
