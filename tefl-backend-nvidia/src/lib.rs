//! # tefl-backend-nvidia
//!
//! tefl's CUDA backend (vendor `nvidia`, impl id `vendor.nvidia`, device `cuda`). Laid out
//! like a FlagGems vendor folder:
//!
//! - `vendor.rs`: the [`VendorInfo`](tefl_core::VendorInfo) and the driver check;
//! - `runtime.rs`: the CUDA device runtime (memory, copies, fills, streams and external
//!   streams, event timing, device facts);
//! - `nvrtc.rs`: NVRTC behind `tefl_gpu::RtcCompiler`; `launch.rs`: loading and launching
//!   kernel variants;
//! - `ops/`: GEMM (cuBLASLt plus the epilogue kernels) and tensor-core attention, CUDA's own;
//!   the SIMT families (norms, softmax, activations, RoPE, dropout, FP8, optimizers) are the
//!   shared host code of `tefl_gpu::simt`, launched through this crate's `GpuTarget`;
//!   `ops/mod.rs` registers them all with `inventory`;
//! - `tune_configs.toml`, `hopper/tune_configs.toml` and `heuristics.rs`: launch parameters,
//!   layered over the GPU defaults of `tefl-gpu`.
//!
//! GEMM goes through cuBLASLt. Loading is dynamic (cudarc's `dynamic-loading`): a binary
//! built with this backend starts on a machine without the driver and reports the backend
//! unavailable; without libnvrtc the kernels report unavailable too, and the manager picks
//! another impl.

pub mod heuristics;
pub mod launch;
pub mod nvrtc;
pub mod ops;
pub mod runtime;
mod tma;
pub mod vendor;

pub use ops::OPS;
pub use vendor::{availability, vendor_info};

/// The backend's name (`TE_BACKEND`, `cargo xtask test-backend`).
pub const BACKEND: &str = vendor::VENDOR;

/// The impl id every op registers.
pub const IMPL_ID: &str = "vendor.nvidia";

/// Whether the kernels can run: a CUDA device is usable and libnvrtc loads.
pub fn kernels_available() -> Result<(), String> {
    availability()?;
    nvrtc::nvrtc_available()
}

/// Every kernel variant the op files launch, built by the same functions the launches use
/// (the NVRTC compile test); `all_masks` false samples the mma.sync attention kernels' layout
/// and mask combinations (`ops::attention::variants`: the test compiles them all for sm_90, and
/// for sm_80 every other variant of that half).
pub fn kernel_variants(all_masks: bool) -> Vec<tefl_gpu::Variant> {
    let mut v = Vec::new();
    v.extend(tefl_gpu::simt::variants());
    v.extend(ops::attention::variants(all_masks));
    v.extend(ops::attention_sm90::variants());
    v.extend(ops::grouped_gemm::variants());
    v.push(runtime::l2_scrub_variant());
    v
}

#[cfg(test)]
mod tests {
    use tefl_gpu::RtcCompiler;
    use tefl_gpu::rtc::binary_has_entry;

    use crate::nvrtc::{COMPILING, Nvrtc, performance_advisories, stderr_advisories};

