//! Contiguous, row-major tensors on any registered device.

use std::fmt;
use std::sync::Arc;

use crate::device::{self, Buffer, HostRead, HostWrite};
use crate::dtype::{Element, bf16, f16};
use crate::fp8::Fp8Format;
use crate::{DType, Device, Error, Result};

/// An address space that tensor bytes lie in (for the aliasing check,
/// [`crate::op::check_inout_aliasing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Space {
    /// A device's addresses.
    Address(Device),
    /// One allocation without an address, as a whole.
    Allocation(usize),
}

/// The byte range `[start, end)` of a tensor in its [`Space`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) space: Space,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// A dense, contiguous, row-major tensor. Cloning shares the storage.
///
/// ```
/// use tefl_core::{DType, Device, Tensor};
/// let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [2, 2], DType::BF16)?;
/// assert_eq!(t.shape(), &[2, 2]);
/// assert_eq!(t.to_device(&Device::CPU)?.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
/// # Ok::<(), tefl_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    device: Device,
    shape: Arc<[usize]>,
    storage: Arc<dyn Buffer>,
}

/// The element count of `shape`: 0 when any dimension is 0 (whatever the others are), else
/// their product, an error when it overflows.
fn checked_numel(shape: &[usize]) -> Result<usize> {
    if shape.contains(&0) {
        return Ok(0);
    }
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::Tensor(format!("shape {shape:?} overflows usize")))
}

/// The bytes of `numel` elements of `dtype`, where they fit `isize` (no allocation or slice can
/// be larger).
fn byte_count(numel: usize, dtype: DType) -> Option<usize> {
    numel.checked_mul(dtype.size_in_bytes()).filter(|b| *b <= isize::MAX as usize)
}

/// The byte count of a `shape` of `dtype`; an error when it does not fit `isize`.
fn checked_bytes(shape: &[usize], dtype: DType) -> Result<usize> {
    byte_count(checked_numel(shape)?, dtype)
        .ok_or_else(|| Error::Tensor(format!("shape {shape:?} of {dtype} is more than isize::MAX bytes")))
}

/// What a new tensor's allocation is for, as [`Error::OutOfMemory`] names it.
fn tensor_what(shape: &[usize], dtype: DType) -> String {
    format!("a {dtype} tensor of shape {shape:?}")
}

/// A device's out-of-memory error renamed after the tensor being allocated, with the bytes it
/// asked for (a driver's error does not say them); others as they are.
fn name_oom(e: Error, shape: &[usize], dtype: DType, bytes: usize) -> Error {
    match e {
        Error::OutOfMemory { device, .. } => Error::OutOfMemory { device, bytes, what: tensor_what(shape, dtype) },
        e => e,
    }
}

/// The byte count of a new `shape` of `dtype` on `device`: a shape whose element count
/// overflows is an error, and one whose bytes do not fit `isize` is [`Error::OutOfMemory`]
/// naming the tensor, as a size the device lacks would be.
fn alloc_bytes(shape: &[usize], dtype: DType, device: &Device) -> Result<usize> {
    let numel = checked_numel(shape)?;
    byte_count(numel, dtype).ok_or_else(|| Error::OutOfMemory {
        device: device.to_string(),
        bytes: numel.saturating_mul(dtype.size_in_bytes()),
        what: tensor_what(shape, dtype),
    })
}

impl Tensor {
    /// Builds a CPU tensor of `dtype` from `data`, converting element by element when
    /// the element type differs (float to any float or FP8 dtype, rounding to nearest even).
    pub fn from_slice<T: Element>(data: &[T], shape: impl AsRef<[usize]>, dtype: DType) -> Result<Tensor> {
        let shape = shape.as_ref();
        let numel = checked_numel(shape)?;
        if numel != data.len() {
            return Err(Error::Tensor(format!("{} elements given for shape {shape:?} ({numel} elements)", data.len())));
        }
        let storage = if T::DTYPE == dtype {
            device::host_buffer_from(data)?
        } else {
            device::host_buffer(&encode_elements(data, dtype)?)?
        };
        Ok(Tensor { dtype, device: Device::CPU, shape: shape.into(), storage })
    }

