// FP8 (OCP e4m3 / e5m2) with per-tensor scaling. Defines: TX (float input / output dtype),
// MANT, BIAS, MAXV, MAXCODE (the format), BLOCK.
// Amax propagates NaN: |x| is non-negative and the prelude's max_nan gives the positive
// canonical NaN, which the prelude's amax_reduce keeps.

// The vector paths (`vec` set by the host: n % NV == 0; tensors start 16-byte aligned) move NV
// elements of the float tensor a step, VEC_BYTES of it (16 unless the variant says otherwise),
// and NV codes, two steps a thread an iteration with both steps' loads issued before either is
// used (a load inside the step that uses it waits for the one before: one trip to memory a
// step). The scalar paths take any n.
#define NV (VEC_BYTES / (int)sizeof(TX))

// The vector paths' loop over `steps` vectors of x: vectors i and i + stride an iteration, both
// loaded before `use(index, values)` sees the first.
template <typename Use>
__device__ __forceinline__ void vector_pairs(const TX* __restrict__ x, long long steps, long long start,
                                             long long stride, Use use) {
    for (long long i = start; i < steps; i += 2 * stride) {
        const long long i2 = i + stride;
        alignas(16) TX a[NV], b[NV];
        raw_copy<TX, NV>(a, x + i * NV);
        if (i2 < steps) raw_copy<TX, NV>(b, x + i2 * NV);
        float f[NV];
        unpack_n<TX, NV>(a, f);
        use(i, f);
        if (i2 < steps) {
            unpack_n<TX, NV>(b, f);
            use(i2, f);
        }
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK) quantize(const TX* __restrict__ x, const float* __restrict__ scale,
                                                          u8* __restrict__ q, float* __restrict__ amax,
                                                          float* __restrict__ scale_inv, long long n, int vec) {
    const float s = *scale;
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
    float m = 0.0f;
    const long long start = (long long)blockIdx.x * BLOCK + threadIdx.x, stride = (long long)gridDim.x * BLOCK;
    if (vec) {
        vector_pairs(x, n / NV, start, stride,
                     [&](long long i, const float* f) { store_fp8_n<NV>(q + i * NV, f, s, m, MANT, BIAS, MAXV, MAXCODE); });
    } else {
        for (long long i = start; i < n; i += stride) {
            const float v = to_f32(x[i]);
            store_fp8_n<1>(q + i, &v, s, m, MANT, BIAS, MAXV, MAXCODE);
        }
    }
    amax_reduce(m, amax);
}

extern "C" __global__ void __launch_bounds__(BLOCK) compute_amax(const TX* __restrict__ x, float* __restrict__ amax,
                                                              long long n, int vec) {
    float m = 0.0f;
    const long long start = (long long)blockIdx.x * BLOCK + threadIdx.x, stride = (long long)gridDim.x * BLOCK;
    if (vec) {
        vector_pairs(x, n / NV, start, stride, [&](long long, const float* f) {
#pragma unroll
            for (int j = 0; j < NV; ++j) m = max_nan(m, fabsf(f[j]));
        });
    } else {
        for (long long i = start; i < n; i += stride) m = max_nan(m, fabsf(to_f32(x[i])));
    }
    amax_reduce(m, amax);
}

// y = decode(q) * scale_inv, y of dtype TX.
extern "C" __global__ void __launch_bounds__(BLOCK) dequantize(const u8* __restrict__ q, const float* __restrict__ scale_inv,
                                                            TX* __restrict__ y, long long n, int vec) {
    const float s = *scale_inv;
    const long long start = (long long)blockIdx.x * BLOCK + threadIdx.x, stride = (long long)gridDim.x * BLOCK;
    if (vec) {
        const long long steps = n / NV;
        for (long long i = start; i < steps; i += 2 * stride) {
            const long long i2 = i + stride;
            alignas(8) u8 a[NV], b[NV];
            raw_copy<u8, NV>(a, q + i * NV);  // one 4- or 8-byte load
            if (i2 < steps) raw_copy<u8, NV>(b, q + i2 * NV);
            float f[NV];
#pragma unroll
            for (int j = 0; j < NV; ++j) f[j] = fp8_decode(a[j], MANT, BIAS) * s;
            store_n<TX, NV>(y + i * NV, f);
            if (i2 < steps) {
#pragma unroll
                for (int j = 0; j < NV; ++j) f[j] = fp8_decode(b[j], MANT, BIAS) * s;
                store_n<TX, NV>(y + i2 * NV, f);
            }
        }
    } else {
        for (long long i = start; i < n; i += stride) y[i] = from_f32<TX>(fp8_decode(q[i], MANT, BIAS) * s);
    }
}

// q_t[n, m] = q[m, n]^T through TILE x TILE shared tiles (blockDim TILE x 8; the tile size is
// not tied to the warp width).
#define TILE 32
extern "C" __global__ void transpose_u8(const u8* __restrict__ q, u8* __restrict__ qt, int m, int n) {
    __shared__ u8 tile[TILE][TILE + 1];
    const int c0 = blockIdx.x * TILE, r0 = blockIdx.y * TILE;
    for (int dy = threadIdx.y; dy < TILE; dy += blockDim.y) {
        const int r = r0 + dy, c = c0 + threadIdx.x;
        if (r < m && c < n) tile[dy][threadIdx.x] = q[(size_t)r * n + c];
    }
    __syncthreads();
    for (int dy = threadIdx.y; dy < TILE; dy += blockDim.y) {
        const int c = c0 + dy, r = r0 + threadIdx.x;
        if (r < m && c < n) qt[(size_t)c * m + r] = tile[threadIdx.x][dy];
    }
}

// Fused cast + transpose (+ column sums) of x[m, n]: per TILE x TILE tile (blockDim TILE x 8),
// q = fp8(x * scale) row-major, and when qt is set the same codes transposed into qt[n, m]
// through shared memory; amax = max |x|; when ws is set, each block row (blockIdx.y) writes
// the column sums of the tiles it covered to ws[blockIdx.y][n] (reduced by colsum_ws). The
// grid's y dimension strides over the row tiles, so any m fits.
extern "C" __global__ void cast_transpose(const TX* __restrict__ x, const float* __restrict__ scale, u8* __restrict__ q,
                                          u8* __restrict__ qt, float* __restrict__ amax, float* __restrict__ scale_inv,
                                          float* __restrict__ ws, int m, int n) {
    __shared__ u8 tile[TILE][TILE + 4];
    __shared__ float csum[8][TILE];
    const float s = *scale;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *scale_inv = 1.0f / s;
    const int c0 = blockIdx.x * TILE;
    const int row_tiles = (m + TILE - 1) / TILE;
    float am = 0.0f, col = 0.0f;
    for (int rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
        const int r0 = rt * TILE;
        for (int dy = threadIdx.y; dy < TILE; dy += blockDim.y) {
            const int r = r0 + dy, c = c0 + threadIdx.x;
            if (r < m && c < n) {
                const float v = to_f32(x[(size_t)r * n + c]);
                am = max_nan(am, fabsf(v));
                col += v;
                const u8 code = fp8_encode(v * s, MANT, BIAS, MAXV, MAXCODE);
                q[(size_t)r * n + c] = code;
                if (qt != nullptr) tile[dy][threadIdx.x] = code;
            }
        }
        if (qt != nullptr) {
            __syncthreads();
            for (int dy = threadIdx.y; dy < TILE; dy += blockDim.y) {
                const int c = c0 + dy, r = r0 + threadIdx.x;
                if (r < m && c < n) qt[(size_t)c * m + r] = tile[threadIdx.x][dy];
            }
            __syncthreads();
        }
    }
    amax_reduce(am, amax);
    if (ws != nullptr) {
        csum[threadIdx.y][threadIdx.x] = col;
        __syncthreads();
        if (threadIdx.y == 0 && c0 + threadIdx.x < n) {
            float t = 0.0f;
            for (int k = 0; k < (int)blockDim.y; ++k) t += csum[k][threadIdx.x];
            ws[(size_t)blockIdx.y * n + c0 + threadIdx.x] = t;
        }
    }
}

// cast_transpose for rows of whole vectors (the host's pick when n % NV == 0; tensors start
// 16-byte aligned): tiles of VT x VT elements, a block of 256 threads. Each thread loads 16-byte
// vectors of x (one column of vectors of the tile, every (256 / VPR)-th row: all of its loads
// issued before any is used), stores their codes to q in one 4- or 8-byte store each and (when
// qt is set) to the shared tile, and after a barrier writes 8 consecutive codes of a row of the
// transpose (eight rows of the tile, one column) in one 8-byte store where the row holds them
// whole and aligned.
// The thread's columns stay the same across the row tiles, so its column sums (ws) are NV
// registers, summed over the threads of a column in shared memory at the end.
#define VT 64
#define VPR (VT / NV)         // vectors a tile row
#define RPP (256 / VPR)       // tile rows a pass of the block
#define PASSES (VT / RPP)     // passes a tile
#define CHUNKS (VT * VT / 8)  // 8-code chunks of the transposed tile
extern "C" __global__ void __launch_bounds__(256)
    cast_transpose_vec(const TX* __restrict__ x, const float* __restrict__ scale, u8* __restrict__ q,
                       u8* __restrict__ qt, float* __restrict__ amax, float* __restrict__ scale_inv,
                       float* __restrict__ ws, int m, int n) {
    // Row pitch 72: a multiple of 8 (the 8-byte stores), off the 32 banks' period.
    alignas(16) __shared__ u8 tile[VT][VT + 8];
    __shared__ float csum[RPP][VT];
    const float s = *scale;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
    const int vc = threadIdx.x % VPR, rr = threadIdx.x / VPR;
    const int c0 = blockIdx.x * VT, c = c0 + vc * NV;
    const bool col_ok = c < n;  // the vector is whole: n % NV == 0
    const int row_tiles = (m + VT - 1) / VT;
    float am = 0.0f, col[NV];
#pragma unroll
    for (int j = 0; j < NV; ++j) col[j] = 0.0f;
    for (int rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
        const int r0 = rt * VT;
        alignas(16) TX v[PASSES][NV];
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            const int r = r0 + p * RPP + rr;
            if (col_ok && r < m) raw_copy<TX, NV>(v[p], x + (size_t)r * n + c);
        }
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            const int r = r0 + p * RPP + rr;
            if (col_ok && r < m) {
                float f[NV];
                unpack_n<TX, NV>(v[p], f);
#pragma unroll
                for (int j = 0; j < NV; ++j) col[j] += f[j];
                u32 w[(NV + 3) / 4];
                encode_fp8_n<NV>(f, s, am, w, MANT, BIAS, MAXV, MAXCODE);
                store_codes<NV>(q + (size_t)r * n + c, w);
                if (qt != nullptr) store_codes<NV>(&tile[p * RPP + rr][vc * NV], w);
            }
        }
        if (qt != nullptr) {
            __syncthreads();
            // Chunk k: column k / 8 of the tile, its rows 8 (k % 8) to 8 (k % 8) + 7.
            for (int k = threadIdx.x; k < CHUNKS; k += 256) {
                const int tc = k / 8, tr = (k % 8) * 8;
                const int oc = c0 + tc, orow = r0 + tr;
                if (oc < n) {
                    u8* dst = qt + (size_t)oc * m + orow;
                    if (orow + 8 <= m && m % 8 == 0) {
                        u32 lo = 0, hi = 0;
#pragma unroll
                        for (int z = 0; z < 4; ++z) {
                            lo |= (u32)tile[tr + z][tc] << (8 * z);
                            hi |= (u32)tile[tr + 4 + z][tc] << (8 * z);
                        }
                        *(uint2*)dst = make_uint2(lo, hi);
                    } else {
                        for (int z = 0; z < 8 && orow + z < m; ++z) dst[z] = tile[tr + z][tc];
                    }
                }
            }
            __syncthreads();
        }
    }
    amax_reduce(am, amax);
    if (ws != nullptr) {
#pragma unroll
        for (int j = 0; j < NV; ++j) csum[rr][vc * NV + j] = col[j];
        __syncthreads();
        if (threadIdx.x < VT && c0 + (int)threadIdx.x < n) {
            float t = 0.0f;
            for (int k = 0; k < RPP; ++k) t += csum[k][threadIdx.x];
            ws[(size_t)blockIdx.y * n + c0 + threadIdx.x] = t;
        }
    }
}

