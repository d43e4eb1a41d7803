// Rotary position embedding, forward and backward (the transpose of the forward). rope_warp
// (below) serves heads whose vectors tile a warp; rope_vec and rope, one block per token row,
// the rest. In those the row's cos/sin (one per rotated dim, shared by every head) are computed
// once into shared memory (dynamic, 8 * d_rot bytes). Defines: ROPE_KERNEL (0 rope, 1 rope_vec,
// 2 rope_warp: the one kernel compiled), TX, LAYOUT (0 bshd, 1 sbhd, 2 thd), INTERLEAVED,
// BACKWARD.

// The (sequence, position) of token row `row` and whether it belongs to a sequence (thd rows
// past the last cu_seqlens entry do not); `*pos` is the position plus the sequence's start.
__device__ __forceinline__ bool row_position(int row, const i32* cu, const i32* starts, int batch, int s, int* pos) {
    int b, p;
    bool ok = true;
#if LAYOUT == 0
    b = row / s; p = row % s;
#elif LAYOUT == 1
    p = row / batch; b = row % batch;
#else
    int lo = 0, hi = batch - 1; // the last sequence whose start is <= row
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= row) lo = mid; else hi = mid - 1;
    }
    b = lo; p = row - cu[b];
    ok = p >= 0 && p < cu[b + 1] - cu[b];
#endif
    *pos = p + (starts ? starts[b] : 0);
    return ok;
}

// cos / sin of the row's angles into cs (cos at [c], sin at [d_rot + c]) once the previous
// row's readers are done; every thread of the block calls it.
__device__ __forceinline__ void row_angles(float* cs, const float* freqs, int pos, int d_rot, bool ok) {
    __syncthreads();
    if (ok) {
        const float* f = freqs + (size_t)pos * d_rot;
        for (int c = threadIdx.x; c < d_rot; c += blockDim.x) sincosf(f[c], &cs[d_rot + c], &cs[c]);
    }
    __syncthreads();
}

#if ROPE_KERNEL == 0
extern "C" __global__ void rope(const TX* __restrict__ x, const float* __restrict__ freqs, TX* __restrict__ y,
                                const i32* __restrict__ cu, const i32* __restrict__ starts, int rows, int batch, int s,
                                int h, int d, int d_rot) {
    extern __shared__ float cs[]; // cos at [c], sin at [d_rot + c]
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        int pos;
        const bool ok = row_position(row, cu, starts, batch, s, &pos);
        row_angles(cs, freqs, pos, d_rot, ok);
        const TX* xr = x + (size_t)row * h * d;
        TX* yr = y + (size_t)row * h * d;
        const int half = d_rot / 2;
        for (int idx = threadIdx.x; idx < h * d; idx += blockDim.x) {
            const int c = idx % d, base = idx - c;
            if (!ok || c >= d_rot) { yr[idx] = xr[idx]; continue; }
#if INTERLEAVED
            const bool first = (c % 2) == 0;
            const int other = first ? c + 1 : c - 1;
#else
            const bool first = c < half;
            const int other = first ? c + half : c - half;
#endif
            const float v = to_f32(xr[base + c]), w = to_f32(xr[base + other]);
            float out;
#if BACKWARD
            // first: g0 c0 + g1 s1; second: g1 c1 - g0 s0 (s of the partner's angle).
            out = first ? v * cs[c] + w * cs[d_rot + other] : v * cs[c] - w * cs[d_rot + other];
#else
            out = first ? v * cs[c] - w * cs[d_rot + c] : v * cs[c] + w * cs[d_rot + c];
#endif
            yr[idx] = from_f32<TX>(out);
        }
    }
}

#endif

// The vector path: D (head dim) and DROT (rotated dims) known at compile time, 16-byte
// accesses. A slot is one vector of a head: a rotated vector of the first half together with
// its partner of the second half (or, interleaved, the pairs inside one vector), or a vector
// past DROT that is copied. A block takes GROUP rows that share one position (GROUP > 1 only
// for bshd / sbhd without start positions, batch a multiple of GROUP: batch entries
// GROUP g0 .. GROUP g0 + GROUP - 1 at one position), so the cos/sin of a position are computed
// once for all of them. A thread fetches its first slot of every row before the angles are
// computed, so those loads overlap that work. The host checks that D and DROT / 2 (halves) or
// DROT (interleaved) are whole vectors.
#define VE (16 / (int)sizeof(TX))
#if INTERLEAVED
#define NROT (DROT / VE)
#else
#define NROT (DROT / 2 / VE)
#endif
#define SLOTS (NROT + (D - DROT) / VE)
#ifndef GROUP
#define GROUP 1
#endif

