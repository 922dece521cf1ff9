//! Reading a Service the way docs/allocation.md §4.1–4.3 does: is it ours, what does
//! it ask for (annotations under both prefixes), which families, ports and
//! keys it has, and what its status holds.

use std::collections::BTreeMap;
use std::net::IpAddr;

use allocator::{
    Family, FamilyPolicy, Port, Protocol, Request, SharingNamespaces, SharingRule, Subject,
};
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

/// Cilium's LB-IPAM annotations, as (name, older alias) (docs/cilium.md §3.2).
pub(crate) const CILIUM_IPS: (&str, &str) = ("lbipam.cilium.io/ips", "io.cilium/lb-ipam-ips");
pub(crate) const CILIUM_SHARING: (&str, &str) = (
    "lbipam.cilium.io/sharing-key",
    "io.cilium/lb-ipam-sharing-key",
);
pub(crate) const CILIUM_CROSS_NAMESPACE: (&str, &str) = (
    "lbipam.cilium.io/sharing-cross-namespace",
    "io.cilium/lb-ipam-sharing-cross-namespace",
);

/// Warning Event reasons of the annotation reading (docs/cilium.md §3.2,
/// §4.2).
pub(crate) const INVALID_ANNOTATION_VALUE: &str = "InvalidAnnotationValue";
pub(crate) const IGNORED_ANNOTATION: &str = "IgnoredAnnotation";

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

/// A Cilium annotation (docs/cilium.md §3.2): the first name present wins,
/// even with an empty value (which then hides the alias); an empty value
/// is no annotation. The name in effect and the value.
fn cilium_annotation<'a>(
    service: &'a Service,
    (name, alias): (&'static str, &'static str),
) -> Option<(&'static str, &'a str)> {
    let annotations = service.metadata.annotations.as_ref()?;
    let (name, value) = match annotations.get(name) {
        Some(value) => (name, value),
        None => (alias, annotations.get(alias)?),
    };
    (!value.is_empty()).then_some((name, value.as_str()))
}

/// Whether a MetalLB sharing key may be shared across namespaces (the
/// host's `--sharing-across-namespaces`, docs/cilium.md §3.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SharingAcrossNamespaces {
    /// Any namespace, as MetalLB does.
    #[default]
    Allow,
    /// Only namespaces that both Services list in
    /// `lbipam.cilium.io/sharing-cross-namespace`, as for Cilium keys.
    Annotated,
}

/// A Warning about an annotation the Service carries, announced with the
/// next write of its addresses (docs/cilium.md §3.2, §4.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AnnotationWarning {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// What a Service asks for and is, in plain values for the allocator,
/// borrowed from the Service (a reconciliation copies nothing it need not).
#[derive(Debug)]
pub(crate) struct ServiceView<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) name: &'a str,
    pub(crate) labels: &'a BTreeMap<String, String>,
    /// `None`: no cluster IP, no address can be given.
    pub(crate) families: Option<FamilyPolicy>,
    /// The requested addresses, or why the request is invalid.
    pub(crate) requested: Result<Vec<IpAddr>, String>,
    /// The requested addresses come from `lbipam.cilium.io/ips`.
    pub(crate) cilium_request: bool,
    pub(crate) pool: Option<&'a str>,
    pub(crate) sharing_key: &'a str,
    pub(crate) sharing_rule: SharingRule,
    /// The namespaces the key may be shared with (`*`: any); `None`: any
    /// namespace, without asking.
    pub(crate) sharing_namespaces: Option<Vec<String>>,
    pub(crate) backend_key: String,
    pub(crate) ports: Vec<Port>,
    /// Old-prefix annotations in effect, for `DeprecatedAnnotation`.
    pub(crate) deprecated: Vec<&'static str>,
    /// Cilium annotations ignored or partly unreadable.
    pub(crate) warnings: Vec<AnnotationWarning>,
}

