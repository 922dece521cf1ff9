//! The replay store: an API server stand-in (docs/replay.md §1.2).
//!
//! Every write goes through [`ReplayStore`]: it fills in what an API server
//! fills in, bumps the global `resourceVersion`, keeps the objects in a
//! [`ReplayCache`] (the shared cache the manager reads) and returns the
//! [`Change`] that the watch delivers to the subscriber chains. It delivers
//! nothing itself and never awaits, so that each write is atomic.
//!
//! Services are kept in compact form ([`compact`]) and built back into a
//! `Service` when read: a cluster's worth of them fits in a tenth of the
//! memory, at the cost of a build per read.

mod compact;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use dashmap::DashMap;
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Namespace, Service, ServiceSpec, ServiceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use manager::{ClientError, DashMapStore, ServiceWrite, Store, POOL_ANNOTATION};
use subscriber::{CiliumLoadBalancerIPPool, IPAddressPool};

use crate::stream::{service_key_of, Kind, Object, ObjectRef, WatchEvent, DEFAULT_NAMESPACE};

type FastHash = foldhash::fast::RandomState;

/// The IPv4 service CIDR cluster IPs come from.
pub const SERVICE_CIDR_V4: &str = "10.96.0.0/12";
/// The IPv6 service CIDR cluster IPs come from.
pub const SERVICE_CIDR_V6: &str = "fd00:10:96::/108";

const IPV4: &str = "IPv4";
const IPV6: &str = "IPv6";
const SINGLE_STACK: &str = "SingleStack";
const REQUIRE_DUAL_STACK: &str = "RequireDualStack";

/// A write the replay store refuses, as an API server would.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No cluster IP of the family is left.
    #[error("Service {key:?}: no {family} cluster IP left in {cidr}")]
    ClusterIpsExhausted {
        /// The Service's key.
        key: String,
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The exhausted range.
        cidr: &'static str,
    },
}

/// What one write did to one object.
#[derive(Clone, Debug, PartialEq)]
pub enum Delta<T> {
    /// Created.
    Added(Arc<T>),
    /// Updated from `old` to `new`.
    Updated { old: Arc<T>, new: Arc<T> },
    /// Deleted; the object as it was last.
    Deleted(Arc<T>),
    /// Nothing changed (a delete of an unknown object).
    Unchanged,
}

/// What one write did, by kind: the event the watch delivers.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Service(Delta<Service>),
    Pool(Delta<IPAddressPool>),
    CiliumPool(Delta<CiliumLoadBalancerIPPool>),
    Namespace(Delta<Namespace>),
    /// The line wrote nothing (SYNCED, BOOKMARK, an unknown kind).
    None,
}

/// The objects of a replay and what an API server keeps beside them.
#[derive(Debug)]
pub struct ReplayStore {
    cache: Arc<ReplayCache>,
    state: Mutex<State>,
}

/// The shared cache the manager reads ([`Store`]): Services in compact
/// form, built on each read; pools (of both kinds) and Namespaces whole
/// (they are few, and the allocator reads them whole).
#[derive(Debug, Default)]
pub(crate) struct ReplayCache {
    services: Mutex<Services>,
    /// Pools of both kinds and Namespaces; its `services` map stays empty.
    objects: DashMapStore,
}

/// Where [`SortedKeys`] finds a Service.
#[derive(Clone, Copy)]
enum Stored<'a> {
    Record(&'a [u8]),
    Whole(&'a Arc<Service>),
}

/// Every Service key in order, each with where its Service is, so that a
/// walk in key order reads each without a lookup (at 100k Services a
/// lookup in key order is a cache miss). Sorting 100k `str`s chases a
/// pointer per comparison into keys spread over the heap; here most
/// comparisons end on the first 16 bytes, kept inline.
struct SortedKeys<'a> {
    /// (the key's first 16 bytes as a big-endian number, zero-padded; the
    /// key; its Service), in key order.
    order: Vec<(u128, &'a str, Stored<'a>)>,
}

impl<'a> SortedKeys<'a> {
    fn of(services: &'a Services) -> Self {
        let records = (services.compact.iter()).map(|(key, record)| (key, Stored::Record(record)));
        let whole = (services.whole.iter()).map(|(key, service)| (key, Stored::Whole(service)));
        let mut order: Vec<_> = records
            .chain(whole)
            .map(|(key, stored)| {
                let mut prefix = [0u8; 16];
                for (to, from) in prefix.iter_mut().zip(key.bytes()) {
                    *to = from;
                }
                (u128::from_be_bytes(prefix), &**key, stored)
            })
            .collect();
        // Equal prefixes (or a key with a NUL where another ends) fall back
        // to the whole keys, so the order is exactly that of the strings.
        order.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        SortedKeys { order }
    }
}

/// How many Services [`Hot`] keeps built.
const HOT_SERVICES: usize = 128;

/// Every Service by key, each in one of the two maps; a Service in [`Hot`]
/// is read from there, and its map entry may be older (see [`Hot`]).
#[derive(Debug, Default)]
struct Services {
    /// The records; a key written and still hot may stand on an older
    /// record, or on an empty one when it is new.
    compact: HashMap<Box<str>, Box<[u8]>, FastHash>,
    /// Those with a field the compact form does not keep (none that a
    /// stream gives: its decoder drops them).
    whole: HashMap<Box<str>, Arc<Service>, FastHash>,
    symbols: compact::Symbols,
    hot: Hot,
}

/// The Services written or read last, kept built: a write is read back at
/// once by the manager, the controller and the write that follows, so
/// most reads are of a Service just written and need no build. A write is
/// encoded only when its Service leaves (write-back): a line's object and
/// the controller's status that follows are one encoding, not two.
#[derive(Debug, Default)]
struct Hot {
    built: HashMap<Box<str>, HotService, FastHash>,
    /// Keys in the order they came in (a removed key may stay: its turn
    /// then only comes early).
    order: VecDeque<Box<str>>,
}

#[derive(Debug)]
struct HotService {
    service: Arc<Service>,
    /// Written since its record was: the record must be made when it leaves.
    written: bool,
}

/// A Service that left [`Hot`] with a write its record does not have yet.
type Unwritten = Option<(Box<str>, Arc<Service>)>;

impl Hot {
    fn get(&self, key: &str) -> Option<Arc<Service>> {
        self.built.get(key).map(|hot| Arc::clone(&hot.service))
    }

