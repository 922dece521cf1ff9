//! MetalLB's legacy configuration file (docs/allocation.md §3.2): YAML with
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
//! makes the file invalid, with the file and the entry named (docs/replay.md
//! §2.2). Overlaps with pool objects are the controller's business.
//!
//! `--config` also takes the ConfigMap that wraps such a file (its
//! `data.config`), and pool objects of either kind (`IPAddressPool`,
//! `CiliumLoadBalancerIPPool` of `cilium.io/v2` or `v2alpha1`) in YAML or
//! JSON: one object, several YAML documents, or a `List` (as
//! `kubectl get -o yaml` prints). Pool names are one name space across
//! both kinds (docs/cilium.md §2.6), so a name may appear once per file.
//! Objects of other kinds (an `L2Advertisement` beside the pools) are
//! skipped. A file that yields no pool is an error.

use std::collections::HashSet;
use std::path::Path;

use allocator::spec::IPAddressPoolSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_yaml_ng::Value;
use subscriber::{
    CiliumLoadBalancerIPPool, IPAddressPool, CILIUM_POOL_API_VERSION,
    CILIUM_POOL_API_VERSION_V2ALPHA1, CILIUM_POOL_KIND, POOL_API_VERSION, POOL_KIND,
};

use crate::stream::Object;

/// A pool of a `--config` file, of either kind.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigPool {
    IPAddressPool(Box<IPAddressPool>),
    Cilium(Box<CiliumLoadBalancerIPPool>),
}

impl ConfigPool {
    /// The pool as a stream object.
    pub fn to_object(&self) -> Object {
        match self {
            ConfigPool::IPAddressPool(pool) => Object::Pool(pool.clone()),
            ConfigPool::Cilium(pool) => Object::CiliumPool(pool.clone()),
        }
    }
}

impl From<IPAddressPool> for ConfigPool {
    fn from(pool: IPAddressPool) -> Self {
        ConfigPool::IPAddressPool(Box::new(pool))
    }
}

impl From<CiliumLoadBalancerIPPool> for ConfigPool {
    fn from(pool: CiliumLoadBalancerIPPool) -> Self {
        ConfigPool::Cilium(Box::new(pool))
    }
}

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
    /// An object of the file (a ConfigMap, a pool, a List) is unusable.
    #[error("{file}: document {document}{}: {message}", label_text(.name))]
    Object {
        file: String,
        /// 1-based position of the YAML document.
        document: usize,
        /// `Kind "name"` where the object has them.
        name: Option<String>,
        message: String,
    },
    /// The file yields no pool.
    #[error("{file}: no pool in the file: {reason}")]
    NoPool { file: String, reason: String },
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

fn label_text(label: &Option<String>) -> String {
    label
        .as_ref()
        .map(|label| format!(" ({label})"))
        .unwrap_or_default()
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

/// Reads the `--config` file at `path` (see the module documentation):
/// its pools of either kind, in file order.
pub fn load_config(path: &Path) -> Result<Vec<ConfigPool>, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: file.clone(),
        source,
    })?;
    parse_config(&file, &text)
}

/// The `IPAddressPool`s of [`load_config`] (a file of Cilium pools only
/// gives none).
pub fn load_legacy_config(path: &Path) -> Result<Vec<IPAddressPool>, ConfigError> {
    load_config(path).map(metallb_only)
}

/// The `IPAddressPool`s of [`parse_config`] (a file of Cilium pools only
/// gives none).
pub fn parse_legacy_config(file: &str, text: &str) -> Result<Vec<IPAddressPool>, ConfigError> {
    parse_config(file, text).map(metallb_only)
}

fn metallb_only(pools: Vec<ConfigPool>) -> Vec<IPAddressPool> {
    pools
        .into_iter()
        .filter_map(|pool| match pool {
            ConfigPool::IPAddressPool(pool) => Some(*pool),
            ConfigPool::Cilium(_) => None,
        })
        .collect()
}

/// What the documents of a file held, for the error when no pool is found.
#[derive(Default)]
struct Seen {
    pools: Vec<ConfigPool>,
    names: HashSet<String>,
    /// Kinds of skipped objects.
    skipped: Vec<String>,
    /// Whether a legacy configuration (or a ConfigMap with one) was found.
    legacy: bool,
}

