// Portable tiled GEMM for any SIMT target (no tensor cores, no warp primitives): w[m, n] (f32)
// = alpha · op(A) · op(B), with op(A) [m, k] (A stored [k, m] when transa) and op(B) [k, n]
// (B stored [n, k] when transb), inputs of type TA (f32, f16 or bf16) accumulated in f32.
// With FP8_IN, A and B are FP8 codes (A_MANT / A_BIAS and B_MANT / B_BIAS: each operand's
// format, the two may differ) decoded exactly, and their per-tensor scale_inv (device scalars)
// multiply alpha: w = alpha · a_scale_inv · b_scale_inv · op(A) · op(B).
// The epilogue (C, bias, GELU, dGELU, bias gradient) is gemm_epilogue.cu's, run on w.
//
// A block of 256 threads computes a 64 x 64 tile of w, each thread a 4 x 4 patch strided by
// 16 rows and 16 columns (so neighbouring threads read neighbouring shared-memory words);
// K advances 16 at a time through shared-memory tiles that every load fills with coalesced
// reads of either orientation. Rows and columns past the edge read as zero.

#define TILE_M 64
#define TILE_N 64
#define TILE_K 16
#define GEMM_THREADS 256
#define PATCH 4
#define STRIDE 16

#ifndef FP8_IN
#define FP8_IN 0
#endif
#if FP8_IN
typedef u8 TA_T;
typedef u8 TB_T;
__device__ __forceinline__ float load_a(u8 c) { return fp8_decode(c, A_MANT, A_BIAS); }
__device__ __forceinline__ float load_b(u8 c) { return fp8_decode(c, B_MANT, B_BIAS); }
#else
typedef TA TA_T;
typedef TA TB_T;
__device__ __forceinline__ float load_a(TA v) { return to_f32(v); }
__device__ __forceinline__ float load_b(TA v) { return to_f32(v); }
#endif

extern "C" __global__ void __launch_bounds__(GEMM_THREADS) gemm_tiled(const TA_T* __restrict__ a,
                                                                       const TB_T* __restrict__ b,
                                                                       float* __restrict__ w, int m, int n, int k,
                                                                       int transa, int transb, float alpha,
                                                                       const float* __restrict__ a_scale_inv,
                                                                       const float* __restrict__ b_scale_inv) {
#if FP8_IN
    alpha = alpha * a_scale_inv[0] * b_scale_inv[0];
#endif
    __shared__ float as[TILE_K][TILE_M + 4];
    __shared__ float bs[TILE_K][TILE_N + 4];
    const int tx = threadIdx.x % STRIDE, ty = threadIdx.x / STRIDE;
    const int row0 = blockIdx.y * TILE_M, col0 = blockIdx.x * TILE_N;
    float acc[PATCH][PATCH];
#pragma unroll
    for (int r = 0; r < PATCH; ++r)
#pragma unroll
        for (int c = 0; c < PATCH; ++c) acc[r][c] = 0.0f;

    for (int k0 = 0; k0 < k; k0 += TILE_K) {
        // op(A)[row0 .. +64, k0 .. +16]: consecutive threads walk the stored matrix's rows.
        for (int e = threadIdx.x; e < TILE_M * TILE_K; e += GEMM_THREADS) {
            const int i = transa ? e % TILE_M : e / TILE_K;
            const int kk = transa ? e / TILE_M : e % TILE_K;
            const int gi = row0 + i, gk = k0 + kk;
            float v = 0.0f;
            if (gi < m && gk < k) v = load_a(transa ? a[(size_t)gk * m + gi] : a[(size_t)gi * k + gk]);
            as[kk][i] = v;
        }
        // op(B)[k0 .. +16, col0 .. +64].
        for (int e = threadIdx.x; e < TILE_K * TILE_N; e += GEMM_THREADS) {
            const int j = transb ? e / TILE_K : e % TILE_N;
            const int kk = transb ? e % TILE_K : e / TILE_N;
            const int gj = col0 + j, gk = k0 + kk;
            float v = 0.0f;
            if (gj < n && gk < k) v = load_b(transb ? b[(size_t)gj * k + gk] : b[(size_t)gk * n + gj]);
            bs[kk][j] = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE_K; ++kk) {
            float av[PATCH], bv[PATCH];
#pragma unroll
            for (int r = 0; r < PATCH; ++r) av[r] = as[kk][ty + STRIDE * r];
#pragma unroll
            for (int c = 0; c < PATCH; ++c) bv[c] = bs[kk][tx + STRIDE * c];
#pragma unroll
            for (int r = 0; r < PATCH; ++r)
#pragma unroll
                for (int c = 0; c < PATCH; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < PATCH; ++r) {
        const int gi = row0 + ty + STRIDE * r;
        if (gi >= m) continue;
#pragma unroll
        for (int c = 0; c < PATCH; ++c) {
            const int gj = col0 + tx + STRIDE * c;
            if (gj < n) w[(size_t)gi * n + gj] = alpha * acc[r][c];
        }
    }
}
