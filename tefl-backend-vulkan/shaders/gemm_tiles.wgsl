// The portable product's tiles, shared by gemm.wgsl and gemm_fp8.wgsl (each defines op_a and
// op_b: op(A)[r, kk] and op(B)[kk, col] as f32, 0 outside): W's 64×64 tile of workgroup `group`
// = factor·op(A)·op(B), K in steps of 16 through shared memory, 4×4 outputs per invocation
// (WG = 256).

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> tile_a: array<f32, 1024>;
var<workgroup> tile_b: array<f32, 1024>;

fn product_tile(group: vec3<u32>, lane: u32, factor: f32) {
    let row0 = group.y * TM;
    let col0 = group.x * TN;
    let tx = lane % 16u;
    let ty = lane / 16u;
    var acc: array<f32, 16>;
    for (var q = 0u; q < 16u; q++) {
        acc[q] = 0.0;
    }
    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        for (var q = 0u; q < 4u; q++) {
            let idx = lane + q * WG;
            let kk = idx / TM;
            let mm = idx % TM;
            tile_a[idx] = op_a(row0 + mm, k0 + kk);
            tile_b[idx] = op_b(k0 + kk, col0 + mm);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            var fa: array<f32, 4>;
            var fb: array<f32, 4>;
            for (var q = 0u; q < 4u; q++) {
                fa[q] = tile_a[kk * TM + ty * 4u + q];
                fb[q] = tile_b[kk * TN + tx * 4u + q];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i * 4u + j] += fa[i] * fb[j];
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + ty * 4u + i;
        for (var j = 0u; j < 4u; j++) {
            let col = col0 + tx * 4u + j;
            if (r < p.m && col < p.n) {
                w[r * p.n + col] = factor * acc[i * 4u + j];
            }
        }
    }
}
