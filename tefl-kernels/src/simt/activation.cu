// Activations, forward and backward, plain and gated ([a | b] halves of the last dim), the
// clamped SwiGLU, and the column sums of the dbias forms.
// Defines: TX (input / output dtype), TG (incoming gradient), ACT (0 gelu, 1 qgelu, 2 relu,
// 3 srelu, 4 silu), CLAMPED (1: clamped SwiGLU with limit and alpha), BLOCK, UNROLL, VEC_BYTES.

#define NV (VEC_BYTES / (int)sizeof(TX))

// e^x and the logistic function on the prelude's one-instruction exp2 and reciprocal (a few
// ulp; these kernels are memory-bound only when their arithmetic is this short: tanhf, expf
// and IEEE division made GELU issue-bound on an H100). exp overflowing to inf gives
// sigmoid 0, underflowing gives 1; NaN stays NaN.
__device__ __forceinline__ float fast_exp(float x) { return fast_exp2(x * 1.4426950408889634f); }
__device__ __forceinline__ float sigmoid(float x) { return fast_rcp(1.0f + fast_exp(-x)); }

// The tanh GELU's inner argument u = sqrt(2/pi) (x + 0.044715 x^3).
__device__ __forceinline__ float gelu_inner(float x) { return 0.7978845608f * (x + 0.044715f * x * x * x); }

__device__ __forceinline__ float act(float x) {
#if ACT == 0
    // 0.5 x (1 + tanh(u)) = x sigmoid(2u).
    return x * sigmoid(2.0f * gelu_inner(x));
#elif ACT == 1
    return x * sigmoid(1.702f * x);
#elif ACT == 2
    return x < 0.0f ? 0.0f : x; // NaN stays NaN (fmaxf would give 0)
#elif ACT == 3
    const float r = x < 0.0f ? 0.0f : x;
    return r * r;
#else
    return x * sigmoid(x);
#endif
}

__device__ __forceinline__ float dact(float x) {
#if ACT == 0
    // d/dx x s with s = sigmoid(2u): s + 2 x s (1 - s) u', where 1 - s = e s for e = exp(-2u)
    // (exact where s is near 1; 1 where e overflows and s is 0).
    const float e = fast_exp(-2.0f * gelu_inner(x));
    const float s = fast_rcp(1.0f + e);
    const float q = fminf(e * s, 1.0f);
    return s + 2.0f * x * s * q * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
#elif ACT == 1
    const float s = sigmoid(1.702f * x);
    return s + 1.702f * x * s * (1.0f - s);
#elif ACT == 2
    return x > 0.0f ? 1.0f : (x != x ? x : 0.0f);
#elif ACT == 3
    return 2.0f * (x < 0.0f ? 0.0f : x);
#else
    const float s = sigmoid(x);
    return s + x * s * (1.0f - s);
#endif
}

// b clamped to [-limit, limit], NaN kept.
__device__ __forceinline__ float clamp_keep_nan(float b, float limit) { return b < -limit ? -limit : (b > limit ? limit : b); }

// out = f(a, b) of the gated forms.
__device__ __forceinline__ float gated(float a, float b, float limit, float alpha) {
#if CLAMPED
    const float av = a > limit ? limit : a; // comparisons, not fminf/fmaxf: NaN stays NaN
    return av * sigmoid(alpha * av) * (clamp_keep_nan(b, limit) + 1.0f);
#else
    return act(a) * b;
#endif
}

// (d out / d a, d out / d b) times g.
__device__ __forceinline__ void dgated(float a, float b, float g, float limit, float alpha, float* da, float* db) {
#if CLAMPED
    const float av = a > limit ? limit : a;
    const float bv = clamp_keep_nan(b, limit);
    const float s = sigmoid(alpha * av);
    const float dav = a < limit ? s + alpha * av * s * (1.0f - s) : (a != a ? a : 0.0f);
    const float dbv = (b >= -limit && b <= limit) ? 1.0f : (b != b ? b : 0.0f);
    *da = g * (bv + 1.0f) * dav;
    *db = g * av * s * dbv;
#else
    *da = g * b * dact(a);
    *db = g * act(a);
#endif
}

#define GRID_STRIDE(i, count)                                                                        \
    for (long long base_ = (long long)blockIdx.x * BLOCK * UNROLL + threadIdx.x; base_ < (count);    \
         base_ += (long long)gridDim.x * BLOCK * UNROLL)                                             \
        _Pragma("unroll") for (int u_ = 0; u_ < UNROLL; ++u_)                                         \
            if (const long long i = base_ + (long long)u_ * BLOCK; i < (count))

// y = act(x) over `total` elements (vectorised when vec != 0: total % NV == 0).
extern "C" __global__ void __launch_bounds__(BLOCK) act_fwd(const TX* __restrict__ x, TX* __restrict__ y,
                                                         long long total, int vec) {
    if (vec) {
        GRID_STRIDE(i, total / NV) {
            float v[NV];
            load_n<TX, NV>(x + i * NV, v);
#pragma unroll
            for (int j = 0; j < NV; ++j) v[j] = act(v[j]);
            store_n<TX, NV>(y + i * NV, v);
        }
    } else {
        GRID_STRIDE(i, total) { y[i] = from_f32<TX>(act(to_f32(x[i]))); }
    }
}

// gi = g * act'(x).
extern "C" __global__ void __launch_bounds__(BLOCK) act_bwd(const TG* __restrict__ g, const TX* __restrict__ x,
                                                         TX* __restrict__ gi, long long total, int vec) {
    if (vec) {
        GRID_STRIDE(i, total / NV) {
            float v[NV], gv[NV];
            load_n<TX, NV>(x + i * NV, v);
            load_n<TG, NV>(g + i * NV, gv);
#pragma unroll
            for (int j = 0; j < NV; ++j) v[j] = gv[j] * dact(v[j]);
            store_n<TX, NV>(gi + i * NV, v);
        }
    } else {
        GRID_STRIDE(i, total) { gi[i] = from_f32<TX>(to_f32(g[i]) * dact(to_f32(x[i]))); }
    }
}

