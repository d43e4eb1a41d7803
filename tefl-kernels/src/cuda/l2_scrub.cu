// The L2 scrub that comes before a benchmark's L2 flush (CudaRuntime::flush_cache): a fill of
// a buffer larger than the L2 evicts the lines at the normal priority, but not the lines a
// kernel loaded with an L2 evict_last policy and never put back (Triton's evict_last loads;
// torch.compile's norms use them), and those then serve the next timed call from L2. On an
// H100 (2026-12-06, scripts/diag/rmsnorm_torch_loop.py, 8192x4096 bf16 RMSNorm, a 256 MiB
// memset before each call) one untimed call of torch.compile's kernel made tefl's later calls
// on the same x 0.0456-0.0467 ms (0.0482-0.0490 in processes without that call), and with
// this scrub before the memset 0.0485-0.0494 again; FlagGems timed after torch.compile took
// 0.0476 without the scrub, 0.0505 with it.
// l2_keep_lines loads each 128-byte line of the scratch buffer with an evict_last policy, so
// its lines take the place of any kept lines; l2_release_lines then puts every one of them
// back to the normal priority, and the fill after both evicts them. Two kernels: a line's
// release must come after its load has filled it. Defines: BLOCK.

extern "C" __global__ void __launch_bounds__(BLOCK) l2_keep_lines(u32* __restrict__ buf, long long lines) {
    for (long long l = (long long)blockIdx.x * BLOCK + threadIdx.x; l < lines; l += (long long)gridDim.x * BLOCK) {
        u32 v[4];
        load_kept<u32, 4>(v, buf + l * 32);
        // A use of the load that never stores (the fill after the scrub overwrites the buffer
        // anyway), so that the compiler keeps it.
        if ((v[0] ^ v[1] ^ v[2] ^ v[3]) == 0x7fc00001u) buf[l * 32] = v[0];
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK) l2_release_lines(const u32* __restrict__ buf, long long lines) {
    for (long long l = (long long)blockIdx.x * BLOCK + threadIdx.x; l < lines; l += (long long)gridDim.x * BLOCK) {
        release_line(buf + l * 32);
    }
}
