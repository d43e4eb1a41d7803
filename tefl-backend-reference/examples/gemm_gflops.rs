//! Times the reference `generic_gemm` (f32, no epilogue) and prints GFLOP/s (median of
//! repeated runs after warm-up). The shape is `N` (N×N×N) or `MxNxK`, optionally followed by
//! `:tn`, `:nt` or `:tt` (A, B transposed as TE's `transa` / `transb`, row-major).
//! `scripts/gemm_vs_numpy.sh` runs it next to numpy.
//!
//! ```sh
//! cargo run --release -p tefl-backend-reference --example gemm_gflops -- 1024
//! cargo run --release -p tefl-backend-reference --example gemm_gflops -- 1024x1536x512:nt 20
//! ```

use std::time::Instant;

use tefl_core::catalogue::{GemmArgs, GemmEpilogue, GenericGemm};
use tefl_core::{DType, Manager, Registry, Tensor};

fn main() -> tefl_core::Result<()> {
    let spec = std::env::args().nth(1).unwrap_or_else(|| "1024".into());
    let reps: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    let Some((rows, cols, depth, transa, transb)) = parse_shape(&spec) else {
        eprintln!("usage: gemm_gflops N|MxNxK[:tn|:nt|:tt] [reps]");
        std::process::exit(2);
    };
    let _ = tefl_backend_reference::IMPL_ID;
    let m = Manager::new(Registry::with_builtins(), Default::default());
    let fill = |len: usize| -> Vec<f32> { (0..len).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect() };
    let a_shape = if transa { [depth, rows] } else { [rows, depth] };
    let b_shape = if transb { [cols, depth] } else { [depth, cols] };
    let a = Tensor::from_slice(&fill(rows * depth), a_shape, DType::F32)?;
    let b = Tensor::from_slice(&fill(depth * cols), b_shape, DType::F32)?;
    let args = GemmArgs {
        a_scale_inv: None,
        b_scale_inv: None,
        d_scale: None,
        split_accumulator: false,
        a,
        b,
        bias: None,
        aux: None,
        c: None,
        transa,
        transb,
        alpha: 1.0,
        accumulate: false,
        epilogue: GemmEpilogue::None,
        out_dtype: DType::F32,
    };
    for _ in 0..3 {
        m.call_impl::<GenericGemm>("reference.cpu", &args)?;
    }
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            let out = m.call_impl::<GenericGemm>("reference.cpu", &args);
            let dt = t.elapsed().as_secs_f64();
            out.map(|_| dt)
        })
        .collect::<tefl_core::Result<_>>()?;
    times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    let gflops = 2.0 * (rows * cols) as f64 * depth as f64 / med / 1e9;
    println!(
        "tefl reference generic_gemm f32 {spec}: median {:.3} ms, {gflops:.1} GFLOP/s ({} threads)",
        med * 1e3,
        rayon_threads()
    );
    Ok(())
}

/// (m, n, k, transa, transb) of `N` or `MxNxK[:tn|:nt|:tt]`.
fn parse_shape(spec: &str) -> Option<(usize, usize, usize, bool, bool)> {
    let (dims, trans) = spec.split_once(':').unwrap_or((spec, "nn"));
    let nums: Vec<usize> = dims.split('x').map(|d| d.parse().ok()).collect::<Option<_>>()?;
    let (m, n, k) = match nums[..] {
        [n] => (n, n, n),
        [m, n, k] => (m, n, k),
        _ => return None,
    };
    let (ta, tb) = match trans {
        "nn" => (false, false),
        "tn" => (true, false),
        "nt" => (false, true),
        "tt" => (true, true),
        _ => return None,
    };
    Some((m, n, k, ta, tb))
}

fn rayon_threads() -> usize {
    rayon::current_num_threads()
}
