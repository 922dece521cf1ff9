//! The host: watchers feeding the chains, leader election, one
//! Manager+controller per leadership term, pool status, metrics.
//!
//! Every replica watches (so its cache is warm and it reports ready), but
//! only the leader decides and writes. The chains carry one handler,
//! `manager`, that forwards to the Manager of the current term and drops
//! events while there is none. On becoming leader a replica builds a fresh
//! [`AllocatingController`] and [`Manager`], starts its worker, makes it
//! current, hands it every object of the cache (namespaces, then pools of
//! both kinds, then Services oldest first), and marks it synced once every
//! watcher finished its initial list (the Cilium pools' only where
//! discovery finds them served, see [`crate::cilium`]): the manager then rebuilds its state from the Services'
//! statuses (docs/allocation.md, restarts) and changes no address. On losing the lease the
//! gate shuts at once (the client refuses writes), the term's worker and
//! pool status writer are cancelled, and the Manager is dropped.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::runtime::events::Reporter;
use kube::runtime::{reflector, watcher};
use kube::ResourceExt;
use manager::{
    AllocatingController, Client, ControllerConfig, Manager, ManagerConfig,
    SharingAcrossNamespaces, Store,
};
use subscriber::{Chain, CiliumLoadBalancerIPPool, Handler, IPAddressPool};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cilium::{self, CiliumPoolResource};
use crate::client::{EventBacklog, KubeClient};
use crate::crd::{self, to_subscriber, IPAddressPoolResource};
use crate::discovered::{DiscoveredWatch, ServedVersion};
use crate::lean;
use crate::lease::{KubeLease, LeaderElector, LeaderGate, LeaseConfig};
use crate::metrics::Metrics;
use crate::pool_status::{PoolStatusWriter, POOL_STATUS_PERIOD};
use crate::retry::{watcher_of, with_backoff, WatchBackoff};
use crate::store::KubeStore;
use crate::watch::{creation_order, Converting, Driver, SyncTracker};

/// How long [`Host::shutdown`] waits for the Events still queued.
const EVENT_DRAIN: Duration = Duration::from_secs(5);

/// The kinds whose initial list must complete before the manager is synced.
/// `CiliumLoadBalancerIPPool` counts as listed at once when discovery finds
/// its CRD not served (see [`crate::cilium`]).
pub(crate) const KINDS: [&str; 4] = ["Namespace", "IPAddressPool", cilium::KIND, "Service"];

/// How a [`Host`] runs.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Handle only Services of this `spec.loadBalancerClass`.
    pub lb_class: Option<String>,
    /// The namespace of the Lease.
    pub lease_namespace: String,
    /// The name of the Lease (one per `--lb-class`).
    pub lease_name: String,
    /// Identity and timing of the election.
    pub lease: LeaseConfig,
    /// The manager's retry timing.
    pub manager: ManagerConfig,
    /// How often pool statuses are brought up to date (at most once per
    /// period per pool).
    pub pool_status_period: Duration,
    /// The watchers' settings.
    pub watcher: watcher::Config,
    /// How a failing list or watch is retried.
    pub watch_backoff: WatchBackoff,
    /// The `reportingController` of Events.
    pub reporting_controller: String,
    /// Whether a MetalLB sharing key shares across namespaces freely, or
    /// only as Cilium's annotations allow (docs/cilium.md §3.4).
    pub sharing_across_namespaces: SharingAcrossNamespaces,
    /// Whether Services get Cilium's `cilium.io/IPAMRequestSatisfied`
    /// condition while a Cilium pool exists (docs/cilium.md §3.6).
    pub cilium_conditions: bool,
    /// How often discovery is asked again while `CiliumLoadBalancerIPPool`
    /// (or `IPAddressPool`) is not served.
    pub discovery_period: Duration,
}

