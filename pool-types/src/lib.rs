//! The Kubernetes object types of address pools, MetalLB's `IPAddressPool`
//! and Cilium's `CiliumLoadBalancerIPPool`, in a small crate of their own
//! shared by every crate, so that `subscriber` (and any watcher) need not
//! depend on the allocator: the allocator parses the specs
//! (docs/allocation.md §3), the watchers decode the objects.
//!
//! Values are kept raw, exactly as a cluster returns them: validation is the
//! allocator's parsers' job, so a bad value is a rejected pool, not a decode
//! error. Unknown fields are ignored.
//!
//! Features: `schema` derives `schemars::JsonSchema` on the spec types (for
//! CRD generation); `objects` adds the whole objects (`metadata`, `spec`,
//! `status`), which need k8s-openapi.

pub mod cilium;
pub mod metallb;
#[cfg(feature = "objects")]
mod objects;

#[cfg(feature = "objects")]
pub use objects::{
    CiliumLoadBalancerIPPool, IPAddressPool, CILIUM_POOL_API_VERSION,
    CILIUM_POOL_API_VERSION_V2ALPHA1, CILIUM_POOL_KIND, POOL_API_VERSION, POOL_KIND,
};
