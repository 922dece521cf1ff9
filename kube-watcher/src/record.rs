//! `kube-watcher record`: the cluster's current objects, then its watch
//! events, as a replay stream (docs/replay.md) that `fake-watcher replay` replays offline.
//!
//! The kinds are watched at once: Namespaces, `IPAddressPool`s, Services,
//! and `CiliumLoadBalancerIPPool`s when discovery finds them served (at
//! `cilium.io/v2`, else `v2alpha1`, asked once at the start). Each kind
//! goes through the host's own [`Driver`], so a relist (after `410 Gone`)
//! reaches the recording as the host's handlers see it, and a [`Lines`]
//! handler writes what each call means: `ADDED` for an add, `MODIFIED` for
//! an update (an unchanged resourceVersion writes nothing), `DELETED` for a
//! delete.
//!
//! Until every initial list is complete nothing is written and later events
//! are held back; then the listed objects are written as `ADDED` lines
//! (Namespaces, pools of both kinds in one sequence, Services, each oldest
//! first as the host delivers them, the key breaking ties), then the
//! `SYNCED` line, then the held-back events and every event after them, one
//! line each, flushed as it is written. `metadata.managedFields` is
//! dropped, as kubectl does.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use futures::future::{self, BoxFuture};
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use kube::core::ClusterResourceScope;
use kube::runtime::{reflector, watcher};
use kube::Resource;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use subscriber::Handler;

use crate::cilium;
use crate::crd::{self, IPAddressPoolResource};
use crate::discovered::Served;
use crate::retry::{watcher_of, with_backoff, WatchBackoff};
use crate::watch::{creation_order, Driver, Handled};

/// A recording that failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Discovery could not say whether a kind of pool is served.
    #[error("cannot ask discovery whether {group} serves {plural}: {source}")]
    Discovery {
        group: &'static str,
        plural: &'static str,
        #[source]
        source: kube::Error,
    },
    /// The output could not be written.
    #[error("cannot write the stream: {0}")]
    Write(#[source] std::io::Error),
    /// An object could not be turned into JSON.
    #[error("cannot encode a {kind}: {source}")]
    Encode {
        /// The object's kind.
        kind: &'static str,
        /// serde_json's reason.
        #[source]
        source: serde_json::Error,
    },
}

/// How much a recording wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordStats {
    /// `ADDED` lines before `SYNCED`.
    pub listed: u64,
    /// Whether the `SYNCED` line was written.
    pub synced: bool,
    /// Event lines after `SYNCED`.
    pub events: u64,
}

/// The order kinds are written in before `SYNCED`: the kinds of one group
/// in one sequence.
const KIND_ORDER: [&[&str]; 3] = [
    &["Namespace"],
    &["IPAddressPool", cilium::KIND],
    &["Service"],
];

/// A `CiliumLoadBalancerIPPool` exactly as the API server sent it (the
/// host's `cilium::CiliumPoolResource` keeps only what the rules read), at
/// whichever version is served: a `Resource` of its own so that a
/// [`Driver`] can take it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct RawCiliumPool {
    #[serde(default)]
    metadata: ObjectMeta,
    /// Every other field, `apiVersion` and `kind` included.
    #[serde(flatten)]
    fields: Map<String, Value>,
}

impl Resource for RawCiliumPool {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        cilium::CiliumPoolResource::kind(&())
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        cilium::CiliumPoolResource::group(&())
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        cilium::CiliumPoolResource::version(&())
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        cilium::CiliumPoolResource::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl RawCiliumPool {
    /// The watched object, its type stamped where a list item lacks it
    /// (every line needs one).
    fn new(object: DynamicObject, api_version: &str) -> Self {
        let mut fields = match object.data {
            Value::Object(fields) => fields,
            _ => Map::new(),
        };
        let (version, kind) = object.types.map_or_else(
            || (api_version.to_owned(), cilium::KIND.to_owned()),
            |types| (types.api_version, types.kind),
        );
        fields.insert("apiVersion".to_owned(), json!(version));
        fields.insert("kind".to_owned(), json!(kind));
        Self {
            metadata: object.metadata,
            fields,
        }
    }
}

/// The event with its object converted.
fn map_event<A, B>(event: watcher::Event<A>, convert: impl Fn(A) -> B) -> watcher::Event<B> {
    match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(convert(object)),
        watcher::Event::Apply(object) => watcher::Event::Apply(convert(object)),
        watcher::Event::Delete(object) => watcher::Event::Delete(convert(object)),
    }
}

