//! # tefl-backend-amd
//!
//! tefl's HIP backend (vendor `amd`, impl id `vendor.amd`, device `hip`). Laid out like a
//! FlagGems vendor folder:
//!
//! - `vendor.rs`: the [`VendorInfo`](tefl_core::VendorInfo) (arch families `cdna2`, `cdna3`,
//!   ...) and the availability check;
//! - `hip.rs`: the HIP runtime, loaded at run time (ROCm 7, 6 or 5), `hipInit(0)` first;
//!   `runtime.rs`: the device runtime (memory, copies, fills, streams and external streams,
//!   event timing, device facts); `hiprtc.rs`: hiprtc behind `tefl_gpu::RtcCompiler`;
//!   `launch.rs`: loading and launching kernel variants, and the `GpuTarget` of this backend;
//!   `hipblaslt.rs`: hipBLASLt (ROCm 7 or 6), loaded at run time, for `generic_gemm`;
//! - `ops/`: the registrations (the SIMT families are `tefl_gpu::simt`'s shared host code);
//! - `tune_configs.toml`, `cdna2/`, `cdna3/` and `heuristics.rs`: launch parameters, layered
//!   over the GPU defaults of `tefl-gpu`.
//!
//! The HIP runtime, hiprtc and hipBLASLt are loaded with `libloading`, never linked: the `hip-sys` crate
//! links libamdhip64 at build time, so a binary built with it does not even start without
//! that exact ROCm installed. With this crate, `--features nvidia,amd` builds and starts
//! anywhere; without a runtime, `hipInit` failing or no device, the backend reports itself
//! unavailable with the reason (the library tried, or the HIP error's name) and the manager
//! picks another impl.
//!
//! Wavefronts of 64 (GCN/CDNA) and 32 (RDNA) lanes are both served: the kernels are compiled
//! with the wavefront size of the device's arch, checked against the device's own.

pub mod heuristics;
pub mod hip;
pub mod hipblaslt;
pub mod hiprtc;
pub mod launch;
pub mod ops;
pub mod runtime;
pub mod vendor;

pub use vendor::{availability, vendor_info};

/// The backend's name (`TE_BACKEND`, `cargo xtask test-backend`).
pub const BACKEND: &str = vendor::VENDOR;

/// The impl id every op registers.
pub const IMPL_ID: &str = "vendor.amd";

/// Whether the kernels can run: a HIP device is usable and hiprtc loads.
pub fn kernels_available() -> Result<(), String> {
    availability()?;
    hiprtc::hiprtc_available()
}

/// Every kernel variant this backend can launch (the compile test builds each for gfx targets).
pub fn kernel_variants() -> Vec<tefl_gpu::Variant> {
    tefl_gpu::simt::variants()
}

#[cfg(test)]
mod tests {
    use tefl_gpu::RtcCompiler;

    /// Compiles every variant of the launch plans through this backend's hiprtc path for
    /// gfx90a (wave 64) and gfx1030 (wave 32), and every other variant of each source for
    /// gfx908 (wave 64 too); an error, a warning or a missing entry point fails. The programs
    /// compile in one process per core (`tefl_gpu::rtc::compile_shard`: hiprtc is not safe to
    /// call from two threads).
    #[test]
    fn every_kernel_compiles_with_hiprtc() {
        let c = crate::hiprtc::Hiprtc;
        if let Err(why) = c.available() {
            // CI installs the ROCm runtime and sets TEFL_EXPECT_HIP_RUNTIME=1: there this fails.
            assert!(std::env::var("TEFL_EXPECT_HIP_RUNTIME").map_or(true, |v| v != "1"), "hiprtc expected: {why}");
            eprintln!("skipped: {why}");
            return;
        }
        let shard = match tefl_gpu::rtc::compile_shard("tests::every_kernel_compiles_with_hiprtc", |_| Vec::new()) {
            tefl_gpu::rtc::ShardRole::Spawned(failures) => {
                assert!(failures.is_empty(), "{}", failures.join("\n"));
                return;
            }
            tefl_gpu::rtc::ShardRole::Compile(shard) => shard,
        };
        // TEFL_COMPILE_ONLY=norm,rope limits the test to those sources (as the CUDA one).
        let only = std::env::var("TEFL_COMPILE_ONLY").ok();
        let variants: Vec<_> = crate::kernel_variants()
            .into_iter()
            .filter(|v| only.as_deref().is_none_or(|o| o.split(',').any(|n| n == v.source.name)))
            .collect();
        // gfx908 compiles the wave-64 code gfx90a does (for another instruction set): every
        // other variant of each source there, so that each source still meets it.
        let sampled = tefl_gpu::rtc::every_other_of_each_source(&variants);
        let jobs: Vec<_> = ["gfx90a", "gfx908", "gfx1030"]
            .into_iter()
            .flat_map(|arch| {
                variants.iter().zip(&sampled).filter(move |(_, s)| arch != "gfx908" || **s).map(move |(v, _)| (arch, v))
            })
            .collect();
        let mut failures = Vec::new();
        let mut n = 0;
        for &(arch, v) in jobs.iter().enumerate().filter(|(i, _)| shard.owns(*i)).map(|(_, j)| j) {
            n += 1;
            let text = tefl_gpu::full_source(tefl_gpu::Target::Hip, v);
            match c.compile_logged(&text, v.source.path, &c.options(arch)) {
                Ok(out) => {
                    if out.log.contains("warning") {
                        failures.push(format!(
                            "{arch} {} [{}]: warnings:\n{}",
                            v.source.name,
                            v.defines.key(),
                            out.log
                        ));
                    }
                    for e in v.entries {
                        if !tefl_gpu::rtc::binary_has_entry(&out.binary, e) {
                            failures.push(format!("{arch} {} [{}]: no entry {e}", v.source.name, v.defines.key()));
                        }
                    }
                }
                Err(log) => failures.push(format!("{arch} {} [{}]: {log}", v.source.name, v.defines.key())),
            }
        }
        assert!(failures.is_empty(), "{} of {n} failed:\n{}", failures.len(), failures.join("\n"));
    }
}
