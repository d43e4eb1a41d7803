// Flash attention backward, dK and dV, on cooperative matrices (attn_coop.wgsl): the formulas
// of attn_dkdv.wgsl, dV_j = Σ_i P_ij z_ij dO_i, dK_j = scale Σ_i P_ij (z_ij dO_i·V_j − delta_i) q_i,
// P recomputed from lse, no atomics. A workgroup serves 64 keys of one kv head of one sequence
// (16 per subgroup, their K and V fragments in registers), over every query head of its group
// and the queries that may see its keys, by steps of KC: the step's q and dO rows are staged,
// each subgroup computes Sᵀ = K·qᵀ and dPᵀ = V·dOᵀ into its f32 tiles, two invocations per key
// turn them into Pᵀz and dSᵀ (16-bit tiles), and the subgroup adds Pᵀz·dO and dSᵀ·q to its dV
// and dK accumulators. Workgroups: (key blocks, hk, batch).

@group(0) @binding(6) var<storage, read> lse: array<f32>;
@group(0) @binding(7) var<storage, read> delta: array<f32>;
@group(0) @binding(8) var<storage, read_write> dk: array<u32>;
@group(0) @binding(9) var<storage, read_write> dv: array<u32>;

// Queries per step. 16 declares 24.6 KB of shared memory (d = 128) instead of 46.3 KB, but the
// backward ran 1% slower with it on the H200 (2026-11-28, 31.64 against 31.36 ms): the driver
// reported 255 registers (and 43,136 bytes of shared memory) for it, so one workgroup an SM
// either way.
const KC: u32 = 32u;
// The step's q and dO side by side.
const KV_TILES: u32 = 2u;
const_assert BR % (KV_TILES * KC) == 0u;
// Sᵀ and dPᵀ.
const SCORE_TILES: u32 = 2u;
// Pᵀz and dSᵀ.
const PROB_TILES: u32 = 2u;

// The step's queries: lse·log2(e) and delta.
var<workgroup> step_lse: array<f32, KC>;
var<workgroup> step_delta: array<f32, KC>;

