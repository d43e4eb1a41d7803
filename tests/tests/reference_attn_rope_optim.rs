//! The reference backend on closed forms, finite differences and invariants (attention,
//! RoPE, optimizers, FP8, dropout), and the typed errors bad input gets before dispatch.
//! (The oracle comparisons over every dtype and shape are the conformance suite's.)
#![allow(clippy::needless_range_loop)] // index loops mirror the formulas

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, Tensor};
use tefl_tests::{Rng, assert_close, manager, oracle, reference, rel_err, round, seed, tensor, values};

fn i32s(v: &[i32]) -> Tensor {
    Tensor::from_slice(v, [v.len()], DType::I32).unwrap()
}

/// The shape knobs of the finite-difference attention case.
struct AttnCase {
    layout: QkvLayout,
    mask: AttnMask,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    d: usize,
    window: AttnWindow,
}

fn shape(layout: QkvLayout, b: usize, s: usize, h: usize, d: usize, total: usize) -> Vec<usize> {
    match layout {
        QkvLayout::Bshd => vec![b, s, h, d],
        QkvLayout::Sbhd => vec![s, b, h, d],
        QkvLayout::Thd => vec![total, h, d],
    }
}

#[test]
fn attention_closed_form_single_key_returns_v() {
    let q = tensor(&[0.3, -0.2, 0.5, 0.1], &[1, 1, 1, 4], DType::F32);
    let k = tensor(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 1, 4], DType::F32);
    let v = tensor(&[5.0, 6.0, 7.0, 8.0], &[1, 1, 1, 4], DType::F32);
    let out = reference::<FusedAttnFwd>(&AttnFwdArgs {
        q,
        k,
        v,
        cu_seqlens_q: None,
        cu_seqlens_kv: None,
        layout: QkvLayout::Bshd,
        mask: AttnMask::None,
        scale: 0.5,
        dropout_p: 0.0,
        seed: 0,
        offset: 0,
        window: AttnWindow::default(),
        max_seqlen_q: None,
        max_seqlen_kv: None,
    })
    .unwrap();
    assert_eq!(values(&out.o), vec![5.0, 6.0, 7.0, 8.0]);
    let s = 0.5 * (0.3 - 0.4 + 1.5 + 0.4);
    assert!((values(&out.softmax_lse)[0] - s).abs() < 1e-6);
}

#[test]
fn attention_backward_over_many_key_tiles_matches_the_oracle() {
    // The CPU backward's tasks take a (sequence, kv head)'s key tiles a window of eight at a
    // time, and split them between several tasks when there are few heads for the threads (each
    // task's share of dQ summed afterwards): 1030 keys are nine tiles of 128, so one thread
    // gives one task two windows, and eight threads eight shares of one or two tiles. GQA (two
    // query heads a kv head) and a causal mask, f32, against the f64 oracle.
    let (b, s, hq, hk, d) = (2, 1030, 2, 1, 8);
    let mut rng = Rng::new(seed("attention_key_tiles"));
    let (qs, ks) = (shape(QkvLayout::Bshd, b, s, hq, d, 0), shape(QkvLayout::Bshd, b, s, hk, d, 0));
    let mk = |rng: &mut Rng, sh: &[usize]| tensor(&rng.vec(sh.iter().product(), -1.0, 1.0), sh, DType::F32);
    let (q, k, v, d_o) = (mk(&mut rng, &qs), mk(&mut rng, &ks), mk(&mut rng, &ks), mk(&mut rng, &qs));
    let args =
        tefl_ops::fused_attn_fwd(&q, &k, &v).layout(QkvLayout::Bshd).mask(AttnMask::Causal).scale(0.7).args().clone();
    let g = attn_geometry("t", &q, &k, &v, None, None, QkvLayout::Bshd, AttnMask::Causal).unwrap();
    let (qv, kv, vv) = (values(&q), values(&k), values(&v));
    let problem = oracle::AttnProblem {
        g: &g,
        q: &qv,
        k: &kv,
        v: &vv,
        mask: AttnMask::Causal,
        window: AttnWindow::default(),
        scale: 0.7,
        p: 0.0,
        seed: 0,
        offset: 0,
    };
    let (dq, dk, dv) = problem.backward(&values(&d_o));
    for threads in [1, 8] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let got = pool.install(|| {
            let fwd = reference::<FusedAttnFwd>(&args).unwrap();
            reference::<FusedAttnBwd>(&args.backward(fwd.o, d_o.clone(), fwd.softmax_lse)).unwrap()
        });
        for (name, t, want) in [("dq", &got.dq, &dq), ("dk", &got.dk, &dk), ("dv", &got.dv, &dv)] {
            let e = rel_err(&values(t), want);
            assert!(e < 1e-5, "{threads} threads, {name}: {e}");
        }
    }
}

