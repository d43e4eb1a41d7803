// The fused softmax family where x, y, dy and dx are one 16-bit dtype TX and rows are whole
// 16-byte chunks (sk a multiple of 8): a workgroup per row at a time, 16-byte loads and stores,
// the row read again for each pass (from cache); max and sums through subgroup operations
// (wg_reduce.wgsl). Same stages and masks as softmax.wgsl (softmax_params.wgsl). Constants: TX,
// WG.

@group(0) @binding(0) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> g: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> maskt: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<u32>>;

// Element k (0..7) of e.
fn at8(e: Eight, k: u32) -> f32 {
    return select(e.hi[k & 3u], e.lo[k & 3u], k < 4u);
}

fn max4(v: vec4<f32>) -> f32 {
    return max(max(v.x, v.y), max(v.z, v.w));
}

// Without a mask, whole chunks at a time. A NaN needs no tracking here: the max may pass it
// over, but it reaches the sum through its exponential and makes the whole row NaN, as it must.
fn forward_plain(row: u32, lane: u32, sg: u32, sg_lane: u32, subgroups: u32) {
    let chunks = p.sk / 8u;
    let base = row * chunks;
    var m = neg_inf();
    for (var c = lane; c < chunks; c += WG) {
        let e = unpack8(x[base + c]);
        m = max(m, max(max4(e.lo * p.scale), max4(e.hi * p.scale)));
    }
    m = wg_max_nan(m, sg, sg_lane, subgroups);
    var s = 0.0;
    for (var c = lane; c < chunks; c += WG) {
        let e = unpack8(x[base + c]);
        s += dot(exp(e.lo * p.scale - m), vec4<f32>(1.0)) + dot(exp(e.hi * p.scale - m), vec4<f32>(1.0));
    }
    let inv = recip_or_zero(wg_sum(vec2<f32>(s, 0.0), sg, sg_lane, subgroups).x);
    for (var c = lane; c < chunks; c += WG) {
        let e = unpack8(x[base + c]);
        var y = Eight(exp(e.lo * p.scale - m) * inv, exp(e.hi * p.scale - m) * inv);
        if (m == neg_inf()) {
            y = Eight(vec4<f32>(0.0), vec4<f32>(0.0));
        }
        out[base + c] = pack8(y);
    }
}

// With a mask, element by element within each chunk.
fn forward_masked(row: u32, lane: u32, sg: u32, sg_lane: u32, subgroups: u32) {
    let chunks = p.sk / 8u;
    let base = row * chunks;
    var m = neg_inf();
    for (var c = lane; c < chunks; c += WG) {
        let e = unpack8(x[base + c]);
        for (var k = 0u; k < 8u; k++) {
            if (!masked(row, c * 8u + k)) {
                m = max_nan(m, at8(e, k) * p.scale);
            }
        }
    }
    m = wg_max_nan(m, sg, sg_lane, subgroups);
    var s = 0.0;
    if (m != neg_inf()) {
        for (var c = lane; c < chunks; c += WG) {
            let e = unpack8(x[base + c]);
            for (var k = 0u; k < 8u; k++) {
                if (!masked(row, c * 8u + k)) {
                    s += exp(at8(e, k) * p.scale - m);
                }
            }
        }
    }
    let inv = recip_or_zero(wg_sum(vec2<f32>(s, 0.0), sg, sg_lane, subgroups).x);
    for (var c = lane; c < chunks; c += WG) {
        let e = unpack8(x[base + c]);
        var y = Eight(exp(e.lo * p.scale - m) * inv, exp(e.hi * p.scale - m) * inv);
        for (var k = 0u; k < 8u; k++) {
            if (m == neg_inf() || masked(row, c * 8u + k)) {
                if (k < 4u) {
                    y.lo[k & 3u] = 0.0;
                } else {
                    y.hi[k & 3u] = 0.0;
                }
            }
        }
        out[base + c] = pack8(y);
    }
}

fn backward(row: u32, lane: u32, sg: u32, sg_lane: u32, subgroups: u32) {
    let chunks = p.sk / 8u;
    let base = row * chunks;
    var s = 0.0;
    for (var c = lane; c < chunks; c += WG) {
        let y = unpack8(x[base + c]);
        let d = unpack8(g[base + c]);
        s += dot(y.lo, d.lo) + dot(y.hi, d.hi);
    }
    let t = wg_sum(vec2<f32>(s, 0.0), sg, sg_lane, subgroups).x;
    for (var c = lane; c < chunks; c += WG) {
        let y = unpack8(x[base + c]);
        let d = unpack8(g[base + c]);
        out[base + c] = pack8(Eight(p.scale * y.lo * (d.lo - t), p.scale * y.hi * (d.hi - t)));
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(num_subgroups) subgroups: u32,
) {
    for (var row = group.x; row < p.rows; row += groups.x) {
        if (p.stage == 0u && p.mask == 0u) {
            forward_plain(row, lane, sg, sg_lane, subgroups);
        } else if (p.stage == 0u) {
            forward_masked(row, lane, sg, sg_lane, subgroups);
        } else {
            backward(row, lane, sg, sg_lane, subgroups);
        }
    }
}
