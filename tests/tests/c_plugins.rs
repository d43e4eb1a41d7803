//! Closed-source plugins through the C ABI: a plugin written in C (compiled here with the
//! system `cc` against tefl-core/include/tefl_plugin.h) is loaded through
//! `TE_FL_PLUGIN_MODULES` and serves `rmsnorm_fwd`; every failure mode leaves the process
//! and the other impls working, with an ERROR line naming the plugin and the reason.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use tefl_core::catalogue::{RmsNormFwd, RmsNormFwdArgs};
use tefl_core::logging::CapturedLog;
use tefl_core::policy::LogLevel;
use tefl_core::{DType, EnvConfig, Error, Manager};
use tefl_tests::{Rng, assert_close, oracle, seed, tensor, values};

/// Compiles the test plugin with `defines` into its own shared library.
fn build_plugin(name: &str, defines: &[&str]) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("tefl-cplugins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("lib{name}.so"));
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror"])
        .arg("-I")
        .arg(root.join("tefl-core/include"))
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg("-o")
        .arg(&out)
        .arg(root.join("tests/c/rmsnorm_plugin.c"))
        .arg("-lm")
        .status()
        .expect("the system C compiler (cc) runs");
    assert!(status.success(), "compiling the C plugin failed");
    out
}

fn manager(vars: &[(&'static str, String)]) -> Manager {
    let _ = tefl_ops::linked_backends();
    let map: HashMap<&'static str, String> = vars.iter().cloned().collect();
    let cfg = EnvConfig::from_lookup(&|k| Ok(map.get(k).cloned())).unwrap();
    Manager::from_config(cfg)
}

/// A manager with the plugin at `lib` loaded, vendor impls preferred (the reference after).
fn preferring_plugin(lib: &std::path::Path) -> Manager {
    manager(&[("TE_FL_PLUGIN_MODULES", lib.display().to_string()), ("TE_FL_PREFER", "vendor".into())])
}

/// A manager with the plugin at `lib` loaded and rmsnorm_fwd routed to it alone.
fn routed_to_plugin(lib: &std::path::Path) -> Manager {
    manager(&[("TE_FL_PLUGIN_MODULES", lib.display().to_string()), ("TE_FL_PER_OP", "rmsnorm_fwd=vendor:cplug".into())])
}

fn rmsnorm_case(rng: &mut Rng) -> (RmsNormFwdArgs, Vec<f64>) {
    let (rows, n) = (5, 1000);
    let x = tensor(&rng.vec(rows * n, -2.0, 2.0), &[rows, n], DType::F32);
    let g = tensor(&rng.vec(n, -1.0, 1.0), &[n], DType::F32);
    let (y, _) = oracle::rmsnorm_fwd(&values(&x), n, &values(&g), 1e-5, true);
    (RmsNormFwdArgs { scale: None, x, gamma: g, eps: 1e-5, zero_centered_gamma: true, out_dtype: DType::F32 }, y)
}

fn errors(log: &CapturedLog) -> Vec<String> {
    log.messages().into_iter().filter(|(l, _)| l == "ERROR").map(|(_, m)| m).collect()
}

#[test]
fn a_c_plugin_serves_rmsnorm_when_routed_to_it() {
    let lib = build_plugin("cplug_ok", &[]);
    let log = CapturedLog::new();
    let mut rng = Rng::new(seed("c_plugin"));
    log.capture(LogLevel::Info, || {
        let m = routed_to_plugin(&lib);
        let (args, want) = rmsnorm_case(&mut rng);
        let out = m.call::<RmsNormFwd>(&args).unwrap();
        assert_close("C plugin rmsnorm_fwd y", &values(&out.y), &want, DType::F32);
        assert_eq!(out.rsigma.shape(), &[5]);
        assert_eq!(m.stats_of("rmsnorm_fwd", "vendor.cplug").unwrap().calls, 1);
        // It only accepts f32: a bf16 call goes to no impl (the per-op order names only cplug).
        let bf = RmsNormFwdArgs {
            x: tensor(&[1.0; 8], &[2, 4], DType::BF16),
            gamma: tensor(&[1.0; 4], &[4], DType::BF16),
            out_dtype: DType::BF16,
            ..args
        };
        assert!(matches!(m.call::<RmsNormFwd>(&bf), Err(Error::NoImplementation { .. })));
        // No rows (an expert that drew no tokens): the plugin gets the call and allocates empty
        // outputs through the ABI.
        let none = RmsNormFwdArgs {
            x: tensor(&[], &[0, 4], DType::F32),
            gamma: tensor(&[1.0; 4], &[4], DType::F32),
            out_dtype: DType::F32,
            ..bf
        };
        let out = m.call::<RmsNormFwd>(&none).unwrap();
        assert_eq!((out.y.shape(), out.rsigma.shape()), (&[0, 4][..], &[0][..]));
        assert_eq!(m.stats_of("rmsnorm_fwd", "vendor.cplug").unwrap().calls, 2);
    });
    let msgs: Vec<String> = log.messages().into_iter().map(|(_, m)| m).collect();
    assert!(msgs.iter().any(|m| m.starts_with("Plugin '") && m.ends_with("loaded: 1 impl(s)")), "{msgs:?}");
    assert!(msgs.iter().any(|m| m == "Op 'rmsnorm_fwd' using 'vendor.cplug' (kind=vendor, vendor=cplug)"), "{msgs:?}");
    assert!(errors(&log).is_empty());
}

/// A plugin that cannot be used is skipped with an ERROR naming it and the reason; the
/// other plugins and the built-in impls keep working.
#[test]
fn broken_plugins_are_skipped_with_an_error_line() {
    let good = build_plugin("cplug_good", &[]);
    let cases: Vec<(String, &str)> = vec![
        ("/nonexistent/libnothere.so".to_string(), "cannot load"),
        (build_plugin("cplug_nosym", &["NO_INIT"]).display().to_string(), "missing symbol tefl_plugin_init"),
        (build_plugin("cplug_badabi", &["BAD_ABI"]).display().to_string(), "built for ABI 99.0"),
        (build_plugin("cplug_badinit", &["FAILING_INIT"]).display().to_string(), "no acme device found"),
    ];
    let mut rng = Rng::new(seed("c_plugin_broken"));
    for (bad, reason) in cases {
        let log = CapturedLog::new();
        log.capture(LogLevel::Info, || {
            let m = manager(&[("TE_FL_PLUGIN_MODULES", format!("{bad},{}", good.display()))]);
            let (args, want) = rmsnorm_case(&mut rng);
            let out = m.call::<RmsNormFwd>(&args).unwrap();
            assert_close("rmsnorm_fwd after a broken plugin", &values(&out.y), &want, DType::F32);
            assert_eq!(m.stats_of("rmsnorm_fwd", "vendor.cplug").unwrap().calls, 1, "the good plugin still serves");
        });
        let errs = errors(&log);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].starts_with(&format!("Plugin '{bad}' skipped:")), "{errs:?}");
        assert!(errs[0].contains(reason), "{errs:?} should say {reason:?}");
    }
}

