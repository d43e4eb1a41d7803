//! `generic_gemm` on Vulkan (`shaders/gemm.wgsl`), the portable path every Vulkan device has:
//! a shared-memory tiled product in f32 (64×64 tiles, 4×4 outputs per invocation), then the
//! epilogue (C, bias, GELU with the pre-activation in aux, dGELU) rounding to D, and for the
//! bias-gradient epilogues the column sums of the unrounded values. f32, f16 and bf16 inputs,
//! f32 accumulation. On a device with cooperative matrices (`Gpu::coop`; `TEFL_VULKAN_COOPMAT=0`
//! turns them off), f16 products run on them (`shaders/gemm_coop.wgsl`, tensor cores on
//! NVIDIA), and bf16 ones too where the device also has `VK_KHR_shader_bfloat16`
//! (`Gpu::coop_bf16`), when k (and m or n where they are a source's contiguous dimension) are
//! multiples of 8. With `TEFL_VULKAN_COOPMAT=2`, where the device offers NVIDIA's
//! workgroup-scope matrices (`Gpu::coopmat2`, `VK_NV_cooperative_matrix2`), those products run
//! on them instead (`build/cm2.rs`: the driver stages the tiles itself; tile sizes from the
//! `gemm_cm2` tune configs). A plain product (no C, no epilogue) skips the epilogue stage
//! where the product can write D itself: an f32 D, or a 16-bit D from cooperative matrices.
//! FP8 inputs (either format, the two may differ) run on the portable tiles with their codes
//! decoded exactly (`shaders/gemm_fp8.wgsl`), an FP8 D is quantized after the epilogue.
//! `te_general_grouped_gemm` runs `generic_gemm` per group.

use std::sync::Arc;

use tefl_core::catalogue::*;
use tefl_core::tuning::TuneConfig;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};
use tefl_gpu::tune;

use super::{MAX_GROUPS, dtype_code, dtype_name};
use crate::coopmat2::Tile;
use crate::gpu::{Gpu, Pipeline, gpu};
use crate::heuristics::{CoopTile, coop_limits, coop_tile, coop_tile_of};

/// Bytes of the shader's push constants (fourteen 32-bit fields).
const PUSH_BYTES: u32 = 56;
/// Rows and columns of D per workgroup of the product.
const TILE: usize = 64;
/// Invocations per workgroup (the shader's WG).
const WG: u32 = 256;
/// Row parts of the bias-gradient column sums.
const PARTS: usize = 64;

fn ep_code(ep: GemmEpilogue) -> u32 {
    match ep {
        GemmEpilogue::None => 0,
        GemmEpilogue::Bias => 1,
        GemmEpilogue::Gelu => 2,
        GemmEpilogue::BiasGelu => 3,
        GemmEpilogue::DGelu => 4,
        GemmEpilogue::DGeluBiasGrad => 5,
        GemmEpilogue::BiasGrad => 6,
    }
}

/// A workgroup grid.
type Groups = (u32, u32, u32);
/// A pipeline and its workgroup grid.
type Product = (Arc<Pipeline>, Groups);

/// The tile of `family` (`gemm_cm2`, `gemm_coop`) a product runs with: `heuristic`, or with
/// `TEFL_AUTOTUNE=1` the fastest of the family's candidates that `fit`, timed per bucket (the
/// variant `what` and power-of-two buckets of m, n and k) by running the product `make` builds.
#[allow(clippy::too_many_arguments)]
fn tuned_tile<T: Copy>(
    ctx: &KernelCtx<'_>,
    table: &tefl_core::tuning::TuneTable,
    family: &str,
    dtype: DType,
    what: &str,
    (m, n, k): (usize, usize, usize),
    fit: &dyn Fn(&TuneConfig) -> Option<T>,
    make: &dyn Fn(T) -> Result<Product>,
    run: &dyn Fn(&Pipeline, Groups) -> Result<()>,
    heuristic: T,
) -> Result<T> {
    if !tune::autotune_requested() {
        return Ok(heuristic);
    }
    let cands: Vec<TuneConfig> = table.configs(family).iter().filter(|c| fit(c).is_some()).cloned().collect();
    let info = tefl_core::device::info(ctx.device)?;
    let bucket = format!("{what}.m={}.n={}.k={}", m.next_power_of_two(), n.next_power_of_two(), k.next_power_of_two());
    let key = tune::tune_key(family, dtype, &bucket, &info);
    let chosen = tune::autotuner().select(
        &key,
        &cands,
        |c| {
            let (p, groups) = make(fit(c).ok_or_else(|| Error::Tuning("tile does not fit".into()))?)?;
            tune::measure(ctx.device, &|| run(&p, groups))
        },
        TuneConfig::new,
    );
    Ok(fit(&chosen).unwrap_or(heuristic))
}

