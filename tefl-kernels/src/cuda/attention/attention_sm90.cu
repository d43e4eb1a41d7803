// Flash attention forward for Hopper (sm_90a): the tensor memory accelerator loads Q once and
// K / V tiles into a ring of shared-memory stages, warpgroup MMAs (wgmma) compute the scores
// from shared memory and P·V with the probabilities straight from registers.
//
// Persistent CTAs (one per SM) claim work items of 128 query rows of one head from a counter.
// Warpgroup 0 is the producer (one warp: lane 0 claims items and issues the copies; the other
// warps leave with their registers given back), warpgroups 1 and 2 are consumers of 64 query
// rows each. Per key tile of BC (128; 64 at head dim 256): S = Q·Kᵀ (wgmma m64nBCk16, both
// operands K-major in shared memory), the mask, the online softmax on the S registers, then
// O += P·V (wgmma with A = P in registers: the accumulator pairs of two n8 blocks are exactly
// A's fragment of one k16 step; B = V, MN-major: V's rows are keys with the head dim
// contiguous). A tile's softmax overlaps the previous tile's P·V, and the consumers take turns
// issuing MMAs. Full and empty mbarriers per stage and operand hand tiles between the producer
// and the consumers.
//
// Shared memory is the copy engine's 128-byte swizzled layout: a tile of rows x D is D / 64
// boxes of rows x 128 bytes (Q: 128 rows; K and V: BC). K-major descriptors (Q, K) step 32
// bytes per k16 inside a box and to the next box every 64 elements, stride 1024 (8 rows); V's
// MN-major descriptor steps 16 rows (2048 bytes) per k16, leading offset one box (the next 64
// head-dim columns).
//
// Ragged sequences (the thd layout, padding masks): the maps address token rows (thd) or
// positions (padding), so a tile that runs past its sequence's end holds the next sequence's or
// padding rows rather than the copy engine's zeros. Rows past the queries are computed and
// not stored; keys past the sequence are masked, and the last key tile's V rows past it are
// zeroed before P·V (P's exact zeros times a NaN there would be NaN).
//
// The same source, built with DQ_PASS, is the deterministic backward's dQ pass
// (attn_bwd_dq_sm90, head dims 64 and 128): the same CTAs, producer and work items, with dO's
// tile loaded beside Q's; per key tile S = Q·Kᵀ and dP = dO·Vᵀ (both from shared memory),
// P = exp2(scale2 S - lse2) under the mask, dS = P ∘ (dP - delta), and dQ += dS·K with dS from
// registers and K MN-major (as P·V reads V): each query row's dQ is summed in key order in
// one CTA's registers, the same bits every run, and written once (times the softmax scale).
// A tile's dQ product is issued with the next tile's scores, dP behind them.
//
// Defines: those of the attention sources (T, D, LAYOUT, CAUSAL, BOTTOM_RIGHT, PADDING,
// WIN_LEFT, WIN_RIGHT, DROPOUT; the host only picks this kernel for no dropout, D 64, 128 or
// 256 (the dQ pass: 64 or 128), 16-bit T), T_F16 (T is f16, else bf16), STAGES (K and V
// stages), HEAD_GROUP (heads per scheduling group, heavy_first), DQ_PASS (0: the forward,
// attn_fwd_sm90; 1: the dQ pass).

#define BM 128
// Keys per tile: 128, or 64 at head dim 256, where the output accumulator alone takes 128
// registers a thread (and a K / V tile of 128 rows would leave shared memory for one stage),
// and in the dQ pass, whose S, dP and dQ accumulators at 128 keys would take 192 of the 168
// registers ptxas allocates a thread of a 384-thread launch (it spilled 320 bytes).
#if D == 256 || DQ_PASS
#define BC 64
#else
#define BC 128
#endif
#define CONSUMERS 2
#define DBOX (D / 64)
#define Q_BOX (BM * 128)          // a box of Q: BM rows x 128 bytes
#define KV_BOX (BC * 128)         // a box of K or V: BC rows x 128 bytes
#define Q_TILE (DBOX * Q_BOX)
#define KV_TILE (DBOX * KV_BOX)
#define NEG_INF (-__int_as_float(0x7f800000))
#define RAGGED (PADDING || LAYOUT == 2)
#if T_F16
#define T_PTX "f16"
#else
#define T_PTX "bf16"
#endif

static_assert(D == 64 || D == 128 || D == 256, "the Hopper attention forward takes head dims 64, 128 and 256");
static_assert(!DQ_PASS || D <= 128, "the Hopper dQ pass takes head dims 64 and 128");

