//! The CUDA device runtime: memory, host↔device and device↔device copies, synchronisation.
//! With it, tensors live on `cuda:N`, and ops this backend does not implement yet are served
//! by the reference through host staging.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DriverError};
use tefl_core::device::{Buffer, DeviceInfo, DeviceRuntime, DeviceRuntimeRegistration, Queue};
use tefl_core::{Device, DeviceKind, Error, Result};

/// Device memory of one tensor, with the stream its work is queued on: tefl's allocation, or
/// memory another library allocated (a torch tensor imported without a copy), kept alive by its
/// owner.
pub struct CudaBuffer {
    device: Device,
    len: usize,
    ptr: u64,
    /// tefl's allocation (`None` for imported memory); freed with the buffer.
    _slice: Option<CudaSlice<u8>>,
    /// What keeps imported memory alive (a DLPack managed tensor), dropped with the buffer.
    _owner: Option<Box<dyn Any + Send + Sync>>,
    stream: Arc<CudaStream>,
}

impl CudaBuffer {
    /// The device address of the first byte (valid while the buffer lives).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if let Some(slice) = self._slice.take() {
            recycle(self.device, slice);
        }
    }
}

/// The largest allocation kept by power-of-two size class when freed.
const REUSED_MAX_BYTES: usize = 1 << 20;
/// Freed allocations kept per device and size class.
const REUSED_PER_CLASS: usize = 32;
/// Freed larger allocations kept per device and exact size.
const LARGE_PER_SIZE: usize = 2;
/// The most bytes of larger allocations kept per device (an allocation that fails for want of
/// memory drops the device's kept allocations and tries again).
const LARGE_KEPT_BYTES: usize = 1 << 31;

/// Freed allocations of tefl's, by (device ordinal, size class), for the next allocation of
/// their class: an op's output is allocated and freed at every call, and the pair of
/// `cuMemAllocAsync` and `cuMemFreeAsync` costs about 2 µs of host time (H200, 2026-11-26), a
/// fifth of a tiny op's call from Python, and about 1 µs of the device's time (H100,
/// 2026-11-27, bench alternating with and without reuse above 1 MiB, three runs each, of a
/// first form with power-of-two classes up to 256 MiB: rmsnorm fwd 8192x4096 0.051 -> 0.050
/// ms, softmax 16384x8192 0.209 -> 0.207, gelu 0.182 -> 0.181; this form, two runs: softmax
/// 0.211 -> 0.208, the others within the runs' noise).
/// Up to 1 MiB the classes are powers of two; above, exact sizes (a training step asks for the
/// same sizes again; rounding would waste up to half of a large buffer). The memory pool keeps
/// freed memory too (`keep_pool_memory`) but serves any size from it; what is kept here on top
/// is capped per device, and an allocation that fails for want of memory frees it and tries
/// again. Every tefl allocation is queued on the device's default stream, and work on a
/// caller's stream is ordered against it both ways (`CudaRuntime::on_queue`,
/// `wait_for_queue`), so handing a freed allocation to the next allocation of the same stream
/// is as safe as the memory pool's own stream-ordered reuse.
static REUSED: std::sync::Mutex<Vec<ReusedClass>> = std::sync::Mutex::new(Vec::new());

/// The kept allocations of one (device ordinal, size class).
type ReusedClass = ((u32, usize), Vec<CudaSlice<u8>>);

/// The size class of an allocation of `bytes`: the next power of two from 256 bytes up to
/// [`REUSED_MAX_BYTES`], the size itself above.
fn reuse_class(bytes: usize) -> usize {
    if bytes <= REUSED_MAX_BYTES { bytes.max(256).next_power_of_two() } else { bytes }
}

