//! The shared warm-ups (norm forwards, RoPE, activations) start compiling exactly what the call
//! they stand for compiles: the variants its launches load and those its first use starts
//! ahead (a forward's backward), no more. A recording target on a host-memory device kind of
//! its own ("warmgpu") compiles and runs nothing; it notes which variant each launch, and each
//! compile ahead, names.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tefl_core::catalogue::{
    ActArgs, ClampedSwigluArgs, DActArgs, LayerNormFwdArgs, QkvLayout, RmsNormFwdArgs, RopeArgs,
};
use tefl_core::device::{self, Buffer, DeviceRuntime};
use tefl_core::tuning::TuneTable;
use tefl_core::{DType, Device, DeviceKind, KernelCtx, Result, Tensor};
use tefl_gpu::simt::{activation, norm, rope};
use tefl_gpu::target::GpuTarget;
use tefl_gpu::{Arg, Grid, Variant};

const KIND: DeviceKind = DeviceKind::new("warmgpu");
const DEV: Device = Device::new(KIND, 0);

/// Host memory under a device kind of its own.
struct HostRuntime;

impl DeviceRuntime for HostRuntime {
    fn kind(&self) -> DeviceKind {
        KIND
    }
    fn device_count(&self) -> usize {
        1
    }
    fn name(&self, _: u32) -> String {
        "Warm-up test GPU".into()
    }
    fn arch(&self, _: u32) -> String {
        "warm_1".into()
    }
    fn alloc(&self, _: Device, bytes: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(HostBuffer(device::host_buffer(&vec![0; bytes])?)))
    }
    fn copy_from_host(&self, dst: &dyn Buffer, src: &[u8]) -> Result<()> {
        device::runtime(DeviceKind::CPU)?.copy_from_host(inner(dst), src)
    }
    fn copy_to_host(&self, src: &dyn Buffer, dst: &mut [u8]) -> Result<()> {
        device::runtime(DeviceKind::CPU)?.copy_to_host(inner(src), dst)
    }
    fn synchronize(&self, _: Device) -> Result<()> {
        Ok(())
    }
    fn device_info(&self, ordinal: u32) -> Result<device::DeviceInfo> {
        let mut i = device::DeviceInfo::basic(Device::new(KIND, ordinal), self.name(ordinal), self.arch(ordinal));
        i.compute_units = 4;
        i.warp_size = 32;
        i.shared_memory_per_block_optin = 100 * 1024;
        Ok(i)
    }
}

struct HostBuffer(Arc<dyn Buffer>);

impl Buffer for HostBuffer {
    fn device(&self) -> Device {
        DEV
    }
    fn len_bytes(&self) -> usize {
        self.0.len_bytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn inner(b: &dyn Buffer) -> &dyn Buffer {
    &*b.as_any().downcast_ref::<HostBuffer>().expect("warmgpu memory").0
}

/// What the target was asked for since the last [`Recorder::take`].
#[derive(Default)]
struct Seen {
    launched: BTreeSet<String>,
    ahead: BTreeSet<String>,
}

/// The recording target: a variant is loaded once launched.
struct Recorder(Mutex<Seen>);

fn name(v: &Variant) -> String {
    format!("{}:{}", v.entries.join(","), v.defines.key())
}

impl Recorder {
    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn take(&self) -> Seen {
        std::mem::take(&mut *self.seen())
    }
}

impl GpuTarget for Recorder {
    fn device_kind(&self) -> DeviceKind {
        KIND
    }
    fn launch(&self, _: Device, variant: &Variant, entry: &'static str, _: Grid, _: &[Arg]) -> Result<()> {
        assert!(variant.has_entry(entry), "{entry} is not an entry of {}", name(variant));
        self.seen().launched.insert(name(variant));
        Ok(())
    }
    fn compile_ahead(&self, _: Device, variant: &Variant) {
        self.seen().ahead.insert(name(variant));
    }
    fn loaded(&self, _: Device, variant: &Variant) -> bool {
        self.seen().launched.contains(&name(variant))
    }
    fn address(&self, t: &Tensor) -> Result<u64> {
        Ok(Arc::as_ptr(t.buffer()) as *const u8 as u64)
    }
    fn tune_table(&self, _: Device) -> Result<Arc<TuneTable>> {
        Ok(Arc::new(TuneTable::parse(tefl_gpu::tune::GPU_DEFAULTS.text, "gpu defaults")?))
    }
}

static RECORDER: Recorder = Recorder(Mutex::new(Seen { launched: BTreeSet::new(), ahead: BTreeSet::new() }));
tefl_gpu::register_gpu_target!(&RECORDER);

/// The one test's setup (the runtime registers once per process).
fn setup() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| device::register_device_runtime(Arc::new(HostRuntime)).expect("warmgpu registers once"));
}

