// Dropout with the Philox stream of tefl_core::philox: element i keeps when
// uniform(seed, offset, i) >= p. Defines: TX (x / y dtype), BLOCK.
// One thread per Philox block of 4 elements. Outputs are products (x · 0 when dropped), as
// torch's are, so a NaN input stays NaN whether or not it is dropped.

extern "C" __global__ void __launch_bounds__(BLOCK) dropout_fwd(const TX* __restrict__ x, TX* __restrict__ y,
                                                             u8* __restrict__ mask, long long total, float p,
                                                             u64 seed, u64 offset) {
    const float keep_scale = 1.0f / (1.0f - p);
    for (long long blk = (long long)blockIdx.x * BLOCK + threadIdx.x; blk * 4 < total;
         blk += (long long)gridDim.x * BLOCK) {
        u32 c[4] = {(u32)blk, (u32)((u64)blk >> 32), (u32)offset, (u32)(offset >> 32)};
        philox4x32_10(c, (u32)seed, (u32)(seed >> 32));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const long long i = blk * 4 + l;
            if (i < total) {
                const float u = (float)(c[l] >> 8) * (1.0f / 16777216.0f);
                const bool keep = u >= p;
                mask[i] = keep ? 1 : 0;
                y[i] = from_f32<TX>(to_f32(x[i]) * (keep ? keep_scale : 0.0f));
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK) dropout_bwd(const TX* __restrict__ dy, const u8* __restrict__ mask,
                                                             TX* __restrict__ dx, long long total, float p) {
    const float keep_scale = 1.0f / (1.0f - p);
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < total; i += (long long)gridDim.x * BLOCK) {
        dx[i] = from_f32<TX>(to_f32(dy[i]) * (mask[i] ? keep_scale : 0.0f));
    }
}