// The transpose of a 4 x 4 block of bytes: a_i holds row i (byte j: column j); o_j gets column j
// (byte i: row i).
__device__ __forceinline__ void transpose_bytes_4x4(u32 a0, u32 a1, u32 a2, u32 a3, u32& o0, u32& o1, u32& o2,
                                                    u32& o3) {
    const u32 t0 = byte_perm(a0, a1, 0x5140), t1 = byte_perm(a0, a1, 0x7362);  // rows 0, 1 interleaved
    const u32 t2 = byte_perm(a2, a3, 0x5140), t3 = byte_perm(a2, a3, 0x7362);  // rows 2, 3
    o0 = byte_perm(t0, t2, 0x5410);
    o1 = byte_perm(t0, t2, 0x7632);
    o2 = byte_perm(t1, t3, 0x5410);
    o3 = byte_perm(t1, t3, 0x7632);
}

// cast_transpose for m and n multiples of 8 (the host's pick then; tensors start 16-byte
// aligned), the transpose in registers: a block of 256 threads takes a tile of T8_ROWS x
// T8_COLS elements (16 column vectors x 16 row groups of 8 x 8), each thread one 8 x 8 of it. The
// thread loads its 8 rows (16-byte vectors; the source has all 8 loads before any use, but at 56
// registers on sm_90 ptxas issues them two at a time; all 8 first, at 79 registers under
// __launch_bounds__(256, 1), ran 2.9% slower: the performance log, 2026-12-07) in whole lines
// (load_whole_lines: a warp's load takes 64 of each row's 128-byte line, the warp beside it the
// other 64; H100, 16384 x 8192 bf16 -> e4m3, 2026-12-08, four rounds in turns: 0.194-0.196 ms
// against 0.197-0.199 for plain loads, scripts/diag/ct_ring.patch), stores each row's
// 8 codes to q in one 8-byte store, transposes its 8 x 8 codes with byte permutes and stores each
// column's 8 codes (8 consecutive entries of a row of q_t) in one 8-byte store. A warp takes
// T8_VC column vectors across and WARP_SIZE / T8_VC row groups down: with 32 lanes, one load
// instruction reads 32 consecutive elements of each of 8 rows of x, one q store writes 32 codes
// of each of 8 rows and one q_t store 64 codes of each of 4 rows of q_t. (H100, 16384 x 8192
// bf16 -> e4m3, 2026-12-07: 0.205 ms so, 0.210-0.211 with 8 across, 0.253-0.255 with 2 across;
// scripts/diag/ct_grid.patch.) No shared tile, no barrier, and (m and n multiples of 32) every
// access whole 32-byte sectors. All 8 rows of a thread are inside m or none is (m % 8 == 0).
// The tile is square, so each tile writes one 128-byte line of each of its q rows and q_t rows
// (H100, same shape, three rounds in turns: 0.198-0.199 ms against 0.200 for 256 x 64 tiles,
// the same for 64 x 256, 0.216 for 512 x 32; scripts/diag/ct_ring.patch, 2026-12-07). The
// grid's y dimension strides over the row tiles (the host launches about 24 blocks an SM:
// faster than a block a tile, the host's note). Column sums (ws) as cast_transpose_vec's: the
// thread's 8 in registers, summed over the block at the end.
#define T8_ROWS 128
#define T8_COLS 128
#define T8_VC 4
extern "C" __global__ void __launch_bounds__(256)
    cast_transpose_8x8(const TX* __restrict__ x, const float* __restrict__ scale, u8* __restrict__ q,
                       u8* __restrict__ qt, float* __restrict__ amax, float* __restrict__ scale_inv,
                       float* __restrict__ ws, int m, int n) {
    // The warps across a tile's columns; the column sums' shared rows, one a warp down the tile.
    constexpr int across = T8_COLS / 8 / T8_VC;
    __shared__ float csum[256 / WARP_SIZE / across][T8_COLS];
    const float s = *scale;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
    // This thread's column vector and row group.
    const int wp = warp_id(), ln = lane_id();
    const int vc = (wp % across) * T8_VC + ln % T8_VC;
    const int rg = (wp / across) * (WARP_SIZE / T8_VC) + ln / T8_VC;
    const int c = blockIdx.x * T8_COLS + vc * 8;
    const int row_tiles = (m + T8_ROWS - 1) / T8_ROWS;
    float am = 0.0f, col[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) col[k] = 0.0f;
    for (int rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
        const int r = rt * T8_ROWS + rg * 8;
        if (c >= n || r >= m) continue;
        alignas(16) TX v[8][8];
        const TX* src = x + (size_t)r * n + c;
#pragma unroll
        for (int j = 0; j < 8; ++j) load_whole_lines<TX, 8>(v[j], src + (size_t)j * n);
        u32 w[8][2];  // row j's codes: columns 0-3, then 4-7
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float f[8];
            unpack_n<TX, 8>(v[j], f);
#pragma unroll
            for (int k = 0; k < 8; ++k) col[k] += f[k];
            encode_fp8_n<8>(f, s, am, w[j], MANT, BIAS, MAXV, MAXCODE);
            store_codes<8>(q + (size_t)(r + j) * n + c, w[j]);
        }
        if (qt != nullptr) {
            u32 t[8][2];  // column k's codes: rows 0-3, then 4-7
            transpose_bytes_4x4(w[0][0], w[1][0], w[2][0], w[3][0], t[0][0], t[1][0], t[2][0], t[3][0]);
            transpose_bytes_4x4(w[4][0], w[5][0], w[6][0], w[7][0], t[0][1], t[1][1], t[2][1], t[3][1]);
            transpose_bytes_4x4(w[0][1], w[1][1], w[2][1], w[3][1], t[4][0], t[5][0], t[6][0], t[7][0]);
            transpose_bytes_4x4(w[4][1], w[5][1], w[6][1], w[7][1], t[4][1], t[5][1], t[6][1], t[7][1]);
#pragma unroll
            for (int k = 0; k < 8; ++k) store_codes<8>(qt + (size_t)(c + k) * m + r, t[k]);
        }
    }
    amax_reduce(am, amax);
    if (ws != nullptr) {
        // The threads of a column: lanes ln, ln + T8_VC, ... of a warp, then the warps down the
        // tile (row wp / across of csum).
#pragma unroll
        for (int k = 0; k < 8; ++k)
            for (int o = T8_VC; o < WARP_SIZE; o <<= 1) col[k] += shfl_xor(col[k], o);
        if (ln < T8_VC) {
#pragma unroll
            for (int k = 0; k < 8; ++k) csum[wp / across][vc * 8 + k] = col[k];
        }
        __syncthreads();
        const int oc = blockIdx.x * T8_COLS + threadIdx.x;
        if (threadIdx.x < T8_COLS && oc < n) {
            float total = 0.0f;
            for (int w = 0; w < 256 / WARP_SIZE / across; ++w) total += csum[w][threadIdx.x];
            ws[(size_t)blockIdx.y * n + oc] = total;
        }
    }
}