/// Parses a `--config` file, named `file` in errors, into pool objects in
/// the order of the file: a legacy configuration, the ConfigMap that wraps
/// one, or pool objects of either kind (YAML or JSON, one object, several
/// documents, or a `List`). A file that yields no pool is an error.
pub fn parse_config(file: &str, text: &str) -> Result<Vec<ConfigPool>, ConfigError> {
    let syntax = |message: String| ConfigError::Syntax {
        file: file.to_owned(),
        message,
    };
    let mut seen = Seen::default();
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document).map_err(|e| syntax(e.to_string()))?;
        read_document(file, index + 1, value, &mut seen)?;
    }
    if seen.pools.is_empty() {
        let reason = if seen.legacy {
            "address-pools is empty".to_owned()
        } else if !seen.skipped.is_empty() {
            format!(
                "only {} (an IPAddressPool, a ConfigMap with data.config or address-pools \
                 was expected)",
                seen.skipped.join(", ")
            )
        } else {
            "no address-pools, IPAddressPool object or ConfigMap with data.config".to_owned()
        };
        return Err(ConfigError::NoPool {
            file: file.to_owned(),
            reason,
        });
    }
    Ok(seen.pools)
}

/// Where an object of a `--config` file is, for its errors.
struct At<'a> {
    file: &'a str,
    document: usize,
    /// `metadata.name`, when it has one.
    name: Option<String>,
}

impl At<'_> {
    fn error(&self, kind: &str, message: String) -> ConfigError {
        ConfigError::Object {
            file: self.file.to_owned(),
            document: self.document,
            name: Some(match &self.name {
                Some(name) => format!("{kind} {name:?}"),
                None => kind.to_owned(),
            }),
            message,
        }
    }
}

/// One YAML document (or one item of a List).
fn read_document(
    file: &str,
    document: usize,
    value: Value,
    seen: &mut Seen,
) -> Result<(), ConfigError> {
    let top = match value {
        Value::Null => return Ok(()),
        Value::Mapping(top) => top,
        _ => {
            return Err(ConfigError::Syntax {
                file: file.to_owned(),
                message: "not a mapping with address-pools, nor a Kubernetes object".to_owned(),
            })
        }
    };
    let kind = top.get("kind").and_then(Value::as_str).map(str::to_owned);
    let api_version = top
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let at = At {
        file,
        document,
        name: top
            .get("metadata")
            .and_then(|metadata| metadata.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    match kind.as_deref() {
        None => read_legacy(file, Value::Mapping(top), seen),
        Some("ConfigMap") => {
            let config = top
                .get("data")
                .and_then(|data| data.get("config"))
                .and_then(Value::as_str)
                .ok_or_else(|| at.error("ConfigMap", "has no data.config string".to_owned()))?;
            let inner: Value = serde_yaml_ng::from_str(config)
                .map_err(|e| at.error("ConfigMap", format!("data.config: {e}")))?;
            read_legacy(file, inner, seen)
        }
        Some(kind) if kind == POOL_KIND && api_version == POOL_API_VERSION => {
            read_pool(top, &at, seen)
        }
        Some(kind)
            if kind == CILIUM_POOL_KIND
                && (api_version == CILIUM_POOL_API_VERSION
                    || api_version == CILIUM_POOL_API_VERSION_V2ALPHA1) =>
        {
            read_cilium_pool(top, &at, seen)
        }
        Some(kind) if kind.ends_with("List") => {
            let items = match top.get("items") {
                Some(Value::Sequence(items)) => items.clone(),
                None | Some(Value::Null) => Vec::new(),
                Some(_) => return Err(at.error(kind, "items is not a list".to_owned())),
            };
            for item in items {
                read_document(file, document, item, seen)?;
            }
            Ok(())
        }
        Some(kind) => {
            tracing::warn!(
                file,
                document,
                kind,
                "--config: skipping an object of this kind"
            );
            seen.skipped.push(format!("{kind} objects"));
            Ok(())
        }
    }
}

/// An `IPAddressPool` object: its name must be new; its values are checked
/// by the controller, as for a pool in the stream (a bad one is listed in
/// `rejected_pools`).
fn read_pool(top: serde_yaml_ng::Mapping, at: &At<'_>, seen: &mut Seen) -> Result<(), ConfigError> {
    let pool: IPAddressPool = deserialize_object(top, at, POOL_KIND)?;
    let Some(name) = pool.metadata.name.clone().filter(|name| !name.is_empty()) else {
        return Err(at.error(POOL_KIND, "has no metadata.name".to_owned()));
    };
    if !seen.names.insert(name) {
        return Err(at.error(
            POOL_KIND,
            "a pool of this name is defined before".to_owned(),
        ));
    }
    seen.pools.push(pool.into());
    Ok(())
}

/// A `CiliumLoadBalancerIPPool` object, as [`read_pool`] reads an
/// `IPAddressPool` (one name space for both kinds).
fn read_cilium_pool(
    top: serde_yaml_ng::Mapping,
    at: &At<'_>,
    seen: &mut Seen,
) -> Result<(), ConfigError> {
    let pool: CiliumLoadBalancerIPPool = deserialize_object(top, at, CILIUM_POOL_KIND)?;
    let Some(name) = pool.metadata.name.clone().filter(|name| !name.is_empty()) else {
        return Err(at.error(CILIUM_POOL_KIND, "has no metadata.name".to_owned()));
    };
    if !seen.names.insert(name) {
        return Err(at.error(
            CILIUM_POOL_KIND,
            "a pool of this name is defined before".to_owned(),
        ));
    }
    seen.pools.push(pool.into());
    Ok(())
}

/// An object of `kind`, its errors naming the field path.
fn deserialize_object<T: serde::de::DeserializeOwned>(
    top: serde_yaml_ng::Mapping,
    at: &At<'_>,
    kind: &str,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(Value::Mapping(top)).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        let message = if path == "." {
            message
        } else {
            format!("{path}: {message}")
        };
        at.error(kind, message)
    })
}

