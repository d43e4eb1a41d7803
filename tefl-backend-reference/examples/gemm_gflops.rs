//! Times the reference `generic_gemm` (f32, no epilogue) at n×n×n and prints GFLOP/s
//! (median of repeated runs after warm-up). `scripts/gemm_vs_numpy.sh` runs it next to numpy.
//!
//! ```sh
//! cargo run --release -p tefl-backend-reference --example gemm_gflops -- 1024
//! ```

use std::time::Instant;

use tefl_core::catalogue::{GemmArgs, GemmEpilogue, GenericGemm};
use tefl_core::{DType, Manager, Registry, Tensor};

fn main() -> tefl_core::Result<()> {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let reps: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    let _ = tefl_backend_reference::IMPL_ID;
    let m = Manager::new(Registry::with_builtins(), Default::default());
    let data: Vec<f32> = (0..n * n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let a = Tensor::from_slice(&data, [n, n], DType::F32)?;
    let b = Tensor::from_slice(&data, [n, n], DType::F32)?;
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
        transa: false,
        transb: false,
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
    let gflops = 2.0 * (n as f64).powi(3) / med / 1e9;
    println!(
        "tefl reference generic_gemm f32 {n}^3: median {:.3} ms, {gflops:.1} GFLOP/s ({} threads)",
        med * 1e3,
        rayon_threads()
    );
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
