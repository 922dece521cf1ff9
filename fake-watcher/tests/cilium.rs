//! Cilium LB-IPAM clusters replayed (docs/cilium.md §6, §8): a recorded
//! Cilium cluster replays with no address changed, its mixed twin (MetalLB
//! pools added by `what-if`) moves no held address, and `--config` takes
//! Cilium pools.

use std::collections::BTreeMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use fake_watcher::{
    load_apply_file, load_config, replay_blocking, what_if, ConfigPool, ReplayOptions, ReplayOutput,
};
use serde_json::Value;

const RECORDED: &str = "tests/streams/c30-recorded-cilium-cluster.jsonl";
const MIXED: &str = "tests/streams/c30-recorded-cilium-cluster-metallb.yaml";

fn path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn replay_text(text: &str, options: &ReplayOptions) -> ReplayOutput {
    replay_blocking("stream.jsonl", text.as_bytes(), options, &mut ()).unwrap()
}

/// The objects of a stream's lines, in order.
fn objects(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|line| line.starts_with('{'))
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|event| event.get("object").cloned())
        .collect()
}

/// `type status reason message` of each condition.
fn condition_texts(conditions: &[Value]) -> Vec<String> {
    conditions
        .iter()
        .map(|c| {
            ["type", "status", "reason", "message"]
                .map(|field| c[field].as_str().unwrap_or_default())
                .join(" ")
        })
        .collect()
}

/// The Service condition `type` in a result's Service, as `status reason`.
fn condition(output: &ReplayOutput, key: &str, condition_type: &str) -> Option<String> {
    let service = output.result.services.iter().find(|s| s.key == key)?;
    let c = service
        .conditions
        .iter()
        .find(|c| c.condition_type == condition_type)?;
    Some(format!("{} {}", c.status, c.reason))
}

#[test]
fn a_recorded_cilium_cluster_replays_with_no_address_changed() {
    let text = std::fs::read_to_string(path(RECORDED)).unwrap();
    let options = ReplayOptions::default().check_invariants(true);
    let output = replay_text(&text, &options);
    assert!(output.violations.is_empty(), "{:?}", output.violations);
    // No ClearAssignment, no IPAllocated, no Warning: nothing happened to
    // any address.
    assert!(
        output.result.events.is_empty(),
        "{:?}",
        output.result.events
    );

    // Every Service keeps the addresses Cilium gave it.
    let recorded: BTreeMap<String, Vec<String>> = objects(&text)
        .iter()
        .filter(|o| o["kind"] == "Service")
        .map(|o| {
            let key = format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            );
            let mut ips: Vec<String> = o["status"]["loadBalancer"]["ingress"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["ip"].as_str().unwrap().to_owned())
                .collect();
            ips.sort();
            (key, ips)
        })
        .collect();
    assert_eq!(recorded.len(), output.result.services.len());
    for service in &output.result.services {
        let mut ips = service.ips.clone();
        ips.sort();
        assert_eq!(Some(&ips), recorded.get(&service.key), "{}", service.key);
        assert_eq!(
            condition(&output, &service.key, "cilium.io/IPAMRequestSatisfied").as_deref(),
            Some("True satisfied"),
            "{}",
            service.key
        );
        assert_eq!(
            condition(&output, &service.key, "metallb.io/AddressAssigned").as_deref(),
            Some("True Assigned"),
            "{}",
            service.key
        );
    }

    // Every pool's conditions, computed, are those Cilium wrote.
    let written: BTreeMap<String, Vec<String>> = objects(&text)
        .iter()
        .filter(|o| o["kind"] == "CiliumLoadBalancerIPPool")
        .map(|o| {
            let conditions = o["status"]["conditions"].as_array().unwrap();
            (
                o["metadata"]["name"].as_str().unwrap().to_owned(),
                condition_texts(conditions),
            )
        })
        .collect();
    let computed: BTreeMap<String, Vec<String>> = output
        .result
        .cilium_pools
        .iter()
        .map(|pool| {
            let conditions = serde_json::to_value(&pool.conditions).unwrap();
            (
                pool.name.clone(),
                condition_texts(conditions.as_array().unwrap()),
            )
        })
        .collect();
    assert_eq!(computed, written);
    assert!(output.result.rejected_pools.is_empty());
}

