//! The reference backend on closed-form cases and against finite differences of the f64
//! forward for its backward ops: norms, GEMM, activations, softmax. (The oracle comparisons
//! over every dtype and shape are the conformance suite's: `conformance_reference.rs`.)

use tefl_core::DType;
use tefl_core::catalogue::*;
use tefl_tests::{Rng, oracle, reference, rel_err, round, seed, tensor, values};

/// Central differences of a scalar function of `x`.
fn fd_grad(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut x = x.to_vec();
    (0..x.len())
        .map(|i| {
            let h = 1e-6 * x[i].abs().max(1.0);
            let orig = x[i];
            x[i] = orig + h;
            let up = f(&x);
            x[i] = orig - h;
            let down = f(&x);
            x[i] = orig;
            (up - down) / (2.0 * h)
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[track_caller]
fn assert_fd(what: &str, got: &[f64], want: &[f64]) {
    let e = rel_err(got, want);
    println!("  {what:<40} finite differences rel {e:.3e}");
    assert!(e < 2e-4, "{what}: backward differs from finite differences of the forward: {e:.3e}");
}

#[test]
fn norm_closed_forms() {
    // A constant row c: RMSNorm gives sign(c)·g·|c|/sqrt(c² + eps); LayerNorm gives beta.
    let x = tensor(&[3.0; 8], &[1, 8], DType::F32);
    let g = tensor(&[2.0; 8], &[8], DType::F32);
    let out = reference::<RmsNormFwd>(&RmsNormFwdArgs {
        scale: None,
        x: x.clone(),
        gamma: g.clone(),
        eps: 1e-6,
        zero_centered_gamma: false,
        out_dtype: DType::F32,
    })
    .unwrap();
    let want = 2.0 * 3.0 / (9.0f64 + 1e-6).sqrt();
    assert!(values(&out.y).iter().all(|v| (v - want).abs() < 1e-6), "{:?}", values(&out.y));
    let beta = tensor(&[0.5; 8], &[8], DType::F32);
    let out = reference::<LayerNormFwd>(&LayerNormFwdArgs {
        scale: None,
        x,
        gamma: g,
        beta,
        eps: 1e-5,
        zero_centered_gamma: false,
        out_dtype: DType::F32,
    })
    .unwrap();
    assert_eq!(values(&out.y), vec![0.5; 8]);
    assert_eq!(values(&out.mu), vec![3.0]);
}

#[test]
fn norm_backwards_match_finite_differences() {
    let mut rng = Rng::new(seed("norm_fd"));
    let (rows, n) = (3, 7);
    let xv = rng.vec(rows * n, -2.0, 2.0);
    let gv = rng.vec(n, 0.5, 1.5);
    let bv = rng.vec(n, -0.5, 0.5);
    let w = rng.vec(rows * n, -1.0, 1.0);
    let x = tensor(&xv, &[rows, n], DType::F32);
    let (xv, gv) = (values(&x), values(&tensor(&gv, &[n], DType::F32)));
    let g = tensor(&gv, &[n], DType::F32);
    let dy = tensor(&w, &[rows, n], DType::F32);
    let w = values(&dy);
    for zc in [false, true] {
        let fwd = reference::<RmsNormFwd>(&RmsNormFwdArgs {
            scale: None,
            x: x.clone(),
            gamma: g.clone(),
            eps: 1e-3,
            zero_centered_gamma: zc,
            out_dtype: DType::F32,
        })
        .unwrap();
        let got = reference::<RmsNormBwd>(&RmsNormBwdArgs {
            dy: dy.clone(),
            x: x.clone(),
            rsigma: fwd.rsigma,
            gamma: g.clone(),
            zero_centered_gamma: zc,
        })
        .unwrap();
        let fdx = fd_grad(&xv, |x| dot(&w, &oracle::rmsnorm_fwd(x, n, &gv, 1e-3, zc).0));
        let fdg = fd_grad(&gv, |g| dot(&w, &oracle::rmsnorm_fwd(&xv, n, g, 1e-3, zc).0));
        assert_fd("rmsnorm_bwd dx", &values(&got.dx), &fdx);
        assert_fd("rmsnorm_bwd dgamma", &values(&got.dgamma), &fdg);
        let be = tensor(&bv, &[n], DType::F32);
        let bvv = values(&be);
        let fwd = reference::<LayerNormFwd>(&LayerNormFwdArgs {
            scale: None,
            x: x.clone(),
            gamma: g.clone(),
            beta: be,
            eps: 1e-3,
            zero_centered_gamma: zc,
            out_dtype: DType::F32,
        })
        .unwrap();
        let got = reference::<LayerNormBwd>(&LayerNormBwdArgs {
            dy: dy.clone(),
            x: x.clone(),
            mu: fwd.mu,
            rsigma: fwd.rsigma,
            gamma: g.clone(),
            zero_centered_gamma: zc,
        })
        .unwrap();
        let fdx = fd_grad(&xv, |x| dot(&w, &oracle::layernorm_fwd(x, n, &gv, &bvv, 1e-3, zc).0));
        let fdg = fd_grad(&gv, |g| dot(&w, &oracle::layernorm_fwd(&xv, n, g, &bvv, 1e-3, zc).0));
        let fdb = fd_grad(&bvv, |b| dot(&w, &oracle::layernorm_fwd(&xv, n, &gv, b, 1e-3, zc).0));
        assert_fd("layernorm_bwd dx", &values(&got.dx), &fdx);
        assert_fd("layernorm_bwd dgamma", &values(&got.dgamma), &fdg);
        assert_fd("layernorm_bwd dbeta", &values(&got.dbeta), &fdb);
    }
}

#[test]
fn gemm_closed_form_identity_and_te_linear_mapping() {
    // input [2, 3] · weightᵀ with weight [4, 3] (TE's Linear forward: (weight, true, input, false)).
    let input = tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F32);
    let weight = tensor(&[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], &[4, 3], DType::F32);
    let out = reference::<GenericGemm>(&GemmArgs {
        a_scale_inv: None,
        b_scale_inv: None,
        d_scale: None,
        split_accumulator: false,
        a: input,
        b: weight,
        bias: None,
        aux: None,
        c: None,
        transa: false,
        transb: true,
        alpha: 1.0,
        accumulate: false,
        epilogue: GemmEpilogue::None,
        out_dtype: DType::F32,
    })
    .unwrap();
    assert_eq!(values(&out.d), vec![1.0, 2.0, 3.0, 6.0, 4.0, 5.0, 6.0, 15.0]);
}

fn fwd_op<O: tefl_core::Op<Args = ActArgs, Output = ActOut>>(x: &tefl_core::Tensor) -> Vec<f64> {
    values(&reference::<O>(&ActArgs { x: x.clone() }).unwrap().y)
}

fn bwd_op<O: tefl_core::Op<Args = DActArgs, Output = DActOut>>(
    g: &tefl_core::Tensor,
    x: &tefl_core::Tensor,
) -> Vec<f64> {
    values(&reference::<O>(&DActArgs { grad: g.clone(), input: x.clone() }).unwrap().grad_input)
}

#[test]
fn activation_backwards_match_finite_differences_of_the_forward() {
    let mut rng = Rng::new(seed("activation_fd"));
    let n = 6;
    // Keep inputs away from the kinks of relu/srelu and from the clamp limits.
    let mut xs = rng.vec(2 * n, -3.0, 3.0);
    xs.iter_mut().for_each(|v| {
        if v.abs() < 0.05 {
            *v += 0.2
        }
    });
    let x = tensor(&xs, &[1, 2 * n], DType::F32);
    let xv = values(&x);
    let w = tensor(&rng.vec(2 * n, -1.0, 1.0), &[1, 2 * n], DType::F32);
    let wv = values(&w);
    let wh = tensor(&wv[..n], &[1, n], DType::F32);
    for kind in Activation::ALL {
        let got = match kind {
            Activation::Gelu => bwd_op::<DGelu>(&w, &x),
            Activation::Qgelu => bwd_op::<DQgelu>(&w, &x),
            Activation::Relu => bwd_op::<DRelu>(&w, &x),
            Activation::Srelu => bwd_op::<DSrelu>(&w, &x),
            Activation::Silu => bwd_op::<DSilu>(&w, &x),
        };
        let fd = fd_grad(&xv, |x| x.iter().zip(&wv).map(|(v, w)| w * oracle::act(kind, *v)).sum());
        assert_fd(&format!("d{kind:?}"), &got, &fd);
        let got = match kind {
            Activation::Gelu => bwd_op::<DGeglu>(&wh, &x),
            Activation::Qgelu => bwd_op::<DQgeglu>(&wh, &x),
            Activation::Relu => bwd_op::<DReglu>(&wh, &x),
            Activation::Srelu => bwd_op::<DSreglu>(&wh, &x),
            Activation::Silu => bwd_op::<DSwiglu>(&wh, &x),
        };
        let fd = fd_grad(&xv, |x| dot(&wv[..n], &oracle::gated(kind, x, n)));
        assert_fd(&format!("d gated {kind:?}"), &got, &fd);
    }
    let got = reference::<ClampedDSwiglu>(&ClampedDSwigluArgs {
        grad: wh.clone(),
        input: x.clone(),
        limit: 2.0,
        alpha: 1.702,
    })
    .unwrap();
    let fd = fd_grad(&xv, |x| dot(&wv[..n], &oracle::clamped_swiglu(x, n, 2.0, 1.702)));
    assert_fd("clamped_dswiglu", &values(&got.grad_input), &fd);
}

#[test]
fn activation_closed_forms() {
    let x = tensor(&[0.0, 1.0, -1.0, 2.0], &[4], DType::F32);
    assert_eq!(fwd_op::<Relu>(&x), vec![0.0, 1.0, 0.0, 2.0]);
    assert_eq!(fwd_op::<Srelu>(&x), vec![0.0, 1.0, 0.0, 4.0]);
    assert_eq!(fwd_op::<Gelu>(&x)[0], 0.0);
    assert!((fwd_op::<Silu>(&x)[1] - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-7);
    // swiglu([a | b]) with b = 0 is 0.
    let ab = tensor(&[1.0, 2.0, 0.0, 0.0], &[1, 4], DType::F32);
    assert_eq!(fwd_op::<Swiglu>(&ab), vec![0.0, 0.0]);
}

fn softmax_fwd<O: tefl_core::Op<Args = SoftmaxArgs, Output = SoftmaxOut>>(
    x: &tefl_core::Tensor,
    scale: f32,
) -> Vec<f64> {
    values(&reference::<O>(&SoftmaxArgs { x: x.clone(), scale }).unwrap().y)
}

#[test]
fn softmax_closed_forms_and_fully_masked_rows() {
    let x = tensor(&[2.0; 8], &[1, 1, 2, 4], DType::F32);
    assert_eq!(softmax_fwd::<ScaledSoftmaxForward>(&x, 3.0), vec![0.25; 8]);
    let causal = softmax_fwd::<ScaledUpperTriangMaskedSoftmaxForward>(&x, 1.0);
    assert_eq!(causal, vec![1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0]);
    let aligned = softmax_fwd::<ScaledAlignedCausalMaskedSoftmaxForward>(&x, 1.0);
    assert_eq!(aligned, round(&[1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.0, 0.25, 0.25, 0.25, 0.25], DType::F32));
    let mask = tefl_core::Tensor::from_slice(&[1u8, 1, 1, 1, 0, 1, 1, 1], [1, 1, 2, 4], DType::U8).unwrap();
    let got = reference::<ScaledMaskedSoftmaxForward>(&MaskedSoftmaxArgs { x, mask, scale: 1.0 }).unwrap();
    assert_eq!(values(&got.y), vec![0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], "a fully masked row is zeros, not NaN");
}

#[test]
fn softmax_backward_matches_finite_differences() {
    let mut rng = Rng::new(seed("softmax_fd"));
    let (sq, sk) = (2, 5);
    let x = tensor(&rng.vec(sq * sk, -2.0, 2.0), &[1, 1, sq, sk], DType::F32);
    let w = tensor(&rng.vec(sq * sk, -1.0, 1.0), &[1, 1, sq, sk], DType::F32);
    let (xv, wv) = (values(&x), values(&w));
    let y = reference::<ScaledSoftmaxForward>(&SoftmaxArgs { x, scale: 1.3 }).unwrap().y;
    let got = reference::<ScaledSoftmaxBackward>(&SoftmaxBwdArgs { dy: w, y, scale: 1.3 }).unwrap().dx;
    let fd = fd_grad(&xv, |x| dot(&wv, &oracle::softmax(x, sq, sk, 1.3, |_, _, _| false)));
    assert_fd("scaled_softmax_backward", &values(&got), &fd);
}
