//! Ops called by name with dynamic values (`tefl_core::dynargs`, what the Python package calls
//! through): the same results as the typed calls, outputs named in declaration order, and
//! every bad argument a typed error naming it.

use tefl_core::catalogue::*;
use tefl_core::dynargs::{Value, call_by_name, call_impl_by_name};
use tefl_core::{DType, Error, OpArgs};
use tefl_tests::{Rng, manager, reference, seed, tensor, values};

/// A call's named arguments.
type Args = Vec<(String, Value)>;

fn named(items: Vec<(&str, Value)>) -> Args {
    items.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn rmsnorm_args(x: &tefl_core::Tensor, g: &tefl_core::Tensor) -> Args {
    named(vec![
        ("x", Value::Tensor(x.clone())),
        ("gamma", Value::Tensor(g.clone())),
        ("eps", Value::Float(1e-5)),
        ("zero_centered_gamma", Value::Bool(true)),
        ("out_dtype", Value::Str("f32".into())),
    ])
}

#[test]
fn a_call_by_name_matches_the_typed_call() {
    let mut rng = Rng::new(seed("call_by_name"));
    let xs: Vec<f64> = (0..5 * 37).map(|_| rng.uniform(-2.0, 2.0)).collect();
    let gs: Vec<f64> = (0..37).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let x = tensor(&xs, &[5, 37], DType::BF16);
    let g = tensor(&gs, &[37], DType::BF16);
    let typed = reference::<RmsNormFwd>(&RmsNormFwdArgs {
        scale: None,
        x: x.clone(),
        gamma: g.clone(),
        eps: 1e-5,
        zero_centered_gamma: true,
        out_dtype: DType::F32,
    })
    .unwrap();
    let out = call_impl_by_name(manager(), "rmsnorm_fwd", "reference.cpu", rmsnorm_args(&x, &g)).unwrap();
    let names: Vec<&str> = out.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["y", "rsigma", "amax", "scale_inv"]);
    // The FP8 output's extras are absent for a float output.
    assert!(matches!((&out[2].1, &out[3].1), (Value::None, Value::None)), "{:?}", &out[2..]);
    let Value::Tensor(y) = &out[0].1 else { panic!("y is not a tensor: {:?}", out[0].1) };
    assert_eq!(y.dtype(), DType::F32);
    assert_eq!(values(y), values(&typed.y));
    // Through the policy too (the reference is the only impl of the CPU).
    let out = call_by_name(manager(), "rmsnorm_fwd", rmsnorm_args(&x, &g)).unwrap();
    let Value::Tensor(y) = &out[0].1 else { panic!() };
    assert_eq!(values(y), values(&typed.y));
}

#[test]
fn arguments_round_trip_through_values() {
    let t = tensor(&[1.0; 4], &[2, 2], DType::F32);
    let args = AttnFwdArgs {
        q: t.clone(),
        k: t.clone(),
        v: t.clone(),
        cu_seqlens_q: None,
        cu_seqlens_kv: None,
        layout: QkvLayout::Thd,
        mask: AttnMask::CausalBottomRight,
        scale: 0.25,
        dropout_p: 0.1,
        seed: u64::MAX,
        offset: 9,
        window: AttnWindow { left: Some(3), right: None },
        max_seqlen_q: Some(7),
        max_seqlen_kv: None,
    };
    let vals: Vec<(String, Value)> = args.to_values().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let back = AttnFwdArgs::from_values("fused_attn_fwd", tefl_core::dynargs::NamedValues::new("fused_attn_fwd", vals))
        .unwrap();
    assert_eq!(back.layout, QkvLayout::Thd);
    assert_eq!(back.mask, AttnMask::CausalBottomRight);
    assert_eq!(back.window, AttnWindow { left: Some(3), right: None });
    // Every u64 (a seed of 2^64 - 1 included) survives the round trip.
    assert_eq!((back.scale, back.dropout_p, back.seed, back.offset), (0.25, 0.1, u64::MAX, 9));
    assert!(back.cu_seqlens_q.is_none());
    // An optional count: a value, and None (or absent) for none.
    assert_eq!((back.max_seqlen_q, back.max_seqlen_kv), (Some(7), None));
}

#[test]
fn bad_arguments_are_errors_naming_them() {
    let x = tensor(&[1.0; 8], &[2, 4], DType::F32);
    let g = tensor(&[1.0; 4], &[4], DType::F32);
    let call = |edit: &dyn Fn(&mut Args)| {
        let mut a = rmsnorm_args(&x, &g);
        edit(&mut a);
        call_by_name(manager(), "rmsnorm_fwd", a).unwrap_err()
    };
    let e = call(&|a| a.push(("epsilon".into(), Value::Float(1.0))));
    assert!(matches!(e, Error::InvalidArgument { arg: "arguments", .. }) && e.to_string().contains("'epsilon'"), "{e}");
    let e = call(&|a| a.retain(|(k, _)| k != "eps"));
    assert!(matches!(e, Error::InvalidArgument { arg: "eps", .. }), "{e}");
    let e = call(&|a| a[0].1 = Value::Float(3.0));
    assert!(matches!(e, Error::ArgumentType { arg: "x", .. }), "{e}");
    let e = call(&|a| a[3].1 = Value::Str("yes".into()));
    assert!(matches!(e, Error::ArgumentType { arg: "zero_centered_gamma", .. }), "{e}");
    let e = call(&|a| a[4].1 = Value::Str("float7".into()));
    assert!(matches!(e, Error::InvalidArgument { arg: "out_dtype", .. }) && e.to_string().contains("bf16"), "{e}");
    let e = call(&|a| a[2].1 = Value::Float(1e300));
    assert!(matches!(e, Error::InvalidArgument { arg: "eps", .. }), "{e}");
    // The op's own validation still runs.
    let e = call(&|a| a[1].1 = Value::Tensor(tensor(&[1.0; 3], &[3], DType::F32)));
    assert!(matches!(e, Error::Shape { arg: "gamma", .. }), "{e}");
    let e = call_by_name(manager(), "rmsnorm_fw", vec![]).unwrap_err();
    assert!(matches!(&e, Error::UnknownOp(m) if m.contains("rmsnorm_fwd")), "{e}");
    // Integers out of range for their field.
    let t = tensor(&[1.0; 4], &[1, 1, 2, 2], DType::F32);
    let mut args: Vec<(String, Value)> = AttnFwdArgs {
        q: t.clone(),
        k: t.clone(),
        v: t,
        cu_seqlens_q: None,
        cu_seqlens_kv: None,
        layout: QkvLayout::Bshd,
        mask: AttnMask::None,
        scale: 1.0,
        dropout_p: 0.0,
        seed: 0,
        offset: 0,
        window: AttnWindow::default(),
        max_seqlen_q: None,
        max_seqlen_kv: None,
    }
    .to_values()
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for bad in [-1, i128::from(u64::MAX) + 1] {
        for (k, v) in &mut args {
            if k == "seed" {
                *v = Value::Int(bad);
            }
        }
        let e = call_by_name(manager(), "fused_attn_fwd", args.clone()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { arg: "seed", .. }), "{bad}: {e}");
    }
    // A window side is -1 (or None: unbounded) or a count of keys; no other negative.
    for (k, v) in &mut args {
        if k == "seed" {
            *v = Value::Int(0);
        }
        if k == "window" {
            *v = Value::List(vec![Value::Int(-5), Value::Int(0)]);
        }
    }
    let e = call_by_name(manager(), "fused_attn_fwd", args).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { arg: "window", .. }) && e.to_string().contains("-5"), "{e}");
}