#if DQ_PASS
// The dQ pass's one parameter (the host's DqParams mirrors it).
struct AttnParams {
    TensorMap q, k, v, d_o;  // 4-D maps as the forward's
    unsigned long long dq, lse, delta;  // dQ (q's layout), lse and delta (f32) of the forward and the delta kernel
    unsigned long long counter;
    unsigned long long cu_q, cu_k;
    int batch, sq, sk, hq, hk, tiles_q, tq;
    float scale;
};
#else
// The launch's one parameter (the host's AttnParams mirrors it).
struct AttnParams {
    TensorMap q, k, v;  // 4-D maps of (D, heads, positions, batch), (D, heads, batch, positions) or (D, heads, tokens, 1)
    unsigned long long o, lse;
    unsigned long long counter;  // zeroed ints: work items claimed past the first grid, then a slot per CTA
    unsigned long long cu_q, cu_k;  // the cumulative sequence lengths (thd, padding masks), else 0
    int batch, sq, sk, hq, hk, tiles_q, tq;
    float scale;
};
#endif

// Rows [row0, row0 + the map's box rows) of head `head` of sequence b (row0: map_row's): DBOX
// boxes of `box` bytes into `dst`, on `bar`.
__device__ __forceinline__ void load_tile(u32 dst, const TensorMap* map, int head, int b, int row0, u32 box, u32 bar) {
#pragma unroll
    for (int j = 0; j < DBOX; ++j) {
#if LAYOUT == 1
        tma_load_4d(dst + j * box, map, 64 * j, head, b, row0, bar);
#else
        tma_load_4d(dst + j * box, map, 64 * j, head, row0, LAYOUT == 2 ? 0 : b, bar);
#endif
    }
}

// S(64 x BC) = Q_c(64 x D) · K(BC x D)ᵀ, both from shared memory (q: this consumer's rows), as
// one wgmma chain (hopper.h). SC_OFFS(ks) are step ks's offset operands (Q in boxes of Q_BOX
// bytes, K of KV_BOX).
#define SC_OFFS(ks) WG_KMAJOR_OFFS(ks, Q_BOX, KV_BOX)
#if BC == 128
#define SC_STEP0 WG_SS_STEP0("m64n128k16", WG_REGS_64, 64, 65)
#define SC_STEP(OA, OB) WG_SS_STEP("m64n128k16", WG_REGS_64, 64, 65, OA, OB)
#define SC_ACC WG_ACC64(s, 0)
#else
#define SC_STEP0 WG_SS_STEP0("m64n64k16", WG_REGS_32, 32, 33)
#define SC_STEP(OA, OB) WG_SS_STEP("m64n64k16", WG_REGS_32, 32, 33, OA, OB)
#define SC_ACC WG_ACC32(s, 0)
#endif
__device__ __forceinline__ void scores(float* s, u32 q, u32 k) {
    const unsigned long long da = wgmma_desc(q, 16, 1024), db = wgmma_desc(k, 16, 1024);
#if BC == 128 && D == 64
    asm volatile(WG_CHAIN_HEAD SC_STEP0 SC_STEP(66, 67) SC_STEP(68, 69) SC_STEP(70, 71) "}"
                 : SC_ACC
                 : "l"(da), "l"(db), SC_OFFS(1), SC_OFFS(2), SC_OFFS(3));
#elif BC == 128 && D == 128
    asm volatile(WG_CHAIN_HEAD SC_STEP0 SC_STEP(66, 67) SC_STEP(68, 69) SC_STEP(70, 71) SC_STEP(72, 73)
                     SC_STEP(74, 75) SC_STEP(76, 77) SC_STEP(78, 79) "}"
                 : SC_ACC
                 : "l"(da), "l"(db), SC_OFFS(1), SC_OFFS(2), SC_OFFS(3), SC_OFFS(4), SC_OFFS(5), SC_OFFS(6), SC_OFFS(7));
#elif D == 64
    asm volatile(WG_CHAIN_HEAD SC_STEP0 SC_STEP(34, 35) SC_STEP(36, 37) SC_STEP(38, 39) "}"
                 : SC_ACC
                 : "l"(da), "l"(db), SC_OFFS(1), SC_OFFS(2), SC_OFFS(3));
#elif D == 128
    asm volatile(WG_CHAIN_HEAD SC_STEP0 SC_STEP(34, 35) SC_STEP(36, 37) SC_STEP(38, 39) SC_STEP(40, 41)
                     SC_STEP(42, 43) SC_STEP(44, 45) SC_STEP(46, 47) "}"
                 : SC_ACC
                 : "l"(da), "l"(db), SC_OFFS(1), SC_OFFS(2), SC_OFFS(3), SC_OFFS(4), SC_OFFS(5), SC_OFFS(6), SC_OFFS(7));
#else
    asm volatile(WG_CHAIN_HEAD SC_STEP0 SC_STEP(34, 35) SC_STEP(36, 37) SC_STEP(38, 39) SC_STEP(40, 41)
                     SC_STEP(42, 43) SC_STEP(44, 45) SC_STEP(46, 47) SC_STEP(48, 49) SC_STEP(50, 51) SC_STEP(52, 53)
                         SC_STEP(54, 55) SC_STEP(56, 57) SC_STEP(58, 59) SC_STEP(60, 61) SC_STEP(62, 63) "}"
                 : SC_ACC
                 : "l"(da), "l"(db), SC_OFFS(1), SC_OFFS(2), SC_OFFS(3), SC_OFFS(4), SC_OFFS(5), SC_OFFS(6), SC_OFFS(7),
                   SC_OFFS(8), SC_OFFS(9), SC_OFFS(10), SC_OFFS(11), SC_OFFS(12), SC_OFFS(13), SC_OFFS(14),
                   SC_OFFS(15));
#endif
}

