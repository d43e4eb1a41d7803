//! The op catalogue: every op tefl dispatches, declared once (names are TransformerEngine's;
//! formulas in `shared/OPS.md`). Backends register impls against these types, `tefl-ops`
//! wraps them in typed entry points, and the conformance suite, the coverage table and
//! `TE_FL_PER_OP` validation all read this list.

use crate::op::OpDescriptor;
use crate::{DType, Error, Result, Tensor};

mod activation;
mod attention;
mod dropout;
mod gemm;
mod norm;
mod optimizer;
mod quantize;
mod rope;
mod softmax;

pub use activation::*;
pub use attention::*;
pub use dropout::*;
pub use gemm::*;
pub use norm::*;
pub use optimizer::*;
pub use quantize::*;
pub use rope::*;
pub use softmax::*;

/// Argument checks shared by the op declarations. Each returns an error naming the argument.
pub mod check {
    use super::*;

    /// `t` has a float dtype (f32, f16 or bf16).
    pub fn float(op: &'static str, arg: &'static str, t: &Tensor) -> Result<()> {
        dtype_in(op, arg, t, &DType::FLOATS)
    }

    /// `t`'s dtype is one of `allowed`.
    pub fn dtype_in(op: &'static str, arg: &'static str, t: &Tensor, allowed: &[DType]) -> Result<()> {
        if allowed.contains(&t.dtype()) {
            return Ok(());
        }
        let names: Vec<_> = allowed.iter().map(|d| d.name()).collect();
        Err(Error::DType { op, arg, got: t.dtype(), expected: format!("one of {}", names.join(", ")) })
    }

    /// `t` has exactly the dtype `want`.
    pub fn dtype_is(op: &'static str, arg: &'static str, t: &Tensor, want: DType) -> Result<()> {
        if t.dtype() == want {
            return Ok(());
        }
        Err(Error::DType { op, arg, got: t.dtype(), expected: want.to_string() })
    }

    /// `t`'s shape equals `want`.
    pub fn shape_is(op: &'static str, arg: &'static str, t: &Tensor, want: &[usize]) -> Result<()> {
        if t.shape() == want {
            return Ok(());
        }
        Err(Error::Shape { op, arg, got: t.shape().to_vec(), expected: format!("{want:?}") })
    }

    /// `t` has at least `rank` dimensions and a last dimension over 0 (the row length). The
    /// leading dimensions may be 0: a tensor without rows (an expert that drew no tokens, an
    /// empty batch) gives empty outputs and zero sums over its rows, as in torch.
    pub fn rows_of(op: &'static str, arg: &'static str, t: &Tensor, rank: usize) -> Result<()> {
        if t.rank() < rank || t.last_dim() == 0 {
            return Err(Error::Shape {
                op,
                arg,
                got: t.shape().to_vec(),
                expected: format!("rank at least {rank}, a last dimension over 0"),
            });
        }
        Ok(())
    }

    /// `dtype` is a float dtype an op can produce (f32, f16 or bf16).
    pub fn out_float(op: &'static str, arg: &'static str, dtype: DType) -> Result<()> {
        if DType::FLOATS.contains(&dtype) {
            return Ok(());
        }
        Err(Error::invalid(op, arg, format!("{dtype} is not f32, f16 or bf16")))
    }

    /// `p` is a probability in [0, 1).
    pub fn probability(op: &'static str, arg: &'static str, p: f32) -> Result<()> {
        if (0.0..1.0).contains(&p) {
            return Ok(());
        }
        Err(Error::invalid(op, arg, format!("must be in [0, 1), got {p}")))
    }

    /// `t` is a one-element f32 tensor (a per-tensor scale, amax or scale_inv).
    pub fn scalar_f32(op: &'static str, arg: &'static str, t: &Tensor) -> Result<()> {
        dtype_is(op, arg, t, DType::F32)?;
        if t.numel() != 1 {
            return Err(Error::Shape { op, arg, got: t.shape().to_vec(), expected: "one element".into() });
        }
        Ok(())
    }

