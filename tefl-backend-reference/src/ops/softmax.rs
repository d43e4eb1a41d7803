//! The fused softmax variants on the CPU (rayon over rows).

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::{KernelCtx, Result, Tensor};

use crate::util::{store, view};

/// Softmax of `scale·x` over one row, skipping masked entries; an all-masked row gives zeros.
fn row_softmax(x: &[f32], y: &mut [f32], scale: f32, masked: impl Fn(usize) -> bool) {
    let mut max = f32::NEG_INFINITY;
    for (j, v) in x.iter().enumerate() {
        if !masked(j) {
            max = max.max(v * scale);
        }
    }
    if max == f32::NEG_INFINITY {
        y.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let mut sum = 0.0f32;
    for (j, (o, v)) in y.iter_mut().zip(x).enumerate() {
        *o = if masked(j) { 0.0 } else { (v * scale - max).exp() };
        sum += *o;
    }
    let inv = 1.0 / sum;
    y.iter_mut().for_each(|v| *v *= inv);
}

fn run(x: &Tensor, scale: f32, masked: impl Fn(usize, usize, usize) -> bool + Sync) -> Result<SoftmaxOut> {
    let s = x.shape();
    let (sq, sk) = (s[s.len() - 2], s[s.len() - 1]);
    let xv = view(x)?;
    let mut y = vec![0.0f32; xv.len()];
    y.par_chunks_mut(sk).zip(xv.par_chunks(sk)).enumerate().for_each(|(r, (yr, xr))| {
        let i = r % sq;
        row_softmax(xr, yr, scale, |j| masked(r, i, j));
    });
    Ok(SoftmaxOut { y: store(&y, s, x.dtype())? })
}

pub fn scaled_softmax_forward(_: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    run(&a.x, a.scale, |_, _, _| false)
}

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

pub fn scaled_upper_triang_masked_softmax_forward(_: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    run(&a.x, a.scale, |_, i, j| j > i)
}

pub fn scaled_aligned_causal_masked_softmax_forward(_: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    let s = a.x.shape();
    let (sq, sk) = (s[s.len() - 2] as i64, s[s.len() - 1] as i64);
    run(&a.x, a.scale, move |_, i, j| j as i64 > i as i64 + sk - sq)
}

fn backward(a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    let sk = a.y.last_dim();
    let (dy, y) = (view(&a.dy)?, view(&a.y)?);
    let mut dx = vec![0.0f32; y.len()];
    dx.par_chunks_mut(sk).zip(dy.par_chunks(sk).zip(y.par_chunks(sk))).for_each(|(o, (dr, yr))| {
        let dot: f32 = dr.iter().zip(yr).map(|(d, y)| d * y).sum();
        for ((x, d), yv) in o.iter_mut().zip(dr).zip(yr) {
            *x = a.scale * yv * (d - dot);
        }
    });
    Ok(SoftmaxBwdOut { dx: store(&dx, a.y.shape(), a.y.dtype())? })
}

pub fn scaled_softmax_backward(_: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward(a)
}
pub fn scaled_masked_softmax_backward(_: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward(a)
}
pub fn scaled_upper_triang_masked_softmax_backward(_: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward(a)
}
pub fn scaled_aligned_causal_masked_softmax_backward(_: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward(a)
}
