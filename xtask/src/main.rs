//! Developer tasks, run as `cargo xtask TASK` (alias in `.cargo/config.toml`).
//! `cargo xtask --help` lists them and `cargo xtask TASK --help` explains
//! one. Every task runs cargo: xtask links none of the workspace's crates,
//! so it builds in seconds.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};

const USAGE: &str = "usage: cargo xtask <TASK> [ARGS]

tasks:
  replay [FILTER] [--accept]       replay the snapshot corpus, print a pass/fail table
  bench [--host] [--quick] [--json PATH]
                                   run the benchmarks in release
  crd                              regenerate deploy/crd/crd.yaml from the Rust types
  ci                               what CI runs (.ci/run)

`cargo xtask <TASK> --help` explains one task.";

const REPLAY_HELP: &str = "usage: cargo xtask replay [FILTER] [--accept]

Replays every stream of fake-watcher/tests/streams (or those whose name
contains FILTER) through the snapshot test (`cargo test -p fake-watcher
--test integration corpus`) and prints a table of streams with their result;
the last line is \"N passed, N failed\". insta prints the diff of each failure
above the table. A stream also fails if an invariant breaks or two replays
differ.

options:
  FILTER     only the streams whose name contains FILTER
  --accept   write the new snapshots of the streams run (review the diff
             first, or use `cargo insta review`)
  -h, --help print this help";

const BENCH_HELP: &str = "usage: cargo xtask bench [--host] [--quick] [--json PATH]

Runs the benchmarks in release: by default the scaling benchmarks of the
replay pipeline (`cargo bench -p fake-watcher --bench scaling`), including
the growth table; with --host the benchmarks of the cluster host
(`cargo bench -p kube-watcher --bench host`).

options:
  --host       the host's benchmarks instead of the replay's
  --quick      smaller sizes, for CI (a few minutes)
  --json PATH  also write every figure to PATH as one JSON object
  -h, --help   print this help";

const CRD_HELP: &str = "usage: cargo xtask crd

Regenerates deploy/crd/crd.yaml (the IPAddressPool CRD) from the Rust types,
through `cargo run -p kube-watcher -- crd --output deploy/crd/crd.yaml`.

options:
  -h, --help   print this help";

const CI_HELP: &str = "usage: cargo xtask ci

Runs what CI runs (.ci/run): the format check, clippy with warnings denied,
the workspace's tests (the snapshot corpus among them, snapshots never
written) and the quick benchmarks (the replay's, then the host's).

options:
  -h, --help   print this help";

