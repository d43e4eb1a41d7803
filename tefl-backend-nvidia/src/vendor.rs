//! The NVIDIA vendor description (FlagGems' `VendorInfoBase`) and availability check.

use std::sync::OnceLock;

use tefl_core::VendorInfo;

/// The vendor name impls and allow/deny lists use.
pub const VENDOR: &str = "nvidia";

/// nvidia / cuda / nvidia-smi, with the arch families tune configs are keyed by.
pub fn vendor_info() -> VendorInfo {
    VendorInfo::new(VENDOR, "cuda", "nvidia-smi")
        .arch_map(&[
            ("sm_10", "blackwell"),
            ("sm_12", "blackwell"),
            ("sm_9", "hopper"),
            ("sm_8", "ampere"),
            ("sm_75", "turing"),
            ("sm_7", "volta"),
        ])
        .availability(availability)
        .kernels(crate::heuristics::kernel_choice)
}

tefl_core::register_vendor!(vendor_info);

/// Whether a CUDA device is usable: `TE_FL_SKIP_CUDA` is not 1, libcuda loads, `cuInit`
/// succeeds and reports at least one device. Checked once per process; never panics.
pub fn availability() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    // The one reader of the environment decides; a malformed variable is its error.
    match tefl_core::policy::env() {
        Ok(env) if env.skip_cuda => return Err("skipped by TE_FL_SKIP_CUDA=1".into()),
        Ok(_) => {}
        Err(e) => return Err(e.to_string()),
    }
    // SAFETY: is_culib_present only tries dlopen on candidate names and drops the handles;
    // it must run before any other cudarc call, which would panic without libcuda.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda) was not found".into());
    }
    cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
    let n = cudarc::driver::result::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))?;
    if n < 1 {
        return Err("the CUDA driver reports no device".into());
    }
    Ok(())
}

/// The CUDA driver's version (`12.8` for 12080), for keys of cached tuning results: a driver
/// upgrade invalidates them. `unknown` when no driver is usable.
pub fn driver_version() -> &'static str {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| {
        if availability().is_err() {
            return "unknown".into();
        }
        let mut v: std::ffi::c_int = 0;
        // SAFETY: availability() succeeded, so libcuda is loaded and cuInit ran; the call only
        // writes one int through the pointer, which is valid for the call.
        let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
        if r == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            format!("{}.{}", v / 1000, (v % 1000) / 10)
        } else {
            "unknown".into()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_nvidia() {
        let v = vendor_info();
        assert_eq!(v.dispatch_key(), "CUDA");
        assert_eq!(v.arch_family("sm_90a"), Some("hopper"));
        assert_eq!(v.arch_family("sm_75"), Some("turing"));
        assert_eq!(v.arch_family("sm_70"), Some("volta"));
        assert_eq!(v.arch_family("sm_100"), Some("blackwell"));
    }

    #[test]
    fn availability_never_panics() {
        // On a machine without the driver this is an Err with a reason; with one, Ok.
        if let Err(reason) = availability() {
            assert!(!reason.is_empty());
        }
    }
}
