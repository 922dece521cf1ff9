use std::time::Duration;

use kube_watcher::Host;
use manager::Store;
use serde_json::json;

use crate::support::apiserver_stub::{ApiServerStub, Kind, Recorded};
use crate::support::{
    cluster, config, eventually, ingress, service, settled, LEASE_NAME, LEASE_NAMESPACE,
};

fn service_writes(stub: &ApiServerStub, after: u64) -> Vec<Recorded> {
    stub.requests()
        .into_iter()
        .filter(|r| r.seq > after && r.is_write() && r.path.contains("/services/"))
        .collect()
}

fn object_writes(stub: &ApiServerStub, after: u64) -> Vec<Recorded> {
    stub.requests()
        .into_iter()
        .filter(|r| r.seq > after && r.is_object_write())
        .collect()
}

fn stored_ips(stub: &ApiServerStub, name: &str) -> Vec<String> {
    stub.get(Kind::Service, "ns", name)
        .map(|s| ingress(&s))
        .unwrap_or_default()
}

fn stored_pool(stub: &ApiServerStub, name: &str) -> Option<String> {
    let service = stub.get(Kind::Service, "ns", name)?;
    let pool = &service["metadata"]["annotations"]["metallb.io/ip-allocated-from-pool"];
    pool.as_str().map(str::to_owned)
}

/// Waits until `ns/name` has `ips` in its status and, when it has any, the
/// pool annotation `default`.
async fn wait_for_ips(stub: &ApiServerStub, name: &str, ips: &[&str]) {
    let pool = (!ips.is_empty()).then(|| "default".to_owned());
    stub.wait_until(&format!("ns/{name} has {ips:?} from {pool:?}"), |stub| {
        stored_ips(stub, name) == ips && stored_pool(stub, name) == pool
    })
    .await;
}

/// The first `IPAllocated` Event the server took, once there is one.
async fn first_allocated_event(stub: &ApiServerStub) -> serde_json::Value {
    stub.wait_until("an IPAllocated event", |stub| {
        stub.events().iter().any(|e| e["reason"] == "IPAllocated")
    })
    .await;
    stub.events()
        .into_iter()
        .find(|e| e["reason"] == "IPAllocated")
        .unwrap_or_default()
}

