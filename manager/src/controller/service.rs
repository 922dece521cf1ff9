//! Reading a Service the way docs/allocation.md §4.1–4.3 does: is it ours, what does
//! it ask for (annotations under both prefixes), which families, ports and
//! keys it has, and what its status holds.

use std::collections::BTreeMap;
use std::net::IpAddr;

use allocator::{Family, FamilyPolicy, Port, Protocol, Request, Subject};
use k8s_openapi::api::core::v1::Service;

use crate::client::POOL_ANNOTATION;

/// The annotations a Service may ask with, as (new key, old key).
const IPS: (&str, &str) = (
    "metallb.io/loadBalancerIPs",
    "metallb.universe.tf/loadBalancerIPs",
);
const POOL: (&str, &str) = (
    "metallb.io/address-pool",
    "metallb.universe.tf/address-pool",
);
const SHARING: (&str, &str) = (
    "metallb.io/allow-shared-ip",
    "metallb.universe.tf/allow-shared-ip",
);

/// Labels of an object without any.
pub(crate) static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// An annotation under either prefix: the new one wins.
struct Annotation<'a> {
    value: Option<&'a str>,
    /// The old-prefix key, when that is the one in effect.
    deprecated: Option<&'static str>,
}

fn annotation<'a>(
    service: &'a Service,
    (new, old): (&'static str, &'static str),
) -> Annotation<'a> {
    let annotations = service.metadata.annotations.as_ref();
    let get = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    match (get(new), get(old)) {
        (Some(value), _) => Annotation {
            value: Some(value),
            deprecated: None,
        },
        (None, Some(value)) => Annotation {
            value: Some(value),
            deprecated: Some(old),
        },
        (None, None) => Annotation {
            value: None,
            deprecated: None,
        },
    }
}

/// Whether the Service is one this controller handles (§4.1).
pub(crate) fn is_ours(service: &Service, lb_class: Option<&str>) -> bool {
    let Some(spec) = service.spec.as_ref() else {
        return false;
    };
    // An empty class, on the Service or the host, is no class
    // (docs/allocation.md §4.1).
    let host_class = lb_class.filter(|c| !c.is_empty());
    spec.type_.as_deref() == Some("LoadBalancer")
        && spec
            .load_balancer_class
            .as_deref()
            .filter(|c| !c.is_empty())
            == host_class
}

/// What a Service asks for and is, in plain values for the allocator,
/// borrowed from the Service (a reconciliation copies nothing it need not).
#[derive(Debug)]
pub(crate) struct ServiceView<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) labels: &'a BTreeMap<String, String>,
    /// `None`: no cluster IP, no address can be given.
    pub(crate) families: Option<FamilyPolicy>,
    /// The requested addresses, or why the request is invalid.
    pub(crate) requested: Result<Vec<IpAddr>, String>,
    pub(crate) pool: Option<&'a str>,
    pub(crate) sharing_key: &'a str,
    pub(crate) backend_key: String,
    pub(crate) ports: Vec<Port>,
    /// Old-prefix annotations in effect, for `DeprecatedAnnotation`.
    pub(crate) deprecated: Vec<&'static str>,
}

impl<'a> ServiceView<'a> {
    pub(crate) fn new(service: &'a Service) -> ServiceView<'a> {
        let spec = service.spec.as_ref();
        let ips = annotation(service, IPS);
        let pool = annotation(service, POOL);
        let sharing = annotation(service, SHARING);
        let deprecated = [&ips, &pool, &sharing]
            .iter()
            .filter_map(|a| a.deprecated)
            .collect();
        let requested =
            requested_addresses(ips.value, spec.and_then(|s| s.load_balancer_ip.as_deref()));
        let local = spec.and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
        let backend_key = match spec.and_then(|s| s.selector.as_ref()) {
            Some(selector) if local => selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
            _ => String::new(),
        };
        let ports = spec
            .and_then(|s| s.ports.as_ref())
            .map(|ports| {
                ports
                    .iter()
                    .map(|p| Port {
                        protocol: Protocol::from_k8s(p.protocol.as_deref()),
                        port: p.port,
                    })
                    .collect()
            })
            .unwrap_or_default();
        ServiceView {
            namespace: service.metadata.namespace.as_deref().unwrap_or_default(),
            labels: service.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            families: families(service),
            requested,
            pool: pool.value.map(str::trim).filter(|p| !p.is_empty()),
            sharing_key: sharing.value.unwrap_or_default().trim(),
            backend_key,
            ports,
            deprecated,
        }
    }
}

impl<'a> ServiceView<'a> {
    /// The allocator's view of this Service, with `requested` addresses
    /// and its Namespace's labels.
    pub(crate) fn request(
        &'a self,
        key: &'a str,
        families: FamilyPolicy,
        namespace_labels: &'a BTreeMap<String, String>,
        requested: &'a [IpAddr],
    ) -> Request<'a> {
        Request {
            key,
            subject: Subject {
                namespace: self.namespace,
                labels: self.labels,
                namespace_labels,
            },
            families,
            sharing_key: self.sharing_key,
            backend_key: &self.backend_key,
            ports: &self.ports,
            pool: self.pool,
            addresses: requested,
        }
    }
}

