// generic_gemm's product on cooperative matrices (VK_KHR_cooperative_matrix, tensor cores), with
// TEFL_VULKAN_COOPMAT=1: W = alpha·op(A)·op(B) in f32 for f16 A and B, the stage 0 of gemm.wgsl
// on another pipeline (its epilogue stages follow unchanged). A workgroup of four 32-lane
// subgroups computes a 128×128 tile of W, each subgroup a 64×64 quarter as 4×4 accumulators of
// 16×16; K goes in steps of KT through shared memory as f16 (row-major tiles: coopLoadT), two
// source elements per 32-bit word where the source rows have even length. Each accumulator goes
// out through a small per-subgroup staging tile, so edges and any row stride are stored with
// guards. f16 only (WGSL has no bf16 type). Constant: TX (f16).

const TM: u32 = 128u;
const TN: u32 = 128u;
const KT: u32 = 32u;
// Row strides of the shared tiles, in elements (padded; multiples of 8 for 16-byte rows).
const AS: u32 = 40u;
const BS: u32 = 136u;

var<workgroup> tile_a: array<f16, 5120>;
var<workgroup> tile_b: array<f16, 4352>;
// One 16×16 f32 accumulator per subgroup on its way out.
var<workgroup> stage: array<f32, 1024>;

// Source elements e and e + 1 of A (which = 0) or B (which = 1), each 0 where its flag says it is
// outside the matrix; e is even, so the pair is one word.
fn pair_at(which: u32, e: u32, ok0: bool, ok1: bool) -> vec2<f32> {
    var word = 0u;
    if (ok0 || ok1) {
        word = select(a[e >> 1u], b[e >> 1u], which == 1u);
    }
    let v = unpack2x16float(word);
    return vec2<f32>(select(0.0, v.x, ok0), select(0.0, v.y, ok1));
}

// One source element (for odd row lengths).
fn one_at(which: u32, e: u32, ok: bool) -> f32 {
    if (!ok) {
        return 0.0;
    }
    let v = unpack2x16float(select(a[e >> 1u], b[e >> 1u], which == 1u));
    return select(v.x, v.y, (e & 1u) == 1u);
}

// Loads the A tile (rows row0.., k0..) and the B tile (k0.., columns col0..). Each source is
// read along its contiguous dimension: pairs of elements per invocation and step.
fn load_tiles(lane: u32, row0: u32, col0: u32, k0: u32) {
    // A: op(A)[r, kk] is a[r·k + kk] (row length k) or a[kk·m + r] (row length m).
    let a_len = select(p.k, p.m, p.transa != 0u);
    // Contiguous extent of the A tile along the source row, and the other extent.
    let a_run = select(KT, TM, p.transa != 0u);
    for (var e = lane * 2u; e < TM * KT; e += 256u) {
        let inner = e % a_run;
        let outer = e / a_run;
        // (tile row r, tile k kk) of the first element, and the source element index.
        var r = outer;
        var kk = inner;
        if (p.transa != 0u) {
            r = inner;
            kk = outer;
        }
        let gr = row0 + r;
        let gk = k0 + kk;
        let src = select(gr * p.k + gk, gk * p.m + gr, p.transa != 0u);
        var v: vec2<f32>;
        if (p.transa != 0u) {
            if ((a_len & 1u) == 0u) {
                v = pair_at(0u, src, gr < p.m && gk < p.k, gr + 1u < p.m && gk < p.k);
            } else {
                v = vec2<f32>(one_at(0u, src, gr < p.m && gk < p.k), one_at(0u, src + 1u, gr + 1u < p.m && gk < p.k));
            }
            tile_a[r * AS + kk] = f16(v.x);
            tile_a[(r + 1u) * AS + kk] = f16(v.y);
        } else {
            if ((a_len & 1u) == 0u) {
                v = pair_at(0u, src, gr < p.m && gk < p.k, gr < p.m && gk + 1u < p.k);
            } else {
                v = vec2<f32>(one_at(0u, src, gr < p.m && gk < p.k), one_at(0u, src + 1u, gr < p.m && gk + 1u < p.k));
            }
            tile_a[r * AS + kk] = f16(v.x);
            tile_a[r * AS + kk + 1u] = f16(v.y);
        }
    }
    // B: op(B)[kk, c] is b[kk·n + c] (row length n) or b[c·k + kk] (row length k).
    let b_len = select(p.n, p.k, p.transb != 0u);
    let b_run = select(TN, KT, p.transb != 0u);
    for (var e = lane * 2u; e < KT * TN; e += 256u) {
        let inner = e % b_run;
        let outer = e / b_run;
        var kk = outer;
        var c = inner;
        if (p.transb != 0u) {
            kk = inner;
            c = outer;
        }
        let gk = k0 + kk;
        let gc = col0 + c;
        let src = select(gk * p.n + gc, gc * p.k + gk, p.transb != 0u);
        var v: vec2<f32>;
        if (p.transb != 0u) {
            if ((b_len & 1u) == 0u) {
                v = pair_at(1u, src, gk < p.k && gc < p.n, gk + 1u < p.k && gc < p.n);
            } else {
                v = vec2<f32>(one_at(1u, src, gk < p.k && gc < p.n), one_at(1u, src + 1u, gk + 1u < p.k && gc < p.n));
            }
            tile_b[kk * BS + c] = f16(v.x);
            tile_b[(kk + 1u) * BS + c] = f16(v.y);
        } else {
            if ((b_len & 1u) == 0u) {
                v = pair_at(1u, src, gk < p.k && gc < p.n, gk < p.k && gc + 1u < p.n);
            } else {
                v = vec2<f32>(one_at(1u, src, gk < p.k && gc < p.n), one_at(1u, src + 1u, gk < p.k && gc + 1u < p.n));
            }
            tile_b[kk * BS + c] = f16(v.x);
            tile_b[kk * BS + c + 1u] = f16(v.y);
        }
    }
}

