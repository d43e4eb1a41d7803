//! OCP FP8 (E4M3 and E5M2) conversions: round to nearest even, saturating.
//!
//! Saturation follows the convention of TransformerEngine's casts (`satfinite`): finite values
//! beyond the largest normal, and infinities, become the largest normal of the same sign.
//! NaN becomes the canonical code `0x7F` (a NaN in both formats).
//!
//! ```
//! use tefl_core::fp8::Fp8Format;
//! assert_eq!(Fp8Format::E4M3.encode(448.0), 0x7E);
//! assert_eq!(Fp8Format::E4M3.encode(1.0e6), 0x7E); // saturates
//! assert_eq!(Fp8Format::E5M2.decode(0x7B), 57344.0);
//! ```

use crate::DType;

/// One of the two OCP 8-bit float formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// 4 exponent bits (bias 7), 3 mantissa bits; max 448; no infinities; NaN = S.1111.111.
    E4M3,
    /// 5 exponent bits (bias 15), 2 mantissa bits; max 57344; IEEE-style inf and NaN.
    E5M2,
}

/// The canonical NaN code both formats produce.
pub const NAN_CODE: u8 = 0x7F;

impl Fp8Format {
    /// The format stored by an FP8 dtype, or `None` for other dtypes.
    pub fn of(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F8E4M3 => Some(Fp8Format::E4M3),
            DType::F8E5M2 => Some(Fp8Format::E5M2),
            _ => None,
        }
    }

    /// The dtype of this format.
    pub fn dtype(self) -> DType {
        match self {
            Fp8Format::E4M3 => DType::F8E4M3,
            Fp8Format::E5M2 => DType::F8E5M2,
        }
    }

    /// Mantissa bits: 3 (E4M3) or 2 (E5M2).
    #[inline]
    pub const fn mantissa_bits(self) -> i32 {
        match self {
            Fp8Format::E4M3 => 3,
            Fp8Format::E5M2 => 2,
        }
    }

    /// The exponent bias: 7 (E4M3) or 15 (E5M2).
    #[inline]
    pub const fn bias(self) -> i32 {
        match self {
            Fp8Format::E4M3 => 7,
            Fp8Format::E5M2 => 15,
        }
    }

    /// The code of the largest finite value (positive sign).
    #[inline]
    pub const fn max_code(self) -> u8 {
        match self {
            Fp8Format::E4M3 => 0x7E,
            Fp8Format::E5M2 => 0x7B,
        }
    }

    /// The largest finite value: 448 or 57344.
    #[inline]
    pub const fn max(self) -> f32 {
        match self {
            Fp8Format::E4M3 => 448.0,
            Fp8Format::E5M2 => 57344.0,
        }
    }

    /// Decodes one code to f32 (exact: every FP8 value is an f32).
    #[inline]
    pub fn decode(self, code: u8) -> f32 {
        let mb = self.mantissa_bits();
        let negative = code & 0x80 != 0;
        let exp_field = i32::from((code & 0x7F) >> mb);
        let mantissa = i32::from(code) & ((1 << mb) - 1);
        let all_ones = (1 << (7 - mb)) - 1;
        let magnitude = match self {
            Fp8Format::E4M3 if exp_field == all_ones && mantissa == (1 << mb) - 1 => f32::NAN,
            Fp8Format::E5M2 if exp_field == all_ones => {
                if mantissa == 0 {
                    f32::INFINITY
                } else {
                    f32::NAN
                }
            }
            _ if exp_field == 0 => mantissa as f32 * pow2(1 - self.bias() - mb),
            _ => ((1 << mb) + mantissa) as f32 * pow2(exp_field - self.bias() - mb),
        };
        if negative { -magnitude } else { magnitude }
    }

    /// Encodes an f32 with round-to-nearest-even and saturation to ±max.
    #[inline]
    pub fn encode(self, x: f32) -> u8 {
        if x.is_nan() {
            return NAN_CODE;
        }
        let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = x.abs();
        if a >= self.max() {
            return sign | self.max_code();
        }
        let mb = self.mantissa_bits();
        let emin = 1 - self.bias();
        // floor(log2(a)) from the f32 exponent field; f32 subnormals and zero fall below emin.
        let biased = ((a.to_bits() >> 23) & 0xFF) as i32;
        let e = (biased - 127).max(emin);
        let quantum = pow2(e - mb);
        // Dividing by a power of two is exact here (no overflow, no underflow). The quotient is
        // below 2^(mb + 1), so adding 2^23 rounds it to an integer, ties to even (f32's own
        // rounding), and the integer is the sum's low mantissa bits (its ulp is 1). This replaced
        // `round_ties_even(..) as i32`: a libm call on CPUs without SSE4.1, and most of an FP8
        // output's time on the CPU.
        const TWO_23: f32 = 8_388_608.0;
        let n = (a / quantum + TWO_23).to_bits().wrapping_sub(TWO_23.to_bits()) as i32;
        let code = ((e - emin) << mb) + n;
        sign | (code.min(i32::from(self.max_code())) as u8)
    }
}

/// 2^k for the small exponents FP8 needs (exact).
#[inline]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Encodes a slice of f32 into E4M3 or E5M2 codes.
pub fn encode_slice(format: Fp8Format, src: &[f32], dst: &mut [u8]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = format.encode(s);
    }
}

