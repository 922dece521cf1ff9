//! [`manager::Client`] over the Kubernetes API: the pool annotation by a
//! merge patch of `metadata.annotations`; the addresses, the
//! `metallb.io/AddressAssigned` condition and Cilium's
//! `cilium.io/IPAMRequestSatisfied` (docs/cilium.md §3.6) by one strategic
//! merge patch of the status subresource (the Service API declares `type` the merge key of
//! `status.conditions`, so other controllers' conditions stay: a server-side
//! apply would do too, but would make us own the whole ingress list's
//! entries per field manager and cost a managedFields entry per Service);
//! Events through kube-runtime's recorder. Every write first asks the
//! [`LeaderGate`]; a replica that is not leading writes nothing.
//!
//! Events are handed to a task of their own that publishes them one at a
//! time, in order: the manager's worker does not wait for an Event's round
//! trip before the next Service (Events are informative, as client-go's
//! asynchronous recorder treats them). Their failures are logged and counted
//! in `kube_watcher_event_errors_total`.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Reporter};
use kube::Resource;
use manager::{
    pool_annotation, CiliumConditionChange, Client, ClientError, ConditionKind, Event, EventType,
    ServiceCondition, ServiceWrite, Store, CILIUM_CONDITION_TYPE, CONDITION_TYPE, POOL_ANNOTATION,
};
use serde_json::{json, Value};

use crate::lease::LeaderGate;
use crate::store::{split_key, KubeStore};

/// The field manager of every patch.
pub(crate) const FIELD_MANAGER: &str = "kube-watcher";

/// The `action` of every Event (events.k8s.io requires one).
pub(crate) const EVENT_ACTION: &str = "AllocateLoadBalancerIP";

/// How many times a write that got 409 Conflict is tried in all, before the
/// manager's own backoff takes over.
pub(crate) const CONFLICT_ATTEMPTS: u32 = 3;

/// How long a write waits for the cache to show it.
pub(crate) const READ_YOUR_WRITES: Duration = Duration::from_secs(2);

/// How many Events may wait for the publishing task before the worker
/// waits too.
pub(crate) const EVENT_QUEUE: usize = 4096;

/// How many Events are queued or being published. Cheap to clone; every
/// clone is the same count.
#[derive(Clone, Debug)]
pub(crate) struct EventBacklog(Arc<tokio::sync::watch::Sender<usize>>);

impl Default for EventBacklog {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(0)))
    }
}

impl EventBacklog {
    fn add(&self) {
        self.0.send_modify(|n| *n = n.saturating_add(1));
    }

