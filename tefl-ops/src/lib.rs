//! # tefl-ops
//!
//! Typed entry points for every op of tefl's catalogue, under TransformerEngine's names.
//! Each function takes the op's required arguments and returns a [`Call`]: builder methods
//! set the options (typed enums for layouts, masks, modes and epilogues), and
//! [`Call::call`] runs it on the process-wide manager ([`tefl_core::global`]) or
//! [`Call::call_with`] on one you pass. The manager validates the arguments (shape, dtype,
//! device) before dispatch, so bad input comes back as an error naming the argument.
//!
//! This crate also links the backends the enabled features ask for (`nvidia`, `amd`,
//! `vulkan`; the reference backend always), so their link-time registrations are kept.
//!
//! ```
//! use tefl_core::{DType, Tensor};
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [2, 2], DType::F32)?;
//! let g = Tensor::from_slice(&[1.0f32, 1.0], [2], DType::F32)?;
//! // Bad input is rejected before any impl runs:
//! let err = tefl_ops::rmsnorm_fwd(&x, &g, -1.0).call().unwrap_err();
//! assert!(err.to_string().contains("eps"));
//! // Good input is served by the best impl for the device (the CPU reference here):
//! let out = tefl_ops::rmsnorm_fwd(&x, &g, 1e-6).call()?;
//! assert_eq!(out.y.shape(), &[2, 2]);
//! # Ok::<(), tefl_core::Error>(())
//! ```

mod activation;
mod attention;
mod call;
mod gemm;
mod norm;
mod optimizer;
mod quantize;
mod softmax;

pub use activation::*;
pub use attention::*;
pub use call::Call;
pub use gemm::*;
pub use norm::*;
pub use optimizer::*;
pub use quantize::*;
pub use softmax::*;
pub use tefl_core::catalogue::{Activation, AdamMode, AmaxAlgo, AttnMask, AttnWindow, GemmEpilogue, QkvLayout};

#[cfg(feature = "amd")]
use tefl_backend_amd as _;
#[cfg(feature = "nvidia")]
use tefl_backend_nvidia as _;
use tefl_backend_reference as _;
#[cfg(feature = "vulkan")]
use tefl_backend_vulkan as _;

/// The backend crates linked into this build, by name (`reference` always).
pub fn linked_backends() -> Vec<&'static str> {
    // Naming one function of each crate keeps its object code, and with it the crate's
    // `inventory` registrations, in the final binary.
    type Availability = fn() -> Result<(), String>;
    #[allow(unused_mut)] // pushed to only when a backend feature is on
    let mut v: Vec<(&'static str, Availability)> =
        vec![(tefl_backend_reference::BACKEND, tefl_backend_reference::availability)];
    #[cfg(feature = "nvidia")]
    v.push((tefl_backend_nvidia::vendor::VENDOR, tefl_backend_nvidia::availability));
    #[cfg(feature = "amd")]
    v.push((tefl_backend_amd::vendor::VENDOR, tefl_backend_amd::availability));
    #[cfg(feature = "vulkan")]
    v.push((tefl_backend_vulkan::vendor::VENDOR, tefl_backend_vulkan::availability));
    let mut names: Vec<&'static str> = v.into_iter().map(|(n, f)| std::hint::black_box((n, f)).0).collect();
    names.sort();
    names
}
