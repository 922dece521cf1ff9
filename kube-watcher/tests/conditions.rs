//! The `metallb.io/AddressAssigned` condition on the stub: the exact
//! strategic merge patch, other controllers' conditions kept, ours removed
//! from a Service we stop handling, no write after a restart.

use kube_watcher::Host;
use serde_json::{json, Value};

use crate::support::apiserver_stub::{ApiServerStub, Kind, Recorded};
use crate::support::{config, ingress, namespace, pool, service, settled};

const OURS: &str = "metallb.io/AddressAssigned";

fn status_writes(stub: &ApiServerStub, name: &str, after: u64) -> Vec<Recorded> {
    let path = format!("/api/v1/namespaces/ns/services/{name}/status");
    stub.requests()
        .into_iter()
        .filter(|r| r.seq > after && r.is_write() && r.path == path)
        .collect()
}

fn service_writes(stub: &ApiServerStub, after: u64) -> Vec<Recorded> {
    stub.requests()
        .into_iter()
        .filter(|r| r.seq > after && r.is_write() && r.path.contains("/services/"))
        .collect()
}

fn conditions(stub: &ApiServerStub, name: &str) -> Vec<Value> {
    stub.get(Kind::Service, "ns", name)
        .and_then(|s| s["status"]["conditions"].as_array().cloned())
        .unwrap_or_default()
}

fn condition(stub: &ApiServerStub, name: &str, type_: &str) -> Option<Value> {
    conditions(stub, name)
        .into_iter()
        .find(|c| c["type"] == type_)
}

/// `GET /metrics` over HTTP from the host's metrics server.
async fn scrape(host: &Host) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(kube_watcher::metrics::serve(
        listener,
        host.metrics().clone(),
        cancel.clone(),
    ));
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    cancel.cancel();
    server.await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    response
}