/// A replica whose identity (the Lease holder, `$POD_NAME_pid` or
/// `--identity`) is longer than the 128 characters an Event's
/// `reportingInstance` may have still gets its Events taken: the instance
/// is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_identity_still_gets_its_events() {
    let stub = cluster().await;
    let identity = format!("{}_4242", "lb-".repeat(60));
    let host = Host::start(stub.client("a"), config(&identity));
    wait_for_ips(&stub, "web", &["192.168.10.0"]).await;
    let event = first_allocated_event(&stub).await;
    assert_eq!(event["reportingInstance"], identity[..128]);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocates_with_merge_patches_events_and_pool_status() {
    let stub = cluster().await;
    let host = Host::start(stub.client("a"), config("a"));
    wait_for_ips(&stub, "web", &["192.168.10.0"]).await;

    // Exactly two writes, each a patch of our fields only, the status
    // (with our condition, merged on `type`) first.
    let writes = service_writes(&stub, 0);
    let transition = writes[0].body["status"]["conditions"][0]["lastTransitionTime"].clone();
    assert!(
        transition.as_str().is_some_and(|t| t.ends_with('Z')),
        "{transition}"
    );
    let shown: Vec<(String, String, String, serde_json::Value)> = writes
        .iter()
        .map(|w| {
            (
                w.method.clone(),
                w.path.clone(),
                w.content_type.clone(),
                w.body.clone(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (
                "PATCH".to_owned(),
                "/api/v1/namespaces/ns/services/web/status".to_owned(),
                "application/strategic-merge-patch+json".to_owned(),
                json!({"status": {
                    "loadBalancer": {"ingress": [{"ip": "192.168.10.0"}]},
                    "conditions": [{
                        "type": "metallb.io/AddressAssigned", "status": "True",
                        "reason": "Assigned", "message": "Assigned IP [\"192.168.10.0\"]",
                        // A Service has no generation: none observed,
                        // and any another writer left is removed.
                        "observedGeneration": null, "lastTransitionTime": transition
                    }]
                }}),
            ),
            (
                "PATCH".to_owned(),
                "/api/v1/namespaces/ns/services/web".to_owned(),
                "application/merge-patch+json".to_owned(),
                json!({"metadata": {"annotations": {"metallb.io/ip-allocated-from-pool": "default"}}}),
            ),
        ]
    );
    assert!(writes
        .iter()
        .all(|w| w.query.contains("fieldManager=kube-watcher")));
    assert!(writes.iter().all(|w| w.replica.as_deref() == Some("a")));
    let web = stub.get(Kind::Service, "ns", "web").unwrap();
    assert_eq!(
        web["metadata"]["annotations"]["metallb.io/ip-allocated-from-pool"],
        "default"
    );
    // The spec is untouched.
    assert_eq!(web["spec"]["clusterIP"], "10.96.0.1");

    let event = first_allocated_event(&stub).await;
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["note"], "Assigned IP [\"192.168.10.0\"]");
    assert_eq!(event["regarding"]["kind"], "Service");
    assert_eq!(event["regarding"]["name"], "web");
    assert_eq!(event["regarding"]["namespace"], "ns");
    assert_eq!(event["reportingController"], "kube-watcher");
    assert_eq!(event["reportingInstance"], "a");

    stub.wait_until("the pool status", |stub| {
        stub.get(Kind::Pool, "metallb-system", "default")
            .is_some_and(|p| {
                p["status"]
                    == json!({"assignedIPv4": 1, "assignedIPv6": 0,
                              "availableIPv4": 255, "availableIPv6": 0,
                              "conditions": [{"type": "Accepted", "status": "True",
                                              "reason": "Accepted",
                                              "message": "the pool is accepted",
                                              "lastTransitionTime":
                                                  p["status"]["conditions"][0]["lastTransitionTime"]}]})
            })
    })
    .await;
    let pool_writes: Vec<Recorded> = stub
        .requests()
        .into_iter()
        .filter(|r| r.is_write() && r.path.contains("ipaddresspools"))
        .collect();
    assert_eq!(pool_writes.len(), 1, "{pool_writes:?}");
    assert_eq!(
        pool_writes[0].path,
        "/apis/metallb.io/v1beta1/namespaces/metallb-system/ipaddresspools/default/status"
    );

    let text = host.metrics().render().unwrap();
    for line in [
        "metallb_allocator_addresses_in_use_total{pool=\"default\",kind=\"IPAddressPool\",ip_family=\"ipv4\"} 1",
        "metallb_allocator_addresses_total{pool=\"default\",kind=\"IPAddressPool\",ip_family=\"ipv4\"} 256",
        "kube_watcher_leader 1",
        "kube_watcher_synced 1",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    assert!(host.metrics().is_ready());

    // Our own writes come back as watch events; they cause no more writes.
    settled(&host).await;
    assert_eq!(service_writes(&stub, 0).len(), 2);

    // Shutting down gives the Lease up.
    host.shutdown().await;
    let lease = stub.get(Kind::Lease, LEASE_NAMESPACE, LEASE_NAME).unwrap();
    assert!(lease["spec"].get("holderIdentity").is_none(), "{lease}");
}

/// On tokio's paused clock (one thread: the host and the stub): time moves
/// only when every task waits, so the look below ends when the host has
/// nothing left to do, not after a guess of real time.
#[tokio::test(start_paused = true)]
async fn nothing_is_decided_before_every_initial_list() {
    let stub = cluster().await;
    stub.hold_lists(Kind::Pool);
    let host = Host::start(stub.client("a"), config("a"));
    let mut leader = host.leader();
    leader.wait_for(|l| *l).await.unwrap();
    eventually("Services and Namespaces are cached", || {
        host.store().service("ns/web").is_some() && host.store().namespace("ns").is_some()
    })
    .await;
    assert!(!host.synced().is_synced());
    assert!(!host.metrics().is_ready());
    // Leading with Services cached, but the pool list is not in: nothing
    // may be decided. What the host did meanwhile shows once it has settled
    // after the list: no write before the list was let through, and none
    // from a decision made without the pool (web found no pool).
    let mark = stub.last_seq();
    stub.release(Kind::Pool);
    wait_for_ips(&stub, "web", &["192.168.10.0"]).await;
    assert!(host.synced().is_synced());
    settled(&host).await;
    let writes = object_writes(&stub, 0);
    assert!(writes.iter().all(|w| w.seq > mark), "{writes:?}");
    assert!(
        writes
            .iter()
            .all(|w| !w.body.to_string().contains("AllocationFailed")),
        "{writes:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_is_retried() {
    let stub = cluster().await;
    stub.fail_next("PATCH", "/services/web/status", 409, 1);
    let host = Host::start(stub.client("a"), config("a"));
    wait_for_ips(&stub, "web", &["192.168.10.0"]).await;
    let status_writes: Vec<Recorded> = service_writes(&stub, 0)
        .into_iter()
        .filter(|w| w.path.ends_with("/status"))
        .collect();
    assert_eq!(status_writes.len(), 2, "409, then success");
    assert_eq!(status_writes[0].body, status_writes[1].body);
    settled(&host).await;
    let text = host.metrics().render().unwrap();
    assert!(text.contains("kube_watcher_write_errors_total 0"), "{text}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ending_in_410_relists_and_changes_nothing() {
    let stub = cluster().await;
    stub.create(service("ns", "db", "10.96.0.2"));
    let host = Host::start(stub.client("a"), config("a"));
    wait_for_ips(&stub, "web", &["192.168.10.0"]).await;
    wait_for_ips(&stub, "db", &["192.168.10.1"]).await;
    settled(&host).await;
    stub.wait_until("the pool status", |stub| {
        stub.get(Kind::Pool, "metallb-system", "default")
            .is_some_and(|p| p["status"]["assignedIPv4"] == 2)
    })
    .await;

    let mark = stub.last_seq();
    stub.expire_watches();
    // Every kind lists again, then watches from the new resourceVersion.
    stub.wait_until("every kind relisted and watching", |stub| {
        let after: Vec<Recorded> = stub
            .requests()
            .into_iter()
            .filter(|r| r.seq > mark && r.method == "GET")
            .collect();
        [
            "/api/v1/services",
            "/api/v1/namespaces",
            "/apis/metallb.io/v1beta1/ipaddresspools",
        ]
        .iter()
        .all(|path| {
            let list = after
                .iter()
                .position(|r| r.path == *path && !r.query.contains("watch=true"));
            let watch = after
                .iter()
                .rposition(|r| r.path == *path && r.query.contains("watch=true"));
            matches!((list, watch), (Some(l), Some(w)) if w > l)
        })
    })
    .await;
    tokio::time::timeout(Duration::from_secs(20), host.idle())
        .await
        .unwrap();
    assert!(
        object_writes(&stub, mark).is_empty(),
        "{:?}",
        object_writes(&stub, mark)
    );
    assert_eq!(stored_ips(&stub, "web"), ["192.168.10.0"]);
    assert_eq!(stored_ips(&stub, "db"), ["192.168.10.1"]);

    // A Service deleted while disconnected: the resumed watch replays it,
    // and its address goes to the next Service.
    stub.disconnect_watches();
    stub.delete(Kind::Service, "ns", "db");
    stub.create(service("ns", "new", "10.96.0.3"));
    wait_for_ips(&stub, "new", &["192.168.10.1"]).await;
    assert_eq!(stored_ips(&stub, "web"), ["192.168.10.0"]);
    host.shutdown().await;
}

/// A server that answers a resumed watch with an HTTP 410 (not with an
/// ERROR event in the stream, as kube-apiserver does): the host lists again
/// and sees what changed meanwhile, where kube's watcher alone would retry
/// the expired resourceVersion forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_refused_with_an_http_410_relists() {
    let stub = cluster().await;
    let host = Host::start(stub.client("a"), config("a"));
    wait_for_ips(&stub, "web", &["192.168.10.0"]).await;
    settled(&host).await;
    let mark = stub.last_seq();
    stub.compact_and_disconnect();
    stub.delete(Kind::Service, "ns", "web");
    stub.create(service("ns", "new", "10.96.0.3"));
    stub.wait_until("new holds an address", |stub| {
        stub.get(Kind::Service, "ns", "new")
            .is_some_and(|s| !ingress(&s).is_empty())
    })
    .await;
    assert!(stub.refused_watches() >= 1, "no watch was refused");
    // Each kind listed again after the refusal.
    let lists = |path: &str| {
        stub.requests()
            .iter()
            .filter(|r| r.seq > mark && r.path == path && !r.query.contains("watch=true"))
            .count()
    };
    assert!(lists("/api/v1/services") >= 1);
    host.shutdown().await;
}

/// On tokio's paused clock: the intruder's 3 s lease runs out in virtual
/// time, and the look for writes ends when the host is idle.
#[tokio::test(start_paused = true)]
async fn losing_the_lease_stops_writes_and_the_next_term_keeps_addresses() {
    let stub = cluster().await;
    let host = Host::start(stub.client("a"), config("a"));
    wait_for_ips(&stub, "web", &["192.168.10.0"]).await;
    settled(&host).await;
    // The watch brings the host's own writes back to its cache after the
    // manager is idle; a term that starts before they are cached writes
    // web again from the older object.
    eventually("web's writes are cached", || {
        host.store()
            .service("ns/web")
            .is_some_and(|web| manager::pool_annotation(&web) == Some("default"))
    })
    .await;

    stub.steal_lease(LEASE_NAMESPACE, LEASE_NAME, "intruder");
    let mut leader = host.leader();
    tokio::time::timeout(Duration::from_secs(20), leader.wait_for(|l| !*l))
        .await
        .expect("steps down in time")
        .unwrap();
    let mark = stub.last_seq();
    stub.create(service("ns", "web2", "10.96.0.2"));
    eventually("web2 is cached", || {
        host.store().service("ns/web2").is_some()
    })
    .await;

    // The intruder never renews: after its lease runs out this replica
    // leads again, rebuilds from the statuses, keeps web's address and
    // gives web2 the next one.
    wait_for_ips(&stub, "web2", &["192.168.10.1"]).await;
    // As a follower with web2 in its cache it wrote nothing: every write
    // since comes after the Lease write that made it leader again.
    let acquired = stub
        .requests()
        .into_iter()
        .find(|r| {
            r.seq > mark
                && r.is_write()
                && r.path.contains("/leases")
                && r.body["spec"]["holderIdentity"] == "a"
        })
        .expect("a took the Lease again")
        .seq;
    let writes = object_writes(&stub, mark);
    assert!(writes.iter().all(|w| w.seq > acquired), "{writes:?}");
    assert!(service_writes(&stub, mark)
        .iter()
        .all(|w| w.path.contains("/web2")));
    assert_eq!(stored_ips(&stub, "web"), ["192.168.10.0"]);
    host.shutdown().await;
}

/// On tokio's paused clock: the leases and the waits run on virtual time,
/// which moves only when the host and the stub have nothing left to do, so
/// a loaded machine cannot make a lease lapse or a wait run out.
#[tokio::test(start_paused = true)]
async fn only_the_leader_writes_and_a_new_leader_changes_no_address() {
    let stub = cluster().await;
    stub.create(service("ns", "db", "10.96.0.2"));
    let a = Host::start(stub.client("a"), config("a"));
    settled(&a).await;
    let b = Host::start(stub.client("b"), config("b"));
    wait_for_ips(&stub, "web", &["192.168.10.0"]).await;
    wait_for_ips(&stub, "db", &["192.168.10.1"]).await;
    eventually("b is ready", || b.metrics().is_ready()).await;
    assert!(!*b.leader().borrow());
    assert!(object_writes(&stub, 0)
        .iter()
        .all(|w| w.replica.as_deref() == Some("a")));

    // a goes away (and gives the Lease up): b leads, rebuilds from the
    // statuses, writes nothing for the Services that keep their addresses.
    // The mark comes after a has stopped: until then a leads, and its last
    // pool-status flush (at most once a second) may still land.
    a.shutdown().await;
    let mark = stub.last_seq();
    // a gave the Lease up last: after its every write, Events included.
    let lease_writes_of_a = stub
        .requests()
        .into_iter()
        .filter(|r| r.replica.as_deref() == Some("a") && r.is_write() && r.path.contains("/leases"))
        .map(|r| r.seq);
    let writes_of_a = object_writes(&stub, 0)
        .into_iter()
        .filter(|w| w.replica.as_deref() == Some("a"))
        .map(|w| w.seq);
    assert!(writes_of_a.max() < lease_writes_of_a.max());
    settled(&b).await;
    stub.delete(Kind::Service, "ns", "web");
    stub.create(service("ns", "late", "10.96.0.3"));
    wait_for_ips(&stub, "late", &["192.168.10.0"]).await;
    assert_eq!(stored_ips(&stub, "db"), ["192.168.10.1"]);
    let writes = object_writes(&stub, mark);
    assert!(
        writes.iter().all(|w| w.replica.as_deref() == Some("b")),
        "{writes:?}"
    );
    assert!(
        service_writes(&stub, mark)
            .iter()
            .all(|w| w.path.contains("/late")),
        "{:?}",
        service_writes(&stub, mark)
    );
    b.shutdown().await;
}
