//! Publishing one Kubernetes Event (`events.k8s.io/v1`), as kube's
//! `Recorder` does for a new Event, but under a name the API server
//! accepts for any object.
//!
//! kube's recorder names an Event `{object}.{nanoseconds in hex}`, which
//! passes the 253 characters of a DNS subdomain for an object name over
//! about 236 (a pool may have one; a Service's name is at most 63). The
//! server then refuses the Event. Here the object's part is cut to fit.
//! Each of our Events is new (kube's recorder would fold a repeated one
//! into an earlier one and keep its stale note), so nothing of the
//! recorder's series is needed.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use manager::truncated;

/// The longest name of an object (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The longest `reportingInstance` the API server takes (in bytes); ours
/// is the Lease identity, `$POD_NAME_pid` or `--identity`, which may be
/// longer.
const MAX_INSTANCE: usize = 128;

/// Creates `event` about `regarding`, in its namespace (`default` for a
/// cluster-scoped object, as kube's recorder does).
pub(crate) async fn publish(
    client: &kube::Client,
    reporter: &Reporter,
    event: &Event,
    regarding: &ObjectReference,
) -> Result<(), kube::Error> {
    let namespace = regarding.namespace.as_deref().unwrap_or("default");
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), namespace);
    events
        .create(
            &PostParams::default(),
            &build(reporter, event, regarding, Timestamp::now()),
        )
        .await?;
    Ok(())
}

fn build(
    reporter: &Reporter,
    event: &Event,
    regarding: &ObjectReference,
    now: Timestamp,
) -> K8sEvent {
    let object = regarding.name.as_deref().unwrap_or(&reporter.controller);
    K8sEvent {
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        note: event.note.clone(),
        metadata: ObjectMeta {
            namespace: regarding.namespace.clone(),
            name: Some(event_name(object, now.as_nanosecond())),
            ..ObjectMeta::default()
        },
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            truncated(
                reporter.instance.as_deref().unwrap_or(&reporter.controller),
                MAX_INSTANCE,
            )
            .to_owned(),
        ),
        type_: Some(
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .to_owned(),
        ),
        related: event.secondary.clone(),
        ..K8sEvent::default()
    }
}

/// `{object}.{nanos in hex}`, the object's part cut so that the whole is
/// at most [`MAX_NAME`] characters and still a DNS subdomain (no label
/// ending in `-` or `.` where it was cut).
fn event_name(object: &str, nanos: i128) -> String {
    let suffix = format!(".{nanos:x}");
    let head =
        truncated(object, MAX_NAME.saturating_sub(suffix.len())).trim_end_matches(['-', '.']);
    format!("{head}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_a_dns_subdomain_whatever_the_object() {
        let nanos = 0x1874_5f2a_9c3b_1e00_i128;
        assert_eq!(event_name("web", nanos), "web.18745f2a9c3b1e00");
        let long = "a".repeat(253);
        let name = event_name(&long, nanos);
        assert_eq!(name.len(), 253);
        assert!(name.ends_with(".18745f2a9c3b1e00"));
        // Cut where a label ends in '-' or '.': those go too.
        let dashed = format!("{}-.b{}", "a".repeat(234), "c".repeat(17));
        let name = event_name(&dashed, nanos);
        assert_eq!(name, format!("{}.18745f2a9c3b1e00", "a".repeat(234)));
    }

    #[test]
    fn an_event_is_what_kubes_recorder_makes_of_a_new_one() {
        let reporter = Reporter {
            controller: "lb-allocator".into(),
            instance: Some("pod-a".into()),
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "InvalidPool".into(),
            note: Some("bad".into()),
            action: "Allocate".into(),
            secondary: None,
        };
        let regarding = ObjectReference {
            name: Some("green".into()),
            kind: Some("CiliumLoadBalancerIPPool".into()),
            ..ObjectReference::default()
        };
        let now = Timestamp::from_second(1_700_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let built = build(&reporter, &event, &regarding, now);
        let json = serde_json::to_value(&built).unwrap_or_default();
        assert_eq!(json["metadata"]["name"], "green.17979cfe362a0000");
        assert_eq!(json["type"], "Warning");
        assert_eq!(json["reason"], "InvalidPool");
        assert_eq!(json["note"], "bad");
        assert_eq!(json["action"], "Allocate");
        assert_eq!(json["reportingController"], "lb-allocator");
        assert_eq!(json["reportingInstance"], "pod-a");
        assert_eq!(json["regarding"]["name"], "green");
        assert_eq!(json["eventTime"], "2023-11-14T22:13:20.000000Z");
    }

    #[test]
    fn a_long_identity_is_cut_to_the_reporting_instance_limit() {
        let reporter = Reporter {
            controller: "kube-watcher".into(),
            instance: Some(format!("a{}_4242", "é".repeat(100))),
        };
        let event = Event {
            type_: EventType::Normal,
            reason: "IPAllocated".into(),
            note: None,
            action: "Allocate".into(),
            secondary: None,
        };
        let built = build(
            &reporter,
            &event,
            &ObjectReference::default(),
            Timestamp::UNIX_EPOCH,
        );
        let instance = built.reporting_instance.unwrap_or_default();
        // 128 bytes end inside the 64th 'é': the cut moves before it.
        assert_eq!(instance, format!("a{}", "é".repeat(63)));
    }
}