/// Another controller's condition, as it would have written it.
fn theirs() -> Value {
    json!({"type": "example.com/Healthy", "status": "True", "reason": "Probed",
           "message": "all good", "lastTransitionTime": "2024-01-01T00:00:00Z"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_condition_merges_on_type_and_leaves_with_the_service() {
    let stub = ApiServerStub::start().await;
    stub.create(namespace("ns"));
    stub.create(pool("default", &["192.168.10.0/31"]));
    let mut web = service("ns", "web", "10.96.0.1");
    web["status"] = json!({"conditions": [theirs()]});
    stub.create(web);
    let host = Host::start(stub.client("a"), config("a"));
    stub.wait_until("web holds an address and shows our condition", |stub| {
        stub.get(Kind::Service, "ns", "web")
            .is_some_and(|s| ingress(&s) == ["192.168.10.0"])
            && condition(stub, "web", OURS).is_some()
    })
    .await;
    settled(&host).await;

    // One status write: the exact strategic merge patch.
    let writes = status_writes(&stub, "web", 0);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        writes[0].content_type,
        "application/strategic-merge-patch+json"
    );
    let transition = writes[0].body["status"]["conditions"][0]["lastTransitionTime"].clone();
    assert_eq!(
        writes[0].body,
        json!({"status": {
            "loadBalancer": {"ingress": [{"ip": "192.168.10.0"}]},
            "conditions": [{"type": OURS, "status": "True", "reason": "Assigned",
                            "message": "Assigned IP [\"192.168.10.0\"]",
                            "observedGeneration": null, "lastTransitionTime": transition}]
        }})
    );
    // Theirs kept, in place.
    assert_eq!(conditions(&stub, "web").first(), Some(&theirs()));
    assert_eq!(conditions(&stub, "web").len(), 2);

    // A Service that cannot be served: False with the reason; theirs kept.
    let mut full = service("ns", "full", "10.96.0.2");
    full["status"] = json!({"conditions": [theirs()]});
    stub.create(service("ns", "other", "10.96.0.3"));
    stub.wait_until("other holds the second address", |stub| {
        stub.get(Kind::Service, "ns", "other")
            .is_some_and(|s| ingress(&s) == ["192.168.10.1"])
    })
    .await;
    stub.create(full);
    stub.wait_until("full shows PoolExhausted", |stub| {
        condition(stub, "full", OURS).is_some_and(|c| c["reason"] == "PoolExhausted")
    })
    .await;
    let shown = condition(&stub, "full", OURS).unwrap();
    assert_eq!(shown["status"], "False");
    assert!(
        shown["message"]
            .as_str()
            .unwrap()
            .starts_with("Failed to allocate IP for \"ns/full\": no available IPs"),
        "{shown}"
    );
    assert_eq!(
        condition(&stub, "full", "example.com/Healthy"),
        Some(theirs())
    );
    // Idle: the write's wait for the cache to show it is over.
    settled(&host).await;
    let text = scrape(&host).await;
    assert!(
        text.contains("\nmetallb_allocator_services_unassigned{reason=\"PoolExhausted\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE metallb_allocator_services_unassigned gauge"),
        "{text}"
    );
    let full_writes = status_writes(&stub, "full", 0);
    assert_eq!(full_writes.len(), 1, "{full_writes:?}");
    assert!(
        full_writes[0].body["status"].get("loadBalancer").is_none(),
        "no ingress to change: {}",
        full_writes[0].body
    );

    // web stops being a LoadBalancer: ours goes with a delete directive,
    // theirs stays.
    let mark = stub.last_seq();
    let mut web = stub.get(Kind::Service, "ns", "web").unwrap();
    web["spec"]["type"] = json!("ClusterIP");
    stub.create(web);
    stub.wait_until("web lost our condition", |stub| {
        condition(stub, "web", OURS).is_none()
    })
    .await;
    settled(&host).await;
    let writes = status_writes(&stub, "web", mark);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        writes[0].body,
        json!({"status": {
            "loadBalancer": {"ingress": null},
            "conditions": [{"type": OURS, "$patch": "delete"}]
        }})
    );
    assert_eq!(conditions(&stub, "web"), [theirs()]);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_services_showing_the_condition_writes_nothing() {
    let stub = ApiServerStub::start().await;
    stub.create(namespace("ns"));
    stub.create(pool("default", &["192.168.10.0/31"]));
    for (name, ip) in [
        ("web", "10.96.0.1"),
        ("db", "10.96.0.2"),
        ("late", "10.96.0.3"),
    ] {
        stub.create(service("ns", name, ip));
    }
    let first = Host::start(stub.client("a"), config("a"));
    stub.wait_until("every Service shows our condition", |stub| {
        ["web", "db", "late"]
            .iter()
            .all(|name| condition(stub, name, OURS).is_some())
    })
    .await;
    settled(&first).await;
    assert_eq!(
        condition(&stub, "late", OURS).unwrap()["reason"],
        "PoolExhausted"
    );
    first.shutdown().await;

    let mark = stub.last_seq();
    let second = Host::start(stub.client("b"), config("b"));
    settled(&second).await;
    assert!(
        service_writes(&stub, mark).is_empty(),
        "{:?}",
        service_writes(&stub, mark)
    );
    second.shutdown().await;
}

/// The stub's strategic merge patch, as the API documents it: maps merge,
/// `null` deletes, a list with a merge key merges on it (`$patch: delete`
/// removes an element, `$patch: replace` the list), other lists are
/// replaced.
#[test]
fn the_stub_applies_strategic_merge_patches_as_the_api_does() {
    use crate::support::apiserver_stub::strategic_merge;
    let key = |path: &str| (path == "status.conditions").then_some("type");
    let mut object = json!({"status": {
        "loadBalancer": {"ingress": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}]},
        "conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "True"}]
    }});
    strategic_merge(
        &mut object,
        &json!({"status": {
            "loadBalancer": {"ingress": [{"ip": "10.0.0.3"}]},
            "conditions": [{"type": "B", "status": "False"}, {"type": "C", "status": "True"},
                           {"type": "A", "$patch": "delete"}]
        }}),
        "",
        &key,
    )
    .unwrap();
    assert_eq!(
        object,
        json!({"status": {
            "loadBalancer": {"ingress": [{"ip": "10.0.0.3"}]},
            "conditions": [{"type": "B", "status": "False"}, {"type": "C", "status": "True"}]
        }})
    );
    strategic_merge(
        &mut object,
        &json!({"status": {"loadBalancer": {"ingress": null},
                           "conditions": [{"$patch": "replace"}, {"type": "D", "status": "True"}]}}),
        "",
        &key,
    )
    .unwrap();
    assert_eq!(
        object,
        json!({"status": {"loadBalancer": {}, "conditions": [{"type": "D", "status": "True"}]}})
    );
    // An element without its merge key is refused.
    assert!(strategic_merge(
        &mut object,
        &json!({"status": {"conditions": [{"status": "True"}]}}),
        "",
        &key
    )
    .is_err());
}
