//! `fake-watcher replay STREAM`: replays a recorded watch stream through the
//! allocator plugin and prints what it would do (docs/replay.md §2).

mod commands;

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use commands::{open_stream, replay_failed, BAD_INPUT, FAILED};
use fake_watcher::{
    render_table_with, replay_pipelined, write_result, Observer, OutputError, OutputFormat,
    ReplayOutput, StreamError, TableNotes,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tracing_subscriber::EnvFilter;

/// mimalloc, not the system allocator: a replay decodes on one thread and
/// frees on another, which glibc's malloc makes slow (`cargo xtask bench`:
/// the replay runs about a quarter faster).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Explain the decision for one Service (docs/replay.md §3.1).
    Explain(commands::ExplainArgs),
    /// Replay, apply objects and deletions, and show what changes.
    WhatIf(commands::WhatIfArgs),
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// The stream (`.jsonl`); `-` reads standard input.
    stream: PathBuf,
    /// How to print the result.
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(flatten)]
    inputs: commands::ReplayInputs,
    /// Skip bad lines (reported on stderr; exit status 2 at the end).
    #[arg(long)]
    keep_going: bool,
    /// Show the progress line on stderr even when it is not a terminal.
    #[arg(long, conflicts_with = "quiet")]
    progress: bool,
    /// Never show the progress line.
    #[arg(long, short)]
    quiet: bool,
    /// List in the table the Services of another loadBalancerClass too,
    /// as `other class`.
    #[arg(long)]
    all: bool,
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
    without_huge_pages();
    match cli.command {
        Command::Replay(args) => run_replay(&args),
        Command::Explain(args) => commands::run_explain(&args),
        Command::WhatIf(args) => commands::run_what_if(&args),
    }
}

/// Turns transparent huge pages off for this process, as Redis does:
/// mimalloc asks for them on its arenas, and the kernel then zeroes 2 MiB
/// at a time on first touch. Without them a 100k-line replay took 7% less
/// CPU and 15% less peak memory here. Best effort: a kernel without the
/// prctl keeps its pages.
fn without_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(error) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!(%error, "transparent huge pages stay on");
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

/// Reports skipped lines at once, and progress when asked to.
struct Reporter {
    progress: Option<Progress>,
}

/// The progress line: lines done, the estimated total (from the stream's
/// size, when known), the rate and the time left.
struct Progress {
    bar: ProgressBar,
    /// The stream's size in bytes, when it is a file.
    size: Option<u64>,
    started: Instant,
    /// The line of the last update.
    shown: u64,
    /// On a pipe: plain lines instead of the bar.
    plain: bool,
    /// When the last plain line was printed.
    printed: Option<Instant>,
}

/// Seconds between two plain progress lines on a pipe.
const PLAIN_EVERY_SECONDS: u64 = 5;

/// Lines between two updates of the progress line (drawing itself is rate
/// limited by indicatif; this keeps the formatting off most lines).
const PROGRESS_EVERY: u64 = 256;

