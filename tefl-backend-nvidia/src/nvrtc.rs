//! NVRTC, the CUDA run-time compiler, behind `tefl_gpu::RtcCompiler`: the kernel sources of
//! `tefl-kernels` with the CUDA prelude are compiled for the device's arch at first use, and
//! cached on disk and per device by `tefl-gpu`. No toolkit header is ever included: an end
//! user's machine may have the driver and libnvrtc but no CUDA toolkit.

use std::ffi::CString;
use std::sync::OnceLock;

use cudarc::nvrtc::sys as nvrtc_sys;
use tefl_core::{Error, Result};
use tefl_gpu::{RtcCompiler, Target};

/// NVRTC (loaded at run time).
pub struct Nvrtc;

/// Whether libnvrtc can be loaded (checked before any NVRTC call: cudarc panics without it).
pub fn nvrtc_available() -> std::result::Result<(), String> {
    static R: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    R.get_or_init(|| {
        // SAFETY: only tries dlopen on candidate library names and drops the handles.
        if unsafe { nvrtc_sys::is_culib_present() } {
            Ok(())
        } else {
            Err("libnvrtc (the CUDA runtime compiler) was not found".into())
        }
    })
    .clone()
}

/// The loaded libnvrtc's (major, minor) version.
fn nvrtc_version() -> Result<(i32, i32)> {
    nvrtc_available().map_err(|reason| Error::DeviceUnavailable { device: "cuda".into(), reason })?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: libnvrtc is present (checked above); both out-pointers are valid.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::DeviceFailure { device: "cuda".into(), reason: format!("nvrtcVersion: {e:?}") })?;
    Ok((major, minor))
}

impl RtcCompiler for Nvrtc {
    fn target(&self) -> Target {
        Target::Cuda
    }
    fn name(&self) -> &'static str {
        "nvrtc"
    }
    fn device_kind(&self) -> &'static str {
        "cuda"
    }
    fn available(&self) -> std::result::Result<(), String> {
        nvrtc_available()
    }
    fn version(&self) -> Result<String> {
        let (major, minor) = nvrtc_version()?;
        Ok(format!("{major}.{minor}"))
    }
    fn options(&self, arch: &str) -> Vec<String> {
        vec![format!("--gpu-architecture={arch}"), "--std=c++17".into(), "-default-device".into(), "-lineinfo".into()]
    }
    fn binary_extension(&self) -> &'static str {
        "cubin"
    }
    /// NVRTC compiles distinct programs on several threads at once (its guide's thread-safety
    /// rule forbids only two threads working on one program).
    fn compiles_concurrently(&self) -> bool {
        true
    }
    fn compile_text(
        &self,
        text: &str,
        file_name: &str,
        options: &[String],
        kernels: usize,
    ) -> std::result::Result<Vec<u8>, String> {
        let (cubin, log) = self.compile_logged(text, file_name, options, kernels)?;
        for advice in performance_advisories(&log) {
            tracing::warn!(target: "TE-FL", "{file_name}: {advice}");
        }
        Ok(cubin)
    }
}

/// The lines of a compile log in which ptxas reports a performance loss it could not avoid,
/// such as wgmma instructions serialised (C7515): the kernel is correct but runs much slower than
/// its source intends. A kernel author's bug, never the user's: the compile test fails on any
/// (in the log, or on stderr: [`stderr_advisories`]).
pub fn performance_advisories(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("Performance Loss")).map(str::trim).collect()
}

/// What the compile test writes to stderr before each program it compiles (the variant
/// follows), so that [`stderr_advisories`] can name the program of each advisory.
pub const COMPILING: &str = "compile test, compiling: ";

/// The performance losses ptxas reported on stderr, each with the program it was compiling (the
/// last [`COMPILING`] line before it). With `SPLIT_COMPILE`, NVRTC 13's ptxas writes its
/// advisories (C7512, C7515: wgmma serialised) to the process's stderr, not to the program's log.
pub fn stderr_advisories(stderr: &str) -> Vec<String> {
    let mut program = "(no program named yet)";
    let mut found = Vec::new();
    for line in stderr.lines() {
        if let Some(p) = line.strip_prefix(COMPILING) {
            program = p;
        } else if let Some(advice) = performance_advisories(line).first() {
            found.push(format!("{program}: {advice}"));
        }
    }
    found
}