impl HostConfig {
    /// Defaults for a replica named `identity` whose Lease lives in
    /// `lease_namespace`.
    pub fn new(identity: impl Into<String>, lease_namespace: impl Into<String>) -> Self {
        Self {
            lb_class: None,
            lease_namespace: lease_namespace.into(),
            lease_name: "kube-watcher".to_owned(),
            lease: LeaseConfig::new(identity),
            manager: ManagerConfig::default(),
            pool_status_period: POOL_STATUS_PERIOD,
            watcher: watcher::Config::default(),
            watch_backoff: WatchBackoff::default(),
            reporting_controller: "kube-watcher".to_owned(),
            sharing_across_namespaces: SharingAcrossNamespaces::default(),
            cilium_conditions: true,
            discovery_period: cilium::DISCOVERY_PERIOD,
        }
    }

    /// Handle only Services of `class`.
    #[must_use]
    pub fn lb_class(mut self, class: Option<String>) -> Self {
        self.lb_class = class;
        self
    }

    /// Sets the Lease's name.
    #[must_use]
    pub fn lease_name(mut self, name: impl Into<String>) -> Self {
        self.lease_name = name.into();
        self
    }

    /// Sets the election's timing.
    #[must_use]
    pub fn lease_timing(
        mut self,
        lease: Duration,
        renew_deadline: Duration,
        retry: Duration,
    ) -> Self {
        self.lease = self.lease.timing(lease, renew_deadline, retry);
        self
    }
}

type TermManager = Manager<AllocatingController>;

/// Forwards every event to the Manager of the current term, if any.
#[derive(Debug, Default)]
struct CurrentManager(RwLock<Option<TermManager>>);

impl CurrentManager {
    fn get(&self) -> Option<TermManager> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, manager: Option<TermManager>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = manager;
    }
}

/// Every kind the term's manager handles, forwarded to it as it is.
#[async_trait]
impl<K: Send + Sync + 'static> Handler<K> for CurrentManager
where
    TermManager: Handler<K>,
{
    async fn on_add(&self, object: &K) -> Result<(), subscriber::Error> {
        match self.get() {
            Some(manager) => manager.on_add(object).await,
            None => Ok(()),
        }
    }
    async fn on_update(&self, old: &K, new: &K) -> Result<(), subscriber::Error> {
        match self.get() {
            Some(manager) => manager.on_update(old, new).await,
            None => Ok(()),
        }
    }
    async fn on_delete(&self, object: &K) -> Result<(), subscriber::Error> {
        match self.get() {
            Some(manager) => manager.on_delete(object).await,
            None => Ok(()),
        }
    }
}

/// What every leadership term shares.
struct Shared {
    client: kube::Client,
    config: HostConfig,
    store: KubeStore,
    synced: SyncTracker,
    current: Arc<CurrentManager>,
    gate: LeaderGate,
    metrics: Metrics,
    events: EventBacklog,
    /// The Cilium pools' served version, once discovery found it.
    cilium_version: ServedVersion,
}

/// A running host. Dropping it stops nothing: call
/// [`shutdown`](Host::shutdown).
pub struct Host {
    store: KubeStore,
    synced: SyncTracker,
    metrics: Metrics,
    leader: watch::Receiver<bool>,
    current: Arc<CurrentManager>,
    events: EventBacklog,
    /// Stops the watches and the leader loop.
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    /// Stops the election (giving the Lease up), once the rest has.
    election: CancellationToken,
    elector: JoinHandle<()>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("store", &self.store)
            .field("synced", &self.synced.is_synced())
            .field("leader", &*self.leader.borrow())
            .finish_non_exhaustive()
    }
}

