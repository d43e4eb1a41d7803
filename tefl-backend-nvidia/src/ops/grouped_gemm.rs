//! `te_general_grouped_gemm` in one launch on Hopper (`cuda/gemm/grouped_gemm.cu`): a table of
//! groups (the copy engine's tensor maps of every A_g and B_g, sizes, D, bias and FP8 scale
//! pointers) passed by value to one persistent kernel of wgmma tiles. bf16/f16 in any
//! transpose form (wgmma reads K- or MN-major tiles), FP8 as TN (other forms get their codes
//! transposed first, as TE keeps them), fast or split FP8 accumulation, bias, f32/f16/bf16 D.
//!
//! [`run`] answers `Ok(None)` for a call the kernel does not take (another arch than sm_90,
//! f32 operands, FP8 formats or bias dtypes that differ between groups, rows not 16-byte
//! aligned for the copy engine); `gemm::grouped_gemm` then runs each group on cuBLASLt.

use tefl_core::catalogue::{GroupedGemmArgs, GroupedGemmOut, grouped_dims};
use tefl_core::{DType, KernelCtx, Result, Tensor};
use tefl_gpu::simt::quantize;
use tefl_gpu::{Defines, Grid, Variant};

use crate::heuristics::{GroupedTiles, grouped_gemm_tiles};
use crate::launch::{empty, info, launch_struct, ptr, sm_count, tune_table};
use crate::tma::{TensorMap, encode_2d};

const OP: &str = "te_general_grouped_gemm";
const ENTRIES: &[&str] = &["grouped_gemm_sm90"];
/// Output rows per tile (two consumer warpgroups of 64).
const BM: usize = 128;
/// Bytes of K per pipeline stage (one 128-byte swizzled row).
const BK_BYTES: usize = 128;
/// The table sizes variants are compiled for; a call with more groups launches once per 64.
const TABLE_SIZES: [usize; 4] = [8, 16, 32, 64];

/// One group's sizes and pointers: the kernel's `GroupInfo` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct GroupInfo {
    d: u64,
    bias: u64,
    a_scale_inv: u64,
    b_scale_inv: u64,
    m: i32,
    n: i32,
    k: i32,
    first_tile: i32,
    tiles_n: i32,
    pad: [i32; 3],
}

/// The kernel's `GroupTable` for `G` groups at most.
#[repr(C)]
struct Table<const G: usize> {
    a: [TensorMap; G],
    b: [TensorMap; G],
    d: [TensorMap; G],
    g: [GroupInfo; G],
    groups: i32,
    tiles: i32,
}

/// What one call compiles: the variant's defines.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Config {
    ab: DType,
    b: DType,
    a_mn: bool,
    b_mn: bool,
    out: DType,
    bias: Option<DType>,
    split: bool,
    max_groups: usize,
    tiles: GroupedTiles,
    /// D written by the copy engine (every D_g's rows are 16-byte multiples).
    tma_store: bool,
}

impl Config {
    /// bf16 A and B, both K-major, bf16 D, no bias, the default schedule: the base the
    /// variant list and the tests vary.
    fn plain_bf16() -> Self {
        Config {
            ab: DType::BF16,
            b: DType::BF16,
            a_mn: false,
            b_mn: false,
            out: DType::BF16,
            bias: None,
            split: false,
            max_groups: 8,
            tiles: GroupedTiles::default(),
            tma_store: true,
        }
    }

    /// Output columns per tile: 256, or 128 for split FP8 accumulation (whose per-stage
    /// partial sums double the accumulator registers).
    fn bn(&self) -> usize {
        if self.ab.is_fp8() && self.split { 128 } else { 256 }
    }

    /// Bytes of one consumer's epilogue staging (the kernel's `STAGING_BYTES`): two buffers of
    /// 64 rows x 128 bytes for the copy engine's stores, else 64 rows of 64 outputs, each row
    /// padded by 16 bytes.
    fn staging_bytes(&self) -> usize {
        if self.tma_store { 2 * 64 * 128 } else { 64 * (64 * self.out.size_in_bytes() + 16) }
    }

    /// Pipeline stages: as many as fit (at most the tune config's) beside the staging buffers
    /// in Hopper's 227 KB of shared memory per block.
    fn stages(&self) -> usize {
        let room = 227 * 1024 - 1024 - 2 * self.staging_bytes();
        (room / (BK_BYTES * (BM + self.bn()) + 16)).min(self.tiles.max_stages)
    }

