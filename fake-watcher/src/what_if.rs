//! `fake-watcher what-if` (docs/replay.md §3.1): replays a stream, then
//! applies objects and deletions as the API server would, and reports the
//! Services whose addresses or condition changed.
//!
//! The objects and deletions become watch-event lines appended after the
//! stream (a `MODIFIED` creates an unknown object, docs/replay.md §1.2),
//! so they go through the very replay the stream does; the Services are
//! compared just before the first appended line and at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{self, BufRead, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use manager::ConditionKind;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::explain::{ConditionDocument, EventDocument};
use crate::output::{OutputError, OutputFormat};
use crate::plugin::Plugin;
use crate::replay::{pool_of, replay_pipelined, status_ips, Observer, ReplayError, ReplayOptions};
use crate::result::RejectedPoolResult;
use crate::stream::decode_event;

/// A `--apply` file or `--delete` argument that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WhatIfError {
    /// The file cannot be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        #[source]
        source: io::Error,
    },
    /// The file is neither JSON nor YAML.
    #[error("{file}: {what}")]
    Syntax { file: String, what: String },
    /// One document (or `List` item) cannot be applied.
    #[error("{file}: {place}: {what}")]
    Object {
        file: String,
        /// `document N`, or `document N, items[M]`.
        place: String,
        what: String,
    },
    /// The file holds no object.
    #[error("{file}: no object to apply")]
    Empty { file: String },
    /// A `--delete` argument that is not `KIND/[NAMESPACE/]NAME`.
    #[error("--delete {argument:?}: {what}")]
    Delete { argument: String, what: String },
}

/// The kinds `what-if` applies, by `apiVersion` and `kind`.
const KINDS: [(&str, &str); 5] = [
    ("v1", "Service"),
    ("metallb.io/v1beta1", "IPAddressPool"),
    ("cilium.io/v2", "CiliumLoadBalancerIPPool"),
    ("cilium.io/v2alpha1", "CiliumLoadBalancerIPPool"),
    ("v1", "Namespace"),
];

/// The objects of a `--apply` file, each as its watch-event line
/// (`MODIFIED`). One object, several YAML documents or JSON values, or a
/// `List`; a Service's `status` is dropped, as an API server ignores it on
/// an update of the object.
pub fn load_apply_file(path: &Path) -> Result<Vec<String>, WhatIfError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| WhatIfError::Read {
        file: file.clone(),
        source,
    })?;
    parse_apply(&file, &text)
}

/// [`load_apply_file`] on text already read, named `file` in errors.
pub fn parse_apply(file: &str, text: &str) -> Result<Vec<String>, WhatIfError> {
    let syntax = |what: String| WhatIfError::Syntax {
        file: file.to_owned(),
        what,
    };
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    let documents: Vec<Value> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::Deserializer::from_str(trimmed)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .map_err(|e| syntax(format!("not valid JSON: {e}")))?
    } else {
        let mut documents = Vec::new();
        for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let value = Value::deserialize(document)
                .map_err(|e| syntax(format!("document {}: not valid YAML: {e}", index + 1)))?;
            documents.push(value);
        }
        documents
    };
    let mut lines = Vec::new();
    for (index, document) in documents.into_iter().enumerate() {
        let place = format!("document {}", index + 1);
        objects_of(file, &place, document, &mut lines)?;
    }
    if lines.is_empty() {
        return Err(WhatIfError::Empty {
            file: file.to_owned(),
        });
    }
    Ok(lines)
}

