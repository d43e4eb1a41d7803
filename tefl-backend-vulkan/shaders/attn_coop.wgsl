// Flash attention on cooperative matrices, the part its stages share (attn_fwd_coop,
// attn_dq_coop, attn_dkdv_coop): 16-bit q, k, v, dO with head dim d = DM (64 or 128), read 16
// bytes at a time into shared tiles, 16×16 fragments of those tiles, and stores of 16×16 f32
// accumulators as 16-bit output rows. A workgroup is four 32-lane subgroups; each subgroup owns
// 16 rows (queries or keys) of the workgroup's 64.
//
// WGSL has no bf16 type: the bf16 variants are these modules with their 16-bit float marked
// bfloat16 after naga (build.rs), as in gemm_coop.wgsl.
//
// Each stage declares KC (rows per step of its loop: 32, or 16), KV_TILES (the KC-row tiles it
// stages at once: 2 for K and V, or q and dO, side by side; 1 where they take turns),
// SCORE_TILES and PROB_TILES (the f32 and 16-bit tiles per subgroup it needs) and `out_word`
// (its outputs). Shared memory often decides how many workgroups share an SM: NVIDIA's Vulkan
// driver fits about 48 KB an SM (H200, 2026-11-28; see gemm_coop.wgsl), so a stage of at most
// 24 KB runs two workgroups an SM where its registers allow, and a larger one runs one.

@group(0) @binding(2) var<storage, read> q: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> k: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> v: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> d_o: array<vec4<u32>>;

// Words per row of the staged tiles: DM halves and 8 of padding, which spreads a fragment's
// rows over the banks and keeps rows 16-byte aligned.
const LDW: u32 = DM / 2u + 4u;
// f32 per row of a subgroup's f32 tiles (16 rows of KC).
const LDS: u32 = KC + 4u;
// f32 per subgroup f32 tile.
const SCORE_TILE: u32 = 16u * LDS;
// Words per row of a subgroup's 16-bit tiles (16 rows of KC).
const LDP: u32 = KC / 2u + 4u;
// Words per subgroup 16-bit tile.
const PROB_TILE: u32 = 16u * LDP;

// KV_TILES staged tiles of KC rows (K then V, or q then dO), also the staging of a block's own
// 64 rows, KV_TILES·KC at a time.
var<workgroup> kv: array<vec2<f16>, KV_TILES * KC * LDW>;
// Per subgroup: SCORE_TILES tiles of 16×KC f32 (scores, dP; also the staging of an accumulator
// on its way out).
var<workgroup> scores: array<f32, SCORE_TILES * 4u * SCORE_TILE>;
// Per subgroup: PROB_TILES tiles of 16×KC 16-bit values (P, dS).
var<workgroup> probs: array<vec2<f16>, PROB_TILES * 4u * PROB_TILE>;

// The two elements of a source word as the tiles' element type (exact both ways; see
// gemm_coop.wgsl's halves).
fn halves(word: u32) -> vec2<f16> {
    if (TX == BF16) {
        return vec2<f16>(vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xFFFF0000u)));
    }
    return vec2<f16>(unpack2x16float(word));
}

// Chunk `at` of input `buf` (0 q, 1 k, 2 v, 3 dO).
fn fetch(buf: u32, at: u32) -> vec4<u32> {
    if (buf == 0u) {
        return q[at];
    }
    if (buf == 1u) {
        return k[at];
    }
    if (buf == 2u) {
        return v[at];
    }
    return d_o[at];
}

// Copies `rows` token rows of input `buf` (head `h` of `heads`), the sequence's positions
// `first`.. (token rows base + position·rs), to the tile rows from `dst` on; positions outside
// [0, len) are zeros.
fn stage(lane: u32, buf: u32, rows: u32, first: i32, len: i32, base: u32, rs: u32, heads: u32, h: u32, dst: u32) {
    let chunks = DM / 8u;
    for (var c = lane; c < rows * chunks; c += 128u) {
        put_chunk(c, dst, load_chunk(c, buf, first, len, base, rs, heads, h));
    }
}

// Chunk c (16 bytes: row c / (DM/8), column chunk c % (DM/8)) of the rows `stage` copies.
fn load_chunk(c: u32, buf: u32, first: i32, len: i32, base: u32, rs: u32, heads: u32, h: u32) -> vec4<u32> {
    let chunks = DM / 8u;
    let pos = first + i32(c / chunks);
    if (pos >= 0 && pos < len) {
        return fetch(buf, row_base(base + u32(pos) * rs, heads, h) / 8u + c % chunks);
    }
    return vec4<u32>();
}

