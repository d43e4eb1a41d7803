//! The AMD vendor description and availability check.

use std::ffi::c_int;
use std::sync::OnceLock;

use tefl_core::VendorInfo;

/// The vendor name impls and allow/deny lists use.
pub const VENDOR: &str = "amd";

/// amd / hip / rocm-smi, with the arch families tune configs are keyed by.
pub fn vendor_info() -> VendorInfo {
    VendorInfo::new(VENDOR, "hip", "rocm-smi")
        .arch_map(&[
            ("gfx95", "cdna4"),
            ("gfx94", "cdna3"),
            ("gfx90a", "cdna2"),
            ("gfx908", "cdna1"),
            ("gfx11", "rdna3"),
        ])
        .availability(availability)
}

tefl_core::register_vendor!(vendor_info);

/// Whether a HIP device is usable: the runtime loads (ROCm 7, 6 or 5; from the loader path,
/// `$ROCM_PATH/lib` or `/opt/rocm/lib`), `hipInit(0)` succeeds and `hipGetDeviceCount` reports
/// at least one device. Checked once; the reason names the library or the HIP error.
pub fn availability() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    let api = crate::hip::api()?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid, writable c_int for the duration of the call.
    let status = unsafe { (api.get_device_count)(&mut n) };
    api.check(status, "hipGetDeviceCount")?;
    if n < 1 {
        return Err("the HIP runtime reports no device".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_amd() {
        let v = vendor_info();
        assert_eq!(v.dispatch_key(), "HIP");
        assert_eq!(v.arch_family("gfx942"), Some("cdna3"));
    }

    #[test]
    fn availability_never_panics() {
        if let Err(reason) = availability() {
            assert!(!reason.is_empty());
        }
    }
}
