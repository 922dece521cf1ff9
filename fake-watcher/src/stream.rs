//! Reading a replay stream (docs/replay.md §1): one line at a time, never the
//! whole stream; blank lines and `#` comments skipped; every other line
//! decoded into a [`WatchEvent`] or a [`StreamError`] that names the file, the
//! line and the reason.

use std::collections::HashSet;
use std::fmt;
use std::io::{self, BufRead, Read as _};

use k8s_openapi::api::core::v1::{Namespace, Service};
use serde::Deserialize;
use serde_json::value::RawValue;
use subscriber::{
    CiliumLoadBalancerIPPool, IPAddressPool, CILIUM_POOL_API_VERSION,
    CILIUM_POOL_API_VERSION_V2ALPHA1, CILIUM_POOL_KIND, POOL_API_VERSION, POOL_KIND,
};

use crate::decode::{Header, Hint, LeanNamespace, LeanService, RefObject, Top, TypeField};

use crate::store::StoreError;

/// The longest line a stream may have, newline included (64 MiB). An API
/// server stores objects of at most a few MiB (etcd refuses requests over
/// 1.5 MiB by default); a longer line is an error as soon as the limit is
/// passed, so that input without newlines (`/dev/zero`) stops at once and
/// cannot exhaust memory.
pub const DEFAULT_MAX_LINE_BYTES: usize = 64 << 20;

/// The namespace of a Service that names none, as kubectl would create it.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A line that stops the replay (or, with `--keep-going`, is skipped):
/// displayed as `FILE:LINE: reason`.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {error}")]
pub struct StreamError {
    /// The stream's name as the user gave it (`<stdin>` for standard input).
    pub file: String,
    /// The 1-based line number.
    pub line: u64,
    /// What is wrong with the line.
    pub error: LineError,
}

impl StreamError {
    /// Whether reading cannot go on after this error (the stream itself
    /// failed), even with `--keep-going`.
    pub fn is_fatal(&self) -> bool {
        matches!(self.error, LineError::Io(_) | LineError::TooLong { .. })
    }
}

/// What is wrong with one line of a stream.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    /// The stream could not be read.
    #[error("cannot read: {0}")]
    Io(#[source] io::Error),
    /// The line is longer than the limit (found as soon as the limit is
    /// passed; reading stops there).
    #[error("line is longer than {limit} bytes")]
    TooLong {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The line is not UTF-8.
    #[error("not valid UTF-8 (at byte {offset})")]
    Utf8 {
        /// 0-based offset of the first invalid byte.
        offset: usize,
    },
    /// The line is not JSON (a line cut off midway is one too).
    #[error("not JSON: {message} at column {column}{}", mistake_text(.mistake))]
    Json {
        /// serde_json's reason, without its position.
        message: String,
        /// 1-based column of the error.
        column: usize,
        /// The known mistake the line looks like, if any.
        mistake: Option<Mistake>,
    },
    /// The line is JSON but not an object.
    #[error("not a JSON object")]
    NotAnObject,
    /// The event has no `type`.
    #[error("event has no \"type\"")]
    MissingType,
    /// An object without the watch event around it.
    #[error(
        "event has no \"type\": this is a bare {kind} object, not a watch event; \
             wrap each object in one: jq -c '{{type: \"ADDED\", object: .}}' (docs/replay.md §4)"
    )]
    BareObject {
        /// The object's `kind`.
        kind: String,
    },
    /// A `List`, as `kubectl get -o json` prints it.
    #[error(
        "event has no \"type\": this is a {kind}, as kubectl get -o json prints it, not a \
             watch event; make one event of each item: \
             jq -c '.items[] | {{type: \"ADDED\", object: .}}' (docs/replay.md §4)"
    )]
    List {
        /// The List's `kind` (`List`, `ServiceList`, ...).
        kind: String,
    },
    /// The event's `type` is not a string.
    #[error("event \"type\" is not a string")]
    TypeNotString,
    /// The event's `type` is none of ADDED, MODIFIED, DELETED, SYNCED, BOOKMARK.
    #[error("unknown event type {0:?}")]
    UnknownType(String),
    /// An ADDED, MODIFIED or DELETED event without an object.
    #[error("{event_type} event has no \"object\"")]
    MissingObject {
        /// The event's type.
        event_type: EventType,
    },
    /// The event's `object` is not a JSON object.
    #[error("event \"object\" is not a JSON object")]
    ObjectNotAnObject,
    /// The object has no `apiVersion` or `kind` (or not a string).
    #[error("object has no {field:?} string")]
    MissingTypeField {
        /// `apiVersion` or `kind`.
        field: &'static str,
    },
    /// The object's JSON shape does not fit its kind.
    #[error("{kind}{} does not decode: {}{message}", key_text(.key), path_text(.path))]
    Shape {
        /// The object's kind.
        kind: Kind,
        /// The object's key where it could be read.
        key: Option<String>,
        /// Where in the object, e.g. `spec.ports[0].port`; empty for the top.
        path: String,
        /// serde's reason.
        message: String,
    },
    /// The object has no (or an empty) `metadata.name`.
    #[error("{kind} has no metadata.name")]
    MissingName {
        /// The object's kind.
        kind: Kind,
    },
    /// A name or namespace with a `/`, which no Kubernetes object has (and
    /// which would make two Services share one `namespace/name` key).
    #[error("{kind} {field} {value:?} contains '/'")]
    BadName {
        /// The object's kind.
        kind: Kind,
        /// `metadata.name` or `metadata.namespace`.
        field: &'static str,
        /// The value as given.
        value: String,
    },
    /// The replay store refused the write (as an API server would).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A mistake a line that is not JSON looks like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mistake {
    /// One JSON document over several lines (`kubectl -o json`, `jq .`).
    PrettyPrinted,
    /// YAML (`kubectl -o yaml`).
    Yaml,
}

