// RMSNorm and LayerNorm, forward or backward (constant BWD), where every tensor of a row is the
// one 16-bit dtype TX and rows are whole 16-byte chunks of 8 elements (n a multiple of 8): a
// workgroup per row at a time, 16-byte loads and stores, the row read again for each pass (the
// second read hits the cache; holding the row in a private array was twice as slow on the
// H100). Row sums go through subgroup additions and one shared slot per subgroup
// (wg_reduce.wgsl). Constants: TX, BWD, WG.
//
// Stages (norm_params.wgsl) as in norm.wgsl: 0/1 forward (y, mu, rsigma), 2/3 backward (dx,
// and this workgroup's partial column sums of dy·x̂ and dy in ws row `group`, kept in
// registers across its rows: each invocation owns the same 4 chunks of columns of every row;
// the host sends rows of at most 4·WG chunks here).
// norm.wgsl's stage 4 then sums the parts.

@group(0) @binding(0) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> gamma: array<vec4<u32>>;
// beta (forward) or dy (backward).
@group(0) @binding(2) var<storage, read> aux: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> addt: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> mu: array<f32>;
@group(0) @binding(5) var<storage, read_write> rs: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read_write> ws: array<f32>;

// gamma's chunk c (plus one where gamma is zero-centred).
fn scale8(c: u32) -> Eight {
    let g = unpack8(gamma[c]);
    if (p.zero_centered != 0u) {
        return Eight(g.lo + 1.0, g.hi + 1.0);
    }
    return g;
}

fn forward(first: u32, step: u32, lane: u32, sg: u32, sg_lane: u32, subgroups: u32) {
    let chunks = p.n / 8u;
    let nf = f32(p.n);
    let layer = p.stage == 1u;
    for (var row = first; row < p.rows; row += step) {
        let base = row * chunks;
        var mean = 0.0;
        if (layer) {
            var s = 0.0;
            for (var c = lane; c < chunks; c += WG) {
                s += total(unpack8(x[base + c]));
            }
            mean = wg_sum(vec2<f32>(s, 0.0), sg, sg_lane, subgroups).x / nf;
        }
        var q = 0.0;
        for (var c = lane; c < chunks; c += WG) {
            let e = unpack8(x[base + c]);
            let a = e.lo - mean;
            let b = e.hi - mean;
            q += dot(a, a) + dot(b, b);
        }
        let rsig = inverseSqrt(wg_sum(vec2<f32>(q, 0.0), sg, sg_lane, subgroups).x / nf + p.eps);
        if (lane == 0u) {
            rs[row] = rsig;
            if (layer) {
                mu[row] = mean;
            }
        }
        for (var c = lane; c < chunks; c += WG) {
            let e = unpack8(x[base + c]);
            let g = scale8(c);
            var y = Eight((e.lo - mean) * rsig * g.lo, (e.hi - mean) * rsig * g.hi);
            if (layer) {
                let b = unpack8(aux[c]);
                y = Eight(y.lo + b.lo, y.hi + b.hi);
            }
            out[base + c] = pack8(y);
        }
    }
}

// The partial column sums an invocation keeps for one of its chunks: Σ dy·x̂ and Σ dy, elements
// 0..3 and 4..7.
struct Part {
    g_lo: vec4<f32>,
    g_hi: vec4<f32>,
    b_lo: vec4<f32>,
    b_hi: vec4<f32>,
}

fn put_part(q: Part, at: u32, bt: u32) {
    for (var e = 0u; e < 4u; e++) {
        ws[at + e] = q.g_lo[e];
        ws[at + 4u + e] = q.g_hi[e];
        ws[bt + e] = q.b_lo[e];
        ws[bt + 4u + e] = q.b_hi[e];
    }
}

// x and dy of one chunk (zero bits, i.e. +0, past the row's end).
struct Pair {
    x: Eight,
    dy: Eight,
    g: Eight,
}

fn pair_at(base: u32, c: u32, chunks: u32) -> Pair {
    if (c >= chunks) {
        let zero = Eight(vec4<f32>(0.0), vec4<f32>(0.0));
        return Pair(zero, zero, zero);
    }
    return Pair(unpack8(x[base + c]), unpack8(aux[base + c]), scale8(c));
}

// x̂ of a chunk, elements 0..3 and 4..7.
fn xhat(q: Pair, mean: f32, rsig: f32) -> Eight {
    return Eight((q.x.lo - mean) * rsig, (q.x.hi - mean) * rsig);
}

