//! The selection contract of DESIGN.md, end to end through the manager, with test impls
//! that succeed, fail or panic.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tefl_core::catalogue::{RmsNormFwd, RmsNormFwdArgs, RmsNormFwdOut};
use tefl_core::device::{Buffer, DeviceRuntime};
use tefl_core::logging::CapturedLog;
use tefl_core::policy::LogLevel;
use tefl_core::{
    BackendImplKind as Kind, DType, Device, DeviceKind, Error, Manager, OpImpl, PolicyOverride, Prefer, Registry,
    SelectionPolicy, Tensor, VendorInfo, declare_op,
};

#[derive(Clone, Copy)]
enum Behaviour {
    Ok,
    Fail,
    Panic,
    /// Returns the device runtimes' out-of-memory error.
    OutOfMemory,
    /// Returns a configuration error (a malformed variable of its backend).
    BadConfig,
}

/// Each impl writes its tag into `rsigma`, so the caller sees who served it.
fn imp(
    id: &str,
    kind: Kind,
    vendor: Option<&str>,
    prio: i32,
    tag: f32,
    b: Behaviour,
    hits: Arc<AtomicUsize>,
) -> OpImpl {
    let id_owned = id.to_string();
    let i = OpImpl::new::<RmsNormFwd>(id, kind, move |_, a: &RmsNormFwdArgs| {
        hits.fetch_add(1, Ordering::Relaxed);
        match b {
            Behaviour::Ok => Ok(RmsNormFwdOut {
                amax: None,
                scale_inv: None,
                y: a.x.clone(),
                rsigma: Tensor::from_slice(&vec![tag; a.x.rows()], [a.x.rows()], DType::F32)?,
            }),
            Behaviour::Fail => {
                Err(Error::DeviceFailure { device: "test".into(), reason: format!("{id_owned} refuses") })
            }
            Behaviour::Panic => panic!("{id_owned} exploded"),
            Behaviour::OutOfMemory => Err(Error::OutOfMemory {
                device: "cpu".into(),
                bytes: 1 << 40,
                what: format!("{id_owned}'s workspace"),
            }),
            Behaviour::BadConfig => Err(Error::config("TEFL_TEST_KNOB", "bogus", "expected 0 or 1")),
        }
    })
    .priority(prio);
    match vendor {
        Some(v) => i.vendor(v),
        None => i,
    }
}

struct Fixture {
    hits: Vec<(String, Arc<AtomicUsize>)>,
}

impl Fixture {
    fn hits(&self, id: &str) -> usize {
        self.hits.iter().find(|(i, _)| i == id).unwrap().1.load(Ordering::Relaxed)
    }
}

/// default.a/default.b (flagos, tie), vendor.x (prio 50), vendor.y (vendor "Y", prio 100), reference.cpu.
fn registry(behaviours: &[(&str, Behaviour)]) -> (Registry, Fixture) {
    let specs: [(&str, Kind, Option<&str>, i32, f32); 5] = [
        ("default.b", Kind::Default, None, 10, 2.0),
        ("default.a", Kind::Default, None, 10, 1.0),
        ("vendor.x", Kind::Vendor, Some("x"), 50, 3.0),
        ("vendor.y", Kind::Vendor, Some("Y"), 100, 4.0),
        ("reference.cpu", Kind::Reference, None, 0, 5.0),
    ];
    let mut reg = Registry::new();
    let mut hits = Vec::new();
    for (id, kind, vendor, prio, tag) in specs {
        let b = behaviours.iter().find(|(i, _)| *i == id).map_or(Behaviour::Ok, |(_, b)| *b);
        let h = Arc::new(AtomicUsize::new(0));
        reg.register_impl(imp(id, kind, vendor, prio, tag, b, h.clone())).unwrap();
        hits.push((id.to_string(), h));
    }
    (reg, Fixture { hits })
}

fn args() -> RmsNormFwdArgs {
    RmsNormFwdArgs {
        scale: None,
        x: Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], DType::F32).unwrap(),
        gamma: Tensor::from_slice(&[1.0f32; 3], [3], DType::F32).unwrap(),
        eps: 1e-5,
        zero_centered_gamma: false,
        out_dtype: DType::F32,
    }
}

fn served_tag(m: &Manager) -> Result<f32, Error> {
    Ok(m.call::<RmsNormFwd>(&args())?.rsigma.to_vec::<f32>()?[0])
}

fn chain(m: &Manager) -> Vec<String> {
    m.explain("rmsnorm_fwd", &Device::CPU, DType::F32).unwrap().chain().into_iter().map(String::from).collect()
}

