//! One opened Vulkan device: the logical device with its compute queue, the memory allocator
//! (`gpu-allocator`: sub-allocated device-local memory, host-visible staging buffers), the
//! compute pipelines of the SPIR-V that `build.rs` made (through a `VkPipelineCache` kept in
//! `$TEFL_CACHE_DIR/vulkan/`, checksummed, written atomically), and the recorder every op's
//! commands go through.
//!
//! Submission is asynchronous: `Gpu::run` records an op's commands into the next of
//! [`SLOTS`] command buffers (each with its descriptor pool and timestamp queries), submits it
//! to the one queue signalling the next value of a timeline semaphore, and returns. A slot is
//! reused once the semaphore reached its value. Each command buffer starts with a full memory
//! barrier, so it sees everything submitted before it: a pooled buffer may be handed to the next
//! op at once, while destroying a buffer waits (deferred) until every submission made before the
//! drop has finished. Reads by the host (`Gpu::run_and_wait`) and `synchronize` wait.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ash::vk;
use gpu_allocator::MemoryLocation;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme, Allocator, AllocatorCreateDesc};
use tefl_core::{Device, DeviceKind, Error, Result};

use crate::context::{Instance, PhysicalInfo, instance};

include!(concat!(env!("OUT_DIR"), "/shaders.rs"));

/// Descriptor sets one submission may allocate, and storage-buffer descriptors among them.
const MAX_SETS: u32 = 256;
const MAX_STORAGE_DESCRIPTORS: u32 = 2048;

/// A failure of a Vulkan call on `device`.
pub(crate) fn vk_error(device: Device, what: &str, e: vk::Result) -> Error {
    if e == vk::Result::ERROR_OUT_OF_DEVICE_MEMORY || e == vk::Result::ERROR_OUT_OF_HOST_MEMORY {
        return Error::OutOfMemory { device: device.to_string(), bytes: 0, what: format!("{what} ({e})") };
    }
    Error::DeviceFailure { device: device.to_string(), reason: format!("{what}: {e}") }
}

/// `e` with the bytes of the request that failed, where it is an out-of-memory error (a Vulkan
/// result code does not say them).
fn with_bytes(e: Error, bytes: usize) -> Error {
    match e {
        Error::OutOfMemory { device, what, .. } => Error::OutOfMemory { device, bytes, what },
        e => e,
    }
}

/// A compute pipeline and its layouts.
pub struct Pipeline {
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
    bindings: u32,
    push_bytes: u32,
}

/// Command buffers in flight at most (the ring of `Slot`s).
pub const SLOTS: usize = 8;

/// One command buffer of the ring, with what its submission uses until it finishes.
struct Slot {
    cmd: vk::CommandBuffer,
    descriptors: vk::DescriptorPool,
    /// Two timestamps around the submission's commands (when the queue can write them).
    queries: Option<vk::QueryPool>,
    /// The timeline value its last submission signals (0: never submitted).
    value: u64,
    /// The repetition of `Gpu::timing` whose time that submission's timestamps (not yet
    /// collected) count towards.
    timed: Option<usize>,
}

/// What `Gpu::timing` collects while a timing runs: the device seconds of each repetition's
/// submissions, and the repetition the submissions made now count towards (`None`: not timed,
/// e.g. the L2 flush before a repetition).
struct Timing {
    seconds: Vec<f64>,
    current: Option<usize>,
}

/// The device's queue and the ring of command buffers (the timeline semaphore is `Gpu::timeline`).
struct Submitter {
    queue: vk::Queue,
    /// The pool the slots' command buffers come from (lives as long as the device).
    _pool: vk::CommandPool,
    slots: Vec<Slot>,
    /// The slot the next submission takes.
    next: usize,
}

/// Device-local buffers whose tensors were dropped, kept by size class for the next
/// allocation of that class (allocating device memory is slow on real drivers: a fresh 256 MiB
/// buffer per op costs milliseconds). A returned buffer may still be in use by a submission in
/// flight; the leading barrier of every later submission orders its next use after that.
#[derive(Default)]
struct BufferPool {
    free: HashMap<u64, Vec<(vk::Buffer, Allocation)>>,
    bytes: u64,
}

/// The most bytes the pool keeps idle.
const POOL_LIMIT: u64 = 4 << 30;

/// The size a buffer of `bytes` is made with: whole words, powers of two up to 1 MiB, then
/// whole MiB (so buffers of similar sizes are reused).
pub(crate) fn size_class(bytes: usize) -> u64 {
    let b = (bytes.max(4).div_ceil(4) * 4) as u64;
    if b <= 1 << 20 { b.next_power_of_two() } else { b.div_ceil(1 << 20) << 20 }
}

/// An opened device.
pub struct Gpu {
    /// The tefl device.
    pub device_id: Device,
    /// What tefl knows of the physical device.
    pub physical: PhysicalInfo,
    /// The logical device.
    pub device: ash::Device,
    allocator: Mutex<Allocator>,
    submitter: Mutex<Submitter>,
    pipelines: Mutex<HashMap<String, Arc<Pipeline>>>,
    pool: Mutex<BufferPool>,
    /// While timing (`Some`), the device seconds of each repetition's submissions so far.
    timing: Mutex<Option<Timing>>,
    /// Signals the value of each submission when it finishes.
    timeline: vk::Semaphore,
    /// The value of the last submission (written under the submitter's lock; read without it,
    /// so that dropping a tensor never waits for that lock).
    submitted: AtomicU64,
    /// Buffers dropped while submissions were in flight, with the timeline value after which
    /// they may be destroyed.
    deferred: Mutex<Vec<(u64, vk::Buffer, Allocation)>>,
    /// The pipeline cache every pipeline is created through, loaded from and saved to
    /// `cache_file` (`$TEFL_CACHE_DIR/vulkan/`).
    pipeline_cache: vk::PipelineCache,
    cache_file: Option<PathBuf>,
    /// The checksum of the data last read from or written to `cache_file` (a pipeline the
    /// cache already held leaves the data unchanged, and the file is not rewritten).
    cache_saved: Mutex<u64>,
    /// Whether the cooperative-matrix shaders may run (the device has what they need, enabled
    /// at creation, and `TEFL_VULKAN_COOPMAT` is not `0`).
    pub coop: bool,
    /// Whether the bf16 cooperative-matrix shaders may run as well (`VK_KHR_shader_bfloat16`).
    pub coop_bf16: bool,
    /// Where the workgroup-scope GEMM may run (offered, enabled at creation, and
    /// `TEFL_VULKAN_COOPMAT=2`): the shapes the device offers it.
    pub coopmat2: Option<crate::coopmat2::Coopmat2>,
    /// Where `TEFL_VULKAN_PIPELINE_STATS=1` asked for them and the device has them: the
    /// functions that read the driver's statistics of each pipeline, logged at its creation.
    stats: Option<ash::khr::pipeline_executable_properties::Device>,
}

