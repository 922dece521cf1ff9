//! Printing a [`ReplayResult`] (docs/replay.md §2–§3): a kubectl-like table, the
//! JSON document, or the same document as YAML.

use std::collections::{BTreeSet, HashMap};

use manager::CONDITION_TYPE;
use std::fmt;
use std::io::Write;
use std::str::FromStr;

use crate::result::{ReplayResult, ServiceResult};

/// How to print a result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputFormat {
    /// One row per LoadBalancer Service, as kubectl prints.
    #[default]
    Table,
    /// The §3 document, pretty-printed with two spaces.
    Json,
    /// The §3 document as YAML.
    Yaml,
}

impl FromStr for OutputFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "table" => Ok(OutputFormat::Table),
            "json" => Ok(OutputFormat::Json),
            "yaml" => Ok(OutputFormat::Yaml),
            other => Err(format!(
                "unknown output format {other:?} (table, json or yaml)"
            )),
        }
    }
}

impl fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutputFormat::Table => "table",
            OutputFormat::Json => "json",
            OutputFormat::Yaml => "yaml",
        })
    }
}

/// A result that could not be serialized.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// JSON serialization failed.
    #[error("cannot write the result as JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// YAML serialization failed.
    #[error("cannot write the result as YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    /// The output could not be written (a closed pipe, a full disk).
    #[error("cannot write the result: {0}")]
    Io(#[from] std::io::Error),
}

impl OutputError {
    /// Whether the reader went away (`| head`): not an error of the replay.
    pub fn is_broken_pipe(&self) -> bool {
        let kind = match self {
            OutputError::Json(error) => error.io_error_kind(),
            OutputError::Io(error) => Some(error.kind()),
            OutputError::Yaml(_) => None,
        };
        kind == Some(std::io::ErrorKind::BrokenPipe)
    }
}

/// The result in `format`, ending in a newline (the table is empty when
/// there is no LoadBalancer Service, as kubectl prints nothing then).
pub fn render(result: &ReplayResult, format: OutputFormat) -> Result<String, OutputError> {
    match format {
        OutputFormat::Table => Ok(render_table(result)),
        OutputFormat::Json => render_json(result),
        OutputFormat::Yaml => render_yaml(result),
    }
}

/// The §3 document as pretty JSON (two-space indent) and a newline.
pub fn render_json(result: &ReplayResult) -> Result<String, OutputError> {
    let mut text = Vec::new();
    write_result(result, OutputFormat::Json, &mut text)?;
    // serde_json writes UTF-8 only.
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// The §3 document as YAML.
pub fn render_yaml(result: &ReplayResult) -> Result<String, OutputError> {
    Ok(serde_yaml_ng::to_string(result)?)
}

/// Writes the result in `format` to `out` as it is serialized: the
/// document of 100k Services is ~50 MB of JSON, which need not be held
/// (nor its buffer grown by doubling) before the first byte goes out.
pub fn write_result(
    result: &ReplayResult,
    format: OutputFormat,
    out: &mut impl Write,
) -> Result<(), OutputError> {
    match format {
        OutputFormat::Table => out.write_all(render_table(result).as_bytes())?,
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, result)?;
            out.write_all(b"\n")?;
        }
        OutputFormat::Yaml => serde_yaml_ng::to_writer(&mut *out, result)?,
    }
    Ok(())
}

/// Header of the table's columns.
const HEADER: [&str; 6] = [
    "NAMESPACE",
    "NAME",
    "EXTERNAL-IP",
    "POOL",
    "WARNING",
    "REASON",
];
/// Spaces between columns, as kubectl.
const PADDING: usize = 3;

/// What the table shows beside the result (docs/replay.md §2.1).
#[derive(Clone, Copy, Debug, Default)]
pub struct TableNotes<'a> {
    /// The addresses each Service first showed in the stream: a Service
    /// whose addresses changed is marked `(was ...)`.
    pub first_ips: Option<&'a HashMap<String, Vec<String>>>,
    /// The Services of another `loadBalancerClass`: left out, or with
    /// `all` listed as `other class`.
    pub other_class: Option<&'a BTreeSet<String>>,
    pub all: bool,
}

