//! The fused softmax variants on the CPU (rayon over rows).

use tefl_core::catalogue::*;
use tefl_core::{KernelCtx, Result, Tensor};

use crate::kernels::vmath;
use crate::util::map_rows;

/// Softmax of `scale·x` over one row, skipping masked entries; an all-masked row gives zeros.
fn row_softmax(x: &[f32], y: &mut [f32], scale: f32, masked: impl Fn(usize) -> bool) {
    // The scaled row with masked entries at -inf, and its NaN-propagating maximum: a visible
    // NaN makes the row NaN (masked entries stay 0).
    for (j, (o, v)) in y.iter_mut().zip(x).enumerate() {
        *o = if masked(j) { f32::NEG_INFINITY } else { v * scale };
    }
    let max = vmath::max_nan(y);
    if max == f32::NEG_INFINITY {
        y.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    // exp(s - max), 0 at -inf (masked, or a visible -inf score: e^-inf = 0 alike); max is
    // finite or +inf here, so the sum is at least 1 (the maximum's own term) or NaN (inf - inf).
    let sum = if max.is_nan() { f32::NAN } else { vmath::exp_shifted(y, max) };
    if sum.is_nan() {
        // A visible NaN, or +inf scores: every visible entry NaN, as their sum makes them.
        for (j, o) in y.iter_mut().enumerate() {
            *o = if masked(j) { 0.0 } else { f32::NAN };
        }
        return;
    }
    vmath::scale(y, 1.0 / sum);
}

fn run(x: &Tensor, scale: f32, masked: impl Fn(usize, usize, usize) -> bool + Sync) -> Result<SoftmaxOut> {
    let s = x.shape();
    let (sq, sk) = (s[s.len() - 2], s[s.len() - 1]);
    let (y, _) = map_rows([(x, sk)], x.rows(), s, x.dtype(), sk, |r, [xr], yr| {
        let i = r % sq;
        row_softmax(xr, yr, scale, |j| masked(r, i, j));
        [0.0; 2]
    })?;
    Ok(SoftmaxOut { y })
}

/// The catalogue op `scaled_softmax_forward` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn scaled_softmax_forward(_: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    run(&a.x, a.scale, |_, _, _| false)
}

/// The catalogue op `scaled_masked_softmax_forward` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn scaled_masked_softmax_forward(_: &KernelCtx<'_>, a: &MaskedSoftmaxArgs) -> Result<SoftmaxOut> {
    let s = a.x.shape();
    let (h, sq, sk) = (s[1], s[2], s[3]);
    let mb = a.mask.shape()[0];
    let mask = a.mask.host_bytes()?;
    run(&a.x, a.scale, |r, i, j| {
        let b = if mb == 1 { 0 } else { r / (h * sq) };
        mask[(b * sq + i) * sk + j] != 0
    })
}

/// The catalogue op `scaled_upper_triang_masked_softmax_forward` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn scaled_upper_triang_masked_softmax_forward(_: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    run(&a.x, a.scale, |_, i, j| j > i)
}

/// The catalogue op `scaled_aligned_causal_masked_softmax_forward` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn scaled_aligned_causal_masked_softmax_forward(_: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    let s = a.x.shape();
    let (sq, sk) = (s[s.len() - 2] as i64, s[s.len() - 1] as i64);
    run(&a.x, a.scale, move |_, i, j| j as i64 > i as i64 + sk - sq)
}

fn backward(a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    let sk = a.y.last_dim();
    let (dx, _) = map_rows([(&a.dy, sk), (&a.y, sk)], a.y.rows(), a.y.shape(), a.y.dtype(), sk, |_, [dr, yr], o| {
        let dot = vmath::dot(dr, yr);
        let scale = a.scale;
        vmath::map([dr, yr], o, |[d, y]| scale * y * (d - dot));
        [0.0; 2]
    })?;
    Ok(SoftmaxBwdOut { dx })
}

/// The catalogue op `scaled_softmax_backward` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn scaled_softmax_backward(_: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward(a)
}
/// The catalogue op `scaled_masked_softmax_backward` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn scaled_masked_softmax_backward(_: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward(a)
}
/// The catalogue op `scaled_upper_triang_masked_softmax_backward` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn scaled_upper_triang_masked_softmax_backward(_: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward(a)
}
/// The catalogue op `scaled_aligned_causal_masked_softmax_backward` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn scaled_aligned_causal_masked_softmax_backward(_: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward(a)
}
