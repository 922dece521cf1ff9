//! Fuzz findings as ordinary tests: every input saved under
//! `tests/fuzz_regressions/<target>/` (a crash or a slow input the fuzzer
//! found, named after what it shows) and every seed of `fuzz/corpus/<target>/`
//! runs through the very checks the cargo-fuzz target runs
//! (`fuzz_regressions/checks.rs`), so CI needs no fuzzer. See fuzz/README.md.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

mod checks;

/// The files of `dir`, sorted (none if it does not exist).
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|path| path.is_file())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// Runs every saved input of `target` through `check`.
fn run(target: &str, check: fn(&[u8])) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dirs = [
        manifest.join("tests/fuzz_regressions").join(target),
        manifest.join("../fuzz/corpus").join(target),
    ];
    let mut ran = 0;
    let mut failed = Vec::new();
    for path in dirs.iter().flat_map(|dir| inputs(dir)) {
        let data = std::fs::read(&path).unwrap();
        ran += 1;
        if catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
            failed.push(path.display().to_string());
        }
    }
    assert!(ran > 0, "no input for fuzz target {target}");
    assert!(failed.is_empty(), "inputs that fail: {failed:#?}");
}

#[test]
fn decode_line() {
    run("decode_line", checks::decode_line);
}

#[test]
fn pool_spec() {
    run("pool_spec", checks::pool_spec);
}

#[test]
fn legacy_config() {
    run("legacy_config", checks::legacy_config);
}

#[test]
fn allocator_ops() {
    run("allocator_ops", checks::allocator_ops);
}

#[test]
fn replay_stream() {
    run("replay_stream", checks::replay_stream);
}

// ----- bugs the fuzzer found -----

/// `decode_line` found that a Service named `web/` decodes. An API server
/// refuses such a name (a name or namespace never holds a `/`), and here
/// it makes keys ambiguous: `x` / `a/b` and `x/a` / `b` are both
/// `x/a/b`, so the second Service silently replaces the first.
#[test]
fn a_name_with_a_slash_is_refused() {
    let found = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz_regressions/decode_line/service-name-with-a-slash");
    let line = std::fs::read_to_string(found).unwrap();
    let error = fake_watcher::decode_event(line.trim_end()).unwrap_err();
    assert!(error.to_string().contains("metadata.name"), "{error}");

    let stream = concat!(
        r#"{"type":"ADDED","object":{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{"name":"p"},"spec":{"addresses":["10.0.0.0/30"]}}}"#,
        "\n",
        r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"a/b","namespace":"x"},"spec":{"type":"LoadBalancer"}}}"#,
        "\n",
        r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"b","namespace":"x/a"},"spec":{"type":"LoadBalancer"}}}"#,
        "\n",
    );
    let options = fake_watcher::ReplayOptions::default().keep_going(true);
    let output =
        fake_watcher::replay_blocking("s.jsonl", stream.as_bytes(), &options, &mut ()).unwrap();
    let skipped: Vec<(u64, String)> = output
        .skipped
        .iter()
        .map(|e| (e.line, e.to_string()))
        .collect();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert!(skipped[0].1.contains("metadata.name"), "{skipped:?}");
    assert!(skipped[1].1.contains("metadata.namespace"), "{skipped:?}");
    assert_eq!(output.result.services, []);
}

