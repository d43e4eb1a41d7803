//! The Vulkan instance and devices: the loader opened at run time (`ash`'s `loaded`), one
//! instance per process (Vulkan 1.3 where the loader has it, else 1.2), the physical devices
//! with a compute queue in tefl's order (discrete GPUs first, then integrated, virtual and CPU
//! devices; `TEFL_VULKAN_DEVICE` narrows the list to one by index or name), and on first use a
//! logical device per entry with one compute queue, a memory allocator and the shader
//! pipelines.
//!
//! When the instance offers `VK_EXT_debug_utils` (e.g. with `VK_INSTANCE_LAYERS` naming the
//! Khronos validation layer), a messenger counts every warning and error the layers report and
//! logs it ([`validation_messages`]); the CI run under the validation layer fails on any.

use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use ash::vk;

/// The variable that picks one Vulkan device (an index into tefl's order, or part of a name).
pub const DEVICE_VAR: &str = "TEFL_VULKAN_DEVICE";

/// The Vulkan version every device tefl uses has (timeline semaphores, 16-bit storage queries).
pub const API_VERSION: u32 = vk::API_VERSION_1_2;

/// The version the instance asks for where the loader has it: SPIR-V 1.6 modules (the
/// workgroup-scope GEMM of `coopmat2.rs`) need Vulkan 1.3.
const API_VERSION_WANTED: u32 = vk::API_VERSION_1_3;

static MESSAGES: AtomicUsize = AtomicUsize::new(0);

/// How many warnings and errors the validation layers reported so far in this process (0 when
/// no layer is enabled).
pub fn validation_messages() -> usize {
    MESSAGES.load(Ordering::SeqCst)
}

/// What tefl knows of a physical device before opening it.
#[derive(Clone, Debug)]
pub struct PhysicalInfo {
    /// The handle.
    pub handle: vk::PhysicalDevice,
    /// `deviceName`.
    pub name: String,
    /// `deviceType`.
    pub device_type: vk::PhysicalDeviceType,
    /// `vendorID` (0x10DE NVIDIA, 0x1002 AMD, 0x8086 Intel, 0x10005 Mesa's CPU devices).
    pub vendor_id: u32,
    /// The first queue family with compute.
    pub queue_family: u32,
    /// The properties' limits tefl sizes work from.
    pub limits: vk::PhysicalDeviceLimits,
    /// The subgroup size.
    pub subgroup_size: u32,
    /// Whether compute shaders have subgroup arithmetic (`subgroupAdd`: `norm_vec.wgsl`).
    pub subgroup_arithmetic: bool,
    /// `storageBuffer16BitAccess`.
    pub storage_16bit: bool,
    /// `driverVersion`, as the driver reports it.
    pub driver_version: u32,
    /// `deviceID`.
    pub device_id: u32,
    /// `pipelineCacheUUID`: pipeline cache data is only valid for this value.
    pub pipeline_cache_uuid: [u8; 16],
    /// The valid bits of the queue family's timestamps (0: it cannot write them).
    pub timestamp_bits: u32,
    /// The device's streaming multiprocessors, where it says (`VK_NV_shader_sm_builtins`):
    /// launches that want one wave of workgroups size it from this.
    pub compute_units: Option<u32>,
    /// Whether `gemm_coop.wgsl` can run: `VK_KHR_cooperative_matrix` with 16×16×16 f16 × f16 →
    /// f32 at subgroup scope, f16 arithmetic, 16-bit storage, the Vulkan memory model, and
    /// 32-lane subgroups (the shader's subgroup layout).
    pub coop_matrix_f16: bool,
    /// Whether the bf16 variant of `gemm_coop.wgsl` can run too: the above, and
    /// `VK_KHR_shader_bfloat16` with bfloat16 cooperative matrices (16×16×16 bf16 × bf16 → f32).
    pub coop_matrix_bf16: bool,
    /// Whether the device offers `VK_KHR_pipeline_executable_properties` with its
    /// `pipelineExecutableInfo` feature (the driver's statistics of each compiled pipeline).
    pub executable_stats: bool,
    /// What the device offers the workgroup-scope GEMM (`VK_NV_cooperative_matrix2`), where it
    /// also has what `coop_matrix_f16` needs.
    pub coopmat2: Option<crate::coopmat2::Coopmat2>,
}

