//! The multi-tensor optimizers and scale/l2norm helpers.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error};

use super::{Cmp, FLOATS, Suite, cmp};
use crate::oracle;

impl Suite<'_> {
    pub(super) fn optimizers(&mut self) {
        let shapes: [&[usize]; 3] = [&[7, 13], &[1000], &[3, 1, 4097]];
        for dtype in FLOATS {
            for mode in [AdamMode::L2, AdamMode::AdamW] {
                // A step past i32::MAX still has bias corrections of 1 (not an overflowed power).
                for (bc, step) in [(true, 3u32), (false, 3), (true, u32::MAX)] {
                    let case = format!("3 tensors {mode:?} bias_correction={bc} step={step}");
                    let hyper = AdamHyper {
                        lr: 1e-2,
                        beta1: 0.9,
                        beta2: 0.999,
                        eps: 1e-8,
                        step,
                        mode,
                        bias_correction: bc,
                        weight_decay: 0.01,
                    };
                    self.case("multi_tensor_adam", dtype, case, |s| {
                        let mut lists = (vec![], vec![], vec![], vec![]);
                        let mut want = (vec![], vec![], vec![]);
                        for sh in shapes {
                            let (g, gv) = s.rand(sh, dtype, -1.0, 1.0)?;
                            let (p, pv) = s.rand(sh, dtype, -1.0, 1.0)?;
                            let (m, mv) = s.rand(sh, DType::F32, -0.1, 0.1)?;
                            let (v, vv) = s.rand(sh, DType::F32, 0.0, 0.1)?;
                            let r: Vec<(f64, f64, f64)> =
                                (0..gv.len()).map(|j| oracle::adam_step(pv[j], gv[j], mv[j], vv[j], &hyper)).collect();
                            want.0.push(crate::round(&r.iter().map(|x| x.0).collect::<Vec<_>>(), dtype));
                            want.1.push(r.iter().map(|x| x.1).collect::<Vec<_>>());
                            want.2.push(r.iter().map(|x| x.2).collect::<Vec<_>>());
                            lists.0.push(g);
                            lists.1.push(p);
                            lists.2.push(m);
                            lists.3.push(v);
                        }
                        s.call::<MultiTensorAdam>(&MultiTensorAdamArgs {
                            noop_flag: s.noop()?,
                            grads: lists.0,
                            params: lists.1.clone(),
                            exp_avg: lists.2.clone(),
                            exp_avg_sq: lists.3.clone(),
                            hyper,
                        })?;
                        let mut out = Vec::new();
                        for i in 0..shapes.len() {
                            out.push(cmp("params", &lists.1[i], want.0[i].clone(), dtype)?);
                            out.push(cmp("exp_avg", &lists.2[i], want.1[i].clone(), DType::F32)?);
                            out.push(cmp("exp_avg_sq", &lists.3[i], want.2[i].clone(), DType::F32)?);
                        }
                        Ok(out)
                    });
                }
            }
            let hyper = AdamHyper { beta2: 0.99, ..AdamHyper::adamw(0.1) };
            self.case("multi_tensor_adam_master", dtype, "f32 masters, model copy".into(), |s| {
                let (g, gv) = s.rand(&[50], dtype, -1.0, 1.0)?;
                let (master, pv) = s.rand(&[50], DType::F32, -1.0, 1.0)?;
                let model = s.poisoned(&[50], dtype)?;
                let (m, v) = (s.put(&[0.0; 50], &[50], DType::F32)?, s.put(&[0.0; 50], &[50], DType::F32)?);
                s.call::<MultiTensorAdamMaster>(&MultiTensorAdamMasterArgs {
                    noop_flag: s.noop()?,
                    grads: vec![g],
                    model_params: vec![model.clone()],
                    master_params: vec![master.clone()],
                    exp_avg: vec![m],
                    exp_avg_sq: vec![v],
                    hyper,
                })?;
                let want: Vec<f64> = (0..50).map(|j| oracle::adam_step(pv[j], gv[j], 0.0, 0.0, &hyper).0).collect();
                Ok(vec![
                    cmp("master_params", &master, want.clone(), DType::F32)?,
                    cmp("model_params", &model, crate::round(&want, dtype), dtype)?,
                ])
            });
            for (momentum, nesterov, first_run, wd_after) in [
                (0.0f32, false, false, false),
                (0.9, false, true, false),
                (0.9, true, false, true),
                (0.5, false, false, true),
            ] {
                self.case(
                    "multi_tensor_sgd",
                    dtype,
                    format!("momentum={momentum} nesterov={nesterov} first_run={first_run} wd_after={wd_after}"),
                    |s| {
                        let (g, gv) = s.rand(&[4097], dtype, -1.0, 1.0)?;
                        let (p, pv) = s.rand(&[4097], dtype, -1.0, 1.0)?;
                        let (b, bv) = s.rand(&[4097], DType::F32, -0.5, 0.5)?;
                        s.call::<MultiTensorSgd>(&MultiTensorSgdArgs {
                            noop_flag: s.noop()?,
                            grads: vec![g],
                            params: vec![p.clone()],
                            momentum_buf: vec![b.clone()],
                            weight_decay: 0.01,
                            momentum,
                            dampening: 0.1,
                            lr: 0.05,
                            nesterov,
                            first_run,
                            wd_after_momentum: wd_after,
                            scale: 0.5,
                        })?;
                        let f = |x: f32| f64::from(x);
                        let (wd, damp, lr, sc, mom) = (f(0.01), f(0.1), f(0.05), 0.5, f(momentum));
                        let (mut wp, mut wb) = (vec![], vec![]);
                        for j in 0..gv.len() {
                            let mut gg = gv[j] * sc;
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
                        Ok(vec![
                            cmp("params", &p, crate::round(&wp, dtype), dtype)?,
                            cmp("momentum_buf", &b, wb, DType::F32)?,
                        ])
                    },
                );
            }
            self.case("multi_tensor_scale", dtype, "two tensors into a poisoned dst".into(), |s| {
                let (a, av) = s.rand(&[10, 10], dtype, -2.0, 2.0)?;
                let (b, bv) = s.rand(&[4097], DType::F32, -2.0, 2.0)?;
                let (da, db) = (s.poisoned(&[10, 10], dtype)?, s.poisoned(&[4097], DType::F16)?);
                let flag = s.noop()?;
                s.call::<MultiTensorScale>(&MultiTensorScaleArgs {
                    noop_flag: flag.clone(),
                    src: vec![a, b],
                    dst: vec![da.clone(), db.clone()],
                    scale: 3.0,
                })?;
                let flagv: Vec<f64> = flag.to_vec::<i32>()?.into_iter().map(f64::from).collect();
                Ok(vec![
                    cmp("dst[0]", &da, crate::round(&av.iter().map(|x| x * 3.0).collect::<Vec<_>>(), dtype), dtype)?,
                    cmp(
                        "dst[1]",
                        &db,
                        crate::round(&bv.iter().map(|x| x * 3.0).collect::<Vec<_>>(), DType::F16),
                        DType::F16,
                    )?,
                    Cmp { name: "noop_flag", got: flagv, want: vec![0.0], dtype: DType::F32, floor: 0.0, nan: false },
                ])
            });
            self.case("multi_tensor_scale", dtype, "inf sets noop_flag".into(), |s| {
                let src = s.put(&[1.0, f64::INFINITY, 2.0], &[3], dtype)?;
                let dst = s.poisoned(&[3], DType::F32)?;
                let flag = s.noop()?;
                s.call::<MultiTensorScale>(&MultiTensorScaleArgs {
                    noop_flag: flag.clone(),
                    src: vec![src],
                    dst: vec![dst],
                    scale: 1.0,
                })?;
                let flagv: Vec<f64> = flag.to_vec::<i32>()?.into_iter().map(f64::from).collect();
                Ok(vec![Cmp {
                    name: "noop_flag",
                    got: flagv,
                    want: vec![1.0],
                    dtype: DType::F32,
                    floor: 0.0,
                    nan: false,
                }])
            });
            for per_tensor in [false, true] {
                for unscale in [false, true] {
                    let op = if unscale { "multi_tensor_unscale_l2norm" } else { "multi_tensor_l2norm" };
                    self.case(op, dtype, format!("per_tensor={per_tensor}"), |s| {
                        let (a, av) = s.rand(&[10, 10], dtype, -2.0, 2.0)?;
                        let (b, bv) = s.rand(&[4097], dtype, -2.0, 2.0)?;
                        let f = if unscale { 0.25 } else { 1.0 };
                        let (na, nb) = (
                            av.iter().map(|x| (x * f).powi(2)).sum::<f64>(),
                            bv.iter().map(|x| (x * f).powi(2)).sum::<f64>(),
                        );
                        let (total, per) = if unscale {
                            let inv = s.put(&[0.25], &[1], DType::F32)?;
                            let o = s.call::<MultiTensorUnscaleL2Norm>(&MultiTensorUnscaleL2NormArgs {
                                noop_flag: s.noop()?,
                                tensors: vec![a, b],
                                inv_scale: inv,
                                per_tensor,
                            })?;
                            (o.total, o.per_tensor_norms)
                        } else {
                            let o = s.call::<MultiTensorL2Norm>(&MultiTensorL2NormArgs {
                                noop_flag: s.noop()?,
                                tensors: vec![a, b],
                                per_tensor,
                            })?;
                            (o.total, o.per_tensor_norms)
                        };
                        let mut out = vec![cmp("total", &total, vec![(na + nb).sqrt()], DType::F32)?];
                        match (per, per_tensor) {
                            (Some(p), true) => {
                                out.push(cmp("per_tensor_norms", &p, vec![na.sqrt(), nb.sqrt()], DType::F32)?)
                            }
                            (None, false) => {}
                            _ => {
                                return Err(Error::Tensor(
                                    "per_tensor_norms present where it should not be, or missing".into(),
                                ));
                            }
                        }
                        Ok(out)
                    });
                }
            }
        }
        self.case("multi_tensor_compute_scale_and_scale_inv", DType::F32, "pow2, epsilon, inf amax".into(), |s| {
            let amax = s.put(&[2.0, 0.0, f64::INFINITY, 1000.0], &[4], DType::F32)?;
            let scale = s.put(&[1.0, 5.0, 7.0, 1.0], &[4], DType::F32)?;
            let scale_inv = s.poisoned(&[4], DType::F32)?;
            s.call::<MultiTensorComputeScaleAndScaleInv>(&ComputeScaleArgs {
                noop_flag: s.noop()?,
                amax: vec![amax],
                scale: vec![scale.clone()],
                scale_inv: vec![scale_inv.clone()],
                fp8_max: 448.0,
                force_pow_2: true,
                epsilon: 1e-3,
            })?;
            let want = vec![128.0, 262144.0, 7.0, 0.25];
            let inv = want.iter().map(|v| 1.0 / v).collect();
            Ok(vec![cmp("scale", &scale, want, DType::F32)?, cmp("scale_inv", &scale_inv, inv, DType::F32)?])
        });
    }
}