/// The variable that makes tefl log the driver's statistics of every pipeline it creates
/// (`1`; registers, shared memory, spills as the driver names them), for vendor engineers
/// tuning shaders. Devices without `VK_KHR_pipeline_executable_properties` log nothing. Read,
/// like every variable, by `tefl_core::policy::env()` (`vulkan_pipeline_stats`).
pub const PIPELINE_STATS_VAR: &str = "TEFL_VULKAN_PIPELINE_STATS";

/// The variable that chooses the GEMM and attention paths on a device with cooperative matrices:
/// unset or `1` = subgroup-scope matrices (`VK_KHR_cooperative_matrix`: `gemm_coop.wgsl`,
/// `attn_*_coop.wgsl`; f16, and bf16 where the device also has `VK_KHR_shader_bfloat16`); `2` =
/// the same, but GEMM on NVIDIA's workgroup-scope matrices (`VK_NV_cooperative_matrix2`,
/// `build/cm2.rs`) where the device offers them; `0` = the portable kernels everywhere (so each
/// path is tested on such a device too). `2` is not the default: on the H200 (2026-11-26, same
/// run) it took bf16 4096³ in 0.877 ms and 8192³ in 6.76 ms, the subgroup-scope shader 0.847 and
/// 5.83. Read by `tefl_core::policy::env()` (`vulkan_coopmat`).
pub const COOPMAT_VAR: &str = "TEFL_VULKAN_COOPMAT";

// SAFETY: every Vulkan object that needs external synchronisation (the queue, the command pool
// and buffer, the descriptor pool, the allocator) is used under its mutex; the device handle and
// pipelines may be used from any thread.
unsafe impl Send for Gpu {}
// SAFETY: as above.
unsafe impl Sync for Gpu {}

/// The opened device of a tefl Vulkan device (opened on first use).
pub fn gpu(device: Device) -> Result<Arc<Gpu>> {
    let unavailable = |reason: String| Error::DeviceUnavailable { device: device.to_string(), reason };
    if device.kind != DeviceKind::VULKAN {
        return Err(Error::Tensor(format!("{device} is not a Vulkan device")));
    }
    let inst = instance().map_err(unavailable)?;
    let i = device.ordinal as usize;
    let Some(physical) = inst.devices.get(i) else {
        return Err(unavailable(format!("only {} Vulkan device(s)", inst.devices.len())));
    };
    let mut opened = inst.opened.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(g) = &opened[i] {
        return Ok(g.clone());
    }
    let g = Arc::new(Gpu::open(inst, device, physical.clone())?);
    opened[i] = Some(g.clone());
    Ok(g)
}