/// The object as a line's `object`: `managedFields` dropped.
fn encode<K: Serialize>(kind: &'static str, object: &K) -> Result<Value, RecordError> {
    let mut value =
        serde_json::to_value(object).map_err(|source| RecordError::Encode { kind, source })?;
    if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("managedFields");
    }
    Ok(value)
}

/// Where an object goes in the initial list: creation time, then key.
type Order = (Option<Timestamp>, String, String);

/// What has been written, and what waits for `SYNCED`.
struct Output<W> {
    out: W,
    /// The kinds recorded.
    kinds: Vec<&'static str>,
    /// The kinds whose initial list is complete.
    listed: HashSet<&'static str>,
    /// kind → its initial list, until `SYNCED` is written.
    lists: HashMap<&'static str, Vec<(Order, Value)>>,
    /// Events that came before every initial list was complete.
    held: Vec<(&'static str, Value)>,
    stats: RecordStats,
    /// Set when the recording is over: an error, or `SYNCED` of a list-only
    /// recording.
    done: Option<Result<(), RecordError>>,
    list_only: bool,
}

impl<W: Write> Output<W> {
    fn new(out: W, kinds: Vec<&'static str>, list_only: bool) -> Self {
        Self {
            out,
            kinds,
            listed: HashSet::new(),
            lists: HashMap::new(),
            held: Vec::new(),
            stats: RecordStats::default(),
            done: None,
            list_only,
        }
    }

    fn line(&mut self, event_type: &str, object: Option<Value>) -> Result<(), RecordError> {
        let line = match object {
            Some(object) => json!({"type": event_type, "object": object}),
            None => json!({"type": event_type}),
        };
        let mut text = serde_json::to_string(&line).map_err(|source| RecordError::Encode {
            kind: "event",
            source,
        })?;
        text.push('\n');
        self.out
            .write_all(text.as_bytes())
            .map_err(RecordError::Write)?;
        self.out.flush().map_err(RecordError::Write)
    }

    /// One handler call of `kind`: part of its initial list until that is
    /// complete, then an event, held back until `SYNCED`.
    fn deliver(
        &mut self,
        kind: &'static str,
        event_type: &'static str,
        order: Order,
        object: Value,
    ) {
        let result = if !self.listed.contains(kind) {
            self.lists.entry(kind).or_default().push((order, object));
            Ok(())
        } else if self.stats.synced {
            self.event(event_type, object)
        } else {
            self.held.push((event_type, object));
            Ok(())
        };
        self.finish_on_error(result);
    }

    fn event(&mut self, event_type: &str, object: Value) -> Result<(), RecordError> {
        self.line(event_type, Some(object))?;
        self.stats.events += 1;
        Ok(())
    }

    /// `kind`'s initial list is complete; once every kind's is, they are
    /// written.
    fn listed(&mut self, kind: &'static str) {
        self.listed.insert(kind);
        if self.stats.synced || !self.kinds.iter().all(|kind| self.listed.contains(kind)) {
            return;
        }
        let result = self.write_initial();
        self.finish_on_error(result);
        if self.list_only && self.done.is_none() {
            self.done = Some(Ok(()));
        }
    }

    fn finish_on_error(&mut self, result: Result<(), RecordError>) {
        if let (Err(error), None) = (result, &self.done) {
            self.done = Some(Err(error));
        }
    }

