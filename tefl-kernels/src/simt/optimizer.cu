// Multi-tensor optimizers: one launch covers every tensor of a dtype group. The host packs a
// table (u64): per tensor [ptr0 .. ptr4, numel, global index], then per chunk [tensor, start];
// block b processes chunk b (CHUNK elements). `snap` is the noop flag as it was before the
// launch, so a block that sets the flag does not stop the others (the reference semantics).
// Defines: T0 .. T4 (list dtypes), KIND (0 scale, 1 l2norm, 2 adam, 3 adam master, 4 sgd,
// 5 compute scale, 6 the noop snapshot and the norms' finish, which touch no tensor list: a
// build holds that kind's kernels only), BLOCK, CHUNK.

#define ENTRY 7

struct Chunk {
    const u64* e;
    long long start, end;
};

__device__ __forceinline__ Chunk chunk_of(const u64* table, int ntensors) {
    const u64* c = table + (size_t)ntensors * ENTRY + 2 * (size_t)blockIdx.x;
    Chunk k;
    k.e = table + c[0] * ENTRY;
    k.start = (long long)c[1];
    const long long n = (long long)k.e[5];
    k.end = k.start + CHUNK < n ? k.start + CHUNK : n;
    return k;
}

#if KIND == 6
extern "C" __global__ void noop_snapshot(const i32* noop, i32* snap) { *snap = *noop; }

// total = sqrt(Σ ws), per[t] = sqrt(ws[t]); zeros when the flag was set before the call.
extern "C" __global__ void mt_l2norm_finish(const double* ws, int n, const i32* snap, float* total, float* per) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double t = 0.0;
    for (int i = 0; i < n; ++i) {
        t += ws[i];
        if (per) per[i] = *snap ? 0.0f : (float)sqrt(ws[i]);
    }
    *total = *snap ? 0.0f : (float)sqrt(t);
}
#endif

#if KIND == 0
// dst = src * scale; noop = 1 when src holds inf/NaN.
extern "C" __global__ void __launch_bounds__(BLOCK) mt_scale(const u64* table, int ntensors, const i32* snap, i32* noop,
                                                          float scale) {
    if (*snap) return;
    const Chunk k = chunk_of(table, ntensors);
    const T0* src = (const T0*)k.e[0];
    T1* dst = (T1*)k.e[1];
    bool bad = false;
    for (long long i = k.start + threadIdx.x; i < k.end; i += BLOCK) {
        const float v = to_f32(src[i]);
        bad |= !isfinite(v);
        dst[i] = from_f32<T1>(v * scale);
    }
    if (bad) *noop = 1;
}
#endif

#if KIND == 1
// ws[global index] += Σ (x * factor)^2 in f64; noop = 1 on inf/NaN. factor = *inv_scale or 1.
extern "C" __global__ void __launch_bounds__(BLOCK) mt_l2norm(const u64* table, int ntensors, const i32* snap, i32* noop,
                                                           const float* inv_scale, double* ws) {
    __shared__ double part[BLOCK / WARP_SIZE];
    if (*snap) return;
    const Chunk k = chunk_of(table, ntensors);
    const T0* x = (const T0*)k.e[0];
    const float factor = inv_scale ? *inv_scale : 1.0f;
    double s = 0.0;
    bool bad = false;
    for (long long i = k.start + threadIdx.x; i < k.end; i += BLOCK) {
        const float y = to_f32(x[i]) * factor;
        bad |= !isfinite(y);
        s += (double)y * (double)y;
    }
    if (bad) *noop = 1;
    s = warp_sum_f64(s);
    if (lane_id() == 0) part[warp_id()] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < BLOCK / WARP_SIZE; ++w) t += part[w];
        atomicAdd(ws + k.e[6], t);
    }
}
#endif

#if KIND == 2 || KIND == 3
// One Adam element: updates m, v and returns the new parameter.
__device__ __forceinline__ float adam_element(float pv, float gv, float& mv, float& vv, float lr, float beta1,
                                              float beta2, float eps, float wd, float bc1, float bc2, int mode) {
    if (mode == 0) gv += wd * pv;
    mv = beta1 * mv + (1.0f - beta1) * gv;
    vv = beta2 * vv + (1.0f - beta2) * gv * gv;
    float update = (mv / bc1) / (sqrtf(vv / bc2) + eps);
    if (mode == 1) update += wd * pv;
    return pv - lr * update;
}

