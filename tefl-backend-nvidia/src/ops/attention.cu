// Flash attention, forward and backward: tiles of BR queries x BC keys in shared memory,
// online softmax, no sq x sk buffer. f16/bf16 tiles multiply on tensor cores (mma.sync
// m16n8k16, f32 accumulation); f32 tiles use the same fragment layout with scalar FMAs, so
// everything after the products is shared.
//
// Defines: T (element type), D (head dim), DP (D rounded up to 16), BR = BC = 64 (4 warps,
// 16 rows each), LAYOUT (0 bshd, 1 sbhd, 2 thd), CAUSAL, BOTTOM_RIGHT, PADDING (lengths from
// cu_seqlens), WIN_LEFT / WIN_RIGHT (-1 = unbounded), DROPOUT.
//
// Rows: query position i of sequence b is token row  qbase(b) + i * rstride, its (row, head)
// element at ((row * H) + h) * D (H = hq for q, o, hk for k, v).

#define BR 64
#define BC 64
#define NWARPS 4
#define PAD (16 / (int)sizeof(T))
#define LDD (DP + PAD)
#define LDP (BC + PAD)
#define NEG_INF (-__int_as_float(0x7f800000))

struct Seq {
    int lq, lk;     // valid lengths
    long long qb, kb; // token row of position 0
    int rs;         // token rows between positions
};

__device__ __forceinline__ Seq seq_of(int b, int batch, int sq, int sk, const i32* cu_q, const i32* cu_k) {
    Seq s;
#if LAYOUT == 2
    s.qb = cu_q[b]; s.kb = cu_k[b];
    s.lq = cu_q[b + 1] - cu_q[b]; s.lk = cu_k[b + 1] - cu_k[b];
    s.rs = 1;
#else
#if LAYOUT == 0
    s.qb = (long long)b * sq; s.kb = (long long)b * sk; s.rs = 1;
#else
    s.qb = b; s.kb = b; s.rs = batch;
#endif
#if PADDING
    s.lq = cu_q[b + 1] - cu_q[b]; s.lk = cu_k[b + 1] - cu_k[b];
#else
    s.lq = sq; s.lk = sk;
#endif
#endif
    return s;
}

// Keys [lo, hi) query i sees (empty when hi <= lo).
__device__ __forceinline__ void key_range(const Seq& s, int i, int* lo, int* hi) {
    const int diag = BOTTOM_RIGHT ? s.lk - s.lq : 0;
    int l = 0, h = s.lk;
    if (i >= s.lq) { *lo = 0; *hi = 0; return; }
    if (CAUSAL) h = min(h, i + diag + 1);
    if (WIN_LEFT >= 0) l = max(l, i + diag - WIN_LEFT);
    if (WIN_RIGHT >= 0) h = min(h, i + diag + WIN_RIGHT + 1);
    *lo = l; *hi = max(h, l);
}

