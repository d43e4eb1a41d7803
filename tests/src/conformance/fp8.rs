//! FP8: quantize, dequantize, amax, transpose and the delayed-scaling update.

use tefl_core::catalogue::*;
use tefl_core::fp8::Fp8Format;
use tefl_core::{DType, Error, Tensor};

use super::{Cmp, FLOATS, Size, Suite, cmp};
use crate::oracle;

/// Checks a cast of x `[m, n]` (values `xv`, scale `sc`) to the FP8 format `f`: every code of
/// `q` the nearest code of x·scale (the oracle's), and `q_t`, present exactly when `want_t`,
/// the transpose of `q`.
fn check_codes(
    f: Fp8Format,
    xv: &[f64],
    sc: f64,
    q: &Tensor,
    q_t: Option<&Tensor>,
    want_t: bool,
    (m, n): (usize, usize),
) -> tefl_core::Result<()> {
    let codes = q.to_vec::<u8>()?;
    let want: Vec<u8> = xv.iter().map(|v| oracle::fp8_nearest(f, f64::from(*v as f32 * sc as f32))).collect();
    if let Some(i) = codes.iter().zip(&want).position(|(a, b)| a != b) {
        return Err(Error::Tensor(format!("code {i}: {:#04x}, expected {:#04x}", codes[i], want[i])));
    }
    match (q_t, want_t) {
        (Some(qt), true) => {
            let qt = qt.to_vec::<u8>()?;
            if (0..m).any(|i| (0..n).any(|j| qt[j * m + i] != codes[i * n + j])) {
                return Err(Error::Tensor("q_t is not the transpose of q".into()));
            }
            Ok(())
        }
        (None, false) => Ok(()),
        _ => Err(Error::Tensor("q_t present where it should not be, or missing".into())),
    }
}