/// kubectl-like rows: NAMESPACE, NAME, EXTERNAL-IP (comma-separated,
/// `<pending>` when none), POOL (`<none>` when none), the reason of the
/// last Warning Event of the Service (empty when none) and the reason of
/// its `metallb.io/AddressAssigned` condition when that is `False`.
pub fn render_table(result: &ReplayResult) -> String {
    render_table_with(result, TableNotes::default())
}

/// [`render_table`] with the marks of `notes`.
pub fn render_table_with(result: &ReplayResult, notes: TableNotes<'_>) -> String {
    if result.services.is_empty() {
        return String::new();
    }
    let mut last_warning: HashMap<&str, &str> = HashMap::new();
    for event in result.events.iter().filter(|e| e.event_type == "Warning") {
        last_warning.insert(&event.key, &event.reason);
    }
    let mut rows: Vec<[String; 6]> = vec![HEADER.map(str::to_owned)];
    for service in &result.services {
        let other = notes
            .other_class
            .is_some_and(|others| others.contains(&service.key));
        if other && !notes.all {
            continue;
        }
        rows.push(table_row(service, &last_warning, notes, other));
    }
    if rows.len() == 1 {
        return String::new();
    }
    let mut widths = [0usize; 6];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for row in &rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(widths) {
            line.push_str(cell);
            let pad = width.saturating_sub(cell.chars().count()) + PADDING;
            line.extend(std::iter::repeat_n(' ', pad));
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// One Service's row.
fn table_row(
    service: &ServiceResult,
    last_warning: &HashMap<&str, &str>,
    notes: TableNotes<'_>,
    other_class: bool,
) -> [String; 6] {
    let (namespace, name) = service
        .key
        .split_once('/')
        .unwrap_or(("", service.key.as_str()));
    let mut ips = if service.ips.is_empty() {
        "<pending>".to_owned()
    } else {
        service.ips.join(",")
    };
    let was = notes.first_ips.and_then(|first| first.get(&service.key));
    if let Some(was) = was.filter(|was| !other_class && **was != service.ips) {
        ips.push_str(&format!(" (was {})", was.join(",")));
    }
    let reason = if other_class {
        "other class".to_owned()
    } else {
        service
            .conditions
            .iter()
            .find(|c| c.condition_type == CONDITION_TYPE && c.status == "False")
            .map(|c| c.reason.clone())
            .unwrap_or_default()
    };
    [
        namespace.to_owned(),
        name.to_owned(),
        ips,
        service.pool.clone().unwrap_or_else(|| "<none>".to_owned()),
        last_warning
            .get(service.key.as_str())
            .map(|reason| (*reason).to_owned())
            .unwrap_or_default(),
        reason,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::EventRecord;
    use crate::result::{
        CiliumPoolResult, ConditionResult, Count, FamilyResult, PoolResult, RejectedPoolResult,
        ServiceResult, MAX_SAFE_INTEGER,
    };

    fn result() -> ReplayResult {
        let event = |key: &str, event_type: &str, reason: &str| EventRecord {
            key: key.to_owned(),
            event_type: event_type.to_owned(),
            reason: reason.to_owned(),
            message: format!("{reason} message"),
            line: 7,
        };
        ReplayResult {
            services: vec![
                ServiceResult {
                    key: "default/web".into(),
                    ips: vec!["192.168.10.0".into(), "fc00::1".into()],
                    pool: Some("default".into()),
                    conditions: vec![],
                },
                ServiceResult {
                    key: "prod/database".into(),
                    ips: vec![],
                    pool: None,
                    conditions: vec![],
                },
            ],
            events: vec![
                event("default/web", "Normal", "IPAllocated"),
                event("prod/database", "Warning", "LoadBalancerFailed"),
                event("prod/database", "Warning", "AllocationFailed"),
                event("prod/database", "Normal", "ClearAssignment"),
            ],
            pools: vec![PoolResult {
                name: "default".into(),
                kind: "IPAddressPool".into(),
                ipv4: FamilyResult {
                    total: Count::from(256),
                    assigned: Count::from(1),
                },
                ipv6: FamilyResult {
                    total: Count::from(1 << 64),
                    assigned: Count::from(MAX_SAFE_INTEGER),
                },
            }],
            rejected_pools: vec![RejectedPoolResult {
                name: "old".into(),
                kind: "CiliumLoadBalancerIPPool".into(),
                reason: "overlaps".into(),
            }],
            cilium_pools: vec![CiliumPoolResult {
                name: "old".into(),
                conditions: vec![ConditionResult {
                    condition_type: "cilium.io/IPsTotal".into(),
                    status: "Unknown".into(),
                    reason: "noreason".into(),
                    message: "340282366920938463463374607431768211456".into(),
                }],
            }],
        }
    }

    #[test]
    fn table_is_aligned_like_kubectl() {
        assert_eq!(
            render_table(&result()),
            "\
NAMESPACE   NAME       EXTERNAL-IP            POOL      WARNING            REASON
default     web        192.168.10.0,fc00::1   default
prod        database   <pending>              <none>    AllocationFailed
"
        );
        assert_eq!(render_table(&ReplayResult::default()), "");
    }

    /// docs/replay.md §2.1: the condition's reason while False, a moved
    /// address marked with what it was, another class left out unless all.
    #[test]
    fn table_marks_reasons_moves_and_other_classes() {
        let mut result = result();
        if let Some(database) = result.services.get_mut(1) {
            database.conditions.push(ConditionResult {
                condition_type: CONDITION_TYPE.to_owned(),
                status: "False".to_owned(),
                reason: "PoolExhausted".to_owned(),
                message: "no".to_owned(),
            });
        }
        let first_ips: HashMap<String, Vec<String>> =
            [("default/web".to_owned(), vec!["192.168.20.0".to_owned()])].into();
        let other: BTreeSet<String> = ["prod/database".to_owned()].into();
        let notes = TableNotes {
            first_ips: Some(&first_ips),
            other_class: None,
            all: false,
        };
        assert_eq!(
            render_table_with(&result, notes),
            "\
NAMESPACE   NAME       EXTERNAL-IP                               POOL      WARNING            REASON
default     web        192.168.10.0,fc00::1 (was 192.168.20.0)   default
prod        database   <pending>                                 <none>    AllocationFailed   PoolExhausted
"
        );
        let left_out = TableNotes {
            other_class: Some(&other),
            ..notes
        };
        assert!(!render_table_with(&result, left_out).contains("database"));
        let all = TableNotes {
            all: true,
            ..left_out
        };
        assert!(render_table_with(&result, all)
            .lines()
            .any(|line| line.starts_with("prod") && line.ends_with("other class")));
    }

    #[test]
    fn json_keeps_key_order_and_writes_big_counts_as_strings() {
        let json = render_json(&result()).unwrap();
        let services = json.find("\"services\"").unwrap();
        let events = json.find("\"events\"").unwrap();
        let pools = json.find("\"pools\"").unwrap();
        let rejected = json.find("\"rejected_pools\"").unwrap();
        let cilium = json.find("\"cilium_pools\"").unwrap();
        assert!(services < events && events < pools && pools < rejected && rejected < cilium);
        // Cilium's counts are condition messages: exact decimal text.
        assert!(json.contains("\"message\": \"340282366920938463463374607431768211456\""));
        assert!(
            json.contains("\"total\": \"18446744073709551616\""),
            "{json}"
        );
        assert!(json.contains("\"assigned\": 9007199254740991"), "{json}");
        assert!(json.contains("\n  \"services\": [\n    {\n      \"key\""));
        assert!(json.contains("\"pool\": null"));
        assert!(json.ends_with("}\n"));
        let back: ReplayResult = serde_json::from_str(&json).unwrap();
        assert_eq!(back, result());
    }

    #[test]
    fn yaml_is_the_same_document() {
        let yaml = render_yaml(&result()).unwrap();
        assert!(yaml.starts_with("services:\n"), "{yaml}");
        assert!(yaml.contains("total: '18446744073709551616'"), "{yaml}");
        let back: ReplayResult = serde_yaml_ng::from_str(&yaml).unwrap();
        assert_eq!(back, result());
    }

    #[test]
    fn formats_parse() {
        assert_eq!("yaml".parse(), Ok(OutputFormat::Yaml));
        assert!("xml".parse::<OutputFormat>().is_err());
    }
}
