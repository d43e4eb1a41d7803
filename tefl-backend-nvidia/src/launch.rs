//! Loading and launching kernel variants on CUDA devices, and the small helpers every op file
//! uses (output tensors, device addresses, size checks). Everything target-neutral (variants,
//! grids, argument packing, caches, tune tables) comes from `tefl-gpu`.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{CUfunction, CUfunction_attribute, CUmodule, CUresult};
use tefl_core::device::DeviceInfo;
use tefl_core::tuning::TuneTable;
use tefl_core::{DType, Device, Error, Result, Tensor};
use tefl_gpu::rtc::{ModuleCache, compile_cached};
use tefl_gpu::{PackedArgs, Variant};

pub use tefl_gpu::{Arg, Defines, Grid, blocks_for};

use crate::nvrtc::Nvrtc;
use crate::runtime::{self, device_error};

/// A module loaded on one device, with its functions resolved on demand.
struct Module {
    module: CUmodule,
    functions: Mutex<HashMap<&'static str, Resolved>>,
}

/// A resolved function: its handle, its static shared memory (read once, at resolution) and
/// the dynamic shared memory it has been opted in to so far (0: the default 48 KiB cap).
#[derive(Clone, Copy)]
struct Resolved {
    f: CUfunction,
    static_smem: u32,
    opted_in: u32,
}

// SAFETY: CUmodule and CUfunction are driver handles usable from any thread once the owning
// context is current; the map is behind a mutex.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

fn modules() -> &'static ModuleCache<Module> {
    static M: OnceLock<ModuleCache<Module>> = OnceLock::new();
    M.get_or_init(ModuleCache::new)
}

/// A kernel entry point ready to launch on one device.
#[derive(Clone, Copy, Debug)]
struct Function {
    f: CUfunction,
    name: &'static str,
}

/// The entry `name` of `variant` on `device` (compiled, loaded and resolved on first use),
/// ready for a launch with `dynamic_smem` bytes of dynamic shared memory: opted in to them
/// where they and the function's static bytes pass the default 48 KiB a block (without the
/// attribute, static and dynamic bytes together get 48 KiB). The device's context must be
/// current on this thread.
fn function(device: Device, variant: &Variant, name: &'static str, dynamic_smem: u32) -> Result<Function> {
    if !variant.has_entry(name) {
        return Err(Error::DeviceFailure {
            device: device.to_string(),
            reason: format!(
                "{name} is not an entry point of {}'s variant ({:?})",
                variant.source.name, variant.entries
            ),
        });
    }
    let module = modules().get_or_load(device.ordinal, variant, || {
        let ctx = runtime::global().context(device)?;
        let cubin = compile_cached(&Nvrtc, variant, &target_arch(variant, &info(device)?.arch))?;
        ctx.bind_to_thread().map_err(|e| device_error(device, e))?;
        // SAFETY: the context is current; `cubin` is a complete cubin image that outlives the
        // call (the driver copies it).
        let module = unsafe { cudarc::driver::result::module::load_data(cubin.as_ptr() as *const c_void) }
            .map_err(|e| device_error(device, e))?;
        Ok(Module { module, functions: Mutex::new(HashMap::new()) })
    })?;
    let mut fns = module.functions.lock().unwrap_or_else(|p| p.into_inner());
    let mut r = match fns.get(name) {
        Some(&r) => r,
        None => {
            let cname = CString::new(name).map_err(|e| Error::Tensor(e.to_string()))?;
            // SAFETY: `module.module` is a loaded module of this device's context.
            let f = unsafe { cudarc::driver::result::module::get_function(module.module, cname) }.map_err(|e| {
                Error::DeviceFailure {
                    device: device.to_string(),
                    reason: format!("kernel {name} not in {}: {e:?}", variant.source.path),
                }
            })?;
            // SAFETY: `f` is a function of this context's module, the context is current.
            let static_smem = unsafe {
                cudarc::driver::result::function::get_function_attribute(
                    f,
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                )
            }
            .map_err(|e| launch_error(device, Function { f, name }, e))?;
            let r = Resolved { f, static_smem: static_smem.max(0) as u32, opted_in: 0 };
            fns.insert(name, r);
            r
        }
    };
    let f = Function { f: r.f, name };
    if dynamic_smem > r.opted_in && u64::from(dynamic_smem) + u64::from(r.static_smem) > 48 * 1024 {
        // SAFETY: `r.f` is a function of this context's module, the context is current.
        unsafe {
            cudarc::driver::result::function::set_function_attribute(
                r.f,
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dynamic_smem as i32,
            )
        }
        .map_err(|e| launch_error(device, f, e))?;
        r.opted_in = dynamic_smem;
        fns.insert(name, r);
    }
    Ok(f)
}