    /// A tensor list is not empty.
    pub fn nonempty(op: &'static str, arg: &'static str, len: usize) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid(op, arg, "empty tensor list"));
        }
        Ok(())
    }

    /// Two tensor lists have the same length.
    pub fn same_len(op: &'static str, arg: &'static str, len: usize, want: usize) -> Result<()> {
        if len != want {
            return Err(Error::invalid(op, arg, format!("has {len} tensors, expected {want}")));
        }
        Ok(())
    }

    /// Paired tensors of two lists have the same shape.
    pub fn pairwise_shapes(op: &'static str, arg: &'static str, list: &[Tensor], like: &[Tensor]) -> Result<()> {
        for (i, (t, l)) in list.iter().zip(like).enumerate() {
            if t.shape() != l.shape() {
                return Err(Error::invalid(
                    op,
                    arg,
                    format!("tensor {i} has shape {:?}, expected {:?}", t.shape(), l.shape()),
                ));
            }
        }
        Ok(())
    }

    /// `t` holds cumulative sequence lengths: i32, `[batch + 1]`, starting at 0,
    /// non-decreasing, ending at most at `total` (when given). Returns the values.
    pub fn cu_seqlens(op: &'static str, arg: &'static str, t: &Tensor, total: Option<usize>) -> Result<Vec<i32>> {
        cu_seqlens_shape(op, arg, t)?;
        let v = t.to_vec_in_call::<i32>()?;
        if v[0] != 0 {
            return Err(Error::invalid(op, arg, format!("must start at 0, starts at {}", v[0])));
        }
        if let Some(i) = v.windows(2).position(|w| w[1] < w[0]) {
            return Err(Error::invalid(
                op,
                arg,
                format!("not monotone: {} then {} at index {}", v[i], v[i + 1], i + 1),
            ));
        }
        if let Some(total) = total
            && v[v.len() - 1] as usize > total
        {
            return Err(Error::invalid(op, arg, format!("ends at {}, past the {total} rows given", v[v.len() - 1])));
        }
        Ok(v)
    }

    /// `t` can hold cumulative sequence lengths: i32, `[batch + 1]` with batch >= 1 (its values
    /// are not read).
    pub fn cu_seqlens_shape(op: &'static str, arg: &'static str, t: &Tensor) -> Result<()> {
        dtype_is(op, arg, t, DType::I32)?;
        if t.rank() != 1 || t.numel() < 2 {
            return Err(Error::Shape {
                op,
                arg,
                got: t.shape().to_vec(),
                expected: "[batch + 1] with batch >= 1".into(),
            });
        }
        Ok(())
    }

    /// `v` is finite and strictly positive.
    pub fn positive(op: &'static str, arg: &'static str, v: f32) -> Result<()> {
        if v.is_finite() && v > 0.0 {
            return Ok(());
        }
        Err(Error::invalid(op, arg, format!("must be finite and > 0, got {v}")))
    }
}

/// Every op in the catalogue.
pub fn all() -> &'static [&'static OpDescriptor] {
    static ALL: std::sync::OnceLock<Vec<&'static OpDescriptor>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        let mut v = Vec::new();
        v.extend(norm::descriptors());
        v.extend(gemm::descriptors());
        v.extend(activation::descriptors());
        v.extend(softmax::descriptors());
        v.extend(attention::descriptors());
        v.extend(rope::descriptors());
        v.extend(optimizer::descriptors());
        v.extend(quantize::descriptors());
        v.extend(dropout::descriptors());
        v
    })
}

/// The catalogue name closest to a name that is not in it (`rope_fwd` → `fused_rope_forward`),
/// for "did you mean" hints: names are compared by their `_`-separated words, with TE's
/// abbreviations (`fwd`, `bwd`) spelled out; `None` when no word is shared.
pub fn closest(name: &str) -> Option<&'static str> {
    fn words(s: &str) -> Vec<String> {
        s.to_ascii_lowercase()
            .split(['_', '-', ' '])
            .filter(|w| !w.is_empty())
            .map(|w| match w {
                "fwd" => "forward".to_string(),
                "bwd" => "backward".to_string(),
                w => w.to_string(),
            })
            .collect()
    }
    let want = words(name);
    all()
        .iter()
        .map(|d| {
            let have = words(d.name);
            let shared = want.iter().filter(|w| have.contains(w)).count();
            let extra = have.len() + want.len() - 2 * shared;
            (shared, std::cmp::Reverse(extra), std::cmp::Reverse(d.name.len()), d.name)
        })
        .filter(|(shared, ..)| *shared > 0)
        .max()
        .map(|(.., n)| n)
}

