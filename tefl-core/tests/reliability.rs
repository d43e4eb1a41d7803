//! Regression tests for the defects hostile-user testing found in the dispatch core (issue
//! 12): scoped overrides, failure memory, contained availability checks, per-call support
//! checks, output contracts of run-time impls, aliasing, huge sizes and messages. Each test
//! names the defect it pins.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tefl_core::catalogue::{
    AmaxAlgo, DelayedScalingArgs, FusedAmaxAndScaleUpdate, RmsNormFwd, RmsNormFwdArgs, RmsNormFwdOut,
};
use tefl_core::logging::CapturedLog;
use tefl_core::policy::LogLevel;
use tefl_core::{
    BackendImplKind as Kind, DType, Device, Error, Manager, OpImpl, PolicyOverride, Prefer, Registry, SelectionPolicy,
    Tensor, VendorInfo,
};

fn args(rows: usize) -> RmsNormFwdArgs {
    let n = 4;
    RmsNormFwdArgs {
        scale: None,
        x: Tensor::from_slice(&vec![1.5f32; rows * n], [rows, n], DType::F32).unwrap(),
        gamma: Tensor::from_slice(&[1.0f32; 4], [n], DType::F32).unwrap(),
        eps: 1e-5,
        zero_centered_gamma: false,
        out_dtype: DType::F32,
    }
}

/// An impl that writes `tag` into rsigma (so the caller sees who served) with a valid output.
fn tagged(id: &str, kind: Kind, vendor: Option<&str>, tag: f32, hits: Arc<AtomicUsize>) -> OpImpl {
    let i = OpImpl::new::<RmsNormFwd>(id, kind, move |_, a: &RmsNormFwdArgs| {
        hits.fetch_add(1, Ordering::Relaxed);
        Ok(RmsNormFwdOut {
            amax: None,
            scale_inv: None,
            y: a.x.clone(),
            rsigma: Tensor::from_slice(&vec![tag; a.x.rows()], [a.x.rows()], DType::F32)?,
        })
    });
    match vendor {
        Some(v) => i.vendor(v),
        None => i,
    }
}

fn failing(id: &str, vendor: &str, hits: Arc<AtomicUsize>) -> OpImpl {
    OpImpl::new::<RmsNormFwd>(id, Kind::Vendor, move |_, _| {
        hits.fetch_add(1, Ordering::Relaxed);
        Err(Error::DeviceFailure { device: "test".into(), reason: "always fails".into() })
    })
    .vendor(vendor)
}

fn tag(m: &Manager, rows: usize) -> Result<f32, Error> {
    Ok(m.call::<RmsNormFwd>(&args(rows))?.rsigma.to_vec::<f32>()?[0])
}

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// Defect 2a: scopes dropped out of order must not leave a stale chain.
#[test]
fn scopes_dropped_out_of_order_leave_no_stale_chain() {
    let mut reg = Registry::new();
    reg.register_impl(tagged("vendor.a", Kind::Vendor, Some("a"), 7.0, counter())).unwrap();
    reg.register_impl(tagged("reference.cpu", Kind::Reference, None, 1.0, counter())).unwrap();
    let m = Manager::new(reg, SelectionPolicy::default());
    let ga = m.scoped(PolicyOverride::new().per_op("rmsnorm_fwd", "impl:vendor.a").unwrap());
    assert_eq!(tag(&m, 2).unwrap(), 7.0);
    let gb = m.scoped(PolicyOverride::new().prefer(Prefer::Reference));
    assert_eq!(tag(&m, 2).unwrap(), 7.0, "the per-op order of the outer scope still applies");
    drop(ga);
    let ex = m.explain("rmsnorm_fwd", &Device::CPU, DType::F32).unwrap();
    assert_eq!(ex.chain(), ["reference.cpu", "vendor.a"]);
    assert_eq!(tag(&m, 2).unwrap(), 1.0, "the call must follow what explain says");
    drop(gb);
    // Back to the base policy (flagos first, then vendor).
    assert_eq!(tag(&m, 2).unwrap(), 7.0);
}

