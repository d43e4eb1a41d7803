// generic_gemm's product on cooperative matrices (VK_KHR_cooperative_matrix, tensor cores):
// W = alpha·op(A)·op(B) in f32 for 16-bit A and B, the stage 0 of gemm.wgsl on another pipeline
// (its epilogue stages follow unchanged), or, for a plain product (stage 4), D itself in its
// 16-bit dtype with no W and no epilogue stage. Constants: TX (f16 or bf16), TA and TB
// (transposes), SGM and SGN (subgroups along m and n), GM (tile rows per raster group), OUT
// (what it writes: 0 W, 1 an f16 D, 2 a bf16 D; one variant per output, so that each binary
// holds only its own epilogue).
//
// A workgroup of SGM×SGN 32-lane subgroups computes a TM×TN tile of W (TM = 64·SGM,
// TN = 64·SGN), each subgroup a 64×64 part as 4×4 accumulators of 16×16. K goes in steps of KT:
// each invocation copies its share of a later step's A and B tiles from memory to registers
// (16 bytes per load; LA steps ahead, so LA steps' chunks are in flight) while the subgroups
// multiply the current step out of shared memory, then stores it to shared memory as it came
// (16 bytes per store, no conversion). The tiles are
// arrays of 16-byte units that the fragment loads reinterpret as 16-bit elements:
// SPV_KHR_cooperative_matrix lets a load's pointer point at another type than the matrix's,
// with strides in the pointer's units. WGSL (naga) types a loaded matrix by its pointer, so the
// A and B matrices here are declared f32 and build.rs retypes them to the variant's 16-bit type
// after naga; that also makes the bf16 variant, for which WGSL has no type. The tiles hold the
// sources' elements in the sources' own orientation: a transposed operand is read as a
// column-major matrix instead of being transposed, so every copy is a straight one.
//
// Workgroups take their tiles in raster groups of GM tile rows (column by column within a
// group), so the workgroups running at once share rows of A and columns of B in the L2 cache;
// GM = 1 is plain row order.
//
// Measured on the H100 (2026-11-25, bf16 8192³, 128×128 tiles): 5.85 ms; the same loop with the
// copies from memory left out (the multiplies from shared memory alone) 2.45–2.51 ms. KT 64,
// 32-wide subgroup tiles and double-buffered tiles were all slower; on the H200 (2026-11-26)
// the 128×256 and 256×128 tiles were 2–10% slower than 128×128, raster groups of 8 1–2% faster.
// On the H200 (2026-11-27, alternating three times in one run): issuing the next step's loads
// before the barrier that precedes the multiplies, rather than after it, 8192³ 5.612–5.615 ms
// against 5.634–5.658 (kept); loads without a branch (a clamped index and a select of zero)
// 11.56 ms: the select uses each loaded value as soon as it is loaded, so every load waits there
// instead of behind the multiplies; the fragment loads reordered (B's four, then one A fragment
// before each row of products) made the same binary.
// Shared memory is the budget to watch: on the H200 (2026-11-28) this shader with 30 KB of
// workgroup memory instead of 24 KB ran half as fast (NVIDIA's Vulkan driver then fits one
// workgroup an SM instead of two), which is also why double-buffered tiles (44 KB) lose.
// Registers are the other: what an SM has in flight from memory is the chunks its invocations
// hold. Two steps held (LA = 2) in the 256-invocation workgroups (one an SM: 48 KB of chunks
// an SM instead of 24, 252–253 registers) made 128×256 the fastest tile on the H200
// (2026-12-02, each twice in one run, bf16 4096³ / 8192³): 0.669 / 4.69–4.70 ms against
// 128×128's 0.714–0.715 / 5.45–5.46; in the 128-invocation workgroups (two an SM) it took 255
// registers with spills and ran 4096³ 0.724–0.726, 8192³ 5.22 (one step: 0.705–0.707 / 5.36–5.39),
// and three steps in the 256-invocation ones spilled too (128×256: 0.728–0.730 / 5.28).
// Code size is the third: the sixteen written-out `put`s, each with the W paths and both 16-bit
// conversions of common.wgsl (f16's with its subnormal branches), made a 150 KB binary whose
// epilogue each workgroup fetched instruction by instruction (H200, 2026-12-02: 1024×1024×32
// took 0.064 ms, 0.028 without the L2 flush before it). One variant per output (OUT) and
// branch-free conversions: 23 KB (f16 D) and 40 KB (bf16 D); bf16 4096³ / 8192³ 0.674 / 4.70–4.72
// → 0.514 / 3.93–3.94 ms, f16 4096³ 0.680–0.682 → 0.506–0.508, 1024×1024×32 0.064 → 0.023.
// The staging tiles are per subgroup, so `put` waits on subgroup barriers, not workgroup ones
// (H200, 2026-12-02, alternating twice in one run: bf16 4096³ 0.512–0.514 → 0.511–0.512 ms,
// 8192³ 3.919–3.920 → 3.900–3.910, 4096×4096×32 0.052 → 0.051).
//
// The host takes this path only where every operand row is a whole number of 16-byte chunks
// (k, and m or n where they are the contiguous dimension, multiples of 8), so a chunk is
// either inside the matrix or outside it; stage 4 also needs n to be a multiple of 8.

