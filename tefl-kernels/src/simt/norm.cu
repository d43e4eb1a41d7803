// RMSNorm / LayerNorm forward and backward.
// Defines: TX (x), TG (gamma, beta), TY (y in the forward, dy in the backward), TA (the
// residual gradient of rmsnorm_bwd_add), IS_LN, HAS_ADD, BLOCK (threads), ROW_VECS (vectors a
// thread keeps in registers), FUSED (1: the row lives in registers, read once; 0: scalar
// loops that read the row again).
// With FUSED, n % NV == 0 and n / NV <= BLOCK * ROW_VECS (the host checks).
// STAGES (the fused backward): row buffers of x and dy in dynamic shared memory (STAGES *
// n * (sizeof(TX) + sizeof(TY)) bytes, from the host), STAGES - 1 rows copied ahead; 0 (or
// undefined): the next row is held in registers instead.
// The fused backward writes each block's dgamma/dbeta partials to ws; with a nonzero epoch
// (a cooperative launch, CUDA) its blocks then sum them into dgamma/dbeta themselves, else
// norm_reduce_ws does in a second launch.
// OUT_FP8 (forward): y holds FP8 codes (TY = u8) of the normalised value times *qscale, in the
// format MANT / BIAS / MAXV / MAXCODE; the max |normalised value| goes to *amax (zeroed by the
// host) and 1/(*qscale) to *scale_inv.
// ZC: gamma is zero-centred (the scale is 1 + gamma). A compile-time switch, not a kernel
// argument: the run-time choice cost the RMSNorm forward time (H200, 2026-12-03, bench --only
// "rmsnorm_fwd 16384", diagnostic builds twice in turns: 4101-4102 GB/s with it, 4129-4132
// without; with rsqrtf below as well, against the build before, twice in turns: 4110-4121 ->
// 4130-4139).
// ROW_PER_BLOCK (the forward, not with OUT_FP8): the grid has a block per row, and a block
// takes only its own row (no grid-stride row loop).
// KEEP_L2 (the fused forward): x is loaded with an L2 evict_last policy and each line of the
// rows from release_from on is released once the row's outputs are stored (load_kept /
// release_after in the prelude).

#define NV (VEC_BYTES / (int)sizeof(TX))
#ifndef ROW_PER_BLOCK
#define ROW_PER_BLOCK 0
#endif
#if ROW_PER_BLOCK && OUT_FP8
#error "an FP8 output's blocks stride over the rows (their amax is reduced once a block)"
#endif
#ifndef KEEP_L2
#define KEEP_L2 0
#endif
#ifndef STAGES
#define STAGES 0
#endif
#ifndef ZC
#define ZC 0
#endif

__device__ __forceinline__ float gamma_at(const TG* g, int i) {
    const float v = to_f32(g[i]);
    return ZC ? 1.0f + v : v;
}

