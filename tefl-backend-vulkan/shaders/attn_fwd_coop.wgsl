// Flash attention forward on cooperative matrices (VK_KHR_cooperative_matrix, tensor cores), for
// 16-bit q, k, v with head dim d = DM (64 or 128). Same outputs, masks and dropout as
// attn_fwd.wgsl (attn_common.wgsl's rules); the host takes this path where the device has
// cooperative matrices and 32-lane subgroups.
//
// A workgroup of four 32-lane subgroups serves BR = 64 query rows of one head of one sequence,
// 16 rows per subgroup, their Q fragments held in registers. Keys go by steps of KC = 32: the
// workgroup stages that step's K rows in shared memory (16-byte loads), each subgroup computes
// its 16×32 scores S = Q·Kᵀ on cooperative matrices and stores them to its own shared tile,
// the step's V rows then take the K rows' place while two invocations per query row turn the
// scores into probabilities (an online softmax), and the subgroup adds P·V to its 16×d f32
// accumulators. K and V taking turns in one tile keeps the workgroup at 23.3 KB of shared
// memory (d = 128), so two share an SM on NVIDIA's Vulkan driver; with both staged at once
// (31.7 KB) one did.
//
// A cooperative matrix cannot be scaled row by row, so the accumulators are rescaled lazily: a
// row keeps its reference max while the step's max stays within 2^8 of it in probability (P at
// most 256, fine in 16 bits); only when some row of the workgroup passes that do all rows move
// their reference and the accumulators go through shared memory to be rescaled. With typical
// scores that happens on the first step only. The final 1/l and the 16-bit conversion happen on
// the way out, through the same shared tiles.

@group(0) @binding(6) var<storage, read_write> o: array<u32>;
@group(0) @binding(7) var<storage, read_write> lse: array<f32>;

const KC: u32 = 32u;
// K and V take turns in one tile (which also stages the block's 64 query rows, in two halves).
const KV_TILES: u32 = 1u;
const_assert BR == 2u * KV_TILES * KC;
const SCORE_TILES: u32 = 1u;
const PROB_TILES: u32 = 1u;
// The largest growth of a row's max (as a log2 of probability) that keeps its reference.
const SLACK: f32 = 8.0;

// Per query row of the workgroup: its rescale factor, then its 1/l.
var<workgroup> row_factor: array<f32, BR>;
// Per subgroup: 1 when one of its rows passed SLACK this step.
var<workgroup> grew: array<u32, 4>;

fn out_word(slot: u32, w: u32, bits: u32) {
    o[w] = bits;
}

