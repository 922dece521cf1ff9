//! A second reading of the allocation rules (docs/allocation.md §3.1 and §4),
//! written from their text and naive on purpose: every decision is made by
//! brute force over every pool, address and holder, with none of the
//! indexes, wake shortcuts or settled-Service skips of the manager. Random
//! streams over a small cluster (five pools of a few addresses, two of
//! them overlapping; ten Service keys; two Namespaces) are replayed by
//! `fake-watcher` and applied to this model, and the final addresses and
//! pools of every LoadBalancer Service must agree.
//!
//! What the streams exercise: pools added, changed and deleted (overlaps
//! resolved by creation order, `autoAssign`, `avoidBuggyIPs`, priorities,
//! `namespaces`, `namespaceSelectors`, `serviceSelectors`); Namespace label
//! changes; Services of every family policy (IPv6 first too), headless ones,
//! other classes and types, sharing keys (old prefix too) with port sets and
//! `Local` backends, requested addresses (annotation or
//! `spec.loadBalancerIP`, valid, invalid or outside every pool), requested
//! pools; an initial list with statuses before `SYNCED` (a restart), and
//! statuses edited after it. Each Service's `IPAllocated` and
//! `ClearAssignment` Events (§4.7) must agree too, in order, and so must
//! the pools accepted and rejected and their counters.
//!
//! Where the model reads the rules one way among several, it follows
//! MetalLB's controller, as the manager does: an invalid request keeps only
//! what is still allowed, and a held address moves with its pool when
//! another accepted pool now holds it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use fake_watcher::{Count, ReplayResult};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Value};

use crate::properties::{addresses, cases, replay};

// ----- the cluster -----

/// The pools by name and every entry each may list (a pool lists a
/// non-empty subset). `e` overlaps `a`: the one created first wins.
const POOLS: &[(&str, &[&str])] = &[
    ("a", &["10.0.0.0/30", "fd00::/126"]),
    ("b", &["10.0.1.0/31"]),
    ("c", &["fd00:1::/127"]),
    ("d", &["10.0.2.4-10.0.2.5", "10.0.2.0/31", "fd00:2::5"]),
    ("e", &["10.0.0.2/31", "fd00:3::/127"]),
];
const NAMESPACES: &[&str] = &["a", "b"];
const TEAMS: &[&str] = &["x", "y"];
const TIERS: &[&str] = &["web", "db"];
const PORTS: &[(&str, i32)] = &[("TCP", 80), ("TCP", 443), ("UDP", 53)];
/// `ipFamilyPolicy` and `ipFamilies` of a Service (none: the store fills
/// them in by the policy, docs/replay.md §1.2).
const STACKS: &[(&str, &[&str])] = &[
    ("SingleStack", &["IPv4"]),
    ("SingleStack", &[]),
    ("RequireDualStack", &[]),
    ("PreferDualStack", &["IPv4"]),
    ("SingleStack", &["IPv6"]),
    ("PreferDualStack", &["IPv4", "IPv6"]),
    ("PreferDualStack", &["IPv6", "IPv4"]),
    ("RequireDualStack", &["IPv4", "IPv6"]),
    ("RequireDualStack", &["IPv6", "IPv4"]),
];
/// Requested addresses: in pools, outside every pool, pairs, and two of
/// one family (invalid).
const REQUESTS: &[&str] = &[
    "10.0.0.0",
    "10.0.0.1",
    "10.0.0.3",
    "fd00::",
    "fd00::2",
    "10.0.1.1",
    "fd00:1::1",
    "10.0.2.0",
    "10.0.2.5",
    "fd00:2::5",
    "10.9.9.9",
    "10.0.0.1,fd00::",
    "10.0.2.4, fd00:2::5",
    "10.0.0.3,10.0.0.1",
];
/// Addresses an initial list may claim in statuses.
const CLAIMS: &[&str] = &[
    "10.0.0.0",
    "10.0.0.1",
    "10.0.0.3",
    "10.0.1.1",
    "10.0.2.0",
    "10.0.2.5",
    "10.9.9.9",
    "fd00::",
    "fd00::2",
    "fd00:1::1",
    "fd00:2::5",
];

// ----- the streams -----

#[derive(Clone, Debug)]
struct Allocation {
    /// -1 makes the pool invalid.
    priority: Option<i8>,
    namespace: Option<u8>,
    team: Option<u8>,
    tier: Option<u8>,
}

#[derive(Clone, Debug)]
struct Spec {
    load_balancer: bool,
    /// 0: no class, 1: empty class, 2: another class.
    class: u8,
    stack: u8,
    headless: bool,
    /// (old prefix, key).
    sharing: Option<(bool, u8)>,
    /// (old prefix, pool; past the pools: an unknown one).
    pool: Option<(bool, u8)>,
    /// (0: annotation, 1: old-prefix annotation, 2: both, the old one
    /// asking for the next request; request).
    request: Option<(u8, u8)>,
    load_balancer_ip: Option<u8>,
    ports: u8,
    local: Option<u8>,
    tier: Option<u8>,
    /// Claimed addresses, by family of the stack (initial list only).
    status: Option<(u8, u8, bool)>,
}