impl Progress {
    fn new(size: Option<u64>, on_terminal: bool) -> Self {
        // Forced on a pipe, the bar is not drawn: `update` prints a plain
        // line now and then instead (no cursor moves in a log).
        let target = if on_terminal {
            ProgressDrawTarget::stderr_with_hz(4)
        } else {
            ProgressDrawTarget::hidden()
        };
        let (bar, template) = match size {
            Some(size) => (
                ProgressBar::with_draw_target(Some(size), target),
                "{msg} [{bar:30}] {percent}%, {eta} left",
            ),
            None => (
                ProgressBar::with_draw_target(None, target),
                "{spinner} {msg}, {elapsed}",
            ),
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message("reading the stream");
        Self {
            bar,
            size,
            started: Instant::now(),
            shown: 0,
            plain: !on_terminal,
            printed: None,
        }
    }

    fn update(&mut self, line: u64, bytes: u64) {
        if line.saturating_sub(self.shown) < PROGRESS_EVERY {
            return;
        }
        self.shown = line;
        let seconds = self.started.elapsed().as_secs_f64();
        let rate = if seconds > 0.0 {
            format!(", {:.0} lines/s", line as f64 / seconds)
        } else {
            String::new()
        };
        let total = match self.size {
            Some(size) if bytes > 0 => {
                self.bar.set_position(bytes.min(size));
                let estimate = (line as f64 * size as f64 / bytes as f64).round();
                format!(" of ~{estimate:.0}")
            }
            _ => {
                self.bar.tick();
                String::new()
            }
        };
        let message = format!("line {line}{total}{rate}");
        if self.plain {
            let due = self
                .printed
                .is_none_or(|printed| printed.elapsed().as_secs() >= PLAIN_EVERY_SECONDS);
            if due {
                self.printed = Some(Instant::now());
                let left = match self.size {
                    Some(_) => format!(", {}s left", self.bar.eta().as_secs()),
                    None => String::new(),
                };
                eprintln!("progress: {message}{left}");
            }
        }
        self.bar.set_message(message);
    }
}

impl Reporter {
    fn finish(&mut self) {
        if let Some(progress) = self.progress.take() {
            progress.bar.finish_and_clear();
        }
    }
}

impl Observer for Reporter {
    fn position(&mut self, line: u64, bytes: u64) {
        if let Some(progress) = &mut self.progress {
            progress.update(line, bytes);
        }
    }

    fn skipped(&mut self, error: &StreamError) {
        match &self.progress {
            Some(progress) => progress.bar.suspend(|| eprintln!("{error}")),
            None => eprintln!("{error}"),
        }
    }
}

/// Writes the result in the chosen format to stdout as it is rendered (a
/// closed pipe is not an error).
fn print_result(args: &ReplayArgs, output: &ReplayOutput) -> Result<(), ExitCode> {
    let format = OutputFormat::from(args.output);
    let mut stdout = io::BufWriter::with_capacity(1 << 16, io::stdout().lock());
    let written = match format {
        OutputFormat::Table => {
            let notes = TableNotes {
                first_ips: Some(&output.first_ips),
                other_class: Some(&output.other_class),
                all: args.all,
            };
            let text = render_table_with(&output.result, notes);
            if text.is_empty() {
                eprintln!("No LoadBalancer services found.");
            }
            stdout.write_all(text.as_bytes()).map_err(OutputError::from)
        }
        _ => write_result(&output.result, format, &mut stdout),
    };
    match written.and_then(|()| stdout.flush().map_err(OutputError::from)) {
        Err(error) if !error.is_broken_pipe() => {
            eprintln!("{error}");
            Err(ExitCode::from(FAILED))
        }
        _ => Ok(()),
    }
}

fn run_replay(args: &ReplayArgs) -> ExitCode {
    let mut options = match args.inputs.options() {
        Ok(options) => options.keep_going(args.keep_going),
        Err(code) => return code,
    };
    // The process ends after the output: the OS frees the state at once.
    options.leak_state = true;
    let (name, size, reader) = match open_stream(&args.stream) {
        Ok(stream) => stream,
        Err(code) => return code,
    };
    let on_terminal = io::stderr().is_terminal();
    let show = !args.quiet && (args.progress || on_terminal);
    let mut reporter = Reporter {
        progress: show.then(|| Progress::new(size, on_terminal)),
    };
    let replayed = replay_pipelined(&name, reader, &options, &mut reporter);
    reporter.finish();
    let output = match replayed {
        Ok(output) => output,
        Err(error) => return replay_failed(&error),
    };
    let printed = print_result(args, &output);
    let code = if output.skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(BAD_INPUT)
    };
    // As the state: the OS frees the result at exit, without a walk over
    // every Service's strings.
    std::mem::forget(output);
    printed.err().unwrap_or(code)
}
