//! hiprtc, HIP's run-time compiler, behind `tefl_gpu::RtcCompiler`: the kernel sources of
//! `tefl-kernels` with the HIP prelude are compiled for the device's `gcnArchName`
//! (`--offload-arch=gfx…`) into code objects, cached on disk and per device by `tefl-gpu`.
//! Loaded at run time from `libhiprtc.so.{7,6}`, or from libamdhip64 itself on ROCm 5 where
//! hiprtc lives inside the runtime. It needs no GPU: CI compiles every kernel variant with it.

use std::ffi::{CStr, CString, c_char, c_int};
use std::sync::OnceLock;

use tefl_core::{Error, Result};
use tefl_gpu::{RtcCompiler, Target};

use crate::hip::{RUNTIME_LIBS, candidates, open_first};

type Program = *mut std::ffi::c_void;
type RtcResult = c_int;

/// The library names tried for hiprtc (ROCm 7 and 6 ship it apart; ROCm 5 inside the runtime).
pub const HIPRTC_LIBS: [&str; 2] = ["libhiprtc.so.7", "libhiprtc.so.6"];

/// hiprtc's entry points, resolved once.
struct HiprtcApi {
    library: String,
    _lib: libloading::Library,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> RtcResult,
    error_string: unsafe extern "C" fn(RtcResult) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> RtcResult,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> RtcResult,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> RtcResult,
    log: unsafe extern "C" fn(Program, *mut c_char) -> RtcResult,
    code_size: unsafe extern "C" fn(Program, *mut usize) -> RtcResult,
    code: unsafe extern "C" fn(Program, *mut c_char) -> RtcResult,
    destroy: unsafe extern "C" fn(*mut Program) -> RtcResult,
}

fn load() -> std::result::Result<HiprtcApi, String> {
    let mut files = candidates(&HIPRTC_LIBS);
    files.extend(candidates(&RUNTIME_LIBS));
    let (lib, library) = open_first(&files)
        .ok_or_else(|| format!("hiprtc (the HIP run-time compiler) was not found; tried {files:?}"))?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol has the C signature of the field it is stored in (hiprtc.h of
            // ROCm 5 to 7); the library is kept next to the pointers and never unloaded.
            *unsafe { lib.get($name) }
                .map_err(|e| format!("{library} has no {}: {e}", String::from_utf8_lossy(&$name[..$name.len() - 1])))?
        };
    }
    Ok(HiprtcApi {
        version: sym!(b"hiprtcVersion\0"),
        error_string: sym!(b"hiprtcGetErrorString\0"),
        create: sym!(b"hiprtcCreateProgram\0"),
        compile: sym!(b"hiprtcCompileProgram\0"),
        log_size: sym!(b"hiprtcGetProgramLogSize\0"),
        log: sym!(b"hiprtcGetProgramLog\0"),
        code_size: sym!(b"hiprtcGetCodeSize\0"),
        code: sym!(b"hiprtcGetCode\0"),
        destroy: sym!(b"hiprtcDestroyProgram\0"),
        library,
        _lib: lib,
    })
}

fn api() -> std::result::Result<&'static HiprtcApi, String> {
    static API: OnceLock<std::result::Result<HiprtcApi, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

