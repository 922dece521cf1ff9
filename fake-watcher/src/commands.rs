//! The `explain` and `what-if` commands (docs/replay.md §3.1): their flags,
//! and the exit statuses around the library's `explain_stream` and
//! `what_if`. Part of the binary only (clap is not the library's).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::ValueEnum;
use fake_watcher::{
    explain_stream, load_apply_file, load_config, parse_delete, render_explanation, render_what_if,
    what_if, OutputFormat, ReplayError, ReplayOptions,
};

/// Bad input or usage.
const BAD_INPUT: u8 = 2;
/// A failure that is not the input's fault.
const FAILED: u8 = 1;
/// `what-if --fail-on-change`: a Service lost or changed an address.
const CHANGED: u8 = 3;

/// The replay options both commands take.
#[derive(clap::Args)]
pub(crate) struct ReplayFlags {
    /// How to print the result.
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Load pools first: a MetalLB legacy configuration file, or pool
    /// objects (IPAddressPool, CiliumLoadBalancerIPPool).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Handle only Services of this spec.loadBalancerClass.
    #[arg(long, value_name = "NAME")]
    lb_class: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

impl From<Output> for OutputFormat {
    fn from(output: Output) -> Self {
        match output {
            Output::Table => OutputFormat::Table,
            Output::Json => OutputFormat::Json,
        }
    }
}

#[derive(clap::Args)]
pub(crate) struct ExplainArgs {
    /// The stream (`.jsonl`); `-` reads standard input.
    stream: PathBuf,
    /// The Service, NAMESPACE/NAME (a NAME alone is in `default`).
    service: String,
    /// Explain the decision just after this line instead of at the end.
    #[arg(long, value_name = "LINE")]
    at: Option<u64>,
    #[command(flatten)]
    flags: ReplayFlags,
}

#[derive(clap::Args)]
pub(crate) struct WhatIfArgs {
    /// The stream (`.jsonl`); `-` reads standard input.
    stream: PathBuf,
    /// Objects to apply after the stream (YAML or JSON; Service,
    /// IPAddressPool, CiliumLoadBalancerIPPool, Namespace; a List too), in
    /// order.
    #[arg(long, value_name = "FILE", required_unless_present = "delete")]
    apply: Vec<PathBuf>,
    /// Objects to delete after the applies: KIND/[NAMESPACE/]NAME.
    #[arg(long, value_name = "KIND/[NAMESPACE/]NAME")]
    delete: Vec<String>,
    /// Exit with status 3 when a Service loses or changes an address.
    #[arg(long)]
    fail_on_change: bool,
    #[command(flatten)]
    flags: ReplayFlags,
}

/// The replay options of `flags`, or the exit status of a bad `--config`.
fn options(flags: &ReplayFlags) -> Result<ReplayOptions, ExitCode> {
    let mut options = ReplayOptions {
        lb_class: flags.lb_class.clone(),
        ..ReplayOptions::default()
    };
    if let Some(path) = &flags.config {
        options.pools = load_config(path).map_err(|error| {
            eprintln!("{error}");
            ExitCode::from(BAD_INPUT)
        })?;
    }
    Ok(options)
}

/// The stream's name in messages and its reader.
fn open(stream: &PathBuf) -> Result<(String, Box<dyn BufRead + Send>), ExitCode> {
    if stream.as_os_str() == "-" {
        return Ok(("<stdin>".to_owned(), Box::new(BufReader::new(io::stdin()))));
    }
    let name = stream.display().to_string();
    match File::open(stream) {
        Ok(file) => Ok((name, Box::new(BufReader::with_capacity(1 << 16, file)))),
        Err(error) => {
            eprintln!("{name}: cannot open: {error}");
            Err(ExitCode::from(BAD_INPUT))
        }
    }
}

fn replay_failed(error: &ReplayError) -> ExitCode {
    eprintln!("{error}");
    ExitCode::from(match error {
        ReplayError::Stream(_) | ReplayError::Store(_) => BAD_INPUT,
        _ => FAILED,
    })
}

/// Writes `text` to stdout; a closed pipe is not a failure.
fn print(text: &str) -> Result<(), ExitCode> {
    let mut stdout = io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() != io::ErrorKind::BrokenPipe => {
            eprintln!("cannot write the result: {error}");
            Err(ExitCode::from(FAILED))
        }
        _ => Ok(()),
    }
}

pub(crate) fn run_explain(args: &ExplainArgs) -> ExitCode {
    explain(args).map_or_else(|code| code, |()| ExitCode::SUCCESS)
}

fn explain(args: &ExplainArgs) -> Result<(), ExitCode> {
    let options = options(&args.flags)?;
    let key = if args.service.contains('/') {
        args.service.clone()
    } else {
        format!("default/{}", args.service)
    };
    let (name, reader) = open(&args.stream)?;
    let document = explain_stream(&name, reader, &options, &key, args.at)
        .map_err(|error| replay_failed(&error))?;
    let Some(document) = document else {
        let when = args.at.map_or_else(
            || "at its end".to_owned(),
            |line| format!("after line {line}"),
        );
        eprintln!("{name}: no Service {key} in the stream {when}");
        return Err(ExitCode::from(BAD_INPUT));
    };
    let text = render_explanation(&document, args.flags.output.into()).map_err(|error| {
        eprintln!("{error}");
        ExitCode::from(FAILED)
    })?;
    print(&text)
}

pub(crate) fn run_what_if(args: &WhatIfArgs) -> ExitCode {
    run_what_if_inner(args).unwrap_or_else(|code| code)
}

fn run_what_if_inner(args: &WhatIfArgs) -> Result<ExitCode, ExitCode> {
    let options = options(&args.flags)?;
    let bad = |error: fake_watcher::WhatIfError| {
        eprintln!("{error}");
        ExitCode::from(BAD_INPUT)
    };
    let mut appended = Vec::new();
    for path in &args.apply {
        appended.extend(load_apply_file(path).map_err(bad)?);
    }
    for argument in &args.delete {
        appended.push(parse_delete(argument).map_err(bad)?);
    }
    let (name, reader) = open(&args.stream)?;
    let report =
        what_if(&name, reader, &options, &appended).map_err(|error| replay_failed(&error))?;
    let format = OutputFormat::from(args.flags.output);
    let text = render_what_if(&report, format).map_err(|error| {
        eprintln!("{error}");
        ExitCode::from(FAILED)
    })?;
    print(&text)?;
    if format == OutputFormat::Table {
        for pool in &report.rejected_pools {
            eprintln!("pool {} is rejected: {}", pool.name, pool.reason);
        }
        if report.changes.is_empty() {
            eprintln!("No Service changes.");
        }
    }
    if args.fail_on_change && report.moves_any() {
        let moved = report.changes.iter().filter(|c| c.moved).count();
        eprintln!("{moved} Service(s) would lose or change an address they hold.");
        return Ok(ExitCode::from(CHANGED));
    }
    Ok(ExitCode::SUCCESS)
}
