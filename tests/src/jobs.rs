//! `conformance --jobs N`: the suite split into runs of one impl and one family each, run as
//! child processes of the tool, N at a time. With an empty kernel cache a run is bound by the
//! runtime compiler (one process compiles the kernel a case needs when it asks for it, one at a
//! time); N processes compile N at once. A run that crashes (a GPU fault, an abort in vendor
//! code) fails that run only, and the others still report.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most child processes `--jobs` may run at once.
pub const MAX_JOBS: usize = 64;

/// `--jobs`'s value: an integer from 1 to [`MAX_JOBS`], or the message naming it.
pub fn parse_jobs(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if (1..=MAX_JOBS).contains(&n) => Ok(n),
        _ => Err(format!("--jobs {v:?}: expected an integer from 1 to {MAX_JOBS}")),
    }
}

/// One child run: an impl and a family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// The impl (`--impl`).
    pub impl_id: String,
    /// The family (`--families`).
    pub family: String,
}

/// What one child run left.
#[derive(Debug)]
pub struct Finished {
    /// The run.
    pub unit: Unit,
    /// Its stdout then its stderr (the stderr lines, if any, after a `stderr:` line).
    pub output: String,
    /// Its (passed, failed, skipped) counts, the sum of its count lines (one per impl it ran);
    /// None when it printed none (it crashed, or was killed).
    pub counts: Option<(usize, usize, usize)>,
    /// Whether it exited with success.
    pub success: bool,
    /// How it ended, in words: `exit 0`, `exit 1`, `killed by signal 6`, or why it did not start.
    pub ended: String,
    /// Its wall time.
    pub wall: Duration,
}

/// The counts of a line `N passed, N failed, N skipped` (the suite's report ends with one).
pub fn parse_counts(line: &str) -> Option<(usize, usize, usize)> {
    let mut parts = line.trim().split(", ");
    let mut take = |word: &str| -> Option<usize> {
        let (n, w) = parts.next()?.split_once(' ')?;
        if w == word { n.parse().ok() } else { None }
    };
    let counts = (take("passed")?, take("failed")?, take("skipped")?);
    parts.next().is_none().then_some(counts)
}

/// Two (passed, failed, skipped) counts added.
pub fn add_counts(a: (usize, usize, usize), b: (usize, usize, usize)) -> (usize, usize, usize) {
    (a.0 + b.0, a.1 + b.1, a.2 + b.2)
}

/// The sum of a run's count lines (one per impl it ran; a unit runs one).
fn counts_of(stdout: &str) -> Option<(usize, usize, usize)> {
    stdout.lines().filter_map(parse_counts).reduce(add_counts)
}

/// How a child ended, in words.
fn describe(status: &std::process::ExitStatus) -> String {
    if let Some(c) = status.code() {
        return format!("exit {c}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(s) = status.signal() {
            return format!("killed by signal {s}");
        }
    }
    format!("{status}")
}

/// The runs not yet started: (place in the caller's order, unit, its arguments).
type Queue = Mutex<VecDeque<(usize, Unit, Vec<String>)>>;

/// Runs `exe argv` for `unit` and waits for it.
fn run_one(exe: &Path, unit: Unit, argv: &[String]) -> Finished {
    let t0 = Instant::now();
    match Command::new(exe).args(argv).output() {
        Ok(out) => {
            let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
            let counts = counts_of(&output);
            let stderr = String::from_utf8_lossy(&out.stderr);
            if !stderr.trim().is_empty() {
                output.push_str("stderr:\n");
                output.push_str(&stderr);
                if !output.ends_with('\n') {
                    output.push('\n');
                }
            }
            Finished {
                counts,
                success: out.status.success(),
                ended: describe(&out.status),
                output,
                unit,
                wall: t0.elapsed(),
            }
        }
        Err(e) => not_run(unit, format!("did not start: {e}"), t0.elapsed()),
    }
}

/// A run that left nothing: `why` in words.
fn not_run(unit: Unit, why: String, wall: Duration) -> Finished {
    Finished { unit, output: String::new(), counts: None, success: false, ended: why, wall }
}