impl Host {
    /// Starts the watchers, the election and the leader loop on the current
    /// tokio runtime.
    pub fn start(client: kube::Client, config: HostConfig) -> Self {
        let cancel = CancellationToken::new();
        let synced = SyncTracker::new(&KINDS);
        let current = Arc::new(CurrentManager::default());
        let (store, cilium_version, mut tasks) =
            spawn_watches(&client, &config, &synced, &current, &cancel);

        let metrics = Metrics::new(synced.clone());
        metrics.count_services(store.clone(), config.lb_class.clone());
        let events = EventBacklog::default();
        let elector = LeaderElector::new(
            KubeLease::new(client.clone(), &config.lease_namespace, &config.lease_name),
            config.lease.clone(),
        )
        .counting(metrics.lease_errors());
        let leader = elector.subscribe();
        let gate = elector.gate();
        let election = CancellationToken::new();
        let elector = tokio::spawn(elector.run(election.clone()));

        let shared = Arc::new(Shared {
            client,
            config,
            store: store.clone(),
            synced: synced.clone(),
            current: Arc::clone(&current),
            gate,
            metrics: metrics.clone(),
            events: events.clone(),
            cilium_version,
        });
        tasks.push(tokio::spawn(lead(shared, leader.clone(), cancel.clone())));
        Self {
            store,
            synced,
            metrics,
            leader,
            current,
            events,
            cancel,
            tasks,
            election,
            elector,
        }
    }

    /// The shared cache.
    pub fn store(&self) -> &KubeStore {
        &self.store
    }

    /// Whether every watcher finished its initial list.
    pub fn synced(&self) -> &SyncTracker {
        &self.synced
    }

    /// The metrics this host reports.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether this replica leads; changes as soon as it does.
    pub fn leader(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    /// Whether the current term's manager was marked synced (false when
    /// there is no term): from then on [`idle`](Host::idle) waits for its
    /// sync passes.
    pub fn term_synced(&self) -> bool {
        self.current
            .get()
            .is_some_and(|manager| manager.is_synced())
    }

    /// Resolves when the current term's manager is idle (see
    /// `Manager::idle`) and every Event it emitted is published; at once
    /// when there is no term.
    pub async fn idle(&self) {
        if let Some(manager) = self.current.get() {
            manager.idle().await;
        }
        self.events.drained().await;
    }

    /// Stops everything and waits for it. A leader gives its Lease up
    /// last: after its term's writes and its queued Events (for at most
    /// [`EVENT_DRAIN`]) have landed, so none lands once another replica
    /// may lead.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        for task in self.tasks {
            if let Err(error) = task.await {
                tracing::warn!(%error, "a host task failed");
            }
        }
        if tokio::time::timeout(EVENT_DRAIN, self.events.drained())
            .await
            .is_err()
        {
            tracing::warn!("Events were still being sent at shutdown");
        }
        self.election.cancel();
        if let Err(error) = self.elector.await {
            tracing::warn!(%error, "the election failed");
        }
    }
}

/// The chain of one kind with the manager registered on it.
fn manager_chain<K: Send + Sync + 'static>(current: &Arc<CurrentManager>) -> Chain<K>
where
    CurrentManager: Handler<K>,
{
    let mut chain = Chain::<K>::new();
    chain.register("manager", Arc::clone(current) as Arc<dyn Handler<K>>);
    chain
}

