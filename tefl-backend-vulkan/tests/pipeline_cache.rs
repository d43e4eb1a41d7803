//! Pipelines go through a `VkPipelineCache` saved under `$TEFL_CACHE_DIR/vulkan/`: after a
//! pipeline is made the file exists with a valid checksum; a damaged or missing file is not used.

use tefl_core::{Device, DeviceKind};

#[test]
fn the_pipeline_cache_is_saved_checksummed_and_damage_is_refused() {
    let expected = std::env::var("TEFL_EXPECT_VULKAN").is_ok_and(|v| v == "1");
    let dir = std::env::temp_dir().join(format!("tefl-pipeline-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: set before any thread of this test binary reads the environment (this binary has
    // one test; tefl reads TEFL_CACHE_DIR once, later).
    unsafe { std::env::set_var("TEFL_CACHE_DIR", &dir) };
    if let Err(why) = tefl_backend_vulkan::availability() {
        assert!(!expected, "TEFL_EXPECT_VULKAN=1 but Vulkan is unavailable: {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let device = Device::new(DeviceKind::VULKAN, 0);
    let path =
        tefl_backend_vulkan::gpu::pipeline_cache_path(device).unwrap().expect("a cache file under TEFL_CACHE_DIR");
    assert!(path.starts_with(&dir), "{} is not under {}", path.display(), dir.display());
    let gpu = tefl_backend_vulkan::gpu::gpu(device).unwrap();
    gpu.pipeline("copy.wg=256", 2, 4).unwrap();
    let data = tefl_backend_vulkan::gpu::read_pipeline_cache(&path).expect("a saved, valid pipeline cache");
    // Every pipeline cache starts with its 16- or 32-byte header (length, version, vendor, device,
    // UUID).
    assert!(data.len() >= 16, "{} bytes", data.len());
    assert_eq!(u32::from_le_bytes(data[8..12].try_into().unwrap()), gpu.physical.vendor_id);

    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    let damaged = dir.join("damaged.bin");
    std::fs::write(&damaged, &bytes).unwrap();
    assert!(tefl_backend_vulkan::gpu::read_pipeline_cache(&damaged).is_none());
    assert!(tefl_backend_vulkan::gpu::read_pipeline_cache(&dir.join("missing.bin")).is_none());
    std::fs::write(&damaged, [1, 2, 3]).unwrap();
    assert!(tefl_backend_vulkan::gpu::read_pipeline_cache(&damaged).is_none());
    let _ = std::fs::remove_dir_all(&dir);
}
