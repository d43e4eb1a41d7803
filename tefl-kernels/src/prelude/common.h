// tefl's kernel prelude, target-neutral part: types, conversions, warp and block reductions,
// atomics, vector access, Philox and FP8, written against the primitives of the target header
// that precedes it (prelude/cuda.h or prelude/hip.h). Kernels include nothing else: the warp
// width is WARP_SIZE and every cross-lane step goes through shfl_xor / shfl.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// 16-bit float storage types; arithmetic is done in f32.
struct __align__(2) bf16 { u16 bits; };
struct __align__(2) f16 { u16 bits; };

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __uint_as_float(((u32)v.bits) << 16); }
__device__ __forceinline__ float to_f32(f16 v) { return half_bits_to_f32(v.bits); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) { return bf16{f32_to_bf16_bits(v)}; }

template <> __device__ __forceinline__ f16 from_f32<f16>(float v) { return f16{f32_to_half_bits(v)}; }

// Two f32 rounded to T (bf16 or f16) and packed, `lo` in the low half: one instruction.
template <typename T> __device__ __forceinline__ u32 pack2_f32(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2_f32<bf16>(float lo, float hi) { return pack2_bf16_bits(lo, hi); }
template <> __device__ __forceinline__ u32 pack2_f32<f16>(float lo, float hi) { return pack2_half_bits(lo, hi); }
// The inverse: the low and high halves of a packed pair as f32.
template <typename T> __device__ __forceinline__ float lo_f32(u32 w) { return to_f32(T{(u16)(w & 0xffffu)}); }
template <typename T> __device__ __forceinline__ float hi_f32(u32 w) { return to_f32(T{(u16)(w >> 16)}); }

// The lane-wise max of two packed pairs of T (bf16 or f16), NaN in a lane where either is.
template <typename T> __device__ __forceinline__ u32 max2_nan(u32 a, u32 b);
template <> __device__ __forceinline__ u32 max2_nan<bf16>(u32 a, u32 b) { return max2_nan_bf16_bits(a, b); }
template <> __device__ __forceinline__ u32 max2_nan<f16>(u32 a, u32 b) { return max2_nan_half_bits(a, b); }

// ---- warp and block reductions ----

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += shfl_xor(v, o);
    return v;
}
// 1 / s for a positive sum, NaN for a NaN sum, else 0 (a fully masked row).
__device__ __forceinline__ float recip_or_zero(float s) { return s > 0.0f ? 1.0f / s : (s != s ? s : 0.0f); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = max_nan(v, shfl_xor(v, o));
    return v;
}

// The sum over the warp in f64 (multi-tensor norms), and the max over the warp of an int.
__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += shfl_xor(v, o);
    return v;
}
__device__ __forceinline__ int warp_max_i32(int v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = max(v, shfl_xor(v, o));
    return v;
}
// This thread's lane in its warp, and its warp in the block.
__device__ __forceinline__ int lane_id() { return threadIdx.x % WARP_SIZE; }
__device__ __forceinline__ int warp_id() { return threadIdx.x / WARP_SIZE; }

// Folds a per-thread amax (non-negative, or the canonical NaN) into the f32 at `amax` (zeroed
// before the launch): a warp max, then one integer atomicMax per warp. The positive canonical
// NaN 0x7fffffff orders above +inf as an integer, so a NaN survives.
__device__ __forceinline__ void amax_reduce(float m, float* amax) {
    const int b = warp_max_i32(__float_as_int(m));
    if (lane_id() == 0 && b != 0) atomicMax((int*)amax, b);
}

