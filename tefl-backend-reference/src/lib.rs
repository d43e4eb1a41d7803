//! # tefl-backend-reference
//!
//! tefl's pure-Rust CPU backend (kind `reference`, impl id `reference.cpu`): every op of the
//! wave-1 catalogue, for f32, f16 and bf16 (half types are widened and accumulate in f32).
//! It is the CPU default and the last fallback for every device: the manager stages other
//! devices' tensors through host memory for it.
//!
//! Work is spread with rayon over rows, tiles and chunks; GEMM runs on a cache-blocked
//! AVX-512 kernel of our own (the `gemm` crate's kernels on CPUs without AVX-512), and the
//! elementwise loops (`kernels::vmath`) are compiled for AVX-512, AVX2 and x86-64's baseline,
//! the widest picked at run time; attention is tiled with an online softmax and never
//! allocates an sq×sk buffer. It is not the test oracle: the conformance tests compare it
//! with an independent f64 implementation in `tests/`.

pub mod kernels;
pub mod ops;
mod util;

/// The impl id every op registers.
pub const IMPL_ID: &str = "reference.cpu";

/// The backend name `TE_BACKEND=reference` (or `torch`) selects.
pub const BACKEND: &str = "reference";

pub use ops::OPS;

/// The reference backend needs nothing but the CPU.
pub fn availability() -> Result<(), String> {
    Ok(())
}
