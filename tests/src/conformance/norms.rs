//! RMSNorm and LayerNorm, forward and backward, every float dtype.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, Tensor};

use super::{Cmp, FLOATS, Size, Suite, cmp};
use crate::oracle;

impl Suite<'_> {
    pub(super) fn norms(&mut self) {
        // (0, 256): no rows, as an expert that drew no tokens has; dgamma and dbeta are zeros.
        // (5, 4096): the CUDA backward's ring of rows on Hopper past the default 48 KiB of
        // dynamic shared memory (three 16 KiB stages for 16-bit rows, three of 32 KiB in
        // one 1024-thread block for f32); (1500, 256): blocks that go round that ring several
        // times; (600, 8192), full runs: 1024-thread blocks, one an SM, going round theirs.
        let mut shapes = vec![(1, 1000), (3, 4097), (17, 64), (2, 16384), (0, 256), (5, 4096), (1500, 256)];
        if self.size == Size::Full {
            shapes.extend([(33, 16384), (600, 8192)]);
        }
        // Full runs, the bf16 forwards only: an x of 128 MiB, from which the Hopper tune configs'
        // `norm_fwd_l2` holds x in L2 and releases the rows of its last 64 MiB (`load_kept` /
        // `release_after`), a path the shapes above are too small to reach.
        let kept: &[(usize, usize)] = if self.size == Size::Full { &[(8192, 8192)] } else { &[] };
        for dtype in FLOATS {
            let big = if dtype == DType::BF16 { kept } else { &[] };
            for &(rows, n) in shapes.iter().chain(big) {
                let forwards_only = big.contains(&(rows, n));
                for zc in [false, true] {
                    let out_dtype = if zc { DType::F32 } else { dtype };
                    let case = format!("{rows}x{n} zero_centered={zc}");
                    self.case("rmsnorm_fwd", dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&[rows, n], dtype, -2.0, 2.0)?;
                        let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                        let o = s.call::<RmsNormFwd>(&RmsNormFwdArgs {
                            x,
                            gamma: g,
                            eps: 1e-5,
                            zero_centered_gamma: zc,
                            out_dtype,
                            scale: None,
                        })?;
                        let (y, rs) = oracle::rmsnorm_fwd(&xv, n, &gv, 1e-5, zc);
                        Ok(vec![cmp("y", &o.y, y, out_dtype)?, cmp("rsigma", &o.rsigma, rs, DType::F32)?])
                    });
                    for add in [false, true] {
                        if forwards_only {
                            break;
                        }
                        let op = if add { "rmsnorm_bwd_add" } else { "rmsnorm_bwd" };
                        self.case(op, dtype, case.clone(), |s| {
                            let (x, xv) = s.rand(&[rows, n], dtype, -2.0, 2.0)?;
                            let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                            let (dy, dyv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                            let (_, rs) = oracle::rmsnorm_fwd(&xv, n, &gv, 1e-5, zc);
                            let rs_t = s.put(&rs, &[rows], DType::F32)?;
                            let rsv = rs_t.to_vec::<f64>()?;
                            let (mut dx, dg) = oracle::rmsnorm_bwd(&dyv, &xv, &rsv, n, &gv, zc);
                            let o = if add {
                                let (a, av) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                                dx.iter_mut().zip(&av).for_each(|(d, a)| *d += a);
                                let r = s.call::<RmsNormBwdAdd>(&RmsNormBwdAddArgs {
                                    dy,
                                    x,
                                    rsigma: rs_t,
                                    gamma: g,
                                    add: a,
                                    zero_centered_gamma: zc,
                                })?;
                                (r.dx, r.dgamma)
                            } else {
                                let r = s.call::<RmsNormBwd>(&RmsNormBwdArgs {
                                    dy,
                                    x,
                                    rsigma: rs_t,
                                    gamma: g,
                                    zero_centered_gamma: zc,
                                })?;
                                (r.dx, r.dgamma)
                            };
                            Ok(vec![cmp("dx", &o.0, dx, dtype)?, cmp("dgamma", &o.1, dg, dtype)?])
                        });
                    }
                    self.case("layernorm_fwd", dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&[rows, n], dtype, -3.0, 3.0)?;
                        let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                        let (b, bv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                        let o = s.call::<LayerNormFwd>(&LayerNormFwdArgs {
                            x,
                            gamma: g,
                            beta: b,
                            eps: 1e-5,
                            zero_centered_gamma: zc,
                            out_dtype,
                            scale: None,
                        })?;
                        let (y, mu, rs) = oracle::layernorm_fwd(&xv, n, &gv, &bv, 1e-5, zc);
                        Ok(vec![
                            cmp("y", &o.y, y, out_dtype)?,
                            // A row mean can cancel to nearly 0; measure it against the size a
                            // mean of n values in [-3, 3] typically has (1.7 / sqrt(n)).
                            Cmp { floor: (rows as f64 / n as f64).sqrt(), ..cmp("mu", &o.mu, mu, DType::F32)? },
                            cmp("rsigma", &o.rsigma, rs, DType::F32)?,
                        ])
                    });
                    if forwards_only {
                        continue;
                    }
                    self.case("layernorm_bwd", dtype, case, |s| {
                        let (x, xv) = s.rand(&[rows, n], dtype, -3.0, 3.0)?;
                        let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                        let (dy, dyv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                        let (_, mu, rs) = oracle::layernorm_fwd(&xv, n, &gv, &vec![0.0; n], 1e-5, zc);
                        let (mu_t, rs_t) = (s.put(&mu, &[rows], DType::F32)?, s.put(&rs, &[rows], DType::F32)?);
                        let (muv, rsv) = (mu_t.to_vec::<f64>()?, rs_t.to_vec::<f64>()?);
                        let o = s.call::<LayerNormBwd>(&LayerNormBwdArgs {
                            dy,
                            x,
                            mu: mu_t,
                            rsigma: rs_t,
                            gamma: g,
                            zero_centered_gamma: zc,
                        })?;
                        let (dx, dg, db) = oracle::layernorm_bwd(&dyv, &xv, &muv, &rsv, n, &gv, zc);
                        Ok(vec![
                            cmp("dx", &o.dx, dx, dtype)?,
                            cmp("dgamma", &o.dgamma, dg, dtype)?,
                            cmp("dbeta", &o.dbeta, db, dtype)?,
                        ])
                    });
                }
            }
        }
        self.fp8_norms(&shapes);
    }

    /// The forwards with an FP8 output (TE's norm with a quantizer): y decoded and unscaled
    /// against the oracle's value cast the same way, amax and scale_inv.
    fn fp8_norms(&mut self, shapes: &[(usize, usize)]) {
        for dtype in FLOATS {
            for fp8 in [DType::F8E4M3, DType::F8E5M2] {
                let sc = if fp8 == DType::F8E4M3 { 64.0 } else { 2048.0 };
                let fp8_cmps = move |y_got: &Tensor, amax: Option<&Tensor>, si: Option<&Tensor>, y: Vec<f64>| {
                    let (Some(amax), Some(si)) = (amax, si) else {
                        return Err(Error::Tensor("amax or scale_inv missing for an FP8 output".into()));
                    };
                    let want_amax = y.iter().fold(0.0f64, |a, v| a.max(v.abs()));
                    // Against the oracle's own cast: only near-ties may round the other way.
                    let got: Vec<f64> = y_got.to_vec::<f64>()?.iter().map(|v| v / sc).collect();
                    let want = oracle::fp8_round(fp8, &y, sc);
                    Ok(vec![
                        Cmp { name: "y", got, want, dtype: DType::BF16, floor: 0.0, nan: false },
                        cmp("amax", amax, vec![want_amax], DType::F16)?,
                        cmp("scale_inv", si, vec![1.0 / sc], DType::F32)?,
                    ])
                };
                for &(rows, n) in shapes {
                    let case = format!("{rows}x{n} to {fp8}");
                    self.optional_case("rmsnorm_fwd", dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&[rows, n], dtype, -2.0, 2.0)?;
                        let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                        let scale = Some(s.put(&[sc], &[1], DType::F32)?);
                        let o = s.call::<RmsNormFwd>(&RmsNormFwdArgs {
                            x,
                            gamma: g,
                            eps: 1e-5,
                            zero_centered_gamma: false,
                            out_dtype: fp8,
                            scale,
                        })?;
                        let (y, rs) = oracle::rmsnorm_fwd(&xv, n, &gv, 1e-5, false);
                        let mut c = fp8_cmps(&o.y, o.amax.as_ref(), o.scale_inv.as_ref(), y)?;
                        c.push(cmp("rsigma", &o.rsigma, rs, DType::F32)?);
                        Ok(c)
                    });
                    self.optional_case("layernorm_fwd", dtype, case, |s| {
                        let (x, xv) = s.rand(&[rows, n], dtype, -3.0, 3.0)?;
                        let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                        let (b, bv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                        let scale = Some(s.put(&[sc], &[1], DType::F32)?);
                        let o = s.call::<LayerNormFwd>(&LayerNormFwdArgs {
                            x,
                            gamma: g,
                            beta: b,
                            eps: 1e-5,
                            zero_centered_gamma: true,
                            out_dtype: fp8,
                            scale,
                        })?;
                        let (y, _, rs) = oracle::layernorm_fwd(&xv, n, &gv, &bv, 1e-5, true);
                        let mut c = fp8_cmps(&o.y, o.amax.as_ref(), o.scale_inv.as_ref(), y)?;
                        c.push(cmp("rsigma", &o.rsigma, rs, DType::F32)?);
                        Ok(c)
                    });
                }
            }
        }
    }
}