fn mistake_text(mistake: &Option<Mistake>) -> &'static str {
    match mistake {
        None => "",
        Some(Mistake::PrettyPrinted) => {
            " (this looks like pretty-printed JSON: a stream has one event per line; \
             compact it with jq -c)"
        }
        Some(Mistake::Yaml) => {
            " (this looks like YAML: a stream is JSON, one event per line; \
             get the objects with -o json and convert them as docs/replay.md §4 shows)"
        }
    }
}

/// The known mistake a line that is not JSON looks like, if any.
fn mistake_of(text: &str) -> Option<Mistake> {
    let line = text.trim();
    // Lines of an indented JSON document: an opening or closing bracket
    // alone, or a `"key": value,` member.
    let pretty = matches!(line, "{" | "[" | "}" | "]" | "}," | "],")
        || ((line.starts_with('{') || line.starts_with('['))
            && (line.ends_with('{') || line.ends_with('[')))
        || (line.starts_with('"') && line.contains("\": "));
    if pretty {
        return Some(Mistake::PrettyPrinted);
    }
    // `key: value`, `key:`, `- key: value` or a document marker.
    let item = line.strip_prefix("- ").unwrap_or(line).trim_start();
    let yaml = line == "---"
        || item.split_once(':').is_some_and(|(key, rest)| {
            !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
                && (rest.is_empty() || rest.starts_with(' '))
        });
    yaml.then_some(Mistake::Yaml)
}

fn key_text(key: &Option<String>) -> String {
    key.as_ref()
        .map(|key| format!(" {key:?}"))
        .unwrap_or_default()
}

fn path_text(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}: ")
    }
}

/// The kinds a stream may carry (docs/replay.md §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `v1` / `Service`.
    Service,
    /// `metallb.io/v1beta1` / `IPAddressPool`.
    Pool,
    /// `cilium.io/v2` or `cilium.io/v2alpha1` / `CiliumLoadBalancerIPPool`
    /// (docs/cilium.md §2.1: one schema).
    CiliumPool,
    /// `v1` / `Namespace`.
    Namespace,
}

impl Kind {
    /// The kind's `apiVersion` and `kind` fields together identify it.
    pub fn of(api_version: &str, kind: &str) -> Option<Kind> {
        match (api_version, kind) {
            ("v1", "Service") => Some(Kind::Service),
            ("v1", "Namespace") => Some(Kind::Namespace),
            (POOL_API_VERSION, POOL_KIND) => Some(Kind::Pool),
            (CILIUM_POOL_API_VERSION | CILIUM_POOL_API_VERSION_V2ALPHA1, CILIUM_POOL_KIND) => {
                Some(Kind::CiliumPool)
            }
            _ => None,
        }
    }

    /// The `kind` field's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::Pool => POOL_KIND,
            Kind::CiliumPool => CILIUM_POOL_KIND,
            Kind::Namespace => "Namespace",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `type` of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    Synced,
    Bookmark,
}

impl EventType {
    /// Parses the `type` field.
    pub fn parse(text: &str) -> Option<EventType> {
        match text {
            "ADDED" => Some(EventType::Added),
            "MODIFIED" => Some(EventType::Modified),
            "DELETED" => Some(EventType::Deleted),
            "SYNCED" => Some(EventType::Synced),
            "BOOKMARK" => Some(EventType::Bookmark),
            _ => None,
        }
    }