/// Defect 2b: a scope per call must not defeat failure memory (one memory per impl).
#[test]
fn failure_memory_survives_a_scope_per_call() {
    let hits = counter();
    let mut reg = Registry::new();
    reg.register_impl(failing("vendor.bad", "bad", hits.clone())).unwrap();
    reg.register_impl(tagged("reference.cpu", Kind::Reference, None, 1.0, counter())).unwrap();
    let log = CapturedLog::new();
    log.capture(LogLevel::Info, || {
        let m = Manager::new(reg, SelectionPolicy::default());
        for i in 0..1000 {
            // Alternate between two equal scopes and a different one: all share the memory.
            let o = if i % 3 == 0 {
                PolicyOverride::new().prefer(Prefer::Vendor)
            } else {
                PolicyOverride::new().prefer(Prefer::Vendor).strict(false)
            };
            assert_eq!(m.with_override(o, || tag(&m, 2)).unwrap(), 1.0);
        }
    });
    let tries = hits.load(Ordering::Relaxed);
    assert!(tries <= 10, "the failing impl ran {tries} times in 1000 calls");
    let warnings = log.messages().iter().filter(|(l, _)| l == "WARNING").count();
    assert_eq!(warnings, tries, "one WARNING per real attempt");
}

/// Defect 3: a panicking availability check (impl or vendor) means unavailable.
#[test]
fn panicking_availability_checks_are_contained() {
    let mut reg = Registry::new();
    reg.register_impl(
        tagged("vendor.p", Kind::Vendor, Some("p"), 3.0, counter()).available(|| panic!("probe exploded")),
    )
    .unwrap();
    reg.register_vendor(VendorInfo::new("vp", "cpu", "true").availability(|| panic!("vendor probe exploded")));
    reg.register_impl(tagged("vendor.vp", Kind::Vendor, Some("vp"), 4.0, counter())).unwrap();
    reg.register_impl(tagged("reference.cpu", Kind::Reference, None, 1.0, counter())).unwrap();
    let m = Manager::new(reg, SelectionPolicy::default().prefer(Prefer::Vendor));
    assert_eq!(tag(&m, 2).unwrap(), 1.0);
    let ex = m.explain("rmsnorm_fwd", &Device::CPU, DType::F32).unwrap();
    assert_eq!(ex.chain(), ["reference.cpu"]);
    let p = ex.entries.iter().find(|e| e.impl_id == "vendor.p").unwrap();
    assert!(p.reason.contains("panicked") && p.reason.contains("probe exploded"), "{ex}");
    let list = m.list_backends();
    let vp = list.iter().find(|b| b.name == "vp").unwrap();
    assert!(!vp.available && vp.unavailable_reason.as_deref().unwrap().contains("vendor probe exploded"));
}

