//! What an operator sees: election status and Lease errors in the log and
//! the metrics, watch retries that back off, logs fit for a cluster.

use std::time::Duration;

use kube_watcher::logging::{self, LogFormat};
use kube_watcher::Host;
use tracing_subscriber::EnvFilter;

use manager::Store as _;

use crate::support::apiserver_stub::{ApiServerStub, Kind};
use crate::support::{cluster, config, eventually, ingress, namespace, pool, service, LogBuffer};

/// Captures this thread's logs at the binary's default level, as text
/// without colour. With a current-thread runtime every task of the host
/// logs into it.
fn capture() -> (LogBuffer, tracing::subscriber::DefaultGuard) {
    let buffer = LogBuffer::default();
    let subscriber = logging::subscriber(
        LogFormat::Text,
        false,
        EnvFilter::new(logging::DEFAULT_FILTER),
        buffer.clone(),
    );
    (buffer, tracing::subscriber::set_default(subscriber))
}

fn lease_requests(stub: &ApiServerStub) -> usize {
    stub.requests()
        .iter()
        .filter(|r| r.path.contains("/leases"))
        .count()
}

#[tokio::test]
async fn a_forbidden_lease_is_a_warning_with_the_reason_and_a_metric() {
    let (logs, _guard) = capture();
    let stub = cluster().await;
    // No Role for leases: every Lease request is refused.
    stub.fail_next("GET", "/leases/kube-watcher", 403, u32::MAX);
    let host = Host::start(stub.client("a"), config("a"));

    eventually("a WARN about the lease", || {
        !logs.lines_with("WARN").is_empty()
    })
    .await;
    // Within one retry period: the first refused request is reported, not
    // a later one.
    assert!(lease_requests(&stub) <= 2, "{}", logs.text());
    let warnings = logs.lines_with("WARN");
    let warning = &warnings[0];
    for needed in ["forbidden", "RBAC", "leases", "kube-system"] {
        assert!(warning.contains(needed), "{needed} missing from {warning}");
    }

    // Later refusals are counted but not logged again within the minute.
    eventually("five lease attempts", || lease_requests(&stub) >= 5).await;
    let text = host.metrics().render().unwrap();
    let counted: u64 = text
        .lines()
        .find_map(|line| {
            line.strip_prefix("kube_watcher_lease_errors_total{reason=\"forbidden\"} ")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(counted >= 4, "{text}");
    assert!(text.contains("kube_watcher_leader 0"), "{text}");
    assert_eq!(
        logs.lines_with("cannot acquire the lease").len(),
        1,
        "{}",
        logs.text()
    );
    assert!(logs.lines_with("leading").is_empty());
    host.shutdown().await;
}

#[tokio::test]
async fn the_election_status_is_logged_at_info() {
    let (logs, _guard) = capture();
    let stub = ApiServerStub::start().await;
    stub.create(namespace("ns"));
    let a = Host::start(stub.client("a"), config("a"));
    let mut leader = a.leader();
    leader.wait_for(|l| *l).await.unwrap();
    let b = Host::start(stub.client("b"), config("b"));
    eventually("b follows a", || {
        !logs.lines_with("following a since").is_empty()
    })
    .await;
    let leading = logs.lines_with("leading");
    assert!(
        leading
            .iter()
            .any(|l| l.contains(" INFO ") && l.contains("identity=a")),
        "{}",
        logs.text()
    );
    assert_eq!(logs.lines_with("following a since").len(), 1);
    b.shutdown().await;
    a.shutdown().await;
}

fn pool_status_writes(stub: &ApiServerStub) -> usize {
    stub.requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/ipaddresspools/default/status"))
        .count()
}

fn service_lists(stub: &ApiServerStub) -> usize {
    stub.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/services" && !r.query.contains("watch"))
        .count()
}

fn service_watches(stub: &ApiServerStub) -> usize {
    stub.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/services" && r.query.contains("watch"))
        .count()
}

/// On the paused clock: the test sleeps 30 s of virtual time while the
/// host works, and counts the requests.
#[tokio::test(start_paused = true)]
async fn a_failing_list_backs_off_and_warns_once() {
    let (logs, _guard) = capture();
    let stub = ApiServerStub::start().await;
    stub.create(namespace("ns"));
    stub.create(service("ns", "web", "10.96.0.1"));
    stub.fail_next("GET", "/api/v1/services", 500, u32::MAX);
    let host = Host::start(stub.client("a"), config("a"));

    tokio::time::sleep(Duration::from_secs(30)).await;
    let attempts = service_lists(&stub);
    assert!(
        (3..=8).contains(&attempts),
        "{attempts} list attempts in 30 s"
    );
    logs.assert_warned_once("watch of Service failed");
    assert!(!host.synced().is_synced());

    // The API server recovers: the next attempt (at most 30 s away) lists.
    stub.clear_failures();
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(host.synced().is_synced(), "{}", logs.text());
    host.shutdown().await;
}

/// On the paused clock: a pool status write the API server refuses (an
/// RBAC rule missing) is tried again with backoff, not every period, and
/// logged at WARN once.
#[tokio::test(start_paused = true)]
async fn a_refused_pool_status_write_backs_off_and_warns_once() {
    let (logs, _guard) = capture();
    let stub = cluster().await;
    stub.fail_next("PATCH", "/ipaddresspools/default/status", 403, u32::MAX);
    let host = Host::start(stub.client("a"), config("a"));

    // The period is 100 ms here: 300 periods, and a try after 1, 2, 4 ...
    // of them.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let attempts = pool_status_writes(&stub);
    assert!(
        (3..=12).contains(&attempts),
        "{attempts} status writes in 30 s"
    );
    logs.assert_warned_once("could not write the pool's status");

    // Allowed again: the next try (at most the last wait away) writes it.
    stub.clear_failures();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let status = stub.get(Kind::Pool, "metallb-system", "default").unwrap()["status"].clone();
    assert_eq!(status["assignedIPv4"], 1, "{}", logs.text());
    assert_eq!(
        logs.lines_with("wrote the pool's status after").len(),
        1,
        "{}",
        logs.text()
    );
    host.shutdown().await;
}

#[tokio::test]
async fn a_routine_410_is_not_a_warning() {
    let (logs, _guard) = capture();
    let stub = ApiServerStub::start().await;
    stub.create(namespace("ns"));
    stub.create(pool("default", &["192.168.10.0/24"]));
    let host = Host::start(stub.client("a"), config("a"));
    eventually("synced", || host.synced().is_synced()).await;
    // The watch must be open for the 410 to end it.
    eventually("watching", || service_watches(&stub) > 0).await;
    let lists = service_lists(&stub);
    stub.expire_watches();
    eventually("Services listed again", || service_lists(&stub) > lists).await;
    eventually("watching again", || service_watches(&stub) > 1).await;
    assert!(logs.lines_with("WARN").is_empty(), "{}", logs.text());
    host.shutdown().await;
}

/// Runs `kube-watcher [ARGS] run` against `stub` with stderr piped, until
/// it logs that it leads; returns its log lines.
fn run_binary(stub: &ApiServerStub, args: &[&str]) -> Vec<String> {
    use std::io::BufRead;

    let dir = std::env::temp_dir().join(format!(
        "kube-watcher-log-test-{}-{}",
        std::process::id(),
        args.join("-")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, stub.kubeconfig()).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kube-watcher"))
        .args(args)
        .args(["run", "--metrics-addr", "127.0.0.1:0", "--identity", "bin"])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    loop {
        match receiver.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => {
                let done = line.contains("leading");
                lines.push(line);
                if done {
                    break;
                }
            }
            Err(error) => {
                let _ = child.kill();
                panic!("no 'leading' line ({error}); got:\n{}", lines.join("\n"));
            }
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    lines
}

/// The stub on a runtime of its own, for tests that run the binary.
fn stub_runtime() -> (tokio::runtime::Runtime, ApiServerStub) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let stub = runtime.block_on(async {
        let stub = ApiServerStub::start().await;
        stub.create(namespace("ns"));
        stub
    });
    (runtime, stub)
}

#[test]
fn a_piped_log_has_no_colour() {
    let (_runtime, stub) = stub_runtime();
    let lines = run_binary(&stub, &[]);
    assert!(lines.iter().any(|l| l.contains(" INFO ")), "{lines:?}");
    for line in &lines {
        assert!(!line.contains('\u{1b}'), "ANSI escape in {line:?}");
    }
}

#[test]
fn json_log_lines_parse() {
    let (_runtime, stub) = stub_runtime();
    let lines = run_binary(&stub, &["--log-format", "json"]);
    assert!(lines.len() >= 2, "{lines:?}");
    for line in &lines {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|error| panic!("{line:?} is not JSON: {error}"));
        for field in ["timestamp", "level", "target", "message"] {
            assert!(value.get(field).is_some(), "{field} missing from {line}");
        }
    }
    let leading: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(leading["level"], "INFO");
    assert_eq!(leading["message"], "leading");
    assert_eq!(leading["identity"], "bin");
}

#[tokio::test]
async fn the_cache_keeps_only_what_the_rules_read() {
    let stub = ApiServerStub::start().await;
    stub.create(namespace("ns"));
    stub.create(pool("default", &["192.168.10.0/24"]));
    let mut web = service("ns", "web", "10.96.0.1");
    web["metadata"]["managedFields"] = serde_json::json!([{"manager": "kubectl",
        "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]);
    web["metadata"]["annotations"] = serde_json::json!({
        "kubectl.kubernetes.io/last-applied-configuration": "{}",
        "metallb.io/address-pool": "default"});
    stub.create(web);
    let host = Host::start(stub.client("a"), config("a"));
    eventually("web's address and pool are cached", || {
        host.store().service("ns/web").is_some_and(|s| {
            s.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("metallb.io/ip-allocated-from-pool"))
        })
    })
    .await;
    let stored = stub.get(Kind::Service, "ns", "web").unwrap();
    assert!(!ingress(&stored).is_empty());
    assert!(stored["metadata"]["managedFields"].is_array());
    let cached = host.store().service("ns/web").unwrap();
    assert!(cached.metadata.managed_fields.is_none());
    let annotations = cached.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations.keys().collect::<Vec<_>>(),
        [
            "metallb.io/address-pool",
            "metallb.io/ip-allocated-from-pool"
        ]
    );
    let port = &cached.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
    assert_eq!((port.port, port.name.as_deref()), (80, None));
    host.shutdown().await;
}