    /// The `type` field's value.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
            EventType::Synced => "SYNCED",
            EventType::Bookmark => "BOOKMARK",
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One decoded line.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchEvent {
    /// The object is created (or, if it exists, updated).
    Added(Object),
    /// The object is updated (or, if unknown, created).
    Modified(Object),
    /// The object is deleted.
    Deleted(ObjectRef),
    /// The initial list is complete.
    Synced,
    /// Ignored.
    Bookmark,
    /// An object of a kind the replay does not know: skipped.
    Skipped {
        /// Its `apiVersion`.
        api_version: String,
        /// Its `kind`.
        kind: String,
    },
}

impl WatchEvent {
    /// The event's type (`ADDED` for a skipped object whatever its type was).
    pub fn event_type(&self) -> EventType {
        match self {
            WatchEvent::Added(_) | WatchEvent::Skipped { .. } => EventType::Added,
            WatchEvent::Modified(_) => EventType::Modified,
            WatchEvent::Deleted(_) => EventType::Deleted,
            WatchEvent::Synced => EventType::Synced,
            WatchEvent::Bookmark => EventType::Bookmark,
        }
    }
}

/// An object of a known kind, decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// A Service, its namespace defaulted to `default`.
    Service {
        service: Box<Service>,
        /// The line's object has a `status` key (a MODIFIED replaces the
        /// stored status only then).
        has_status: bool,
    },
    /// An address pool.
    Pool(Box<IPAddressPool>),
    /// A Cilium address pool.
    CiliumPool(Box<CiliumLoadBalancerIPPool>),
    /// A Namespace.
    Namespace(Box<Namespace>),
}

impl Object {
    /// The object's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Object::Service { .. } => Kind::Service,
            Object::Pool(_) => Kind::Pool,
            Object::CiliumPool(_) => Kind::CiliumPool,
            Object::Namespace(_) => Kind::Namespace,
        }
    }

    /// `namespace/name` for a Service, the name otherwise.
    pub fn key(&self) -> String {
        match self {
            Object::Service { service, .. } => service_key_of(&service.metadata),
            Object::Pool(pool) => pool.metadata.name.clone().unwrap_or_default(),
            Object::CiliumPool(pool) => pool.metadata.name.clone().unwrap_or_default(),
            Object::Namespace(namespace) => namespace.metadata.name.clone().unwrap_or_default(),
        }
    }
}

/// What a DELETED event names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRef {
    pub kind: Kind,
    pub name: String,
    /// For a Service, its namespace (`default` when the object names none).
    pub namespace: Option<String>,
}

impl ObjectRef {
    /// `namespace/name` for a Service, the name otherwise.
    pub fn key(&self) -> String {
        match (&self.kind, &self.namespace) {
            (Kind::Service, Some(namespace)) => [namespace, "/", &self.name].concat(),
            (Kind::Service, None) => [DEFAULT_NAMESPACE, "/", &self.name].concat(),
            _ => self.name.clone(),
        }
    }
}

/// A Service's key from its metadata, with the namespace defaulted.
pub(crate) fn service_key_of(
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> String {
    let namespace = metadata
        .namespace
        .as_deref()
        .filter(|namespace| !namespace.is_empty())
        .unwrap_or(DEFAULT_NAMESPACE);
    let name = metadata.name.as_deref().unwrap_or_default();
    [namespace, "/", name].concat()
}

/// One event line of a stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The 1-based line number.
    pub line: u64,
    /// The bytes of the stream read up to the end of this line (for
    /// progress).
    pub bytes: u64,
    pub event: WatchEvent,
}

/// Reads a stream one line at a time and yields its event lines.
///
/// After an I/O error it yields nothing more; after any other error it goes
/// on with the next line. Objects of an unknown kind are yielded as
/// [`WatchEvent::Skipped`], with one warning per kind logged.
pub struct StreamReader<R> {
    file: String,
    reader: R,
    line: u64,
    /// Bytes read so far.
    bytes: u64,
    max_line_bytes: usize,
    buf: Vec<u8>,
    warned: HashSet<(String, String)>,
    done: bool,
}

impl<R: BufRead> StreamReader<R> {
    /// Reads `reader`, named `file` in errors.
    pub fn new(file: impl Into<String>, reader: R) -> Self {
        Self {
            file: file.into(),
            reader,
            line: 0,
            bytes: 0,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            buf: Vec::new(),
            warned: HashSet::new(),
            done: false,
        }
    }

    /// Sets the longest line allowed (default [`DEFAULT_MAX_LINE_BYTES`]).
    #[must_use]
    pub fn max_line_bytes(mut self, limit: usize) -> Self {
        self.max_line_bytes = limit;
        self
    }

    /// The stream's name.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The number of the last line read (0 before the first).
    pub fn line(&self) -> u64 {
        self.line
    }

    fn error(&self, error: LineError) -> StreamError {
        StreamError {
            file: self.file.clone(),
            line: self.line,
            error,
        }
    }

