// Portable flash attention, forward and backward, for any SIMT target (no tensor cores, no warp primitives):
// tiles of BC keys in shared memory, an online softmax per query row, no sq x sk buffer. Every
// layout, mask, window, GQA and dropout option comes from shared/attention_mask.h, exactly as
// the CUDA tensor-core kernel reads them, so both give the same outputs (up to rounding).
//
// A block is BR threads, one query row each (queries q0 .. q0 + BR of one head of one
// sequence); the row's q and its f32 accumulator are per-thread arrays (registers, or local
// memory for large head dims: the loops over the head dim unroll by 8 to keep compiles short). Keys go by tiles of BC
// rows of K and V, converted to f32 in shared memory, over the union of the block's key ranges.
//
// Defines: T, D (head dim), BR, BC, LAYOUT, CAUSAL, BOTTOM_RIGHT, PADDING, WIN_LEFT,
// WIN_RIGHT, DROPOUT.

#define NEG_INF (-__int_as_float(0x7f800000))

extern "C" __global__ void __launch_bounds__(BR) attn_fwd_simt(const T* __restrict__ q, const T* __restrict__ k,
                                                            const T* __restrict__ v, T* __restrict__ o,
                                                            float* __restrict__ lse, const i32* __restrict__ cu_q,
                                                            const i32* __restrict__ cu_k, int batch, int sq, int sk,
                                                            int hq, int hk, int tq, float scale, float p_drop,
                                                            u64 seed, u64 offset) {
    __shared__ float ks[BC][D];
    __shared__ float vs[BC][D];
    __shared__ int s_lo, s_hi;
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * BR;
    const int hkv = h / (hq / hk);
    const Seq s = seq_of(b, batch, sq, sk, cu_q, cu_k);
    const int slot = LAYOUT == 2 ? s.lq : sq; // rows this sequence owns in o / lse
    if (q0 >= slot) return;                   // the whole block: nothing to write
    const int i = q0 + (int)threadIdx.x;
    const bool valid = i < s.lq;
    int lo = 0, hi = 0;
    if (valid) key_range(s, i, &lo, &hi);
    if (threadIdx.x == 0) { s_lo = 0x7fffffff; s_hi = 0; }
    __syncthreads();
    if (lo < hi) { atomicMin(&s_lo, lo); atomicMax(&s_hi, hi); }
    __syncthreads();
    const int blo = s_lo, bhi = s_hi;

    float qr[D], acc[D];
    const T* qrow = q + ((s.qb + (long long)(valid ? i : 0) * s.rs) * hq + h) * D;
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
        qr[d] = valid ? to_f32(qrow[d]) : 0.0f;
        acc[d] = 0.0f;
    }
    // m: running max of the raw scores; probabilities are exp2(scale2 s - mu), mu = scale2 m
    // (0 while the row has seen no key, so exp2(-inf) = 0).
    const float scale2 = scale * 1.4426950408889634f;
    float m = NEG_INF, l = 0.0f;
    for (int j0 = blo; j0 < bhi; j0 += BC) {
        __syncthreads(); // the previous tile is consumed
        for (int e = threadIdx.x; e < BC * D; e += BR) {
            const int r = e / D, c = e % D, j = j0 + r;
            float kv = 0.0f, vv = 0.0f;
            if (j < bhi) {
                const long long at = ((s.kb + (long long)j * s.rs) * hk + hkv) * D + c;
                kv = to_f32(k[at]);
                vv = to_f32(v[at]);
            }
            ks[r][c] = kv;
            vs[r][c] = vv;
        }
        __syncthreads();
        float sc[BC];
        float mx = NEG_INF;
#pragma unroll
        for (int r = 0; r < BC; ++r) {
            const int j = j0 + r;
            float dot = 0.0f;
#pragma unroll 8
            for (int d = 0; d < D; ++d) dot = fmaf(qr[d], ks[r][d], dot);
            sc[r] = (j >= lo && j < hi) ? dot : NEG_INF;
            mx = max_nan(mx, sc[r]);
        }
        const float mn = max_nan(m, mx);
        const float mu = mn == NEG_INF ? 0.0f : mn * scale2;
        const float corr = fast_exp2(m * scale2 - mu);
        m = mn;
        l *= corr;
#pragma unroll 8
        for (int d = 0; d < D; ++d) acc[d] *= corr;
#pragma unroll
        for (int r = 0; r < BC; ++r) {
            float p = fast_exp2(fmaf(sc[r], scale2, -mu));
            l += p;
#if DROPOUT
            p = p == 0.0f ? 0.0f : p * keep_factor(seed, offset, p_drop, b, h, hq, sq, sk, i, j0 + r);
#endif
            if (p != 0.0f) {
#pragma unroll 8
                for (int d = 0; d < D; ++d) acc[d] = fmaf(p, vs[r][d], acc[d]);
            }
        }
    }
    if (i >= slot) return;
    const float inv = recip_or_zero(l); // NaN rows stay NaN
    T* orow = o + ((s.qb + (long long)i * s.rs) * hq + h) * D;
