//! RMSNorm and LayerNorm on Vulkan: forward and backward, a workgroup per row (two for a
//! 16-bit output row of odd length). The backward writes dx and per-workgroup partial column
//! sums of dy·x̂ and dy into an f32 workspace, which a last pass sums into dgamma and dbeta
//! (gamma's dtype).
//!
//! An FP8 output (TE's norm with a quantizer) is the f32 rows cast by the FP8 shader's quantize
//! stage in a second dispatch.
//!
//! Two shaders: `norm_vec.wgsl` where every tensor of the op is one 16-bit dtype and rows are
//! whole 16-byte chunks (the training case; the backward also needs rows of at most 32·WG
//! elements, whose column partials each invocation keeps), with 16-byte loads and subgroup
//! reductions; `norm.wgsl` for everything else (any mix of dtypes, odd lengths), element by
//! element.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};

use super::{MAX_GROUPS, dtype_code};
use crate::gpu::{Binding, gpu};

/// Bytes of the shader's push constants (fourteen 32-bit fields).
const PUSH_BYTES: u32 = 56;
/// The workgroups (rows of partial column sums) of a backward: two per SM where the device says
/// how many it has (one wave; on the H100, 16384×8192 bf16 took 0.387 ms with 264, 0.431 with
/// 528, 0.517 with 1024 and 0.546 with 132), else at most MAX_PARTS ...
const PARTS_PER_SM: usize = 2;
const MAX_PARTS: usize = 1024;
/// ... while the partial sums (2 · parts · n f32) stay within 64 MiB.
const PARTS_BYTES: usize = 64 << 20;

/// 16-byte chunks of a row each invocation of the `norm_vec` backward owns (its `CH`).
const VEC_BWD_CHUNKS: usize = 4;

/// The `norm_vec` variant for an op whose tensors all have dtype `dtypes[0]` (the others must
/// match), with rows of `n`, on a workgroup of `wg`, for `bwd` 0 (forward), 1 (RMSNorm backward)
/// or 2 (LayerNorm backward): `None` where the general shader must run.
fn vec_variant(gpu: &crate::gpu::Gpu, dtypes: &[DType], n: usize, wg: u32, bwd: u8) -> Option<String> {
    let tx = super::half_name(dtypes[0])?;
    let backward = bwd != 0;
    let fits = n >= 8 && n.is_multiple_of(8) && (!backward || n / 8 <= wg as usize * VEC_BWD_CHUNKS);
    let same = dtypes.iter().all(|&d| d == dtypes[0]);
    (fits && same && gpu.reduces_in_subgroups(wg)).then(|| format!("norm_vec.tx={tx}.bwd={bwd}.wg={wg}"))
}

/// Every field of the shader's `Params`.
#[derive(Default, Clone, Copy)]
struct Params {
    stage: u32,
    rows: u32,
    n: u32,
    rpg: u32,
    tx: u32,
    tg: u32,
    ta: u32,
    tadd: u32,
    to: u32,
    zero_centered: u32,
    has_add: u32,
    parts: u32,
    ws_offset: u32,
    eps: f32,
}

impl Params {
    fn bytes(&self) -> Vec<u8> {
        let ints = [
            self.stage,
            self.rows,
            self.n,
            self.rpg,
            self.tx,
            self.tg,
            self.ta,
            self.tadd,
            self.to,
            self.zero_centered,
            self.has_add,
            self.parts,
            self.ws_offset,
        ];
        let mut v: Vec<u8> = ints.iter().flat_map(|i| i.to_le_bytes()).collect();
        v.extend_from_slice(&self.eps.to_le_bytes());
        v
    }
}

/// The tensors bound to the shader (`x`, `gamma`, aux (beta or dy), add, mu, rsigma, out, ws);
/// an absent aux or add is bound as `x`, an absent mu as rsigma, an absent ws as `out` (which
/// holds at least one 16-byte unit where `norm_vec.wgsl` reads ws as such).
struct Binds<'a> {
    x: &'a Tensor,
    gamma: &'a Tensor,
    aux: Option<&'a Tensor>,
    add: Option<&'a Tensor>,
    mu: Option<&'a Tensor>,
    rs: &'a Tensor,
    out: &'a Tensor,
    ws: Option<&'a Tensor>,
}

