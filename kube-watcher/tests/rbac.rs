use std::collections::BTreeSet;
use std::path::Path;

use kube_watcher::record::record;
use kube_watcher::Host;
use serde_json::{json, Value};

use crate::support::apiserver_stub::{ApiServerStub, Kind};
use crate::support::{config, ingress, namespace, pool, service, LEASE_NAMESPACE};

/// (API group, resource, verb) of a request the stub recorded.
fn permission(method: &str, path: &str, query: &str) -> Option<(String, String, String)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => (String::new(), rest),
        ["apis", group, _, rest @ ..] => ((*group).to_owned(), rest),
        _ => return None,
    };
    let (resource, one) = match rest {
        [plural] => ((*plural).to_owned(), false),
        ["namespaces", _] => ("namespaces".to_owned(), true),
        ["namespaces", _, plural] => ((*plural).to_owned(), false),
        ["namespaces", _, plural, _] => ((*plural).to_owned(), true),
        ["namespaces", _, plural, _, sub] => (format!("{plural}/{sub}"), true),
        // Cluster-scoped custom resources.
        [plural, _] => ((*plural).to_owned(), true),
        [plural, _, sub] => (format!("{plural}/{sub}"), true),
        _ => return None,
    };
    let verb = match (method, one) {
        ("GET", false) if query.contains("watch=true") => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => return None,
    };
    Some((group, resource, verb.to_owned()))
}

/// Every (group, resource, verb) that deploy/rbac.yaml grants.
fn granted() -> BTreeSet<(String, String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut granted = BTreeSet::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let document: Value = serde::Deserialize::deserialize(document).unwrap();
        if !matches!(document["kind"].as_str(), Some("ClusterRole" | "Role")) {
            continue;
        }
        for rule in document["rules"].as_array().unwrap() {
            for group in rule["apiGroups"].as_array().unwrap() {
                for resource in rule["resources"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        granted.insert((
                            group.as_str().unwrap().to_owned(),
                            resource.as_str().unwrap().to_owned(),
                            verb.as_str().unwrap().to_owned(),
                        ));
                    }
                }
            }
        }
    }
    granted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_grants_exactly_the_verbs_used() {
    let stub = ApiServerStub::start().await;
    stub.serve_configuration_states();
    stub.serve_cilium(&["v2"]);
    stub.create(namespace("ns"));
    stub.create(pool("default", &["192.168.10.0/24"]));
    stub.create(json!({
        "apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
        "metadata": {"name": "blue"},
        // Serves no Service here: web takes the MetalLB pool (annotated).
        "spec": {"blocks": [{"cidr": "10.1.0.0/24"}],
                 "serviceSelector": {"matchLabels": {"serves": "nothing"}}}
    }));
    stub.create(service("ns", "web", "10.96.0.1"));
    // The Cilium pool's first status write meets a 409: it is read again.
    stub.fail_next("PATCH", "/ciliumloadbalancerippools/blue/status", 409, 1);
    let host = Host::start(stub.client("a"), config("a"));
    stub.wait_until("allocated, annotated, announced, counted", |stub| {
        let web = stub.get(Kind::Service, "ns", "web").unwrap();
        let pool = stub.get(Kind::Pool, "metallb-system", "default").unwrap();
        let blue = stub.get(Kind::CiliumPool, "", "blue").unwrap();
        ingress(&web) == ["192.168.10.0"]
            && web["metadata"]["annotations"].is_object()
            && !stub.events().is_empty()
            && pool["status"].is_object()
            && blue["status"]["conditions"].is_array()
            && stub
                .get(Kind::ConfigurationState, LEASE_NAMESPACE, "controller")
                .is_some_and(|state| state["status"]["result"] == "Valid")
            && stub
                .requests()
                .iter()
                .any(|r| r.method == "PUT" && r.path.contains("/leases/"))
    })
    .await;
    host.shutdown().await;
    record(
        stub.client("recorder"),
        Vec::new(),
        true,
        std::future::pending(),
    )
    .await
    .unwrap();

    let used: BTreeSet<(String, String, String)> = stub
        .requests()
        .iter()
        .filter_map(|r| permission(&r.method, &r.path, &r.query))
        .collect();
    assert_eq!(used, granted());
    // Cilium's pools add exactly these (docs/cilium.md §5).
    let cilium: BTreeSet<(String, String, String)> = granted()
        .into_iter()
        .filter(|(group, _, _)| group == "cilium.io")
        .collect();
    let rule =
        |resource: &str, verb: &str| ("cilium.io".to_owned(), resource.to_owned(), verb.to_owned());
    assert_eq!(
        cilium,
        BTreeSet::from([
            rule("ciliumloadbalancerippools", "get"),
            rule("ciliumloadbalancerippools", "list"),
            rule("ciliumloadbalancerippools", "watch"),
            rule("ciliumloadbalancerippools/status", "patch"),
        ])
    );
}