__device__ __forceinline__ float keep_factor(u64 seed, u64 offset, float p, int b, int h, int hq, int sq, int sk, int i, int j) {
#if DROPOUT
    const u64 idx = (((u64)b * hq + h) * sq + i) * (u64)sk + j;
    return philox_uniform(seed, offset, idx) >= p ? 1.0f / (1.0f - p) : 0.0f;
#else
    return 1.0f;
#endif
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Two consecutive-k elements (k, k+1) as an MMA register: contiguous, or `stride` apart.
template <typename E> __device__ __forceinline__ u32 pair(const E* p, int stride) {
    if (stride == 1) return *(const u32*)p;
    return pack2(bits16(p[0]), bits16(p[stride]));
}

// acc[NB][4] += A(16 x KD) * B(KD x 8 NB) for one warp, fragments in the MMA layout.
// A(r, k) = As[r * lda + k] (or As[k * lda + r] when AT); B(k, c) = Bs[c * ldb + k] when BT
// (keys-major, the K tile for S = Q K^T), else Bs[k * ldb + c].
// E is T; a template parameter so that the branch of the other width is discarded.
template <int NB, int KD, bool AT, bool BT, typename E>
__device__ __forceinline__ void warp_mm(float (*acc)[4], const E* As, int lda, const E* Bs, int ldb) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    if constexpr (sizeof(E) == 2) {
#pragma unroll
        for (int k0 = 0; k0 < KD; k0 += 16) {
            u32 a[4];
            if constexpr (!AT) {
                a[0] = pair(As + g * lda + k0 + 2 * t, 1);
                a[1] = pair(As + (g + 8) * lda + k0 + 2 * t, 1);
                a[2] = pair(As + g * lda + k0 + 2 * t + 8, 1);
                a[3] = pair(As + (g + 8) * lda + k0 + 2 * t + 8, 1);
            } else {
                a[0] = pair(As + (k0 + 2 * t) * lda + g, lda);
                a[1] = pair(As + (k0 + 2 * t) * lda + g + 8, lda);
                a[2] = pair(As + (k0 + 2 * t + 8) * lda + g, lda);
                a[3] = pair(As + (k0 + 2 * t + 8) * lda + g + 8, lda);
            }
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                u32 b[2];
                if constexpr (BT) {
                    b[0] = pair(Bs + (nb * 8 + g) * ldb + k0 + 2 * t, 1);
                    b[1] = pair(Bs + (nb * 8 + g) * ldb + k0 + 2 * t + 8, 1);
                } else {
                    // Rows k0..k0+15 of B, columns nb*8..nb*8+7, transposed on load.
                    const E* row = Bs + (k0 + (lane & 15)) * ldb + nb * 8;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                                 : "=r"(b[0]), "=r"(b[1])
                                 : "r"(smem_addr(row)));
                }
                mma_16816(acc[nb], a, b, (E*)nullptr);
            }
        }
    } else {
        for (int k = 0; k < KD; ++k) {
            const float a0 = to_f32(AT ? As[k * lda + g] : As[g * lda + k]);
            const float a1 = to_f32(AT ? As[k * lda + g + 8] : As[(g + 8) * lda + k]);
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                const int c = nb * 8 + 2 * t;
                const float b0 = to_f32(BT ? Bs[c * ldb + k] : Bs[k * ldb + c]);
                const float b1 = to_f32(BT ? Bs[(c + 1) * ldb + k] : Bs[k * ldb + c + 1]);
                acc[nb][0] += a0 * b0;
                acc[nb][1] += a0 * b1;
                acc[nb][2] += a1 * b0;
                acc[nb][3] += a1 * b1;
            }
        }
    }
}