// O(64 x n) += P(64 x BC) · V(BC x n), n = min(D, 128) columns of O from `o` on, as one wgmma
// chain (hopper.h's WG_RS_CHAIN*): P from registers (k16 step kk in pa[kk]), V MN-major from
// shared memory at `v` (16 rows, 2048 bytes, a step).
__device__ __forceinline__ void pv_chain(float* o, const u32 (*pa)[4], u32 v) {
    const unsigned long long dv = wgmma_desc(v, KV_BOX, 1024);
#if BC == 128 && D >= 128
    asm volatile(WG_RS_CHAIN8_N128 : WG_ACC64(o, 0) : WG_RS_IN8(pa, dv));
#elif BC == 128
    asm volatile(WG_RS_CHAIN8_N64 : WG_ACC32(o, 0) : WG_RS_IN8(pa, dv));
#elif D >= 128
    asm volatile(WG_RS_CHAIN4_N128 : WG_ACC64(o, 0) : WG_RS_IN4(pa, dv));
#else
    asm volatile(WG_RS_CHAIN4_N64 : WG_ACC32(o, 0) : WG_RS_IN4(pa, dv));
#endif
}

// The two consumers take turns issuing their MMAs (named barriers 1 and 2, 256 threads: one
// consumer waits, the other arrives), so one's softmax runs while the other's products occupy
// the tensor cores rather than both alternating in step.
__device__ __forceinline__ void turn_wait(int c) { asm volatile("bar.sync %0, 256;" ::"r"(1 + c) : "memory"); }
__device__ __forceinline__ void turn_pass(int c) { asm volatile("bar.arrive %0, 256;" ::"r"(2 - c) : "memory"); }

// The work-item handoff (named barriers 3 and 4, the producer warp's 32 threads and the two
// consumers' 256): the producer writes the item and arrives on 3, the consumers wait on 3, read
// it and arrive on 4, which the producer waits on before it writes the next.
#define HANDOFF_THREADS (32 + 128 * CONSUMERS)
__device__ __forceinline__ void handoff_wait(int id) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(HANDOFF_THREADS) : "memory");
}
__device__ __forceinline__ void handoff_arrive(int id) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(HANDOFF_THREADS) : "memory");
}
// Named barrier 5 joins the two consumers once both have zeroed their halves of a ragged tile
// (as in the backward's source, where consumers_sync is another barrier).
__device__ __forceinline__ void zeroed_sync() { asm volatile("bar.sync 5, 256;" ::: "memory"); }

// O += P·V over the tile's BC keys, V's tile at `v`. Head dim 256 takes two chains of 128
// columns (accumulators 64.. are columns 128..; the second reads V's boxes 2 and 3).
__device__ __forceinline__ void pv(float* o, const u32 (*pa)[4], u32 v) {
    pv_chain(o, pa, v);
#if D == 256
    pv_chain(o + 64, pa, v + 2 * KV_BOX);
#endif
}