    fn done(&self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Resolves once every queued Event was published (or dropped).
    pub(crate) async fn drained(&self) {
        let mut count = self.0.subscribe();
        // The sender lives in `self`, so this cannot fail.
        let _ = count.wait_for(|n| *n == 0).await;
    }
}

/// An Event on its way to the API server.
struct QueuedEvent {
    key: String,
    reference: ObjectReference,
    event: KubeEvent,
}

/// The client the controller writes through.
pub(crate) struct KubeClient {
    client: kube::Client,
    store: KubeStore,
    gate: LeaderGate,
    reporter: Reporter,
    conflict_delay: Duration,
    events: tokio::sync::mpsc::Sender<QueuedEvent>,
    backlog: EventBacklog,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

/// The merge patch that sets (or, with `None`, removes) the pool annotation.
pub(crate) fn annotation_patch(pool: Option<&str>) -> Value {
    json!({"metadata": {"annotations": {POOL_ANNOTATION: pool}}})
}

/// What a status patch does to our condition.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ConditionChange {
    /// Leave `status.conditions` out of the patch.
    Keep,
    /// Set ours (merged on `type`: other conditions stay).
    Set(Condition),
    /// Remove ours (a `$patch: delete` directive on `type`).
    Remove,
}

/// The strategic merge patch of the status subresource that sets the
/// ingress addresses (`None`: left out; empty: the list removed) and our
/// condition. `status.loadBalancer.ingress` has no merge key, so the list
/// given replaces the one stored; `status.conditions` merges on `type`.
#[cfg(test)]
fn status_patch(ingress: Option<&[IpAddr]>, condition: &ConditionChange) -> Value {
    service_status_patch(ingress, &[(CONDITION_TYPE, condition)])
}

/// The status patch with the change of each condition type given: every
/// `Set` and `Remove` goes into one `status.conditions` list, merged on
/// `type`, so a patch sets `metallb.io/AddressAssigned` and
/// `cilium.io/IPAMRequestSatisfied` at once and leaves other types alone.
pub(crate) fn service_status_patch(
    ingress: Option<&[IpAddr]>,
    conditions: &[(&str, &ConditionChange)],
) -> Value {
    let mut status = serde_json::Map::new();
    if let Some(ingress) = ingress {
        let list: Option<Vec<Value>> = (!ingress.is_empty()).then(|| {
            ingress
                .iter()
                .map(|ip| json!({"ip": ip.to_string()}))
                .collect()
        });
        status.insert("loadBalancer".to_owned(), json!({"ingress": list}));
    }
    let list: Vec<Value> = conditions
        .iter()
        .filter_map(|(type_, change)| match change {
            ConditionChange::Keep => None,
            ConditionChange::Set(condition) => {
                let mut value = serde_json::to_value(condition).unwrap_or(Value::Null);
                // A real Service has no `metadata.generation`, so ours has no
                // observedGeneration; a merge patch keeps a field it is not
                // given, so one another writer left is removed by name.
                if let (None, Value::Object(fields)) = (condition.observed_generation, &mut value) {
                    fields.insert("observedGeneration".to_owned(), Value::Null);
                }
                Some(value)
            }
            ConditionChange::Remove => Some(json!({"type": type_, "$patch": "delete"})),
        })
        .collect();
    if !list.is_empty() {
        status.insert("conditions".to_owned(), Value::Array(list));
    }
    json!({ "status": status })
}

/// What the status patch must do to Cilium's condition for `wanted`, given
/// the cached `current` Service (see [`condition_change`]).
pub(crate) fn cilium_condition_change(
    current: Option<&Service>,
    wanted: &CiliumConditionChange,
    now: &Time,
) -> ConditionChange {
    match wanted {
        CiliumConditionChange::Keep => ConditionChange::Keep,
        CiliumConditionChange::Set(condition) => {
            condition_change(current, ConditionKind::Cilium, Some(condition), now)
        }
        CiliumConditionChange::Remove => {
            condition_change(current, ConditionKind::Cilium, None, now)
        }
    }
}

/// What the status patch must do to the condition of `kind` for `wanted`
/// (`None`: remove it), given the cached `current` Service: nothing while
/// the Service shows it ([`ServiceCondition::is_shown`]), else the merged
/// condition, its `lastTransitionTime` kept while the status is unchanged,
/// else `now` ([`ServiceCondition::merge_into`]).
pub(crate) fn condition_change(
    current: Option<&Service>,
    kind: ConditionKind,
    wanted: Option<&ServiceCondition>,
    now: &Time,
) -> ConditionChange {
    let shown = current.and_then(|service| kind.find(service));
    match wanted {
        Some(condition) if current.is_some_and(|service| condition.is_shown(service)) => {
            ConditionChange::Keep
        }
        Some(condition) => {
            let mut conditions: Vec<Condition> = shown.cloned().into_iter().collect();
            condition.merge_into(&mut conditions, now);
            conditions
                .into_iter()
                .next()
                .map_or(ConditionChange::Keep, ConditionChange::Set)
        }
        // With no cached object, the removal is sent anyway.
        None if shown.is_some() || current.is_none() => ConditionChange::Remove,
        None => ConditionChange::Keep,
    }
}

impl KubeClient {
    /// A client writing through `client`, reading current objects from
    /// `store`, allowed to write while `gate` is open; Events name
    /// `reporter` as their source, their failures are counted in
    /// `event_errors` and the ones not yet published in `backlog`. Starts
    /// the Event task on the current runtime; it ends once the client is
    /// dropped and the queue is drained.
    pub(crate) fn new(
        client: kube::Client,
        store: KubeStore,
        gate: LeaderGate,
        reporter: Reporter,
        event_errors: Arc<AtomicU64>,
        backlog: EventBacklog,
    ) -> Self {
        let (events, queue) = tokio::sync::mpsc::channel(EVENT_QUEUE);
        tokio::spawn(publish_events(
            queue,
            client.clone(),
            gate.clone(),
            reporter.clone(),
            event_errors,
            backlog.clone(),
        ));
        Self {
            client,
            store,
            gate,
            reporter,
            conflict_delay: Duration::from_millis(50),
            events,
            backlog,
        }
    }

    fn check_gate(&self, key: &str) -> Result<(), ClientError> {
        if self.gate.is_open() {
            Ok(())
        } else {
            Err(ClientError::Failed {
                key: key.to_owned(),
                message: "not the leader: writes are refused".to_owned(),
            })
        }
    }