/// Whether a freed allocation of `len` bytes is kept for reuse, with `same_class` kept of its
/// class on its device already and `large_bytes` of larger allocations: its length must be a
/// class size and its class not full (32 below 1 MiB, 2 above), and the device's kept larger
/// allocations stay within [`LARGE_KEPT_BYTES`].
fn keeps(len: usize, same_class: usize, large_bytes: usize) -> bool {
    if reuse_class(len) != len {
        false
    } else if len > REUSED_MAX_BYTES {
        same_class < LARGE_PER_SIZE && large_bytes.saturating_add(len) <= LARGE_KEPT_BYTES
    } else {
        same_class < REUSED_PER_CLASS
    }
}

/// Keeps a freed allocation for reuse (see [`keeps`]), or frees it (its own drop, after the
/// lock is released).
fn recycle(device: Device, slice: CudaSlice<u8>) {
    let len = slice.len();
    let mut kept = REUSED.lock().unwrap_or_else(|p| p.into_inner());
    // The device's kept larger allocations, summed only for a larger one (`keeps` reads them
    // for those alone): most frees are of small outputs.
    let large_bytes: usize = if len > REUSED_MAX_BYTES {
        kept.iter()
            .filter(|((d, size), _)| *d == device.ordinal && *size > REUSED_MAX_BYTES)
            .map(|((_, size), v)| size * v.len())
            .sum()
    } else {
        0
    };
    let key = (device.ordinal, len);
    let at = kept.iter().position(|(k, _)| *k == key);
    if !keeps(len, at.map_or(0, |i| kept[i].1.len()), large_bytes) {
        return;
    }
    match at {
        Some(i) => kept[i].1.push(slice),
        None => kept.push((key, vec![slice])),
    }
}

/// A kept allocation of `class` bytes on `device`, if there is one.
fn reuse(device: Device, class: usize) -> Option<CudaSlice<u8>> {
    let mut kept = REUSED.lock().unwrap_or_else(|p| p.into_inner());
    kept.iter_mut().find(|(k, _)| *k == (device.ordinal, class)).and_then(|(_, v)| v.pop())
}

/// Frees every allocation kept for `device` (queued on its stream, so the pool can hand the
/// memory to the next allocation); whether there were any.
fn drop_kept(device: Device) -> bool {
    let freed: Vec<CudaSlice<u8>> = {
        let mut kept = REUSED.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter_mut().filter(|((d, _), _)| *d == device.ordinal).flat_map(|(_, v)| v.drain(..)).collect()
    };
    !freed.is_empty()
}

/// `alloc` on `device`; when it fails for want of memory and tefl kept freed allocations of
/// the device, those are freed and `alloc` runs once more.
fn alloc_or_drop_kept<T>(
    device: Device,
    alloc: impl Fn() -> std::result::Result<T, DriverError>,
) -> std::result::Result<T, DriverError> {
    match alloc() {
        Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY && drop_kept(device) => alloc(),
        r => r,
    }
}

impl Buffer for CudaBuffer {
    fn device(&self) -> Device {
        self.device
    }
    fn len_bytes(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn raw_address(&self) -> Option<u64> {
        Some(self.ptr)
    }
}

/// A driver error as a tefl error: out-of-memory is [`Error::OutOfMemory`], the rest
/// [`Error::DeviceFailure`] (both let the manager fall back to another impl).
pub fn device_error(device: Device, e: DriverError) -> Error {
    if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Error::OutOfMemory { device: device.to_string(), bytes: 0, what: "a device allocation".into() };
    }
    Error::DeviceFailure { device: device.to_string(), reason: format!("{e:?}") }
}

/// Lets the device's default memory pool (which `cuMemAllocAsync` draws from) keep freed
/// memory instead of returning it to the driver at every synchronisation, so that a tensor
/// freed and allocated again, as every op's output is, costs no re-mapping (what a caching
/// allocator does). Best effort: a device without memory pools is left as it is.
fn keep_pool_memory(ctx: &CudaContext) {
    use cudarc::driver::sys;
    if !ctx.has_async_alloc() {
        return;
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold: u64 = u64::MAX;
    // SAFETY: `pool` and `threshold` are valid out/in pointers of the sizes the driver reads;
    // the device handle comes from a live context.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) == sys::CUresult::CUDA_SUCCESS {
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut threshold as *mut u64 as *mut std::ffi::c_void,
            );
        }
    }
}

