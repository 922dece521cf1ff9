//! Bad input (docs/allocation.md §4.8, docs/replay.md §1): each kind of bad line or bad
//! value gets a precise error — a stream error naming the file, line and
//! reason, an Event on the Service, or a rejected pool with its reason — and
//! nothing else in the same stream is disturbed: the bystanders (a good
//! pool, a Service before the bad line and one after it) end exactly as in
//! the stream without the bad line.

use fake_watcher::{
    render_json, replay_blocking, EventRecord, RejectedPoolResult, ReplayError, ReplayOptions,
    ReplayOutput, ReplayResult, ServiceResult,
};
use serde_json::{json, Value};

const FILE: &str = "bad.jsonl";

fn pool(name: &str, spec: Value) -> String {
    json!({"type": "ADDED", "object": {
        "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": name, "namespace": "metallb-system"}, "spec": spec}})
    .to_string()
}

fn pool_of(name: &str, addresses: &[&str]) -> String {
    pool(name, json!({ "addresses": addresses }))
}

/// A LoadBalancer Service `ns/NAME` with `annotations` and more `spec`.
fn lb(name: &str, annotations: Value, spec: Value) -> String {
    let mut object = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
    });
    if let (Some(extra), Some(target)) = (spec.as_object(), object["spec"].as_object_mut()) {
        for (key, value) in extra {
            target.insert(key.clone(), value.clone());
        }
    }
    json!({"type": "ADDED", "object": object}).to_string()
}

fn plain(name: &str) -> String {
    lb(name, json!({}), json!({}))
}

fn text(lines: &[String]) -> String {
    lines.iter().map(|line| format!("{line}\n")).collect()
}

fn replay(lines: &[String], options: &ReplayOptions) -> Result<ReplayOutput, ReplayError> {
    let options = options.clone().check_invariants(true).trace(true);
    let output = replay_blocking(FILE, text(lines).as_bytes(), &options, &mut ())?;
    assert_eq!(output.violations, Vec::new(), "invariants broken");
    let errors: Vec<&String> = output.trace.iter().flat_map(|s| &s.errors).collect();
    assert!(errors.is_empty(), "handlers failed: {errors:?}");
    Ok(output)
}

/// A Service holding `ips` from `pool`, with the condition the controller
/// writes on a Service that holds addresses.
fn service(key: &str, ips: &[&str], pool: Option<&str>) -> ServiceResult {
    let quoted: Vec<String> = ips.iter().map(|ip| format!("{ip:?}")).collect();
    serde_json::from_value(json!({
        "key": key,
        "ips": ips,
        "pool": pool,
        "conditions": [{
            "type": "metallb.io/AddressAssigned",
            "status": "True",
            "reason": "Assigned",
            "message": format!("Assigned IP [{}]", quoted.join(" ")),
        }],
    }))
    .unwrap()
}

fn events_of<'a>(result: &'a ReplayResult, key: &str) -> Vec<(&'a str, &'a str)> {
    result
        .events
        .iter()
        .filter(|e| e.key == key)
        .map(|e: &EventRecord| (e.reason.as_str(), e.message.as_str()))
        .collect()
}

/// The result's entry for `key`.
fn service_of(result: &ReplayResult, key: &str) -> Option<ServiceResult> {
    result.services.iter().find(|s| s.key == key).cloned()
}

/// The good pool, `ns/before`, the bad line, `ns/after`.
fn around(bad: String) -> Vec<String> {
    vec![
        pool_of("good", &["10.0.0.0/30", "fd00::/126"]),
        plain("before"),
        bad,
        plain("after"),
    ]
}

/// What the bystanders get when nothing disturbs them.
fn undisturbed(result: &ReplayResult) {
    let find = |key: &str| service_of(result, key);
    assert_eq!(
        find("ns/before"),
        Some(service("ns/before", &["10.0.0.0"], Some("good")))
    );
    assert_eq!(
        find("ns/after"),
        Some(service("ns/after", &["10.0.0.1"], Some("good")))
    );
    assert_eq!(result.pools.len(), 1, "{:?}", result.pools);
    assert_eq!(result.pools[0].name, "good");
}

