//! MetalLB's legacy configuration file (DESIGN.md §3.2): YAML with
//! `address-pools:`, each entry becoming an `IPAddressPool` object.
//!
//! ```yaml
//! address-pools:
//! - name: default
//!   protocol: layer2        # ignored
//!   addresses: [192.168.10.0/24, 10.0.0.1-10.0.0.9]
//!   avoid-buggy-ips: true   # default false
//!   auto-assign: false      # default true
//! ```
//!
//! Other top-level keys (`peers`, `bgp-communities`) are ignored. Each entry
//! is validated as a pool on its own (addresses, ranges): an invalid entry
//! makes the file invalid, with the file and the entry named (DESIGN.md
//! §3.2). Overlaps with pool objects are the controller's business.

use std::collections::HashSet;
use std::path::Path;

use allocator::spec::IPAddressPoolSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_yaml_ng::Value;
use subscriber::IPAddressPool;

/// A legacy configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    /// The file is not YAML, or not a mapping at the top.
    #[error("{file}: {message}")]
    Syntax { file: String, message: String },
    /// One `address-pools` entry is invalid.
    #[error("{file}: address-pools[{index}]{}: {message}", name_text(.name))]
    Entry {
        file: String,
        /// 0-based position in `address-pools`.
        index: usize,
        /// The entry's name where it has one.
        name: Option<String>,
        message: String,
    },
}

fn name_text(name: &Option<String>) -> String {
    name.as_ref()
        .map(|name| format!(" ({name:?})"))
        .unwrap_or_default()
}

/// One `address-pools` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LegacyPool {
    name: String,
    /// Ignored (layer2 or bgp).
    #[serde(default)]
    #[allow(dead_code)]
    protocol: Option<Value>,
    addresses: Vec<String>,
    #[serde(default)]
    avoid_buggy_ips: Option<bool>,
    #[serde(default)]
    auto_assign: Option<bool>,
    /// Ignored (BGP only).
    #[serde(default)]
    #[allow(dead_code)]
    bgp_advertisements: Option<Value>,
}

/// Reads the legacy configuration file at `path`.
pub fn load_legacy_config(path: &Path) -> Result<Vec<IPAddressPool>, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: file.clone(),
        source,
    })?;
    parse_legacy_config(&file, &text)
}

