//! The HIP device runtime: memory (`hipMalloc`), copies, fills, the null stream and streams
//! handed in by the caller, event timing and device facts. Every call goes through the
//! run-time loaded [`HipApi`]; without a runtime or a device it reports
//! "unavailable" and never panics.

use std::any::Any;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, OnceLock};

use tefl_core::device::{Buffer, DeviceInfo, DeviceRuntime, DeviceRuntimeRegistration, Queue};
use tefl_core::{Device, DeviceKind, Error, Result};

/// `hipErrorOutOfMemory`.
const HIP_ERROR_OUT_OF_MEMORY: c_int = 2;

use crate::hip::{HipApi, HipEvent, HipStream, MEMCPY_D2D, MEMCPY_D2H, MEMCPY_H2D, api, attr};

/// Device memory of one HIP device, freed when dropped.
pub struct HipBuffer {
    device: Device,
    len: usize,
    ptr: u64,
}

impl HipBuffer {
    /// The device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

impl Buffer for HipBuffer {
    fn device(&self) -> Device {
        self.device
    }
    fn len_bytes(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: the pointer came from hipMalloc on this device and is freed once, here;
            // hipFree waits for work still using it.
            unsafe {
                let _ = (api.set_device)(self.device.ordinal as c_int);
                let _ = (api.free)(self.ptr as usize as *mut c_void);
            }
        }
    }
}

/// A HIP failure as a typed error naming the device.
pub(crate) fn failure(device: Device, reason: String) -> Error {
    Error::DeviceFailure { device: device.to_string(), reason }
}

/// The runtime of `DeviceKind::HIP`.
#[derive(Default)]
pub struct HipRuntime {
    count: OnceLock<std::result::Result<usize, String>>,
}

impl HipRuntime {
    fn devices(&self) -> std::result::Result<usize, String> {
        self.count
            .get_or_init(|| {
                crate::availability()?;
                let api = api()?;
                let mut n: c_int = 0;
                // SAFETY: `n` is a valid out-pointer for the call.
                api.check(unsafe { (api.get_device_count)(&mut n) }, "hipGetDeviceCount")?;
                Ok(n.max(0) as usize)
            })
            .clone()
    }

    /// The runtime's entry points with `device` current on this thread.
    pub fn enter(&self, device: Device) -> Result<&'static HipApi> {
        let unavailable = |reason: String| Error::DeviceUnavailable { device: device.to_string(), reason };
        let n = self.devices().map_err(unavailable)?;
        if device.ordinal as usize >= n {
            return Err(unavailable(format!("only {n} HIP device(s)")));
        }
        let api = api().map_err(unavailable)?;
        // SAFETY: the ordinal is below the device count (checked above).
        let r = unsafe { (api.set_device)(device.ordinal as c_int) };
        api.check(r, "hipSetDevice").map_err(|e| failure(device, e))?;
        Ok(api)
    }

    /// The HIP memory behind a buffer, or a typed error when it is not HIP memory.
    pub fn buffer<'a>(&self, b: &'a dyn Buffer) -> Result<&'a HipBuffer> {
        b.as_any()
            .downcast_ref::<HipBuffer>()
            .ok_or_else(|| Error::Tensor(format!("a {} buffer is not HIP memory", b.device())))
    }

    /// Runs `f` with the stream an op's kernels go on: the null stream, or the caller's stream
    /// inside `tefl_core::device::with_queue`. An external stream first waits for the null
    /// stream's work (allocations, uploads) and the null stream then waits for what `f` queued,
    /// through events, so both orders hold without a host wait.
    pub fn on_queue<R>(&self, device: Device, f: impl FnOnce(HipStream) -> Result<R>) -> Result<R> {
        let api = self.enter(device)?;
        let Some(queue) = tefl_core::device::current_queue(device).filter(|q| q.handle != 0) else {
            return f(std::ptr::null_mut());
        };
        let external = queue.handle as usize as HipStream;
        join(api, device, external, std::ptr::null_mut())?;
        let r = f(external);
        join(api, device, std::ptr::null_mut(), external)?;
        r
    }

    fn alloc_raw(&self, device: Device, bytes: usize) -> Result<HipBuffer> {
        let api = self.enter(device)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; a zero-byte request still gets one byte, so every
        // buffer is a real allocation.
        let r = unsafe { (api.malloc)(&mut p, bytes.max(1)) };
        if r == HIP_ERROR_OUT_OF_MEMORY {
            return Err(Error::OutOfMemory { device: device.to_string(), bytes, what: "a device allocation".into() });
        }
        api.check(r, "hipMalloc").map_err(|e| failure(device, e))?;
        let buf = HipBuffer { device, len: bytes, ptr: p as usize as u64 };
        if tefl_core::device::poison_allocations() && bytes > 0 {
            self.fill(&buf, 0xFF)?;
        }
        Ok(buf)
    }
}

