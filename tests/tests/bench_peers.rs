//! `bench --vs torch` and its peers' process: each case's peers come from one Python process
//! that takes a spec at a time; cases that share a spec are measured once; a process that dies
//! on a spec (a peer that faulted the GPU) keeps what it measured, and a new one takes the next
//! spec. The peers' side here is a stand-in `python3` speaking bench_peers.py's protocol (torch
//! is not on this machine), ahead of the real one on PATH.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The first `python3` on PATH.
fn real_python() -> PathBuf {
    let path = std::env::var_os("PATH").expect("PATH is set");
    std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
        .expect("python3 on PATH (the README's test command needs it)")
}

/// A stand-in for python3: `-c "import torch"` succeeds; otherwise it logs its start, the
/// script file it was given (bench_peers.py's text, which Triton needs in a file), and each
/// spec it reads, answers eager 1 ms and compile 2 ms the first time it reads a spec (0.5 and 3
/// ms the second time, for `--rounds`), and exits with status 3 after the eager line of a RoPE
/// spec (the way a peer's CUDA fault ends the real process).
fn stand_in(dir: &Path, log: &Path) -> PathBuf {
    let script = format!(
        r#"#!{python}
import json, sys
if sys.argv[1:3] == ["-c", "import torch"]:
    sys.exit(0)
import os
log = open({log:?}, "a")
log.write("start\n")
log.write("flush " + os.environ.get("TEFL_BENCH_PEER_FLUSH", "unset") + "\n")
script = sys.argv[1] if len(sys.argv) > 1 else ""
if os.path.isfile(script) and "def l2_scrub" in open(script).read():
    log.write("script " + script + "\n")
else:
    log.write("script missing: " + repr(sys.argv[1:]) + "\n")
log.flush()
seen = {{}}
for line in sys.stdin:
    spec, reps = json.loads(line)
    log.write("spec " + spec + "\n")
    log.flush()
    n = seen.get(spec, 0) % 2
    seen[spec] = n + 1
    print(json.dumps([spec, "eager", [1e-3, 0.5e-3][n]]), flush=True)
    if spec.startswith("rope"):
        sys.exit(3)
    print(json.dumps([spec, "compile", [2e-3, 3e-3][n]]), flush=True)
    print(json.dumps({{"done": spec}}), flush=True)
"#,
        python = real_python().display(),
        log = log.display().to_string(),
    );
    let exe = dir.join("python3");
    std::fs::write(&exe, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

/// A fresh directory named for this process and `test` holding the stand-in, its log's path,
/// and a PATH with the directory first.
fn stand_in_dir(test: &str) -> (PathBuf, PathBuf, std::ffi::OsString) {
    let dir = std::env::temp_dir().join(format!("tefl-bench-peers-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    stand_in(&dir, &log);
    let path = std::env::join_paths(
        std::iter::once(dir.clone()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    (dir, log, path)
}

/// The stdout and the stderr of `bench --backend reference --shapes small --vs torch --reps 3`
/// with `args` and the stand-in first on `path` (the run must succeed).
fn bench_vs_stand_in(path: &std::ffi::OsStr, args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--backend", "reference", "--shapes", "small", "--vs", "torch", "--reps", "3"])
        .args(args)
        .env("PATH", path)
        .env("TEFL_BENCH_WARMUP", "0.1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "bench failed\n{stdout}\n{stderr}");
    (stdout, stderr)
}

/// The stand-in's log: its text, how many processes started, and the specs they read in order.
fn read_log(log: &Path) -> (String, usize, Vec<String>) {
    let text = std::fs::read_to_string(log).unwrap();
    let starts = text.lines().filter(|l| *l == "start").count();
    let specs = text.lines().filter_map(|l| l.strip_prefix("spec ")).map(str::to_string).collect();
    (text, starts, specs)
}

/// The cells after the name column of the row of `stdout` whose name starts with `name`.
fn row(stdout: &str, name: &str) -> Vec<String> {
    let line = stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no row {name:?} in\n{stdout}"));
    line[40..].split_whitespace().map(str::to_string).collect()
}

#[test]
fn peers_run_case_by_case_in_one_process_that_is_replaced_after_a_fault() {
    let (dir, log, path) = stand_in_dir("fault");
    let (stdout, stderr) =
        bench_vs_stand_in(&path, &["--only", "rmsnorm_fwd 4096,rope,gelu,attn_fwd", "--attn-d", "64"]);
    let row = |name: &str| row(&stdout, name);
    // tefl ms, rate (two words), of copy (memory-bound rows), eager, compile, best, speed.
    let rms = row("rmsnorm_fwd 4096x4096");
    assert_eq!(&rms[4..7], ["1.000", "2.000", "eager"], "{rms:?}");
    let gelu = row("gelu");
    assert_eq!(&gelu[4..7], ["1.000", "2.000", "eager"], "{gelu:?}");
    // The spec whose process died keeps the peer it measured; the one it did not is missing.
    let rope = row("rope_fwd");
    assert_eq!(&rope[4..7], ["1.000", "-", "eager"], "{rope:?}");
    assert!(stderr.contains("ended with exit status: 3 on 'rope"), "{stderr}");
    // The bshd and thd attention cases share one spec's peers (no "of copy" column).
    let bshd = row("attn_fwd causal");
    let thd = row("attn_fwd thd causal");
    assert_eq!(&bshd[3..6], ["1.000", "2.000", "eager"], "{bshd:?}");
    assert_eq!(&thd[3..6], ["1.000", "2.000", "eager"], "{thd:?}");

    // Two processes: the first until RoPE's spec, a second for the specs after it; each spec
    // sent once, in the cases' order.
    let (log, starts, specs) = read_log(&log);
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(starts, 2, "{log}");
    assert_eq!(specs.len(), 4, "{log}");
    assert!(specs[0].starts_with("rmsnorm_fwd") && specs[1].starts_with("gelu"), "{log}");
    assert!(specs[2].starts_with("rope") && specs[3].starts_with("attn_fwd"), "{log}");
    assert_eq!(lines.iter().position(|l| l.starts_with("spec rope")).map(|i| lines[i + 1]), Some("start"), "{log}");
    // Both processes ran bench_peers.py from a file of the run's own, gone once bench ended.
    let scripts: Vec<&str> = lines.iter().filter_map(|l| l.strip_prefix("script ")).collect();
    assert_eq!(scripts.len(), 2, "{log}");
    assert!(scripts.iter().all(|s| s.ends_with("bench_peers.py") && *s == scripts[0]), "{log}");
    assert!(!Path::new(scripts[0]).exists(), "{} left behind", scripts[0]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--gemm MxNxK` adds a bf16 GEMM of that shape, timed with its FLOPs and with torch's
/// `A @ B` on the same shape as peer; a malformed shape is refused naming the option, and one
/// too large for the host is an error, not an abort.
#[test]
fn extra_gemm_shapes_are_timed_beside_their_peer() {
    let (dir, log, path) = stand_in_dir("gemm");
    let (stdout, _) = bench_vs_stand_in(&path, &["--only", "gemm 40x", "--gemm", "40x24x56,40x8x8"]);
    for name in ["gemm 40x24x56", "gemm 40x8x8"] {
        // tefl ms, rate (two words), eager, compile, best, speed.
        let cols = row(&stdout, name);
        assert_eq!(cols[2], "TFLOP/s", "{cols:?}");
        assert_eq!(&cols[3..6], ["1.000", "2.000", "eager"], "{cols:?}");
    }
    assert!(!stdout.lines().any(|l| l.starts_with("gemm 1024")), "--only keeps the extra shapes alone\n{stdout}");
    let (log, _, specs) = read_log(&log);
    assert_eq!(specs, ["gemm_mnk 40 24 56", "gemm_mnk 40 8 8"], "{log}");
    // A shape too large for the host's memory (its element count past usize, so whatever the
    // host's overcommit policy) fails the run with an error naming it.
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--gemm", "99999999999x9x99999999999", "--only", "gemm 9999", "--reps", "3"])
        .env("TEFL_BENCH_WARMUP", "0.1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("out of memory") && stderr.contains("[99999999999, 99999999999]"), "{stderr}");
    for bad in ["40x24", "40x0x8", "ax8x8"] {
        let out = Command::new(env!("CARGO_BIN_EXE_bench")).args(["--gemm", bad]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--gemm") && stderr.contains(bad), "{bad}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--rounds N` times each case N times in turns with its peers (each spec sent once a round,
/// one process) and keeps each side's fastest round, per peer; the JSON holds every round.
/// A count out of range is refused naming the option, as is a bad `--reps`.
#[test]
fn rounds_alternate_with_the_peers_and_keep_each_sides_fastest() {
    let (dir, log, path) = stand_in_dir("rounds");
    let json = dir.join("bench.json");
    let (stdout, stderr) =
        bench_vs_stand_in(&path, &["--only", "gelu", "--rounds", "2", "--json", json.to_str().unwrap()]);
    assert!(stdout.contains("fastest of 2 rounds"), "{stdout}");
    // Off a terminal each of tefl's rounds is marked as it starts, in order.
    let marks: Vec<&str> =
        stderr.lines().filter(|l| l.starts_with("bench: gelu") && l.contains(": tefl, round")).collect();
    assert_eq!(marks.len(), 2, "{stderr}");
    assert!(marks[0].ends_with("round 1 of 2") && marks[1].ends_with("round 2 of 2"), "{marks:?}");
    // tefl ms, rate (two words), of copy, spread, eager, compile, best, speed: eager's fastest
    // is its second round's, compile's its first's.
    let gelu = row(&stdout, "gelu");
    assert!(gelu[4].ends_with('%'), "{gelu:?}");
    assert_eq!(&gelu[5..8], ["0.500", "2.000", "eager"], "{gelu:?}");
    let (log, starts, specs) = read_log(&log);
    assert_eq!(starts, 1, "{log}");
    assert_eq!(specs.len(), 2, "{log}");
    assert!(specs.iter().all(|s| s.starts_with("gelu")) && specs[0] == specs[1], "{log}");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["rounds"], 2, "{doc}");
    let r = &doc["results"][0];
    let mine: Vec<f64> = r["rounds_ms"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(mine.len(), 2, "{r}");
    let best = mine.iter().copied().fold(f64::INFINITY, f64::min);
    assert_eq!(r["median_ms"].as_f64(), Some(best), "{r}");
    let eager: Vec<f64> =
        r["peers_rounds_ms"].as_array().unwrap().iter().map(|m| m["eager"].as_f64().unwrap()).collect();
    assert_eq!(eager, [1.0, 0.5], "{r}");
    assert_eq!(r["peers_ms"]["compile"].as_f64(), Some(2.0), "{r}");
    for (opt, bad) in [("--rounds", "0"), ("--rounds", "11"), ("--rounds", "two"), ("--reps", "0"), ("--reps", "x")] {
        let out = Command::new(env!("CARGO_BIN_EXE_bench")).args([opt, bad]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{opt} {bad}: {stderr}");
        assert!(stderr.contains(opt) && stderr.contains(bad), "{opt} {bad}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--deadline SECS` starts no case once SECS have passed (the first case always runs) and
/// names the rest with the `--only` that runs them; `--tables` prints the two runs' JSON as one
/// table, chart and JSON, each row as its own run printed it, measuring nothing. Files that do
/// not go together (an op twice, another backend) and a measuring flag beside `--tables` are
/// refused naming the culprit.
#[test]
fn a_run_cut_by_its_deadline_is_completed_by_a_second_and_printed_as_one_table() {
    let (dir, _log, path) = stand_in_dir("tables");
    let file = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let (first, _) = bench_vs_stand_in(
        &path,
        &["--only", "gelu,softmax_bwd", "--rounds", "2", "--deadline", "0", "--json", &file("a.json")],
    );
    let a: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file("a.json")).unwrap()).unwrap();
    assert_eq!(a["results"].as_array().map(Vec::len), Some(1), "{a}");
    assert!(a["results"][0]["op"].as_str().unwrap().starts_with("gelu"), "{a}");
    let rest: Vec<String> =
        a["not_measured"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    assert_eq!(rest.len(), 1, "{a}");
    assert!(rest[0].starts_with("softmax_bwd"), "{a}");
    let hint = format!("--only {:?}", rest.join(","));
    assert!(first.contains("--deadline passed after 1 of 2 cases") && first.contains(&hint), "{first}");

    let (second, _) =
        bench_vs_stand_in(&path, &["--only", &rest.join(","), "--rounds", "2", "--json", &file("b.json")]);
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--tables", &format!("{},{}", file("a.json"), file("b.json"))])
        .args(["--json", &file("c.json"), "--svg", &file("c.svg")])
        .output()
        .unwrap();
    let merged = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{merged}\n{}", String::from_utf8_lossy(&out.stderr));
    // Each row as its own run printed it: tefl's time, rate, fraction of copy, spread, peers.
    assert_eq!(row(&merged, "gelu"), row(&first, "gelu"), "{merged}\n{first}");
    assert_eq!(row(&merged, "softmax_bwd"), row(&second, "softmax_bwd"), "{merged}\n{second}");
    let c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file("c.json")).unwrap()).unwrap();
    let ops: Vec<&str> = c["results"].as_array().unwrap().iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops.len(), 2, "{c}");
    assert!(ops[0].starts_with("gelu") && ops[1] == rest[0], "{c}");
    assert_eq!(c["not_measured"].as_array().map(Vec::len), Some(0), "{c}");
    assert!(std::fs::read_to_string(file("c.svg")).unwrap().contains("<svg"), "no chart");

    // Refused: an op in two files, a file of another backend, a measuring flag, a bad deadline.
    let mut other = a.clone();
    other["backend"] = "vulkan".into();
    other["results"][0]["op"] = "gelu elsewhere".into();
    std::fs::write(file("other.json"), other.to_string()).unwrap();
    for (args, names) in [
        (vec!["--tables".to_string(), format!("{},{}", file("a.json"), file("a.json"))], "is in an earlier file too"),
        (vec!["--tables".to_string(), format!("{},{}", file("a.json"), file("other.json"))], "has backend \"vulkan\""),
        (vec!["--tables".to_string(), file("a.json"), "--only".to_string(), "gelu".to_string()], "--only measures"),
        (vec!["--tables".to_string(), file("missing.json")], "missing.json"),
        (vec!["--deadline".to_string(), "-1".to_string()], "--deadline \"-1\""),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_bench")).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(names), "{args:?}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `TEFL_BENCH_PEER_FLUSH=memset` reaches the peers' process and is named in the run's first
/// line (with `zero`, or unset, the peers flush with torch's `zero_()`); another value is
/// refused before anything runs, naming the variable and the value.
#[test]
fn the_peers_flush_is_chosen_by_its_variable_and_checked() {
    let (dir, log, path) = stand_in_dir("flush");
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--backend", "reference", "--shapes", "small", "--vs", "torch", "--reps", "3", "--only", "gelu"])
        .env("PATH", &path)
        .env("TEFL_BENCH_WARMUP", "0.1")
        .env("TEFL_BENCH_PEER_FLUSH", "memset")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let (text, starts, _) = read_log(&log);
    assert_eq!(starts, 1, "{text}");
    assert!(text.contains("flush memset\n"), "{text}");
    // The reference backend has no L2 flush, so its first line names none.
    assert!(!stdout.lines().next().unwrap_or("").contains("flush"), "{stdout}");
    for bad in ["", "Memset", "fill"] {
        let out = Command::new(env!("CARGO_BIN_EXE_bench"))
            .args(["--backend", "reference", "--shapes", "small", "--vs", "torch", "--only", "gelu"])
            .env("PATH", &path)
            .env("TEFL_BENCH_PEER_FLUSH", bad)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains(&format!("TEFL_BENCH_PEER_FLUSH={bad:?}")), "{bad:?}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