    /// A tensor of zeros (all-zero bytes) on `device`. A size the device cannot hold is
    /// [`Error::OutOfMemory`] naming the tensor, never an abort.
    pub fn zeros(shape: impl AsRef<[usize]>, dtype: DType, device: &Device) -> Result<Tensor> {
        let shape = shape.as_ref();
        let bytes = alloc_bytes(shape, dtype, device)?;
        let name = |e: Error| name_oom(e, shape, dtype, bytes);
        let rt = device::runtime(device.kind)?;
        // The CPU runtime hands out zeroed memory unless allocations are being poisoned; any
        // other memory is zeroed once, by the device's fill (not also by its allocator).
        let storage = if device.is_cpu() && !device::poison_allocations() {
            rt.alloc(*device, bytes).map_err(name)?
        } else {
            let storage = rt.alloc_uninit(*device, bytes).map_err(name)?;
            rt.fill(&*storage, 0).map_err(name)?;
            storage
        };
        Ok(Tensor { dtype, device: *device, shape: shape.into(), storage })
    }

    /// A tensor on `device` whose contents are unspecified (NaN-poisoned when allocations
    /// are poisoned): for outputs a kernel writes in full. [`Error::OutOfMemory`] names it.
    pub fn uninit(shape: impl AsRef<[usize]>, dtype: DType, device: &Device) -> Result<Tensor> {
        let shape = shape.as_ref();
        let bytes = alloc_bytes(shape, dtype, device)?;
        let storage =
            device::runtime(device.kind)?.alloc_uninit(*device, bytes).map_err(|e| name_oom(e, shape, dtype, bytes))?;
        Ok(Tensor { dtype, device: *device, shape: shape.into(), storage })
    }

    /// Wraps a backend buffer as a tensor. The buffer must hold exactly `numel · size` bytes.
    pub fn from_buffer(storage: Arc<dyn Buffer>, shape: impl AsRef<[usize]>, dtype: DType) -> Result<Tensor> {
        let shape = shape.as_ref();
        let want = checked_bytes(shape, dtype)?;
        if storage.len_bytes() != want {
            return Err(Error::Tensor(format!(
                "buffer of {} bytes for shape {shape:?} of {dtype} ({want} bytes)",
                storage.len_bytes()
            )));
        }
        Ok(Tensor { dtype, device: storage.device(), shape: shape.into(), storage })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The shape (row-major).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements (0 when any dimension is 0, whatever the others are).
    pub fn numel(&self) -> usize {
        if self.shape.contains(&0) { 0 } else { self.shape.iter().product() }
    }
    /// Size of the data in bytes.
    pub fn size_in_bytes(&self) -> usize {
        self.storage.len_bytes()
    }
    /// The device holding the data.
    pub fn device(&self) -> Device {
        self.device
    }
    /// The storage (for backends).
    pub fn buffer(&self) -> &Arc<dyn Buffer> {
        &self.storage
    }
    /// The last dimension (1 for a scalar).
    pub fn last_dim(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }
    /// Rows when the last dimension is the row width: numel / last_dim.
    pub fn rows(&self) -> usize {
        let n = self.last_dim();
        self.numel().checked_div(n).unwrap_or(0)
    }
    /// True when both tensors share storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.storage), Arc::as_ptr(&other.storage))
    }
    /// Where the tensor's bytes lie, for overlap checks: its address range ([`Buffer::raw_address`];
    /// two DLPack imports of one allocation overlap there), or its storage as a whole where the
    /// storage has no address or the tensor no bytes (then only tensors sharing the storage meet).
    pub(crate) fn region(&self) -> Region {
        match self.storage.raw_address().filter(|_| self.numel() > 0) {
            Some(a) => Region {
                space: Space::Address(self.device),
                start: a,
                end: a.saturating_add(self.storage.len_bytes() as u64),
            },
            None => {
                Region { space: Space::Allocation(Arc::as_ptr(&self.storage).cast::<u8>() as usize), start: 0, end: 1 }
            }
        }
    }

    /// The same data with another shape of equal element count (shares storage).
    pub fn reshape(&self, shape: impl AsRef<[usize]>) -> Result<Tensor> {
        let shape = shape.as_ref();
        if checked_numel(shape)? != self.numel() {
            return Err(Error::Tensor(format!("cannot reshape {:?} to {shape:?}", self.shape())));
        }
        Ok(Tensor { dtype: self.dtype, device: self.device, shape: shape.into(), storage: self.storage.clone() })
    }

