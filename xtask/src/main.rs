//! `cargo xtask <command>`: the commands vendor engineers and CI use.
//!
//! ```text
//! cargo xtask test-backend <vendor>[,<vendor>...] [--allow-unavailable] [--full] [--seed N] [--jobs N] [--shard K/N]
//! cargo xtask coverage [--check]
//! cargo xtask explain <op> [--device cpu|cuda|hip|vulkan] [--dtype bf16]
//! cargo xtask new-backend <vendor>
//! cargo xtask bundle <backend>
//! cargo xtask bench [--backend X] [--vs torch] [--json FILE] [--svg FILE] [--shapes anchor|small] [--reps N] [--rounds N] [--only S[,S...]]
//! ```
//!
//! The work itself is done by the tool binaries of the `tests` crate (conformance, coverage,
//! explain, bench), built with the features the command needs; this crate only drives cargo
//! and edits files, so it builds in seconds and needs no backend.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod scaffold;

const USAGE: &str = "usage: cargo xtask <command>

  test-backend <vendor>[,<vendor>...] [--allow-unavailable] [--full] [--verbose] [--seed N] [--jobs N] [--shard K/N]
        run the conformance suite for one backend (several: one build, each in turn); prints op x dtype -> pass/fail/skip and
        'N passed, N failed, N skipped' (--verbose: max abs and rel error per case); fails on any failure, or when the backend is
        unavailable here (unless --allow-unavailable); --jobs N runs each impl and family as a process, N at a time;
        --shard K/N runs only shard K of N of the cases (the N shards together run each once)
  coverage [--check]
        write docs/coverage.md (op x backend, from the registry); --check fails when stale
  explain <op> [--device cpu|cuda|hip|vulkan] [--dtype bf16]
        the candidate chain under the current TE_FL_* environment, with reasons
  new-backend <vendor>
        scaffold tefl-backend-<vendor> (vendor.rs, ops/, tune_configs.toml, heuristics.rs)
        and wire its feature into the workspace (root, tefl-ops and tests)
  bundle <backend>
        release conformance/bench/explain/quickstart binaries and a run.sh for the GPU
        machine, in target/bundle/<backend>/ (under 64 MiB)
  bench [--backend X] [--vs torch] [--json FILE] [--svg FILE] [--shapes anchor|small] [--reps N] [--rounds N] [--only S[,S...]]
        time each op of the anchor table on the backend's device and, with --vs torch, every
        peer (torch eager, torch.compile, SDPA flash/cuDNN, FlagGems) in the same run; --svg
        draws tefl's speed relative to the best peer";

/// The bundle size limit of the GPU machine's carried paths.
const BUNDLE_LIMIT: u64 = 64 << 20;

/// The workspace root: the parent of this crate's manifest directory as cargo reports it at
/// run time (not at build time: a copy of the repository may share the target directory),
/// else the nearest ancestor of the current directory with a `[workspace]` manifest.
fn root() -> PathBuf {
    if let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR")
        && let Some(parent) = Path::new(&dir).parent()
        && parent.join("Cargo.toml").exists()
    {
        return parent.to_path_buf();
    }
    let mut dir = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    loop {
        if fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]")) {
            return dir;
        }
        if !dir.pop() {
            return PathBuf::from(".");
        }
    }
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// The backend features of tefl-ops (each names a crate `tefl-backend-<feature>`).
fn backend_features() -> Result<Vec<String>, String> {
    let path = root().join("tefl-ops/Cargo.toml");
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut in_features = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_features = l == "[features]";
            continue;
        }
        if in_features && let Some((name, _)) = l.split_once('=') {
            let name = name.trim();
            if !name.is_empty() && name != "default" && !name.starts_with('#') {
                out.push(name.to_string());
            }
        }
    }
    Ok(out)
}

/// The `--features` value that links `backend` (none for the reference).
fn features_for(backend: &str) -> Result<Option<String>, String> {
    if backend == "reference" {
        return Ok(None);
    }
    let all = backend_features()?;
    if all.iter().any(|f| f == backend) {
        Ok(Some(format!("tefl-ops/{backend}")))
    } else {
        Err(format!("unknown backend '{backend}': known backends are reference, {}", all.join(", ")))
    }
}

fn all_features() -> Result<String, String> {
    Ok(backend_features()?.iter().map(|f| format!("tefl-ops/{f}")).collect::<Vec<_>>().join(","))
}

/// Runs a tool binary of the tests crate, inheriting stdio; returns its exit code.
fn run_tool(bin: &str, features: Option<&str>, args: &[String]) -> Result<i32, String> {
    let mut c = cargo();
    c.args(["run", "--release", "--quiet", "-p", "tefl-tests", "--bin", bin]);
    if let Some(f) = features.filter(|f| !f.is_empty()) {
        c.args(["--features", f]);
    }
    c.arg("--").args(args);
    let status = c.status().map_err(|e| format!("running cargo: {e}"))?;
    Ok(status.code().unwrap_or(1))
}

