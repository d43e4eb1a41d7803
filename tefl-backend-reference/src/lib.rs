//! # tefl-backend-reference
//!
//! tefl's pure-Rust CPU backend (kind `reference`, impl ids `reference.cpu`): the CPU
//! default and the last fallback for every device (the manager stages other devices'
//! tensors through host memory for it).
//!
//! It registers no op yet: the op implementations (rayon over rows, f32 accumulation for
//! half types) come with the reference-backend issue, and until then the coverage table
//! lists no reference impl.

/// The backend name `TE_BACKEND=reference` (or `torch`) selects.
pub const BACKEND: &str = "reference";

/// The reference backend needs nothing but the CPU.
pub fn availability() -> Result<(), String> {
    Ok(())
}
