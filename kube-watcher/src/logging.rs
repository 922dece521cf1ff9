//! The log subscriber of the binary, built here so tests capture exactly
//! what an operator sees.
//!
//! Colour (ANSI escapes) only when stderr is a terminal: `kubectl logs` and
//! log collectors get plain text. `--log-format json` writes one JSON
//! object per line (`timestamp`, `level`, `target`, `message` and the
//! event's fields at the top level), what log collectors parse.

use tracing::Subscriber;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// The level when `RUST_LOG` is not set.
pub const DEFAULT_FILTER: &str = "info";

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `RUST_LOG` if set and valid, else [`DEFAULT_FILTER`].
pub fn env_filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER))
}

/// A subscriber writing `format` lines through `writer`, with ANSI colour
/// only when `ansi` (never in JSON).
pub fn subscriber<W>(
    format: LogFormat,
    ansi: bool,
    filter: EnvFilter,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => Box::new(builder.finish()),
        LogFormat::Json => Box::new(
            builder
                .with_ansi(false)
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .finish(),
        ),
    }
}