// The end of a block reduction: each warp's total (`warp_total`) into `slots`, a barrier, then
// every warp reduces the slots.
template <float (*WarpReduce)(float)>
__device__ __forceinline__ float reduce_warp_totals(float warp_total, float* slots, float identity) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) slots[warp] = warp_total;
    __syncthreads();
    return WarpReduce(lane < (int)(blockDim.x / WARP_SIZE) ? slots[lane] : identity);
}
// Reduces v over the block with a warp reduction (blockDim.x a multiple of WARP_SIZE;
// `identity` stands in for absent warps); `scratch` holds >= MAX_WARPS floats. Every thread gets the
// result. Safe to call repeatedly with the same scratch.
template <float (*WarpReduce)(float)>
__device__ __forceinline__ float block_reduce(float v, float* scratch, float identity) {
    v = WarpReduce(v);
    // (No warp may overwrite the slots while a slower one still reads a previous call's.)
    __syncthreads();
    return reduce_warp_totals<WarpReduce>(v, scratch, identity);
}
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<warp_sum>(v, scratch, 0.0f); }
// block_reduce with one barrier instead of two, for loops that reduce on every iteration:
// `scratch` holds 2 * MAX_WARPS floats and `turn` (0 before the first call) alternates its
// halves. A warp writes one half while slower warps may still read the other; a half is
// written again only after the next call's barrier, which every warp reaches after its reads.
// (The softmax forward's max and sum this way measured no faster on the H200, 2026-11-26.)
template <float (*WarpReduce)(float)>
__device__ __forceinline__ float block_reduce_alternating(float v, float* scratch, int& turn, float identity) {
    float* half = scratch + turn * MAX_WARPS;
    turn ^= 1;
    return reduce_warp_totals<WarpReduce>(WarpReduce(v), half, identity);
}
__device__ __forceinline__ float block_sum_alternating(float v, float* scratch, int& turn) {
    return block_reduce_alternating<warp_sum>(v, scratch, turn, 0.0f);
}
// Two sums over the block behind one barrier (block_sum_alternating's halves and turns):
// `scratch` holds 2 * MAX_WARPS float2. Returns (Σ a, Σ b) to every thread.
__device__ __forceinline__ float2 block_sum_pair_alternating(float a, float b, float2* scratch, int& turn) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        a += shfl_xor(a, o);
        b += shfl_xor(b, o);
    }
    float2* half = scratch + turn * MAX_WARPS;
    turn ^= 1;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) half[warp] = make_float2(a, b);
    __syncthreads();
    float2 t = lane < (int)(blockDim.x / WARP_SIZE) ? half[lane] : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        t.x += shfl_xor(t.x, o);
        t.y += shfl_xor(t.y, o);
    }
    return t;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    return block_reduce<warp_max>(v, scratch, -__int_as_float(0x7f800000));
}
// amax_reduce for a whole block (every thread calls it): one reduction over the block, then
// one atomic from thread 0 only when the block's max beats the value already there, so a grid
// of many blocks does not serialise on one address.
__device__ __forceinline__ void amax_reduce_block(float m, float* amax, float* scratch) {
    const int b = __float_as_int(block_reduce<warp_max>(m, scratch, 0.0f));
    if (threadIdx.x == 0 && b > *(volatile int*)amax) atomicMax((int*)amax, b);
}

// ---- atomics ----
__device__ __forceinline__ void atomic_add_f32(float* p, float v) { atomicAdd(p, v); }
// max over non-negative floats (and NaN, whose bits order above +inf): integer max on the bits.
__device__ __forceinline__ void atomic_max_nonneg_f32(float* p, float v) {
    atomicMax((int*)p, __float_as_int(v));
}

// ---- column sums in two passes ----
// The second pass of a column sum: out[c] = Σ_p ws[p][c] over `parts` rows of partial sums
// (one thread per column c < n).
template <typename TO> __device__ __forceinline__ void finish_column_sums(const float* ws, TO* out, int parts, int n) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float s = 0.0f;
    for (int p = 0; p < parts; ++p) s += ws[(size_t)p * n + c];
    out[c] = from_f32<TO>(s);
}

