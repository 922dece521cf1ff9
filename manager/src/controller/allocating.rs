//! [`AllocatingController`]: docs/allocation.md §4 on the `allocator` crate.
//!
//! Each reconciliation is decided from scratch under a short lock (no I/O):
//! the Service's status is the truth about what it holds (so a restarted
//! controller rebuilds from statuses alone), the allocator the truth about
//! who holds what. Writes and events happen after the lock is released.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use allocator::{
    AddrRange, AllocError, Allocator, AutoGroup, Family, FamilyPolicy, Holding as AllocatorHolding,
    PoolChange, PoolKind, Port, Request, SharingNamespaces,
};
use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, Service};
use subscriber::{CiliumLoadBalancerIPPool, IPAddressPool};
use tracing::{debug, info, warn};

use super::decide::{decide, incomplete, CiliumUnsatisfied, Decision, Failure, Input, Outcome};
use super::parked::{parked_on, ParkedKeys};
use super::service::{
    is_ours, parse_status, same_but_written, status_ip_strings, status_shows, status_texts,
    ServiceView, SharingAcrossNamespaces, NO_LABELS,
};
use super::{
    Controller, Reconsider, RestoreOutcome, Shortcuts, SyncOutcome, SyncState, Touched, WakeOn,
};
use crate::client::{
    pool_annotation, CiliumConditionChange, Client, ConditionKind, Event, EventType,
    ServiceCondition, ServiceWrite,
};
use crate::store::Store;

/// See the manager's: the cluster's own names as keys.
type FastHash = foldhash::fast::RandomState;

/// Event reasons (docs/allocation.md §4.7).
pub(crate) mod reason {
    pub(crate) const IP_ALLOCATED: &str = "IPAllocated";
    pub(crate) const ALLOCATION_FAILED: &str = "AllocationFailed";
    pub(crate) const LOAD_BALANCER_FAILED: &str = "LoadBalancerFailed";
    pub(crate) const CLEAR_ASSIGNMENT: &str = "ClearAssignment";
    pub(crate) const DEPRECATED_ANNOTATION: &str = "DeprecatedAnnotation";
    /// The condition's reason while a Service holds addresses.
    pub(crate) const ASSIGNED: &str = "Assigned";
    /// The condition's reason for an invalid request (`LoadBalancerFailed`).
    pub(crate) const INVALID_REQUEST: &str = "InvalidRequest";
}

/// How the controller is set up.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Handle only Services of this `spec.loadBalancerClass`; `None`: only
    /// Services without a class.
    pub lb_class: Option<String>,
    /// Take none of the manager's speed shortcuts, as MetalLB does: queue
    /// every update (no settled echo), restore every Service after a pool
    /// change (not only those it touched), reconcile every Service in the
    /// second pass after sync or a change (none left out as settled), and
    /// wake every waiting Service at every release (no waiting classes, no
    /// wake by what was freed). Same result, more work: for the tests that
    /// prove the shortcuts change nothing.
    pub exhaustive: bool,
    /// Write no `metallb.io/AddressAssigned` condition (and leave what the
    /// Services show): only for the benchmark that measures what writing
    /// it costs. A host keeps the condition.
    pub without_conditions: bool,
    /// Whether Services with a MetalLB sharing key (`allow-shared-ip`) may
    /// share across namespaces freely (the default, MetalLB's rule) or only
    /// as Cilium's `sharing-cross-namespace` annotations allow
    /// (docs/cilium.md §3.4).
    pub sharing_across_namespaces: SharingAcrossNamespaces,
    /// Write Cilium's `cilium.io/IPAMRequestSatisfied` condition while a
    /// `CiliumLoadBalancerIPPool` exists (docs/cilium.md §3.6); on by
    /// default.
    pub cilium_conditions: bool,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            lb_class: None,
            exhaustive: false,
            without_conditions: false,
            sharing_across_namespaces: SharingAcrossNamespaces::default(),
            cilium_conditions: true,
        }
    }
}

impl ControllerConfig {
    /// Handle only Services of `class`.
    #[must_use]
    pub fn lb_class(mut self, class: impl Into<String>) -> Self {
        self.lb_class = Some(class.into());
        self
    }

    /// See [`ControllerConfig::sharing_across_namespaces`].
    #[must_use]
    pub fn sharing_across_namespaces(mut self, rule: SharingAcrossNamespaces) -> Self {
        self.sharing_across_namespaces = rule;
        self
    }

    /// Write no Cilium condition (see [`ControllerConfig::cilium_conditions`]).
    #[must_use]
    pub fn without_cilium_conditions(mut self) -> Self {
        self.cilium_conditions = false;
        self
    }

    /// Write no condition (see [`ControllerConfig::without_conditions`]).
    #[must_use]
    pub fn without_conditions(mut self) -> Self {
        self.without_conditions = true;
        self
    }
}

/// What a Service holds, as the host may show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceHolding {
    pub key: String,
    /// IPv4 first.
    pub ips: Vec<IpAddr>,
    pub pool: String,
}

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControllerStats {
    pub reconciliations: u64,
    /// Services looked at by the first pass at sync or after a change.
    pub restores: u64,
    /// Failed writes (retried).
    pub write_errors: u64,
    /// Events the client could not emit (not retried).
    pub event_errors: u64,
    /// Times a pool change left a pool rejected.
    pub pool_rejections: u64,
}

#[derive(Debug, Default)]
struct State {
    allocator: Allocator,
    /// The last Warning emitted per Service (with its uid, so a re-created
    /// Service is announced afresh): the same failure again is not
    /// announced again.
    last_warning: HashMap<String, (String, String, String), FastHash>,
    /// The keys of `last_warning` whose Warning is a failure's, not an
    /// invalid request's: a pool or Namespace change never makes a request
    /// valid, so only these may announce otherwise after one. But not
    /// those in `parked`.
    warned_failing: HashSet<String, FastHash>,
    /// The Services whose last reconciliation failed for the configuration
    /// alone ([`parked_on`]), by the changes that may end that: only those
    /// may let them announce otherwise.
    parked: ParkedKeys,
    namespace_labels: HashMap<String, BTreeMap<String, String>, FastHash>,
    /// Status addresses the restore pass released and announced
    /// (`ClearAssignment`), so the second pass does not announce them again.
    announced_clears: HashMap<String, Vec<String>, FastHash>,
    /// Services that stopped being ours and whose clearing write has not
    /// gone through yet.
    owed_clears: HashSet<String, FastHash>,
    /// What the last pool or Namespace change may have touched (see
    /// `touched_by_change`). `None` at sync, when any pool may serve
    /// otherwise.
    touched: Option<Touched>,
    /// The `CiliumLoadBalancerIPPool` objects that exist (accepted or
    /// not): while there is one, Services carry Cilium's condition
    /// (docs/cilium.md §3.6).
    cilium_pools: BTreeSet<String>,
    unsettled: Unsettled,
    /// Namespace events so far: with the allocator's loosenings, the
    /// failure epoch (see [`Shortcuts::failure_epoch`]).
    namespace_events: u64,
}

/// The Services holding addresses whose last reconciliation did not end
/// settled (waiting, invalid, or a write to retry), by the addresses they
/// hold. When a holder changes its sharing terms, only these among the
/// others on its addresses can change (docs/allocation.md §4.9): the
/// allocator lets no two conflicting holders share an address, and the
/// sharing rules are symmetric, so a settled holder keeps as it was.
#[derive(Debug, Default)]
struct Unsettled {
    held: HashMap<String, (Vec<IpAddr>, Slot), FastHash>,
    /// Those whose last decision held one family and waits for the other
    /// (§4.3), booked by the plan for [`Unsettled::book`].
    half_served: HashSet<String, FastHash>,
    /// Per address, its unsettled holders by [`Slot`].
    on: HashMap<IpAddr, [BTreeSet<String>; 3], FastHash>,
}