/// A legacy configuration: its `address-pools` entries.
fn read_legacy(file: &str, document: Value, seen: &mut Seen) -> Result<(), ConfigError> {
    let syntax = |message: String| ConfigError::Syntax {
        file: file.to_owned(),
        message,
    };
    let entries = match document {
        Value::Null => return Ok(()),
        Value::Mapping(mut top) => match top.remove("address-pools") {
            None | Some(Value::Null) => return Ok(()),
            Some(Value::Sequence(entries)) => entries,
            Some(_) => return Err(syntax("address-pools is not a list".to_owned())),
        },
        _ => return Err(syntax("not a mapping with address-pools".to_owned())),
    };
    seen.legacy = true;
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
        if !seen.names.insert(pool.name.clone()) {
            return Err(error("a pool of this name is defined before".to_owned()));
        }
        let spec = IPAddressPoolSpec {
            addresses: pool.addresses,
            auto_assign: pool.auto_assign,
            avoid_buggy_ips: pool.avoid_buggy_ips,
            service_allocation: None,
        };
        allocator::Pool::parse(&pool.name, &spec).map_err(|e| error(e.to_string()))?;
        seen.pools.push(ConfigPool::from(IPAddressPool {
            metadata: ObjectMeta {
                name: Some(pool.name),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }));
    }
    Ok(())
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
    fn a_file_without_pools_is_an_error_with_the_reason() {
        let error = |text: &str| parse_legacy_config("c", text).unwrap_err().to_string();
        assert_eq!(
            error(""),
            "c: no pool in the file: no address-pools, IPAddressPool object or ConfigMap \
             with data.config"
        );
        assert_eq!(
            error("peers: []\n"),
            "c: no pool in the file: no address-pools, IPAddressPool object or ConfigMap \
             with data.config"
        );
        assert_eq!(
            error("address-pools: []\n"),
            "c: no pool in the file: address-pools is empty"
        );
        assert_eq!(
            error("apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {name: l2}\n"),
            "c: no pool in the file: only L2Advertisement objects (an IPAddressPool, a \
             ConfigMap with data.config or address-pools was expected)"
        );
        assert_eq!(
            error("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: config}\ndata: {}\n"),
            "c: document 1 (ConfigMap \"config\"): has no data.config string"
        );
    }

    #[test]
    fn a_configmap_wraps_a_legacy_configuration() {
        let text = "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: config
  namespace: metallb-system
data:
  config: |
    address-pools:
    - name: default
      protocol: layer2
      addresses: [192.168.10.0/24]
";
        let pools = parse_legacy_config("c", text).unwrap();
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].metadata.name.as_deref(), Some("default"));
        assert_eq!(pools[0].spec.addresses, ["192.168.10.0/24"]);
    }

    #[test]
    fn pool_objects_in_yaml_documents_json_and_lists() {
        let yaml = "\
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: a, namespace: metallb-system}
spec: {addresses: [10.0.0.0/24]}
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: l2}
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: b}
spec: {addresses: [10.1.0.0/24], autoAssign: false}
";
        let pools = parse_legacy_config("c", yaml).unwrap();
        let names: Vec<_> = pools
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(pools[1].spec.auto_assign, Some(false));

        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
             "metadata": {"name": "c"}, "spec": {"addresses": ["10.2.0.0/24"]}}]});
        let pools = parse_legacy_config("c.json", &list.to_string()).unwrap();
        assert_eq!(pools[0].metadata.name.as_deref(), Some("c"));
        let pretty = serde_json::to_string_pretty(&list["items"][0]).unwrap();
        assert_eq!(parse_legacy_config("c.json", &pretty).unwrap().len(), 1);

        let bad = "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: x}\nspec: {addresses: 7}\n";
        assert_eq!(
            parse_legacy_config("c", bad).unwrap_err().to_string(),
            "c: document 1 (IPAddressPool \"x\"): spec.addresses: invalid type: integer `7`, expected a sequence"
        );
        let twice = format!("{yaml}---\n{yaml}");
        assert!(parse_legacy_config("c", &twice)
            .unwrap_err()
            .to_string()
            .ends_with("a pool of this name is defined before"));
    }

    #[test]
    fn cilium_pools_of_both_versions_in_file_order_one_name_space() {
        let yaml = "\
apiVersion: cilium.io/v2alpha1
kind: CiliumLoadBalancerIPPool
metadata: {name: blue}
spec: {blocks: [{cidr: 10.0.0.0/24}], allowFirstLastIPs: \"No\"}
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: a}
spec: {addresses: [10.1.0.0/24]}
---
apiVersion: cilium.io/v2
kind: CiliumLoadBalancerIPPool
metadata: {name: green}
spec: {blocks: [{start: 10.2.0.1, stop: 10.2.0.9}], disabled: true}
";
        let pools = parse_config("c", yaml).unwrap();
        let names: Vec<String> = pools.iter().map(|pool| pool.to_object().key()).collect();
        assert_eq!(names, ["blue", "a", "green"]);
        let ConfigPool::Cilium(green) = &pools[2] else {
            panic!("{pools:?}")
        };
        assert!(green.spec.disabled);
        // The MetalLB view keeps the IPAddressPools alone.
        assert_eq!(parse_legacy_config("c", yaml).unwrap().len(), 1);

        let clash = "\
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: blue}
spec: {addresses: [10.1.0.0/24]}
---
apiVersion: cilium.io/v2
kind: CiliumLoadBalancerIPPool
metadata: {name: blue}
spec: {}
";
        assert_eq!(
            parse_config("c", clash).unwrap_err().to_string(),
            "c: document 2 (CiliumLoadBalancerIPPool \"blue\"): a pool of this name is defined before"
        );
        let bad = "apiVersion: cilium.io/v2\nkind: CiliumLoadBalancerIPPool\nmetadata: {name: x}\nspec: {blocks: 7}\n";
        assert_eq!(
            parse_config("c", bad).unwrap_err().to_string(),
            "c: document 1 (CiliumLoadBalancerIPPool \"x\"): spec.blocks: invalid type: integer `7`, expected a sequence"
        );
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
