//! Fused softmax entry points.

use tefl_core::Tensor;
use tefl_core::catalogue::*;

use crate::call::Call;

/// `scaled_softmax_forward(x, scale)` over the last dim of `[.., sq, sk]`.
pub fn scaled_softmax_forward(x: &Tensor, scale: f32) -> Call<ScaledSoftmaxForward> {
    Call::new(SoftmaxArgs { x: x.clone(), scale })
}

/// `scaled_masked_softmax_forward(x, mask, scale)`: mask u8/bool `[b or 1, 1, sq, sk]`, 1 = masked.
pub fn scaled_masked_softmax_forward(x: &Tensor, mask: &Tensor, scale: f32) -> Call<ScaledMaskedSoftmaxForward> {
    Call::new(MaskedSoftmaxArgs { x: x.clone(), mask: mask.clone(), scale })
}

/// `scaled_upper_triang_masked_softmax_forward(x, scale)`: causal (j > i masked).
pub fn scaled_upper_triang_masked_softmax_forward(
    x: &Tensor,
    scale: f32,
) -> Call<ScaledUpperTriangMaskedSoftmaxForward> {
    Call::new(SoftmaxArgs { x: x.clone(), scale })
}

/// `scaled_aligned_causal_masked_softmax_forward(x, scale)`: bottom-right causal.
pub fn scaled_aligned_causal_masked_softmax_forward(
    x: &Tensor,
    scale: f32,
) -> Call<ScaledAlignedCausalMaskedSoftmaxForward> {
    Call::new(SoftmaxArgs { x: x.clone(), scale })
}

macro_rules! backward {
    ($( $f:ident => $op:ident; )*) => {
        $(
            #[doc = concat!("`", stringify!($f), "(dy, y, scale)`: dx = scale·y·(dy − Σ dy·y).")]
            pub fn $f(dy: &Tensor, y: &Tensor, scale: f32) -> Call<$op> {
                Call::new(SoftmaxBwdArgs { dy: dy.clone(), y: y.clone(), scale })
            }
        )*
    };
}

backward! {
    scaled_softmax_backward => ScaledSoftmaxBackward;
    scaled_masked_softmax_backward => ScaledMaskedSoftmaxBackward;
    scaled_upper_triang_masked_softmax_backward => ScaledUpperTriangMaskedSoftmaxBackward;
    scaled_aligned_causal_masked_softmax_backward => ScaledAlignedCausalMaskedSoftmaxBackward;
}