@group(0) @binding(0) var<storage, read> a: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> b: array<vec4<u32>>;
// D (stage 4): rows of n 16-bit elements, as 16-byte chunks of 8.
@group(0) @binding(6) var<storage, read_write> d: array<vec4<u32>>;

const TM: u32 = 64u * SGM;
const TN: u32 = 64u * SGN;
const KT: u32 = 32u;
// K steps whose chunks an invocation holds in registers at once: two where a workgroup has 256
// invocations (one workgroup an SM on the H200; 253 registers), one where it has 128 (two an
// SM, whose registers are full at one: 242, and 255 with spills at two).
const LA: u32 = select(1u, 2u, WGS == 256u);
// Invocations per workgroup: SGM·SGN subgroups of 32.
const WGS: u32 = 32u * SGM * SGN;
// Row strides of the shared tiles in 16-byte units (eight elements): a tile is either TM (or
// TN) rows of KT elements (KT/8 units, padded by 1) or KT rows of TM (or TN) elements (TM/8
// units, padded by 1). The padding makes the 8 rows a fragment load reads at once fall on
// different 16-byte bank groups (the strides are odd).
const SHORT: u32 = KT / 8u + 1u;
const LONG_A: u32 = TM / 8u + 1u;
const LONG_B: u32 = TN / 8u + 1u;
// 16-byte units per tile (the larger of its two shapes).
const UNITS_A: u32 = max(TM * SHORT, KT * LONG_A);
const UNITS_B: u32 = max(TN * SHORT, KT * LONG_B);
// Chunks of 8 elements per invocation and tile: TM·KT / 8 / WGS (A), TN·KT / 8 / WGS (B).
const CHUNKS_A: u32 = TM * KT / 8u / WGS;
const CHUNKS_B: u32 = TN * KT / 8u / WGS;

var<workgroup> tile_a: array<vec4<f32>, UNITS_A>;
var<workgroup> tile_b: array<vec4<f32>, UNITS_B>;
// One 16×16 f32 accumulator per subgroup on its way out (edge tiles of W, and stage 4).
var<workgroup> stage: array<f32, 256u * SGM * SGN>;

// The i-th chunk this invocation copies of a tile whose source has `len` rows or columns of W
// (m for A, n for B) starting at o0, `t` of them in the tile (TM or TN): its unit in the tile
// (x), its k offset within the step (y) and its index in the source at the first k step (z;
// 0xFFFFFFFF where its row or column is outside the source). A `short` tile has t rows (W's) of
// KT elements along k, KT/8 chunks each: the source is that operand stored with k contiguous
// (A, or Bᵀ), and a k step moves a chunk KT/8 units on; a long one has KT rows (k steps) of t
// elements, t/8 chunks each (Aᵀ, or B), and a k step moves a chunk KT rows (KT·len/8 units) on.
// Computed once: per step a copy only adds the step's offset and checks k (on the H200 that
// gained 0–1.5% over recomputing the whole index each step: address arithmetic is not what
// makes the copies cost).
fn chunk(lane: u32, i: u32, short: bool, t: u32, o0: u32, len: u32) -> vec3<u32> {
    let q = lane + i * WGS;
    if (short) {
        let r = q / (KT / 8u);
        let c = q % (KT / 8u);
        let at = select(0xFFFFFFFFu, (o0 + r) * (p.k / 8u) + c, o0 + r < len);
        return vec3<u32>(r * SHORT + c, c * 8u, at);
    }
    let kk = q / (t / 8u);
    let c = q % (t / 8u);
    let at = select(0xFFFFFFFFu, (kk * len + o0) / 8u + c, o0 + c * 8u < len);
    return vec3<u32>(kk * (t / 8u + 1u) + c, kk, at);
}

fn chunk_a(lane: u32, i: u32, row0: u32) -> vec3<u32> {
    return chunk(lane, i, TA == 0u, TM, row0, p.m);
}

fn chunk_b(lane: u32, i: u32, col0: u32) -> vec3<u32> {
    return chunk(lane, i, TB == 1u, TN, col0, p.n);
}

// Units a k step of KT moves a chunk of A (or B) on in its source.
fn step_a(k0: u32) -> u32 {
    return select(k0 / 8u, k0 * (p.m / 8u), TA == 1u);
}