#[test]
fn attention_backward_matches_finite_differences() {
    let mut rng = Rng::new(seed("attention_fd"));
    let c = AttnCase {
        layout: QkvLayout::Bshd,
        mask: AttnMask::Causal,
        sq: 3,
        sk: 4,
        hq: 2,
        hk: 1,
        d: 4,
        window: AttnWindow::default(),
    };
    let qs = shape(c.layout, 1, c.sq, c.hq, c.d, 0);
    let ks = shape(c.layout, 1, c.sk, c.hk, c.d, 0);
    let q = tensor(&rng.vec(qs.iter().product(), -1.0, 1.0), &qs, DType::F32);
    let k = tensor(&rng.vec(ks.iter().product(), -1.0, 1.0), &ks, DType::F32);
    let v = tensor(&rng.vec(ks.iter().product(), -1.0, 1.0), &ks, DType::F32);
    let w = tensor(&rng.vec(qs.iter().product(), -1.0, 1.0), &qs, DType::F32);
    let g = attn_geometry("t", &q, &k, &v, None, None, c.layout, c.mask).unwrap();
    let (qv, kv, vv, wv) = (values(&q), values(&k), values(&v), values(&w));
    let loss = |qv: &[f64], kv: &[f64], vv: &[f64]| -> f64 {
        let p = oracle::AttnProblem {
            g: &g,
            q: qv,
            k: kv,
            v: vv,
            mask: c.mask,
            window: c.window,
            scale: 0.5,
            p: 0.0,
            seed: 0,
            offset: 0,
        };
        p.forward().o.iter().zip(&wv).map(|(a, b)| a * b).sum()
    };
    let fd = |x: &[f64], which: usize| -> Vec<f64> {
        let mut x = x.to_vec();
        (0..x.len())
            .map(|i| {
                let o = x[i];
                x[i] = o + 1e-6;
                let up = match which {
                    0 => loss(&x, &kv, &vv),
                    1 => loss(&qv, &x, &vv),
                    _ => loss(&qv, &kv, &x),
                };
                x[i] = o - 1e-6;
                let dn = match which {
                    0 => loss(&x, &kv, &vv),
                    1 => loss(&qv, &x, &vv),
                    _ => loss(&qv, &kv, &x),
                };
                x[i] = o;
                (up - dn) / 2e-6
            })
            .collect()
    };
    let fwd_args = AttnFwdArgs {
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        cu_seqlens_q: None,
        cu_seqlens_kv: None,
        layout: c.layout,
        mask: c.mask,
        scale: 0.5,
        dropout_p: 0.0,
        seed: 0,
        offset: 0,
        window: c.window,
        max_seqlen_q: None,
        max_seqlen_kv: None,
    };
    let fwd = reference::<FusedAttnFwd>(&fwd_args).unwrap();
    let got = reference::<FusedAttnBwd>(&fwd_args.backward(fwd.o, w.clone(), fwd.softmax_lse)).unwrap();
    for (name, t, which, x) in [("dq", &got.dq, 0, &qv), ("dk", &got.dk, 1, &kv), ("dv", &got.dv, 2, &vv)] {
        let e = rel_err(&values(t), &fd(x, which));
        println!("  attention {name} vs finite differences: {e:.3e}");
        assert!(e < 2e-4, "{name}: {e}");
    }
}

fn rope(args: &RopeArgs, backward: bool) -> Vec<f64> {
    if backward {
        values(&reference::<FusedRopeBackward>(args).unwrap().y)
    } else {
        values(&reference::<FusedRopeForward>(args).unwrap().y)
    }
}

