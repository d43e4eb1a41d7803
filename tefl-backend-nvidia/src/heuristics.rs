//! The CUDA backend's launch parameters: its tune configs (`tune_configs.toml` and one file
//! per arch family, layered over the GPU defaults by `tefl_gpu::tune`) and the rules that only
//! CUDA kernels have. The row and elementwise heuristics are `tefl_gpu::tune`'s.

use tefl_core::tuning::TuneTable;
use tefl_core::{DType, Device};
use tefl_gpu::tune::{TuneConfigs, TuneFile, int};

/// The tune configs: `tune_configs.toml`, then `hopper/tune_configs.toml` for the arch family
/// `hopper` (from `vendor_info().arch_family`).
pub static TUNE_CONFIGS: TuneConfigs = TuneConfigs::new(
    crate::vendor_info,
    TuneFile { path: "tefl-backend-nvidia/src/tune_configs.toml", text: include_str!("tune_configs.toml") },
    &[(
        "hopper",
        TuneFile {
            path: "tefl-backend-nvidia/src/hopper/tune_configs.toml",
            text: include_str!("hopper/tune_configs.toml"),
        },
    )],
);

/// Forward attention blocks per SM the kernel's register budget is cut for (`attention`'s
/// `fwd_min_blocks`, 2 by default; `TEFL_ATTN_FWD_MIN_BLOCKS` overrides it for experiments).
pub fn attention_fwd_min_blocks(t: &TuneTable) -> u32 {
    if let Ok(env) = tefl_core::policy::env()
        && let Some(n) = env.attn_fwd_min_blocks
    {
        return n;
    }
    t.configs("attention").first().map_or(2, |c| int(c, "fwd_min_blocks", 2).clamp(1, 4))
}

/// Whether the forward runs on the Hopper wgmma kernel where it takes the call (`attention`'s
/// `fwd_wgmma`: 1 in the Hopper tune configs, 0 by default; `TEFL_ATTN_WGMMA=0` turns it off
/// for comparisons, `1` leaves the tune config's choice).
pub fn attention_fwd_wgmma(t: &TuneTable) -> bool {
    attention_wgmma(t, "fwd_wgmma")
}

/// Whether the backward's dK/dV runs on the Hopper wgmma kernel where it takes the call
/// (`attention`'s `bwd_wgmma`: 1 in the Hopper tune configs, 0 by default; `TEFL_ATTN_WGMMA=0`
/// turns it off as it does the forward's).
pub fn attention_bwd_wgmma(t: &TuneTable) -> bool {
    attention_wgmma(t, "bwd_wgmma")
}

/// Whether the Hopper backward's dK/dV kernel runs as persistent CTAs claiming key blocks from
/// a counter for head dim `d` (`attention`'s `bwd_persistent_d64`, `_d128`, `_d256`: nonzero;
/// absent, no), rather than one CTA per key block.
pub fn attention_bwd_persistent(t: &TuneTable, d: usize) -> bool {
    let key = format!("bwd_persistent_d{d}");
    t.configs("attention").first().and_then(|c| c.get(&key)).and_then(|v| v.as_int()).is_some_and(|v| v != 0)
}

/// `attention`'s flag `key` (nonzero: the wgmma kernel), unless `TEFL_ATTN_WGMMA=0`.
fn attention_wgmma(t: &TuneTable, key: &str) -> bool {
    if let Ok(env) = tefl_core::policy::env()
        && env.attn_wgmma == Some(false)
    {
        return false;
    }
    t.configs("attention").first().is_some_and(|c| c.get(key).and_then(|v| v.as_int()).is_some_and(|v| v != 0))
}

/// The one-launch grouped GEMM's tile schedule (`grouped_gemm` in the tune configs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupedTiles {
    /// Tiles of a group in column-tile-major order (down the rows first), so that CTAs running
    /// together share B's tile; else row-major.
    pub m_first: bool,
    /// The most pipeline stages (fewer when the staging buffers leave no room).
    pub max_stages: usize,
}

impl Default for GroupedTiles {
    fn default() -> Self {
        GroupedTiles { m_first: true, max_stages: 4 }
    }
}

/// The grouped GEMM's schedule from the tune table (defaults: down the rows first, 4 stages).
pub fn grouped_gemm_tiles(t: &TuneTable) -> GroupedTiles {
    let d = GroupedTiles::default();
    t.configs("grouped_gemm").first().map_or(d, |c| GroupedTiles {
        m_first: c.get("m_first").and_then(|v| v.as_int()).map_or(d.m_first, |v| v != 0),
        max_stages: int(c, "max_stages", d.max_stages as i64).clamp(2, 8) as usize,
    })
}

