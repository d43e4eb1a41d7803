// Helpers of the 16-byte shaders (activation_vec.wgsl, norm_vec.wgsl, softmax_vec.wgsl): a
// 16-bit tensor of dtype TX bound as array<vec4<u32>>, read and written eight elements (one
// chunk) at a time.

// The eight elements of a chunk: 0..3 in lo, 4..7 in hi.
struct Eight {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn wide(w: u32) -> vec2<f32> {
    if (TX == BF16) {
        return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xFFFF0000u));
    }
    return unpack2x16float(w);
}

fn unpack8(c: vec4<u32>) -> Eight {
    return Eight(vec4<f32>(wide(c.x), wide(c.y)), vec4<f32>(wide(c.z), wide(c.w)));
}

fn pack8(e: Eight) -> vec4<u32> {
    return vec4<u32>(pack(e.lo.x, e.lo.y, TX), pack(e.lo.z, e.lo.w, TX), pack(e.hi.x, e.hi.y, TX), pack(e.hi.z, e.hi.w, TX));
}

fn total(e: Eight) -> f32 {
    return dot(e.lo, vec4<f32>(1.0)) + dot(e.hi, vec4<f32>(1.0));
}