/// The runtime of `DeviceKind::CUDA`. Contexts are created on first use, never before the
/// driver check passed.
#[derive(Default)]
pub struct CudaRuntime {
    contexts: OnceLock<std::result::Result<Vec<Arc<CudaContext>>, String>>,
}

impl CudaRuntime {
    fn contexts(&self) -> std::result::Result<&[Arc<CudaContext>], String> {
        self.contexts
            .get_or_init(|| {
                crate::availability()?;
                let started = std::time::Instant::now();
                let n = CudaContext::device_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
                let contexts = (0..n.max(0) as usize)
                    .map(|i| {
                        let ctx = CudaContext::new(i).map_err(|e| format!("cuda:{i}: {e:?}"))?;
                        // SAFETY: every buffer and kernel of this backend uses the context's one
                        // default stream, so there is no cross-stream order for events to keep.
                        unsafe { ctx.disable_event_tracking() };
                        keep_pool_memory(&ctx);
                        Ok(ctx)
                    })
                    .collect();
                tracing::debug!(target: "TE-FL", "{n} CUDA context(s) in {} ms", started.elapsed().as_millis());
                contexts
            })
            .as_ref()
            .map(Vec::as_slice)
            .map_err(Clone::clone)
    }

    /// The context of `device` (created on first use).
    pub fn context(&self, device: Device) -> Result<&Arc<CudaContext>> {
        let unavailable = |reason: String| Error::DeviceUnavailable { device: device.to_string(), reason };
        let ctxs = self.contexts().map_err(unavailable)?;
        ctxs.get(device.ordinal as usize).ok_or_else(|| unavailable(format!("only {} CUDA device(s)", ctxs.len())))
    }

    /// Runs `f` with the stream an op's kernels go on: the device's default stream, or the
    /// caller's stream inside `tefl_core::device::with_queue`. An external stream first waits
    /// for the default stream's work (allocations, uploads), and the default stream then waits
    /// for what `f` queued (downloads, frees), so both orders hold without a host wait.
    pub fn on_queue<R>(&self, device: Device, f: impl FnOnce(&CudaStream) -> Result<R>) -> Result<R> {
        let ctx = self.context(device)?;
        let default = ctx.default_stream();
        let Some(queue) = tefl_core::device::current_queue(device).filter(|q| q.handle != 0) else {
            return f(&default);
        };
        let external = self.external_stream(device, queue.handle)?;
        external.join(&default).map_err(|e| device_error(device, e))?;
        let r = f(&external);
        default.join(&external).map_err(|e| device_error(device, e))?;
        r
    }

    /// Wraps a stream handed in by the caller after checking that the driver knows it as a
    /// stream of this device's context (a handle of another device is a typed error).
    fn external_stream(&self, device: Device, handle: u64) -> Result<Arc<CudaStream>> {
        use cudarc::driver::sys;
        let ctx = self.context(device)?;
        ctx.bind_to_thread().map_err(|e| device_error(device, e))?;
        let raw = handle as usize as sys::CUstream;
        let mut owner: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the call only reads the handle and writes one pointer through `owner`, valid
        // for the call; the caller promised (with_queue) that the handle is a live stream.
        let r = unsafe { sys::cuStreamGetCtx(raw, &mut owner) };
        if r != sys::CUresult::CUDA_SUCCESS || owner != ctx.cu_ctx() {
            return Err(Error::DeviceFailure {
                device: device.to_string(),
                reason: format!("queue handle {handle:#x} is not a CUDA stream of {device} ({r:?})"),
            });
        }
        // SAFETY: the driver reports the stream as one of this context; the caller keeps it
        // alive for the with_queue scope, and on_queue orders it against the default stream.
        Ok(unsafe { ctx.wrap_borrowed_stream(raw) })
    }

