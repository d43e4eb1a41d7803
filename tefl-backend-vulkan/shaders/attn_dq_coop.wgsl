// Flash attention backward, dQ, on cooperative matrices (attn_coop.wgsl): the formulas of
// attn_dq.wgsl, dS_ij = P_ij (z_ij dO_i·V_j − delta_i), dQ_i = scale Σ_j dS_ij K_j, P recomputed
// from lse. A workgroup serves 64 query rows of one head of one sequence (16 per subgroup, their
// q and dO fragments in registers); keys go by steps of KC: the step's K and V rows are staged,
// each subgroup computes S = q·Kᵀ and dP = dO·Vᵀ into its f32 tiles, two invocations per row
// turn them into dS (16-bit tile), and the subgroup adds dS·K to its dQ accumulators.
// Workgroups: (query blocks, hq, batch).

@group(0) @binding(6) var<storage, read> lse: array<f32>;
@group(0) @binding(7) var<storage, read> delta: array<f32>;
@group(0) @binding(8) var<storage, read_write> dq: array<u32>;

// Keys per step: 16 keeps the stage at 21.5 KB of shared memory (d = 128), so that two
// workgroups share an SM on NVIDIA's Vulkan driver (attn_coop.wgsl).
const KC: u32 = 16u;
// The step's K and V side by side.
const KV_TILES: u32 = 2u;
const_assert BR % (KV_TILES * KC) == 0u;
// S and dP.
const SCORE_TILES: u32 = 2u;
// dS.
const PROB_TILES: u32 = 1u;

