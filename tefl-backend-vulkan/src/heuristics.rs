//! The Vulkan backend's launch parameters: its tune configs (`tune_configs.toml`, then the
//! arch folder of the device's vendor, e.g. `lavapipe/`), layered over the GPU defaults of
//! `tefl-gpu`, and the choice among the workgroup sizes `build.rs` compiled.

use tefl_core::tuning::TuneConfig;
use tefl_core::{Device, Result};
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
