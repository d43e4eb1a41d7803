//! Empty tensors: a batch of nothing (zero rows, zero tokens, an m or k of 0) is a valid call.
//! Outputs over the empty dims are empty with the contract's shapes; reductions over them are
//! their empty value (a column sum, a dgamma, an amax of nothing: 0).

use tefl_core::DType;
use tefl_core::catalogue::*;

use super::{Cmp, Suite, cmp};

impl Suite<'_> {
    pub(super) fn empty(&mut self) {
        for dtype in [DType::F32, DType::BF16] {
            self.empty_rows(dtype);
            self.empty_gemm(dtype);
            self.empty_grouped_gemm(dtype);
            self.empty_sequences(dtype);
        }
        self.empty_fp8_gemm();
    }

    /// Row-wise ops on `[0, n]` inputs.
    fn empty_rows(&mut self, dtype: DType) {
        let n = 64;
        self.case("rmsnorm_fwd", dtype, "0 rows".into(), |s| {
            let x = s.put(&[], &[0, n], dtype)?;
            let gamma = s.rand(&[n], dtype, 0.5, 1.5)?.0;
            let o = s.call::<RmsNormFwd>(&RmsNormFwdArgs {
                x,
                gamma,
                eps: 1e-5,
                zero_centered_gamma: false,
                out_dtype: dtype,
                scale: None,
            })?;
            Ok(vec![cmp("y", &o.y, vec![], dtype)?, cmp("rsigma", &o.rsigma, vec![], DType::F32)?])
        });
        self.case("rmsnorm_bwd", dtype, "0 rows: dgamma 0".into(), |s| {
            let (dy, x) = (s.put(&[], &[0, n], dtype)?, s.put(&[], &[0, n], dtype)?);
            let rsigma = s.put(&[], &[0], DType::F32)?;
            let gamma = s.rand(&[n], dtype, 0.5, 1.5)?.0;
            let o = s.call::<RmsNormBwd>(&RmsNormBwdArgs { dy, x, rsigma, gamma, zero_centered_gamma: false })?;
            Ok(vec![cmp("dx", &o.dx, vec![], dtype)?, cmp("dgamma", &o.dgamma, vec![0.0; n], dtype)?])
        });
        self.case("gelu", dtype, "0 rows".into(), |s| {
            let x = s.put(&[], &[0, n], dtype)?;
            Ok(vec![cmp("y", &s.call::<Gelu>(&ActArgs { x })?.y, vec![], dtype)?])
        });
        self.case("swiglu", dtype, "0 rows".into(), |s| {
            let x = s.put(&[], &[0, 2 * n], dtype)?;
            Ok(vec![cmp("y", &s.call::<Swiglu>(&ActArgs { x })?.y, vec![], dtype)?])
        });
        self.case("dbias_dgelu", dtype, "0 rows: dbias 0".into(), |s| {
            let (grad, input) = (s.put(&[], &[0, n], dtype)?, s.put(&[], &[0, n], dtype)?);
            let o = s.call::<DBiasDGelu>(&DActArgs { grad, input })?;
            Ok(vec![cmp("grad_input", &o.grad_input, vec![], dtype)?, cmp("dbias", &o.dbias, vec![0.0; n], dtype)?])
        });
        self.case("scaled_softmax_forward", dtype, "[2, 3, 0, 8]".into(), |s| {
            let x = s.put(&[], &[2, 3, 0, 8], dtype)?;
            Ok(vec![cmp("y", &s.call::<ScaledSoftmaxForward>(&SoftmaxArgs { x, scale: 0.5 })?.y, vec![], dtype)?])
        });
        self.case("scaled_softmax_backward", dtype, "[0, 3, 4, 8]".into(), |s| {
            let (dy, y) = (s.put(&[], &[0, 3, 4, 8], dtype)?, s.put(&[], &[0, 3, 4, 8], dtype)?);
            let o = s.call::<ScaledSoftmaxBackward>(&SoftmaxBwdArgs { dy, y, scale: 0.5 })?;
            Ok(vec![cmp("dx", &o.dx, vec![], dtype)?])
        });
        self.case("compute_amax", dtype, "0 elements: amax 0".into(), |s| {
            let x = s.put(&[], &[0], dtype)?;
            Ok(vec![cmp("amax", &s.call::<ComputeAmax>(&ComputeAmaxArgs { x })?.amax, vec![0.0], DType::F32)?])
        });
        self.case("dropout_fwd", dtype, "0 rows".into(), |s| {
            let x = s.put(&[], &[0, n], dtype)?;
            let o = s.call::<DropoutFwd>(&DropoutFwdArgs { x, p: 0.3, seed: 7, offset: 11 })?;
            Ok(vec![cmp("y", &o.y, vec![], dtype)?])
        });
    }

    /// GEMMs with an empty m (nothing to compute) and an empty k (D = 0 + bias).
    fn empty_gemm(&mut self, dtype: DType) {
        self.case("generic_gemm", dtype, "m 0, k 32, n 16".into(), |s| {
            let (a, b) = (s.put(&[], &[0, 32], dtype)?, s.rand(&[32, 16], dtype, -1.0, 1.0)?.0);
            let o = s.call::<GenericGemm>(tefl_ops::generic_gemm(&a, &b).args())?;
            Ok(vec![cmp("d", &o.d, vec![], dtype)?])
        });
        self.case("generic_gemm", dtype, "m 5, k 0, n 16, bias".into(), |s| {
            let (a, b) = (s.put(&[], &[5, 0], dtype)?, s.put(&[], &[0, 16], dtype)?);
            let (bias, bv) = s.rand(&[16], dtype, -1.0, 1.0)?;
            let o =
                s.call::<GenericGemm>(tefl_ops::generic_gemm(&a, &b).epilogue(GemmEpilogue::Bias).bias(&bias).args())?;
            Ok(vec![cmp("d", &o.d, (0..5).flat_map(|_| bv.iter().copied()).collect(), dtype)?])
        });
    }

    /// FP8 GEMMs with an empty m (an empty D, and an FP8 D's amax of nothing: 0) and an empty k
    /// (D = the bias, quantized with d_scale; its amax is max |bias|).
    fn empty_fp8_gemm(&mut self) {
        let (e4, e5) = (DType::F8E4M3, DType::F8E5M2);
        for out in [DType::BF16, e4] {
            self.case("generic_gemm", e4, format!("f8e4m3 x f8e5m2, m 0, k 32, n 16 -> {out}"), |s| {
                let (a, b) = (s.put(&[], &[0, 32], e4)?, s.rand(&[32, 16], e5, -1.0, 1.0)?.0);
                let (sa, sb, sd) = (
                    s.put(&[0.5], &[1], DType::F32)?,
                    s.put(&[2.0], &[1], DType::F32)?,
                    s.put(&[4.0], &[1], DType::F32)?,
                );
                let mut call = tefl_ops::generic_gemm(&a, &b).fp8_scales(&sa, &sb);
                if out.is_fp8() {
                    call = call.fp8_output(out, &sd);
                }
                let o = s.call::<GenericGemm>(call.args())?;
                let mut cmps = vec![cmp("d", &o.d, vec![], out)?];
                match (&o.d_amax, out.is_fp8()) {
                    (Some(amax), true) => cmps.push(cmp("d_amax", amax, vec![0.0], DType::F32)?),
                    (None, false) => {}
                    _ => return Err(tefl_core::Error::Tensor("d_amax present for a float D, or missing".into())),
                }
                Ok(cmps)
            });
            self.case("generic_gemm", e4, format!("f8e4m3, m 5, k 0, n 16, bias -> {out}"), |s| {
                let (a, b) = (s.put(&[], &[5, 0], e4)?, s.put(&[], &[0, 16], e4)?);
                let (bias, bv) = s.rand(&[16], DType::BF16, -1.0, 1.0)?;
                let (sa, sd) = (s.put(&[0.5], &[1], DType::F32)?, 4.0);
                let sd_t = s.put(&[sd], &[1], DType::F32)?;
                let mut call =
                    tefl_ops::generic_gemm(&a, &b).fp8_scales(&sa, &sa).epilogue(GemmEpilogue::Bias).bias(&bias);
                if out.is_fp8() {
                    call = call.fp8_output(out, &sd_t);
                }
                let o = s.call::<GenericGemm>(call.args())?;
                let want: Vec<f64> = (0..5).flat_map(|_| bv.iter().copied()).collect();
                if !out.is_fp8() {
                    return Ok(vec![cmp("d", &o.d, want, out)?]);
                }
                // The codes decoded and unscaled, against the bias at the format's tolerance.
                let got: Vec<f64> = o.d.to_vec::<f64>()?.iter().map(|v| v / sd).collect();
                let amax = bv.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                let d_amax = o.d_amax.as_ref().ok_or_else(|| tefl_core::Error::Tensor("d_amax missing".into()))?;
                Ok(vec![
                    Cmp { name: "d", got, want, dtype: out, floor: 0.0, nan: false },
                    cmp("d_amax", d_amax, vec![amax], DType::F32)?,
                ])
            });
        }
    }

    /// Grouped GEMMs whose every group has no rows: one empty D per group.
    fn empty_grouped_gemm(&mut self, dtype: DType) {
        self.case("te_general_grouped_gemm", dtype, "2 groups of m 0, k 32, n 16".into(), |s| {
            let a = [s.put(&[], &[0, 32], dtype)?, s.put(&[], &[0, 32], dtype)?];
            let b = [s.rand(&[32, 16], dtype, -1.0, 1.0)?.0, s.rand(&[32, 16], dtype, -1.0, 1.0)?.0];
            let o = s.call::<GroupedGemm>(tefl_ops::grouped_gemm(&a, &b).args())?;
            if o.d.len() != 2 {
                return Err(tefl_core::Error::Tensor(format!("{} outputs for 2 groups", o.d.len())));
            }
            Ok(vec![cmp("d[0]", &o.d[0], vec![], dtype)?, cmp("d[1]", &o.d[1], vec![], dtype)?])
        });
    }

    /// RoPE and attention on a batch of no sequences and on sequences of no positions.
    fn empty_sequences(&mut self, dtype: DType) {
        for (what, shape) in [("batch 0", [0usize, 6, 2, 16]), ("s 0", [3, 0, 2, 16])] {
            self.case("fused_rope_forward", dtype, format!("bshd, {what}"), |s| {
                let x = s.put(&[], &shape, dtype)?;
                let freqs = s.rand(&[8, 16], DType::F32, -3.0, 3.0)?.0;
                let args = RopeArgs {
                    x,
                    freqs,
                    cu_seqlens: None,
                    start_positions: None,
                    layout: QkvLayout::Bshd,
                    interleaved: false,
                };
                Ok(vec![cmp("y", &s.call::<FusedRopeForward>(&args)?.y, vec![], dtype)?])
            });
            if dtype == DType::F32 {
                // The attention kernels take 16-bit inputs on the GPU; f32 is the reference's.
                continue;
            }
            self.case("fused_attn_fwd", dtype, format!("bshd causal, {what}"), |s| {
                let (q, k, v) = (s.put(&[], &shape, dtype)?, s.put(&[], &shape, dtype)?, s.put(&[], &shape, dtype)?);
                let args = AttnFwdArgs {
                    q,
                    k,
                    v,
                    cu_seqlens_q: None,
                    cu_seqlens_kv: None,
                    layout: QkvLayout::Bshd,
                    mask: AttnMask::Causal,
                    scale: 0.25,
                    dropout_p: 0.0,
                    seed: 0,
                    offset: 0,
                    window: AttnWindow::default(),
                    max_seqlen_q: None,
                    max_seqlen_kv: None,
                };
                let o = s.call::<FusedAttnFwd>(&args)?;
                let (d_o, out) = (s.put(&[], &shape, dtype)?, o.o.clone());
                let g = s.call::<FusedAttnBwd>(&args.backward(out, d_o, o.softmax_lse.clone()))?;
                Ok(vec![
                    cmp("o", &o.o, vec![], dtype)?,
                    cmp("softmax_lse", &o.softmax_lse, vec![], DType::F32)?,
                    cmp("dq", &g.dq, vec![], dtype)?,
                    cmp("dk", &g.dk, vec![], dtype)?,
                    cmp("dv", &g.dv, vec![], dtype)?,
                ])
            });
        }
    }
}
