//! Property tests of whole replays (docs/allocation.md §4.8 and §6, issue #6).
//!
//! Random streams over a small cluster (a dozen Service keys, four pools of a
//! few addresses each, so Services contend) mix creates and updates of
//! Services (annotations, ports, type, class, sharing keys, requested
//! addresses valid and invalid, families, statuses), deletes, pool adds,
//! changes and deletes (overlapping and invalid pools included), Namespace
//! label changes, repeated lines, out-of-order events, deletes of unknown
//! objects, comments, bookmarks, unknown kinds and `SYNCED` lines. Each
//! property replays them and checks:
//!
//! - the §6 invariants after every line (`ReplayOptions::check_invariants`),
//!   and, independently, that the final result shares no address against the
//!   rules of §4.4 and that the pools' counters count what the statuses hold;
//! - replaying a stream twice gives byte-identical results and traces;
//! - a restart (the final store dumped as `ADDED` lines, then `SYNCED`)
//!   keeps every Service's addresses;
//! - failed status writes (conflicts and other errors) change no Service's
//!   final addresses;
//! - a stream cut off mid-line is an error that names the line.
//!
//! Each property runs `PROPTEST_CASES` cases (64 by default) and prints how
//! many it ran (`cargo test -p fake-watcher --test integration properties --
//! --nocapture`). A failing case prints its stream, ready to be saved as a
//! regression test.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use fake_watcher::{
    render_json, Count, FailurePlan, LineError, ReplayError, ReplayOptions, ReplayOutput,
    ReplayResult,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};

const POOL_ANNOTATION: &str = "metallb.io/ip-allocated-from-pool";

// ----- the cluster the streams talk about -----

/// `spec.addresses` of the pools: small, overlapping one another, some
/// invalid, one huge.
const POOL_SHAPES: &[&[&str]] = &[
    &["10.0.0.0/30"],
    &["10.0.0.2-10.0.0.5", "fd00::/126"],
    &["10.0.1.0/31", "fd00::10-fd00::11"],
    &["10.0.0.254 - 10.0.1.1"],
    &["fd00::/127"],
    &["10.0.4.0/29", "fd00::20/127"],
    &["fd00:1::/64", "10.0.5.255"],
    &["10.0.0.5-10.0.0.1"],
    &["10.0.2.0/33"],
    &[],
    &["10.0.3.0/31", "10.0.3.1"],
    &["10.0.6.7/30", "not-an-address"],
];

/// Values of `metallb.io/loadBalancerIPs` (or `spec.loadBalancerIP`).
const REQUESTS: &[&str] = &[
    "10.0.0.0",
    "10.0.0.1",
    "10.0.0.3",
    "10.0.1.0",
    "fd00::1",
    "fd00::11",
    "10.0.0.2,fd00::2",
    " 10.0.4.1 , fd00::21 ",
    "192.168.0.1",
    "fd00:1::5",
    "10.0.0.300",
    "10.0.0.1:80",
    "fd00::1%eth0",
    "10.0.0.1, 10.0.0.2, fd00::1",
    "10.0.0.1,10.0.0.2",
    "",
];

/// `status.loadBalancer.ingress` addresses a stream may claim.
const STATUSES: &[&[&str]] = &[
    &["10.0.0.0"],
    &["10.0.0.1"],
    &["10.0.0.2"],
    &["10.0.1.0"],
    &["fd00::1"],
    &["10.0.0.3", "fd00::2"],
    &["10.0.4.1"],
    &["192.168.0.1"],
    &["not-an-ip"],
    &["fd00:1::"],
    &["10.0.0.0", "10.0.0.1"],
];

/// Service ports: (port, protocol).
const PORTS: &[(i64, &str)] = &[(80, "TCP"), (443, "TCP"), (53, "UDP"), (80, "UDP")];

const POOL_NAMES: &[&str] = &["p0", "p1", "p2", "p3"];
const NAMESPACES: &[&str] = &["a", "b"];

/// A Service as a line writes it.
#[derive(Clone, Debug)]
struct Svc {
    /// `s0`..`s3`.
    name: u8,
    /// 0: no namespace (`default`), 1: `a`, 2: `b`.
    namespace: u8,
    /// 0: LoadBalancer, 1: ClusterIP, 2: LoadBalancer of another class,
    /// 3: no type.
    kind: u8,
    /// 0: nothing (SingleStack IPv4), 1: IPv6, 2: RequireDualStack,
    /// 3: PreferDualStack, 4: PreferDualStack IPv6 first, 5: headless.
    family: u8,
    /// Bit mask over [`PORTS`].
    ports: u8,
    /// (old prefix, key index).
    sharing: Option<(bool, u8)>,
    /// (old prefix, pool index; past the pools: an unknown pool).
    pool: Option<(bool, u8)>,
    /// (how: 0 annotation, 1 old-prefix annotation, 2 spec.loadBalancerIP,
    /// 3 both, index into [`REQUESTS`]).
    request: Option<(u8, u8)>,
    /// externalTrafficPolicy Local with selector `app=web` or `app=db`.
    local: Option<bool>,
    /// 0: none, 1: `app=web`, 2: `app=db`.
    labels: u8,
    /// (index into [`STATUSES`], with the pool annotation of this pool).
    status: Option<(u8, Option<u8>)>,
    /// Without a status: the pool annotation of this pool, as an edit that
    /// starts from the object the controller wrote keeps it (and the store
    /// keeps the status), so the update may show what is held.
    claims: Option<u8>,
}

#[derive(Clone, Debug)]
enum Op {
    Service {
        modified: bool,
        svc: Svc,
    },
    DeleteService {
        name: u8,
        namespace: u8,
    },
    Pool {
        modified: bool,
        name: u8,
        shape: u8,
        auto_assign: Option<bool>,
        avoid_buggy: Option<bool>,
        allocation: u8,
    },
    DeletePool {
        name: u8,
    },
    Namespace {
        modified: bool,
        name: u8,
        labels: u8,
    },
    DeleteNamespace {
        name: u8,
    },
    /// An edit of the Service of an earlier line (`back` Service lines
    /// back) that changes one thing (`what`), made as a user edits the
    /// live object: without a status (the store keeps it) and with the
    /// pool annotation of pool `claims`, as the controller may have
    /// written it. So the update may show what the Service holds while
    /// what it asks for changed.
    Tweak {
        back: u8,
        what: u8,
        claims: u8,
    },
    /// Repeats the line this many lines back (a duplicate event).
    Repeat {
        back: u8,
    },
    /// 0: comment, 1: blank, 2: BOOKMARK, 3: unknown kind, 4: SYNCED.
    Noise(u8),
}

fn svc_strategy(with_status: bool) -> impl Strategy<Value = Svc> {
    let status = if with_status {
        proptest::option::weighted(0.8, (0..STATUSES.len() as u8, proptest::option::of(0u8..4)))
            .boxed()
    } else {
        proptest::option::weighted(0.1, (0..STATUSES.len() as u8, proptest::option::of(0u8..4)))
            .boxed()
    };
    (
        (0u8..4, 0u8..3, prop_oneof![12 => Just(0u8), 1 => Just(1), 1 => Just(2), 1 => Just(3)]),
        (
            prop_oneof![10 => Just(0u8), 2 => Just(1), 2 => Just(2), 2 => Just(3), 1 => Just(4), 1 => Just(5)],
            prop_oneof![3 => (0u8..4).prop_map(|bit| 1 << bit), 1 => 1u8..16],
        ),
        (
            proptest::option::weighted(
                0.6,
                (any::<bool>(), prop_oneof![3 => Just(0u8), 1 => Just(1)]),
            ),
            proptest::option::weighted(0.25, (any::<bool>(), 0u8..5)),
            proptest::option::weighted(0.25, (0u8..4, 0..REQUESTS.len() as u8)),
        ),
        (
            proptest::option::weighted(0.15, any::<bool>()),
            0u8..3,
            status,
            proptest::option::weighted(0.5, 0u8..4),
        ),
    )
        .prop_map(
            |(
                (name, namespace, kind),
                (family, ports),
                (sharing, pool, request),
                (local, labels, status, claims),
            )| Svc {
                name,
                namespace,
                kind,
                family,
                ports,
                sharing,
                pool,
                request,
                local,
                labels,
                status,
                claims,
            },
        )
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (any::<bool>(), svc_strategy(false))
            .prop_map(|(modified, svc)| Op::Service { modified, svc }),
        3 => (0u8..4, 0u8..3).prop_map(|(name, namespace)| Op::DeleteService { name, namespace }),
        4 => (
            any::<bool>(),
            0u8..4,
            0..POOL_SHAPES.len() as u8,
            proptest::option::weighted(0.2, any::<bool>()),
            proptest::option::weighted(0.2, any::<bool>()),
            prop_oneof![6 => Just(0u8), 1 => 1u8..8],
        )
            .prop_map(|(modified, name, shape, auto_assign, avoid_buggy, allocation)| Op::Pool {
                modified,
                name,
                shape,
                auto_assign,
                avoid_buggy,
                allocation,
            }),
        1 => (0u8..4).prop_map(|name| Op::DeletePool { name }),
        2 => (any::<bool>(), 0u8..2, 0u8..4)
            .prop_map(|(modified, name, labels)| Op::Namespace { modified, name, labels }),
        1 => (0u8..2).prop_map(|name| Op::DeleteNamespace { name }),
        2 => any::<u8>().prop_map(|back| Op::Repeat { back }),
        4 => (any::<u8>(), 0u8..8, 0u8..4)
            .prop_map(|(back, what, claims)| Op::Tweak { back, what, claims }),
        2 => (0u8..5).prop_map(Op::Noise),
    ]
}