// On CUDA, registers are capped so that a full SM's threads (2048) fit: the forward is bound by
// load latency (Nsight Compute on the H100: 39 registers a thread, 6 blocks of 256 an SM, two
// thirds of the stalls waiting on loads). H100, bench, alternating in one run: rmsnorm
// 16384x8192 0.190 -> 0.186 ms, 8192x4096 0.053 -> 0.051, FP8 output 0.159 -> 0.145,
// layernorm 0.215 -> 0.203. Not for a layernorm of 16-bit rows with f32 gamma, whose
// registers would spill 400 bytes a thread at that cap (the bf16 one spills 84 bytes and is
// still faster). Other layernorms are capped at 1536 threads an SM, which leaves them room for
// the second pass over the row (H100, 2026-11-26, bench, layernorm fwd 16384x8192 bf16, two
// runs, blocks of 256 an SM: 8 0.203 / 0.203 ms, 7 0.203 / 0.204, 6 0.192 / 0.192, 5 0.199 /
// 0.200, 4 0.217 / 0.217; rmsnorm 0.186 at 8, 7 and 6, 0.191 at 5 and 4; H200, 2026-11-26,
// with one barrier per reduction, layernorm at 5 / 6 / 7 / 8 blocks: 0.165 / 0.156 / 0.174 /
// 0.175 ms, the same twice). (HIP's second bound means waves per SIMD: not set there.)
#if defined(TEFL_TARGET_CUDA)
#define FWD_MIN_BLOCKS ((IS_LN && sizeof(TG) == 4 && sizeof(TX) == 2) ? 1 : (IS_LN ? 1536 : 2048) / BLOCK)
#else
#define FWD_MIN_BLOCKS 1
#endif
extern "C" __global__ void __launch_bounds__(BLOCK, FWD_MIN_BLOCKS) norm_fwd(const TX* __restrict__ x, const TG* __restrict__ gamma,
                                                          const TG* __restrict__ beta, TY* __restrict__ y,
                                                          float* __restrict__ mu_out, float* __restrict__ rsigma,
                                                          int rows, int n, float eps,
                                                          const float* __restrict__ qscale, float* __restrict__ amax,
                                                          float* __restrict__ scale_inv, int release_from) {
    // The halves of block_sum_alternating (the fused path: one barrier per reduction; the
    // others use the first half). H200, 2026-11-26, bench, alternating with two barriers in one
    // run: rmsnorm 16384x8192 0.140 / 0.139 -> 0.137 / 0.137 ms, FP8 output 0.114 / 0.115 ->
    // 0.112 / 0.113; 8192x4096 and layernorm unchanged. (LayerNorm's two reductions as one of
    // Chan's count / mean / m2 triples took 0.154 -> 0.200 ms: the merges' divisions.)
    __shared__ float scratch[2 * MAX_WARPS];
#if FUSED
    int turn = 0;
#endif
#if OUT_FP8
    const float qs = *qscale;
    float am = 0.0f;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / qs;
#endif
#if ROW_PER_BLOCK
    // One row a block (the host's grid has a block per row): no row loop. H100, 2026-12-05,
    // diagnostic builds three times in turns (bench --only "rmsnorm_fwd 8192", each form its own
    // process): rmsnorm 8192x4096 0.0494 / 0.0494 / 0.0494 ms with the loop, 0.0489 / 0.0485 /
    // 0.0489 without; layernorm 16384x8192 0.1840-0.1842 -> 0.1831-0.1834; rmsnorm 16384x8192
    // unchanged (0.1801-0.1808 / 0.1800-0.1810).
    {
        const int row = blockIdx.x;
        if (row >= rows) return;
#else
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
#endif
        const TX* xr = x + (size_t)row * n;
        TY* yr = y + (size_t)row * n;
#if FUSED
        // The row as loaded: 16-bit rows take half the registers of f32 copies, so more blocks
        // fit on an SM and more of the row is in flight.
        alignas(16) TX c[ROW_VECS][NV];
        const int nvecs = n / NV;
        // Every load of the row is issued before any is used. With each vector's sum right
        // after its load, ptxas kept the loads in their branches and each waited for the one
        // before it to arrive (the SASS of the sm_90 rmsnorm: LDG, its use, then the next LDG),
        // so a row took ROW_VECS trips to memory one after another. H200, 2026-11-28, bench,
        // alternating twice in one run: rmsnorm 16384x8192 0.136-0.137 -> 0.134-0.135 ms,
        // 8192x4096 0.040 -> 0.038, FP8 output 0.112-0.113 -> 0.103-0.104, layernorm 0.155 ->
        // 0.136.
        // With KEEP_L2, held in L2 until the row's outputs are stored, then released (the
        // rows from release_from on).
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
#if KEEP_L2
            if (v < nvecs) load_kept<TX, NV>(c[it], xr + v * NV);
#else
            if (v < nvecs) raw_copy<TX, NV>(c[it], xr + v * NV);
#endif
        }
        float s = 0.0f;
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
                float xv[NV];
                unpack_n<TX, NV>(c[it], xv);
#pragma unroll
                for (int j = 0; j < NV; ++j) s += IS_LN ? xv[j] : xv[j] * xv[j];
            }
        }
        float mean = 0.0f;
