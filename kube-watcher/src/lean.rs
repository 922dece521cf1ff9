//! What the host keeps of each watched object: only the fields the rules
//! and the host read, trimmed on the watch stream before the reflector
//! stores it.
//!
//! A Service as the API server sends it carries `managedFields`, often a
//! `kubectl.kubernetes.io/last-applied-configuration` copy of itself, and
//! spec fields no allocation rule looks at; kept whole, they are most of
//! the process at 100k Services. What is kept (see
//! `manager/src/controller/service.rs` and the host's client):
//!
//! - metadata: name, namespace, uid, generation (a condition's
//!   observedGeneration), resourceVersion, creationTimestamp
//!   (the delivery order), deletionTimestamp, labels (pool selectors), and
//!   only the `metallb.io/` and `metallb.universe.tf/` annotations (the
//!   requests and the pool annotation);
//! - spec: type, loadBalancerClass, loadBalancerIP, clusterIP(s),
//!   ipFamilies, ipFamilyPolicy, externalTrafficPolicy, the selector when
//!   that policy is `Local` (it keys address sharing then), and each port's
//!   protocol and number;
//! - status: `loadBalancer` and `conditions`.
//!
//! Namespaces keep name, uid, resourceVersion and labels; pools of both
//! kinds everything but `managedFields` and annotations (there are few of
//! them).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Service, ServicePort, ServiceSpec, ServiceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::cilium::CiliumPoolResource;
use crate::crd::IPAddressPoolResource;

/// The annotation prefixes a Service is read under.
pub(crate) const KEPT_ANNOTATION_PREFIXES: [&str; 2] = ["metallb.io/", "metallb.universe.tf/"];

/// The identity, order and selection fields of `metadata`, and its
/// annotations filtered by `keep`.
fn lean_metadata(metadata: &mut ObjectMeta, keep: impl Fn(&str) -> bool) {
    let annotations: Option<BTreeMap<String, String>> =
        metadata.annotations.take().and_then(|mut annotations| {
            annotations.retain(|key, _| keep(key));
            (!annotations.is_empty()).then_some(annotations)
        });
    *metadata = ObjectMeta {
        name: metadata.name.take(),
        namespace: metadata.namespace.take(),
        uid: metadata.uid.take(),
        // A condition's observedGeneration.
        generation: metadata.generation.take(),
        resource_version: metadata.resource_version.take(),
        creation_timestamp: metadata.creation_timestamp.take(),
        deletion_timestamp: metadata.deletion_timestamp.take(),
        labels: metadata.labels.take(),
        annotations,
        ..ObjectMeta::default()
    };
}

/// Trims `service` to what the rules read.
pub(crate) fn service(service: &mut Service) {
    lean_metadata(&mut service.metadata, |key| {
        KEPT_ANNOTATION_PREFIXES
            .iter()
            .any(|prefix| key.starts_with(prefix))
    });
    if let Some(spec) = service.spec.as_mut() {
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        *spec = ServiceSpec {
            type_: spec.type_.take(),
            load_balancer_class: spec.load_balancer_class.take(),
            load_balancer_ip: spec.load_balancer_ip.take(),
            cluster_ip: spec.cluster_ip.take(),
            cluster_ips: spec.cluster_ips.take(),
            ip_families: spec.ip_families.take(),
            ip_family_policy: spec.ip_family_policy.take(),
            external_traffic_policy: spec.external_traffic_policy.take(),
            selector: if local { spec.selector.take() } else { None },
            ports: spec.ports.take().map(|ports| {
                ports
                    .into_iter()
                    .map(|port| ServicePort {
                        port: port.port,
                        protocol: port.protocol,
                        ..ServicePort::default()
                    })
                    .collect()
            }),
            ..ServiceSpec::default()
        };
    }
    if let Some(status) = service.status.as_mut() {
        *status = ServiceStatus {
            load_balancer: status.load_balancer.take(),
            conditions: status.conditions.take(),
        };
    }
}

/// Trims `namespace` to its identity and labels.
pub(crate) fn namespace(namespace: &mut Namespace) {
    lean_metadata(&mut namespace.metadata, |_| false);
    namespace.spec = None;
    namespace.status = None;
}

/// Drops a pool's `managedFields` and annotations.
pub(crate) fn pool(pool: &mut IPAddressPoolResource) {
    lean_metadata(&mut pool.metadata, |_| false);
}

/// Drops a Cilium pool's `managedFields` and annotations; its status stays
/// whole (its conditions are read-modify-written, docs/cilium.md §2.8).
pub(crate) fn cilium_pool(pool: &mut CiliumPoolResource) {
    lean_metadata(&mut pool.0.metadata, |_| false);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_service_keeps_what_the_rules_read() {
        let mut full: Service = serde_json::from_value(json!({
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
                "generation": 3,
                "creationTimestamp": "2024-01-01T00:00:00Z",
                "labels": {"app": "web"},
                "annotations": {
                    "metallb.io/loadBalancerIPs": "10.0.0.1",
                    "metallb.universe.tf/allow-shared-ip": "k",
                    "metallb.io/ip-allocated-from-pool": "default",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"a\": \"long copy\"}"
                },
                "managedFields": [{"manager": "kubectl", "operation": "Apply",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "o"}],
                "finalizers": ["service.kubernetes.io/load-balancer-cleanup"]
            },
            "spec": {
                "type": "LoadBalancer", "loadBalancerClass": "c",
                "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "externalTrafficPolicy": "Cluster", "selector": {"app": "web"},
                "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
                "allocateLoadBalancerNodePorts": true,
                "ports": [{"name": "http", "port": 80, "protocol": "TCP",
                           "targetPort": 8080, "nodePort": 30080}]
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]},
                       "conditions": [{"type": "X", "status": "True", "reason": "R",
                                       "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"}]}
        }))
        .unwrap();
        service(&mut full);
        assert_eq!(
            serde_json::to_value(&full).unwrap(),
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {
                    "name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
                    "generation": 3,
                    "creationTimestamp": "2024-01-01T00:00:00Z",
                    "labels": {"app": "web"},
                    "annotations": {
                        "metallb.io/loadBalancerIPs": "10.0.0.1",
                        "metallb.universe.tf/allow-shared-ip": "k",
                        "metallb.io/ip-allocated-from-pool": "default"
                    }
                },
                "spec": {
                    "type": "LoadBalancer", "loadBalancerClass": "c",
                    "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                    "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                    "externalTrafficPolicy": "Cluster",
                    "ports": [{"port": 80, "protocol": "TCP"}]
                },
                "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]},
                           "conditions": [{"type": "X", "status": "True", "reason": "R",
                                           "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"}]}
            })
        );
    }

    #[test]
    fn a_local_service_keeps_its_selector_and_others_lose_their_annotations() {
        let mut local: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "annotations": {"other": "x"}},
            "spec": {"externalTrafficPolicy": "Local", "selector": {"app": "web"}}
        }))
        .unwrap();
        service(&mut local);
        let spec = local.spec.unwrap();
        assert_eq!(spec.selector.unwrap()["app"], "web");
        assert_eq!(local.metadata.annotations, None);

        let mut ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": "shop", "labels": {"team": "a"},
                         "annotations": {"a": "b"}, "managedFields": [{"manager": "m"}]},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}
        }))
        .unwrap();
        namespace(&mut ns);
        assert_eq!(
            serde_json::to_value(&ns).unwrap(),
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "shop", "labels": {"team": "a"}}})
        );
    }
}
