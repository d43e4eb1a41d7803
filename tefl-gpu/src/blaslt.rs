//! `generic_gemm` through a vendor "BLAS-Lt" library (cuBLASLt, hipBLASLt): the host logic
//! both share, so a vendor crate binds only its library's calls ([`BlasLt`]).
//!
//! Row-major D[m, n] = op(A)·op(B) is the column-major product Dᵀ = op(B)ᵀ·op(A)ᵀ, so the
//! library gets (B, A) with the same transpose flags and m, n swapped; a bias per column of D
//! is then per row of Dᵀ, as the libraries' bias epilogues expect. [`LtShape::layouts`] gives
//! the three column-major layouts of that view.
//!
//! When every dtype matches (a = b, c = bias = aux = out) and the aux leading dimension is
//! aligned, the epilogue is the library's own ([`LtEpilogue`], beta = 1 for accumulate).
//! Otherwise, and for the bias-gradient epilogues (the sum of the unrounded values over m), the
//! library writes f32 and `simt/gemm_epilogue.cu` finishes the epilogue
//! ([`finish_epilogue`]).
//!
//! FP8 inputs ([`fp8_generic_gemm`]) go to the library in the TN form its FP8 kernels take
//! (codes transposed first when the call has another form), with the per-tensor scales as
//! device pointers (the library's A/B scale, and D scale and amax for an FP8 D) and fast
//! accumulation unless `split_accumulator`. A shape the library has no FP8 algorithm for runs
//! the float path on the dequantized operands.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tefl_core::catalogue::*;
use tefl_core::{DType, Device, KernelCtx, Result, Tensor};

use crate::simt::gemm::finish_epilogue;
use crate::simt::host::{empty, opt_ptr, ptr, zeros};

/// The fused epilogues tefl asks a BLAS-Lt library for. cuBLASLt and hipBLASLt number them
/// alike ([`LtEpilogue::code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LtEpilogue {
    /// D = alpha·op(A)·op(B) (+ beta·C).
    Default,
    /// Plus a bias per column of D.
    Bias,
    /// GELU, the pre-GELU values written to aux.
    GeluAux,
    /// Bias, then GELU, the pre-GELU values written to aux.
    GeluAuxBias,
    /// Times GELU'(aux).
    DGelu,
}

impl LtEpilogue {
    /// The library's enum value (`CUBLASLT_EPILOGUE_*` = `HIPBLASLT_EPILOGUE_*`).
    pub fn code(self) -> u32 {
        match self {
            LtEpilogue::Default => 1,
            LtEpilogue::Bias => 4,
            LtEpilogue::GeluAux => 160,
            LtEpilogue::GeluAuxBias => 164,
            LtEpilogue::DGelu => 192,
        }
    }

    /// Whether the bias and aux pointers are descriptor attributes of this epilogue.
    pub fn has_pointers(self) -> bool {
        self != LtEpilogue::Default
    }

    /// The library epilogue of a catalogue epilogue, `None` for the bias-gradient ones (always
    /// finished by the shared epilogue kernel).
    fn of(ep: GemmEpilogue) -> Option<LtEpilogue> {
        Some(match ep {
            GemmEpilogue::None => LtEpilogue::Default,
            GemmEpilogue::Bias => LtEpilogue::Bias,
            GemmEpilogue::Gelu => LtEpilogue::GeluAux,
            GemmEpilogue::BiasGelu => LtEpilogue::GeluAuxBias,
            GemmEpilogue::DGelu => LtEpilogue::DGelu,
            GemmEpilogue::DGeluBiasGrad | GemmEpilogue::BiasGrad => return None,
        })
    }
}

/// One matmul's shape, dtypes and epilogue: the key of a library's cached plan.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct LtShape {
    /// Device ordinal.
    pub device: u32,
    /// Rows of D.
    pub m: usize,
    /// Columns of D.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Whether A is stored transposed (`[k, m]`).
    pub transa: bool,
    /// Whether B is stored transposed (`[n, k]`).
    pub transb: bool,
    /// The dtype of A.
    pub ab: DType,
    /// The dtype of B (A's, except for mixed FP8 formats).
    pub b_type: DType,
    /// The dtype of D (and bias and aux on the fused path).
    pub d: DType,
    /// The dtype of C (D's, except bf16 for an FP8 D).
    pub c: DType,
    /// The fused epilogue.
    pub epilogue: LtEpilogue,
    /// FP8: the library's fast (reduced-precision) accumulation.
    pub fast_accum: bool,
}

