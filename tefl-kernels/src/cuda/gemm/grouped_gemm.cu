// te_general_grouped_gemm on Hopper: every group's D_g = op(A_g)·op(B_g) (+ bias_g), FP8 with
// D_g scaled by a_scale_inv_g·b_scale_inv_g, in ONE persistent launch over a table of groups.
//
// The table (a __grid_constant__ parameter) holds, per group, the copy engine's tensor maps of
// A_g and B_g and the group's sizes, pointers and first tile. Tiles of BM x BN outputs are
// numbered group after group; CTA i takes tiles i, i + grid, ... Each CTA has three
// warpgroups: warpgroup 0 is the producer (one thread issues the tensor-memory-accelerator
// loads of the K steps into a ring of STAGES shared-memory stages, full/empty mbarriers per
// stage), warpgroups 1 and 2 are consumers (64 rows of the tile each, wgmma from the stages,
// f32 accumulators in registers, then the epilogue: scaled, biased and rounded into a
// shared-memory staging buffer, stored by the copy engine or in 16-byte pieces). The ring
// runs across tiles, so the producer loads the next tile while consumers store this one.
//
// Shared-memory layouts are the 128-byte swizzled ones the copy engine writes and wgmma reads:
// - K-major operand (A [m, k], B [n, k]): one box of 128 bytes of K x rows; descriptor
//   stride 1024 (8 rows), K advanced by 32 bytes inside the swizzled row.
// - MN-major operand (16-bit A [k, m] or B [k, n]): boxes of 64 MN elements x 64 K rows, one
//   per 64 MN; descriptor leading offset = the box size (next 64 MN), stride 1024 (8 K rows),
//   K advanced by 16 rows (2048 bytes).
// FP8 operands are K-major only (the host transposes the codes first otherwise).
//
// Defines: MAX_GROUPS; AB_FP8 (1: FP8 codes, A_E5M2 / B_E5M2 pick the formats; 0: 16-bit,
// AB_F16 1 for f16, 0 for bf16); A_MN, B_MN (MN-major operands, 16-bit only); OUT_T (0 f32,
// 1 f16, 2 bf16); BIAS_T (0 none, 1 f32, 2 f16, 3 bf16); BN (256 or 128); SPLIT (FP8: each
// stage's products summed into the accumulators in f32, TE's split accumulator); STAGES;
// M_FIRST (the tile order); TMA_STORE (D written by the copy engine: every D_g's rows are
// 16-byte multiples).

#define BM 128
#define BK_BYTES 128
#define A_STAGE (BM * BK_BYTES)
#define B_STAGE (BN * BK_BYTES)
#define STAGE_BYTES (A_STAGE + B_STAGE)
#define CONSUMERS 2
#define ACC (BN / 2)
#define BOX_MN 8192  // one 64 (MN) x 64 (K) box of 16-bit elements
// The epilogue's staging. TMA_STORE: two buffers per consumer of 64 rows x 128 bytes, in the
// 128-byte swizzled layout the copy engine's store reads (a warp's 8 rows land in 8 different
// 16-byte columns). Else one buffer of 64 rows of 64 outputs plus 16 bytes (a warp's 8 rows x
// 4 words of 16-bit pairs land in 32 different banks), written out in PIECES 16-byte pieces.
#if TMA_STORE
#define STAGING_BYTES 16384
#elif OUT_T == 0
#define STAGING_PITCH (64 * 4 + 16)
#define PIECES 16
#else
#define STAGING_PITCH (64 * 2 + 16)
#define PIECES 8
#endif
#if !TMA_STORE
#define STAGING_BYTES (64 * STAGING_PITCH)
#endif

#if AB_FP8
#define BK 128
#if A_E5M2
#define A_PTX "e5m2"
#else
#define A_PTX "e4m3"
#endif
#if B_E5M2
#define B_PTX "e5m2"
#else
#define B_PTX "e4m3"
#endif
#else
#define BK 64
#if AB_F16
#define A_PTX "f16"
#define B_PTX "f16"
#else
#define A_PTX "bf16"
#define B_PTX "bf16"
#endif
#endif

// One group's sizes and pointers (64 bytes; the host's GroupInfo mirrors it).
struct GroupInfo {
    unsigned long long d, bias, a_scale_inv, b_scale_inv;
    int m, n, k, first_tile;
    int tiles_n, pad0, pad1, pad2;
};