// The first row of block item `item` (an item is GROUP rows of one position); its row g is
// g * row_step(s) rows further.
__device__ __forceinline__ int item_row(int item, int batch, int s) {
#if GROUP == 1
    return item;
#else
    const int groups = batch / GROUP, p = item / groups, b = (item % groups) * GROUP;
#if LAYOUT == 0
    return b * s + p;
#else
    return p * batch + b;
#endif
#endif
}
__device__ __forceinline__ int row_step(int s) { return LAYOUT == 0 ? s : 1; }

#if ROPE_KERNEL == 1
// At most 256 threads; registers are capped so that 5 blocks of one row (4 of several) share an
// SM: a row is little work between two barriers, and more resident rows keep more loads in
// flight. (H200, s4096 b4 h32 d128 bf16, one run each: 2 rows a block with 4 blocks an SM
// 0.082 ms; 4 rows with 3 blocks 0.087 (Nsight Compute: 80 registers, 37.5% occupancy, half
// the stalls waiting on loads), 4 with 4 0.114, 2 with 5 0.110, 1 row with 5 0.101.)
extern "C" __global__ void __launch_bounds__(256, GROUP == 1 ? 5 : 4)
    rope_vec(const TX* __restrict__ x, const float* __restrict__ freqs, TX* __restrict__ y, const i32* __restrict__ cu,
             const i32* __restrict__ starts, int rows, int batch, int s, int h) {
    extern __shared__ float cs[]; // cos at [c], sin at [DROT + c]
    constexpr int HALF_ROT = DROT / 2;
    const int items = rows / GROUP;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        int pos;
        // Every row of the item has this position (and belongs to a sequence or not alike).
        const int row0 = item_row(item, batch, s);
        const bool ok = row_position(row0, cu, starts, batch, s, &pos);
        const size_t g_stride = (size_t)row_step(s) * h * D;  // elements from one row of the item to the next
        // The slot's rotated pair starts at c0 (and c0 + HALF_ROT); a copied vector at c0.
        auto place = [&](int slot, int g, size_t* base, int* c0, bool* rot) {
            const int head = slot / SLOTS, k = slot % SLOTS;
            *base = ((size_t)row0 * h + head) * D + g * g_stride;
            *rot = ok && k < NROT;
            *c0 = k < NROT ? k * VE : DROT + (k - NROT) * VE;
        };
        alignas(16) TX first_v[GROUP][VE], first_w[GROUP][VE];
        const int slot0 = threadIdx.x;
        if (slot0 < h * SLOTS) {
#pragma unroll
            for (int g = 0; g < GROUP; ++g) {
                size_t base; int c0; bool rot;
                place(slot0, g, &base, &c0, &rot);
                raw_copy<TX, VE>(first_v[g], x + base + c0);
                if (!INTERLEAVED && rot) raw_copy<TX, VE>(first_w[g], x + base + c0 + HALF_ROT);
            }
        }
        row_angles(cs, freqs, pos, DROT, ok);
        for (int slot = slot0; slot < h * SLOTS; slot += blockDim.x) {
#pragma unroll
            for (int g = 0; g < GROUP; ++g) {
                size_t base; int c0; bool rot;
                place(slot, g, &base, &c0, &rot);
                alignas(16) TX rv[VE], rw[VE];
                if (slot == slot0) {
                    raw_copy<TX, VE>(rv, first_v[g]);
                    if (!INTERLEAVED && rot) raw_copy<TX, VE>(rw, first_w[g]);
                } else {
                    raw_copy<TX, VE>(rv, x + base + c0);
                    if (!INTERLEAVED && rot) raw_copy<TX, VE>(rw, x + base + c0 + HALF_ROT);
                }
                if (!rot) {
                    raw_copy<TX, VE>(y + base + c0, rv);
                    continue;
                }
                float v[VE];
#pragma unroll
                for (int q = 0; q < VE; ++q) v[q] = to_f32(rv[q]);
#if INTERLEAVED
                float o[VE];
#pragma unroll
                for (int q = 0; q < VE; q += 2) {
                    const int c = c0 + q;
                    const float x0 = v[q], x1 = v[q + 1];
#if BACKWARD
                    o[q] = x0 * cs[c] + x1 * cs[DROT + c + 1];
                    o[q + 1] = x1 * cs[c + 1] - x0 * cs[DROT + c];
#else
                    o[q] = x0 * cs[c] - x1 * cs[DROT + c];
                    o[q + 1] = x1 * cs[c + 1] + x0 * cs[DROT + c + 1];
#endif
                }
                store_n<TX, VE>(y + base + c0, o);
#else
                float w[VE], o1[VE], o2[VE];
#pragma unroll
                for (int q = 0; q < VE; ++q) w[q] = to_f32(rw[q]);
#pragma unroll
                for (int q = 0; q < VE; ++q) {
                    const int c = c0 + q, c2 = c + HALF_ROT;
#if BACKWARD
                    o1[q] = v[q] * cs[c] + w[q] * cs[DROT + c2];
                    o2[q] = w[q] * cs[c2] - v[q] * cs[DROT + c];
#else
                    o1[q] = v[q] * cs[c] - w[q] * cs[DROT + c];
                    o2[q] = w[q] * cs[c2] + v[q] * cs[DROT + c2];
#endif
                }
                store_n<TX, VE>(y + base + c0, o1);
                store_n<TX, VE>(y + base + c0 + HALF_ROT, o2);
#endif
            }
        }
    }
}

