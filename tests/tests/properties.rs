//! Property tests over op arguments, one per op family (issue 12): random shapes (0, 1, odd
//! sizes, and huge dimensions next to a zero one, so sizes overflow without memory),
//! dtypes (floats and not), options and integer parameters (windows, steps, seeds, offsets)
//! through the public API on the default build. A call never panics or aborts; it returns
//! either outputs that follow the op's contract and, where the f64 oracle is cheap, match it,
//! or an error that names an argument.

use std::panic::{AssertUnwindSafe, catch_unwind};

use proptest::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::op::check_outputs;
use tefl_core::{DType, Device, Op, Tensor};
use tefl_tests::{names_the_culprit, oracle, rel_err, tolerance};

/// Cases per property: 256, or `TEFL_PROPS_CASES` for a longer hunt.
fn cases() -> u32 {
    std::env::var("TEFL_PROPS_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// Every dtype: floats most of the time, the others to hit dtype checks.
fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![
        6 => prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)],
        1 => prop_oneof![Just(DType::I32), Just(DType::U8), Just(DType::F8E4M3), Just(DType::Bool)],
    ]
}

/// A dimension: mostly small, sometimes 0, sometimes huge.
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        16 => 1usize..9,
        1 => Just(0usize),
        // Dims no memory holds; a product with them fails fast (2^31-sized outputs would fit a
        // large machine and turn a property test into a memory benchmark).
        1 => prop_oneof![Just(1usize << 40), Just(1usize << 62), Just(usize::MAX)],
    ]
}

/// A shape of `rank` dims whose element count is small, or zero when a dim is huge (so the
/// tensor exists without memory and the sizes overflow downstream).
fn shape(rank: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(dim(), rank).prop_map(|mut s| {
        let huge = s.iter().any(|&d| d > 64);
        if huge && !s.contains(&0) {
            let i = s.len() / 2;
            s[i] = 0;
        }
        s
    })
}

/// A tensor of `dtype` with small deterministic values; `None` when it cannot exist.
fn make(shape: &[usize], dtype: DType, salt: u64) -> Option<Tensor> {
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    if n > 1 << 16 {
        return None;
    }
    let v: Vec<f32> = (0..n).map(|i| (((i as u64 * 2654435761 + salt) % 1000) as f32 / 500.0) - 1.0).collect();
    if dtype.is_float() || dtype.is_fp8() {
        Tensor::from_slice(&v, shape, dtype).ok()
    } else {
        Tensor::zeros(shape, dtype, &Device::CPU).ok()
    }
}

/// Calls `O` through the global manager with panics caught, checks the outcome, and
/// returns the outputs when the call succeeded.
fn run<O: Op>(args: &O::Args) -> Result<Option<O::Output>, TestCaseError>
where
    O::Args: std::fmt::Debug,
{
    let _ = tefl_ops::linked_backends();
    let m = tefl_core::global().map_err(|e| TestCaseError::fail(e.to_string()))?;
    match catch_unwind(AssertUnwindSafe(|| m.call::<O>(args))) {
        Err(_) => Err(TestCaseError::fail(format!("{}: panicked on {args:?}", O::NAME))),
        Ok(Err(e)) if names_the_culprit(&e) => {
            if std::env::var_os("TEFL_PROPS_VERBOSE").is_some() {
                eprintln!("{}: error {e}", O::NAME);
            }
            Ok(None)
        }
        Ok(Err(e)) => Err(TestCaseError::fail(format!("{}: error naming no argument: {e:?}", O::NAME))),
        Ok(Ok(out)) => {
            if std::env::var_os("TEFL_PROPS_VERBOSE").is_some() {
                eprintln!("{}: ok", O::NAME);
            }
            check_outputs::<O>(args, &out, Device::CPU)
                .map_err(|r| TestCaseError::fail(format!("{}: contract: {r}", O::NAME)))?;
            Ok(Some(out))
        }
    }
}

