//! The Vulkan backend description and availability check.

use tefl_core::VendorInfo;

/// The name the backend's impls carry as vendor (so `TE_FL_DENY_VENDORS=vulkan` works).
pub const VENDOR: &str = "vulkan";

/// vulkan / vulkan / vulkaninfo, with the arch families (one per GPU vendor) tune configs
/// are keyed by.
pub fn vendor_info() -> VendorInfo {
    VendorInfo::new(VENDOR, "vulkan", "vulkaninfo")
        .arch_map(&[("nvidia", "nvidia"), ("amd", "amd"), ("intel", "intel"), ("lavapipe", "lavapipe")])
        .availability(availability)
        .kernels(crate::heuristics::kernel_choice)
}

tefl_core::register_vendor!(vendor_info);

/// Whether a Vulkan device is usable: the loader (libvulkan) opens, a Vulkan 1.2 instance is
/// created and at least one device has a compute queue (`TEFL_VULKAN_DEVICE` may narrow the
/// list). Checked once; the reason says which step failed.
pub fn availability() -> Result<(), String> {
    crate::context::instance().map(|_| ())
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
        assert_eq!(vendor_info().arch_family("lavapipe"), Some("lavapipe"));
    }
}
