//! Names every enabled backend crate so that the linker keeps its `inventory` registrations.
//! Each feature of this crate (but `default`) enables the crate `tefl-backend-<feature>`,
//! which exports `BACKEND` and `availability()` (what `cargo xtask new-backend` scaffolds).

use std::fmt::Write as _;

fn main() {
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(|f| f.to_ascii_lowercase()))
        .filter(|f| f != "default")
        .collect();
    features.sort();
    let mut code = String::from("/// Pushes (name, availability) of each enabled backend crate.\n");
    code.push_str("fn push_enabled_backends(v: &mut Vec<(&'static str, Availability)>) {\n");
    for f in &features {
        let _ = writeln!(code, "    v.push((tefl_backend_{f}::BACKEND, tefl_backend_{f}::availability));");
    }
    code.push_str("    let _ = v;\n}\n");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("enabled_backends.rs"), code).expect("OUT_DIR is writable");
    println!("cargo::rerun-if-changed=build.rs");
}