    /// Keeps `service` built; the Service it pushes out, if that one was
    /// written and not yet recorded.
    #[must_use]
    fn put(&mut self, key: &str, service: &Arc<Service>, written: bool) -> Unwritten {
        if let Some(hot) = self.built.get_mut(key) {
            hot.service = Arc::clone(service);
            hot.written |= written;
            return None;
        }
        let mut unwritten = None;
        if self.order.len() >= HOT_SERVICES {
            if let Some(oldest) = self.order.pop_front() {
                unwritten = self
                    .built
                    .remove(&oldest)
                    .filter(|hot| hot.written)
                    .map(|hot| (oldest, hot.service));
            }
        }
        self.order.push_back(key.into());
        let service = Arc::clone(service);
        self.built
            .insert(key.into(), HotService { service, written });
        unwritten
    }

    fn remove(&mut self, key: &str) -> Option<Arc<Service>> {
        self.built.remove(key).map(|hot| hot.service)
    }
}

impl Services {
    fn get(&mut self, key: &str) -> Option<Arc<Service>> {
        if let Some(service) = self.hot.get(key) {
            return Some(service);
        }
        let service = match self.compact.get(key) {
            Some(record) => Arc::new(compact::decode(record, key, &self.symbols)),
            None => return self.whole.get(key).cloned(),
        };
        let unwritten = self.hot.put(key, &service, false);
        self.write_back(unwritten);
        Some(service)
    }

    fn len(&self) -> usize {
        self.compact.len() + self.whole.len()
    }

    /// Stores `service` under `key`, replacing what was there; its record
    /// is made when it leaves the hot Services.
    fn insert(&mut self, key: &str, service: &Arc<Service>) {
        if !self.compact.contains_key(key) && !self.whole.contains_key(key) {
            // Counted and listed from now on; never read while hot.
            self.compact.insert(key.into(), Box::default());
        }
        let unwritten = self.hot.put(key, service, true);
        self.write_back(unwritten);
    }

    fn write_back(&mut self, unwritten: Unwritten) {
        if let Some((key, service)) = unwritten {
            self.record(&key, &service);
        }
    }

    /// Makes the record of `service`, replacing the one under `key`.
    fn record(&mut self, key: &str, service: &Arc<Service>) {
        // Encoded before the old record goes, so that the symbols both use
        // stay interned.
        match compact::encode(service, key, &mut self.symbols) {
            Some(record) => {
                debug_assert_eq!(
                    compact::decode(&record, key, &self.symbols),
                    **service,
                    "a Service of the replay store must come back whole from its record"
                );
                self.whole.remove(key);
                if let Some(old) = self.compact.get_mut(key) {
                    let old = std::mem::replace(old, record);
                    compact::release(&old, &mut self.symbols);
                } else {
                    self.compact.insert(key.into(), record);
                }
            }
            None => {
                if let Some(old) = self.compact.remove(key) {
                    compact::release(&old, &mut self.symbols);
                }
                self.whole.insert(key.into(), Arc::clone(service));
            }
        }
    }

    fn remove(&mut self, key: &str) -> Option<Arc<Service>> {
        let hot = self.hot.remove(key);
        match self.compact.remove(key) {
            Some(record) => {
                let service =
                    hot.unwrap_or_else(|| Arc::new(compact::decode(&record, key, &self.symbols)));
                compact::release(&record, &mut self.symbols);
                Some(service)
            }
            None => {
                let whole = self.whole.remove(key);
                hot.or(whole)
            }
        }
    }

    /// Every Service, sorted by key, each built as it is reached.
    fn sorted(&self) -> impl Iterator<Item = (&str, Arc<Service>)> {
        SortedKeys::of(self)
            .order
            .into_iter()
            .map(|(_, key, stored)| {
                let service = self.hot.get(key).unwrap_or_else(|| match stored {
                    Stored::Record(record) => Arc::new(compact::decode(record, key, &self.symbols)),
                    Stored::Whole(service) => Arc::clone(service),
                });
                (key, service)
            })
    }

    /// Every Service, sorted by key.
    fn all(&self) -> Vec<(String, Arc<Service>)> {
        self.sorted()
            .map(|(key, service)| (key.to_owned(), service))
            .collect()
    }
}

impl ReplayCache {
    fn services(&self) -> MutexGuard<'_, Services> {
        self.services.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Store for ReplayCache {
    fn service(&self, key: &str) -> Option<Arc<Service>> {
        self.services().get(key)
    }

    fn service_keys(&self) -> Vec<String> {
        let services = self.services();
        services
            .compact
            .keys()
            .chain(services.whole.keys())
            .map(|key| key.to_string())
            .collect()
    }

    fn pool(&self, name: &str) -> Option<Arc<IPAddressPool>> {
        self.objects.pool(name)
    }

    fn pool_names(&self) -> Vec<String> {
        self.objects.pool_names()
    }

    fn namespace(&self, name: &str) -> Option<Arc<Namespace>> {
        self.objects.namespace(name)
    }

    fn cilium_pool(&self, name: &str) -> Option<Arc<CiliumLoadBalancerIPPool>> {
        self.objects.cilium_pool(name)
    }

    fn cilium_pool_names(&self) -> Vec<String> {
        self.objects.cilium_pool_names()
    }
}

#[derive(Debug)]
struct State {
    resource_version: u64,
    uids: u64,
    /// The store's clock for `creationTimestamp`: one second per created
    /// object, never behind a timestamp a line gave.
    clock: Timestamp,
    ipv4: ClusterIpRange,
    ipv6: ClusterIpRange,
}

impl Default for ReplayStore {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplayStore {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            cache: Arc::new(ReplayCache::default()),
            state: Mutex::new(State {
                resource_version: 0,
                uids: 0,
                clock: Timestamp::UNIX_EPOCH,
                ipv4: ClusterIpRange::ipv4(),
                ipv6: ClusterIpRange::ipv6(),
            }),
        }
    }

    /// The shared cache that holds the current objects (for the manager).
    pub(crate) fn cache(&self) -> Arc<ReplayCache> {
        Arc::clone(&self.cache)
    }

    /// The Service `namespace/name` (built anew on each call).
    pub fn service(&self, key: &str) -> Option<Arc<Service>> {
        self.cache.service(key)
    }

    /// Every Service, sorted by key.
    pub fn services(&self) -> Vec<(String, Arc<Service>)> {
        self.cache.services().all()
    }

    /// Calls `each` with every Service, sorted by key, each built as it is
    /// reached (a cluster's worth of built Services takes ten times the
    /// store's memory). The store stays locked: `each` must not read it.
    pub(crate) fn for_each_service(&self, mut each: impl FnMut(&str, &Service)) {
        let services = self.cache.services();
        for (key, service) in services.sorted() {
            each(key, &service);
        }
    }

