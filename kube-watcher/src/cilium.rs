//! Cilium's `CiliumLoadBalancerIPPool` (docs/cilium.md §2): the object as
//! the host watches and caches it, discovery of the version the API server
//! serves, and the watch that starts once it does.
//!
//! The CRD may be missing (a MetalLB-only cluster) or installed later, and
//! a cluster serves `cilium.io/v2`, or only `v2alpha1` (Cilium ≤ v1.15):
//! discovery (`/apis/cilium.io/v2`, then `/apis/cilium.io/v2alpha1`) says
//! which, and is asked again every `HostConfig::cilium_discovery_period`
//! until one serves `ciliumloadbalancerippools`. A missing CRD is no error:
//! it is logged at INFO once, and the kind counts as listed (there is
//! nothing to list) so the manager's sync does not wait for it. A failing
//! discovery is retried with the watch backoff and holds the sync back, as
//! a failing list would: a sync without the Cilium pools would release the
//! addresses their Services hold.
//!
//! The watch itself is of `DynamicObject`s at the discovered version, each
//! decoded into [`CiliumPoolResource`] (one cached type whatever the
//! version: both have one schema), so the reflector store and the
//! [`Driver`] are those of every other kind.

use std::borrow::Cow;
use std::time::Duration;

use allocator::cilium::CiliumLoadBalancerIPPoolSpec;
use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::ClusterResourceScope;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use kube::Resource;
use serde::{Deserialize, Serialize};
use subscriber::Handler;
use tokio_util::sync::CancellationToken;

use crate::lean;
use crate::retry::{with_backoff, WatchBackoff};
use crate::watch::{Driver, SyncTracker};

/// The API group.
pub const GROUP: &str = "cilium.io";
/// The kind.
pub const KIND: &str = "CiliumLoadBalancerIPPool";
/// The resource, as discovery lists it.
pub const PLURAL: &str = "ciliumloadbalancerippools";
/// The versions watched, preferred first: `v2` is the storage version,
/// `v2alpha1` what older clusters serve (docs/cilium.md §2.1).
pub const VERSIONS: [&str; 2] = ["v2", "v2alpha1"];
/// How often discovery is asked again while the CRD is not served.
pub const DISCOVERY_PERIOD: Duration = Duration::from_secs(300);

/// A `CiliumLoadBalancerIPPool` as cached: the spec as Cilium defines it
/// and the status kept raw, so a read-modify-write of its conditions keeps
/// every other writer's condition exactly as it was.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CiliumPoolResource {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: CiliumLoadBalancerIPPoolSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

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
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The pool as the subscriber chains and the manager take it.
pub fn to_subscriber(pool: &CiliumPoolResource) -> subscriber::CiliumLoadBalancerIPPool {
    subscriber::CiliumLoadBalancerIPPool {
        metadata: pool.metadata.clone(),
        spec: pool.spec.clone(),
        status: pool.status.clone(),
    }
}

/// The resource at `version` (`v2` or `v2alpha1`).
pub fn api_resource(version: &str) -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: version.to_owned(),
        api_version: format!("{GROUP}/{version}"),
        kind: KIND.to_owned(),
        plural: PLURAL.to_owned(),
    }
}

/// The version of [`VERSIONS`] (preferred first) whose discovery document
/// lists `ciliumloadbalancerippools`; `None` when neither does (a group
/// version that is not served answers 404).
pub async fn discover(client: &kube::Client) -> Result<Option<&'static str>, kube::Error> {
    for version in VERSIONS {
        match client
            .list_api_group_resources(&format!("{GROUP}/{version}"))
            .await
        {
            Ok(list) if list.resources.iter().any(|r| r.name == PLURAL) => {
                return Ok(Some(version));
            }
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error),
        }
    }
    Ok(None)
}

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
pub fn watch_stream(
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

/// The version served, shared with the pool status writer once known.
pub type ServedVersion = tokio::sync::watch::Receiver<Option<&'static str>>;

/// How the pool watch is started.
pub struct CiliumWatch<S> {
    pub client: kube::Client,
    pub writer: Writer<CiliumPoolResource>,
    pub sink: S,
    pub synced: SyncTracker,
    pub watcher: watcher::Config,
    pub backoff: WatchBackoff,
    /// How often discovery is asked again while the CRD is not served.
    pub period: Duration,
    /// Told the served version once discovery finds it.
    pub served: tokio::sync::watch::Sender<Option<&'static str>>,
}

impl<S: Handler<CiliumPoolResource> + 'static> CiliumWatch<S> {
    /// Asks discovery until the pools are served (every `period`, or after
    /// a failure with the backoff), then watches them until `cancel`.
    pub async fn run(self, cancel: CancellationToken) {
        let mut failures = 0u32;
        let mut told_missing = false;
        let version = loop {
            let delay = match discover(&self.client).await {
                Ok(Some(version)) => break version,
                Ok(None) => {
                    failures = 0;
                    if !told_missing {
                        tracing::info!(
                            every = ?self.period,
                            "CiliumLoadBalancerIPPools are not served (no cilium.io/v2 or v2alpha1 ciliumloadbalancerippools): not watched; discovery is asked again periodically"
                        );
                        told_missing = true;
                        // Nothing to list: the sync need not wait.
                        self.synced.mark(KIND);
                    }
                    self.period
                }
                Err(error) => {
                    let delay = self.backoff.base_delay(failures);
                    tracing::warn!(%error, attempt = failures + 1, retry_in = ?delay, "discovery of cilium.io failed");
                    failures = failures.saturating_add(1);
                    delay
                }
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        };
        tracing::info!(
            version = %format!("{GROUP}/{version}"),
            "CiliumLoadBalancerIPPools are served: watching them"
        );
        self.served.send_replace(Some(version));
        let stream = with_backoff(
            watch_stream(self.client.clone(), version, self.watcher),
            KIND,
            self.backoff,
        );
        let driver = Driver::new(KIND, self.writer);
        tokio::select! {
            () = cancel.cancelled() => {}
            () = driver.run(stream, &self.sink, &self.synced) => {}
        }
    }
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
            assert_eq!(pool.metadata.name.as_deref(), Some("blue"));
            assert_eq!(pool.metadata.generation, Some(2));
            assert!(pool.metadata.annotations.is_none());
            assert!(pool.metadata.managed_fields.is_none());
            assert_eq!(pool.spec.blocks.len(), 1);
            assert_eq!(
                pool.status.unwrap()["conditions"][0]["type"],
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