/// Which unsettled holders a change of another holder's terms may change:
/// index into [`Unsettled::on`].
type Slot = usize;
/// Invalid, a write to retry, or waiting with no family lacking: always.
const ALWAYS: Slot = 0;

/// A half-served holder lacking `family` (§4.6): only when what changed
/// concerns that family.
fn lacking_slot(family: Family) -> Slot {
    match family {
        Family::V4 => 1,
        Family::V6 => 2,
    }
}

impl Unsettled {
    fn set_half_served(&mut self, key: &str, half_served: bool) {
        if half_served {
            self.half_served.insert(key.to_owned());
        } else {
            self.half_served.remove(key);
        }
    }

    /// Books how the reconciliation of `key` ended: `held` are its
    /// addresses if it did not end settled, and whether it waits.
    fn book(&mut self, key: &str, held: &[IpAddr], waiting: bool) {
        if let Some((ips, slot)) = self.held.remove(key) {
            for ip in ips {
                if let Some(slots) = self.on.get_mut(&ip) {
                    if let Some(keys) = slots.get_mut(slot) {
                        keys.remove(key);
                    }
                    if slots.iter().all(BTreeSet::is_empty) {
                        self.on.remove(&ip);
                    }
                }
            }
        }
        if held.is_empty() {
            return;
        }
        let holds = |family| held.iter().any(|ip| Family::of(*ip) == family);
        let waiting = waiting && self.half_served.contains(key);
        let slot = match (waiting, holds(Family::V4), holds(Family::V6)) {
            (true, true, false) => lacking_slot(Family::V6),
            (true, false, true) => lacking_slot(Family::V4),
            _ => ALWAYS,
        };
        for ip in held {
            let slots = self.on.entry(*ip).or_default();
            if let Some(keys) = slots.get_mut(slot) {
                keys.insert(key.to_owned());
            }
        }
        self.held.insert(key.to_owned(), (held.to_vec(), slot));
    }

    /// The unsettled Services other than `key` that hold one of `before`'s
    /// addresses now, sorted (an entry may be stale: a pool change may
    /// have released it since). A waiting one is left out when neither
    /// this change (`before` to `after`) nor a change of holders since the
    /// last wake concerns the family it lacks: the addresses of that
    /// family are as they were when it last failed for them.
    fn others_on(
        &self,
        allocator: &Allocator,
        key: &str,
        before: &AllocatorHolding,
        after: Option<&AllocatorHolding>,
    ) -> Vec<String> {
        let changed = |family: Family| {
            allocator.regrouped_since(family)
                || before
                    .ips
                    .iter()
                    .chain(after.iter().flat_map(|a| &a.ips))
                    .any(|ip| Family::of(*ip) == family)
        };
        let slots: Vec<Slot> = std::iter::once(ALWAYS)
            .chain(
                [Family::V4, Family::V6]
                    .into_iter()
                    .filter(|family| changed(*family))
                    .map(lacking_slot),
            )
            .collect();
        let mut others: Vec<String> = Vec::new();
        for ip in &before.ips {
            let Some(on) = self.on.get(ip) else {
                continue;
            };
            let holders = slots.iter().filter_map(|slot| on.get(*slot)).flatten();
            others.extend(
                holders
                    .filter(|other| {
                        *other != key
                            && allocator
                                .held(other)
                                .is_some_and(|(_, ips)| ips.contains(ip))
                    })
                    .cloned(),
            );
        }
        others.sort();
        others.dedup();
        others
    }
}

impl State {
    fn forget_warning(&mut self, key: &str) {
        self.last_warning.remove(key);
        self.warned_failing.remove(key);
    }

    /// No Warning, announced clearing or owed clear is pending for `key`: a
    /// reconciliation would have nothing of its own to carry out.
    fn nothing_pending(&self, key: &str) -> bool {
        !self.last_warning.contains_key(key)
            && !self.announced_clears.contains_key(key)
            && !self.owed_clears.contains(key)
    }

    /// Whether reconciling the Service `key` (ours, with a valid request
    /// for `families`, object `service`) would change nothing: it holds
    /// exactly the addresses and pool its object shows, wants no further
    /// family, and no Warning, announced clearing or owed clear is pending.
    fn shows_holding(
        &self,
        key: &str,
        service: &Service,
        families: FamilyPolicy,
        requested: &[IpAddr],
        with_condition: bool,
        with_cilium_condition: bool,
    ) -> bool {
        if !self.nothing_pending(key) {
            return false;
        }
        let Some((pool, ips)) = self.allocator.held(key) else {
            return false;
        };
        // What condition_for gives a holding, compared in place.
        let shows_condition = || {
            ConditionKind::Assigned.find(service).is_some_and(|shown| {
                shown.status == "True"
                    && shown.reason == reason::ASSIGNED
                    && shown.observed_generation == service.metadata.generation
                    && shown.message == assigned_message(ips)
            })
        };
        // Cilium's condition for a holding that is complete: `satisfied`,
        // or none yet (not a write of its own, docs/cilium.md §3.6).
        let shows_cilium = || {
            ConditionKind::Cilium.find(service).is_none_or(|shown| {
                shown.status == "True" && shown.reason == SATISFIED && shown.message.is_empty()
            })
        };
        !incomplete(families, ips, requested)
            && pool_annotation(service) == annotated_pool(&self.allocator, pool)
            && status_shows(service, ips)
            && (!with_condition || shows_condition())
            && (!with_cilium_condition || shows_cilium())
    }
}

/// The controller that applies docs/allocation.md §4 on an [`Allocator`].
pub struct AllocatingController {
    pub(super) store: Arc<dyn Store>,
    client: Arc<dyn Client>,
    pub(super) config: ControllerConfig,
    state: Mutex<State>,
    reconciliations: AtomicU64,
    restores: AtomicU64,
    write_errors: AtomicU64,
    event_errors: AtomicU64,
    pool_rejections: AtomicU64,
}

impl std::fmt::Debug for AllocatingController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocatingController")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The decision of one reconciliation, carried out after the lock is gone.
#[derive(Debug)]
struct Plan {
    write: Option<ServiceWrite>,
    events: Vec<Event>,
    outcome: SyncOutcome,
    /// A Warning recorded for dedup, to forget if the write fails.
    warned: bool,
    /// The restore pass's `ClearAssignment` this plan relied on, to keep if
    /// the write fails (the retry must not announce it again).
    announced_clear: Option<Vec<String>>,
}

impl Plan {
    fn done(outcome: SyncOutcome) -> Self {
        Plan {
            write: None,
            events: Vec::new(),
            outcome,
            warned: false,
            announced_clear: None,
        }
    }
}

fn event(event_type: EventType, reason: &str, message: String) -> Event {
    Event {
        event_type,
        reason: reason.to_owned(),
        message: crate::client::capped_note(message),
    }
}

/// `Assigned IP ["10.0.0.1" "fd00::1"]`: MetalLB's message, with `%q` of
/// the list of IPs; the Event's and the condition's.
fn assigned_message(ips: &[IpAddr]) -> String {
    const PREFIX: &str = "Assigned IP ";
    let mut text = String::with_capacity(PREFIX.len() + 2 + ips.len() * 42);
    text.push_str(PREFIX);
    text.push('[');
    for (i, ip) in ips.iter().enumerate() {
        if i > 0 {
            text.push(' ');
        }
        text.push('"');
        allocator::push_ip(&mut text, *ip);
        text.push('"');
    }
    text.push(']');
    text
}

fn quoted_strings(ips: &[String]) -> String {
    let inner: Vec<String> = ips.iter().map(|ip| format!("\"{ip}\"")).collect();
    format!("[{}]", inner.join(" "))
}

impl AllocatingController {
    pub fn new(store: Arc<dyn Store>, client: Arc<dyn Client>, config: ControllerConfig) -> Self {
        Self {
            store,
            client,
            config,
            state: Mutex::new(State::default()),
            reconciliations: AtomicU64::new(0),
            restores: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            event_errors: AtomicU64::new(0),
            pool_rejections: AtomicU64::new(0),
        }
    }

