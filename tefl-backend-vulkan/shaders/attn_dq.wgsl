// Flash attention backward, dQ: one query row per invocation (BR rows of one head of one
// sequence per workgroup), over the keys the row sees, recomputing P from lse (FlashAttention-2's recurrences, no atomics):
// dS_ij = P_ij (z_ij dO_i·V_j − delta_i), dQ_i = scale Σ_j dS_ij K_j, z the dropout factor.
// Workgroups: (query blocks, hq, batch).

@group(0) @binding(2) var<storage, read> q: array<u32>;
@group(0) @binding(3) var<storage, read> k: array<u32>;
@group(0) @binding(4) var<storage, read> v: array<u32>;
@group(0) @binding(5) var<storage, read> d_o: array<u32>;
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

fn ld(buf: u32, e: u32) -> f32 {
    if (buf == 0u) {
        return unpack(q[word_of(e, TX)], e, TX);
    }
    if (buf == 1u) {
        return unpack(k[word_of(e, TX)], e, TX);
    }
    if (buf == 2u) {
        return unpack(v[word_of(e, TX)], e, TX);
    }
    return unpack(d_o[word_of(e, TX)], e, TX);
}

@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let b = wid.z;
    let h = wid.y;
    let q0 = i32(wid.x * BR);
    let hkv = h / (a.hq / a.hk);
    let s = seq_of(b);
    let slot = select(i32(a.sq), s.lq, a.qkv_layout == 2u);
    if (q0 >= slot) {
        return;
    }
    let i = q0 + i32(t);
    let valid = i < s.lq;
    let r = key_range(s, i);
    let token = s.qb + u32(select(0, i, valid)) * s.rs;
    let base = row_base(token, a.hq, h);
    var qr: array<f32, DM>;
    var gr: array<f32, DM>;
    var acc: array<f32, DM>;
    load_row(&qr, 0u, base, valid);
    load_row(&gr, 3u, base, valid);
    zero_row(&acc);
    let scale2 = a.scale * LOG2E;
    var li = 0.0;
    var di = 0.0;
    if (valid) {
        li = lse[lse_index(s, b, h, u32(i))] * LOG2E;
        di = delta[token * a.hq + h];
    }
    for (var j = r.x; j < r.y; j++) {
        let kb = row_base(s.kb + u32(j) * s.rs, a.hk, hkv);
        let pr = exp2(fma(dot_row(&qr, 1u, kb), scale2, -li));
        let z = keep_factor(b, h, u32(i), u32(j));
        let ds = pr * (dot_row(&gr, 2u, kb) * z - di);
        axpy_row(&acc, ds, 1u, kb);
    }
    if (i >= slot) {
        return;
    }
    store_row(0u, row_base(s.qb + u32(i) * s.rs, a.hq, h), &acc, a.scale, valid);
}
