//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` does it, with a write gate that closes on time.
//!
//! Each replica runs a [`LeaderElector`]. It reads the Lease every retry
//! period: a Lease held by another identity is taken only after that holder
//! stopped renewing for a whole lease duration, *measured on the local clock
//! from when this replica last saw the record change* (so clocks need not
//! agree). Every write is a replace with the Lease's resourceVersion, so of
//! two replicas racing for it exactly one wins (the other gets 409).
//!
//! The leader renews every retry period. Its [`LeaderGate`] is open until
//! `renew_deadline` after the start of its last successful renewal; past
//! that instant the gate is shut whatever the renew loop is doing (a request
//! hanging on a dead connection included), and since `renew_deadline` is
//! shorter than the lease duration, the gate shuts before any other replica
//! may take the Lease. A renewal that finds another holder shuts it at once.
//! On shutdown the leader gives the Lease up so a follower takes over
//! without waiting.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A lease operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another replica wrote the Lease first (HTTP 409).
    #[error("the lease changed under the write")]
    Conflict,
    /// The API server refused or could not be reached.
    #[error("lease request failed: {0}")]
    Api(#[source] kube::Error),
    /// The attempt did not finish before the renew deadline.
    #[error("lease request timed out")]
    Timeout,
}

/// Reads and writes one Lease object.
#[async_trait]
pub trait LeaseBackend: Send + Sync + 'static {
    /// The Lease, or `None` when it does not exist.
    async fn get(&self) -> Result<Option<Lease>, LeaseError>;
    /// Creates the Lease, named by the backend ([`LeaseError::Conflict`]
    /// if it exists).
    async fn create(&self, lease: &Lease) -> Result<Lease, LeaseError>;
    /// Replaces the Lease; `lease.metadata.resourceVersion` is the
    /// precondition ([`LeaseError::Conflict`] when it is stale).
    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError>;
}

/// [`LeaseBackend`] over the Kubernetes API.
#[derive(Clone)]
pub struct KubeLease {
    api: Api<Lease>,
    name: String,
}

impl std::fmt::Debug for KubeLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLease")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl KubeLease {
    /// The Lease `name` in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
        }
    }
}

fn api_error(error: kube::Error) -> LeaseError {
    match &error {
        kube::Error::Api(status) if status.code == 409 => LeaseError::Conflict,
        _ => LeaseError::Api(error),
    }
}

#[async_trait]
impl LeaseBackend for KubeLease {
    async fn get(&self) -> Result<Option<Lease>, LeaseError> {
        self.api.get_opt(&self.name).await.map_err(api_error)
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let mut lease = lease.clone();
        lease.metadata.name = Some(self.name.clone());
        self.api
            .create(&PostParams::default(), &lease)
            .await
            .map_err(api_error)
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.api
            .replace(&self.name, &PostParams::default(), lease)
            .await
            .map_err(api_error)
    }
}

/// Timing and identity of a [`LeaderElector`] (client-go's defaults).
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// This replica's identity (the Lease's `holderIdentity`).
    pub identity: String,
    /// How long a Lease stays valid after its last renewal (default 15s).
    pub lease_duration: Duration,
    /// How long the leader may go without a successful renewal before it
    /// stops (default 10s; must be shorter than `lease_duration`).
    pub renew_deadline: Duration,
    /// How often the Lease is read and renewed (default 2s).
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults for `identity`.
    pub fn new(identity: impl Into<String>) -> Self {
        Self {
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Sets the three durations.
    #[must_use]
    pub fn timing(mut self, lease: Duration, renew_deadline: Duration, retry: Duration) -> Self {
        self.lease_duration = lease;
        self.renew_deadline = renew_deadline;
        self.retry_period = retry;
        self
    }
}

/// Whether this replica may write now. Cheap to clone; every clone is the
/// same gate.
#[derive(Clone, Debug, Default)]
pub struct LeaderGate {
    open_until: Arc<Mutex<Option<Instant>>>,
}

impl LeaderGate {
    /// A gate that is always open (for a host without leader election).
    pub fn always_open() -> Self {
        let gate = Self::default();
        gate.open_until(Instant::now() + Duration::from_secs(100 * 365 * 86_400));
        gate
    }

    /// Whether writes are allowed at this instant.
    pub fn is_open(&self) -> bool {
        self.lock().is_some_and(|until| Instant::now() < until)
    }

    fn open_until(&self, until: Instant) {
        *self.lock() = Some(until);
    }

    fn shut(&self) {
        *self.lock() = None;
    }

    fn deadline(&self) -> Option<Instant> {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.open_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// What the elector last saw of the Lease.
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<String>,
    resource_version: Option<String>,
    duration: Duration,
}

/// Runs the election for one replica; see the module documentation.
pub struct LeaderElector<B> {
    backend: B,
    config: LeaseConfig,
    gate: LeaderGate,
    leader: watch::Sender<bool>,
    observed: Option<(Observed, Instant)>,
}

impl<B> std::fmt::Debug for LeaderElector<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .field("leader", &*self.leader.borrow())
            .finish_non_exhaustive()
    }
}