impl Gpu {
    fn open(inst: &Instance, device_id: Device, physical: PhysicalInfo) -> Result<Gpu> {
        let err = |what: &str, e: vk::Result| vk_error(device_id, what, e);
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(physical.queue_family)
            .queue_priorities(&priorities)];
        let env = tefl_core::policy::env().as_ref().map_err(Clone::clone)?;
        let wanted = env.vulkan_coopmat;
        let coop = physical.coop_matrix_f16 && wanted >= 1;
        let coop_bf16 = coop && physical.coop_matrix_bf16;
        let coopmat2 = physical.coopmat2.clone().filter(|_| coop && wanted >= 2);
        // TEFL_VULKAN_GEMM_TILE (its form checked by the environment's reader), checked here
        // so that a tile no GEMM can run is an error wherever it is set: built and fitting this
        // device where the cooperative-matrix GEMM can run, built elsewhere.
        if coop {
            crate::heuristics::coop_tile(&physical)?;
        } else {
            crate::heuristics::pinned_coop_tile(env.vulkan_gemm_tile, u32::MAX, u32::MAX)?;
        }
        let mut extensions: Vec<*const std::ffi::c_char> =
            if coop { crate::context::COOP_EXTENSIONS.iter().map(|n| n.as_ptr()).collect() } else { Vec::new() };
        if coop_bf16 {
            extensions.push(crate::context::BFLOAT16_EXTENSION.as_ptr());
        }
        if coopmat2.is_some() {
            extensions.push(crate::coopmat2::EXTENSION.as_ptr());
        }
        let stats = env.vulkan_pipeline_stats && physical.executable_stats;
        if stats {
            extensions.push(ash::khr::pipeline_executable_properties::NAME.as_ptr());
        }
        let mut stats_features =
            vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default().pipeline_executable_info(true);
        let mut bf16_features = crate::context::Bfloat16Features::new(true, true);
        let mut coop_features = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
        let mut coopmat2_features = crate::coopmat2::Features::new(true);
        let mut f13 = vk::PhysicalDeviceVulkan13Features::default().maintenance4(true);
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default()
            .storage_buffer16_bit_access(true)
            .uniform_and_storage_buffer16_bit_access(true);
        // Timeline semaphores are core in Vulkan 1.2 (every device tefl opens).
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(true);
        if coop {
            f12 = f12.shader_float16(true).vulkan_memory_model(true);
        }
        let mut info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&extensions)
            .push_next(&mut f12);
        if coop {
            // Each was checked to be supported (context.rs, coop_matrix_f16).
            info = info.push_next(&mut coop_features).push_next(&mut f11);
        }
        if stats {
            // Checked to be supported (context.rs, executable_stats).
            info = info.push_next(&mut stats_features);
        }
        if coop_bf16 {
            // Checked to be supported (context.rs, coop_matrix_bf16).
            info = info.push_next(&mut bf16_features);
        }
        if coopmat2.is_some() {
            // Checked to be supported, with Vulkan 1.3 on instance and device (coopmat2.rs).
            info = info.push_next(&mut coopmat2_features).push_next(&mut f13);
        }
        // SAFETY: the physical device belongs to the live instance; `info` and what it points to
        // outlive the call.
        let device = unsafe { inst.instance.create_device(physical.handle, &info, None) }
            .map_err(|e| err("vkCreateDevice", e))?;
        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: inst.instance.clone(),
            device: device.clone(),
            physical_device: physical.handle,
            debug_settings: Default::default(),
            buffer_device_address: false,
            allocation_sizes: Default::default(),
        })
        .map_err(|e| Error::DeviceFailure { device: device_id.to_string(), reason: format!("gpu-allocator: {e}") })?;
        // SAFETY: the device is live; each object created here is owned by the returned Gpu.
        let (submitter, timeline) = unsafe {
            let queue = device.get_device_queue(physical.queue_family, 0);
            let pool = device
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default()
                        .queue_family_index(physical.queue_family)
                        .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                    None,
                )
                .map_err(|e| err("vkCreateCommandPool", e))?;
            let cmds = device
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(SLOTS as u32),
                )
                .map_err(|e| err("vkAllocateCommandBuffers", e))?;
            let mut timeline_info =
                vk::SemaphoreTypeCreateInfo::default().semaphore_type(vk::SemaphoreType::TIMELINE).initial_value(0);
            let timeline = device
                .create_semaphore(&vk::SemaphoreCreateInfo::default().push_next(&mut timeline_info), None)
                .map_err(|e| err("vkCreateSemaphore", e))?;
            let sizes = [vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: MAX_STORAGE_DESCRIPTORS,
            }];
            let mut slots = Vec::with_capacity(SLOTS);
            for cmd in cmds {
                let descriptors = device
                    .create_descriptor_pool(
                        &vk::DescriptorPoolCreateInfo::default().max_sets(MAX_SETS).pool_sizes(&sizes),
                        None,
                    )
                    .map_err(|e| err("vkCreateDescriptorPool", e))?;
                let queries = if physical.timestamp_bits > 0 {
                    let info = vk::QueryPoolCreateInfo::default().query_type(vk::QueryType::TIMESTAMP).query_count(2);
                    Some(device.create_query_pool(&info, None).map_err(|e| err("vkCreateQueryPool", e))?)
                } else {
                    None
                };
                slots.push(Slot { cmd, descriptors, queries, value: 0, timed: None });
            }
            (Submitter { queue, _pool: pool, slots, next: 0 }, timeline)
        };
        let cache_file = pipeline_cache_file(&physical);
        let initial = cache_file.as_deref().and_then(read_pipeline_cache).unwrap_or_default();
        let cache_saved = Mutex::new(tefl_core::tuning::fnv1a64(&initial));
        // SAFETY: the device is live; the initial data outlives the call (a driver ignores data
        // it does not recognise; tefl only offers data saved for this device's cache UUID).
        let pipeline_cache = unsafe {
            let made =
                device.create_pipeline_cache(&vk::PipelineCacheCreateInfo::default().initial_data(&initial), None);
            match made {
                Ok(c) => c,
                Err(_) => device
                    .create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None)
                    .map_err(|e| err("vkCreatePipelineCache", e))?,
            }
        };
        let stats_ext = stats.then(|| ash::khr::pipeline_executable_properties::Device::new(&inst.instance, &device));
        tracing::info!(
            target: "TE-FL",
            "{device_id} ({}): cooperative matrices {coop} (bf16 {coop_bf16}), workgroup-scope {:?}",
            physical.name,
            coopmat2
        );
        Ok(Gpu {
            device_id,
            physical,
            device,
            allocator: Mutex::new(allocator),
            submitter: Mutex::new(submitter),
            pipelines: Mutex::new(HashMap::new()),
            pool: Mutex::new(BufferPool::default()),
            timing: Mutex::new(None),
            timeline,
            submitted: AtomicU64::new(0),
            deferred: Mutex::new(Vec::new()),
            pipeline_cache,
            cache_file,
            cache_saved,
            coop,
            coop_bf16,
            coopmat2,
            stats: stats_ext,
        })
    }

    /// Whether `wg_reduce.wgsl` (subgroup reductions) can run in workgroups of `wg`: the device
    /// has subgroup arithmetic in compute shaders and `wg` is whole subgroups.
    pub(crate) fn reduces_in_subgroups(&self, wg: u32) -> bool {
        let sg = self.physical.subgroup_size;
        self.physical.subgroup_arithmetic && sg > 0 && wg.is_multiple_of(sg)
    }

    /// A device-local buffer for a tensor of `bytes` bytes: an idle one of its size class from
    /// the pool, else a new one (after emptying the pool when memory runs out). Returns the
    /// buffer, its memory and its size.
    pub(crate) fn tensor_buffer(&self, bytes: usize) -> Result<(vk::Buffer, Allocation, u64)> {
        let class = size_class(bytes);
        {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((b, a)) = pool.free.get_mut(&class).and_then(Vec::pop) {
                pool.bytes -= class;
                return Ok((b, a, class));
            }
        }
        match self.create_buffer(class as usize, MemoryLocation::GpuOnly) {
            Err(Error::OutOfMemory { .. }) => {
                self.empty_pool();
                self.create_buffer(class as usize, MemoryLocation::GpuOnly)
            }
            r => r,
        }
    }

    /// Gives a tensor's buffer back: kept for reuse while the pool has room, else destroyed.
    pub(crate) fn return_buffer(&self, buffer: vk::Buffer, allocation: Allocation, size: u64) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if pool.bytes + size <= POOL_LIMIT {
            pool.bytes += size;
            pool.free.entry(size).or_default().push((buffer, allocation));
            return;
        }
        drop(pool);
        self.destroy_buffer(buffer, allocation);
    }

    /// Destroys every idle pooled buffer (after the submissions in flight, which may use them).
    pub(crate) fn empty_pool(&self) {
        // A failed wait leaves the buffers deferred instead: nothing is destroyed in use.
        let _ = self.wait_idle();
        let free = std::mem::take(&mut *self.pool.lock().unwrap_or_else(|p| p.into_inner()));
        for (b, a) in free.free.into_values().flatten() {
            self.destroy_buffer(b, a);
        }
    }

    /// A buffer of `bytes` bytes (rounded up to whole 32-bit words, at least one) in `location`.
    pub(crate) fn create_buffer(
        &self,
        bytes: usize,
        location: MemoryLocation,
    ) -> Result<(vk::Buffer, Allocation, u64)> {
        let dev = self.device_id;
        let size = (bytes.max(4).div_ceil(4) * 4) as u64;
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: the device is live; `info` outlives the call.
        let buffer = unsafe { self.device.create_buffer(&info, None) }
            .map_err(|e| with_bytes(vk_error(dev, "vkCreateBuffer", e), bytes))?;
        // SAFETY: `buffer` is a live buffer of this device.
        let requirements = unsafe { self.device.get_buffer_memory_requirements(buffer) };
        let allocation = self.allocator.lock().unwrap_or_else(|p| p.into_inner()).allocate(&AllocationCreateDesc {
            name: "tefl tensor",
            requirements,
            location,
            linear: true,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        });
        let allocation = match allocation {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: the buffer was never bound or used.
                unsafe { self.device.destroy_buffer(buffer, None) };
                return Err(match e {
                    gpu_allocator::AllocationError::OutOfMemory => {
                        Error::OutOfMemory { device: dev.to_string(), bytes, what: "a Vulkan buffer".into() }
                    }
                    e => Error::DeviceFailure { device: dev.to_string(), reason: format!("gpu-allocator: {e}") },
                });
            }
        };
        // SAFETY: the allocation satisfies the buffer's requirements (asked for with them) and is
        // bound once, before any use.
        let bound = unsafe { self.device.bind_buffer_memory(buffer, allocation.memory(), allocation.offset()) };
        if let Err(e) = bound {
            self.destroy_buffer(buffer, allocation);
            return Err(with_bytes(vk_error(dev, "vkBindBufferMemory", e), bytes));
        }
        Ok((buffer, allocation, size))
    }

    /// Destroys a buffer and frees its memory once every submission made so far has finished
    /// (at once when none is in flight, else deferred to a later `run` or wait).
    pub(crate) fn destroy_buffer(&self, buffer: vk::Buffer, allocation: Allocation) {
        let last = self.submitted.load(Ordering::Acquire);
        if last > self.completed() {
            self.deferred.lock().unwrap_or_else(|p| p.into_inner()).push((last, buffer, allocation));
            return;
        }
        self.destroy_now(buffer, allocation);
    }

    fn destroy_now(&self, buffer: vk::Buffer, allocation: Allocation) {
        // SAFETY: the buffer is this device's and every submission that could use it finished.
        unsafe { self.device.destroy_buffer(buffer, None) };
        let _ = self.allocator.lock().unwrap_or_else(|p| p.into_inner()).free(allocation);
    }

    /// The timeline value the device has reached (every submission up to it finished); 0 when
    /// it cannot be read (a lost device: nothing deferred is then freed).
    fn completed(&self) -> u64 {
        // SAFETY: the semaphore is this device's and lives as long as it.
        unsafe { self.device.get_semaphore_counter_value(self.timeline) }.unwrap_or(0)
    }

    /// Destroys the deferred buffers whose submissions have finished.
    fn free_finished(&self) {
        let done = self.completed();
        let ready: Vec<(u64, vk::Buffer, Allocation)> = {
            let mut d = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
            let (ready, pending) = std::mem::take(&mut *d).into_iter().partition(|(v, _, _)| *v <= done);
            *d = pending;
            ready
        };
        for (_, b, a) in ready {
            self.destroy_now(b, a);
        }
    }

    /// The pipeline of the shader variant `name` with `bindings` storage buffers and
    /// `push_bytes` bytes of push constants (created once).
    pub fn pipeline(&self, name: &str, bindings: u32, push_bytes: u32) -> Result<Arc<Pipeline>> {
        self.specialized_pipeline(name, bindings, push_bytes, &[])
    }

    /// [`Gpu::pipeline`] with specialization constants: `constants[i]` is the u32 value of
    /// constant id `i` (created once per name and values).
    pub fn specialized_pipeline(
        &self,
        name: &str,
        bindings: u32,
        push_bytes: u32,
        constants: &[u32],
    ) -> Result<Arc<Pipeline>> {
        let dev = self.device_id;
        let key = if constants.is_empty() { name.to_string() } else { format!("{name}{constants:?}") };
        let mut map = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = map.get(&key) {
            return Ok(p.clone());
        }
        let spirv = SHADERS.iter().find(|(n, _)| *n == name).map(|(_, b)| *b).ok_or_else(|| Error::DeviceFailure {
            device: dev.to_string(),
            reason: format!("no shader variant {name}"),
        })?;
        let words = ash::util::read_spv(&mut std::io::Cursor::new(spirv))
            .map_err(|e| Error::DeviceFailure { device: dev.to_string(), reason: format!("{name}: {e}") })?;
        let err = |what: &str, e: vk::Result| vk_error(dev, &format!("{what} ({name})"), e);
        let layout_bindings: Vec<vk::DescriptorSetLayoutBinding<'_>> = (0..bindings)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let ranges = [vk::PushConstantRange::default().stage_flags(vk::ShaderStageFlags::COMPUTE).size(push_bytes)];
        // SAFETY: the device is live; every create-info outlives its call; the module is
        // destroyed after the pipeline is made from it.
        unsafe {
            let module = self
                .device
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
                .map_err(|e| err("vkCreateShaderModule", e))?;
            let set_layout = self
                .device
                .create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&layout_bindings),
                    None,
                )
                .map_err(|e| err("vkCreateDescriptorSetLayout", e))?;
            let set_layouts = [set_layout];
            let mut layout_info = vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts);
            if push_bytes > 0 {
                layout_info = layout_info.push_constant_ranges(&ranges);
            }
            let layout =
                self.device.create_pipeline_layout(&layout_info, None).map_err(|e| err("vkCreatePipelineLayout", e))?;
            let entries: Vec<vk::SpecializationMapEntry> = (0..constants.len() as u32)
                .map(|i| vk::SpecializationMapEntry { constant_id: i, offset: 4 * i, size: 4 })
                .collect();
            let data: Vec<u8> = constants.iter().flat_map(|c| c.to_le_bytes()).collect();
            let specialization = vk::SpecializationInfo::default().map_entries(&entries).data(&data);
            let mut stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(c"main");
            if !constants.is_empty() {
                stage = stage.specialization_info(&specialization);
            }
            let flags = if self.stats.is_some() {
                vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
            } else {
                vk::PipelineCreateFlags::empty()
            };
            let info = [vk::ComputePipelineCreateInfo::default().flags(flags).stage(stage).layout(layout)];
            let made = self.device.create_compute_pipelines(self.pipeline_cache, &info, None);
            self.device.destroy_shader_module(module, None);
            let pipeline = made.map_err(|(_, e)| err("vkCreateComputePipelines", e))?[0];
            self.log_statistics(&key, pipeline);
            let p = Arc::new(Pipeline { set_layout, layout, pipeline, bindings, push_bytes });
            map.insert(key, p.clone());
            self.save_pipeline_cache();
            Ok(p)
        }
    }

    /// Logs the driver's statistics of `pipeline` (`TEFL_VULKAN_PIPELINE_STATS=1`): one line
    /// per executable, `name: stat=value, ...`. A failed query logs nothing.
    fn log_statistics(&self, name: &str, pipeline: vk::Pipeline) {
        let Some(ext) = &self.stats else { return };
        let info = vk::PipelineInfoKHR::default().pipeline(pipeline);
        // SAFETY: the pipeline is live and was created with CAPTURE_STATISTICS_KHR on a device
        // with the extension and feature enabled.
        let executables = unsafe { ext.get_pipeline_executable_properties(&info) }.unwrap_or_default();
        for index in 0..executables.len() as u32 {
            let info = vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(index);
            // SAFETY: as above; `index` is one of the pipeline's executables.
            let stats = unsafe { ext.get_pipeline_executable_statistics(&info) }.unwrap_or_default();
            let shown: Vec<String> = stats
                .iter()
                .map(|s| {
                    let stat = s.name_as_c_str().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    // SAFETY: `format` says which member of the union the driver wrote.
                    let value = unsafe {
                        match s.format {
                            vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
                            vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                            vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                            vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => s.value.f64.to_string(),
                            _ => "?".to_string(),
                        }
                    };
                    format!("{stat}={value}")
                })
                .collect();
            tracing::info!(target: "TE-FL", "Vulkan pipeline {name}: {}", shown.join(", "));
        }
    }

    /// Writes the pipeline cache's data to its file (atomically, with a checksum) when it differs
    /// from what the file holds; a cache that cannot be written costs a warning, nothing else.
    fn save_pipeline_cache(&self) {
        let Some(path) = &self.cache_file else { return };
        // SAFETY: the cache is this device's; calls creating pipelines through it are serialised
        // by the pipelines' lock, which the caller holds.
        let data = match unsafe { self.device.get_pipeline_cache_data(self.pipeline_cache) } {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(target: "TE-FL", "Vulkan pipeline cache not saved: {e}");
                return;
            }
        };
        let sum = tefl_core::tuning::fnv1a64(&data);
        let mut saved = self.cache_saved.lock().unwrap_or_else(|p| p.into_inner());
        if *saved == sum {
            return;
        }
        let mut bytes = sum.to_le_bytes().to_vec();
        bytes.extend_from_slice(&data);
        match tefl_core::tuning::write_atomic(path, &bytes) {
            Ok(()) => *saved = sum,
            Err(e) => tracing::warn!(target: "TE-FL", "Vulkan pipeline cache not saved: {e}"),
        }
    }

    /// Records the commands `record` adds and submits them (without waiting for them).
    pub(crate) fn run(&self, record: impl FnOnce(&mut Recorder<'_>) -> Result<()>) -> Result<()> {
        self.submit(record).map(|_| ())
    }

    /// Records and submits like [`Gpu::run`], then waits until the commands have finished (for
    /// results the host reads).
    pub(crate) fn run_and_wait(&self, record: impl FnOnce(&mut Recorder<'_>) -> Result<()>) -> Result<()> {
        if let Some(value) = self.submit(record)? {
            let mut s = self.submitter.lock().unwrap_or_else(|p| p.into_inner());
            self.wait_for(&mut s, value)?;
        }
        Ok(())
    }

    /// Waits until the timeline reaches `value`, then adds the timestamps of every finished
    /// timed slot to `timing`.
    fn wait_for(&self, s: &mut Submitter, value: u64) -> Result<()> {
        let sems = [self.timeline];
        let values = [value];
        // SAFETY: the semaphore is this device's; the arrays outlive the call.
        unsafe {
            self.device.wait_semaphores(&vk::SemaphoreWaitInfo::default().semaphores(&sems).values(&values), u64::MAX)
        }
        .map_err(|e| vk_error(self.device_id, "vkWaitSemaphores", e))?;
        self.collect_timestamps(s, value)
    }

    /// Adds the device time of each timed slot whose submission is at or below `done` (known to
    /// have finished) to `timing`.
    fn collect_timestamps(&self, s: &mut Submitter, done: u64) -> Result<()> {
        for slot in s.slots.iter_mut().filter(|x| x.value <= done) {
            let Some(rep) = slot.timed.take() else { continue };
            let Some(q) = slot.queries else { continue };
            let mut stamps = [0u64; 2];
            // SAFETY: both queries were written by the slot's submission, which has finished;
            // `stamps` holds two 64-bit results.
            unsafe {
                self.device.get_query_pool_results(
                    q,
                    0,
                    &mut stamps,
                    vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
                )
            }
            .map_err(|e| vk_error(self.device_id, "vkGetQueryPoolResults", e))?;
            let bits = self.physical.timestamp_bits;
            let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
            let ticks = stamps[1].wrapping_sub(stamps[0]) & mask;
            let seconds = ticks as f64 * f64::from(self.physical.limits.timestamp_period) * 1e-9;
            if let Some(t) = self.timing.lock().unwrap_or_else(|p| p.into_inner()).as_mut()
                && let Some(total) = t.seconds.get_mut(rep)
            {
                *total += seconds;
            }
        }
        Ok(())
    }

    /// Records `record`'s commands into the next slot (after waiting for its previous
    /// submission) and submits them; returns the submission's timeline value, or `None` when
    /// nothing was recorded.
    fn submit(&self, record: impl FnOnce(&mut Recorder<'_>) -> Result<()>) -> Result<Option<u64>> {
        let dev = self.device_id;
        let mut guard = self.submitter.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut *guard;
        let err = |what: &str, e: vk::Result| vk_error(dev, what, e);
        let i = s.next;
        if s.slots[i].value > 0 {
            let v = s.slots[i].value;
            self.wait_for(s, v)?;
        }
        let timed = self.timing.lock().unwrap_or_else(|p| p.into_inner()).as_ref().and_then(|t| t.current);
        let slot = &mut s.slots[i];
        // SAFETY: the slot's command buffer and descriptor pool are used only under the
        // submitter's lock, and its last submission has finished (waited for above), so they may
        // be reset.
        unsafe {
            self.device
                .reset_descriptor_pool(slot.descriptors, vk::DescriptorPoolResetFlags::empty())
                .map_err(|e| err("vkResetDescriptorPool", e))?;
            self.device
                .reset_command_buffer(slot.cmd, vk::CommandBufferResetFlags::empty())
                .map_err(|e| err("vkResetCommandBuffer", e))?;
            self.device
                .begin_command_buffer(
                    slot.cmd,
                    &vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                )
                .map_err(|e| err("vkBeginCommandBuffer", e))?;
        }
        let queries = slot.queries.filter(|_| timed.is_some());
        if let Some(q) = queries {
            // The start is stamped once everything before has finished (bottom of pipe), so
            // a submission queued behind another is not charged for the wait.
            // SAFETY: the command buffer is recording; the query pool is the slot's.
            unsafe {
                self.device.cmd_reset_query_pool(slot.cmd, q, 0, 2);
                self.device.cmd_write_timestamp(slot.cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, q, 0);
            }
        }
        // Counting one command already makes the first command open with a barrier: everything
        // submitted before (a previous owner of a pooled buffer included) comes first.
        let mut rec = Recorder { gpu: self, cmd: slot.cmd, pool: slot.descriptors, commands: 1 };
        let recorded = record(&mut rec);
        let commands = rec.commands;
        if let Some(q) = queries {
            // SAFETY: as above.
            unsafe { self.device.cmd_write_timestamp(slot.cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, q, 1) };
        }
        // SAFETY: the command buffer is in the recording state (begun above).
        let ended = unsafe { self.device.end_command_buffer(slot.cmd) }.map_err(|e| err("vkEndCommandBuffer", e));
        recorded?;
        ended?;
        if commands <= 1 {
            // Nothing recorded: nothing to submit (the slot stays as it was).
            return Ok(None);
        }
        let value = self.submitted.load(Ordering::Acquire) + 1;
        let cmds = [slot.cmd];
        let signal = [self.timeline];
        let values = [value];
        let mut timeline = vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
        let submit =
            [vk::SubmitInfo::default().command_buffers(&cmds).signal_semaphores(&signal).push_next(&mut timeline)];
        // SAFETY: the queue is used under the lock; the command buffer is executable; the
        // signalled value is above every value signalled before.
        unsafe { self.device.queue_submit(s.queue, &submit, vk::Fence::null()) }
            .map_err(|e| err("vkQueueSubmit", e))?;
        slot.value = value;
        slot.timed = timed.filter(|_| queries.is_some());
        self.submitted.store(value, Ordering::Release);
        s.next = (i + 1) % SLOTS;
        drop(guard);
        self.free_finished();
        Ok(Some(value))
    }

    /// Runs `work` and returns its seconds on the device: the timestamps around each of the
    /// submissions made meanwhile, summed (host gaps between submissions do not count), or,
    /// where the queue cannot write timestamps, the host's clock from before `work` until the
    /// device has finished it. Submissions of other threads during `work` count too.
    pub(crate) fn timed(&self, work: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        Ok(self.timed_reps(1, &mut || Ok(()), work)?.first().copied().unwrap_or(0.0))
    }

    /// `reps` repetitions of `before` then `work`, all submitted before one wait (so that the
    /// device runs them back to back, as CUDA's events time a queue), and the device time of
    /// each repetition's `work` submissions (as [`timed`](Self::timed); `before`'s are not
    /// counted). A submission waits only for the one eight submissions before it (the ring's
    /// slot). Where the queue cannot write timestamps, each repetition runs alone and its `work`
    /// is timed on the host's clock until the device has finished it.
    pub(crate) fn timed_reps(
        &self,
        reps: usize,
        before: &mut dyn FnMut() -> Result<()>,
        work: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<f64>> {
        if self.physical.timestamp_bits == 0 {
            return (0..reps)
                .map(|_| {
                    before()?;
                    self.wait_idle()?;
                    let start = std::time::Instant::now();
                    work()?;
                    self.wait_idle()?;
                    Ok(start.elapsed().as_secs_f64())
                })
                .collect();
        }
        self.wait_idle()?;
        let set_current = |current: Option<usize>| {
            if let Some(t) = self.timing.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                t.current = current;
            }
        };
        *self.timing.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Timing { seconds: vec![0.0; reps], current: None });
        let mut run = || -> Result<()> {
            for rep in 0..reps {
                set_current(None);
                before()?;
                set_current(Some(rep));
                work()?;
            }
            set_current(None);
            Ok(())
        };
        let r = run().and_then(|()| self.wait_idle());
        let t = self.timing.lock().unwrap_or_else(|p| p.into_inner()).take();
        r.map(|()| t.map_or_else(|| vec![0.0; reps], |t| t.seconds))
    }

    /// Waits until every submission so far has finished, and frees what waited for them.
    pub(crate) fn wait_idle(&self) -> Result<()> {
        {
            let mut s = self.submitter.lock().unwrap_or_else(|p| p.into_inner());
            let last = self.submitted.load(Ordering::Acquire);
            self.wait_for(&mut s, last)?;
        }
        self.free_finished();
        Ok(())
    }
}

/// The pipeline cache file of a device: `$TEFL_CACHE_DIR/vulkan/<vendor>-<device>-<driver>-<cache
/// UUID>.bin` (`None` when no cache folder can be named).
fn pipeline_cache_file(p: &PhysicalInfo) -> Option<PathBuf> {
    let dir = tefl_core::tuning::default_cache_dir().ok()?;
    let uuid: String = p.pipeline_cache_uuid.iter().map(|b| format!("{b:02x}")).collect();
    Some(dir.join("vulkan").join(format!("{:04x}-{:04x}-{:x}-{uuid}.bin", p.vendor_id, p.device_id, p.driver_version)))
}

/// The pipeline cache data saved at `path`: `None` when the file is missing, or its checksum
/// (FNV-1a of the data, 8 bytes little-endian, before it) does not match.
pub fn read_pipeline_cache(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    let (sum, data) = bytes.split_at_checked(8)?;
    let ok = u64::from_le_bytes(sum.try_into().ok()?) == tefl_core::tuning::fnv1a64(data);
    if !ok {
        tracing::warn!(target: "TE-FL", "Vulkan pipeline cache {} is damaged; not used", path.display());
    }
    ok.then(|| data.to_vec())
}

/// The pipeline cache file of the Vulkan device `device` (tests; `None` when it has none).
pub fn pipeline_cache_path(device: Device) -> Result<Option<PathBuf>> {
    Ok(gpu(device)?.cache_file.clone())
}

/// A storage buffer bound to a dispatch: the buffer and its size in bytes.
#[derive(Clone, Copy)]
pub struct Binding {
    /// The buffer.
    pub buffer: vk::Buffer,
    /// Its size (whole words).
    pub size: u64,
}

/// Records one submission's commands, with a full memory barrier between consecutive ones.
pub struct Recorder<'a> {
    gpu: &'a Gpu,
    cmd: vk::CommandBuffer,
    pool: vk::DescriptorPool,
    commands: usize,
}

