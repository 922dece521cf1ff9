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
//!
//! An operator sees the election: a status line at INFO on every change
//! ("leading", "following HOLDER since TIME"), and every failed Lease
//! request counted by [`LeaseErrorReason`] and logged at WARN with what to
//! check, at most once a minute per reason (a replica that can never lead,
//! for want of a Role, says so at the default level).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
pub(crate) enum LeaseError {
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

/// Why a Lease request failed: the `reason` label of
/// `kube_watcher_lease_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseErrorReason {
    /// HTTP 403: the Role does not allow it.
    Forbidden,
    /// HTTP 404 on create: the namespace does not exist.
    NotFound,
    /// HTTP 409: another replica wrote the Lease first (a lost race).
    Conflict,
    /// No answer before the renew deadline.
    Timeout,
    /// Anything else (connection refused, 5xx, ...).
    Other,
}

impl LeaseErrorReason {
    /// Every reason, in label order.
    pub const ALL: [LeaseErrorReason; 5] = [
        LeaseErrorReason::Forbidden,
        LeaseErrorReason::NotFound,
        LeaseErrorReason::Conflict,
        LeaseErrorReason::Timeout,
        LeaseErrorReason::Other,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            LeaseErrorReason::Forbidden => "forbidden",
            LeaseErrorReason::NotFound => "not_found",
            LeaseErrorReason::Conflict => "conflict",
            LeaseErrorReason::Timeout => "timeout",
            LeaseErrorReason::Other => "other",
        }
    }

    fn index(self) -> usize {
        match self {
            LeaseErrorReason::Forbidden => 0,
            LeaseErrorReason::NotFound => 1,
            LeaseErrorReason::Conflict => 2,
            LeaseErrorReason::Timeout => 3,
            LeaseErrorReason::Other => 4,
        }
    }

    /// What an operator should check, for the Lease `lease`
    /// (`namespace/name`) in `namespace`.
    fn hint(self, lease: &str, namespace: &str) -> String {
        match self {
            LeaseErrorReason::Forbidden => format!(
                "check RBAC: the ServiceAccount needs get, create and update on \
                 coordination.k8s.io leases in namespace {namespace:?} (a Role and \
                 RoleBinding there; see deploy/rbac.yaml) for {lease}; deploy/rbac.yaml \
                 names only the Lease kube-watcher in resourceNames, so another \
                 --lease-name must be added there"
            ),
            LeaseErrorReason::NotFound => {
                format!("check that namespace {namespace:?} exists (--namespace-for-leases)")
            }
            LeaseErrorReason::Conflict => {
                "another replica wrote the lease first; nothing to fix".to_owned()
            }
            LeaseErrorReason::Timeout => {
                "check the API server's health and the network from this pod".to_owned()
            }
            LeaseErrorReason::Other => {
                "check the API server's health and this replica's credentials".to_owned()
            }
        }
    }
}

impl LeaseError {
    /// The metric reason of this error.
    pub(crate) fn reason(&self) -> LeaseErrorReason {
        match self {
            LeaseError::Conflict => LeaseErrorReason::Conflict,
            LeaseError::Timeout => LeaseErrorReason::Timeout,
            LeaseError::Api(kube::Error::Api(status)) if status.is_forbidden() => {
                LeaseErrorReason::Forbidden
            }
            LeaseError::Api(kube::Error::Api(status)) if status.is_not_found() => {
                LeaseErrorReason::NotFound
            }
            LeaseError::Api(kube::Error::Api(status)) if status.is_conflict() => {
                LeaseErrorReason::Conflict
            }
            LeaseError::Api(_) => LeaseErrorReason::Other,
        }
    }
}

/// Failed Lease requests per [`LeaseErrorReason`]. Cheap to clone; every
/// clone counts into the same numbers.
#[derive(Clone, Debug, Default)]
pub struct LeaseErrorCounts(Arc<[AtomicU64; 5]>);

