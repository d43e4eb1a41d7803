//! Hand-written compute kernels the ops build on.

pub mod sgemm;
pub mod vmath;
