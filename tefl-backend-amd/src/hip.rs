//! The HIP runtime, loaded at run time: the library names of ROCm 7, 6 and 5 are tried in
//! order, every entry point this backend calls is resolved once into [`HipApi`], and
//! `hipInit(0)` runs right after loading (ROCm 7's module loads fail without it). Nothing here
//! links ROCm at build time, so a binary with this backend starts on any machine.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

/// `hipError_t`.
pub type HipError = c_int;
/// `hipStream_t` (null: the device's null stream).
pub type HipStream = *mut c_void;
/// `hipModule_t`.
pub type HipModule = *mut c_void;
/// `hipFunction_t`.
pub type HipFunction = *mut c_void;
/// `hipEvent_t`.
pub type HipEvent = *mut c_void;

/// `hipSuccess`.
pub const HIP_SUCCESS: HipError = 0;
/// `hipMemcpyHostToDevice`.
pub const MEMCPY_H2D: c_int = 1;
/// `hipMemcpyDeviceToHost`.
pub const MEMCPY_D2H: c_int = 2;
/// `hipMemcpyDeviceToDevice`.
pub const MEMCPY_D2D: c_int = 3;

/// `hipDeviceAttribute_t` values this backend reads (the CUDA-compatible block of the enum,
/// unchanged since ROCm 5.0).
pub mod attr {
    use std::ffi::c_int;
    /// Threads a block may have.
    pub const MAX_THREADS_PER_BLOCK: c_int = 56;
    /// Compute units.
    pub const MULTIPROCESSOR_COUNT: c_int = 63;
    /// Shared (LDS) memory a block may use, in bytes.
    pub const MAX_SHARED_MEMORY_PER_BLOCK: c_int = 74;
    /// Lanes of a wavefront (64 on CDNA, 32 on RDNA).
    pub const WARP_SIZE: c_int = 87;
}

/// The library names tried for the runtime (newest ROCm first).
pub const RUNTIME_LIBS: [&str; 4] = ["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"];

