// generic_gemm, the portable path: stage 0 writes W = alpha·op(A)·op(B) in f32 from 64×64
// tiles (gemm_tiles.wgsl); stage 1 is the epilogue (C, bias, GELU with aux, dGELU) rounding to
// D; stages 2 and 3 sum the unrounded values over the rows for the bias gradient. Stages 1 to 3
// read only W of the product, so they also finish gemm_fp8.wgsl's. Constants: TX (A and B), WG (= 256).
// Dtypes of C, bias, aux and D are push constants (gemm_params.wgsl, shared with gemm_coop.wgsl).

@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read> c: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<u32>;
@group(0) @binding(5) var<storage, read> aux: array<u32>;
@group(0) @binding(6) var<storage, read_write> d: array<u32>;
// The aux output (stage 1), or the f32 partial column sums (stages 2 and 3).
@group(0) @binding(7) var<storage, read_write> aux_out: array<u32>;

fn ld_a(i: u32) -> f32 {
    return unpack(a[word_of(i, TX)], i, TX);
}

fn ld_b(i: u32) -> f32 {
    return unpack(b[word_of(i, TX)], i, TX);
}

// op(A)[r, kk], 0 outside.
fn op_a(r: u32, kk: u32) -> f32 {
    if (r >= p.m || kk >= p.k) {
        return 0.0;
    }
    return ld_a(select(r * p.k + kk, kk * p.m + r, p.transa != 0u));
}

// op(B)[kk, col], 0 outside.
fn op_b(kk: u32, col: u32) -> f32 {
    if (kk >= p.k || col >= p.n) {
        return 0.0;
    }
    return ld_b(select(kk * p.n + col, col * p.k + kk, p.transb != 0u));
}

fn gelu(x: f32) -> f32 {
    return 0.5 * x * (1.0 + tanh_safe(0.7978845608 * (x + 0.044715 * x * x * x)));
}

fn dgelu(x: f32) -> f32 {
    let t = tanh_safe(0.7978845608 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608 * (1.0 + 3.0 * 0.044715 * x * x);
}

// The epilogue of element i: (d value, aux_out value).
fn epilogue(i: u32) -> vec2<f32> {
    var v = w[i];
    if (p.accumulate != 0u) {
        v += unpack(c[word_of(i, p.tc)], i, p.tc);
    }
    let j = i % p.n;
    if (p.ep == 1u || p.ep == 3u) {
        v += unpack(bias[word_of(j, p.tb)], j, p.tb);
    }
    var pre = 0.0;
    if (p.ep == 2u || p.ep == 3u) {
        pre = v;
        v = gelu(v);
    }
    if (p.ep == 4u || p.ep == 5u) {
        v *= dgelu(unpack(aux[word_of(i, p.taux)], i, p.taux));
    }
    if (p.ep == 5u || p.ep == 6u) {
        w[i] = v;
    }
    return vec2<f32>(v, pre);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    switch p.stage {
        case 0u: {
            product_tile(group, lane, p.alpha);
        }
        case 1u: {
            let total = p.m * p.n;
            let per = per_word(p.td);
            let words = (total + per - 1u) / per;
            let writes_aux = p.ep == 2u || p.ep == 3u;
            for (var wd = gid.x; wd < words; wd += groups.x * WG) {
                let i = wd * per;
                let lo = epilogue(i);
                var hi = vec2<f32>(0.0, 0.0);
                if (per == 2u && i + 1u < total) {
                    hi = epilogue(i + 1u);
                }
                d[wd] = pack(lo.x, hi.x, p.td);
                if (writes_aux) {
                    aux_out[wd] = pack(lo.y, hi.y, p.td);
                }
            }
        }
        case 2u: {
            // Partial column sums of w: workgroup (x, y) sums rows y, y + parts, ... of columns
            // x·WG + lane into aux_out[y·n + col].
            let col = group.x * WG + lane;
            if (col >= p.n) {
                return;
            }
            var s = 0.0;
            for (var r = group.y; r < p.m; r += p.parts) {
                s += w[r * p.n + col];
            }
            aux_out[group.y * p.n + col] = bitcast<u32>(s);
        }
        default: {
            let col = gid.x;
            if (col >= p.n) {
                return;
            }
            var s = 0.0;
            for (var q = 0u; q < p.parts; q++) {
                s += bitcast<f32>(aux_out[q * p.n + col]);
            }
            d[col] = bitcast<u32>(s);
        }
    }
}
