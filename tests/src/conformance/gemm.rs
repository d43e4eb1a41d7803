//! `generic_gemm`: every epilogue and transpose, with and without accumulation.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error};

use super::{FLOATS, Suite, cmp};
use crate::oracle;

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
                transa: ta,
                transb: tb,
                alpha: 0.75,
                accumulate: acc,
                epilogue: ep,
                out_dtype: dtype,
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
    }
}
