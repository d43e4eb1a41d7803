// Activations, forward and backward, plain and gated, where x, the gradient and the output are
// one 16-bit dtype TX and the counts are whole 16-byte chunks (the total, and for the gated
// forms n, multiples of 8): one invocation writes one chunk of 8 outputs, grid-stride over the
// chunks, reading its inputs as chunks too. Same modes as activation.wgsl
// (activation_params.wgsl). Constants: TX, ACT (the activation, as `p.act` codes it), WG.

@group(0) @binding(0) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> g: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<u32>>;

// The activation (act_fns.wgsl): this variant's constant.
fn act_id() -> u32 {
    return ACT;
}

// Output chunk c.
fn chunk(c: u32) -> Eight {
    var y: Eight;
    switch p.mode {
        case 0u: {
            let e = unpack8(x[c]);
            for (var k = 0u; k < 4u; k++) {
                y.lo[k] = act(e.lo[k]);
                y.hi[k] = act(e.hi[k]);
            }
        }
        case 1u: {
            let e = unpack8(x[c]);
            let d = unpack8(g[c]);
            for (var k = 0u; k < 4u; k++) {
                y.lo[k] = d.lo[k] * dact(e.lo[k]);
                y.hi[k] = d.hi[k] * dact(e.hi[k]);
            }
        }
        case 2u: {
            // Row r's chunk j of the output: a and b chunks of x's row (2n wide).
            let per_row = p.n / 8u;
            let r = c / per_row;
            let j = c - r * per_row;
            let a = unpack8(x[2u * r * per_row + j]);
            let b = unpack8(x[2u * r * per_row + per_row + j]);
            for (var k = 0u; k < 4u; k++) {
                y.lo[k] = gated(a.lo[k], b.lo[k]);
                y.hi[k] = gated(a.hi[k], b.hi[k]);
            }
        }
        default: {
            // gi over [rows, 2n]: chunk j of row r is in the a half or the b half.
            let per_row = p.n / 8u;
            let r = c / (2u * per_row);
            let j = c - r * 2u * per_row;
            let half = select(0u, 1u, j >= per_row);
            let jj = j - half * per_row;
            let a = unpack8(x[2u * r * per_row + jj]);
            let b = unpack8(x[2u * r * per_row + per_row + jj]);
            let d = unpack8(g[r * per_row + jj]);
            for (var k = 0u; k < 4u; k++) {
                y.lo[k] = dgated(a.lo[k], b.lo[k], d.lo[k], half);
                y.hi[k] = dgated(a.hi[k], b.hi[k], d.hi[k], half);
            }
        }
    }
    return y;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let chunks = p.total / 8u;
    let stride = groups.x * WG;
    for (var c = gid.x; c < chunks; c += stride) {
        out[c] = pack8(chunk(c));
    }
}
