use std::io::Write;
use std::sync::{Arc, Mutex};

use fake_watcher::{replay, ReplayOptions};
use kube_watcher::record::{record, RecordStats};
use serde_json::Value;

use crate::support::apiserver_stub::{ApiServerStub, Kind};
use crate::support::{namespace, pool, service};

/// A shared buffer the recording writes into.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// `TYPE Kind key` per line.
    fn lines(&self) -> Vec<String> {
        self.text()
            .lines()
            .map(|line| {
                let line: Value = serde_json::from_str(line).unwrap();
                let object = &line["object"];
                let kind = object["kind"].as_str().unwrap_or_default();
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                match object["metadata"]["namespace"].as_str() {
                    Some(ns) => format!("{} {kind} {ns}/{name}", line["type"].as_str().unwrap()),
                    None if kind.is_empty() => line["type"].as_str().unwrap().to_owned(),
                    None => format!("{} {kind} {name}", line["type"].as_str().unwrap()),
                }
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_list_then_synced_then_events_and_replays() {
    let stub = ApiServerStub::start().await;
    // Created in this order: the initial list is written oldest first.
    stub.create(service("ns", "web", "10.96.0.1"));
    stub.create(service("ns", "api", "10.96.0.2"));
    stub.create(pool("default", &["192.168.10.0/24"]));
    stub.create(namespace("ns"));
    let buffer = Buffer::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let recording = tokio::spawn(record(
        stub.client("recorder"),
        buffer.clone(),
        false,
        async {
            let _ = stopped.await;
        },
    ));
    crate::support::eventually("SYNCED is written", || buffer.text().contains("SYNCED")).await;
    assert_eq!(
        buffer.lines(),
        [
            "ADDED Namespace ns",
            "ADDED IPAddressPool metallb-system/default",
            "ADDED Service ns/web",
            "ADDED Service ns/api",
            "SYNCED",
        ]
    );
    stub.create(service("ns", "late", "10.96.0.3"));
    stub.delete(Kind::Service, "ns", "web");
    crate::support::eventually("the events are written", || buffer.lines().len() == 7).await;
    stop.send(()).unwrap();
    let stats = recording.await.unwrap().unwrap();
    assert_eq!(
        stats,
        RecordStats {
            listed: 4,
            synced: true,
            events: 2
        }
    );
    assert_eq!(
        buffer.lines()[5..],
        ["ADDED Service ns/late", "DELETED Service ns/web"]
    );

    // fake-watcher replays it: web and api (oldest first) get .0 and .1 at
    // SYNCED, late gets .2, and web's delete frees .0.
    let text = buffer.text();
    let output = replay("recorded.jsonl", text.as_bytes(), &ReplayOptions::default())
        .await
        .unwrap();
    let services: Vec<(String, Vec<String>)> = output
        .result
        .services
        .iter()
        .map(|s| {
            (
                s.key.clone(),
                s.ips.iter().map(ToString::to_string).collect(),
            )
        })
        .collect();
    assert_eq!(
        services,
        [
            ("ns/api".to_owned(), vec!["192.168.10.1".to_owned()]),
            ("ns/late".to_owned(), vec!["192.168.10.2".to_owned()]),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_only_stops_after_synced() {
    let stub = ApiServerStub::start().await;
    stub.create(namespace("ns"));
    let buffer = Buffer::default();
    let stats = record(
        stub.client("recorder"),
        buffer.clone(),
        true,
        std::future::pending(),
    )
    .await
    .unwrap();
    assert_eq!(buffer.lines(), ["ADDED Namespace ns", "SYNCED"]);
    assert_eq!(stats.listed, 1);
    assert!(stats.synced);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_cilium_pools_when_served() {
    let stub = ApiServerStub::start().await;
    stub.create(namespace("ns"));
    stub.create(serde_json::json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
        "metadata": {"name": "blue"}, "spec": {"blocks": [{"cidr": "10.1.0.0/24"}]}
    }));
    stub.create(pool("default", &["192.168.10.0/24"]));
    stub.create(service("ns", "web", "10.96.0.1"));

    // Not served: not recorded, and not asked for.
    let buffer = Buffer::default();
    record(
        stub.client("recorder"),
        buffer.clone(),
        true,
        std::future::pending(),
    )
    .await
    .unwrap();
    assert_eq!(
        buffer.lines(),
        [
            "ADDED Namespace ns",
            "ADDED IPAddressPool metallb-system/default",
            "ADDED Service ns/web",
            "SYNCED",
        ]
    );

    // Served: listed with the other pools, oldest first, then watched.
    stub.serve_cilium(&["v2"]);
    let buffer = Buffer::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let recording = tokio::spawn(record(
        stub.client("recorder"),
        buffer.clone(),
        false,
        async {
            let _ = stopped.await;
        },
    ));
    crate::support::eventually("SYNCED is written", || buffer.text().contains("SYNCED")).await;
    assert_eq!(
        buffer.lines(),
        [
            "ADDED Namespace ns",
            "ADDED CiliumLoadBalancerIPPool blue",
            "ADDED IPAddressPool metallb-system/default",
            "ADDED Service ns/web",
            "SYNCED",
        ]
    );
    stub.create(serde_json::json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
        "metadata": {"name": "green"}, "spec": {"blocks": [{"cidr": "10.2.0.0/24"}]}
    }));
    crate::support::eventually("green is written", || buffer.lines().len() == 6).await;
    stop.send(()).unwrap();
    recording.await.unwrap().unwrap();
    assert_eq!(buffer.lines()[5], "ADDED CiliumLoadBalancerIPPool green");
    let blue: Value = serde_json::from_str(buffer.text().lines().nth(1).unwrap()).unwrap();
    assert_eq!(blue["object"]["apiVersion"], "cilium.io/v2");
    assert_eq!(blue["object"]["spec"]["blocks"][0]["cidr"], "10.1.0.0/24");

    // fake-watcher replays it: web takes the older, Cilium, pool.
    let output = replay(
        "recorded.jsonl",
        buffer.text().as_bytes(),
        &ReplayOptions::default(),
    )
    .await
    .unwrap();
    let web = output
        .result
        .services
        .iter()
        .find(|s| s.key == "ns/web")
        .unwrap();
    assert_eq!(
        web.ips.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["10.1.0.0"]
    );
}
