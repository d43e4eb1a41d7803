//! Launch geometry and kernel arguments, the same for every GPU target.

use std::ffi::c_void;

use tefl_core::{DType, Error, Result};

/// Launch geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Blocks in x, y, z.
    pub blocks: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub threads: (u32, u32, u32),
    /// Dynamic shared memory in bytes.
    pub smem: u32,
}

impl Grid {
    /// A one-dimensional grid.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        Grid { blocks: (blocks, 1, 1), threads: (threads, 1, 1), smem: 0 }
    }

    /// Whether the grid has no block (a launch of it does nothing).
    pub fn is_empty(&self) -> bool {
        self.blocks.0 == 0 || self.blocks.1 == 0 || self.blocks.2 == 0
    }
}

/// Blocks for `work` items of `per_block` each, at least 1 and at most `cap` (grid-stride
/// kernels loop over the rest).
pub fn blocks_for(work: usize, per_block: usize, cap: u32) -> u32 {
    (work.div_ceil(per_block.max(1)) as u64).clamp(1, u64::from(cap.max(1))) as u32
}

/// One kernel argument, passed by value as the kernel's C signature declares it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A device pointer.
    Ptr(u64),
    /// `int`.
    I32(i32),
    /// `unsigned int`.
    U32(u32),
    /// `unsigned long long` / `long long`.
    U64(u64),
    /// `float`.
    F32(f32),
}

impl Arg {
    /// The argument's bytes in the low bytes of a little-endian 64-bit word.
    pub fn bits(self) -> u64 {
        match self {
            Arg::Ptr(p) | Arg::U64(p) => p,
            Arg::I32(i) => u64::from(i as u32),
            Arg::U32(u) => u64::from(u),
            Arg::F32(f) => u64::from(f.to_bits()),
        }
    }
}

/// Arguments laid out for a launch API that takes an array of pointers to each argument
/// (`cuLaunchKernel`, `hipModuleLaunchKernel`): each argument in its own 8-byte word, which
/// a kernel reads `sizeof(param) <= 8` bytes of (little-endian targets).
pub struct PackedArgs {
    words: Vec<u64>,
    pointers: Vec<*mut c_void>,
}

impl PackedArgs {
    /// Packs `args`.
    pub fn new(args: &[Arg]) -> Self {
        let mut words: Vec<u64> = args.iter().map(|a| a.bits()).collect();
        let pointers = words.iter_mut().map(|w| w as *mut u64 as *mut c_void).collect();
        PackedArgs { words, pointers }
    }

    /// The array of argument pointers, valid while `self` lives (the words never move: the
    /// vector is not touched after the pointers were taken).
    pub fn pointers(&mut self) -> &mut [*mut c_void] {
        &mut self.pointers
    }

    /// How many arguments there are.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }
}

/// `i32` from a size, or [`Error::Unsupported`] naming the op and the impl when it does not
/// fit the kernels' 32-bit indices (the manager moves on to the next impl).
pub fn i32_of(op: &'static str, impl_id: &str, what: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Unsupported {
        op,
        impl_id: impl_id.to_string(),
        reason: format!("'{what}': {v} exceeds the GPU kernels' 32-bit index range"),
    })
}

/// The C type name the kernel sources use for a dtype (`TX=bf16`); a typed error naming
/// `op` and `arg` for a dtype the kernels have no storage type for.
pub fn ctype(op: &'static str, arg: &'static str, d: DType) -> Result<&'static str> {
    Ok(match d {
        DType::F32 => "float",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => "u8",
        DType::I32 => "i32",
        other => return Err(Error::DType { op, arg, got: other, expected: "f32, f16 or bf16".into() }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_sit_in_the_low_bytes() {
        let mut p = PackedArgs::new(&[Arg::I32(-1), Arg::F32(1.5), Arg::U64(u64::MAX), Arg::U32(7)]);
        assert_eq!(p.len(), 4);
        // SAFETY: each pointer points at one live u64 word of `p`.
        let words: Vec<u64> = p.pointers().iter().map(|&q| unsafe { *(q as *const u64) }).collect();
        assert_eq!(words, vec![0xffff_ffff, u64::from(1.5f32.to_bits()), u64::MAX, 7]);
    }

    #[test]
    fn blocks_are_clamped() {
        assert_eq!(blocks_for(0, 256, 100), 1);
        assert_eq!(blocks_for(1000, 256, 100), 4);
        assert_eq!(blocks_for(1 << 40, 1, 100), 100);
        assert_eq!(blocks_for(5, 0, 0), 1);
        assert!(Grid::linear(0, 32).is_empty() && !Grid::linear(1, 32).is_empty());
    }

    #[test]
    fn sizes_past_i32_are_unsupported_not_truncated() {
        assert_eq!(i32_of("op", "vendor.x", "x", 5).unwrap(), 5);
        let e = i32_of("op", "vendor.x", "x", 1 << 31).unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }) && e.to_string().contains("'x'"), "{e}");
        assert!(ctype("op", "x", DType::F64).is_err() && ctype("op", "x", DType::BF16).unwrap() == "bf16");
    }
}
