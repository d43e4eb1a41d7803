// The push constants of generic_gemm and the bindings every GEMM stage reads: A, B and the f32
// product W (gemm.wgsl, gemm_coop.wgsl).

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

@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> w: array<f32>;
var<immediate> p: Params;
