//! Serde types of the `CiliumLoadBalancerIPPool` spec (`cilium.io/v2`, and
//! `v2alpha1` with the same schema), exactly as a cluster returns them
//! (docs/cilium.md §2.1). Values are kept raw: validation is the
//! allocator's `Pool::parse_cilium`, so a bad block is a rejected pool, not
//! a decode error.

use serde::{Deserialize, Serialize};

use crate::metallb::LabelSelectorSpec;

/// `spec` of a `CiliumLoadBalancerIPPool`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CiliumLoadBalancerIPPoolSpec {
    /// `cidr`, or `start`/`stop`, per block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<CiliumBlock>,
    /// Legacy `v2alpha1` (Cilium ≤ v1.15): read as blocks before `blocks`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<CiliumBlock>,
    /// `None` for absent or `null` (serves every Service, unpinned);
    /// `Some` even for `{}` (matches all, pinned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_selector: Option<LabelSelectorSpec>,
    /// Default false: when true, no new address comes from the pool.
    #[serde(default)]
    pub disabled: bool,
    /// "Yes", "No" or absent (= "Yes"); any other string rejects the pool.
    #[serde(
        default,
        rename = "allowFirstLastIPs",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_first_last_ips: Option<String>,
}

/// One entry of `spec.blocks` (or the legacy `spec.cidrs`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CiliumBlock {
    /// A prefix; absent or empty: the block is `start`..`stop`. Go clients
    /// send `"cidr": ""` for a range block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    /// Absent or empty: the block is the single address `start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_every_field_and_ignores_unknown_ones() {
        let spec: CiliumLoadBalancerIPPoolSpec = serde_json::from_value(serde_json::json!({
            "blocks": [{"cidr": "10.0.0.0/24"}, {"cidr": "", "start": "10.0.1.1", "stop": "10.0.1.9"}],
            "cidrs": [{"cidr": "10.0.2.0/24"}],
            "serviceSelector": {},
            "disabled": true,
            "allowFirstLastIPs": "No",
            "somethingNew": 1
        }))
        .unwrap();
        assert_eq!(spec.blocks.len(), 2);
        assert_eq!(spec.blocks[1].cidr.as_deref(), Some(""));
        assert_eq!(spec.blocks[1].stop.as_deref(), Some("10.0.1.9"));
        assert_eq!(spec.cidrs[0].cidr.as_deref(), Some("10.0.2.0/24"));
        assert_eq!(spec.service_selector, Some(LabelSelectorSpec::default()));
        assert!(spec.disabled);
        assert_eq!(spec.allow_first_last_ips.as_deref(), Some("No"));

        let null: CiliumLoadBalancerIPPoolSpec =
            serde_json::from_value(serde_json::json!({"serviceSelector": null})).unwrap();
        assert_eq!(null, CiliumLoadBalancerIPPoolSpec::default());
        let back = serde_json::to_value(&spec).unwrap();
        assert_eq!(back["allowFirstLastIPs"], "No");
    }
}
