//! Metrics in Prometheus text format (prometheus-client), read from the
//! leading controller at scrape time, and the small HTTP server that serves
//! them with `/healthz` and `/readyz`.
//!
//! - `metallb_allocator_addresses_total{pool,kind,ip_family}` and
//!   `metallb_allocator_addresses_in_use_total{pool,kind,ip_family}`: MetalLB's
//!   gauges, per accepted pool and family (only on the leader, which is the
//!   only replica with an allocator).
//! - `metallb_allocator_services_unassigned{reason}`: the Services of our
//!   class whose `metallb.io/AddressAssigned` condition is `False`, by its
//!   reason (docs/allocation.md §4.7), counted in the cache at scrape time
//!   (on the leader only, as the gauges above; a reason no Service shows is
//!   left out, that is 0).
//! - `kube_watcher_reconciliations_total`, `kube_watcher_write_errors_total`,
//!   `kube_watcher_event_errors_total`, `kube_watcher_pool_rejections_total`:
//!   `AllocatingController::stats()`, summed over this process's leadership
//!   terms so they never go down.
//! - `kube_watcher_lease_errors_total{reason}`: failed Lease requests, by
//!   [`LeaseErrorReason`] (forbidden, not_found, conflict, timeout, other).
//! - `kube_watcher_leader` and `kube_watcher_synced`: 1 or 0.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Service;
use manager::{AllocatingController, ConditionKind, ControllerStats};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::lease::{LeaseErrorCounts, LeaseErrorReason};
use crate::store::KubeStore;
use crate::watch::SyncTracker;

/// The content type of `/metrics`.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the metrics are read from. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Metrics {
    source: Arc<Source>,
    registry: Arc<Registry>,
}

#[derive(Debug)]
struct Source {
    state: Mutex<SourceState>,
    leader: AtomicBool,
    synced: SyncTracker,
    lease_errors: LeaseErrorCounts,
    /// Events the host's client could not publish (it publishes them
    /// after the controller handed them over).
    event_errors: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct SourceState {
    /// The counters of earlier leadership terms.
    base: ControllerStats,
    current: Option<Arc<AllocatingController>>,
    /// The cache and the class whose Services are counted unassigned.
    services: Option<(KubeStore, Option<String>)>,
}

/// The Services of `class` whose condition is `False`, by reason.
fn unassigned(services: &[Arc<Service>], class: Option<&str>) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for service in services {
        let spec = service.spec.as_ref();
        if spec.and_then(|s| s.load_balancer_class.as_deref()) != class {
            continue;
        }
        if let Some(condition) = ConditionKind::Assigned.shown(service).filter(|c| !c.status) {
            *counts.entry(condition.reason).or_insert(0) += 1;
        }
    }
    counts
}

fn add(a: ControllerStats, b: ControllerStats) -> ControllerStats {
    ControllerStats {
        reconciliations: a.reconciliations.saturating_add(b.reconciliations),
        restores: a.restores.saturating_add(b.restores),
        write_errors: a.write_errors.saturating_add(b.write_errors),
        event_errors: a.event_errors.saturating_add(b.event_errors),
        pool_rejections: a.pool_rejections.saturating_add(b.pool_rejections),
    }
}