/// A stream: a few valid pools, an initial list (Services with statuses
/// mostly), maybe `SYNCED`, then events; at most 40 lines.
#[derive(Clone, Debug)]
struct Script {
    /// (name, shape) of valid pools added first.
    pools: Vec<(u8, u8)>,
    initial: Vec<Op>,
    synced: bool,
    events: Vec<Op>,
}

/// The shapes of [`POOL_SHAPES`] that are valid pools on their own.
const VALID_SHAPES: u8 = 7;

fn script_strategy() -> impl Strategy<Value = Script> {
    let initial_op = prop_oneof![
        3 => svc_strategy(true).prop_map(|svc| Op::Service { modified: false, svc }),
        2 => op_strategy(),
    ];
    (
        prop::collection::vec((0u8..4, 0..VALID_SHAPES), 0..3),
        prop::collection::vec(initial_op, 0..6),
        any::<bool>(),
        prop::collection::vec(op_strategy(), 1..30),
    )
        .prop_map(|(pools, initial, synced, events)| Script {
            pools,
            initial,
            synced,
            events,
        })
}

/// Scripts where many Services wait alike: small pools, an initial list
/// of plain Services (nothing requested), then any events, pool and
/// Namespace changes among them. Short ones keep the initial Services to
/// two namespaces and one label or none, so that many are alike; longer
/// ones (more pools, Services and events, any namespace and labels) give
/// the waiting more ways to interleave with writes that fail.
fn alike_script_strategy(longer: bool) -> impl Strategy<Value = Script> {
    let (spread, pools, initial, events) = if longer {
        (u8::MAX, 1..4, 4..16, 1..60)
    } else {
        (2, 1..3, 4..12, 1..30)
    };
    let plain = svc_strategy(false).prop_map(move |svc| Svc {
        namespace: svc.namespace % spread,
        kind: 0,
        sharing: None,
        pool: None,
        request: None,
        labels: svc.labels % spread,
        status: None,
        claims: None,
        ..svc
    });
    (
        prop::collection::vec((0u8..4, 0..VALID_SHAPES), pools),
        prop::collection::vec(
            plain.prop_map(|svc| Op::Service {
                modified: false,
                svc,
            }),
            initial,
        ),
        prop::collection::vec(op_strategy(), events),
    )
        .prop_map(|(pools, initial, events)| Script {
            pools,
            initial,
            synced: true,
            events,
        })
}

// ----- rendering a script as lines, and modelling the store -----

/// What a line does to the store.
#[derive(Clone, Debug)]
enum Effect {
    None,
    UpsertService(String, Value),
    DeleteService(String),
    UpsertPool(String, Value),
    DeletePool(String),
    UpsertNamespace(String, Value),
    DeleteNamespace(String),
}

#[derive(Clone, Debug)]
struct Line {
    text: String,
    effect: Effect,
}

impl Line {
    fn event(event_type: &str, object: Value, effect: Effect) -> Line {
        Line {
            text: json!({"type": event_type, "object": object}).to_string(),
            effect,
        }
    }

    fn plain(text: &str) -> Line {
        Line {
            text: text.to_owned(),
            effect: Effect::None,
        }
    }

    /// An event line, not a comment or a blank line.
    fn is_event(&self) -> bool {
        let text = self.text.trim_start();
        !text.is_empty() && !text.starts_with('#')
    }
}

fn namespace_of(index: u8) -> Option<&'static str> {
    NAMESPACES.get(usize::from(index).wrapping_sub(1)).copied()
}

fn service_key(name: u8, namespace: u8) -> String {
    format!("{}/s{name}", namespace_of(namespace).unwrap_or("default"))
}

fn pool_name(index: u8) -> &'static str {
    POOL_NAMES
        .get(usize::from(index))
        .copied()
        .unwrap_or("nope")
}

fn service_object(svc: &Svc) -> Value {
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(format!("s{}", svc.name)));
    if let Some(namespace) = namespace_of(svc.namespace) {
        metadata.insert("namespace".into(), json!(namespace));
    }
    let mut annotations = Map::new();
    let prefix = |old: bool| {
        if old {
            "metallb.universe.tf/"
        } else {
            "metallb.io/"
        }
    };
    if let Some((old, key)) = svc.sharing {
        annotations.insert(
            format!("{}allow-shared-ip", prefix(old)),
            json!(format!("key{key}")),
        );
    }
    if let Some((old, pool)) = svc.pool {
        annotations.insert(
            format!("{}address-pool", prefix(old)),
            json!(pool_name(pool)),
        );
    }
    let mut spec = Map::new();
    if let Some((how, index)) = svc.request {
        let value = REQUESTS
            .get(usize::from(index))
            .copied()
            .unwrap_or_default();
        if matches!(how, 0 | 3) {
            annotations.insert("metallb.io/loadBalancerIPs".into(), json!(value));
        }
        if how == 1 {
            annotations.insert("metallb.universe.tf/loadBalancerIPs".into(), json!(value));
        }
        if matches!(how, 2 | 3) {
            spec.insert("loadBalancerIP".into(), json!(value));
        }
    }
    match (svc.status, svc.claims) {
        (Some((_, Some(pool))), _) | (None, Some(pool)) => {
            annotations.insert(POOL_ANNOTATION.into(), json!(pool_name(pool)));
        }
        _ => {}
    }
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
    match svc.labels {
        1 => {
            metadata.insert("labels".into(), json!({"app": "web"}));
        }
        2 => {
            metadata.insert("labels".into(), json!({"app": "db"}));
        }
        _ => {}
    }
    let kind = match svc.kind {
        0 => vec![("type", json!("LoadBalancer"))],
        1 => vec![("type", json!("ClusterIP"))],
        2 => vec![
            ("type", json!("LoadBalancer")),
            ("loadBalancerClass", json!("other")),
        ],
        _ => vec![],
    };
    let family = match svc.family {
        1 => vec![("ipFamilies", json!(["IPv6"]))],
        2 => vec![("ipFamilyPolicy", json!("RequireDualStack"))],
        3 => vec![("ipFamilyPolicy", json!("PreferDualStack"))],
        4 => vec![
            ("ipFamilyPolicy", json!("PreferDualStack")),
            ("ipFamilies", json!(["IPv6", "IPv4"])),
        ],
        5 => vec![("clusterIP", json!("None"))],
        _ => vec![],
    };
    for (field, value) in kind.into_iter().chain(family) {
        spec.insert(field.into(), value);
    }
    let ports: Vec<Value> = PORTS
        .iter()
        .enumerate()
        .filter(|(bit, _)| svc.ports & (1 << bit) != 0)
        .map(|(_, (port, protocol))| json!({"port": port, "protocol": protocol}))
        .collect();
    spec.insert("ports".into(), Value::Array(ports));
    if let Some(web) = svc.local {
        spec.insert("externalTrafficPolicy".into(), json!("Local"));
        spec.insert(
            "selector".into(),
            json!({"app": if web { "web" } else { "db" }}),
        );
    }
    let mut object = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": Value::Object(metadata),
        "spec": Value::Object(spec),
    });
    if let Some((status, _)) = svc.status {
        let ingress: Vec<Value> = STATUSES
            .get(usize::from(status))
            .copied()
            .unwrap_or_default()
            .iter()
            .map(|ip| json!({"ip": ip}))
            .collect();
        object["status"] = json!({"loadBalancer": {"ingress": ingress}});
    }
    object
}

