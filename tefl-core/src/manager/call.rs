//! The call path: run a resolved chain, contain each impl, fall back, count and log.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use crate::device::read_lock;
use crate::op::{ArgSummary, FieldKind, Op, OpArgs, OpOutput, check_inout_aliasing};
use crate::registry::{BackendImplKind, KernelCtx, OpImpl, panic_message};
use crate::{Device, Error, Result, Tensor};

use super::cache::{ChainEntry, LocalChain};
use super::{FAILURE_MEMORY, FailureRecord, LOG, Manager, lock};

/// What a failure says, without repeating the "implementation 'x' failed for op 'y'" the
/// log line or the list it goes into already says.
fn failure_text(err: &Error, impl_id: &str) -> String {
    match err {
        Error::ImplFailed { impl_id: i, reason, .. } | Error::Unsupported { impl_id: i, reason, .. }
            if i == impl_id =>
        {
            reason.clone()
        }
        e => e.to_string(),
    }
}

/// The outputs of a call with nothing to compute, or `None`. When every output of the op is a
/// tensor its contract lists for these arguments and each is empty (a batch of no sequences or
/// no positions), and nothing is written in place, the impl the chain picked answers with
/// empty outputs on the call's device without its kernel running: RoPE and attention, whose
/// kernels describe their tensors to the hardware (TMA maps) and take no empty dims, never see
/// such calls. Anything else (an optional output the contract does not list, a column sum or
/// an amax over no rows) goes to the impl as usual.
fn nothing_to_compute<O: Op>(args: &O::Args, device: Device) -> Result<Option<O::Output>> {
    let d = O::descriptor();
    // (Not for list outputs, whose contract lists one shape per element under one name.)
    if !d.has_output_contract
        || d.outputs.is_empty()
        || d.outputs.iter().any(|f| f.ty.starts_with("Vec"))
        || d.args.iter().any(|f| f.kind == FieldKind::InOut)
    {
        return Ok(None);
    }
    // Empty outputs come from an empty input: calls without one (nearly all) stop here, before
    // the contract's shapes are built.
    let mut any_empty = false;
    args.visit_tensors(&mut |_, _, t| any_empty |= t.numel() == 0);
    if !any_empty {
        return Ok(None);
    }
    let specs = O::output_contract(args);
    let Some(empty) = d
        .outputs
        .iter()
        .map(|f| specs.iter().find(|o| o.name == f.name && o.shape.contains(&0)))
        .collect::<Option<Vec<_>>>()
    else {
        return Ok(None);
    };
    let slots =
        empty.into_iter().map(|o| Tensor::uninit(&o.shape, o.dtype, &device).map(Some)).collect::<Result<_>>()?;
    O::Output::from_slots(O::NAME, slots).map(Some)
}

/// Runs impl code of `impl_id` for op `op`, turning a panic into [`Error::ImplFailed`] whose
/// reason starts with `what` (a kernel's call and a warm-up both go through here).
fn contained<T>(op: &'static str, impl_id: &str, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::ImplFailed { op, impl_id: impl_id.to_string(), reason: format!("{what}: {}", panic_message(&*p)) })
    })
}

impl Manager {
    /// Calls op `O`: validates the arguments, then runs the cached chain.
    pub fn call<O: Op>(&self, args: &O::Args) -> Result<O::Output> {
        let _reads = crate::tensor::call_reads::enter();
        let summary = args.summary(O::NAME)?;
        O::validate(args)?;
        check_inout_aliasing::<O>(args)?;
        let chain = self.chain_for::<O>(&summary);
        self.run::<O>(&chain, &summary, args)
    }

    /// Starts the work a call of `O` with these arguments would do before its first launch
    /// (compiling its kernels, on other threads; Triton's `warmup`), without making outputs,
    /// launching or writing anything: the arguments are validated, the policy's chain is
    /// resolved as for a call, and the first impl of it that supports the arguments runs its
    /// warm-up ([`crate::register_warmup!`]). Returns that impl's id, or `None` where it has
    /// no warm-up (its first call does that work). A script that knows its step's ops can warm
    /// them up before the step, so that their compiles overlap instead of queueing one after
    /// another at each op's first call. In-place arguments may alias (nothing is written).
    /// GPU backends' warm-ups start nothing with `TEFL_COMPILE_AHEAD=0`.
    pub fn warmup<O: Op>(&self, args: &O::Args) -> Result<Option<String>> {
        let _reads = crate::tensor::call_reads::enter();
        let summary = args.summary(O::NAME)?;
        O::validate(args)?;
        let chain = self.chain_for::<O>(&summary);
        let Some(e) = chain
            .shared
            .entries
            .iter()
            .find(|e| !e.imp.has_supports_check() || e.imp.check_supports::<O>(args).is_ok())
        else {
            return Ok(None);
        };
        let Some(warmup) = (!e.staged).then(|| crate::registry::warmup_of::<O>(e.imp.impl_id())).flatten() else {
            return Ok(None);
        };
        let ctx = KernelCtx { device: summary.device, op: O::NAME, impl_id: e.imp.impl_id() };
        contained(O::NAME, e.imp.impl_id(), "warm-up panicked", || warmup(&ctx, args))?;
        Ok(Some(e.imp.impl_id().to_string()))
    }

