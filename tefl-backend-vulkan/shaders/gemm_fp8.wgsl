// generic_gemm with FP8 inputs, the product (stage 0): W = alpha · a_scale_inv · b_scale_inv ·
// op(A)·op(B) in f32 on the portable tiles (gemm_tiles.wgsl), every code decoded exactly through
// a table of its format's 256 values in shared memory. Constants: FA and FB (the mantissa bits
// of A's and B's format: 3 for e4m3, 2 for e5m2; the two may differ), WG (= 256). gemm.wgsl's
// stages 1 to 3 (the epilogue, the bias gradient) then read W as they read a float product's.

@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read> a_scale_inv: array<f32>;
@group(0) @binding(4) var<storage, read> b_scale_inv: array<f32>;

var<workgroup> values_a: array<f32, 256>;
var<workgroup> values_b: array<f32, 256>;

// op(A)[r, kk], 0 outside.
fn op_a(r: u32, kk: u32) -> f32 {
    if (r >= p.m || kk >= p.k) {
        return 0.0;
    }
    let i = select(r * p.k + kk, kk * p.m + r, p.transa != 0u);
    return values_a[byte_at(a[i >> 2u], i)];
}

// op(B)[kk, col], 0 outside.
fn op_b(kk: u32, col: u32) -> f32 {
    if (kk >= p.k || col >= p.n) {
        return 0.0;
    }
    let i = select(kk * p.n + col, col * p.k + kk, p.transb != 0u);
    return values_b[byte_at(b[i >> 2u], i)];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    values_a[lane] = fp8_decode(lane, FA);
    values_b[lane] = fp8_decode(lane, FB);
    workgroupBarrier();
    // (alpha · a_scale_inv) · b_scale_inv, as the reference folds the scales into alpha.
    product_tile(group, lane, p.alpha * a_scale_inv[0] * b_scale_inv[0]);
}
