// The push constants of the RoPE shaders (rope.wgsl, rope_vec.wgsl) and the position of a token
// row (each shader binds cu_seqlens as `cu` and the start positions as `starts`).

struct Params {
    qkv_layout: u32,
    interleaved: u32,
    backward: u32,
    batch: u32,
    s: u32,
    h: u32,
    d: u32,
    d_rot: u32,
    has_starts: u32,
    total: u32,
}

var<immediate> p: Params;

// (position plus start, whether the row belongs to a sequence) of token row `row`.
fn row_position(row: u32) -> vec2<u32> {
    var b = 0u;
    var q = 0u;
    var ok = 1u;
    if (p.qkv_layout == 0u) {
        b = row / p.s;
        q = row - b * p.s;
    } else if (p.qkv_layout == 1u) {
        q = row / p.batch;
        b = row - q * p.batch;
    } else {
        // The last sequence whose first row is <= row.
        var lo = 0u;
        var hi = p.batch - 1u;
        while (lo < hi) {
            let mid = (lo + hi + 1u) / 2u;
            if (u32(cu[mid]) <= row) {
                lo = mid;
            } else {
                hi = mid - 1u;
            }
        }
        b = lo;
        let first = u32(cu[b]);
        ok = select(0u, 1u, row >= first && row < u32(cu[b + 1u]));
        q = row - min(row, first);
    }
    if (p.has_starts != 0u) {
        q += u32(starts[b]);
    }
    return vec2<u32>(q, ok);
}