fn out_word(slot: u32, w: u32, bits: u32) {
    dq[w] = bits;
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let x = query_block(wid, lane);
    if (x.q0 >= x.slot) {
        return;
    }
    let b = x.b;
    let h = x.h;
    let hkv = x.hkv;
    let s = x.s;
    let slot = x.slot;
    let q0 = x.q0;
    let sg = x.sg;
    let sl = x.sl;
    let part = x.part;
    let i = x.i;
    let keys = x.keys;
    let j_lo = x.span.x;
    let j_hi = x.span.y;

    let scale2 = a.scale * LOG2E;
    var li = 0.0;
    var di = 0.0;
    if (i < s.lq) {
        li = lse[lse_index(s, b, h, u32(i))] * LOG2E;
        di = delta[(s.qb + u32(i) * s.rs) * a.hq + h];
    }

    // The 64 query rows of q, then of dO, staged KV_TILES·KC rows at a time: each
    // subgroup takes its fragments from the piece that holds its 16 rows.
    var q_0 = coop_mat16x16<f16, A>();
    var q_1 = q_0;
    var q_2 = q_0;
    var q_3 = q_0;
    var q_4 = q_0;
    var q_5 = q_0;
    var q_6 = q_0;
    var q_7 = q_0;
    var g_0 = q_0;
    var g_1 = q_0;
    var g_2 = q_0;
    var g_3 = q_0;
    var g_4 = q_0;
    var g_5 = q_0;
    var g_6 = q_0;
    var g_7 = q_0;
    let staged = KV_TILES * KC;
    let pieces = BR / staged;
    let r0 = (sg * 16u) % staged;
    for (var t = 0u; t < 2u * pieces; t++) {
        let piece = t % pieces;
        let second = t >= pieces;
        workgroupBarrier();
        stage(lane, select(0u, 3u, second), staged, q0 + i32(piece * staged), s.lq, s.qb, s.rs, a.hq, h, 0u);
        workgroupBarrier();
        if ((sg * 16u) / staged == piece) {
            if (!second) {
                q_0 = frag_rows(r0, 0u);
                q_1 = frag_rows(r0, 1u);
                q_2 = frag_rows(r0, 2u);
                q_3 = frag_rows(r0, 3u);
                if (DM == 128u) {
                    q_4 = frag_rows(r0, 4u);
                    q_5 = frag_rows(r0, 5u);
                    q_6 = frag_rows(r0, 6u);
                    q_7 = frag_rows(r0, 7u);
                }
            } else {
                g_0 = frag_rows(r0, 0u);
                g_1 = frag_rows(r0, 1u);
                g_2 = frag_rows(r0, 2u);
                g_3 = frag_rows(r0, 3u);
                if (DM == 128u) {
                    g_4 = frag_rows(r0, 4u);
                    g_5 = frag_rows(r0, 5u);
                    g_6 = frag_rows(r0, 6u);
                    g_7 = frag_rows(r0, 7u);
                }
            }
        }
    }
    var d0 = coop_mat16x16<f32, C>();
    var d1 = coop_mat16x16<f32, C>();
    var d2 = coop_mat16x16<f32, C>();
    var d3 = coop_mat16x16<f32, C>();
    var d4 = coop_mat16x16<f32, C>();
    var d5 = coop_mat16x16<f32, C>();
    var d6 = coop_mat16x16<f32, C>();
    var d7 = coop_mat16x16<f32, C>();

    let at_s = sg * SCORE_TILE + (sl / 2u) * LDS + part * (KC / 2u);
    let at_dp = at_s + 4u * SCORE_TILE;
    let at_ds = sg * PROB_TILE + (sl / 2u) * LDP + part * (KC / 4u);
    // Each step's K and V come from registers loaded during the step before.
    var next_k = load_share(lane, 1u, j_lo, s.lk, s.kb, s.rs, a.hk, hkv);
    var next_v = load_share(lane, 2u, j_lo, s.lk, s.kb, s.rs, a.hk, hkv);
    for (var j0 = j_lo; j0 < j_hi; j0 += i32(KC)) {
        workgroupBarrier();
        put_share(lane, 0u, next_k);
        put_share(lane, KC, next_v);
        workgroupBarrier();
        if (j0 + i32(KC) < j_hi) {
            next_k = load_share(lane, 1u, j0 + i32(KC), s.lk, s.kb, s.rs, a.hk, hkv);
            next_v = load_share(lane, 2u, j0 + i32(KC), s.lk, s.kb, s.rs, a.hk, hkv);
        }
        store_block(dot_block(0u, q_0, q_1, q_2, q_3, q_4, q_5, q_6, q_7), 0u, sg, 0u);
        store_block(dot_block(KC, g_0, g_1, g_2, g_3, g_4, g_5, g_6, g_7), 1u, sg, 0u);
        if (KC == 32u) {
            store_block(dot_block(16u, q_0, q_1, q_2, q_3, q_4, q_5, q_6, q_7), 0u, sg, 16u);
            store_block(dot_block(KC + 16u, g_0, g_1, g_2, g_3, g_4, g_5, g_6, g_7), 1u, sg, 16u);
        }
        workgroupBarrier();
        let k0 = j0 + i32(part * (KC / 2u));
        for (var e = 0u; e < KC / 2u; e += 2u) {
            var ds = vec2<f32>(0.0);
            for (var t = 0u; t < 2u; t++) {
                let j = k0 + i32(e + t);
                if (j >= keys.x && j < keys.y) {
                    let p = exp2(fma(scores[at_s + e + t], scale2, -li));
                    let z = keep_factor(b, h, u32(i), u32(j));
                    ds[t] = p * (scores[at_dp + e + t] * z - di);
                }
            }
            probs[at_ds + e / 2u] = vec2<f16>(ds);
        }
        workgroupBarrier();
        let s0 = frag_prob(0u, sg, 0u);
        var s1 = s0;
        if (KC == 32u) {
            s1 = frag_prob(0u, sg, 1u);
        }
        d0 = acc_block(d0, s0, s1, 0u, 0u);
        d1 = acc_block(d1, s0, s1, 0u, 1u);
        d2 = acc_block(d2, s0, s1, 0u, 2u);
        d3 = acc_block(d3, s0, s1, 0u, 3u);
        if (DM == 128u) {
            d4 = acc_block(d4, s0, s1, 0u, 4u);
            d5 = acc_block(d5, s0, s1, 0u, 5u);
            d6 = acc_block(d6, s0, s1, 0u, 6u);
            d7 = acc_block(d7, s0, s1, 0u, 7u);
        }
    }

    workgroupBarrier();
    // Rows past the slot are not written; rows past the sequence are zeros.
    let write = i < slot;
    let mul = select(0.0, a.scale, i < s.lq);
    let word = (row_base(s.qb + u32(select(0, i, write)) * s.rs, a.hq, h) + part * 8u) / 2u;
    put(d0, sg, sl, 0u, write, word, mul);
    put(d1, sg, sl, 0u, write, word + 8u, mul);
    put(d2, sg, sl, 0u, write, word + 16u, mul);
    put(d3, sg, sl, 0u, write, word + 24u, mul);
    if (DM == 128u) {
        put(d4, sg, sl, 0u, write, word + 32u, mul);
        put(d5, sg, sl, 0u, write, word + 40u, mul);
        put(d6, sg, sl, 0u, write, word + 48u, mul);
        put(d7, sg, sl, 0u, write, word + 56u, mul);
    }
}
