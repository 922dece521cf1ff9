//! Developer tasks, run as `cargo xtask TASK` (alias in `.cargo/config.toml`):
//!
//! - `replay [FILTER] [--accept]`: replays the snapshot corpus
//!   (`fake-watcher/tests/streams`) through the same code as the snapshot
//!   test and prints a table of streams with pass/fail and a diff for each
//!   failure. `--accept` rewrites the snapshots of the streams run, through
//!   insta itself: review the diff first (or use `cargo insta review`).
//! - `bench [--quick] [--json PATH]`: the scaling benchmarks, in release.
//! - `crd`: regenerates `deploy/crd.yaml` (the `IPAddressPool` CRD) from
//!   the Rust types, through `kube-watcher crd` (so xtask itself does not
//!   depend on kube).
//! - `ci`: what `.ci/run` runs.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use fake_watcher::corpus::{case_name, render_case, streams, SNAPSHOTS_DIR, STREAMS_DIR};

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  replay [FILTER] [--accept]   replay the snapshot corpus (streams whose name contains
                               FILTER); --accept rewrites their snapshots after review
                               (or use `cargo insta review`)
  bench [--quick] [--json PATH]
                               run the scaling benchmarks in release
  crd                          regenerate deploy/crd.yaml from the Rust types
  ci                           fmt check, clippy, tests, corpus and quick bench, as CI";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("replay") => replay(args.get(1..).unwrap_or_default()),
        Some("bench") => bench(args.get(1..).unwrap_or_default()),
        Some("crd") => crd(),
        Some("ci") => ci(),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(true)
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: xtask lives one level below it.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn cargo() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    command.current_dir(root());
    command
}

fn run(mut command: Command) -> Result<bool> {
    eprintln!("$ {command:?}");
    Ok(command
        .status()
        .with_context(|| format!("running {command:?}"))?
        .success())
}

/// The body of an insta snapshot file (after its `---` header).
fn snapshot_body(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("---\n") else {
        return text;
    };
    match rest.find("\n---\n") {
        Some(end) => rest.get(end + 5..).unwrap_or_default(),
        None => text,
    }
}

fn replay(args: &[String]) -> Result<bool> {
    let mut filter = None;
    let mut accept = false;
    for arg in args {
        match arg.as_str() {
            "--accept" => accept = true,
            flag if flag.starts_with('-') => bail!("unknown flag {flag}\n{USAGE}"),
            name if filter.is_none() => filter = Some(name.to_owned()),
            extra => bail!("unexpected argument {extra}\n{USAGE}"),
        }
    }
    if accept {
        // insta writes the snapshots itself, so the files stay in its format.
        let mut command = cargo();
        command
            .args([
                "test",
                "-p",
                "fake-watcher",
                "--test",
                "integration",
                "corpus",
            ])
            .env("INSTA_UPDATE", "always")
            .env("INSTA_FORCE_PASS", "1");
        if let Some(filter) = &filter {
            command.env("CORPUS_FILTER", filter);
        }
        if !run(command)? {
            bail!("cargo test failed while accepting snapshots");
        }
    }
    let root = root();
    let streams = streams(&root.join(STREAMS_DIR)).context("reading the corpus")?;
    let selected: Vec<PathBuf> = streams
        .into_iter()
        .filter(|path| {
            filter
                .as_deref()
                .is_none_or(|f| case_name(path).contains(f))
        })
        .collect();
    if selected.is_empty() {
        bail!("no stream matches {:?}", filter.unwrap_or_default());
    }
    let width = selected
        .iter()
        .map(|p| case_name(p).len())
        .max()
        .unwrap_or(6)
        .max(6);
    let mut failures = Vec::new();
    println!("{:<width$}  RESULT", "STREAM");
    for path in &selected {
        let name = case_name(path);
        let rendered = render_case(path);
        let snapshot_path = root.join(SNAPSHOTS_DIR).join(format!("{name}.snap"));
        let verdict = match std::fs::read_to_string(&snapshot_path) {
            Err(_) => "NEW (no snapshot)".to_owned(),
            Ok(text) if snapshot_body(&text).trim_end() == rendered.trim_end() => "pass".to_owned(),
            Ok(text) => {
                failures.push((
                    name.clone(),
                    snapshot_body(&text).to_owned(),
                    rendered.clone(),
                ));
                "FAIL".to_owned()
            }
        };
        let verdict = if rendered.contains("INVARIANT BROKEN") {
            failures.push((name.clone(), String::new(), rendered.clone()));
            format!("{verdict}, INVARIANT BROKEN")
        } else {
            verdict
        };
        println!("{name:<width$}  {verdict}");
    }
    for (name, expected, actual) in &failures {
        println!("\n=== {name}: snapshot (-) vs replay (+)");
        let diff = similar::TextDiff::from_lines(expected.trim_end(), actual.trim_end());
        print!("{}", diff.unified_diff().context_radius(3));
    }
    println!(
        "\n{} passed, {} failed",
        selected.len() - failures.len().min(selected.len()),
        failures.len()
    );
    Ok(failures.is_empty())
}

/// Runs `fake-watcher/benches/scaling.rs` in release. The bench runs in the
/// package's directory, so `--json PATH` is made absolute here first.
fn bench(args: &[String]) -> Result<bool> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let mut forwarded = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => forwarded.push(arg.clone()),
            "--json" => {
                let Some(path) = args.next() else {
                    bail!("--json needs a path\n{USAGE}");
                };
                forwarded.push(arg.clone());
                forwarded.push(cwd.join(path).display().to_string());
            }
            // Undocumented, for profiling: one scenario only, other sizes.
            "--only" | "--sizes" => {
                forwarded.push(arg.clone());
                forwarded.extend(args.next().cloned());
            }
            other => bail!("unknown bench argument {other}\n{USAGE}"),
        }
    }
    let mut command = cargo();
    command
        .args(["bench", "-p", "fake-watcher", "--bench", "scaling", "--"])
        .args(forwarded);
    run(command)
}

fn crd() -> Result<bool> {
    let mut command = cargo();
    command.args([
        "run",
        "--quiet",
        "--package",
        "kube-watcher",
        "--",
        "crd",
        "--output",
        "deploy/crd.yaml",
    ]);
    run(command)
}

fn ci() -> Result<bool> {
    let steps: [&[&str]; 4] = [
        &["fmt", "--all", "--check"],
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &["test", "--workspace"],
        &["xtask", "bench", "--quick"],
    ];
    for step in steps {
        let mut command = cargo();
        command.args(step);
        if !run(command)? {
            return Ok(false);
        }
    }
    replay(&[])
}
