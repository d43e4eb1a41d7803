//! `explain <op> [--device cpu|cuda|hip|vulkan|<kind>[:N]] [--dtype bf16]`: the candidate chain
//! of an op under the current environment (`TE_FL_*`), and why each impl was dropped or placed.

use std::process::ExitCode;

use tefl_core::{DType, Device, Manager};

fn main() -> ExitCode {
    let _ = tefl_ops::linked_backends();
    if let Err(e) = tefl_core::logging::init() {
        eprintln!("explain: {e}");
        return ExitCode::from(2);
    }
    let mut args = std::env::args().skip(1);
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
            eprintln!("explain: {e}\nusage: explain <op> [--device cpu|cuda|hip|vulkan] [--dtype bf16]");
            return ExitCode::from(2);
        }
    }
    let Some(op) = op else {
        eprintln!("usage: explain <op> [--device cpu|cuda|hip|vulkan] [--dtype bf16]");
        return ExitCode::from(2);
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