fn put_chunk(c: u32, dst: u32, w: vec4<u32>) {
    let chunks = DM / 8u;
    let at = (dst + c / chunks) * LDW + (c % chunks) * 4u;
    kv[at] = halves(w.x);
    kv[at + 1u] = halves(w.y);
    kv[at + 2u] = halves(w.z);
    kv[at + 3u] = halves(w.w);
}

// An invocation's share of one KC-row tile in registers: chunks lane + 128·i (KC·DM/8 chunks
// in all: SHARE per invocation, 4 at KC = 32 and DM = 128, 1 at KC = 16 and DM = 64), loaded
// while the workgroup computes on the current tile and stored to shared memory at the next
// step.
const SHARE: u32 = KC * DM / 1024u;

struct TileShare {
    c0: vec4<u32>,
    c1: vec4<u32>,
    c2: vec4<u32>,
    c3: vec4<u32>,
}

fn load_share(lane: u32, buf: u32, first: i32, len: i32, base: u32, rs: u32, heads: u32, h: u32) -> TileShare {
    var t: TileShare;
    t.c0 = load_chunk(lane, buf, first, len, base, rs, heads, h);
    if (SHARE >= 2u) {
        t.c1 = load_chunk(lane + 128u, buf, first, len, base, rs, heads, h);
    }
    if (SHARE == 4u) {
        t.c2 = load_chunk(lane + 256u, buf, first, len, base, rs, heads, h);
        t.c3 = load_chunk(lane + 384u, buf, first, len, base, rs, heads, h);
    }
    return t;
}

fn put_share(lane: u32, dst: u32, t: TileShare) {
    put_chunk(lane, dst, t.c0);
    if (SHARE >= 2u) {
        put_chunk(lane + 128u, dst, t.c1);
    }
    if (SHARE == 4u) {
        put_chunk(lane + 256u, dst, t.c2);
        put_chunk(lane + 384u, dst, t.c3);
    }
}

// Staged rows r0.. (16), head dims 16·f.., as the A of a product (row-major).
fn frag_rows(r0: u32, f: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&kv[r0 * LDW + f * 8u], LDW);
}

// Staged rows r0.. (16) read as columns: head dims 16·f.. by those rows, the B of X·Yᵀ.
fn frag_cols(r0: u32, f: u32) -> coop_mat16x16<f16, B> {
    return coopLoad<coop_mat16x16<f16, B>>(&kv[r0 * LDW + f * 8u], LDW);
}

// Staged rows r0.. (16) by head dims 16·f.., the B of P·V (row-major).
fn frag_b(r0: u32, f: u32) -> coop_mat16x16<f16, B> {
    return coopLoadT<coop_mat16x16<f16, B>>(&kv[r0 * LDW + f * 8u], LDW);
}

// A subgroup 16-bit tile's columns 16·c.. (16×16), as the A of a product.
fn frag_prob(tile: u32, sg: u32, c: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&probs[(tile * 4u + sg) * PROB_TILE + c * 8u], LDP);
}

// Σ_f x_f·y_f over the head dim (DM/16 products), y the B fragments of staged rows r0.. read
// as columns: 16 rows of x against 16 staged rows.
fn dot_block(
    r0: u32,
    x0: coop_mat16x16<f16, A>,
    x1: coop_mat16x16<f16, A>,
    x2: coop_mat16x16<f16, A>,
    x3: coop_mat16x16<f16, A>,
    x4: coop_mat16x16<f16, A>,
    x5: coop_mat16x16<f16, A>,
    x6: coop_mat16x16<f16, A>,
    x7: coop_mat16x16<f16, A>,
) -> coop_mat16x16<f32, C> {
    var s = coop_mat16x16<f32, C>();
    s = coopMultiplyAdd(x0, frag_cols(r0, 0u), s);
    s = coopMultiplyAdd(x1, frag_cols(r0, 1u), s);
    s = coopMultiplyAdd(x2, frag_cols(r0, 2u), s);
    s = coopMultiplyAdd(x3, frag_cols(r0, 3u), s);
    if (DM == 128u) {
        s = coopMultiplyAdd(x4, frag_cols(r0, 4u), s);
        s = coopMultiplyAdd(x5, frag_cols(r0, 5u), s);
        s = coopMultiplyAdd(x6, frag_cols(r0, 6u), s);
        s = coopMultiplyAdd(x7, frag_cols(r0, 7u), s);
    }
    return s;
}

