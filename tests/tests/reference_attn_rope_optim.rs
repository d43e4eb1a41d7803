//! The reference backend against the f64 oracle: attention, RoPE, optimizers, FP8, dropout,
//! and the typed errors bad input gets before dispatch.
#![allow(clippy::needless_range_loop)] // index loops mirror the formulas

use tefl_core::catalogue::*;
use tefl_core::fp8::Fp8Format;
use tefl_core::{DType, Error, Tensor};
use tefl_tests::{Rng, assert_close, manager, oracle, reference, rel_err, round, seed, tensor, values};

fn i32s(v: &[i32]) -> Tensor {
    Tensor::from_slice(v, [v.len()], DType::I32).unwrap()
}

struct AttnCase {
    layout: QkvLayout,
    mask: AttnMask,
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    d: usize,
    cu_q: Option<Vec<i32>>,
    cu_k: Option<Vec<i32>>,
    window: AttnWindow,
    p: f32,
}

fn shape(layout: QkvLayout, b: usize, s: usize, h: usize, d: usize, total: usize) -> Vec<usize> {
    match layout {
        QkvLayout::Bshd => vec![b, s, h, d],
        QkvLayout::Sbhd => vec![s, b, h, d],
        QkvLayout::Thd => vec![total, h, d],
    }
}

fn run_attn(rng: &mut Rng, c: &AttnCase, dtype: DType) {
    let tq = c.cu_q.as_ref().map_or(c.b * c.sq, |v| *v.last().unwrap() as usize);
    let tk = c.cu_k.as_ref().map_or(c.b * c.sk, |v| *v.last().unwrap() as usize);
    let (tq, tk) = if c.layout == QkvLayout::Thd { (tq, tk) } else { (c.b * c.sq, c.b * c.sk) };
    let qs = shape(c.layout, c.b, c.sq, c.hq, c.d, tq);
    let ks = shape(c.layout, c.b, c.sk, c.hk, c.d, tk);
    let q = tensor(&rng.vec(qs.iter().product(), -1.0, 1.0), &qs, dtype);
    let k = tensor(&rng.vec(ks.iter().product(), -1.0, 1.0), &ks, dtype);
    let v = tensor(&rng.vec(ks.iter().product(), -1.0, 1.0), &ks, dtype);
    let scale = 1.0 / (c.d as f32).sqrt();
    let args = AttnFwdArgs {
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        cu_seqlens_q: c.cu_q.as_deref().map(i32s),
        cu_seqlens_kv: c.cu_k.as_deref().map(i32s),
        layout: c.layout,
        mask: c.mask,
        scale,
        dropout_p: c.p,
        seed: 1234,
        offset: 99,
        window: c.window,
    };
    let out = reference::<FusedAttnFwd>(&args).unwrap();
    let g = attn_geometry("t", &q, &k, &v, args.cu_seqlens_q.as_ref(), args.cu_seqlens_kv.as_ref(), c.layout, c.mask)
        .unwrap();
    let (qv, kv, vv) = (values(&q), values(&k), values(&v));
    let prob = oracle::AttnProblem {
        g: &g,
        q: &qv,
        k: &kv,
        v: &vv,
        mask: c.mask,
        window: c.window,
        scale: f64::from(scale),
        p: f64::from(c.p),
        seed: 1234,
        offset: 99,
    };
    let want = prob.forward();
    let what = format!("attn {:?} {:?} hq={} hk={} win={:?} p={}", c.layout, c.mask, c.hq, c.hk, c.window, c.p);
    assert_close(&format!("{what} o"), &values(&out.o), &want.o, dtype);
    let lse = values(&out.softmax_lse);
    assert_eq!(lse.len(), want.lse.len());
    // Queries that see no key have lse = -inf on both sides; compare the finite ones.
    for (a, b) in lse.iter().zip(&want.lse) {
        assert_eq!(a.is_finite(), b.is_finite(), "{what}: lse finiteness differs: {a} vs {b}");
    }
    let (lf, wf): (Vec<f64>, Vec<f64>) =
        lse.iter().zip(&want.lse).filter(|(a, _)| a.is_finite()).map(|(a, b)| (*a, *b)).unzip();
    assert_close(&format!("{what} lse"), &lf, &wf, DType::F32);

    let d_o = tensor(&rng.vec(qs.iter().product(), -1.0, 1.0), &qs, dtype);
    let bargs = AttnBwdArgs {
        q,
        k,
        v,
        o: out.o.clone(),
        d_o: d_o.clone(),
        softmax_lse: out.softmax_lse.clone(),
        cu_seqlens_q: args.cu_seqlens_q.clone(),
        cu_seqlens_kv: args.cu_seqlens_kv.clone(),
        layout: c.layout,
        mask: c.mask,
        scale,
        dropout_p: c.p,
        seed: 1234,
        offset: 99,
        window: c.window,
    };
    let got = reference::<FusedAttnBwd>(&bargs).unwrap();
    let (dq, dk, dv) = prob.backward(&values(&d_o));
    assert_close(&format!("{what} dq"), &values(&got.dq), &dq, dtype);
    assert_close(&format!("{what} dk"), &values(&got.dk), &dk, dtype);
    assert_close(&format!("{what} dv"), &values(&got.dv), &dv, dtype);
}

