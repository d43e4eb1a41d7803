//! The dispatch core in one screen: build a registry of everything linked in (and the plugins
//! of `TE_FL_PLUGIN_MODULES`), register a run-time vendor impl ("acme"), route `rmsnorm_fwd`
//! with the `TE_FL_*` variables, call it, check the result and show why that impl was chosen.
//!
//! ```sh
//! TEFL_LOG_LEVEL=INFO TE_FL_PER_OP='rmsnorm_fwd=vendor:acme|reference' cargo run --example dispatch_demo
//! TE_FL_PREFER=bogus cargo run --example dispatch_demo   # exits non-zero, naming TE_FL_PREFER and bogus
//! ```

use std::process::ExitCode;

use tefl::catalogue::{RmsNormFwd, RmsNormFwdArgs, RmsNormFwdOut};
use tefl::{BackendImplKind, DType, Device, EnvConfig, KernelCtx, Manager, OpImpl, Registry, Tensor};

/// The "acme" vendor's rmsnorm: a plain CPU loop, f32 accumulation, any float dtype.
fn acme_rmsnorm(_ctx: &KernelCtx<'_>, a: &RmsNormFwdArgs) -> tefl::Result<RmsNormFwdOut> {
    let n = a.x.last_dim();
    let x = a.x.to_vec::<f32>()?;
    let g = a.gamma.to_vec::<f32>()?;
    let mut y = vec![0.0f32; x.len()];
    let mut rsigma = Vec::with_capacity(a.x.rows());
    for (xr, yr) in x.chunks(n).zip(y.chunks_mut(n)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let r = 1.0 / (ms + a.eps).sqrt();
        for ((yv, xv), gv) in yr.iter_mut().zip(xr).zip(&g) {
            let scale = if a.zero_centered_gamma { 1.0 + gv } else { *gv };
            *yv = xv * r * scale;
        }
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
    let env = EnvConfig::from_env()?;

    let mut registry = Registry::with_builtins();
    // Plugins named in TE_FL_PLUGIN_MODULES join too, as in `Manager::from_env`.
    tefl::plugin::load_plugins(&mut registry, &env.plugin_modules);
    registry.register_impl(
        OpImpl::new::<RmsNormFwd>("vendor.acme", BackendImplKind::Vendor, acme_rmsnorm)
            .vendor("acme")
            .priority(200)
            .dtypes(&DType::FLOATS),
    )?;
    let manager = Manager::new(registry, env.policy);

    let (rows, hidden) = (4, 1000);
    let xs: Vec<f32> = (0..rows * hidden).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
    let gs: Vec<f32> = (0..hidden).map(|i| 0.5 + (i % 7) as f32 / 7.0).collect();
    let x = Tensor::from_slice(&xs, [rows, hidden], DType::F32)?;
    let gamma = Tensor::from_slice(&gs, [hidden], DType::F32)?;
    let out = tefl::ops::rmsnorm_fwd(&x, &gamma, 1e-5).call_with(&manager)?;
    let (y, rsigma) = (out.y, out.rsigma);

    // Check against the formula, in f64.
    let (y, rsigma) = (y.to_vec::<f64>()?, rsigma.to_vec::<f64>()?);
    let mut max_err = 0.0f64;
    for r in 0..rows {
        let row = &xs[r * hidden..(r + 1) * hidden];
        let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / hidden as f64;
        let want_r = 1.0 / (ms + 1e-5).sqrt();
        max_err = max_err.max((rsigma[r] - want_r).abs() / want_r);
        for (i, &xv) in row.iter().enumerate() {
            let want = f64::from(xv) * want_r * f64::from(gs[i]);
            max_err = max_err.max((y[r * hidden + i] - want).abs() / want.abs().max(1.0));
        }
    }
    println!("rmsnorm_fwd on {rows}x{hidden} f32: max error vs the f64 formula {max_err:.2e}");
    if max_err > 1e-5 {
        return Err(tefl::Error::ImplFailed {
            op: "rmsnorm_fwd",
            impl_id: "vendor.acme".into(),
            reason: format!("result off by {max_err:.2e}"),
        });
    }

    println!("\n{}", manager.explain("rmsnorm_fwd", &Device::CPU, DType::F32)?);
    println!("backends:");
    for b in manager.list_backends() {
        println!(
            "  {:<10} available={:<5} current={:<5} priority={:<4} impls={} {}",
            b.name,
            b.available,
            b.current,
            b.priority,
            b.impls,
            b.unavailable_reason.as_deref().map(|r| format!("({r})")).unwrap_or_default()
        );
    }
    for s in manager.stats().iter().filter(|s| s.calls + s.failures > 0) {
        println!("calls: {} / {}: {} ok, {} failed", s.op, s.impl_id, s.calls, s.failures);
    }
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