fn allocation(index: u8) -> Option<Value> {
    Some(match index {
        1 => json!({"namespaces": ["a"]}),
        2 => json!({"namespaceSelectors": [{"matchLabels": {"env": "prod"}}]}),
        3 => json!({"priority": 1, "serviceSelectors": [{"matchLabels": {"app": "web"}}]}),
        4 => json!({"priority": 2, "namespaces": ["b"]}),
        5 => json!({"serviceSelectors": [{"matchExpressions": [
            {"key": "app", "operator": "Contains", "values": ["web"]}]}]}),
        6 => json!({}),
        7 => json!({
            "namespaceSelectors": [{"matchExpressions": [
                {"key": "env", "operator": "In", "values": ["prod", "dev"]}]}],
            "serviceSelectors": [{"matchExpressions": [
                {"key": "app", "operator": "NotIn", "values": ["db"]}]}],
        }),
        _ => return None,
    })
}

fn pool_object(
    name: &str,
    shape: u8,
    auto_assign: Option<bool>,
    avoid_buggy: Option<bool>,
    allocation_index: u8,
) -> Value {
    let addresses = POOL_SHAPES
        .get(usize::from(shape))
        .copied()
        .unwrap_or_default();
    let mut spec = json!({ "addresses": addresses });
    if let Some(auto_assign) = auto_assign {
        spec["autoAssign"] = json!(auto_assign);
    }
    if let Some(avoid_buggy) = avoid_buggy {
        spec["avoidBuggyIPs"] = json!(avoid_buggy);
    }
    if let Some(allocation) = allocation(allocation_index) {
        spec["serviceAllocation"] = allocation;
    }
    json!({
        "apiVersion": "metallb.io/v1beta1",
        "kind": "IPAddressPool",
        "metadata": {"name": name, "namespace": "metallb-system"},
        "spec": spec,
    })
}

fn namespace_object(name: &str, labels: u8) -> Value {
    let mut object = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    let labels = match labels {
        1 => json!({"env": "prod"}),
        2 => json!({"env": "dev"}),
        3 => json!({"env": "prod", "team": "x"}),
        _ => return object,
    };
    object["metadata"]["labels"] = labels;
    object
}

fn verb(modified: bool) -> &'static str {
    if modified {
        "MODIFIED"
    } else {
        "ADDED"
    }
}

fn render_op(op: &Op, lines: &[Line]) -> Line {
    match op {
        Op::Service { modified, svc } => Line::event(
            verb(*modified),
            service_object(svc),
            Effect::UpsertService(service_key(svc.name, svc.namespace), service_object(svc)),
        ),
        Op::DeleteService { name, namespace } => {
            let mut metadata = json!({"name": format!("s{name}")});
            if let Some(ns) = namespace_of(*namespace) {
                metadata["namespace"] = json!(ns);
            }
            Line::event(
                "DELETED",
                json!({"apiVersion": "v1", "kind": "Service", "metadata": metadata}),
                Effect::DeleteService(service_key(*name, *namespace)),
            )
        }
        Op::Pool {
            modified,
            name,
            shape,
            auto_assign,
            avoid_buggy,
            allocation,
        } => {
            let name = pool_name(*name);
            let object = pool_object(name, *shape, *auto_assign, *avoid_buggy, *allocation);
            Line::event(
                verb(*modified),
                object.clone(),
                Effect::UpsertPool(name.to_owned(), object),
            )
        }
        Op::DeletePool { name } => {
            let name = pool_name(*name);
            Line::event(
                "DELETED",
                json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                       "metadata": {"name": name}}),
                Effect::DeletePool(name.to_owned()),
            )
        }
        Op::Namespace {
            modified,
            name,
            labels,
        } => {
            let name = NAMESPACES.get(usize::from(*name)).copied().unwrap_or("a");
            let object = namespace_object(name, *labels);
            Line::event(
                verb(*modified),
                object.clone(),
                Effect::UpsertNamespace(name.to_owned(), object),
            )
        }
        Op::DeleteNamespace { name } => {
            let name = NAMESPACES.get(usize::from(*name)).copied().unwrap_or("a");
            Line::event(
                "DELETED",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
                Effect::DeleteNamespace(name.to_owned()),
            )
        }
        Op::Tweak { back, what, claims } => tweak(lines, *back, *what, *claims),
        Op::Repeat { back } => {
            if lines.is_empty() {
                return Line::plain("# nothing to repeat yet");
            }
            let back = usize::from(*back) % lines.len();
            lines[lines.len() - 1 - back].clone()
        }
        Op::Noise(0) => Line::plain("# a comment"),
        Op::Noise(1) => Line::plain(""),
        Op::Noise(2) => Line::plain(
            r#"{"type":"BOOKMARK","object":{"kind":"Service","apiVersion":"v1","metadata":{"resourceVersion":"12345"}}}"#,
        ),
        Op::Noise(3) => Line::plain(
            r#"{"type":"ADDED","object":{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","namespace":"a"}}}"#,
        ),
        Op::Noise(_) => Line::plain(r#"{"type":"SYNCED"}"#),
    }
}

/// See [`Op::Tweak`].
fn tweak(lines: &[Line], back: u8, what: u8, claims: u8) -> Line {
    let services: Vec<(&String, &Value)> = lines
        .iter()
        .filter_map(|line| match &line.effect {
            Effect::UpsertService(key, object) => Some((key, object)),
            _ => None,
        })
        .collect();
    if services.is_empty() {
        return Line::plain("# nothing to edit yet");
    }
    let at = services.len() - 1 - usize::from(back) % services.len();
    let Some(&(key, object)) = services.get(at) else {
        return Line::plain("# nothing to edit");
    };
    let mut object = object.clone();
    if let Some(fields) = object.as_object_mut() {
        fields.remove("status");
    }
    object["metadata"]["annotations"][POOL_ANNOTATION] = json!(pool_name(claims));
    let spec = &mut object["spec"];
    match what {
        0 => object["metadata"]["labels"] = json!({"app": "db"}),
        1 => object["metadata"]["labels"] = json!({"app": "web"}),
        2 => spec["ports"] = json!([{"port": 80, "protocol": "TCP"}]),
        3 => spec["ports"] = json!([{"port": 53, "protocol": "UDP"}]),
        4 => object["metadata"]["annotations"]["metallb.io/allow-shared-ip"] = json!("key0"),
        5 => {
            spec["externalTrafficPolicy"] = json!("Local");
            spec["selector"] = json!({"app": "db"});
        }
        6 => spec["loadBalancerClass"] = json!("other"),
        // The same object: only the pool annotation may differ.
        _ => {}
    }
    Line::event(
        "MODIFIED",
        object.clone(),
        Effect::UpsertService(key.clone(), object),
    )
}

