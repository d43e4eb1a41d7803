// Flash attention backward for Hopper (sm_90a): dK and dV of a block of 128 keys in registers
// of two consumer warpgroups (64 keys each), the query tiles of every head of the kv head's
// group streamed through shared memory by the tensor memory accelerator, every product on
// warpgroup MMAs (wgmma), and each tile's dQ share added to an f32 accumulator by the copy
// engine's reduce-add (no per-element atomics).
//
// Warpgroup 0 is the producer: one thread loads a key block's K and V, then per query tile Q
// and dO (TMA) into a ring of STAGES stages; the rest of its warp stays for the work-item
// handoff. Its warp 1 is the dQ writer (head dims 64 and 128, write_dq), the other threads
// leave with their registers given back.
// Per query tile of 64 (BM) each consumer puts the tile's lse (times log2 e) and delta rows
// into its own shared row buffer (one value a thread, loaded from global memory a tile ahead:
// RowAhead; a handoff from the producer through the stage's mbarrier would be as correct, but
// compute-sanitizer's racecheck does not follow it) and computes, for its 64
// keys:
//   Sᵀ  = K_c · Qᵀ      (m64n64, both operands K-major in shared memory)
//   dPᵀ = V_c · dOᵀ     (the same)
//   Pᵀ  = exp2(scale2 Sᵀ - lse2) under the mask, dSᵀ = Pᵀ ∘ (dPᵀ - delta)
//   dV += Pᵀ · dO, dK += dSᵀ · Q  (A from registers: the accumulator pairs of two n8 blocks
//                                   are A's fragment of one k16 step; B MN-major; dV is issued
//                                   before dSᵀ is formed, dK after dQ, so that the dQ share's
//                                   trip to the copy engine and the next tile's first products
//                                   overlap it: the stage is released once dK is done)
//   dSᵀ to shared memory (16-bit, the 128-byte swizzled layout wgmma reads), then dQ = dS · K
//   over all 128 keys (both consumers' dSᵀ rows) with A = dS and B = K both MN-major from
//   shared memory. Head dim 128 splits dQ's columns between the consumers: each computes its
//   64 once both have written their dSᵀ rows (a barrier joins them every tile). Head dim 64
//   gives each tile's whole dQ (64 x 64) to one consumer, the tile's parity's (tile n: consumer
//   n % 2), which computes it a tile later, in tile n + 1 (three dSᵀ buffers keep tile n's
//   rows until then), after a barrier the other consumer only arrives at: the consumers take
//   the product and its hand-off in turns and add each tile's dQ once (split by keys instead,
//   both added all 64 columns, twice the reduce-add traffic; H200, 2026-11-29: 2.28 against
//   2.76 ms; in the tile itself, the owner waited there for the other, 2026-12-04: 1.92
//   against 1.85 ms).
//   The dQ goes to its consumer's buffer in shared memory, and the dQ writer warp hands it to
//   the copy engine as tensor reduce-adds into dq_acc (f32, q's layout); at head dim 256 one
//   thread of the consumer does.
//
// Ragged sequences (the thd layout, padding masks): the maps address token rows (thd) or
// positions (padding), so a key block or query tile that runs past its sequence's end holds
// the next sequence's or padding rows rather than the copy engine's zeros. The products
// multiply them by exact zeros (masked P and dS), so the consumers zero those rows of K and V
// (once) and of Q and dO (per tile) before the first product reads them: a NaN there would
// otherwise come out as NaN. The dQ shares' reduce-adds past a sequence's queries add zeros.
//
// Defines: those of the attention sources (T, D, LAYOUT, CAUSAL, BOTTOM_RIGHT, PADDING,
// WIN_LEFT, WIN_RIGHT, DROPOUT; the host only picks this kernel for no dropout, D 64 or 128,
// 16-bit T; D 256 has its own entry, attn_bwd_sm90_d256, at the end),
// T_F16 (T is f16, else bf16), STAGES (query-tile stages), HEAD_GROUP (kv heads per scheduling
// group), DQ_SHARES (1: the dQ shares as above; 0: dK and dV only, for the deterministic path,
// whose dQ is a pass of its own over each query tile's keys), PERSISTENT (below). Work items
// are the key blocks of every kv head, in heavy_first's order (key block 0 sees the most query
// tiles under causal masks), so the launch ends on light blocks. PERSISTENT (where the tune
// configs ask for it): CTAs, one an SM, claim items from a counter (attn_bwd_sm90 says how the
// next item's loads overlap the end of the current one); else CTA i takes item i.

#ifndef PERSISTENT
#define PERSISTENT 0
#endif
#if D == 256
#define BN 64                     // keys per CTA (attn_bwd_sm90_d256)
#else
#define BN 128                    // keys per CTA
#endif
#define BM 64                     // queries per tile
#define CONSUMERS 2
#define DBOX (D / 64)
#define K_BOX (BN * 128)          // a box of BN rows x 128 bytes
#define Q_BOX (BM * 128)          // a box of 64 rows x 128 bytes
#define K_TILE (DBOX * K_BOX)
#define Q_TILE (DBOX * Q_BOX)
#define DS_BYTES (BN * BM * 2)    // dSᵀ: BN keys x 64 queries, 16-bit
// dSᵀ buffers (attn_bwd_sm90): head dim 64 keeps three, since a tile's dQ product reads its
// buffer one tile later (below).
#define DS_BUFS (D == 64 ? 3 : 2)
#define DQ_BYTES (BM * 64 * 4)    // a consumer's dQ share: 64 queries x 64 columns, f32
#define RAGGED (PADDING || LAYOUT == 2)
// Head dims 64 and 128 with dQ shares: warp 1 of the producer warpgroup hands them to the copy
// engine (write_dq); head dim 256's consumers hand off their own (hand_off_dq).
#define DQ_WRITER (DQ_SHARES && D != 256)
#if T_F16
#define T_PTX "f16"
#else
#define T_PTX "bf16"
#endif

static_assert(D == 64 || D == 128 || D == 256, "the Hopper attention backward takes head dims 64, 128 and 256");

// The launch's one parameter (the host's BwdParams mirrors it).
struct BwdParams {
    TensorMap q, k, v, d_o;  // 4-D maps of (D, heads, positions, batch), (D, heads, batch, positions) or (D, heads, tokens, 1)
    TensorMap dq;            // the f32 accumulator, boxes of 32 columns x 64 rows
    unsigned long long lse, delta, dk, dv;
    unsigned long long cu_q, cu_k;  // the cumulative sequence lengths (thd, padding masks), else 0
    unsigned long long counter;     // PERSISTENT: zeroed ints, items claimed past the first grid, then a slot per CTA
    int batch, sq, sk, hq, hk, tq;
    float scale;
};

// Rows [row0, row0 + rows) of head `head` of sequence b (row0: map_row's): DBOX boxes of `box`
// bytes into `dst`.
__device__ __forceinline__ void load_rows(u32 dst, const TensorMap* map, int head, int b, int row0, u32 box, u32 bar) {
#pragma unroll
    for (int j = 0; j < DBOX; ++j) {
#if LAYOUT == 1
        tma_load_4d(dst + j * box, map, 64 * j, head, b, row0, bar);
#else
        tma_load_4d(dst + j * box, map, 64 * j, head, row0, LAYOUT == 2 ? 0 : b, bar);
#endif
    }
}

// The box of dq_acc at columns c0.., rows row0.. (map_row's) of head h of sequence b += shared
// memory at src.
__device__ __forceinline__ void tma_reduce_add(const TensorMap* map, u32 src, int c0, int h, int b, int row0) {
#if LAYOUT == 1
    const int c2 = b, c3 = row0;
#else
    const int c2 = row0, c3 = LAYOUT == 2 ? 0 : b;
#endif
    asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];" ::"l"(
                     reinterpret_cast<unsigned long long>(map)),
                 "r"(c0), "r"(h), "r"(c2), "r"(c3), "r"(src)
                 : "memory");
}

