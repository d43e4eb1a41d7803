//! What `DeviceRuntime` offers beyond memory and copies: fills (a cache flush's too),
//! uninitialised allocations, same-device copies, device facts looked up once, and queues
//! handed in by the caller. A minimal runtime ("fakegpu", host memory behind the trait's
//! defaults) shows the defaults work for a backend that implements only the required methods.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tefl_core::catalogue::{
    AttnFwdArgs, AttnFwdOut, AttnMask, FusedAttnFwd, MaxSeqlen, QkvLayout, attn_geometry, attn_geometry_bounded,
};
use tefl_core::device::{self, Buffer, DeviceRuntime};
use tefl_core::{
    BackendImplKind, DType, Device, DeviceKind, Error, Manager, OpImpl, Registry, Result, SelectionPolicy, Tensor,
};

const FAKE: DeviceKind = DeviceKind::new("fakegpu");

/// Host memory presented as a device of its own kind, counting its copies to the host.
struct FakeBuffer(Arc<dyn Buffer>, AtomicUsize);

impl Buffer for FakeBuffer {
    fn device(&self) -> Device {
        Device::new(FAKE, 0)
    }
    fn len_bytes(&self) -> usize {
        self.0.len_bytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[derive(Default)]
struct FakeRuntime {
    uploads: AtomicUsize,
    downloads: AtomicUsize,
    infos: AtomicUsize,
}

fn inner(b: &dyn Buffer) -> Result<&dyn Buffer> {
    fake_buffer(b).map(|f| &*f.0)
}

fn fake_buffer(b: &dyn Buffer) -> Result<&FakeBuffer> {
    b.as_any().downcast_ref::<FakeBuffer>().ok_or_else(|| Error::Tensor("not fakegpu memory".into()))
}

impl DeviceRuntime for FakeRuntime {
    fn kind(&self) -> DeviceKind {
        FAKE
    }
    fn device_count(&self) -> usize {
        1
    }
    fn name(&self, _: u32) -> String {
        "Fake GPU".into()
    }
    fn arch(&self, _: u32) -> String {
        "fake_1".into()
    }
    fn alloc(&self, _: Device, bytes: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(FakeBuffer(device::host_buffer(&vec![0xAB; bytes])?, AtomicUsize::new(0))))
    }
    fn copy_from_host(&self, dst: &dyn Buffer, src: &[u8]) -> Result<()> {
        self.uploads.fetch_add(1, Ordering::SeqCst);
        device::runtime(DeviceKind::CPU)?.copy_from_host(inner(dst)?, src)
    }
    fn copy_to_host(&self, src: &dyn Buffer, dst: &mut [u8]) -> Result<()> {
        self.downloads.fetch_add(1, Ordering::SeqCst);
        fake_buffer(src)?.1.fetch_add(1, Ordering::SeqCst);
        device::runtime(DeviceKind::CPU)?.copy_to_host(inner(src)?, dst)
    }
    fn synchronize(&self, _: Device) -> Result<()> {
        Ok(())
    }
    fn accepts_external_queues(&self) -> bool {
        true
    }
    fn device_info(&self, ordinal: u32) -> Result<device::DeviceInfo> {
        self.infos.fetch_add(1, Ordering::SeqCst);
        let mut i = device::DeviceInfo::basic(Device::new(FAKE, ordinal), self.name(ordinal), self.arch(ordinal));
        i.compute_units = 7;
        i.warp_size = 64;
        Ok(i)
    }
}

fn fake() -> Arc<FakeRuntime> {
    static RT: std::sync::OnceLock<Arc<FakeRuntime>> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        let rt = Arc::new(FakeRuntime::default());
        device::register_device_runtime(rt.clone()).expect("fakegpu registers once");
        rt
    })
    .clone()
}

#[test]
fn zeros_fill_on_the_device_and_uninit_does_not() {
    let rt = fake();
    let dev = Device::new(FAKE, 0);
    let z = Tensor::zeros([3, 5], DType::F32, &dev).unwrap();
    assert_eq!(z.to_bytes().unwrap(), vec![0u8; 60], "alloc gives 0xAB bytes: zeros must fill");
    let u = Tensor::uninit([4], DType::BF16, &dev).unwrap();
    assert_eq!(u.to_bytes().unwrap(), vec![0xAB; 8], "uninit skips the fill (the default alloc_uninit is alloc)");
    rt.fill(&**u.buffer(), 0x3C).unwrap();
    assert_eq!(u.to_bytes().unwrap(), vec![0x3C; 8]);
    // A cache flush (bench's) overwrites its scratch buffer: by default with zeros, also through
    // the registry's wrapper of the runtime.
    device::runtime(FAKE).unwrap().flush_cache(&**u.buffer()).unwrap();
    assert_eq!(u.to_bytes().unwrap(), vec![0u8; 8]);
}

