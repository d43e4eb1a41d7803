//! # tefl-tests
//!
//! Cross-crate tests of tefl, built with the same backend features as the facade
//! (`--features nvidia,amd,vulkan`). The integration tests in `tests/` check that the set of
//! registered (op, impl) pairs and vendors is exactly what the enabled features promise,
//! and that a build with every backend starts on a machine without GPU drivers.
//! The conformance suite shared by every backend, with its f64 oracle, will live here too.

/// The (op, impl_id) pairs each backend promises to register in this version of tefl.
/// A backend that registers an op adds it here; the registered-set test then holds it to it.
pub fn promised_impls(backend: &str) -> Vec<(&'static str, &'static str)> {
    match backend {
        // The reference backend implements the whole catalogue.
        "reference" => tefl_core::catalogue::all().iter().map(|d| (d.name, "reference.cpu")).collect(),
        // The GPU backends hold only their vendor description and availability check so far.
        _ => Vec::new(),
    }
}

/// The backends the enabled features link (`reference` always).
pub fn enabled_backends() -> Vec<&'static str> {
    let mut v = vec!["reference"];
    if cfg!(feature = "nvidia") {
        v.push("nvidia");
    }
    if cfg!(feature = "amd") {
        v.push("amd");
    }
    if cfg!(feature = "vulkan") {
        v.push("vulkan");
    }
    v.sort();
    v
}
