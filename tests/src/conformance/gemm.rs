//! `generic_gemm`: every epilogue and transpose, with and without accumulation; FP8 inputs
//! (both formats, every output kind, the TN form and others); `te_general_grouped_gemm`.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error};

use super::{Cmp, FLOATS, Suite, cmp};
use crate::oracle;

/// The dtype whose tolerance a float output of an FP8 GEMM is held to: FP8 tensor cores
/// accumulate with fewer bits than f32 (Hopper's fast mode, and its split mode between
/// promotions), so an f32 output gets the bf16 tolerance; f16 and bf16 keep their own.
fn fp8_product_tolerance(out: DType) -> DType {
    if out == DType::F32 { DType::BF16 } else { out }
}

impl Suite<'_> {
    #[allow(clippy::too_many_arguments)]
    fn gemm_case(
        &mut self,
        dtype: DType,
        (m, k, n): (usize, usize, usize),
        ta: bool,
        tb: bool,
        ep: GemmEpilogue,
        acc: bool,
    ) {
        let case = format!("{m}x{k}x{n} transa={ta} transb={tb} {ep:?} accumulate={acc}");
        self.case("generic_gemm", dtype, case, |s| {
            let (a, av) = s.rand(&if ta { [k, m] } else { [m, k] }, dtype, -1.0, 1.0)?;
            let (b, bv) = s.rand(&if tb { [n, k] } else { [k, n] }, dtype, -1.0, 1.0)?;
            let bias = if ep.needs_bias() { Some(s.rand(&[n], dtype, -1.0, 1.0)?) } else { None };
            let aux = if ep.needs_aux() { Some(s.rand(&[m, n], dtype, -2.0, 2.0)?) } else { None };
            let c = if acc { Some(s.rand(&[m, n], DType::F32, -1.0, 1.0)?) } else { None };
            let args = GemmArgs {
                a,
                b,
                bias: bias.as_ref().map(|x| x.0.clone()),
                aux: aux.as_ref().map(|x| x.0.clone()),
                c: c.as_ref().map(|x| x.0.clone()),
                a_scale_inv: None,
                b_scale_inv: None,
                d_scale: None,
                transa: ta,
                transb: tb,
                alpha: 0.75,
                accumulate: acc,
                epilogue: ep,
                out_dtype: dtype,
                split_accumulator: false,
            };
            let o = s.call::<GenericGemm>(&args)?;
            let (d, aux_out, bias_grad) = oracle::gemm(
                &av,
                &bv,
                (m, k, n),
                ta,
                tb,
                0.75,
                c.as_ref().map(|x| x.1.as_slice()),
                bias.as_ref().map(|x| x.1.as_slice()),
                aux.as_ref().map(|x| x.1.as_slice()),
                ep,
            );
            let mut out = vec![cmp("d", &o.d, d, dtype)?];
            match (aux_out, &o.aux_out) {
                (Some(w), Some(g)) => out.push(cmp("aux_out", g, w, dtype)?),
                (None, None) => {}
                _ => return Err(Error::Tensor("aux_out present where it should not be, or missing".into())),
            }
            match (bias_grad, &o.bias_grad) {
                (Some(w), Some(g)) => out.push(cmp("bias_grad", g, w, dtype)?),
                (None, None) => {}
                _ => return Err(Error::Tensor("bias_grad present where it should not be, or missing".into())),
            }
            Ok(out)
        });
    }

    /// One FP8 `generic_gemm`: A of `fa`, B of `fb` with their scale_inv, D of `out` (an FP8 D
    /// is compared decoded and unscaled, with its amax).
    #[allow(clippy::too_many_arguments)]
    fn fp8_gemm_case(
        &mut self,
        (fa, fb): (DType, DType),
        out: DType,
        (m, k, n): (usize, usize, usize),
        (ta, tb): (bool, bool),
        ep: GemmEpilogue,
        acc: bool,
        split: bool,
    ) {
        let case =
            format!("{fa}x{fb} -> {out} {m}x{k}x{n} transa={ta} transb={tb} {ep:?} accumulate={acc} split={split}");
        self.case("generic_gemm", fa, case, |s| {
            let (a, av) = s.rand(&if ta { [k, m] } else { [m, k] }, fa, -2.0, 2.0)?;
            let (b, bv) = s.rand(&if tb { [n, k] } else { [k, n] }, fb, -2.0, 2.0)?;
            let (sa, sb, sd) = (0.5, 0.125, 4.0);
            let bias = if ep.needs_bias() { Some(s.rand(&[n], DType::BF16, -1.0, 1.0)?) } else { None };
            let c = if acc { Some(s.rand(&[m, n], DType::F32, -1.0, 1.0)?) } else { None };
            let args = GemmArgs {
                a,
                b,
                a_scale_inv: Some(s.put(&[sa], &[1], DType::F32)?),
                b_scale_inv: Some(s.put(&[sb], &[1], DType::F32)?),
                d_scale: if out.is_fp8() { Some(s.put(&[sd], &[1], DType::F32)?) } else { None },
                bias: bias.as_ref().map(|x| x.0.clone()),
                aux: None,
                c: c.as_ref().map(|x| x.0.clone()),
                transa: ta,
                transb: tb,
                alpha: 0.75,
                accumulate: acc,
                epilogue: ep,
                out_dtype: out,
                split_accumulator: split,
            };
            let o = s.call::<GenericGemm>(&args)?;
            let (d, aux_out, _) = oracle::gemm(
                &av,
                &bv,
                (m, k, n),
                ta,
                tb,
                0.75 * sa * sb,
                c.as_ref().map(|x| x.1.as_slice()),
                bias.as_ref().map(|x| x.1.as_slice()),
                None,
                ep,
            );
            let mut cmps = Vec::new();
            if out.is_fp8() {
                let amax = d.iter().fold(0.0f64, |a, v| a.max(v.abs()));
                // Against the exact D at the format's tolerance: a GPU rounds its f32 (or bf16)
                // D, whose accumulation differs from the oracle's, so codes near a tie may flip.
                let got: Vec<f64> = o.d.to_vec::<f64>()?.iter().map(|v| v / sd).collect();
                cmps.push(Cmp { name: "d", got, want: d, dtype: out, floor: 0.0, nan: false });
                let d_amax = o.d_amax.as_ref().ok_or_else(|| Error::Tensor("d_amax missing".into()))?;
                cmps.push(cmp("d_amax", d_amax, vec![amax], DType::BF16)?);
            } else {
                cmps.push(cmp("d", &o.d, d, fp8_product_tolerance(out))?);
                if o.d_amax.is_some() {
                    return Err(Error::Tensor("d_amax for a float D".into()));
                }
            }
            match (aux_out, &o.aux_out) {
                (Some(w), Some(g)) => cmps.push(cmp("aux_out", g, w, fp8_product_tolerance(aux_dtype(out)))?),
                (None, None) => {}
                _ => return Err(Error::Tensor("aux_out present where it should not be, or missing".into())),
            }
            Ok(cmps)
        });
    }

    /// One `te_general_grouped_gemm` over groups of `dims` (m, k, n), with a bias per group or
    /// none; FP8 inputs when `dtype` is an FP8 dtype (D in bf16 then).
    fn grouped_case(
        &mut self,
        dtype: DType,
        dims: &[(usize, usize, usize)],
        (ta, tb): (bool, bool),
        with_bias: bool,
        split: bool,
    ) {
        let out = if dtype.is_fp8() { DType::BF16 } else { dtype };
        let shown = if dims.len() > 8 { format!("{:?}..", &dims[..4]) } else { format!("{dims:?}") };
        let case = format!("{} groups {shown} transa={ta} transb={tb} bias={with_bias} split={split}", dims.len());
        self.case("te_general_grouped_gemm", dtype, case, |s| {
            let (mut a, mut b, mut sa, mut sb, mut bias, mut want) = (vec![], vec![], vec![], vec![], vec![], vec![]);
            for (g, &(m, k, n)) in dims.iter().enumerate() {
                let (at, av) = s.rand(&if ta { [k, m] } else { [m, k] }, dtype, -2.0, 2.0)?;
                let (bt, bv) = s.rand(&if tb { [n, k] } else { [k, n] }, dtype, -2.0, 2.0)?;
                let scale = if dtype.is_fp8() { 1.0 / (g + 1) as f64 } else { 1.0 };
                if dtype.is_fp8() {
                    sa.push(s.put(&[scale], &[1], DType::F32)?);
                    sb.push(s.put(&[0.5], &[1], DType::F32)?);
                }
                let bv_bias = if with_bias {
                    let (t, v) = s.rand(&[n], out, -1.0, 1.0)?;
                    bias.push(t);
                    Some(v)
                } else {
                    None
                };
                let alpha = if dtype.is_fp8() { scale * 0.5 } else { 1.0 };
                let ep = if with_bias { GemmEpilogue::Bias } else { GemmEpilogue::None };
                want.push(oracle::gemm(&av, &bv, (m, k, n), ta, tb, alpha, None, bv_bias.as_deref(), None, ep).0);
                a.push(at);
                b.push(bt);
            }
            let o = s.call::<GroupedGemm>(&GroupedGemmArgs {
                a,
                b,
                a_scale_inv: sa,
                b_scale_inv: sb,
                bias,
                transa: ta,
                transb: tb,
                out_dtype: out,
                split_accumulator: split,
            })?;
            if o.d.len() != dims.len() {
                return Err(Error::Tensor(format!("{} outputs for {} groups", o.d.len(), dims.len())));
            }
            // One comparison over every group's D (empty groups add nothing but must be [0, n]).
            let (mut got, mut all) = (Vec::new(), Vec::new());
            for ((d, w), &(m, _, n)) in o.d.iter().zip(want).zip(dims) {
                if d.shape() != [m, n] {
                    return Err(Error::Tensor(format!("a group's D is {:?}, expected [{m}, {n}]", d.shape())));
                }
                got.extend(d.to_vec::<f64>()?);
                all.extend(w);
            }
            Ok(vec![Cmp { name: "d", got, want: all, dtype: out, floor: 0.0, nan: false }])
        });
    }

    pub(super) fn gemm(&mut self) {
        let eps = [
            GemmEpilogue::None,
            GemmEpilogue::Bias,
            GemmEpilogue::Gelu,
            GemmEpilogue::BiasGelu,
            GemmEpilogue::DGelu,
            GemmEpilogue::DGeluBiasGrad,
            GemmEpilogue::BiasGrad,
        ];
        for dtype in FLOATS {
            for (i, &ep) in eps.iter().enumerate() {
                for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                    self.gemm_case(dtype, (17 + i, 33, 9 + 2 * i), ta, tb, ep, i % 2 == 1);
                }
            }
            self.gemm_case(dtype, (1, 1000, 257), false, true, GemmEpilogue::Bias, false);
            self.gemm_case(dtype, (65, 129, 1), true, false, GemmEpilogue::None, true);
            self.gemm_case(dtype, (96, 4097, 40), false, false, GemmEpilogue::None, false);
        }
        let (e4, e5) = (DType::F8E4M3, DType::F8E5M2);
        for formats in [(e4, e4), (e5, e4), (e4, e5)] {
            for out in [DType::BF16, DType::F16, DType::F32, e4] {
                for split in [false, true] {
                    // The TN form on aligned shapes (Hopper's FP8 tensor-core path), then others.
                    self.fp8_gemm_case(formats, out, (64, 128, 48), (false, true), GemmEpilogue::None, false, split);
                }
                self.fp8_gemm_case(formats, out, (96, 64, 80), (false, true), GemmEpilogue::Bias, false, true);
                self.fp8_gemm_case(formats, out, (17, 33, 9), (false, false), GemmEpilogue::None, false, false);
                self.fp8_gemm_case(formats, out, (32, 48, 64), (true, false), GemmEpilogue::BiasGelu, false, true);
                self.fp8_gemm_case(formats, out, (48, 32, 16), (true, true), GemmEpilogue::None, true, false);
            }
        }
        self.fp8_gemm_case((e4, e4), e5, (64, 64, 64), (false, true), GemmEpilogue::Gelu, false, false);
        let moe = [(40, 64, 32), (0, 64, 32), (7, 64, 32), (129, 64, 32)];
        let ragged = [(5, 16, 24), (33, 48, 8), (1, 7, 3)];
        for dtype in FLOATS.into_iter().chain([e4, e5]) {
            self.grouped_case(dtype, &moe, (false, true), true, true);
            self.grouped_case(dtype, &ragged, (false, false), false, true);
            self.grouped_case(dtype, &ragged, (true, true), true, true);
        }
        // Shapes Hopper's one-launch kernel takes (16-byte rows): several row and column tiles,
        // K steps with a tail, an empty group, every operand form; FP8 fast and split.
        let tiled = [(200, 208, 264), (0, 128, 264), (8, 48, 264), (264, 336, 264)];
        for dtype in [DType::BF16, DType::F16, e4, e5] {
            for (i, form) in [(false, true), (false, false), (true, false), (true, true)].into_iter().enumerate() {
                self.grouped_case(dtype, &tiled, form, i % 2 == 0, i < 2);
            }
        }
        // D rows that are not 16-byte multiples (written element-wise at the edges, not by the
        // copy engine).
        for dtype in [DType::BF16, e4] {
            self.grouped_case(dtype, &[(72, 64, 260), (136, 128, 260)], (false, true), true, false);
        }
        // More groups than the smallest table (8), and more than one launch's 64.
        let many: Vec<_> = (0..70).map(|g| (8 * (g % 3), 32, 24 + 8 * (g % 2))).collect();
        self.grouped_case(DType::BF16, &many[..20], (false, true), true, false);
        self.grouped_case(DType::BF16, &many, (false, false), false, false);
    }
}
