// Flash attention, forward and backward: tiles of queries x FWD_BC keys in shared memory, online
// softmax, no sq x sk buffer. f16/bf16 tiles multiply on tensor cores (mma.sync m16n8k16,
// operands through ldmatrix, f32 accumulation); f32 tiles use the same fragment layout with
// scalar FMAs, so everything after the products is shared. Tiles arrive by cp.async; the
// forward double-buffers K and V.
//
// Kernels: attn_fwd (FWD_BR queries per block, 4 warps of FWD_MT m-tiles), attn_bwd_delta
// (Σ dO·O; zeroes the f32 dQ accumulator), attn_bwd_dkdv (one block per DKV_KB keys and kv head:
// dK, dV over the group's query heads, a warp per 32 keys and accumulator, and each tile's dQ
// share added to the accumulator by atomics), attn_bwd_dq_out (dQ = scale * accumulator);
// for a deterministic dQ, attn_bwd_dq (dQ per query tile in one pass over its keys) instead of
// the accumulator.
// Warps take 32 rows on tensor cores so that every operand fragment read from shared memory
// feeds two MMAs.
//
// Defines: T (element type), HALF (T is 16-bit), D (head dim), DP (D rounded up to 16), FWD_BR (64 or 128),
// FWD_BC (keys per forward tile: 64, or 32 for f32 head dims over 128),
// LAYOUT (0 bshd, 1 sbhd, 2 thd), CAUSAL, BOTTOM_RIGHT, PADDING (lengths from cu_seqlens),
// WIN_LEFT / WIN_RIGHT (-1 = unbounded), DROPOUT, FWD_MIN_BLOCKS (forward blocks per SM the
// register budget is cut for), DKV_KB (keys per dK/dV block, 64 or 128), DKV_BR (queries per
// dK/dV tile, 64, or 32 for f32 head dims over 128), DKV_MT (m-tiles of keys per dK/dV warp: 2,
// or 1 for head dims over 128), ATTN_FWD, ATTN_DKDV, ATTN_DQ (compile attn_fwd, attn_bwd_dkdv,
// attn_bwd_dq; a build with none of them compiles the small kernels: attn_bwd_delta,
// attn_bwd_dq_out, fill_f32).
//
// Rows: query position i of sequence b is token row  qbase(b) + i * rstride, its (row, head)
// element at ((row * H) + h) * D (H = hq for q, o, hk for k, v).

// The MMA fragment layout (g = lane / 4, t = lane % 4) is that of a 32-lane warp.
static_assert(WARP_SIZE == 32, "the tensor-core attention kernels need 32-lane warps");
// A forward block is 4 warps.
#define FWD_THREADS (4 * WARP_SIZE)
#define PAD (16 / (int)sizeof(T))
#define LDD (DP + PAD)
#define LDP (FWD_BC + PAD)
#define NEG_INF (-__int_as_float(0x7f800000))
#define ATTN_AUX (!ATTN_FWD && !ATTN_DKDV && !ATTN_DQ)

// acc[MT][NB][4] += A(16 MT x KD) * B(KD x 8 NB) for one warp, fragments in the MMA layout:
// m-tile mt holds rows 16 mt.. of A. A(r, k) = As[r * lda + k] (or As[k * lda + r] when AT);
// B(k, c) = Bs[c * ldb + k] when BT (keys-major, the K tile for S = Q K^T), else
// Bs[k * ldb + c]. Every B fragment serves the MT m-tiles, so shared-memory traffic per MMA
// falls as MT grows. E is T, a template parameter so that the branch of the other width is
// discarded. NB is even.
template <int MT, int NB, int KD, bool AT, bool BT, typename E>
__device__ __forceinline__ void warp_mm(float (*acc)[NB][4], const E* As, int lda, const E* Bs, int ldb) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    if constexpr (sizeof(E) == 2) {
        const int mi = lane / 8, r = lane % 8;
        // This lane's row address in each operand; every step adds a constant byte offset.
        const u32 a0 = smem_addr(AT ? As + ((mi / 2) * 8 + r) * lda + (mi % 2) * 8 : As + ((mi % 2) * 8 + r) * lda + (mi / 2) * 8);
        const u32 b0 = smem_addr(BT ? Bs + ((mi / 2) * 8 + r) * ldb + (mi % 2) * 8 : Bs + ((mi % 2) * 8 + r) * ldb + (mi / 2) * 8);
#pragma unroll
        for (int k0 = 0; k0 < KD; k0 += 16) {
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if constexpr (!AT) ldsm_x4(a[mt], a0 + 2 * (mt * 16 * lda + k0));
                else ldsm_x4_t(a[mt], a0 + 2 * (k0 * lda + mt * 16));
            }
#pragma unroll
            for (int nb = 0; nb < NB; nb += 2) {
                u32 b[4];
                if constexpr (BT) ldsm_x4(b, b0 + 2 * (nb * 8 * ldb + k0));
                else ldsm_x4_t(b, b0 + 2 * (k0 * ldb + nb * 8));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816(acc[mt][nb], a[mt], b, (E*)nullptr);
                    mma_16816(acc[mt][nb + 1], a[mt], b + 2, (E*)nullptr);
                }
            }
        }
    } else {
        for (int k = 0; k < KD; ++k) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int r0 = mt * 16 + g, r1 = r0 + 8;
                const float a0 = to_f32(AT ? As[k * lda + r0] : As[r0 * lda + k]);
                const float a1 = to_f32(AT ? As[k * lda + r1] : As[r1 * lda + k]);
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    const int c = nb * 8 + 2 * t;
                    const float b0 = to_f32(BT ? Bs[c * ldb + k] : Bs[k * ldb + c]);
                    const float b1 = to_f32(BT ? Bs[(c + 1) * ldb + k] : Bs[k * ldb + c + 1]);
                    acc[mt][nb][0] += a0 * b0;
                    acc[mt][nb][1] += a0 * b1;
                    acc[mt][nb][2] += a1 * b0;
                    acc[mt][nb][3] += a1 * b1;
                }
            }
        }
    }
}

