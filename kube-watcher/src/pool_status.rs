//! Pool status as MetalLB v0.15 writes it (`status.assignedIPv4` …),
//! from `AllocatingController::pool_stats()`, with our `Accepted`
//! condition, at most once per period (one second) per pool, and only what
//! changed; a Warning Event on each rejected pool, once per distinct
//! problem.
//!
//! A rejected pool (`AllocatingController::rejected_pools()`) holds
//! nothing: its counters are 0 and its condition says why (reason `Invalid`
//! or `Overlap`), as does its Event (reason `InvalidPool` or
//! `OverlappingPool`, the message naming the problem and, for an overlap,
//! the pool it overlaps). A cluster that runs MetalLB's own CRD prunes
//! `status.conditions` (its schema has no such field); the Event stays.
//!
//! `CiliumLoadBalancerIPPool`s (once discovery found them served) get
//! Cilium's four conditions instead (docs/cilium.md §2.8, see
//! [`CiliumPoolState`]): `cilium.io/IPsTotal`, `IPsAvailable`, `IPsUsed`
//! and `PoolConflict`, written only when one of them would change. Conditions
//! of other types stay: the list is read from the cache, our four replaced
//! or appended, and the whole list written by a JSON merge patch of the
//! status subresource carrying the `resourceVersion` it was read at (a
//! custom resource takes no strategic merge patch, and Cilium's CRD does not
//! declare `conditions` a map list a server-side apply could merge into; the
//! precondition makes a concurrent writer's change a 409, after which the
//! pool is read again and the write retried once, instead of lost). A Cilium
//! pool rejected as invalid gets no condition (docs/cilium.md §10, open
//! question 2), only its Warning Event, as a MetalLB pool.
//!
//! A write that fails (a status, Cilium's conditions, an Event) is tried
//! again after a delay that doubles with each failure of that pool, from
//! one period up to five minutes, and a streak of failures is logged at
//! WARN once (DEBUG after, INFO when it ends): a lasting error, such as a
//! missing RBAC rule, costs neither the API server a request nor the log a
//! line per pool every period.

use std::collections::HashMap;
use std::time::Duration;

use allocator::{PoolKind, PoolStats, RejectedPool};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Reporter};
use kube::Resource;
use manager::AllocatingController;
use serde_json::{json, Value};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::cilium::{self, CiliumPoolResource};
use crate::client::{EVENT_ACTION, FIELD_MANAGER};
use crate::config_state::ConfigStateWriter;
use crate::crd::{IPAddressPoolResource, IPAddressPoolStatus, PoolCondition};
use crate::discovered::ServedVersion;
use crate::lease::LeaderGate;
use crate::retry::doubled;
use crate::store::KubeStore;

/// How often pool statuses are brought up to date.
pub(crate) const POOL_STATUS_PERIOD: Duration = Duration::from_secs(1);

/// The type of a pool's condition.
pub(crate) const ACCEPTED: &str = "Accepted";

/// The reasons of the `Accepted` condition and of the pool's Events.
pub(crate) mod reason {
    /// `Accepted` True.
    pub(crate) const ACCEPTED: &str = "Accepted";
    /// `Accepted` False: the pool itself is invalid.
    pub(crate) const INVALID: &str = "Invalid";
    /// `Accepted` False: it overlaps a pool accepted before it.
    pub(crate) const OVERLAP: &str = "Overlap";
    /// The Warning Event of an invalid pool.
    pub(crate) const INVALID_POOL: &str = "InvalidPool";
    /// The Warning Event of an overlapping pool.
    pub(crate) const OVERLAPPING_POOL: &str = "OverlappingPool";
}

/// The message of an accepted pool's condition.
const ACCEPTED_MESSAGE: &str = "the pool is accepted";

