//! NaN propagation and aliasing, for every backend (issue 12, defects 8 and 11).
//!
//! NaN cases put a NaN into one element of one input and compare with the f64 oracle, which
//! propagates NaN by plain arithmetic: every output element the oracle makes NaN must be NaN,
//! every other element must match within tolerance, and each case must produce at least one
//! NaN (so that it can fail). Aliasing cases pass one tensor as two arguments of which one is
//! written in place: the call must be an `InvalidArgument` naming one of them.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, Tensor};

use super::activations::{GATED, PLAIN};
use super::{Cmp, FLOATS, Suite, cmp};
use crate::oracle;

/// A comparison in which NaN is expected where the oracle has it.
fn nan_cmp(name: &'static str, got: &Tensor, want: Vec<f64>, dtype: DType) -> tefl_core::Result<Cmp> {
    Ok(Cmp { nan: true, ..cmp(name, got, want, dtype)? })
}

impl Suite<'_> {
    /// A random tensor with NaN at the flat positions `nan_at`, and its values.
    fn rand_nan(
        &mut self,
        shape: &[usize],
        dtype: DType,
        lo: f64,
        hi: f64,
        nan_at: &[usize],
    ) -> tefl_core::Result<(Tensor, Vec<f64>)> {
        self.rand_with(shape, dtype, lo, hi, nan_at, f64::NAN)
    }

    /// A random tensor with `special` (NaN, ±inf) at the flat positions `at`, and its values.
    pub(super) fn rand_with(
        &mut self,
        shape: &[usize],
        dtype: DType,
        lo: f64,
        hi: f64,
        at: &[usize],
        special: f64,
    ) -> tefl_core::Result<(Tensor, Vec<f64>)> {
        let n: usize = shape.iter().product();
        let mut v = self.rng.vec(n, lo, hi);
        for &i in at {
            v[i] = special;
        }
        let t = self.put(&v, shape, dtype)?;
        let exact = t.to_vec::<f64>()?;
        Ok((t, exact))
    }

    /// NaN propagation cases.
    pub(super) fn nan(&mut self) {
        for dtype in FLOATS {
            self.nan_norms(dtype);
            self.nan_gemm(dtype);
            self.nan_activations(dtype);
            self.nan_softmax(dtype);
            self.nan_attention(dtype);
            self.nan_misc(dtype);
        }
    }

    fn nan_norms(&mut self, dtype: DType) {
        let (rows, n) = (3, 64);
        self.case("rmsnorm_fwd", dtype, "NaN in x[1, 5]".into(), |s| {
            let (x, xv) = s.rand_nan(&[rows, n], dtype, -2.0, 2.0, &[n + 5])?;
            let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
            let o = s.call::<RmsNormFwd>(tefl_ops::rmsnorm_fwd(&x, &g, 1e-5).args())?;
            let (y, rs) = oracle::rmsnorm_fwd(&xv, n, &gv, 1e-5, false);
            Ok(vec![nan_cmp("y", &o.y, y, dtype)?, nan_cmp("rsigma", &o.rsigma, rs, DType::F32)?])
        });
        self.case("layernorm_fwd", dtype, "NaN in x[2, 0]".into(), |s| {
            let (x, xv) = s.rand_nan(&[rows, n], dtype, -2.0, 2.0, &[2 * n])?;
            let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
            let (b, bv) = s.rand(&[n], dtype, -1.0, 1.0)?;
            let o = s.call::<LayerNormFwd>(tefl_ops::layernorm_fwd(&x, &g, &b, 1e-5).args())?;
            let (y, mu, rs) = oracle::layernorm_fwd(&xv, n, &gv, &bv, 1e-5, false);
            Ok(vec![
                nan_cmp("y", &o.y, y, dtype)?,
                Cmp { floor: 0.5, ..nan_cmp("mu", &o.mu, mu, DType::F32)? },
                nan_cmp("rsigma", &o.rsigma, rs, DType::F32)?,
            ])
        });
        self.case("rmsnorm_bwd", dtype, "NaN in dy[0, 7]".into(), |s| {
            let (x, xv) = s.rand(&[rows, n], dtype, -2.0, 2.0)?;
            let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
            let (dy, dyv) = s.rand_nan(&[rows, n], dtype, -1.0, 1.0, &[7])?;
            let (_, rs) = oracle::rmsnorm_fwd(&xv, n, &gv, 1e-5, false);
            let rs_t = s.put(&rs, &[rows], DType::F32)?;
            let rsv = rs_t.to_vec::<f64>()?;
            let (dx, dg) = oracle::rmsnorm_bwd(&dyv, &xv, &rsv, n, &gv, false);
            let o = s.call::<RmsNormBwd>(tefl_ops::rmsnorm_bwd(&dy, &x, &rs_t, &g).args())?;
            Ok(vec![nan_cmp("dx", &o.dx, dx, dtype)?, nan_cmp("dgamma", &o.dgamma, dg, dtype)?])
        });
    }

    fn nan_gemm(&mut self, dtype: DType) {
        let (m, k, n) = (5, 7, 9);
        for ep in [GemmEpilogue::None, GemmEpilogue::Gelu] {
            self.case("generic_gemm", dtype, format!("NaN in a[2, 3], {ep:?}"), |s| {
                let (a, av) = s.rand_nan(&[m, k], dtype, -1.0, 1.0, &[2 * k + 3])?;
                let (b, bv) = s.rand(&[k, n], dtype, -1.0, 1.0)?;
                let o = s.call::<GenericGemm>(tefl_ops::generic_gemm(&a, &b).epilogue(ep).args())?;
                let (d, aux_out, _) = oracle::gemm(&av, &bv, (m, k, n), false, false, 1.0, None, None, None, ep);
                let mut out = vec![nan_cmp("d", &o.d, d, dtype)?];
                if let (Some(w), Some(g)) = (aux_out, &o.aux_out) {
                    out.push(nan_cmp("aux_out", g, w, dtype)?);
                }
                Ok(out)
            });
        }
    }

    fn nan_activations(&mut self, dtype: DType) {
        let (rows, n) = (2, 40);
        for (fname, bname, kind, f, b) in PLAIN {
            self.case(fname, dtype, "NaN in x[0, 3] and x[1, 39]".into(), |s| {
                let (x, xv) = s.rand_nan(&[rows, n], dtype, -3.0, 3.0, &[3, 2 * n - 1])?;
                let o = f(s, ActArgs { x })?;
                Ok(vec![nan_cmp("y", &o.y, xv.iter().map(|v| oracle::act(kind, *v)).collect(), dtype)?])
            });
            self.case(bname, dtype, "NaN in input[0, 3], grad[1, 0]".into(), |s| {
                let (x, xv) = s.rand_nan(&[rows, n], dtype, -3.0, 3.0, &[3])?;
                let (g, gv) = s.rand_nan(&[rows, n], dtype, -1.0, 1.0, &[n])?;
                let o = b(s, DActArgs { grad: g, input: x })?;
                let want = xv.iter().zip(&gv).map(|(v, g)| g * oracle::dact(kind, *v)).collect();
                Ok(vec![nan_cmp("grad_input", &o.grad_input, want, dtype)?])
            });
        }
        for (fname, _, kind, f, _) in GATED {
            self.case(fname, dtype, "NaN in a[0, 1] and b[1, 2]".into(), |s| {
                let (x, xv) = s.rand_nan(&[rows, 2 * n], dtype, -3.0, 3.0, &[1, 2 * n + n + 2])?;
                let o = f(s, ActArgs { x })?;
                Ok(vec![nan_cmp("y", &o.y, oracle::gated(kind, &xv, n), dtype)?])
            });
        }
        self.case("clamped_swiglu", dtype, "NaN in a[0, 1] and b[1, 2]".into(), |s| {
            let (x, xv) = s.rand_nan(&[rows, 2 * n], dtype, -9.0, 9.0, &[1, 2 * n + n + 2])?;
            let o = s.call::<ClampedSwiglu>(&ClampedSwigluArgs { x, limit: 7.0, alpha: 1.702 })?;
            Ok(vec![nan_cmp("y", &o.y, oracle::clamped_swiglu(&xv, n, 7.0, f64::from(1.702f32)), dtype)?])
        });
        self.case("clamped_dswiglu", dtype, "NaN in a[0, 1] and b[1, 2]".into(), |s| {
            let (x, xv) = s.rand_nan(&[rows, 2 * n], dtype, -9.0, 9.0, &[1, 2 * n + n + 2])?;
            let (g, gv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
            let o = s.call::<ClampedDSwiglu>(&ClampedDSwigluArgs { grad: g, input: x, limit: 7.0, alpha: 1.702 })?;
            let want = oracle::clamped_dswiglu(&xv, &gv, n, 7.0, f64::from(1.702f32));
            Ok(vec![nan_cmp("grad_input", &o.grad_input, want, dtype)?])
        });
        self.case("dbias_drelu", dtype, "NaN in input[1, 4]".into(), |s| {
            let (x, xv) = s.rand_nan(&[rows, n], dtype, -3.0, 3.0, &[n + 4])?;
            let (g, gv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
            let o = s.call::<DBiasDRelu>(&DActArgs { grad: g, input: x })?;
            let gi: Vec<f64> = xv.iter().zip(&gv).map(|(v, g)| g * oracle::dact(Activation::Relu, *v)).collect();
            let db = (0..n).map(|j| (0..rows).map(|r| gi[r * n + j]).sum()).collect();
            Ok(vec![nan_cmp("grad_input", &o.grad_input, gi, dtype)?, nan_cmp("dbias", &o.dbias, db, dtype)?])
        });
    }

    fn nan_softmax(&mut self, dtype: DType) {
        let (b, h, sq, sk) = (1, 2, 3, 50);
        self.case("scaled_softmax_forward", dtype, "NaN in x[0, 1, 2, 10]".into(), |s| {
            let at = (sq + 2) * sk + 10; // batch 0, head 1, row 2, column 10
            let (x, xv) = s.rand_nan(&[b, h, sq, sk], dtype, -3.0, 3.0, &[at])?;
            let o = s.call::<ScaledSoftmaxForward>(&SoftmaxArgs { x, scale: 0.5 })?;
            Ok(vec![nan_cmp("y", &o.y, oracle::softmax(&xv, sq, sk, 0.5, |_, _, _| false), dtype)?])
        });
        // +inf: exp(inf - inf) is NaN, so the row's sum and every output of that row are NaN
        // (as in torch and the oracle), not 0 beside one NaN; the other rows are unaffected.
        // Rows of 64, whole 16-byte vectors: the backends' register-resident row paths.
        self.case("scaled_softmax_forward", dtype, "+inf in x[0, 0, 1, 7], rows of 64".into(), |s| {
            let sk = 64;
            let at = sk + 7; // batch 0, head 0, row 1, column 7
            let (x, xv) = s.rand_with(&[b, h, sq, sk], dtype, -3.0, 3.0, &[at], f64::INFINITY)?;
            let o = s.call::<ScaledSoftmaxForward>(&SoftmaxArgs { x, scale: 0.5 })?;
            Ok(vec![nan_cmp("y", &o.y, oracle::softmax(&xv, sq, sk, 0.5, |_, _, _| false), dtype)?])
        });
        // The same under masks: the row's visible entries are NaN, its masked ones stay 0.
        self.case(
            "scaled_upper_triang_masked_softmax_forward",
            dtype,
            "+inf in x[0, 0, 9, 3], rows of 64".into(),
            |s| {
                let (sq, sk) = (64, 64);
                let (x, xv) = s.rand_with(&[1, 2, sq, sk], dtype, -3.0, 3.0, &[9 * sk + 3], f64::INFINITY)?;
                let o = s.call::<ScaledUpperTriangMaskedSoftmaxForward>(&SoftmaxArgs { x, scale: 0.5 })?;
                Ok(vec![nan_cmp("y", &o.y, oracle::softmax(&xv, sq, sk, 0.5, |_, i, j| j > i), dtype)?])
            },
        );
        self.case("scaled_masked_softmax_forward", dtype, "+inf in x[0, 1, 2, 5], rows of 64".into(), |s| {
            let sk = 64;
            let (x, xv) = s.rand_with(&[b, h, sq, sk], dtype, -3.0, 3.0, &[(sq + 2) * sk + 5], f64::INFINITY)?;
            // Every other column masked, except the +inf's.
            let mv: Vec<u8> = (0..sq * sk).map(|e| u8::from(e % 2 == 0 && e % sk != 5)).collect();
            let mask = Tensor::from_slice(&mv, [1, 1, sq, sk], DType::U8)?.to_device(&s.device)?;
            let o = s.call::<ScaledMaskedSoftmaxForward>(&MaskedSoftmaxArgs { x, mask, scale: 0.5 })?;
            let want = oracle::softmax(&xv, sq, sk, 0.5, |_, i, j| mv[i * sk + j] != 0);
            Ok(vec![nan_cmp("y", &o.y, want, dtype)?])
        });
        self.case("scaled_upper_triang_masked_softmax_forward", dtype, "NaN in x[0, 0, 2, 1]".into(), |s| {
            let (sq, sk) = (5, 5);
            let (x, xv) = s.rand_nan(&[1, 1, sq, sk], dtype, -3.0, 3.0, &[2 * sk + 1])?;
            let o = s.call::<ScaledUpperTriangMaskedSoftmaxForward>(&SoftmaxArgs { x, scale: 1.0 })?;
            Ok(vec![nan_cmp("y", &o.y, oracle::softmax(&xv, sq, sk, 1.0, |_, i, j| j > i), dtype)?])
        });
    }

    fn nan_attention(&mut self, dtype: DType) {
        // The case: q [1, 6, 1, 4], causal, NaN in one query row; then k and v. The NaN
        // in v sits at key 0, which every query sees: whether a NaN in a masked key's v may
        // reach the output (tensor-core kernels multiply it by an exact 0, as torch's math
        // path does) is left open here.
        for (what, shape, d) in [("q", [1usize, 6, 1, 4], 4usize), ("k", [1, 40, 2, 64], 64), ("v", [1, 40, 2, 64], 64)]
        {
            self.case("fused_attn_fwd", dtype, format!("NaN in {what}, causal, {shape:?}"), |s| {
                let pos = if what == "v" { 0 } else { 3 };
                let nan_row = pos * shape[2] * d + 1; // that position, head 0, element 1
                let pick = |w: &str| if w == what { vec![nan_row] } else { Vec::new() };
                let (q, qv) = s.rand_nan(&shape, dtype, -1.0, 1.0, &pick("q"))?;
                let (k, kv) = s.rand_nan(&shape, dtype, -1.0, 1.0, &pick("k"))?;
                let (v, vv) = s.rand_nan(&shape, dtype, -1.0, 1.0, &pick("v"))?;
                let args = AttnFwdArgs {
                    q,
                    k,
                    v,
                    cu_seqlens_q: None,
                    cu_seqlens_kv: None,
                    layout: QkvLayout::Bshd,
                    mask: AttnMask::Causal,
                    scale: 1.0 / (d as f32).sqrt(),
                    dropout_p: 0.0,
                    seed: 0,
                    offset: 0,
                    window: AttnWindow::default(),
                    max_seqlen_q: None,
                    max_seqlen_kv: None,
                };
                let g = attn_geometry("conformance", &args.q, &args.k, &args.v, None, None, args.layout, args.mask)?;
                let o = s.call::<FusedAttnFwd>(&args)?;
                let want = oracle::AttnProblem {
                    g: &g,
                    q: &qv,
                    k: &kv,
                    v: &vv,
                    mask: args.mask,
                    window: args.window,
                    scale: f64::from(args.scale),
                    p: 0.0,
                    seed: 0,
                    offset: 0,
                }
                .forward();
                let mut out = vec![nan_cmp("o", &o.o, want.o, dtype)?];
                if what != "v" {
                    // v does not enter the log-sum-exp.
                    out.push(nan_cmp("softmax_lse", &o.softmax_lse, want.lse, DType::F32)?);
                }
                Ok(out)
            });
        }
    }

    fn nan_misc(&mut self, dtype: DType) {
        // Dropout multiplies (as torch does): NaN stays NaN at kept and dropped positions.
        self.case("dropout_fwd", dtype, "NaN at a kept and a dropped position".into(), |s| {
            let n = 64;
            let kept: Vec<f64> =
                (0..n).map(|i| f64::from(u8::from(tefl_core::philox::uniform(5, 9, i as u64) >= 0.5))).collect();
            let (k_at, d_at) = (kept.iter().position(|k| *k == 1.0), kept.iter().position(|k| *k == 0.0));
            let nan_at: Vec<usize> = [k_at, d_at].into_iter().flatten().collect();
            let (x, xv) = s.rand_nan(&[n], dtype, -1.0, 1.0, &nan_at)?;
            let o = s.call::<DropoutFwd>(&DropoutFwdArgs { x, p: 0.5, seed: 5, offset: 9 })?;
            let y = xv.iter().zip(&kept).map(|(x, k)| x * k * 2.0).collect();
            Ok(vec![nan_cmp("y", &o.y, y, dtype)?])
        });
        self.case("dropout_bwd", dtype, "NaN in dy at a dropped position".into(), |s| {
            let mv: Vec<u8> = (0..16).map(|i| u8::from(i % 2 == 0)).collect();
            let (dy, dyv) = s.rand_nan(&[16], dtype, -1.0, 1.0, &[3, 4])?;
            let mask = Tensor::from_slice(&mv, [16], DType::U8)?.to_device(&s.device)?;
            let o = s.call::<DropoutBwd>(&DropoutBwdArgs { dy, mask, p: 0.5 })?;
            let want = dyv.iter().zip(&mv).map(|(d, m)| d * f64::from(*m) * 2.0).collect();
            Ok(vec![nan_cmp("dx", &o.dx, want, dtype)?])
        });
        for fp8 in [DType::F8E4M3, DType::F8E5M2] {
            self.case("quantize", dtype, format!("NaN in x[2, 7], to {fp8}"), |s| {
                let f = tefl_core::fp8::Fp8Format::of(fp8).ok_or_else(|| Error::Tensor("fp8".into()))?;
                let (x, xv) = s.rand_nan(&[3, 50], dtype, -3.0, 3.0, &[107])?;
                let scale = s.put(&[4.0], &[1], DType::F32)?;
                let o = s.call::<Quantize>(&QuantizeArgs { x, scale, fp8_dtype: fp8, want_transpose: true })?;
                let want: Vec<f64> = xv
                    .iter()
                    .map(|v| f64::from(f.decode(oracle::fp8_nearest(f, f64::from(*v as f32 * 4.0)))))
                    .collect();
                let q_t = o.q_t.ok_or_else(|| Error::Tensor("q_t missing".into()))?;
                let want_t: Vec<f64> =
                    (0..50).flat_map(|j| (0..3).map(move |i| (i, j))).map(|(i, j)| want[i * 50 + j]).collect();
                Ok(vec![
                    nan_cmp("q", &o.q, want, DType::F32)?,
                    nan_cmp("q_t", &q_t, want_t, DType::F32)?,
                    nan_cmp("amax", &o.amax, vec![f64::NAN], DType::F32)?,
                ])
            });
        }
        self.case("compute_amax", dtype, "NaN in x[100]".into(), |s| {
            let (x, _) = s.rand_nan(&[3, 70], dtype, -3.0, 3.0, &[100])?;
            let o = s.call::<ComputeAmax>(&ComputeAmaxArgs { x })?;
            Ok(vec![nan_cmp("amax", &o.amax, vec![f64::NAN], DType::F32)?])
        });
        self.case("fused_rope_forward", dtype, "NaN in x[0, 1, 0, 3]".into(), |s| {
            let (b, sl, h, d) = (1, 4, 1, 8);
            let (x, xv) = s.rand_nan(&[b, sl, h, d], dtype, -1.0, 1.0, &[d + 3])?;
            let (freqs, fv) = s.rand(&[sl, d], DType::F32, -3.0, 3.0)?;
            let o = s.call::<FusedRopeForward>(&RopeArgs {
                x,
                freqs,
                cu_seqlens: None,
                start_positions: None,
                layout: QkvLayout::Bshd,
                interleaved: false,
            })?;
            let mut want = Vec::with_capacity(xv.len());
            for p in 0..sl {
                want.extend(oracle::rope_vec(&xv[p * d..(p + 1) * d], &fv[p * d..(p + 1) * d], false));
            }
            Ok(vec![nan_cmp("y", &o.y, want, dtype)?])
        });
        self.case("multi_tensor_adam", dtype, "NaN in grads[0][3]".into(), |s| {
            let n = 10;
            let (g, gv) = s.rand_nan(&[n], dtype, -1.0, 1.0, &[3])?;
            let (p, pv) = s.rand(&[n], dtype, -1.0, 1.0)?;
            let (m, mv) = s.rand(&[n], DType::F32, -0.1, 0.1)?;
            let (v, vv) = s.rand(&[n], DType::F32, 0.0, 0.1)?;
            let hyper = AdamHyper::adamw(1e-2);
            s.call::<MultiTensorAdam>(&MultiTensorAdamArgs {
                noop_flag: s.noop()?,
                grads: vec![g],
                params: vec![p.clone()],
                exp_avg: vec![m.clone()],
                exp_avg_sq: vec![v.clone()],
                hyper,
            })?;
            let r: Vec<(f64, f64, f64)> =
                (0..n).map(|j| oracle::adam_step(pv[j], gv[j], mv[j], vv[j], &hyper)).collect();
            Ok(vec![
                nan_cmp("params", &p, crate::round(&r.iter().map(|x| x.0).collect::<Vec<_>>(), dtype), dtype)?,
                nan_cmp("exp_avg", &m, r.iter().map(|x| x.1).collect(), DType::F32)?,
                nan_cmp("exp_avg_sq", &v, r.iter().map(|x| x.2).collect(), DType::F32)?,
            ])
        });
    }

    /// Aliasing cases: one tensor passed as two arguments, one written in place.
    pub(super) fn aliasing(&mut self) {
        // The in-place ops start with the i32 noop flag or f32 statistics: one dtype is enough.
        {
            let dtype = DType::F32;
            self.case("multi_tensor_adam", dtype, "grads and exp_avg share a tensor".into(), |s| {
                let (m, _) = s.rand(&[8], DType::F32, -0.1, 0.1)?;
                let (p, _) = s.rand(&[8], dtype, -1.0, 1.0)?;
                let (v, _) = s.rand(&[8], DType::F32, 0.0, 0.1)?;
                let r = s.call::<MultiTensorAdam>(&MultiTensorAdamArgs {
                    noop_flag: s.noop()?,
                    grads: vec![m.clone()],
                    params: vec![p],
                    exp_avg: vec![m],
                    exp_avg_sq: vec![v],
                    hyper: AdamHyper::adamw(1e-2),
                });
                expect_alias(r, &["grads", "exp_avg"])
            });
            self.case("multi_tensor_scale", dtype, "in place: dst[i] is src[i] (allowed)".into(), |s| {
                let (a, av) = s.rand(&[33], dtype, -1.0, 1.0)?;
                let (b, bv) = s.rand(&[33], DType::F32, -1.0, 1.0)?;
                let (d, _) = s.rand(&[33], dtype, -1.0, 1.0)?;
                s.call::<MultiTensorScale>(&MultiTensorScaleArgs {
                    noop_flag: s.noop()?,
                    src: vec![a.clone(), b.clone()],
                    dst: vec![a.clone(), d],
                    scale: 0.5,
                })?;
                let half = |v: &[f64]| v.iter().map(|x| x * 0.5).collect::<Vec<_>>();
                let out = vec![
                    cmp("dst[0] (in place)", &a, half(&av), dtype)?,
                    cmp("src[1] (unchanged)", &b, bv, DType::F32)?,
                ];
                // src[0] passed as dst[1] (another index) is still refused.
                let r = s.call::<MultiTensorScale>(&MultiTensorScaleArgs {
                    noop_flag: s.noop()?,
                    src: vec![a.clone(), b.clone()],
                    dst: vec![b.clone(), a.clone()],
                    scale: 0.5,
                });
                expect_alias(r, &["dst", "src"])?;
                Ok(out)
            });
            self.case("multi_tensor_scale", dtype, "dst holds one tensor twice".into(), |s| {
                let (a, _) = s.rand(&[8], dtype, -1.0, 1.0)?;
                let (b, _) = s.rand(&[8], dtype, -1.0, 1.0)?;
                let (d, _) = s.rand(&[8], dtype, -1.0, 1.0)?;
                let r = s.call::<MultiTensorScale>(&MultiTensorScaleArgs {
                    noop_flag: s.noop()?,
                    src: vec![a, b],
                    dst: vec![d.clone(), d],
                    scale: 2.0,
                });
                expect_alias(r, &["dst"])
            });
        }
        self.case("fused_amax_and_scale_update_after_reduction", DType::F32, "scale passed as scale_inv".into(), |s| {
            let (h, _) = s.rand(&[4, 3], DType::F32, 0.0, 1.0)?;
            let (sc, _) = s.rand(&[3], DType::F32, 0.5, 1.0)?;
            let r = s.call::<FusedAmaxAndScaleUpdate>(&DelayedScalingArgs {
                amax_history: h,
                scale: sc.clone(),
                scale_inv: sc,
                fp8_max: 448.0,
                margin: 0.0,
                algo: AmaxAlgo::Max,
            });
            expect_alias(r, &["scale", "scale_inv"])
        });
    }
}

/// The call must have been refused as aliased, naming one of `args`; the case then passes.
fn expect_alias<T>(r: tefl_core::Result<T>, args: &[&str]) -> tefl_core::Result<Vec<Cmp>> {
    match r {
        Err(Error::InvalidArgument { arg, reason, .. }) if args.contains(&arg) && reason.contains("in place") => {
            Ok(Vec::new())
        }
        Err(e) => Err(Error::Tensor(format!("expected an aliasing error naming {args:?}, got: {e}"))),
        Ok(_) => Err(Error::Tensor(format!("aliased arguments {args:?} were accepted"))),
    }
}