    /// How many Services there are.
    pub fn service_count(&self) -> usize {
        self.cache.services().len()
    }

    /// Every `CiliumLoadBalancerIPPool`, sorted by name.
    pub fn cilium_pools(&self) -> Vec<Arc<CiliumLoadBalancerIPPool>> {
        let mut pools: Vec<_> = self
            .cache
            .objects
            .cilium_pools
            .iter()
            .map(|entry| Arc::clone(entry.value()))
            .collect();
        pools.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        pools
    }

    /// The last `resourceVersion` handed out.
    pub fn resource_version(&self) -> u64 {
        self.state().resource_version
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies one decoded line as a client's write.
    pub fn apply(&self, event: WatchEvent) -> Result<Change, StoreError> {
        match event {
            WatchEvent::Added(object) | WatchEvent::Modified(object) => self.upsert(object),
            WatchEvent::Deleted(target) => Ok(self.delete(&target)),
            WatchEvent::Synced | WatchEvent::Bookmark | WatchEvent::Skipped { .. } => {
                Ok(Change::None)
            }
        }
    }

    /// Creates the object, or updates it if it exists (ADDED and MODIFIED
    /// alike: an ADDED of an existing object updates it, a MODIFIED of an
    /// unknown one creates it).
    pub fn upsert(&self, object: Object) -> Result<Change, StoreError> {
        let mut state = self.state();
        match object {
            Object::Service {
                service,
                has_status,
            } => self
                .upsert_service(&mut state, *service, has_status)
                .map(Change::Service),
            Object::Pool(pool) => {
                let name = pool.metadata.name.clone().unwrap_or_default();
                Ok(Change::Pool(upsert_plain(
                    &mut state,
                    &self.cache.objects.pools,
                    name,
                    *pool,
                )))
            }
            Object::CiliumPool(pool) => {
                let name = pool.metadata.name.clone().unwrap_or_default();
                let pools = &self.cache.objects.cilium_pools;
                let mut pool = *pool;
                let old = pools.get(&name).map(|entry| Arc::clone(entry.value()));
                pool.metadata.generation = Some(generation_of(old.as_deref(), &pool));
                Ok(Change::CiliumPool(upsert_plain(
                    &mut state, pools, name, pool,
                )))
            }
            Object::Namespace(namespace) => {
                let name = namespace.metadata.name.clone().unwrap_or_default();
                let namespaces = &self.cache.objects.namespaces;
                Ok(Change::Namespace(upsert_plain(
                    &mut state, namespaces, name, *namespace,
                )))
            }
        }
    }

    /// Deletes the object; an unknown one changes nothing.
    pub fn delete(&self, target: &ObjectRef) -> Change {
        let mut state = self.state();
        let key = target.key();
        match target.kind {
            Kind::Service => {
                let Some(old) = self.cache.services().remove(&key) else {
                    return Change::Service(Delta::Unchanged);
                };
                if let Some(spec) = &old.spec {
                    for ip in cluster_ips_of(spec) {
                        state.release(ip);
                    }
                }
                Change::Service(Delta::Deleted(with_version(&mut state, old)))
            }
            Kind::Pool => Change::Pool(delete_plain(&mut state, &self.cache.objects.pools, &key)),
            Kind::CiliumPool => Change::CiliumPool(delete_plain(
                &mut state,
                &self.cache.objects.cilium_pools,
                &key,
            )),
            Kind::Namespace => Change::Namespace(delete_plain(
                &mut state,
                &self.cache.objects.namespaces,
                &key,
            )),
        }
    }

    /// The controller's write (through the in-memory client): sets
    /// `status.loadBalancer.ingress`, the pool annotation and the
    /// controller's conditions of the Service `key`, touching nothing else.
    /// A write that changes nothing is not made (no new `resourceVersion`,
    /// no event), as on an API server.
    pub fn write_service(
        &self,
        key: &str,
        write: &ServiceWrite,
    ) -> Result<Delta<Service>, ClientError> {
        let mut state = self.state();
        let old = self.service(key).ok_or_else(|| ClientError::NotFound {
            key: key.to_owned(),
        })?;
        let ingress: Vec<LoadBalancerIngress> = write
            .ingress
            .iter()
            .map(|&ip| {
                let mut text = String::with_capacity(15);
                allocator::push_ip(&mut text, ip);
                LoadBalancerIngress {
                    ip: Some(text),
                    ..LoadBalancerIngress::default()
                }
            })
            .collect();
        let current_ingress = old
            .status
            .as_ref()
            .and_then(|status| status.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_deref())
            .unwrap_or_default();
        let current_pool = old
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(POOL_ANNOTATION));
        let current_conditions = old
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_deref())
            .unwrap_or_default();
        let mut conditions = current_conditions.to_vec();
        // Ours (and Cilium's, docs/cilium.md §3.6) merged on their type,
        // the others kept (as a strategic merge patch does); the store's
        // clock is the time of a transition.
        let now = Time(state.clock);
        write.merge_conditions(&mut conditions, &now);
        if current_ingress == ingress.as_slice()
            && current_pool == write.pool.as_ref()
            && current_conditions == conditions.as_slice()
        {
            return Ok(Delta::Unchanged);
        }
        // The status is built, not cloned: its conditions were just merged.
        let Service {
            metadata,
            spec,
            status: _,
        } = &*old;
        let mut new = Service {
            metadata: metadata.clone(),
            spec: spec.clone(),
            status: Some(ServiceStatus {
                conditions: (!conditions.is_empty()).then_some(conditions),
                load_balancer: Some(LoadBalancerStatus {
                    ingress: (!ingress.is_empty()).then_some(ingress),
                }),
            }),
        };
        set_pool_annotation(&mut new.metadata.annotations, write.pool.as_ref());
        new.metadata.resource_version = Some(state.next_version());
        let new = Arc::new(new);
        self.cache.services().insert(key, &new);
        Ok(Delta::Updated { old, new })
    }

    fn upsert_service(
        &self,
        state: &mut State,
        mut service: Service,
        has_status: bool,
    ) -> Result<Delta<Service>, StoreError> {
        let namespace = &mut service.metadata.namespace;
        if namespace.as_deref().is_none_or(str::is_empty) {
            *namespace = Some(DEFAULT_NAMESPACE.to_owned());
        }
        let key = service_key_of(&service.metadata);
        let old = self.service(&key);
        let spec = service.spec.get_or_insert_with(ServiceSpec::default);
        if spec.type_.as_deref().is_none_or(str::is_empty) {
            spec.type_ = Some("ClusterIP".to_owned());
        }
        if spec.type_.as_deref() == Some("LoadBalancer") && spec.external_traffic_policy.is_none() {
            spec.external_traffic_policy = Some("Cluster".to_owned());
        }
        match &old {
            None => {
                state.fill_cluster_ips(&key, spec)?;
                if service.metadata.uid.as_deref().is_none_or(str::is_empty) {
                    service.metadata.uid = Some(state.next_uid());
                }
            }
            Some(old) => {
                // Immutable here: the stored ones stay.
                let stored = old.spec.as_ref();
                spec.cluster_ip = stored.and_then(|s| s.cluster_ip.clone());
                spec.cluster_ips = stored.and_then(|s| s.cluster_ips.clone());
                spec.ip_families = stored.and_then(|s| s.ip_families.clone());
                spec.ip_family_policy = stored.and_then(|s| s.ip_family_policy.clone());
                keep_identity(&mut service.metadata, &old.metadata);
                if !has_status {
                    service.status = old.status.clone();
                }
            }
        }
        service.metadata.resource_version = Some(state.next_version());
        let new = Arc::new(service);
        self.cache.services().insert(&key, &new);
        Ok(match old {
            None => Delta::Added(new),
            Some(old) => Delta::Updated { old, new },
        })
    }
}

