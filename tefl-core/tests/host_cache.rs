//! The host buffer cache: large freed CPU buffers are kept (within a budget) and handed out
//! again (by `Tensor::uninit` too), always zeroed for `Tensor::zeros` and holding exactly the copied values for
//! `Tensor::from_slice`; small ones and ones far larger than a request are not used for it.
//! One test function: the cache is process-wide, so its steps must not interleave.

use tefl_core::device::{
    HOST_CACHE_BYTES, host_cache_bytes, host_cache_limit, release_host_cache, set_host_cache_limit,
};
use tefl_core::{DType, Device, Tensor};

const MIB: usize = 1 << 20;

fn f32_tensor_bytes(t: &Tensor) -> usize {
    t.numel() * 4
}

#[test]
fn host_cache_reuses_zeroes_and_stays_within_budget() {
    release_host_cache();
    assert_eq!(host_cache_bytes(), 0);

    // A freed 4 MiB tensor is kept; the next one of its size gets it back, zeroed.
    let n = MIB; // f32 elements: 4 MiB
    let t = Tensor::zeros([n], DType::F32, &Device::CPU).unwrap();
    bytemuck::cast_slice_mut::<u8, f32>(&mut t.host_bytes_mut().unwrap()).fill(7.5);
    let bytes = f32_tensor_bytes(&t);
    drop(t);
    assert_eq!(host_cache_bytes(), bytes, "a freed 4 MiB buffer is kept");
    let u = Tensor::zeros([n], DType::F32, &Device::CPU).unwrap();
    assert_eq!(host_cache_bytes(), 0, "the kept buffer is handed out again");
    assert!(u.to_vec::<f32>().unwrap().iter().all(|v| *v == 0.0), "a reused buffer is zeroed");

    // An uninitialised tensor of the size reuses the buffer too (its contents unspecified).
    drop(u);
    let u = Tensor::uninit([n], DType::F32, &Device::CPU).unwrap();
    assert_eq!(host_cache_bytes(), 0, "an uninit tensor takes the kept buffer");

    // A copy into a reused buffer a little larger than it needs holds exactly its values.
    bytemuck::cast_slice_mut::<u8, f32>(&mut u.host_bytes_mut().unwrap()).fill(-3.0);
    drop(u);
    let m = n - n / 8 + 3; // 87.5% of the cached size, not a multiple of 8 bytes in f16
    let data: Vec<f32> = (0..m).map(|i| (i % 1000) as f32 * 0.25).collect();
    let c = Tensor::from_slice(&data, [m], DType::F32).unwrap();
    assert_eq!(host_cache_bytes(), 0, "a request within 1.25x reuses the buffer");
    assert_eq!(c.to_vec::<f32>().unwrap(), data);
    drop(c);

    // A request of a quarter of the cached size does not take it.
    let small = Tensor::zeros([n / 4], DType::F32, &Device::CPU).unwrap();
    assert!(host_cache_bytes() >= bytes - 32, "a much larger cached buffer is left for a request of its size");
    drop(small);

    // Small buffers are not kept.
    let before = host_cache_bytes();
    drop(Tensor::zeros([1000], DType::F32, &Device::CPU).unwrap());
    assert_eq!(host_cache_bytes(), before, "a 4 KB buffer goes back to the allocator");

    // Many large frees stay within the budget (calloc'd pages are not touched, so this costs
    // address space, not memory).
    let big: Vec<Tensor> = (0..12).map(|_| Tensor::zeros([64 * MIB / 4], DType::F32, &Device::CPU).unwrap()).collect();
    drop(big);
    let kept = host_cache_bytes();
    assert!(kept <= HOST_CACHE_BYTES, "{kept} bytes kept against a budget of {HOST_CACHE_BYTES}");
    assert!(kept >= HOST_CACHE_BYTES - 64 * MIB, "the budget is used: {kept} bytes kept");

    // A smaller budget frees the oldest kept buffers now and keeps later ones within it.
    assert_eq!(host_cache_limit(), HOST_CACHE_BYTES, "the default budget (TEFL_HOST_CACHE_MB unset)");
    let freed = set_host_cache_limit(100 * MIB);
    assert_eq!(freed + host_cache_bytes(), kept, "what was freed and what is kept add up");
    assert!(host_cache_bytes() <= 100 * MIB && host_cache_bytes() >= 36 * MIB, "{} bytes kept", host_cache_bytes());
    drop(Tensor::zeros([128 * MIB / 4], DType::F32, &Device::CPU).unwrap());
    assert!(host_cache_bytes() <= 100 * MIB, "a buffer over the budget is not kept");
    // A budget of 0 keeps nothing.
    set_host_cache_limit(0);
    assert_eq!(host_cache_bytes(), 0);
    drop(Tensor::zeros([n], DType::F32, &Device::CPU).unwrap());
    assert_eq!(host_cache_bytes(), 0, "no buffer is kept under a zero budget");
    set_host_cache_limit(HOST_CACHE_BYTES);
    drop(Tensor::zeros([n], DType::F32, &Device::CPU).unwrap());
    let kept = host_cache_bytes();
    assert!(kept >= bytes, "kept again once the budget is back: {kept}");

    // Releasing gives everything back.
    assert_eq!(release_host_cache(), kept);
    assert_eq!(host_cache_bytes(), 0);
}