// acc[MT][NB][4] += A(16 MT x KD) * B(KD x 8 NB) with A held by the warp in accumulator
// layout (c[MT][KD / 8][4], as a previous warp_mm left it) and B(k, c) = Bs[k * ldb + c]: the
// C fragments of two n8 blocks are exactly the A fragment of one k16 step, so probabilities
// and dS never go through shared memory. 16-bit E only (HALF builds).
template <int MT, int NB, int KD, typename E>
__device__ __forceinline__ void warp_mm_regA(float (*acc)[NB][4], const float (*c)[KD / 8][4], const E* Bs, int ldb) {
    const int lane = threadIdx.x % WARP_SIZE, mi = lane / 8, r = lane % 8;
    const u32 b0 = smem_addr(Bs + ((mi % 2) * 8 + r) * ldb + (mi / 2) * 8);
#pragma unroll
    for (int kk = 0; kk < KD / 16; ++kk) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const float (*cm)[4] = c[mt];
            a[mt][0] = pack2_f32<E>(cm[2 * kk][0], cm[2 * kk][1]);
            a[mt][1] = pack2_f32<E>(cm[2 * kk][2], cm[2 * kk][3]);
            a[mt][2] = pack2_f32<E>(cm[2 * kk + 1][0], cm[2 * kk + 1][1]);
            a[mt][3] = pack2_f32<E>(cm[2 * kk + 1][2], cm[2 * kk + 1][3]);
        }
#pragma unroll
        for (int nb = 0; nb < NB; nb += 2) {
            u32 b[4];
            ldsm_x4_t(b, b0 + 2 * (kk * 16 * ldb + nb * 8));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_16816(acc[mt][nb], a[mt], b, (E*)nullptr);
                mma_16816(acc[mt][nb + 1], a[mt], b + 2, (E*)nullptr);
            }
        }
    }
}

template <int MT, int NB> __device__ __forceinline__ void zero_acc(float (*acc)[NB][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) acc[mt][nb][0] = acc[mt][nb][1] = acc[mt][nb][2] = acc[mt][nb][3] = 0.0f;
}

// acc[MT][NB][4] += C(16 MT x KD) * B(KD x 8 NB) with C in accumulator layout (probabilities
// or dS) and B(k, c) = Bs[k * ldb + c]. 16-bit builds pack C straight into A fragments; f32
// builds write it to the warp's own rows of `stage` (row stride lds; unused otherwise) first.
template <int MT, int NB, int KD>
__device__ __forceinline__ void warp_mm_c(float (*acc)[NB][4], const float (*c)[KD / 8][4], T* stage, int lds,
                                          const T* Bs, int ldb) {
#if HALF
    (void)stage;
    (void)lds;
    warp_mm_regA<MT, NB, KD>(acc, c, Bs, ldb);
#else
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nb = 0; nb < KD / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                stage[(mt * 16 + 8 * (e / 2) + g) * lds + nb * 8 + 2 * t + (e & 1)] = from_f32<T>(c[mt][nb][e]);
    __syncwarp();
    warp_mm<MT, NB, KD, false, false>(acc, stage, lds, Bs, ldb);
#endif
}

// Writes the thread's accumulator row x (x = 2 mt + half: row 8 x + g of the warp's tile)
// times `mult` to out[0, D), or zeros when the row is not `valid` (past the sequence).
template <int MT>
__device__ __forceinline__ void store_row(T* out, const float (*acc)[DP / 8][4], int x, bool valid, float mult) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int nb = 0; nb < DP / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int c = nb * 8 + 2 * t + e;
            if (c < D) out[c] = from_f32<T>(valid ? acc[x / 2][nb][2 * (x % 2) + e] * mult : 0.0f);
        }
}

// Starts loading NROWS rows of D elements (row r at token row base_row + r * rstride, head
// `head` of `heads`) into an LDD-strided tile, zero-filling invalid rows and columns D..DP;
// the block has THREADS threads. Vector rows go by cp.async (the caller commits and waits),
// others by plain stores. When THREADS is a multiple of the 16-byte chunks per row, each
// thread keeps one column and one source pointer and steps it by whole rows (unrolled: the
// index arithmetic of a generic loop costs more than the copies).
template <int NROWS, int THREADS>
__device__ __forceinline__ void load_tile(T* dst, const T* src, long long base_row, int rstride, int valid, int heads,
                                          int head) {
    constexpr int VE = 16 / (int)sizeof(T), CPR = DP / VE;
    if constexpr (D % VE == 0 && THREADS % CPR == 0) {
        constexpr int RSTEP = THREADS / CPR; // rows per pass of the block
        const int r0 = threadIdx.x / CPR, c = (threadIdx.x % CPR) * VE;
        const long long step = (long long)RSTEP * rstride * heads * D;
        const T* sp = src + ((base_row + (long long)r0 * rstride) * heads + head) * D + c;
#pragma unroll
        for (int i = 0; i < (NROWS + RSTEP - 1) / RSTEP; ++i) {
            const int r = r0 + i * RSTEP;
            if (NROWS % RSTEP != 0 && r >= NROWS) break;
            const bool ok = r < valid && c < D;
            cp_async16(dst + r * LDD + c, ok ? sp + i * step : src, ok);
        }
    } else if constexpr (D % VE == 0) {
        for (int idx = threadIdx.x; idx < NROWS * CPR; idx += THREADS) {
            const int r = idx / CPR, c = (idx % CPR) * VE;
            const bool ok = r < valid && c < D;
            const T* sp = ok ? src + ((base_row + (long long)r * rstride) * heads + head) * D + c : src;
            cp_async16(dst + r * LDD + c, sp, ok);
        }
    } else {
        const T zero = from_f32<T>(0.0f);
        for (int idx = threadIdx.x; idx < NROWS * DP; idx += THREADS) {
            const int r = idx / DP, c = idx % DP;
            dst[r * LDD + c] = (r < valid && c < D) ? src[((base_row + (long long)r * rstride) * heads + head) * D + c] : zero;
        }
    }
}

