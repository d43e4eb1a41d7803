//! Activations, their backward forms and the dbias forms (f32 math, rayon over chunks/rows).

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::{KernelCtx, Result};

use crate::util::{CHUNK, store, view};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// act(x).
pub fn act(kind: Activation, x: f32) -> f32 {
    match kind {
        Activation::Gelu => 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh()),
        Activation::Qgelu => x * sigmoid(1.702 * x),
        Activation::Relu => x.max(0.0),
        Activation::Srelu => {
            let r = x.max(0.0);
            r * r
        }
        Activation::Silu => x * sigmoid(x),
    }
}

/// act'(x).
pub fn dact(kind: Activation, x: f32) -> f32 {
    match kind {
        Activation::Gelu => {
            let inner = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
            let t = inner.tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x)
        }
        Activation::Qgelu => {
            let s = sigmoid(1.702 * x);
            s + 1.702 * x * s * (1.0 - s)
        }
        Activation::Relu => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Activation::Srelu => 2.0 * x.max(0.0),
        Activation::Silu => {
            let s = sigmoid(x);
            s + x * s * (1.0 - s)
        }
    }
}

fn elementwise(a: &ActArgs, kind: Activation) -> Result<ActOut> {
    let x = view(&a.x)?;
    let mut y = vec![0.0f32; x.len()];
    y.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(o, i)| {
        for (d, v) in o.iter_mut().zip(i) {
            *d = act(kind, *v);
        }
    });
    Ok(ActOut { y: store(&y, a.x.shape(), a.x.dtype())? })
}

fn gated(a: &ActArgs, kind: Activation) -> Result<ActOut> {
    let n2 = a.x.last_dim();
    let n = n2 / 2;
    let x = view(&a.x)?;
    let mut y = vec![0.0f32; x.len() / 2];
    y.par_chunks_mut(n).zip(x.par_chunks(n2)).for_each(|(o, i)| {
        for j in 0..n {
            o[j] = act(kind, i[j]) * i[n + j];
        }
    });
    let mut shape = a.x.shape().to_vec();
    *shape.last_mut().unwrap_or(&mut 0) = n;
    Ok(ActOut { y: store(&y, &shape, a.x.dtype())? })
}

fn d_elementwise(a: &DActArgs, kind: Activation) -> Result<Vec<f32>> {
    let (g, x) = (view(&a.grad)?, view(&a.input)?);
    let mut dx = vec![0.0f32; x.len()];
    dx.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK).zip(g.par_chunks(CHUNK))).for_each(|(o, (xi, gi))| {
        for ((d, xv), gv) in o.iter_mut().zip(xi).zip(gi) {
            *d = gv * dact(kind, *xv);
        }
    });
    Ok(dx)
}

fn d_gated(a: &DActArgs, kind: Activation) -> Result<DActOut> {
    let n2 = a.input.last_dim();
    let n = n2 / 2;
    let (g, x) = (view(&a.grad)?, view(&a.input)?);
    let mut dx = vec![0.0f32; x.len()];
    dx.par_chunks_mut(n2).zip(x.par_chunks(n2).zip(g.par_chunks(n))).for_each(|(o, (xi, gi))| {
        for j in 0..n {
            let (av, bv) = (xi[j], xi[n + j]);
            o[j] = gi[j] * bv * dact(kind, av);
            o[n + j] = gi[j] * act(kind, av);
        }
    });
    Ok(DActOut { grad_input: store(&dx, a.input.shape(), a.input.dtype())? })
}

fn dbias(a: &DActArgs, kind: Activation) -> Result<DBiasOut> {
    let n = a.input.last_dim();
    let dx = d_elementwise(a, kind)?;
    let db = dx
        .par_chunks(n)
        .fold(
            || vec![0.0f32; n],
            |mut acc, row| {
                acc.iter_mut().zip(row).for_each(|(s, v)| *s += v);
                acc
            },
        )
        .reduce(
            || vec![0.0f32; n],
            |mut x, y| {
                x.iter_mut().zip(&y).for_each(|(s, v)| *s += v);
                x
            },
        );
    Ok(DBiasOut {
        dbias: store(&db, &[n], a.input.dtype())?,
        grad_input: store(&dx, a.input.shape(), a.input.dtype())?,
    })
}

