//! Serde types of the `IPAddressPool` spec (`metallb.io/v1beta1`), exactly as a
//! cluster returns them (camelCase). Values are kept raw: validation is the
//! allocator's `Pool::parse`, so a bad address is a rejected pool, not a
//! decode error.
//!
//! With the `schema` feature the types also derive `schemars::JsonSchema`, so
//! a host can generate the CustomResourceDefinition from them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `spec` of an `IPAddressPool`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct IPAddressPoolSpec {
    /// Prefixes (`a.b.c.d/n`), `first-last` ranges or single addresses.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_assign: Option<bool>,
    /// Default false: when true, IPv4 `.0` and `.255` are never used.
    #[serde(
        default,
        rename = "avoidBuggyIPs",
        skip_serializing_if = "Option::is_none"
    )]
    pub avoid_buggy_ips: Option<bool>,
    /// Present: the pool is pinned to the Services it matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_allocation: Option<ServiceAllocationSpec>,
}

/// `spec.serviceAllocation`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ServiceAllocationSpec {
    /// 1 is the highest; 0 or unset is the lowest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_selectors: Vec<LabelSelectorSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_selectors: Vec<LabelSelectorSpec>,
}

/// A Kubernetes label selector, kept raw (operators are checked at parse).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirementSpec>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirementSpec {
    pub key: String,
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}
