//! The reference backend against the f64 oracle: norms, GEMM, activations, softmax.
//! Fresh random inputs each run (seed printed), awkward shapes, every float dtype, closed-form
//! cases, and finite differences of the f64 forward for every backward op.

use tefl_core::DType;
use tefl_core::catalogue::*;
use tefl_tests::{Rng, assert_close, oracle, reference, rel_err, round, seed, tensor, values};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

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
fn rmsnorm_forward_and_backward_match_the_oracle() {
    let mut rng = Rng::new(seed("rmsnorm"));
    for dtype in DTYPES {
        for (rows, n) in [(1, 1000), (3, 4097), (5, 64), (2, 16384)] {
            for zc in [false, true] {
                let x = tensor(&rng.vec(rows * n, -2.0, 2.0), &[rows, n], dtype);
                let g = tensor(&rng.vec(n, -1.0, 1.0), &[n], dtype);
                let (xv, gv) = (values(&x), values(&g));
                let out_dtype = if zc { DType::F32 } else { dtype };
                let a =
                    RmsNormFwdArgs { x: x.clone(), gamma: g.clone(), eps: 1e-5, zero_centered_gamma: zc, out_dtype };
                let out = reference::<RmsNormFwd>(&a).unwrap();
                let (y, rs) = oracle::rmsnorm_fwd(&xv, n, &gv, 1e-5, zc);
                assert_eq!(out.y.dtype(), out_dtype);
                assert_close(&format!("rmsnorm_fwd y {rows}x{n} zc={zc}"), &values(&out.y), &y, out_dtype);
                assert_close("rmsnorm_fwd rsigma", &values(&out.rsigma), &rs, DType::F32);

                let dy = tensor(&rng.vec(rows * n, -1.0, 1.0), &[rows, n], dtype);
                let rs_t = out.rsigma.clone();
                let b = RmsNormBwdArgs {
                    dy: dy.clone(),
                    x: x.clone(),
                    rsigma: rs_t.clone(),
                    gamma: g.clone(),
                    zero_centered_gamma: zc,
                };
                let got = reference::<RmsNormBwd>(&b).unwrap();
                let (dx, dg) = oracle::rmsnorm_bwd(&values(&dy), &xv, &values(&rs_t), n, &gv, zc);
                assert_close("rmsnorm_bwd dx", &values(&got.dx), &dx, dtype);
                assert_close("rmsnorm_bwd dgamma", &values(&got.dgamma), &dg, dtype);

                let add = tensor(&rng.vec(rows * n, -1.0, 1.0), &[rows, n], dtype);
                let c = RmsNormBwdAddArgs {
                    dy,
                    x: x.clone(),
                    rsigma: rs_t,
                    gamma: g,
                    add: add.clone(),
                    zero_centered_gamma: zc,
                };
                let got = reference::<RmsNormBwdAdd>(&c).unwrap();
                let want: Vec<f64> = dx.iter().zip(values(&add)).map(|(a, b)| a + b).collect();
                assert_close("rmsnorm_bwd_add dx", &values(&got.dx), &want, dtype);
            }
        }
    }
}

#[test]
fn layernorm_forward_and_backward_match_the_oracle() {
    let mut rng = Rng::new(seed("layernorm"));
    for dtype in DTYPES {
        for (rows, n) in [(1, 1000), (4, 4097), (9, 33)] {
            let zc = rows % 2 == 0;
            let x = tensor(&rng.vec(rows * n, -3.0, 3.0), &[rows, n], dtype);
            let g = tensor(&rng.vec(n, -1.0, 1.0), &[n], dtype);
            let be = tensor(&rng.vec(n, -1.0, 1.0), &[n], dtype);
            let a = LayerNormFwdArgs {
                x: x.clone(),
                gamma: g.clone(),
                beta: be.clone(),
                eps: 1e-5,
                zero_centered_gamma: zc,
                out_dtype: dtype,
            };
            let out = reference::<LayerNormFwd>(&a).unwrap();
            let (y, mu, rs) = oracle::layernorm_fwd(&values(&x), n, &values(&g), &values(&be), 1e-5, zc);
            assert_close(&format!("layernorm_fwd y {rows}x{n}"), &values(&out.y), &y, dtype);
            assert_close("layernorm_fwd mu", &values(&out.mu), &mu, DType::F32);
            assert_close("layernorm_fwd rsigma", &values(&out.rsigma), &rs, DType::F32);
            let dy = tensor(&rng.vec(rows * n, -1.0, 1.0), &[rows, n], dtype);
            let b = LayerNormBwdArgs {
                dy: dy.clone(),
                x: x.clone(),
                mu: out.mu.clone(),
                rsigma: out.rsigma.clone(),
                gamma: g.clone(),
                zero_centered_gamma: zc,
            };
            let got = reference::<LayerNormBwd>(&b).unwrap();
            let (dx, dg, db) = oracle::layernorm_bwd(
                &values(&dy),
                &values(&x),
                &values(&out.mu),
                &values(&out.rsigma),
                n,
                &values(&g),
                zc,
            );
            assert_close("layernorm_bwd dx", &values(&got.dx), &dx, dtype);
            assert_close("layernorm_bwd dgamma", &values(&got.dgamma), &dg, dtype);
            assert_close("layernorm_bwd dbeta", &values(&got.dbeta), &db, dtype);
        }
    }
}

