//! The machinery of the Manager's integration tests (tests/controller.rs,
//! tests/cilium.rs): the replay's fake client, `fake_watcher::MemoryClient`
//! over a `ReplayStore` (the one fake client of the workspace), which
//! writes into the shared cache and delivers every write back as a watch
//! would; Services built as JSON; and a harness that drives a started
//! Manager and checks the controller's invariants (docs/allocation.md §6)
//! after every step.

// Each test binary uses a subset of this module.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use fake_watcher::{
    Change, Delta, FailurePlan, Kind, MemoryClient, Object, ObjectRef, ReplayStore, WriteOutcome,
};
use k8s_openapi::api::core::v1::{Namespace, Service};
use manager::{
    AllocatingController, ConditionKind, ControllerConfig, EventType, Manager, ManagerConfig,
    Store, CONDITION_TYPE, POOL_ANNOTATION,
};
use serde_json::{json, Value};
use subscriber::{Chain, CiliumLoadBalancerIPPool, Handler, IPAddressPool};
use tokio_util::sync::CancellationToken;

// ----- the records -----

/// One thing the controller did through the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    Write {
        key: String,
        ingress: Vec<String>,
        pool: Option<String>,
    },
    /// A write that changed only the conditions (addresses and pool
    /// annotation as they were), or nothing.
    ConditionWrite { key: String, ingress: Vec<String> },
    /// A write the client refused (failure injection).
    FailedWrite { key: String },
    Event {
        key: String,
        event_type: EventType,
        reason: String,
        message: String,
    },
}

/// For each write the client delivered back, in order: whether it changed
/// the addresses or the pool annotation (a [`Record::Write`]) or only the
/// conditions. It sits on the Service chain beside the manager, which
/// carries the client's writes only (the harness tells the manager of its
/// own changes directly).
#[derive(Default)]
struct Echoes(Mutex<Vec<bool>>);

#[async_trait]
impl Handler<Service> for Echoes {
    async fn on_add(&self, _: &Service) -> Result<(), subscriber::Error> {
        Ok(())
    }

    async fn on_update(&self, old: &Service, new: &Service) -> Result<(), subscriber::Error> {
        let moved = manager::status_ips(new) != manager::status_ips(old)
            || manager::pool_annotation(new) != manager::pool_annotation(old);
        self.0.lock().unwrap().push(moved);
        Ok(())
    }

    async fn on_delete(&self, _: &Service) -> Result<(), subscriber::Error> {
        Ok(())
    }
}

/// The client's writes and Events as records, in the order they were made.
fn records(client: &MemoryClient, echoes: &Echoes) -> Vec<Record> {
    let mut moved = echoes.0.lock().unwrap().clone().into_iter();
    let writes: Vec<Option<Record>> = client
        .writes()
        .into_iter()
        .map(|write| {
            let key = write.key;
            let ingress = write.ips.iter().map(IpAddr::to_string).collect();
            match write.outcome {
                WriteOutcome::Written if moved.next().expect("an echo per write") => {
                    let pool = write.pool;
                    Some(Record::Write { key, ingress, pool })
                }
                WriteOutcome::Written | WriteOutcome::Unchanged => {
                    Some(Record::ConditionWrite { key, ingress })
                }
                WriteOutcome::Injected => Some(Record::FailedWrite { key }),
                // A write to a Service gone is no write.
                WriteOutcome::NotFound | WriteOutcome::Refused => None,
            }
        })
        .collect();
    let mut writes = writes.into_iter();
    let mut done = 0;
    let mut records = Vec::new();
    for (before, event) in client.events_after_writes() {
        records.extend(writes.by_ref().take(before - done).flatten());
        done = before;
        let event_type = match event.event_type.as_str() {
            "Warning" => EventType::Warning,
            _ => EventType::Normal,
        };
        records.push(Record::Event {
            key: event.key,
            event_type,
            reason: event.reason,
            message: event.message,
        });
    }
    records.extend(writes.flatten());
    records
}

// ----- objects -----

/// A Service under construction, as the JSON a cluster returns.
#[derive(Clone, Debug)]
pub(crate) struct Svc(pub(crate) Value);

/// A `type: LoadBalancer`, single-stack IPv4 Service `namespace/name` with
/// port 80/TCP, externalTrafficPolicy Cluster and selector `app: name`.
pub(crate) fn svc(key: &str) -> Svc {
    let (namespace, name) = key.split_once('/').expect("namespace/name");
    Svc(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "ports": [{"name": "tcp-80", "port": 80, "protocol": "TCP"}],
            "selector": {"app": name},
            "externalTrafficPolicy": "Cluster",
        },
    }))
}

