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
    &[
        (
            "lavapipe",
            TuneFile {
                path: "tefl-backend-vulkan/src/lavapipe/tune_configs.toml",
                text: include_str!("lavapipe/tune_configs.toml"),
            },
        ),
        (
            "nvidia",
            TuneFile {
                path: "tefl-backend-vulkan/src/nvidia/tune_configs.toml",
                text: include_str!("nvidia/tune_configs.toml"),
            },
        ),
    ],
);

/// The tile of the workgroup-scope GEMM (`build/cm2.rs`) a `gemm_cm2` candidate describes
/// (`block_m`, `block_n`, `block_k`; 128, 128, 32 where unset) on a device offering `shape`:
/// rounded up to its granularities, `None` past its largest dimension.
pub fn cm2_tile_of(c: &TuneConfig, shape: &FlexShape, max_dimension: u32) -> Option<Tile> {
    let (bm, bn, bk) = (int(c, "block_m", 128), int(c, "block_n", 128), int(c, "block_k", 32));
    Tile::fit(bm, bn, bk, shape, max_dimension)
}

/// The tile of the subgroup-scope cooperative-matrix GEMM (`shaders/gemm_coop.wgsl`): its
/// subgroups along m and n (each computes 64×64 of the product) and its raster group (tile
/// rows taken column by column, so that the workgroups running at once share operand rows and
/// columns in the L2 cache; 1 = row order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopTile {
    /// Subgroups along m (the tile has 64 times as many rows).
    pub sgm: u32,
    /// Subgroups along n.
    pub sgn: u32,
    /// Tile rows per raster group.
    pub group_m: u32,
}

/// The subgroup grids `build.rs` compiles `gemm_coop` for.
const COOP_GRIDS: [(u32, u32); 3] = [(2, 2), (2, 4), (4, 2)];
/// The raster groups `build.rs` compiles `gemm_coop` for.
const COOP_RASTER_GROUPS: [u32; 2] = [1, 8];

impl CoopTile {
    /// Rows of the product per workgroup.
    pub fn rows(&self) -> u32 {
        64 * self.sgm
    }

    /// Columns of the product per workgroup.
    pub fn cols(&self) -> u32 {
        64 * self.sgn
    }

    /// Invocations per workgroup (32-lane subgroups).
    pub fn invocations(&self) -> u32 {
        32 * self.sgm * self.sgn
    }

    /// Bytes of shared memory the shader declares for this tile (`u32::MAX` for a tile that was
    /// not built): the A and B tiles of one k step of 32 (16-byte units, in the larger of their
    /// two orientations, so the same for every transpose pair and dtype) and a 16×16 f32 staging
    /// tile per subgroup, as naga measured the module in build.rs.
    pub fn shared_bytes(&self) -> u32 {
        crate::gpu::declared_shared_bytes(&self.variant("f16", false, false, "w")).unwrap_or(u32::MAX)
    }

    /// The shader variant's name for dtype `tx`, transposes and output `out` (`w`: the f32
    /// product W; `f16` or `bf16`: D itself, a plain product).
    pub fn variant(&self, tx: &str, transa: bool, transb: bool, out: &str) -> String {
        format!(
            "gemm_coop.tx={tx}.ta={}.tb={}.sgm={}.sgn={}.gm={}.out={out}",
            u8::from(transa),
            u8::from(transb),
            self.sgm,
            self.sgn,
            self.group_m
        )
    }
}

/// The tile a `gemm_coop` candidate describes (`block_m`, `block_n`: 128 or 256 each, not both
/// 256; `group_m` 1 or 8; 128, 128, 8 where unset), where it was built and fits a device with
/// `max_shared` bytes of shared memory and `max_invocations` per workgroup.
pub fn coop_tile_of(c: &TuneConfig, max_shared: u32, max_invocations: u32) -> Option<CoopTile> {
    let (bm, bn) = (int(c, "block_m", 128), int(c, "block_n", 128));
    let tile = CoopTile { sgm: bm / 64, sgn: bn / 64, group_m: int(c, "group_m", 8) };
    let built = bm % 64 == 0
        && bn % 64 == 0
        && COOP_GRIDS.contains(&(tile.sgm, tile.sgn))
        && COOP_RASTER_GROUPS.contains(&tile.group_m);
    (built && tile.shared_bytes() <= max_shared && tile.invocations() <= max_invocations).then_some(tile)
}