fn close(what: &str, got: &Tensor, want: &[f64], dtype: DType) -> Result<(), TestCaseError> {
    let g = got.to_vec::<f64>().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let r = rel_err(&g, want);
    prop_assert!(r <= tolerance(dtype) * 4.0, "{what}: rel {r:e} (dtype {dtype})");
    Ok(())
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap_or_default()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn norms(xs in shape(0..=3), gs in prop_oneof![4 => Just(None), 1 => shape(0..=1).prop_map(Some)], dt in dtype(), gdt in dtype(), out in dtype(),
             eps in prop_oneof![8 => Just(1e-5f32), 1 => prop_oneof![Just(0.0), Just(-1.0), Just(f32::NAN), Just(f32::INFINITY)]],
             zc in any::<bool>(), layer in any::<bool>()) {
        // gamma matches x's last dim unless the strategy drew another shape.
        let gs = gs.unwrap_or_else(|| vec![xs.last().copied().unwrap_or(1)]);
        let (Some(x), Some(g)) = (make(&xs, dt, 1), make(&gs, gdt, 2)) else { return Ok(()) };
        if layer {
            let b = make(&gs, gdt, 3).unwrap_or_else(|| g.clone());
            run::<LayerNormFwd>(&LayerNormFwdArgs { scale: None, x, gamma: g, beta: b, eps, zero_centered_gamma: zc, out_dtype: out })?;
        } else if let Some(o) = run::<RmsNormFwd>(&RmsNormFwdArgs { scale: None, x: x.clone(), gamma: g.clone(), eps, zero_centered_gamma: zc, out_dtype: out })? {
            let n = x.last_dim();
            let (y, _) = oracle::rmsnorm_fwd(&vals(&x), n, &vals(&g), f64::from(eps), zc);
            close("rmsnorm y", &o.y, &y, out.max_precision(dt))?;
        }
    }

    #[test]
    fn gemm(m in dim(), k in dim(), n in dim(), dt in dtype(), ta in any::<bool>(), tb in any::<bool>(),
            ep in prop_oneof![Just(GemmEpilogue::None), Just(GemmEpilogue::Bias), Just(GemmEpilogue::Gelu), Just(GemmEpilogue::BiasGrad)],
            out in dtype()) {
        let a_shape = if ta { [k, m] } else { [m, k] };
        let b_shape = if tb { [n, k] } else { [k, n] };
        let (Some(a), Some(b)) = (make(&a_shape, dt, 4), make(&b_shape, dt, 5)) else { return Ok(()) };
        let bias = ep.needs_bias().then(|| make(&[n], dt, 6)).flatten();
        let args = GemmArgs { a_scale_inv: None, b_scale_inv: None, d_scale: None, split_accumulator: false, a: a.clone(), b: b.clone(), bias: bias.clone(), aux: None, c: None, transa: ta, transb: tb,
                              alpha: 0.5, accumulate: false, epilogue: ep, out_dtype: out };
        if let Some(o) = run::<GenericGemm>(&args)? {
            let (d, _, _) = oracle::gemm(&vals(&a), &vals(&b), (m, k, n), ta, tb, 0.5, None,
                                         bias.as_ref().map(vals).as_deref(), None, ep);
            close("gemm d", &o.d, &d, out.max_precision(dt))?;
        }
    }

    #[test]
    fn activations(xs in shape(0..=3), dt in dtype(), which in 0usize..6, limit in prop_oneof![Just(7.0f32), Just(0.0), Just(f32::NAN)]) {
        let Some(x) = make(&xs, dt, 7) else { return Ok(()) };
        match which {
            0 => { if let Some(o) = run::<Gelu>(&ActArgs { x: x.clone() })? {
                close("gelu", &o.y, &vals(&x).iter().map(|v| oracle::act(Activation::Gelu, *v)).collect::<Vec<_>>(), dt)?;
            } }
            1 => { if let Some(o) = run::<Relu>(&ActArgs { x: x.clone() })? {
                close("relu", &o.y, &vals(&x).iter().map(|v| oracle::act(Activation::Relu, *v)).collect::<Vec<_>>(), dt)?;
            } }
            2 => { run::<Swiglu>(&ActArgs { x })?; }
            3 => { run::<ClampedSwiglu>(&ClampedSwigluArgs { x, limit, alpha: 1.702 })?; }
            4 => { let g = make(&xs, dt, 8).unwrap_or_else(|| x.clone()); run::<DBiasDGelu>(&DActArgs { grad: g, input: x })?; }
            _ => { let g = make(&xs, dt, 9).unwrap_or_else(|| x.clone()); run::<DSilu>(&DActArgs { grad: g, input: x })?; }
        }
    }

    #[test]
    fn softmax(xs in shape(1..=4), dt in dtype(), scale in prop_oneof![6 => Just(0.5f32), 1 => Just(0.0), 1 => Just(f32::NAN)], which in 0usize..4) {
        let Some(x) = make(&xs, dt, 10) else { return Ok(()) };
        let a = SoftmaxArgs { x: x.clone(), scale };
        match which {
            0 => { if let Some(o) = run::<ScaledSoftmaxForward>(&a)? {
                let (sq, sk) = (xs[xs.len().saturating_sub(2)], xs[xs.len() - 1]);
                close("softmax", &o.y, &oracle::softmax(&vals(&x), sq, sk, f64::from(scale), |_, _, _| false), dt)?;
            } }
            1 => { run::<ScaledUpperTriangMaskedSoftmaxForward>(&a)?; }
            2 => { run::<ScaledAlignedCausalMaskedSoftmaxForward>(&a)?; }
            _ => { let mask = make(&xs, DType::U8, 0).unwrap_or_else(|| x.clone());
                   run::<ScaledMaskedSoftmaxForward>(&MaskedSoftmaxArgs { x, mask, scale })?; }
        }
    }

    #[test]
    fn attention(b in 1usize..3, sq in 1usize..7, sk in 1usize..7, hk in 1usize..3, group in 1usize..3, d in prop_oneof![4 => Just(4usize), 4 => Just(8), 1 => Just(0)],
                 dt in dtype(), layout in prop_oneof![Just(QkvLayout::Bshd), Just(QkvLayout::Sbhd)],
                 mask in prop_oneof![Just(AttnMask::None), Just(AttnMask::Causal), Just(AttnMask::CausalBottomRight)],
                 left in prop_oneof![Just(None), (0usize..8).prop_map(Some), Just(Some(usize::MAX)), Just(Some(i64::MAX as usize))],
                 right in prop_oneof![Just(None), (0usize..8).prop_map(Some), Just(Some(usize::MAX))],
                 p in prop_oneof![6 => Just(0.0f32), 2 => Just(0.3), 1 => Just(1.0), 1 => Just(-0.1)], seed in any::<u64>(), offset in any::<u64>()) {
        let hq = hk * group;
        let shp = |s: usize, h: usize| match layout { QkvLayout::Sbhd => vec![s, b, h, d], _ => vec![b, s, h, d] };
        let (Some(q), Some(k), Some(v)) = (make(&shp(sq, hq), dt, 11), make(&shp(sk, hk), dt, 12), make(&shp(sk, hk), dt, 13)) else { return Ok(()) };
        let args = AttnFwdArgs { q: q.clone(), k: k.clone(), v: v.clone(), cu_seqlens_q: None, cu_seqlens_kv: None, layout, mask,
                                 scale: 0.5, dropout_p: p, seed, offset, window: AttnWindow { left, right },
                                 max_seqlen_q: None, max_seqlen_kv: None };
        if let Some(o) = run::<FusedAttnFwd>(&args)? {
            if p == 0.0 {
                let g = attn_geometry("props", &q, &k, &v, None, None, layout, mask).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let want = oracle::AttnProblem { g: &g, q: &vals(&q), k: &vals(&k), v: &vals(&v), mask, window: args.window,
                                                 scale: 0.5, p: 0.0, seed, offset }.forward();
                close("attention o", &o.o, &want.o, dt)?;
            }
            let lse = vals(&o.softmax_lse);
            let back = args.backward(o.o, q.clone(), o.softmax_lse);
            prop_assert!(lse.iter().all(|l| !l.is_nan()));
            run::<FusedAttnBwd>(&back)?;
        }
    }

    #[test]
    fn rope(s in 1usize..6, bsz in 1usize..3, h in 1usize..3, d in prop_oneof![Just(4usize), Just(6), Just(3), Just(0)], d_rot in 0usize..8,
            s_max in prop_oneof![1usize..10, Just(0usize)], start in prop_oneof![Just(0i32), 0i32..5, Just(i32::MAX), Just(-1)],
            dt in dtype(), interleaved in any::<bool>(), fwd in any::<bool>(), valid in prop_oneof![3 => Just(true), 1 => Just(false)]) {
        // Mostly a valid geometry (even d_rot <= d, enough freqs rows), else the drawn values.
        let (d_rot, s_max, start) = if valid { (d - d % 2, s + 4, start.clamp(0, 4)) } else { (d_rot, s_max, start) };
        let Some(x) = make(&[s, bsz, h, d], dt, 14) else { return Ok(()) };
        let Some(freqs) = make(&[s_max, d_rot], DType::F32, 15) else { return Ok(()) };
        let starts = Tensor::from_slice(&vec![start; bsz], [bsz], DType::I32).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let args = RopeArgs { x, freqs, cu_seqlens: None, start_positions: Some(starts), layout: QkvLayout::Sbhd, interleaved };
        if fwd { run::<FusedRopeForward>(&args)?; } else { run::<FusedRopeBackward>(&args)?; }
    }

    #[test]
    fn optimizers(shapes in proptest::collection::vec(shape(0..=2), 0..4), dt in dtype(),
                  step in prop_oneof![1 => Just(0u32), 2 => Just(1), 2 => 2u32..100, 2 => Just(i32::MAX as u32 + 1), 2 => Just(u32::MAX)],
                  lr in prop_oneof![6 => Just(1e-2f32), 1 => Just(f32::NAN), 1 => Just(-1.0)],
                  beta in prop_oneof![6 => Just(0.9f32), 1 => Just(1.0), 1 => Just(-0.5)],
                  alias in any::<bool>()) {
        let made: Option<Vec<(Tensor, Tensor, Tensor, Tensor)>> = shapes.iter().enumerate().map(|(i, s)| {
            Some((make(s, dt, 20 + i as u64)?, make(s, dt, 30 + i as u64)?, make(s, DType::F32, 40 + i as u64)?, make(s, DType::F32, 50 + i as u64)?))
        }).collect();
        let Some(made) = made else { return Ok(()) };
        let noop = Tensor::zeros([1], DType::I32, &Device::CPU).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut grads: Vec<Tensor> = made.iter().map(|t| t.0.clone()).collect();
        let params: Vec<Tensor> = made.iter().map(|t| t.1.clone()).collect();
        let m: Vec<Tensor> = made.iter().map(|t| t.2.clone()).collect();
        // Second moments are non-negative (a negative one would be NaN by the formula).
        let v: Vec<Tensor> = made
            .iter()
            .map(|t| Tensor::from_slice(&vals(&t.3).iter().map(|x| x.abs() as f32).collect::<Vec<_>>(), t.3.shape(), DType::F32))
            .collect::<tefl_core::Result<_>>()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        if alias && !m.is_empty() {
            grads[0] = m[0].clone();
        }
        let hyper = AdamHyper { lr, beta1: beta, beta2: 0.999, eps: 1e-8, step, mode: AdamMode::AdamW, bias_correction: true, weight_decay: 0.0 };
        let before: Vec<Vec<f64>> = params.iter().map(vals).collect();
        let args = MultiTensorAdamArgs { noop_flag: noop, grads: grads.clone(), params: params.clone(), exp_avg: m.clone(), exp_avg_sq: v.clone(), hyper };
        let mv: Vec<Vec<f64>> = m.iter().map(vals).collect();
        let vv: Vec<Vec<f64>> = v.iter().map(vals).collect();
        let gv: Vec<Vec<f64>> = grads.iter().map(vals).collect();
        if run::<MultiTensorAdam>(&args)?.is_some() {
            for (i, p) in params.iter().enumerate() {
                let want: Vec<f64> = (0..before[i].len()).map(|j| {
                    oracle::adam_step(before[i][j], gv[i][j], mv[i][j], vv[i][j], &hyper).0
                }).collect();
                let got = vals(p);
                prop_assert!(rel_err(&got, &tefl_tests::round(&want, dt)) <= tolerance(dt) * 4.0, "adam params at step {step}");
            }
        }
    }

    #[test]
    fn fp8_and_dropout(xs in shape(0..=3), dt in dtype(), fp8 in prop_oneof![4 => prop_oneof![Just(DType::F8E4M3), Just(DType::F8E5M2)], 1 => dtype()], t in any::<bool>(), p in prop_oneof![Just(0.0f32), Just(0.5), Just(1.0), Just(f32::NAN)],
                       seed in any::<u64>(), offset in prop_oneof![any::<u64>(), Just(u64::MAX)], hist in 0usize..4, margin in prop_oneof![Just(0.0f32), Just(f32::INFINITY)]) {
        let Some(x) = make(&xs, dt, 60) else { return Ok(()) };
        let scale = Tensor::from_slice(&[2.0f32], [1], DType::F32).map_err(|e| TestCaseError::fail(e.to_string()))?;
        if let Some(q) = run::<Quantize>(&QuantizeArgs { x: x.clone(), scale: scale.clone(), fp8_dtype: fp8, want_transpose: t })? {
            run::<Dequantize>(&DequantizeArgs { q: q.q.clone(), scale_inv: q.scale_inv, out_dtype: dt })?;
            run::<Fp8Transpose>(&Fp8TransposeArgs { q: q.q })?;
        }
        run::<ComputeAmax>(&ComputeAmaxArgs { x: x.clone() })?;
        if let Some(o) = run::<DropoutFwd>(&DropoutFwdArgs { x, p, seed, offset })? {
            run::<DropoutBwd>(&DropoutBwdArgs { dy: o.y, mask: o.mask, p })?;
        }
        let n = xs.last().copied().unwrap_or(1);
        if let (Some(h), Some(s), Some(si)) = (make(&[hist, n], DType::F32, 61), make(&[n], DType::F32, 62), make(&[n], DType::F32, 63)) {
            run::<FusedAmaxAndScaleUpdate>(&DelayedScalingArgs { amax_history: h, scale: s, scale_inv: si, fp8_max: 448.0, margin, algo: AmaxAlgo::Max })?;
        }
    }
}

/// The precision an output is compared at: the coarser of its own dtype and the input's.
trait Coarser {
    fn max_precision(self, other: DType) -> DType;
}

impl Coarser for DType {
    fn max_precision(self, other: DType) -> DType {
        let rank = |d: DType| match d {
            DType::F32 => 0,
            DType::F16 => 1,
            _ => 2,
        };
        if rank(self) >= rank(other) { self } else { other }
    }
}