impl HiprtcApi {
    fn error(&self, r: RtcResult, what: &str) -> String {
        // SAFETY: hiprtcGetErrorString takes any code and returns a static string (or null).
        let p = unsafe { (self.error_string)(r) };
        let name = if p.is_null() {
            format!("hiprtc error {r}")
        } else {
            // SAFETY: a non-null result is a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        format!("{what}: {name}")
    }

    /// The program's log (empty when it has none).
    fn program_log(&self, prog: Program) -> String {
        let mut size = 0usize;
        // SAFETY: `prog` is a live program; `size` is a valid out-pointer.
        if unsafe { (self.log_size)(prog, &mut size) } != 0 || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` has the `size` bytes hiprtc reported for the log.
        if unsafe { (self.log)(prog, buf.as_mut_ptr().cast()) } != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&buf).trim_end_matches('\0').trim().to_string()
    }
}

/// Lanes of a wavefront for a gfx target: 64 on GCN/CDNA (gfx8, gfx9), 32 on RDNA (gfx10 and
/// later, in their default wave32 mode).
pub fn wave_size_of(arch: &str) -> u32 {
    let digits: String = arch.trim_start_matches("gfx").chars().take_while(char::is_ascii_alphanumeric).collect();
    let major = if digits.len() >= 4 { &digits[..2] } else { &digits[..1.min(digits.len())] };
    match major.parse::<u32>() {
        Ok(m) if m >= 10 => 32,
        _ => 64,
    }
}

/// A compiled code object and the compiler's log (warnings).
#[derive(Debug)]
pub struct Compiled {
    /// The code object.
    pub binary: Vec<u8>,
    /// What hiprtc printed (empty when nothing).
    pub log: String,
}

/// hiprtc (loaded at run time).
pub struct Hiprtc;

/// Whether hiprtc loads, with the reason when not.
pub fn hiprtc_available() -> std::result::Result<(), String> {
    api().map(|_| ())
}

impl Hiprtc {
    /// Compiles `text` and keeps the log, warnings included (the compile test fails on any).
    pub fn compile_logged(
        &self,
        text: &str,
        file_name: &str,
        options: &[String],
    ) -> std::result::Result<Compiled, String> {
        let api = api()?;
        let src = CString::new(text).map_err(|e| e.to_string())?;
        let name = CString::new(file_name).map_err(|e| e.to_string())?;
        let opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: `src` and `name` are NUL-terminated and outlive the program; no headers.
        let r = unsafe { (api.create)(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()) };
        if r != 0 {
            return Err(api.error(r, "hiprtcCreateProgram"));
        }
        // SAFETY: `prog` is live; the option pointers are NUL-terminated strings alive for the call.
        let r = unsafe { (api.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        let log = api.program_log(prog);
        let out = if r != 0 {
            Err(format!("{}\n{log}", api.error(r, "hiprtcCompileProgram")))
        } else {
            let mut size = 0usize;
            // SAFETY: `prog` compiled; `size` is a valid out-pointer.
            let r = unsafe { (api.code_size)(prog, &mut size) };
            if r != 0 {
                Err(api.error(r, "hiprtcGetCodeSize"))
            } else {
                let mut binary = vec![0u8; size];
                // SAFETY: `binary` has the `size` bytes hiprtc reported for the code object.
                let r = unsafe { (api.code)(prog, binary.as_mut_ptr().cast()) };
                if r != 0 { Err(api.error(r, "hiprtcGetCode")) } else { Ok(Compiled { binary, log }) }
            }
        };
        // SAFETY: destroyed exactly once, after its last use.
        let _ = unsafe { (api.destroy)(&mut prog) };
        out
    }
}

impl RtcCompiler for Hiprtc {
    fn target(&self) -> Target {
        Target::Hip
    }
    fn name(&self) -> &'static str {
        "hiprtc"
    }
    fn device_kind(&self) -> &'static str {
        "hip"
    }
    fn available(&self) -> std::result::Result<(), String> {
        hiprtc_available()
    }
    fn version(&self) -> Result<String> {
        let api = api().map_err(|reason| Error::DeviceUnavailable { device: "hip".into(), reason })?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: both out-pointers are valid for the call.
        let r = unsafe { (api.version)(&mut major, &mut minor) };
        if r != 0 {
            return Err(Error::DeviceFailure { device: "hip".into(), reason: api.error(r, "hiprtcVersion") });
        }
        Ok(format!("{major}.{minor} ({})", api.library))
    }
    fn options(&self, arch: &str) -> Vec<String> {
        vec![
            format!("--offload-arch={arch}"),
            "-O3".into(),
            "-std=c++17".into(),
            format!("-DTEFL_WAVE_SIZE={}", wave_size_of(arch)),
        ]
    }
    fn binary_extension(&self) -> &'static str {
        "hsaco"
    }
    fn compile_text(
        &self,
        text: &str,
        file_name: &str,
        options: &[String],
        _kernels: usize,
    ) -> std::result::Result<Vec<u8>, String> {
        let c = self.compile_logged(text, file_name, options)?;
        if !c.log.is_empty() {
            tracing::warn!(target: "TE-FL", "hiprtc warnings for {file_name}: {}", c.log);
        }
        Ok(c.binary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wave_size_follows_the_gfx_generation() {
        for (arch, w) in
            [("gfx908", 64), ("gfx90a", 64), ("gfx942", 64), ("gfx1030", 32), ("gfx1100", 32), ("gfx803", 64)]
        {
            assert_eq!(wave_size_of(arch), w, "{arch}");
        }
    }
}