/// The tile the subgroup-scope GEMM takes on a device of `arch` without autotuning: the first
/// `gemm_coop` tune config that fits, else 128×128 in raster groups of 8 (24 KB of shared memory
/// and 128 invocations: within what Vulkan requires of every device).
pub fn heuristic_coop_tile(arch: &str, max_shared: u32, max_invocations: u32) -> CoopTile {
    TUNE_CONFIGS
        .table(arch)
        .configs("gemm_coop")
        .iter()
        .find_map(|c| coop_tile_of(c, max_shared, max_invocations))
        .unwrap_or(CoopTile { sgm: 2, sgn: 2, group_m: 8 })
}

/// The variable that pins the subgroup-scope GEMM's tile: `MxN` or `MxN/G` (block_m, block_n,
/// group_m as in the `gemm_coop` tune configs; G = 8 where left out). Unset or empty = the tune
/// configs choose.
pub const GEMM_TILE_VAR: &str = "TEFL_VULKAN_GEMM_TILE";

/// The `gemm_coop` candidate `TEFL_VULKAN_GEMM_TILE` pins, given as (M, N, G) by the
/// environment's reader, which checked its form (`None` when unset): a tile that was not built,
/// or does not fit a device with `max_shared` bytes of shared memory and `max_invocations` per
/// workgroup, is an error naming the variable.
pub fn pinned_coop_tile(
    pinned: Option<(u32, u32, u32)>,
    max_shared: u32,
    max_invocations: u32,
) -> Result<Option<CoopTile>> {
    let Some((bm, bn, group)) = pinned else { return Ok(None) };
    let token = format!("{bm}x{bn}/{group}");
    let bad = |why: &str| tefl_core::Error::config(GEMM_TILE_VAR, &token, why);
    let mut c = TuneConfig::new();
    c.insert("block_m".into(), tefl_core::tuning::TuneValue::Int(bm.into()));
    c.insert("block_n".into(), tefl_core::tuning::TuneValue::Int(bn.into()));
    c.insert("group_m".into(), tefl_core::tuning::TuneValue::Int(group.into()));
    let tile = coop_tile_of(&c, u32::MAX, u32::MAX)
        .ok_or_else(|| bad("not a built tile (M and N 128 or 256, not both 256; G 1 or 8)"))?;
    coop_tile_of(&c, max_shared, max_invocations).map(Some).ok_or_else(|| {
        bad(&format!(
            "does not fit this device: it needs {} bytes of shared memory and {} invocations per \
             workgroup, the device allows {max_shared} bytes and {max_invocations} invocations",
            tile.shared_bytes(),
            tile.invocations()
        ))
    })
}

/// What a device allows a `gemm_coop` tile: bytes of shared memory and invocations per
/// workgroup.
pub fn coop_limits(physical: &crate::context::PhysicalInfo) -> (u32, u32) {
    (physical.limits.max_compute_shared_memory_size, physical.limits.max_compute_work_group_invocations)
}

/// The tile the subgroup-scope GEMM takes on `physical` before any autotuning, and whether
/// `TEFL_VULKAN_GEMM_TILE` pinned it (else it is [`heuristic_coop_tile`]'s); a bad value of
/// the variable is its error.
pub fn coop_tile(physical: &crate::context::PhysicalInfo) -> Result<(CoopTile, bool)> {
    let (shared, invocations) = coop_limits(physical);
    let pinned = tefl_core::policy::env().as_ref().map_err(Clone::clone)?.vulkan_gemm_tile;
    Ok(match pinned_coop_tile(pinned, shared, invocations)? {
        Some(t) => (t, true),
        None => (heuristic_coop_tile(&physical.arch(), shared, invocations), false),
    })
}

