//! The op-catalogue mechanism: one [`declare_op!`](crate::declare_op!) per op gives its name, its typed
//! argument and output structs, its validation and what host staging needs.
//!
//! Argument fields come in three kinds:
//! - `tensor`: read-only tensors (`Tensor`, `Option<Tensor>` or `Vec<Tensor>`);
//! - `inout`: tensors the op writes in place (optimizer states, `noop_flag`); host staging
//!   copies them back to the device after the call;
//! - `scalar`: anything else (`f32`, `bool`, enums, `DType`), cloned as is.
//!
//! Output fields are `tensor` or `scalar` with the same meaning.
//!
//! After `validate(a) { .. }` a declaration may have, in this order: `validate_values(a) { .. }`
//! (what `validate` leaves unread so that the host does not wait for the device, checked
//! before a kernel not compiled into tefl runs: [`Op::validate_values`]), `outputs(a) { .. }`
//! (the output contract: [`Op::output_contract`]) and `in_place [("written", "read"), ..]`
//! ([`Op::IN_PLACE`]).

use std::any::{Any, TypeId};
use std::sync::Arc;

use crate::tensor::Region;
use crate::{DType, Device, Error, Result, Tensor};

/// What a kernel gets besides its arguments.
#[derive(Debug, Clone, Copy)]
pub struct KernelCtx<'a> {
    /// The device the kernel runs on (the CPU for a staged reference call).
    pub device: Device,
    /// The op.
    pub op: &'static str,
    /// The impl being called.
    pub impl_id: &'a str,
}

/// The typed kernel function of an impl of op `O`.
pub type KernelFn<O> = Arc<dyn Fn(&KernelCtx<'_>, &<O as Op>::Args) -> Result<<O as Op>::Output> + Send + Sync>;

/// A kernel that serves an op without knowing its Rust types: it reads the arguments
/// through [`DynCall::visit_args`] and returns one tensor slot per output field, in
/// declaration order. Impls made at run time (C plugins, and any other host language) are
/// built on it with [`OpImpl::dynamic`](crate::OpImpl::dynamic).
pub type DynKernel = Arc<dyn Fn(&KernelCtx<'_>, &DynCall<'_>) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// One call of a [`DynKernel`].
pub struct DynCall<'a> {
    /// The op.
    pub op: &'static str,
    /// The op's output fields: the kernel returns one slot for each.
    pub outputs: &'static [FieldDesc],
    visit: &'a ArgVisitor<'a>,
    values: &'a dyn Fn() -> Vec<(&'static str, crate::dynargs::Value)>,
}

/// Something that visits a call's arguments (see [`OpArgs::visit_args`]).
type ArgVisitor<'a> = dyn Fn(&mut dyn FnMut(ArgRef<'_>)) + 'a;

impl DynCall<'_> {
    /// Visits every argument in declaration order (see [`OpArgs::visit_args`]).
    pub fn visit_args(&self, v: &mut dyn FnMut(ArgRef<'_>)) {
        (self.visit)(v)
    }
    /// Every argument as a named value, in declaration order (see [`crate::dynargs`]).
    pub fn values(&self) -> Vec<(&'static str, crate::dynargs::Value)> {
        (self.values)()
    }
}

/// A kernel of one op with its type erased, as an [`OpImpl`](crate::OpImpl) holds it.
pub struct ErasedKernel {
    pub(crate) op: &'static str,
    pub(crate) op_type: TypeId,
    pub(crate) kernel: Box<dyn Any + Send + Sync>,
}

impl ErasedKernel {
    /// Erases the type of a kernel of op `O`.
    pub fn of<O: Op>(kernel: KernelFn<O>) -> Self {
        ErasedKernel { op: O::NAME, op_type: TypeId::of::<O>(), kernel: Box::new(kernel) }
    }
}