__device__ __forceinline__ void sts_u32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void sts_f32x2(u32 addr, float a, float b) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void sts_f32(u32 addr, float a) {
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(a) : "memory");
}
__device__ __forceinline__ float2 lds_f32x2(u32 addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
    return v;
}

// The products of the scores (Sᵀ, dPᵀ) are wgmma chains (hopper.h): as one statement a step,
// ptxas moved the partial Sᵀ to other registers before its last step (head dims 64 and 256, not
// 128), which waited for every MMA in flight, the previous tile's dK included, before that step
// and dPᵀ could issue. NT_OFFS(ks) are step ks's offset operands (A in boxes of K_BOX bytes, B
// of Q_BOX).
#define NT_OFFS(ks) WG_KMAJOR_OFFS(ks, K_BOX, Q_BOX)

// C(64 x 64) = A(64 x D) · B(64 x D)ᵀ, both K-major in shared memory: A's rows at `a` in boxes of
// K_BOX bytes (64 rows of a 128-row tile), B's at `b` in boxes of Q_BOX. (Head dims 64 and 128;
// 256 has mm_nt32.)
#if D != 256
__device__ __forceinline__ void mm_nt(float* c, u32 a, u32 b) {
#define NT64(OA, OB) WG_SS_STEP("m64n64k16", WG_REGS_32, 32, 33, OA, OB)
#if D == 64
    asm volatile(WG_CHAIN_HEAD WG_SS_STEP0("m64n64k16", WG_REGS_32, 32, 33) NT64(34, 35) NT64(36, 37) NT64(38, 39) "}"
                 : WG_ACC32(c, 0)
                 : "l"(wgmma_desc(a, 16, 1024)), "l"(wgmma_desc(b, 16, 1024)), NT_OFFS(1), NT_OFFS(2), NT_OFFS(3));
#else
    asm volatile(WG_CHAIN_HEAD WG_SS_STEP0("m64n64k16", WG_REGS_32, 32, 33) NT64(34, 35) NT64(36, 37) NT64(38, 39)
                     NT64(40, 41) NT64(42, 43) NT64(44, 45) NT64(46, 47) "}"
                 : WG_ACC32(c, 0)
                 : "l"(wgmma_desc(a, 16, 1024)), "l"(wgmma_desc(b, 16, 1024)), NT_OFFS(1), NT_OFFS(2), NT_OFFS(3),
                   NT_OFFS(4), NT_OFFS(5), NT_OFFS(6), NT_OFFS(7));
#endif
#undef NT64
}
#endif

// C(64 x D) += A(64 x 64) · B(64 x D): A as registers (k16 step kk in a[kk]), B MN-major (a query
// tile of shared memory: rows are the k dimension, boxes of Q_BOX hold 64 columns each), as one
// wgmma chain (hopper.h's WG_RS_CHAIN*). (Head dims 64 and 128; 256 has mm_mixed.)
__device__ __forceinline__ void mm_rs(float* c, const u32 (*a)[4], u32 b) {
    const unsigned long long db = wgmma_desc(b, Q_BOX, 1024);
#if D == 128
    asm volatile(WG_RS_CHAIN4_N128 : WG_ACC64(c, 0) : WG_RS_IN4(a, db));
#else
    asm volatile(WG_RS_CHAIN4_N64 : WG_ACC32(c, 0) : WG_RS_IN4(a, db));
#endif
}

// 64 columns of dQ (64 x 64) = dS(64 x 16 steps) · K(16 steps x 64): both MN-major in shared
// memory (dSᵀ's rows and K's rows are keys), STEPS k16 steps from `a` and `b`. Eight steps (head
// dims 64 and 128: all 128 keys) are one wgmma chain (step kk reads 2048 bytes, 16 key rows,
// further on in both: one offset operand, WG_MN_OFF, for the two); four (head dim 256, its 64
// keys) stay one statement a step: as a chain there, the backward was 3% slower (H200, 8.18 →
// 8.45 ms).
#define TT64_0 WG_SS_STEP0_T("m64n64k16", WG_REGS_32, 32, 33, "1, 1")
#define TT64(O) WG_SS_STEP_T("m64n64k16", WG_REGS_32, 32, 33, O, O, "1, 1")
template <int STEPS> __device__ __forceinline__ void mm_tt(float* c, u32 a, u32 b) {
    static_assert(STEPS == 4 || STEPS == 8, "mm_tt: 4 or 8 k16 steps");
    if constexpr (STEPS == 8) {
        asm volatile(WG_CHAIN_HEAD TT64_0 TT64(34) TT64(35) TT64(36) TT64(37) TT64(38) TT64(39) TT64(40) "}"
                     : WG_ACC32(c, 0)
                     : "l"(wgmma_desc(a, DS_BYTES, 1024)), "l"(wgmma_desc(b, K_BOX, 1024)), WG_MN_OFF(1), WG_MN_OFF(2),
                       WG_MN_OFF(3), WG_MN_OFF(4), WG_MN_OFF(5), WG_MN_OFF(6), WG_MN_OFF(7));
    } else {
#pragma unroll
        for (int kk = 0; kk < STEPS; ++kk) {
            const unsigned long long da = wgmma_desc(a + kk * 2048, DS_BYTES, 1024);
            const unsigned long long db = wgmma_desc(b + kk * 2048, K_BOX, 1024);
            asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." T_PTX "." T_PTX " " WG_REGS_32
                         ", %32, %33, p, 1, 1, 1, 1;\n}"
                         : WG_ACC32(c, 0)
                         : "l"(da), "l"(db), "r"(kk));
        }
    }
}
#undef TT64_0
#undef TT64

// Named barriers: 1 joins the two consumers (256 threads; head dim 128), 1 + n % 2 the two
// consumers' dSᵀ rows of tile n (head dim 64: the tile's dQ consumer waits, in tile n + 1, the
// other arrives in tile n; two ids, so that an arrival for tile n + 1 cannot complete tile n's
// barrier, and the arrival for tile n + 2 comes after that consumer's own wait for tile n + 1,
// which follows the other's wait for tile n), 3 + c one consumer's warpgroup.
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;" ::: "memory"); }
__device__ __forceinline__ void ds_wait(int n) { asm volatile("bar.sync %0, 256;" ::"r"(1 + n % 2) : "memory"); }
__device__ __forceinline__ void ds_arrive(int n) { asm volatile("bar.arrive %0, 256;" ::"r"(1 + n % 2) : "memory"); }
__device__ __forceinline__ void warpgroup_sync(int c) { asm volatile("bar.sync %0, 128;" ::"r"(3 + c) : "memory"); }
// Named barrier 5 joins the two consumers once both have zeroed their halves of a ragged tile.
__device__ __forceinline__ void zeroed_sync() { asm volatile("bar.sync 5, 256;" ::: "memory"); }
// Named barriers 6 and 7 hand a work item from the producer warp to the consumers (PERSISTENT):
// 6 the item is in the slot, 7 the consumers have read it.
// The dQ writer warp (below) takes part in them too.
#define HANDOFF_THREADS (32 * (1 + DQ_WRITER) + 128 * CONSUMERS)
__device__ __forceinline__ void handoff_wait(int id) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(HANDOFF_THREADS) : "memory");
}
__device__ __forceinline__ void handoff_arrive(int id) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(HANDOFF_THREADS) : "memory");
}

// Ragged sequences: rows [r0, rows) of two tiles of DBOX boxes of rows x 128 bytes (K and V, or
// Q and dO) zeroed by the two consumers (consumer c, thread tid), joined before any product.
__device__ __forceinline__ void zero_tail(u32 a, u32 b, int rows, int r0, int c, int tid) {
    zero_rows(a, DBOX, rows, r0, 128 * c + tid, 256);
    zero_rows(b, DBOX, rows, r0, 128 * c + tid, 256);
    fence_async_shared();
    zeroed_sync();
}

// Query tile [i0, i0 + BM) sees some key of [j0, j0 + nk) (the bounds are monotone in the query).
__device__ __forceinline__ bool tile_visible(const Seq& s, int i0, int j0, int nk) {
    const int last = min(i0 + BM, s.lq) - 1;
    int lo_first, hi_first, lo_last, hi_last;
    key_range(s, i0, &lo_first, &hi_first);
    key_range(s, last, &lo_last, &hi_last);
    return nk > 0 && hi_last > j0 && lo_first < j0 + nk;
}

