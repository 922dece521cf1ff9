//! Pool status as MetalLB v0.15 writes it (`status.assignedIPv4` …),
//! from `AllocatingController::pool_stats()`, at most once per period (one
//! second) per pool, and only what changed.

use std::collections::HashMap;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use manager::AllocatingController;
use serde_json::json;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::client::FIELD_MANAGER;
use crate::crd::{IPAddressPoolResource, IPAddressPoolStatus};
use crate::lease::LeaderGate;
use crate::store::KubeStore;

/// How often pool statuses are brought up to date.
pub const POOL_STATUS_PERIOD: Duration = Duration::from_secs(1);

/// Writes pool statuses for one leadership term.
pub struct PoolStatusWriter {
    client: kube::Client,
    store: KubeStore,
    gate: LeaderGate,
    /// What was last written, by (namespace, name).
    written: HashMap<(String, String), IPAddressPoolStatus>,
}

impl std::fmt::Debug for PoolStatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolStatusWriter")
            .field("written", &self.written.len())
            .finish_non_exhaustive()
    }
}

impl PoolStatusWriter {
    /// A writer through `client`, reading pool objects from `store`,
    /// allowed to write while `gate` is open.
    pub fn new(client: kube::Client, store: KubeStore, gate: LeaderGate) -> Self {
        Self {
            client,
            store,
            gate,
            written: HashMap::new(),
        }
    }

    /// Writes the status of every accepted pool whose counters differ from
    /// its object's status (and from what this writer last wrote); returns
    /// how many were written.
    pub async fn update(&mut self, controller: &AllocatingController) -> usize {
        let mut count = 0;
        for stats in controller.pool_stats() {
            if !self.gate.is_open() {
                break;
            }
            let Some(pool) = self.store.pool_resource(&stats.name) else {
                continue;
            };
            let Some(namespace) = pool.metadata.namespace.clone() else {
                continue;
            };
            let status = IPAddressPoolStatus::from_stats(&stats);
            let id = (namespace, stats.name.clone());
            if pool.status.as_ref() == Some(&status) || self.written.get(&id) == Some(&status) {
                continue;
            }
            let api: Api<IPAddressPoolResource> = Api::namespaced(self.client.clone(), &id.0);
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            };
            let patch = Patch::Merge(json!({"status": status}));
            match api.patch_status(&stats.name, &params, &patch).await {
                Ok(_) => {
                    tracing::debug!(pool = %stats.name, ?status, "pool status written");
                    self.written.insert(id, status);
                    count += 1;
                }
                Err(error) => {
                    tracing::warn!(pool = %stats.name, %error, "could not write pool status");
                }
            }
        }
        count
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
