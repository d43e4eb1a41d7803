//! An out-of-tree tefl backend for the (imaginary) acme accelerator. It depends on
//! `tefl-core` only; its registrations ride on `inventory`, so an application picks it up
//! by naming the crate (`use acme_plugin as _;`) and nothing else.
//!
//! This one runs on the CPU so the example works anywhere; a real vendor package also
//! registers a `DeviceRuntime` for its own `DeviceKind`.

use tefl_core::catalogue::{RmsNormFwd, RmsNormFwdArgs, RmsNormFwdOut};
use tefl_core::{DType, DeviceKind, KernelCtx, Result, Tensor, VendorInfo};

/// The vendor name.
pub const VENDOR: &str = "acme";

fn vendor_info() -> VendorInfo {
    VendorInfo::new(VENDOR, "cpu", "true")
}

tefl_core::register_vendor!(vendor_info);

tefl_core::register_impl! {
    op: RmsNormFwd, impl_id: "vendor.acme", kind: Vendor, vendor: VENDOR, priority: 150,
    device: DeviceKind::CPU, dtypes: [F32, F16, BF16], kernel: rmsnorm_fwd,
}

/// RMSNorm, one row at a time, accumulating in f64.
fn rmsnorm_fwd(ctx: &KernelCtx<'_>, a: &RmsNormFwdArgs) -> Result<RmsNormFwdOut> {
    if a.out_dtype.is_fp8() {
        // No FP8 output here: the manager takes the next impl.
        let reason = "no FP8 output".to_string();
        return Err(tefl_core::Error::Unsupported { op: "rmsnorm_fwd", impl_id: ctx.impl_id.to_string(), reason });
    }
    let n = a.x.last_dim();
    let (x, g) = (a.x.to_vec::<f32>()?, a.gamma.to_vec::<f32>()?);
    let mut y = Vec::with_capacity(x.len());
    let mut rsigma = Vec::with_capacity(a.x.rows());
    for row in x.chunks(n) {
        let ms = row.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>() / n as f64;
        let r = (1.0 / (ms + f64::from(a.eps)).sqrt()) as f32;
        for (i, v) in row.iter().enumerate() {
            let scale = if a.zero_centered_gamma { 1.0 + g[i] } else { g[i] };
            y.push(v * r * scale);
        }
        rsigma.push(r);
    }
    Ok(RmsNormFwdOut {
        y: Tensor::from_slice(&y, a.x.shape(), a.out_dtype)?,
        rsigma: Tensor::from_slice(&rsigma, [a.x.rows()], DType::F32)?,
        amax: None,
        scale_inv: None,
    })
}
