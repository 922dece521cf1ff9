//! The snapshot corpus: every stream in `tests/streams` replayed into its
//! step-by-step trace and result, compared with its reviewed snapshot in
//! `tests/streams/snapshots` (`cargo insta review` or
//! `cargo xtask replay --accept` after review). Each replay also checks the
//! DESIGN.md §6 invariants after every line and runs twice to prove it is
//! deterministic.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use fake_watcher::corpus::{case_name, render_case, streams};

#[test]
fn corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/streams");
    let mut streams = streams(&dir).expect("the corpus directory");
    // `cargo xtask replay FILTER --accept` narrows the run.
    match std::env::var("CORPUS_FILTER") {
        Ok(filter) => streams.retain(|path| case_name(path).contains(&filter)),
        Err(_) => assert!(
            streams.len() >= 40,
            "the corpus has {} streams, fewer than 40",
            streams.len()
        ),
    }
    let mut failed = Vec::new();
    for path in &streams {
        let name = case_name(path);
        let rendered = render_case(path);
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path("streams/snapshots");
        settings.set_prepend_module_to_snapshot(false);
        settings.set_input_file(path);
        settings.set_omit_expression(true);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            settings.bind(|| insta::assert_snapshot!(name.clone(), rendered.clone()));
        }));
        if outcome.is_err() {
            failed.push(name.clone());
        }
        assert!(
            !rendered.contains("INVARIANT BROKEN"),
            "{name}: an invariant broke:\n{rendered}"
        );
        assert!(
            !rendered.starts_with("NONDETERMINISTIC"),
            "{name}: replays differ"
        );
    }
    assert!(
        failed.is_empty(),
        "snapshots differ for: {}",
        failed.join(", ")
    );
}
