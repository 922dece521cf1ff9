//! The `IPAddressPool` object (`metallb.io/v1beta1`).

use allocator::spec::IPAddressPoolSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// The API version of [`IPAddressPool`].
pub const POOL_API_VERSION: &str = "metallb.io/v1beta1";
/// The kind of [`IPAddressPool`].
pub const POOL_KIND: &str = "IPAddressPool";

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