    /// Dynamic shared memory: the 1024-byte alignment slack, the stages, two mbarriers each,
    /// the two consumers' staging buffers.
    fn smem(&self) -> usize {
        1024 + self.stages() * (BK_BYTES * (BM + self.bn()) + 16) + 2 * self.staging_bytes()
    }

    fn variant(&self) -> Variant {
        let code = |d: Option<DType>| match d {
            None => 0,
            Some(DType::F32) => 1,
            Some(DType::F16) => 2,
            Some(_) => 3,
        };
        let defines = Defines::new()
            .set("MAX_GROUPS", self.max_groups)
            .flag("AB_FP8", self.ab.is_fp8())
            .flag("AB_F16", self.ab == DType::F16)
            .flag("A_E5M2", self.ab == DType::F8E5M2)
            .flag("B_E5M2", self.b == DType::F8E5M2)
            .flag("A_MN", self.a_mn)
            .flag("B_MN", self.b_mn)
            .set("OUT_T", code(Some(self.out)) - 1)
            .set("BIAS_T", code(self.bias))
            .set("BN", self.bn())
            .flag("SPLIT", self.ab.is_fp8() && self.split)
            .set("STAGES", self.stages())
            .flag("M_FIRST", self.tiles.m_first)
            .flag("TMA_STORE", self.tma_store);
        Variant::new(&tefl_kernels::GROUPED_GEMM_SM90, ENTRIES, defines)
    }
}

/// The variants the NVRTC compile test builds (sm_90a): every operand form of bf16, f16 and
/// the FP8 format pairs, fast and split, each output dtype, with and without a bias, both
/// table sizes at the ends.
pub fn variants() -> Vec<Variant> {
    let base = Config { b_mn: true, ..Config::plain_bf16() };
    let mut v = Vec::new();
    for (a_mn, b_mn) in [(false, false), (false, true), (true, false), (true, true)] {
        v.push(Config { a_mn, b_mn, ..base });
    }
    v.push(Config { ab: DType::F16, b: DType::F16, out: DType::F32, bias: Some(DType::F16), ..base });
    v.push(Config { tma_store: false, ..base });
    v.push(Config { out: DType::F32, tma_store: false, ..base });
    v.push(Config { bias: Some(DType::BF16), max_groups: 64, ..base });
    let fp8 = Config { ab: DType::F8E4M3, b: DType::F8E4M3, b_mn: false, bias: Some(DType::F32), ..base };
    v.push(fp8);
    v.push(Config { split: true, out: DType::F16, ..fp8 });
    v.push(Config { ab: DType::F8E5M2, split: true, bias: None, ..fp8 });
    v.push(Config { b: DType::F8E5M2, out: DType::F32, ..fp8 });
    v.into_iter().map(|c| c.variant()).collect()
}

/// One group as the kernel sees it: its operands in the orientation it loads them.
struct Group {
    a: Tensor,
    b: Tensor,
    m: usize,
    k: usize,
    n: usize,
}

/// Why the one-launch kernel does not take this call (`None`: it does).
fn declined(ctx: &KernelCtx<'_>, a: &GroupedGemmArgs, dims: &[(usize, usize, usize)]) -> Result<Option<String>> {
    let arch = &info(ctx.device)?.arch;
    if arch != "sm_90" {
        return Ok(Some(format!("{arch} is not sm_90")));
    }
    let (ab, b) = (a.a[0].dtype(), a.b[0].dtype());
    let fp8 = ab.is_fp8();
    if !fp8 && !matches!(ab, DType::BF16 | DType::F16) {
        return Ok(Some(format!("{ab} operands")));
    }
    if a.a.iter().any(|t| t.dtype() != ab) || a.b.iter().any(|t| t.dtype() != b) || (!fp8 && b != ab) {
        return Ok(Some("operand dtypes differ between groups".into()));
    }
    if let Some(first) = a.bias.first()
        && a.bias.iter().any(|t| t.dtype() != first.dtype())
    {
        return Ok(Some("bias dtypes differ between groups".into()));
    }
    // The copy engine wants 16-byte aligned bases and row strides (FP8: after the transposes,
    // every row is k codes long).
    let es = ab.size_in_bytes();
    for (g, &(m, k, n)) in dims.iter().enumerate() {
        if m == 0 || n == 0 || k == 0 {
            continue;
        }
        let rows_ok = if fp8 {
            k % 16 == 0
        } else {
            (if a.transa { m } else { k }) * es % 16 == 0 && (if a.transb { k } else { n }) * es % 16 == 0
        };
        let aligned = ptr(&a.a[g])? % 16 == 0 && ptr(&a.b[g])? % 16 == 0;
        if !rows_ok || !aligned {
            return Ok(Some(format!("group {g}'s rows are not 16-byte aligned")));
        }
        if m.max(n).max(k) > i32::MAX as usize / 2 {
            return Ok(Some(format!("group {g} is past the kernel's 32-bit index range")));
        }
    }
    Ok(None)
}