#if IS_LN
        mean = block_sum_alternating(s, scratch, turn) / n;
        s = 0.0f;
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
                float xv[NV];
                unpack_n<TX, NV>(c[it], xv);
#pragma unroll
                for (int j = 0; j < NV; ++j) { const float d = xv[j] - mean; s += d * d; }
            }
        }
#endif
        // rsqrtf (2 ulp, as TE's and torch's norms use) rather than a rounded division by a
        // rounded root (H200, 2026-12-03, bench --only "rmsnorm_fwd 16384", diagnostic builds
        // twice in turns: 4101-4102 GB/s -> 4128-4134; see ZC above for the two together).
        const float r = rsqrtf(block_sum_alternating(s, scratch, turn) / n + eps);
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
                float g[NV], o[NV];
                load_n<TG, NV>(gamma + v * NV, g);
#if IS_LN
                float b[NV];
                load_n<TG, NV>(beta + v * NV, b);
#endif
#pragma unroll
                for (int j = 0; j < NV; ++j) {
                    const float gj = ZC ? 1.0f + g[j] : g[j];
                    // (each pair of x unpacked where its outputs are computed: the whole
                    // vector at once made the forward spill under its register cap)
                    float x0, x1;
                    unpack_pair<TX>(c[it], j / 2, x0, x1);
                    o[j] = ((j % 2 ? x1 : x0) - mean) * r * gj;
#if IS_LN
                    o[j] += b[j];
#endif
                }
#if OUT_FP8
                store_fp8_n<NV>(yr + v * NV, o, qs, am, MANT, BIAS, MAXV, MAXCODE);
#else
                store_n<TY, NV>(yr + v * NV, o);
#endif
#if KEEP_L2
                // Only the rows that can still be in L2 when the kernel ends (those from
                // release_from on, the host's pick) are released: earlier lines have been
                // evicted by later evict_last ones already, and their release cost time.
                if (row >= release_from) release_after(x, xr + v * NV, v == 0);
#endif
            }
        }
#else
        float s = 0.0f;
        for (int i = threadIdx.x; i < n; i += BLOCK) { const float v = to_f32(xr[i]); s += IS_LN ? v : v * v; }
        float mean = 0.0f;
#if IS_LN
        mean = block_sum(s, scratch) / n;
        s = 0.0f;
        for (int i = threadIdx.x; i < n; i += BLOCK) { const float d = to_f32(xr[i]) - mean; s += d * d; }
#endif
        const float r = rsqrtf(block_sum(s, scratch) / n + eps);
        for (int i = threadIdx.x; i < n; i += BLOCK) {
            float o = (to_f32(xr[i]) - mean) * r * gamma_at(gamma, i);
#if IS_LN
            o += to_f32(beta[i]);
#endif
#if OUT_FP8
            store_fp8_n<1>(yr + i, &o, qs, am, MANT, BIAS, MAXV, MAXCODE);
#else
            yr[i] = from_f32<TY>(o);
#endif
        }
#endif
        if (threadIdx.x == 0) {
            rsigma[row] = r;
            if (IS_LN) mu_out[row] = mean;
        }
    }
#if OUT_FP8
    amax_reduce_block(am, amax, scratch);
#endif
}

