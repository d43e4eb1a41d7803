// The push constants of generic_gemm and the f32 product W every GEMM stage uses (gemm.wgsl,
// gemm_coop.wgsl); each declares A and B (bindings 0 and 1) with the width it loads them at.

struct Params {
    stage: u32,
    m: u32,
    n: u32,
    k: u32,
    transa: u32,
    transb: u32,
    tc: u32,
    tb: u32,
    taux: u32,
    td: u32,
    // 0 none, 1 bias, 2 gelu, 3 bias+gelu, 4 dgelu, 5 dgelu+bias grad, 6 bias grad.
    ep: u32,
    accumulate: u32,
    parts: u32,
    alpha: f32,
}

@group(0) @binding(2) var<storage, read_write> w: array<f32>;
var<immediate> p: Params;
