// The dbias forms' column sums: dbias[c] = Σ_r g[r, c]·act'(x[r, c]) over the unrounded
// products, in two passes. Constants: TX (input and dbias dtype), TG (gradient), WG.
// Pass 0: workgroup (cx, part) sums rows part, part + parts, ... of columns cx·WG + lane into
// ws[part·n + c] (f32). Pass 1: each invocation writes one word of dbias from the parts.

struct Params {
    stage: u32,
    act: u32,
    rows: u32,
    n: u32,
    parts: u32,
    _pad: u32,
}

// The activation (act_fns.wgsl): the push constant's.
fn act_id() -> u32 {
    return p.act;
}

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read> g: array<u32>;
@group(0) @binding(2) var<storage, read_write> ws: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
var<immediate> p: Params;

fn ld_x(i: u32) -> f32 {
    return unpack(x[word_of(i, TX)], i, TX);
}

fn ld_g(i: u32) -> f32 {
    return unpack(g[word_of(i, TG)], i, TG);
}

fn column_total(c: u32) -> f32 {
    var s = 0.0;
    for (var q = 0u; q < p.parts; q++) {
        s += ws[q * p.n + c];
    }
    return s;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    if (p.stage == 0u) {
        let c = group.x * WG + lane;
        if (c >= p.n) {
            return;
        }
        var s = 0.0;
        for (var r = group.y; r < p.rows; r += p.parts) {
            let i = r * p.n + c;
            s += ld_g(i) * dact(ld_x(i));
        }
        ws[group.y * p.n + c] = s;
        return;
    }
    let per = per_word(TX);
    let words = (p.n + per - 1u) / per;
    for (var w = gid.x; w < words; w += groups.x * WG) {
        let c = w * per;
        var hi = 0.0;
        if (per == 2u && c + 1u < p.n) {
            hi = column_total(c + 1u);
        }
        out[w] = pack(column_total(c), hi, TX);
    }
}