// Thread tid's row value of query tile i0 of head h: lse (threads 0-63, lse's [batch, head,
// query] layout) or delta (64-127, q's token rows), 0 past the sequence. The load is asm, so
// that it is issued where it stands in the source.
__device__ __forceinline__ float row_value(const BwdParams& p, const Seq& s, int b, int h, int i0, int tid) {
    const int i = i0 + tid % BM;
    if (i >= s.lq) return 0.0f;
    const float* lse = reinterpret_cast<const float*>(p.lse);
    const float* delta = reinterpret_cast<const float*>(p.delta);
    const float* at =
        tid < BM ? lse + lse_index(s, b, h, p.hq, p.sq, p.tq, i) : delta + (s.qb + (long long)i * s.rs) * p.hq + h;
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(at));
    return v;
}

// Thread tid's part of a dQ share `dq` (a 64 x 64 accumulator) stored at `dq_s` in the f32 map's
// swizzled boxes of 32 columns (its warp's 16 rows).
__device__ __forceinline__ void store_dq(const float* dq, u32 dq_s, int tid) {
    const int warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
        const int row = 16 * warp + g + 8 * ((i / 2) % 2), box = i / 16, chunk = 2 * ((i / 4) % 4) + t / 2;
        sts_f32x2(dq_s + box * Q_BOX + row * 128 + ((chunk ^ g) << 4) + 8 * (t % 2), dq[i], dq[i + 1]);
    }
}

// The dQ share at `src` (two boxes of 32 columns) added by the copy engine to dq_acc's columns
// col0.., rows row0.. (map_row's) of head h of sequence b, as one bulk group.
__device__ __forceinline__ void reduce_add_dq(const BwdParams& p, u32 src, int col0, int h, int b, int row0) {
    tma_reduce_add(&p.dq, src, col0, h, b, row0);
    tma_reduce_add(&p.dq, src + Q_BOX, col0 + 32, h, b, row0);
    bulk_commit();
}

// Head dim 256's hand-off (the others' consumers hand theirs to the writer warp: share_dq): a
// dQ share `dq` (a 64 x 64 accumulator) of query rows row0.. (map_row's) of head h of sequence
// b, columns col0..: into consumer c's buffer `dq_s` (once the copy engine has read its last
// one; store_dq), then one reduce-add per box into dq_acc (reduce_add_dq).
// Every thread of the consumer's warpgroup takes part.
__device__ __forceinline__ void hand_off_dq(const BwdParams& p, const float* dq, u32 dq_s, int c, int tid, int h, int b, int row0, int col0) {
    if (tid == 0) bulk_wait_read<0>();
    warpgroup_sync(c);
    store_dq(dq, dq_s, tid);
    fence_async_shared();
    warpgroup_sync(c);
    if (tid == 0) reduce_add_dq(p, dq_s, col0, h, b, row0);
}

// A dQ share `dq` (a 64 x 64 accumulator) into its consumer's buffer `dq_s` for the dQ writer
// warp (write_dq): each warp of the consumer waits on `empty` until the copy engine has read
// the buffer's previous share (`k` counts the consumer's shares), stores its 16 rows (store_dq)
// and arrives on `full`. An mbarrier, not a named barrier of the warpgroup: a warp goes on
// without waiting for the other three (Nsight Compute put the warpgroup barriers around the
// hand-off, where one thread of the consumer issued the reduce-adds and waited for their reads,
// among the consumers' largest stalls).
__device__ __forceinline__ void share_dq(const float* dq, u32 dq_s, u32 full, u32 empty, int k, int tid) {
    mbar_wait(empty, (k & 1) ^ 1);
    store_dq(dq, dq_s, tid);
    fence_async_shared();
    __syncwarp();
    if (tid % 32 == 0) mbar_arrive(full);
}

// 64 columns of a tile's dQ (dSᵀ at `ds`, K's box of the columns at `k_box`, all 128 keys), then
// dK += dSᵀ · Q: the dQ columns go to the writer warp (share_dq: buffer dq_s, barriers full and
// empty, the consumer's k-th share) while dK runs. Waits for dV and the dQ product (dK alone
// runs on).
__device__ __forceinline__ void dq_then_dk(float* dk, float* dv, const u32 (*da)[4], u32 ds, u32 k_box, u32 q, u32 dq_s,
                                           u32 full, u32 empty, int k, int tid) {
    float dq[32];
    wgmma_fence();
    mm_tt<8>(dq, ds, k_box);
    wgmma_commit();
    mm_rs(dk, da, q);
    wgmma_commit();
    wgmma_wait<1>();
#pragma unroll
    for (int i = 0; i < 32; ++i) acc_fence(dq[i]);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc_fence(dv[i]);
    share_dq(dq, dq_s, full, empty, k, tid);
}

// Head dim 64: the dQ of an item's last tile (dSᵀ at `ds`, K at `k_box`), after the item's
// tiles, handed to the writer warp as dq_then_dk does (every product is done after it).
__device__ __forceinline__ void dq_last(u32 ds, u32 k_box, u32 dq_s, u32 full, u32 empty, int k, int tid) {
    float dq[32];
    wgmma_fence();
    mm_tt<8>(dq, ds, k_box);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) acc_fence(dq[i]);
    share_dq(dq, dq_s, full, empty, k, tid);
}

// dK += dSᵀ · Q issued behind dV, then dV waited for (dK runs on): a tile with no dQ product
// of this consumer's.
__device__ __forceinline__ void dk_behind_dv(float* dk, float* dv, const u32 (*da)[4], u32 q) {
    wgmma_fence();
    mm_rs(dk, da, q);
    wgmma_commit();
    wgmma_wait<1>();
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc_fence(dv[i]);
}

// Work item `item` (a key block, in heavy_first's order): its sequence b, kv head, first key j0
// and keys nk (past the sequence: none), and the query heads per kv head.
struct KeyBlock {
    int b, hkv, j0, nk, group;
    Seq s;
};
__device__ __forceinline__ KeyBlock key_block(const BwdParams& p, int item) {
    KeyBlock k;
    int rank, row;
    heavy_first(item, (p.sk + BN - 1) / BN, p.hk * p.batch, HEAD_GROUP, &rank, &row);
    k.b = row / p.hk;
    k.hkv = row % p.hk;
    k.j0 = rank * BN;
    k.group = p.hq / p.hk;
    k.s = seq_of(k.b, p.batch, p.sq, p.sk, reinterpret_cast<const i32*>(p.cu_q), reinterpret_cast<const i32*>(p.cu_k));
    k.nk = max(0, min(BN, k.s.lk - k.j0));
    return k;
}

// Calls f(n, h, i0) for each query tile the block sees, in order: the query heads h of its kv
// head's group, tiles of BM queries from i0; n counts the tiles seen, so the producer and the
// consumers, walking the same sequence, agree on each tile's stage and phase.
template <typename F> __device__ __forceinline__ void for_each_tile(const KeyBlock& k, F&& f) {
    int n = 0;
    for (int hi = 0; hi < k.group; ++hi) {
        const int h = k.hkv * k.group + hi;
        for (int i0 = 0; i0 < k.s.lq; i0 += BM) {
            if (!tile_visible(k.s, i0, k.j0, k.nk)) continue;
            f(n, h, i0);
            ++n;
        }
    }
}

// The work items of a launch (PERSISTENT): key blocks of BN keys of every kv head of every
// sequence.
__device__ __forceinline__ int items(const BwdParams& p) { return ((p.sk + BN - 1) / BN) * p.hk * p.batch; }
// The work item the producer hands to the consumers: this CTA's slot after the counter (in
// global memory, as in the forward: compute-sanitizer's racecheck does not follow the handoff
// barriers for a shared slot).
__device__ __forceinline__ volatile int* work_slot(const BwdParams& p) {
    return reinterpret_cast<volatile int*>(p.counter) + 1 + blockIdx.x;
}