    /// Compiles every kernel variant the op files launch for sm_90 (sm_90a for the Hopper-only
    /// sources), and for sm_80 every other variant of each source of those that are not
    /// Hopper-only, the mma.sync attention kernels with two of their four layout / mask
    /// combinations per head dim before that (sm_80 differs only in the prelude's Ampere
    /// paths; on CI's two cores the attention sample saved 150 s of the test's 300, and the
    /// every-other sample 30 s more: 277 -> 247 s on the development machine), with NVRTC
    /// when libnvrtc is present (no GPU needed; CI installs libnvrtc from the
    /// `nvidia-cuda-nvrtc` wheel), and checks each binary defines every entry point the
    /// variant launches, so a kernel that does not compile fails here rather than on the GPU
    /// machine. A kernel for
    /// which ptxas reports a performance loss (e.g. C7515: wgmma instructions serialised, which
    /// a harmless-looking change to a Hopper kernel's control flow can cause) fails too, whether
    /// the report is in the compile log or, as NVRTC 13 writes it when it splits the compile, on
    /// stderr. The programs compile in one process per core (`tefl_gpu::rtc::compile_shard`).
    #[test]
    fn every_kernel_compiles_with_nvrtc() {
        if let Err(reason) = crate::nvrtc::nvrtc_available() {
            eprintln!("skipped: {reason}");
            return;
        }
        let shard = match tefl_gpu::rtc::compile_shard("tests::every_kernel_compiles_with_nvrtc", stderr_advisories) {
            tefl_gpu::rtc::ShardRole::Spawned(failures) => {
                assert!(failures.is_empty(), "{}", failures.join("\n"));
                return;
            }
            tefl_gpu::rtc::ShardRole::Compile(shard) => shard,
        };
        // TEFL_COMPILE_ONLY=attention,norm limits the test to those sources (their `Source::name`s,
        // exactly: attention_sm90 and attention_bwd_sm90 are sources of their own) while iterating;
        // TEFL_COMPILE_DUMP=DIR also writes each sm_90 variant's full source there (to read
        // ptxas' register and spill report by hand).
        let only = std::env::var("TEFL_COMPILE_ONLY").ok();
        let dump = std::env::var_os("TEFL_COMPILE_DUMP").map(std::path::PathBuf::from);
        if let Some(dir) = &dump {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        let selected = |all_masks: bool| -> Vec<_> {
            super::kernel_variants(all_masks)
                .into_iter()
                .filter(|v| only.as_deref().is_none_or(|o| o.split(',').any(|n| n == v.source.name)))
                .collect()
        };
        // sm_80 compiles the code sm_90 does, with the prelude's Ampere paths: every other
        // variant of each source there. Arch-specific sources (wgmma) exist for sm_90 only, as
        // sm_90a.
        let ampere: Vec<_> = selected(false).into_iter().filter(|v| !v.source.arch_specific).collect();
        let sampled = tefl_gpu::rtc::every_other_of_each_source(&ampere);
        let ampere: Vec<_> = ampere.into_iter().zip(sampled).filter_map(|(v, s)| s.then_some(v)).collect();
        let hopper = selected(true);
        let jobs: Vec<_> = [("sm_80", &ampere), ("sm_90", &hopper)]
            .into_iter()
            .flat_map(|(arch, variants)| variants.iter().map(move |v| (crate::launch::target_arch(v, arch), v)))
            .collect();
        if shard.index == 0 {
            eprintln!("{} programs: {} for sm_80, {} for sm_90", jobs.len(), ampere.len(), hopper.len());
        }
        // The entry points each source's variants launch, all together: a variant's binary must
        // hold its own and no other (a source compiled in parts compiles each part alone, so that a
        // first call waits for no kernel it does not launch).
        let all = super::kernel_variants(true);
        let launched = |v: &tefl_gpu::Variant| -> Vec<&'static str> {
            let mut names: Vec<_> = all
                .iter()
                .filter(|w| std::ptr::eq(w.source, v.source))
                .flat_map(|w| w.entries.iter().copied())
                .collect();
            names.sort_unstable();
            names.dedup();
            names
        };
        let mut failures = Vec::new();
        let mut compiled = 0;
        for (i, (arch, v)) in jobs.iter().enumerate().filter(|(i, _)| shard.owns(*i)) {
            if let Some(dir) = dump.as_ref().filter(|_| arch.starts_with("sm_90")) {
                let file = dir.join(format!("{}_{i}.cu", v.source.name));
                std::fs::write(&file, tefl_gpu::variant::full_source(tefl_gpu::Target::Cuda, v))
                    .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            }
            compiled += 1;
            let text = tefl_gpu::variant::full_source(tefl_gpu::Target::Cuda, v);
            // (ptxas' advisories may come on stderr, after this line: stderr_advisories.)
            eprintln!("{COMPILING}{arch} {} {:?}", v.source.name, v.defines);
            // The Hopper kernels' ptxas report too (its stack frames: below).
            let mut options = Nvrtc.options(arch);
            if v.source.arch_specific {
                options.push("--ptxas-options=-v".into());
            }
            match Nvrtc.compile_logged(&text, v.source.path, &options, v.entries.len()) {
                Ok((cubin, log)) => {
                    for e in v.entries.iter().filter(|e| !binary_has_entry(&cubin, e)) {
                        failures.push(format!("{arch} {}: no entry {e} ({:?})", v.source.name, v.defines));
                    }
                    for e in launched(v).into_iter().filter(|e| !v.entries.contains(e) && binary_has_entry(&cubin, e)) {
                        failures.push(format!(
                            "{arch} {}: compiles {e}, which it does not launch ({:?})",
                            v.source.name, v.defines
                        ));
                    }
                    for advice in performance_advisories(&log) {
                        failures.push(format!("{arch} {} ({:?}): {advice}", v.source.name, v.defines));
                    }
                    if v.source.arch_specific {
                        let frames = stack_frames(&log);
                        if frames.is_empty() {
                            failures.push(format!("{arch} {} ({:?}): no ptxas report", v.source.name, v.defines));
                        }
                        for bytes in frames.into_iter().filter(|b| *b > MAX_HOPPER_STACK_BYTES) {
                            failures.push(format!(
                                "{arch} {} ({:?}): a {bytes}-byte stack frame (local memory; at most \
                                 {MAX_HOPPER_STACK_BYTES} allowed)",
                                v.source.name, v.defines
                            ));
                        }
                    }
                }
                Err(e) => failures.push(format!("{arch} {:?}: {e}", v.defines)),
            }
        }
        assert!(failures.is_empty(), "{} of {compiled} failed:\n{}", failures.len(), failures.join("\n"));
    }