struct GroupTable {
    TensorMap a[MAX_GROUPS];
    TensorMap b[MAX_GROUPS];
    TensorMap d[MAX_GROUPS];  // TMA_STORE: D [m, n], boxes of 64 rows x 128 bytes
    GroupInfo g[MAX_GROUPS];
    int groups;
    int tiles;
};

// D(64 x BN, f32) (+)= A(64 x K step) * B(K step x BN): one wgmma, operands in shared memory.
__device__ __forceinline__ void mma_step(float* d, unsigned long long da, unsigned long long db, int accumulate) {
#if BN == 256
#if AB_FP8
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k32.f32." A_PTX "." B_PTX " " WG_REGS_128
                 ", %128, %129, p, 1, 1;\n}"
                 : WG_ACC128(d)
                 : "l"(da), "l"(db), "r"(accumulate));
#else
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." A_PTX "." B_PTX " " WG_REGS_128
                 ", %128, %129, p, 1, 1, %131, %132;\n}"
                 : WG_ACC128(d)
                 : "l"(da), "l"(db), "r"(accumulate), "n"(A_MN), "n"(B_MN));
#endif
#else
#if AB_FP8
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32." A_PTX "." B_PTX " " WG_REGS_64
                 ", %64, %65, p, 1, 1;\n}"
                 : WG_ACC64(d, 0)
                 : "l"(da), "l"(db), "r"(accumulate));
#else
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." A_PTX "." B_PTX " " WG_REGS_64
                 ", %64, %65, p, 1, 1, %67, %68;\n}"
                 : WG_ACC64(d, 0)
                 : "l"(da), "l"(db), "r"(accumulate), "n"(A_MN), "n"(B_MN));
#endif
#endif
}

// The four wgmma K steps of one stage (128 bytes of K), consumer `c`'s 64 rows of A.
__device__ __forceinline__ void mma_stage(float* d, u32 stage, int c, int accumulate_first) {
    const u32 sa = stage + c * BOX_MN;  // 64 rows x 128 bytes (K-major) or box c (MN-major)
    const u32 sb = stage + A_STAGE;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        const unsigned long long da = A_MN ? wgmma_desc(sa + s * 2048, BOX_MN, 1024) : wgmma_desc(sa + s * 32, 16, 1024);
        const unsigned long long db = B_MN ? wgmma_desc(sb + s * 2048, BOX_MN, 1024) : wgmma_desc(sb + s * 32, 16, 1024);
        mma_step(d, da, db, s > 0 || accumulate_first);
    }
}

// Synchronises the 128 threads of consumer `c` (named barrier 1 + c; 0 is __syncthreads).
__device__ __forceinline__ void consumer_sync(int c) {
    asm volatile("bar.sync %0, 128;" ::"r"(1 + c) : "memory");
}

// The group a tile belongs to (groups without tiles share their successor's first tile).
__device__ __forceinline__ int group_of(const GroupTable& t, int tile) {
    int g = 0;
    while (g + 1 < t.groups && t.g[g + 1].first_tile <= tile) ++g;
    return g;
}

// Tile `tile` of the launch: its group, its origin in the group (down the row tiles of one
// column tile first with M_FIRST: consecutive CTAs share B's tile; else along a row of column
// tiles) and its K steps. The producer and the consumers both walk the tiles with it.
struct Tile {
    int g, m0, n0, steps;
};
__device__ __forceinline__ Tile tile_at(const GroupTable& t, int tile) {
    Tile r;
    r.g = group_of(t, tile);
    const GroupInfo& gi = t.g[r.g];
    const int local = tile - gi.first_tile;
#if M_FIRST
    const int tiles_m = (gi.m + BM - 1) / BM;
    r.m0 = (local % tiles_m) * BM;
    r.n0 = (local / tiles_m) * BN;
#else
    r.m0 = (local / gi.tiles_n) * BM;
    r.n0 = (local % gi.tiles_n) * BN;
#endif
    r.steps = (gi.k + BK - 1) / BK;
    return r;
}

__device__ __forceinline__ float bias_at(unsigned long long p, int col) {
#if BIAS_T == 1
    return reinterpret_cast<const float*>(p)[col];
#elif BIAS_T == 2
    return to_f32(reinterpret_cast<const f16*>(p)[col]);
#elif BIAS_T == 3
    return to_f32(reinterpret_cast<const bf16*>(p)[col]);
#else
    return 0.0f;
#endif
}