// ---- vector access ----
// load_n / store_n move N consecutive elements with the widest aligned accesses (16 bytes at
// most); the caller guarantees the address is aligned to min(N * sizeof(T), 16).
// VEC_BYTES (a tune parameter, 16 by default) sets how many bytes of the widest input a
// thread moves per step.
#ifndef VEC_BYTES
#define VEC_BYTES 16
#endif
template <typename T, int N> __device__ __forceinline__ void raw_copy(T* dst, const T* src) {
    constexpr int B = N * (int)sizeof(T);
    if constexpr (B % 16 == 0) {
#pragma unroll
        for (int i = 0; i < B / 16; ++i) ((uint4*)dst)[i] = ((const uint4*)src)[i];
    } else if constexpr (B % 8 == 0) {
#pragma unroll
        for (int i = 0; i < B / 8; ++i) ((uint2*)dst)[i] = ((const uint2*)src)[i];
    } else if constexpr (B % 4 == 0) {
#pragma unroll
        for (int i = 0; i < B / 4; ++i) ((u32*)dst)[i] = ((const u32*)src)[i];
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) dst[i] = src[i];
    }
}
// Whether T is a 16-bit float that pack2_f32 rounds two at a time.
template <typename T> struct packs_in_pairs { static constexpr bool value = false; };
template <> struct packs_in_pairs<bf16> { static constexpr bool value = true; };
template <> struct packs_in_pairs<f16> { static constexpr bool value = true; };
template <typename T> struct is_bf16 { static constexpr bool value = false; };
template <> struct is_bf16<bf16> { static constexpr bool value = true; };
// Elements 2i and 2i + 1 of an aligned array of T in registers (as raw_copy fills them),
// widened to f32. bf16 pairs are taken a 32-bit word at a time: the low element is the word
// shifted up, the high one the word with its low half cleared, one instruction each (element
// by element, ptxas extracted the high half and shifted it back: two, sm_90 SASS of the norm
// kernels).
template <typename T> __device__ __forceinline__ void unpack_pair(const T* v, int i, float& lo, float& hi) {
    if constexpr (is_bf16<T>::value) {
        const u32 w = ((const u32*)v)[i];
        lo = __uint_as_float(w << 16);
        hi = __uint_as_float(w & 0xffff0000u);
    } else {
        lo = to_f32(v[2 * i]);
        hi = to_f32(v[2 * i + 1]);
    }
}
// All N elements of such an array, a pair at a time.
template <typename T, int N> __device__ __forceinline__ void unpack_n(const T* v, float* out) {
    if constexpr (N % 2 == 0) {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) unpack_pair<T>(v, i, out[2 * i], out[2 * i + 1]);
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = to_f32(v[i]);
    }
}
template <typename T, int N> __device__ __forceinline__ void load_n(const T* p, float* out) {
    alignas(16) T tmp[N];
    raw_copy<T, N>(tmp, p);
    unpack_n<T, N>(tmp, out);
}
// N f32 rounded to T and stored as one vector; 16-bit floats are rounded a pair per
// instruction (the same round-to-nearest-even as from_f32).
template <typename T, int N> __device__ __forceinline__ void store_n(T* p, const float* in) {
    if constexpr (packs_in_pairs<T>::value && N % 2 == 0) {
        alignas(16) u32 w[N / 2];
#pragma unroll
        for (int i = 0; i < N / 2; ++i) w[i] = pack2_f32<T>(in[2 * i], in[2 * i + 1]);
        raw_copy<T, N>(p, (const T*)w);
    } else {
        alignas(16) T tmp[N];
#pragma unroll
        for (int i = 0; i < N; ++i) tmp[i] = from_f32<T>(in[i]);
        raw_copy<T, N>(p, tmp);
    }
}