    /// The next event line, `None` at the end of the stream.
    pub fn next_record(&mut self) -> Option<Result<Record, StreamError>> {
        while !self.done {
            let read = read_raw_line(&mut self.reader, &mut self.buf, self.max_line_bytes);
            let raw = match read {
                Ok(RawLine::Eof) => {
                    self.done = true;
                    return None;
                }
                Ok(raw) => raw,
                Err(error) => {
                    self.done = true;
                    self.line = self.line.saturating_add(1);
                    return Some(Err(self.error(LineError::Io(error))));
                }
            };
            self.line = self.line.saturating_add(1);
            let read = u64::try_from(self.buf.len()).unwrap_or(u64::MAX);
            self.bytes = self.bytes.saturating_add(read);
            if raw == RawLine::TooLong {
                // Where the line ends is unknown (maybe nowhere): reading
                // stops here, even with --keep-going.
                self.done = true;
                let limit = self.max_line_bytes;
                return Some(Err(self.error(LineError::TooLong { limit })));
            }
            let text = match line_text(&self.buf, self.line == 1) {
                Ok(Some(text)) => text,
                Ok(None) => continue,
                Err(error) => return Some(Err(self.error(error))),
            };
            let event = match decode_event(text) {
                Ok(event) => event,
                Err(error) => return Some(Err(self.error(error))),
            };
            if let WatchEvent::Skipped { api_version, kind } = &event {
                if self.warned.insert((api_version.clone(), kind.clone())) {
                    tracing::warn!(
                        file = %self.file,
                        line = self.line,
                        %api_version,
                        %kind,
                        "skipping objects of a kind the replay does not know"
                    );
                }
            }
            return Some(Ok(Record {
                line: self.line,
                bytes: self.bytes,
                event,
            }));
        }
        None
    }
}

impl<R: BufRead> Iterator for StreamReader<R> {
    type Item = Result<Record, StreamError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record()
    }
}

/// How [`read_raw_line`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RawLine {
    /// Nothing was left.
    Eof,
    /// A line (with its newline, unless it is the last) is in the buffer.
    Line,
    /// The line passed the limit: reading stopped there, in the middle of
    /// the line (endless input without a newline must not be read to its
    /// end), and the buffer holds nothing.
    TooLong,
}

/// A line buffer larger than this is freed after use rather than kept for
/// the next line (one huge line must not hold its memory to the end).
const KEPT_BUFFER_BYTES: usize = 1 << 20;

/// Reads one line into `buf` (cleared first). At the first byte past
/// `limit` it stops and returns [`RawLine::TooLong`], the rest of the line
/// left unread.
pub(crate) fn read_raw_line<R: BufRead + ?Sized>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    limit: usize,
) -> io::Result<RawLine> {
    if buf.capacity() > KEPT_BUFFER_BYTES {
        *buf = Vec::new();
    }
    buf.clear();
    let most = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    let read = reader.take(most).read_until(b'\n', buf)?;
    if read == 0 {
        return Ok(RawLine::Eof);
    }
    if buf.len() > limit {
        *buf = Vec::new();
        return Ok(RawLine::TooLong);
    }
    Ok(RawLine::Line)
}

