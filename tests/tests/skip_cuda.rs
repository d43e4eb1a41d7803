//! `TE_FL_SKIP_CUDA=1` makes the nvidia backend report unavailable, with the reason.
//! (A test binary of its own: the check runs once per process.)

#[cfg(feature = "nvidia")]
#[test]
fn skip_cuda_makes_nvidia_unavailable() {
    // SAFETY: this binary has this one test, and it sets the variable before anything reads
    // the environment; no other thread exists that could read it concurrently.
    unsafe { std::env::set_var("TE_FL_SKIP_CUDA", "1") };
    let m = tefl_core::Manager::new(tefl_core::Registry::with_builtins(), Default::default());
    let _ = tefl_ops::linked_backends();
    let nv = m.list_backends().into_iter().find(|b| b.name == "nvidia").expect("nvidia is linked");
    assert!(!nv.available);
    assert_eq!(nv.unavailable_reason.as_deref(), Some("skipped by TE_FL_SKIP_CUDA=1"));
}