impl Svc {
    pub(crate) fn key(&self) -> String {
        let meta = &self.0["metadata"];
        format!(
            "{}/{}",
            meta["namespace"].as_str().unwrap(),
            meta["name"].as_str().unwrap()
        )
    }

    pub(crate) fn set(mut self, path: &[&str], value: Value) -> Self {
        let mut at = &mut self.0;
        for part in path {
            at = &mut at[*part];
        }
        *at = value;
        self
    }

    pub(crate) fn unset(mut self, path: &[&str]) -> Self {
        let (last, parents) = path.split_last().unwrap();
        let mut at = &mut self.0;
        for part in parents {
            at = &mut at[*part];
        }
        if let Some(object) = at.as_object_mut() {
            object.remove(*last);
        }
        self
    }

    /// `metadata.generation`.
    pub(crate) fn generation(self, generation: i64) -> Self {
        self.set(&["metadata", "generation"], json!(generation))
    }

    pub(crate) fn ann(self, key: &str, value: &str) -> Self {
        self.set(&["metadata", "annotations", key], json!(value))
    }

    pub(crate) fn no_ann(self, key: &str) -> Self {
        self.unset(&["metadata", "annotations", key])
    }

    pub(crate) fn label(self, key: &str, value: &str) -> Self {
        self.set(&["metadata", "labels", key], json!(value))
    }

    /// `metallb.io/loadBalancerIPs`.
    pub(crate) fn request(self, ips: &str) -> Self {
        self.ann("metallb.io/loadBalancerIPs", ips)
    }

    /// `metallb.io/address-pool`.
    pub(crate) fn in_pool(self, pool: &str) -> Self {
        self.ann("metallb.io/address-pool", pool)
    }

    /// `metallb.io/allow-shared-ip`.
    pub(crate) fn shared(self, key: &str) -> Self {
        self.ann("metallb.io/allow-shared-ip", key)
    }

    /// `lbipam.cilium.io/ips`.
    pub(crate) fn cilium_ips(self, ips: &str) -> Self {
        self.ann("lbipam.cilium.io/ips", ips)
    }

    /// `lbipam.cilium.io/sharing-key`.
    pub(crate) fn cilium_key(self, key: &str) -> Self {
        self.ann("lbipam.cilium.io/sharing-key", key)
    }

    /// `lbipam.cilium.io/sharing-cross-namespace`.
    pub(crate) fn cross(self, namespaces: &str) -> Self {
        self.ann("lbipam.cilium.io/sharing-cross-namespace", namespaces)
    }

    /// The one port `port`/TCP, named `p`.
    pub(crate) fn port(self, port: i32) -> Self {
        self.set(
            &["spec", "ports"],
            json!([{"name": "p", "port": port, "protocol": "TCP"}]),
        )
    }

    /// These `(protocol, port)`s, named `protocol-port`.
    pub(crate) fn ports(self, ports: &[(&str, i32)]) -> Self {
        let ports: Vec<Value> = ports
            .iter()
            .map(|(protocol, port)| {
                json!({
                    "name": format!("{}-{port}", protocol.to_lowercase()),
                    "port": port,
                    "protocol": protocol,
                })
            })
            .collect();
        self.set(&["spec", "ports"], json!(ports))
    }

    /// Sets the cluster IPs, the families they imply and a matching
    /// ipFamilyPolicy (SingleStack or RequireDualStack).
    pub(crate) fn cluster_ips(self, ips: &[&str]) -> Self {
        let families: Vec<&str> = ips
            .iter()
            .map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" })
            .collect();
        let policy = if ips.len() > 1 {
            "RequireDualStack"
        } else {
            "SingleStack"
        };
        self.set(&["spec", "clusterIP"], json!(ips.first()))
            .set(&["spec", "clusterIPs"], json!(ips))
            .set(&["spec", "ipFamilies"], json!(families))
            .set(&["spec", "ipFamilyPolicy"], json!(policy))
    }

    pub(crate) fn v6(self) -> Self {
        self.cluster_ips(&["fd96::10"])
    }

