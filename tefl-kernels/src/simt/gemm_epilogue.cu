// The GEMM epilogue for cases cuBLASLt's fused epilogues do not take (mixed dtypes, unaligned
// aux, the bias gradient of unrounded values): cuBLASLt writes alpha·op(A)·op(B) in f32 to
// `w`, this kernel finishes it. Defines: TC (c), TB (bias), TAUX (aux in), TD (d, aux out),
// EP (0 none, 1 bias, 2 gelu, 3 bias+gelu, 4 dgelu, 5 dgelu+bias grad, 6 bias grad).

__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float dgelu_tanh(float x) {
    const float t = tanhf(0.7978845608f * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
}

// v = w + c; epilogue; d = v (rounded), and w = v (unrounded) for the bias gradient.
extern "C" __global__ void gemm_epilogue(float* __restrict__ w, const TC* __restrict__ c, const TB* __restrict__ bias,
                                         const TAUX* __restrict__ aux, TD* __restrict__ d, TD* __restrict__ aux_out,
                                         long long total, int n, int accumulate) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        float v = w[i];
        if (accumulate) v += to_f32(c[i]);
        const int j = (int)(i % n);
#if EP == 1 || EP == 3
        v += to_f32(bias[j]);
#endif
#if EP == 2 || EP == 3
        aux_out[i] = from_f32<TD>(v);
        v = gelu_tanh(v);
#endif
#if EP == 4 || EP == 5
        v *= dgelu_tanh(to_f32(aux[i]));
#endif
        d[i] = from_f32<TD>(v);
#if EP == 5 || EP == 6
        w[i] = v;
#endif
    }
}

// Column sums of the f32 [rows, n] matrix w: block (x, y) sums rows y, y + gridDim.y, ...
extern "C" __global__ void col_sum_partial(const float* __restrict__ w, float* __restrict__ ws, int rows, int n) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float s = 0.0f;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) s += w[(size_t)r * n + c];
    ws[(size_t)blockIdx.y * n + c] = s;
}

// out[c] = Σ_p ws[p][c].
extern "C" __global__ void col_sum_finish(const float* __restrict__ ws, float* __restrict__ out, int parts, int n) {
    finish_column_sums(ws, out, parts, n);
}
