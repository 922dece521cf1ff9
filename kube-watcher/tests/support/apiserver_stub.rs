//! An API-server stub: a small in-process HTTP server that speaks the few
//! Kubernetes endpoints kube-watcher uses, well enough to test the host
//! without a cluster.
//!
//! - list and watch (with `resourceVersion`, chunked watch events, `410
//!   Gone` for a resourceVersion older than the last compaction) of
//!   Services, Namespaces and `IPAddressPool`s across namespaces;
//! - JSON merge patches of a Service and of its status subresource, and of
//!   a pool's status subresource; strategic merge patches of a Service and
//!   its status (a list is replaced, but one with a merge key, such as
//!   `status.conditions` on `type`, merges on it; `$patch: delete|replace`
//!   honoured), refused with 415 for a custom resource as an API server
//!   does (each write one that watchers see);
//! - Events (`events.k8s.io/v1`: create, patch);
//! - MetalLB's `ConfigurationState` (get, create, status patch), listed by
//!   discovery (`/apis/metallb.io/v1beta1`) only once a test asks for it;
//!   `IPAddressPool`s listed there too unless a test stops serving them
//!   (404 then, as for a missing CRD);
//! - Leases (`coordination.k8s.io/v1`: get, create, replace with the
//!   resourceVersion as precondition);
//! - Cilium's `CiliumLoadBalancerIPPool`s (cluster-scoped: list, watch,
//!   get, merge patch of the status subresource), and their discovery
//!   documents (`/apis/cilium.io/v2`, `/apis/cilium.io/v2alpha1`), served
//!   only at the versions a test installs (404 otherwise, as for a missing
//!   CRD). A merge patch that carries `metadata.resourceVersion` is refused
//!   with 409 when the object has another, as an API server does.
//!
//! Every request is recorded (method, path, query, content type, body and
//! the `x-replica` header); tests can script failures of the next matching
//! requests, hold a kind's list back, end every watch with `410 Gone`,
//! drop every watch connection, or answer a resumed watch with an HTTP
//! `410`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// The collections the stub serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    Service,
    Namespace,
    Pool,
    Lease,
    Event,
    ConfigurationState,
    CiliumPool,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Kind::Service | Kind::Namespace => "v1",
            Kind::Pool | Kind::ConfigurationState => "metallb.io/v1beta1",
            Kind::Lease => "coordination.k8s.io/v1",
            Kind::Event => "events.k8s.io/v1",
            Kind::CiliumPool => "cilium.io/v2",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::Namespace => "Namespace",
            Kind::Pool => "IPAddressPool",
            Kind::Lease => "Lease",
            Kind::Event => "Event",
            Kind::ConfigurationState => "ConfigurationState",
            Kind::CiliumPool => "CiliumLoadBalancerIPPool",
        }
    }

    fn of(value: &Value) -> Option<Kind> {
        match value.get("kind")?.as_str()? {
            "Service" => Some(Kind::Service),
            "Namespace" => Some(Kind::Namespace),
            "IPAddressPool" => Some(Kind::Pool),
            "Lease" => Some(Kind::Lease),
            "Event" => Some(Kind::Event),
            "ConfigurationState" => Some(Kind::ConfigurationState),
            "CiliumLoadBalancerIPPool" => Some(Kind::CiliumPool),
            _ => None,
        }
    }
}

/// One request as the stub received it.
#[derive(Clone, Debug)]
pub(crate) struct Recorded {
    /// Sequence number, from 1.
    pub(crate) seq: u64,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) content_type: String,
    /// The body as JSON (`null` when empty or not JSON).
    pub(crate) body: Value,
    /// The `x-replica` header, if sent.
    pub(crate) replica: Option<String>,
    /// When the stub had read the request (the host bench's clock).
    #[allow(
        dead_code,
        reason = "read by benches/host.rs, which includes this file"
    )]
    pub(crate) at: std::time::Instant,
}

impl Recorded {
    /// Whether this is a write (anything but GET).
    pub(crate) fn is_write(&self) -> bool {
        self.method != "GET"
    }

    /// Whether this is a write of a Service, an Event or a pool (not a
    /// Lease).
    pub(crate) fn is_object_write(&self) -> bool {
        self.is_write() && !self.path.contains("/leases")
    }
}

type Key = (Kind, String, String);