// ---- asynchronous copies into shared memory: the fallback ----
// A target without them (HAS_COPY_ASYNC unset: HIP, CUDA before sm_80) copies at once through
// registers, so a kernel written against copy_async / copy_async_commit / copy_async_wait
// (see prelude/cuda.h) is correct everywhere, only without the overlap.
#ifndef HAS_COPY_ASYNC
#define HAS_COPY_ASYNC 0
template <int B> __device__ __forceinline__ void copy_async(void* dst, const void* src) {
    if constexpr (B % 16 == 0) {
#pragma unroll
        for (int i = 0; i < B / 16; ++i) ((uint4*)dst)[i] = ((const uint4*)src)[i];
    } else if constexpr (B == 8) {
        *(uint2*)dst = *(const uint2*)src;
    } else {
        *(u32*)dst = *(const u32*)src;
    }
}
__device__ __forceinline__ void copy_async_commit() {}
template <int N> __device__ __forceinline__ void copy_async_wait() {}
struct SharedBase {
    unsigned char* p;
};
__device__ __forceinline__ SharedBase shared_base(void* p) { return {(unsigned char*)p}; }
template <int B> __device__ __forceinline__ void copy_async_at(SharedBase base, int offset, const void* src) {
    copy_async<B>(base.p + offset, src);
}
#endif

// ---- streamed inputs held in L2, whole-line loads: the fallback (HIP, CUDA before sm_80) ----
#ifndef HAS_L2_KEEP
#define HAS_L2_KEEP 0
template <typename T, int N> __device__ __forceinline__ void load_kept(T* dst, const T* src) { raw_copy<T, N>(dst, src); }
__device__ __forceinline__ void release_line(const void*) {}
template <typename T, int N> __device__ __forceinline__ void load_whole_lines(T* dst, const T* src) {
    raw_copy<T, N>(dst, src);
}
#endif
// After a kept load of the vector at `p` of a buffer starting at `base`: releases the line `p`
// starts, or, for a row's first vector (`first`) inside a line, that line when it lies in the
// buffer (a line two rows share is released by both, each after its own load).
__device__ __forceinline__ void release_after(const void* base, const void* p, bool first) {
    const unsigned long long a = (unsigned long long)p, line = a & ~127ull;
    if (a == line || (first && line >= (unsigned long long)base)) release_line((const void*)line);
}

// ---- Philox 4x32-10 (Random123), the stream tefl_core::philox defines ----
__device__ __forceinline__ void philox4x32_10(u32* ctr, u32 k0, u32 k1) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const u32 hi0 = __umulhi(0xD2511F53u, ctr[0]), lo0 = 0xD2511F53u * ctr[0];
        const u32 hi1 = __umulhi(0xCD9E8D57u, ctr[2]), lo1 = 0xCD9E8D57u * ctr[2];
        const u32 c0 = hi1 ^ ctr[1] ^ k0, c2 = hi0 ^ ctr[3] ^ k1;
        ctr[0] = c0; ctr[1] = lo1; ctr[2] = c2; ctr[3] = lo0;
    }
}
// The uniform in [0, 1) of element `index` of the stream (seed, offset).
__device__ __forceinline__ float philox_uniform(u64 seed, u64 offset, u64 index) {
    const u64 block = index >> 2;
    u32 c[4] = {(u32)block, (u32)(block >> 32), (u32)offset, (u32)(offset >> 32)};
    philox4x32_10(c, (u32)seed, (u32)(seed >> 32));
    return (float)(c[index & 3] >> 8) * (1.0f / 16777216.0f);
}

