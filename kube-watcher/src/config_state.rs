//! MetalLB's `ConfigurationState` (`metallb.io/v1beta1`, MetalLB v0.15.3+):
//! the object `controller` in the host's namespace, labelled
//! `metallb.io/component-type: controller`, as MetalLB's controller writes
//! it, says whether the pools are valid: `status.result` `Valid` or
//! `Invalid`, `status.errorSummary` one line per rejected pool, and a
//! `poolReconcilerValid` condition (reason `Reconciled`, or
//! `ConfigurationError` with the summary).
//!
//! Written only where its CRD exists: discovery is asked once per
//! leadership term; without the CRD the writer logs one DEBUG line and
//! stays quiet. The object is read once per term (so a new leader writes
//! nothing when it already shows the result), created when missing, and
//! its status merge-patched when the result or the summary changes. A read
//! or write that fails is tried again with the pool writes' backoff.

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use manager::AllocatingController;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::client::FIELD_MANAGER;
use crate::discovered::discovery_lists;
use crate::lease::LeaderGate;
use crate::pool_status::{Retries, Write};

/// The API group and version of `ConfigurationState`.
pub(crate) const API_VERSION: &str = "metallb.io/v1beta1";
/// The resource's plural, as discovery lists it.
pub(crate) const PLURAL: &str = "configurationstates";
/// The name MetalLB's controller gives its `ConfigurationState`.
pub(crate) const NAME: &str = "controller";
/// The label MetalLB puts on it.
pub(crate) const COMPONENT_LABEL: &str = "metallb.io/component-type";
/// The condition type of MetalLB's pool reconciler.
pub(crate) const CONDITION_TYPE: &str = "poolReconcilerValid";

fn resource() -> ApiResource {
    ApiResource {
        group: "metallb.io".to_owned(),
        version: "v1beta1".to_owned(),
        api_version: API_VERSION.to_owned(),
        kind: "ConfigurationState".to_owned(),
        plural: PLURAL.to_owned(),
    }
}

/// `status.result` and `status.errorSummary` (empty when valid).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub result: String,
    pub error_summary: String,
}

impl Verdict {
    /// The verdict on these rejected pools (name, reason): MetalLB's
    /// object speaks of `IPAddressPool`s only, so Cilium pools are left
    /// out (their conditions speak for them, docs/cilium.md §2.8).
    pub(crate) fn of(rejected: &[allocator::RejectedPool]) -> Self {
        let lines: Vec<String> = rejected
            .iter()
            .filter(|pool| pool.kind == allocator::PoolKind::IPAddressPool)
            .map(|pool| format!("IPAddressPool {:?}: {}", pool.name, pool.reason))
            .collect();
        Self {
            result: if lines.is_empty() { "Valid" } else { "Invalid" }.to_owned(),
            error_summary: lines.join("\n"),
        }
    }

    fn shown(object: &DynamicObject) -> Self {
        let status = object.data.get("status");
        let text = |field: &str| {
            status
                .and_then(|s| s.get(field))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Self {
            result: text("result"),
            error_summary: text("errorSummary"),
        }
    }

    /// The merge patch of the status subresource that shows this verdict.
    pub(crate) fn status_patch(&self, now: &str) -> Value {
        let valid = self.error_summary.is_empty();
        let summary = (!valid).then_some(self.error_summary.as_str());
        json!({"status": {
            "result": self.result,
            "errorSummary": summary,
            "conditions": [{
                "type": CONDITION_TYPE,
                "status": if valid { "True" } else { "False" },
                "reason": if valid { "Reconciled" } else { "ConfigurationError" },
                // A condition's message is at most 32768 bytes
                // (metav1.Condition, as MetalLB's CRD declares it).
                "message": manager::capped(summary.unwrap_or_default().to_owned(), 32_768),
                "lastTransitionTime": now,
            }],
        }})
    }
}

/// Whether the CRD is served, once asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Served {
    Unknown,
    No,
    Yes,
}

/// Writes the `ConfigurationState` for one leadership term.
pub(crate) struct ConfigStateWriter {
    client: kube::Client,
    namespace: String,
    gate: LeaderGate,
    served: Served,
    /// What the object shows (`None`: not read yet this term).
    shown: Option<Verdict>,
    /// A failed read or write, tried again with backoff.
    retries: Retries,
}

impl std::fmt::Debug for ConfigStateWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigStateWriter")
            .field("namespace", &self.namespace)
            .field("served", &self.served)
            .field("shown", &self.shown)
            .finish_non_exhaustive()
    }
}

impl ConfigStateWriter {
    /// A writer of the `ConfigurationState` in `namespace`, allowed to
    /// write while `gate` is open.
    pub(crate) fn new(client: kube::Client, namespace: String, gate: LeaderGate) -> Self {
        Self {
            client,
            namespace,
            gate,
            served: Served::Unknown,
            shown: None,
            retries: Retries::default(),
        }
    }