#pragma unroll 8
    for (int d = 0; d < D; ++d) orow[d] = from_f32<T>(valid ? acc[d] * inv : 0.0f);
    lse[lse_index(s, b, h, hq, sq, tq, i)] = (valid && !(l <= 0.0f)) ? m * scale + logf(l) : NEG_INF;
}

extern "C" __global__ void fill_f32_simt(float* __restrict__ p, long long n, float x) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        p[i] = x;
}

// ---- backward (FlashAttention-2's recurrences, recomputing P from lse; no atomics) ----
// With dropout factors z (0 or 1/(1-p)): dV_j = Σ_i P_ij z_ij dO_i, dP_ij = z_ij dO_i·V_j,
// dS_ij = P_ij (dP_ij - delta_i) with delta_i = dO_i·O_i, dK_j = scale Σ_i dS_ij q_i and
// dQ_i = scale Σ_j dS_ij k_j.

// delta[row * hq + h] = Σ_d dO·O, one thread per (token row, head).
extern "C" __global__ void attn_bwd_delta_simt(const T* __restrict__ o, const T* __restrict__ d_o,
                                               float* __restrict__ delta, long long rows_heads) {
    for (long long w = (long long)blockIdx.x * blockDim.x + threadIdx.x; w < rows_heads;
         w += (long long)gridDim.x * blockDim.x) {
        const T* a = o + w * D;
        const T* g = d_o + w * D;
        float s = 0.0f;
        for (int d = 0; d < D; ++d) s = fmaf(to_f32(a[d]), to_f32(g[d]), s);
        delta[w] = s;
    }
}

// dK and dV: one key row per thread (keys j0 .. j0 + BR of kv head blockIdx.y), over every
// query head of its group and every query tile of BC rows staged in shared memory.
extern "C" __global__ void __launch_bounds__(BR) attn_bwd_dkdv_simt(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ d_o,
    const float* __restrict__ lse, const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
    const i32* __restrict__ cu_q, const i32* __restrict__ cu_k, int batch, int sq, int sk, int hq, int hk, int tq,
    float scale, float p_drop, u64 seed, u64 offset) {
    __shared__ float qs[BC][D];
    __shared__ float gs[BC][D];
    __shared__ float ls[BC], dl[BC];
    __shared__ int los[BC], his[BC];
    const int b = blockIdx.z, hkv = blockIdx.y, j0 = blockIdx.x * BR;
    const Seq s = seq_of(b, batch, sq, sk, cu_q, cu_k);
    const int kslot = LAYOUT == 2 ? s.lk : sk; // key rows this sequence owns in dk / dv
    if (j0 >= kslot) return;
    const int j = j0 + (int)threadIdx.x;
    const bool valid = j < s.lk;
    const long long krow = ((s.kb + (long long)(valid ? j : 0) * s.rs) * hk + hkv) * D;
    float kr[D], vr[D], dka[D], dva[D];
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
        kr[d] = valid ? to_f32(k[krow + d]) : 0.0f;
        vr[d] = valid ? to_f32(v[krow + d]) : 0.0f;
        dka[d] = 0.0f;
        dva[d] = 0.0f;
    }
    const float scale2 = scale * 1.4426950408889634f;
    const int group = hq / hk;
    for (int h = hkv * group; h < (hkv + 1) * group; ++h) {
        for (int i0 = 0; i0 < s.lq; i0 += BC) {
            __syncthreads(); // the previous tile is consumed
            for (int e = threadIdx.x; e < BC * D; e += BR) {
                const int r = e / D, c = e % D, i = i0 + r;
                float qv = 0.0f, gv = 0.0f;
                if (i < s.lq) {
                    const long long at = ((s.qb + (long long)i * s.rs) * hq + h) * D + c;
                    qv = to_f32(q[at]);
                    gv = to_f32(d_o[at]);
                }
                qs[r][c] = qv;
                gs[r][c] = gv;
            }
            for (int r = threadIdx.x; r < BC; r += BR) {
                const int i = i0 + r;
                int lo = 0, hi = 0;
                if (i < s.lq) {
                    key_range(s, i, &lo, &hi);
                    ls[r] = lse[lse_index(s, b, h, hq, sq, tq, i)] * 1.4426950408889634f;
                    dl[r] = delta[(s.qb + (long long)i * s.rs) * hq + h];
                } else {
                    ls[r] = 0.0f;
                    dl[r] = 0.0f;
                }
                los[r] = lo;
                his[r] = hi;
            }
            __syncthreads();
            if (!valid) continue;
            for (int r = 0; r < BC; ++r) {
                if (j < los[r] || j >= his[r]) continue;
                float dot = 0.0f, dp = 0.0f;
#pragma unroll 8
                for (int d = 0; d < D; ++d) {
                    dot = fmaf(qs[r][d], kr[d], dot);
                    dp = fmaf(gs[r][d], vr[d], dp);
                }
                const float p = fast_exp2(fmaf(dot, scale2, -ls[r]));
                const float z = keep_factor(seed, offset, p_drop, b, h, hq, sq, sk, i0 + r, j);
                const float pz = p * z, ds = p * (dp * z - dl[r]);
#pragma unroll 8
                for (int d = 0; d < D; ++d) {
                    dva[d] = fmaf(pz, gs[r][d], dva[d]);
                    dka[d] = fmaf(ds, qs[r][d], dka[d]);
                }
            }
        }
    }
    if (j >= kslot) return;
    T* dkrow = dk + ((s.kb + (long long)j * s.rs) * hk + hkv) * D;
    T* dvrow = dv + ((s.kb + (long long)j * s.rs) * hk + hkv) * D;
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
        dkrow[d] = from_f32<T>(valid ? dka[d] * scale : 0.0f);
        dvrow[d] = from_f32<T>(valid ? dva[d] : 0.0f);
    }
}