/// A command line that is wrong: usage printed, exit status 2.
#[derive(Debug)]
struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(message: String, help: &str) -> anyhow::Error {
    UsageError(format!("{message}\n\n{help}")).into()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let help = match task.as_str() {
        "replay" => REPLAY_HELP,
        "bench" => BENCH_HELP,
        "crd" => CRD_HELP,
        "ci" => CI_HELP,
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => {
            eprintln!("xtask: unknown task `{other}`\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if rest.iter().any(|arg| arg == "-h" || arg == "--help") {
        println!("{help}");
        return ExitCode::SUCCESS;
    }
    let result = match task.as_str() {
        "replay" => replay(rest),
        "bench" => bench(rest),
        "crd" => no_arguments(rest, CRD_HELP).and_then(|()| crd()),
        _ => no_arguments(rest, CI_HELP).and_then(|()| ci()),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) if error.is::<UsageError>() => {
            eprintln!("xtask {task}: {error}");
            ExitCode::from(2)
        }
        Err(error) => {
            eprintln!("xtask {task}: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn no_arguments(args: &[String], help: &str) -> Result<()> {
    match args.first() {
        Some(arg) => Err(usage(format!("unexpected argument `{arg}`"), help)),
        None => Ok(()),
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

fn replay(args: &[String]) -> Result<bool> {
    let mut filter = None;
    let mut accept = false;
    for arg in args {
        match arg.as_str() {
            "--accept" => accept = true,
            flag if flag.starts_with('-') => {
                return Err(usage(format!("unknown option `{flag}`"), REPLAY_HELP))
            }
            name if filter.is_none() => filter = Some(name.to_owned()),
            extra => return Err(usage(format!("unexpected argument `{extra}`"), REPLAY_HELP)),
        }
    }
    // The test writes one line per stream here; the table is made from it.
    let report = std::env::temp_dir().join(format!("xtask-corpus-{}.tsv", std::process::id()));
    let mut command = cargo();
    command
        .args([
            "test",
            "-p",
            "fake-watcher",
            "--test",
            "integration",
            "corpus::corpus",
            "--",
            "--exact",
        ])
        .env("CORPUS_REPORT", &report);
    if let Some(filter) = &filter {
        // insta's own filter, on paths relative to fake-watcher/tests.
        command.env("INSTA_GLOB_FILTER", format!("streams/*{filter}*.jsonl"));
    }
    if accept {
        // insta writes the snapshots itself, so the files stay in its format.
        command
            .env("INSTA_UPDATE", "always")
            .env("INSTA_FORCE_PASS", "1");
    }
    let passed = run(command)?;
    let text = std::fs::read_to_string(&report);
    let _ = std::fs::remove_file(&report);
    let text = text.with_context(|| {
        format!(
            "the corpus test wrote no report to {} (did it build?)",
            report.display()
        )
    })?;
    let rows: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .collect();
    if rows.is_empty() {
        bail!(
            "no stream matches {:?}",
            filter.as_deref().unwrap_or_default()
        );
    }
    let failed = print_corpus_table(&rows, accept);
    Ok(passed && failed == 0)
}

/// Prints one row per stream with its verdict; returns how many failed.
fn print_corpus_table(rows: &[(&str, &str)], accept: bool) -> usize {
    let width = rows
        .iter()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(0)
        .max("STREAM".len());
    println!("\n{:<width$}  RESULT", "STREAM");
    let mut failed = 0;
    for (name, verdict) in rows {
        // Accepted snapshots were written: only broken replays still fail.
        let verdict = if accept && (verdict.starts_with("FAIL") || verdict.starts_with("NEW")) {
            verdict
                .replacen("FAIL", "accepted", 1)
                .replacen("NEW", "accepted (new)", 1)
        } else {
            (*verdict).to_owned()
        };
        let broken = verdict.contains(", ");
        if broken || !(verdict == "pass" || verdict.starts_with("accepted")) {
            failed += 1;
        }
        println!("{name:<width$}  {verdict}");
    }
    println!("\n{} passed, {failed} failed", rows.len() - failed);
    failed
}

/// Runs the scaling benchmarks of fake-watcher, or with `--host` those of
/// kube-watcher, in release. A bench runs in its package's directory, so
/// `--json PATH` is made absolute here first.
fn bench(args: &[String]) -> Result<bool> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let mut host = false;
    let mut forwarded = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--host" => host = true,
            "--quick" => forwarded.push(arg.clone()),
            "--json" => {
                let Some(path) = args.next() else {
                    return Err(usage("--json needs a PATH".to_owned(), BENCH_HELP));
                };
                forwarded.push(arg.clone());
                forwarded.push(cwd.join(path).display().to_string());
            }
            // Undocumented, for profiling: some scenarios only, other sizes.
            "--only" | "--sizes" => {
                forwarded.push(arg.clone());
                forwarded.extend(args.next().cloned());
            }
            other => return Err(usage(format!("unknown option `{other}`"), BENCH_HELP)),
        }
    }
    let (package, bench) = if host {
        ("kube-watcher", "host")
    } else {
        ("fake-watcher", "scaling")
    };
    let mut command = cargo();
    command
        .args(["bench", "-p", package, "--bench", bench, "--"])
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
        "deploy/crd/crd.yaml",
    ]);
    run(command)
}

/// The steps of `.ci/run`, in its order.
fn ci() -> Result<bool> {
    let steps: [&[&str]; 5] = [
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
        &["xtask", "bench", "--host", "--quick"],
    ];
    for step in steps {
        let mut command = cargo();
        // Snapshots are reviewed, never written by CI.
        command.args(step).env("INSTA_UPDATE", "no");
        if !run(command)? {
            return Ok(false);
        }
    }
    Ok(true)
}
