//! Flash attention on CUDA (`attention.cu`): forward and backward, every layout, mask, GQA
//! and window option, dropout from the reference's Philox stream. Tensor-core MMA for
//! f16/bf16, the same tiling with f32 FMAs for f32.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};

use super::{Kernel, blocks_for, cty, empty, i32_of, sm_count, zeros};
use crate::compiler::{Arg, Grid, Source, opt_ptr, ptr};

static SRC: Source = Source { name: "attention", text: include_str!("attention.cu") };

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

/// Checks a kernel's shared memory against the device's per-block limit.
fn check_smem(op: &'static str, ctx: &KernelCtx<'_>, bytes: usize) -> Result<u32> {
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
    let limit = crate::runtime::global()
        .context(ctx.device)
        .ok()
        .and_then(|c| c.attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).ok())
        .map_or(48 * 1024, |v| v.max(0) as usize);
    if bytes > limit {
        return Err(super::unsupported(
            op,
            format!("this head dim and dtype need {bytes} bytes of shared memory per block; the device has {limit}"),
        ));
    }
    Ok(bytes as u32)
}

struct Shape {
    g: AttnGeometry,
    dp: usize,
    kernel: Kernel,
}

impl Shape {
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

#[allow(clippy::too_many_arguments)]
fn setup(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_q: Option<&Tensor>,
    cu_k: Option<&Tensor>,
    layout: QkvLayout,
    mask: AttnMask,
    window: AttnWindow,
    dropout: bool,
) -> Result<Shape> {
    let g = attn_geometry(op, q, k, v, cu_q, cu_k, layout, mask)?;
    if v.shape().last() != Some(&g.d) {
        return Err(super::unsupported(op, format!("the CUDA kernels need v's head dim to be q's ({})", g.d)));
    }
    if g.d > 256 {
        return Err(super::unsupported(op, format!("head dim {} > 256 is not served by the CUDA kernels", g.d)));
    }
    let dp = padded(g.d);
    // The normalised window: every bound left is below sq + sk (checked to fit i32 below).
    let window = g.window(window);
    let win = |w: Option<usize>| w.map_or(-1i64, |x| x.min(i32::MAX as usize) as i64).to_string();
    let kernel = Kernel::new(
        ctx.device,
        &SRC,
        vec![
            ("T", cty(op, "q", q.dtype())?.to_string()),
            ("D", g.d.to_string()),
            ("DP", dp.to_string()),
            ("LAYOUT", (layout as u8).to_string()),
            ("CAUSAL", u8::from(mask.is_causal()).to_string()),
            ("BOTTOM_RIGHT", u8::from(mask.bottom_right()).to_string()),
            ("PADDING", u8::from(mask.is_padding()).to_string()),
            ("WIN_LEFT", win(window.left)),
            ("WIN_RIGHT", win(window.right)),
            ("DROPOUT", u8::from(dropout).to_string()),
            ("FWD_BR", fwd_br(q.dtype(), dp).to_string()),
            ("FWD_BC", fwd_bc(q.dtype(), dp).to_string()),
            ("HALF", u8::from(q.dtype() != DType::F32).to_string()),
            ("FWD_MIN_BLOCKS", crate::heuristics::attention_fwd_min_blocks(super::arch(ctx.device)).to_string()),
            ("DKV_KB", dkv_keys(q.dtype(), dp).to_string()),
            ("DKV_BR", dkv_rows(q.dtype(), dp).to_string()),
            ("DKV_MT", dkv_mtiles(dp).to_string()),
        ],
    );
    for (what, n) in [("q", q.numel()), ("k", k.numel())] {
        i32_of(op, what, n / g.d.max(1))?;
    }
    // Positions plus the diagonal and a window bound stay below 2·(sq + sk) in the kernels.
    i32_of(op, "q", g.sq.saturating_add(g.sk).saturating_mul(2))?;
    Ok(Shape { g, dp, kernel })
}

fn fill(k: &Kernel, ctx: &KernelCtx<'_>, t: &Tensor, v: f32) -> Result<()> {
    let n = t.numel();
    k.launch(
        "fill_f32",
        Grid::linear(blocks_for(n, 256, sm_count(ctx.device) * 8), 256),
        &[Arg::Ptr(ptr(t)?), Arg::U64(n as u64), Arg::F32(v)],
    )
}

fn common_args(s: &Shape, a_scale: f32, p: f32, seed: u64, offset: u64) -> Vec<Arg> {
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

pub fn fused_attn_fwd(ctx: &KernelCtx<'_>, a: &AttnFwdArgs) -> Result<AttnFwdOut> {
    const OP: &str = "fused_attn_fwd";
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let s = setup(OP, ctx, &a.q, &a.k, &a.v, cu_q, cu_k, a.layout, a.mask, a.window, a.dropout_p > 0.0)?;
    let thd = a.layout == QkvLayout::Thd;
    // thd rows past the last sequence belong to none: zero them (and -inf their lse).
    let o =
        if thd { zeros(ctx.device, a.q.shape(), a.q.dtype())? } else { empty(ctx.device, a.q.shape(), a.q.dtype())? };
    let lse = empty(ctx.device, &s.g.lse_shape(), DType::F32)?;
    if thd {
        fill(&s.kernel, ctx, &lse, f32::NEG_INFINITY)?;
    }
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
    s.kernel.launch("attn_fwd", s.tile_grid(s.g.sq, br, s.g.hq, 128, smem), &args)?;
    Ok(AttnFwdOut { o, softmax_lse: lse })
}

pub fn fused_attn_bwd(ctx: &KernelCtx<'_>, a: &AttnBwdArgs) -> Result<AttnBwdOut> {
    const OP: &str = "fused_attn_bwd";
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let s = setup(OP, ctx, &a.q, &a.k, &a.v, cu_q, cu_k, a.layout, a.mask, a.window, a.dropout_p > 0.0)?;
    if a.d_o.dtype() != a.q.dtype() {
        return Err(Error::DType {
            op: OP,
            arg: "d_o",
            got: a.d_o.dtype(),
            expected: format!("{} (that of q)", a.q.dtype()),
        });
    }
    let thd = a.layout == QkvLayout::Thd;
    let dev = ctx.device;
    let rows_heads = a.q.numel() / s.g.d;
    let delta = empty(dev, &[rows_heads], DType::F32)?;
    // dQ is summed over key blocks in f32 by atomics (the delta kernel zeroes it), then scaled
    // and converted; every element is written, rows outside the sequences as zeros.
    let dq_acc = empty(dev, &[a.q.numel()], DType::F32)?;
    let dq = empty(dev, a.q.shape(), a.q.dtype())?;
    let mk = |t: &Tensor| if thd { zeros(dev, t.shape(), t.dtype()) } else { empty(dev, t.shape(), t.dtype()) };
    let (dk, dv) = (mk(&a.k)?, mk(&a.v)?);
    s.kernel.launch(
        "attn_bwd_delta",
        Grid::linear((rows_heads * 32).div_ceil(256).max(1) as u32, 256),
        &[
            Arg::Ptr(ptr(&a.o)?),
            Arg::Ptr(ptr(&a.d_o)?),
            Arg::Ptr(ptr(&delta)?),
            Arg::Ptr(ptr(&dq_acc)?),
            Arg::U64(rows_heads as u64),
        ],
    )?;
    let elem = a.q.dtype().size_in_bytes();
    let ld = s.dp + 16 / elem;
    let inputs = [
        Arg::Ptr(ptr(&a.q)?),
        Arg::Ptr(ptr(&a.k)?),
        Arg::Ptr(ptr(&a.v)?),
        Arg::Ptr(ptr(&a.d_o)?),
        Arg::Ptr(ptr(&a.softmax_lse)?),
        Arg::Ptr(ptr(&delta)?),
    ];
    let mut args = inputs.to_vec();
    args.extend([Arg::Ptr(ptr(&dk)?), Arg::Ptr(ptr(&dv)?), Arg::Ptr(ptr(&dq_acc)?)]);
    args.push(Arg::Ptr(opt_ptr(cu_q)?));
    args.push(Arg::Ptr(opt_ptr(cu_k)?));
    args.extend(common_args(&s, a.scale, a.dropout_p, a.seed, a.offset));
    // K, V; two stages of Q and dO; two stages of lse and delta; per key, br (padded) elements
    // for P^T handed from the dV to the dK warps and then dS^T; f32 builds also stage P and dS
    // in a tile of their own.
    let (kb, br) = (dkv_keys(a.q.dtype(), s.dp), dkv_rows(a.q.dtype(), s.dp));
    let (own_tile, stages) = if a.q.dtype() == DType::F32 { (kb * (br + 16 / elem), 1) } else { (0, 2) };
    let handover = kb * (br + 16 / elem);
    let smem =
        check_smem(OP, ctx, ((2 * kb + 2 * stages * br) * ld + handover + own_tile) * elem + 2 * stages * br * 4)?;
    // A dV and a dK warp per 16 DKV_MT keys.
    let threads = (2 * kb / (16 * dkv_mtiles(s.dp)) * 32) as u32;
    s.kernel.launch("attn_bwd_dkdv", s.tile_grid(s.g.sk, kb, s.g.hk, threads, smem), &args)?;
    let n = a.q.numel();
    s.kernel.launch(
        "attn_bwd_dq_out",
        Grid::linear(blocks_for(n, 256, sm_count(dev) * 8), 256),
        &[Arg::Ptr(ptr(&dq_acc)?), Arg::Ptr(ptr(&dq)?), Arg::U64(n as u64), Arg::F32(a.scale)],
    )?;
    Ok(AttnBwdOut { dq, dk, dv })
}

/// Define sets covering every code path (the NVRTC compile test and cache warm-up).
pub fn compile_variants() -> Vec<(&'static Source, Vec<(&'static str, String)>)> {
    let mut v = Vec::new();
    for (t, d) in [("bf16", 128), ("f16", 64), ("float", 64), ("bf16", 8), ("float", 40), ("f16", 256), ("float", 256)]
    {
        let dtype = if t == "float" { DType::F32 } else { DType::BF16 };
        for (layout, causal, br, padding, win, drop) in
            [(0, 1, 0, 0, -1, 0), (1, 1, 1, 0, 5, 1), (2, 0, 0, 1, 3, 1), (0, 0, 0, 1, -1, 0)]
        {
            v.push((
                &SRC,
                vec![
                    ("T", t.to_string()),
                    ("D", d.to_string()),
                    ("DP", padded(d).to_string()),
                    ("LAYOUT", layout.to_string()),
                    ("CAUSAL", causal.to_string()),
                    ("BOTTOM_RIGHT", br.to_string()),
                    ("PADDING", padding.to_string()),
                    ("WIN_LEFT", win.to_string()),
                    ("WIN_RIGHT", win.to_string()),
                    ("DROPOUT", drop.to_string()),
                    ("FWD_BR", fwd_br(dtype, padded(d)).to_string()),
                    ("FWD_BC", fwd_bc(dtype, padded(d)).to_string()),
                    ("HALF", if t == "float" { "0" } else { "1" }.to_string()),
                    ("FWD_MIN_BLOCKS", "2".to_string()),
                    ("DKV_KB", dkv_keys(dtype, padded(d)).to_string()),
                    ("DKV_BR", dkv_rows(dtype, padded(d)).to_string()),
                    ("DKV_MT", dkv_mtiles(padded(d)).to_string()),
                ],
            ));
        }
    }
    v
}
