// tefl prelude, CUDA target (NVRTC): the hardware primitives common.h builds on, on built-in
// types only, with their PTX bodies. Nothing else in a SIMT kernel is target-specific: the
// warp width, the lane mask and every shuffle come from here.
// No toolkit header is included: NVRTC 13 ships none, and an end user's machine may have none.

#define TEFL_TARGET_CUDA 1
// Lanes per warp, and the most warps a block of 1024 threads has.
#define WARP_SIZE 32
#define MAX_WARPS (1024 / WARP_SIZE)
#define FULL_LANE_MASK 0xffffffffu

// ---- shuffles and warp synchronisation ----
__device__ __forceinline__ float shfl_xor(float v, int mask) { return __shfl_xor_sync(FULL_LANE_MASK, v, mask, WARP_SIZE); }
__device__ __forceinline__ double shfl_xor(double v, int mask) { return __shfl_xor_sync(FULL_LANE_MASK, v, mask, WARP_SIZE); }
__device__ __forceinline__ int shfl_xor(int v, int mask) { return __shfl_xor_sync(FULL_LANE_MASK, v, mask, WARP_SIZE); }
__device__ __forceinline__ float shfl(float v, int lane) { return __shfl_sync(FULL_LANE_MASK, v, lane, WARP_SIZE); }
__device__ __forceinline__ int shfl(int v, int lane) { return __shfl_sync(FULL_LANE_MASK, v, lane, WARP_SIZE); }
__device__ __forceinline__ void warp_sync() { __syncwarp(); }

// ---- 16-bit float bit patterns <-> f32 ----
__device__ __forceinline__ float half_bits_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short f32_to_half_bits(float v) {
    unsigned short r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
}
// Round to nearest even; NaN stays NaN. One cvt from sm_80 on, integer steps before.
__device__ __forceinline__ unsigned short f32_to_bf16_bits(float v) {
#if __CUDA_ARCH__ >= 800
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
#else
    const unsigned int u = __float_as_uint(v);
    return (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u)
                                           : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}