/// Starts compiling `variant` for `device`'s arch on another thread, once, unless it is loaded
/// there already: for a launch to come (see [`tefl_gpu::rtc::compile_ahead`]). Never fails.
pub fn compile_ahead(device: Device, variant: &Variant) {
    if !modules().first_ahead(device.ordinal, variant) {
        return;
    }
    if let Ok(info) = info(device) {
        tefl_gpu::rtc::compile_ahead(&Nvrtc, variant.clone(), target_arch(variant, &info.arch));
    }
}

/// Queues the entry `name` of `variant` on the device's queue (the caller's stream inside
/// `tefl_core::device::with_queue`). Nothing waits for it; a launch the driver refuses comes
/// back as a typed error.
pub fn launch(device: Device, variant: &Variant, name: &'static str, grid: Grid, args: &[Arg]) -> Result<()> {
    let mut packed = PackedArgs::new(args);
    // SAFETY: each parameter points at 8 bytes holding the argument in its low bytes (the
    // kernel reads sizeof(param) <= 8 bytes, little-endian); `packed` outlives the call; the
    // kernel's signature matches `args` (each op file passes the arguments its kernel
    // declares); pointers are live device allocations of this device.
    unsafe { launch_params(device, variant, name, grid, packed.pointers(), false) }.map(|_| ())
}

/// Queues the entry `name` of `variant` as a cooperative launch (`cuLaunchCooperativeKernel`):
/// every block resident at once, so that blocks may wait for each other. `Ok(false)`, nothing
/// queued, where fewer blocks than the grid's fit the device at once (the occupancy the
/// driver reports for the function, block and shared memory, times its SMs) or the driver
/// refuses the launch as too large or unsupported (another process's share of the SMs), on a
/// stream being captured into a graph, and always with `TEFL_COOPERATIVE=0`.
pub fn launch_cooperative(
    device: Device,
    variant: &Variant,
    name: &'static str,
    grid: Grid,
    args: &[Arg],
) -> Result<bool> {
    if tefl_core::policy::env().as_ref().is_ok_and(|e| !e.cooperative) {
        return Ok(false);
    }
    let mut packed = PackedArgs::new(args);
    // SAFETY: as `launch`: the packed words hold the kernel's arguments, live for the call.
    unsafe { launch_params(device, variant, name, grid, packed.pointers(), true) }
}

/// Queues the entry `name` of `variant`, whose one parameter is a struct passed by value:
/// `block` holds its bytes (the struct's full `sizeof`, e.g. a table with tensor maps, up to
/// the driver's 32 KB of kernel parameters).
///
/// # Safety
/// `block` must be laid out exactly as the kernel's parameter type (size and alignment), and
/// every device address in it must be a live allocation of this device until the kernel ends.
pub(crate) unsafe fn launch_struct<T>(
    device: Device,
    variant: &Variant,
    name: &'static str,
    grid: Grid,
    block: &T,
) -> Result<()> {
    let mut params = [block as *const T as *mut c_void];
    // SAFETY: the caller guarantees the parameter's layout and addresses; the driver copies
    // `sizeof(param)` bytes from `block`, which outlives the call.
    unsafe { launch_params(device, variant, name, grid, &mut params, false) }.map(|_| ())
}