// The producer's first copies: the block's K and V rows, on `bar`.
__device__ __forceinline__ void load_kv(const BwdParams& p, const KeyBlock& k, u32 k_s, u32 v_s, u32 bar) {
    mbar_arrive_expect(bar, 2 * K_TILE);
    load_rows(k_s, &p.k, k.hkv, k.b, map_row(k.s.kb, k.j0), K_BOX, bar);
    load_rows(v_s, &p.v, k.hkv, k.b, map_row(k.s.kb, k.j0), K_BOX, bar);
}

// PERSISTENT's producer warp (lane 0 issues the copies): hands each work item to the consumers
// (handoff barriers 6 and 7 through the CTA's slot; an item >= items(p) ends them), loads its K
// and V once the consumers have released the previous item's (kv_empty), then calls
// tile(kb, n, h, i0) for its query tiles, n counting the tiles of every item so far.
template <typename F>
__device__ __forceinline__ void produce_items(const BwdParams& p, u32 k_s, u32 v_s, u32 kv_full, u32 kv_empty, F&& tile) {
    const int lane = threadIdx.x;
    int n = 0, w = blockIdx.x;
    for (int it = 0;; ++it) {
        if (it > 0) handoff_wait(7);
        if (lane == 0) *work_slot(p) = w;
        __threadfence_block();
        __syncwarp();
        handoff_arrive(6);
        if (w >= items(p)) break;
        int next = 0;
        if (lane == 0) {
            const KeyBlock kb = key_block(p, w);
            if (it > 0) mbar_wait(kv_empty, (it - 1) & 1);
            load_kv(p, kb, k_s, v_s, kv_full);
            for_each_tile(kb, [&](int, int h, int i0) {
                tile(kb, n, h, i0);
                ++n;
            });
            next = gridDim.x + atomicAdd(reinterpret_cast<int*>(p.counter), 1);
        }
        w = __shfl_sync(0xffffffffu, next, 0);
    }
}

// The producer warpgroup's copies, once it has given back its registers (every thread of it
// calls this; those that issue nothing return at once): PERSISTENT, the producer warp walks the
// work items (produce_items); else thread 0 loads item blockIdx.x's K and V and its tiles.
// tile(kb, n, h, i0) issues tile n's copies (each kernel's stages).
template <typename F>
__device__ __forceinline__ void produce(const BwdParams& p, u32 k_s, u32 v_s, u32 kv_full, u32 kv_empty, F&& tile) {
#if PERSISTENT
    if (threadIdx.x >= 32) return;  // the producer warp stays; lane 0 issues the copies
    produce_items(p, k_s, v_s, kv_full, kv_empty, tile);
#else
    (void)kv_empty;
    if (threadIdx.x != 0) return;  // one producer thread issues the copies
    const KeyBlock kb = key_block(p, blockIdx.x);
    load_kv(p, kb, k_s, v_s, kv_full);
    for_each_tile(kb, [&](int n, int h, int i0) { tile(kb, n, h, i0); });
#endif
}

// PERSISTENT's consumers: the next work item the producer hands over, or -1 once it says there
// is none (that last handoff gets no reply: the producer has left).
__device__ __forceinline__ int next_item(const BwdParams& p) {
    handoff_wait(6);
    const int item = *work_slot(p);
    if (item >= items(p)) return -1;
    handoff_arrive(7);
    return item;
}

// The consumers' loop over their work items, `it` counting them and `item` the current one:
// PERSISTENT, the items the producer hands over (next_item); else item blockIdx.x alone.
#if PERSISTENT
#define FOR_EACH_ITEM(it, item) for (int it = 0, item; (item = next_item(p)) >= 0; ++it)
#else
#define FOR_EACH_ITEM(it, item) for (int it = 0, item = blockIdx.x; it < 1; ++it)
#endif

#if DQ_WRITER
// The dQ writer: warp 1 of the producer warpgroup (lane 0 issues; the warp takes part in the
// work-item handoff). It walks the same tiles as the consumers and, per dQ share (head dim 128:
// both consumers' 64 columns every tile; 64: the whole 64 columns of tile n from consumer
// n % 2), waits on the consumer's `full` barrier (dq_full + 8 c), hands the share's buffer
// (dq_s + c DQ_BYTES) to the copy engine as one reduce-add per box of 32 columns into dq_acc,
// and once the copy engine has read it arrives on `empty` (dq_empty + 8 c). FlashAttention-3
// gives this to a producer warp too: the consumers' warps no longer wait for one of them to
// issue the copies and for their reads.
__device__ __forceinline__ void write_dq(const BwdParams& p, u32 dq_s, u32 dq_full, u32 dq_empty) {
    const int lane = threadIdx.x % 32;
    int n = 0;  // tiles of every item so far, as the consumers count them
    FOR_EACH_ITEM(it, item) {
        if (lane == 0) {
            const KeyBlock kb = key_block(p, item);
            for_each_tile(kb, [&](int, int h, int i0) {
                const int row0 = map_row(kb.s.qb, i0);
#if D == 64
                const int c = n % 2;
                mbar_wait(dq_full + 8 * c, (n / 2) & 1);
                reduce_add_dq(p, dq_s + c * DQ_BYTES, 0, h, kb.b, row0);
                bulk_wait_read<0>();
                mbar_arrive(dq_empty + 8 * c);
#else
#pragma unroll
                for (int c = 0; c < CONSUMERS; ++c) {
                    mbar_wait(dq_full + 8 * c, n & 1);
                    reduce_add_dq(p, dq_s + c * DQ_BYTES, 64 * c, h, kb.b, row0);
                }
                bulk_wait_read<1>();
                mbar_arrive(dq_empty);
                bulk_wait_read<0>();
                mbar_arrive(dq_empty + 8);
#endif
                ++n;
            });
        }
        __syncwarp();
    }
    // The last reduce-adds are done before the CTA leaves.
    if (lane == 0) bulk_wait<0>();
}
#endif

// The thread's row value (row_value) of the tile a consumer expects next, loaded a tile ahead:
// loaded when the tile itself starts, the value arrived after the tile's first products had
// been issued and the warps waited for it (Nsight Compute on the d128 backward, H200,
// 2026-12-01: 9% of the stall samples on its first use, waiting for memory). The guess is the
// next query tile of the head, else the first visible tile of the next head of the group (the
// visible tiles of a head are a run, the same for each head of a key block); a tile that was
// not guessed loads its own value.
struct RowAhead {
    float v;
    int h, i0;  // the tile v belongs to (h -1: none)
    int first;  // the first visible query tile of the key block's heads (-1: not seen yet)

    __device__ __forceinline__ void reset() {
        v = 0.0f;
        h = -1;
        i0 = 0;
        first = -1;
    }

    // Query tile i0's lse (times log2 e) and delta rows into consumer c's row buffer at `rows`
    // (lse rows, then the delta rows at rows + 4 BM; thread tid's value at float tid), then a
    // barrier of the warpgroup; then the guessed next tile's value loaded (head hi of `group`,
    // h0 the group's first head). The buffer's last readers (the previous tile) have passed a
    // barrier of this warpgroup since.
    __device__ __forceinline__ void stage(const BwdParams& p, const Seq& s, int b, int h0, int hi, int group, int i0, int tid, int c,
                                          u32 rows) {
        const int h_now = h0 + hi;
        if (first < 0) first = i0;
        const float row_val = (h == h_now && this->i0 == i0) ? v : row_value(p, s, b, h_now, i0, tid);
        sts_f32(rows + 4 * tid, tid < BM ? row_val * 1.4426950408889634f : row_val);
        warpgroup_sync(c);
        if (i0 + BM < s.lq) {
            h = h_now;
            this->i0 = i0 + BM;
        } else if (hi + 1 < group) {
            h = h_now + 1;
            this->i0 = first;
        } else {
            h = -1;
            return;
        }
        v = row_value(p, s, b, h, this->i0, tid);
    }
};

