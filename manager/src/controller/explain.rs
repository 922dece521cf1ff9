//! `explain`: the decision for one Service, read from the store and the
//! allocator without changing either. The request is built as a
//! reconciliation builds it (`ServiceView`, the Namespace's labels), and
//! the allocator judges each pool with the checks it allocates with
//! ([`allocator::Allocator::explain`]), so the answer is the decision's own.

use std::collections::BTreeMap;
use std::net::IpAddr;

use allocator::{FamilyPolicy, Port};
use k8s_openapi::api::core::v1::Service;

use super::allocating::{labels_of, AllocatingController};
use super::service::{is_ours, status_ip_strings, ServiceView};
use crate::client::{pool_annotation, ConditionKind, ServiceCondition};

/// Why the controller leaves a Service alone (docs/allocation.md §4.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotHandled {
    /// Its `spec.type` is not `LoadBalancer` (`None`: unset, `ClusterIP`).
    NotLoadBalancer { service_type: Option<String> },
    /// Its `spec.loadBalancerClass` is not the one handled (`None`: no
    /// class).
    OtherClass {
        class: Option<String>,
        handled: Option<String>,
    },
}

/// What a Service asks for, as the controller reads it (§4.2, §4.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asks {
    /// `loadBalancerIPs` or `spec.loadBalancerIP`, or why they are invalid.
    pub addresses: Result<Vec<IpAddr>, String>,
    /// `address-pool`.
    pub pool: Option<String>,
    /// `allow-shared-ip` or Cilium's `sharing-key` (docs/cilium.md §4.2);
    /// empty: no sharing.
    pub sharing_key: String,
    /// Whose rule the key follows.
    pub sharing_rule: allocator::SharingRule,
    /// The namespaces the key may be shared with (`*`: any); `None`: any,
    /// without asking (a MetalLB key under `--sharing-across-namespaces
    /// allow`).
    pub sharing_namespaces: Option<Vec<String>>,
    /// The requested addresses come from `lbipam.cilium.io/ips`.
    pub cilium_request: bool,
    /// Warnings about Cilium annotations (ignored, or partly unreadable),
    /// as `(reason, message)`.
    pub warnings: Vec<(String, String)>,
    /// Empty for `externalTrafficPolicy: Cluster`, the pod selector for
    /// `Local`.
    pub backend_key: String,
    pub ports: Vec<Port>,
    /// From its cluster IPs; `None`: it has none.
    pub families: Option<FamilyPolicy>,
    /// `spec.ipFamilyPolicy`, `spec.ipFamilies` and the cluster IPs, as
    /// written.
    pub ip_family_policy: Option<String>,
    pub ip_families: Vec<String>,
    pub cluster_ips: Vec<String>,
    /// Old-prefix annotations in effect.
    pub deprecated: Vec<String>,
    /// The Service's labels and its Namespace's, for pool selectors.
    pub labels: BTreeMap<String, String>,
    pub namespace_labels: BTreeMap<String, String>,
}

/// What the Service's object shows it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shows {
    /// `status.loadBalancer.ingress[].ip`.
    pub ips: Vec<String>,
    /// The `metallb.io/ip-allocated-from-pool` annotation.
    pub pool: Option<String>,
    /// The `metallb.io/AddressAssigned` condition the controller wrote.
    pub condition: Option<ServiceCondition>,
    /// Cilium's `cilium.io/IPAMRequestSatisfied` condition.
    pub cilium_condition: Option<ServiceCondition>,
}

/// The decision for a handled Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// Each candidate pool and the outcome (docs/allocation.md §4.4).
    Pools(Box<allocator::Explanation>),
    /// No cluster IP: no family to give an address of (§4.3).
    NoClusterIp,
    /// The request is invalid (`LoadBalancerFailed`, §4.2): nothing new
    /// is given.
    Invalid(String),
}

/// Everything `explain` says about one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    pub key: String,
    /// `Ok` when the controller handles it.
    pub handled: Result<(), NotHandled>,
    pub asks: Asks,
    pub shows: Shows,
    /// `None` when it is not handled.
    pub judgement: Option<Judgement>,
}

impl AllocatingController {
    /// Explains the decision for the Service `key` as the store and the
    /// allocator stand; `None` when the store has no such Service.
    /// Changes nothing.
    pub fn explain(&self, key: &str) -> Option<Explanation> {
        let service = self.store.service(key)?;
        let view = ServiceView::new(&service, self.config.sharing_across_namespaces);
        let namespace = self.store.namespace(view.namespace);
        let namespace_labels = labels_of(&namespace);
        let lb_class = self.config.lb_class.as_deref();
        let handled = handled(&service, lb_class);
        let judgement = handled.is_ok().then(|| {
            let Some(families) = view.families else {
                return Judgement::NoClusterIp;
            };
            match &view.requested {
                Err(reason) => Judgement::Invalid(reason.clone()),
                Ok(requested) => {
                    let request = view.request(key, families, namespace_labels, requested);
                    Judgement::Pools(Box::new(self.read_allocator(|a| a.explain(&request))))
                }
            }
        });
        let spec = service.spec.as_ref();
        let asks = Asks {
            addresses: view.requested.clone(),
            pool: view.pool.map(str::to_owned),
            sharing_key: view.sharing_key.to_owned(),
            sharing_rule: view.sharing_rule,
            sharing_namespaces: view.sharing_namespaces.clone(),
            cilium_request: view.cilium_request,
            warnings: view
                .warnings
                .iter()
                .map(|w| (w.reason.to_owned(), w.message.clone()))
                .collect(),
            backend_key: view.backend_key.clone(),
            ports: view.ports.clone(),
            families: view.families,
            ip_family_policy: spec.and_then(|s| s.ip_family_policy.clone()),
            ip_families: spec.and_then(|s| s.ip_families.clone()).unwrap_or_default(),
            cluster_ips: cluster_ips(&service),
            deprecated: view.deprecated.iter().map(|d| (*d).to_owned()).collect(),
            labels: view.labels.clone(),
            namespace_labels: namespace_labels.clone(),
        };
        let shows = Shows {
            ips: status_ip_strings(&service),
            pool: pool_annotation(&service).map(str::to_owned),
            condition: ConditionKind::Assigned.shown(&service),
            cilium_condition: ConditionKind::Cilium.shown(&service),
        };
        Some(Explanation {
            key: key.to_owned(),
            handled,
            asks,
            shows,
            judgement,
        })
    }
}

/// Whether the controller handles `service`, or why not.
fn handled(service: &Service, lb_class: Option<&str>) -> Result<(), NotHandled> {
    if is_ours(service, lb_class) {
        return Ok(());
    }
    let spec = service.spec.as_ref();
    let service_type = spec.and_then(|s| s.type_.clone());
    if service_type.as_deref() != Some("LoadBalancer") {
        return Err(NotHandled::NotLoadBalancer { service_type });
    }
    let class = spec
        .and_then(|s| s.load_balancer_class.clone())
        .filter(|c| !c.is_empty());
    Err(NotHandled::OtherClass {
        class,
        handled: lb_class.filter(|c| !c.is_empty()).map(str::to_owned),
    })
}

/// `spec.clusterIPs`, or `spec.clusterIP` where there is no list.
fn cluster_ips(service: &Service) -> Vec<String> {
    let spec = service.spec.as_ref();
    match spec
        .and_then(|s| s.cluster_ips.clone())
        .filter(|ips| !ips.is_empty())
    {
        Some(ips) => ips,
        None => spec
            .and_then(|s| s.cluster_ip.clone())
            .into_iter()
            .collect(),
    }
}
