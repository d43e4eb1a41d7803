// generic_gemm's product on cooperative matrices (VK_KHR_cooperative_matrix, tensor cores):
// W = alpha·op(A)·op(B) in f32 for 16-bit A and B, the stage 0 of gemm.wgsl on another pipeline
// (its epilogue stages follow unchanged). Constants: TX (f16 or bf16), TA and TB (transposes).
//
// A workgroup of four 32-lane subgroups computes a 128×128 tile of W, each subgroup a 64×64
// quarter as 4×4 accumulators of 16×16. K goes in steps of KT: each invocation copies its share
// of the next step's A and B tiles from memory to registers (16 bytes per load) while the
// subgroups multiply the current step out of shared memory. The tiles hold the sources' elements
// in the sources' own orientation: a transposed operand is read as a column-major matrix instead
// of being transposed, so every copy is a straight one.
//
// WGSL has no bf16 type: the bf16 variant is this module with its 16-bit float type marked
// bfloat16 after naga (build.rs). Its elements only pass through f32 on their way into the
// tiles (`halves`), which is exact both ways.
//
// The host takes this path only where every operand row is a whole number of 16-byte chunks
// (k, and m or n where they are the contiguous dimension, multiples of 8), so a chunk is
// either inside the matrix or outside it.

@group(0) @binding(0) var<storage, read> a: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> b: array<vec4<u32>>;

const TM: u32 = 128u;
const TN: u32 = 128u;
const KT: u32 = 32u;
// Row strides of the shared tiles in words: a tile is either 128 rows of KT elements (16 words,
// padded to 20) or KT rows of 128 elements (64 words, padded to 68); the padding spreads the
// rows a fragment load reads over the banks and keeps rows 16-byte aligned.
const SHORT: u32 = 20u;
const LONG: u32 = 68u;
// Chunks of 8 elements per invocation and tile: 128·32 / 8 / 128.
const CHUNKS: u32 = 4u;

var<workgroup> tile_a: array<vec2<f16>, 2560>;
var<workgroup> tile_b: array<vec2<f16>, 2560>;
// One 16×16 f32 accumulator per subgroup on its way out, for tiles that cross the edge of W.
var<workgroup> stage: array<f32, 1024>;

// The i-th chunk (of CHUNKS) this invocation copies of a tile whose source has `len` rows or
// columns of W (m for A, n for B) starting at o0: its index in the source (or 0xFFFFFFFF where
// it is outside) and its word in the tile. A `short` tile has 128 rows (W's) of KT elements
// along k, 4 chunks each: the source is that operand stored with k contiguous (A, or Bᵀ); a
// long one has KT rows (k steps) of 128 elements, 16 chunks each (Aᵀ, or B).
fn chunk(lane: u32, i: u32, short: bool, o0: u32, len: u32, k0: u32) -> vec2<u32> {
    let q = lane + i * 128u;
    if (short) {
        let r = q >> 2u;
        let c = q & 3u;
        let ok = o0 + r < len && k0 + c * 8u < p.k;
        return vec2<u32>(select(0xFFFFFFFFu, ((o0 + r) * p.k + k0) / 8u + c, ok), r * SHORT + c * 4u);
    }
    let kk = q >> 4u;
    let c = q & 15u;
    let ok = k0 + kk < p.k && o0 + c * 8u < len;
    return vec2<u32>(select(0xFFFFFFFFu, ((k0 + kk) * len + o0) / 8u + c, ok), kk * LONG + c * 4u);
}

fn chunk_a(lane: u32, i: u32, row0: u32, k0: u32) -> vec2<u32> {
    return chunk(lane, i, TA == 0u, row0, p.m, k0);
}

fn chunk_b(lane: u32, i: u32, col0: u32, k0: u32) -> vec2<u32> {
    return chunk(lane, i, TB == 1u, col0, p.n, k0);
}

fn fetch_a(at: u32) -> vec4<u32> {
    if (at == 0xFFFFFFFFu) {
        return vec4<u32>();
    }
    return a[at];
}

fn fetch_b(at: u32) -> vec4<u32> {
    if (at == 0xFFFFFFFFu) {
        return vec4<u32>();
    }
    return b[at];
}

// The two elements of a source word as the tile's element type: exact for f16 sources, and in
// the bf16 variant (where f16 below is bfloat16) from the bf16 bits widened to f32.
fn halves(word: u32) -> vec2<f16> {
    if (TX == BF16) {
        return vec2<f16>(vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xFFFF0000u)));
    }
    return vec2<f16>(unpack2x16float(word));
}

fn put_words(which: u32, at: u32, v: vec4<u32>) {
    if (which == 0u) {
        tile_a[at] = halves(v.x);
        tile_a[at + 1u] = halves(v.y);
        tile_a[at + 2u] = halves(v.z);
        tile_a[at + 3u] = halves(v.w);
    } else {
        tile_b[at] = halves(v.x);
        tile_b[at + 1u] = halves(v.y);
        tile_b[at + 2u] = halves(v.z);
        tile_b[at + 3u] = halves(v.w);
    }
}

// Fragment of op(A): tile rows r.. (16 of them), k steps kk.. (16, kk even).
fn frag_a(r: u32, kk: u32) -> coop_mat16x16<f16, A> {
    if (TA == 0u) {
        return coopLoadT<coop_mat16x16<f16, A>>(&tile_a[r * SHORT + kk / 2u], SHORT);
    }
    return coopLoad<coop_mat16x16<f16, A>>(&tile_a[kk * LONG + r / 2u], LONG);
}

