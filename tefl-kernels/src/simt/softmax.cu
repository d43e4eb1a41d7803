// The fused softmax variants: one block per row of sk elements, the row kept in registers
// (16-byte vectors) when it fits (FUSED), scalar passes otherwise.
// Defines: TX (x / y), TG (dy in the backward), MASK (0 none, 1 mask tensor, 2 upper
// triangular j > i, 3 bottom-right aligned causal j > i + sk - sq), BLOCK, ROW_VECS, FUSED,
// VEC_BYTES, PAIR_MAX (the fused unmasked forward of 16-bit rows: the max on packed pairs),
// KEEP_L2 (the fused backward holds y and dy in L2 while a row is in use; below).

#define NV (VEC_BYTES / (int)sizeof(TX))
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ bool masked(const u8* mask, int row, int j, int h, int sq, int sk, int mask_batch) {
    const int i = row % sq;
#if MASK == 1
    const int b = mask_batch == 1 ? 0 : row / (h * sq);
    return mask[((size_t)b * sq + i) * sk + j] != 0;
#elif MASK == 2
    return j > i;
#elif MASK == 3
    return j > i + sk - sq;
#else
    return false;
#endif
}

#if PAIR_MAX
template <typename T> __device__ __forceinline__ u32 neg_inf_pair();
template <> __device__ __forceinline__ u32 neg_inf_pair<bf16>() { return 0xff80ff80u; }
template <> __device__ __forceinline__ u32 neg_inf_pair<f16>() { return 0xfc00fc00u; }
// Loads this thread's vectors of the row into c and returns the lane-wise max of their pairs
// (of the negated values when NEG), NaN if any is NaN, (-inf, -inf) for a thread with none.
template <bool NEG>
__device__ __forceinline__ u32 load_row_pair_max(TX (&c)[ROW_VECS][NV], const TX* __restrict__ xr, int nvecs) {
    u32 mx = neg_inf_pair<TX>();
#pragma unroll
    for (int it = 0; it < ROW_VECS; ++it) {
        const int v = threadIdx.x + it * BLOCK;
        if (v < nvecs) {
            raw_copy<TX, NV>(c[it], xr + v * NV);
            const u32* w = (const u32*)c[it];
#pragma unroll
            for (int j = 0; j < NV / 2; ++j) mx = max2_nan<TX>(mx, NEG ? w[j] ^ 0x80008000u : w[j]);
        }
    }
    return mx;
}
#endif

// On CUDA the fused forward is capped at 32 registers a thread (2048 threads an SM) when its
// row copy takes at most 16 of them: more rows in flight hide the two block reductions (H100,
// 2026-11-26, bench, softmax 16384x8192 bf16, blocks of 256 x 4 vectors: 0.218 ms uncapped,
// 0.217 at 6 blocks an SM, 0.208 at 8). Not with a mask (the 16-bit ones spill 76-248 bytes
// at 4 vectors) or longer row copies. (HIP's second bound means waves per SIMD: not set there.)
#if defined(TEFL_TARGET_CUDA) && FUSED && MASK == 0
#define FWD_MIN_BLOCKS (ROW_VECS * VEC_BYTES <= 64 ? 2048 / BLOCK : 1)
#else
#define FWD_MIN_BLOCKS 1
#endif
extern "C" __global__ void __launch_bounds__(BLOCK, FWD_MIN_BLOCKS) softmax_fwd(const TX* __restrict__ x, const u8* __restrict__ mask,
                                                             TX* __restrict__ y, int rows, int sq, int sk, int h,
                                                             int mask_batch, float scale) {
    __shared__ float scratch[MAX_WARPS];
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const TX* xr = x + (size_t)row * sk;
        TX* yr = y + (size_t)row * sk;
#if FUSED
        // The row as loaded (16-bit rows take half the registers of f32 copies: more blocks per
        // SM); exp(scale x - m) = exp2(scale2 x - m2) by one FFMA and one ex2, computed for the
        // sum and again for the output. The forward is issue-bound on the H200 (Nsight Compute,
        // 2026-11-27: 83% of issue slots, 37 instructions an element), so each element costs
        // as few instructions as it can.
        const int nvecs = sk / NV;
        const float scale2 = scale * 1.4426950408889634f;
        alignas(16) TX c[ROW_VECS][NV];
#if PAIR_MAX
        // max(scale2 x) = |scale2| max(x), or |scale2| max(-x) for a negative scale, taken on the
        // raw 16-bit pairs: one instruction a pair, no conversion.
        const u32 pair = scale2 < 0.0f ? load_row_pair_max<true>(c, xr, nvecs) : load_row_pair_max<false>(c, xr, nvecs);
        const float px = max_nan(lo_f32<TX>(pair), hi_f32<TX>(pair));
        float m = px == NEG_INF ? NEG_INF : fabsf(scale2) * px;
#else
        float m = NEG_INF;
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
                raw_copy<TX, NV>(c[it], xr + v * NV);
#pragma unroll
                for (int j = 0; j < NV; ++j)
                    if (!masked(mask, row, v * NV + j, h, sq, sk, mask_batch)) m = max_nan(m, to_f32(c[it][j]) * scale2);
            }
        }
#endif
        m = block_max(m, scratch);
        // A row with nothing unmasked (or every entry -inf) has the max -inf: exponents against
        // 0 then give 0 for every entry that counts, a zero sum and zero outputs.
        const float m0 = m == NEG_INF ? 0.0f : m;
        // exp of element j of vector it; -0 where masked (an exponential is never -0, so the
        // output pass tells a masked entry from a visible one that underflowed to +0).
        auto e = [&](int it, int v, int j) {
#if MASK == 0
            return fast_exp2(fmaf(to_f32(c[it][j]), scale2, -m0));
#else
            return masked(mask, row, v * NV + j, h, sq, sk, mask_batch) ? -0.0f
                                                                        : fast_exp2(fmaf(to_f32(c[it][j]), scale2, -m0));
#endif
        };
        float s = 0.0f;
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
#pragma unroll
                for (int j = 0; j < NV; ++j) s += e(it, v, j);
            }
        }
        s = block_sum(s, scratch);
        const float inv = recip_or_zero(s);
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
                float o[NV];
