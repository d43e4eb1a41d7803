//! FP8 per-tensor scaling on the CPU.

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::{DType, Device, KernelCtx, Result, Tensor};

use crate::util::{amax, column_sums, scalar_tensor, store, store_fp8, view};

/// The 8x8 byte matrix transposed: byte j of `r[i]` (little-endian) to byte i of row j, by
/// swapping the off-diagonal blocks at 4, 2 and 1 bytes.
fn transpose_8x8(mut r: [u64; 8]) -> [u64; 8] {
    for (shift, mask, pairs) in [
        (32, 0x0000_0000_FFFF_FFFFu64, [(0, 4), (1, 5), (2, 6), (3, 7)]),
        (16, 0x0000_FFFF_0000_FFFF, [(0, 2), (1, 3), (4, 6), (5, 7)]),
        (8, 0x00FF_00FF_00FF_00FF, [(0, 1), (2, 3), (4, 5), (6, 7)]),
    ] {
        for (a, b) in pairs {
            let t = ((r[a] >> shift) ^ r[b]) & mask;
            r[a] ^= t << shift;
            r[b] ^= t;
        }
    }
    r
}

/// The codes `[n, m]` of the codes `q` `[m, n]` transposed, in a new tensor of `dtype`. Each
/// task writes a band of `BAND` rows of the transpose (`BAND` columns of q) in 8x8 blocks
/// (eight 8-byte reads of q, eight 8-byte writes), the edges code by code. Code by code a
/// column at a time, every code read was a cache line of its own (`bench --only quantize_t`,
/// 4096x4096 on 2 threads: 125 ms for the op, the transpose and its copy about 100 of it).
fn transpose_codes(q: &[u8], m: usize, n: usize, dtype: DType) -> Result<Tensor> {
    const BAND: usize = 64;
    let out = Tensor::uninit([n, m], dtype, &Device::CPU)?;
    if m == 0 || n == 0 {
        return Ok(out);
    }
    {
        let mut t = out.host_bytes_mut()?;
        let (m8, word) = (m - m % 8, |b: &[u8]| u64::from_le_bytes(b[..8].try_into().expect("8 bytes")));
        t.par_chunks_mut(BAND * m).enumerate().for_each(|(band, rows)| {
            let (j0, width) = (band * BAND, rows.len() / m);
            let w8 = width - width % 8;
            for i0 in (0..m8).step_by(8) {
                for jj in (0..w8).step_by(8) {
                    let block = transpose_8x8(std::array::from_fn(|k| word(&q[(i0 + k) * n + j0 + jj..])));
                    for (k, w) in block.iter().enumerate() {
                        rows[(jj + k) * m + i0..][..8].copy_from_slice(&w.to_le_bytes());
                    }
                }
            }
            // The columns past the last whole block of 8, then the rows past it.
            for jj in w8..width {
                for i in 0..m8 {
                    rows[jj * m + i] = q[i * n + j0 + jj];
                }
            }
            for i in m8..m {
                for jj in 0..width {
                    rows[jj * m + i] = q[i * n + j0 + jj];
                }
            }
        });
    }
    Ok(out)
}

/// The catalogue op `quantize` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn quantize(_: &KernelCtx<'_>, a: &QuantizeArgs) -> Result<QuantizeOut> {
    let x = view(&a.x)?;
    let scale = a.scale.to_vec::<f32>()?[0];
    // The codes and the amax in one pass.
    let (q, amax) = store_fp8(&x, a.x.shape(), a.fp8_dtype, scale)?;
    let q_t = if a.want_transpose {
        let (m, n) = (a.x.shape()[0], a.x.shape()[1]);
        Some(transpose_codes(&q.host_bytes()?, m, n, a.fp8_dtype)?)
    } else {
        None
    };
    Ok(QuantizeOut { q, q_t, amax: scalar_tensor(amax)?, scale_inv: scalar_tensor(1.0 / scale)? })
}

