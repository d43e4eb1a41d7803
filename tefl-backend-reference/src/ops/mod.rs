//! The reference kernels, one file per op family, and their registrations.

pub mod activation;
pub mod attention;
pub mod dropout;
pub mod gemm;
pub mod norm;
pub mod optimizer;
pub mod quantize;
pub mod rope;
pub mod softmax;

use tefl_core::catalogue::*;

/// Registers `reference.cpu` for each op: float ops accept f32/f16/bf16 as their primary
/// dtype; ops whose first tensor is not a float (FP8 codes, the optimizers' noop flag) accept any.
macro_rules! reference {
    (floats { $($fop:ident => $fk:path;)* } any { $($aop:ident => $ak:path;)* }) => {
        $(
            tefl_core::register_impl! {
                op: $fop, impl_id: crate::IMPL_ID, kind: Reference, priority: 0,
                device: tefl_core::DeviceKind::CPU, dtypes: [F32, F16, BF16], kernel: $fk,
            }
        )*
        $(
            tefl_core::register_impl! {
                op: $aop, impl_id: crate::IMPL_ID, kind: Reference, priority: 0,
                device: tefl_core::DeviceKind::CPU, dtypes: [], kernel: $ak,
            }
        )*
        /// The ops this backend registers, by name.
        pub const OPS: &[&str] = &[$(<$fop as tefl_core::Op>::NAME,)* $(<$aop as tefl_core::Op>::NAME,)*];
    };
}

reference! {
    floats {
    RmsNormFwd => norm::rmsnorm_fwd;
    RmsNormBwd => norm::rmsnorm_bwd;
    RmsNormBwdAdd => norm::rmsnorm_bwd_add;
    LayerNormFwd => norm::layernorm_fwd;
    LayerNormBwd => norm::layernorm_bwd;
    GenericGemm => gemm::generic_gemm;
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
}