#[test]
fn preference_orders_kinds_then_priority_then_id() {
    let (reg, _) = registry(&[]);
    let m = Manager::new(reg, SelectionPolicy::default());
    assert_eq!(chain(&m), ["default.a", "default.b", "vendor.y", "vendor.x", "reference.cpu"]);
    assert_eq!(served_tag(&m).unwrap(), 1.0);
    m.set_policy(SelectionPolicy::default().prefer(Prefer::Vendor));
    assert_eq!(chain(&m), ["vendor.y", "vendor.x", "default.a", "default.b", "reference.cpu"]);
    assert_eq!(served_tag(&m).unwrap(), 4.0, "a new policy invalidates the cached chain");
    m.set_policy(SelectionPolicy::default().prefer(Prefer::Reference));
    assert_eq!(chain(&m), ["reference.cpu", "default.a", "default.b", "vendor.y", "vendor.x"]);
    assert_eq!(served_tag(&m).unwrap(), 5.0);
}

#[test]
fn allow_and_deny_compare_vendor_names_case_insensitively() {
    let (reg, _) = registry(&[]);
    let m = Manager::new(reg, SelectionPolicy::default().prefer(Prefer::Vendor).deny_vendors(&["X"]));
    assert_eq!(chain(&m), ["vendor.y", "default.a", "default.b", "reference.cpu"]);
    let ex = m.explain("rmsnorm_fwd", &Device::CPU, DType::F32).unwrap();
    let x = ex.entries.iter().find(|e| e.impl_id == "vendor.x").unwrap();
    assert!(x.position.is_none() && x.reason.contains("TE_FL_DENY_VENDORS"), "{ex}");
    // The allow list applies to vendor impls only.
    m.set_policy(SelectionPolicy::default().prefer(Prefer::Vendor).allow_vendors(&["y"]));
    assert_eq!(chain(&m), ["vendor.y", "default.a", "default.b", "reference.cpu"]);
    m.set_policy(SelectionPolicy::default().prefer(Prefer::Vendor).allow_vendors(&["X", "y"]).deny_vendors(&["y"]));
    assert_eq!(chain(&m), ["vendor.x", "default.a", "default.b", "reference.cpu"]);
}