    /// Sends one patch, trying again after a 409 Conflict: of the object a
    /// merge patch, of its status a strategic merge patch (see
    /// `service_status_patch`).
    async fn patch(
        &self,
        api: &Api<Service>,
        key: &str,
        name: &str,
        body: &Value,
        status: bool,
    ) -> Result<(), ClientError> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.check_gate(key)?;
            let result = if status {
                api.patch_status(name, &params, &Patch::Strategic(body))
                    .await
            } else {
                api.patch(name, &params, &Patch::Merge(body)).await
            };
            match result {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(error)) if error.code == 409 => {
                    if attempt >= CONFLICT_ATTEMPTS {
                        return Err(ClientError::Conflict {
                            key: key.to_owned(),
                            message: error.message,
                        });
                    }
                    tracing::debug!(key, attempt, "conflict; trying again");
                    tokio::time::sleep(self.conflict_delay).await;
                }
                Err(kube::Error::Api(error)) if error.code == 404 => {
                    return Err(ClientError::NotFound {
                        key: key.to_owned(),
                    });
                }
                Err(error) => {
                    return Err(ClientError::Failed {
                        key: key.to_owned(),
                        message: error.to_string(),
                    })
                }
            }
        }
    }

    fn reference(&self, key: &str, namespace: &str, name: &str) -> ObjectReference {
        match self.store.service(key) {
            Some(service) => service.object_ref(&()),
            None => ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Service".to_owned()),
                namespace: Some(namespace.to_owned()),
                name: Some(name.to_owned()),
                ..ObjectReference::default()
            },
        }
    }
}

fn bad_key(key: &str) -> ClientError {
    ClientError::Failed {
        key: key.to_owned(),
        message: "not a namespace/name key".to_owned(),
    }
}

#[async_trait]
impl Client for KubeClient {
    async fn write_service(&self, key: &str, write: &ServiceWrite) -> Result<(), ClientError> {
        self.check_gate(key)?;
        let (namespace, name) = split_key(key).ok_or_else(|| bad_key(key))?;
        let api: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        let current = self.store.service(key);
        let wanted: Vec<String> = write.ingress.iter().map(ToString::to_string).collect();
        // Only the parts that differ from the cached object are sent; with
        // no cached object (it went away meanwhile), both.
        let annotation_differs = current
            .as_deref()
            .is_none_or(|service| pool_annotation(service) != write.pool.as_deref());
        let ingress_differs = current
            .as_deref()
            .is_none_or(|service| manager::status_ips(service) != wanted);
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let condition = condition_change(
            current.as_deref(),
            ConditionKind::Assigned,
            write.condition.as_ref(),
            &now,
        );
        let cilium = cilium_condition_change(current.as_deref(), &write.cilium_condition, &now);
        // Status first: if the annotation write then fails (or the process
        // stops), the status, which is the truth about what a Service holds,
        // is already right, and the retry only adds the annotation.
        if ingress_differs || condition != ConditionChange::Keep || cilium != ConditionChange::Keep
        {
            let ingress = ingress_differs.then_some(write.ingress.as_slice());
            let body = service_status_patch(
                ingress,
                &[
                    (CONDITION_TYPE, &condition),
                    (CILIUM_CONDITION_TYPE, &cilium),
                ],
            );
            self.patch(&api, key, name, &body, true).await?;
        }
        if annotation_differs {
            let body = annotation_patch(write.pool.as_deref());
            self.patch(&api, key, name, &body, false).await?;
        }
        // Read your writes: the controller decides from the cache, so it
        // must not see the Service as it was before this write (it would
        // take the missing status for a lost one and allocate again).
        let shown = self
            .store
            .wait_for_service(key, READ_YOUR_WRITES, |service| {
                service.is_none_or(|service| {
                    manager::status_ips(service) == wanted
                        && pool_annotation(service) == write.pool.as_deref()
                        && ConditionKind::Assigned.shown(service) == write.condition
                        && write.cilium_condition.is_shown(service)
                })
            })
            .await;
        if !shown {
            tracing::debug!(key, "the cache does not show the write yet");
        }
        tracing::debug!(key, ?write, "written");
        Ok(())
    }