    /// Dual-stack with `policy`, IPv4 first unless `v6_first`.
    pub(crate) fn dual(self, policy: &str, v6_first: bool) -> Self {
        let ips = if v6_first {
            ["fd96::10", "10.96.0.10"]
        } else {
            ["10.96.0.10", "fd96::10"]
        };
        self.cluster_ips(&ips)
            .set(&["spec", "ipFamilyPolicy"], json!(policy))
    }

    pub(crate) fn headless(self) -> Self {
        self.set(&["spec", "clusterIP"], json!("None"))
            .set(&["spec", "clusterIPs"], json!(["None"]))
    }

    pub(crate) fn class(self, class: &str) -> Self {
        self.set(&["spec", "loadBalancerClass"], json!(class))
    }

    pub(crate) fn kind(self, type_: &str) -> Self {
        self.set(&["spec", "type"], json!(type_))
    }

    pub(crate) fn lb_ip(self, ip: &str) -> Self {
        self.set(&["spec", "loadBalancerIP"], json!(ip))
    }

    /// externalTrafficPolicy Local with selector `app: app`.
    pub(crate) fn local(self, app: &str) -> Self {
        self.set(&["spec", "externalTrafficPolicy"], json!("Local"))
            .set(&["spec", "selector"], json!({ "app": app }))
    }

    pub(crate) fn status(self, ips: &[&str]) -> Self {
        let ingress: Vec<Value> = ips.iter().map(|ip| json!({ "ip": ip })).collect();
        self.set(&["status", "loadBalancer", "ingress"], json!(ingress))
    }

    /// What a previous run of the controller wrote: status, pool annotation
    /// and condition.
    pub(crate) fn held(self, ips: &[&str], pool: &str) -> Self {
        let quoted: Vec<String> = ips.iter().map(|ip| format!("{ip:?}")).collect();
        let condition = json!([{
            "type": CONDITION_TYPE,
            "status": "True",
            "reason": "Assigned",
            "message": format!("Assigned IP [{}]", quoted.join(" ")),
            "lastTransitionTime": "2024-01-01T00:00:00Z",
        }]);
        self.status(ips)
            .ann(POOL_ANNOTATION, pool)
            .set(&["status", "conditions"], condition)
    }

    pub(crate) fn build(&self) -> Service {
        serde_json::from_value(self.0.clone()).unwrap()
    }
}

/// An `IPAddressPool` spec with these addresses.
pub(crate) fn addrs(addresses: &[&str]) -> Value {
    json!({ "addresses": addresses })
}

/// A `CiliumLoadBalancerIPPool` spec with these CIDR blocks.
pub(crate) fn blocks(cidrs: &[&str]) -> Value {
    let blocks: Vec<Value> = cidrs.iter().map(|c| json!({ "cidr": c })).collect();
    json!({ "blocks": blocks })
}

// ----- the harness -----

/// The replay's store and client, the controller and a started manager.
pub(crate) struct Harness {
    pub(crate) store: Arc<ReplayStore>,
    /// The shared cache the manager reads (the store's objects).
    cache: Arc<dyn Store>,
    client: Arc<MemoryClient>,
    echoes: Arc<Echoes>,
    /// The chain the client delivers its writes to (it holds it weakly).
    services: Arc<Chain<Service>>,
    pub(crate) controller: Arc<AllocatingController>,
    pub(crate) manager: Manager<AllocatingController>,
    cancel: CancellationToken,
    synced: AtomicBool,
    /// Records already returned by `take`.
    read: AtomicUsize,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The store's reference to the Service `namespace/name`.
fn service_ref(key: &str) -> ObjectRef {
    let (namespace, name) = key.split_once('/').expect("namespace/name");
    ObjectRef {
        kind: Kind::Service,
        name: name.to_owned(),
        namespace: Some(namespace.to_owned()),
    }
}

/// The store's reference to the pool or Namespace `name`.
fn plain_ref(kind: Kind, name: &str) -> ObjectRef {
    ObjectRef {
        kind,
        name: name.to_owned(),
        namespace: None,
    }
}

/// Tells `manager` of one store change of kind `K`, as a watch would.
async fn deliver<K>(manager: &Manager<AllocatingController>, delta: Delta<K>)
where
    K: Send + Sync + 'static,
    Manager<AllocatingController>: Handler<K>,
{
    match delta {
        Delta::Added(new) => manager.on_add(&new).await,
        Delta::Updated { old, new } => manager.on_update(&old, &new).await,
        Delta::Deleted(old) => manager.on_delete(&old).await,
        Delta::Unchanged => panic!("the store changed nothing"),
    }
    .unwrap();
}

impl Harness {
    /// A harness before sync with the default configuration: objects added
    /// now are the initial list.
    pub(crate) fn new() -> Self {
        Self::with(ControllerConfig::default(), None)
    }