/// The pool a rejection names as overlapped: the allocator says
/// `addresses "…" overlap "…" of pool "NAME"`, or `of
/// CiliumLoadBalancerIPPool "NAME"` when the older pool is Cilium's (a
/// pool's own entries that overlap say `in the same pool`: invalid, not an
/// overlap).
pub(crate) fn overlapped_pool(reason: &str) -> Option<&str> {
    let (_, pool) = reason
        .rsplit_once(" of pool \"")
        .or_else(|| reason.rsplit_once(" of CiliumLoadBalancerIPPool \""))?;
    pool.strip_suffix('"')
}

/// The condition's reason and the Event's reason of a rejection.
fn rejection_reasons(reason: &str) -> (&'static str, &'static str) {
    if overlapped_pool(reason).is_some() {
        (reason::OVERLAP, reason::OVERLAPPING_POOL)
    } else {
        (reason::INVALID, reason::INVALID_POOL)
    }
}

/// The `Accepted` condition, its `lastTransitionTime` taken from `shown`
/// while the status is the same, else `now`.
fn accepted_condition(
    accepted: bool,
    reason: &str,
    message: &str,
    shown: Option<&IPAddressPoolStatus>,
    now: &str,
) -> PoolCondition {
    let status = if accepted { "True" } else { "False" };
    let previous = shown
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == ACCEPTED))
        .filter(|c| c.status == status);
    PoolCondition {
        type_: ACCEPTED.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: previous
            .map_or_else(|| now.to_owned(), |c| c.last_transition_time.clone()),
    }
}

/// Cilium's four conditions of one pool as the manager computes them
/// ([`manager::cilium_pool_conditions`], docs/cilium.md §2.8: the counts as
/// exact decimals, the conflict), and the generation they observe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CiliumPoolState {
    pub conditions: [manager::PoolCondition; 4],
    /// The pool's `metadata.generation` (the conditions' observedGeneration).
    pub generation: Option<i64>,
}

impl CiliumPoolState {
    /// The state of the Cilium `pool` among the allocator's accepted and
    /// rejected pools; `None` where Cilium writes nothing (a pool rejected
    /// as invalid, or one the allocator does not know).
    pub(crate) fn of(
        pool: &CiliumPoolResource,
        figures: &manager::CiliumPoolFigures<'_>,
    ) -> Option<Self> {
        let conditions = figures.conditions(&pool.0)?;
        Some(Self {
            conditions,
            generation: pool.0.metadata.generation,
        })
    }

    /// (type, status, reason, message) of each of the four.
    fn wanted(&self) -> [(&'static str, &'static str, &'static str, &str); 4] {
        self.conditions
            .each_ref()
            .map(|c| (c.condition_type, c.status, c.reason, c.message.as_str()))
    }

    /// Whether `conditions` (a pool's `status.conditions`) show this state:
    /// each of the four with this status, reason, message and
    /// observedGeneration (Cilium's rule for rewriting one).
    pub(crate) fn is_shown_in(&self, conditions: &[Value]) -> bool {
        self.wanted()
            .iter()
            .all(|(type_, status, reason, message)| {
                find(conditions, type_).is_some_and(|shown| {
                    shown.get("status").and_then(Value::as_str) == Some(status)
                        && shown.get("reason").and_then(Value::as_str) == Some(reason)
                        && shown.get("message").and_then(Value::as_str) == Some(message)
                        && shown.get("observedGeneration").and_then(Value::as_i64)
                            == self.generation
                })
            })
    }

    /// `conditions` with the four set to this state: conditions of other
    /// types kept where they are, ours replaced in place or appended; a
    /// condition's `lastTransitionTime` kept while its status is unchanged,
    /// else `now` (as `meta.SetStatusCondition`).
    pub(crate) fn merged_into(&self, conditions: &[Value], now: &str) -> Vec<Value> {
        let mut merged: Vec<Value> = conditions.to_vec();
        for (type_, status, reason, message) in self.wanted() {
            let since = find(conditions, type_)
                .filter(|shown| shown.get("status").and_then(Value::as_str) == Some(status))
                .and_then(|shown| shown.get("lastTransitionTime").cloned())
                .unwrap_or_else(|| json!(now));
            let mut condition = json!({
                "type": type_,
                "status": status,
                "lastTransitionTime": since,
                "reason": reason,
                "message": message,
            });
            if let (Some(generation), Some(fields)) = (self.generation, condition.as_object_mut()) {
                fields.insert("observedGeneration".to_owned(), json!(generation));
            }
            let at = merged
                .iter()
                .position(|c| c.get("type").and_then(Value::as_str) == Some(type_));
            match at.and_then(|at| merged.get_mut(at)) {
                Some(slot) => *slot = condition,
                None => merged.push(condition),
            }
        }
        merged
    }
}

/// The condition of `type_` among `conditions`.
fn find<'a>(conditions: &'a [Value], type_: &str) -> Option<&'a Value> {
    conditions
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