impl<'a> ServiceView<'a> {
    pub(crate) fn new(service: &'a Service, across: SharingAcrossNamespaces) -> ServiceView<'a> {
        let namespace = service.metadata.namespace.as_deref().unwrap_or_default();
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let ips = annotation(service, IPS);
        let pool = annotation(service, POOL);
        let sharing = annotation(service, SHARING);
        let deprecated = [&ips, &pool, &sharing]
            .iter()
            .filter_map(|a| a.deprecated)
            .collect();
        let mut warnings = Vec::new();
        let (requested, cilium_request) = requested_of(service, &ips, &mut warnings);
        let (sharing_key, sharing_rule) = sharing_key_of(service, &sharing, &mut warnings);
        ServiceView {
            namespace,
            name,
            labels: service.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            families: families_asked(service, &requested, cilium_request),
            requested,
            cilium_request,
            pool: pool.value.map(str::trim).filter(|p| !p.is_empty()),
            sharing_key,
            sharing_rule,
            sharing_namespaces: sharing_namespaces_of(service, sharing_rule, across),
            backend_key: backend_key_of(service, sharing_rule, namespace, name),
            ports: ports_of(service),
            deprecated,
            warnings,
        }
    }
}

/// The requested addresses (MetalLB's annotation or `spec.loadBalancerIP`,
/// else Cilium's annotation; MetalLB's wins and Cilium's is ignored with a
/// Warning), and whether they come from Cilium's annotation.
fn requested_of(
    service: &Service,
    ips: &Annotation<'_>,
    warnings: &mut Vec<AnnotationWarning>,
) -> (Result<Vec<IpAddr>, String>, bool) {
    let spec_ip = service
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_ip.as_deref());
    let metallb_ips = ips.value.filter(|v| !v.trim().is_empty());
    match (metallb_ips, cilium_annotation(service, CILIUM_IPS)) {
        (Some(_), Some((cilium, _))) => {
            warnings.push(ignored(cilium, ips.deprecated.unwrap_or(IPS.0)));
            (requested_addresses(ips.value, spec_ip), false)
        }
        (None, Some((name, value))) => (cilium_requested(name, value, spec_ip, warnings), true),
        (_, None) => (requested_addresses(ips.value, spec_ip), false),
    }
}

/// The sharing key and whose rule it follows: MetalLB's key wins, and
/// Cilium's is then ignored with a Warning.
fn sharing_key_of<'a>(
    service: &'a Service,
    sharing: &Annotation<'a>,
    warnings: &mut Vec<AnnotationWarning>,
) -> (&'a str, SharingRule) {
    let metallb_key = sharing.value.unwrap_or_default().trim();
    match cilium_annotation(service, CILIUM_SHARING) {
        Some((cilium, _)) if !metallb_key.is_empty() => {
            warnings.push(ignored(cilium, sharing.deprecated.unwrap_or(SHARING.0)));
            (metallb_key, SharingRule::MetalLb)
        }
        // Cilium's key is taken raw, not trimmed (docs/cilium.md §3.2).
        Some((_, key)) => (key, SharingRule::Cilium),
        None => (metallb_key, SharingRule::MetalLb),
    }
}

/// The namespaces the key may be shared with; `None`: any, without asking.
fn sharing_namespaces_of(
    service: &Service,
    rule: SharingRule,
    across: SharingAcrossNamespaces,
) -> Option<Vec<String>> {
    match (rule, across) {
        (SharingRule::MetalLb, SharingAcrossNamespaces::Allow) => None,
        (SharingRule::MetalLb, SharingAcrossNamespaces::Annotated) | (SharingRule::Cilium, _) => {
            Some(
                cilium_annotation(service, CILIUM_CROSS_NAMESPACE)
                    .map(|(_, value)| cross_namespaces(value))
                    .unwrap_or_default(),
            )
        }
    }
}

/// What Services sharing an address must have in common besides the key:
/// with externalTrafficPolicy Local, the selector.
fn backend_key_of(service: &Service, rule: SharingRule, namespace: &str, name: &str) -> String {
    let spec = service.spec.as_ref();
    let local = spec.and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
    let selector = spec.and_then(|s| s.selector.as_ref());
    match selector {
        Some(selector) if local && !(rule == SharingRule::Cilium && selector.is_empty()) => {
            selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        }
        // Cilium never shares a Local Service without a selector
        // (docs/cilium.md §3.4 rule 5): a key no other Service has
        // (no label selector contains a parenthesis).
        _ if local && rule == SharingRule::Cilium => format!("(no selector) {namespace}/{name}"),
        _ => String::new(),
    }
}