#[test]
fn same_device_copies_stay_on_the_device_side() {
    let _ = fake();
    let dev = Device::new(FAKE, 0);
    let src = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3], DType::F32).unwrap().to_device(&dev).unwrap();
    let dst = Tensor::zeros([3], DType::F32, &dev).unwrap();
    dst.copy_from(&src).unwrap();
    assert_eq!(dst.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    let wrong = Tensor::zeros([4], DType::F32, &dev).unwrap();
    assert!(wrong.copy_from(&src).is_err(), "sizes must match");
    // The CPU runtime's own device copy.
    let a = Tensor::from_slice(&[4.0f32, 5.0], [2], DType::F32).unwrap();
    let b = Tensor::zeros([2], DType::F32, &Device::CPU).unwrap();
    b.copy_from(&a).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![4.0, 5.0]);
}

#[test]
fn device_info_is_looked_up_once_and_bad_ordinals_are_errors() {
    let rt = fake();
    let dev = Device::new(FAKE, 0);
    let a = device::info(dev).unwrap();
    let b = device::info(dev).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!((a.compute_units, a.warp_size, a.name.as_str(), a.arch.as_str()), (7, 64, "Fake GPU", "fake_1"));
    assert_eq!(rt.infos.load(Ordering::SeqCst), 1);
    let e = device::info(Device::new(FAKE, 3)).unwrap_err();
    assert!(matches!(e, Error::DeviceUnavailable { .. }) && e.to_string().contains("fakegpu:3"), "{e}");
    let cpu = device::info(Device::CPU).unwrap();
    assert!(cpu.compute_units >= 1);
}

#[test]
fn queues_nest_per_device_and_thread() {
    let rt = fake();
    let (d0, cpu) = (Device::new(FAKE, 0), Device::CPU);
    assert_eq!(device::current_queue(d0), None);
    assert!(!rt.queue(d0).unwrap().external);
    assert!(rt.accepts_external_queues());
    device::with_queue(d0, 0x10, || {
        assert_eq!(device::current_queue(d0).map(|q| q.handle), Some(0x10));
        assert_eq!(device::current_queue(cpu), None, "a queue belongs to its device");
        device::with_queue(d0, 0x20, || {
            assert_eq!(rt.queue(d0).unwrap().handle, 0x20);
            // Another thread does not see this thread's queue.
            std::thread::scope(|s| {
                s.spawn(|| assert_eq!(device::current_queue(d0), None));
            });
        })
        .unwrap();
        assert_eq!(device::current_queue(d0).map(|q| q.handle), Some(0x10));
    })
    .unwrap();
    assert_eq!(device::current_queue(d0), None);
    // A panic inside the scope still pops it.
    let r = std::panic::catch_unwind(|| device::with_queue(d0, 0x30, || panic!("inside")));
    assert!(r.is_err());
    assert_eq!(device::current_queue(d0), None);
}

#[test]
fn runtimes_without_external_queues_refuse_the_scope() {
    // The CPU runtime keeps the trait's default: no external queues.
    let cpu = device::runtime(DeviceKind::CPU).unwrap();
    assert!(!cpu.accepts_external_queues());
    let ran = std::cell::Cell::new(false);
    let e = device::with_queue(Device::CPU, 0x10, || ran.set(true)).unwrap_err();
    assert!(!ran.get(), "the scope's body must not run");
    assert!(matches!(e, Error::DeviceFailure { .. }) && e.to_string().contains("external queue"), "{e}");
    assert_eq!(device::current_queue(Device::CPU), None);
    // A device kind without a runtime is an error too.
    let none = DeviceKind::new("no-such-runtime");
    assert!(device::with_queue(Device::new(none, 0), 0x10, || ()).is_err());
}