/// NVRTC's option to run its optimisation passes and ptxas over a program's kernels in
/// parallel (one thread per core, `0`), for programs of more than one kernel (the compile of a
/// single kernel took as long with it: 0.55 s either way for a Hopper attention backward
/// variant on a 2-core machine). It does change ptxas' code a little: with it, ptxas injected
/// warpgroup waits into the head-dim-64 and -256 attention backwards (reporting C7519 / C7517 on
/// stderr, which users saw; H200, 2026-11-30, causal b4 h32 s4096 d256: 8.93-8.99 ms with it,
/// 8.87-8.88 without, head dims 64 and 128 alike either way). Not
/// part of [`RtcCompiler::options`] (the cache key): whether it is passed follows from the
/// program (its kernels) and the library. Passed to NVRTC 12.4 and newer; a library that
/// rejects it anyway (a program it compiles without it) is compiled for without it from then
/// on.
const SPLIT_COMPILE: &str = "--split-compile=0";

/// Whether [`SPLIT_COMPILE`] is still passed (cleared when this libnvrtc rejects it).
static SPLIT_COMPILE_ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether this libnvrtc is new enough for [`SPLIT_COMPILE`].
fn split_compile_supported() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| nvrtc_version().is_ok_and(|v| v >= (12, 4)))
}

impl Nvrtc {
    /// Compiles `text`, a program of `kernels` entry points, into a cubin, returning it with the
    /// compiler's log, or the log alone when it fails. The kernels of a program of several are
    /// compiled in parallel where NVRTC can (`SPLIT_COMPILE`); ptxas' advisories are then
    /// written to stderr, not to the log (without it they are in the log, even on success).
    pub fn compile_logged(
        &self,
        text: &str,
        file_name: &str,
        options: &[String],
        kernels: usize,
    ) -> std::result::Result<(Vec<u8>, String), String> {
        use std::sync::atomic::Ordering::Relaxed;
        let text = CString::new(text).map_err(|e| e.to_string())?;
        let name = CString::new(file_name).map_err(|e| e.to_string())?;
        if kernels > 1 && SPLIT_COMPILE_ON.load(Relaxed) && split_compile_supported() {
            let mut split = options.to_vec();
            split.push(SPLIT_COMPILE.into());
            match compile_program(&text, &name, &split) {
                Err(Compile::Rejected(_)) => {
                    // Rejected with it, compiled without it: this library does not take it.
                    let plain = compile_program(&text, &name, options).map_err(Compile::into_log)?;
                    tracing::debug!(target: "TE-FL", "libnvrtc rejects {SPLIT_COMPILE}: compiling without it");
                    SPLIT_COMPILE_ON.store(false, Relaxed);
                    return Ok(plain);
                }
                other => return other.map_err(Compile::into_log),
            }
        }
        compile_program(&text, &name, options).map_err(Compile::into_log)
    }
}

/// Why a compile gave no cubin.
enum Compile {
    /// NVRTC rejected an option (`NVRTC_ERROR_INVALID_OPTION`), with the message.
    Rejected(String),
    /// Anything else, with the message and the compiler's log.
    Failed(String),
}

impl Compile {
    fn into_log(self) -> String {
        match self {
            Compile::Rejected(m) | Compile::Failed(m) => m,
        }
    }
}

/// One NVRTC program: created, compiled with `options`, its cubin and log read, destroyed.
fn compile_program(
    text: &CString,
    name: &CString,
    options: &[String],
) -> std::result::Result<(Vec<u8>, String), Compile> {
    let prog = cudarc::nvrtc::result::create_program(text, Some(name))
        .map_err(|e| Compile::Failed(format!("nvrtcCreateProgram: {e:?}")))?;
    // SAFETY: `prog` is a live program (created above, destroyed once below); `text` and
    // `name` outlive it.
    let out = unsafe {
        let compiled = cudarc::nvrtc::result::compile_program(prog, options);
        let log = cudarc::nvrtc::result::get_program_log(prog)
            .map(|l| String::from_utf8_lossy(&l.iter().map(|&c| c as u8).collect::<Vec<_>>()).into_owned())
            .unwrap_or_default();
        let log = log.trim_end_matches('\0').to_string();
        match compiled {
            Ok(()) => {
                let mut size = 0usize;
                let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size).result();
                let mut cubin = vec![0u8; size];
                r.and_then(|()| nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()).result())
                    .map(|()| (cubin, log))
                    .map_err(|e| Compile::Failed(format!("nvrtcGetCUBIN: {e:?}")))
            }
            Err(e) if e.0 == nvrtc_sys::nvrtcResult::NVRTC_ERROR_INVALID_OPTION => {
                Err(Compile::Rejected(format!("{e:?}\n{log}")))
            }
            Err(e) => Err(Compile::Failed(format!("{e:?}\n{log}"))),
        }
    };
    // SAFETY: destroyed exactly once, after its last use.
    let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
    out
}

