//! # tefl-core
//!
//! The dispatch core of tefl: element types ([`DType`]), devices ([`Device`], the open
//! [`DeviceKind`] and the [`device::DeviceRuntime`]s backends register), tensors
//! ([`Tensor`]), the op catalogue ([`catalogue`], declared with [`declare_op!`]), op
//! implementations and the [`Registry`], the [`SelectionPolicy`] read from `TE_FL_*`
//! variables, the [`Manager`] that resolves, caches and runs the chain of impls for each
//! call, tune configs and the autotune cache ([`tuning`]), and TE-FL-style [`logging`].
//!
//! `tefl-core` knows no backend: backends depend on it and register themselves with
//! [`register_impl!`] / [`register_vendor!`] at link time, or with
//! [`Registry::register_impl`] / [`Manager::register_impl`] at run time.
//!
//! ```
//! use tefl_core::{DType, Device};
//! let dev = Device::best_available(); // cpu on a machine without GPU drivers
//! assert!(dev.is_available());
//! let ex = tefl_core::Manager::new(tefl_core::Registry::new(), Default::default())
//!     .explain("rmsnorm_fwd", &dev, DType::BF16)?;
//! assert!(ex.chain().is_empty());
//! # Ok::<(), tefl_core::Error>(())
//! ```

pub mod catalogue;
pub mod device;
pub mod dtype;
pub mod dynargs;
pub mod error;
pub mod fp8;
pub mod logging;
pub mod manager;
pub mod op;
pub mod philox;
pub mod plugin;
pub mod policy;
pub mod registry;
pub mod tensor;
pub mod tuning;

pub use device::{Device, DeviceKind};
pub use dtype::{DType, Element, FloatElement, bf16, f16};
pub use error::{Error, Result};
pub use manager::{BackendInfo, Explanation, Manager, ScopeGuard, global};
pub use op::{Op, OpArgs, OpOutput};
pub use policy::{EnvConfig, PolicyOverride, Prefer, SelectionPolicy, Token};
pub use registry::{BackendImplKind, KernelCtx, OpImpl, Registry, VendorInfo};
pub use tensor::Tensor;

/// TEX-style: forces one whole backend on the global manager (`TE_BACKEND` at run time).
pub fn set_backend(name: &str) -> Result<()> {
    global()?.set_backend(name)
}

/// TEX-style: the backend the global manager uses.
pub fn get_backend() -> Result<BackendInfo> {
    Ok(global()?.get_backend())
}

/// TEX-style: every backend the global manager knows.
pub fn list_backends() -> Result<Vec<BackendInfo>> {
    Ok(global()?.list_backends())
}

/// Which impls the global manager would call for `op` on `device` with `dtype`, and why.
pub fn explain(op: &str, device: &Device, dtype: DType) -> Result<Explanation> {
    global()?.explain(op, device, dtype)
}

#[doc(hidden)]
pub mod __private {
    pub use inventory;
}
