//! Cilium's `CiliumLoadBalancerIPPool` on the stub (docs/cilium.md §2.8,
//! §3.6, §5): discovery with and without the CRD (and the CRD installed
//! later; and a cluster without MetalLB's CRD), the pools' four conditions written exactly and only when one
//! would change, a conflict and its resolution, an invalid pool, and the
//! Service's two conditions in one strategic merge patch.
//!
//! Waits are on the stub's requests and writes (event-driven); the host's
//! own timers (discovery, pool status) run at test periods.

use std::time::Duration;

use kube_watcher::{Host, HostConfig};
use serde_json::{json, Value};

use crate::support::apiserver_stub::{ApiServerStub, Kind, Recorded};
use crate::support::{config, ingress, namespace, pool, service, settled};

/// The test host's config, asking discovery again every 50ms.
fn cilium_config(identity: &str) -> HostConfig {
    let mut config = config(identity);
    config.discovery_period = Duration::from_millis(50);
    config
}

fn cilium_pool(name: &str, blocks: Value) -> Value {
    json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
        "metadata": {"name": name},
        "spec": {"blocks": blocks}
    })
}

/// The pool's condition of `type_`, if shown.
fn condition(stub: &ApiServerStub, name: &str, type_: &str) -> Option<Value> {
    let pool = stub.get(Kind::CiliumPool, "", name)?;
    pool["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// (type, status, reason, message, observedGeneration) of each of the four.
fn cilium_conditions(
    stub: &ApiServerStub,
    name: &str,
) -> Vec<(String, String, String, String, i64)> {
    [
        "cilium.io/IPsTotal",
        "cilium.io/IPsAvailable",
        "cilium.io/IPsUsed",
        "cilium.io/PoolConflict",
    ]
    .iter()
    .filter_map(|type_| condition(stub, name, type_))
    .map(|c| {
        let text = |field: &str| c[field].as_str().unwrap_or("?").to_owned();
        (
            text("type"),
            text("status"),
            text("reason"),
            text("message"),
            c["observedGeneration"].as_i64().unwrap_or(-1),
        )
    })
    .collect()
}

fn expected(
    total: &str,
    available: &str,
    used: &str,
    conflict: Option<&str>,
) -> Vec<(String, String, String, String, i64)> {
    let row = |t: &str, s: &str, r: &str, m: &str| {
        (t.to_owned(), s.to_owned(), r.to_owned(), m.to_owned(), 1)
    };
    vec![
        row("cilium.io/IPsTotal", "Unknown", "noreason", total),
        row("cilium.io/IPsAvailable", "Unknown", "noreason", available),
        row("cilium.io/IPsUsed", "Unknown", "noreason", used),
        match conflict {
            Some(message) => row("cilium.io/PoolConflict", "True", "cidr_overlap", message),
            None => row("cilium.io/PoolConflict", "False", "resolved", ""),
        },
    ]
}

/// Status patches of the Cilium pool `name`.
fn status_patches(stub: &ApiServerStub, name: &str) -> Vec<Recorded> {
    stub.requests()
        .into_iter()
        .filter(|r| {
            r.method == "PATCH"
                && r.path
                    .ends_with(&format!("/ciliumloadbalancerippools/{name}/status"))
        })
        .collect()
}

/// Watches of the Cilium pools' collection at `version` (a list alone may
/// be discovery's confirmation that the kind is not served).
fn pool_watches(stub: &ApiServerStub, version: &str) -> usize {
    watches(
        stub,
        &format!("/apis/cilium.io/{version}/ciliumloadbalancerippools"),
    )
}

/// Watch requests of the collection at `path`.
fn watches(stub: &ApiServerStub, path: &str) -> usize {
    stub.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == path && r.query.contains("watch=true"))
        .count()
}

fn discoveries(stub: &ApiServerStub, version: &str) -> usize {
    let path = format!("/apis/cilium.io/{version}");
    stub.requests().iter().filter(|r| r.path == path).count()
}

/// Waits until the Lease was renewed `count` more times: the host's loops
/// (pool status every 100ms, renewals every 100ms) went round meanwhile.
async fn renewals(stub: &ApiServerStub, count: usize) {
    let renewed = |stub: &ApiServerStub| {
        stub.requests()
            .iter()
            .filter(|r| r.method == "PUT" && r.path.contains("/leases/"))
            .count()
    };
    let target = renewed(stub) + count;
    stub.wait_until("the Lease is renewed a few times", |stub| {
        renewed(stub) >= target
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_crd_the_host_syncs_and_notices_it_installed_later() {
    let stub = ApiServerStub::start().await;
    stub.create(namespace("ns"));
    stub.create(pool("default", &["192.168.10.0/24"]));
    stub.create(service("ns", "web", "10.96.0.1"));
    let host = Host::start(stub.client("a"), cilium_config("a"));
    stub.wait_until("web is allocated without Cilium's CRD", |stub| {
        ingress(&stub.get(Kind::Service, "ns", "web").unwrap()) == ["192.168.10.0"]
    })
    .await;
    assert!(host.synced().is_synced());
    // Both versions asked (discovery, then a list to confirm); neither
    // watched.
    assert!(discoveries(&stub, "v2") >= 1 && discoveries(&stub, "v2alpha1") >= 1);
    assert_eq!(
        pool_watches(&stub, "v2") + pool_watches(&stub, "v2alpha1"),
        0
    );
    // Asked again on the timer.
    let asked = discoveries(&stub, "v2");
    stub.wait_until("discovery is asked again", |stub| {
        discoveries(stub, "v2") > asked
    })
    .await;

    // Cilium's CRD installed: noticed without a restart.
    stub.serve_cilium(&["v2"]);
    stub.create(cilium_pool("blue", json!([{"cidr": "10.1.0.0/24"}])));
    stub.wait_until("blue shows its four conditions", |stub| {
        cilium_conditions(stub, "blue").len() == 4
    })
    .await;
    assert_eq!(
        cilium_conditions(&stub, "blue"),
        expected("256", "256", "0", None)
    );
    // The list came first; the watch follows it.
    stub.wait_until("the Cilium pools are watched at v2", |stub| {
        pool_watches(stub, "v2") >= 1
    })
    .await;
    host.shutdown().await;
}

/// Watches of the `IPAddressPool` collection.
fn metallb_pool_watches(stub: &ApiServerStub) -> usize {
    watches(stub, "/apis/metallb.io/v1beta1/ipaddresspools")
}

/// A Service that asks for the pool `default`.
fn asking_for_default(name: &str, cluster_ip: &str) -> Value {
    let mut asking = service("ns", name, cluster_ip);
    asking["metadata"]["annotations"] = json!({"metallb.io/address-pool": "default"});
    asking
}

/// A Cilium-only cluster, without MetalLB's CRD: the host syncs on the
/// Cilium pools alone (the IPAddressPools count as listed, there being
/// none), serves Services from them, and notices the CRD installed later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_ipaddresspool_crd_syncs_on_the_cilium_pools() {
    let stub = ApiServerStub::start().await;
    stub.serve_pools(false);
    stub.serve_cilium(&["v2"]);
    stub.create(namespace("ns"));
    stub.create(cilium_pool("blue", json!([{"cidr": "10.1.0.0/24"}])));
    stub.create(service("ns", "web", "10.96.0.1"));
    let host = Host::start(stub.client("a"), cilium_config("a"));
    stub.wait_until("web is allocated from the Cilium pool", |stub| {
        ingress(&stub.get(Kind::Service, "ns", "web").unwrap()) == ["10.1.0.0"]
    })
    .await;
    assert!(host.synced().is_synced());
    assert_eq!(metallb_pool_watches(&stub), 0);

    // MetalLB's CRD installed, with a pool: watched without a restart.
    stub.serve_pools(true);
    stub.create(pool("default", &["192.168.10.0/24"]));
    stub.create(asking_for_default("api", "10.96.0.2"));
    stub.wait_until("api gets an address of the IPAddressPool", |stub| {
        ingress(&stub.get(Kind::Service, "ns", "api").unwrap()) == ["192.168.10.0"]
    })
    .await;
    // The list came first; the watch follows it.
    stub.wait_until("the IPAddressPools are watched", |stub| {
        metallb_pool_watches(stub) >= 1
    })
    .await;
    host.shutdown().await;
}

/// A server that serves the pools but no discovery document (as some API
/// emulators): a list of each kind says they are served, so the host
/// watches them rather than syncing without them (which would release
/// every address they hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_discovery_a_list_says_the_pools_are_served() {
    let stub = ApiServerStub::start().await;
    stub.hide_discovery();
    stub.serve_cilium(&["v2"]);
    stub.create(namespace("ns"));
    stub.create(pool("default", &["192.168.10.0/24"]));
    stub.create(cilium_pool("blue", json!([{"cidr": "10.1.0.0/24"}])));
    stub.create(asking_for_default("web", "10.96.0.1"));
    let host = Host::start(stub.client("a"), cilium_config("a"));
    stub.wait_until("web gets an address of the IPAddressPool", |stub| {
        ingress(&stub.get(Kind::Service, "ns", "web").unwrap()) == ["192.168.10.0"]
    })
    .await;
    crate::support::eventually("the Cilium pool is cached", || {
        host.store().cilium_pools().len() == 1
    })
    .await;
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serving_only_v2alpha1_is_watched_and_written_there() {
    let stub = ApiServerStub::start().await;
    stub.serve_cilium(&["v2alpha1"]);
    stub.create(cilium_pool("blue", json!([{"cidr": "10.1.0.0/30"}])));
    let host = Host::start(stub.client("a"), cilium_config("a"));
    stub.wait_until("blue shows its conditions", |stub| {
        cilium_conditions(stub, "blue").len() == 4
    })
    .await;
    assert_eq!(
        cilium_conditions(&stub, "blue"),
        expected("4", "4", "0", None)
    );
    // The list came first; the watch follows it.
    stub.wait_until("the Cilium pools are watched at v2alpha1", |stub| {
        pool_watches(stub, "v2alpha1") >= 1
    })
    .await;
    let patches = status_patches(&stub, "blue");
    assert!(patches
        .iter()
        .all(|r| r.path.starts_with("/apis/cilium.io/v2alpha1/")));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_conditions_are_exact_kept_with_others_and_written_only_on_change() {
    let stub = ApiServerStub::start().await;
    stub.serve_cilium(&["v2"]);
    stub.create(namespace("ns"));
    // A /24 and an IPv6 /64, with a condition of another writer.
    let mut blue = cilium_pool(
        "blue",
        json!([{"cidr": "10.1.0.0/24"}, {"cidr": "2001:db8::/64"}]),
    );
    blue["status"] = json!({"conditions": [
        {"type": "example.com/Other", "status": "True", "reason": "Theirs", "message": "kept",
         "lastTransitionTime": "2024-01-01T00:00:00Z"}
    ]});
    stub.create(blue);
    stub.create(service("ns", "web", "10.96.0.1"));
    // The first write meets a concurrent change: read again, written.
    stub.fail_next("PATCH", "/ciliumloadbalancerippools/blue/status", 409, 1);
    let host = Host::start(stub.client("a"), cilium_config("a"));
    stub.wait_until("web holds a Cilium address, blue counts it", |stub| {
        ingress(&stub.get(Kind::Service, "ns", "web").unwrap()) == ["10.1.0.0"]
            && condition(stub, "blue", "cilium.io/IPsUsed").is_some_and(|c| c["message"] == "1")
    })
    .await;
    settled(&host).await;
    assert_eq!(
        cilium_conditions(&stub, "blue"),
        expected("18446744073709551872", "18446744073709551871", "1", None)
    );
    let stored = stub.get(Kind::CiliumPool, "", "blue").unwrap();
    let conditions = stored["status"]["conditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 5);
    assert_eq!(
        conditions[0],
        json!({"type": "example.com/Other", "status": "True", "reason": "Theirs",
               "message": "kept", "lastTransitionTime": "2024-01-01T00:00:00Z"})
    );
    assert!(conditions.iter().all(|c| c["lastTransitionTime"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z'))));
    // Each write: a merge patch with the resourceVersion read, by us.
    let patches = status_patches(&stub, "blue");
    assert!(patches.len() >= 2, "the 409 and its retry");
    for patch in &patches {
        assert!(patch
            .content_type
            .starts_with("application/merge-patch+json"));
        assert!(
            patch.query.contains("fieldManager=kube-watcher"),
            "{}",
            patch.query
        );
        assert!(patch.body["metadata"]["resourceVersion"].is_string());
    }
    assert!(stub.requests().iter().any(
        |r| r.method == "GET" && r.path == "/apis/cilium.io/v2/ciliumloadbalancerippools/blue"
    ));

    // Nothing changes: nothing is written, however many rounds go by.
    let written = status_patches(&stub, "blue").len();
    renewals(&stub, 5).await;
    assert_eq!(status_patches(&stub, "blue").len(), written);

    // The Service leaves: Used goes back to 0, the times of the counts stay.
    let total_since =
        condition(&stub, "blue", "cilium.io/IPsTotal").unwrap()["lastTransitionTime"].clone();
    stub.delete(Kind::Service, "ns", "web");
    stub.wait_until("blue counts nothing used", |stub| {
        condition(stub, "blue", "cilium.io/IPsUsed").is_some_and(|c| c["message"] == "0")
    })
    .await;
    assert_eq!(
        condition(&stub, "blue", "cilium.io/IPsTotal").unwrap()["lastTransitionTime"],
        total_since
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_is_shown_then_resolved() {
    let stub = ApiServerStub::start().await;
    stub.serve_cilium(&["v2", "v2alpha1"]);
    stub.create(cilium_pool("blue", json!([{"cidr": "10.1.0.0/24"}])));
    let conflict = "Pool conflicts since range '10.1.0.128 - 10.1.0.255' overlaps range '10.1.0.0 - 10.1.0.255' from IP Pool 'blue'";
    let mut green = cilium_pool("green", json!([{"cidr": "10.1.0.128/25"}]));
    green["spec"]["allowFirstLastIPs"] = json!("No");
    // As an earlier leader left it: the conflict shown, the counts not yet.
    green["status"] = json!({"conditions": [
        {"type": "cilium.io/PoolConflict", "status": "True", "reason": "cidr_overlap",
         "message": conflict, "observedGeneration": 1,
         "lastTransitionTime": "2024-01-01T00:00:00Z"}
    ]});
    stub.create(green);
    let host = Host::start(stub.client("a"), cilium_config("a"));
    stub.wait_until("green shows the conflict", |stub| {
        cilium_conditions(stub, "green").len() == 4 && cilium_conditions(stub, "blue").len() == 4
    })
    .await;
    assert_eq!(
        cilium_conditions(&stub, "green"),
        expected("128", "126", "2", Some(conflict))
    );
    assert_eq!(
        cilium_conditions(&stub, "blue"),
        expected("256", "256", "0", None)
    );
    assert_eq!(pool_watches(&stub, "v2alpha1"), 0, "v2 is preferred");
    // The status did not change: its time stays.
    let since =
        condition(&stub, "green", "cilium.io/PoolConflict").unwrap()["lastTransitionTime"].clone();
    assert_eq!(since, "2024-01-01T00:00:00Z");
    // One Warning Event on green, regarding the Cilium object (its
    // condition showed the conflict, but warnings are per term).
    let events: Vec<Value> = stub
        .events()
        .into_iter()
        .filter(|e| e["regarding"]["kind"] == "CiliumLoadBalancerIPPool")
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["regarding"]["name"], "green");
    assert_eq!(events[0]["regarding"]["apiVersion"], "cilium.io/v2");
    assert_eq!(events[0]["reason"], "OverlappingPool");

    stub.delete(Kind::CiliumPool, "", "blue");
    stub.wait_until("green's conflict is resolved", |stub| {
        condition(stub, "green", "cilium.io/PoolConflict").is_some_and(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(
        cilium_conditions(&stub, "green"),
        expected("128", "126", "2", None)
    );
    let resolved = condition(&stub, "green", "cilium.io/PoolConflict").unwrap();
    assert_eq!(resolved["reason"], "resolved");
    assert_ne!(
        resolved["lastTransitionTime"], since,
        "a new status, a new time"
    );
    host.shutdown().await;
}

/// A pool name of 253 characters (the most a name may have) still gets its
/// Warning: the Event's own name, `{object}.{nanoseconds}`, is cut to fit
/// (the API server refuses a longer one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_with_the_longest_name_gets_its_event() {
    let stub = ApiServerStub::start().await;
    stub.serve_cilium(&["v2"]);
    let long = format!("{}abc", "pool.".repeat(50));
    assert_eq!(long.len(), 253);
    stub.create(cilium_pool(&long, json!([{"cidr": "10.1.0.0/33"}])));
    let host = Host::start(stub.client("a"), cilium_config("a"));
    stub.wait_until("the long-named pool is warned about", |stub| {
        stub.events()
            .iter()
            .any(|e| e["regarding"]["name"] == long.as_str())
    })
    .await;
    let events: Vec<Value> = stub.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let name = events[0]["metadata"]["name"].as_str().unwrap_or_default();
    assert!(name.len() <= 253, "{name}");
    assert!(name.starts_with("pool.pool."), "{name}");
    assert_eq!(events[0]["reason"], "InvalidPool");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_pool_gets_an_event_and_no_cilium_condition() {
    let stub = ApiServerStub::start().await;
    stub.serve_cilium(&["v2"]);
    stub.create(cilium_pool("bad", json!([{"cidr": "10.1.0.0/33"}])));
    stub.create(cilium_pool("good", json!([{"cidr": "10.2.0.0/24"}])));
    let host = Host::start(stub.client("a"), cilium_config("a"));
    stub.wait_until("good is written and bad warned about", |stub| {
        cilium_conditions(stub, "good").len() == 4
            && stub
                .events()
                .iter()
                .any(|e| e["regarding"]["name"] == "bad")
    })
    .await;
    settled(&host).await;
    renewals(&stub, 3).await;
    assert!(status_patches(&stub, "bad").is_empty());
    assert!(stub.get(Kind::CiliumPool, "", "bad").unwrap()["status"].is_null());
    let events: Vec<Value> = stub
        .events()
        .into_iter()
        .filter(|e| e["regarding"]["name"] == "bad")
        .collect();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(events[0]["reason"], "InvalidPool");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_carries_both_conditions_from_one_patch() {
    let stub = ApiServerStub::start().await;
    stub.serve_cilium(&["v2"]);
    stub.create(namespace("ns"));
    stub.create(cilium_pool("blue", json!([{"cidr": "10.1.0.0/24"}])));
    let mut web = service("ns", "web", "10.96.0.1");
    web["status"] = json!({"conditions": [
        {"type": "example.com/Other", "status": "True", "reason": "Theirs", "message": "",
         "lastTransitionTime": "2024-01-01T00:00:00Z"}
    ]});
    stub.create(web);
    let host = Host::start(stub.client("a"), cilium_config("a"));
    stub.wait_until("web holds an address", |stub| {
        ingress(&stub.get(Kind::Service, "ns", "web").unwrap()) == ["10.1.0.0"]
    })
    .await;
    settled(&host).await;
    let web = stub.get(Kind::Service, "ns", "web").unwrap();
    let types: Vec<&str> = web["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "example.com/Other",
            "metallb.io/AddressAssigned",
            "cilium.io/IPAMRequestSatisfied"
        ]
    );
    let cilium = &web["status"]["conditions"][2];
    assert_eq!(
        (&cilium["status"], &cilium["reason"]),
        (&json!("True"), &json!("satisfied"))
    );
    // Both in the one strategic merge patch that wrote the address.
    let patch = stub
        .requests()
        .into_iter()
        .find(|r| r.method == "PATCH" && r.path.ends_with("/services/web/status"))
        .unwrap();
    assert!(patch
        .content_type
        .starts_with("application/strategic-merge-patch+json"));
    let sent: Vec<&str> = patch.body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        sent,
        [
            "metallb.io/AddressAssigned",
            "cilium.io/IPAMRequestSatisfied"
        ]
    );
    assert_eq!(
        patch.body["status"]["loadBalancer"]["ingress"][0]["ip"],
        "10.1.0.0"
    );
    host.shutdown().await;
}

/// On tokio's paused clock (one thread: the host and the stub), as
/// `host::nothing_is_decided_before_every_initial_list`: with the CRD
/// served, the sync waits for the Cilium pools' list, and then a Service
/// showing an address of a Cilium pool keeps it.
#[tokio::test(start_paused = true)]
async fn the_sync_waits_for_the_cilium_pools_when_served() {
    let stub = ApiServerStub::start().await;
    stub.serve_cilium(&["v2"]);
    stub.create(namespace("ns"));
    stub.create(cilium_pool("blue", json!([{"cidr": "10.1.0.0/24"}])));
    let mut web = service("ns", "web", "10.96.0.1");
    web["status"] = json!({"loadBalancer": {"ingress": [{"ip": "10.1.0.5"}]}});
    stub.create(web);
    stub.hold_lists(Kind::CiliumPool);
    let host = Host::start(stub.client("a"), cilium_config("a"));
    let mut leader = host.leader();
    leader.wait_for(|l| *l).await.unwrap();
    crate::support::eventually("Services and Namespaces are cached", || {
        host.store().services().len() == 1 && host.store().namespaces().len() == 1
    })
    .await;
    assert!(!host.synced().is_synced());
    // No decision before the Cilium pools' list: checked once the host has
    // settled after it (no write before the list was let through, and no
    // status write moving web off its address).
    let mark = stub.last_seq();
    stub.release(Kind::CiliumPool);
    stub.wait_until("blue counts web's address", |stub| {
        condition(stub, "blue", "cilium.io/IPsUsed").is_some_and(|c| c["message"] == "1")
    })
    .await;
    assert!(host.synced().is_synced());
    settled(&host).await;
    assert_eq!(
        ingress(&stub.get(Kind::Service, "ns", "web").unwrap()),
        ["10.1.0.5"]
    );
    let writes: Vec<_> = stub
        .requests()
        .into_iter()
        .filter(|r| r.is_object_write())
        .collect();
    assert!(writes.iter().all(|w| w.seq > mark), "{writes:?}");
    assert!(
        writes
            .iter()
            .filter_map(|w| w.body["status"].get("loadBalancer"))
            .all(|lb| lb["ingress"] == json!([{"ip": "10.1.0.5"}])),
        "{writes:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_removed_or_a_version_dropped_goes_back_to_discovery() {
    let stub = ApiServerStub::start().await;
    stub.serve_cilium(&["v2", "v2alpha1"]);
    stub.create(cilium_pool("blue", json!([{"cidr": "10.1.0.0/24"}])));
    let host = Host::start(stub.client("a"), cilium_config("a"));
    stub.wait_until("blue is written at v2", |stub| {
        cilium_conditions(stub, "blue").len() == 4
    })
    .await;
    assert_eq!(host.store().cilium_pools().len(), 1);

    // The CRD is removed: the watch meets 404s, the pools are forgotten.
    stub.serve_cilium(&[]);
    stub.disconnect_watches();
    crate::support::eventually("the cache forgets blue", || {
        host.store().cilium_pools().is_empty()
    })
    .await;

    // Installed again, at v2alpha1 only: watched there.
    stub.serve_cilium(&["v2alpha1"]);
    crate::support::eventually("the cache has blue again", || {
        host.store().cilium_pools().len() == 1
    })
    .await;
    // The list came first; the watch follows it.
    stub.wait_until("the Cilium pools are watched at v2alpha1", |stub| {
        pool_watches(stub, "v2alpha1") >= 1
    })
    .await;
    host.shutdown().await;
}
