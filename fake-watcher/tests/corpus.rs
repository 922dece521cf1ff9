//! The snapshot corpus: every stream in `tests/streams` replayed into its
//! step-by-step trace and result, compared with its reviewed snapshot in
//! `tests/streams/snapshots` (one per stream, named after it, with the
//! stream's comment header as its description, compared too). Review
//! changes with `cargo insta review` or `cargo xtask replay --accept`
//! (`cargo insta test --unreferenced=reject` also works). Each replay also
//! checks the invariants of docs/allocation.md after every line and runs
//! twice to prove it is deterministic.
//!
//! A stream may set replay options in a comment line of its header:
//! `# options: --lb-class NAME --keep-going --config FILE` (FILE relative to
//! the stream).
//!
//! Environment (set by `cargo xtask replay`): `INSTA_GLOB_FILTER` narrows
//! the run (insta's own filter); `CORPUS_REPORT=PATH` writes one line per
//! stream, `NAME<TAB>VERDICT` (`pass`, `FAIL`, `NEW`, plus
//! `, INVARIANT BROKEN` or `, NONDETERMINISTIC`), for the table xtask prints.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufReader, Write as _};
use std::path::Path;
use std::sync::{Arc, Mutex};

use fake_watcher::{
    load_config, render_json, replay_pipelined, HoldingRecord, ReplayOptions, ReplayOutput,
};

/// Where the streams and their snapshots live, relative to this file.
const STREAMS: &str = "streams";
const SNAPSHOTS: &str = "streams/snapshots";

#[test]
fn corpus() {
    // Written as it goes: glob! panics at its end if a snapshot differs.
    let mut report = std::env::var_os("CORPUS_REPORT").map(|path| File::create(path).unwrap());
    let mut streams = 0;
    let mut broken = Vec::new();
    insta::glob!("streams/*.jsonl", |path| {
        let name = case_name(path);
        let text = std::fs::read_to_string(path).unwrap();
        let rendered = render_case(path);
        let verdict = Verdict::default();
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(SNAPSHOTS);
        settings.set_prepend_module_to_snapshot(false);
        // The snapshot is named after the stream alone (glob! would add
        // `@FILE`), so the names stay what they were before glob!.
        settings.remove_snapshot_suffix();
        settings.set_omit_expression(true);
        settings.set_description(header(&text));
        settings.set_comparator(Box::new(verdict.clone()));
        settings.bind(|| insta::assert_snapshot!(name.clone(), rendered));
        let mut line = verdict.text();
        if rendered.contains("INVARIANT BROKEN") {
            line.push_str(", INVARIANT BROKEN");
            broken.push(format!("{name}: an invariant broke"));
        }
        if rendered.starts_with("NONDETERMINISTIC") {
            line.push_str(", NONDETERMINISTIC");
            broken.push(format!("{name}: two replays differ"));
        }
        if let Some(report) = &mut report {
            writeln!(report, "{name}\t{line}").unwrap();
        }
        streams += 1;
    });
    // Outside the glob!: these fail even when snapshots are accepted.
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    if std::env::var_os("INSTA_GLOB_FILTER").is_none() {
        assert!(
            streams >= 40,
            "the corpus has {streams} streams, fewer than 40"
        );
    }
}

/// Every snapshot belongs to a stream: a renamed or deleted stream must take
/// its snapshot along (what `cargo insta test --unreferenced=reject` checks,
/// without installing cargo-insta).
#[test]
fn corpus_has_no_unreferenced_snapshots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let unreferenced: Vec<String> = std::fs::read_dir(dir.join(SNAPSHOTS))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "snap"))
        .filter(|snap| {
            !dir.join(STREAMS)
                .join(format!("{}.jsonl", case_name(snap)))
                .is_file()
        })
        .map(|snap| case_name(&snap))
        .collect();
    assert!(
        unreferenced.is_empty(),
        "snapshots without a stream: {}",
        unreferenced.join(", ")
    );
}

/// Records what insta's own comparison found, for the report: `None` until
/// a stored snapshot was compared (there is none: a new stream).
#[derive(Clone, Default)]
struct Verdict(Arc<Mutex<Option<bool>>>);

impl Verdict {
    fn text(&self) -> String {
        match *self.0.lock().unwrap() {
            None => "NEW".to_owned(),
            Some(true) => "pass".to_owned(),
            Some(false) => "FAIL".to_owned(),
        }
    }
}

impl insta::Comparator for Verdict {
    /// The description too: a changed stream header must be reviewed into
    /// its snapshot like a changed trace.
    fn matches(&self, reference: &insta::Snapshot, test: &insta::Snapshot) -> bool {
        let matches = insta::DefaultComparator.matches(reference, test)
            && reference.metadata().description() == test.metadata().description();
        let mut verdict = self.0.lock().unwrap();
        *verdict = Some(verdict.unwrap_or(true) && matches);
        matches
    }

    fn matches_fully(&self, reference: &insta::Snapshot, test: &insta::Snapshot) -> bool {
        insta::DefaultComparator.matches_fully(reference, test)
    }

    fn dyn_clone(&self) -> Box<dyn insta::Comparator> {
        Box::new(self.clone())
    }
}

/// The snapshot name of a stream: its file stem.
fn case_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The comment lines that open a stream, without their `#`: what the stream
/// shows and expects.
fn header(text: &str) -> String {
    text.lines()
        .map_while(|line| line.trim_start().strip_prefix('#'))
        .map(|line| line.strip_prefix(' ').unwrap_or(line).trim_end())
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_owned()
}

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
                    let pools = load_config(&dir.join(file))
                        .map_err(|e| e.to_string().replace(&format!("{}/", dir.display()), ""))?;
                    options = options.pools(pools);
                }
                other => return Err(format!("unknown option {other:?} in the stream header")),
            }
        }
    }
    Ok(options)
}

/// Replays `path` and renders the trace and result (or the error that
/// stopped it). The stream is replayed twice: a difference between the two
/// runs is rendered as a failure, since replays must be deterministic.
fn render_case(path: &Path) -> String {
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

/// The readable trace: one block per line, then the result.
fn render_output(output: &ReplayOutput) -> String {
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