    /// Brings the object up to date with `controller`'s rejected pools;
    /// returns whether its status was written. `period` is the pool status
    /// writer's: the first retry's delay after a failure.
    pub(crate) async fn update(
        &mut self,
        controller: &AllocatingController,
        period: Duration,
    ) -> bool {
        if !self.gate.is_open() || !self.served().await {
            return false;
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &resource());
        let id = (self.namespace.clone(), NAME.to_owned());
        let at = Instant::now();
        if !self.retries.due(Write::ConfigurationState, &id, at) {
            return false;
        }
        if self.shown.is_none() {
            match self.read_or_create(&api).await {
                Ok(shown) => self.shown = Some(shown),
                Err(error) => {
                    let what = Write::ConfigurationState;
                    self.retries.failed(what, &id, at, period, &error);
                    return false;
                }
            }
        }
        let wanted = Verdict::of(&controller.rejected_pools());
        if self.shown.is_none() || self.shown.as_ref() == Some(&wanted) || !self.gate.is_open() {
            return false;
        }
        let now = k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let patch = Patch::Merge(wanted.status_patch(&now));
        match api.patch_status(NAME, &params, &patch).await {
            Ok(_) => {
                tracing::debug!(result = %wanted.result, "ConfigurationState written");
                self.retries.succeeded(Write::ConfigurationState, &id);
                self.shown = Some(wanted);
                true
            }
            Err(error) => {
                let what = Write::ConfigurationState;
                self.retries.failed(what, &id, at, period, &error);
                // Read again next time (it may have been deleted).
                self.shown = None;
                false
            }
        }
    }

    /// Whether the API serves `configurationstates` (asked once).
    async fn served(&mut self) -> bool {
        if self.served == Served::Unknown {
            self.served = match discovery_lists(&self.client, API_VERSION, PLURAL).await {
                Ok(true) => Served::Yes,
                Ok(false) => {
                    tracing::debug!(
                        "no ConfigurationState CRD (MetalLB v0.15.3+): not writing one"
                    );
                    Served::No
                }
                Err(error) => {
                    tracing::debug!(%error, "no ConfigurationState CRD (MetalLB v0.15.3+): not writing one");
                    Served::No
                }
            };
        }
        self.served == Served::Yes
    }

    /// What the object shows, creating it (empty status) if missing.
    async fn read_or_create(&self, api: &Api<DynamicObject>) -> Result<Verdict, kube::Error> {
        if let Some(object) = api.get_opt(NAME).await? {
            return Ok(Verdict::shown(&object));
        }
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": API_VERSION,
            "kind": "ConfigurationState",
            "metadata": {
                "name": NAME,
                "namespace": self.namespace,
                "labels": {COMPONENT_LABEL: "controller"},
            },
        }))
        .map_err(kube::Error::SerdeError)?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        Ok(Verdict::shown(&api.create(&params, &object).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_lists_each_rejected_pool() {
        assert_eq!(
            Verdict::of(&[]),
            Verdict {
                result: "Valid".to_owned(),
                error_summary: String::new()
            }
        );
        let rejected = [
            allocator::RejectedPool {
                name: "a".to_owned(),
                kind: allocator::PoolKind::IPAddressPool,
                reason: "spec.addresses is empty".to_owned(),
                conflict: None,
            },
            allocator::RejectedPool {
                name: "b".to_owned(),
                kind: allocator::PoolKind::IPAddressPool,
                reason: "bad".to_owned(),
                conflict: None,
            },
            allocator::RejectedPool {
                name: "c".to_owned(),
                kind: allocator::PoolKind::CiliumLoadBalancerIPPool,
                reason: "a Cilium pool's problem".to_owned(),
                conflict: None,
            },
        ];
        let verdict = Verdict::of(&rejected);
        assert_eq!(verdict.result, "Invalid");
        assert_eq!(
            verdict.error_summary,
            "IPAddressPool \"a\": spec.addresses is empty\nIPAddressPool \"b\": bad"
        );
        let patch = verdict.status_patch("T");
        assert_eq!(
            patch["status"]["conditions"][0]["reason"],
            "ConfigurationError"
        );
        assert_eq!(
            Verdict::of(&[]).status_patch("T")["status"]["errorSummary"],
            Value::Null
        );
    }

    #[test]
    fn the_condition_message_stays_within_its_limit() {
        let rejected: Vec<allocator::RejectedPool> = (0..2_000)
            .map(|i| allocator::RejectedPool {
                name: format!("pool-{i}"),
                kind: allocator::PoolKind::IPAddressPool,
                reason: "spec.addresses is empty".to_owned(),
                conflict: None,
            })
            .collect();
        let verdict = Verdict::of(&rejected);
        assert!(verdict.error_summary.len() > 32_768);
        let patch = verdict.status_patch("T");
        let message = patch["status"]["conditions"][0]["message"]
            .as_str()
            .unwrap();
        assert!(message.len() <= 32_768);
        assert!(message.ends_with('…'));
        // The summary itself is whole.
        assert_eq!(
            patch["status"]["errorSummary"],
            verdict.error_summary.as_str()
        );
    }
}
