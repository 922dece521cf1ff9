//! `kube-watcher record`: the cluster's current objects, then its watch
//! events, as a replay stream (docs/replay.md) that `fake-watcher replay` replays offline.
//!
//! The kinds are watched at once: Namespaces, `IPAddressPool`s, Services,
//! and `CiliumLoadBalancerIPPool`s when discovery finds them served (at
//! `cilium.io/v2`, else `v2alpha1`, asked once at the start). Until every
//! initial list is complete nothing is written and later events are held
//! back; then the listed objects are written as `ADDED` lines (Namespaces,
//! pools of both kinds in one sequence, Services, each oldest first as the
//! host delivers them, the key breaking ties), then the `SYNCED` line, then the held-back events and
//! every event after them, one line each, flushed as it is written. A relist
//! (after `410 Gone`) is written as what it means: `ADDED` for new objects,
//! `MODIFIED` for changed ones (an unchanged resourceVersion writes
//! nothing), `DELETED` for those gone. `metadata.managedFields` is dropped,
//! as kubectl does.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::Write;

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::Api;
use kube::runtime::watcher;
use kube::Resource;
use serde::Serialize;
use serde_json::{json, Value};

use crate::cilium;
use crate::crd::IPAddressPoolResource;
use crate::retry::{with_backoff, WatchBackoff};

