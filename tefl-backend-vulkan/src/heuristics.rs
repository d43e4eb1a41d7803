//! The Vulkan backend's launch parameters: its tune configs (`tune_configs.toml`, then the
//! arch folder of the device's vendor, e.g. `lavapipe/`), layered over the GPU defaults of
//! `tefl-gpu`, and the choice among the workgroup sizes `build.rs` compiled.

use tefl_core::tuning::TuneConfig;
use tefl_core::{DType, Device, Result};
use tefl_gpu::tune::{TuneConfigs, TuneFile, int};

use crate::coopmat2::{FlexShape, Tile};

/// The tune configs of the Vulkan backend.
pub static TUNE_CONFIGS: TuneConfigs = TuneConfigs::new(
    crate::vendor_info,
    TuneFile { path: "tefl-backend-vulkan/src/tune_configs.toml", text: include_str!("tune_configs.toml") },
    &[(
        "lavapipe",
        TuneFile {
            path: "tefl-backend-vulkan/src/lavapipe/tune_configs.toml",
            text: include_str!("lavapipe/tune_configs.toml"),
        },
    )],
);

/// The tile of the workgroup-scope GEMM (`build/cm2.rs`) a `gemm_cm2` candidate describes
/// (`block_m`, `block_n`, `block_k`; 128, 128, 32 where unset) on a device offering `shape`:
/// rounded up to its granularities, `None` past its largest dimension.
pub fn cm2_tile_of(c: &TuneConfig, shape: &FlexShape, max_dimension: u32) -> Option<Tile> {
    let (bm, bn, bk) = (int(c, "block_m", 128), int(c, "block_n", 128), int(c, "block_k", 32));
    Tile::fit(bm, bn, bk, shape, max_dimension)
}

/// The shaders `default.vulkan` runs for `op` on `device` (explain's "kernel:" line), for the
/// ops where that depends on the device: GEMM and attention, on cooperative matrices or the
/// portable kernels. Opens the device (its enabled extensions decide); `None` for other ops
/// and impls, or a device that does not open.
pub fn kernel_choice(impl_id: &str, op: &str, device: Device, dtype: DType) -> Option<String> {
    if impl_id != crate::IMPL_ID {
        return None;
    }
    let gpu = crate::gpu::gpu(device).ok()?;
    let coop = match dtype {
        DType::F16 => gpu.coop,
        DType::BF16 => gpu.coop_bf16,
        _ => false,
    };
    let workgroup_scope = gpu.coopmat2.as_ref().is_some_and(|c| match dtype {
        DType::F16 => c.f16.is_some(),
        DType::BF16 => c.bf16.is_some(),
        _ => false,
    });
    let portable_gemm = "gemm (portable shared-memory tiles, f32 accumulation)";
    Some(match op {
        "generic_gemm" if coop && workgroup_scope => format!(
            "gemm_cm2 (workgroup-scope cooperative matrices, VK_NV_cooperative_matrix2, TEFL_VULKAN_COOPMAT=2) where \
             k (and m or n where contiguous) are multiples of 8, else {portable_gemm}; then its epilogue stage unless \
             the product writes D"
        ),
        "generic_gemm" if coop => format!(
            "gemm_coop (subgroup-scope cooperative matrices, VK_KHR_cooperative_matrix) where k (and m or n where \
             contiguous) are multiples of 8, else {portable_gemm}; then its epilogue stage unless the product writes D"
        ),
        "generic_gemm" => format!("{portable_gemm}, then its epilogue stage unless the product writes D"),
        "fused_attn_fwd" if coop => {
            "attn_fwd_coop (cooperative matrices) for head dim 64 or 128, attn_fwd (one query row an invocation) \
             otherwise"
                .to_string()
        }
        "fused_attn_fwd" => "attn_fwd (one query row an invocation)".to_string(),
        "fused_attn_bwd" if coop => {
            "attn_delta, then attn_dq_coop and attn_dkdv_coop (cooperative matrices) for head dim 64 or 128, \
             attn_dq and attn_dkdv otherwise"
                .to_string()
        }
        "fused_attn_bwd" => "attn_delta, attn_dq, attn_dkdv (one row an invocation)".to_string(),
        _ => return None,
    })
}

/// The workgroup sizes every elementwise shader variant is built with (`build.rs`).
pub const WORKGROUPS: [u32; 3] = [64, 128, 256];

/// The built workgroup size nearest the configured one (the largest not above it).
pub fn nearest_workgroup(block: u32) -> u32 {
    WORKGROUPS.iter().copied().filter(|&w| w <= block).max().unwrap_or(WORKGROUPS[0])
}

/// The workgroup size of the elementwise shaders on `device`.
pub fn elementwise_workgroup(device: Device) -> Result<u32> {
    let info = tefl_core::device::info(device)?;
    let table = TUNE_CONFIGS.table(&info.arch);
    let block = tefl_gpu::tune::elementwise(&table).block;
    Ok(nearest_workgroup(block.min(info.max_threads_per_block.max(WORKGROUPS[0]))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the Vulkan device this machine has (lavapipe in CI), explain's kernel line names the
    /// GEMM and attention shaders the device's extensions allow, and nothing for other impls
    /// and ops.
    #[test]
    fn the_kernel_choice_names_the_shaders_the_device_allows() {
        let device = Device::new(tefl_core::DeviceKind::VULKAN, 0);
        assert_eq!(kernel_choice("vendor.nvidia", "generic_gemm", device, DType::BF16), None);
        if crate::availability().is_err() {
            return;
        }
        assert_eq!(kernel_choice(crate::IMPL_ID, "rmsnorm_fwd", device, DType::BF16), None);
        let gpu = crate::gpu::gpu(device).unwrap();
        let gemm = kernel_choice(crate::IMPL_ID, "generic_gemm", device, DType::F16).unwrap();
        let fwd = kernel_choice(crate::IMPL_ID, "fused_attn_fwd", device, DType::F16).unwrap();
        assert_eq!(gemm.starts_with("gemm_coop"), gpu.coop && gpu.coopmat2.is_none(), "{gemm}");
        assert_eq!(fwd.starts_with("attn_fwd_coop"), gpu.coop, "{fwd}");
        let f32_gemm = kernel_choice(crate::IMPL_ID, "generic_gemm", device, DType::F32).unwrap();
        assert!(f32_gemm.starts_with("gemm (portable"), "{f32_gemm}");
    }

    #[test]
    fn configured_blocks_map_to_built_workgroups() {
        assert_eq!(nearest_workgroup(256), 256);
        assert_eq!(nearest_workgroup(200), 128);
        assert_eq!(nearest_workgroup(1024), 256);
        assert_eq!(nearest_workgroup(8), 64);
        for arch in ["nvidia", "lavapipe", "amd"] {
            let block = tefl_gpu::tune::elementwise(&TUNE_CONFIGS.table(arch)).block;
            assert!(WORKGROUPS.contains(&block), "{arch}: block {block} is not a built workgroup size");
        }
        assert_eq!(tefl_gpu::tune::elementwise(&TUNE_CONFIGS.table("lavapipe")).block, 64);
    }
}
