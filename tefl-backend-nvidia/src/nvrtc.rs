//! NVRTC, the CUDA run-time compiler, behind `tefl_gpu::RtcCompiler`: the kernel sources of
//! `tefl-kernels` with the CUDA prelude are compiled for the device's arch at first use, and
//! cached on disk and per device by `tefl-gpu`. No toolkit header is ever included: an end
//! user's machine may have the driver and libnvrtc but no CUDA toolkit.

use std::ffi::CString;
use std::sync::OnceLock;

use cudarc::nvrtc::sys as nvrtc_sys;
use tefl_core::{Error, Result};
use tefl_gpu::{RtcCompiler, Target};

/// NVRTC (loaded at run time).
pub struct Nvrtc;

/// Whether libnvrtc can be loaded (checked before any NVRTC call: cudarc panics without it).
pub fn nvrtc_available() -> std::result::Result<(), String> {
    static R: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    R.get_or_init(|| {
        // SAFETY: only tries dlopen on candidate library names and drops the handles.
        if unsafe { nvrtc_sys::is_culib_present() } {
            Ok(())
        } else {
            Err("libnvrtc (the CUDA runtime compiler) was not found".into())
        }
    })
    .clone()
}

impl RtcCompiler for Nvrtc {
    fn target(&self) -> Target {
        Target::Cuda
    }
    fn name(&self) -> &'static str {
        "nvrtc"
    }
    fn device_kind(&self) -> &'static str {
        "cuda"
    }
    fn available(&self) -> std::result::Result<(), String> {
        nvrtc_available()
    }
    fn version(&self) -> Result<String> {
        nvrtc_available().map_err(|reason| Error::DeviceUnavailable { device: "cuda".into(), reason })?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: libnvrtc is present (checked above); both out-pointers are valid.
        unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| Error::DeviceFailure { device: "cuda".into(), reason: format!("nvrtcVersion: {e:?}") })?;
        Ok(format!("{major}.{minor}"))
    }
    fn options(&self, arch: &str) -> Vec<String> {
        vec![format!("--gpu-architecture={arch}"), "--std=c++17".into(), "-default-device".into(), "-lineinfo".into()]
    }
    fn binary_extension(&self) -> &'static str {
        "cubin"
    }
    fn compile_text(&self, text: &str, file_name: &str, options: &[String]) -> std::result::Result<Vec<u8>, String> {
        let text = CString::new(text).map_err(|e| e.to_string())?;
        let name = CString::new(file_name).map_err(|e| e.to_string())?;
        let prog = cudarc::nvrtc::result::create_program(&text, Some(&name))
            .map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
        // SAFETY: `prog` is a live program (created above, destroyed once below); `text` and
        // `name` outlive it.
        let out = unsafe {
            match cudarc::nvrtc::result::compile_program(prog, options) {
                Ok(()) => {
                    let mut size = 0usize;
                    let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size).result();
                    let mut cubin = vec![0u8; size];
                    r.and_then(|()| nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()).result())
                        .map(|()| cubin)
                        .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))
                }
                Err(e) => {
                    let log = cudarc::nvrtc::result::get_program_log(prog)
                        .map(|l| String::from_utf8_lossy(&l.iter().map(|&c| c as u8).collect::<Vec<_>>()).into_owned())
                        .unwrap_or_default();
                    Err(format!("{e:?}\n{}", log.trim_end_matches('\0')))
                }
            }
        };
        // SAFETY: destroyed exactly once, after its last use.
        let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
        out
    }
}