fn render_script(script: &Script) -> Vec<Line> {
    let mut lines = Vec::new();
    for &(name, shape) in &script.pools {
        let op = Op::Pool {
            modified: false,
            name,
            shape,
            auto_assign: None,
            avoid_buggy: None,
            allocation: 0,
        };
        lines.push(render_op(&op, &lines));
    }
    for op in &script.initial {
        let line = render_op(op, &lines);
        lines.push(line);
    }
    if script.synced {
        lines.push(Line::plain(r#"{"type":"SYNCED"}"#));
    }
    for op in &script.events {
        let line = render_op(op, &lines);
        lines.push(line);
    }
    lines
}

fn text_of(lines: &[Line]) -> String {
    lines.iter().fold(String::new(), |mut text, line| {
        let _ = writeln!(text, "{}", line.text);
        text
    })
}

/// The store as the stream leaves it (docs/replay.md §1.2), without what the
/// controller writes.
#[derive(Debug, Default)]
struct Model {
    /// Key → (the object that created it, the last object written).
    services: BTreeMap<String, (Value, Value)>,
    /// In creation order (a changed pool keeps its place).
    pools: Vec<(String, Value)>,
    namespaces: BTreeMap<String, Value>,
}

impl Model {
    fn of(lines: &[Line]) -> Model {
        let mut model = Model::default();
        for line in lines {
            match &line.effect {
                Effect::None => {}
                Effect::UpsertService(key, object) => {
                    model
                        .services
                        .entry(key.clone())
                        .and_modify(|(_, last)| *last = object.clone())
                        .or_insert_with(|| (object.clone(), object.clone()));
                }
                Effect::DeleteService(key) => {
                    model.services.remove(key);
                }
                Effect::UpsertPool(name, object) => {
                    match model.pools.iter_mut().find(|(n, _)| n == name) {
                        Some((_, stored)) => *stored = object.clone(),
                        None => model.pools.push((name.clone(), object.clone())),
                    }
                }
                Effect::DeletePool(name) => model.pools.retain(|(n, _)| n != name),
                Effect::UpsertNamespace(name, object) => {
                    model.namespaces.insert(name.clone(), object.clone());
                }
                Effect::DeleteNamespace(name) => {
                    model.namespaces.remove(name);
                }
            }
        }
        model
    }

    /// Whether this controller (no `--lb-class`) handles the Service.
    fn is_ours(&self, key: &str) -> bool {
        self.services.get(key).is_some_and(|(_, last)| {
            last["spec"]["type"] == "LoadBalancer"
                && last["spec"]
                    .get("loadBalancerClass")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
        })
    }

    /// The final store as a stream: Namespaces, pools in creation order,
    /// Services with their final status and pool annotation from `result`,
    /// then `SYNCED` (a restarted controller reading a cluster).
    fn dump(&self, result: &ReplayResult) -> String {
        let mut lines = Vec::new();
        for object in self.namespaces.values() {
            lines.push(json!({"type": "ADDED", "object": object}).to_string());
        }
        for (_, object) in &self.pools {
            lines.push(json!({"type": "ADDED", "object": object}).to_string());
        }
        for (key, (created, last)) in &self.services {
            let mut object = last.clone();
            // Immutable: the store kept those of the creating line.
            for field in ["ipFamilies", "ipFamilyPolicy", "clusterIP", "clusterIPs"] {
                let spec = object["spec"].as_object_mut();
                match (created["spec"].get(field), spec) {
                    (Some(value), Some(spec)) => {
                        spec.insert(field.to_owned(), value.clone());
                    }
                    (None, Some(spec)) => {
                        spec.remove(field);
                    }
                    _ => {}
                }
            }
            let object_map = object.as_object_mut();
            let Some(object_map) = object_map else {
                continue;
            };
            object_map.remove("status");
            let found = result.services.iter().find(|s| &s.key == key);
            let metadata = object_map
                .entry("metadata")
                .or_insert_with(|| json!({}))
                .as_object_mut();
            if let (Some(metadata), Some(found)) = (metadata, found) {
                let annotations = metadata
                    .entry("annotations")
                    .or_insert_with(|| json!({}))
                    .as_object_mut();
                if let Some(annotations) = annotations {
                    annotations.remove(POOL_ANNOTATION);
                    if let Some(pool) = &found.pool {
                        annotations.insert(POOL_ANNOTATION.to_owned(), json!(pool));
                    }
                }
            }
            if let Some(found) = found {
                let ingress: Vec<Value> = found.ips.iter().map(|ip| json!({"ip": ip})).collect();
                object_map.insert(
                    "status".to_owned(),
                    json!({"loadBalancer": {"ingress": ingress}}),
                );
            }
            lines.push(json!({"type": "ADDED", "object": object}).to_string());
        }
        lines.push(r#"{"type":"SYNCED"}"#.to_owned());
        lines.iter().fold(String::new(), |mut text, line| {
            let _ = writeln!(text, "{line}");
            text
        })
    }

    /// Checks the final result on its own, without the controller's help:
    /// an address of two Services is shared under §4.4 (same non-empty
    /// sharing key, same backend, no port in common), and every pool's
    /// `assigned` counts the distinct addresses that Services' statuses
    /// name for it.
    fn check_result(&self, result: &ReplayResult) -> Result<(), String> {
        let mut holders: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut per_pool: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for service in &result.services {
            if !self.is_ours(&service.key) {
                continue;
            }
            for ip in &service.ips {
                holders.entry(ip).or_default().push(&service.key);
                if let Some(pool) = &service.pool {
                    per_pool.entry(pool).or_default().insert(ip);
                }
            }
            if !service.ips.is_empty() && service.pool.is_none() {
                return Err(format!(
                    "{} holds {:?} without a pool",
                    service.key, service.ips
                ));
            }
        }
        for (ip, keys) in &holders {
            if keys.len() < 2 {
                continue;
            }
            let sharing: Vec<(String, String)> =
                keys.iter().map(|key| self.sharing_of(key)).collect();
            let first = sharing.first().cloned().unwrap_or_default();
            if first.0.is_empty() || sharing.iter().any(|s| *s != first) {
                return Err(format!(
                    "{ip} is held by {keys:?} with sharing/backend keys {sharing:?}"
                ));
            }
            let mut ports = BTreeSet::new();
            for key in keys {
                for port in self.ports_of(key) {
                    if !ports.insert(port.clone()) {
                        return Err(format!("{ip} is held by {keys:?}, port {port} twice"));
                    }
                }
            }
        }
        for pool in &result.pools {
            let held = per_pool.get(pool.name.as_str());
            let count = |v6: bool| {
                held.map_or(0, |ips| {
                    ips.iter().filter(|ip| ip.contains(':') == v6).count() as u128
                })
            };
            if pool.ipv4.assigned != Count::from(count(false))
                || pool.ipv6.assigned != Count::from(count(true))
            {
                return Err(format!(
                    "pool {} counts {}/{} assigned, the statuses hold {:?}",
                    pool.name, pool.ipv4.assigned, pool.ipv6.assigned, held
                ));
            }
            if pool.ipv4.assigned > pool.ipv4.total || pool.ipv6.assigned > pool.ipv6.total {
                return Err(format!("pool {} has more assigned than total", pool.name));
            }
        }
        Ok(())
    }

    /// (sharing key in effect, backend key) of a Service.
    fn sharing_of(&self, key: &str) -> (String, String) {
        let Some((_, last)) = self.services.get(key) else {
            return Default::default();
        };
        let annotations = &last["metadata"]["annotations"];
        let sharing = annotations
            .get("metallb.io/allow-shared-ip")
            .or_else(|| annotations.get("metallb.universe.tf/allow-shared-ip"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .trim()
            .to_owned();
        let backend = if last["spec"]["externalTrafficPolicy"] == "Local" {
            last["spec"]["selector"].to_string()
        } else {
            String::new()
        };
        (sharing, backend)
    }

    fn ports_of(&self, key: &str) -> Vec<String> {
        let Some((_, last)) = self.services.get(key) else {
            return Vec::new();
        };
        last["spec"]["ports"]
            .as_array()
            .map(|ports| {
                ports
                    .iter()
                    .map(|p| format!("{}/{}", p["port"], p["protocol"]))
                    .collect()
            })
            .unwrap_or_default()
    }
}

// ----- running -----

/// Replays `text` on a runtime with a paused clock (retries take no time).
pub(super) fn replay(text: &str, options: &ReplayOptions) -> Result<ReplayOutput, ReplayError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(ReplayError::Runtime)?;
    runtime.block_on(fake_watcher::replay("gen.jsonl", text.as_bytes(), options))
}

fn checked() -> ReplayOptions {
    ReplayOptions::default().trace(true).check_invariants(true)
}

/// `key → (ips, pool)` of every LoadBalancer Service.
pub(super) fn addresses(result: &ReplayResult) -> BTreeMap<String, (Vec<String>, Option<String>)> {
    result
        .services
        .iter()
        .map(|s| (s.key.clone(), (s.ips.clone(), s.pool.clone())))
        .collect()
}

pub(super) fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(64)
}

/// Runs `property` on `cases()` random scripts (and extra values from
/// `extra`), prints how many ran, and fails with the shrunk stream.
fn check<E: Strategy>(
    name: &str,
    extra: E,
    property: impl Fn(&[Line], &E::Value) -> Result<(), String>,
) where
    E::Value: std::fmt::Debug,
{
    check_scripts(name, script_strategy(), extra, property);
}

/// [`check`] on scripts from `scripts`.
fn check_scripts<E: Strategy>(
    name: &str,
    scripts: impl Strategy<Value = Script>,
    extra: E,
    property: impl Fn(&[Line], &E::Value) -> Result<(), String>,
) where
    E::Value: std::fmt::Debug,
{
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let ran = std::cell::Cell::new(0u32);
    let outcome = runner.run(&(scripts, extra), |(script, extra)| {
        ran.set(ran.get() + 1);
        let lines = render_script(&script);
        property(&lines, &extra).map_err(|message| {
            TestCaseError::fail(format!(
                "{message}\nextra: {extra:?}\nstream:\n{}",
                text_of(&lines)
            ))
        })
    });
    match outcome {
        Ok(()) => eprintln!("property {name}: {} cases passed", cases()),
        Err(error) => panic!(
            "property {name} failed after {} cases (shrinking included): {error}",
            ran.get()
        ),
    }
}

fn violations(output: &ReplayOutput) -> Result<(), String> {
    if output.violations.is_empty() {
        Ok(())
    } else {
        Err(format!("invariants broken: {:?}", output.violations))
    }
}

// ----- the properties -----

/// §6 after every line, an independent check of the final result, and
/// byte-identical replays.
#[test]
fn invariants_hold_and_replays_are_identical() {
    // How many cases show each situation: evidence that the streams reach
    // the rules they are meant to test.
    let seen = std::cell::RefCell::new(BTreeMap::<String, u32>::new());
    check(
        "invariants_hold_and_replays_are_identical",
        Just(()),
        |lines, ()| {
            let text = text_of(lines);
            let first = replay(&text, &checked()).map_err(|e| format!("replay failed: {e}"))?;
            violations(&first)?;
            for situation in situations(lines, &first) {
                *seen.borrow_mut().entry(situation).or_default() += 1;
            }
            Model::of(lines).check_result(&first.result)?;
            let second = replay(&text, &checked()).map_err(|e| format!("replay failed: {e}"))?;
            let json =
                |output: &ReplayOutput| render_json(&output.result).map_err(|e| e.to_string());
            if json(&first)? != json(&second)? {
                return Err("two replays give different results".to_owned());
            }
            if first.trace != second.trace {
                return Err("two replays give different traces".to_owned());
            }
            Ok(())
        },
    );
    eprintln!("cases per situation: {:?}", seen.borrow());
}

/// The situations a case reached: each event reason, shared and dual-stack
/// addresses, rejected pools, an initial list.
fn situations(lines: &[Line], output: &ReplayOutput) -> BTreeSet<String> {
    let result = &output.result;
    let shared_on_the_way = output.trace.iter().any(|step| {
        let mut seen = BTreeSet::new();
        step.holdings
            .iter()
            .flat_map(|holding| &holding.ips)
            .any(|ip| !seen.insert(ip))
    });
    let mut found: BTreeSet<String> = result.events.iter().map(|e| e.reason.clone()).collect();
    let mut ips = BTreeSet::new();
    for service in &result.services {
        if service.ips.len() == 2 {
            found.insert("dual-stack address".to_owned());
        }
        for ip in &service.ips {
            if !ips.insert(ip) {
                found.insert("shared address at the end".to_owned());
            }
        }
    }
    if shared_on_the_way {
        found.insert("shared address after some line".to_owned());
    }
    if !ips.is_empty() {
        found.insert("an address held at the end".to_owned());
    }
    if !result.rejected_pools.is_empty() {
        found.insert("rejected pool".to_owned());
    }
    if lines.iter().any(|line| line.text.contains("SYNCED")) {
        found.insert("SYNCED line".to_owned());
    }
    found
}

/// A restarted controller reading the final cluster keeps every address.
#[test]
fn a_restart_keeps_every_address() {
    check("a_restart_keeps_every_address", Just(()), |lines, ()| {
        let text = text_of(lines);
        let before = replay(&text, &checked()).map_err(|e| format!("replay failed: {e}"))?;
        violations(&before)?;
        let dump = Model::of(lines).dump(&before.result);
        let after = replay(&dump, &checked())
            .map_err(|e| format!("replay of the restart failed: {e}\n{dump}"))?;
        violations(&after).map_err(|e| format!("{e}\nrestart stream:\n{dump}"))?;
        let after_addresses = addresses(&after.result);
        for (key, (ips, pool)) in addresses(&before.result) {
            if ips.is_empty() {
                continue;
            }
            let restarted = after_addresses.get(&key);
            // Kept, each of them, from the same pool. A PreferDualStack
            // Service that waited for its other family may get it at the
            // restart: the sync passes reconsider everything, while a
            // change that made room without a release (a holder's new
            // sharing key) wakes no one (docs/allocation.md §4.6).
            let kept = restarted.is_some_and(|(now, now_pool)| {
                let completed = ips.len() == 1 && now.len() == 2;
                now_pool == &pool && (now == &ips || completed && now.contains(&ips[0]))
            });
            if !kept {
                return Err(format!(
                    "{key} held {ips:?} from {pool:?}, after a restart {restarted:?}\n\
                     restart stream:\n{dump}"
                ));
            }
        }
        Ok(())
    });
}

/// Failed status writes (30% of attempts, conflicts or other errors) are
/// retried to the very same addresses; no address is lost or given twice
/// (clearing writes of Services that stop being ours included).
#[test]
fn failed_writes_converge_to_the_same_addresses() {
    failed_writes_converge("failed_writes_converge_to_the_same_addresses");
}

fn failed_writes_converge(name: &str) {
    check(
        name,
        (any::<u64>(), any::<bool>()),
        |lines, &(seed, conflict)| {
            let text = text_of(lines);
            let plain =
                replay(&text, &ReplayOptions::default()).map_err(|e| format!("replay: {e}"))?;
            let plan = FailurePlan::seeded(seed, 30);
            let plan = if conflict { plan } else { plan.failed() };
            let failing = replay(&text, &checked().failures(plan))
                .map_err(|e| format!("replay with failures: {e}"))?;
            violations(&failing)?;
            let model = Model::of(lines);
            model.check_result(&failing.result)?;
            let injected = failing
                .trace
                .iter()
                .flat_map(|step| &step.writes)
                .filter(|w| w.outcome == fake_watcher::WriteOutcome::Injected)
                .count();
            let (want, got) = (addresses(&plain.result), addresses(&failing.result));
            if want != got {
                let diff: Vec<String> = want
                    .iter()
                    .filter(|(key, value)| got.get(*key) != Some(value))
                    .map(|(key, value)| format!("{key}: {value:?} vs {:?}", got.get(key)))
                    .collect();
                return Err(format!(
                    "with {injected} injected failures the addresses differ: {diff:?}"
                ));
            }
            Ok(())
        },
    );
}

/// Leaving settled Services out (the echo of a status write, the second
/// pass's Services that keep their addresses) changes nothing: every line's
/// writes, Events and holdings, and the result, are those of a controller
/// that reconciles everything, as MetalLB does; with failed writes too.
#[test]
fn skipping_settled_services_changes_nothing() {
    check(
        "skipping_settled_services_changes_nothing",
        (any::<u64>(), 0u8..3),
        same_either_way_failing_or_not,
    );
}

/// The same with many Services waiting alike, of which a change's second
/// pass runs one per way they are alike (docs/allocation.md §4.9).
#[test]
fn skipping_waiting_services_alike_changes_nothing() {
    check_scripts(
        "skipping_waiting_services_alike_changes_nothing",
        alike_script_strategy(false),
        (any::<u64>(), 0u8..3),
        same_either_way_failing_or_not,
    );
}

/// The same on longer streams: the strategy that found
/// [`a_waker_whose_write_fails_does_not_stand_for_the_others_alike`].
#[test]
fn skipping_waiting_services_alike_changes_nothing_on_longer_streams() {
    check_scripts(
        "skipping_waiting_services_alike_changes_nothing_on_longer_streams",
        alike_script_strategy(true),
        (any::<u64>(), 0u8..3),
        same_either_way_failing_or_not,
    );
}

/// [`same_either_way`] on `lines` with no write failing (`failures` 0),
/// or with seeded conflicts (1) or other failures (2).
fn same_either_way_failing_or_not(
    lines: &[Line],
    &(seed, failures): &(u64, u8),
) -> Result<(), String> {
    let text = text_of(lines);
    let options = match failures {
        0 => checked(),
        1 => checked().failures(FailurePlan::seeded(seed, 30)),
        _ => checked().failures(FailurePlan::seeded(seed, 30).failed()),
    };
    same_either_way(&text, &options)
}

/// The Events of `key` (line, message) when `text` replays the same
/// skipping settled Services and reconciling everything.
fn events_either_way(text: &str, key: &str) -> Vec<(u64, String)> {
    same_either_way(text, &checked()).unwrap();
    let output = replay(text, &checked()).unwrap();
    let events = output.result.events.into_iter();
    events
        .filter(|e| e.key == key)
        .map(|e| (e.line, e.message))
        .collect()
}

/// The last Event of `key` (line, message), as [`events_either_way`].
fn last_event_either_way(text: &str, key: &str) -> Option<(u64, String)> {
    events_either_way(text, key).pop()
}

/// Replays `text` skipping settled Services and reconciling everything;
/// fails where they differ.
fn same_either_way(text: &str, options: &ReplayOptions) -> Result<(), String> {
    let mut everything = options.clone();
    everything.exhaustive = true;
    let fast = replay(text, options).map_err(|e| format!("replay: {e}"))?;
    let full = replay(text, &everything).map_err(|e| format!("exhaustive: {e}"))?;
    violations(&fast)?;
    if let Some((a, b)) = fast.trace.iter().zip(&full.trace).find(|(a, b)| a != b) {
        return Err(format!(
            "line {} differs:\n  skipping: {a:?}\n  exhaustive: {b:?}",
            a.line
        ));
    }
    if fast.trace.len() != full.trace.len() || fast.result != full.result {
        return Err("the results differ".to_owned());
    }
    Ok(())
}

/// Found by `skipping_settled_services_changes_nothing` (when a requested
/// single address got the other family added, which the next
/// reconciliation then released): a PreferDualStack Service that requests
/// one IPv6 address holds exactly that one and waits for nothing
/// (docs/allocation.md §4.2), the same whether settled echoes are skipped
/// or not.
#[test]
fn an_echo_is_settled_only_if_its_addresses_may_be_kept() {
    let stream = [
        r#"{"object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p0","namespace":"metallb-system"},"spec":{"addresses":["10.0.0.2-10.0.0.5","fd00::/126"]}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/loadBalancerIPs":"fd00::1"},"name":"s0"},"spec":{"ipFamilyPolicy":"PreferDualStack","ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"},"status":{"loadBalancer":{"ingress":[{"ip":"fd00::1"}]}}},"type":"ADDED"}"#,
    ]
    .join("\n");
    same_either_way(&stream, &checked()).unwrap();
    let output = replay(&stream, &checked()).unwrap();
    let reasons: Vec<&str> = output
        .result
        .events
        .iter()
        .map(|e| e.reason.as_str())
        .collect();
    assert!(reasons.is_empty(), "{reasons:?}");
    let ips: Vec<&Vec<String>> = output.result.services.iter().map(|s| &s.ips).collect();
    assert_eq!(ips, [&vec!["fd00::1".to_owned()]]);
}

/// Found by `failed_writes_converge_to_the_same_addresses`: a Service whose
/// status had to be cleared and that could get no address started waiting
/// only once its clearing write went through, so a failed write sent it
/// behind a Service that began waiting after it, and the address freed
/// next went to the other one.
#[test]
fn a_failed_clearing_write_keeps_the_waiting_place() {
    let stream = [
        r#"{"object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p1","namespace":"metallb-system"},"spec":{"addresses":["fd00:1::/64","10.0.5.255"]}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1","namespace":"a"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"},"status":{"loadBalancer":{"ingress":[{"ip":"10.0.0.0"}]}}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s0"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"},"status":{"loadBalancer":{"ingress":[{"ip":"10.0.0.0"}]}}},"type":"ADDED"}"#,
        r#"{"type":"SYNCED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/address-pool":"p0"},"name":"s1","namespace":"a"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
    ]
    .join("\n");
    let plain = replay(&stream, &checked()).unwrap();
    let plan = FailurePlan::seeded(5_769_203_822_226_402_705, 30).failed();
    let failing = replay(&stream, &checked().failures(plan)).unwrap();
    let injected = failing
        .trace
        .iter()
        .flat_map(|step| &step.writes)
        .filter(|w| w.outcome == fake_watcher::WriteOutcome::Injected && w.key == "default/s0")
        .count();
    assert!(injected > 0, "the plan no longer fails default/s0's writes");
    let holder = |output: &ReplayOutput| {
        output
            .result
            .services
            .iter()
            .filter(|s| s.ips == ["10.0.5.255"])
            .map(|s| s.key.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(holder(&plain), ["default/s0"]);
    assert_eq!(holder(&failing), ["default/s0"]);
}

/// A stream cut off in the middle of a line stops with an error naming
/// that line; with `--keep-going` the rest of the stream is the same as if
/// the line had never been there.
#[test]
fn a_stream_cut_mid_line_names_the_line() {
    check(
        "a_stream_cut_mid_line_names_the_line",
        (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
        |lines, (which, at)| {
            let events: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].is_event()).collect();
            if events.is_empty() {
                return Ok(());
            }
            let cut = *which.get(&events);
            let line = &lines[cut].text;
            // A strict, non-empty prefix of the line: never a JSON object.
            let keep = 1 + at.index(line.len() - 1);
            let head = text_of(&lines[..cut]);
            let text = format!("{head}{}", &line[..keep]);
            let number = cut as u64 + 1;
            match replay(&text, &ReplayOptions::default()) {
                Err(ReplayError::Stream(error)) => {
                    let shown = error.to_string();
                    let expected = format!("gen.jsonl:{number}: not JSON: EOF while parsing");
                    if error.line != number
                        || !matches!(error.error, LineError::Json { .. })
                        || !shown.starts_with(&expected)
                    {
                        return Err(format!("cut at line {number}: {shown}"));
                    }
                }
                other => return Err(format!("cut at line {number}: {other:?}")),
            }
            let skipped = replay(&text, &ReplayOptions::default().keep_going(true))
                .map_err(|e| format!("keep-going: {e}"))?;
            let lines_skipped: Vec<u64> = skipped.skipped.iter().map(|e| e.line).collect();
            if lines_skipped != [number] {
                return Err(format!("keep-going skipped {lines_skipped:?}"));
            }
            let without = replay(&head, &ReplayOptions::default())
                .map_err(|e| format!("replay of the head: {e}"))?;
            if skipped.result != without.result {
                return Err("a skipped cut line changed the result".to_owned());
            }
            Ok(())
        },
    );
}

// ----- regressions found by these properties -----

/// `web` holds 10.0.0.0, then stops being ours (`change` is the MODIFIED
/// line's spec), and `next` asks for an address; the write that clears
/// `web`'s status fails once. Returns every Service's addresses.
fn stop_being_ours_with_a_failed_clear(
    change: &str,
    keep_annotation: bool,
) -> BTreeMap<String, (Vec<String>, Option<String>)> {
    let annotations = if keep_annotation {
        r#","annotations":{"metallb.io/ip-allocated-from-pool":"p"}"#
    } else {
        ""
    };
    let text = format!(
        "{}\n{}\n{}\n{}\n",
        r#"{"type":"ADDED","object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p"},"spec":{"addresses":["10.0.0.0/30"]}}}"#,
        r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"ns"},"spec":{"type":"LoadBalancer","ports":[{"port":80}]}}}"#,
        format_args!(
            r#"{{"type":"MODIFIED","object":{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"web","namespace":"ns"{annotations}}},"spec":{change}}}}}"#
        ),
        r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"next","namespace":"ns"},"spec":{"type":"LoadBalancer","ports":[{"port":80}]}}}"#,
    );
    // Write 1 gives web its address, write 2 (the clear) fails.
    let options = checked().failures(FailurePlan::every(2));
    let output = replay(&text, &options).unwrap();
    assert_eq!(output.violations, Vec::new());
    let writes: Vec<_> = output
        .trace
        .iter()
        .flat_map(|step| &step.writes)
        .map(|w| (w.key.as_str(), w.outcome))
        .collect();
    assert!(
        writes.contains(&("ns/web", fake_watcher::WriteOutcome::Injected)),
        "{writes:?}"
    );
    let mut all = addresses(&output.result);
    // A ClusterIP Service is not in the result: read its status from the
    // last write instead.
    if !all.contains_key("ns/web") {
        let last = output
            .trace
            .iter()
            .flat_map(|step| &step.writes)
            .rfind(|w| w.key == "ns/web" && w.outcome == fake_watcher::WriteOutcome::Written);
        let ips = last.map(|w| w.ips.iter().map(ToString::to_string).collect());
        all.insert("ns/web".to_owned(), (ips.unwrap_or_default(), None));
    }
    all
}