// Loads `rows` rows of D elements (row r at src + row_off(r)) into an LD-strided tile,
// zero-filling invalid rows and the columns D..DP.
__device__ __forceinline__ void load_tile(T* dst, const T* src, int nrows, long long base_row, int rstride, int valid,
                                          int heads, int head) {
    constexpr int VE = 16 / (int)sizeof(T);
    const T zero = from_f32<T>(0.0f);
    if (D % VE == 0) {
        for (int idx = threadIdx.x; idx < nrows * (DP / VE); idx += blockDim.x) {
            const int r = idx / (DP / VE), c = (idx % (DP / VE)) * VE;
            T* d = dst + r * LDD + c;
            if (r < valid && c < D) {
                const T* s = src + ((base_row + (long long)r * rstride) * heads + head) * D + c;
                *(uint4*)d = *(const uint4*)s;
            } else {
#pragma unroll
                for (int e = 0; e < VE; ++e) d[e] = zero;
            }
        }
    } else {
        for (int idx = threadIdx.x; idx < nrows * DP; idx += blockDim.x) {
            const int r = idx / DP, c = idx % DP;
            dst[r * LDD + c] = (r < valid && c < D) ? src[((base_row + (long long)r * rstride) * heads + head) * D + c] : zero;
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) attn_fwd(const T* __restrict__ q, const T* __restrict__ k,
                                                        const T* __restrict__ v, T* __restrict__ o,
                                                        float* __restrict__ lse, const i32* __restrict__ cu_q,
                                                        const i32* __restrict__ cu_k, int batch, int sq, int sk, int hq,
                                                        int hk, int tq, float scale, float p_drop, u64 seed,
                                                        u64 offset) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* Qs = (T*)smem_raw;
    T* Ks = Qs + BR * LDD;
    T* Vs = Ks + BC * LDD;
    T* Ps = Vs + BC * LDD;
    __shared__ int s_lo, s_hi;

    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * BR;
    const int hkv = h / (hq / hk);
    const Seq s = seq_of(b, batch, sq, sk, cu_q, cu_k);
    const int slot = LAYOUT == 2 ? s.lq : sq; // rows this sequence owns in o / lse
    if (q0 >= slot) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = q0 + warp * 16 + g, r1 = r0 + 8; // this thread's two query rows
    int lo0, hi0, lo1, hi1;
    key_range(s, r0, &lo0, &hi0);
    key_range(s, r1, &lo1, &hi1);
    if (threadIdx.x == 0) { s_lo = 0x7fffffff; s_hi = 0; }
    __syncthreads();
    if (hi0 > lo0) { atomicMin(&s_lo, lo0); atomicMax(&s_hi, hi0); }
    if (hi1 > lo1) { atomicMin(&s_lo, lo1); atomicMax(&s_hi, hi1); }
    load_tile(Qs, q, BR, s.qb + (long long)q0 * s.rs, s.rs, min(BR, s.lq - q0), hq, h);
    __syncthreads();
    const int blo = s_lo, bhi = s_hi;

    float acc[DP / 8][4];
#pragma unroll
    for (int nb = 0; nb < DP / 8; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    T* Pw = Ps + warp * 16 * LDP;

    for (int j0 = blo; j0 < bhi; j0 += BC) {
        const int nvalid = min(BC, bhi - j0);
        load_tile(Ks, k, BC, s.kb + (long long)j0 * s.rs, s.rs, nvalid, hk, hkv);
        load_tile(Vs, v, BC, s.kb + (long long)j0 * s.rs, s.rs, nvalid, hk, hkv);
        __syncthreads();
        float sc[BC / 8][4];
#pragma unroll
        for (int nb = 0; nb < BC / 8; ++nb) sc[nb][0] = sc[nb][1] = sc[nb][2] = sc[nb][3] = 0.0f;
        warp_mm<BC / 8, DP, false, true>(sc, Qs + warp * 16 * LDD, LDD, Ks, LDD);
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int nb = 0; nb < BC / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = j0 + nb * 8 + 2 * t + e;
                sc[nb][e] = (j >= lo0 && j < hi0) ? sc[nb][e] * scale : NEG_INF;
                sc[nb][2 + e] = (j >= lo1 && j < hi1) ? sc[nb][2 + e] * scale : NEG_INF;
                mx0 = fmaxf(mx0, sc[nb][e]);
                mx1 = fmaxf(mx1, sc[nb][2 + e]);
            }
        }
        mx0 = fmaxf(mx0, shfl_xor(mx0, 1)); mx0 = fmaxf(mx0, shfl_xor(mx0, 2));
        mx1 = fmaxf(mx1, shfl_xor(mx1, 1)); mx1 = fmaxf(mx1, shfl_xor(mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float c0 = mn0 == NEG_INF ? 1.0f : expf(m0 - mn0);
        const float c1 = mn1 == NEG_INF ? 1.0f : expf(m1 - mn1);
        m0 = mn0; m1 = mn1;
        l0 *= c0; l1 *= c1;
#pragma unroll
        for (int nb = 0; nb < DP / 8; ++nb) { acc[nb][0] *= c0; acc[nb][1] *= c0; acc[nb][2] *= c1; acc[nb][3] *= c1; }
#pragma unroll
        for (int nb = 0; nb < BC / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = j0 + nb * 8 + 2 * t + e;
                const float p0 = sc[nb][e] == NEG_INF ? 0.0f : expf(sc[nb][e] - m0);
                const float p1 = sc[nb][2 + e] == NEG_INF ? 0.0f : expf(sc[nb][2 + e] - m1);
                l0 += p0; l1 += p1;
                const float k0f = p0 == 0.0f ? 0.0f : keep_factor(seed, offset, p_drop, b, h, hq, sq, sk, r0, j);
                const float k1f = p1 == 0.0f ? 0.0f : keep_factor(seed, offset, p_drop, b, h, hq, sq, sk, r1, j);
                Pw[g * LDP + nb * 8 + 2 * t + e] = from_f32<T>(p0 * k0f);
                Pw[(g + 8) * LDP + nb * 8 + 2 * t + e] = from_f32<T>(p1 * k1f);
            }
        }
        __syncwarp();
        warp_mm<DP / 8, BC, false, false>(acc, Pw, LDP, Vs, LDD);
        __syncthreads();
    }
    l0 += shfl_xor(l0, 1); l0 += shfl_xor(l0, 2);
    l1 += shfl_xor(l1, 1); l1 += shfl_xor(l1, 2);
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = half ? r1 : r0;
        if (r >= slot) continue;
        const float inv = half ? inv1 : inv0;
        const long long row = s.qb + (long long)r * s.rs;
        T* orow = o + (row * hq + h) * D;
#pragma unroll
        for (int nb = 0; nb < DP / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = nb * 8 + 2 * t + e;
                if (c < D) orow[c] = from_f32<T>(r < s.lq ? acc[nb][half * 2 + e] * inv : 0.0f);
            }
        }
        if (t == 0) {
            const float l = half ? l1 : l0, m = half ? m1 : m0;
            const float val = (r < s.lq && l > 0.0f) ? m + logf(l) : NEG_INF;
            const long long li = LAYOUT == 2 ? (long long)h * tq + s.qb + r : ((long long)b * hq + h) * sq + r;
            lse[li] = val;
        }
    }
}

