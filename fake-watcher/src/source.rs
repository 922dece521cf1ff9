//! Where a replay's lines come from: the stream read ahead to its first
//! `SYNCED` line (see the `lookahead` module), then decoded one line at a
//! time, either on the replay's own thread or on a thread of its own that
//! runs ahead of the replay.
//!
//! Decoding a line costs about as much as applying it, and the two do not
//! depend on each other (a line's meaning never depends on the replay's
//! state), so on a machine with two cores a decoding thread takes the
//! decoding off the replay's path. The replay sees the same reads in the
//! same order either way.

use std::io::{BufRead, Read as _};

use tokio::sync::mpsc;

use crate::lookahead::{read_to_synced, Lookahead, LookaheadError};
use crate::replay::ReplayError;
use crate::stream::{LineError, Record, StreamError, StreamReader};

/// One step of reading a stream.
#[derive(Debug)]
pub(crate) enum Read {
    /// First: whether the stream has a `SYNCED` line, or why looking
    /// ahead failed (nothing follows then).
    Lookahead(Result<bool, ReplayError>),
    /// An event line, or a bad one.
    Record(Result<Record, StreamError>),
    /// Last: the number of the last line read.
    End(u64),
}

/// How a stream is read: the settings of the replay that matter here.
#[derive(Clone, Debug)]
pub(crate) struct ReadOptions {
    pub(crate) file: String,
    pub(crate) max_line_bytes: usize,
    pub(crate) spool_memory_bytes: usize,
    pub(crate) spool_dir: Option<std::path::PathBuf>,
}

/// The reads of a stream, in order.
pub(crate) struct Reads<R: BufRead> {
    options: ReadOptions,
    state: State<R>,
}

enum State<R: BufRead> {
    Start(R),
    Records(StreamReader<std::io::Chain<Box<dyn BufRead + Send>, R>>),
    /// The looked-ahead lines, then the error of the line after them that
    /// is too long (the stream is not read further).
    BeforeTooLong(StreamReader<Box<dyn BufRead + Send>>, StreamError),
    Done,
}

impl<R: BufRead> Reads<R> {
    pub(crate) fn new(reader: R, options: ReadOptions) -> Self {
        Self {
            options,
            state: State::Start(reader),
        }
    }
}

impl<R: BufRead> Iterator for Reads<R> {
    type Item = Read;

    fn next(&mut self) -> Option<Read> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Start(mut reader) => {
                let options = &self.options;
                match read_to_synced(
                    &mut reader,
                    options.max_line_bytes,
                    options.spool_memory_bytes,
                    options.spool_dir.as_deref(),
                ) {
                    Ok(Lookahead {
                        reader: spooled,
                        synced,
                        too_long: Some(line),
                    }) => {
                        let stream = StreamReader::new(options.file.clone(), spooled)
                            .max_line_bytes(options.max_line_bytes);
                        let error = StreamError {
                            file: options.file.clone(),
                            line,
                            error: LineError::TooLong {
                                limit: options.max_line_bytes,
                            },
                        };
                        self.state = State::BeforeTooLong(stream, error);
                        Some(Read::Lookahead(Ok(synced)))
                    }
                    Ok(lookahead) => {
                        let stream =
                            StreamReader::new(options.file.clone(), lookahead.reader.chain(reader))
                                .max_line_bytes(options.max_line_bytes);
                        self.state = State::Records(stream);
                        Some(Read::Lookahead(Ok(lookahead.synced)))
                    }
                    Err(error) => Some(Read::Lookahead(Err(match error {
                        LookaheadError::Read { line, error } => ReplayError::Stream(StreamError {
                            file: options.file.clone(),
                            line,
                            error: LineError::Io(error),
                        }),
                        LookaheadError::Spool(error) => ReplayError::Spool(error),
                    }))),
                }
            }
            State::Records(mut stream) => match stream.next_record() {
                Some(record) => {
                    self.state = State::Records(stream);
                    Some(Read::Record(record))
                }
                None => Some(Read::End(stream.line())),
            },
            State::BeforeTooLong(mut stream, error) => match stream.next_record() {
                Some(record) => {
                    self.state = State::BeforeTooLong(stream, error);
                    Some(Read::Record(record))
                }
                None => Some(Read::Record(Err(error))),
            },
            State::Done => None,
        }
    }
}

/// Reads the replay takes at once when the thread is ahead (one wake-up of
/// each side per batch, not per line).
const BATCH: usize = 64;
/// Reads decoded ahead of the replay at most.
const AHEAD: usize = BATCH * 16;

/// The reads as the replay takes them.
pub(crate) enum Source<'a> {
    /// Read and decoded on the replay's thread.
    Here(Box<dyn Iterator<Item = Read> + 'a>),
    /// Read and decoded by a thread of its own.
    Thread {
        reads: mpsc::Receiver<Read>,
        taken: std::vec::IntoIter<Read>,
    },
}

