//! The backends this crate's features enable (each feature `x` enables `tefl-ops/x`), for
//! `enabled_backends()`: read from the features cargo sets, so that `cargo xtask new-backend`
//! only adds a feature line and no list of backends is kept by hand.

use std::fmt::Write as _;

fn main() {
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(|f| f.to_ascii_lowercase()))
        .filter(|f| f != "default")
        .collect();
    features.sort();
    let mut code = String::from("/// The backend features enabled on this crate.\n");
    code.push_str("const ENABLED_FEATURES: &[&str] = &[");
    for f in &features {
        let _ = write!(code, "{f:?}, ");
    }
    code.push_str("];\n");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("enabled_features.rs"), code).expect("OUT_DIR is writable");
    println!("cargo::rerun-if-changed=build.rs");
}