// acc + P·Y for head dims 16·f..: P the subgroup's 16-bit tile (its 16-column fragments p0 and,
// at KC = 32, p1), Y the KC staged rows from r0.
fn acc_block(acc: coop_mat16x16<f32, C>, p0: coop_mat16x16<f16, A>, p1: coop_mat16x16<f16, A>, r0: u32, f: u32) -> coop_mat16x16<f32, C> {
    var r = coopMultiplyAdd(p0, frag_b(r0, f), acc);
    if (KC == 32u) {
        r = coopMultiplyAdd(p1, frag_b(r0 + 16u, f), r);
    }
    return r;
}

// Stores a subgroup's 16×16 block to its f32 tile `tile` at column c (row-major).
fn store_block(m: coop_mat16x16<f32, C>, tile: u32, sg: u32, c: u32) {
    // (Named index and stride: naga 30 does not emit expressions written in a coopStoreT.)
    let at = (tile * 4u + sg) * SCORE_TILE + c;
    let stride = LDS;
    coopStoreT(m, &scores[at], stride);
}

// Stores a subgroup's 16×16 accumulator compactly (16 per row) at the start of its first f32
// tile: invocation sl then finds its 8 elements (row sl/2, columns 8·(sl%2)..) at
// park_at(sg, sl).
fn park(m: coop_mat16x16<f32, C>, sg: u32) {
    let at = sg * SCORE_TILE;
    let stride = 16u;
    coopStoreT(m, &scores[at], stride);
}

fn park_at(sg: u32, sl: u32) -> u32 {
    return sg * SCORE_TILE + sl * 8u;
}

// Writes a subgroup's 16×16 accumulator times `mul` as 16-bit output: invocation sl writes its
// 8 elements as 4 words of output `slot` from word `word`, where `write` holds. The caller is in
// workgroup-uniform control flow.
fn put(m: coop_mat16x16<f32, C>, sg: u32, sl: u32, slot: u32, write: bool, word: u32, mul: f32) {
    park(m, sg);
    workgroupBarrier();
    let at = park_at(sg, sl);
    if (write) {
        for (var e = 0u; e < 4u; e++) {
            out_word(slot, word + e, pack(scores[at + 2u * e] * mul, scores[at + 2u * e + 1u] * mul, TX));
        }
    }
    workgroupBarrier();
}

// A query block of the forward and dQ stages: workgroup (query block, head h, sequence b) of
// 64 rows; invocation lane serves (in the elementwise parts) half `part` of the step's keys of
// its row `row` (of the workgroup's 64), query i = q0 + row.
struct QueryBlock {
    b: u32,
    h: u32,
    // The kv head of h (GQA).
    hkv: u32,
    s: Seq,
    // Rows of the sequence's slot in the outputs (sq; its length for thd).
    slot: i32,
    q0: i32,
    sg: u32,
    sl: u32,
    row: u32,
    part: u32,
    i: i32,
    // The keys query i sees.
    keys: vec2<i32>,
    // The keys any row of the block sees: [lo, hi).
    span: vec2<i32>,
}

fn query_block(wid: vec3<u32>, lane: u32) -> QueryBlock {
    var x: QueryBlock;
    x.b = wid.z;
    x.h = wid.y;
    x.hkv = x.h / (a.hq / a.hk);
    x.s = seq_of(x.b);
    x.slot = select(i32(a.sq), x.s.lq, a.qkv_layout == 2u);
    x.q0 = i32(wid.x * BR);
    x.sg = lane / 32u;
    x.sl = lane % 32u;
    x.row = x.sg * 16u + x.sl / 2u;
    x.part = x.sl % 2u;
    x.i = x.q0 + i32(x.row);
    x.keys = key_range(x.s, x.i);
    let last = min(x.q0 + i32(BR), x.s.lq) - 1;
    x.span = vec2<i32>(0, 0);
    if (last >= x.q0) {
        x.span = vec2<i32>(key_range(x.s, x.q0).x, key_range(x.s, last).y);
    }
    return x;
}
