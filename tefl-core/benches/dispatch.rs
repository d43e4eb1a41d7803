//! The cached dispatch path: `Manager::call` of trivial ops whose kernels do no work.
//! Goal (issue 2): under 50 ns per call on the 2-core development machine.

use std::hint::black_box;

use criterion::{Criterion, criterion_main};
use tefl_core::{BackendImplKind, DType, Manager, OpImpl, Prefer, Registry, SelectionPolicy, Tensor, declare_op};

declare_op! {
    /// A trivial op with one scalar argument.
    pub struct Nop = "bench_nop";
    /// Arguments.
    pub struct NopArgs {
        /// Echoed back.
        scalar v: u32,
    }
    /// Outputs.
    pub struct NopOut {
        /// The argument.
        scalar v: u32,
    }
    validate(a) { Ok(()) }
}

declare_op! {
    /// A trivial op with two tensor arguments (device agreement and dtype signature are computed).
    pub struct Touch = "bench_touch";
    /// Arguments.
    pub struct TouchArgs {
        /// First tensor.
        tensor x: Tensor,
        /// Second tensor.
        tensor y: Tensor,
    }
    /// Outputs.
    pub struct TouchOut {
        /// numel(x).
        scalar n: usize,
    }
    validate(a) { Ok(()) }
}

fn manager() -> Manager {
    let mut reg = Registry::new();
    for (id, kind, prio) in
        [("vendor.bench", BackendImplKind::Vendor, 100), ("reference.cpu", BackendImplKind::Reference, 0)]
    {
        reg.register_impl(OpImpl::new::<Nop>(id, kind, |_, a| Ok(NopOut { v: a.v })).vendor("bench").priority(prio))
            .unwrap();
        reg.register_impl(
            OpImpl::new::<Touch>(id, kind, |_, a| Ok(TouchOut { n: a.x.numel() })).vendor("bench").priority(prio),
        )
        .unwrap();
    }
    Manager::new(reg, SelectionPolicy::default().prefer(Prefer::Vendor))
}

fn bench(c: &mut Criterion) {
    let m = manager();
    let args = NopArgs { v: 7 };
    c.bench_function("dispatch/call_scalar_op", |b| b.iter(|| m.call::<Nop>(black_box(&args)).unwrap().v));
    let x = Tensor::from_slice(&[1.0f32; 16], [4, 4], DType::BF16).unwrap();
    let y = Tensor::from_slice(&[1.0f32; 4], [4], DType::F32).unwrap();
    let targs = TouchArgs { x, y };
    c.bench_function("dispatch/call_two_tensor_op", |b| b.iter(|| m.call::<Touch>(black_box(&targs)).unwrap().n));
}

/// criterion's group of this file's benchmarks (its macro makes a public function).
mod group {
    use criterion::criterion_group;
    criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
