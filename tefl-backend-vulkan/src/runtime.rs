//! The Vulkan device runtime (`DeviceKind::VULKAN`): device-local buffers from the allocator,
//! host copies through host-visible staging buffers, fills and same-device copies as transfer
//! commands, and the device facts kernels are sized from (subgroup size, shared memory per
//! workgroup, 16-bit storage). Without a loader or a device every call is a typed
//! "unavailable" error.

use std::any::Any;
use std::sync::{Arc, Mutex, OnceLock};

use ash::vk;
use gpu_allocator::MemoryLocation;
use gpu_allocator::vulkan::Allocation;
use tefl_core::device::{Buffer, DeviceInfo, DeviceRuntime, DeviceRuntimeRegistration};
use tefl_core::{Device, DeviceKind, Error, Result};

use crate::context::instance;
use crate::gpu::{Binding, Gpu, gpu};

/// Device memory of one Vulkan device, given back to the device's pool when dropped.
pub struct VulkanBuffer {
    gpu: Arc<Gpu>,
    len: usize,
    buffer: vk::Buffer,
    size: u64,
    allocation: Mutex<Option<Allocation>>,
}

impl VulkanBuffer {
    /// The buffer as a dispatch binding (its whole size, a multiple of 4 bytes).
    pub fn binding(&self) -> Binding {
        Binding { buffer: self.buffer, size: self.size }
    }
}

impl Buffer for VulkanBuffer {
    fn device(&self) -> Device {
        self.gpu.device_id
    }
    fn len_bytes(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for VulkanBuffer {
    fn drop(&mut self) {
        if let Some(a) = self.allocation.lock().unwrap_or_else(|p| p.into_inner()).take() {
            self.gpu.return_buffer(self.buffer, a, self.size);
        }
    }
}

/// A host-visible staging buffer, destroyed when dropped.
struct Staging<'a> {
    gpu: &'a Gpu,
    buffer: vk::Buffer,
    allocation: Option<Allocation>,
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        if let Some(a) = self.allocation.take() {
            self.gpu.destroy_buffer(self.buffer, a);
        }
    }
}

fn staging(gpu: &Gpu, bytes: usize, location: MemoryLocation) -> Result<Staging<'_>> {
    let (buffer, allocation, _) = gpu.create_buffer(bytes, location)?;
    if allocation.mapped_ptr().is_none() {
        gpu.destroy_buffer(buffer, allocation);
        return Err(Error::DeviceFailure {
            device: gpu.device_id.to_string(),
            reason: "a staging buffer is not mapped".into(),
        });
    }
    Ok(Staging { gpu, buffer, allocation: Some(allocation) })
}

/// The runtime of `DeviceKind::VULKAN`.
#[derive(Default)]
pub struct VulkanRuntime;

impl VulkanRuntime {
    /// The Vulkan memory behind a buffer, or a typed error when it is not Vulkan memory.
    pub fn buffer<'a>(&self, b: &'a dyn Buffer) -> Result<&'a VulkanBuffer> {
        b.as_any()
            .downcast_ref::<VulkanBuffer>()
            .ok_or_else(|| Error::Tensor(format!("a {} buffer is not Vulkan memory", b.device())))
    }

    fn alloc_raw(&self, device: Device, bytes: usize) -> Result<VulkanBuffer> {
        let gpu = gpu(device)?;
        let (buffer, allocation, size) = gpu.tensor_buffer(bytes)?;
        let buf = VulkanBuffer { gpu, len: bytes, buffer, size, allocation: Mutex::new(Some(allocation)) };
        if tefl_core::device::poison_allocations() {
            self.fill(&buf, 0xFF)?;
        }
        Ok(buf)
    }
}

