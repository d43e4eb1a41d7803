//! The CUDA backend's ops, registered here under `vendor.nvidia` for every op of the
//! catalogue: GEMM (cuBLASLt), the one-launch grouped GEMM of Hopper and tensor-core attention
//! are CUDA's own (one file each, FlagGems' `ops/`); the SIMT families are the shared host code of `tefl_gpu::simt`, launched through
//! this crate's [`GpuTarget`](tefl_gpu::target::GpuTarget) (`launch.rs`).

pub mod attention;
pub mod attention_sm90;
pub mod gemm;
pub mod grouped_gemm;
pub mod portable;

pub use tefl_gpu::simt::{activation, dropout, norm, optimizer, quantize, rope, softmax};

use tefl_core::catalogue::*;

// Every op of the catalogue, each served by `<family>::<op>` of the modules above.
tefl_core::register_backend! {
    impl_id: crate::IMPL_ID, kind: Vendor, vendor: crate::vendor::VENDOR, device: tefl_core::DeviceKind::CUDA,
    available: crate::kernels_available, ops: all + fp8
}

// What the first calls of the attention, Adam, norm-forward, RoPE and activation kernels would
// compile, started ahead on request (`tefl_core::Manager::warmup`); a forward's warm-up also
// starts its backward's.
tefl_core::register_warmup!(crate::IMPL_ID,
    FusedAttnFwd => attention::warmup_fwd,
    FusedAttnBwd => attention::warmup_bwd,
    MultiTensorAdam => optimizer::warmup_adam,
    MultiTensorAdamMaster => optimizer::warmup_adam_master,
    RmsNormFwd => norm::warmup_rmsnorm_fwd,
    LayerNormFwd => norm::warmup_layernorm_fwd,
    FusedRopeForward => rope::warmup_rope_forward,
    FusedRopeBackward => rope::warmup_rope_backward,
    Gelu => activation::warmup_gelu,
    Qgelu => activation::warmup_qgelu,
    Relu => activation::warmup_relu,
    Srelu => activation::warmup_srelu,
    Silu => activation::warmup_silu,
    Geglu => activation::warmup_geglu,
    Qgeglu => activation::warmup_qgeglu,
    Reglu => activation::warmup_reglu,
    Sreglu => activation::warmup_sreglu,
    Swiglu => activation::warmup_swiglu,
    ClampedSwiglu => activation::warmup_clamped_swiglu,
);