// delta[row * hq + h] = Σ_d dO·O (f32), one warp per (token row, head).
extern "C" __global__ void attn_bwd_delta(const T* __restrict__ o, const T* __restrict__ d_o, float* __restrict__ delta,
                                          long long rows_heads) {
    const long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= rows_heads) return;
    float acc = 0.0f;
    for (int c = lane; c < D; c += 32) acc += to_f32(o[w * D + c]) * to_f32(d_o[w * D + c]);
    acc = warp_sum(acc);
    if (lane == 0) delta[w] = acc;
}

// One block per (key tile, kv head, sequence): dK and dV in registers over every query
// head of the group and every query tile that sees the keys; dQ through f32 atomics.
extern "C" __global__ void __launch_bounds__(128) attn_bwd(const T* __restrict__ q, const T* __restrict__ k,
                                                        const T* __restrict__ v, const T* __restrict__ d_o,
                                                        const float* __restrict__ lse, const float* __restrict__ delta,
                                                        float* __restrict__ dq_acc, T* __restrict__ dk,
                                                        T* __restrict__ dv, const i32* __restrict__ cu_q,
                                                        const i32* __restrict__ cu_k, int batch, int sq, int sk, int hq,
                                                        int hk, int tq, float scale, float p_drop, u64 seed,
                                                        u64 offset) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* Ks = (T*)smem_raw;
    T* Vs = Ks + BC * LDD;
    T* Qs = Vs + BC * LDD;
    T* dOs = Qs + BR * LDD;
    T* PdT = dOs + BR * LDD;  // [BC][LDP]: dropped probabilities, keys x queries
    T* dST = PdT + BC * LDP;  // [BC][LDP]: dS, keys x queries
    float* lse_s = (float*)(dST + BC * LDP);
    float* del_s = lse_s + BR;

    const int b = blockIdx.z, hkv = blockIdx.y, j0 = blockIdx.x * BC;
    const int group = hq / hk;
    const Seq s = seq_of(b, batch, sq, sk, cu_q, cu_k);
    const int kslot = LAYOUT == 2 ? s.lk : sk;
    if (j0 >= kslot) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int nk = max(0, min(BC, s.lk - j0));
    load_tile(Ks, k, BC, s.kb + (long long)j0 * s.rs, s.rs, nk, hk, hkv);
    load_tile(Vs, v, BC, s.kb + (long long)j0 * s.rs, s.rs, nk, hk, hkv);

    float adk[DP / 8][4], adv[DP / 8][4];
