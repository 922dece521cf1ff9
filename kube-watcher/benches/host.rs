//! The host under load: `cargo bench -p kube-watcher --bench host --
//! [--quick] [--json PATH]` (what `cargo xtask bench --host` runs).
//!
//! The API-server stub of the test tree runs in this process; the host runs
//! in a child process (this same binary, re-executed), so its CPU time and
//! peak RSS are its own (read from /proc before it stops). Two phases:
//!
//! 1. **Load.** The host starts on a cluster with one Namespace and one
//!    pool (a /14), leads and syncs; then Services are created at a fixed
//!    rate (full: 50,000 at 1,000/s; quick: 5,000 at 500/s). The latency of
//!    each is from its creation to the stub's receipt of its status patch
//!    (both stub-side clocks). When every Service has its address and the
//!    pool status shows them all, the host stops (giving its Lease up).
//! 2. **Restart.** A new host starts on those Services: time to ready
//!    (process start to synced, leading and the sync passes done) and the
//!    writes it makes (Services, Events, pools: must be 0).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr
)]

#[path = "../tests/support/apiserver_stub.rs"]
#[allow(dead_code)]
mod apiserver_stub;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use apiserver_stub::{ApiServerStub, Kind};
use kube_watcher::logging::{self, LogFormat};
use kube_watcher::{Host, HostConfig};
use serde_json::{json, Value};
use tracing_subscriber::EnvFilter;

/// The child reads the stub's address from this variable.
const CHILD_ENV: &str = "KUBE_WATCHER_BENCH_HOST_URL";
const NAMESPACE: &str = "bench";
const POOL: &str = "bench";
const POOL_CIDR: &str = "10.0.0.0/14";

fn main() {
    if let Ok(url) = std::env::var(CHILD_ENV) {
        child(&url);
        return;
    }
    let mut quick = false;
    let mut json_path = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--json" => json_path = args.next(),
            // cargo bench passes --bench; other harness flags mean nothing here.
            _ => {}
        }
    }
    let (services, rate) = if quick { (5_000, 500) } else { (50_000, 1_000) };
    let figures = run(services, rate);
    figures.print();
    if let Some(path) = json_path {
        std::fs::write(&path, format!("{:#}\n", figures.json())).unwrap();
        eprintln!("wrote {path}");
    }
}

// ---- the host, in the child process ----

/// The resident set size of this process now, in kB (Linux; 0 elsewhere).
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Runs a host against the stub at `url` with the binary's defaults; says
/// `READY` (synced and leading), then `IDLE RSS_KB` (sync passes done);
/// stops when its standard input closes.
fn child(url: &str) {
    let subscriber = logging::subscriber(
        LogFormat::Text,
        false,
        EnvFilter::new("warn"),
        std::io::stderr,
    );
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut config = kube::Config::new(url.parse().unwrap());
        config.read_timeout = None;
        let client = kube::Client::try_from(config).unwrap();
        let host = Host::start(client, HostConfig::new("bench", "kube-system"));
        let mut leader = host.leader();
        host.synced().wait().await;
        leader.wait_for(|leading| *leading).await.unwrap();
        println!("READY");
        while !host.term_synced() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        host.idle().await;
        println!("IDLE {}", rss_kb());
        tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        })
        .await
        .unwrap();
        host.shutdown().await;
    });
}

// ---- the parent: stub, load, figures ----

struct HostProcess {
    child: std::process::Child,
    lines: mpsc::Receiver<(String, Instant)>,
    started: Instant,
}

/// The CPU time and peak RSS of a host process.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    cpu_s: f64,
    max_rss_mb: f64,
}

impl HostProcess {
    fn spawn(url: &str) -> Self {
        let started = Instant::now();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(CHILD_ENV, url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send((line, Instant::now())).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            started,
        }
    }

    /// The next line, which must start with `word`; with when it came.
    fn expect(&self, word: &str, within: Duration) -> (String, Instant) {
        let (line, at) = self
            .lines
            .recv_timeout(within)
            .unwrap_or_else(|e| panic!("the host did not say {word}: {e}"));
        assert!(line.starts_with(word), "expected {word}, got {line:?}");
        (line, at)
    }

    /// Reads its CPU time and peak RSS, then closes its standard input (it
    /// shuts down) and reaps it.
    fn stop(mut self) -> Usage {
        let usage = usage(self.child.id());
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the host exited with {status}");
        usage
    }
}