/// Appends the event line of `document` (the lines of its items for a
/// `List`) to `lines`.
fn objects_of(
    file: &str,
    place: &str,
    document: Value,
    lines: &mut Vec<String>,
) -> Result<(), WhatIfError> {
    let error = |what: String| WhatIfError::Object {
        file: file.to_owned(),
        place: place.to_owned(),
        what,
    };
    let mut object = match document {
        // An empty document (a trailing `---`).
        Value::Null => return Ok(()),
        Value::Object(object) => object,
        other => {
            return Err(error(format!(
                "not an object but {}",
                kind_of_value(&other)
            )))
        }
    };
    let text = |key: &str| object.get(key).and_then(Value::as_str).unwrap_or_default();
    let (api_version, kind) = (text("apiVersion").to_owned(), text("kind").to_owned());
    if kind.ends_with("List") {
        let Some(Value::Array(items)) = object.remove("items") else {
            return Err(error(format!("a {kind} without items")));
        };
        for (index, item) in items.into_iter().enumerate() {
            objects_of(file, &format!("{place}, items[{index}]"), item, lines)?;
        }
        return Ok(());
    }
    if !KINDS.contains(&(api_version.as_str(), kind.as_str())) {
        return Err(error(format!(
            "cannot apply kind {kind:?} of apiVersion {api_version:?}: what-if applies v1 Service, metallb.io/v1beta1 IPAddressPool, cilium.io/v2 (or v2alpha1) CiliumLoadBalancerIPPool and v1 Namespace"
        )));
    }
    if kind == "Service" {
        object.remove("status");
    }
    let line = json!({"type": "MODIFIED", "object": Value::Object(object)}).to_string();
    decode_event(&line).map_err(|e| error(e.to_string()))?;
    lines.push(line);
    Ok(())
}

fn kind_of_value(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The `DELETED` line of a `--delete KIND/[NAMESPACE/]NAME` argument. A
/// Service without a namespace is in `default`; a pool's namespace is
/// ignored (pools are known by name); a Namespace has none.
pub fn parse_delete(argument: &str) -> Result<String, WhatIfError> {
    let error = |what: &str| WhatIfError::Delete {
        argument: argument.to_owned(),
        what: what.to_owned(),
    };
    let parts: Vec<&str> = argument.split('/').collect();
    let (kind, namespace, name) = match parts.as_slice() {
        [kind, name] => (*kind, None, *name),
        [kind, namespace, name] => (*kind, Some(*namespace), *name),
        _ => return Err(error("expected KIND/NAME or KIND/NAMESPACE/NAME")),
    };
    if name.is_empty() || namespace.is_some_and(str::is_empty) {
        return Err(error("empty name or namespace"));
    }
    let mut metadata = Map::new();
    metadata.insert("name".to_owned(), Value::from(name));
    let (api_version, kind) = match kind.to_ascii_lowercase().as_str() {
        "service" | "services" | "svc" => {
            metadata.insert(
                "namespace".to_owned(),
                Value::from(namespace.unwrap_or(crate::stream::DEFAULT_NAMESPACE)),
            );
            ("v1", "Service")
        }
        "ipaddresspool" | "ipaddresspools" | "ipaddresspools.metallb.io" => {
            ("metallb.io/v1beta1", "IPAddressPool")
        }
        // Cilium's CRD short names too (docs/cilium.md §2.1).
        "ciliumloadbalancerippool"
        | "ciliumloadbalancerippools"
        | "ciliumloadbalancerippools.cilium.io"
        | "ippool"
        | "ippools"
        | "lbippool"
        | "lbippools" => ("cilium.io/v2", "CiliumLoadBalancerIPPool"),
        "namespace" | "namespaces" | "ns" if namespace.is_none() => ("v1", "Namespace"),
        "namespace" | "namespaces" | "ns" => {
            return Err(error("a Namespace has no namespace: namespace/NAME"))
        }
        _ => {
            return Err(error(
                "unknown kind: service, ipaddresspool, ciliumloadbalancerippool or namespace \
                 (or svc, lbippool, ns)",
            ))
        }
    };
    let object = json!({"apiVersion": api_version, "kind": kind, "metadata": metadata});
    Ok(json!({"type": "DELETED", "object": object}).to_string())
}

/// What one Service shows, as compared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceState {
    /// `status.loadBalancer.ingress[].ip`.
    pub ips: Vec<String>,
    /// The `metallb.io/ip-allocated-from-pool` annotation.
    pub pool: Option<String>,
    /// The `metallb.io/AddressAssigned` condition.
    pub condition: Option<ConditionDocument>,
}