/// Whether every block of `grid` fits the device at once: the occupancy the driver reports
/// for `f` at the grid's block and shared memory, times the device's SMs.
fn all_resident(device: Device, f: Function, grid: Grid) -> Result<bool> {
    let threads = grid.threads.0.saturating_mul(grid.threads.1).saturating_mul(grid.threads.2);
    // SAFETY: `f` is a loaded function of the current context.
    let per_sm = unsafe {
        cudarc::driver::result::occupancy::max_active_block_per_multiprocessor(
            f.f,
            threads.min(i32::MAX as u32) as i32,
            grid.smem as usize,
        )
    }
    .map_err(|e| launch_error(device, f, e))?;
    let blocks = u64::from(grid.blocks.0) * u64::from(grid.blocks.1) * u64::from(grid.blocks.2);
    Ok(per_sm > 0 && blocks <= per_sm as u64 * u64::from(sm_count(device)))
}

/// A stream's capture status when it is not being captured into a graph.
const CAPTURE_NONE: cudarc::driver::sys::CUstreamCaptureStatus =
    cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;

/// The launch itself: `params` as cuLaunchKernel takes them; `cooperative`: through
/// cuLaunchCooperativeKernel, `Ok(false)` (nothing queued) when not every block fits the
/// device at once ([`all_resident`]), the stream is being captured into a graph or the driver
/// refuses the launch as too large or unsupported, `Ok(true)` once queued.
///
/// # Safety
/// `params` must match the kernel's parameter list and point at live memory for the call.
unsafe fn launch_params(
    device: Device,
    variant: &Variant,
    name: &'static str,
    grid: Grid,
    params: &mut [*mut c_void],
    cooperative: bool,
) -> Result<bool> {
    if grid.is_empty() {
        return Ok(true);
    }
    let rt = runtime::global();
    rt.context(device)?.bind_to_thread().map_err(|e| device_error(device, e))?;
    let f = function(device, variant, name, grid.smem)?;
    if cooperative && !all_resident(device, f, grid)? {
        return Ok(false);
    }
    let timing = kernel_timing();
    rt.on_queue(device, |stream| {
        // A stream being captured into a graph gets no cooperative launch: a kernel whose blocks
        // wait for flags raised to a per-call value would replay that value, and a second
        // replay would find the first one's flags already raised.
        // (A status the driver cannot tell counts as captured: the two-launch form is always safe.)
        if cooperative && !matches!(stream.capture_status(), Ok(CAPTURE_NONE)) {
            return Ok(false);
        }
        let event = || stream.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT));
        let start = if timing { Some(event().map_err(|e| launch_error(device, f, e))?) } else { None };
        let queue = if cooperative {
            cudarc::driver::result::launch_cooperative_kernel
        } else {
            cudarc::driver::result::launch_kernel
        };
        // SAFETY: the caller guarantees `params` matches the kernel and is live for the call.
        let queued = unsafe { queue(f.f, grid.blocks, grid.threads, grid.smem, stream.cu_stream(), params) };
        match queued {
            Ok(()) => {}
            Err(cudarc::driver::DriverError(
                CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE | CUresult::CUDA_ERROR_NOT_SUPPORTED,
            )) if cooperative => return Ok(false),
            Err(e) => return Err(launch_error(device, f, e)),
        }
        if let Some(start) = start {
            let end = event().map_err(|e| launch_error(device, f, e))?;
            end.synchronize().map_err(|e| launch_error(device, f, e))?;
            let ms = start.elapsed_ms(&end).map_err(|e| launch_error(device, f, e))?;
            eprintln!(
                "[TE-FL kernel] {}{} grid {:?} block {:?} smem {} : {ms:.3} ms",
                f.name,
                if cooperative { " (cooperative)" } else { "" },
                grid.blocks,
                grid.threads,
                grid.smem
            );
        }
        Ok(true)
    })
}