#[derive(Clone, Debug)]
enum Op {
    Pool {
        pool: u8,
        entries: u8,
        auto_assign: bool,
        avoid_buggy: bool,
        allocation: Option<Allocation>,
    },
    DeletePool(u8),
    /// Labelled with a team, or deleted.
    Namespace {
        namespace: u8,
        team: Option<u8>,
    },
    Service {
        namespace: u8,
        name: u8,
        spec: Spec,
    },
    DeleteService {
        namespace: u8,
        name: u8,
    },
}

fn spec_strategy(initial: bool) -> impl Strategy<Value = Spec> {
    (
        (
            proptest::bool::weighted(0.93),
            prop_oneof![18 => Just(0u8), 1 => Just(1), 1 => Just(2)],
            0..STACKS.len() as u8,
            proptest::bool::weighted(0.04),
        ),
        (
            proptest::option::weighted(0.45, (proptest::bool::weighted(0.2), 0u8..2)),
            proptest::option::weighted(
                0.12,
                (proptest::bool::weighted(0.2), 0..POOLS.len() as u8 + 1),
            ),
            proptest::option::weighted(
                0.17,
                (
                    prop_oneof![6 => Just(0u8), 1 => Just(1), 1 => Just(2)],
                    0..REQUESTS.len() as u8,
                ),
            ),
            proptest::option::weighted(0.06, 0..CLAIMS.len() as u8),
        ),
        (
            0u8..8,
            proptest::option::weighted(0.2, 0u8..2),
            proptest::option::weighted(0.5, 0u8..2),
            proptest::option::weighted(
                0.75,
                (0..CLAIMS.len() as u8, 0..CLAIMS.len() as u8, any::<bool>()),
            ),
            proptest::bool::weighted(0.12),
        ),
    )
        .prop_map(
            move |(
                (load_balancer, class, stack, headless),
                (sharing, pool, request, load_balancer_ip),
                (ports, local, tier, status, late_status),
            )| Spec {
                load_balancer,
                class,
                stack,
                headless,
                sharing,
                pool,
                request,
                load_balancer_ip,
                ports,
                local,
                tier,
                // Statuses come with the initial list mostly; after it,
                // a line with one is a user's (or another controller's)
                // edit of the status.
                status: status.filter(|_| initial || late_status),
            },
        )
}

fn op_strategy(initial: bool) -> impl Strategy<Value = Op> {
    let allocation = (
        proptest::option::weighted(0.6, -1i8..4),
        proptest::option::weighted(0.4, 0..NAMESPACES.len() as u8),
        proptest::option::weighted(0.3, 0..TEAMS.len() as u8),
        proptest::option::weighted(0.25, 0..TIERS.len() as u8),
    )
        .prop_map(|(priority, namespace, team, tier)| Allocation {
            priority,
            namespace,
            team,
            tier,
        });
    prop_oneof![
        3 => (
            0..POOLS.len() as u8,
            any::<u8>(),
            proptest::bool::weighted(0.8),
            proptest::bool::weighted(0.2),
            proptest::option::weighted(0.4, allocation),
        )
            .prop_map(|(pool, entries, auto_assign, avoid_buggy, allocation)| Op::Pool {
                pool,
                entries,
                auto_assign,
                avoid_buggy,
                allocation,
            }),
        1 => (0..POOLS.len() as u8).prop_map(Op::DeletePool),
        1 => (0..NAMESPACES.len() as u8, proptest::option::weighted(0.8, 0..TEAMS.len() as u8))
            .prop_map(|(namespace, team)| Op::Namespace { namespace, team }),
        12 => (0..NAMESPACES.len() as u8, 0u8..5, spec_strategy(initial))
            .prop_map(|(namespace, name, spec)| Op::Service { namespace, name, spec }),
        4 => (0..NAMESPACES.len() as u8, 0u8..5)
            .prop_map(|(namespace, name)| Op::DeleteService { namespace, name }),
    ]
}

/// A stream: with a restart, an initial list (statuses claimed) then
/// `SYNCED`; then events.
#[derive(Clone, Debug)]
struct Script {
    initial: Option<Vec<Op>>,
    events: Vec<Op>,
}

fn script_strategy() -> impl Strategy<Value = Script> {
    (
        proptest::option::of(prop::collection::vec(op_strategy(true), 1..12)),
        prop::collection::vec(op_strategy(false), 1..40),
    )
        .prop_map(|(initial, events)| Script { initial, events })
}

fn pick<T: Copy>(items: &[T], index: u8) -> T {
    items[usize::from(index) % items.len()]
}

