// RMSNorm and LayerNorm, forward and backward, on a workgroup per row (two rows for a 16-bit
// output row of odd length). Dtypes are push constants (codes of common.wgsl) since x, gamma,
// beta, dy, add and y may each differ. Constant: WG.
//
// Stages: 0 RMSNorm forward, 1 LayerNorm forward (y, mu, rsigma); 2 RMSNorm backward, 3
// LayerNorm backward (dx, and per-workgroup partial column sums of dy·x̂ and dy in ws); 4 the
// column sums of ws's parts at `ws_offset` written as one gamma-typed vector (dgamma, dbeta).

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read> gamma: array<u32>;
@group(0) @binding(2) var<storage, read> aux: array<u32>;
@group(0) @binding(3) var<storage, read> addt: array<u32>;
@group(0) @binding(4) var<storage, read_write> mu: array<f32>;
@group(0) @binding(5) var<storage, read_write> rs: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<u32>;
@group(0) @binding(7) var<storage, read_write> ws: array<f32>;

// Per row of the block: (mean or 0, rsigma, mean(d), mean(d·x̂)).
var<workgroup> stat: array<vec4<f32>, 2>;

fn ld_x(i: u32) -> f32 {
    return unpack(x[word_of(i, p.tx)], i, p.tx);
}

fn ld_aux(i: u32) -> f32 {
    return unpack(aux[word_of(i, p.ta)], i, p.ta);
}

fn ld_add(i: u32) -> f32 {
    return unpack(addt[word_of(i, p.tadd)], i, p.tadd);
}

fn scale_of(j: u32) -> f32 {
    let g = unpack(gamma[word_of(j, p.tg)], j, p.tg);
    return select(g, g + 1.0, p.zero_centered != 0u);
}

fn layer() -> bool {
    return p.stage == 1u || p.stage == 3u;
}

// Output element e of the block starting at row0.
fn element(e: u32, row0: u32) -> f32 {
    let r = e / p.n;
    return element_at(e, e - r * p.n, stat[r - row0]);
}

// Output element e, column j of its row, whose statistics are st.
fn element_at(e: u32, j: u32, st: vec4<f32>) -> f32 {
    let xh = (ld_x(e) - st.x) * st.y;
    if (p.stage <= 1u) {
        var y = xh * scale_of(j);
        if (p.stage == 1u) {
            y += ld_aux(j);
        }
        return y;
    }
    let d = ld_aux(e) * scale_of(j);
    var dx = st.y * (d - st.z - xh * st.w);
    if (p.has_add != 0u) {
        dx += ld_add(e);
    }
    return dx;
}

// This invocation's part of Σ (x − c) (squared when `sq`) over the row starting at element
// `base`: whole words of two elements where the row starts on a word and has even length (one
// load per word instead of one per element), else element by element.
fn row_moment(base: u32, c: f32, sq: bool, lane: u32) -> f32 {
    var s = 0.0;
    if (p.tx != F32 && (base & 1u) == 0u && (p.n & 1u) == 0u) {
        let w0 = base >> 1u;
        for (var w = lane; w < (p.n >> 1u); w += WG) {
            let word = x[w0 + w];
            let lo = unpack(word, 0u, p.tx) - c;
            let hi = unpack(word, 1u, p.tx) - c;
            s += select(lo + hi, lo * lo + hi * hi, sq);
        }
        return s;
    }
    for (var j = lane; j < p.n; j += WG) {
        let v = ld_x(base + j) - c;
        s += select(v, v * v, sq);
    }
    return s;
}

// Stage 4's partial sums: word lane × part lane.
var<workgroup> colsum: array<vec2<f32>, WG>;