/// Runs `exe` once per unit with `args(unit)`, `jobs` at a time, calling `done` in the order the
/// runs finish (on the caller's thread); returns every run's result in `units`' order.
pub fn run_units(
    exe: &Path,
    units: &[Unit],
    jobs: usize,
    args: &dyn Fn(&Unit) -> Vec<String>,
    done: &mut dyn FnMut(&Finished, usize),
) -> Vec<Finished> {
    let queue: Arc<Queue> =
        Arc::new(Mutex::new(units.iter().enumerate().map(|(i, u)| (i, u.clone(), args(u))).collect()));
    let (tx, rx) = mpsc::channel::<(usize, Finished)>();
    let workers: Vec<_> = (0..jobs.clamp(1, units.len().max(1)))
        .map(|_| {
            let (queue, tx, exe) = (queue.clone(), tx.clone(), exe.to_path_buf());
            std::thread::spawn(move || {
                loop {
                    let next = queue.lock().map(|mut q| q.pop_front()).unwrap_or(None);
                    let Some((i, unit, argv)) = next else { break };
                    if tx.send((i, run_one(&exe, unit, &argv))).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let mut results: Vec<Option<Finished>> = units.iter().map(|_| None).collect();
    for (count, (i, f)) in rx.iter().enumerate() {
        done(&f, count + 1);
        results[i] = Some(f);
    }
    for w in workers {
        // A worker only ends by running out of units; one that panicked left its unit's
        // result missing, reported below as a run that did not finish.
        let _ = w.join();
    }
    results
        .into_iter()
        .zip(units)
        .map(|(r, u)| r.unwrap_or_else(|| not_run(u.clone(), "did not finish".into(), Duration::ZERO)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_lines_are_read_and_others_are_not() {
        assert_eq!(parse_counts("1833 passed, 0 failed, 12 skipped"), Some((1833, 0, 12)));
        assert_eq!(parse_counts("  0 passed, 2 failed, 0 skipped\n"), Some((0, 2, 0)));
        for line in [
            "1833 passed, 0 failed",
            "x passed, 0 failed, 0 skipped",
            "1 passed, 0 failed, 0 skipped, 1 more",
            "1 failed, 0 passed, 0 skipped",
            "impl vendor.nvidia on cuda:0",
        ] {
            assert_eq!(parse_counts(line), None, "{line}");
        }
        assert_eq!(counts_of("a\n3 passed, 1 failed, 2 skipped\nb\n4 passed, 0 failed, 1 skipped\n"), Some((7, 1, 3)));
        assert_eq!(counts_of("impl x\n"), None);
    }

    #[test]
    fn jobs_are_bounded() {
        assert_eq!(parse_jobs("8"), Ok(8));
        assert_eq!(parse_jobs("1"), Ok(1));
        for bad in ["0", "65", "-1", "x", ""] {
            assert!(parse_jobs(bad).unwrap_err().contains("--jobs"), "{bad}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn every_unit_reports_once_in_its_place_crashes_included() {
        // `sh -c SCRIPT sh IMPL FAMILY`: prints a count line, fails, or dies by a signal.
        let units: Vec<Unit> = ["ok", "fail", "crash", "ok2", "ok3"]
            .iter()
            .map(|f| Unit { impl_id: "i".into(), family: f.to_string() })
            .collect();
        let script = r#"case "$2" in
            ok*) echo "impl $1"; echo "3 passed, 0 failed, 1 skipped" ;;
            fail) echo "1 passed, 2 failed, 0 skipped"; echo boom >&2; exit 1 ;;
            crash) kill -ABRT $$ ;;
        esac"#;
        let args = |u: &Unit| vec!["-c".into(), script.into(), "sh".into(), u.impl_id.clone(), u.family.clone()];
        let mut seen = Vec::new();
        let got = run_units(Path::new("/bin/sh"), &units, 3, &args, &mut |f, n| seen.push((n, f.unit.family.clone())));
        assert_eq!(seen.len(), 5);
        assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        let fams: Vec<_> = got.iter().map(|f| f.unit.family.as_str()).collect();
        assert_eq!(fams, ["ok", "fail", "crash", "ok2", "ok3"]);
        assert_eq!((got[0].counts, got[0].success), (Some((3, 0, 1)), true));
        assert_eq!((got[1].counts, got[1].success, got[1].ended.as_str()), (Some((1, 2, 0)), false, "exit 1"));
        assert!(got[1].output.contains("stderr:\nboom"), "{}", got[1].output);
        assert_eq!((got[2].counts, got[2].success), (None, false));
        assert_eq!(got[2].ended, format!("killed by signal {}", libc::SIGABRT));
        let missing = run_units(Path::new("/no/such/exe"), &units[..1], 2, &args, &mut |_, _| {});
        assert!(missing[0].ended.starts_with("did not start"), "{}", missing[0].ended);
    }
}