    /// The largest stack frame a Hopper (wgmma) kernel may have: its registers are budgeted by
    /// hand (`setmaxnreg`), and what does not fit goes to local memory, slow on every access.
    /// 24 bytes is what the persistent attention backwards spill today (a few values around
    /// their item loop). A per-thread array indexed at run time takes more: the forward's row
    /// maximum over a local array of 16 floats (2026-12-04) took 64 bytes and ran 41-74% longer,
    /// with no ptxas advisory to say so.
    const MAX_HOPPER_STACK_BYTES: u64 = 24;

    /// The stack frame sizes in a ptxas `-v` report (`N bytes stack frame, ...`), one a kernel.
    fn stack_frames(log: &str) -> Vec<u64> {
        log.lines()
            .filter_map(|l| l.split_once(" bytes stack frame"))
            .filter_map(|(head, _)| head.split_whitespace().last()?.parse().ok())
            .collect()
    }

    #[test]
    fn stack_frames_are_read_from_a_ptxas_report() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
                   ptxas         .     64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 168 registers\n\
                   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
        assert_eq!(stack_frames(log), vec![64, 0]);
        assert!(stack_frames("no report").is_empty());
    }

    #[test]
    fn every_source_has_variants_and_entries() {
        let variants = super::kernel_variants(true);
        for src in tefl_kernels::SOURCES.iter().filter(|s| s.supports(tefl_gpu::Target::Cuda)) {
            let of: Vec<_> = variants.iter().filter(|v| std::ptr::eq(v.source, *src)).collect();
            assert!(!of.is_empty(), "{} has no variant", src.path);
            for v in of {
                for e in v.entries {
                    assert!(src.text.contains(&format!(" {e}(")), "{}: entry {e} not in the source", src.path);
                }
            }
        }
    }
}
