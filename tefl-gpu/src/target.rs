//! The GPU targets linked into this build: what the shared op code ([`crate::simt`]) needs from a
//! backend to run a launch plan on one of its devices. A backend registers one
//! [`GpuTarget`] per device kind with [`register_gpu_target!`](crate::register_gpu_target);
//! the shared code finds it from the device of the call.

use std::sync::Arc;

use tefl_core::tuning::TuneTable;
use tefl_core::{Device, DeviceKind, Error, Result, Tensor};

use crate::{Arg, Grid, Variant};

/// A backend's runtime seen by the shared op code.
pub trait GpuTarget: Send + Sync {
    /// The device kind it serves (`cuda`, `hip`).
    fn device_kind(&self) -> DeviceKind;
    /// Queues the entry `entry` of `variant` on the device's current queue: compiled for the
    /// device's arch and loaded on first use.
    fn launch(&self, device: Device, variant: &Variant, entry: &'static str, grid: Grid, args: &[Arg]) -> Result<()>;
    /// Queues `entry` as a cooperative launch, every block of `grid` resident on the device at
    /// once, so that its blocks may wait for each other (the prelude's grid flags). `Ok(false)`,
    /// with nothing queued, where the target or the device cannot promise that for this grid
    /// (the default): the caller then runs a form that needs no grid-wide wait.
    fn launch_cooperative(
        &self,
        device: Device,
        variant: &Variant,
        entry: &'static str,
        grid: Grid,
        args: &[Arg],
    ) -> Result<bool> {
        let _ = (device, variant, entry, grid, args);
        Ok(false)
    }
    /// Starts compiling `variant` for the device on another thread, for a launch to come (an
    /// op's forward names its backward's variant): see [`crate::rtc::compile_ahead`]. Does
    /// nothing by default, and never fails: the launch that needs the variant compiles it
    /// itself if this did not.
    fn compile_ahead(&self, device: Device, variant: &Variant) {
        let _ = (device, variant);
    }
    /// Whether `variant` is loaded on the device (its first launch is behind it). Yes by
    /// default, so that a target without [`GpuTarget::compile_ahead`] is never asked for one.
    fn loaded(&self, device: Device, variant: &Variant) -> bool {
        let _ = (device, variant);
        true
    }
    /// The device address of a tensor on one of its devices (a typed error for any other).
    fn address(&self, t: &Tensor) -> Result<u64>;
    /// The layered tune table of a device (vendor and arch-family files over the GPU defaults).
    fn tune_table(&self, device: Device) -> Result<Arc<TuneTable>>;
}

/// One registered target (see [`register_gpu_target!`](crate::register_gpu_target)).
pub struct TargetEntry(pub &'static dyn GpuTarget);

inventory::collect!(TargetEntry);

/// Registers a `&'static` [`GpuTarget`] for the shared op code.
#[macro_export]
macro_rules! register_gpu_target {
    ($target:expr) => {
        $crate::inventory::submit! { $crate::target::TargetEntry($target) }
    };
}

/// On the first use of `now` on `device` (before its first launch loads it), starts compiling
/// the variants `later` names on other threads, where `target` can: those the op's later calls
/// will launch (a forward's backward), so that their compile overlaps the work in between (see
/// [`GpuTarget::compile_ahead`]). After the first use this costs one lookup; a variant `later`
/// cannot build is left to its own launch.
pub fn compile_ahead_on_first_use(
    target: &dyn GpuTarget,
    device: Device,
    now: &Variant,
    later: impl FnOnce() -> Result<Vec<Variant>>,
) {
    if target.loaded(device, now) {
        return;
    }
    for v in later().unwrap_or_default() {
        target.compile_ahead(device, &v);
    }
}

/// The target serving `device`, or [`Error::DeviceUnavailable`] when no backend linked into this
/// build serves its kind.
pub fn target_of(device: Device) -> Result<&'static dyn GpuTarget> {
    inventory::iter::<TargetEntry>.into_iter().map(|e| e.0).find(|t| t.device_kind() == device.kind).ok_or_else(|| {
        Error::DeviceUnavailable {
            device: device.to_string(),
            reason: "no GPU backend for this device kind is linked into this build".into(),
        }
    })
}