/// A line that stops the replay with `FILE:3: reason`; with `--keep-going`
/// it is skipped with the same error and the rest is as without it.
fn assert_line_error(bad: String, reason: &str) {
    let lines = around(bad);
    let error = replay(&lines, &ReplayOptions::default()).unwrap_err();
    assert_eq!(error.to_string(), format!("{FILE}:3: {reason}"));
    let ReplayError::Stream(stream) = &error else {
        panic!("not a stream error: {error:?}");
    };
    assert_eq!(stream.line, 3);
    let kept = replay(&lines, &ReplayOptions::default().keep_going(true)).unwrap();
    let skipped: Vec<String> = kept.skipped.iter().map(ToString::to_string).collect();
    assert_eq!(skipped, [format!("{FILE}:3: {reason}")]);
    // The bad line made a comment, so that the Events' lines are the same.
    let mut without = lines.clone();
    without[2] = "# the bad line".to_owned();
    let clean = replay(&without, &ReplayOptions::default()).unwrap();
    assert_eq!(kept.result, clean.result);
    undisturbed(&kept.result);
}

/// A Service whose request is bad: it gets exactly `events` and no address;
/// the bystanders are undisturbed.
fn assert_service_events(bad: String, key: &str, events: &[(&str, &str)]) {
    let output = replay(&around(bad), &ReplayOptions::default()).unwrap();
    assert_eq!(events_of(&output.result, key), events);
    let found = output.result.services.iter().find(|s| s.key == key);
    let found = found.unwrap_or_else(|| panic!("{key} is missing"));
    assert!(found.ips.is_empty() && found.pool.is_none(), "{found:?}");
    // Not assigned, and the condition says so.
    let statuses: Vec<&str> = found.conditions.iter().map(|c| c.status.as_str()).collect();
    assert_eq!(statuses, ["False"]);
    undisturbed(&output.result);
}

/// A pool that is rejected with `reason`; the good pool and the Services
/// are undisturbed.
fn assert_rejected(bad: String, name: &str, reason: &str) {
    let output = replay(&around(bad), &ReplayOptions::default()).unwrap();
    assert_eq!(
        output.result.rejected_pools,
        [RejectedPoolResult {
            name: name.to_owned(),
            kind: "IPAddressPool".to_owned(),
            reason: reason.to_owned()
        }]
    );
    undisturbed(&output.result);
}

// ----- lines the stream cannot use -----

#[test]
fn invalid_json() {
    assert_line_error(
        "{\"type\": \"ADDED\", object: {}}".to_owned(),
        "not JSON: key must be a string at column 19",
    );
    assert_line_error(
        "not json".to_owned(),
        "not JSON: expected ident at column 2",
    );
    assert_line_error(
        "{\"type\":\"ADDED\"}}".to_owned(),
        "not JSON: trailing characters at column 17",
    );
}

#[test]
fn invalid_utf8() {
    let mut bytes = b"{\"type\":\"ADDED\",\"object\":\"caf".to_vec();
    bytes.extend_from_slice(&[0xe9, b'"', b'}']);
    let bad = String::from_utf8_lossy(&bytes).into_owned();
    // A lossy copy is valid UTF-8: write the raw bytes instead.
    let lines = around(bad);
    let mut raw = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        if n == 2 {
            raw.extend_from_slice(&bytes);
        } else {
            raw.extend_from_slice(line.as_bytes());
        }
        raw.push(b'\n');
    }
    let error = replay_blocking(FILE, raw.as_slice(), &ReplayOptions::default(), &mut ())
        .unwrap_err()
        .to_string();
    assert_eq!(error, format!("{FILE}:3: not valid UTF-8 (at byte 29)"));
    let options = ReplayOptions::default().keep_going(true);
    let kept = replay_blocking(FILE, raw.as_slice(), &options, &mut ()).unwrap();
    assert_eq!(kept.skipped.len(), 1);
    undisturbed(&kept.result);
}

