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
//! A watch answered 404 (the CRD removed, or the version watched no longer
//! served after an upgrade) goes back to discovery: the pools are delivered
//! as deleted while none is served, and listed again at the version found.
//!
//! The watch itself is of `DynamicObject`s at the discovered version, each
//! decoded into [`CiliumPoolResource`] (one cached type whatever the
//! version: both have one schema), so the reflector store and the
//! [`Driver`] are those of every other kind.

use std::borrow::Cow;
use std::time::Duration;

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
pub(crate) async fn discover(client: &kube::Client) -> Result<Option<&'static str>, kube::Error> {
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

/// The version served, shared with the pool status writer once known.
pub(crate) type ServedVersion = tokio::sync::watch::Receiver<Option<&'static str>>;

/// How the pool watch is started.
pub(crate) struct CiliumWatch<S> {
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
    /// a failure with the backoff), then watches them until `cancel`; a
    /// watch answered 404 (the CRD, or that version, is gone) goes back to
    /// discovery, and pools no longer served are delivered as deleted.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let CiliumWatch {
            client,
            writer,
            sink,
            synced,
            watcher,
            backoff,
            period,
            served,
        } = self;
        let mut driver = Driver::new(KIND, writer);
        loop {
            let discovery = Discovery {
                client: &client,
                synced: &synced,
                backoff: &backoff,
                period,
            };
            let Some(version) = discovery.until_served(&mut driver, &sink, &cancel).await else {
                return;
            };
            tracing::info!(
                version = %format!("{GROUP}/{version}"),
                "CiliumLoadBalancerIPPools are served: watching them"
            );
            served.send_replace(Some(version));
            let (client, watcher) = (client.clone(), watcher.clone());
            let stream = move || {
                watch_stream(client.clone(), version, watcher.clone())
                    .take_while(|item| std::future::ready(!is_not_found(item)))
            };
            let stream = with_backoff(stream, KIND, backoff.clone());
            tokio::select! {
                () = cancel.cancelled() => return,
                () = driver.run(stream, &sink, &synced) => {}
            }
            served.send_replace(None);
            tracing::info!(
                version = %format!("{GROUP}/{version}"),
                "CiliumLoadBalancerIPPools are no longer served there: asking discovery again"
            );
        }
    }
}

/// Whether a watch failed because the resource is not served (404).
fn is_not_found(item: &Result<watcher::Event<CiliumPoolResource>, watcher::Error>) -> bool {
    match item {
        Err(
            watcher::Error::InitialListFailed(kube::Error::Api(status))
            | watcher::Error::WatchStartFailed(kube::Error::Api(status))
            | watcher::Error::WatchFailed(kube::Error::Api(status)),
        ) => status.code == 404,
        Err(watcher::Error::WatchError(status)) => status.code == 404,
        _ => false,
    }
}

/// The discovery half of [`CiliumWatch::run`].
struct Discovery<'a> {
    client: &'a kube::Client,
    synced: &'a SyncTracker,
    backoff: &'a WatchBackoff,
    period: Duration,
}

impl Discovery<'_> {
    /// The served version, once discovery finds one; `None` on `cancel`.
    /// While none is, the kind counts as listed and the pools the driver
    /// still holds (from an earlier watch) are delivered as deleted.
    async fn until_served<S: Handler<CiliumPoolResource>>(
        &self,
        driver: &mut Driver<CiliumPoolResource>,
        sink: &S,
        cancel: &CancellationToken,
    ) -> Option<&'static str> {
        let mut failures = 0u32;
        let mut told_missing = false;
        loop {
            let delay = match discover(self.client).await {
                Ok(Some(version)) => return Some(version),
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
                        if !driver.reader().is_empty() {
                            // An empty list: every cached pool is deleted.
                            driver.handle(watcher::Event::Init, sink).await;
                            driver.handle(watcher::Event::InitDone, sink).await;
                        }
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
                () = cancel.cancelled() => return None,
                () = tokio::time::sleep(delay) => {}
            }
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

    /// Log lines, shared with the subscriber that writes them.
    #[derive(Clone, Default)]
    struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Logs {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
        type Writer = Logs;
        fn make_writer(&'a self) -> Logs {
            self.clone()
        }
    }

    /// Counts deletes.
    #[derive(Default)]
    struct Deletes(std::sync::atomic::AtomicUsize);

    #[async_trait::async_trait]
    impl Handler<CiliumPoolResource> for Deletes {
        async fn on_add(&self, _: &CiliumPoolResource) -> Result<(), subscriber::Error> {
            Ok(())
        }
        async fn on_update(
            &self,
            _: &CiliumPoolResource,
            _: &CiliumPoolResource,
        ) -> Result<(), subscriber::Error> {
            Ok(())
        }
        async fn on_delete(&self, _: &CiliumPoolResource) -> Result<(), subscriber::Error> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
    }

    /// Discovery against a server that answers 404 to everything (the
    /// metrics server), on the paused clock for 10 periods: one INFO line,
    /// no warning, the kind listed, and the pool cached from an earlier
    /// watch delivered as deleted, once.
    #[tokio::test(start_paused = true)]
    async fn a_missing_crd_is_said_once_and_forgets_the_cached_pools() {
        use crate::logging::{self, LogFormat};
        let logs = Logs::default();
        let _guard = tracing::subscriber::set_default(logging::subscriber(
            LogFormat::Text,
            false,
            tracing_subscriber::EnvFilter::new(logging::DEFAULT_FILTER),
            logs.clone(),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let cancel = CancellationToken::new();
        let synced = SyncTracker::new(&[KIND]);
        // The server outlives the discovery it answers.
        tokio::spawn(crate::metrics::serve(
            listener,
            crate::metrics::Metrics::new(synced.clone()),
            CancellationToken::new(),
        ));
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();

        let (_, writer) = kube::runtime::reflector::store::<CiliumPoolResource>();
        let mut driver = Driver::new(KIND, writer);
        let deletes = Deletes::default();
        let blue = CiliumPoolResource(subscriber::CiliumLoadBalancerIPPool {
            metadata: ObjectMeta {
                name: Some("blue".to_owned()),
                ..ObjectMeta::default()
            },
            ..Default::default()
        });
        driver.handle(watcher::Event::Apply(blue), &deletes).await;

        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            stop.cancel();
        });
        let backoff = WatchBackoff::default();
        let discovery = Discovery {
            client: &client,
            synced: &synced,
            backoff: &backoff,
            period: Duration::from_secs(1),
        };
        let found = discovery.until_served(&mut driver, &deletes, &cancel).await;
        assert_eq!(found, None);
        assert!(synced.is_synced());
        assert!(driver.reader().is_empty());
        assert_eq!(deletes.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        let said: Vec<&str> = text
            .lines()
            .filter(|line| line.contains("CiliumLoadBalancerIPPools are not served"))
            .collect();
        assert_eq!(said.len(), 1, "{text}");
        assert!(said[0].contains("INFO"), "{text}");
        assert!(!text.contains("WARN"), "{text}");
    }
}
