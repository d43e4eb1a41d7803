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

/// The library names tried, in order.
const HIP_LIBS: [&str; 3] = ["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"];

/// Whether a HIP device is usable: libamdhip64 loads (from the loader path, `$ROCM_PATH/lib`
/// or `/opt/rocm/lib`), and `hipGetDeviceCount` reports at least one device. Checked once.
pub fn availability() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT.get_or_init(probe).clone()
}

fn candidates() -> Vec<String> {
    let mut v: Vec<String> = HIP_LIBS.iter().map(|s| s.to_string()).collect();
    let rocm = std::env::var("ROCM_PATH").unwrap_or_else(|_| "/opt/rocm".into());
    v.extend(HIP_LIBS.iter().map(|l| format!("{rocm}/lib/{l}")));
    v
}

fn probe() -> Result<(), String> {
    let names = candidates();
    let lib = names
        .iter()
        .find_map(|n| {
            // SAFETY: loading libamdhip64 runs its initialisers, which only set up the HIP
            // runtime; the library stays loaded for the life of the process (leaked below).
            unsafe { libloading::Library::new(n) }.ok()
        })
        .ok_or_else(|| format!("the HIP runtime (libamdhip64) was not found; tried {names:?}"))?;
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));
    type GetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
    // SAFETY: hipGetDeviceCount has this C signature in every HIP release.
    let get_count: libloading::Symbol<'static, GetCount> =
        unsafe { lib.get(b"hipGetDeviceCount\0") }.map_err(|e| format!("libamdhip64 has no hipGetDeviceCount: {e}"))?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid, writable c_int for the duration of the call.
    let status = unsafe { get_count(&mut n) };
    if status != 0 {
        return Err(format!("hipGetDeviceCount failed with status {status}"));
    }
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
