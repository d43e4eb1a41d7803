// RMSNorm and LayerNorm where every tensor of a row is the one 16-bit dtype TX and rows are
// whole 16-byte chunks of 8 elements (n a multiple of 8): a workgroup per row at a time, 16-byte
// loads and stores. Row sums go through subgroup additions and one shared slot per subgroup
// (wg_reduce.wgsl). Constants: TX, BWD, WG.
//
// BWD 0, the forward, reads the row again for each pass (the second read hits the cache;
// holding the row in a private array was twice as slow on the H100). BWD 1 (RMSNorm) and 2
// (LayerNorm) are the backward: only the LayerNorm variant keeps Σ dy per column, so the
// RMSNorm one holds half the accumulators (80 registers instead of 128 on the H200, where
// 16384×8192 bf16 went from 68% to 93% of a copy's bandwidth, 2026-12-02).
//
// Stages (norm_params.wgsl) as in norm.wgsl: 0/1 forward (y, mu, rsigma), 2/3 backward (dx,
// and this workgroup's partial column sums of dy·x̂ and dy in ws row `group`, kept by each
// invocation across its rows: it owns the same 4 chunks of columns of every row; the host sends
// rows of at most 4·WG chunks here). norm.wgsl's stage 4 then sums the parts.

@group(0) @binding(0) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> gamma: array<vec4<u32>>;
// beta (forward) or dy (backward).
@group(0) @binding(2) var<storage, read> aux: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> addt: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> mu: array<f32>;
@group(0) @binding(5) var<storage, read_write> rs: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<u32>>;
// The backward's partial column sums as 16-byte units (4 f32; n a multiple of 8, so each
// invocation's chunk of columns starts on a unit). Bound to `out` in the forward, which does
// not touch it (the host binds a buffer of at least 16 bytes).
@group(0) @binding(7) var<storage, read_write> ws: array<vec4<f32>>;

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

// The backward: each invocation owns chunks lane + i·WG (i < CH) of every row and keeps their
// partial column sums across the rows it visits. (Measured on the H100: this private-array form
// ran at 0.654 ms for 16384×8192 bf16, named per-chunk values at 0.69–0.84.)
const CH: u32 = 4u;
// Accumulators per invocation: elements 0..3 and 4..7 of each chunk.
const ACC: u32 = 8u;

// Row `row`'s owned chunks of x and dy (those past the row's end are left as they were).
fn load_row(row: u32, lane: u32, cx: ptr<function, array<vec4<u32>, CH>>, cd: ptr<function, array<vec4<u32>, CH>>) {
    let chunks = p.n / 8u;
    let base = row * chunks;
    for (var i = 0u; i < CH; i++) {
        let c = lane + i * WG;
        if (c < chunks) {
            (*cx)[i] = x[base + c];
            (*cd)[i] = aux[base + c];
        }
    }
}

fn backward(first: u32, step: u32, lane: u32, sg: u32, sg_lane: u32, subgroups: u32) {
    let chunks = p.n / 8u;
    let nf = f32(p.n);
    let layer = BWD == 2u;
    // Σ dy·x̂ and Σ dy over this workgroup's rows, per owned column (lo/hi of chunk i at 2i, 2i+1);
    // the RMSNorm variant never touches acc_b, so it takes no registers there.
    var acc_g: array<vec4<f32>, ACC>;
    var acc_b: array<vec4<f32>, ACC>;
    var cx: array<vec4<u32>, CH>;
    var cd: array<vec4<u32>, CH>;
    for (var row = first; row < p.rows; row += step) {
        let base = row * chunks;
        var mean = 0.0;
        if (layer) {
            mean = mu[row];
        }
        let rsig = rs[row];
        load_row(row, lane, &cx, &cd);
        var sd = 0.0;
        var sdx = 0.0;
        for (var i = 0u; i < CH; i++) {
            let c = lane + i * WG;
            if (c < chunks) {
                let e = unpack8(cx[i]);
                let dy = unpack8(cd[i]);
                let g = scale8(c);
                let xl = (e.lo - mean) * rsig;
                let xh = (e.hi - mean) * rsig;
                let dl = dy.lo * g.lo;
                let dh = dy.hi * g.hi;
                sd += dot(dl, vec4<f32>(1.0)) + dot(dh, vec4<f32>(1.0));
                sdx += dot(dl, xl) + dot(dh, xh);
                acc_g[2u * i] += dy.lo * xl;
                acc_g[2u * i + 1u] += dy.hi * xh;
                if (layer) {
                    acc_b[2u * i] += dy.lo;
                    acc_b[2u * i + 1u] += dy.hi;
                }
            }
        }
        let t = wg_sum(vec2<f32>(sd, sdx), sg, sg_lane, subgroups);
        let md = select(0.0, t.x / nf, layer);
        let mdx = t.y / nf;
        for (var i = 0u; i < CH; i++) {
            let c = lane + i * WG;
            if (c < chunks) {
                let e = unpack8(cx[i]);
                let dy = unpack8(cd[i]);
                let g = scale8(c);
                let xl = (e.lo - mean) * rsig;
                let xh = (e.hi - mean) * rsig;
                var dx = Eight(rsig * (dy.lo * g.lo - md - xl * mdx), rsig * (dy.hi * g.hi - md - xh * mdx));
                if (p.has_add != 0u) {
                    let a = unpack8(addt[base + c]);
                    dx = Eight(dx.lo + a.lo, dx.hi + a.hi);
                }
                out[base + c] = pack8(dx);
            }
        }
    }
    for (var i = 0u; i < CH; i++) {
        let c = lane + i * WG;
        if (c < chunks) {
            // Whole units: element by element, each subgroup's store touched 32 sectors for 128
            // bytes (the CUDA kernel's 16-byte stores of the same partials took its LayerNorm
            // backward from 90% to 97% of a copy on the H200).
            let at = (first * p.n + c * 8u) / 4u;
            let bt = p.parts * p.n / 4u + at;
            ws[at] = acc_g[2u * i];
            ws[at + 1u] = acc_g[2u * i + 1u];
            if (layer) {
                ws[bt] = acc_b[2u * i];
                ws[bt + 1u] = acc_b[2u * i + 1u];
            }
        }
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
