//! Loading and launching kernel variants on HIP devices: each variant is compiled by hiprtc
//! for the device's arch (cached on disk by `tefl-gpu`), loaded once per device, and its entry
//! points launched on the device's queue. This crate's [`GpuTarget`] lets the shared op code
//! of `tefl_gpu::simt` run here.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use tefl_core::device::DeviceInfo;
use tefl_core::tuning::TuneTable;
use tefl_core::{Device, DeviceKind, Error, Result, Tensor};
use tefl_gpu::rtc::{ModuleCache, compile_cached};
use tefl_gpu::target::GpuTarget;
use tefl_gpu::{Arg, Grid, PackedArgs, Variant};

use crate::hip::{HipFunction, HipModule};
use crate::hiprtc::Hiprtc;
use crate::runtime::{self, failure};

/// A code object loaded on one device, with its functions resolved on demand.
struct Module {
    module: HipModule,
    functions: Mutex<HashMap<&'static str, usize>>,
}

// SAFETY: hipModule_t and hipFunction_t are runtime handles usable from any thread once the
// device is current; the map is behind a mutex.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

fn modules() -> &'static ModuleCache<Module> {
    static M: OnceLock<ModuleCache<Module>> = OnceLock::new();
    M.get_or_init(ModuleCache::new)
}

/// The facts of a device, looked up once (`tefl_core::device::info`).
pub(crate) fn info(device: Device) -> Result<Arc<DeviceInfo>> {
    tefl_core::device::info(device)
}

/// The entry `name` of `variant` on `device` (compiled, loaded and resolved on first use).
fn function(device: Device, variant: &Variant, name: &'static str) -> Result<HipFunction> {
    if !variant.has_entry(name) {
        return Err(failure(
            device,
            format!("{name} is not an entry point of {}'s variant ({:?})", variant.source.name, variant.entries),
        ));
    }
    let module = modules().get_or_load(device.ordinal, variant, || {
        let api = runtime::global().enter(device)?;
        let code = compile_cached(&Hiprtc, variant, &info(device)?.arch)?;
        let mut module: HipModule = std::ptr::null_mut();
        // SAFETY: the device is current; `code` is a complete code object that outlives the
        // call (the runtime copies it); `module` is a valid out-pointer.
        let r = unsafe { (api.module_load_data)(&mut module, code.as_ptr() as *const c_void) };
        api.check(r, "hipModuleLoadData").map_err(|e| failure(device, e))?;
        Ok(Module { module, functions: Mutex::new(HashMap::new()) })
    })?;
    let mut fns = module.functions.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&f) = fns.get(name) {
        return Ok(f as HipFunction);
    }
    let api = runtime::global().enter(device)?;
    let cname = CString::new(name).map_err(|e| Error::Tensor(e.to_string()))?;
    let mut f: HipFunction = std::ptr::null_mut();
    // SAFETY: `module.module` is a loaded module of this device; `f` is a valid out-pointer.
    let r = unsafe { (api.module_get_function)(&mut f, module.module, cname.as_ptr()) };
    api.check(r, "hipModuleGetFunction")
        .map_err(|e| failure(device, format!("kernel {name} of {}: {e}", variant.source.path)))?;
    fns.insert(name, f as usize);
    Ok(f)
}

/// Queues the entry `name` of `variant` on the device's queue (the caller's stream inside
/// `tefl_core::device::with_queue`). Nothing waits for it; a launch the runtime refuses comes
/// back as a typed error.
pub fn launch(device: Device, variant: &Variant, name: &'static str, grid: Grid, args: &[Arg]) -> Result<()> {
    if grid.is_empty() {
        return Ok(());
    }
    let f = function(device, variant, name)?;
    let rt = runtime::global();
    rt.on_queue(device, |stream| {
        let api = rt.enter(device)?;
        let mut packed = PackedArgs::new(args);
        // SAFETY: each parameter points at 8 bytes holding the argument in its low bytes (the
        // kernel reads sizeof(param) <= 8 bytes, little-endian); `packed` outlives the call; the
        // kernel's signature matches `args` (the shared op files pass the arguments its kernel
        // declares); pointers are live allocations of this device.
        let r = unsafe {
            (api.module_launch_kernel)(
                f,
                grid.blocks.0,
                grid.blocks.1,
                grid.blocks.2,
                grid.threads.0,
                grid.threads.1,
                grid.threads.2,
                grid.smem,
                stream,
                packed.pointers().as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        api.check(r, "hipModuleLaunchKernel").map_err(|e| failure(device, format!("launch of {name}: {e}")))
    })
}

/// The device address of a HIP tensor (a typed error for a tensor elsewhere).
pub fn ptr(t: &Tensor) -> Result<u64> {
    Ok(runtime::global().buffer(t.buffer().as_ref())?.device_ptr())
}

/// The HIP target of the shared op code (`tefl_gpu::simt`).
struct HipTarget;

impl GpuTarget for HipTarget {
    fn device_kind(&self) -> DeviceKind {
        DeviceKind::HIP
    }
    fn launch(&self, device: Device, variant: &Variant, entry: &'static str, grid: Grid, args: &[Arg]) -> Result<()> {
        launch(device, variant, entry, grid, args)
    }
    fn address(&self, t: &Tensor) -> Result<u64> {
        ptr(t)
    }
    fn tune_table(&self, device: Device) -> Result<Arc<TuneTable>> {
        Ok(crate::heuristics::TUNE_CONFIGS.table(&info(device)?.arch))
    }
}

tefl_gpu::register_gpu_target!(&HipTarget);
