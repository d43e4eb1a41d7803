// Rotary position embedding, forward and backward (the transpose of the forward), one output
// word per invocation: the general path (rope_vec.wgsl is the 16-byte one). Constants: TX (x
// and y), WG. Layout codes: 0 bshd, 1 sbhd, 2 thd; thd rows past the last sequence are copied.

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read> freqs: array<f32>;
@group(0) @binding(2) var<storage, read> cu: array<i32>;
@group(0) @binding(3) var<storage, read> starts: array<i32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

fn ld_x(i: u32) -> f32 {
    return unpack(x[word_of(i, TX)], i, TX);
}

fn element(e: u32) -> f32 {
    let hd = p.h * p.d;
    let row = e / hd;
    let idx = e - row * hd;
    let c = idx % p.d;
    let base = row * hd + idx - c;
    let rp = row_position(row);
    if (rp.y == 0u || c >= p.d_rot) {
        return ld_x(e);
    }
    var first = false;
    var other = 0u;
    if (p.interleaved != 0u) {
        first = (c & 1u) == 0u;
        other = select(c - 1u, c + 1u, first);
    } else {
        let half = p.d_rot / 2u;
        first = c < half;
        other = select(c - half, c + half, first);
    }
    let v = ld_x(base + c);
    let w = ld_x(base + other);
    let f = rp.x * p.d_rot;
    let cs = cos(freqs[f + c]);
    if (p.backward != 0u) {
        // first: g0 c0 + g1 s1; second: g1 c1 − g0 s0 (s of the partner's angle).
        let so = sin(freqs[f + other]);
        return select(v * cs - w * so, v * cs + w * so, first);
    }
    let sn = sin(freqs[f + c]);
    return select(v * cs + w * sn, v * cs - w * sn, first);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let per = per_word(TX);
    let words = (p.total + per - 1u) / per;
    for (var w = gid.x; w < words; w += groups.x * WG) {
        let e = w * per;
        let lo = element(e);
        var hi = 0.0;
        if (per == 2u && e + 1u < p.total) {
            hi = element(e + 1u);
        }
        out[w] = pack(lo, hi, TX);
    }
}
