//! The registered (op, impl) set and vendor set are exactly what the enabled features promise.

use tefl_core::Registry;
use tefl_tests::{enabled_backends, promised_impls};

#[test]
fn linked_backends_match_the_features() {
    assert_eq!(tefl_ops::linked_backends(), enabled_backends());
}

#[test]
fn registered_pairs_are_the_promised_ones() {
    // Linking tefl-ops keeps every enabled backend's registrations.
    let _ = tefl_ops::linked_backends();
    let reg = Registry::try_with_builtins().expect("no duplicate (op, impl_id) among link-time registrations");
    let mut want: Vec<(String, String)> = enabled_backends()
        .into_iter()
        .flat_map(promised_impls)
        .map(|(op, id)| (op.to_string(), id.to_string()))
        .collect();
    want.sort();
    assert_eq!(reg.op_impl_pairs(), want);
    for (op, _) in reg.op_impl_pairs() {
        assert!(tefl_core::catalogue::find(&op).is_some(), "registered op '{op}' is not in the catalogue");
    }
}

#[test]
fn registered_vendors_are_the_enabled_gpu_backends() {
    let reg = Registry::with_builtins();
    let vendors: Vec<String> = reg.vendors().map(|v| v.vendor_name.clone()).collect();
    let want: Vec<String> = enabled_backends().into_iter().filter(|b| *b != "reference").map(String::from).collect();
    assert_eq!(vendors, want);
    for v in reg.vendors() {
        assert!(!v.device_name.is_empty() && !v.device_query_cmd.is_empty(), "{v:?}");
    }
}

#[test]
fn every_backend_is_listed_and_unavailable_ones_say_why() {
    let m = tefl_core::Manager::new(Registry::with_builtins(), Default::default());
    let names: Vec<String> = m.list_backends().into_iter().map(|b| b.name).collect();
    assert_eq!(names, enabled_backends());
    for b in m.list_backends() {
        assert_eq!(b.available, b.unavailable_reason.is_none(), "{b:?}");
    }
    // Device enumeration never panics, whatever is installed.
    assert!(tefl_core::Device::best_available().is_available());
}
