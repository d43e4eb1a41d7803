//! Every op family that accepts empty tensors, called on the CPU (and on the first Vulkan
//! device where the `vulkan` feature is built and one exists: lavapipe in CI) with every shape
//! over 0, 1, 3 and a dimension no memory holds (2^40, 2^62, usize::MAX) that has both:
//! the tensors exist (no elements), so whatever the op sizes from the other dimensions (an
//! output, a column sum, per-row statistics, scratch) is what meets those sizes. A call
//! returns outputs or an error naming an argument or the allocation; it never panics, and an
//! abort (an infallible allocation of that size) ends this test binary.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};

use tefl_core::catalogue::*;
use tefl_core::{DType, Device, Result, Tensor};

const HUGE: [usize; 3] = [1 << 40, 1 << 62, usize::MAX];

/// Calls that returned outputs (the sweep reaches kernels, not only validation).
static RETURNED: AtomicUsize = AtomicUsize::new(0);

fn zeros(shape: &[usize], dtype: DType, dev: &Device) -> Tensor {
    Tensor::zeros(shape, dtype, dev).unwrap_or_else(|e| panic!("{shape:?}: {e}"))
}

fn one(dev: &Device) -> Tensor {
    Tensor::from_slice(&[1.0f32], [1], DType::F32).and_then(|t| t.to_device(dev)).unwrap()
}

/// Every shape of `rank` over the dimensions 0, 1, 3 and `h` that has a 0 and an `h`.
fn placements(rank: usize, h: usize) -> Vec<Vec<usize>> {
    let dims = [0, 1, 3, h];
    (0..dims.len().pow(rank as u32))
        .map(|mut code| {
            (0..rank)
                .map(|_| {
                    let d = dims[code % dims.len()];
                    code /= dims.len();
                    d
                })
                .collect::<Vec<_>>()
        })
        .filter(|s| s.contains(&0) && s.contains(&h))
        .collect()
}

/// Runs one call with panics caught; fails unless it returned or its error names a culprit.
/// Returns what the call returned, if it did.
fn check<T>(what: &str, call: impl FnOnce() -> Result<T>) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!("{what}: panicked: {msg:?}")
        }
        Ok(Ok(out)) => {
            RETURNED.fetch_add(1, Ordering::Relaxed);
            Some(out)
        }
        Ok(Err(e)) => {
            assert!(tefl_tests::names_the_culprit(&e), "{what}: error naming nothing: {e:?}");
            None
        }
    }
}

#[test]
fn empty_tensors_with_huge_dimensions_never_panic_or_abort() {
    sweep(&Device::CPU);
}

/// The same on the first Vulkan device (lavapipe in CI), where there is one.
#[cfg(feature = "vulkan")]
#[test]
fn empty_tensors_with_huge_dimensions_never_panic_or_abort_on_vulkan() {
    let dev = Device::new(tefl_core::DeviceKind::VULKAN, 0);
    match Tensor::zeros([1], DType::F32, &dev) {
        Ok(_) => sweep(&dev),
        Err(e) => eprintln!("no Vulkan device, skipped: {e}"),
    }
}

