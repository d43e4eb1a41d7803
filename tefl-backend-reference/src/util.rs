//! Host access helpers shared by the reference kernels.

use std::ops::Deref;

use rayon::prelude::*;
use tefl_core::device::{HostRead, try_zeroed};
use tefl_core::fp8::Fp8Format;
use tefl_core::{DType, Error, Result, Tensor, bf16, f16};

use crate::kernels::vmath;

/// Elements per rayon task for elementwise work.
pub const CHUNK: usize = 1 << 14;

/// A tensor's elements as f32: borrowed for f32 tensors, converted (in parallel) otherwise.
pub enum F32View<'a> {
    /// An f32 tensor's own bytes.
    Host(HostRead<'a>),
    /// A converted copy.
    Owned(Vec<f32>),
}

impl Deref for F32View<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            F32View::Host(r) => bytemuck::cast_slice(r),
            F32View::Owned(v) => v,
        }
    }
}

/// An f32 copy of `bytes` (elements of T), `widen` converting one chunk at a time in parallel.
fn convert_with<T: bytemuck::Pod + Send + Sync>(
    bytes: &[u8],
    widen: impl Fn(&[T], &mut [f32]) + Sync,
) -> Result<Vec<f32>> {
    let src: &[T] = bytemuck::cast_slice(bytes);
    let mut out: Vec<f32> =
        tefl_core::device::try_zeroed(src.len(), || format!("an f32 copy of {} elements", src.len()))?;
    out.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(o, s)| widen(s, o));
    Ok(out)
}

fn convert<T: bytemuck::Pod + Send + Sync>(bytes: &[u8], f: impl Fn(&T) -> f32 + Sync) -> Result<Vec<f32>> {
    convert_with::<T>(bytes, |s, o| o.iter_mut().zip(s).for_each(|(d, x)| *d = f(x)))
}

/// Reads a float or FP8 tensor on the host as f32.
pub fn view(t: &Tensor) -> Result<F32View<'_>> {
    let bytes = t.host_bytes()?;
    Ok(match t.dtype() {
        DType::F32 => F32View::Host(bytes),
        DType::F16 => F32View::Owned(convert_with::<f16>(&bytes, vmath::widen_f16)?),
        DType::BF16 => F32View::Owned(convert_with::<bf16>(&bytes, vmath::widen_bf16)?),
        DType::F64 => F32View::Owned(convert::<f64>(&bytes, |x| *x as f32)?),
        d @ (DType::F8E4M3 | DType::F8E5M2) => {
            let f = Fp8Format::of(d).ok_or_else(|| Error::Tensor(format!("{d} is not fp8")))?;
            // Every code's value from a table (256 entries) rather than decoded one by one.
            let table: [f32; 256] = std::array::from_fn(|c| f.decode(c as u8));
            F32View::Owned(convert::<u8>(&bytes, |x| table[usize::from(*x)])?)
        }
        d => return Err(Error::Tensor(format!("reference: cannot read {d} as floats"))),
    })
}

/// An out-of-memory error renamed after what was being allocated; others as they are.
fn oom_named(e: Error, what: impl FnOnce() -> String) -> Error {
    match e {
        Error::OutOfMemory { device, bytes, .. } => Error::OutOfMemory { device, bytes, what: what() },
        e => e,
    }
}

/// A zeroed f32 host tensor for an op's output or its scratch; out of memory names `what`.
pub fn zeroed_f32(shape: &[usize], what: impl FnOnce() -> String) -> Result<Tensor> {
    Tensor::zeros(shape, DType::F32, &tefl_core::Device::CPU).map_err(|e| oom_named(e, what))
}

/// An f32 host tensor whose contents are unspecified, for an output the caller writes in
/// full (NaN-poisoned when allocations are poisoned); out of memory names `what`.
pub fn uninit_f32(shape: &[usize], what: impl FnOnce() -> String) -> Result<Tensor> {
    Tensor::uninit(shape, DType::F32, &tefl_core::Device::CPU).map_err(|e| oom_named(e, what))
}

