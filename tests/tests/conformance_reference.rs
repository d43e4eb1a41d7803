//! The conformance suite against the reference backend: every op, every float dtype,
//! fresh random inputs (seed printed; `TEFL_TEST_SEED` replays), compared with the f64 oracle.

use tefl_tests::conformance::{Size, Suite};

#[test]
fn reference_passes_the_conformance_suite() {
    let mgr = tefl_tests::manager();
    let mut suite = Suite::new(mgr, "reference.cpu", tefl_tests::seed("conformance"), Size::Quick).unwrap();
    suite.run_all(&mut |family| println!("running {family}"));
    let report = suite.report();
    println!("{report}");
    let (passed, failed, skipped) = suite.counts();
    assert_eq!(failed, 0, "{report}");
    assert_eq!(skipped, 0, "the reference registers every op and dtype:\n{report}");
    assert!(passed > 600);
}

#[test]
fn only_ops_runs_the_named_ops_cases_and_skips_the_rest() {
    use tefl_tests::conformance::Status;
    let mgr = tefl_tests::manager();
    let mut suite = Suite::new(mgr, "reference.cpu", tefl_tests::seed("conformance"), Size::Quick).unwrap();
    let err = Suite::select_ops(&["rmsnorm_fwd".into(), "no_such_op".into()]).unwrap_err();
    assert!(err.contains("no_such_op"), "{err}");
    suite.only_ops(Suite::select_ops(&["rmsnorm_fwd".into(), "layernorm_bwd".into()]).unwrap());
    suite.run_families(Some(&["norms".into()]), &mut |_| {});
    let (passed, failed, skipped) = suite.counts();
    assert_eq!(failed, 0, "{}", suite.report());
    assert!(passed > 0 && skipped > 0, "{}", suite.report());
    for o in &suite.outcomes {
        let selected = o.op == "rmsnorm_fwd" || o.op == "layernorm_bwd";
        match &o.status {
            Status::Skip(why) => assert!(selected || why.contains("--ops"), "{} skipped: {why}", o.op),
            _ => assert!(selected, "{} ran though not selected", o.op),
        }
    }
    assert!(suite.outcomes.iter().any(|o| o.op == "layernorm_bwd" && o.status == Status::Pass));
}
