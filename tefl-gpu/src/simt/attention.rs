//! `fused_attn_fwd` and `fused_attn_bwd` on any SIMT target: the portable flash-attention
//! kernels of `simt/attention.cu` (shared-memory tiles, online softmax forward; a backward that
//! recomputes P from lse, with dK/dV per key row and dQ per query row, no atomics), with the
//! geometry, masks and windows of the catalogue's `attn_geometry` and the sequence and dropout
//! helpers every attention kernel shares. No sq × sk buffer.

use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use super::host::{Arg, Grid, OnDevice, blocks_for, cty, empty, i32_of, opt_ptr, ptr, sm_count, unsupported, zeros};
use crate::{Defines, Variant};

/// The kernels of `simt/attention.cu` these ops launch.
const ENTRIES: &[&str] =
    &["attn_fwd_simt", "fill_f32_simt", "attn_bwd_delta_simt", "attn_bwd_dkdv_simt", "attn_bwd_dq_simt"];
/// Query rows per block (one per thread; a whole number of 64-lane wavefronts).
const BR: usize = 64;
/// The largest head dim served (the row's q and accumulator are registers).
const MAX_D: usize = 256;

/// Keys per tile (`BC`): the K and V tiles in f32 stay within 32 KB of shared memory.
fn keys_per_tile(d: usize) -> usize {
    if d <= 128 { 32 } else { 16 }
}

/// One attention call's kernel build: the dtype, head dim, layout, mask, window and dropout
/// every attention kernel's defines start with (this SIMT kernel and CUDA's tensor-core one).
#[derive(Clone, Copy, Debug)]
pub struct AttnBuild {
    /// The dtype of q, k and v.
    pub dtype: DType,
    /// The head dim.
    pub d: usize,
    /// The layout of q, k and v.
    pub layout: QkvLayout,
    /// The mask.
    pub mask: AttnMask,
    /// The normalised window bounds (`None`: unbounded).
    pub window: (Option<usize>, Option<usize>),
    /// Whether dropout is applied.
    pub dropout: bool,
}

impl AttnBuild {
    /// The geometry and build of a call, after the checks every attention kernel of tefl's
    /// needs: v's head dim is q's, the head dim is at most `max_d`, and rows and positions fit
    /// `i32` (positions plus the diagonal and a window bound stay below 2·(sq + sk) in the
    /// kernels). A call past them is [`Error::Unsupported`](tefl_core::Error::Unsupported)
    /// naming `kernels` (e.g. "the portable kernels"). `(max, defer)`: the sequence-length
    /// bounds to check the lengths against (the call's, or none) and whether the geometry may
    /// leave thd spans on the device (`attn_geometry_bounded`'s `defer`: only for kernels that
    /// stay inside the tensors whatever cu_seqlens hold).
    pub fn checked(
        op: &'static str,
        ctx: &KernelCtx<'_>,
        call: &AttnQkv<'_>,
        max_d: usize,
        kernels: &str,
        (max, defer): (MaxSeqlen, bool),
    ) -> Result<(AttnGeometry, AttnBuild)> {
        let AttnQkv { q, k, v, layout, mask, .. } = *call;
        let g = AttnQkv { max, ..*call }.geometry(op, defer)?;
        if v.shape().last() != Some(&g.d) {
            return Err(unsupported(ctx, op, format!("{kernels} need v's head dim to be q's ({})", g.d)));
        }
        if g.d > max_d {
            return Err(unsupported(ctx, op, format!("head dim {} > {max_d} is not served by {kernels}", g.d)));
        }
        for (what, n) in [("q", q.numel()), ("k", k.numel())] {
            i32_of(ctx, op, what, n / g.d.max(1))?;
        }
        i32_of(ctx, op, "q", g.sq.saturating_add(g.sk).saturating_mul(2))?;
        let window = g.window(call.window);
        let build = AttnBuild {
            dtype: q.dtype(),
            d: g.d,
            layout,
            mask,
            window: (window.left, window.right),
            dropout: call.dropout(),
        };
        Ok((g, build))
    }

