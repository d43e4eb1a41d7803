//! `fused_attn_fwd` on any SIMT target: the portable flash-attention kernel of
//! `simt/attention.cu` (shared-memory key tiles, online softmax, one query row per thread),
//! with the geometry, masks and windows of the catalogue's `attn_geometry` and the sequence and
//! dropout helpers every attention kernel shares. No sq × sk buffer.

use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result};

use super::host::{Arg, Grid, OnDevice, blocks_for, cty, empty, i32_of, opt_ptr, ptr, sm_count, unsupported, zeros};
use crate::{Defines, Variant};

/// The kernels of `simt/attention.cu` these ops launch.
const ENTRIES: &[&str] = &["attn_fwd_simt", "fill_f32_simt"];
/// Query rows per block (one per thread; a whole number of 64-lane wavefronts).
const BR: usize = 64;
/// The largest head dim served (the row's q and accumulator are registers).
const MAX_D: usize = 256;

/// Keys per tile (`BC`): the K and V tiles in f32 stay within 32 KB of shared memory.
fn keys_per_tile(d: usize) -> usize {
    if d <= 128 { 32 } else { 16 }
}

/// What a variant's defines come from.
struct Build {
    dtype: DType,
    d: usize,
    layout: QkvLayout,
    mask: AttnMask,
    /// The normalised window bounds (`None`: unbounded).
    window: (Option<usize>, Option<usize>),
    dropout: bool,
}

/// The variant of `simt/attention.cu` for a build (launches and the compile tests).
fn variant(op: &'static str, b: &Build) -> Result<Variant> {
    let win = |w: Option<usize>| w.map_or(-1i64, |x| x.min(i32::MAX as usize) as i64);
    let defines = Defines::new()
        .set("T", cty(op, "q", b.dtype)?)
        .set("D", b.d)
        .set("BR", BR)
        .set("BC", keys_per_tile(b.d))
        .set("LAYOUT", b.layout as u8)
        .flag("CAUSAL", b.mask.is_causal())
        .flag("BOTTOM_RIGHT", b.mask.bottom_right())
        .flag("PADDING", b.mask.is_padding())
        .set("WIN_LEFT", win(b.window.0))
        .set("WIN_RIGHT", win(b.window.1))
        .flag("DROPOUT", b.dropout);
    Ok(Variant::new(&tefl_kernels::ATTENTION_SIMT, ENTRIES, defines))
}

/// `fused_attn_fwd` with the portable kernel.
pub fn fused_attn_fwd(ctx: &KernelCtx<'_>, a: &AttnFwdArgs) -> Result<AttnFwdOut> {
    const OP: &str = "fused_attn_fwd";
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let g = attn_geometry(OP, &a.q, &a.k, &a.v, cu_q, cu_k, a.layout, a.mask)?;
    if a.v.shape().last() != Some(&g.d) {
        return Err(unsupported(ctx, OP, format!("the portable kernel needs v's head dim to be q's ({})", g.d)));
    }
    if g.d > MAX_D {
        return Err(unsupported(ctx, OP, format!("head dim {} > {MAX_D} is not served by the portable kernel", g.d)));
    }
    for (what, n) in [("q", a.q.numel()), ("k", a.k.numel())] {
        i32_of(ctx, OP, what, n / g.d.max(1))?;
    }
    // Positions plus the diagonal and a window bound stay below 2·(sq + sk) in the kernel.
    i32_of(ctx, OP, "q", g.sq.saturating_add(g.sk).saturating_mul(2))?;
    let window = g.window(a.window);
    let build = Build {
        dtype: a.q.dtype(),
        d: g.d,
        layout: a.layout,
        mask: a.mask,
        window: (window.left, window.right),
        dropout: a.dropout_p > 0.0,
    };
    let kernel = OnDevice::new(ctx.device, variant(OP, &build)?)?;
    let thd = a.layout == QkvLayout::Thd;
    // thd rows past the last sequence belong to none: zero them (and -inf their lse).
    let o =
        if thd { zeros(ctx.device, a.q.shape(), a.q.dtype())? } else { empty(ctx.device, a.q.shape(), a.q.dtype())? };
    let lse = empty(ctx.device, &g.lse_shape(), DType::F32)?;
    if thd {
        let n = lse.numel();
        kernel.launch(
            "fill_f32_simt",
            Grid::linear(blocks_for(n, 256, sm_count(ctx.device) * 8), 256),
            &[Arg::Ptr(ptr(&lse)?), Arg::U64(n as u64), Arg::F32(f32::NEG_INFINITY)],
        )?;
    }
    if g.batch == 0 || g.sq == 0 || g.hq == 0 {
        return Ok(AttnFwdOut { o, softmax_lse: lse });
    }
    let args = [
        Arg::Ptr(ptr(&a.q)?),
        Arg::Ptr(ptr(&a.k)?),
        Arg::Ptr(ptr(&a.v)?),
        Arg::Ptr(ptr(&o)?),
        Arg::Ptr(ptr(&lse)?),
        Arg::Ptr(opt_ptr(cu_q)?),
        Arg::Ptr(opt_ptr(cu_k)?),
        Arg::I32(g.batch as i32),
        Arg::I32(g.sq as i32),
        Arg::I32(g.sk as i32),
        Arg::I32(g.hq as i32),
        Arg::I32(g.hk as i32),
        Arg::I32(g.tq as i32),
        Arg::F32(a.scale),
        Arg::F32(a.dropout_p),
        Arg::U64(a.seed),
        Arg::U64(a.offset),
    ];
    let grid =
        Grid { blocks: (g.sq.div_ceil(BR) as u32, g.hq as u32, g.batch as u32), threads: (BR as u32, 1, 1), smem: 0 };
    kernel.launch("attn_fwd_simt", grid, &args)?;
    Ok(AttnFwdOut { o, softmax_lse: lse })
}

/// Variants covering every code path: each dtype, small and large head dims, every layout
/// and mask kind, windows and dropout (the compile tests).
pub fn variants() -> Vec<Variant> {
    use DType::{BF16, F16, F32};
    let mut v = Vec::new();
    for (dtype, d) in [(BF16, 128), (F16, 64), (F32, 40), (BF16, 256)] {
        for (layout, mask, win, dropout) in [
            (QkvLayout::Bshd, AttnMask::Causal, None, false),
            (QkvLayout::Sbhd, AttnMask::CausalBottomRight, Some(5), true),
            (QkvLayout::Thd, AttnMask::Padding, Some(3), true),
            (QkvLayout::Bshd, AttnMask::None, None, false),
        ] {
            let build = Build { dtype, d, layout, mask, window: (win, win), dropout };
            v.extend(variant("attention", &build));
        }
    }
    v
}
