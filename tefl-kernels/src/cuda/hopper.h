// Hopper building blocks (sm_90a PTX): mbarriers, the tensor memory accelerator's 2-D tile
// loads, warpgroup MMA (wgmma) on shared-memory descriptors, and register reallocation.
// CUDA-only, and only in sources compiled for the arch-specific target (`Source::arch_specific`):
// wgmma and setmaxnreg do not exist in plain sm_90 code.

// A CUtensorMap as the driver encodes it (cuTensorMapEncodeTiled): 128 opaque bytes.
struct __align__(64) TensorMap {
    unsigned long long words[16];
};

// ---- mbarriers (shared-memory addresses from smem_addr) ----
__device__ __forceinline__ void mbar_init(u32 bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes the initialisations visible to the other threads and to the copy engine.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival that also expects `bytes` of copy-engine transactions before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed (a fresh barrier's "previous" phase,
// parity 1, counts as completed: producers start by waiting on it).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

// ---- the tensor memory accelerator ----
// The box of `map` at element coordinates (c0 innermost, c1) into shared memory at `dst`,
// completing `bytes` of transactions on `bar`; out-of-bounds elements arrive as zeros.
__device__ __forceinline__ void tma_load_2d(u32 dst, const TensorMap* map, int c0, int c1, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// The same for a 4-D map: coordinates c0 (innermost) .. c3.
__device__ __forceinline__ void tma_load_4d(u32 dst, const TensorMap* map, int c0, int c1, int c2, int c3, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// The box of `map` at (c0, c1) from shared memory at `src` (128-byte swizzled as the map says),
// as one bulk group of this thread; the parts past the tensor's edges are not written.
__device__ __forceinline__ void tma_store_2d(const TensorMap* map, int c0, int c1, u32 src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                     reinterpret_cast<unsigned long long>(map)),
                 "r"(c0), "r"(c1), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's bulk groups are still reading shared memory.
template <int N> __device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// Waits until at most N of this thread's bulk groups are incomplete.
template <int N> __device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}
// Orders this thread's ordinary shared-memory stores before the copy engine's reads.
__device__ __forceinline__ void fence_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Zeroes rows [r0, rows) of a tile loaded by the copy engine: `boxes` boxes of `rows` rows x
// 128 bytes from `tile` (zeroing whole rows needs no swizzle). Thread i of n stores 16-byte
// chunks i, i + n, ...; the caller then fences (fence_async_shared) and joins the n threads
// before any wgmma reads the tile. Call it only once the copy into the tile has completed.
__device__ __forceinline__ void zero_rows(u32 tile, int boxes, int rows, int r0, int i, int n) {
    r0 = r0 < 0 ? 0 : r0;
    const int per_box = (rows - r0) * 8;
    for (int x = i; x < boxes * per_box; x += n) {
        const u32 at = tile + (x / per_box) * rows * 128 + r0 * 128 + (x % per_box) * 16;
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(at), "r"(0) : "memory");
    }
}

// ---- warpgroup MMA ----
// A shared-memory matrix descriptor with the 128-byte swizzle (the layout the copy engine
// writes with CU_TENSOR_MAP_SWIZZLE_128B): start address, leading and stride byte offsets.
__device__ __forceinline__ unsigned long long wgmma_desc(u32 addr, u32 lead_bytes, u32 stride_bytes) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lead_bytes & 0x3FFFF) >> 4) << 16) |
           ((unsigned long long)((stride_bytes & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
// x, opaque to the compiler: descriptors derived from it where an MMA needs them are computed
// there (a few uniform-datapath instructions) instead of being hoisted out of a loop, where,
// under the consumers' register pressure, they are spilled and reloaded just before the MMA.
__device__ __forceinline__ u32 opaque(u32 x) {
    asm volatile("mov.b32 %0, %1;" : "=r"(x) : "r"(x));
    return x;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are still in flight.
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// ---- wgmma chains: the k16 steps of one product as one asm statement ----
// As one statement a step, ptxas rebuilds each step's descriptor from its address (several
// uniform-datapath instructions between consecutive wgmma) and, under register pressure, may
// move a partial accumulator to other registers before the chain's last step, which waits for
// every MMA in flight. In a chain, step 0 takes the base descriptors (operands A, B) and step
// ks > 0 adds immediate offsets (operands OA, OB, in the descriptors' 16-byte units) to them: a
// descriptor's low 14 bits are its shared-memory address / 16, and every address a step reads
// is below 256 KB, so the sum stays in that field. T_PTX (the element type's PTX name) comes
// from the including source. A chain is WG_CHAIN_HEAD, its steps, then "}".
#define WG_CHAIN_HEAD "{\n.reg .b64 da, db;\n.reg .pred add, no_add;\nsetp.ne.b32 add, 1, 0;\nsetp.ne.b32 no_add, 0, 0;\n"
// Both operands in shared memory, TRANS their transpose flags ("0, 0": both K-major, "1, 1": both
// MN-major); step 0 overwrites the accumulators.
#define WG_SS_STEP0_T(SHAPE, REGS, A, B, TRANS) \
    "wgmma.mma_async.sync.aligned." SHAPE ".f32." T_PTX "." T_PTX " " REGS ", %" #A ", %" #B ", no_add, 1, 1, " TRANS ";\n"
#define WG_SS_STEP_T(SHAPE, REGS, A, B, OA, OB, TRANS)                                          \
    "add.s64 da, %" #A ", %" #OA ";\nadd.s64 db, %" #B ", %" #OB ";\n"                       \
    "wgmma.mma_async.sync.aligned." SHAPE ".f32." T_PTX "." T_PTX " " REGS ", da, db, add, 1, 1, " TRANS ";\n"
// Both operands K-major in shared memory.
#define WG_SS_STEP0(SHAPE, REGS, A, B) WG_SS_STEP0_T(SHAPE, REGS, A, B, "0, 0")
#define WG_SS_STEP(SHAPE, REGS, A, B, OA, OB) WG_SS_STEP_T(SHAPE, REGS, A, B, OA, OB, "0, 0")
// A from registers (operands R0..R3), B MN-major in shared memory; every step accumulates.
#define WG_RS_STEP0(SHAPE, REGS, R0, R1, R2, R3, B)                                               \
    "wgmma.mma_async.sync.aligned." SHAPE ".f32." T_PTX "." T_PTX " " REGS ", {%" #R0 ", %" #R1 ", %" #R2 \
    ", %" #R3 "}, %" #B ", add, 1, 1, 1;\n"
#define WG_RS_STEP(SHAPE, REGS, R0, R1, R2, R3, B, OB)                                             \
    "add.s64 db, %" #B ", %" #OB ";\n"                                                          \
    "wgmma.mma_async.sync.aligned." SHAPE ".f32." T_PTX "." T_PTX " " REGS ", {%" #R0 ", %" #R1 ", %" #R2 \
    ", %" #R3 "}, db, add, 1, 1, 1;\n"
// Chains of 4 or 8 register-A steps over an MN-major B that advances 2048 bytes (16 rows of 128
// bytes) a step, C 64 x 128 (N128: WG_ACC64 operands) or 64 x 64 (N64: WG_ACC32): the statement
// is WG_RS_CHAIN<steps>_N<n>, its inputs WG_RS_IN<steps>(a, desc), with a the A fragments
// (u32 a[][4]) and desc B's descriptor at step 0. The operand numbers are the accumulators', then
// four A registers a step, the descriptor and the steps' offsets (WG_MN_OFF).
// Step kk's offset operand (descriptor units of 16 bytes) in an MN-major operand that advances
// 2048 bytes, 16 rows of 128 bytes, a k16 step (also the backward's dQ chain, both operands).
#define WG_MN_OFF(kk) "n"(((kk) * 2048) >> 4)
#define WG_RS_IN4(a, desc) WG_A4(a, 0), WG_A4(a, 1), WG_A4(a, 2), WG_A4(a, 3), "l"(desc), WG_MN_OFF(1), WG_MN_OFF(2), WG_MN_OFF(3)
#define WG_RS_IN8(a, desc)                                                                                      \
    WG_A4(a, 0), WG_A4(a, 1), WG_A4(a, 2), WG_A4(a, 3), WG_A4(a, 4), WG_A4(a, 5), WG_A4(a, 6), WG_A4(a, 7), "l"(desc), \
        WG_MN_OFF(1), WG_MN_OFF(2), WG_MN_OFF(3), WG_MN_OFF(4), WG_MN_OFF(5), WG_MN_OFF(6), WG_MN_OFF(7)
#define WG_RS128_0(...) WG_RS_STEP0("m64n128k16", WG_REGS_64, __VA_ARGS__)
#define WG_RS128(...) WG_RS_STEP("m64n128k16", WG_REGS_64, __VA_ARGS__)
#define WG_RS64_0(...) WG_RS_STEP0("m64n64k16", WG_REGS_32, __VA_ARGS__)
#define WG_RS64(...) WG_RS_STEP("m64n64k16", WG_REGS_32, __VA_ARGS__)
#define WG_RS_CHAIN8_N128                                                                                         \
    WG_CHAIN_HEAD WG_RS128_0(64, 65, 66, 67, 96) WG_RS128(68, 69, 70, 71, 96, 97) WG_RS128(72, 73, 74, 75, 96, 98) \
        WG_RS128(76, 77, 78, 79, 96, 99) WG_RS128(80, 81, 82, 83, 96, 100) WG_RS128(84, 85, 86, 87, 96, 101)       \
            WG_RS128(88, 89, 90, 91, 96, 102) WG_RS128(92, 93, 94, 95, 96, 103) "}"
#define WG_RS_CHAIN8_N64                                                                                      \
    WG_CHAIN_HEAD WG_RS64_0(32, 33, 34, 35, 64) WG_RS64(36, 37, 38, 39, 64, 65) WG_RS64(40, 41, 42, 43, 64, 66) \
        WG_RS64(44, 45, 46, 47, 64, 67) WG_RS64(48, 49, 50, 51, 64, 68) WG_RS64(52, 53, 54, 55, 64, 69)         \
            WG_RS64(56, 57, 58, 59, 64, 70) WG_RS64(60, 61, 62, 63, 64, 71) "}"
#define WG_RS_CHAIN4_N128                                                                                         \
    WG_CHAIN_HEAD WG_RS128_0(64, 65, 66, 67, 80) WG_RS128(68, 69, 70, 71, 80, 81) WG_RS128(72, 73, 74, 75, 80, 82) \
        WG_RS128(76, 77, 78, 79, 80, 83) "}"
#define WG_RS_CHAIN4_N64                                                                                      \
    WG_CHAIN_HEAD WG_RS64_0(32, 33, 34, 35, 48) WG_RS64(36, 37, 38, 39, 48, 49) WG_RS64(40, 41, 42, 43, 48, 50) \
        WG_RS64(44, 45, 46, 47, 48, 51) "}"
// Step ks's offset operands of a chain with both operands K-major in shared memory (the copy
// engine's 128-byte swizzled boxes of 64 columns): box ks / 4 (boxes of BOX_A bytes for A, BOX_B
// for B), 32 bytes a step within one.
#define WG_KMAJOR_OFFS(ks, BOX_A, BOX_B) \
    "n"((((ks) / 4) * (BOX_A) + ((ks) % 4) * 32) >> 4), "n"((((ks) / 4) * (BOX_B) + ((ks) % 4) * 32) >> 4)
// The four A registers of k16 step kk of fragments `a` (u32 a[][4]) as asm operands.
#define WG_A4(a, kk) "r"(a[kk][0]), "r"(a[kk][1]), "r"(a[kk][2]), "r"(a[kk][3])

// Keeps the compiler from moving accesses of an accumulator register across the asynchronous
// MMAs that own it.
__device__ __forceinline__ void acc_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// The thread's warpgroup (threadIdx.x / 128), broadcast from lane 0 so that ptxas knows it to
// be the same across a warp. Values derived from it (a consumer's operand addresses, its role)
// then live in uniform registers: the wgmma descriptors built from them are uniform adds, not
// vector arithmetic and R2UR copies at every k step (the head-dim-128 attention backward: 72
// R2UR down to 22, 104 instructions fewer, 3% faster), and a branch on it around wgmma is known
// uniform (behind a branch ptxas cannot prove uniform, wgmma is serialised: C7520).
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); }

// Warpgroup register budgets: a producer gives registers back, consumers take them.
template <int N> __device__ __forceinline__ void regs_release() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N> __device__ __forceinline__ void regs_claim() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}

// Operand lists of the wgmma accumulators (generated: {%0 .. %N-1} and "+f"(d[i]) for each).
#define WG_REGS_16 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
    "}"
#define WG_REGS_32 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
    "}"
#define WG_REGS_64 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
    "}"
#define WG_REGS_128 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
    "}"
#define WG_ACC8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_ACC16(d, i) WG_ACC8(d, i), WG_ACC8(d, i + 8)
#define WG_ACC32(d, i) WG_ACC8(d, i), WG_ACC8(d, i + 8), WG_ACC8(d, i + 16), WG_ACC8(d, i + 24)
#define WG_ACC64(d, i) WG_ACC8(d, i), WG_ACC8(d, i + 8), WG_ACC8(d, i + 16), WG_ACC8(d, i + 24), \
    WG_ACC8(d, i + 32), WG_ACC8(d, i + 40), WG_ACC8(d, i + 48), WG_ACC8(d, i + 56)
#define WG_ACC128(d) WG_ACC64(d, 0), WG_ACC64(d, 64)