// Stage 4: the workgroup writes words w0.. w0 + WG/8 − 1 of the output; invocation `lane` is
// word lane lane % (WG/8) and part lane lane / (WG/8), summing parts pl, pl + 8, ... (the parts
// of one word are summed by eight invocations at once, not by one in sequence).
fn column_sums(w0: u32, lane: u32, per: u32) {
    let lanes = WG / 8u;
    let wl = lane % lanes;
    let pl = lane / lanes;
    let w = w0 + wl;
    let words = (p.n + per - 1u) / per;
    var s = vec2<f32>(0.0);
    if (w < words) {
        let j = w * per;
        let two = per == 2u && j + 1u < p.n;
        for (var q = pl; q < p.parts; q += 8u) {
            let at = p.ws_offset + q * p.n + j;
            s.x += ws[at];
            if (two) {
                s.y += ws[at + 1u];
            }
        }
    }
    colsum[lane] = s;
    workgroupBarrier();
    if (pl == 0u && w < words) {
        var t = vec2<f32>(0.0);
        for (var k = 0u; k < 8u; k++) {
            t += colsum[wl + k * lanes];
        }
        out[w] = pack(t.x, t.y, p.to);
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let per = per_word(p.to);
    if (p.stage == 4u) {
        let words = (p.n + per - 1u) / per;
        for (var w0 = group.x * (WG / 8u); w0 < words; w0 += groups.x * (WG / 8u)) {
            column_sums(w0, lane, per);
        }
        return;
    }
    let blocks = (p.rows + p.rpg - 1u) / p.rpg;
    let nf = f32(p.n);
    for (var blk = group.x; blk < blocks; blk += groups.x) {
        let row0 = blk * p.rpg;
        let nrows = min(p.rpg, p.rows - row0);
        for (var k = 0u; k < nrows; k++) {
            let row = row0 + k;
            let base = row * p.n;
            var mean = 0.0;
            var rsig = 0.0;
            if (p.stage <= 1u) {
                if (layer()) {
                    mean = reduce_sum(row_moment(base, 0.0, false, lane), lane) / nf;
                }
                rsig = inverseSqrt(reduce_sum(row_moment(base, mean, true, lane), lane) / nf + p.eps);
                if (lane == 0u) {
                    rs[row] = rsig;
                    if (layer()) {
                        mu[row] = mean;
                    }
                }
                if (lane == 0u) {
                    stat[k] = vec4<f32>(mean, rsig, 0.0, 0.0);
                }
            } else {
                if (layer()) {
                    mean = mu[row];
                }
                rsig = rs[row];
                var sd = 0.0;
                var sdx = 0.0;
                for (var j = lane; j < p.n; j += WG) {
                    let d = ld_aux(base + j) * scale_of(j);
                    sd += d;
                    sdx += d * (ld_x(base + j) - mean) * rsig;
                }
                var md = 0.0;
                if (layer()) {
                    md = reduce_sum(sd, lane) / nf;
                }
                let mdx = reduce_sum(sdx, lane) / nf;
                if (lane == 0u) {
                    stat[k] = vec4<f32>(mean, rsig, md, mdx);
                }
            }
        }
        workgroupBarrier();
        let e0 = row0 * p.n;
        let e1 = (row0 + nrows) * p.n;
        if (nrows == 1u) {
            // One row (rows start on a word): columns follow from the word, no division.
            let st = stat[0];
            for (var w = e0 / per + lane; w < (e1 + per - 1u) / per; w += WG) {
                let e = w * per;
                let lo = element_at(e, e - e0, st);
                var hi = 0.0;
                if (per == 2u && e + 1u < e1) {
                    hi = element_at(e + 1u, e + 1u - e0, st);
                }
                out[w] = pack(lo, hi, p.to);
            }
        } else {
            for (var w = e0 / per + lane; w < (e1 + per - 1u) / per; w += WG) {
                let e = w * per;
                let lo = element(e, row0);
                var hi = 0.0;
                if (per == 2u && e + 1u < e1) {
                    hi = element(e + 1u, row0);
                }
                out[w] = pack(lo, hi, p.to);
            }
        }
        if (p.stage >= 2u) {
            // This workgroup's partial column sums of dy·x̂ (ws row `group`) and dy (after
            // parts·n): one invocation per column, so no two write one sum.
            let first = blk == group.x;
            for (var j = lane; j < p.n; j += WG) {
                var sg = 0.0;
                var sb = 0.0;
                for (var k = 0u; k < nrows; k++) {
                    let i = (row0 + k) * p.n + j;
                    let dy = ld_aux(i);
                    let st = stat[k];
                    sg += dy * (ld_x(i) - st.x) * st.y;
                    sb += dy;
                }
                let at = group.x * p.n + j;
                let bt = p.parts * p.n + at;
                if (first) {
                    ws[at] = sg;
                    ws[bt] = sb;
                } else {
                    ws[at] += sg;
                    ws[bt] += sb;
                }
            }
        }
        workgroupBarrier();
    }
}