#[test]
fn a_failed_clear_after_a_class_change_is_retried() {
    let spec = r#"{"type":"LoadBalancer","loadBalancerClass":"other","ports":[{"port":80}]}"#;
    for keep_annotation in [false, true] {
        let all = stop_being_ours_with_a_failed_clear(spec, keep_annotation);
        assert_eq!(
            all.get("ns/web"),
            Some(&(vec![], None)),
            "annotation kept: {keep_annotation}; all: {all:?}"
        );
        assert_eq!(
            all.get("ns/next"),
            Some(&(vec!["10.0.0.0".to_owned()], Some("p".to_owned())))
        );
    }
}

#[test]
fn a_failed_clear_after_a_type_change_is_retried() {
    let spec = r#"{"type":"ClusterIP","ports":[{"port":80}]}"#;
    for keep_annotation in [true, false] {
        let all = stop_being_ours_with_a_failed_clear(spec, keep_annotation);
        assert_eq!(
            all.get("ns/web"),
            Some(&(vec![], None)),
            "annotation kept: {keep_annotation}; all: {all:?}"
        );
    }
}

/// Found by `skipping_settled_services_changes_nothing` (with failed
/// writes): every delete wakes the waiting Services, and one whose write
/// had failed then writes again at once; skipping those the delete could
/// not serve left it to its retry, so its write came after another's.
/// Every wake runs a waiting Service with a failed write
/// (docs/allocation.md §4.6).
#[test]
fn a_wake_runs_a_waiting_service_whose_write_failed() {
    let stream = [
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s3"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/loadBalancerIPs":"10.0.0.0"},"name":"s0"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p0","namespace":"metallb-system"},"spec":{"addresses":["10.0.0.0/30"]}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1"}},"type":"DELETED"}"#,
        r#"{"type":"SYNCED"}"#,
    ]
    .join("\n");
    let plan = FailurePlan::seeded(51_763_141_144_461_721, 30);
    let options = checked().failures(plan);
    let failing = replay(&stream, &options).unwrap();
    let injected: Vec<&str> = failing
        .trace
        .iter()
        .flat_map(|step| &step.writes)
        .filter(|w| w.outcome == fake_watcher::WriteOutcome::Injected)
        .map(|w| w.key.as_str())
        .collect();
    assert_eq!(
        injected,
        ["default/s3", "default/s0"],
        "the plan no longer fails the writes this case is about"
    );
    same_either_way(&stream, &options).unwrap();
}