/// Declares a table of a run-time loaded library's entry points: a struct with the library's
/// file name, the library handle and one typed function pointer per entry, and `resolve`,
/// which looks every entry up once (an error names the first missing one).
macro_rules! library_api {
    ($(#[$sm:meta])* $name:ident { $( $(#[$m:meta])* $field:ident = $sym:literal : fn($($arg:ty),*) $(-> $ret:ty)?; )* }) => {
        $(#[$sm])*
        pub struct $name {
            /// The file the library was loaded from.
            pub library: String,
            _lib: libloading::Library,
            $( $(#[$m])* pub $field: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
        }

        impl $name {
            /// Resolves every entry point of `lib` (an error names the first missing one).
            pub(crate) fn resolve(lib: libloading::Library, library: String) -> Result<$name, String> {
                $(
                    // SAFETY: the symbol is declared with this C signature in every ROCm
                    // release this backend loads (see the table's docs); the library outlives
                    // the pointer (it is stored next to it and never unloaded while the table
                    // lives).
                    let $field = *unsafe { lib.get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>($sym) }
                        .map_err(|e| format!("{library} has no {}: {e}", String::from_utf8_lossy(&$sym[..$sym.len() - 1])))?;
                )*
                Ok($name { library, _lib: lib, $($field,)* })
            }
        }
    };
}
pub(crate) use library_api;

library_api! {
    /// The HIP runtime's entry points this backend calls (HIP 5.x to 7.x), resolved once.
    HipApi {
    /// `hipInit`.
    init = b"hipInit\0": fn(c_uint) -> HipError;
    /// `hipGetDeviceCount`.
    get_device_count = b"hipGetDeviceCount\0": fn(*mut c_int) -> HipError;
    /// `hipGetErrorName`.
    get_error_name = b"hipGetErrorName\0": fn(HipError) -> *const c_char;
    /// `hipSetDevice`.
    set_device = b"hipSetDevice\0": fn(c_int) -> HipError;
    /// `hipDeviceGetAttribute`.
    device_get_attribute = b"hipDeviceGetAttribute\0": fn(*mut c_int, c_int, c_int) -> HipError;
    /// `hipDeviceGetName`.
    device_get_name = b"hipDeviceGetName\0": fn(*mut c_char, c_int, c_int) -> HipError;
    /// `hipDeviceTotalMem`.
    device_total_mem = b"hipDeviceTotalMem\0": fn(*mut usize, c_int) -> HipError;
    /// `hipRuntimeGetVersion`.
    runtime_get_version = b"hipRuntimeGetVersion\0": fn(*mut c_int) -> HipError;
    /// `hipMalloc`.
    malloc = b"hipMalloc\0": fn(*mut *mut c_void, usize) -> HipError;
    /// `hipFree`.
    free = b"hipFree\0": fn(*mut c_void) -> HipError;
    /// `hipMemcpy`.
    memcpy = b"hipMemcpy\0": fn(*mut c_void, *const c_void, usize, c_int) -> HipError;
    /// `hipMemcpyAsync`.
    memcpy_async = b"hipMemcpyAsync\0": fn(*mut c_void, *const c_void, usize, c_int, HipStream) -> HipError;
    /// `hipMemsetD8Async`.
    memset_d8_async = b"hipMemsetD8Async\0": fn(*mut c_void, u8, usize, HipStream) -> HipError;
    /// `hipStreamSynchronize`.
    stream_synchronize = b"hipStreamSynchronize\0": fn(HipStream) -> HipError;
    /// `hipStreamWaitEvent`.
    stream_wait_event = b"hipStreamWaitEvent\0": fn(HipStream, HipEvent, c_uint) -> HipError;
    /// `hipEventCreate`.
    event_create = b"hipEventCreate\0": fn(*mut HipEvent) -> HipError;
    /// `hipEventRecord`.
    event_record = b"hipEventRecord\0": fn(HipEvent, HipStream) -> HipError;
    /// `hipEventSynchronize`.
    event_synchronize = b"hipEventSynchronize\0": fn(HipEvent) -> HipError;
    /// `hipEventElapsedTime`.
    event_elapsed_time = b"hipEventElapsedTime\0": fn(*mut f32, HipEvent, HipEvent) -> HipError;
    /// `hipEventDestroy`.
    event_destroy = b"hipEventDestroy\0": fn(HipEvent) -> HipError;
    /// `hipModuleLoadData`.
    module_load_data = b"hipModuleLoadData\0": fn(*mut HipModule, *const c_void) -> HipError;
    /// `hipModuleGetFunction`.
    module_get_function = b"hipModuleGetFunction\0": fn(*mut HipFunction, HipModule, *const c_char) -> HipError;
    /// `hipModuleLaunchKernel`.
    module_launch_kernel = b"hipModuleLaunchKernel\0": fn(
        HipFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, HipStream, *mut *mut c_void, *mut *mut c_void
    ) -> HipError;
}}

impl HipApi {
    /// The name of a HIP error code (`hipErrorNoDevice`), or its number when the runtime does
    /// not know it.
    pub fn error_name(&self, e: HipError) -> String {
        // SAFETY: hipGetErrorName takes any code and returns a static string (or null).
        let p = unsafe { (self.get_error_name)(e) };
        if p.is_null() {
            return format!("HIP error {e}");
        }
        // SAFETY: a non-null result is a NUL-terminated static string of the runtime.
        unsafe { CStr::from_ptr(p) }.to_str().map_or_else(|_| format!("HIP error {e}"), |s| format!("{s} ({e})"))
    }

    /// `Ok` for `hipSuccess`, else `what` failing with the error's name.
    pub fn check(&self, e: HipError, what: &str) -> Result<(), String> {
        if e == HIP_SUCCESS { Ok(()) } else { Err(format!("{what} failed: {}", self.error_name(e))) }
    }
}

/// The candidate files: each name on the loader path, then under `$ROCM_PATH/lib` (default
/// `/opt/rocm/lib`).
pub fn candidates(names: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let rocm = std::env::var("ROCM_PATH").unwrap_or_else(|_| "/opt/rocm".into());
    v.extend(names.iter().map(|l| format!("{rocm}/lib/{l}")));
    v
}

/// Opens the first of `files` that loads.
pub fn open_first(files: &[String]) -> Option<(libloading::Library, String)> {
    files.iter().find_map(|f| {
        // SAFETY: loading a ROCm library runs its initialisers, which only set up its runtime
        // state; it stays loaded for the life of the process (the tables are statics).
        unsafe { libloading::Library::new(f) }.ok().map(|l| (l, f.clone()))
    })
}

/// Loads the runtime and runs `hipInit(0)`: the runtime's entry points, or why HIP cannot be
/// used here (no library, a missing entry point, or `hipInit`'s error by name). Once per
/// process.
pub fn api() -> Result<&'static HipApi, String> {
    static API: OnceLock<Result<HipApi, String>> = OnceLock::new();
    API.get_or_init(|| load(&candidates(&RUNTIME_LIBS))).as_ref().map_err(Clone::clone)
}

/// Loads the first of `files` that opens, resolves its entry points and runs `hipInit(0)`.
fn load(files: &[String]) -> Result<HipApi, String> {
    let (lib, file) =
        open_first(files).ok_or_else(|| format!("the HIP runtime (libamdhip64) was not found; tried {files:?}"))?;
    let api = HipApi::resolve(lib, file)?;
    // SAFETY: hipInit takes flags (must be 0) and may be called more than once.
    let r = unsafe { (api.init)(0) };
    api.check(r, "hipInit").map_err(|e| format!("{e} (runtime {})", api.library))?;
    Ok(api)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_library_is_unavailable_naming_the_library() {
        let err = load(&["/nonexistent/libamdhip64.so.5".to_string()]).err().expect("nothing to load");
        assert!(err.contains("libamdhip64") && err.contains("/nonexistent/libamdhip64.so.5"), "{err}");
    }

    /// Against the real runtime when one is installed (CI installs Debian's ROCm 5.2 runtime
    /// and sets TEFL_EXPECT_HIP_RUNTIME=1, so there this cannot skip): without an AMD GPU,
    /// loading works and the backend is unavailable with the HIP error's name in the reason.
    #[test]
    fn the_real_runtime_reports_unavailable_with_the_hip_error() {
        let expected = std::env::var("TEFL_EXPECT_HIP_RUNTIME").is_ok_and(|v| v == "1");
        let files = candidates(&RUNTIME_LIBS);
        let Some((lib, file)) = open_first(&files) else {
            assert!(!expected, "TEFL_EXPECT_HIP_RUNTIME=1 but no HIP runtime loads from {files:?}");
            eprintln!("skipped: no HIP runtime here");
            return;
        };
        let api = HipApi::resolve(lib, file).expect("every entry point resolves in a real runtime");
        match crate::availability() {
            Ok(()) => eprintln!("a HIP device is present: available"),
            Err(reason) => {
                assert!(reason.contains("hipError"), "the reason should name the HIP error: {reason}");
                assert!(reason.contains("hipInit") || reason.contains("hipGetDeviceCount"), "{reason}");
            }
        }
        // Error names come from the runtime itself.
        assert!(api.error_name(100).contains("hipErrorNoDevice"), "{}", api.error_name(100));
    }
}