/// `uid` and `creationTimestamp` never change on an update.
fn keep_identity(new: &mut ObjectMeta, old: &ObjectMeta) {
    if old.uid.is_some() {
        new.uid = old.uid.clone();
    }
    if old.creation_timestamp.is_some() {
        new.creation_timestamp = old.creation_timestamp.clone();
    }
}

/// The objects of the store, by their metadata.
trait Meta: Clone {
    fn meta(&self) -> &ObjectMeta;
    fn meta_mut(&mut self) -> &mut ObjectMeta;
}

impl Meta for Service {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Meta for IPAddressPool {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Meta for CiliumLoadBalancerIPPool {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A Cilium pool's `metadata.generation`, as an API server keeps it: the
/// line's (a recorded object's) or 1 on create, +1 on each spec change;
/// its conditions' `observedGeneration` reports it (docs/cilium.md §6).
fn generation_of(old: Option<&CiliumLoadBalancerIPPool>, new: &CiliumLoadBalancerIPPool) -> i64 {
    match old {
        None => new.metadata.generation.filter(|g| *g > 0).unwrap_or(1),
        Some(old) => {
            let generation = old.metadata.generation.unwrap_or(1);
            if old.spec == new.spec {
                generation
            } else {
                generation.saturating_add(1)
            }
        }
    }
}

impl Meta for Namespace {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A pool or Namespace: created or replaced as given.
fn upsert_plain<T: Meta>(
    state: &mut State,
    map: &DashMap<String, Arc<T>>,
    key: String,
    mut object: T,
) -> Delta<T> {
    let old = map.get(&key).map(|entry| Arc::clone(entry.value()));
    let meta = object.meta_mut();
    match &old {
        Some(old) => keep_identity(meta, old.meta()),
        None => {
            if meta.uid.as_deref().is_none_or(str::is_empty) {
                meta.uid = Some(state.next_uid());
            }
            meta.creation_timestamp = Some(state.created_at(meta.creation_timestamp.as_ref()));
        }
    }
    meta.resource_version = Some(state.next_version());
    let new = Arc::new(object);
    map.insert(key, Arc::clone(&new));
    match old {
        None => Delta::Added(new),
        Some(old) => Delta::Updated { old, new },
    }
}

fn delete_plain<T: Meta>(state: &mut State, map: &DashMap<String, Arc<T>>, key: &str) -> Delta<T> {
    match map.remove(key) {
        Some((_, old)) => Delta::Deleted(with_version(state, old)),
        None => Delta::Unchanged,
    }
}

/// A deleted object with the delete's `resourceVersion` (copied only if
/// someone else still holds it).
fn with_version<T: Meta>(state: &mut State, object: Arc<T>) -> Arc<T> {
    let mut object = Arc::unwrap_or_clone(object);
    object.meta_mut().resource_version = Some(state.next_version());
    Arc::new(object)
}

/// The parsable cluster IPs of a Service (`None` and garbage left out).
fn cluster_ips_of(spec: &ServiceSpec) -> Vec<IpAddr> {
    let listed = spec.cluster_ips.as_deref().unwrap_or_default();
    let ips: Vec<&String> = if listed.is_empty() {
        spec.cluster_ip.iter().collect()
    } else {
        listed.iter().collect()
    };
    ips.into_iter()
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .collect()
}

fn family_of(ip: IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(_) => IPV4,
        IpAddr::V6(_) => IPV6,
    }
}

impl State {
    /// The creation time of a new object: after every object seen so far
    /// (as an API server's clock only moves forward), so pools are ordered
    /// by creation even when their events reach the manager coalesced.
    fn created_at(&mut self, given: Option<&Time>) -> Time {
        let time = match given {
            Some(Time(given)) => (*given).max(self.clock),
            None => self
                .clock
                .checked_add(SignedDuration::from_secs(1))
                .unwrap_or(self.clock),
        };
        self.clock = time;
        Time(given.map_or(time, |Time(given)| *given))
    }

    fn next_version(&mut self) -> String {
        self.resource_version = self.resource_version.saturating_add(1);
        self.resource_version.to_string()
    }

    /// A UUID-shaped uid from a counter: deterministic, unique per store.
    fn next_uid(&mut self) -> String {
        self.uids = self.uids.saturating_add(1);
        format!("00000000-0000-4000-8000-{:012x}", self.uids)
    }

    fn range(&mut self, ip: IpAddr) -> &mut ClusterIpRange {
        match ip {
            IpAddr::V4(_) => &mut self.ipv4,
            IpAddr::V6(_) => &mut self.ipv6,
        }
    }

    fn reserve(&mut self, ip: IpAddr) {
        self.range(ip).reserve(ip);
    }

    fn release(&mut self, ip: IpAddr) {
        self.range(ip).release(ip);
    }

