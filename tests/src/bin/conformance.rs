//! `conformance <backend> [--allow-unavailable] [--full] [--verbose] [--seed N] [--families a,b]
//! [--ops x,y] [--impl ID]`: runs the conformance suite against every impl the backend registers
//! (or only `ID`; only the named families, and in them only the named ops' cases), prints the op × dtype table and
//! `N passed, N failed, N skipped`, and exits non-zero on any failure (or when the backend
//! is unavailable here, unless `--allow-unavailable`). `cargo xtask test-backend` runs it.

use std::process::ExitCode;

use tefl_core::{Manager, Registry};
use tefl_tests::conformance::{Size, Suite};

fn main() -> ExitCode {
    // TE-FL's log lines (which impl ran, the Vulkan pipeline statistics) when asked for.
    if std::env::var_os("TEFL_LOG_LEVEL").is_some()
        && let Err(e) = tefl_core::logging::init()
    {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let mut args = std::env::args().skip(1);
    let mut backend = None;
    let (mut allow_unavailable, mut size, mut seed, mut verbose) = (false, Size::Quick, None, false);
    let mut families: Option<Vec<String>> = None;
    let mut only_impl: Option<String> = None;
    let mut only_ops = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--allow-unavailable" => allow_unavailable = true,
            "--full" => size = Size::Full,
            "--verbose" => verbose = true,
            "--seed" => seed = args.next().and_then(|s| s.parse::<u64>().ok()),
            "--impl" => only_impl = args.next(),
            "--ops" => {
                let list: Vec<String> = args.next().unwrap_or_default().split(',').map(str::to_owned).collect();
                match Suite::select_ops(&list) {
                    Ok(ops) => only_ops = Some(ops),
                    Err(e) => {
                        eprintln!("conformance: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            "--families" => {
                let list: Vec<String> = args.next().unwrap_or_default().split(',').map(str::to_owned).collect();
                if let Some(bad) = list.iter().find(|f| !Suite::FAMILIES.contains(&f.as_str())) {
                    eprintln!("conformance: unknown family {bad:?} (families: {})", Suite::FAMILIES.join(", "));
                    return ExitCode::from(2);
                }
                families = Some(list);
            }
            s if !s.starts_with('-') && backend.is_none() => backend = Some(s.to_ascii_lowercase()),
            other => {
                eprintln!("conformance: unexpected argument {other:?}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(backend) = backend else {
        eprintln!(
            "usage: conformance <backend> [--allow-unavailable] [--full] [--verbose] [--seed N] [--families a,b] [--ops x,y] [--impl ID]"
        );
        return ExitCode::from(2);
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
        println!("impl {id} on {}", suite.device);
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
