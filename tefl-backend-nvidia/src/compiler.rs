//! Kernel compilation and loading: CUDA C++ sources under `src/ops/` are compiled by NVRTC
//! for the device's arch at first use, with the embedded prelude and tune parameters as
//! defines, and cached on disk (`$TEFL_CACHE_DIR/nvrtc/`) keyed by source hash, options,
//! arch and NVRTC version. Loaded modules are cached per device in memory.
//!
//! No toolkit header is ever included: an end user's machine may have the driver and
//! libnvrtc but no CUDA toolkit.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{CUfunction, CUfunction_attribute, CUmodule};
use cudarc::nvrtc::sys as nvrtc_sys;
use tefl_core::tuning::{fnv1a64, write_atomic};
use tefl_core::{Device, Error, Result, Tensor};

use crate::runtime::{self, device_error};

/// The prelude every kernel source is compiled with.
pub const PRELUDE: &str = include_str!("kernels/prelude.cuh");

/// One CUDA C++ source file of the backend.
#[derive(Debug)]
pub struct Source {
    /// A short name (cache file names, error messages).
    pub name: &'static str,
    /// The text (without the prelude).
    pub text: &'static str,
}

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

/// The NVRTC version as (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    nvrtc_available().map_err(|reason| Error::DeviceUnavailable { device: "cuda".into(), reason })?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: libnvrtc is present (checked above); both out-pointers are valid.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::DeviceFailure { device: "cuda".into(), reason: format!("nvrtcVersion: {e:?}") })?;
    Ok((major, minor))
}

/// The full text NVRTC sees: the prelude, the defines, then the source. `WARP_SIZE` (which
/// the prelude's own functions use) goes before the prelude; the others after it, so that a
/// define named like a template parameter (`T`, `D`) cannot reach the prelude.
pub fn full_source(src: &Source, defines: &[(&str, String)]) -> String {
    let mut s = String::with_capacity(PRELUDE.len() + src.text.len() + 256);
    for (k, v) in defines.iter().filter(|(k, _)| *k == "WARP_SIZE") {
        s.push_str(&format!("#define {k} {v}\n"));
    }
    s.push_str(PRELUDE);
    s.push('\n');
    for (k, v) in defines.iter().filter(|(k, _)| *k != "WARP_SIZE") {
        s.push_str(&format!("#undef {k}\n#define {k} {v}\n"));
    }
    s.push_str("#line 1 \"");
    s.push_str(src.name);
    s.push_str(".cu\"\n");
    s.push_str(src.text);
    s
}

fn options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}"), "--std=c++17".into(), "-default-device".into(), "-lineinfo".into()]
}

fn compile_error(src: &Source, log: String) -> Error {
    Error::DeviceFailure { device: "cuda".into(), reason: format!("NVRTC could not compile {}.cu: {log}", src.name) }
}

/// Compiles `src` with `defines` for `arch` (e.g. `sm_90`) into a cubin, without a cache.
pub fn compile(src: &Source, defines: &[(&str, String)], arch: &str) -> Result<Vec<u8>> {
    nvrtc_available().map_err(|reason| Error::DeviceUnavailable { device: "cuda".into(), reason })?;
    let text = CString::new(full_source(src, defines)).map_err(|e| compile_error(src, e.to_string()))?;
    let name = CString::new(format!("{}.cu", src.name)).map_err(|e| compile_error(src, e.to_string()))?;
    let prog = cudarc::nvrtc::result::create_program(&text, Some(&name))
        .map_err(|e| compile_error(src, format!("nvrtcCreateProgram: {e:?}")))?;
    // SAFETY: `prog` is a live program (created above, destroyed once below); `text` and
    // `name` outlive it.
    let out = unsafe {
        match cudarc::nvrtc::result::compile_program(prog, &options(arch)) {
            Ok(()) => {
                let mut size = 0usize;
                let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size).result();
                let mut cubin = vec![0u8; size];
                r.and_then(|()| nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()).result())
                    .map(|()| cubin)
                    .map_err(|e| compile_error(src, format!("nvrtcGetCUBIN: {e:?}")))
            }
            Err(e) => {
                let log = cudarc::nvrtc::result::get_program_log(prog)
                    .map(|l| String::from_utf8_lossy(&l.iter().map(|&c| c as u8).collect::<Vec<_>>()).into_owned())
                    .unwrap_or_default();
                Err(compile_error(src, format!("{e:?}\n{}", log.trim_end_matches('\0'))))
            }
        }
    };
    // SAFETY: destroyed exactly once, after its last use.
    let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
    out
}

