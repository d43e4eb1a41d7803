// Flash attention on Vulkan, the part the one-row-per-invocation stages share (attn_fwd,
// attn_dq, attn_dkdv; not the cooperative-matrix forward, which reads its inputs 16 bytes at a
// time): the inputs as 32-bit words and the row helpers over the head dim, in private arrays of
// DM elements, and row stores of 16-bit outputs that share a word with a neighbouring row (odd
// head dims).
//
// There is no shared-memory staging and no barrier: each invocation reads K and V (or q and dO)
// through the caches. Lavapipe runs a workgroup with barriers as coroutines, and LLVM took about
// 50 s to compile one such variant with DM-wide private rows live across the barriers.

@group(0) @binding(2) var<storage, read> q: array<u32>;
@group(0) @binding(3) var<storage, read> k: array<u32>;
@group(0) @binding(4) var<storage, read> v: array<u32>;
@group(0) @binding(5) var<storage, read> d_o: array<u32>;
// Element e of input `buf`: 0 q, 1 k, 2 v, 3 dO.
fn ld(buf: u32, e: u32) -> f32 {
    if (buf == 0u) {
        return unpack(q[word_of(e, TX)], e, TX);
    }
    if (buf == 1u) {
        return unpack(k[word_of(e, TX)], e, TX);
    }
    if (buf == 2u) {
        return unpack(v[word_of(e, TX)], e, TX);
    }
    return unpack(d_o[word_of(e, TX)], e, TX);
}

// Row helpers over the head dim, four elements per iteration (lavapipe ends any invocation's
// loops after 65535 iterations in all, so iterations are kept few; the host checks the bound).

// Loads d elements of input `buf` from element `base` (0 where `on` is false, and past d).
fn load_row(row: ptr<function, array<f32, DM>>, buf: u32, base: u32, on: bool) {
    var c = 0u;
    for (; c + 4u <= a.d; c += 4u) {
        (*row)[c] = select(0.0, ld(buf, base + c), on);
        (*row)[c + 1u] = select(0.0, ld(buf, base + c + 1u), on);
        (*row)[c + 2u] = select(0.0, ld(buf, base + c + 2u), on);
        (*row)[c + 3u] = select(0.0, ld(buf, base + c + 3u), on);
    }
    for (; c < a.d; c++) {
        (*row)[c] = select(0.0, ld(buf, base + c), on);
    }
}

// row[c] = 0.
fn zero_row(row: ptr<function, array<f32, DM>>) {
    for (var c = 0u; c < a.d; c++) {
        (*row)[c] = 0.0;
    }
}

// Σ_c row[c]·buf[base + c].
fn dot_row(row: ptr<function, array<f32, DM>>, buf: u32, base: u32) -> f32 {
    var s0 = 0.0;
    var s1 = 0.0;
    var c = 0u;
    for (; c + 4u <= a.d; c += 4u) {
        s0 = fma((*row)[c], ld(buf, base + c), s0);
        s1 = fma((*row)[c + 1u], ld(buf, base + c + 1u), s1);
        s0 = fma((*row)[c + 2u], ld(buf, base + c + 2u), s0);
        s1 = fma((*row)[c + 3u], ld(buf, base + c + 3u), s1);
    }
    for (; c < a.d; c++) {
        s0 = fma((*row)[c], ld(buf, base + c), s0);
    }
    return s0 + s1;
}

// acc[c] = x·buf[base + c] + acc[c].
fn axpy_row(acc: ptr<function, array<f32, DM>>, x: f32, buf: u32, base: u32) {
    var c = 0u;
    for (; c + 4u <= a.d; c += 4u) {
        (*acc)[c] = fma(x, ld(buf, base + c), (*acc)[c]);
        (*acc)[c + 1u] = fma(x, ld(buf, base + c + 1u), (*acc)[c + 1u]);
        (*acc)[c + 2u] = fma(x, ld(buf, base + c + 2u), (*acc)[c + 2u]);
        (*acc)[c + 3u] = fma(x, ld(buf, base + c + 3u), (*acc)[c + 3u]);
    }
    for (; c < a.d; c++) {
        (*acc)[c] = fma(x, ld(buf, base + c), (*acc)[c]);
    }
}

// acc[c] = x·acc[c].
fn scale_row(acc: ptr<function, array<f32, DM>>, x: f32) {
    var c = 0u;
    for (; c + 4u <= a.d; c += 4u) {
        (*acc)[c] *= x;
        (*acc)[c + 1u] *= x;
        (*acc)[c + 2u] *= x;
        (*acc)[c + 3u] *= x;
    }
    for (; c < a.d; c++) {
        (*acc)[c] *= x;
    }
}

// Stores mul·vals (d values; zeros where `on` is false) as the row at element `base` of output
// `slot` (out_store / out_merge are the stage's): whole words plainly, a 16-bit half that shares
// its word with another row by atomically clearing and setting only that half.
fn store_row(slot: u32, base: u32, vals: ptr<function, array<f32, DM>>, mul: f32, on: bool) {
    let m = select(0.0, mul, on);
    if (TX == F32) {
        for (var c = 0u; c < a.d; c++) {
            out_store(slot, base + c, bitcast<u32>(select(0.0, (*vals)[c] * m, on)));
        }
        return;
    }
    var c = 0u;
    if ((base & 1u) == 1u) {
        out_merge(slot, base >> 1u, to_bits(select(0.0, (*vals)[0] * m, on), TX) << 16u, 0x0000FFFFu);
        c = 1u;
    }
    for (; c + 1u < a.d; c += 2u) {
        let lo = select(0.0, (*vals)[c] * m, on);
        let hi = select(0.0, (*vals)[c + 1u] * m, on);
        out_store(slot, (base + c) >> 1u, pack(lo, hi, TX));
    }
    if (c < a.d) {
        out_merge(slot, (base + c) >> 1u, to_bits(select(0.0, (*vals)[c] * m, on), TX), 0xFFFF0000u);
    }
}