fn tool_output(bin: &str, features: &str) -> Result<String, String> {
    let mut c = cargo();
    c.args(["run", "--release", "--quiet", "-p", "tefl-tests", "--bin", bin]);
    if !features.is_empty() {
        c.args(["--features", features]);
    }
    let out = c.output().map_err(|e| format!("running cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("{bin} failed:\n{}", String::from_utf8_lossy(&out.stderr)));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("{bin} printed invalid UTF-8: {e}"))
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}

/// `test-backend`'s options after the vendor: the flags it passes to `conformance`, each
/// option that takes a value followed by one (`conformance` checks the values themselves).
fn check_test_backend_options(options: &[String]) -> Result<(), String> {
    let mut it = options.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--allow-unavailable" | "--full" | "--verbose" => {}
            "--seed" | "--jobs" | "--shard" => {
                if it.next().is_none() {
                    return Err(format!("test-backend: {a} needs a value"));
                }
            }
            _ => return Err(format!("test-backend: unknown option {a}")),
        }
    }
    Ok(())
}

/// The vendors of `test-backend`'s first argument (`nvidia,amd`: one build with both features,
/// then the suite for each in turn, as CI's no-GPU check of both does without a second
/// optimised build of the tests crate) and the cargo features of that build.
fn vendors_and_features(list: &str) -> Result<(Vec<String>, String), String> {
    let vendors: Vec<String> = list.split(',').map(|v| v.trim().to_ascii_lowercase()).collect();
    if vendors.iter().any(String::is_empty) {
        return Err(format!("test-backend: an empty vendor name in '{list}'"));
    }
    let mut features = Vec::new();
    for v in &vendors {
        features.extend(features_for(v)?);
    }
    Ok((vendors, features.join(",")))
}

fn test_backend(args: &[String]) -> Result<ExitCode, String> {
    let Some(vendors) = args.first().filter(|a| !a.starts_with('-')) else {
        return Err("test-backend needs a vendor: cargo xtask test-backend <vendor>".into());
    };
    let (vendors, features) = vendors_and_features(vendors)?;
    check_test_backend_options(&args[1..])?;
    let mut worst = 0;
    for v in vendors {
        let mut tool_args = vec![v];
        tool_args.extend(args[1..].iter().cloned());
        let code = run_tool("conformance", Some(&features), &tool_args)?;
        if code != 0 {
            worst = code;
        }
    }
    Ok(exit(worst))
}

fn coverage(args: &[String]) -> Result<ExitCode, String> {
    let check = match args {
        [] => false,
        [a] if a == "--check" => true,
        _ => return Err("usage: cargo xtask coverage [--check]".into()),
    };
    let table = tool_output("coverage", &all_features()?)?;
    let path = root().join("docs/coverage.md");
    if check {
        let current = fs::read_to_string(&path).unwrap_or_default();
        if current != table {
            eprintln!("docs/coverage.md is stale: run `cargo xtask coverage` and commit the result");
            return Ok(ExitCode::FAILURE);
        }
        println!("docs/coverage.md is up to date");
        return Ok(ExitCode::SUCCESS);
    }
    fs::create_dir_all(root().join("docs")).map_err(|e| e.to_string())?;
    fs::write(&path, table).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(ExitCode::SUCCESS)
}

fn explain(args: &[String]) -> Result<ExitCode, String> {
    if args.is_empty() {
        return Err("usage: cargo xtask explain <op> [--device cpu|cuda|hip|vulkan] [--dtype bf16]".into());
    }
    Ok(exit(run_tool("explain", Some(&all_features()?), args)?))
}

fn bench(args: &[String]) -> Result<ExitCode, String> {
    let mut backend = "reference".to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--backend" {
            backend = it.next().cloned().unwrap_or_default().to_ascii_lowercase();
        }
    }
    let features = features_for(&backend)?;
    Ok(exit(run_tool("bench", features.as_deref(), args)?))
}

