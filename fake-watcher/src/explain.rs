//! `fake-watcher explain` (docs/replay.md §3.1): replays a stream and
//! reports the decision for one Service at its end, or just after a given
//! line, as the controller's own [`manager::AllocatingController::explain`]
//! sees it: whether it is handled, what it asks for, what it shows, each
//! candidate pool in docs/allocation.md §4.4 order with why it was taken or
//! skipped, and the outcome. The document is [`ExplainDocument`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::BufRead;
use std::net::IpAddr;

use allocator::{AllocError, Family, PoolKind, Step, Verdict};
use manager::{Judgement, NotHandled, ServiceCondition, CONDITION_TYPE};
use serde::Serialize;

use crate::client::EventRecord;
use crate::output::{OutputError, OutputFormat};
use crate::plugin::Plugin;
use crate::replay::{replay_pipelined, Observer, ReplayError, ReplayOptions};

/// The `explain` document (`--output json`); keys always present, in this
/// order; more may be added.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExplainDocument {
    /// `namespace/name`.
    pub key: String,
    /// `--at LINE`, or `null` for the end of the stream.
    pub at_line: Option<u64>,
    /// Whether the controller handles the Service.
    pub handled: bool,
    /// Why not, when it does not.
    pub not_handled: Option<String>,
    pub asks: AsksDocument,
    pub shows: ShowsDocument,
    /// `requested-addresses`, `requested-pool`, `pool-order`, or `null`
    /// when no pool is looked at (not handled, no cluster IP, invalid).
    pub step: Option<&'static str>,
    /// Step 1 for a Service that holds addresses: may it keep them?
    pub keep: Option<KeepDocument>,
    /// Candidate pools in §4.4 order.
    pub pools: Vec<PoolDocument>,
    pub outcome: OutcomeDocument,
    /// The Events emitted for the Service so far, in order.
    pub events: Vec<EventDocument>,
}

/// What the Service asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AsksDocument {
    /// Requested addresses (`loadBalancerIPs`, `spec.loadBalancerIP`).
    pub addresses: Vec<String>,
    /// Why the requested addresses are invalid, if they are.
    pub invalid: Option<String>,
    /// The requested pool (`address-pool`).
    pub pool: Option<String>,
    /// `allow-shared-ip`, or `null`.
    pub sharing_key: Option<String>,
    /// The pod selector of an `externalTrafficPolicy: Local` Service, or
    /// `null`.
    pub backend_key: Option<String>,
    /// `PORT/PROTOCOL`.
    pub ports: Vec<String>,
    /// `single-stack IPv4`, `single-stack IPv6`, `dual-stack (required)`,
    /// `dual-stack (preferred)`, or `null` without a cluster IP.
    pub families: Option<String>,
    pub ip_family_policy: Option<String>,
    pub ip_families: Vec<String>,
    pub cluster_ips: Vec<String>,
    /// Old-prefix annotations in effect.
    pub deprecated_annotations: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub namespace_labels: BTreeMap<String, String>,
}

/// What the Service's object shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShowsDocument {
    /// `status.loadBalancer.ingress[].ip`.
    pub ips: Vec<String>,
    /// The `metallb.io/ip-allocated-from-pool` annotation.
    pub pool: Option<String>,
    /// The `metallb.io/AddressAssigned` condition.
    pub condition: Option<ConditionDocument>,
}

/// A condition as written to `status.conditions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConditionDocument {
    #[serde(rename = "type")]
    pub condition_type: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

impl From<&ServiceCondition> for ConditionDocument {
    fn from(condition: &ServiceCondition) -> Self {
        Self {
            condition_type: CONDITION_TYPE.to_owned(),
            status: condition.status().to_owned(),
            reason: condition.reason.clone(),
            message: condition.message.clone(),
        }
    }
}

/// Step 1 of §4.4.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeepDocument {
    pub allowed: bool,
    /// Why not, when not.
    pub reason: Option<String>,
}

