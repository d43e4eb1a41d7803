// Flash attention backward, dQ: one query row per invocation (BR rows of one head of one
// sequence per workgroup), over the keys the row sees, recomputing P from lse
// (FlashAttention-2's recurrences, no atomics):
// dS_ij = P_ij (z_ij dO_i·V_j − delta_i), dQ_i = scale Σ_j dS_ij K_j, z the dropout factor.
// Workgroups: (query blocks, hq, batch).

@group(0) @binding(6) var<storage, read> lse: array<f32>;
@group(0) @binding(7) var<storage, read> delta: array<f32>;
@group(0) @binding(8) var<storage, read_write> dq: array<atomic<u32>>;

fn out_store(slot: u32, w: u32, bits: u32) {
    atomicStore(&dq[w], bits);
}

fn out_merge(slot: u32, w: u32, bits: u32, keep: u32) {
    atomicAnd(&dq[w], keep);
    atomicOr(&dq[w], bits);
}

@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let x = query_row(wid, t);
    if (x.q0 >= x.slot) {
        return;
    }
    let token = x.s.qb + u32(select(0, x.i, x.valid)) * x.s.rs;
    let base = row_base(token, a.hq, x.h);
    var qr: array<f32, DM>;
    var gr: array<f32, DM>;
    var acc: array<f32, DM>;
    load_row(&qr, 0u, base, x.valid);
    load_row(&gr, 3u, base, x.valid);
    zero_row(&acc);
    let scale2 = a.scale * LOG2E;
    var li = 0.0;
    var di = 0.0;
    if (x.valid) {
        li = lse[lse_index(x.s, x.b, x.h, u32(x.i))] * LOG2E;
        di = delta[token * a.hq + x.h];
    }
    for (var j = x.r.x; j < x.r.y; j++) {
        let kb = row_base(x.s.kb + u32(j) * x.s.rs, a.hk, x.hkv);
        let pr = exp2(fma(dot_row(&qr, 1u, kb), scale2, -li));
        let z = keep_factor(x.b, x.h, u32(x.i), u32(j));
        let ds = pr * (dot_row(&gr, 2u, kb) * z - di);
        axpy_row(&acc, ds, 1u, kb);
    }
    if (x.i >= x.slot) {
        return;
    }
    store_row(0u, row_base(x.s.qb + u32(x.i) * x.s.rs, a.hq, x.h), &acc, a.scale, x.valid);
}
