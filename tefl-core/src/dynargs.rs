//! Op arguments and outputs as dynamic values, for callers and impls written in other languages
//! (Python through `tefl-python`): any op of the catalogue can be called by name with named
//! [`Value`]s ([`call_by_name`]), and a run-time impl can read its call's arguments as named
//! values ([`DynCall::values`](crate::op::DynCall::values)). Every op gets this from its
//! declaration; each scalar type of the catalogue says how it is spelled ([`DynField`]).
//!
//! Spellings: enums by their snake_case variant names (`"causal_bottom_right"`, `"adamw"`), dtypes
//! by their tefl names (`"bf16"`), [`AttnWindow`] as a pair `[left, right]` (−1 or `None`:
//! unbounded; other negatives are refused), [`AdamHyper`] as a map of its fields.

use crate::catalogue::{AdamHyper, AdamMode, AmaxAlgo, AttnMask, AttnWindow, GemmEpilogue, QkvLayout};
use crate::{DType, Error, Manager, Result, Tensor};

/// One dynamic value.
#[derive(Debug, Clone)]
pub enum Value {
    /// Absent (an optional argument not given, an absent optional output).
    None,
    /// A boolean.
    Bool(bool),
    /// An integer: 128 bits, so that every integer field (u64 seeds and offsets included)
    /// round-trips.
    Int(i128),
    /// A float.
    Float(f64),
    /// A string (enum variants, dtypes).
    Str(String),
    /// A tensor.
    Tensor(Tensor),
    /// A list (tensor lists, pairs).
    List(Vec<Value>),
    /// Named values (structured scalars such as [`AdamHyper`]).
    Map(Vec<(String, Value)>),
}

impl Value {
    /// What kind of value this is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::Tensor(_) => "a tensor",
            Value::List(_) => "a list",
            Value::Map(_) => "a map",
        }
    }
}

/// The named arguments of one call by name: each field takes its value once; what is left at
/// the end is an unknown argument.
#[derive(Debug)]
pub struct NamedValues {
    op: &'static str,
    items: Vec<(String, Value)>,
}

impl NamedValues {
    /// The arguments `items` of a call of `op`.
    pub fn new(op: &'static str, items: Vec<(String, Value)>) -> Self {
        NamedValues { op, items }
    }

    /// Takes the value of `field` (`None` when it was not given).
    pub fn take(&mut self, field: &str) -> Option<Value> {
        let at = self.items.iter().position(|(n, _)| n == field)?;
        Some(self.items.swap_remove(at).1)
    }

    /// An error naming the first argument no field took.
    pub fn finish(self, fields: &[crate::op::FieldDesc]) -> Result<()> {
        match self.items.first() {
            None => Ok(()),
            Some((name, _)) => {
                let known: Vec<&str> = fields.iter().map(|f| f.name).collect();
                Err(Error::InvalidArgument {
                    op: self.op,
                    arg: "arguments",
                    reason: format!("unknown argument '{name}' (the op takes {})", known.join(", ")),
                })
            }
        }
    }
}

/// A field type of op arguments and outputs, read from and written as a [`Value`].
pub trait DynField: Sized {
    /// The field's value from what the caller gave (`None`: not given).
    fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self>;
    /// The field's value as a [`Value`].
    fn to_value(&self) -> Value;
}

/// The error for a value of the wrong kind.
pub fn wrong_type(op: &'static str, field: &'static str, expected: &str, got: &Value) -> Error {
    Error::ArgumentType { op, arg: field, expected: expected.to_string(), got: got.kind().to_string() }
}

fn required(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Value> {
    match v {
        None | Some(Value::None) => {
            Err(Error::InvalidArgument { op, arg: field, reason: "is required and was not given".into() })
        }
        Some(v) => Ok(v),
    }
}

impl DynField for Tensor {
    fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self> {
        match required(op, field, v)? {
            Value::Tensor(t) => Ok(t),
            other => Err(wrong_type(op, field, "a tensor", &other)),
        }
    }
    fn to_value(&self) -> Value {
        Value::Tensor(self.clone())
    }
}

impl DynField for Option<Tensor> {
    fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self> {
        match v {
            None | Some(Value::None) => Ok(None),
            Some(Value::Tensor(t)) => Ok(Some(t)),
            Some(other) => Err(wrong_type(op, field, "a tensor or None", &other)),
        }
    }
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::None, |t| Value::Tensor(t.clone()))
    }
}

