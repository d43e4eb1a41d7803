//! The CUDA kernels, one Rust file and one `.cu` file per op family (FlagGems' `ops/`), and
//! their registrations under `vendor.nvidia`.

pub mod activation;
pub mod attention;
pub mod dropout;
pub mod gemm;
pub mod norm;
pub mod optimizer;
pub mod quantize;
pub mod rope;
pub mod softmax;

use std::sync::Arc;

use tefl_core::catalogue::*;
use tefl_core::{DType, Device, Error, Result, Tensor};

use crate::compiler::{self, Arg, Function, Grid, Source};

/// The C type name a kernel source uses for a dtype (`TX=bf16`).
pub(crate) fn cty(op: &'static str, arg: &'static str, d: DType) -> Result<&'static str> {
    Ok(match d {
        DType::F32 => "float",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => "u8",
        DType::I32 => "i32",
        other => {
            return Err(Error::DType { op, arg, got: other, expected: "f32, f16 or bf16".into() });
        }
    })
}

/// A CUDA tensor whose every element the caller's kernel writes (no zero fill).
pub(crate) fn empty(device: Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let bytes = numel
        .and_then(|n| n.checked_mul(dtype.size_in_bytes()))
        .ok_or_else(|| Error::Tensor(format!("shape {shape:?} overflows usize")))?;
    let buf = crate::runtime::global().alloc_uninit(device, bytes)?;
    Tensor::from_buffer(buf as Arc<dyn tefl_core::device::Buffer>, shape, dtype)
}

/// A zero-filled CUDA tensor (accumulators).
pub(crate) fn zeros(device: Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::zeros(shape, dtype, &device)
}

/// Per-device facts queried once: (arch string, SM count).
fn device_facts(device: Device) -> (&'static str, u32) {
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    static FACTS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<u32, (&'static str, u32)>>> =
        std::sync::OnceLock::new();
    let mut facts = FACTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    *facts.entry(device.ordinal).or_insert_with(|| {
        let arch = tefl_core::device::runtime(device.kind)
            .map(|rt| rt.arch(device.ordinal))
            .unwrap_or_else(|_| "unknown".into());
        let sms = crate::runtime::global()
            .context(device)
            .and_then(|c| {
                c.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                    .map_err(|e| crate::runtime::device_error(device, e))
            })
            .map_or(132, |n| n.max(1) as u32);
        // One string per device of the process, kept for its lifetime.
        (Box::leak(arch.into_boxed_str()), sms)
    })
}

/// The arch string of a device (`sm_90`).
pub(crate) fn arch(device: Device) -> &'static str {
    device_facts(device).0
}

/// The number of SMs of a device (for grid sizes of persistent kernels).
pub(crate) fn sm_count(device: Device) -> u32 {
    device_facts(device).1
}

/// A kernel source with a set of defines: compiled (once per device) and launched by name.
pub(crate) struct Kernel {
    device: Device,
    src: &'static Source,
    defines: Vec<(&'static str, String)>,
}

impl Kernel {
    /// `src` compiled with `defines` for `device`.
    pub(crate) fn new(device: Device, src: &'static Source, defines: Vec<(&'static str, String)>) -> Self {
        Kernel { device, src, defines }
    }

    /// The function `name` (compiled and loaded on first use).
    pub(crate) fn function(&self, name: &'static str) -> Result<Function> {
        compiler::function(self.device, self.src, &self.defines, name)
    }

    /// Queues `name` on the device's stream.
    pub(crate) fn launch(&self, name: &'static str, grid: Grid, args: &[Arg]) -> Result<()> {
        compiler::launch(self.device, self.function(name)?, grid, args)
    }
}

/// `i32` from a size, or a typed error naming the op when it does not fit.
pub(crate) fn i32_of(op: &'static str, what: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| unsupported(op, format!("'{what}': {v} exceeds the CUDA kernels' 32-bit index range")))
}

/// A valid call these kernels cannot serve (a size past their index range, tiles that do not
/// fit the device): the manager moves on to the next impl without counting a failure.
pub(crate) fn unsupported(op: &'static str, reason: String) -> Error {
    Error::Unsupported { op, impl_id: crate::IMPL_ID.to_string(), reason }
}

/// Blocks for `work` items of `per_block` each, capped for grid-stride kernels.
pub(crate) fn blocks_for(work: usize, per_block: usize, cap: u32) -> u32 {
    (work.div_ceil(per_block.max(1)) as u64).clamp(1, u64::from(cap)) as u32
}

/// Registers `vendor.nvidia` for each op: float ops accept f32/f16/bf16 as their primary
/// dtype; ops whose first tensor is not a float accept any.
macro_rules! nvidia {
    (floats { $($fop:ident => $fk:path;)* } any { $($aop:ident => $ak:path;)* }) => {
        $(
            tefl_core::register_impl! {
                op: $fop, impl_id: crate::IMPL_ID, kind: Vendor, vendor: crate::vendor::VENDOR, priority: 0,
                device: tefl_core::DeviceKind::CUDA, dtypes: [F32, F16, BF16], kernel: $fk,
                available: crate::kernels_available,
            }
        )*
        $(
            tefl_core::register_impl! {
                op: $aop, impl_id: crate::IMPL_ID, kind: Vendor, vendor: crate::vendor::VENDOR, priority: 0,
                device: tefl_core::DeviceKind::CUDA, dtypes: [], kernel: $ak,
                available: crate::kernels_available,
            }
        )*
        /// The ops this backend registers, by name.
        pub const OPS: &[&str] = &[$(<$fop as tefl_core::Op>::NAME,)* $(<$aop as tefl_core::Op>::NAME,)*];
    };
}

tefl_core::wave1_kernels!(nvidia);

/// Define sets covering every code path (the NVRTC compile test and cache warm-up).
pub fn compile_variants() -> Vec<(&'static Source, Vec<(&'static str, String)>)> {
    let mut v = Vec::new();
    v.extend(norm::compile_variants());
    v.extend(activation::compile_variants());
    v.extend(softmax::compile_variants());
    v.extend(dropout::compile_variants());
    v.extend(gemm::compile_variants());
    v.extend(attention::compile_variants());
    v.extend(rope::compile_variants());
    v.extend(optimizer::compile_variants());
    v.extend(quantize::compile_variants());
    v
}

#[cfg(test)]
mod tests {
    /// Compiles every kernel source for sm_80 and sm_90 with NVRTC when libnvrtc is present
    /// (no GPU needed; CI installs libnvrtc from the `nvidia-cuda-nvrtc` wheel), so a kernel
    /// that does not compile fails here rather than on the GPU machine.
    #[test]
    fn every_kernel_compiles_with_nvrtc() {
        if let Err(reason) = crate::compiler::nvrtc_available() {
            eprintln!("skipped: {reason}");
            return;
        }
        let mut failures = Vec::new();
        // TEFL_COMPILE_ONLY=attention,norm limits the test to those sources while iterating.
        let only = std::env::var("TEFL_COMPILE_ONLY").ok();
        let variants: Vec<_> = super::compile_variants()
            .into_iter()
            .filter(|(src, _)| only.as_deref().is_none_or(|o| o.split(',').any(|n| n == src.name)))
            .collect();
        for arch in ["sm_80", "sm_90"] {
            for (src, defines) in &variants {
                if let Err(e) = crate::compiler::compile(src, defines, arch) {
                    failures.push(format!("{arch} {defines:?}: {e}"));
                }
            }
        }
        assert!(failures.is_empty(), "{} of {} failed:\n{}", failures.len(), 2 * variants.len(), failures.join("\n"));
    }
}
