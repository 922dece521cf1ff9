//! The whole pool objects (feature `objects`): `metadata`, `spec` and an
//! opaque `status`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::cilium::CiliumLoadBalancerIPPoolSpec;
use crate::metallb::IPAddressPoolSpec;

/// The API version of [`IPAddressPool`].
pub const POOL_API_VERSION: &str = "metallb.io/v1beta1";
/// The kind of [`IPAddressPool`].
pub const POOL_KIND: &str = "IPAddressPool";

/// The kind of [`CiliumLoadBalancerIPPool`].
pub const CILIUM_POOL_KIND: &str = "CiliumLoadBalancerIPPool";
/// The storage API version of [`CiliumLoadBalancerIPPool`].
pub const CILIUM_POOL_API_VERSION: &str = "cilium.io/v2";
/// The older API version, still served, with the same schema.
pub const CILIUM_POOL_API_VERSION_V2ALPHA1: &str = "cilium.io/v2alpha1";

/// MetalLB's address pool object. Its identity is `metadata.name`; the
/// namespace it lives in does not matter to allocation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressPool {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: IPAddressPoolSpec,
    /// Written by hosts on a cluster; kept opaque here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// Cilium's address pool object (cluster-scoped; docs/cilium.md §2.1).
/// Pool names are one name space with [`IPAddressPool`]s (docs/allocation.md
/// §3).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CiliumLoadBalancerIPPool {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: CiliumLoadBalancerIPPoolSpec,
    /// Its conditions (docs/cilium.md §2.8); kept opaque here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cilium_pool_object_decodes() {
        let pool: CiliumLoadBalancerIPPool = serde_json::from_value(serde_json::json!({
            "apiVersion": CILIUM_POOL_API_VERSION_V2ALPHA1,
            "kind": CILIUM_POOL_KIND,
            "metadata": {"name": "blue", "creationTimestamp": "2022-10-16T12:00:00Z"},
            "spec": {"blocks": [{"cidr": "10.0.0.0/24"}]},
            "status": {"conditions": []}
        }))
        .unwrap();
        assert_eq!(pool.metadata.name.as_deref(), Some("blue"));
        assert_eq!(pool.spec.blocks.len(), 1);
        assert!(pool.status.is_some());
    }
}
