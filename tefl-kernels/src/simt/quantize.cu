// FP8 (OCP e4m3 / e5m2) with per-tensor scaling. Defines: TX (float input / output dtype),
// MANT, BIAS, MAXV, MAXCODE (the format), BLOCK.
// Amax propagates NaN: |x| is non-negative and the prelude's max_nan gives the positive
// canonical NaN 0x7fffffff, which orders above +inf as an integer, so integer max reductions
// keep it.

__device__ __forceinline__ void amax_reduce(float m, float* amax) {
    const int b = warp_max_i32(__float_as_int(m));
    if (lane_id() == 0 && b != 0) atomicMax((int*)amax, b);
}

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
