//! The HIP backend's launch parameters: its tune configs (`tune_configs.toml`, then
//! `cdna2/` for gfx90a and `cdna3/` for gfx94x, from `vendor_info().arch_family`), layered over
//! the GPU defaults of `tefl-gpu`. The row and elementwise heuristics are `tefl_gpu::tune`'s.

use tefl_gpu::tune::{TuneConfigs, TuneFile};

/// The tune configs of the HIP backend.
pub static TUNE_CONFIGS: TuneConfigs = TuneConfigs::new(
    crate::vendor_info,
    TuneFile { path: "tefl-backend-amd/src/tune_configs.toml", text: include_str!("tune_configs.toml") },
    &[
        (
            "cdna2",
            TuneFile {
                path: "tefl-backend-amd/src/cdna2/tune_configs.toml",
                text: include_str!("cdna2/tune_configs.toml"),
            },
        ),
        (
            "cdna3",
            TuneFile {
                path: "tefl-backend-amd/src/cdna3/tune_configs.toml",
                text: include_str!("cdna3/tune_configs.toml"),
            },
        ),
    ],
);

#[cfg(test)]
mod tests {
    use super::*;
    use tefl_gpu::tune::int;

    #[test]
    fn every_file_parses_and_blocks_are_whole_wavefronts() {
        for arch in ["gfx90a", "gfx942", "gfx1030", "gfx908"] {
            let t = TUNE_CONFIGS.table(arch);
            for family in ["norm", "softmax", "elementwise"] {
                let configs = t.configs(family);
                assert!(!configs.is_empty(), "{arch}: no {family} configs");
                for c in configs {
                    // The block reductions need whole wavefronts of 64 (CDNA).
                    assert_eq!(int(c, "block", 256) % 64, 0, "{arch} {family}: {c:?}");
                }
            }
        }
    }

    #[test]
    fn the_families_override_the_vendor_file() {
        let (mi200, mi300, rdna) =
            (TUNE_CONFIGS.table("gfx90a"), TUNE_CONFIGS.table("gfx942"), TUNE_CONFIGS.table("gfx1030"));
        assert_ne!(mi300.configs("elementwise"), rdna.configs("elementwise"));
        assert_ne!(mi200.configs("norm"), rdna.configs("norm"));
    }
}