/// What a cooperative-matrix product's variant writes (the `out=` of its name): D itself, named
/// by its 16-bit dtype (`direct`, a plain product), or `w`, the f32 product.
fn product_output(a: &GemmArgs, direct: bool) -> Result<&'static str> {
    if direct { dtype_name("generic_gemm", "out_dtype", a.out_dtype) } else { Ok("w") }
}

/// The product on workgroup-scope cooperative matrices (`build/cm2.rs`) for 16-bit inputs of
/// dtype `tx`, where the device offers them for it. It writes D (`direct`, a 16-bit
/// `out_dtype`) or W. The tile is the `gemm_cm2` tune configs' first that fits, or with
/// `TEFL_AUTOTUNE=1` the fastest of them per power-of-two bucket of m, n and k (`run` times
/// one product). `None`: not offered here, or the driver could not make the pipeline (logged;
/// the subgroup-scope product runs instead).
fn cm2_product(
    ctx: &KernelCtx<'_>,
    gpu: &Gpu,
    tx: &str,
    a: &GemmArgs,
    direct: bool,
    (m, n, k): (usize, usize, usize),
    run: &dyn Fn(&Pipeline, Groups) -> Result<()>,
) -> Result<Option<Product>> {
    let Some(offer) = &gpu.coopmat2 else { return Ok(None) };
    let Some(shape) = (if tx == "bf16" { offer.bf16 } else { offer.f16 }) else { return Ok(None) };
    let table = crate::heuristics::TUNE_CONFIGS.table(&gpu.physical.arch());
    let out = product_output(a, direct)?;
    let name = format!("gemm_cm2.tx={tx}.ta={}.tb={}.out={out}", u8::from(a.transa), u8::from(a.transb));
    let make = |t: Tile| -> Result<Product> {
        let p = gpu.specialized_pipeline(&name, 8, PUSH_BYTES, &[t.bm, t.bn, t.bk, shape.invocations])?;
        Ok((p, (n.div_ceil(t.bn as usize) as u32, m.div_ceil(t.bm as usize) as u32, 1)))
    };
    let fit = |c: &TuneConfig| crate::heuristics::cm2_tile_of(c, &shape, offer.max_dimension);
    let Some(heuristic) = table.configs("gemm_cm2").iter().find_map(fit).or_else(|| fit(&TuneConfig::new())) else {
        return Ok(None);
    };
    let tile = tuned_tile(
        ctx,
        &table,
        "gemm_cm2",
        a.a.dtype(),
        &format!("{tx}.{out}"),
        (m, n, k),
        &fit,
        &make,
        run,
        heuristic,
    )?;
    match make(tile) {
        Ok(p) => Ok(Some(p)),
        Err(e) => {
            tracing::warn!(target: "TE-FL", "{name} {tile:?}: {e}; the subgroup-scope product runs instead");
            Ok(None)
        }
    }
}