    /// Fills `spec.ipFamilyPolicy`, `spec.ipFamilies`, `spec.clusterIP` and
    /// `spec.clusterIPs` of a new Service where it leaves them out, as an
    /// API server of a dual-stack cluster (IPv4 primary) does.
    fn fill_cluster_ips(&mut self, key: &str, spec: &mut ServiceSpec) -> Result<(), StoreError> {
        if spec.type_.as_deref() == Some("ExternalName") {
            // An API server gives an ExternalName Service no cluster IP.
            for ip in cluster_ips_of(spec) {
                self.reserve(ip);
            }
            return Ok(());
        }
        let mut cluster_ips = given_cluster_ips(spec);
        let headless = cluster_ips.first().is_some_and(|ip| ip == "None");
        let families = fill_family_policy(spec, &cluster_ips, headless);
        if !headless {
            for ip in cluster_ips
                .iter()
                .filter_map(|ip| ip.parse::<IpAddr>().ok())
            {
                self.reserve(ip);
            }
            for family in families.iter().skip(cluster_ips.len()) {
                let (range, family) = match family.as_str() {
                    IPV4 => (&mut self.ipv4, IPV4),
                    IPV6 => (&mut self.ipv6, IPV6),
                    // An unknown family gets no cluster IP.
                    _ => continue,
                };
                let ip = range
                    .allocate()
                    .ok_or_else(|| StoreError::ClusterIpsExhausted {
                        key: key.to_owned(),
                        family,
                        cidr: range.cidr,
                    })?;
                cluster_ips.push(ip.to_string());
            }
        }
        spec.ip_families = Some(families);
        spec.cluster_ip = cluster_ips.first().cloned();
        spec.cluster_ips = if cluster_ips.is_empty() {
            None
        } else {
            Some(cluster_ips)
        };
        Ok(())
    }
}

/// Sets (or removes) the pool annotation, leaving no empty map behind.
fn set_pool_annotation(annotations: &mut Option<BTreeMap<String, String>>, pool: Option<&String>) {
    match pool {
        Some(pool) => {
            annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(POOL_ANNOTATION.to_owned(), pool.clone());
        }
        None => {
            if let Some(map) = annotations {
                map.remove(POOL_ANNOTATION);
                if map.is_empty() {
                    *annotations = None;
                }
            }
        }
    }
}

/// The cluster IPs a new Service gives itself (`clusterIPs`, else
/// `clusterIP`), empty ones left out.
fn given_cluster_ips(spec: &ServiceSpec) -> Vec<String> {
    let mut cluster_ips: Vec<String> = spec
        .cluster_ips
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|ip| !ip.is_empty())
        .collect();
    if cluster_ips.is_empty() {
        if let Some(ip) = spec.cluster_ip.as_ref().filter(|ip| !ip.is_empty()) {
            cluster_ips.push(ip.clone());
        }
    }
    cluster_ips
}

/// Sets `spec.ipFamilyPolicy` where it is left out, as an API server does,
/// and returns the Service's families in order (IPv4 first unless asked).
fn fill_family_policy(
    spec: &mut ServiceSpec,
    cluster_ips: &[String],
    headless: bool,
) -> Vec<String> {
    let mut families = spec.ip_families.clone().unwrap_or_default();
    if families.is_empty() && !headless {
        families = cluster_ips
            .iter()
            .filter_map(|ip| ip.parse::<IpAddr>().ok())
            .map(|ip| family_of(ip).to_owned())
            .collect();
    }
    let policy = spec.ip_family_policy.get_or_insert_with(|| {
        // Two families asked for without a policy: an API server makes
        // the Service RequireDualStack.
        if families.len() >= 2 || cluster_ips.len() >= 2 {
            REQUIRE_DUAL_STACK.to_owned()
        } else {
            SINGLE_STACK.to_owned()
        }
    });
    let dual = policy != SINGLE_STACK;
    if families.is_empty() {
        families.push(IPV4.to_owned());
    }
    if dual && families.len() == 1 {
        let other = if families.first().is_some_and(|f| f == IPV6) {
            IPV4
        } else {
            IPV6
        };
        families.push(other.to_owned());
    }
    families
}

/// Cluster IPs of one family, handed out lowest free first: offsets from
/// the range's base, 1 up (the network address, and IPv4's broadcast
/// address, are never handed out).
#[derive(Debug)]
struct ClusterIpRange {
    cidr: &'static str,
    base: u128,
    /// The highest offset handed out.
    last: u128,
    v6: bool,
    /// Offset → how many Services hold it (a recorded stream may repeat one).
    used: BTreeMap<u128, u32>,
    /// Free offsets below `next`.
    free_below: BTreeSet<u128>,
    /// Every offset from here up is free unless in `used`.
    next: u128,
}

impl ClusterIpRange {
    fn ipv4() -> Self {
        let base = u32::from(Ipv4Addr::new(10, 96, 0, 0));
        Self::new(SERVICE_CIDR_V4, u128::from(base), (1 << 20) - 2, false)
    }

    fn ipv6() -> Self {
        let base = u128::from(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0));
        Self::new(SERVICE_CIDR_V6, base, (1 << 20) - 1, true)
    }

    fn new(cidr: &'static str, base: u128, last: u128, v6: bool) -> Self {
        Self {
            cidr,
            base,
            last,
            v6,
            used: BTreeMap::new(),
            free_below: BTreeSet::new(),
            next: 1,
        }
    }

    fn offset(&self, ip: IpAddr) -> Option<u128> {
        let value = match (ip, self.v6) {
            (IpAddr::V4(ip), false) => u128::from(u32::from(ip)),
            (IpAddr::V6(ip), true) => u128::from(ip),
            _ => return None,
        };
        let offset = value.checked_sub(self.base)?;
        (1..=self.last).contains(&offset).then_some(offset)
    }

    fn address(&self, offset: u128) -> IpAddr {
        let value = self.base.saturating_add(offset);
        if self.v6 {
            IpAddr::V6(Ipv6Addr::from(value))
        } else {
            IpAddr::V4(Ipv4Addr::from(u32::try_from(value).unwrap_or(u32::MAX)))
        }
    }

    fn allocate(&mut self) -> Option<IpAddr> {
        let offset = match self.free_below.pop_first() {
            Some(offset) => offset,
            None => loop {
                if self.next > self.last {
                    return None;
                }
                let offset = self.next;
                self.next = self.next.saturating_add(1);
                if !self.used.contains_key(&offset) {
                    break offset;
                }
            },
        };
        self.used.insert(offset, 1);
        Some(self.address(offset))
    }

    fn reserve(&mut self, ip: IpAddr) {
        let Some(offset) = self.offset(ip) else {
            return;
        };
        let count = self.used.entry(offset).or_insert(0);
        *count = count.saturating_add(1);
        self.free_below.remove(&offset);
    }