#[test]
fn attention_matches_the_oracle_for_layouts_masks_gqa_windows_and_dropout() {
    let mut rng = Rng::new(seed("attention"));
    let none = AttnWindow::default();
    let base = |layout, mask| AttnCase {
        layout,
        mask,
        b: 2,
        sq: 37,
        sk: 45,
        hq: 4,
        hk: 2,
        d: 64,
        cu_q: None,
        cu_k: None,
        window: none,
        p: 0.0,
    };
    let mut cases = Vec::new();
    for layout in [QkvLayout::Bshd, QkvLayout::Sbhd] {
        for mask in [AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight] {
            cases.push(base(layout, mask));
        }
        for mask in [AttnMask::Padding, AttnMask::PaddingCausal] {
            cases.push(AttnCase { cu_q: Some(vec![0, 30, 67]), cu_k: Some(vec![0, 45, 57]), ..base(layout, mask) });
        }
    }
    // Packed variable-length batches, including a length-1 and an empty-key sequence.
    for mask in
        [AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight, AttnMask::Padding, AttnMask::PaddingCausal]
    {
        cases.push(AttnCase {
            cu_q: Some(vec![0, 5, 17, 18, 40]),
            cu_k: Some(vec![0, 7, 19, 19, 70]),
            b: 4,
            ..base(QkvLayout::Thd, mask)
        });
    }
    // MQA, head dim 128, sliding windows, dropout.
    cases.push(AttnCase { hq: 3, hk: 1, d: 128, ..base(QkvLayout::Bshd, AttnMask::Causal) });
    cases.push(AttnCase {
        window: AttnWindow { left: Some(5), right: Some(0) },
        ..base(QkvLayout::Bshd, AttnMask::Causal)
    });
    cases.push(AttnCase {
        window: AttnWindow { left: Some(3), right: Some(2) },
        ..base(QkvLayout::Sbhd, AttnMask::None)
    });
    cases.push(AttnCase { p: 0.2, ..base(QkvLayout::Bshd, AttnMask::Causal) });
    cases.push(AttnCase {
        p: 0.1,
        cu_q: Some(vec![0, 3, 20]),
        cu_k: Some(vec![0, 8, 30]),
        ..base(QkvLayout::Thd, AttnMask::None)
    });
    cases.push(AttnCase { b: 1, sq: 1, sk: 1, hq: 1, hk: 1, d: 8, ..base(QkvLayout::Bshd, AttnMask::None) });
    for (i, c) in cases.iter().enumerate() {
        let dtype = [DType::F32, DType::BF16, DType::F16][i % 3];
        run_attn(&mut rng, c, dtype);
    }
    // One long sequence (many key tiles).
    run_attn(
        &mut rng,
        &AttnCase { b: 1, sq: 300, sk: 300, hq: 2, hk: 2, d: 64, ..base(QkvLayout::Bshd, AttnMask::Causal) },
        DType::F32,
    );
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
    })
    .unwrap();
    assert_eq!(values(&out.o), vec![5.0, 6.0, 7.0, 8.0]);
    let s = 0.5 * (0.3 - 0.4 + 1.5 + 0.4);
    assert!((values(&out.softmax_lse)[0] - s).abs() < 1e-6);
}