/// The text of a raw line without its line ending (and, on the first line,
/// without a UTF-8 byte order mark); `None` for a blank or comment line.
pub(crate) fn line_text(raw: &[u8], first: bool) -> Result<Option<&str>, LineError> {
    let text = std::str::from_utf8(raw).map_err(|error| LineError::Utf8 {
        offset: error.valid_up_to(),
    })?;
    let text = text.strip_suffix('\n').unwrap_or(text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    let text = if first {
        text.strip_prefix('\u{feff}').unwrap_or(text)
    } else {
        text
    };
    let content = text.trim_start();
    if content.is_empty() || content.starts_with('#') {
        return Ok(None);
    }
    Ok(Some(text))
}

/// Whether a raw line is a `SYNCED` event, exactly as [`decode_event`] would
/// decide; cheap for every other line.
pub(crate) fn is_synced_line(raw: &[u8], first: bool) -> bool {
    // A SYNCED line names SYNCED, literally or through an escape.
    let candidate = raw.windows(6).any(|window| window == b"SYNCED")
        || raw.windows(2).any(|window| window == b"\\u");
    if !candidate {
        return false;
    }
    let Ok(Some(text)) = line_text(raw, first) else {
        return false;
    };
    matches!(
        serde_json::from_str::<Top<'_>>(text),
        Ok(Top::Event { event_type: TypeField::Text(t), .. }) if t == "SYNCED"
    )
}

/// Decodes one event line (already known not to be a comment), building
/// only what the replay reads (see the `decode` module).
pub fn decode_event(text: &str) -> Result<WatchEvent, LineError> {
    let top: Top<'_> = serde_json::from_str(text).map_err(|error| LineError::Json {
        message: without_position(&error),
        column: error.column(),
        mistake: mistake_of(text),
    })?;
    let Top::Event {
        event_type,
        object,
        kind,
        items,
    } = top
    else {
        return Err(LineError::NotAnObject);
    };
    let event_type = match event_type {
        TypeField::Missing => {
            return Err(match kind {
                Some(kind) if items || kind.ends_with("List") => LineError::List { kind },
                Some(kind) if object.is_none() => LineError::BareObject { kind },
                _ => LineError::MissingType,
            })
        }
        TypeField::Text(text) => EventType::parse(&text).ok_or(LineError::UnknownType(text))?,
        TypeField::Other => return Err(LineError::TypeNotString),
    };
    match event_type {
        EventType::Synced => return Ok(WatchEvent::Synced),
        EventType::Bookmark => return Ok(WatchEvent::Bookmark),
        EventType::Added | EventType::Modified | EventType::Deleted => {}
    }
    let object = match object.map(RawValue::get) {
        None | Some("null") => return Err(LineError::MissingObject { event_type }),
        Some(object) => object,
    };
    let (api_version, kind_name) = match serde_json::from_str::<Header>(object) {
        Ok(Header::Object { api_version, kind }) => (api_version, kind),
        Ok(Header::NotAnObject) => return Err(LineError::ObjectNotAnObject),
        Err(error) => return Err(json_error(&error)),
    };
    let api_version = type_field(api_version, "apiVersion")?;
    let kind_name = type_field(kind_name, "kind")?;
    let Some(kind) = Kind::of(&api_version, &kind_name) else {
        return Ok(WatchEvent::Skipped {
            api_version,
            kind: kind_name,
        });
    };
    Ok(match event_type {
        EventType::Deleted => WatchEvent::Deleted(decode_ref(kind, object)?),
        EventType::Modified => WatchEvent::Modified(decode_object(kind, object)?),
        _ => WatchEvent::Added(decode_object(kind, object)?),
    })
}

/// serde_json's message without its ` at line L column C` suffix.
fn without_position(error: &serde_json::Error) -> String {
    let message = error.to_string();
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    match message.strip_suffix(&suffix) {
        Some(stripped) => stripped.to_owned(),
        None => message,
    }
}

/// A syntax error, with its column.
fn json_error(error: &serde_json::Error) -> LineError {
    LineError::Json {
        message: without_position(error),
        column: error.column(),
        mistake: None,
    }
}

fn type_field(value: Option<String>, field: &'static str) -> Result<String, LineError> {
    value
        .filter(|text| !text.is_empty())
        .ok_or(LineError::MissingTypeField { field })
}

/// `namespace/name` (Services) or the name, read loosely for error messages.
fn key_hint(kind: Kind, object: &str) -> Option<String> {
    let hint: Hint = serde_json::from_str(object).ok()?;
    let name = hint.name?;
    match kind {
        Kind::Service => {
            let namespace = hint
                .namespace
                .filter(|namespace| !namespace.is_empty())
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
            Some(format!("{namespace}/{name}"))
        }
        Kind::Pool | Kind::CiliumPool | Kind::Namespace => Some(name),
    }
}

fn decode_as<'de, T: Deserialize<'de>>(kind: Kind, object: &'de str) -> Result<T, LineError> {
    let mut deserializer = serde_json::Deserializer::from_str(object);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let path = if path == "." { String::new() } else { path };
        LineError::Shape {
            kind,
            key: key_hint(kind, object),
            path,
            message: without_position(error.inner()),
        }
    })
}

fn require_name(kind: Kind, name: Option<&str>) -> Result<(), LineError> {
    match name {
        Some(name) if !name.is_empty() => no_slash(kind, "metadata.name", name),
        _ => Err(LineError::MissingName { kind }),
    }
}

fn check_namespace(kind: Kind, namespace: Option<&str>) -> Result<(), LineError> {
    namespace.map_or(Ok(()), |namespace| {
        no_slash(kind, "metadata.namespace", namespace)
    })
}

/// A `/` in a name or namespace would make keys ambiguous (`x`/`a/b` and
/// `x/a`/`b`); an API server never hands one out.
fn no_slash(kind: Kind, field: &'static str, value: &str) -> Result<(), LineError> {
    if value.contains('/') {
        return Err(LineError::BadName {
            kind,
            field,
            value: value.to_owned(),
        });
    }
    Ok(())
}

