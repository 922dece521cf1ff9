//! Unit tests of the allocation rules (docs/allocation.md §3, §4.3, §4.4) and
//! property tests of the invariants (§6).

use std::collections::BTreeMap;
use std::net::IpAddr;

use proptest::prelude::*;

use crate::spec::{IPAddressPoolSpec, LabelSelectorSpec, ServiceAllocationSpec};
use crate::*;

/// A Cilium pool of these `cidr` blocks, pinned by `selector` if given.
fn cilium_spec(
    cidrs: &[&str],
    selector: Option<LabelSelectorSpec>,
) -> crate::cilium::CiliumLoadBalancerIPPoolSpec {
    crate::cilium::CiliumLoadBalancerIPPoolSpec {
        blocks: cidrs
            .iter()
            .map(|cidr| crate::cilium::CiliumBlock {
                cidr: Some(cidr.to_string()),
                ..Default::default()
            })
            .collect(),
        service_selector: selector,
        ..Default::default()
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| ip(s)).collect()
}

fn pool_spec(addresses: &[&str]) -> IPAddressPoolSpec {
    IPAddressPoolSpec {
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

/// A Service request with owned parts, for tests.
#[derive(Clone, Debug)]
struct Svc {
    key: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    /// Its Namespace's labels.
    namespace_labels: BTreeMap<String, String>,
    families: FamilyPolicy,
    sharing: String,
    rule: SharingRule,
    /// Cilium's cross-namespace list; `None`: any.
    admits: Option<Vec<String>>,
    backend: String,
    ports: Vec<Port>,
    pool: Option<String>,
    addresses: Vec<IpAddr>,
}

impl Allocator {
    /// The fingerprint of the rules of the pinned automatic pool `pool`.
    fn rules_of(&self, pool: &str) -> u64 {
        match self.auto_group(pool) {
            Some(AutoGroup::Pinned(rules)) => rules,
            other => panic!("{pool} is {other:?}"),
        }
    }
}

fn svc(key: &str) -> Svc {
    Svc {
        key: key.to_owned(),
        namespace: key.split('/').next().unwrap_or("default").to_owned(),
        labels: BTreeMap::new(),
        namespace_labels: BTreeMap::new(),
        families: FamilyPolicy::Single(Family::V4),
        sharing: String::new(),
        rule: SharingRule::MetalLb,
        admits: None,
        backend: String::new(),
        ports: vec![tcp(80)],
        pool: None,
        addresses: vec![],
    }
}

fn tcp(port: i32) -> Port {
    Port {
        protocol: Protocol::Tcp,
        port,
    }
}

impl Svc {
    fn req(&self) -> Request<'_> {
        Request {
            key: &self.key,
            subject: Subject {
                name: self.key.split('/').nth(1).unwrap_or(&self.key),
                namespace: &self.namespace,
                labels: &self.labels,
                namespace_labels: &self.namespace_labels,
            },
            families: self.families,
            sharing_key: &self.sharing,
            sharing_rule: self.rule,
            sharing_namespaces: match &self.admits {
                Some(list) => SharingNamespaces::Listed(list),
                None => SharingNamespaces::Any,
            },
            backend_key: &self.backend,
            ports: &self.ports,
            pool: self.pool.as_deref(),
            addresses: &self.addresses,
        }
    }
    fn v6(mut self) -> Self {
        self.families = FamilyPolicy::Single(Family::V6);
        self
    }
    fn dual(mut self) -> Self {
        self.families = FamilyPolicy::RequireDual;
        self
    }
    fn prefer(mut self, primary: Family) -> Self {
        self.families = FamilyPolicy::PreferDual { primary };
        self
    }
    fn share(mut self, key: &str, ports: &[i32]) -> Self {
        self.sharing = key.to_owned();
        self.ports = ports.iter().map(|p| tcp(*p)).collect();
        self
    }
    fn in_pool(mut self, pool: &str) -> Self {
        self.pool = Some(pool.to_owned());
        self
    }
    fn asking(mut self, addresses: &[&str]) -> Self {
        self.addresses = ips(addresses);
        self
    }
}

impl Svc {
    /// A Cilium sharing key (`lbipam.cilium.io/sharing-key`).
    fn cilium_share(mut self, key: &str, ports: &[i32]) -> Self {
        self = self.share(key, ports);
        self.rule = SharingRule::Cilium;
        self.admits.get_or_insert_with(Vec::new);
        self
    }
    /// `lbipam.cilium.io/sharing-cross-namespace`.
    fn admitting(mut self, namespaces: &[&str]) -> Self {
        self.admits = Some(namespaces.iter().map(|n| n.to_string()).collect());
        self
    }
}

fn alloc(allocator: &mut Allocator, service: &Svc) -> Result<Vec<String>, AllocError> {
    let holding = allocator.allocate(&service.req())?;
    allocator.check_invariants().unwrap();
    Ok(holding.ips.iter().map(|i| i.to_string()).collect())
}

fn one(allocator: &mut Allocator, service: &Svc) -> String {
    alloc(allocator, service).unwrap().join(",")
}

fn with_pools(pools: &[(&str, &[&str])]) -> Allocator {
    let mut allocator = Allocator::new();
    for (name, addresses) in pools {
        allocator.set_pool(name, &pool_spec(addresses));
    }
    allocator
}

#[test]
fn lowest_address_first_in_spec_order() {
    let mut a = with_pools(&[("p", &["10.0.1.0/30", "10.0.0.0/30"])]);
    let got: Vec<String> = (0..6)
        .map(|i| one(&mut a, &svc(&format!("ns/s{i}"))))
        .collect();
    assert_eq!(
        got,
        ["10.0.1.0", "10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.0.0", "10.0.0.1"]
    );
}

#[test]
fn slash_32_and_slash_128_pools_then_exhaustion_and_release() {
    let mut a = with_pools(&[("four", &["192.168.1.7/32"]), ("six", &["fd00::7/128"])]);
    assert_eq!(one(&mut a, &svc("ns/a")), "192.168.1.7");
    assert!(matches!(
        alloc(&mut a, &svc("ns/b")),
        Err(AllocError::NoAvailable { .. })
    ));
    assert_eq!(
        alloc(&mut a, &svc("ns/b")).unwrap_err().to_string(),
        "no available IPs: no pool has an IPv4 address free (tried four, six)"
    );
    assert_eq!(one(&mut a, &svc("ns/c").v6()), "fd00::7");
    assert!(a.release("ns/a").is_some());
    assert_eq!(one(&mut a, &svc("ns/b")), "192.168.1.7");
    assert_eq!(
        a.pool_stats()[0].ipv4,
        FamilyStats {
            total: AddressCount::new(1),
            assigned: 1,
            reserved: 0
        }
    );
}

#[test]
fn range_crossing_an_octet_and_the_last_address() {
    let mut a = with_pools(&[("p", &["10.0.0.254-10.0.1.1"])]);
    let got: Vec<String> = (0..4)
        .map(|i| one(&mut a, &svc(&format!("ns/s{i}"))))
        .collect();
    assert_eq!(got, ["10.0.0.254", "10.0.0.255", "10.0.1.0", "10.0.1.1"]);
    assert!(alloc(&mut a, &svc("ns/s4")).is_err());
}

#[test]
fn avoid_buggy_ips_in_a_range_and_a_slash_23() {
    let mut a = Allocator::new();
    let mut spec = pool_spec(&["10.0.0.254-10.0.1.2", "10.1.0.0/23"]);
    spec.avoid_buggy_ips = Some(true);
    a.set_pool("p", &spec);
    let got: Vec<String> = (0..6)
        .map(|i| one(&mut a, &svc(&format!("ns/s{i}"))))
        .collect();
    assert_eq!(
        got,
        [
            "10.0.0.254",
            "10.0.1.1",
            "10.0.1.2",
            "10.1.0.1",
            "10.1.0.2",
            "10.1.0.3"
        ]
    );
    assert_eq!(a.pool_stats()[0].ipv4.total, AddressCount::new(3 + 508));
    // A buggy address is neither handed out nor accepted.
    let err = alloc(&mut a, &svc("ns/x").asking(&["10.1.0.255"])).unwrap_err();
    assert_eq!(
        err,
        AllocError::Avoided {
            ip: ip("10.1.0.255"),
            pool: "p".into()
        }
    );
    assert!(a.can_keep(&svc("ns/x").req(), &ips(&["10.1.1.0"])).is_err());
}

#[test]
fn ipv6_slash_64_in_order_with_exact_counters() {
    let mut a = with_pools(&[("v6", &["fd00:1::/64"])]);
    let got: Vec<String> = (0..3)
        .map(|i| one(&mut a, &svc(&format!("ns/s{i}")).v6()))
        .collect();
    assert_eq!(got, ["fd00:1::", "fd00:1::1", "fd00:1::2"]);
    let stats = &a.pool_stats()[0];
    assert_eq!(
        stats.ipv6,
        FamilyStats {
            total: AddressCount::new(1 << 64),
            assigned: 3,
            reserved: 0
        }
    );
    assert_eq!(
        stats.ipv4,
        FamilyStats {
            total: AddressCount::new(0),
            assigned: 0,
            reserved: 0
        }
    );
}

#[test]
fn pool_order_pinned_by_priority_then_name_then_unpinned_by_name() {
    let mut a = Allocator::new();
    a.set_pool("zz-open", &pool_spec(&["10.9.0.0/24"]));
    a.set_pool("aa-open", &pool_spec(&["10.8.0.0/24"]));
    let pinned = |addr: &str, priority: Option<i64>| IPAddressPoolSpec {
        service_allocation: Some(ServiceAllocationSpec {
            priority,
            ..Default::default()
        }),
        ..pool_spec(&[addr])
    };
    a.set_pool("pin-unset", &pinned("10.3.0.0/24", None));
    a.set_pool("pin-2", &pinned("10.2.0.0/24", Some(2)));
    a.set_pool("pin-1b", &pinned("10.1.1.0/32", Some(1)));
    a.set_pool("pin-1a", &pinned("10.1.0.0/32", Some(1)));
    let mut manual = pool_spec(&["10.0.0.0/24"]);
    manual.auto_assign = Some(false);
    a.set_pool("aaa-manual", &manual);
    let got: Vec<String> = (0..5)
        .map(|i| one(&mut a, &svc(&format!("ns/s{i}"))))
        .collect();
    assert_eq!(
        got,
        ["10.1.0.0", "10.1.1.0", "10.2.0.0", "10.2.0.1", "10.2.0.2"]
    );
    // autoAssign false: only by name or by address.
    assert_eq!(one(&mut a, &svc("ns/m").in_pool("aaa-manual")), "10.0.0.0");
    assert_eq!(one(&mut a, &svc("ns/n").asking(&["10.0.0.9"])), "10.0.0.9");
}

#[test]
fn unpinned_pools_by_name() {
    let mut a = with_pools(&[("b", &["10.2.0.0/32"]), ("a", &["10.1.0.0/32"])]);
    assert_eq!(one(&mut a, &svc("ns/1")), "10.1.0.0");
    assert_eq!(one(&mut a, &svc("ns/2")), "10.2.0.0");
}

#[test]
fn pinned_pool_serves_only_what_it_matches() {
    let mut a = Allocator::new();
    a.set_pool(
        "prod-only",
        &IPAddressPoolSpec {
            service_allocation: Some(ServiceAllocationSpec {
                priority: Some(1),
                namespaces: vec!["prod".into()],
                ..Default::default()
            }),
            ..pool_spec(&["10.1.0.0/24"])
        },
    );
    a.set_pool("general", &pool_spec(&["10.2.0.0/24"]));
    assert_eq!(one(&mut a, &svc("prod/web")), "10.1.0.0");
    assert_eq!(one(&mut a, &svc("dev/web")), "10.2.0.0");
    assert_eq!(
        alloc(&mut a, &svc("dev/x").in_pool("prod-only")),
        Err(AllocError::PoolDoesNotServe {
            pool: "prod-only".into()
        })
    );
    // Keeping an address of a pool that does not serve the Service fails.
    assert!(a
        .can_keep(&svc("dev/y").req(), &ips(&["10.1.0.5"]))
        .is_err());
    let mut labelled = svc("dev/z");
    labelled.labels.insert("a".into(), "b".into());
    assert_eq!(one(&mut a, &labelled), "10.2.0.1");
}

#[test]
fn service_selectors_pin_by_label() {
    let mut a = Allocator::new();
    let mut selector = LabelSelectorSpec::default();
    selector.match_labels.insert("tier".into(), "edge".into());
    a.set_pool(
        "edge",
        &IPAddressPoolSpec {
            service_allocation: Some(ServiceAllocationSpec {
                service_selectors: vec![selector],
                ..Default::default()
            }),
            ..pool_spec(&["10.1.0.0/24"])
        },
    );
    a.set_pool("rest", &pool_spec(&["10.2.0.0/24"]));
    let mut edge = svc("ns/edge");
    edge.labels.insert("tier".into(), "edge".into());
    assert_eq!(one(&mut a, &edge), "10.1.0.0");
    assert_eq!(one(&mut a, &svc("ns/other")), "10.2.0.0");
}

#[test]
fn requested_addresses_are_exact() {
    let mut a = with_pools(&[
        ("p", &["10.0.0.0/24", "fd00::/120"]),
        ("q", &["10.1.0.0/24"]),
    ]);
    assert_eq!(one(&mut a, &svc("ns/a").asking(&["10.0.0.7"])), "10.0.0.7");
    let taken = alloc(&mut a, &svc("ns/b").asking(&["10.0.0.7"])).unwrap_err();
    assert_eq!(
        taken.to_string(),
        "10.0.0.7 cannot be used: it is in use by ns/a"
    );
    assert_eq!(
        alloc(&mut a, &svc("ns/b").asking(&["10.5.0.1"])),
        Err(AllocError::NotInAnyPool { ip: ip("10.5.0.1") })
    );
    assert!(matches!(
        alloc(&mut a, &svc("ns/b").asking(&["10.0.0.8"]).in_pool("q")),
        Err(AllocError::NotInRequestedPool { .. })
    ));
    assert!(matches!(
        alloc(&mut a, &svc("ns/b").asking(&["fd00::1"])),
        Err(AllocError::WrongFamily { .. })
    ));
    // RequireDualStack must ask for one of each, from one pool;
    // PreferDualStack may ask for one address of either family and then
    // holds just that one (docs/allocation.md §4.2).
    assert!(matches!(
        alloc(&mut a, &svc("ns/d").dual().asking(&["10.0.0.9"])),
        Err(AllocError::WrongFamily { .. })
    ));
    assert_eq!(
        one(
            &mut a,
            &svc("ns/d").prefer(Family::V6).asking(&["10.0.0.9"])
        ),
        "10.0.0.9"
    );
    let asked_one = svc("ns/d").prefer(Family::V6).asking(&["10.0.0.9"]);
    assert_eq!(a.complete_dual_stack(&asked_one.req()), None);
    a.release("ns/d");
    assert_eq!(
        one(&mut a, &svc("ns/d").dual().asking(&["fd00::9", "10.0.0.9"])),
        "10.0.0.9,fd00::9"
    );
    assert!(matches!(
        alloc(
            &mut a,
            &svc("ns/e").dual().asking(&["10.1.0.1", "fd00::10"])
        ),
        Err(AllocError::DifferentPools { .. })
    ));
    // A failed allocation leaves the Service holding nothing.
    assert_eq!(a.holding("ns/e"), None);
}

#[test]
fn requested_pool() {
    let mut a = with_pools(&[("p", &["10.0.0.0/31"]), ("q", &["10.1.0.0/31"])]);
    assert_eq!(one(&mut a, &svc("ns/a").in_pool("q")), "10.1.0.0");
    assert_eq!(
        alloc(&mut a, &svc("ns/b").in_pool("nope")),
        Err(AllocError::UnknownPool {
            pool: "nope".into()
        })
    );
    assert_eq!(one(&mut a, &svc("ns/b").in_pool("q")), "10.1.0.1");
    assert!(matches!(
        alloc(&mut a, &svc("ns/c").in_pool("q")),
        Err(AllocError::NoAvailable { .. })
    ));
    assert!(matches!(
        alloc(&mut a, &svc("ns/c").in_pool("q").v6()),
        Err(AllocError::NoFamilyInPool {
            family: Family::V6,
            ..
        })
    ));
}

/// A holder leaving or joining an address is remembered per family until
/// it is taken (the manager reads it to know which waiting holders a
/// change of terms may concern, docs/allocation.md §4.9).
#[test]
fn regrouped_families_are_remembered_until_taken() {
    let mut a = Allocator::new();
    a.set_pool("p", &pool_spec(&["10.0.0.0/24", "fd00::/120"]));
    for name in ["ns/a", "ns/b"] {
        a.allocate(&svc(name).share("k", &[80]).dual().req())
            .unwrap();
    }
    a.take_regrouped();
    assert!(!a.regrouped_since(Family::V4) && !a.regrouped_since(Family::V6));
    // The same address, other ports: a leave and a join of IPv4 only.
    let held = a.held("ns/a").map(|(_, ips)| ips.to_vec()).unwrap();
    let v4: Vec<IpAddr> = held.iter().copied().filter(IpAddr::is_ipv4).collect();
    let moved = svc("ns/c").share("k", &[81]);
    a.allocate(&moved.req()).unwrap();
    a.take_regrouped();
    let kept = a.keep(&svc("ns/c").share("k", &[82]).req(), &v4).unwrap();
    assert_eq!(kept.ips, v4);
    assert!(a.regrouped_since(Family::V4) && !a.regrouped_since(Family::V6));
    let taken = a.take_regrouped();
    assert!(!taken.left.is_empty());
    assert!(!a.regrouped_since(Family::V4) && !a.regrouped_since(Family::V6));
}

#[test]
fn dual_stack_policies() {
    let mut a = with_pools(&[
        ("a-v4only", &["10.0.0.0/30"]),
        ("b-dual", &["10.1.0.0/30", "fd00::/126"]),
    ]);
    // RequireDualStack skips the pool that has no IPv6.
    assert_eq!(one(&mut a, &svc("ns/r").dual()), "10.1.0.0,fd00::");
    // PreferDualStack takes the first pool that has both.
    assert_eq!(
        one(&mut a, &svc("ns/p").prefer(Family::V6)),
        "10.1.0.1,fd00::1"
    );
    // Single stack takes the first pool with its family.
    assert_eq!(one(&mut a, &svc("ns/s")), "10.0.0.0");
    assert_eq!(one(&mut a, &svc("ns/s6").v6()), "fd00::2");
    assert_eq!(one(&mut a, &svc("ns/s7").v6()), "fd00::3");
    // No IPv6 left: RequireDualStack fails, PreferDualStack falls back to
    // its primary family in the first pool that has it.
    assert!(alloc(&mut a, &svc("ns/r2").dual()).is_err());
    assert_eq!(one(&mut a, &svc("ns/p2").prefer(Family::V4)), "10.0.0.1");
    // Primary IPv6 with no IPv6 left anywhere: the other family.
    assert_eq!(one(&mut a, &svc("ns/p3").prefer(Family::V6)), "10.0.0.2");
    // Once an IPv6 address is free, the partial holder of b-dual gets it.
    a.release("ns/s7");
    let p4 = svc("ns/p4").prefer(Family::V4).in_pool("b-dual");
    assert_eq!(one(&mut a, &p4), "10.1.0.2,fd00::3");
    let mut partial = with_pools(&[("d", &["10.1.0.0/31", "fd00::/127"])]);
    one(&mut partial, &svc("ns/x").v6());
    one(&mut partial, &svc("ns/y").v6());
    let p = svc("ns/p").prefer(Family::V4);
    assert_eq!(one(&mut partial, &p), "10.1.0.0");
    assert_eq!(partial.complete_dual_stack(&p.req()), None);
    partial.release("ns/y");
    let done = partial.complete_dual_stack(&p.req()).unwrap();
    assert_eq!(done.ips, ips(&["10.1.0.0", "fd00::1"]));
    partial.check_invariants().unwrap();
}

#[test]
fn sharing_stacks_on_the_lowest_address_where_ports_fit() {
    let mut a = with_pools(&[("p", &["10.0.0.0/24"])]);
    assert_eq!(one(&mut a, &svc("ns/a").share("k", &[80])), "10.0.0.0");
    assert_eq!(one(&mut a, &svc("ns/b").share("k", &[443])), "10.0.0.0");
    // Port 80 is taken on .0: next free address.
    assert_eq!(one(&mut a, &svc("ns/c").share("k", &[80])), "10.0.0.1");
    // Another key never stacks.
    assert_eq!(one(&mut a, &svc("ns/d").share("other", &[22])), "10.0.0.2");
    // No key: never shares.
    assert_eq!(one(&mut a, &svc("ns/e")), "10.0.0.3");
    // Port 53 fits on .0 again.
    assert_eq!(one(&mut a, &svc("ns/f").share("k", &[53])), "10.0.0.0");
    // A freed lower address beats a higher shared one.
    a.release("ns/d");
    assert_eq!(one(&mut a, &svc("ns/g").share("k", &[80, 443])), "10.0.0.2");
    let stats = &a.pool_stats()[0];
    assert_eq!(stats.ipv4.assigned, 4);
    assert_eq!(a.holders(ip("10.0.0.0")), ["ns/a", "ns/b", "ns/f"]);
    // Requested shared address: ports must not collide.
    let err = alloc(
        &mut a,
        &svc("ns/h").share("k", &[443]).asking(&["10.0.0.0"]),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "10.0.0.0 cannot be used: port 443/TCP is already used on it by ns/b"
    );
    let err = alloc(&mut a, &svc("ns/h").share("zz", &[1]).asking(&["10.0.0.0"])).unwrap_err();
    assert!(matches!(
        err,
        AllocError::Taken {
            conflict: ShareConflict::OtherKey { .. },
            ..
        }
    ));
}

#[test]
fn sharing_needs_the_same_backend() {
    let mut a = with_pools(&[("p", &["10.0.0.0/24"])]);
    let mut local = svc("ns/a").share("k", &[80]);
    local.backend = "app=a".into();
    assert_eq!(one(&mut a, &local), "10.0.0.0");
    let mut other_local = svc("ns/b").share("k", &[81]);
    other_local.backend = "app=b".into();
    assert_eq!(one(&mut a, &other_local), "10.0.0.1");
    let mut same = svc("ns/c").share("k", &[82]);
    same.backend = "app=a".into();
    assert_eq!(one(&mut a, &same), "10.0.0.0");
    assert_eq!(one(&mut a, &svc("ns/d").share("k", &[83])), "10.0.0.2");
}

#[test]
fn keeping_held_addresses() {
    let mut a = with_pools(&[("p", &["10.0.0.0/24"]), ("q", &["10.1.0.0/24"])]);
    let s = svc("ns/a");
    // A status address is kept wherever it is in a serving pool.
    a.keep(&s.req(), &ips(&["10.0.0.77"])).unwrap();
    assert_eq!(
        a.holding("ns/a").unwrap(),
        Holding {
            pool: "p".into(),
            ips: ips(&["10.0.0.77"]),
            other_pool: None,
        }
    );
    // Keeping is idempotent.
    a.keep(&s.req(), &ips(&["10.0.0.77"])).unwrap();
    a.check_invariants().unwrap();
    // Another Service cannot keep the same address.
    assert!(a.keep(&svc("ns/b").req(), &ips(&["10.0.0.77"])).is_err());
    // A requested pool or address other than the held one is not kept.
    assert!(a
        .can_keep(&s.clone().in_pool("q").req(), &ips(&["10.0.0.77"]))
        .is_err());
    assert!(a
        .can_keep(
            &s.clone().asking(&["10.0.0.78"]).req(),
            &ips(&["10.0.0.77"])
        )
        .is_err());
    assert!(a
        .can_keep(
            &s.clone().asking(&["10.0.0.77"]).req(),
            &ips(&["10.0.0.77"])
        )
        .is_ok());
    // Wrong family, or two addresses for a single-stack Service.
    assert!(a
        .can_keep(&s.req(), &ips(&["10.0.0.77", "10.0.0.78"]))
        .is_err());
    assert!(a
        .can_keep(&s.clone().v6().req(), &ips(&["10.0.0.77"]))
        .is_err());
    // autoAssign does not matter for keeping.
    let mut manual = pool_spec(&["10.2.0.0/24"]);
    manual.auto_assign = Some(false);
    a.set_pool("manual", &manual);
    a.keep(&svc("ns/m").req(), &ips(&["10.2.0.1"])).unwrap();
    // PreferDualStack may keep one address.
    a.keep(&svc("ns/pd").prefer(Family::V4).req(), &ips(&["10.1.0.1"]))
        .unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn overlapping_pools_the_older_stays_and_deleting_it_brings_the_newer_in() {
    let mut a = with_pools(&[("old", &["10.0.0.0/24"])]);
    a.set_pool("new", &pool_spec(&["10.0.0.128-10.0.1.10"]));
    assert_eq!(
        a.rejected_pools(),
        [RejectedPool {
            name: "new".into(),
            kind: PoolKind::IPAddressPool,
            reason:
                "addresses \"10.0.0.128-10.0.1.10\" overlap \"10.0.0.0-10.0.0.255\" of pool \"old\""
                    .into(),
            conflict: Some(Conflict {
                range: parse_entry("10.0.0.128-10.0.1.10").unwrap(),
                other_range: parse_entry("10.0.0.0/24").unwrap(),
                other_pool: "old".into(),
                other_kind: PoolKind::IPAddressPool,
            }),
        }]
    );
    assert_eq!(a.pool_stats().len(), 1);
    assert_eq!(
        alloc(&mut a, &svc("ns/x").in_pool("new")),
        Err(AllocError::UnknownPool { pool: "new".into() })
    );
    a.keep(&svc("ns/a").req(), &ips(&["10.0.0.200"])).unwrap();
    a.keep(&svc("ns/b").req(), &ips(&["10.0.0.5"])).unwrap();
    let change = a.remove_pool("old");
    assert!(a.rejected_pools().is_empty());
    // ns/a's address now lies in "new": re-homed, not released.
    assert_eq!(a.holding("ns/a").unwrap().pool, "new");
    assert_eq!(change.released.len(), 1);
    assert_eq!(change.released[0].key, "ns/b");
    assert_eq!(change.released[0].reason, "10.0.0.5 is not in any pool");
    assert_eq!(a.pool_stats()[0].ipv4.assigned, 1);
    a.check_invariants().unwrap();
}

#[test]
fn an_invalid_pool_is_rejected_on_its_own() {
    let mut a = with_pools(&[("good", &["10.0.0.0/24"]), ("bad", &["10.0.0.9-10.0.0.1"])]);
    assert_eq!(
        a.rejected_pools()[0].reason,
        "range 10.0.0.9-10.0.0.1: first address is after the last"
    );
    assert_eq!(one(&mut a, &svc("ns/a")), "10.0.0.0");
    // Fixing it brings it in; breaking the good one releases its holders.
    a.set_pool("bad", &pool_spec(&["10.0.1.0/24"]));
    assert!(a.rejected_pools().is_empty());
    let change = a.set_pool("good", &pool_spec(&["10.0.0.0/33"]));
    assert_eq!(change.released[0].key, "ns/a");
    assert_eq!(one(&mut a, &svc("ns/a")), "10.0.1.0");
    // A changed pool keeps its creation position: "good" (older) now
    // overlaps "bad" and is rejected, not the other way round.
    a.set_pool("good", &pool_spec(&["10.0.1.0/25"]));
    assert_eq!(a.rejected_pools().len(), 1);
    assert_eq!(a.rejected_pools()[0].name, "bad");
    assert_eq!(a.holding("ns/a").unwrap().pool, "good");
    a.check_invariants().unwrap();
}

#[test]
fn pool_shrink_and_avoid_buggy_change_release_holders() {
    let mut a = with_pools(&[("p", &["10.0.0.0/24"])]);
    a.keep(&svc("ns/zero").req(), &ips(&["10.0.0.0"])).unwrap();
    a.keep(&svc("ns/mid").req(), &ips(&["10.0.0.100"])).unwrap();
    let mut spec = pool_spec(&["10.0.0.0/24"]);
    spec.avoid_buggy_ips = Some(true);
    let change = a.set_pool("p", &spec);
    assert_eq!(change.released.len(), 1);
    assert_eq!(
        change.released[0].reason,
        "10.0.0.0 is avoided by pool \"p\" (avoidBuggyIPs)"
    );
    assert_eq!(a.holding("ns/mid").unwrap().ips, ips(&["10.0.0.100"]));
    assert_eq!(
        a.pool_stats()[0].ipv4,
        FamilyStats {
            total: AddressCount::new(254),
            assigned: 1,
            reserved: 0
        }
    );
}

#[test]
fn huge_pools_cost_nothing() {
    let mut a = with_pools(&[("all", &["::/0"]), ("big", &["0.0.0.0/0"])]);
    assert_eq!(a.pool_stats()[0].ipv6.total, AddressCount::ALL_IPV6);
    assert_eq!(a.pool_stats()[1].ipv4.total, AddressCount::new(1 << 32));
    assert_eq!(one(&mut a, &svc("ns/a").v6()), "::");
    assert_eq!(
        one(
            &mut a,
            &svc("ns/top")
                .v6()
                .asking(&["ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"])
        ),
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    );
    assert_eq!(one(&mut a, &svc("ns/b")), "0.0.0.0");
    a.set_pool(
        "range",
        &pool_spec(&["fd00::-fd00::ffff:ffff:ffff:ffff:ffff"]),
    );
    assert_eq!(a.rejected_pools().len(), 1);
}

// ----- property tests -----

#[derive(Clone, Debug)]
enum Op {
    Allocate {
        service: u8,
        share: Option<u8>,
        port: u8,
        family: u8,
        pool: Option<u8>,
        ask: Option<u8>,
    },
    Keep {
        service: u8,
        address: u8,
    },
    /// A dual-stack status pair: kept together, per address (Cilium
    /// pools), or not at all.
    KeepPair {
        service: u8,
        v4: u8,
        v6: u8,
        prefer: bool,
    },
    Release {
        service: u8,
    },
    SetPool {
        pool: u8,
        shape: u8,
    },
    RemovePool {
        pool: u8,
    },
    /// A Cilium pool of the same names as the `IPAddressPool`s: the shared
    /// name space, overlaps across kinds, reserved ends, disabled pools.
    SetCiliumPool {
        pool: u8,
        shape: u8,
        no_ends: bool,
        disabled: bool,
        selector: bool,
    },
    RemoveCiliumPool {
        pool: u8,
    },
    CompleteDual {
        service: u8,
        share: Option<u8>,
        port: u8,
        /// RequireDualStack (a pair kept per address that lost one), else
        /// PreferDualStack.
        require: bool,
    },
}

const POOL_SHAPES: &[&[&str]] = &[
    &["10.0.0.0/30"],
    // Entries high to low: search order is spec order, not address order.
    &[
        "10.0.0.7/32",
        "10.0.0.4/31",
        "10.0.0.0/30",
        "fd00::5/128",
        "fd00::/126",
    ],
    &["10.0.0.2-10.0.0.5", "fd00::/126"],
    &["10.0.0.254-10.0.1.1"],
    &["fd00::2-fd00::4"],
    &["10.0.0.4/31", "10.0.0.0/32"],
    &["10.0.0.9-10.0.0.1"],
    &["fd00::/64"],
];

fn address(n: u8) -> IpAddr {
    if n.is_multiple_of(2) {
        IpAddr::from([10, 0, 0, n / 2 % 8])
    } else {
        ip(&format!("fd00::{}", n / 2 % 8))
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..8, proptest::option::of(0u8..4), 0u8..3, 0u8..4, proptest::option::of(0u8..3), proptest::option::of(0u8..16))
            .prop_map(|(service, share, port, family, pool, ask)| Op::Allocate { service, share, port, family, pool, ask }),
        2 => (0u8..8, 0u8..16).prop_map(|(service, address)| Op::Keep { service, address }),
        1 => (0u8..8, 0u8..8, 0u8..8, any::<bool>())
            .prop_map(|(service, v4, v6, prefer)| Op::KeepPair { service, v4: v4 * 2, v6: v6 * 2 + 1, prefer }),
        2 => (0u8..8).prop_map(|service| Op::Release { service }),
        1 => (0u8..3, 0u8..POOL_SHAPES.len() as u8).prop_map(|(pool, shape)| Op::SetPool { pool, shape }),
        1 => (0u8..3).prop_map(|pool| Op::RemovePool { pool }),
        1 => (0u8..3, 0u8..POOL_SHAPES.len() as u8, any::<bool>(), proptest::bool::weighted(0.2), any::<bool>())
            .prop_map(|(pool, shape, no_ends, disabled, selector)| Op::SetCiliumPool { pool, shape, no_ends, disabled, selector }),
        1 => (0u8..3).prop_map(|pool| Op::RemoveCiliumPool { pool }),
        1 => (0u8..8, proptest::option::of(0u8..4), 0u8..3, any::<bool>())
            .prop_map(|(service, share, port, require)| Op::CompleteDual { service, share, port, require }),
    ]
}

/// Carries out `op`; its answer as text.
fn apply(a: &mut Allocator, op: &Op) -> String {
    match op.clone() {
        Op::Allocate {
            service,
            share,
            port,
            family,
            pool,
            ask,
        } => {
            let mut s = service_for(service, share, port, family);
            s.pool = pool.map(|p| format!("pool{p}"));
            if let Some(n) = ask {
                s.addresses = vec![address(n)];
            }
            format!("{:?}", a.allocate(&s.req()))
        }
        Op::Keep {
            service,
            address: n,
        } => {
            let s = svc(&key_of(service));
            let s = if n.is_multiple_of(2) { s } else { s.v6() };
            format!("{:?}", a.keep(&s.req(), &[address(n)]))
        }
        Op::KeepPair {
            service,
            v4,
            v6,
            prefer,
        } => {
            let s = svc(&key_of(service));
            let s = if prefer {
                s.prefer(Family::V4)
            } else {
                s.dual()
            };
            format!("{:?}", a.keep_part(&s.req(), &[address(v4), address(v6)]))
        }
        Op::Release { service } => format!("{:?}", a.release(&key_of(service))),
        Op::SetPool { pool, shape } => {
            let addresses = POOL_SHAPES.get(usize::from(shape)).copied().unwrap_or(&[]);
            let change = a.set_pool(&format!("pool{pool}"), &pool_spec(addresses));
            format!("{:?}", change.released)
        }
        // What was released; which pools stayed as they were is how the
        // allocator got there.
        Op::SetCiliumPool {
            pool,
            shape,
            no_ends,
            disabled,
            selector,
        } => {
            let addresses = POOL_SHAPES.get(usize::from(shape)).copied().unwrap_or(&[]);
            let spec = crate::cilium::CiliumLoadBalancerIPPoolSpec {
                blocks: addresses
                    .iter()
                    .map(|entry| {
                        let (cidr, start, stop) = match entry.split_once('-') {
                            Some((start, stop)) => (None, Some(start), Some(stop)),
                            None if entry.contains('/') => (Some(*entry), None, None),
                            None => (None, Some(*entry), None),
                        };
                        crate::cilium::CiliumBlock {
                            cidr: cidr.map(str::to_owned),
                            start: start.map(str::to_owned),
                            stop: stop.map(str::to_owned),
                        }
                    })
                    .collect(),
                allow_first_last_ips: no_ends.then(|| "No".to_owned()),
                disabled,
                // Only Services named s0..s3 (the pseudo-label).
                service_selector: selector.then(|| LabelSelectorSpec {
                    match_expressions: vec![crate::spec::LabelSelectorRequirementSpec {
                        key: SERVICE_NAME_LABEL.to_owned(),
                        operator: "In".to_owned(),
                        values: (0..4).map(|i| format!("s{i}")).collect(),
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            };
            let change = a.set_cilium_pool(&format!("pool{pool}"), &spec);
            format!("{:?}", change.released)
        }
        Op::RemoveCiliumPool { pool } => {
            let change = a.remove_cilium_pool(&format!("pool{pool}"));
            format!("{:?}", change.released)
        }
        Op::RemovePool { pool } => {
            format!("{:?}", a.remove_pool(&format!("pool{pool}")).released)
        }
        Op::CompleteDual {
            service,
            share,
            port,
            require,
        } => {
            let s = service_for(service, share, port, if require { 2 } else { 3 });
            format!("{:?}", a.complete_dual_stack(&s.req()))
        }
    }
}

/// Carries out `op`; for a change of pools, the whole report of it.
fn apply_pool_op(a: &mut Allocator, op: &Op) -> Option<PoolChange> {
    let removed = match op {
        Op::RemovePool { pool } => a.remove_pool(&format!("pool{pool}")),
        Op::RemoveCiliumPool { pool } => a.remove_cilium_pool(&format!("pool{pool}")),
        Op::SetPool { pool, shape } => {
            let addresses = POOL_SHAPES.get(usize::from(*shape)).copied().unwrap_or(&[]);
            a.set_pool(&format!("pool{pool}"), &pool_spec(addresses))
        }
        _ => {
            apply(a, op);
            return None;
        }
    };
    Some(removed)
}

/// Services s6 and s7 live in another namespace, for the namespace rule.
fn key_of(service: u8) -> String {
    if service >= 6 {
        format!("other/s{service}")
    } else {
        format!("ns/s{service}")
    }
}

fn service_for(service: u8, share: Option<u8>, port: u8, family: u8) -> Svc {
    let base = svc(&key_of(service));
    let base = match family {
        0 => base,
        1 => base.v6(),
        2 => base.dual(),
        _ => base.prefer(Family::V6),
    };
    // Keys 0 and 1 follow MetalLB's rule, 2 and 3 Cilium's (as "key0",
    // "key1" again: the rules keep them apart), with each Service's
    // cross-namespace list one of none, any, or the other namespace.
    match share {
        Some(k) if k >= 2 => {
            let admits: &[&str] = match service % 3 {
                0 => &[],
                1 => &["*"],
                _ => &["ns", "other"],
            };
            base.cilium_share(&format!("key{}", k - 2), &[i32::from(port)])
                .admitting(admits)
        }
        Some(k) => base.share(&format!("key{k}"), &[i32::from(port)]),
        None => base,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Keeping the holdings of unchanged pools on a pool change gives what
    /// placing every holding again gives: the same answers to the same
    /// calls, holdings, counters and holder lists.
    #[test]
    fn unchanged_pools_keep_their_holdings_as_a_rebuild_would(ops in prop::collection::vec(op(), 1..80)) {
        let run = |rebuild_all: bool| {
            let mut a = Allocator::new();
            a.rebuild_all = rebuild_all;
            let mut seen = Vec::new();
            for op in &ops {
                let answer = apply(&mut a, op);
                seen.push((answer, a.holder_lists()));
            }
            (seen, a.holdings(), a.pool_stats())
        };
        prop_assert_eq!(run(false), run(true));
    }

    /// A pool change decided by a shortcut (alone, or with the pools it
    /// overlaps) reports what the full recomputation reports: the same
    /// releases, changed pools and rejections, and the same rejected
    /// pools after it.
    #[test]
    fn pool_change_shortcuts_report_what_the_full_recomputation_does(ops in prop::collection::vec(op(), 1..80)) {
        let run = |whole: bool| {
            let mut a = Allocator::new();
            a.whole_recompute = whole;
            let mut seen = Vec::new();
            for op in &ops {
                let change = apply_pool_op(&mut a, op);
                seen.push((change, a.rejected_pools(), a.holdings()));
            }
            seen
        };
        prop_assert_eq!(run(false), run(true));
    }

    /// After any sequence of operations: no address held twice unless shared
    /// under the rules, every held address in a pool that allows it,
    /// counters equal to a recount; and the same calls give the same answers.
    #[test]
    fn invariants_hold_after_any_sequence(ops in prop::collection::vec(op(), 1..60)) {
        let run = |ops: &[Op]| {
            let mut a = Allocator::new();
            let mut answers = Vec::new();
            for op in ops {
                let answer = apply(&mut a, op);
                if let Err(problems) = a.check_invariants() {
                    return Err(format!("after {op:?}: {problems:?}"));
                }
                answers.push(answer);
            }
            // Every address held lies in a pool that allows it.
            // A holding spans two pools only as one address per family in
            // two Cilium pools (docs/cilium.md §3.5).
            for (key, holding) in a.holdings() {
                for held in &holding.ips {
                    let name = holding.pool_of(*held);
                    let pool = a.pool(name).ok_or(format!("{key}: pool {name} gone"))?;
                    if !pool.allows(*held) {
                        return Err(format!("{key} holds {held} outside {name}"));
                    }
                    if holding.other_pool.is_some() && pool.kind != PoolKind::CiliumLoadBalancerIPPool {
                        return Err(format!("{key} spans two pools, {name} not a Cilium pool"));
                    }
                }
            }
            Ok((answers, a.holdings(), a.pool_stats()))
        };
        let first = run(&ops);
        prop_assert!(first.is_ok(), "{:?}", first.as_ref().err());
        prop_assert_eq!(first, run(&ops));
    }

    /// The allocator picks exactly the lowest free address that a naive scan
    /// of the pool would pick.
    #[test]
    fn lowest_free_matches_a_scan(held in prop::collection::btree_set(0u32..64, 0..40), avoid in any::<bool>()) {
        let mut a = Allocator::new();
        let mut spec = pool_spec(&["10.0.0.250-10.0.1.20", "10.0.2.0/29"]);
        spec.avoid_buggy_ips = Some(avoid);
        a.set_pool("p", &spec);
        let all: Vec<u32> = (0xa00_00fa..=0xa00_0114).chain(0xa00_0200..=0xa00_0207).collect();
        let usable: Vec<u32> = all.iter().copied().filter(|v| !avoid || !matches!(v & 0xff, 0 | 0xff)).collect();
        let mut taken = std::collections::BTreeSet::new();
        for (i, n) in held.iter().enumerate() {
            if let Some(v) = usable.get(*n as usize) {
                a.keep(&svc(&format!("ns/h{i}")).req(), &[IpAddr::from(std::net::Ipv4Addr::from(*v))]).unwrap();
                taken.insert(*v);
            }
        }
        let expected = usable.iter().find(|v| !taken.contains(v)).map(|v| IpAddr::from(std::net::Ipv4Addr::from(*v)));
        let got = a.allocate(&svc("ns/new").req()).ok().and_then(|h| h.ips.first().copied());
        prop_assert_eq!(got, expected);
    }
}

/// Cost regressions (docs/allocation.md §4.9): shapes whose cost per
/// Service once grew with the cluster, checked by counting the search steps
/// the allocator takes, at sizes where the old walks took at least 20 times
/// the steps of a linear bound.
mod cost {
    use super::*;

    const N: u32 = 3000;

    fn v4(n: u32) -> String {
        std::net::Ipv4Addr::from(0x0a00_0000 + n).to_string()
    }

    /// Steps per Service stay below `per_service` (a constant, with room for
    /// the logarithms).
    fn assert_linear(a: &Allocator, services: u32, per_service: u64) {
        let steps = a.steps();
        assert!(
            steps <= u64::from(services) * per_service,
            "{steps} steps for {services} services: more than {per_service} each"
        );
    }

    #[test]
    fn slash_32_entries_listed_high_to_low() {
        let entries: Vec<String> = (0..N).rev().map(|n| format!("{}/32", v4(n))).collect();
        let entries: Vec<&str> = entries.iter().map(String::as_str).collect();
        let mut a = with_pools(&[("p", &entries)]);
        for i in 0..N {
            let holding = a.allocate(&svc(&format!("ns/s{i}")).req()).unwrap();
            // Spec order: the highest address first.
            assert_eq!(holding.ips, vec![ip(&v4(N - 1 - i))]);
        }
        assert_linear(&a, N, 8);
    }

    #[test]
    fn one_sharing_key_all_on_port_80_steps_up() {
        let mut a = with_pools(&[("p", &["10.0.0.0/16"])]);
        for i in 0..N {
            let s = svc(&format!("ns/s{i}")).share("k", &[80]);
            let holding = a.allocate(&s.req()).unwrap();
            assert_eq!(holding.ips, vec![ip(&v4(i))]);
        }
        // A hole low down is found at once, and the next one steps up again.
        a.release("ns/s7");
        let s = svc("ns/again").share("k", &[80]);
        assert_eq!(a.allocate(&s.req()).unwrap().ips, vec![ip(&v4(7))]);
        let s = svc("ns/next").share("k", &[80]);
        assert_eq!(a.allocate(&s.req()).unwrap().ips, vec![ip(&v4(N))]);
        assert_linear(&a, N + 2, 12);
    }

    #[test]
    fn one_sharing_key_each_its_own_port_stacks_on_one_address() {
        let mut a = with_pools(&[("p", &["10.0.0.0/16"])]);
        for i in 0..N {
            let port = i32::try_from(i).unwrap() + 1;
            let s = svc(&format!("ns/s{i}")).share("k", &[port]);
            assert_eq!(a.allocate(&s.req()).unwrap().ips, vec![ip(&v4(0))]);
        }
        // A port in use is refused by name, without a walk over the holders.
        let s = svc("ns/clash").share("k", &[5]);
        assert_eq!(
            a.can_keep(&s.req(), &[ip(&v4(0))]),
            Err(AllocError::Taken {
                ip: ip(&v4(0)),
                conflict: ShareConflict::Port {
                    holder: "ns/s4".to_owned(),
                    port: tcp(5),
                },
            })
        );
        assert_linear(&a, N, 12);
    }

    #[test]
    fn many_small_pools_added_one_by_one_and_filled() {
        let mut a = Allocator::new();
        for p in 0..N {
            a.set_pool(
                &format!("p{p:05}"),
                &pool_spec(&[&format!("{}/30", v4(4 * p))]),
            );
            let holding = a.allocate(&svc(&format!("ns/s{p}")).req()).unwrap();
            assert_eq!(holding.pool, format!("p{p:05}"));
            for extra in 1..4 {
                a.allocate(&svc(&format!("ns/s{p}-{extra}")).req()).unwrap();
            }
        }
        assert_eq!(a.len(), 4 * N as usize);
        assert_linear(&a, 4 * N, 8);
    }

    #[test]
    fn a_chain_of_overlapping_pools_then_the_first_deleted() {
        let mut a = Allocator::new();
        for p in 0..N {
            // Each overlaps the one before it.
            let first = v4(2 * p);
            let last = v4(2 * p + 2);
            a.set_pool(
                &format!("p{p:05}"),
                &pool_spec(&[&format!("{first}-{last}")]),
            );
        }
        assert_eq!(a.rejected_pools().len(), (N / 2) as usize);
        let change = a.remove_pool("p00000");
        // Every acceptance flips once: that is what the change does.
        assert_eq!(a.rejected_pools().len(), (N / 2 - 1) as usize);
        assert!(change.changed.len() >= (N - 1) as usize);
        assert_linear(&a, N, 8);
    }

    /// N pools, the oldest of which overlaps (and so blocks) the second;
    /// then the oldest changed N times, each time still blocking it. Only
    /// the pools it may sway (the two) are decided again, not every pool
    /// (the full recomputation took N steps per change); a change that
    /// stops the blocking brings the blocked pool in.
    #[test]
    fn a_pool_that_blocks_another_changed_n_times() {
        let mut a = Allocator::new();
        a.set_pool("a-first", &pool_spec(&[&format!("{}/30", v4(0))]));
        for p in 0..N {
            let first = v4(4 * p);
            a.set_pool(&format!("p{p:05}"), &pool_spec(&[&format!("{first}/30")]));
        }
        assert_eq!(a.rejected_pools().len(), 1);
        let before = a.steps();
        for i in 0..N {
            let extra = format!("{}/32", v4(4 * N + i));
            a.set_pool("a-first", &pool_spec(&[&format!("{}/30", v4(0)), &extra]));
            assert_eq!(a.rejected_pools().len(), 1);
        }
        assert!(
            a.steps() - before <= u64::from(N) * 20,
            "{}",
            a.steps() - before
        );
        let change = a.set_pool("a-first", &pool_spec(&[&format!("{}/32", v4(4 * N + 7))]));
        assert!(a.rejected_pools().is_empty());
        assert_eq!(change.changed, ["a-first", "p00000"]);
    }

    /// N pairs of pools, the newer of each overlapping (so rejected by) the
    /// older, then each older one widened: finding the pools a change may
    /// sway looks at the rejected ranges near it, not at all N (before,
    /// N per change).
    #[test]
    fn pairs_of_pools_changed_one_by_one() {
        let mut a = Allocator::new();
        let block = |p: u32| format!("{}/30", v4(4 * p));
        for p in 0..N {
            a.set_pool(&format!("p{p:05}-a"), &pool_spec(&[&block(p)]));
            a.set_pool(&format!("p{p:05}-b"), &pool_spec(&[&block(p)]));
        }
        assert_eq!(a.rejected_pools().len(), N as usize);
        let before = a.steps();
        for p in 0..N {
            let extra = format!("{}/32", v4(4 * (N + p)));
            let change = a.set_pool(&format!("p{p:05}-a"), &pool_spec(&[&block(p), &extra]));
            assert_eq!(change.changed, [format!("p{p:05}-a")]);
        }
        assert_eq!(a.rejected_pools().len(), N as usize);
        assert!(
            a.steps() - before <= u64::from(N) * 20,
            "{}",
            a.steps() - before
        );
        // The older one of a pair gone, the newer one comes in.
        let change = a.remove_pool("p00007-a");
        assert_eq!(change.changed, ["p00007-a", "p00007-b"]);
        assert_eq!(a.rejected_pools().len(), N as usize - 1);
    }

    /// N pools of two addresses, each with its two holders, then each
    /// widened in turn (the oldest first): a change of a pool that is not
    /// the newest, overlaps no other and blocks none is decided for that
    /// pool alone (the full recomputation took N steps per change). One
    /// that now overlaps a newer pool still rejects it.
    #[test]
    fn older_pools_changed_one_by_one_are_decided_alone() {
        let mut a = Allocator::new();
        let spec =
            |p: u32, size: u32| pool_spec(&[&format!("{}-{}", v4(4 * p), v4(4 * p + size - 1))]);
        for p in 0..N {
            a.set_pool(&format!("p{p:05}"), &spec(p, 2));
        }
        for i in 0..2 * N {
            a.allocate(&svc(&format!("ns/s{i}")).req()).unwrap();
        }
        for p in 0..N {
            let change = a.set_pool(&format!("p{p:05}"), &spec(p, 4));
            assert_eq!(change.changed, [format!("p{p:05}")]);
            assert!(change.released.is_empty());
        }
        assert_eq!(a.len(), 2 * N as usize);
        assert_linear(&a, 3 * N, 16);
        // p00000 grows into p00001, the newer: that one is rejected; of its
        // holders, the one whose address p00000 now has moves there, the
        // other is released.
        let change = a.set_pool("p00000", &spec(0, 5));
        assert_eq!(a.rejected_pools().len(), 1);
        assert_eq!(change.released.len(), 1);
        let moved = a
            .holdings()
            .into_iter()
            .filter(|(_, h)| h.ips == [v4(4).parse::<IpAddr>().unwrap()]);
        assert_eq!(moved.map(|(_, h)| h.pool).collect::<Vec<_>>(), ["p00000"]);
    }

    /// Cilium pools cost what IPAddressPools do: many small pools with
    /// reserved ends, added one by one and filled.
    /// Dual-stack Services from many small Cilium pools of one family
    /// each (docs/cilium.md §4.3 item 4): each pair costs a few searches of
    /// the automatic index, not a walk over the pools.
    #[test]
    fn dual_stack_pairs_from_many_single_family_cilium_pools() {
        let mut a = Allocator::new();
        let block = |cidr: String| crate::cilium::CiliumLoadBalancerIPPoolSpec {
            blocks: vec![crate::cilium::CiliumBlock {
                cidr: Some(cidr),
                ..Default::default()
            }],
            ..Default::default()
        };
        let pools = N / 4;
        for p in 0..pools {
            a.set_cilium_pool(&format!("a{p:05}"), &block(format!("{}/30", v4(4 * p))));
            a.set_cilium_pool(
                &format!("b{p:05}"),
                &block(format!("fd00::{:x}/126", 4 * p)),
            );
        }
        let before = a.steps();
        for i in 0..4 * pools {
            let h = a.allocate(&svc(&format!("ns/s{i}")).dual().req()).unwrap();
            assert!(h.other_pool.is_some(), "{h:?}");
        }
        let steps = a.steps() - before;
        assert!(steps <= u64::from(4 * pools) * 16, "{steps} steps");
        a.check_invariants().unwrap();
    }

    #[test]
    fn many_small_cilium_pools_with_reserved_ends() {
        let mut a = Allocator::new();
        for p in 0..N {
            let spec = crate::cilium::CiliumLoadBalancerIPPoolSpec {
                blocks: vec![crate::cilium::CiliumBlock {
                    cidr: Some(format!("{}/30", v4(4 * p))),
                    ..Default::default()
                }],
                allow_first_last_ips: Some("No".into()),
                ..Default::default()
            };
            a.set_cilium_pool(&format!("p{p:05}"), &spec);
            for extra in 1..3 {
                let holding = a.allocate(&svc(&format!("ns/s{p}-{extra}")).req()).unwrap();
                assert_eq!(holding.ips, vec![ip(&v4(4 * p + extra))]);
            }
        }
        assert_eq!(a.len(), 2 * N as usize);
        assert_linear(&a, 2 * N, 8);
    }

    /// Cilium keys with cross-namespace lists, from several namespaces,
    /// each its own port, stack on one address: the namespace rule asks per
    /// tenancy, and a Cilium key joins its group's address at once.
    #[test]
    fn one_cilium_key_from_four_namespaces_stacks_on_one_address() {
        let mut a = with_pools(&[("p", &["10.0.0.0/16"])]);
        for i in 0..N {
            let port = i32::try_from(i).unwrap() + 1;
            let s = svc(&format!("ns{}/s{i}", i % 4))
                .cilium_share("k", &[port])
                .admitting(&["*"]);
            assert_eq!(a.allocate(&s.req()).unwrap().ips, vec![ip(&v4(0))]);
        }
        let listed = svc("ns9/listed")
            .cilium_share("k", &[0])
            .admitting(&["ns0", "ns1", "ns2", "ns3"]);
        assert_eq!(a.allocate(&listed.req()).unwrap().ips, vec![ip(&v4(0))]);
        assert_linear(&a, N + 1, 16);
    }

    /// Pool `name` of `cidr` pinned to `namespace` and, if given, to the
    /// `app` label `app`: by MetalLB's `serviceAllocation`, or by one Cilium
    /// selector of the namespace pseudo-label (and the label).
    fn pinned_pool(
        a: &mut Allocator,
        cilium: bool,
        (name, cidr): (&str, String),
        namespace: String,
        app: Option<String>,
    ) {
        if cilium {
            let mut labels: BTreeMap<String, String> =
                [(SERVICE_NAMESPACE_LABEL.to_owned(), namespace)].into();
            labels.extend(app.map(|app| ("app".to_owned(), app)));
            let spec = crate::cilium::CiliumLoadBalancerIPPoolSpec {
                blocks: vec![crate::cilium::CiliumBlock {
                    cidr: Some(cidr),
                    ..Default::default()
                }],
                service_selector: Some(LabelSelectorSpec {
                    match_labels: labels,
                    ..Default::default()
                }),
                ..Default::default()
            };
            a.set_cilium_pool(name, &spec);
        } else {
            let service_selectors = app
                .map(|app| LabelSelectorSpec {
                    match_labels: [("app".to_owned(), app)].into(),
                    ..Default::default()
                })
                .into_iter()
                .collect();
            let spec = IPAddressPoolSpec {
                service_allocation: Some(ServiceAllocationSpec {
                    namespaces: vec![namespace],
                    service_selectors,
                    ..Default::default()
                }),
                ..pool_spec(&[&cidr])
            };
            a.set_pool(name, &spec);
        }
    }

    /// P pools each pinned to its own namespace, then a Service in each
    /// of those namespaces and one in a namespace no pool names: each
    /// visits the pools its namespace leads to, not every pinned pool with
    /// room before its own (the walk over them took ~P² steps). Returns the
    /// steps the Services took.
    fn namespace_pinned(pools: u32, cilium: bool, every_pinned: bool) -> u64 {
        let mut a = Allocator::new();
        a.every_pinned = every_pinned;
        for p in 0..pools {
            let (name, namespace) = (format!("p{p:05}"), format!("ns-{p:05}"));
            let cidr = format!("{}/28", v4(16 * p));
            pinned_pool(&mut a, cilium, (&name, cidr), namespace, None);
        }
        a.set_pool("rest", &pool_spec(&["10.200.0.0/16"]));
        let before = a.steps();
        for p in 0..pools {
            let holding = a.allocate(&svc(&format!("ns-{p:05}/s")).req()).unwrap();
            assert_eq!(holding.pool, format!("p{p:05}"));
            let holding = a.allocate(&svc(&format!("elsewhere-{p}/s")).req()).unwrap();
            assert_eq!(holding.pool, "rest");
        }
        a.steps() - before
    }

    /// Where a half-served Service held in a Cilium pool waits
    /// (`cilium_groups`), with P Cilium pools each pinned to its own
    /// namespace: the group its namespace leads to, found by the index (a
    /// walk over every automatic pool took P steps per Service).
    #[test]
    fn the_cilium_pools_a_half_served_service_waits_on_come_from_the_index() {
        const P: u32 = 2000;
        let mut a = Allocator::new();
        for p in 0..P {
            let selector = LabelSelectorSpec {
                match_labels: [(SERVICE_NAMESPACE_LABEL.to_owned(), format!("ns-{p:05}"))].into(),
                ..Default::default()
            };
            let cidr = format!("fd00:{p:x}::/126");
            a.set_cilium_pool(&format!("p{p:05}"), &cilium_spec(&[&cidr], Some(selector)));
        }
        let before = a.steps();
        for p in 0..P {
            let request = svc(&format!("ns-{p:05}/s")).prefer(Family::V4);
            let group = a.auto_group(&format!("p{p:05}"));
            assert_eq!(
                a.cilium_groups(&request.req(), Family::V6),
                Vec::from_iter(group)
            );
        }
        let steps = a.steps() - before;
        assert!(steps <= 2 * u64::from(P), "{steps} steps for {P} Services");
    }

    /// The same with P unpinned Cilium pools of IPv4 only beside two of
    /// IPv6 and a MetalLB one: a half-served Service waits for IPv6 on the
    /// unpinned Cilium pools as one group, found without a walk over them
    /// (the walk took P steps per Service).
    #[test]
    fn the_unpinned_cilium_pools_a_half_served_service_waits_on_cost_no_walk() {
        const P: u32 = 2000;
        let mut a = Allocator::new();
        for p in 0..P {
            let cidr = format!("10.{}.{}.0/30", p / 256, p % 256);
            a.set_cilium_pool(&format!("p{p:05}"), &cilium_spec(&[&cidr], None));
        }
        a.set_pool("metallb-v6", &pool_spec(&["fd00:1::/120"]));
        for (name, cidr) in [("v6-b", "fd00:2::/120"), ("v6-a", "fd00:3::/120")] {
            a.set_cilium_pool(name, &cilium_spec(&[cidr], None));
        }
        let before = a.steps();
        for p in 0..P {
            let request = svc(&format!("ns-{p:05}/s")).prefer(Family::V4);
            assert_eq!(
                a.cilium_groups(&request.req(), Family::V6),
                [AutoGroup::Unpinned]
            );
        }
        let steps = a.steps() - before;
        assert!(steps <= 4 * u64::from(P), "{steps} steps for {P} Services");
        assert_eq!(a.check_invariants(), Ok(()));
    }

    /// P unpinned pools of one address each, all full: a Service that finds
    /// no room is told which pools it tried without a walk over them (the
    /// first few by name, the rest counted), so P failures cost O(P), not
    /// O(P²). The walk that named every pool took 2,000 steps per failure.
    #[test]
    fn a_service_that_every_unpinned_pool_refuses_fails_without_a_walk() {
        const P: u32 = 2000;
        let mut a = Allocator::new();
        for p in 0..P {
            a.set_pool(&format!("p{p:05}"), &pool_spec(&[&format!("{}/32", v4(p))]));
        }
        for p in 0..P {
            a.allocate(&svc(&format!("ns/first-{p}")).req()).unwrap();
        }
        let before = a.steps();
        for p in 0..P {
            let refused = a.allocate(&svc(&format!("ns/second-{p}")).req());
            let Err(AllocError::NoAvailable { tried, .. }) = &refused else {
                panic!("{refused:?}");
            };
            assert!(tried.named.is_empty() && tried.pinned.is_none());
            let unpinned = tried.unpinned.as_ref().unwrap();
            assert_eq!(unpinned.count, P as usize);
            assert_eq!(unpinned.first.len(), Tried::LISTED);
            assert_eq!(unpinned.first.first().map(String::as_str), Some("p00000"));
        }
        let steps = a.steps() - before;
        assert!(steps <= u64::from(P) * 16, "{steps} steps");
        let refused = a.allocate(&svc("ns/last").req()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "no available IPs: no pool has an IPv4 address free (tried p00000, p00001, \
             p00002, p00003, p00004, p00005, p00006, p00007, p00008, p00009 and 1990 more)"
        );
    }

    /// P pools of one address each pinned to its own namespace, full: a
    /// Service that finds no room is told so, and the pools that serve it
    /// are found by the index too, not by a walk over every pool.
    #[test]
    fn a_service_whose_pinned_pool_is_full_fails_without_a_walk() {
        const P: u32 = 2000;
        let mut a = Allocator::new();
        for p in 0..P {
            let spec = IPAddressPoolSpec {
                service_allocation: Some(ServiceAllocationSpec {
                    namespaces: vec![format!("ns-{p:05}")],
                    ..Default::default()
                }),
                ..pool_spec(&[&v4(p)])
            };
            a.set_pool(&format!("p{p:05}"), &spec);
        }
        for p in 0..P {
            a.allocate(&svc(&format!("ns-{p:05}/first")).req()).unwrap();
        }
        let before = a.steps();
        for p in 0..P {
            let refused = a.allocate(&svc(&format!("ns-{p:05}/second")).req());
            assert_eq!(
                refused.map(|h| h.pool),
                Err(AllocError::NoAvailable {
                    needed: "an IPv4 address".to_owned(),
                    tried: Tried {
                        pinned: Some(Box::new(PinnedTried {
                            first: vec![format!("p{p:05}")],
                            count: 1,
                            rules: vec![a.rules_of(&format!("p{p:05}"))],
                        })),
                        ..Tried::default()
                    },
                })
            );
            let nowhere = a.allocate(&svc(&format!("elsewhere-{p}/s")).req());
            assert_eq!(nowhere.map(|h| h.pool), Err(AllocError::NoPool));
        }
        let steps = a.steps() - before;
        assert!(steps <= u64::from(P) * 4, "{steps} steps");
    }

    /// P pools of one address each, all pinned to one namespace (half by
    /// `namespaces`, half by a selector of its labels) and full: a Service
    /// there that finds no room counts the pools by their two rules, and
    /// names the first ten, without a walk over them. Naming every pool took
    /// P steps per failure.
    #[test]
    fn a_service_that_many_pinned_pools_refuse_fails_without_a_walk() {
        const P: u32 = 2000;
        let mut a = Allocator::new();
        let team: BTreeMap<String, String> = [("team".to_owned(), "a".to_owned())].into();
        for p in 0..P {
            let allocation = if p % 2 == 0 {
                ServiceAllocationSpec {
                    namespaces: vec!["a".to_owned()],
                    ..Default::default()
                }
            } else {
                ServiceAllocationSpec {
                    namespace_selectors: vec![LabelSelectorSpec {
                        match_labels: team.clone(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }
            };
            let spec = IPAddressPoolSpec {
                service_allocation: Some(allocation),
                ..pool_spec(&[&v4(p)])
            };
            a.set_pool(&format!("p{p:05}"), &spec);
        }
        let in_a = |name: &str| {
            let mut service = svc(&format!("a/{name}"));
            service.namespace_labels = team.clone();
            service
        };
        for p in 0..P {
            a.allocate(&in_a(&format!("first-{p}")).req()).unwrap();
        }
        let rules = [a.rules_of("p00000"), a.rules_of("p00001")];
        assert_ne!(rules[0], rules[1]);
        let before = a.steps();
        for p in 0..P {
            let refused = a.allocate(&in_a(&format!("second-{p}")).req());
            let Err(AllocError::NoAvailable { tried, .. }) = &refused else {
                panic!("{refused:?}");
            };
            let pinned = tried.pinned.as_ref().unwrap();
            assert_eq!(pinned.count, P as usize);
            let mut found = pinned.rules.clone();
            found.sort_unstable();
            let mut expected = rules.to_vec();
            expected.sort_unstable();
            assert_eq!(found, expected);
            assert_eq!(pinned.first.len(), Tried::LISTED);
        }
        let steps = a.steps() - before;
        assert!(steps <= u64::from(P) * 16, "{steps} steps");
        let refused = a.allocate(&in_a("last").req()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "no available IPs: no pool has an IPv4 address free (tried p00000, p00001, \
             p00002, p00003, p00004, p00005, p00006, p00007, p00008, p00009 and 1990 more)"
        );
        // One pool of a rule gone: the rest of that rule are counted still.
        a.remove_pool("p00000");
        let refused = a.allocate(&in_a("after").req()).unwrap_err();
        let AllocError::NoAvailable { tried, .. } = &refused else {
            panic!("{refused:?}");
        };
        assert_eq!(tried.count(), P as usize - 1);
        assert_eq!(
            tried.pinned.as_ref().unwrap().first.first().unwrap(),
            "p00001"
        );
    }

    /// P pools with room pinned alike to one namespace and to `app: web`
    /// Services, and an unpinned pool: a Service of that namespace without
    /// the label asks their rules once and goes on to the unpinned pool,
    /// and one with it takes the first pinned pool with room. The walk over
    /// the pinned pools asked each of them (P steps per Service).
    #[test]
    fn pools_pinned_alike_that_do_not_serve_a_service_cost_it_one_step() {
        const P: u32 = 2000;
        let mut a = Allocator::new();
        for p in 0..P {
            let spec = IPAddressPoolSpec {
                service_allocation: Some(ServiceAllocationSpec {
                    namespaces: vec!["a".to_owned()],
                    service_selectors: vec![LabelSelectorSpec {
                        match_labels: [("app".to_owned(), "web".to_owned())].into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..pool_spec(&[&format!("{}/30", v4(4 * p))])
            };
            a.set_pool(&format!("web-{p:05}"), &spec);
        }
        a.set_pool("rest", &pool_spec(&["10.200.0.0/16"]));
        let before = a.steps();
        for s in 0..P {
            let plain = a.allocate(&svc(&format!("a/plain-{s}")).req()).unwrap();
            assert_eq!(plain.pool, "rest");
            let mut web = svc(&format!("a/web-{s}"));
            web.labels = [("app".to_owned(), "web".to_owned())].into();
            let web = a.allocate(&web.req()).unwrap();
            assert_eq!(web.pool, format!("web-{:05}", s / 4));
        }
        let steps = a.steps() - before;
        assert!(steps <= u64::from(P) * 8, "{steps} steps");
    }

    /// P pools each pinned to namespace `a` and to its own `app: web-P`
    /// label (by MetalLB's two rules, or by one Cilium selector of both),
    /// and an unpinned pool: a Service of `a` with one of those labels
    /// visits its own pool's rules, not those of every pool of the
    /// namespace before it (indexed by the namespace alone, ~P/2 steps per
    /// Service), and one without such a label goes on to the unpinned pool.
    #[test]
    fn pools_pinned_to_a_namespace_and_a_label_each_are_found_by_both() {
        const P: u32 = 2000;
        for cilium in [false, true] {
            let mut a = Allocator::new();
            for p in 0..P {
                let (name, label) = (format!("web-{p:05}"), format!("web-{p}"));
                let cidr = format!("{}/30", v4(4 * p));
                pinned_pool(&mut a, cilium, (&name, cidr), "a".to_owned(), Some(label));
            }
            a.set_pool("rest", &pool_spec(&["10.200.0.0/16"]));
            let before = a.steps();
            for p in (0..P).rev() {
                let mut web = svc(&format!("a/web-{p}"));
                web.labels = [("app".to_owned(), format!("web-{p}"))].into();
                let web = a.allocate(&web.req()).unwrap();
                assert_eq!(web.pool, format!("web-{p:05}"), "cilium {cilium}");
                // The same label in another namespace: no pinned pool.
                let mut elsewhere = svc(&format!("b/web-{p}"));
                elsewhere.labels = [("app".to_owned(), format!("web-{p}"))].into();
                assert_eq!(a.allocate(&elsewhere.req()).unwrap().pool, "rest");
                let plain = a.allocate(&svc(&format!("a/plain-{p}")).req()).unwrap();
                assert_eq!(plain.pool, "rest");
            }
            let steps = a.steps() - before;
            assert!(steps <= u64::from(P) * 12, "cilium {cilium}: {steps} steps");
        }
    }

    #[test]
    fn services_visit_only_the_pools_pinned_to_their_namespace() {
        for cilium in [false, true] {
            let indexed = namespace_pinned(2000, cilium, false);
            assert!(indexed <= 2 * 2000 * 4, "cilium {cilium}: {indexed} steps");
            // The bound means something: at a fifth of the size, the walk
            // over every pinned pool already takes 20 times the steps.
            let indexed = namespace_pinned(400, cilium, false);
            let walked = namespace_pinned(400, cilium, true);
            assert!(
                walked > 20 * indexed,
                "cilium {cilium}: {walked} vs {indexed}"
            );
        }
    }
}

// ----- Cilium pools and sharing (docs/cilium.md §2, §3.4, §4) -----

mod cilium {
    use super::*;
    use crate::cilium::{CiliumBlock, CiliumLoadBalancerIPPoolSpec};

    fn cidrs(list: &[&str]) -> CiliumLoadBalancerIPPoolSpec {
        CiliumLoadBalancerIPPoolSpec {
            blocks: list
                .iter()
                .map(|c| CiliumBlock {
                    cidr: Some(c.to_string()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn no_ends(list: &[&str]) -> CiliumLoadBalancerIPPoolSpec {
        CiliumLoadBalancerIPPoolSpec {
            allow_first_last_ips: Some("No".into()),
            ..cidrs(list)
        }
    }

    fn counts(a: &Allocator, name: &str) -> (String, String, String) {
        let stats = a.pool_stats().into_iter().find(|p| p.name == name).unwrap();
        let c = stats.cilium_counts();
        (
            c.total.to_string(),
            c.used.to_string(),
            c.available.to_string(),
        )
    }

    fn strings(t: (&str, &str, &str)) -> (String, String, String) {
        (t.0.into(), t.1.into(), t.2.into())
    }

    #[test]
    fn reserved_ends_are_never_given_kept_or_requested() {
        let mut a = Allocator::new();
        a.set_cilium_pool("p", &no_ends(&["10.0.10.16/30"]));
        assert_eq!(one(&mut a, &svc("ns/a")), "10.0.10.17");
        assert_eq!(one(&mut a, &svc("ns/b")), "10.0.10.18");
        assert!(matches!(
            alloc(&mut a, &svc("ns/c")),
            Err(AllocError::NoAvailable { .. })
        ));
        let asked = alloc(&mut a, &svc("ns/c").asking(&["10.0.10.16"])).unwrap_err();
        assert_eq!(
            asked.to_string(),
            "10.0.10.16 is reserved by pool \"p\" (allowFirstLastIPs: No)"
        );
        assert_eq!(
            a.keep(&svc("ns/c").req(), &ips(&["10.0.10.19"])),
            Err(AllocError::AddressReserved {
                ip: ip("10.0.10.19"),
                pool: "p".into()
            })
        );
        // Yes frees the ends; No again takes them back from their holder.
        a.set_cilium_pool("p", &cidrs(&["10.0.10.16/30"]));
        assert_eq!(one(&mut a, &svc("ns/c")), "10.0.10.16");
        assert_eq!(counts(&a, "p"), strings(("4", "3", "1")));
        let change = a.set_cilium_pool("p", &no_ends(&["10.0.10.16/30"]));
        assert_eq!(change.released.len(), 1);
        assert_eq!(change.released[0].key, "ns/c");
        assert_eq!(
            change.released[0].reason,
            "10.0.10.16 is reserved by pool \"p\" (allowFirstLastIPs: No)"
        );
        assert_eq!(a.holding("ns/a").unwrap().ips, ips(&["10.0.10.17"]));
        assert_eq!(counts(&a, "p"), strings(("4", "4", "0")));
        a.check_invariants().unwrap();
    }

    #[test]
    fn counts_as_cilium_writes_them_exact_at_any_size() {
        let mut a = Allocator::new();
        a.set_cilium_pool("no", &no_ends(&["10.0.10.0/24"]));
        a.set_cilium_pool("yes", &cidrs(&["10.0.20.0/24"]));
        assert_eq!(counts(&a, "no"), strings(("256", "2", "254")));
        assert_eq!(counts(&a, "yes"), strings(("256", "0", "256")));
        let stats = a.pool_stats();
        let no = stats.iter().find(|p| p.name == "no").unwrap();
        assert_eq!(no.kind, PoolKind::CiliumLoadBalancerIPPool);
        assert_eq!((no.ipv4.assigned, no.ipv4.reserved), (0, 2));
        // A shared address counts once.
        let s1 = svc("ns/s1").asking(&["10.0.10.1"]).share("k", &[80]);
        let s2 = svc("ns/s2").asking(&["10.0.10.1"]).share("k", &[443]);
        alloc(&mut a, &s1).unwrap();
        alloc(&mut a, &s2).unwrap();
        assert_eq!(counts(&a, "no"), strings(("256", "3", "253")));

        let mut all = Allocator::new();
        all.set_cilium_pool("all", &no_ends(&["::/0", "0.0.0.0/0"]));
        assert_eq!(
            counts(&all, "all"),
            strings((
                "340282366920938463463374607436063178752",
                "4",
                "340282366920938463463374607436063178748"
            ))
        );
    }

    #[test]
    fn a_disabled_pool_keeps_its_holders_and_gives_nothing_new() {
        let mut a = Allocator::new();
        a.set_cilium_pool("c", &cidrs(&["10.0.0.0/30"]));
        a.set_pool("m", &pool_spec(&["10.0.1.0/30"]));
        assert_eq!(one(&mut a, &svc("ns/a")), "10.0.0.0");
        let disabled = CiliumLoadBalancerIPPoolSpec {
            disabled: true,
            ..cidrs(&["10.0.0.0/30"])
        };
        let change = a.set_cilium_pool("c", &disabled);
        assert!(change.released.is_empty() && change.rejected.is_empty());
        assert_eq!(a.holding("ns/a").unwrap().ips, ips(&["10.0.0.0"]));
        assert!(a.keep(&svc("ns/a").req(), &ips(&["10.0.0.0"])).is_ok());
        assert_eq!(one(&mut a, &svc("ns/b")), "10.0.1.0");
        assert_eq!(
            alloc(&mut a, &svc("ns/c").asking(&["10.0.0.1"])),
            Err(AllocError::PoolDisabled { pool: "c".into() })
        );
        let explained = a.explain(&svc("ns/c").req());
        let verdict = explained.pools.iter().find(|p| p.pool == "c").unwrap();
        assert_eq!(verdict.verdict, Verdict::Disabled);
        // It still counts, and a lone PreferDualStack address is not completed from it.
        assert_eq!(counts(&a, "c"), strings(("4", "1", "3")));
        assert_eq!(
            a.complete_dual_stack(&svc("ns/a").prefer(Family::V4).req()),
            None
        );
    }

    #[test]
    fn pools_of_both_kinds_overlap_the_older_wins_either_way() {
        for cilium_first in [false, true] {
            let mut a = Allocator::new();
            let add = |a: &mut Allocator, cilium: bool, name: &str, created: i128| {
                if cilium {
                    a.set_cilium_pool_created(name, &cidrs(&["10.0.0.0/24"]), Some(created))
                } else {
                    a.set_pool_created(name, &pool_spec(&["10.0.0.0/24"]), Some(created))
                }
            };
            // The newer arrives first: creation time decides, not arrival.
            add(&mut a, !cilium_first, "newer", 2);
            add(&mut a, cilium_first, "older", 1);
            let rejected = a.rejected_pools();
            assert_eq!(rejected.len(), 1);
            let loser = &rejected[0];
            assert_eq!(loser.name, "newer");
            let older_kind = if cilium_first {
                PoolKind::CiliumLoadBalancerIPPool
            } else {
                PoolKind::IPAddressPool
            };
            assert_eq!(loser.kind, older_kind.other());
            let conflict = loser.conflict.as_ref().unwrap();
            assert_eq!(
                (conflict.other_pool.as_str(), conflict.other_kind),
                ("older", older_kind)
            );
            assert_eq!(
                conflict.cilium_message(),
                "Pool conflicts since range '10.0.0.0 - 10.0.0.255' overlaps range '10.0.0.0 - 10.0.0.255' from IP Pool 'older'"
            );
            let word = if cilium_first {
                "CiliumLoadBalancerIPPool"
            } else {
                "pool"
            };
            assert_eq!(
                loser.reason,
                format!("addresses \"10.0.0.0-10.0.0.255\" overlap \"10.0.0.0-10.0.0.255\" of {word} \"older\"")
            );
            assert_eq!(one(&mut a, &svc("ns/a")), "10.0.0.0");
            assert_eq!(a.holding("ns/a").unwrap().pool, "older");
            // Deleting the older accepts the newer; the holder's address
            // lies in it, so it stays, now from the newer pool.
            let change = a.remove_pool_of(older_kind, "older");
            assert!(change.released.is_empty());
            assert!(a.rejected_pools().is_empty());
            assert_eq!(a.pool("newer").unwrap().kind, older_kind.other());
            assert_eq!(a.holding("ns/a").unwrap().pool, "newer");
            assert_eq!(one(&mut a, &svc("ns/b")), "10.0.0.1");
        }
    }

    #[test]
    fn a_pool_overlapping_itself_names_itself() {
        let mut a = Allocator::new();
        let change = a.set_cilium_pool("blue", &cidrs(&["10.0.0.0/24", "10.0.0.0/24"]));
        let conflict = change.rejected[0].conflict.as_ref().unwrap();
        assert_eq!(
            conflict.cilium_message(),
            "Pool conflicts since range '10.0.0.0 - 10.0.0.255' overlaps range '10.0.0.0 - 10.0.0.255' from IP Pool 'blue'"
        );
        // An invalid pool has no conflict.
        let change = a.set_cilium_pool(
            "bad",
            &CiliumLoadBalancerIPPoolSpec {
                allow_first_last_ips: Some("maybe".into()),
                ..Default::default()
            },
        );
        assert_eq!(change.rejected[0].conflict, None);
    }

    #[test]
    fn one_name_space_the_older_object_takes_the_name() {
        for cilium_first in [false, true] {
            let mut a = Allocator::new();
            let c = |a: &mut Allocator, created| {
                a.set_cilium_pool_created("default", &cidrs(&["10.0.1.0/30"]), Some(created))
            };
            let m = |a: &mut Allocator, created| {
                a.set_pool_created("default", &pool_spec(&["10.0.0.0/30"]), Some(created))
            };
            // Arrival in the other order than creation.
            if cilium_first {
                m(&mut a, 2);
                c(&mut a, 1);
            } else {
                c(&mut a, 2);
                m(&mut a, 1);
            }
            let (older, newer) = if cilium_first {
                (PoolKind::CiliumLoadBalancerIPPool, PoolKind::IPAddressPool)
            } else {
                (PoolKind::IPAddressPool, PoolKind::CiliumLoadBalancerIPPool)
            };
            let rejected = a.rejected_pools();
            assert_eq!(rejected.len(), 1, "{rejected:?}");
            assert_eq!(rejected[0].kind, newer);
            assert_eq!(
                rejected[0].reason,
                format!("name \"default\" is taken by the older {older} \"default\"")
            );
            assert_eq!(a.pool("default").unwrap().kind, older);
            let first = one(&mut a, &svc("ns/a"));
            a.check_invariants().unwrap();
            // Deleting the newer changes nothing for the older's holders.
            let change = a.remove_pool_of(newer, "default");
            assert!(change.released.is_empty());
            assert_eq!(a.holding("ns/a").unwrap().ips, ips(&[first.as_str()]));
            // Back, then the older goes: the newer takes the name.
            if cilium_first {
                m(&mut a, 2)
            } else {
                c(&mut a, 2)
            };
            assert_eq!(a.rejected_pools().len(), 1);
            let change = a.remove_pool_of(older, "default");
            assert_eq!(change.released.len(), 1);
            assert!(a.rejected_pools().is_empty());
            assert_eq!(a.pool("default").unwrap().kind, newer);
            a.check_invariants().unwrap();
        }
    }

    #[test]
    fn address_pool_names_ipaddresspools_only() {
        let mut a = Allocator::new();
        a.set_cilium_pool("c", &cidrs(&["10.0.0.0/30"]));
        let err = alloc(&mut a, &svc("ns/a").in_pool("c")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown pool \"c\" (a CiliumLoadBalancerIPPool \"c\" exists; Cilium pools are chosen by their serviceSelector)"
        );
        assert_eq!(
            alloc(&mut a, &svc("ns/a").in_pool("c").asking(&["10.0.0.1"])),
            Err(AllocError::CiliumPoolNamed { pool: "c".into() })
        );
        let explained = a.explain(&svc("ns/a").in_pool("c").req());
        assert!(explained.pools.is_empty());
        assert!(matches!(
            explained.outcome,
            Err(AllocError::CiliumPoolNamed { .. })
        ));
        // A rejected Cilium pool of that name gives the same hint.
        a.set_cilium_pool("r", &cidrs(&["10.0.0.0/30"]));
        assert!(matches!(
            alloc(&mut a, &svc("ns/a").in_pool("r")),
            Err(AllocError::CiliumPoolNamed { .. })
        ));
    }

    #[test]
    fn candidate_order_selector_pools_with_pinned_ones_then_the_rest_by_name() {
        let mut a = Allocator::new();
        let selecting = CiliumLoadBalancerIPPoolSpec {
            service_selector: Some(LabelSelectorSpec::default()),
            ..cidrs(&["10.0.3.0/32"])
        };
        a.set_pool("a-open", &pool_spec(&["10.0.0.0/32"]));
        a.set_cilium_pool("b-open", &cidrs(&["10.0.1.0/32"]));
        a.set_cilium_pool("z-selecting", &selecting);
        let mut pinned = pool_spec(&["10.0.2.0/32"]);
        pinned.service_allocation = Some(ServiceAllocationSpec {
            priority: Some(1),
            ..Default::default()
        });
        a.set_pool("y-priority", &pinned);
        let got: Vec<String> = (0..4)
            .map(|i| one(&mut a, &svc(&format!("ns/s{i}"))))
            .collect();
        assert_eq!(got, ["10.0.2.0", "10.0.3.0", "10.0.0.0", "10.0.1.0"]);
    }

    #[test]
    fn cilium_keys_share_across_namespaces_only_when_both_admit() {
        let mut a = Allocator::new();
        a.set_cilium_pool("p", &cidrs(&["10.0.0.0/30"]));
        let first = svc("a/x").cilium_share("k", &[80]);
        assert_eq!(one(&mut a, &first), "10.0.0.0");
        // Same namespace: shares.
        assert_eq!(
            one(&mut a, &svc("a/y").cilium_share("k", &[81])),
            "10.0.0.0"
        );
        // Another namespace, admitted by neither, by one side only: not shared.
        assert_eq!(
            one(&mut a, &svc("b/z").cilium_share("k", &[82])),
            "10.0.0.1"
        );
        assert_eq!(
            alloc(
                &mut a,
                &svc("b/w")
                    .cilium_share("k", &[83])
                    .admitting(&["a"])
                    .asking(&["10.0.0.0"])
            ),
            Err(AllocError::Taken {
                ip: ip("10.0.0.0"),
                conflict: ShareConflict::Namespace {
                    holder: "a/x".into()
                }
            })
        );
        // Both sides admit: a/x and a/y list b (one by "*").
        a.release("b/z");
        let x = svc("a/x").cilium_share("k", &[80]).admitting(&["b"]);
        let y = svc("a/y").cilium_share("k", &[81]).admitting(&["*"]);
        a.keep(&x.req(), &ips(&["10.0.0.0"])).unwrap();
        a.keep(&y.req(), &ips(&["10.0.0.0"])).unwrap();
        let w = svc("b/w").cilium_share("k", &[83]).admitting(&["a"]);
        assert_eq!(one(&mut a, &w), "10.0.0.0");
        // A newcomer of b that admits nobody is refused there.
        assert_eq!(
            one(&mut a, &svc("b/v").cilium_share("k", &[84])),
            "10.0.0.1"
        );
        a.check_invariants().unwrap();
    }

    #[test]
    fn keys_of_the_two_rules_never_share() {
        let mut a = Allocator::new();
        a.set_pool("p", &pool_spec(&["10.0.0.0/30"]));
        assert_eq!(one(&mut a, &svc("ns/m").share("k", &[80])), "10.0.0.0");
        assert_eq!(
            one(&mut a, &svc("ns/c").cilium_share("k", &[81])),
            "10.0.0.1"
        );
        assert_eq!(
            alloc(
                &mut a,
                &svc("ns/d").cilium_share("k", &[82]).asking(&["10.0.0.0"])
            ),
            Err(AllocError::Taken {
                ip: ip("10.0.0.0"),
                conflict: ShareConflict::OtherKey {
                    holder: "ns/m".into()
                }
            })
        );
        // MetalLB keys keep sharing across namespaces by default.
        assert_eq!(one(&mut a, &svc("other/m2").share("k", &[81])), "10.0.0.0");
    }

    #[test]
    fn a_cilium_key_joins_its_group_before_a_free_address() {
        let mut a = Allocator::new();
        a.set_pool("a", &pool_spec(&["10.0.0.0/29"]));
        for i in 0..3 {
            one(&mut a, &svc(&format!("ns/s{i}")));
        }
        assert_eq!(
            one(&mut a, &svc("ns/c1").cilium_share("k", &[80])),
            "10.0.0.3"
        );
        assert_eq!(one(&mut a, &svc("ns/m1").share("k", &[80])), "10.0.0.4");
        a.release("ns/s0");
        // MetalLB: the lowest fitting address, free or stacked.
        assert_eq!(one(&mut a, &svc("ns/m2").share("k", &[81])), "10.0.0.0");
        // Cilium: its group's address first, although .0 is lower.
        a.release("ns/m2");
        assert_eq!(
            one(&mut a, &svc("ns/c2").cilium_share("k", &[81])),
            "10.0.0.3"
        );
        // Across pools too: the group stands in the later pool "b".
        a.set_pool("b", &pool_spec(&["10.0.1.0/30"]));
        let c3 = svc("ns/c3").cilium_share("j", &[80]).asking(&["10.0.1.2"]);
        alloc(&mut a, &c3).unwrap();
        assert_eq!(
            one(&mut a, &svc("ns/c4").cilium_share("j", &[81])),
            "10.0.1.2"
        );
        // A port clash sends it to a free address.
        assert_eq!(
            one(&mut a, &svc("ns/c5").cilium_share("j", &[80])),
            "10.0.0.0"
        );
        // A dual-stack Service joins both families of its group at once.
        a.set_pool("d", &pool_spec(&["10.0.2.0/30", "fd00::/126"]));
        let c6 = svc("ns/c6")
            .dual()
            .cilium_share("d", &[80])
            .asking(&["10.0.2.1", "fd00::1"]);
        alloc(&mut a, &c6).unwrap();
        let c7 = svc("ns/c7").dual().cilium_share("d", &[81]);
        assert_eq!(one(&mut a, &c7), "10.0.2.1,fd00::1");
    }

    #[test]
    fn the_namespace_rule_asks_once_per_tenancy_not_per_holder() {
        let mut a = Allocator::new();
        a.set_pool("p", &pool_spec(&["10.0.0.0/30"]));
        // 200 Services of namespace a, all admitting b: one tenancy.
        for i in 0..200 {
            let s = svc(&format!("a/s{i}"))
                .cilium_share("k", &[1000 + i])
                .admitting(&["b"]);
            assert_eq!(one(&mut a, &s), "10.0.0.0");
        }
        let newcomer = svc("b/n").cilium_share("k", &[80]).admitting(&["a"]);
        let before = a.steps();
        assert!(a.can_keep(&newcomer.req(), &ips(&["10.0.0.0"])).is_ok());
        let cost = a.steps() - before;
        assert!(cost < 20, "the check cost {cost} steps");
        // One more holder that admits nobody: refused, and named.
        let closed = svc("a/closed").cilium_share("k", &[81]);
        a.keep(&closed.req(), &ips(&["10.0.0.0"])).unwrap();
        assert_eq!(
            a.can_keep(&newcomer.req(), &ips(&["10.0.0.0"])),
            Err(AllocError::Taken {
                ip: ip("10.0.0.0"),
                conflict: ShareConflict::Namespace {
                    holder: "a/closed".into()
                }
            })
        );
        // Allocated, it goes elsewhere.
        assert_eq!(one(&mut a, &newcomer), "10.0.0.1");
        a.check_invariants().unwrap();
    }
}

/// docs/cilium.md §3.5, §4.3 item 4: a dual-stack holding in two Cilium
/// pools, one per family, as Cilium gets and keeps each family on its own;
/// a pair with an address in an `IPAddressPool` keeps MetalLB's rule.
mod two_pools {
    use super::*;
    use crate::cilium::{CiliumBlock, CiliumLoadBalancerIPPoolSpec};

    fn blocks(list: &[&str]) -> CiliumLoadBalancerIPPoolSpec {
        CiliumLoadBalancerIPPoolSpec {
            blocks: list
                .iter()
                .map(|c| CiliumBlock {
                    cidr: Some(c.to_string()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Cilium pools c4 (IPv4 only) and c6 (IPv6 only).
    fn split_pools() -> Allocator {
        let mut a = Allocator::new();
        a.set_cilium_pool("c4", &blocks(&["10.0.0.0/30"]));
        a.set_cilium_pool("c6", &blocks(&["fd00::/126"]));
        a
    }

    fn pools(h: &Holding) -> (String, Option<String>) {
        (h.pool.clone(), h.other_pool.clone())
    }

    #[test]
    fn a_dual_stack_service_takes_one_family_from_each_cilium_pool() {
        let mut a = split_pools();
        for (key, s) in [
            ("ns/a", svc("ns/a").dual()),
            ("ns/b", svc("ns/b").prefer(Family::V6)),
        ] {
            let h = a.allocate(&s.req()).unwrap();
            assert_eq!(pools(&h), ("c4".into(), Some("c6".into())), "{key}");
            a.check_invariants().unwrap();
        }
        assert_eq!(a.holding("ns/a").unwrap().ips, ips(&["10.0.0.0", "fd00::"]));
        assert_eq!(
            a.holding("ns/b").unwrap().ips,
            ips(&["10.0.0.1", "fd00::1"])
        );
        assert_eq!(a.holding("ns/b").unwrap().pool_of(ip("fd00::1")), "c6");
        // Counted in each pool.
        let stats = a.pool_stats();
        assert_eq!(
            stats
                .iter()
                .map(|s| (s.ipv4.assigned, s.ipv6.assigned))
                .collect::<Vec<_>>(),
            [(2, 0), (0, 2)]
        );
        // Released from both.
        a.release("ns/a");
        a.check_invariants().unwrap();
        assert_eq!(
            alloc(&mut a, &svc("ns/c").dual()).unwrap(),
            ["10.0.0.0", "fd00::"]
        );
    }

    #[test]
    fn one_pool_with_both_families_comes_before_two() {
        let mut a = split_pools();
        a.set_cilium_pool("z", &blocks(&["10.0.9.0/30", "fd00:9::/126"]));
        let h = a.allocate(&svc("ns/a").dual().req()).unwrap();
        assert_eq!(
            (pools(&h), h.ips),
            (("z".into(), None), ips(&["10.0.9.0", "fd00:9::"]))
        );
    }

    #[test]
    fn no_split_when_the_first_pool_with_a_free_address_is_an_ipaddresspool() {
        let mut a = split_pools();
        // "a6" comes before "c6" in the order: the first with a free IPv6.
        a.set_pool("a6", &pool_spec(&["fd00:a::/126"]));
        assert!(matches!(
            a.allocate(&svc("ns/a").dual().req()),
            Err(AllocError::NoAvailable { .. })
        ));
        // PreferDualStack settles for one address, as before.
        let h = a.allocate(&svc("ns/b").prefer(Family::V4).req()).unwrap();
        assert_eq!(
            (pools(&h), h.ips),
            (("c4".into(), None), ips(&["10.0.0.0"]))
        );
        a.check_invariants().unwrap();
    }

    #[test]
    fn requested_addresses_in_two_cilium_pools_each_from_its_own() {
        let mut a = split_pools();
        let s = svc("ns/a").dual().asking(&["10.0.0.2", "fd00::3"]);
        let h = a.allocate(&s.req()).unwrap();
        assert_eq!(pools(&h), ("c4".into(), Some("c6".into())));
        assert_eq!(h.ips, ips(&["10.0.0.2", "fd00::3"]));
        a.check_invariants().unwrap();
        // With one of them in an IPAddressPool: one pool, as MetalLB.
        a.set_pool("m6", &pool_spec(&["fd00:6::/126"]));
        let s = svc("ns/b").dual().asking(&["10.0.0.1", "fd00:6::1"]);
        assert!(matches!(
            a.allocate(&s.req()),
            Err(AllocError::DifferentPools { .. })
        ));
        assert_eq!(a.holding("ns/b"), None);
    }

    #[test]
    fn restart_keeps_a_pair_held_in_two_cilium_pools() {
        let mut a = split_pools();
        let s = svc("ns/a").dual();
        // As recorded from Cilium: addresses that are not the lowest.
        let h = a.keep(&s.req(), &ips(&["fd00::2", "10.0.0.3"])).unwrap();
        assert_eq!(pools(&h), ("c4".into(), Some("c6".into())));
        assert_eq!(h.ips, ips(&["10.0.0.3", "fd00::2"]));
        assert_eq!(a.can_keep(&s.req(), &h.ips), Ok(()));
        a.check_invariants().unwrap();
        // Kept again (every reconciliation): nothing changes.
        assert_eq!(a.keep(&s.req(), &h.ips).unwrap(), h);
        // Another Service cannot keep either address.
        let b = svc("ns/b").v6();
        assert!(a.keep(&b.req(), &ips(&["fd00::2"])).is_err());
        // A pool that stops serving the Service: the pair goes per address.
        let narrowed = CiliumLoadBalancerIPPoolSpec {
            service_selector: Some(LabelSelectorSpec {
                match_labels: BTreeMap::from([("app".to_owned(), "x".to_owned())]),
                ..Default::default()
            }),
            ..blocks(&["fd00::/126"])
        };
        a.set_cilium_pool("c6", &narrowed);
        let (kept, dropped) = a.keep_part(&s.req(), &h.ips).unwrap();
        assert_eq!(kept.ips, ips(&["10.0.0.3"]));
        assert_eq!(
            dropped,
            Some((
                ip("fd00::2"),
                AllocError::PoolDoesNotServe { pool: "c6".into() }
            ))
        );
        a.check_invariants().unwrap();
    }

    #[test]
    fn removing_one_of_the_two_pools_lets_go_of_that_family_only() {
        let mut a = split_pools();
        let s = svc("ns/a").dual();
        a.allocate(&s.req()).unwrap();
        // Another Service shares the IPv4 address (a Cilium key).
        let x = svc("ns/x").dual().cilium_share("k", &[80]);
        let y = svc("ns/y").cilium_share("k", &[443]);
        assert_eq!(
            a.allocate(&x.req()).unwrap().ips,
            ips(&["10.0.0.1", "fd00::1"])
        );
        assert_eq!(a.allocate(&y.req()).unwrap().ips, ips(&["10.0.0.1"]));
        let change = a.remove_cilium_pool("c6");
        a.check_invariants().unwrap();
        let released: Vec<(String, Vec<IpAddr>)> = change
            .released
            .iter()
            .map(|r| (r.key.clone(), r.ips.clone()))
            .collect();
        assert_eq!(
            released,
            [
                ("ns/a".to_owned(), ips(&["fd00::"])),
                ("ns/x".to_owned(), ips(&["fd00::1"]))
            ]
        );
        // The IPv4 addresses stay where they were, the shared one shared.
        assert_eq!(pools(&a.holding("ns/a").unwrap()), ("c4".into(), None));
        assert_eq!(a.holding("ns/a").unwrap().ips, ips(&["10.0.0.0"]));
        assert_eq!(a.holders(ip("10.0.0.1")), ["ns/x", "ns/y"]);
        // The status still shows the pair: the IPv4 address is kept alone,
        // and the IPv6 one comes from the next Cilium pool with room.
        let (kept, dropped) = a
            .keep_part(&s.req(), &ips(&["10.0.0.0", "fd00::"]))
            .unwrap();
        assert_eq!(kept.ips, ips(&["10.0.0.0"]));
        assert!(matches!(
            dropped,
            Some((_, AllocError::NotInAnyPool { .. }))
        ));
        assert_eq!(a.complete_dual_stack(&s.req()), None, "no IPv6 pool left");
        a.set_cilium_pool("d6", &blocks(&["fd00:d::/126"]));
        let h = a.complete_dual_stack(&s.req()).unwrap();
        assert_eq!(
            (pools(&h), h.ips),
            (
                ("c4".into(), Some("d6".into())),
                ips(&["10.0.0.0", "fd00:d::"])
            )
        );
        a.check_invariants().unwrap();
        // Removing the IPv4 pool: the IPv6 address stays, now the first.
        let change = a.remove_cilium_pool("c4");
        assert_eq!(change.released.len(), 3, "{:?}", change.released);
        let h = a.holding("ns/a").unwrap();
        assert_eq!(
            (pools(&h), h.ips),
            (("d6".into(), None), ips(&["fd00:d::"]))
        );
        assert_eq!(a.holding("ns/y"), None);
        a.check_invariants().unwrap();
    }

    #[test]
    fn a_pair_with_an_address_in_an_ipaddresspool_goes_together() {
        let mut a = Allocator::new();
        a.set_pool("m", &pool_spec(&["10.0.0.0/30", "fd00::/126"]));
        let s = svc("ns/a").dual();
        a.allocate(&s.req()).unwrap();
        let change = a.set_pool("m", &pool_spec(&["10.0.0.0/30"]));
        assert_eq!(change.released.len(), 1);
        assert_eq!(change.released[0].ips, ips(&["10.0.0.0", "fd00::"]));
        assert_eq!(a.holding("ns/a"), None);
        assert!(a.keep(&s.req(), &ips(&["10.0.0.0", "fd00::"])).is_err());
        // And a pair across the two kinds is not kept per address either.
        a.set_cilium_pool("c6", &blocks(&["fd00::/126"]));
        assert!(matches!(
            a.keep(&s.req(), &ips(&["10.0.0.0", "fd00::"])),
            Err(AllocError::DifferentPools { .. })
        ));
        a.check_invariants().unwrap();
    }
}

// ----- The index of pinned pools (docs/allocation.md §4.9) -----

/// A Service visits only the pinned pools its facts lead to, and the
/// choices are those of the walk over every pinned pool.
mod pinned_index {
    use super::*;
    use crate::spec::LabelSelectorRequirementSpec;

    use crate::selector::tests::{labels, spec as selector};

    fn metallb(addresses: &[&str], allocation: ServiceAllocationSpec) -> IPAddressPoolSpec {
        IPAddressPoolSpec {
            service_allocation: Some(allocation),
            ..pool_spec(addresses)
        }
    }

    /// Pinned pools of every kind of rule, guarded and not, and one
    /// unpinned pool.
    fn mixed(every_pinned: bool) -> Allocator {
        let mut a = Allocator::new();
        a.every_pinned = every_pinned;
        let only = |namespaces: &[&str]| ServiceAllocationSpec {
            namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        a.set_pool(
            "a-prod",
            &metallb(
                &["10.1.0.0/30"],
                ServiceAllocationSpec {
                    priority: Some(1),
                    ..only(&["prod"])
                },
            ),
        );
        let web_or_api = selector(&[], &[("app", "In", &["web", "api"])]);
        a.set_pool(
            "b-web-or-api",
            &metallb(
                &["10.2.0.0/30"],
                ServiceAllocationSpec {
                    priority: Some(2),
                    service_selectors: vec![web_or_api],
                    ..Default::default()
                },
            ),
        );
        let not_db = selector(&[], &[("app", "NotIn", &["db"])]);
        a.set_pool(
            "c-not-db",
            &metallb(
                &["10.3.0.0/32"],
                ServiceAllocationSpec {
                    priority: Some(3),
                    service_selectors: vec![not_db],
                    ..Default::default()
                },
            ),
        );
        let edge = selector(&[("tier", "edge")], &[]);
        a.set_pool(
            "d-dev-edge",
            &metallb(
                &["10.4.0.0/30"],
                ServiceAllocationSpec {
                    service_selectors: vec![edge],
                    ..only(&["dev"])
                },
            ),
        );
        let gold = selector(&[("tier", "gold")], &[]);
        a.set_pool(
            "e-gold-namespaces",
            &metallb(
                &["10.5.0.0/30"],
                ServiceAllocationSpec {
                    namespace_selectors: vec![gold],
                    ..Default::default()
                },
            ),
        );
        let in_dev = selector(&[(SERVICE_NAMESPACE_LABEL, "dev")], &[]);
        a.set_cilium_pool("f-cilium-dev", &cilium_spec(&["10.6.0.0/30"], Some(in_dev)));
        let named = selector(&[], &[(SERVICE_NAME_LABEL, "In", &["x", "y"])]);
        a.set_cilium_pool("g-cilium-xy", &cilium_spec(&["10.7.0.0/30"], Some(named)));
        let labelled = selector(&[], &[("app", "Exists", &[])]);
        a.set_cilium_pool(
            "h-cilium-app",
            &cilium_spec(&["10.8.0.0/32"], Some(labelled)),
        );
        a.set_pool("z-rest", &pool_spec(&["10.9.0.0/24"]));
        a
    }

    /// Services in every case, each with the pool it gets (in order: full
    /// pools drop out of the index).
    fn cases() -> Vec<(Svc, &'static str)> {
        let with = |key: &str, pairs: &[(&str, &str)]| {
            let mut s = svc(key);
            s.labels = labels(pairs);
            s
        };
        let mut gold = svc("shop/g");
        gold.namespace_labels = labels(&[("tier", "gold")]);
        vec![
            (svc("prod/p1"), "a-prod"),
            (with("other/w", &[("app", "web")]), "b-web-or-api"),
            (with("other/a", &[("app", "api")]), "b-web-or-api"),
            // No app label: NotIn matches; then the pool is full.
            (svc("other/n"), "c-not-db"),
            (
                with("dev/e", &[("app", "db"), ("tier", "edge")]),
                "d-dev-edge",
            ),
            (with("dev/plain", &[("app", "db")]), "f-cilium-dev"),
            (gold, "e-gold-namespaces"),
            // A real label of the pseudo-label's key does not pin it in.
            (
                with("qa/x", &[(SERVICE_NAMESPACE_LABEL, "dev")]),
                "g-cilium-xy",
            ),
            (with("qa/z", &[("app", "db")]), "h-cilium-app"),
            (with("qa/q", &[("app", "db")]), "z-rest"),
            (svc("qa/r"), "z-rest"),
        ]
    }

    #[test]
    fn a_mix_of_pinned_pools_chooses_as_the_walk_over_every_one() {
        let mut indexed = mixed(false);
        let mut walked = mixed(true);
        for (service, pool) in cases() {
            let got = indexed.allocate(&service.req()).map(|h| h.pool);
            assert_eq!(got.as_deref(), Ok(pool), "{}", service.key);
            assert_eq!(
                walked.allocate(&service.req()).map(|h| h.pool),
                got,
                "{}",
                service.key
            );
        }
        assert_eq!(indexed.holdings(), walked.holdings());
        indexed.check_invariants().unwrap();
        assert!(indexed.steps() < walked.steps());
    }

    #[test]
    fn a_service_no_pinned_pool_names_visits_the_unguarded_ones_only() {
        let a = mixed(false);
        let before = a.steps();
        let holding = a.choose_new(&svc("qa/r").req()).unwrap();
        assert_eq!(&*holding.0 .0, "c-not-db");
        // c-not-db, served; and its lowest free address.
        assert_eq!(a.steps() - before, 2);
        let before = a.steps();
        let mut db = svc("qa/r");
        db.labels = labels(&[("app", "db")]);
        assert_eq!(&*a.choose_new(&db.req()).unwrap().0 .0, "h-cilium-app");
        // c-not-db, h-cilium-app, and the lowest free address.
        assert_eq!(a.steps() - before, 3);
    }

    /// P pinned pools whose rules name no fact (`team NotIn [x, yK]`, all
    /// different), then an unpinned one; Services in a `team: x` Namespace
    /// are refused by every pinned one. Returns the answers (pool per
    /// Service) and the steps the Services took.
    fn refused_by_every_unguarded(
        pools: u32,
        services: u32,
        every_pinned: bool,
    ) -> (Vec<String>, u64) {
        let mut a = Allocator::new();
        a.every_pinned = every_pinned;
        for p in 0..pools {
            let not_x = selector(&[], &[("team", "NotIn", &["x", &format!("y{p}")])]);
            let allocation = ServiceAllocationSpec {
                priority: Some(1),
                namespace_selectors: vec![not_x],
                ..Default::default()
            };
            let cidr = format!("10.{}.{}.0/30", p / 256, p % 256);
            a.set_pool(&format!("p{p:05}"), &metallb(&[&cidr], allocation));
        }
        a.set_pool("rest", &pool_spec(&["10.200.0.0/16"]));
        let before = a.steps();
        let mut answers = Vec::new();
        for i in 0..services {
            let mut service = svc(&format!("x/s{i}"));
            service.namespace_labels = labels(&[("team", "x")]);
            // Labels no rule reads do not tell Services apart.
            service.labels = labels(&[("app", &format!("a{i}"))]);
            answers.push(
                a.allocate(&service.req())
                    .map(|held| held.pool)
                    .unwrap_or_default(),
            );
        }
        // One the pinned pools serve: asked again only past those known.
        let mut other = svc("y/s");
        other.namespace_labels = labels(&[("team", "z")]);
        answers.push(
            a.allocate(&other.req())
                .map(|held| held.pool)
                .unwrap_or_default(),
        );
        (answers, a.steps() - before)
    }

    /// Rules that name no fact and all refuse a Service are asked once
    /// per kind of Service, not once per Service: N Services cost N plus
    /// the P sets of rules (the walk over them took N × P).
    #[test]
    fn services_alike_ask_the_rules_that_name_no_fact_once() {
        const P: u32 = 200;
        const N: u32 = 1000;
        let (answers, steps) = refused_by_every_unguarded(P, N, false);
        let (walked, walked_steps) = refused_by_every_unguarded(P, N, true);
        assert_eq!(answers, walked);
        assert!(answers[..N as usize].iter().all(|pool| pool == "rest"));
        assert_eq!(answers.last().map(String::as_str), Some("p00000"));
        // Per Service: the unpinned pool and its lowest free address; once,
        // the P refusals; the last Service, its first pool.
        assert!(
            steps <= 2 * u64::from(N) + u64::from(P) + 10,
            "{steps} steps"
        );
        assert!(
            walked_steps >= u64::from(N) * u64::from(P),
            "{walked_steps} steps"
        );
    }

    /// The answers kept per kind of Service follow the rules that name no
    /// fact as they come and go, past the changes kept to replay too:
    /// every answer is the walk's over every pinned pool.
    #[test]
    fn answers_kept_for_services_alike_follow_the_rules_as_they_change() {
        let pinned = |priority: i64, rule: (&str, &str, &[&str])| ServiceAllocationSpec {
            priority: Some(priority),
            service_selectors: vec![selector(&[], &[rule])],
            ..Default::default()
        };
        let run = |every_pinned: bool| {
            let mut a = Allocator::new();
            a.every_pinned = every_pinned;
            a.set_pool("z-rest", &pool_spec(&["10.200.0.0/16"]));
            let mut answers = Vec::new();
            let mut ask = |a: &mut Allocator, app: Option<&str>, i: &mut u32| {
                *i += 1;
                let mut service = svc(&format!("ns/s{i}"));
                service.labels = app.map(|app| labels(&[("app", app)])).unwrap_or_default();
                let held = a.allocate(&service.req()).map(|held| held.pool);
                answers.push(format!("{app:?} {}", held.unwrap_or_default()));
            };
            let mut i = 0;
            let apps = [Some("db"), Some("web"), Some("other"), None];
            let not_db = pinned(1, ("app", "NotIn", &["db"]));
            a.set_pool("b-not-db", &metallb(&["10.1.0.0/24"], not_db));
            apps.iter().for_each(|app| ask(&mut a, *app, &mut i));
            // Before it, for Services without the label only.
            let without = pinned(1, ("app", "DoesNotExist", &[]));
            a.set_pool("a-without", &metallb(&["10.2.0.0/24"], without));
            apps.iter().for_each(|app| ask(&mut a, *app, &mut i));
            // More changes than are kept to replay, then a value listed
            // that was another before.
            for k in 0..6 {
                let not_web = pinned(2, ("app", "NotIn", &["web", "db"]));
                a.set_pool(
                    &format!("c{k}-not-web"),
                    &metallb(&[&format!("10.3.{k}.0/24")], not_web),
                );
            }
            a.remove_pool("b-not-db");
            a.remove_pool("a-without");
            apps.iter().for_each(|app| ask(&mut a, *app, &mut i));
            let other = pinned(1, ("app", "In", &["other"]));
            a.set_pool("d-other", &metallb(&["10.4.0.0/24"], other));
            let exists = pinned(1, ("app", "Exists", &[]));
            a.set_pool("e-any", &metallb(&["10.5.0.0/24"], exists));
            apps.iter().for_each(|app| ask(&mut a, *app, &mut i));
            answers
        };
        let answers = run(false);
        assert_eq!(answers, run(true));
        assert_eq!(
            answers,
            [
                r#"Some("db") z-rest"#,
                r#"Some("web") b-not-db"#,
                r#"Some("other") b-not-db"#,
                "None b-not-db",
                r#"Some("db") z-rest"#,
                r#"Some("web") b-not-db"#,
                r#"Some("other") b-not-db"#,
                "None a-without",
                r#"Some("db") z-rest"#,
                r#"Some("web") z-rest"#,
                r#"Some("other") c0-not-web"#,
                "None c0-not-web",
                r#"Some("db") e-any"#,
                r#"Some("web") e-any"#,
                r#"Some("other") d-other"#,
                "None c0-not-web",
            ]
        );
    }

    const NAMESPACES: [&str; 3] = ["a", "b", "c"];
    const NAMES: [&str; 3] = ["s0", "s1", "s2"];
    const KEYS: [&str; 4] = ["app", "tier", SERVICE_NAMESPACE_LABEL, SERVICE_NAME_LABEL];
    const VALUES: [&str; 6] = ["x", "y", "a", "b", "s0", "s1"];
    const OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];

    fn pick<'a>(list: &[&'a str], i: usize) -> &'a str {
        list.get(i % list.len()).copied().unwrap_or_default()
    }

    fn label_map(pairs: &BTreeMap<usize, usize>) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (pick(&KEYS, *k).to_owned(), pick(&VALUES, *v).to_owned()))
            .collect()
    }

    fn a_selector() -> impl Strategy<Value = LabelSelectorSpec> {
        let expression = (
            0..KEYS.len(),
            0..OPERATORS.len(),
            prop::collection::btree_set(0..VALUES.len(), 1..3),
        );
        (
            prop::collection::btree_map(0..KEYS.len(), 0..VALUES.len(), 0..2),
            prop::collection::vec(expression, 0..3),
        )
            .prop_map(|(pairs, expressions)| LabelSelectorSpec {
                match_labels: label_map(&pairs),
                match_expressions: expressions
                    .into_iter()
                    .map(|(key, operator, values)| {
                        let operator = pick(&OPERATORS, operator);
                        let with_values = matches!(operator, "In" | "NotIn");
                        LabelSelectorRequirementSpec {
                            key: pick(&KEYS, key).to_owned(),
                            operator: operator.to_owned(),
                            values: values
                                .iter()
                                .filter(|_| with_values)
                                .map(|v| pick(&VALUES, *v).to_owned())
                                .collect(),
                        }
                    })
                    .collect(),
            })
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// MetalLB pool `m{pool}`; `None`: unpinned.
        SetPool {
            pool: u8,
            dual: bool,
            allocation: Option<ServiceAllocationSpec>,
        },
        /// Cilium pool `c{pool}`.
        SetCiliumPool {
            pool: u8,
            dual: bool,
            selector: Option<LabelSelectorSpec>,
        },
        RemovePool {
            pool: u8,
        },
        Allocate {
            service: Box<Svc>,
        },
        Release {
            namespace: usize,
            name: usize,
        },
    }

    fn an_allocation() -> impl Strategy<Value = ServiceAllocationSpec> {
        (
            proptest::option::of(0i64..3),
            prop::collection::btree_set(0..NAMESPACES.len(), 0..3),
            prop::collection::vec(a_selector(), 0..2),
            prop::collection::vec(a_selector(), 0..3),
        )
            .prop_map(
                |(priority, namespaces, namespace_selectors, service_selectors)| {
                    ServiceAllocationSpec {
                        priority,
                        namespaces: namespaces
                            .iter()
                            .map(|n| pick(&NAMESPACES, *n).to_owned())
                            .collect(),
                        namespace_selectors,
                        service_selectors,
                    }
                },
            )
    }

    fn a_service() -> impl Strategy<Value = Svc> {
        let pairs = || prop::collection::btree_map(0..KEYS.len(), 0..VALUES.len(), 0..3);
        (
            0..NAMESPACES.len(),
            0..NAMES.len(),
            pairs(),
            pairs(),
            0u8..4,
        )
            .prop_map(
                |(namespace, name, service_labels, namespace_labels, family)| {
                    let key = format!("{}/{}", pick(&NAMESPACES, namespace), pick(&NAMES, name));
                    let s = svc(&key);
                    let mut s = match family {
                        0 => s,
                        1 => s.v6(),
                        2 => s.dual(),
                        _ => s.prefer(Family::V4),
                    };
                    s.labels = label_map(&service_labels);
                    s.namespace_labels = label_map(&namespace_labels);
                    s
                },
            )
    }

    fn an_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0u8..4, any::<bool>(), proptest::option::of(an_allocation()))
                .prop_map(|(pool, dual, allocation)| Op::SetPool { pool, dual, allocation }),
            2 => (0u8..4, any::<bool>(), proptest::option::of(a_selector()))
                .prop_map(|(pool, dual, selector)| Op::SetCiliumPool { pool, dual, selector }),
            1 => (0u8..4).prop_map(|pool| Op::RemovePool { pool }),
            6 => a_service().prop_map(|service| Op::Allocate { service: Box::new(service) }),
            2 => (0..NAMESPACES.len(), 0..NAMES.len()).prop_map(|(namespace, name)| Op::Release { namespace, name }),
        ]
    }

    /// Pool `pool` of kind `kind` (0 MetalLB, 1 Cilium): four addresses of
    /// IPv4, and two of IPv6 if `dual`.
    fn addresses(kind: u8, pool: u8, dual: bool) -> Vec<String> {
        let mut list = vec![format!("10.{kind}.{pool}.0/30")];
        if dual {
            list.push(format!("fd00:{kind}:{pool}::/127"));
        }
        list
    }

    fn apply(a: &mut Allocator, op: &Op) -> String {
        match op {
            Op::SetPool {
                pool,
                dual,
                allocation,
            } => {
                let list = addresses(0, *pool, *dual);
                let list: Vec<&str> = list.iter().map(String::as_str).collect();
                let spec = IPAddressPoolSpec {
                    service_allocation: allocation.clone(),
                    ..pool_spec(&list)
                };
                format!("{:?}", a.set_pool(&format!("m{pool}"), &spec).released)
            }
            Op::SetCiliumPool {
                pool,
                dual,
                selector,
            } => {
                let list = addresses(1, *pool, *dual);
                let list: Vec<&str> = list.iter().map(String::as_str).collect();
                let spec = cilium_spec(&list, selector.clone());
                format!(
                    "{:?}",
                    a.set_cilium_pool(&format!("c{pool}"), &spec).released
                )
            }
            Op::RemovePool { pool } => {
                let metallb = a.remove_pool(&format!("m{pool}")).released;
                let cilium = a.remove_cilium_pool(&format!("c{pool}")).released;
                format!("{metallb:?} {cilium:?}")
            }
            Op::Allocate { service } => {
                let request = service.req();
                // Where a half-served Service held in a Cilium pool waits:
                // the groups of the pools a walk over every pool finds.
                let waits = [Family::V4, Family::V6].map(|f| {
                    let groups = a.cilium_groups(&request, f);
                    assert_eq!(groups, a.cilium_groups_walked(&request, f));
                    groups
                });
                format!("{:?} {waits:?}", a.allocate(&request))
            }
            Op::Release { namespace, name } => {
                let key = format!("{}/{}", pick(&NAMESPACES, *namespace), pick(&NAMES, *name));
                format!("{:?}", a.release(&key))
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Guarded and unguarded pinned pools of both kinds, unpinned ones,
        /// Services of every family with any labels: every answer is the
        /// walk's over every pinned pool, and no more pools are visited.
        #[test]
        fn the_index_chooses_as_the_walk_over_every_pinned_pool(ops in prop::collection::vec(an_op(), 1..60)) {
            let run = |every_pinned: bool| {
                let mut a = Allocator::new();
                a.every_pinned = every_pinned;
                let mut answers = Vec::new();
                let mut broken = Vec::new();
                for op in &ops {
                    answers.push(apply(&mut a, op));
                    if let Err(problems) = a.check_invariants() {
                        broken.push(format!("after {op:?}: {problems:?}"));
                    }
                }
                (answers, a.holdings(), a.steps(), broken)
            };
            let (indexed, walked) = (run(false), run(true));
            prop_assert!(indexed.3.is_empty(), "{:?}", indexed.3);
            prop_assert_eq!(&indexed.0, &walked.0);
            prop_assert_eq!(&indexed.1, &walked.1);
            prop_assert!(indexed.2 <= walked.2, "{} steps, the walk {}", indexed.2, walked.2);
        }
    }
}

/// The holders of a namespace, as a Namespace change asks for them: kept
/// through holds, releases and a pool removal that moves or releases them;
/// a namespace with none costs no look at any key.
#[test]
fn the_holders_of_a_namespace_follow_holds_and_releases() {
    let mut a = with_pools(&[("p", &["10.0.0.0/30"]), ("q", &["10.0.1.0/30"])]);
    for key in ["a/s1", "ab/s2", "a/s0", "b/s3"] {
        one(&mut a, &svc(key));
    }
    assert_eq!(a.holders_in_namespace("a"), ["a/s0", "a/s1"]);
    assert_eq!(a.holders_in_namespace("ab"), ["ab/s2"]);
    a.release("a/s1");
    assert_eq!(a.holders_in_namespace("a"), ["a/s0"]);
    a.release("a/s0");
    let before = a.steps();
    assert!(a.holders_in_namespace("a").is_empty());
    assert!(a.holders_in_namespace("c").is_empty());
    assert_eq!(a.steps(), before);
    // Holding again after the release counts once, not twice.
    one(&mut a, &svc("a/s0"));
    one(&mut a, &svc("a/s0"));
    assert_eq!(a.holders_in_namespace("a"), ["a/s0"]);
    // Pool p goes with all three holders: released (none moves to q).
    let released = a.remove_pool("p").released;
    assert_eq!(released.len(), 3);
    assert!(a.holders_in_namespace("a").is_empty());
    assert!(a.holders_in_namespace("ab").is_empty());
    assert!(a.holders_in_namespace("b").is_empty());
    one(&mut a, &svc("b/s4"));
    assert_eq!(a.holders_in_namespace("b"), ["b/s4"]);
}

/// Once indexed (the first call walks every holder), the holders of a
/// namespace cost their number, however many hold elsewhere: a small
/// Namespace changed N times beside N holders is not N².
#[test]
fn the_holders_of_a_namespace_cost_their_number() {
    let mut a = with_pools(&[("p", &["10.0.0.0/16"])]);
    for i in 0..1000 {
        one(&mut a, &svc(&format!("big/s{i}")));
    }
    one(&mut a, &svc("small/s"));
    let before = a.steps();
    assert_eq!(a.holders_in_namespace("small"), ["small/s"]);
    assert_eq!(a.steps() - before, 1001 + 1);
    for _ in 0..1000 {
        let before = a.steps();
        assert_eq!(a.holders_in_namespace("small"), ["small/s"]);
        assert_eq!(a.steps() - before, 1);
    }
    // Kept from then on.
    one(&mut a, &svc("small/t"));
    a.release("small/s");
    assert_eq!(a.holders_in_namespace("small"), ["small/t"]);
    a.release("small/t");
    assert!(a.holders_in_namespace("small").is_empty());
}

/// A pool whose `namespaceSelectors` label `selectors` (one matchLabels
/// pair or expression each).
fn selecting_namespaces(
    addresses: &[&str],
    selectors: Vec<LabelSelectorSpec>,
) -> IPAddressPoolSpec {
    IPAddressPoolSpec {
        service_allocation: Some(ServiceAllocationSpec {
            namespace_selectors: selectors,
            ..Default::default()
        }),
        ..pool_spec(addresses)
    }
}

/// A Namespace's labels matter when a pool's namespace rule tells the old
/// from the new; only pools whose selectors read a changed label, by its
/// old or new value, are asked.
#[test]
fn namespace_labels_matter_only_to_pools_that_read_them() {
    use crate::selector::tests::{labels, spec};
    let mut a = Allocator::new();
    a.set_pool(
        "red",
        &selecting_namespaces(&["10.1.0.0/24"], vec![spec(&[("team", "red")], &[])]),
    );
    let listed = IPAddressPoolSpec {
        service_allocation: Some(ServiceAllocationSpec {
            namespaces: vec!["ops".into()],
            namespace_selectors: vec![spec(&[], &[("tier", "Exists", &[])])],
            ..Default::default()
        }),
        ..pool_spec(&["10.2.0.0/24"])
    };
    a.set_pool("tiered", &listed);
    for i in 0..100 {
        let team = format!("t{i}");
        let selector = spec(&[("team", team.as_str())], &[]);
        a.set_pool(
            &format!("team{i}"),
            &selecting_namespaces(&[&format!("10.3.{i}.0/24")], vec![selector]),
        );
    }
    let matters = |a: &Allocator, ns: &str, old: &[(&str, &str)], new: &[(&str, &str)]| {
        let before = a.steps();
        let matters = a.namespace_labels_matter(ns, &labels(old), &labels(new));
        (matters, a.steps() - before)
    };
    assert_eq!(
        matters(&a, "dev", &[("team", "red")], &[("team", "blue")]),
        (true, 1)
    );
    assert_eq!(
        matters(&a, "dev", &[("team", "x")], &[("team", "blue")]),
        (false, 0)
    );
    assert_eq!(
        matters(
            &a,
            "dev",
            &[("team", "red")],
            &[("team", "red"), ("rev", "2")]
        ),
        (false, 0)
    );
    assert!(matters(&a, "dev", &[("team", "t5")], &[("team", "t6")]).0);
    assert_eq!(matters(&a, "dev", &[], &[("tier", "gold")]), (true, 1));
    // `ops` is listed by name: its labels cannot change what `tiered` serves.
    assert_eq!(matters(&a, "ops", &[], &[("tier", "gold")]), (false, 1));
    // A pool replaced with the same selectors is still asked; one deleted
    // is not.
    a.set_pool(
        "red",
        &selecting_namespaces(&["10.1.1.0/24"], vec![spec(&[("team", "red")], &[])]),
    );
    assert!(matters(&a, "dev", &[("team", "red")], &[]).0);
    a.remove_pool("red");
    assert_eq!(matters(&a, "dev", &[("team", "red")], &[]), (false, 0));
}