// Two f32 rounded and packed, `lo` in the low half: one instruction.
__device__ __forceinline__ unsigned int pack2_bf16_bits(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ unsigned int pack2_half_bits(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// ---- arithmetic ----
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
// The lane-wise max of two packed pairs of bf16 (f16) values, NaN in a lane where either is:
// one instruction on the raw bits, no conversion.
__device__ __forceinline__ unsigned int max2_nan_bf16_bits(unsigned int a, unsigned int b) {
    unsigned int d;
    asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ unsigned int max2_nan_half_bits(unsigned int a, unsigned int b) {
    unsigned int d;
    asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
// 2^x in one instruction (denormal results flush to zero): softmax exponents.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 1/x in one instruction (about 1 ulp; denormals flush to zero, 1/inf = 0): activations.
__device__ __forceinline__ float fast_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Bytes of the pair (a: 0-3, b: 4-7) picked by the four nibbles of `sel`, low byte first: one
// PRMT (the FP8 transpose's 4 x 4 byte blocks).
__device__ __forceinline__ unsigned int byte_perm(unsigned int a, unsigned int b, unsigned int sel) {
    return __byte_perm(a, b, sel);
}

// ---- FP8 ----
// The saturating RNE cast of one f32 to an FP8 code in one instruction (sm_89 on; NaN gives
// the canonical 0x7f, as the software cast in common.h does). `mant_bits` picks the format
// (3: e4m3, 2: e5m2); the caller's constant folds the branch away.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define HAS_FP8_CVT 1
__device__ __forceinline__ unsigned char fp8_encode_cvt(float x, int mant_bits) {
    unsigned short r;
    if (mant_bits == 3) {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
    } else {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
    }
    return (unsigned char)(r & 0xff);
}
// Two values in one instruction: `lo` in the low byte, `hi` in the high byte.
__device__ __forceinline__ unsigned short fp8x2_encode_cvt(float lo, float hi, int mant_bits) {
    unsigned short r;
    if (mant_bits == 3) {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    }
    return r;
}
#endif

// ---- asynchronous copies from global to shared memory ----
// copy_async<B>(dst, src) starts a copy of B bytes (4, 8 or a multiple of 16; both addresses
// aligned to B, at most 16) into the calling thread's open group; copy_async_commit() closes
// the group; copy_async_wait<N>() returns once at most N of the thread's groups are still in
// flight, the others' bytes then readable by this thread (by others after a barrier). sm_80
// on: cp.async, which holds no registers while the bytes travel; before, common.h's copy
// through registers.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define HAS_COPY_ASYNC 1
// The shared-window address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned int shared_window_addr(const void* p) {
    unsigned int d;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(d) : "l"(p));
    return d;
}
// copy_async to a shared-window address `d`.
template <int B> __device__ __forceinline__ void copy_async_window(unsigned int d, const void* src) {
    static_assert(B == 4 || B == 8 || B % 16 == 0, "cp.async copies 4, 8 or 16 bytes");
    if constexpr (B % 16 == 0) {
#pragma unroll
        for (int i = 0; i < B / 16; ++i)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d + 16 * i), "l"((const char*)src + 16 * i)
                         : "memory");
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(d), "l"(src), "n"(B) : "memory");
    }
}
template <int B> __device__ __forceinline__ void copy_async(void* dst, const void* src) {
    copy_async_window<B>(shared_window_addr(dst), src);
}
// A thread's base in a shared buffer that it fills with copy_async_at: the generic pointer (for
// reads) and its shared-window address, converted once instead of at every copy.
struct SharedBase {
    unsigned char* p;
    unsigned int window;
};
__device__ __forceinline__ SharedBase shared_base(void* p) { return {(unsigned char*)p, shared_window_addr(p)}; }
// copy_async of B bytes to `offset` bytes past `base`.
template <int B> __device__ __forceinline__ void copy_async_at(SharedBase base, int offset, const void* src) {
    copy_async_window<B>(base.window + offset, src);
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void copy_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#endif

// ---- streamed inputs held in L2 while they are in use, and read in whole lines ----
// load_kept<T, N>(dst, src) loads N elements of an input the kernel does not write (raw_copy's
// vectors) with an L2 evict_last cache policy; release_line(p) puts the 128-byte line at p
// (128-byte aligned) back to the normal eviction priority once the kernel is done with it.
// Stand-alone kernels in the bench's way (scripts/l2_policy_bench.cu, H200, 2026-11-29): a
// 16384 x 8192 bf16 rmsnorm took 0.1349-0.1356 ms with plain loads, 0.1293-0.1297 with kept
// ones never released (what Triton's evict_last loads do), 0.1311-0.1314 kept and released; a
// 256 MB copy 0.1345 / 0.1288 / 0.1306. Lines left at evict_last crowd the L2 of the kernels
// after it (a 24 MB buffer read twice right after: its second read took 0.0070 ms after the
// plain or the released kernel, 0.0094 after the unreleased one), hence the release. In tefl
// only the large RMSNorm forward gained (the Hopper tune configs' `norm_fwd_l2`). sm_80 on;
// common.h's fallback loads plainly.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define HAS_L2_KEEP 1
// The B bytes at src into dst (both 16-byte aligned, B a multiple of 16), a 16-byte vector at a
// time by load16(d, p): d the vector's four words in dst, p its address in src.
template <int B, typename Load16>
__device__ __forceinline__ void load_vectors16(void* dst, const void* src, Load16 load16) {
#pragma unroll
    for (int i = 0; i < B / 16; ++i) load16((unsigned int*)dst + 4 * i, (const char*)src + 16 * i);
}
template <typename T, int N> __device__ __forceinline__ void load_kept(T* dst, const T* src) {
    constexpr int B = N * (int)sizeof(T);
    unsigned long long keep;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
    if constexpr (B % 16 == 0) {
        load_vectors16<B>(dst, src, [keep](unsigned int* d, const char* p) {
            asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                : "l"(p), "l"(keep));
        });
    } else if constexpr (B % 8 == 0) {
#pragma unroll
        for (int i = 0; i < B / 8; ++i) {
            unsigned int* d = (unsigned int*)dst + 2 * i;
            asm("ld.global.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
                : "=r"(d[0]), "=r"(d[1])
                : "l"((const char*)src + 8 * i), "l"(keep));
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) dst[i] = src[i];
    }
}
__device__ __forceinline__ void release_line(const void* line) {
    asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(line) : "memory");
}
// load_whole_lines<T, N>(dst, src) loads N elements of an input the kernel does not write
// (raw_copy's vectors: 16-byte aligned multiples of 16 bytes; other sizes element by element)
// with the L2::128B prefetch-size hint: a miss fetches the whole 128-byte line from DRAM, not
// only the sectors asked for. For loads that each take part of a line whose other sectors
// another warp asks for a moment later (the FP8 cast + transpose's 64 bytes of each of 8 rows:
// H100, 2026-12-08, 1.5% faster).
template <typename T, int N> __device__ __forceinline__ void load_whole_lines(T* dst, const T* src) {
    constexpr int B = N * (int)sizeof(T);
    if constexpr (B % 16 == 0) {
        load_vectors16<B>(dst, src, [](unsigned int* d, const char* p) {
            asm("ld.global.nc.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                : "l"(p));
        });
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) dst[i] = src[i];
    }
}
#endif

// ---- flags between the blocks of one grid (cooperative launches only) ----
// A block publishes that its writes are done (every thread's writes before a barrier, then
// flag_publish from one thread: a GPU-scope fence, then the flag's store); a block that reads
// the flag with flag_read and then passes a barrier sees those writes through load_coherent
// (which skips the SM's L1: it never holds lines another SM wrote). Blocks may wait for each
// other's flags only when all of them are resident at once, which only a cooperative launch
// guarantees. From sm_70 the store is a release and the read an acquire; before, volatile
// accesses with fences.
#define HAS_GRID_FLAGS 1
__device__ __forceinline__ void flag_publish(unsigned long long* p, unsigned long long v) {
    __threadfence();
#if __CUDA_ARCH__ >= 700
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
    *(volatile unsigned long long*)p = v;
#endif
}
__device__ __forceinline__ unsigned long long flag_read(const unsigned long long* p) {
    unsigned long long v;
#if __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#else
    v = *(const volatile unsigned long long*)p;
    __threadfence();
#endif
    return v;
}
__device__ __forceinline__ float load_coherent(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}

// ---- atomics ----
// p[0] += a, p[1] += b for a global p aligned to 8 bytes: one vector reduction from sm_90 on.
__device__ __forceinline__ void atomic_add2_f32(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}