fn render_op(op: &Op) -> Value {
    match op {
        Op::Pool {
            pool,
            entries,
            auto_assign,
            avoid_buggy,
            allocation,
        } => {
            let (name, all) = pick(POOLS, *pool);
            let mut listed: Vec<&str> = all
                .iter()
                .enumerate()
                .filter(|(bit, _)| entries & (1 << bit) != 0)
                .map(|(_, entry)| *entry)
                .collect();
            if listed.is_empty() {
                listed.push(all[0]);
            }
            let mut spec = json!({"addresses": listed});
            if !auto_assign {
                spec["autoAssign"] = json!(false);
            }
            if *avoid_buggy {
                spec["avoidBuggyIPs"] = json!(true);
            }
            if let Some(allocation) = allocation {
                let mut rules = json!({});
                if let Some(priority) = allocation.priority {
                    rules["priority"] = json!(priority);
                }
                if let Some(namespace) = allocation.namespace {
                    rules["namespaces"] = json!([pick(NAMESPACES, namespace)]);
                }
                if let Some(team) = allocation.team {
                    rules["namespaceSelectors"] =
                        json!([{"matchLabels": {"team": pick(TEAMS, team)}}]);
                }
                if let Some(tier) = allocation.tier {
                    rules["serviceSelectors"] =
                        json!([{"matchLabels": {"tier": pick(TIERS, tier)}}]);
                }
                spec["serviceAllocation"] = rules;
            }
            json!({"type": "MODIFIED", "object": {
                "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                "metadata": {"name": name, "namespace": "metallb-system"}, "spec": spec}})
        }
        Op::DeletePool(pool) => json!({"type": "DELETED", "object": {
            "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": pick(POOLS, *pool).0, "namespace": "metallb-system"}}}),
        Op::Namespace {
            namespace,
            team: Some(team),
        } => json!({"type": "MODIFIED", "object": {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": pick(NAMESPACES, *namespace),
                         "labels": {"team": pick(TEAMS, *team)}}}}),
        Op::Namespace {
            namespace,
            team: None,
        } => json!({"type": "DELETED", "object": {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": pick(NAMESPACES, *namespace)}}}),
        Op::Service {
            namespace,
            name,
            spec,
        } => json!({"type": "MODIFIED", "object": service_object(*namespace, *name, spec)}),
        Op::DeleteService { namespace, name } => json!({"type": "DELETED", "object": {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("s{name}"), "namespace": pick(NAMESPACES, *namespace)}}}),
    }
}

fn service_object(namespace: u8, name: u8, spec: &Spec) -> Value {
    let (policy, listed) = pick(STACKS, spec.stack);
    let families: &[&str] = match (listed, policy) {
        ([], "SingleStack") => &["IPv4"],
        ([], _) => &["IPv4", "IPv6"],
        (listed, _) => listed,
    };
    let mut annotations = serde_json::Map::new();
    if let Some((old, key)) = spec.sharing {
        let prefix = if old {
            "metallb.universe.tf"
        } else {
            "metallb.io"
        };
        annotations.insert(
            format!("{prefix}/allow-shared-ip"),
            json!(format!("k{key}")),
        );
    }
    if let Some((old, pool)) = spec.pool {
        let name = POOLS.get(usize::from(pool)).map_or("unknown", |p| p.0);
        let prefix = if old {
            "metallb.universe.tf"
        } else {
            "metallb.io"
        };
        annotations.insert(format!("{prefix}/address-pool"), json!(name));
    }
    if let Some((how, request)) = spec.request {
        let (new, old) = (
            "metallb.io/loadBalancerIPs".to_owned(),
            "metallb.universe.tf/loadBalancerIPs".to_owned(),
        );
        let (asked, next) = (
            pick(REQUESTS, request),
            pick(REQUESTS, request.wrapping_add(1)),
        );
        match how {
            0 => annotations.insert(new, json!(asked)),
            1 => annotations.insert(old, json!(asked)),
            _ => {
                annotations.insert(old, json!(next));
                annotations.insert(new, json!(asked))
            }
        };
    }
    let ports: Vec<Value> = PORTS
        .iter()
        .enumerate()
        .filter(|(bit, _)| spec.ports & (1 << bit) != 0)
        .map(|(_, (protocol, port))| json!({"port": port, "protocol": protocol}))
        .collect();
    let mut body = json!({
        "type": if spec.load_balancer { "LoadBalancer" } else { "ClusterIP" },
        "ipFamilyPolicy": policy,
        "ports": ports,
    });
    if !listed.is_empty() {
        body["ipFamilies"] = json!(listed);
    }
    match spec.class {
        0 => {}
        1 => body["loadBalancerClass"] = json!(""),
        _ => body["loadBalancerClass"] = json!("other"),
    }
    if spec.headless {
        body["clusterIP"] = json!("None");
    }
    if let Some(ip) = spec.load_balancer_ip {
        body["loadBalancerIP"] = json!(pick(CLAIMS, ip));
    }
    if let Some(app) = spec.local {
        body["externalTrafficPolicy"] = json!("Local");
        body["selector"] = json!({"app": pick(&["x", "y"], app)});
    }
    let mut metadata =
        json!({"name": format!("s{name}"), "namespace": pick(NAMESPACES, namespace)});
    if !annotations.is_empty() {
        metadata["annotations"] = Value::Object(annotations);
    }
    if let Some(tier) = spec.tier {
        metadata["labels"] = json!({"tier": pick(TIERS, tier)});
    }
    let mut object =
        json!({"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": body});
    if let Some((first, second, both)) = spec.status {
        // Claims of the Service's own families, as a controller wrote them.
        let of = |family: &str, index: u8| {
            let wanted = family == "IPv6";
            let mut matching = CLAIMS.iter().filter(|c| c.contains(':') == wanted);
            let count = matching.clone().count();
            matching.nth(usize::from(index) % count).copied()
        };
        let mut claimed: Vec<&str> = [of(families[0], first)].into_iter().flatten().collect();
        if both && families.len() == 2 {
            claimed.extend(of(families[1], second));
        }
        claimed.sort_by_key(|ip| ip.contains(':'));
        let ingress: Vec<Value> = claimed.iter().map(|ip| json!({"ip": ip})).collect();
        object["status"] = json!({"loadBalancer": {"ingress": ingress}});
    }
    object
}

fn render(script: &Script) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    if let Some(initial) = &script.initial {
        lines.extend(initial.iter().map(|op| render_op(op).to_string()));
        lines.push(r#"{"type":"SYNCED"}"#.to_owned());
    }
    lines.extend(script.events.iter().map(|op| render_op(op).to_string()));
    lines
}

// ----- the model -----

fn is_v6(ip: IpAddr) -> bool {
    ip.is_ipv6()
}

fn number(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn address(value: u128, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(value.into())
    } else {
        IpAddr::V4(u32::try_from(value).unwrap().into())
    }
}

/// An entry of `spec.addresses`: (first, last, IPv6).
fn entry(text: &str) -> (u128, u128, bool) {
    if let Some((first, last)) = text.split_once('-') {
        let first: IpAddr = first.trim().parse().unwrap();
        let last: IpAddr = last.trim().parse().unwrap();
        (number(first), number(last), is_v6(first))
    } else if let Some((base, bits)) = text.split_once('/') {
        let base: IpAddr = base.parse().unwrap();
        let width = if is_v6(base) { 128 } else { 32 };
        let host = width - bits.parse::<u32>().unwrap();
        let first = number(base) >> host << host;
        (first, first + (1u128 << host) - 1, is_v6(base))
    } else {
        let ip: IpAddr = text.parse().unwrap();
        (number(ip), number(ip), is_v6(ip))
    }
}

struct Pool {
    name: String,
    /// A negative priority makes the pool invalid (§3.1).
    valid: bool,
    entries: Vec<(u128, u128, bool)>,
    auto_assign: bool,
    avoid_buggy: bool,
    pinned: bool,
    priority: u64,
    namespaces: Vec<String>,
    teams: Vec<String>,
    tiers: Vec<String>,
}

impl Pool {
    fn new(object: &Value) -> Pool {
        let spec = &object["spec"];
        let rules = &spec["serviceAllocation"];
        let labels = |selectors: &Value, label: &str| -> Vec<String> {
            selectors
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s["matchLabels"][label].as_str().map(str::to_owned))
                .collect()
        };
        Pool {
            name: object["metadata"]["name"].as_str().unwrap().to_owned(),
            entries: spec["addresses"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| entry(e.as_str().unwrap()))
                .collect(),
            auto_assign: spec["autoAssign"].as_bool().unwrap_or(true),
            avoid_buggy: spec["avoidBuggyIPs"].as_bool().unwrap_or(false),
            pinned: rules.is_object(),
            valid: rules["priority"].as_i64().unwrap_or(0) >= 0,
            priority: rules["priority"].as_u64().unwrap_or(0),
            namespaces: rules["namespaces"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect(),
            teams: labels(&rules["namespaceSelectors"], "team"),
            tiers: labels(&rules["serviceSelectors"], "tier"),
        }
    }

    /// §3.1: the namespaces named or selected, then the Service selectors.
    fn serves(&self, svc: &Svc, teams: &BTreeMap<String, String>) -> bool {
        if !self.namespaces.is_empty() || !self.teams.is_empty() {
            let named = self.namespaces.contains(&svc.namespace);
            let selected = teams
                .get(&svc.namespace)
                .is_some_and(|team| self.teams.contains(team));
            if !named && !selected {
                return false;
            }
        }
        self.tiers.is_empty() || svc.tier.as_ref().is_some_and(|t| self.tiers.contains(t))
    }

    fn avoided(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => self.avoid_buggy && matches!(v4.octets()[3], 0 | 255),
            IpAddr::V6(_) => false,
        }
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let value = number(ip);
        !self.avoided(ip)
            && self
                .entries
                .iter()
                .any(|&(first, last, v6)| v6 == is_v6(ip) && first <= value && value <= last)
    }

    fn overlaps(&self, other: &Pool) -> bool {
        self.entries.iter().any(|&(a, b, v6)| {
            other
                .entries
                .iter()
                .any(|&(c, d, w)| v6 == w && a <= d && c <= b)
        })
    }

    /// Addresses of a family in `spec.addresses` order, each entry lowest
    /// first.
    fn candidates(&self, v6: bool) -> impl Iterator<Item = IpAddr> + '_ {
        self.entries
            .iter()
            .filter(move |e| e.2 == v6)
            .flat_map(move |&(first, last, _)| (first..=last).map(move |n| address(n, v6)))
            .filter(|ip| !self.avoided(*ip))
    }
}

#[derive(Clone, PartialEq)]
enum Request {
    None,
    Invalid,
    Addresses(Vec<IpAddr>),
}

#[derive(Clone)]
struct Svc {
    namespace: String,
    load_balancer: bool,
    ours: bool,
    headless: bool,
    prefer: bool,
    /// IPv6 per family, primary first.
    families: Vec<bool>,
    sharing: String,
    ports: BTreeSet<(String, i64)>,
    backend: String,
    pool: Option<String>,
    request: Request,
    tier: Option<String>,
}

/// The families as the store fills them in (docs/replay.md §1.2), as the
/// API server of a dual-stack cluster does: by the policy where none are
/// listed, IPv4 first; a dual-stack policy listing one gets the other
/// added.
fn families(spec: &Value) -> Vec<bool> {
    let listed: Vec<bool> = spec["ipFamilies"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| f == "IPv6")
        .collect();
    let single = spec["ipFamilyPolicy"].as_str().unwrap_or("SingleStack") == "SingleStack";
    match (listed.as_slice(), single) {
        ([], true) => vec![false],
        ([], false) => vec![false, true],
        ([only], false) => vec![*only, !*only],
        _ => listed,
    }
}

impl Svc {
    fn new(object: &Value) -> Svc {
        let metadata = &object["metadata"];
        let spec = &object["spec"];
        let annotation = |name: &str| {
            let annotations = &metadata["annotations"];
            annotations[format!("metallb.io/{name}")]
                .as_str()
                .or_else(|| annotations[format!("metallb.universe.tf/{name}")].as_str())
                .map(str::to_owned)
        };
        let spec_ip = spec["loadBalancerIP"]
            .as_str()
            .filter(|ip| !ip.is_empty())
            .map(str::to_owned);
        let request = match (annotation("loadBalancerIPs"), spec_ip) {
            (None, None) => Request::None,
            (Some(_), Some(_)) => Request::Invalid,
            (Some(text), None) | (None, Some(text)) => {
                let parsed: Result<Vec<IpAddr>, _> =
                    text.split(',').map(|ip| ip.trim().parse()).collect();
                match parsed {
                    Ok(ips)
                        if ips.len() == 1 || (ips.len() == 2 && is_v6(ips[0]) != is_v6(ips[1])) =>
                    {
                        Request::Addresses(ips)
                    }
                    _ => Request::Invalid,
                }
            }
        };
        let load_balancer = spec["type"] == "LoadBalancer";
        let local = spec["externalTrafficPolicy"] == "Local";
        Svc {
            namespace: metadata["namespace"].as_str().unwrap().to_owned(),
            load_balancer,
            ours: load_balancer && spec["loadBalancerClass"].as_str().unwrap_or("").is_empty(),
            headless: spec["clusterIP"] == "None",
            prefer: spec["ipFamilyPolicy"] == "PreferDualStack",
            families: families(spec),
            sharing: annotation("allow-shared-ip").unwrap_or_default(),
            ports: spec["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p["protocol"].as_str().unwrap().to_owned(),
                        p["port"].as_i64().unwrap(),
                    )
                })
                .collect(),
            backend: if local {
                spec["selector"].to_string()
            } else {
                String::new()
            },
            pool: annotation("address-pool"),
            request,
            tier: metadata["labels"]["tier"].as_str().map(str::to_owned),
        }
    }

    fn dual(&self) -> bool {
        self.families.len() == 2
    }

    /// Holding one family it did not request alone: waits for the other
    /// (§4.3).
    fn half_served(&self, ips: &[IpAddr]) -> bool {
        self.dual() && self.prefer && ips.len() == 1 && self.request == Request::None
    }
}