fn on_device(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::zeros(shape, dtype, &DEV).unwrap()
}

/// Runs `warm`, then `call` (on a fresh recorder), and checks the warm-up asked for every
/// variant the call launched or started ahead, and for nothing else.
fn same_builds(
    what: &str,
    warm: impl FnOnce(&KernelCtx<'_>) -> Result<()>,
    call: impl FnOnce(&KernelCtx<'_>) -> Result<()>,
) {
    let ctx = KernelCtx { device: DEV, op: "warm-up test", impl_id: "test.warmgpu" };
    RECORDER.take();
    warm(&ctx).unwrap_or_else(|e| panic!("{what}: warm-up failed: {e}"));
    let warmed = RECORDER.take();
    assert!(warmed.launched.is_empty(), "{what}: a warm-up launched {:?}", warmed.launched);
    call(&ctx).unwrap_or_else(|e| panic!("{what}: call failed: {e}"));
    let called = RECORDER.take();
    let wanted: BTreeSet<String> = called.launched.union(&called.ahead).cloned().collect();
    assert!(!called.launched.is_empty(), "{what}: the call launched nothing");
    assert_eq!(warmed.ahead, wanted, "{what}: the warm-up's builds differ from the call's");
}

#[test]
fn warm_ups_start_the_builds_their_calls_compile() {
    setup();
    for dtype in [DType::BF16, DType::F32] {
        // Norm forwards (the backward variants their first calls start ahead included).
        let (x, gamma, beta) = (on_device(&[6, 256], dtype), on_device(&[256], dtype), on_device(&[256], dtype));
        let rms = RmsNormFwdArgs {
            x: x.clone(),
            gamma: gamma.clone(),
            eps: 1e-5,
            zero_centered_gamma: false,
            out_dtype: dtype,
            scale: None,
        };
        same_builds("rmsnorm_fwd", |c| norm::warmup_rmsnorm_fwd(c, &rms), |c| norm::rmsnorm_fwd(c, &rms).map(drop));
        let ln =
            LayerNormFwdArgs { x, gamma, beta, eps: 1e-5, zero_centered_gamma: true, out_dtype: dtype, scale: None };
        same_builds("layernorm_fwd", |c| norm::warmup_layernorm_fwd(c, &ln), |c| norm::layernorm_fwd(c, &ln).map(drop));
        // RoPE: the warp kernel (d 64) and the scalar one (10 of 12 dims rotated); the forward
        // starts its backward ahead.
        for (d, d_rot) in [(64, 64), (12, 10)] {
            let r = RopeArgs {
                x: on_device(&[2, 3, 4, d], dtype),
                freqs: on_device(&[3, d_rot], DType::F32),
                cu_seqlens: None,
                start_positions: None,
                layout: QkvLayout::Bshd,
                interleaved: false,
            };
            same_builds(
                "fused_rope_forward",
                |c| rope::warmup_rope_forward(c, &r),
                |c| rope::fused_rope_forward(c, &r).map(drop),
            );
            same_builds(
                "fused_rope_backward",
                |c| rope::warmup_rope_backward(c, &r),
                |c| rope::fused_rope_backward(c, &r).map(drop),
            );
        }
        // Activations: a forward's warm-up covers its backward's build (a gradient of x's dtype).
        let a = ActArgs { x: on_device(&[5, 128], dtype) };
        same_builds(
            "gelu",
            |c| activation::warmup_gelu(c, &a),
            |c| {
                let y = activation::gelu(c, &a)?.y;
                activation::dgelu(c, &DActArgs { grad: y, input: a.x.clone() }).map(drop)
            },
        );
        same_builds(
            "swiglu",
            |c| activation::warmup_swiglu(c, &a),
            |c| {
                let y = activation::swiglu(c, &a)?.y;
                activation::dswiglu(c, &DActArgs { grad: y, input: a.x.clone() }).map(drop)
            },
        );
        let cs = ClampedSwigluArgs { x: a.x.clone(), limit: 7.0, alpha: 1.702 };
        same_builds(
            "clamped_swiglu",
            |c| activation::warmup_clamped_swiglu(c, &cs),
            |c| activation::clamped_swiglu(c, &cs).map(drop),
        );
    }
}