/// `status.conditions` of a cached Cilium pool.
fn shown_conditions(pool: &CiliumPoolResource) -> Vec<Value> {
    pool.0
        .status
        .as_ref()
        .and_then(|status| status.get("conditions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// What the writer writes about a pool (or MetalLB's
/// `ConfigurationState`), each retried on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Write {
    Status,
    CiliumConditions,
    Event,
    ConfigurationState,
}

impl Write {
    fn what(self) -> &'static str {
        match self {
            Write::Status => "the pool's status",
            Write::CiliumConditions => "the Cilium pool's conditions",
            Write::Event => "the pool's Event",
            Write::ConfigurationState => "the ConfigurationState",
        }
    }
}

/// The longest wait before a failed write is tried again.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(300);

/// The writes that failed, by (what, namespace, name): how many times in a
/// row, and when the next try is due.
#[derive(Debug, Default)]
pub(crate) struct Retries {
    failing: HashMap<(Write, String, String), (u32, Instant)>,
}

impl Retries {
    fn key(what: Write, (namespace, name): &(String, String)) -> (Write, String, String) {
        (what, namespace.clone(), name.clone())
    }

    /// Whether `what` of the pool `id` may be tried at `now`.
    pub(crate) fn due(&self, what: Write, id: &(String, String), now: Instant) -> bool {
        self.failing
            .get(&Self::key(what, id))
            .is_none_or(|&(_, next)| now >= next)
    }

    /// Books a failure at `now` and logs it: at WARN for a streak's first,
    /// and again each time the delay is at its longest (a reminder every
    /// five minutes), else at DEBUG. The next try waits `base`, doubled for
    /// each further failure in a row, at most [`MAX_RETRY_DELAY`].
    pub(crate) fn failed(
        &mut self,
        what: Write,
        id: &(String, String),
        now: Instant,
        base: Duration,
        error: &kube::Error,
    ) {
        let (failures, next) = self.failing.entry(Self::key(what, id)).or_insert((0, now));
        *failures = failures.saturating_add(1);
        let delay = doubled(base, *failures - 1, MAX_RETRY_DELAY);
        *next = now + delay;
        let (pool, failures, what) = (&id.1, *failures, what.what());
        let retry_in_ms = delay.as_millis();
        if failures == 1 || delay == MAX_RETRY_DELAY {
            tracing::warn!(
                name = %pool,
                %error,
                failures,
                retry_in_ms,
                "could not write {what}; retrying with backoff"
            );
        } else {
            tracing::debug!(
                name = %pool,
                %error,
                failures,
                retry_in_ms,
                "could not write {what}"
            );
        }
    }

    /// Books a success, logging the end of a streak.
    pub(crate) fn succeeded(&mut self, what: Write, id: &(String, String)) {
        if let Some((failures, _)) = self.failing.remove(&Self::key(what, id)) {
            let what = what.what();
            tracing::info!(
                name = %id.1,
                failures,
                "wrote {what} after {failures} failed attempts"
            );
        }
    }
}

/// Writes pool statuses and pool Events for one leadership term.
pub(crate) struct PoolStatusWriter {
    client: kube::Client,
    store: KubeStore,
    gate: LeaderGate,
    reporter: Reporter,
    /// What was last written, by (namespace, name).
    written: HashMap<(String, String), IPAddressPoolStatus>,
    /// The rejection last warned about, by (namespace, name).
    warned: HashMap<(String, String), String>,
    /// MetalLB's `ConfigurationState`, if asked for.
    config_state: Option<ConfigStateWriter>,
    /// The version Cilium pools are served at, once discovery found it.
    cilium_version: Option<ServedVersion>,
    /// The Cilium pool conditions last written, by name, with the
    /// resourceVersion they were read at: while the cache still shows that
    /// version, the write is not repeated.
    cilium_written: HashMap<String, (CiliumPoolState, Option<String>)>,
    /// The writes that failed, tried again with backoff.
    retries: Retries,
    /// The period of [`PoolStatusWriter::run`]: the first retry's delay.
    period: Duration,
}

impl std::fmt::Debug for PoolStatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolStatusWriter")
            .field("written", &self.written.len())
            .field("warned", &self.warned.len())
            .finish_non_exhaustive()
    }
}