/// A scripted failure: the next `count` requests of `method` whose path
/// ends with `suffix` get `code`.
#[derive(Clone, Debug)]
struct Failure {
    method: String,
    suffix: String,
    code: u16,
    count: u32,
}

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// (resourceVersion, kind, event type, object) of every write.
    /// (resourceVersion, kind, watch line) of every write.
    history: Vec<(u64, Kind, Bytes)>,
    /// Watches from a resourceVersion below this get `410 Gone`.
    compacted: u64,
    /// Whether that `410` answers the watch request itself (as some API
    /// servers and emulators do) rather than coming as an ERROR event in a
    /// `200` stream (as kube-apiserver sends it).
    gone_as_http: bool,
    /// How many watch requests got that HTTP `410`.
    refused_watches: u64,
    watchers: Vec<(Kind, mpsc::UnboundedSender<Bytes>)>,
    requests: Vec<Recorded>,
    failures: Vec<Failure>,
    /// Kinds whose list requests wait until released.
    held: Vec<Kind>,
    /// Whether discovery lists MetalLB's `configurationstates` (its CRD is
    /// installed).
    config_states: bool,
    /// Whether pools' `status.conditions` is pruned, as MetalLB's own CRD
    /// (whose schema lacks it) makes the API server do.
    prune_pool_conditions: bool,
    /// The versions of `cilium.io` that serve `ciliumloadbalancerippools`.
    cilium_versions: Vec<&'static str>,
    /// `ipaddresspools` is not served (MetalLB's CRD is not installed): its
    /// requests are answered 404 and discovery does not list it.
    pools_unserved: bool,
    /// Discovery documents are not served (404), as with some API
    /// emulators, though the resources are.
    no_discovery: bool,
    created: u64,
}

impl State {
    /// Writes `object` (or deletes it when `event` is DELETED) and tells the
    /// watchers.
    fn write(&mut self, kind: Kind, event: &'static str, mut object: Value) -> Value {
        self.rv += 1;
        let rv = self.rv;
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.insert("resourceVersion".to_owned(), json!(rv.to_string()));
        }
        if let Some(map) = object.as_object_mut() {
            map.insert("apiVersion".to_owned(), json!(kind.api_version()));
            map.insert("kind".to_owned(), json!(kind.kind()));
        }
        let key = key_of(kind, &object);
        if event == "DELETED" {
            self.objects.remove(&key);
        } else {
            self.objects.insert(key, object.clone());
        }
        let line = watch_line(event, &object);
        self.history.push((rv, kind, line.clone()));
        self.watchers
            .retain(|(watched, sender)| *watched != kind || sender.send(line.clone()).is_ok());
        object
    }

    fn create(&mut self, kind: Kind, mut object: Value) -> Value {
        self.created += 1;
        let created = self.created;
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata
                .entry("uid")
                .or_insert_with(|| json!(format!("uid-{created}")));
            // Custom resources have a generation; a Service has none (its
            // registry strategy never sets one), so its conditions carry no
            // observedGeneration.
            if matches!(kind, Kind::Pool | Kind::CiliumPool) {
                metadata.entry("generation").or_insert(json!(1));
            }
            metadata.entry("creationTimestamp").or_insert_with(|| {
                json!(format!(
                    "2024-01-01T{:02}:{:02}:{:02}Z",
                    created / 3600 % 24,
                    created / 60 % 60,
                    created % 60
                ))
            });
        }
        self.write(kind, "ADDED", object)
    }
}

