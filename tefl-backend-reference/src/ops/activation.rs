//! Activations, their backward forms and the dbias forms (f32 math, rayon over chunks/rows).

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::{KernelCtx, Result};

use crate::kernels::vmath::{self, exp};
use crate::util::{CHUNK, build_f32, map_rows, row_major_column_sums, store, view};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044_715;

// Each activation and its derivative as inline arithmetic on `vmath::exp`, so that the slice
// loops vectorise. The sigmoid is 1 / (1 + e), e = exp(-x); its complement 1 - s is e·s where
// s ≥ 1/2 (no cancellation there) and 1 - s below (e may be +inf there, and e·s = inf·0).
mod elem {
    use super::*;

    /// (sigmoid(x), 1 - sigmoid(x)).
    #[inline(always)]
    pub fn sigmoid_parts(x: f32) -> (f32, f32) {
        let e = exp(-x);
        let s = 1.0 / (1.0 + e);
        (s, if s < 0.5 { 1.0 - s } else { e * s })
    }

    /// The tanh form's inner argument times 2: 0.5·(1 + tanh(u)) = sigmoid(2u).
    #[inline(always)]
    pub fn gelu_2u(x: f32) -> f32 {
        2.0 * SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)
    }

    #[inline(always)]
    pub fn gelu(x: f32) -> f32 {
        x * sigmoid_parts(gelu_2u(x)).0
    }

    #[inline(always)]
    pub fn dgelu(x: f32) -> f32 {
        // d/dx [x·s(2u)] = s + x·(2u)'·s(1 - s), (2u)' = 2c(1 + 3a x²) (c = √(2/π), a = 0.044715).
        let (s, oms) = sigmoid_parts(gelu_2u(x));
        s + 2.0 * x * s * oms * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
    }

    #[inline(always)]
    pub fn qgelu(x: f32) -> f32 {
        x * sigmoid_parts(1.702 * x).0
    }

    #[inline(always)]
    pub fn dqgelu(x: f32) -> f32 {
        let (s, oms) = sigmoid_parts(1.702 * x);
        s + 1.702 * x * s * oms
    }

    /// max(x, 0), NaN for NaN (`f32::max` would give 0: NaN must propagate).
    #[inline(always)]
    pub fn relu(x: f32) -> f32 {
        if x.is_nan() { x } else { x.max(0.0) }
    }

    #[inline(always)]
    pub fn drelu(x: f32) -> f32 {
        if x > 0.0 {
            1.0
        } else if x.is_nan() {
            x
        } else {
            0.0
        }
    }

    #[inline(always)]
    pub fn srelu(x: f32) -> f32 {
        let r = relu(x);
        r * r
    }

    #[inline(always)]
    pub fn dsrelu(x: f32) -> f32 {
        2.0 * relu(x)
    }

    #[inline(always)]
    pub fn silu(x: f32) -> f32 {
        x * sigmoid_parts(x).0
    }

    #[inline(always)]
    pub fn dsilu(x: f32) -> f32 {
        let (s, oms) = sigmoid_parts(x);
        s + x * s * oms
    }
}

/// Binds `$f` / `$df` to the activation `$kind` and its derivative (function items, so that
/// `$body`'s loops are compiled once per activation with the arithmetic inlined).
macro_rules! with_act {
    ($kind:expr, $f:ident, $df:ident => $body:expr) => {
        match $kind {
            Activation::Gelu => {
                let ($f, $df) = (elem::gelu, elem::dgelu);
                $body
            }
            Activation::Qgelu => {
                let ($f, $df) = (elem::qgelu, elem::dqgelu);
                $body
            }
            Activation::Relu => {
                let ($f, $df) = (elem::relu, elem::drelu);
                $body
            }
            Activation::Srelu => {
                let ($f, $df) = (elem::srelu, elem::dsrelu);
                $body
            }
            Activation::Silu => {
                let ($f, $df) = (elem::silu, elem::dsilu);
                $body
            }
        }
    };
}

/// act(x) for one element (the slice loops below use the same functions).
pub fn act(kind: Activation, x: f32) -> f32 {
    with_act!(kind, f, _df => f(x))
}

/// act'(x) for one element.
pub fn dact(kind: Activation, x: f32) -> f32 {
    with_act!(kind, _f, df => df(x))
}