#endif

#if ROPE_KERNEL == 2
// The warp path: no shared memory and no block barrier. A warp takes HEADS heads of one token
// row; lane l keeps vector l % SV of every head it takes (SV = D / VE vectors a head, a power of
// two <= the warp width, checked by the host), so it computes its VE angles' cos / sin once and
// applies them to (HEADS · SV / WARP_SIZE) vectors: out[q] = v[q] · a[q] + w[q] · b[q], where v
// is the vector, w its rotation partner (the other half's vector, or the pair's other element
// when interleaved) and a, b fold in the direction and sign. UNROLL vectors a lane are loaded
// before any is written.
#define SV (D / VE)
#ifndef HEADS
#define HEADS 32
#endif
#ifndef UNROLL
#define UNROLL 8
#endif
// KEEP_L2: x is loaded with an L2 evict_last policy, and the lines of the token rows from
// release_from on are released once their outputs are stored (load_kept / release_after in the
// prelude), as the RMSNorm forward does: H200, 2026-12-03, bench --only "copy,rope" (s4096 b4
// h32 d128 bf16), twice in turns: 3808 / 3832 GB/s plain, 3874 / 3866 kept with the rows of
// the last 64 MiB released (a diagnostic build); as built here against the build before, twice
// in turns: 3783 / 3788 -> 3889 / 3905.
#ifndef KEEP_L2
#define KEEP_L2 0
#endif
extern "C" __global__ void __launch_bounds__(128)
    rope_warp(const TX* __restrict__ x, const float* __restrict__ freqs, TX* __restrict__ y, const i32* __restrict__ cu,
              const i32* __restrict__ starts, int rows, int batch, int s, int h, int release_from) {
    constexpr int HALF_ROT = DROT / 2;
    constexpr int STEP = WARP_SIZE / SV;  // heads a warp-wide access covers
    const int lane = lane_id();
    const int c0 = (lane % SV) * VE;  // this lane's first column of a head
    const int chunks = (h + HEADS - 1) / HEADS;
    const long long items = (long long)rows * chunks;
    const long long warps = (long long)gridDim.x * (blockDim.x / WARP_SIZE);
    for (long long item = (long long)blockIdx.x * (blockDim.x / WARP_SIZE) + warp_id(); item < items; item += warps) {
        const int row = (int)(item / chunks), head0 = (int)(item % chunks) * HEADS;
        const int head_end = min(h, head0 + HEADS);
        int pos;
        const bool ok = row_position(row, cu, starts, batch, s, &pos);
        const bool rot = ok && c0 < DROT;
#if INTERLEAVED
        const int pc0 = c0;  // the partner is inside the vector
#else
        const int pc0 = c0 < HALF_ROT ? c0 + HALF_ROT : c0 - HALF_ROT;
#endif
        const TX* xr = x + (size_t)row * h * D;
        TX* yr = y + (size_t)row * h * D;
        // UNROLL vectors a lane, loaded before any is used; the first ones are issued before the
        // angles are computed, so that their trip from memory overlaps the sines and cosines.
        // The heads are stepped through warp-uniformly (head0 + i · STEP + lane / SV), so every
        // lane takes part in each shuffle below.
        alignas(16) TX rv[UNROLL][VE];
        auto load = [&](int base) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int hd = base + u * STEP + lane / SV;
                if (hd < head_end) {
#if KEEP_L2
                    load_kept<TX, VE>(rv[u], xr + (size_t)hd * D + c0);
#else
                    raw_copy<TX, VE>(rv[u], xr + (size_t)hd * D + c0);
#endif
                } else {
#pragma unroll
                    for (int q = 0; q < VE; ++q) rv[u][q] = TX{};
                }
            }
        };