// dQ: one query row per thread, over the block's key range in tiles of BC keys (as the forward).
extern "C" __global__ void __launch_bounds__(BR) attn_bwd_dq_simt(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ d_o,
    const float* __restrict__ lse, const float* __restrict__ delta, T* __restrict__ dq, const i32* __restrict__ cu_q,
    const i32* __restrict__ cu_k, int batch, int sq, int sk, int hq, int hk, int tq, float scale, float p_drop,
    u64 seed, u64 offset) {
    __shared__ float ks[BC][D];
    __shared__ float vs[BC][D];
    __shared__ int s_lo, s_hi;
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * BR;
    const int hkv = h / (hq / hk);
    const Seq s = seq_of(b, batch, sq, sk, cu_q, cu_k);
    const int slot = LAYOUT == 2 ? s.lq : sq;
    if (q0 >= slot) return;
    const int i = q0 + (int)threadIdx.x;
    const bool valid = i < s.lq;
    int lo = 0, hi = 0;
    if (valid) key_range(s, i, &lo, &hi);
    if (threadIdx.x == 0) { s_lo = 0x7fffffff; s_hi = 0; }
    __syncthreads();
    if (lo < hi) { atomicMin(&s_lo, lo); atomicMax(&s_hi, hi); }
    __syncthreads();
    const int blo = s_lo, bhi = s_hi;
    const long long row = s.qb + (long long)(valid ? i : 0) * s.rs;
    float qr[D], gr[D], acc[D];
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
        qr[d] = valid ? to_f32(q[(row * hq + h) * D + d]) : 0.0f;
        gr[d] = valid ? to_f32(d_o[(row * hq + h) * D + d]) : 0.0f;
        acc[d] = 0.0f;
    }
    const float scale2 = scale * 1.4426950408889634f;
    const float li = valid ? lse[lse_index(s, b, h, hq, sq, tq, i)] * 1.4426950408889634f : 0.0f;
    const float di = valid ? delta[row * hq + h] : 0.0f;
    for (int j0 = blo; j0 < bhi; j0 += BC) {
        __syncthreads();
        for (int e = threadIdx.x; e < BC * D; e += BR) {
            const int r = e / D, c = e % D, j = j0 + r;
            float kv = 0.0f, vv = 0.0f;
            if (j < bhi) {
                const long long at = ((s.kb + (long long)j * s.rs) * hk + hkv) * D + c;
                kv = to_f32(k[at]);
                vv = to_f32(v[at]);
            }
            ks[r][c] = kv;
            vs[r][c] = vv;
        }
        __syncthreads();
        for (int r = 0; r < BC; ++r) {
            const int j = j0 + r;
            if (j < lo || j >= hi) continue;
            float dot = 0.0f, dp = 0.0f;
#pragma unroll 8
            for (int d = 0; d < D; ++d) {
                dot = fmaf(qr[d], ks[r][d], dot);
                dp = fmaf(gr[d], vs[r][d], dp);
            }
            const float p = fast_exp2(fmaf(dot, scale2, -li));
            const float z = keep_factor(seed, offset, p_drop, b, h, hq, sq, sk, i, j);
            const float ds = p * (dp * z - di);
#pragma unroll 8
            for (int d = 0; d < D; ++d) acc[d] = fmaf(ds, ks[r][d], acc[d]);
        }
    }
    if (i >= slot) return;
    T* dqrow = dq + ((s.qb + (long long)i * s.rs) * hq + h) * D;
#pragma unroll 8
    for (int d = 0; d < D; ++d) dqrow[d] = from_f32<T>(valid ? acc[d] * scale : 0.0f);
}