/// A host tensor of `dtype` and `shape` whose values `fill` computes as f32 (starting from
/// zeros): written straight into the tensor when `dtype` is f32, into an f32 scratch tensor and
/// then narrowed otherwise. `fill`'s other result comes back beside the tensor.
pub fn build_f32<R>(
    shape: &[usize],
    dtype: DType,
    what: &str,
    fill: impl FnOnce(&mut [f32]) -> Result<R>,
) -> Result<(Tensor, R)> {
    let scratch = zeroed_f32(shape, || format!("{what} {shape:?}"))?;
    let r = {
        let mut w = scratch.host_bytes_mut()?;
        let vals: &mut [f32] = bytemuck::cast_slice_mut(&mut w);
        let r = fill(vals)?;
        if dtype != DType::F32 {
            return Ok((store(vals, shape, dtype)?, r));
        }
        r
    };
    Ok((scratch, r))
}

/// A host tensor of `dtype` from f32 values (converted in parallel, round to nearest even,
/// straight into the tensor's memory).
pub fn store(data: &[f32], shape: &[usize], dtype: DType) -> Result<Tensor> {
    fn conv<T: tefl_core::Element>(
        data: &[f32],
        shape: &[usize],
        narrow: impl Fn(&[f32], &mut [T]) + Sync,
    ) -> Result<Tensor> {
        // Written in full below: no zeroing first.
        let out = Tensor::uninit(shape, T::DTYPE, &tefl_core::Device::CPU)?;
        {
            let mut w = out.host_bytes_mut()?;
            let dst: &mut [T] = bytemuck::cast_slice_mut(&mut w);
            if dst.len() != data.len() {
                return Err(Error::Tensor(format!("{} values stored as shape {shape:?}", data.len())));
            }
            dst.par_chunks_mut(CHUNK).zip(data.par_chunks(CHUNK)).for_each(|(o, s)| narrow(s, o));
        }
        Ok(out)
    }
    match dtype {
        DType::F32 => Tensor::from_slice(data, shape, DType::F32),
        DType::F16 => conv(data, shape, vmath::narrow_f16),
        DType::BF16 => conv(data, shape, vmath::narrow_bf16),
        d => Err(Error::Tensor(format!("reference: cannot store floats as {d}"))),
    }
}

/// max |x|, NaN when x holds a NaN.
pub fn amax(x: &[f32]) -> f32 {
    x.par_chunks(CHUNK)
        .map(|c| c.iter().fold(0.0f32, |m, v| if v.is_nan() || m.is_nan() { f32::NAN } else { m.max(v.abs()) }))
        .reduce(|| 0.0f32, |a, b| if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) })
}

/// The FP8 codes of `data·scale` (saturating, round to nearest even) as a host tensor of the
/// FP8 `dtype`, with max |data| (NaN when data holds one): an FP8 output quantizer.
pub fn store_fp8(data: &[f32], shape: &[usize], dtype: DType, scale: f32) -> Result<(Tensor, f32)> {
    let f = Fp8Format::of(dtype).ok_or_else(|| Error::Tensor(format!("{dtype} is not an fp8 dtype")))?;
    // Written in full below: no zeroing first.
    let out = Tensor::uninit(shape, dtype, &tefl_core::Device::CPU)?;
    // The codes and max |data| in one pass (vmath::encode_fp8).
    let amax = {
        let mut q = out.host_bytes_mut()?;
        if q.len() != data.len() {
            return Err(Error::Tensor(format!("{} values stored as shape {shape:?}", data.len())));
        }
        q.par_chunks_mut(CHUNK)
            .zip(data.par_chunks(CHUNK))
            .map(|(o, i)| vmath::encode_fp8(f, scale, i, o))
            .reduce(|| 0.0f32, vmath::nan_max)
    };
    Ok((out, amax))
}