/// A kernel that fails, returns an error code outside the ABI, or returns a pointer that is
/// not an error handle, is an impl failure: the manager falls back to the reference (or,
/// when the policy names only the plugin, returns a typed error). The process carries on.
#[test]
fn failing_and_garbage_status_codes_are_failures_with_fallback() {
    let mut rng = Rng::new(seed("c_plugin_failing"));
    for (defines, reason) in [
        (&["FAILING_OP"][..], "the acme device is on fire (code 5: internal error)"),
        (&["GARBAGE_CODE"][..], "unknown error code 12345"),
        (&["GARBAGE_HANDLE"][..], "returned an error handle tefl did not issue"),
    ] {
        let lib = build_plugin(&format!("cplug_{}", defines[0].to_ascii_lowercase()), defines);
        let m = preferring_plugin(&lib);
        let (args, want) = rmsnorm_case(&mut rng);
        let out = m.call::<RmsNormFwd>(&args).unwrap();
        assert_close("fallback after a failing plugin kernel", &values(&out.y), &want, DType::F32);
        assert_eq!(m.stats_of("rmsnorm_fwd", "reference.cpu").unwrap().fallbacks, 1);
        let f = m.recent_failures();
        assert_eq!(f[0].impl_id, "vendor.cplug");
        assert!(f[0].error.contains(reason), "{}", f[0].error);
        let strict = routed_to_plugin(&lib);
        match strict.call::<RmsNormFwd>(&args) {
            Err(Error::AllFailed { failures, .. }) => assert!(failures[0].1.contains(reason), "{failures:?}"),
            other => panic!("expected a typed failure, got {other:?}"),
        }
    }
}

/// Issue 12, defect 5: a plugin declaring the same impl twice is skipped whole: none of its
/// impls serves, and the log says it was skipped.
#[test]
fn a_plugin_with_a_duplicate_impl_is_not_partly_registered() {
    let lib = build_plugin("cplug_dup", &["DUPLICATE_IMPL"]);
    let log = CapturedLog::new();
    log.capture(LogLevel::Info, || {
        let m = preferring_plugin(&lib);
        assert!(m.with_registry(|r| !r.impl_ids().iter().any(|i| i == "vendor.cplug")));
        assert!(m.with_registry(|r| r.vendor("cplug").is_none()), "the vendor is not registered either");
        let (args, _) = rmsnorm_case(&mut Rng::new(seed("c_plugin_dup")));
        m.call::<RmsNormFwd>(&args).unwrap();
        assert!(m.stats_of("rmsnorm_fwd", "vendor.cplug").is_none());
    });
    let errs = errors(&log);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].contains("skipped") && errs[0].contains("twice"), "{errs:?}");
}

