//! The pending call every entry point returns.

use tefl_core::{Manager, Op, Result};

/// A pending call of op `O`: its typed arguments, set by the entry point and the op's
/// builder methods, run with [`Call::call`] (the global manager) or [`Call::call_with`].
#[derive(Debug, Clone)]
pub struct Call<O: Op> {
    args: O::Args,
}

impl<O: Op> Call<O> {
    /// Wraps ready arguments.
    pub fn new(args: O::Args) -> Self {
        Call { args }
    }
    /// The arguments as they stand.
    pub fn args(&self) -> &O::Args {
        &self.args
    }
    /// Mutable access to the arguments (for fields without a builder method).
    pub fn args_mut(&mut self) -> &mut O::Args {
        &mut self.args
    }
    /// Runs on the process-wide manager (validation, then the policy's chain).
    pub fn call(self) -> Result<O::Output> {
        self.call_with(tefl_core::global()?)
    }
    /// Runs on `manager`.
    pub fn call_with(self, manager: &Manager) -> Result<O::Output> {
        manager.call::<O>(&self.args)
    }
    /// Starts compiling what this call would launch, without running it (see
    /// [`Manager::warmup`]): the impl that would serve it, or `None` where that impl has
    /// nothing to start ahead.
    pub fn warmup(&self) -> Result<Option<String>> {
        tefl_core::global()?.warmup::<O>(&self.args)
    }
    /// Runs one impl directly, bypassing the policy (what the conformance suite does).
    pub fn call_impl(self, manager: &Manager, impl_id: &str) -> Result<O::Output> {
        manager.call_impl::<O>(impl_id, &self.args)
    }
}

/// Builder methods that set one argument field each.
macro_rules! setters {
    ($op:ty { $( $(#[$m:meta])* $name:ident: $ty:ty ),* $(,)? }) => {
        impl $crate::Call<$op> {
            $(
                $(#[$m])*
                pub fn $name(mut self, value: $ty) -> Self {
                    self.args_mut().$name = value;
                    self
                }
            )*
        }
    };
}
pub(crate) use setters;