fn elementwise(a: &ActArgs, kind: Activation) -> Result<ActOut> {
    let n = a.x.last_dim();
    let (y, _) = map_rows([(&a.x, n)], a.x.rows(), a.x.shape(), a.x.dtype(), n, |_, [xr], yr| {
        with_act!(kind, f, _df => vmath::map([xr], yr, |[v]| f(v)));
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
        let (a, b) = xr.split_at(n);
        vmath::map([a, b], yr, |[av, bv]| f(av, bv));
        [0.0; 2]
    })?;
    Ok(ActOut { y })
}

/// A gated backward: for each (a, b, g), ∂out/∂a·g from `fa(a, b, g)` and ∂out/∂b·g from
/// `fb(a, b, g)`.
fn gated_bwd_map(
    grad: &tefl_core::Tensor,
    input: &tefl_core::Tensor,
    fa: impl Fn(f32, f32, f32) -> f32 + Sync + Send,
    fb: impl Fn(f32, f32, f32) -> f32 + Sync + Send,
) -> Result<DActOut> {
    let n = input.last_dim() / 2;
    let (grad_input, _) =
        map_rows([(grad, n), (input, 2 * n)], input.rows(), input.shape(), input.dtype(), 2 * n, |_, [gr, xr], o| {
            let (a, b) = xr.split_at(n);
            let (oa, ob) = o.split_at_mut(n);
            vmath::map([a, b, gr], oa, |[av, bv, g]| fa(av, bv, g));
            vmath::map([a, b, gr], ob, |[av, bv, g]| fb(av, bv, g));
            [0.0; 2]
        })?;
    Ok(DActOut { grad_input })
}

fn gated(a: &ActArgs, kind: Activation) -> Result<ActOut> {
    with_act!(kind, f, _df => gated_map(&a.x, move |av, bv| f(av) * bv))
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
            with_act!(kind, _f, df => vmath::map([gr, xr], o, |[g, x]| g * df(x)));
            [0.0; 2]
        },
    )?;
    Ok(t)
}

/// grad · act'(input), elementwise, into `dx`.
fn d_elementwise(a: &DActArgs, kind: Activation, dx: &mut [f32]) -> Result<()> {
    let (g, x) = (view(&a.grad)?, view(&a.input)?);
    dx.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK).zip(g.par_chunks(CHUNK))).for_each(|(o, (xi, gi))| {
        with_act!(kind, _f, df => vmath::map([gi, xi], o, |[g, x]| g * df(x)));
    });
    Ok(())
}

fn d_gated(a: &DActArgs, kind: Activation) -> Result<DActOut> {
    with_act!(kind, f, df => gated_bwd_map(&a.grad, &a.input, move |av, bv, g| g * bv * df(av), move |av, _, g| g * f(av)))
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
    let (limit, alpha) = (a.limit, a.alpha);
    gated_map(&a.x, move |ar, br| {
        let av = if ar.is_nan() { ar } else { ar.min(limit) };
        av * elem::sigmoid_parts(alpha * av).0 * (br.clamp(-limit, limit) + 1.0)
    })
}

/// The catalogue op `clamped_dswiglu` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn clamped_dswiglu(_: &KernelCtx<'_>, a: &ClampedDSwigluArgs) -> Result<DActOut> {
    let (limit, alpha) = (a.limit, a.alpha);
    // NaN stays NaN through the clamps and their derivatives.
    let clamp_a = move |ar: f32| if ar.is_nan() { ar } else { ar.min(limit) };
    gated_bwd_map(
        &a.grad,
        &a.input,
        move |ar, br, g| {
            let av = clamp_a(ar);
            let (s, oms) = elem::sigmoid_parts(alpha * av);
            let da = if ar.is_nan() {
                ar
            } else if ar < limit {
                s + alpha * av * s * oms
            } else {
                0.0
            };
            g * (br.clamp(-limit, limit) + 1.0) * da
        },
        move |ar, br, g| {
            let av = clamp_a(ar);
            let db = if br.is_nan() {
                br
            } else if (-limit..=limit).contains(&br) {
                1.0
            } else {
                0.0
            };
            g * av * elem::sigmoid_parts(alpha * av).0 * db
        },
    )
}