// Pᵀ = exp2(scale2 Sᵀ - lse2) of the thread's scores, zero outside the mask: J groups of four,
// group j the keys key (x = 0) and key + 8 (x = 1) of queries query(j) + e (e = 0, 1), score
// 4 j + 2 x + e, the queries' lse2 pair at shared address lse2_at(j). MASKED = false is the
// tile whose every query sees every key (below a causal diagonal, all of a plain mask): the
// caller branches on that, so those tiles run no mask arithmetic. (Written as one select a
// score, the mask's bounds, compares and selects took about 25 instructions every four scores
// in every tile, about 15% of a head-dim-128 consumer's instructions.)
template <bool MASKED, int J, typename Q, typename L>
__device__ __forceinline__ void probs_t(float* sc, const Seq& s, int key, Q&& query, L&& lse2_at, float scale2) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const float2 l2 = lds_f32x2(lse2_at(j));
        // Keys [key_lo, key_hi) of the group's two queries (none past the sequence).
        int key_lo[2], key_hi[2];
        if (MASKED) {
#pragma unroll
            for (int e = 0; e < 2; ++e) key_range(s, query(j) + e, &key_lo[e], &key_hi[e]);
        }
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 4 * j + 2 * x + e;
                const bool ok = !MASKED || (key + 8 * x >= key_lo[e] && key + 8 * x < key_hi[e]);
                sc[i] = ok ? fast_exp2(fmaf(sc[i], scale2, -(e ? l2.y : l2.x))) : 0.0f;
            }
    }
}

// Whether queries [q0, q0 + nq) all see keys [k0, k0 + nk) (then no mask is needed).
__device__ __forceinline__ bool sees_all(const Seq& s, int q0, int nq, int k0, int nk) {
    int lo_last, hi_first, unused;
    key_range(s, q0, &unused, &hi_first);
    key_range(s, min(q0 + nq, s.lq) - 1, &lo_last, &unused);
    return q0 + nq <= s.lq && lo_last <= k0 && hi_first >= k0 + nk;
}

// dV and dK (times the softmax scale) of the thread's keys key0 + 16 warp + g (+8), N columns
// from col0 (accumulator layout of a 64 x N wgmma tile): the keys the sequence owns in dk and
// dv, which under a padding mask include its padding rows (zeros: they see no query).
template <int N>
__device__ __forceinline__ void store_dkdv(const BwdParams& p, const KeyBlock& k, int key0, int col0, const float* dv,
                                           const float* dk, int warp, int g, int t) {
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        const int key = key0 + 16 * warp + g + 8 * x;
        if (key >= (LAYOUT == 2 ? k.s.lk : p.sk)) continue;
        const long long row = ((k.s.kb + (long long)key * k.s.rs) * p.hk + k.hkv) * D + col0 + 2 * t;
        T* dv_out = reinterpret_cast<T*>(p.dv) + row;
        T* dk_out = reinterpret_cast<T*>(p.dk) + row;
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
            *reinterpret_cast<u32*>(dv_out + 8 * j) = pack2_f32<T>(dv[4 * j + 2 * x], dv[4 * j + 2 * x + 1]);
            *reinterpret_cast<u32*>(dk_out + 8 * j) =
                pack2_f32<T>(dk[4 * j + 2 * x] * p.scale, dk[4 * j + 2 * x + 1] * p.scale);
        }
    }
}

#if D != 256
extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1)
    attn_bwd_sm90(const __grid_constant__ BwdParams p) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const u32 k_s = base, v_s = base + K_TILE;
#define Q_S(st) (base + 2 * K_TILE + (st) * Q_TILE)
#define DO_S(st) (base + 2 * K_TILE + (STAGES + (st)) * Q_TILE)
#define DS_S(i) (base + 2 * K_TILE + 2 * STAGES * Q_TILE + (i) * DS_BYTES)
#define DQ_S(c) (base + 2 * K_TILE + 2 * STAGES * Q_TILE + DS_BUFS * DS_BYTES + (c) * DQ_BYTES)
    const u32 rows_s = base + 2 * K_TILE + 2 * STAGES * Q_TILE + DS_BUFS * DS_BYTES + CONSUMERS * DQ_BYTES;
#define LSE_S(c) (rows_s + (c) * 2 * BM * 4)
#define DEL_S(c) (rows_s + (c) * 2 * BM * 4 + BM * 4)
    const u32 bars = rows_s + CONSUMERS * 2 * BM * 4;
#define KV_FULL bars
#define QD_FULL(st) (bars + 8u * (1 + (st)))
#define QD_EMPTY(st) (bars + 8u * (1 + STAGES + (st)))
    const int warpgroup = warpgroup_index();
#define KV_EMPTY (bars + 8u * (1 + 2 * STAGES))
// DQ_WRITER: consumer c's dQ buffer holds a share (its four warps arrive) / is free again.
#define DQ_FULL(c) (bars + 8u * (2 + 2 * STAGES + (c)))
#define DQ_EMPTY(c) (bars + 8u * (2 + 2 * STAGES + CONSUMERS + (c)))
    if (threadIdx.x == 0) {
        mbar_init(KV_FULL, 1);
        mbar_init(KV_EMPTY, CONSUMERS * 4);
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(QD_FULL(st), 1);
            mbar_init(QD_EMPTY(st), CONSUMERS * 4);
        }
        for (int c = 0; c < CONSUMERS; ++c) {
            mbar_init(DQ_FULL(c), 4);
            mbar_init(DQ_EMPTY(c), 1);
        }
        mbar_init_fence();
    }
    __syncthreads();

    // PERSISTENT: scheduled dynamically as the forward: CTA i starts with item i, then takes
    // the next unclaimed one from the counter (grid + atomicAdd), in heavy_first's order. The
    // producer hands each item to the consumers (handoff_*; an item >= items(p) ends them),
    // loads its K and V once the consumers have released the previous item's (KV_EMPTY, after
    // their last product that reads them), then its tiles: the Q / dO ring runs on across
    // items (n counts tiles), so the next item's K and V and first tiles load while the
    // consumers finish this item's last products and store its dK and dV. Else CTA i takes
    // item i alone.
    if (warpgroup == 0) {
        regs_release<24>();
#if DQ_WRITER
        if (threadIdx.x / 32 == 1) {
            write_dq(p, DQ_S(0), DQ_FULL(0), DQ_EMPTY(0));
            return;
        }
#endif
        // Query tile n's Q and dO (tile (h, i0) of key block kb) into its stage.
        const auto tile = [&](const KeyBlock& kb, int n, int h, int i0) {
            const int st = n % STAGES;
            mbar_wait(QD_EMPTY(st), ((n / STAGES) & 1) ^ 1);
            mbar_arrive_expect(QD_FULL(st), 2 * Q_TILE);
            load_rows(Q_S(st), &p.q, h, kb.b, map_row(kb.s.qb, i0), Q_BOX, QD_FULL(st));
            load_rows(DO_S(st), &p.d_o, h, kb.b, map_row(kb.s.qb, i0), Q_BOX, QD_FULL(st));
        };
        produce(p, k_s, v_s, KV_FULL, KV_EMPTY, tile);
        return;
    }

    regs_claim<240>();
    const int c = warpgroup - 1;
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const float scale2 = p.scale * 1.4426950408889634f;
    // The stage whose dK product may still run (its Q is released once that is done), or -1.
    int pending = -1;
    // n counts the tiles of every item so far, as the producer's does.
    int n = 0;
#if DQ_SHARES && D == 64
    // This consumer owns tile n - 1 and has not yet computed its dQ.
    bool owes = false;
