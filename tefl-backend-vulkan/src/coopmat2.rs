//! NVIDIA's workgroup-scope cooperative matrices (`VK_NV_cooperative_matrix2`, which ash 0.38
//! predates): whether a device offers what `build/cm2.rs`'s GEMM needs, and the shapes it
//! offers. That GEMM multiplies BM×BK by BK×BN matrices held by a whole workgroup and leaves
//! the staging through shared memory to the driver; its dimensions must be multiples of the
//! device's granularities and its workgroup exactly the invocations the device lists for them.

use std::ffi::CStr;

use ash::vk;

/// The device extension.
pub(crate) const EXTENSION: &CStr = c"VK_NV_cooperative_matrix2";

/// `VkPhysicalDeviceCooperativeMatrix2FeaturesNV`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Features {
    s_type: vk::StructureType,
    p_next: *mut std::ffi::c_void,
    workgroup_scope: vk::Bool32,
    flexible_dimensions: vk::Bool32,
    reductions: vk::Bool32,
    conversions: vk::Bool32,
    per_element_operations: vk::Bool32,
    tensor_addressing: vk::Bool32,
    block_loads: vk::Bool32,
}

impl Features {
    /// `VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV`.
    const S_TYPE: vk::StructureType = vk::StructureType::from_raw(1_000_593_000);

    /// The features the GEMM uses (workgroup scope, flexible dimensions, tensor addressing)
    /// asked for when `on`, or all false to be filled by a query.
    pub(crate) fn new(on: bool) -> Self {
        Features {
            s_type: Self::S_TYPE,
            p_next: std::ptr::null_mut(),
            workgroup_scope: on.into(),
            flexible_dimensions: on.into(),
            reductions: vk::FALSE,
            conversions: vk::FALSE,
            per_element_operations: vk::FALSE,
            tensor_addressing: on.into(),
            block_loads: vk::FALSE,
        }
    }

    fn has_gemm_features(&self) -> bool {
        self.workgroup_scope == vk::TRUE && self.flexible_dimensions == vk::TRUE && self.tensor_addressing == vk::TRUE
    }
}

// SAFETY: the struct has the registry's layout of VkPhysicalDeviceCooperativeMatrix2FeaturesNV
// (sType, pNext first), which extends VkPhysicalDeviceFeatures2 and VkDeviceCreateInfo; ash
// only follows and relinks its pNext.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for Features {}
// SAFETY: as above.
unsafe impl vk::ExtendsDeviceCreateInfo for Features {}

/// `VkPhysicalDeviceCooperativeMatrix2PropertiesNV`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Properties {
    s_type: vk::StructureType,
    p_next: *mut std::ffi::c_void,
    workgroup_scope_max_workgroup_size: u32,
    flexible_dimensions_max_dimension: u32,
    workgroup_scope_reserved_shared_memory: u32,
}

// SAFETY: the registry's layout of VkPhysicalDeviceCooperativeMatrix2PropertiesNV, which extends
// VkPhysicalDeviceProperties2.
unsafe impl vk::ExtendsPhysicalDeviceProperties2 for Properties {}

/// `VkCooperativeMatrixFlexibleDimensionsPropertiesNV`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct FlexibleDimensions {
    s_type: vk::StructureType,
    p_next: *mut std::ffi::c_void,
    m_granularity: u32,
    n_granularity: u32,
    k_granularity: u32,
    a_type: vk::ComponentTypeKHR,
    b_type: vk::ComponentTypeKHR,
    c_type: vk::ComponentTypeKHR,
    result_type: vk::ComponentTypeKHR,
    saturating_accumulation: vk::Bool32,
    scope: vk::ScopeKHR,
    workgroup_invocations: u32,
}

/// `vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV`.
type GetFlexibleDimensions =
    unsafe extern "system" fn(vk::PhysicalDevice, *mut u32, *mut FlexibleDimensions) -> vk::Result;

