//! Same-device copies (`Tensor::copy_from` → the runtime's compute copy of whole words): odd byte
//! counts, one element and a few MiB come back bit for bit.

use tefl_core::{DType, Device, DeviceKind, Tensor};

#[test]
fn same_device_copies_are_exact_for_any_size() {
    let expected = std::env::var("TEFL_EXPECT_VULKAN").is_ok_and(|v| v == "1");
    if let Err(why) = tefl_backend_vulkan::availability() {
        assert!(!expected, "TEFL_EXPECT_VULKAN=1 but Vulkan is unavailable: {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let device = Device::new(DeviceKind::VULKAN, 0);
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