// dbias[j] = sum over the parts of ws[p][j], in the input's dtype.
extern "C" __global__ void colsum_ws(const float* __restrict__ ws, TX* __restrict__ dbias, int parts, int n) {
    finish_column_sums<TX>(ws, dbias, parts, n);
}

// Delayed scaling: per column j of amax_history [hist, n]: amax (max over the history, or
// the newest row), scale = fp8_max / amax / 2^margin when finite and > 0, scale_inv = 1/scale;
// then the history rolls up one row and row 0 is cleared.
extern "C" __global__ void delayed_scaling(float* __restrict__ h, float* __restrict__ scale, float* __restrict__ scale_inv,
                                           int hist, int n, float fp8_max, float margin, int algo_max) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float amax;
    if (algo_max) {
        amax = 0.0f;
        for (int r = 0; r < hist; ++r) {
            const float v = h[(size_t)r * n + j];
            amax = max_nan(amax, v);
        }
    } else {
        amax = h[j];
    }
    if (isfinite(amax) && amax > 0.0f) {
        const float s = fp8_max / amax / powf(2.0f, margin);
        if (isfinite(s) && s > 0.0f) scale[j] = s;
    }
    scale_inv[j] = 1.0f / scale[j];
    const float first = h[j];
    for (int r = 0; r + 1 < hist; ++r) h[(size_t)r * n + j] = h[(size_t)(r + 1) * n + j];
    h[(size_t)(hist - 1) * n + j] = first;
    h[j] = 0.0f;
}
