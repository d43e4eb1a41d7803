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
