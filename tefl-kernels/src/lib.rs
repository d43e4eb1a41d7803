//! # tefl-kernels
//!
//! tefl's GPU kernel sources as text, with no dependencies (like candle's `candle-kernels`):
//! the GPU backends compile them at run time (NVRTC, hiprtc) through `tefl-gpu`.
//!
//! - `prelude/cuda.h`, `prelude/hip.h`: the hardware primitives of one target on built-in
//!   types (warp width, shuffles, 16-bit conversions, `max_nan`, `fast_exp2`, vector atomics),
//!   PTX bodies on CUDA, amdgcn built-ins and wavefronts of the device's width (64 or 32) on HIP;
//! - `prelude/common.h`: everything else a kernel uses (types, conversions, warp and block
//!   reductions, vector access, Philox, FP8), written against those primitives;
//! - `simt/`: the kernels every GPU target compiles (norms, softmax, activations, RoPE,
//!   dropout, FP8 quantize, optimizers, the GEMM epilogue), written against the prelude only:
//!   no shuffle, lane mask, inline assembly or warp width appears in them;
//! - `shared/`: target-neutral pieces of target-specific kernels (attention's sequences,
//!   masks and dropout);
//! - `cuda/`: the tensor-core attention kernels (MMA, ldmatrix, cp.async), CUDA only.
//!
//! A compiler sees: the target header, `common.h`, the variant's defines, the source's
//! headers, then the source (see [`Source`] and `tefl_gpu::full_source`).

/// A compilation target of the kernel sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// CUDA C++ through NVRTC (32-lane warps).
    Cuda,
    /// HIP through hiprtc (wavefronts of 64 or 32 lanes, the device's).
    Hip,
}

impl Target {
    /// The target's name in cache file names and messages (`cuda`, `hip`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Cuda => "cuda",
            Target::Hip => "hip",
        }
    }

    /// The target's primitives header (`prelude/cuda.h` or `prelude/hip.h`).
    pub fn primitives(self) -> &'static Header {
        match self {
            Target::Cuda => &prelude::CUDA,
            Target::Hip => &prelude::HIP,
        }
    }
}

/// A header: its path under `tefl-kernels/src` (for `#line`) and its text.
#[derive(Debug)]
pub struct Header {
    /// The path under `tefl-kernels/src`.
    pub path: &'static str,
    /// The text.
    pub text: &'static str,
}

/// One kernel source file: the kernels of one op family.
#[derive(Debug)]
pub struct Source {
    /// A short name (cache file names, error messages): `norm`, `attention`.
    pub name: &'static str,
    /// The path under `tefl-kernels/src` (for `#line`).
    pub path: &'static str,
    /// The text (without the prelude or headers).
    pub text: &'static str,
    /// Headers that go after the variant's defines (they may use them), before the text.
    pub headers: &'static [&'static Header],
    /// The targets the source compiles for.
    pub targets: &'static [Target],
    /// Compiled for the arch-specific target of the device (`sm_90a` on an `sm_90` GPU): the
    /// source uses instructions only that exact arch has (wgmma, setmaxnreg), and its binary
    /// runs on no other.
    pub arch_specific: bool,
}

impl Source {
    /// Whether the source compiles for `target`.
    pub fn supports(&self, target: Target) -> bool {
        self.targets.contains(&target)
    }
}

/// The prelude: one primitives header per target, and the target-neutral part.
pub mod prelude {
    use super::Header;

    /// The target-neutral prelude (after the target's primitives).
    pub static COMMON: Header = Header { path: "prelude/common.h", text: include_str!("prelude/common.h") };
    /// CUDA's primitives (PTX bodies, 32-lane warps).
    pub static CUDA: Header = Header { path: "prelude/cuda.h", text: include_str!("prelude/cuda.h") };
    /// HIP's primitives (amdgcn; the wavefront width comes from the host).
    pub static HIP: Header = Header { path: "prelude/hip.h", text: include_str!("prelude/hip.h") };
}

const SIMT: &[Target] = &[Target::Cuda, Target::Hip];