    /// The raw bytes, copied to the host.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        if let Some(h) = device::as_host(&*self.storage) {
            return Ok(h.read().to_vec());
        }
        let rt = device::runtime(self.device().kind)?;
        let mut out = device::try_zeroed_bytes(self.size_in_bytes(), || format!("a host copy of {self:?}"))?;
        rt.copy_to_host(&*self.storage, &mut out)?;
        Ok(out)
    }

    /// Copies the elements to a host `Vec<T>`, converting from the tensor's dtype
    /// (any float or FP8 dtype to any float `T`; integers only to their own type).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        decode_elements(&self.to_bytes()?, self.dtype)
    }

    /// [`Tensor::to_vec`] for the small device tensors validation reads on the host (cu_seqlens,
    /// start positions): inside one op call ([`crate::Manager::call`]) a device tensor is
    /// copied to the host once, and the later reads of the same call (the op's validation,
    /// then the impl's own geometry) take those bytes. Each copy from a device waits for the
    /// device's queue to drain, so reading cu_seqlens four times a call cost an attention call
    /// on packed (thd) sequences four stalls. Outside a call this is `to_vec`; the next call
    /// reads again (the caller may have rewritten the tensor in between).
    pub fn to_vec_in_call<T: Element>(&self) -> Result<Vec<T>> {
        if device::as_host(&*self.storage).is_some() {
            return self.to_vec();
        }
        decode_elements(&call_reads::bytes_of(self)?, self.dtype)
    }

    /// A copy on `device` (a clone sharing storage when it is already there).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        self.copied_to(device, false)
    }

    /// A copy on `device` for the kernels queued after it on this thread's queue only (launch
    /// tables): the upload is queued there without a host wait
    /// ([`DeviceRuntime::copy_from_host_queued`](device::DeviceRuntime::copy_from_host_queued)).
    /// Read it from elsewhere (the host, another queue) only after synchronizing.
    pub fn to_device_queued(&self, device: &Device) -> Result<Tensor> {
        self.copied_to(device, true)
    }

    /// [`Tensor::to_device`] (a zeroed allocation, a copy the host waits for) or, `queued`,
    /// [`Tensor::to_device_queued`] (an uninitialised one, a queued copy).
    fn copied_to(&self, device: &Device, queued: bool) -> Result<Tensor> {
        if self.device() == *device {
            return Ok(self.clone());
        }
        let bytes = self.to_bytes()?;
        let rt = device::runtime(device.kind)?;
        let storage = if queued {
            let storage = rt.alloc_uninit(*device, bytes.len())?;
            rt.copy_from_host_queued(&*storage, &bytes)?;
            storage
        } else {
            let storage = rt.alloc(*device, bytes.len())?;
            rt.copy_from_host(&*storage, &bytes)?;
            storage
        };
        Ok(Tensor { dtype: self.dtype, device: *device, shape: self.shape.clone(), storage })
    }

    /// Overwrites this tensor's data with `src`'s (same dtype and element count; any devices).
    /// Used for in-place outputs staged through the host.
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        if src.dtype != self.dtype || src.numel() != self.numel() {
            return Err(Error::Tensor(format!(
                "copy_from: {} {:?} into {} {:?}",
                src.dtype,
                src.shape(),
                self.dtype,
                self.shape()
            )));
        }
        if self.shares_storage(src) {
            return Ok(());
        }
        let rt = device::runtime(self.device().kind)?;
        if src.device() == self.device() {
            // Same device: the runtime copies there, without a host round trip.
            return rt.copy_device_to_device(&*src.storage, &*self.storage);
        }
        let bytes = src.to_bytes()?;
        rt.copy_from_host(&*self.storage, &bytes)
    }

    /// Shared host access to the bytes of a CPU tensor.
    pub fn host_bytes(&self) -> Result<HostRead<'_>> {
        device::as_host(&*self.storage)
            .map(|h| h.read())
            .ok_or_else(|| Error::Tensor(format!("tensor is on {}, not on the host", self.device())))
    }

    /// Exclusive host access to the bytes of a CPU tensor; an error when the storage is
    /// already borrowed (the same tensor passed twice, once as an output).
    pub fn host_bytes_mut(&self) -> Result<HostWrite<'_>> {
        let h = device::as_host(&*self.storage)
            .ok_or_else(|| Error::Tensor(format!("tensor is on {}, not on the host", self.device())))?;
        h.try_write().ok_or_else(|| Error::Tensor("tensor storage is already borrowed (aliased arguments?)".into()))
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({}, {:?}, {})", self.dtype, self.shape(), self.device())
    }
}