// Fragment of op(B): k steps kk.., tile columns c...
fn frag_b(kk: u32, c: u32) -> coop_mat16x16<f16, B> {
    if (TB == 0u) {
        return coopLoadT<coop_mat16x16<f16, B>>(&tile_b[kk * LONG + c / 2u], LONG);
    }
    return coopLoad<coop_mat16x16<f16, B>>(&tile_b[c * SHORT + kk / 2u], SHORT);
}

// Writes accumulator `m` (16×16 at rows r.., columns c.. of W) scaled by alpha: straight to W
// where the whole tile is inside it, else through this subgroup's staging tile with guards.
fn put(m: coop_mat16x16<f32, C>, inside: bool, sg: u32, lane: u32, r: u32, c: u32) {
    let scaled = m * p.alpha;
    if (inside) {
        // (Named index and stride: naga 30 does not emit expressions written in a coopStoreT.)
        let stride = p.n;
        let at = r * stride + c;
        coopStoreT(scaled, &w[at], stride);
        return;
    }
    workgroupBarrier();
    let at = sg * 256u;
    coopStoreT(scaled, &stage[at], 16u);
    workgroupBarrier();
    for (var e = lane % 32u; e < 256u; e += 32u) {
        let gr = r + e / 16u;
        let gc = c + e % 16u;
        if (gr < p.m && gc < p.n) {
            w[gr * p.n + gc] = stage[sg * 256u + e];
        }
    }
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let row0 = group.y * TM;
    let col0 = group.x * TN;
    // This subgroup's 64×64 quarter of the tile.
    let sg = lane / 32u;
    let sr = (sg / 2u) * 64u;
    let sc = (sg % 2u) * 64u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
    var c20 = coop_mat16x16<f32, C>();
    var c21 = coop_mat16x16<f32, C>();
    var c22 = coop_mat16x16<f32, C>();
    var c23 = coop_mat16x16<f32, C>();
    var c30 = coop_mat16x16<f32, C>();
    var c31 = coop_mat16x16<f32, C>();
    var c32 = coop_mat16x16<f32, C>();
    var c33 = coop_mat16x16<f32, C>();
    // The next step's chunks, in registers.
    var ra: array<vec4<u32>, 4>;
    var rb: array<vec4<u32>, 4>;
    var wa: array<u32, 4>;
    var wb: array<u32, 4>;
    for (var i = 0u; i < CHUNKS; i++) {
        let ca = chunk_a(lane, i, row0, 0u);
        let cb = chunk_b(lane, i, col0, 0u);
        ra[i] = fetch_a(ca.x);
        rb[i] = fetch_b(cb.x);
        wa[i] = ca.y;
        wb[i] = cb.y;
    }
    for (var k0 = 0u; k0 < p.k; k0 += KT) {
        workgroupBarrier();
        for (var i = 0u; i < CHUNKS; i++) {
            put_words(0u, wa[i], ra[i]);
            put_words(1u, wb[i], rb[i]);
        }
        workgroupBarrier();
        if (k0 + KT < p.k) {
            for (var i = 0u; i < CHUNKS; i++) {
                ra[i] = fetch_a(chunk_a(lane, i, row0, k0 + KT).x);
                rb[i] = fetch_b(chunk_b(lane, i, col0, k0 + KT).x);
            }
        }
        for (var kk = 0u; kk < KT; kk += 16u) {
            let a0 = frag_a(sr, kk);
            let a1 = frag_a(sr + 16u, kk);
            let a2 = frag_a(sr + 32u, kk);
            let a3 = frag_a(sr + 48u, kk);
            let b0 = frag_b(kk, sc);
            let b1 = frag_b(kk, sc + 16u);
            let b2 = frag_b(kk, sc + 32u);
            let b3 = frag_b(kk, sc + 48u);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c02 = coopMultiplyAdd(a0, b2, c02);
            c03 = coopMultiplyAdd(a0, b3, c03);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            c12 = coopMultiplyAdd(a1, b2, c12);
            c13 = coopMultiplyAdd(a1, b3, c13);
            c20 = coopMultiplyAdd(a2, b0, c20);
            c21 = coopMultiplyAdd(a2, b1, c21);
            c22 = coopMultiplyAdd(a2, b2, c22);
            c23 = coopMultiplyAdd(a2, b3, c23);
            c30 = coopMultiplyAdd(a3, b0, c30);
            c31 = coopMultiplyAdd(a3, b1, c31);
            c32 = coopMultiplyAdd(a3, b2, c32);
            c33 = coopMultiplyAdd(a3, b3, c33);
        }
    }
    let inside = row0 + TM <= p.m && col0 + TN <= p.n;
    let r = row0 + sr;
    let c = col0 + sc;
    put(c00, inside, sg, lane, r, c);
    put(c01, inside, sg, lane, r, c + 16u);
    put(c02, inside, sg, lane, r, c + 32u);
    put(c03, inside, sg, lane, r, c + 48u);
    put(c10, inside, sg, lane, r + 16u, c);
    put(c11, inside, sg, lane, r + 16u, c + 16u);
    put(c12, inside, sg, lane, r + 16u, c + 32u);
    put(c13, inside, sg, lane, r + 16u, c + 48u);
    put(c20, inside, sg, lane, r + 32u, c);
    put(c21, inside, sg, lane, r + 32u, c + 16u);
    put(c22, inside, sg, lane, r + 32u, c + 32u);
    put(c23, inside, sg, lane, r + 32u, c + 48u);
    put(c30, inside, sg, lane, r + 48u, c);
    put(c31, inside, sg, lane, r + 48u, c + 16u);
    put(c32, inside, sg, lane, r + 48u, c + 32u);
    put(c33, inside, sg, lane, r + 48u, c + 48u);
}