// The online softmax of one tile's scores (keys j0..): masks them (rows r0 and r0 + 8 of the
// thread), updates the running max m and sum l, leaves the probabilities exp2(scale2 s - mu)
// in sc and the factor the output accumulated so far is rescaled by in cf.
__device__ __forceinline__ void softmax(float* sc, float* m, float* l, float* cf, const WarpRows& rows, const Seq& s,
                                        int r0, int j0, int t, float scale2) {
    if (!rows.all_see(j0, BC)) {
        int lo[2], hi[2];
        key_range(s, r0, &lo[0], &hi[0]);
        key_range(s, r0 + 8, &lo[1], &hi[1]);
#pragma unroll
        for (int i = 0; i < BC / 2; ++i) {
            const int x = (i / 2) % 2, j = j0 + 8 * (i / 4) + 2 * t + i % 2;
            if (!(j >= lo[x] && j < hi[x])) sc[i] = NEG_INF;
        }
    }
    // Each row's maximum in four independent chains, joined at the end (a maximum is exact in
    // any order), and below its sum in two. With one chain each (BC / 4 dependent compares,
    // then BC / 4 dependent adds a row) the causal d128 forward took about 1% longer (H200,
    // 2026-12-04, the performance log; the four-chain maximum alone was no faster).
    static_assert(BC / 8 >= 4, "each of the four chains starts from one of a row's first four key pairs");
    float mx[2], mu[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        float c4[4];
#pragma unroll
        for (int k = 0; k < BC / 8; ++k) {
            const float pair = max_nan(sc[4 * k + 2 * x], sc[4 * k + 2 * x + 1]);
            c4[k % 4] = k < 4 ? pair : max_nan(c4[k % 4], pair);
        }
        mx[x] = max_nan(max_nan(c4[0], c4[1]), max_nan(c4[2], c4[3]));
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        mx[x] = max_nan(mx[x], shfl_xor(mx[x], 1));
        mx[x] = max_nan(mx[x], shfl_xor(mx[x], 2));
        const float mn = max_nan(m[x], mx[x]);
        mu[x] = mn == NEG_INF ? 0.0f : mn * scale2;
        cf[x] = fast_exp2(m[x] * scale2 - mu[x]);
        m[x] = mn;
    }
    // Each row's sum in two chains (alternate groups of four keys), added at the end.
    float sum2[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
    for (int i = 0; i < BC / 2; ++i) {
        const int x = (i / 2) % 2;
        sc[i] = fast_exp2(fmaf(sc[i], scale2, -mu[x]));
        sum2[x][(i / 4) % 2] += sc[i];
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) l[x] = l[x] * cf[x] + (sum2[x][0] + sum2[x][1]);
}

// The probabilities as wgmma's A fragments: accumulator pairs 8 kk + 2 r (r = 0..3) of two n8
// blocks are register r of k16 step kk.
__device__ __forceinline__ void pack_p(u32 (*pa)[4], const float* sc) {
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) pa[kk][r] = pack2_f32<T>(sc[8 * kk + 2 * r], sc[8 * kk + 2 * r + 1]);
}

// Work item w (of nq query tiles x hq heads x batch), in heavy_first's order over HEAD_GROUP
// heads (the CTAs running at once share few heads' K and V, which stay in L2): rank 0 is the
// last query tile, which sees the most keys under causal masks. With its sequence and the keys
// [blo, bhi) its rows see; the producer and the consumers both decode items with it.
struct Work {
    int b, h, q0, blo, bhi;
    Seq s;
};
__device__ __forceinline__ Work work_item(const AttnParams& p, int w) {
    Work k;
    int rank, row;
    heavy_first(w, p.tiles_q, p.hq * p.batch, HEAD_GROUP, &rank, &row);
    k.q0 = (p.tiles_q - 1 - rank) * BM;
    k.h = row % p.hq;
    k.b = row / p.hq;
    k.s = seq_of(k.b, p.batch, p.sq, p.sk, reinterpret_cast<const i32*>(p.cu_q), reinterpret_cast<const i32*>(p.cu_k));
    tile_keys(k.s, k.q0, BM, &k.blo, &k.bhi);
    return k;
}

// Shared memory from `base` (1024-aligned): Q's tile (the dQ pass: then dO's), STAGES K tiles,
// STAGES V tiles, the barriers (Q and dO share Q_FULL / Q_EMPTY).
#define QD_TILES (DQ_PASS ? 2 : 1)
#define DO_S (base + Q_TILE)
#define K_S(st) (base + QD_TILES * Q_TILE + (st) * KV_TILE)
#define V_S(st) (base + QD_TILES * Q_TILE + (STAGES + (st)) * KV_TILE)
#define BARS (base + QD_TILES * Q_TILE + 2 * STAGES * KV_TILE)
#define Q_FULL BARS
#define Q_EMPTY (BARS + 8u)
#define K_FULL(st) (BARS + 8u * (2 + (st)))
#define V_FULL(st) (BARS + 8u * (2 + STAGES + (st)))
#define K_EMPTY(st) (BARS + 8u * (2 + 2 * STAGES + (st)))
#define V_EMPTY(st) (BARS + 8u * (2 + 3 * STAGES + (st)))