/// One candidate pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolDocument {
    pub name: String,
    /// `IPAddressPool` or `CiliumLoadBalancerIPPool`.
    pub kind: String,
    /// `holds`, `fits`, `namespace-not-served`, `service-selector-mismatch`,
    /// `auto-assign-off`, `no-family`, `full`, `sharing-refused` or
    /// `refused`.
    pub verdict: &'static str,
    /// The pool the Service holds from or gets its addresses from.
    pub chosen: bool,
    /// The addresses held or that would be given.
    pub ips: Vec<String>,
    /// The family of `no-family`, `full` and `sharing-refused`.
    pub family: Option<String>,
    /// The verdict in words.
    pub message: String,
}

/// What the Service ends with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OutcomeDocument {
    /// It holds (or would be given) addresses.
    pub assigned: bool,
    pub ips: Vec<String>,
    pub pool: Option<String>,
    /// Why it gets nothing, when it does not.
    pub error: Option<String>,
}

/// An Event of the Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventDocument {
    #[serde(rename = "type")]
    pub event_type: String,
    pub reason: String,
    pub message: String,
}

/// Replays `reader` (named `file`) and explains the Service `key` at the
/// end, or just after line `at`; `Ok(None)` when the store has no such
/// Service then.
pub fn explain_stream<R: BufRead + Send + 'static>(
    file: &str,
    reader: R,
    options: &ReplayOptions,
    key: &str,
    at: Option<u64>,
) -> Result<Option<ExplainDocument>, ReplayError> {
    let mut catcher = Catcher {
        key,
        at,
        caught: None,
    };
    replay_pipelined(file, reader, options, &mut catcher)?;
    Ok(catcher.caught.flatten())
}

/// Takes the explanation just before the first line past `at`, or at
/// the end.
struct Catcher<'a> {
    key: &'a str,
    at: Option<u64>,
    /// `Some` once taken.
    caught: Option<Option<ExplainDocument>>,
}

impl Catcher<'_> {
    fn catch(&mut self, plugin: &Plugin) {
        if self.caught.is_some() {
            return;
        }
        let events: Vec<EventDocument> = plugin
            .client
            .events()
            .into_iter()
            .filter(|e| e.key == self.key)
            .map(|e: EventRecord| EventDocument {
                event_type: e.event_type,
                reason: e.reason,
                message: e.message,
            })
            .collect();
        let explanation = plugin.controller.explain(self.key);
        // Pool names are one name space across both kinds (docs/cilium.md
        // §2.6): the accepted pool of a name has one kind.
        let kinds: BTreeMap<String, PoolKind> = plugin
            .controller
            .pool_stats()
            .into_iter()
            .map(|stats| (stats.name, stats.kind))
            .collect();
        self.caught = Some(explanation.map(|e| document(e, self.at, events, &kinds)));
    }
}

impl Observer for Catcher<'_> {
    fn before_line(&mut self, line: u64, plugin: &Plugin) {
        if self.at.is_some_and(|at| line > at) {
            self.catch(plugin);
        }
    }

    fn finished(&mut self, plugin: &Plugin) {
        self.catch(plugin);
    }
}

fn strings<T: ToString>(items: &[T]) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

fn document(
    explanation: manager::Explanation,
    at_line: Option<u64>,
    events: Vec<EventDocument>,
    kinds: &BTreeMap<String, PoolKind>,
) -> ExplainDocument {
    let asks_document = asks_document(&explanation.asks);
    let shows = ShowsDocument {
        ips: explanation.shows.ips.clone(),
        pool: explanation.shows.pool.clone(),
        condition: explanation
            .shows
            .condition
            .as_ref()
            .map(ConditionDocument::from),
    };
    let not_handled = explanation.handled.as_ref().err().map(not_handled_text);
    let namespace = explanation.key.split('/').next().unwrap_or_default();
    let (step, keep, pools, outcome) =
        judgement_documents(explanation.judgement.as_ref(), namespace, kinds);
    ExplainDocument {
        key: explanation.key,
        at_line,
        handled: explanation.handled.is_ok(),
        not_handled,
        asks: asks_document,
        shows,
        step,
        keep,
        pools,
        outcome,
        events,
    }
}