impl LtShape {
    /// Whether A and B are FP8 (the call then carries their scale pointers).
    pub fn is_fp8(&self) -> bool {
        self.ab.is_fp8()
    }
}

/// A column-major matrix layout: rows, columns and leading dimension.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LtLayout {
    /// Rows.
    pub rows: u64,
    /// Columns.
    pub cols: u64,
    /// Leading dimension (elements between columns).
    pub ld: i64,
}

impl LtLayout {
    fn new(rows: u64, cols: u64) -> Self {
        LtLayout { rows, cols, ld: rows.max(1) as i64 }
    }
}

impl LtShape {
    /// The library's (column-major) operands: the first is B (op(B)ᵀ is n×k), the second A
    /// (op(A)ᵀ is k×m), the output Dᵀ (n×m, also C's layout); the library's transpose flags are
    /// `(transb, transa)`. See the module docs.
    pub fn layouts(&self) -> (LtLayout, LtLayout, LtLayout) {
        let (m, n, k) = (self.m as u64, self.n as u64, self.k as u64);
        let first = if self.transb { LtLayout::new(k, n) } else { LtLayout::new(n, k) };
        let second = if self.transa { LtLayout::new(m, k) } else { LtLayout::new(k, m) };
        (first, second, LtLayout::new(n, m))
    }

    /// The leading dimension of aux (row-major `[m, n]`): n.
    pub fn aux_ld(&self) -> i64 {
        self.n as i64
    }
}

/// The device addresses and scalars of one matmul call (0: absent).
#[derive(Clone, Copy, Debug)]
pub struct LtCall {
    /// A (row-major, as the op got it).
    pub a: u64,
    /// B.
    pub b: u64,
    /// C, read when `beta` ≠ 0 (D's layout); 0: D itself.
    pub c: u64,
    /// D.
    pub d: u64,
    /// The bias (fused bias epilogues).
    pub bias: u64,
    /// Aux: read by dGELU, written by the GELU epilogues.
    pub aux: u64,
    /// The product's scale.
    pub alpha: f32,
    /// C's scale.
    pub beta: f32,
    /// FP8: A's scale_inv (f32 on the device).
    pub a_scale: u64,
    /// FP8: B's scale_inv.
    pub b_scale: u64,
    /// FP8 D: D's scale.
    pub d_scale: u64,
    /// FP8 D: where max |D| goes.
    pub d_amax: u64,
}

impl LtCall {
    /// A call with no C, bias, aux or FP8 scales.
    fn plain(a: u64, b: u64, d: u64, alpha: f32) -> Self {
        LtCall { a, b, c: 0, d, bias: 0, aux: 0, alpha, beta: 0.0, a_scale: 0, b_scale: 0, d_scale: 0, d_amax: 0 }
    }
}

/// A vendor BLAS-Lt library's matmul on the column-major view of the module docs.
pub trait BlasLt: Sync {
    /// The library's name, for messages (`cuBLASLt`).
    fn name(&self) -> &'static str;

    /// Queues D = alpha·op(A)·op(B) + beta·C with the shape's fused epilogue on the op's
    /// queue. `Ok(false)` when the library has no algorithm for this shape (the caller takes
    /// another path), an error when it fails.
    fn matmul(&self, device: Device, shape: &LtShape, call: &LtCall) -> Result<bool>;
}