impl Source {
    fn lock(&self) -> MutexGuard<'_, SourceState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Metrics {
    /// Metrics that report `synced` as readiness.
    pub fn new(synced: SyncTracker) -> Self {
        let source = Arc::new(Source {
            state: Mutex::new(SourceState::default()),
            leader: AtomicBool::new(false),
            synced,
            lease_errors: LeaseErrorCounts::default(),
            event_errors: Arc::new(AtomicU64::new(0)),
        });
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ControllerCollector(Arc::clone(&source))));
        Self {
            source,
            registry: Arc::new(registry),
        }
    }

    /// The controller of a new leadership term (`None`: the term ended; its
    /// counters are kept).
    pub fn set_controller(&self, controller: Option<Arc<AllocatingController>>) {
        let mut state = self.source.lock();
        if let Some(old) = state.current.take() {
            state.base = add(state.base, old.stats());
        }
        state.current = controller;
    }

    /// Counts the Services of `class` in `store` whose condition is
    /// `False` (`metallb_allocator_services_unassigned`).
    pub fn count_services(&self, store: KubeStore, class: Option<String>) {
        self.source.lock().services = Some((store, class));
    }

    /// Whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.source.leader.store(leader, Ordering::Relaxed);
    }

    /// The Lease failures this host counts (handed to its elector).
    pub fn lease_errors(&self) -> LeaseErrorCounts {
        self.source.lease_errors.clone()
    }

    /// The count of Events the host's client failed to publish.
    pub fn event_errors(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.source.event_errors)
    }

    /// Whether every watcher finished its initial list.
    pub fn is_ready(&self) -> bool {
        self.source.synced.is_synced()
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

#[derive(Debug)]
struct ControllerCollector(Arc<Source>);

/// One metric without labels.
fn encode_metric(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let descriptor = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(descriptor)
}

/// A count as a gauge value (exact up to 2^53).
fn as_f64(count: u128) -> f64 {
    count as f64
}

impl Collector for ControllerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let (base, current, services) = {
            let state = self.0.lock();
            (state.base, state.current.clone(), state.services.clone())
        };
        // Like the pool gauges, only while leading.
        let unassigned = match (&current, services) {
            (Some(_), Some((store, class))) => {
                unassigned(&store.services().state(), class.as_deref())
            }
            _ => BTreeMap::new(),
        };
        let (stats, pools) = {
            match current {
                Some(controller) => (add(base, controller.stats()), controller.pool_stats()),
                None => (base, Vec::new()),
            }
        };
        encode_pools(&mut encoder, &pools)?;
        encode_unassigned(&mut encoder, &unassigned)?;
        encode_counters(
            &mut encoder,
            &stats,
            self.0.event_errors.load(Ordering::Relaxed),
        )?;
        {
            let mut metric = encoder.encode_descriptor(
                "kube_watcher_lease_errors",
                "Failed leader election Lease requests, by reason",
                None,
                MetricType::Counter,
            )?;
            for reason in LeaseErrorReason::ALL {
                let labels = [("reason", reason.label())];
                ConstCounter::new(self.0.lease_errors.get(reason))
                    .encode(metric.encode_family(&labels)?)?;
            }
        }
        let leader = self.0.leader.load(Ordering::Relaxed);
        encode_metric(
            &mut encoder,
            "kube_watcher_leader",
            "1 while this replica holds the lease",
            ConstGauge::new(i64::from(leader)),
        )?;
        encode_metric(
            &mut encoder,
            "kube_watcher_synced",
            "1 once every watcher finished its initial list",
            ConstGauge::new(i64::from(self.0.synced.is_synced())),
        )
    }
}

