//! Picks up the out-of-tree acme backend by naming its crate, then calls `rmsnorm_fwd`
//! through the process-wide manager, which now routes it to `vendor.acme`.
//!
//! ```sh
//! cargo run --manifest-path examples/out_of_tree/Cargo.toml -p acme-app
//! ```

use std::process::ExitCode;

// Naming the crate keeps its link-time registrations; nothing else is needed.
use acme_plugin as _;

fn run() -> tefl::Result<()> {
    tefl::logging::init()?;
    let x = tefl::Tensor::from_slice(&[3.0f32, -4.0, 0.0, 0.0], [1, 4], tefl::DType::F32)?;
    let g = tefl::Tensor::from_slice(&[1.0f32; 4], [4], tefl::DType::F32)?;
    let out = tefl::ops::rmsnorm_fwd(&x, &g, 1e-6).call()?;
    // rms of [3, -4, 0, 0] is 2.5
    let y = out.y.to_vec::<f32>()?;
    println!("y = {y:?}");
    let want = [1.2f32, -1.6, 0.0, 0.0];
    if y.iter().zip(want).any(|(a, b)| (a - b).abs() > 1e-5) {
        return Err(tefl::Error::Tensor(format!("wrong result {y:?}, expected {want:?}")));
    }
    let served = tefl::global()?.stats_of("rmsnorm_fwd", "vendor.acme").map_or(0, |s| s.calls);
    if served != 1 {
        return Err(tefl::Error::Tensor("vendor.acme did not serve the call".into()));
    }
    println!("served by vendor.acme from the out-of-tree crate acme-plugin");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
