//! `cargo xtask <command>`: the project's developer commands.
//!
//! The vendor-facing commands (`test-backend`, `coverage`, `explain`, `new-backend`,
//! `bundle`, `bench`) are specified in the conformance/xtask issue and land with it; until
//! then this binary names them and fails, so that no script mistakes it for a pass.

use std::process::ExitCode;

const PLANNED: [&str; 6] =
    ["test-backend <vendor>", "coverage", "explain <op>", "new-backend <vendor>", "bundle <backend>", "bench"];

fn main() -> ExitCode {
    let cmd = std::env::args().nth(1);
    match cmd.as_deref() {
        None | Some("help" | "--help" | "-h") => {
            eprintln!("usage: cargo xtask <command>\n\nplanned commands (not in this version yet):");
            for c in PLANNED {
                eprintln!("  {c}");
            }
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("cargo xtask: '{other}' is not available in this version of tefl (see `cargo xtask help`)");
            ExitCode::from(2)
        }
    }
}
