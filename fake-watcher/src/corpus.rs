//! The snapshot corpus: each stream of `fake-watcher/tests/streams` replayed
//! into a readable step-by-step trace plus its final JSON result. The
//! snapshot test and `cargo xtask replay` both render through [`render_case`],
//! so they can never disagree.
//!
//! A stream may set replay options in a comment line of its header:
//! `# options: --lb-class NAME --keep-going --config FILE` (FILE relative to
//! the stream).

use std::fmt::Write as _;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use crate::{
    load_legacy_config, render_json, replay_pipelined, HoldingRecord, ReplayOptions, ReplayOutput,
};

/// Where the corpus lives, relative to the workspace root.
pub const STREAMS_DIR: &str = "fake-watcher/tests/streams";
/// Where its snapshots live, relative to the workspace root.
pub const SNAPSHOTS_DIR: &str = "fake-watcher/tests/streams/snapshots";

/// The options a stream asks for in its header.
fn options_of(path: &Path, text: &str) -> Result<ReplayOptions, String> {
    let mut options = ReplayOptions::default().trace(true).check_invariants(true);
    for line in text
        .lines()
        .take_while(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        let Some(rest) = line
            .trim_start()
            .trim_start_matches('#')
            .trim()
            .strip_prefix("options:")
        else {
            continue;
        };
        let mut words = rest.split_whitespace();
        while let Some(word) = words.next() {
            match word {
                "--keep-going" => options = options.keep_going(true),
                "--lb-class" => {
                    let class = words.next().ok_or("--lb-class needs a NAME")?;
                    options = options.lb_class(class);
                }
                "--config" => {
                    let file = words.next().ok_or("--config needs a FILE")?;
                    let dir = path.parent().unwrap_or(Path::new("."));
                    // Errors name the file as the stream does, never by an
                    // absolute path (snapshots are the same in any checkout).
                    let pools = load_legacy_config(&dir.join(file))
                        .map_err(|e| e.to_string().replace(&format!("{}/", dir.display()), ""))?;
                    options = options.pools(pools);
                }
                other => return Err(format!("unknown option {other:?} in the stream header")),
            }
        }
    }
    Ok(options)
}

/// Every `.jsonl` stream under `dir`, sorted by name.
pub fn streams(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    found.sort();
    Ok(found)
}

/// The snapshot name of a stream: its file stem.
pub fn case_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Replays `path` and renders the trace and result (or the error that
/// stopped it). The stream is replayed twice: a difference between the two
/// runs is rendered as a failure, since replays must be deterministic.
pub fn render_case(path: &Path) -> String {
    let first = render_once(path);
    let second = render_once(path);
    if first == second {
        first
    } else {
        format!("NONDETERMINISTIC: two replays differ\n--- first ---\n{first}\n--- second ---\n{second}")
    }
}

fn render_once(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => return format!("cannot read {}: {error}\n", path.display()),
    };
    let options = match options_of(path, &text) {
        Ok(options) => options,
        Err(error) => return format!("bad options: {error}\n"),
    };
    let reader = match File::open(path) {
        Ok(file) => BufReader::new(file),
        Err(error) => return format!("cannot open {}: {error}\n", path.display()),
    };
    match replay_pipelined(&name, reader, &options, &mut ()) {
        Ok(output) => render_output(&output),
        Err(error) => format!("== replay stopped ==\n{error}\n"),
    }
}

fn holdings_line(holding: &HoldingRecord) -> String {
    let ips: Vec<String> = holding.ips.iter().map(ToString::to_string).collect();
    format!("{} {} ({})", holding.key, ips.join(","), holding.pool)
}

/// The readable trace: one block per line, then the §3 result.
pub fn render_output(output: &ReplayOutput) -> String {
    let mut out = String::new();
    let mut previous: Vec<HoldingRecord> = Vec::new();
    for step in &output.trace {
        let event = &step.event;
        let what: Vec<&str> = [
            Some(event.event_type.as_str()),
            event.kind.as_deref(),
            event.key.as_deref(),
        ]
        .into_iter()
        .flatten()
        .collect();
        let _ = writeln!(out, "line {}: {}", step.line, what.join(" "));
        for write in &step.writes {
            let _ = writeln!(
                out,
                "  write {}",
                serde_json::to_string(write).unwrap_or_default()
            );
        }
        for event in &step.events {
            let _ = writeln!(
                out,
                "  event {} {} {}: {}",
                event.key, event.event_type, event.reason, event.message
            );
        }
        for error in &step.errors {
            let _ = writeln!(out, "  handler error: {error}");
        }
        for violation in &step.violations {
            let _ = writeln!(out, "  INVARIANT BROKEN: {violation}");
        }
        if step.holdings != previous {
            if step.holdings.is_empty() {
                let _ = writeln!(out, "  holdings: none");
            } else {
                let _ = writeln!(out, "  holdings:");
                for holding in &step.holdings {
                    let _ = writeln!(out, "    {}", holdings_line(holding));
                }
            }
            previous.clone_from(&step.holdings);
        }
    }
    for skipped in &output.skipped {
        let _ = writeln!(out, "skipped: {skipped}");
    }
    for (line, problems) in &output.violations {
        for problem in problems {
            let _ = writeln!(out, "INVARIANT BROKEN after line {line}: {problem}");
        }
    }
    let _ = writeln!(out, "== result ==");
    out.push_str(&render_json(&output.result).unwrap_or_else(|e| format!("cannot render: {e}")));
    out
}