// Starts loading key tile j0 (ROWS keys) of kv head hkv (K, then V; rows from bhi on are
// zero) into stage `stage` of the two-stage buffer KV ([K tile | V tile] per stage).
template <int ROWS>
__device__ __forceinline__ void issue_kv(T* KV, int stage, const T* k, const T* v, const Seq& s, int j0, int bhi, int hk,
                                         int hkv) {
    const int nvalid = min(ROWS, bhi - j0);
    T* Kd = KV + stage * 2 * ROWS * LDD;
    load_tile<ROWS, FWD_THREADS>(Kd, k, s.kb + (long long)j0 * s.rs, s.rs, nvalid, hk, hkv);
    load_tile<ROWS, FWD_THREADS>(Kd + ROWS * LDD, v, s.kb + (long long)j0 * s.rs, s.rs, nvalid, hk, hkv);
    cp_async_commit();
}

// Before computing key tile j0 (in `stage`): starts the next tile into the other stage, waits
// for this one and for every warp. Returns the stage's K tile (its V tile follows it).
template <int ROWS>
__device__ __forceinline__ const T* ready_kv(T* KV, int stage, const T* k, const T* v, const Seq& s, int j0, int bhi,
                                             int hk, int hkv) {
    if (j0 + ROWS < bhi) {
        issue_kv<ROWS>(KV, stage ^ 1, k, v, s, j0 + ROWS, bhi, hk, hkv);
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
    return KV + stage * 2 * ROWS * LDD;
}

// A compile-time flag for a generic lambda: one body, a masked and an unmasked instance.
template <bool B> struct Flag {
    static constexpr bool on = B;
};

// Calls f(mt, nb, e, x, j, visible) for each score element a thread holds of its warp's
// query rows [wr, wr + 16 MT) and keys [j0, j0 + 8 NB): element e of n8 block nb of m-tile mt,
// row x = 2 mt + e / 2 (query wr + 8 x + g), key j. `visible` is a constant true when MASKED
// is false (a tile every row sees whole), else whether row x sees key j.
template <int MT, int NB, bool MASKED, typename F>
__device__ __forceinline__ void for_each_score(const Seq& s, int wr, int j0, F&& f) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    int lo[2 * MT], hi[2 * MT]; // (recomputed per masked tile, the few on an edge: registers are short)
#pragma unroll
    for (int x = 0; x < 2 * MT; ++x)
        if (MASKED) key_range(s, wr + x * 8 + g, &lo[x], &hi[x]);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int x = 2 * mt + e / 2, j = j0 + nb * 8 + 2 * t + (e & 1);
                f(mt, nb, e, x, j, !MASKED || (j >= lo[x] && j < hi[x]));
            }
}

#if ATTN_FWD
// Forward: 4 warps, each FWD_MT m-tiles of 16 query rows (2 on tensor cores for head dims up to
// 128: every K and V fragment serves 32 rows); thread row x (x = 2 mt + half) is query
// wr + 16 mt + 8 half + g.
#define FWD_MT (FWD_BR / 64)

extern "C" __global__ void __launch_bounds__(FWD_THREADS, FWD_MIN_BLOCKS) attn_fwd(const T* __restrict__ q, const T* __restrict__ k,
                                                               const T* __restrict__ v, T* __restrict__ o,
                                                               float* __restrict__ lse, const i32* __restrict__ cu_q,
                                                               const i32* __restrict__ cu_k, int batch, int sq, int sk,
                                                               int hq, int hk, int tq, float scale, float p_drop,
                                                               u64 seed, u64 offset) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* Qs = (T*)smem_raw;
    T* KV = Qs + FWD_BR * LDD;       // two stages of [K tile | V tile]
    T* Ps = KV + 4 * FWD_BC * LDD;       // f32 builds: per-warp [16 FWD_MT][LDP]
    __shared__ int s_lo, s_hi;

    // Later query tiles see more keys under causal masks: run them first (a shorter tail).
    const int b = blockIdx.z, h = blockIdx.y, q0 = (gridDim.x - 1 - blockIdx.x) * FWD_BR;
    const int hkv = h / (hq / hk);
    const Seq s = seq_of(b, batch, sq, sk, cu_q, cu_k);
    const int slot = LAYOUT == 2 ? s.lq : sq; // rows this sequence owns in o / lse
    if (q0 >= slot) return;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    const int wr = q0 + warp * 16 * FWD_MT; // the warp's first query row
    const WarpRows rows(s, wr, 16 * FWD_MT);
    if (threadIdx.x == 0) tile_keys(s, q0, FWD_BR, &s_lo, &s_hi);
    load_tile<FWD_BR, FWD_THREADS>(Qs, q, s.qb + (long long)q0 * s.rs, s.rs, min(FWD_BR, s.lq - q0), hq, h);
    cp_async_commit();
    __syncthreads();
    const int blo = s_lo, bhi = s_hi;
    if (blo < bhi) issue_kv<FWD_BC>(KV, 0, k, v, s, blo, bhi, hk, hkv);

    float acc[FWD_MT][DP / 8][4];
    zero_acc<FWD_MT, DP / 8>(acc);
    // m is the running max of the raw scores (scale > 0, so the max of the scaled ones is
    // scale m); probabilities are exp2(scale2 s - mu) by one FFMA and ex2, mu = scale2 m (or 0
    // while a row has seen no key: exp2(-inf) = 0).
    const float scale2 = scale * 1.4426950408889634f;
    float m[2 * FWD_MT], l[2 * FWD_MT];