    /// The initial lists, `SYNCED`, then the events held back.
    fn write_initial(&mut self) -> Result<(), RecordError> {
        for group in KIND_ORDER {
            let mut objects: Vec<(Order, Value)> = group
                .iter()
                .flat_map(|kind| self.lists.remove(kind).unwrap_or_default())
                .collect();
            objects.sort_by(|a, b| a.0.cmp(&b.0));
            for (_, object) in objects {
                self.line("ADDED", Some(object))?;
                self.stats.listed += 1;
            }
        }
        self.line("SYNCED", None)?;
        self.stats.synced = true;
        for (event_type, object) in std::mem::take(&mut self.held) {
            self.event(event_type, object)?;
        }
        Ok(())
    }
}

/// The handler of one kind's calls: each becomes a line of [`Output`].
struct Lines<W> {
    kind: &'static str,
    output: Arc<Mutex<Output<W>>>,
}

impl<W: Write> Lines<W> {
    fn output(&self) -> std::sync::MutexGuard<'_, Output<W>> {
        self.output.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn deliver<K: Resource + Serialize>(&self, event_type: &'static str, object: &K) {
        match encode(self.kind, object) {
            Ok(value) => {
                self.output()
                    .deliver(self.kind, event_type, creation_order(object), value)
            }
            Err(error) => self.output().finish_on_error(Err(error)),
        }
    }
}

#[async_trait]
impl<K, W> Handler<K> for Lines<W>
where
    K: Resource + Serialize + Send + Sync + 'static,
    W: Write + Send,
{
    async fn on_add(&self, object: &K) -> Result<(), subscriber::Error> {
        self.deliver("ADDED", object);
        Ok(())
    }
    async fn on_update(&self, old: &K, new: &K) -> Result<(), subscriber::Error> {
        // A relist re-delivers every object: only a changed one is news.
        let version = |object: &K| object.meta().resource_version.clone();
        if version(old).is_none() || version(old) != version(new) {
            self.deliver("MODIFIED", new);
        }
        Ok(())
    }
    async fn on_delete(&self, object: &K) -> Result<(), subscriber::Error> {
        self.deliver("DELETED", object);
        Ok(())
    }
}

/// One watch event through `driver` into `lines`; true once the recording
/// is over.
async fn step<K, W>(driver: &mut Driver<K>, lines: &Lines<W>, event: watcher::Event<K>) -> bool
where
    K: Resource<DynamicType = ()> + Clone + Serialize + Send + Sync + 'static,
    W: Write + Send,
{
    if let Handled::Listed { first: true } = driver.handle(event, lines).await {
        lines.output().listed(lines.kind);
    }
    lines.output().done.is_some()
}

/// Drives one kind's watch through a [`Driver`] into `lines` until the
/// recording is over.
async fn drive<K, St, W>(stream: St, lines: Lines<W>)
where
    K: Resource<DynamicType = ()> + Clone + Serialize + Send + Sync + 'static,
    St: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    W: Write + Send,
{
    let (_, writer) = reflector::store::<K>();
    let mut driver = Driver::new(lines.kind, writer);
    let mut stream = std::pin::pin!(stream);
    // Watch errors are logged and retried by `with_backoff`.
    while let Some(item) = stream.next().await {
        let Ok(event) = item else { continue };
        if step(&mut driver, &lines, event).await {
            return;
        }
    }
    // The watch streams retry forever; should one end, the others go on.
    future::pending::<()>().await;
}

/// Records the cluster behind `client` into `out` until `stop` resolves
/// (or, with `list_only`, right after `SYNCED`).
pub async fn record<W: Write + Send>(
    client: kube::Client,
    out: W,
    list_only: bool,
    stop: impl Future<Output = ()>,
) -> Result<RecordStats, RecordError> {
    let config = watcher::Config::default();
    let backoff = WatchBackoff::default();
    let discover = |served: &'static Served| {
        let client = client.clone();
        async move {
            served
                .discover(&client)
                .await
                .map_err(|source| RecordError::Discovery {
                    group: served.group,
                    plural: served.plural,
                    source,
                })
        }
    };
    let pools_served = discover(&crd::SERVED).await?.is_some();
    let cilium_version = discover(&cilium::SERVED).await?;
    let mut kinds = vec!["Namespace", "Service"];
    if pools_served {
        kinds.push("IPAddressPool");
    }
    if cilium_version.is_some() {
        kinds.push(cilium::KIND);
    }
    let output = Arc::new(Mutex::new(Output::new(out, kinds, list_only)));
    let lines = |kind| Lines {
        kind,
        output: Arc::clone(&output),
    };
    let mut drives = vec![
        watch::<Namespace, _>(&client, &config, &backoff, lines("Namespace")),
        watch::<Service, _>(&client, &config, &backoff, lines("Service")),
    ];
    if pools_served {
        let pools = lines("IPAddressPool");
        drives.push(watch::<IPAddressPoolResource, _>(
            &client, &config, &backoff, pools,
        ));
    } else {
        tracing::info!("IPAddressPools are not served: not recorded");
    }
    match cilium_version {
        Some(version) => drives.push(
            drive(
                cilium_stream(client, version, config, backoff),
                lines(cilium::KIND),
            )
            .boxed(),
        ),
        None => tracing::info!("CiliumLoadBalancerIPPools are not served: not recorded"),
    }
    tokio::select! {
        () = stop => {}
        _ = future::select_all(drives) => {}
    }
    let mut output = output.lock().unwrap_or_else(PoisonError::into_inner);
    tracing::info!(
        listed = output.stats.listed,
        events = output.stats.events,
        "recording stopped"
    );
    output.done.take().unwrap_or(Ok(()))?;
    Ok(output.stats)
}