impl PhysicalInfo {
    /// The arch string tune configs are keyed by: the vendor (`nvidia`, `amd`, `intel`,
    /// `lavapipe` for Mesa's CPU device, else `vk-<vendor id>`).
    pub fn arch(&self) -> String {
        match self.vendor_id {
            0x10DE => "nvidia".into(),
            0x1002 => "amd".into(),
            0x8086 => "intel".into(),
            0x10005 => "lavapipe".into(),
            id => format!("vk-{id:04x}"),
        }
    }
}

impl PhysicalInfo {
    /// The most loop iterations one shader invocation may run in all, where the driver ends
    /// loops past a budget: Mesa's llvmpipe (lavapipe) stops every loop of an invocation once
    /// they have run 65535 iterations together (`LP_MAX_TGSI_LOOP_ITERATIONS`), silently. `None`:
    /// no such budget.
    pub fn loop_iteration_limit(&self) -> Option<u64> {
        (self.vendor_id == 0x10005).then_some(65535)
    }
}

/// The process's Vulkan instance and the devices tefl may use.
pub struct Instance {
    /// The loader (kept alive while the instance lives).
    pub entry: ash::Entry,
    /// The instance.
    pub instance: ash::Instance,
    /// The usable devices, in tefl's order.
    pub devices: Vec<PhysicalInfo>,
    /// The opened logical devices, by ordinal.
    pub(crate) opened: Mutex<Vec<Option<Arc<crate::gpu::Gpu>>>>,
    _messenger: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
}

// SAFETY: the ash handles are plain Vulkan handles; Vulkan instances and physical devices may be
// used from any thread (the calls made through them here are externally synchronised or
// thread-safe per the spec).
unsafe impl Send for Instance {}
// SAFETY: as above.
unsafe impl Sync for Instance {}

/// The instance, created once; `Err` says why Vulkan cannot be used (no loader, no instance, no
/// device with a compute queue, a bad `TEFL_VULKAN_DEVICE`).
pub fn instance() -> Result<&'static Instance, String> {
    static I: OnceLock<Result<Instance, String>> = OnceLock::new();
    I.get_or_init(create).as_ref().map_err(Clone::clone)
}

unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    _user: *mut c_void,
) -> vk::Bool32 {
    if severity
        .intersects(vk::DebugUtilsMessageSeverityFlagsEXT::WARNING | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR)
    {
        MESSAGES.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the layer passes a valid callback-data struct whose message, when non-null, is a
        // NUL-terminated string valid for the duration of the call.
        let text = unsafe { data.as_ref() }
            .filter(|d| !d.p_message.is_null())
            // SAFETY: as above.
            .map(|d| unsafe { CStr::from_ptr(d.p_message) }.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Printed too: the layers are on only when asked for, and their messages must be seen.
        eprintln!("tefl: Vulkan validation: {text}");
        tracing::warn!(target: "TE-FL", "Vulkan validation: {text}");
    }
    vk::FALSE
}

fn create() -> Result<Instance, String> {
    // SAFETY: opens the system's Vulkan loader; the entry is stored in the instance it creates
    // and outlives it.
    let entry =
        unsafe { ash::Entry::load() }.map_err(|e| format!("the Vulkan loader (libvulkan) was not found: {e}"))?;
    // SAFETY: a plain query of the loader.
    let extensions = unsafe { entry.enumerate_instance_extension_properties(None) }.unwrap_or_default();
    let has_debug =
        extensions.iter().any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == ash::ext::debug_utils::NAME));
    let enabled: Vec<*const std::ffi::c_char> =
        if has_debug { vec![ash::ext::debug_utils::NAME.as_ptr()] } else { Vec::new() };
    // SAFETY: a plain query of the loader (`None`: a Vulkan 1.0 loader).
    let loader_version =
        unsafe { entry.try_enumerate_instance_version() }.ok().flatten().unwrap_or(vk::API_VERSION_1_0);
    let version = if loader_version >= API_VERSION_WANTED { API_VERSION_WANTED } else { API_VERSION };
    let app = vk::ApplicationInfo::default().application_name(c"tefl").engine_name(c"tefl").api_version(version);
    let info = vk::InstanceCreateInfo::default().application_info(&app).enabled_extension_names(&enabled);
    // SAFETY: `info`, `app` and the extension names outlive the call.
    let instance =
        unsafe { entry.create_instance(&info, None) }.map_err(|e| format!("vkCreateInstance failed: {e}"))?;
    let messenger = has_debug.then(|| {
        let du = ash::ext::debug_utils::Instance::new(&entry, &instance);
        let info = vk::DebugUtilsMessengerCreateInfoEXT::default()
            .message_severity(
                vk::DebugUtilsMessageSeverityFlagsEXT::WARNING | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
            )
            .message_type(
                vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                    | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                    | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
            )
            .pfn_user_callback(Some(on_message));
        // SAFETY: the callback is a plain function; the messenger lives as long as the instance.
        unsafe { du.create_debug_utils_messenger(&info, None) }.ok().map(|m| (du, m))
    });
    let devices = match list_devices(&entry, &instance, version) {
        Ok(d) => d,
        Err(e) => {
            // SAFETY: nothing created from the instance is alive except the messenger.
            unsafe {
                if let Some(Some((du, m))) = &messenger {
                    du.destroy_debug_utils_messenger(*m, None);
                }
                instance.destroy_instance(None);
            }
            return Err(e);
        }
    };
    let n = devices.len();
    Ok(Instance { entry, instance, devices, opened: Mutex::new(vec![None; n]), _messenger: messenger.flatten() })
}

/// The rank of a device type in tefl's order (discrete first).
fn type_rank(t: vk::PhysicalDeviceType) -> u8 {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => 0,
        vk::PhysicalDeviceType::INTEGRATED_GPU => 1,
        vk::PhysicalDeviceType::VIRTUAL_GPU => 2,
        vk::PhysicalDeviceType::CPU => 3,
        _ => 4,
    }
}

