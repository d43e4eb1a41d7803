//! `release_host_cache` gives back the reference GEMM's per-thread packing scratch (a process of
//! its own: no other test's product runs beside it).

use tefl_backend_reference::kernels::sgemm::{MatRef, sgemm};
use tefl_core::device::release_host_cache;

#[test]
fn releasing_the_host_cache_frees_the_gemm_packing_scratch() {
    let (m, n, k) = (300, 700, 260);
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
    let mut c = vec![0.0f32; m * n];
    release_host_cache();
    sgemm(m, n, k, 1.0, MatRef { data: &a, rs: k, cs: 1 }, MatRef { data: &b, rs: n, cs: 1 }, &mut c);
    // The product is right (one entry in closed form), whichever kernel ran.
    let want: f32 = (0..k).map(|l| a[5 * k + l] * b[l * n + 9]).sum();
    assert!((c[5 * n + 9] - want).abs() <= 1e-3 * want.abs().max(1.0), "{} against {want}", c[5 * n + 9]);
    let freed = release_host_cache();
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // The AVX-512 kernel's threads packed parts of A and B into their scratch (how much
        // each kept depends on which tasks it ran).
        assert!(freed >= k.min(256) * 4, "{freed} bytes given back");
    }
    assert_eq!(release_host_cache(), 0, "nothing is left to give back (freed {freed} before)");
}