#pragma unroll
    for (int x = 0; x < 2 * FWD_MT; ++x) { m[x] = NEG_INF; l[x] = 0.0f; }
    int stage = 0;
    for (int j0 = blo; j0 < bhi; j0 += FWD_BC, stage ^= 1) {
        const T* Ks = ready_kv<FWD_BC>(KV, stage, k, v, s, j0, bhi, hk, hkv);
        const T* Vs = Ks + FWD_BC * LDD;
        float sc[FWD_MT][FWD_BC / 8][4];
        zero_acc<FWD_MT, FWD_BC / 8>(sc);
        warp_mm<FWD_MT, FWD_BC / 8, DP, false, true>(sc, Qs + warp * 16 * FWD_MT * LDD, LDD, Ks, LDD);
        float mx[2 * FWD_MT];
#pragma unroll
        for (int x = 0; x < 2 * FWD_MT; ++x) mx[x] = NEG_INF;
        auto row_max = [&](int mt, int nb, int e, int x, int, bool visible) {
            if (!visible) sc[mt][nb][e] = NEG_INF;
            mx[x] = max_nan(mx[x], sc[mt][nb][e]);
        };
        if (rows.all_see(j0, FWD_BC)) for_each_score<FWD_MT, FWD_BC / 8, false>(s, wr, j0, row_max);
        else for_each_score<FWD_MT, FWD_BC / 8, true>(s, wr, j0, row_max);
        float mu[2 * FWD_MT];
#pragma unroll
        for (int x = 0; x < 2 * FWD_MT; ++x) {
            mx[x] = max_nan(mx[x], shfl_xor(mx[x], 1));
            mx[x] = max_nan(mx[x], shfl_xor(mx[x], 2));
            const float mn = max_nan(m[x], mx[x]);
            mu[x] = mn == NEG_INF ? 0.0f : mn * scale2;
            const float c = fast_exp2(m[x] * scale2 - mu[x]);
            m[x] = mn;
            l[x] *= c;
#pragma unroll
            for (int nb = 0; nb < DP / 8; ++nb) {
                acc[x / 2][nb][2 * (x % 2)] *= c;
                acc[x / 2][nb][2 * (x % 2) + 1] *= c;
            }
        }
#pragma unroll
        for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
            for (int nb = 0; nb < FWD_BC / 8; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int x = 2 * mt + e / 2;
                    const float p = fast_exp2(fmaf(sc[mt][nb][e], scale2, -mu[x]));
                    l[x] += p;
#if DROPOUT
                    const int j = j0 + nb * 8 + 2 * t + (e & 1);
                    sc[mt][nb][e] = p == 0.0f ? 0.0f : p * keep_factor(seed, offset, p_drop, b, h, hq, sq, sk, wr + x * 8 + g, j);
#else
                    sc[mt][nb][e] = p;
#endif
                }
        warp_mm_c<FWD_MT, DP / 8, FWD_BC>(acc, sc, Ps + warp * 16 * FWD_MT * LDP, LDP, Vs, LDD);
        __syncthreads(); // every warp is done with this stage before it is refilled
    }
    cp_async_wait<0>(); // (no key tile: the query tile's copy was never waited for)
#pragma unroll
    for (int x = 0; x < 2 * FWD_MT; ++x) {
        l[x] += shfl_xor(l[x], 1);
        l[x] += shfl_xor(l[x], 2);
    }
#pragma unroll
    for (int x = 0; x < 2 * FWD_MT; ++x) {
        const float lx = l[x];
        const int r = wr + x * 8 + g;
        if (r >= slot) continue;
        const float inv = recip_or_zero(lx); // NaN rows stay NaN
        store_row<FWD_MT>(o + ((s.qb + (long long)r * s.rs) * hq + h) * D, acc, x, r < s.lq, inv);
        if (t == 0)
            lse[lse_index(s, b, h, hq, sq, tq, r)] = (r < s.lq && !(lx <= 0.0f)) ? m[x] * scale + logf(lx) : NEG_INF;
    }
}

#endif // ATTN_FWD

#if ATTN_DQ
// The deterministic dQ (a backward call with `deterministic` set): one block per DQ_BR queries of
// a head and sequence, 4 warps of 16 rows, looping over the key tiles the rows see as the
// forward does (K and V double-buffered), each tile recomputing S = Q K^T and dP = dO V^T,
// then dS = P (dP Z - delta) with P = exp2(scale2 S - lse2), and dQ += dS K in registers.
// Every dQ element is one thread's sum over the keys in key order, so it is the same bits on
// every run (the dK/dV kernel then skips its dQ atomics).
#define DQ_BR 64

