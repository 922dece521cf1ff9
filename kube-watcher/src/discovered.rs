//! The watch of a custom resource whose CRD may be missing: Cilium's
//! `CiliumLoadBalancerIPPool` on a MetalLB-only cluster, MetalLB's
//! `IPAddressPool` on a Cilium-only one, either installed later.
//!
//! Discovery (`/apis/GROUP/VERSION`, each version preferred first) says
//! which version serves the resource (and, where it says none, a list of
//! the resource confirms, for a server without discovery), and is asked
//! again every period until one does. A missing CRD is no error: it is logged at INFO once,
//! and the kind counts as listed (there is nothing to list) so the
//! manager's sync does not wait for it. A failing discovery is retried with
//! the watch backoff and holds the sync back, as a failing list would: a
//! sync without the pools would release the addresses their Services hold.
//!
//! A watch answered 404 (the CRD removed, or the version watched no longer
//! served after an upgrade) goes back to discovery: the objects are
//! delivered as deleted while none is served (a CRD's objects go with it),
//! and listed again at the version found.

use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use kube::Resource;
use subscriber::Handler;
use tokio_util::sync::CancellationToken;

use crate::retry::{with_backoff, WatchBackoff};
use crate::watch::{Driver, SyncTracker};

/// A custom resource that discovery may or may not find.
#[derive(Debug)]
pub(crate) struct Served {
    pub kind: &'static str,
    pub group: &'static str,
    /// The resource, as discovery lists it.
    pub plural: &'static str,
    /// The versions watched, preferred first.
    pub versions: &'static [&'static str],
    /// Said after "not served" (what to install, if it matters).
    pub when_missing: &'static str,
}

impl Served {
    /// The version of `versions` (preferred first) whose discovery document
    /// lists the resource; `None` when none does (a group version that is
    /// not served answers 404) and a list of the resource at each version
    /// answers 404 too. That list is asked only when discovery says no, for
    /// a server that serves the resource but not discovery (some API
    /// emulators): taking the pools for absent there would release every
    /// address they hold.
    pub(crate) async fn discover(
        &self,
        client: &kube::Client,
    ) -> Result<Option<&'static str>, kube::Error> {
        for version in self.versions {
            let group_version = format!("{}/{version}", self.group);
            if discovery_lists(client, &group_version, self.plural).await? {
                return Ok(Some(version));
            }
        }
        for version in self.versions {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &self.resource(version));
            match api.list(&ListParams::default().limit(1)).await {
                Ok(_) => return Ok(Some(version)),
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error),
            }
        }
        Ok(None)
    }

    /// The resource at `version`.
    pub(crate) fn resource(&self, version: &str) -> ApiResource {
        ApiResource {
            group: self.group.to_owned(),
            version: version.to_owned(),
            api_version: format!("{}/{version}", self.group),
            kind: self.kind.to_owned(),
            plural: self.plural.to_owned(),
        }
    }

    /// `group/v1 or v2 plural`, for the logs.
    fn where_looked(&self) -> String {
        format!(
            "{}/{} {}",
            self.group,
            self.versions.join(" or "),
            self.plural
        )
    }
}

/// Whether the discovery document of `group_version` lists `plural` (a
/// group version that is not served answers 404: it does not).
pub(crate) async fn discovery_lists(
    client: &kube::Client,
    group_version: &str,
    plural: &str,
) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == plural)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error),
    }
}

/// The version served, shared with the writers of the kind once known.
pub(crate) type ServedVersion = tokio::sync::watch::Receiver<Option<&'static str>>;