// Adam / AdamW / L2 on (grads T0, params T1, m f32, v f32) or, with KIND 3, (grads T0,
// model params T1, master f32, m, v). mode: 0 L2, 1 AdamW (decoupled), 2 none. Where every
// list's pointer is 16-byte aligned a thread takes 4 elements a step (chunks start at multiples
// of CHUNK, so every step is aligned too), else one.
extern "C" __global__ void __launch_bounds__(BLOCK) mt_adam(const u64* table, int ntensors, const i32* snap, float lr,
                                                         float beta1, float beta2, float eps, float wd, float bc1,
                                                         float bc2, int mode) {
    if (*snap) return;
    const Chunk k = chunk_of(table, ntensors);
    const T0* g = (const T0*)k.e[0];
#if KIND == 3
    T1* model = (T1*)k.e[1];
    float* p = (float*)k.e[2];
    float* m = (float*)k.e[3];
    float* v = (float*)k.e[4];
    const u64 align = k.e[0] | k.e[1] | k.e[2] | k.e[3] | k.e[4];
#else
    T1* p = (T1*)k.e[1];
    float* m = (float*)k.e[2];
    float* v = (float*)k.e[3];
    const u64 align = k.e[0] | k.e[1] | k.e[2] | k.e[3];
#endif
    long long i0 = k.start;
    if (align % 16 == 0 && CHUNK % 4 == 0) {
        constexpr int V = 4;
        const long long steps = (k.end - k.start) / V;
        for (long long j = threadIdx.x; j < steps; j += BLOCK) {
            const long long i = k.start + j * V;
            float pv[V], gv[V], mv[V], vv[V], np[V];
#if KIND == 3
            load_n<float, V>(p + i, pv);
#else
            load_n<T1, V>(p + i, pv);
#endif
            load_n<T0, V>(g + i, gv);
            load_n<float, V>(m + i, mv);
            load_n<float, V>(v + i, vv);
#pragma unroll
            for (int q = 0; q < V; ++q) np[q] = adam_element(pv[q], gv[q], mv[q], vv[q], lr, beta1, beta2, eps, wd, bc1, bc2, mode);
            store_n<float, V>(m + i, mv);
            store_n<float, V>(v + i, vv);
#if KIND == 3
            store_n<float, V>(p + i, np);
            store_n<T1, V>(model + i, np);
#else
            store_n<T1, V>(p + i, np);
#endif
        }
        i0 = k.start + steps * V;
    }
    for (long long i = i0 + threadIdx.x; i < k.end; i += BLOCK) {
        float mv = m[i], vv = v[i];
        const float np = adam_element(to_f32(p[i]), to_f32(g[i]), mv, vv, lr, beta1, beta2, eps, wd, bc1, bc2, mode);
        m[i] = mv;
        v[i] = vv;
#if KIND == 3
        p[i] = np;
        model[i] = from_f32<T1>(np);
#else
        p[i] = from_f32<T1>(np);
#endif
    }
}
#endif

#if KIND == 4
// SGD (PyTorch semantics) on (grads T0, params T1, momentum_buf f32).
extern "C" __global__ void __launch_bounds__(BLOCK) mt_sgd(const u64* table, int ntensors, const i32* snap, float wd,
                                                        float momentum, float dampening, float lr, int nesterov,
                                                        int first_run, int wd_after_momentum, float scale) {
    if (*snap) return;
    const Chunk k = chunk_of(table, ntensors);
    const T0* g = (const T0*)k.e[0];
    T1* p = (T1*)k.e[1];
    float* buf = (float*)k.e[2];
    for (long long i = k.start + threadIdx.x; i < k.end; i += BLOCK) {
        const float pv = to_f32(p[i]);
        float gv = to_f32(g[i]) * scale;
        if (wd != 0.0f && !wd_after_momentum) gv += wd * pv;
        if (momentum != 0.0f) {
            const float b = first_run ? gv : momentum * buf[i] + (1.0f - dampening) * gv;
            buf[i] = b;
            gv = nesterov ? gv + momentum * b : b;
        }
        if (wd != 0.0f && wd_after_momentum) gv += wd * pv;
        p[i] = from_f32<T1>(pv - lr * gv);
    }
}
#endif

#if KIND == 5
// scale = fp8_max / max(amax, eps) (a power of 2 below when asked; kept when not finite),
// scale_inv = 1 / scale, on (amax, scale, scale_inv) f32 lists.
extern "C" __global__ void __launch_bounds__(BLOCK) mt_compute_scale(const u64* table, int ntensors, const i32* snap,
                                                                  float fp8_max, int force_pow_2, float epsilon) {
    if (*snap) return;
    const Chunk k = chunk_of(table, ntensors);
    const float* amax = (const float*)k.e[0];
    float* scale = (float*)k.e[1];
    float* scale_inv = (float*)k.e[2];
    for (long long i = k.start + threadIdx.x; i < k.end; i += BLOCK) {
        const float a = amax[i];
        if (isfinite(a)) {
            float s = fp8_max / fmaxf(a, epsilon);
            if (force_pow_2 && isfinite(s) && s > 0.0f) {
                int e;
                frexpf(s, &e); // s = m * 2^e, m in [0.5, 1): the power of two below is 2^(e-1)
                s = ldexpf(1.0f, e - 1);
            }
            if (isfinite(s) && s > 0.0f) scale[i] = s;
        }
        scale_inv[i] = 1.0f / scale[i];
    }
}
#endif