// dx per row; with FUSED each block also sums dgamma (and dbeta) over its rows into
// ws[blockIdx.x][0..n) (and ws[gridDim.x + blockIdx.x][..]).
// dx's NV elements at `dx_at`, plus the residual gradient's at `add_at` (HAS_ADD).
__device__ __forceinline__ void store_dx_at(float* o, const TA* __restrict__ add_at, TX* __restrict__ dx_at) {
#if HAS_ADD
    float av[NV];
    load_n<TA, NV>(add_at, av);
#pragma unroll
    for (int j = 0; j < NV; ++j) o[j] += av[j];
#endif
    store_n<TX, NV>(dx_at, o);
}
// The same at element `at` of dx (and of add).
__device__ __forceinline__ void store_dx(float* o, const TA* __restrict__ add, TX* __restrict__ dx, size_t at) {
    store_dx_at(o, HAS_ADD ? add + at : add, dx + at);
}

// With the ring (STAGES), registers are capped for RING_BLOCKS blocks an SM (the tune configs'
// norm_bwd.threads_per_sm), as its shared memory is sized for that many rings
// (tune::norm_bwd_stages).
#ifndef RING_BLOCKS
#define RING_BLOCKS 1
#endif
// The ring's LayerNorm row sums (Σ dy·γ·x̂ and Σ dy·γ) reduced as one pair behind one barrier.
#ifndef PAIR_SUMS
#define PAIR_SUMS 1
#endif
// Whether the ring's x̂ and dy·γ (2 * ROW_VECS * NV floats a thread) fit a quarter of the
// registers a thread has at RING_BLOCKS blocks an SM (64K a multiprocessor).
constexpr bool RING_HOLDS = 2 * ROW_VECS * NV * 4 * RING_BLOCKS * BLOCK <= 65536;
#if defined(TEFL_TARGET_CUDA) && STAGES > 0
#define BWD_MIN_BLOCKS RING_BLOCKS
#else
#define BWD_MIN_BLOCKS 1
#endif
extern "C" __global__ void __launch_bounds__(BLOCK, BWD_MIN_BLOCKS) norm_bwd(const TY* __restrict__ dy, const TX* __restrict__ x,
                                                          const float* __restrict__ mu, const float* __restrict__ rsigma,
                                                          const TG* __restrict__ gamma, const TA* __restrict__ add,
                                                          TX* __restrict__ dx, float* __restrict__ ws, int rows, int n,
                                                          unsigned long long* __restrict__ flags,
                                                          unsigned long long epoch, TG* __restrict__ dgamma,
                                                          TG* __restrict__ dbeta) {
    // One barrier per reduction in the fused path (block_sum_alternating; H200, 2026-11-26,
    // bench alternating with two barriers: rmsnorm bwd 16384x8192 0.273 / 0.274 -> 0.271 /
    // 0.270 ms).
    __shared__ float scratch[2 * MAX_WARPS];
#if FUSED && STAGES > 0
    // The LayerNorm's two row sums behind one barrier (PAIR_SUMS; 512 bytes, which the host's
    // 2048-byte allowance for static shared memory beside the ring covers).
    __shared__ float2 pair_scratch[IS_LN && PAIR_SUMS ? 2 * MAX_WARPS : 1];
#endif
    // The ring's row buffers (STAGES), and after the rows the grid-wide sums' slices.
    extern __shared__ uint4 smem_words[];
#if FUSED
    int turn = 0;
    const int nvecs = n / NV;
    float accg[ROW_VECS][NV], accb[ROW_VECS][NV], g[ROW_VECS][NV];
#pragma unroll
    for (int it = 0; it < ROW_VECS; ++it) {
        const int v = threadIdx.x + it * BLOCK;
#pragma unroll
        for (int j = 0; j < NV; ++j) { accg[it][j] = 0.0f; accb[it][j] = 0.0f; g[it][j] = 0.0f; }
        if (v < nvecs) {
            load_n<TG, NV>(gamma + v * NV, g[it]);
#pragma unroll
            for (int j = 0; j < NV; ++j) g[it][j] = ZC ? 1.0f + g[it][j] : g[it][j];
        }
    }
#endif
#if FUSED && STAGES > 0
    // Rows stream through a ring of STAGES row buffers in shared memory, STAGES - 1 rows ahead
    // of the one being reduced, each thread copying (asynchronously) exactly the vectors it
    // reads back, so no barrier guards the ring. The bytes in flight do not hold registers:
    // the register path below keeps one row ahead, at most one 512-thread block an SM (104
    // registers a thread), and an H200 needs more than that in flight to reach its bandwidth.
    unsigned char* ring = (unsigned char*)smem_words;
    const int stage_bytes = n * (int)(sizeof(TX) + sizeof(TY));
    // This thread's first vector of a stage's x (its dy dy_shift bytes on: a stage holds the
    // row's x, then its dy) and of a row in memory; every later address is one of these plus a
    // stride, carried from row to row (the rows a block takes are gridDim.x apart) instead of
    // computed again in 64 bits.
    const SharedBase my_ring = shared_base(ring + threadIdx.x * NV * sizeof(TX));
    const int dy_shift = n * (int)sizeof(TX) + threadIdx.x * NV * ((int)sizeof(TY) - (int)sizeof(TX));
    const size_t row_stride = (size_t)gridDim.x * n;
    const TX* x_next = x + (size_t)blockIdx.x * n + threadIdx.x * NV;
    const TY* dy_next = dy + (size_t)blockIdx.x * n + threadIdx.x * NV;
    long long issue_row = blockIdx.x;
    int issue_at = 0;  // the next stage's byte offset in the ring
    // The byte offset of the stage after the one at `at` (the ring wraps after STAGES).
    auto next_stage = [&](int at) { return at + stage_bytes == STAGES * stage_bytes ? 0 : at + stage_bytes; };
    // Copies the next of the block's rows into the next stage (an empty group past the end).
    auto issue = [&]() {
        if (issue_row < rows) {
#pragma unroll
            for (int it = 0; it < ROW_VECS; ++it) {
                if (threadIdx.x + it * BLOCK < nvecs) {
                    copy_async_at<NV * (int)sizeof(TX)>(my_ring, issue_at + it * BLOCK * NV * (int)sizeof(TX),
                                                        x_next + it * BLOCK * NV);
                    copy_async_at<NV * (int)sizeof(TY)>(my_ring, issue_at + dy_shift + it * BLOCK * NV * (int)sizeof(TY),
                                                        dy_next + it * BLOCK * NV);
                }
            }
        }
        copy_async_commit();
        issue_row += gridDim.x;
        x_next += row_stride;
        dy_next += row_stride;
        issue_at = next_stage(issue_at);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue();
    float next_r = 0.0f, next_m = 0.0f;
    if (blockIdx.x < rows) {
        next_r = rsigma[blockIdx.x];
        if (IS_LN) next_m = mu[blockIdx.x];
    }
    int read_at = 0;  // the stage being reduced
    TX* dx_row = dx + (size_t)blockIdx.x * n + threadIdx.x * NV;
    const TA* add_row = HAS_ADD ? add + (size_t)blockIdx.x * n + threadIdx.x * NV : add;
    // The row means as products (n's reciprocal once, not two divisions a row).
    const float inv_n = 1.0f / n;
#elif FUSED
    // The next row's x and dy are fetched (raw) before this row's reduction, so a block keeps
    // a row's loads in flight while it waits at the barriers; its rsigma (and mu) with them, so
    // that a row does not start by waiting for a load of its own.
    alignas(16) TX nx[ROW_VECS][NV];
    alignas(16) TY ndy[ROW_VECS][NV];
    float next_r = 0.0f, next_m = 0.0f;
    auto fetch = [&](int row) {
        const size_t base = (size_t)row * n;
        next_r = rsigma[row];
        if (IS_LN) next_m = mu[row];
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
                raw_copy<TX, NV>(nx[it], x + base + v * NV);
                raw_copy<TY, NV>(ndy[it], dy + base + v * NV);
            }
        }
    };
    if (blockIdx.x < rows) fetch(blockIdx.x);