/// docs/cilium.md §9 step 4: the other kind's pools added in a what-if move
/// no held address (a newer overlapping pool is rejected, and so is a pool
/// whose name a Cilium pool has).
#[test]
fn its_mixed_twin_moves_no_held_address() {
    let stream = std::fs::File::open(path(RECORDED)).unwrap();
    let appended = load_apply_file(&path(MIXED)).unwrap();
    let report = what_if(
        "c30.jsonl",
        BufReader::new(stream),
        &ReplayOptions::default(),
        &appended,
    )
    .unwrap();
    assert!(!report.moves_any(), "{:?}", report.changes);
    assert!(report.changes.is_empty(), "{:?}", report.changes);
    let rejected: Vec<(&str, &str, &str)> = report
        .rejected_pools
        .iter()
        .map(|r| (r.name.as_str(), r.kind.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(
        rejected,
        [
            (
                "lb-pool",
                "IPAddressPool",
                "name \"lb-pool\" is taken by the older CiliumLoadBalancerIPPool \"lb-pool\""
            ),
            (
                "metal-overlap",
                "IPAddressPool",
                "addresses \"192.168.50.0-192.168.50.127\" overlap \"192.168.50.0-192.168.50.255\" \
                 of CiliumLoadBalancerIPPool \"lb-pool\""
            ),
        ]
    );
}

/// docs/cilium.md §4.3 item 4: a dual-stack Service whose addresses lie in
/// two Cilium pools (one pool per family, a common Cilium layout) keeps
/// them at a restart.
#[test]
fn a_dual_stack_service_from_two_cilium_pools_keeps_both_at_restart() {
    let text = r#"{"type":"ADDED","object":{"apiVersion":"cilium.io/v2","kind":"CiliumLoadBalancerIPPool","metadata":{"name":"v4"},"spec":{"blocks":[{"cidr":"192.168.50.0/24"}]}}}
{"type":"ADDED","object":{"apiVersion":"cilium.io/v2","kind":"CiliumLoadBalancerIPPool","metadata":{"name":"v6"},"spec":{"blocks":[{"cidr":"2001:db8:50::/120"}]}}}
{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"dual","namespace":"shop"},"spec":{"type":"LoadBalancer","ipFamilyPolicy":"RequireDualStack","ipFamilies":["IPv4","IPv6"],"ports":[{"port":80}]},"status":{"loadBalancer":{"ingress":[{"ip":"2001:db8:50::5"},{"ip":"192.168.50.5"}]}}}}
{"type":"SYNCED"}
"#;
    let output = replay_text(text, &ReplayOptions::default());
    assert!(
        output.result.events.is_empty(),
        "{:?}",
        output.result.events
    );
    let mut ips = output.result.services[0].ips.clone();
    ips.sort();
    assert_eq!(ips, ["192.168.50.5", "2001:db8:50::5"]);
}

/// `--config` takes Cilium pools beside IPAddressPools (docs/replay.md §2.2).
#[test]
fn config_cilium_pools_serve_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pools.yaml");
    std::fs::write(
        &config,
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumLoadBalancerIPPool\n\
         metadata: {name: blue}\nspec: {blocks: [{cidr: 10.0.0.0/30}], allowFirstLastIPs: \"No\"}\n",
    )
    .unwrap();
    let pools = load_config(&config).unwrap();
    assert!(matches!(pools.as_slice(), [ConfigPool::Cilium(_)]));
    let text = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"shop"},"spec":{"type":"LoadBalancer","ports":[{"port":80}]}}}"#;
    let output = replay_text(text, &ReplayOptions::default().pools(pools));
    // The first address is a reserved end.
    assert_eq!(output.result.services[0].ips, ["10.0.0.1"]);
    assert_eq!(output.result.pools[0].kind, "CiliumLoadBalancerIPPool");
    assert_eq!(output.result.cilium_pools[0].name, "blue");
}

/// `explain` on a Cilium stream: each pool has its kind, and a Cilium
/// selector's mismatch says which labels it saw.
#[test]
fn explain_names_cilium_pools_and_their_selector() {
    let stream =
        std::fs::File::open(path("tests/streams/c13-selector-pseudo-labels.jsonl")).unwrap();
    let document = fake_watcher::explain_stream(
        "c13.jsonl",
        BufReader::new(stream),
        &ReplayOptions::default(),
        "tenant-two/impostor",
        None,
    )
    .unwrap()
    .unwrap();
    let pools: Vec<(&str, &str, &str)> = document
        .pools
        .iter()
        .map(|p| (p.name.as_str(), p.kind.as_str(), p.verdict))
        .collect();
    assert_eq!(
        pools,
        [
            (
                "by-name",
                "CiliumLoadBalancerIPPool",
                "service-selector-mismatch"
            ),
            (
                "red",
                "CiliumLoadBalancerIPPool",
                "service-selector-mismatch"
            ),
            (
                "tenant-one",
                "CiliumLoadBalancerIPPool",
                "service-selector-mismatch"
            ),
        ]
    );
    assert!(document.pools[2]
        .message
        .contains("io.kubernetes.service.namespace"));
}

