/*
 * tefl plugin ABI: closed-source vendor libraries serving tefl ops through a stable C ABI.
 *
 * A plugin is a shared library exporting one symbol:
 *
 *     tefl_error *tefl_plugin_init(const tefl_host_api *host, tefl_plugin *out);
 *
 * It fills `out` (vendor description and op impls) and returns NULL, or an error made with
 * host->make_error. tefl loads the
 * libraries named in TE_FL_PLUGIN_MODULES (paths or library names, comma separated) when the
 * manager starts; a plugin that cannot be loaded, lacks the symbol, was built for another
 * major ABI version or fails its init is skipped with an ERROR log line naming it.
 *
 * Compatibility rules:
 *   - every struct starts with `struct_size`; readers use only the fields that fit in it;
 *   - structs and function tables are append-only: new fields go at the end, with a minor
 *     version bump; a major bump breaks compatibility;
 *   - tefl accepts plugins with the same major version and a minor version up to its own.
 *
 * Tensors are DLPack-compatible descriptors (data pointer, device, dtype, shape, strides).
 * In this version they are host (CPU) tensors, contiguous (strides NULL).
 *
 * A kernel receives one tefl_call: the op's tensor arguments in declaration order (an
 * absent optional tensor has data NULL and ndim -1; a tensor list contributes its tensors in
 * order), its scalar arguments as text ("eps=1e-5;zero_centered_gamma=false;..."), and host
 * callbacks to allocate each output and to make errors. It returns NULL on success, or an
 * opaque error handle made by make_error (the host takes it back and frees it). A handle the
 * host did not make, or an error code outside the TEFL_ERR_* set, is reported as such.
 *
 * Ops grow like the structs: a catalogue version may append optional tensor arguments and
 * outputs at the end of an op's lists (rmsnorm_fwd and layernorm_fwd gained the FP8 output's
 * `scale` input and `amax`, `scale_inv` outputs). A kernel reads the leading arguments it
 * knows, accepts more inputs and outputs than it knows, and answers TEFL_ERR_UNSUPPORTED when
 * a trailing optional input it does not serve is present (data not NULL); outputs it leaves
 * unallocated are absent, which the op's contract allows exactly when their input is absent.
 */
#ifndef TEFL_PLUGIN_H
#define TEFL_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TEFL_ABI_MAJOR 1
#define TEFL_ABI_MINOR 0

/* Error codes carried by tefl_error. */
#define TEFL_OK 0
#define TEFL_ERR_INVALID_ARGUMENT 1
#define TEFL_ERR_UNSUPPORTED 2 /* these arguments are not served: tefl tries the next impl, no failure is counted */
#define TEFL_ERR_DEVICE 3
#define TEFL_ERR_OUT_OF_MEMORY 4 /* tefl falls back but keeps trying this impl on later calls */
#define TEFL_ERR_INTERNAL 5

/* DLPack device types and dtype codes used here. */
#define TEFL_DEVICE_CPU 1
#define TEFL_DTYPE_INT 0
#define TEFL_DTYPE_UINT 1
#define TEFL_DTYPE_FLOAT 2
#define TEFL_DTYPE_BFLOAT 4
#define TEFL_DTYPE_FLOAT8_E4M3 10 /* tefl extension, one byte per element */
#define TEFL_DTYPE_FLOAT8_E5M2 11 /* tefl extension, one byte per element */

typedef struct tefl_tensor {
    size_t struct_size;
    void *data;             /* NULL for an absent optional tensor */
    int32_t device_type;    /* TEFL_DEVICE_* */
    int32_t device_id;
    uint8_t dtype_code;     /* TEFL_DTYPE_* */
    uint8_t dtype_bits;
    uint16_t dtype_lanes;   /* 1 */
    int32_t ndim;           /* -1 for an absent optional tensor */
    const int64_t *shape;
    const int64_t *strides; /* in elements; NULL = contiguous row-major */
} tefl_tensor;

/* An error: opaque, made by the host's make_error, handed back to the host by returning it. */
typedef struct tefl_error tefl_error;

typedef struct tefl_call tefl_call;

/* What a kernel gets: arguments and host callbacks (append-only). */
struct tefl_call {
    size_t struct_size;
    const char *op;         /* the catalogue name, e.g. "rmsnorm_fwd" */
    const tefl_tensor *inputs;
    size_t n_inputs;
    const char *scalars;    /* "name=value;..." in declaration order */
    size_t n_outputs;       /* how many outputs the op returns */
    /* Allocates output `index` (0-based, in the op's output order) and returns its data
     * pointer through `data`. Returns NULL, or an error the kernel should return. Each output
     * is allocated at most once per call (a second call for an index is an error). Outputs
     * are checked against the op's contract (shape, dtype) after the kernel returns. */
    tefl_error *(*alloc_output)(const tefl_call *call, size_t index, uint8_t dtype_code, uint8_t dtype_bits,
                                int32_t ndim, const int64_t *shape, void **data);
    /* Makes an error (code TEFL_ERR_*, message copied) for the kernel to return. */
    tefl_error *(*make_error)(int32_t code, const char *message);
    void *host_state;       /* opaque to the plugin */
};

typedef tefl_error *(*tefl_kernel_fn)(void *user, const tefl_call *call);

typedef struct tefl_op_impl {
    size_t struct_size;
    const char *op;         /* catalogue name */
    const char *impl_id;    /* e.g. "vendor.acme" */
    int32_t priority;
    const char *dtypes;     /* comma list of accepted primary dtypes ("f32,bf16"), or "" for any */
    tefl_kernel_fn kernel;
    void *user;             /* passed back to the kernel */
} tefl_op_impl;

typedef struct tefl_vendor_info {
    size_t struct_size;
    const char *vendor_name;
    const char *device_name;
    const char *device_query_cmd;
} tefl_vendor_info;

/* Filled by the plugin's init. Pointers must stay valid while the library is loaded. */
typedef struct tefl_plugin {
    size_t struct_size;
    uint32_t abi_major;     /* the ABI the plugin was built for: TEFL_ABI_MAJOR */
    uint32_t abi_minor;     /* TEFL_ABI_MINOR */
    const tefl_vendor_info *vendor;
    const tefl_op_impl *impls;
    size_t n_impls;
} tefl_plugin;

/* What tefl offers the plugin at init (append-only). */
typedef struct tefl_host_api {
    size_t struct_size;
    uint32_t abi_major;
    uint32_t abi_minor;
    /* Makes an error (code TEFL_ERR_*, message copied) for init to return. */
    tefl_error *(*make_error)(int32_t code, const char *message);
} tefl_host_api;

typedef tefl_error *(*tefl_plugin_init_fn)(const tefl_host_api *host, tefl_plugin *out);

#ifdef __cplusplus
}
#endif

#endif /* TEFL_PLUGIN_H */
