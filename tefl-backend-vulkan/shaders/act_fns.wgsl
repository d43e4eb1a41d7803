// The activations and their derivatives, selected by `act_id()` (0 gelu, 1 qgelu, 2 relu,
// 3 srelu, 4 silu; 6 the identity, whose column sums in activation_dbias.wgsl are plain ones);
// shared by activation.wgsl, activation_vec.wgsl and activation_dbias.wgsl, each of which
// defines `act_id()`: `p.act` from the push constants, or in activation_vec.wgsl its constant
// ACT (one variant per activation: on the H200 the run-time switch, taken for each of a
// chunk's eight elements, made the 16-byte gelu 1.5 times slower).

fn act(v: f32) -> f32 {
    switch act_id() {
        case 0u: {
            return 0.5 * v * (1.0 + tanh_safe(0.7978845608 * (v + 0.044715 * v * v * v)));
        }
        case 1u: {
            return v * sigmoid(1.702 * v);
        }
        case 2u: {
            // NaN first, on the bits: a driver may fold the select into a max that drops it.
            if (is_nan(v)) {
                return v;
            }
            return select(v, 0.0, v < 0.0);
        }
        case 3u: {
            if (is_nan(v)) {
                return v;
            }
            let r = select(v, 0.0, v < 0.0);
            return r * r;
        }
        case 6u: {
            return v;
        }
        default: {
            return v * sigmoid(v);
        }
    }
}

fn dact(v: f32) -> f32 {
    switch act_id() {
        case 0u: {
            let t = tanh_safe(0.7978845608 * (v + 0.044715 * v * v * v));
            return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * 0.7978845608 * (1.0 + 3.0 * 0.044715 * v * v);
        }
        case 1u: {
            let s = sigmoid(1.702 * v);
            return s + 1.702 * v * s * (1.0 - s);
        }
        case 2u: {
            // NaN stays NaN.
            if (is_nan(v)) {
                return v;
            }
            return select(0.0, 1.0, v > 0.0);
        }
        case 3u: {
            if (is_nan(v)) {
                return v;
            }
            return 2.0 * select(v, 0.0, v < 0.0);
        }
        case 6u: {
            return 1.0;
        }
        default: {
            let s = sigmoid(v);
            return s + v * s * (1.0 - s);
        }
    }
}

