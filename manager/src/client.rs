//! What the controller writes: a Service's status and pool annotation, and
//! Kubernetes Events. The host implements [`Client`] over its API.

use std::fmt;
use std::net::IpAddr;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The annotation that names the pool a Service's addresses came from.
pub const POOL_ANNOTATION: &str = "metallb.io/ip-allocated-from-pool";

/// The [`POOL_ANNOTATION`] the Service shows, if any.
pub fn pool_annotation(service: &Service) -> Option<&str> {
    service
        .metadata
        .annotations
        .as_ref()?
        .get(POOL_ANNOTATION)
        .map(String::as_str)
}

/// `status.loadBalancer.ingress[].ip` of a Service, in order (an entry
/// without an `ip` is left out; an empty one is kept, as written).
pub fn status_ips(service: &Service) -> Vec<String> {
    service
        .status
        .as_ref()
        .and_then(|status| status.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ingress| ingress.iter().filter_map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

/// The type of the controller's condition in a Service's
/// `status.conditions` (docs/allocation.md §4.7).
pub const CONDITION_TYPE: &str = "metallb.io/AddressAssigned";

/// The type of Cilium's LB-IPAM condition, which the controller writes
/// beside its own while a `CiliumLoadBalancerIPPool` exists
/// (docs/cilium.md §3.6).
pub const CILIUM_CONDITION_TYPE: &str = "cilium.io/IPAMRequestSatisfied";

/// The fields of a Service that the controller owns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceWrite {
    /// `status.loadBalancer.ingress[].ip`, IPv4 first; empty clears it.
    pub ingress: Vec<IpAddr>,
    /// The `metallb.io/ip-allocated-from-pool` annotation; `None` removes it.
    pub pool: Option<String>,
    /// The [`CONDITION_TYPE`] condition; `None` removes it (a Service the
    /// controller stopped handling). Other conditions are left as they are.
    pub condition: Option<ServiceCondition>,
    /// What to do with the [`CILIUM_CONDITION_TYPE`] condition.
    pub cilium_condition: CiliumConditionChange,
}

impl ServiceWrite {
    /// `conditions` with both of the controller's conditions merged in
    /// (see [`ServiceCondition::merge_into`]), the others kept in place.
    pub fn merge_conditions(&self, conditions: &mut Vec<Condition>, now: &Time) {
        match &self.condition {
            Some(condition) => condition.merge_into(conditions, now),
            None => ConditionKind::Assigned.remove_from(conditions),
        }
        match &self.cilium_condition {
            CiliumConditionChange::Keep => {}
            CiliumConditionChange::Set(condition) => condition.merge_into(conditions, now),
            CiliumConditionChange::Remove => ConditionKind::Cilium.remove_from(conditions),
        }
    }
}

/// What a write does to Cilium's condition: it is only ours to write while
/// a Cilium pool exists (docs/cilium.md §3.6).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CiliumConditionChange {
    /// Leave it as the Service shows it (or does not).
    #[default]
    Keep,
    Set(ServiceCondition),
    /// Remove it (a Service the controller stopped handling).
    Remove,
}

impl CiliumConditionChange {
    /// Whether `service` shows Cilium's condition as this change leaves it.
    pub fn is_shown(&self, service: &Service) -> bool {
        match self {
            CiliumConditionChange::Keep => true,
            CiliumConditionChange::Set(condition) => condition.is_shown(service),
            CiliumConditionChange::Remove => ConditionKind::Cilium.find(service).is_none(),
        }
    }
}

/// The two conditions the controller writes on a Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionKind {
    /// Ours, [`CONDITION_TYPE`]: True when the Service holds addresses,
    /// else a stable CamelCase reason and the Event's message.
    Assigned,
    /// Cilium's [`CILIUM_CONDITION_TYPE`]: True when every requested
    /// address or family is held, else one of Cilium's reasons
    /// (`no_pool`, ...) and messages.
    Cilium,
}

