//! `fake-watcher replay STREAM`: replays a recorded watch stream through the
//! allocator plugin and prints what it would do (REPLAY.md §2).

use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use fake_watcher::{
    load_legacy_config, render, replay_pipelined, Observer, OutputFormat, ReplayError,
    ReplayOptions, StreamError,
};
use tracing_subscriber::EnvFilter;

/// mimalloc, not the system allocator: a replay decodes on one thread and
/// frees on another, which glibc's malloc makes slow (`cargo xtask bench`:
/// the replay runs about a quarter faster).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit status for bad input or bad usage (clap uses it for usage errors).
const BAD_INPUT: u8 = 2;
/// Exit status when the replay itself failed (not the input's fault).
const FAILED: u8 = 1;
/// Lines between two progress updates.
const PROGRESS_EVERY: u64 = 10_000;

#[derive(Parser)]
#[command(name = "fake-watcher", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a JSON Lines stream of watch events and print the result.
    Replay(ReplayArgs),
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// The stream (`.jsonl`); `-` reads standard input.
    stream: PathBuf,
    /// How to print the result.
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Load pools from a MetalLB legacy configuration file first.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Handle only Services of this spec.loadBalancerClass.
    #[arg(long, value_name = "NAME")]
    lb_class: Option<String>,
    /// Skip bad lines (reported on stderr; exit status 2 at the end).
    #[arg(long)]
    keep_going: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
    Yaml,
}

impl From<Output> for OutputFormat {
    fn from(output: Output) -> Self {
        match output {
            Output::Table => OutputFormat::Table,
            Output::Json => OutputFormat::Json,
            Output::Yaml => OutputFormat::Yaml,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs();
    match cli.command {
        Command::Replay(args) => run_replay(&args),
    }
}

fn init_logs() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .without_time()
        .with_ansi(io::stderr().is_terminal())
        .init();
}

/// Reports skipped lines at once, and progress when stderr is a terminal.
struct Reporter {
    progress: bool,
    shown: bool,
}

impl Reporter {
    fn clear(&mut self) {
        if self.shown {
            eprint!("\r\x1b[2K");
            self.shown = false;
        }
    }
}

impl Observer for Reporter {
    fn line(&mut self, line: u64) {
        if self.progress && line.is_multiple_of(PROGRESS_EVERY) {
            eprint!("\rreplaying: line {line}");
            let _ = io::stderr().flush();
            self.shown = true;
        }
    }

    fn skipped(&mut self, error: &StreamError) {
        self.clear();
        eprintln!("{error}");
    }
}

fn run_replay(args: &ReplayArgs) -> ExitCode {
    let mut options = ReplayOptions::default().keep_going(args.keep_going);
    options.lb_class = args.lb_class.clone();
    if let Some(path) = &args.config {
        match load_legacy_config(path) {
            Ok(pools) => options.pools = pools,
            Err(error) => {
                eprintln!("{error}");
                return ExitCode::from(BAD_INPUT);
            }
        }
    }
    let (name, reader): (String, Box<dyn BufRead + Send>) = if args.stream.as_os_str() == "-" {
        (
            "<stdin>".to_owned(),
            Box::new(BufReader::with_capacity(1 << 16, io::stdin())),
        )
    } else {
        let name = args.stream.display().to_string();
        match File::open(&args.stream) {
            Ok(file) => (name, Box::new(BufReader::with_capacity(1 << 16, file))),
            Err(error) => {
                eprintln!("{name}: cannot open: {error}");
                return ExitCode::from(BAD_INPUT);
            }
        }
    };
    let mut reporter = Reporter {
        progress: io::stderr().is_terminal(),
        shown: false,
    };
    let replayed = replay_pipelined(&name, reader, &options, &mut reporter);
    reporter.clear();
    let output = match replayed {
        Ok(output) => output,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(match error {
                ReplayError::Stream(_) | ReplayError::Store(_) => BAD_INPUT,
                _ => FAILED,
            });
        }
    };
    let format = OutputFormat::from(args.output);
    let text = match render(&output.result, format) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(FAILED);
        }
    };
    if format == OutputFormat::Table && output.result.services.is_empty() {
        eprintln!("No LoadBalancer services found.");
    }
    let mut stdout = io::stdout().lock();
    if let Err(error) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        if error.kind() != io::ErrorKind::BrokenPipe {
            eprintln!("cannot write the result: {error}");
            return ExitCode::from(FAILED);
        }
    }
    if output.skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(BAD_INPUT)
    }
}