/// Writes f32 values into an existing float tensor (in place), converting to its dtype.
pub fn write_into(t: &Tensor, data: &[f32]) -> Result<()> {
    let mut w = t.host_bytes_mut()?;
    match t.dtype() {
        DType::F32 => bytemuck::cast_slice_mut::<u8, f32>(&mut w).copy_from_slice(data),
        DType::F16 => {
            let dst = bytemuck::cast_slice_mut::<u8, f16>(&mut w);
            let n = dst.len().min(data.len());
            vmath::narrow_f16(&data[..n], &mut dst[..n]);
        }
        DType::BF16 => {
            let dst = bytemuck::cast_slice_mut::<u8, bf16>(&mut w);
            let n = dst.len().min(data.len());
            vmath::narrow_bf16(&data[..n], &mut dst[..n]);
        }
        d => return Err(Error::Tensor(format!("reference: cannot write floats into {d}"))),
    }
    Ok(())
}

/// Reads the i32 noop flag.
pub fn noop_set(flag: &Tensor) -> Result<bool> {
    Ok(flag.to_vec::<i32>()?.first().copied().unwrap_or(0) != 0)
}

/// Sets the i32 noop flag to 1.
pub fn set_noop(flag: &Tensor) -> Result<()> {
    let mut w = flag.host_bytes_mut()?;
    bytemuck::cast_slice_mut::<u8, i32>(&mut w)[0] = 1;
    Ok(())
}

/// Σ over `rows` of `f(row, acc)` into a length-`n` accumulator (f32 or f64), in parallel. The
/// length comes from the user's shapes (a [0, 2^40] gradient has no rows and a huge width):
/// with no rows the result is a zero vector allocated fallibly; with rows, every accumulator is
/// no larger than a row of the data being summed.
pub fn column_sums<T>(rows: usize, n: usize, what: &str, f: impl Fn(usize, &mut [T]) + Sync) -> Result<Vec<T>>
where
    T: bytemuck::Zeroable + Copy + std::ops::AddAssign + Send,
{
    if rows == 0 || n == 0 {
        return try_zeroed(n, || format!("{what} [{n}]"));
    }
    Ok((0..rows)
        .into_par_iter()
        .fold(
            || vec![T::zeroed(); n],
            |mut acc, r| {
                f(r, &mut acc);
                acc
            },
        )
        .reduce(|| vec![T::zeroed(); n], add_columns))
}

/// `a + b`, column by column: how per-task column sums are joined.
fn add_columns<T: Copy + std::ops::AddAssign>(mut a: Vec<T>, b: Vec<T>) -> Vec<T> {
    a.iter_mut().zip(&b).for_each(|(x, y)| *x += *y);
    a
}

/// Σ of the rows of a row-major `[rows, n]` matrix (a bias gradient).
pub fn row_major_column_sums(data: &[f32], n: usize, what: &str) -> Result<Vec<f32>> {
    let rows = data.len().checked_div(n).unwrap_or(0);
    column_sums(rows, n, what, |r, acc| {
        acc.iter_mut().zip(&data[r * n..(r + 1) * n]).for_each(|(s, v)| *s += v);
    })
}

/// A one-element f32 tensor.
pub fn scalar_tensor(v: f32) -> Result<Tensor> {
    Tensor::from_slice(&[v], [1], DType::F32)
}

/// A float tensor's elements, typed.
enum Src<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

impl Src<'_> {
    fn new(dtype: DType, bytes: &[u8]) -> Result<Src<'_>> {
        Ok(match dtype {
            DType::F32 => Src::F32(bytemuck::cast_slice(bytes)),
            DType::F16 => Src::F16(bytemuck::cast_slice(bytes)),
            DType::BF16 => Src::BF16(bytemuck::cast_slice(bytes)),
            d => return Err(Error::Tensor(format!("reference: cannot read {d} rows as floats"))),
        })
    }

    /// Copies `dst.len()` elements from `start`, widened to f32.
    #[inline]
    fn row_into(&self, start: usize, dst: &mut [f32]) {
        let n = dst.len();
        match self {
            Src::F32(s) => dst.copy_from_slice(&s[start..start + n]),
            Src::F16(s) => vmath::widen_f16(&s[start..start + n], dst),
            Src::BF16(s) => vmath::widen_bf16(&s[start..start + n], dst),
        }
    }
}