#[test]
fn unknown_event_type() {
    let object = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}});
    assert_line_error(
        json!({"type": "ADDDED", "object": object}).to_string(),
        "unknown event type \"ADDDED\"",
    );
    assert_line_error(
        json!({"type": "added", "object": object}).to_string(),
        "unknown event type \"added\"",
    );
    assert_line_error(
        json!({"object": object}).to_string(),
        "event has no \"type\"",
    );
    assert_line_error(
        json!({"type": ["ADDED"], "object": object}).to_string(),
        "event \"type\" is not a string",
    );
}

#[test]
fn objects_of_the_wrong_shape() {
    let service = |spec: Value| {
        json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "ns"}, "spec": spec}})
        .to_string()
    };
    assert_line_error(
        service(json!({"type": "LoadBalancer", "ports": "80"})),
        "Service \"ns/web\" does not decode: spec.ports: invalid type: string \"80\", \
         expected a sequence",
    );
    assert_line_error(
        service(json!({"type": "LoadBalancer", "ports": [{"port": "http"}]})),
        "Service \"ns/web\" does not decode: spec.ports[0].port: invalid type: string \
         \"http\", expected i32",
    );
    assert_line_error(
        json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "annotations": {"metallb.io/loadBalancerIPs": 5}}}})
        .to_string(),
        "Service \"default/web\" does not decode: metadata.annotations.metallb.io/loadBalancerIPs: \
         invalid type: integer `5`, expected a string",
    );
    assert_line_error(
        pool("p", json!({"addresses": "10.0.0.0/24"})),
        "IPAddressPool \"p\" does not decode: spec.addresses: invalid type: string \
         \"10.0.0.0/24\", expected a sequence",
    );
    assert_line_error(
        pool(
            "p",
            json!({"addresses": ["10.1.0.0/24"], "autoAssign": "yes"}),
        ),
        "IPAddressPool \"p\" does not decode: spec.autoAssign: invalid type: string \"yes\", \
         expected a boolean",
    );
    assert_line_error(
        json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "ns", "labels": ["env=prod"]}}})
        .to_string(),
        "Namespace \"ns\" does not decode: metadata.labels: invalid type: sequence, \
         expected a map",
    );
    assert_line_error(
        json!({"type": "MODIFIED", "object": "Service"}).to_string(),
        "event \"object\" is not a JSON object",
    );
    assert_line_error(
        json!({"type": "ADDED", "object": {"kind": "Service", "metadata": {"name": "x"}}})
            .to_string(),
        "object has no \"apiVersion\" string",
    );
}

#[test]
fn a_service_without_a_name_is_an_error() {
    let without = |metadata: Value| {
        json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Service",
               "metadata": metadata, "spec": {"type": "LoadBalancer"}}})
        .to_string()
    };
    assert_line_error(
        without(json!({"namespace": "ns"})),
        "Service has no metadata.name",
    );
    assert_line_error(
        without(json!({"name": "", "namespace": "ns"})),
        "Service has no metadata.name",
    );
    assert_line_error(
        json!({"type": "DELETED", "object": {"apiVersion": "v1", "kind": "Service",
               "metadata": {"namespace": "ns"}}})
        .to_string(),
        "Service has no metadata.name",
    );
}