#[test]
fn norm_closed_forms() {
    // A constant row c: RMSNorm gives sign(c)·g·|c|/sqrt(c² + eps); LayerNorm gives beta.
    let x = tensor(&[3.0; 8], &[1, 8], DType::F32);
    let g = tensor(&[2.0; 8], &[8], DType::F32);
    let out = reference::<RmsNormFwd>(&RmsNormFwdArgs {
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

fn gemm_case(
    rng: &mut Rng,
    dtype: DType,
    (m, k, n): (usize, usize, usize),
    transa: bool,
    transb: bool,
    ep: GemmEpilogue,
    accumulate: bool,
) {
    let a = tensor(&rng.vec(m * k, -1.0, 1.0), &if transa { [k, m] } else { [m, k] }, dtype);
    let b = tensor(&rng.vec(k * n, -1.0, 1.0), &if transb { [n, k] } else { [k, n] }, dtype);
    let bias = ep.needs_bias().then(|| tensor(&rng.vec(n, -1.0, 1.0), &[n], dtype));
    let aux = ep.needs_aux().then(|| tensor(&rng.vec(m * n, -2.0, 2.0), &[m, n], dtype));
    let c = accumulate.then(|| tensor(&rng.vec(m * n, -1.0, 1.0), &[m, n], DType::F32));
    let alpha = 0.75;
    let args = GemmArgs {
        a: a.clone(),
        b: b.clone(),
        bias: bias.clone(),
        aux: aux.clone(),
        c: c.clone(),
        transa,
        transb,
        alpha,
        accumulate,
        epilogue: ep,
        out_dtype: dtype,
    };
    let got = reference::<GenericGemm>(&args).unwrap();
    let (d, aux_out, bias_grad) = oracle::gemm(
        &values(&a),
        &values(&b),
        (m, k, n),
        transa,
        transb,
        alpha as f64,
        c.as_ref().map(values).as_deref(),
        bias.as_ref().map(values).as_deref(),
        aux.as_ref().map(values).as_deref(),
        ep,
    );
    let what = format!("gemm {m}x{k}x{n} ta={transa} tb={transb} {ep:?} acc={accumulate}");
    assert_eq!(got.d.shape(), &[m, n]);
    assert_close(&what, &values(&got.d), &d, dtype);
    match (aux_out, got.aux_out) {
        (Some(w), Some(g)) => assert_close("  aux_out", &values(&g), &w, dtype),
        (None, None) => {}
        (w, g) => panic!("{what}: aux_out presence differs: {:?} vs {:?}", w.is_some(), g.is_some()),
    }
    match (bias_grad, got.bias_grad) {
        (Some(w), Some(g)) => assert_close("  bias_grad", &values(&g), &w, dtype),
        (None, None) => {}
        (w, g) => panic!("{what}: bias_grad presence differs: {:?} vs {:?}", w.is_some(), g.is_some()),
    }
}

#[test]
fn gemm_matches_the_oracle_for_every_epilogue_and_transpose() {
    let mut rng = Rng::new(seed("gemm"));
    let eps = [
        GemmEpilogue::None,
        GemmEpilogue::Bias,
        GemmEpilogue::Gelu,
        GemmEpilogue::BiasGelu,
        GemmEpilogue::DGelu,
        GemmEpilogue::DGeluBiasGrad,
        GemmEpilogue::BiasGrad,
    ];
    for dtype in DTYPES {
        for (i, &ep) in eps.iter().enumerate() {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                gemm_case(&mut rng, dtype, (17 + i, 33, 9 + 2 * i), ta, tb, ep, i % 2 == 1);
            }
        }
        gemm_case(&mut rng, dtype, (1, 1000, 257), false, true, GemmEpilogue::Bias, false);
        gemm_case(&mut rng, dtype, (65, 129, 1), true, false, GemmEpilogue::None, true);
    }
    gemm_case(&mut rng, DType::F32, (128, 256, 96), false, false, GemmEpilogue::BiasGelu, false);
}

#[test]
fn gemm_closed_form_identity_and_te_linear_mapping() {
    // input [2, 3] · weightᵀ with weight [4, 3] (TE's Linear forward: (weight, true, input, false)).
    let input = tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F32);
    let weight = tensor(&[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], &[4, 3], DType::F32);
    let out = reference::<GenericGemm>(&GemmArgs {
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
fn activations_match_the_oracle_and_finite_differences() {
    let mut rng = Rng::new(seed("activations"));
    type Fwd = fn(&tefl_core::Tensor) -> Vec<f64>;
    type Bwd = fn(&tefl_core::Tensor, &tefl_core::Tensor) -> Vec<f64>;
    let plain: [(Activation, Fwd, Bwd); 5] = [
        (Activation::Gelu, fwd_op::<Gelu>, bwd_op::<DGelu>),
        (Activation::Qgelu, fwd_op::<Qgelu>, bwd_op::<DQgelu>),
        (Activation::Relu, fwd_op::<Relu>, bwd_op::<DRelu>),
        (Activation::Srelu, fwd_op::<Srelu>, bwd_op::<DSrelu>),
        (Activation::Silu, fwd_op::<Silu>, bwd_op::<DSilu>),
    ];
    let gated: [(Activation, Fwd, Bwd); 5] = [
        (Activation::Gelu, fwd_op::<Geglu>, bwd_op::<DGeglu>),
        (Activation::Qgelu, fwd_op::<Qgeglu>, bwd_op::<DQgeglu>),
        (Activation::Relu, fwd_op::<Reglu>, bwd_op::<DReglu>),
        (Activation::Srelu, fwd_op::<Sreglu>, bwd_op::<DSreglu>),
        (Activation::Silu, fwd_op::<Swiglu>, bwd_op::<DSwiglu>),
    ];
    for dtype in DTYPES {
        let (rows, n) = (3, 1000);
        let x = tensor(&rng.vec(rows * n, -4.0, 4.0), &[rows, n], dtype);
        let x2 = tensor(&rng.vec(rows * 2 * n, -4.0, 4.0), &[rows, 2 * n], dtype);
        let g = tensor(&rng.vec(rows * n, -1.0, 1.0), &[rows, n], dtype);
        let (xv, x2v, gv) = (values(&x), values(&x2), values(&g));
        for (kind, f, b) in plain {
            let want: Vec<f64> = xv.iter().map(|v| oracle::act(kind, *v)).collect();
            assert_close(&format!("{kind:?}"), &f(&x), &want, dtype);
            let want: Vec<f64> = xv.iter().zip(&gv).map(|(v, g)| g * oracle::dact(kind, *v)).collect();
            assert_close(&format!("d{kind:?}"), &b(&g, &x), &want, dtype);
        }
        for (kind, f, b) in gated {
            assert_close(&format!("gated {kind:?}"), &f(&x2), &oracle::gated(kind, &x2v, n), dtype);
            let mut want = vec![0.0; x2v.len()];
            for r in 0..rows {
                for j in 0..n {
                    let (a, bb, gg) = (x2v[r * 2 * n + j], x2v[r * 2 * n + n + j], gv[r * n + j]);
                    want[r * 2 * n + j] = gg * bb * oracle::dact(kind, a);
                    want[r * 2 * n + n + j] = gg * oracle::act(kind, a);
                }
            }
            assert_close(&format!("d gated {kind:?}"), &b(&g, &x2), &want, dtype);
        }
        // clamped SwiGLU with its defaults.
        let out = reference::<ClampedSwiglu>(&ClampedSwigluArgs { x: x2.clone(), limit: 7.0, alpha: 1.702 }).unwrap();
        assert_close("clamped_swiglu", &values(&out.y), &oracle::clamped_swiglu(&x2v, n, 7.0, 1.702), dtype);
    }
    // dbias forms: dbias = Σ_rows of the input gradient.
    let (rows, n) = (5, 4097);
    let x = tensor(&rng.vec(rows * n, -3.0, 3.0), &[rows, n], DType::F32);
    let g = tensor(&rng.vec(rows * n, -1.0, 1.0), &[rows, n], DType::F32);
    let (xv, gv) = (values(&x), values(&g));
    type DB = fn(&DActArgs) -> DBiasOut;
    let dbias: [(Activation, DB); 5] = [
        (Activation::Gelu, |a| reference::<DBiasDGelu>(a).unwrap()),
        (Activation::Qgelu, |a| reference::<DBiasDQgelu>(a).unwrap()),
        (Activation::Relu, |a| reference::<DBiasDRelu>(a).unwrap()),
        (Activation::Srelu, |a| reference::<DBiasDSrelu>(a).unwrap()),
        (Activation::Silu, |a| reference::<DBiasDSilu>(a).unwrap()),
    ];
    for (kind, f) in dbias {
        let out = f(&DActArgs { grad: g.clone(), input: x.clone() });
        let gi: Vec<f64> = xv.iter().zip(&gv).map(|(v, g)| g * oracle::dact(kind, *v)).collect();
        let db: Vec<f64> = (0..n).map(|j| (0..rows).map(|r| gi[r * n + j]).sum()).collect();
        assert_close(&format!("dbias_d{kind:?} grad_input"), &values(&out.grad_input), &gi, DType::F32);
        assert_close(&format!("dbias_d{kind:?} dbias"), &values(&out.dbias), &db, DType::F32);
    }
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
fn softmax_variants_match_the_oracle() {
    let mut rng = Rng::new(seed("softmax"));
    for dtype in DTYPES {
        for (b, h, sq, sk) in [(2, 3, 5, 7), (1, 2, 9, 9), (1, 1, 3, 1000)] {
            let shape = [b, h, sq, sk];
            let n = b * h * sq * sk;
            let x = tensor(&rng.vec(n, -5.0, 5.0), &shape, dtype);
            let xv = values(&x);
            let scale = 0.7f32;
            let s = f64::from(scale);
            let want = oracle::softmax(&xv, sq, sk, s, |_, _, _| false);
            assert_close(
                &format!("scaled_softmax {shape:?}"),
                &softmax_fwd::<ScaledSoftmaxForward>(&x, scale),
                &want,
                dtype,
            );
            if sq <= sk {
                let want = oracle::softmax(&xv, sq, sk, s, |_, i, j| j > i);
                assert_close(
                    "upper_triang",
                    &softmax_fwd::<ScaledUpperTriangMaskedSoftmaxForward>(&x, scale),
                    &want,
                    dtype,
                );
            }
            let want = oracle::softmax(&xv, sq, sk, s, |_, i, j| j as i64 > i as i64 + sk as i64 - sq as i64);
            assert_close(
                "aligned_causal",
                &softmax_fwd::<ScaledAlignedCausalMaskedSoftmaxForward>(&x, scale),
                &want,
                dtype,
            );
            for mb in [1, b] {
                let mv: Vec<f64> =
                    (0..mb * sq * sk).map(|_| f64::from(u8::from(rng.uniform(0.0, 1.0) < 0.3))).collect();
                let mask = tefl_core::Tensor::from_slice(
                    &mv.iter().map(|v| *v as u8).collect::<Vec<_>>(),
                    [mb, 1, sq, sk],
                    DType::U8,
                )
                .unwrap();
                let got =
                    reference::<ScaledMaskedSoftmaxForward>(&MaskedSoftmaxArgs { x: x.clone(), mask, scale }).unwrap();
                let want = oracle::softmax(&xv, sq, sk, s, |r, i, j| {
                    let bb = if mb == 1 { 0 } else { r / (h * sq) };
                    mv[(bb * sq + i) * sk + j] != 0.0
                });
                assert_close(&format!("masked mask_b={mb}"), &values(&got.y), &want, dtype);
            }
            // Backward: dx = scale·y·(dy − Σ dy·y), on the forward's stored y.
            let y = reference::<ScaledSoftmaxForward>(&SoftmaxArgs { x: x.clone(), scale }).unwrap().y;
            let dy = tensor(&rng.vec(n, -1.0, 1.0), &shape, dtype);
            let (yv, dyv) = (values(&y), values(&dy));
            let mut want = vec![0.0; n];
            for r in 0..n / sk {
                let dt: f64 = (0..sk).map(|j| yv[r * sk + j] * dyv[r * sk + j]).sum();
                for j in 0..sk {
                    want[r * sk + j] = s * yv[r * sk + j] * (dyv[r * sk + j] - dt);
                }
            }
            let args = SoftmaxBwdArgs { dy: dy.clone(), y: y.clone(), scale };
            for got in [
                reference::<ScaledSoftmaxBackward>(&args).unwrap().dx,
                reference::<ScaledMaskedSoftmaxBackward>(&args).unwrap().dx,
                reference::<ScaledUpperTriangMaskedSoftmaxBackward>(&args).unwrap().dx,
                reference::<ScaledAlignedCausalMaskedSoftmaxBackward>(&args).unwrap().dx,
            ] {
                assert_close("softmax backward", &values(&got), &want, dtype);
            }
        }
    }
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
