//! Driving a replay: the store, the chains, the controller and the manager
//! wired as a host would wire them, fed one line at a time (docs/replay.md §1).
//!
//! Start and sync (§1.1): the stream is read ahead to its first `SYNCED` line
//! (see the `lookahead` module). Without one, the manager is marked synced
//! before the first line and every line is an event after sync. With one,
//! the lines before it are delivered without waiting (the manager only
//! caches and queues before sync), `SYNCED` marks the manager synced, and
//! every later line is an event after sync; a second `SYNCED` changes
//! nothing. After each line after sync, the replay waits for the manager to
//! be idle before the next one, and fails (rather than hang) if the
//! controller writes past a per-line limit ([`WRITES_PER_LINE`]).

use std::collections::{BTreeSet, HashMap};
use std::io::BufRead;

use k8s_openapi::api::core::v1::Service;
use manager::ManagerConfig;
use subscriber::CiliumLoadBalancerIPPool;

use crate::client::FailurePlan;
use crate::config::ConfigPool;
use crate::lookahead::SPOOL_MEMORY_BYTES;
use crate::plugin::{NotIdle, Plugin};
use crate::result::{
    CiliumPoolResult, ConditionResult, Count, FamilyResult, HoldingRecord, PoolResult,
    RejectedPoolResult, ReplayResult, ServiceResult, TraceEvent, TraceStep,
};
use crate::source::{Read, ReadOptions, Reads, Source};
use crate::store::{Change, StoreError};
use crate::stream::{
    service_key_of, LineError, Object, StreamError, WatchEvent, DEFAULT_MAX_LINE_BYTES,
};

/// Write attempts allowed for one line: this many, plus
/// [`WRITES_PER_SERVICE`] per Service in the store. A line may make every
/// Service release and take addresses again, each write failing once when
/// failures are injected; a controller that writes more does not converge.
pub const WRITES_PER_LINE: u64 = 1000;
/// See [`WRITES_PER_LINE`].
pub const WRITES_PER_SERVICE: u64 = 8;

/// How to replay a stream.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// `--lb-class`: handle only Services of this class.
    pub lb_class: Option<String>,
    /// `--keep-going`: skip bad lines instead of stopping.
    pub keep_going: bool,
    /// Pools of either kind that exist before the first line (`--config`),
    /// created in this order.
    pub pools: Vec<ConfigPool>,
    /// Fail some status writes (tests of retries).
    pub failures: Option<FailurePlan>,
    /// Record a [`TraceStep`] per line.
    pub trace: bool,
    /// Check docs/allocation.md §6 after every line after sync.
    pub check_invariants: bool,
    /// The longest line allowed.
    pub max_line_bytes: usize,
    /// How many bytes read ahead stay in memory (see [`SPOOL_MEMORY_BYTES`]).
    pub spool_memory_bytes: usize,
    /// Where the temporary file for the lines read ahead beyond
    /// `spool_memory_bytes` is made (`None`: the system's temporary
    /// directory, `TMPDIR`).
    pub spool_dir: Option<std::path::PathBuf>,
    /// The manager's retry timing.
    pub manager: ManagerConfig,
    /// Write attempts allowed per line, beside `writes_per_service` per
    /// Service in the store (default [`WRITES_PER_LINE`]).
    pub writes_per_line: u64,
    /// Default [`WRITES_PER_SERVICE`].
    pub writes_per_service: u64,
    /// Reconcile settled Services too (`ControllerConfig::exhaustive`):
    /// the same output, slower; for tests.
    pub exhaustive: bool,
    /// Write no Service condition (`ControllerConfig::without_conditions`):
    /// for the benchmark that measures what the condition costs.
    pub without_conditions: bool,
    /// Never free the replay's state (the store, the allocator, the
    /// manager) once the output is made: for a process that ends right
    /// after, as `fake-watcher replay` does, where freeing 100k Services'
    /// worth of scattered objects is work (a cache miss each) that the
    /// operating system does at exit for free.
    pub leak_state: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            lb_class: None,
            keep_going: false,
            pools: Vec::new(),
            failures: None,
            trace: false,
            check_invariants: false,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            spool_memory_bytes: SPOOL_MEMORY_BYTES,
            spool_dir: None,
            manager: ManagerConfig::default(),
            writes_per_line: WRITES_PER_LINE,
            writes_per_service: WRITES_PER_SERVICE,
            exhaustive: false,
            without_conditions: false,
            leak_state: false,
        }
    }
}