#if !INTERLEAVED
        // A rotated vector's partner (the other half's vector of the same head) is another
        // lane's own vector: taken from that lane by shuffles, not loaded a second time.
        const int partner_lane = rot ? lane - lane % SV + pc0 / VE : lane;
#endif
        load(head0);
        float a[VE], b[VE];
        if (rot) {
            // The lane's angles (and, backward and half-split, its partners'), fetched as whole
            // vectors before any is used: one by one, each behind the previous sincos, they made
            // VE dependent trips to memory. The row of freqs starts 16-byte aligned (CUDA and HIP
            // tensors do; DROT is a multiple of VE) and c0, pc0 are multiples of VE.
            const float* f = freqs + (size_t)pos * DROT;
            alignas(16) float fc[VE];
            raw_copy<float, VE>(fc, f + c0);
#if BACKWARD && !INTERLEAVED
            alignas(16) float fp[VE];
            raw_copy<float, VE>(fp, f + pc0);
#endif
#pragma unroll
            for (int q = 0; q < VE; ++q) {
#if INTERLEAVED
                const bool first = (q % 2) == 0;
#else
                const bool first = c0 < HALF_ROT;
#endif
#if BACKWARD
                // The transpose: the partner's sine, with the sign of the partner's term.
#if INTERLEAVED
                const float partner = fc[q ^ 1];
#else
                const float partner = fp[q];
#endif
                a[q] = cosf(fc[q]);
                const float sp = sinf(partner);
                b[q] = first ? sp : -sp;
#else
                float sn;
                sincosf(fc[q], &sn, &a[q]);
                b[q] = first ? -sn : sn;
#endif
            }
        }
        for (int base = head0; base < head_end; base += STEP * UNROLL) {
            if (base != head0) load(base);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int hd = base + u * STEP + lane / SV;
#if !INTERLEAVED
                alignas(16) TX rw[VE];
#pragma unroll
                for (int i = 0; i < VE * (int)sizeof(TX) / 4; ++i)
                    ((u32*)rw)[i] = (u32)shfl((int)((const u32*)rv[u])[i], partner_lane);
#endif
                if (hd >= head_end) continue;
                if (!rot) {
                    raw_copy<TX, VE>(yr + (size_t)hd * D + c0, rv[u]);
#if KEEP_L2
                    if (row >= release_from) release_after(x, xr + (size_t)hd * D + c0, false);
#endif
                    continue;
                }
                float o[VE], v[VE];
                unpack_n<TX, VE>(rv[u], v);
#if !INTERLEAVED
                float w[VE];
                unpack_n<TX, VE>(rw, w);
#endif
#pragma unroll
                for (int q = 0; q < VE; ++q) {
#if INTERLEAVED
                    o[q] = v[q] * a[q] + v[q ^ 1] * b[q];
#else
                    o[q] = v[q] * a[q] + w[q] * b[q];
#endif
                }
                store_n<TX, VE>(yr + (size_t)hd * D + c0, o);
#if KEEP_L2
                if (row >= release_from) release_after(x, xr + (size_t)hd * D + c0, false);
#endif
            }
        }
    }
}
#endif
