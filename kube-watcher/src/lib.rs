//! The allocator plugin's host on a real cluster. It owns everything that
//! talks to the Kubernetes API, and no allocation logic:
//!
//! - `watch`: kube-runtime watchers whose reflector stores are the
//!   manager's shared cache ([`KubeStore`]), and a `Driver` per kind that
//!   turns watch events, relists included, into subscriber chain calls; the
//!   initial lists of Services, Namespaces and (when served)
//!   `IPAddressPool`s and `CiliumLoadBalancerIPPool`s end with the manager
//!   marked synced.
//! - `client`: `manager::Client` over the API: the pool annotation by a
//!   merge patch, the addresses, the `metallb.io/AddressAssigned`
//!   condition and Cilium's `cilium.io/IPAMRequestSatisfied` by a strategic
//!   merge patch of the status subresource (other conditions stay), 409
//!   retried, Events through kube-runtime's recorder.
//! - `lean`: what the cache keeps of each object (what the rules read).
//! - `lease`: leader election on a `coordination.k8s.io/v1` Lease, with a
//!   write gate that shuts the moment leadership may be lost.
//! - `host`: the wiring: one Manager and controller per leadership term,
//!   rebuilt from the cache and the Services' statuses.
//! - `pool_status`, [`metrics`]: MetalLB's pool status fields, the
//!   pools' `Accepted` condition and Warning Events, Cilium's four
//!   `cilium.io/` conditions on `CiliumLoadBalancerIPPool`s, allocator
//!   metrics (per pool and kind), `/metrics`, `/healthz`, `/readyz`.
//! - `config_state`: MetalLB's `ConfigurationState`, where its CRD exists.
//! - [`logging`]: the log subscriber (text, no colour unless on a
//!   terminal).
//! - `retry`: watch retries that back off, and log a failure once.
//! - [`record`]: `kube-watcher record`, a cluster as a replay stream (docs/replay.md).
//! - [`crd`]: the `IPAddressPool` CustomResource, from the allocator's spec
//!   types, and `deploy/crd/crd.yaml`.
//! - `cilium`: Cilium's `CiliumLoadBalancerIPPool`, watched once
//!   discovery finds it served (`cilium.io/v2`, else `v2alpha1`).
//! - `discovered`: the watch of a kind whose CRD may be missing (Cilium's
//!   pools, and `IPAddressPool`s on a Cilium-only cluster): asked of
//!   discovery again periodically, so a CRD installed later is noticed.
//!
//! Start with [`Host::start`]; `src/main.rs` is the command line.

pub(crate) mod cilium;
pub(crate) mod client;
pub(crate) mod config_state;
pub mod crd;
pub(crate) mod discovered;
pub(crate) mod events;
pub(crate) mod host;
pub(crate) mod lean;
pub(crate) mod lease;
pub mod logging;
pub mod metrics;
pub(crate) mod pool_status;
pub mod record;
pub(crate) mod retry;
pub(crate) mod store;
pub(crate) mod watch;

pub use crd::{IPAddressPoolResource, IPAddressPoolStatus, PoolSpec};
pub use host::{Host, HostConfig};
pub use lease::LeaseConfig;
pub use metrics::Metrics;
pub use retry::WatchBackoff;
pub use store::KubeStore;
pub use watch::SyncTracker;