    /// The defines of the shared mask and sequence helpers (`shared/attention_mask.h`): `T`,
    /// `D`, `LAYOUT`, the mask flags, `WIN_LEFT`/`WIN_RIGHT` (-1: unbounded) and `DROPOUT`.
    pub fn defines(&self, op: &'static str) -> Result<Defines> {
        let win = |w: Option<usize>| w.map_or(-1i64, |x| x.min(i32::MAX as usize) as i64);
        Ok(Defines::new()
            .set("T", cty(op, "q", self.dtype)?)
            .set("D", self.d)
            .set("LAYOUT", self.layout as u8)
            .flag("CAUSAL", self.mask.is_causal())
            .flag("BOTTOM_RIGHT", self.mask.bottom_right())
            .flag("PADDING", self.mask.is_padding())
            .set("WIN_LEFT", win(self.window.0))
            .set("WIN_RIGHT", win(self.window.1))
            .flag("DROPOUT", self.dropout))
    }
}

/// The variant of `simt/attention.cu` for a build (launches and the compile tests).
fn variant(op: &'static str, b: &AttnBuild) -> Result<Variant> {
    let defines = b.defines(op)?.set("BR", BR).set("BC", keys_per_tile(b.d));
    Ok(Variant::new(&tefl_kernels::ATTENTION_SIMT, ENTRIES, defines))
}

/// One call's geometry and the variant it launches.
struct Plan {
    g: AttnGeometry,
    kernel: OnDevice,
}

impl Plan {
    /// A block of BR threads per BR positions of `rows`, per head (of `heads`) and sequence.
    fn grid(&self, rows: usize, heads: usize) -> Grid {
        Grid {
            blocks: (rows.div_ceil(BR) as u32, heads as u32, self.g.batch as u32),
            threads: (BR as u32, 1, 1),
            smem: 0,
        }
    }

    /// The arguments after the pointers: sizes, scale and dropout.
    fn common_args(&self, scale: f32, p: f32, seed: u64, offset: u64) -> [Arg; 10] {
        let g = &self.g;
        [
            Arg::I32(g.batch as i32),
            Arg::I32(g.sq as i32),
            Arg::I32(g.sk as i32),
            Arg::I32(g.hq as i32),
            Arg::I32(g.hk as i32),
            Arg::I32(g.tq as i32),
            Arg::F32(scale),
            Arg::F32(p),
            Arg::U64(seed),
            Arg::U64(offset),
        ]
    }
}

fn setup(op: &'static str, ctx: &KernelCtx<'_>, call: &AttnQkv<'_>) -> Result<Plan> {
    // The lengths are read and checked on the host (these kernels trust them).
    let read = (MaxSeqlen::default(), false);
    let (g, build) = AttnBuild::checked(op, ctx, call, MAX_D, "the portable kernels", read)?;
    let kernel = OnDevice::new(ctx.device, variant(op, &build)?)?;
    Ok(Plan { g, kernel })
}

fn fill(ctx: &KernelCtx<'_>, kernel: &OnDevice, t: &Tensor, x: f32) -> Result<()> {
    let n = t.numel();
    kernel.launch(
        "fill_f32_simt",
        Grid::linear(blocks_for(n, 256, sm_count(ctx.device) * 8), 256),
        &[Arg::Ptr(ptr(t)?), Arg::U64(n as u64), Arg::F32(x)],
    )
}

/// `fused_attn_fwd` with the portable kernel.
pub fn fused_attn_fwd(ctx: &KernelCtx<'_>, a: &AttnFwdArgs) -> Result<AttnFwdOut> {
    const OP: &str = "fused_attn_fwd";
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let plan = setup(OP, ctx, &a.qkv())?;
    let (g, kernel) = (&plan.g, &plan.kernel);
    // thd rows past the last sequence belong to none: zero them (and -inf their lse); the
    // kernel writes every row of every sequence.
    let tail = g.has_rows_past_sequences(false, a.q.shape()[0]);
    let o =
        if tail { zeros(ctx.device, a.q.shape(), a.q.dtype())? } else { empty(ctx.device, a.q.shape(), a.q.dtype())? };
    let lse = empty(ctx.device, &g.lse_shape(), DType::F32)?;
    if tail {
        fill(ctx, kernel, &lse, f32::NEG_INFINITY)?;
    }
    if g.batch == 0 || g.sq == 0 || g.hq == 0 {
        return Ok(AttnFwdOut { o, softmax_lse: lse });
    }
    let mut args = vec![
        Arg::Ptr(ptr(&a.q)?),
        Arg::Ptr(ptr(&a.k)?),
        Arg::Ptr(ptr(&a.v)?),
        Arg::Ptr(ptr(&o)?),
        Arg::Ptr(ptr(&lse)?),
        Arg::Ptr(opt_ptr(cu_q)?),
        Arg::Ptr(opt_ptr(cu_k)?),
    ];
    args.extend(plan.common_args(a.scale, a.dropout_p, a.seed, a.offset));
    kernel.launch("attn_fwd_simt", plan.grid(g.sq, g.hq), &args)?;
    Ok(AttnFwdOut { o, softmax_lse: lse })
}

