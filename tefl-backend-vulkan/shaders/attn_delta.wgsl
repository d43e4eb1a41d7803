// Flash attention backward, delta = Σ_d dO·O per (token row, head): one invocation per row-head,
// striding over the rest. Constants: TX, WG.

struct Params {
    rows_heads: u32,
    d: u32,
}

@group(0) @binding(0) var<storage, read> o: array<u32>;
@group(0) @binding(1) var<storage, read> d_o: array<u32>;
@group(0) @binding(2) var<storage, read_write> delta: array<f32>;
var<immediate> p: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    for (var w = gid.x; w < p.rows_heads; w += groups.x * WG) {
        var sum = 0.0;
        for (var c = 0u; c < p.d; c++) {
            let e = w * p.d + c;
            sum = fma(unpack(o[word_of(e, TX)], e, TX), unpack(d_o[word_of(e, TX)], e, TX), sum);
        }
        delta[w] = sum;
    }
}
