//! `explain <op> [--device cpu|cuda|hip|vulkan|<kind>[:N]] [--dtype bf16]`: the candidate chain
//! of an op under the current environment (`TE_FL_*`), and why each impl was dropped or placed.

use std::process::ExitCode;

use tefl_core::{DType, Device, Manager};

const USAGE: &str = "usage: explain <op> [--device cpu|cuda|hip|vulkan|<kind>[:N]] [--dtype bf16]

The candidate chain of <op> under this environment's TE_FL_* routing: each impl in the order
it would be tried, and why the others were dropped.";

fn main() -> ExitCode {
    let argv = match tefl_tests::cli::start(USAGE) {
        Ok(argv) => argv,
        Err(done) => return done,
    };
    let _ = tefl_ops::linked_backends();
    if let Err(e) = tefl_core::logging::init() {
        eprintln!("explain: {e}");
        return ExitCode::from(2);
    }
    let mut args = argv.into_iter();
    let (mut op, mut device, mut dtype) = (None, Device::CPU, DType::BF16);
    while let Some(a) = args.next() {
        let parsed = match a.as_str() {
            "--device" => args
                .next()
                .ok_or("--device needs a value".to_string())
                .and_then(|v| v.parse::<Device>().map_err(|e| e.to_string()))
                .map(|d| device = d),
            "--dtype" => args
                .next()
                .ok_or("--dtype needs a value".to_string())
                .and_then(|v| v.parse::<DType>().map_err(|e| e.to_string()))
                .map(|d| dtype = d),
            s if !s.starts_with('-') && op.is_none() => {
                op = Some(s.to_string());
                Ok(())
            }
            other => Err(format!("unexpected argument {other:?}")),
        };
        if let Err(e) = parsed {
            return tefl_tests::cli::bad_usage("explain", &e, USAGE);
        }
    }
    let Some(op) = op else {
        return tefl_tests::cli::bad_usage("explain", "no op named", USAGE);
    };
    let mgr = match Manager::from_env() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("explain: {e}");
            return ExitCode::from(2);
        }
    };
    match mgr.explain(&op, &device, dtype) {
        Ok(ex) => {
            print!("{ex}");
            if !device.is_available() {
                println!("note: {device} is not available on this machine; calls there would fail before dispatch");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("explain: {e}");
            ExitCode::from(2)
        }
    }
}