fn encode_elements<T: Element>(data: &[T], dtype: DType) -> Result<Vec<u8>> {
    if T::DTYPE == dtype || (T::DTYPE == DType::U8 && matches!(dtype, DType::Bool | DType::F8E4M3 | DType::F8E5M2)) {
        return Ok(bytemuck::cast_slice(data).to_vec());
    }
    let floats: Vec<f32> =
        to_f32_vec(data).ok_or_else(|| Error::Tensor(format!("cannot convert {} elements to {dtype}", T::DTYPE)))?;
    Ok(match dtype {
        DType::F32 => bytemuck::cast_slice(&floats).to_vec(),
        DType::F64 => bytemuck::cast_slice(&floats.iter().map(|&x| f64::from(x)).collect::<Vec<_>>()).to_vec(),
        DType::F16 => bytemuck::cast_slice(&floats.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>()).to_vec(),
        DType::BF16 => bytemuck::cast_slice(&floats.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>()).to_vec(),
        d => match Fp8Format::of(d) {
            Some(f) => floats.iter().map(|&x| f.encode(x)).collect(),
            None => return Err(Error::Tensor(format!("cannot convert {} elements to {dtype}", T::DTYPE))),
        },
    })
}

fn to_f32_vec<T: Element>(data: &[T]) -> Option<Vec<f32>> {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    bytes_to_f32(bytes, T::DTYPE)
}

fn bytes_to_f32(bytes: &[u8], dtype: DType) -> Option<Vec<f32>> {
    Some(match dtype {
        DType::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(bytes),
        DType::F64 => bytemuck::pod_collect_to_vec::<u8, f64>(bytes).iter().map(|&x| x as f32).collect(),
        DType::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(bytes).iter().map(|x| x.to_f32()).collect(),
        DType::BF16 => bytemuck::pod_collect_to_vec::<u8, bf16>(bytes).iter().map(|x| x.to_f32()).collect(),
        DType::F8E4M3 | DType::F8E5M2 => {
            let f = Fp8Format::of(dtype)?;
            bytes.iter().map(|&c| f.decode(c)).collect()
        }
        _ => return None,
    })
}

fn decode_elements<T: Element>(bytes: &[u8], dtype: DType) -> Result<Vec<T>> {
    if T::DTYPE == dtype || (T::DTYPE == DType::U8 && matches!(dtype, DType::Bool | DType::F8E4M3 | DType::F8E5M2)) {
        return Ok(bytemuck::pod_collect_to_vec(bytes));
    }
    if T::DTYPE == DType::F64 && dtype.is_float() {
        // Widen without passing through f32 rounding twice (f32/f16/bf16 are exact in f64).
        let f = bytes_to_f32(bytes, dtype).unwrap_or_default();
        let v: Vec<f64> = f.into_iter().map(f64::from).collect();
        return Ok(bytemuck::pod_collect_to_vec(bytemuck::cast_slice::<f64, u8>(&v)));
    }
    let floats = bytes_to_f32(bytes, dtype)
        .ok_or_else(|| Error::Tensor(format!("cannot convert {dtype} elements to {}", T::DTYPE)))?;
    let out = encode_elements(&floats, T::DTYPE)?;
    Ok(bytemuck::pod_collect_to_vec(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_conversions() {
        let xs = [1.5f32, -2.25, 3.0, 0.0, 448.0, 1e6];
        let t = Tensor::from_slice(&xs, [2, 3], DType::F32).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), xs);
        let h = Tensor::from_slice(&xs, [6], DType::F16).unwrap();
        assert_eq!(h.to_vec::<f32>().unwrap()[..5], xs[..5]);
        let q = Tensor::from_slice(&xs, [6], DType::F8E4M3).unwrap();
        assert_eq!(q.to_vec::<f32>().unwrap(), vec![1.5, -2.25, 3.0, 0.0, 448.0, 448.0]);
        assert_eq!(q.to_vec::<u8>().unwrap()[4], 0x7E);
        let i = Tensor::from_slice(&[1i32, 2, 3], [3], DType::I32).unwrap();
        assert_eq!(i.to_vec::<i32>().unwrap(), vec![1, 2, 3]);
        assert!(i.to_vec::<f32>().is_err());
        assert!(Tensor::from_slice(&[1.0f32], [2], DType::F32).is_err());
    }

    #[test]
    fn a_drivers_out_of_memory_is_named_after_the_tensor_and_its_bytes() {
        // What the CUDA runtime returns: the driver's error says neither.
        let driver = Error::OutOfMemory { device: "cuda:0".into(), bytes: 0, what: "a device allocation".into() };
        assert_eq!(driver.to_string(), "device cuda:0: out of memory for a device allocation (size not reported)");
        let e = name_oom(driver, &[2, 3], DType::BF16, 12);
        assert_eq!(e.to_string(), "device cuda:0: out of memory allocating 12 bytes for a bf16 tensor of shape [2, 3]");
        let other = Error::Tensor("x".into());
        assert!(matches!(name_oom(other, &[1], DType::F32, 4), Error::Tensor(_)));
    }

    #[test]
    fn reshape_and_aliasing() {
        let t = Tensor::from_slice(&[1.0f32; 6], [2, 3], DType::F32).unwrap();
        let r = t.reshape([3, 2]).unwrap();
        assert!(r.shares_storage(&t));
        assert!(t.reshape([4]).is_err());
        let _read = t.host_bytes().unwrap();
        assert!(r.host_bytes_mut().is_err(), "a written alias of a read tensor must be refused");
    }

    #[test]
    fn unknown_device_is_an_error_not_a_panic() {
        let t = Tensor::from_slice(&[1.0f32], [1], DType::F32).unwrap();
        let d = Device::new(crate::DeviceKind::new("nowhere"), 0);
        assert!(matches!(t.to_device(&d), Err(Error::DeviceUnavailable { .. })));
    }
}