#[test]
fn attention_backward_matches_finite_differences() {
    let mut rng = Rng::new(seed("attention_fd"));
    let c = AttnCase {
        layout: QkvLayout::Bshd,
        mask: AttnMask::Causal,
        b: 1,
        sq: 3,
        sk: 4,
        hq: 2,
        hk: 1,
        d: 4,
        cu_q: None,
        cu_k: None,
        window: AttnWindow::default(),
        p: 0.0,
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
    let common = |o: Tensor, lse: Tensor| AttnBwdArgs {
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        o,
        d_o: w.clone(),
        softmax_lse: lse,
        cu_seqlens_q: None,
        cu_seqlens_kv: None,
        layout: c.layout,
        mask: c.mask,
        scale: 0.5,
        dropout_p: 0.0,
        seed: 0,
        offset: 0,
        window: c.window,
    };
    let fwd = reference::<FusedAttnFwd>(&AttnFwdArgs {
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
    })
    .unwrap();
    let got = reference::<FusedAttnBwd>(&common(fwd.o, fwd.softmax_lse)).unwrap();
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
fn adam_sgd_and_scale_match_the_oracle() {
    let mut rng = Rng::new(seed("optimizers"));
    let shapes: [&[usize]; 3] = [&[7, 13], &[1000], &[3, 1, 5]];
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for mode in [AdamMode::L2, AdamMode::AdamW] {
            for bc in [true, false] {
                let mk = |rng: &mut Rng, dt: DType, lo: f64, hi: f64| -> Vec<Tensor> {
                    shapes.iter().map(|s| tensor(&rng.vec(s.iter().product(), lo, hi), s, dt)).collect()
                };
                let (grads, params) = (mk(&mut rng, dtype, -1.0, 1.0), mk(&mut rng, dtype, -1.0, 1.0));
                let (m, v) = (mk(&mut rng, DType::F32, -0.1, 0.1), mk(&mut rng, DType::F32, 0.0, 0.1));
                type State = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);
                let before: Vec<State> =
                    (0..3).map(|i| (values(&grads[i]), values(&params[i]), values(&m[i]), values(&v[i]))).collect();
                let args = MultiTensorAdamArgs {
                    noop_flag: noop(),
                    grads,
                    params: params.clone(),
                    exp_avg: m.clone(),
                    exp_avg_sq: v.clone(),
                    lr: 1e-2,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    step: 3,
                    mode,
                    bias_correction: bc,
                    weight_decay: 0.01,
                };
                reference::<MultiTensorAdam>(&args).unwrap();
                for i in 0..3 {
                    let (g, p, mm, vv) = &before[i];
                    let mut want = (vec![], vec![], vec![]);
                    for j in 0..g.len() {
                        let (np, nm, nv) = oracle::adam(
                            p[j],
                            g[j],
                            mm[j],
                            vv[j],
                            f64::from(1e-2f32),
                            f64::from(0.9f32),
                            f64::from(0.999f32),
                            f64::from(1e-8f32),
                            3,
                            mode,
                            bc,
                            f64::from(0.01f32),
                        );
                        want.0.push(np);
                        want.1.push(nm);
                        want.2.push(nv);
                    }
                    let what = format!("adam {mode:?} bc={bc} tensor {i}");
                    assert_close(&format!("{what} params"), &values(&params[i]), &round(&want.0, dtype), dtype);
                    assert_close(&format!("{what} exp_avg"), &values(&m[i]), &want.1, DType::F32);
                    assert_close(&format!("{what} exp_avg_sq"), &values(&v[i]), &want.2, DType::F32);
                }
            }
        }
    }
    // f32 master params with a bf16 model copy.
    let g = tensor(&rng.vec(50, -1.0, 1.0), &[50], DType::BF16);
    let master = tensor(&rng.vec(50, -1.0, 1.0), &[50], DType::F32);
    let model = Tensor::zeros([50], DType::BF16, &tefl_core::Device::CPU).unwrap();
    let (m, v) = (
        Tensor::zeros([50], DType::F32, &tefl_core::Device::CPU).unwrap(),
        Tensor::zeros([50], DType::F32, &tefl_core::Device::CPU).unwrap(),
    );
    let (gv, pv) = (values(&g), values(&master));
    reference::<MultiTensorAdamMaster>(&MultiTensorAdamMasterArgs {
        noop_flag: noop(),
        grads: vec![g],
        model_params: vec![model.clone()],
        master_params: vec![master.clone()],
        exp_avg: vec![m],
        exp_avg_sq: vec![v],
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        step: 1,
        mode: AdamMode::AdamW,
        bias_correction: true,
        weight_decay: 0.0,
    })
    .unwrap();
    // Closed form: at step 1 with bias correction, the update is lr·g/(|g| + eps') = ±lr.
    let want: Vec<f64> = pv.iter().zip(&gv).map(|(p, g)| p - f64::from(0.1f32) * g / (g.abs() + 1e-8)).collect();
    assert_close("adam_master master", &values(&master), &want, DType::F32);
    assert_close("adam_master model", &values(&model), &round(&want, DType::BF16), DType::BF16);

    // SGD, every flag combination.
    for (momentum, nesterov, first_run, wd_after) in
        [(0.0, false, false, false), (0.9, false, true, false), (0.9, true, false, true), (0.5, false, false, true)]
    {
        let gv = rng.vec(64, -1.0, 1.0);
        let pv = rng.vec(64, -1.0, 1.0);
        let bv = rng.vec(64, -0.5, 0.5);
        let (g, p, b) =
            (tensor(&gv, &[64], DType::F32), tensor(&pv, &[64], DType::F32), tensor(&bv, &[64], DType::F32));
        let (gv, pv, bv) = (values(&g), values(&p), values(&b));
        let (wd, damp, lr, scale) = (0.01f32, 0.1f32, 0.05f32, 0.5f32);
        reference::<MultiTensorSgd>(&MultiTensorSgdArgs {
            noop_flag: noop(),
            grads: vec![g],
            params: vec![p.clone()],
            momentum_buf: vec![b.clone()],
            weight_decay: wd,
            momentum,
            dampening: damp,
            lr,
            nesterov,
            first_run,
            wd_after_momentum: wd_after,
            scale,
        })
        .unwrap();
        let (wd, damp, lr, scale, mom) =
            (f64::from(wd), f64::from(damp), f64::from(lr), f64::from(scale), f64::from(momentum));
        let (mut wp, mut wb) = (vec![], vec![]);
        for j in 0..64 {
            let mut gg = gv[j] * scale;
            if !wd_after {
                gg += wd * pv[j];
            }
            let mut buf = bv[j];
            if mom != 0.0 {
                buf = if first_run { gg } else { mom * buf + (1.0 - damp) * gg };
                gg = if nesterov { gg + mom * buf } else { buf };
            }
            if wd_after {
                gg += wd * pv[j];
            }
            wp.push(pv[j] - lr * gg);
            wb.push(buf);
        }
        assert_close(&format!("sgd m={momentum} nesterov={nesterov} first={first_run}"), &values(&p), &wp, DType::F32);
        assert_close("sgd momentum_buf", &values(&b), &wb, DType::F32);
    }
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
        lr: 1.0,
        beta1: 0.9,
        beta2: 0.9,
        eps: 1e-8,
        step: 1,
        mode: AdamMode::AdamW,
        bias_correction: true,
        weight_decay: 0.0,
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
fn fp8_quantize_dequantize_amax_and_transpose() {
    let mut rng = Rng::new(seed("fp8"));
    for fp8 in [DType::F8E4M3, DType::F8E5M2] {
        let f = Fp8Format::of(fp8).unwrap();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let (m, n) = (13, 1000);
            let x = tensor(&rng.vec(m * n, -3.0, 3.0), &[m, n], dtype);
            let xv = values(&x);
            let sc = if fp8 == DType::F8E4M3 { 100.0 } else { 1000.0 };
            let out = reference::<Quantize>(&QuantizeArgs {
                x: x.clone(),
                scale: tensor(&[sc], &[1], DType::F32),
                fp8_dtype: fp8,
                want_transpose: true,
            })
            .unwrap();
            let codes = out.q.to_vec::<u8>().unwrap();
            for (i, (c, v)) in codes.iter().zip(&xv).enumerate() {
                let want = oracle::fp8_nearest(f, (*v as f32 * sc as f32) as f64);
                assert_eq!(*c, want, "{fp8} from {dtype}: element {i} = {v}");
            }
            let qt = out.q_t.unwrap().to_vec::<u8>().unwrap();
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(qt[j * m + i], codes[i * n + j]);
                }
            }
            let amax = xv.iter().fold(0.0f64, |a, b| a.max(b.abs()));
            assert_eq!(values(&out.amax), vec![amax]);
            assert_eq!(values(&out.scale_inv), round(&[1.0 / sc], DType::F32));
            let deq = reference::<Dequantize>(&DequantizeArgs {
                q: out.q.clone(),
                scale_inv: out.scale_inv.clone(),
                out_dtype: DType::F32,
            })
            .unwrap();
            let want: Vec<f64> = codes.iter().map(|c| f64::from(f.decode(*c) * (1.0 / sc as f32))).collect();
            assert_close("dequantize", &values(&deq.y), &want, DType::F32);
            assert_close(&format!("quantize round trip {fp8}"), &values(&deq.y), &xv, fp8);
            let t = reference::<Fp8Transpose>(&Fp8TransposeArgs { q: out.q.clone() }).unwrap();
            assert_eq!(t.q_t.to_vec::<u8>().unwrap(), qt);
            let am = reference::<ComputeAmax>(&ComputeAmaxArgs { x: x.clone() }).unwrap();
            assert_eq!(values(&am.amax), vec![amax]);
        }
    }
    // Saturation: beyond-range values become ±max.
    let x = tensor(&[1e6, -1e6], &[2], DType::F32);
    let q = reference::<Quantize>(&QuantizeArgs {
        x,
        scale: tensor(&[1.0], &[1], DType::F32),
        fp8_dtype: DType::F8E4M3,
        want_transpose: false,
    })
    .unwrap();
    assert_eq!(q.q.to_vec::<u8>().unwrap(), vec![0x7E, 0xFE]);
    assert!(q.q_t.is_none());
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
    };
    // heads not divisible
    let e = m.call::<FusedAttnFwd>(&attn(f(&[1, 4, 3, 8]), f(&[1, 4, 2, 8]), None, QkvLayout::Bshd, 0.0)).unwrap_err();
    assert_eq!(names(e), "k");
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
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: 1,
        mode: AdamMode::AdamW,
        bias_correction: true,
        weight_decay: 0.0,
    };
    assert_eq!(names(m.call::<MultiTensorAdam>(&adam).unwrap_err()), "params");
    let mask = Tensor::zeros([1, 1, 3, 5], DType::U8, &tefl_core::Device::CPU).unwrap();
    let e =
        m.call::<ScaledMaskedSoftmaxForward>(&MaskedSoftmaxArgs { x: f(&[2, 2, 3, 4]), mask, scale: 1.0 }).unwrap_err();
    assert_eq!(names(e), "mask");
}