/// The grouped GEMM in one launch per 64 groups, or `Ok(None)` when the kernel does not take
/// the call (the reason is logged at debug level).
pub fn run(ctx: &KernelCtx<'_>, a: &GroupedGemmArgs) -> Result<Option<GroupedGemmOut>> {
    let dims = grouped_dims(a)?;
    if let Some(reason) = declined(ctx, a, &dims)? {
        tracing::debug!(target: "TE-FL", "{OP}: one-launch Hopper kernel declined ({reason}); one cuBLASLt GEMM per group");
        return Ok(None);
    }
    let fp8 = a.a[0].dtype().is_fp8();
    let d = dims.iter().map(|&(m, _, n)| empty(ctx.device, &[m, n], a.out_dtype)).collect::<Result<Vec<_>>>()?;
    // FP8 tiles are K-major only: A [m, k] and B [n, k] (TE's TN), transposed codes otherwise.
    let mut groups = Vec::with_capacity(dims.len());
    for (g, &(m, k, n)) in dims.iter().enumerate() {
        let (ga, gb) = if fp8 && m > 0 && n > 0 && k > 0 {
            let at = if a.transa { quantize::transpose_codes(ctx, &a.a[g])? } else { a.a[g].clone() };
            let bt = if a.transb { a.b[g].clone() } else { quantize::transpose_codes(ctx, &a.b[g])? };
            (at, bt)
        } else {
            (a.a[g].clone(), a.b[g].clone())
        };
        groups.push(Group { a: ga, b: gb, m, k, n });
    }
    let config = Config {
        ab: a.a[0].dtype(),
        b: a.b[0].dtype(),
        a_mn: !fp8 && a.transa,
        b_mn: !fp8 && !a.transb,
        out: a.out_dtype,
        bias: a.bias.first().map(Tensor::dtype),
        split: a.split_accumulator,
        max_groups: 8,
        tiles: grouped_gemm_tiles(&*tune_table(ctx.device)?),
        tma_store: dims.iter().all(|&(_, _, n)| (n * a.out_dtype.size_in_bytes()).is_multiple_of(16)),
    };
    let limit = info(ctx.device)?.shared_memory_per_block_optin;
    if config.smem() > limit {
        tracing::debug!(target: "TE-FL", "{OP}: {} bytes of shared memory needed, {limit} available", config.smem());
        return Ok(None);
    }
    for start in (0..groups.len()).step_by(64) {
        let end = (start + 64).min(groups.len());
        let count = end - start;
        let max_groups = TABLE_SIZES.into_iter().find(|&s| s >= count).unwrap_or(64);
        let config = Config { max_groups, ..config };
        let range = start..end;
        match max_groups {
            8 => launch::<8>(ctx, a, &config, &groups[range.clone()], &d[range], start)?,
            16 => launch::<16>(ctx, a, &config, &groups[range.clone()], &d[range], start)?,
            32 => launch::<32>(ctx, a, &config, &groups[range.clone()], &d[range], start)?,
            _ => launch::<64>(ctx, a, &config, &groups[range.clone()], &d[range], start)?,
        }
    }
    Ok(Some(GroupedGemmOut { d }))
}

