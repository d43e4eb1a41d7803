// Flash attention forward on cooperative matrices (VK_KHR_cooperative_matrix, tensor cores), for
// 16-bit q, k, v with head dim d = DM (64 or 128). Same outputs, masks and dropout as
// attn_fwd.wgsl (attn_common.wgsl's rules); the host takes this path where the device has
// cooperative matrices and 32-lane subgroups.
//
// A workgroup of four 32-lane subgroups serves BR = 64 query rows of one head of one sequence,
// 16 rows per subgroup, their Q fragments held in registers. Keys go by steps of KC = 32: the
// workgroup stages that step's K and V rows in shared memory (16-byte loads), each subgroup
// computes its 16×32 scores S = Q·Kᵀ on cooperative matrices and stores them to its own shared
// tile, two invocations per query row turn them into probabilities (an online softmax), and the
// subgroup adds P·V to its 16×d f32 accumulators.
//
// A cooperative matrix cannot be scaled row by row, so the accumulators are rescaled lazily: a
// row keeps its reference max while the step's max stays within 2^8 of it in probability (P at
// most 256, fine in 16 bits); only when some row of the workgroup passes that do all rows move
// their reference and the accumulators go through shared memory to be rescaled. With typical
// scores that happens on the first step only. The final 1/l and the 16-bit conversion happen on
// the way out, through the same shared tiles.
//
// WGSL has no bf16 type: the bf16 variant is this module with its 16-bit float marked bfloat16
// after naga (build.rs), as in gemm_coop.wgsl.

@group(0) @binding(2) var<storage, read> q: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> k: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> v: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> o: array<u32>;
@group(0) @binding(7) var<storage, read_write> lse: array<f32>;

// Keys per step.
const KC: u32 = 32u;
// Words per row of the K and V tiles (and of the Q staging at the start): DM halves and 8 of
// padding, which spreads a fragment's rows over the banks and keeps rows 16-byte aligned.
const LDW: u32 = DM / 2u + 4u;
// f32 per row of a subgroup's score tile.
const LDS: u32 = KC + 4u;
// Words per row of a subgroup's probability tile.
const LDP: u32 = KC / 2u + 4u;
// The largest growth of a row's max (as a log2 of probability) that keeps its reference.
const SLACK: f32 = 8.0;

// K rows 0..KC, then V rows; at the start the BR = 2·KC rows of Q.
var<workgroup> kv: array<vec2<f16>, 2u * KC * LDW>;
// Per subgroup: 16 rows of scores, also the staging of an accumulator being rescaled or stored.
var<workgroup> scores: array<f32, 4u * 16u * LDS>;
// Per subgroup: 16 rows of probabilities.
var<workgroup> probs: array<vec2<f16>, 4u * 16u * LDP>;
// Per query row of the workgroup: its rescale factor, then its 1/l.
var<workgroup> row_factor: array<f32, BR>;
// Per subgroup: 1 when one of its rows passed SLACK this step.
var<workgroup> grew: array<u32, 4>;

// The two elements of a source word as the tiles' element type (exact both ways; see
// gemm_coop.wgsl's halves).
fn halves(word: u32) -> vec2<f16> {
    if (TX == BF16) {
        return vec2<f16>(vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xFFFF0000u)));
    }
    return vec2<f16>(unpack2x16float(word));
}

fn fetch(buf: u32, at: u32) -> vec4<u32> {
    if (buf == 0u) {
        return q[at];
    }
    if (buf == 1u) {
        return k[at];
    }
    return v[at];
}

// Copies `rows` token rows of input `buf` (0 q, 1 k, 2 v; head `h` of `heads`), starting at the
// sequence's position `first`, to the tile rows from `dst` on; rows outside [0, len) are zeros.
fn stage(lane: u32, buf: u32, rows: u32, first: i32, len: i32, base: u32, rs: u32, heads: u32, h: u32, dst: u32) {
    let chunks = DM / 8u;
    for (var c = lane; c < rows * chunks; c += 128u) {
        let r = c / chunks;
        let cc = c % chunks;
        let pos = first + i32(r);
        var w = vec4<u32>();
        if (pos >= 0 && pos < len) {
            w = fetch(buf, row_base(base + u32(pos) * rs, heads, h) / 8u + cc);
        }
        let at = (dst + r) * LDW + cc * 4u;
        kv[at] = halves(w.x);
        kv[at + 1u] = halves(w.y);
        kv[at + 2u] = halves(w.z);
        kv[at + 3u] = halves(w.w);
    }
}

