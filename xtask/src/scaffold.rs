//! `cargo xtask new-backend <vendor>`: a backend crate in FlagGems' `_vendor` layout, wired
//! into the workspace; and the `run.sh` of `cargo xtask bundle`.

use std::fs;
use std::path::Path;
use std::process::ExitCode;

const CARGO_TOML: &str = r#"[package]
name = "tefl-backend-@V@"
description = "tefl backend of @V@"
version.workspace = true
edition.workspace = true
license.workspace = true
rust-version.workspace = true

[dependencies]
tefl-core.workspace = true
tefl-gpu.workspace = true

[lints]
workspace = true
"#;

const LIB_RS: &str = r#"//! # tefl-backend-@V@
//!
//! The @V@ backend of tefl, laid out like a FlagGems `_vendor` folder:
//! - `vendor.rs`: the vendor description (`VendorInfo`) and the availability check;
//! - `ops/`: one file per op family, each registering its impls with `register_impl!`
//!   (`tefl_core::register_backend!` registers a whole family list at once);
//! - `tune_configs.toml` (+ `<arch family>/tune_configs.toml`), under `src/`: candidate kernel
//!   configs, layered over the GPU defaults of `tefl-gpu`;
//! - `heuristics.rs`: the tune configs and named functions that pick kernel parameters.
//!
//! Kernel sources compiled at run time live in `tefl-kernels` (`simt/` for kernels every GPU
//! target shares, written against its prelude; `<target>/` for target-specific ones), and
//! `tefl-gpu` holds the host side every GPU backend shares (variants, run-time compiler
//! caches, launch geometry, tune layering).
//!
//! Check it with `cargo xtask test-backend @V@`: every op this crate registers is compared
//! with the f64 oracle; ops it does not register are reported as skipped.

pub mod heuristics;
pub mod ops;
pub mod vendor;

pub use vendor::availability;

/// The backend's name (`TE_BACKEND=@V@`, `cargo xtask test-backend @V@`).
pub const BACKEND: &str = vendor::VENDOR;
"#;

const VENDOR_RS: &str = r#"//! The @V@ vendor description and availability check.

use tefl_core::VendorInfo;

/// The vendor name your impls carry (allow/deny lists and `vendor:@V@` tokens use it).
pub const VENDOR: &str = "@V@";

/// FlagGems' `VendorInfoBase`: vendor name, device name, device query command, and the
/// arch families your tune configs are keyed by.
pub fn vendor_info() -> VendorInfo {
    VendorInfo::new(VENDOR, "@V@", "@V@-smi")
        // .arch_map(&[("gen2", "second_generation")])
        // .unused_ops(&["fused_attn_bwd"])
        .availability(availability)
}

tefl_core::register_vendor!(vendor_info);

/// Whether the device is usable here. Query your driver (loaded at run time, so that a
/// build with this feature starts on machines without it) and return `Err(reason)` when it
/// is missing. This scaffold has no device to check.
pub fn availability() -> Result<(), String> {
    Ok(())
}
"#;

const OPS_MOD_RS: &str = r#"//! The @V@ impls, one file per op family (`norm.rs`, `gemm.rs`, ...).
//!
//! An impl is one `register_impl!` next to its kernel; a backend registers only the ops it
//! implements for real. An example, for a device kind of your own:
//!
//! ```ignore
//! use tefl_core::catalogue::{RmsNormFwd, RmsNormFwdArgs, RmsNormFwdOut};
//! use tefl_core::{DeviceKind, KernelCtx, Result};
//!
//! pub const DEVICE: DeviceKind = DeviceKind::new("@V@");
//!
//! tefl_core::register_impl! {
//!     op: RmsNormFwd, impl_id: "vendor.@V@", kind: Vendor, vendor: crate::vendor::VENDOR,
//!     priority: 100, device: DEVICE, dtypes: [F32, F16, BF16], kernel: rmsnorm_fwd,
//! }
//!
//! fn rmsnorm_fwd(ctx: &KernelCtx<'_>, a: &RmsNormFwdArgs) -> Result<RmsNormFwdOut> {
//!     // launch your kernel on ctx.device with crate::heuristics::norm_block_size(a.x.last_dim())
//! }
//! ```
//!
//! The device kind needs a `tefl_core::device::DeviceRuntime` (allocation, copies,
//! synchronize), registered with `tefl_core::device::DeviceRuntimeRegistration`.
"#;