/// The product on subgroup-scope cooperative matrices (`shaders/gemm_coop.wgsl`) for 16-bit
/// inputs of dtype `tx`, writing D (`direct`) or W. The tile is the `gemm_coop` tune configs'
/// first that fits the device, the one `TEFL_VULKAN_GEMM_TILE` pins, or with `TEFL_AUTOTUNE=1`
/// the fastest of them per power-of-two bucket of m, n and k (`run` times one product).
fn coop_product(
    ctx: &KernelCtx<'_>,
    gpu: &Gpu,
    tx: &str,
    a: &GemmArgs,
    direct: bool,
    (m, n, k): (usize, usize, usize),
    run: &dyn Fn(&Pipeline, Groups) -> Result<()>,
) -> Result<Product> {
    let table = crate::heuristics::TUNE_CONFIGS.table(&gpu.physical.arch());
    let (shared, invocations) = coop_limits(&gpu.physical);
    let fit = |c: &TuneConfig| coop_tile_of(c, shared, invocations);
    let out = product_output(a, direct)?;
    let make = |t: CoopTile| -> Result<Product> {
        let p = gpu.pipeline(&t.variant(tx, a.transa, a.transb, out), 8, PUSH_BYTES)?;
        // (Fewer tiles than the portable product's 64×64, whose count the caller checked.)
        Ok((p, (n.div_ceil(t.cols() as usize) as u32, m.div_ceil(t.rows() as usize) as u32, 1)))
    };
    let tile = match coop_tile(&gpu.physical)? {
        (t, true) => t,
        (heuristic, false) => {
            let what = format!("{tx}.{out}.ta={}.tb={}", u8::from(a.transa), u8::from(a.transb));
            tuned_tile(ctx, &table, "gemm_coop", a.a.dtype(), &what, (m, n, k), &fit, &make, run, heuristic)?
        }
    };
    make(tile)
}

/// The FP8 product's pipeline for A's and B's formats (`shaders/gemm_fp8.wgsl`).
fn fp8_product(gpu: &Gpu, a: &GemmArgs) -> Result<Arc<Pipeline>> {
    let format = |arg: &'static str, t: &Tensor| match t.dtype() {
        DType::F8E4M3 => Ok("e4m3"),
        DType::F8E5M2 => Ok("e5m2"),
        other => Err(Error::DType { op: "generic_gemm", arg, got: other, expected: "f8e4m3 or f8e5m2".into() }),
    };
    gpu.pipeline(&format!("gemm_fp8.fa={}.fb={}.wg={WG}", format("a", &a.a)?, format("b", &a.b)?), 8, PUSH_BYTES)
}