impl ServiceState {
    fn of(service: &Service) -> Self {
        let ips = status_ips(service);
        let pool = pool_of(service);
        let condition = ConditionKind::Assigned
            .shown(service)
            .as_ref()
            .map(ConditionDocument::from);
        Self {
            ips,
            pool,
            condition,
        }
    }

    fn is_empty(&self) -> bool {
        self.ips.is_empty() && self.pool.is_none() && self.condition.is_none()
    }
}

/// One Service whose addresses, pool or condition changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceChange {
    /// `namespace/name`.
    pub key: String,
    /// `added`, `deleted`, `assigned`, `moved` (an address it held was
    /// replaced), `lost` (it holds none now), `pool` or `condition`.
    pub change: &'static str,
    /// Whether it lost or changed an address it held (what
    /// `--fail-on-change` fails on); never for a deleted Service.
    pub moved: bool,
    /// `null` when it did not exist.
    pub before: Option<ServiceState>,
    /// `null` when it was deleted.
    pub after: Option<ServiceState>,
    /// The Events the changes caused, in order.
    pub events: Vec<EventDocument>,
}

/// The `what-if` document (`--output json`); keys always present, in this
/// order; more may be added.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WhatIfReport {
    /// Every Service that changed, sorted by key.
    pub changes: Vec<ServiceChange>,
    /// Pools rejected after the changes that were not (or not for that
    /// reason) before, sorted by name.
    pub rejected_pools: Vec<RejectedPoolResult>,
}

impl WhatIfReport {
    /// Whether a Service lost or changed an address it held.
    pub fn moves_any(&self) -> bool {
        self.changes.iter().any(|c| c.moved)
    }
}

/// Counts the newlines of the stream as they are read, so that the lines
/// appended after it are told apart from its own.
struct Counting<R> {
    inner: R,
    newlines: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let found = buf.get(..n).unwrap_or_default();
        let count = found.iter().filter(|b| **b == b'\n').count();
        self.newlines
            .fetch_add(u64::try_from(count).unwrap_or(u64::MAX), Ordering::Relaxed);
        Ok(n)
    }
}

/// Replays `reader` (named `file`), then the `appended` event lines, and
/// reports what they changed.
pub fn what_if<R: BufRead + Send + 'static>(
    file: &str,
    reader: R,
    options: &ReplayOptions,
    appended: &[String],
) -> Result<WhatIfReport, ReplayError> {
    let newlines = Arc::new(AtomicU64::new(0));
    let counted = Counting {
        inner: reader,
        newlines: Arc::clone(&newlines),
    };
    // A newline first ends a last line without one (a blank line is a
    // comment), so the appended lines start at the stream's newlines + 2.
    let mut tail = String::from("\n");
    for line in appended {
        tail.push_str(line);
        tail.push('\n');
    }
    let chained = io::BufReader::new(counted.chain(io::Cursor::new(tail.into_bytes())));
    let mut watcher = Watcher {
        newlines,
        before: None,
        after: None,
    };
    replay_pipelined(file, chained, options, &mut watcher)?;
    let (Some(before), Some(after)) = (watcher.before, watcher.after) else {
        return Err(ReplayError::Worker(
            "the replay ended without a result".to_owned(),
        ));
    };
    Ok(compare(&before, after))
}

/// The Services, pools and Events at one moment.
#[derive(Debug)]
struct Snapshot {
    services: BTreeMap<String, ServiceState>,
    rejected: Vec<RejectedPoolResult>,
    /// Events emitted so far.
    events: usize,
    /// The Events from `before`'s count on (only in `after`).
    new_events: Vec<crate::client::EventRecord>,
}

