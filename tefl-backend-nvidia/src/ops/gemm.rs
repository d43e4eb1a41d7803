//! `generic_gemm` through cuBLASLt: the binding of [`tefl_gpu::blaslt::BlasLt`], whose shared
//! host logic (the column-major view, fused or finished epilogues) is in `tefl_gpu::blaslt`.
//! The matmul descriptor, layouts and the heuristic's algorithm are cached per
//! (device, shape, flags, dtypes, epilogue).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use tefl_core::catalogue::{GemmArgs, GemmOut, GroupedGemmArgs, GroupedGemmOut};
use tefl_core::{DType, Device, Error, KernelCtx, Result};
use tefl_gpu::blaslt::{BlasLt, LtCall, LtLayout, LtShape, PlanCache};

use crate::runtime::{self, CudaBuffer, device_error};

const WORKSPACE_BYTES: usize = 32 << 20;

fn lt_error(device: Device, what: &str, e: lt::CublasError) -> Error {
    Error::DeviceFailure { device: device.to_string(), reason: format!("cuBLASLt {what}: {e:?}") }
}

/// Whether libcublasLt loads (checked before any cuBLASLt call: cudarc panics without it).
pub fn cublaslt_available() -> std::result::Result<(), String> {
    static R: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    R.get_or_init(|| {
        // SAFETY: only tries dlopen on candidate library names and drops the handles.
        if unsafe { sys::is_culib_present() } { Ok(()) } else { Err("libcublasLt was not found".into()) }
    })
    .clone()
}

/// A cuBLASLt handle and workspace per device.
struct DeviceLt {
    handle: sys::cublasLtHandle_t,
    workspace: Arc<CudaBuffer>,
}
// SAFETY: the handle is used under the `plans` lock or by one call at a time per plan; cuBLASLt
// handles may be used from any thread with the owning context current.
unsafe impl Send for DeviceLt {}
// SAFETY: as above.
unsafe impl Sync for DeviceLt {}

fn device_lt(device: Device) -> Result<Arc<DeviceLt>> {
    static M: OnceLock<Mutex<HashMap<u32, Arc<DeviceLt>>>> = OnceLock::new();
    let map = M.get_or_init(Default::default);
    let mut g = map.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = g.get(&device.ordinal) {
        return Ok(d.clone());
    }
    cublaslt_available().map_err(|reason| Error::DeviceUnavailable { device: device.to_string(), reason })?;
    let rt = runtime::global();
    rt.context(device)?.bind_to_thread().map_err(|e| device_error(device, e))?;
    let started = std::time::Instant::now();
    let handle = lt::create_handle().map_err(|e| lt_error(device, "create", e))?;
    let workspace = rt.alloc_uninit_buffer(device, WORKSPACE_BYTES)?;
    tracing::debug!(target: "TE-FL", "cuBLASLt handle for {device} in {} ms", started.elapsed().as_millis());
    let d = Arc::new(DeviceLt { handle, workspace });
    g.insert(device.ordinal, d.clone());
    Ok(d)
}

fn lt_type(d: DType) -> Result<sys::cudaDataType> {
    Ok(match d {
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        DType::F8E4M3 => sys::cudaDataType::CUDA_R_8F_E4M3,
        DType::F8E5M2 => sys::cudaDataType::CUDA_R_8F_E5M2,
        other => {
            return Err(Error::DType {
                op: "generic_gemm",
                arg: "a",
                got: other,
                expected: "f32, f16, bf16, f8e4m3 or f8e5m2".into(),
            });
        }
    })
}

/// Cached descriptors and algorithm of one GEMM shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}
// SAFETY: the descriptors are only touched while the plan's mutex is held.
unsafe impl Send for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was created for this plan and is destroyed once, here.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            for l in [self.a, self.b, self.c, self.d] {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
        }
    }
}

fn set_desc<T>(
    device: Device,
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: `v` points at a live value of the attribute's type and size.
    unsafe { lt::set_matmul_desc_attribute(desc, attr, v as *const T as *const c_void, std::mem::size_of::<T>()) }
        .map_err(|e| lt_error(device, "set attribute", e))
}

fn epilogue(e: tefl_gpu::blaslt::LtEpilogue) -> sys::cublasLtEpilogue_t {
    use sys::cublasLtEpilogue_t as E;
    use tefl_gpu::blaslt::LtEpilogue as L;
    match e {
        L::Default => E::CUBLASLT_EPILOGUE_DEFAULT,
        L::Bias => E::CUBLASLT_EPILOGUE_BIAS,
        L::GeluAux => E::CUBLASLT_EPILOGUE_GELU_AUX,
        L::GeluAuxBias => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        L::DGelu => E::CUBLASLT_EPILOGUE_DGELU,
    }
}