/// Decodes a slice of FP8 codes into f32.
pub fn decode_slice(format: Fp8Format, src: &[u8], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = format.decode(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The OCP FP8 value table written out from the spec's definition, independently of
    /// `decode`: value = (-1)^s · 2^(E−bias) · (1 + M/2^m) for E > 0, 2^(1−bias) · M/2^m for E = 0,
    /// with E4M3's S.1111.111 = NaN and E5M2's E = 11111 = inf (M = 0) or NaN.
    fn ocp_table(format: Fp8Format) -> Vec<f64> {
        let (m_bits, bias) = match format {
            Fp8Format::E4M3 => (3u32, 7i32),
            Fp8Format::E5M2 => (2u32, 15i32),
        };
        (0u32..256)
            .map(|c| {
                let s = if c & 0x80 != 0 { -1.0 } else { 1.0 };
                let e = ((c & 0x7F) >> m_bits) as i32;
                let m = f64::from(c & ((1 << m_bits) - 1));
                let e_max = (1 << (7 - m_bits)) - 1;
                let frac = m / f64::from(1u32 << m_bits);
                match format {
                    Fp8Format::E4M3 if e == e_max && m == 7.0 => f64::NAN,
                    Fp8Format::E5M2 if e == e_max && m == 0.0 => s * f64::INFINITY,
                    Fp8Format::E5M2 if e == e_max => f64::NAN,
                    _ if e == 0 => s * 2f64.powi(1 - bias) * frac,
                    _ => s * 2f64.powi(e - bias) * (1.0 + frac),
                }
            })
            .collect()
    }

    #[test]
    fn decode_matches_ocp_table_for_all_256_codes() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let table = ocp_table(format);
            for (code, &want) in table.iter().enumerate() {
                let got = format.decode(code as u8);
                if want.is_nan() {
                    assert!(got.is_nan(), "{format:?} code {code:#04x}: want NaN, got {got}");
                } else {
                    assert_eq!(
                        f64::from(got).to_bits(),
                        want.to_bits(),
                        "{format:?} code {code:#04x}: got {got}, want {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn encode_inverts_decode_for_every_finite_code() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for (code, v) in ocp_table(format).into_iter().enumerate() {
                if v.is_finite() {
                    assert_eq!(format.encode(v as f32), code as u8, "{format:?} {v}");
                }
            }
        }
    }

    #[test]
    fn midpoints_round_to_even_and_neighbours_round_to_nearest() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let table = ocp_table(format);
            // Positive finite codes in increasing value order are 0..=max_code.
            for c in 0..format.max_code() {
                let (lo, hi) = (table[c as usize], table[c as usize + 1]);
                let mid = (lo + hi) / 2.0;
                let even = if c % 2 == 0 { c } else { c + 1 };
                assert_eq!(format.encode(mid as f32), even, "{format:?} midpoint {mid}");
                assert_eq!(format.encode(-mid as f32), 0x80 | even, "{format:?} -{mid}");
                let below = lo + (hi - lo) * 0.25;
                let above = lo + (hi - lo) * 0.75;
                assert_eq!(format.encode(below as f32), c);
                assert_eq!(format.encode(above as f32), c + 1);
            }
        }
    }

    #[test]
    fn saturation_nan_and_anchor_values() {
        let e4 = Fp8Format::E4M3;
        let e5 = Fp8Format::E5M2;
        assert_eq!(e4.decode(0x7E), 448.0);
        assert_eq!(e4.decode(0x08), 2f32.powi(-6));
        assert_eq!(e4.decode(0x01), 2f32.powi(-9));
        assert_eq!(e5.decode(0x7B), 57344.0);
        assert_eq!(e5.decode(0x04), 2f32.powi(-14));
        assert_eq!(e5.decode(0x01), 2f32.powi(-16));
        assert_eq!(e5.decode(0x7C), f32::INFINITY);
        assert_eq!(e5.decode(0xFC), f32::NEG_INFINITY);
        assert_eq!(e4.encode(500.0), 0x7E);
        assert_eq!(e4.encode(f32::INFINITY), 0x7E);
        assert_eq!(e4.encode(f32::NEG_INFINITY), 0xFE);
        assert_eq!(e5.encode(1e9), 0x7B);
        assert_eq!(e5.encode(-f32::INFINITY), 0xFB);
        assert_eq!(e4.encode(f32::NAN), NAN_CODE);
        assert!(e4.decode(e4.encode(f32::NAN)).is_nan());
        assert!(e5.decode(e5.encode(f32::NAN)).is_nan());
        assert_eq!(e4.encode(-0.0), 0x80);
        // Half of the smallest subnormal rounds to zero (even), just above it rounds up.
        assert_eq!(e4.encode(2f32.powi(-10)), 0);
        assert_eq!(e4.encode(2f32.powi(-10) * 1.01), 1);
        assert_eq!(e4.encode(1e-40), 0);
        // Between max and the next (non-existent) step: still max.
        assert_eq!(e4.encode(447.0), 0x7E);
        assert_eq!(e4.encode(420.0), 0x7D); // nearer 416 (0x7D) than 448
        assert_eq!(e4.encode(432.0), 0x7E); // tie 416/448: even mantissa wins (448 = 1.110b)
    }
}