fn step_b(k0: u32) -> u32 {
    return select(k0 / 8u, k0 * (p.n / 8u), TB == 0u);
}

// The chunk at source index `at` (at the first k step) moved `step` units on, with k offset
// `kofs` in the step at k0: zeros where it is outside the source.
fn fetch_a(at: u32, kofs: u32, k0: u32, step: u32) -> vec4<u32> {
    if (at == 0xFFFFFFFFu || k0 + kofs >= p.k) {
        return vec4<u32>();
    }
    return a[at + step];
}

fn fetch_b(at: u32, kofs: u32, k0: u32, step: u32) -> vec4<u32> {
    if (at == 0xFFFFFFFFu || k0 + kofs >= p.k) {
        return vec4<u32>();
    }
    return b[at + step];
}

// Fragment of op(A): tile rows r.. (16 of them), k steps kk.. (16, kk a multiple of 16).
fn frag_a(r: u32, kk: u32) -> coop_mat16x16<f32, A> {
    if (TA == 0u) {
        return coopLoadT<coop_mat16x16<f32, A>>(&tile_a[r * SHORT + kk / 8u], SHORT);
    }
    return coopLoad<coop_mat16x16<f32, A>>(&tile_a[kk * LONG_A + r / 8u], LONG_A);
}

// Fragment of op(B): k steps kk.., tile columns c...
fn frag_b(kk: u32, c: u32) -> coop_mat16x16<f32, B> {
    if (TB == 0u) {
        return coopLoadT<coop_mat16x16<f32, B>>(&tile_b[kk * LONG_B + c / 8u], LONG_B);
    }
    return coopLoad<coop_mat16x16<f32, B>>(&tile_b[c * SHORT + kk / 8u], SHORT);
}

// The bits of two f32 values in the output dtype OUT (f16 or bf16), lo in the low half: no
// branches, since `put` is written out sixteen times (the shared common.wgsl conversion, with
// its subnormal and range branches for either dtype chosen per call, made this shader's binary
// about five times as large and each workgroup's epilogue wait on instruction fetches: see the
// measurements above). f16 by the conversion instruction (`pack2x16float`, rounded as the
// driver rounds it); bf16 rounded to nearest even on the bits, NaN kept as a quiet NaN.
fn pack_out(lo: f32, hi: f32) -> u32 {
    if (OUT == 1u) {
        return pack2x16float(vec2<f32>(lo, hi));
    }
    let b = bitcast<vec2<u32>>(vec2<f32>(lo, hi));
    let rounded = (b + vec2<u32>(0x7FFFu) + ((b >> vec2<u32>(16u)) & vec2<u32>(1u))) >> vec2<u32>(16u);
    let nan = (b & vec2<u32>(0x7FFFFFFFu)) > vec2<u32>(0x7F800000u);
    let bits = select(rounded, ((b >> vec2<u32>(16u)) & vec2<u32>(0x8000u)) | vec2<u32>(0x7FC0u), nan);
    return bits.x | (bits.y << 16u);
}

// Writes accumulator `m` (16×16 at rows r.., columns c.. of W) scaled by alpha. OUT = 0 (W is
// the output): straight to W where the whole tile is inside it, else through this subgroup's
// staging tile to W with guards. OUT = 1 or 2 (stage 4): through the staging tile to D rounded
// to its dtype, 16 bytes per invocation.
fn put(m: coop_mat16x16<f32, C>, inside: bool, sg: u32, lane: u32, r: u32, c: u32) {
    let scaled = m * p.alpha;
    if (OUT == 0u && inside) {
        // (Named index and stride: naga 30 does not emit expressions written in a coopStoreT.)
        let stride = p.n;
        let at = r * stride + c;
        coopStoreT(scaled, &w[at], stride);
        return;
    }
    // Each subgroup has its own staging tile, so only its own invocations wait for each other.
    subgroupBarrier();
    let base = sg * 256u;
    coopStoreT(scaled, &stage[base], 16u);
    subgroupBarrier();
    let l = lane % 32u;
    if (OUT != 0u) {
        // Row l/2 of the tile, columns (l%2)·8..: one 16-byte chunk of D (n is a multiple of 8).
        let gr = r + l / 2u;
        let gc = c + (l % 2u) * 8u;
        if (gr < p.m && gc < p.n) {
            let s = base + (l / 2u) * 16u + (l % 2u) * 8u;
            var words: vec4<u32>;
            for (var j = 0u; j < 4u; j++) {
                words[j] = pack_out(stage[s + 2u * j], stage[s + 2u * j + 1u]);
            }
            d[(gr * p.n + gc) / 8u] = words;
        }
        return;
    }
    for (var e = l; e < 256u; e += 32u) {
        let gr = r + e / 16u;
        let gc = c + e % 16u;
        if (gr < p.m && gc < p.n) {
            w[gr * p.n + gc] = stage[base + e];
        }
    }
}

