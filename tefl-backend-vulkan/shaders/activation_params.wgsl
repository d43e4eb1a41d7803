// The push constants of the activation shaders (activation.wgsl, activation_vec.wgsl) and the
// gated forms' formulas, after act_fns.wgsl.

struct Params {
    // 0: y = act(x); 1: gi = g·act'(x); 2: gated forward; 3: gated backward.
    mode: u32,
    // 0 gelu, 1 qgelu, 2 relu, 3 srelu, 4 silu; 5: clamped SwiGLU (limit, alpha). The 16-byte
    // shader's variants have it as their constant ACT instead (this field is then the same).
    act: u32,
    // Output elements.
    total: u32,
    // Gated forms: outputs per row (half of x's last dim).
    n: u32,
    limit: f32,
    alpha: f32,
}

var<immediate> p: Params;

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
    if (act_id() == 5u) {
        let av = cap_keep_nan(a, p.limit);
        return av * sigmoid(p.alpha * av) * (clamp_keep_nan(b, p.limit) + 1.0);
    }
    return act(a) * b;
}

// d out / d a (half 0) or d out / d b (half 1), times gv.
fn dgated(a: f32, b: f32, gv: f32, half: u32) -> f32 {
    if (act_id() == 5u) {
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