    /// Copies host bytes into `dst`: on the buffer's stream, waiting for the copy
    /// (`copy_from_host`), or with `queued` on the queue the next launches go on, without a
    /// wait (`copy_from_host_queued`).
    fn upload(&self, dst: &dyn Buffer, src: &[u8], queued: bool) -> Result<()> {
        let d = self.buffer(dst)?;
        if src.len() != d.len {
            return Err(Error::Tensor(format!("copy of {} bytes into {} bytes", src.len(), d.len)));
        }
        if src.is_empty() {
            return Ok(());
        }
        self.context(d.device)?.bind_to_thread().map_err(|e| device_error(d.device, e))?;
        let copy = |stream: &CudaStream| {
            // SAFETY: `d.ptr` holds `d.len` = src.len() bytes for the buffer's life. `src` is
            // pageable memory: the driver stages it before returning (small copies go into the
            // command stream itself), so nothing reads `src` after the call. The copy completes
            // in stream order: on the buffer's stream, or on the queue the next launches go on
            // (an external one joins the default stream, where the buffer was allocated, first),
            // before any kernel queued after it there reads the buffer.
            unsafe { cudarc::driver::result::memcpy_htod_async(d.ptr, src, stream.cu_stream()) }
                .map_err(|e| device_error(d.device, e))
        };
        if queued {
            return self.on_queue(d.device, copy);
        }
        copy(&d.stream)?;
        d.stream.synchronize().map_err(|e| device_error(d.device, e))
    }

    /// `bytes` of device memory whose contents are unspecified (NaN-poisoned when
    /// allocations are poisoned): output buffers every element of which a kernel writes.
    pub fn alloc_uninit_buffer(&self, device: Device, bytes: usize) -> Result<Arc<CudaBuffer>> {
        let stream = self.context(device)?.default_stream();
        // Allocations come in size classes, kept for reuse when freed (`recycle`).
        let class = reuse_class(bytes);
        let slice = match reuse(device, class) {
            Some(kept) => kept,
            // SAFETY: the memory is only handed out inside a CudaBuffer, whose users either
            // write it fully before reading (kernels' outputs) or poison it just below.
            None => alloc_or_drop_kept(device, || unsafe { stream.alloc::<u8>(class) })
                .map_err(|e| device_error(device, e))?,
        };
        self.poisoned(self.wrap(device, bytes, slice, stream))
    }

    /// `buf`, filled with 0xFF bytes (NaN in every float dtype) on the device when allocations
    /// are being poisoned (the conformance suite), so a kernel that reads an element it never
    /// wrote fails a comparison.
    fn poisoned(&self, buf: Arc<CudaBuffer>) -> Result<Arc<CudaBuffer>> {
        if tefl_core::device::poison_allocations() {
            self.fill(&*buf, 0xFF)?;
        }
        Ok(buf)
    }

    fn wrap(&self, device: Device, len: usize, slice: CudaSlice<u8>, stream: Arc<CudaStream>) -> Arc<CudaBuffer> {
        let (ptr, _sync) = slice.device_ptr(&stream);
        drop(_sync);
        Arc::new(CudaBuffer { device, len, ptr, _slice: Some(slice), _owner: None, stream })
    }

    /// The CUDA memory behind a buffer, or a typed error when it is not CUDA memory.
    pub fn buffer<'a>(&self, b: &'a dyn Buffer) -> Result<&'a CudaBuffer> {
        b.as_any()
            .downcast_ref::<CudaBuffer>()
            .ok_or_else(|| Error::Tensor(format!("a {} buffer is not CUDA memory", b.device())))
    }
}

/// Threads a block of the L2 scrub's kernels.
const L2_SCRUB_BLOCK: u32 = 256;