extern "C" __global__ void __launch_bounds__(FWD_THREADS) attn_bwd_dq(const T* __restrict__ q, const T* __restrict__ k,
                                                               const T* __restrict__ v, const T* __restrict__ d_o,
                                                               const float* __restrict__ lse,
                                                               const float* __restrict__ delta, T* __restrict__ dq,
                                                               const i32* __restrict__ cu_q, const i32* __restrict__ cu_k,
                                                               int batch, int sq, int sk, int hq, int hk, int tq,
                                                               float scale, float p_drop, u64 seed, u64 offset) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* Qs = (T*)smem_raw;
    T* dOs = Qs + DQ_BR * LDD;
    T* KV = dOs + DQ_BR * LDD;     // two stages of [K tile | V tile]
    T* Ps = KV + 4 * FWD_BC * LDD; // f32 builds: per-warp [16][LDP]
    __shared__ int s_lo, s_hi;

    // Later query tiles see more keys under causal masks: run them first (a shorter tail).
    const int b = blockIdx.z, h = blockIdx.y, q0 = (gridDim.x - 1 - blockIdx.x) * DQ_BR;
    const int hkv = h / (hq / hk);
    const Seq s = seq_of(b, batch, sq, sk, cu_q, cu_k);
    const int slot = LAYOUT == 2 ? s.lq : sq; // rows this sequence owns in dq
    if (q0 >= slot) return;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4;
    const int wr = q0 + warp * 16; // the warp's first query row
    const WarpRows rows(s, wr, 16);
    if (threadIdx.x == 0) tile_keys(s, q0, DQ_BR, &s_lo, &s_hi);
    const long long base = s.qb + (long long)q0 * s.rs;
    load_tile<DQ_BR, FWD_THREADS>(Qs, q, base, s.rs, min(DQ_BR, s.lq - q0), hq, h);
    load_tile<DQ_BR, FWD_THREADS>(dOs, d_o, base, s.rs, min(DQ_BR, s.lq - q0), hq, h);
    cp_async_commit();
    __syncthreads();
    const int blo = s_lo, bhi = s_hi;
    if (blo < bhi) issue_kv<FWD_BC>(KV, 0, k, v, s, blo, bhi, hk, hkv);

    // The thread's two rows (x: query wr + 8 x + g): lse (times log2 e) and delta.
    float l2[2], dl[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        const int r = wr + 8 * x + g;
        const bool valid = r < s.lq;
        l2[x] = valid ? lse[lse_index(s, b, h, hq, sq, tq, r)] * 1.4426950408889634f : 0.0f;
        dl[x] = valid ? delta[(s.qb + (long long)r * s.rs) * hq + h] : 0.0f;
    }
    float acc[1][DP / 8][4];
    zero_acc<1, DP / 8>(acc);
    const float scale2 = scale * 1.4426950408889634f;
    int stage = 0;
    for (int j0 = blo; j0 < bhi; j0 += FWD_BC, stage ^= 1) {
        const T* Ks = ready_kv<FWD_BC>(KV, stage, k, v, s, j0, bhi, hk, hkv);
        const T* Vs = Ks + FWD_BC * LDD;
        float sc[1][FWD_BC / 8][4], dp[1][FWD_BC / 8][4];
        zero_acc<1, FWD_BC / 8>(sc);
        zero_acc<1, FWD_BC / 8>(dp);
        warp_mm<1, FWD_BC / 8, DP, false, true>(sc, Qs + warp * 16 * LDD, LDD, Ks, LDD);
        warp_mm<1, FWD_BC / 8, DP, false, true>(dp, dOs + warp * 16 * LDD, LDD, Vs, LDD);
        // dS in the place of S; P is zero wherever the mask or the sequence ends.
        auto ds = [&](int mt, int nb, int e, int x, int j, bool visible) {
            const float p = visible ? fast_exp2(fmaf(sc[mt][nb][e], scale2, -l2[x])) : 0.0f;
            float dpz = dp[mt][nb][e];
#if DROPOUT
            if (p != 0.0f) dpz *= keep_factor(seed, offset, p_drop, b, h, hq, sq, sk, wr + x * 8 + g, j);
#endif
            sc[mt][nb][e] = p * (dpz - dl[x]);
        };
        if (rows.all_see(j0, FWD_BC)) for_each_score<1, FWD_BC / 8, false>(s, wr, j0, ds);
        else for_each_score<1, FWD_BC / 8, true>(s, wr, j0, ds);
        warp_mm_c<1, DP / 8, FWD_BC>(acc, sc, Ps + warp * 16 * LDP, LDP, Ks, LDD);
        __syncthreads(); // every warp is done with this stage before it is refilled
    }
    cp_async_wait<0>(); // (no key tile: the query tiles' copy was never waited for)
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        const int r = wr + x * 8 + g;
        if (r >= slot) continue;
        store_row<1>(dq + ((s.qb + (long long)r * s.rs) * hq + h) * D, acc, x, r < s.lq, scale);
    }
}
#endif // ATTN_DQ

#if ATTN_AUX
// delta[row * hq + h] = Σ_d dO·O (f32), one warp per (token row, head), which also zeroes that
// row of the dQ accumulator (when there is one: not for attn_bwd_dq).
extern "C" __global__ void attn_bwd_delta(const T* __restrict__ o, const T* __restrict__ d_o, float* __restrict__ delta,
                                          float* __restrict__ dq_acc, long long rows_heads) {
    const long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (w >= rows_heads) return;
    // Rows of D elements start 16-byte aligned when D is a multiple of 8: 8 per lane and step.
    constexpr int V = D % 8 == 0 ? 8 : 1;
    float acc = 0.0f;
    for (int c = lane * V; c < D; c += WARP_SIZE * V) {
        float a[V], b[V], z[V];
        load_n<T, V>(o + w * D + c, a);
        load_n<T, V>(d_o + w * D + c, b);
#pragma unroll
        for (int i = 0; i < V; ++i) {
            acc += a[i] * b[i];
            z[i] = 0.0f;
        }
        if (dq_acc) store_n<float, V>(dq_acc + w * D + c, z);
    }
    acc = warp_sum(acc);
    if (lane == 0) delta[w] = acc;
}

// dq = scale * dq_acc, element by element (8 at a time when D, hence n, is a multiple of 8).
extern "C" __global__ void attn_bwd_dq_out(const float* __restrict__ dq_acc, T* __restrict__ dq, long long n, float scale) {
    constexpr int V = D % 8 == 0 ? 8 : 1;
    for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * V; i < n; i += (long long)gridDim.x * blockDim.x * V) {
        float x[V];
        load_n<float, V>(dq_acc + i, x);
#pragma unroll
        for (int j = 0; j < V; ++j) x[j] *= scale;
        store_n<T, V>(dq + i, x);
    }
}
#endif // ATTN_AUX

#if ATTN_DKDV
// dq_acc[query rows [i0, i0 + nq) of head h] += dS K for one dK/dV tile: dS^T (keys x queries,
// row stride LDS) and the block's DKV_KB keys of K are in shared memory. With G = DKV_BR / 16
// row groups, warp w takes queries 16 (w % G).. and every (DKV_WARPS / G)-th DQ_COLS-column
// chunk from chunk w / G, so that few accumulator registers are live beside dK / dV.
#define LDS (DKV_BR + PAD)
#define KW (16 * DKV_MT)                 // keys per dK/dV warp
#define DKV_WARPS (2 * DKV_KB / KW)
#define DQ_COLS (DP % 64 == 0 ? 64 : DP % 32 == 0 ? 32 : DP)
__device__ __forceinline__ void add_dq_share(float* dq_acc, const T* DSs, const T* Ks, const Seq& s, int i0, int nq,
                                             int h, int hq) {
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    constexpr int ROW_GROUPS = DKV_BR / 16, COL_GROUPS = DKV_WARPS / ROW_GROUPS;
    const int qr = 16 * (warp % ROW_GROUPS);
#pragma unroll 1
    for (int c0 = (warp / ROW_GROUPS) * DQ_COLS; c0 < DP; c0 += COL_GROUPS * DQ_COLS) {
        float part[1][DQ_COLS / 8][4];
        zero_acc<1, DQ_COLS / 8>(part);
        warp_mm<1, DQ_COLS / 8, DKV_KB, true, false>(part, DSs + qr, LDS, Ks + c0, LDD);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = qr + 8 * half + g;
            if (r >= nq) continue;
            float* row = dq_acc + ((s.qb + (long long)(i0 + r) * s.rs) * hq + h) * D;
#pragma unroll
            for (int nb = 0; nb < DQ_COLS / 8; ++nb) {
                const int c = c0 + nb * 8 + 2 * t;
                const float a = part[0][nb][2 * half], b = part[0][nb][2 * half + 1];
                if (D % 2 == 0) {
                    if (c < D) atomic_add2_f32(row + c, a, b);
                } else {
                    if (c < D) atomic_add_f32(row + c, a);
                    if (c + 1 < D) atomic_add_f32(row + c + 1, b);
                }
            }
        }
    }
}