#if OUT_T == 0
typedef float out_t;
#elif OUT_T == 1
typedef f16 out_t;
#else
typedef bf16 out_t;
#endif

// The bias of columns col and col + 1 (0 past D's edge, or without a bias).
__device__ __forceinline__ float2 bias_pair(const GroupInfo& gi, int col) {
    float2 b = make_float2(0.0f, 0.0f);
#if BIAS_T != 0
    if (col < gi.n) b.x = bias_at(gi.bias, col);
    if (col + 1 < gi.n) b.y = bias_at(gi.bias, col + 1);
#endif
    return b;
}

// Two adjacent outputs into the staging buffer, rounded to out_t.
__device__ __forceinline__ void put_pair(unsigned char* at, float v0, float v1) {
#if OUT_T == 0
    *reinterpret_cast<float2*>(at) = make_float2(v0, v1);
#else
    *reinterpret_cast<u32*>(at) = pack2_f32<out_t>(v0, v1);
#endif
}

extern "C" __global__ void __launch_bounds__(128 * (CONSUMERS + 1), 1)
    grouped_gemm_sm90(const __grid_constant__ GroupTable table) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // Stages on a 1024-byte boundary (the swizzle pattern's period), then the barriers.
    const u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const u32 bars = base + STAGES * STAGE_BYTES + CONSUMERS * STAGING_BYTES;