impl Binds<'_> {
    fn bindings(&self, out: Option<&Tensor>) -> Result<[Binding; 8]> {
        let b = super::binding;
        Ok([
            b(self.x)?,
            b(self.gamma)?,
            b(self.aux.unwrap_or(self.x))?,
            b(self.add.unwrap_or(self.x))?,
            b(self.mu.unwrap_or(self.rs))?,
            b(self.rs)?,
            b(out.unwrap_or(self.out))?,
            b(self.ws.unwrap_or(self.out))?,
        ])
    }
}

fn too_big(op: &'static str, ctx: &KernelCtx<'_>, what: usize) -> Error {
    Error::Unsupported {
        op,
        impl_id: ctx.impl_id.to_string(),
        reason: format!("{what} elements; the Vulkan shaders index with 32 bits"),
    }
}

fn rpg(out: DType, n: usize) -> usize {
    if out != DType::F32 && n % 2 == 1 { 2 } else { 1 }
}

#[allow(clippy::too_many_arguments)]
fn forward(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    layer: bool,
    x: &Tensor,
    gamma: &Tensor,
    beta: Option<&Tensor>,
    eps: f32,
    zero_centered: bool,
    out_dtype: DType,
) -> Result<(Tensor, Option<Tensor>, Tensor)> {
    let (rows, n) = (x.rows(), x.last_dim());
    let y = Tensor::uninit(x.shape(), out_dtype, &ctx.device)?;
    let mu = if layer { Some(Tensor::uninit([rows], DType::F32, &ctx.device)?) } else { None };
    let rsigma = Tensor::uninit([rows], DType::F32, &ctx.device)?;
    if rows == 0 {
        return Ok((y, mu, rsigma));
    }
    if x.numel() >= (1usize << 31) {
        return Err(too_big(op, ctx, x.numel()));
    }
    let rpg = rpg(out_dtype, n);
    let p = Params {
        stage: u32::from(layer),
        rows: rows as u32,
        n: n as u32,
        rpg: rpg as u32,
        tx: dtype_code(op, "x", x.dtype())?,
        tg: dtype_code(op, "gamma", gamma.dtype())?,
        ta: beta.map(|b| dtype_code(op, "beta", b.dtype())).transpose()?.unwrap_or(0),
        to: dtype_code(op, "out_dtype", out_dtype)?,
        zero_centered: u32::from(zero_centered),
        eps,
        ..Default::default()
    };
    let binds = Binds { x, gamma, aux: beta, add: None, mu: mu.as_ref(), rs: &rsigma, out: &y, ws: None };
    let wg = crate::heuristics::elementwise_workgroup(ctx.device)?;
    let gpu = gpu(ctx.device)?;
    let dtypes = [x.dtype(), gamma.dtype(), beta.map_or(x.dtype(), Tensor::dtype), out_dtype];
    let name = vec_variant(&gpu, &dtypes, n, wg, 0).unwrap_or_else(|| format!("norm.wg={wg}"));
    let pipeline = gpu.pipeline(&name, 8, PUSH_BYTES)?;
    let bindings = binds.bindings(None)?;
    let groups = (rows.div_ceil(rpg) as u32).clamp(1, MAX_GROUPS);
    gpu.run(|r| r.dispatch(&pipeline, &bindings, &p.bytes(), (groups, 1, 1)))?;
    Ok((y, mu, rsigma))
}

