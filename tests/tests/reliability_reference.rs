//! The reproductions of issue 12 that go through ops on the default build (reference
//! backend, CPU), each pinned by a test: huge windows (1), huge products (4), NaN in the
//! query (8), huge Adam steps (10) and aliased in-place arguments (11).

use tefl_core::catalogue::*;
use tefl_core::{DType, Device, Error, Tensor};
use tefl_tests::{Rng, oracle, seed, tensor, values};

fn m() -> &'static tefl_core::Manager {
    tefl_tests::manager()
}

fn attn(q: &Tensor, k: &Tensor, v: &Tensor, window: AttnWindow) -> tefl_core::Result<AttnFwdOut> {
    tefl_ops::fused_attn_fwd(q, k, v).mask(AttnMask::Causal).scale(0.5).window(window).call_with(m())
}

/// Defect 1: a window wider than the sequence means unbounded, whatever the integer.
#[test]
fn huge_windows_are_unbounded() {
    let mut rng = Rng::new(seed("huge_windows"));
    let shape = [1, 6, 1, 4];
    let (q, k, v) = (
        tensor(&rng.vec(24, -2.0, 2.0), &shape, DType::F32),
        tensor(&rng.vec(24, -2.0, 2.0), &shape, DType::F32),
        tensor(&rng.vec(24, -2.0, 2.0), &shape, DType::F32),
    );
    let plain = attn(&q, &k, &v, AttnWindow::default()).unwrap();
    let (po, pl) = (values(&plain.o), values(&plain.softmax_lse));
    assert!(pl.iter().all(|l| l.is_finite()));
    for w in [
        AttnWindow { left: Some(usize::MAX), right: None },
        AttnWindow { left: Some(i64::MAX as usize), right: Some(i64::MAX as usize) },
        AttnWindow { left: Some(usize::MAX), right: Some(usize::MAX) },
        AttnWindow { left: Some(12), right: Some(1 << 40) },
    ] {
        let o = attn(&q, &k, &v, w).unwrap();
        assert_eq!(values(&o.o), po, "{w:?}");
        assert_eq!(values(&o.softmax_lse), pl, "{w:?}");
    }
}