/// One workgroup-scope shape a device multiplies: 16-bit inputs, f32 accumulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlexShape {
    /// BM must be a multiple of this.
    pub m_granularity: u32,
    /// BN must be a multiple of this.
    pub n_granularity: u32,
    /// BK must be a multiple of this.
    pub k_granularity: u32,
    /// The workgroup size these matrices need.
    pub invocations: u32,
}

/// What a device offers the workgroup-scope GEMM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coopmat2 {
    /// The f16 × f16 → f32 shape (`None`: not offered).
    pub f16: Option<FlexShape>,
    /// The bf16 × bf16 → f32 shape (`None`: not offered, or no bf16 cooperative matrices).
    pub bf16: Option<FlexShape>,
    /// The largest matrix dimension.
    pub max_dimension: u32,
    /// Shared memory the driver keeps for its own staging, out of the workgroup's.
    pub reserved_shared_memory: u32,
}

/// `VK_COMPONENT_TYPE_BFLOAT16_KHR`.
const BFLOAT16: vk::ComponentTypeKHR = vk::ComponentTypeKHR::from_raw(1_000_141_000);

/// What device `h` offers, or `None` where it lacks any of: Vulkan 1.3 on device and instance
/// (the modules are SPIR-V 1.6), the extension, workgroup scope, flexible dimensions, tensor
/// addressing, `maintenance4` (the workgroup size is a specialization constant) and an f16
/// workgroup-scope shape. `has_extension` and `bf16` come from the caller's checks
/// (`VK_KHR_cooperative_matrix` and bfloat16 matrices are needed too).
pub(crate) fn query(
    entry: &ash::Entry,
    instance: &ash::Instance,
    instance_version: u32,
    h: vk::PhysicalDevice,
    device_version: u32,
    has_extension: bool,
    bf16: bool,
) -> Option<Coopmat2> {
    if !has_extension || instance_version < vk::API_VERSION_1_3 || device_version < vk::API_VERSION_1_3 {
        return None;
    }
    let mut features = Features::new(false);
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
    let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut features).push_next(&mut f13);
    // SAFETY: the chained structs outlive the call; the extension is supported and both
    // versions are 1.3 or later.
    unsafe { instance.get_physical_device_features2(h, &mut f2) };
    if !features.has_gemm_features() || f13.maintenance4 != vk::TRUE {
        return None;
    }
    let mut props = Properties {
        s_type: vk::StructureType::from_raw(1_000_593_002),
        p_next: std::ptr::null_mut(),
        workgroup_scope_max_workgroup_size: 0,
        flexible_dimensions_max_dimension: 0,
        workgroup_scope_reserved_shared_memory: 0,
    };
    let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut props);
    // SAFETY: as above.
    unsafe { instance.get_physical_device_properties2(h, &mut p2) };
    let name = c"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV";
    // SAFETY: a lookup by name on the live instance.
    let f = unsafe { entry.get_instance_proc_addr(instance.handle(), name.as_ptr()) }?;
    // SAFETY: the loader returned this entry point for that name, whose signature is
    // GetFlexibleDimensions in the Vulkan registry.
    let get: GetFlexibleDimensions =
        unsafe { std::mem::transmute::<unsafe extern "system" fn(), GetFlexibleDimensions>(f) };
    let mut count = 0u32;
    // SAFETY: the count query (null array) of a supported extension's function.
    if unsafe { get(h, &mut count, std::ptr::null_mut()) } != vk::Result::SUCCESS || count == 0 {
        return None;
    }
    let blank = FlexibleDimensions {
        s_type: vk::StructureType::from_raw(1_000_593_001),
        p_next: std::ptr::null_mut(),
        m_granularity: 0,
        n_granularity: 0,
        k_granularity: 0,
        a_type: vk::ComponentTypeKHR::FLOAT16,
        b_type: vk::ComponentTypeKHR::FLOAT16,
        c_type: vk::ComponentTypeKHR::FLOAT16,
        result_type: vk::ComponentTypeKHR::FLOAT16,
        saturating_accumulation: vk::FALSE,
        scope: vk::ScopeKHR::SUBGROUP,
        workgroup_invocations: 0,
    };
    let mut shapes = vec![blank; count as usize];
    // SAFETY: `shapes` holds `count` initialised structs with their sType set.
    let got = unsafe { get(h, &mut count, shapes.as_mut_ptr()) };
    if got != vk::Result::SUCCESS && got != vk::Result::INCOMPLETE {
        return None;
    }
    shapes.truncate(count as usize);
    for s in &shapes {
        tracing::debug!(
            target: "TE-FL",
            "flexible cooperative-matrix shape: {}x{}x{} granularity, {:?}x{:?} -> {:?}/{:?}, {:?}, {} invocations",
            s.m_granularity,
            s.n_granularity,
            s.k_granularity,
            s.a_type,
            s.b_type,
            s.c_type,
            s.result_type,
            s.scope,
            s.workgroup_invocations
        );
    }
    let pick = |input: vk::ComponentTypeKHR| {
        shapes
            .iter()
            .filter(|s| {
                s.a_type == input
                    && s.b_type == input
                    && s.c_type == vk::ComponentTypeKHR::FLOAT32
                    && s.result_type == vk::ComponentTypeKHR::FLOAT32
                    && s.scope == vk::ScopeKHR::WORKGROUP
                    && s.saturating_accumulation == vk::FALSE
                    && s.workgroup_invocations > 0
                    && [s.m_granularity, s.n_granularity, s.k_granularity].iter().all(|&g| g > 0)
            })
            .map(|s| FlexShape {
                m_granularity: s.m_granularity,
                n_granularity: s.n_granularity,
                k_granularity: s.k_granularity,
                invocations: s.workgroup_invocations,
            })
            // The most invocations (more warps to hide the driver's staging), within the limit.
            .filter(|s| {
                let max = props.workgroup_scope_max_workgroup_size;
                max == 0 || s.invocations <= max
            })
            .max_by_key(|s| s.invocations)
    };
    let f16 = pick(vk::ComponentTypeKHR::FLOAT16)?;
    Some(Coopmat2 {
        f16: Some(f16),
        bf16: if bf16 { pick(BFLOAT16) } else { None },
        max_dimension: props.flexible_dimensions_max_dimension,
        reserved_shared_memory: props.workgroup_scope_reserved_shared_memory,
    })
}