    /// A harness before sync with this configuration.
    pub(crate) fn unsynced(config: ControllerConfig) -> Self {
        Self::with(config, None)
    }

    /// A harness before sync whose client fails every `fail_every`th write
    /// attempt with a conflict (tests/controller.rs's failure tests; `None`
    /// elsewhere).
    pub(crate) fn with(config: ControllerConfig, fail_every: Option<u64>) -> Self {
        let store = Arc::new(ReplayStore::new());
        let failures = fail_every.map(FailurePlan::every);
        let client = Arc::new(MemoryClient::new(Arc::clone(&store), failures));
        let cache = client.cache();
        let controller = Arc::new(AllocatingController::new(
            Arc::clone(&cache),
            client.clone(),
            config,
        ));
        let manager = Manager::new(
            Arc::clone(&cache),
            Arc::clone(&controller),
            ManagerConfig::default().retry_base(Duration::from_millis(1)),
        );
        let echoes = Arc::new(Echoes::default());
        let mut services = Chain::new();
        services.register("echoes", echoes.clone() as Arc<dyn Handler<Service>>);
        services.register("manager", Arc::new(manager.clone()) as Arc<dyn Handler<_>>);
        let services = Arc::new(services);
        client.deliver_to(&services);
        let cancel = CancellationToken::new();
        drop(manager.start(cancel.clone()));
        Self {
            store,
            cache,
            client,
            echoes,
            services,
            controller,
            manager,
            cancel,
            synced: AtomicBool::new(false),
            read: AtomicUsize::new(0),
        }
    }

    /// A synced harness with the default configuration and no pools.
    pub(crate) async fn synced() -> Self {
        Self::synced_with(ControllerConfig::default()).await
    }

    /// A synced harness with this configuration and no pools.
    pub(crate) async fn synced_with(config: ControllerConfig) -> Self {
        let h = Self::unsynced(config);
        h.sync().await;
        h
    }

    /// A synced harness with these pools.
    pub(crate) async fn with_pools(pools: &[(&str, Value)]) -> Self {
        let h = Self::new();
        for (name, spec) in pools {
            h.pool(name, spec.clone()).await;
        }
        h.sync().await;
        h
    }

    /// Marks the manager synced (the host's initial list is complete) and
    /// waits for the sync passes.
    pub(crate) async fn sync(&self) {
        self.manager.mark_synced();
        self.synced.store(true, Ordering::SeqCst);
        self.settle().await;
    }

    /// After sync: waits until the manager is idle and checks the
    /// invariants (before sync nothing is decided).
    pub(crate) async fn settle(&self) {
        if !self.synced.load(Ordering::SeqCst) {
            tokio::task::yield_now().await;
            return;
        }
        tokio::time::timeout(Duration::from_secs(600), self.manager.idle())
            .await
            .expect("the manager never became idle");
        if let Err(problems) = self.controller.check_invariants() {
            panic!("invariants violated: {problems:#?}");
        }
    }

    pub(crate) fn service(&self, key: &str) -> Arc<Service> {
        self.store.service(key).expect("no such service")
    }

    /// Every Service, sorted by key.
    pub(crate) fn services(&self) -> Vec<(String, Arc<Service>)> {
        self.store.services()
    }

    /// Every `IPAddressPool`.
    pub(crate) fn pools(&self) -> Vec<Arc<IPAddressPool>> {
        let pools = self.cache.pool_names().into_iter();
        pools.filter_map(|name| self.cache.pool(&name)).collect()
    }

    /// Tells the manager of a store change, as a watch would.
    async fn deliver(&self, change: Change) {
        match change {
            Change::Service(delta) => deliver(&self.manager, delta).await,
            Change::Pool(delta) => deliver(&self.manager, delta).await,
            Change::CiliumPool(delta) => deliver(&self.manager, delta).await,
            Change::Namespace(delta) => deliver(&self.manager, delta).await,
            Change::None => panic!("the store changed nothing"),
        }
    }

