//! From kube-runtime watch events to chain calls, relists included, so no
//! handler ever deals with a relist itself (kubert's `index.rs` idea).
//!
//! A [`Driver`] owns one reflector [`Writer`] (the shared cache of its kind)
//! and turns each `watcher::Event` into store writes and handler calls:
//!
//! - `Apply`: the store is updated, then `on_add` (unknown object) or
//!   `on_update(old, new)` is delivered to the kind's `subscriber::Handler`.
//! - `Delete`: the store forgets the object, then `on_delete` is delivered.
//! - `Init` … `InitApply` … `InitDone` (the initial list, and every relist
//!   after a `410 Gone` or a failed list): the objects are buffered; at
//!   `InitDone` the store swaps to the listed objects *first*, then every
//!   listed object is delivered (oldest first, see [`creation_order`]), as `on_update(old, new)` when the store knew it
//!   before (a relist re-delivers it) or `on_add` when it did not, and every
//!   object the store knew but the list lacks is delivered as `on_delete`.
//!
//! So a handler reading the store while it handles an event always sees the
//! state the event describes, and a relist that finds the cluster unchanged
//! delivers updates that change nothing. A watch that merely reconnects
//! (a disconnect, the server's timeout) resumes from its resourceVersion and
//! produces no relist at all.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use subscriber::Handler;
use tokio::sync::watch;

/// The order objects are delivered in after a list: creation time, then
/// namespace and name.
pub(crate) fn creation_order<K: Resource>(
    object: &K,
) -> (Option<k8s_openapi::jiff::Timestamp>, String, String) {
    let metadata = object.meta();
    (
        metadata.creation_timestamp.as_ref().map(|time| time.0),
        metadata.namespace.clone().unwrap_or_default(),
        metadata.name.clone().unwrap_or_default(),
    )
}

/// A handler of `T` as a handler of the watched type `K`: each object is
/// converted on its way in (a CRD's kube type to the object type the chains
/// and the manager take, see `crd::to_subscriber`). Kinds watched as the
/// type the manager takes need no conversion: their chain is the handler.
pub(crate) struct Converting<K, T, H> {
    handler: H,
    convert: fn(&K) -> T,
}

impl<K, T, H> Converting<K, T, H> {
    /// Hands `handler` every object after `convert`.
    pub(crate) fn new(handler: H, convert: fn(&K) -> T) -> Self {
        Self { handler, convert }
    }
}

#[async_trait]
impl<K, T, H> Handler<K> for Converting<K, T, H>
where
    K: Send + Sync + 'static,
    T: Send + Sync + 'static,
    H: Handler<T>,
{
    async fn on_add(&self, object: &K) -> Result<(), subscriber::Error> {
        self.handler.on_add(&(self.convert)(object)).await
    }
    async fn on_update(&self, old: &K, new: &K) -> Result<(), subscriber::Error> {
        let (old, new) = ((self.convert)(old), (self.convert)(new));
        self.handler.on_update(&old, &new).await
    }
    async fn on_delete(&self, object: &K) -> Result<(), subscriber::Error> {
        self.handler.on_delete(&(self.convert)(object)).await
    }
}

/// Tracks which kinds have finished their initial list; synced once every
/// expected kind has (docs/allocation.md: then the host marks the manager
/// synced). Cheap to clone.
#[derive(Clone, Debug)]
pub struct SyncTracker {
    inner: Arc<SyncInner>,
}

#[derive(Debug)]
struct SyncInner {
    expected: HashSet<&'static str>,
    done: Mutex<HashSet<&'static str>>,
    synced: watch::Sender<bool>,
}

impl SyncTracker {
    /// A tracker that waits for each of `kinds`.
    pub fn new(kinds: &[&'static str]) -> Self {
        Self {
            inner: Arc::new(SyncInner {
                expected: kinds.iter().copied().collect(),
                done: Mutex::new(HashSet::new()),
                synced: watch::Sender::new(kinds.is_empty()),
            }),
        }
    }

    /// `kind` finished its initial list (later calls change nothing).
    pub fn mark(&self, kind: &'static str) {
        let mut done = self
            .inner
            .done
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if done.insert(kind) && self.inner.expected.is_subset(&done) {
            tracing::info!("initial list of every kind complete");
            self.inner.synced.send_replace(true);
        }
    }

    /// Whether every kind finished its initial list.
    pub fn is_synced(&self) -> bool {
        *self.inner.synced.borrow()
    }

    /// Resolves once every kind finished its initial list.
    pub async fn wait(&self) {
        let mut synced = self.inner.synced.subscribe();
        // The sender lives in `self`, so this cannot fail.
        let _ = synced.wait_for(|synced| *synced).await;
    }
}

/// What [`Driver::handle`] did with one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Handled {
    /// Store written, handlers called.
    Delivered,
    /// Buffered until `InitDone`.
    Buffered,
    /// A list ended; `first` for the initial one.
    Listed { first: bool },
}