// Writes accumulator `m` (16×16 at tile row fr, column fc of the workgroup's tile) to W.
fn put(m: coop_mat16x16<f32, C>, sg: u32, lane: u32, row0: u32, col0: u32, fr: u32, fc: u32) {
    workgroupBarrier();
    coopStoreT(m, &stage[sg * 256u], 16u);
    workgroupBarrier();
    let l = lane % 32u;
    for (var e = l; e < 256u; e += 32u) {
        let r = row0 + fr + e / 16u;
        let col = col0 + fc + e % 16u;
        if (r < p.m && col < p.n) {
            w[r * p.n + col] = p.alpha * stage[sg * 256u + e];
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
    for (var k0 = 0u; k0 < p.k; k0 += KT) {
        workgroupBarrier();
        load_tiles(lane, row0, col0, k0);
        workgroupBarrier();
        for (var kk = 0u; kk < KT; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&tile_a[sr * AS + kk], AS);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&tile_a[(sr + 16u) * AS + kk], AS);
            let a2 = coopLoadT<coop_mat16x16<f16, A>>(&tile_a[(sr + 32u) * AS + kk], AS);
            let a3 = coopLoadT<coop_mat16x16<f16, A>>(&tile_a[(sr + 48u) * AS + kk], AS);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&tile_b[kk * BS + sc], BS);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&tile_b[kk * BS + sc + 16u], BS);
            let b2 = coopLoadT<coop_mat16x16<f16, B>>(&tile_b[kk * BS + sc + 32u], BS);
            let b3 = coopLoadT<coop_mat16x16<f16, B>>(&tile_b[kk * BS + sc + 48u], BS);
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
    put(c00, sg, lane, row0, col0, sr, sc);
    put(c01, sg, lane, row0, col0, sr, sc + 16u);
    put(c02, sg, lane, row0, col0, sr, sc + 32u);
    put(c03, sg, lane, row0, col0, sr, sc + 48u);
    put(c10, sg, lane, row0, col0, sr + 16u, sc);
    put(c11, sg, lane, row0, col0, sr + 16u, sc + 16u);
    put(c12, sg, lane, row0, col0, sr + 16u, sc + 32u);
    put(c13, sg, lane, row0, col0, sr + 16u, sc + 48u);
    put(c20, sg, lane, row0, col0, sr + 32u, sc);
    put(c21, sg, lane, row0, col0, sr + 32u, sc + 16u);
    put(c22, sg, lane, row0, col0, sr + 32u, sc + 32u);
    put(c23, sg, lane, row0, col0, sr + 32u, sc + 48u);
    put(c30, sg, lane, row0, col0, sr + 48u, sc);
    put(c31, sg, lane, row0, col0, sr + 48u, sc + 16u);
    put(c32, sg, lane, row0, col0, sr + 48u, sc + 32u);
    put(c33, sg, lane, row0, col0, sr + 48u, sc + 48u);
}