fn decode_object(kind: Kind, object: &str) -> Result<Object, LineError> {
    match kind {
        Kind::Service => {
            let lean: LeanService = decode_as(kind, object)?;
            let (mut service, has_status) = lean.into_service();
            require_name(kind, service.metadata.name.as_deref())?;
            check_namespace(kind, service.metadata.namespace.as_deref())?;
            let namespace = &mut service.metadata.namespace;
            if namespace.as_deref().is_none_or(str::is_empty) {
                *namespace = Some(DEFAULT_NAMESPACE.to_owned());
            }
            Ok(Object::Service {
                service: Box::new(service),
                has_status,
            })
        }
        Kind::Pool => {
            let pool: IPAddressPool = decode_as(kind, object)?;
            require_name(kind, pool.metadata.name.as_deref())?;
            Ok(Object::Pool(Box::new(pool)))
        }
        Kind::CiliumPool => {
            let pool: CiliumLoadBalancerIPPool = decode_as(kind, object)?;
            require_name(kind, pool.metadata.name.as_deref())?;
            Ok(Object::CiliumPool(Box::new(pool)))
        }
        Kind::Namespace => {
            let lean: LeanNamespace = decode_as(kind, object)?;
            let namespace = lean.into_namespace();
            require_name(kind, namespace.metadata.name.as_deref())?;
            Ok(Object::Namespace(Box::new(namespace)))
        }
    }
}