#endif
    FOR_EACH_ITEM(it, item) {
        const KeyBlock kb = key_block(p, item);
        RowAhead ahead;
        ahead.reset();
        const int b = kb.b, j0 = kb.j0;
        const Seq& s = kb.s;
        const int kw = j0 + 64 * c;  // this consumer's first key; the thread's are kw + 16 warp + g (+8)
        // Accumulator i of a 64 x N wgmma tile is row 16 warp + g + 8 ((i / 2) % 2), column
        // 8 (i / 4) + 2 t + i % 2.
        float dv[D / 2], dk[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; ++i) dv[i] = dk[i] = 0.0f;
        mbar_wait(KV_FULL, it & 1);
#if RAGGED
        if (kb.nk < BN) zero_tail(k_s, v_s, BN, kb.nk, c, tid);
#endif
        // for_each_tile's walk, written out: as its lambda the consumers' loop compiled to other
        // register allocations (48-64 instructions fewer at head dim 64), not yet measured.
        for (int hi = 0; hi < kb.group; ++hi) {
            const int h = kb.hkv * kb.group + hi;
            for (int i0 = 0; i0 < s.lq; i0 += BM) {
                if (!tile_visible(s, i0, j0, kb.nk)) continue;
                const int st = n % STAGES;
                const u32 q = Q_S(st), d_o = DO_S(st), ds = DS_S(n % DS_BUFS);
                // K and V (shared memory) of this tile's products: their descriptors are recomputed
                // per tile (opaque), not kept in registers across the loop (ptxas spilled them).
                const u32 k_t = opaque(k_s), v_t = opaque(v_s);
                const u32 k_c = k_t + c * 64 * 128, v_c = v_t + c * 64 * 128;
                mbar_wait(QD_FULL(st), (n / STAGES) & 1);
#if RAGGED
                if (i0 + BM > s.lq) zero_tail(q, d_o, BM, s.lq - i0, c, tid);
#endif
                float sc[BM / 2], dp[BM / 2];
                wgmma_fence();
                mm_nt(sc, k_c, q);
                wgmma_commit();
                mm_nt(dp, v_c, d_o);
                wgmma_commit();
                // The tile's lse (threads 0-63) and delta (64-127) rows, one a thread, loaded a
                // tile ahead (RowAhead), by asm loads. As a plain load before the products, ptxas
                // copied the loaded register ahead of their issue, so the warps waited for the load
                // there: Nsight Compute (H200, 2026-11-27) counted that copy as the largest stall,
                // 9% of the samples.
                ahead.stage(p, s, b, kb.hkv * kb.group, hi, kb.group, i0, tid, c, LSE_S(c));
                // The mask: none when every query of the tile sees every key of this consumer's 64.
                const bool full = sees_all(s, i0, BM, kw, 64);
                // Done: the previous tile's dK and this one's Sᵀ (wgmma groups retire in order).
                wgmma_wait<1>();
#pragma unroll
                for (int i = 0; i < BM / 2; ++i) acc_fence(sc[i]);
                if (pending >= 0) {
                    __syncwarp();
                    if (lane == 0) mbar_arrive(QD_EMPTY(pending));
                }
                // Pᵀ = exp2(scale2 Sᵀ - lse2), zero outside the mask.
                {
                    const int key = kw + 16 * warp + g;
                    const auto query = [&](int j) { return i0 + 8 * j + 2 * t; };
                    const auto lse2_at = [&](int j) { return LSE_S(c) + 4 * (8 * j + 2 * t); };
                    if (full) {
                        probs_t<false, BM / 8>(sc, s, key, query, lse2_at, scale2);
                    } else {
                        probs_t<true, BM / 8>(sc, s, key, query, lse2_at, scale2);
                    }
                }
                u32 pa[BM / 16][4];
#pragma unroll
                for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
                    for (int r = 0; r < 4; ++r) pa[kk][r] = pack2_f32<T>(sc[8 * kk + 2 * r], sc[8 * kk + 2 * r + 1]);
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < BM / 2; ++i) acc_fence(dp[i]);
#pragma unroll
                for (int i = 0; i < D / 2; ++i) acc_fence(dk[i]);
                // dV += Pᵀ · dO runs while dSᵀ is formed.
                wgmma_fence();
                mm_rs(dv, pa, d_o);
                wgmma_commit();
                // dSᵀ = Pᵀ (dPᵀ - delta); its 16-bit rows into shared memory for the dQ product.
                // The delta pairs loaded four at a time: one shared-memory latency per four pairs, not
                // one per pair (the loads and the dSᵀ stores are ordered asm, so the compiler does
                // not mix them; all eight at once made ptxas spill).
                u32 da[BM / 16][4];
                float2 dl[4];
#pragma unroll
                for (int j = 0; j < BM / 8; ++j) {
                    if (j % 4 == 0) {
#pragma unroll
                        for (int u = 0; u < 4; ++u) dl[u] = lds_f32x2(DEL_S(c) + 4 * (8 * (j + u) + 2 * t));
                    }
#pragma unroll
                    for (int x = 0; x < 2; ++x) {
                        const int i = 4 * j + 2 * x;
                        dp[i] = sc[i] * (dp[i] - dl[j % 4].x);
                        dp[i + 1] = sc[i + 1] * (dp[i + 1] - dl[j % 4].y);
#if DQ_SHARES
                        const u32 w = pack2_f32<T>(dp[i], dp[i + 1]);
                        const int row = 64 * c + 16 * warp + g + 8 * x;
                        sts_u32(ds + row * 128 + ((j ^ g) << 4) + 4 * t, w);
#endif
                    }
                }
#pragma unroll
                for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
                    for (int r = 0; r < 4; ++r) da[kk][r] = pack2_f32<T>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
#if !DQ_SHARES
                // No dQ here (the deterministic path's attn_bwd_dq_sm90 computes it): dK right
                // behind dV.
                // (The barrier: every thread's reads of the row buffer are done before the next
                // tile's RowAhead::stage overwrites it.)
                (void)ds;
                warpgroup_sync(c);
                dk_behind_dv(dk, dv, da, q);
#elif D == 64
                fence_async_shared();
                // Tile n's dQ (all 64 columns, all 128 keys) is consumer n % 2's, computed a tile
                // later. Computed in its own tile, the owner waited at the barrier for the other
                // consumer's dSᵀ rows while the other, one dQ product behind (its own tile
                // before), caught up: H200 Nsight Compute, 2026-12-04, 6.8% of the stall samples.
                // Here the owner of tile n - 1 waits for the other's rows of n - 1 (ds_wait; it
                // joins this warpgroup too: its threads' last reads of the row buffer, which the
                // next tile overwrites, are done), multiplies them and hands the share on; then
                // the consumer that does not own tile n arrives for its rows of n, once any dQ
                // product of its own has read its buffer, so tile n + 3's rows (three buffers)
                // overwrite tile n's only after its dQ. Each path issues dK last and leaves only
                // it running: with the dQ product and its hand-off behind separate branches ptxas
                // serialised the wgmma (C7512).
                if (owes) {
                    ds_wait(n - 1);
                    dq_then_dk(dk, dv, da, DS_S((n - 1) % DS_BUFS), k_t, q, DQ_S(c), DQ_FULL(c), DQ_EMPTY(c),
                               (n - 1) / 2, tid);
                } else {
                    warpgroup_sync(c);
                    dk_behind_dv(dk, dv, da, q);
                }
                if (n % 2 != c) ds_arrive(n);
                owes = n % 2 == c;
#else
                fence_async_shared();
                consumers_sync();  // both consumers' dSᵀ rows are in shared memory
                dq_then_dk(dk, dv, da, ds, k_t + c * K_BOX, q, DQ_S(c), DQ_FULL(c), DQ_EMPTY(c), n, tid);
#endif
                pending = st;
                ++n;
            }
        }
#if DQ_SHARES && D == 64
        // The item's last tile's dQ, owed by its owner, before K is given back.
        if (owes) {
            ds_wait(n - 1);
            dq_last(DS_S((n - 1) % DS_BUFS), opaque(k_s), DQ_S(c), DQ_FULL(c), DQ_EMPTY(c), (n - 1) / 2, tid);
            owes = false;
        }
#endif
#if PERSISTENT
        // Every product that reads K or V is done (only dK, from Q's stage, may still run): the
        // producer may load the next item's.
        __syncwarp();
        if (lane == 0) mbar_arrive(KV_EMPTY);
#endif
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < D / 2; ++i) acc_fence(dk[i]);
#if PERSISTENT
        if (pending >= 0) {
            __syncwarp();
            if (lane == 0) mbar_arrive(QD_EMPTY(pending));
            pending = -1;
        }
