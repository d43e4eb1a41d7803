//! Activations, their backward forms and the dbias forms (f32 math, rayon over chunks/rows).

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::{KernelCtx, Result};

use crate::util::{CHUNK, build_f32, map_rows, row_major_column_sums, store, view};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// max(x, 0), NaN for NaN (`f32::max` would give 0: NaN must propagate).
fn relu_keep_nan(x: f32) -> f32 {
    if x.is_nan() { x } else { x.max(0.0) }
}

/// act(x).
pub fn act(kind: Activation, x: f32) -> f32 {
    match kind {
        Activation::Gelu => 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh()),
        Activation::Qgelu => x * sigmoid(1.702 * x),
        Activation::Relu => relu_keep_nan(x),
        Activation::Srelu => {
            let r = relu_keep_nan(x);
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
            } else if x.is_nan() {
                x
            } else {
                0.0
            }
        }
        Activation::Srelu => 2.0 * relu_keep_nan(x),
        Activation::Silu => {
            let s = sigmoid(x);
            s + x * s * (1.0 - s)
        }
    }
}

fn elementwise(a: &ActArgs, kind: Activation) -> Result<ActOut> {
    let n = a.x.last_dim();
    let (y, _) = map_rows([(&a.x, n)], a.x.rows(), a.x.shape(), a.x.dtype(), n, |_, [xr], yr| {
        yr.iter_mut().zip(xr).for_each(|(o, v)| *o = act(kind, *v));
        [0.0; 2]
    })?;
    Ok(ActOut { y })
}

fn half_shape(t: &tefl_core::Tensor) -> Vec<usize> {
    let mut shape = t.shape().to_vec();
    if let Some(l) = shape.last_mut() {
        *l /= 2;
    }
    shape
}

/// A gated forward on `[.., 2N]` = [a | b]: out = f(a, b), `[.., N]`.
fn gated_map(x: &tefl_core::Tensor, f: impl Fn(f32, f32) -> f32 + Sync + Send) -> Result<ActOut> {
    let n = x.last_dim() / 2;
    let (y, _) = map_rows([(x, 2 * n)], x.rows(), &half_shape(x), x.dtype(), n, |_, [xr], yr| {
        for j in 0..n {
            yr[j] = f(xr[j], xr[n + j]);
        }
        [0.0; 2]
    })?;
    Ok(ActOut { y })
}

/// A gated backward: for each (a, b, g) the pair (∂out/∂a·g, ∂out/∂b·g) from `f(a, b, g)`.
fn gated_bwd_map(
    grad: &tefl_core::Tensor,
    input: &tefl_core::Tensor,
    f: impl Fn(f32, f32, f32) -> (f32, f32) + Sync + Send,
) -> Result<DActOut> {
    let n = input.last_dim() / 2;
    let (grad_input, _) =
        map_rows([(grad, n), (input, 2 * n)], input.rows(), input.shape(), input.dtype(), 2 * n, |_, [gr, xr], o| {
            for j in 0..n {
                (o[j], o[n + j]) = f(xr[j], xr[n + j], gr[j]);
            }
            [0.0; 2]
        })?;
    Ok(DActOut { grad_input })
}

fn gated(a: &ActArgs, kind: Activation) -> Result<ActOut> {
    gated_map(&a.x, |av, bv| act(kind, av) * bv)
}

fn d_elementwise_t(a: &DActArgs, kind: Activation) -> Result<tefl_core::Tensor> {
    let n = a.input.last_dim();
    let (t, _) = map_rows(
        [(&a.grad, n), (&a.input, n)],
        a.input.rows(),
        a.input.shape(),
        a.input.dtype(),
        n,
        |_, [gr, xr], o| {
            for j in 0..n {
                o[j] = gr[j] * dact(kind, xr[j]);
            }
            [0.0; 2]
        },
    )?;
    Ok(t)
}