impl<B: LeaseBackend> LeaderElector<B> {
    /// An elector on `backend`; nothing happens until [`run`](Self::run).
    pub fn new(backend: B, config: LeaseConfig) -> Self {
        Self {
            backend,
            config,
            gate: LeaderGate::default(),
            leader: watch::Sender::new(false),
            observed: None,
        }
    }

    /// The gate the writers check.
    pub fn gate(&self) -> LeaderGate {
        self.gate.clone()
    }

    /// Tells whether this replica leads; changes as soon as it does.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leader.subscribe()
    }

    /// Acquires, renews, and on losing the Lease tries again, until `cancel`
    /// fires; then gives the Lease up if it holds it.
    pub async fn run(mut self, cancel: CancellationToken) {
        loop {
            if !self.acquire(&cancel).await {
                break;
            }
            tracing::info!(identity = %self.config.identity, "became the leader");
            self.leader.send_replace(true);
            let cancelled = self.renew(&cancel).await;
            self.gate.shut();
            self.leader.send_replace(false);
            if cancelled {
                self.release().await;
                break;
            }
            tracing::warn!(identity = %self.config.identity, "lost the lease; stopped leading");
        }
        self.gate.shut();
        self.leader.send_replace(false);
    }

    /// Tries every retry period until this replica holds the Lease (true)
    /// or `cancel` fires (false).
    async fn acquire(&mut self, cancel: &CancellationToken) -> bool {
        loop {
            let started = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    self.gate.open_until(started + self.config.renew_deadline);
                    return true;
                }
                Ok(false) => {}
                Err(error) => tracing::debug!(%error, "could not acquire the lease"),
            }
            tokio::select! {
                () = cancel.cancelled() => return false,
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
    }

    /// Renews every retry period while this replica leads; returns true when
    /// `cancel` fired, false when the Lease was lost.
    async fn renew(&mut self, cancel: &CancellationToken) -> bool {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return true,
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
            let Some(deadline) = self.gate.deadline() else {
                return false;
            };
            let started = Instant::now();
            let attempt = tokio::select! {
                () = cancel.cancelled() => return true,
                attempt = tokio::time::timeout_at(deadline, self.try_acquire_or_renew()) => {
                    attempt.unwrap_or(Err(LeaseError::Timeout))
                }
            };
            match attempt {
                Ok(true) => self.gate.open_until(started + self.config.renew_deadline),
                Ok(false) => {
                    tracing::warn!("another replica holds the lease");
                    return false;
                }
                Err(error) if Instant::now() < deadline => {
                    tracing::warn!(%error, "could not renew the lease; retrying");
                }
                Err(error) => {
                    tracing::warn!(%error, "could not renew the lease before the deadline");
                    return false;
                }
            }
        }
    }

    /// One round: true when this replica holds the Lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, LeaseError> {
        let now = Timestamp::now();
        let identity = self.config.identity.clone();
        let duration_secs =
            i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let Some(current) = self.backend.get().await? else {
            let lease = Lease {
                metadata: ObjectMeta::default(),
                spec: Some(LeaseSpec {
                    holder_identity: Some(identity),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.backend.create(&lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(true)
                }
                Err(LeaseError::Conflict) => Ok(false),
                Err(error) => Err(error),
            };
        };
        let observed_at = self.observe(&current);
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(identity.as_str());
        if let (Some(other), false) = (&holder, ours) {
            let duration = self.observed_duration();
            if Instant::now() < observed_at + duration {
                tracing::trace!(holder = %other, "lease held by another replica");
                return Ok(false);
            }
            tracing::info!(holder = %other, "the lease expired; taking it");
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        let lease = Lease {
            metadata: current.metadata.clone(),
            spec: Some(LeaseSpec {
                holder_identity: Some(identity),
                lease_duration_seconds: Some(duration_secs),
                acquire_time: if ours {
                    spec.acquire_time.clone().or(Some(MicroTime(now)))
                } else {
                    Some(MicroTime(now))
                },
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(if ours {
                    transitions
                } else {
                    transitions.saturating_add(1)
                }),
                ..spec
            }),
        };
        match self.backend.replace(&lease).await {
            Ok(replaced) => {
                self.observe(&replaced);
                Ok(true)
            }
            Err(LeaseError::Conflict) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Records `lease` and returns when its record was first seen.
    fn observe(&mut self, lease: &Lease) -> Instant {
        let spec = lease.spec.as_ref();
        let observed = Observed {
            holder: spec.and_then(|s| s.holder_identity.clone()),
            renew_time: spec.and_then(|s| s.renew_time.as_ref().map(|t| t.0.to_string())),
            resource_version: lease.metadata.resource_version.clone(),
            duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|secs| u64::try_from(secs).ok())
                .map_or(self.config.lease_duration, Duration::from_secs),
        };
        // A record is the same if only the resourceVersion moved (another
        // field manager touching the object does not renew it).
        let same = self.observed.as_ref().is_some_and(|(seen, _)| {
            seen.holder == observed.holder
                && seen.renew_time == observed.renew_time
                && seen.duration == observed.duration
        });
        match (&mut self.observed, same) {
            (Some((seen, at)), true) => {
                *seen = observed;
                *at
            }
            _ => {
                let now = Instant::now();
                self.observed = Some((observed, now));
                now
            }
        }
    }

    fn observed_duration(&self) -> Duration {
        self.observed
            .as_ref()
            .map_or(self.config.lease_duration, |(seen, _)| seen.duration)
    }

    /// Gives the Lease up (holder cleared, duration 1s), as client-go's
    /// `ReleaseOnCancel` does.
    async fn release(&mut self) {
        let Ok(Some(current)) = self.backend.get().await else {
            return;
        };
        let spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: current.metadata.clone(),
            spec: Some(LeaseSpec {
                holder_identity: None,
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..spec
            }),
        };
        match self.backend.replace(&lease).await {
            Ok(_) => tracing::info!("released the lease"),
            Err(error) => tracing::warn!(%error, "could not release the lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A Lease in memory, shared by several electors, that can be made to
    /// fail every request.
    #[derive(Clone, Default)]
    struct Memory {
        lease: Arc<Mutex<Option<Lease>>>,
        version: Arc<Mutex<u64>>,
        down: Arc<AtomicBool>,
        /// Requests hang instead of failing while `down`.
        hang: Arc<AtomicBool>,
    }

    impl Memory {
        async fn check(&self) -> Result<(), LeaseError> {
            if self.down.load(Ordering::SeqCst) {
                if self.hang.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                return Err(LeaseError::Timeout);
            }
            Ok(())
        }

        fn stamp(&self, mut lease: Lease) -> Lease {
            let mut version = self.version.lock().unwrap();
            *version += 1;
            lease.metadata.resource_version = Some(version.to_string());
            lease
        }

        fn holder(&self) -> Option<String> {
            self.lease
                .lock()
                .unwrap()
                .as_ref()
                .and_then(|l| l.spec.as_ref()?.holder_identity.clone())
        }

        /// Another identity writes itself in (as a forced takeover would).
        fn take_over(&self, identity: &str) {
            let mut lease = self.lease.lock().unwrap();
            let current = lease.clone().unwrap();
            let mut spec = current.spec.clone().unwrap();
            spec.holder_identity = Some(identity.to_owned());
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            *lease = Some(self.stamp(Lease {
                metadata: current.metadata,
                spec: Some(spec),
            }));
        }
    }

    #[async_trait]
    impl LeaseBackend for Memory {
        async fn get(&self) -> Result<Option<Lease>, LeaseError> {
            self.check().await?;
            Ok(self.lease.lock().unwrap().clone())
        }

        async fn create(&self, lease: &Lease) -> Result<Lease, LeaseError> {
            self.check().await?;
            let mut current = self.lease.lock().unwrap();
            if current.is_some() {
                return Err(LeaseError::Conflict);
            }
            let created = self.stamp(lease.clone());
            *current = Some(created.clone());
            Ok(created)
        }

        async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError> {
            self.check().await?;
            let mut current = self.lease.lock().unwrap();
            let version = current
                .as_ref()
                .and_then(|l| l.metadata.resource_version.clone());
            if version != lease.metadata.resource_version {
                return Err(LeaseError::Conflict);
            }
            let replaced = self.stamp(lease.clone());
            *current = Some(replaced.clone());
            Ok(replaced)
        }
    }

    fn config(identity: &str) -> LeaseConfig {
        LeaseConfig::new(identity)
    }

    struct Running {
        gate: LeaderGate,
        leader: watch::Receiver<bool>,
        cancel: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    fn start(memory: &Memory, identity: &str) -> Running {
        let elector = LeaderElector::new(memory.clone(), config(identity));
        let cancel = CancellationToken::new();
        Running {
            gate: elector.gate(),
            leader: elector.subscribe(),
            task: tokio::spawn(elector.run(cancel.clone())),
            cancel,
        }
    }

    async fn wait_for(leader: &mut watch::Receiver<bool>, value: bool) {
        leader.wait_for(|v| *v == value).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn first_replica_leads_the_second_waits() {
        let memory = Memory::default();
        let mut a = start(&memory, "a");
        wait_for(&mut a.leader, true).await;
        assert!(a.gate.is_open());
        let mut b = start(&memory, "b");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!*b.leader.borrow(), "b must not lead while a renews");
        assert!(!b.gate.is_open());
        assert_eq!(memory.holder().as_deref(), Some("a"));
        assert!(a.gate.is_open());

        // a stops without releasing (crash): b takes over only after a
        // whole lease duration without renewals (a renewed at most one
        // retry period before it stopped).
        a.task.abort();
        let stopped = Instant::now();
        wait_for(&mut b.leader, true).await;
        assert!(stopped.elapsed() >= Duration::from_secs(13));
        assert!(stopped.elapsed() <= Duration::from_secs(17));
        assert_eq!(memory.holder().as_deref(), Some("b"));
        b.cancel.cancel();
        b.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn release_on_shutdown_hands_over_at_once() {
        let memory = Memory::default();
        let mut a = start(&memory, "a");
        wait_for(&mut a.leader, true).await;
        let mut b = start(&memory, "b");
        tokio::time::sleep(Duration::from_secs(5)).await;
        a.cancel.cancel();
        a.task.await.unwrap();
        assert!(!a.gate.is_open());
        assert_eq!(memory.holder(), None);
        let released = Instant::now();
        wait_for(&mut b.leader, true).await;
        assert!(released.elapsed() <= Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_taken_lease_stops_the_leader_at_its_next_renewal() {
        let memory = Memory::default();
        let mut a = start(&memory, "a");
        wait_for(&mut a.leader, true).await;
        memory.take_over("intruder");
        let taken = Instant::now();
        wait_for(&mut a.leader, false).await;
        assert!(!a.gate.is_open());
        assert!(taken.elapsed() <= Duration::from_secs(2));
        // It keeps trying, and leads again once the intruder's lease expires.
        wait_for(&mut a.leader, true).await;
        assert!(taken.elapsed() >= Duration::from_secs(15));
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_shuts_at_the_renew_deadline_even_if_requests_hang() {
        let memory = Memory::default();
        let mut a = start(&memory, "a");
        wait_for(&mut a.leader, true).await;
        let deadline = a.gate.deadline().unwrap();
        memory.hang.store(true, Ordering::SeqCst);
        memory.down.store(true, Ordering::SeqCst);
        tokio::time::sleep_until(deadline - Duration::from_millis(1)).await;
        assert!(a.gate.is_open());
        tokio::time::sleep_until(deadline).await;
        assert!(!a.gate.is_open(), "shut at the deadline itself");
        wait_for(&mut a.leader, false).await;
        // The deadline is before anyone else may take the lease.
        assert!(deadline < Instant::now() + Duration::from_secs(15));
    }

    #[tokio::test(start_paused = true)]
    async fn failed_renewals_stop_leading_at_the_deadline() {
        let memory = Memory::default();
        let mut a = start(&memory, "a");
        wait_for(&mut a.leader, true).await;
        memory.down.store(true, Ordering::SeqCst);
        let down = Instant::now();
        wait_for(&mut a.leader, false).await;
        assert!(down.elapsed() <= Duration::from_secs(10));
        assert!(!a.gate.is_open());
        memory.down.store(false, Ordering::SeqCst);
        wait_for(&mut a.leader, true).await;
    }

    #[test]
    fn always_open_gate_is_open() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            assert!(LeaderGate::always_open().is_open());
            assert!(!LeaderGate::default().is_open());
        });
    }
}