/// Found by `skipping_settled_services_changes_nothing`: a Service refused
/// the address it asked for waited only for that address to be freed, so
/// when the holder its Warning named left it to another holder, the new
/// holder went unnamed until the address was free; reconciling everything
/// named it at once. A holder leaving the address wakes it
/// (docs/allocation.md §4.6).
#[test]
fn a_holder_leaving_a_requested_address_wakes_the_refused() {
    let stream = [
        r#"{"object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p0","namespace":"metallb-system"},"spec":{"addresses":["10.0.0.2-10.0.0.5","fd00::/126"]}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/allow-shared-ip":"key0"},"name":"s3","namespace":"a"},"spec":{"ports":[{"port":443,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1"},"spec":{"ipFamilyPolicy":"RequireDualStack","ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/loadBalancerIPs":"10.0.0.2,fd00::2"},"name":"s1"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/allow-shared-ip":"key0"},"name":"s0"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s3","namespace":"a"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
    ]
    .join("\n");
    let warnings = events_either_way(&stream, "default/s1");
    assert_eq!(
        warnings.last().map(|(_, message)| message.as_str()),
        Some("Failed to allocate IP for \"default/s1\": 10.0.0.2 cannot be used: it is in use by default/s0")
    );
}

/// Found by `skipping_settled_services_changes_nothing`: a Service refused
/// the address it asked for names a holder of it, and a Service that
/// joins the holders may be the one named now; reconciling everything
/// renamed it at the next delete, skipping did not. Every change of an
/// address's holders is kept for the next wake (docs/allocation.md §4.6).
#[test]
fn a_holder_joining_a_requested_address_wakes_the_refused() {
    let pool = r#"{"type":"ADDED","object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p"},"spec":{"addresses":["10.0.0.0/30"]}}}"#;
    let shared = |name: &str, port: u16| {
        format!(
            r#"{{"type":"ADDED","object":{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}","namespace":"b","annotations":{{"metallb.io/allow-shared-ip":"k"}}}},"spec":{{"type":"LoadBalancer","ports":[{{"port":{port},"protocol":"TCP"}}]}}}}}}"#
        )
    };
    let refused = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"x","namespace":"a","annotations":{"metallb.io/loadBalancerIPs":"10.0.0.0"}},"spec":{"type":"LoadBalancer","ports":[{"port":80,"protocol":"TCP"}]}}}"#;
    let other = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"y","namespace":"c"},"spec":{"type":"LoadBalancer","ports":[{"port":80,"protocol":"TCP"}]}}}"#;
    let delete = r#"{"type":"DELETED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"y","namespace":"c"}}}"#;
    let stream = [
        pool.to_owned(),
        shared("z", 443),
        refused.to_owned(),
        shared("a", 80),
        other.to_owned(),
        delete.to_owned(),
    ]
    .join("\n");
    let warnings = events_either_way(&stream, "a/x");
    let named = |holder: &str| {
        format!(
            "Failed to allocate IP for \"a/x\": 10.0.0.0 cannot be used: it is in use by {holder}"
        )
    };
    assert_eq!(warnings, [(3, named("b/z")), (6, named("b/a"))]);
}

