//! The helpers every shared op file uses: a variant bound to the target of its device,
//! device addresses, output tensors, device facts and size checks.

use std::sync::Arc;

use tefl_core::device::DeviceInfo;
use tefl_core::tuning::TuneTable;
use tefl_core::{DType, Device, Error, KernelCtx, Result, Tensor};

use crate::Variant;
use crate::target::{GpuTarget, target_of};
pub use crate::{Arg, Grid, blocks_for};

/// A variant bound to the device its op runs on: launches its entries by name through the
/// device's target.
pub(crate) struct OnDevice {
    device: Device,
    target: &'static dyn GpuTarget,
    variant: Variant,
}

impl OnDevice {
    /// `variant` on `device`.
    pub(crate) fn new(device: Device, variant: Variant) -> Result<Self> {
        Ok(OnDevice { device, target: target_of(device)?, variant })
    }

    /// The variant.
    pub(crate) fn variant(&self) -> &Variant {
        &self.variant
    }

    /// Queues the entry `name`.
    pub(crate) fn launch(&self, name: &'static str, grid: Grid, args: &[Arg]) -> Result<()> {
        self.target.launch(self.device, &self.variant, name, grid, args)
    }

    /// Queues the entry `name` as a cooperative launch; `Ok(false)`, nothing queued, where the
    /// target cannot (see [`GpuTarget::launch_cooperative`]).
    pub(crate) fn launch_cooperative(&self, name: &'static str, grid: Grid, args: &[Arg]) -> Result<bool> {
        self.target.launch_cooperative(self.device, &self.variant, name, grid, args)
    }

    /// On this variant's first use on its device, starts compiling the variants `later` names
    /// on other threads (see [`crate::target::compile_ahead_on_first_use`]).
    pub(crate) fn compile_ahead(&self, later: impl FnOnce() -> Result<Vec<Variant>>) {
        crate::target::compile_ahead_on_first_use(self.target, self.device, &self.variant, later)
    }
}

/// The device address of a GPU tensor (a typed error for a tensor no linked-in target serves).
pub(crate) fn ptr(t: &Tensor) -> Result<u64> {
    target_of(t.device())?.address(t)
}

/// The device address of an optional GPU tensor, 0 when absent.
pub(crate) fn opt_ptr(t: Option<&Tensor>) -> Result<u64> {
    t.map(ptr).transpose().map(|p| p.unwrap_or(0))
}

/// The facts of a device, looked up once (`tefl_core::device::info`).
pub(crate) fn info(device: Device) -> Result<Arc<DeviceInfo>> {
    tefl_core::device::info(device)
}

/// The number of compute units of a device (grid sizes of persistent and grid-stride kernels).
pub(crate) fn sm_count(device: Device) -> u32 {
    info(device).map_or(64, |i| i.compute_units.max(1))
}

/// The layered tune table of a device's arch, from its target.
pub(crate) fn tune_table(device: Device) -> Result<Arc<TuneTable>> {
    target_of(device)?.tune_table(device)
}

/// The C type name a kernel source uses for a dtype (`TX=bf16`).
pub(crate) fn cty(op: &'static str, arg: &'static str, d: DType) -> Result<&'static str> {
    crate::ctype(op, arg, d)
}

/// A device tensor whose every element the caller's kernel writes (no zero fill).
pub(crate) fn empty(device: Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::uninit(shape, dtype, &device)
}

/// A zero-filled device tensor (accumulators).
pub(crate) fn zeros(device: Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::zeros(shape, dtype, &device)
}

/// `i32` from a size, or [`Error::Unsupported`] naming the op and the impl being called.
pub(crate) fn i32_of(ctx: &KernelCtx<'_>, op: &'static str, what: &'static str, v: usize) -> Result<i32> {
    crate::i32_of(op, ctx.impl_id, what, v)
}

/// A valid call these kernels cannot serve (a size past their index range): the manager moves
/// on to the next impl without counting a failure.
pub(crate) fn unsupported(ctx: &KernelCtx<'_>, op: &'static str, reason: String) -> Error {
    Error::Unsupported { op, impl_id: ctx.impl_id.to_string(), reason }
}