/// Defect 9: a shape-specific refusal is "not supported", not a failure remembered against
/// every other shape.
#[test]
fn shape_refusals_do_not_send_other_shapes_to_the_fallback() {
    let hits = counter();
    let h2 = hits.clone();
    let mut reg = Registry::new();
    reg.register_impl(
        tagged("vendor.v", Kind::Vendor, Some("v"), 5.0, hits.clone())
            .supports_args::<RmsNormFwd>(|a| if a.x.rows() == 3 { Err("no 3-row kernel".into()) } else { Ok(()) }),
    )
    .unwrap();
    // A second vendor impl that refuses at kernel time with Error::Unsupported.
    reg.register_impl(
        OpImpl::new::<RmsNormFwd>("vendor.w", Kind::Vendor, move |_, a: &RmsNormFwdArgs| {
            h2.fetch_add(1, Ordering::Relaxed);
            if a.x.rows() == 5 {
                return Err(Error::Unsupported {
                    op: "rmsnorm_fwd",
                    impl_id: "vendor.w".into(),
                    reason: "tiles do not fit".into(),
                });
            }
            Ok(RmsNormFwdOut {
                amax: None,
                scale_inv: None,
                y: a.x.clone(),
                rsigma: Tensor::from_slice(&vec![6.0f32; a.x.rows()], [a.x.rows()], DType::F32)?,
            })
        })
        .vendor("w")
        .priority(10),
    )
    .unwrap();
    reg.register_impl(tagged("reference.cpu", Kind::Reference, None, 1.0, counter())).unwrap();
    let m = Manager::new(reg, SelectionPolicy::default().prefer(Prefer::Vendor));
    let mut served = [0usize; 8];
    for _ in 0..10 {
        served[tag(&m, 3).unwrap() as usize] += 1;
        for _ in 0..20 {
            served[tag(&m, 2).unwrap() as usize] += 1;
        }
        // vendor.w refuses 5 rows at kernel time: served by vendor.v.
        served[tag(&m, 5).unwrap() as usize] += 1;
    }
    assert_eq!(served[6], 10 + 200, "vendor.w (priority 10) serves the 3- and 2-row calls");
    assert_eq!(served[5], 10, "vendor.v serves the 5-row calls vendor.w does not support");
    assert_eq!(served[1], 0, "nothing fell to the reference");
    let w = m.stats_of("rmsnorm_fwd", "vendor.w").unwrap();
    assert_eq!((w.failures, w.unsupported, w.skipped), (0, 10, 0));
    let v = m.stats_of("rmsnorm_fwd", "vendor.v").unwrap();
    assert_eq!(v.failures, 0);
    assert!(m.recent_failures().is_empty());
    // explain_call shows the refusal for the arguments at hand.
    let ex = m.explain_call::<RmsNormFwd>(&args(3)).unwrap();
    assert_eq!(ex.chain(), ["vendor.w", "reference.cpu"]);
    let e = ex.entries.iter().find(|e| e.impl_id == "vendor.v").unwrap();
    assert!(e.position.is_none() && e.reason.contains("no 3-row kernel"), "{ex}");
    assert_eq!(m.explain_call::<RmsNormFwd>(&args(2)).unwrap().chain(), ["vendor.w", "vendor.v", "reference.cpu"]);
    // When nothing supports the call, the error says why, per impl.
    let only_v = Manager::new(
        {
            let mut r = Registry::new();
            r.register_impl(
                tagged("vendor.v", Kind::Vendor, Some("v"), 5.0, counter())
                    .supports_args::<RmsNormFwd>(|_| Err("never".into())),
            )
            .unwrap();
            r
        },
        SelectionPolicy::default(),
    );
    match tag(&only_v, 2) {
        Err(Error::NoImplementation { reason, .. }) => assert!(reason.contains("never"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// Defect 6: outputs of impls that are not compiled in are checked against the op's contract.
#[test]
fn run_time_impl_outputs_are_checked_against_the_contract() {
    type Make = fn(&RmsNormFwdArgs) -> tefl_core::Result<RmsNormFwdOut>;
    let cases: [(Make, &str); 4] = [
        (
            |a| {
                Ok(RmsNormFwdOut {
                    amax: None,
                    scale_inv: None,
                    y: Tensor::zeros([1], DType::F32, &Device::CPU)?,
                    rsigma: Tensor::zeros([a.x.rows()], DType::F32, &Device::CPU)?,
                })
            },
            "output 'y' is [1] of f32",
        ),
        (
            |a| {
                Ok(RmsNormFwdOut {
                    amax: None,
                    scale_inv: None,
                    y: Tensor::zeros(a.x.shape(), DType::I32, &Device::CPU)?,
                    rsigma: Tensor::zeros([a.x.rows()], DType::F32, &Device::CPU)?,
                })
            },
            "output 'y' is [2, 4] of i32",
        ),
        (
            |a| {
                Ok(RmsNormFwdOut {
                    amax: None,
                    scale_inv: None,
                    y: a.x.clone(),
                    rsigma: Tensor::zeros([a.x.rows()], DType::BF16, &Device::CPU)?,
                })
            },
            "output 'rsigma'",
        ),
        (
            |a| Ok(RmsNormFwdOut { amax: None, scale_inv: None, y: a.x.clone(), rsigma: a.x.clone() }),
            "output 'rsigma' is [2, 4]",
        ),
    ];
    for (make, want) in cases {
        let mut reg = Registry::new();
        reg.register_impl(OpImpl::new::<RmsNormFwd>("vendor.liar", Kind::Vendor, move |_, a| make(a)).vendor("liar"))
            .unwrap();
        reg.register_impl(tagged("reference.cpu", Kind::Reference, None, 1.0, counter())).unwrap();
        let m = Manager::new(reg, SelectionPolicy::default().prefer(Prefer::Vendor));
        assert_eq!(tag(&m, 2).unwrap(), 1.0, "the reference serves after the contract violation");
        let f = m.recent_failures();
        assert_eq!(f.len(), 1);
        assert!(f[0].impl_id == "vendor.liar" && f[0].error.contains(want), "{} should say {want}", f[0].error);
    }
}

/// Defect 11: in-place arguments aliasing another argument are rejected, naming both.
#[test]
fn aliasing_in_place_arguments_is_a_named_error() {
    let m = Manager::new(Registry::new(), SelectionPolicy::default());
    let h = Tensor::from_slice(&[1.0f32, 2.0], [2, 1], DType::F32).unwrap();
    let s = Tensor::from_slice(&[1.0f32], [1], DType::F32).unwrap();
    let a = DelayedScalingArgs {
        amax_history: h.clone(),
        scale: s.clone(),
        scale_inv: s.clone(),
        fp8_max: 448.0,
        margin: 0.0,
        algo: AmaxAlgo::Max,
    };
    match m.call::<FusedAmaxAndScaleUpdate>(&a) {
        Err(Error::InvalidArgument { arg: "scale_inv", reason, .. }) => {
            assert!(reason.contains("'scale'"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // A reshape of the same storage is the same storage.
    let a2 = DelayedScalingArgs { scale_inv: s.reshape([1, 1]).unwrap().reshape([1]).unwrap(), ..a.clone() };
    assert!(matches!(m.call::<FusedAmaxAndScaleUpdate>(&a2), Err(Error::InvalidArgument { arg: "scale_inv", .. })));
    // The history passed as the scale is caught by validation's shape checks or the aliasing check.
    let a3 = DelayedScalingArgs { scale_inv: Tensor::from_slice(&[1.0f32], [1], DType::F32).unwrap(), ..a };
    assert!(
        matches!(m.call::<FusedAmaxAndScaleUpdate>(&a3), Err(Error::NoImplementation { .. })),
        "distinct tensors pass"
    );
}

/// Aliasing is judged by memory, not by storage object: two buffers over the same bytes (two
/// DLPack imports of one NumPy array or torch tensor, say) alias, and so do partly overlapping
/// ones; disjoint ones do not.
#[test]
fn aliasing_is_judged_by_memory_ranges() {
    let m = Manager::new(Registry::new(), SelectionPolicy::default());
    // 64 bytes of host memory, 8-byte aligned, that outlive every tensor below.
    let mut words = vec![0u64; 8];
    let base = words.as_mut_ptr().cast::<u8>();
    let view = |offset: usize, shape: &[usize]| {
        let bytes = shape.iter().product::<usize>() * 4;
        // SAFETY: `words` holds 64 bytes that outlive the tensors (dropped at the end of the
        // test, after them), offset + bytes <= 64, and only the calls below touch them.
        let buf = unsafe { tefl_core::device::external_host_buffer(base.add(offset), bytes, Box::new(())) }.unwrap();
        Tensor::from_buffer(buf, shape, DType::F32).unwrap()
    };
    let args = |h: Tensor, s: Tensor, si: Tensor| DelayedScalingArgs {
        amax_history: h,
        scale: s,
        scale_inv: si,
        fp8_max: 448.0,
        margin: 0.0,
        algo: AmaxAlgo::Max,
    };
    // scale and scale_inv: two buffers at one address.
    match m.call::<FusedAmaxAndScaleUpdate>(&args(view(0, &[4, 1]), view(16, &[1]), view(16, &[1]))) {
        Err(Error::InvalidArgument { arg: "scale_inv", reason, .. }) => assert!(reason.contains("'scale'"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // scale inside the history's 16 bytes.
    match m.call::<FusedAmaxAndScaleUpdate>(&args(view(0, &[4, 1]), view(8, &[1]), view(24, &[1]))) {
        Err(Error::InvalidArgument { arg: "scale", reason, .. }) => {
            assert!(reason.contains("'amax_history'"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // The history's 16 bytes and the two scalars just past them: past the aliasing check (no
    // impl is registered).
    assert!(
        matches!(
            m.call::<FusedAmaxAndScaleUpdate>(&args(view(0, &[4, 1]), view(16, &[1]), view(24, &[1]))),
            Err(Error::NoImplementation { .. })
        ),
        "adjacent tensors pass"
    );
    drop(words);
}

/// Defect 4: huge sizes are typed errors, never an abort or a panic.
#[test]
fn huge_tensors_are_typed_errors() {
    match Tensor::zeros([1usize << 61], DType::U8, &Device::CPU) {
        Err(Error::OutOfMemory { bytes, what, .. }) => {
            assert_eq!(bytes, 1 << 61);
            assert!(what.contains("[2305843009213693952]"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(Tensor::zeros([1usize << 62, 4], DType::F32, &Device::CPU), Err(Error::Tensor(_))));
    // Elements that exist but whose bytes no allocation can have: out of memory, naming the
    // tensor (an output sized by an op meets this, and the error says which output).
    match Tensor::zeros([1usize << 62], DType::F32, &Device::CPU) {
        Err(Error::OutOfMemory { bytes, what, .. }) => {
            assert_eq!(bytes, usize::MAX);
            assert!(what.contains("f32 tensor of shape [4611686018427387904]"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(Tensor::uninit([1usize << 62], DType::F32, &Device::CPU), Err(Error::OutOfMemory { .. })));
    let empty = Tensor::zeros([0], DType::F32, &Device::CPU).unwrap();
    let r = Tensor::from_buffer(empty.buffer().clone(), [1usize << 62], DType::F32);
    assert!(matches!(r, Err(Error::Tensor(_))), "{r:?}");
}

/// Defect 13: messages quote what the user typed, cut long values, do not repeat prefixes,
/// and suggest the catalogue name.
#[test]
fn messages_are_short_and_say_what_was_typed() {
    let get = |vars: Vec<(&'static str, String)>| {
        move |k: &'static str| Ok(vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
    };
    let e = SelectionPolicy::from_lookup(&get(vec![("TE_BACKEND", "amd".into()), ("TE_PLUGIN", " Torch ".into())]))
        .unwrap_err();
    assert!(matches!(&e, Error::Config { variable: "TE_PLUGIN", token, .. } if token == "Torch"), "{e}");
    let long = format!("rmsnorm_fwd={}", "vendor:x|".repeat(11_000));
    let e = SelectionPolicy::from_lookup(&get(vec![("TE_FL_PER_OP", long)])).unwrap_err();
    assert!(e.to_string().len() < 1000, "{} chars", e.to_string().len());
    let e = SelectionPolicy::from_lookup(&get(vec![(
        "TE_FL_PER_OP",
        "rmsnorm_fwd=vendor:acme|flagos;rope_fwd=flagos|reference".into(),
    )]))
    .unwrap_err();
    assert!(e.to_string().contains("did you mean 'fused_rope_forward'"), "{e}");
    // TEX wording of an unknown backend.
    let m = Manager::new(Registry::new(), SelectionPolicy::default());
    let e = m.set_backend("hygon").unwrap_err();
    assert_eq!(e.to_string(), "Backend 'hygon' not found. Available backends: ['reference']");
    // A panic is logged once with its message, without the prefix twice.
    let log = CapturedLog::new();
    log.capture(LogLevel::Info, || {
        let mut reg = Registry::new();
        reg.register_impl(OpImpl::new::<RmsNormFwd>("x", Kind::Default, |_, _| panic!("boom"))).unwrap();
        reg.register_impl(tagged("reference.cpu", Kind::Reference, None, 1.0, counter())).unwrap();
        let m = Manager::new(reg, SelectionPolicy::default());
        tag(&m, 2).unwrap();
    });
    let warn: Vec<String> = log.messages().into_iter().filter(|(l, _)| l == "WARNING").map(|(_, m)| m).collect();
    assert_eq!(warn, ["Implementation 'x' failed for op 'rmsnorm_fwd': panicked: boom"]);
}

/// Defect 3's class: every call into a backend's device runtime is contained too.
#[test]
fn a_panicking_device_runtime_is_contained() {
    use tefl_core::DeviceKind;
    use tefl_core::device::{Buffer, DeviceRuntime};

    struct Panicky;
    impl DeviceRuntime for Panicky {
        fn kind(&self) -> DeviceKind {
            DeviceKind::new("panicky")
        }
        fn device_count(&self) -> usize {
            panic!("count exploded")
        }
        fn name(&self, _: u32) -> String {
            panic!("name exploded")
        }
        fn arch(&self, _: u32) -> String {
            panic!("arch exploded")
        }
        fn alloc(&self, _: Device, _: usize) -> tefl_core::Result<Arc<dyn Buffer>> {
            panic!("alloc exploded")
        }
        fn copy_from_host(&self, _: &dyn Buffer, _: &[u8]) -> tefl_core::Result<()> {
            panic!("copy exploded")
        }
        fn copy_to_host(&self, _: &dyn Buffer, _: &mut [u8]) -> tefl_core::Result<()> {
            panic!("copy exploded")
        }
        fn synchronize(&self, _: Device) -> tefl_core::Result<()> {
            panic!("sync exploded")
        }
    }
    tefl_core::device::register_device_runtime(Arc::new(Panicky)).unwrap();
    let dev = Device::new(DeviceKind::new("panicky"), 0);
    assert!(!dev.is_available());
    let _ = Device::best_available();
    match Tensor::zeros([4], DType::F32, &dev) {
        Err(Error::DeviceFailure { reason, .. }) => assert!(reason.contains("alloc exploded"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let rt = tefl_core::device::runtime(dev.kind).unwrap();
    assert_eq!(rt.name(0), "unknown panicky device");
    assert!(rt.synchronize(dev).is_err());
}

/// Defect 2 under concurrency: threads with different scopes (pushed and dropped out of
/// order) and one failing impl never see another thread's chain, and the failing impl's
/// memory is shared (it runs a bounded number of times in all).
#[test]
fn scopes_and_failure_memory_hold_across_threads() {
    let bad_hits = counter();
    let mut reg = Registry::new();
    reg.register_impl(tagged("vendor.a", Kind::Vendor, Some("a"), 7.0, counter())).unwrap();
    reg.register_impl(failing("vendor.bad", "bad", bad_hits.clone()).priority(100)).unwrap();
    reg.register_impl(tagged("reference.cpu", Kind::Reference, None, 1.0, counter())).unwrap();
    let m = Arc::new(Manager::new(reg, SelectionPolicy::default()));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                for i in 0..2000 {
                    let prefer_ref = (t + i) % 2 == 0;
                    let g1 = m.scoped(PolicyOverride::new().prefer(if prefer_ref {
                        Prefer::Reference
                    } else {
                        Prefer::Vendor
                    }));
                    let g2 = m.scoped(PolicyOverride::new().strict(false));
                    let want = if prefer_ref { 1.0 } else { 7.0 };
                    assert_eq!(tag(&m, 2).unwrap(), want, "thread {t} call {i}");
                    // Out of order: the outer scope goes first.
                    drop(g1);
                    assert_eq!(tag(&m, 2).unwrap(), 7.0, "thread {t} call {i}: base policy (flagos: vendors first)");
                    drop(g2);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let tries = bad_hits.load(Ordering::Relaxed);
    assert!(tries < 200, "the failing impl ran {tries} times in 32000 vendor-first calls");
}
