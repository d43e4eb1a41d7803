// The fused softmax family, forward and backward. Constants: TX (x, y, dx), TG (dy), WG.
// Forward: y = softmax(scale·x) over the last dim with a mask (0 none, 1 byte tensor
// [b or 1, 1, sq, sk], 2 upper triangular j > i, 3 bottom-right aligned j > i + sk − sq);
// masked entries and fully masked rows give 0. Backward: dx = scale·y·(dy − Σ dy·y).
// The general path (any dtypes, any row length); softmax_vec.wgsl is the 16-byte one.

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read> g: array<u32>;
@group(0) @binding(2) var<storage, read> maskt: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

// The two rows' statistics: forward (max, 1/sum), backward (Σ dy·y, unused).
var<workgroup> stat: array<vec2<f32>, 2>;

fn ld_x(i: u32) -> f32 {
    return unpack(x[word_of(i, TX)], i, TX);
}

fn ld_g(i: u32) -> f32 {
    return unpack(g[word_of(i, TG)], i, TG);
}

// Output element e (row r of the block whose stats are stat[r - row0]).
fn element(e: u32, row0: u32) -> f32 {
    let r = e / p.sk;
    let j = e - r * p.sk;
    let st = stat[r - row0];
    if (p.stage == 0u) {
        if (st.x == neg_inf() || masked(r, j)) {
            return 0.0;
        }
        let v = exp(ld_x(e) * p.scale - st.x);
        return v * st.y;
    }
    return p.scale * ld_x(e) * (ld_g(e) - st.x);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let blocks = (p.rows + p.rpg - 1u) / p.rpg;
    let per = per_word(TX);
    for (var blk = group.x; blk < blocks; blk += groups.x) {
        let row0 = blk * p.rpg;
        let nrows = min(p.rpg, p.rows - row0);
        for (var k = 0u; k < nrows; k++) {
            let row = row0 + k;
            let base = row * p.sk;
            if (p.stage == 0u) {
                var m = neg_inf();
                for (var j = lane; j < p.sk; j += WG) {
                    if (!masked(row, j)) {
                        m = max_nan(m, ld_x(base + j) * p.scale);
                    }
                }
                m = reduce_max(m, lane);
                var s = 0.0;
                if (m != neg_inf()) {
                    for (var j = lane; j < p.sk; j += WG) {
                        if (!masked(row, j)) {
                            s += exp(ld_x(base + j) * p.scale - m);
                        }
                    }
                }
                s = reduce_sum(s, lane);
                if (lane == 0u) {
                    stat[k] = vec2<f32>(m, recip_or_zero(s));
                }
            } else {
                var s = 0.0;
                for (var j = lane; j < p.sk; j += WG) {
                    s += ld_x(base + j) * ld_g(base + j);
                }
                s = reduce_sum(s, lane);
                if (lane == 0u) {
                    stat[k] = vec2<f32>(s, 0.0);
                }
            }
        }
        workgroupBarrier();
        let e0 = row0 * p.sk;
        let e1 = (row0 + nrows) * p.sk;
        let w0 = e0 / per;
        let w1 = (e1 + per - 1u) / per;
        for (var w = w0 + lane; w < w1; w += WG) {
            let e = w * per;
            let lo = element(e, row0);
            var hi = 0.0;
            if (per == 2u && e + 1u < e1) {
                hi = element(e + 1u, row0);
            }
            out[w] = pack(lo, hi, TX);
        }
        workgroupBarrier();
    }
}