/// Makes `waiter` wait for the work queued so far on `signaller` (an event between them).
fn join(api: &HipApi, device: Device, waiter: HipStream, signaller: HipStream) -> Result<()> {
    let err = |e: String| failure(device, e);
    let mut ev: HipEvent = std::ptr::null_mut();
    // SAFETY: `ev` is a valid out-pointer; the event is destroyed below after its last use;
    // both streams are the null stream or a live stream of this device (the with_queue promise).
    unsafe {
        api.check((api.event_create)(&mut ev), "hipEventCreate").map_err(err)?;
        let r = api
            .check((api.event_record)(ev, signaller), "hipEventRecord")
            .and_then(|()| api.check((api.stream_wait_event)(waiter, ev, 0), "hipStreamWaitEvent"));
        let _ = (api.event_destroy)(ev);
        r.map_err(err)
    }
}

impl DeviceRuntime for HipRuntime {
    fn kind(&self) -> DeviceKind {
        DeviceKind::HIP
    }
    fn device_count(&self) -> usize {
        self.devices().unwrap_or(0)
    }
    fn unavailable_reason(&self) -> Option<String> {
        self.devices().err()
    }
    fn name(&self, ordinal: u32) -> String {
        let device = Device::new(DeviceKind::HIP, ordinal);
        let Ok(api) = self.enter(device) else { return "unavailable".into() };
        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` holds 256 bytes, the length passed.
        if unsafe { (api.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, ordinal as c_int) } != 0 {
            return "unknown".into();
        }
        // SAFETY: hipDeviceGetName writes a NUL-terminated string within the buffer.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }
    fn arch(&self, ordinal: u32) -> String {
        gcn_arch_name(Device::new(DeviceKind::HIP, ordinal)).unwrap_or_else(|_| "unknown".into())
    }
    fn alloc(&self, device: Device, bytes: usize) -> Result<Arc<dyn Buffer>> {
        let buf = self.alloc_raw(device, bytes)?;
        if !tefl_core::device::poison_allocations() {
            self.fill(&buf, 0)?;
        }
        Ok(Arc::new(buf))
    }
    fn alloc_uninit(&self, device: Device, bytes: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(self.alloc_raw(device, bytes)?))
    }
    fn copy_from_host(&self, dst: &dyn Buffer, src: &[u8]) -> Result<()> {
        let d = self.buffer(dst)?;
        if src.len() != d.len {
            return Err(Error::Tensor(format!("copy of {} bytes into {} bytes", src.len(), d.len)));
        }
        if src.is_empty() {
            return Ok(());
        }
        let api = self.enter(d.device)?;
        // SAFETY: `d` is a live allocation of `src.len()` bytes; `src` is readable for the call
        // (hipMemcpy from pageable memory returns after the bytes are copied).
        let r = unsafe { (api.memcpy)(d.ptr as usize as *mut c_void, src.as_ptr().cast(), src.len(), MEMCPY_H2D) };
        api.check(r, "hipMemcpy (host to device)").map_err(|e| failure(d.device, e))
    }
    fn copy_to_host(&self, src: &dyn Buffer, dst: &mut [u8]) -> Result<()> {
        let s = self.buffer(src)?;
        if dst.len() != s.len {
            return Err(Error::Tensor(format!("copy of {} bytes into {} bytes", s.len, dst.len())));
        }
        if dst.is_empty() {
            return Ok(());
        }
        let api = self.enter(s.device)?;
        // SAFETY: `s` is a live allocation of `dst.len()` bytes; `dst` is writable for the call,
        // which returns after the copy (and the null stream's earlier work) is done.
        let r =
            unsafe { (api.memcpy)(dst.as_mut_ptr().cast(), s.ptr as usize as *const c_void, dst.len(), MEMCPY_D2H) };
        api.check(r, "hipMemcpy (device to host)").map_err(|e| failure(s.device, e))
    }
    fn synchronize(&self, device: Device) -> Result<()> {
        let api = self.enter(device)?;
        // SAFETY: the null stream of the current device.
        let r = unsafe { (api.stream_synchronize)(std::ptr::null_mut()) };
        api.check(r, "hipStreamSynchronize").map_err(|e| failure(device, e))
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
        let api = self.enter(device)?;
        let err = |e: String| failure(device, e);
        self.synchronize(device)?;
        let (mut start, mut end): (HipEvent, HipEvent) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers; both events are destroyed below after their last use.
        unsafe {
            api.check((api.event_create)(&mut start), "hipEventCreate").map_err(err)?;
            if let Err(e) = api.check((api.event_create)(&mut end), "hipEventCreate") {
                let _ = (api.event_destroy)(start);
                return Err(err(e));
            }
        }
        let mut ms = 0f32;
        let timed = (|| {
            before()?;
            self.enter(device)?;
            // SAFETY: live events of this device, recorded on its null stream.
            api.check(unsafe { (api.event_record)(start, std::ptr::null_mut()) }, "hipEventRecord").map_err(err)?;
            work()?;
            self.enter(device)?;
            // SAFETY: as above; `ms` is a valid out-pointer.
            unsafe {
                api.check((api.event_record)(end, std::ptr::null_mut()), "hipEventRecord").map_err(err)?;
                api.check((api.event_synchronize)(end), "hipEventSynchronize").map_err(err)?;
                api.check((api.event_elapsed_time)(&mut ms, start, end), "hipEventElapsedTime").map_err(err)
            }
        })();
        // SAFETY: destroyed once, after their last use.
        unsafe {
            let _ = (api.event_destroy)(start);
            let _ = (api.event_destroy)(end);
        }
        timed.map(|()| f64::from(ms) / 1e3)
    }
    fn fill(&self, dst: &dyn Buffer, byte: u8) -> Result<()> {
        let d = self.buffer(dst)?;
        if d.len == 0 {
            return Ok(());
        }
        self.on_queue(d.device, |stream| {
            let api = api().map_err(|e| failure(d.device, e))?;
            // SAFETY: the pointer and length describe this live allocation; queued on the
            // stream the device's work goes on.
            let r = unsafe { (api.memset_d8_async)(d.ptr as usize as *mut c_void, byte, d.len, stream) };
            api.check(r, "hipMemsetD8Async").map_err(|e| failure(d.device, e))
        })
    }
    fn copy_device_to_device(&self, src: &dyn Buffer, dst: &dyn Buffer) -> Result<()> {
        let (s, d) = (self.buffer(src)?, self.buffer(dst)?);
        if s.len != d.len {
            return Err(Error::Tensor(format!("copy of {} bytes into {} bytes", s.len, d.len)));
        }
        if s.ptr == d.ptr || s.len == 0 {
            return Ok(());
        }
        self.on_queue(d.device, |stream| {
            let api = api().map_err(|e| failure(d.device, e))?;
            // SAFETY: both are live allocations of `s.len` bytes; queued in stream order.
            let r = unsafe {
                (api.memcpy_async)(
                    d.ptr as usize as *mut c_void,
                    s.ptr as usize as *const c_void,
                    s.len,
                    MEMCPY_D2D,
                    stream,
                )
            };
            api.check(r, "hipMemcpyAsync (device to device)").map_err(|e| failure(d.device, e))
        })
    }
    fn device_info(&self, ordinal: u32) -> Result<DeviceInfo> {
        let device = Device::new(DeviceKind::HIP, ordinal);
        let api = self.enter(device)?;
        let attr = |a: c_int, what: &str| -> Result<u32> {
            let mut v: c_int = 0;
            // SAFETY: `v` is a valid out-pointer; the ordinal is a device of this runtime.
            let r = unsafe { (api.device_get_attribute)(&mut v, a, ordinal as c_int) };
            api.check(r, what).map_err(|e| failure(device, e))?;
            Ok(v.max(0) as u32)
        };
        let arch = gcn_arch_name(device)?;
        let mut info = DeviceInfo::basic(device, self.name(ordinal), arch.clone());
        info.arch_family = crate::vendor_info().arch_family(&arch).map(str::to_owned);
        info.compute_units = attr(attr::MULTIPROCESSOR_COUNT, "hipDeviceGetAttribute(MultiprocessorCount)")?.max(1);
        info.warp_size = attr(attr::WARP_SIZE, "hipDeviceGetAttribute(WarpSize)")?;
        info.max_threads_per_block = attr(attr::MAX_THREADS_PER_BLOCK, "hipDeviceGetAttribute(MaxThreadsPerBlock)")?;
        info.shared_memory_per_block =
            attr(attr::MAX_SHARED_MEMORY_PER_BLOCK, "hipDeviceGetAttribute(MaxSharedMemoryPerBlock)")? as usize;
        info.shared_memory_per_block_optin = info.shared_memory_per_block;
        let mut total = 0usize;
        // SAFETY: `total` is a valid out-pointer.
        if unsafe { (api.device_total_mem)(&mut total, ordinal as c_int) } == 0 {
            info.total_memory = total;
        }
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid out-pointer.
        if unsafe { (api.runtime_get_version)(&mut version) } == 0 {
            info.driver_version = format!("hip {version}");
        }
        let expected = crate::hiprtc::wave_size_of(&arch);
        if info.warp_size != expected {
            return Err(failure(
                device,
                format!("{arch} runs wavefronts of {} lanes; the kernels are built for {expected}", info.warp_size),
            ));
        }
        Ok(info)
    }
    fn queue(&self, device: Device) -> Result<Queue> {
        self.enter(device)?;
        Ok(tefl_core::device::current_queue(device).unwrap_or(Queue { device, handle: 0, external: false }))
    }
    fn accepts_external_queues(&self) -> bool {
        true
    }
}

/// `hipGetDeviceProperties` under the names of ROCm 6+ and 5. Its struct changed between
/// releases (`hipDeviceProp_tR0600`), so it is written into a buffer larger than any version
/// of it and only the `gcnArchName` string is read back.
type GetProps = unsafe extern "C" fn(*mut c_void, c_int) -> crate::hip::HipError;

/// The device's `gcnArchName` without its feature suffix (`gfx90a:sramecc+:xnack-` → `gfx90a`).
fn gcn_arch_name(device: Device) -> Result<String> {
    let api = api().map_err(|e| Error::DeviceUnavailable { device: device.to_string(), reason: e })?;
    // SAFETY: re-opening an already loaded library returns the same handle; it stays loaded.
    let lib = unsafe { libloading::Library::new(&api.library) }.map_err(|e| failure(device, e.to_string()))?;
    // SAFETY: both symbols take (hipDeviceProp_t*, int) and return hipError_t.
    let get: libloading::Symbol<'_, GetProps> =
        unsafe { lib.get(b"hipGetDevicePropertiesR0600\0").or_else(|_| lib.get(b"hipGetDeviceProperties\0")) }
            .map_err(|e| failure(device, format!("{} has no hipGetDeviceProperties: {e}", api.library)))?;
    let mut props = vec![0u8; 16 * 1024];
    // SAFETY: the buffer is larger than hipDeviceProp_t of every release; the ordinal is checked
    // by the caller's `enter`.
    let r = unsafe { get(props.as_mut_ptr().cast(), device.ordinal as c_int) };
    api.check(r, "hipGetDeviceProperties").map_err(|e| failure(device, e))?;
    arch_in_props(&props).ok_or_else(|| failure(device, "hipGetDeviceProperties gave no gcnArchName".into()))
}

/// The first NUL-terminated `gfx…` string in a device-properties buffer, up to its first `:`.
fn arch_in_props(props: &[u8]) -> Option<String> {
    props.windows(3).enumerate().find_map(|(i, w)| {
        if w != b"gfx" || (i > 0 && props[i - 1] != 0) {
            return None;
        }
        let end = props[i..].iter().position(|&b| b == 0)? + i;
        let s = std::str::from_utf8(&props[i..end]).ok()?;
        let arch = s.split(':').next()?;
        (arch.len() > 3 && arch[3..].chars().all(|c| c.is_ascii_alphanumeric())).then(|| arch.to_string())
    })
}

/// The one HIP runtime of the process (the registered one).
pub fn global() -> &'static Arc<HipRuntime> {
    static RT: OnceLock<Arc<HipRuntime>> = OnceLock::new();
    RT.get_or_init(|| Arc::new(HipRuntime::default()))
}

fn make() -> Arc<dyn DeviceRuntime> {
    global().clone()
}

inventory::submit! {
    DeviceRuntimeRegistration { make }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arch_is_read_from_any_properties_layout() {
        let mut p = vec![0u8; 1024];
        p[..14].copy_from_slice(b"AMD Instinct\0\0");
        p[396..396 + 23].copy_from_slice(b"gfx90a:sramecc+:xnack-\0");
        assert_eq!(arch_in_props(&p).as_deref(), Some("gfx90a"));
        let mut q = vec![0u8; 2048];
        q[1200..1208].copy_from_slice(b"gfx1100\0");
        assert_eq!(arch_in_props(&q).as_deref(), Some("gfx1100"));
        assert_eq!(arch_in_props(&[0u8; 64]), None);
    }

    #[test]
    fn without_a_device_everything_is_a_typed_error() {
        let rt = HipRuntime::default();
        if rt.device_count() > 0 {
            return;
        }
        let d = Device::new(DeviceKind::HIP, 0);
        assert!(rt.unavailable_reason().is_some());
        assert!(matches!(rt.alloc(d, 16), Err(Error::DeviceUnavailable { .. })));
        assert!(matches!(rt.device_info(0), Err(Error::DeviceUnavailable { .. })));
        assert!(matches!(rt.synchronize(d), Err(Error::DeviceUnavailable { .. })));
    }
}
