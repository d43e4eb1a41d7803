// The push constants of the norm shaders (norm.wgsl, the general path, and norm_vec.wgsl, the
// 16-byte path): the same fields for both, so one host struct fills either.

struct Params {
    stage: u32,
    rows: u32,
    n: u32,
    rpg: u32,
    // Dtype codes: x, gamma, aux (beta forward, dy backward), add, out (y or dx; dgamma/dbeta).
    tx: u32,
    tg: u32,
    ta: u32,
    tadd: u32,
    to: u32,
    zero_centered: u32,
    has_add: u32,
    // Workgroups of the backward (rows of ws), and where stage 4 reads.
    parts: u32,
    ws_offset: u32,
    eps: f32,
}

var<immediate> p: Params;