fn bundle(args: &[String]) -> Result<ExitCode, String> {
    let [backend] = args else {
        return Err("usage: cargo xtask bundle <backend>".into());
    };
    let backend = backend.to_ascii_lowercase();
    let features = features_for(&backend)?;
    let mut build = cargo();
    build.args(["build", "--release", "-p", "tefl-tests", "--bins"]);
    if let Some(f) = &features {
        build.args(["--features", f]);
    }
    if !build.status().map_err(|e| e.to_string())?.success() {
        return Err("building the tool binaries failed".into());
    }
    let mut qs = cargo();
    qs.args(["build", "--release", "--example", "quickstart"]);
    if let Some(f) = &features {
        qs.args(["--features", f]);
    }
    if !qs.status().map_err(|e| e.to_string())?.success() {
        return Err("building the quickstart failed".into());
    }
    let target = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| root().join("target"));
    let dir = root().join("target/bundle").join(&backend);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let bins = [
        ("conformance", target.join("release/conformance")),
        ("bench", target.join("release/bench")),
        ("explain", target.join("release/explain")),
        ("torch_oracle", target.join("release/torch_oracle")),
        ("quickstart", target.join("release/examples/quickstart")),
    ];
    for (name, src) in &bins {
        let dst = dir.join(name);
        fs::copy(src, &dst).map_err(|e| format!("{}: {e}", src.display()))?;
        // Debug info is not needed on the device; strip it when `strip` exists.
        let _ = Command::new("strip").arg("--strip-debug").arg(&dst).status();
    }
    fs::copy(root().join("tests/torch_oracle.py"), dir.join("torch_oracle.py")).map_err(|e| e.to_string())?;
    // The bench's FlagGems peer: wheels put in target/bundle/peers (README, "Benchmarks") travel
    // along and run.sh installs them.
    let peers = root().join("target/bundle/peers");
    let wheels: Vec<PathBuf> = fs::read_dir(&peers)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "whl")).collect()
        })
        .unwrap_or_default();
    if !wheels.is_empty() {
        fs::create_dir_all(dir.join("peers")).map_err(|e| e.to_string())?;
        for w in &wheels {
            let name = w.file_name().ok_or("a wheel without a name")?;
            fs::copy(w, dir.join("peers").join(name)).map_err(|e| format!("{}: {e}", w.display()))?;
        }
    }
    let run_sh = scaffold::run_sh(&backend);
    fs::write(dir.join("run.sh"), run_sh).map_err(|e| e.to_string())?;
    set_executable(&dir.join("run.sh"))?;
    let size_of = |d: &Path| -> u64 {
        fs::read_dir(d).map_or(0, |r| r.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
    };
    let total = size_of(&dir) + size_of(&dir.join("peers"));
    println!("bundle {} : {:.1} MiB", dir.display(), total as f64 / (1 << 20) as f64);
    if total >= BUNDLE_LIMIT {
        return Err(format!("the bundle is {total} bytes, over the 64 MiB the GPU machine accepts"));
    }
    println!("on the GPU machine: bash target/bundle/{backend}/run.sh   (logs and JSON under $OUT)");
    Ok(ExitCode::SUCCESS)
}

#[cfg(unix)]
fn set_executable(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())
}

#[cfg(not(unix))]
fn set_executable(_: &Path) -> Result<(), String> {
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("help", &[][..]),
    };
    let result = match cmd {
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        "test-backend" => test_backend(rest),
        "coverage" => coverage(rest),
        "explain" => explain(rest),
        "new-backend" => scaffold::new_backend(&root(), rest),
        "bundle" => bundle(rest),
        "bench" => bench(rest),
        other => Err(format!("unknown command '{other}'\n\n{USAGE}")),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cargo xtask: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{check_test_backend_options, vendors_and_features};

    #[test]
    fn test_backend_passes_its_flags_on_and_names_an_unknown_or_incomplete_one() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            check_test_backend_options(&args(&["--full", "--seed", "7", "--jobs", "2", "--shard", "1/3"])),
            Ok(())
        );
        assert_eq!(
            check_test_backend_options(&args(&["--families", "norms"])).unwrap_err(),
            "test-backend: unknown option --families"
        );
        assert_eq!(check_test_backend_options(&args(&["--shard"])).unwrap_err(), "test-backend: --shard needs a value");
        // A value is only taken after the option it belongs to.
        assert_eq!(check_test_backend_options(&args(&["7"])).unwrap_err(), "test-backend: unknown option 7");
    }

    #[test]
    fn test_backend_takes_one_vendor_or_a_list_and_names_a_bad_one() {
        let (v, f) = vendors_and_features("nvidia").unwrap();
        assert_eq!((v, f.as_str()), (vec!["nvidia".to_string()], "tefl-ops/nvidia"));
        let (v, f) = vendors_and_features("NVIDIA, amd").unwrap();
        assert_eq!((v, f.as_str()), (vec!["nvidia".to_string(), "amd".to_string()], "tefl-ops/nvidia,tefl-ops/amd"));
        // The reference backend needs no feature.
        assert_eq!(vendors_and_features("reference,vulkan").unwrap().1, "tefl-ops/vulkan");
        assert!(vendors_and_features("nvidia,,amd").unwrap_err().contains("empty vendor name"));
        assert!(vendors_and_features("nvidia,bogus").unwrap_err().contains("unknown backend 'bogus'"));
    }
}