/// The shared cache and the watchers that fill it, each kind through its
/// [`Driver`] into the manager's chain of that kind; the Cilium pools once
/// discovery finds them served (their version shared on the receiver).
fn spawn_watches(
    client: &kube::Client,
    config: &HostConfig,
    synced: &SyncTracker,
    current: &Arc<CurrentManager>,
    cancel: &CancellationToken,
) -> (KubeStore, ServedVersion, Vec<JoinHandle<()>>) {
    let (services, service_writer) = reflector::store::<Service>();
    let (pools, pool_writer) = reflector::store::<IPAddressPoolResource>();
    let (namespaces, namespace_writer) = reflector::store::<Namespace>();
    let (cilium_pools, cilium_writer) = reflector::store::<CiliumPoolResource>();
    let store = KubeStore::new(services, pools, namespaces).with_cilium_pools(cilium_pools);

    let mut tasks = Vec::new();
    let wc = config.watcher.clone();
    tasks.push(spawn_watch(
        Driver::new("Service", service_writer).notifying(store.service_changes()),
        watcher_of(client, &wc, lean::service),
        manager_chain::<Service>(current),
        synced.clone(),
        config.watch_backoff.clone(),
        cancel.clone(),
    ));
    tasks.push(spawn_watch(
        Driver::new("Namespace", namespace_writer),
        watcher_of(client, &wc, lean::namespace),
        manager_chain::<Namespace>(current),
        synced.clone(),
        config.watch_backoff.clone(),
        cancel.clone(),
    ));
    // The pools of either kind are watched once discovery finds their CRD
    // (maybe never, maybe later): a cluster may have one kind only.
    let pools = watcher_of(client, &wc, lean::pool);
    let pool_watch = DiscoveredWatch {
        served: &crd::SERVED,
        client: client.clone(),
        writer: pool_writer,
        sink: Converting::new(manager_chain::<IPAddressPool>(current), to_subscriber),
        synced: synced.clone(),
        stream: Box::new(move |_| pools()),
        backoff: config.watch_backoff.clone(),
        period: config.discovery_period,
        version: watch::channel(None).0,
    };
    tasks.push(tokio::spawn(pool_watch.run(cancel.clone())));
    let (served, cilium_version) = watch::channel(None);
    let cilium_client = client.clone();
    let cilium_watch = DiscoveredWatch {
        served: &cilium::SERVED,
        client: client.clone(),
        writer: cilium_writer,
        sink: Converting::new(
            manager_chain::<CiliumLoadBalancerIPPool>(current),
            cilium::to_subscriber,
        ),
        synced: synced.clone(),
        stream: Box::new(move |version| {
            cilium::watch_stream(cilium_client.clone(), version, wc.clone()).boxed()
        }),
        backoff: config.watch_backoff.clone(),
        period: config.discovery_period,
        version: served,
    };
    tasks.push(tokio::spawn(cilium_watch.run(cancel.clone())));
    (store, cilium_version, tasks)
}

fn spawn_watch<K, St, S>(
    driver: Driver<K>,
    stream: impl Fn() -> St + Send + 'static,
    sink: S,
    synced: SyncTracker,
    backoff: WatchBackoff,
    cancel: CancellationToken,
) -> JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + std::fmt::Debug + 'static,
    St: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    S: Handler<K> + 'static,
{
    tokio::spawn(async move {
        let mut driver = driver;
        let stream = with_backoff(stream, driver.kind(), backoff);
        tokio::select! {
            () = cancel.cancelled() => {}
            () = driver.run(stream, &sink, &synced) => {}
        }
    })
}

/// Runs a term whenever this replica leads, until `cancel` fires.
async fn lead(shared: Arc<Shared>, mut leader: watch::Receiver<bool>, cancel: CancellationToken) {
    loop {
        let leading = tokio::select! {
            () = cancel.cancelled() => return,
            leading = async { leader.wait_for(|leading| *leading).await.map(|_| ()) } => leading,
        };
        if leading.is_err() {
            return;
        }
        let term = cancel.child_token();
        let term_tasks = start_term(&shared, &term).await;
        tokio::select! {
            () = cancel.cancelled() => {}
            _ = async { leader.wait_for(|leading| !*leading).await.map(|_| ()) } => {}
        }
        term.cancel();
        shared.current.set(None);
        shared.metrics.set_controller(None);
        shared.metrics.set_leader(false);
        // The term ends when its writers have: no write of this term
        // lands after it (nor after `Host::shutdown`).
        for task in term_tasks {
            if let Err(error) = task.await {
                tracing::warn!(%error, "a task of the term failed");
            }
        }
        tracing::info!("leadership term ended");
        if cancel.is_cancelled() {
            return;
        }
    }
}