#[test]
fn per_op_replaces_the_order_and_limits_fallback() {
    let (reg, fx) = registry(&[("vendor.x", Behaviour::Fail), ("reference.cpu", Behaviour::Fail)]);
    let p = SelectionPolicy::default().per_op("rmsnorm_fwd", "vendor:X|reference").unwrap();
    let m = Manager::new(reg, p);
    assert_eq!(chain(&m), ["vendor.x", "reference.cpu"]);
    match served_tag(&m) {
        Err(Error::AllFailed { failures, .. }) => {
            let ids: Vec<_> = failures.iter().map(|(i, _)| i.as_str()).collect();
            assert_eq!(ids, ["vendor.x", "reference.cpu"]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fx.hits("default.a") + fx.hits("vendor.y"), 0, "impls not named must never run");
    // impl: tokens pick exactly one impl; order follows the tokens, not priority.
    m.set_policy(SelectionPolicy::default().per_op("rmsnorm_fwd", "impl:default.b|vendor|flagos").unwrap());
    assert_eq!(chain(&m), ["default.b", "vendor.y", "vendor.x", "default.a"]);
    assert_eq!(served_tag(&m).unwrap(), 2.0);
}

#[test]
fn strict_mode_returns_the_first_error() {
    let (reg, fx) = registry(&[("default.a", Behaviour::Fail)]);
    let m = Manager::new(reg, SelectionPolicy::default().strict(true));
    match served_tag(&m) {
        Err(Error::DeviceFailure { reason, .. }) => assert_eq!(reason, "default.a refuses"),
        other => panic!("{other:?}"),
    }
    assert_eq!(fx.hits("default.b"), 0);
    // Strict mode does not skip a failing impl either: it is tried, and fails, every time.
    assert!(served_tag(&m).is_err());
    assert_eq!(fx.hits("default.a"), 2);
}

#[test]
fn a_call_with_only_empty_outputs_runs_no_kernel() {
    use tefl_core::catalogue::{FusedRopeForward, QkvLayout, RopeArgs, RopeOut};
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let mut reg = Registry::new();
    let rope_impl = OpImpl::new::<FusedRopeForward>("vendor.rope", Kind::Vendor, move |_, a: &RopeArgs| {
        h.fetch_add(1, Ordering::Relaxed);
        Ok(RopeOut { y: a.x.clone() })
    });
    reg.register_impl(rope_impl).unwrap();
    let m = Manager::new(reg, SelectionPolicy::default());
    let rope = |shape: [usize; 4]| {
        let x = Tensor::zeros(shape, DType::BF16, &Device::CPU).unwrap();
        let freqs = Tensor::zeros([8, 8], DType::F32, &Device::CPU).unwrap();
        let args =
            RopeArgs { x, freqs, cu_seqlens: None, start_positions: None, layout: QkvLayout::Bshd, interleaved: false };
        m.call::<FusedRopeForward>(&args)
    };
    // No sequences: the impl the chain picked answers (and is counted) without its kernel.
    let y = rope([0, 4, 2, 8]).unwrap().y;
    assert_eq!((y.shape(), y.dtype()), (&[0usize, 4, 2, 8][..], DType::BF16));
    assert_eq!(hits.load(Ordering::Relaxed), 0);
    assert_eq!(m.stats_of("fused_rope_forward", "vendor.rope").unwrap().calls, 1);
    // A call with something to compute reaches it.
    rope([1, 4, 2, 8]).unwrap();
    assert_eq!(hits.load(Ordering::Relaxed), 1);
    // So does one whose outputs are not all listed as empty (rmsnorm's optional FP8 outputs).
    let (reg, fx) = registry(&[]);
    let m = Manager::new(reg, SelectionPolicy::default());
    let empty = RmsNormFwdArgs { x: Tensor::from_slice(&[0.0f32; 0], [0, 3], DType::F32).unwrap(), ..args() };
    assert_eq!(m.call::<RmsNormFwd>(&empty).unwrap().y.shape(), &[0, 3]);
    assert_eq!(fx.hits(&chain(&m)[0]), 1);
}

#[test]
fn fallback_logs_and_counters() {
    let log = CapturedLog::new();
    let (reg, _) = registry(&[("default.a", Behaviour::Fail)]);
    log.capture(LogLevel::Info, || {
        let m = Manager::new(reg, SelectionPolicy::default());
        assert_eq!(served_tag(&m).unwrap(), 2.0);
        let s = m.stats_of("rmsnorm_fwd", "default.b").unwrap();
        assert_eq!((s.calls, s.fallbacks, s.failures), (1, 1, 0));
        let s = m.stats_of("rmsnorm_fwd", "default.a").unwrap();
        assert_eq!((s.calls, s.failures), (0, 1));
        assert_eq!(m.recent_failures().len(), 1);
    });
    let msgs = log.messages();
    let expect = [
        ("INFO", "Registered impl_ids: ['default.a', 'default.b', 'reference.cpu', 'vendor.x', 'vendor.y']"),
        ("WARNING", "Implementation 'default.a' failed for op 'rmsnorm_fwd': device test: default.a refuses"),
        ("INFO", "Op 'rmsnorm_fwd' fallback to 'default.b' (kind=flagos, vendor=None)"),
        ("INFO", "Op 'rmsnorm_fwd' using 'default.b' (kind=flagos, vendor=None)"),
    ];
    let got: Vec<(&str, &str)> = msgs.iter().map(|(l, m)| (l.as_str(), m.as_str())).collect();
    assert_eq!(got, expect);
    for line in log.lines() {
        assert!(line.starts_with('[') && line.contains(" TE-FL ") && line.contains(".rs:"), "{line}");
    }
}

#[test]
fn using_is_logged_once_and_switched_on_change() {
    let log = CapturedLog::new();
    let (reg, _) = registry(&[]);
    log.capture(LogLevel::Info, || {
        let m = Manager::new(reg, SelectionPolicy::default());
        for _ in 0..5 {
            served_tag(&m).unwrap();
        }
        m.set_policy(SelectionPolicy::default().prefer(Prefer::Vendor));
        for _ in 0..5 {
            served_tag(&m).unwrap();
        }
        {
            let _s = m.scoped(PolicyOverride::new().prefer(Prefer::Reference));
            served_tag(&m).unwrap();
        }
    });
    let msgs: Vec<String> = log.messages().into_iter().map(|(_, m)| m).filter(|m| m.starts_with("Op ")).collect();
    assert_eq!(
        msgs,
        [
            "Op 'rmsnorm_fwd' using 'default.a' (kind=flagos, vendor=None)",
            "Op 'rmsnorm_fwd' switched from 'default.a' to 'vendor.y' (kind=vendor, vendor=Y)",
            "Op 'rmsnorm_fwd' switched from 'vendor.y' to 'reference.cpu' (kind=reference, vendor=None)",
        ]
    );
}

#[test]
fn failure_memory_skips_then_retries() {
    let (reg, fx) = registry(&[("default.a", Behaviour::Fail)]);
    let m = Manager::new(reg, SelectionPolicy::default());
    assert_eq!(served_tag(&m).unwrap(), 2.0);
    assert_eq!(fx.hits("default.a"), 1);
    // The next 8 calls pass it over without calling it.
    for _ in 0..8 {
        assert_eq!(served_tag(&m).unwrap(), 2.0);
    }
    assert_eq!(fx.hits("default.a"), 1);
    assert_eq!(m.stats_of("rmsnorm_fwd", "default.a").unwrap().skipped, 8);
    // Then it is retried once, fails again, and is passed over for twice as long.
    served_tag(&m).unwrap();
    assert_eq!(fx.hits("default.a"), 2);
    for _ in 0..16 {
        served_tag(&m).unwrap();
    }
    assert_eq!(fx.hits("default.a"), 2);
    served_tag(&m).unwrap();
    assert_eq!(fx.hits("default.a"), 3);
    // Forgetting failures makes it eligible at once.
    m.reset_failures();
    served_tag(&m).unwrap();
    assert_eq!(fx.hits("default.a"), 4);
}

#[test]
fn an_impl_out_of_memory_falls_back_but_keeps_its_place() {
    let (reg, fx) = registry(&[("default.a", Behaviour::OutOfMemory)]);
    let m = Manager::new(reg, SelectionPolicy::default());
    for call in 1..=5 {
        assert_eq!(served_tag(&m).unwrap(), 2.0);
        // Tried on every call: running out of memory is not remembered against it.
        assert_eq!(fx.hits("default.a"), call);
    }
    let stats = m.stats_of("rmsnorm_fwd", "default.a").unwrap();
    assert_eq!((stats.failures, stats.skipped), (5, 0));
    assert_eq!(m.stats_of("rmsnorm_fwd", "default.b").unwrap().fallbacks, 5);
    let f = &m.recent_failures()[0];
    assert!(f.impl_id == "default.a" && f.error.contains("out of memory"), "{}", f.error);
    // Another failure of the same impl is still remembered.
    let (reg, fx) = registry(&[("default.a", Behaviour::Fail)]);
    let m = Manager::new(reg, SelectionPolicy::default());
    served_tag(&m).unwrap();
    served_tag(&m).unwrap();
    assert_eq!(fx.hits("default.a"), 1);
}

#[test]
fn a_backend_configuration_error_is_returned_not_fallen_back_from() {
    let (reg, fx) = registry(&[("default.a", Behaviour::BadConfig)]);
    let m = Manager::new(reg, SelectionPolicy::default());
    for call in 1..=3 {
        match served_tag(&m) {
            Err(Error::Config { variable: "TEFL_TEST_KNOB", token, .. }) => assert_eq!(token, "bogus"),
            other => panic!("expected the configuration error, got {other:?}"),
        }
        // Tried on every call (not remembered as a failure), and nothing after it ran.
        assert_eq!(fx.hits("default.a"), call);
        assert_eq!(fx.hits("default.b"), 0);
    }
    let stats = m.stats_of("rmsnorm_fwd", "default.a").unwrap();
    assert_eq!((stats.failures, stats.skipped), (0, 0));
    assert_eq!(m.stats_of("rmsnorm_fwd", "default.b").unwrap().fallbacks, 0);
    assert!(m.recent_failures().is_empty());
}

#[test]
fn a_call_that_only_ran_out_of_memory_returns_that_error() {
    let all = ["default.a", "default.b", "vendor.x", "vendor.y", "reference.cpu"];
    let oom: Vec<_> = all.iter().map(|&i| (i, Behaviour::OutOfMemory)).collect();
    let m = Manager::new(registry(&oom).0, SelectionPolicy::default());
    // The first impl's error: the call's cause, not a list of five.
    match served_tag(&m) {
        Err(Error::OutOfMemory { what, .. }) => assert_eq!(what, "default.a's workspace"),
        other => panic!("{other:?}"),
    }
    // With any other failure among them, the list.
    let mut mixed = oom.clone();
    mixed[3].1 = Behaviour::Fail;
    let m = Manager::new(registry(&mixed).0, SelectionPolicy::default());
    match served_tag(&m) {
        Err(Error::AllFailed { failures, .. }) => {
            assert_eq!(failures.len(), 5);
            assert!(failures[2].1.contains("vendor.y refuses"), "{failures:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn failure_records_are_bounded() {
    let (reg, _) = registry(&[
        ("default.a", Behaviour::Fail),
        ("default.b", Behaviour::Fail),
        ("vendor.x", Behaviour::Fail),
        ("vendor.y", Behaviour::Fail),
        ("reference.cpu", Behaviour::Fail),
    ]);
    let m = Manager::new(reg, SelectionPolicy::default());
    for _ in 0..200 {
        assert!(matches!(served_tag(&m), Err(Error::AllFailed { .. })));
    }
    assert_eq!(m.recent_failures().len(), tefl_core::manager::FAILURE_MEMORY);
}

#[test]
fn a_panicking_impl_is_a_failure_not_a_crash() {
    let (reg, fx) = registry(&[("default.a", Behaviour::Panic)]);
    let m = Manager::new(reg, SelectionPolicy::default());
    assert_eq!(served_tag(&m).unwrap(), 2.0);
    let f = &m.recent_failures()[0];
    assert_eq!(f.impl_id, "default.a");
    assert!(f.error.contains("panicked: default.a exploded"), "{}", f.error);
    assert_eq!(fx.hits("default.a"), 1);
    let strict = Manager::new(registry(&[("default.a", Behaviour::Panic)]).0, SelectionPolicy::default().strict(true));
    assert!(matches!(served_tag(&strict), Err(Error::ImplFailed { .. })));
}

#[test]
fn scoped_overrides_end_with_their_scope() {
    let (reg, _) = registry(&[]);
    let m = Manager::new(reg, SelectionPolicy::default());
    assert_eq!(served_tag(&m).unwrap(), 1.0);
    {
        let _a = m.scoped(PolicyOverride::new().prefer(Prefer::Vendor));
        assert_eq!(served_tag(&m).unwrap(), 4.0);
        {
            let _b = m.scoped(PolicyOverride::new().per_op("rmsnorm_fwd", "vendor:x").unwrap());
            assert_eq!(served_tag(&m).unwrap(), 3.0);
            // Another thread does not see this thread's scope.
            std::thread::scope(|s| {
                s.spawn(|| assert_eq!(served_tag(&m).unwrap(), 1.0));
            });
        }
        assert_eq!(served_tag(&m).unwrap(), 4.0);
        m.with_override(PolicyOverride::new().deny_vendors(&["y"]), || assert_eq!(served_tag(&m).unwrap(), 3.0));
    }
    assert_eq!(served_tag(&m).unwrap(), 1.0);
}

#[test]
fn explain_gives_reasons_and_validation_comes_first() {
    let (mut reg, _) = registry(&[]);
    reg.register_impl(
        OpImpl::new::<RmsNormFwd>("vendor.bf16only", Kind::Vendor, |_, _| Err(Error::invalid("t", "t", "t")))
            .vendor("z")
            .dtypes(&[DType::BF16]),
    )
    .unwrap();
    reg.register_impl(
        OpImpl::new::<RmsNormFwd>("vendor.gone", Kind::Vendor, |_, _| Err(Error::invalid("t", "t", "t")))
            .vendor("w")
            .available(|| Err("driver not found".into())),
    )
    .unwrap();
    reg.register_impl(
        OpImpl::new::<RmsNormFwd>("vendor.cuda", Kind::Vendor, |_, _| Err(Error::invalid("t", "t", "t")))
            .vendor("nvidia")
            .device(DeviceKind::CUDA),
    )
    .unwrap();
    let m = Manager::new(reg, SelectionPolicy::default());
    let ex = m.explain("rmsnorm_fwd", &Device::CPU, DType::F32).unwrap();
    let reason = |id: &str| ex.entries.iter().find(|e| e.impl_id == id).unwrap().reason.clone();
    assert!(reason("vendor.bf16only").contains("does not support f32"));
    assert!(reason("vendor.gone").contains("unavailable: driver not found"));
    assert!(reason("vendor.cuda").contains("runs on cuda"));
    assert!(reason("default.a").contains("TE_FL_PREFER=flagos"));
    let text = ex.to_string();
    assert!(text.contains("#1") && text.contains("dropped"), "{text}");
    assert!(matches!(m.explain("no_such_op", &Device::CPU, DType::F32), Err(Error::UnknownOp(_))));
    // A near miss names the op it was probably meant to be.
    let e = m.explain("rmsnorm_fwdd", &Device::CPU, DType::F32).unwrap_err().to_string();
    assert!(e.contains("did you mean rmsnorm_fwd"), "{e}");
    // On cuda only the cuda impl and the (staged) reference are candidates.
    let ex = m.explain("rmsnorm_fwd", &Device::cuda(0), DType::F32).unwrap();
    assert_eq!(ex.chain(), ["vendor.cuda", "reference.cpu"]);
    assert!(ex.entries.iter().find(|e| e.impl_id == "reference.cpu").unwrap().staged);
    // Bad arguments are rejected before any impl runs.
    let mut bad = args();
    bad.gamma = Tensor::from_slice(&[1.0f32; 4], [4], DType::F32).unwrap();
    assert!(matches!(m.call::<RmsNormFwd>(&bad), Err(Error::Shape { arg: "gamma", .. })));
}

#[test]
fn no_candidate_is_a_typed_error() {
    let m = Manager::new(Registry::new(), SelectionPolicy::default());
    match m.call::<RmsNormFwd>(&args()) {
        Err(Error::NoImplementation { op: "rmsnorm_fwd", reason, .. }) => assert!(reason.contains("no impl")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn tex_backends_force_one_backend_with_fallback() {
    let (mut reg, _) = registry(&[]);
    reg.register_vendor(VendorInfo::new("x", "cpu", "true"));
    reg.register_vendor(VendorInfo::new("ghost", "ghostdev", "ghost-smi").availability(|| Err("no ghost".into())));
    let m = Manager::new(reg, SelectionPolicy::default());
    let names: Vec<_> = m.list_backends().into_iter().map(|b| b.name).collect();
    assert_eq!(names, ["flagos", "ghost", "reference", "x", "y"]);
    assert_eq!(m.get_backend().name, "flagos");
    let ghost = m.list_backends().into_iter().find(|b| b.name == "ghost").unwrap();
    assert!(!ghost.available);
    m.set_backend("X").unwrap();
    assert_eq!(m.get_backend().name, "x");
    assert_eq!(chain(&m), ["vendor.x", "reference.cpu"]);
    assert_eq!(served_tag(&m).unwrap(), 3.0);
    m.set_backend("torch").unwrap();
    assert_eq!(chain(&m), ["reference.cpu"]);
    match m.set_backend("hygon") {
        Err(Error::BackendNotFound { name, available }) => {
            assert_eq!(name, "hygon");
            assert!(available.contains(&"x".to_string()));
        }
        other => panic!("{other:?}"),
    }
    m.set_backend("auto").unwrap();
    assert_eq!(served_tag(&m).unwrap(), 1.0);
    // Per-op routing is more specific than a forced backend.
    let p = SelectionPolicy::default().backend(Some("x")).unwrap().per_op("rmsnorm_fwd", "vendor:y").unwrap();
    m.set_policy(p);
    assert_eq!(chain(&m), ["vendor.y"]);
}

#[test]
fn unknown_names_in_the_policy_are_warnings() {
    let log = CapturedLog::new();
    log.capture(LogLevel::Info, || {
        let p = SelectionPolicy::default().per_op("rmsnorm_fwd", "vendor:acme|impl:vendor.nope|reference").unwrap();
        let m = Manager::new(registry(&[]).0, p);
        assert_eq!(served_tag(&m).unwrap(), 5.0);
    });
    let warnings: Vec<_> = log.messages().into_iter().filter(|(l, _)| l == "WARNING").map(|(_, m)| m).collect();
    assert_eq!(
        warnings,
        [
            "TE_FL_PER_OP names vendor 'acme' for op 'rmsnorm_fwd', but no such vendor is registered",
            "TE_FL_PER_OP names impl 'vendor.nope' for op 'rmsnorm_fwd', but no such impl is registered",
        ]
    );
}

// ---- host staging through a fake device ----

declare_op! {
    /// Test op: x *= factor, in place, and returns a copy of the result.
    pub struct ScaleInPlace = "test_scale_in_place";
    /// Arguments.
    pub struct ScaleInPlaceArgs {
        /// Scaled in place.
        inout x: Tensor,
        /// Factor.
        scalar factor: f32,
    }
    /// Outputs.
    pub struct ScaleInPlaceOut {
        /// A fresh copy of the scaled tensor.
        tensor copy: Tensor,
    }
    validate(a) {
        tefl_core::catalogue::check::dtype_is("test_scale_in_place", "x", &a.x, DType::F32)
    }
}

/// A device whose memory is host memory behind an opaque buffer: enough to prove that the
/// reference impl is staged through the host and in-place outputs come back.
struct FakeRuntime;
struct FakeBuffer(std::sync::Mutex<Vec<u8>>);
const FAKE: DeviceKind = DeviceKind::new("fakedev");

impl Buffer for FakeBuffer {
    fn device(&self) -> Device {
        Device::new(FAKE, 0)
    }
    fn len_bytes(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl DeviceRuntime for FakeRuntime {
    fn kind(&self) -> DeviceKind {
        FAKE
    }
    fn device_count(&self) -> usize {
        1
    }
    fn name(&self, _: u32) -> String {
        "fake".into()
    }
    fn arch(&self, _: u32) -> String {
        "fake1".into()
    }
    fn alloc(&self, _: Device, bytes: usize) -> tefl_core::Result<Arc<dyn Buffer>> {
        Ok(Arc::new(FakeBuffer(std::sync::Mutex::new(vec![0xAB; bytes]))))
    }
    fn copy_from_host(&self, dst: &dyn Buffer, src: &[u8]) -> tefl_core::Result<()> {
        dst.as_any().downcast_ref::<FakeBuffer>().unwrap().0.lock().unwrap().copy_from_slice(src);
        Ok(())
    }
    fn copy_to_host(&self, src: &dyn Buffer, dst: &mut [u8]) -> tefl_core::Result<()> {
        dst.copy_from_slice(&src.as_any().downcast_ref::<FakeBuffer>().unwrap().0.lock().unwrap());
        Ok(())
    }
    fn synchronize(&self, _: Device) -> tefl_core::Result<()> {
        Ok(())
    }
}

#[test]
fn reference_is_staged_through_the_host_for_other_devices() {
    let _ = tefl_core::device::register_device_runtime(Arc::new(FakeRuntime));
    let dev = Device::new(FAKE, 0);
    let mut reg = Registry::new();
    reg.register_impl(OpImpl::new::<ScaleInPlace>("reference.cpu", Kind::Reference, |ctx, a: &ScaleInPlaceArgs| {
        assert!(ctx.device.is_cpu(), "the reference runs on host copies");
        let mut w = a.x.host_bytes_mut()?;
        let v: &mut [f32] = bytemuck::cast_slice_mut(&mut w);
        v.iter_mut().for_each(|x| *x *= a.factor);
        drop(w);
        Ok(ScaleInPlaceOut { copy: Tensor::from_slice(&a.x.to_vec::<f32>()?, a.x.shape(), DType::F32)? })
    }))
    .unwrap();
    let m = Manager::new(reg, SelectionPolicy::default());
    let x = Tensor::from_slice(&[1.0f32, -2.0, 3.5], [3], DType::F32).unwrap().to_device(&dev).unwrap();
    let out = m.call::<ScaleInPlace>(&ScaleInPlaceArgs { x: x.clone(), factor: 2.0 }).unwrap();
    assert_eq!(out.copy.device(), dev, "outputs come back to the call's device");
    assert_eq!(out.copy.to_vec::<f32>().unwrap(), [2.0, -4.0, 7.0]);
    assert_eq!(x.to_vec::<f32>().unwrap(), [2.0, -4.0, 7.0], "in-place outputs are written back");
    // Mixed devices are rejected, naming the argument.
    let host = Tensor::from_slice(&[1.0f32], [1], DType::F32).unwrap();
    let y = Tensor::from_slice(&[1.0f32], [1], DType::F32).unwrap().to_device(&dev).unwrap();
    let bad =
        RmsNormFwdArgs { scale: None, x: host, gamma: y, eps: 1e-5, zero_centered_gamma: false, out_dtype: DType::F32 };
    assert!(matches!(m.call::<RmsNormFwd>(&bad), Err(Error::DeviceMismatch { arg: "gamma", .. })));
}

// ---- concurrency ----

declare_op! {
    /// Test op: reports which impl served it.
    pub struct Probe = "test_probe";
    /// Arguments.
    pub struct ProbeArgs {
        /// Only its dtype matters.
        tensor x: Tensor,
    }
    /// Outputs.
    pub struct ProbeOut {
        /// The serving impl's number.
        scalar served: u32,
    }
    validate(a) { Ok(()) }
}

#[test]
fn eight_threads_hammering_get_the_right_impl_and_exact_counters() {
    const CALLS: usize = 100_000;
    let mut reg = Registry::new();
    type Spec = (&'static str, Kind, Option<&'static str>, &'static [DType], u32);
    let specs: [Spec; 4] = [
        ("vendor.f32", Kind::Vendor, Some("a"), &[DType::F32], 1),
        ("vendor.bf16", Kind::Vendor, Some("b"), &[DType::BF16], 2),
        ("default.any", Kind::Default, None, &[], 3),
        ("reference.cpu", Kind::Reference, None, &[], 4),
    ];
    for (id, kind, vendor, dtypes, tag) in specs {
        let mut i = OpImpl::new::<Probe>(id, kind, move |_, _| Ok(ProbeOut { served: tag })).dtypes(dtypes);
        if let Some(v) = vendor {
            i = i.vendor(v);
        }
        reg.register_impl(i).unwrap();
    }
    let m = Manager::new(reg, SelectionPolicy::default().prefer(Prefer::Vendor));
    let tensors = [
        Tensor::from_slice(&[1.0f32], [1], DType::F32).unwrap(),
        Tensor::from_slice(&[1.0f32], [1], DType::BF16).unwrap(),
        Tensor::from_slice(&[1.0f32], [1], DType::F16).unwrap(),
    ];
    std::thread::scope(|s| {
        for t in 0..8usize {
            let m = &m;
            let tensors = &tensors;
            s.spawn(move || {
                // Threads 6 and 7 prefer the reference inside a scope of their own.
                let _scope = (t >= 6).then(|| m.scoped(PolicyOverride::new().prefer(Prefer::Reference)));
                for i in 0..CALLS {
                    let which = (t + i) % 3;
                    let got = m.call::<Probe>(&ProbeArgs { x: tensors[which].clone() }).unwrap().served;
                    let want = if t >= 6 { 4 } else { [1, 2, 3][which] };
                    assert_eq!(got, want, "thread {t} call {i}");
                }
            });
        }
    });
    // Per dtype: threads 0..6 make CALLS calls each, spread evenly over the three dtypes.
    let per_dtype = |d: usize| (0..6usize).map(|t| (0..CALLS).filter(|i| (t + i) % 3 == d).count() as u64).sum::<u64>();
    let calls = |id: &str| m.stats_of("test_probe", id).unwrap().calls;
    assert_eq!(calls("vendor.f32"), per_dtype(0));
    assert_eq!(calls("vendor.bf16"), per_dtype(1));
    assert_eq!(calls("default.any"), per_dtype(2));
    assert_eq!(calls("reference.cpu"), 2 * CALLS as u64);
    assert_eq!(calls("vendor.f32") + calls("vendor.bf16") + calls("default.any"), 6 * CALLS as u64);
}

#[test]
fn by_name_only_impls_serve_only_when_routed_by_id() {
    let (mut reg, _) = registry(&[]);
    let hits = Arc::new(AtomicUsize::new(0));
    reg.register_impl(
        imp("vendor.y.portable", Kind::Vendor, Some("Y"), 1000, 9.0, Behaviour::Ok, hits.clone()).by_name_only(),
    )
    .unwrap();
    let m = Manager::new(reg, SelectionPolicy::default().prefer(Prefer::Vendor));
    // Highest priority, yet outside every automatic chain, with the reason in explain.
    assert_eq!(chain(&m), ["vendor.y", "vendor.x", "default.a", "default.b", "reference.cpu"]);
    let ex = m.explain("rmsnorm_fwd", &Device::CPU, DType::F32).unwrap();
    let e = ex.entries.iter().find(|e| e.impl_id == "vendor.y.portable").unwrap();
    assert!(e.position.is_none() && e.reason.contains("only by name"), "{e:?}");
    // A `vendor` token does not name it either.
    m.set_policy(SelectionPolicy::default().per_op("rmsnorm_fwd", "vendor|reference").unwrap());
    assert_eq!(chain(&m), ["vendor.y", "vendor.x", "reference.cpu"]);
    assert_eq!(hits.load(Ordering::Relaxed), 0);
    // Routed by id, it serves.
    m.set_policy(SelectionPolicy::default().per_op("rmsnorm_fwd", "impl:vendor.y.portable|reference").unwrap());
    assert_eq!(chain(&m), ["vendor.y.portable", "reference.cpu"]);
    assert_eq!(served_tag(&m).unwrap(), 9.0);
    assert_eq!(
        m.call_impl::<RmsNormFwd>("vendor.y.portable", &args()).unwrap().rsigma.to_vec::<f32>().unwrap()[0],
        9.0
    );
}

#[test]
fn explain_shows_the_kernel_a_vendor_names_for_its_impls_in_the_chain() {
    let (mut reg, _) = registry(&[]);
    let kernels = |impl_id: &str, op: &str, _: Device, dtype: DType| match (impl_id, dtype) {
        ("vendor.acme", DType::BF16) => Some(format!("{op}: the bf16 kernel")),
        ("vendor.acme", DType::F16) => panic!("the vendor's description panicked"),
        _ => None,
    };
    reg.register_vendor(VendorInfo::new("acme", "cpu", "true").kernels(kernels));
    for id in ["vendor.acme", "vendor.acme.other"] {
        reg.register_impl(
            OpImpl::new::<RmsNormFwd>(id, Kind::Vendor, |_, _| Err(Error::invalid("t", "t", "t"))).vendor("acme"),
        )
        .unwrap();
    }
    let m = Manager::new(reg, SelectionPolicy::default());
    let kernel = |dtype: DType, id: &str| {
        let ex = m.explain("rmsnorm_fwd", &Device::CPU, dtype).unwrap();
        (ex.entries.iter().find(|e| e.impl_id == id).unwrap().kernel.clone(), ex.to_string())
    };
    let (k, text) = kernel(DType::BF16, "vendor.acme");
    assert_eq!(k.as_deref(), Some("rmsnorm_fwd: the bf16 kernel"));
    assert!(text.contains("kernel: rmsnorm_fwd: the bf16 kernel"), "{text}");
    // Another impl of the vendor, another dtype, and a panicking description: nothing said.
    assert_eq!(kernel(DType::BF16, "vendor.acme.other").0, None);
    assert_eq!(kernel(DType::F32, "vendor.acme").0, None);
    let (k, text) = kernel(DType::F16, "vendor.acme");
    assert_eq!(k, None);
    assert!(!text.contains("kernel:"), "{text}");
}