/// Builds the plan of `shape`: `Ok(None)` when cuBLASLt's heuristic has no algorithm.
fn build_plan(shape: &LtShape, lt_dev: &DeviceLt) -> Result<Option<Plan>> {
    let device = Device::cuda(shape.device);
    use sys::cublasLtMatmulDescAttributes_t as A;
    let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)
        .map_err(|e| lt_error(device, "desc", e))?;
    let layout =
        |t, l: LtLayout| lt::create_matrix_layout(t, l.rows, l.cols, l.ld).map_err(|e| lt_error(device, "layout", e));
    let (first, second, out) = shape.layouts();
    // Each descriptor is owned by the plan as soon as it exists, so an early return frees it.
    // The library's first operand is our B, its second our A (module docs of tefl_gpu::blaslt).
    let mut plan = Plan {
        desc,
        a: std::ptr::null_mut(),
        b: std::ptr::null_mut(),
        c: std::ptr::null_mut(),
        d: std::ptr::null_mut(),
        algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
    };
    plan.a = layout(lt_type(shape.b_type)?, first)?;
    plan.b = layout(lt_type(shape.ab)?, second)?;
    plan.c = layout(lt_type(shape.c)?, out)?;
    plan.d = layout(lt_type(shape.d)?, out)?;
    // cublasOperation_t as its i32 value: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1; A' = b, B' = a.
    set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &i32::from(shape.transb))?;
    set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &i32::from(shape.transa))?;
    set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue(shape.epilogue))?;
    // Pointer attributes must be set before the heuristic for the epilogues that use them;
    // placeholders (the workspace) are replaced at each call.
    let placeholder = lt_dev.workspace.device_ptr();
    if shape.is_fp8() {
        // Per-tensor scales as device pointers (placeholders now, the call's at each call); the
        // library's A is our B, so its A scale is B's scale_inv.
        set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder)?;
        set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder)?;
        set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_FAST_ACCUM, &i8::from(shape.fast_accum))?;
        if shape.d.is_fp8() {
            set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &placeholder)?;
            set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &placeholder)?;
        }
    }
    if shape.epilogue.has_pointers() {
        set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &placeholder)?;
        set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &placeholder)?;
        set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &shape.aux_ld())?;
    }
    let pref = lt::create_matmul_pref().map_err(|e| lt_error(device, "preference", e))?;
    // SAFETY: `pref` is live; the value is a usize as the attribute requires.
    let set = unsafe {
        lt::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &WORKSPACE_BYTES as *const usize as *const c_void,
            std::mem::size_of::<usize>(),
        )
    };
    // SAFETY: every descriptor is live; the heuristic only reads them.
    let heuristic = set.and_then(|()| unsafe {
        lt::get_matmul_algo_heuristic(lt_dev.handle, desc, plan.a, plan.b, plan.c, plan.d, pref)
    });
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { lt::destroy_matmul_pref(pref) };
    match heuristic {
        Ok(h) => {
            plan.algo = h.algo;
            Ok(Some(plan))
        }
        Err(e) => {
            tracing::debug!(target: "TE-FL", "cuBLASLt heuristic: no algorithm for {shape:?}: {e:?}");
            Ok(None)
        }
    }
}

/// cuBLASLt as the shared GEMM host logic's library.
struct CublasLt;

impl BlasLt for CublasLt {
    fn name(&self) -> &'static str {
        "cuBLASLt"
    }

    fn matmul(&self, device: Device, shape: &LtShape, call: &LtCall) -> Result<bool> {
        static PLANS: LazyLock<PlanCache<Plan>> = LazyLock::new(PlanCache::default);
        let lt_dev = device_lt(device)?;
        let Some(plan) = PLANS.get(shape, || build_plan(shape, &lt_dev))? else { return Ok(false) };
        let p = plan.lock().unwrap_or_else(|p| p.into_inner());
        use sys::cublasLtMatmulDescAttributes_t as A;
        if call.bias != 0 {
            set_desc(device, p.desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias)?;
        }
        if call.aux != 0 {
            set_desc(device, p.desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux)?;
        }
        if shape.is_fp8() {
            set_desc(device, p.desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &call.b_scale)?;
            set_desc(device, p.desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &call.a_scale)?;
            if shape.d.is_fp8() {
                set_desc(device, p.desc, A::CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &call.d_scale)?;
                set_desc(device, p.desc, A::CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &call.d_amax)?;
            }
        }
        let rt = runtime::global();
        rt.context(device)?.bind_to_thread().map_err(|e| device_error(device, e))?;
        let c = if call.c == 0 { call.d } else { call.c };
        rt.on_queue(device, |stream| {
            // SAFETY: descriptors and algorithm come from the plan for exactly these shapes and
            // dtypes; a, b, c, d are live device buffers of those sizes (validated by the op); the
            // workspace holds WORKSPACE_BYTES; alpha and beta are f32 (the scale type).
            unsafe {
                lt::matmul(
                    lt_dev.handle,
                    p.desc,
                    &call.alpha as *const f32 as *const c_void,
                    &call.beta as *const f32 as *const c_void,
                    call.b as *const c_void,
                    p.a,
                    call.a as *const c_void,
                    p.b,
                    c as *const c_void,
                    p.c,
                    call.d as *mut c_void,
                    p.d,
                    &p.algo,
                    lt_dev.workspace.device_ptr() as *mut c_void,
                    WORKSPACE_BYTES,
                    stream.cu_stream() as sys::cudaStream_t,
                )
            }
            .map_err(|e| lt_error(device, "matmul", e))
        })?;
        Ok(true)
    }
}

/// `generic_gemm` on cuBLASLt (`tefl_gpu::blaslt::generic_gemm`).
pub fn generic_gemm(ctx: &KernelCtx<'_>, a: &GemmArgs) -> Result<GemmOut> {
    tefl_gpu::blaslt::generic_gemm(ctx, a, &CublasLt)?.ok_or_else(|| Error::DeviceFailure {
        device: ctx.device.to_string(),
        reason: "cuBLASLt heuristic: no algorithm for the f32 product".into(),
    })
}

/// `te_general_grouped_gemm`: one launch of the Hopper kernel (`grouped_gemm.rs`) when it takes
/// the call, else one cuBLASLt GEMM per group (`tefl_gpu::blaslt::grouped_gemm`).
pub fn grouped_gemm(ctx: &KernelCtx<'_>, a: &GroupedGemmArgs) -> Result<GroupedGemmOut> {
    if let Some(out) = super::grouped_gemm::run(ctx, a)? {
        return Ok(out);
    }
    tefl_gpu::blaslt::grouped_gemm(ctx, a, &CublasLt)
}
