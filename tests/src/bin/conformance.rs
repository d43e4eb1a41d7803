//! `conformance <backend> [--allow-unavailable] [--full] [--verbose] [--seed N] [--families a,b]
//! [--ops x,y] [--impl ID] [--shard K/N] [--jobs N]`: runs the conformance suite against every impl the backend registers
//! (or only `ID`; only the named families, and in them only the named ops' cases; only shard K
//! of N of those cases, [`Shard`]), prints the op × dtype table and
//! `N passed, N failed, N skipped`, and exits non-zero on any failure (or when the backend
//! is unavailable here, unless `--allow-unavailable`). `--jobs N` runs each (impl, family) as a
//! child process of its own, N at a time (see `tefl_tests::jobs`). `cargo xtask test-backend` runs it.

use std::process::ExitCode;

use tefl_core::{Manager, Registry};
use tefl_tests::conformance::{Shard, Size, Suite};
use tefl_tests::{cli, jobs};

const USAGE: &str = "usage: conformance <backend> [--allow-unavailable] [--full] [--verbose] [--seed N] \
[--families a,b] [--ops x,y] [--impl ID] [--shard K/N] [--jobs N]

Runs the conformance suite (every op's cases against the f64 oracle) on every impl the backend
registers, or only ID; --families and --ops narrow it (families: FAMILIES); --shard K/N runs
only every N-th of each family's remaining cases from the K-th (0 <= K < N; the N shards
together run each case once, e.g. to split a compute-sanitizer run across commands; replay a
shard with the same --shard and --seed). Prints the op x dtype
table and 'N passed, N failed, N skipped'; exits 1 on any failure, or when the backend is
unavailable here (0 with --allow-unavailable). --full adds the large and awkward shapes;
--verbose prints each case's errors; --seed N replays a run (its seed is printed first).
--jobs N (1 to 64) runs each impl and family as a process of its own, N at a time (the
kernels of an empty cache then compile N at once), each run's output printed as it ends
and the sum last; a run that crashes fails alone.";

/// The parsed command line.
struct Args {
    backend: String,
    allow_unavailable: bool,
    size: Size,
    seed: Option<u64>,
    verbose: bool,
    families: Option<Vec<String>>,
    only_impl: Option<String>,
    only_ops: Option<std::collections::BTreeSet<&'static str>>,
    shard: Option<Shard>,
    jobs: usize,
}

/// The command line, or the message for a bad one.
fn parse(argv: Vec<String>) -> Result<Args, String> {
    let mut args = argv.into_iter();
    let mut backend = None;
    let (mut allow_unavailable, mut size, mut seed, mut verbose) = (false, Size::Quick, None, false);
    let (mut families, mut only_impl, mut only_ops, mut shard, mut jobs) = (None, None, None, None, 1);
    let list = |v: String| v.split(',').map(str::to_owned).collect::<Vec<String>>();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--allow-unavailable" => allow_unavailable = true,
            "--full" => size = Size::Full,
            "--verbose" => verbose = true,
            "--seed" => {
                let v = cli::value_of(&a, &mut args)?;
                seed = Some(
                    v.parse::<u64>()
                        .map_err(|_| format!("--seed {v:?}: expected an integer from 0 to {}", u64::MAX))?,
                );
            }
            "--impl" => only_impl = Some(cli::value_of(&a, &mut args)?),
            "--jobs" => jobs = jobs::parse_jobs(&cli::value_of(&a, &mut args)?)?,
            "--shard" => shard = Some(Shard::parse(&cli::value_of(&a, &mut args)?)?),
            "--ops" => only_ops = Some(Suite::select_ops(&list(cli::value_of(&a, &mut args)?))?),
            "--families" => {
                let mut names = list(cli::value_of(&a, &mut args)?);
                // A family named twice runs once (one process or --jobs).
                let mut seen = std::collections::BTreeSet::new();
                names.retain(|f| seen.insert(f.clone()));
                if let Some(bad) = names.iter().find(|f| !Suite::FAMILIES.contains(&f.as_str())) {
                    return Err(format!("unknown family {bad:?} (families: {})", Suite::FAMILIES.join(", ")));
                }
                families = Some(names);
            }
            s if !s.starts_with('-') && backend.is_none() => backend = Some(s.to_ascii_lowercase()),
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    let backend = backend.ok_or("no backend named")?;
    Ok(Args { backend, allow_unavailable, size, seed, verbose, families, only_impl, only_ops, shard, jobs })
}