impl Recorder<'_> {
    /// Makes every earlier command's writes visible to the next command.
    fn barrier(&mut self) {
        if self.commands > 0 {
            let all = vk::AccessFlags::SHADER_READ
                | vk::AccessFlags::SHADER_WRITE
                | vk::AccessFlags::TRANSFER_READ
                | vk::AccessFlags::TRANSFER_WRITE;
            let barrier = [vk::MemoryBarrier::default().src_access_mask(all).dst_access_mask(all)];
            let stages = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
            // SAFETY: the command buffer is recording; the barrier struct outlives the call.
            unsafe {
                self.gpu.device.cmd_pipeline_barrier(
                    self.cmd,
                    stages,
                    stages,
                    vk::DependencyFlags::empty(),
                    &barrier,
                    &[],
                    &[],
                )
            };
        }
        self.commands += 1;
    }

    /// Fills a whole buffer with a repeated byte.
    pub fn fill(&mut self, dst: Binding, byte: u8) {
        self.fill_word(dst, u32::from_ne_bytes([byte; 4]));
    }

    /// Fills a whole buffer with a repeated 32-bit word (e.g. the bits of an f32).
    pub fn fill_word(&mut self, dst: Binding, word: u32) {
        self.barrier();
        // SAFETY: the command buffer is recording; `dst` is a live buffer of this device.
        unsafe { self.gpu.device.cmd_fill_buffer(self.cmd, dst.buffer, 0, vk::WHOLE_SIZE, word) };
    }

    /// Copies `bytes` bytes from the start of `src` to the start of `dst`.
    pub fn copy(&mut self, src: vk::Buffer, dst: vk::Buffer, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.barrier();
        let region = [vk::BufferCopy { src_offset: 0, dst_offset: 0, size: bytes }];
        // SAFETY: the command buffer is recording; both buffers are live and hold `bytes` bytes.
        unsafe { self.gpu.device.cmd_copy_buffer(self.cmd, src, dst, &region) };
    }

    /// Dispatches `groups` workgroups of `pipeline` with `bindings` (in binding order) and the
    /// push constants `push`.
    pub fn dispatch(
        &mut self,
        pipeline: &Pipeline,
        bindings: &[Binding],
        push: &[u8],
        groups: (u32, u32, u32),
    ) -> Result<()> {
        let dev = self.gpu.device_id;
        if bindings.len() != pipeline.bindings as usize || push.len() != pipeline.push_bytes as usize {
            return Err(Error::DeviceFailure {
                device: dev.to_string(),
                reason: format!(
                    "a dispatch with {} bindings and {} push bytes for a pipeline of {} and {}",
                    bindings.len(),
                    push.len(),
                    pipeline.bindings,
                    pipeline.push_bytes
                ),
            });
        }
        if groups.0 == 0 || groups.1 == 0 || groups.2 == 0 {
            return Ok(());
        }
        let layouts = [pipeline.set_layout];
        // SAFETY: the pool is used under the submitter's lock (held by `Gpu::run`); the layout is
        // live.
        let set = unsafe {
            self.gpu
                .device
                .allocate_descriptor_sets(
                    &vk::DescriptorSetAllocateInfo::default().descriptor_pool(self.pool).set_layouts(&layouts),
                )
                .map_err(|e| vk_error(dev, "vkAllocateDescriptorSets (too many dispatches in one submission?)", e))?[0]
        };
        let infos: Vec<[vk::DescriptorBufferInfo; 1]> = bindings
            .iter()
            .map(|b| [vk::DescriptorBufferInfo { buffer: b.buffer, offset: 0, range: b.size }])
            .collect();
        let writes: Vec<vk::WriteDescriptorSet<'_>> = infos
            .iter()
            .enumerate()
            .map(|(i, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(i as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(info)
            })
            .collect();
        self.barrier();
        // SAFETY: the set was just allocated and is not in use; the buffers are live; the command
        // buffer is recording; push constants match the pipeline layout's range (checked above).
        unsafe {
            self.gpu.device.update_descriptor_sets(&writes, &[]);
            self.gpu.device.cmd_bind_pipeline(self.cmd, vk::PipelineBindPoint::COMPUTE, pipeline.pipeline);
            self.gpu.device.cmd_bind_descriptor_sets(
                self.cmd,
                vk::PipelineBindPoint::COMPUTE,
                pipeline.layout,
                0,
                &[set],
                &[],
            );
            if !push.is_empty() {
                self.gpu.device.cmd_push_constants(self.cmd, pipeline.layout, vk::ShaderStageFlags::COMPUTE, 0, push);
            }
            self.gpu.device.cmd_dispatch(self.cmd, groups.0, groups.1, groups.2);
        }
        Ok(())
    }
}