// One block per (DKV_KB keys, kv head, sequence): dK and dV in registers over every query head
// of the group and every query tile that sees the keys. Each warp owns KW keys and one of the
// two accumulators (DKV_MT m-tiles: with 2, every Q and dO fragment serves 32 keys and the 128
// accumulator registers of head dims up to 128 fit; larger head dims take 1): warps
// 0 .. DKV_KB / KW - 1 (keys 0..KW-1, KW..2 KW-1, ..) compute
// P^T = exp(scale K Q^T - lse) and dV += P^T dO; the next as many compute dP^T = V dO^T, take
// P^T from their partner through shared memory, and dK += dS^T Q with dS = P (dP - delta).
// dS^T then goes to shared memory (in the handover's place), and the warps add the tile's dS K
// to the f32 dQ accumulator (add_dq_share: 16 queries and a share of the columns each).
// DKV_KB (from the host) is 128 for 16-bit tiles of head dim up to 128, else 64: larger key
// blocks halve the query-tile traffic and the dQ atomics. With 16-bit tiles the query tiles
// (Q, dO, lse, delta) are double-buffered: the next visible tile loads while this one is
// computed (f32 tiles need the shared memory for P and dS and load one tile at a time).
#define QSTAGES (HALF ? 2 : 1)
extern "C" __global__ void __launch_bounds__(WARP_SIZE * DKV_WARPS) attn_bwd_dkdv(const T* __restrict__ q, const T* __restrict__ k,
                                                             const T* __restrict__ v, const T* __restrict__ d_o,
                                                             const float* __restrict__ lse,
                                                             const float* __restrict__ delta, T* __restrict__ dk,
                                                             T* __restrict__ dv, float* __restrict__ dq_acc,
                                                             const i32* __restrict__ cu_q,
                                                             const i32* __restrict__ cu_k, int batch, int sq, int sk,
                                                             int hq, int hk, int tq, float scale, float p_drop,
                                                             u64 seed, u64 offset) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* Ks = (T*)smem_raw;
    T* Vs = Ks + DKV_KB * LDD;
    T* QO = Vs + DKV_KB * LDD;           // QSTAGES stages of [Q tile | dO tile]
    float* rowv = (float*)(QO + QSTAGES * 2 * DKV_BR * LDD); // QSTAGES stages of [lse | delta]
    // Per KW keys, KW rows of LDS elements: first P^T handed over (each lane's DKV_MT x DKV_BR / 8
    // fragments, packed in 16-bit builds, 16 bytes at a time with the 32 lanes interleaved),
    // then (16-bit builds) those keys' rows of dS^T, [keys][LDS].
    T* PX = (T*)(rowv + QSTAGES * 2 * DKV_BR);
#if HALF
    const T* DSs = PX;
#else
    T* Own = PX + DKV_KB * LDS; // f32 builds: [DKV_KB][LDS] P^T (dV warps' rows) or dS^T (dK warps')
    const T* DSs = Own;