/// `generic_gemm` through `lib`: the fused epilogue when the dtypes allow it and the library
/// has an algorithm, else the library's f32 product finished by the shared epilogue kernel.
/// `Ok(None)` when the library has no algorithm even for the f32 product.
pub fn generic_gemm(ctx: &KernelCtx<'_>, a: &GemmArgs, lib: &dyn BlasLt) -> Result<Option<GemmOut>> {
    const OP: &str = "generic_gemm";
    if a.a.dtype().is_fp8() {
        return fp8_generic_gemm(ctx, a, lib).map(Some);
    }
    let (m, k, n) = gemm_dims(a)?;
    let dev = ctx.device;
    let out = a.out_dtype;
    let d = empty(dev, &[m, n], out)?;
    let aux_out = if a.epilogue.writes_aux() { Some(empty(dev, &[m, n], out)?) } else { None };
    if m == 0 || n == 0 {
        let bias_grad = if a.epilogue.writes_bias_grad() { Some(zeros(dev, &[n], DType::F32)?) } else { None };
        return Ok(Some(GemmOut { d, aux_out, bias_grad, d_amax: None }));
    }
    if k == 0 {
        // No product: D is C (or zero) through the epilogue; run the epilogue kernel on zeros.
        return finish_epilogue(ctx, a, m, n, zeros(dev, &[m, n], DType::F32)?, d, aux_out).map(Some);
    }
    let c = a.c.as_ref().filter(|_| a.accumulate);
    let same = |t: Option<&Tensor>| t.is_none_or(|t| t.dtype() == out);
    let fused = LtEpilogue::of(a.epilogue).filter(|_| {
        same(c)
            && same(a.bias.as_ref())
            && same(a.aux.as_ref())
            && (!a.epilogue.needs_aux() && !a.epilogue.writes_aux() || n % 8 == 0)
    });
    let shape = |d: DType, epilogue: LtEpilogue| LtShape {
        device: dev.ordinal,
        m,
        n,
        k,
        transa: a.transa,
        transb: a.transb,
        ab: a.a.dtype(),
        b_type: a.b.dtype(),
        d,
        c: d,
        epilogue,
        fast_accum: false,
    };
    let (pa, pb) = (ptr(&a.a)?, ptr(&a.b)?);
    if let Some(epilogue) = fused {
        let (beta, c_ptr) = match c {
            Some(c) => (1.0, ptr(c)?),
            None => (0.0, 0),
        };
        let aux = if a.epilogue.writes_aux() { opt_ptr(aux_out.as_ref())? } else { opt_ptr(a.aux.as_ref())? };
        let call =
            LtCall { c: c_ptr, bias: opt_ptr(a.bias.as_ref())?, aux, beta, ..LtCall::plain(pa, pb, ptr(&d)?, a.alpha) };
        match lib.matmul(dev, &shape(out, epilogue), &call) {
            Ok(true) => return Ok(Some(GemmOut { d, aux_out, bias_grad: None, d_amax: None })),
            Ok(false) => {
                tracing::debug!(target: "TE-FL", "{OP}: {} has no fused {epilogue:?} for this shape; f32 path", lib.name())
            }
            Err(e) => tracing::debug!(target: "TE-FL", "{OP}: fused {} epilogue declined ({e}); f32 path", lib.name()),
        }
    }
    let w = empty(dev, &[m, n], DType::F32)?;
    let call = LtCall::plain(pa, pb, ptr(&w)?, a.alpha);
    if !lib.matmul(dev, &shape(DType::F32, LtEpilogue::Default), &call)? {
        return Ok(None);
    }
    finish_epilogue(ctx, a, m, n, w, d, aux_out).map(Some)
}

