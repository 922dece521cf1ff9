//! Test support: the API-server stub, objects, and a host configured for
//! tests.

pub(crate) mod apiserver_stub;

use std::time::Duration;

use kube_watcher::{Host, HostConfig};
use manager::ManagerConfig;
use serde_json::{json, Value};

/// The namespace and name of the Lease in these tests.
pub(crate) const LEASE_NAMESPACE: &str = "kube-system";
pub(crate) const LEASE_NAME: &str = "kube-watcher";

/// A host config with short timings: lease 3s, renew deadline 2s, retry
/// 100ms; pool status every 100ms.
pub(crate) fn config(identity: &str) -> HostConfig {
    let mut config = HostConfig::new(identity, LEASE_NAMESPACE)
        .lease_name(LEASE_NAME)
        .lease_timing(
            Duration::from_secs(3),
            Duration::from_secs(2),
            Duration::from_millis(100),
        );
    config.pool_status_period = Duration::from_millis(100);
    config.manager = ManagerConfig::default().retry_base(Duration::from_millis(10));
    config
}

/// A stub with namespace `ns`, pool `default` (192.168.10.0/24) and the
/// Service `ns/web`.
pub(crate) async fn cluster() -> apiserver_stub::ApiServerStub {
    let stub = apiserver_stub::ApiServerStub::start().await;
    stub.create(namespace("ns"));
    stub.create(pool("default", &["192.168.10.0/24"]));
    stub.create(service("ns", "web", "10.96.0.1"));
    stub
}

pub(crate) fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

pub(crate) fn pool(name: &str, addresses: &[&str]) -> Value {
    json!({
        "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"namespace": "metallb-system", "name": name},
        "spec": {"addresses": addresses}
    })
}

/// A single-stack IPv4 LoadBalancer Service with one TCP port.
pub(crate) fn service(namespace: &str, name: &str, cluster_ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
            "externalTrafficPolicy": "Cluster",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }
    })
}

/// `status.loadBalancer.ingress[].ip` of a stored Service.
pub(crate) fn ingress(service: &Value) -> Vec<String> {
    service["status"]["loadBalancer"]["ingress"]
        .as_array()
        .map(|ingress| {
            ingress
                .iter()
                .filter_map(|i| i["ip"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `check` every 10ms for at most 20s (for state the stub does not
/// see, such as the host's cache).
pub(crate) async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting until {what}");
}

/// Log lines captured by a tracing subscriber (see [`capture_logs`]).
#[derive(Clone, Default)]
pub(crate) struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogBuffer {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The lines that contain `needle`.
    pub(crate) fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|line| line.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Asserts that one line has `needle`, and that it is a WARN.
    pub(crate) fn assert_warned_once(&self, needle: &str) {
        let warnings = self.lines_with(needle);
        assert_eq!(warnings.len(), 1, "{}", self.text());
        assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Waits until `host` leads and its term is idle.
pub(crate) async fn settled(host: &Host) {
    let mut leader = host.leader();
    tokio::time::timeout(Duration::from_secs(20), leader.wait_for(|l| *l))
        .await
        .expect("leads in time")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), host.idle())
        .await
        .expect("idle in time");
}
