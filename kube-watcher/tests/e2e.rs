//! End to end against the cluster in `KUBECONFIG` (ignored by default):
//!
//! ```text
//! kubectl apply -f deploy/crd/crd.yaml
//! KUBECONFIG=~/.kube/config cargo test -p kube-watcher --test integration \
//!     e2e -- --ignored --nocapture
//! ```
//!
//! It needs a cluster where nothing else allocates LoadBalancer addresses
//! for Services of the class `kube-watcher.e2e/test`, and the rights of
//! `deploy/rbac.yaml` plus creating and deleting Namespaces,
//! IPAddressPools and Services. It creates the namespace
//! `kube-watcher-e2e`, a pool of TEST-NET-2 addresses (198.51.100.0/29) in
//! it and one Service of that class, runs a host in-process, checks the
//! address and the annotation, and deletes what it created.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, DeleteParams, PostParams};
use kube_watcher::{Host, HostConfig, IPAddressPoolResource};
use serde_json::json;

const NAMESPACE: &str = "kube-watcher-e2e";
const CLASS: &str = "kube-watcher.e2e/test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the cluster in KUBECONFIG with deploy/crd/crd.yaml applied"]
async fn allocates_on_a_real_cluster() {
    let client = kube::Client::try_default().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let pools: Api<IPAddressPoolResource> = Api::namespaced(client.clone(), NAMESPACE);
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
    let _ = namespaces.create(&PostParams::default(), &namespace).await;
    let pool: IPAddressPoolResource = serde_json::from_value(json!({
        "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": "kube-watcher-e2e", "namespace": NAMESPACE},
        "spec": {"addresses": ["198.51.100.0/29"], "avoidBuggyIPs": true,
                 "serviceAllocation": {"namespaces": [NAMESPACE]}}
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": NAMESPACE},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": CLASS,
                 "ports": [{"port": 80, "protocol": "TCP"}]}
    }))
    .unwrap();
    services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();

    let config = HostConfig::new("e2e", NAMESPACE)
        .lb_class(Some(CLASS.to_owned()))
        .lease_name("kube-watcher-e2e");
    let host = Host::start(client.clone(), config);
    let allocated = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let web = services.get("web").await.unwrap();
            let ips: Vec<String> = web
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|lb| lb.ingress)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|i| i.ip)
                .collect();
            if !ips.is_empty() {
                let pool = web
                    .metadata
                    .annotations
                    .unwrap_or_default()
                    .get("metallb.io/ip-allocated-from-pool")
                    .cloned();
                return (ips, pool);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    host.shutdown().await;
    let _ = services.delete("web", &DeleteParams::default()).await;
    let _ = pools
        .delete("kube-watcher-e2e", &DeleteParams::default())
        .await;
    let _ = namespaces.delete(NAMESPACE, &DeleteParams::default()).await;
    let (ips, pool) = allocated.expect("an address within 60s");
    assert_eq!(ips, ["198.51.100.1"]);
    assert_eq!(pool.as_deref(), Some("kube-watcher-e2e"));
}
