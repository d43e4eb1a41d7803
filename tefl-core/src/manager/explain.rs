//! Resolution: which impls a call may use, in which order, and why (`explain`).

use std::fmt;
use std::sync::Arc;

use crate::device::read_lock;
use crate::op::{Op, OpArgs};
use crate::policy::{SelectionPolicy, Token};
use crate::registry::{BackendImplKind, OpImpl};
use crate::{DType, Device, Result, catalogue};

use super::Manager;

/// How one impl fared in a resolution.
#[derive(Debug, Clone)]
pub struct ExplainEntry {
    /// The impl id.
    pub impl_id: String,
    /// Its kind.
    pub kind: BackendImplKind,
    /// Its vendor.
    pub vendor: Option<String>,
    /// Its priority.
    pub priority: i32,
    /// Its position in the chain (0 = called first), or `None` when dropped.
    pub position: Option<usize>,
    /// Whether the call is staged through the host for it.
    pub staged: bool,
    /// Why it was dropped, or why it sits where it does.
    pub reason: String,
    /// For an impl in the chain: which kernel it runs on this device for this dtype, where its
    /// vendor says ([`crate::VendorInfo::kernels`]; e.g. the Hopper attention kernel or the
    /// sm_80 one, chosen by arch and tune configs).
    pub kernel: Option<String>,
}

/// The candidate chain of one (op, device, dtype) under the current policy, with reasons.
#[derive(Debug, Clone)]
pub struct Explanation {
    /// The op.
    pub op: String,
    /// The device.
    pub device: Device,
    /// The primary dtype.
    pub dtype: DType,
    /// Whether the chain stops at the first failure.
    pub strict: bool,
    /// The chain in call order, then the dropped impls.
    pub entries: Vec<ExplainEntry>,
}

impl Explanation {
    /// The impl ids of the chain, in call order.
    pub fn chain(&self) -> Vec<&str> {
        let mut v: Vec<_> = self.entries.iter().filter(|e| e.position.is_some()).collect();
        v.sort_by_key(|e| e.position);
        v.into_iter().map(|e| e.impl_id.as_str()).collect()
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "op '{}' on {} ({}){}:",
            self.op,
            self.device,
            self.dtype,
            if self.strict { ", strict: no fallback" } else { "" }
        )?;
        if self.entries.is_empty() {
            writeln!(f, "  no impl registered")?;
        }
        for e in &self.entries {
            let pos = e.position.map_or("dropped".to_string(), |p| format!("#{}", p + 1));
            writeln!(
                f,
                "  {pos:>7}  {:<24} kind={:<9} vendor={:<10} priority={:<5} {}{}",
                e.impl_id,
                e.kind.token(),
                e.vendor.as_deref().unwrap_or("None"),
                e.priority,
                if e.staged { "[staged via host] " } else { "" },
                e.reason
            )?;
            if let Some(k) = &e.kernel {
                writeln!(f, "           kernel: {k}")?;
            }
        }
        Ok(())
    }
}

impl Manager {
    /// Resolves the chain of `op` for `device` and `dtype` under the current policy (including
    /// this thread's scoped overrides), with the reason each impl was dropped or placed.
    pub fn explain(&self, op: &str, device: &Device, dtype: DType) -> Result<Explanation> {
        let known = catalogue::find(op)
            .map(|d| d.name)
            .or_else(|| read_lock(&self.registry).all_impls().find(|i| i.op() == op).map(|i| i.op()));
        let Some(op) = known else {
            return Err(crate::dynargs::unknown_op(op));
        };
        let mut ex = self.resolve(op, *device, dtype, &self.effective_policy());
        self.name_kernels(&mut ex);
        Ok(ex)
    }

    /// Fills in the kernel each impl of the chain runs, from its vendor's description.
    fn name_kernels(&self, ex: &mut Explanation) {
        let reg = read_lock(&self.registry);
        for e in ex.entries.iter_mut().filter(|e| e.position.is_some()) {
            e.kernel = e
                .vendor
                .as_deref()
                .and_then(|v| reg.vendor(v))
                .and_then(|v| v.kernel_for(&e.impl_id, &ex.op, ex.device, ex.dtype));
        }
    }