const HEURISTICS_RS: &str = r#"//! Named heuristics (FlagGems' `heuristics_config_utils.py`) and the tune configs.

use tefl_gpu::tune::{TuneConfigs, TuneFile};

/// This backend's tune configs: `tune_configs.toml` over the GPU defaults of `tefl-gpu`,
/// under one file per arch family (add `("family", TuneFile { .. })` entries for folders
/// like `src/<family>/tune_configs.toml`; the family comes from `vendor_info().arch_map`).
pub static TUNE_CONFIGS: TuneConfigs = TuneConfigs::new(
    crate::vendor::vendor_info,
    TuneFile { path: "tefl-backend-@V@/src/tune_configs.toml", text: include_str!("tune_configs.toml") },
    &[],
);

/// Threads per row block of a normalisation kernel, from the row width.
pub fn norm_block_size(n: usize) -> usize {
    n.next_power_of_two().clamp(64, 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tune_configs_parse_and_heuristics_stay_in_range() {
        for f in TUNE_CONFIGS.files() {
            tefl_core::tuning::TuneTable::parse(f.text, f.path).unwrap();
        }
        let t = TUNE_CONFIGS.table("any-arch");
        assert_eq!(t.configs("norm").len(), 2, "this crate's norm list replaces the default's");
        assert!(!t.configs("softmax").is_empty(), "the GPU defaults stay under it");
        assert_eq!(norm_block_size(1), 64);
        assert_eq!(norm_block_size(5000), 1024);
    }
}
"#;

const TUNE_TOML: &str = r#"# Candidate configs per kernel family (FlagGems' tune_configs.yaml, in TOML), over the GPU
# defaults of tefl-gpu/src/tune_configs.toml: a family listed here replaces the default's
# list; a `<arch family>/tune_configs.toml` folder replaces this file's in turn. An entry is
# one config, or `gen = true` with lists expanded to their cartesian product; `param_map`
# renames list keys to kernel parameters. With TEFL_AUTOTUNE=1 the autotuner times the
# candidates on first use and caches the winner (TEFL_CACHE_DIR); else heuristics pick.

[[norm]]
gen = true
param_map = { block = "blocks" }
blocks = [256, 512]
vec_bytes = 16
max_row_vecs = 8
"#;

fn write(path: &Path, text: &str, vendor: &str) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    fs::write(path, text.replace("@V@", vendor)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Inserts `line` after the first line of `text` that starts with `anchor`.
fn insert_after(text: &str, anchor: &str, line: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut done = false;
    for l in text.lines() {
        out.push_str(l);
        out.push('\n');
        if !done && l.trim_start().starts_with(anchor) {
            out.push_str(line);
            out.push('\n');
            done = true;
        }
    }
    if done { Ok(out) } else { Err(format!("anchor {anchor:?} not found")) }
}

pub fn new_backend(root: &Path, args: &[String]) -> Result<ExitCode, String> {
    let [vendor] = args else {
        return Err("usage: cargo xtask new-backend <vendor>".into());
    };
    let valid = vendor.len() <= 32
        && vendor.starts_with(|c: char| c.is_ascii_lowercase())
        && vendor.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        return Err(format!(
            "'{vendor}' is not a valid vendor name: use lower-case letters, digits and '_', starting with a letter"
        ));
    }
    if ["reference", "core", "ops", "default", "flagos", "vendor", "tests"].contains(&vendor.as_str()) {
        return Err(format!("'{vendor}' is reserved"));
    }
    let krate = format!("tefl-backend-{vendor}");
    let dir = root.join(&krate);
    if dir.exists() {
        return Err(format!("{} already exists", dir.display()));
    }
    let root_toml = root.join("Cargo.toml");
    let ops_toml = root.join("tefl-ops/Cargo.toml");
    let tests_toml = root.join("tests/Cargo.toml");
    let rt = fs::read_to_string(&root_toml).map_err(|e| e.to_string())?;
    let ot = fs::read_to_string(&ops_toml).map_err(|e| e.to_string())?;
    let tt = fs::read_to_string(&tests_toml).map_err(|e| e.to_string())?;
    if ot.lines().any(|l| l.trim_start().starts_with(&format!("{vendor} ="))) {
        return Err(format!("tefl-ops already has a feature '{vendor}'"));
    }
    // Edit the manifests first (in memory), so that a failure leaves nothing half-done.
    let rt = insert_after(&rt, "\"tefl-backend-reference\",", &format!("    \"{krate}\","))?;
    let rt = insert_after(&rt, "tefl-backend-reference = {", &format!("{krate} = {{ path = \"{krate}\" }}"))?;
    let rt = insert_after(&rt, "vulkan = [\"tefl-ops/vulkan\"]", &format!("{vendor} = [\"tefl-ops/{vendor}\"]"))?;
    let ot = insert_after(&ot, "vulkan = [\"dep:tefl-backend-vulkan\"]", &format!("{vendor} = [\"dep:{krate}\"]"))?;
    let ot =
        insert_after(&ot, "tefl-backend-vulkan = {", &format!("{krate} = {{ workspace = true, optional = true }}"))?;
    // The tests crate reads its backends from its features (tests/build.rs).
    let tt = insert_after(&tt, "vulkan = [\"tefl-ops/vulkan\"]", &format!("{vendor} = [\"tefl-ops/{vendor}\"]"))?;

    write(&dir.join("Cargo.toml"), CARGO_TOML, vendor)?;
    write(&dir.join("src/lib.rs"), LIB_RS, vendor)?;
    write(&dir.join("src/vendor.rs"), VENDOR_RS, vendor)?;
    write(&dir.join("src/ops/mod.rs"), OPS_MOD_RS, vendor)?;
    write(&dir.join("src/heuristics.rs"), HEURISTICS_RS, vendor)?;
    write(&dir.join("src/tune_configs.toml"), TUNE_TOML, vendor)?;
    fs::write(&root_toml, rt).map_err(|e| e.to_string())?;
    fs::write(&ops_toml, ot).map_err(|e| e.to_string())?;
    fs::write(&tests_toml, tt).map_err(|e| e.to_string())?;
    println!("created {krate}/ (src/vendor.rs, src/ops/, src/tune_configs.toml, src/heuristics.rs)");
    println!("wired feature '{vendor}' (tefl-ops, tests and the root package)");
    println!("next: cargo build --features {vendor} && cargo xtask test-backend {vendor}");
    Ok(ExitCode::SUCCESS)
}

/// The bundle's `run.sh`: conformance, quickstart and bench, logs and JSON under `$OUT`.
pub fn run_sh(backend: &str) -> String {
    format!(
        r#"#!/usr/bin/env bash
# tefl bundle for the {backend} backend: run on the GPU machine.
# Logs and JSON go to $OUT when it is set (the device tool fetches it), else ./out.
# STEPS (default "conformance quickstart oracle sanitizer bench") picks the steps to run.
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${{OUT:-$here/out}}
steps=${{STEPS:-conformance quickstart oracle sanitizer bench}}
scratch=$(mktemp -d)
mkdir -p "$out"
status=0
has() {{ case " $steps " in *" $1 "*) return 0;; esac; return 1; }}
if has conformance; then
  # Each impl and family a process, CONF_JOBS (default 8) at a time: with an empty kernel
  # cache the runtime compiler is the bound, and one process compiles one kernel at a time.
  echo "== conformance ({backend})"
  "$here/conformance" {backend} --full --jobs "${{CONF_JOBS:-8}}" 2>&1 | tee "$out/conformance.log" || status=1
fi
if has quickstart; then
  # Cold start: an empty kernel cache (every kernel compiled by NVRTC); warm: the same cache.
  for start in cold warm; do
    echo "== quickstart ($start kernel cache)"
    s0=$(date +%s.%N)
    TEFL_CACHE_DIR="$scratch/cache" "$here/quickstart" 2>&1 | tee "$out/quickstart-$start.log" || status=1
    s1=$(date +%s.%N)
    echo "quickstart $start: $(awk -v a="$s0" -v b="$s1" 'BEGIN {{ printf "%.2f", b - a }}') s wall" | tee -a "$out/quickstart-$start.log"
  done
fi
if has oracle && python3 -c "import torch" 2>/dev/null; then
  echo "== torch oracle"
  ( "$here/torch_oracle" {backend} "$scratch/oracle" && python3 "$here/torch_oracle.py" "$scratch/oracle" ) 2>&1 \
    | tee "$out/torch_oracle.log" || status=1
fi
if has sanitizer; then
  san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -n "$san" ]; then
    # memcheck over every family; racecheck (shared memory) over the families whose kernels
    # share tiles. The tool follows the conformance runs' child processes (SANITIZER_JOBS at a
    # time, default 4); SANITIZER_TIMEOUT (seconds, default 900) bounds each tool's run.
    # SANITIZER_RUNS ("TOOL FAMILIES;...") replaces those two runs, SANITIZER_ARGS are added to
    # the tool's arguments and SANITIZER_CONF_ARGS to the conformance's: e.g. one kernel over its
    # family's full cases, SANITIZER_RUNS="memcheck norms;racecheck norms" SANITIZER_ARGS=
    # "--kernel-name kns=norm_fwd" SANITIZER_CONF_ARGS="--full --impl vendor.nvidia".
    runs=("memcheck all" "racecheck norms,softmax,attention,rope,fp8")
    [ -n "${{SANITIZER_RUNS:-}}" ] && IFS=';' read -r -a runs <<< "$SANITIZER_RUNS"
    for run in "${{runs[@]}}"; do
      set -- $run
      fam=""
      [ "$2" != all ] && fam="--families $2"
      echo "== compute-sanitizer $1 ($2)"
      # shellcheck disable=SC2086 # the *_ARGS and $fam are words of their own
      timeout "${{SANITIZER_TIMEOUT:-900}}" "$san" --tool "$1" --error-exitcode 9 --target-processes all ${{SANITIZER_ARGS:-}} \
        "$here/conformance" {backend} --jobs "${{SANITIZER_JOBS:-4}}" $fam ${{SANITIZER_CONF_ARGS:-}} > "$out/sanitizer-$1-full.log" 2>&1 || status=1
      # The runs' lines and the tool's summaries here; every report in the full log.
      grep -E "^== \[|SUMMARY|passed, " "$out/sanitizer-$1-full.log" | tail -40 | tee "$out/sanitizer-$1.log"
    done
  else
    echo "compute-sanitizer not found; skipped" | tee "$out/sanitizer.log"
  fi
fi
if has bench; then
  echo "== bench"
  vs=""
  python3 -c "import torch" 2>/dev/null && vs="--vs torch"
  # FlagGems and its dependencies, when the bundle carries their wheels (see `cargo xtask
  # bundle`), are installed for the bench's peers. With every peer, TEFL_BENCH_WARMUP=1 (seconds
  # of warm-up a case and peer; 3 by default) took 264 s on an H200 (2026-12-01), inside the
  # device tool's 10-minute command limit; each second more adds about 75 s.
  if ls "$here"/peers/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target "$scratch/site" "$here"/peers/*.whl \
      && export PYTHONPATH="$scratch/site${{PYTHONPATH:+:$PYTHONPATH}}"
  fi
  # BENCH_ARGS are added to the bench's arguments (the README's table: --rounds 2). Under a
  # command's time limit, --deadline SECS ends the run with the table of the cases it measured
  # and names the rest, for a second run's --only; `bench --tables A.json,B.json` prints the two
  # as one table (two rounds with every peer took more than 600 s on an H100, 2026-12-05).
  "$here/bench" --backend {backend} $vs ${{BENCH_ARGS:-}} --json "$out/bench.json" --svg "$out/bench.svg" 2>&1 \
    | tee "$out/bench.log" || status=1
fi
rm -rf "$scratch"
exit $status
"#
    )
}

#[cfg(test)]
mod run_sh_tests {
    use super::run_sh;

    #[test]
    fn the_bundle_script_parses_and_runs_conformance_in_processes() {
        let script = run_sh("nvidia");
        assert!(script.contains(r#""$here/conformance" nvidia --full --jobs "${CONF_JOBS:-8}""#), "{script}");
        assert!(script.contains("--target-processes all"), "{script}");
        assert!(script.contains("racecheck norms,softmax,attention,rope,fp8"), "{script}");
        // bash's own parse (no run): the format string's escapes came out as shell.
        let path = std::env::temp_dir().join(format!("tefl-run-sh-{}.sh", std::process::id()));
        std::fs::write(&path, &script).unwrap();
        let out = std::process::Command::new("bash").arg("-n").arg(&path).output();
        let _ = std::fs::remove_file(&path);
        let out = out.expect("bash runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}