/// The backward's outputs: dx, dgamma and (LayerNorm) dbeta.
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
    zero_centered: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let layer = mu.is_some();
    let (rows, n) = (x.rows(), x.last_dim());
    let dev = ctx.device;
    let dx = Tensor::uninit(x.shape(), x.dtype(), &dev)?;
    if rows == 0 || n == 0 {
        let dgamma = Tensor::zeros(gamma.shape(), gamma.dtype(), &dev)?;
        let dbeta = if layer { Some(Tensor::zeros(gamma.shape(), gamma.dtype(), &dev)?) } else { None };
        return Ok((dx, dgamma, dbeta));
    }
    if x.numel() >= (1usize << 31) {
        return Err(too_big(op, ctx, x.numel()));
    }
    let dgamma = Tensor::uninit(gamma.shape(), gamma.dtype(), &dev)?;
    let dbeta = if layer { Some(Tensor::uninit(gamma.shape(), gamma.dtype(), &dev)?) } else { None };
    let rpg = rpg(x.dtype(), n);
    let gpu = gpu(dev)?;
    let wave = gpu.physical.compute_units.map_or(MAX_PARTS, |sms| PARTS_PER_SM * sms as usize);
    let parts = rows.div_ceil(rpg).min(wave.min(MAX_PARTS)).min((PARTS_BYTES / (8 * n)).max(64));
    if 2 * parts * n >= (1usize << 31) {
        return Err(too_big(op, ctx, 2 * parts * n));
    }
    let ws = Tensor::uninit([2, parts, n], DType::F32, &dev)?;
    let p = Params {
        stage: if layer { 3 } else { 2 },
        rows: rows as u32,
        n: n as u32,
        rpg: rpg as u32,
        tx: dtype_code(op, "x", x.dtype())?,
        tg: dtype_code(op, "gamma", gamma.dtype())?,
        ta: dtype_code(op, "dy", dy.dtype())?,
        tadd: add.map(|a| dtype_code(op, "add", a.dtype())).transpose()?.unwrap_or(0),
        to: dtype_code(op, "x", x.dtype())?,
        zero_centered: u32::from(zero_centered),
        has_add: u32::from(add.is_some()),
        parts: parts as u32,
        ..Default::default()
    };
    let binds = Binds { x, gamma, aux: Some(dy), add, mu, rs: rsigma, out: &dx, ws: Some(&ws) };
    let wg = crate::heuristics::elementwise_workgroup(ctx.device)?;
    let pipeline = gpu.pipeline(&format!("norm.wg={wg}"), 8, PUSH_BYTES)?;
    let dtypes = [x.dtype(), gamma.dtype(), dy.dtype(), add.map_or(x.dtype(), Tensor::dtype)];
    let rows_pipeline = match vec_variant(&gpu, &dtypes, n, wg, if layer { 2 } else { 1 }) {
        Some(name) => gpu.pipeline(&name, 8, PUSH_BYTES)?,
        None => pipeline.clone(),
    };
    let main = binds.bindings(None)?;
    let finish = |offset: usize| Params { stage: 4, to: p.tg, ws_offset: offset as u32, ..p };
    let to_dgamma = binds.bindings(Some(&dgamma))?;
    let to_dbeta = dbeta.as_ref().map(|b| binds.bindings(Some(b))).transpose()?;
    // Stage 4: a workgroup per WG/8 output words, 8 invocations summing each word's parts.
    let per_word = if gamma.dtype() == DType::F32 { 1 } else { 2 };
    let col_groups = (n.div_ceil(per_word) as u32).div_ceil(wg / 8).clamp(1, MAX_GROUPS);
    gpu.run(|r| {
        r.dispatch(&rows_pipeline, &main, &p.bytes(), (parts as u32, 1, 1))?;
        r.dispatch(&pipeline, &to_dgamma, &finish(0).bytes(), (col_groups, 1, 1))?;
        if let Some(b) = &to_dbeta {
            r.dispatch(&pipeline, b, &finish(parts * n).bytes(), (col_groups, 1, 1))?;
        }
        Ok(())
    })?;
    Ok((dx, dgamma, dbeta))
}

/// The dtype a forward's shader writes: `out`, or f32 for an FP8 output, which [`quantized`]
/// then casts.
fn shader_out(out: DType) -> DType {
    if out.is_fp8() { DType::F32 } else { out }
}