fn key_of(kind: Kind, object: &Value) -> Key {
    let metadata = object.get("metadata");
    let text = |field: &str| {
        metadata
            .and_then(|m| m.get(field))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    (kind, text("namespace"), text("name"))
}

/// One watch event, `type` first as an API server writes it (a client
/// that meets `object` first must buffer it to learn what it is).
fn watch_line(event: &str, object: &Value) -> Bytes {
    let mut line = format!("{{\"type\":{},\"object\":", json!(event));
    line.push_str(&object.to_string());
    line.push_str("}\n");
    Bytes::from(line)
}

/// RFC 7386 JSON merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Some(map) = target.as_object_mut() {
                for (field, value) in fields {
                    if value.is_null() {
                        map.remove(field);
                    } else {
                        merge_patch(map.entry(field.clone()).or_insert(Value::Null), value);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// The merge key of the list at `path` (dotted, from the object's root) in
/// a Service, as the Kubernetes API declares it (`patchMergeKey`); lists
/// without one are replaced whole by a strategic merge patch.
fn service_merge_key(path: &str) -> Option<&'static str> {
    match path {
        "status.conditions" => Some("type"),
        "metadata.ownerReferences" => Some("uid"),
        "spec.ports" => Some("port"),
        _ => None,
    }
}

/// A strategic merge patch as the API server applies one: maps merge
/// (`null` deletes a field, `$patch: delete` the map, `$patch: replace`
/// replaces it), a list with a merge key merges element by element on that
/// key (`$patch: delete` removes an element, `$patch: replace` replaces the
/// list by the others), any other list is replaced.
pub(crate) fn strategic_merge(
    target: &mut Value,
    patch: &Value,
    path: &str,
    merge_key: &dyn Fn(&str) -> Option<&'static str>,
) -> Result<(), String> {
    match patch {
        Value::Object(fields) => {
            match fields.get("$patch").and_then(Value::as_str) {
                Some("replace") => {
                    let mut replaced = fields.clone();
                    replaced.remove("$patch");
                    *target = Value::Object(replaced);
                    return Ok(());
                }
                Some("delete") => {
                    *target = Value::Null;
                    return Ok(());
                }
                Some(other) => return Err(format!("unknown $patch {other:?} at {path}")),
                None => {}
            }
            if !target.is_object() {
                *target = json!({});
            }
            let Some(map) = target.as_object_mut() else {
                return Ok(());
            };
            for (field, value) in fields {
                if field.starts_with('$') {
                    return Err(format!(
                        "directive {field} at {path} is not served by the stub"
                    ));
                }
                let child = if path.is_empty() {
                    field.clone()
                } else {
                    format!("{path}.{field}")
                };
                if value.is_null() {
                    map.remove(field);
                    continue;
                }
                let slot = map.entry(field.clone()).or_insert(Value::Null);
                match (value, merge_key(&child)) {
                    (Value::Array(items), Some(key)) => {
                        merge_list(slot, items, key, &child, merge_key)?;
                    }
                    _ => strategic_merge(slot, value, &child, merge_key)?,
                }
                if slot.is_null() {
                    map.remove(field);
                }
            }
            Ok(())
        }
        other => {
            *target = other.clone();
            Ok(())
        }
    }
}

/// Merges `items` into the list `target` on `key` (see [`strategic_merge`]).
fn merge_list(
    target: &mut Value,
    items: &[Value],
    key: &str,
    path: &str,
    merge_key: &dyn Fn(&str) -> Option<&'static str>,
) -> Result<(), String> {
    if items
        .iter()
        .any(|item| item.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        let kept = items
            .iter()
            .filter(|item| item.get("$patch").is_none())
            .cloned()
            .collect();
        *target = Value::Array(kept);
        return Ok(());
    }
    if !target.is_array() {
        *target = json!([]);
    }
    let Some(list) = target.as_array_mut() else {
        return Ok(());
    };
    for item in items {
        let Some(id) = item.get(key) else {
            return Err(format!("an element of {path} has no merge key {key:?}"));
        };
        let at = list
            .iter()
            .position(|existing| existing.get(key) == Some(id));
        match (item.get("$patch").and_then(Value::as_str), at) {
            (Some("delete"), Some(at)) => {
                list.remove(at);
            }
            (Some("delete"), None) => {}
            (Some(other), _) => return Err(format!("unknown $patch {other:?} in {path}")),
            (None, Some(at)) => {
                if let Some(existing) = list.get_mut(at) {
                    strategic_merge(existing, item, path, merge_key)?;
                }
            }
            (None, None) => list.push(item.clone()),
        }
    }
    Ok(())
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn full(status: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    full(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code
        }),
    )
}

/// The running stub. Dropping it stops the server.
pub(crate) struct ApiServerStub {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
    cancel: CancellationToken,
}

impl Drop for ApiServerStub {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl ApiServerStub {
    /// Starts the stub on a free loopback port.
    pub(crate) async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let changed = watch::Sender::new(0);
        let cancel = CancellationToken::new();
        let server = Server {
            state: Arc::clone(&state),
            changed: changed.clone(),
        };
        let stop = cancel.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    () = stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(_) => continue,
                    },
                };
                // As Go's net/http does: without it, a watch event written
                // after the response headers waits for the client's delayed
                // ACK (Nagle), ~40 ms of real time, during which a paused
                // clock runs on from timer to timer.
                let _ = stream.set_nodelay(true);
                let server = server.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let server = server.clone();
                        async move { Ok::<_, Infallible>(server.handle(request).await) }
                    });
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        () = stop.cancelled() => {}
                        _ = connection => {}
                    }
                });
            }
        });
        Self {
            addr,
            state,
            changed,
            cancel,
        }
    }

    /// A kube client for this stub; `replica` is sent as `x-replica`.
    pub(crate) fn client(&self, replica: &str) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().unwrap());
        config
            .headers
            .push(("x-replica".parse().unwrap(), replica.parse().unwrap()));
        config.read_timeout = None;
        kube::Client::try_from(config).unwrap()
    }

    /// The stub's base URL.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig that points at this stub (namespace `kube-system`).
    pub(crate) fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: stub, cluster: {{server: \"{}\"}}}}]\n\
             users: [{{name: stub, user: {{}}}}]\n\
             contexts: [{{name: stub, context: {{cluster: stub, user: stub, namespace: kube-system}}}}]\n\
             current-context: stub\n",
            self.url()
        )
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Creates (or replaces) `object`; its kind comes from its `kind`.
    pub(crate) fn create(&self, object: Value) -> Value {
        let kind = Kind::of(&object).expect("a kind the stub serves");
        let written = self.lock().create(kind, object);
        self.bump();
        written
    }

    /// Deletes the object of `kind` at `namespace`/`name`.
    pub(crate) fn delete(&self, kind: Kind, namespace: &str, name: &str) {
        let mut state = self.lock();
        let key = (kind, namespace.to_owned(), name.to_owned());
        if let Some(object) = state.objects.get(&key).cloned() {
            state.write(kind, "DELETED", object);
        }
        drop(state);
        self.bump();
    }

    /// The stored object, if any.
    pub(crate) fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .get(&(kind, namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every Event object stored.
    pub(crate) fn events(&self) -> Vec<Value> {
        self.lock()
            .objects
            .iter()
            .filter(|((kind, _, _), _)| *kind == Kind::Event)
            .map(|(_, event)| event.clone())
            .collect()
    }

    /// Every request so far.
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// The requests after the one numbered `seq` (so a caller reads each
    /// once).
    #[allow(
        dead_code,
        reason = "used by benches/host.rs, which includes this file"
    )]
    pub(crate) fn requests_after(&self, seq: u64) -> Vec<Recorded> {
        let state = self.lock();
        let from = usize::try_from(seq).unwrap_or(usize::MAX);
        state.requests.get(from..).unwrap_or_default().to_vec()
    }

    /// The sequence number of the last request (0: none yet).
    pub(crate) fn last_seq(&self) -> u64 {
        self.lock().requests.last().map_or(0, |r| r.seq)
    }

    /// The next `count` requests of `method` whose path ends with `suffix`
    /// fail with `code`.
    pub(crate) fn fail_next(&self, method: &str, suffix: &str, code: u16, count: u32) {
        self.lock().failures.push(Failure {
            method: method.to_owned(),
            suffix: suffix.to_owned(),
            code,
            count,
        });
    }

    /// Forgets every scripted failure.
    pub(crate) fn clear_failures(&self) {
        self.lock().failures.clear();
    }

    /// Discovery lists `configurationstates` from now on, as if MetalLB
    /// v0.15.3's CRD were installed.
    pub(crate) fn serve_configuration_states(&self) {
        self.lock().config_states = true;
    }

    /// Whether `ipaddresspools` is served (it is unless a test says not).
    #[allow(
        dead_code,
        reason = "used by the tests, not by benches/host.rs, which includes this file"
    )]
    pub(crate) fn serve_pools(&self, served: bool) {
        self.lock().pools_unserved = !served;
        self.bump();
    }

    /// Discovery documents answer 404 from now on; the resources stay
    /// served.
    #[allow(
        dead_code,
        reason = "used by the tests, not by benches/host.rs, which includes this file"
    )]
    pub(crate) fn hide_discovery(&self) {
        self.lock().no_discovery = true;
    }

    /// `cilium.io` serves `ciliumloadbalancerippools` at `versions` from
    /// now on (the CRD installed; empty: removed).
    #[allow(
        dead_code,
        reason = "used by the tests, not by benches/host.rs, which includes this file"
    )]
    pub(crate) fn serve_cilium(&self, versions: &[&'static str]) {
        self.lock().cilium_versions = versions.to_vec();
        self.bump();
    }

    /// Pools' `status.conditions` is pruned from now on, as with MetalLB's
    /// own IPAddressPool CRD.
    pub(crate) fn prune_pool_conditions(&self) {
        self.lock().prune_pool_conditions = true;
    }

    /// List requests of `kind` wait until [`release`](Self::release).
    pub(crate) fn hold_lists(&self, kind: Kind) {
        self.lock().held.push(kind);
    }

    /// Lets the held lists of `kind` go.
    pub(crate) fn release(&self, kind: Kind) {
        self.lock().held.retain(|held| *held != kind);
        self.bump();
    }

    /// Ends every open watch with a `410 Gone` ERROR event and compacts the
    /// history, so resuming from an older resourceVersion is refused too:
    /// every watcher must relist.
    pub(crate) fn expire_watches(&self) {
        let mut state = self.lock();
        state.compacted = state.rv;
        let gone = watch_line(
            "ERROR",
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "too old resource version", "reason": "Expired", "code": 410}),
        );
        for (_, sender) in std::mem::take(&mut state.watchers) {
            let _ = sender.send(gone.clone());
        }
        drop(state);
        self.bump();
    }

    /// Compacts the history and closes every open watch connection; from
    /// now on a watch from an older resourceVersion is answered with an
    /// HTTP `410`, so watchers resuming after the disconnect must relist.
    pub(crate) fn compact_and_disconnect(&self) {
        let mut state = self.lock();
        // Even the latest resourceVersion is too old: every resumed watch
        // is refused, until a write gives a list a newer one.
        state.compacted = state.rv + 1;
        state.gone_as_http = true;
        state.watchers.clear();
        drop(state);
        self.bump();
    }

    /// How many watch requests [`ApiServerStub::compact_and_disconnect`]
    /// made the stub refuse with an HTTP `410`.
    pub(crate) fn refused_watches(&self) -> u64 {
        self.lock().refused_watches
    }

    /// Closes every open watch connection (a disconnect): watchers resume
    /// from their last resourceVersion.
    pub(crate) fn disconnect_watches(&self) {
        self.lock().watchers.clear();
        self.bump();
    }

    /// Another holder writes itself into the Lease, as a replica that took
    /// it over would.
    pub(crate) fn steal_lease(&self, namespace: &str, name: &str, holder: &str) {
        let mut state = self.lock();
        let key = (Kind::Lease, namespace.to_owned(), name.to_owned());
        let mut lease = state.objects.get(&key).cloned().expect("the lease exists");
        lease["spec"]["holderIdentity"] = json!(holder);
        lease["spec"]["renewTime"] = json!("2030-01-01T00:00:00.000000Z");
        state.write(Kind::Lease, "MODIFIED", lease);
        drop(state);
        self.bump();
    }

    /// Waits (at most 20 s) until `check` holds for the recorded requests
    /// and objects; re-checked after every request and write.
    pub(crate) async fn wait_until<F>(&self, what: &str, mut check: F)
    where
        F: FnMut(&ApiServerStub) -> bool,
    {
        let mut changed = self.changed.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                changed.borrow_and_update();
                if check(self) {
                    return;
                }
                changed.changed().await.unwrap();
            }
        })
        .await;
        if waited.is_err() {
            for r in self
                .requests()
                .iter()
                .filter(|r| !r.path.contains("/leases"))
            {
                let replica = r.replica.as_deref().unwrap_or("-");
                eprintln!(
                    "{} {replica} {} {}?{} {}",
                    r.seq, r.method, r.path, r.query, r.body
                );
            }
            panic!("timed out waiting until {what} (requests above, leases left out)");
        }
    }
}

