// FP8 (OCP e4m3 / e5m2) with per-tensor scaling. Defines: TX (float input / output dtype),
// MANT, BIAS, MAXV, MAXCODE (the format), BLOCK.
// Amax propagates NaN: |x| is non-negative and the prelude's max_nan gives the positive
// canonical NaN, which the prelude's amax_reduce keeps.

extern "C" __global__ void __launch_bounds__(BLOCK) quantize(const TX* __restrict__ x, const float* __restrict__ scale,
                                                          u8* __restrict__ q, float* __restrict__ amax,
                                                          float* __restrict__ scale_inv, long long n) {
    const float s = *scale;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
    float m = 0.0f;
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK) {
        const float v = to_f32(x[i]);
        const float a = fabsf(v);
        m = max_nan(m, a);
        q[i] = fp8_encode(v * s, MANT, BIAS, MAXV, MAXCODE);
    }
    amax_reduce(m, amax);
}

extern "C" __global__ void __launch_bounds__(BLOCK) compute_amax(const TX* __restrict__ x, float* __restrict__ amax, long long n) {
    float m = 0.0f;
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK) {
        m = max_nan(m, fabsf(to_f32(x[i])));
    }
    amax_reduce(m, amax);
}

extern "C" __global__ void __launch_bounds__(BLOCK) dequantize(const u8* __restrict__ q, const float* __restrict__ scale_inv,
                                                            TX* __restrict__ y, long long n) {
    const float s = *scale_inv;
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK)
        y[i] = from_f32<TX>(fp8_decode(q[i], MANT, BIAS) * s);
}

// q_t[n, m] = q[m, n]^T through TILE x TILE shared tiles (blockDim TILE x 8; the tile size is
// not tied to the warp width).
#define TILE 32
extern "C" __global__ void transpose_u8(const u8* __restrict__ q, u8* __restrict__ qt, int m, int n) {
    __shared__ u8 tile[TILE][TILE + 1];
    const int c0 = blockIdx.x * TILE, r0 = blockIdx.y * TILE;
    for (int dy = threadIdx.y; dy < TILE; dy += blockDim.y) {
        const int r = r0 + dy, c = c0 + threadIdx.x;
        if (r < m && c < n) tile[dy][threadIdx.x] = q[(size_t)r * n + c];
    }
    __syncthreads();
    for (int dy = threadIdx.y; dy < TILE; dy += blockDim.y) {
        const int c = c0 + dy, r = r0 + threadIdx.x;
        if (r < m && c < n) qt[(size_t)c * m + r] = tile[threadIdx.x][dy];
    }
}

// Fused cast + transpose (+ column sums) of x[m, n]: per TILE x TILE tile (blockDim TILE x 8),
// q = fp8(x * scale) row-major, and when qt is set the same codes transposed into qt[n, m]
// through shared memory; amax = max |x|; when ws is set, each block row (blockIdx.y) writes
// the column sums of the tiles it covered to ws[blockIdx.y][n] (reduced by colsum_ws). The
// grid's y dimension strides over the row tiles, so any m fits.
extern "C" __global__ void cast_transpose(const TX* __restrict__ x, const float* __restrict__ scale, u8* __restrict__ q,
                                          u8* __restrict__ qt, float* __restrict__ amax, float* __restrict__ scale_inv,
                                          float* __restrict__ ws, int m, int n) {
    __shared__ u8 tile[TILE][TILE + 4];
    __shared__ float csum[8][TILE];
    const float s = *scale;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *scale_inv = 1.0f / s;
    const int c0 = blockIdx.x * TILE;
    const int row_tiles = (m + TILE - 1) / TILE;
    float am = 0.0f, col = 0.0f;
    for (int rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
        const int r0 = rt * TILE;
        for (int dy = threadIdx.y; dy < TILE; dy += blockDim.y) {
            const int r = r0 + dy, c = c0 + threadIdx.x;
            if (r < m && c < n) {
                const float v = to_f32(x[(size_t)r * n + c]);
                am = max_nan(am, fabsf(v));
                col += v;
                const u8 code = fp8_encode(v * s, MANT, BIAS, MAXV, MAXCODE);
                q[(size_t)r * n + c] = code;
                tile[dy][threadIdx.x] = code;
            }
        }
        if (qt != nullptr) {
            __syncthreads();
            for (int dy = threadIdx.y; dy < TILE; dy += blockDim.y) {
                const int c = c0 + dy, r = r0 + threadIdx.x;
                if (r < m && c < n) qt[(size_t)c * m + r] = tile[threadIdx.x][dy];
            }
            __syncthreads();
        }
    }
    amax_reduce(am, amax);
    if (ws != nullptr) {
        csum[threadIdx.y][threadIdx.x] = col;
        __syncthreads();
        if (threadIdx.y == 0 && c0 + threadIdx.x < n) {
            float t = 0.0f;
            for (int k = 0; k < (int)blockDim.y; ++k) t += csum[k][threadIdx.x];
            ws[(size_t)blockIdx.y * n + c0 + threadIdx.x] = t;
        }
    }
}

// dbias[j] = sum over the parts of ws[p][j], in the input's dtype.
extern "C" __global__ void colsum_ws(const float* __restrict__ ws, TX* __restrict__ dbias, int parts, int n) {
    finish_column_sums<TX>(ws, dbias, parts, n);
}

// Delayed scaling: per column j of amax_history [hist, n]: amax (max over the history, or
// the newest row), scale = fp8_max / amax / 2^margin when finite and > 0, scale_inv = 1/scale;
// then the history rolls up one row and row 0 is cleared.
extern "C" __global__ void delayed_scaling(float* __restrict__ h, float* __restrict__ scale, float* __restrict__ scale_inv,
                                           int hist, int n, float fp8_max, float margin, int algo_max) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float amax;
    if (algo_max) {
        amax = 0.0f;
        for (int r = 0; r < hist; ++r) {
            const float v = h[(size_t)r * n + j];
            amax = max_nan(amax, v);
        }
    } else {
        amax = h[j];
    }
    if (isfinite(amax) && amax > 0.0f) {
        const float s = fp8_max / amax / powf(2.0f, margin);
        if (isfinite(s) && s > 0.0f) scale[j] = s;
    }
    scale_inv[j] = 1.0f / scale[j];
    const float first = h[j];
    for (int r = 0; r + 1 < hist; ++r) h[(size_t)r * n + j] = h[(size_t)(r + 1) * n + j];
    h[(size_t)(hist - 1) * n + j] = first;
    h[j] = 0.0f;
}