fn out_word(slot: u32, w: u32, bits: u32) {
    if (slot == 0u) {
        dk[w] = bits;
    } else {
        dv[w] = bits;
    }
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let b = wid.z;
    let hkv = wid.y;
    let s = seq_of(b);
    let kslot = select(i32(a.sk), s.lk, a.qkv_layout == 2u);
    let j0 = i32(wid.x * BR);
    if (j0 >= kslot) {
        return;
    }
    let sg = lane / 32u;
    let sl = lane % 32u;
    // In the elementwise part, an invocation serves half (`part`) of the step's queries of a key.
    let row = sg * 16u + sl / 2u;
    let part = sl % 2u;
    let j = j0 + i32(row);
    // The queries that may see a key of the block (none past the sequence).
    var qr = vec2<i32>(0, 0);
    if (j0 < s.lk) {
        qr = block_queries(s, j0, min(j0 + i32(BR), s.lk));
    }
    let scale2 = a.scale * LOG2E;
    let group = a.hq / a.hk;

    // The 64 key rows of K, then of V, staged KV_TILES·KC rows at a time: each
    // subgroup takes its fragments from the piece that holds its 16 rows.
    var k_0 = coop_mat16x16<f16, A>();
    var k_1 = k_0;
    var k_2 = k_0;
    var k_3 = k_0;
    var k_4 = k_0;
    var k_5 = k_0;
    var k_6 = k_0;
    var k_7 = k_0;
    var v_0 = k_0;
    var v_1 = k_0;
    var v_2 = k_0;
    var v_3 = k_0;
    var v_4 = k_0;
    var v_5 = k_0;
    var v_6 = k_0;
    var v_7 = k_0;
    let staged = KV_TILES * KC;
    let pieces = BR / staged;
    let r0 = (sg * 16u) % staged;
    for (var t = 0u; t < 2u * pieces; t++) {
        let piece = t % pieces;
        let second = t >= pieces;
        workgroupBarrier();
        stage(lane, select(1u, 2u, second), staged, j0 + i32(piece * staged), s.lk, s.kb, s.rs, a.hk, hkv, 0u);
        workgroupBarrier();
        if ((sg * 16u) / staged == piece) {
            if (!second) {
                k_0 = frag_rows(r0, 0u);
                k_1 = frag_rows(r0, 1u);
                k_2 = frag_rows(r0, 2u);
                k_3 = frag_rows(r0, 3u);
                if (DM == 128u) {
                    k_4 = frag_rows(r0, 4u);
                    k_5 = frag_rows(r0, 5u);
                    k_6 = frag_rows(r0, 6u);
                    k_7 = frag_rows(r0, 7u);
                }
            } else {
                v_0 = frag_rows(r0, 0u);
                v_1 = frag_rows(r0, 1u);
                v_2 = frag_rows(r0, 2u);
                v_3 = frag_rows(r0, 3u);
                if (DM == 128u) {
                    v_4 = frag_rows(r0, 4u);
                    v_5 = frag_rows(r0, 5u);
                    v_6 = frag_rows(r0, 6u);
                    v_7 = frag_rows(r0, 7u);
                }
            }
        }
    }
    var dk0 = coop_mat16x16<f32, C>();
    var dk1 = coop_mat16x16<f32, C>();
    var dk2 = coop_mat16x16<f32, C>();
    var dk3 = coop_mat16x16<f32, C>();
    var dk4 = coop_mat16x16<f32, C>();
    var dk5 = coop_mat16x16<f32, C>();
    var dk6 = coop_mat16x16<f32, C>();
    var dk7 = coop_mat16x16<f32, C>();
    var dv0 = coop_mat16x16<f32, C>();
    var dv1 = coop_mat16x16<f32, C>();
    var dv2 = coop_mat16x16<f32, C>();
    var dv3 = coop_mat16x16<f32, C>();
    var dv4 = coop_mat16x16<f32, C>();
    var dv5 = coop_mat16x16<f32, C>();
    var dv6 = coop_mat16x16<f32, C>();
    var dv7 = coop_mat16x16<f32, C>();

    let at_s = sg * SCORE_TILE + (sl / 2u) * LDS + part * (KC / 2u);
    let at_dp = at_s + 4u * SCORE_TILE;
    let at_p = sg * PROB_TILE + (sl / 2u) * LDP + part * (KC / 4u);
    let at_ds = at_p + 4u * PROB_TILE;
    for (var h = hkv * group; h < (hkv + 1u) * group; h++) {
        // Each step's q and dO come from registers loaded during the step before.
        var next_q = load_share(lane, 0u, qr.x, s.lq, s.qb, s.rs, a.hq, h);
        var next_g = load_share(lane, 3u, qr.x, s.lq, s.qb, s.rs, a.hq, h);
        for (var i0 = qr.x; i0 < qr.y; i0 += i32(KC)) {
            workgroupBarrier();
            put_share(lane, 0u, next_q);
            put_share(lane, KC, next_g);
            if (lane < KC) {
                let i = i0 + i32(lane);
                var li = 0.0;
                var di = 0.0;
                if (i < s.lq) {
                    li = lse[lse_index(s, b, h, u32(i))] * LOG2E;
                    di = delta[(s.qb + u32(i) * s.rs) * a.hq + h];
                }
                step_lse[lane] = li;
                step_delta[lane] = di;
            }
            workgroupBarrier();
            if (i0 + i32(KC) < qr.y) {
                next_q = load_share(lane, 0u, i0 + i32(KC), s.lq, s.qb, s.rs, a.hq, h);
                next_g = load_share(lane, 3u, i0 + i32(KC), s.lq, s.qb, s.rs, a.hq, h);
            }
            store_block(dot_block(0u, k_0, k_1, k_2, k_3, k_4, k_5, k_6, k_7), 0u, sg, 0u);
            store_block(dot_block(KC, v_0, v_1, v_2, v_3, v_4, v_5, v_6, v_7), 1u, sg, 0u);
            if (KC == 32u) {
                store_block(dot_block(16u, k_0, k_1, k_2, k_3, k_4, k_5, k_6, k_7), 0u, sg, 16u);
                store_block(dot_block(KC + 16u, v_0, v_1, v_2, v_3, v_4, v_5, v_6, v_7), 1u, sg, 16u);
            }
            workgroupBarrier();
            for (var e = 0u; e < KC / 2u; e += 2u) {
                var pz = vec2<f32>(0.0);
                var ds = vec2<f32>(0.0);
                for (var t = 0u; t < 2u; t++) {
                    let c = part * (KC / 2u) + e + t;
                    let i = i0 + i32(c);
                    let keys = key_range(s, i);
                    if (j >= keys.x && j < keys.y) {
                        let p = exp2(fma(scores[at_s + e + t], scale2, -step_lse[c]));
                        let z = keep_factor(b, h, u32(i), u32(j));
                        pz[t] = p * z;
                        ds[t] = p * (scores[at_dp + e + t] * z - step_delta[c]);
                    }
                }
                probs[at_p + e / 2u] = vec2<f16>(pz);
                probs[at_ds + e / 2u] = vec2<f16>(ds);
            }
            workgroupBarrier();
            let p0 = frag_prob(0u, sg, 0u);
            var p1 = p0;
            if (KC == 32u) {
                p1 = frag_prob(0u, sg, 1u);
            }
            dv0 = acc_block(dv0, p0, p1, KC, 0u);
            dv1 = acc_block(dv1, p0, p1, KC, 1u);
            dv2 = acc_block(dv2, p0, p1, KC, 2u);
            dv3 = acc_block(dv3, p0, p1, KC, 3u);
            let s0 = frag_prob(1u, sg, 0u);
            var s1 = s0;
            if (KC == 32u) {
                s1 = frag_prob(1u, sg, 1u);
            }
            dk0 = acc_block(dk0, s0, s1, 0u, 0u);
            dk1 = acc_block(dk1, s0, s1, 0u, 1u);
            dk2 = acc_block(dk2, s0, s1, 0u, 2u);
            dk3 = acc_block(dk3, s0, s1, 0u, 3u);
            if (DM == 128u) {
                dv4 = acc_block(dv4, p0, p1, KC, 4u);
                dv5 = acc_block(dv5, p0, p1, KC, 5u);
                dv6 = acc_block(dv6, p0, p1, KC, 6u);
                dv7 = acc_block(dv7, p0, p1, KC, 7u);
                dk4 = acc_block(dk4, s0, s1, 0u, 4u);
                dk5 = acc_block(dk5, s0, s1, 0u, 5u);
                dk6 = acc_block(dk6, s0, s1, 0u, 6u);
                dk7 = acc_block(dk7, s0, s1, 0u, 7u);
            }
        }
    }

    workgroupBarrier();
    // Keys past the slot are not written; keys past the sequence get zeros.
    let write = j < kslot;
    let on = j < s.lk;
    let word = (row_base(s.kb + u32(select(0, j, write)) * s.rs, a.hk, hkv) + part * 8u) / 2u;
    let mk = select(0.0, a.scale, on);
    let mv = select(0.0, 1.0, on);
    put(dk0, sg, sl, 0u, write, word, mk);
    put(dk1, sg, sl, 0u, write, word + 8u, mk);
    put(dk2, sg, sl, 0u, write, word + 16u, mk);
    put(dk3, sg, sl, 0u, write, word + 24u, mk);
    put(dv0, sg, sl, 1u, write, word, mv);
    put(dv1, sg, sl, 1u, write, word + 8u, mv);
    put(dv2, sg, sl, 1u, write, word + 16u, mv);
    put(dv3, sg, sl, 1u, write, word + 24u, mv);
    if (DM == 128u) {
        put(dk4, sg, sl, 0u, write, word + 32u, mk);
        put(dk5, sg, sl, 0u, write, word + 40u, mk);
        put(dk6, sg, sl, 0u, write, word + 48u, mk);
        put(dk7, sg, sl, 0u, write, word + 56u, mk);
        put(dv4, sg, sl, 1u, write, word + 32u, mv);
        put(dv5, sg, sl, 1u, write, word + 40u, mv);
        put(dv6, sg, sl, 1u, write, word + 48u, mv);
        put(dv7, sg, sl, 1u, write, word + 56u, mv);
    }
}
