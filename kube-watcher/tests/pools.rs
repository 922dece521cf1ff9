//! Pool feedback on the stub: an invalid and an overlapping pool each get
//! one Warning Event and `Accepted` False in their status; an accepted pool
//! gets `Accepted` True; a new leader does not warn again.

use kube_watcher::Host;
use serde_json::Value;

use crate::support::apiserver_stub::{ApiServerStub, Kind};
use crate::support::{config, namespace, pool, service, settled, LEASE_NAMESPACE};

fn accepted(stub: &ApiServerStub, name: &str) -> Option<Value> {
    let pool = stub.get(Kind::Pool, "metallb-system", name)?;
    pool["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Accepted")
        .cloned()
}

fn pool_events(stub: &ApiServerStub) -> Vec<Value> {
    stub.events()
        .into_iter()
        .filter(|e| e["regarding"]["kind"] == "IPAddressPool")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_pools_get_an_event_and_a_condition() {
    let stub = ApiServerStub::start().await;
    stub.create(namespace("ns"));
    stub.create(pool("first", &["192.168.10.0/24"]));
    stub.create(pool("second", &["192.168.10.128/25"]));
    stub.create(pool("bad", &["10.0.0.0/33"]));
    let host = Host::start(stub.client("a"), config("a"));
    stub.wait_until("every pool shows Accepted and two Events", |stub| {
        ["first", "second", "bad"]
            .iter()
            .all(|name| accepted(stub, name).is_some())
            && pool_events(stub).len() == 2
    })
    .await;

    let first = accepted(&stub, "first").unwrap();
    assert_eq!(
        (&first["status"], &first["reason"]),
        (&"True".into(), &"Accepted".into())
    );
    let second = accepted(&stub, "second").unwrap();
    assert_eq!(
        (&second["status"], &second["reason"]),
        (&"False".into(), &"Overlap".into())
    );
    assert!(
        second["message"]
            .as_str()
            .unwrap()
            .ends_with("of pool \"first\""),
        "{second}"
    );
    let bad = accepted(&stub, "bad").unwrap();
    assert_eq!(
        (&bad["status"], &bad["reason"]),
        (&"False".into(), &"Invalid".into())
    );
    let stored = stub.get(Kind::Pool, "metallb-system", "second").unwrap();
    assert_eq!(stored["status"]["assignedIPv4"], 0);
    assert_eq!(stored["status"]["availableIPv4"], 0);

    let events = pool_events(&stub);
    let event = |name: &str| {
        events
            .iter()
            .find(|e| e["regarding"]["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no Event on {name}: {events:?}"))
    };
    let overlap = event("second");
    assert_eq!(overlap["type"], "Warning");
    assert_eq!(overlap["reason"], "OverlappingPool");
    assert_eq!(overlap["regarding"]["namespace"], "metallb-system");
    let note = overlap["note"].as_str().unwrap();
    assert!(
        note.starts_with("pool \"second\" is not used: addresses")
            && note.ends_with("of pool \"first\""),
        "{note}"
    );
    let invalid = event("bad");
    assert_eq!(invalid["type"], "Warning");
    assert_eq!(invalid["reason"], "InvalidPool");
    assert!(
        invalid["note"].as_str().unwrap().contains("10.0.0.0/33"),
        "{invalid}"
    );

    // Once per problem: the writer runs again (a Service changes the
    // counters of `first`), no new Event.
    stub.create(service("ns", "web", "10.96.0.1"));
    stub.wait_until("first counts the Service", |stub| {
        stub.get(Kind::Pool, "metallb-system", "first")
            .is_some_and(|p| p["status"]["assignedIPv4"] == 1)
    })
    .await;
    settled(&host).await;
    assert_eq!(pool_events(&stub).len(), 2);
    host.shutdown().await;

    // A new leader sees the conditions: no Event again.
    let host = Host::start(stub.client("b"), config("b"));
    settled(&host).await;
    stub.create(service("ns", "db", "10.96.0.2"));
    stub.wait_until("first counts the second Service", |stub| {
        stub.get(Kind::Pool, "metallb-system", "first")
            .is_some_and(|p| p["status"]["assignedIPv4"] == 2)
    })
    .await;
    assert_eq!(pool_events(&stub).len(), 2, "{:?}", pool_events(&stub));
    // No ConfigurationState CRD here: never asked for.
    assert!(stub
        .requests()
        .iter()
        .all(|r| !r.path.contains("configurationstates")));
    host.shutdown().await;
}

fn config_state(stub: &ApiServerStub) -> Option<Value> {
    stub.get(Kind::ConfigurationState, LEASE_NAMESPACE, "controller")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_state_says_which_pools_are_invalid() {
    let stub = ApiServerStub::start().await;
    stub.serve_configuration_states();
    stub.create(namespace("ns"));
    stub.create(pool("first", &["192.168.10.0/24"]));
    stub.create(pool("bad", &["10.0.0.0/33"]));
    let host = Host::start(stub.client("a"), config("a"));
    stub.wait_until("the ConfigurationState is Invalid", |stub| {
        config_state(stub).is_some_and(|s| s["status"]["result"] == "Invalid")
    })
    .await;
    let state = config_state(&stub).unwrap();
    assert_eq!(
        state["metadata"]["labels"]["metallb.io/component-type"],
        "controller"
    );
    let summary = state["status"]["errorSummary"].as_str().unwrap();
    assert!(
        summary.starts_with("IPAddressPool \"bad\": ") && summary.contains("10.0.0.0/33"),
        "{summary}"
    );
    let condition = &state["status"]["conditions"][0];
    assert_eq!(condition["type"], "poolReconcilerValid");
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "ConfigurationError");
    assert_eq!(condition["message"], summary);

    // The bad pool goes: Valid, the summary removed.
    stub.delete(Kind::Pool, "metallb-system", "bad");
    stub.wait_until("the ConfigurationState is Valid", |stub| {
        config_state(stub).is_some_and(|s| s["status"]["result"] == "Valid")
    })
    .await;
    let state = config_state(&stub).unwrap();
    assert!(state["status"].get("errorSummary").is_none(), "{state}");
    assert_eq!(state["status"]["conditions"][0]["reason"], "Reconciled");
    let writes = |stub: &ApiServerStub| {
        stub.requests()
            .into_iter()
            .filter(|r| r.is_write() && r.path.contains("configurationstates"))
            .count()
    };
    // Created once, written twice.
    assert_eq!(writes(&stub), 3);
    host.shutdown().await;

    // A new leader reads it and writes nothing while nothing changed; the
    // writer has run once the Service is counted in `first`'s status.
    let host = Host::start(stub.client("b"), config("b"));
    stub.create(service("ns", "web", "10.96.0.1"));
    stub.wait_until("first counts the Service", |stub| {
        stub.get(Kind::Pool, "metallb-system", "first")
            .is_some_and(|p| p["status"]["assignedIPv4"] == 1)
    })
    .await;
    assert_eq!(writes(&stub), 3);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_metallbs_crd_the_condition_is_pruned_and_the_event_stays() {
    let stub = ApiServerStub::start().await;
    stub.prune_pool_conditions();
    stub.create(namespace("ns"));
    stub.create(pool("first", &["192.168.10.0/24"]));
    stub.create(pool("bad", &["10.0.0.0/33"]));
    let host = Host::start(stub.client("a"), config("a"));
    stub.wait_until("the Event on bad, first's status", |stub| {
        pool_events(stub).len() == 1
            && stub
                .get(Kind::Pool, "metallb-system", "first")
                .is_some_and(|p| p["status"]["availableIPv4"] == 256)
    })
    .await;
    assert_eq!(accepted(&stub, "first"), None, "pruned");
    stub.create(service("ns", "web", "10.96.0.1"));
    stub.wait_until("first counts the Service", |stub| {
        stub.get(Kind::Pool, "metallb-system", "first")
            .is_some_and(|p| p["status"]["assignedIPv4"] == 1)
    })
    .await;
    settled(&host).await;
    // One write per change: first twice (accepted, then the Service), bad
    // once. (A rewrite every period for a condition that never shows would
    // differ only in a lastTransitionTime of whole seconds, so this run,
    // well under a second, cannot see that one: pool_status.rs's
    // `previous` is what prevents it.)
    let writes = |name: &str| {
        stub.requests()
            .iter()
            .filter(|r| r.is_write() && r.path.ends_with(&format!("/ipaddresspools/{name}/status")))
            .count()
    };
    assert_eq!((writes("first"), writes("bad")), (2, 1));
    assert_eq!(pool_events(&stub).len(), 1);
    host.shutdown().await;
}