impl LeaseErrorCounts {
    /// Counts one failure.
    pub fn record(&self, reason: LeaseErrorReason) {
        if let Some(count) = self.0.get(reason.index()) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The failures of `reason` so far.
    pub fn get(&self, reason: LeaseErrorReason) -> u64 {
        self.0
            .get(reason.index())
            .map_or(0, |count| count.load(Ordering::Relaxed))
    }
}

/// How often a WARN is repeated for one reason while it persists.
pub(crate) const LEASE_WARN_INTERVAL: Duration = Duration::from_secs(60);

/// Reads and writes one Lease object.
#[async_trait]
pub(crate) trait LeaseBackend: Send + Sync + 'static {
    /// The Lease as `namespace/name`, for logs.
    fn describe(&self) -> String {
        "the lease".to_owned()
    }
    /// The Lease's namespace, for hints in logs.
    fn namespace(&self) -> String {
        String::new()
    }
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
pub(crate) struct KubeLease {
    api: Api<Lease>,
    namespace: String,
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
    pub(crate) fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
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
    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn namespace(&self) -> String {
        self.namespace.clone()
    }

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
pub(crate) struct LeaderGate {
    open_until: Arc<Mutex<Option<Instant>>>,
}

impl LeaderGate {
    /// Whether writes are allowed at this instant.
    pub(crate) fn is_open(&self) -> bool {
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
    acquire_time: Option<String>,
    renew_time: Option<String>,
    resource_version: Option<String>,
    duration: Duration,
}

/// Runs the election for one replica; see the module documentation.
pub(crate) struct LeaderElector<B> {
    backend: B,
    config: LeaseConfig,
    gate: LeaderGate,
    leader: watch::Sender<bool>,
    observed: Option<(Observed, Instant)>,
    errors: LeaseErrorCounts,
    /// When each reason was last logged at WARN.
    warned: HashMap<LeaseErrorReason, Instant>,
    /// The holder the last "following" line named.
    announced: Option<String>,
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
    pub(crate) fn new(backend: B, config: LeaseConfig) -> Self {
        Self {
            backend,
            config,
            gate: LeaderGate::default(),
            leader: watch::Sender::new(false),
            observed: None,
            errors: LeaseErrorCounts::default(),
            warned: HashMap::new(),
            announced: None,
        }
    }

    /// Counts failed requests into `errors` (the host's metrics).
    #[must_use]
    pub(crate) fn counting(mut self, errors: LeaseErrorCounts) -> Self {
        self.errors = errors;
        self
    }

    /// Counts `error` and logs it: WARN with what to check, at most once per
    /// [`LEASE_WARN_INTERVAL`] per reason, DEBUG otherwise (and always for a
    /// lost race, which is routine).
    fn report(&mut self, error: &LeaseError, doing: &str) {
        let reason = error.reason();
        self.errors.record(reason);
        let now = Instant::now();
        let due = reason != LeaseErrorReason::Conflict
            && self
                .warned
                .get(&reason)
                .is_none_or(|last| now.duration_since(*last) >= LEASE_WARN_INTERVAL);
        let lease = self.backend.describe();
        if due {
            self.warned.insert(reason, now);
            let hint = reason.hint(&lease, &self.backend.namespace());
            tracing::warn!(
                %lease,
                reason = reason.label(),
                %error,
                "cannot {doing} the lease {lease} ({}): {hint}; kube_watcher_lease_errors_total counts every failure, this is logged at most once a minute",
                reason.label()
            );
        } else {
            tracing::debug!(%lease, reason = reason.label(), %error, "cannot {doing} the lease");
        }
    }

    /// Logs "following HOLDER since TIME" when the holder changed.
    fn announce_holder(&mut self) {
        let Some((observed, _)) = &self.observed else {
            return;
        };
        let Some(holder) = observed.holder.clone().filter(|h| !h.is_empty()) else {
            return;
        };
        if holder == self.config.identity || self.announced.as_ref() == Some(&holder) {
            return;
        }
        let since = observed
            .acquire_time
            .clone()
            .unwrap_or_else(|| "an unknown time".to_owned());
        tracing::info!(
            lease = %self.backend.describe(),
            leader = %holder,
            "following {holder} since {since}"
        );
        self.announced = Some(holder);
    }

    /// The gate the writers check.
    pub(crate) fn gate(&self) -> LeaderGate {
        self.gate.clone()
    }

    /// Tells whether this replica leads; changes as soon as it does.
    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.leader.subscribe()
    }

    /// Acquires, renews, and on losing the Lease tries again, until `cancel`
    /// fires; then gives the Lease up if it holds it.
    pub(crate) async fn run(mut self, cancel: CancellationToken) {
        loop {
            if !self.acquire(&cancel).await {
                break;
            }
            tracing::info!(
                identity = %self.config.identity,
                lease = %self.backend.describe(),
                "leading"
            );
            self.announced = None;
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
                Ok(false) => self.announce_holder(),
                Err(error) => self.report(&error, "acquire"),
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
                Err(error) if Instant::now() < deadline => self.report(&error, "renew"),
                Err(error) => {
                    self.errors.record(error.reason());
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
                Err(LeaseError::Conflict) => {
                    self.report(&LeaseError::Conflict, "create");
                    Ok(false)
                }
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
            Err(LeaseError::Conflict) => {
                self.report(&LeaseError::Conflict, "update");
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Records `lease` and returns when its record was first seen.
    fn observe(&mut self, lease: &Lease) -> Instant {
        let spec = lease.spec.as_ref();
        let observed = Observed {
            holder: spec.and_then(|s| s.holder_identity.clone()),
            acquire_time: spec.and_then(|s| s.acquire_time.as_ref().map(|t| t.0.to_string())),
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
            Err(error) => {
                self.errors.record(error.reason());
                tracing::warn!(%error, "could not release the lease");
            }
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
}