/// The L2 scrub's kernels (tefl-kernels' `cuda/l2_scrub.cu`), which `flush_cache` runs before
/// its fill: every line of the scratch buffer loaded with an L2 evict_last policy, so that
/// they take the place of the kept lines of earlier kernels, then put back to the normal
/// priority, so that the fill evicts them.
pub(crate) fn l2_scrub_variant() -> tefl_gpu::Variant {
    tefl_gpu::Variant::new(
        &tefl_kernels::L2_SCRUB,
        &["l2_keep_lines", "l2_release_lines"],
        tefl_gpu::Defines::new().set("BLOCK", L2_SCRUB_BLOCK),
    )
}

impl DeviceRuntime for CudaRuntime {
    fn kind(&self) -> DeviceKind {
        DeviceKind::CUDA
    }
    fn device_count(&self) -> usize {
        self.contexts().map_or(0, <[_]>::len)
    }
    fn unavailable_reason(&self) -> Option<String> {
        self.contexts().err()
    }
    fn name(&self, ordinal: u32) -> String {
        self.context(Device::cuda(ordinal))
            .and_then(|c| c.name().map_err(|e| device_error(Device::cuda(ordinal), e)))
            .unwrap_or_else(|e| e.to_string())
    }
    fn arch(&self, ordinal: u32) -> String {
        match self.context(Device::cuda(ordinal)).map(|c| c.compute_capability()) {
            Ok(Ok((major, minor))) => format!("sm_{major}{minor}"),
            _ => "unknown".into(),
        }
    }
    fn alloc(&self, device: Device, bytes: usize) -> Result<Arc<dyn Buffer>> {
        let stream = self.context(device)?.default_stream();
        // A zero-byte request still gets a (one-byte) allocation, so every buffer is real.
        let slice = alloc_or_drop_kept(device, || stream.alloc_zeros::<u8>(bytes.max(1)))
            .map_err(|e| device_error(device, e))?;
        Ok(self.poisoned(self.wrap(device, bytes, slice, stream))?)
    }
    fn copy_from_host(&self, dst: &dyn Buffer, src: &[u8]) -> Result<()> {
        self.upload(dst, src, false)
    }
    fn copy_from_host_queued(&self, dst: &dyn Buffer, src: &[u8]) -> Result<()> {
        self.upload(dst, src, true)
    }
    fn copy_to_host(&self, src: &dyn Buffer, dst: &mut [u8]) -> Result<()> {
        let s = self.buffer(src)?;
        if dst.len() != s.len {
            return Err(Error::Tensor(format!("copy of {} bytes into {} bytes", s.len, dst.len())));
        }
        if dst.is_empty() {
            return Ok(());
        }
        self.context(s.device)?.bind_to_thread().map_err(|e| device_error(s.device, e))?;
        // SAFETY: `s.ptr` holds `s.len` = dst.len() bytes; `dst` stays borrowed until the
        // synchronisation below has waited for the copy.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, s.ptr, s.stream.cu_stream()) }
            .map_err(|e| device_error(s.device, e))?;
        s.stream.synchronize().map_err(|e| device_error(s.device, e))
    }
    fn synchronize(&self, device: Device) -> Result<()> {
        self.context(device)?.default_stream().synchronize().map_err(|e| device_error(device, e))
    }
    fn time_on_device(&self, device: Device, work: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        self.time_after(device, &mut || Ok(()), work)
    }
    fn time_after(
        &self,
        device: Device,
        before: &mut dyn FnMut() -> Result<()>,
        work: &mut dyn FnMut() -> Result<()>,
    ) -> Result<f64> {
        // One repetition of time_reps_after (a wait, before, the timed work, a wait).
        Ok(self.time_reps_after(device, 1, before, work)?[0])
    }
    fn time_reps_after(
        &self,
        device: Device,
        reps: usize,
        before: &mut dyn FnMut() -> Result<()>,
        work: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<f64>> {
        use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
        let stream = self.context(device)?.default_stream();
        let err = |e| device_error(device, e);
        stream.synchronize().map_err(err)?;
        // Every repetition queued (two events each), then one wait for the last.
        let mut events = Vec::with_capacity(reps);
        for _ in 0..reps {
            before()?;
            let start = stream.record_event(Some(CU_EVENT_DEFAULT)).map_err(err)?;
            work()?;
            let end = stream.record_event(Some(CU_EVENT_DEFAULT)).map_err(err)?;
            events.push((start, end));
        }
        stream.synchronize().map_err(err)?;
        events.iter().map(|(start, end)| Ok(f64::from(start.elapsed_ms(end).map_err(err)?) / 1e3)).collect()
    }
    fn alloc_uninit(&self, device: Device, bytes: usize) -> Result<Arc<dyn Buffer>> {
        Ok(self.alloc_uninit_buffer(device, bytes)?)
    }
    fn fill(&self, dst: &dyn Buffer, byte: u8) -> Result<()> {
        let d = self.buffer(dst)?;
        if d.len == 0 {
            return Ok(());
        }
        self.context(d.device)?.bind_to_thread().map_err(|e| device_error(d.device, e))?;
        // SAFETY: the pointer and length describe this live buffer's allocation; the memset
        // is queued on the stream the buffer's work goes on.
        unsafe { cudarc::driver::result::memset_d8_async(d.ptr, byte, d.len, d.stream.cu_stream()) }
            .map_err(|e| device_error(d.device, e))
    }
    fn flush_cache(&self, scratch: &dyn Buffer) -> Result<()> {
        let s = self.buffer(scratch)?;
        let lines = s.len / 128;
        if lines > 0 {
            use crate::launch::{Arg, Grid, blocks_for, launch, sm_count};
            let variant = l2_scrub_variant();
            let grid = Grid::linear(blocks_for(lines, L2_SCRUB_BLOCK as usize, 8 * sm_count(s.device)), L2_SCRUB_BLOCK);
            let args = [Arg::Ptr(s.ptr), Arg::U64(lines as u64)];
            launch(s.device, &variant, "l2_keep_lines", grid, &args)?;
            launch(s.device, &variant, "l2_release_lines", grid, &args)?;
        }
        self.fill(scratch, 0)
    }
    fn device_info(&self, ordinal: u32) -> Result<DeviceInfo> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let device = Device::cuda(ordinal);
        let ctx = self.context(device)?;
        let attr = |a: A| ctx.attribute(a).map_err(|e| device_error(device, e)).map(|v| v.max(0) as u32);
        let arch = self.arch(ordinal);
        let mut info = DeviceInfo::basic(device, self.name(ordinal), arch.clone());
        info.arch_family = crate::vendor_info().arch_family(&arch).map(str::to_owned);
        info.compute_units = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1);
        info.warp_size = attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?;
        info.max_threads_per_block = attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
        info.shared_memory_per_block = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)? as usize;
        info.shared_memory_per_block_optin = (attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize)
            .max(info.shared_memory_per_block);
        info.total_memory = ctx.total_mem().unwrap_or(0);
        info.driver_version = crate::vendor::driver_version().to_string();
        Ok(info)
    }
    fn queue(&self, device: Device) -> Result<Queue> {
        self.context(device)?;
        Ok(tefl_core::device::current_queue(device).unwrap_or(Queue { device, handle: 0, external: false }))
    }
    fn accepts_external_queues(&self) -> bool {
        true
    }
    fn copy_device_to_device(&self, src: &dyn Buffer, dst: &dyn Buffer) -> Result<()> {
        let (s, d) = (self.buffer(src)?, self.buffer(dst)?);
        if s.len != d.len {
            return Err(Error::Tensor(format!("copy of {} bytes into {} bytes", s.len, d.len)));
        }
        if std::ptr::eq(s, d) || s.len == 0 {
            return Ok(());
        }
        self.context(d.device)?.bind_to_thread().map_err(|e| device_error(d.device, e))?;
        // SAFETY: both pointers hold `len` bytes of live buffers; the copy is queued on the
        // destination's stream, which both buffers' work is ordered on.
        unsafe { cudarc::driver::result::memcpy_dtod_async(d.ptr, s.ptr, s.len, d.stream.cu_stream()) }
            .map_err(|e| device_error(d.device, e))
    }
    unsafe fn import_external(
        &self,
        device: Device,
        address: u64,
        bytes: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<Arc<dyn Buffer>> {
        use cudarc::driver::sys;
        let ctx = self.context(device)?;
        ctx.bind_to_thread().map_err(|e| device_error(device, e))?;
        // The memory must be this device's: ask the driver which device the address is on
        // (memory-pool allocations report no context, but they do report their device).
        let mut ordinal: i32 = -1;
        // SAFETY: the attribute query writes one int through a valid out pointer.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                address,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS || i64::from(ordinal) != i64::from(device.ordinal) {
            return Err(Error::DeviceFailure {
                device: device.to_string(),
                reason: format!("address {address:#x} is not memory of {device} (device {ordinal}, {r:?})"),
            });
        }
        Ok(Arc::new(CudaBuffer {
            device,
            len: bytes,
            ptr: address,
            _slice: None,
            _owner: Some(owner),
            stream: ctx.default_stream(),
        }))
    }
    fn wait_for_queue(&self, device: Device, handle: u64) -> Result<()> {
        let default = self.context(device)?.default_stream();
        if handle == 0 {
            return Ok(());
        }
        let external = self.external_stream(device, handle)?;
        default.join(&external).map_err(|e| device_error(device, e))
    }
}

