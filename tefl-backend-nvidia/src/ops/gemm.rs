//! `generic_gemm` through cuBLASLt.
//!
//! Row-major D[m, n] = op(A)·op(B) is the column-major product Dᵀ = op(B)ᵀ·op(A)ᵀ, so cuBLASLt
//! gets (B, A) with the same transpose flags and m, n swapped; bias (per column of D) is
//! then per row of Dᵀ, as cuBLASLt's bias epilogues expect. The matmul descriptor, layouts
//! and the heuristic's algorithm are cached per (device, shape, flags, dtypes, epilogue).
//!
//! When every dtype matches (a = b, c = bias = aux = out) and the aux leading dimension is
//! aligned, the epilogue is cuBLASLt's own (BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU, and beta = 1
//! for accumulate). Otherwise, and for the bias-gradient epilogues (the sum of the unrounded
//! values over m), cuBLASLt writes f32 and `simt/gemm_epilogue.cu` (tefl-kernels) finishes the epilogue.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use tefl_core::catalogue::*;
use tefl_core::{DType, Device, Error, KernelCtx, Result, Tensor};

use tefl_gpu::simt::gemm::finish_epilogue;

use crate::launch::{empty, i32_of, opt_ptr, ptr, zeros};
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
    let handle = lt::create_handle().map_err(|e| lt_error(device, "create", e))?;
    let workspace = rt.alloc_uninit_buffer(device, WORKSPACE_BYTES)?;
    let d = Arc::new(DeviceLt { handle, workspace });
    g.insert(device.ordinal, d.clone());
    Ok(d)
}

fn lt_type(d: DType) -> Result<sys::cudaDataType> {
    Ok(match d {
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        other => {
            return Err(Error::DType { op: "generic_gemm", arg: "a", got: other, expected: "f32, f16 or bf16".into() });
        }
    })
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct PlanKey {
    device: u32,
    m: usize,
    n: usize,
    k: usize,
    transa: bool,
    transb: bool,
    ab: DType,
    d: DType,
    epilogue: sys::cublasLtEpilogue_t,
}

/// Cached descriptors and algorithm of one GEMM shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}
// SAFETY: the descriptors are only touched while the plan's mutex is held.
unsafe impl Send for Plan {}

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

fn plan(key: &PlanKey, lt_dev: &DeviceLt) -> Result<Arc<Mutex<Plan>>> {
    static PLANS: OnceLock<Mutex<HashMap<PlanKey, Arc<Mutex<Plan>>>>> = OnceLock::new();
    // Shapes and epilogues cuBLASLt has no algorithm for, remembered so the heuristic is asked once.
    static DECLINED: OnceLock<Mutex<std::collections::HashSet<PlanKey>>> = OnceLock::new();
    let plans = PLANS.get_or_init(Default::default);
    if let Some(p) = plans.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
        return Ok(p.clone());
    }
    let device = Device::cuda(key.device);
    let declined = DECLINED.get_or_init(Default::default);
    if declined.lock().unwrap_or_else(|p| p.into_inner()).contains(key) {
        return Err(Error::DeviceFailure {
            device: device.to_string(),
            reason: "cuBLASLt heuristic: no algorithm (remembered)".into(),
        });
    }
    use sys::cublasLtMatmulDescAttributes_t as A;
    let compute = sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
    let desc =
        lt::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F).map_err(|e| lt_error(device, "desc", e))?;
    // Column-major view: A' = b, B' = a (see the module docs).
    // cublasOperation_t as its i32 value: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
    let op = |t: bool| i32::from(t);
    set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &op(key.transb))?;
    set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &op(key.transa))?;
    set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &key.epilogue)?;
    let (m, n, k) = (key.m as u64, key.n as u64, key.k as u64);
    let ab = lt_type(key.ab)?;
    let layout = |t, rows: u64, cols: u64| {
        lt::create_matrix_layout(t, rows, cols, rows.max(1) as i64).map_err(|e| lt_error(device, "layout", e))
    };
    // b as A': op(A') is n x k; stored (column-major) as n x k (no transpose) or k x n.
    let a_l = if key.transb { layout(ab, k, n)? } else { layout(ab, n, k)? };
    // a as B': op(B') is k x m; stored as k x m or m x k.
    let b_l = if key.transa { layout(ab, m, k)? } else { layout(ab, k, m)? };
    let d_l = layout(lt_type(key.d)?, n, m)?;
    let pref = lt::create_matmul_pref().map_err(|e| lt_error(device, "preference", e))?;
    // SAFETY: `pref` is live; the value is a usize as the attribute requires.
    unsafe {
        lt::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &WORKSPACE_BYTES as *const usize as *const c_void,
            std::mem::size_of::<usize>(),
        )
    }
    .map_err(|e| lt_error(device, "preference", e))?;
    // Pointer attributes must be set before the heuristic for the epilogues that use them;
    // placeholders (the workspace) are replaced at each call.
    let placeholder = lt_dev.workspace.device_ptr();
    if key.epilogue != sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT {
        set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &placeholder)?;
        set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &placeholder)?;
        set_desc(device, desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &(key.n as i64))?;
    }
    // SAFETY: every descriptor is live; the heuristic only reads them.
    let heuristic = unsafe { lt::get_matmul_algo_heuristic(lt_dev.handle, desc, a_l, b_l, d_l, d_l, pref) };
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { lt::destroy_matmul_pref(pref) };
    let heuristic = match heuristic {
        Ok(h) => h,
        Err(e) => {
            // SAFETY: destroyed once; never used after.
            unsafe {
                let _ = lt::destroy_matmul_desc(desc);
                let _ = lt::destroy_matrix_layout(a_l);
                let _ = lt::destroy_matrix_layout(b_l);
                let _ = lt::destroy_matrix_layout(d_l);
            }
            declined.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone());
            return Err(lt_error(device, "heuristic (no algorithm)", e));
        }
    };
    let p = Arc::new(Mutex::new(Plan { desc, a: a_l, b: b_l, d: d_l, algo: heuristic.algo }));
    plans.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), p.clone());
    Ok(p)
}