    /// Puts `object` in the store, replacing the whole object if it exists,
    /// and tells the manager.
    async fn upsert(&self, object: Object) {
        let change = self.store.upsert(object).unwrap();
        self.deliver(change).await;
        self.settle().await;
    }

    /// Takes the object out of the store and tells the manager.
    async fn remove(&self, target: ObjectRef) {
        let change = self.store.delete(&target);
        self.deliver(change).await;
        self.settle().await;
    }

    /// Adds the Service, or replaces it (status included) if the key
    /// exists.
    pub(crate) async fn add(&self, svc: Svc) {
        let service = Box::new(svc.build());
        self.upsert(Object::Service {
            service,
            has_status: true,
        })
        .await;
    }

    /// Updates the Service as a user would: `f` edits the stored object
    /// (status and annotations the controller wrote included).
    pub(crate) async fn edit(&self, key: &str, f: impl FnOnce(Svc) -> Svc) {
        let current = self.service(key);
        let svc = f(Svc(serde_json::to_value(&*current).unwrap()));
        assert_eq!(svc.key(), key);
        self.add(svc).await;
    }

    /// Deletes the Service and creates it again as `svc` before the worker
    /// has seen the delete (the two events reach the queue back to back).
    pub(crate) async fn recreate(&self, svc: Svc) {
        let key = svc.key();
        let Change::Service(Delta::Deleted(old)) = self.store.delete(&service_ref(&key)) else {
            panic!("no such service");
        };
        self.manager.on_delete(&*old).await.unwrap();
        let mut service = svc.build();
        // A re-created object has a new uid, as the API server gives it.
        service.metadata.uid = Some(format!(
            "{}-recreated",
            old.metadata.uid.clone().unwrap_or_default()
        ));
        let service = Box::new(service);
        let change = self.store.upsert(Object::Service {
            service,
            has_status: true,
        });
        self.deliver(change.unwrap()).await;
        self.settle().await;
    }

    pub(crate) async fn delete(&self, key: &str) {
        self.remove(service_ref(key)).await;
    }

    /// Adds or updates the `IPAddressPool` `name`.
    pub(crate) async fn pool(&self, name: &str, spec: Value) {
        self.pool_created(name, "2024-01-01T00:00:00Z", spec).await;
    }

    /// Adds or updates the `IPAddressPool` `name`, created at `created`
    /// (RFC 3339).
    pub(crate) async fn pool_created(&self, name: &str, created: &str, spec: Value) {
        let pool: IPAddressPool = serde_json::from_value(json!({
            "apiVersion": "metallb.io/v1beta1",
            "kind": "IPAddressPool",
            "metadata": {"name": name, "namespace": "metallb-system", "creationTimestamp": created},
            "spec": spec,
        }))
        .unwrap();
        self.upsert(Object::Pool(Box::new(pool))).await;
    }

    pub(crate) async fn delete_pool(&self, name: &str) {
        self.remove(plain_ref(Kind::Pool, name)).await;
    }

    /// Adds or updates the `CiliumLoadBalancerIPPool` `name`.
    pub(crate) async fn cilium_pool(&self, name: &str, spec: Value) {
        let pool: CiliumLoadBalancerIPPool = serde_json::from_value(json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumLoadBalancerIPPool",
            "metadata": {"name": name, "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": spec,
        }))
        .unwrap();
        self.upsert(Object::CiliumPool(Box::new(pool))).await;
    }

    pub(crate) async fn delete_cilium_pool(&self, name: &str) {
        self.remove(plain_ref(Kind::CiliumPool, name)).await;
    }