/// A forward's output: a float `y` as the shader wrote it; for an FP8 `out` (TE's norm with a
/// quantizer) the f32 rows cast by the FP8 shader's quantize stage ([`super::fp8::quantize`]:
/// codes of y·scale with saturating round-to-nearest-even, amax of y before scaling, scale_inv =
/// 1/scale), as the reference computes it. A second dispatch after the norm's, and an f32
/// buffer between them, where CUDA and HIP fuse the two into one pass.
fn quantized(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    y: Tensor,
    out: DType,
    scale: Option<&Tensor>,
) -> Result<(Tensor, Option<Tensor>, Option<Tensor>)> {
    if !out.is_fp8() {
        return Ok((y, None, None));
    }
    let scale = scale.ok_or_else(|| Error::invalid(op, "scale", "required with an FP8 out_dtype"))?;
    let args = QuantizeArgs { x: y, scale: scale.clone(), fp8_dtype: out, want_transpose: false };
    let q = super::fp8::quantize(ctx, &args)?;
    Ok((q.q, Some(q.amax), Some(q.scale_inv)))
}

/// `rmsnorm_fwd`.
pub fn rmsnorm_fwd(ctx: &KernelCtx<'_>, a: &RmsNormFwdArgs) -> Result<RmsNormFwdOut> {
    const OP: &str = "rmsnorm_fwd";
    let (y, _, rsigma) =
        forward(OP, ctx, false, &a.x, &a.gamma, None, a.eps, a.zero_centered_gamma, shader_out(a.out_dtype))?;
    let (y, amax, scale_inv) = quantized(OP, ctx, y, a.out_dtype, a.scale.as_ref())?;
    Ok(RmsNormFwdOut { y, rsigma, amax, scale_inv })
}

/// `layernorm_fwd`.
pub fn layernorm_fwd(ctx: &KernelCtx<'_>, a: &LayerNormFwdArgs) -> Result<LayerNormFwdOut> {
    const OP: &str = "layernorm_fwd";
    let out = shader_out(a.out_dtype);
    let (y, mu, rsigma) = forward(OP, ctx, true, &a.x, &a.gamma, Some(&a.beta), a.eps, a.zero_centered_gamma, out)?;
    let mu = mu.ok_or_else(|| Error::Tensor("layernorm_fwd: no mu".into()))?;
    let (y, amax, scale_inv) = quantized(OP, ctx, y, a.out_dtype, a.scale.as_ref())?;
    Ok(LayerNormFwdOut { y, mu, rsigma, amax, scale_inv })
}

/// `rmsnorm_bwd`.
pub fn rmsnorm_bwd(ctx: &KernelCtx<'_>, a: &RmsNormBwdArgs) -> Result<RmsNormBwdOut> {
    let (dx, dgamma, _) =
        backward("rmsnorm_bwd", ctx, &a.dy, &a.x, None, &a.rsigma, &a.gamma, None, a.zero_centered_gamma)?;
    Ok(RmsNormBwdOut { dx, dgamma })
}

/// `rmsnorm_bwd_add`.
pub fn rmsnorm_bwd_add(ctx: &KernelCtx<'_>, a: &RmsNormBwdAddArgs) -> Result<RmsNormBwdAddOut> {
    let (dx, dgamma, _) =
        backward("rmsnorm_bwd_add", ctx, &a.dy, &a.x, None, &a.rsigma, &a.gamma, Some(&a.add), a.zero_centered_gamma)?;
    Ok(RmsNormBwdAddOut { dx, dgamma })
}

/// `layernorm_bwd`.
pub fn layernorm_bwd(ctx: &KernelCtx<'_>, a: &LayerNormBwdArgs) -> Result<LayerNormBwdOut> {
    let (dx, dgamma, dbeta) =
        backward("layernorm_bwd", ctx, &a.dy, &a.x, Some(&a.mu), &a.rsigma, &a.gamma, None, a.zero_centered_gamma)?;
    let dbeta = dbeta.ok_or_else(|| Error::Tensor("layernorm_bwd: no dbeta".into()))?;
    Ok(LayerNormBwdOut { dx, dgamma, dbeta })
}