/// One launch over `groups` (at most `G`), the first of which is group `first` of the call.
fn launch<const G: usize>(
    ctx: &KernelCtx<'_>,
    a: &GroupedGemmArgs,
    config: &Config,
    groups: &[Group],
    d: &[Tensor],
    first: usize,
) -> Result<()> {
    let bn = config.bn();
    let es = config.ab.size_in_bytes();
    let bk = (BK_BYTES / es) as u32;
    let mut table = Box::new(Table::<G> {
        a: [TensorMap::UNUSED; G],
        b: [TensorMap::UNUSED; G],
        d: [TensorMap::UNUSED; G],
        g: [GroupInfo::default(); G],
        groups: groups.len() as i32,
        tiles: 0,
    });
    let mut tiles = 0usize;
    for (i, gr) in groups.iter().enumerate() {
        let g = first + i;
        let tiles_n = gr.n.div_ceil(bn);
        let own = if gr.m == 0 { 0 } else { gr.m.div_ceil(BM) * tiles_n };
        if own > 0 && gr.k > 0 {
            // A: [m, k] K-major (box 128 bytes of K x 128 rows) or [k, m] (64 x 64 boxes).
            table.a[i] = if config.a_mn {
                encode_2d(ctx, OP, ptr(&gr.a)?, config.ab, (gr.m, gr.k), (64, 64))?
            } else {
                encode_2d(ctx, OP, ptr(&gr.a)?, config.ab, (gr.k, gr.m), (bk, BM as u32))?
            };
            table.b[i] = if config.b_mn {
                encode_2d(ctx, OP, ptr(&gr.b)?, config.b, (gr.n, gr.k), (64, 64))?
            } else {
                encode_2d(ctx, OP, ptr(&gr.b)?, config.b, (gr.k, gr.n), (bk, bn as u32))?
            };
        }
        if own > 0 && config.tma_store {
            // D: [m, n], boxes of 128 bytes of columns x 64 rows (one consumer's chunk).
            let cw = (128 / config.out.size_in_bytes()) as u32;
            table.d[i] = encode_2d(ctx, OP, ptr(&d[i])?, config.out, (gr.n, gr.m), (cw, 64))?;
        }
        table.g[i] = GroupInfo {
            d: ptr(&d[i])?,
            bias: a.bias.get(g).map(ptr).transpose()?.unwrap_or(0),
            a_scale_inv: a.a_scale_inv.get(g).map(ptr).transpose()?.unwrap_or(0),
            b_scale_inv: a.b_scale_inv.get(g).map(ptr).transpose()?.unwrap_or(0),
            m: gr.m as i32,
            n: gr.n as i32,
            k: gr.k as i32,
            first_tile: tiles as i32,
            tiles_n: tiles_n as i32,
            pad: [0; 3],
        };
        tiles += own;
    }
    if tiles > i32::MAX as usize {
        return Err(crate::launch::unsupported(OP, format!("{tiles} tiles are past the kernel's index range")));
    }
    table.tiles = tiles as i32;
    let grid = Grid {
        blocks: ((tiles as u32).min(sm_count(ctx.device)), 1, 1),
        threads: (384, 1, 1),
        smem: config.smem() as u32,
    };
    // SAFETY: `Table<G>` is the kernel's `GroupTable` for MAX_GROUPS = G (repr(C), the same
    // field order, 64-byte aligned maps, 64-byte group records); its device addresses are
    // live tensors (operands, transposed FP8 copies and outputs) that the queue's stream
    // ordering keeps alive until the kernel has run: their frees are queued after it.
    unsafe { launch_struct(ctx.device, &config.variant(), ENTRIES[0], grid, &*table) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host table is laid out as the kernel's: 128-byte maps, 64-byte group records,
    /// the counts after them, the whole a multiple of the maps' 64-byte alignment.
    #[test]
    fn the_table_matches_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<TensorMap>(), 128);
        assert_eq!(std::mem::align_of::<TensorMap>(), 64);
        assert_eq!(std::mem::size_of::<GroupInfo>(), 64);
        assert_eq!(std::mem::offset_of!(Table<8>, b), 8 * 128);
        assert_eq!(std::mem::offset_of!(Table<8>, d), 16 * 128);
        assert_eq!(std::mem::offset_of!(Table<8>, g), 24 * 128);
        assert_eq!(std::mem::offset_of!(Table<8>, groups), 24 * 128 + 8 * 64);
        assert_eq!(std::mem::size_of::<Table<64>>(), 64 * 448 + 64);
        // Within the driver's 32764 bytes of kernel parameters.
        assert!(std::mem::size_of::<Table<64>>() < 32764);
    }

    #[test]
    fn tiles_and_stages_fit_hoppers_shared_memory() {
        let c = Config::plain_bf16();
        assert_eq!((c.bn(), c.stages()), (256, 4));
        assert_eq!(Config { out: DType::F32, ..c }.stages(), 4);
        let f32_by_hand = Config { out: DType::F32, tma_store: false, ..c };
        assert_eq!(f32_by_hand.stages(), 3);
        let split = Config { ab: DType::F8E4M3, b: DType::F8E4M3, split: true, ..c };
        assert_eq!((split.bn(), split.stages()), (128, 4));
        for c in [c, f32_by_hand, split] {
            assert!(c.smem() <= 227 * 1024, "{c:?}: {} bytes", c.smem());
        }
    }
}