/// What a Service holds: the pool and the addresses, IPv4 first.
type Holding = (String, Vec<IpAddr>);

#[derive(Default)]
struct Model {
    /// Pool objects in creation order; the accepted ones are derived.
    pools: Vec<Pool>,
    teams: BTreeMap<String, String>,
    services: BTreeMap<String, Svc>,
    first_seen: BTreeMap<String, u64>,
    held: BTreeMap<String, Holding>,
    waiting: BTreeMap<String, u64>,
    /// Status claims of the initial list.
    status: BTreeMap<String, Vec<IpAddr>>,
    synced: bool,
    clock: u64,
    /// `IPAllocated` and `ClearAssignment` Events, per Service in order.
    events: BTreeMap<String, Vec<&'static str>>,
}

impl Model {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// §3.1: each pool checked against those accepted before it.
    fn accepted(&self) -> Vec<&Pool> {
        let mut accepted: Vec<&Pool> = Vec::new();
        for pool in self.pools.iter().filter(|p| p.valid) {
            if !accepted.iter().any(|p| p.overlaps(pool)) {
                accepted.push(pool);
            }
        }
        accepted
    }

    fn pool(&self, name: &str) -> Option<&Pool> {
        self.accepted().into_iter().find(|p| p.name == name)
    }

    fn owner(&self, ip: IpAddr) -> Option<&Pool> {
        self.accepted().into_iter().find(|p| p.contains(ip))
    }

