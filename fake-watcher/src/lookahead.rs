//! Finding out, before the first line is replayed, whether the stream has a
//! `SYNCED` line (docs/replay.md §1.1), while reading the stream only once.
//!
//! Whether the first lines are the initial list or already events after sync
//! depends on a line that may come at the very end, and standard input cannot
//! be read twice. So the raw bytes up to and including the first `SYNCED`
//! line (all of them when there is none) are kept, in memory up to
//! [`SPOOL_MEMORY_BYTES`] and in an anonymous temporary file beyond, and then
//! read again ahead of the rest of the stream. A stream with an early
//! `SYNCED` line (every recording, docs/replay.md §4) keeps only its initial
//! list; one without keeps everything, on disk when it is large. Only lines
//! that mention `SYNCED` are parsed here; every line is decoded, and every
//! error reported, once, when it is replayed.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Cursor, Seek, SeekFrom, Write};
use std::path::Path;

use crate::stream::{is_synced_line, read_raw_line, RawLine};

/// How many bytes of the looked-ahead lines stay in memory. Small: the
/// copy stays until it is read again, and a file costs only the page cache
/// (a 50 MB line spilled instead of kept: 136 MB peak RSS, not 173 MB).
pub const SPOOL_MEMORY_BYTES: usize = 8 << 20;

/// What went wrong looking ahead.
#[derive(Debug)]
pub(crate) enum LookaheadError {
    /// Reading the stream failed at this 1-based line.
    Read { line: u64, error: io::Error },
    /// The temporary file failed.
    Spool(io::Error),
}

/// The bytes read ahead, to be read again.
pub(crate) struct Lookahead {
    /// The bytes, from the start of the stream.
    pub(crate) reader: Box<dyn BufRead + Send>,
    /// Whether they end with a SYNCED line (else they are the whole stream,
    /// or end before a line that is too long).
    pub(crate) synced: bool,
    /// The number of a line that passed the limit: the bytes end before it,
    /// and reading stopped in its middle (the replay stops there).
    pub(crate) too_long: Option<u64>,
}

/// Reads `reader` up to and including its first SYNCED line, or to its end,
/// or to the first line longer than `max_line_bytes`.
pub(crate) fn read_to_synced<R: BufRead + ?Sized>(
    reader: &mut R,
    max_line_bytes: usize,
    memory_bytes: usize,
    dir: Option<&Path>,
) -> Result<Lookahead, LookaheadError> {
    let mut spool = Spool {
        memory: Vec::new(),
        file: None,
        memory_bytes,
        dir,
    };
    let mut buf = Vec::new();
    let mut line: u64 = 0;
    let mut too_long = None;
    let synced = loop {
        let read = read_raw_line(reader, &mut buf, max_line_bytes);
        line = line.saturating_add(1);
        match read {
            Ok(RawLine::Eof) => break false,
            Ok(RawLine::TooLong) => {
                // Kept out of the spool: it would only be read again to be
                // found too long again.
                too_long = Some(line);
                break false;
            }
            Ok(RawLine::Line) => {
                spool.append(&buf).map_err(LookaheadError::Spool)?;
                if is_synced_line(&buf, line == 1) {
                    break true;
                }
            }
            Err(error) => return Err(LookaheadError::Read { line, error }),
        }
    };
    let reader = spool.into_reader().map_err(LookaheadError::Spool)?;
    Ok(Lookahead {
        reader,
        synced,
        too_long,
    })
}

/// Bytes kept in memory up to a limit, then in a temporary file.
struct Spool<'a> {
    memory: Vec<u8>,
    file: Option<BufWriter<File>>,
    memory_bytes: usize,
    /// Where the file is made (`None`: the system's temporary directory).
    dir: Option<&'a Path>,
}

impl Spool<'_> {
    fn append(&mut self, data: &[u8]) -> io::Result<()> {
        if let Some(file) = &mut self.file {
            return file.write_all(data);
        }
        if self.memory.len().saturating_add(data.len()) <= self.memory_bytes {
            self.memory.extend_from_slice(data);
            return Ok(());
        }
        let file = match self.dir {
            Some(dir) => tempfile::tempfile_in(dir)?,
            None => tempfile::tempfile()?,
        };
        let mut file = BufWriter::new(file);
        file.write_all(&self.memory)?;
        file.write_all(data)?;
        self.memory = Vec::new();
        self.file = Some(file);
        Ok(())
    }

    fn into_reader(self) -> io::Result<Box<dyn BufRead + Send>> {
        match self.file {
            None => Ok(Box::new(Cursor::new(self.memory))),
            Some(writer) => {
                let mut file = writer
                    .into_inner()
                    .map_err(io::IntoInnerError::into_error)?;
                file.seek(SeekFrom::Start(0))?;
                Ok(Box::new(BufReader::with_capacity(1 << 16, file)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn read_all(lookahead: Lookahead, rest: &[u8]) -> String {
        let mut text = String::new();
        lookahead
            .reader
            .chain(rest)
            .read_to_string(&mut text)
            .unwrap();
        text
    }

    #[test]
    fn stops_after_the_first_synced_line() {
        let text =
            b"{\"type\":\"ADDED\"}\n# SYNCED\n{\"type\":\"SYNCED\"}\n{\"type\":\"DELETED\"}\n";
        let mut reader = &text[..];
        let lookahead = read_to_synced(&mut reader, 1 << 20, 1 << 20, None).unwrap();
        assert!(lookahead.synced);
        assert_eq!(reader, b"{\"type\":\"DELETED\"}\n");
        assert_eq!(
            read_all(lookahead, reader),
            String::from_utf8(text.to_vec()).unwrap()
        );
    }

    #[test]
    fn keeps_everything_without_synced_spilling_to_a_file() {
        let line = "{\"type\":\"ADDED\",\"object\":{}}\n";
        let text = line.repeat(100);
        let mut reader = text.as_bytes();
        let lookahead = read_to_synced(&mut reader, 1 << 20, 64, None).unwrap();
        assert!(!lookahead.synced);
        assert!(reader.is_empty());
        assert_eq!(read_all(lookahead, b""), text);
    }

    #[test]
    fn a_line_over_the_limit_ends_the_lookahead_there() {
        let text = format!("# c\n{}\n{{\"type\":\"SYNCED\"}}\n", "x".repeat(1000));
        let mut reader = text.as_bytes();
        let lookahead = read_to_synced(&mut reader, 100, 100, None).unwrap();
        assert!(!lookahead.synced);
        assert_eq!(lookahead.too_long, Some(2));
        // Read one byte past the limit, which is not kept.
        assert_eq!(reader.len(), text.len() - 4 - 101);
        assert_eq!(read_all(lookahead, b""), "# c\n");
    }

    #[test]
    fn endless_input_stops_the_lookahead() {
        let mut endless = BufReader::new(io::repeat(b'x'));
        let lookahead = read_to_synced(&mut endless, 1000, 100, None).unwrap();
        assert!(!lookahead.synced);
        assert_eq!(lookahead.too_long, Some(1));
    }
}