/// Runs D = alpha·op(a)·op(b) + beta·D-in (`c_ptr`, D's layout) with a cuBLASLt epilogue.
#[allow(clippy::too_many_arguments)]
fn run_lt(
    device: Device,
    key: &PlanKey,
    a: &Tensor,
    b: &Tensor,
    alpha: f32,
    beta: f32,
    c_ptr: u64,
    d_ptr: u64,
    bias: u64,
    aux: u64,
) -> Result<()> {
    let lt_dev = device_lt(device)?;
    let plan = plan(key, &lt_dev)?;
    let p = plan.lock().unwrap_or_else(|p| p.into_inner());
    use sys::cublasLtMatmulDescAttributes_t as A;
    if bias != 0 {
        set_desc(device, p.desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
    }
    if aux != 0 {
        set_desc(device, p.desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux)?;
    }
    let rt = runtime::global();
    rt.context(device)?.bind_to_thread().map_err(|e| device_error(device, e))?;
    let c = if c_ptr == 0 { d_ptr } else { c_ptr };
    rt.on_queue(device, |stream| {
        // SAFETY: descriptors and algorithm come from the plan for exactly these shapes and
        // dtypes; a, b, c, d are live device buffers of those sizes (validated by the op); the
        // workspace holds WORKSPACE_BYTES; alpha and beta are f32 (the scale type).
        unsafe {
            lt::matmul(
                lt_dev.handle,
                p.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                ptr(b)? as *const c_void,
                p.a,
                ptr(a)? as *const c_void,
                p.b,
                c as *const c_void,
                p.d,
                d_ptr as *mut c_void,
                p.d,
                &p.algo,
                lt_dev.workspace.device_ptr() as *mut c_void,
                WORKSPACE_BYTES,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| lt_error(device, "matmul", e))
    })
}

fn native_epilogue(ep: GemmEpilogue) -> Option<sys::cublasLtEpilogue_t> {
    use sys::cublasLtEpilogue_t as E;
    Some(match ep {
        GemmEpilogue::None => E::CUBLASLT_EPILOGUE_DEFAULT,
        GemmEpilogue::Bias => E::CUBLASLT_EPILOGUE_BIAS,
        GemmEpilogue::Gelu => E::CUBLASLT_EPILOGUE_GELU_AUX,
        GemmEpilogue::BiasGelu => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        GemmEpilogue::DGelu => E::CUBLASLT_EPILOGUE_DGELU,
        GemmEpilogue::DGeluBiasGrad | GemmEpilogue::BiasGrad => return None,
    })
}

pub fn generic_gemm(ctx: &KernelCtx<'_>, a: &GemmArgs) -> Result<GemmOut> {
    const OP: &str = "generic_gemm";
    let (m, k, n) = gemm_dims(a)?;
    let dev = ctx.device;
    let out = a.out_dtype;
    let d = empty(dev, &[m, n], out)?;
    let aux_out = if a.epilogue.writes_aux() { Some(empty(dev, &[m, n], out)?) } else { None };
    let c = a.c.as_ref().filter(|_| a.accumulate);
    let same = |t: Option<&Tensor>| t.is_none_or(|t| t.dtype() == out);
    let native = native_epilogue(a.epilogue).filter(|_| {
        same(c)
            && same(a.bias.as_ref())
            && same(a.aux.as_ref())
            && (!a.epilogue.needs_aux() && !a.epilogue.writes_aux() || n % 8 == 0)
    });
    if m == 0 || n == 0 {
        let bias_grad = if a.epilogue.writes_bias_grad() { Some(zeros(dev, &[n], DType::F32)?) } else { None };
        return Ok(GemmOut { d, aux_out, bias_grad });
    }
    if k == 0 {
        // No product: D is C (or zero) through the epilogue; run the epilogue kernel on zeros.
        return finish_epilogue(ctx, a, m, n, zeros(dev, &[m, n], DType::F32)?, d, aux_out);
    }
    if let Some(epilogue) = native {
        let key = PlanKey {
            device: dev.ordinal,
            m,
            n,
            k,
            transa: a.transa,
            transb: a.transb,
            ab: a.a.dtype(),
            d: out,
            epilogue,
        };
        let (beta, c_ptr) = match c {
            Some(c) => (1.0, ptr(c)?),
            None => (0.0, 0),
        };
        let aux = if a.epilogue.writes_aux() { opt_ptr(aux_out.as_ref())? } else { opt_ptr(a.aux.as_ref())? };
        match run_lt(dev, &key, &a.a, &a.b, a.alpha, beta, c_ptr, ptr(&d)?, opt_ptr(a.bias.as_ref())?, aux) {
            Ok(()) => return Ok(GemmOut { d, aux_out, bias_grad: None }),
            Err(e) => tracing::debug!(target: "TE-FL", "{OP}: fused cuBLASLt epilogue declined ({e}); f32 path"),
        }
    }
    let w = empty(dev, &[m, n], DType::F32)?;
    let key = PlanKey {
        device: dev.ordinal,
        m,
        n,
        k,
        transa: a.transa,
        transb: a.transb,
        ab: a.a.dtype(),
        d: DType::F32,
        epilogue: sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
    };
    run_lt(dev, &key, &a.a, &a.b, a.alpha, 0.0, 0, ptr(&w)?, 0, 0)?;
    let _ = i32_of(OP, "b", n)?;
    finish_epilogue(ctx, a, m, n, w, d, aux_out)
}
