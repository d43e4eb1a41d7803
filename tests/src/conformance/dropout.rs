//! Dropout, forward and backward, on the Philox stream.

use tefl_core::catalogue::*;
use tefl_core::{DType, Tensor};

use super::{Cmp, FLOATS, Suite, cmp};

impl Suite<'_> {
    pub(super) fn dropout(&mut self) {
        for dtype in FLOATS {
            for (rows, n) in [(1, 1000), (7, 4097)] {
                self.case("dropout_fwd", dtype, format!("{rows}x{n} p=0.3"), |s| {
                    let (x, xv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                    let o = s.call::<DropoutFwd>(&DropoutFwdArgs { x, p: 0.3, seed: 7, offset: 11 })?;
                    let keep = 1.0 / (1.0 - f64::from(0.3f32));
                    let kept: Vec<f64> = (0..xv.len())
                        .map(|i| f64::from(u8::from(tefl_core::philox::uniform(7, 11, i as u64) >= 0.3)))
                        .collect();
                    let y = xv.iter().zip(&kept).map(|(x, k)| x * k * keep).collect();
                    let mask: Vec<f64> = o.mask.to_vec::<u8>()?.into_iter().map(f64::from).collect();
                    Ok(vec![
                        cmp("y", &o.y, y, dtype)?,
                        Cmp { name: "mask", got: mask, want: kept, dtype: DType::F32, floor: 0.0, nan: false },
                    ])
                });
                self.case("dropout_bwd", dtype, format!("{rows}x{n} p=0.3"), |s| {
                    let (dy, dyv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                    let mv: Vec<u8> = (0..rows * n).map(|i| u8::from(i % 3 != 0)).collect();
                    let mask = Tensor::from_slice(&mv, [rows, n], DType::U8)?.to_device(&s.device)?;
                    let o = s.call::<DropoutBwd>(&DropoutBwdArgs { dy, mask, p: 0.3 })?;
                    let keep = 1.0 / (1.0 - f64::from(0.3f32));
                    let want = dyv.iter().zip(&mv).map(|(d, m)| d * f64::from(*m) * keep).collect();
                    Ok(vec![cmp("dx", &o.dx, want, dtype)?])
                });
            }
        }
    }
}