/// `allocator_ops` found that the same calls can give different answers:
/// after a pool change rebuilds the allocator's state (in `HashMap` order),
/// the holders of a shared address are listed in a random order, and a
/// refusal names whichever comes first. In a replay that is an
/// `AllocationFailed` (or `ClearAssignment`) message that differs from run
/// to run: two replays of one stream are not byte-identical (docs/allocation.md §6).
#[test]
fn a_refusal_on_a_shared_address_names_the_same_holder_every_time() {
    let pool = |auto_assign: bool| {
        format!(
            r#"{{"type":"ADDED","object":{{"apiVersion":"metallb.io/v1beta1","kind":"IPAddressPool","metadata":{{"name":"p"}},"spec":{{"addresses":["10.0.0.0/30"],"autoAssign":{auto_assign}}}}}}}"#
        )
    };
    let shared = |name: &str, port: u16| {
        format!(
            r#"{{"type":"ADDED","object":{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}","namespace":"ns","annotations":{{"metallb.io/allow-shared-ip":"k"}}}},"spec":{{"type":"LoadBalancer","ports":[{{"port":{port}}}]}}}}}}"#
        )
    };
    let stream = [
        pool(true),
        shared("a", 80),
        shared("b", 443),
        shared("c", 53),
        pool(false),
        r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"d","namespace":"ns","annotations":{"metallb.io/loadBalancerIPs":"10.0.0.0"}},"spec":{"type":"LoadBalancer","ports":[{"port":80}]}}}"#.to_owned(),
    ]
    .join("\n");
    let messages: std::collections::BTreeSet<String> = (0..16)
        .map(|_| {
            let output = fake_watcher::replay_blocking(
                "s.jsonl",
                stream.as_bytes(),
                &fake_watcher::ReplayOptions::default(),
                &mut (),
            )
            .unwrap();
            fake_watcher::render_json(&output.result).unwrap()
        })
        .collect();
    assert_eq!(messages.len(), 1, "{messages:#?}");

    // The fuzzer's input, on the allocator alone.
    let found = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz_regressions/fixed_bugs/allocator_ops-holder-order");
    let data = std::fs::read(found).unwrap();
    let answers = checks::allocator_answers(&data);
    for _ in 0..32 {
        assert_eq!(checks::allocator_answers(&data), answers);
    }
}

/// `allocator_ops` found that `Allocator::complete_dual_stack` re-holds a
/// Service's address under the request it is given without checking that
/// the held address still fits it: with another sharing key, the shared
/// address ends up held under two keys (`check_invariants` fails). The
/// controller only calls it after `keep` succeeded with the same request,
/// so a replay does not reach it; the allocator's own API does (docs/allocation.md
/// §4.8: no input may corrupt the allocator).
#[test]
fn completing_a_dual_stack_service_checks_its_held_address() {
    use allocator::spec::IPAddressPoolSpec;
    use allocator::{
        Allocator, Family, FamilyPolicy, Port, Protocol, Request, SharingNamespaces, SharingRule,
        Subject,
    };

    let labels = std::collections::BTreeMap::new();
    let request =
        |key: &'static str, sharing: &'static str, ports: &'static [Port], families| Request {
            key,
            subject: Subject {
                name: key,
                namespace: "ns",
                labels: &labels,
                namespace_labels: &labels,
            },
            families,
            sharing_key: sharing,
            sharing_rule: SharingRule::MetalLb,
            sharing_namespaces: SharingNamespaces::Any,
            backend_key: "",
            ports,
            pool: None,
            addresses: &[],
        };
    const HTTP: &[Port] = &[Port {
        protocol: Protocol::Tcp,
        port: 80,
    }];
    const HTTPS: &[Port] = &[Port {
        protocol: Protocol::Tcp,
        port: 443,
    }];
    let v4 = FamilyPolicy::Single(Family::V4);
    let mut allocator = Allocator::new();
    let spec = IPAddressPoolSpec {
        addresses: vec!["10.0.0.0/30".into(), "fd00::/126".into()],
        ..IPAddressPoolSpec::default()
    };
    allocator.set_pool("p", &spec);
    allocator
        .allocate(&request("ns/a", "k1", HTTP, v4))
        .unwrap();
    let b = allocator
        .allocate(&request("ns/b", "k1", HTTPS, v4))
        .unwrap();
    assert_eq!(b.ips, ["10.0.0.0".parse::<std::net::IpAddr>().unwrap()]);
    allocator.check_invariants().unwrap();
    // b, now PreferDualStack with another sharing key, is completed.
    let prefer = FamilyPolicy::PreferDual {
        primary: Family::V4,
    };
    let completed = allocator.complete_dual_stack(&request("ns/b", "k2", HTTPS, prefer));
    assert_eq!(
        allocator.check_invariants(),
        Ok(()),
        "completed: {completed:?}"
    );

    // The fuzzer's input.
    let found = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz_regressions/fixed_bugs/allocator_ops-complete-dual-stack-resharing");
    let data = std::fs::read(found).unwrap();
    let _ = checks::allocator_answers_unguarded(&data);
}
