//! Issue 12, defect 12: the environment is read by one reader (`EnvConfig`). A non-UTF-8
//! `TEFL_CACHE_DIR` or `TE_FL_PLUGIN_MODULES` entry is a valid Linux path: accepted, and
//! every op still runs. (A test binary of its own: the environment is read once per process.)

#[cfg(unix)]
#[test]
fn non_utf8_paths_do_not_break_op_calls() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    use tefl_core::catalogue::{RmsNormFwd, RmsNormFwdArgs};
    use tefl_core::{DType, Tensor};

    let dir = std::env::temp_dir().join(OsString::from_vec(b"tefl-caf\xe9".to_vec()));
    // SAFETY: this binary has this one test, and it sets the variables before anything reads
    // the environment; no other thread exists that could read it concurrently.
    unsafe {
        std::env::set_var("TEFL_CACHE_DIR", &dir);
        std::env::set_var("TE_FL_PLUGIN_MODULES", OsString::from_vec(b"/nonexistent/lib\xff.so".to_vec()));
    }
    let env = tefl_core::policy::env().as_ref().expect("non-UTF-8 paths are accepted");
    assert_eq!(env.cache_dir, dir);
    assert_eq!(env.plugin_modules.len(), 1);
    let _ = tefl_ops::linked_backends();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [1, 4], DType::F32).unwrap();
    let gamma = Tensor::from_slice(&[1.0f32; 4], [4], DType::F32).unwrap();
    let out = tefl_core::global()
        .expect("the global manager starts (the missing plugin is only logged)")
        .call::<RmsNormFwd>(&RmsNormFwdArgs {
            scale: None,
            x,
            gamma,
            eps: 1e-5,
            zero_centered_gamma: false,
            out_dtype: DType::F32,
        })
        .unwrap();
    assert_eq!(out.y.shape(), &[1, 4]);
}