fn ports_of(service: &Service) -> Vec<Port> {
    service
        .spec
        .as_ref()
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
        .unwrap_or_default()
}

/// The families the Service asks for; `None`: no cluster IP.
fn families_asked(
    service: &Service,
    requested: &Result<Vec<IpAddr>, String>,
    cilium_request: bool,
) -> Option<FamilyPolicy> {
    match requested {
        // Cilium ignores the family policy once addresses are requested
        // (docs/cilium.md §3.3): they are the families.
        Ok(ips) if cilium_request && !ips.is_empty() => {
            families(service).map(|_| requested_families(ips))
        }
        _ => families(service),
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
            subject: self.subject(namespace_labels),
            families,
            sharing_key: self.sharing_key,
            sharing_rule: self.sharing_rule,
            sharing_namespaces: match &self.sharing_namespaces {
                Some(listed) => SharingNamespaces::Listed(listed),
                None => SharingNamespaces::Any,
            },
            backend_key: &self.backend_key,
            ports: &self.ports,
            pool: self.pool,
            addresses: requested,
        }
    }

    /// What the pools' selectors look at.
    pub(crate) fn subject(&'a self, namespace_labels: &'a BTreeMap<String, String>) -> Subject<'a> {
        Subject {
            name: self.name,
            namespace: self.namespace,
            labels: self.labels,
            namespace_labels,
        }
    }
}

/// `annotation "<ignored>" is ignored: "<winner>" is set` (docs/cilium.md
/// §4.2).
fn ignored(ignored: &str, winner: &str) -> AnnotationWarning {
    AnnotationWarning {
        reason: IGNORED_ANNOTATION,
        message: format!("annotation {ignored:?} is ignored: {winner:?} is set"),
    }
}

