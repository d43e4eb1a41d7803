//! Fused attention and RoPE entry points.

use tefl_core::Tensor;
use tefl_core::catalogue::*;

use crate::call::{Call, setters};

fn default_scale(q: &Tensor) -> f32 {
    1.0 / (q.last_dim().max(1) as f32).sqrt()
}

/// `fused_attn_fwd(q, k, v)`: bshd layout, no mask, scale 1/√d, no dropout, unless set.
///
/// ```no_run
/// # use tefl_core::{DType, Tensor, Device, catalogue::{AttnMask, QkvLayout}};
/// # let q = Tensor::zeros([2, 128, 8, 64], DType::BF16, &Device::CPU)?;
/// # let kv = Tensor::zeros([2, 128, 2, 64], DType::BF16, &Device::CPU)?;
/// let out = tefl_ops::fused_attn_fwd(&q, &kv, &kv).mask(AttnMask::Causal).call()?;
/// let (o, lse) = (out.o, out.softmax_lse);
/// # Ok::<(), tefl_core::Error>(())
/// ```
pub fn fused_attn_fwd(q: &Tensor, k: &Tensor, v: &Tensor) -> Call<FusedAttnFwd> {
    Call::new(AttnFwdArgs {
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        cu_seqlens_q: None,
        cu_seqlens_kv: None,
        layout: QkvLayout::Bshd,
        mask: AttnMask::None,
        scale: default_scale(q),
        dropout_p: 0.0,
        seed: 0,
        offset: 0,
        window: AttnWindow::default(),
        max_seqlen_q: None,
        max_seqlen_kv: None,
    })
}
setters!(FusedAttnFwd {
    /// The layout.
    layout: QkvLayout,
    /// The mask.
    mask: AttnMask,
    /// The score scale.
    scale: f32,
    /// The sliding window.
    window: AttnWindow,
});

/// `fused_attn_bwd(q, k, v, o, d_o, softmax_lse)` with the same options as the forward.
pub fn fused_attn_bwd(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    d_o: &Tensor,
    softmax_lse: &Tensor,
) -> Call<FusedAttnBwd> {
    Call::new(AttnBwdArgs {
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        o: o.clone(),
        d_o: d_o.clone(),
        softmax_lse: softmax_lse.clone(),
        cu_seqlens_q: None,
        cu_seqlens_kv: None,
        layout: QkvLayout::Bshd,
        mask: AttnMask::None,
        scale: default_scale(q),
        dropout_p: 0.0,
        seed: 0,
        offset: 0,
        window: AttnWindow::default(),
        max_seqlen_q: None,
        max_seqlen_kv: None,
        deterministic: false,
    })
}
setters!(FusedAttnBwd {
    /// The layout.
    layout: QkvLayout,
    /// The mask.
    mask: AttnMask,
    /// The score scale.
    scale: f32,
    /// The sliding window.
    window: AttnWindow,
    /// Whether dq must be the same bits on every repetition (see
    /// [`AttnBwdArgs::deterministic`](tefl_core::catalogue::AttnBwdArgs::deterministic)).
    deterministic: bool,
});

macro_rules! attn_common {
    ($op:ty) => {
        impl Call<$op> {
            /// Dropout on the attention weights with probability `p`, Philox (seed, offset).
            pub fn dropout(mut self, p: f32, seed: u64, offset: u64) -> Self {
                let a = self.args_mut();
                a.dropout_p = p;
                a.seed = seed;
                a.offset = offset;
                self
            }
            /// Cumulative sequence lengths (i32 `[b + 1]`) of queries and keys: needed by thd and
            /// the padding masks.
            pub fn cu_seqlens(mut self, q: &Tensor, kv: &Tensor) -> Self {
                let a = self.args_mut();
                a.cu_seqlens_q = Some(q.clone());
                a.cu_seqlens_kv = Some(kv.clone());
                self
            }
            /// TE's `max_seqlen_q` and `max_seqlen_kv`: bounds on the query and key sequence
            /// lengths. With both, a thd call whose cu_seqlens are on a GPU does not wait for
            /// the device to read them (see
            /// [`attn_geometry_bounded`](tefl_core::catalogue::attn_geometry_bounded)); where
            /// the op's validation reads the lengths, one past its bound is an error.
            pub fn max_seqlen(mut self, q: usize, kv: usize) -> Self {
                let a = self.args_mut();
                a.max_seqlen_q = Some(q);
                a.max_seqlen_kv = Some(kv);
                self
            }
        }
    };
}
attn_common!(FusedAttnFwd);
attn_common!(FusedAttnBwd);

fn rope_args(x: &Tensor, freqs: &Tensor) -> RopeArgs {
    RopeArgs {
        x: x.clone(),
        freqs: freqs.clone(),
        cu_seqlens: None,
        start_positions: None,
        layout: QkvLayout::Sbhd,
        interleaved: false,
    }
}

/// `fused_rope_forward(x, freqs)`: sbhd layout, rotating halves, unless set.
pub fn fused_rope_forward(x: &Tensor, freqs: &Tensor) -> Call<FusedRopeForward> {
    Call::new(rope_args(x, freqs))
}

/// `fused_rope_backward(dy, freqs)`: the transpose (inverse) rotation of the gradient.
pub fn fused_rope_backward(dy: &Tensor, freqs: &Tensor) -> Call<FusedRopeBackward> {
    Call::new(rope_args(dy, freqs))
}

macro_rules! rope_common {
    ($op:ty) => {
        setters!($op {
            /// The layout (sbhd, bshd or thd).
            layout: QkvLayout,
            /// Rotate pairs (x₂ᵢ, x₂ᵢ₊₁) instead of halves.
            interleaved: bool,
        });
        impl Call<$op> {
            /// Cumulative sequence lengths (thd).
            pub fn cu_seqlens(mut self, cu: &Tensor) -> Self {
                self.args_mut().cu_seqlens = Some(cu.clone());
                self
            }
            /// Position of each sequence's first token (i32 `[b]`).
            pub fn start_positions(mut self, starts: &Tensor) -> Self {
                self.args_mut().start_positions = Some(starts.clone());
                self
            }
        }
    };
}
rope_common!(FusedRopeForward);
rope_common!(FusedRopeBackward);