impl Suite<'_> {
    pub(super) fn fp8(&mut self) {
        for fp8 in [DType::F8E4M3, DType::F8E5M2] {
            let f = Fp8Format::of(fp8).expect("fp8 dtype");
            let sc = if fp8 == DType::F8E4M3 { 100.0 } else { 1000.0 };
            for dtype in FLOATS {
                // Rows of whole 16-byte vectors (n a multiple of 8) and not, a row count under,
                // over and a multiple of the GPU kernels' tiles and of 8 (the transpose's
                // 8-byte stores), and enough elements for several steps of a grid-stride loop.
                // Full runs, bf16 to e4m3: 8200 x 6408, 8 past a multiple of the CUDA register
                // transpose's 128 x 128 tile each way and enough tiles (65 x 51) that some of its
                // blocks (about 24 an SM) stride over more than one row tile on GPUs of up to 134
                // SMs.
                let big: &[(usize, usize, bool)] =
                    if self.size == Size::Full && dtype == DType::BF16 && fp8 == DType::F8E4M3 {
                        &[(8200, 6408, true)]
                    } else {
                        &[]
                    };
                let quantize_shapes = [(13, 1000, true), (136, 520, true), (257, 1024, false), (3, 999, false)];
                for &(m, n, want_t) in quantize_shapes.iter().chain(big) {
                    let name = format!("{m}x{n} to {fp8}{}", if want_t { " with transpose" } else { "" });
                    self.case("quantize", dtype, name, |s| {
                        let (x, xv) = s.rand(&[m, n], dtype, -3.0, 3.0)?;
                        let scale = s.put(&[sc], &[1], DType::F32)?;
                        let o =
                            s.call::<Quantize>(&QuantizeArgs { x, scale, fp8_dtype: fp8, want_transpose: want_t })?;
                        check_codes(f, &xv, sc, &o.q, o.q_t.as_ref(), want_t, (m, n))?;
                        let amax = xv.iter().fold(0.0f64, |a, b| a.max(b.abs()));
                        Ok(vec![
                            cmp("amax", &o.amax, vec![amax], DType::F32)?,
                            cmp("scale_inv", &o.scale_inv, vec![1.0 / sc], DType::F32)?,
                        ])
                    });
                }
                let bgrad_shapes = [(37, 300, true), (1000, 24, false), (1, 7, true), (72, 264, true)];
                for &(m, n, want_t) in bgrad_shapes.iter().chain(big) {
                    self.case("bgrad_quantize", dtype, format!("{m}x{n} to {fp8} transpose={want_t}"), |s| {
                        let (x, xv) = s.rand(&[m, n], dtype, -3.0, 3.0)?;
                        let scale = s.put(&[sc], &[1], DType::F32)?;
                        let o = s.call::<BgradQuantize>(&BgradQuantizeArgs {
                            x,
                            scale,
                            fp8_dtype: fp8,
                            want_transpose: want_t,
                        })?;
                        check_codes(f, &xv, sc, &o.q, o.q_t.as_ref(), want_t, (m, n))?;
                        let dbias: Vec<f64> = (0..n).map(|j| (0..m).map(|i| xv[i * n + j]).sum()).collect();
                        let amax = xv.iter().fold(0.0f64, |a, b| a.max(b.abs()));
                        Ok(vec![
                            cmp("dbias", &o.dbias, dbias, dtype)?,
                            cmp("amax", &o.amax, vec![amax], DType::F32)?,
                            cmp("scale_inv", &o.scale_inv, vec![1.0 / sc], DType::F32)?,
                        ])
                    });
                }
                for len in [4097, 65544] {
                    self.case("compute_amax", dtype, len.to_string(), |s| {
                        let (x, xv) = s.rand(&[len], dtype, -3.0, 3.0)?;
                        let o = s.call::<ComputeAmax>(&ComputeAmaxArgs { x })?;
                        Ok(vec![cmp("amax", &o.amax, vec![xv.iter().fold(0.0f64, |a, b| a.max(b.abs()))], DType::F32)?])
                    });
                }
            }
            for out_dtype in FLOATS {
                // Every finite code among 4097 draws (a count no vector width divides), then
                // exactly 4096 finite codes.
                for (draws, keep) in [(4097, usize::MAX), (5000, 4096)] {
                    let name = format!("{fp8} {}", if keep == usize::MAX { draws } else { keep });
                    self.case("dequantize", out_dtype, name, |s| {
                        let codes: Vec<u8> = (0..draws)
                            .map(|i| (i * 37 % 256) as u8)
                            .filter(|c| f.decode(*c).is_finite())
                            .take(keep)
                            .collect();
                        let n = codes.len();
                        let q = Tensor::from_slice(&codes, [n], fp8)?.to_device(&s.device)?;
                        let si = s.put(&[0.5], &[1], DType::F32)?;
                        let o = s.call::<Dequantize>(&DequantizeArgs { q, scale_inv: si, out_dtype })?;
                        let want: Vec<f64> = codes.iter().map(|c| f64::from(f.decode(*c)) * 0.5).collect();
                        Ok(vec![cmp("y", &o.y, crate::round(&want, out_dtype), out_dtype)?])
                    });
                }
            }
            self.case("fp8_transpose", fp8, "33x1000".into(), |s| {
                let codes: Vec<u8> = (0..33 * 1000).map(|i| (i * 7 % 251) as u8).collect();
                let q = Tensor::from_slice(&codes, [33, 1000], fp8)?.to_device(&s.device)?;
                let o = s.call::<Fp8Transpose>(&Fp8TransposeArgs { q })?;
                let got: Vec<f64> = o.q_t.to_vec::<u8>()?.into_iter().map(f64::from).collect();
                let want: Vec<f64> = (0..1000)
                    .flat_map(|j| (0..33).map(move |i| (i, j)))
                    .map(|(i, j)| f64::from(codes[i * 1000 + j]))
                    .collect();
                Ok(vec![Cmp { name: "q_t", got, want, dtype: DType::F32, floor: 0.0, nan: false }])
            });
        }
        for algo in [AmaxAlgo::Max, AmaxAlgo::MostRecent] {
            self.case("fused_amax_and_scale_update_after_reduction", DType::F32, format!("{algo:?} margin 1"), |s| {
                let mut hv = s.rng.vec(16 * 5, 0.0, 10.0);
                // column 3: zeros (the scale is kept); column 4: an inf (kept, for Max)
                for r in 0..16 {
                    hv[r * 5 + 3] = 0.0;
                }
                hv[7 * 5 + 4] = f64::INFINITY;
                let h = s.put(&hv, &[16, 5], DType::F32)?;
                let hv = h.to_vec::<f64>()?;
                let scale = s.put(&[1.0, 2.0, 3.0, 4.0, 5.0], &[5], DType::F32)?;
                let scale_inv = s.poisoned(&[5], DType::F32)?;
                s.call::<FusedAmaxAndScaleUpdate>(&DelayedScalingArgs {
                    amax_history: h.clone(),
                    scale: scale.clone(),
                    scale_inv: scale_inv.clone(),
                    fp8_max: 448.0,
                    margin: 1.0,
                    algo,
                })?;
                let (nh, ns, nsi) = oracle::delayed_scaling(&hv, 5, &[1.0, 2.0, 3.0, 4.0, 5.0], 448.0, 1.0, algo);
                Ok(vec![
                    cmp("amax_history", &h, nh, DType::F32)?,
                    cmp("scale", &scale, ns, DType::F32)?,
                    cmp("scale_inv", &scale_inv, nsi, DType::F32)?,
                ])
            });
        }
    }
}