    /// §4.4: free, or every holder shares with it.
    fn fits(&self, ip: IpAddr, key: &str, svc: &Svc) -> bool {
        self.held
            .iter()
            .filter(|(holder, (_, ips))| *holder != key && ips.contains(&ip))
            .all(|(holder, _)| {
                let other = &self.services[holder];
                !svc.sharing.is_empty()
                    && other.sharing == svc.sharing
                    && other.backend == svc.backend
                    && other.ports.is_disjoint(&svc.ports)
            })
    }

    fn lowest(&self, pool: &Pool, v6: bool, key: &str, svc: &Svc) -> Option<IpAddr> {
        pool.candidates(v6).find(|ip| self.fits(*ip, key, svc))
    }

    /// §4.3 over `pools` in order.
    fn choose(&self, pools: &[&Pool], key: &str, svc: &Svc) -> Option<Holding> {
        let take = |pool: &Pool, ips: Vec<IpAddr>| Some((pool.name.clone(), ips));
        if !svc.dual() {
            return pools.iter().find_map(|p| {
                self.lowest(p, svc.families[0], key, svc)
                    .and_then(|ip| take(p, vec![ip]))
            });
        }
        for pool in pools {
            if let (Some(v4), Some(v6)) = (
                self.lowest(pool, false, key, svc),
                self.lowest(pool, true, key, svc),
            ) {
                return take(pool, vec![v4, v6]);
            }
        }
        if !svc.prefer {
            return None;
        }
        svc.families.iter().find_map(|&v6| {
            pools.iter().find_map(|p| {
                self.lowest(p, v6, key, svc)
                    .and_then(|ip| take(p, vec![ip]))
            })
        })
    }