    async fn emit_event(&self, key: &str, event: &Event) -> Result<(), ClientError> {
        self.check_gate(key)?;
        let (namespace, name) = split_key(key).ok_or_else(|| bad_key(key))?;
        let reference = self.reference(key, namespace, name);
        let kube_event = KubeEvent {
            type_: match event.event_type {
                EventType::Normal => KubeEventType::Normal,
                EventType::Warning => KubeEventType::Warning,
            },
            reason: event.reason.clone(),
            note: Some(event.message.clone()),
            action: EVENT_ACTION.to_owned(),
            secondary: None,
        };
        self.backlog.add();
        let sent = self
            .events
            .send(QueuedEvent {
                key: key.to_owned(),
                reference,
                event: kube_event,
            })
            .await;
        sent.map_err(|_| {
            self.backlog.done();
            ClientError::Failed {
                key: key.to_owned(),
                message: "the Event task has stopped".to_owned(),
            }
        })
    }
}

/// Publishes queued Events in order while the gate is open; counts and
/// logs the ones that fail (dropped: Events are not retried).
async fn publish_events(
    mut queue: tokio::sync::mpsc::Receiver<QueuedEvent>,
    client: kube::Client,
    gate: LeaderGate,
    reporter: Reporter,
    errors: Arc<AtomicU64>,
    backlog: EventBacklog,
) {
    while let Some(queued) = queue.recv().await {
        publish(&queued, &client, &gate, &reporter, &errors).await;
        backlog.done();
    }
}