// y[r, c] = f(x[r, c], x[r, n + c]) for rows x n outputs (vectorised when n % NV == 0).
// KEEP (gated_fwd_kept, vectorised rows only): x is loaded with an L2 evict_last policy and the
// lines of the rows from release_from on are released once their outputs are stored
// (load_kept / release_after in the prelude), as the RMSNorm forward does. H200, 2026-12-04,
// bench --only swiglu (16384x8192 bf16, 512 MiB of x), three times in turns: 4245 / 4246 / 4255
// GB/s plain, 4315 / 4317 / 4319 kept and never released (a diagnostic build); the tune
// configs' `gated_fwd_l2` has the committed form's figures.
template <bool KEEP>
__device__ __forceinline__ void gated_fwd_rows(const TX* __restrict__ x, TX* __restrict__ y, int rows, int n, int vec,
                                               float limit, float alpha, int release_from) {
    // The kept form is launched for vectorised rows only: its scalar loop is not compiled.
    if (KEEP || vec) {
        const int per_row = n / NV;
        GRID_STRIDE(i, (long long)rows * per_row) {
            const long long r = i / per_row, c = (i % per_row) * NV;
            const TX* xa = x + r * 2 * n + c;
            const TX* xb = xa + n;
            float a[NV], b[NV];
            if constexpr (KEEP) {
                alignas(16) TX ra[NV], rb[NV];
                load_kept<TX, NV>(ra, xa);
                load_kept<TX, NV>(rb, xb);
                unpack_n<TX, NV>(ra, a);
                unpack_n<TX, NV>(rb, b);
            } else {
                load_n<TX, NV>(xa, a);
                load_n<TX, NV>(xb, b);
            }
#pragma unroll
            for (int j = 0; j < NV; ++j) a[j] = gated(a[j], b[j], limit, alpha);
            store_n<TX, NV>(y + r * n + c, a);
            if constexpr (KEEP) {
                if (r >= release_from) {
                    release_after(x, xa, c == 0);
                    release_after(x, xb, c == 0);
                }
            }
        }
    } else {
        GRID_STRIDE(i, (long long)rows * n) {
            const long long r = i / n, c = i % n;
            y[i] = from_f32<TX>(gated(to_f32(x[r * 2 * n + c]), to_f32(x[r * 2 * n + n + c]), limit, alpha));
        }
    }
}
extern "C" __global__ void __launch_bounds__(BLOCK) gated_fwd(const TX* __restrict__ x, TX* __restrict__ y, int rows,
                                                           int n, int vec, float limit, float alpha) {
    gated_fwd_rows<false>(x, y, rows, n, vec, limit, alpha, rows);
}
extern "C" __global__ void __launch_bounds__(BLOCK) gated_fwd_kept(const TX* __restrict__ x, TX* __restrict__ y,
                                                                int rows, int n, int vec, float limit, float alpha,
                                                                int release_from) {
    gated_fwd_rows<true>(x, y, rows, n, vec, limit, alpha, release_from);
}

// gi[r, c] and gi[r, n + c] from g[r, c], x[r, c], x[r, n + c].
extern "C" __global__ void __launch_bounds__(BLOCK) gated_bwd(const TG* __restrict__ g, const TX* __restrict__ x,
                                                           TX* __restrict__ gi, int rows, int n, int vec, float limit,
                                                           float alpha) {
    if (vec) {
        const int per_row = n / NV;
        GRID_STRIDE(i, (long long)rows * per_row) {
            const long long r = i / per_row, c = (i % per_row) * NV;
            float a[NV], b[NV], gv[NV], da[NV], db[NV];
            load_n<TX, NV>(x + r * 2 * n + c, a);
            load_n<TX, NV>(x + r * 2 * n + n + c, b);
            load_n<TG, NV>(g + r * n + c, gv);
#pragma unroll
            for (int j = 0; j < NV; ++j) dgated(a[j], b[j], gv[j], limit, alpha, &da[j], &db[j]);
            store_n<TX, NV>(gi + r * 2 * n + c, da);
            store_n<TX, NV>(gi + r * 2 * n + n + c, db);
        }
    } else {
        GRID_STRIDE(i, (long long)rows * n) {
            const long long r = i / n, c = i % n;
            float da, db;
            dgated(to_f32(x[r * 2 * n + c]), to_f32(x[r * 2 * n + n + c]), to_f32(g[i]), limit, alpha, &da, &db);
            gi[r * 2 * n + c] = from_f32<TX>(da);
            gi[r * 2 * n + n + c] = from_f32<TX>(db);
        }
    }
}

// Partial column sums of g * act'(x) (unrounded): block (cx, cy) sums rows cy, cy + gridDim.y,
// ... of its columns into ws[cy][c].
extern "C" __global__ void dbias_partial(const TG* __restrict__ g, const TX* __restrict__ x, float* __restrict__ ws,
                                         int rows, int n) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float s = 0.0f;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const size_t i = (size_t)r * n + c;
        s += to_f32(g[i]) * dact(to_f32(x[i]));
    }
    ws[(size_t)blockIdx.y * n + c] = s;
}

// out[c] = Σ_p ws[p][c].
extern "C" __global__ void sum_parts(const float* __restrict__ ws, TX* __restrict__ out, int parts, int n) {
    finish_column_sums(ws, out, parts, n);
}
