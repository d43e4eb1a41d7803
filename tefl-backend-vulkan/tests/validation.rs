//! Under the Khronos validation layer (enabled here through `VK_INSTANCE_LAYERS` when its
//! manifest is installed), tefl's own use of Vulkan reports nothing, and a misuse is counted:
//! the counter the conformance suite fails on does see the layer's messages.
//!
//! CI installs the layer and lavapipe and sets `TEFL_EXPECT_VULKAN=1`, so there this test
//! cannot skip.

use tefl_core::{DType, Device, DeviceKind, Tensor};

const LAYER_MANIFESTS: [&str; 2] = [
    "/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json",
    "/usr/local/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json",
];

#[test]
fn the_validation_layer_sees_no_misuse_and_the_counter_sees_one() {
    let expected = std::env::var("TEFL_EXPECT_VULKAN").is_ok_and(|v| v == "1");
    let layer = LAYER_MANIFESTS.iter().any(|p| std::path::Path::new(p).exists());
    if !layer {
        assert!(!expected, "TEFL_EXPECT_VULKAN=1 but the Khronos validation layer is not installed");
        eprintln!("skipped: no validation layer here");
        return;
    }
    // SAFETY: set before any thread of this test binary reads the environment (this binary
    // has one test, and the Vulkan instance is created after this line).
    unsafe { std::env::set_var("VK_INSTANCE_LAYERS", "VK_LAYER_KHRONOS_validation") };
    if let Err(why) = tefl_backend_vulkan::availability() {
        assert!(!expected, "TEFL_EXPECT_VULKAN=1 but Vulkan is unavailable: {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let device = Device::new(DeviceKind::VULKAN, 0);
    // Memory traffic and a dispatch through the manager's path (an activation of each form).
    let x: Vec<f32> = (0..37).map(|i| i as f32 * 0.25 - 4.0).collect();
    let host = Tensor::from_slice(&x, [37], DType::F32).unwrap();
    let dev = host.to_device(&device).unwrap();
    let back: Vec<f32> = dev.to_vec::<f32>().unwrap();
    assert_eq!(back, x);
    let mgr = tefl_core::Manager::new(tefl_core::Registry::with_builtins(), Default::default());
    let y = mgr.call::<tefl_core::catalogue::Relu>(&tefl_core::catalogue::ActArgs { x: dev.clone() }).unwrap().y;
    let y: Vec<f32> = y.to_vec::<f32>().unwrap();
    let want: Vec<f32> = x.iter().map(|v| v.max(0.0)).collect();
    assert_eq!(y, want);
    assert_eq!(tefl_backend_vulkan::validation_messages(), 0, "tefl's own Vulkan use drew validation messages");

    // A pipeline layout with fewer bindings than the shader declares is invalid: the layer
    // reports it and the counter sees it.
    let gpu = tefl_backend_vulkan::gpu::gpu(device).unwrap();
    // A WGSL variant relu did not use (so not cached); lavapipe makes every such pipeline.
    let name = tefl_backend_vulkan::gpu::shader_names().find(|n| n.starts_with("softmax.")).unwrap();
    let _ = gpu.pipeline(name, 1, 24);
    assert!(tefl_backend_vulkan::validation_messages() > 0, "the layer's message was not counted");
}