macro_rules! simt_source {
    ($(#[$doc:meta] $id:ident = $name:literal, $file:literal;)*) => {
        $(
            #[$doc]
            pub static $id: Source = Source {
                name: $name,
                path: concat!("simt/", $file),
                text: include_str!(concat!("simt/", $file)),
                headers: &[],
                targets: SIMT,
                arch_specific: false,
            };
        )*
    };
}

simt_source! {
    /// RMSNorm / LayerNorm forward and backward.
    NORM = "norm", "norm.cu";
    /// The fused softmax variants.
    SOFTMAX = "softmax", "softmax.cu";
    /// Activations (plain, gated, clamped SwiGLU) and their dbias column sums.
    ACTIVATION = "activation", "activation.cu";
    /// Rotary position embedding.
    ROPE = "rope", "rope.cu";
    /// Dropout with the Philox stream.
    DROPOUT = "dropout", "dropout.cu";
    /// FP8 quantize, dequantize, transpose and delayed scaling.
    QUANTIZE = "quantize", "quantize.cu";
    /// Multi-tensor optimizers (scale, l2norm, Adam, SGD).
    OPTIMIZER = "optimizer", "optimizer.cu";
    /// The GEMM epilogue for the cases a vendor GEMM library does not fuse.
    GEMM_EPILOGUE = "gemm", "gemm_epilogue.cu";
    /// The portable tiled GEMM (f32 accumulate, no tensor cores) of any SIMT target.
    GEMM_TILED = "gemm_tiled", "gemm.cu";
}

/// Attention's sequences, masks and dropout (target-neutral; uses the attention defines).
pub static ATTENTION_MASK: Header =
    Header { path: "shared/attention_mask.h", text: include_str!("shared/attention_mask.h") };

/// The tensor-core building blocks of the CUDA attention kernels.
pub static CUDA_MMA: Header = Header { path: "cuda/attention/mma.h", text: include_str!("cuda/attention/mma.h") };

/// Flash attention on CUDA tensor cores (forward, backward, f32 fallback tiles).
pub static ATTENTION_CUDA: Source = Source {
    name: "attention",
    path: "cuda/attention/attention.cu",
    text: include_str!("cuda/attention/attention.cu"),
    headers: &[&ATTENTION_MASK, &CUDA_MMA],
    targets: &[Target::Cuda],
    arch_specific: false,
};

/// Hopper's building blocks: mbarriers, tensor-memory-accelerator loads, wgmma, setmaxnreg.
pub static CUDA_HOPPER: Header = Header { path: "cuda/hopper.h", text: include_str!("cuda/hopper.h") };

/// `te_general_grouped_gemm` on Hopper: one persistent launch over a table of groups
/// (tensor-memory-accelerator loads, wgmma, a producer and two consumer warpgroups).
pub static GROUPED_GEMM_SM90: Source = Source {
    name: "grouped_gemm_sm90",
    path: "cuda/gemm/grouped_gemm.cu",
    text: include_str!("cuda/gemm/grouped_gemm.cu"),
    headers: &[&CUDA_MMA, &CUDA_HOPPER],
    targets: &[Target::Cuda],
    arch_specific: true,
};

/// Flash attention forward on Hopper: tensor-memory-accelerator tiles, wgmma for Q·Kᵀ and for
/// P·V with P from registers, a producer and two consumer warpgroups.
pub static ATTENTION_SM90: Source = Source {
    name: "attention_sm90",
    path: "cuda/attention/attention_sm90.cu",
    text: include_str!("cuda/attention/attention_sm90.cu"),
    headers: &[&ATTENTION_MASK, &CUDA_MMA, &CUDA_HOPPER],
    targets: &[Target::Cuda],
    arch_specific: true,
};

/// Flash attention backward on Hopper: dK and dV of 128 keys in two consumer warpgroups' registers
/// (64 keys split by head-dim halves at head dim 256), query tiles by the tensor memory
/// accelerator, wgmma for all five products, dQ shares added by the copy engine's tensor
/// reduce-add.
pub static ATTENTION_BWD_SM90: Source = Source {
    name: "attention_bwd_sm90",
    path: "cuda/attention/attention_bwd_sm90.cu",
    text: include_str!("cuda/attention/attention_bwd_sm90.cu"),
    headers: &[&ATTENTION_MASK, &CUDA_MMA, &CUDA_HOPPER],
    targets: &[Target::Cuda],
    arch_specific: true,
};

/// Portable flash attention (forward) for any SIMT target: shared-memory key tiles, online
/// softmax, the masks and sequences of `shared/attention_mask.h`.
pub static ATTENTION_SIMT: Source = Source {
    name: "attention_simt",
    path: "simt/attention.cu",
    text: include_str!("simt/attention.cu"),
    headers: &[&ATTENTION_MASK],
    targets: SIMT,
    arch_specific: false,
};

/// The L2 scrub before a benchmark's L2 flush: evict_last lines put back to the normal
/// priority (CUDA's `flush_cache`).
pub static L2_SCRUB: Source = Source {
    name: "l2_scrub",
    path: "cuda/l2_scrub.cu",
    text: include_str!("cuda/l2_scrub.cu"),
    headers: &[],
    targets: &[Target::Cuda],
    arch_specific: false,
};

/// Every source of the crate.
pub static SOURCES: &[&Source] = &[
    &NORM,
    &SOFTMAX,
    &ACTIVATION,
    &ROPE,
    &DROPOUT,
    &QUANTIZE,
    &OPTIMIZER,
    &GEMM_EPILOGUE,
    &GEMM_TILED,
    &ATTENTION_CUDA,
    &GROUPED_GEMM_SM90,
    &ATTENTION_SM90,
    &ATTENTION_BWD_SM90,
    &L2_SCRUB,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Spellings that tie a kernel to one target or to a warp width. SIMT kernels, the
    /// target-neutral prelude and shared headers use the target header's primitives instead.
    const TARGET_SPECIFIC: &[&str] =
        &["__shfl", "__syncwarp", "asm(", "asm volatile", "0xffffffff", "% 32", "/ 32", "* 32", "[32]", "32 *"];

    fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
        text.lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.split("//").next().unwrap_or("")))
            .filter(|(_, l)| !l.is_empty())
    }

    #[test]
    fn portable_text_makes_no_warp_or_target_assumption() {
        let mut texts: Vec<(&str, &str)> =
            SOURCES.iter().filter(|s| s.supports(Target::Hip)).map(|s| (s.path, s.text)).collect();
        texts.push((prelude::COMMON.path, prelude::COMMON.text));
        texts.push((ATTENTION_MASK.path, ATTENTION_MASK.text));
        let mut found = Vec::new();
        for (path, text) in texts {
            for (line, code) in code_lines(text) {
                for bad in TARGET_SPECIFIC {
                    if code.contains(bad) {
                        found.push(format!("{path}:{line}: `{bad}` in {}", code.trim()));
                    }
                }
            }
        }
        assert!(found.is_empty(), "target-specific code outside the target headers:\n{}", found.join("\n"));
    }

    #[test]
    fn the_check_above_can_fail() {
        let text = "float v = __shfl_xor_sync(0xffffffffu, v, 1); // fine in a comment: __shfl\n";
        assert!(code_lines(text).any(|(_, c)| TARGET_SPECIFIC.iter().any(|b| c.contains(b))));
        assert!(!code_lines("// only a comment: % 32\n").any(|(_, c)| c.contains("% 32")));
    }

    #[test]
    fn both_targets_define_every_primitive() {
        for name in [
            "WARP_SIZE",
            "MAX_WARPS",
            "shfl_xor(float",
            "shfl_xor(double",
            "shfl_xor(int",
            "shfl(float",
            "warp_sync()",
            "half_bits_to_f32",
            "f32_to_half_bits",
            "f32_to_bf16_bits",
            "pack2_bf16_bits",
            "pack2_half_bits",
            "max_nan",
            "max2_nan_bf16_bits",
            "max2_nan_half_bits",
            "fast_exp2",
            "atomic_add2_f32",
        ] {
            for t in [Target::Cuda, Target::Hip] {
                assert!(t.primitives().text.contains(name), "{} lacks {name}", t.primitives().path);
            }
        }
        // CUDA's warp is 32 lanes; HIP's wavefront width is the device's, passed by the host.
        assert!(prelude::CUDA.text.contains("#define WARP_SIZE 32"));
        assert!(prelude::HIP.text.contains("#define WARP_SIZE TEFL_WAVE_SIZE"));
    }

    #[test]
    fn every_kernel_source_declares_extern_c_kernels() {
        for s in SOURCES {
            assert!(s.text.contains("extern \"C\" __global__"), "{} has no kernel", s.path);
            assert!(!s.targets.is_empty());
        }
    }
}
