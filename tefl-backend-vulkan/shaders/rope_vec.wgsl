// Rotary position embedding, forward and backward, where x and y are 16-bit (TX), heads are
// whole 16-byte chunks (d a multiple of 8) and so is the rotated part (d_rot a multiple of 16,
// or of 8 when interleaved): one invocation per (token row, chunk of a head), across every
// head of the row, so the chunk's 8 cosines and sines are computed once per row instead of once
// per element. Same layouts and options as rope.wgsl (rope_params.wgsl). Constants: TX, WG.

@group(0) @binding(0) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> freqs: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> cu: array<i32>;
@group(0) @binding(3) var<storage, read> starts: array<i32>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<u32>>;

// The angles of columns at..at+7 of the freqs row starting at element f.
fn angles(f: u32, at: u32) -> Eight {
    let i = (f + at) / 4u;
    return Eight(freqs[i], freqs[i + 1u]);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    // Chunks per head, token rows, and work items (row, chunk).
    let per_head = p.d / 8u;
    let rows = p.total / (p.h * p.d);
    let items = rows * per_head;
    for (var it = gid.x; it < items; it += groups.x * WG) {
        let row = it / per_head;
        let k = it - row * per_head;
        let c = k * 8u;
        let first_chunk = row * p.h * per_head + k;
        let rp = row_position(row);
        if (rp.y == 0u || c >= p.d_rot) {
            for (var hh = 0u; hh < p.h; hh++) {
                out[first_chunk + hh * per_head] = x[first_chunk + hh * per_head];
            }
            continue;
        }
        let f = rp.x * p.d_rot;
        let own = angles(f, c);
        let cs = Eight(cos(own.lo), cos(own.hi));
        // The partner of element j: j ± d_rot/2 (its chunk `pc`), or j ^ 1 when interleaved;
        // `sign` is the sign of the partner's term: −sin for the first of a pair going forward
        // (x0 c − x1 s, x1 c + x0 s), and the transpose going backward.
        var sn: Eight;
        var sign_lo = vec4<f32>(1.0);
        var sign_hi = vec4<f32>(1.0);
        var pc = c;
        if (p.interleaved != 0u) {
            sign_lo = vec4<f32>(-1.0, 1.0, -1.0, 1.0);
            sign_hi = sign_lo;
            if (p.backward != 0u) {
                sn = Eight(sin(own.lo.yxwz), sin(own.hi.yxwz));
            } else {
                sn = Eight(sin(own.lo), sin(own.hi));
            }
        } else {
            let half = p.d_rot / 2u;
            let first = c < half;
            pc = select(c - half, c + half, first);
            if (first) {
                sign_lo = vec4<f32>(-1.0);
                sign_hi = sign_lo;
            }
            if (p.backward != 0u) {
                let other = angles(f, pc);
                sn = Eight(sin(other.lo), sin(other.hi));
            } else {
                sn = Eight(sin(own.lo), sin(own.hi));
            }
        }
        if (p.backward != 0u) {
            sign_lo = -sign_lo;
            sign_hi = -sign_hi;
        }
        let partner_chunk = first_chunk - k + pc / 8u;
        for (var hh = 0u; hh < p.h; hh++) {
            let v = unpack8(x[first_chunk + hh * per_head]);
            var w: Eight;
            if (p.interleaved != 0u) {
                w = Eight(v.lo.yxwz, v.hi.yxwz);
            } else {
                w = unpack8(x[partner_chunk + hh * per_head]);
            }
            let y = Eight(v.lo * cs.lo + sign_lo * w.lo * sn.lo, v.hi * cs.hi + sign_hi * w.hi * sn.hi);
            out[first_chunk + hh * per_head] = pack8(y);
        }
    }
}
