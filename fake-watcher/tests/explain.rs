//! `fake-watcher explain` through the binary (docs/replay.md §3.1): a
//! pending Service (a full pool, a selector that does not match, a pool
//! without autoAssign) and a Service with an address, as snapshots.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_fake-watcher");

fn path(relative: &str) -> String {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    path.display().to_string()
}

fn explain(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("explain")
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

#[test]
fn a_pending_service_says_why_for_each_pool() {
    let stream = path("tests/explain/pending.jsonl");
    let output = explain(&[&stream, "shop/second"]);
    assert_eq!(output.status.code(), Some(0));
    insta::assert_snapshot!(stdout(&output));
}

#[test]
fn a_pending_service_as_json() {
    let stream = path("tests/explain/pending.jsonl");
    let output = explain(&[&stream, "shop/second", "--output", "json"]);
    assert_eq!(output.status.code(), Some(0));
    let document: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let verdicts: Vec<(&str, &str)> = document["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["verdict"].as_str().unwrap()))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("pinned", "service-selector-mismatch"),
            ("manual", "auto-assign-off"),
            ("small", "full")
        ]
    );
    assert_eq!(document["outcome"]["assigned"], false);
    assert_eq!(document["shows"]["condition"]["reason"], "PoolExhausted");
    insta::assert_snapshot!(stdout(&output));
}

#[test]
fn a_service_with_an_address_and_at_a_line() {
    let quickstart = path("../examples/quickstart.jsonl");
    let output = explain(&[&quickstart, "infra/dns-udp"]);
    assert_eq!(output.status.code(), Some(0));
    insta::assert_snapshot!(stdout(&output));
    // Just after line 10 (the pool only), shop/web does not exist yet.
    let output = explain(&[&quickstart, "shop/web", "--at", "10"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no Service shop/web"));
    let output = explain(&[&quickstart, "shop/web", "--at", "13"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(stdout(&output).contains("Outcome:          192.168.10.1 from pool default"));
}