/// The one CUDA runtime of the process (the registered one).
pub fn global() -> &'static Arc<CudaRuntime> {
    static RT: OnceLock<Arc<CudaRuntime>> = OnceLock::new();
    RT.get_or_init(|| Arc::new(CudaRuntime::default()))
}

fn make() -> Arc<dyn DeviceRuntime> {
    global().clone()
}

inventory::submit! {
    DeviceRuntimeRegistration { make }
}

#[cfg(test)]
mod tests {
    use super::{LARGE_KEPT_BYTES, LARGE_PER_SIZE, REUSED_MAX_BYTES, REUSED_PER_CLASS, keeps, reuse_class};

    #[test]
    fn small_allocations_come_in_power_of_two_classes_and_large_ones_exactly() {
        assert_eq!(reuse_class(0), 256);
        assert_eq!(reuse_class(64), 256);
        assert_eq!(reuse_class(257), 512);
        assert_eq!(reuse_class(4096), 4096);
        assert_eq!(reuse_class(REUSED_MAX_BYTES - 1), REUSED_MAX_BYTES);
        assert_eq!(reuse_class(REUSED_MAX_BYTES), REUSED_MAX_BYTES);
        assert_eq!(reuse_class(REUSED_MAX_BYTES + 1), REUSED_MAX_BYTES + 1);
        assert_eq!(reuse_class(3 << 24), 3 << 24);
    }

    #[test]
    fn freed_allocations_are_kept_within_their_limits() {
        // Small: class sizes only, up to 32 a class.
        assert!(keeps(4096, 0, 0) && keeps(4096, REUSED_PER_CLASS - 1, 0));
        assert!(!keeps(4096, REUSED_PER_CLASS, 0));
        assert!(!keeps(1000, 0, 0), "not a class size (an exact zeroed allocation)");
        // Large: two of a size, and the device's kept large bytes within the cap.
        let big = 48 << 20;
        assert!(keeps(big, 0, 0) && keeps(big, LARGE_PER_SIZE - 1, 0));
        assert!(!keeps(big, LARGE_PER_SIZE, 0));
        assert!(keeps(big, 0, LARGE_KEPT_BYTES - big));
        assert!(!keeps(big, 0, LARGE_KEPT_BYTES - big + 1));
        assert!(!keeps(usize::MAX, 0, 1), "no overflow");
    }
}