impl Snapshot {
    fn take(plugin: &Plugin, since: Option<usize>) -> Self {
        let services = plugin
            .store
            .services()
            .into_iter()
            .map(|(key, service)| (key, ServiceState::of(&service)))
            .collect();
        let rejected = plugin
            .controller
            .rejected_pools()
            .into_iter()
            .map(|r| RejectedPoolResult {
                name: r.name,
                kind: r.kind.to_string(),
                reason: r.reason,
            })
            .collect();
        let (_, events) = plugin.client.mark();
        let new_events = since
            .map(|since| plugin.client.since((0, since)).1)
            .unwrap_or_default();
        Self {
            services,
            rejected,
            events,
            new_events,
        }
    }
}

struct Watcher {
    newlines: Arc<AtomicU64>,
    before: Option<Snapshot>,
    after: Option<Snapshot>,
}

impl Observer for Watcher {
    fn before_line(&mut self, line: u64, plugin: &Plugin) {
        // The stream is read to its end before an appended line is, so the
        // count is final here.
        let stream_lines = self.newlines.load(Ordering::Relaxed).saturating_add(1);
        if self.before.is_none() && line > stream_lines {
            self.before = Some(Snapshot::take(plugin, None));
        }
    }

    fn finished(&mut self, plugin: &Plugin) {
        let before = self
            .before
            .get_or_insert_with(|| Snapshot::take(plugin, None));
        let since = before.events;
        self.after = Some(Snapshot::take(plugin, Some(since)));
    }
}

fn compare(before: &Snapshot, after: Snapshot) -> WhatIfReport {
    let keys: BTreeSet<&String> = before
        .services
        .keys()
        .chain(after.services.keys())
        .collect();
    let mut changes = Vec::new();
    for key in keys {
        let old = before.services.get(key).filter(|s| !s.is_empty());
        let new = after.services.get(key);
        let deleted = new.is_none();
        let new = new.filter(|s| !s.is_empty());
        if old == new {
            continue;
        }
        let kept_all = |old: &ServiceState| {
            new.is_some_and(|new| old.ips.iter().all(|ip| new.ips.contains(ip)))
        };
        let moved = !deleted && old.is_some_and(|old| !kept_all(old));
        let change = match (old, new) {
            (None, _) if !before.services.contains_key(key) => "added",
            _ if deleted => "deleted",
            (_, Some(new)) if moved && !new.ips.is_empty() => "moved",
            _ if moved => "lost",
            (old, Some(new)) if old.is_none_or(|o| o.ips.is_empty()) && !new.ips.is_empty() => {
                "assigned"
            }
            (Some(old), Some(new)) if old.ips == new.ips && old.pool != new.pool => "pool",
            _ => "condition",
        };
        let events = after
            .new_events
            .iter()
            .filter(|e| e.key == **key)
            .map(|e| EventDocument {
                event_type: e.event_type.clone(),
                reason: e.reason.clone(),
                message: e.message.clone(),
            })
            .collect();
        changes.push(ServiceChange {
            key: key.clone(),
            change,
            moved,
            before: before.services.get(key).cloned(),
            after: after.services.get(key).cloned(),
            events,
        });
    }
    let rejected_pools = after
        .rejected
        .into_iter()
        .filter(|r| !before.rejected.contains(r))
        .collect();
    WhatIfReport {
        changes,
        rejected_pools,
    }
}

/// The report in `format`: JSON (pretty) or YAML, or for `table` one row
/// per changed Service: NAMESPACE, NAME, BEFORE, AFTER, CHANGE, REASON.
pub fn render_what_if(report: &WhatIfReport, format: OutputFormat) -> Result<String, OutputError> {
    match format {
        OutputFormat::Json => {
            let mut text = serde_json::to_string_pretty(report)?;
            text.push('\n');
            Ok(text)
        }
        OutputFormat::Yaml => Ok(serde_yaml_ng::to_string(report)?),
        OutputFormat::Table => Ok(table(report)),
    }
}

fn addresses(state: Option<&ServiceState>, absent: &str) -> String {
    match state {
        None => absent.to_owned(),
        Some(state) if state.ips.is_empty() => "<pending>".to_owned(),
        Some(state) => format!(
            "{} ({})",
            state.ips.join(","),
            state.pool.as_deref().unwrap_or("<none>")
        ),
    }
}