/// Memory of another owner, imported without a copy: reads and writes go to that memory, the
/// owner is dropped with the last tensor over it, and an unaligned or null address is an error.
#[test]
fn external_host_memory_is_used_in_place_and_released_with_the_tensor() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    struct Owner(#[allow(dead_code)] Vec<u64>);
    impl Drop for Owner {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::SeqCst);
        }
    }
    let mut words = vec![0u64; 2];
    let floats: [f32; 4] = [1.5, -2.0, 3.25, 0.0];
    bytemuck::cast_slice_mut::<u64, f32>(&mut words).copy_from_slice(&floats);
    let ptr = words.as_mut_ptr().cast::<u8>();
    let owner = Box::new(Owner(words));
    // SAFETY: the Vec's heap block moved into `owner` unchanged; it stays valid until the
    // buffer drops `owner`, and this test touches it only through the tensor.
    let buf = unsafe { tefl_core::device::external_host_buffer(ptr, 16, owner) }.unwrap();
    let t = Tensor::from_buffer(buf, [2, 2], DType::F32).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), floats);
    t.copy_from(&Tensor::from_slice(&[9.0f32, 8.0, 7.0, 6.0], [2, 2], DType::F32).unwrap()).unwrap();
    // SAFETY: the owner (and so the memory) is alive: `t` holds it.
    let seen = unsafe { std::slice::from_raw_parts(ptr.cast::<f32>(), 4) }.to_vec();
    assert_eq!(seen, [9.0, 8.0, 7.0, 6.0]);
    let view = t.reshape([4]).unwrap();
    drop(t);
    assert_eq!(DROPS.load(Ordering::SeqCst), 0, "a view still holds the memory");
    drop(view);
    assert_eq!(DROPS.load(Ordering::SeqCst), 1);

    let mut words = vec![0u64; 2];
    let odd = words.as_mut_ptr().cast::<u8>().wrapping_add(4);
    // SAFETY: rejected before any access (unaligned).
    let e = unsafe { tefl_core::device::external_host_buffer(odd, 8, Box::new(())) }.err().unwrap();
    assert!(e.to_string().contains("not 8-byte aligned"), "{e}");
    // SAFETY: rejected before any access (null).
    let e = unsafe { tefl_core::device::external_host_buffer(std::ptr::null_mut(), 8, Box::new(())) }.err().unwrap();
    assert!(e.to_string().contains("address 0"), "{e}");
    drop(words);
}

/// Copies of `t`'s buffer to the host so far.
fn host_copies(t: &Tensor) -> usize {
    fake_buffer(&**t.buffer()).unwrap().1.load(Ordering::SeqCst)
}

/// A thd self-attention call on `q` (causal, padded) with these lengths and bounds.
fn thd_args(q: &Tensor, cu_q: &Tensor, cu_k: &Tensor, max: MaxSeqlen) -> AttnFwdArgs {
    AttnFwdArgs {
        cu_seqlens_q: Some(cu_q.clone()),
        cu_seqlens_kv: Some(cu_k.clone()),
        layout: QkvLayout::Thd,
        mask: AttnMask::PaddingCausal,
        q: q.clone(),
        k: q.clone(),
        v: q.clone(),
        scale: 0.5,
        dropout_p: 0.0,
        seed: 0,
        offset: 0,
        window: Default::default(),
        max_seqlen_q: max.q,
        max_seqlen_kv: max.kv,
    }
}