/// Where compiled cubins are cached (`$TEFL_CACHE_DIR/nvrtc`).
pub fn cache_dir() -> Result<PathBuf> {
    Ok(tefl_core::tuning::default_cache_dir()?.join("nvrtc"))
}

/// The cache key of a compilation: source (with prelude and defines), options, arch, NVRTC version.
pub fn cache_key(src: &Source, defines: &[(&str, String)], arch: &str, version: (i32, i32)) -> u64 {
    let mut bytes = full_source(src, defines).into_bytes();
    bytes.extend(options(arch).join(" ").bytes());
    bytes.extend(format!("|{arch}|nvrtc {}.{}", version.0, version.1).bytes());
    fnv1a64(&bytes)
}

/// Compiles through the on-disk cache: a hit reads the cubin, a miss compiles and stores it.
pub fn compile_cached(src: &Source, defines: &[(&str, String)], arch: &str) -> Result<Vec<u8>> {
    let version = nvrtc_version()?;
    let key = cache_key(src, defines, arch, version);
    let path = cache_dir().map(|d| d.join(format!("{}-{arch}-{key:016x}.cubin", src.name)));
    if let Ok(p) = &path
        && let Ok(bytes) = std::fs::read(p)
        && !bytes.is_empty()
    {
        tracing::debug!(target: "TE-FL", "kernel cache hit {}", p.display());
        return Ok(bytes);
    }
    let cubin = compile(src, defines, arch)?;
    match &path {
        Ok(p) => {
            if let Err(e) = write_atomic(p, &cubin) {
                tracing::warn!(target: "TE-FL", "kernel cache not written: {e}");
            }
        }
        Err(e) => tracing::warn!(target: "TE-FL", "no kernel cache directory: {e}"),
    }
    Ok(cubin)
}

/// A module loaded on one device, with its functions resolved on demand.
struct Module {
    module: CUmodule,
    functions: Mutex<HashMap<&'static str, Function>>,
}

// SAFETY: CUmodule and CUfunction are driver handles usable from any thread once the owning
// context is current; the map is behind a mutex.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

/// A kernel function ready to launch on one device.
#[derive(Clone, Copy, Debug)]
pub struct Function {
    f: CUfunction,
    name: &'static str,
}

// SAFETY: a CUfunction handle is plain data valid for the module's lifetime (the process).
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

