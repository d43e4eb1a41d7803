//! The Vulkan backend's ops, registered as `default.vulkan` (kind default: the routing tokens
//! `flagos` and `default` select it): every op of the catalogue (docs/coverage.md).

pub mod activation;
pub mod attention;
pub mod dropout;
pub mod fp8;
pub mod gemm;
pub mod norm;
pub mod optimizer;
pub mod rope;
pub mod softmax;

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, Result, Tensor};

use crate::gpu::Binding;

/// The most workgroups one dispatch asks for along a dimension (the Vulkan minimum of
/// `maxComputeWorkGroupCount`); the shaders stride over the rest.
pub(crate) const MAX_GROUPS: u32 = 65535;

/// The dtype code of `shaders/common.wgsl` (0 f32, 1 f16, 2 bf16), or a typed error naming
/// the argument.
pub(crate) fn dtype_code(op: &'static str, arg: &'static str, d: DType) -> Result<u32> {
    Ok(match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        other => return Err(Error::DType { op, arg, got: other, expected: "f32, f16 or bf16".into() }),
    })
}

/// A tensor's buffer as a dispatch binding (a typed error when the tensor is not in Vulkan
/// memory).
pub(crate) fn binding(t: &Tensor) -> Result<Binding> {
    crate::runtime::global().buffer(t.buffer().as_ref()).map(|b| b.binding())
}

/// The name a shader variant uses for a 16-bit float dtype, `None` for any other (the 16-byte
/// `*_vec` shaders and the cooperative-matrix GEMM take only these).
pub(crate) fn half_name(d: DType) -> Option<&'static str> {
    match d {
        DType::F16 => Some("f16"),
        DType::BF16 => Some("bf16"),
        _ => None,
    }
}

/// The name a shader variant uses for a dtype (`activation.tx=bf16...`).
pub(crate) fn dtype_name(op: &'static str, arg: &'static str, d: DType) -> Result<&'static str> {
    Ok(["f32", "f16", "bf16"][dtype_code(op, arg, d)? as usize])
}

tefl_core::register_backend! {
    impl_id: crate::IMPL_ID, kind: Default, vendor: crate::vendor::VENDOR, device: tefl_core::DeviceKind::VULKAN,
    available: crate::availability,
    ops: {
        floats {
            RmsNormFwd => norm::rmsnorm_fwd; RmsNormBwd => norm::rmsnorm_bwd; RmsNormBwdAdd => norm::rmsnorm_bwd_add;
            LayerNormFwd => norm::layernorm_fwd; LayerNormBwd => norm::layernorm_bwd;
            FusedRopeForward => rope::fused_rope_forward; FusedRopeBackward => rope::fused_rope_backward;
            DropoutFwd => dropout::dropout_fwd; DropoutBwd => dropout::dropout_bwd;
            Quantize => fp8::quantize; ComputeAmax => fp8::compute_amax; BgradQuantize => fp8::bgrad_quantize;
            FusedAttnFwd => attention::fused_attn_fwd; FusedAttnBwd => attention::fused_attn_bwd;
            Gelu => activation::gelu; DGelu => activation::dgelu;
            Qgelu => activation::qgelu; DQgelu => activation::dqgelu;
            Relu => activation::relu; DRelu => activation::drelu;
            Srelu => activation::srelu; DSrelu => activation::dsrelu;
            Silu => activation::silu; DSilu => activation::dsilu;
            Geglu => activation::geglu; DGeglu => activation::dgeglu;
            Qgeglu => activation::qgeglu; DQgeglu => activation::dqgeglu;
            Reglu => activation::reglu; DReglu => activation::dreglu;
            Sreglu => activation::sreglu; DSreglu => activation::dsreglu;
            Swiglu => activation::swiglu; DSwiglu => activation::dswiglu;
            ClampedSwiglu => activation::clamped_swiglu; ClampedDSwiglu => activation::clamped_dswiglu;
            DBiasDGelu => activation::dbias_dgelu; DBiasDQgelu => activation::dbias_dqgelu;
            DBiasDRelu => activation::dbias_drelu; DBiasDSrelu => activation::dbias_dsrelu;
            DBiasDSilu => activation::dbias_dsilu;
            ScaledSoftmaxForward => softmax::scaled_softmax_forward;
            ScaledMaskedSoftmaxForward => softmax::scaled_masked_softmax_forward;
            ScaledUpperTriangMaskedSoftmaxForward => softmax::scaled_upper_triang_masked_softmax_forward;
            ScaledAlignedCausalMaskedSoftmaxForward => softmax::scaled_aligned_causal_masked_softmax_forward;
            ScaledSoftmaxBackward => softmax::scaled_softmax_backward;
            ScaledMaskedSoftmaxBackward => softmax::scaled_masked_softmax_backward;
            ScaledUpperTriangMaskedSoftmaxBackward => softmax::scaled_upper_triang_masked_softmax_backward;
            ScaledAlignedCausalMaskedSoftmaxBackward => softmax::scaled_aligned_causal_masked_softmax_backward;
        }
        any {
            Dequantize => fp8::dequantize; Fp8Transpose => fp8::fp8_transpose;
            FusedAmaxAndScaleUpdate => fp8::delayed_scaling;
            MultiTensorScale => optimizer::multi_tensor_scale;
            MultiTensorL2Norm => optimizer::multi_tensor_l2norm;
            MultiTensorUnscaleL2Norm => optimizer::multi_tensor_unscale_l2norm;
            MultiTensorAdam => optimizer::multi_tensor_adam;
            MultiTensorAdamMaster => optimizer::multi_tensor_adam_master;
            MultiTensorSgd => optimizer::multi_tensor_sgd;
            MultiTensorComputeScaleAndScaleInv => optimizer::multi_tensor_compute_scale_and_scale_inv;
        }
        gemms [F32, F16, BF16, F8E4M3, F8E5M2] {
            GenericGemm => gemm::generic_gemm; GroupedGemm => gemm::grouped_gemm;
        }
    }
}