#if DQ_PASS
// The dQ pass's probabilities of one tile's scores (keys j0..; rows r0 and r0 + 8 of the
// thread): exp2(scale2 s - lse2) inside the mask, 0 outside it. A tile whose rows see every
// key takes a branch with no mask arithmetic (as one select a score, its bounds and compares
// ran in every tile).
__device__ __forceinline__ void probs(float* sc, const float* lse2, const WarpRows& rows, const Seq& s, int r0, int j0,
                                      int t, float scale2) {
    if (rows.all_see(j0, BC)) {
#pragma unroll
        for (int i = 0; i < BC / 2; ++i) sc[i] = fast_exp2(fmaf(sc[i], scale2, -lse2[(i / 2) % 2]));
        return;
    }
    int lo[2], hi[2];
    key_range(s, r0, &lo[0], &hi[0]);
    key_range(s, r0 + 8, &lo[1], &hi[1]);
#pragma unroll
    for (int i = 0; i < BC / 2; ++i) {
        const int x = (i / 2) % 2, j = j0 + 8 * (i / 4) + 2 * t + i % 2;
        sc[i] = j >= lo[x] && j < hi[x] ? fast_exp2(fmaf(sc[i], scale2, -lse2[x])) : 0.0f;
    }
}

// dS = P ∘ (dP - delta) (dp in place), as wgmma's A fragments.
__device__ __forceinline__ void grad_scores(u32 (*da)[4], float* dp, const float* sc, const float* dl) {
#pragma unroll
    for (int i = 0; i < BC / 2; ++i) dp[i] = sc[i] * (dp[i] - dl[(i / 2) % 2]);
    pack_p(da, dp);
}

// One tile's K and V rows past the sequence's keys (a ragged sequence's last tile, whose rows
// there hold the next sequence's or padding rows), zeroed by the two consumers, half each,
// before either multiplies them: dP's columns there meet P's exact zeros, and dS's exact zeros
// meet K's rows.
__device__ __forceinline__ void zero_kv_tail(u32 k, u32 v, const Seq& s, int j0, int c, int tid) {
#if RAGGED
    if (j0 + BC > s.lk) {
        zero_rows(k, DBOX, BC, s.lk - j0, 128 * c + tid, 256);
        zero_rows(v, DBOX, BC, s.lk - j0, 128 * c + tid, 256);
        fence_async_shared();
        zeroed_sync();
    }
#endif
}

// Key tile `cur` (keys j0..) in its stage: K and V loaded, and a ragged sequence's rows past
// its keys zeroed.
__device__ __forceinline__ void wait_kv(u32 base, int cur, const Seq& s, int j0, int c, int tid) {
    const int st = cur % STAGES;
    mbar_wait(K_FULL(st), (cur / STAGES) & 1);
    mbar_wait(V_FULL(st), (cur / STAGES) & 1);
    zero_kv_tail(K_S(st), V_S(st), s, j0, c, tid);
}

// The end of a key tile (stage st) once its P is formed: dP waited for, the V stage released
// (and, after the item's last tile, Q's and dO's), dS formed as wgmma's A fragments.
__device__ __forceinline__ void tile_done(u32 base, u32 (*da)[4], float* dp, const float* sc, const float* dl, int st,
                                          bool last, int lane) {
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < BC / 2; ++i) acc_fence(dp[i]);
    __syncwarp();
    if (lane == 0) {
        mbar_arrive(V_EMPTY(st));
        if (last) mbar_arrive(Q_EMPTY);
    }
    grad_scores(da, dp, sc, dl);
}