type ModuleKey = (u32, &'static str, String);

fn modules() -> &'static Mutex<HashMap<ModuleKey, Arc<Module>>> {
    static M: OnceLock<Mutex<HashMap<ModuleKey, Arc<Module>>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The function `name` of `src` compiled with `defines` for `device` (compiled and loaded on
/// first use).
pub fn function(
    device: Device,
    src: &'static Source,
    defines: &[(&'static str, String)],
    name: &'static str,
) -> Result<Function> {
    let key_defines = defines.iter().map(|(k, v)| format!("{k}={v};")).collect::<String>();
    let key = (device.ordinal, src.name, key_defines);
    let existing = lock(modules()).get(&key).cloned();
    let module = match existing {
        Some(m) => m,
        None => {
            let rt = runtime::global();
            let ctx = rt.context(device)?;
            let arch = tefl_core::device::runtime(device.kind)?.arch(device.ordinal);
            let cubin = compile_cached(src, defines, &arch)?;
            ctx.bind_to_thread().map_err(|e| device_error(device, e))?;
            // SAFETY: the context is current; `cubin` is a complete cubin image that outlives
            // the call (the driver copies it).
            let module = unsafe { cudarc::driver::result::module::load_data(cubin.as_ptr() as *const c_void) }
                .map_err(|e| device_error(device, e))?;
            let m = Arc::new(Module { module, functions: Mutex::new(HashMap::new()) });
            lock(modules()).entry(key).or_insert(m).clone()
        }
    };
    let mut fns = lock(&module.functions);
    if let Some(f) = fns.get(name) {
        return Ok(*f);
    }
    let cname = CString::new(name).map_err(|e| Error::Tensor(e.to_string()))?;
    // SAFETY: `module.module` is a loaded module of this device's context.
    let f = unsafe { cudarc::driver::result::module::get_function(module.module, cname) }.map_err(|e| {
        Error::DeviceFailure {
            device: device.to_string(),
            reason: format!("kernel {name} not in {}.cu: {e:?}", src.name),
        }
    })?;
    let f = Function { f, name };
    fns.insert(name, f);
    Ok(f)
}

/// One kernel argument (passed by value, as the kernel's C signature declares it).
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A device pointer.
    Ptr(u64),
    /// `int`.
    I32(i32),
    /// `unsigned int`.
    U32(u32),
    /// `unsigned long long`.
    U64(u64),
    /// `float`.
    F32(f32),
}

impl Arg {
    fn bits(self) -> u64 {
        match self {
            Arg::Ptr(p) | Arg::U64(p) => p,
            Arg::I32(i) => u64::from(i as u32),
            Arg::U32(u) => u64::from(u),
            Arg::F32(f) => u64::from(f.to_bits()),
        }
    }
}

/// The device address of a CUDA tensor (a typed error for a tensor elsewhere).
pub fn ptr(t: &Tensor) -> Result<u64> {
    Ok(runtime::global().buffer(t.buffer().as_ref())?.device_ptr())
}

/// The device address of an optional CUDA tensor, 0 when absent.
pub fn opt_ptr(t: Option<&Tensor>) -> Result<u64> {
    t.map(ptr).transpose().map(|p| p.unwrap_or(0))
}

/// Launch geometry.
#[derive(Clone, Copy, Debug)]
pub struct Grid {
    /// Blocks in x, y, z.
    pub blocks: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub threads: (u32, u32, u32),
    /// Dynamic shared memory in bytes.
    pub smem: u32,
}

impl Grid {
    /// A one-dimensional grid.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        Grid { blocks: (blocks, 1, 1), threads: (threads, 1, 1), smem: 0 }
    }
}

/// Queues `f` on the device's stream. Nothing waits for it; a launch the driver refuses
/// comes back as a typed error.
pub fn launch(device: Device, f: Function, grid: Grid, args: &[Arg]) -> Result<()> {
    if grid.blocks.0 == 0 || grid.blocks.1 == 0 || grid.blocks.2 == 0 {
        return Ok(());
    }
    let rt = runtime::global();
    let ctx = rt.context(device)?;
    ctx.bind_to_thread().map_err(|e| device_error(device, e))?;
    let stream = rt.stream(device)?;
    if grid.smem > 48 * 1024 {
        // SAFETY: `f.f` is a function of this context's module.
        unsafe {
            cudarc::driver::result::function::set_function_attribute(
                f.f,
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                grid.smem as i32,
            )
        }
        .map_err(|e| launch_error(device, f, e))?;
    }
    let timing = kernel_timing();
    let start = if timing {
        Some(
            stream
                .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| launch_error(device, f, e))?,
        )
    } else {
        None
    };
    let mut storage: Vec<u64> = args.iter().map(|a| a.bits()).collect();
    let mut params: Vec<*mut c_void> = storage.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
    // SAFETY: each parameter points at 8 bytes holding the argument in its low bytes (the
    // kernel reads sizeof(param) <= 8 bytes, little-endian); `storage` outlives the call; the
    // kernel's signature matches `args` (each op module passes the arguments its kernel
    // declares); pointers are live device allocations of this device.
    unsafe {
        cudarc::driver::result::launch_kernel(
            f.f,
            grid.blocks,
            grid.threads,
            grid.smem,
            stream.cu_stream(),
            &mut params,
        )
    }
    .map_err(|e| launch_error(device, f, e))?;
    if let Some(start) = start {
        let end = stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| launch_error(device, f, e))?;
        end.synchronize().map_err(|e| launch_error(device, f, e))?;
        let ms = start.elapsed_ms(&end).map_err(|e| launch_error(device, f, e))?;
        eprintln!(
            "[TE-FL kernel] {} grid {:?} block {:?} smem {} : {ms:.3} ms",
            f.name, grid.blocks, grid.threads, grid.smem
        );
    }
    Ok(())
}

/// `TEFL_KERNEL_TIMING=1`: every launch is timed with events (synchronously) and printed to
/// stderr with its grid, for finding which kernel of an op takes the time.
fn kernel_timing() -> bool {
    tefl_core::policy::env().as_ref().is_ok_and(|e| e.kernel_timing)
}

fn launch_error(device: Device, f: Function, e: cudarc::driver::DriverError) -> Error {
    match device_error(device, e) {
        Error::DeviceFailure { device, reason } => {
            Error::DeviceFailure { device, reason: format!("launch of {}: {reason}", f.name) }
        }
        other => other,
    }
}
