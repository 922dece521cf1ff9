//! The memory a replay takes for one long line, by counting allocated bytes
//! (docs/replay.md §1.3): at most 4 times the line, whatever the line holds
//! that the replay does not read (a `BOOKMARK`'s object, `managedFields`,
//! annotations nobody reads).
//!
//! A global allocator counts every thread of its process, so this test has
//! a binary of its own, and each case runs in a child process of it: the
//! child caps its allocations at the budget (an allocation past it aborts
//! the child), the parent checks how the child ended. A budget too small
//! must make the child fail, so the measure is shown to bite.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, ExitCode};

use fake_watcher::{replay_blocking, ReplayOptions};

#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

/// The environment variable that makes the process run one case.
const CASE: &str = "FAKE_WATCHER_MEMORY_CASE";

/// About the length of the long line of each case.
const LINE_BYTES: usize = 8 << 20;

/// The stream of a case: a pool, a Service, the long line, a Service.
fn stream(case: &str) -> Vec<u8> {
    let pool = r#"{"type":"ADDED","object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p"},"spec":{"addresses":["10.0.0.0/24"]}}}"#;
    let service = |name: &str| {
        format!(
            r#"{{"type":"ADDED","object":{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}"}},"spec":{{"type":"LoadBalancer","ports":[{{"port":80}}]}}}}}}"#
        )
    };
    let count = LINE_BYTES / 2;
    let mut text = Vec::with_capacity(LINE_BYTES + 1024);
    text.extend_from_slice(pool.as_bytes());
    text.push(b'\n');
    text.extend_from_slice(service("first").as_bytes());
    text.push(b'\n');
    match case {
        "bookmark" => {
            text.extend_from_slice(br#"{"type":"BOOKMARK","object":["#);
            for _ in 1..count {
                text.extend_from_slice(b"0,");
            }
            text.extend_from_slice(b"0]}\n");
        }
        "managed-fields" => {
            text.extend_from_slice(
                br#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"big","managedFields":["#,
            );
            for _ in 1..count / 8 {
                text.extend_from_slice(br#"{"a":{}},"#);
            }
            text.extend_from_slice(br#"{}],"annotations":{"example.com/blob":""#);
            text.extend(std::iter::repeat_n(b'x', LINE_BYTES / 2));
            text.extend_from_slice(br#""}},"spec":{"type":"LoadBalancer"}}}"#);
            text.push(b'\n');
        }
        other => panic!("unknown case {other}"),
    }
    text.extend_from_slice(service("last").as_bytes());
    text.push(b'\n');
    text
}

/// Runs one case with allocations capped at `budget` times its long line.
fn child(case: &str, budget: usize) {
    let text = stream(case);
    let line = text
        .split(|&byte| byte == b'\n')
        .map(<[u8]>::len)
        .max()
        .unwrap_or_default();
    let base = ALLOCATOR.allocated();
    ALLOCATOR
        .set_limit(base + budget * line)
        .expect("a limit above what is allocated");
    let output = replay_blocking(
        "memory.jsonl",
        text.as_slice(),
        &ReplayOptions::default(),
        &mut (),
    )
    .expect("the stream replays");
    assert_eq!(
        output.result.services.len(),
        2 + usize::from(case != "bookmark")
    );
}

/// Whether `case` replays within `budget` times its line, in a child.
fn fits(case: &str, budget: usize) -> bool {
    let status = Command::new(std::env::current_exe().expect("the test binary"))
        .env(CASE, format!("{case}:{budget}"))
        .stderr(std::process::Stdio::null())
        .status()
        .expect("the child runs");
    status.success()
}

fn main() -> ExitCode {
    if let Ok(case) = std::env::var(CASE) {
        let (case, budget) = case.split_once(':').expect("CASE:BUDGET");
        child(case, budget.parse().expect("a budget"));
        return ExitCode::SUCCESS;
    }
    let mut failed = Vec::new();
    for case in ["bookmark", "managed-fields"] {
        let within = fits(case, 4);
        let below = fits(case, 1);
        println!("{case}: fits in 4x its line: {within}; in 1x (must not): {below}");
        if !within || below {
            failed.push(case);
        }
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("memory per line: failed for {failed:?}");
        ExitCode::FAILURE
    }
}