/// Issue 12, defects 6, 7 and 4 (plugin side): outputs that break the op's contract, a second
/// `alloc_output` for one index and a huge allocation are impl failures naming the problem;
/// the reference serves instead, and the process carries on.
#[test]
fn plugin_outputs_and_allocations_are_checked() {
    let mut rng = Rng::new(seed("c_plugin_outputs"));
    for (define, reason) in [
        ("WRONG_SHAPE", "output 'y' is [1] of f32"),
        ("WRONG_DTYPE", "output 'y' is [5, 1000] of i32"),
        ("DOUBLE_ALLOC", "output 0 is already allocated"),
        ("HUGE_ALLOC", "out of memory allocating 4611686018427387904 bytes for a f32 tensor"),
    ] {
        let lib = build_plugin(&format!("cplug_{}", define.to_ascii_lowercase()), &[define]);
        let m = preferring_plugin(&lib);
        let (args, want) = rmsnorm_case(&mut rng);
        let out = m.call::<RmsNormFwd>(&args).unwrap();
        assert_close("fallback after a bad plugin output", &values(&out.y), &want, DType::F32);
        let f = m.recent_failures();
        assert_eq!(f.len(), 1, "{define}: {f:?}");
        assert_eq!(f[0].impl_id, "vendor.cplug");
        assert!(f[0].error.contains(reason), "{define}: {} should say {reason:?}", f[0].error);
    }
}

/// A plugin kernel that runs out of memory (an output too large for the host, or its own
/// memory, TEFL_ERR_OUT_OF_MEMORY) is tefl's OutOfMemory: the call falls back and the failure is
/// counted and recorded, but the plugin is tried again on the next calls (it is not broken);
/// routed to the plugin alone, the call returns that OutOfMemory error, not AllFailed.
#[test]
fn plugin_out_of_memory_falls_back_and_is_tried_again() {
    let mut rng = Rng::new(seed("c_plugin_oom"));
    for (define, reason) in [
        ("HUGE_ALLOC", "allocating 4611686018427387904 bytes for a f32 tensor of shape [1099511627776, 1048576]"),
        ("POOL_FULL", "impl 'vendor.cplug' of op 'rmsnorm_fwd': the acme device's memory pool is full"),
    ] {
        let lib = build_plugin(&format!("cplug_oom_{}", define.to_ascii_lowercase()), &[define]);
        let m = preferring_plugin(&lib);
        for _ in 0..3 {
            let (args, want) = rmsnorm_case(&mut rng);
            let out = m.call::<RmsNormFwd>(&args).unwrap();
            assert_close("fallback after a plugin out of memory", &values(&out.y), &want, DType::F32);
        }
        let s = m.stats_of("rmsnorm_fwd", "vendor.cplug").unwrap();
        assert_eq!((s.calls, s.failures), (0, 3), "{define}: tried on every call");
        assert_eq!(m.stats_of("rmsnorm_fwd", "reference.cpu").unwrap().fallbacks, 3);
        let f = m.recent_failures();
        assert!(f[0].error.contains(reason), "{define}: {} should say {reason:?}", f[0].error);
        let only = routed_to_plugin(&lib);
        match only.call::<RmsNormFwd>(&rmsnorm_case(&mut rng).0) {
            Err(e @ Error::OutOfMemory { .. }) => assert!(e.to_string().contains(reason), "{define}: {e}"),
            other => panic!("{define}: expected OutOfMemory, got {other:?}"),
        }
    }
}

/// Issue 12, defect 9 (plugin side): TEFL_ERR_UNSUPPORTED for some shapes is "not supported",
/// not a failure: other shapes keep going to the plugin.
#[test]
fn plugin_unsupported_is_not_a_failure() {
    let lib = build_plugin("cplug_unsup3", &["UNSUPPORTED_3"]);
    let m = preferring_plugin(&lib);
    let mut rng = Rng::new(seed("c_plugin_unsupported"));
    let case = |rows: usize, rng: &mut Rng| {
        let n = 16;
        let x = tensor(&rng.vec(rows * n, -2.0, 2.0), &[rows, n], DType::F32);
        let g = tensor(&rng.vec(n, -1.0, 1.0), &[n], DType::F32);
        RmsNormFwdArgs { scale: None, x, gamma: g, eps: 1e-5, zero_centered_gamma: false, out_dtype: DType::F32 }
    };
    for _ in 0..5 {
        m.call::<RmsNormFwd>(&case(3, &mut rng)).unwrap();
        for _ in 0..10 {
            m.call::<RmsNormFwd>(&case(2, &mut rng)).unwrap();
        }
    }
    let s = m.stats_of("rmsnorm_fwd", "vendor.cplug").unwrap();
    assert_eq!((s.calls, s.failures, s.unsupported), (50, 0, 5));
    assert_eq!(m.stats_of("rmsnorm_fwd", "reference.cpu").unwrap().calls, 5);
}