fn asks_document(asks: &manager::Asks) -> AsksDocument {
    let (addresses, invalid) = match &asks.addresses {
        Ok(ips) => (strings(ips), None),
        Err(reason) => (Vec::new(), Some(reason.clone())),
    };
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    AsksDocument {
        addresses,
        invalid,
        pool: asks.pool.clone(),
        sharing_key: non_empty(&asks.sharing_key),
        backend_key: non_empty(&asks.backend_key),
        ports: strings(&asks.ports),
        families: asks.families.map(|f| f.to_string()),
        ip_family_policy: asks.ip_family_policy.clone(),
        ip_families: asks.ip_families.clone(),
        cluster_ips: asks.cluster_ips.clone(),
        deprecated_annotations: asks.deprecated.clone(),
        labels: asks.labels.clone(),
        namespace_labels: asks.namespace_labels.clone(),
    }
}

type JudgementDocuments = (
    Option<&'static str>,
    Option<KeepDocument>,
    Vec<PoolDocument>,
    OutcomeDocument,
);

/// The step, keep verdict, pool verdicts and outcome of a judgement.
fn judgement_documents(
    judgement: Option<&Judgement>,
    namespace: &str,
    kinds: &BTreeMap<String, PoolKind>,
) -> JudgementDocuments {
    match judgement {
        None => (None, None, Vec::new(), outcome_error("not handled")),
        Some(Judgement::NoClusterIp) => (
            None,
            None,
            Vec::new(),
            outcome_error("the service has no cluster IP"),
        ),
        Some(Judgement::Invalid(reason)) => (
            None,
            None,
            Vec::new(),
            outcome_error(&format!("invalid request: {reason}")),
        ),
        Some(Judgement::Pools(pools)) => (
            Some(step_name(pools.step)),
            pools.keep.as_ref().map(|keep| KeepDocument {
                allowed: keep.is_ok(),
                reason: keep.as_ref().err().map(ToString::to_string),
            }),
            pools
                .pools
                .iter()
                .map(|p| {
                    let kind = kinds
                        .get(&p.pool)
                        .copied()
                        .unwrap_or(PoolKind::IPAddressPool);
                    pool_document(p, kind, namespace)
                })
                .collect(),
            match &pools.outcome {
                Ok(holding) => OutcomeDocument {
                    assigned: true,
                    ips: strings(&holding.ips),
                    pool: Some(holding.pool.clone()),
                    error: None,
                },
                Err(error) => outcome_error(&error.to_string()),
            },
        ),
    }
}

fn outcome_error(error: &str) -> OutcomeDocument {
    OutcomeDocument {
        assigned: false,
        ips: Vec::new(),
        pool: None,
        error: Some(error.to_owned()),
    }
}

fn not_handled_text(why: &NotHandled) -> String {
    match why {
        NotHandled::NotLoadBalancer { service_type } => format!(
            "spec.type is {}, not LoadBalancer",
            service_type.as_deref().unwrap_or("unset (ClusterIP)")
        ),
        NotHandled::OtherClass { class, handled } => format!(
            "spec.loadBalancerClass is {}, and this controller handles {}",
            class
                .as_deref()
                .map_or_else(|| "unset".to_owned(), |c| format!("{c:?}")),
            handled.as_deref().map_or_else(
                || "only Services without one (use --lb-class)".to_owned(),
                |c| format!("{c:?}")
            )
        ),
    }
}

fn step_name(step: Step) -> &'static str {
    match step {
        Step::RequestedAddresses => "requested-addresses",
        Step::RequestedPool => "requested-pool",
        Step::PoolOrder => "pool-order",
    }
}

fn step_text(step: &str) -> &'static str {
    match step {
        "requested-addresses" => "the requested addresses (docs/allocation.md §4.4 step 2)",
        "requested-pool" => "the requested pool (docs/allocation.md §4.4 step 3)",
        _ => "pools in order (docs/allocation.md §4.4 step 4)",
    }
}

fn ip_list(ips: &[IpAddr]) -> String {
    strings(ips).join(", ")
}

