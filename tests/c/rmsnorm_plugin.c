/* A closed-source-style tefl plugin in C: serves rmsnorm_fwd for f32 host tensors.
 * Compile-time switches make the failure modes the tests need:
 *   -DBAD_ABI        reports ABI major 99
 *   -DFAILING_INIT   init returns an error
 *   -DFAILING_OP     the kernel returns a TEFL_ERR_INTERNAL error with a message
 *   -DGARBAGE_CODE   the kernel returns an error with code 12345
 *   -DGARBAGE_HANDLE the kernel returns a pointer the host never issued
 *   -DNO_INIT        the library does not export tefl_plugin_init
 *   -DDUPLICATE_IMPL declares its impl twice (the plugin must be skipped whole)
 *   -DWRONG_SHAPE    allocates y as [1] (a contract violation)
 *   -DWRONG_DTYPE    allocates y as i32 (a contract violation)
 *   -DDOUBLE_ALLOC   allocates y twice; the second call must be refused, then writes through
 *                    the first pointer (which must still be valid)
 *   -DHUGE_ALLOC     asks for a {2^40, 2^20} f32 output (must be an error, not an abort)
 *   -DUNSUPPORTED_3  returns TEFL_ERR_UNSUPPORTED for 3-row inputs
 *   -DPOOL_FULL      returns TEFL_ERR_OUT_OF_MEMORY for its own (device) memory
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tefl_plugin.h"

static float scalar(const char *scalars, const char *name, float fallback) {
    const char *p = strstr(scalars, name);
    if (!p) return fallback;
    p += strlen(name);
    if (*p != '=') return fallback;
    return strtof(p + 1, NULL);
}

static tefl_error *rmsnorm_fwd(void *user, const tefl_call *call) {
    (void)user;
#ifdef FAILING_OP
    return call->make_error(TEFL_ERR_INTERNAL, "the acme device is on fire");
#endif
#ifdef POOL_FULL
    return call->make_error(TEFL_ERR_OUT_OF_MEMORY, "the acme device's memory pool is full");
#endif
#ifdef GARBAGE_CODE
    return call->make_error(12345, "what is this code");
#endif
#ifdef GARBAGE_HANDLE
    static int not_an_error;
    return (tefl_error *)&not_an_error;
#endif
    /* x and gamma lead; later catalogue versions may append optional inputs and outputs (the
     * FP8 output's scale, amax and scale_inv): serve the float form only. */
    if (call->n_inputs < 2 || call->n_outputs < 2) return call->make_error(TEFL_ERR_INVALID_ARGUMENT, "rmsnorm_fwd takes x and gamma");
    if (call->n_inputs > 2 && call->inputs[2].data != NULL)
        return call->make_error(TEFL_ERR_UNSUPPORTED, "no FP8 output in this plugin");
    const tefl_tensor *x = &call->inputs[0], *g = &call->inputs[1];
    if (x->dtype_code != TEFL_DTYPE_FLOAT || x->dtype_bits != 32 || g->dtype_bits != 32)
        return call->make_error(TEFL_ERR_UNSUPPORTED, "this plugin serves f32 only");
    int64_t n = x->shape[x->ndim - 1], rows = 1;
    for (int32_t i = 0; i < x->ndim - 1; i++) rows *= x->shape[i];
    float eps = scalar(call->scalars, "eps", 1e-5f);
    int zc = strstr(call->scalars, "zero_centered_gamma=true") != NULL;
#ifdef UNSUPPORTED_3
    if (rows == 3) return call->make_error(TEFL_ERR_UNSUPPORTED, "no 3-row kernel");
#endif
    void *y_data = NULL, *rs_data = NULL;
#ifdef HUGE_ALLOC
    {
        int64_t huge[2] = {(int64_t)1 << 40, (int64_t)1 << 20};
        void *p = NULL;
        tefl_error *e = call->alloc_output(call, 0, TEFL_DTYPE_FLOAT, 32, 2, huge, &p);
        if (e) return e;
    }
#endif
#if defined(WRONG_SHAPE)
    int64_t one[1] = {1};
    tefl_error *err = call->alloc_output(call, 0, TEFL_DTYPE_FLOAT, 32, 1, one, &y_data);
    if (err) return err;
    float *tiny = y_data;
    tiny[0] = 0.0f;
    int64_t rows_shape[1] = {rows};
    return call->alloc_output(call, 1, TEFL_DTYPE_FLOAT, 32, 1, rows_shape, &rs_data);
#elif defined(WRONG_DTYPE)
    tefl_error *err = call->alloc_output(call, 0, TEFL_DTYPE_INT, 32, x->ndim, x->shape, &y_data);
#else
    tefl_error *err = call->alloc_output(call, 0, TEFL_DTYPE_FLOAT, 32, x->ndim, x->shape, &y_data);
#endif
    if (err) return err;
#ifdef DOUBLE_ALLOC
    /* A second allocation of output 0 must be refused (replacing the first buffer would free
     * the memory y_data points to). The kernel keeps the refusal, writes its outputs through
     * the first pointer, and returns the refusal so the test can read it. */
    void *again = NULL;
    tefl_error *refusal = call->alloc_output(call, 0, TEFL_DTYPE_FLOAT, 32, x->ndim, x->shape, &again);
    if (!refusal) return call->make_error(TEFL_ERR_INTERNAL, "a second alloc_output for output 0 was accepted");
#endif
    int64_t rs_shape[1] = {rows};
    err = call->alloc_output(call, 1, TEFL_DTYPE_FLOAT, 32, 1, rs_shape, &rs_data);
    if (err) return err;
    const float *xs = x->data, *gs = g->data;
    float *ys = y_data, *rs = rs_data;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xs[r * n + i] * xs[r * n + i];
        float inv = (float)(1.0 / sqrt(ss / n + eps));
        rs[r] = inv;
        for (int64_t i = 0; i < n; i++) ys[r * n + i] = xs[r * n + i] * inv * (zc ? 1.0f + gs[i] : gs[i]);
    }
#ifdef DOUBLE_ALLOC
    /* The outputs were written through the first pointer (still valid); hand the refusal back. */
    return refusal;
#else
    return NULL;
#endif
}

#ifndef NO_INIT
static const tefl_vendor_info vendor = {sizeof(tefl_vendor_info), "cplug", "cpu", "true"};
static const tefl_op_impl impls[] = {
    {sizeof(tefl_op_impl), "rmsnorm_fwd", "vendor.cplug", 300, "f32", rmsnorm_fwd, NULL},
#ifdef DUPLICATE_IMPL
    {sizeof(tefl_op_impl), "rmsnorm_fwd", "vendor.cplug", 100, "f32", rmsnorm_fwd, NULL},
#endif
};

tefl_error *tefl_plugin_init(const tefl_host_api *host, tefl_plugin *out) {
    if (host->abi_major != TEFL_ABI_MAJOR) return host->make_error(TEFL_ERR_UNSUPPORTED, "built for another ABI");
    out->abi_major = TEFL_ABI_MAJOR;
    out->abi_minor = TEFL_ABI_MINOR;
#ifdef BAD_ABI
    out->abi_major = 99;
#endif
#ifdef FAILING_INIT
    return host->make_error(TEFL_ERR_DEVICE, "no acme device found");
#endif
    out->vendor = &vendor;
    out->impls = impls;
    out->n_impls = sizeof(impls) / sizeof(impls[0]);
    return NULL;
}
#else
/* Without an init the kernel is only referenced here, so that the library still builds. */
tefl_kernel_fn tefl_unused_kernel = rmsnorm_fwd;
#endif