#[test]
fn rope_matches_the_oracle_and_its_backward_is_the_transpose() {
    let mut rng = Rng::new(seed("rope"));
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for layout in [QkvLayout::Sbhd, QkvLayout::Bshd, QkvLayout::Thd] {
            for interleaved in [false, true] {
                let (b, s, h, d, d_rot, s_max) = (3, 11, 2, 64, 32, 40);
                let cu = vec![0, 4, 15, 22];
                let total = 22;
                let xs = match layout {
                    QkvLayout::Sbhd => vec![s, b, h, d],
                    QkvLayout::Bshd => vec![b, s, h, d],
                    QkvLayout::Thd => vec![total, h, d],
                };
                let n: usize = xs.iter().product();
                let x = tensor(&rng.vec(n, -1.0, 1.0), &xs, dtype);
                let freqs_v = rng.vec(s_max * d_rot, -3.0, 3.0);
                let freqs = tensor(&freqs_v, &[s_max, d_rot], DType::F32);
                let fv = values(&freqs);
                let starts = vec![0, 5, 17];
                let args = RopeArgs {
                    x: x.clone(),
                    freqs: freqs.clone(),
                    cu_seqlens: (layout == QkvLayout::Thd).then(|| i32s(&cu)),
                    start_positions: Some(i32s(&starts)),
                    layout,
                    interleaved,
                };
                let g = rope_geometry("t", &args).unwrap();
                let xv = values(&x);
                let mut want = xv.clone();
                for bi in 0..g.batch {
                    for p in 0..g.spans[bi].1 {
                        let row = g.row(bi, p);
                        let pos = starts[bi] as usize + p;
                        for hh in 0..h {
                            let at = (row * h + hh) * d;
                            let rot =
                                oracle::rope_vec(&xv[at..at + d_rot], &fv[pos * d_rot..(pos + 1) * d_rot], interleaved);
                            want[at..at + d_rot].copy_from_slice(&rot);
                        }
                    }
                }
                let what = format!("rope {layout:?} interleaved={interleaved}");
                assert_close(&what, &rope(&args, false), &want, dtype);
                if dtype == DType::F32 {
                    // <dy, R x> = <Rᵀ dy, x> for random dy: the backward is the transpose.
                    let dy = tensor(&rng.vec(n, -1.0, 1.0), &xs, dtype);
                    let bwd = rope(&RopeArgs { x: dy.clone(), ..args.clone() }, true);
                    let lhs: f64 = values(&dy).iter().zip(rope(&args, false)).map(|(a, b)| a * b).sum();
                    let rhs: f64 = bwd.iter().zip(&xv).map(|(a, b)| a * b).sum();
                    assert!((lhs - rhs).abs() < 1e-4 * lhs.abs().max(1.0), "{what}: {lhs} vs {rhs}");
                    // With equal angles on both halves (standard RoPE) the backward undoes the forward.
                    let half: Vec<f64> =
                        (0..s_max * d_rot).map(|i| freqs_v[(i / d_rot) * d_rot + (i % d_rot) % (d_rot / 2)]).collect();
                    let same = RopeArgs { freqs: tensor(&half, &[s_max, d_rot], DType::F32), ..args.clone() };
                    let y = reference::<FusedRopeForward>(&same).unwrap().y;
                    let back = rope(&RopeArgs { x: y, ..same }, true);
                    if !interleaved {
                        assert!(rel_err(&back, &xv) < 1e-6, "{what}: backward does not invert the rotation");
                    }
                }
            }
        }
    }
}

#[test]
fn rope_closed_form_quarter_turn() {
    // One token, d = d_rot = 2, angle π/2 on both halves: [1, 0] -> [0, 1].
    let x = tensor(&[1.0, 0.0], &[1, 1, 1, 2], DType::F32);
    let f = tensor(&[std::f64::consts::FRAC_PI_2; 2], &[1, 2], DType::F32);
    let y = rope(
        &RopeArgs { x, freqs: f, cu_seqlens: None, start_positions: None, layout: QkvLayout::Sbhd, interleaved: false },
        false,
    );
    assert!(y[0].abs() < 1e-6 && (y[1] - 1.0).abs() < 1e-6, "{y:?}");
}

fn noop() -> Tensor {
    Tensor::from_slice(&[0i32], [1], DType::I32).unwrap()
}