/// The watch of the resource at a version discovery found.
pub(crate) type StreamAt<K> = Box<
    dyn Fn(&'static str) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
        + Send
        + Sync,
>;

/// How the watch is started.
pub(crate) struct DiscoveredWatch<K: Resource<DynamicType = ()> + Clone + 'static, S> {
    pub served: &'static Served,
    pub client: kube::Client,
    pub writer: Writer<K>,
    pub sink: S,
    pub synced: SyncTracker,
    pub stream: StreamAt<K>,
    pub backoff: WatchBackoff,
    /// How often discovery is asked again while the CRD is not served.
    pub period: Duration,
    /// Told the served version once discovery finds it.
    pub version: tokio::sync::watch::Sender<Option<&'static str>>,
}

impl<K, S> DiscoveredWatch<K, S>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: Handler<K> + 'static,
{
    /// Asks discovery until the resource is served (every `period`, or
    /// after a failure with the backoff), then watches it until `cancel`;
    /// a watch answered 404 goes back to discovery, and objects no longer
    /// served are delivered as deleted.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let DiscoveredWatch {
            served,
            client,
            writer,
            sink,
            synced,
            stream,
            backoff,
            period,
            version: told,
        } = self;
        let mut driver = Driver::new(served.kind, writer);
        let stream = std::sync::Arc::new(stream);
        loop {
            let discovery = Discovery {
                served,
                client: &client,
                synced: &synced,
                backoff: &backoff,
                period,
            };
            let Some(version) = discovery.until_served(&mut driver, &sink, &cancel).await else {
                return;
            };
            let at = format!("{}/{version}", served.group);
            tracing::info!(version = %at, "{}s are served: watching them", served.kind);
            told.send_replace(Some(version));
            let watch = std::sync::Arc::clone(&stream);
            let items = move || {
                watch(version)
                    .take_while(|item| std::future::ready(!is_not_found(item)))
                    .boxed()
            };
            let items = with_backoff(items, served.kind, backoff.clone());
            tokio::select! {
                () = cancel.cancelled() => return,
                () = driver.run(items, &sink, &synced) => {}
            }
            told.send_replace(None);
            tracing::info!(
                version = %at,
                "{}s are no longer served there: asking discovery again",
                served.kind
            );
        }
    }
}

/// Whether a watch failed because the resource is not served (404).
fn is_not_found<K>(item: &Result<watcher::Event<K>, watcher::Error>) -> bool {
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

/// The discovery half of [`DiscoveredWatch::run`].
struct Discovery<'a> {
    served: &'static Served,
    client: &'a kube::Client,
    synced: &'a SyncTracker,
    backoff: &'a WatchBackoff,
    period: Duration,
}

impl Discovery<'_> {
    /// The served version, once discovery finds one; `None` on `cancel`.
    /// While none is, the kind counts as listed and the objects the driver
    /// still holds (from an earlier watch) are delivered as deleted.
    async fn until_served<K, S>(
        &self,
        driver: &mut Driver<K>,
        sink: &S,
        cancel: &CancellationToken,
    ) -> Option<&'static str>
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
        S: Handler<K>,
    {
        let served = self.served;
        let mut failures = 0u32;
        let mut told_missing = false;
        loop {
            let delay = match served.discover(self.client).await {
                Ok(Some(version)) => return Some(version),
                Ok(None) => {
                    failures = 0;
                    if !told_missing {
                        tracing::info!(
                            every = ?self.period,
                            "{}s are not served (no {}): not watched; discovery is asked again periodically{}",
                            served.kind,
                            served.where_looked(),
                            served.when_missing
                        );
                        told_missing = true;
                        // Nothing to list: the sync need not wait.
                        self.synced.mark(served.kind);
                        if !driver.reader().is_empty() {
                            // An empty list: every cached object is deleted.
                            driver.handle(watcher::Event::Init, sink).await;
                            driver.handle(watcher::Event::InitDone, sink).await;
                        }
                    }
                    self.period
                }
                Err(error) => {
                    let delay = self.backoff.base_delay(failures);
                    tracing::warn!(%error, attempt = failures + 1, retry_in = ?delay, "discovery of {} failed", served.group);
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::cilium::{CiliumPoolResource, KIND, SERVED};

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
            served: &SERVED,
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
