// Flash attention forward: a workgroup of BR invocations serves BR query rows of one head of one
// sequence, one row each (its q and f32 accumulator are private arrays). The row's keys go by
// steps of BC, an online softmax over them; no sq x sk buffer. lse = scale·max + log Σ exp
// (−inf for a row that sees no key; its output row is 0). Workgroups: (query blocks, hq, batch).

// Keys per step of the online softmax.
const BC: u32 = 16u;

@group(0) @binding(6) var<storage, read_write> o: array<atomic<u32>>;
@group(0) @binding(7) var<storage, read_write> lse: array<f32>;

fn out_store(slot: u32, w: u32, bits: u32) {
    atomicStore(&o[w], bits);
}

fn out_merge(slot: u32, w: u32, bits: u32, keep: u32) {
    atomicAnd(&o[w], keep);
    atomicOr(&o[w], bits);
}

@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let x = query_row(wid, t);
    if (x.q0 >= x.slot) {
        return;
    }
    var qr: array<f32, DM>;
    var acc: array<f32, DM>;
    load_row(&qr, 0u, row_base(x.s.qb + u32(select(0, x.i, x.valid)) * x.s.rs, a.hq, x.h), x.valid);
    zero_row(&acc);
    // m: the running max of the raw scores; probabilities are exp2(scale2·score − mu), mu = scale2·m
    // (0 while the row has seen no key, so that exp2(−inf) = 0).
    let scale2 = a.scale * LOG2E;
    var m = neg_inf();
    var l = 0.0;
    for (var j0 = x.r.x; j0 < x.r.y; j0 += i32(BC)) {
        let n = u32(min(x.r.y - j0, i32(BC)));
        var sc: array<f32, BC>;
        var mx = neg_inf();
        for (var row = 0u; row < n; row++) {
            let dot = dot_row(&qr, 1u, row_base(x.s.kb + (u32(j0) + row) * x.s.rs, a.hk, x.hkv));
            sc[row] = dot;
            mx = max_nan(mx, dot);
        }
        let mn = max_nan(m, mx);
        let mu = select(mn * scale2, 0.0, mn == neg_inf());
        let corr = exp2(m * scale2 - mu);
        m = mn;
        l *= corr;
        scale_row(&acc, corr);
        for (var row = 0u; row < n; row++) {
            var pr = exp2(fma(sc[row], scale2, -mu));
            l += pr;
            if (pr != 0.0 && (a.flags & DROPOUT) != 0u) {
                pr *= keep_factor(x.b, x.h, u32(x.i), u32(j0) + row);
            }
            if (pr != 0.0 || is_nan(pr)) {
                axpy_row(&acc, pr, 2u, row_base(x.s.kb + (u32(j0) + row) * x.s.rs, a.hk, x.hkv));
            }
        }
    }
    if (x.i >= x.slot) {
        return;
    }
    store_row(0u, row_base(x.s.qb + u32(x.i) * x.s.rs, a.hq, x.h), &acc, recip_or_zero(l), x.valid);
    var out_lse = neg_inf();
    if (x.valid && (l > 0.0 || is_nan(l))) {
        out_lse = m * a.scale + log(l);
    }
    lse[lse_index(x.s, x.b, x.h, u32(x.i))] = out_lse;
}