#pragma unroll
    for (int nb = 0; nb < DP / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) { adk[nb][e] = 0.0f; adv[nb][e] = 0.0f; }
    const int kj0 = j0 + warp * 16 + g, kj1 = kj0 + 8; // this thread's two keys

    for (int hi = 0; hi < group; ++hi) {
        const int h = hkv * group + hi;
        for (int i0 = 0; i0 < s.lq; i0 += BR) {
            const int last = min(i0 + BR, s.lq) - 1;
            int lo_first, hi_first, lo_last, hi_last;
            key_range(s, i0, &lo_first, &hi_first);
            key_range(s, last, &lo_last, &hi_last);
            if (nk == 0 || hi_last <= j0 || lo_first >= j0 + nk) continue;
            const int nq = last - i0 + 1;
            __syncthreads(); // the previous tile's readers are done
            load_tile(Qs, q, BR, s.qb + (long long)i0 * s.rs, s.rs, nq, hq, h);
            load_tile(dOs, d_o, BR, s.qb + (long long)i0 * s.rs, s.rs, nq, hq, h);
            for (int r = threadIdx.x; r < BR; r += blockDim.x) {
                const bool ok = r < nq;
                const long long row = s.qb + (long long)(i0 + r) * s.rs;
                const long long li = LAYOUT == 2 ? (long long)h * tq + s.qb + i0 + r : ((long long)b * hq + h) * sq + i0 + r;
                lse_s[r] = ok ? lse[li] : 0.0f;
                del_s[r] = ok ? delta[row * hq + h] : 0.0f;
            }
            __syncthreads();
            float st[BR / 8][4], dpt[BR / 8][4];
#pragma unroll
            for (int nb = 0; nb < BR / 8; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) { st[nb][e] = 0.0f; dpt[nb][e] = 0.0f; }
            warp_mm<BR / 8, DP, false, true>(st, Ks + warp * 16 * LDD, LDD, Qs, LDD);
            warp_mm<BR / 8, DP, false, true>(dpt, Vs + warp * 16 * LDD, LDD, dOs, LDD);
#pragma unroll
            for (int nb = 0; nb < BR / 8; ++nb) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int qi = nb * 8 + 2 * t + (e & 1);   // query within the tile
                    const int kj = e < 2 ? kj0 : kj1;           // key
                    const int i = i0 + qi;
                    int lo, hi_;
                    key_range(s, i, &lo, &hi_);
                    float p = 0.0f, pd = 0.0f, ds = 0.0f;
                    if (qi < nq && kj < s.lk && kj >= lo && kj < hi_) {
                        p = expf(st[nb][e] * scale - lse_s[qi]);
                        const float z = keep_factor(seed, offset, p_drop, b, h, hq, sq, sk, i, kj);
                        pd = p * z;
                        ds = p * (dpt[nb][e] * z - del_s[qi]);
                    }
                    const int kr = warp * 16 + g + (e < 2 ? 0 : 8);
                    PdT[kr * LDP + qi] = from_f32<T>(pd);
                    dST[kr * LDP + qi] = from_f32<T>(ds);
                }
            }
            __syncthreads();
            warp_mm<DP / 8, BR, false, false>(adv, PdT + warp * 16 * LDP, LDP, dOs, LDD);
            warp_mm<DP / 8, BR, false, false>(adk, dST + warp * 16 * LDP, LDP, Qs, LDD);
            // dQ rows warp*16.. of this tile: dS (queries x keys) = dST^T, times K.
            float adq[DP / 8][4];
#pragma unroll
            for (int nb = 0; nb < DP / 8; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) adq[nb][e] = 0.0f;
            warp_mm<DP / 8, BC, true, false>(adq, dST + warp * 16, LDP, Ks, LDD);
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int qi = warp * 16 + g + half * 8;
                if (qi >= nq) continue;
                const long long row = s.qb + (long long)(i0 + qi) * s.rs;
                float* dqr = dq_acc + (row * hq + h) * D;
#pragma unroll
                for (int nb = 0; nb < DP / 8; ++nb) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int c = nb * 8 + 2 * t + e;
                        if (c < D) atomic_add_f32(dqr + c, scale * adq[nb][half * 2 + e]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int kj = half ? kj1 : kj0;
        if (kj >= kslot) continue;
        const long long row = s.kb + (long long)kj * s.rs;
        T* dkr = dk + (row * hk + hkv) * D;
        T* dvr = dv + (row * hk + hkv) * D;
        const bool ok = kj < s.lk;
#pragma unroll
        for (int nb = 0; nb < DP / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = nb * 8 + 2 * t + e;
                if (c < D) {
                    dkr[c] = from_f32<T>(ok ? scale * adk[nb][half * 2 + e] : 0.0f);
                    dvr[c] = from_f32<T>(ok ? adv[nb][half * 2 + e] : 0.0f);
                }
            }
        }
    }
}

// dq = dq_acc in T.
extern "C" __global__ void attn_dq_convert(const float* __restrict__ acc, T* __restrict__ dq, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dq[i] = from_f32<T>(acc[i]);
}

extern "C" __global__ void fill_f32(float* __restrict__ p, long long n, float v) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        p[i] = v;
}