/// `generic_gemm` with FP8 A and B through `lib` (see the module docs): the library's fused
/// FP8 kernel when the epilogue allows (none or a bias of D's dtype, for a float D; none for an
/// FP8 D), else its f32 product finished by the epilogue kernel (and the output quantizer for
/// an FP8 D), else — no FP8 algorithm for the shape — the float path on dequantized operands.
pub fn fp8_generic_gemm(ctx: &KernelCtx<'_>, a: &GemmArgs, lib: &dyn BlasLt) -> Result<GemmOut> {
    use crate::simt::quantize;
    let (m, k, n) = gemm_dims(a)?;
    let dev = ctx.device;
    let out = a.out_dtype;
    let (sa, sb) = a.fp8_scales()?;
    // The float D the epilogue produces: D's own dtype, bf16 when D is FP8 (quantized after).
    let float_args = crate::simt::gemm::float_d_args(a);
    let float_out = float_args.out_dtype;
    let finish_fp8 = |r: GemmOut| crate::simt::gemm::quantize_fp8_d(ctx, a, r);
    // The library's FP8 kernels want K-major operands (k a multiple of 16 bytes).
    if m > 0 && n > 0 && k > 0 && k % 16 == 0 {
        let at = if a.transa { quantize::transpose_codes(ctx, &a.a)? } else { a.a.clone() };
        let bt = if a.transb { a.b.clone() } else { quantize::transpose_codes(ctx, &a.b)? };
        let shape = |d: DType, c: DType, epilogue: LtEpilogue| LtShape {
            device: dev.ordinal,
            m,
            n,
            k,
            transa: false,
            transb: true,
            ab: at.dtype(),
            b_type: bt.dtype(),
            d,
            c,
            epilogue,
            fast_accum: !a.split_accumulator,
        };
        let base = LtCall { a_scale: ptr(sa)?, b_scale: ptr(sb)?, ..LtCall::plain(ptr(&at)?, ptr(&bt)?, 0, a.alpha) };
        let c = a.c.as_ref().filter(|_| a.accumulate);
        let fused = match a.epilogue {
            GemmEpilogue::None => true,
            GemmEpilogue::Bias => !out.is_fp8() && a.bias.as_ref().is_some_and(|b| b.dtype() == out),
            _ => false,
        } && c.is_none_or(|c| c.dtype() == out);
        if fused {
            let d = empty(dev, &[m, n], out)?;
            let d_amax = if out.is_fp8() { Some(zeros(dev, &[1], DType::F32)?) } else { None };
            let epilogue = if a.epilogue == GemmEpilogue::Bias { LtEpilogue::Bias } else { LtEpilogue::Default };
            let call = LtCall {
                d: ptr(&d)?,
                c: opt_ptr(c)?,
                beta: if c.is_some() { 1.0 } else { 0.0 },
                bias: opt_ptr(a.bias.as_ref())?,
                d_scale: if out.is_fp8() { ptr(a.fp8_d_scale()?)? } else { 0 },
                d_amax: opt_ptr(d_amax.as_ref())?,
                ..base
            };
            let c_type = if out.is_fp8() { DType::BF16 } else { out };
            match lib.matmul(dev, &shape(out, c_type, epilogue), &call) {
                Ok(true) => return Ok(GemmOut { d, aux_out: None, bias_grad: None, d_amax }),
                Ok(false) => {
                    tracing::debug!(target: "TE-FL", "generic_gemm: {} has no fused FP8 kernel here", lib.name())
                }
                Err(e) => tracing::debug!(target: "TE-FL", "generic_gemm: fused FP8 {} declined ({e})", lib.name()),
            }
        }
        let w = empty(dev, &[m, n], DType::F32)?;
        if lib.matmul(dev, &shape(DType::F32, DType::F32, LtEpilogue::Default), &LtCall { d: ptr(&w)?, ..base })? {
            let d = empty(dev, &[m, n], float_out)?;
            let aux_out = if a.epilogue.writes_aux() { Some(empty(dev, &[m, n], float_out)?) } else { None };
            return finish_fp8(finish_epilogue(ctx, &float_args, m, n, w, d, aux_out)?);
        }
        tracing::debug!(target: "TE-FL", "generic_gemm: {} has no FP8 algorithm for {m}x{k}x{n}", lib.name());
    }
    // Dequantized to f32 (exact codes times scale_inv, rounded once), then the float path.
    let deq = |q: &Tensor, s: &Tensor| -> Result<Tensor> {
        Ok(quantize::dequantize(ctx, &DequantizeArgs { q: q.clone(), scale_inv: s.clone(), out_dtype: DType::F32 })?.y)
    };
    let f32_args =
        GemmArgs { a: deq(&a.a, sa)?, b: deq(&a.b, sb)?, a_scale_inv: None, b_scale_inv: None, ..float_args };
    let r = generic_gemm(ctx, &f32_args, lib)?.ok_or_else(|| tefl_core::Error::DeviceFailure {
        device: dev.to_string(),
        reason: format!("{}: no algorithm for the dequantized f32 product", lib.name()),
    })?;
    finish_fp8(r)
}

/// `te_general_grouped_gemm` through `lib`: each group's GEMM (float or FP8, with its bias)
/// queued in order on the op's queue, one library launch per non-empty group.
pub fn grouped_gemm(ctx: &KernelCtx<'_>, a: &GroupedGemmArgs, lib: &dyn BlasLt) -> Result<GroupedGemmOut> {
    let dims = grouped_dims(a)?;
    let mut d = Vec::with_capacity(dims.len());
    for (g, &(m, _, n)) in dims.iter().enumerate() {
        if m == 0 || n == 0 {
            d.push(empty(ctx.device, &[m, n], a.out_dtype)?);
            continue;
        }
        let out = generic_gemm(ctx, &a.group(g), lib)?.ok_or_else(|| tefl_core::Error::DeviceFailure {
            device: ctx.device.to_string(),
            reason: format!("{}: no algorithm for group {g}", lib.name()),
        })?;
        d.push(out.d);
    }
    Ok(GroupedGemmOut { d })
}

