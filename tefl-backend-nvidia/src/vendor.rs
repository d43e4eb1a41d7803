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
}

tefl_core::register_vendor!(vendor_info);

/// Whether a CUDA device is usable: `TE_FL_SKIP_CUDA` is not 1, libcuda loads, `cuInit`
/// succeeds and reports at least one device. Checked once per process; never panics.
pub fn availability() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    match tefl_core::policy::env_lookup("TE_FL_SKIP_CUDA") {
        Ok(Some(v)) => match tefl_core::policy::parse_flag("TE_FL_SKIP_CUDA", &v) {
            Ok(true) => return Err("skipped by TE_FL_SKIP_CUDA=1".into()),
            Ok(false) => {}
            Err(e) => return Err(e.to_string()),
        },
        Ok(None) => {}
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