// (Σ dy·γ, Σ dy·γ·x̂) of a chunk.
fn sums(q: Pair, xh: Eight) -> vec2<f32> {
    let dl = q.dy.lo * q.g.lo;
    let dh = q.dy.hi * q.g.hi;
    return vec2<f32>(dot(dl, vec4<f32>(1.0)) + dot(dh, vec4<f32>(1.0)), dot(dl, xh.lo) + dot(dh, xh.hi));
}

fn grown(s: Part, q: Pair, xh: Eight) -> Part {
    return Part(s.g_lo + q.dy.lo * xh.lo, s.g_hi + q.dy.hi * xh.hi, s.b_lo + q.dy.lo, s.b_hi + q.dy.hi);
}

// Writes dx of chunk c (inside the row).
fn put_dx(q: Pair, xh: Eight, base: u32, c: u32, rsig: f32, md: f32, mdx: f32) {
    var dx = Eight(rsig * (q.dy.lo * q.g.lo - md - xh.lo * mdx), rsig * (q.dy.hi * q.g.hi - md - xh.hi * mdx));
    if (p.has_add != 0u) {
        let a = unpack8(addt[base + c]);
        dx = Eight(dx.lo + a.lo, dx.hi + a.hi);
    }
    out[base + c] = pack8(dx);
}

// The backward: each invocation owns chunks lane + i·WG (i < 4) of every row, loads all of a
// row's at once into named values and keeps their partial column sums in four named values (a
// private array indexed in a loop goes to memory on NVIDIA's compiler, and its loop is not
// unrolled, which serialises the loads).
fn backward(first: u32, step: u32, lane: u32, sg: u32, sg_lane: u32, subgroups: u32) {
    let chunks = p.n / 8u;
    let nf = f32(p.n);
    let layer = p.stage == 3u;
    let c0 = lane;
    let c1 = lane + WG;
    let c2 = lane + 2u * WG;
    let c3 = lane + 3u * WG;
    var s0: Part;
    var s1: Part;
    var s2: Part;
    var s3: Part;
    for (var row = first; row < p.rows; row += step) {
        let base = row * chunks;
        var mean = 0.0;
        if (layer) {
            mean = mu[row];
        }
        let rsig = rs[row];
        let q0 = pair_at(base, c0, chunks);
        let q1 = pair_at(base, c1, chunks);
        let q2 = pair_at(base, c2, chunks);
        let q3 = pair_at(base, c3, chunks);
        let h0 = xhat(q0, mean, rsig);
        let h1 = xhat(q1, mean, rsig);
        let h2 = xhat(q2, mean, rsig);
        let h3 = xhat(q3, mean, rsig);
        s0 = grown(s0, q0, h0);
        s1 = grown(s1, q1, h1);
        s2 = grown(s2, q2, h2);
        s3 = grown(s3, q3, h3);
        let local = sums(q0, h0) + sums(q1, h1) + sums(q2, h2) + sums(q3, h3);
        let t = wg_sum(local, sg, sg_lane, subgroups);
        let md = select(0.0, t.x / nf, layer);
        let mdx = t.y / nf;
        if (c0 < chunks) {
            put_dx(q0, h0, base, c0, rsig, md, mdx);
        }
        if (c1 < chunks) {
            put_dx(q1, h1, base, c1, rsig, md, mdx);
        }
        if (c2 < chunks) {
            put_dx(q2, h2, base, c2, rsig, md, mdx);
        }
        if (c3 < chunks) {
            put_dx(q3, h3, base, c3, rsig, md, mdx);
        }
    }
    let at = first * p.n;
    let bt = p.parts * p.n + at;
    if (c0 < chunks) {
        put_part(s0, at + c0 * 8u, bt + c0 * 8u);
    }
    if (c1 < chunks) {
        put_part(s1, at + c1 * 8u, bt + c1 * 8u);
    }
    if (c2 < chunks) {
        put_part(s2, at + c2 * 8u, bt + c2 * 8u);
    }
    if (c3 < chunks) {
        put_part(s3, at + c3 * 8u, bt + c3 * 8u);
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
    if (BWD == 0u) {
        forward(group.x, groups.x, lane, sg, sg_lane, subgroups);
    } else {
        backward(group.x, groups.x, lane, sg, sg_lane, subgroups);
    }
}
