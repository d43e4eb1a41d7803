//! The suite's command-line tools as a vendor engineer runs them: `--help` is the usage on
//! stdout with success, a flag's bad or missing value is an error naming the flag, and output
//! piped into a reader that has gone (`conformance reference | head`) ends the tool quietly,
//! never with a panic.

use std::process::{Command, Output, Stdio};

fn run(exe: &str, args: &[&str]) -> Output {
    Command::new(exe).args(args).output().unwrap_or_else(|e| panic!("{exe}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_prints_the_usage_and_succeeds() {
    for (exe, name) in [
        (env!("CARGO_BIN_EXE_conformance"), "conformance"),
        (env!("CARGO_BIN_EXE_bench"), "bench"),
        (env!("CARGO_BIN_EXE_explain"), "explain"),
        (env!("CARGO_BIN_EXE_coverage"), "coverage"),
        (env!("CARGO_BIN_EXE_torch_oracle"), "torch_oracle"),
    ] {
        for flag in ["--help", "-h"] {
            let out = run(exe, &[flag]);
            assert!(out.status.success(), "{name} {flag}: {:?} {}", out.status, text(&out.stderr));
            assert!(text(&out.stdout).starts_with(&format!("usage: {name}")), "{name} {flag}: {}", text(&out.stdout));
        }
    }
}

#[test]
fn a_bad_or_missing_value_names_its_flag() {
    let conformance = env!("CARGO_BIN_EXE_conformance");
    let bench = env!("CARGO_BIN_EXE_bench");
    for (exe, args, names) in [
        (conformance, &["reference", "--seed", "abc"][..], "--seed \"abc\""),
        (conformance, &["reference", "--seed"][..], "--seed needs a value"),
        (conformance, &["reference", "--impl"][..], "--impl needs a value"),
        (conformance, &["reference", "--families", "norms,nope"][..], "unknown family \"nope\""),
        (conformance, &["reference", "--ops", "--full"][..], "--ops needs a value"),
        (conformance, &["reference", "--jobs", "0"][..], "--jobs \"0\""),
        (conformance, &["reference", "--jobs"][..], "--jobs needs a value"),
        (bench, &["--vs", "cuda"][..], "--vs \"cuda\""),
        (bench, &["--json", "--svg", "chart.svg"][..], "--json needs a value"),
        (bench, &["--rounds", "11"][..], "--rounds \"11\""),
        (bench, &["--backend", "reference", "--only", "no_such_case"][..], "matches no case"),
    ] {
        let out = run(exe, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {:?} {err}", out.status);
        assert!(err.contains(names), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn a_closed_pipe_ends_the_tool_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .args(["reference", "--families", "empty", "--seed", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("conformance starts");
    // The reader goes before the tool has written its lines.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("conformance ends");
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{:?}: {err}", out.status);
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}: {err}", out.status);
    }
}

/// The last line of a conformance run: its counts.
fn counts_line(out: &Output) -> String {
    text(&out.stdout).lines().last().unwrap_or_default().to_string()
}

#[test]
fn jobs_split_the_run_into_processes_with_the_same_sum() {
    let exe = env!("CARGO_BIN_EXE_conformance");
    let args =
        ["reference", "--families", "softmax,empty,nan,empty", "--ops", "scaled_softmax_forward,rmsnorm_fwd,gelu"];
    let serial = run(exe, &args);
    assert!(serial.status.success(), "{}", text(&serial.stdout));
    let mut with_jobs = args.to_vec();
    with_jobs.extend(["--jobs", "2"]);
    let parallel = run(exe, &with_jobs);
    let out = text(&parallel.stdout);
    assert!(parallel.status.success(), "{out}");
    // One run a family, each under its own line, and the same counts in sum.
    assert!(out.contains("\nbackend reference: seed "), "{out}");
    assert_eq!(out.matches("\n== [").count(), 3, "{out}");
    for fam in ["softmax", "empty", "nan"] {
        assert!(out.contains(&format!(" reference.cpu {fam}: exit 0 (")), "{fam}: {out}");
    }
    assert_eq!(counts_line(&parallel), counts_line(&serial));
    assert!(!counts_line(&serial).starts_with("0 passed"), "{}", counts_line(&serial));
}

/// `torch_oracle reference DIR` records AdamW's inputs before its in-place step (their own
/// copies, not views of the updated tensors) and its outputs after: the recorded p, m and v
/// follow from the recorded p0, g, m0 and v0 by AdamW's formula, evaluated here in f64.
#[test]
fn the_oracle_dump_records_adamw_inputs_before_the_step() {
    let dir = std::env::temp_dir().join(format!("tefl-oracle-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = run(env!("CARGO_BIN_EXE_torch_oracle"), &["reference", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let read = |name: &str| -> Vec<f64> {
        let bytes = std::fs::read(dir.join(format!("adamw_f32.{name}.f32"))).unwrap();
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()
    };
    let (p0, g, m0, v0, p, m, v) = (read("p0"), read("g"), read("m0"), read("v0"), read("p"), read("m"), read("v"));
    assert_eq!(p0.len(), p.len());
    assert!(p0.iter().zip(&p).any(|(a, b)| a != b), "p0 is p after the step");
    // The dump's hyper-parameters: lr 1e-3, betas (0.9, 0.999), eps 1e-8, step 3, decay 0.01.
    let (lr, b1, b2, eps, step, wd) = (1e-3, 0.9f64, 0.999f64, 1e-8, 3, 0.01);
    let (bc1, bc2) = (1.0 - b1.powi(step), 1.0 - b2.powi(step));
    for i in (0..p.len()).step_by(997) {
        let mi = b1 * m0[i] + (1.0 - b1) * g[i];
        let vi = b2 * v0[i] + (1.0 - b2) * g[i] * g[i];
        let pi = p0[i] * (1.0 - lr * wd) - lr * (mi / bc1) / ((vi / bc2).sqrt() + eps);
        for (what, want, got) in [("m", mi, m[i]), ("v", vi, v[i]), ("p", pi, p[i])] {
            assert!((want - got).abs() <= 1e-5 * want.abs().max(1e-3), "{what}[{i}]: {got} against {want}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--shard K/N` splits an impl's cases into N disjoint shares: the shards' passes add up to
/// the unsharded run's (each case runs in exactly one shard), each shard runs some, and the
/// cases of the other shards are skipped naming the flag. With `--jobs` the children take it
/// and run the same cases.
#[test]
fn shards_split_the_cases_and_together_run_each_once() {
    let exe = env!("CARGO_BIN_EXE_conformance");
    let base = ["reference", "--families", "softmax,empty", "--seed", "7"];
    let whole = run(exe, &base);
    assert!(whole.status.success(), "{}", text(&whole.stdout));
    let counts = |out: &Output| -> (usize, usize, usize) {
        let line = counts_line(out);
        tefl_tests::jobs::parse_counts(&line).unwrap_or_else(|| panic!("no counts line: {line}"))
    };
    let (passed, failed, skipped) = counts(&whole);
    assert!(passed >= 6 && failed == 0, "{}", counts_line(&whole));
    let mut sum = 0;
    for k in 0..3 {
        let shard = format!("{k}/3");
        let mut args = base.to_vec();
        args.extend(["--shard", &shard, "--verbose"]);
        let out = run(exe, &args);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{shard}: {stdout}");
        assert!(stdout.contains(&format!("shard {shard} of its cases")), "{shard}: {stdout}");
        assert!(stdout.contains(&format!("skip in another shard (--shard {shard})")), "{shard}: {stdout}");
        let (p, f, s) = counts(&out);
        assert!(p > 0 && f == 0, "{shard}: {}", counts_line(&out));
        // Every case is counted in every shard: run here or skipped as another's.
        assert_eq!(p + s, passed + skipped, "{shard}: {}", counts_line(&out));
        sum += p;
    }
    assert_eq!(sum, passed);
    // Each family's cases are counted from its first, so a family in a process of its own
    // (`--jobs`) takes the same share as in one process. (The reference's softmax family has
    // 189 cases, not a multiple of 4: counted on across families, shard 0/4 would take one
    // fewer of the empty family's in one process than with --jobs.)
    let mut with_jobs = base.to_vec();
    with_jobs.extend(["--shard", "0/4", "--jobs", "2"]);
    let parallel = run(exe, &with_jobs);
    assert!(parallel.status.success(), "{}", text(&parallel.stdout));
    let mut one = base.to_vec();
    one.extend(["--shard", "0/4"]);
    assert_eq!(counts_line(&parallel), counts_line(&run(exe, &one)));
    for bad in ["3/3", "0/0", "1", "a/2", "-1/2", "0/1001"] {
        let mut args = base.to_vec();
        args.extend(["--shard", bad]);
        let out = run(exe, &args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains(&format!("--shard {bad:?}")), "{bad}: {err}");
    }
}