#endif
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const size_t base = (size_t)row * n;
#if FUSED && STAGES > 0
        issue();
        const float r = next_r;
        const float m = IS_LN ? next_m : 0.0f;
        if (row + (int)gridDim.x < rows) {
            next_r = rsigma[row + gridDim.x];
            if (IS_LN) next_m = mu[row + gridDim.x];
        }
        const TX* sx = (const TX*)(my_ring.p + read_at);
        const TY* sdy = (const TY*)(my_ring.p + read_at + dy_shift);
        read_at = next_stage(read_at);
        copy_async_wait<STAGES - 1>();
        // x̂ = x·r - m·r: one multiply-add an element.
        const float neg_mr = -m * r;
        // x̂ and dy·γ stay in registers across the reductions where a quarter of the registers
        // the launch bounds leave a thread holds them (RING_HOLDS: one block of 512 an SM with two
        // 16-bit vectors a thread, or 1024 threads with one), so that dx is two multiply-adds an
        // element; else the second pass reads the row from shared memory again.
        float xh[ROW_VECS][NV], dg[ROW_VECS][NV];
        float sd = 0.0f, sdx = 0.0f;
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            if (threadIdx.x + it * BLOCK < nvecs) {
                float xv[NV], dv[NV];
                load_n<TX, NV>(sx + it * BLOCK * NV, xv);
                load_n<TY, NV>(sdy + it * BLOCK * NV, dv);
#pragma unroll
                for (int j = 0; j < NV; ++j) {
                    xh[it][j] = IS_LN ? fmaf(xv[j], r, neg_mr) : xv[j] * r;
                    dg[it][j] = dv[j] * g[it][j];
                    sd += dg[it][j];
                    sdx += dg[it][j] * xh[it][j];
                    accg[it][j] += dv[j] * xh[it][j];
                    accb[it][j] += dv[j];
                }
            }
        }
        float mean_dx, mean_d = 0.0f;
        if constexpr (IS_LN && PAIR_SUMS) {
            const float2 sums = block_sum_pair_alternating(sdx, sd, pair_scratch, turn);
            mean_dx = sums.x * inv_n;
            mean_d = sums.y * inv_n;
        } else {
            mean_dx = block_sum_alternating(sdx, scratch, turn) * inv_n;
            if (IS_LN) mean_d = block_sum_alternating(sd, scratch, turn) * inv_n;
        }
        // dx = r (dy·γ - mean_d - x̂ mean_dx) = r dy·γ + (x̂ c1 + c0).
        const float c1 = -r * mean_dx, c0 = -r * mean_d;
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            if (threadIdx.x + it * BLOCK < nvecs) {
                float o[NV];
                if constexpr (RING_HOLDS) {
#pragma unroll
                    for (int j = 0; j < NV; ++j) o[j] = fmaf(r, dg[it][j], fmaf(xh[it][j], c1, c0));
                } else {
                    float xv[NV], dv[NV];
                    load_n<TX, NV>(sx + it * BLOCK * NV, xv);
                    load_n<TY, NV>(sdy + it * BLOCK * NV, dv);
#pragma unroll
                    for (int j = 0; j < NV; ++j) o[j] = fmaf(r, dv[j] * g[it][j], fmaf(IS_LN ? fmaf(xv[j], r, neg_mr) : xv[j] * r, c1, c0));
                }
                store_dx_at(o, add_row + it * BLOCK * NV, dx_row + it * BLOCK * NV);
            }
        }
        dx_row += row_stride;
        if (HAS_ADD) add_row += row_stride;
