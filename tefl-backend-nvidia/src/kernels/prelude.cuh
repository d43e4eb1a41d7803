// tefl's embedded CUDA prelude: the only thing kernels include (NVRTC 13 ships no toolkit
// headers, and an end user's machine may have none). Types, conversions, warp and block
// reductions, atomics, vector access, tensor-core MMA and Philox, behind small wrappers so a
// HIP build can swap the bodies (warp size is a compile-time parameter, never a literal).

#ifndef WARP_SIZE
#define WARP_SIZE 32
#endif

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
__device__ __forceinline__ float to_f32(f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) {
    // Round to nearest even; NaN stays NaN. One cvt from sm_80 on, integer steps before.
    bf16 r;
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
#else
    const u32 u = __float_as_uint(v);
    r.bits = (u & 0x7fffffffu) > 0x7f800000u ? (u16)((u >> 16) | 0x40u) : (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
    return r;
}
template <> __device__ __forceinline__ f16 from_f32<f16>(float v) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
    return r;
}

// Two f32 rounded to T (bf16 or f16) and packed, `lo` in the low half: one instruction.
template <typename T> __device__ __forceinline__ u32 pack2_f32(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2_f32<bf16>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> __device__ __forceinline__ u32 pack2_f32<f16>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// The inverse: the low and high halves of a packed pair as f32.
template <typename T> __device__ __forceinline__ float lo_f32(u32 w) { return to_f32(T{(u16)(w & 0xffffu)}); }
template <typename T> __device__ __forceinline__ float hi_f32(u32 w) { return to_f32(T{(u16)(w >> 16)}); }

// ---- warp and block reductions ----
__device__ __forceinline__ float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask, WARP_SIZE); }
__device__ __forceinline__ float shfl(float v, int lane) { return __shfl_sync(0xffffffffu, v, lane, WARP_SIZE); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += shfl_xor(v, o);
    return v;
}
// max(a, b) that is NaN when either is (fmaxf returns the other operand: a NaN input must
// reach the outputs it touches, not vanish in a row maximum).
__device__ __forceinline__ float max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
#else
    return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
}
// 1 / s for a positive sum, NaN for a NaN sum, else 0 (a fully masked row).
__device__ __forceinline__ float recip_or_zero(float s) { return s > 0.0f ? 1.0f / s : (s != s ? s : 0.0f); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = max_nan(v, shfl_xor(v, o));
    return v;
}

// Reduces v over the block with a warp reduction (blockDim.x a multiple of WARP_SIZE;
// `identity` stands in for absent warps); `scratch` holds >= 32 floats. Every thread gets the
// result. Safe to call repeatedly with the same scratch.
template <float (*WarpReduce)(float)>
__device__ __forceinline__ float block_reduce(float v, float* scratch, float identity) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int nwarps = blockDim.x / WARP_SIZE;
    v = WarpReduce(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return WarpReduce(lane < nwarps ? scratch[lane] : identity);
}
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<warp_sum>(v, scratch, 0.0f); }
__device__ __forceinline__ float block_max(float v, float* scratch) {
    return block_reduce<warp_max>(v, scratch, -__int_as_float(0x7f800000));
}

// ---- atomics ----
__device__ __forceinline__ void atomic_add_f32(float* p, float v) { atomicAdd(p, v); }
// p[0] += a, p[1] += b for a global p aligned to 8 bytes: one vector reduction from sm_90 on.
__device__ __forceinline__ void atomic_add2_f32(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}
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
template <typename T, int N> __device__ __forceinline__ void load_n(const T* p, float* out) {
    alignas(16) T tmp[N];
    raw_copy<T, N>(tmp, p);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f32(tmp[i]);
}
template <typename T, int N> __device__ __forceinline__ void store_n(T* p, const float* in) {
    alignas(16) T tmp[N];
#pragma unroll
    for (int i = 0; i < N; ++i) tmp[i] = from_f32<T>(in[i]);
    raw_copy<T, N>(p, tmp);
}

// ---- tensor-core MMA: D(16x8 f32) += A(16x16) * B(16x8), fragments in the PTX layout ----
// A: a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..)
// B: b0 (k 2t..2t+1, col g), b1 (k 2t+8.., col g); C: c0,c1 (row g, cols 2t, 2t+1), c2,c3 (row g+8)
// with g = lane / 4, t = lane % 4.
__device__ __forceinline__ void mma_16816(float* c, const u32* a, const u32* b, bf16*) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_16816(float* c, const u32* a, const u32* b, f16*) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 2^x in one instruction (denormal results flush to zero): softmax exponents.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- shared-memory matrix loads and async copies (sm_80+) ----
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8, and receives
// element pairs (row l / 4, cols 2(l % 4), +1) of each (transposed first with ldsm_x4_t).
__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// (The address is the shared-window offset smem_addr gives; adding constant byte offsets to
// one converted base lets the loads use immediate offsets.)
// 16 bytes global -> shared without a register round trip; `valid` false zero-fills.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)), "l"(gmem), "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared (cp.async.ca); `valid` false zero-fills.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(smem)), "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

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
__device__ __forceinline__ u8 fp8_encode(float x, int mant_bits, int bias, float maxv, u8 max_code) {
    if (x != x) return 0x7f;
    const u8 sign = (__float_as_uint(x) >> 31) ? 0x80 : 0;
    const float a = fabsf(x);
    if (a >= maxv) return sign | max_code;
    const int emin = 1 - bias;
    int e = (int)((__float_as_uint(a) >> 23) & 0xff) - 127;
    if (e < emin) e = emin;
    const float quantum = __uint_as_float((u32)(e - mant_bits + 127) << 23);
    const int n = (int)rintf(a / quantum);
    int code = ((e - emin) << mant_bits) + n;
    if (code > max_code) code = max_code;
    return sign | (u8)code;
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
