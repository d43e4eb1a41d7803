//! What the suite's command-line tools (`bench`, `conformance`, `explain`, `coverage`,
//! `torch_oracle`) share: `-h` / `--help`, flags that take a value, and output piped into a
//! reader that stops early (`conformance reference | head`).

/// Gives SIGPIPE back its default action, as `cat` and `grep` have it. Rust's runtime ignores
/// the signal, so a `println!` into a pipe whose reader has gone panics ("failed printing to
/// stdout: Broken pipe"); with the default action the tool ends quietly instead. Called first
/// thing in `main`.
pub fn end_quietly_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: `signal` only sets the process's disposition for SIGPIPE to the default action;
    // no handler is installed, so no Rust code runs from a signal, and it is called at the
    // start of `main`, before the tool starts any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// What every tool does first: SIGPIPE back to its default action, and `-h` / `--help`
/// answered with `help` on stdout. The arguments after the program's name, or the exit code
/// (success) when the help was printed.
pub fn start(help: &str) -> Result<Vec<String>, std::process::ExitCode> {
    end_quietly_on_closed_pipe();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if wants_help(&args) {
        println!("{help}");
        return Err(std::process::ExitCode::SUCCESS);
    }
    Ok(args)
}

/// A bad command line: `tool: message` and the usage line (the first of `usage`) on stderr,
/// and the exit code for it (2).
pub fn bad_usage(tool: &str, message: &str, usage: &str) -> std::process::ExitCode {
    eprintln!("{tool}: {message}\n{}", usage.lines().next().unwrap_or_default());
    std::process::ExitCode::from(2)
}

/// Whether the arguments ask for the usage text: `-h` or `--help` anywhere.
pub fn wants_help(args: &[String]) -> bool {
    args.iter().any(|a| a == "-h" || a == "--help")
}

/// The value after `flag`, or an error naming the flag when the arguments end there or the
/// next argument is another flag (`--json --svg out.svg` is a missing value, not a file named
/// `--svg`).
pub fn value_of(flag: &str, args: &mut impl Iterator<Item = String>) -> Result<String, String> {
    match args.next() {
        Some(v) if !v.starts_with("--") => Ok(v),
        _ => Err(format!("{flag} needs a value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_is_found_anywhere() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(wants_help(&args(&["reference", "--help"])));
        assert!(wants_help(&args(&["-h"])));
        assert!(!wants_help(&args(&["reference", "--full", "--helpful"])));
    }

    #[test]
    fn a_flag_without_its_value_is_named() {
        let mut it = vec!["out.json".to_string()].into_iter();
        assert_eq!(value_of("--json", &mut it), Ok("out.json".into()));
        assert_eq!(value_of("--json", &mut it), Err("--json needs a value".into()));
        let mut it = vec!["--svg".to_string()].into_iter();
        assert_eq!(value_of("--json", &mut it), Err("--json needs a value".into()));
        // A negative number is a value, not a flag.
        let mut it = vec!["-1".to_string()].into_iter();
        assert_eq!(value_of("--seed", &mut it), Ok("-1".into()));
    }
}