impl ReplayOptions {
    /// Handle only Services of `class`.
    #[must_use]
    pub fn lb_class(mut self, class: impl Into<String>) -> Self {
        self.lb_class = Some(class.into());
        self
    }

    /// Skip bad lines instead of stopping.
    #[must_use]
    pub fn keep_going(mut self, keep_going: bool) -> Self {
        self.keep_going = keep_going;
        self
    }

    /// Pools that exist before the first line.
    #[must_use]
    pub fn pools(mut self, pools: impl IntoIterator<Item = impl Into<ConfigPool>>) -> Self {
        self.pools = pools.into_iter().map(Into::into).collect();
        self
    }

    /// Fail status writes as `plan` says.
    #[must_use]
    pub fn failures(mut self, plan: FailurePlan) -> Self {
        self.failures = Some(plan);
        self
    }

    /// Record the per-line trace.
    #[must_use]
    pub fn trace(mut self, trace: bool) -> Self {
        self.trace = trace;
        self
    }

    /// Check the invariants after every line after sync.
    #[must_use]
    pub fn check_invariants(mut self, check: bool) -> Self {
        self.check_invariants = check;
        self
    }
}

/// Everything a replay produced.
#[derive(Debug, Default)]
pub struct ReplayOutput {
    /// The §3 result.
    pub result: ReplayResult,
    /// One step per applied line (when [`ReplayOptions::trace`] is set).
    pub trace: Vec<TraceStep>,
    /// The lines skipped with `--keep-going`, in order.
    pub skipped: Vec<StreamError>,
    /// Invariants broken after a line (when checked): `(line, problems)`.
    pub violations: Vec<(u64, Vec<String>)>,
    /// The addresses each Service's status showed when the stream first
    /// gave it some, for the table's `(was ...)` (docs/replay.md §2.1).
    pub first_ips: HashMap<String, Vec<String>>,
    /// The LoadBalancer Services of another `loadBalancerClass`: not
    /// handled by this replay.
    pub other_class: BTreeSet<String>,
}

/// A replay that could not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A bad line stopped the replay.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// A pool of `--config` was refused by the store.
    #[error("--config pool: {0}")]
    Store(#[from] StoreError),
    /// The temporary file that holds the looked-ahead lines failed.
    #[error(
        "cannot keep the stream in a temporary file (the stream has no SYNCED line \
             early on, and is large): {0}"
    )]
    Spool(#[source] std::io::Error),
    /// The manager's worker stopped (it panicked).
    #[error("the manager's worker stopped: {0}")]
    Worker(String),
    /// The controller kept writing without becoming idle.
    #[error("{file}:{line}: the controller made more than {writes} status writes for this line without becoming idle: it does not converge")]
    NoConvergence {
        file: String,
        /// The line being processed (0: a `--config` pool).
        line: u64,
        /// The writes allowed for the line.
        writes: u64,
    },
    /// No tokio runtime could be built (blocking replay).
    #[error("cannot start a tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// Told about the progress of a replay.
pub trait Observer {
    /// An event line was read (before it is applied).
    fn line(&mut self, _line: u64) {}
    /// The same, with the bytes of the stream read up to the end of the
    /// line (for a progress estimate); calls [`Observer::line`] unless
    /// overridden.
    fn position(&mut self, line: u64, _bytes: u64) {
        self.line(line);
    }
    /// A bad line was skipped (`--keep-going`).
    fn skipped(&mut self, _error: &StreamError) {}
    /// Line `line` is about to be applied: every line before it is
    /// applied and, after sync, settled. For `explain` and `what-if`,
    /// which read the plugin there.
    fn before_line(&mut self, _line: u64, _plugin: &Plugin) {}
    /// The whole stream is applied and settled (the result is not made
    /// yet).
    fn finished(&mut self, _plugin: &Plugin) {}
}

/// An [`Observer`] that does nothing.
impl Observer for () {}

/// Replays the stream `reader`, named `file` in errors.
pub async fn replay<R: BufRead>(
    file: &str,
    reader: R,
    options: &ReplayOptions,
) -> Result<ReplayOutput, ReplayError> {
    replay_with(file, reader, options, &mut ()).await
}

/// [`replay`] on a new single-threaded tokio runtime.
pub fn replay_blocking<R: BufRead>(
    file: &str,
    reader: R,
    options: &ReplayOptions,
    observer: &mut dyn Observer,
) -> Result<ReplayOutput, ReplayError> {
    runtime()?.block_on(replay_with(file, reader, options, observer))
}

/// [`replay_blocking`], with the stream read and decoded on a thread of its
/// own, ahead of the replay: on two cores, decoding no longer adds to the
/// replay's time. Same output. When the replay stops early (a bad line),
/// the thread ends after the line it is reading; a reader that blocks
/// (a pipe kept open) keeps it until that read returns. The replay's state
/// (every object of the store) is freed on a thread of its own too, after
/// the output is returned.
pub fn replay_pipelined<R: BufRead + Send + 'static>(
    file: &str,
    reader: R,
    options: &ReplayOptions,
    observer: &mut dyn Observer,
) -> Result<ReplayOutput, ReplayError> {
    let source =
        Source::thread(reader, read_options(file, options)).map_err(ReplayError::Runtime)?;
    let teardown = if options.leak_state {
        Teardown::Leak
    } else {
        Teardown::Background
    };
    runtime()?.block_on(replay_from(file, source, options, observer, teardown))
}