fn list_devices(entry: &ash::Entry, instance: &ash::Instance, version: u32) -> Result<Vec<PhysicalInfo>, String> {
    // SAFETY: `instance` is live; the handles it returns are only queried while it lives.
    let handles = unsafe { instance.enumerate_physical_devices() }
        .map_err(|e| format!("vkEnumeratePhysicalDevices failed: {e}"))?;
    let mut devices = Vec::new();
    for h in handles {
        // SAFETY: `h` is a physical device of the live instance; the chained structs outlive the
        // calls that fill them.
        let (props, subgroup, queues, f11) = unsafe {
            let props = instance.get_physical_device_properties(h);
            if props.api_version < API_VERSION {
                continue;
            }
            let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
            let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
            instance.get_physical_device_properties2(h, &mut p2);
            let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
            let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut f11);
            instance.get_physical_device_features2(h, &mut f2);
            (props, subgroup, instance.get_physical_device_queue_family_properties(h), f11)
        };
        // SAFETY: a query of a physical device of the live instance.
        let extensions = unsafe { instance.enumerate_device_extension_properties(h) }.unwrap_or_default();
        let ext = Extensions(&extensions);
        let coop_matrix_f16 = subgroup.subgroup_size == 32 && coop_matrix_f16(entry, instance, h, ext);
        let coop_matrix_bf16 = coop_matrix_f16 && coop_matrix_bf16(entry, instance, h, ext);
        let coopmat2 = crate::coopmat2::query(
            entry,
            instance,
            version,
            h,
            props.api_version,
            coop_matrix_f16 && ext.has(&[crate::coopmat2::EXTENSION]),
            coop_matrix_bf16,
        );
        let compute_units = sm_count(instance, h, ext);
        let executable_stats = executable_stats(instance, h, ext);
        let Some((family, q)) =
            queues.iter().enumerate().find(|(_, q)| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
        else {
            continue;
        };
        devices.push(PhysicalInfo {
            handle: h,
            name: props.device_name_as_c_str().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
            device_type: props.device_type,
            vendor_id: props.vendor_id,
            queue_family: family as u32,
            limits: props.limits,
            subgroup_size: subgroup.subgroup_size.max(1),
            subgroup_arithmetic: subgroup.supported_stages.contains(vk::ShaderStageFlags::COMPUTE)
                && subgroup
                    .supported_operations
                    .contains(vk::SubgroupFeatureFlags::BASIC | vk::SubgroupFeatureFlags::ARITHMETIC),
            storage_16bit: f11.storage_buffer16_bit_access == vk::TRUE,
            driver_version: props.driver_version,
            device_id: props.device_id,
            pipeline_cache_uuid: props.pipeline_cache_uuid,
            timestamp_bits: q.timestamp_valid_bits,
            compute_units,
            coop_matrix_f16,
            coop_matrix_bf16,
            executable_stats,
            coopmat2,
        });
    }
    devices.sort_by_key(|d| type_rank(d.device_type));
    if devices.is_empty() {
        return Err("no Vulkan 1.2 device with a compute queue".into());
    }
    // The one reader of the environment decides; a malformed variable is its error.
    let choice = tefl_core::policy::env().as_ref().map_err(|e| e.to_string())?.vulkan_device.clone();
    select(devices, choice.as_deref())
}

/// A device's extensions (enumerated once per device).
#[derive(Clone, Copy)]
struct Extensions<'a>(&'a [vk::ExtensionProperties]);

impl Extensions<'_> {
    /// Whether every extension of `names` is among them.
    fn has(self, names: &[&std::ffi::CStr]) -> bool {
        names.iter().all(|&name| self.0.iter().any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name)))
    }
}

/// Whether device `h` offers pipeline statistics (see [`PhysicalInfo::executable_stats`]).
fn executable_stats(instance: &ash::Instance, h: vk::PhysicalDevice, ext: Extensions<'_>) -> bool {
    if !ext.has(&[ash::khr::pipeline_executable_properties::NAME]) {
        return false;
    }
    let mut stats = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut stats);
    // SAFETY: the chained struct outlives the call; its extension is supported.
    unsafe { instance.get_physical_device_features2(h, &mut f2) };
    stats.pipeline_executable_info == vk::TRUE
}

/// The device extensions `gemm_coop.wgsl` needs.
pub(crate) const COOP_EXTENSIONS: [&std::ffi::CStr; 1] = [ash::khr::cooperative_matrix::NAME];

/// Whether device `h` offers what `gemm_coop.wgsl` needs (see [`PhysicalInfo::coop_matrix_f16`]).
fn coop_matrix_f16(entry: &ash::Entry, instance: &ash::Instance, h: vk::PhysicalDevice, ext: Extensions<'_>) -> bool {
    if !ext.has(&COOP_EXTENSIONS) {
        return false;
    }
    let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut coop).push_next(&mut f11).push_next(&mut f12);
    // SAFETY: the chained structs outlive the call; the extension of `coop` is supported.
    unsafe { instance.get_physical_device_features2(h, &mut f2) };
    let features = coop.cooperative_matrix == vk::TRUE
        && f11.storage_buffer16_bit_access == vk::TRUE
        && f11.uniform_and_storage_buffer16_bit_access == vk::TRUE
        && f12.shader_float16 == vk::TRUE
        && f12.vulkan_memory_model == vk::TRUE;
    if !features {
        return false;
    }
    let ext = ash::khr::cooperative_matrix::Instance::new(entry, instance);
    // SAFETY: the extension is supported by `h`; a plain query.
    let shapes = unsafe { ext.get_physical_device_cooperative_matrix_properties(h) }.unwrap_or_default();
    shapes.iter().any(|p| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
            && p.a_type == vk::ComponentTypeKHR::FLOAT16
            && p.b_type == vk::ComponentTypeKHR::FLOAT16
            && p.c_type == vk::ComponentTypeKHR::FLOAT32
            && p.result_type == vk::ComponentTypeKHR::FLOAT32
            && p.scope == vk::ScopeKHR::SUBGROUP
    })
}