#[test]
fn an_op_call_copies_each_device_cu_seqlens_to_the_host_once() {
    let _ = fake();
    let dev = Device::new(FAKE, 0);
    // An attention impl on the fake device that resolves the geometry again, as the GPU
    // backends' impls do after the op's validation has, and reports the longest sequence.
    let mut reg = Registry::new();
    reg.register_impl(
        OpImpl::new::<FusedAttnFwd>("vendor.fake.attn", BackendImplKind::Vendor, |_, a: &AttnFwdArgs| {
            let g = attn_geometry(
                "fused_attn_fwd",
                &a.q,
                &a.k,
                &a.v,
                a.cu_seqlens_q.as_ref(),
                a.cu_seqlens_kv.as_ref(),
                a.layout,
                a.mask,
            )?;
            let lse = Tensor::from_slice(&vec![g.sq as f32; g.hq * g.tq], [g.hq, g.tq], DType::F32)?;
            Ok(AttnFwdOut { o: a.q.clone(), softmax_lse: lse.to_device(&a.q.device())? })
        })
        .vendor("fake")
        .device(FAKE),
    )
    .unwrap();
    // An impl that resolves the geometry with lengths of its own, twice, dropping the first
    // tensor before making the second: the second read must see the second tensor's lengths
    // (a copy kept by address alone could hand back the first's if the allocation reused it).
    reg.register_impl(
        OpImpl::new::<FusedAttnFwd>("vendor.fake.temps", BackendImplKind::Vendor, |_, a: &AttnFwdArgs| {
            let dev = a.q.device();
            let longest = |cu: &[i32]| -> Result<usize> {
                let t = Tensor::from_slice(cu, [cu.len()], DType::I32)?.to_device(&dev)?;
                let g = attn_geometry("t", &a.q, &a.k, &a.v, Some(&t), Some(&t), a.layout, a.mask)?;
                Ok(g.sq)
            };
            let (first, second) = (longest(&[0, 3, 7])?, longest(&[0, 6, 7])?);
            let mut lse = vec![second as f32; 2 * 7];
            lse[0] = first as f32;
            let lse = Tensor::from_slice(&lse, [2, 7], DType::F32)?;
            Ok(AttnFwdOut { o: a.q.clone(), softmax_lse: lse.to_device(&dev)? })
        })
        .vendor("fake")
        .device(FAKE)
        .by_name_only(),
    )
    .unwrap();
    let m = Manager::new(reg, SelectionPolicy::default());
    let put = |v: &[f32], shape: &[usize], dtype| Tensor::from_slice(v, shape, dtype).unwrap().to_device(&dev).unwrap();
    let cu = |v: &[i32]| Tensor::from_slice(v, [v.len()], DType::I32).unwrap().to_device(&dev).unwrap();
    let q = put(&[0.5; 7 * 2 * 4], &[7, 2, 4], DType::F32);
    let longest = |out: AttnFwdOut| out.softmax_lse.to_vec::<f32>().unwrap()[0];
    let args = |cq: &Tensor, ck: &Tensor| thd_args(&q, cq, ck, MaxSeqlen::default());
    // One tensor for queries and keys: one copy a call (validation and the impl share it).
    let shared = cu(&[0, 3, 7]);
    assert_eq!(longest(m.call::<FusedAttnFwd>(&args(&shared, &shared)).unwrap()), 4.0);
    assert_eq!(host_copies(&shared), 1);
    // The next call copies again: the caller may have rewritten the lengths in between.
    shared.copy_from(&cu(&[0, 5, 7])).unwrap();
    assert_eq!(longest(m.call::<FusedAttnFwd>(&args(&shared, &shared)).unwrap()), 5.0);
    assert_eq!(host_copies(&shared), 2);
    // Two tensors: one copy each.
    let (cq, ck) = (cu(&[0, 1, 7]), cu(&[0, 1, 7]));
    assert_eq!(longest(m.call_impl::<FusedAttnFwd>("vendor.fake.attn", &args(&cq, &ck)).unwrap()), 6.0);
    assert_eq!((host_copies(&cq), host_copies(&ck)), (1, 1));
    // Outside a call every read copies.
    attn_geometry("t", &q, &q, &q, Some(&cq), Some(&ck), QkvLayout::Thd, AttnMask::PaddingCausal).unwrap();
    assert_eq!((host_copies(&cq), host_copies(&ck)), (2, 2));
    let out = m.call_impl::<FusedAttnFwd>("vendor.fake.temps", &args(&shared, &shared)).unwrap();
    assert_eq!(out.softmax_lse.to_vec::<f32>().unwrap()[..2], [4.0, 6.0]);
    // Bad lengths are still refused by name.
    let bad = cu(&[0, 5, 3]);
    let e = m.call::<FusedAttnFwd>(&args(&bad, &shared)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { arg: "cu_seqlens_q", .. }), "{e}");
}