impl ConditionKind {
    /// The condition's `type`.
    pub fn condition_type(self) -> &'static str {
        match self {
            ConditionKind::Assigned => CONDITION_TYPE,
            ConditionKind::Cilium => CILIUM_CONDITION_TYPE,
        }
    }

    /// The Kubernetes condition of this kind on `service`, whole (with its
    /// `lastTransitionTime`).
    pub fn find(self, service: &Service) -> Option<&Condition> {
        let type_ = self.condition_type();
        service
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == type_)
    }

    /// The condition of this kind as the Service `service` shows it, if it
    /// does.
    pub fn shown(self, service: &Service) -> Option<ServiceCondition> {
        let shown = self.find(service)?;
        Some(ServiceCondition {
            kind: self,
            status: shown.status == "True",
            reason: shown.reason.clone(),
            message: shown.message.clone(),
            observed_generation: shown.observed_generation,
        })
    }

    /// `conditions` without the one of this kind, the others kept in place.
    pub fn remove_from(self, conditions: &mut Vec<Condition>) {
        let type_ = self.condition_type();
        if let Some(at) = conditions.iter().position(|c| c.type_ == type_) {
            conditions.remove(at);
        }
    }
}

/// One of the controller's conditions on a Service (docs/allocation.md
/// §4.7, docs/cilium.md §3.6). The host sets `lastTransitionTime`: kept
/// while `status` stays the same, now when it changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceCondition {
    pub kind: ConditionKind,
    /// `status: "True"`: the Service holds addresses (all it asked for,
    /// for Cilium's).
    pub status: bool,
    pub reason: String,
    pub message: String,
    /// The `metadata.generation` the decision saw.
    pub observed_generation: Option<i64>,
}

impl ServiceCondition {
    /// `"True"` or `"False"`, as Kubernetes writes a condition's status.
    pub fn status(&self) -> &'static str {
        if self.status {
            "True"
        } else {
            "False"
        }
    }

    /// Whether `service` shows exactly this condition (no write would
    /// change it), up to `lastTransitionTime`, and for Cilium's up to
    /// `observedGeneration` too: Cilium itself leaves it behind on a
    /// satisfied Service (docs/cilium.md §3.6).
    pub fn is_shown(&self, service: &Service) -> bool {
        // Compared in place: this runs on every echo of a write.
        self.kind.find(service).is_some_and(|shown| {
            shown.status == self.status()
                && shown.reason == self.reason
                && shown.message == self.message
                && (self.kind == ConditionKind::Cilium
                    || shown.observed_generation == self.observed_generation)
        })
    }

    /// `conditions` with the one of this kind set to this condition, the
    /// others kept in place: `lastTransitionTime` stays while the status
    /// does, else it is `now` (`meta.SetStatusCondition`'s rule).
    pub fn merge_into(&self, conditions: &mut Vec<Condition>, now: &Time) {
        let type_ = self.kind.condition_type();
        let status = self.status();
        let at = conditions.iter().position(|c| c.type_ == type_);
        let last_transition_time = match at.and_then(|at| conditions.get(at)) {
            Some(previous) if previous.status == status => previous.last_transition_time.clone(),
            _ => now.clone(),
        };
        let new = Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: self.reason.clone(),
            message: self.message.clone(),
            observed_generation: self.observed_generation,
            last_transition_time,
        };
        match at.and_then(|at| conditions.get_mut(at)) {
            Some(slot) => *slot = new,
            None => conditions.push(new),
        }
    }
}

/// `Normal` or `Warning`, as Kubernetes Events have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    /// The name Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Kubernetes Event about one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub event_type: EventType,
    /// CamelCase reason, e.g. `IPAllocated`.
    pub reason: String,
    pub message: String,
}

/// The longest Event note written, in bytes: an API server refuses larger
/// ones (events.k8s.io/v1 caps `note` at 1 kB), and a pathological
/// annotation or pool address must not make one.
pub const MAX_EVENT_NOTE: usize = 1024;

/// `note` cut to [`MAX_EVENT_NOTE`] bytes (see [`capped`]).
pub fn capped_note(note: String) -> String {
    capped(note, MAX_EVENT_NOTE)
}

