//! The HIP backend's ops, registered under `vendor.amd`: the SIMT families are the shared
//! host code of `tefl_gpu::simt` (the same launch plans as CUDA's), compiled by hiprtc from the
//! `tefl-kernels` sources and launched through this crate's `GpuTarget` (`launch.rs`).
//! GEMM is the portable tiled kernel with the shared epilogue (hipBLASLt is not bound yet).
//! Attention's forward is the portable flash-attention kernel; its backward is not written yet:
//! the manager serves it from the next impl (the reference, staged through the host), and
//! `cargo xtask coverage` shows the gap.

pub use tefl_gpu::simt::{activation, attention, dropout, gemm, norm, optimizer, quantize, rope, softmax};

use tefl_core::catalogue::*;

tefl_core::register_backend! {
    impl_id: crate::IMPL_ID, kind: Vendor, vendor: crate::vendor::VENDOR, device: tefl_core::DeviceKind::HIP,
    available: crate::kernels_available,
    ops: {
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
}
