//! The TE-FL seed's in-tree example in tefl: build a registry, register a custom
//! `rmsnorm_fwd` at run time, make a manager that prefers vendor impls, call the op, check it.
//!
//! ```sh
//! cargo run --example in_tree
//! ```
//! prints, among its log lines:
//! `Registered impl_ids: ['reference.cpu', 'vendor.mybackend']` and
//! `Op 'rmsnorm_fwd' using 'vendor.mybackend' (kind=vendor, vendor=mybackend)`.

use std::process::ExitCode;

use tefl::catalogue::{RmsNormFwd, RmsNormFwdArgs, RmsNormFwdOut};
use tefl::{BackendImplKind, DType, KernelCtx, Manager, OpImpl, Prefer, Registry, SelectionPolicy, Tensor};

/// 1. The implementation: y = x·rsqrt(mean(x²) + eps)·w, per row.
fn my_rmsnorm(_ctx: &KernelCtx<'_>, a: &RmsNormFwdArgs) -> tefl::Result<RmsNormFwdOut> {
    let n = a.x.last_dim();
    let (x, w) = (a.x.to_vec::<f32>()?, a.gamma.to_vec::<f32>()?);
    let mut y = Vec::with_capacity(x.len());
    let mut rsigma = Vec::with_capacity(a.x.rows());
    for row in x.chunks(n) {
        let r = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / n as f32 + a.eps).sqrt();
        let scale = |i: usize| if a.zero_centered_gamma { 1.0 + w[i] } else { w[i] };
        y.extend(row.iter().enumerate().map(|(i, v)| v * r * scale(i)));
        rsigma.push(r);
    }
    Ok(RmsNormFwdOut {
        amax: None,
        scale_inv: None,
        y: Tensor::from_slice(&y, a.x.shape(), a.out_dtype)?,
        rsigma: Tensor::from_slice(&rsigma, [a.x.rows()], DType::F32)?,
    })
}

fn run() -> tefl::Result<()> {
    tefl::logging::init()?;
    // 2. Register it in a registry of our own.
    let mut registry = Registry::with_builtins();
    registry.register_impl(
        OpImpl::new::<RmsNormFwd>("vendor.mybackend", BackendImplKind::Vendor, my_rmsnorm)
            .vendor("mybackend")
            .priority(200),
    )?;
    // 3. Call it through a manager that prefers vendor impls.
    let manager = Manager::new(registry, SelectionPolicy::from_env()?.prefer(Prefer::Vendor));
    let xs: Vec<f32> = (0..2 * 8).map(|i| i as f32 - 7.5).collect();
    let x = Tensor::from_slice(&xs, [2, 8], DType::F32)?;
    let w = Tensor::from_slice(&[1.5f32; 8], [8], DType::F32)?;
    let out = tefl::ops::rmsnorm_fwd(&x, &w, 1e-5).call_with(&manager)?;
    let y = out.y.to_vec::<f32>()?;
    for (r, row) in xs.chunks(8).enumerate() {
        let rs = 1.0 / (row.iter().map(|v| f64::from(v * v)).sum::<f64>() / 8.0 + 1e-5).sqrt();
        for (i, v) in row.iter().enumerate() {
            let want = f64::from(*v) * rs * 1.5;
            if (f64::from(y[r * 8 + i]) - want).abs() > 1e-5 * want.abs().max(1.0) {
                return Err(tefl::Error::ImplFailed {
                    op: "rmsnorm_fwd",
                    impl_id: "vendor.mybackend".into(),
                    reason: format!("y[{r}, {i}] = {} but the formula gives {want}", y[r * 8 + i]),
                });
            }
        }
    }
    println!("output shape {:?}, rsigma {:?}: matches the formula", out.y.shape(), out.rsigma.to_vec::<f32>()?);
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
