//! The Vulkan backend description and availability check.

use std::sync::OnceLock;

use ash::vk;
use tefl_core::VendorInfo;

/// The name the backend's impls carry as vendor (so `TE_FL_DENY_VENDORS=vulkan` works).
pub const VENDOR: &str = "vulkan";

/// vulkan / vulkan / vulkaninfo.
pub fn vendor_info() -> VendorInfo {
    VendorInfo::new(VENDOR, "vulkan", "vulkaninfo").availability(availability)
}

tefl_core::register_vendor!(vendor_info);

/// Whether a Vulkan device with a compute queue is usable: the loader (libvulkan) opens,
/// an instance is created and at least one physical device has a compute queue. Checked once.
pub fn availability() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    // SAFETY: Entry::load opens the system Vulkan loader; it is kept alive until the end of
    // this function, after the instance it created is destroyed.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| format!("the Vulkan loader was not found: {e}"))?;
    let app = vk::ApplicationInfo::default().api_version(vk::make_api_version(0, 1, 1, 0));
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: `info` and `app` outlive the call; no extensions or layers are requested.
    let instance =
        unsafe { entry.create_instance(&info, None) }.map_err(|e| format!("vkCreateInstance failed: {e}"))?;
    // SAFETY: `instance` is valid until destroyed below; the physical devices it returns are
    // only queried while it lives.
    let result = unsafe {
        match instance.enumerate_physical_devices() {
            Err(e) => Err(format!("vkEnumeratePhysicalDevices failed: {e}")),
            Ok(devs) if devs.is_empty() => Err("no Vulkan physical device".to_string()),
            Ok(devs) => {
                let compute = devs.iter().any(|d| {
                    instance
                        .get_physical_device_queue_family_properties(*d)
                        .iter()
                        .any(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
                });
                if compute { Ok(()) } else { Err("no Vulkan device with a compute queue".to_string()) }
            }
        }
    };
    // SAFETY: nothing created from the instance is alive any more.
    unsafe { instance.destroy_instance(None) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_never_panics() {
        if let Err(reason) = availability() {
            assert!(!reason.is_empty());
        }
        assert_eq!(vendor_info().dispatch_key(), "VULKAN");
    }
}