/// Defect 4: a product whose size no memory holds is an error naming it, never an abort;
/// one whose size overflows is rejected in validation, naming the argument.
#[test]
fn huge_gemm_products_are_errors() {
    let gemm = |m_: usize, n: usize| {
        let a = Tensor::zeros([m_, 0], DType::F32, &Device::CPU).unwrap();
        let b = Tensor::zeros([0, n], DType::F32, &Device::CPU).unwrap();
        tefl_ops::generic_gemm(&a, &b).call_with(m())
    };
    match gemm(1 << 30, 1 << 30) {
        Err(Error::AllFailed { failures, .. }) => {
            assert!(
                failures.iter().all(|(_, e)| e.contains("out of memory") && e.contains("generic_gemm output d")),
                "{failures:?}"
            )
        }
        Err(Error::OutOfMemory { what, .. }) => assert!(what.contains("generic_gemm"), "{what}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(gemm(1 << 32, 1 << 32), Err(Error::Shape { arg: "b", .. })));
    // k = 0 with a size that fits is a real (zero) product.
    let d = gemm(3, 5).unwrap().d;
    assert_eq!((d.shape(), values(&d)), (&[3usize, 5][..], vec![0.0; 15]));
}

/// A gradient with no rows and a huge width (`[0, 2^40]`, no memory) has a bias gradient no
/// memory holds, and `2^62` one whose byte size overflows: both are errors naming the output,
/// never an abort (found by the gemm property, which shrank a capacity-overflow panic of the
/// bias-gradient sums into a 4 TiB allocation).
#[test]
fn empty_rows_with_huge_widths_are_errors() {
    let oom = |r: tefl_core::Result<String>, what: &str| match r {
        Err(Error::AllFailed { failures, .. }) => {
            assert!(failures.iter().all(|(_, e)| e.contains("out of memory") && e.contains(what)), "{failures:?}")
        }
        Err(Error::OutOfMemory { what: w, .. }) => assert!(w.contains(what), "{w}"),
        other => panic!("{what}: {other:?}"),
    };
    for n in [1usize << 40, 1 << 62] {
        let a = Tensor::zeros([0, 0], DType::F32, &Device::CPU).unwrap();
        let b = Tensor::zeros([0, n], DType::F32, &Device::CPU).unwrap();
        let r = tefl_ops::generic_gemm(&a, &b).epilogue(GemmEpilogue::BiasGrad).call_with(m());
        oom(r.map(|o| format!("{o:?}")), "bias_grad");
        // The column-sum ops reject rowless inputs up front; either way, an error.
        let g = Tensor::zeros([0, n], DType::F32, &Device::CPU).unwrap();
        let scale = tensor(&[1.0], &[1], DType::F32);
        for r in [
            tefl_ops::dbias_dgelu(&g, &g).call_with(m()).map(|o| format!("{o:?}")),
            tefl_ops::bgrad_quantize(&g, DType::F8E4M3, &scale).call_with(m()).map(|o| format!("{o:?}")),
        ] {
            match r {
                Err(Error::Shape { .. }) => {}
                r => oom(r, "dbias"),
            }
        }
    }
    // A width that fits is a real (zero) bias gradient.
    let a = Tensor::zeros([0, 3], DType::F32, &Device::CPU).unwrap();
    let b = tensor(&[1.0; 15], &[3, 5], DType::F32);
    let o = tefl_ops::generic_gemm(&a, &b).epilogue(GemmEpilogue::BiasGrad).call_with(m()).unwrap();
    assert_eq!(values(o.bias_grad.as_ref().unwrap()), vec![0.0; 5]);
}

/// Defect 8: NaN in the query reaches its output row and log-sum-exp.
#[test]
fn nan_in_the_query_propagates() {
    let mut qv: Vec<f64> = (0..12).map(|i| f64::from(i) / 10.0 - 0.5).collect();
    qv[0] = f64::NAN;
    let shape = [1, 3, 1, 4];
    let q = tensor(&qv, &shape, DType::F32);
    let kv = tensor(&(0..12).map(|i| f64::from(i % 5) / 4.0).collect::<Vec<_>>(), &shape, DType::F32);
    let o = tefl_ops::fused_attn_fwd(&q, &kv, &kv).scale(0.5).call_with(m()).unwrap();
    let (ov, lse) = (values(&o.o), values(&o.softmax_lse));
    assert!(ov[..4].iter().all(|x| x.is_nan()), "row 0: {:?}", &ov[..4]);
    assert!(lse[0].is_nan());
    assert!(ov[4..].iter().all(|x| x.is_finite()) && lse[1..].iter().all(|x| x.is_finite()));
}

fn adam_args(grads: Tensor, p: Tensor, mm: Tensor, v: Tensor, step: u32) -> MultiTensorAdamArgs {
    MultiTensorAdamArgs {
        noop_flag: Tensor::zeros([1], DType::I32, &Device::CPU).unwrap(),
        grads: vec![grads],
        params: vec![p],
        exp_avg: vec![mm],
        exp_avg_sq: vec![v],
        hyper: AdamHyper { step, ..AdamHyper::adamw(1e-2) },
    }
}

/// Defect 10: a step past i32::MAX has bias corrections of 1, not NaN.
#[test]
fn huge_adam_steps_are_exact() {
    let mut rng = Rng::new(seed("huge_adam_steps"));
    for step in [i32::MAX as u32, i32::MAX as u32 + 1, u32::MAX] {
        let (gv, pv) = (rng.vec(9, -1.0, 1.0), rng.vec(9, -1.0, 1.0));
        let p = tensor(&pv, &[9], DType::F32);
        let (mm, v) = (tensor(&[0.0; 9], &[9], DType::F32), tensor(&[0.0; 9], &[9], DType::F32));
        m().call::<MultiTensorAdam>(&adam_args(tensor(&gv, &[9], DType::F32), p.clone(), mm, v, step)).unwrap();
        let hyper = AdamHyper { step, ..AdamHyper::adamw(1e-2) };
        let want: Vec<f64> = (0..9).map(|j| oracle::adam_step(pv[j], gv[j], 0.0, 0.0, &hyper).0).collect();
        tefl_tests::assert_close(&format!("adam params at step {step}"), &values(&p), &want, DType::F32);
    }
}

/// Defect 11: aliased in-place arguments are rejected in validation, naming both.
#[test]
fn aliased_in_place_arguments_are_rejected() {
    let mm = tensor(&[0.1; 4], &[4], DType::F32);
    let (p, v) = (tensor(&[1.0; 4], &[4], DType::F32), tensor(&[0.0; 4], &[4], DType::F32));
    match m().call::<MultiTensorAdam>(&adam_args(mm.clone(), p, mm, v, 1)) {
        Err(Error::InvalidArgument { arg: "exp_avg", reason, .. }) => assert!(reason.contains("'grads'"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let h = tensor(&[1.0, 2.0], &[2, 1], DType::F32);
    let s = tensor(&[1.0], &[1], DType::F32);
    let r = m().call::<FusedAmaxAndScaleUpdate>(&DelayedScalingArgs {
        amax_history: h,
        scale: s.clone(),
        scale_inv: s.clone(),
        fp8_max: 448.0,
        margin: 0.0,
        algo: AmaxAlgo::Max,
    });
    assert!(matches!(r, Err(Error::InvalidArgument { arg: "scale_inv", .. })), "{r:?}");
    assert_eq!(values(&s), vec![1.0], "nothing was written");
}