    /// Whether Services carry Cilium's condition now: configured, and a
    /// `CiliumLoadBalancerIPPool` exists (docs/cilium.md §3.6).
    fn cilium_active(&self, state: &State) -> bool {
        self.config.cilium_conditions && !state.cilium_pools.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the state itself is
        // consistent after every method, so keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reads the allocator under the lock (for `explain`).
    pub(super) fn read_allocator<T>(&self, read: impl FnOnce(&Allocator) -> T) -> T {
        read(&self.lock().allocator)
    }

    /// Every accepted pool's counters, sorted by name.
    pub fn pool_stats(&self) -> Vec<allocator::PoolStats> {
        self.lock().allocator.pool_stats()
    }

    /// Every rejected pool with its reason, sorted by name.
    pub fn rejected_pools(&self) -> Vec<allocator::RejectedPool> {
        self.lock().allocator.rejected_pools()
    }

    /// Every Service's holding, sorted by key.
    pub fn holdings(&self) -> Vec<ServiceHolding> {
        self.lock()
            .allocator
            .holdings()
            .into_iter()
            .map(|(key, h)| ServiceHolding {
                key,
                ips: h.ips,
                pool: h.pool,
            })
            .collect()
    }

    /// Counters for metrics.
    pub fn stats(&self) -> ControllerStats {
        ControllerStats {
            reconciliations: self.reconciliations.load(Ordering::Relaxed),
            restores: self.restores.load(Ordering::Relaxed),
            write_errors: self.write_errors.load(Ordering::Relaxed),
            event_errors: self.event_errors.load(Ordering::Relaxed),
            pool_rejections: self.pool_rejections.load(Ordering::Relaxed),
        }
    }

    /// The allocator's search steps so far ([`Allocator::steps`]): what
    /// cost tests count.
    pub fn allocator_steps(&self) -> u64 {
        self.lock().allocator.steps()
    }

    /// Checks docs/allocation.md §6 against the store: the allocator's own invariants,
    /// every held address in a pool that serves its Service, and (meant for
    /// when the manager is idle) every Service's status equal to what the
    /// allocator holds for it.
    pub fn check_invariants(&self) -> Result<(), Vec<String>> {
        let state = self.lock();
        let mut problems = state.allocator.check_invariants().err().unwrap_or_default();
        let lb_class = self.config.lb_class.as_deref();
        let mut keys = self.store.service_keys();
        keys.sort();
        for key in &keys {
            let Some(service) = self.store.service(key) else {
                continue;
            };
            let holding = state.allocator.holding(key);
            let status = status_ip_strings(&service);
            let held: Vec<String> = holding
                .iter()
                .flat_map(|h| h.ips.iter().map(ToString::to_string))
                .collect();
            if is_ours(&service, lb_class) && status != held {
                problems.push(format!(
                    "{key}: status {status:?} but the allocator holds {held:?}"
                ));
            }
            if let Some(holding) = holding {
                if !is_ours(&service, lb_class) {
                    problems.push(format!("{key} is not ours but holds {:?}", holding.ips));
                }
                let view = ServiceView::new(&service, self.config.sharing_across_namespaces);
                let namespace = self.store.namespace(view.namespace);
                let subject = view.subject(labels_of(&namespace));
                for name in std::iter::once(&holding.pool).chain(&holding.other_pool) {
                    let serves = state
                        .allocator
                        .pool(name)
                        .is_some_and(|pool| pool.serves(&subject));
                    if !serves {
                        problems.push(format!(
                            "{key} holds addresses of pool {name} which does not serve it"
                        ));
                    }
                }
            }
        }
        for (key, _) in state.allocator.holdings() {
            if self.store.service(&key).is_none() {
                problems.push(format!("{key} is deleted but still holds addresses"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Decides one Service (docs/allocation.md §4.1–4.7) and what to write
    /// and announce about it.
    fn plan(&self, state: &mut State, key: &str, service: Option<&Service>) -> Plan {
        // Released and announced by the restore pass, if so.
        let announced_clear = state.announced_clears.remove(key);
        let Some(service) = service else {
            return plan_delete(state, key);
        };
        if !is_ours(service, self.config.lb_class.as_deref()) {
            return self.plan_not_ours(state, key, service);
        }
        let stale_status = state.owed_clears.remove(key);
        let view = ServiceView::new(service, self.config.sharing_across_namespaces);
        let namespace = self.store.namespace(view.namespace);
        let before = state.allocator.holding(key);
        let sharing_before = sharing_of(&state.allocator, key);
        let status = status_ip_strings(service);
        let input = Input {
            key,
            view: &view,
            namespace_labels: labels_of(&namespace),
            status: &status,
            stale_status,
        };
        let decision = decide(&mut state.allocator, &input);
        let half_served = matches!(
            decision.outcome,
            Outcome::Holds {
                waits_for_family: true,
                ..
            }
        );
        state.unsettled.set_half_served(key, half_served);
        let mut events = decision_events(&decision, announced_clear.as_ref(), &status);
        let parked = book_parked(state, key, &decision.outcome, &view);
        let warned = announce_warning(state, key, service, &decision.outcome, parked, &mut events);
        let after = state.allocator.holding(key);
        let write = self.write_for(
            state,
            key,
            service,
            &view,
            &decision.outcome,
            after.as_ref(),
        );
        events.extend(annotation_events(service, &view, write.as_ref()));
        let changed = Change {
            before: before.as_ref(),
            after: after.as_ref(),
            sharing_before,
        };
        let (allocator, unsettled) = (&state.allocator, &state.unsettled);
        let others = |before: &AllocatorHolding, after: Option<&AllocatorHolding>| {
            if self.config.exhaustive {
                others_on(allocator, key, before)
            } else {
                unsettled.others_on(allocator, key, before, after)
            }
        };
        let mut outcome = sync_outcome(
            allocator,
            key,
            &view,
            labels_of(&namespace),
            &decision.outcome,
            &changed,
            &others,
        );
        add_regrouped(&mut outcome, &mut state.allocator);
        if self.config.exhaustive {
            // Every waiting Service alone, woken by every release.
            outcome.waiting_class = None;
            outcome.wake_on = None;
        }
        Plan {
            write,
            events,
            outcome,
            warned,
            announced_clear,
        }
    }

    /// What the Service's status, pool annotation and conditions should
    /// become after `outcome`, if that differs from what it shows.
    fn write_for(
        &self,
        state: &State,
        key: &str,
        service: &Service,
        view: &ServiceView<'_>,
        outcome: &Outcome,
        after: Option<&AllocatorHolding>,
    ) -> Option<ServiceWrite> {
        let condition =
            (!self.config.without_conditions).then(|| condition_for(key, service, outcome, after));
        let cilium = if self.cilium_active(state) {
            CiliumConditionChange::Set(cilium_condition_for(
                &state.allocator,
                service,
                view,
                outcome,
                after,
            ))
        } else {
            CiliumConditionChange::Keep
        };
        desired_write(
            service,
            after,
            annotated_pool(&state.allocator, after.map_or("", |h| &h.pool)),
            condition,
            cilium,
        )
    }

    /// A Service that is not (or no longer) ours releases what it held, with
    /// no event; what we wrote on it is cleared (§4.1).
    fn plan_not_ours(&self, state: &mut State, key: &str, service: &Service) -> Plan {
        let released = state.allocator.release(key);
        state.unsettled.set_half_served(key, false);
        state.forget_warning(key);
        state.parked.remove(key);
        // What we wrote is cleared when we held it (and, if that write
        // fails, until it goes through), or (after a restart) when the
        // Service is no LoadBalancer at all any more; a LoadBalancer of
        // another class belongs to its own host.
        let is_load_balancer =
            service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
        let ours_written =
            pool_annotation(service).is_some() || ConditionKind::Assigned.find(service).is_some();
        let anything_written = ours_written || status_texts(service).next().is_some();
        if released.is_some() && anything_written {
            state.owed_clears.insert(key.to_owned());
        }
        if !anything_written {
            state.owed_clears.remove(key);
        }
        let owed = state.owed_clears.contains(key);
        // Cilium's condition goes too, as Cilium removes it (docs/cilium.md
        // §3.6), but only while it is ours to write.
        let cilium_condition =
            if self.cilium_active(state) && ConditionKind::Cilium.find(service).is_some() {
                CiliumConditionChange::Remove
            } else {
                CiliumConditionChange::Keep
            };
        let write =
            (anything_written && (owed || (ours_written && !is_load_balancer))).then(|| {
                ServiceWrite {
                    cilium_condition,
                    ..ServiceWrite::default()
                }
            });
        let mut outcome = SyncOutcome::success();
        outcome.wake_waiting = released.is_some();
        outcome.freed = freed(&state.allocator, released.as_ref(), None);
        add_regrouped(&mut outcome, &mut state.allocator);
        Plan {
            write,
            ..Plan::done(outcome)
        }
    }

    /// [`Controller::restore`] under the lock: keeps the status addresses
    /// or releases them, returning the `ClearAssignment` to emit.
    fn restore_locked(
        &self,
        state: &mut State,
        key: &str,
        service: &Service,
    ) -> (RestoreOutcome, Option<Event>) {
        if !is_ours(service, self.config.lb_class.as_deref()) {
            return (RestoreOutcome::Nothing, None);
        }
        let status_strings = status_ip_strings(service);
        if status_strings.is_empty() {
            return (RestoreOutcome::Nothing, None);
        }
        let view = ServiceView::new(service, self.config.sharing_across_namespaces);
        let namespace = self.store.namespace(view.namespace);
        let kept = match (parse_status(&status_strings), view.families) {
            (Err(reason), _) => Err(reason),
            (Ok(_), None) => Err("the service has no cluster IP".to_owned()),
            (Ok(ips), Some(families)) => {
                // An invalid request keeps what it holds (§4.2).
                let requested = view.requested.as_deref().unwrap_or_default();
                let request = view.request(key, families, labels_of(&namespace), requested);
                state
                    .allocator
                    .keep(&request, &ips)
                    .map_err(|e| e.to_string())
            }
        };
        match kept {
            Ok(holding) => {
                let requested = view.requested.as_deref().unwrap_or_default();
                let waits_for_family = view.requested.is_ok()
                    && view
                        .families
                        .is_some_and(|families| incomplete(families, &holding.ips, requested));
                let settled = !self.config.exhaustive
                    && view.requested.is_ok()
                    && view.families.is_some_and(|families| {
                        state.shows_holding(
                            key,
                            service,
                            families,
                            requested,
                            !self.config.without_conditions,
                            self.cilium_active(state),
                        )
                    });
                let outcome = if waits_for_family {
                    RestoreOutcome::KeptIncomplete
                } else if settled {
                    RestoreOutcome::Settled
                } else {
                    RestoreOutcome::Kept
                };
                (outcome, None)
            }
            Err(reason) => {
                debug!(key, %reason, "held address no longer allowed");
                state.allocator.release(key);
                state
                    .announced_clears
                    .insert(key.to_owned(), status_strings.clone());
                (
                    RestoreOutcome::MustRelease,
                    Some(clear_event(&status_strings, &reason)),
                )
            }
        }
    }

    /// What follows a pool change of either kind: count and log what it
    /// rejected and released, and reconsider every Service.
    fn pool_changed(&self, change: &PoolChange) -> SyncOutcome {
        // Count every pool this change left rejected anew (or for a new
        // reason), the changed one or another it now overlaps.
        for rejected in &change.rejected {
            self.pool_rejections.fetch_add(1, Ordering::Relaxed);
            warn!(pool = %rejected.name, reason = %rejected.reason, "pool rejected");
        }
        for released in &change.released {
            info!(key = %released.key, reason = %released.reason, "pool change releases addresses");
        }
        let mut outcome = SyncOutcome::success();
        outcome.reconsider = Reconsider::All;
        outcome
    }

    async fn carry_out(&self, key: &str, plan: Plan) -> SyncOutcome {
        if let Some(write) = &plan.write {
            if let Err(error) = self.client.write_service(key, write).await {
                self.write_errors.fetch_add(1, Ordering::Relaxed);
                warn!(key, %error, "status write failed; will retry");
                let mut state = self.lock();
                if plan.warned {
                    // Not announced after all: announce it on the retry.
                    state.forget_warning(key);
                }
                if let Some(cleared) = plan.announced_clear.clone() {
                    state.announced_clears.insert(key.to_owned(), cleared);
                }
                drop(state);
                let mut outcome = plan.outcome;
                outcome.waiting_too = outcome.state == SyncState::Waiting;
                outcome.state = SyncState::Retry(error.to_string());
                return outcome;
            }
        }
        for event in &plan.events {
            if event.event_type == EventType::Warning {
                info!(key, reason = %event.reason, message = %event.message, "warning");
            }
            if let Err(error) = self.client.emit_event(key, event).await {
                self.event_errors.fetch_add(1, Ordering::Relaxed);
                warn!(key, %error, reason = %event.reason, "could not emit event");
            }
        }
        plan.outcome
    }
}

/// `metadata.creationTimestamp` in nanoseconds, which orders pools.
fn created_of(
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<i128> {
    metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_nanosecond())
}

/// A deleted Service releases what it held; every delete, whether or not
/// it held addresses, wakes the waiting Services (§4.6) that what it freed
/// may serve, and those whose holders changed since the last wake (§4.9).
fn plan_delete(state: &mut State, key: &str) -> Plan {
    let released = state.allocator.release(key);
    state.unsettled.set_half_served(key, false);
    state.forget_warning(key);
    state.parked.remove(key);
    state.owed_clears.remove(key);
    let mut outcome = SyncOutcome::success();
    outcome.wake_waiting = true;
    outcome.freed = freed(&state.allocator, released.as_ref(), None);
    add_regrouped(&mut outcome, &mut state.allocator);
    Plan::done(outcome)
}

/// The sharing key and ports a Service holds its addresses with.
fn sharing_of(allocator: &Allocator, key: &str) -> Option<(String, Vec<Port>)> {
    allocator
        .sharing_of(key)
        .map(|(sharing, ports)| (sharing.to_owned(), ports.to_vec()))
}

/// Announces a failure once, not on every reconciliation (§4.7): pushes
/// its Warning unless the same one was the last; returns whether it did.
/// `parked`: the failure waits on a change of configuration alone.
fn announce_warning(
    state: &mut State,
    key: &str,
    service: &Service,
    outcome: &Outcome,
    parked: bool,
    events: &mut Vec<Event>,
) -> bool {
    let warning = match outcome {
        Outcome::Fails(failure) => failed_event(key, &failure.detail()),
        Outcome::Invalid(reason) => invalid_event(reason),
        Outcome::Holds { .. } => {
            state.forget_warning(key);
            return false;
        }
    };
    let uid = service.metadata.uid.clone().unwrap_or_default();
    let signature = (uid, warning.reason.clone(), warning.message.clone());
    // Filed by what may end the failure, even when announced before: the
    // same words may come from another request.
    if warning.reason != reason::LOAD_BALANCER_FAILED && !parked {
        state.warned_failing.insert(key.to_owned());
    } else {
        state.warned_failing.remove(key);
    }
    if state.last_warning.get(key) == Some(&signature) {
        return false;
    }
    state.last_warning.insert(key.to_owned(), signature);
    events.push(warning);
    true
}

/// The write that makes the Service show `after` and `condition`, if it
/// does not already.
fn desired_write(
    service: &Service,
    after: Option<&AllocatorHolding>,
    pool: Option<&str>,
    condition: Option<ServiceCondition>,
    cilium_condition: CiliumConditionChange,
) -> Option<ServiceWrite> {
    // A Service without Cilium's condition gets it with the next write
    // made anyway, not by a write of its own (docs/cilium.md §3.6).
    let shows_cilium = cilium_condition.is_shown(service)
        || (matches!(cilium_condition, CiliumConditionChange::Set(_))
            && ConditionKind::Cilium.find(service).is_none());
    let shows = status_shows(service, after.map_or(&[], |h| &h.ips))
        && pool_annotation(service) == pool
        && condition.as_ref().is_none_or(|c| c.is_shown(service))
        && shows_cilium;
    (!shows).then(|| ServiceWrite {
        ingress: after.map(|h| h.ips.clone()).unwrap_or_default(),
        pool: pool.map(str::to_owned),
        // Without conditions, what the Service shows stays.
        condition: condition.or_else(|| ConditionKind::Assigned.shown(service)),
        cilium_condition,
    })
}

/// The `metallb.io/ip-allocated-from-pool` annotation for addresses held
/// in the pool `name`: an `IPAddressPool`'s name; none for a Cilium pool,
/// as Cilium writes no such annotation (docs/cilium.md §5).
fn annotated_pool<'a>(allocator: &Allocator, name: &'a str) -> Option<&'a str> {
    allocator
        .pool(name)
        .is_some_and(|pool| pool.kind == PoolKind::IPAddressPool)
        .then_some(name)
}

/// Cilium's reason while a Service holds all it asked for.
const SATISFIED: &str = "satisfied";

/// Cilium's condition for a decision (docs/cilium.md §3.6): `satisfied`
/// when every requested address, or every family, is held; else the
/// nearest Cilium reason for what is missing.
fn cilium_condition_for(
    allocator: &Allocator,
    service: &Service,
    view: &ServiceView<'_>,
    outcome: &Outcome,
    after: Option<&AllocatorHolding>,
) -> ServiceCondition {
    let requested = view.requested.as_deref().unwrap_or_default();
    let held = after.map_or(&[][..], |h| &h.ips);
    let unsatisfied = match outcome {
        Outcome::Holds {
            waits_for_family: true,
            ..
        } => Some(missing_family(allocator, after)),
        Outcome::Holds { .. } => requested
            .iter()
            .find(|ip| !held.contains(ip))
            .map(|ip| CiliumUnsatisfied::no_pool_for(*ip)),
        Outcome::Fails(failure) => Some(failure.cilium(requested)),
        Outcome::Invalid(_) => Some(CiliumUnsatisfied::no_pool()),
    };
    let (satisfied, reason, message) = match unsatisfied {
        None => (true, SATISFIED, String::new()),
        Some(missing) => (false, missing.reason, missing.message),
    };
    ServiceCondition {
        kind: ConditionKind::Cilium,
        status: satisfied,
        reason: reason.to_owned(),
        message,
        observed_generation: service.metadata.generation,
    }
}

/// Why a PreferDualStack Service holding one family lacks the other: its
/// pool has no address of that family (`no_pool`) or none free
/// (`out_of_ips`).
fn missing_family(allocator: &Allocator, after: Option<&AllocatorHolding>) -> CiliumUnsatisfied {
    let Some(holding) = after else {
        return CiliumUnsatisfied::no_pool();
    };
    let Some(family) = holding.ips.first().map(|ip| Family::of(*ip).other()) else {
        return CiliumUnsatisfied::no_pool();
    };
    match allocator.pool(&holding.pool) {
        Some(pool) if pool.total(family).get() != Some(0) => CiliumUnsatisfied::out_of_ips(),
        _ => CiliumUnsatisfied::no_pool(),
    }
}

/// The Service's condition for a decision (docs/allocation.md §4.7): True
/// while it holds addresses, else False with the failure's reason, the
/// message being the Event's.
fn condition_for(
    key: &str,
    service: &Service,
    outcome: &Outcome,
    after: Option<&AllocatorHolding>,
) -> ServiceCondition {
    let (assigned, reason, message) = match outcome {
        Outcome::Holds { .. } => {
            let ips = after.map_or(&[][..], |h| &h.ips);
            let message = assigned_message(ips);
            (true, reason::ASSIGNED, message)
        }
        Outcome::Fails(failure) => (
            false,
            failure.reason(),
            failed_event(key, &failure.detail()).message,
        ),
        Outcome::Invalid(why) => (false, reason::INVALID_REQUEST, invalid_event(why).message),
    };
    ServiceCondition {
        kind: ConditionKind::Assigned,
        status: assigned,
        reason: reason.to_owned(),
        message,
        observed_generation: service.metadata.generation,
    }
}

/// One event per write naming every old-prefix annotation in effect.
fn deprecated_event(deprecated: &[&str]) -> Event {
    let advice: Vec<String> = deprecated
        .iter()
        .map(|old| {
            let new = old.replace("metallb.universe.tf/", "metallb.io/");
            format!("annotation {old:?} is deprecated, use {new:?}")
        })
        .collect();
    event(
        EventType::Warning,
        reason::DEPRECATED_ANNOTATION,
        advice.join("; "),
    )
}

/// What one reconciliation changed of a Service's holding.
struct Change<'a> {
    before: Option<&'a AllocatorHolding>,
    after: Option<&'a AllocatorHolding>,
    sharing_before: Option<(String, Vec<Port>)>,
}

/// What the manager must do after a decision: wait (and for what), wake
/// the waiting that a release may serve (§4.6), reconsider the others on
/// an address whose holder changed its sharing key or ports (`others_on`
/// lists those that may change).
fn sync_outcome(
    allocator: &Allocator,
    key: &str,
    view: &ServiceView<'_>,
    namespace_labels: &BTreeMap<String, String>,
    decided: &Outcome,
    change: &Change<'_>,
    others_on: &dyn Fn(&AllocatorHolding, Option<&AllocatorHolding>) -> Vec<String>,
) -> SyncOutcome {
    let mut outcome = match decided {
        Outcome::Holds {
            waits_for_family: true,
            ..
        } => {
            let mut outcome = SyncOutcome::new(SyncState::Waiting);
            (outcome.waiting_class, outcome.wake_on) =
                half_served_wait(allocator, view, key, namespace_labels);
            outcome
        }
        Outcome::Holds { .. } => SyncOutcome::success(),
        Outcome::Invalid(_) => SyncOutcome::new(SyncState::Invalid),
        Outcome::Fails(failure) => {
            let mut outcome = SyncOutcome::new(SyncState::Waiting);
            (outcome.waiting_class, outcome.wake_on) = failure_wait(failure, view, key);
            outcome
        }
    };
    let released_any = change.before.is_some_and(|b| {
        b.ips
            .iter()
            .any(|ip| !change.after.is_some_and(|a| a.ips.contains(ip)))
    });
    if let (Outcome::Fails(failure), Some(class)) = (decided, outcome.waiting_class) {
        // What a pool may read of the Service: its Namespace (and so that
        // one's labels) and the labels pools read (the name only a Cilium
        // pool reads); and the failure in words, which a class keeps only
        // as far as one configuration goes (the pools tried, say).
        let labels = allocator.labels_read(view.labels);
        let alike = (class, view.namespace, labels, failure.detail());
        outcome.alike = Some(class_of(&alike));
    }
    outcome.wake_waiting = released_any;
    outcome.freed = freed(allocator, change.before, change.after);
    outcome.joined = joined(change.before, change.after);
    if let (Some(before), Some(sharing_before)) = (change.before, &change.sharing_before) {
        if sharing_of(allocator, key).as_ref() != Some(sharing_before) {
            let others = others_on(before, change.after);
            if !others.is_empty() {
                outcome.reconsider = Reconsider::Keys(others);
            }
        }
    }
    outcome
}

/// The class and wake of a Service that failed (see [`demand_class`] and
/// [`wake_on_failure`]).
fn failure_wait(
    failure: &Failure,
    view: &ServiceView<'_>,
    key: &str,
) -> (Option<u64>, Option<Vec<WakeOn>>) {
    match failure {
        // No delete can ever help: one class for all of them, woken by no
        // release.
        Failure::NoClusterIp => (Some(class_of(&"no cluster IP")), Some(Vec::new())),
        Failure::Allocation(error) => {
            let Some(families) = view.families else {
                return (None, None);
            };
            let requested = view.requested.as_deref().unwrap_or_default();
            let request = view.request(key, families, &NO_LABELS, requested);
            let class = demand_class(error, &request);
            match parked_on(error, &request) {
                // A class has one wake: this one names the namespace.
                Some(changes) => (class.map(|c| class_of(&(c, view.namespace))), Some(changes)),
                None => (class, wake_on_failure(error, &request)),
            }
        }
    }
}

/// Files `key` under the changes of configuration that alone can end the
/// failure `outcome` (none if it did not fail so); returns whether it is.
fn book_parked(state: &mut State, key: &str, outcome: &Outcome, view: &ServiceView<'_>) -> bool {
    let parked = parked_changes(outcome, view, key);
    state.parked.set(key, parked.as_deref());
    parked.is_some()
}

/// The changes of configuration that alone can end the failure `outcome`,
/// if any (see [`parked_on`]).
fn parked_changes(outcome: &Outcome, view: &ServiceView<'_>, key: &str) -> Option<Vec<WakeOn>> {
    let (Outcome::Fails(Failure::Allocation(error)), Some(families)) = (outcome, view.families)
    else {
        return None;
    };
    let requested = view.requested.as_deref().unwrap_or_default();
    parked_on(error, &view.request(key, families, &NO_LABELS, requested))
}

/// What releasing `before` (keeping `after`) freed: each address no
/// Service holds any more, and its pool and family, for the waiting
/// Services that wait for them (§4.9).
fn freed(
    allocator: &Allocator,
    before: Option<&AllocatorHolding>,
    after: Option<&AllocatorHolding>,
) -> Vec<WakeOn> {
    let Some(before) = before else {
        return Vec::new();
    };
    let mut freed = Vec::new();
    for ip in &before.ips {
        let kept = after.is_some_and(|a| a.ips.contains(ip));
        if kept || allocator.is_held(*ip) {
            continue;
        }
        freed.push(WakeOn::Address(*ip));
        freed.extend(pool_keys(allocator, before.pool_of(*ip), Family::of(*ip)));
    }
    freed.sort();
    freed.dedup();
    freed
}

/// Each address `after` holds that `before` did not, as the
/// [`WakeOn::Holders`] key of those refused it.
fn joined(before: Option<&AllocatorHolding>, after: Option<&AllocatorHolding>) -> Vec<WakeOn> {
    let Some(after) = after else {
        return Vec::new();
    };
    let held_before = |ip: &IpAddr| before.is_some_and(|b| b.ips.contains(ip));
    after
        .ips
        .iter()
        .filter(|ip| !held_before(ip))
        .map(|ip| WakeOn::Holders(*ip))
        .collect()
}

/// What a free address of `family` in `pool` frees: the pool's own key
/// and its automatic group's, and that group's among Cilium pools if it
/// is one.
fn pool_keys(allocator: &Allocator, pool: &str, family: Family) -> impl Iterator<Item = WakeOn> {
    let group = allocator.auto_group(pool);
    let any = group.map(|group| match group {
        AutoGroup::Unpinned => WakeOn::UnpinnedPool(family),
        AutoGroup::Pinned(rules) => WakeOn::PinnedPool(rules, family),
    });
    let is_cilium = |_: &AutoGroup| {
        (allocator.pool(pool)).is_some_and(|p| p.kind == PoolKind::CiliumLoadBalancerIPPool)
    };
    let cilium = group
        .filter(is_cilium)
        .map(|group| WakeOn::CiliumGroup(group, family));
    std::iter::once(WakeOn::Pool(pool.to_owned(), family))
        .chain(any)
        .chain(cilium)
}

/// A wake also names the places where holders left addresses (or changed
/// their sharing terms) since the last wake, for the waiting Services that
/// may share, and every address whose holders changed, for those refused
/// the address they asked for (their message names a holder). Such a
/// change that released nothing wakes no one (§4.6), so it waits in the
/// allocator for the next delete or release; one that does not wake
/// leaves it there.
fn add_regrouped(outcome: &mut SyncOutcome, allocator: &mut Allocator) {
    if !outcome.wake_waiting {
        return;
    }
    let regrouped = allocator.take_regrouped();
    let joined = regrouped.joined.into_iter().map(WakeOn::Holders);
    outcome.freed.extend(joined);
    for (pool, ip) in regrouped.left {
        outcome.freed.push(WakeOn::Holders(ip));
        let keys = pool_keys(allocator, &pool, Family::of(ip));
        outcome.freed.extend(keys.filter_map(|key| key.regrouped()));
    }
    outcome.freed.sort();
    outcome.freed.dedup();
}

/// What the change of the pool `name` (whose ranges were `before`) may
/// have touched: the Services it released, those holding addresses in the
/// pools it changed, those with a failure's Warning, an announced clearing
/// or an owed clear pending, and those that failed for the configuration
/// alone and asked for one of the pools it changed or one of their
/// addresses, before or after.
fn touched_by(state: &State, name: &str, before: &[AddrRange], change: &PoolChange) -> Touched {
    let mut services: Vec<String> = change.released.iter().map(|r| r.key.clone()).collect();
    for pool in &change.changed {
        services.extend(state.allocator.holders_in(pool));
    }
    let mut pools: Vec<&str> = std::iter::once(name)
        .chain(change.changed.iter().map(String::as_str))
        .chain(change.rejected.iter().map(|r| r.name.as_str()))
        .collect();
    pools.sort_unstable();
    pools.dedup();
    let mut ranges = before.to_vec();
    for pool in &pools {
        ranges.extend(state.allocator.ranges_named(pool));
    }
    let mut changes = state.parked.covering(&ranges);
    changes.extend(
        pools
            .iter()
            .map(|pool| WakeOn::PoolChanged((*pool).to_owned())),
    );
    services.extend(pending_clears(state));
    for change in &changes {
        services.extend(state.parked.on(change).cloned());
    }
    Touched {
        services,
        failing: state.warned_failing.iter().cloned().collect(),
        changes: Some(changes),
    }
}

/// What a change of the labels of the Namespace `name` may have touched:
/// the Services holding addresses in it if the change `matters` to a
/// pool, those with a failure's Warning, an announced clearing or an owed
/// clear pending (as for a pool change), and those in it that failed for
/// the configuration alone.
fn touched_by_namespace(state: &mut State, name: &str, matters: bool) -> Touched {
    let mut services = if matters {
        state.allocator.holders_in_namespace(name)
    } else {
        Vec::new()
    };
    let change = WakeOn::NamespaceChanged(name.to_owned());
    services.extend(pending_clears(state));
    services.extend(state.parked.on(&change).cloned());
    Touched {
        services,
        failing: state.warned_failing.iter().cloned().collect(),
        changes: Some(vec![change]),
    }
}

/// The Services with an announced clearing or an owed clear pending: a
/// change may let their next reconciliation announce otherwise (as those
/// with a failure's Warning, [`Touched::failing`]; one whose request is
/// invalid is left out of those: it holds what it held, touched as a
/// holder if its pool or Namespace changed, and is refused for its request
/// alone, again and alike).
fn pending_clears(state: &State) -> impl Iterator<Item = String> + '_ {
    let cleared = state.announced_clears.keys().cloned();
    cleared.chain(state.owed_clears.iter().cloned())
}

fn others_on(allocator: &Allocator, key: &str, holding: &AllocatorHolding) -> Vec<String> {
    let mut others: Vec<String> = holding
        .ips
        .iter()
        .flat_map(|ip| allocator.holders(*ip))
        .filter(|holder| holder != key)
        .collect();
    others.sort();
    others.dedup();
    others
}

/// A Namespace's labels (none when it is unknown).
pub(super) fn labels_of(namespace: &Option<Arc<Namespace>>) -> &BTreeMap<String, String> {
    namespace
        .as_ref()
        .and_then(|ns| ns.metadata.labels.as_ref())
        .unwrap_or(&NO_LABELS)
}

fn class_of(value: &impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// The waiting class of a Service whose allocation failed (see
/// [`SyncOutcome::waiting_class`]): only failures that depend on the
/// configuration and the demand alone, never on who holds what, so that
/// two Services of one class fail alike (with the same message) in any
/// allocator state.
fn demand_class(error: &AllocError, request: &Request<'_>) -> Option<u64> {
    let config_only = matches!(
        error,
        AllocError::NoAvailable { .. }
            | AllocError::NoPool
            | AllocError::UnknownPool { .. }
            | AllocError::PoolDoesNotServe { .. }
            | AllocError::NoFamilyInPool { .. }
    );
    if !config_only || !request.addresses.is_empty() {
        return None;
    }
    // Ports and backend matter only to a Service that may share.
    let sharing = !request.sharing_key.is_empty();
    let mut ports = if sharing {
        request.ports.to_vec()
    } else {
        Vec::new()
    };
    ports.sort();
    let backend_key = if sharing { request.backend_key } else { "" };
    // Whom it may share with: the key's rule, and the namespaces it admits
    // besides its own (docs/cilium.md §3.4).
    let sharing_with = match request.sharing_namespaces {
        SharingNamespaces::Listed(listed) if sharing => Some((
            request.sharing_rule,
            request.subject.namespace,
            listed.to_vec(),
        )),
        SharingNamespaces::Any | SharingNamespaces::Listed(_) => {
            sharing.then_some((request.sharing_rule, "", Vec::new()))
        }
    };
    // The message names the pools tried: the candidates the Service's
    // namespace and labels select. Past a few it counts them, so the class
    // holds what was tried: the rules of the pinned pools and their count
    // and first names, and whether the unpinned (which every Service tries
    // alike) were.
    let failure = match error {
        AllocError::NoAvailable { needed, tried } => (
            needed.clone(),
            tried.named.clone(),
            tried.pinned.clone(),
            tried.unpinned.is_some(),
        ),
        _ => (error.to_string(), Vec::new(), None, false),
    };
    Some(class_of(&(
        failure,
        format!("{:?}", request.families),
        request.sharing_key,
        backend_key,
        ports,
        request.pool,
        sharing_with,
    )))
}

/// What can end the wait of a Service whose allocation failed with
/// `error` (see [`SyncOutcome::wake_on`]). One that may not share needs a
/// free address of its families in a pool it tried; one that may share
/// can also fit where a holder left or changed its terms there (a new
/// holder only narrows what fits). One refused the first address it asked
/// for waits for its holders to change: one leaving may free it or let it
/// share, and any change may change the holder its message names. A
/// failure of the configuration alone waits for a pool or Namespace
/// change.
fn wake_on_failure(error: &AllocError, request: &Request<'_>) -> Option<Vec<WakeOn>> {
    let sharing = !request.sharing_key.is_empty();
    let families: &[Family] = match request.families {
        FamilyPolicy::Single(family) => match family {
            Family::V4 => &[Family::V4],
            Family::V6 => &[Family::V6],
        },
        FamilyPolicy::RequireDual | FamilyPolicy::PreferDual { .. } => &[Family::V4, Family::V6],
    };
    match error {
        AllocError::NoAvailable { tried, .. } => {
            let named = tried
                .named
                .iter()
                .flat_map(|pool| families.iter().map(|f| WakeOn::Pool(pool.clone(), *f)));
            let pinned = tried
                .pinned
                .iter()
                .flat_map(|pinned| &pinned.rules)
                .flat_map(|rules| families.iter().map(|f| WakeOn::PinnedPool(*rules, *f)));
            let unpinned = tried
                .unpinned
                .iter()
                .flat_map(|_| families.iter().map(|f| WakeOn::UnpinnedPool(*f)));
            let mut wake: Vec<WakeOn> = named.chain(pinned).chain(unpinned).collect();
            if sharing {
                let regrouped = wake.iter().filter_map(WakeOn::regrouped);
                wake.extend(regrouped.collect::<Vec<_>>());
            }
            Some(wake)
        }
        // The first requested address taken is the one named. One before
        // it was free or could be shared, and a holder taking it from free
        // is no change of holders that a wake names: so any delete or
        // release wakes it, as re-running every waiting Service would.
        AllocError::Taken { ip, .. }
            if request.addresses.first().is_some_and(|first| first != ip) =>
        {
            None
        }
        AllocError::Taken { ip, .. } => Some(vec![WakeOn::Address(*ip), WakeOn::Holders(*ip)]),
        _ => Some(Vec::new()),
    }
}

/// The class and wake of a PreferDualStack Service that holds one family
/// and waits for the other: it can only get it from its own pool, so a
/// free address of that family there (or, if it may share, a holder
/// leaving an address of that family there or changing its terms) can end
/// its wait, and all such Services in one pool fail alike. Held
/// in a Cilium pool, it may get it from the Cilium pools that serve it too
/// (docs/cilium.md §3.5): its wait and class then name their groups (pools
/// with equal rules serve the same Services), not each pool, so that its
/// cost does not grow with the pools.
fn half_served_wait(
    allocator: &Allocator,
    view: &ServiceView<'_>,
    key: &str,
    namespace_labels: &BTreeMap<String, String>,
) -> (Option<u64>, Option<Vec<WakeOn>>) {
    let Some((pool, [ip])) = allocator.held(key) else {
        return (None, None);
    };
    let missing = Family::of(*ip).other();
    let cilium = allocator
        .pool(pool)
        .is_some_and(|p| p.kind == PoolKind::CiliumLoadBalancerIPPool);
    let groups: Vec<AutoGroup> = match (cilium, view.families) {
        (true, Some(families)) => {
            let requested = view.requested.as_deref().unwrap_or_default();
            let request = view.request(key, families, namespace_labels, requested);
            allocator.cilium_groups(&request, missing)
        }
        _ => Vec::new(),
    };
    let frees = std::iter::once(WakeOn::Pool(pool.to_owned(), missing)).chain(
        groups
            .iter()
            .map(|group| WakeOn::CiliumGroup(*group, missing)),
    );
    if !view.sharing_key.is_empty() {
        let mut ports = view.ports.to_vec();
        ports.sort();
        let class = class_of(&(
            "half-served",
            pool,
            &groups,
            missing,
            view.sharing_key,
            &*view.backend_key,
            ports,
            view.sharing_rule,
            view.sharing_namespaces
                .as_ref()
                .map(|listed| (view.namespace, listed)),
        ));
        let wake = frees
            .flat_map(|free| {
                let regrouped = free.regrouped();
                std::iter::once(free).chain(regrouped)
            })
            .collect();
        return (Some(class), Some(wake));
    }
    let class = class_of(&("half-served", pool, &groups, missing));
    (Some(class), Some(frees.collect()))
}

/// The Events of a decision itself: the clearing of status addresses no
/// longer allowed (unless the restore pass announced that already), and
/// the addresses given.
fn decision_events(
    decision: &Decision,
    announced_clear: Option<&Vec<String>>,
    status: &Vec<String>,
) -> Vec<Event> {
    let mut events = Vec::new();
    if let Some(reason) = &decision.cleared {
        if announced_clear != Some(status) {
            let cleared = decision.cleared_part.as_ref().unwrap_or(status);
            events.push(clear_event(cleared, reason));
        }
    }
    if let Outcome::Holds {
        given: Some(holding),
        ..
    } = &decision.outcome
    {
        events.push(allocated_event(holding));
    }
    events
}

/// The Warnings about the Service's annotations (deprecated, ignored,
/// unreadable): announced with a write of the addresses or pool (§4.2),
/// not of the condition alone.
fn annotation_events(
    service: &Service,
    view: &ServiceView<'_>,
    write: Option<&ServiceWrite>,
) -> Vec<Event> {
    let moves = write.is_some_and(|w| {
        !status_shows(service, &w.ingress) || pool_annotation(service) != w.pool.as_deref()
    });
    if !moves {
        return Vec::new();
    }
    let deprecated = (!view.deprecated.is_empty()).then(|| deprecated_event(&view.deprecated));
    deprecated
        .into_iter()
        .chain(
            view.warnings
                .iter()
                .map(|w| event(EventType::Warning, w.reason, w.message.clone())),
        )
        .collect()
}

fn allocated_event(holding: &AllocatorHolding) -> Event {
    event(
        EventType::Normal,
        reason::IP_ALLOCATED,
        assigned_message(&holding.ips),
    )
}

fn failed_event(key: &str, reason: &str) -> Event {
    event(
        EventType::Warning,
        reason::ALLOCATION_FAILED,
        format!("Failed to allocate IP for {key:?}: {reason}"),
    )
}

fn invalid_event(reason: &str) -> Event {
    event(
        EventType::Warning,
        reason::LOAD_BALANCER_FAILED,
        format!("invalid request: {reason}"),
    )
}

fn clear_event(status: &[String], reason: &str) -> Event {
    event(
        EventType::Normal,
        reason::CLEAR_ASSIGNMENT,
        format!(
            "current IP {} not allowed by config, clearing: {reason}",
            quoted_strings(status)
        ),
    )
}

impl Shortcuts for AllocatingController {
    /// The echo of our own write (or any update that leaves what we read as
    /// it was and shows what we hold) changes nothing, if what it shows may
    /// be kept: what the last reconciliation left is not always allowed
    /// (a PreferDualStack Service completed with a family its requested
    /// addresses do not name is released by the next one).
    fn is_settled_update(&self, key: &str, old: &Service, new: &Service) -> bool {
        if self.config.exhaustive
            || !is_ours(new, self.config.lb_class.as_deref())
            || !same_but_written(old, new)
        {
            return false;
        }
        let view = ServiceView::new(new, self.config.sharing_across_namespaces);
        let (Some(families), Ok(requested)) = (view.families, view.requested.as_deref()) else {
            return false;
        };
        let namespace = self.store.namespace(view.namespace);
        let request = view.request(key, families, labels_of(&namespace), requested);
        let state = self.lock();
        state.shows_holding(
            key,
            new,
            families,
            requested,
            !self.config.without_conditions,
            self.cilium_active(&state),
        ) && state
            .allocator
            .held(key)
            .is_some_and(|(_, ips)| state.allocator.can_keep(&request, ips).is_ok())
    }

    fn touched_by_change(&self) -> Option<Touched> {
        if self.config.exhaustive {
            return None;
        }
        self.lock().touched.clone()
    }

    /// The allocator's loosenings and the Namespace events. None while a
    /// `CiliumLoadBalancerIPPool` exists: its selector may read the
    /// Service's name, which [`SyncOutcome::alike`] leaves out.
    fn failure_epoch(&self) -> Option<u64> {
        let state = self.lock();
        if self.config.exhaustive || !state.cilium_pools.is_empty() {
            return None;
        }
        let loosenings = state.allocator.loosenings();
        Some(loosenings.wrapping_add(state.namespace_events))
    }
}

#[async_trait]
impl Controller for AllocatingController {
    async fn set_balancer(&self, key: &str, service: Option<&Service>) -> SyncOutcome {
        self.reconciliations.fetch_add(1, Ordering::Relaxed);
        let plan = {
            let mut state = self.lock();
            self.plan(&mut state, key, service)
        };
        debug!(key, ?plan, "reconciled");
        let outcome = self.carry_out(key, plan).await;
        let mut state = self.lock();
        let held = match outcome.state {
            SyncState::Success => None,
            _ => state.allocator.held(key).map(|(_, ips)| ips.to_vec()),
        };
        let waiting = outcome.state == SyncState::Waiting;
        state
            .unsettled
            .book(key, held.as_deref().unwrap_or_default(), waiting);
        outcome
    }

    async fn set_pool(&self, name: &str, pool: Option<&IPAddressPool>) -> SyncOutcome {
        let change = {
            let mut state = self.lock();
            let before = state.allocator.ranges_named(name);
            let change = match pool {
                Some(pool) => {
                    let created = created_of(&pool.metadata);
                    state.allocator.set_pool_created(name, &pool.spec, created)
                }
                None => state.allocator.remove_pool(name),
            };
            let touched = touched_by(&state, name, &before, &change);
            state.touched = Some(touched);
            change
        };
        self.pool_changed(&change)
    }

    async fn set_cilium_pool(
        &self,
        name: &str,
        pool: Option<&CiliumLoadBalancerIPPool>,
    ) -> SyncOutcome {
        let change = {
            let mut state = self.lock();
            let was_active = self.cilium_active(&state);
            let before = state.allocator.ranges_named(name);
            let change = match pool {
                Some(pool) => {
                    state.cilium_pools.insert(name.to_owned());
                    let created = created_of(&pool.metadata);
                    state
                        .allocator
                        .set_cilium_pool_created(name, &pool.spec, created)
                }
                None => {
                    state.cilium_pools.remove(name);
                    state.allocator.remove_cilium_pool(name)
                }
            };
            let mut touched = touched_by(&state, name, &before, &change);
            if was_active != self.cilium_active(&state) {
                // Cilium's condition comes or goes on every Service.
                let holders = state.allocator.holdings().into_iter().map(|(key, _)| key);
                touched.services.extend(holders);
                touched.services.extend(state.last_warning.keys().cloned());
                touched.services.extend(state.parked.keys().cloned());
                touched.changes = None;
            }
            state.touched = Some(touched);
            change
        };
        self.pool_changed(&change)
    }

    async fn set_namespace(&self, name: &str, namespace: Option<&Namespace>) -> SyncOutcome {
        let labels = namespace
            .and_then(|ns| ns.metadata.labels.clone())
            .unwrap_or_default();
        let changed = {
            let mut state = self.lock();
            state.namespace_events = state.namespace_events.wrapping_add(1);
            let previous = if labels.is_empty() {
                state.namespace_labels.remove(name)
            } else {
                state
                    .namespace_labels
                    .insert(name.to_owned(), labels.clone())
            };
            let previous = previous.unwrap_or_default();
            let changed = previous != labels;
            if changed {
                // Labels change what the pools serve in this namespace
                // only, and there only if a pool's selectors tell the old
                // labels from the new: elsewhere, or else, every holder
                // keeps what it holds.
                let matters = state
                    .allocator
                    .namespace_labels_matter(name, &previous, &labels);
                let touched = touched_by_namespace(&mut state, name, matters);
                state.touched = Some(touched);
            }
            changed
        };
        let mut outcome = SyncOutcome::success();
        if changed {
            outcome.reconsider = Reconsider::All;
        }
        outcome
    }

    async fn restore(&self, key: &str, service: &Service) -> RestoreOutcome {
        self.restores.fetch_add(1, Ordering::Relaxed);
        let (outcome, clear) = {
            let mut state = self.lock();
            self.restore_locked(&mut state, key, service)
        };
        if let Some(clear) = clear {
            if let Err(error) = self.client.emit_event(key, &clear).await {
                self.event_errors.fetch_add(1, Ordering::Relaxed);
                warn!(key, %error, reason = %clear.reason, "could not emit event");
            }
        }
        outcome
    }

    fn mark_synced(&self) {
        let mut state = self.lock();
        state.touched = None;
        info!(pools = state.allocator.pool_stats().len(), "synced");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_messages_are_capped_at_a_char_boundary() {
        let long = format!("x{}", "é".repeat(5000));
        let capped = event(EventType::Warning, reason::LOAD_BALANCER_FAILED, long);
        assert!(capped.message.len() <= crate::client::MAX_EVENT_NOTE);
        assert!(capped.message.ends_with('…'));
        let short = event(EventType::Normal, reason::IP_ALLOCATED, "ok".into());
        assert_eq!(short.message, "ok");
    }
}