/// Row-wise map without full-size f32 staging: for each row `i` (in parallel), the rows of
/// every input (input k has width `widths[k]`) are widened into per-thread scratch, `f(i,
/// inputs, out_row)` fills an f32 output row of width `m`, which is narrowed straight into
/// a fresh `out_dtype` tensor of `out_shape`. `f` also returns two per-row statistics
/// (rsigma, mu, ...), collected in row order.
pub fn map_rows<const K: usize>(
    inputs: [(&Tensor, usize); K],
    rows: usize,
    out_shape: &[usize],
    out_dtype: DType,
    m: usize,
    f: impl Fn(usize, [&[f32]; K], &mut [f32]) -> [f32; 2] + Sync + Send,
) -> Result<(Tensor, Vec<[f32; 2]>)> {
    map_rows_scaled(inputs, rows, out_shape, out_dtype, 1.0, m, f).map(|(out, stats, _)| (out, stats))
}

/// [`map_rows`] whose output may also be FP8: an FP8 `out_dtype` takes the codes of each f32
/// row times `scale` (as `Fp8Format::encode`), and the third result is max |row value| over
/// every row (NaN when one is NaN; 0 for float outputs, which ignore `scale`): a forward's
/// FP8 output, its amax included, with no f32 copy of the whole output.
pub fn map_rows_scaled<const K: usize>(
    inputs: [(&Tensor, usize); K],
    rows: usize,
    out_shape: &[usize],
    out_dtype: DType,
    scale: f32,
    m: usize,
    f: impl Fn(usize, [&[f32]; K], &mut [f32]) -> [f32; 2] + Sync + Send,
) -> Result<(Tensor, Vec<[f32; 2]>, f32)> {
    let guards = inputs.iter().map(|(t, _)| t.host_bytes()).collect::<Result<Vec<_>>>()?;
    let srcs = inputs.iter().zip(&guards).map(|((t, _), g)| Src::new(t.dtype(), g)).collect::<Result<Vec<_>>>()?;
    let widths: [usize; K] = std::array::from_fn(|k| inputs[k].1);
    if rows == 0 || m == 0 {
        // Nothing to map, and the scratch rows below would be sized by a width no row has.
        return Ok((Tensor::zeros(out_shape, out_dtype, &tefl_core::Device::CPU)?, Vec::new(), 0.0));
    }
    // Every row of the output is written below (the chunks of m tile it): no zeroing first.
    let out = Tensor::uninit(out_shape, out_dtype, &tefl_core::Device::CPU)?;
    let min_rows = (CHUNK / m.max(1)).max(1);
    let per_row = {
        let mut w = out.host_bytes_mut()?;
        // $narrow(y, out_row) stores the row and returns its max |y| (or 0).
        macro_rules! run {
            ($t:ty, $narrow:expr) => {{
                let dst: &mut [$t] = bytemuck::cast_slice_mut(&mut w);
                dst.par_chunks_mut(m.max(1))
                    .enumerate()
                    .with_min_len(min_rows)
                    .map_init(
                        || (widths.map(|n| vec![0.0f32; n]), vec![0.0f32; m]),
                        |(scratch, y), (i, orow)| {
                            for (k, src) in srcs.iter().enumerate() {
                                src.row_into(i * widths[k], &mut scratch[k]);
                            }
                            let rows_in: [&[f32]; K] = std::array::from_fn(|k| scratch[k].as_slice());
                            let s = f(i, rows_in, y);
                            (s, $narrow(y.as_slice(), orow))
                        },
                    )
                    .collect::<Vec<([f32; 2], f32)>>()
            }};
        }
        match out_dtype {
            DType::F32 => run!(f32, |y: &[f32], o: &mut [f32]| {
                o.copy_from_slice(y);
                0.0
            }),
            DType::F16 => run!(f16, |y: &[f32], o: &mut [f16]| {
                vmath::narrow_f16(y, o);
                0.0
            }),
            DType::BF16 => run!(bf16, |y: &[f32], o: &mut [bf16]| {
                vmath::narrow_bf16(y, o);
                0.0
            }),
            d => match Fp8Format::of(d) {
                Some(fmt) => run!(u8, |y: &[f32], o: &mut [u8]| vmath::encode_fp8(fmt, scale, y, o)),
                None => return Err(Error::Tensor(format!("reference: cannot store floats as {d}"))),
            },
        }
    };
    debug_assert!(per_row.len() == rows);
    let amax = per_row.iter().fold(0.0f32, |a, r| vmath::nan_max(a, r.1));
    Ok((out, per_row.into_iter().map(|r| r.0).collect(), amax))
}