/// Bytes of workgroup memory the WGSL module `name` declares, as naga measured it in build.rs
/// (`None` for a name that is not one of them).
pub fn declared_shared_bytes(name: &str) -> Option<u32> {
    SHARED_BYTES.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

/// Every shader variant's name (tests).
pub fn shader_names() -> impl Iterator<Item = &'static str> {
    SHADERS.iter().map(|(n, _)| *n)
}

#[cfg(test)]
mod tests {
    use super::{SHARED_BYTES, declared_shared_bytes, shader_names, size_class, vk_error, with_bytes};
    use ash::vk;
    use tefl_core::{Device, DeviceKind, Error};

    /// NVIDIA's Vulkan driver fits about 48 KB of shared memory an SM (H200, 2026-11-28: the
    /// 128×128 GEMM with 30 KB a workgroup instead of 24 ran half as fast), so the stages that
    /// run two workgroups an SM keep to 24 KB: the GEMM's 128×128 tile and attention's forward
    /// and dQ on cooperative matrices (driver-reported sizes on the H200 matched these: 24,576,
    /// 23,312 and 22,016 bytes at head dim 128).
    #[test]
    fn the_two_workgroup_stages_declare_at_most_24_kb_of_shared_memory() {
        let budget = 24 * 1024;
        let mut seen = 0;
        for (name, bytes) in SHARED_BYTES {
            let two_an_sm = (name.starts_with("gemm_coop.") && name.contains(".sgm=2.sgn=2."))
                || name.starts_with("attn_fwd_coop.")
                || name.starts_with("attn_dq_coop.");
            if two_an_sm {
                seen += 1;
                assert!(*bytes <= budget, "{name} declares {bytes} bytes of shared memory (budget {budget})");
            }
        }
        // Both dtypes, and four transpose pairs times two raster groups times three outputs of the
        // GEMM, two head dims of each attention stage.
        assert_eq!(seen, 2 * (4 * 2 * 3 + 2 + 2), "variants checked");
        assert_eq!(declared_shared_bytes("attn_fwd_coop.tx=bf16.dm=128.br=64"), Some(23_312));
        assert_eq!(declared_shared_bytes("attn_dq_coop.tx=f16.dm=128.br=64"), Some(22_016));
        assert_eq!(declared_shared_bytes("gemm_coop.tx=bf16.ta=0.tb=0.sgm=2.sgn=2.gm=8.out=w"), Some(24_576));
        // Every WGSL module is measured (the assembled gemm_cm2 modules are not WGSL).
        for name in shader_names().filter(|n| !n.starts_with("gemm_cm2.")) {
            assert!(declared_shared_bytes(name).is_some(), "{name} has no measured shared memory");
        }
        assert_eq!(declared_shared_bytes("no_such_shader"), None);
    }