impl DynField for Vec<Tensor> {
    fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self> {
        match required(op, field, v)? {
            Value::List(items) => items
                .into_iter()
                .map(|x| match x {
                    Value::Tensor(t) => Ok(t),
                    other => Err(wrong_type(op, field, "a list of tensors", &other)),
                })
                .collect(),
            other => Err(wrong_type(op, field, "a list of tensors", &other)),
        }
    }
    fn to_value(&self) -> Value {
        Value::List(self.iter().map(|t| Value::Tensor(t.clone())).collect())
    }
}

impl DynField for bool {
    fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self> {
        match required(op, field, v)? {
            Value::Bool(b) => Ok(b),
            other => Err(wrong_type(op, field, "a bool", &other)),
        }
    }
    fn to_value(&self) -> Value {
        Value::Bool(*self)
    }
}

impl DynField for f32 {
    fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self> {
        let x = match required(op, field, v)? {
            Value::Float(x) => x,
            Value::Int(i) => i as f64,
            other => return Err(wrong_type(op, field, "a float", &other)),
        };
        let f = x as f32;
        if x.is_finite() && !f.is_finite() {
            return Err(Error::InvalidArgument { op, arg: field, reason: format!("{x} is out of the range of f32") });
        }
        Ok(f)
    }
    fn to_value(&self) -> Value {
        Value::Float(f64::from(*self))
    }
}

/// Integers of a range: an integer value (a float or a bool is a type error), checked to fit.
macro_rules! dyn_int {
    ($($t:ty),*) => {$(
        impl DynField for $t {
            fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self> {
                match required(op, field, v)? {
                    Value::Int(i) => <$t>::try_from(i).map_err(|_| Error::InvalidArgument {
                        op,
                        arg: field,
                        reason: format!("{i} is out of range ({}..={})", <$t>::MIN, <$t>::MAX),
                    }),
                    other => Err(wrong_type(op, field, "an integer", &other)),
                }
            }
            fn to_value(&self) -> Value {
                Value::Int(i128::try_from(*self).unwrap_or(i128::MAX))
            }
        }
    )*};
}
dyn_int!(u32, u64, i32, usize);

/// An optional count (TE's `max_seqlen_q`): absent or `None` is `None`, else as `usize`.
impl DynField for Option<usize> {
    fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self> {
        match v {
            None | Some(Value::None) => Ok(None),
            v => usize::from_value(op, field, v).map(Some),
        }
    }
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::None, DynField::to_value)
    }
}

impl DynField for DType {
    fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self> {
        match required(op, field, v)? {
            Value::Str(s) => s.parse::<DType>().map_err(|_| Error::InvalidArgument {
                op,
                arg: field,
                reason: format!(
                    "unknown dtype {s:?} (one of {})",
                    DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
                ),
            }),
            other => Err(wrong_type(op, field, "a dtype name", &other)),
        }
    }
    fn to_value(&self) -> Value {
        Value::Str(self.name().to_string())
    }
}

/// Enums spelled by the given names.
macro_rules! dyn_enum {
    ($t:ident { $($name:literal => $variant:ident),* $(,)? }) => {
        impl DynField for $t {
            fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self> {
                match required(op, field, v)? {
                    Value::Str(s) => match s.as_str() {
                        $($name => Ok($t::$variant),)*
                        _ => Err(Error::InvalidArgument {
                            op,
                            arg: field,
                            reason: format!("unknown value {s:?} (one of {})", [$($name),*].join(", ")),
                        }),
                    },
                    other => Err(wrong_type(op, field, "a string", &other)),
                }
            }
            fn to_value(&self) -> Value {
                let name = match *self { $($t::$variant => $name,)* };
                Value::Str(name.to_string())
            }
        }
    };
}

dyn_enum!(QkvLayout { "bshd" => Bshd, "sbhd" => Sbhd, "thd" => Thd });
dyn_enum!(AttnMask {
    "none" => None,
    "causal" => Causal,
    "causal_bottom_right" => CausalBottomRight,
    "padding" => Padding,
    "padding_causal" => PaddingCausal,
});
dyn_enum!(GemmEpilogue {
    "none" => None,
    "bias" => Bias,
    "gelu" => Gelu,
    "bias_gelu" => BiasGelu,
    "dgelu" => DGelu,
    "dgelu_bias_grad" => DGeluBiasGrad,
    "bias_grad" => BiasGrad,
});
dyn_enum!(AmaxAlgo { "max" => Max, "most_recent" => MostRecent });
dyn_enum!(AdamMode { "l2" => L2, "adamw" => AdamW });

