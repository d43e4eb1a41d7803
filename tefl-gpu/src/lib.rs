//! # tefl-gpu
//!
//! The host side every GPU backend shares, with no driver in it: a vendor crate (CUDA, HIP)
//! adds only its runtime (memory, streams, the launch call), its compiler binding and its
//! op files, which build [`Variant`]s and launch them.
//!
//! - [`variant`]: a kernel source plus the defines of one variant, and the kernel entry
//!   points it may launch: the *launch plan* that both the launch and the compile-every-variant
//!   test use;
//! - [`rtc`]: the run-time compiler trait ([`RtcCompiler`]: NVRTC, hiprtc) with the on-disk
//!   binary cache and the in-memory per-device module cache;
//! - [`launch`]: [`Grid`], kernel arguments and their packing, `blocks_for`, 32-bit index checks;
//! - [`target`]: the [`GpuTarget`](target::GpuTarget) a backend registers per device kind
//!   (launch, device addresses, tune table);
//! - [`simt`]: the host side of the SIMT kernels (norms, softmax, activations, RoPE, dropout,
//!   FP8 quantize, multi-tensor optimizers), written once and registered by every GPU backend;
//! - [`blaslt`]: `generic_gemm` through a vendor BLAS-Lt library (cuBLASLt, hipBLASLt): the
//!   column-major view, fused or finished epilogues, plan caching; a backend binds the calls;
//! - [`tune`]: tune configs layered arch family → vendor → GPU default
//!   (FlagGems' `configs_loader`), the row and elementwise heuristics and the autotuner's
//!   measurements through `tefl_core`'s device runtime.
//!
//! Device facts (arch, family, compute units, shared memory) come from
//! [`tefl_core::device::info`], looked up once per device.

pub mod blaslt;
pub mod launch;
pub mod rtc;
pub mod simt;
pub mod target;
pub mod tune;
pub mod variant;

#[doc(hidden)]
pub use inventory;

pub use launch::{Arg, Grid, PackedArgs, blocks_for, ctype, i32_of};
pub use rtc::{ModuleCache, RtcCompiler};
pub use tefl_kernels::{Source, Target};
pub use tune::{ElementwiseConfig, RowConfig, TuneConfigs, TuneFile};
pub use variant::{Defines, Variant, full_source};