fn runtime() -> Result<tokio::runtime::Runtime, ReplayError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(ReplayError::Runtime)
}

fn read_options(file: &str, options: &ReplayOptions) -> ReadOptions {
    ReadOptions {
        file: file.to_owned(),
        max_line_bytes: options.max_line_bytes,
        spool_memory_bytes: options.spool_memory_bytes,
        spool_dir: options.spool_dir.clone(),
    }
}

/// [`replay`], telling `observer` about its progress.
pub async fn replay_with<R: BufRead>(
    file: &str,
    reader: R,
    options: &ReplayOptions,
    observer: &mut dyn Observer,
) -> Result<ReplayOutput, ReplayError> {
    let reads = Reads::new(reader, read_options(file, options));
    let source = Source::Here(Box::new(reads));
    replay_from(file, source, options, observer, Teardown::Here).await
}

/// Where the replay's state is freed once the output is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Teardown {
    Here,
    /// On a thread of its own: freeing a cluster's worth of objects is a
    /// tenth of a replay's time, and nothing waits for it.
    Background,
    /// Never ([`ReplayOptions::leak_state`]).
    Leak,
}

async fn replay_from(
    file: &str,
    mut source: Source<'_>,
    options: &ReplayOptions,
    observer: &mut dyn Observer,
    teardown: Teardown,
) -> Result<ReplayOutput, ReplayError> {
    let mut host = Host::start(file, options);
    let mut output = ReplayOutput::default();
    let result = run(&mut source, options, observer, &mut host, &mut output).await;
    let stopped = host.stop(teardown).await;
    result?;
    stopped?;
    Ok(output)
}

async fn run(
    source: &mut Source<'_>,
    options: &ReplayOptions,
    observer: &mut dyn Observer,
    host: &mut Host,
    output: &mut ReplayOutput,
) -> Result<(), ReplayError> {
    before_first_line(source, options, host, output).await?;
    let mut last_line = 0;
    while let Some(read) = source.next().await {
        let record = match read {
            Read::Record(Ok(record)) => record,
            Read::Record(Err(error)) => {
                skip_or_stop(error, options, observer, output)?;
                continue;
            }
            Read::End(line) => {
                last_line = line;
                break;
            }
            Read::Lookahead(_) => continue,
        };
        observer.position(record.line, record.bytes);
        note_first_ips(&record.event, &mut output.first_ips);
        observer.before_line(record.line, &host.plugin);
        let event = match record.event {
            WatchEvent::Bookmark | WatchEvent::Skipped { .. } => continue,
            WatchEvent::Synced => {
                if !host.synced {
                    let mark = host.plugin.client.mark();
                    host.mark_synced(record.line).await?;
                    let event = TraceEvent {
                        event_type: "SYNCED".to_owned(),
                        kind: None,
                        key: None,
                    };
                    host.record(record.line, Some(event), mark, Vec::new(), output);
                }
                continue;
            }
            event => event,
        };
        // Only a trace shows it (two strings per line otherwise wasted).
        let trace_event = host.trace.then(|| trace_event(&event));
        let change = match host.plugin.store.apply(event) {
            Ok(change) => change,
            Err(error) => {
                let error = StreamError {
                    file: host.file.clone(),
                    line: record.line,
                    error: LineError::Store(error),
                };
                skip_or_stop(error, options, observer, output)?;
                continue;
            }
        };
        host.apply(record.line, trace_event, &change, output)
            .await?;
    }
    if !host.synced {
        // Only when the looked-ahead SYNCED line was not replayed.
        host.mark_synced(last_line).await?;
    }
    observer.finished(&host.plugin);
    (output.result, output.other_class) = host.result(options.lb_class.as_deref());
    Ok(())
}

