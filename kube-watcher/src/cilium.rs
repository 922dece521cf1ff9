//! Cilium's `CiliumLoadBalancerIPPool` (docs/cilium.md §2): the object as
//! the host watches and caches it, and its watch at the version the API
//! server serves.
//!
//! The CRD may be missing (a MetalLB-only cluster) or installed later, and
//! a cluster serves `cilium.io/v2`, or only `v2alpha1` (Cilium ≤ v1.15):
//! discovery (`/apis/cilium.io/v2`, then `/apis/cilium.io/v2alpha1`) says
//! which, as [`crate::discovered`] does for every resource whose CRD may be
//! missing, asked again every `HostConfig::discovery_period`.
//!
//! The watch itself is of `DynamicObject`s at the discovered version, each
//! decoded into [`CiliumPoolResource`] (one cached type whatever the
//! version: both have one schema), so the reflector store and the
//! [`crate::watch::Driver`] are those of every other kind.

use std::borrow::Cow;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::ClusterResourceScope;
use kube::runtime::watcher;
use kube::Resource;
use serde::{Deserialize, Serialize};

use crate::discovered::Served;
use crate::lean;

/// The API group.
pub(crate) const GROUP: &str = "cilium.io";
/// The kind.
pub(crate) const KIND: &str = "CiliumLoadBalancerIPPool";
/// The resource, as discovery lists it.
pub(crate) const PLURAL: &str = "ciliumloadbalancerippools";
/// The versions watched, preferred first: `v2` is the storage version,
/// `v2alpha1` what older clusters serve (docs/cilium.md §2.1).
pub(crate) const VERSIONS: [&str; 2] = ["v2", "v2alpha1"];
/// How often discovery is asked again while the CRD is not served.
pub(crate) const DISCOVERY_PERIOD: Duration = Duration::from_secs(300);

/// A `CiliumLoadBalancerIPPool` as cached: the object the subscriber chains
/// take (its status kept raw, so a read-modify-write of its conditions
/// keeps every other writer's condition exactly as it was), wrapped to be a
/// kube [`Resource`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CiliumPoolResource(pub subscriber::CiliumLoadBalancerIPPool);

// By hand rather than kube's derive: the derive ties the type to one
// version, and the object is the same at both. The static version is `v2`;
// requests go through an `ApiResource` of the served version instead.
impl Resource for CiliumPoolResource {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(KIND)
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSIONS[0])
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(PLURAL)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// The pool as the subscriber chains and the manager take it.
pub(crate) fn to_subscriber(pool: &CiliumPoolResource) -> subscriber::CiliumLoadBalancerIPPool {
    pool.0.clone()
}

/// The resource at `version` (`v2` or `v2alpha1`).
pub(crate) fn api_resource(version: &str) -> ApiResource {
    SERVED.resource(version)
}

/// The resource, for discovery.
pub(crate) static SERVED: Served = Served {
    kind: KIND,
    group: GROUP,
    plural: PLURAL,
    versions: &VERSIONS,
    when_missing: "",
};

/// A pool object of the watch, decoded and trimmed; `None` (logged) when
/// it does not decode.
fn decode(object: DynamicObject) -> Option<CiliumPoolResource> {
    let decoded =
        serde_json::to_value(&object).and_then(serde_json::from_value::<CiliumPoolResource>);
    match decoded {
        Ok(mut pool) => {
            lean::cilium_pool(&mut pool);
            Some(pool)
        }
        Err(error) => {
            tracing::warn!(name = ?object.metadata.name, %error, "a CiliumLoadBalancerIPPool that does not decode is skipped");
            None
        }
    }
}

/// The watch event of the decoded object (list markers as they are).
fn decode_event(
    event: watcher::Event<DynamicObject>,
) -> Option<watcher::Event<CiliumPoolResource>> {
    match event {
        watcher::Event::Init => Some(watcher::Event::Init),
        watcher::Event::InitDone => Some(watcher::Event::InitDone),
        watcher::Event::InitApply(object) => decode(object).map(watcher::Event::InitApply),
        watcher::Event::Apply(object) => decode(object).map(watcher::Event::Apply),
        watcher::Event::Delete(object) => decode(object).map(watcher::Event::Delete),
    }
}

/// The watch of the pools at `version`, decoded.
pub(crate) fn watch_stream(
    client: kube::Client,
    version: &str,
    config: watcher::Config,
) -> impl Stream<Item = Result<watcher::Event<CiliumPoolResource>, watcher::Error>> + Send {
    let api: Api<DynamicObject> = Api::all_with(client, &api_resource(version));
    watcher(api, config).filter_map(|item| {
        std::future::ready(match item {
            Ok(event) => decode_event(event).map(Ok),
            Err(error) => Some(Err(error)),
        })
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn decodes_either_version_into_one_type() {
        for api_version in ["cilium.io/v2", "cilium.io/v2alpha1"] {
            let object: DynamicObject = serde_json::from_value(json!({
                "apiVersion": api_version, "kind": KIND,
                "metadata": {"name": "blue", "generation": 2,
                             "annotations": {"a": "b"},
                             "managedFields": [{"manager": "kubectl"}]},
                "spec": {"blocks": [{"cidr": "10.0.0.0/24"}], "allowFirstLastIPs": "No"},
                "status": {"conditions": [{"type": "other", "status": "True"}]}
            }))
            .unwrap();
            let Some(watcher::Event::Apply(pool)) = decode_event(watcher::Event::Apply(object))
            else {
                panic!("not decoded");
            };
            assert_eq!(pool.0.metadata.name.as_deref(), Some("blue"));
            assert_eq!(pool.0.metadata.generation, Some(2));
            assert!(pool.0.metadata.annotations.is_none());
            assert!(pool.0.metadata.managed_fields.is_none());
            assert_eq!(pool.0.spec.blocks.len(), 1);
            assert_eq!(
                pool.0.status.unwrap()["conditions"][0]["type"],
                json!("other")
            );
        }
    }

    #[test]
    fn a_pool_that_does_not_decode_is_skipped() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cilium.io/v2", "kind": KIND,
            "metadata": {"name": "bad"},
            "spec": {"blocks": "not a list"}
        }))
        .unwrap();
        assert!(decode_event(watcher::Event::Apply(object)).is_none());
        assert!(matches!(
            decode_event(watcher::Event::InitDone),
            Some(watcher::Event::InitDone)
        ));
    }
}
