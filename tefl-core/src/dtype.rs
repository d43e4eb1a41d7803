//! Element types.

use std::fmt;

pub use half::{bf16, f16};

/// The element type of a tensor.
///
/// ```
/// use tefl_core::DType;
/// assert_eq!(DType::BF16.size_in_bytes(), 2);
/// assert_eq!("bf16".parse::<DType>().unwrap(), DType::BF16);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DType {
    /// IEEE binary32.
    F32 = 1,
    /// IEEE binary16.
    F16 = 2,
    /// bfloat16.
    BF16 = 3,
    /// OCP FP8 E4M3 (max 448, no infinities).
    F8E4M3 = 4,
    /// OCP FP8 E5M2 (max 57344, IEEE-like infinities).
    F8E5M2 = 5,
    /// 32-bit signed integer.
    I32 = 6,
    /// 64-bit signed integer.
    I64 = 7,
    /// Unsigned byte (masks).
    U8 = 8,
    /// Boolean stored as one byte (0 or 1).
    Bool = 9,
    /// IEEE binary64, only where an op needs it.
    F64 = 10,
}

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
        DType::F64,
    ];

    /// The float types every float op supports.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::U8 | DType::Bool => 1,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The short name used in logs, configs and parsing (`f32`, `bf16`, `f8e4m3`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::Bool => "bool",
            DType::F64 => "f64",
        }
    }

    /// True for f32, f16, bf16 and f64.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// True for the two FP8 formats.
    pub const fn is_fp8(self) -> bool {
        matches!(self, DType::F8E4M3 | DType::F8E5M2)
    }

    /// A small stable code (used in dtype signatures and cache keys).
    pub const fn code(self) -> u8 {
        self as u8
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = crate::Error;

    /// Parses `f32`, `f16`/`fp16`, `bf16`, `f8e4m3`/`fp8e4m3`/`e4m3`, `f8e5m2`/`fp8e5m2`/`e5m2`,
    /// `i32`, `i64`, `u8`, `bool`, `f64` (case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        Ok(match t.as_str() {
            "f32" | "fp32" | "float32" => DType::F32,
            "f16" | "fp16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "f8e4m3" | "fp8e4m3" | "e4m3" => DType::F8E4M3,
            "f8e5m2" | "fp8e5m2" | "e5m2" => DType::F8E5M2,
            "i32" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            "u8" | "uint8" => DType::U8,
            "bool" => DType::Bool,
            "f64" | "fp64" | "float64" => DType::F64,
            _ => {
                return Err(crate::Error::Tensor(format!(
                    "unknown dtype {s:?} (expected one of f32, f16, bf16, f8e4m3, f8e5m2, i32, i64, u8, bool, f64)"
                )));
            }
        })
    }
}

/// A Rust type that can be the element of a tensor.
///
/// Implemented for `f32`, `f64`, [`struct@f16`], [`bf16`], `i32`, `i64` and `u8`. Bool tensors and
/// FP8 tensors carry their bytes as `u8` (see [`crate::fp8`] for the FP8 codes).
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The dtype this Rust type stores.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i32 => I32, i64 => I64, u8 => U8);

/// A float element: converts to and from `f32` (half types accumulate in f32).
pub trait FloatElement: Element + Copy {
    /// Widen to f32.
    fn to_f32(self) -> f32;
    /// Narrow from f32, rounding to nearest even.
    fn from_f32(v: f32) -> Self;
}

impl FloatElement for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl FloatElement for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl FloatElement for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert!("f33".parse::<DType>().is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(DType::F32.size_in_bytes(), 4);
        assert_eq!(DType::F8E5M2.size_in_bytes(), 1);
        assert_eq!(DType::I64.size_in_bytes(), 8);
    }
}