/// The arch a variant is compiled for on a device of `arch`: the arch-specific target
/// (`sm_90a`) for a source that needs it (`Source::arch_specific`), else `arch` itself.
pub fn target_arch(variant: &Variant, arch: &str) -> String {
    if variant.source.arch_specific { format!("{arch}a") } else { arch.to_string() }
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

/// The CUDA target of the shared op code (`tefl_gpu::simt`).
struct CudaTarget;

impl tefl_gpu::target::GpuTarget for CudaTarget {
    fn device_kind(&self) -> tefl_core::DeviceKind {
        tefl_core::DeviceKind::CUDA
    }
    fn launch(&self, device: Device, variant: &Variant, entry: &'static str, grid: Grid, args: &[Arg]) -> Result<()> {
        launch(device, variant, entry, grid, args)
    }
    fn launch_cooperative(
        &self,
        device: Device,
        variant: &Variant,
        entry: &'static str,
        grid: Grid,
        args: &[Arg],
    ) -> Result<bool> {
        launch_cooperative(device, variant, entry, grid, args)
    }
    fn compile_ahead(&self, device: Device, variant: &Variant) {
        compile_ahead(device, variant)
    }
    fn loaded(&self, device: Device, variant: &Variant) -> bool {
        modules().contains(device.ordinal, variant)
    }
    fn address(&self, t: &Tensor) -> Result<u64> {
        ptr(t)
    }
    fn tune_table(&self, device: Device) -> Result<Arc<TuneTable>> {
        tune_table(device)
    }
}

tefl_gpu::register_gpu_target!(&CudaTarget);

/// A variant bound to the device its op runs on: launches its entries by name.
pub(crate) struct OnDevice {
    device: Device,
    /// The variant (for [`launch_struct`]).
    pub(crate) variant: Variant,
}

impl OnDevice {
    /// `variant` on `device`.
    pub(crate) fn new(device: Device, variant: Variant) -> Self {
        OnDevice { device, variant }
    }

    /// Queues the entry `name`.
    pub(crate) fn launch(&self, name: &'static str, grid: Grid, args: &[Arg]) -> Result<()> {
        launch(self.device, &self.variant, name, grid, args)
    }

    /// On this variant's first use on its device, starts compiling the variants `later` names
    /// on other threads (see [`compile_ahead_on_first_use`]).
    pub(crate) fn compile_ahead(&self, later: impl FnOnce() -> Result<Vec<Variant>>) {
        compile_ahead_on_first_use(self.device, &self.variant, later)
    }
}

/// [`tefl_gpu::target::compile_ahead_on_first_use`] on CUDA.
pub(crate) fn compile_ahead_on_first_use(device: Device, now: &Variant, later: impl FnOnce() -> Result<Vec<Variant>>) {
    tefl_gpu::target::compile_ahead_on_first_use(&CudaTarget, device, now, later)
}

/// The device address of a CUDA tensor (a typed error for a tensor elsewhere).
pub fn ptr(t: &Tensor) -> Result<u64> {
    Ok(runtime::global().buffer(t.buffer().as_ref())?.device_ptr())
}

/// The device address of an optional CUDA tensor, 0 when absent.
pub fn opt_ptr(t: Option<&Tensor>) -> Result<u64> {
    t.map(ptr).transpose().map(|p| p.unwrap_or(0))
}

/// The facts of a device, looked up once (`tefl_core::device::info`).
pub(crate) fn info(device: Device) -> Result<Arc<DeviceInfo>> {
    tefl_core::device::info(device)
}

/// The number of SMs of a device (grid sizes of persistent and grid-stride kernels).
pub(crate) fn sm_count(device: Device) -> u32 {
    info(device).map_or(132, |i| i.compute_units.max(1))
}

/// The layered tune table of a device's arch.
pub(crate) fn tune_table(device: Device) -> Result<Arc<TuneTable>> {
    Ok(crate::heuristics::TUNE_CONFIGS.table(&info(device)?.arch))
}

/// A CUDA tensor whose every element the caller's kernel writes (no zero fill).
pub(crate) fn empty(device: Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::uninit(shape, dtype, &device)
}

/// A zero-filled CUDA tensor (accumulators).
pub(crate) fn zeros(device: Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::zeros(shape, dtype, &device)
}

/// A valid call these kernels cannot serve (a size past their index range, tiles that do not
/// fit the device): the manager moves on to the next impl without counting a failure.
pub(crate) fn unsupported(op: &'static str, reason: String) -> Error {
    Error::Unsupported { op, impl_id: crate::IMPL_ID.to_string(), reason }
}