// An accumulator with each row multiplied by its row_factor (through the subgroup's score
// tile; the caller is in workgroup-uniform control flow).
fn rescale(m: coop_mat16x16<f32, C>, sg: u32, sl: u32) -> coop_mat16x16<f32, C> {
    park(m, sg);
    workgroupBarrier();
    let at = park_at(sg, sl);
    let factor = row_factor[sg * 16u + sl / 2u];
    for (var e = 0u; e < 8u; e++) {
        scores[at + e] *= factor;
    }
    workgroupBarrier();
    let r = coopLoadT<coop_mat16x16<f32, C>>(&scores[sg * SCORE_TILE], 16u);
    workgroupBarrier();
    return r;
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
    let row = x.row;
    let part = x.part;
    let i = x.i;
    let keys = x.keys;
    let j_lo = x.span.x;
    let j_hi = x.span.y;

    // The 64 query rows in two halves of KC through the one tile: subgroups 0 and 1 take their
    // fragments from the first, 2 and 3 from the second.
    var q_0 = coop_mat16x16<f16, A>();
    var q_1 = q_0;
    var q_2 = q_0;
    var q_3 = q_0;
    var q_4 = q_0;
    var q_5 = q_0;
    var q_6 = q_0;
    var q_7 = q_0;
    let qr = (sg % 2u) * 16u;
    for (var half = 0u; half < 2u; half++) {
        workgroupBarrier();
        stage(lane, 0u, KC, q0 + i32(half * KC), s.lq, s.qb, s.rs, a.hq, h, 0u);
        workgroupBarrier();
        if (sg / 2u == half) {
            q_0 = frag_rows(qr, 0u);
            q_1 = frag_rows(qr, 1u);
            q_2 = frag_rows(qr, 2u);
            q_3 = frag_rows(qr, 3u);
            if (DM == 128u) {
                q_4 = frag_rows(qr, 4u);
                q_5 = frag_rows(qr, 5u);
                q_6 = frag_rows(qr, 6u);
                q_7 = frag_rows(qr, 7u);
            }
        }
    }
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
    var o4 = coop_mat16x16<f32, C>();
    var o5 = coop_mat16x16<f32, C>();
    var o6 = coop_mat16x16<f32, C>();
    var o7 = coop_mat16x16<f32, C>();

    let scale2 = a.scale * LOG2E;
    // The row's reference max of raw scores (−inf while it has seen no key); probabilities are
    // exp2(scale2·score − mu), mu = scale2·m (0 while m = −inf). l: this invocation's half of
    // the row's sum of probabilities (before dropout).
    var m = neg_inf();
    var l = 0.0;
    var started = false;
    let tile = sg * SCORE_TILE + (sl / 2u) * LDS + part * 16u;
    let pt = sg * PROB_TILE + (sl / 2u) * LDP + part * 8u;
    // The first step's K and V in registers; each step stores them (K, then V once the scores
    // are done with K) and loads the next step's while it computes.
    var next_k = load_share(lane, 1u, j_lo, s.lk, s.kb, s.rs, a.hk, hkv);
    var next_v = load_share(lane, 2u, j_lo, s.lk, s.kb, s.rs, a.hk, hkv);
    for (var j0 = j_lo; j0 < j_hi; j0 += i32(KC)) {
        let more = j0 + i32(KC) < j_hi;
        workgroupBarrier();
        put_share(lane, 0u, next_k);
        if (lane < 4u) {
            grew[lane] = 0u;
        }
        workgroupBarrier();
        if (more) {
            next_k = load_share(lane, 1u, j0 + i32(KC), s.lk, s.kb, s.rs, a.hk, hkv);
        }
        store_block(dot_block(0u, q_0, q_1, q_2, q_3, q_4, q_5, q_6, q_7), 0u, sg, 0u);
        store_block(dot_block(16u, q_0, q_1, q_2, q_3, q_4, q_5, q_6, q_7), 0u, sg, 16u);
        workgroupBarrier();
        // Every subgroup is done with K: V takes its place (read after the barrier below).
        put_share(lane, 0u, next_v);
        if (more) {
            next_v = load_share(lane, 2u, j0 + i32(KC), s.lk, s.kb, s.rs, a.hk, hkv);
        }

        // This invocation's 16 keys: j0 + 16·part...
        let k0 = j0 + i32(part * 16u);
        var mx = neg_inf();
        for (var e = 0u; e < 16u; e++) {
            let j = k0 + i32(e);
            if (j >= keys.x && j < keys.y) {
                mx = max_nan(mx, scores[tile + e]);
            }
        }
        mx = max_nan(mx, subgroupShuffleXor(mx, 1u));
        let mn = max_nan(m, mx);
        // A row that saw no key before always takes a reference (its lse needs one).
        let passed = mn != m && (m == neg_inf() || !(mn * scale2 - m * scale2 <= SLACK));
        let any_here = subgroupAny(passed);
        if (any_here && sl == 0u) {
            grew[sg] = 1u;
        }
        let flags = workgroupUniformLoad(&grew);
        let rebase = flags[0] + flags[1] + flags[2] + flags[3] > 0u;
        if (rebase) {
            let mu_new = select(mn * scale2, 0.0, mn == neg_inf());
            let corr = exp2(m * scale2 - mu_new);
            m = mn;
            l *= corr;
            if (part == 0u) {
                row_factor[row] = corr;
            }
        }
        let mu = select(m * scale2, 0.0, m == neg_inf());
        for (var e = 0u; e < 16u; e += 2u) {
            var pr = vec2<f32>(0.0);
            for (var t = 0u; t < 2u; t++) {
                let j = k0 + i32(e + t);
                if (j >= keys.x && j < keys.y) {
                    let x = exp2(fma(scores[tile + e + t], scale2, -mu));
                    l += x;
                    pr[t] = x * keep_factor(b, h, u32(i), u32(j));
                }
            }
            probs[pt + e / 2u] = vec2<f16>(pr);
        }
        workgroupBarrier();
        if (rebase && started) {
            o0 = rescale(o0, sg, sl);
            o1 = rescale(o1, sg, sl);
            o2 = rescale(o2, sg, sl);
            o3 = rescale(o3, sg, sl);
            if (DM == 128u) {
                o4 = rescale(o4, sg, sl);
                o5 = rescale(o5, sg, sl);
                o6 = rescale(o6, sg, sl);
                o7 = rescale(o7, sg, sl);
            }
        }
        started = true;
        let p0 = frag_prob(0u, sg, 0u);
        let p1 = frag_prob(0u, sg, 1u);
        o0 = acc_block(o0, p0, p1, 0u, 0u);
        o1 = acc_block(o1, p0, p1, 0u, 1u);
        o2 = acc_block(o2, p0, p1, 0u, 2u);
        o3 = acc_block(o3, p0, p1, 0u, 3u);
        if (DM == 128u) {
            o4 = acc_block(o4, p0, p1, 0u, 4u);
            o5 = acc_block(o5, p0, p1, 0u, 5u);
            o6 = acc_block(o6, p0, p1, 0u, 6u);
            o7 = acc_block(o7, p0, p1, 0u, 7u);
        }
    }

    l += subgroupShuffleXor(l, 1u);
    workgroupBarrier();
    if (part == 0u) {
        row_factor[row] = recip_or_zero(l);
        if (i < slot) {
            var out_lse = neg_inf();
            if (i < s.lq && (l > 0.0 || is_nan(l))) {
                out_lse = m * a.scale + log(l);
            }
            lse[lse_index(s, b, h, u32(i))] = out_lse;
        }
    }
    workgroupBarrier();
    // Rows past the slot are not written; rows past the sequence are zeros.
    let write = i < slot;
    let mul = select(0.0, row_factor[row], i < s.lq);
    let word = (row_base(s.qb + u32(select(0, i, write)) * s.rs, a.hq, h) + part * 8u) / 2u;
    put(o0, sg, sl, 0u, write, word, mul);
    put(o1, sg, sl, 0u, write, word + 8u, mul);
    put(o2, sg, sl, 0u, write, word + 16u, mul);
    put(o3, sg, sl, 0u, write, word + 24u, mul);
    if (DM == 128u) {
        put(o4, sg, sl, 0u, write, word + 32u, mul);
        put(o5, sg, sl, 0u, write, word + 40u, mul);
        put(o6, sg, sl, 0u, write, word + 48u, mul);
        put(o7, sg, sl, 0u, write, word + 56u, mul);
    }
}