#define FULL(s) (bars + 8u * (s))
#define EMPTY(s) (bars + 8u * (STAGES + (s)))
    const int warpgroup = warpgroup_index();
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(FULL(s), 1);
            mbar_init(EMPTY(s), CONSUMERS * 4);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (warpgroup == 0) {
        regs_release<40>();
        if (threadIdx.x != 0) return;
        int stage = 0;
        u32 phase = 0;
        for (int tile = blockIdx.x; tile < table.tiles; tile += gridDim.x) {
            const Tile tl = tile_at(table, tile);
            const int g = tl.g, m0 = tl.m0, n0 = tl.n0;
            for (int kb = 0; kb < tl.steps; ++kb) {
                mbar_wait(EMPTY(stage), phase ^ 1);
                const u32 full = FULL(stage);
                mbar_arrive_expect(full, STAGE_BYTES);
                const u32 sa = base + stage * STAGE_BYTES, sb = sa + A_STAGE;
                const int k0 = kb * BK;
#if A_MN
                tma_load_2d(sa, &table.a[g], m0, k0, full);
                tma_load_2d(sa + BOX_MN, &table.a[g], m0 + 64, k0, full);
#else
                tma_load_2d(sa, &table.a[g], k0, m0, full);
#endif
#if B_MN
#pragma unroll
                for (int j = 0; j < BN / 64; ++j) tma_load_2d(sb + j * BOX_MN, &table.b[g], n0 + 64 * j, k0, full);
#else
                tma_load_2d(sb, &table.b[g], k0, n0, full);
#endif
                if (++stage == STAGES) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
        return;
    }

    regs_claim<232>();
    const int c = warpgroup - 1;
    // This consumer's epilogue staging, after the stages (1024-byte aligned).
    unsigned char* const staging = smem_raw + (base - smem_addr(smem_raw)) + STAGES * STAGE_BYTES + c * STAGING_BYTES;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
    int stage = 0;
    u32 phase = 0;
    float d[ACC];
#if SPLIT
    float part[ACC];
#endif
    for (int tile = blockIdx.x; tile < table.tiles; tile += gridDim.x) {
        const Tile tl = tile_at(table, tile);
        const int g = tl.g, m0 = tl.m0, n0 = tl.n0, steps = tl.steps;
        const GroupInfo& gi = table.g[g];
#pragma unroll
        for (int i = 0; i < ACC; ++i) d[i] = 0.0f;
        int held = -1;  // the stage whose MMAs may still read it (released one step later)
        for (int kb = 0; kb < steps; ++kb) {
            mbar_wait(FULL(stage), phase);
            const u32 s_addr = base + stage * STAGE_BYTES;
#if SPLIT
#pragma unroll
            for (int i = 0; i < ACC; ++i) acc_fence(part[i]);
            wgmma_fence();
            mma_stage(part, s_addr, c, 0);
            wgmma_commit();
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < ACC; ++i) {
                acc_fence(part[i]);
                d[i] += part[i];
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(EMPTY(stage));
#else
#pragma unroll
            for (int i = 0; i < ACC; ++i) acc_fence(d[i]);
            wgmma_fence();
            mma_stage(d, s_addr, c, 1);
            wgmma_commit();
#pragma unroll
            for (int i = 0; i < ACC; ++i) acc_fence(d[i]);
            wgmma_wait<1>();  // the previous stage's MMAs are done: give it back
            if (held >= 0) {
                __syncwarp();
                if (lane == 0) mbar_arrive(EMPTY(held));
            }
            held = stage;
#endif
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < ACC; ++i) acc_fence(d[i]);
        if (held >= 0) {
            __syncwarp();
            if (lane == 0) mbar_arrive(EMPTY(held));
        }

        // Epilogue: accumulator pair (4j + 2h, +1) is row 16 warp + lane / 4 + 8h, columns
        // 8j + 2 (lane % 4) and the next, of the consumer's 64 rows; scaled, biased and rounded
        // into the staging buffer a chunk of columns at a time, then written out.
#if AB_FP8
        const float scale = *reinterpret_cast<const float*>(gi.a_scale_inv) * *reinterpret_cast<const float*>(gi.b_scale_inv);
#else
        const float scale = 1.0f;
#endif
        const int tid = threadIdx.x % 128;
#if TMA_STORE
        // Chunks of 128 bytes of columns, double-buffered: the copy engine stores one (clipped
        // at D's edges) while the next is filled.
        constexpr int CW = 128 / (int)sizeof(out_t);
#pragma unroll
        for (int q = 0; q < BN / CW; ++q) {
            unsigned char* const buf = staging + (q & 1) * 8192;
            if (tid == 0) bulk_wait_read<1>();  // the store of two chunks ago has read `buf`
            consumer_sync(c);
#pragma unroll
            for (int jj = 0; jj < CW / 8; ++jj) {
                const int j = (CW / 8) * q + jj;
                const int cl = 8 * jj + 2 * (lane % 4);
                const float2 b = bias_pair(gi, n0 + CW * q + cl);
                const int byte = cl * (int)sizeof(out_t);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = warp * 16 + lane / 4 + 8 * h;
                    put_pair(buf + r * 128 + ((((byte >> 4) ^ r) & 7) << 4) + (byte & 15),
                             d[4 * j + 2 * h] * scale + b.x, d[4 * j + 2 * h + 1] * scale + b.y);
                }
            }
            fence_async_shared();  // these stores are read next by the copy engine
            consumer_sync(c);
            if (tid == 0) {
                tma_store_2d(&table.d[g], n0 + CW * q, m0 + c * 64, smem_addr(buf));
                bulk_commit();
            }
        }
#else
        const bool whole_pieces = ((long long)gi.n * sizeof(out_t)) % 16 == 0;
#pragma unroll
        for (int q = 0; q < BN / 64; ++q) {
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
                const int j = 8 * q + jj;
                const int cl = 8 * jj + 2 * (lane % 4);  // column within the chunk
                const float2 b = bias_pair(gi, n0 + 64 * q + cl);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = warp * 16 + lane / 4 + 8 * h;
                    put_pair(staging + r * STAGING_PITCH + cl * (int)sizeof(out_t), d[4 * j + 2 * h] * scale + b.x,
                             d[4 * j + 2 * h + 1] * scale + b.y);
                }
            }
            consumer_sync(c);
            // 64 rows x PIECES 16-byte pieces, 128 threads.
#pragma unroll
            for (int i = 0; i < 64 * PIECES / 128; ++i) {
                const int e = tid + 128 * i;
                const int r = e / PIECES, piece = e % PIECES;
                const int row = m0 + c * 64 + r;
                const int col = n0 + 64 * q + piece * (16 / (int)sizeof(out_t));
                if (row >= gi.m || col >= gi.n) continue;
                const unsigned char* src = staging + r * STAGING_PITCH + piece * 16;
                out_t* dst = reinterpret_cast<out_t*>(gi.d) + (long long)row * gi.n + col;
                if (whole_pieces && col + 16 / (int)sizeof(out_t) <= gi.n) {
                    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
                } else {
                    for (int x = 0; x < 16 / (int)sizeof(out_t) && col + x < gi.n; ++x) {
                        dst[x] = reinterpret_cast<const out_t*>(src)[x];
                    }
                }
            }
            consumer_sync(c);
        }
#endif
    }
#if TMA_STORE
    if ((threadIdx.x % 128) == 0) bulk_wait<0>();  // shared memory stays until the stores have read it
#endif
#undef FULL
#undef EMPTY
}