#[test]
fn scale_and_l2norm_set_noop_on_overflow_and_noop_skips_everything() {
    let mut rng = Rng::new(seed("scale_l2norm"));
    let a = tensor(&rng.vec(100, -2.0, 2.0), &[10, 10], DType::BF16);
    let b = tensor(&rng.vec(33, -2.0, 2.0), &[33], DType::F32);
    let (av, bv) = (values(&a), values(&b));
    let out = reference::<MultiTensorL2Norm>(&MultiTensorL2NormArgs {
        noop_flag: noop(),
        tensors: vec![a.clone(), b.clone()],
        per_tensor: true,
    })
    .unwrap();
    let na = av.iter().map(|x| x * x).sum::<f64>();
    let nb = bv.iter().map(|x| x * x).sum::<f64>();
    assert_close("l2norm total", &values(&out.total), &[(na + nb).sqrt()], DType::F32);
    assert_close("l2norm per tensor", &values(&out.per_tensor_norms.unwrap()), &[na.sqrt(), nb.sqrt()], DType::F32);
    let inv = tensor(&[0.25], &[1], DType::F32);
    let out = reference::<MultiTensorUnscaleL2Norm>(&MultiTensorUnscaleL2NormArgs {
        noop_flag: noop(),
        tensors: vec![a.clone(), b.clone()],
        inv_scale: inv,
        per_tensor: false,
    })
    .unwrap();
    assert_close("unscale_l2norm", &values(&out.total), &[0.25 * (na + nb).sqrt()], DType::F32);

    let dst = Tensor::zeros([33], DType::F16, &tefl_core::Device::CPU).unwrap();
    let flag = noop();
    reference::<MultiTensorScale>(&MultiTensorScaleArgs {
        noop_flag: flag.clone(),
        src: vec![b.clone()],
        dst: vec![dst.clone()],
        scale: 3.0,
    })
    .unwrap();
    assert_close(
        "scale",
        &values(&dst),
        &round(&bv.iter().map(|x| x * 3.0).collect::<Vec<_>>(), DType::F16),
        DType::F16,
    );
    assert_eq!(flag.to_vec::<i32>().unwrap(), vec![0]);
    let bad = tensor(&[1.0, f64::INFINITY], &[2], DType::F32);
    let d2 = Tensor::zeros([2], DType::F32, &tefl_core::Device::CPU).unwrap();
    reference::<MultiTensorScale>(&MultiTensorScaleArgs {
        noop_flag: flag.clone(),
        src: vec![bad.clone()],
        dst: vec![d2],
        scale: 1.0,
    })
    .unwrap();
    assert_eq!(flag.to_vec::<i32>().unwrap(), vec![1], "inf sets the noop flag");
    // With the flag set, an Adam step changes nothing.
    let p = tensor(&[1.0, 2.0], &[2], DType::F32);
    let z = || Tensor::zeros([2], DType::F32, &tefl_core::Device::CPU).unwrap();
    reference::<MultiTensorAdam>(&MultiTensorAdamArgs {
        noop_flag: flag.clone(),
        grads: vec![tensor(&[1.0, 1.0], &[2], DType::F32)],
        params: vec![p.clone()],
        exp_avg: vec![z()],
        exp_avg_sq: vec![z()],
        hyper: AdamHyper {
            lr: 1.0,
            beta1: 0.9,
            beta2: 0.9,
            eps: 1e-8,
            step: 1,
            mode: AdamMode::AdamW,
            bias_correction: true,
            weight_decay: 0.0,
        },
    })
    .unwrap();
    assert_eq!(values(&p), vec![1.0, 2.0]);
    let flag2 = noop();
    reference::<MultiTensorL2Norm>(&MultiTensorL2NormArgs {
        noop_flag: flag2.clone(),
        tensors: vec![bad],
        per_tensor: false,
    })
    .unwrap();
    assert_eq!(flag2.to_vec::<i32>().unwrap(), vec![1]);
}