#[derive(Clone)]
struct Server {
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
}

/// What a path names.
enum Target {
    /// A collection across namespaces (list, watch).
    All(Kind),
    /// A collection in a namespace (create).
    Namespaced(Kind, String),
    /// One object, or its status subresource.
    One {
        kind: Kind,
        namespace: String,
        name: String,
        status: bool,
    },
}

fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let kind_of = |plural: &str| match plural {
        "services" => Some(Kind::Service),
        "namespaces" => Some(Kind::Namespace),
        "ipaddresspools" => Some(Kind::Pool),
        "leases" => Some(Kind::Lease),
        "events" => Some(Kind::Event),
        "configurationstates" => Some(Kind::ConfigurationState),
        "ciliumloadbalancerippools" => Some(Kind::CiliumPool),
        _ => None,
    };
    // Strip the group/version prefix.
    let rest: &[&str] = match parts.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => return None,
    };
    match rest {
        [plural] => Some(Target::All(kind_of(plural)?)),
        // Cluster-scoped custom resources.
        [plural @ "ciliumloadbalancerippools", name] => Some(Target::One {
            kind: kind_of(plural)?,
            namespace: String::new(),
            name: (*name).to_owned(),
            status: false,
        }),
        [plural @ "ciliumloadbalancerippools", name, "status"] => Some(Target::One {
            kind: kind_of(plural)?,
            namespace: String::new(),
            name: (*name).to_owned(),
            status: true,
        }),
        ["namespaces", name] => Some(Target::One {
            kind: Kind::Namespace,
            namespace: String::new(),
            name: (*name).to_owned(),
            status: false,
        }),
        ["namespaces", namespace, plural] => Some(Target::Namespaced(
            kind_of(plural)?,
            (*namespace).to_owned(),
        )),
        ["namespaces", namespace, plural, name] => Some(Target::One {
            kind: kind_of(plural)?,
            namespace: (*namespace).to_owned(),
            name: (*name).to_owned(),
            status: false,
        }),
        ["namespaces", namespace, plural, name, "status"] => Some(Target::One {
            kind: kind_of(plural)?,
            namespace: (*namespace).to_owned(),
            name: (*name).to_owned(),
            status: true,
        }),
        _ => None,
    }
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