fn decode_ref(kind: Kind, object: &str) -> Result<ObjectRef, LineError> {
    let decoded: RefObject = decode_as(kind, object)?;
    let metadata = decoded.metadata.unwrap_or_default();
    require_name(kind, metadata.name.as_deref())?;
    check_namespace(kind, metadata.namespace.as_deref())?;
    let namespace = match kind {
        Kind::Service => Some(
            metadata
                .namespace
                .filter(|namespace| !namespace.is_empty())
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
        ),
        Kind::Pool | Kind::CiliumPool | Kind::Namespace => None,
    };
    Ok(ObjectRef {
        kind,
        name: metadata.name.unwrap_or_default(),
        namespace,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        StreamReader::new("stream.jsonl", text.as_bytes())
            .filter_map(Result::err)
            .map(|error| error.to_string())
            .collect()
    }

    fn events(text: &str) -> Vec<Record> {
        StreamReader::new("s", text.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn comments_and_blank_lines_are_skipped_and_counted() {
        let text = "# a comment\n\n   \n  # indented\r\n{\"type\":\"SYNCED\"}\r\n{\"type\":\"BOOKMARK\",\"object\":{}}";
        let records = events(text);
        assert_eq!(
            records,
            vec![
                Record {
                    line: 5,
                    bytes: 50,
                    event: WatchEvent::Synced
                },
                Record {
                    line: 6,
                    bytes: text.len() as u64,
                    event: WatchEvent::Bookmark
                },
            ]
        );
    }

    #[test]
    fn byte_order_mark_on_the_first_line_is_ignored() {
        let records = events("\u{feff}{\"type\":\"SYNCED\"}\n");
        assert_eq!(records.len(), 1);
    }

    #[test]
    fn each_bad_line_names_its_line_and_reason() {
        let text = concat!(
            "# header\n",
            "not json\n",
            "[1, 2]\n",
            "{\"object\": {}}\n",
            "{\"type\": 3}\n",
            "{\"type\": \"ADDDED\", \"object\": {}}\n",
            "{\"type\": \"ADDED\"}\n",
            "{\"type\": \"MODIFIED\", \"object\": null}\n",
            "{\"type\": \"ADDED\", \"object\": []}\n",
            "{\"type\": \"ADDED\", \"object\": {\"kind\": \"Service\"}}\n",
            "{\"type\": \"ADDED\", \"object\": {\"apiVersion\": \"v1\"}}\n",
            "{\"type\": \"ADDED\", \"object\": {\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"namespace\": \"a\"}}}\n",
            "{\"type\": \"ADDED\", \"object\": {\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"web\"}, \"spec\": {\"ports\": \"80\"}}}\n",
            "{\"type\": \"ADDED\", \"object\": {\"apiVersion\": \"metallb.io/v1beta1\", \"kind\": \"IPAddressPool\", \"metadata\": {\"name\": \"p\"}, \"spec\": {\"addresses\": \"10.0.0.0/24\"}}}\n",
            "{\"type\": \"DELETED\", \"object\": {\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {}}}\n",
            "{\"type\": \"DELETED\", \"object\": {\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": 5}}}\n",
            "{\"type\": \"ADDED\", \"object\": {\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"\"}}}\n",
            "{\"type\": \"ADDED\", \"object\": {\"apiVersion\": \"v1\", \"kind\": \"Service\", \"spec\": {}}}\n",
            "{\"type\": \"ADDED\", \"object\": {\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"x\", \"labels\": [\"a\"]}}}\n",
            "{\"type\": \"ADDED\", \"obj",
        );
        assert_eq!(
            errors(text),
            vec![
                "stream.jsonl:2: not JSON: expected ident at column 2",
                "stream.jsonl:3: not a JSON object",
                "stream.jsonl:4: event has no \"type\"",
                "stream.jsonl:5: event \"type\" is not a string",
                "stream.jsonl:6: unknown event type \"ADDDED\"",
                "stream.jsonl:7: ADDED event has no \"object\"",
                "stream.jsonl:8: MODIFIED event has no \"object\"",
                "stream.jsonl:9: event \"object\" is not a JSON object",
                "stream.jsonl:10: object has no \"apiVersion\" string",
                "stream.jsonl:11: object has no \"kind\" string",
                "stream.jsonl:12: Service has no metadata.name",
                "stream.jsonl:13: Service \"default/web\" does not decode: spec.ports: invalid type: string \"80\", expected a sequence",
                "stream.jsonl:14: IPAddressPool \"p\" does not decode: spec.addresses: invalid type: string \"10.0.0.0/24\", expected a sequence",
                "stream.jsonl:15: Namespace has no metadata.name",
                "stream.jsonl:16: Service does not decode: metadata.name: invalid type: integer `5`, expected a string",
                "stream.jsonl:17: Service has no metadata.name",
                "stream.jsonl:18: Service has no metadata.name",
                "stream.jsonl:19: Namespace \"x\" does not decode: metadata.labels: invalid type: sequence, expected a map",
                "stream.jsonl:20: not JSON: EOF while parsing a string at column 22",
            ]
        );
    }

    #[test]
    fn fields_not_read_are_checked_for_their_type_and_dropped() {
        let service = |metadata: &str, spec: &str| {
            format!(
                "{{\"type\":\"ADDED\",\"object\":{{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{{\"name\":\"web\"{metadata}}},\"spec\":{{\"type\":\"LoadBalancer\"{spec}}}}}}}\n"
            )
        };
        let text = [
            service(
                ",\"managedFields\":[{\"manager\":\"kubectl\"}],\"labels\":{\"app\":\"web\"},\
                 \"annotations\":{\"metallb.io/address-pool\":\"p\",\"io.cilium/lb-ipam-ips\":\"10.0.0.1\",\
                 \"kubectl.kubernetes.io/last-applied-configuration\":\"{}\"},\"name\":\"web\"",
                ",\"ports\":[{\"name\":\"http\",\"port\":80,\"nodePort\":30080,\"targetPort\":\"http\"}],\
                 \"sessionAffinity\":\"None\",\"type\":\"LoadBalancer\"",
            ),
            service(",\"managedFields\":\"x\"", ""),
            service("", ",\"ports\":[{\"port\":80,\"nodePort\":\"x\"}]"),
            service("", ",\"externalIPs\":{}"),
            service(",\"annotations\":{\"example.com/a\":5}", ""),
        ]
        .concat();
        let results: Vec<_> = StreamReader::new("s", text.as_bytes()).collect();
        let Ok(Record {
            event: WatchEvent::Added(Object::Service { service, .. }),
            ..
        }) = &results[0]
        else {
            panic!("{:?}", results[0])
        };
        let json = serde_json::to_value(service).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"},
                             "annotations": {"metallb.io/address-pool": "p",
                                             "io.cilium/lb-ipam-ips": "10.0.0.1"}},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
            })
        );
        let errors: Vec<String> = results[1..]
            .iter()
            .map(|result| result.as_ref().unwrap_err().to_string())
            .collect();
        assert_eq!(
            errors,
            [
                "s:2: Service \"default/web\" does not decode: metadata.managedFields: invalid type: string, expected a sequence",
                "s:3: Service \"default/web\" does not decode: spec.ports[0].nodePort: invalid type: string, expected an integer",
                "s:4: Service \"default/web\" does not decode: spec.externalIPs: invalid type: map, expected a sequence",
                "s:5: Service \"default/web\" does not decode: metadata.annotations.example.com/a: invalid type: integer, expected a string",
            ]
        );
    }

    #[test]
    fn invalid_utf8_is_an_error_with_its_line() {
        let mut text = b"{\"type\":\"SYNCED\"}\n# caf".to_vec();
        text.extend_from_slice(&[0xe9, b'\n']);
        text.extend_from_slice(b"{\"type\":\"SYNCED\"}\n");
        let results: Vec<_> = StreamReader::new("s.jsonl", text.as_slice()).collect();
        assert_eq!(results.len(), 3);
        assert_eq!(
            results[1].as_ref().unwrap_err().to_string(),
            "s.jsonl:2: not valid UTF-8 (at byte 5)"
        );
        assert_eq!(results[2].as_ref().unwrap().line, 3);
    }

    #[test]
    fn a_line_over_the_limit_stops_the_stream_at_the_limit() {
        let text = format!(
            "{{\"type\":\"SYNCED\"}}\n{{\"type\":\"SYNCED\",\"pad\":\"{}\"}}\n{{\"type\":\"SYNCED\"}}\n",
            "x".repeat(100)
        );
        let mut reader = text.as_bytes();
        let results: Vec<_> = StreamReader::new("s", &mut reader)
            .max_line_bytes(64)
            .collect();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0].as_ref().unwrap().line, 1);
        let error = results[1].as_ref().unwrap_err();
        assert_eq!(error.to_string(), "s:2: line is longer than 64 bytes");
        assert!(error.is_fatal());
        // Reading stopped one byte past the limit, not at the line's end.
        assert_eq!(reader.len(), text.len() - 18 - 65);
        assert!(reader.ends_with(b"\n{\"type\":\"SYNCED\"}\n"));
    }

    #[test]
    fn endless_input_without_a_newline_stops_at_the_limit() {
        // An endless reader: if the limit were checked at the line's end,
        // this would never return.
        let endless = io::BufReader::new(io::repeat(0));
        let mut reader = StreamReader::new("zero", endless).max_line_bytes(1 << 16);
        let error = reader.next_record().unwrap().unwrap_err();
        assert_eq!(error.to_string(), "zero:1: line is longer than 65536 bytes");
        assert!(reader.next_record().is_none());
    }

    #[test]
    fn unknown_kinds_are_skipped_not_errors() {
        let text = "{\"type\":\"ADDED\",\"object\":{\"apiVersion\":\"apps/v1\",\"kind\":\"Deployment\",\"spec\":7}}\n\
                    {\"type\":\"DELETED\",\"object\":{\"apiVersion\":\"metallb.io/v1beta2\",\"kind\":\"IPAddressPool\"}}\n";
        let records = events(text);
        assert_eq!(
            records[0].event,
            WatchEvent::Skipped {
                api_version: "apps/v1".into(),
                kind: "Deployment".into()
            }
        );
        assert!(matches!(records[1].event, WatchEvent::Skipped { .. }));
    }

    #[test]
    fn services_default_to_namespace_default_and_remember_status() {
        let text = "{\"type\":\"ADDED\",\"object\":{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{\"name\":\"web\"},\"status\":null}}\n\
                    {\"type\":\"MODIFIED\",\"object\":{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{\"name\":\"db\",\"namespace\":\"prod\"}}}\n\
                    {\"type\":\"DELETED\",\"object\":{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{\"name\":\"web\"},\"spec\":\"junk\"}}\n";
        let records = events(text);
        let WatchEvent::Added(added) = &records[0].event else {
            panic!("{:?}", records[0])
        };
        assert_eq!(added.key(), "default/web");
        assert!(matches!(
            added,
            Object::Service {
                has_status: true,
                ..
            }
        ));
        let WatchEvent::Modified(modified) = &records[1].event else {
            panic!("{:?}", records[1])
        };
        assert_eq!(modified.key(), "prod/db");
        assert!(matches!(
            modified,
            Object::Service {
                has_status: false,
                ..
            }
        ));
        let WatchEvent::Deleted(deleted) = &records[2].event else {
            panic!("{:?}", records[2])
        };
        assert_eq!(deleted.key(), "default/web");
    }

    #[test]
    fn synced_detection_agrees_with_decoding() {
        for (line, synced) in [
            ("{\"type\":\"SYNCED\"}\n", true),
            ("  {\"object\": 1, \"type\" : \"SYNCED\"}", true),
            ("{\"type\":\"SYNC\\u0045D\"}\n", true),
            ("{\"type\":\"ADDED\",\"type\":\"SYNCED\"}\n", true),
            ("{\"type\":\"SYNCED\",\"type\":\"ADDED\"}\n", false),
            ("# {\"type\":\"SYNCED\"}\n", false),
            ("{\"type\":\"SYNCED\"\n", false),
            (
                "{\"type\":\"MODIFIED\",\"object\":{\"x\":\"SYNCED\"}}\n",
                false,
            ),
        ] {
            assert_eq!(is_synced_line(line.as_bytes(), false), synced, "{line}");
            let decoded = line_text(line.as_bytes(), false)
                .ok()
                .flatten()
                .map(decode_event);
            assert_eq!(
                matches!(decoded, Some(Ok(WatchEvent::Synced))),
                synced,
                "{line}"
            );
        }
    }

    #[test]
    fn io_errors_stop_the_stream() {
        struct Failing;
        impl io::Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("disk on fire"))
            }
        }
        let results: Vec<_> = StreamReader::new("s", io::BufReader::new(Failing)).collect();
        assert_eq!(results.len(), 1);
        let error = results[0].as_ref().unwrap_err();
        assert!(error.is_fatal());
        assert_eq!(error.to_string(), "s:1: cannot read: disk on fire");
    }
}