#else
        // The consumers have no bulk groups of their own (the writer warp issues the dQ
        // shares'): this wait returns at once, but without it ptxas serialised this kernel's
        // wgmma (C7515, every non-persistent variant of the compile test).
        if (tid == 0) bulk_wait<0>();
#endif
        store_dkdv<D>(p, kb, kw, 0, dv, dk, warp, g, t);  // this consumer's 64 keys
    }
#undef DQ_FULL
#undef DQ_EMPTY
#undef KV_EMPTY
#undef Q_S
#undef DO_S
#undef DS_S
#undef DQ_S
#undef LSE_S
#undef DEL_S
#undef KV_FULL
#undef QD_FULL
#undef QD_EMPTY
}
#endif

#if D == 256
// Head dim 256 (attn_bwd_sm90_d256). dK and dV of 64 keys would take 256 registers a thread in
// one warpgroup, so the consumers split them by head-dim halves (consumer c: columns
// 128 c..128 c + 127 of both, 128 registers) and split the scores by query halves instead:
// per query tile of 64, consumer c computes, for all 64 keys and its 32 queries,
//   Sᵀ = K · Q_cᵀ, dPᵀ = V · dO_cᵀ   (m64n32, contracting all 256 columns: no product twice)
//   Pᵀ, dSᵀ as in the other head dims, written as 16-bit rows into shared memory;
// then, once both halves are there (a barrier joins the consumers),
//   dV_c += Pᵀ · dO[:, c half], dK_c += dSᵀ · Q[:, c half]   (m64n128 over the 64 queries: the
//                                     consumer's own queries' Pᵀ / dSᵀ from its registers, the
//                                     other's from shared memory)
//   dQ[:, c half] = dS · K[:, c half]                         (two m64n64 over the 64 keys, both
//                                     operands from shared memory)
// and each dQ quarter (64 columns) goes to the copy engine's reduce-add as in the other head
// dims. Q has STAGES stages, dO one (it is released once dV is done, so the next tile's dO
// loads while dK and dQ run): 231,480 bytes of shared memory with two Q stages.

// C(64 keys x 32 queries) = K(64 x 256) · Q(32 x 256)ᵀ: both K-major in shared memory (k: K's
// boxes of K_BOX bytes; q: the first of the 32 rows in Q's boxes of Q_BOX).
__device__ __forceinline__ void mm_nt32(float* c, u32 k, u32 q) {
#define NT32(OA, OB) WG_SS_STEP("m64n32k16", WG_REGS_16, 16, 17, OA, OB)
    asm volatile(WG_CHAIN_HEAD WG_SS_STEP0("m64n32k16", WG_REGS_16, 16, 17) NT32(18, 19) NT32(20, 21) NT32(22, 23)
                     NT32(24, 25) NT32(26, 27) NT32(28, 29) NT32(30, 31) NT32(32, 33) NT32(34, 35) NT32(36, 37)
                         NT32(38, 39) NT32(40, 41) NT32(42, 43) NT32(44, 45) NT32(46, 47) "}"
                 : WG_ACC16(c, 0)
                 : "l"(wgmma_desc(k, 16, 1024)), "l"(wgmma_desc(q, 16, 1024)), NT_OFFS(1), NT_OFFS(2), NT_OFFS(3),
                   NT_OFFS(4), NT_OFFS(5), NT_OFFS(6), NT_OFFS(7), NT_OFFS(8), NT_OFFS(9), NT_OFFS(10), NT_OFFS(11),
                   NT_OFFS(12), NT_OFFS(13), NT_OFFS(14), NT_OFFS(15));
#undef NT32
}

// C(64 keys x 128 columns) += A(64 keys x 64 queries) · B(64 queries x 128 columns), B MN-major
// (two boxes of a Q or dO tile, from `b`). A is Pᵀ or dSᵀ: the k16 steps over consumer `cons`'s
// own 32 queries (2 cons, 2 cons + 1) take it from the consumer's registers (`own`, as wgmma's A
// fragments), the other consumer's two from shared memory (`a`, one K-major box), which halves
// A's shared-memory reads.
__device__ __forceinline__ void mm_mixed(float* c, const u32 (*own)[4], int cons, u32 a, u32 b) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const unsigned long long db = wgmma_desc(b + (2 * cons + j) * 2048, Q_BOX, 1024);
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." T_PTX "." T_PTX " " WG_REGS_64
                     ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"
                     : WG_ACC64(c, 0)
                     : "r"(own[j][0]), "r"(own[j][1]), "r"(own[j][2]), "r"(own[j][3]), "l"(db), "n"(1));
    }
    const int other = 2 * (1 - cons);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const unsigned long long da = wgmma_desc(a + (other + j) * 32, 16, 1024);
        const unsigned long long db = wgmma_desc(b + (other + j) * 2048, Q_BOX, 1024);
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." T_PTX "." T_PTX " " WG_REGS_64
                     ", %64, %65, p, 1, 1, 0, 1;\n}"
                     : WG_ACC64(c, 0)
                     : "l"(da), "l"(db), "n"(1));
    }
}

extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1)
    attn_bwd_sm90_d256(const __grid_constant__ BwdParams p) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const u32 k_s = base, v_s = base + K_TILE;
#define Q_S(st) (base + 2 * K_TILE + (st) * Q_TILE)
    const u32 do_s = base + 2 * K_TILE + STAGES * Q_TILE;
#define PT_S(i) (do_s + Q_TILE + (i) * DS_BYTES)
#define DS_S(i) (do_s + Q_TILE + (2 + (i)) * DS_BYTES)
#define DQ_S(c) (do_s + Q_TILE + 4 * DS_BYTES + (c) * DQ_BYTES)
    const u32 rows_s = do_s + Q_TILE + 4 * DS_BYTES + CONSUMERS * DQ_BYTES;
#define LSE_S(c) (rows_s + (c) * 2 * BM * 4)
#define DEL_S(c) (rows_s + (c) * 2 * BM * 4 + BM * 4)
    const u32 bars = rows_s + CONSUMERS * 2 * BM * 4;