#endif

    const int b = blockIdx.z, hkv = blockIdx.y, j0 = blockIdx.x * DKV_KB;
    const int group = hq / hk;
    const Seq s = seq_of(b, batch, sq, sk, cu_q, cu_k);
    const int kslot = LAYOUT == 2 ? s.lk : sk;
    if (j0 >= kslot) return;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    const int kq = warp % (DKV_KB / KW);        // keys KW kq.. of the block
    const bool dk_warp = warp >= DKV_KB / KW;   // else the dV warp of those keys
    const int kw = j0 + KW * kq; // the warp's first key; thread key x (x = 2 mt + half) is kw + 8 x + g
    const int nk = max(0, min(DKV_KB, s.lk - j0));
    load_tile<DKV_KB, WARP_SIZE * DKV_WARPS>(Ks, k, s.kb + (long long)j0 * s.rs, s.rs, nk, hk, hkv);
    load_tile<DKV_KB, WARP_SIZE * DKV_WARPS>(Vs, v, s.kb + (long long)j0 * s.rs, s.rs, nk, hk, hkv);
    cp_async_commit();

    float acc[DKV_MT][DP / 8][4];
    zero_acc<DKV_MT, DP / 8>(acc);
    const float scale2 = scale * 1.4426950408889634f;
    // The first product's A operand: this warp's KW rows of K (for S^T) or V (for dP^T).
    const T* KVw = (dk_warp ? Vs : Ks) + KW * kq * LDD;
    uint4* px = (uint4*)(PX + KW * kq * LDS) + lane;

    // Query tile i0 sees some key of this block (the bounds are monotone in the query).
    auto visible = [&](int i0) {
        const int last = min(i0 + DKV_BR, s.lq) - 1;
        int lo_first, hi_first, lo_last, hi_last;
        key_range(s, i0, &lo_first, &hi_first);
        key_range(s, last, &lo_last, &hi_last);
        return nk > 0 && hi_last > j0 && lo_first < j0 + nk;
    };
    // The next visible (head in group, query tile) after (hi, i0); hi == group when none.
    auto advance = [&](int* hi, int* i0) {
        do {
            *i0 += DKV_BR;
            if (*i0 >= s.lq) { *i0 = 0; ++*hi; }
        } while (*hi < group && !visible(*i0));
    };
    auto issue = [&](int hi, int i0, int stage) {
        const int h = hkv * group + hi;
        const int nq = min(DKV_BR, s.lq - i0);
        T* Qd = QO + stage * 2 * DKV_BR * LDD;
        load_tile<DKV_BR, WARP_SIZE * DKV_WARPS>(Qd, q, s.qb + (long long)i0 * s.rs, s.rs, nq, hq, h);
        load_tile<DKV_BR, WARP_SIZE * DKV_WARPS>(Qd + DKV_BR * LDD, d_o, s.qb + (long long)i0 * s.rs, s.rs, nq, hq, h);
        float* rv = rowv + stage * 2 * DKV_BR;
        for (int r = threadIdx.x; r < DKV_BR; r += blockDim.x) {
            const bool ok = r < nq;
            const long long row = s.qb + (long long)(i0 + r) * s.rs;
            cp_async4(rv + r, ok ? lse + lse_index(s, b, h, hq, sq, tq, i0 + r) : lse, ok);
            cp_async4(rv + DKV_BR + r, ok ? delta + row * hq + h : delta, ok);
        }
        cp_async_commit();
    };
    int hi = 0, i0 = 0;
    if (!visible(0)) advance(&hi, &i0);
    if (hi < group) issue(hi, i0, 0);
    int stage = 0;
    while (hi < group) {
        int nhi = hi, ni0 = i0;
        advance(&nhi, &ni0);
#if QSTAGES == 2
        if (nhi < group) {
            issue(nhi, ni0, stage ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
#else
        cp_async_wait<0>();
#endif
        __syncthreads();
        const int h = hkv * group + hi;
        const T* Qs = QO + stage * 2 * DKV_BR * LDD;
        const T* dOs = Qs + DKV_BR * LDD;
        const float* lse_s = rowv + stage * 2 * DKV_BR;
        const float* del_s = lse_s + DKV_BR;
        const int nq = min(i0 + DKV_BR, s.lq) - i0;

        // S^T (dV warps) or dP^T (dK warps): KW keys x DKV_BR queries.
        float sc[DKV_MT][DKV_BR / 8][4];
        zero_acc<DKV_MT, DKV_BR / 8>(sc);
        warp_mm<DKV_MT, DKV_BR / 8, DP, false, true>(sc, KVw, LDD, dk_warp ? dOs : Qs, LDD);
        if (!dk_warp) {
            // P^T = exp2(scale2 S^T - lse2), zero outside the mask. The tile needs no per-element
            // mask when its first query's hi and last query's lo admit all KW keys.
            int lo_first, hi_first, lo_last, hi_last;
            key_range(s, i0, &lo_first, &hi_first);
            key_range(s, i0 + nq - 1, &lo_last, &hi_last);
            (void)lo_first;
            (void)hi_last;
            auto probs = [&](auto masked) {
#pragma unroll
                for (int nb = 0; nb < DKV_BR / 8; ++nb) {
                    const float2 l2 = *(const float2*)(lse_s + nb * 8 + 2 * t);
#pragma unroll
                    for (int mt = 0; mt < DKV_MT; ++mt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int qi = nb * 8 + 2 * t + (e & 1), key = kw + 16 * mt + 8 * (e / 2) + g;
                            bool ok = true;
                            if (decltype(masked)::on) {
                                int lo, hi_;
                                key_range(s, i0 + qi, &lo, &hi_);
                                ok = qi < nq && key >= lo && key < hi_;
                            }
                            const float z = sc[mt][nb][e] * scale2 - (e & 1 ? l2.y : l2.x) * 1.4426950408889634f;
                            sc[mt][nb][e] = ok ? fast_exp2(z) : 0.0f;
                        }
                }
            };
            if (nq == DKV_BR && lo_last <= kw && hi_first >= kw + KW) probs(Flag<false>{});
            else probs(Flag<true>{});
            // Hand P^T to the dK warp of these keys, fragment by fragment.
#pragma unroll
            for (int mt = 0; mt < DKV_MT; ++mt)
#pragma unroll
                for (int nb = 0; nb < DKV_BR / 8; nb += (HALF ? 2 : 1)) {
#if HALF
                    const uint4 w = {pack2_f32<T>(sc[mt][nb][0], sc[mt][nb][1]), pack2_f32<T>(sc[mt][nb][2], sc[mt][nb][3]),
                                     pack2_f32<T>(sc[mt][nb + 1][0], sc[mt][nb + 1][1]),
                                     pack2_f32<T>(sc[mt][nb + 1][2], sc[mt][nb + 1][3])};
                    px[(mt * (DKV_BR / 8) + nb) / 2 * WARP_SIZE] = w;
#else
                    const uint4 w = {__float_as_uint(sc[mt][nb][0]), __float_as_uint(sc[mt][nb][1]),
                                     __float_as_uint(sc[mt][nb][2]), __float_as_uint(sc[mt][nb][3])};
                    px[(mt * (DKV_BR / 8) + nb) * WARP_SIZE] = w;
#endif
                }
#if DROPOUT
#pragma unroll
            for (int mt = 0; mt < DKV_MT; ++mt)
#pragma unroll
                for (int nb = 0; nb < DKV_BR / 8; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int qi = nb * 8 + 2 * t + (e & 1), key = kw + 16 * mt + 8 * (e / 2) + g;
                        if (sc[mt][nb][e] != 0.0f)
                            sc[mt][nb][e] *= keep_factor(seed, offset, p_drop, b, h, hq, sq, sk, i0 + qi, key);
                    }
#endif
        }
        __syncthreads(); // P^T handed over
        if (dk_warp) {
            // dS^T = P^T (dP^T Z - delta); P is zero wherever the mask or the sequence ends.
#pragma unroll
            for (int mt = 0; mt < DKV_MT; ++mt)
#pragma unroll
                for (int nb = 0; nb < DKV_BR / 8; nb += (HALF ? 2 : 1)) {
                    const uint4 w = px[(mt * (DKV_BR / 8) + nb) / (HALF ? 2 : 1) * WARP_SIZE];
                    const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                    for (int f = 0; f < (HALF ? 8 : 4); ++f) {
                        const int n = nb + f / 4, e = f % 4;
#if HALF
                        const float p = e % 2 ? hi_f32<T>(ws[f / 2]) : lo_f32<T>(ws[f / 2]);
#else
                        const float p = __uint_as_float(ws[f]);
#endif
                        const int qi = n * 8 + 2 * t + (e & 1);
                        float dpz = sc[mt][n][e];
#if DROPOUT
                        if (p != 0.0f)
                            dpz *= keep_factor(seed, offset, p_drop, b, h, hq, sq, sk, i0 + qi,
                                               kw + 16 * mt + 8 * (e / 2) + g);
#endif
                        sc[mt][n][e] = p * (dpz - del_s[qi]);
                    }
                }
#if HALF
            // dS^T into its keys' rows (once the warp has read its P^T: the rows overlap it).
            __syncwarp();
#pragma unroll
            for (int mt = 0; mt < DKV_MT; ++mt)
#pragma unroll
                for (int nb = 0; nb < DKV_BR / 8; ++nb)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh)
                        *(u32*)(PX + (KW * kq + 16 * mt + 8 * hh + g) * LDS + nb * 8 + 2 * t) =
                            pack2_f32<T>(sc[mt][nb][2 * hh], sc[mt][nb][2 * hh + 1]);
#endif
        }
        // dV += P^T dO (dV warps) or dK += dS^T Q (dK warps).
#if HALF
        warp_mm_c<DKV_MT, DP / 8, DKV_BR>(acc, sc, nullptr, 0, dk_warp ? Qs : dOs, LDD);
#else
        // f32: the dV warp stages P^T, then the dK warp dS^T, in the same rows of Own.
        for (int pass = 0; pass < 2; ++pass) {
            if (dk_warp == (pass == 1))
                warp_mm_c<DKV_MT, DP / 8, DKV_BR>(acc, sc, Own + KW * kq * LDS, LDS, dk_warp ? Qs : dOs, LDD);
            __syncthreads();
        }
#endif
#if HALF
        __syncthreads(); // dS^T is complete
#endif
        if (dq_acc) add_dq_share(dq_acc, DSs, Ks, s, i0, nq, h, hq); // (none: attn_bwd_dq's deterministic dQ)
        __syncthreads(); // every warp is done with this stage, P^T and dS^T before they are refilled
#if QSTAGES == 1
        if (nhi < group) issue(nhi, ni0, 0);
#endif
        hi = nhi;
        i0 = ni0;
        stage = (stage + 1) % QSTAGES;
    }
    cp_async_wait<0>(); // (nothing visible: the K/V copy was never waited for)
    T* out = dk_warp ? dk : dv;
    const float mult = dk_warp ? scale : 1.0f;
#pragma unroll
    for (int x = 0; x < 2 * DKV_MT; ++x) {
        const int key = kw + 8 * x + g;
        if (key >= kslot) continue;
        store_row<DKV_MT>(out + ((s.kb + (long long)key * s.rs) * hk + hkv) * D, acc, x, key < s.lk, mult);
    }
}
#endif // ATTN_DKDV