    /// §4.4 step 1.
    fn allowed(&self, key: &str, svc: &Svc, ips: &[IpAddr]) -> Option<String> {
        let owners: BTreeSet<&str> = ips
            .iter()
            .filter_map(|ip| self.owner(*ip).map(|p| p.name.as_str()))
            .collect();
        let pool = self.pool(owners.iter().next()?)?;
        let count_ok = if svc.dual() {
            ips.len() == 2 || (svc.prefer && ips.len() == 1)
        } else {
            ips.len() == 1
        };
        let ok = owners.len() == 1
            && count_ok
            && !svc.headless
            && pool.serves(svc, &self.teams)
            && ips.iter().all(|ip| {
                pool.contains(*ip) && svc.families.contains(&is_v6(*ip)) && self.fits(*ip, key, svc)
            })
            && match &svc.request {
                Request::Addresses(requested) => {
                    let mut wanted = requested.clone();
                    wanted.sort_by_key(|ip| is_v6(*ip));
                    wanted == ips
                }
                _ => true,
            }
            && svc.pool.as_ref().is_none_or(|p| *p == pool.name);
        ok.then(|| pool.name.clone())
    }

    /// §4.4 steps 2–4.
    fn new_addresses(&self, key: &str, svc: &Svc) -> Option<Holding> {
        if svc.headless {
            return None;
        }
        let accepted = self.accepted();
        if let Request::Addresses(requested) = &svc.request {
            let families_ok = if svc.dual() && svc.prefer {
                requested
                    .iter()
                    .all(|ip| svc.families.contains(&is_v6(*ip)))
            } else {
                let mut wanted = svc.families.clone();
                wanted.sort();
                let mut asked: Vec<bool> = requested.iter().map(|ip| is_v6(*ip)).collect();
                asked.sort();
                asked == wanted
            };
            let owners: BTreeSet<&str> = requested
                .iter()
                .map(|ip| self.owner(*ip).map(|p| p.name.as_str()))
                .collect::<Option<_>>()?;
            let pool = self.pool(owners.iter().next()?)?;
            let ok = families_ok
                && owners.len() == 1
                && svc.pool.as_ref().is_none_or(|p| *p == pool.name)
                && pool.serves(svc, &self.teams)
                && requested.iter().all(|ip| self.fits(*ip, key, svc));
            let mut ips = requested.clone();
            ips.sort_by_key(|ip| is_v6(*ip));
            return ok.then(|| (pool.name.clone(), ips));
        }
        if let Some(name) = &svc.pool {
            let pool = self.pool(name).filter(|p| p.serves(svc, &self.teams))?;
            return self.choose(&[pool], key, svc);
        }
        let mut pinned: Vec<&Pool> = accepted
            .iter()
            .copied()
            .filter(|p| p.pinned && p.auto_assign && p.serves(svc, &self.teams))
            .collect();
        pinned.sort_by_key(|p| {
            (
                if p.priority > 0 { p.priority } else { u64::MAX },
                p.name.clone(),
            )
        });
        let mut others: Vec<&Pool> = accepted
            .iter()
            .copied()
            .filter(|p| !p.pinned && p.auto_assign)
            .collect();
        others.sort_by_key(|p| p.name.clone());
        pinned.extend(others);
        self.choose(&pinned, key, svc)
    }

    fn wait(&mut self, key: &str) {
        if !self.waiting.contains_key(key) {
            let at = self.tick();
            self.waiting.insert(key.to_owned(), at);
        }
    }

    /// One reconciliation (§4.4, from the status the store shows); whether
    /// it released anything. `keep_only`: the first pass of §4.5, which
    /// keeps or releases and hands out nothing.
    fn reconcile(&mut self, key: &str, keep_only: bool) -> bool {
        let before = self.held.remove(key);
        let Some(svc) = self.services.get(key).filter(|s| s.ours).cloned() else {
            // No longer ours: what we wrote goes with what we held.
            self.waiting.remove(key);
            if before.is_some() {
                self.status.insert(key.to_owned(), Vec::new());
            }
            return before.is_some();
        };
        let mut claims = self.status.get(key).cloned().unwrap_or_default();
        claims.sort_by_key(|ip| is_v6(*ip));
        let kept = if claims.is_empty() {
            None
        } else {
            self.allowed(key, &svc, &claims)
        };
        let (shown, claims_were_kept) = (claims.clone(), kept.is_some());
        let after = match kept {
            // Kept as shown; only a half-served one looks for more, and not
            // in the first pass.
            Some(pool) if keep_only || !svc.half_served(&claims) => Some((pool, claims)),
            Some(pool) => {
                let missing = !is_v6(claims[0]);
                let added = self
                    .pool(&pool)
                    .and_then(|p| self.lowest(p, missing, key, &svc));
                claims.extend(added);
                claims.sort_by_key(|ip| is_v6(*ip));
                Some((pool, claims))
            }
            None if keep_only || svc.request == Request::Invalid => None,
            None => self.new_addresses(key, &svc),
        };
        match &after {
            Some((_, ips)) if !svc.half_served(ips) => {
                self.waiting.remove(key);
            }
            None if svc.request == Request::Invalid => {
                self.waiting.remove(key);
            }
            // The first pass hands out nothing: whether a Service waits
            // (one left without addresses, or half-served and not yet
            // looking for its missing family) is decided at its place in
            // the second.
            _ if keep_only => {}
            _ => self.wait(key),
        }
        // §4.7: a status no longer allowed is cleared; an address not
        // kept from the status is given.
        if !claims_were_kept && !shown.is_empty() {
            self.announce(key, "ClearAssignment");
        }
        let kept: &[IpAddr] = if claims_were_kept { &shown } else { &[] };
        if after
            .as_ref()
            .is_some_and(|(_, ips)| ips.iter().any(|ip| !kept.contains(ip)))
        {
            self.announce(key, "IPAllocated");
        }
        let released = before.as_ref().is_some_and(|(_, old)| {
            old.iter()
                .any(|ip| !after.as_ref().is_some_and(|(_, new)| new.contains(ip)))
        });
        let written = after.as_ref().map(|h| h.1.clone()).unwrap_or_default();
        self.status.insert(key.to_owned(), written);
        if let Some(holding) = after {
            self.held.insert(key.to_owned(), holding);
        }
        released
    }

