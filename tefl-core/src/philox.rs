//! Philox 4x32-10, the counter-based generator every backend uses for dropout, so that a
//! (seed, offset, index) triple gives the same random number everywhere.
//!
//! Stream definition: element `i` of a call with (`seed`, `offset`) takes lane `i % 4` of
//! `philox4x32_10(counter, key)` with `counter = [c₀, c₁, c₂, c₃]`, `c₀c₁ = i / 4` (low, high
//! 32 bits) and `c₂c₃ = offset`, and `key = [seed low, seed high]`; the uniform is
//! `(u32 >> 8) · 2⁻²⁴` in [0, 1).
//!
//! ```
//! use tefl_core::philox::{philox4x32_10, uniform};
//! // Known-answer vector from the Random123 distribution (all-zero counter and key).
//! assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
//! let u = uniform(42, 0, 7);
//! assert!((0.0..1.0).contains(&u));
//! ```

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

/// Ten rounds of Philox 4x32.
#[inline]
pub fn philox4x32_10(mut ctr: [u32; 4], mut key: [u32; 2]) -> [u32; 4] {
    for round in 0..10 {
        if round > 0 {
            key[0] = key[0].wrapping_add(W0);
            key[1] = key[1].wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, ctr[0]);
        let (hi1, lo1) = mulhilo(M1, ctr[2]);
        ctr = [hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0];
    }
    ctr
}

/// The four uniforms of block `block` (elements `4·block .. 4·block + 4`).
#[inline]
pub fn uniforms4(seed: u64, offset: u64, block: u64) -> [f32; 4] {
    let r = philox4x32_10(
        [block as u32, (block >> 32) as u32, offset as u32, (offset >> 32) as u32],
        [seed as u32, (seed >> 32) as u32],
    );
    r.map(|x| (x >> 8) as f32 * (1.0 / 16_777_216.0))
}

/// The uniform in [0, 1) of element `index`.
#[inline]
pub fn uniform(seed: u64, offset: u64, index: u64) -> f32 {
    uniforms4(seed, offset, index / 4)[(index % 4) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random123_known_answers() {
        // Known-answer tests of philox4x32_10 from Random123's kat_vectors.
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32_10([0xffffffff; 4], [0xffffffff; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn uniforms_are_roughly_uniform() {
        let n = 100_000;
        let mean = (0..n).map(|i| f64::from(uniform(1, 2, i))).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        assert_ne!(uniform(1, 2, 0), uniform(1, 3, 0));
        assert_ne!(uniform(1, 2, 0), uniform(2, 2, 0));
    }
}