/// Found by `skipping_settled_services_changes_nothing` (40,000 cases): a
/// Service refused the second of the two addresses it asked for waits on
/// the holders of both, for a holder joining the first changes the
/// address its message names (docs/allocation.md §4.9).
#[test]
fn a_holder_joining_an_earlier_requested_address_wakes_the_refused() {
    let pool = r#"{"type":"ADDED","object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p"},"spec":{"addresses":["10.0.4.0/29","fd00::20/127"]}}}"#;
    let service = |namespace: &str, name: &str, extra: &str| {
        format!(
            r#"{{"type":"ADDED","object":{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}","namespace":"{namespace}"{extra}}},"spec":{{"type":"LoadBalancer","ports":[{{"port":80,"protocol":"TCP"}}]}}}}}}"#
        )
    };
    let v6 = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"v6","namespace":"a"},"spec":{"type":"LoadBalancer","ipFamilies":["IPv6"],"ports":[{"port":80,"protocol":"TCP"}]}}}"#;
    let refused = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"x","namespace":"b","annotations":{"metallb.io/loadBalancerIPs":"10.0.4.1,fd00::20"}},"spec":{"type":"LoadBalancer","ipFamilyPolicy":"RequireDualStack","ports":[{"port":80,"protocol":"TCP"}]}}}"#;
    let delete = r#"{"type":"DELETED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"other","namespace":"c"}}}"#;
    let stream = [
        pool.to_owned(),
        service("default", "first", ""),
        service(
            "c",
            "other",
            r#","annotations":{"metallb.io/loadBalancerIPs":"10.0.4.2"}"#,
        ),
        v6.to_owned(),
        refused.to_owned(),
        service("default", "joins", ""),
        delete.to_owned(),
    ]
    .join("\n");
    let warnings = events_either_way(&stream, "b/x");
    let named = |ip: &str, holder: &str| {
        format!("Failed to allocate IP for \"b/x\": {ip} cannot be used: it is in use by {holder}")
    };
    assert_eq!(
        warnings,
        [
            (5, named("fd00::20", "a/v6")),
            (7, named("10.0.4.1", "default/joins"))
        ]
    );
}