/// The namespaces of `lbipam.cilium.io/sharing-cross-namespace`: split on
/// commas, trimmed (Cilium v1.21), empty entries dropped.
fn cross_namespaces(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The addresses Cilium's annotation `name` (value `value`) requests
/// (docs/cilium.md §3.3): `spec.loadBalancerIP`, then the annotation's;
/// a part that is no address is skipped with a Warning. Duplicates are
/// dropped (Cilium drops adjacent ones; with at most one address per
/// family the two agree). This allocator holds one address per family
/// (docs/cilium.md §10): more is an invalid request naming the limit.
fn cilium_requested(
    name: &str,
    value: &str,
    spec_ip: Option<&str>,
    warnings: &mut Vec<AnnotationWarning>,
) -> Result<Vec<IpAddr>, String> {
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut from_spec = false;
    let mut unreadable = |source: String, part: &str| {
        warnings.push(AnnotationWarning {
            reason: INVALID_ANNOTATION_VALUE,
            message: format!(
                "{source}: {:?} is not an IP address; ignored",
                shortened(part)
            ),
        });
    };
    if let Some(text) = spec_ip.map(str::trim).filter(|t| !t.is_empty()) {
        match text.parse() {
            Ok(ip) => {
                ips.push(ip);
                from_spec = true;
            }
            Err(_) => unreadable("spec.loadBalancerIP".to_owned(), text),
        }
    }
    for part in value.split(',').map(str::trim) {
        match part.parse::<IpAddr>() {
            Ok(ip) if ips.contains(&ip) => {}
            Ok(ip) => ips.push(ip),
            Err(_) => unreadable(format!("annotation {name:?}"), part),
        }
    }
    for family in [Family::V4, Family::V6] {
        let count = ips.iter().filter(|ip| Family::of(**ip) == family).count();
        if count > 1 {
            let source = if from_spec {
                format!("spec.loadBalancerIP and {name} request")
            } else {
                format!("{name} requests")
            };
            return Err(format!(
                "{source} {count} {family} addresses; this allocator holds one address per family"
            ));
        }
    }
    Ok(ips)
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

/// The families of a set of requested addresses (at most one of each).
fn requested_families(ips: &[IpAddr]) -> FamilyPolicy {
    match (
        ips.iter().any(IpAddr::is_ipv4),
        ips.iter().any(IpAddr::is_ipv6),
    ) {
        (true, true) => FamilyPolicy::RequireDual,
        (false, true) => FamilyPolicy::Single(Family::V6),
        _ => FamilyPolicy::Single(Family::V4),
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
        let view = ServiceView::new(&svc, SharingAcrossNamespaces::Allow);
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

    fn view(svc: &Service) -> ServiceView<'_> {
        ServiceView::new(svc, SharingAcrossNamespaces::Allow)
    }

    fn messages(view: &ServiceView<'_>) -> Vec<String> {
        view.warnings
            .iter()
            .map(|w| format!("{}: {}", w.reason, w.message))
            .collect()
    }

    #[test]
    fn cilium_name_wins_over_alias_even_empty() {
        let svc = service(
            &[
                ("lbipam.cilium.io/ips", ""),
                ("io.cilium/lb-ipam-ips", "10.0.0.1"),
            ],
            lb(&["10.96.0.1"]),
        );
        let v = view(&svc);
        assert_eq!(v.requested, Ok(vec![]));
        assert!(!v.cilium_request);
        let svc = service(&[("io.cilium/lb-ipam-ips", "10.0.0.1")], lb(&["10.96.0.1"]));
        let v = view(&svc);
        assert_eq!(v.requested, Ok(vec!["10.0.0.1".parse().unwrap()]));
        assert!(v.cilium_request);
    }

    #[test]
    fn cilium_ips_skip_unparsable_parts_with_a_warning() {
        let svc = service(
            &[("lbipam.cilium.io/ips", " 10.0.0.300 , 10.0.0.1,,fd00::1 ")],
            lb(&["10.96.0.1"]),
        );
        let v = view(&svc);
        let ips: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        assert_eq!(v.requested, Ok(ips));
        assert_eq!(
            messages(&v),
            [
                r#"InvalidAnnotationValue: annotation "lbipam.cilium.io/ips": "10.0.0.300" is not an IP address; ignored"#,
                r#"InvalidAnnotationValue: annotation "lbipam.cilium.io/ips": "" is not an IP address; ignored"#,
            ]
        );
    }

    #[test]
    fn cilium_ips_join_spec_load_balancer_ip() {
        let mut spec = lb(&["10.96.0.1"]);
        spec.load_balancer_ip = Some("10.0.0.1".into());
        // The same address twice is one.
        let svc = service(
            &[("lbipam.cilium.io/ips", "10.0.0.1,fd00::1")],
            spec.clone(),
        );
        let v = view(&svc);
        assert_eq!(v.requested.as_ref().map(Vec::len), Ok(2));
        // Two of a family: beyond what this allocator holds.
        let svc = service(&[("lbipam.cilium.io/ips", "10.0.0.2")], spec.clone());
        assert_eq!(
            view(&svc).requested,
            Err(
                "spec.loadBalancerIP and lbipam.cilium.io/ips request 2 IPv4 addresses; \
                 this allocator holds one address per family"
                    .to_owned()
            )
        );
        let svc = service(
            &[("io.cilium/lb-ipam-ips", "fd00::1,fd00::2,fd00::3")],
            lb(&["10.96.0.1"]),
        );
        assert_eq!(
            view(&svc).requested,
            Err("io.cilium/lb-ipam-ips requests 3 IPv6 addresses; \
                 this allocator holds one address per family"
                .to_owned())
        );
        // An unreadable spec.loadBalancerIP is skipped, as Cilium does.
        spec.load_balancer_ip = Some("nope".into());
        let svc = service(&[("lbipam.cilium.io/ips", "10.0.0.2")], spec);
        let v = view(&svc);
        assert_eq!(v.requested, Ok(vec!["10.0.0.2".parse().unwrap()]));
        assert_eq!(
            messages(&v),
            [
                r#"InvalidAnnotationValue: spec.loadBalancerIP: "nope" is not an IP address; ignored"#
            ]
        );
    }

    #[test]
    fn metallb_annotations_win_with_a_warning() {
        let svc = service(
            &[
                ("metallb.io/loadBalancerIPs", "10.0.0.1"),
                ("lbipam.cilium.io/ips", "10.0.0.2"),
                ("metallb.universe.tf/allow-shared-ip", "m"),
                ("io.cilium/lb-ipam-sharing-key", "c"),
            ],
            lb(&["10.96.0.1"]),
        );
        let v = view(&svc);
        assert_eq!(v.requested, Ok(vec!["10.0.0.1".parse().unwrap()]));
        assert!(!v.cilium_request);
        assert_eq!((v.sharing_key, v.sharing_rule), ("m", SharingRule::MetalLb));
        assert_eq!(
            messages(&v),
            [
                r#"IgnoredAnnotation: annotation "lbipam.cilium.io/ips" is ignored: "metallb.io/loadBalancerIPs" is set"#,
                r#"IgnoredAnnotation: annotation "io.cilium/lb-ipam-sharing-key" is ignored: "metallb.universe.tf/allow-shared-ip" is set"#,
            ]
        );
        // An empty MetalLB annotation is none: Cilium's counts, silently.
        let svc = service(
            &[
                ("metallb.io/allow-shared-ip", " "),
                ("lbipam.cilium.io/sharing-key", " k "),
            ],
            lb(&["10.96.0.1"]),
        );
        let v = view(&svc);
        assert_eq!(
            (v.sharing_key, v.sharing_rule),
            (" k ", SharingRule::Cilium)
        );
        assert!(v.warnings.is_empty());
    }

    #[test]
    fn cross_namespace_lists_by_key_kind_and_mode() {
        let cross = ("lbipam.cilium.io/sharing-cross-namespace", "a, b ,,*");
        let listed = Some(vec!["a".to_owned(), "b".to_owned(), "*".to_owned()]);
        let cilium = service(
            &[cross, ("lbipam.cilium.io/sharing-key", "k")],
            lb(&["10.96.0.1"]),
        );
        for mode in [
            SharingAcrossNamespaces::Allow,
            SharingAcrossNamespaces::Annotated,
        ] {
            assert_eq!(ServiceView::new(&cilium, mode).sharing_namespaces, listed);
        }
        // A Cilium key without the annotation: its own namespace only.
        let alone = service(&[("lbipam.cilium.io/sharing-key", "k")], lb(&["10.96.0.1"]));
        assert_eq!(view(&alone).sharing_namespaces, Some(vec![]));
        let metallb = service(
            &[cross, ("metallb.io/allow-shared-ip", "k")],
            lb(&["10.96.0.1"]),
        );
        assert_eq!(view(&metallb).sharing_namespaces, None);
        assert_eq!(
            ServiceView::new(&metallb, SharingAcrossNamespaces::Annotated).sharing_namespaces,
            listed
        );
    }

    #[test]
    fn cilium_backend_key_for_local_without_selector_is_unique() {
        let mut spec = lb(&["10.96.0.1"]);
        spec.external_traffic_policy = Some("Local".into());
        let keyed = service(&[("lbipam.cilium.io/sharing-key", "k")], spec.clone());
        assert_eq!(view(&keyed).backend_key, "(no selector) ns/web");
        let metallb = service(&[("metallb.io/allow-shared-ip", "k")], spec.clone());
        assert_eq!(view(&metallb).backend_key, "");
        spec.selector = Some([("app".to_string(), "web".to_string())].into());
        let keyed = service(&[("lbipam.cilium.io/sharing-key", "k")], spec);
        assert_eq!(view(&keyed).backend_key, "app=web");
    }

    #[test]
    fn a_cilium_request_sets_the_families() {
        let mut spec = lb(&["10.96.0.1", "fd00::1"]);
        spec.ip_family_policy = Some("RequireDualStack".into());
        let mut service = service(&[("lbipam.cilium.io/ips", "fd00::5")], spec);
        let view = ServiceView::new(&service, SharingAcrossNamespaces::Allow);
        assert_eq!(view.families, Some(FamilyPolicy::Single(Family::V6)));
        // MetalLB's annotation keeps the cluster IPs' families.
        service.metadata.annotations = Some(
            [(
                "metallb.io/loadBalancerIPs".to_owned(),
                "10.0.0.5".to_owned(),
            )]
            .into(),
        );
        let view = ServiceView::new(&service, SharingAcrossNamespaces::Allow);
        assert_eq!(view.families, Some(FamilyPolicy::RequireDual));
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
            ServiceView::new(&service(&[], spec.clone()), SharingAcrossNamespaces::Allow)
                .backend_key,
            ""
        );
        spec.external_traffic_policy = Some("Local".into());
        assert_eq!(
            ServiceView::new(&service(&[], spec), SharingAcrossNamespaces::Allow).backend_key,
            "app=web"
        );
    }
}