async fn publish(
    queued: &QueuedEvent,
    client: &kube::Client,
    gate: &LeaderGate,
    reporter: &Reporter,
    errors: &AtomicU64,
) {
    if !gate.is_open() {
        tracing::debug!(key = %queued.key, "not the leader: Event dropped");
        return;
    }
    if let Err(error) =
        crate::events::publish(client, reporter, &queued.event, &queued.reference).await
    {
        errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            key = %queued.key,
            reason = %queued.event.reason,
            %error,
            "could not emit an Event"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_touch_only_our_fields() {
        assert_eq!(
            annotation_patch(Some("default")),
            json!({"metadata": {"annotations": {"metallb.io/ip-allocated-from-pool": "default"}}})
        );
        assert_eq!(
            annotation_patch(None),
            json!({"metadata": {"annotations": {"metallb.io/ip-allocated-from-pool": null}}})
        );
        let ips: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        assert_eq!(
            status_patch(Some(&ips), &ConditionChange::Keep),
            json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}}})
        );
        assert_eq!(
            status_patch(Some(&[]), &ConditionChange::Remove),
            json!({"status": {"loadBalancer": {"ingress": null},
                   "conditions": [{"type": "metallb.io/AddressAssigned", "$patch": "delete"}]}})
        );
    }

    fn condition(assigned: bool, reason: &str) -> ServiceCondition {
        ServiceCondition {
            kind: ConditionKind::Assigned,
            status: assigned,
            reason: reason.to_owned(),
            message: format!("{reason}!"),
            observed_generation: Some(2),
        }
    }

    fn time(text: &str) -> Time {
        Time(text.parse().unwrap())
    }

    fn showing(conditions: Value) -> Service {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns"},
                                      "status": {"conditions": conditions}}))
        .unwrap()
    }

    #[test]
    fn the_condition_keeps_its_transition_time_while_its_status_stays() {
        let now = time("2026-01-02T00:00:00Z");
        let service = showing(json!([
            {"type": "other.io/Ready", "status": "True", "reason": "R", "message": "",
             "lastTransitionTime": "2020-01-01T00:00:00Z"},
            {"type": CONDITION_TYPE, "status": "False", "reason": "PoolExhausted",
             "message": "PoolExhausted!", "observedGeneration": 2,
             "lastTransitionTime": "2025-01-01T00:00:00Z"}
        ]));
        let ours = |service: &Service, wanted: Option<&ServiceCondition>| {
            condition_change(Some(service), ConditionKind::Assigned, wanted, &now)
        };
        // Unchanged: nothing to write.
        let same = condition(false, "PoolExhausted");
        assert_eq!(ours(&service, Some(&same)), ConditionChange::Keep);
        // Another reason, same status: the time stays.
        let ConditionChange::Set(set) = ours(&service, Some(&condition(false, "NoPoolServes")))
        else {
            panic!("a write")
        };
        assert_eq!(set.reason, "NoPoolServes");
        assert_eq!(set.last_transition_time, time("2025-01-01T00:00:00Z"));
        // Another status: now.
        let ConditionChange::Set(set) = ours(&service, Some(&condition(true, "Assigned"))) else {
            panic!("a write")
        };
        assert_eq!(
            (set.status.as_str(), set.last_transition_time),
            ("True", now.clone())
        );
        // Removed, only when shown.
        assert_eq!(ours(&service, None), ConditionChange::Remove);
        assert_eq!(ours(&showing(json!([])), None), ConditionChange::Keep);
    }

    fn cilium(satisfied: bool, reason: &str) -> ServiceCondition {
        ServiceCondition {
            kind: ConditionKind::Cilium,
            status: satisfied,
            reason: reason.to_owned(),
            message: format!("{reason}!"),
            observed_generation: Some(2),
        }
    }

    #[test]
    fn a_condition_without_a_generation_removes_the_stored_one() {
        // A real Service has no metadata.generation; a stored condition may
        // still carry an observedGeneration another writer left.
        let service = showing(json!([
            {"type": CONDITION_TYPE, "status": "True", "reason": "Assigned",
             "message": "Assigned!", "observedGeneration": 3,
             "lastTransitionTime": "2025-01-01T00:00:00Z"}
        ]));
        let wanted = ServiceCondition {
            observed_generation: None,
            ..condition(true, "Assigned")
        };
        assert!(!wanted.is_shown(&service));
        let now = time("2026-01-02T00:00:00Z");
        let change = condition_change(Some(&service), ConditionKind::Assigned, Some(&wanted), &now);
        let patch = status_patch(None, &change);
        assert_eq!(
            patch["status"]["conditions"][0]["observedGeneration"],
            Value::Null
        );
        assert!(patch["status"]["conditions"][0]
            .as_object()
            .unwrap()
            .contains_key("observedGeneration"));
        // With a generation, it is written as usual.
        let ConditionChange::Set(set) = condition_change(
            Some(&service),
            ConditionKind::Assigned,
            Some(&condition(true, "Assigned")),
            &now,
        ) else {
            panic!("a write")
        };
        assert_eq!(set.observed_generation, Some(2));
    }

    #[test]
    fn one_status_patch_sets_both_conditions_merged_on_type() {
        let now = time("2026-01-02T00:00:00Z");
        let service = showing(json!([
            {"type": CILIUM_CONDITION_TYPE, "status": "False", "reason": "no_pool",
             "message": "no_pool!", "observedGeneration": 1,
             "lastTransitionTime": "2025-01-01T00:00:00Z"}
        ]));
        let ours = condition_change(
            Some(&service),
            ConditionKind::Assigned,
            Some(&condition(true, "Assigned")),
            &now,
        );
        let theirs = cilium_condition_change(
            Some(&service),
            &CiliumConditionChange::Set(cilium(true, "satisfied")),
            &now,
        );
        let ips: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap()];
        let patch = service_status_patch(
            Some(&ips),
            &[(CONDITION_TYPE, &ours), (CILIUM_CONDITION_TYPE, &theirs)],
        );
        assert_eq!(
            patch["status"]["conditions"],
            json!([
                {"type": CONDITION_TYPE, "status": "True", "reason": "Assigned",
                 "message": "Assigned!", "observedGeneration": 2,
                 "lastTransitionTime": "2026-01-02T00:00:00Z"},
                {"type": CILIUM_CONDITION_TYPE, "status": "True", "reason": "satisfied",
                 "message": "satisfied!", "observedGeneration": 2,
                 "lastTransitionTime": "2026-01-02T00:00:00Z"}
            ])
        );
        // Shown already (observedGeneration aside): nothing to write.
        let shown = showing(json!([
            {"type": CILIUM_CONDITION_TYPE, "status": "True", "reason": "satisfied",
             "message": "satisfied!", "observedGeneration": 1,
             "lastTransitionTime": "2025-01-01T00:00:00Z"}
        ]));
        let set = CiliumConditionChange::Set(cilium(true, "satisfied"));
        assert_eq!(
            cilium_condition_change(Some(&shown), &set, &now),
            ConditionChange::Keep
        );
        assert!(set.is_shown(&shown));
        // Removed only when shown; kept when the write leaves it.
        assert_eq!(
            cilium_condition_change(Some(&shown), &CiliumConditionChange::Remove, &now),
            ConditionChange::Remove
        );
        assert_eq!(
            cilium_condition_change(
                Some(&showing(json!([]))),
                &CiliumConditionChange::Remove,
                &now
            ),
            ConditionChange::Keep
        );
        assert_eq!(
            cilium_condition_change(Some(&shown), &CiliumConditionChange::Keep, &now),
            ConditionChange::Keep
        );
        assert_eq!(
            service_status_patch(
                None,
                &[
                    (CONDITION_TYPE, &ConditionChange::Keep),
                    (CILIUM_CONDITION_TYPE, &ConditionChange::Remove)
                ]
            ),
            json!({"status": {"conditions": [{"type": CILIUM_CONDITION_TYPE, "$patch": "delete"}]}})
        );
    }
}