#[test]
fn bounded_thd_calls_leave_device_lengths_unread() {
    let _ = fake();
    let dev = Device::new(FAKE, 0);
    // An impl that resolves the geometry as the CUDA backend does (defer), reporting sq and sk
    // and whether the spans were read: compiled into tefl, so trusted with unread lengths.
    let report = |_: &tefl_core::KernelCtx<'_>, a: &AttnFwdArgs| {
        let g = a.geometry("t", true)?;
        let mut lse = vec![0.0f32; g.hq * g.tq];
        lse[..3].copy_from_slice(&[g.sq as f32, g.sk as f32, if g.spans_on_device { 1.0 } else { 0.0 }]);
        let lse = Tensor::from_slice(&lse, [g.hq, g.tq], DType::F32)?;
        Ok(AttnFwdOut { o: a.q.clone(), softmax_lse: lse.to_device(&a.q.device())? })
    };
    let mut reg = Registry::new();
    reg.register_impl(
        OpImpl::new::<FusedAttnFwd>("vendor.fake.bounded", BackendImplKind::Vendor, report)
            .vendor("fake")
            .device(FAKE)
            .compiled_in(),
    )
    .unwrap();
    // The same kernel registered at run time (as plugins and Python impls are): the lengths
    // are checked before it runs.
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    reg.register_impl(
        OpImpl::new::<FusedAttnFwd>("vendor.fake.runtime", BackendImplKind::Vendor, move |ctx, a: &AttnFwdArgs| {
            counted.fetch_add(1, Ordering::SeqCst);
            report(ctx, a)
        })
        .vendor("fake")
        .device(FAKE)
        .by_name_only(),
    )
    .unwrap();
    let m = Manager::new(reg, SelectionPolicy::default());
    let q = Tensor::from_slice(&[0.5f32; 7 * 2 * 4], [7, 2, 4], DType::F32).unwrap().to_device(&dev).unwrap();
    let cu = |v: &[i32]| Tensor::from_slice(v, [v.len()], DType::I32).unwrap().to_device(&dev).unwrap();
    let args = |cq: &Tensor, max: MaxSeqlen| thd_args(&q, cq, cq, max);
    let first3 = |o: AttnFwdOut| o.softmax_lse.to_vec::<f32>().unwrap()[..3].to_vec();
    let report = |a: &AttnFwdArgs| m.call::<FusedAttnFwd>(a).map(first3);
    // Both bounds: nothing copied to the host; sq and sk are the bounds, at most the rows.
    let lengths = cu(&[0, 3, 7]);
    let both = MaxSeqlen { q: Some(5), kv: Some(100) };
    assert_eq!(report(&args(&lengths, both)).unwrap(), [5.0, 7.0, 1.0]);
    assert_eq!(host_copies(&lengths), 0);
    // Lengths the host check would refuse are not seen either (the backend clamps them).
    let bad = cu(&[0, 9, 3]);
    assert_eq!(report(&args(&bad, both)).unwrap(), [5.0, 7.0, 1.0]);
    assert_eq!(host_copies(&bad), 0);
    // An impl registered at run time gets checked lengths: the bad ones are the caller's
    // error, named, and its kernel does not run; good ones are read once and run.
    let e = m.call_impl::<FusedAttnFwd>("vendor.fake.runtime", &args(&bad, both)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { arg: "cu_seqlens_q", .. }), "{e}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let good = cu(&[0, 3, 7]);
    let out = m.call_impl::<FusedAttnFwd>("vendor.fake.runtime", &args(&good, both)).map(first3).unwrap();
    assert_eq!((out, runs.load(Ordering::SeqCst), host_copies(&good)), (vec![5.0, 7.0, 1.0], 1, 1));
    // One bound: read (once) and checked against it, by name.
    let one = MaxSeqlen { q: Some(3), kv: None };
    let e = report(&args(&lengths, one)).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { arg: "max_seqlen_q", .. }) && e.to_string().contains("length 4"),
        "{e}"
    );
    assert_eq!(host_copies(&lengths), 1);
    assert_eq!(report(&args(&lengths, MaxSeqlen { q: Some(4), kv: None })).unwrap(), [4.0, 4.0, 0.0]);
    // The shape and dtype of unread lengths are still checked.
    let short = cu(&[0]);
    let e = report(&args(&short, both)).unwrap_err();
    assert!(matches!(e, Error::Shape { arg: "cu_seqlens_q", .. }), "{e}");
    // Without defer (backends whose kernels need checked lengths) the lengths are read.
    let g =
        attn_geometry_bounded("t", &q, &q, &q, Some(&bad), Some(&bad), QkvLayout::Thd, AttnMask::Padding, both, false);
    assert!(matches!(g, Err(Error::InvalidArgument { arg: "cu_seqlens_q", .. })), "{g:?}");
}

#[test]
fn queued_uploads_default_to_the_plain_copy() {
    let _ = fake();
    let dev = Device::new(FAKE, 0);
    let host = Tensor::from_slice(&[7i64, -3, 1 << 40], [3], DType::I64).unwrap();
    let t = host.to_device_queued(&dev).unwrap();
    assert_eq!((t.device(), t.dtype(), t.shape()), (dev, DType::I64, &[3usize][..]));
    assert_eq!(t.to_vec::<i64>().unwrap(), vec![7, -3, 1 << 40]);
    // Already there: the same storage.
    assert!(t.to_device_queued(&dev).unwrap().shares_storage(&t));
}