/// `fused_attn_bwd` with the portable kernels: delta = Σ dO·O, then dK/dV per key row and dQ
/// per query row (each recomputing P from lse).
pub fn fused_attn_bwd(ctx: &KernelCtx<'_>, a: &AttnBwdArgs) -> Result<AttnBwdOut> {
    const OP: &str = "fused_attn_bwd";
    let (cu_q, cu_k) = (a.cu_seqlens_q.as_ref(), a.cu_seqlens_kv.as_ref());
    let plan = setup(OP, ctx, &a.qkv())?;
    if a.d_o.dtype() != a.q.dtype() {
        return Err(tefl_core::Error::DType {
            op: OP,
            arg: "d_o",
            got: a.d_o.dtype(),
            expected: format!("{} (that of q)", a.q.dtype()),
        });
    }
    let (g, kernel, dev) = (&plan.g, &plan.kernel, ctx.device);
    // thd rows outside every sequence get zero gradients; the kernels write every row of every
    // sequence.
    let tail = g.has_rows_past_sequences(false, a.q.shape()[0]) || g.has_rows_past_sequences(true, a.k.shape()[0]);
    let out = |t: &Tensor| if tail { zeros(dev, t.shape(), t.dtype()) } else { empty(dev, t.shape(), t.dtype()) };
    let (dq, dk, dv) = (out(&a.q)?, out(&a.k)?, out(&a.v)?);
    let rows_heads = a.q.numel() / g.d.max(1);
    if rows_heads == 0 || g.batch == 0 {
        return Ok(AttnBwdOut { dq, dk, dv });
    }
    let delta = empty(dev, &[rows_heads], DType::F32)?;
    kernel.launch(
        "attn_bwd_delta_simt",
        Grid::linear(blocks_for(rows_heads, 256, sm_count(dev) * 8), 256),
        &[Arg::Ptr(ptr(&a.o)?), Arg::Ptr(ptr(&a.d_o)?), Arg::Ptr(ptr(&delta)?), Arg::U64(rows_heads as u64)],
    )?;
    let inputs = [
        Arg::Ptr(ptr(&a.q)?),
        Arg::Ptr(ptr(&a.k)?),
        Arg::Ptr(ptr(&a.v)?),
        Arg::Ptr(ptr(&a.d_o)?),
        Arg::Ptr(ptr(&a.softmax_lse)?),
        Arg::Ptr(ptr(&delta)?),
    ];
    let tail = plan.common_args(a.scale, a.dropout_p, a.seed, a.offset);
    let mut args = inputs.to_vec();
    args.extend([Arg::Ptr(ptr(&dk)?), Arg::Ptr(ptr(&dv)?), Arg::Ptr(opt_ptr(cu_q)?), Arg::Ptr(opt_ptr(cu_k)?)]);
    args.extend(tail);
    kernel.launch("attn_bwd_dkdv_simt", plan.grid(g.sk, g.hk), &args)?;
    let mut args = inputs.to_vec();
    args.extend([Arg::Ptr(ptr(&dq)?), Arg::Ptr(opt_ptr(cu_q)?), Arg::Ptr(opt_ptr(cu_k)?)]);
    args.extend(tail);
    kernel.launch("attn_bwd_dq_simt", plan.grid(g.sq, g.hq), &args)?;
    Ok(AttnBwdOut { dq, dk, dv })
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
            let build = AttnBuild { dtype, d, layout, mask, window: (win, win), dropout };
            v.extend(variant("attention", &build));
        }
    }
    v
}