/// docs/cilium.md §3.3: once addresses are requested through
/// `lbipam.cilium.io/ips`, Cilium gives exactly those, whatever
/// `ipFamilyPolicy` says; a RequireDualStack Service asking for one IPv4
/// address holds it, satisfied, and keeps it at a restart.
#[test]
fn a_cilium_request_ignores_the_family_policy() {
    let text = r#"{"type":"ADDED","object":{"apiVersion":"cilium.io/v2","kind":"CiliumLoadBalancerIPPool","metadata":{"name":"p"},"spec":{"blocks":[{"cidr":"10.0.10.0/24"},{"cidr":"fd00::/120"}]}}}
{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"ns","annotations":{"lbipam.cilium.io/ips":"10.0.10.21"}},"spec":{"type":"LoadBalancer","ipFamilyPolicy":"RequireDualStack","ports":[{"port":80}]},"status":{"loadBalancer":{"ingress":[{"ip":"10.0.10.21"}]}}}}
{"type":"SYNCED"}
"#;
    let output = replay_text(text, &ReplayOptions::default());
    assert!(
        output.result.events.is_empty(),
        "{:?}",
        output.result.events
    );
    assert_eq!(output.result.services[0].ips, ["10.0.10.21"]);
    assert_eq!(
        condition(&output, "ns/a", "cilium.io/IPAMRequestSatisfied").as_deref(),
        Some("True satisfied")
    );
}

/// Keeps the final Services and Cilium pools of a replay, as a cluster
/// would list them.
#[derive(Default)]
struct FinalState {
    services: Vec<Value>,
    cilium_pools: Vec<Value>,
}

impl fake_watcher::Observer for FinalState {
    fn finished(&mut self, plugin: &fake_watcher::Plugin) {
        for (_, service) in plugin.store.services() {
            self.services.push(serde_json::to_value(&*service).unwrap());
        }
        for pool in plugin.store.cilium_pools() {
            let mut object = serde_json::to_value(&*pool).unwrap();
            object["apiVersion"] = "cilium.io/v2".into();
            object["kind"] = "CiliumLoadBalancerIPPool".into();
            self.cilium_pools.push(object);
        }
    }
}

/// `--lb-class` of a stream's `# options:` header line, if any.
fn lb_class_of(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("# options:"))?;
    let mut words = line.split_whitespace();
    words.find(|w| *w == "--lb-class")?;
    words.next().map(str::to_owned)
}

/// The `IPAddressPool`s and Namespaces a stream leaves, in creation order.
fn other_objects(text: &str) -> Vec<Value> {
    let mut objects: Vec<(String, Value)> = Vec::new();
    for line in text.lines().filter(|line| line.starts_with('{')) {
        let event: Value = serde_json::from_str(line).unwrap();
        let object = &event["object"];
        let kind = object["kind"].as_str().unwrap_or_default();
        if kind != "IPAddressPool" && kind != "Namespace" {
            continue;
        }
        let id = format!("{kind}/{}", object["metadata"]["name"]);
        let at = objects.iter().position(|(known, _)| *known == id);
        match (event["type"].as_str(), at) {
            (Some("DELETED"), Some(at)) => {
                objects.remove(at);
            }
            (Some("DELETED"), None) => {}
            (_, Some(at)) => objects[at].1 = object.clone(),
            (_, None) => objects.push((id, object.clone())),
        }
    }
    objects.into_iter().map(|(_, object)| object).collect()
}

/// docs/cilium.md §3.7, allocation.md §4.5: restarting on the cluster each
/// Cilium corpus stream leaves (every object listed, then SYNCED) keeps
/// every address a Service holds.
#[test]
fn a_restart_after_each_cilium_stream_keeps_every_address() {
    let dir = path("tests/streams");
    let mut streams: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with('c') && name.ends_with(".jsonl")
        })
        .collect();
    streams.sort();
    assert!(streams.len() >= 20, "{streams:?}");
    let mut failures = Vec::new();
    for stream in streams {
        let text = std::fs::read_to_string(&stream).unwrap();
        let mut options = ReplayOptions::default();
        if let Some(class) = lb_class_of(&text) {
            options = options.lb_class(class);
        }
        let mut state = FinalState::default();
        let before =
            replay_blocking("before.jsonl", text.as_bytes(), &options, &mut state).unwrap();
        let mut lines: Vec<String> = Vec::new();
        let objects = other_objects(&text)
            .into_iter()
            .chain(state.cilium_pools)
            .chain(state.services);
        for object in objects {
            lines.push(serde_json::json!({"type": "ADDED", "object": object}).to_string());
        }
        lines.push(r#"{"type":"SYNCED"}"#.to_owned());
        let restart = lines.join("\n");
        let after = replay_text(&restart, &options.clone().check_invariants(true));
        assert!(after.violations.is_empty(), "{:?}", after.violations);
        let name = stream.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            before.result.services.len(),
            after.result.services.len(),
            "{name}"
        );
        for service in &before.result.services {
            let now = after.result.services.iter().find(|s| s.key == service.key);
            // Kept from the status, not given anew (no IPAllocated).
            let given_anew = after
                .result
                .events
                .iter()
                .any(|e| e.key == service.key && e.reason == "IPAllocated");
            let kept = now.is_some_and(|now| {
                let (mut was, mut is) = (service.ips.clone(), now.ips.clone());
                was.sort();
                is.sort();
                was.is_empty() || (was == is && !given_anew)
            });
            if !kept {
                failures.push(format!(
                    "{name}: {} held {:?}, after a restart {:?}",
                    service.key,
                    service.ips,
                    now.map(|now| &now.ips)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