fn main() -> ExitCode {
    let argv = match cli::start(&USAGE.replace("FAMILIES", &Suite::FAMILIES.join(", "))) {
        Ok(argv) => argv,
        Err(done) => return done,
    };
    // TE-FL's log lines (which impl ran, the Vulkan pipeline statistics) when asked for.
    if std::env::var_os("TEFL_LOG_LEVEL").is_some()
        && let Err(e) = tefl_core::logging::init()
    {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let Args { backend, allow_unavailable, size, seed, verbose, families, only_impl, only_ops, shard, jobs } =
        match parse(argv) {
            Ok(a) => a,
            Err(e) => return cli::bad_usage("conformance", &e, USAGE),
        };
    let linked = tefl_ops::linked_backends();
    let mgr = Manager::new(Registry::with_builtins(), Default::default());
    let Some(info) = mgr.list_backends().into_iter().find(|b| b.name == backend) else {
        eprintln!("conformance: backend '{backend}' is not in this build (linked: {linked:?}); enable its feature");
        return ExitCode::from(2);
    };
    let seed = seed.unwrap_or_else(|| tefl_tests::seed("conformance"));
    println!("backend {backend}: seed {seed} (replay with --seed {seed})");
    let ops = tefl_core::catalogue::all().len();
    if !info.available {
        let why = info.unavailable_reason.unwrap_or_default();
        println!("backend {backend} is unavailable here: {why}");
        println!("0 passed, 0 failed, {ops} skipped");
        return if allow_unavailable { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    let mut impl_ids: Vec<String> = mgr.with_registry(|r| {
        r.all_impls()
            .filter(|i| i.backend_name().eq_ignore_ascii_case(&backend))
            .map(|i| i.impl_id().to_string())
            .collect()
    });
    impl_ids.sort();
    impl_ids.dedup();
    if let Some(only) = &only_impl {
        if !impl_ids.contains(only) {
            eprintln!("conformance: backend '{backend}' has no impl '{only}' (it has {impl_ids:?})");
            return ExitCode::from(2);
        }
        impl_ids.retain(|i| i == only);
    }
    // (A backend with no impl registered yet runs in this process: its one run skips every op.)
    if jobs > 1 && !impl_ids.is_empty() {
        let families: Vec<String> = families.unwrap_or_else(|| Suite::FAMILIES.iter().map(|f| f.to_string()).collect());
        let mut forwarded = vec!["--seed".to_string(), seed.to_string()];
        if size == Size::Full {
            forwarded.push("--full".into());
        }
        if verbose {
            forwarded.push("--verbose".into());
        }
        if let Some(ops) = &only_ops {
            forwarded.extend(["--ops".to_string(), ops.iter().copied().collect::<Vec<_>>().join(",")]);
        }
        if let Some(shard) = shard {
            forwarded.extend(["--shard".to_string(), shard.to_string()]);
        }
        return run_in_processes(&backend, &impl_ids, &families, jobs, &forwarded);
    }
    if impl_ids.is_empty() {
        // Nothing registered yet (a fresh scaffold): every op is a skip.
        impl_ids.push(format!("{backend}.none"));
    }
    let mut failed = false;
    for id in &impl_ids {
        let mut suite = match Suite::new(&mgr, id, seed, size) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("conformance: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Some(ops) = &only_ops {
            suite.only_ops(ops.clone());
        }
        match shard {
            Some(shard) => {
                suite.shard(shard);
                println!("impl {id} on {}, shard {shard} of its cases", suite.device);
            }
            None => println!("impl {id} on {}", suite.device),
        }
        suite.run_families(families.as_deref(), &mut |family| println!("  running {family} ..."));
        if verbose {
            print!("{}", suite.details());
        } else {
            // Failures always get their case line, with the errors.
            for line in suite.details().lines().filter(|l| l.contains(" FAIL ")) {
                println!("{line}");
            }
        }
        print!("{}", suite.report());
        failed |= suite.counts().1 > 0;
        // Driver debug layers (Vulkan validation under VK_INSTANCE_LAYERS): any message fails.
        let messages = tefl_core::device::runtime(suite.device.kind).map_or(0, |rt| rt.validation_messages());
        if messages > 0 {
            println!(
                "{} driver validation message(s) on {} (logged above as warnings): failed",
                messages, suite.device
            );
            failed = true;
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// `--jobs N`: each (impl, family) as a child process of this tool, N at a time. Each run's
/// output is printed when it ends, under a line naming it; then the runs that failed or ended
/// without their counts, and the sum of the counts.
fn run_in_processes(
    backend: &str,
    impls: &[String],
    families: &[String],
    jobs: usize,
    forwarded: &[String],
) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("conformance: --jobs needs this tool's own path: {e}");
            return ExitCode::FAILURE;
        }
    };
    let units: Vec<jobs::Unit> = impls
        .iter()
        .flat_map(|i| families.iter().map(move |f| jobs::Unit { impl_id: i.clone(), family: f.clone() }))
        .collect();
    println!("{} run(s) (impl x family), {jobs} at a time", units.len());
    let args = |u: &jobs::Unit| {
        let mut a =
            vec![backend.to_string(), "--impl".into(), u.impl_id.clone(), "--families".into(), u.family.clone()];
        a.extend(forwarded.iter().cloned());
        a
    };
    let total = units.len();
    let mut progress = tefl_tests::progress::Progress::new("");
    progress.start("conformance runs", Some(total));
    let results = jobs::run_units(&exe, &units, jobs, &args, &mut |f, n| {
        progress.clear();
        println!("== [{n}/{total}] {} {}: {} ({:.1} s)", f.unit.impl_id, f.unit.family, f.ended, f.wall.as_secs_f64());
        print!("{}", f.output);
        progress.tick(&format!("{} {} done", f.unit.impl_id, f.unit.family));
    });
    progress.clear();
    let (mut sum, mut bad) = ((0, 0, 0), Vec::new());
    for f in &results {
        if let Some(c) = f.counts {
            sum = jobs::add_counts(sum, c);
        }
        if !f.success || f.counts.is_none() {
            bad.push(format!("{} {} ({})", f.unit.impl_id, f.unit.family, f.ended));
        }
    }
    if !bad.is_empty() {
        println!("runs that failed or ended without their counts: {}", bad.join(", "));
    }
    println!("{} passed, {} failed, {} skipped", sum.0, sum.1, sum.2);
    if bad.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