/// The requested addresses (§4.2): the annotation or `spec.loadBalancerIP`,
/// at most one per family.
fn requested_addresses(
    annotation: Option<&str>,
    spec_ip: Option<&str>,
) -> Result<Vec<IpAddr>, String> {
    let annotation = annotation.map(str::trim).filter(|a| !a.is_empty());
    let spec_ip = spec_ip.map(str::trim).filter(|a| !a.is_empty());
    let (source, text) = match (annotation, spec_ip) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "both the {} annotation and spec.loadBalancerIP are set",
                IPS.0
            ))
        }
        (Some(text), None) => ("the loadBalancerIPs annotation", text),
        (None, Some(text)) => ("spec.loadBalancerIP", text),
        (None, None) => return Ok(Vec::new()),
    };
    let mut ips: Vec<IpAddr> = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let ip: IpAddr = part
            .parse()
            .map_err(|_| format!("{source}: {:?} is not an IP address", shortened(part)))?;
        if ips.iter().any(|other| other.is_ipv4() == ip.is_ipv4()) {
            return Err(format!(
                "{source}: more than one {} address",
                Family::of(ip)
            ));
        }
        ips.push(ip);
    }
    Ok(ips)
}

/// `text`, cut to a length an Event message can carry.
pub(crate) fn shortened(text: &str) -> String {
    const LIMIT: usize = 64;
    match text.char_indices().nth(LIMIT) {
        Some((end, _)) => format!("{}…", text.get(..end).unwrap_or_default()),
        None => text.to_owned(),
    }
}

/// The families of a Service from its cluster IPs (§4.3).
fn families(service: &Service) -> Option<FamilyPolicy> {
    let spec = service.spec.as_ref()?;
    let listed: Vec<&String> = match spec.cluster_ips.as_ref().filter(|ips| !ips.is_empty()) {
        Some(ips) => ips.iter().collect(),
        None => spec.cluster_ip.iter().collect(),
    };
    let mut found: Vec<Family> = Vec::new();
    for ip in listed.iter().filter_map(|ip| ip.parse::<IpAddr>().ok()) {
        let family = Family::of(ip);
        if !found.contains(&family) {
            found.push(family);
        }
    }
    match found.as_slice() {
        [] => None,
        [family] => Some(FamilyPolicy::Single(*family)),
        [first, ..] => Some(match spec.ip_family_policy.as_deref() {
            Some("PreferDualStack") => {
                let primary = spec
                    .ip_families
                    .as_ref()
                    .and_then(|f| f.first())
                    .map(|f| if f == "IPv6" { Family::V6 } else { Family::V4 })
                    .unwrap_or(*first);
                FamilyPolicy::PreferDual { primary }
            }
            _ => FamilyPolicy::RequireDual,
        }),
    }
}

/// The `ip` of every ingress entry that has one, as written, in order.
pub(crate) fn status_texts(service: &Service) -> impl Iterator<Item = &str> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i.ip.as_deref())
        .filter(|ip| !ip.is_empty())
}

/// [`status_texts`], owned.
pub(crate) fn status_ip_strings(service: &Service) -> Vec<String> {
    status_texts(service).map(str::to_owned).collect()
}

/// The status addresses (from [`status_ip_strings`]) parsed; an entry that
/// does not parse is an error (it cannot be kept).
pub(crate) fn parse_status(texts: &[String]) -> Result<Vec<IpAddr>, String> {
    texts
        .iter()
        .map(|text| {
            text.parse()
                .map_err(|_| format!("status address {:?} is not an IP address", shortened(text)))
        })
        .collect()
}

/// Whether `status.loadBalancer.ingress` shows exactly `ips`, in order and
/// written as the controller writes them (so no write would change it).
pub(crate) fn status_shows(service: &Service, ips: &[IpAddr]) -> bool {
    let mut shown = status_texts(service);
    let matches = ips.iter().all(|ip| {
        shown.next().is_some_and(|text| match ip {
            // IPv4 text parses only in its one canonical form.
            IpAddr::V4(v4) => text.parse::<std::net::Ipv4Addr>().is_ok_and(|t| t == *v4),
            IpAddr::V6(_) => ip.to_string() == text,
        })
    });
    matches && shown.next().is_none()
}