/// The tile a workgroup computes: BM×BN of the product in steps of BK, from the configured
/// sizes rounded up to the device's granularities and capped at its largest dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    /// Rows of the product per workgroup.
    pub bm: u32,
    /// Columns of the product per workgroup.
    pub bn: u32,
    /// k per step.
    pub bk: u32,
}

impl Tile {
    /// The tile for configured sizes on a shape with `max_dimension` (0: no cap given).
    pub fn fit(bm: u32, bn: u32, bk: u32, shape: &FlexShape, max_dimension: u32) -> Option<Tile> {
        let fit = |want: u32, g: u32| {
            let v = want.max(1).div_ceil(g) * g;
            (max_dimension == 0 || v <= max_dimension).then_some(v)
        };
        Some(Tile {
            bm: fit(bm, shape.m_granularity)?,
            bn: fit(bn, shape.n_granularity)?,
            bk: fit(bk, shape.k_granularity)?,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The instructions of a module: (opcode, operands).
    pub(crate) fn instructions(words: &[u32]) -> Vec<(u32, Vec<u32>)> {
        let mut out = Vec::new();
        let mut at = 5;
        while at < words.len() {
            let count = (words[at] >> 16) as usize;
            assert!(count > 0 && at + count <= words.len(), "malformed at word {at}");
            out.push((words[at] & 0xFFFF, words[at + 1..at + count].to_vec()));
            at += count;
        }
        out
    }

    /// Every assembled module is SPIR-V 1.6 with a specialized workgroup size, workgroup-scope
    /// matrices only, two tensor loads (through a transposing view exactly for the transposed
    /// operands) and one tensor store; with `TEFL_SPIRV_VAL` naming a `spirv-val` that knows
    /// SPV_NV_cooperative_matrix2 (SPIRV-Tools 2025.1 does; it predates bfloat16, so only the
    /// f16 modules), each passes it too.
    #[test]
    fn the_assembled_gemm_modules_are_well_formed() {
        let validator = std::env::var("TEFL_SPIRV_VAL").ok().filter(|v| !v.is_empty());
        let mut seen = 0;
        for (name, bytes) in crate::gpu::SHADERS.iter().filter(|(n, _)| n.starts_with("gemm_cm2.")) {
            seen += 1;
            let words: Vec<u32> = bytes.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            assert_eq!((words[0], words[1]), (0x0723_0203, 0x0001_0600), "{name}: not SPIR-V 1.6");
            let ins = instructions(&words);
            let constants: std::collections::HashMap<u32, u32> = ins
                .iter()
                .filter(|(op, o)| *op == spirv::Op::Constant as u32 && o.len() == 3)
                .map(|(_, o)| (o[1], o[2]))
                .collect();
            let count = |op: spirv::Op| ins.iter().filter(|(o, _)| *o == op as u32).count();
            let local_size_id = ins.iter().any(|(op, o)| {
                *op == spirv::Op::ExecutionModeId as u32 && o[1] == spirv::ExecutionMode::LocalSizeId as u32
            });
            assert!(local_size_id, "{name}: no LocalSizeId");
            let scopes: Vec<u32> = ins
                .iter()
                .filter(|(op, _)| *op == spirv::Op::TypeCooperativeMatrixKHR as u32)
                .map(|(_, o)| constants[&o[2]])
                .collect();
            assert!(scopes.len() >= 3 && scopes.iter().all(|&s| s == 2), "{name}: matrix scopes {scopes:?}");
            let loads: Vec<&Vec<u32>> = ins
                .iter()
                .filter(|(op, _)| *op == spirv::Op::CooperativeMatrixLoadTensorNV as u32)
                .map(|(_, o)| o)
                .collect();
            // The first step's tiles before the loop, the next step's in it.
            assert_eq!(loads.len(), 4, "{name}");
            let transposed = [name.contains(".ta=1."), name.contains(".tb=1.")];
            for (load, t) in loads.iter().zip(transposed.iter().cycle()) {
                let t = *t;
                // Tensor addressing operands: 1 = TensorView (followed by the view), 0 = none.
                assert_eq!(load[6] == 1, t, "{name}: view use {load:?}");
            }
            assert_eq!(count(spirv::Op::CooperativeMatrixStoreTensorNV), 1, "{name}");
            assert_eq!(count(spirv::Op::CooperativeMatrixMulAddKHR), 1, "{name}");
            if let Some(val) = validator.as_deref().filter(|_| !name.contains("bf16")) {
                let file = std::env::temp_dir().join(format!("tefl-{}-{name}.spv", std::process::id()));
                std::fs::write(&file, bytes).unwrap();
                let out = std::process::Command::new(val).arg("--target-env").arg("vulkan1.3").arg(&file).output();
                let _ = std::fs::remove_file(&file);
                let out = out.unwrap_or_else(|e| panic!("TEFL_SPIRV_VAL={val}: {e}"));
                assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        assert_eq!(seen, 24);
    }

    #[test]
    fn tiles_round_up_to_the_granularity_and_respect_the_largest_dimension() {
        let shape = FlexShape { m_granularity: 16, n_granularity: 16, k_granularity: 16, invocations: 256 };
        assert_eq!(Tile::fit(128, 256, 32, &shape, 256), Some(Tile { bm: 128, bn: 256, bk: 32 }));
        assert_eq!(Tile::fit(100, 24, 8, &shape, 256), Some(Tile { bm: 112, bn: 32, bk: 16 }));
        assert_eq!(Tile::fit(128, 512, 32, &shape, 256), None);
        assert_eq!(Tile::fit(128, 512, 32, &shape, 0), Some(Tile { bm: 128, bn: 512, bk: 32 }));
    }
}