#[test]
fn a_service_without_a_namespace_is_in_default() {
    let bad = json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 443}]}}})
    .to_string();
    let empty = json!({"type": "MODIFIED", "object": {"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "", "labels": {"v": "2"}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 443}]}}})
    .to_string();
    let mut lines = around(bad);
    lines.push(empty);
    let output = replay(&lines, &ReplayOptions::default()).unwrap();
    let keys: Vec<&ServiceResult> = output.result.services.iter().collect();
    assert_eq!(
        keys,
        [
            &service("default/web", &["10.0.0.1"], Some("good")),
            &service("ns/after", &["10.0.0.2"], Some("good")),
            &service("ns/before", &["10.0.0.0"], Some("good")),
        ]
    );
}

// ----- values the controller refuses -----

#[test]
fn requested_addresses_that_do_not_parse() {
    for value in ["10.0.0.300", "10.0.0.1,", "ten.zero.zero.one"] {
        let bad = lb(
            "bad",
            json!({ "metallb.io/loadBalancerIPs": value }),
            json!({}),
        );
        let part = value.split(',').nth(1).map_or(value, str::trim);
        let message = format!(
            "invalid request: the loadBalancerIPs annotation: {part:?} is not an IP address"
        );
        assert_service_events(bad, "ns/bad", &[("LoadBalancerFailed", &message)]);
    }
    let bad = lb("bad", json!({}), json!({"loadBalancerIP": "10.0.0.x"}));
    assert_service_events(
        bad,
        "ns/bad",
        &[(
            "LoadBalancerFailed",
            "invalid request: spec.loadBalancerIP: \"10.0.0.x\" is not an IP address",
        )],
    );
}

#[test]
fn requested_addresses_of_the_wrong_family() {
    let bad = lb(
        "bad",
        json!({"metallb.io/loadBalancerIPs": "fd00::1"}),
        json!({}),
    );
    assert_service_events(
        bad,
        "ns/bad",
        &[(
            "AllocationFailed",
            "Failed to allocate IP for \"ns/bad\": addresses [fd00::1] do not match the \
             service's IP families (single-stack IPv4)",
        )],
    );
    // A dual-stack Service must ask for one address of each family.
    let bad = lb(
        "bad",
        json!({"metallb.io/loadBalancerIPs": "10.0.0.3"}),
        json!({"ipFamilyPolicy": "RequireDualStack"}),
    );
    assert_service_events(
        bad,
        "ns/bad",
        &[(
            "AllocationFailed",
            "Failed to allocate IP for \"ns/bad\": addresses [10.0.0.3] do not match the \
             service's IP families (dual-stack (required))",
        )],
    );
}

#[test]
fn three_requested_addresses() {
    let bad = lb(
        "bad",
        json!({"metallb.io/loadBalancerIPs": "10.0.0.2, fd00::2, 10.0.0.3"}),
        json!({"ipFamilyPolicy": "RequireDualStack"}),
    );
    assert_service_events(
        bad,
        "ns/bad",
        &[(
            "LoadBalancerFailed",
            "invalid request: the loadBalancerIPs annotation: more than one IPv4 address",
        )],
    );
}

#[test]
fn requested_addresses_with_a_zone_or_a_port() {
    for (value, spec) in [
        ("fd00::1%eth0", json!({"ipFamilies": ["IPv6"]})),
        ("10.0.0.2:80", json!({})),
        ("[fd00::1]:80", json!({"ipFamilies": ["IPv6"]})),
        ("10.0.0.0/30", json!({})),
    ] {
        let bad = lb("bad", json!({ "metallb.io/loadBalancerIPs": value }), spec);
        let message = format!(
            "invalid request: the loadBalancerIPs annotation: {value:?} is not an IP address"
        );
        assert_service_events(bad, "ns/bad", &[("LoadBalancerFailed", &message)]);
    }
}

#[test]
fn a_status_address_that_does_not_parse_is_cleared() {
    let mut line: Value = serde_json::from_str(&plain("bad")).unwrap();
    line["object"]["status"] = json!({"loadBalancer": {"ingress": [{"ip": "not-an-ip"}]}});
    let output = replay(&around(line.to_string()), &ReplayOptions::default()).unwrap();
    assert_eq!(
        events_of(&output.result, "ns/bad"),
        [
            (
                "ClearAssignment",
                "current IP [\"not-an-ip\"] not allowed by config, clearing: status address \
                 \"not-an-ip\" is not an IP address"
            ),
            ("IPAllocated", "Assigned IP [\"10.0.0.1\"]"),
        ]
    );
    let find = |key: &str| service_of(&output.result, key);
    assert_eq!(
        find("ns/bad"),
        Some(service("ns/bad", &["10.0.0.1"], Some("good")))
    );
    assert_eq!(
        find("ns/after"),
        Some(service("ns/after", &["10.0.0.2"], Some("good")))
    );
}

// ----- pools -----

#[test]
fn a_reversed_range() {
    assert_rejected(
        pool_of("bad", &["10.1.0.5-10.1.0.1"]),
        "bad",
        "range 10.1.0.5-10.1.0.1: first address is after the last",
    );
    assert_rejected(
        pool_of("bad", &["10.0.0.5-10.0.0.1"]),
        "bad",
        "range 10.0.0.5-10.0.0.1: first address is after the last",
    );
}

#[test]
fn a_prefix_too_long() {
    assert_rejected(
        pool_of("bad", &["10.1.0.0/33"]),
        "bad",
        "address \"10.1.0.0/33\": not a valid prefix",
    );
    assert_rejected(
        pool_of("bad", &["fd01::/129"]),
        "bad",
        "address \"fd01::/129\": not a valid prefix",
    );
}

#[test]
fn an_empty_pool() {
    assert_rejected(pool_of("bad", &[]), "bad", "spec.addresses is empty");
    assert_rejected(pool("bad", json!({})), "bad", "spec.addresses is empty");
    assert_rejected(
        pool_of("bad", &["  "]),
        "bad",
        "address \"  \": empty entry",
    );
}

#[test]
fn a_selector_with_an_unknown_operator() {
    let spec = json!({"addresses": ["10.1.0.0/30"], "serviceAllocation": {
        "namespaceSelectors": [{"matchExpressions": [
            {"key": "env", "operator": "Like", "values": ["prod"]}]}]}});
    assert_rejected(
        pool("bad", spec),
        "bad",
        "serviceAllocation.namespaceSelectors[0]: unknown operator \"Like\" for key \"env\"",
    );
    let spec = json!({"addresses": ["10.1.0.0/30"], "serviceAllocation": {
        "serviceSelectors": [{"matchLabels": {"app": "web"}},
                             {"matchExpressions": [{"key": "app", "operator": "in",
                                                    "values": ["web"]}]}]}});
    assert_rejected(
        pool("bad", spec),
        "bad",
        "serviceAllocation.serviceSelectors[1]: unknown operator \"in\" for key \"app\"",
    );
}

#[test]
fn a_pool_overlapping_an_older_one() {
    assert_rejected(
        pool_of("bad", &["10.0.0.2-10.0.0.9"]),
        "bad",
        "addresses \"10.0.0.2-10.0.0.9\" overlap \"10.0.0.0-10.0.0.3\" of pool \"good\"",
    );
}

/// `::/0` (2^128 addresses) and a /32 (2^96): accepted, counted exactly,
/// and allocated from at once.
#[test]
fn huge_ipv6_ranges() {
    for (entry, total) in [
        ("::/0", "340282366920938463463374607431768211456"),
        (
            "fd00::-fd00::ffff:ffff:ffff:ffff:ffff:ffff",
            "79228162514264337593543950336",
        ),
    ] {
        let lines = vec![
            pool_of("good", &["10.0.0.0/30"]),
            pool_of("huge", &[entry]),
            plain("before"),
            lb("v6", json!({}), json!({"ipFamilies": ["IPv6"]})),
            lb(
                "dual",
                json!({}),
                json!({"ipFamilyPolicy": "PreferDualStack"}),
            ),
            plain("after"),
        ];
        let started = std::time::Instant::now();
        let output = replay(&lines, &ReplayOptions::default()).unwrap();
        assert!(started.elapsed().as_secs() < 10, "{entry}: too slow");
        let first = if entry == "::/0" { "::" } else { "fd00::" };
        assert_eq!(
            output.result.services,
            [
                service("ns/after", &["10.0.0.2"], Some("good")),
                service("ns/before", &["10.0.0.0"], Some("good")),
                // good has no IPv6: PreferDualStack takes IPv4 from good.
                service("ns/dual", &["10.0.0.1"], Some("good")),
                service("ns/v6", &[first], Some("huge")),
            ],
            "{entry}"
        );
        let json = render_json(&output.result).unwrap();
        assert!(
            json.contains(&format!("\"total\": \"{total}\"")),
            "{entry}: {json}"
        );
        assert!(output.result.rejected_pools.is_empty());
    }
}

// ----- sizes -----

/// A 10 MB line that is a valid Service (a huge annotation) is just a
/// Service; a 10 MB line that is not JSON is an error at its line.
#[test]
fn a_ten_megabyte_line() {
    let blob = "x".repeat(10 << 20);
    let big = lb("big", json!({ "example.com/blob": blob }), json!({}));
    assert!(big.len() > 10 << 20);
    let output = replay(&around(big), &ReplayOptions::default()).unwrap();
    let find = |key: &str| service_of(&output.result, key);
    assert_eq!(
        find("ns/big"),
        Some(service("ns/big", &["10.0.0.1"], Some("good")))
    );
    assert_eq!(
        find("ns/after"),
        Some(service("ns/after", &["10.0.0.2"], Some("good")))
    );

    // Cut before its end: not JSON.
    let cut = format!("{{\"type\":\"ADDED\",\"object\":{{\"blob\":\"{blob}");
    let column = cut.len();
    assert_line_error(
        cut,
        &format!("not JSON: EOF while parsing a string at column {column}"),
    );

    // Past a smaller limit: an error as soon as the limit is passed; where
    // the line ends is unknown, so the replay stops even with --keep-going.
    let big = lb("big", json!({ "example.com/blob": blob }), json!({}));
    let options = ReplayOptions {
        max_line_bytes: 1 << 20,
        ..ReplayOptions::default()
    };
    let lines = around(big);
    let error = replay(&lines, &options).unwrap_err().to_string();
    assert_eq!(
        error,
        format!("{FILE}:3: line is longer than 1048576 bytes")
    );
    let error = replay(&lines, &options.clone().keep_going(true)).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("{FILE}:3: line is longer than 1048576 bytes")
    );
}

/// A huge requested address is refused like any other that does not parse.
#[test]
fn a_ten_megabyte_requested_address() {
    let blob = "1".repeat(10 << 20);
    let bad = lb(
        "bad",
        json!({ "metallb.io/loadBalancerIPs": blob }),
        json!({}),
    );
    let output = replay(&around(bad), &ReplayOptions::default()).unwrap();
    let events = events_of(&output.result, "ns/bad");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, "LoadBalancerFailed");
    assert!(events[0]
        .1
        .starts_with("invalid request: the loadBalancerIPs annotation: \"1111"));
    undisturbed(&output.result);
}