/// The host copies of device tensors taken during the op call under way on this thread (see
/// [`Tensor::to_vec_in_call`]). Calls nest (an impl may call another op): the copies are
/// dropped when the outermost call returns.
pub(crate) mod call_reads {
    use std::cell::RefCell;
    use std::sync::Arc;

    use super::Tensor;
    use crate::Result;
    use crate::device::Buffer;

    /// A tensor read in the calls under way: its storage (held, so that no other allocation
    /// takes its address while the entry lasts), its byte count and the bytes read.
    struct HostCopy {
        storage: Arc<dyn Buffer>,
        len: usize,
        bytes: Arc<[u8]>,
    }

    #[derive(Default)]
    struct Reads {
        /// Calls under way on this thread.
        depth: usize,
        /// The tensors read in them (a tensor's bytes start at its storage's first byte).
        copies: Vec<HostCopy>,
    }

    thread_local! {
        static READS: RefCell<Reads> = RefCell::new(Reads::default());
    }

    /// One op call under way on this thread, from [`enter`] until dropped.
    pub(crate) struct CallScope(());

    /// Marks the start of an op call on this thread.
    pub(crate) fn enter() -> CallScope {
        READS.with(|r| r.borrow_mut().depth += 1);
        CallScope(())
    }

    impl Drop for CallScope {
        fn drop(&mut self) {
            let released = READS.with(|r| {
                let mut r = r.borrow_mut();
                r.depth = r.depth.saturating_sub(1);
                if r.depth == 0 { std::mem::take(&mut r.copies) } else { Vec::new() }
            });
            // (The storages go back outside the borrow: a runtime's free is not ours to order.)
            drop(released);
        }
    }

    /// `t`'s bytes: copied from its device once per call, or every time outside one.
    pub(crate) fn bytes_of(t: &Tensor) -> Result<Arc<[u8]>> {
        let len = t.size_in_bytes();
        let same = |c: &HostCopy| std::ptr::addr_eq(Arc::as_ptr(&c.storage), Arc::as_ptr(&t.storage)) && c.len == len;
        let in_call = READS.with(|r| {
            let r = r.borrow();
            (r.depth > 0).then(|| r.copies.iter().find(|c| same(c)).map(|c| c.bytes.clone()))
        });
        match in_call {
            Some(Some(bytes)) => Ok(bytes),
            Some(None) => {
                let bytes: Arc<[u8]> = t.to_bytes()?.into();
                let copy = HostCopy { storage: t.storage.clone(), len, bytes: bytes.clone() };
                READS.with(|r| r.borrow_mut().copies.push(copy));
                Ok(bytes)
            }
            None => Ok(t.to_bytes()?.into()),
        }
    }
}