#elif FUSED
        const float r = next_r;
        const float m = IS_LN ? next_m : 0.0f;
        float xh[ROW_VECS][NV], d[ROW_VECS][NV];
        float sd = 0.0f, sdx = 0.0f;
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
#pragma unroll
            for (int j = 0; j < NV; ++j) { xh[it][j] = to_f32(nx[it][j]); d[it][j] = to_f32(ndy[it][j]); }
        }
        if (row + (int)gridDim.x < rows) fetch(row + gridDim.x);
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
#pragma unroll
                for (int j = 0; j < NV; ++j) {
                    const float dyv = d[it][j];
                    xh[it][j] = (xh[it][j] - m) * r;
                    d[it][j] = dyv * g[it][j];
                    sd += d[it][j];
                    sdx += d[it][j] * xh[it][j];
                    accg[it][j] += dyv * xh[it][j];
                    accb[it][j] += dyv;
                }
            }
        }
        const float mean_dx = block_sum_alternating(sdx, scratch, turn) / n;
        const float mean_d = IS_LN ? block_sum_alternating(sd, scratch, turn) / n : 0.0f;
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
                float o[NV];
#pragma unroll
                for (int j = 0; j < NV; ++j) o[j] = r * (d[it][j] - mean_d - xh[it][j] * mean_dx);
                store_dx(o, add, dx, base + v * NV);
            }
        }