/// The SM count of device `h` where it has `VK_NV_shader_sm_builtins`, else `None`.
fn sm_count(instance: &ash::Instance, h: vk::PhysicalDevice, ext: Extensions<'_>) -> Option<u32> {
    if !ext.has(&[ash::nv::shader_sm_builtins::NAME]) {
        return None;
    }
    let mut sm = vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV::default();
    let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut sm);
    // SAFETY: the chained struct outlives the call; its extension is supported.
    unsafe { instance.get_physical_device_properties2(h, &mut p2) };
    (sm.shader_sm_count > 0).then_some(sm.shader_sm_count)
}

/// `VK_KHR_shader_bfloat16`, which ash 0.38 predates.
pub(crate) const BFLOAT16_EXTENSION: &std::ffi::CStr = c"VK_KHR_shader_bfloat16";
/// `VkComponentTypeKHR` of bfloat16 (`VK_COMPONENT_TYPE_BFLOAT16_KHR`).
const COMPONENT_TYPE_BFLOAT16: vk::ComponentTypeKHR = vk::ComponentTypeKHR::from_raw(1_000_141_000);

/// `VkPhysicalDeviceShaderBfloat16FeaturesKHR` (VK_KHR_shader_bfloat16; not in ash 0.38).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bfloat16Features {
    s_type: vk::StructureType,
    p_next: *mut std::ffi::c_void,
    /// `shaderBFloat16Type`.
    pub shader_type: vk::Bool32,
    /// `shaderBFloat16DotProduct`.
    pub dot_product: vk::Bool32,
    /// `shaderBFloat16CooperativeMatrix`.
    pub cooperative_matrix: vk::Bool32,
}

impl Bfloat16Features {
    /// `VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR`.
    const S_TYPE: vk::StructureType = vk::StructureType::from_raw(1_000_141_000);

    /// The struct with the given features asked for (or all false, to be filled by a query).
    pub(crate) fn new(shader_type: bool, cooperative_matrix: bool) -> Self {
        Bfloat16Features {
            s_type: Self::S_TYPE,
            p_next: std::ptr::null_mut(),
            shader_type: shader_type.into(),
            dot_product: vk::FALSE,
            cooperative_matrix: cooperative_matrix.into(),
        }
    }
}

// SAFETY: the struct has the layout the Vulkan registry gives VkPhysicalDeviceShaderBfloat16-
// FeaturesKHR (sType, pNext first), which extends VkPhysicalDeviceFeatures2 and
// VkDeviceCreateInfo; ash only follows and relinks its pNext.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for Bfloat16Features {}
// SAFETY: as above.
unsafe impl vk::ExtendsDeviceCreateInfo for Bfloat16Features {}