// The dQ pass's consumer warpgroups: per work item, the thread's two rows' lse and delta, then
// per key tile n (stage st): [dQ += dS(n-1)·K(n-1), S(n) = Q·K(n)ᵀ] in one turn, the K stage of
// n - 1 released once its dQ product is done, then dP(n) = dO·V(n)ᵀ in a second turn while
// P(n) is formed, dS(n) once dP is done. Accumulators live at any time: dQ, S and dP (or dQ,
// dS's fragments and S), 128 registers at head dim 128.
__device__ __forceinline__ void dq_consumers(const AttnParams& p, u32 base, volatile int* slot, int total, int c) {
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const float scale2 = p.scale * 1.4426950408889634f;
    const u32 q_c = base + c * 64 * 128, do_c = DO_S + c * 64 * 128;  // this consumer's rows
    const float* lse = reinterpret_cast<const float*>(p.lse);
    const float* delta = reinterpret_cast<const float*>(p.delta);
    if (c == 1) turn_pass(c);
    int kv = 0, qn = 0;
    for (;;) {
        handoff_wait(3);
        const int w = *slot;
        if (w >= total) break;
        handoff_arrive(4);
        const Work k = work_item(p, w);
        const Seq& s = k.s;
        const int blo = k.blo, bhi = k.bhi;
        const int wr = k.q0 + 64 * c + 16 * warp;  // the warp's first query row; the thread has wr + g, +8
        float dq[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; ++i) dq[i] = 0.0f;
        // The thread's rows' lse (times log2 e) and delta; 0 past the sequence (no key there).
        float lse2[2], dl[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const int r = wr + g + 8 * x;
            const bool in = r < s.lq;
            lse2[x] = in ? lse[lse_index(s, k.b, k.h, p.hq, p.sq, p.tq, r)] * 1.4426950408889634f : 0.0f;
            dl[x] = in ? delta[(s.qb + (long long)r * s.rs) * p.hq + k.h] : 0.0f;
        }
        if (blo < bhi) {
            const WarpRows rows(s, wr, 16);
            mbar_wait(Q_FULL, qn & 1);
            const int tiles = (bhi - blo + BC - 1) / BC;
            float sc[BC / 2], dp[BC / 2];
            u32 da[BC / 16][4];
#pragma unroll
            for (int i = 0; i < BC / 2; ++i) sc[i] = dp[i] = 0.0f;
            // Tile 0: S and dP in one turn.
            {
                const int st = kv % STAGES;
                wait_kv(base, kv, s, blo, c, tid);
                turn_wait(c);
                wgmma_fence();
                scores(sc, q_c, K_S(st));
                wgmma_commit();
                scores(dp, do_c, V_S(st));
                wgmma_commit();
                turn_pass(c);
                wgmma_wait<1>();
#pragma unroll
                for (int i = 0; i < BC / 2; ++i) acc_fence(sc[i]);
                probs(sc, lse2, rows, s, wr + g, blo, t, scale2);
                tile_done(base, da, dp, sc, dl, st, tiles == 1, lane);
            }
            for (int n = 1; n < tiles; ++n) {
                const int cur = kv + n, st = cur % STAGES, prev = (cur - 1) % STAGES;
                const int j0 = blo + n * BC;
                wait_kv(base, cur, s, j0, c, tid);
                turn_wait(c);
                wgmma_fence();
                pv(dq, da, K_S(prev));
                wgmma_commit();
                scores(sc, q_c, K_S(st));
                wgmma_commit();
                turn_pass(c);
                wgmma_wait<0>();  // the previous tile's dQ product and S
#pragma unroll
                for (int i = 0; i < D / 2; ++i) acc_fence(dq[i]);
#pragma unroll
                for (int i = 0; i < BC / 2; ++i) acc_fence(sc[i]);
                __syncwarp();
                if (lane == 0) mbar_arrive(K_EMPTY(prev));
                turn_wait(c);
                wgmma_fence();
                scores(dp, do_c, V_S(st));
                wgmma_commit();
                turn_pass(c);
                probs(sc, lse2, rows, s, wr + g, j0, t, scale2);
                tile_done(base, da, dp, sc, dl, st, n == tiles - 1, lane);
            }
            const int last = (kv + tiles - 1) % STAGES;
            turn_wait(c);
            wgmma_fence();
            pv(dq, da, K_S(last));
            wgmma_commit();
            turn_pass(c);
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < D / 2; ++i) acc_fence(dq[i]);
            __syncwarp();
            if (lane == 0) mbar_arrive(K_EMPTY(last));
            kv += tiles;
            ++qn;
        }
        // Rows the sequence owns in dq: its queries (thd), else all sq positions (the padding
        // rows as zeros: they see no key, and their dO may hold anything).
        const int owned = LAYOUT == 2 ? s.lq : p.sq;
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const int r = wr + g + 8 * x;
            if (r >= owned) continue;
            const bool in = r < s.lq;
            T* out = reinterpret_cast<T*>(p.dq) + ((s.qb + (long long)r * s.rs) * p.hq + k.h) * D + 2 * t;
#pragma unroll
            for (int j = 0; j < D / 8; ++j)
                *reinterpret_cast<u32*>(out + 8 * j) =
                    in ? pack2_f32<T>(dq[4 * j + 2 * x] * p.scale, dq[4 * j + 2 * x + 1] * p.scale) : 0u;
        }
    }
    if (c == 0) turn_wait(c);
}
#endif

extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1)
#if DQ_PASS
    attn_bwd_dq_sm90(const __grid_constant__ AttnParams p) {
#else
    attn_fwd_sm90(const __grid_constant__ AttnParams p) {
#endif
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const u32 q_s = base;
    const int warpgroup = warpgroup_index();
    if (threadIdx.x == 0) {
        mbar_init(Q_FULL, 1);
        mbar_init(Q_EMPTY, CONSUMERS * 4);
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(K_FULL(st), 1);
            mbar_init(V_FULL(st), 1);
            mbar_init(K_EMPTY(st), CONSUMERS * 4);
            mbar_init(V_EMPTY(st), CONSUMERS * 4);
        }
        mbar_init_fence();
    }
    __syncthreads();
    const int total = p.tiles_q * p.hq * p.batch;
    // The work item the producer hands to the consumers: this CTA's slot after the counter (in
    // global memory, ordered by the handoff barriers like shared memory would be; a shared
    // slot would be as correct, but compute-sanitizer's racecheck does not follow barrier
    // arrivals and reports it).
    volatile int* const slot = reinterpret_cast<volatile int*>(p.counter) + 1 + blockIdx.x;

    // Persistent, scheduled dynamically: CTA i starts with item i, then takes the next unclaimed
    // one from the counter (grid + atomicAdd), so CTAs that drew light causal items take more.
    // The producer hands each item to the consumers (handoff_*; an item >= total ends them)
    // before loading it; the K / V ring and the Q buffer run on across items (kv
    // counts key tiles, qn items with keys), so the next item's Q and first tiles load while
    // the consumers finish this one.
    if (warpgroup == 0) {
        regs_release<24>();
        if (threadIdx.x >= 32) return;  // the producer warp stays; lane 0 issues the copies
        const int lane = threadIdx.x;
        int kv = 0, qn = 0;
        int w = blockIdx.x;
        for (int n_items = 0;; ++n_items) {
            if (n_items > 0) handoff_wait(4);
            if (lane == 0) *slot = w;
            __threadfence_block();
            __syncwarp();
            handoff_arrive(3);
            if (w >= total) break;
            int next = 0;
            if (lane == 0) {
                const Work k = work_item(p, w);
                const int hkv = k.h / (p.hq / p.hk), blo = k.blo, bhi = k.bhi;
                if (blo < bhi) {
                    mbar_wait(Q_EMPTY, (qn & 1) ^ 1);
                    mbar_arrive_expect(Q_FULL, QD_TILES * Q_TILE);
                    load_tile(q_s, &p.q, k.h, k.b, map_row(k.s.qb, k.q0), Q_BOX, Q_FULL);
#if DQ_PASS
                    load_tile(DO_S, &p.d_o, k.h, k.b, map_row(k.s.qb, k.q0), Q_BOX, Q_FULL);
#endif
                    ++qn;
                    for (int j0 = blo; j0 < bhi; j0 += BC, ++kv) {
                        const int st = kv % STAGES;
                        const u32 phase = (kv / STAGES) & 1;
                        mbar_wait(K_EMPTY(st), phase ^ 1);
                        mbar_arrive_expect(K_FULL(st), KV_TILE);
                        load_tile(K_S(st), &p.k, hkv, k.b, map_row(k.s.kb, j0), KV_BOX, K_FULL(st));
                        mbar_wait(V_EMPTY(st), phase ^ 1);
                        mbar_arrive_expect(V_FULL(st), KV_TILE);
                        load_tile(V_S(st), &p.v, hkv, k.b, map_row(k.s.kb, j0), KV_BOX, V_FULL(st));
                    }
                }
                next = gridDim.x + atomicAdd(reinterpret_cast<int*>(p.counter), 1);
            }
            w = __shfl_sync(FULL_LANE_MASK, next, 0);
        }
        return;
    }

    regs_claim<240>();
#if DQ_PASS
    dq_consumers(p, base, slot, total, warpgroup - 1);
#else
    const int c = warpgroup - 1;
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    // m: the running max of the raw scores (scale > 0); probabilities are exp2(scale2 s - mu),
    // mu = scale2 m, or 0 while a row has seen no key.
    const float scale2 = p.scale * 1.4426950408889634f;
    const u32 q_c = q_s + c * 64 * 128;  // this consumer's 64 rows of every Q box
    // Turns (turn_wait / turn_pass): consumer 1 gives consumer 0 the first, each passes the
    // turn after every batch of MMAs it issues, and consumer 0 takes consumer 1's last pass at
    // the end, so both barriers end balanced.
    if (c == 1) turn_pass(c);
    int kv = 0, qn = 0;
    for (;;) {
        handoff_wait(3);
        const int w = *slot;
        if (w >= total) break;  // (the last handoff: the producer waits for no reply)
        handoff_arrive(4);
        const Work k = work_item(p, w);
        const Seq& s = k.s;
        const int blo = k.blo, bhi = k.bhi;
        const int wr = k.q0 + 64 * c + 16 * warp;  // the warp's first query row; the thread has wr + g, +8
        // Accumulator i of a 64 x N wgmma tile is row 16 warp + g + 8 ((i / 2) % 2), column
        // 8 (i / 4) + 2 t + i % 2: the thread's two rows x = (i / 2) % 2.
        float o[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
        float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
        if (blo < bhi) {
            const WarpRows rows(s, wr, 16);
            mbar_wait(Q_FULL, qn & 1);
            const int tiles = (bhi - blo + BC - 1) / BC;
            float sc[BC / 2];
            u32 pa[BC / 16][4];
            float cf[2];
            // Tile 0's scores and probabilities; then per tile n: its scores are issued, P(n - 1)·V
            // behind them, and its softmax runs while the tensor cores do that product. Q is
            // given back once the last scores are done.
#pragma unroll
            for (int i = 0; i < BC / 2; ++i) sc[i] = 0.0f;
            mbar_wait(K_FULL(kv % STAGES), (kv / STAGES) & 1);
            turn_wait(c);
            wgmma_fence();
            scores(sc, q_c, K_S(kv % STAGES));
            wgmma_commit();
            turn_pass(c);
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < BC / 2; ++i) acc_fence(sc[i]);
            __syncwarp();
            if (lane == 0) {
                mbar_arrive(K_EMPTY(kv % STAGES));
                if (tiles == 1) mbar_arrive(Q_EMPTY);
            }
            softmax(sc, m, l, cf, rows, s, wr + g, blo, t, scale2);
            pack_p(pa, sc);
            for (int n = 1; n < tiles; ++n) {
                const int cur = kv + n, st = cur % STAGES, prev = (cur - 1) % STAGES;
                mbar_wait(K_FULL(st), (cur / STAGES) & 1);
                mbar_wait(V_FULL(prev), ((cur - 1) / STAGES) & 1);
                turn_wait(c);
                wgmma_fence();
                scores(sc, q_c, K_S(st));
                wgmma_commit();
                pv(o, pa, V_S(prev));
                wgmma_commit();
                turn_pass(c);
                wgmma_wait<1>();  // the scores are done (P·V may still run)
#pragma unroll
                for (int i = 0; i < BC / 2; ++i) acc_fence(sc[i]);
                __syncwarp();
                if (lane == 0) {
                    mbar_arrive(K_EMPTY(st));
                    if (n == tiles - 1) mbar_arrive(Q_EMPTY);
                }
                softmax(sc, m, l, cf, rows, s, wr + g, blo + n * BC, t, scale2);
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < D / 2; ++i) acc_fence(o[i]);
                __syncwarp();
                if (lane == 0) mbar_arrive(V_EMPTY(prev));
#pragma unroll
                for (int i = 0; i < D / 2; ++i) o[i] *= cf[(i / 2) % 2];
                pack_p(pa, sc);
            }
            const int last = kv + tiles - 1;
            mbar_wait(V_FULL(last % STAGES), (last / STAGES) & 1);
#if RAGGED
            // The last tile's V rows past the sequence's keys (the only tile that reaches them),
            // zeroed by the two consumers, half each, before either multiplies it.
            const int j_last = blo + (tiles - 1) * BC;
            if (j_last + BC > s.lk) {
                zero_rows(V_S(last % STAGES), DBOX, BC, s.lk - j_last, 128 * c + tid, 256);
                fence_async_shared();
                zeroed_sync();
            }
#endif
#pragma unroll
            for (int i = 0; i < D / 2; ++i) acc_fence(o[i]);
            turn_wait(c);
            wgmma_fence();
            pv(o, pa, V_S(last % STAGES));
            wgmma_commit();
            turn_pass(c);
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < D / 2; ++i) acc_fence(o[i]);
            __syncwarp();
            if (lane == 0) mbar_arrive(V_EMPTY(last % STAGES));
            kv += tiles;
            ++qn;
        }
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            l[x] += shfl_xor(l[x], 1);
            l[x] += shfl_xor(l[x], 2);
        }
        // Rows the sequence owns in o and lse: its queries (thd), else all sq positions (the
        // padding rows as zeros, their lse -inf: they see no key).
        const int slot = LAYOUT == 2 ? s.lq : p.sq;
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const int r = wr + g + 8 * x;
            if (r >= slot) continue;
            const float inv = recip_or_zero(l[x]);  // NaN rows stay NaN
            T* out = reinterpret_cast<T*>(p.o) + ((s.qb + (long long)r * s.rs) * p.hq + k.h) * D + 2 * t;
#pragma unroll
            for (int j = 0; j < D / 8; ++j)
                *reinterpret_cast<u32*>(out + 8 * j) = pack2_f32<T>(o[4 * j + 2 * x] * inv, o[4 * j + 2 * x + 1] * inv);
            if (t == 0)
                reinterpret_cast<float*>(p.lse)[lse_index(s, k.b, k.h, p.hq, p.sq, p.tq, r)] =
                    !(l[x] <= 0.0f) ? m[x] * p.scale + logf(l[x]) : NEG_INF;
        }
    }
    if (c == 0) turn_wait(c);
#endif
}
