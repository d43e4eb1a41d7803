//! The Vulkan runtime under the tensors: same-device copies (`Tensor::copy_from` → the runtime's
//! compute copy of whole words: odd byte counts, one element and a few MiB come back bit for
//! bit), and the bench's device timing (`DeviceRuntime::time_reps_after`: every repetition
//! submitted before one wait, each timed by its own submissions' timestamps, what runs before
//! it untimed, the bench's L2 flush, not counted).

use tefl_core::{DType, Device, DeviceKind, Tensor};

/// Held by each test: a timing counts every submission made while it runs, so the tests of this
/// binary take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Vulkan device 0, or `None` (the test skips) where there is none; CI sets
/// `TEFL_EXPECT_VULKAN=1`, and there a missing device fails.
fn vulkan_device() -> Option<Device> {
    let expected = std::env::var("TEFL_EXPECT_VULKAN").is_ok_and(|v| v == "1");
    if let Err(why) = tefl_backend_vulkan::availability() {
        assert!(!expected, "TEFL_EXPECT_VULKAN=1 but Vulkan is unavailable: {why}");
        eprintln!("skipped: {why}");
        return None;
    }
    Some(Device::new(DeviceKind::VULKAN, 0))
}

#[test]
fn same_device_copies_are_exact_for_any_size() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = vulkan_device() else { return };
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // u8 tensors of odd lengths, and bf16 ones whose byte count is not a multiple of 4.
    for n in [1usize, 3, 7, 4097, (3 << 20) + 5] {
        let bytes: Vec<u8> = (0..n).map(|_| next() as u8).collect();
        let src = Tensor::from_slice(&bytes, [n], DType::U8).unwrap().to_device(&device).unwrap();
        let dst = Tensor::zeros([n], DType::U8, &device).unwrap();
        dst.copy_from(&src).unwrap();
        assert_eq!(dst.to_vec::<u8>().unwrap(), bytes, "u8 x {n}");
    }
    for n in [1usize, 5, 1001] {
        let vals: Vec<f32> = (0..n).map(|_| (next() % 1000) as f32 / 8.0 - 60.0).collect();
        let src = Tensor::from_slice(&vals, [n], DType::BF16).unwrap().to_device(&device).unwrap();
        let dst = Tensor::zeros([n], DType::BF16, &device).unwrap();
        dst.copy_from(&src).unwrap();
        assert_eq!(dst.to_vec::<f32>().unwrap(), src.to_vec::<f32>().unwrap(), "bf16 x {n}");
    }
}

#[test]
fn queued_repetitions_are_timed_without_what_runs_before_them() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some(device) = vulkan_device() else { return };
    let rt = tefl_core::device::runtime(DeviceKind::VULKAN).unwrap();
    // A large fill before each repetition, a small one as the timed work (on lavapipe, a CPU
    // shared with other tests, a 4 KiB fill took up to 3 ms and a 64 MiB one as little as 5:
    // hence 256 MiB, the fastest of three, against the median repetition).
    const BIG: usize = 256 << 20;
    let big = rt.alloc(device, BIG).unwrap();
    let small = rt.alloc(device, 4096).unwrap();
    let big_alone =
        (0..3).map(|_| rt.time_on_device(device, &mut || rt.fill(&*big, 1)).unwrap()).fold(f64::INFINITY, f64::min);
    let (mut befores, mut works) = (0, 0);
    let reps = rt
        .time_reps_after(
            device,
            12,
            &mut || {
                befores += 1;
                rt.fill(&*big, 2)
            },
            &mut || {
                works += 1;
                rt.fill(&*small, 3)
            },
        )
        .unwrap();
    assert_eq!((befores, works, reps.len()), (12, 12, 12));
    for (i, t) in reps.iter().enumerate() {
        assert!(*t > 0.0 && t.is_finite(), "repetition {i}: {t} s");
    }
    let mut sorted = reps.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    assert!(median < big_alone / 4.0, "a repetition took {median} s (median), the fill before it {big_alone} s");
    // Everything ran: the last fills' bytes are there.
    let read = |b: &std::sync::Arc<dyn tefl_core::device::Buffer>, n: usize| {
        let mut bytes = vec![0u8; n];
        rt.copy_to_host(&**b, &mut bytes).unwrap();
        bytes
    };
    assert!(read(&big, BIG).iter().all(|&b| b == 2));
    assert!(read(&small, 4096).iter().all(|&b| b == 3));
    // A failing repetition's error comes back, and the next timing still works.
    let failed =
        rt.time_reps_after(device, 3, &mut || Ok(()), &mut || Err(tefl_core::Error::Tensor("the work failed".into())));
    assert!(matches!(failed, Err(tefl_core::Error::Tensor(ref m)) if m == "the work failed"), "{failed:?}");
    let x = Tensor::zeros([4], DType::F32, &device).unwrap();
    let again = rt.time_reps_after(device, 2, &mut || Ok(()), &mut || rt.fill(&**x.buffer(), 0x3f)).unwrap();
    assert_eq!(again.len(), 2);
    assert!(x.to_vec::<f32>().unwrap().iter().all(|&v| v.to_bits() == 0x3f3f_3f3f));
}