    /// Calls one impl directly by id, bypassing the policy (the conformance suite does this).
    /// A reference impl serves other devices through host staging, as in a normal call.
    pub fn call_impl<O: Op>(&self, impl_id: &str, args: &O::Args) -> Result<O::Output> {
        let _reads = crate::tensor::call_reads::enter();
        let summary = args.summary(O::NAME)?;
        O::validate(args)?;
        check_inout_aliasing::<O>(args)?;
        let imp =
            read_lock(&self.registry).impls_of(O::NAME).iter().find(|i| i.impl_id() == impl_id).cloned().ok_or_else(
                || Error::NoImplementation {
                    op: O::NAME,
                    device: summary.device,
                    dtype: summary.primary,
                    reason: format!("no impl '{impl_id}' registered"),
                },
            )?;
        let staged = imp.device_kind() != summary.device.kind;
        if staged && !(imp.kind() == BackendImplKind::Reference && imp.device_kind() == Device::CPU.kind) {
            return Err(Error::DeviceMismatch {
                op: O::NAME,
                arg: "impl",
                got: summary.device,
                expected: Device::new(imp.device_kind(), 0),
            });
        }
        if let Err(reason) = imp.check_supports::<O>(args) {
            imp.counters.unsupported.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Unsupported { op: O::NAME, impl_id: impl_id.to_string(), reason });
        }
        if !imp.is_compiled_in() {
            O::validate_values(args)?;
        }
        let entry = ChainEntry { imp, staged, fail: Arc::default(), staged_logged: AtomicBool::new(true) };
        self.attempt::<O>(&entry, &summary, args)
    }

    fn run<O: Op>(&self, chain: &LocalChain, s: &ArgSummary, args: &O::Args) -> Result<O::Output> {
        let sh = &*chain.shared;
        if sh.entries.is_empty() {
            return Err(Error::NoImplementation {
                op: O::NAME,
                device: s.device,
                dtype: s.primary,
                reason: sh.empty_reason.clone(),
            });
        }
        let mut failures: Vec<(String, String)> = Vec::new();
        let mut unsupported: Vec<usize> = Vec::new();
        let mut attempted = false;
        // The first impl's out-of-memory error, while every impl that failed ran out of memory:
        // then that is what the call returns (the cause), not the list of failures.
        let mut out_of_memory: Option<Error> = None;
        let mut other_failure = false;
        for pass in 0..2 {
            for (i, e) in sh.entries.iter().enumerate() {
                if unsupported.contains(&i) {
                    continue;
                }
                // Pass 0 honours the failure memory; pass 1 (only when pass 0 tried nothing)
                // tries every impl rather than fail without an attempt.
                if pass == 0 && !sh.strict && e.take_skip() {
                    e.imp.counters.skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                // An impl that does not support these arguments is passed over, not failed.
                let checked = if e.imp.has_supports_check() { e.imp.check_supports::<O>(args) } else { Ok(()) };
                // What validation left unread (bounded thd lengths) is checked before a kernel
                // not compiled into tefl sees it; bad values are the caller's error.
                if checked.is_ok() && !e.imp.is_compiled_in() {
                    O::validate_values(args)?;
                }
                let result = match checked {
                    Ok(()) => {
                        attempted = true;
                        self.attempt::<O>(e, s, args)
                    }
                    Err(reason) => {
                        Err(Error::Unsupported { op: O::NAME, impl_id: e.imp.impl_id().to_string(), reason })
                    }
                };
                match result {
                    Ok(out) => {
                        e.note_success();
                        e.imp.counters.calls.fetch_add(1, Ordering::Relaxed);
                        let fell_back = !failures.is_empty();
                        if fell_back {
                            Self::on_fallback(e, O::NAME);
                        }
                        if chain.last_served.get() != i {
                            self.note_served(O::NAME, s.device, &e.imp, fell_back);
                            chain.last_served.set(i);
                        }
                        return Ok(out);
                    }
                    Err(err @ Error::Unsupported { .. }) => {
                        e.imp.counters.unsupported.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(target: LOG, "Implementation '{}' does not support this call of op '{}': {}", e.imp.impl_id(), O::NAME, failure_text(&err, e.imp.impl_id()));
                        unsupported.push(i);
                        failures.push((
                            e.imp.impl_id().to_string(),
                            format!("not supported: {}", failure_text(&err, e.imp.impl_id())),
                        ));
                    }
                    // A configuration error (a plugin's malformed setting, or a pinned Vulkan GEMM
                    // tile the device cannot run) is the caller's to fix, like a malformed
                    // variable: the call returns it, and the impl is neither passed over nor
                    // remembered as failed.
                    Err(err @ Error::Config { .. }) => return Err(err),
                    Err(err) => {
                        self.on_failure(e, O::NAME, s.device, &err);
                        if sh.strict {
                            return Err(err);
                        }
                        failures.push((e.imp.impl_id().to_string(), failure_text(&err, e.imp.impl_id())));
                        if matches!(err, Error::OutOfMemory { .. }) {
                            out_of_memory.get_or_insert(err);
                        } else {
                            other_failure = true;
                        }
                    }
                }
            }
            if attempted {
                break;
            }
        }
        if !attempted && !failures.is_empty() && unsupported.len() == sh.entries.len() {
            let why: Vec<String> = failures.iter().map(|(i, e)| format!("'{i}': {e}")).collect();
            return Err(Error::NoImplementation {
                op: O::NAME,
                device: s.device,
                dtype: s.primary,
                reason: why.join("; "),
            });
        }
        match out_of_memory {
            Some(oom) if !other_failure => Err(oom),
            _ => Err(Error::AllFailed { op: O::NAME, failures }),
        }
    }

    fn attempt<O: Op>(&self, e: &ChainEntry, s: &ArgSummary, args: &O::Args) -> Result<O::Output> {
        if let Some(out) = nothing_to_compute::<O>(args, s.device)? {
            return Ok(out);
        }
        let kernel = e.imp.kernel::<O>()?;
        let device = if e.staged { Device::CPU } else { s.device };
        let ctx = KernelCtx { device, op: O::NAME, impl_id: e.imp.impl_id() };
        if e.staged && !e.staged_logged.swap(true, Ordering::Relaxed) {
            tracing::info!(target: LOG, "Op '{}' staged through host memory for '{}' (call on {})", O::NAME, e.imp.impl_id(), s.device);
        }
        let out = contained(O::NAME, e.imp.impl_id(), "panicked", || {
            if e.staged {
                let host = args.to_host()?;
                let out = kernel(&ctx, &host)?;
                args.write_back(&host)?;
                out.to_device(&s.device)
            } else {
                kernel(&ctx, args)
            }
        })?;
        if !e.imp.is_compiled_in() {
            crate::op::check_outputs::<O>(args, &out, s.device).map_err(|reason| Error::ImplFailed {
                op: O::NAME,
                impl_id: e.imp.impl_id().to_string(),
                reason,
            })?;
        }
        Ok(out)
    }

    #[cold]
    #[inline(never)]
    fn on_failure(&self, e: &ChainEntry, op: &'static str, device: Device, err: &Error) {
        e.imp.counters.failures.fetch_add(1, Ordering::Relaxed);
        // Running out of memory says how large the call was and how full the device is, not
        // that the impl is broken: it is counted and recorded, but not passed over on the
        // next calls (a training loop that hit one large batch, or a batch-size search, would
        // otherwise run its following calls, up to thousands, on a slower impl).
        if !matches!(err, Error::OutOfMemory { .. }) {
            e.note_failure();
        }
        tracing::warn!(target: LOG, "Implementation '{}' failed for op '{}': {}", e.imp.impl_id(), op, failure_text(err, e.imp.impl_id()));
        self.remember_failure(op, e.imp.impl_id(), device, err);
    }

    #[cold]
    #[inline(never)]
    fn on_fallback(e: &ChainEntry, op: &'static str) {
        e.imp.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
        tracing::info!(target: LOG, "Op '{}' fallback to '{}' {}", op, e.imp.impl_id(), e.imp.describe());
    }

    #[cold]
    #[inline(never)]
    fn note_served(&self, op: &'static str, device: Device, imp: &OpImpl, fell_back: bool) {
        let mut served = lock(&self.served);
        match served.get(&(op, device)) {
            None => {
                tracing::info!(target: LOG, "Op '{}' using '{}' {}", op, imp.impl_id(), imp.describe());
            }
            Some(prev) if prev != imp.impl_id() && !fell_back => {
                tracing::info!(target: LOG, "Op '{}' switched from '{}' to '{}' {}", op, prev, imp.impl_id(), imp.describe());
            }
            Some(_) => {}
        }
        served.insert((op, device), imp.impl_id().to_string());
    }

    fn remember_failure(&self, op: &'static str, impl_id: &str, device: Device, err: &Error) {
        let mut f = lock(&self.failures);
        if f.len() == FAILURE_MEMORY {
            f.pop_front();
        }
        f.push_back(FailureRecord {
            op,
            impl_id: impl_id.to_string(),
            device,
            error: err.to_string(),
            at: SystemTime::now(),
        });
    }
}
