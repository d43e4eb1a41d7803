// Stand-alone measurement of L2 cache policies on streaming kernels (not part of tefl's build):
// a 16384 x 8192 bf16 RMSNorm forward in tefl's shape (one row a block of 256 threads, four
// 16-byte vectors a thread kept in registers) with its x loads plain, at an L2 evict_last policy,
// or at evict_last and released afterwards (applypriority evict_normal per 128-byte line: every
// row, or only the last 8192, 4096, 2048 or 1024 rows, those that can still be in L2 at the
// end), the shape of Triton's kernel (torch.compile: 512 threads, a sum pass with evict_last
// loads, an output pass re-reading x with evict_first loads), and a 16-byte copy the same three
// ways.
// Each is timed as tefl's bench times an op: warm-up calls, then per repetition a 256 MiB fill
// (the L2 flush) and one call between events, the median of 20; three rounds, alternating.
// Then, per variant, how it leaves the L2 for the kernel after it: a 24 MB and a 40 MB buffer,
// each read twice right after the variant, the second read timed.
//
// The flush is cudaMemsetAsync, or with an argument holding `k` a fill kernel of 16-byte stores
// (as torch's `zero_()`, the bench peers' flush, does it); with `p` in it the buffers come from
// the default memory pool (cudaMallocAsync, as tefl's CUDA runtime allocates) instead of
// cudaMalloc (as torch's caching allocator does).
//
// A cubin of tefl's norm_fwd (from its kernel cache, TEFL_CACHE_DIR/nvrtc/norm-*.cubin) as the
// second argument is timed too, with the arguments tefl passes.
//
// On the GPU machine (it has nvcc): nvcc -O3 -arch=sm_90a -std=c++17 -o l2bench
// scripts/l2_policy_bench.cu -lcuda && ./l2bench [k][p] [CUBIN]. The docs/performance-log.md entries of 2026-11-29
// and 2026-12-03 have what it measured on an H200.
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <vector>

typedef unsigned int u32;

constexpr int ROWS = 16384;
constexpr int VECS_PER_ROW = 1024;  // 8192 bf16 columns
constexpr size_t N_VECS = (size_t)ROWS * VECS_PER_ROW;

enum Load { PLAIN = 0, KEEP = 1, FIRST = 2, KEEP_L2_ONLY = 3 };

// A 16-byte load: plain, or with an L2 evict_last / evict_first cache policy (and the matching
// L1 priority, as Triton emits them).
template <int L> __device__ __forceinline__ uint4 load16(const uint4* p) {
    uint4 v;
    unsigned long long pol;
    if (L == KEEP) {
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
        asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.b32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p), "l"(pol));
    } else if (L == KEEP_L2_ONLY) {
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
        asm volatile("ld.global.L2::cache_hint.v4.b32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p), "l"(pol));
    } else if (L == FIRST) {
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.b32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p), "l"(pol));
    } else {
        v = *p;
    }
    return v;
}

// Back to the normal eviction priority: the line at p when p starts one.
__device__ __forceinline__ void release(const void* p) {
    if (((unsigned long long)p & 127) == 0) asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(p) : "memory");
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int BLOCK> __device__ __forceinline__ float block_sum(float v, float* slots) {
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = v;
    __syncthreads();
    return warp_sum(threadIdx.x % 32 < BLOCK / 32 ? slots[threadIdx.x % 32] : 0.0f);
}

