//! `fake-watcher what-if` through the binary (docs/replay.md §3.1): a pool
//! shrink that takes an address (`--fail-on-change`: exit 3), a no-op apply
//! (exit 0), and bad input (exit 2).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_fake-watcher");

fn path(relative: &str) -> String {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    path.display().to_string()
}

fn what_if(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("what-if")
        .arg(path("../examples/quickstart.jsonl"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

#[test]
fn a_shrink_that_takes_an_address_fails_on_change() {
    let shrink = path("../examples/shrink-pool.yaml");
    let output = what_if(&["--apply", &shrink, "--fail-on-change"]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    insta::assert_snapshot!(stdout(&output));
    // Without the flag the same report exits 0.
    let output = what_if(&["--apply", &shrink, "--output", "json"]);
    assert_eq!(output.status.code(), Some(0));
    insta::assert_snapshot!(stdout(&output));
}

#[test]
fn a_no_op_apply_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let same = dir.path().join("same.json");
    // The quickstart's own pool, as `kubectl get -o json` prints a List.
    std::fs::write(
        &same,
        r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"default","namespace":"metallb-system"},"spec":{"addresses":["192.168.10.0/24"],"avoidBuggyIPs":true}}]}"#,
    )
    .unwrap();
    let output = what_if(&["--apply", same.to_str().unwrap(), "--fail-on-change"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "");
    assert_eq!(stderr(&output), "No Service changes.\n");
}

#[test]
fn bad_input_exits_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: apps/v1\nkind: Deployment\n").unwrap();
    let output = what_if(&["--apply", bad.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("bad.yaml: document 1: cannot apply kind \"Deployment\""),
        "{}",
        stderr(&output)
    );
    let output = what_if(&["--delete", "deployment/x"]);
    assert_eq!(output.status.code(), Some(2));
    let output = what_if(&["--apply", "/nonexistent/file.yaml"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).starts_with("/nonexistent/file.yaml: cannot read"));
}