// Q rows 16·sg.., head dims 16·f.. (A of S = Q·Kᵀ).
fn frag_q(sg: u32, f: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&kv[sg * 16u * LDW + f * 8u], LDW);
}

// Kᵀ for head dims 16·f.., keys 16·c.. of the step (B of S = Q·Kᵀ: K's rows read as columns).
fn frag_kt(c: u32, f: u32) -> coop_mat16x16<f16, B> {
    return coopLoad<coop_mat16x16<f16, B>>(&kv[c * 16u * LDW + f * 8u], LDW);
}

// P of this subgroup for keys 16·c.. of the step (A of P·V).
fn frag_p(sg: u32, c: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&probs[sg * 16u * LDP + c * 8u], LDP);
}

// V for keys 16·c.. of the step, head dims 16·f.. (B of P·V).
fn frag_v(c: u32, f: u32) -> coop_mat16x16<f16, B> {
    return coopLoadT<coop_mat16x16<f16, B>>(&kv[(KC + c * 16u) * LDW + f * 8u], LDW);
}

// S = Q·Kᵀ for keys 16·c.. of the step (DM/16 products over the head dim).
fn score_block(
    c: u32,
    q0: coop_mat16x16<f16, A>,
    q1: coop_mat16x16<f16, A>,
    q2: coop_mat16x16<f16, A>,
    q3: coop_mat16x16<f16, A>,
    q4: coop_mat16x16<f16, A>,
    q5: coop_mat16x16<f16, A>,
    q6: coop_mat16x16<f16, A>,
    q7: coop_mat16x16<f16, A>,
) -> coop_mat16x16<f32, C> {
    var s = coop_mat16x16<f32, C>();
    s = coopMultiplyAdd(q0, frag_kt(c, 0u), s);
    s = coopMultiplyAdd(q1, frag_kt(c, 1u), s);
    s = coopMultiplyAdd(q2, frag_kt(c, 2u), s);
    s = coopMultiplyAdd(q3, frag_kt(c, 3u), s);
    if (DM == 128u) {
        s = coopMultiplyAdd(q4, frag_kt(c, 4u), s);
        s = coopMultiplyAdd(q5, frag_kt(c, 5u), s);
        s = coopMultiplyAdd(q6, frag_kt(c, 6u), s);
        s = coopMultiplyAdd(q7, frag_kt(c, 7u), s);
    }
    return s;
}

// acc + P·V for head dims 16·f.. (KC/16 = 2 products over the step's keys).
fn pv(acc: coop_mat16x16<f32, C>, p0: coop_mat16x16<f16, A>, p1: coop_mat16x16<f16, A>, f: u32) -> coop_mat16x16<f32, C> {
    var r = coopMultiplyAdd(p0, frag_v(0u, f), acc);
    r = coopMultiplyAdd(p1, frag_v(1u, f), r);
    return r;
}

// Stores this subgroup's 16×16 accumulator to its score tile (row-major, 16 per row).
fn park(m: coop_mat16x16<f32, C>, sg: u32) {
    // (Named index and stride: naga 30 does not emit expressions written in a coopStoreT.)
    let at = sg * 16u * LDS;
    let stride = 16u;
    coopStoreT(m, &scores[at], stride);
}

// An accumulator with each row multiplied by its row_factor (through the score tile; the
// caller is in workgroup-uniform control flow).
fn rescale(m: coop_mat16x16<f32, C>, sg: u32, sl: u32) -> coop_mat16x16<f32, C> {
    park(m, sg);
    workgroupBarrier();
    let at = sg * 16u * LDS + sl * 8u;
    let factor = row_factor[sg * 16u + sl / 2u];
    for (var e = 0u; e < 8u; e++) {
        scores[at + e] *= factor;
    }
    workgroupBarrier();
    let r = coopLoadT<coop_mat16x16<f32, C>>(&scores[sg * 16u * LDS], 16u);
    workgroupBarrier();
    return r;
}