#if ATTN_AUX
extern "C" __global__ void fill_f32(float* __restrict__ p, long long n, float v) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        p[i] = v;
}

// The cumulative lengths of a thd call that tefl did not read on the host (the caller gave
// max_seqlen_q and max_seqlen_kv), made safe for the kernels: entry 0 is 0, every other entry
// cu[i] clamped to [0, total], then the running maximum, so that every sequence's rows lie in
// [0, total) and the sequences follow each other. Lengths the host check passes come out
// unchanged. Block 0 takes the queries' (cu_q into out_q), block 1, where the grid has it, the
// keys'; a block of 1024 threads (32 warps) takes n entries in passes of 1024.
extern "C" __global__ void __launch_bounds__(1024) attn_cu_clamp(const i32* __restrict__ cu_q, i32* __restrict__ out_q,
                                                                int total_q, const i32* __restrict__ cu_k,
                                                                i32* __restrict__ out_k, int total_k, int n) {
    __shared__ int warp_max[32];
    const i32* cu = blockIdx.x == 0 ? cu_q : cu_k;
    i32* out = blockIdx.x == 0 ? out_q : out_k;
    const int total = blockIdx.x == 0 ? total_q : total_k;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int carry = 0;
    for (int base = 0; base < n; base += 1024) {
        const int i = base + threadIdx.x;
        int x = i < n && i > 0 ? min(max(cu[i], 0), total) : 0;
        // The running maximum: within the warp, then over the warps' maxima, then the passes'.
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x = max(x, y);
        }
        if (lane == 31) warp_max[warp] = x;
        __syncthreads();
        if (warp == 0) {
            int w = warp_max[lane];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, w, o);
                if (lane >= o) w = max(w, y);
            }
            warp_max[lane] = w;
        }
        __syncthreads();
        if (warp > 0) x = max(x, warp_max[warp - 1]);
        x = max(x, carry);
        if (i < n) out[i] = x;
        carry = max(carry, warp_max[31]);
        __syncthreads();  // warp_max is rewritten by the next pass
    }
}

// One tensor's rows past the last sequence (attn_thd_tail).
struct TailFill {
    unsigned long long p;    // the tensor, as 16-bit units
    unsigned long long cu;   // attn_cu_clamp's lengths: cu[batch] is in [0, rows]
    long long rows, row_len; // rows a plane, 16-bit units a row
    int planes;              // planes of rows x row_len (o: 1; lse: one per head, f32 pairs)
    unsigned int pattern;    // its low half at even units, its high half at odd ones
};

// The launch's one parameter (the host's TailFills mirrors it): up to two tensors, the grid's
// y dimension saying how many.
struct TailFills {
    TailFill f[2];
    int batch;
};

// Rows [cu[batch], rows) of each plane of tensor blockIdx.y set to its pattern (0 for zeros,
// 0xff800000 for f32 -inf). Nothing to do (the usual packing) costs a launch.
extern "C" __global__ void attn_thd_tail(const __grid_constant__ TailFills fills) {
    const TailFill& f = fills.f[blockIdx.y];
    unsigned short* p = reinterpret_cast<unsigned short*>(f.p);
    const long long start = reinterpret_cast<const i32*>(f.cu)[fills.batch];
    const long long per_plane = (f.rows - start) * f.row_len;
    const long long n = per_plane * f.planes;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long plane = i / per_plane, j = i % per_plane;
        const long long at = (plane * f.rows + start) * f.row_len + j;
        p[at] = (unsigned short)(at % 2 ? f.pattern >> 16 : f.pattern & 0xffffu);
    }
}
#endif // ATTN_AUX
