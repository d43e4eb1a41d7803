/* A closed-source-style tefl plugin in C: serves rmsnorm_fwd for f32 host tensors.
 * Compile-time switches make the failure modes the tests need:
 *   -DBAD_ABI        reports ABI major 99
 *   -DFAILING_INIT   init returns an error
 *   -DFAILING_OP     the kernel returns TEFL_ERR_INTERNAL with a message
 *   -DGARBAGE_CODE   the kernel returns 12345
 *   -DNO_INIT        the library does not export tefl_plugin_init
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

static int32_t rmsnorm_fwd(void *user, const tefl_call *call) {
    (void)user;
#ifdef FAILING_OP
    call->set_error(call, TEFL_ERR_INTERNAL, "the acme device is on fire");
    return TEFL_ERR_INTERNAL;
#endif
#ifdef GARBAGE_CODE
    return 12345;
#endif
    if (call->n_inputs != 2 || call->n_outputs != 2) return TEFL_ERR_INVALID_ARGUMENT;
    const tefl_tensor *x = &call->inputs[0], *g = &call->inputs[1];
    if (x->dtype_code != TEFL_DTYPE_FLOAT || x->dtype_bits != 32 || g->dtype_bits != 32) {
        call->set_error(call, TEFL_ERR_UNSUPPORTED, "this plugin serves f32 only");
        return TEFL_ERR_UNSUPPORTED;
    }
    int64_t n = x->shape[x->ndim - 1], rows = 1;
    for (int32_t i = 0; i < x->ndim - 1; i++) rows *= x->shape[i];
    float eps = scalar(call->scalars, "eps", 1e-5f);
    int zc = strstr(call->scalars, "zero_centered_gamma=true") != NULL;
    void *y_data = NULL, *rs_data = NULL;
    if (call->alloc_output(call, 0, TEFL_DTYPE_FLOAT, 32, x->ndim, x->shape, &y_data) != TEFL_OK) return TEFL_ERR_OUT_OF_MEMORY;
    int64_t rs_shape[1] = {rows};
    if (call->alloc_output(call, 1, TEFL_DTYPE_FLOAT, 32, 1, rs_shape, &rs_data) != TEFL_OK) return TEFL_ERR_OUT_OF_MEMORY;
    const float *xs = x->data, *gs = g->data;
    float *ys = y_data, *rs = rs_data;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xs[r * n + i] * xs[r * n + i];
        float inv = (float)(1.0 / sqrt(ss / n + eps));
        rs[r] = inv;
        for (int64_t i = 0; i < n; i++) ys[r * n + i] = xs[r * n + i] * inv * (zc ? 1.0f + gs[i] : gs[i]);
    }
    return TEFL_OK;
}

#ifndef NO_INIT
static const tefl_vendor_info vendor = {sizeof(tefl_vendor_info), "cplug", "cpu", "true"};
static const tefl_op_impl impls[] = {
    {sizeof(tefl_op_impl), "rmsnorm_fwd", "vendor.cplug", 300, "f32", rmsnorm_fwd, NULL},
};

int32_t tefl_plugin_init(const tefl_host_api *host, tefl_plugin *out) {
    if (host->abi_major != TEFL_ABI_MAJOR) return TEFL_ERR_UNSUPPORTED;
    out->abi_major = TEFL_ABI_MAJOR;
    out->abi_minor = TEFL_ABI_MINOR;
#ifdef BAD_ABI
    out->abi_major = 99;
#endif
#ifdef FAILING_INIT
    out->error = "no acme device found";
    return TEFL_ERR_DEVICE;
#endif
    out->vendor = &vendor;
    out->impls = impls;
    out->n_impls = sizeof(impls) / sizeof(impls[0]);
    return TEFL_OK;
}
#else
/* Without an init the kernel is only referenced here, so that the library still builds. */
tefl_kernel_fn tefl_unused_kernel = rmsnorm_fwd;
#endif