    /// Like [`Manager::explain`], for one concrete call: the chain for these arguments' device
    /// and dtypes, where each impl with a per-call check ([`OpImpl::supports_args`]) is asked
    /// whether it supports them; one that does not is dropped with its reason.
    pub fn explain_call<O: Op>(&self, args: &O::Args) -> Result<Explanation> {
        let _reads = crate::tensor::call_reads::enter();
        let s = args.summary(O::NAME)?;
        O::validate(args)?;
        let mut ex = self.resolve(O::NAME, s.device, s.primary, &self.effective_policy());
        let reg = read_lock(&self.registry);
        let mut order: Vec<usize> = (0..ex.entries.len()).filter(|&i| ex.entries[i].position.is_some()).collect();
        order.sort_by_key(|&i| ex.entries[i].position);
        let mut next = 0;
        for i in order {
            let e = &mut ex.entries[i];
            let verdict = reg
                .impls_of(O::NAME)
                .iter()
                .find(|imp| imp.impl_id() == e.impl_id)
                .map_or(Ok(()), |imp| imp.check_supports::<O>(args));
            match verdict {
                Ok(()) => {
                    e.position = Some(next);
                    next += 1;
                }
                Err(r) => {
                    e.position = None;
                    e.reason = format!("does not support these arguments: {r}");
                }
            }
        }
        drop(reg);
        self.name_kernels(&mut ex);
        Ok(ex)
    }

    pub(super) fn resolve(&self, op: &str, device: Device, dtype: DType, policy: &SelectionPolicy) -> Explanation {
        let reg = read_lock(&self.registry);
        let mut placed: Vec<(Arc<OpImpl>, bool, String)> = Vec::new();
        let mut dropped: Vec<ExplainEntry> = Vec::new();
        let entry = |imp: &OpImpl, staged: bool, position: Option<usize>, reason: String| ExplainEntry {
            impl_id: imp.impl_id().to_string(),
            kind: imp.kind(),
            vendor: imp.vendor_name().map(str::to_string),
            priority: imp.get_priority(),
            position,
            staged,
            reason,
            kernel: None,
        };
        let mut candidates: Vec<(Arc<OpImpl>, bool)> = Vec::new();
        for imp in reg.impls_of(op) {
            let staged = imp.device_kind() != device.kind
                && imp.kind() == BackendImplKind::Reference
                && imp.device_kind() == Device::CPU.kind;
            let named = |imp: &OpImpl| {
                policy
                    .per_op
                    .get(op)
                    .is_some_and(|toks| toks.iter().any(|t| matches!(t, Token::Impl(id) if id == imp.impl_id())))
            };
            let why_not = if imp.device_kind() != device.kind && !staged {
                Some(format!("runs on {}, the call is on {device}", imp.device_kind()))
            } else if imp.is_by_name_only() && !named(imp) {
                Some(format!("selected only by name (TE_FL_PER_OP='{op}=impl:{}')", imp.impl_id()))
            } else if !imp.supports(dtype) {
                let list: Vec<_> = imp.supported_dtypes().iter().map(|d| d.name()).collect();
                Some(format!("does not support {dtype} (supports {})", list.join(", ")))
            } else if let Some(v) = imp.vendor_name().filter(|v| policy.denies(v)) {
                Some(format!("vendor '{v}' is denied by TE_FL_DENY_VENDORS"))
            } else if imp.kind() == BackendImplKind::Vendor && !policy.allows(imp.vendor_name().unwrap_or("")) {
                Some(format!("vendor '{}' is not in TE_FL_ALLOW_VENDORS", imp.vendor_name().unwrap_or("None")))
            } else if let Some(Err(r)) = imp.vendor_name().and_then(|v| reg.vendor(v)).map(|v| v.check_available()) {
                Some(format!("unavailable: {r}"))
            } else if let Err(r) = imp.check_available() {
                Some(format!("unavailable: {r}"))
            } else {
                None
            };
            match why_not {
                Some(r) => dropped.push(entry(imp, staged, None, r)),
                None => candidates.push((imp.clone(), staged)),
            }
        }
        candidates
            .sort_by(|a, b| b.0.get_priority().cmp(&a.0.get_priority()).then_with(|| a.0.impl_id().cmp(b.0.impl_id())));

        let mut take = |pred: &dyn Fn(&OpImpl) -> bool, why: &dyn Fn(&OpImpl) -> String| {
            let (hit, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut candidates).into_iter().partition(|(i, _)| pred(i));
            candidates = rest;
            for (imp, staged) in hit {
                let w = why(&imp);
                placed.push((imp, staged, w));
            }
        };
        let leftover_reason: String;
        if let Some(tokens) = policy.per_op.get(op) {
            for (n, tok) in tokens.iter().enumerate() {
                take(&|i| tok.matches(i), &|i| {
                    format!("TE_FL_PER_OP token {} '{tok}', priority {}", n + 1, i.get_priority())
                });
            }
            let names: Vec<String> = tokens.iter().map(Token::to_string).collect();
            leftover_reason = format!("not named by TE_FL_PER_OP for '{op}' ({})", names.join("|"));
        } else if let Some(b) = &policy.backend {
            let fb = policy.fallback_backend.clone();
            take(&|i| i.backend_name().eq_ignore_ascii_case(b), &|i| {
                format!("TE_BACKEND={b}, priority {}", i.get_priority())
            });
            take(&|i| i.backend_name().eq_ignore_ascii_case(&fb), &|i| {
                format!("TE_FALLBACK_BACKEND={fb}, priority {}", i.get_priority())
            });
            leftover_reason = format!("TE_BACKEND={b} forces one backend (fallback: {fb})");
        } else {
            let prefer = policy.prefer;
            for kind in prefer.order() {
                take(&|i| i.kind() == kind, &|i| {
                    format!("TE_FL_PREFER={prefer}: {} impls, priority {}", kind.token(), i.get_priority())
                });
            }
            leftover_reason = String::new();
        }
        for (imp, staged) in candidates {
            dropped.push(entry(&imp, staged, None, leftover_reason.clone()));
        }
        let mut entries: Vec<ExplainEntry> = placed
            .iter()
            .enumerate()
            .map(|(n, (imp, staged, why))| entry(imp, *staged, Some(n), why.clone()))
            .collect();
        entries.extend(dropped);
        Explanation { op: op.to_string(), device, dtype, strict: policy.strict, entries }
    }