    fn announce(&mut self, key: &str, reason: &'static str) {
        self.events.entry(key.to_owned()).or_default().push(reason);
    }

    /// §4.6: every waiting Service but the waker, longest waiting first.
    fn wake(&mut self, waker: &str) {
        let mut order: Vec<(u64, String)> = self
            .waiting
            .iter()
            .map(|(key, at)| (*at, key.clone()))
            .collect();
        order.sort();
        for (_, key) in order {
            if key != waker && self.waiting.contains_key(&key) {
                self.reconcile(&key, false);
            }
        }
    }

    fn in_first_seen_order(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.services.keys().cloned().collect();
        keys.sort_by_key(|key| self.first_seen[key]);
        keys
    }

    /// The two passes of §4.5, at `SYNCED` and after a pool or Namespace
    /// change.
    fn two_passes(&mut self) {
        let keys = self.in_first_seen_order();
        let mut released = Vec::new();
        for key in &keys {
            let claimed = self.status.get(key).is_some_and(|ips| !ips.is_empty());
            if claimed && self.services[key].ours {
                self.reconcile(key, true);
                if !self.held.contains_key(key) {
                    released.push(key.clone());
                }
            }
        }
        let rest = keys.iter().filter(|key| !released.contains(key));
        for key in released.iter().chain(rest).cloned().collect::<Vec<_>>() {
            let svc = &self.services[&key];
            let incomplete = self
                .held
                .get(&key)
                .is_none_or(|(_, ips)| svc.half_served(ips));
            if incomplete && svc.ours {
                self.reconcile(&key, false);
            }
        }
    }

    fn apply(&mut self, line: &str) {
        let event: Value = serde_json::from_str(line).unwrap();
        if event["type"] == "SYNCED" {
            self.synced = true;
            self.two_passes();
            return;
        }
        let object = &event["object"];
        let deleted = event["type"] == "DELETED";
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        match object["kind"].as_str().unwrap() {
            "IPAddressPool" => {
                let at = self.pools.iter().position(|p| p.name == name);
                match (at, deleted) {
                    (Some(at), true) => {
                        self.pools.remove(at);
                    }
                    (Some(at), false) => self.pools[at] = Pool::new(object),
                    (None, false) => self.pools.push(Pool::new(object)),
                    // A delete of an unknown object changes nothing.
                    (None, true) => return,
                }
                if self.synced {
                    self.two_passes();
                }
            }
            "Namespace" => {
                let team = object["metadata"]["labels"]["team"]
                    .as_str()
                    .map(str::to_owned);
                let changed = self.teams.get(&name) != team.as_ref();
                match team {
                    Some(team) if !deleted => self.teams.insert(name, team),
                    _ => self.teams.remove(&name),
                };
                if self.synced && changed {
                    self.two_passes();
                }
            }
            _ => self.apply_service(object, deleted),
        }
    }

    fn apply_service(&mut self, object: &Value, deleted: bool) {
        let key = format!(
            "{}/{}",
            object["metadata"]["namespace"].as_str().unwrap(),
            object["metadata"]["name"].as_str().unwrap()
        );
        if deleted {
            if self.services.remove(&key).is_some() {
                self.first_seen.remove(&key);
                if self.synced {
                    self.reconcile(&key, false);
                    self.wake(&key);
                }
                self.status.remove(&key);
            }
            return;
        }
        let mut svc = Svc::new(object);
        let old = self.services.get(&key).cloned();
        match &old {
            // Cluster IPs, families and policy are immutable (docs/replay.md).
            Some(old) => {
                svc.families = old.families.clone();
                svc.prefer = old.prefer;
                svc.headless = old.headless;
            }
            None => {
                let at = self.tick();
                self.first_seen.insert(key.clone(), at);
            }
        }
        self.services.insert(key.clone(), svc.clone());
        // The store replaces the status only when the line has one.
        if object.get("status").is_some() || old.is_none() {
            let ingress = object["status"]["loadBalancer"]["ingress"].as_array();
            let ips = ingress
                .into_iter()
                .flatten()
                .map(|i| i["ip"].as_str().unwrap().parse().unwrap());
            self.status.insert(key.clone(), ips.collect());
        }
        if !self.synced {
            return;
        }
        let before = self.held.get(&key).cloned();
        let mut released = self.reconcile(&key, false);
        if let (Some((_, held)), Some(old)) = (&before, &old) {
            // §4.6: a holder's sharing key or ports changed.
            if old.sharing != svc.sharing || old.ports != svc.ports {
                let mut others: Vec<String> = self
                    .held
                    .iter()
                    .filter(|(other, (_, ips))| {
                        **other != key && ips.iter().any(|ip| held.contains(ip))
                    })
                    .map(|(other, _)| other.clone())
                    .collect();
                others.sort_by_key(|other| self.first_seen[other]);
                for other in others {
                    released |= self.reconcile(&other, false);
                }
            }
        }
        if released {
            self.wake(&key);
        }
    }

