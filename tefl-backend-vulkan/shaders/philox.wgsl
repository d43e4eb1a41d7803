// Philox 4x32-10 (Random123), the stream tefl_core::philox defines: the counter is
// (block low, block high, offset low, offset high), the key the seed's two halves.

// The high 32 bits of a · b.
fn mulhi(a: u32, b: u32) -> u32 {
    let al = a & 0xFFFFu;
    let ah = a >> 16u;
    let bl = b & 0xFFFFu;
    let bh = b >> 16u;
    let ll = al * bl;
    let hl = ah * bl;
    let lh = al * bh;
    let cross = (ll >> 16u) + (hl & 0xFFFFu) + (lh & 0xFFFFu);
    return ah * bh + (hl >> 16u) + (lh >> 16u) + (cross >> 16u);
}

fn philox(counter: vec4<u32>, key0: u32, key1: u32) -> vec4<u32> {
    var c = counter;
    var k0 = key0;
    var k1 = key1;
    for (var round = 0u; round < 10u; round++) {
        if (round > 0u) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        let hi0 = mulhi(0xD2511F53u, c.x);
        let lo0 = 0xD2511F53u * c.x;
        let hi1 = mulhi(0xCD9E8D57u, c.z);
        let lo1 = 0xCD9E8D57u * c.z;
        c = vec4<u32>(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
    }
    return c;
}

// The uniform in [0, 1) of element (idx_hi·2^32 + idx_lo) of the stream (seed, offset).
fn philox_uniform(idx_lo: u32, idx_hi: u32, seed_lo: u32, seed_hi: u32, off_lo: u32, off_hi: u32) -> f32 {
    let blk_lo = (idx_lo >> 2u) | (idx_hi << 30u);
    let blk_hi = idx_hi >> 2u;
    let c = philox(vec4<u32>(blk_lo, blk_hi, off_lo, off_hi), seed_lo, seed_hi);
    return f32(c[idx_lo & 3u] >> 8u) * (1.0 / 16777216.0);
}