#[cfg(test)]
mod tests {
    use super::{Nvrtc, performance_advisories};
    use tefl_gpu::RtcCompiler;

    /// `scripts/sass.py` compiles a dumped variant the way this backend does, so it passes the
    /// same NVRTC options: each of them, as its bytes literal, is in the script.
    #[test]
    fn the_sass_script_passes_the_backends_nvrtc_options() {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/sass.py");
        let text = std::fs::read_to_string(&script).unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        for opt in Nvrtc.options("{arch}") {
            let literal = if opt.contains("{arch}") { format!("f\"{opt}\".encode()") } else { format!("b\"{opt}\"") };
            assert!(text.contains(&literal), "scripts/sass.py does not pass {opt} ({literal}) as nvrtc.rs does");
        }
    }

    /// A program compiles with the backend's options (and the parallel split where NVRTC takes
    /// it); an option NVRTC rejects is an error naming it and does not turn the split off.
    #[test]
    fn a_rejected_option_fails_the_compile_and_keeps_the_split() {
        if let Err(reason) = super::nvrtc_available() {
            eprintln!("skipped: {reason}");
            return;
        }
        // (Two kernels: the split is only passed for programs of several.)
        let text = "extern \"C\" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n\
                    extern \"C\" __global__ void half(float* x) { x[threadIdx.x] *= 0.5f; }\n";
        let (cubin, _) = Nvrtc.compile_logged(text, "twice.cu", &Nvrtc.options("sm_80"), 2).expect("compiles");
        assert!(tefl_gpu::rtc::binary_has_entry(&cubin, "twice") && tefl_gpu::rtc::binary_has_entry(&cubin, "half"));
        let mut bad = Nvrtc.options("sm_80");
        bad.push("--no-such-option".into());
        let err = Nvrtc.compile_logged(text, "twice.cu", &bad, 2).expect_err("an unknown option fails");
        assert!(err.contains("INVALID_OPTION"), "{err}");
        if super::split_compile_supported() {
            assert!(super::SPLIT_COMPILE_ON.load(std::sync::atomic::Ordering::Relaxed));
        }
    }

    #[test]
    fn ptxas_performance_losses_are_picked_out_of_a_log() {
        let log = "ptxas info    : 0 bytes gmem\n\
                   ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized \
                   due to non wgmma instructions defining accumulator registers of a wgmma between start and end of \
                   the pipeline stage in the function 'attn_bwd_sm90'\n\
                   ptxas info    : Used 168 registers, used 16 barriers\n";
        let found = performance_advisories(log);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("ptxas info    : (C7515)") && found[0].ends_with("'attn_bwd_sm90'"));
        assert!(performance_advisories("ptxas info    : Used 40 registers\n").is_empty());
        assert!(performance_advisories("").is_empty());
    }

    /// Advisories on stderr are each named by the program compiling before them; other lines
    /// (ptxas' info on injected waits, test output) are not failures.
    #[test]
    fn ptxas_performance_losses_on_stderr_name_their_program() {
        let c = super::COMPILING;
        let stderr = [
            format!("{c}sm_90 norm [D=1]"),
            "ptxas info    : (C7519) warpgroup.arrive is injected in around line 559 by compiler".into(),
            format!("{c}sm_90 attention_bwd_sm90 [D=64]"),
            "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due \
             to insufficient register resources for the function 'attn_bwd_sm90'"
                .into(),
            "running 1 test".into(),
        ]
        .join("\n");
        let found = super::stderr_advisories(&stderr);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("sm_90 attention_bwd_sm90 [D=64]: ptxas info    : (C7512)"), "{found:?}");
        assert!(super::stderr_advisories("ptxas info    : Used 168 registers\n").is_empty());
    }
}