    /// Every accepted pool by name: usable and held addresses of IPv4,
    /// then of IPv6; and the names of the rejected ones.
    fn pools(&self) -> (Vec<(String, [u128; 4])>, Vec<String>) {
        let held: BTreeSet<IpAddr> = self.held.values().flat_map(|h| h.1.clone()).collect();
        let mut accepted: Vec<(String, [u128; 4])> = self
            .accepted()
            .into_iter()
            .map(|pool| {
                let count = |v6: bool| {
                    let usable: Vec<IpAddr> = pool.candidates(v6).collect();
                    let used = usable.iter().filter(|ip| held.contains(*ip)).count();
                    (usable.len() as u128, used as u128)
                };
                let ((v4, v4_used), (v6, v6_used)) = (count(false), count(true));
                (pool.name.clone(), [v4, v4_used, v6, v6_used])
            })
            .collect();
        accepted.sort();
        let mut rejected: Vec<String> = self
            .pools
            .iter()
            .map(|p| p.name.clone())
            .filter(|name| !accepted.iter().any(|(a, _)| a == name))
            .collect();
        rejected.sort();
        (accepted, rejected)
    }

    fn addresses(&self) -> BTreeMap<String, (Vec<String>, Option<String>)> {
        self.services
            .iter()
            .filter(|(_, svc)| svc.load_balancer)
            .map(|(key, _)| {
                // What the store shows: ours as written, the others as
                // the stream left them.
                let ips = self.status.get(key).into_iter().flatten();
                let pool = self.held.get(key).map(|(pool, _)| pool.clone());
                (key.clone(), (ips.map(ToString::to_string).collect(), pool))
            })
            .collect()
    }
}

// ----- the property -----

/// The `IPAllocated` and `ClearAssignment` Events of each Service, in order.
fn announced(result: &ReplayResult) -> BTreeMap<String, Vec<&str>> {
    let mut events: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for event in &result.events {
        if let reason @ ("IPAllocated" | "ClearAssignment") = event.reason.as_str() {
            events.entry(event.key.clone()).or_default().push(reason);
        }
    }
    events
}

/// The pools as [`Model::pools`] gives them.
fn pools(result: &ReplayResult) -> (Vec<(String, [u128; 4])>, Vec<String>) {
    let count = |c: &Count| c.0.get().unwrap_or(u128::MAX);
    let accepted = result.pools.iter().map(|p| {
        let (v4, v6) = (&p.ipv4, &p.ipv6);
        let counts = [&v4.total, &v4.assigned, &v6.total, &v6.assigned].map(count);
        (p.name.clone(), counts)
    });
    let rejected = result.rejected_pools.iter().map(|p| p.name.clone());
    (accepted.collect(), rejected.collect())
}

/// How the replay's result differs from the model's, if it does.
fn differences(result: &ReplayResult, model: &Model) -> Result<(), String> {
    let events = announced(result);
    if events != model.events {
        return Err(format!(
            "events differ: replay {events:?}, model {:?}",
            model.events
        ));
    }
    let (got, want) = (pools(result), model.pools());
    if got != want {
        return Err(format!("pools differ: replay {got:?}, model {want:?}"));
    }
    let (got, want) = (addresses(result), model.addresses());
    let keys: BTreeSet<&String> = want.keys().chain(got.keys()).collect();
    let differing: Vec<String> = keys
        .into_iter()
        .filter(|key| got.get(*key) != want.get(*key))
        .map(|key| {
            format!(
                "{key}: replay {:?}, model {:?}",
                got.get(key),
                want.get(key)
            )
        })
        .collect();
    if differing.is_empty() {
        Ok(())
    } else {
        Err(differing.join("\n"))
    }
}

/// The replay and the model agree on every Service's addresses, pool and
/// Events, and on the pools.
#[test]
fn an_independent_model_of_the_rules_gives_the_same_addresses() {
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    };
    let outcome = TestRunner::new(config).run(&script_strategy(), |script| {
        let lines = render(&script);
        let text = lines.join("\n") + "\n";
        let mut model = Model {
            synced: script.initial.is_none(),
            ..Model::default()
        };
        for line in &lines {
            model.apply(line);
        }
        replay(&text, &Default::default())
            .map_err(|error| error.to_string())
            .and_then(|output| differences(&output.result, &model))
            .map_err(|message| TestCaseError::fail(format!("{message}\nstream:\n{text}")))
    });
    match outcome {
        Ok(()) => eprintln!("property reference model: {} cases passed", cases()),
        Err(error) => panic!("the replay and the model differ: {error}"),
    }
}