/// Parses a legacy configuration, named `file` in errors, into pool objects
/// in the order of the file.
pub fn parse_legacy_config(file: &str, text: &str) -> Result<Vec<IPAddressPool>, ConfigError> {
    let syntax = |message: String| ConfigError::Syntax {
        file: file.to_owned(),
        message,
    };
    let document: Value = serde_yaml_ng::from_str(text).map_err(|e| syntax(e.to_string()))?;
    let entries = match document {
        Value::Null => return Ok(Vec::new()),
        Value::Mapping(mut top) => match top.remove("address-pools") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Sequence(entries)) => entries,
            Some(_) => return Err(syntax("address-pools is not a list".to_owned())),
        },
        _ => return Err(syntax("not a mapping with address-pools".to_owned())),
    };
    let mut names = HashSet::new();
    let mut pools = Vec::with_capacity(entries.len());
    for (index, entry) in entries.into_iter().enumerate() {
        let name = entry.get("name").and_then(Value::as_str).map(str::to_owned);
        let error = |message: String| ConfigError::Entry {
            file: file.to_owned(),
            index,
            name: name.clone(),
            message,
        };
        let pool: LegacyPool = serde_path_to_error::deserialize(entry).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            if path == "." {
                error(message)
            } else {
                error(format!("{path}: {message}"))
            }
        })?;
        if pool.name.is_empty() {
            return Err(error("name is empty".to_owned()));
        }
        if !names.insert(pool.name.clone()) {
            return Err(error("a pool of this name is defined before".to_owned()));
        }
        let spec = IPAddressPoolSpec {
            addresses: pool.addresses,
            auto_assign: pool.auto_assign,
            avoid_buggy_ips: pool.avoid_buggy_ips,
            service_allocation: None,
        };
        allocator::Pool::parse(&pool.name, &spec).map_err(|e| error(e.to_string()))?;
        pools.push(IPAddressPool {
            metadata: ObjectMeta {
                name: Some(pool.name),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        });
    }
    Ok(pools)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_become_pools() {
        let text = "\
peers:
- peer-address: 10.0.0.1
address-pools:
- name: default
  protocol: layer2
  addresses:
  - 192.168.10.0/24
  - 10.0.0.1 - 10.0.0.9
- name: bgp
  protocol: bgp
  addresses: [fc00::/64]
  avoid-buggy-ips: true
  auto-assign: false
  bgp-advertisements:
  - aggregation-length: 32
";
        let pools = parse_legacy_config("config.yaml", text).unwrap();
        assert_eq!(pools.len(), 2);
        assert_eq!(pools[0].metadata.name.as_deref(), Some("default"));
        assert_eq!(
            pools[0].spec.addresses,
            ["192.168.10.0/24", "10.0.0.1 - 10.0.0.9"]
        );
        assert_eq!(pools[0].spec.auto_assign, None);
        assert_eq!(pools[1].spec.avoid_buggy_ips, Some(true));
        assert_eq!(pools[1].spec.auto_assign, Some(false));
    }

    #[test]
    fn empty_files_have_no_pools() {
        assert!(parse_legacy_config("c", "").unwrap().is_empty());
        assert!(parse_legacy_config("c", "peers: []\n").unwrap().is_empty());
    }

    #[test]
    fn errors_name_the_file_and_the_entry() {
        let cases = [
            ("address-pools: [", "c.yaml: "),
            ("- a\n- b\n", "c.yaml: not a mapping with address-pools"),
            ("address-pools: 3\n", "c.yaml: address-pools is not a list"),
            (
                "address-pools:\n- name: a\n  addresses: [10.0.0.0/8]\n- name: web\n  addresses: [x]\n  auto-assign: yes\n",
                "c.yaml: address-pools[1] (\"web\"): auto-assign: invalid type: string \"yes\", expected a boolean",
            ),
            (
                "address-pools:\n- addresses: [10.0.0.0/8]\n",
                "c.yaml: address-pools[0]: missing field `name`",
            ),
            (
                "address-pools:\n- name: a\n",
                "c.yaml: address-pools[0] (\"a\"): missing field `addresses`",
            ),
            (
                "address-pools:\n- name: a\n  addresses: 10.0.0.0/8\n",
                "c.yaml: address-pools[0] (\"a\"): addresses: invalid type: string \"10.0.0.0/8\", expected a sequence",
            ),
            (
                "address-pools:\n- name: a\n  addresses: []\n  avoid-bugy-ips: true\n",
                "c.yaml: address-pools[0] (\"a\"): avoid-bugy-ips: unknown field `avoid-bugy-ips`",
            ),
            (
                "address-pools:\n- name: a\n  addresses: [10.0.0.0/8]\n- name: a\n  addresses: [10.1.0.0/16]\n",
                "c.yaml: address-pools[1] (\"a\"): a pool of this name is defined before",
            ),
            (
                "address-pools:\n- name: a\n  addresses: [10.0.0.0/8]\n- name: broken\n  addresses: [10.1.0.300]\n",
                "c.yaml: address-pools[1] (\"broken\"): address \"10.1.0.300\": \"10.1.0.300\" is not an IP address",
            ),
            (
                "address-pools:\n- name: r\n  addresses: [10.0.0.9-10.0.0.1]\n",
                "c.yaml: address-pools[0] (\"r\"): range 10.0.0.9-10.0.0.1: first address is after the last",
            ),
            (
                "address-pools:\n- name: e\n  addresses: []\n",
                "c.yaml: address-pools[0] (\"e\"): spec.addresses is empty",
            ),
            (
                "address-pools:\n- name: ''\n  addresses: []\n",
                "c.yaml: address-pools[0] (\"\"): name is empty",
            ),
        ];
        for (text, expected) in cases {
            let error = parse_legacy_config("c.yaml", text).unwrap_err().to_string();
            assert!(error.starts_with(expected), "{text:?}: {error}");
        }
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let error = load_legacy_config(Path::new("/nonexistent/metallb.yaml")).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("/nonexistent/metallb.yaml: cannot read: "),
            "{error}"
        );
    }
}
