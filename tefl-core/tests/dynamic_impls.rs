//! Impls made at run time from kernels that do not know the op's Rust types
//! (`OpImpl::dynamic`): what C plugins and other host languages build on. They see the
//! arguments in declaration order, their output slots become the typed output, and a
//! malformed output is a failure of the impl, not a panic.

use std::sync::{Arc, Mutex};

use tefl_core::catalogue::{RmsNormFwd, RmsNormFwdArgs};
use tefl_core::op::{ArgRef, DynKernel, Op};
use tefl_core::{BackendImplKind, DType, Error, Manager, OpImpl, Prefer, Registry, SelectionPolicy, Tensor};

fn args(rows: usize, cols: usize) -> RmsNormFwdArgs {
    let x: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin()).collect();
    let g: Vec<f32> = (0..cols).map(|i| 1.0 + i as f32 / 8.0).collect();
    RmsNormFwdArgs {
        scale: None,
        x: Tensor::from_slice(&x, [rows, cols], DType::F32).unwrap(),
        gamma: Tensor::from_slice(&g, [cols], DType::F32).unwrap(),
        eps: 1e-5,
        zero_centered_gamma: false,
        out_dtype: DType::F32,
    }
}

fn manager_with(kernel: DynKernel) -> Manager {
    let mut reg = Registry::new();
    let imp = OpImpl::dynamic(RmsNormFwd::descriptor(), "vendor.dyn", BackendImplKind::Vendor, kernel).vendor("dyn");
    reg.register_impl(imp).unwrap();
    Manager::new(reg, SelectionPolicy::default().prefer(Prefer::Vendor))
}

#[test]
fn a_dynamic_kernel_sees_the_arguments_in_order_and_its_slots_become_the_output() {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let mgr = manager_with(Arc::new(move |ctx, call| {
        assert_eq!(ctx.impl_id, "vendor.dyn");
        let mut x = None;
        call.visit_args(&mut |a| match a {
            ArgRef::Tensor { name, tensor, .. } => {
                log.lock().unwrap().push(name.to_string());
                if name == "x" {
                    x = tensor.cloned();
                }
            }
            ArgRef::Scalar { name, text } => log.lock().unwrap().push(format!("{name}={text}")),
        });
        let x = x.expect("x is given");
        let rows = x.rows();
        // A plain copy of x and rsigma = row index, so the test can tell the slots apart.
        let rsigma: Vec<f32> = (0..rows).map(|r| r as f32).collect();
        Ok(vec![Some(x), Some(Tensor::from_slice(&rsigma, [rows], DType::F32)?)])
    }));
    let a = args(3, 5);
    let out = mgr.call::<RmsNormFwd>(&a).unwrap();
    assert_eq!(out.y.to_vec::<f32>().unwrap(), a.x.to_vec::<f32>().unwrap());
    assert_eq!(out.rsigma.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0]);
    assert_eq!(
        *seen.lock().unwrap(),
        vec!["x", "gamma", "eps=1e-5", "zero_centered_gamma=false", "out_dtype=F32", "scale"]
    );
}

#[test]
fn a_missing_output_slot_fails_the_impl_by_name() {
    let mgr = manager_with(Arc::new(|_, call| Ok(vec![None; call.outputs.len()])));
    let err = mgr.call_impl::<RmsNormFwd>("vendor.dyn", &args(2, 4)).unwrap_err();
    match err {
        Error::ImplFailed { op, impl_id, reason } => {
            assert_eq!((op, impl_id.as_str()), ("rmsnorm_fwd", "vendor.dyn"));
            assert!(reason.contains("'y'") || reason.contains(" y"), "{reason}");
        }
        e => panic!("expected ImplFailed, got {e:?}"),
    }
}

#[test]
fn a_dynamic_impl_is_an_impl_of_its_op_only() {
    let imp =
        OpImpl::dynamic(RmsNormFwd::descriptor(), "vendor.dyn", BackendImplKind::Vendor, Arc::new(|_, _| Ok(vec![])));
    assert_eq!(imp.op(), "rmsnorm_fwd");
    assert!(imp.kernel::<RmsNormFwd>().is_ok());
    assert!(matches!(imp.kernel::<tefl_core::catalogue::LayerNormFwd>(), Err(Error::KernelTypeMismatch { .. })));
}