/// Whether two Services are the same but for what the controller writes
/// (the status and the pool annotation) and what the API server stamps on
/// every write (resourceVersion, managedFields).
pub(crate) fn same_but_written(old: &Service, new: &Service) -> bool {
    fn others(
        annotations: &Option<BTreeMap<String, String>>,
    ) -> impl Iterator<Item = (&String, &String)> {
        annotations
            .iter()
            .flatten()
            .filter(|(key, _)| key.as_str() != POOL_ANNOTATION)
    }
    let (a, b) = (&old.metadata, &new.metadata);
    old.spec == new.spec
        && a.name == b.name
        && a.namespace == b.namespace
        && a.uid == b.uid
        && a.labels == b.labels
        && a.deletion_timestamp == b.deletion_timestamp
        && others(&a.annotations).eq(others(&b.annotations))
}

/// The pool annotation the controller wrote, if any.
pub(crate) fn pool_annotation(service: &Service) -> Option<&str> {
    service
        .metadata
        .annotations
        .as_ref()?
        .get(POOL_ANNOTATION)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceSpec;

    fn service(annotations: &[(&str, &str)], spec: ServiceSpec) -> Service {
        let mut service = Service::default();
        service.metadata.name = Some("web".into());
        service.metadata.namespace = Some("ns".into());
        service.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        service.spec = Some(spec);
        service
    }

    fn lb(cluster_ips: &[&str]) -> ServiceSpec {
        ServiceSpec {
            type_: Some("LoadBalancer".into()),
            cluster_ips: Some(cluster_ips.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn new_prefix_wins_and_old_prefix_is_reported() {
        let svc = service(
            &[
                ("metallb.io/address-pool", "new"),
                ("metallb.universe.tf/address-pool", "old"),
                ("metallb.universe.tf/allow-shared-ip", "k"),
            ],
            lb(&["10.96.0.1"]),
        );
        let view = ServiceView::new(&svc);
        assert_eq!(view.pool, Some("new"));
        assert_eq!(view.sharing_key, "k");
        assert_eq!(view.deprecated, ["metallb.universe.tf/allow-shared-ip"]);
    }

    #[test]
    fn requested_addresses_rules() {
        let ok = |a: &str| requested_addresses(Some(a), None);
        assert_eq!(ok(" 10.0.0.1 , fd00::1 ").unwrap().len(), 2);
        assert!(ok("10.0.0.1,10.0.0.2")
            .unwrap_err()
            .contains("more than one IPv4"));
        assert!(ok("10.0.0.1,fd00::1,10.0.0.3").is_err());
        assert!(ok("10.0.0.1:80").is_err());
        assert!(ok("fe80::1%eth0").is_err());
        assert!(ok("10.0.0.1,").is_err());
        assert_eq!(ok("  ").unwrap(), Vec::<IpAddr>::new());
        assert!(requested_addresses(Some("10.0.0.1"), Some("10.0.0.1"))
            .unwrap_err()
            .contains("both"));
        assert_eq!(
            requested_addresses(None, Some("10.0.0.1")).unwrap().len(),
            1
        );
        assert!(requested_addresses(None, Some("nope")).is_err());
    }

    #[test]
    fn families_from_cluster_ips() {
        let single = lb(&["fd00::1"]);
        assert_eq!(
            families(&service(&[], single)),
            Some(FamilyPolicy::Single(Family::V6))
        );
        let mut prefer = lb(&["fd00::1", "10.96.0.1"]);
        prefer.ip_family_policy = Some("PreferDualStack".into());
        prefer.ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
        assert_eq!(
            families(&service(&[], prefer)),
            Some(FamilyPolicy::PreferDual {
                primary: Family::V6
            })
        );
        assert_eq!(
            families(&service(&[], lb(&["10.96.0.1", "fd00::1"]))),
            Some(FamilyPolicy::RequireDual)
        );
        assert_eq!(families(&service(&[], lb(&["None"]))), None);
        let mut old = lb(&[]);
        old.cluster_ips = None;
        old.cluster_ip = Some("10.96.0.9".into());
        assert_eq!(
            families(&service(&[], old)),
            Some(FamilyPolicy::Single(Family::V4))
        );
    }

    #[test]
    fn class_and_type() {
        let mut spec = lb(&["10.96.0.1"]);
        assert!(is_ours(&service(&[], spec.clone()), None));
        spec.load_balancer_class = Some("other".into());
        assert!(!is_ours(&service(&[], spec.clone()), None));
        assert!(is_ours(&service(&[], spec.clone()), Some("other")));
        spec.type_ = Some("ClusterIP".into());
        assert!(!is_ours(&service(&[], spec), Some("other")));
    }

    #[test]
    fn backend_key_only_for_local() {
        let mut spec = lb(&["10.96.0.1"]);
        spec.selector = Some([("app".to_string(), "web".to_string())].into());
        assert_eq!(
            ServiceView::new(&service(&[], spec.clone())).backend_key,
            ""
        );
        spec.external_traffic_policy = Some("Local".into());
        assert_eq!(ServiceView::new(&service(&[], spec)).backend_key, "app=web");
    }
}