// Writes accumulator m (head dims 16·f..) times each row's row_factor (its 1/l) as this
// subgroup's rows of the output: 8 elements per invocation, rows past the slot skipped, rows
// past the sequence zeros.
fn put(m: coop_mat16x16<f32, C>, f: u32, sg: u32, sl: u32, q0: i32, slot: i32, s: Seq, lq: i32, h: u32) {
    park(m, sg);
    workgroupBarrier();
    let at = sg * 16u * LDS + sl * 8u;
    let r = sl / 2u;
    let i = q0 + i32(sg * 16u + r);
    if (i < slot) {
        let mul = select(0.0, row_factor[sg * 16u + r], i < lq);
        let word = (row_base(s.qb + u32(i) * s.rs, a.hq, h) + f * 16u + (sl % 2u) * 8u) / 2u;
        for (var e = 0u; e < 4u; e++) {
            o[word + e] = pack(scores[at + 2u * e] * mul, scores[at + 2u * e + 1u] * mul, TX);
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let b = wid.z;
    let h = wid.y;
    let hkv = h / (a.hq / a.hk);
    let s = seq_of(b);
    let slot = select(i32(a.sq), s.lq, a.qkv_layout == 2u);
    let q0 = i32(wid.x * BR);
    if (q0 >= slot) {
        return;
    }
    let sg = lane / 32u;
    let sl = lane % 32u;
    // In the softmax, an invocation serves half (`part`) of the step's keys of one query row.
    let row = sg * 16u + sl / 2u;
    let part = sl % 2u;
    let i = q0 + i32(row);
    let keys = key_range(s, i);
    // The keys any row of the workgroup sees.
    let last = min(q0 + i32(BR), s.lq) - 1;
    var j_lo = 0;
    var j_hi = 0;
    if (last >= q0) {
        j_lo = key_range(s, q0).x;
        j_hi = key_range(s, last).y;
    }

    stage(lane, 0u, BR, q0, s.lq, s.qb, s.rs, a.hq, h, 0u);
    workgroupBarrier();
    let q_0 = frag_q(sg, 0u);
    let q_1 = frag_q(sg, 1u);
    let q_2 = frag_q(sg, 2u);
    let q_3 = frag_q(sg, 3u);
    var q_4 = q_0;
    var q_5 = q_0;
    var q_6 = q_0;
    var q_7 = q_0;
    if (DM == 128u) {
        q_4 = frag_q(sg, 4u);
        q_5 = frag_q(sg, 5u);
        q_6 = frag_q(sg, 6u);
        q_7 = frag_q(sg, 7u);
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
    let tile = sg * 16u * LDS + (sl / 2u) * LDS + part * 16u;
    for (var j0 = j_lo; j0 < j_hi; j0 += i32(KC)) {
        workgroupBarrier();
        stage(lane, 1u, KC, j0, s.lk, s.kb, s.rs, a.hk, hkv, 0u);
        stage(lane, 2u, KC, j0, s.lk, s.kb, s.rs, a.hk, hkv, KC);
        if (lane < 4u) {
            grew[lane] = 0u;
        }
        workgroupBarrier();
        let s0 = score_block(0u, q_0, q_1, q_2, q_3, q_4, q_5, q_6, q_7);
        let s1 = score_block(1u, q_0, q_1, q_2, q_3, q_4, q_5, q_6, q_7);
        let at0 = sg * 16u * LDS;
        let at1 = at0 + 16u;
        let stride = LDS;
        coopStoreT(s0, &scores[at0], stride);
        coopStoreT(s1, &scores[at1], stride);
        workgroupBarrier();

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
        let pt = sg * 16u * LDP + (sl / 2u) * LDP + part * 8u;
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
        let p0 = frag_p(sg, 0u);
        let p1 = frag_p(sg, 1u);
        o0 = pv(o0, p0, p1, 0u);
        o1 = pv(o1, p0, p1, 1u);
        o2 = pv(o2, p0, p1, 2u);
        o3 = pv(o3, p0, p1, 3u);
        if (DM == 128u) {
            o4 = pv(o4, p0, p1, 4u);
            o5 = pv(o5, p0, p1, 5u);
            o6 = pv(o6, p0, p1, 6u);
            o7 = pv(o7, p0, p1, 7u);
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
    put(o0, 0u, sg, sl, q0, slot, s, s.lq, h);
    put(o1, 1u, sg, sl, q0, slot, s, s.lq, h);
    put(o2, 2u, sg, sl, q0, slot, s, s.lq, h);
    put(o3, 3u, sg, sl, q0, slot, s, s.lq, h);
    if (DM == 128u) {
        put(o4, 4u, sg, sl, q0, slot, s, s.lq, h);
        put(o5, 5u, sg, sl, q0, slot, s, s.lq, h);
        put(o6, 6u, sg, sl, q0, slot, s, s.lq, h);
        put(o7, 7u, sg, sl, q0, slot, s, s.lq, h);
    }
}