/// The catalogue entry named `name`.
pub fn find(name: &str) -> Option<&'static OpDescriptor> {
    all().iter().copied().find(|d| d.name == name)
}

/// The catalogue's ops with the kernel function a complete backend names for each by
/// convention (`ops/norm.rs` → `norm::rmsnorm_fwd`, ...), handed to
/// [`register_backend!`](crate::register_backend) with the backend's header: `floats` ops take
/// f32/f16/bf16 as their primary dtype, `any` ops start with a non-float tensor (FP8 codes,
/// the optimizers' noop flag), `gemms` take the dtypes the header's first list gives (FP8 too for
/// `ops: all + fp8`). Backends use it through `register_backend! { ..; ops: all }`.
#[doc(hidden)]
#[macro_export]
macro_rules! __catalogue_kernels {
    (
        [$($gd:ident),*] { $($ef:ident => $ek:path;)* } { $($eg:ident => $egk:path;)* }
        $($head:tt)*
    ) => {
        $crate::register_backend! {
            $($head)*
            ops: {
            floats {
                $($ef => $ek;)*
                RmsNormFwd => norm::rmsnorm_fwd;
                RmsNormBwd => norm::rmsnorm_bwd;
                RmsNormBwdAdd => norm::rmsnorm_bwd_add;
                LayerNormFwd => norm::layernorm_fwd;
                LayerNormBwd => norm::layernorm_bwd;
                Gelu => activation::gelu;
                Qgelu => activation::qgelu;
                Relu => activation::relu;
                Srelu => activation::srelu;
                Silu => activation::silu;
                Geglu => activation::geglu;
                Qgeglu => activation::qgeglu;
                Reglu => activation::reglu;
                Sreglu => activation::sreglu;
                Swiglu => activation::swiglu;
                ClampedSwiglu => activation::clamped_swiglu;
                DGelu => activation::dgelu;
                DQgelu => activation::dqgelu;
                DRelu => activation::drelu;
                DSrelu => activation::dsrelu;
                DSilu => activation::dsilu;
                DGeglu => activation::dgeglu;
                DQgeglu => activation::dqgeglu;
                DReglu => activation::dreglu;
                DSreglu => activation::dsreglu;
                DSwiglu => activation::dswiglu;
                ClampedDSwiglu => activation::clamped_dswiglu;
                DBiasDGelu => activation::dbias_dgelu;
                DBiasDQgelu => activation::dbias_dqgelu;
                DBiasDRelu => activation::dbias_drelu;
                DBiasDSrelu => activation::dbias_dsrelu;
                DBiasDSilu => activation::dbias_dsilu;
                ScaledSoftmaxForward => softmax::scaled_softmax_forward;
                ScaledMaskedSoftmaxForward => softmax::scaled_masked_softmax_forward;
                ScaledUpperTriangMaskedSoftmaxForward => softmax::scaled_upper_triang_masked_softmax_forward;
                ScaledAlignedCausalMaskedSoftmaxForward => softmax::scaled_aligned_causal_masked_softmax_forward;
                ScaledSoftmaxBackward => softmax::scaled_softmax_backward;
                ScaledMaskedSoftmaxBackward => softmax::scaled_masked_softmax_backward;
                ScaledUpperTriangMaskedSoftmaxBackward => softmax::scaled_upper_triang_masked_softmax_backward;
                ScaledAlignedCausalMaskedSoftmaxBackward => softmax::scaled_aligned_causal_masked_softmax_backward;
                FusedAttnFwd => attention::fused_attn_fwd;
                FusedAttnBwd => attention::fused_attn_bwd;
                FusedRopeForward => rope::fused_rope_forward;
                FusedRopeBackward => rope::fused_rope_backward;
                Quantize => quantize::quantize;
                ComputeAmax => quantize::compute_amax;
                DropoutFwd => dropout::dropout_fwd;
                DropoutBwd => dropout::dropout_bwd;
            }
            any {
                Dequantize => quantize::dequantize;
                Fp8Transpose => quantize::fp8_transpose;
                FusedAmaxAndScaleUpdate => quantize::delayed_scaling;
                MultiTensorScale => optimizer::multi_tensor_scale;
                MultiTensorL2Norm => optimizer::multi_tensor_l2norm;
                MultiTensorUnscaleL2Norm => optimizer::multi_tensor_unscale_l2norm;
                MultiTensorAdam => optimizer::multi_tensor_adam;
                MultiTensorAdamMaster => optimizer::multi_tensor_adam_master;
                MultiTensorSgd => optimizer::multi_tensor_sgd;
                MultiTensorComputeScaleAndScaleInv => optimizer::multi_tensor_compute_scale_and_scale_inv;
            }
            gemms [$($gd),*] {
                GenericGemm => gemm::generic_gemm;
                $($eg => $egk;)*
            }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{Op, OpArgs};

    fn t(shape: &[usize], dtype: DType) -> Tensor {
        let n: usize = shape.iter().product();
        if dtype.is_float() {
            Tensor::from_slice(&vec![1.0f32; n], shape, dtype).unwrap()
        } else {
            Tensor::zeros(shape, dtype, &crate::Device::CPU).unwrap()
        }
    }

    #[test]
    fn every_op_with_tensor_outputs_declares_its_contract() {
        use crate::op::FieldKind;
        for d in all() {
            let tensors = d.outputs.iter().any(|f| f.kind != FieldKind::Scalar);
            assert!(!tensors || d.has_output_contract, "op '{}' has tensor outputs but no output contract", d.name);
        }
        let with = all().iter().filter(|d| d.has_output_contract).count();
        assert!(with >= 48, "only {with} ops declare a contract");
    }

    #[test]
    fn names_are_unique_and_findable() {
        let mut names: Vec<_> = all().iter().map(|d| d.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all().len());
        assert!(find("rmsnorm_fwd").is_some());
        assert!(find("rmsnorm_fwdx").is_none());
    }

    #[test]
    fn validation_names_the_argument() {
        let args = RmsNormFwdArgs {
            x: t(&[3, 8], DType::BF16),
            gamma: t(&[7], DType::BF16),
            eps: 1e-5,
            zero_centered_gamma: false,
            out_dtype: DType::BF16,
            scale: None,
        };
        match RmsNormFwd::validate(&args) {
            Err(Error::Shape { arg: "gamma", .. }) => {}
            other => panic!("{other:?}"),
        }
        let args = RmsNormFwdArgs { gamma: t(&[8], DType::BF16), eps: 0.0, ..args };
        assert!(matches!(RmsNormFwd::validate(&args), Err(Error::InvalidArgument { arg: "eps", .. })));
        let args = RmsNormFwdArgs { eps: 1e-5, x: t(&[3, 8], DType::I32), ..args };
        assert!(matches!(RmsNormFwd::validate(&args), Err(Error::DType { arg: "x", .. })));
    }

    #[test]
    fn rows_may_be_absent_but_a_row_is_never_empty() {
        let norm = |x: &[usize], n: usize| RmsNormFwdArgs {
            x: t(x, DType::F32),
            gamma: t(&[n], DType::F32),
            eps: 1e-5,
            zero_centered_gamma: false,
            out_dtype: DType::F32,
            scale: None,
        };
        RmsNormFwd::validate(&norm(&[0, 8], 8)).unwrap();
        RmsNormFwd::validate(&norm(&[4, 0, 8], 8)).unwrap();
        match RmsNormFwd::validate(&norm(&[4, 0], 0)) {
            Err(Error::Shape { arg: "x", expected, .. }) => assert!(expected.contains("last dimension over 0")),
            other => panic!("{other:?}"),
        }
        Swiglu::validate(&ActArgs { x: t(&[0, 6], DType::F32) }).unwrap();
        assert!(matches!(Gelu::validate(&ActArgs { x: t(&[3, 0], DType::F32) }), Err(Error::Shape { arg: "x", .. })));
        let softmax = |s: &[usize]| ScaledSoftmaxForward::validate(&SoftmaxArgs { x: t(s, DType::F32), scale: 1.0 });
        softmax(&[2, 0, 5, 7]).unwrap();
        assert!(matches!(softmax(&[2, 1, 5, 0]), Err(Error::Shape { arg: "x", .. })));
        assert!(matches!(softmax(&[0]), Err(Error::Shape { arg: "x", .. })));
    }

    #[test]
    fn sequences_may_be_absent_but_heads_are_never_empty() {
        let rope = |x: &[usize]| {
            FusedRopeForward::validate(&RopeArgs {
                x: t(x, DType::BF16),
                freqs: t(&[4, 8], DType::F32),
                cu_seqlens: None,
                start_positions: None,
                layout: QkvLayout::Bshd,
                interleaved: false,
            })
        };
        rope(&[0, 4, 2, 8]).unwrap();
        rope(&[3, 0, 2, 8]).unwrap();
        for bad in [[3, 4, 0, 8], [3, 4, 2, 0]] {
            assert!(matches!(rope(&bad), Err(Error::Shape { arg: "x", .. })), "{bad:?}");
        }
        let attn = |q: &[usize], k: &[usize]| {
            FusedAttnFwd::validate(&AttnFwdArgs {
                q: t(q, DType::BF16),
                k: t(k, DType::BF16),
                v: t(k, DType::BF16),
                cu_seqlens_q: None,
                cu_seqlens_kv: None,
                layout: QkvLayout::Bshd,
                mask: AttnMask::Causal,
                scale: 0.125,
                dropout_p: 0.0,
                seed: 0,
                offset: 0,
                window: AttnWindow::default(),
                max_seqlen_q: None,
                max_seqlen_kv: None,
            })
        };
        attn(&[0, 5, 4, 64], &[0, 7, 2, 64]).unwrap();
        attn(&[2, 0, 4, 64], &[2, 0, 2, 64]).unwrap();
        // Queries over no keys, or no queries over keys: refused, naming k.
        for (q, k) in [([2, 5, 4, 64], [2, 0, 2, 64]), ([2, 0, 4, 64], [2, 7, 2, 64])] {
            match attn(&q, &k) {
                Err(Error::Shape { arg: "k", expected, .. }) => assert!(expected.contains("as q is"), "{expected}"),
                other => panic!("{q:?} {k:?}: {other:?}"),
            }
        }
        assert!(matches!(attn(&[2, 5, 0, 64], &[2, 5, 0, 64]), Err(Error::Shape { arg: "q", .. })));
        assert!(matches!(attn(&[2, 5, 4, 0], &[2, 5, 2, 0]), Err(Error::Shape { arg: "q", .. })));
    }

    #[test]
    fn summary_packs_dtypes_in_order() {
        let args = RmsNormBwdArgs {
            dy: t(&[2, 4], DType::BF16),
            x: t(&[2, 4], DType::F16),
            rsigma: t(&[2], DType::F32),
            gamma: t(&[4], DType::F32),
            zero_centered_gamma: false,
        };
        let s = args.summary("rmsnorm_bwd").unwrap();
        assert_eq!(s.primary, DType::BF16);
        assert_eq!(s.signature, 0x1123);
        assert!(s.device.is_cpu());
    }

    #[test]
    fn host_staging_round_trip_keeps_values() {
        let args = RmsNormBwdArgs {
            dy: t(&[2, 4], DType::BF16),
            x: t(&[2, 4], DType::F16),
            rsigma: t(&[2], DType::F32),
            gamma: t(&[4], DType::F32),
            zero_centered_gamma: true,
        };
        let h = args.to_host().unwrap();
        assert!(h.zero_centered_gamma);
        assert_eq!(h.x.to_vec::<f32>().unwrap(), vec![1.0; 8]);
        args.write_back(&h).unwrap();
    }

    #[test]
    fn thd_rows_past_the_last_sequence_are_told_apart() {
        let geometry = |rows: usize, cu_q: &[i32], cu_k: &[i32]| {
            let q = t(&[rows, 2, 8], DType::F32);
            let cu = |v: &[i32]| Tensor::from_slice(v, [v.len()], DType::I32).unwrap();
            let (cq, ck) = (cu(cu_q), cu(cu_k));
            attn_geometry("t", &q, &q, &q, Some(&cq), Some(&ck), QkvLayout::Thd, AttnMask::PaddingCausal).unwrap()
        };
        // Sequences that end at the last row: nothing past them, queries or keys.
        let g = geometry(10, &[0, 4, 10], &[0, 7, 10]);
        assert!(!g.has_rows_past_sequences(false, 10) && !g.has_rows_past_sequences(true, 10));
        // Queries end two rows early; keys at the end.
        let g = geometry(10, &[0, 4, 8], &[0, 3, 10]);
        assert!(g.has_rows_past_sequences(false, 10) && !g.has_rows_past_sequences(true, 10));
        // Only empty sequences: every row is past them.
        let g = geometry(3, &[0, 0], &[0, 0]);
        assert!(g.has_rows_past_sequences(false, 3) && g.has_rows_past_sequences(true, 3));
        // bshd rows are all positions of a sequence.
        let q = t(&[2, 5, 2, 8], DType::F32);
        let g = attn_geometry("t", &q, &q, &q, None, None, QkvLayout::Bshd, AttnMask::Causal).unwrap();
        assert!(!g.has_rows_past_sequences(false, 10) && !g.has_rows_past_sequences(true, 10));
    }

    #[test]
    fn max_seqlen_bounds_are_checked_where_lengths_are_read() {
        let bounded = |shape: &[usize], layout, mask, cu: Option<&[i32]>, q: Option<usize>, kv: Option<usize>| {
            let x = t(shape, DType::F32);
            let cu = cu.map(|v| Tensor::from_slice(v, [v.len()], DType::I32).unwrap());
            let max = MaxSeqlen { q, kv };
            // Host lengths are read even with both bounds and defer.
            attn_geometry_bounded("t", &x, &x, &x, cu.as_ref(), cu.as_ref(), layout, mask, max, true)
        };
        let named = |r: Result<AttnGeometry>, arg: &str| match r {
            Err(Error::InvalidArgument { arg: a, .. }) => assert_eq!(a, arg),
            other => panic!("{arg}: {other:?}"),
        };
        let thd = [7, 2, 4];
        let cu: &[i32] = &[0, 3, 7];
        let g = bounded(&thd, QkvLayout::Thd, AttnMask::Padding, Some(cu), Some(4), Some(9)).unwrap();
        assert_eq!((g.sq, g.sk, g.spans_on_device), (4, 4, false));
        named(bounded(&thd, QkvLayout::Thd, AttnMask::Padding, Some(cu), Some(4), Some(3)), "max_seqlen_kv");
        named(bounded(&thd, QkvLayout::Thd, AttnMask::Padding, Some(cu), Some(0), None), "max_seqlen_q");
        // bshd: the sequence length is the shape's (padding: the lengths').
        let bshd = [2, 5, 2, 4];
        bounded(&bshd, QkvLayout::Bshd, AttnMask::Causal, None, Some(5), Some(5)).unwrap();
        named(bounded(&bshd, QkvLayout::Bshd, AttnMask::Causal, None, Some(4), None), "max_seqlen_q");
        let lens: &[i32] = &[0, 2, 5];
        bounded(&bshd, QkvLayout::Bshd, AttnMask::Padding, Some(lens), Some(3), Some(3)).unwrap();
        named(bounded(&bshd, QkvLayout::Bshd, AttnMask::Padding, Some(lens), Some(2), None), "max_seqlen_q");
    }
}