/// What comes before the first line: the `--config` pools, and a sync
/// right away when the look-ahead found no `SYNCED` line.
async fn before_first_line(
    source: &mut Source<'_>,
    options: &ReplayOptions,
    host: &mut Host,
    output: &mut ReplayOutput,
) -> Result<(), ReplayError> {
    // The --config pools exist before the first line.
    for pool in &options.pools {
        let object = pool.to_object();
        let event = TraceEvent {
            event_type: "ADDED".to_owned(),
            kind: Some(object.kind().to_string()),
            key: Some(object.key()),
        };
        let change = host.plugin.store.upsert(object)?;
        host.apply(0, Some(event), &change, output).await?;
    }
    match source.next().await {
        Some(Read::Lookahead(Ok(true))) => {}
        Some(Read::Lookahead(Ok(false))) => host.mark_synced(0).await?,
        Some(Read::Lookahead(Err(error))) => return Err(error),
        _ => {
            return Err(ReplayError::Worker(
                "the stream was not read ahead".to_owned(),
            ))
        }
    }
    Ok(())
}

fn skip_or_stop(
    error: StreamError,
    options: &ReplayOptions,
    observer: &mut dyn Observer,
    output: &mut ReplayOutput,
) -> Result<(), ReplayError> {
    if error.is_fatal() || !options.keep_going {
        return Err(error.into());
    }
    observer.skipped(&error);
    output.skipped.push(error);
    Ok(())
}

fn trace_event(event: &WatchEvent) -> TraceEvent {
    let (kind, key) = match event {
        WatchEvent::Added(object) | WatchEvent::Modified(object) => {
            (Some(object.kind().to_string()), Some(object.key()))
        }
        WatchEvent::Deleted(target) => (Some(target.kind.to_string()), Some(target.key())),
        WatchEvent::Synced | WatchEvent::Bookmark | WatchEvent::Skipped { .. } => (None, None),
    };
    TraceEvent {
        event_type: event.event_type().as_str().to_owned(),
        kind,
        key,
    }
}

/// The plugin, and the bookkeeping of the lines replayed through it.
struct Host {
    plugin: Plugin,
    /// The stream's name, for errors.
    file: String,
    synced: bool,
    trace: bool,
    check_invariants: bool,
    writes_per_line: u64,
    writes_per_service: u64,
}

impl Host {
    /// Builds everything and starts the manager's worker (on the current
    /// tokio runtime).
    fn start(file: &str, options: &ReplayOptions) -> Self {
        Self {
            plugin: Plugin::start(options),
            file: file.to_owned(),
            synced: false,
            trace: options.trace,
            check_invariants: options.check_invariants,
            writes_per_line: options.writes_per_line,
            writes_per_service: options.writes_per_service,
        }
    }

    /// Marks the manager synced (for `line`; 0 before the first) and waits
    /// for the sync passes.
    async fn mark_synced(&mut self, line: u64) -> Result<(), ReplayError> {
        self.plugin.client.set_line(line);
        let writes = self.begin_line();
        self.plugin.manager.mark_synced();
        self.synced = true;
        self.idle(line, writes).await
    }

    /// Sets the write limit of a new line; returns the writes it allows.
    fn begin_line(&self) -> u64 {
        let services = u64::try_from(self.plugin.store.service_count()).unwrap_or(u64::MAX);
        let writes = self
            .writes_per_service
            .saturating_mul(services)
            .saturating_add(self.writes_per_line);
        let limit = self.plugin.client.attempts().saturating_add(writes);
        self.plugin.client.limit_attempts(limit);
        writes
    }

    /// Waits until the manager is idle; fails if its worker stopped or the
    /// controller went past the line's write limit.
    async fn idle(&mut self, line: u64, writes: u64) -> Result<(), ReplayError> {
        self.plugin.idle().await.map_err(|not_idle| match not_idle {
            NotIdle::Overrun => ReplayError::NoConvergence {
                file: self.file.clone(),
                line,
                writes,
            },
            NotIdle::Stopped(why) => ReplayError::Worker(why),
        })
    }

    /// Delivers a write's event to the chains, waits for the manager (after
    /// sync) and records the step.
    async fn apply(
        &mut self,
        line: u64,
        event: Option<TraceEvent>,
        change: &Change,
        output: &mut ReplayOutput,
    ) -> Result<(), ReplayError> {
        self.plugin.client.set_line(line);
        let mark = self.plugin.client.mark();
        let writes = self.begin_line();
        let errors = match self.plugin.deliver(change).await {
            Ok(()) => Vec::new(),
            Err(error) => {
                tracing::warn!(line, %error, "a handler failed");
                vec![error.to_string()]
            }
        };
        if self.synced {
            self.idle(line, writes).await?;
        }
        self.record(line, event, mark, errors, output);
        Ok(())
    }

