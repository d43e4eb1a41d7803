// Activations, forward and backward, plain and gated ([a | b] halves of the last dim), and the
// clamped SwiGLU. Constants: TX (input and output dtype), TG (incoming gradient), WG.
// One invocation writes one 32-bit word of the output (two 16-bit elements or one f32),
// grid-stride over the words.

struct Params {
    // 0: y = act(x); 1: gi = g·act'(x); 2: gated forward; 3: gated backward.
    mode: u32,
    // 0 gelu, 1 qgelu, 2 relu, 3 srelu, 4 silu; 5: clamped SwiGLU (limit, alpha).
    act: u32,
    // Output elements.
    total: u32,
    // Gated forms: outputs per row (half of x's last dim).
    n: u32,
    limit: f32,
    alpha: f32,
}

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read> g: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
var<immediate> p: Params;

fn ld_x(i: u32) -> f32 {
    return unpack(x[word_of(i, TX)], i, TX);
}

fn ld_g(i: u32) -> f32 {
    return unpack(g[word_of(i, TG)], i, TG);
}

// NaN is tested first, on the bits, throughout: drivers may fold a compare-and-select into a
// min or max that drops NaN, or evaluate an ordered comparison as unordered.

// b clamped to [-limit, limit], NaN kept.
fn clamp_keep_nan(b: f32, limit: f32) -> f32 {
    if (is_nan(b)) {
        return b;
    }
    return clamp(b, -limit, limit);
}

// min(a, limit), NaN kept.
fn cap_keep_nan(a: f32, limit: f32) -> f32 {
    if (is_nan(a)) {
        return a;
    }
    return min(a, limit);
}

fn gated(a: f32, b: f32) -> f32 {
    if (p.act == 5u) {
        let av = cap_keep_nan(a, p.limit);
        return av * sigmoid(p.alpha * av) * (clamp_keep_nan(b, p.limit) + 1.0);
    }
    return act(a) * b;
}

// d out / d a (half 0) or d out / d b (half 1), times gv.
fn dgated(a: f32, b: f32, gv: f32, half: u32) -> f32 {
    if (p.act == 5u) {
        let av = cap_keep_nan(a, p.limit);
        let s = sigmoid(p.alpha * av);
        if (half == 0u) {
            var dav = 0.0;
            if (is_nan(a)) {
                dav = a;
            } else if (a < p.limit) {
                dav = s + p.alpha * av * s * (1.0 - s);
            }
            return gv * (clamp_keep_nan(b, p.limit) + 1.0) * dav;
        }
        var dbv = 0.0;
        if (is_nan(b)) {
            dbv = b;
        } else if (b >= -p.limit && b <= p.limit) {
            dbv = 1.0;
        }
        return gv * av * s * dbv;
    }
    if (half == 0u) {
        return gv * b * dact(a);
    }
    return gv * act(a);
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
