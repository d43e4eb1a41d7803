// tefl prelude, HIP target (hiprtc, amdgcn): the same primitives as cuda.h for wavefronts of
// 64 lanes (GCN/CDNA) or 32 (RDNA's wave32). HIP shuffles take no lane mask and there is no
// __syncwarp: a wavefront executes in lockstep, so warp_sync only orders its memory accesses.
// hiprtc provides the HIP device built-ins without any include.

#define TEFL_TARGET_HIP 1
// Lanes per wavefront: the host passes the device's (-DTEFL_WAVE_SIZE=64 or 32), never assumed.
#ifndef TEFL_WAVE_SIZE
#error "TEFL_WAVE_SIZE (the device's wavefront size) must be defined by the host"
#endif
#define WARP_SIZE TEFL_WAVE_SIZE
#if WARP_SIZE != 32 && WARP_SIZE != 64
#error "TEFL_WAVE_SIZE must be 32 or 64"
#endif
// The most wavefronts a block of 1024 threads has.
#define MAX_WARPS (1024 / WARP_SIZE)
#if WARP_SIZE == 64
#define FULL_LANE_MASK 0xffffffffffffffffull
#else
#define FULL_LANE_MASK 0xffffffffu
#endif

// ---- shuffles and wavefront synchronisation ----
__device__ __forceinline__ float shfl_xor(float v, int mask) { return __shfl_xor(v, mask, WARP_SIZE); }
__device__ __forceinline__ double shfl_xor(double v, int mask) { return __shfl_xor(v, mask, WARP_SIZE); }
__device__ __forceinline__ int shfl_xor(int v, int mask) { return __shfl_xor(v, mask, WARP_SIZE); }
__device__ __forceinline__ float shfl(float v, int lane) { return __shfl(v, lane, WARP_SIZE); }
__device__ __forceinline__ int shfl(int v, int lane) { return __shfl(v, lane, WARP_SIZE); }
__device__ __forceinline__ void warp_sync() { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront"); __builtin_amdgcn_wave_barrier(); __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront"); }

// ---- 16-bit float bit patterns <-> f32 ----
__device__ __forceinline__ float half_bits_to_f32(unsigned short h) { return (float)__builtin_bit_cast(_Float16, h); }
__device__ __forceinline__ unsigned short f32_to_half_bits(float v) { return __builtin_bit_cast(unsigned short, (_Float16)v); }
// Round to nearest even; NaN stays NaN (integer steps: not every amdgcn target has a cvt).
__device__ __forceinline__ unsigned short f32_to_bf16_bits(float v) {
    const unsigned int u = __float_as_uint(v);
    return (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u)
                                           : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ unsigned int pack2_bf16_bits(float lo, float hi) {
    return (unsigned int)f32_to_bf16_bits(lo) | ((unsigned int)f32_to_bf16_bits(hi) << 16);
}
__device__ __forceinline__ unsigned int pack2_half_bits(float lo, float hi) {
    return (unsigned int)f32_to_half_bits(lo) | ((unsigned int)f32_to_half_bits(hi) << 16);
}

// ---- arithmetic ----
// max(a, b) that is NaN when either is (fmaxf drops a NaN operand).
__device__ __forceinline__ float max_nan(float a, float b) {
    return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
}
// The lane-wise max of two packed pairs of bf16 (f16) values, NaN in a lane where either is
// (through f32: the max is one of the inputs, so packing it back is exact).
__device__ __forceinline__ unsigned int max2_nan_bf16_bits(unsigned int a, unsigned int b) {
    const float lo = max_nan(__uint_as_float(a << 16), __uint_as_float(b << 16));
    const float hi = max_nan(__uint_as_float(a & 0xffff0000u), __uint_as_float(b & 0xffff0000u));
    return pack2_bf16_bits(lo, hi);
}
__device__ __forceinline__ unsigned int max2_nan_half_bits(unsigned int a, unsigned int b) {
    const float lo = max_nan(half_bits_to_f32((unsigned short)(a & 0xffffu)), half_bits_to_f32((unsigned short)(b & 0xffffu)));
    const float hi = max_nan(half_bits_to_f32((unsigned short)(a >> 16)), half_bits_to_f32((unsigned short)(b >> 16)));
    return pack2_half_bits(lo, hi);
}
// 2^x: v_exp_f32 directly where the compiler has the builtin (clang 17+, ROCm 6+; denormal
// results may flush to zero, as on CUDA), else the device library's exp2f.
#if defined(__has_builtin) && __has_builtin(__builtin_amdgcn_exp2f)
__device__ __forceinline__ float fast_exp2(float x) { return __builtin_amdgcn_exp2f(x); }
#else
__device__ __forceinline__ float fast_exp2(float x) { return exp2f(x); }
#endif
// 1/x: v_rcp_f32 where the compiler has the builtin, else a division.
#if defined(__has_builtin) && __has_builtin(__builtin_amdgcn_rcpf)
__device__ __forceinline__ float fast_rcp(float x) { return __builtin_amdgcn_rcpf(x); }
#else
__device__ __forceinline__ float fast_rcp(float x) { return 1.0f / x; }
#endif

// Bytes of the pair (a: 0-3, b: 4-7) picked by the four nibbles of `sel`, low byte first (as
// CUDA's __byte_perm; written out, so no device library is assumed: with a constant `sel` the
// shifts fold).
__device__ __forceinline__ unsigned int byte_perm(unsigned int a, unsigned int b, unsigned int sel) {
    const unsigned long long pair = ((unsigned long long)b << 32) | a;
    unsigned int r = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) r |= (unsigned int)((pair >> (8 * ((sel >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    return r;
}

// ---- atomics ----
// p[0] += a, p[1] += b (two f32 atomics: amdgcn has no packed f32 add to global memory).
__device__ __forceinline__ void atomic_add2_f32(float* p, float a, float b) {
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
}