__device__ __forceinline__ void unpack(uint4 w, float* f) {
    const u32 a[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(a[i] << 16);
        f[2 * i + 1] = __uint_as_float(a[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ u32 pack2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<u32*>(&h);
}

__device__ __forceinline__ uint4 scale(uint4 xv, uint4 gv, float r) {
    float f[8], g[8];
    unpack(xv, f);
    unpack(gv, g);
    return make_uint4(pack2(f[0] * r * g[0], f[1] * r * g[1]), pack2(f[2] * r * g[2], f[3] * r * g[3]),
                      pack2(f[4] * r * g[4], f[5] * r * g[5]), pack2(f[6] * r * g[6], f[7] * r * g[7]));
}

__device__ __forceinline__ float sum_sq(uint4 v) {
    float f[8], s = 0.0f;
    unpack(v, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) s += f[j] * f[j];
    return s;
}

// tefl's shape: the row kept in registers, read once.
template <int L, bool RELEASE, int TAIL = ROWS>
__global__ void __launch_bounds__(256, 4) rms_regs(const uint4* __restrict__ x, const uint4* __restrict__ g,
                                                    uint4* __restrict__ y, float* __restrict__ rs) {
    __shared__ float slots[32];
    const uint4* xr = x + (size_t)blockIdx.x * VECS_PER_ROW;
    uint4* yr = y + (size_t)blockIdx.x * VECS_PER_ROW;
    uint4 c[4];
#pragma unroll
    for (int it = 0; it < 4; ++it) c[it] = load16<L>(xr + threadIdx.x + it * 256);
    float s = 0.0f;
#pragma unroll
    for (int it = 0; it < 4; ++it) s += sum_sq(c[it]);
    const float r = rsqrtf(block_sum<256>(s, slots) / (VECS_PER_ROW * 8) + 1e-5f);
#pragma unroll
    for (int it = 0; it < 4; ++it) {
        yr[threadIdx.x + it * 256] = scale(c[it], g[threadIdx.x + it * 256], r);
        if (RELEASE && (int)blockIdx.x >= ROWS - TAIL) release(xr + threadIdx.x + it * 256);
    }
    if (threadIdx.x == 0) rs[blockIdx.x] = r;
}

// Triton's shape: 512 threads, a sum pass (evict_last), then the output pass re-reading x
// (evict_first) with gamma at evict_last.
__global__ void __launch_bounds__(512) rms_two_pass(const uint4* __restrict__ x, const uint4* __restrict__ g,
                                                   uint4* __restrict__ y, float* __restrict__ rs) {
    __shared__ float slots[32];
    const uint4* xr = x + (size_t)blockIdx.x * VECS_PER_ROW;
    uint4* yr = y + (size_t)blockIdx.x * VECS_PER_ROW;
    float s = 0.0f;
#pragma unroll
    for (int it = 0; it < 2; ++it) s += sum_sq(load16<KEEP>(xr + threadIdx.x + it * 512));
    const float r = rsqrtf(block_sum<512>(s, slots) / (VECS_PER_ROW * 8) + 1e-5f);
#pragma unroll
    for (int it = 0; it < 2; ++it)
        yr[threadIdx.x + it * 512] = scale(load16<FIRST>(xr + threadIdx.x + it * 512), load16<KEEP>(g + threadIdx.x + it * 512), r);
    if (threadIdx.x == 0) rs[blockIdx.x] = r;
}

// A copy, two 16-byte vectors a thread.
template <int L, bool RELEASE> __global__ void copy(const uint4* __restrict__ x, uint4* __restrict__ y) {
    const size_t i = (size_t)blockIdx.x * 512 + threadIdx.x;
    const uint4 a = load16<L>(x + i), b = load16<L>(x + i + 256);
    y[i] = a;
    y[i + 256] = b;
    if (RELEASE) {
        release(x + i);
        release(x + i + 256);
    }
}

// The flush as torch's `zero_()` does it: a kernel storing 16-byte vectors.
__global__ void fill_kernel(uint4* __restrict__ p, size_t n, u32 v) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_uint4(v, v, v, v);
}

__global__ void read_all(const uint4* __restrict__ b, size_t n, u32* out) {
    u32 acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = b[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

struct Buffers {
    uint4 *x, *g, *y;
    float* rs;
};
typedef void (*Run)(const Buffers&, cudaStream_t);

// tefl's own norm_fwd from a cubin of its kernel cache (TEFL_CACHE_DIR/nvrtc/norm-*.cubin, the
// forward variant the bench compiled): its arguments as tefl-gpu's simt/norm.rs passes them,
// the last 4096 rows released (zero-centred gamma is the variant's ZC define, not an argument).
static CUfunction g_tefl = nullptr;
void run_tefl(const Buffers& b, cudaStream_t s) {
    const void* beta = nullptr;
    const void* none = nullptr;
    float* mu = b.rs;
    int rows = ROWS, n = VECS_PER_ROW * 8, release_from = ROWS - 4096;
    float eps = 1e-5f;
    void* args[] = {(void*)&b.x, (void*)&b.g, (void*)&beta, (void*)&b.y,   (void*)&mu,  (void*)&b.rs,        (void*)&rows,
                    (void*)&n,   (void*)&eps, (void*)&none, (void*)&none, (void*)&none, (void*)&release_from};
    cuLaunchKernel(g_tefl, ROWS, 1, 1, 256, 1, 1, 0, (CUstream)s, args, nullptr);
}

template <int L, bool R, int T = ROWS> void run_rms(const Buffers& b, cudaStream_t s) {
    rms_regs<L, R, T><<<ROWS, 256, 0, s>>>(b.x, b.g, b.y, b.rs);
}
void run_two_pass(const Buffers& b, cudaStream_t s) { rms_two_pass<<<ROWS, 512, 0, s>>>(b.x, b.g, b.y, b.rs); }
template <int L, bool R> void run_copy(const Buffers& b, cudaStream_t s) { copy<L, R><<<N_VECS / 512, 256, 0, s>>>(b.x, b.y); }

static bool g_kernel_flush = false;
void flush_l2(void* flush, int i, cudaStream_t s) {
    if (g_kernel_flush) fill_kernel<<<132 * 16, 256, 0, s>>>((uint4*)flush, (256u << 20) / 16, (u32)i);
    else cudaMemsetAsync(flush, i, 256u << 20, s);
}

int main(int argc, char** argv) {
    g_kernel_flush = argc > 1 && strchr(argv[1], 'k');
    const bool pool = argc > 1 && strchr(argv[1], 'p');
    const char* cubin = argc > 2 ? argv[2] : nullptr;
    printf("flush: %s; buffers from %s\n", g_kernel_flush ? "a fill kernel" : "cudaMemsetAsync",
           pool ? "the default memory pool (cudaMallocAsync)" : "cudaMalloc");
    Buffers b;
    void* flush;
    auto alloc = [&](void** p, size_t bytes) {
        if (pool) {
            cudaMallocAsync(p, bytes, 0);
            cudaStreamSynchronize(0);
        } else {
            cudaMalloc(p, bytes);
        }
    };
    alloc((void**)&b.x, N_VECS * 16);
    alloc((void**)&b.y, N_VECS * 16);
    alloc((void**)&b.g, VECS_PER_ROW * 16);
    alloc((void**)&b.rs, ROWS * 4);
    alloc(&flush, 256u << 20);
    cudaMemset(b.x, 0x3f, N_VECS * 16);
    cudaMemset(b.g, 0x3f, VECS_PER_ROW * 16);
    if (cubin) {
        CUmodule m;
        if (cuModuleLoad(&m, cubin) != CUDA_SUCCESS || cuModuleGetFunction(&g_tefl, m, "norm_fwd") != CUDA_SUCCESS) {
            printf("no norm_fwd in %s\n", cubin);
            return 1;
        }
        int regs = 0;
        cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, g_tefl);
        printf("tefl's norm_fwd from %s: %d registers\n", cubin, regs);
    }
    const struct {
        const char* name;
        Run run;
    } variants[] = {
        {"rmsnorm, plain loads", run_rms<PLAIN, false>},
        {"rmsnorm, kept", run_rms<KEEP, false>},
        {"rmsnorm, kept and released", run_rms<KEEP, true>},
        {"rmsnorm, kept, last 8192 released", run_rms<KEEP, true, 8192>},
        {"rmsnorm, kept, last 4096 released", run_rms<KEEP, true, 4096>},
        {"rmsnorm, kept, last 2048 released", run_rms<KEEP, true, 2048>},
        {"rmsnorm, kept, last 1024 released", run_rms<KEEP, true, 1024>},
        {"rmsnorm, L2 kept only, last 4096", run_rms<KEEP_L2_ONLY, true, 4096>},
        {"rmsnorm, Triton's two passes", run_two_pass},
        {"copy, plain loads", run_copy<PLAIN, false>},
        {"copy, kept", run_copy<KEEP, false>},
        {"copy, kept and released", run_copy<KEEP, true>},
        {"tefl's norm_fwd (cubin)", run_tefl},
    };
    // tefl's kernel (the last) only with a cubin given.
    const int nv = sizeof(variants) / sizeof(variants[0]) - (cubin ? 0 : 1);
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaEvent_t a[20], e[20];
    for (int i = 0; i < 20; ++i) {
        cudaEventCreate(&a[i]);
        cudaEventCreate(&e[i]);
    }
    auto median = [&]() {
        cudaStreamSynchronize(s);
        std::vector<float> t(20);
        for (int i = 0; i < 20; ++i) cudaEventElapsedTime(&t[i], a[i], e[i]);
        std::sort(t.begin(), t.end());
        return t[10];
    };
    std::vector<std::vector<float>> ms(nv);
    for (int round = 0; round < 3; ++round) {
        for (int k = 0; k < nv; ++k) {
            for (int w = 0; w < 200; ++w) variants[k].run(b, s);
            for (int i = 0; i < 20; ++i) {
                flush_l2(flush, i, s);
                cudaEventRecord(a[i], s);
                variants[k].run(b, s);
                cudaEventRecord(e[i], s);
            }
            ms[k].push_back(median());
        }
    }
    const double bytes = 2.0 * N_VECS * 16;
    for (int k = 0; k < nv; ++k) {
        printf("%-32s", variants[k].name);
        for (float m : ms[k]) printf("  %.4f ms (%4.0f GB/s)", m, bytes / (m * 1e-3) / 1e9);
        printf("\n");
    }
    // How much of the L2 a variant leaves to the kernel after it: a buffer of `mb` MB read twice
    // right after the variant, the second read timed (24 MB: half the H100's L2; 40 MB: most of
    // the H200's).
    u32* sink;
    cudaMalloc(&sink, 4);
    for (const size_t mb : {24u, 40u}) {
        const size_t n_reuse = (mb << 20) / 16;
        uint4* reuse;
        cudaMalloc(&reuse, n_reuse * 16);
        cudaMemset(reuse, 1, n_reuse * 16);
        for (int k = 0; k < nv; ++k) {
            for (int i = 0; i < 20; ++i) {
                flush_l2(flush, i, s);
                variants[k].run(b, s);
                read_all<<<132 * 8, 256, 0, s>>>(reuse, n_reuse, sink);
                cudaEventRecord(a[i], s);
                read_all<<<132 * 8, 256, 0, s>>>(reuse, n_reuse, sink);
                cudaEventRecord(e[i], s);
            }
            printf("after %-32s the second read of %zu MB: %.4f ms\n", variants[k].name, mb, median());
        }
        cudaFree(reuse);
    }
    const cudaError_t err = cudaDeviceSynchronize();
    printf("%s\n", cudaGetErrorString(err));
    return err == cudaSuccess ? 0 : 1;
}