#[test]
fn compute_scale_and_delayed_scaling() {
    let amax = tensor(&[2.0, 0.0, f64::INFINITY, 1000.0], &[4], DType::F32);
    let scale = tensor(&[1.0, 5.0, 7.0, 1.0], &[4], DType::F32);
    let scale_inv = Tensor::zeros([4], DType::F32, &tefl_core::Device::CPU).unwrap();
    reference::<MultiTensorComputeScaleAndScaleInv>(&ComputeScaleArgs {
        noop_flag: noop(),
        amax: vec![amax],
        scale: vec![scale.clone()],
        scale_inv: vec![scale_inv.clone()],
        fp8_max: 448.0,
        force_pow_2: true,
        epsilon: 1e-3,
    })
    .unwrap();
    // 448/2 = 224 -> 128; 448/1e-3 = 448000 -> 262144; inf amax keeps 7; 448/1000 -> 0.25.
    assert_eq!(values(&scale), vec![128.0, 262144.0, 7.0, 0.25]);
    assert_eq!(values(&scale_inv), round(&[1.0 / 128.0, 1.0 / 262144.0, 1.0 / 7.0, 4.0], DType::F32));

    for algo in [AmaxAlgo::Max, AmaxAlgo::MostRecent] {
        let hv = vec![1.0, 0.0, f64::NAN, 4.0, 2.0, 0.0, 3.0, 3.0, 5.0, 0.0, 1.0, 2.0];
        let h = tensor(&hv, &[3, 4], DType::F32);
        let s = tensor(&[1.0, 1.0, 1.0, 1.0], &[4], DType::F32);
        let si = Tensor::zeros([4], DType::F32, &tefl_core::Device::CPU).unwrap();
        reference::<FusedAmaxAndScaleUpdate>(&DelayedScalingArgs {
            amax_history: h.clone(),
            scale: s.clone(),
            scale_inv: si.clone(),
            fp8_max: 448.0,
            margin: 1.0,
            algo,
        })
        .unwrap();
        let (nh, ns, nsi) = oracle::delayed_scaling(&hv, 4, &[1.0; 4], 448.0, 1.0, algo);
        assert_eq!(values(&s), round(&ns, DType::F32), "{algo:?}");
        assert_eq!(values(&si), round(&nsi, DType::F32), "{algo:?}");
        let got_h = values(&h);
        for (g, w) in got_h.iter().zip(&nh) {
            assert!(g == w || (g.is_nan() && w.is_nan()), "{algo:?}: history {got_h:?} vs {nh:?}");
        }
    }
}

#[test]
fn dropout_follows_the_philox_stream() {
    let mut rng = Rng::new(seed("dropout"));
    for dtype in [DType::F32, DType::BF16] {
        let n = 7 * 10_001;
        let x = tensor(&rng.vec(n, -1.0, 1.0), &[7, 10_001], dtype);
        let xv = values(&x);
        let p = 0.3f32;
        let out = reference::<DropoutFwd>(&DropoutFwdArgs { x: x.clone(), p, seed: 7, offset: 11 }).unwrap();
        let mask = out.mask.to_vec::<u8>().unwrap();
        let keep = 1.0 / (1.0 - f64::from(p));
        let mut want_y = vec![0.0; n];
        for i in 0..n {
            let kept = tefl_core::philox::uniform(7, 11, i as u64) >= p;
            assert_eq!(mask[i] == 1, kept, "element {i}");
            want_y[i] = if kept { xv[i] * keep } else { 0.0 };
        }
        assert_close("dropout_fwd", &values(&out.y), &want_y, dtype);
        let frac = mask.iter().filter(|m| **m == 1).count() as f64 / n as f64;
        assert!((frac - 0.7).abs() < 0.01, "kept fraction {frac}");
        let dy = tensor(&rng.vec(n, -1.0, 1.0), &[7, 10_001], dtype);
        let dx = reference::<DropoutBwd>(&DropoutBwdArgs { dy: dy.clone(), mask: out.mask.clone(), p }).unwrap().dx;
        let want: Vec<f64> = values(&dy).iter().zip(&mask).map(|(d, m)| if *m == 1 { d * keep } else { 0.0 }).collect();
        assert_close("dropout_bwd", &values(&dx), &want, dtype);
    }
}

