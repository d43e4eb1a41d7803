//! The reference kernels, one file per op family, and their registrations.

pub mod activation;
pub mod attention;
pub mod dropout;
pub mod gemm;
pub mod norm;
pub mod optimizer;
pub mod quantize;
pub mod rope;
pub mod softmax;

use tefl_core::catalogue::*;

/// Registers `reference.cpu` for each op: float ops accept f32/f16/bf16 as their primary
/// dtype; ops whose first tensor is not a float (FP8 codes, the optimizers' noop flag) accept any.
macro_rules! reference {
    (floats { $($fop:ident => $fk:path;)* } any { $($aop:ident => $ak:path;)* }) => {
        $(
            tefl_core::register_impl! {
                op: $fop, impl_id: crate::IMPL_ID, kind: Reference, priority: 0,
                device: tefl_core::DeviceKind::CPU, dtypes: [F32, F16, BF16], kernel: $fk,
            }
        )*
        $(
            tefl_core::register_impl! {
                op: $aop, impl_id: crate::IMPL_ID, kind: Reference, priority: 0,
                device: tefl_core::DeviceKind::CPU, dtypes: [], kernel: $ak,
            }
        )*
        /// The ops this backend registers, by name.
        pub const OPS: &[&str] = &[$(<$fop as tefl_core::Op>::NAME,)* $(<$aop as tefl_core::Op>::NAME,)*];
    };
}

tefl_core::wave1_kernels!(reference);