impl PoolStatusWriter {
    /// A writer through `client`, reading pool objects from `store`,
    /// allowed to write while `gate` is open; its Events name `reporter`.
    pub(crate) fn new(
        client: kube::Client,
        store: KubeStore,
        gate: LeaderGate,
        reporter: Reporter,
    ) -> Self {
        Self {
            client,
            store,
            gate,
            reporter,
            written: HashMap::new(),
            warned: HashMap::new(),
            config_state: None,
            cilium_version: None,
            cilium_written: HashMap::new(),
            retries: Retries::default(),
            period: POOL_STATUS_PERIOD,
        }
    }

    /// Also writes the conditions of Cilium pools, once `version` says at
    /// which version they are served.
    #[must_use]
    pub(crate) fn cilium_version(mut self, version: ServedVersion) -> Self {
        self.cilium_version = Some(version);
        self
    }

    /// Also writes MetalLB's `ConfigurationState` in `namespace` (where its
    /// CRD exists).
    #[must_use]
    pub(crate) fn configuration_state(mut self, namespace: String) -> Self {
        self.config_state = Some(ConfigStateWriter::new(
            self.client.clone(),
            namespace,
            self.gate.clone(),
        ));
        self
    }

    /// Writes the status of every pool (accepted: its counters; rejected:
    /// zeros) whose status differs from its object's (and from what this
    /// writer last wrote), and warns about each rejection not warned about
    /// yet; returns how many statuses were written.
    pub(crate) async fn update(&mut self, controller: &AllocatingController) -> usize {
        let now = k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let (cilium_stats, metallb_stats): (Vec<PoolStats>, Vec<PoolStats>) = controller
            .pool_stats()
            .into_iter()
            .partition(|stats| stats.kind == PoolKind::CiliumLoadBalancerIPPool);
        let (cilium_rejected, metallb_rejected): (Vec<_>, Vec<_>) = controller
            .rejected_pools()
            .into_iter()
            .partition(|pool| pool.kind == PoolKind::CiliumLoadBalancerIPPool);
        let wanted = self.metallb_statuses(metallb_stats, metallb_rejected, &now);
        if let Some(config_state) = self.config_state.as_mut() {
            config_state.update(controller, self.period).await;
        }
        let mut count = 0;
        for (name, status, rejection) in wanted {
            if !self.gate.is_open() {
                break;
            }
            let Some(pool) = self.store.pool_resource(&name) else {
                continue;
            };
            let Some(namespace) = pool.metadata.namespace.clone() else {
                continue;
            };
            let id = (namespace, name);
            match rejection {
                Some(rejection) => {
                    let shown = pool
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|conditions| {
                            conditions.iter().any(|c| {
                                c.type_ == ACCEPTED && c.status == "False" && c.message == rejection
                            })
                        });
                    self.warn(pool.object_ref(&()), &id, &rejection, shown)
                        .await;
                }
                None => {
                    self.warned.remove(&id);
                }
            }
            if pool.status.as_ref() == Some(&status) || self.written.get(&id) == Some(&status) {
                continue;
            }
            let now = Instant::now();
            if !self.retries.due(Write::Status, &id, now) {
                continue;
            }
            match self.write(&id, &status).await {
                Ok(()) => {
                    self.retries.succeeded(Write::Status, &id);
                    self.written.insert(id, status);
                    count += 1;
                }
                Err(error) => {
                    self.retries
                        .failed(Write::Status, &id, now, self.period, &error);
                }
            }
        }
        count
            + self
                .update_cilium(cilium_stats, cilium_rejected, &now)
                .await
    }

    /// The status each MetalLB pool should show, and the rejection of each
    /// rejected one.
    fn metallb_statuses(
        &self,
        stats: Vec<PoolStats>,
        rejected: Vec<RejectedPool>,
        now: &str,
    ) -> Vec<(String, IPAddressPoolStatus, Option<String>)> {
        let mut wanted = Vec::new();
        for stats in stats {
            let shown = self.store.pool_resource(&stats.name);
            let mut status = IPAddressPoolStatus::from_stats(&stats);
            let condition = accepted_condition(
                true,
                reason::ACCEPTED,
                ACCEPTED_MESSAGE,
                self.previous(shown.as_deref()),
                now,
            );
            status.conditions = Some(vec![condition]);
            wanted.push((stats.name, status, None));
        }
        for rejected in rejected {
            let shown = self.store.pool_resource(&rejected.name);
            let (condition_reason, _) = rejection_reasons(&rejected.reason);
            let condition = accepted_condition(
                false,
                condition_reason,
                &rejected.reason,
                self.previous(shown.as_deref()),
                now,
            );
            let status = IPAddressPoolStatus {
                conditions: Some(vec![condition]),
                ..IPAddressPoolStatus::default()
            };
            wanted.push((rejected.name, status, Some(rejected.reason)));
        }
        wanted
    }

    /// [`update`](Self::update) for Cilium pools: the four conditions of
    /// every accepted pool and of every pool rejected for a conflict, and
    /// an Event on every rejected pool; nothing before discovery found them
    /// served.
    async fn update_cilium(
        &mut self,
        accepted: Vec<PoolStats>,
        rejected: Vec<allocator::RejectedPool>,
        now: &str,
    ) -> usize {
        let Some(version) = self.cilium_version.as_ref().and_then(|v| *v.borrow()) else {
            return 0;
        };
        let figures = manager::CiliumPoolFigures::new(&accepted, &rejected);
        let mut wanted: Vec<(std::sync::Arc<CiliumPoolResource>, CiliumPoolState)> = Vec::new();
        for stats in &accepted {
            let Some(pool) = self.store.cilium_pool_resource(&stats.name) else {
                continue;
            };
            self.warned.remove(&(String::new(), stats.name.clone()));
            if let Some(state) = CiliumPoolState::of(&pool, &figures) {
                wanted.push((pool, state));
            }
        }
        for rejection in &rejected {
            if !self.gate.is_open() {
                return 0;
            }
            let Some(pool) = self.store.cilium_pool_resource(&rejection.name) else {
                continue;
            };
            let id = (String::new(), rejection.name.clone());
            let mut reference = pool.object_ref(&());
            reference.api_version = Some(format!("{}/{version}", cilium::GROUP));
            // Invalid: no condition would be true (docs/cilium.md §10).
            let state = CiliumPoolState::of(&pool, &figures);
            let shown = state
                .as_ref()
                .is_some_and(|state| state.is_shown_in(&shown_conditions(&pool)));
            self.warn(reference, &id, &rejection.reason, shown).await;
            if let Some(state) = state {
                wanted.push((pool, state));
            }
        }
        let mut count = 0;
        for (pool, state) in wanted {
            if !self.gate.is_open() {
                break;
            }
            let Some(name) = pool.0.metadata.name.clone() else {
                continue;
            };
            if state.is_shown_in(&shown_conditions(&pool)) {
                self.cilium_written.remove(&name);
                continue;
            }
            let read_at = pool.0.metadata.resource_version.clone();
            if self.cilium_written.get(&name) == Some(&(state.clone(), read_at.clone())) {
                continue;
            }
            let id = (String::new(), name);
            let at = Instant::now();
            if !self.retries.due(Write::CiliumConditions, &id, at) {
                continue;
            }
            match self.write_cilium(version, &pool, &state, now).await {
                Ok(()) => {
                    self.retries.succeeded(Write::CiliumConditions, &id);
                    self.cilium_written.insert(id.1, (state, read_at));
                    count += 1;
                }
                Err(error) => {
                    self.retries
                        .failed(Write::CiliumConditions, &id, at, self.period, &error);
                }
            }
        }
        count
    }

    /// Writes `state` into the conditions of the Cilium `pool` (see the
    /// module documentation): a merge patch of the whole list as read, with
    /// the resourceVersion it was read at; on a 409 the pool is read again
    /// and the write retried once.
    async fn write_cilium(
        &self,
        version: &str,
        pool: &CiliumPoolResource,
        state: &CiliumPoolState,
        now: &str,
    ) -> Result<(), kube::Error> {
        let api: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &cilium::api_resource(version));
        let name = pool.0.metadata.name.clone().unwrap_or_default();
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let mut conditions = shown_conditions(pool);
        let mut resource_version = pool.0.metadata.resource_version.clone();
        let mut read_again = false;
        loop {
            let patch = json!({
                "metadata": {"resourceVersion": resource_version},
                "status": {"conditions": state.merged_into(&conditions, now)},
            });
            let error = match api.patch_status(&name, &params, &Patch::Merge(patch)).await {
                Ok(_) => {
                    tracing::debug!(pool = %name, ?state, "Cilium pool conditions written");
                    return Ok(());
                }
                Err(error) => error,
            };
            let conflict = matches!(&error, kube::Error::Api(status) if status.code == 409);
            if !conflict || read_again {
                return Err(error);
            }
            // Changed since the cache read it: read it again, once.
            read_again = true;
            let fresh = api.get(&name).await?;
            conditions = fresh
                .data
                .get("status")
                .and_then(|status| status.get("conditions"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            resource_version = fresh.metadata.resource_version;
            if state.is_shown_in(&conditions) {
                return Ok(());
            }
        }
    }

    /// The status whose `Accepted` condition a new one continues: the
    /// object's when it shows one, else what this writer last wrote (a
    /// cluster with MetalLB's CRD prunes the condition: without this, its
    /// `lastTransitionTime` would be new, and written, every period).
    fn previous<'a>(
        &'a self,
        pool: Option<&'a IPAddressPoolResource>,
    ) -> Option<&'a IPAddressPoolStatus> {
        let pool = pool?;
        let shows = |status: &&IPAddressPoolStatus| {
            status
                .conditions
                .as_ref()
                .is_some_and(|c| c.iter().any(|c| c.type_ == ACCEPTED))
        };
        pool.status.as_ref().filter(shows).or_else(|| {
            let id = (
                pool.metadata.namespace.clone()?,
                pool.metadata.name.clone()?,
            );
            self.written.get(&id)
        })
    }

    /// Merge-patches the status of the pool `id` (a custom resource takes
    /// no strategic merge patch; the status is ours alone).
    async fn write(
        &self,
        id: &(String, String),
        status: &IPAddressPoolStatus,
    ) -> Result<(), kube::Error> {
        let api: Api<IPAddressPoolResource> = Api::namespaced(self.client.clone(), &id.0);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let patch = Patch::Merge(json!({ "status": status }));
        api.patch_status(&id.1, &params, &patch).await?;
        tracing::debug!(pool = %id.1, ?status, "pool status written");
        Ok(())
    }

    /// A Warning Event on the rejected pool `reference` (`id`: namespace,
    /// empty for a Cilium pool, and name), unless this rejection was warned
    /// about already (by this writer, or, as its condition `shown`s, by an
    /// earlier one).
    async fn warn(
        &mut self,
        reference: k8s_openapi::api::core::v1::ObjectReference,
        id: &(String, String),
        reason: &str,
        shown: bool,
    ) {
        if self.warned.get(id).map(String::as_str) == Some(reason) {
            return;
        }
        if !shown {
            let now = Instant::now();
            if !self.retries.due(Write::Event, id, now) {
                return;
            }
            let (_, event_reason) = rejection_reasons(reason);
            let event = KubeEvent {
                type_: EventType::Warning,
                reason: event_reason.to_owned(),
                note: Some(manager::capped_note(format!(
                    "pool {:?} is not used: {reason}",
                    id.1
                ))),
                action: EVENT_ACTION.to_owned(),
                secondary: None,
            };
            let published =
                crate::events::publish(&self.client, &self.reporter, &event, &reference).await;
            if let Err(error) = published {
                self.retries
                    .failed(Write::Event, id, now, self.period, &error);
                return;
            }
            self.retries.succeeded(Write::Event, id);
        }
        self.warned.insert(id.clone(), reason.to_owned());
    }

    /// Updates every `period` until `cancel` fires.
    pub(crate) async fn run(
        mut self,
        controller: std::sync::Arc<AllocatingController>,
        period: Duration,
        cancel: CancellationToken,
    ) {
        self.period = period;
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticks.tick() => {}
            }
            self.update(&controller).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_failing_write_waits_longer_each_time_and_a_success_ends_it() {
        let mut retries = Retries::default();
        let id = ("ns".to_owned(), "p".to_owned());
        let base = Duration::from_secs(1);
        let error = kube::Error::Api(
            kube::core::Status::failure("forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        );
        let start = Instant::now();
        assert!(retries.due(Write::Status, &id, start));
        // Tried at 0, 1, 3, 7, 15 ... seconds: each wait doubles.
        let mut at = start;
        let mut tries = Vec::new();
        while at < start + Duration::from_secs(40) {
            if retries.due(Write::Status, &id, at) {
                tries.push((at - start).as_secs());
                retries.failed(Write::Status, &id, at, base, &error);
            }
            at += Duration::from_secs(1);
        }
        assert_eq!(tries, [0, 1, 3, 7, 15, 31]);
        // Each kind of write of each pool on its own.
        assert!(retries.due(Write::Event, &id, at));
        assert!(retries.due(Write::Status, &("ns".to_owned(), "q".to_owned()), at));
        // Never longer than the cap.
        for _ in 0..40 {
            retries.failed(Write::Status, &id, at, base, &error);
        }
        assert!(retries.due(Write::Status, &id, at + MAX_RETRY_DELAY));
        assert!(!retries.due(
            Write::Status,
            &id,
            at + MAX_RETRY_DELAY - Duration::from_secs(1)
        ));
        retries.succeeded(Write::Status, &id);
        assert!(retries.due(Write::Status, &id, at));
    }

    #[test]
    fn an_overlap_names_the_other_pool() {
        let overlap = r#"addresses "10.0.0.0/24" overlap "10.0.0.0-10.0.0.255" of pool "first""#;
        assert_eq!(overlapped_pool(overlap), Some("first"));
        assert_eq!(
            rejection_reasons(overlap),
            (reason::OVERLAP, reason::OVERLAPPING_POOL)
        );
        let cilium = r#"blocks[0] "10.0.0.0 - 10.0.0.255" overlaps "10.0.0.0 - 10.0.0.255" of CiliumLoadBalancerIPPool "blue""#;
        assert_eq!(overlapped_pool(cilium), Some("blue"));
        let own = r#"addresses "10.0.0.0/24" overlap "10.0.0.1" in the same pool"#;
        assert_eq!(overlapped_pool(own), None);
        assert_eq!(
            rejection_reasons(own),
            (reason::INVALID, reason::INVALID_POOL)
        );
    }

    #[test]
    fn the_transition_time_stays_with_the_status() {
        let shown = IPAddressPoolStatus {
            conditions: Some(vec![accepted_condition(
                false, "Invalid", "bad", None, "T0",
            )]),
            ..IPAddressPoolStatus::default()
        };
        let again = accepted_condition(false, "Overlap", "other", Some(&shown), "T1");
        assert_eq!(again.last_transition_time, "T0");
        let accepted = accepted_condition(true, "Accepted", "ok", Some(&shown), "T1");
        assert_eq!(accepted.last_transition_time, "T1");
    }

    /// A state with these counts and conflict, generation 3.
    fn cilium_state(counts: [&str; 3], conflict: Option<&str>) -> CiliumPoolState {
        let count = |condition_type, message: &str| manager::PoolCondition {
            condition_type,
            status: "Unknown",
            reason: "noreason",
            message: message.to_owned(),
        };
        let conflict = match conflict {
            Some(message) => ("True", "cidr_overlap", message),
            None => ("False", "resolved", ""),
        };
        CiliumPoolState {
            conditions: [
                count("cilium.io/IPsTotal", counts[0]),
                count("cilium.io/IPsAvailable", counts[1]),
                count("cilium.io/IPsUsed", counts[2]),
                manager::PoolCondition {
                    condition_type: "cilium.io/PoolConflict",
                    status: conflict.0,
                    reason: conflict.1,
                    message: conflict.2.to_owned(),
                },
            ],
            generation: Some(3),
        }
    }

    #[test]
    fn cilium_conditions_merge_into_the_list_and_keep_other_types() {
        let state = cilium_state(["256", "254", "2"], None);
        let other = json!({"type": "other", "status": "True", "reason": "R", "message": "",
                           "lastTransitionTime": "T0"});
        let stale_used = json!({"type": "cilium.io/IPsUsed", "status": "Unknown",
                                "reason": "noreason", "message": "1",
                                "observedGeneration": 3, "lastTransitionTime": "T0"});
        let shown = [other.clone(), stale_used];
        assert!(!state.is_shown_in(&shown));
        let merged = state.merged_into(&shown, "T1");
        assert_eq!(
            merged,
            [
                other,
                json!({"type": "cilium.io/IPsUsed", "status": "Unknown", "reason": "noreason",
                       "message": "2", "observedGeneration": 3, "lastTransitionTime": "T0"}),
                json!({"type": "cilium.io/IPsTotal", "status": "Unknown", "reason": "noreason",
                       "message": "256", "observedGeneration": 3, "lastTransitionTime": "T1"}),
                json!({"type": "cilium.io/IPsAvailable", "status": "Unknown",
                       "reason": "noreason", "message": "254", "observedGeneration": 3,
                       "lastTransitionTime": "T1"}),
                json!({"type": "cilium.io/PoolConflict", "status": "False", "reason": "resolved",
                       "message": "", "observedGeneration": 3, "lastTransitionTime": "T1"}),
            ]
        );
        assert!(state.is_shown_in(&merged));
        // A conflict flips PoolConflict (new time), the counts keep theirs.
        let conflicting = cilium_state(["256", "254", "2"], Some("overlaps"));
        assert!(!conflicting.is_shown_in(&merged));
        let again = conflicting.merged_into(&merged, "T2");
        assert_eq!(again[4]["status"], "True");
        assert_eq!(again[4]["reason"], "cidr_overlap");
        assert_eq!(again[4]["message"], "overlaps");
        assert_eq!(again[4]["lastTransitionTime"], "T2");
        assert_eq!(again[2]["lastTransitionTime"], "T1");
        // A new generation alone is a change (observedGeneration).
        let newer = CiliumPoolState {
            generation: Some(4),
            ..state
        };
        assert!(!newer.is_shown_in(&merged));
    }
}