// The tile (column, row) of W workgroup `group` of a `grid` computes: raster groups of GM
// tile rows, each taken column by column.
fn tile_of(group: vec3<u32>, grid: vec3<u32>) -> vec2<u32> {
    let id = group.y * grid.x + group.x;
    let per_group = GM * grid.x;
    let first = (id / per_group) * GM;
    let rows = min(grid.y - first, GM);
    let at = id % per_group;
    return vec2<u32>(at / rows, first + at % rows);
}

@compute @workgroup_size(WGS)
fn main(
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) grid: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let tile = tile_of(group, grid);
    let row0 = tile.y * TM;
    let col0 = tile.x * TN;
    // This subgroup's 64×64 part of the tile.
    let sg = lane / 32u;
    let sr = (sg / SGN) * 64u;
    let sc = (sg % SGN) * 64u;
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
    // Each chunk's source index at the first k step, and the chunks of the next LA steps in
    // registers: set 0 for the steps a round starts with, set 1 (LA = 2) for the others.
    var at_a: array<u32, CHUNKS_A>;
    var at_b: array<u32, CHUNKS_B>;
    var ra0: array<vec4<u32>, CHUNKS_A>;
    var rb0: array<vec4<u32>, CHUNKS_B>;
    var ra1: array<vec4<u32>, CHUNKS_A>;
    var rb1: array<vec4<u32>, CHUNKS_B>;
    for (var i = 0u; i < CHUNKS_A; i++) {
        let ch = chunk_a(lane, i, row0);
        at_a[i] = ch.z;
        ra0[i] = fetch_a(ch.z, ch.y, 0u, 0u);
        if (LA == 2u) {
            ra1[i] = fetch_a(ch.z, ch.y, KT, step_a(KT));
        }
    }
    for (var i = 0u; i < CHUNKS_B; i++) {
        let ch = chunk_b(lane, i, col0);
        at_b[i] = ch.z;
        rb0[i] = fetch_b(ch.z, ch.y, 0u, 0u);
        if (LA == 2u) {
            rb1[i] = fetch_b(ch.z, ch.y, KT, step_b(KT));
        }
    }
    // Rounds of LA steps. Where LA is 2 the second step runs even past k: its chunks were
    // fetched as zeros there, and a branch on k around it would not be uniform control flow
    // for the cooperative-matrix operations (LA is a constant, so the branch on it is).
    for (var k0 = 0u; k0 < p.k; k0 += LA * KT) {
        workgroupBarrier();
        for (var i = 0u; i < CHUNKS_A; i++) {
            tile_a[chunk_a(lane, i, row0).x] = bitcast<vec4<f32>>(ra0[i]);
        }
        for (var i = 0u; i < CHUNKS_B; i++) {
            tile_b[chunk_b(lane, i, col0).x] = bitcast<vec4<f32>>(rb0[i]);
        }
        // The round after next's first chunks into registers, issued before the barrier that
        // precedes the multiplies so that they are on their way while the slowest subgroup
        // stores; nothing reads them before that round's stores (a value used sooner makes its
        // load wait there).
        let next = k0 + LA * KT;
        if (next < p.k) {
            let sa = step_a(next);
            let sb = step_b(next);
            for (var i = 0u; i < CHUNKS_A; i++) {
                ra0[i] = fetch_a(at_a[i], chunk_a(lane, i, row0).y, next, sa);
            }
            for (var i = 0u; i < CHUNKS_B; i++) {
                rb0[i] = fetch_b(at_b[i], chunk_b(lane, i, col0).y, next, sb);
            }
        }
        workgroupBarrier();
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
        // The same step on set 1, written out (a loop over the two sets would pick each set
        // by a branch on its counter; written out, every register index is a constant).
        if (LA == 2u) {
            workgroupBarrier();
            for (var i = 0u; i < CHUNKS_A; i++) {
                tile_a[chunk_a(lane, i, row0).x] = bitcast<vec4<f32>>(ra1[i]);
            }
            for (var i = 0u; i < CHUNKS_B; i++) {
                tile_b[chunk_b(lane, i, col0).x] = bitcast<vec4<f32>>(rb1[i]);
            }
            // Zeros past k (fetch_*), which the last round's second step may multiply.
            let next1 = next + KT;
            let sa = step_a(next1);
            let sb = step_b(next1);
            for (var i = 0u; i < CHUNKS_A; i++) {
                ra1[i] = fetch_a(at_a[i], chunk_a(lane, i, row0).y, next1, sa);
            }
            for (var i = 0u; i < CHUNKS_B; i++) {
                rb1[i] = fetch_b(at_b[i], chunk_b(lane, i, col0).y, next1, sb);
            }
            workgroupBarrier();
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
