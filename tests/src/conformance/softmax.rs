//! The fused softmax variants, forward and backward.

use tefl_core::catalogue::*;
use tefl_core::{DType, Tensor};

use super::{FLOATS, Size, Suite, cmp};
use crate::oracle;

impl Suite<'_> {
    pub(super) fn softmax(&mut self) {
        type Fwd = fn(&Suite, SoftmaxArgs) -> tefl_core::Result<SoftmaxOut>;
        let fwds: [(&'static str, Fwd, u8); 3] = [
            ("scaled_softmax_forward", |s, a| s.call::<ScaledSoftmaxForward>(&a), 0),
            (
                "scaled_upper_triang_masked_softmax_forward",
                |s, a| s.call::<ScaledUpperTriangMaskedSoftmaxForward>(&a),
                1,
            ),
            (
                "scaled_aligned_causal_masked_softmax_forward",
                |s, a| s.call::<ScaledAlignedCausalMaskedSoftmaxForward>(&a),
                2,
            ),
        ];
        type Bwd = fn(&Suite, SoftmaxBwdArgs) -> tefl_core::Result<SoftmaxBwdOut>;
        let bwds: [(&'static str, Bwd); 4] = [
            ("scaled_softmax_backward", |s, a| s.call::<ScaledSoftmaxBackward>(&a)),
            ("scaled_masked_softmax_backward", |s, a| s.call::<ScaledMaskedSoftmaxBackward>(&a)),
            ("scaled_upper_triang_masked_softmax_backward", |s, a| {
                s.call::<ScaledUpperTriangMaskedSoftmaxBackward>(&a)
            }),
            ("scaled_aligned_causal_masked_softmax_backward", |s, a| {
                s.call::<ScaledAlignedCausalMaskedSoftmaxBackward>(&a)
            }),
        ];
        // The last two have no rows (no heads, no queries).
        let mut shapes = vec![
            (2, 3, 5, 7),
            (1, 2, 9, 9),
            (1, 1, 3, 1000),
            (2, 2, 17, 4097),
            (1, 1, 2, 16384),
            (2, 0, 5, 7),
            (1, 2, 0, 9),
        ];
        if self.size == Size::Full {
            shapes.push((1, 2, 64, 16384));
        }
        for dtype in FLOATS {
            for &(b, h, sq, sk) in &shapes {
                let shape = [b, h, sq, sk];
                let case = format!("{shape:?}");
                for (name, f, kind) in fwds {
                    if kind == 1 && sq > sk {
                        continue;
                    }
                    self.case(name, dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&shape, dtype, -5.0, 5.0)?;
                        let o = f(s, SoftmaxArgs { x, scale: 0.7 })?;
                        let sc = f64::from(0.7f32);
                        let want = match kind {
                            0 => oracle::softmax(&xv, sq, sk, sc, |_, _, _| false),
                            1 => oracle::softmax(&xv, sq, sk, sc, |_, i, j| j > i),
                            _ => {
                                oracle::softmax(&xv, sq, sk, sc, |_, i, j| j as i64 > i as i64 + sk as i64 - sq as i64)
                            }
                        };
                        Ok(vec![cmp("y", &o.y, want, dtype)?])
                    });
                }
                for mb in [1, b] {
                    self.case("scaled_masked_softmax_forward", dtype, format!("{case} mask batch {mb}"), |s| {
                        let (x, xv) = s.rand(&shape, dtype, -5.0, 5.0)?;
                        let mv: Vec<u8> = (0..mb * sq * sk).map(|_| u8::from(s.rng.uniform(0.0, 1.0) < 0.3)).collect();
                        let mask = Tensor::from_slice(&mv, [mb, 1, sq, sk], DType::U8)?.to_device(&s.device)?;
                        let o = s.call::<ScaledMaskedSoftmaxForward>(&MaskedSoftmaxArgs { x, mask, scale: 0.7 })?;
                        let want = oracle::softmax(&xv, sq, sk, f64::from(0.7f32), |r, i, j| {
                            let bb = if mb == 1 { 0 } else { r / (h * sq) };
                            mv[(bb * sq + i) * sk + j] != 0
                        });
                        Ok(vec![cmp("y", &o.y, want, dtype)?])
                    });
                }
                for (name, f) in bwds {
                    self.case(name, dtype, case.clone(), |s| {
                        let n = b * h * sq * sk;
                        let raw = s.rng.vec(n, -5.0, 5.0);
                        let yv = oracle::softmax(&raw, sq, sk, 1.0, |_, _, _| false);
                        let y = s.put(&yv, &shape, dtype)?;
                        let yv = y.to_vec::<f64>()?;
                        let (dy, dyv) = s.rand(&shape, dtype, -1.0, 1.0)?;
                        let o = f(s, SoftmaxBwdArgs { dy, y, scale: 0.7 })?;
                        let sc = f64::from(0.7f32);
                        let mut want = vec![0.0; n];
                        for r in 0..n / sk {
                            let dt: f64 = (0..sk).map(|j| yv[r * sk + j] * dyv[r * sk + j]).sum();
                            for j in 0..sk {
                                want[r * sk + j] = sc * yv[r * sk + j] * (dyv[r * sk + j] - dt);
                            }
                        }
                        Ok(vec![cmp("dx", &o.dx, want, dtype)?])
                    });
                }
            }
        }
    }
}