/// The reasons shown: the Events' reasons in order (each once), else the
/// condition's reason after the change.
fn reasons(change: &ServiceChange) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for event in &change.events {
        if !seen.contains(&event.reason.as_str()) {
            seen.push(&event.reason);
        }
    }
    if seen.is_empty() {
        if let Some(condition) = change.after.as_ref().and_then(|a| a.condition.as_ref()) {
            seen.push(&condition.reason);
        }
    }
    seen.join(",")
}

fn table(report: &WhatIfReport) -> String {
    if report.changes.is_empty() {
        return String::new();
    }
    let header = ["NAMESPACE", "NAME", "BEFORE", "AFTER", "CHANGE", "REASON"];
    let mut rows: Vec<[String; 6]> = vec![header.map(str::to_owned)];
    for change in &report.changes {
        let (namespace, name) = change.key.split_once('/').unwrap_or(("", &change.key));
        rows.push([
            namespace.to_owned(),
            name.to_owned(),
            addresses(change.before.as_ref(), "<none>"),
            addresses(change.after.as_ref(), "<deleted>"),
            change.change.to_owned(),
            reasons(change),
        ]);
    }
    let mut widths = [0usize; 6];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (index, (cell, width)) in row.iter().zip(widths).enumerate() {
            if index + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}   ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_and_documents_become_lines_and_status_is_dropped() {
        let yaml = "\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: shop}
  spec: {type: LoadBalancer}
  status: {loadBalancer: {ingress: [{ip: 10.0.0.1}]}}
---
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: p}
spec: {addresses: [10.0.0.0/30]}
";
        let lines = parse_apply("f.yaml", yaml).unwrap();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with(r#"{"object":{"apiVersion":"v1","kind":"Service""#));
        assert!(!lines[0].contains("status"));
        assert!(lines[1].contains("IPAddressPool"));
    }

    #[test]
    fn bad_files_name_the_document() {
        let error = parse_apply("f.yaml", "kind: Deployment\napiVersion: apps/v1\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("f.yaml: document 1: cannot apply kind \"Deployment\""),
            "{error}"
        );
        let error = parse_apply("f.json", "{\"kind\": ")
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("f.json: not valid JSON"), "{error}");
        let error = parse_apply("f.yaml", "---\n").unwrap_err().to_string();
        assert_eq!(error, "f.yaml: no object to apply");
        let error = parse_apply(
            "f.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {namespace: x}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(error.starts_with("f.yaml: document 1: "), "{error}");
    }

    #[test]
    fn deletions() {
        let line = parse_delete("svc/web").unwrap();
        assert!(line.contains(r#""namespace":"default""#), "{line}");
        assert!(parse_delete("ipaddresspool/metallb-system/p")
            .unwrap()
            .contains("IPAddressPool"));
        assert!(parse_delete("ns/shop").unwrap().contains("Namespace"));
        for cilium in ["lbippool/blue", "CiliumLoadBalancerIPPool/blue"] {
            let line = parse_delete(cilium).unwrap();
            assert!(
                matches!(decode_event(&line), Ok(crate::WatchEvent::Deleted(target))
                    if target.kind == crate::Kind::CiliumPool && target.name == "blue"),
                "{line}"
            );
        }
        let both = "\
apiVersion: cilium.io/v2alpha1
kind: CiliumLoadBalancerIPPool
metadata: {name: blue}
spec: {blocks: [{cidr: 10.0.0.0/24}]}
---
apiVersion: cilium.io/v2
kind: CiliumLoadBalancerIPPool
metadata: {name: green}
";
        assert_eq!(parse_apply("f.yaml", both).unwrap().len(), 2);
        for bad in ["web", "ns/a/b", "deployment/x", "svc/", "a/b/c/d"] {
            assert!(parse_delete(bad).is_err(), "{bad}");
        }
    }
}
