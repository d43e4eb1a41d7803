// Activations, forward and backward, plain and gated ([a | b] halves of the last dim), and the
// clamped SwiGLU. Constants: TX (input and output dtype), TG (incoming gradient), WG.
// One invocation writes one 32-bit word of the output (two 16-bit elements or one f32),
// grid-stride over the words: the general path (activation_vec.wgsl is the 16-byte one).

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read> g: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

// The activation (act_fns.wgsl): the push constant's.
fn act_id() -> u32 {
    return p.act;
}

fn ld_x(i: u32) -> f32 {
    return unpack(x[word_of(i, TX)], i, TX);
}

fn ld_g(i: u32) -> f32 {
    return unpack(g[word_of(i, TG)], i, TG);
}

// Output element i.
fn element(i: u32) -> f32 {
    switch p.mode {
        case 0u: {
            return act(ld_x(i));
        }
        case 1u: {
            return ld_g(i) * dact(ld_x(i));
        }
        case 2u: {
            let r = i / p.n;
            let c = i - r * p.n;
            return gated(ld_x(r * 2u * p.n + c), ld_x(r * 2u * p.n + p.n + c));
        }
        default: {
            // gi over [rows, 2n]: the a half or the b half of row r.
            let w = 2u * p.n;
            let r = i / w;
            let c = i - r * w;
            let half = select(0u, 1u, c >= p.n);
            let cc = c - half * p.n;
            return dgated(ld_x(r * w + cc), ld_x(r * w + p.n + cc), ld_g(r * p.n + cc), half);
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let per = per_word(TX);
    let words = (p.total + per - 1u) / per;
    let stride = groups.x * WG;
    for (var w = gid.x; w < words; w += stride) {
        let i = w * per;
        let lo = element(i);
        var hi = 0.0;
        if (per == 2u && i + 1u < p.total) {
            hi = element(i + 1u);
        }
        out[w] = pack(lo, hi, TX);
    }
}