impl DeviceRuntime for VulkanRuntime {
    fn kind(&self) -> DeviceKind {
        DeviceKind::VULKAN
    }
    fn device_count(&self) -> usize {
        instance().map_or(0, |i| i.devices.len())
    }
    fn unavailable_reason(&self) -> Option<String> {
        instance().err()
    }
    fn name(&self, ordinal: u32) -> String {
        instance()
            .ok()
            .and_then(|i| i.devices.get(ordinal as usize))
            .map_or_else(|| "unavailable".into(), |d| d.name.clone())
    }
    fn arch(&self, ordinal: u32) -> String {
        instance().ok().and_then(|i| i.devices.get(ordinal as usize)).map_or_else(|| "unknown".into(), |d| d.arch())
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
        let mut stage = staging(&d.gpu, src.len(), MemoryLocation::CpuToGpu)?;
        let mapped =
            stage.allocation.as_mut().and_then(|a| a.mapped_slice_mut()).ok_or_else(|| Error::DeviceFailure {
                device: d.gpu.device_id.to_string(),
                reason: "a staging buffer is not mapped".into(),
            })?;
        mapped[..src.len()].copy_from_slice(src);
        d.gpu.run(|r| {
            r.copy(stage.buffer, d.buffer, src.len() as u64);
            Ok(())
        })
    }
    fn copy_to_host(&self, src: &dyn Buffer, dst: &mut [u8]) -> Result<()> {
        let s = self.buffer(src)?;
        if dst.len() != s.len {
            return Err(Error::Tensor(format!("copy of {} bytes into {} bytes", s.len, dst.len())));
        }
        if dst.is_empty() {
            return Ok(());
        }
        let stage = staging(&s.gpu, dst.len(), MemoryLocation::GpuToCpu)?;
        s.gpu.run_and_wait(|r| {
            r.copy(s.buffer, stage.buffer, dst.len() as u64);
            Ok(())
        })?;
        let mapped = stage.allocation.as_ref().and_then(|a| a.mapped_slice()).ok_or_else(|| Error::DeviceFailure {
            device: s.gpu.device_id.to_string(),
            reason: "a staging buffer is not mapped".into(),
        })?;
        dst.copy_from_slice(&mapped[..dst.len()]);
        Ok(())
    }
    fn copy_device_to_device(&self, src: &dyn Buffer, dst: &dyn Buffer) -> Result<()> {
        let (s, d) = (self.buffer(src)?, self.buffer(dst)?);
        if s.len != d.len || s.gpu.device_id != d.gpu.device_id {
            return Err(Error::Tensor(format!(
                "copy of {} bytes on {} into {} bytes on {}",
                s.len, s.gpu.device_id, d.len, d.gpu.device_id
            )));
        }
        if s.len == 0 {
            return Ok(());
        }
        // A compute copy (NVIDIA's transfer path is far slower), of whole words: both buffers
        // are rounded up to words (`Gpu::create_buffer`), so it stays inside them. Buffers past
        // what one storage binding may cover take the transfer path.
        let range = u64::from(d.gpu.physical.limits.max_storage_buffer_range);
        if s.size.max(d.size) > range {
            return d.gpu.run(|r| {
                r.copy(s.buffer, d.buffer, s.len as u64);
                Ok(())
            });
        }
        let words = (s.len.div_ceil(4)) as u32; // below 2^30: the range is at most 4 GiB
        let pipeline = d.gpu.pipeline("copy.wg=256", 2, 4)?;
        let groups = words.div_ceil(256 * 4).clamp(1, crate::ops::MAX_GROUPS);
        d.gpu.run(|r| r.dispatch(&pipeline, &[s.binding(), d.binding()], &words.to_le_bytes(), (groups, 1, 1)))
    }
    fn synchronize(&self, device: Device) -> Result<()> {
        gpu(device)?.wait_idle()
    }
    fn time_on_device(&self, device: Device, work: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        gpu(device)?.timed(work)
    }
    fn time_reps_after(
        &self,
        device: Device,
        reps: usize,
        before: &mut dyn FnMut() -> Result<()>,
        work: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<f64>> {
        // Every repetition submitted before one wait (`Gpu::timed_reps`).
        gpu(device)?.timed_reps(reps, before, work)
    }
    fn fill(&self, dst: &dyn Buffer, byte: u8) -> Result<()> {
        let d = self.buffer(dst)?;
        d.gpu.run(|r| {
            r.fill(d.binding(), byte);
            Ok(())
        })
    }
    fn validation_messages(&self) -> usize {
        crate::context::validation_messages()
    }
    fn device_info(&self, ordinal: u32) -> Result<DeviceInfo> {
        let device = Device::new(DeviceKind::VULKAN, ordinal);
        let g = gpu(device)?;
        let p = &g.physical;
        let arch = p.arch();
        let mut info = DeviceInfo::basic(device, p.name.clone(), arch.clone());
        info.arch_family = crate::vendor_info().arch_family(&arch).map(str::to_owned);
        info.warp_size = p.subgroup_size;
        info.max_threads_per_block = p.limits.max_compute_work_group_invocations;
        info.shared_memory_per_block = p.limits.max_compute_shared_memory_size as usize;
        info.shared_memory_per_block_optin = info.shared_memory_per_block;
        info.storage_16bit = p.storage_16bit;
        info.driver_version = format!("vulkan driver {:#x}", p.driver_version);
        Ok(info)
    }
}

/// The one Vulkan runtime of the process (the registered one).
pub fn global() -> &'static Arc<VulkanRuntime> {
    static RT: OnceLock<Arc<VulkanRuntime>> = OnceLock::new();
    RT.get_or_init(|| Arc::new(VulkanRuntime))
}

fn make() -> Arc<dyn DeviceRuntime> {
    global().clone()
}

inventory::submit! {
    DeviceRuntimeRegistration { make }
}