#else
        const float r = rsigma[row];
        const float m = IS_LN ? mu[row] : 0.0f;
        float sd = 0.0f, sdx = 0.0f;
        for (int i = threadIdx.x; i < n; i += BLOCK) {
            const float dv = to_f32(dy[base + i]) * gamma_at(gamma, i);
            sd += dv;
            sdx += dv * (to_f32(x[base + i]) - m) * r;
        }
        const float mean_dx = block_sum(sdx, scratch) / n;
        const float mean_d = IS_LN ? block_sum(sd, scratch) / n : 0.0f;
        for (int i = threadIdx.x; i < n; i += BLOCK) {
            const float dv = to_f32(dy[base + i]) * gamma_at(gamma, i);
            float o = r * (dv - mean_d - (to_f32(x[base + i]) - m) * r * mean_dx);
#if HAS_ADD
            o += to_f32(add[base + i]);
#endif
            dx[base + i] = from_f32<TX>(o);
        }
#endif
    }
#if FUSED
#pragma unroll
    for (int it = 0; it < ROW_VECS; ++it) {
        const int v = threadIdx.x + it * BLOCK;
        // Whole vectors (n is a whole number of them): element by element each warp's store
        // touched 32 sectors for 128 bytes, and the partials' stores took 7% of the LayerNorm
        // backward's warp stall samples (Nsight Compute, H200, 2026-12-02).
        if (v < nvecs) {
            store_n<float, NV>(ws + (size_t)blockIdx.x * n + v * NV, accg[it]);
            if (IS_LN) store_n<float, NV>(ws + (size_t)(gridDim.x + blockIdx.x) * n + v * NV, accb[it]);
        }
    }
#if defined(HAS_GRID_FLAGS)
    // In a cooperative launch (epoch != 0; the host passes 0 otherwise and sums ws with
    // norm_reduce_ws), the blocks sum the partials themselves once all are written, which
    // saves that second launch: each block raises its flag in `flags` to this call's epoch
    // (a value no earlier call used, so whatever the buffer held before cannot pass for it)
    // and waits until every block's flag holds it; then block b takes the columns
    // [32 b, 32 b + 32), [32 (b + grid), ...), ..., lane l column l of each, warp w the parts
    // w, w + warps, ..., and the warps' slices are added in shared memory (2 * BLOCK floats,
    // which the host provides).
    if (epoch != 0) {
#if STAGES > 0
        copy_async_wait<0>();
#endif
        __syncthreads();
        if (threadIdx.x == 0) flag_publish(flags + blockIdx.x, epoch);
        for (int b = threadIdx.x; b < (int)gridDim.x; b += BLOCK)
            while (flag_read(flags + b) != epoch) {
            }
        __syncthreads();
        float* slices = (float*)smem_words;
        constexpr int WARPS = BLOCK / WARP_SIZE;
        const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, parts = gridDim.x;
        for (int c0 = blockIdx.x * WARP_SIZE; c0 < n; c0 += gridDim.x * WARP_SIZE) {
            const int c = c0 + lane;
            float sg = 0.0f, sb = 0.0f;
            if (c < n) {
                for (int b = warp; b < parts; b += WARPS) {
                    sg += load_coherent(ws + (size_t)b * n + c);
                    if (IS_LN) sb += load_coherent(ws + (size_t)(parts + b) * n + c);
                }
            }
            slices[threadIdx.x] = sg;
            slices[BLOCK + threadIdx.x] = sb;
            __syncthreads();
            if (warp == 0 && c < n) {
                sg = 0.0f;
                sb = 0.0f;
                for (int w = 0; w < WARPS; ++w) {
                    sg += slices[w * WARP_SIZE + lane];
                    sb += slices[BLOCK + w * WARP_SIZE + lane];
                }
                dgamma[c] = from_f32<TG>(sg);
                if (IS_LN) dbeta[c] = from_f32<TG>(sb);
            }
            __syncthreads();
        }
    }