    fn release(&mut self, ip: IpAddr) {
        let Some(offset) = self.offset(ip) else {
            return;
        };
        let Some(count) = self.used.get_mut(&offset) else {
            return;
        };
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.used.remove(&offset);
            if offset < self.next {
                self.free_below.insert(offset);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::stream::decode_event;

    fn apply(store: &ReplayStore, line: serde_json::Value) -> Change {
        let event = decode_event(&line.to_string()).unwrap();
        store.apply(event).unwrap()
    }

    fn service(name: &str, spec: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec})
    }

    fn added(object: serde_json::Value) -> serde_json::Value {
        json!({"type": "ADDED", "object": object})
    }

    fn modified(object: serde_json::Value) -> serde_json::Value {
        json!({"type": "MODIFIED", "object": object})
    }

    fn deleted(object: serde_json::Value) -> serde_json::Value {
        json!({"type": "DELETED", "object": object})
    }

    fn spec_of(store: &ReplayStore, key: &str) -> ServiceSpec {
        store.service(key).unwrap().spec.clone().unwrap()
    }

    fn ips(spec: &ServiceSpec) -> Vec<String> {
        spec.cluster_ips.clone().unwrap_or_default()
    }

    #[test]
    fn a_write_is_recorded_when_it_leaves_the_hot_services() {
        let with_label = |value: &str| {
            let mut service = Service::default();
            service.metadata.name = Some("web".to_owned());
            service.metadata.namespace = Some("default".to_owned());
            service.metadata.labels = Some(BTreeMap::from([("app".to_owned(), value.to_owned())]));
            Arc::new(service)
        };
        let mut services = Services::default();
        services.insert("default/web", &with_label("first"));
        services.insert("default/web", &with_label("second"));
        // Counted and listed at once, recorded only when pushed out.
        assert_eq!(services.len(), 1);
        assert_eq!(
            services.compact.get("default/web").map(|r| r.len()),
            Some(0)
        );
        for i in 0..HOT_SERVICES {
            services.insert(&format!("default/other-{i}"), &Arc::default());
        }
        assert!(services.hot.get("default/web").is_none());
        let record = services.compact.get("default/web").unwrap();
        let read = compact::decode(record, "default/web", &services.symbols);
        assert_eq!(read, *with_label("second"));
        // Written again while hot: removing it returns that write and
        // releases the older record's symbols.
        services.insert("default/web", &with_label("third"));
        assert_eq!(services.remove("default/web"), Some(with_label("third")));
        for i in 0..HOT_SERVICES {
            services.remove(&format!("default/other-{i}"));
        }
        assert_eq!(services.len(), 0);
        assert_eq!(services.symbols.len(), 0);
    }

    #[test]
    fn sorted_keys_are_in_string_order_past_the_first_16_bytes() {
        let mut services = Services::default();
        let keys = [
            "namespace-long/b",
            "namespace-long/a-very-long-name-2",
            "namespace-long/a-very-long-name-10",
            "namespace-long/a",
            "namespace-lon/z",
            "a/b",
            "namespace-long/",
            "zz/\u{e9}",
        ];
        for key in keys {
            services.compact.insert(key.into(), Box::new([]));
        }
        services
            .whole
            .insert("namespace-long/a-very-long".into(), Arc::default());
        let sorted = SortedKeys::of(&services);
        let got: Vec<&str> = sorted.order.iter().map(|&(_, key, _)| key).collect();
        let mut expected: Vec<&str> = keys.to_vec();
        expected.push("namespace-long/a-very-long");
        expected.sort_unstable();
        assert_eq!(got, expected);
    }

    #[test]
    fn a_new_service_gets_what_an_api_server_fills_in() {
        let store = ReplayStore::new();
        let change = apply(
            &store,
            added(service("web", json!({"type": "LoadBalancer"}))),
        );
        let Change::Service(Delta::Added(web)) = change else {
            panic!("{change:?}")
        };
        assert_eq!(web.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(
            web.metadata.uid.as_deref(),
            Some("00000000-0000-4000-8000-000000000001")
        );
        assert_eq!(web.metadata.resource_version.as_deref(), Some("1"));
        let spec = web.spec.clone().unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
        assert_eq!(spec.ip_families, Some(vec!["IPv4".to_owned()]));
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.1"));
        assert_eq!(ips(&spec), ["10.96.0.1"]);
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Cluster"));

        apply(&store, added(service("plain", json!(null))));
        let spec = spec_of(&store, "default/plain");
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.external_traffic_policy, None);
        assert_eq!(ips(&spec), ["10.96.0.2"]);
    }