fn sweep(dev: &Device) {
    let m = tefl_tests::manager();
    let f32s = |shape: &[usize]| zeros(shape, DType::F32, dev);
    for h in HUGE {
        for s in placements(2, h).into_iter().chain(placements(3, h)) {
            // (Every such tensor exists: a shape with a 0 holds no elements, whatever its other
            // dimensions multiply to.)
            let x = f32s(&s);
            let n = *s.last().unwrap();
            let rows_shape: Vec<usize> = s[..s.len() - 1].to_vec();
            // Norms: gamma [n] exists only when n is 0 or small.
            let g = if n <= 64 { f32s(&[n]) } else { f32s(&[1]) };
            let tag = |op: &str| format!("{op} x {s:?}");
            check(&tag("rmsnorm_fwd"), || tefl_ops::rmsnorm_fwd(&x, &g, 1e-5).call_with(m));
            check(&tag("layernorm_fwd"), || tefl_ops::layernorm_fwd(&x, &g, &g, 1e-5).call_with(m));
            // Per-row statistics exist when there are no rows (else they are too large to make).
            if let Ok(stats) = Tensor::zeros(&rows_shape, DType::F32, dev) {
                check(&tag("rmsnorm_bwd"), || tefl_ops::rmsnorm_bwd(&x, &x, &stats, &g).call_with(m));
                check(&tag("rmsnorm_bwd_add"), || tefl_ops::rmsnorm_bwd_add(&x, &x, &stats, &g, &x).call_with(m));
                check(&tag("layernorm_bwd"), || tefl_ops::layernorm_bwd(&x, &x, &stats, &stats, &g).call_with(m));
            }
            let scale = one(dev);
            check(&tag("rmsnorm_fwd fp8"), || {
                tefl_ops::rmsnorm_fwd(&x, &g, 1e-5).fp8_output(DType::F8E4M3, &scale).call_with(m)
            });
            // Activations, forward, backward and with the bias gradient.
            check(&tag("gelu"), || tefl_ops::gelu(&x).call_with(m));
            check(&tag("swiglu"), || tefl_ops::swiglu(&x).call_with(m));
            check(&tag("clamped_swiglu"), || tefl_ops::clamped_swiglu(&x).call_with(m));
            check(&tag("dgelu"), || tefl_ops::dgelu(&x, &x).call_with(m));
            check(&tag("dswiglu"), || tefl_ops::dswiglu(&x, &x).call_with(m));
            check(&tag("clamped_dswiglu"), || tefl_ops::clamped_dswiglu(&x, &x).call_with(m));
            check(&tag("dbias_dgelu"), || tefl_ops::dbias_dgelu(&x, &x).call_with(m));
            check(&tag("dbias_dsilu"), || tefl_ops::dbias_dsilu(&x, &x).call_with(m));
            // Softmax family.
            check(&tag("scaled_softmax_forward"), || tefl_ops::scaled_softmax_forward(&x, 0.5).call_with(m));
            let mask = zeros(&s, DType::U8, dev);
            check(&tag("scaled_masked_softmax_forward"), || {
                tefl_ops::scaled_masked_softmax_forward(&x, &mask, 0.5).call_with(m)
            });
            check(&tag("scaled_upper_triang_masked_softmax_forward"), || {
                tefl_ops::scaled_upper_triang_masked_softmax_forward(&x, 0.5).call_with(m)
            });
            check(&tag("scaled_aligned_causal_masked_softmax_forward"), || {
                tefl_ops::scaled_aligned_causal_masked_softmax_forward(&x, 0.5).call_with(m)
            });
            // FP8 and dropout.
            check(&tag("quantize"), || tefl_ops::quantize(&x, DType::F8E4M3, &scale).call_with(m));
            check(&tag("bgrad_quantize"), || tefl_ops::bgrad_quantize(&x, DType::F8E4M3, &scale).call_with(m));
            check(&tag("compute_amax"), || tefl_ops::compute_amax(&x).call_with(m));
            let q = zeros(&s, DType::F8E4M3, dev);
            check(&tag("dequantize"), || tefl_ops::dequantize(&q, &scale).call_with(m));
            check(&tag("fp8_transpose"), || tefl_ops::fp8_transpose(&q).call_with(m));
            check(&tag("dropout_fwd"), || tefl_ops::dropout_fwd(&x, 0.5, 1, 2).call_with(m));
            check(&tag("dropout_bwd"), || tefl_ops::dropout_bwd(&x, &mask, 0.5).call_with(m));
            // Multi-tensor optimizers over a list holding this tensor.
            let noop = zeros(&[1], DType::I32, dev);
            let list = [x.clone()];
            let (p, mm, v) = ([f32s(&s)], [f32s(&s)], [f32s(&s)]);
            check(&tag("multi_tensor_l2norm"), || {
                tefl_ops::multi_tensor_l2norm(&noop, &list).per_tensor(true).call_with(m)
            });
            check(&tag("multi_tensor_scale"), || tefl_ops::multi_tensor_scale(&noop, &list, &p, 2.0).call_with(m));
            check(&tag("multi_tensor_adam"), || {
                tefl_ops::multi_tensor_adam(&noop, &list, &p, &mm, &v, 1e-3).step(1).call_with(m)
            });
            check(&tag("multi_tensor_sgd"), || tefl_ops::multi_tensor_sgd(&noop, &list, &p, &mm, 1e-3).call_with(m));
        }
        // RoPE and attention on [b, s, h, d] with an empty batch or sequence (b or s 0); an
        // empty head row (h or d 0) is a shape error.
        for s in placements(4, h) {
            let x = zeros(&s, DType::BF16, dev);
            let tag = |op: &str| format!("{op} x {s:?}");
            let freqs = f32s(&[4, 8]);
            for layout in [QkvLayout::Bshd, QkvLayout::Sbhd] {
                check(&tag("fused_rope_forward"), || {
                    tefl_ops::fused_rope_forward(&x, &freqs).layout(layout).call_with(m)
                });
                check(&tag("fused_rope_backward"), || {
                    tefl_ops::fused_rope_backward(&x, &freqs).layout(layout).call_with(m)
                });
                let fwd = || tefl_ops::fused_attn_fwd(&x, &x, &x).layout(layout).mask(AttnMask::Causal).call_with(m);
                if let Some(out) = check(&tag("fused_attn_fwd"), fwd) {
                    check(&tag("fused_attn_bwd"), || {
                        tefl_ops::fused_attn_bwd(&x, &x, &x, &out.o, &x, &out.softmax_lse)
                            .layout(layout)
                            .mask(AttnMask::Causal)
                            .call_with(m)
                    });
                }
            }
        }
        // GEMM: every (m, k, n) with one huge and one zero, under every epilogue.
        for s in placements(3, h) {
            let (mm_, k, n) = (s[0], s[1], s[2]);
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                // Operands that would hold elements are too large to make: not this case.
                let a = Tensor::zeros(if ta { [k, mm_] } else { [mm_, k] }, DType::F32, dev);
                let b = Tensor::zeros(if tb { [n, k] } else { [k, n] }, DType::F32, dev);
                let (Ok(a), Ok(b)) = (a, b) else { continue };
                let bias = f32s(&[if n <= 64 { n } else { 1 }]);
                for ep in [GemmEpilogue::None, GemmEpilogue::Bias, GemmEpilogue::Gelu, GemmEpilogue::BiasGrad] {
                    let what = format!("generic_gemm m {mm_} k {k} n {n} ta {ta} tb {tb} {ep:?}");
                    check(&what, || {
                        let mut c = tefl_ops::generic_gemm(&a, &b).transa(ta).transb(tb).epilogue(ep);
                        if ep.needs_bias() {
                            c = c.bias(&bias);
                        }
                        c.call_with(m)
                    });
                }
                let what = format!("grouped_gemm m {mm_} k {k} n {n} ta {ta} tb {tb}");
                check(&what, || {
                    tefl_ops::grouped_gemm(std::slice::from_ref(&a), std::slice::from_ref(&b))
                        .transa(ta)
                        .transb(tb)
                        .call_with(m)
                });
            }
        }
    }
    assert!(RETURNED.load(Ordering::Relaxed) > 100, "{} calls returned", RETURNED.load(Ordering::Relaxed));
}
