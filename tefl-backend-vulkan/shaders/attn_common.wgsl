// Flash attention on Vulkan, the part every attention stage shares: the parameters, the
// sequences of a layout (bshd, sbhd, thd with cu_seqlens, padding masks), the keys a query sees
// (causal top-left or bottom-right, sliding windows), dropout's keep factor on the Philox stream
// of tefl_core::philox (64-bit element index). The same rules as tefl-kernels'
// shared/attention_mask.h, so every backend masks alike.
//
// Constants: TX (dtype of q, k, v, o and their gradients), DM (the largest head dim the variant
// serves; the head dim d of a call is at most DM), BR (query or key rows per workgroup).
//
// Bindings 0 to 5 are every stage's inputs: cu_seqlens_q and cu_seqlens_kv (any buffer when
// the layout and mask do not read them), q, k, v and dO (any buffer in the forward; declared by
// attn_rows.wgsl or the stage); each stage binds its other tensors from 6 on.

const LOG2E: f32 = 1.4426950408889634;

// Flag bits of AttnParams.flags.
const CAUSAL: u32 = 1u;
const BOTTOM_RIGHT: u32 = 2u;
const PADDING: u32 = 4u;
const DROPOUT: u32 = 8u;

struct AttnParams {
    batch: u32,
    sq: u32,
    sk: u32,
    hq: u32,
    hk: u32,
    tq: u32,
    d: u32,
    // 0 bshd, 1 sbhd, 2 thd.
    qkv_layout: u32,
    flags: u32,
    // Window bounds, -1: unbounded (already normalised by the host: below sq + sk).
    win_left: i32,
    win_right: i32,
    scale: f32,
    p_drop: f32,
    seed_lo: u32,
    seed_hi: u32,
    off_lo: u32,
    off_hi: u32,
}

@group(0) @binding(0) var<storage, read> cu_q: array<i32>;
@group(0) @binding(1) var<storage, read> cu_k: array<i32>;
var<immediate> a: AttnParams;

// One sequence: valid lengths, the token row of position 0, and token rows between positions.
struct Seq {
    lq: i32,
    lk: i32,
    qb: u32,
    kb: u32,
    rs: u32,
}

fn seq_of(b: u32) -> Seq {
    var s: Seq;
    if (a.qkv_layout == 2u) {
        s.qb = u32(cu_q[b]);
        s.kb = u32(cu_k[b]);
        s.lq = cu_q[b + 1u] - cu_q[b];
        s.lk = cu_k[b + 1u] - cu_k[b];
        s.rs = 1u;
        return s;
    }
    if (a.qkv_layout == 0u) {
        s.qb = b * a.sq;
        s.kb = b * a.sk;
        s.rs = 1u;
    } else {
        s.qb = b;
        s.kb = b;
        s.rs = a.batch;
    }
    if ((a.flags & PADDING) != 0u) {
        s.lq = cu_q[b + 1u] - cu_q[b];
        s.lk = cu_k[b + 1u] - cu_k[b];
    } else {
        s.lq = i32(a.sq);
        s.lk = i32(a.sk);
    }
    return s;
}

fn diagonal(s: Seq) -> i32 {
    return select(0, s.lk - s.lq, (a.flags & BOTTOM_RIGHT) != 0u);
}

// The first key query i may see, before clamping to the sequence (non-decreasing in i).
fn key_lo(s: Seq, i: i32) -> i32 {
    var l = 0;
    if (a.win_left >= 0) {
        l = max(l, i + diagonal(s) - a.win_left);
    }
    return l;
}

// One past the last key query i may see (non-decreasing in i).
fn key_hi(s: Seq, i: i32) -> i32 {
    var h = s.lk;
    if ((a.flags & CAUSAL) != 0u) {
        h = min(h, i + diagonal(s) + 1);
    }
    if (a.win_right >= 0) {
        h = min(h, i + diagonal(s) + a.win_right + 1);
    }
    return h;
}

// The keys [lo, hi) query i sees (empty, lo == hi, when none or i is past the sequence).
fn key_range(s: Seq, i: i32) -> vec2<i32> {
    if (i >= s.lq) {
        return vec2<i32>(0, 0);
    }
    let lo = key_lo(s, i);
    return vec2<i32>(lo, max(key_hi(s, i), lo));
}

// The queries that may see a key of [j0, j1): [first, last) (a superset).
fn block_queries(s: Seq, j0: i32, j1: i32) -> vec2<i32> {
    var first = 0;
    let dg = diagonal(s);
    if ((a.flags & CAUSAL) != 0u) {
        first = max(first, j0 - dg);
    }
    if (a.win_right >= 0) {
        first = max(first, j0 - dg - a.win_right);
    }
    var last = s.lq;
    if (a.win_left >= 0) {
        last = min(last, j1 - dg + a.win_left);
    }
    return vec2<i32>(first, max(last, first));
}

// The query row of an invocation of the forward and dQ stages: workgroup (query block, head h,
// sequence b), row i = block·BR + t.
struct QueryRow {
    b: u32,
    h: u32,
    // The kv head of h (GQA).
    hkv: u32,
    s: Seq,
    // Rows of the sequence's slot in the outputs (sq; its length for thd).
    slot: i32,
    // The first row of the workgroup.
    q0: i32,
    i: i32,
    valid: bool,
    // The keys row i sees.
    r: vec2<i32>,
}

fn query_row(wid: vec3<u32>, t: u32) -> QueryRow {
    var x: QueryRow;
    x.b = wid.z;
    x.h = wid.y;
    x.hkv = x.h / (a.hq / a.hk);
    x.s = seq_of(x.b);
    x.slot = select(i32(a.sq), x.s.lq, a.qkv_layout == 2u);
    x.q0 = i32(wid.x * BR);
    x.i = x.q0 + i32(t);
    x.valid = x.i < x.s.lq;
    x.r = key_range(x.s, x.i);
    return x;
}

// The index of (sequence b, head h, position i) in softmax_lse.
fn lse_index(s: Seq, b: u32, h: u32, i: u32) -> u32 {
    if (a.qkv_layout == 2u) {
        return h * a.tq + s.qb + i;
    }
    return (b * a.hq + h) * a.sq + i;
}

// The dropout factor of (b, h, i, j): 0 or 1/(1 - p), from the Philox uniform of the element
// ((b·hq + h)·sq + i)·sk + j (64-bit; the host checks the row part fits 32 bits); 1 without dropout.
fn keep_factor(b: u32, h: u32, i: u32, j: u32) -> f32 {
    if ((a.flags & DROPOUT) == 0u) {
        return 1.0;
    }
    let row = (b * a.hq + h) * a.sq + i;
    let prod_lo = row * a.sk;
    let lo = prod_lo + j;
    let hi = mulhi(row, a.sk) + select(0u, 1u, lo < prod_lo);
    let u = philox_uniform(lo, hi, a.seed_lo, a.seed_hi, a.off_lo, a.off_hi);
    return select(0.0, 1.0 / (1.0 - a.p_drop), u >= a.p_drop);
}

// The element index of (token row, head, 0) in a tensor of `heads` heads of d elements.
fn row_base(token_row: u32, heads: u32, h: u32) -> u32 {
    return (token_row * heads + h) * a.d;
}
