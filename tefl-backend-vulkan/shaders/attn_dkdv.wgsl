// Flash attention backward, dK and dV: one key row per invocation (BR keys of one kv head of one
// sequence per workgroup), over every query head of its group and the queries that may see its
// key, recomputing P from lse, no atomics:
// dV_j = Σ_i P_ij z_ij dO_i, dK_j = scale Σ_i P_ij (z_ij dO_i·V_j − delta_i) q_i.
// Workgroups: (key blocks, hk, batch).

@group(0) @binding(6) var<storage, read> lse: array<f32>;
@group(0) @binding(7) var<storage, read> delta: array<f32>;
@group(0) @binding(8) var<storage, read_write> dk: array<atomic<u32>>;
@group(0) @binding(9) var<storage, read_write> dv: array<atomic<u32>>;

fn out_store(slot: u32, w: u32, bits: u32) {
    if (slot == 0u) {
        atomicStore(&dk[w], bits);
    } else {
        atomicStore(&dv[w], bits);
    }
}

fn out_merge(slot: u32, w: u32, bits: u32, keep: u32) {
    if (slot == 0u) {
        atomicAnd(&dk[w], keep);
        atomicOr(&dk[w], bits);
    } else {
        atomicAnd(&dv[w], keep);
        atomicOr(&dv[w], bits);
    }
}


@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let b = wid.z;
    let hkv = wid.y;
    let j0 = i32(wid.x * BR);
    let s = seq_of(b);
    let kslot = select(i32(a.sk), s.lk, a.qkv_layout == 2u);
    if (j0 >= kslot) {
        return;
    }
    let j = j0 + i32(t);
    let valid = j < s.lk;
    let kbase = row_base(s.kb + u32(select(0, j, valid)) * s.rs, a.hk, hkv);
    var kr: array<f32, DM>;
    var vr: array<f32, DM>;
    var dka: array<f32, DM>;
    var dva: array<f32, DM>;
    load_row(&kr, 1u, kbase, valid);
    load_row(&vr, 2u, kbase, valid);
    zero_row(&dka);
    zero_row(&dva);
    let scale2 = a.scale * LOG2E;
    let group = a.hq / a.hk;
    // The queries that may see key j (empty past the sequence).
    var qr = block_queries(s, j, j + 1);
    if (!valid) {
        qr = vec2<i32>(0, 0);
    }
    for (var h = hkv * group; h < (hkv + 1u) * group; h++) {
        for (var i = qr.x; i < qr.y; i++) {
            let rg = key_range(s, i);
            if (j < rg.x || j >= rg.y) {
                continue;
            }
            let token = s.qb + u32(i) * s.rs;
            let qb = row_base(token, a.hq, h);
            let pr = exp2(fma(dot_row(&kr, 0u, qb), scale2, -lse[lse_index(s, b, h, u32(i))] * LOG2E));
            let z = keep_factor(b, h, u32(i), u32(j));
            let ds = pr * (dot_row(&vr, 3u, qb) * z - delta[token * a.hq + h]);
            axpy_row(&dva, pr * z, 3u, qb);
            axpy_row(&dka, ds, 0u, qb);
        }
    }
    if (j >= kslot) {
        return;
    }
    let out = row_base(s.kb + u32(j) * s.rs, a.hk, hkv);
    store_row(0u, out, &dka, a.scale, valid);
    store_row(1u, out, &dva, 1.0, valid);
}