/// grad · act'(input), elementwise, into `dx`.
fn d_elementwise(a: &DActArgs, kind: Activation, dx: &mut [f32]) -> Result<()> {
    let (g, x) = (view(&a.grad)?, view(&a.input)?);
    dx.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK).zip(g.par_chunks(CHUNK))).for_each(|(o, (xi, gi))| {
        for ((d, xv), gv) in o.iter_mut().zip(xi).zip(gi) {
            *d = gv * dact(kind, *xv);
        }
    });
    Ok(())
}

fn d_gated(a: &DActArgs, kind: Activation) -> Result<DActOut> {
    gated_bwd_map(&a.grad, &a.input, |av, bv, g| (g * bv * dact(kind, av), g * act(kind, av)))
}

fn dbias(a: &DActArgs, kind: Activation) -> Result<DBiasOut> {
    let n = a.input.last_dim();
    let (grad_input, db) = build_f32(a.input.shape(), a.input.dtype(), "dbias output grad_input", |dx| {
        d_elementwise(a, kind, dx)?;
        row_major_column_sums(dx, n, "dbias")
    })?;
    Ok(DBiasOut { dbias: store(&db, &[n], a.input.dtype())?, grad_input })
}

macro_rules! kernels {
    ($( $fwd:ident, $bwd:ident, $dbias:ident => $kind:ident; )*) => {
        $(
            #[doc = concat!("The catalogue op `", stringify!($fwd), "` on the CPU reference (the catalogue's formula, checked against the f64 oracle).")]
            pub fn $fwd(_: &KernelCtx<'_>, a: &ActArgs) -> Result<ActOut> {
                elementwise(a, Activation::$kind)
            }
            #[doc = concat!("The catalogue op `", stringify!($bwd), "` on the CPU reference (the catalogue's formula, checked against the f64 oracle).")]
            pub fn $bwd(_: &KernelCtx<'_>, a: &DActArgs) -> Result<DActOut> {
                Ok(DActOut { grad_input: d_elementwise_t(a, Activation::$kind)? })
            }
            #[doc = concat!("The catalogue op `", stringify!($dbias), "` on the CPU reference (the catalogue's formula, checked against the f64 oracle).")]
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
            #[doc = concat!("The catalogue op `", stringify!($fwd), "` on the CPU reference (the catalogue's formula, checked against the f64 oracle).")]
            pub fn $fwd(_: &KernelCtx<'_>, a: &ActArgs) -> Result<ActOut> {
                gated(a, Activation::$kind)
            }
            #[doc = concat!("The catalogue op `", stringify!($bwd), "` on the CPU reference (the catalogue's formula, checked against the f64 oracle).")]
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

/// The catalogue op `clamped_swiglu` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn clamped_swiglu(_: &KernelCtx<'_>, a: &ClampedSwigluArgs) -> Result<ActOut> {
    gated_map(&a.x, |ar, br| {
        let av = if ar.is_nan() { ar } else { ar.min(a.limit) };
        av * sigmoid(a.alpha * av) * (br.clamp(-a.limit, a.limit) + 1.0)
    })
}

/// The catalogue op `clamped_dswiglu` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn clamped_dswiglu(_: &KernelCtx<'_>, a: &ClampedDSwigluArgs) -> Result<DActOut> {
    gated_bwd_map(&a.grad, &a.input, |ar, br, g| {
        // NaN stays NaN through the clamps and their derivatives.
        let av = if ar.is_nan() { ar } else { ar.min(a.limit) };
        let bv = br.clamp(-a.limit, a.limit);
        let s = sigmoid(a.alpha * av);
        let da = if ar.is_nan() {
            ar
        } else if ar < a.limit {
            s + a.alpha * av * s * (1.0 - s)
        } else {
            0.0
        };
        let db = if br.is_nan() {
            br
        } else if (-a.limit..=a.limit).contains(&br) {
            1.0
        } else {
            0.0
        };
        (g * (bv + 1.0) * da, g * av * s * db)
    })
}