/// A library's cached plans (descriptors, layouts, algorithm) per shape, and the shapes it has
/// no algorithm for, remembered so its heuristic is asked once.
pub struct PlanCache<P> {
    plans: Mutex<HashMap<LtShape, Arc<Mutex<P>>>>,
    declined: Mutex<HashSet<LtShape>>,
}

impl<P> Default for PlanCache<P> {
    fn default() -> Self {
        PlanCache { plans: Mutex::default(), declined: Mutex::default() }
    }
}

impl<P> PlanCache<P> {
    /// The plan of `shape`, built by `build` the first time (`Ok(None)` from it: no algorithm,
    /// remembered); `Ok(None)` for a declined shape.
    pub fn get(&self, shape: &LtShape, build: impl FnOnce() -> Result<Option<P>>) -> Result<Option<Arc<Mutex<P>>>> {
        if let Some(p) = self.plans.lock().unwrap_or_else(|p| p.into_inner()).get(shape) {
            return Ok(Some(p.clone()));
        }
        if self.declined.lock().unwrap_or_else(|p| p.into_inner()).contains(shape) {
            return Ok(None);
        }
        match build()? {
            Some(plan) => {
                let p = Arc::new(Mutex::new(plan));
                self.plans.lock().unwrap_or_else(|p| p.into_inner()).insert(shape.clone(), p.clone());
                Ok(Some(p))
            }
            None => {
                self.declined.lock().unwrap_or_else(|p| p.into_inner()).insert(shape.clone());
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(transa: bool, transb: bool) -> LtShape {
        LtShape {
            device: 0,
            m: 3,
            n: 5,
            k: 7,
            transa,
            transb,
            ab: DType::BF16,
            b_type: DType::BF16,
            d: DType::F32,
            c: DType::F32,
            epilogue: LtEpilogue::Default,
            fast_accum: false,
        }
    }

    /// The column-major view: op(B)ᵀ is n×k, op(A)ᵀ is k×m, Dᵀ is n×m; stored shapes follow
    /// the transpose flags.
    #[test]
    fn layouts_are_the_transposed_problem() {
        let l = |rows, cols| LtLayout { rows, cols, ld: rows as i64 };
        assert_eq!(shape(false, false).layouts(), (l(5, 7), l(7, 3), l(5, 3)));
        assert_eq!(shape(true, false).layouts(), (l(5, 7), l(3, 7), l(5, 3)));
        assert_eq!(shape(false, true).layouts(), (l(7, 5), l(7, 3), l(5, 3)));
        assert_eq!(shape(true, true).layouts(), (l(7, 5), l(3, 7), l(5, 3)));
    }

    #[test]
    fn epilogue_codes_are_the_libraries() {
        let codes: Vec<u32> =
            [LtEpilogue::Default, LtEpilogue::Bias, LtEpilogue::GeluAux, LtEpilogue::GeluAuxBias, LtEpilogue::DGelu]
                .iter()
                .map(|e| e.code())
                .collect();
        assert_eq!(codes, [1, 4, 160, 164, 192]);
        assert_eq!(LtEpilogue::of(GemmEpilogue::BiasGrad), None);
        assert_eq!(LtEpilogue::of(GemmEpilogue::BiasGelu), Some(LtEpilogue::GeluAuxBias));
    }

    #[test]
    fn the_plan_cache_builds_once_and_remembers_declines() {
        let cache: PlanCache<u32> = PlanCache::default();
        let mut builds = 0;
        let p = cache.get(&shape(false, false), || {
            builds += 1;
            Ok(Some(7))
        });
        assert_eq!(*p.unwrap().unwrap().lock().unwrap(), 7);
        let again = cache.get(&shape(false, false), || panic!("built twice"));
        assert!(again.unwrap().is_some());
        assert_eq!(builds, 1);
        assert!(cache.get(&shape(true, false), || Ok(None)).unwrap().is_none());
        assert!(cache.get(&shape(true, false), || panic!("declined shapes are not rebuilt")).unwrap().is_none());
        let err = cache.get(&shape(false, true), || Err(tefl_core::Error::Tensor("boom".into())));
        assert!(err.is_err());
        // An error is not remembered as a decline: the next call builds again.
        assert!(cache.get(&shape(false, true), || Ok(Some(1))).unwrap().is_some());
    }
}
