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

use std::collections::HashMap;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::Resource;
use manager::AllocatingController;
use serde_json::json;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::client::{EVENT_ACTION, FIELD_MANAGER};
use crate::config_state::ConfigStateWriter;
use crate::crd::{IPAddressPoolResource, IPAddressPoolStatus, PoolCondition};
use crate::lease::LeaderGate;
use crate::store::KubeStore;

/// How often pool statuses are brought up to date.
pub const POOL_STATUS_PERIOD: Duration = Duration::from_secs(1);

/// The type of a pool's condition.
pub const ACCEPTED: &str = "Accepted";

/// The reasons of the `Accepted` condition and of the pool's Events.
pub mod reason {
    /// `Accepted` True.
    pub const ACCEPTED: &str = "Accepted";
    /// `Accepted` False: the pool itself is invalid.
    pub const INVALID: &str = "Invalid";
    /// `Accepted` False: it overlaps a pool accepted before it.
    pub const OVERLAP: &str = "Overlap";
    /// The Warning Event of an invalid pool.
    pub const INVALID_POOL: &str = "InvalidPool";
    /// The Warning Event of an overlapping pool.
    pub const OVERLAPPING_POOL: &str = "OverlappingPool";
}

/// The message of an accepted pool's condition.
const ACCEPTED_MESSAGE: &str = "the pool is accepted";

/// The pool a rejection names as overlapped: the allocator says
/// `addresses "…" overlap "…" of pool "NAME"` (a pool's own entries that
/// overlap say `in the same pool`: invalid, not an overlap).
pub fn overlapped_pool(reason: &str) -> Option<&str> {
    let (_, pool) = reason.rsplit_once(" of pool \"")?;
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

/// Writes pool statuses and pool Events for one leadership term.
pub struct PoolStatusWriter {
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
    pub fn new(
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
        }
    }

    /// Also writes MetalLB's `ConfigurationState` in `namespace` (where its
    /// CRD exists).
    #[must_use]
    pub fn configuration_state(mut self, namespace: String) -> Self {
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
    pub async fn update(&mut self, controller: &AllocatingController) -> usize {
        let now = k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let mut wanted: Vec<(String, IPAddressPoolStatus, Option<String>)> = Vec::new();
        for stats in controller.pool_stats() {
            let shown = self.store.pool_resource(&stats.name);
            let mut status = IPAddressPoolStatus::from_stats(&stats);
            let condition = accepted_condition(
                true,
                reason::ACCEPTED,
                ACCEPTED_MESSAGE,
                self.previous(shown.as_deref()),
                &now,
            );
            status.conditions = Some(vec![condition]);
            wanted.push((stats.name, status, None));
        }
        for rejected in controller.rejected_pools() {
            let shown = self.store.pool_resource(&rejected.name);
            let (condition_reason, _) = rejection_reasons(&rejected.reason);
            let condition = accepted_condition(
                false,
                condition_reason,
                &rejected.reason,
                self.previous(shown.as_deref()),
                &now,
            );
            let status = IPAddressPoolStatus {
                conditions: Some(vec![condition]),
                ..IPAddressPoolStatus::default()
            };
            wanted.push((rejected.name, status, Some(rejected.reason)));
        }
        if let Some(config_state) = self.config_state.as_mut() {
            config_state.update(controller).await;
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
                Some(rejection) => self.warn(&pool, &id, &rejection).await,
                None => {
                    self.warned.remove(&id);
                }
            }
            if pool.status.as_ref() == Some(&status) || self.written.get(&id) == Some(&status) {
                continue;
            }
            if self.write(&id, &status).await {
                self.written.insert(id, status);
                count += 1;
            }
        }
        count
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
    async fn write(&self, id: &(String, String), status: &IPAddressPoolStatus) -> bool {
        let api: Api<IPAddressPoolResource> = Api::namespaced(self.client.clone(), &id.0);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let patch = Patch::Merge(json!({ "status": status }));
        match api.patch_status(&id.1, &params, &patch).await {
            Ok(_) => {
                tracing::debug!(pool = %id.1, ?status, "pool status written");
                true
            }
            Err(error) => {
                tracing::warn!(pool = %id.1, %error, "could not write pool status");
                false
            }
        }
    }

    /// A Warning Event on the rejected `pool`, unless this rejection was
    /// warned about already (by this writer, or, as its condition shows, by
    /// an earlier one).
    async fn warn(&mut self, pool: &IPAddressPoolResource, id: &(String, String), reason: &str) {
        if self.warned.get(id).map(String::as_str) == Some(reason) {
            return;
        }
        let shown = pool
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == ACCEPTED && c.status == "False" && c.message == reason)
            });
        if !shown {
            let (_, event_reason) = rejection_reasons(reason);
            let event = KubeEvent {
                type_: EventType::Warning,
                reason: event_reason.to_owned(),
                note: Some(format!("pool {:?} is not used: {reason}", id.1)),
                action: EVENT_ACTION.to_owned(),
                secondary: None,
            };
            let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
            if let Err(error) = recorder.publish(&event, &pool.object_ref(&())).await {
                tracing::warn!(pool = %id.1, %error, "could not emit the pool's Event");
                return;
            }
        }
        self.warned.insert(id.clone(), reason.to_owned());
    }

    /// Updates every `period` until `cancel` fires.
    pub async fn run(
        mut self,
        controller: std::sync::Arc<AllocatingController>,
        period: Duration,
        cancel: CancellationToken,
    ) {
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

    #[test]
    fn an_overlap_names_the_other_pool() {
        let overlap = r#"addresses "10.0.0.0/24" overlap "10.0.0.0-10.0.0.255" of pool "first""#;
        assert_eq!(overlapped_pool(overlap), Some("first"));
        assert_eq!(
            rejection_reasons(overlap),
            (reason::OVERLAP, reason::OVERLAPPING_POOL)
        );
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
}