    /// Every barrier of every WGSL module orders workgroup memory, the subgroup-scope ones too
    /// (build.rs gives them the workgroup barriers' semantics in place of naga's SubgroupMemory),
    /// and the GEMM's epilogue has them: its staging tiles are per subgroup.
    #[test]
    fn every_barrier_orders_workgroup_memory() {
        const WORKGROUP_MEMORY: u32 = 0x100;
        const SUBGROUP_MEMORY: u32 = 0x80;
        let mut subgroup_scoped = 0;
        for (name, bytes) in super::SHADERS.iter().filter(|(n, _)| !n.starts_with("gemm_cm2.")) {
            let words: Vec<u32> = bytes.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            let ins = crate::coopmat2::tests::instructions(&words);
            let constants: std::collections::HashMap<u32, u32> = ins
                .iter()
                .filter(|(op, o)| *op == spirv::Op::Constant as u32 && o.len() == 3)
                .map(|(_, o)| (o[1], o[2]))
                .collect();
            for (_, o) in ins.iter().filter(|(op, _)| *op == spirv::Op::ControlBarrier as u32) {
                let (scope, semantics) = (constants[&o[0]], constants[&o[2]]);
                assert!(
                    semantics & WORKGROUP_MEMORY != 0 && semantics & SUBGROUP_MEMORY == 0,
                    "{name}: a barrier of scope {scope} with semantics {semantics:#x}"
                );
                if scope == spirv::Scope::Subgroup as u32 {
                    subgroup_scoped += 1;
                    assert!(name.starts_with("gemm_coop."), "{name}: an unexpected subgroup barrier");
                }
            }
        }
        assert!(subgroup_scoped > 0, "no subgroup-scope barrier seen");
    }