fn pool_document(pool: &allocator::PoolVerdict, kind: PoolKind, namespace: &str) -> PoolDocument {
    let none: Vec<String> = Vec::new();
    let (verdict, ips, family, message): (&str, Vec<String>, Option<Family>, String) =
        match &pool.verdict {
            Verdict::Holds { ips } => (
                "holds",
                strings(ips),
                None,
                format!("holds {}", ip_list(ips)),
            ),
            Verdict::Fits { ips } => (
                "fits",
                strings(ips),
                None,
                format!("fits: {}", ip_list(ips)),
            ),
            Verdict::NamespaceNotServed => (
                "namespace-not-served",
                none,
                None,
                format!("skipped: its serviceAllocation does not serve namespace {namespace:?}"),
            ),
            Verdict::ServiceSelectorMismatch => (
                "service-selector-mismatch",
                none,
                None,
                selector_mismatch(kind).to_owned(),
            ),
            Verdict::Disabled => (
                "disabled",
                none,
                None,
                "skipped: the pool is disabled (spec.disabled)".to_owned(),
            ),
            Verdict::AutoAssignOff => (
                "auto-assign-off",
                none,
                None,
                "skipped: autoAssign is false (ask for it with metallb.io/address-pool)".to_owned(),
            ),
            Verdict::NoFamily { family } => (
                "no-family",
                none,
                Some(*family),
                format!("skipped: has no {family} address"),
            ),
            Verdict::Full { family } => (
                "full",
                none,
                Some(*family),
                format!("full: no free {family} address"),
            ),
            Verdict::SharingRefused { family, tried } => {
                let tried: Vec<String> = tried
                    .iter()
                    .map(|(ip, conflict)| format!("{ip}: {conflict}"))
                    .collect();
                (
                    "sharing-refused",
                    none,
                    Some(*family),
                    format!(
                        "full: no free {family} address, and sharing is refused ({})",
                        tried.join("; ")
                    ),
                )
            }
            Verdict::Refused(error) => refused(error),
        };
    PoolDocument {
        name: pool.pool.clone(),
        kind: kind.to_string(),
        verdict,
        chosen: pool.chosen,
        ips,
        family: family.map(|f| f.to_string()),
        message,
    }
}

/// Why a pool's selector leaves the Service out: Cilium's sees two
/// pseudo-labels too (docs/cilium.md §2.4).
fn selector_mismatch(kind: PoolKind) -> &'static str {
    match kind {
        PoolKind::CiliumLoadBalancerIPPool => {
            "skipped: its serviceSelector does not match the Service's labels \
             (with io.kubernetes.service.namespace and io.kubernetes.service.name)"
        }
        PoolKind::IPAddressPool => {
            "skipped: its serviceSelectors do not match the Service's labels"
        }
    }
}

fn refused(error: &AllocError) -> (&'static str, Vec<String>, Option<Family>, String) {
    ("refused", Vec::new(), None, format!("refused: {error}"))
}

/// The document in `format`: JSON (pretty, two spaces) or YAML, or for
/// `table` a description in the manner of `kubectl describe`.
pub fn render_explanation(
    document: &ExplainDocument,
    format: OutputFormat,
) -> Result<String, OutputError> {
    match format {
        OutputFormat::Json => {
            let mut text = serde_json::to_string_pretty(document)?;
            text.push('\n');
            Ok(text)
        }
        OutputFormat::Yaml => Ok(serde_yaml_ng::to_string(document)?),
        OutputFormat::Table => Ok(describe(document)),
    }
}

fn or_none(value: Option<&str>) -> String {
    value.map_or_else(|| "<none>".to_owned(), str::to_owned)
}

fn joined(items: &[String]) -> String {
    if items.is_empty() {
        "<none>".to_owned()
    } else {
        items.join(", ")
    }
}

fn labels(labels: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    joined(&pairs)
}

/// `kubectl describe`-like text.
fn describe(d: &ExplainDocument) -> String {
    let mut out = String::new();
    describe_asks(&mut out, d);
    describe_decision(&mut out, d);
    describe_pools(&mut out, d);
    if !d.events.is_empty() {
        out.push_str("Events:\n");
        for event in &d.events {
            let _ = writeln!(
                out,
                "  {:<8} {:<20} {}",
                event.event_type, event.reason, event.message
            );
        }
    }
    out
}