/// The per-pool gauges: usable and in-use addresses per family, labelled
/// with the pool's kind (`IPAddressPool`, `CiliumLoadBalancerIPPool`).
fn encode_pools(
    encoder: &mut DescriptorEncoder<'_>,
    pools: &[allocator::PoolStats],
) -> Result<(), std::fmt::Error> {
    for (name, help, in_use) in [
        (
            "metallb_allocator_addresses_total",
            "Number of usable IP addresses, per pool and IP family",
            false,
        ),
        (
            "metallb_allocator_addresses_in_use_total",
            "Number of IP addresses in use, per pool and IP family",
            true,
        ),
    ] {
        let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for pool in pools {
            for (family, stats) in [("ipv4", &pool.ipv4), ("ipv6", &pool.ipv6)] {
                // Names may repeat across kinds (docs/cilium.md §2.8).
                let kind = pool.kind.to_string();
                let labels = [
                    ("pool", pool.name.as_str()),
                    ("kind", kind.as_str()),
                    ("ip_family", family),
                ];
                let value = if in_use {
                    stats.assigned
                } else {
                    stats.total.saturating_u128()
                };
                ConstGauge::new(as_f64(value)).encode(metric.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

fn encode_unassigned(
    encoder: &mut DescriptorEncoder<'_>,
    unassigned: &BTreeMap<String, i64>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(
        "metallb_allocator_services_unassigned",
        "Number of LoadBalancer Services without addresses, by the reason of their metallb.io/AddressAssigned condition",
        None,
        MetricType::Gauge,
    )?;
    for (reason, count) in unassigned {
        let labels = [("reason", reason.as_str())];
        ConstGauge::new(*count).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The controller's counters; `host_event_errors` are the Events the host
/// itself failed to emit.
fn encode_counters(
    encoder: &mut DescriptorEncoder<'_>,
    stats: &ControllerStats,
    host_event_errors: u64,
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in [
        (
            "kube_watcher_reconciliations",
            "Service reconciliations",
            stats.reconciliations,
        ),
        (
            "kube_watcher_write_errors",
            "Failed Service status or annotation writes (retried)",
            stats.write_errors,
        ),
        (
            "kube_watcher_event_errors",
            "Events that could not be emitted",
            stats.event_errors.saturating_add(host_event_errors),
        ),
        (
            "kube_watcher_pool_rejections",
            "Times a pool change left a pool rejected",
            stats.pool_rejections,
        ),
    ] {
        encode_metric(encoder, name, help, ConstCounter::new(value))?;
    }
    Ok(())
}

fn response(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// Answers one request: `/metrics`, `/healthz`, `/readyz`.
pub fn answer(metrics: &Metrics, path: &str) -> Response<Full<Bytes>> {
    match path {
        "/metrics" => match metrics.render() {
            Ok(text) => response(StatusCode::OK, METRICS_CONTENT_TYPE, text),
            Err(_) => response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                "cannot encode metrics\n".to_owned(),
            ),
        },
        "/healthz" => response(StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" if metrics.is_ready() => {
            response(StatusCode::OK, "text/plain", "ok\n".to_owned())
        }
        "/readyz" => response(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "initial list not complete\n".to_owned(),
        ),
        _ => response(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
    }
}

/// Serves [`answer`] on `listener` (HTTP/1.1) until `cancel` fires.
pub async fn serve(listener: TcpListener, metrics: Metrics, cancel: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer): (_, SocketAddr) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "metrics server: accept failed");
                continue;
            }
        };
        let metrics = metrics.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let reply = answer(&metrics, request.uri().path());
                async move { Ok::<_, Infallible>(reply) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = cancel.cancelled() => {}
                result = connection => {
                    if let Err(error) = result {
                        tracing::debug!(%peer, %error, "metrics connection failed");
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn showing(class: Option<&str>, status: &str, reason: &str) -> Arc<Service> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "s", "namespace": "ns"},
                "spec": {"type": "LoadBalancer", "loadBalancerClass": class},
                "status": {"conditions": [
                    {"type": "example.com/Other", "status": "False", "reason": "Nope",
                     "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"},
                    {"type": "metallb.io/AddressAssigned", "status": status, "reason": reason,
                     "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"}]}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn unassigned_counts_our_false_conditions_of_our_class() {
        let services = [
            showing(None, "False", "PoolExhausted"),
            showing(None, "False", "PoolExhausted"),
            showing(None, "False", "NoPoolServes"),
            showing(None, "True", "Assigned"),
            showing(Some("other"), "False", "PoolExhausted"),
        ];
        let counts = unassigned(&services, None);
        assert_eq!(
            counts.into_iter().collect::<Vec<_>>(),
            [
                ("NoPoolServes".to_owned(), 1),
                ("PoolExhausted".to_owned(), 2)
            ]
        );
        let counts = unassigned(&services, Some("other"));
        assert_eq!(
            counts.into_iter().collect::<Vec<_>>(),
            [("PoolExhausted".to_owned(), 1)]
        );
    }

    #[test]
    fn renders_counters_and_readiness_without_a_controller() {
        let synced = SyncTracker::new(&["Service"]);
        let metrics = Metrics::new(synced.clone());
        assert_eq!(
            answer(&metrics, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        synced.mark("Service");
        assert_eq!(answer(&metrics, "/readyz").status(), StatusCode::OK);
        assert_eq!(answer(&metrics, "/healthz").status(), StatusCode::OK);
        assert_eq!(answer(&metrics, "/nope").status(), StatusCode::NOT_FOUND);
        metrics.set_leader(true);
        let text = metrics.render().unwrap();
        assert!(
            text.contains("kube_watcher_reconciliations_total 0\n"),
            "{text}"
        );
        assert!(text.contains("kube_watcher_leader 1\n"), "{text}");
        metrics.lease_errors().record(LeaseErrorReason::Forbidden);
        let text = metrics.render().unwrap();
        assert!(
            text.contains("kube_watcher_lease_errors_total{reason=\"forbidden\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("kube_watcher_lease_errors_total{reason=\"timeout\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("kube_watcher_synced 1\n"), "{text}");
        assert!(
            text.contains("# TYPE metallb_allocator_addresses_total gauge"),
            "{text}"
        );
    }

    #[test]
    fn pool_gauges_carry_the_pools_kind() {
        let family = |total: u128, assigned: u128| allocator::FamilyStats {
            total: allocator::AddressCount::new(total),
            assigned,
            reserved: 0,
        };
        let pools = [
            allocator::PoolStats {
                name: "blue".to_owned(),
                kind: allocator::PoolKind::CiliumLoadBalancerIPPool,
                ipv4: family(256, 3),
                ipv6: family(0, 0),
            },
            allocator::PoolStats {
                name: "default".to_owned(),
                kind: allocator::PoolKind::IPAddressPool,
                ipv4: family(16, 1),
                ipv6: family(0, 0),
            },
        ];
        #[derive(Debug)]
        struct Pools(Vec<allocator::PoolStats>);
        impl Collector for Pools {
            fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
                encode_pools(&mut encoder, &self.0)
            }
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Pools(pools.to_vec())));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        for line in [
            "metallb_allocator_addresses_total{pool=\"blue\",kind=\"CiliumLoadBalancerIPPool\",ip_family=\"ipv4\"} 256.0\n",
            "metallb_allocator_addresses_in_use_total{pool=\"blue\",kind=\"CiliumLoadBalancerIPPool\",ip_family=\"ipv4\"} 3.0\n",
            "metallb_allocator_addresses_total{pool=\"default\",kind=\"IPAddressPool\",ip_family=\"ipv4\"} 16.0\n",
        ] {
            assert!(text.contains(line), "{line} missing in {text}");
        }
    }
}