/// A recording that failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Discovery could not say whether Cilium pools are served.
    #[error("cannot ask discovery whether cilium.io serves ciliumloadbalancerippools: {0}")]
    Discovery(#[source] kube::Error),
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

/// One kind's watch event, the object already in JSON.
#[derive(Debug)]
enum Item {
    Init(&'static str),
    InitApply(&'static str, String, Value),
    InitDone(&'static str),
    Apply(&'static str, String, Value),
    Delete(&'static str, String, Value),
}

/// The order kinds are written in before `SYNCED`: the kinds of one group
/// in one sequence.
const KIND_ORDER: [&[&str]; 3] = [
    &["Namespace"],
    &["IPAddressPool", cilium::KIND],
    &["Service"],
];

fn encode<K: Serialize + Resource>(
    kind: &'static str,
    object: &K,
) -> Result<(String, Value), RecordError> {
    let key = match object.meta().namespace.as_deref() {
        Some(namespace) => format!(
            "{namespace}/{}",
            object.meta().name.as_deref().unwrap_or_default()
        ),
        None => object.meta().name.clone().unwrap_or_default(),
    };
    let mut value =
        serde_json::to_value(object).map_err(|source| RecordError::Encode { kind, source })?;
    if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("managedFields");
    }
    Ok((key, value))
}

fn items<K>(
    kind: &'static str,
    api: Api<K>,
    config: watcher::Config,
    api_version: Option<String>,
) -> BoxStream<'static, Result<Item, RecordError>>
where
    K: Resource
        + Clone
        + Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    // A custom resource's list items may lack apiVersion and kind, which
    // every line needs: stamped where the object has none.
    let encode = move |kind, object: &K| {
        encode(kind, object).map(|(key, mut value)| {
            if let (Some(api_version), Some(fields)) = (&api_version, value.as_object_mut()) {
                fields
                    .entry("apiVersion")
                    .or_insert_with(|| json!(api_version));
                fields.entry("kind").or_insert_with(|| json!(kind));
            }
            (key, value)
        })
    };
    with_backoff(watcher(api, config), kind, WatchBackoff::default())
        .filter_map(move |event| {
            let encode = encode.clone();
            async move {
                match event {
                    Ok(watcher::Event::Init) => Some(Ok(Item::Init(kind))),
                    Ok(watcher::Event::InitDone) => Some(Ok(Item::InitDone(kind))),
                    Ok(watcher::Event::InitApply(object)) => Some(
                        encode(kind, &object).map(|(key, value)| Item::InitApply(kind, key, value)),
                    ),
                    Ok(watcher::Event::Apply(object)) => Some(
                        encode(kind, &object).map(|(key, value)| Item::Apply(kind, key, value)),
                    ),
                    Ok(watcher::Event::Delete(object)) => Some(
                        encode(kind, &object).map(|(key, value)| Item::Delete(kind, key, value)),
                    ),
                    // Logged by `with_backoff`, which retries it.
                    Err(_) => None,
                }
            }
        })
        .boxed()
}

fn resource_version(value: &Value) -> Option<&str> {
    value.get("metadata")?.get("resourceVersion")?.as_str()
}

/// Writes lines and remembers what the stream has said exists.
struct Recorder<W> {
    out: W,
    /// kind → key → resourceVersion of every object the stream has added.
    known: HashMap<&'static str, BTreeMap<String, Option<String>>>,
    /// kind → objects of a list in progress.
    listing: HashMap<&'static str, Vec<(String, Value)>>,
    /// kind → its complete initial list, until `SYNCED` is written.
    lists: HashMap<&'static str, Vec<(String, Value)>>,
    /// The kinds recorded.
    kinds: Vec<&'static str>,
    /// Events that came before every initial list was complete.
    held: Vec<Item>,
    stats: RecordStats,
}

impl<W: Write> Recorder<W> {
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

    fn synced(&self) -> bool {
        self.stats.synced
    }

    /// Takes one item; true once `SYNCED` has just been written.
    fn take(&mut self, item: Item) -> Result<bool, RecordError> {
        match item {
            Item::Init(kind) => {
                self.listing.insert(kind, Vec::new());
                Ok(false)
            }
            Item::InitApply(kind, key, value) => {
                self.listing.entry(kind).or_default().push((key, value));
                Ok(false)
            }
            Item::InitDone(kind) => {
                let objects = self.listing.remove(kind).unwrap_or_default();
                if self.synced() {
                    self.relist(kind, objects)?;
                    return Ok(false);
                }
                // A relist before every kind was listed replaces the list
                // not yet written, and the events held back since.
                self.held.retain(|held| item_kind(held) != kind);
                self.lists.insert(kind, objects);
                if self.kinds.iter().all(|kind| self.lists.contains_key(kind)) {
                    self.write_initial()?;
                    return Ok(true);
                }
                Ok(false)
            }
            item @ (Item::Apply(..) | Item::Delete(..)) => {
                if self.synced() {
                    self.event(item)?;
                } else {
                    self.held.push(item);
                }
                Ok(false)
            }
        }
    }

    /// The initial lists, `SYNCED`, then the events held back.
    fn write_initial(&mut self) -> Result<(), RecordError> {
        for group in KIND_ORDER {
            let mut objects: Vec<(&'static str, String, Value)> = Vec::new();
            for kind in group.iter().copied() {
                let listed = self.lists.remove(kind).unwrap_or_default();
                let known = self.known.entry(kind).or_default();
                for (key, value) in listed {
                    known.insert(key.clone(), resource_version(&value).map(str::to_owned));
                    objects.push((kind, key, value));
                }
            }
            objects.sort_by_cached_key(|(_, key, value)| {
                let created = value
                    .get("metadata")
                    .and_then(|metadata| metadata.get("creationTimestamp"))
                    .and_then(Value::as_str)
                    .and_then(|time| time.parse::<k8s_openapi::jiff::Timestamp>().ok());
                (created, key.clone())
            });
            for (_, _, value) in objects {
                self.line("ADDED", Some(value))?;
                self.stats.listed += 1;
            }
        }
        self.line("SYNCED", None)?;
        self.stats.synced = true;
        for item in std::mem::take(&mut self.held) {
            self.event(item)?;
        }
        Ok(())
    }

    fn event(&mut self, item: Item) -> Result<(), RecordError> {
        match item {
            Item::Apply(kind, key, value) => {
                let known = self.known.entry(kind).or_default();
                let version = resource_version(&value).map(str::to_owned);
                let event_type = if known.insert(key, version).is_some() {
                    "MODIFIED"
                } else {
                    "ADDED"
                };
                self.line(event_type, Some(value))?;
            }
            Item::Delete(kind, key, value) => {
                self.known.entry(kind).or_default().remove(&key);
                self.line("DELETED", Some(value))?;
            }
            Item::Init(_) | Item::InitApply(..) | Item::InitDone(_) => return Ok(()),
        }
        self.stats.events += 1;
        Ok(())
    }

    /// A relist after `SYNCED`: what changed since the stream last said.
    fn relist(
        &mut self,
        kind: &'static str,
        mut objects: Vec<(String, Value)>,
    ) -> Result<(), RecordError> {
        objects.sort_by(|a, b| a.0.cmp(&b.0));
        let known = self.known.remove(kind).unwrap_or_default();
        let mut gone = known.clone();
        let mut lines = Vec::new();
        for (key, value) in objects {
            let version = resource_version(&value).map(str::to_owned);
            match gone.remove(&key) {
                Some(old) if old == version => {}
                Some(_) => lines.push(("MODIFIED", value)),
                None => lines.push(("ADDED", value)),
            }
        }
        let mut known = known;
        for (event_type, value) in lines {
            if let Some(key) = value_key(&value) {
                known.insert(key, resource_version(&value).map(str::to_owned));
            }
            self.line(event_type, Some(value))?;
            self.stats.events += 1;
        }
        for key in gone.into_keys() {
            known.remove(&key);
            self.line("DELETED", Some(deleted_object(kind, &key)))?;
            self.stats.events += 1;
        }
        self.known.insert(kind, known);
        Ok(())
    }
}

fn value_key(value: &Value) -> Option<String> {
    let metadata = value.get("metadata")?;
    let name = metadata.get("name")?.as_str()?;
    Some(match metadata.get("namespace").and_then(Value::as_str) {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    })
}

fn item_kind(item: &Item) -> &'static str {
    match item {
        Item::Init(kind)
        | Item::InitDone(kind)
        | Item::InitApply(kind, ..)
        | Item::Apply(kind, ..)
        | Item::Delete(kind, ..) => kind,
    }
}

/// The least a `DELETED` line needs (docs/replay.md).
fn deleted_object(kind: &'static str, key: &str) -> Value {
    let (api_version, namespace, name) = match (kind, key.split_once('/')) {
        (cilium::KIND, _) => (subscriber::CILIUM_POOL_API_VERSION, None, key),
        ("IPAddressPool", Some((namespace, name))) => ("metallb.io/v1beta1", Some(namespace), name),
        (_, Some((namespace, name))) => ("v1", Some(namespace), name),
        ("IPAddressPool", None) => ("metallb.io/v1beta1", None, key),
        (_, None) => ("v1", None, key),
    };
    let mut metadata = json!({"name": name});
    if let (Some(namespace), Some(object)) = (namespace, metadata.as_object_mut()) {
        object.insert("namespace".to_owned(), json!(namespace));
    }
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata})
}

/// Records the cluster behind `client` into `out` until `stop` resolves
/// (or, with `list_only`, right after `SYNCED`).
pub async fn record<W: Write>(
    client: kube::Client,
    out: W,
    list_only: bool,
    stop: impl Future<Output = ()>,
) -> Result<RecordStats, RecordError> {
    let config = watcher::Config::default();
    let cilium_version = cilium::discover(&client)
        .await
        .map_err(RecordError::Discovery)?;
    let mut kinds = vec!["Namespace", "IPAddressPool", "Service"];
    let mut streams = vec![
        items(
            "Namespace",
            Api::<Namespace>::all(client.clone()),
            config.clone(),
            None,
        ),
        items(
            "IPAddressPool",
            Api::<IPAddressPoolResource>::all(client.clone()),
            config.clone(),
            None,
        ),
    ];
    match cilium_version {
        Some(version) => {
            let resource = cilium::api_resource(version);
            let api_version = resource.api_version.clone();
            kinds.push(cilium::KIND);
            streams.push(items(
                cilium::KIND,
                Api::<kube::api::DynamicObject>::all_with(client.clone(), &resource),
                config.clone(),
                Some(api_version),
            ));
        }
        None => tracing::info!("CiliumLoadBalancerIPPools are not served: not recorded"),
    }
    streams.push(items("Service", Api::<Service>::all(client), config, None));
    let mut merged = stream::select_all(streams);
    let mut recorder = Recorder {
        out,
        known: HashMap::new(),
        listing: HashMap::new(),
        lists: HashMap::new(),
        kinds,
        held: Vec::new(),
        stats: RecordStats::default(),
    };
    let mut stop = std::pin::pin!(stop);
    loop {
        let next = tokio::select! {
            () = &mut stop => break,
            next = merged.next() => next,
        };
        let Some(item) = next else {
            break;
        };
        if recorder.take(item?)? && list_only {
            break;
        }
    }
    tracing::info!(
        listed = recorder.stats.listed,
        events = recorder.stats.events,
        "recording stopped"
    );
    Ok(recorder.stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(kind: &str, namespace: Option<&str>, name: &str, rv: &str) -> (String, Value) {
        let mut metadata = json!({"name": name, "resourceVersion": rv, "managedFields": []});
        if let Some(namespace) = namespace {
            metadata["namespace"] = json!(namespace);
        }
        let value = json!({"kind": kind, "metadata": metadata});
        (value_key(&value).unwrap(), value)
    }

    fn lines(recorder: &Recorder<Vec<u8>>) -> Vec<String> {
        String::from_utf8(recorder.out.clone())
            .unwrap()
            .lines()
            .map(|line| {
                let v: Value = serde_json::from_str(line).unwrap();
                match v.get("object") {
                    Some(o) => format!(
                        "{} {} {}",
                        v["type"].as_str().unwrap(),
                        value_key(o).unwrap(),
                        o["metadata"]["resourceVersion"].as_str().unwrap_or("-")
                    ),
                    None => v["type"].as_str().unwrap().to_owned(),
                }
            })
            .collect()
    }

    fn recorder() -> Recorder<Vec<u8>> {
        Recorder {
            out: Vec::new(),
            known: HashMap::new(),
            listing: HashMap::new(),
            lists: HashMap::new(),
            kinds: vec!["Namespace", "IPAddressPool", "Service"],
            held: Vec::new(),
            stats: RecordStats::default(),
        }
    }

    fn apply(kind: &'static str, o: (String, Value)) -> Item {
        Item::Apply(kind, o.0, o.1)
    }

    #[test]
    fn lists_then_synced_then_events_and_relists() {
        let mut r = recorder();
        for kind in r.kinds.clone() {
            r.take(Item::Init(kind)).unwrap();
        }
        let (k, v) = object("Service", Some("ns"), "b", "3");
        r.take(Item::InitApply("Service", k, v)).unwrap();
        let (k, v) = object("Service", Some("ns"), "a", "2");
        r.take(Item::InitApply("Service", k, v)).unwrap();
        assert!(!r.take(Item::InitDone("Service")).unwrap());
        // An event of a listed kind before the others are: held back.
        r.take(apply("Service", object("Service", Some("ns"), "c", "9")))
            .unwrap();
        let (k, v) = object("Namespace", None, "ns", "1");
        r.take(Item::InitApply("Namespace", k, v)).unwrap();
        assert!(!r.take(Item::InitDone("Namespace")).unwrap());
        assert!(lines(&r).is_empty());
        assert!(r.take(Item::InitDone("IPAddressPool")).unwrap());
        assert_eq!(
            lines(&r),
            [
                "ADDED ns 1",
                "ADDED ns/a 2",
                "ADDED ns/b 3",
                "SYNCED",
                "ADDED ns/c 9"
            ]
        );

        r.out.clear();
        r.take(apply("Service", object("Service", Some("ns"), "a", "10")))
            .unwrap();
        let (k, v) = object("Service", Some("ns"), "b", "11");
        r.take(Item::Delete("Service", k, v)).unwrap();
        // A relist: a unchanged, c changed, d new, and nothing else.
        r.take(Item::Init("Service")).unwrap();
        for (name, rv) in [("a", "10"), ("c", "12"), ("d", "13")] {
            let (k, v) = object("Service", Some("ns"), name, rv);
            r.take(Item::InitApply("Service", k, v)).unwrap();
        }
        r.take(Item::InitDone("Service")).unwrap();
        r.take(Item::Init("Namespace")).unwrap();
        r.take(Item::InitDone("Namespace")).unwrap();
        assert_eq!(
            lines(&r),
            [
                "MODIFIED ns/a 10",
                "DELETED ns/b 11",
                "MODIFIED ns/c 12",
                "ADDED ns/d 13",
                "DELETED ns -"
            ]
        );
        assert_eq!(
            r.stats,
            RecordStats {
                listed: 3,
                synced: true,
                events: 6
            }
        );
    }

    #[test]
    fn pools_of_both_kinds_are_listed_in_one_creation_order() {
        let mut r = recorder();
        r.kinds.push(cilium::KIND);
        let pool = |kind: &str, namespace: Option<&str>, name: &str, created: &str| {
            let (key, mut value) = object(kind, namespace, name, "1");
            value["metadata"]["creationTimestamp"] = json!(created);
            (key, value)
        };
        for kind in r.kinds.clone() {
            r.take(Item::Init(kind)).unwrap();
        }
        let (k, v) = pool("IPAddressPool", Some("m"), "late", "2024-01-01T00:00:03Z");
        r.take(Item::InitApply("IPAddressPool", k, v)).unwrap();
        let (k, v) = pool("IPAddressPool", Some("m"), "early", "2024-01-01T00:00:01Z");
        r.take(Item::InitApply("IPAddressPool", k, v)).unwrap();
        let (k, v) = pool(cilium::KIND, None, "blue", "2024-01-01T00:00:02Z");
        r.take(Item::InitApply(cilium::KIND, k, v)).unwrap();
        for kind in ["Namespace", "IPAddressPool", "Service"] {
            assert!(!r.take(Item::InitDone(kind)).unwrap(), "waits for {kind}");
        }
        assert!(r.take(Item::InitDone(cilium::KIND)).unwrap());
        assert_eq!(
            lines(&r),
            [
                "ADDED m/early 1",
                "ADDED blue 1",
                "ADDED m/late 1",
                "SYNCED"
            ]
        );
        r.out.clear();
        // A relist that lost the Cilium pool: its DELETED line names it.
        r.take(Item::Init(cilium::KIND)).unwrap();
        r.take(Item::InitDone(cilium::KIND)).unwrap();
        let deleted: Value = serde_json::from_slice(&r.out).unwrap();
        assert_eq!(
            deleted["object"],
            json!({"apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
                   "metadata": {"name": "blue"}})
        );
    }

    #[test]
    fn encode_drops_managed_fields_and_keys_by_namespace() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
        let service = Service {
            metadata: ObjectMeta {
                namespace: Some("ns".to_owned()),
                name: Some("web".to_owned()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..ObjectMeta::default()
            },
            ..Service::default()
        };
        let Ok((key, value)) = encode("Service", &service) else {
            panic!("encodes");
        };
        assert_eq!(key, "ns/web");
        assert_eq!(value["apiVersion"], "v1");
        assert_eq!(value["kind"], "Service");
        assert!(value["metadata"].get("managedFields").is_none());
    }
}