/// Builds and starts the Manager of a new term; returns its worker and
/// its pool-status writer.
async fn start_term(shared: &Arc<Shared>, term: &CancellationToken) -> [JoinHandle<()>; 2] {
    tracing::info!("leading: building the controller from the cache");
    let store: Arc<dyn Store> = Arc::new(shared.store.clone());
    let reporter = Reporter {
        controller: shared.config.reporting_controller.clone(),
        instance: Some(shared.config.lease.identity.clone()),
    };
    let client = Arc::new(KubeClient::new(
        shared.client.clone(),
        shared.store.clone(),
        shared.gate.clone(),
        reporter,
        shared.metrics.event_errors(),
        shared.events.clone(),
    ));
    let controller = Arc::new(AllocatingController::new(
        Arc::clone(&store),
        client as Arc<dyn Client>,
        ControllerConfig {
            lb_class: shared.config.lb_class.clone(),
            sharing_across_namespaces: shared.config.sharing_across_namespaces,
            cilium_conditions: shared.config.cilium_conditions,
            ..ControllerConfig::default()
        },
    ));
    let manager = Manager::new(
        store,
        Arc::clone(&controller),
        shared.config.manager.clone(),
    );
    let worker = manager.start(term.clone());
    // Current first, then the snapshot: an event that lands in between
    // reaches the manager twice, which is harmless; none is lost.
    shared.current.set(Some(manager.clone()));
    deliver_cache(&shared.store, &manager).await;
    shared.metrics.set_controller(Some(Arc::clone(&controller)));
    shared.metrics.set_leader(true);

    let shared = Arc::clone(shared);
    let term = term.clone();
    let status = tokio::spawn(async move {
        tokio::select! {
            () = term.cancelled() => return,
            () = shared.synced.wait() => {}
        }
        tracing::info!("every initial list complete: marking the manager synced");
        manager.mark_synced();
        // Pool statuses once the sync passes restored every holding.
        tokio::select! {
            () = term.cancelled() => return,
            () = manager.idle() => {}
        }
        let writer = PoolStatusWriter::new(
            shared.client.clone(),
            shared.store.clone(),
            shared.gate.clone(),
            Reporter {
                controller: shared.config.reporting_controller.clone(),
                instance: Some(shared.config.lease.identity.clone()),
            },
        )
        .configuration_state(shared.config.lease_namespace.clone())
        .cilium_version(shared.cilium_version.clone());
        writer
            .run(controller, shared.config.pool_status_period, term)
            .await;
    });
    [worker, status]
}

/// Hands every cached object to a new term's manager: namespaces by name,
/// pools of both kinds in one sequence and Services oldest first (their
/// key breaking ties), so the first seen of two Services claiming one
/// address is the older (§4.5), and of two pools of one name or overlapping
/// ranges the older (docs/cilium.md §2.7).
async fn deliver_cache(store: &KubeStore, manager: &TermManager) {
    let mut namespaces = store.namespaces().state();
    namespaces.sort_by_key(|ns| ns.name_any());
    for namespace in &namespaces {
        report(manager.on_add(namespace.as_ref()).await);
    }
    let metallb = store.pools().state();
    let cilium = store.cilium_pools().state();
    let mut pools: Vec<_> = metallb
        .iter()
        .map(|pool| (creation_order(pool.as_ref()), Some(pool), None))
        .chain(
            cilium
                .iter()
                .map(|pool| (creation_order(pool.as_ref()), None, Some(pool))),
        )
        .collect();
    pools.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, metallb, cilium) in &pools {
        if let Some(pool) = metallb {
            report(manager.on_add(&to_subscriber(pool)).await);
        }
        if let Some(pool) = cilium {
            report(manager.on_add(&pool.0).await);
        }
    }
    let mut services = store.services().state();
    services.sort_by_cached_key(|service| creation_order(service.as_ref()));
    for service in &services {
        report(manager.on_add(service.as_ref()).await);
    }
    tracing::info!(
        namespaces = namespaces.len(),
        pools = pools.len(),
        services = services.len(),
        "cache handed to the manager"
    );
}

fn report(result: Result<(), subscriber::Error>) {
    if let Err(error) = result {
        tracing::warn!(%error, "the manager refused a cached object");
    }
}