/// The shaders `default.vulkan` runs for `op` on `device` (explain's "kernel:" line), for the
/// ops where that depends on the device: GEMM and attention, on cooperative matrices or the
/// portable kernels. Opens the device (its enabled extensions decide); `None` for other ops
/// and impls. Where the device does not open (a pinned `TEFL_VULKAN_GEMM_TILE` that does not
/// fit it, say), every op's line is the reason, which every call there returns too.
pub fn kernel_choice(impl_id: &str, op: &str, device: Device, dtype: DType) -> Option<String> {
    if impl_id != crate::IMPL_ID {
        return None;
    }
    let gpu = match crate::gpu::gpu(device) {
        Ok(gpu) => gpu,
        Err(e) => return Some(format!("none: {e}")),
    };
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
        "generic_gemm" if coop => {
            let tile = match coop_tile(&gpu.physical) {
                Ok((t, pinned)) => {
                    let from = if pinned {
                        GEMM_TILE_VAR
                    } else {
                        "the first gemm_coop tune config that fits; TEFL_AUTOTUNE=1 times them per shape"
                    };
                    format!("{}x{} tiles in raster groups of {} ({from})", t.rows(), t.cols(), t.group_m)
                }
                Err(e) => format!("no tile: {e}"),
            };
            format!(
                "gemm_coop (subgroup-scope cooperative matrices, VK_KHR_cooperative_matrix; {tile}) where k (and m or \
                 n where contiguous) are multiples of 8, else {portable_gemm}; then its epilogue stage unless the \
                 product writes D"
            )
        }
        "generic_gemm" => format!("{portable_gemm}, then its epilogue stage unless the product writes D"),
        "fused_attn_fwd" if coop => {
            "attn_fwd_coop (cooperative matrices) for head dim 64 or 128 where the device's shared memory holds it, \
             attn_fwd (one query row an invocation) otherwise"
                .to_string()
        }
        "fused_attn_fwd" => "attn_fwd (one query row an invocation)".to_string(),
        "fused_attn_bwd" if coop => {
            "attn_delta, then attn_dq_coop and attn_dkdv_coop (cooperative matrices) for head dim 64 or 128 where \
             the device's shared memory holds both, attn_dq and attn_dkdv otherwise"
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
    use tefl_core::tuning::TuneValue;

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

    /// The coop tiles are the ones build.rs compiles, sized as the shader declares them, and a
    /// device with too little shared memory or too few invocations gets none of the large ones.
    #[test]
    fn coop_tiles_are_built_ones_that_fit_the_device() {
        let cfg = |bm: i64, bn: i64, gm: i64| {
            let mut c = TuneConfig::new();
            c.insert("block_m".into(), TuneValue::Int(bm));
            c.insert("block_n".into(), TuneValue::Int(bn));
            c.insert("group_m".into(), TuneValue::Int(gm));
            c
        };
        let square = coop_tile_of(&TuneConfig::new(), 48 * 1024, 1024).unwrap();
        assert_eq!(square, CoopTile { sgm: 2, sgn: 2, group_m: 8 });
        // 128 rows of 5 units and 32 rows of 17, twice, and four 1 KB staging tiles.
        assert_eq!(square.shared_bytes(), 2 * 16 * 640 + 4096);
        assert_eq!(square.variant("bf16", true, false, "f16"), "gemm_coop.tx=bf16.ta=1.tb=0.sgm=2.sgn=2.gm=8.out=f16");
        let wide = coop_tile_of(&cfg(128, 256, 1), 48 * 1024, 1024).unwrap();
        assert_eq!((wide.rows(), wide.cols(), wide.invocations()), (128, 256, 256));
        assert_eq!(wide.shared_bytes(), 16 * (640 + 1280) + 8192);
        assert_eq!(coop_tile_of(&cfg(128, 256, 1), 32 * 1024, 1024), None);
        assert_eq!(coop_tile_of(&cfg(256, 128, 8), 48 * 1024, 128), None);
        assert_eq!(coop_tile_of(&cfg(256, 256, 8), 1 << 20, 1024), None);
        assert_eq!(coop_tile_of(&cfg(128, 128, 4), 48 * 1024, 1024), None);
        assert_eq!(coop_tile_of(&cfg(96, 128, 8), 48 * 1024, 1024), None);
        // The first config that fits: 128x256 in raster groups of 8 on NVIDIA (the H200's
        // fastest), 128x128 on a device with 32 KB of shared memory, on other vendors (the
        // generic list) and on a device too small for every config.
        let square = CoopTile { sgm: 2, sgn: 2, group_m: 8 };
        assert_eq!(heuristic_coop_tile("nvidia", 48 * 1024, 1024), CoopTile { sgm: 2, sgn: 4, group_m: 8 });
        assert_eq!(heuristic_coop_tile("nvidia", 32 * 1024, 1024), square);
        assert_eq!(heuristic_coop_tile("nvidia", 48 * 1024, 128), square);
        assert_eq!(heuristic_coop_tile("amd", 48 * 1024, 1024), square);
        assert_eq!(heuristic_coop_tile("nvidia", 16 * 1024, 128), square);
        for c in TUNE_CONFIGS.table("nvidia").configs("gemm_coop") {
            assert!(coop_tile_of(c, 48 * 1024, 1024).is_some(), "{c:?} is not a built tile that fits the H100");
        }
    }

    /// Every tile the host may pick has its shader variants, for both dtypes, all four
    /// transpose pairs and every output (build.rs keeps its own list of grids and raster
    /// groups).
    #[test]
    fn every_coop_tile_has_its_shader_variants() {
        for (sgm, sgn) in COOP_GRIDS {
            for group_m in COOP_RASTER_GROUPS {
                let t = CoopTile { sgm, sgn, group_m };
                for tx in ["f16", "bf16"] {
                    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                        for out in ["w", "f16", "bf16"] {
                            let name = t.variant(tx, ta, tb, out);
                            assert!(crate::gpu::SHADERS.iter().any(|(n, _)| *n == name), "{name} was not built");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_tile_knob_pins_a_built_tile_and_names_itself_otherwise() {
        assert_eq!(pinned_coop_tile(None, 48 * 1024, 1024).unwrap(), None);
        let t = pinned_coop_tile(Some((128, 256, 8)), 48 * 1024, 1024).unwrap().unwrap();
        assert_eq!(t, CoopTile { sgm: 2, sgn: 4, group_m: 8 });
        let t = pinned_coop_tile(Some((256, 128, 1)), 48 * 1024, 1024).unwrap().unwrap();
        assert_eq!(t, CoopTile { sgm: 4, sgn: 2, group_m: 1 });
        for bad in [(256, 256, 8), (128, 128, 3), (64, 64, 8), (128, 192, 8)] {
            let e = pinned_coop_tile(Some(bad), 48 * 1024, 1024).unwrap_err().to_string();
            let token = format!("{}x{}/{}", bad.0, bad.1, bad.2);
            assert!(e.contains(GEMM_TILE_VAR) && e.contains(&token) && e.contains("not a built tile"), "{e}");
        }
        let e = pinned_coop_tile(Some((128, 256, 8)), 32 * 1024, 1024).unwrap_err().to_string();
        let needs = CoopTile { sgm: 2, sgn: 4, group_m: 8 }.shared_bytes();
        assert!(e.contains("32768 bytes") && e.contains(&format!("needs {needs} bytes")), "{e}");
        // A tile that was never built says so, whatever the device allows.
        let e = pinned_coop_tile(Some((256, 256, 8)), u32::MAX, u32::MAX).unwrap_err().to_string();
        assert!(e.contains("not a built tile"), "{e}");
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