    #[test]
    fn a_vulkan_out_of_memory_result_says_the_bytes_of_the_buffer_it_refused() {
        let dev = Device::new(DeviceKind::VULKAN, 0);
        let e = with_bytes(vk_error(dev, "vkCreateBuffer", vk::Result::ERROR_OUT_OF_DEVICE_MEMORY), 4096);
        assert!(matches!(e, Error::OutOfMemory { bytes: 4096, .. }), "{e:?}");
        assert!(e.to_string().contains("allocating 4096 bytes"), "{e}");
        let other = with_bytes(vk_error(dev, "vkCreateBuffer", vk::Result::ERROR_DEVICE_LOST), 4096);
        assert!(matches!(other, Error::DeviceFailure { .. }), "{other:?}");
    }

    #[test]
    fn size_classes_are_whole_words_then_powers_of_two_then_whole_mib() {
        assert_eq!(size_class(0), 4);
        assert_eq!(size_class(5), 8);
        assert_eq!(size_class(1000), 1024);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), 2 << 20);
        assert_eq!(size_class(256 << 20), 256 << 20);
        for b in [1usize, 3, 4, 17, 4095, 3 << 20, (7 << 20) + 5] {
            assert!(size_class(b) >= b as u64 && size_class(b).is_multiple_of(4), "{b}");
        }
    }
}