/// The kernel of op `O` that calls the run-time kernel `k` and builds `O`'s output from the
/// slots it returns (an output that cannot be built fails the call, naming the impl).
pub fn erase_dyn<O: Op>(k: DynKernel) -> ErasedKernel {
    ErasedKernel::of::<O>(Arc::new(move |ctx: &KernelCtx<'_>, args: &O::Args| {
        let visit = |v: &mut dyn FnMut(ArgRef<'_>)| args.visit_args(v);
        let values = || args.to_values();
        let call = DynCall { op: O::NAME, outputs: <O::Output as OpOutput>::FIELDS, visit: &visit, values: &values };
        let mut slots = k(ctx, &call)?;
        // A run-time kernel's output with the contract's element count is taken in the
        // contract's shape (an rsigma of [rows, 1] for [rows]): host languages keep dims freely.
        let contract = O::output_contract(args);
        for (field, slot) in <O::Output as OpOutput>::FIELDS.iter().zip(slots.iter_mut()) {
            let (Some(t), Some(spec)) = (slot.as_ref(), contract.iter().find(|s| s.name == field.name)) else {
                continue;
            };
            if t.shape() != spec.shape.as_slice() && t.numel() == spec.shape.iter().product::<usize>() {
                *slot = Some(t.reshape(&spec.shape)?);
            }
        }
        O::Output::from_slots(O::NAME, slots).map_err(|e| Error::ImplFailed {
            op: O::NAME,
            impl_id: ctx.impl_id.to_string(),
            reason: e.to_string(),
        })
    }))
}

/// A call by name: the manager, the named arguments, and the impl to call directly (`None`:
/// the policy's chain).
pub type CallDyn = fn(
    &crate::Manager,
    crate::dynargs::NamedValues,
    Option<&str>,
) -> Result<Vec<(&'static str, crate::dynargs::Value)>>;

/// Calls op `O` with named arguments on `manager` (through the policy, or `impl_id` directly)
/// and returns its outputs as named values (see [`crate::dynargs`]).
pub fn call_dyn<O: Op>(
    manager: &crate::Manager,
    named: crate::dynargs::NamedValues,
    impl_id: Option<&str>,
) -> Result<Vec<(&'static str, crate::dynargs::Value)>> {
    let args = O::Args::from_values(O::NAME, named)?;
    let out = match impl_id {
        Some(id) => manager.call_impl::<O>(id, &args)?,
        None => manager.call::<O>(&args)?,
    };
    Ok(out.into_values())
}

/// One op of the catalogue: a zero-sized marker type tying a name to its argument and
/// output types. Implemented by [`declare_op!`](crate::declare_op!).
pub trait Op: Send + Sync + 'static {
    /// TE's name of the op (`rmsnorm_fwd`).
    const NAME: &'static str;
    /// The typed arguments.
    type Args: OpArgs;
    /// The typed outputs.
    type Output: OpOutput;
    /// Checks shapes, dtypes and scalar ranges; device agreement is checked by
    /// [`OpArgs::summary`] first.
    fn validate(args: &Self::Args) -> Result<()>;
    /// The op's static description (fields and their kinds).
    fn descriptor() -> &'static OpDescriptor;
    /// Pairs (written field, read field) whose tensors may be the same at the same list
    /// index (an elementwise in-place update such as `multi_tensor_scale` with `dst = src`);
    /// any other storage shared with an in-place argument is rejected.
    const IN_PLACE: &'static [(&'static str, &'static str)] = &[];
    /// The shape and dtype each output must have for valid `args`: the op's output contract,
    /// checked against impls that are not compiled into tefl (plugins, run-time
    /// registrations). Outputs not listed are not checked beyond their device.
    fn output_contract(args: &Self::Args) -> Vec<OutputSpec> {
        let _ = args;
        Vec::new()
    }
    /// What [`Op::validate`] may leave unchecked so that the host does not wait for the device
    /// (the lengths of a thd attention call given TE's max_seqlen bounds), checked before an
    /// impl that is not compiled into tefl runs (plugins, run-time registrations): such a
    /// kernel cannot be known to stay inside its tensors whatever those values hold. A failure
    /// is the caller's error, returned as it is.
    fn validate_values(args: &Self::Args) -> Result<()> {
        let _ = args;
        Ok(())
    }
}

/// One output's contract (see [`Op::output_contract`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSpec {
    /// The output field.
    pub name: &'static str,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its dtype.
    pub dtype: DType,
}

impl OutputSpec {
    /// Output `name` must be `shape` of `dtype`.
    pub fn new(name: &'static str, shape: impl Into<Vec<usize>>, dtype: DType) -> Self {
        OutputSpec { name, shape: shape.into(), dtype }
    }
}