/// What the attention backward runs for a call with `deterministic` set (ops/attention.rs).
const DETERMINISTIC_BWD: &str = "deterministic calls: attn_bwd_delta, the dK/dV kernel without dQ shares \
     (attn_bwd_sm90 / attn_bwd_sm90_d256 where they take the call, else attn_bwd_dkdv without dQ atomics), then dQ per \
     query tile in key order (attn_bwd_dq_sm90 on sm_90 for f16/bf16 head dims 64 and 128, else attn_bwd_dq); \
     the portable kernels where attn_bwd_dq's tiles exceed shared memory (f32 head dims over 208 on Hopper)";

/// Which kernel `vendor.nvidia` runs for `op` on `device` and `dtype`, where it has more than
/// one (chosen by arch and tune configs): what `explain` shows under the impl. `None` for the
/// other ops, for the by-id portable impl and for a device whose properties cannot be read.
pub fn kernel_choice(impl_id: &str, op: &str, device: Device, dtype: DType) -> Option<String> {
    if impl_id != crate::IMPL_ID {
        return None;
    }
    let arch = tefl_core::device::info(device).ok()?.arch.clone();
    let hopper = arch == "sm_90";
    let sixteen = matches!(dtype, DType::BF16 | DType::F16);
    let mma = if sixteen { "tensor-core mma.sync" } else { "f32 FMAs" };
    Some(match op {
        "fused_attn_fwd" if hopper && sixteen && attention_fwd_wgmma(&TUNE_CONFIGS.table(&arch)) => {
            "attn_fwd_sm90 (TMA loads, wgmma, a producer warp and two consumer warpgroups, persistent CTAs) \
             for head dim 64/128/256, every layout and mask, no dropout; attn_fwd (mma.sync) for other calls"
                .to_string()
        }
        "fused_attn_fwd" if hopper && sixteen => {
            "attn_fwd (mma.sync): the tune config or TEFL_ATTN_WGMMA=0 keeps the sm_90 kernel off".to_string()
        }
        "fused_attn_fwd" if hopper => format!("attn_fwd ({mma}; the wgmma kernel takes f16/bf16 only)"),
        "fused_attn_fwd" => format!("attn_fwd ({mma}; the wgmma kernel needs sm_90, this is {arch})"),
        "fused_attn_bwd" if hopper && sixteen && attention_bwd_wgmma(&TUNE_CONFIGS.table(&arch)) => {
            format!(
                "attn_bwd_delta, attn_bwd_sm90 (TMA loads, wgmma, dQ by tensor reduce-add; head dim 64/128, \
                 persistent CTAs where the tune configs' bwd_persistent_dN says; attn_bwd_sm90_d256 for 256; \
                 every layout and mask, no dropout; attn_bwd_dkdv (mma.sync) for other calls), \
                 attn_bwd_dq_out; {DETERMINISTIC_BWD}"
            )
        }
        "fused_attn_bwd" => format!("attn_bwd_delta, attn_bwd_dkdv, attn_bwd_dq_out ({mma}); {DETERMINISTIC_BWD}"),
        "te_general_grouped_gemm" if hopper && (sixteen || dtype.is_fp8()) => {
            "grouped_gemm_sm90 (one launch over a table of groups: TMA, wgmma) where every group's rows are \
             16-byte aligned; cuBLASLt per group otherwise"
                .to_string()
        }
        "te_general_grouped_gemm" => {
            format!("cuBLASLt, one launch per group (the one-launch kernel needs sm_90; this is {arch})")
        }
        "rmsnorm_bwd" | "rmsnorm_bwd_add" | "layernorm_bwd" => {
            let table = TUNE_CONFIGS.table(&arch);
            match tefl_gpu::tune::norm_bwd_ring(&table) {
                0 => "norm_bwd (a block per few rows, each fetching its next row into registers), norm_reduce_ws"
                    .to_string(),
                n => format!(
                    "norm_bwd (rows streamed through a ring of up to {n} row buffers in shared memory by cp.async, where \
                     the row is whole 16-byte vectors and the rings of {} threads an SM fit; else the next row in \
                     registers), norm_reduce_ws",
                    tefl_gpu::tune::norm_bwd_threads_per_sm(&table)
                ),
            }
        }
        "generic_gemm" if dtype.is_fp8() => "cuBLASLt FP8 (TN; other forms transposed first)".to_string(),
        "generic_gemm" => "cuBLASLt".to_string(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tefl_gpu::tune::row_kernel;

    #[test]
    fn every_file_parses() {
        for f in TUNE_CONFIGS.files() {
            TuneTable::parse(f.text, f.path).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn hopper_overrides_attention_the_norm_backward_the_softmax_backward_and_elementwise_not_the_norms() {
        let h = TUNE_CONFIGS.table("sm_90");
        let a = TUNE_CONFIGS.table("sm_80");
        assert_eq!(h.configs("norm"), a.configs("norm"));
        assert_eq!(h.configs("softmax"), a.configs("softmax"));
        assert_eq!(a.configs("norm").len(), 4);
        assert_eq!(attention_fwd_min_blocks(&h), 2);
        assert!(attention_fwd_wgmma(&h) && !attention_fwd_wgmma(&a));
        assert!(attention_bwd_wgmma(&h) && !attention_bwd_wgmma(&a));
        // The backward's persistent form: Hopper's file takes it at head dims 64 and 256.
        assert!(attention_bwd_persistent(&h, 64) && !attention_bwd_persistent(&h, 128));
        assert!(attention_bwd_persistent(&h, 256) && !attention_bwd_persistent(&a, 64));
        assert_eq!(grouped_gemm_tiles(&h), GroupedTiles { m_first: true, max_stages: 4 });
        // The norm backward's ring: Hopper's file asks for 3 row buffers of two vectors a thread,
        // 512 threads an SM (8192 bf16 columns: one block of 512), the defaults for none.
        assert_eq!(tefl_gpu::tune::norm_bwd_stages(&h, 232_448, 32 << 10, 1), 3);
        assert_eq!(tefl_gpu::tune::norm_bwd_ring_vecs(&h), 2);
        assert_eq!(tefl_gpu::tune::norm_bwd_threads_per_sm(&h), 512);
        assert_eq!(tefl_gpu::tune::norm_bwd_threads_per_sm(&a), 1024);
        assert_eq!(tefl_gpu::tune::norm_bwd_stages(&a, 232_448, 32 << 10, 1), 0);
        let r = row_kernel(&h, "norm", 8192, 2, 4);
        assert!(r.fused() && r.row_vecs <= 4, "{r:?}");
        // Hopper: four vectors a thread, 256 threads for 8192 bf16 columns, 128 for 4096.
        assert_eq!((r.block, r.row_vecs), (256, 4));
        let r = row_kernel(&h, "norm", 4096, 2, 4);
        assert_eq!((r.block, r.row_vecs), (128, 4));
        let r = row_kernel(&h, "norm", 16384, 2, 4);
        assert_eq!((r.block, r.row_vecs), (512, 4));
        // 1024 bf16 columns are 128 vectors: one each for 128 threads.
        assert_eq!(row_kernel(&h, "norm", 1024, 2, 4).block, 128);
        // The softmax backward's own list (Hopper only): 512 threads, two vectors, at 8192 bf16.
        let r = row_kernel(&h, "softmax_bwd", 8192, 2, 4);
        assert_eq!((r.block, r.row_vecs), (512, 2));
        assert!(a.configs("softmax_bwd").is_empty());
        // The elementwise kernels: one vector a thread, gelu in blocks of 128 (its own list).
        use tefl_gpu::tune::{ElementwiseConfig, elementwise_for};
        assert_eq!(elementwise_for(&h, "swiglu"), ElementwiseConfig { block: 256, unroll: 1, vec_bytes: 16 });
        assert_eq!(elementwise_for(&h, "gelu"), ElementwiseConfig { block: 128, unroll: 1, vec_bytes: 16 });
    }

    #[test]
    fn hopper_holds_the_large_streamed_inputs_in_l2_where_measured() {
        use tefl_gpu::tune::l2_keep;
        let h = TUNE_CONFIGS.table("sm_90");
        let a = TUNE_CONFIGS.table("sm_80");
        // The softmax backward at 16384 x 8192 bf16 (y and dy: 32 KiB a row, 512 MiB): kept, the
        // last 64 MiB (2048 rows) released; at 8192 x 4096 (128 MiB, not measured) not kept.
        assert_eq!(l2_keep(&h, "softmax_bwd_l2", 16384, 8192 * 4), Some(16384 - 2048));
        assert_eq!(l2_keep(&h, "softmax_bwd_l2", 8192, 4096 * 4), None);
        // The RMSNorm forward at 16384 x 8192 bf16 (256 MiB): the last 4096 rows released; its
        // 8192 x 4096 case (64 MiB) lost with the policy.
        assert_eq!(l2_keep(&h, "norm_fwd_l2", 16384, 8192 * 2), Some(16384 - 4096));
        assert_eq!(l2_keep(&h, "norm_fwd_l2", 8192, 4096 * 2), None);
        // The gated forward at swiglu's 16384 x (2 x 8192) bf16 (x: 32 KiB a row, 512 MiB): the
        // last 2048 rows released; 8192 x (2 x 4096) (128 MiB, not measured) not kept.
        assert_eq!(l2_keep(&h, "gated_fwd_l2", 16384, 16384 * 2), Some(16384 - 2048));
        assert_eq!(l2_keep(&h, "gated_fwd_l2", 8192, 8192 * 2), None);
        for entry in ["softmax_bwd_l2", "norm_fwd_l2", "rope_l2", "gated_fwd_l2"] {
            assert_eq!(l2_keep(&a, entry, 1 << 20, 1 << 16), None, "{entry} on sm_80");
        }
    }
}