/// Bad input gets a typed error naming the argument, before any impl runs.
#[test]
fn bad_input_is_rejected_with_the_argument_named() {
    let m = manager();
    let f = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &tefl_core::Device::CPU).unwrap();
    let names = |e: Error| -> String {
        match e {
            Error::Shape { arg, .. }
            | Error::DType { arg, .. }
            | Error::InvalidArgument { arg, .. }
            | Error::DeviceMismatch { arg, .. } => arg.to_string(),
            other => panic!("not an argument error: {other:?}"),
        }
    };
    let attn = |q: Tensor, k: Tensor, cu_q: Option<Vec<i32>>, layout, p: f32| AttnFwdArgs {
        v: k.clone(),
        q,
        k,
        cu_seqlens_q: cu_q.as_deref().map(i32s),
        cu_seqlens_kv: Some(i32s(&[0, 4, 8])),
        layout,
        mask: AttnMask::None,
        scale: 0.1,
        dropout_p: p,
        seed: 0,
        offset: 0,
        window: AttnWindow::default(),
        max_seqlen_q: None,
        max_seqlen_kv: None,
    };
    // heads not divisible
    let e = m.call::<FusedAttnFwd>(&attn(f(&[1, 4, 3, 8]), f(&[1, 4, 2, 8]), None, QkvLayout::Bshd, 0.0)).unwrap_err();
    assert_eq!(names(e), "k");
    // v's head dim is not k's (o takes q's shape; a backend would read past v)
    let mut a = attn(f(&[1, 4, 2, 16]), f(&[1, 4, 2, 16]), None, QkvLayout::Bshd, 0.0);
    a.v = f(&[1, 4, 2, 8]);
    assert_eq!(names(m.call::<FusedAttnFwd>(&a).unwrap_err()), "v");
    a.v = f(&[1, 4, 2, 32]);
    assert_eq!(names(m.call::<FusedAttnFwd>(&a).unwrap_err()), "v");
    // cu_seqlens not monotone, and past the end
    let e = m
        .call::<FusedAttnFwd>(&attn(f(&[8, 2, 8]), f(&[8, 2, 8]), Some(vec![0, 5, 3]), QkvLayout::Thd, 0.0))
        .unwrap_err();
    assert_eq!(names(e), "cu_seqlens_q");
    let e = m
        .call::<FusedAttnFwd>(&attn(f(&[8, 2, 8]), f(&[8, 2, 8]), Some(vec![0, 5, 9]), QkvLayout::Thd, 0.0))
        .unwrap_err();
    assert_eq!(names(e), "cu_seqlens_q");
    // p outside [0, 1)
    let e = m
        .call::<FusedAttnFwd>(&attn(f(&[8, 2, 8]), f(&[8, 2, 8]), Some(vec![0, 4, 8]), QkvLayout::Thd, 1.0))
        .unwrap_err();
    assert_eq!(names(e), "dropout_p");
    let e = m.call::<DropoutFwd>(&DropoutFwdArgs { x: f(&[4]), p: -0.1, seed: 0, offset: 0 }).unwrap_err();
    assert_eq!(names(e), "p");
    // eps <= 0
    let e = m
        .call::<LayerNormFwd>(&LayerNormFwdArgs {
            scale: None,
            x: f(&[2, 4]),
            gamma: f(&[4]),
            beta: f(&[4]),
            eps: 0.0,
            zero_centered_gamma: false,
            out_dtype: DType::F32,
        })
        .unwrap_err();
    assert_eq!(names(e), "eps");
    // empty tensor lists, and lists of different lengths
    let e = m
        .call::<MultiTensorL2Norm>(&MultiTensorL2NormArgs { noop_flag: noop(), tensors: vec![], per_tensor: false })
        .unwrap_err();
    assert_eq!(names(e), "tensors");
    let e = m
        .call::<MultiTensorScale>(&MultiTensorScaleArgs {
            noop_flag: noop(),
            src: vec![f(&[2]), f(&[2])],
            dst: vec![f(&[2])],
            scale: 1.0,
        })
        .unwrap_err();
    assert_eq!(names(e), "dst");
    // shapes and dtypes
    let gemm = GemmArgs {
        a_scale_inv: None,
        b_scale_inv: None,
        d_scale: None,
        split_accumulator: false,
        a: f(&[3, 4]),
        b: f(&[5, 6]),
        bias: None,
        aux: None,
        c: None,
        transa: false,
        transb: false,
        alpha: 1.0,
        accumulate: false,
        epilogue: GemmEpilogue::None,
        out_dtype: DType::F32,
    };
    assert_eq!(names(m.call::<GenericGemm>(&gemm).unwrap_err()), "b");
    let gemm = GemmArgs { b: f(&[4, 6]), epilogue: GemmEpilogue::Bias, ..gemm };
    assert_eq!(names(m.call::<GenericGemm>(&gemm).unwrap_err()), "bias");
    let e =
        m.call::<Gelu>(&ActArgs { x: Tensor::zeros([4], DType::I32, &tefl_core::Device::CPU).unwrap() }).unwrap_err();
    assert_eq!(names(e), "x");
    let e = m.call::<Swiglu>(&ActArgs { x: f(&[2, 5]) }).unwrap_err();
    assert_eq!(names(e), "x");
    let e = m.call::<DSwiglu>(&DActArgs { grad: f(&[2, 4]), input: f(&[2, 6]) }).unwrap_err();
    assert_eq!(names(e), "grad");
    let rope = RopeArgs {
        x: f(&[4, 1, 2, 8]),
        freqs: f(&[3, 8]),
        cu_seqlens: None,
        start_positions: None,
        layout: QkvLayout::Sbhd,
        interleaved: false,
    };
    assert_eq!(names(m.call::<FusedRopeForward>(&rope).unwrap_err()), "freqs");
    let q = QuantizeArgs { x: f(&[4]), scale: f(&[1]), fp8_dtype: DType::BF16, want_transpose: false };
    assert_eq!(names(m.call::<Quantize>(&q).unwrap_err()), "fp8_dtype");
    let adam = MultiTensorAdamArgs {
        noop_flag: noop(),
        grads: vec![f(&[3])],
        params: vec![f(&[4])],
        exp_avg: vec![f(&[3])],
        exp_avg_sq: vec![f(&[3])],
        hyper: AdamHyper {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            step: 1,
            mode: AdamMode::AdamW,
            bias_correction: true,
            weight_decay: 0.0,
        },
    };
    assert_eq!(names(m.call::<MultiTensorAdam>(&adam).unwrap_err()), "params");
    // The master variant names its own f32 list.
    let master = MultiTensorAdamMasterArgs {
        noop_flag: noop(),
        grads: vec![f(&[3])],
        model_params: vec![f(&[3])],
        master_params: vec![f(&[4])],
        exp_avg: vec![f(&[3])],
        exp_avg_sq: vec![f(&[3])],
        hyper: adam.hyper,
    };
    assert_eq!(names(m.call::<MultiTensorAdamMaster>(&master).unwrap_err()), "master_params");
    let mask = Tensor::zeros([1, 1, 3, 5], DType::U8, &tefl_core::Device::CPU).unwrap();
    let e =
        m.call::<ScaledMaskedSoftmaxForward>(&MaskedSoftmaxArgs { x: f(&[2, 2, 3, 4]), mask, scale: 1.0 }).unwrap_err();
    assert_eq!(names(e), "mask");
}