// ---- FP8 (OCP e4m3 / e5m2), round to nearest even, saturating, NaN -> 0x7f ----
// The hardware cast where the target has one (HAS_FP8_CVT), else in software: the step between
// codes at x's exponent is a power of two, so x / step is a multiplication by its inverse.
__device__ __forceinline__ u8 fp8_encode(float x, int mant_bits, int bias, float maxv, u8 max_code) {
#ifdef HAS_FP8_CVT
    (void)bias;
    (void)maxv;
    (void)max_code;
    return fp8_encode_cvt(x, mant_bits);
#else
    if (x != x) return 0x7f;
    const u8 sign = (__float_as_uint(x) >> 31) ? 0x80 : 0;
    const float a = fabsf(x);
    if (a >= maxv) return sign | max_code;
    const int emin = 1 - bias;
    int e = (int)((__float_as_uint(a) >> 23) & 0xff) - 127;
    if (e < emin) e = emin;
    const float inv_quantum = __uint_as_float((u32)(127 - (e - mant_bits) + 127) << 23);
    const int n = (int)rintf(a * inv_quantum);
    int code = ((e - emin) << mant_bits) + n;
    if (code > max_code) code = max_code;
    return sign | (u8)code;
#endif
}
// fp8_encode of two values, `lo` in the low byte: one instruction where the target has it.
__device__ __forceinline__ u32 fp8_encode2(float lo, float hi, int mant_bits, int bias, float maxv, u8 max_code) {
#ifdef HAS_FP8_CVT
    (void)bias;
    (void)maxv;
    (void)max_code;
    return fp8x2_encode_cvt(lo, hi, mant_bits);
#else
    return (u32)fp8_encode(lo, mant_bits, bias, maxv, max_code) |
           ((u32)fp8_encode(hi, mant_bits, bias, maxv, max_code) << 8);
#endif
}
__device__ __forceinline__ float fp8_decode(u8 c, int mant_bits, int bias) {
    const float s = (c & 0x80) ? -1.0f : 1.0f;
    const int e = (c & 0x7f) >> mant_bits;
    const int m = c & ((1 << mant_bits) - 1);
    const int emax = (1 << (7 - mant_bits)) - 1;
    if (mant_bits == 3 && e == emax && m == 7) return __int_as_float(0x7fc00000);
    if (mant_bits == 2 && e == emax) return m == 0 ? s * __int_as_float(0x7f800000) : __int_as_float(0x7fc00000);
    const float frac = (float)m / (float)(1 << mant_bits);
    if (e == 0) return s * __uint_as_float((u32)(1 - bias + 127) << 23) * frac;
    return s * __uint_as_float((u32)(e - bias + 127) << 23) * (1.0f + frac);
}
// The FP8 codes of N values times `qs`, packed little-endian into 32-bit words `w` (code j in
// byte j % 4 of word j / 4; words in registers, where a byte array would live in local
// memory), two a conversion where the target converts pairs; the values' magnitudes before the
// scale are folded into the thread's amax `am`.
template <int N>
__device__ __forceinline__ void encode_fp8_n(const float* o, float qs, float& am, u32 (&w)[(N + 3) / 4], int mant_bits,
                                             int bias, float maxv, u8 max_code) {
#pragma unroll
    for (int k = 0; k < (N + 3) / 4; ++k) w[k] = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) am = max_nan(am, fabsf(o[j]));
    if constexpr (N % 2 == 0) {
#pragma unroll
        for (int j = 0; j < N; j += 2)
            w[j / 4] |= fp8_encode2(o[j] * qs, o[j + 1] * qs, mant_bits, bias, maxv, max_code) << (8 * (j % 4));
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j)
            w[j / 4] |= (u32)fp8_encode(o[j] * qs, mant_bits, bias, maxv, max_code) << (8 * (j % 4));
    }
}
// N codes packed as encode_fp8_n packs them, stored at `dst` (one 4-, 8- or 16-byte store when
// N is 4, 8 or 16; dst aligned to that; global or shared memory).
template <int N> __device__ __forceinline__ void store_codes(u8* dst, const u32 (&w)[(N + 3) / 4]) {
    if constexpr (N == 16) {
        *(uint4*)dst = make_uint4(w[0], w[1], w[2], w[3]);
    } else if constexpr (N == 8) {
        *(uint2*)dst = make_uint2(w[0], w[1]);
    } else if constexpr (N == 4) {
        *(u32*)dst = w[0];
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) dst[j] = (u8)(w[j / 4] >> (8 * (j % 4)));
    }
}
// N values times `qs` stored as FP8 codes at `dst` (as store_codes), their magnitudes before
// the scale folded into the thread's amax `am`.
template <int N>
__device__ __forceinline__ void store_fp8_n(u8* dst, const float* o, float qs, float& am, int mant_bits, int bias,
                                            float maxv, u8 max_code) {
    u32 w[(N + 3) / 4];
    encode_fp8_n<N>(o, qs, am, w, mant_bits, bias, maxv, max_code);
    store_codes<N>(dst, w);
}