#pragma unroll
                for (int j = 0; j < NV; ++j) {
#if MASK == 0
                    // A NaN or +inf in the row makes the sum, and so every output, NaN.
                    o[j] = e(it, v, j) * inv;
#else
                    // Masked entries (e = -0) stay 0 even when a NaN or +inf made inv NaN;
                    // visible ones are NaN then, 0 · NaN included, as in the reference.
                    const float ej = e(it, v, j);
                    o[j] = __float_as_uint(ej) == 0x80000000u ? 0.0f : ej * inv;
#endif
                }
                store_n<TX, NV>(yr + v * NV, o);
            }
        }
#else
        float m = NEG_INF;
        for (int j = threadIdx.x; j < sk; j += BLOCK)
            if (!masked(mask, row, j, h, sq, sk, mask_batch)) m = max_nan(m, to_f32(xr[j]) * scale);
        m = block_max(m, scratch);
        float s = 0.0f;
        if (m != NEG_INF)
            for (int j = threadIdx.x; j < sk; j += BLOCK)
                if (!masked(mask, row, j, h, sq, sk, mask_batch)) s += expf(to_f32(xr[j]) * scale - m);
        s = block_sum(s, scratch);
        const float inv = recip_or_zero(s);
        for (int j = threadIdx.x; j < sk; j += BLOCK) {
            const bool off = m == NEG_INF || masked(mask, row, j, h, sq, sk, mask_batch);
            yr[j] = from_f32<TX>(off ? 0.0f : expf(to_f32(xr[j]) * scale - m) * inv);
        }
#endif
    }
}

// dx = scale * y * (dy - Σ dy·y), dx in y's dtype.
// KEEP_L2 (the fused backward): y and dy are loaded with an L2 evict_last policy, and each line
// of the rows from release_from on is released once the row's dx is stored (load_kept /
// release_after in the prelude), as torch.compile's Triton kernel loads them (evict_last, with
// no release). H200, 2026-12-03, bench --only "copy,softmax_bwd" (16384x8192 bf16), each form
// twice in turns (diagnostic builds): plain 0.198 (the machine's first run) / 0.191 ms, both
// kept with the last 64 MiB of rows released 0.190 / 0.189, both kept and never released 0.187 /
// 0.187, y alone kept 0.193 / 0.192, dy alone 0.198 / 0.192; Triton's kernel 0.188. (Every row
// released had lost: 0.196-0.199 on 2026-12-02.)
#ifndef KEEP_L2
#define KEEP_L2 0
#endif
extern "C" __global__ void __launch_bounds__(BLOCK) softmax_bwd(const TG* __restrict__ dy, const TX* __restrict__ y,
                                                             TX* __restrict__ dx, int rows, int sk, float scale,
                                                             int release_from) {
    __shared__ float scratch[MAX_WARPS];
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const size_t base = (size_t)row * sk;
#if FUSED
        // The rows as loaded (16-bit rows in half the registers of f32 copies: no spill at 4
        // vectors, more blocks an SM), converted where used; dx = y (scale dy - scale s).
        const int nvecs = sk / NV;
        alignas(16) TX yc[ROW_VECS][NV];
        alignas(16) TG dc[ROW_VECS][NV];
        // Every load of the two rows is issued before any is used, as in the norm forward: with
        // each vector's products right after its loads, ptxas kept the loads in their `v <
        // nvecs` branches and issued a vector's loads only once the one before had arrived
        // (the sm_90 SASS of the 512-thread, two-vector variant: one trip to memory a vector).
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
#if KEEP_L2
                load_kept<TX, NV>(yc[it], y + base + v * NV);
                load_kept<TG, NV>(dc[it], dy + base + v * NV);
#else
                raw_copy<TX, NV>(yc[it], y + base + v * NV);
                raw_copy<TG, NV>(dc[it], dy + base + v * NV);
#endif
            }
        }
        float s = 0.0f;
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
#pragma unroll
                for (int j = 0; j < NV; ++j) s = fmaf(to_f32(yc[it][j]), to_f32(dc[it][j]), s);
            }
        }
        const float neg_scaled_sum = -scale * block_sum(s, scratch);
#pragma unroll
        for (int it = 0; it < ROW_VECS; ++it) {
            const int v = threadIdx.x + it * BLOCK;
            if (v < nvecs) {
                float o[NV];
#pragma unroll
                for (int j = 0; j < NV; ++j) o[j] = to_f32(yc[it][j]) * fmaf(to_f32(dc[it][j]), scale, neg_scaled_sum);
                store_n<TX, NV>(dx + base + v * NV, o);
#if KEEP_L2
                // Only the rows that can still be in L2 when the kernel ends.
                if (row >= release_from) {
                    release_after(y, y + base + v * NV, v == 0);
                    release_after(dy, dy + base + v * NV, v == 0);
                }
#endif
            }
        }
#else
        float s = 0.0f;
        for (int j = threadIdx.x; j < sk; j += BLOCK) s += to_f32(y[base + j]) * to_f32(dy[base + j]);
        s = block_sum(s, scratch);
        for (int j = threadIdx.x; j < sk; j += BLOCK)
            dx[base + j] = from_f32<TX>(scale * to_f32(y[base + j]) * (to_f32(dy[base + j]) - s));
#endif
    }
}
