//! # tefl
//!
//! One dispatch layer for transformer-training kernels from many vendors: typed ops
//! ([`ops`]), routed per call to the implementation the selection policy picks
//! (`TE_FL_PREFER`, `TE_FL_PER_OP`, ... — see DESIGN.md), with fallback, strict mode,
//! counters and [`explain`].
//!
//! Features `nvidia`, `amd` and `vulkan` link those backends; the CPU reference backend
//! is always linked. Every feature builds on a machine without GPU drivers, and a missing
//! driver makes that backend "unavailable", never a crash.
//!
//! ```
//! let backends = tefl::list_backends()?;
//! assert!(backends.iter().any(|b| b.name == "reference" && b.available));
//! # Ok::<(), tefl::Error>(())
//! ```

pub use tefl_core::*;
pub use tefl_ops as ops;