/// The CPU time (user and system, every thread, as getrusage counts it) and
/// peak RSS of process `pid`, from /proc (the workspace forbids the unsafe
/// code a libc call needs). /proc counts CPU time in USER_HZ ticks, 100 a
/// second on Linux whatever the kernel's own tick.
fn usage(pid: u32) -> Usage {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name (which may hold spaces) in ")";
    // utime and stime are fields 14 and 15, so 12 and 13 after it.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hwm_kb: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    Usage {
        cpu_s: ticks / 100.0,
        max_rss_mb: hwm_kb / 1024.0,
    }
}

fn service(index: usize) -> Value {
    let ip = format!("10.96.{}.{}", index / 250, index % 250 + 1);
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": NAMESPACE, "name": format!("svc-{index:05}"),
                     "labels": {"app": format!("app-{}", index % 100)}},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": ip, "clusterIPs": [ip],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
            "externalTrafficPolicy": "Cluster",
            "selector": {"app": format!("app-{}", index % 100)},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }
    })
}

/// The Service a status patch is for.
fn patched_service(path: &str) -> Option<&str> {
    path.strip_prefix(&format!("/api/v1/namespaces/{NAMESPACE}/services/"))?
        .strip_suffix("/status")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

struct Figures {
    services: usize,
    rate: usize,
    create_s: f64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    load: Usage,
    restart: Usage,
    rss_per_service_b: f64,
    restart_ready_s: f64,
    restart_idle_s: f64,
    restart_writes: usize,
}

impl Figures {
    fn print(&self) {
        let rows = [
            (
                "Services created",
                format!("{}", self.services),
                String::new(),
            ),
            (
                "create rate (per s)",
                format!("{} (took {:.1} s)", self.rate, self.create_s),
                String::new(),
            ),
            (
                "create to status patch p50 (ms)",
                format!("{:.1}", self.p50_ms),
                String::new(),
            ),
            ("p90 (ms)", format!("{:.1}", self.p90_ms), String::new()),
            (
                "p99 (ms)",
                format!("{:.1}", self.p99_ms),
                "<= 100".to_owned(),
            ),
            ("max (ms)", format!("{:.1}", self.max_ms), String::new()),
            (
                "host CPU during the load (s)",
                format!("{:.2}", self.load.cpu_s),
                String::new(),
            ),
            (
                "host peak RSS (MB)",
                format!(
                    "{:.1} (load) / {:.1} (restart)",
                    self.load.max_rss_mb, self.restart.max_rss_mb
                ),
                "<= 250".to_owned(),
            ),
            (
                "host RSS per cached Service (B)",
                format!("{:.0}", self.rss_per_service_b),
                String::new(),
            ),
            (
                "restart: ready, synced and leading (s)",
                format!("{:.2}", self.restart_ready_s),
                "<= 10".to_owned(),
            ),
            (
                "restart: sync passes done (s)",
                format!("{:.2}", self.restart_idle_s),
                String::new(),
            ),
            (
                "restart: host CPU (s)",
                format!("{:.2}", self.restart.cpu_s),
                String::new(),
            ),
            (
                "restart: writes",
                format!("{}", self.restart_writes),
                "0".to_owned(),
            ),
        ];
        println!("{:<42} {:<32} target", "figure", "result");
        for (name, value, target) in rows {
            println!("{name:<42} {value:<32} {target}");
        }
    }

    fn json(&self) -> Value {
        let round = |x: f64, digits: i32| {
            let scale = 10f64.powi(digits);
            (x * scale).round() / scale
        };
        json!({
            "host_services": self.services,
            "host_create_rate_per_s": self.rate,
            "host_latency_p50_ms": round(self.p50_ms, 2),
            "host_latency_p90_ms": round(self.p90_ms, 2),
            "host_latency_p99_ms": round(self.p99_ms, 2),
            "host_cpu_s": round(self.load.cpu_s, 2),
            "host_peak_rss_mb": round(self.load.max_rss_mb.max(self.restart.max_rss_mb), 1),
            "host_restart_ready_s": round(self.restart_ready_s, 3),
            "host_restart_writes": self.restart_writes,
            "host_rss_per_service_bytes": round(self.rss_per_service_b, 0),
        })
    }
}

fn run(services: usize, rate: usize) -> Figures {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let stub = runtime.block_on(ApiServerStub::start());
    let url = stub.url();
    stub.create(json!({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": NAMESPACE}}));
    stub.create(json!({
        "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"namespace": "metallb-system", "name": POOL},
        "spec": {"addresses": [POOL_CIDR]}
    }));

    // Phase 1: the load.
    eprintln!("load: {services} Services at {rate}/s");
    let host = HostProcess::spawn(&url);
    host.expect("READY", Duration::from_secs(60));
    let (idle, _) = host.expect("IDLE", Duration::from_secs(60));
    let base_rss_kb: f64 = idle.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (mut latencies, create_s) = create_and_time(&stub, services, rate);
    latencies.sort_by(f64::total_cmp);
    wait_for_pool_status(&stub, services);
    let load = host.stop();
    eprintln!("load done: {} requests so far", stub.last_seq());

    let restart = restart(&stub, &url);
    std::io::stderr().flush().unwrap();
    drop(stub);
    drop(runtime);

    Figures {
        services,
        rate,
        create_s,
        p50_ms: percentile(&latencies, 50.0),
        p90_ms: percentile(&latencies, 90.0),
        p99_ms: percentile(&latencies, 99.0),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        load,
        restart: restart.usage,
        rss_per_service_b: (restart.full_rss_kb - base_rss_kb) * 1024.0 / services as f64,
        restart_ready_s: restart.ready_s,
        restart_idle_s: restart.idle_s,
        restart_writes: restart.writes,
    }
}

/// Creates `services` Services at `rate` per second while reading the
/// host's requests; each Service's latency from its create to its status
/// patch (ms, in creation order), and how long the creates took (s).
fn create_and_time(stub: &ApiServerStub, services: usize, rate: usize) -> (Vec<f64>, f64) {
    let mut cursor = stub.last_seq();
    let mut patched: HashMap<String, Instant> = HashMap::with_capacity(services);
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let (created, create_s) = std::thread::scope(|scope| {
        let creator = scope.spawn(|| {
            let start = Instant::now();
            let mut created = Vec::with_capacity(services);
            for index in 0..services {
                let due = start + interval * u32::try_from(index).unwrap();
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let object = service(index);
                created.push(Instant::now());
                stub.create(object);
            }
            (created, start.elapsed().as_secs_f64())
        });
        // Read the requests as they come, so the list stays short.
        let deadline =
            Instant::now() + Duration::from_secs_f64(services as f64 / rate as f64 + 300.0);
        while patched.len() < services {
            assert!(
                Instant::now() < deadline,
                "only {} of {services} Services got an address",
                patched.len()
            );
            std::thread::sleep(Duration::from_millis(100));
            for request in stub.requests_after(cursor) {
                cursor = request.seq;
                if request.method == "PATCH" {
                    if let Some(name) = patched_service(&request.path) {
                        patched.entry(name.to_owned()).or_insert(request.at);
                    }
                }
            }
        }
        creator.join().unwrap()
    });
    let latencies = (0..services)
        .map(|index| {
            let at = patched[&format!("svc-{index:05}")];
            at.saturating_duration_since(created[index]).as_secs_f64() * 1000.0
        })
        .collect();
    (latencies, create_s)
}

/// Waits for the last pool status write, so the restart has none to make.
fn wait_for_pool_status(stub: &ApiServerStub, services: usize) {
    let assigned = i64::try_from(services).unwrap();
    let settle = Instant::now() + Duration::from_secs(60);
    while stub
        .get(Kind::Pool, "metallb-system", POOL)
        .is_none_or(|pool| pool["status"]["assignedIPv4"] != assigned)
    {
        assert!(
            Instant::now() < settle,
            "the pool status never showed {services}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a restart on the Services with their addresses took.
struct Restart {
    usage: Usage,
    ready_s: f64,
    idle_s: f64,
    full_rss_kb: f64,
    writes: usize,
}

/// Phase 2: a new host on the Services with their addresses.
fn restart(stub: &ApiServerStub, url: &str) -> Restart {
    let mark = stub.last_seq();
    let host = HostProcess::spawn(url);
    let (_, ready) = host.expect("READY", Duration::from_secs(120));
    let (idle, idle_at) = host.expect("IDLE", Duration::from_secs(120));
    let full_rss_kb: f64 = idle.split_whitespace().nth(1).unwrap().parse().unwrap();
    let ready_s = ready.duration_since(host.started).as_secs_f64();
    let idle_s = idle_at.duration_since(host.started).as_secs_f64();
    // A bounded look for late writes: a pool status flush comes within a
    // second of the sync passes.
    std::thread::sleep(Duration::from_secs(3));
    let writes: Vec<String> = stub
        .requests_after(mark)
        .iter()
        .filter(|r| r.is_object_write())
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    if !writes.is_empty() {
        eprintln!(
            "restart writes (first 10): {:?}",
            &writes[..writes.len().min(10)]
        );
    }
    Restart {
        usage: host.stop(),
        ready_s,
        idle_s,
        full_rss_kb,
        writes: writes.len(),
    }
}