/// The catalogue op `bgrad_quantize` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn bgrad_quantize(_: &KernelCtx<'_>, a: &BgradQuantizeArgs) -> Result<BgradQuantizeOut> {
    let (m, n) = (a.x.shape()[0], a.x.shape()[1]);
    let x = view(&a.x)?;
    let scale = a.scale.to_vec::<f32>()?[0];
    let (q, amax) = store_fp8(&x, &[m, n], a.fp8_dtype, scale)?;
    // Column sums in f64 then rounded once: the oracle's sum, whatever the row count (the
    // tasks' partial sums are added in f64 too, so their order moves only f64 roundings).
    let sums: Vec<f64> = column_sums(m, n, "bgrad_quantize output dbias", |r, acc| {
        acc.iter_mut().zip(&x[r * n..(r + 1) * n]).for_each(|(s, v)| *s += f64::from(*v));
    })?;
    let sums: Vec<f32> = sums.into_iter().map(|v| v as f32).collect();
    let q_t = if a.want_transpose { Some(transpose_codes(&q.host_bytes()?, m, n, a.fp8_dtype)?) } else { None };
    Ok(BgradQuantizeOut {
        dbias: store(&sums, &[n], a.x.dtype())?,
        q,
        q_t,
        amax: scalar_tensor(amax)?,
        scale_inv: scalar_tensor(1.0 / scale)?,
    })
}

/// The catalogue op `dequantize` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn dequantize(_: &KernelCtx<'_>, a: &DequantizeArgs) -> Result<DequantizeOut> {
    let q = view(&a.q)?;
    let s = a.scale_inv.to_vec::<f32>()?[0];
    let y: Vec<f32> = q.par_iter().map(|v| v * s).collect();
    Ok(DequantizeOut { y: store(&y, a.q.shape(), a.out_dtype)? })
}

/// The catalogue op `compute_amax` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn compute_amax(_: &KernelCtx<'_>, a: &ComputeAmaxArgs) -> Result<ComputeAmaxOut> {
    Ok(ComputeAmaxOut { amax: scalar_tensor(amax(&view(&a.x)?))? })
}

/// The catalogue op `fp8_transpose` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn fp8_transpose(_: &KernelCtx<'_>, a: &Fp8TransposeArgs) -> Result<Fp8TransposeOut> {
    let (m, n) = (a.q.shape()[0], a.q.shape()[1]);
    let q = a.q.host_bytes()?;
    Ok(Fp8TransposeOut { q_t: transpose_codes(&q, m, n, a.q.dtype())? })
}

/// The catalogue op `delayed_scaling` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn delayed_scaling(_: &KernelCtx<'_>, a: &DelayedScalingArgs) -> Result<DelayedScalingOut> {
    let (hist, n) = (a.amax_history.shape()[0], a.amax_history.shape()[1]);
    let mut h = a.amax_history.to_vec::<f32>()?;
    let mut scale = a.scale.to_vec::<f32>()?;
    let mut scale_inv = a.scale_inv.to_vec::<f32>()?;
    for j in 0..n {
        let amax = match a.algo {
            AmaxAlgo::Max => (0..hist)
                .map(|r| h[r * n + j])
                .fold(0.0f32, |m, v| if m.is_nan() || v.is_nan() { f32::NAN } else { m.max(v) }),
            AmaxAlgo::MostRecent => h[j],
        };
        if amax.is_finite() && amax > 0.0 {
            let s = a.fp8_max / amax / 2f32.powf(a.margin);
            if s.is_finite() && s > 0.0 {
                scale[j] = s;
            }
        }
        scale_inv[j] = 1.0 / scale[j];
    }
    // Roll the history up by one row (row 0 moves to the end), then clear row 0.
    h.rotate_left(n);
    h[..n].iter_mut().for_each(|v| *v = 0.0);
    crate::util::write_into(&a.amax_history, &h)?;
    crate::util::write_into(&a.scale, &scale)?;
    crate::util::write_into(&a.scale_inv, &scale_inv)?;
    Ok(DelayedScalingOut {})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocked transpose against the definition, on shapes with and without whole 8x8
    /// blocks and bands, from random codes.
    #[test]
    fn transpose_codes_is_the_transpose() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for (m, n) in [(1, 1), (8, 8), (13, 1000), (64, 136), (136, 64), (37, 300), (9, 7), (200, 129)] {
            let q: Vec<u8> = (0..m * n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 24) as u8
                })
                .collect();
            let t = transpose_codes(&q, m, n, DType::F8E4M3).unwrap().to_vec::<u8>().unwrap();
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(t[j * m + i], q[i * n + j], "{m}x{n}: ({i}, {j})");
                }
            }
        }
    }
}
