//! A malformed value of a variable the Vulkan backend takes is a configuration error naming it,
//! like any variable tefl documents: the one reader of the environment refuses it, so every op
//! call returns it (on the CPU too), and the Vulkan backend reports itself unavailable with it,
//! also on a machine whose Vulkan device would never read it. (Its own test binary: the
//! environment is read once per process.)

use tefl_core::{DType, Error, Tensor};

#[test]
fn a_malformed_vulkan_variable_is_a_named_error() {
    // SAFETY: this binary has this one test, and it sets the variable before anything reads
    // the environment; no other thread exists that could read it concurrently.
    unsafe { std::env::set_var("TEFL_VULKAN_GEMM_TILE", "64by64") };
    let named = |what: &str, e: &Error| match e {
        Error::Config { variable: "TEFL_VULKAN_GEMM_TILE", token, .. } => assert_eq!(token, "64by64", "{what}"),
        other => panic!("{what}: expected TEFL_VULKAN_GEMM_TILE's configuration error, got {other:?}"),
    };
    match tefl_core::global() {
        Err(e) => named("global()", &e),
        Ok(_) => panic!("global(): expected TEFL_VULKAN_GEMM_TILE's configuration error"),
    }
    let x = Tensor::from_slice(&[1.0f32; 4], [1, 4], DType::F32).unwrap();
    let gamma = Tensor::from_slice(&[1.0f32; 4], [4], DType::F32).unwrap();
    for _ in 0..2 {
        match tefl_ops::rmsnorm_fwd(&x, &gamma, 1e-5).call() {
            Err(e) => named("rmsnorm_fwd on the CPU", &e),
            Ok(_) => panic!("rmsnorm_fwd on the CPU: expected the configuration error"),
        }
    }
    #[cfg(feature = "vulkan")]
    {
        let dev = tefl_core::Device::new(tefl_core::DeviceKind::VULKAN, 0);
        let e = Tensor::zeros([1, 4], DType::F32, &dev).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("TEFL_VULKAN_GEMM_TILE") && e.contains("64by64"), "{e}");
    }
}