/// Applies one kind's watch events to its store and its sink.
pub(crate) struct Driver<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    kind: &'static str,
    writer: Writer<K>,
    reader: Store<K>,
    listed: bool,
    /// Bumped after every event that changed the store.
    changed: Option<watch::Sender<u64>>,
}

impl<K> Debug for Driver<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("kind", &self.kind)
            .field("listed", &self.listed)
            .finish_non_exhaustive()
    }
}

impl<K> Driver<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// A driver for `kind` that writes into `writer`.
    pub(crate) fn new(kind: &'static str, writer: Writer<K>) -> Self {
        let reader = writer.as_reader();
        Self {
            kind,
            writer,
            reader,
            listed: false,
            changed: None,
        }
    }

    /// Bumps `changed` after every event that changed the store (see
    /// `KubeStore::wait_for_service`).
    #[must_use]
    pub(crate) fn notifying(mut self, changed: watch::Sender<u64>) -> Self {
        self.changed = Some(changed);
        self
    }

    fn bump(&self) {
        if let Some(changed) = &self.changed {
            changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// The kind this driver handles.
    pub(crate) fn kind(&self) -> &'static str {
        self.kind
    }

    /// A reader of the store this driver writes.
    pub(crate) fn reader(&self) -> Store<K> {
        self.reader.clone()
    }

    /// Applies `event` to the store, then delivers it to `sink`. A handler's
    /// error is logged; the store stays as the event says.
    pub(crate) async fn handle<S: Handler<K> + ?Sized>(
        &mut self,
        event: watcher::Event<K>,
        sink: &S,
    ) -> Handled {
        match event {
            // The writer buffers the list (and forgets a partial one on a
            // new `Init`); the driver keeps no copy of its own, so a relist
            // of 50k Services holds each object once.
            watcher::Event::Init => {
                tracing::debug!(kind = self.kind, "list started");
                self.writer.apply_watcher_event(&event);
                Handled::Buffered
            }
            watcher::Event::InitApply(_) => {
                self.writer.apply_watcher_event(&event);
                Handled::Buffered
            }
            watcher::Event::InitDone => self.listed(sink).await,
            watcher::Event::Apply(object) => {
                let old = self.reader.get(&ObjectRef::from_obj(&object));
                self.writer
                    .apply_watcher_event(&watcher::Event::Apply(object.clone()));
                self.bump();
                let result = match &old {
                    Some(old) => sink.on_update(old, &object).await,
                    None => sink.on_add(&object).await,
                };
                self.report(result, "apply", &object);
                Handled::Delivered
            }
            watcher::Event::Delete(object) => {
                self.writer
                    .apply_watcher_event(&watcher::Event::Delete(object.clone()));
                self.bump();
                let result = sink.on_delete(&object).await;
                self.report(result, "delete", &object);
                Handled::Delivered
            }
        }
    }

    /// `InitDone`: the store swaps to the listed objects, then each is
    /// delivered (oldest first) as an update or an add, and each object the
    /// list lacks as a delete.
    async fn listed<S: Handler<K> + ?Sized>(&mut self, sink: &S) -> Handled {
        let mut before: HashMap<ObjectRef<K>, Arc<K>> = self
            .reader
            .state()
            .into_iter()
            .map(|object| (ObjectRef::from_obj(object.as_ref()), object))
            .collect();
        self.writer.apply_watcher_event(&watcher::Event::InitDone);
        self.bump();
        // The store now holds exactly the listed objects.
        let mut listed = self.reader.state();
        // Oldest first (the key breaking ties), as a controller that
        // had watched all along would have seen them, whatever order
        // the list came in; a new leader's first-seen order is the
        // same (see `host`).
        listed.sort_by_cached_key(|object| creation_order(object.as_ref()));
        let (count, gone) = (listed.len(), before.len());
        for object in listed {
            let result = match before.remove(&ObjectRef::from_obj(object.as_ref())) {
                Some(old) => sink.on_update(&old, &object).await,
                None => sink.on_add(&object).await,
            };
            self.report(result, "list", &object);
        }
        let mut removed: Vec<Arc<K>> = before.into_values().collect();
        removed.sort_by_key(|object| ObjectRef::from_obj(object.as_ref()).to_string());
        for object in &removed {
            let result = sink.on_delete(object).await;
            self.report(result, "delete (not in list)", object);
        }
        let first = !self.listed;
        self.listed = true;
        tracing::info!(
            kind = self.kind,
            objects = count,
            deleted = removed.len(),
            known_before = gone,
            first,
            "list complete"
        );
        Handled::Listed { first }
    }

    fn report(&self, result: Result<(), subscriber::Error>, what: &str, object: &K) {
        if let Err(error) = result {
            tracing::warn!(
                kind = self.kind,
                name = %object.name_any(),
                namespace = object.namespace().unwrap_or_default(),
                event = what,
                %error,
                "a handler failed"
            );
        }
    }

    /// Drives `stream` until it ends: every event through
    /// [`handle`](Driver::handle), the first completed list marked on
    /// `synced`. Watch errors are skipped: the stream logs and retries them
    /// (see [`crate::retry`]).
    pub(crate) async fn run<St, S>(&mut self, stream: St, sink: &S, synced: &SyncTracker)
    where
        St: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
        S: Handler<K> + ?Sized,
    {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    if let Handled::Listed { first: true } = self.handle(event, sink).await {
                        synced.mark(self.kind);
                    }
                }
                Err(error) => {
                    tracing::trace!(kind = self.kind, %error, "watch failed");
                }
            }
        }
        tracing::debug!(kind = self.kind, "watch stream ended");
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::reflector;
    use manager::Store as _;

    use super::*;
    use crate::store::KubeStore;

    /// Records `event key rv` lines, and what the store held at the time.
    #[derive(Default)]
    struct Recorder {
        log: Mutex<Vec<String>>,
        store: Mutex<Option<KubeStore>>,
    }

    impl Recorder {
        fn push(&self, line: String, service: &Service) {
            let key = format!(
                "{}/{}",
                service.metadata.namespace.as_deref().unwrap_or_default(),
                service.name_any()
            );
            let seen = self
                .store
                .lock()
                .unwrap()
                .as_ref()
                .map(|store| {
                    store
                        .service(&key)
                        .and_then(|s| s.metadata.resource_version.clone())
                        .unwrap_or_else(|| "-".to_owned())
                })
                .unwrap_or_default();
            self.log
                .lock()
                .unwrap()
                .push(format!("{line} (store {seen})"));
        }

        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.log.lock().unwrap())
        }
    }

    fn rv(service: &Service) -> &str {
        service.metadata.resource_version.as_deref().unwrap_or("?")
    }

    #[async_trait]
    impl Handler<Service> for Recorder {
        async fn on_add(&self, object: &Service) -> Result<(), subscriber::Error> {
            self.push(format!("add {} {}", object.name_any(), rv(object)), object);
            Ok(())
        }
        async fn on_update(&self, old: &Service, new: &Service) -> Result<(), subscriber::Error> {
            self.push(
                format!("update {} {}->{}", new.name_any(), rv(old), rv(new)),
                new,
            );
            Ok(())
        }
        async fn on_delete(&self, object: &Service) -> Result<(), subscriber::Error> {
            self.push(
                format!("delete {} {}", object.name_any(), rv(object)),
                object,
            );
            Ok(())
        }
    }

    fn service(name: &str, rv: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some("ns".to_owned()),
                name: Some(name.to_owned()),
                resource_version: Some(rv.to_owned()),
                ..ObjectMeta::default()
            },
            ..Service::default()
        }
    }

    fn setup() -> (Driver<Service>, Recorder) {
        let (_, writer) = reflector::store::<Service>();
        let driver = Driver::new("Service", writer);
        let (pools, _) = reflector::store();
        let (namespaces, _) = reflector::store();
        let recorder = Recorder::default();
        *recorder.store.lock().unwrap() = Some(KubeStore::new(driver.reader(), pools, namespaces));
        (driver, recorder)
    }

    #[tokio::test]
    async fn initial_list_is_delivered_after_the_store_swaps() {
        let (mut driver, sink) = setup();
        assert_eq!(
            driver.handle(watcher::Event::Init, &sink).await,
            Handled::Buffered
        );
        for (name, rv) in [("a", "1"), ("b", "2")] {
            driver
                .handle(watcher::Event::InitApply(service(name, rv)), &sink)
                .await;
        }
        assert!(sink.take().is_empty(), "nothing before InitDone");
        assert_eq!(
            driver.handle(watcher::Event::InitDone, &sink).await,
            Handled::Listed { first: true }
        );
        assert_eq!(sink.take(), ["add a 1 (store 1)", "add b 2 (store 2)"]);

        driver
            .handle(watcher::Event::Apply(service("a", "3")), &sink)
            .await;
        driver
            .handle(watcher::Event::Apply(service("c", "4")), &sink)
            .await;
        driver
            .handle(watcher::Event::Delete(service("b", "5")), &sink)
            .await;
        assert_eq!(
            sink.take(),
            [
                "update a 1->3 (store 3)",
                "add c 4 (store 4)",
                "delete b 5 (store -)"
            ]
        );
    }

    #[tokio::test]
    async fn relist_updates_known_adds_new_and_deletes_missing() {
        let (mut driver, sink) = setup();
        driver.handle(watcher::Event::Init, &sink).await;
        for (name, rv) in [("a", "1"), ("b", "2"), ("c", "3")] {
            driver
                .handle(watcher::Event::InitApply(service(name, rv)), &sink)
                .await;
        }
        driver.handle(watcher::Event::InitDone, &sink).await;
        sink.take();

        // 410 Gone: the watcher relists. `a` unchanged, `b` changed, `c`
        // deleted meanwhile, `d` created meanwhile.
        driver.handle(watcher::Event::Init, &sink).await;
        for (name, rv) in [("a", "1"), ("b", "7"), ("d", "8")] {
            driver
                .handle(watcher::Event::InitApply(service(name, rv)), &sink)
                .await;
        }
        assert!(sink.take().is_empty());
        assert_eq!(
            driver.handle(watcher::Event::InitDone, &sink).await,
            Handled::Listed { first: false }
        );
        assert_eq!(
            sink.take(),
            [
                "update a 1->1 (store 1)",
                "update b 2->7 (store 7)",
                "add d 8 (store 8)",
                "delete c 3 (store -)"
            ]
        );
    }

    #[tokio::test]
    async fn a_list_restarted_midway_forgets_its_partial_buffer() {
        let (mut driver, sink) = setup();
        driver.handle(watcher::Event::Init, &sink).await;
        driver
            .handle(watcher::Event::InitApply(service("a", "1")), &sink)
            .await;
        driver.handle(watcher::Event::Init, &sink).await;
        driver
            .handle(watcher::Event::InitApply(service("b", "2")), &sink)
            .await;
        driver.handle(watcher::Event::InitDone, &sink).await;
        assert_eq!(sink.take(), ["add b 2 (store 2)"]);
    }

    /// Logs the calls it gets, each with the converted object.
    #[derive(Default)]
    struct Names(Mutex<Vec<String>>);

    #[async_trait]
    impl Handler<String> for Names {
        async fn on_add(&self, name: &String) -> Result<(), subscriber::Error> {
            self.0.lock().unwrap().push(format!("add {name}"));
            Ok(())
        }
        async fn on_update(&self, old: &String, new: &String) -> Result<(), subscriber::Error> {
            self.0.lock().unwrap().push(format!("update {old}->{new}"));
            Ok(())
        }
        async fn on_delete(&self, name: &String) -> Result<(), subscriber::Error> {
            self.0.lock().unwrap().push(format!("delete {name}"));
            Ok(())
        }
    }

    #[tokio::test]
    async fn converting_hands_on_each_call_with_the_converted_objects() {
        fn version(service: &Service) -> String {
            format!("{}@{}", service.name_any(), rv(service))
        }
        let converting = Converting::new(Names::default(), version);
        let (one, two) = (service("a", "1"), service("a", "2"));
        converting.on_add(&one).await.unwrap();
        converting.on_update(&one, &two).await.unwrap();
        converting.on_delete(&two).await.unwrap();
        assert_eq!(
            *converting.handler.0.lock().unwrap(),
            ["add a@1", "update a@1->a@2", "delete a@2"]
        );
    }

    #[tokio::test]
    async fn tracker_is_synced_once_every_kind_listed() {
        let tracker = SyncTracker::new(&["Service", "Namespace"]);
        assert!(!tracker.is_synced());
        tracker.mark("Service");
        tracker.mark("Service");
        assert!(!tracker.is_synced());
        tracker.mark("Namespace");
        assert!(tracker.is_synced());
        tracker.wait().await;
    }
}