/// Checks an impl's outputs against the op's contract: every tensor on the call's device,
/// and each output the contract lists present with its shape and dtype. The error names
/// the output.
pub fn check_outputs<O: Op>(args: &O::Args, out: &O::Output, device: Device) -> std::result::Result<(), String> {
    let mut problem = None;
    let mut present: Vec<(&'static str, Tensor)> = Vec::new();
    out.visit_outputs(&mut |name, t| {
        if let Some(t) = t {
            if t.device() != device && problem.is_none() {
                problem = Some(format!("output '{name}' is on {}, the call is on {device}", t.device()));
            }
            present.push((name, t.clone()));
        }
    });
    if let Some(p) = problem {
        return Err(p);
    }
    // A list output has one spec per element, in order: the k-th spec of a name is checked
    // against the k-th tensor of that name.
    let specs = O::output_contract(args);
    for (i, spec) in specs.iter().enumerate() {
        let nth = specs[..i].iter().filter(|s| s.name == spec.name).count();
        let Some((_, t)) = present.iter().filter(|(n, _)| *n == spec.name).nth(nth) else {
            return Err(format!("output '{}' is missing (expected {:?} of {})", spec.name, spec.shape, spec.dtype));
        };
        if t.shape() != spec.shape.as_slice() || t.dtype() != spec.dtype {
            return Err(format!(
                "output '{}' is {:?} of {}, the op's contract says {:?} of {}",
                spec.name,
                t.shape(),
                t.dtype(),
                spec.shape,
                spec.dtype
            ));
        }
        if t.size_in_bytes() != t.numel() * t.dtype().size_in_bytes() {
            return Err(format!("output '{}' holds {} bytes for its shape", spec.name, t.size_in_bytes()));
        }
    }
    Ok(())
}

/// What the manager needs from an op's argument struct. Generated by [`declare_op!`](crate::declare_op!).
pub trait OpArgs: Send + Sync + Sized + 'static {
    /// The fields, in declaration order.
    const FIELDS: &'static [FieldDesc];
    /// One pass over the tensor arguments: the device they all share (an error names the
    /// first argument on another device; ops without tensors run on the CPU), the packed
    /// dtype signature (4 bits per argument, in declaration order) and the primary dtype
    /// (that of the first tensor argument, which impls' dtype lists are checked against).
    fn summary(&self, op: &'static str) -> Result<ArgSummary>;
    /// Visits every argument in declaration order: each tensor slot (tensor lists give one
    /// per element, absent optional tensors `None`) and each scalar in `Debug` form. The C
    /// plugin ABI marshals arguments with it.
    fn visit_args(&self, v: &mut dyn FnMut(ArgRef<'_>));
    /// Visits every tensor argument in declaration order with its field name and whether
    /// the op writes it in place (tensor lists give one visit per element).
    fn visit_tensors(&self, v: &mut dyn FnMut(&'static str, bool, &Tensor));
    /// A copy whose tensors are on the host (for the reference impl on another device).
    fn to_host(&self) -> Result<Self>;
    /// After a staged call: copies the in-place (`inout`) tensors of `host` back into `self`'s.
    fn write_back(&self, host: &Self) -> Result<()>;
    /// The arguments from named values (a call by name, see [`crate::dynargs`]): each field
    /// takes its value; a missing, unknown or ill-typed one is an error naming it.
    fn from_values(op: &'static str, named: crate::dynargs::NamedValues) -> Result<Self>;
    /// Every field as a named value, in declaration order.
    fn to_values(&self) -> Vec<(&'static str, crate::dynargs::Value)>;
}

/// One argument seen by [`OpArgs::visit_args`].
#[derive(Debug)]
pub enum ArgRef<'a> {
    /// A tensor slot of a `tensor` or `inout` field (`None`: an absent optional tensor).
    Tensor {
        /// The field.
        name: &'static str,
        /// Whether the op writes it in place.
        inout: bool,
        /// The tensor.
        tensor: Option<&'a Tensor>,
    },
    /// A scalar field, formatted with `Debug`.
    Scalar {
        /// The field.
        name: &'static str,
        /// Its value.
        text: String,
    },
}

/// Builds an op's output from tensors produced in output order (run-time kernels, see [`DynKernel`]).
pub trait FromOutputTensor: Sized {
    /// The value of one output field from its slot.
    fn from_output(op: &'static str, field: &'static str, slot: Option<Tensor>) -> Result<Self>;
}

impl FromOutputTensor for Tensor {
    fn from_output(op: &'static str, field: &'static str, slot: Option<Tensor>) -> Result<Self> {
        slot.ok_or_else(|| Error::invalid(op, field, "the run-time kernel did not produce this output"))
    }
}

impl FromOutputTensor for Option<Tensor> {
    fn from_output(_: &'static str, _: &'static str, slot: Option<Tensor>) -> Result<Self> {
        Ok(slot)
    }
}

impl FromOutputTensor for Vec<Tensor> {
    fn from_output(op: &'static str, field: &'static str, _: Option<Tensor>) -> Result<Self> {
        Err(Error::invalid(op, field, "tensor-list outputs are not supported for run-time kernels"))
    }
}

/// Whether any field is written in place.
const fn has_inout(fields: &[FieldDesc]) -> bool {
    let mut i = 0;
    while i < fields.len() {
        if matches!(fields[i].kind, FieldKind::InOut) {
            return true;
        }
        i += 1;
    }
    false
}

/// Rejects arguments an op writes in place whose memory overlaps another argument's (the
/// same tensor, a reshape of it, or, for tensors with an address such as DLPack imports, two
/// views of one allocation): the write would race with the other use. The error names both
/// arguments. Ops without in-place arguments pay nothing.
pub fn check_inout_aliasing<O: Op>(args: &O::Args) -> Result<()> {
    /// One tensor argument, as the aliasing check sees it.
    struct Slot {
        seq: usize,
        name: &'static str,
        index: usize,
        written: bool,
        region: Region,
        dtype: DType,
        shape: Vec<usize>,
    }
    let op = O::NAME;
    // Decided at compile time: ops without in-place arguments pay nothing per call.
    if !const { has_inout(<O::Args as OpArgs>::FIELDS) } {
        return Ok(());
    }
    let mut all: Vec<Slot> = Vec::new();
    let mut index_in_list = (None, 0usize);
    args.visit_tensors(&mut |name, written, t| {
        let index = match index_in_list {
            (Some(n), i) if n == name => i + 1,
            _ => 0,
        };
        index_in_list = (Some(name), index);
        let region = t.region();
        all.push(Slot { seq: all.len(), name, index, written, region, dtype: t.dtype(), shape: t.shape().to_vec() });
    });
    // An elementwise in-place pair the op declares: the same memory, index, dtype and shape.
    let allowed = |a: &Slot, b: &Slot| {
        a.region == b.region
            && a.index == b.index
            && a.dtype == b.dtype
            && a.shape == b.shape
            && O::IN_PLACE
                .iter()
                .any(|&(w, r)| (w == a.name && r == b.name && a.written) || (w == b.name && r == a.name && b.written))
    };
    // Every overlapping pair, by a sweep over the ranges in address order (each slot meets only
    // the later ones that start before it ends).
    all.sort_by_key(|s| (s.region.space, s.region.start));
    for (i, first) in all.iter().enumerate() {
        let r = first.region;
        for s in all[i + 1..].iter().take_while(|s| s.region.space == r.space && s.region.start < r.end) {
            if allowed(first, s) || !(s.written || first.written) {
                continue;
            }
            // Reported at the later argument of the two (in declaration order), naming the
            // earlier one.
            let (first, s) = if first.seq < s.seq { (first, s) } else { (s, first) };
            let written = if first.written { first.name } else { s.name };
            let reason = if written == first.name && written == s.name {
                format!("holds the same tensor twice; '{written}' is written in place")
            } else {
                format!(
                    "shares storage with '{}'; '{written}' is written in place, so they must be distinct tensors",
                    first.name
                )
            };
            return Err(Error::invalid(op, s.name, reason));
        }
    }
    Ok(())
}

/// The result of [`OpArgs::summary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArgSummary {
    /// The device of the call.
    pub device: Device,
    /// Packed dtypes of the tensor arguments.
    pub signature: u64,
    /// The dtype of the first tensor argument (f32 when there is none).
    pub primary: DType,
}

/// What the manager needs from an op's output struct. Generated by [`declare_op!`](crate::declare_op!).
pub trait OpOutput: Send + Sized + 'static {
    /// The fields, in declaration order.
    const FIELDS: &'static [FieldDesc];
    /// Builds the output from one tensor slot per field (run-time kernels, see [`DynKernel`]).
    fn from_slots(op: &'static str, slots: Vec<Option<Tensor>>) -> Result<Self>;
    /// Moves every tensor of the output to `device`.
    fn to_device(self, device: &Device) -> Result<Self>;
    /// Visits every tensor output slot in declaration order (`None`: an absent optional one).
    fn visit_outputs(&self, v: &mut dyn FnMut(&'static str, Option<&Tensor>));
    /// Every field as a named value, in declaration order.
    fn into_values(self) -> Vec<(&'static str, crate::dynargs::Value)>;
}

/// The kind of an argument or output field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// Read-only tensor(s).
    Tensor,
    /// Tensor(s) written in place.
    InOut,
    /// A non-tensor value.
    Scalar,
}

/// One field of an op's arguments or outputs.
#[derive(Debug, Clone, Copy)]
pub struct FieldDesc {
    /// Field name.
    pub name: &'static str,
    /// Its kind.
    pub kind: FieldKind,
    /// Its Rust type, as written in the declaration.
    pub ty: &'static str,
}

/// The static description of an op.
#[derive(Debug)]
pub struct OpDescriptor {
    /// TE's name.
    pub name: &'static str,
    /// The marker type's name.
    pub type_name: &'static str,
    /// Argument fields.
    pub args: &'static [FieldDesc],
    /// Output fields.
    pub outputs: &'static [FieldDesc],
    /// Wraps a run-time kernel as this op's typed kernel ([`erase_dyn`] of the op).
    pub erase_dyn: fn(DynKernel) -> ErasedKernel,
    /// Calls the op with named arguments ([`call_dyn`] of the op).
    pub call_dyn: CallDyn,
    /// Whether the op declares an output contract ([`Op::output_contract`]).
    pub has_output_contract: bool,
}

/// Tensor-valued fields: `Tensor`, `Option<Tensor>` and `Vec<Tensor>`.
pub trait TensorField: Sized {
    /// Visits each tensor.
    fn visit(&self, f: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()>;
    /// A copy on `device`.
    fn moved_to(&self, device: &Device) -> Result<Self>;
    /// Copies `src`'s data into `self`'s tensors (same structure).
    fn copy_back_from(&self, src: &Self) -> Result<()>;
    /// Visits each slot: `None` for an absent optional tensor.
    fn each_slot(&self, f: &mut dyn FnMut(Option<&Tensor>));
    /// Feeds each tensor's device and dtype to `scan` (the per-call hot path).
    fn scan_into(&self, name: &'static str, scan: &mut ArgScan) -> Result<()> {
        let mut first = None;
        self.visit(&mut |t| {
            first.get_or_insert(t.dtype());
            scan.device_of(name, t)
        })?;
        scan.slot(first);
        Ok(())
    }
}

impl TensorField for Tensor {
    fn visit(&self, f: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()> {
        f(self)
    }
    fn each_slot(&self, f: &mut dyn FnMut(Option<&Tensor>)) {
        f(Some(self))
    }
    #[inline]
    fn scan_into(&self, name: &'static str, scan: &mut ArgScan) -> Result<()> {
        scan.device_of(name, self)?;
        scan.slot(Some(self.dtype()));
        Ok(())
    }
    fn moved_to(&self, device: &Device) -> Result<Self> {
        self.to_device(device)
    }
    fn copy_back_from(&self, src: &Self) -> Result<()> {
        self.copy_from(src)
    }
}

impl TensorField for Option<Tensor> {
    fn visit(&self, f: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()> {
        self.as_ref().map_or(Ok(()), f)
    }
    fn each_slot(&self, f: &mut dyn FnMut(Option<&Tensor>)) {
        f(self.as_ref())
    }
    fn moved_to(&self, device: &Device) -> Result<Self> {
        self.as_ref().map(|t| t.to_device(device)).transpose()
    }
    fn copy_back_from(&self, src: &Self) -> Result<()> {
        match (self, src) {
            (Some(d), Some(s)) => d.copy_from(s),
            _ => Ok(()),
        }
    }
}

impl TensorField for Vec<Tensor> {
    fn visit(&self, f: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()> {
        self.iter().try_for_each(f)
    }
    fn each_slot(&self, f: &mut dyn FnMut(Option<&Tensor>)) {
        self.iter().for_each(|t| f(Some(t)))
    }
    fn moved_to(&self, device: &Device) -> Result<Self> {
        self.iter().map(|t| t.to_device(device)).collect()
    }
    fn copy_back_from(&self, src: &Self) -> Result<()> {
        self.iter().zip(src).try_for_each(|(d, s)| d.copy_from(s))
    }
}

/// Accumulates device agreement and the dtype signature over the tensor fields.
#[doc(hidden)]
pub struct ArgScan {
    op: &'static str,
    pub device: Option<Device>,
    pub signature: u64,
    pub primary: Option<DType>,
    slot: u32,
}

impl ArgScan {
    #[doc(hidden)]
    pub fn new(op: &'static str) -> Self {
        ArgScan { op, device: None, signature: 0, primary: None, slot: 0 }
    }

    #[doc(hidden)]
    pub fn finish(&self) -> ArgSummary {
        ArgSummary {
            device: self.device.unwrap_or(Device::CPU),
            signature: self.signature,
            primary: self.primary.unwrap_or(DType::F32),
        }
    }

    #[doc(hidden)]
    #[inline]
    pub fn field<F: TensorField>(&mut self, name: &'static str, field: &F) -> Result<()> {
        field.scan_into(name, self)
    }

    #[doc(hidden)]
    #[inline]
    pub fn device_of(&mut self, name: &'static str, t: &Tensor) -> Result<()> {
        match self.device {
            None => self.device = Some(t.device()),
            Some(d) if d != t.device() => {
                return Err(Error::DeviceMismatch { op: self.op, arg: name, got: t.device(), expected: d });
            }
            Some(_) => {}
        }
        Ok(())
    }

    #[doc(hidden)]
    #[inline]
    pub fn slot(&mut self, dtype: Option<DType>) {
        if self.slot < 16 {
            self.signature |= u64::from(dtype.map_or(0, |d| d.code() & 0xF)) << (4 * self.slot);
        }
        self.slot += 1;
        if self.primary.is_none() {
            self.primary = dtype;
        }
    }
}

/// Declares one op of the catalogue: its marker type, argument struct, output struct and
/// validation. See the module docs for field kinds; ops that share argument types use
/// [`declare_args!`](crate::declare_args!), [`declare_output!`](crate::declare_output!) and
/// [`declare_op_with!`](crate::declare_op_with!) instead.
///
/// ```
/// use tefl_core::{declare_op, Error, Tensor};
/// declare_op! {
///     /// Scales a tensor.
///     pub struct MyScale = "my_scale";
///     /// Arguments.
///     pub struct MyScaleArgs {
///         /// Input.
///         tensor x: Tensor,
///         /// Factor.
///         scalar factor: f32,
///     }
///     /// Outputs.
///     pub struct MyScaleOut {
///         /// Result.
///         tensor y: Tensor,
///     }
///     validate(a) {
///         if !a.factor.is_finite() {
///             return Err(Error::invalid("my_scale", "factor", "must be finite"));
///         }
///         Ok(())
///     }
/// }
/// ```
#[macro_export]
macro_rules! declare_op {
    (
        $(#[$om:meta])* pub struct $op:ident = $name:literal;
        $(#[$am:meta])* pub struct $args:ident { $($afields:tt)* }
        $(#[$outm:meta])* pub struct $out:ident { $($ofields:tt)* }
        validate($a:ident) $body:block
        $(validate_values($va:ident) $vbody:block)?
        $(outputs($oa:ident) $obody:block)?
        $(in_place [$(($iw:literal, $ir:literal)),* $(,)?])?
    ) => {
        $crate::declare_args! { $(#[$am])* pub struct $args { $($afields)* } }
        $crate::declare_output! { $(#[$outm])* pub struct $out { $($ofields)* } }
        $crate::declare_op_with! {
            $(#[$om])* pub struct $op = $name; args $args; output $out; validate($a) $body
            $(validate_values($va) $vbody)?
            $(outputs($oa) $obody)?
            $(in_place [$(($iw, $ir)),*])?
        }
    };
}

/// Declares an op over argument and output types declared elsewhere (ops of one family,
/// such as the activations, share them).
#[macro_export]
macro_rules! declare_op_with {
    (
        $(#[$om:meta])* pub struct $op:ident = $name:literal;
        args $args:ty; output $out:ty;
        validate($a:ident) $body:block
        $(validate_values($va:ident) $vbody:block)?
        $(outputs($oa:ident) $obody:block)?
        $(in_place [$(($iw:literal, $ir:literal)),* $(,)?])?
    ) => {
        $(#[$om])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $op;

        impl $crate::op::Op for $op {
            const NAME: &'static str = $name;
            type Args = $args;
            type Output = $out;
            #[allow(unused_variables)]
            fn validate($a: &$args) -> $crate::Result<()> $body
            $(
                fn validate_values($va: &$args) -> $crate::Result<()> $vbody
            )?
            $( const IN_PLACE: &'static [(&'static str, &'static str)] = &[$(($iw, $ir)),*]; )?
            $(
                #[allow(unused_variables)]
                fn output_contract($oa: &$args) -> ::std::vec::Vec<$crate::op::OutputSpec> $obody
            )?
            fn descriptor() -> &'static $crate::op::OpDescriptor {
                static D: $crate::op::OpDescriptor = $crate::op::OpDescriptor {
                    name: $name,
                    type_name: stringify!($op),
                    args: <$args as $crate::op::OpArgs>::FIELDS,
                    outputs: <$out as $crate::op::OpOutput>::FIELDS,
                    erase_dyn: $crate::op::erase_dyn::<$op>,
                    call_dyn: $crate::op::call_dyn::<$op>,
                    has_output_contract: $crate::__has_contract!($($oa)?),
                };
                &D
            }
        }
    };
}

/// Declares an op argument struct and its [`OpArgs`] impl (device agreement, dtype
/// signature, host staging) from `kind name: Type` fields.
#[macro_export]
macro_rules! declare_args {
    (
        $(#[$am:meta])* pub struct $args:ident {
            $( $(#[$fm:meta])* $fk:ident $f:ident : $ft:ty ),* $(,)?
        }
    ) => {
        $(#[$am])*
        #[derive(Debug, Clone)]
        pub struct $args {
            $( $(#[$fm])* pub $f: $ft, )*
        }

        impl $crate::op::OpArgs for $args {
            const FIELDS: &'static [$crate::op::FieldDesc] = &[$( $crate::op::FieldDesc {
                name: stringify!($f),
                kind: $crate::__field_kind!($fk),
                ty: stringify!($ft),
            } ),*];
            #[allow(unused_mut)]
            fn summary(&self, op: &'static str) -> $crate::Result<$crate::op::ArgSummary> {
                let mut scan = $crate::op::ArgScan::new(op);
                $( $crate::__field_scan!($fk, scan, stringify!($f), &self.$f); )*
                Ok(scan.finish())
            }
            fn visit_args(&self, v: &mut dyn FnMut($crate::op::ArgRef<'_>)) {
                $( $crate::__field_visit!($fk, v, stringify!($f), &self.$f); )*
            }
            #[allow(unused_variables)]
            fn visit_tensors(&self, v: &mut dyn FnMut(&'static str, bool, &$crate::Tensor)) {
                $( $crate::__field_visit_tensors!($fk, v, stringify!($f), &self.$f); )*
            }
            fn to_host(&self) -> $crate::Result<Self> {
                Ok($args { $( $f: $crate::__field_to!($fk, &self.$f, &$crate::Device::CPU), )* })
            }
            #[allow(unused_variables)]
            fn write_back(&self, host: &Self) -> $crate::Result<()> {
                $( $crate::__field_write_back!($fk, &self.$f, &host.$f); )*
                Ok(())
            }
            #[allow(unused_mut)]
            fn from_values(op: &'static str, mut named: $crate::dynargs::NamedValues) -> $crate::Result<Self> {
                let args = $args { $( $f: <$ft as $crate::dynargs::DynField>::from_value(
                    op, stringify!($f), named.take(stringify!($f)))?, )* };
                named.finish(<Self as $crate::op::OpArgs>::FIELDS)?;
                Ok(args)
            }
            fn to_values(&self) -> ::std::vec::Vec<(&'static str, $crate::dynargs::Value)> {
                ::std::vec![ $( (stringify!($f), $crate::dynargs::DynField::to_value(&self.$f)), )* ]
            }
        }
    };
}

/// Declares an op output struct and its [`OpOutput`] impl.
#[macro_export]
macro_rules! declare_output {
    (
        $(#[$outm:meta])* pub struct $out:ident {
            $( $(#[$gm:meta])* $gk:ident $g:ident : $gt:ty ),* $(,)?
        }
    ) => {
        $(#[$outm])*
        #[derive(Debug, Clone)]
        pub struct $out {
            $( $(#[$gm])* pub $g: $gt, )*
        }

        impl $crate::op::OpOutput for $out {
            const FIELDS: &'static [$crate::op::FieldDesc] = &[$( $crate::op::FieldDesc {
                name: stringify!($g),
                kind: $crate::__field_kind!($gk),
                ty: stringify!($gt),
            } ),*];
            #[allow(unused_variables, unused_mut, unreachable_code)]
            fn from_slots(op: &'static str, slots: Vec<Option<$crate::Tensor>>) -> $crate::Result<Self> {
                let mut it = slots.into_iter();
                Ok($out { $( $g: $crate::__field_from_slot!($gk, $gt, op, stringify!($g), it.next().flatten()), )* })
            }
            #[allow(unused_variables)]
            fn to_device(self, device: &$crate::Device) -> $crate::Result<Self> {
                Ok($out { $( $g: $crate::__field_move!($gk, self.$g, device), )* })
            }
            #[allow(unused_variables)]
            fn visit_outputs(&self, v: &mut dyn FnMut(&'static str, Option<&$crate::Tensor>)) {
                $( $crate::__output_visit!($gk, v, stringify!($g), &self.$g); )*
            }
            fn into_values(self) -> ::std::vec::Vec<(&'static str, $crate::dynargs::Value)> {
                ::std::vec![ $( (stringify!($g), $crate::dynargs::DynField::to_value(&self.$g)), )* ]
            }
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __field_kind {
    (tensor) => {
        $crate::op::FieldKind::Tensor
    };
    (inout) => {
        $crate::op::FieldKind::InOut
    };
    (scalar) => {
        $crate::op::FieldKind::Scalar
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __field_scan {
    (scalar, $scan:ident, $name:expr, $v:expr) => {};
    (tensor, $scan:ident, $name:expr, $v:expr) => {
        $scan.field($name, $v)?
    };
    (inout, $scan:ident, $name:expr, $v:expr) => {
        $scan.field($name, $v)?
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __field_to {
    (scalar, $v:expr, $dev:expr) => {
        ::core::clone::Clone::clone($v)
    };
    ($k:ident, $v:expr, $dev:expr) => {
        $crate::op::TensorField::moved_to($v, $dev)?
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __field_move {
    (scalar, $v:expr, $dev:expr) => {
        $v
    };
    ($k:ident, $v:expr, $dev:expr) => {
        $crate::op::TensorField::moved_to(&$v, $dev)?
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __field_visit {
    (scalar, $v:ident, $name:expr, $x:expr) => {
        $v($crate::op::ArgRef::Scalar { name: $name, text: format!("{:?}", $x) })
    };
    (tensor, $v:ident, $name:expr, $x:expr) => {
        $crate::op::TensorField::each_slot($x, &mut |t| {
            $v($crate::op::ArgRef::Tensor { name: $name, inout: false, tensor: t })
        })
    };
    (inout, $v:ident, $name:expr, $x:expr) => {
        $crate::op::TensorField::each_slot($x, &mut |t| {
            $v($crate::op::ArgRef::Tensor { name: $name, inout: true, tensor: t })
        })
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __has_contract {
    () => {
        false
    };
    ($oa:ident) => {
        true
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __output_visit {
    (scalar, $v:ident, $name:expr, $x:expr) => {};
    ($k:ident, $v:ident, $name:expr, $x:expr) => {
        $crate::op::TensorField::each_slot($x, &mut |t| $v($name, t))
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __field_visit_tensors {
    (scalar, $v:ident, $name:expr, $x:expr) => {};
    (tensor, $v:ident, $name:expr, $x:expr) => {
        $crate::op::TensorField::each_slot($x, &mut |t| {
            if let Some(t) = t {
                $v($name, false, t)
            }
        })
    };
    (inout, $v:ident, $name:expr, $x:expr) => {
        $crate::op::TensorField::each_slot($x, &mut |t| {
            if let Some(t) = t {
                $v($name, true, t)
            }
        })
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __field_from_slot {
    (scalar, $t:ty, $op:expr, $name:expr, $slot:expr) => {
        return Err($crate::Error::invalid($op, $name, "scalar outputs are not supported for run-time kernels"))
    };
    ($k:ident, $t:ty, $op:expr, $name:expr, $slot:expr) => {
        <$t as $crate::op::FromOutputTensor>::from_output($op, $name, $slot)?
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __field_write_back {
    (inout, $orig:expr, $host:expr) => {
        $crate::op::TensorField::copy_back_from($orig, $host)?
    };
    ($k:ident, $orig:expr, $host:expr) => {};
}