/// Found by `skipping_waiting_services_alike_changes_nothing` (with longer
/// streams): `a/s0` and `default/s1` wait alike for an IPv6 address, and
/// `b/s1` joins their sharing key on the one that is held. `default/s1`
/// then leaves (ClusterIP), which wakes the waiting Services, but its write
/// fails: booked waiting until the retry, it stood for its class, and
/// `a/s0` was never run (the exhaustive replay gives it the address).
#[test]
fn a_waker_whose_write_fails_does_not_stand_for_the_others_alike() {
    let stream = [
        r#"{"object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p0","namespace":"metallb-system"},"spec":{"addresses":["10.0.4.0/29","fd00::20/127"]}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1","namespace":"b"},"spec":{"ipFamilies":["IPv6"],"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s3"},"spec":{"ipFamilies":["IPv6"],"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2","namespace":"a"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1"},"spec":{"ipFamilyPolicy":"PreferDualStack","ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/allow-shared-ip":"key0"},"name":"s1"},"spec":{"ports":[{"port":53,"protocol":"UDP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s0"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2","namespace":"a"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/allow-shared-ip":"key0"},"name":"s0","namespace":"a"},"spec":{"ipFamilyPolicy":"PreferDualStack","ports":[{"port":53,"protocol":"UDP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2","namespace":"a"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2","namespace":"a"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2","namespace":"a"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/allow-shared-ip":"key0","metallb.io/ip-allocated-from-pool":"p0"},"name":"s1","namespace":"b"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2","namespace":"a"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"ClusterIP"}},"type":"ADDED"}"#,
    ]
    .join("\n");
    let options = checked().failures(FailurePlan::seeded(2_212_313_503_590_358_000, 30));
    same_either_way(&stream, &options).unwrap();
    let output = replay(&stream, &options).unwrap();
    let a_s0 = output.result.services.iter().find(|s| s.key == "a/s0");
    assert_eq!(
        a_s0.map(|s| s.ips.clone()),
        Some(vec!["10.0.4.4".to_owned(), "fd00::20".to_owned()])
    );
}

/// Found by `skipping_waiting_services_alike_changes_nothing_on_longer_streams`:
/// `default/s0` asks for 10.0.1.0, which `b/s1` holds, and waits with a
/// message naming `b/s1`. The delete of `b/s0` frees an IPv6 address, so
/// `a/s1`, which waited longer, gets it and joins `b/s1` on 10.0.1.0.
/// Reconsidering every waiting Service in order runs `default/s0` after
/// that, and its message names `a/s1` now; the wake had not woken it,
/// since the delete freed nothing it asked for.
#[test]
fn a_holder_that_joins_during_a_wake_renames_the_holder_for_those_after_it() {
    let stream = [
        r#"{"object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p0","namespace":"metallb-system"},"spec":{"addresses":["10.0.1.0/31","fd00::10-fd00::11"]}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1","namespace":"b"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1","namespace":"a"},"spec":{"ipFamilyPolicy":"RequireDualStack","ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s0","namespace":"b"},"spec":{"ipFamilyPolicy":"PreferDualStack","ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/loadBalancerIPs":"10.0.1.0"},"name":"s0"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s3","namespace":"b"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/allow-shared-ip":"key1"},"name":"s1","namespace":"b"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s3","namespace":"b"}},"type":"DELETED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2","namespace":"a"},"spec":{"ipFamilyPolicy":"PreferDualStack","ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/allow-shared-ip":"key1"},"name":"s1","namespace":"a"},"spec":{"ports":[{"port":443,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s0","namespace":"b"}},"type":"DELETED"}"#,
    ]
    .join("\n");
    assert_eq!(
        last_event_either_way(&stream, "default/s0"),
        Some((
            12,
            "Failed to allocate IP for \"default/s0\": 10.0.1.0 cannot be used: it is in use by a/s1".to_owned()
        ))
    );
}

/// The same for those refused a later address they asked for: `h` and `v`
/// ask for 10.0.0.0 and fd00::, and are refused fd00::, so every delete
/// wakes each of them (a Service taking 10.0.0.0 from free changes their
/// message). The delete of `y2` frees fd00::1, which `w`, waiting between
/// them, takes with 10.0.0.0: `h` is run before it and keeps its message,
/// `v` after it and is refused 10.0.0.0 now, as reconsidering every
/// waiting Service in order gives.
#[test]
fn a_take_during_a_wake_renames_the_address_refused_for_those_after_it() {
    let pool = r#"{"type":"ADDED","object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p0"},"spec":{"addresses":["10.0.0.0/32","fd00::/127"]}}}"#;
    let service = |name: &str, spec: &str, annotations: &str| {
        format!(
            r#"{{"type":"ADDED","object":{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}","annotations":{{{annotations}}}}},"spec":{{"type":"LoadBalancer","ports":[{{"port":80,"protocol":"TCP"}}]{spec}}}}}}}"#
        )
    };
    let v6 = r#","ipFamilies":["IPv6"]"#;
    let dual = r#","ipFamilyPolicy":"RequireDualStack""#;
    let asks = r#""metallb.io/loadBalancerIPs":"10.0.0.0,fd00::""#;
    let stream = [
        pool.to_owned(),
        service("y1", v6, ""),
        service("y2", v6, ""),
        service("h", dual, asks),
        service("w", dual, ""),
        service("v", dual, asks),
        r#"{"type":"DELETED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"y2","namespace":"default"}}}"#.to_owned(),
    ]
    .join("\n");
    assert_eq!(
        last_event_either_way(&stream, "default/v"),
        Some((
            7,
            "Failed to allocate IP for \"default/v\": 10.0.0.0 cannot be used: it is in use by default/w".to_owned()
        ))
    );
}

/// Found by the same property once a take during a wake woke those refused
/// the address: `default/s3` now asks for 10.0.0.3, which `b/s0` holds, so
/// it releases it and waits, and the release wakes `a/s2`, which takes
/// 10.0.0.3 beside `b/s0`. `default/s3` woke them: reconsidering the
/// waiting Services does not run it again, so its message still names
/// `b/s0` (the next wake names `a/s2`).
#[test]
fn a_take_during_a_wake_does_not_wake_its_waker() {
    let stream = [
        r#"{"object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p3","namespace":"metallb-system"},"spec":{"addresses":["10.0.0.0/30"]}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s0"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s1","namespace":"a"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s3"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s2"},"spec":{"ipFamilyPolicy":"PreferDualStack","ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"type":"SYNCED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s0"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/allow-shared-ip":"key0"},"name":"s0","namespace":"b"},"spec":{"ports":[{"port":443,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/allow-shared-ip":"key0"},"name":"s3"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"s0"}},"type":"DELETED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/allow-shared-ip":"key0"},"name":"s2","namespace":"a"},"spec":{"ports":[{"port":80,"protocol":"TCP"},{"port":53,"protocol":"UDP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
        r#"{"object":{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"metallb.io/loadBalancerIPs":"10.0.0.3"},"name":"s3"},"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"LoadBalancer"}},"type":"ADDED"}"#,
    ]
    .join("\n");
    assert_eq!(
        last_event_either_way(&stream, "default/s3"),
        Some((
            13,
            "Failed to allocate IP for \"default/s3\": 10.0.0.3 cannot be used: it is in use by b/s0".to_owned()
        ))
    );
}
