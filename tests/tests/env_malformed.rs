//! Issue 12, defect 12: a malformed value of a variable tefl documents is a configuration
//! error naming it, for every op call, never silently ignored. (Its own test binary: the
//! environment is read once per process.)

#[test]
fn a_malformed_kernel_timing_value_is_a_named_error() {
    use tefl_core::{DType, Error, Tensor};

    // SAFETY: this binary has this one test, and it sets the variable before anything reads
    // the environment; no other thread exists that could read it concurrently.
    unsafe { std::env::set_var("TEFL_KERNEL_TIMING", "bogus") };
    match tefl_core::global() {
        Err(Error::Config { variable: "TEFL_KERNEL_TIMING", token, .. }) => assert_eq!(token, "bogus"),
        other => panic!("expected a configuration error, got {:?}", other.map(|_| ())),
    }
    let x = Tensor::from_slice(&[1.0f32; 4], [1, 4], DType::F32).unwrap();
    let gamma = Tensor::from_slice(&[1.0f32; 4], [4], DType::F32).unwrap();
    let r = tefl_ops::rmsnorm_fwd(&x, &gamma, 1e-5).call();
    assert!(matches!(r, Err(Error::Config { variable: "TEFL_KERNEL_TIMING", .. })), "{r:?}");
}