    #[test]
    fn given_fields_are_kept() {
        let store = ReplayStore::new();
        let object = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "prod", "uid": "u-1"},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                     "clusterIPs": ["10.96.0.1"]}});
        apply(&store, added(object));
        let web = store.service("prod/web").unwrap();
        assert_eq!(web.metadata.uid.as_deref(), Some("u-1"));
        let spec = web.spec.clone().unwrap();
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.1"));
        // The given cluster IP is taken: the next Service gets the one after.
        apply(&store, added(service("db", json!({}))));
        assert_eq!(ips(&spec_of(&store, "default/db")), ["10.96.0.2"]);
    }

    #[test]
    fn cluster_ips_lowest_free_first_and_freed_on_delete() {
        let store = ReplayStore::new();
        for name in ["a", "b", "c"] {
            apply(&store, added(service(name, json!({}))));
        }
        // A recorded Service far up the range does not move the others.
        apply(
            &store,
            added(service("far", json!({"clusterIP": "10.96.0.5"}))),
        );
        assert_eq!(ips(&spec_of(&store, "default/far")), ["10.96.0.5"]);
        apply(&store, deleted(service("b", json!(null))));
        apply(&store, deleted(service("a", json!(null))));
        apply(&store, added(service("d", json!({}))));
        assert_eq!(ips(&spec_of(&store, "default/d")), ["10.96.0.1"]);
        apply(&store, added(service("e", json!({}))));
        assert_eq!(ips(&spec_of(&store, "default/e")), ["10.96.0.2"]);
        apply(&store, added(service("f", json!({}))));
        assert_eq!(ips(&spec_of(&store, "default/f")), ["10.96.0.4"]);
        apply(&store, added(service("g", json!({}))));
        assert_eq!(ips(&spec_of(&store, "default/g")), ["10.96.0.6"]);
    }

    #[test]
    fn dual_stack_by_policy_and_by_families() {
        let store = ReplayStore::new();
        apply(
            &store,
            added(service(
                "prefer",
                json!({"ipFamilyPolicy": "PreferDualStack"}),
            )),
        );
        let spec = spec_of(&store, "default/prefer");
        assert_eq!(ips(&spec), ["10.96.0.1", "fd00:10:96::1"]);
        assert_eq!(
            spec.ip_families,
            Some(vec!["IPv4".to_owned(), "IPv6".to_owned()])
        );

        apply(
            &store,
            added(service("v6", json!({"ipFamilies": ["IPv6"]}))),
        );
        let spec = spec_of(&store, "default/v6");
        assert_eq!(ips(&spec), ["fd00:10:96::2"]);
        assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));

        apply(
            &store,
            added(service(
                "v6first",
                json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6"]}),
            )),
        );
        let spec = spec_of(&store, "default/v6first");
        assert_eq!(ips(&spec), ["fd00:10:96::3", "10.96.0.2"]);
        assert_eq!(
            spec.ip_families,
            Some(vec!["IPv6".to_owned(), "IPv4".to_owned()])
        );

        // Two families without a policy: RequireDualStack.
        apply(
            &store,
            added(service("two", json!({"ipFamilies": ["IPv4", "IPv6"]}))),
        );
        let spec = spec_of(&store, "default/two");
        assert_eq!(spec.ip_family_policy.as_deref(), Some("RequireDualStack"));
        assert_eq!(ips(&spec), ["10.96.0.3", "fd00:10:96::4"]);

        // Families derived from given cluster IPs.
        apply(
            &store,
            added(service(
                "given",
                json!({"clusterIPs": ["fd00:10:96::99", "10.96.1.1"]}),
            )),
        );
        let spec = spec_of(&store, "default/given");
        assert_eq!(
            spec.ip_families,
            Some(vec!["IPv6".to_owned(), "IPv4".to_owned()])
        );
        assert_eq!(spec.ip_family_policy.as_deref(), Some("RequireDualStack"));
        assert_eq!(spec.cluster_ip.as_deref(), Some("fd00:10:96::99"));
    }

    #[test]
    fn headless_and_external_name_get_no_cluster_ip() {
        let store = ReplayStore::new();
        apply(
            &store,
            added(service("headless", json!({"clusterIP": "None"}))),
        );
        let spec = spec_of(&store, "default/headless");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(ips(&spec), ["None"]);
        assert_eq!(spec.ip_families, Some(vec!["IPv4".to_owned()]));
        apply(
            &store,
            added(service(
                "ext",
                json!({"type": "ExternalName", "externalName": "example.com"}),
            )),
        );
        let spec = spec_of(&store, "default/ext");
        assert_eq!(spec.cluster_ip, None);
        assert_eq!(spec.ip_families, None);
        apply(&store, added(service("next", json!({}))));
        assert_eq!(ips(&spec_of(&store, "default/next")), ["10.96.0.1"]);
    }

    #[test]
    fn modified_keeps_status_without_a_status_key_and_immutable_fields() {
        let store = ReplayStore::new();
        apply(
            &store,
            added(service("web", json!({"type": "LoadBalancer"}))),
        );
        let write = ServiceWrite {
            ingress: vec!["192.168.1.1".parse().unwrap()],
            pool: Some("default".to_owned()),
            ..ServiceWrite::default()
        };
        store.write_service("default/web", &write).unwrap();
        // A spec update without status: status stays; metadata replaced.
        let change = apply(
            &store,
            modified(service(
                "web",
                json!({"type": "LoadBalancer", "clusterIP": "10.96.9.9",
                       "ipFamilyPolicy": "PreferDualStack", "ports": [{"port": 80}]}),
            )),
        );
        let Change::Service(Delta::Updated { old, new }) = change else {
            panic!("{change:?}")
        };
        assert_eq!(old.metadata.resource_version.as_deref(), Some("2"));
        assert_eq!(new.metadata.resource_version.as_deref(), Some("3"));
        assert_eq!(new.metadata.uid, old.metadata.uid);
        assert_eq!(new.metadata.annotations, None);
        assert_eq!(new.status, old.status);
        let spec = new.spec.clone().unwrap();
        assert_eq!(ips(&spec), ["10.96.0.1"]);
        assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
        assert_eq!(spec.ports.map(|p| p.len()), Some(1));
        // With a status key, the status is replaced (here: cleared).
        let mut object = service("web", json!({"type": "LoadBalancer"}));
        object["status"] = json!({});
        apply(&store, modified(object));
        let web = store.service("default/web").unwrap();
        let ingress = web
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.clone());
        assert_eq!(ingress, None);
    }

    #[test]
    fn modified_creates_added_updates_deleted_of_unknown_does_nothing() {
        let store = ReplayStore::new();
        let change = apply(&store, modified(service("web", json!({}))));
        assert!(matches!(change, Change::Service(Delta::Added(_))));
        assert_eq!(ips(&spec_of(&store, "default/web")), ["10.96.0.1"]);
        let change = apply(&store, added(service("web", json!({}))));
        assert!(matches!(change, Change::Service(Delta::Updated { .. })));
        let change = apply(&store, deleted(service("nope", json!(null))));
        assert_eq!(change, Change::Service(Delta::Unchanged));
        assert_eq!(store.resource_version(), 2);
        let change = apply(&store, deleted(service("web", json!(null))));
        let Change::Service(Delta::Deleted(gone)) = change else {
            panic!("{change:?}")
        };
        assert_eq!(gone.metadata.resource_version.as_deref(), Some("3"));
        assert!(store.service("default/web").is_none());
    }

    #[test]
    fn services_read_back_as_written_whether_compact_or_whole_and_leave_nothing() {
        let store = ReplayStore::new();
        // Many more than are kept built, so that most reads build.
        for i in 0..HOT_SERVICES * 3 {
            let labels = json!({"app": format!("app-{i}"), "tier": "front"});
            let mut object = service(
                &format!("web-{i}"),
                json!({"type": "LoadBalancer",
                "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}]}),
            );
            object["metadata"]["labels"] = labels;
            apply(&store, added(object));
        }
        // A field the compact form does not keep (no stream gives one).
        let whole: Service = serde_json::from_value(json!({
            "metadata": {"name": "named", "namespace": "default", "finalizers": ["f"]},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "name": "http"}]},
        }))
        .unwrap();
        let change = store
            .upsert(Object::Service {
                service: Box::new(whole.clone()),
                has_status: false,
            })
            .unwrap();
        let Change::Service(Delta::Added(added_whole)) = change else {
            panic!("{change:?}")
        };
        assert_eq!(store.service("default/named"), Some(added_whole.clone()));
        assert_eq!(added_whole.metadata.finalizers, whole.metadata.finalizers);
        let ports = |service: &Service| service.spec.as_ref().and_then(|spec| spec.ports.clone());
        assert_eq!(ports(&added_whole), ports(&whole));
        assert_eq!(store.service_count(), HOT_SERVICES * 3 + 1);
        let all = store.services();
        let mut visited = Vec::new();
        store.for_each_service(|key, service| visited.push((key.to_owned(), service.clone())));
        assert_eq!(all.len(), visited.len());
        for ((key, service), (seen_key, seen)) in all.iter().zip(&visited) {
            assert_eq!((key, &**service), (seen_key, seen));
        }
        let first = &all
            .iter()
            .find(|(key, _)| key == "default/web-0")
            .unwrap()
            .1;
        assert_eq!(
            first
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .get("app")
                .map(String::as_str),
            Some("app-0")
        );
        assert_eq!(
            first.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port,
            None
        );
        for (key, _) in &all {
            let name = key.strip_prefix("default/").unwrap();
            let change = apply(&store, deleted(service(name, json!(null))));
            assert!(
                matches!(change, Change::Service(Delta::Deleted(_))),
                "{key}"
            );
        }
        assert_eq!(store.service_count(), 0);
        assert_eq!(store.cache().services().symbols.len(), 0);
    }

    #[test]
    fn pools_and_namespaces_are_plain() {
        let store = ReplayStore::new();
        let pool = json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "p"}, "spec": {"addresses": ["10.0.0.0/24"]}});
        let change = apply(&store, added(pool.clone()));
        assert!(matches!(change, Change::Pool(Delta::Added(_))));
        let change = apply(&store, modified(pool.clone()));
        let Change::Pool(Delta::Updated { old, new }) = change else {
            panic!("{change:?}")
        };
        assert_eq!(old.metadata.uid, new.metadata.uid);
        assert_eq!(new.metadata.resource_version.as_deref(), Some("2"));
        assert!(matches!(
            apply(&store, deleted(pool)),
            Change::Pool(Delta::Deleted(_))
        ));
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "prod", "labels": {"team": "a"}}});
        assert!(matches!(
            apply(&store, added(namespace)),
            Change::Namespace(Delta::Added(_))
        ));
        assert!(store.cache().objects.namespaces.contains_key("prod"));
    }

    #[test]
    fn cilium_pools_of_both_versions_get_a_creation_time_and_a_generation() {
        let store = ReplayStore::new();
        let pool = |version: &str, cidr: &str| {
            json!({"apiVersion": version, "kind": "CiliumLoadBalancerIPPool",
                "metadata": {"name": "blue"}, "spec": {"blocks": [{"cidr": cidr}]}})
        };
        // An IPAddressPool of the same name is another object.
        let metallb = json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "blue"}, "spec": {"addresses": ["10.1.0.0/24"]}});
        apply(&store, added(metallb));
        let change = apply(&store, added(pool("cilium.io/v2alpha1", "10.0.0.0/24")));
        let Change::CiliumPool(Delta::Added(new)) = change else {
            panic!("{change:?}")
        };
        assert_eq!(new.metadata.generation, Some(1));
        assert_eq!(
            new.metadata
                .creation_timestamp
                .as_ref()
                .unwrap()
                .0
                .to_string(),
            "1970-01-01T00:00:02Z"
        );
        // The same spec again: same generation; another spec: the next.
        let change = apply(&store, modified(pool("cilium.io/v2", "10.0.0.0/24")));
        let Change::CiliumPool(Delta::Updated { new, .. }) = change else {
            panic!("{change:?}")
        };
        assert_eq!(new.metadata.generation, Some(1));
        let change = apply(&store, modified(pool("cilium.io/v2", "10.0.0.0/25")));
        let Change::CiliumPool(Delta::Updated { old, new }) = change else {
            panic!("{change:?}")
        };
        assert_eq!(new.metadata.generation, Some(2));
        assert_eq!(
            old.metadata.creation_timestamp,
            new.metadata.creation_timestamp
        );
        assert!(store.cache().objects.pools.contains_key("blue"));
        assert!(matches!(
            apply(&store, deleted(pool("cilium.io/v2", ""))),
            Change::CiliumPool(Delta::Deleted(_))
        ));
        assert!(!store.cache().objects.cilium_pools.contains_key("blue"));
        assert!(store.cache().objects.pools.contains_key("blue"));
    }

    #[test]
    fn controller_writes_set_status_and_annotation_and_skip_no_ops() {
        let store = ReplayStore::new();
        let mut object = service("web", json!({"type": "LoadBalancer"}));
        // (An annotation the rules do not read is not even stored.)
        object["metadata"]["annotations"] =
            json!({"metallb.io/keep": "me", "example.com/dropped": "x"});
        apply(&store, added(object));
        let write = ServiceWrite {
            ingress: vec!["192.168.1.1".parse().unwrap(), "fc00::1".parse().unwrap()],
            pool: Some("p".to_owned()),
            ..ServiceWrite::default()
        };
        let change = store.write_service("default/web", &write).unwrap();
        let Delta::Updated { new, .. } = change else {
            panic!("{change:?}")
        };
        let json = serde_json::to_value(&*new).unwrap();
        assert_eq!(
            json["status"],
            json!({"loadBalancer": {"ingress": [{"ip": "192.168.1.1"}, {"ip": "fc00::1"}]}})
        );
        assert_eq!(
            json["metadata"]["annotations"],
            json!({"metallb.io/keep": "me", "metallb.io/ip-allocated-from-pool": "p"})
        );
        assert_eq!(json["metadata"]["resourceVersion"], json!("2"));
        assert_eq!(
            store.write_service("default/web", &write).unwrap(),
            Delta::Unchanged
        );
        let clear = ServiceWrite::default();
        let Delta::Updated { new, .. } = store.write_service("default/web", &clear).unwrap() else {
            panic!()
        };
        let json = serde_json::to_value(&*new).unwrap();
        assert_eq!(json["status"], json!({"loadBalancer": {}}));
        assert_eq!(
            json["metadata"]["annotations"],
            json!({"metallb.io/keep": "me"})
        );
        assert!(matches!(
            store.write_service("default/gone", &clear),
            Err(ClientError::NotFound { .. })
        ));
    }

    #[test]
    fn an_exhausted_range_is_an_error_not_a_panic() {
        let mut range = ClusterIpRange::new("test", 0, 2, false);
        assert_eq!(range.allocate(), Some("0.0.0.1".parse().unwrap()));
        assert_eq!(range.allocate(), Some("0.0.0.2".parse().unwrap()));
        assert_eq!(range.allocate(), None);
        range.release("0.0.0.1".parse().unwrap());
        assert_eq!(range.allocate(), Some("0.0.0.1".parse().unwrap()));
    }
}