#[test]
fn a_stream_of_only_comments() {
    let text = "# a recorded cluster with nothing in it\n\n   # indented\n\t\n#\n";
    let output =
        replay_blocking(FILE, text.as_bytes(), &ReplayOptions::default(), &mut ()).unwrap();
    assert_eq!(output.result, ReplayResult::default());
    assert_eq!(
        render_json(&output.result).unwrap(),
        "{\n  \"services\": [],\n  \"events\": [],\n  \"pools\": [],\n  \"rejected_pools\": [],\n  \"cilium_pools\": []\n}\n"
    );
    let empty = replay_blocking(FILE, &b""[..], &ReplayOptions::default(), &mut ()).unwrap();
    assert_eq!(empty.result, ReplayResult::default());
}

// ----- events the store makes sense of -----

/// Duplicates, out-of-order events and deletes of unknown objects are no
/// errors: the store behaves as an API server (docs/replay.md §1.2).
#[test]
fn duplicate_and_out_of_order_events() {
    let modified_first = plain("early").replace("\"ADDED\"", "\"MODIFIED\"");
    let delete_unknown = json!({"type": "DELETED", "object": {"apiVersion": "v1",
        "kind": "Service", "metadata": {"name": "ghost", "namespace": "ns"}}})
    .to_string();
    let delete_unknown_pool = json!({"type": "DELETED", "object": {
        "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": "ghost"}}})
    .to_string();
    let lines = vec![
        pool_of("good", &["10.0.0.0/30", "fd00::/126"]),
        plain("before"),
        plain("before"),
        modified_first,
        delete_unknown,
        delete_unknown_pool,
        pool_of("good", &["10.0.0.0/30", "fd00::/126"]),
        plain("after"),
    ];
    let output = replay(&lines, &ReplayOptions::default()).unwrap();
    assert_eq!(
        output.result.services,
        [
            service("ns/after", &["10.0.0.2"], Some("good")),
            service("ns/before", &["10.0.0.0"], Some("good")),
            service("ns/early", &["10.0.0.1"], Some("good")),
        ]
    );
    // Nothing is announced twice.
    let reasons: Vec<(&str, &str)> = output
        .result
        .events
        .iter()
        .map(|e| (e.key.as_str(), e.reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("ns/before", "IPAllocated"),
            ("ns/early", "IPAllocated"),
            ("ns/after", "IPAllocated"),
        ]
    );
}

