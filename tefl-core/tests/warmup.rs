//! `Manager::warmup`: the impl a call would pick runs its registered warm-up, nothing runs the
//! kernel, and bad arguments are refused as a call would refuse them.

use std::sync::atomic::{AtomicUsize, Ordering};

use tefl_core::catalogue::{RmsNormFwd, RmsNormFwdArgs, RmsNormFwdOut};
use tefl_core::{
    BackendImplKind as Kind, DType, Error, KernelCtx, Manager, OpImpl, Registry, Result, SelectionPolicy, Tensor,
    register_warmup,
};

static WARMED: AtomicUsize = AtomicUsize::new(0);
static RAN: AtomicUsize = AtomicUsize::new(0);

fn warm(ctx: &KernelCtx<'_>, a: &RmsNormFwdArgs) -> Result<()> {
    assert_eq!((ctx.op, ctx.impl_id), ("rmsnorm_fwd", "vendor.warm"));
    assert_eq!(a.x.shape(), &[2, 3]);
    WARMED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

fn explode(_: &KernelCtx<'_>, _: &RmsNormFwdArgs) -> Result<()> {
    panic!("warm-up exploded")
}

register_warmup!("vendor.warm", RmsNormFwd => warm);
register_warmup!("vendor.explodes", RmsNormFwd => explode);

fn imp(id: &'static str, priority: i32) -> OpImpl {
    OpImpl::new::<RmsNormFwd>(id, Kind::Vendor, |_, a: &RmsNormFwdArgs| {
        RAN.fetch_add(1, Ordering::SeqCst);
        Ok(RmsNormFwdOut {
            y: a.x.clone(),
            rsigma: Tensor::zeros([a.x.rows()], DType::F32, &a.x.device())?,
            amax: None,
            scale_inv: None,
        })
    })
    .vendor(id)
    .priority(priority)
}

fn manager(ids: &[(&'static str, i32)]) -> Manager {
    let mut reg = Registry::new();
    for &(id, p) in ids {
        reg.register_impl(imp(id, p)).unwrap();
    }
    Manager::new(reg, SelectionPolicy::default())
}

fn args(eps: f32) -> RmsNormFwdArgs {
    RmsNormFwdArgs {
        x: Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], DType::F32).unwrap(),
        gamma: Tensor::from_slice(&[1.0f32; 3], [3], DType::F32).unwrap(),
        eps,
        zero_centered_gamma: false,
        out_dtype: DType::F32,
        scale: None,
    }
}

#[test]
fn the_impl_a_call_would_pick_warms_up_and_nothing_runs() {
    // (One test: the counters are process-wide.)
    let m = manager(&[("vendor.warm", 10), ("vendor.cold", 5)]);
    assert_eq!(m.warmup::<RmsNormFwd>(&args(1e-5)).unwrap().as_deref(), Some("vendor.warm"));
    assert_eq!((WARMED.load(Ordering::SeqCst), RAN.load(Ordering::SeqCst)), (1, 0));
    // The first impl of the chain has no warm-up: nothing to start, and the next is not asked.
    let m = manager(&[("vendor.warm", 5), ("vendor.cold", 10)]);
    assert_eq!(m.warmup::<RmsNormFwd>(&args(1e-5)).unwrap(), None);
    assert_eq!((WARMED.load(Ordering::SeqCst), RAN.load(Ordering::SeqCst)), (1, 0));
    // Bad arguments are refused by name, as a call refuses them.
    let e = m.warmup::<RmsNormFwd>(&args(-1.0)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { arg: "eps", .. }), "{e}");
    // A warm-up that panics is contained and named.
    let m = manager(&[("vendor.explodes", 10)]);
    let e = m.warmup::<RmsNormFwd>(&args(1e-5)).unwrap_err();
    assert!(
        matches!(&e, Error::ImplFailed { impl_id, reason, .. } if impl_id == "vendor.explodes" && reason.contains("exploded")),
        "{e}"
    );
    // The call itself runs as usual afterwards.
    let m = manager(&[("vendor.warm", 10)]);
    m.call::<RmsNormFwd>(&args(1e-5)).unwrap();
    assert_eq!((WARMED.load(Ordering::SeqCst), RAN.load(Ordering::SeqCst)), (1, 1));
}