impl Source<'_> {
    /// The reads of `reader`, made by a new thread that runs ahead of the
    /// replay. Each read is handed over as soon as it is made (a live stream
    /// is replayed line by line); the replay takes whatever is ready, up to
    /// a batch. The thread ends when the reads do or when the source is
    /// dropped (after the line it is reading, if any, is read).
    pub(crate) fn thread<R>(reader: R, options: ReadOptions) -> std::io::Result<Source<'static>>
    where
        R: BufRead + Send + 'static,
    {
        let (sender, reads) = mpsc::channel(AHEAD);
        std::thread::Builder::new()
            .name("replay-decoder".to_owned())
            .spawn(move || {
                for read in Reads::new(reader, options) {
                    if sender.blocking_send(read).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Source::Thread {
            reads,
            taken: Vec::new().into_iter(),
        })
    }

    /// The next read; `None` after the last.
    pub(crate) async fn next(&mut self) -> Option<Read> {
        match self {
            Source::Here(reads) => reads.next(),
            Source::Thread { reads, taken } => {
                if let Some(read) = taken.next() {
                    return Some(read);
                }
                let mut ready = Vec::with_capacity(BATCH);
                if reads.recv_many(&mut ready, BATCH).await == 0 {
                    return None;
                }
                *taken = ready.into_iter();
                taken.next()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> ReadOptions {
        ReadOptions {
            file: "s.jsonl".to_owned(),
            max_line_bytes: 1 << 20,
            spool_memory_bytes: 1 << 20,
            spool_dir: None,
        }
    }

    /// The reads as text, to compare.
    fn shown(read: &Read) -> String {
        match read {
            Read::Lookahead(result) => format!("lookahead {:?}", result.as_ref().ok()),
            Read::Record(Ok(record)) => format!("{} {:?}", record.line, record.event.event_type()),
            Read::Record(Err(error)) => error.to_string(),
            Read::End(line) => format!("end {line}"),
        }
    }

    fn stream(lines: usize) -> String {
        let mut text = String::new();
        for i in 0..lines {
            if i == lines / 2 {
                text.push_str("{\"type\":\"SYNCED\"}\n");
            } else if i % 7 == 3 {
                text.push_str("not json\n");
            } else {
                text.push_str(&format!(
                    "{{\"type\":\"ADDED\",\"object\":{{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{{\"name\":\"n{i}\"}}}}}}\n"
                ));
            }
        }
        text
    }

    #[tokio::test]
    async fn a_decoding_thread_reads_what_the_replay_thread_reads() {
        // More lines than a batch holds, and more than the channel holds.
        let text = stream(AHEAD * 2 + 5);
        let here: Vec<String> = Reads::new(text.as_bytes(), options())
            .map(|read| shown(&read))
            .collect();
        let mut source = Source::thread(std::io::Cursor::new(text.clone()), options()).unwrap();
        let mut threaded = Vec::new();
        while let Some(read) = source.next().await {
            threaded.push(shown(&read));
        }
        assert_eq!(threaded, here);
        assert_eq!(
            here.first().map(String::as_str),
            Some("lookahead Some(true)")
        );
        assert!(
            here.iter().any(|read| read.contains("s.jsonl:4:")),
            "{here:?}"
        );
        assert_eq!(here.last(), Some(&format!("end {}", AHEAD * 2 + 5)));
    }

    /// A pipe whose writer is still there: each chunk sent arrives, then
    /// reading blocks until the next (or until the sender is dropped: EOF).
    struct Live(std::sync::mpsc::Receiver<Vec<u8>>, std::io::Cursor<Vec<u8>>);

    impl std::io::Read for Live {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.1.position() >= self.1.get_ref().len() as u64 {
                match self.0.recv() {
                    Ok(chunk) => self.1 = std::io::Cursor::new(chunk),
                    Err(_) => return Ok(0),
                }
            }
            self.1.read(buf)
        }
    }

    #[tokio::test]
    async fn a_live_stream_is_handed_over_line_by_line() {
        let (writer, pipe) = std::sync::mpsc::channel();
        let reader = std::io::BufReader::new(Live(pipe, std::io::Cursor::new(Vec::new())));
        let mut source = Source::thread(reader, options()).unwrap();
        writer
            .send(b"{\"type\":\"SYNCED\"}\n{\"type\":\"ADDDED\"}\n".to_vec())
            .unwrap();
        // Both lines come while the writer is still there: nothing waits
        // for a batch to fill up.
        let mut seen = Vec::new();
        for _ in 0..3 {
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), source.next())
                .await
                .expect("a read made is handed over at once");
            seen.push(shown(&read.unwrap()));
        }
        assert_eq!(seen[0], "lookahead Some(true)");
        assert_eq!(seen[1], "1 Synced");
        assert!(
            seen[2].contains("s.jsonl:2: unknown event type"),
            "{seen:?}"
        );
        drop(writer);
        assert_eq!(
            source.next().await.map(|read| shown(&read)),
            Some("end 2".to_owned())
        );
        assert!(source.next().await.is_none());
    }

    /// A reader that tells when it is dropped (when the thread ends).
    struct Watched(
        std::io::Cursor<String>,
        std::sync::Arc<std::sync::atomic::AtomicBool>,
    );

    impl std::io::Read for Watched {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(buf)
        }
    }

    impl BufRead for Watched {
        fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
            self.0.fill_buf()
        }
        fn consume(&mut self, amount: usize) {
            self.0.consume(amount);
        }
    }

    impl Drop for Watched {
        fn drop(&mut self) {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn dropping_the_source_stops_the_thread() {
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = Watched(
            std::io::Cursor::new(stream(AHEAD * 4)),
            std::sync::Arc::clone(&ended),
        );
        let mut source = Source::thread(reader, options()).unwrap();
        assert!(matches!(
            source.next().await,
            Some(Read::Lookahead(Ok(true)))
        ));
        // The thread is now blocked on the full channel, its reader alive.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!ended.load(std::sync::atomic::Ordering::SeqCst));
        drop(source);
        for _ in 0..500 {
            if ended.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the decoding thread did not end");
    }
}