    /// WARNs about vendors and impl ids the policy names but nothing registered: one
    /// environment often serves machines with different plugins, so this is not an error.
    pub(super) fn warn_unknown_names(&self) {
        let policy = read_lock(&self.policy).clone();
        let reg = read_lock(&self.registry);
        let vendor_known = |v: &str| {
            reg.vendor(v).is_some()
                || reg.all_impls().any(|i| i.vendor_name().is_some_and(|x| x.eq_ignore_ascii_case(v)))
        };
        let backend_known = |b: &str| b == "reference" || b == "flagos" || vendor_known(b);
        for (op, tokens) in &policy.per_op {
            for t in tokens {
                match t {
                    Token::VendorNamed(v) if !vendor_known(v) => self.warn_once(format!(
                        "TE_FL_PER_OP names vendor '{v}' for op '{op}', but no such vendor is registered"
                    )),
                    Token::Impl(id) if !reg.impls_of(op).iter().any(|i| i.impl_id() == id) => self.warn_once(format!(
                        "TE_FL_PER_OP names impl '{id}' for op '{op}', but no such impl is registered"
                    )),
                    _ => {}
                }
            }
        }
        for (var, list) in [
            ("TE_FL_ALLOW_VENDORS", policy.allow_vendors.clone().unwrap_or_default()),
            ("TE_FL_DENY_VENDORS", policy.deny_vendors.clone()),
        ] {
            for v in list.iter().filter(|v| !vendor_known(v)) {
                self.warn_once(format!("{var} names vendor '{v}', but no such vendor is registered"));
            }
        }
        if let Some(b) = policy.backend.as_deref().filter(|b| !backend_known(b)) {
            self.warn_once(format!(
                "TE_BACKEND names backend '{b}', but no such backend is registered; ops go to '{}'",
                policy.fallback_backend
            ));
        }
        if !backend_known(&policy.fallback_backend) {
            self.warn_once(format!(
                "TE_FALLBACK_BACKEND names backend '{}', but no such backend is registered",
                policy.fallback_backend
            ));
        }
    }
}
