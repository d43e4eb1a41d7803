// Dropout with the Philox 4x32-10 stream of tefl_core::philox: element i is kept when
// uniform(seed, offset, i) >= p, kept values scaled by 1/(1 − p); outputs are products, so a
// NaN input stays NaN. Constants: TX (x, y, dy, dx), WG.
// Forward: one invocation per Philox block of 4 elements (one mask word, 4 or 2 output words).
// Backward: one invocation per output word.

struct Params {
    stage: u32,
    total: u32,
    seed_lo: u32,
    seed_hi: u32,
    offset_lo: u32,
    offset_hi: u32,
    p: f32,
}

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> mask: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
var<immediate> p: Params;

fn ld_x(i: u32) -> f32 {
    return unpack(x[word_of(i, TX)], i, TX);
}

fn philox_block(block: u32) -> vec4<u32> {
    return philox(vec4<u32>(block, 0u, p.offset_lo, p.offset_hi), p.seed_lo, p.seed_hi);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let keep_scale = 1.0 / (1.0 - p.p);
    let stride = groups.x * WG;
    if (p.stage == 0u) {
        let blocks = (p.total + 3u) / 4u;
        for (var blk = gid.x; blk < blocks; blk += stride) {
            let c = philox_block(blk);
            var y = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
            var m = 0u;
            for (var l = 0u; l < 4u; l++) {
                let i = blk * 4u + l;
                if (i < p.total) {
                    let u = f32(c[l] >> 8u) * (1.0 / 16777216.0);
                    let keep = u >= p.p;
                    m |= select(0u, 1u, keep) << (8u * l);
                    y[l] = ld_x(i) * select(0.0, keep_scale, keep);
                }
            }
            mask[blk] = m;
            if (TX == F32) {
                for (var l = 0u; l < 4u; l++) {
                    if (blk * 4u + l < p.total) {
                        out[blk * 4u + l] = bitcast<u32>(y[l]);
                    }
                }
            } else {
                out[blk * 2u] = pack(y[0], y[1], TX);
                if (blk * 4u + 2u < p.total) {
                    out[blk * 2u + 1u] = pack(y[2], y[3], TX);
                }
            }
        }
        return;
    }
    let per = per_word(TX);
    let words = (p.total + per - 1u) / per;
    for (var w = gid.x; w < words; w += stride) {
        let i = w * per;
        let lo = ld_x(i) * select(0.0, keep_scale, byte_at(mask[i >> 2u], i) != 0u);
        var hi = 0.0;
        if (per == 2u && i + 1u < p.total) {
            hi = ld_x(i + 1u) * select(0.0, keep_scale, byte_at(mask[(i + 1u) >> 2u], i + 1u) != 0u);
        }
        out[w] = pack(lo, hi, TX);
    }
}
