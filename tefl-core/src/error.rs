//! The one error type of tefl. Every variant names the culprit: the argument, the
//! variable, the impl or the plugin that was wrong.

use crate::{DType, Device};

/// Result alias used across tefl.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in tefl, as a typed value.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An environment variable (or its programmatic equivalent) holds a value tefl does not accept.
    #[error("invalid configuration in {variable}: {token:?}: {reason}")]
    Config {
        /// The variable, e.g. `TE_FL_PREFER`.
        variable: &'static str,
        /// The offending piece of the value, verbatim.
        token: String,
        /// Why it was rejected.
        reason: String,
    },
    /// An op argument has the wrong shape.
    #[error("op '{op}': argument '{arg}' has shape {got:?}, expected {expected}")]
    Shape {
        /// The op.
        op: &'static str,
        /// The argument.
        arg: &'static str,
        /// What it has.
        got: Vec<usize>,
        /// What was expected, in words.
        expected: String,
    },
    /// An op argument has the wrong dtype.
    #[error("op '{op}': argument '{arg}' has dtype {got}, expected {expected}")]
    DType {
        /// The op.
        op: &'static str,
        /// The argument.
        arg: &'static str,
        /// What it has.
        got: DType,
        /// What was expected, in words.
        expected: String,
    },
    /// Two arguments live on different devices.
    #[error("op '{op}': argument '{arg}' is on {got}, but the op runs on {expected}")]
    DeviceMismatch {
        /// The op.
        op: &'static str,
        /// The argument.
        arg: &'static str,
        /// Its device.
        got: Device,
        /// The device of the op's first tensor.
        expected: Device,
    },
    /// A scalar or structural argument is out of range.
    #[error("op '{op}': argument '{arg}' is invalid: {reason}")]
    InvalidArgument {
        /// The op (or the API function).
        op: &'static str,
        /// The argument.
        arg: &'static str,
        /// Why.
        reason: String,
    },
    /// An argument given by name (a call from another language) is of the wrong kind: a float
    /// where a tensor goes, a string where a bool goes.
    #[error("op '{op}': argument '{arg}' must be {expected}, got {got}")]
    ArgumentType {
        /// The op.
        op: &'static str,
        /// The argument.
        arg: &'static str,
        /// What it must be, in words.
        expected: String,
        /// What it was, in words.
        got: String,
    },
    /// A tensor could not be built from the data given.
    #[error("tensor: {0}")]
    Tensor(String),
    /// A device is not usable here (no driver, no such ordinal, skipped by configuration).
    #[error("device {device} is unavailable: {reason}")]
    DeviceUnavailable {
        /// The device, e.g. `cuda:0`.
        device: String,
        /// Why.
        reason: String,
    },
    /// A device operation (allocation, copy, launch) failed.
    #[error("device {device}: {reason}")]
    DeviceFailure {
        /// The device.
        device: String,
        /// What failed.
        reason: String,
    },
    /// The device ran out of memory.
    #[error("device {device}: out of memory {}", oom_request(*bytes, what))]
    OutOfMemory {
        /// The device.
        device: String,
        /// The request in bytes; 0 when the one that ran out did not say (a driver error
        /// outside a tensor allocation, a plugin's or a Python impl's own allocation).
        bytes: usize,
        /// What the memory was for (a tensor's shape and dtype, an argument).
        what: String,
    },
    /// Two registrations used the same (op, impl_id).
    #[error("duplicate registration: op '{op}' already has impl '{impl_id}'")]
    DuplicateImpl {
        /// The op.
        op: &'static str,
        /// The impl id.
        impl_id: String,
    },
    /// An op name that is not in the catalogue (with the closest one there is, when one is close:
    /// `rmsnorm_fw (did you mean rmsnorm_fwd?)`).
    #[error("unknown op '{0}' (not in the op catalogue)")]
    UnknownOp(String),
    /// No implementation survived selection for this call.
    #[error("no implementation of op '{op}' for {device} ({dtype}): {reason}")]
    NoImplementation {
        /// The op.
        op: &'static str,
        /// The device of the call.
        device: Device,
        /// The call's primary dtype.
        dtype: DType,
        /// Why the chain is empty (filters, policy).
        reason: String,
    },
    /// An implementation failed (returned an error, or panicked).
    #[error("implementation '{impl_id}' failed for op '{op}': {reason}")]
    ImplFailed {
        /// The op.
        op: &'static str,
        /// The impl.
        impl_id: String,
        /// Its error or panic message.
        reason: String,
    },
    /// An implementation does not support this call's arguments (a shape it has no kernel
    /// for, tiles that do not fit the device). Not a failure: the manager moves on to the
    /// next impl without remembering it against the impl.
    #[error("implementation '{impl_id}' does not support this call of op '{op}': {reason}")]
    Unsupported {
        /// The op.
        op: &'static str,
        /// The impl.
        impl_id: String,
        /// Why.
        reason: String,
    },
    /// Every implementation in the chain failed; the list is in call order.
    #[error("all implementations of op '{op}' failed: {}", .failures.iter().map(|(i, e)| format!("'{i}': {e}")).collect::<Vec<_>>().join("; "))]
    AllFailed {
        /// The op.
        op: &'static str,
        /// (impl_id, error) for each attempt.
        failures: Vec<(String, String)>,
    },
    /// A kernel was registered for one op but called through another op type.
    #[error("impl '{impl_id}' is registered for op '{registered}' but was called as '{called}'")]
    KernelTypeMismatch {
        /// The impl.
        impl_id: String,
        /// The op it was registered for.
        registered: &'static str,
        /// The op it was called as.
        called: &'static str,
    },
    /// A whole backend named by `set_backend` / `TE_BACKEND` does not exist (worded as
    /// TE-FL's TEX interface words it).
    #[error("Backend '{name}' not found. Available backends: [{}]", .available.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(", "))]
    BackendNotFound {
        /// The name asked for.
        name: String,
        /// The names that exist.
        available: Vec<String>,
    },
    /// A plugin library could not be used.
    #[error("plugin '{plugin}': {reason}")]
    Plugin {
        /// The plugin path or name.
        plugin: String,
        /// Why.
        reason: String,
    },
    /// Tune configs or the autotune cache are malformed.
    #[error("tuning: {0}")]
    Tuning(String),
    /// File-system errors (autotune cache, kernel cache).
    #[error("io error on {path}: {reason}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        reason: String,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(op: &'static str, arg: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { op, arg, reason: reason.into() }
    }

    /// Shorthand for [`Error::Config`]. A token longer than 200 characters is cut, so that
    /// a bad 100 KB value does not come back whole in the message.
    pub fn config(variable: &'static str, token: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Config { variable, token: cut(&token.into(), 200), reason: reason.into() }
    }
}

/// The request of an [`Error::OutOfMemory`]: its size when known.
fn oom_request(bytes: usize, what: &str) -> String {
    if bytes == 0 { format!("for {what} (size not reported)") } else { format!("allocating {bytes} bytes for {what}") }
}

/// Long user-given values are cut in messages (a bad 100 KB list must not echo 100 KB).
fn cut(s: &str, max: usize) -> String {
    let total = s.chars().count();
    if total <= max {
        return s.to_string();
    }
    let head: String = s.chars().take(max).collect();
    format!("{head}... ({total} chars in all)")
}