/// The recording of one kind: its watch, retried with backoff, driven
/// into `lines`.
fn watch<'a, K, W>(
    client: &kube::Client,
    config: &watcher::Config,
    backoff: &WatchBackoff,
    lines: Lines<W>,
) -> BoxFuture<'a, ()>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + serde::de::DeserializeOwned,
    K: std::fmt::Debug + Send + Sync + 'static,
    W: Write + Send + 'a,
{
    // Recorded whole: nothing is trimmed.
    let stream = watcher_of::<K>(client, config, |_| {});
    drive(with_backoff(stream, lines.kind, backoff.clone()), lines).boxed()
}

/// The watch of the Cilium pools at `version`, every field kept.
fn cilium_stream(
    client: kube::Client,
    version: &'static str,
    config: watcher::Config,
    backoff: WatchBackoff,
) -> impl Stream<Item = Result<watcher::Event<RawCiliumPool>, watcher::Error>> + Send {
    let resource = cilium::api_resource(version);
    let stream = move || {
        let api_version = resource.api_version.clone();
        let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
        watcher(api, config.clone()).map(move |item| {
            item.map(|event| map_event(event, |object| RawCiliumPool::new(object, &api_version)))
        })
    };
    with_backoff(stream, cilium::KIND, backoff)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;

    fn meta(namespace: Option<&str>, name: &str, rv: &str, created: i64) -> ObjectMeta {
        ObjectMeta {
            namespace: namespace.map(str::to_owned),
            name: Some(name.to_owned()),
            resource_version: Some(rv.to_owned()),
            creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(created).unwrap(),
            )),
            managed_fields: Some(vec![ManagedFieldsEntry::default()]),
            ..ObjectMeta::default()
        }
    }

    fn service(name: &str, rv: &str, created: i64) -> Service {
        Service {
            metadata: meta(Some("ns"), name, rv, created),
            ..Service::default()
        }
    }

    fn namespace(name: &str, rv: &str) -> Namespace {
        Namespace {
            metadata: meta(None, name, rv, 0),
            ..Namespace::default()
        }
    }

    fn cilium_pool(name: &str, created: i64) -> RawCiliumPool {
        let object: DynamicObject = serde_json::from_value(json!({
            "metadata": {"name": name, "resourceVersion": "1",
                         "creationTimestamp": Timestamp::from_second(created).unwrap()},
            "spec": {"blocks": [{"cidr": "10.1.0.0/24"}]}
        }))
        .unwrap();
        RawCiliumPool::new(object, "cilium.io/v2")
    }

    fn pool(name: &str, created: i64) -> IPAddressPoolResource {
        serde_json::from_value(json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": name, "namespace": "m", "resourceVersion": "1",
                         "creationTimestamp": Timestamp::from_second(created).unwrap()},
            "spec": {"addresses": ["192.168.10.0/24"]}
        }))
        .unwrap()
    }

    type Shared = Arc<Mutex<Output<Vec<u8>>>>;

    fn output(kinds: &[&'static str]) -> Shared {
        Arc::new(Mutex::new(Output::new(Vec::new(), kinds.to_vec(), false)))
    }

    /// One kind's driver and handler, fed events by hand.
    struct Kind<K: Resource<DynamicType = ()> + Clone + 'static> {
        driver: Driver<K>,
        lines: Lines<Vec<u8>>,
    }

    impl<K> Kind<K>
    where
        K: Resource<DynamicType = ()> + Clone + Serialize + Send + Sync + 'static,
    {
        fn new(kind: &'static str, output: &Shared) -> Self {
            let (_, writer) = reflector::store::<K>();
            Self {
                driver: Driver::new(kind, writer),
                lines: Lines {
                    kind,
                    output: Arc::clone(output),
                },
            }
        }

        async fn list(&mut self, objects: Vec<K>) -> bool {
            step(&mut self.driver, &self.lines, watcher::Event::Init).await;
            for object in objects {
                step(
                    &mut self.driver,
                    &self.lines,
                    watcher::Event::InitApply(object),
                )
                .await;
            }
            step(&mut self.driver, &self.lines, watcher::Event::InitDone).await
        }

        async fn send(&mut self, event: watcher::Event<K>) {
            step(&mut self.driver, &self.lines, event).await;
        }
    }

    /// `TYPE key rv` per line, and empties the output.
    fn take(output: &Shared) -> Vec<String> {
        let bytes = std::mem::take(&mut output.lock().unwrap().out);
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|line| {
                let v: Value = serde_json::from_str(line).unwrap();
                let Some(o) = v.get("object") else {
                    return v["type"].as_str().unwrap().to_owned();
                };
                assert!(o["metadata"].get("managedFields").is_none(), "{o}");
                let name = o["metadata"]["name"].as_str().unwrap();
                let key = match o["metadata"]["namespace"].as_str() {
                    Some(namespace) => format!("{namespace}/{name}"),
                    None => name.to_owned(),
                };
                let rv = o["metadata"]["resourceVersion"].as_str().unwrap();
                format!("{} {key} {rv}", v["type"].as_str().unwrap())
            })
            .collect()
    }

    #[tokio::test]
    async fn lists_then_synced_then_events_and_relists() {
        let out = output(&["Namespace", "Service"]);
        let mut namespaces = Kind::<Namespace>::new("Namespace", &out);
        let mut services = Kind::<Service>::new("Service", &out);
        // Listed out of creation order.
        services
            .list(vec![service("b", "3", 2), service("a", "2", 1)])
            .await;
        // An event of a listed kind before the others are: held back.
        services
            .send(watcher::Event::Apply(service("c", "9", 3)))
            .await;
        assert!(take(&out).is_empty());
        namespaces.list(vec![namespace("ns", "1")]).await;
        assert_eq!(
            take(&out),
            [
                "ADDED ns 1",
                "ADDED ns/a 2",
                "ADDED ns/b 3",
                "SYNCED",
                "ADDED ns/c 9"
            ]
        );

        services
            .send(watcher::Event::Apply(service("a", "10", 1)))
            .await;
        services
            .send(watcher::Event::Delete(service("b", "11", 2)))
            .await;
        // A relist: a unchanged, c changed, d new, and nothing else.
        services
            .list(vec![
                service("d", "13", 4),
                service("c", "12", 3),
                service("a", "10", 1),
            ])
            .await;
        namespaces.list(vec![]).await;
        assert_eq!(
            take(&out),
            [
                "MODIFIED ns/a 10",
                "DELETED ns/b 11",
                "MODIFIED ns/c 12",
                "ADDED ns/d 13",
                "DELETED ns 1"
            ]
        );
        assert_eq!(
            out.lock().unwrap().stats,
            RecordStats {
                listed: 3,
                synced: true,
                events: 6
            }
        );
    }

    #[tokio::test]
    async fn pools_of_both_kinds_are_listed_in_one_creation_order() {
        let out = output(&["IPAddressPool", cilium::KIND]);
        let mut pools = Kind::<IPAddressPoolResource>::new("IPAddressPool", &out);
        let mut cilium_pools = Kind::<RawCiliumPool>::new(cilium::KIND, &out);
        pools.list(vec![pool("late", 3), pool("early", 1)]).await;
        assert!(take(&out).is_empty(), "waits for the Cilium pools");
        cilium_pools.list(vec![cilium_pool("blue", 2)]).await;
        assert_eq!(
            take(&out),
            [
                "ADDED m/early 1",
                "ADDED blue 1",
                "ADDED m/late 1",
                "SYNCED"
            ]
        );
        // A relist that lost the Cilium pool: its DELETED line is the
        // last state known, type and spec included.
        cilium_pools.list(vec![]).await;
        let deleted: Value = serde_json::from_slice(&out.lock().unwrap().out).unwrap();
        assert_eq!(deleted["type"], "DELETED");
        assert_eq!(deleted["object"]["apiVersion"], "cilium.io/v2");
        assert_eq!(deleted["object"]["kind"], cilium::KIND);
        assert_eq!(
            deleted["object"]["spec"]["blocks"][0]["cidr"],
            "10.1.0.0/24"
        );
    }

    #[tokio::test]
    async fn a_list_only_recording_is_done_at_synced() {
        let out = Arc::new(Mutex::new(Output::new(Vec::new(), vec!["Service"], true)));
        let mut services = Kind::<Service>::new("Service", &out);
        assert!(services.list(vec![service("a", "1", 1)]).await);
        assert_eq!(take(&out), ["ADDED ns/a 1", "SYNCED"]);
    }
}