#[test]
fn thd_attention_takes_te_max_seqlen_bounds() {
    // Through tefl-ops: sequences of 3 and 4 tokens packed as thd on the CPU (lengths read
    // there, so checked against the bounds): at or above the lengths, the same values as
    // without bounds; below one, an error naming the bound.
    let mut rng = Rng::new(seed("thd_attention_takes_te_max_seqlen_bounds"));
    let q = tensor(&rng.vec(7 * 2 * 8, -1.0, 1.0), &[7, 2, 8], DType::F32);
    let cu = i32s(&[0, 3, 7]);
    let call = |bounds: Option<(usize, usize)>| {
        let c = tefl_ops::fused_attn_fwd(&q, &q, &q)
            .layout(QkvLayout::Thd)
            .mask(AttnMask::PaddingCausal)
            .cu_seqlens(&cu, &cu);
        match bounds {
            Some((bq, bk)) => c.max_seqlen(bq, bk).call(),
            None => c.call(),
        }
    };
    let unbounded = values(&call(None).unwrap().o);
    assert_eq!(values(&call(Some((4, 4))).unwrap().o), unbounded);
    assert_eq!(values(&call(Some((100, 9))).unwrap().o), unbounded);
    for (bounds, arg) in [((3, 4), "max_seqlen_q"), ((4, 2), "max_seqlen_kv")] {
        match call(Some(bounds)) {
            Err(Error::InvalidArgument { arg: a, .. }) => assert_eq!(a, arg),
            other => panic!("{bounds:?}: {other:?}"),
        }
    }
}
