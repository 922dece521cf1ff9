//! The `explain` and `what-if` commands (docs/replay.md §3.1), and what
//! every command shares: the replay flags, opening the stream and the exit
//! statuses around the library's calls. Part of the binary only (clap is
//! not the library's).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::ValueEnum;
use fake_watcher::{
    explain_stream, load_apply_file, load_config, parse_delete, render_explanation, render_what_if,
    what_if, OutputFormat, ReplayError, ReplayOptions,
};

/// Exit status for bad input or bad usage (clap uses it for usage errors).
pub(crate) const BAD_INPUT: u8 = 2;
/// Exit status when the replay itself failed (not the input's fault).
pub(crate) const FAILED: u8 = 1;
/// `what-if --fail-on-change`: a Service lost or changed an address.
const CHANGED: u8 = 3;

/// The replay options of every command.
#[derive(clap::Args)]
pub(crate) struct ReplayInputs {
    /// Load pools first: a MetalLB legacy configuration file, or pool
    /// objects (IPAddressPool, CiliumLoadBalancerIPPool).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Handle only Services of this spec.loadBalancerClass (empty: only
    /// Services without one, as without the flag).
    #[arg(long, value_name = "NAME")]
    lb_class: Option<String>,
}

impl ReplayInputs {
    /// The replay options, or the exit status of a bad `--config`.
    pub(crate) fn options(&self) -> Result<ReplayOptions, ExitCode> {
        let mut options = ReplayOptions {
            lb_class: self.lb_class.clone().filter(|class| !class.is_empty()),
            ..ReplayOptions::default()
        };
        if let Some(path) = &self.config {
            options.pools = load_config(path).map_err(|error| {
                eprintln!("{error}");
                ExitCode::from(BAD_INPUT)
            })?;
        }
        Ok(options)
    }
}

/// The flags `explain` and `what-if` take.
#[derive(clap::Args)]
pub(crate) struct ReplayFlags {
    /// How to print the result.
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(flatten)]
    inputs: ReplayInputs,
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

/// A stream to replay: its name for messages, its size when it is a file,
/// and a reader.
pub(crate) type Stream = (String, Option<u64>, Box<dyn BufRead + Send>);

/// Opens `path` (`-`: standard input); the error is the exit code, after
/// the message is printed.
pub(crate) fn open_stream(path: &std::path::Path) -> Result<Stream, ExitCode> {
    if path.as_os_str() == "-" {
        return Ok((
            "<stdin>".to_owned(),
            None,
            Box::new(BufReader::with_capacity(1 << 16, io::stdin())),
        ));
    }
    let name = path.display().to_string();
    match File::open(path) {
        Ok(file) => {
            // The size of a file, not of a pipe or a device.
            let size = file
                .metadata()
                .ok()
                .filter(std::fs::Metadata::is_file)
                .map(|metadata| metadata.len());
            Ok((
                name,
                size,
                Box::new(BufReader::with_capacity(1 << 16, file)),
            ))
        }
        Err(error) => {
            eprintln!("{name}: cannot open: {error}");
            Err(ExitCode::from(BAD_INPUT))
        }
    }
}

/// Prints `error`; its exit status.
pub(crate) fn replay_failed(error: &ReplayError) -> ExitCode {
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
    let options = args.flags.inputs.options()?;
    let key = if args.service.contains('/') {
        args.service.clone()
    } else {
        format!("default/{}", args.service)
    };
    let (name, _, reader) = open_stream(&args.stream)?;
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
    let options = args.flags.inputs.options()?;
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
    let (name, _, reader) = open_stream(&args.stream)?;
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