#endif
#endif
}

// Without FUSED: the column sums straight from the inputs, one thread per column.
extern "C" __global__ void norm_bwd_cols(const TY* __restrict__ dy, const TX* __restrict__ x,
                                         const float* __restrict__ mu, const float* __restrict__ rsigma,
                                         TG* __restrict__ dgamma, TG* __restrict__ dbeta, int rows, int n) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float sg = 0.0f, sb = 0.0f;
    for (int row = 0; row < rows; ++row) {
        const size_t i = (size_t)row * n + c;
        const float dv = to_f32(dy[i]);
        sg += dv * (to_f32(x[i]) - (IS_LN ? mu[row] : 0.0f)) * rsigma[row];
        sb += dv;
    }
    dgamma[c] = from_f32<TG>(sg);
    if (IS_LN) dbeta[c] = from_f32<TG>(sb);
}

// With FUSED: dgamma[c] = Σ_b ws[b][c] (and dbeta from the second half). A block of
// RED_COLS * RED_SLICES threads takes RED_COLS columns: thread t sums column t % RED_COLS over
// every RED_SLICES-th part from t / RED_COLS (RED_COLS threads in a row read 128 consecutive
// bytes of a part), and the slices are added in shared memory. (One thread per column over all
// the parts took 12 us for 264 parts of 8192 columns on the H200, 27 us for 528: 32 blocks,
// each a chain of dependent adds.) The host launches ceil(n / RED_COLS) blocks of 256.
#define RED_COLS 32
#define RED_SLICES 8
extern "C" __global__ void __launch_bounds__(RED_COLS * RED_SLICES)
    norm_reduce_ws(const float* __restrict__ ws, TG* __restrict__ dgamma, TG* __restrict__ dbeta, int parts, int n) {
    __shared__ float slices[2][RED_SLICES][RED_COLS + 1];
    const int col = threadIdx.x % RED_COLS, slice = threadIdx.x / RED_COLS;
    const int c = blockIdx.x * RED_COLS + col;
    float sg = 0.0f, sb = 0.0f;
    if (c < n) {
        for (int b = slice; b < parts; b += RED_SLICES) {
            sg += ws[(size_t)b * n + c];
            if (IS_LN) sb += ws[(size_t)(parts + b) * n + c];
        }
    }
    slices[0][slice][col] = sg;
    slices[1][slice][col] = sb;
    __syncthreads();
    if (slice == 0 && c < n) {
        sg = 0.0f;
        sb = 0.0f;
#pragma unroll
        for (int k = 0; k < RED_SLICES; ++k) {
            sg += slices[0][k][col];
            sb += slices[1][k][col];
        }
        dgamma[c] = from_f32<TG>(sg);
        if (IS_LN) dbeta[c] = from_f32<TG>(sb);
    }
}