/// Whether device `h` (which has what `coop_matrix_f16` checks) also multiplies bfloat16
/// cooperative matrices.
fn coop_matrix_bf16(entry: &ash::Entry, instance: &ash::Instance, h: vk::PhysicalDevice, ext: Extensions<'_>) -> bool {
    if !ext.has(&[BFLOAT16_EXTENSION]) {
        return false;
    }
    let mut bf16 = Bfloat16Features::new(false, false);
    let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut bf16);
    // SAFETY: the chained struct outlives the call; its extension is supported.
    unsafe { instance.get_physical_device_features2(h, &mut f2) };
    if bf16.shader_type != vk::TRUE || bf16.cooperative_matrix != vk::TRUE {
        return false;
    }
    let ext = ash::khr::cooperative_matrix::Instance::new(entry, instance);
    // SAFETY: the cooperative-matrix extension is supported by `h` (checked by the caller).
    let shapes = unsafe { ext.get_physical_device_cooperative_matrix_properties(h) }.unwrap_or_default();
    shapes.iter().any(|p| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
            && p.a_type == COMPONENT_TYPE_BFLOAT16
            && p.b_type == COMPONENT_TYPE_BFLOAT16
            && p.c_type == vk::ComponentTypeKHR::FLOAT32
            && p.result_type == vk::ComponentTypeKHR::FLOAT32
            && p.scope == vk::ScopeKHR::SUBGROUP
    })
}

/// Narrows `devices` to the one `choice` names (an index into the list, or a case-insensitive
/// part of a name); `None` keeps them all.
pub fn select(devices: Vec<PhysicalInfo>, choice: Option<&str>) -> Result<Vec<PhysicalInfo>, String> {
    let Some(choice) = choice.map(str::trim).filter(|c| !c.is_empty()) else { return Ok(devices) };
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    let picked = match choice.parse::<usize>() {
        Ok(i) => devices
            .get(i)
            .cloned()
            .ok_or_else(|| format!("{DEVICE_VAR}={choice}: there are {} Vulkan device(s): {names:?}", devices.len()))?,
        Err(_) => {
            let lower = choice.to_ascii_lowercase();
            devices.iter().find(|d| d.name.to_ascii_lowercase().contains(&lower)).cloned().ok_or_else(|| {
                format!("{DEVICE_VAR}={choice}: no Vulkan device is named like it; there are {names:?}")
            })?
        }
    };
    Ok(vec![picked])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, t: vk::PhysicalDeviceType) -> PhysicalInfo {
        PhysicalInfo {
            handle: vk::PhysicalDevice::null(),
            name: name.into(),
            device_type: t,
            vendor_id: 0x10DE,
            queue_family: 0,
            limits: vk::PhysicalDeviceLimits::default(),
            subgroup_size: 32,
            subgroup_arithmetic: true,
            storage_16bit: true,
            driver_version: 0,
            device_id: 0,
            pipeline_cache_uuid: [0; 16],
            timestamp_bits: 64,
            compute_units: Some(132),
            coop_matrix_f16: false,
            coop_matrix_bf16: false,
            executable_stats: false,
            coopmat2: None,
        }
    }

    #[test]
    fn the_device_variable_picks_by_index_or_name_and_names_itself_when_wrong() {
        let all = || {
            vec![
                dev("NVIDIA H100 80GB HBM3", vk::PhysicalDeviceType::DISCRETE_GPU),
                dev("llvmpipe (LLVM 15.0.6, 256 bits)", vk::PhysicalDeviceType::CPU),
            ]
        };
        assert_eq!(select(all(), None).unwrap().len(), 2);
        assert_eq!(select(all(), Some("1")).unwrap()[0].name, "llvmpipe (LLVM 15.0.6, 256 bits)");
        assert_eq!(select(all(), Some("h100")).unwrap()[0].name, "NVIDIA H100 80GB HBM3");
        let e = select(all(), Some("7")).unwrap_err();
        assert!(e.contains(DEVICE_VAR) && e.contains("2 Vulkan device"), "{e}");
        let e = select(all(), Some("radeon")).unwrap_err();
        assert!(e.contains("radeon") && e.contains("llvmpipe"), "{e}");
    }

    #[test]
    fn discrete_devices_come_first() {
        assert!(type_rank(vk::PhysicalDeviceType::DISCRETE_GPU) < type_rank(vk::PhysicalDeviceType::CPU));
        assert_eq!(dev("x", vk::PhysicalDeviceType::CPU).arch(), "nvidia");
    }
}