/// Lines that look like a known mistake say so, and what to do.
#[test]
fn known_mistakes_get_a_hint() {
    const PRETTY: &str = " (this looks like pretty-printed JSON: a stream has one event per \
                          line; compact it with jq -c)";
    const YAML: &str = " (this looks like YAML: a stream is JSON, one event per line; get \
                        the objects with -o json and convert them as docs/replay.md §4 shows)";
    // Pretty-printed JSON (kubectl get -o json, jq .): each line of it.
    assert_line_error(
        "{".to_owned(),
        &format!("not JSON: EOF while parsing an object at column 1{PRETTY}"),
    );
    assert_line_error(
        "    \"apiVersion\": \"v1\",".to_owned(),
        &format!("not JSON: trailing characters at column 17{PRETTY}"),
    );
    assert_line_error(
        "  },".to_owned(),
        &format!("not JSON: expected value at column 3{PRETTY}"),
    );
    // YAML (kubectl get -o yaml).
    assert_line_error(
        "apiVersion: v1".to_owned(),
        &format!("not JSON: expected value at column 1{YAML}"),
    );
    assert_line_error(
        "- name: web".to_owned(),
        &format!("not JSON: invalid number at column 2{YAML}"),
    );
    assert_line_error(
        "---".to_owned(),
        &format!("not JSON: invalid number at column 2{YAML}"),
    );
    // An object without the watch event around it.
    assert_line_error(
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}}).to_string(),
        "event has no \"type\": this is a bare Service object, not a watch event; wrap each \
         object in one: jq -c '{type: \"ADDED\", object: .}' (docs/replay.md §4)",
    );
    // A List, compacted but not split.
    assert_line_error(
        json!({"apiVersion": "v1", "kind": "List", "items": [], "metadata": {}}).to_string(),
        "event has no \"type\": this is a List, as kubectl get -o json prints it, not a watch \
         event; make one event of each item: jq -c '.items[] | {type: \"ADDED\", object: .}' \
         (docs/replay.md §4)",
    );
    // Not every broken line is one of those.
    assert_line_error(
        "{\"type\": \"ADDED\", \"obj".to_owned(),
        "not JSON: EOF while parsing a string at column 22",
    );
    assert_line_error(json!({"object": {}}).to_string(), "event has no \"type\"");
}