macro_rules! kernels {
    ($( $fwd:ident, $bwd:ident, $dbias:ident => $kind:ident; )*) => {
        $(
            pub fn $fwd(_: &KernelCtx<'_>, a: &ActArgs) -> Result<ActOut> {
                elementwise(a, Activation::$kind)
            }
            pub fn $bwd(_: &KernelCtx<'_>, a: &DActArgs) -> Result<DActOut> {
                Ok(DActOut { grad_input: store(&d_elementwise(a, Activation::$kind)?, a.input.shape(), a.input.dtype())? })
            }
            pub fn $dbias(_: &KernelCtx<'_>, a: &DActArgs) -> Result<DBiasOut> {
                dbias(a, Activation::$kind)
            }
        )*
    };
}

kernels! {
    gelu, dgelu, dbias_dgelu => Gelu;
    qgelu, dqgelu, dbias_dqgelu => Qgelu;
    relu, drelu, dbias_drelu => Relu;
    srelu, dsrelu, dbias_dsrelu => Srelu;
    silu, dsilu, dbias_dsilu => Silu;
}

macro_rules! gated_kernels {
    ($( $fwd:ident, $bwd:ident => $kind:ident; )*) => {
        $(
            pub fn $fwd(_: &KernelCtx<'_>, a: &ActArgs) -> Result<ActOut> {
                gated(a, Activation::$kind)
            }
            pub fn $bwd(_: &KernelCtx<'_>, a: &DActArgs) -> Result<DActOut> {
                d_gated(a, Activation::$kind)
            }
        )*
    };
}

gated_kernels! {
    geglu, dgeglu => Gelu;
    qgeglu, dqgeglu => Qgelu;
    reglu, dreglu => Relu;
    sreglu, dsreglu => Srelu;
    swiglu, dswiglu => Silu;
}

pub fn clamped_swiglu(_: &KernelCtx<'_>, a: &ClampedSwigluArgs) -> Result<ActOut> {
    let n2 = a.x.last_dim();
    let n = n2 / 2;
    let x = view(&a.x)?;
    let mut y = vec![0.0f32; x.len() / 2];
    y.par_chunks_mut(n).zip(x.par_chunks(n2)).for_each(|(o, i)| {
        for j in 0..n {
            let av = i[j].min(a.limit);
            let bv = i[n + j].clamp(-a.limit, a.limit);
            o[j] = av * sigmoid(a.alpha * av) * (bv + 1.0);
        }
    });
    let mut shape = a.x.shape().to_vec();
    if let Some(l) = shape.last_mut() {
        *l = n;
    }
    Ok(ActOut { y: store(&y, &shape, a.x.dtype())? })
}

pub fn clamped_dswiglu(_: &KernelCtx<'_>, a: &ClampedDSwigluArgs) -> Result<DActOut> {
    let n2 = a.input.last_dim();
    let n = n2 / 2;
    let (g, x) = (view(&a.grad)?, view(&a.input)?);
    let mut dx = vec![0.0f32; x.len()];
    dx.par_chunks_mut(n2).zip(x.par_chunks(n2).zip(g.par_chunks(n))).for_each(|(o, (xi, gi))| {
        for j in 0..n {
            let (ar, br) = (xi[j], xi[n + j]);
            let av = ar.min(a.limit);
            let bv = br.clamp(-a.limit, a.limit);
            let s = sigmoid(a.alpha * av);
            let da = if ar < a.limit { s + a.alpha * av * s * (1.0 - s) } else { 0.0 };
            let db = if (-a.limit..=a.limit).contains(&br) { 1.0 } else { 0.0 };
            o[j] = gi[j] * (bv + 1.0) * da;
            o[n + j] = gi[j] * av * s * db;
        }
    });
    Ok(DActOut { grad_input: store(&dx, a.input.shape(), a.input.dtype())? })
}