impl DynField for AttnWindow {
    fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self> {
        let side = |x: Value| -> Result<Option<usize>> {
            match x {
                Value::None | Value::Int(-1) => Ok(None),
                Value::Int(i) if i < 0 => Err(Error::InvalidArgument {
                    op,
                    arg: field,
                    reason: format!("a side is -1 (unbounded) or at least 0, got {i}"),
                }),
                Value::Int(i) => usize::try_from(i).map(Some).map_err(|_| Error::InvalidArgument {
                    op,
                    arg: field,
                    reason: format!("{i} is out of range"),
                }),
                other => Err(wrong_type(op, field, "a pair of integers (-1 or None: unbounded)", &other)),
            }
        };
        match v {
            None | Some(Value::None) => Ok(AttnWindow::default()),
            Some(Value::List(pair)) if pair.len() == 2 => {
                let mut it = pair.into_iter();
                let (l, r) = (it.next().unwrap_or(Value::None), it.next().unwrap_or(Value::None));
                Ok(AttnWindow { left: side(l)?, right: side(r)? })
            }
            Some(other) => Err(wrong_type(op, field, "a pair of integers (-1 or None: unbounded)", &other)),
        }
    }
    fn to_value(&self) -> Value {
        let side = |s: Option<usize>| s.map_or(Value::Int(-1), |x| Value::Int(i128::try_from(x).unwrap_or(i128::MAX)));
        Value::List(vec![side(self.left), side(self.right)])
    }
}

impl DynField for AdamHyper {
    fn from_value(op: &'static str, field: &'static str, v: Option<Value>) -> Result<Self> {
        let items = match required(op, field, v)? {
            Value::Map(items) => items,
            other => return Err(wrong_type(op, field, "a map of Adam's hyperparameters", &other)),
        };
        let mut named = NamedValues::new(op, items);
        let h = AdamHyper {
            lr: f32::from_value(op, "lr", named.take("lr"))?,
            beta1: f32::from_value(op, "beta1", named.take("beta1"))?,
            beta2: f32::from_value(op, "beta2", named.take("beta2"))?,
            eps: f32::from_value(op, "eps", named.take("eps"))?,
            step: u32::from_value(op, "step", named.take("step"))?,
            mode: AdamMode::from_value(op, "mode", named.take("mode"))?,
            bias_correction: bool::from_value(op, "bias_correction", named.take("bias_correction"))?,
            weight_decay: f32::from_value(op, "weight_decay", named.take("weight_decay"))?,
        };
        if let Some((name, _)) = named.items.first() {
            return Err(Error::InvalidArgument { op, arg: field, reason: format!("unknown field '{name}'") });
        }
        Ok(h)
    }
    fn to_value(&self) -> Value {
        Value::Map(vec![
            ("lr".into(), self.lr.to_value()),
            ("beta1".into(), self.beta1.to_value()),
            ("beta2".into(), self.beta2.to_value()),
            ("eps".into(), self.eps.to_value()),
            ("step".into(), self.step.to_value()),
            ("mode".into(), self.mode.to_value()),
            ("bias_correction".into(), self.bias_correction.to_value()),
            ("weight_decay".into(), self.weight_decay.to_value()),
        ])
    }
}

/// Calls op `name` on `manager` with named arguments (validation, then the policy's chain, as
/// [`Manager::call`]); the outputs come back named, in declaration order. An unknown op is
/// [`Error::UnknownOp`] (with the closest name), an unknown or missing argument or one of the
/// wrong kind an error naming it.
pub fn call_by_name(manager: &Manager, name: &str, args: Vec<(String, Value)>) -> Result<Vec<(&'static str, Value)>> {
    let desc = crate::catalogue::find(name).ok_or_else(|| unknown_op(name))?;
    (desc.call_dyn)(manager, NamedValues::new(desc.name, args), None)
}

/// [`call_by_name`] on one impl, bypassing the policy (as [`Manager::call_impl`]).
pub fn call_impl_by_name(
    manager: &Manager,
    name: &str,
    impl_id: &str,
    args: Vec<(String, Value)>,
) -> Result<Vec<(&'static str, Value)>> {
    let desc = crate::catalogue::find(name).ok_or_else(|| unknown_op(name))?;
    (desc.call_dyn)(manager, NamedValues::new(desc.name, args), Some(impl_id))
}

/// The error of an op name that is not in the catalogue, with the closest name as a hint.
pub(crate) fn unknown_op(name: &str) -> Error {
    match crate::catalogue::closest(name) {
        Some(c) => Error::UnknownOp(format!("{name} (did you mean {c}?)")),
        None => Error::UnknownOp(name.to_string()),
    }
}