    /// Adds or updates the Namespace `name` with these labels.
    pub(crate) async fn namespace(&self, name: &str, labels: &[(&str, &str)]) {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        let namespace: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels},
        }))
        .unwrap();
        self.upsert(Object::Namespace(Box::new(namespace))).await;
    }

    /// The records since the last call.
    pub(crate) fn take(&self) -> Vec<Record> {
        let mut records = self.all();
        let from = self.read.swap(records.len(), Ordering::SeqCst);
        records.split_off(from)
    }

    /// Every record so far.
    pub(crate) fn all(&self) -> Vec<Record> {
        records(&self.client, &self.echoes)
    }

    /// The controller's condition as `"Status Reason: message"`, or
    /// `"none"`.
    pub(crate) fn condition(&self, key: &str) -> String {
        self.shown(ConditionKind::Assigned, key)
    }

    /// Cilium's condition as `"Status reason: message"`, or `"none"`.
    pub(crate) fn cilium(&self, key: &str) -> String {
        self.shown(ConditionKind::Cilium, key)
    }

    fn shown(&self, kind: ConditionKind, key: &str) -> String {
        match kind.shown(&self.service(key)) {
            Some(c) => format!("{} {}: {}", c.status(), c.reason, c.message),
            None => "none".to_owned(),
        }
    }

    /// The status addresses, space-separated (`""`: none).
    pub(crate) fn ips(&self, key: &str) -> String {
        manager::status_ips(&self.service(key)).join(" ")
    }

    /// `"10.0.0.1 fd00::1 @pool"` from the Service's status and pool
    /// annotation, `"none"` when it has neither.
    pub(crate) fn status(&self, key: &str) -> String {
        let service = self.service(key);
        let ips = manager::status_ips(&service);
        match (ips.is_empty(), manager::pool_annotation(&service)) {
            (true, None) => "none".to_owned(),
            (_, pool) => format!("{} @{}", ips.join(" "), pool.unwrap_or("-")),
        }
    }

    pub(crate) fn waiting(&self) -> Vec<String> {
        self.manager.waiting_keys()
    }

    pub(crate) fn reconciliations(&self) -> u64 {
        self.controller.stats().reconciliations
    }
}

// ----- the records, compactly -----

/// `"key Type Reason"` of every event.
pub(crate) fn events(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Event {
                key,
                event_type,
                reason,
                ..
            } => Some(format!("{key} {event_type} {reason}")),
            _ => None,
        })
        .collect()
}

/// `"key Reason: message"` of every event.
pub(crate) fn messages(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Event {
                key,
                reason,
                message,
                ..
            } => Some(format!("{key} {reason}: {message}")),
            _ => None,
        })
        .collect()
}

/// `"key Reason: message"` of every Warning event.
pub(crate) fn warnings(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Event {
                key,
                event_type: EventType::Warning,
                reason,
                message,
            } => Some(format!("{key} {reason}: {message}")),
            _ => None,
        })
        .collect()
}

/// `"key <- ips @pool"` of every successful write that changed the
/// addresses or the pool annotation.
pub(crate) fn writes(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Write { key, ingress, pool } => Some(format!(
                "{key} <- {} @{}",
                ingress.join(" "),
                pool.as_deref().unwrap_or("-")
            )),
            _ => None,
        })
        .collect()
}

/// `"key <- ips"` of every successful write, those of the conditions alone
/// included (tests/cilium.rs counts the writes of Cilium's condition).
pub(crate) fn every_write(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Write { key, ingress, .. } | Record::ConditionWrite { key, ingress } => {
                Some(format!("{key} <- {}", ingress.join(" ")))
            }
            _ => None,
        })
        .collect()
}

/// Address writes and events, compactly, in order (writes of the
/// condition alone are checked by the condition tests).
pub(crate) fn log(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Write { .. } => writes(std::slice::from_ref(r)).pop(),
            Record::FailedWrite { key } => Some(format!("{key} <- FAILED")),
            Record::Event { .. } => events(std::slice::from_ref(r)).pop(),
            Record::ConditionWrite { .. } => None,
        })
        .collect()
}

/// The controller with every shortcut off: each waiting Service alone and
/// woken by every release, every Service in every pass.
pub(crate) fn exhaustive() -> ControllerConfig {
    ControllerConfig {
        exhaustive: true,
        ..ControllerConfig::default()
    }
}

/// What one step of a scenario showed: the records since the last step,
/// and `key: shown` for each of the keys whose Service exists.
pub(crate) type Step = (Vec<Record>, Vec<String>);

pub(crate) fn step(h: &Harness, keys: &[&str], shown: impl Fn(&str) -> String) -> Step {
    let shown = keys
        .iter()
        .filter(|key| h.store.service(key).is_some())
        .map(|key| format!("{key}: {}", shown(key)))
        .collect();
    (h.take(), shown)
}

/// Asserts that the same steps, run with the shortcuts (`fast`) and
/// without (`full`), showed the same after each.
pub(crate) fn assert_same_steps<T: PartialEq + std::fmt::Debug>(fast: &[T], full: &[T]) {
    for (i, (a, b)) in fast.iter().zip(full).enumerate() {
        assert_eq!(
            a, b,
            "step {i} differs (left: shortcuts, right: exhaustive)"
        );
    }
    assert_eq!(fast.len(), full.len());
}