impl Server {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let query = request.uri().query().unwrap_or_default().to_owned();
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let content_type = header("content-type").unwrap_or_default();
        let merge = content_type.starts_with("application/merge-patch+json");
        let strategic = content_type.starts_with("application/strategic-merge-patch+json");
        let replica = header("x-replica");
        let bytes = match request.into_body().collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => Bytes::new(),
        };
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let at = std::time::Instant::now();
        let failure = {
            let mut state = self.lock();
            let seq = state.requests.len() as u64 + 1;
            state.requests.push(Recorded {
                seq,
                method: method.to_string(),
                path: path.clone(),
                query: query.clone(),
                content_type: content_type.clone(),
                body: body.clone(),
                replica,
                at,
            });
            let failure = state
                .failures
                .iter_mut()
                .find(|f| f.count > 0 && f.method == method.as_str() && path.ends_with(&f.suffix));
            failure.map(|f| {
                f.count -= 1;
                f.code
            })
        };
        self.bump();
        if let Some(code) = failure {
            let reason = match code {
                403 => "Forbidden",
                404 => "NotFound",
                409 => "Conflict",
                _ => "InternalError",
            };
            return status(code, reason, "scripted failure");
        }
        let discovery_path = path == "/apis/metallb.io/v1beta1"
            || path
                .strip_prefix("/apis/cilium.io/")
                .is_some_and(|version| !version.contains('/'));
        if method == Method::GET && discovery_path && self.lock().no_discovery {
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
        if method == Method::GET && path == "/apis/metallb.io/v1beta1" {
            return self.discovery();
        }
        if let Some(version) = path.strip_prefix("/apis/cilium.io/") {
            let version = version.split('/').next().unwrap_or_default();
            if !self.lock().cilium_versions.contains(&version) {
                return status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                );
            }
            if method == Method::GET && path.trim_end_matches('/').ends_with(version) {
                return self.cilium_discovery(version);
            }
        }
        let unserved = |path: &str| path.split('/').any(|part| part == "ipaddresspools");
        if self.lock().pools_unserved && unserved(&path) {
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
        let Some(target) = parse_path(&path) else {
            return status(404, "NotFound", "unknown path");
        };
        let watching = query_param(&query, "watch").is_some_and(|w| w == "true" || w == "1");
        match (method, target) {
            (Method::GET, Target::All(kind)) if watching => self.watch(kind, &query),
            (Method::GET, Target::All(kind)) => self.list(kind, &query).await,
            (
                Method::GET,
                Target::One {
                    kind,
                    namespace,
                    name,
                    ..
                },
            ) => match self.lock().objects.get(&(kind, namespace, name)) {
                Some(object) => full(StatusCode::OK, object),
                None => status(404, "NotFound", "not found"),
            },
            (Method::POST, Target::Namespaced(kind, namespace)) => {
                let mut object = body;
                // As an API server: a name is a DNS subdomain.
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                if name.len() > 253 {
                    let message = format!(
                        "metadata.name: Invalid value: {name:?}: must be no more than 253 characters"
                    );
                    return status(422, "Invalid", &message);
                }
                // And the limits of events.k8s.io/v1 on a new Event.
                if kind == Kind::Event {
                    for (field, max) in [("note", 1024), ("reportingInstance", 128)] {
                        let text = object[field].as_str().unwrap_or_default();
                        if text.len() > max {
                            let message = format!(
                                "{field}: Invalid value: {text:?}: must have at most {max} characters"
                            );
                            return status(422, "Invalid", &message);
                        }
                    }
                }
                object["metadata"]["namespace"] = json!(namespace);
                // A kind with a status subresource ignores status on create.
                if kind == Kind::ConfigurationState {
                    if let Some(map) = object.as_object_mut() {
                        map.remove("status");
                    }
                }
                let key = key_of(kind, &object);
                let mut state = self.lock();
                if state.objects.contains_key(&key) {
                    return status(409, "AlreadyExists", "already exists");
                }
                let created = state.create(kind, object);
                drop(state);
                self.bump();
                full(StatusCode::CREATED, &created)
            }
            (
                Method::PUT,
                Target::One {
                    kind,
                    namespace,
                    name,
                    ..
                },
            ) => {
                let mut state = self.lock();
                let key = (kind, namespace, name);
                let Some(current) = state.objects.get(&key) else {
                    return status(404, "NotFound", "not found");
                };
                if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
                    return status(409, "Conflict", "the object has been modified");
                }
                let written = state.write(kind, "MODIFIED", body);
                drop(state);
                self.bump();
                full(StatusCode::OK, &written)
            }
            (
                Method::PATCH,
                Target::One {
                    kind,
                    namespace,
                    name,
                    status: sub,
                },
            ) => {
                // As an API server: no strategic merge for custom resources.
                let custom = matches!(
                    kind,
                    Kind::Pool | Kind::ConfigurationState | Kind::CiliumPool
                );
                if !(merge || strategic && !custom) {
                    return status(
                        415,
                        "UnsupportedMediaType",
                        "merge patches, and strategic merge patches of built-in kinds, only",
                    );
                }
                let mut state = self.lock();
                let key = (kind, namespace, name);
                let Some(mut object) = state.objects.get(&key).cloned() else {
                    return status(404, "NotFound", "not found");
                };
                // A resourceVersion in the patch is a precondition.
                let precondition = &body["metadata"]["resourceVersion"];
                if !precondition.is_null() && *precondition != object["metadata"]["resourceVersion"]
                {
                    return status(409, "Conflict", "the object has been modified");
                }
                // The status subresource takes only status; the object
                // ignores status (as an API server does).
                let patch = match (sub, body) {
                    (true, Value::Object(mut fields)) => {
                        json!({"status": fields.remove("status").unwrap_or(Value::Null)})
                    }
                    (false, Value::Object(mut fields)) => {
                        fields.remove("status");
                        Value::Object(fields)
                    }
                    (_, other) => other,
                };
                // A spec change is a new generation (of a kind that has one).
                if !sub && patch.get("spec").is_some() && object["metadata"]["generation"].is_i64()
                {
                    let generation = object["metadata"]["generation"].as_i64().unwrap_or(0);
                    object["metadata"]["generation"] = json!(generation + 1);
                }
                if strategic {
                    let merged = strategic_merge(&mut object, &patch, "", &service_merge_key);
                    if let Err(message) = merged {
                        return status(400, "BadRequest", &message);
                    }
                } else {
                    merge_patch(&mut object, &patch);
                }
                if kind == Kind::Pool && state.prune_pool_conditions {
                    if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
                        status.remove("conditions");
                    }
                }
                let written = state.write(kind, "MODIFIED", object);
                drop(state);
                self.bump();
                full(StatusCode::OK, &written)
            }
            _ => status(405, "MethodNotAllowed", "not served by the stub"),
        }
    }

    /// The resources of `metallb.io/v1beta1`, as discovery lists them.
    fn discovery(&self) -> Response<Body> {
        let resource = |name: &str, kind: &str, verbs: Value| {
            json!({"name": name, "singularName": "", "namespaced": true, "kind": kind,
                   "verbs": verbs})
        };
        let all = json!([
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "create",
            "update",
            "watch"
        ]);
        let status_verbs = json!(["get", "patch", "update"]);
        let (pools, config_states) = {
            let state = self.lock();
            (!state.pools_unserved, state.config_states)
        };
        if !pools && !config_states {
            // No CRD of the group: the group version is not served.
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
        let mut resources = Vec::new();
        if pools {
            resources.push(resource("ipaddresspools", "IPAddressPool", all.clone()));
            resources.push(resource(
                "ipaddresspools/status",
                "IPAddressPool",
                status_verbs.clone(),
            ));
        }
        if config_states {
            resources.push(resource("configurationstates", "ConfigurationState", all));
            resources.push(resource(
                "configurationstates/status",
                "ConfigurationState",
                status_verbs,
            ));
        }
        full(
            StatusCode::OK,
            &json!({"kind": "APIResourceList", "apiVersion": "v1",
                    "groupVersion": "metallb.io/v1beta1", "resources": resources}),
        )
    }

    /// The resources of `cilium.io/VERSION`, as discovery lists them.
    fn cilium_discovery(&self, version: &str) -> Response<Body> {
        let resource = |name: &str, verbs: Value| {
            json!({"name": name, "singularName": "ciliumloadbalancerippool",
                   "namespaced": false, "kind": "CiliumLoadBalancerIPPool", "verbs": verbs})
        };
        full(
            StatusCode::OK,
            &json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": format!("cilium.io/{version}"),
            "resources": [
                resource("ciliumloadbalancerippools",
                         json!(["delete", "deletecollection", "get", "list", "patch",
                                "create", "update", "watch"])),
                resource("ciliumloadbalancerippools/status",
                         json!(["get", "patch", "update"])),
            ]}),
        )
    }

    /// A list, in pages of `limit` when asked (the `continue` token is
    /// `RV:NAMESPACE/NAME` of the last item sent, and every page reports the
    /// first page's resourceVersion, as an API server does).
    async fn list(&self, kind: Kind, query: &str) -> Response<Body> {
        let mut changed = self.changed.subscribe();
        while self.lock().held.contains(&kind) {
            if changed.changed().await.is_err() {
                break;
            }
        }
        let limit: usize = query_param(query, "limit")
            .and_then(|limit| limit.parse().ok())
            .filter(|limit| *limit > 0)
            .unwrap_or(usize::MAX);
        let token = query_param(query, "continue")
            .filter(|token| !token.is_empty())
            .and_then(|token| {
                let decoded = token.replace("%2F", "/").replace("%3A", ":");
                let (rv, key) = decoded.split_once(':')?;
                let (namespace, name) = key.split_once('/')?;
                Some((rv.to_owned(), namespace.to_owned(), name.to_owned()))
            });
        let state = self.lock();
        let rv = token
            .as_ref()
            .map_or_else(|| state.rv.to_string(), |(rv, _, _)| rv.clone());
        let from = match &token {
            Some((_, namespace, name)) => {
                std::ops::Bound::Excluded((kind, namespace.clone(), name.clone()))
            }
            None => std::ops::Bound::Included((kind, String::new(), String::new())),
        };
        let mut items: Vec<&Value> = Vec::new();
        let mut more = None;
        for ((k, _, _), object) in state.objects.range((from, std::ops::Bound::Unbounded)) {
            if *k != kind {
                break;
            }
            if items.len() == limit {
                more = items
                    .last()
                    .map(|last| key_of(kind, last))
                    .map(|(_, ns, n)| format!("{rv}:{ns}/{n}"));
                break;
            }
            items.push(object);
        }
        let body = json!({
            "apiVersion": kind.api_version(),
            "kind": format!("{}List", kind.kind()),
            "metadata": {"resourceVersion": rv, "continue": more},
            "items": items,
        });
        drop(state);
        full(StatusCode::OK, &body)
    }

    fn watch(&self, kind: Kind, query: &str) -> Response<Body> {
        let from: u64 = query_param(query, "resourceVersion")
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0);
        let (sender, receiver) = mpsc::unbounded_channel::<Bytes>();
        {
            let mut state = self.lock();
            if from < state.compacted && state.gone_as_http {
                state.refused_watches += 1;
                return status(410, "Expired", "too old resource version");
            }
            if from < state.compacted {
                let gone = watch_line(
                    "ERROR",
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "message": "too old resource version",
                            "reason": "Expired", "code": 410}),
                );
                let _ = sender.send(gone);
            } else {
                for (rv, k, line) in &state.history {
                    if *k == kind && *rv > from {
                        let _ = sender.send(line.clone());
                    }
                }
                state.watchers.push((kind, sender));
            }
        }
        // Lines that queued up while the connection was busy go out as one
        // frame (one write, not one per event), as an API server's buffered
        // writer sends them.
        let stream = futures::stream::unfold(receiver, |mut receiver| async move {
            let first = receiver.recv().await?;
            let mut batch = Vec::from(first.as_ref());
            while batch.len() < 64 * 1024 {
                let Ok(line) = receiver.try_recv() else { break };
                batch.extend_from_slice(&line);
            }
            Some((
                Ok::<_, Infallible>(Frame::data(Bytes::from(batch))),
                receiver,
            ))
        });
        let mut response = Response::new(StreamBody::new(stream).boxed_unsync());
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        response
    }
}