    /// Records the step of `line`: what was written and emitted since `mark`
    /// (`event` is `None` only when no trace is kept).
    fn record(
        &self,
        line: u64,
        event: Option<TraceEvent>,
        mark: (usize, usize),
        errors: Vec<String>,
        output: &mut ReplayOutput,
    ) {
        let violations = if self.check_invariants && self.synced {
            self.plugin
                .controller
                .check_invariants()
                .err()
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if !violations.is_empty() {
            output.violations.push((line, violations.clone()));
        }
        let (true, Some(event)) = (self.trace, event) else {
            return;
        };
        let (writes, events) = self.plugin.client.since(mark);
        let holdings = self
            .plugin
            .controller
            .holdings()
            .into_iter()
            .map(|holding| HoldingRecord {
                key: holding.key,
                ips: holding.ips,
                pool: holding.pool,
            })
            .collect();
        output.trace.push(TraceStep {
            line,
            event,
            writes,
            events,
            holdings,
            errors,
            violations,
        });
    }

    /// The §3 result of the store and the controller as they are now, and
    /// the LoadBalancer Services whose class is not `lb_class` (an empty
    /// class being none, as the controller reads it); it takes the Events
    /// out of the client's log (called once, at the end).
    fn result(&self, lb_class: Option<&str>) -> (ReplayResult, BTreeSet<String>) {
        // One pass over the Services (each is built to be read).
        let ours = lb_class.filter(|class| !class.is_empty());
        // Sized once: doubling a 100k-entry Vec touches twice its memory.
        let mut services = Vec::with_capacity(self.plugin.store.service_count());
        let mut other_class = BTreeSet::new();
        self.plugin.store.for_each_service(|key, service| {
            if !is_load_balancer(service) {
                return;
            }
            let class = service
                .spec
                .as_ref()
                .and_then(|spec| spec.load_balancer_class.as_deref())
                .filter(|class| !class.is_empty());
            if class != ours {
                other_class.insert(key.to_owned());
            }
            services.push(service_result(key.to_owned(), service));
        });
        let family = |stats: allocator::FamilyStats| FamilyResult {
            total: Count(stats.total),
            assigned: Count::from(stats.assigned),
        };
        let stats = self.plugin.controller.pool_stats();
        let rejected = self.plugin.controller.rejected_pools();
        let figures = manager::CiliumPoolFigures::new(&stats, &rejected);
        let cilium_pools = self
            .plugin
            .store
            .cilium_pools()
            .iter()
            .map(|pool| cilium_pool_result(pool, &figures))
            .collect();
        let pools = stats
            .into_iter()
            .map(|stats| PoolResult {
                name: stats.name,
                kind: stats.kind.to_string(),
                ipv4: family(stats.ipv4),
                ipv6: family(stats.ipv6),
            })
            .collect();
        let rejected_pools = rejected
            .into_iter()
            .map(|rejected| RejectedPoolResult {
                name: rejected.name,
                kind: rejected.kind.to_string(),
                reason: rejected.reason,
            })
            .collect();
        let result = ReplayResult {
            services,
            events: self.plugin.client.take_events(),
            pools,
            rejected_pools,
            cilium_pools,
        };
        (result, other_class)
    }

    /// Stops the worker, then frees everything as `teardown` says; fails if
    /// the worker had panicked.
    async fn stop(mut self, teardown: Teardown) -> Result<(), ReplayError> {
        let stopped = self.plugin.stop().await.map_err(ReplayError::Worker);
        match teardown {
            Teardown::Here => {}
            Teardown::Background => {
                // If no thread can be had, the closure (and the host) is
                // dropped here instead.
                let _ = std::thread::Builder::new()
                    .name("replay-teardown".to_owned())
                    .spawn(move || drop(self));
            }
            Teardown::Leak => std::mem::forget(self),
        }
        stopped
    }
}

/// Books the addresses a Service's status shows the first time the stream
/// gives it some.
fn note_first_ips(event: &WatchEvent, first_ips: &mut HashMap<String, Vec<String>>) {
    let (WatchEvent::Added(Object::Service { service, .. })
    | WatchEvent::Modified(Object::Service { service, .. })) = event
    else {
        return;
    };
    let ingress = service
        .status
        .as_ref()
        .and_then(|status| status.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    if ingress.is_empty() {
        return;
    }
    let key = service_key_of(&service.metadata);
    first_ips
        .entry(key)
        .or_insert_with(|| ingress.iter().filter_map(|i| i.ip.clone()).collect());
}

/// A Cilium pool's conditions as a host would write them
/// (docs/cilium.md §2.8).
fn cilium_pool_result(
    pool: &CiliumLoadBalancerIPPool,
    figures: &manager::CiliumPoolFigures<'_>,
) -> CiliumPoolResult {
    let conditions = figures
        .conditions(pool)
        .map(|conditions| {
            conditions
                .into_iter()
                .map(|c| ConditionResult {
                    condition_type: c.condition_type.to_owned(),
                    status: c.status.to_owned(),
                    reason: c.reason.to_owned(),
                    message: c.message,
                })
                .collect()
        })
        .unwrap_or_default();
    CiliumPoolResult {
        name: pool.metadata.name.clone().unwrap_or_default(),
        conditions,
    }
}

fn is_load_balancer(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|spec| spec.type_.as_deref())
        .is_some_and(|kind| kind == "LoadBalancer")
}

pub(crate) use manager::status_ips;

/// The pool annotation the controller wrote on a Service.
pub(crate) fn pool_of(service: &Service) -> Option<String> {
    manager::pool_annotation(service).map(str::to_owned)
}

fn service_result(key: String, service: &Service) -> ServiceResult {
    let ips = status_ips(service);
    let pool = pool_of(service);
    let conditions = service
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|c| ConditionResult {
            condition_type: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
        .collect();
    ServiceResult {
        key,
        ips,
        pool,
        conditions,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::client::WriteOutcome;
    use crate::output::render_json;

    fn line(event_type: &str, object: Value) -> String {
        json!({"type": event_type, "object": object}).to_string()
    }

    fn pool(name: &str, addresses: &[&str]) -> Value {
        json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
               "metadata": {"name": name}, "spec": {"addresses": addresses}})
    }

    fn lb(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": "ns"},
               "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}})
    }

    fn lb_with_status(name: &str, ip: &str) -> Value {
        let mut service = lb(name);
        service["status"] = json!({"loadBalancer": {"ingress": [{"ip": ip}]}});
        service
    }

    fn stream(lines: &[String]) -> String {
        lines.iter().map(|line| format!("{line}\n")).collect()
    }

    async fn run(text: &str, options: &ReplayOptions) -> ReplayOutput {
        replay("test.jsonl", text.as_bytes(), options)
            .await
            .unwrap()
    }

    fn reasons(output: &ReplayOutput) -> Vec<(String, String)> {
        let events = &output.result.events;
        events
            .iter()
            .map(|e| (e.key.clone(), e.reason.clone()))
            .collect()
    }

    fn ips(output: &ReplayOutput) -> Vec<(String, Vec<String>)> {
        let services = &output.result.services;
        services
            .iter()
            .map(|s| (s.key.clone(), s.ips.clone()))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn without_synced_the_controller_decides_from_the_first_line() {
        let text = stream(&[
            line("ADDED", lb("early")),
            line("ADDED", pool("p", &["10.0.0.0/30"])),
        ]);
        let output = run(&text, &ReplayOptions::default().trace(true)).await;
        assert_eq!(
            reasons(&output),
            [
                ("ns/early".to_owned(), "AllocationFailed".to_owned()),
                ("ns/early".to_owned(), "IPAllocated".to_owned()),
            ]
        );
        assert_eq!(
            ips(&output),
            [("ns/early".to_owned(), vec!["10.0.0.0".to_owned()])]
        );
        let lines: Vec<u64> = output.trace.iter().map(|step| step.line).collect();
        assert_eq!(lines, [1, 2]);
        assert_eq!(output.trace[1].holdings.len(), 1);
        assert_eq!(output.trace[1].writes.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn before_synced_is_the_initial_list() {
        // newcomer comes first but holds nothing; holder's status is kept.
        let text = stream(&[
            line("ADDED", lb("newcomer")),
            line("ADDED", lb_with_status("holder", "10.0.0.0")),
            line("ADDED", pool("p", &["10.0.0.0/30"])),
            "{\"type\":\"SYNCED\"}".to_owned(),
            line("DELETED", lb("holder")),
        ]);
        let output = run(&text, &ReplayOptions::default().trace(true)).await;
        assert_eq!(
            reasons(&output),
            [("ns/newcomer".to_owned(), "IPAllocated".to_owned())]
        );
        assert_eq!(
            ips(&output),
            [("ns/newcomer".to_owned(), vec!["10.0.0.1".to_owned()])]
        );
        let steps: Vec<(u64, &str)> = output
            .trace
            .iter()
            .map(|step| (step.line, step.event.event_type.as_str()))
            .collect();
        assert_eq!(
            steps,
            [
                (1, "ADDED"),
                (2, "ADDED"),
                (3, "ADDED"),
                (4, "SYNCED"),
                (5, "DELETED")
            ]
        );
        assert!(output.trace[..3]
            .iter()
            .all(|step| step.holdings.is_empty()));
        assert_eq!(output.trace[3].holdings.len(), 2);
        // newcomer got the next address; holder kept its own (only the pool
        // annotation was missing, written after those without addresses).
        let writes: Vec<(&str, String, Option<&str>)> = output.trace[3]
            .writes
            .iter()
            .map(|w| (w.key.as_str(), w.ips[0].to_string(), w.pool.as_deref()))
            .collect();
        assert_eq!(
            writes,
            [
                ("ns/newcomer", "10.0.0.1".to_owned(), Some("p")),
                ("ns/holder", "10.0.0.0".to_owned(), Some("p")),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn config_pools_exist_before_the_first_line() {
        let options = ReplayOptions::default().trace(true).pools(
            crate::parse_legacy_config(
                "c",
                "address-pools:\n- name: legacy\n  addresses: [10.1.0.0/24]\n",
            )
            .unwrap(),
        );
        let output = run(&stream(&[line("ADDED", lb("web"))]), &options).await;
        assert_eq!(
            ips(&output),
            [("ns/web".to_owned(), vec!["10.1.0.0".to_owned()])]
        );
        assert_eq!(output.result.pools[0].name, "legacy");
        assert_eq!(output.trace[0].line, 0);
        assert_eq!(output.trace[0].event.kind.as_deref(), Some("IPAddressPool"));
    }

    #[tokio::test(start_paused = true)]
    async fn each_event_names_the_line_that_emitted_it() {
        let lines_of = |output: &ReplayOutput| -> Vec<(String, String, u64)> {
            output
                .result
                .events
                .iter()
                .map(|e| (e.key.clone(), e.reason.clone(), e.line))
                .collect()
        };
        let event = |key: &str, reason: &str, line: u64| (key.to_owned(), reason.to_owned(), line);
        // Without SYNCED: each event comes from the line it follows.
        let text = stream(&[
            "# a comment".to_owned(),
            line("ADDED", lb("early")),
            line("ADDED", pool("p", &["10.0.0.0/30"])),
        ]);
        let output = run(&text, &ReplayOptions::default()).await;
        assert_eq!(
            lines_of(&output),
            [
                event("ns/early", "AllocationFailed", 2),
                event("ns/early", "IPAllocated", 3)
            ]
        );
        // The passes at sync: the SYNCED line.
        let text = stream(&[
            line("ADDED", lb("a")),
            line("ADDED", pool("p", &["10.0.0.0/30"])),
            "{\"type\":\"SYNCED\"}".to_owned(),
            line("ADDED", lb("b")),
        ]);
        let output = run(&text, &ReplayOptions::default()).await;
        assert_eq!(
            lines_of(&output),
            [
                event("ns/a", "IPAllocated", 3),
                event("ns/b", "IPAllocated", 4)
            ]
        );
        // Before the first line (--config pools, and the sync of a stream
        // without SYNCED): 0.
        let options = ReplayOptions::default().pools(
            crate::parse_legacy_config(
                "c",
                "address-pools:\n- name: l\n  addresses: [10.1.0.0/24]\n",
            )
            .unwrap(),
        );
        let output = run(&stream(&[line("ADDED", lb("web"))]), &options).await;
        assert_eq!(lines_of(&output), [event("ns/web", "IPAllocated", 1)]);
        let json = render_json(&output.result).unwrap();
        assert!(
            json.contains("\"message\": \"Assigned IP [\\\"10.1.0.0\\\"]\",\n      \"line\": 1\n"),
            "{json}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_bad_line_stops_or_with_keep_going_is_skipped() {
        let text = stream(&[
            line("ADDED", pool("p", &["10.0.0.0/30"])),
            "{\"type\":\"ADDDED\"}".to_owned(),
            line("ADDED", lb("web")),
        ]);
        let error = replay("s.jsonl", text.as_bytes(), &ReplayOptions::default())
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "s.jsonl:2: unknown event type \"ADDDED\""
        );

        struct Seen(Vec<String>, Vec<u64>);
        impl Observer for Seen {
            fn line(&mut self, line: u64) {
                self.1.push(line);
            }
            fn skipped(&mut self, error: &StreamError) {
                self.0.push(error.to_string());
            }
        }
        let mut seen = Seen(Vec::new(), Vec::new());
        let options = ReplayOptions::default().keep_going(true);
        let output = replay_with("s.jsonl", text.as_bytes(), &options, &mut seen)
            .await
            .unwrap();
        assert_eq!(seen.0, ["s.jsonl:2: unknown event type \"ADDDED\""]);
        assert_eq!(seen.1, [1, 3]);
        assert_eq!(output.skipped.len(), 1);
        assert_eq!(
            ips(&output),
            [("ns/web".to_owned(), vec!["10.0.0.0".to_owned()])]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_writes_are_retried_to_the_same_result() {
        let mut lines = vec![line("ADDED", pool("p", &["10.0.0.0/24"]))];
        for n in 0..6 {
            lines.push(line("ADDED", lb(&format!("s{n}"))));
        }
        lines.push(line("DELETED", lb("s2")));
        let text = stream(&lines);
        let plain = run(&text, &ReplayOptions::default()).await;
        let options = ReplayOptions::default()
            .trace(true)
            .failures(FailurePlan::every(2));
        let failing = run(&text, &options).await;
        assert_eq!(ips(&plain), ips(&failing));
        let outcomes: Vec<WriteOutcome> = failing
            .trace
            .iter()
            .flat_map(|step| step.writes.iter().map(|w| w.outcome))
            .collect();
        assert!(outcomes.contains(&WriteOutcome::Injected));
        assert!(outcomes.contains(&WriteOutcome::Written));
        let seeded = ReplayOptions::default().failures(FailurePlan::seeded(3, 50).failed());
        assert_eq!(ips(&run(&text, &seeded).await), ips(&plain));
    }

    #[tokio::test(start_paused = true)]
    async fn replays_are_byte_identical_and_invariants_hold() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/quickstart.jsonl"
        ))
        .unwrap();
        let options = ReplayOptions::default().trace(true).check_invariants(true);
        let first = run(&text, &options).await;
        let second = run(&text, &options).await;
        assert_eq!(
            render_json(&first.result).unwrap(),
            render_json(&second.result).unwrap()
        );
        assert_eq!(first.trace, second.trace);
        assert_eq!(first.violations, Vec::new());
        // The controller converged: one write per allocation, none echoed.
        let written = first
            .trace
            .iter()
            .flat_map(|step| &step.writes)
            .filter(|w| w.outcome == WriteOutcome::Written)
            .count();
        assert_eq!(written, first.result.events.len());
        // A stream spilled to a temporary file replays the same.
        let mut spilled = options.clone();
        spilled.spool_memory_bytes = 16;
        let third = run(&text, &spilled).await;
        assert_eq!(first.result, third.result);
        // No temporary file can be made: an error, not the input's fault.
        spilled.spool_dir = Some("/nonexistent/directory".into());
        let error = replay("s.jsonl", text.as_bytes(), &spilled)
            .await
            .unwrap_err();
        assert!(matches!(error, ReplayError::Spool(_)), "{error:?}");
        assert!(
            error
                .to_string()
                .starts_with("cannot keep the stream in a temporary file"),
            "{error}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lb_class_selects_services() {
        let mut classy = lb("classy");
        classy["spec"]["loadBalancerClass"] = json!("metallb");
        let text = stream(&[
            line("ADDED", pool("p", &["10.0.0.0/30"])),
            line("ADDED", classy),
            line("ADDED", lb("plain")),
        ]);
        let output = run(&text, &ReplayOptions::default().lb_class("metallb")).await;
        assert_eq!(
            ips(&output),
            [
                ("ns/classy".to_owned(), vec!["10.0.0.0".to_owned()]),
                ("ns/plain".to_owned(), vec![]),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_controller_past_the_write_limit_fails_the_replay() {
        let text = stream(&[
            line("ADDED", pool("p", &["10.0.0.0/30"])),
            line("ADDED", lb("web")),
        ]);
        let options = ReplayOptions {
            writes_per_line: 0,
            writes_per_service: 0,
            ..ReplayOptions::default()
        };
        let error = replay("s.jsonl", text.as_bytes(), &options)
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "s.jsonl:2: the controller made more than 0 status writes for this line \
             without becoming idle: it does not converge"
        );
    }

    #[test]
    fn blocking_replay_runs_its_own_runtime() {
        let text = stream(&[line("ADDED", pool("p", &["10.0.0.0/30"]))]);
        let output =
            replay_blocking("s", text.as_bytes(), &ReplayOptions::default(), &mut ()).unwrap();
        assert_eq!(output.result.pools.len(), 1);
    }
}