/// `generic_gemm`. FP8 inputs take the portable tiles with the codes decoded exactly
/// (`shaders/gemm_fp8.wgsl`, their scales folded into alpha on the device), then the same
/// epilogue into f32; an FP8 D is then quantized by `fp8.wgsl` with `d_scale`, which also gives
/// `d_amax`, and a GELU epilogue's pre-activation is rounded to bf16 (the catalogue's
/// `aux_dtype`) by the epilogue stage run as a plain conversion.
pub fn generic_gemm(ctx: &KernelCtx<'_>, a: &GemmArgs) -> Result<GemmOut> {
    const OP: &str = "generic_gemm";
    let (m, k, n) = gemm_dims(a)?;
    let dev = ctx.device;
    let (fp8_in, fp8_out) = (a.a.dtype().is_fp8(), a.out_dtype.is_fp8());
    let aux_out =
        if a.epilogue.writes_aux() { Some(Tensor::uninit([m, n], aux_dtype(a.out_dtype), &dev)?) } else { None };
    if m == 0 || n == 0 {
        let d = Tensor::uninit([m, n], a.out_dtype, &dev)?;
        let bias_grad = if a.epilogue.writes_bias_grad() { Some(Tensor::zeros([n], DType::F32, &dev)?) } else { None };
        let d_amax = if fp8_out { Some(Tensor::zeros([1], DType::F32, &dev)?) } else { None };
        return Ok(GemmOut { d, aux_out, bias_grad, d_amax });
    }
    let unsupported = |reason: String| Error::Unsupported { op: OP, impl_id: ctx.impl_id.to_string(), reason };
    for (what, elems) in [("d", m * n), ("a", m * k), ("b", k * n), ("bias-gradient parts", PARTS * n)] {
        if elems >= (1usize << 31) {
            return Err(unsupported(format!("{what} has {elems} elements; the Vulkan shaders index with 32 bits")));
        }
    }
    let (tiles_n, tiles_m) = (n.div_ceil(TILE), m.div_ceil(TILE));
    if tiles_n > MAX_GROUPS as usize || tiles_m > MAX_GROUPS as usize {
        return Err(unsupported(format!("{m}x{n} needs {tiles_m}x{tiles_n} tiles, over {MAX_GROUPS} per side")));
    }
    let c = a.c.as_ref().filter(|_| a.accumulate);
    // (The epilogue and bias-gradient stages never read A or B: for FP8 inputs any TX serves.)
    let tx = if fp8_in { "f32" } else { dtype_name(OP, "a", a.a.dtype())? };
    let name = format!("gemm.tx={tx}.wg={WG}");
    let gpu = gpu(dev)?;
    let pipeline = gpu.pipeline(&name, 8, PUSH_BYTES)?;
    // The product on cooperative matrices (same bindings and push constants) where the device
    // has them for this dtype and every source row is whole 16-byte chunks.
    let coop_dtype = match (a.a.dtype(), a.b.dtype()) {
        (DType::F16, DType::F16) if gpu.coop => Some("f16"),
        (DType::BF16, DType::BF16) if gpu.coop_bf16 => Some("bf16"),
        _ => None,
    };
    let chunked = k.is_multiple_of(8) && (!a.transa || m.is_multiple_of(8)) && (a.transb || n.is_multiple_of(8));
    let coop = coop_dtype.filter(|_| chunked);
    // What the epilogue writes D (and aux) in, and where: an FP8 D (and its GELU
    // pre-activation) is written in f32 first.
    let (epi_dtype, d_epi, aux_epi) = if fp8_out {
        let aux = aux_out.as_ref().map(|_| Tensor::uninit([m, n], DType::F32, &dev)).transpose()?;
        (DType::F32, Tensor::uninit([m, n], DType::F32, &dev)?, aux)
    } else {
        (a.out_dtype, Tensor::uninit([m, n], a.out_dtype, &dev)?, aux_out.clone())
    };
    // A plain product (k > 0, no C, no epilogue) needs no epilogue stage where the product can
    // write D itself: an f32 D is W, and the cooperative-matrix products write a 16-bit D
    // whose rows are whole 16-byte chunks. W is then D (bound, not used, in those variants).
    let plain = k > 0 && a.epilogue == GemmEpilogue::None && c.is_none();
    let direct = plain && coop.is_some() && a.out_dtype != DType::F32 && n.is_multiple_of(8);
    let epilogue = !(direct || plain && epi_dtype == DType::F32);
    let w = if !epilogue {
        d_epi.clone()
    } else if k == 0 {
        Tensor::zeros([m, n], DType::F32, &dev)?
    } else {
        Tensor::uninit([m, n], DType::F32, &dev)?
    };
    let bias_grad = if a.epilogue.writes_bias_grad() { Some(Tensor::uninit([n], DType::F32, &dev)?) } else { None };
    let parts = PARTS.min(m);
    let ws = if bias_grad.is_some() { Some(Tensor::uninit([parts, n], DType::F32, &dev)?) } else { None };
    let bind = super::binding;
    let or_w = |t: Option<&Tensor>| t.map_or_else(|| bind(&w), bind);
    // The push constants of a stage writing D in `td` with epilogue `ep` (and C when `with_c`).
    let push_as = |stage: u32, td: DType, ep: GemmEpilogue, with_c: bool| -> Result<Vec<u8>> {
        let ints = [
            stage,
            m as u32,
            n as u32,
            k as u32,
            u32::from(a.transa),
            u32::from(a.transb),
            c.map(|t| dtype_code(OP, "c", t.dtype())).transpose()?.unwrap_or(0),
            a.bias.as_ref().map(|t| dtype_code(OP, "bias", t.dtype())).transpose()?.unwrap_or(0),
            a.aux.as_ref().map(|t| dtype_code(OP, "aux", t.dtype())).transpose()?.unwrap_or(0),
            dtype_code(OP, "out_dtype", td)?,
            ep_code(ep),
            u32::from(with_c),
            parts as u32,
        ];
        let mut v: Vec<u8> = ints.iter().flat_map(|i| i.to_le_bytes()).collect();
        v.extend_from_slice(&a.alpha.to_le_bytes());
        Ok(v)
    };
    let push = |stage: u32| push_as(stage, epi_dtype, a.epilogue, c.is_some());
    let main = [
        bind(&a.a)?,
        bind(&a.b)?,
        bind(&w)?,
        or_w(c)?,
        or_w(a.bias.as_ref())?,
        or_w(a.aux.as_ref())?,
        bind(&d_epi)?,
        or_w(aux_epi.as_ref())?,
    ];
    let per_word = if epi_dtype == DType::F32 { 1 } else { 2 };
    let epi_groups = ((m * n).div_ceil(per_word) as u32).div_ceil(WG).clamp(1, MAX_GROUPS);
    let (p0, p1) = (push(if direct { 4 } else { 0 })?, push(1)?);
    // The product: FP8 codes on the portable tiles with their scales (bound where C and bias
    // are in the other stages); else on workgroup-scope matrices where offered, else on
    // subgroup-scope ones, else the portable tiles (all with the same bindings and push
    // constants).
    let product_bindings = if fp8_in {
        let (sa, sb) = a.fp8_scales()?;
        let mut b = main;
        b[3] = bind(sa)?;
        b[4] = bind(sb)?;
        b
    } else {
        main
    };
    let run_product = |p: &Pipeline, groups: Groups| gpu.run(|r| r.dispatch(p, &product_bindings, &p0, groups));
    let workgroup_scope = match coop {
        Some(tx) => cm2_product(ctx, &gpu, tx, a, direct, (m, n, k), &run_product)?,
        None => None,
    };
    let (product, product_groups) = if fp8_in {
        (fp8_product(&gpu, a)?, (tiles_n as u32, tiles_m as u32, 1))
    } else if let Some(p) = workgroup_scope {
        p
    } else if let Some(tx) = coop {
        coop_product(ctx, &gpu, tx, a, direct, (m, n, k), &run_product)?
    } else {
        (pipeline.clone(), (tiles_n as u32, tiles_m as u32, 1))
    };
    let sums = match (&bias_grad, &ws) {
        (Some(bg), Some(ws)) => {
            let mut partial = main;
            partial[7] = bind(ws)?;
            let mut finish = partial;
            finish[6] = bind(bg)?;
            Some((partial, finish, push(2)?, push(3)?))
        }
        _ => None,
    };
    // An FP8 D's GELU pre-activation: the f32 values rounded to bf16 by the epilogue stage with
    // no epilogue and no C (it reads W, here the f32 values, and writes D, here aux_out).
    let aux_rounding = match (&aux_epi, &aux_out) {
        (Some(from), Some(to)) if fp8_out => {
            let mut b = main;
            b[2] = bind(from)?;
            b[6] = bind(to)?;
            let groups = ((m * n).div_ceil(2) as u32).div_ceil(WG).clamp(1, MAX_GROUPS);
            Some((b, push_as(1, aux_dtype(a.out_dtype), GemmEpilogue::None, false)?, groups))
        }
        _ => None,
    };
    gpu.run(|r| {
        if k > 0 {
            r.dispatch(&product, &product_bindings, &p0, product_groups)?;
        }
        if epilogue {
            r.dispatch(&pipeline, &main, &p1, (epi_groups, 1, 1))?;
        }
        if let Some((partial, finish, p2, p3)) = &sums {
            let col_groups = n.div_ceil(WG as usize) as u32;
            r.dispatch(&pipeline, partial, p2, (col_groups, parts as u32, 1))?;
            r.dispatch(&pipeline, finish, p3, (col_groups, 1, 1))?;
        }
        if let Some((b, p, groups)) = &aux_rounding {
            r.dispatch(&pipeline, b, p, (*groups, 1, 1))?;
        }
        Ok(())
    })?;
    if fp8_out {
        let args =
            QuantizeArgs { x: d_epi, scale: a.fp8_d_scale()?.clone(), fp8_dtype: a.out_dtype, want_transpose: false };
        let q = super::fp8::quantize(ctx, &args)?;
        return Ok(GemmOut { d: q.q, aux_out, bias_grad, d_amax: Some(q.amax) });
    }
    Ok(GemmOut { d: d_epi, aux_out, bias_grad, d_amax: None })
}

/// `te_general_grouped_gemm`: [`generic_gemm`] per group (with the bias epilogue where the group
/// has a bias), a submission each: a loop of dispatches from the host, where the CUDA backend's
/// Hopper path is one launch for every group.
pub fn grouped_gemm(ctx: &KernelCtx<'_>, a: &GroupedGemmArgs) -> Result<GroupedGemmOut> {
    a.each_group(|g| generic_gemm(ctx, g))
}