/// One `Name:   value` line of [`describe`].
fn field(out: &mut String, name: &str, value: &str) {
    let _ = writeln!(out, "{:<18}{value}", format!("{name}:"));
}

/// Which Service, whether it is handled, and what it asks for.
fn describe_asks(out: &mut String, d: &ExplainDocument) {
    let at = d
        .at_line
        .map_or_else(|| "end of stream".to_owned(), |l| format!("after line {l}"));
    field(out, "Service", &format!("{} ({at})", d.key));
    let handled = match &d.not_handled {
        None => "yes".to_owned(),
        Some(why) => format!("no: {why}"),
    };
    field(out, "Handled", &handled);
    let a = &d.asks;
    let addresses = match &a.invalid {
        Some(reason) => format!("invalid: {reason}"),
        None => joined(&a.addresses),
    };
    field(out, "Requested IPs", &addresses);
    field(out, "Requested pool", &or_none(a.pool.as_deref()));
    field(out, "Sharing key", &or_none(a.sharing_key.as_deref()));
    field(out, "Backend key", &or_none(a.backend_key.as_deref()));
    field(out, "Ports", &joined(&a.ports));
    let families = format!(
        "{} (ipFamilyPolicy {}, ipFamilies {}, clusterIPs {})",
        a.families.as_deref().unwrap_or("none: no cluster IP"),
        or_none(a.ip_family_policy.as_deref()),
        joined(&a.ip_families),
        joined(&a.cluster_ips)
    );
    field(out, "Families", &families);
    field(out, "Labels", &labels(&a.labels));
    field(out, "Namespace labels", &labels(&a.namespace_labels));
    if !a.deprecated_annotations.is_empty() {
        field(out, "Deprecated", &a.deprecated_annotations.join(", "));
    }
}

/// What the Service shows now, and what the rules decide for it.
fn describe_decision(out: &mut String, d: &ExplainDocument) {
    let status = if d.shows.ips.is_empty() {
        // Pending only for a Service the controller is to serve.
        if d.handled { "<pending>" } else { "<none>" }.to_owned()
    } else {
        format!(
            "{} (pool {})",
            d.shows.ips.join(", "),
            or_none(d.shows.pool.as_deref())
        )
    };
    field(out, "Status", &status);
    let condition = d.shows.condition.as_ref().map_or_else(
        || "<none>".to_owned(),
        |c| {
            format!(
                "{}={} {}: {}",
                c.condition_type, c.status, c.reason, c.message
            )
        },
    );
    field(out, "Condition", &condition);
    if let Some(step) = d.step {
        field(out, "Step", step_text(step));
    }
    if let Some(keep) = &d.keep {
        let verdict = match &keep.reason {
            None => "allowed: the held addresses stay (docs/allocation.md §4.4 step 1)".to_owned(),
            Some(reason) => format!("not allowed: {reason}"),
        };
        field(out, "Keep", &verdict);
    }
    let outcome = if d.outcome.assigned {
        format!(
            "{} from pool {}",
            d.outcome.ips.join(", "),
            or_none(d.outcome.pool.as_deref())
        )
    } else {
        format!(
            "pending: {}",
            d.outcome.error.as_deref().unwrap_or_default()
        )
    };
    field(out, "Outcome", &outcome);
}

/// The verdict of every pool, in the order they were tried.
fn describe_pools(out: &mut String, d: &ExplainDocument) {
    if d.pools.is_empty() {
        return;
    }
    out.push_str("Pools:\n");
    let width = d
        .pools
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(0)
        .max(4);
    let _ = writeln!(out, "  {:<width$}   {:<6}   VERDICT", "POOL", "CHOSEN");
    for pool in &d.pools {
        let chosen = if pool.chosen { "yes" } else { "" };
        let _ = writeln!(
            out,
            "  {:<width$}   {chosen:<6}   {}",
            pool.name, pool.message
        );
    }
}