/// `text` cut to at most `max` bytes at a character boundary, ending in `…`
/// when cut: API servers refuse fields over their limit, and a message
/// built from user input must not make one.
pub fn capped(mut text: String, max: usize) -> String {
    if text.len() > max {
        let end = truncated(&text, max.saturating_sub('…'.len_utf8())).len();
        text.truncate(end);
        text.push('…');
    }
    text
}

/// The longest start of `text` of at most `max` bytes, cut at a character
/// boundary and marked by nothing: for fields whose syntax a mark would
/// break (an object name).
pub fn truncated(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// A write the host could not make.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The object changed under the write (HTTP 409): retry with a fresh read.
    #[error("conflict writing {key}: {message}")]
    Conflict { key: String, message: String },
    /// The object is gone.
    #[error("{key} not found")]
    NotFound { key: String },
    /// Anything else the host reports.
    #[error("writing {key} failed: {message}")]
    Failed { key: String, message: String },
}

/// Writes Service status and annotations, and emits Events.
#[async_trait]
pub trait Client: Send + Sync + 'static {
    /// Sets `status.loadBalancer.ingress`, the pool annotation and the
    /// controller's condition of the Service `key` (`namespace/name`),
    /// touching nothing else (other conditions stay, see
    /// [`ServiceCondition::merge_into`]).
    async fn write_service(&self, key: &str, write: &ServiceWrite) -> Result<(), ClientError>;
    /// Emits an Event on the Service `key`.
    async fn emit_event(&self, key: &str, event: &Event) -> Result<(), ClientError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap_or_default())
    }

    fn cilium(satisfied: bool, reason: &str) -> ServiceCondition {
        ServiceCondition {
            kind: ConditionKind::Cilium,
            status: satisfied,
            reason: reason.to_owned(),
            message: String::new(),
            observed_generation: Some(2),
        }
    }

    fn types(conditions: &[Condition]) -> Vec<&str> {
        conditions.iter().map(|c| c.type_.as_str()).collect()
    }

    #[test]
    fn both_conditions_merge_on_their_type_and_keep_the_others() {
        let other = Condition {
            type_: "example.com/Ready".to_owned(),
            status: "True".to_owned(),
            reason: "Ok".to_owned(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: time(1),
        };
        let mut conditions = vec![other];
        let set = ServiceWrite {
            cilium_condition: CiliumConditionChange::Set(cilium(false, "no_pool")),
            ..ServiceWrite::default()
        };
        set.merge_conditions(&mut conditions, &time(10));
        assert_eq!(
            types(&conditions),
            ["example.com/Ready", CILIUM_CONDITION_TYPE]
        );
        // Same status: the transition time stays; another status: now.
        let again = ServiceWrite {
            cilium_condition: CiliumConditionChange::Set(cilium(false, "out_of_ips")),
            ..ServiceWrite::default()
        };
        again.merge_conditions(&mut conditions, &time(20));
        let shown = |c: &[Condition]| {
            c.iter()
                .find(|c| c.type_ == CILIUM_CONDITION_TYPE)
                .map(|c| (c.reason.clone(), c.last_transition_time.clone()))
        };
        assert_eq!(shown(&conditions), Some(("out_of_ips".into(), time(10))));
        let satisfied = ServiceWrite {
            cilium_condition: CiliumConditionChange::Set(cilium(true, "satisfied")),
            ..ServiceWrite::default()
        };
        satisfied.merge_conditions(&mut conditions, &time(30));
        assert_eq!(shown(&conditions), Some(("satisfied".into(), time(30))));
        // Keep leaves it; Remove takes only it away.
        ServiceWrite::default().merge_conditions(&mut conditions, &time(40));
        assert_eq!(
            types(&conditions),
            ["example.com/Ready", CILIUM_CONDITION_TYPE]
        );
        let remove = ServiceWrite {
            cilium_condition: CiliumConditionChange::Remove,
            ..ServiceWrite::default()
        };
        remove.merge_conditions(&mut conditions, &time(50));
        assert_eq!(types(&conditions), ["example.com/Ready"]);
    }
}