/// [`map_rows`] for a backward that also sums over rows: `f(i, inputs, out_row, acc)` fills the
/// f32 output row (width `m`; the output has the first input's shape and dtype, as dx has x's)
/// and adds row `i`'s terms into `acc`, a column accumulator of width `acc_n` (one per rayon
/// task, summed at the end, as [`column_sums`] does; `what` names it in an out-of-memory
/// error). Returns the output and the column sums: dx and dgamma (and dbeta) in one pass over
/// the inputs, with no full-size f32 copy of any of them.
pub fn map_rows_summing<const K: usize>(
    inputs: [(&Tensor, usize); K],
    rows: usize,
    m: usize,
    acc_n: usize,
    what: &str,
    f: impl Fn(usize, [&[f32]; K], &mut [f32], &mut [f32]) + Sync + Send,
) -> Result<(Tensor, Vec<f32>)> {
    let guards = inputs.iter().map(|(t, _)| t.host_bytes()).collect::<Result<Vec<_>>>()?;
    let srcs = inputs.iter().zip(&guards).map(|((t, _), g)| Src::new(t.dtype(), g)).collect::<Result<Vec<_>>>()?;
    let widths: [usize; K] = std::array::from_fn(|k| inputs[k].1);
    let Some(&(first, _)) = inputs.first() else {
        return Err(Error::Tensor("map_rows_summing: no input to shape the output after".into()));
    };
    let (out_shape, out_dtype) = (first.shape(), first.dtype());
    if rows == 0 || m == 0 {
        // No row to map or sum: a zero output and zero sums (allocated fallibly: the width
        // comes from the user's shapes, not from data that exists).
        let out = Tensor::zeros(out_shape, out_dtype, &tefl_core::Device::CPU)?;
        return Ok((out, try_zeroed(acc_n, || format!("{what} [{acc_n}]"))?));
    }
    // Every row of the output is written below: no zeroing first.
    let out = Tensor::uninit(out_shape, out_dtype, &tefl_core::Device::CPU)?;
    let min_rows = (CHUNK / m).max(1);
    let sums = {
        let mut w = out.host_bytes_mut()?;
        macro_rules! run {
            ($t:ty, $narrow:expr) => {{
                let dst: &mut [$t] = bytemuck::cast_slice_mut(&mut w);
                dst.par_chunks_mut(m)
                    .enumerate()
                    .with_min_len(min_rows)
                    .fold(
                        || (widths.map(|n| vec![0.0f32; n]), vec![0.0f32; m], vec![0.0f32; acc_n]),
                        |(mut scratch, mut y, mut acc), (i, orow)| {
                            for (k, src) in srcs.iter().enumerate() {
                                src.row_into(i * widths[k], &mut scratch[k]);
                            }
                            let rows_in: [&[f32]; K] = std::array::from_fn(|k| scratch[k].as_slice());
                            f(i, rows_in, &mut y, &mut acc);
                            $narrow(y.as_slice(), orow);
                            (scratch, y, acc)
                        },
                    )
                    .map(|(_, _, acc)| acc)
                    .reduce(|| vec![0.0f32; acc_n], add_columns)
            }};
        }
        match out_dtype {
            DType::F32 => run!(f32, |y: &[f32], o: &mut [f32]| o.copy_from_slice(y)),
            DType::F16 => run!(f16, vmath::narrow_f16),
            DType::BF16 => run!(bf16, vmath::narrow_bf16),
            d => return Err(Error::Tensor(format!("reference: cannot store floats as {d}"))),
        }
    };
    Ok((out, sums))
}
