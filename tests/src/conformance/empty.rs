//! Empty tensors: a batch of nothing (zero rows, zero tokens, an m or k of 0) is a valid call.
//! Outputs over the empty dims are empty with the contract's shapes; reductions over them are
//! their empty value (a column sum, a dgamma, an amax of nothing: 0).

use tefl_core::DType;
use tefl_core::catalogue::*;

use super::{Suite, cmp};

impl Suite<'_> {
    pub(super) fn empty(&mut self) {
        for dtype in [DType::F32, DType::BF16] {
            self.empty_rows(dtype);
            self.empty_gemm(dtype);
            self.empty_grouped_gemm(dtype);
            self.empty_sequences(dtype);
        }
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
