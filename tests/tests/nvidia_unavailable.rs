//! With the CUDA backend linked but no usable driver (this machine, CI), its 59 impls are
//! registered yet never chosen, explicit calls fail with typed errors, and nothing panics.
//! On a GPU machine the same binary picks the CUDA impls for CUDA tensors instead.

#[cfg(feature = "nvidia")]
#[test]
fn unavailable_cuda_backend_fails_typed_and_cpu_work_goes_on() {
    use tefl_core::catalogue::{RmsNormFwd, RmsNormFwdArgs};
    use tefl_core::{DType, Device, Error, Manager, Registry, Tensor};

    let _ = tefl_ops::linked_backends();
    let m = Manager::new(Registry::with_builtins(), Default::default());
    let nv = m.list_backends().into_iter().find(|b| b.name == "nvidia").expect("nvidia is linked");
    if nv.available {
        eprintln!("a CUDA device is usable here; the unavailable path is not exercised");
        return;
    }
    assert!(nv.unavailable_reason.as_deref().is_some_and(|r| !r.is_empty()));
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [2, 2], DType::F32).unwrap();
    let gamma = Tensor::from_slice(&[1.0f32, 1.0], [2], DType::F32).unwrap();
    let args = RmsNormFwdArgs { scale: None, x, gamma, eps: 1e-6, zero_centered_gamma: false, out_dtype: DType::F32 };
    // CPU tensors are served (by the reference), whatever else is linked.
    let out = m.call::<RmsNormFwd>(&args).expect("the reference serves CPU tensors");
    assert_eq!(out.y.shape(), &[2, 2]);
    // The CUDA impl, named explicitly, is a typed error rather than a crash.
    let err = m.call_impl::<RmsNormFwd>("vendor.nvidia", &args).expect_err("no CUDA device here");
    assert!(!err.to_string().is_empty());
    // So is CUDA memory.
    match Tensor::zeros([4], DType::F32, &Device::cuda(0)) {
        Err(Error::DeviceUnavailable { device, .. }) => assert_eq!(device, "cuda:0"),
        Err(other) => panic!("expected DeviceUnavailable, got {other}"),
        Ok(_) => panic!("a CUDA tensor without a CUDA device"),
    }
}