#define KV_FULL bars
#define Q_FULL(st) (bars + 8u * (1 + (st)))
#define Q_EMPTY(st) (bars + 8u * (1 + STAGES + (st)))
#define DO_FULL (bars + 8u * (1 + 2 * STAGES))
#define DO_EMPTY (bars + 8u * (2 + 2 * STAGES))
#define KV_EMPTY (bars + 8u * (3 + 2 * STAGES))
    const int warpgroup = warpgroup_index();
    if (threadIdx.x == 0) {
        mbar_init(KV_FULL, 1);
        mbar_init(KV_EMPTY, CONSUMERS * 4);
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(Q_FULL(st), 1);
            mbar_init(Q_EMPTY(st), CONSUMERS * 4);
        }
        mbar_init(DO_FULL, 1);
        mbar_init(DO_EMPTY, CONSUMERS * 4);
        mbar_init_fence();
    }
    __syncthreads();

    // PERSISTENT: as attn_bwd_sm90's (every product of a tile is waited for within it, so the
    // consumers release K and V right after their last tile).
    if (warpgroup == 0) {
        regs_release<24>();
        // Query tile n's Q into its stage and its dO into the one dO buffer.
        const auto tile = [&](const KeyBlock& kb, int n, int h, int i0) {
            const int st = n % STAGES;
            mbar_wait(Q_EMPTY(st), ((n / STAGES) & 1) ^ 1);
            mbar_arrive_expect(Q_FULL(st), Q_TILE);
            load_rows(Q_S(st), &p.q, h, kb.b, map_row(kb.s.qb, i0), Q_BOX, Q_FULL(st));
            mbar_wait(DO_EMPTY, (n & 1) ^ 1);
            mbar_arrive_expect(DO_FULL, Q_TILE);
            load_rows(do_s, &p.d_o, h, kb.b, map_row(kb.s.qb, i0), Q_BOX, DO_FULL);
        };
        produce(p, k_s, v_s, KV_FULL, KV_EMPTY, tile);
        return;
    }

    regs_claim<240>();
    const int c = warpgroup - 1;
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const float scale2 = p.scale * 1.4426950408889634f;
    const int qc = 32 * c;  // this consumer's first query of a tile; its keys are all 64
    // n counts the tiles of every item so far, as the producer's does.
    int n = 0;
    FOR_EACH_ITEM(it, item) {
        const KeyBlock kb = key_block(p, item);
        RowAhead ahead;
        ahead.reset();
        const int b = kb.b, j0 = kb.j0;
        const Seq& s = kb.s;
        // Accumulator i of a 64 x N wgmma tile is row 16 warp + g + 8 ((i / 2) % 2) (a key here),
        // column 8 (i / 4) + 2 t + i % 2.
        float dv[64], dk[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) dv[i] = dk[i] = 0.0f;
        mbar_wait(KV_FULL, it & 1);
#if RAGGED
        if (kb.nk < BN) zero_tail(k_s, v_s, BN, kb.nk, c, tid);
#endif
        // for_each_tile's walk, written out: as its lambda the consumers' loop compiled to other
        // register allocations (48-64 instructions fewer at head dim 64), not yet measured.
        for (int hi = 0; hi < kb.group; ++hi) {
            const int h = kb.hkv * kb.group + hi;
            for (int i0 = 0; i0 < s.lq; i0 += BM) {
                if (!tile_visible(s, i0, j0, kb.nk)) continue;
                const int st = n % STAGES;
                const u32 q = Q_S(st), pt = PT_S(n % 2), ds = DS_S(n % 2);
                const u32 k_t = opaque(k_s), v_t = opaque(v_s);
                float sc[16], dp[16];
                u32 pa[2][4], da[2][4];  // Pᵀ and dSᵀ of this consumer's queries, as A fragments
                mbar_wait(Q_FULL(st), (n / STAGES) & 1);
#if RAGGED
                if (i0 + BM > s.lq) {
                    mbar_wait(DO_FULL, n & 1);
                    zero_tail(q, do_s, BM, s.lq - i0, c, tid);
                }
#endif
                wgmma_fence();
                mm_nt32(sc, k_t, q + qc * 128);
                wgmma_commit();
                mbar_wait(DO_FULL, n & 1);
                mm_nt32(dp, v_t, do_s + qc * 128);
                wgmma_commit();
                // The tile's lse and delta rows, as in attn_bwd_sm90.
                ahead.stage(p, s, b, kb.hkv * kb.group, hi, kb.group, i0, tid, c, LSE_S(c));
                // The mask: none when every one of this consumer's queries sees all 64 keys.
                const bool full = sees_all(s, i0 + qc, 32, j0, BN);
                wgmma_wait<1>();
#pragma unroll
                for (int i = 0; i < 16; ++i) acc_fence(sc[i]);
                // Pᵀ = exp2(scale2 Sᵀ - lse2), zero outside the mask, into shared memory (row: key,
                // 16-byte chunk: 8 queries, in the 128-byte swizzle).
                {
                    const int key = j0 + 16 * warp + g;
                    const auto query = [&](int j) { return i0 + qc + 8 * j + 2 * t; };
                    const auto lse2_at = [&](int j) { return LSE_S(c) + 4 * (qc + 8 * j + 2 * t); };
                    if (full) {
                        probs_t<false, 4>(sc, s, key, query, lse2_at, scale2);
                    } else {
                        probs_t<true, 4>(sc, s, key, query, lse2_at, scale2);
                    }
                }
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int x = 0; x < 2; ++x) {
                        const int r = 16 * warp + g + 8 * x;
                        pa[j / 2][2 * (j % 2) + x] = pack2_f32<T>(sc[4 * j + 2 * x], sc[4 * j + 2 * x + 1]);
                        sts_u32(pt + r * 128 + (((qc / 8 + j) ^ g) << 4) + 4 * t, pa[j / 2][2 * (j % 2) + x]);
                    }
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < 16; ++i) acc_fence(dp[i]);
                // dSᵀ = Pᵀ (dPᵀ - delta), into shared memory the same way.
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float2 dl = lds_f32x2(DEL_S(c) + 4 * (qc + 8 * j + 2 * t));
#pragma unroll
                    for (int x = 0; x < 2; ++x) {
                        const int i = 4 * j + 2 * x, r = 16 * warp + g + 8 * x;
                        dp[i] = sc[i] * (dp[i] - dl.x);
                        dp[i + 1] = sc[i + 1] * (dp[i + 1] - dl.y);
                        da[j / 2][2 * (j % 2) + x] = pack2_f32<T>(dp[i], dp[i + 1]);
                        sts_u32(ds + r * 128 + (((qc / 8 + j) ^ g) << 4) + 4 * t, da[j / 2][2 * (j % 2) + x]);
                    }
                }
                fence_async_shared();
                consumers_sync();  // both consumers' halves of Pᵀ and dSᵀ are in shared memory
#pragma unroll
                for (int i = 0; i < 64; ++i) acc_fence(dv[i]);
#pragma unroll
                for (int i = 0; i < 64; ++i) acc_fence(dk[i]);
#if DQ_SHARES
                float dq[32];
#endif
                wgmma_fence();
                mm_mixed(dv, pa, c, pt, do_s + 2 * c * Q_BOX);
                wgmma_commit();
#if DQ_SHARES
                mm_tt<4>(dq, ds, k_t + 2 * c * K_BOX);
                wgmma_commit();
#endif
                mm_mixed(dk, da, c, ds, q + 2 * c * Q_BOX);
                wgmma_commit();
#if DQ_SHARES
                wgmma_wait<1>();  // dV and the first dQ quarter (dK runs on)
#pragma unroll
                for (int i = 0; i < 32; ++i) acc_fence(dq[i]);
#pragma unroll
                for (int i = 0; i < 64; ++i) acc_fence(dv[i]);
                __syncwarp();
                if (lane == 0) mbar_arrive(DO_EMPTY);
                hand_off_dq(p, dq, DQ_S(c), c, tid, h, b, map_row(s.qb, i0), 128 * c);
                wgmma_fence();
                mm_tt<4>(dq, ds, k_t + (2 * c + 1) * K_BOX);
                wgmma_commit();
                wgmma_wait<0>();  // dK and the second quarter
#pragma unroll
                for (int i = 0; i < 32; ++i) acc_fence(dq[i]);
#pragma unroll
                for (int i = 0; i < 64; ++i) acc_fence(dk[i]);
                __syncwarp();
                if (lane == 0) mbar_arrive(Q_EMPTY(st));
                hand_off_dq(p, dq, DQ_S(c), c, tid, h, b, map_row(s.qb, i0), 128 * c + 64);
#else
                // No dQ (attn_bwd_dq_sm90's, or the mma.sync pass's, on the deterministic path).
                wgmma_wait<1>();  // dV (dK runs on)
#pragma unroll
                for (int i = 0; i < 64; ++i) acc_fence(dv[i]);
                __syncwarp();
                if (lane == 0) mbar_arrive(DO_EMPTY);
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < 64; ++i) acc_fence(dk[i]);
                __syncwarp();
                if (lane == 0) mbar_arrive(Q_EMPTY(st));
#endif
                ++n;
            }
        }
#if PERSISTENT
        // Every product of the last tile is done: the producer may load the next item's K and V.
        __syncwarp();
        if (lane == 0) mbar_arrive(KV_EMPTY);
#else
        if (tid == 0) bulk_wait<0>();
#endif
        store_dkdv<128>(p, kb, j0, 128 * c, dv, dk, warp, g, t);  // the 64 keys, this consumer's columns
    }
#if PERSISTENT
    // The last dQ shares' reduce-adds have read their buffers before the CTA leaves.
    if (tid == 0) bulk_wait<0>();
#endif
#undef KV_EMPTY
#undef Q_S
#undef PT_S
#undef DS_S
#undef DQ_S
#undef LSE_S
#undef DEL_S
#undef KV_FULL
#undef Q_FULL
#undef Q_EMPTY
#undef DO_FULL
#undef DO_EMPTY
}
#endif
