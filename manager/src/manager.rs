//! The queue and its one worker (docs/allocation.md §5).
//!
//! Handler calls only record order information and queue a key; the worker
//! takes keys one at a time, reads the current object from the [`Store`] and
//! calls the [`Controller`]. All queue state sits behind one mutex that is
//! never held across an `.await` nor while the controller or the store runs.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, Service};
use subscriber::{CiliumLoadBalancerIPPool, Error, Handler, IPAddressPool, Keyed};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::controller::{
    Controller, Reconsider, RestoreOutcome, SyncOutcome, SyncState, Touched, WakeOn,
};
use crate::Store;

/// The hasher of the queue's maps: keys are the cluster's own object names,
/// so SipHash's resistance to chosen keys buys nothing here.
type FastHash = foldhash::fast::RandomState;

/// How the [`Manager`] retries a key whose reconciliation asked for it.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    retry_base: Duration,
    retry_cap: Duration,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            retry_base: Duration::from_millis(10),
            retry_cap: Duration::from_secs(5),
        }
    }
}

impl ManagerConfig {
    /// The delay before the first retry of a key; each further failure in a
    /// row doubles it (default 10ms).
    #[must_use]
    pub fn retry_base(mut self, base: Duration) -> Self {
        self.retry_base = base;
        self
    }

    /// The longest delay between two retries of a key (default 5s).
    #[must_use]
    pub fn retry_cap(mut self, cap: Duration) -> Self {
        self.retry_cap = cap;
        self
    }

    /// `retry_base * 2^attempts`, at most `retry_cap`.
    fn backoff(&self, attempts: u32) -> Duration {
        2u32.checked_pow(attempts)
            .and_then(|factor| self.retry_base.checked_mul(factor))
            .map_or(self.retry_cap, |delay| delay.min(self.retry_cap))
    }
}

/// What the queue carries: one FIFO for every kind, so events are processed
/// in the order they came.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum QueueKey {
    /// `namespace/name`.
    Service(String),
    Pool(String),
    /// A `CiliumLoadBalancerIPPool`: a key of its own, since the object is
    /// another one even where the name is an `IPAddressPool`'s too.
    CiliumPool(String),
    Namespace(String),
}

impl QueueKey {
    fn kind(&self) -> &'static str {
        match self {
            QueueKey::Service(_) => "Service",
            QueueKey::Pool(_) => "IPAddressPool",
            QueueKey::CiliumPool(_) => "CiliumLoadBalancerIPPool",
            QueueKey::Namespace(_) => "Namespace",
        }
    }

    fn name(&self) -> &str {
        match self {
            QueueKey::Service(name)
            | QueueKey::Pool(name)
            | QueueKey::CiliumPool(name)
            | QueueKey::Namespace(name) => name,
        }
    }
}

/// Where a wake is: reconsidering every waiting Service in order (docs/
/// allocation.md §4.6) would still run those from the waiting order `from`
/// on, but the one whose release woke them.
struct WakeThrough {
    from: u64,
    waker: Option<String>,
}

/// Everything the handlers and the worker share.
#[derive(Default)]
struct State {
    /// `mark_synced` was called.
    sync_requested: bool,
    /// The worker has run the sync passes; it decides from now on.
    synced: bool,
    queue: VecDeque<QueueKey>,
    /// The keys in `queue`.
    queued: HashSet<QueueKey, FastHash>,
    in_flight: Option<QueueKey>,
    /// The in-flight key was queued again while being processed.
    requeue: bool,
    /// Source of first-seen, waiting and retry sequence numbers.
    next_seq: u64,
    /// Service key → sequence number of its first event since creation.
    first_seen: HashMap<String, u64, FastHash>,
    /// The Services waiting for an address.
    waiting: Waiting,
    /// Woken waiting Services still to reconsider, by waiting order; taken
    /// when the queue is empty.
    waking: BTreeMap<u64, String>,
    /// Woken Services not yet reconsidered: their waiting order and class.
    woken: HashMap<String, (u64, ClassId), FastHash>,
    /// The wake being worked through, until the queue and `waking` are
    /// empty (see [`State::wake_joined`]).
    wake_through: Option<WakeThrough>,
    /// Failures in a row of a key that asked for a retry.
    attempts: HashMap<QueueKey, u32, FastHash>,
    /// Pending retries by deadline (the sequence number breaks ties).
    retries: BTreeMap<(Instant, u64), QueueKey>,
    /// The entry of `retries` of each key.
    retry_of: HashMap<QueueKey, (Instant, u64), FastHash>,
    /// The Services both waiting and due for a retry, which every wake
    /// runs (see [`State::wake`]): found without a walk of every retry.
    waiting_retries: HashSet<String, FastHash>,
    /// Service, pool and Namespace events received so far: a restore pass
    /// during which none arrived saw every object as it is queued.
    events: u64,
    /// What the second pass learns of waiting Services alike.
    alike: AlikeFailures,
}

/// Waiting Services that the second pass of a pool or Namespace change
/// reconsiders only because they wait (docs/allocation.md §4.6), and what
/// those alike did in it (docs/allocation.md §4.9).
///
/// Two Services alike ([`SyncOutcome::alike`]) fail alike, with the same
/// message, in the same allocator state, and a new holder only narrows
/// what fits. So once one fails again at a [`Shortcuts::failure_epoch`],
/// another alike that is quiet (no event since it last failed, no retry
/// due, nothing released by the first pass) would fail again as it did
/// last, at that epoch: it would write and emit nothing, and is not run.
/// A change with W waiting Services alike in a few ways costs a
/// reconciliation per way, not W.
#[derive(Debug, Default)]
struct AlikeFailures {
    /// Quiet waiting Services queued by the pass: key → how alike.
    quiet: HashMap<String, u64, FastHash>,
    /// How alike → the epoch at which one failed again in the pass.
    failed: HashMap<u64, u64, FastHash>,
}

/// When a key is processed: in the sync pass (everything is considered
/// next anyway, so nothing follows from it) or in the steady state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Sync,
    Steady,
}

/// Which first pass (docs/allocation.md §4.5) runs: at sync, over every
/// known Service, or after a pool or Namespace change, over those it may
/// have touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FirstPass {
    AtSync,
    AfterChange,
}

/// The second of the two passes (docs/allocation.md §4.5), as the first pass found
/// it.
#[derive(Debug, Default)]
struct SecondPass {
    /// Those that had to release, then those without addresses.
    first: Vec<String>,
    /// How many of `first` had to release.
    released: usize,
    /// Those that kept their addresses, and whether each is settled
    /// ([`RestoreOutcome::Settled`]).
    kept: Vec<(String, bool)>,
    /// [`State::events`] when the first pass started.
    events: u64,
}

/// The Service whose reconciliation wakes the waiting ones, and whether it
/// waits itself (it failed to get an address just now).
#[derive(Clone, Copy)]
struct Waker<'a> {
    key: &'a str,
    waits: bool,
}

/// A class of waiting Services (see [`Waiting`]): from the controller's
/// demand class, or a Service alone (its waiting order makes it unique).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum ClassId {
    Demand(u64),
    Alone(u64),
}

/// The members of one class, by waiting order, and what can end their wait.
#[derive(Debug)]
struct Class {
    members: BTreeMap<u64, String>,
    /// `None`: any delete or release (see [`SyncOutcome::wake_on`]).
    wake_on: Option<Vec<WakeOn>>,
}

/// Whether a class waits on some changes of configuration alone
/// ([`WakeOn::PoolChanged`] and the like): another change leaves it out.
fn parked(wake_on: &Option<Vec<WakeOn>>) -> bool {
    wake_on
        .as_ref()
        .is_some_and(|keys| !keys.is_empty() && keys.iter().all(WakeOn::is_change))
}

/// The Services waiting for an address (docs/allocation.md §4.6), in
/// waiting order, indexed by what can end their wait (§4.9).
///
/// A class (from [`SyncOutcome::waiting_class`]) groups Services whose
/// failure depends only on the configuration and their demand: given the
/// same allocator state they fail alike. So when a wake reconsiders the
/// first of a class and it fails again, the others would too, and are not
/// run: a delete costs a reconciliation per class, not per waiting Service.
/// And a class that waits for something in particular (a free address of
/// a family in a pool, an address) is woken only by a release that frees
/// it: an unrelated delete costs nothing per waiting Service. One that
/// waits on a change of configuration alone (of a pool it asked for, say)
/// is looked at only after such a change: a change of another pool costs
/// nothing per such Service.
#[derive(Debug, Default)]
struct Waiting {
    /// key → (waiting since, class).
    entries: HashMap<String, (u64, ClassId), FastHash>,
    /// key → how alike (see [`SyncOutcome::alike`]), for those in a class.
    alike: HashMap<String, u64, FastHash>,
    classes: HashMap<ClassId, Class, FastHash>,
    /// The classes that do not wait on a change of configuration alone
    /// (see [`parked`]): every pool or Namespace change looks at them.
    unparked: HashSet<ClassId, FastHash>,
    /// Classes woken by every delete or release.
    on_any: HashSet<ClassId, FastHash>,
    /// Classes woken by a release that frees this.
    on_key: HashMap<WakeOn, HashSet<ClassId, FastHash>, FastHash>,
}

impl Waiting {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn since(&self, key: &str) -> Option<u64> {
        self.entries.get(key).map(|(since, _)| *since)
    }

    /// Adds `key` or updates its class and what it waits for.
    fn insert(&mut self, key: &str, since: u64, class: Option<u64>, wake_on: Option<Vec<WakeOn>>) {
        let id = match class {
            Some(class) => ClassId::Demand(class),
            None => ClassId::Alone(since),
        };
        let unchanged = self.entries.get(key) == Some(&(since, id))
            && self.classes.get(&id).is_some_and(|c| c.wake_on == wake_on);
        if unchanged {
            return;
        }
        self.remove(key);
        let class = self.classes.entry(id).or_insert_with(|| Class {
            members: BTreeMap::new(),
            wake_on: None,
        });
        if class.members.is_empty() {
            class.wake_on = wake_on;
            if !parked(&class.wake_on) {
                self.unparked.insert(id);
            }
            match &class.wake_on {
                None => {
                    self.on_any.insert(id);
                }
                Some(keys) => {
                    for wake in keys {
                        self.on_key.entry(wake.clone()).or_default().insert(id);
                    }
                }
            }
        }
        class.members.insert(since, key.to_owned());
        self.entries.insert(key.to_owned(), (since, id));
    }

    /// Books how alike the waiting `key` is (kept only for one in a
    /// class).
    fn set_alike(&mut self, key: &str, alike: Option<u64>) {
        let in_class = matches!(self.entries.get(key), Some((_, ClassId::Demand(_))));
        match alike.filter(|_| in_class) {
            Some(alike) if self.alike.get(key) != Some(&alike) => {
                self.alike.insert(key.to_owned(), alike);
            }
            Some(_) => {}
            None => {
                self.alike.remove(key);
            }
        }
    }

    fn remove(&mut self, key: &str) {
        let Some((since, id)) = self.entries.remove(key) else {
            return;
        };
        self.alike.remove(key);
        let Some(class) = self.classes.get_mut(&id) else {
            return;
        };
        class.members.remove(&since);
        if !class.members.is_empty() {
            return;
        }
        if let Some(class) = self.classes.remove(&id) {
            self.unparked.remove(&id);
            match class.wake_on {
                None => {
                    self.on_any.remove(&id);
                }
                Some(keys) => {
                    for wake in keys {
                        if let Some(ids) = self.on_key.get_mut(&wake) {
                            ids.remove(&id);
                            if ids.is_empty() {
                                self.on_key.remove(&wake);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every key, longest-waiting first.
    fn in_order(&self) -> Vec<String> {
        let mut keys: Vec<(u64, &String)> = self
            .entries
            .iter()
            .map(|(k, (since, _))| (*since, k))
            .collect();
        keys.sort_unstable();
        keys.into_iter().map(|(_, key)| key.clone()).collect()
    }

    /// The waiting Services a pool or Namespace change may serve: every one
    /// but those waiting on other `changes` (`None`: every one). Costs the
    /// number of those returned, not of waiting Services.
    fn served_by_change(&self, changes: Option<&[WakeOn]>) -> Vec<String> {
        let Some(changes) = changes else {
            return self.entries.keys().cloned().collect();
        };
        // Only a parked class is keyed on a change.
        let parked = changes.iter().filter_map(|change| self.on_key.get(change));
        let ids = self.unparked.iter().chain(parked.flatten());
        ids.filter_map(|id| self.classes.get(id))
            .flat_map(|class| class.members.values().cloned())
            .collect()
    }

    /// What a release that frees `freed` wakes first: the first of each
    /// class woken by any release or by one of `freed`, with its waiting
    /// order and class, longest-waiting first. Costs the number of those
    /// classes, not of waiting Services.
    fn heads(&self, freed: &[WakeOn]) -> Vec<(u64, String, ClassId)> {
        let mut ids: HashSet<ClassId, FastHash> = self.on_any.clone();
        for wake in freed {
            if let Some(woken) = self.on_key.get(wake) {
                ids.extend(woken.iter().copied());
            }
        }
        let mut all: Vec<(u64, String, ClassId)> = ids
            .into_iter()
            .filter_map(|id| {
                let (since, key) = self.classes.get(&id)?.members.first_key_value()?;
                Some((*since, key.clone(), id))
            })
            .collect();
        all.sort_unstable();
        all
    }

    /// The member of `class` that has waited longest after `since`.
    fn next_in_class(&self, class: ClassId, since: u64) -> Option<(u64, String)> {
        self.first_in_class_from(class, since.saturating_add(1))
    }

    /// The member of `class` that has waited longest from `from` on.
    fn first_in_class_from(&self, class: ClassId, from: u64) -> Option<(u64, String)> {
        let members = &self.classes.get(&class)?.members;
        members
            .range(from..)
            .next()
            .map(|(since, key)| (*since, key.clone()))
    }
}

impl State {
    fn seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq = seq.saturating_add(1);
        seq
    }

    fn is_idle(&self) -> bool {
        self.synced
            && self.queue.is_empty()
            && self.waking.is_empty()
            && self.in_flight.is_none()
            && self.retries.is_empty()
    }

    /// Queues `key` unless it is queued already; a key in flight is queued
    /// again when it is done.
    fn enqueue(&mut self, key: QueueKey) {
        if self.in_flight.as_ref() == Some(&key) {
            self.requeue = true;
        } else if self.queued.insert(key.clone()) {
            tracing::trace!(kind = key.kind(), key = key.name(), "queued");
            if let QueueKey::Service(name) = &key {
                if let Some((since, _)) = self.woken.get(name) {
                    self.waking.remove(since);
                }
            }
            self.queue.push_back(key);
        }
    }

    /// Wakes the waiting Services (docs/allocation.md §4.6) that a release
    /// freeing `freed` may serve, longest-waiting first: the first of each
    /// such class (the others of a class follow only while those before
    /// them get addresses).
    fn wake(&mut self, freed: &[WakeOn], except: Option<Waker<'_>>) {
        self.wake_through = Some(WakeThrough {
            from: 0,
            waker: except.map(|waker| waker.key.to_owned()),
        });
        let mut heads = self.waiting.heads(freed);
        // One whose last write failed would write again if run now, as
        // running every waiting Service on every wake (docs/allocation.md
        // §4.6) would do: so every wake runs it, not only its retry.
        debug_assert_eq!(self.waiting_retries, self.waiting_retries_walked());
        let retrying = self.waiting_retries.iter().filter_map(|name| {
            let (since, class) = self.waiting.entries.get(name)?;
            Some((*since, name.clone(), *class))
        });
        heads.extend(retrying.collect::<Vec<_>>());
        heads.sort_unstable();
        heads.dedup();
        for (since, key, class) in heads {
            let head = match except {
                Some(waker) if waker.key == key => {
                    // It failed just now: the rest of its class would too.
                    if waker.waits {
                        continue;
                    }
                    // Booked waiting only until its failed write goes
                    // through: it does not stand for its class.
                    let Some(next) = self.waiting.next_in_class(class, since) else {
                        continue;
                    };
                    next
                }
                _ => (since, key),
            };
            self.wake_one(head, class);
        }
    }

    /// Wakes, while a wake is worked through, the waiting Services refused
    /// an address that a Service just took ([`SyncOutcome::joined`]) and
    /// that the wake has yet to reach: reconsidering every waiting Service
    /// in order (docs/allocation.md §4.6) runs them after it, and their
    /// message then names the holders with it.
    fn wake_joined(&mut self, joined: &[WakeOn]) {
        let Some(WakeThrough { from, waker }) = &self.wake_through else {
            return;
        };
        if joined.is_empty() {
            return;
        }
        let mut classes: Vec<ClassId> = joined
            .iter()
            .filter_map(|key| self.waiting.on_key.get(key))
            .flatten()
            .copied()
            .collect();
        classes.sort_unstable();
        classes.dedup();
        let (from, waker) = (*from, waker.clone());
        for class in classes {
            if let Some(first) = self.waiting.first_in_class_from(class, from) {
                if waker.as_ref() != Some(&first.1) {
                    self.wake_one(first, class);
                }
            }
        }
    }

    /// Wakes the waiting Service `key` of `class`: a queued one is run by
    /// its queue entry, and continues its class from there (see
    /// [`State::continue_class`]); one woken already does so anyway.
    fn wake_one(&mut self, (since, key): (u64, String), class: ClassId) {
        if self.woken.contains_key(&key) {
            return;
        }
        if !self.queued.contains(&QueueKey::Service(key.clone())) {
            self.waking.insert(since, key.clone());
        }
        self.woken.insert(key, (since, class));
    }

    /// Books whether `key`, a Service's, is both waiting and due for a
    /// retry: called after either changes.
    fn book_waiting_retry(&mut self, key: &QueueKey) {
        let QueueKey::Service(name) = key else {
            return;
        };
        if self.retry_of.contains_key(key) && self.waiting.entries.contains_key(name) {
            self.waiting_retries.insert(name.clone());
        } else {
            self.waiting_retries.remove(name);
        }
    }

    /// [`State::waiting_retries`] found by a walk of every retry, for the
    /// debug check that the set is kept right.
    fn waiting_retries_walked(&self) -> HashSet<String, FastHash> {
        let services = self.retry_of.keys().filter_map(|key| match key {
            QueueKey::Service(name) => Some(name),
            _ => None,
        });
        services
            .filter(|name| self.waiting.entries.contains_key(*name))
            .cloned()
            .collect()
    }

    /// Forgets every pending wake (everything is reconsidered anyway).
    fn clear_wakes(&mut self) {
        self.waking.clear();
        self.woken.clear();
        self.wake_through = None;
    }

    /// Marks `key`, just taken from the queue, in flight: a pending retry is
    /// now moot.
    fn start(&mut self, key: &QueueKey) {
        self.queued.remove(key);
        if let Some(entry) = self.retry_of.remove(key) {
            self.retries.remove(&entry);
            self.book_waiting_retry(key);
        }
        self.in_flight = Some(key.clone());
    }

    /// Queues the retries due at `now`, then takes the first key.
    fn pop(&mut self, now: Instant) -> Option<QueueKey> {
        while let Some(entry) = self.retries.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.retry_of.remove(&key);
            self.book_waiting_retry(&key);
            self.enqueue(key);
        }
        let key = match self.queue.pop_front() {
            Some(key) => key,
            None => QueueKey::Service(self.waking.pop_first()?.1),
        };
        self.start(&key);
        Some(key)
    }

    /// Takes the first pool (of either kind) or Namespace key (sync, first
    /// pass).
    fn pop_non_service(&mut self) -> Option<QueueKey> {
        let index = self
            .queue
            .iter()
            .position(|k| !matches!(k, QueueKey::Service(_)))?;
        let key = self.queue.remove(index)?;
        self.start(&key);
        Some(key)
    }

    fn schedule_retry(&mut self, key: QueueKey, at: Instant) {
        let entry = (at, self.seq());
        if let Some(old) = self.retry_of.insert(key.clone(), entry) {
            self.retries.remove(&old);
        }
        self.book_waiting_retry(&key);
        self.retries.insert(entry, key);
    }

    /// The keys of `map` by their sequence number, lowest first.
    fn in_order(map: &HashMap<String, u64, FastHash>) -> Vec<String> {
        let mut keys: Vec<(u64, &String)> = map.iter().map(|(k, seq)| (*seq, k)).collect();
        keys.sort_unstable();
        keys.into_iter().map(|(_, key)| key.clone()).collect()
    }

    /// Books the outcome of the in-flight `key` and queues what follows
    /// from it (`Reconsider::All` is the caller's two-pass business).
    /// Nothing follows in the sync pass ([`Stage::Sync`]), where everything is considered
    /// next anyway.
    fn finish(
        &mut self,
        key: QueueKey,
        deleted: bool,
        outcome: SyncOutcome,
        stage: Stage,
        config: &ManagerConfig,
    ) {
        self.in_flight = None;
        let requeue = std::mem::take(&mut self.requeue);
        let service = match &key {
            QueueKey::Service(name) => Some(name.as_str()),
            _ => None,
        };
        if let Some(name) = service {
            if let Some((since, _)) = self.woken.get(name) {
                // The wake has reached it.
                if let Some(wake) = &mut self.wake_through {
                    wake.from = since.saturating_add(1);
                }
            }
            let waits = matches!(outcome.state, SyncState::Waiting) && !deleted;
            let waits_in = outcome.waiting_class.filter(|_| waits).map(ClassId::Demand);
            self.continue_class(name, waits_in);
        }
        if let (Some(name), true) = (service, deleted) {
            self.waiting.remove(name);
            self.book_waiting_retry(&key);
            // A delete forgot the key when it came; an event since then
            // (requeue) may have made it known again.
            if !requeue {
                self.first_seen.remove(name);
            }
        }
        self.book_state(&key, deleted, &outcome, config);
        if requeue {
            self.enqueue(key.clone());
        }
        if stage == Stage::Sync {
            return;
        }
        let mut others = Vec::new();
        if outcome.wake_waiting {
            let waker = service.map(|key| Waker {
                key,
                waits: outcome.state == SyncState::Waiting || outcome.waiting_too,
            });
            self.wake(&outcome.freed, waker);
        } else {
            self.wake_joined(&outcome.joined);
        }
        match outcome.reconsider {
            Reconsider::None => {}
            Reconsider::Keys(keys) => others.extend(keys),
            Reconsider::All => {}
        }
        for other in others {
            if service != Some(other.as_str()) {
                self.enqueue(QueueKey::Service(other));
            }
        }
        if self.queue.is_empty() && self.waking.is_empty() {
            self.wake_through = None;
        }
    }

    /// A woken Service of a class that got an address, is gone or waits in
    /// another class now (`waits_in`): the next of its class may get one
    /// too.
    fn continue_class(&mut self, name: &str, waits_in: Option<ClassId>) {
        let Some((since, class)) = self.woken.remove(name) else {
            return;
        };
        if waits_in == Some(class) {
            return;
        }
        if let Some(next) = self.waiting.next_in_class(class, since) {
            self.wake_one(next, class);
        }
    }

    /// Books how the reconciliation of `key` ended: a retry with backoff,
    /// waiting (§4.6), or done.
    fn book_state(
        &mut self,
        key: &QueueKey,
        deleted: bool,
        outcome: &SyncOutcome,
        config: &ManagerConfig,
    ) {
        let service = match key {
            QueueKey::Service(name) => Some(name.as_str()),
            _ => None,
        };
        match &outcome.state {
            SyncState::Retry(reason) => {
                if let (Some(name), true, false) = (service, outcome.waiting_too, deleted) {
                    self.wait(name, outcome);
                }
                let attempts = self.attempts.entry(key.clone()).or_insert(0);
                let delay = config.backoff(*attempts);
                *attempts = attempts.saturating_add(1);
                tracing::warn!(kind = key.kind(), key = key.name(), %reason, ?delay, "retrying");
                let now = Instant::now();
                let year = Duration::from_secs(365 * 86_400);
                let at = now.checked_add(delay).unwrap_or_else(|| now + year);
                self.schedule_retry(key.clone(), at);
            }
            SyncState::Waiting if !deleted => {
                self.attempts.remove(key);
                if let Some(name) = service {
                    self.wait(name, outcome);
                }
            }
            SyncState::Success | SyncState::Invalid | SyncState::Waiting => {
                self.attempts.remove(key);
                if let Some(name) = service {
                    self.waiting.remove(name);
                    self.book_waiting_retry(key);
                }
            }
        }
    }

    /// `touched` and every busy Service, known ones only, in first-seen
    /// order; with each, whether it is quiet (see [`State::is_quiet`]).
    fn touched_in_order(&self, touched: Touched) -> Vec<(String, bool)> {
        let touched_services: HashSet<&String, FastHash> = touched.services.iter().collect();
        let mut keys: Vec<(u64, String)> = touched
            .services
            .iter()
            .cloned()
            .chain(touched.failing)
            .chain(self.busy_services(touched.changes.as_deref()))
            .filter_map(|key| Some((*self.first_seen.get(&key)?, key)))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
            .map(|(_, key)| {
                let quiet = !touched_services.contains(&key) && self.is_quiet(&key);
                (key, quiet)
            })
            .collect()
    }

    /// Whether the Service `key` waits with nothing pending: not queued
    /// (no event to reconcile), not in flight, not woken, due no retry (its
    /// last write went through). Its status then shows no address but one
    /// it holds; so, unless the change touched what it holds, its first
    /// pass would keep that and change nothing.
    fn is_quiet(&self, key: &str) -> bool {
        let service = QueueKey::Service(key.to_owned());
        self.waiting.entries.contains_key(key)
            && !self.waiting_retries.contains(key)
            && !self.queued.contains(&service)
            && self.in_flight.as_ref() != Some(&service)
            && !self.woken.contains_key(key)
    }

    /// The Services queued, in flight, woken, waiting (but on other changes
    /// than `changes`, see [`Waiting::served_by_change`]) or due for a
    /// retry.
    fn busy_services(&self, changes: Option<&[WakeOn]>) -> HashSet<String> {
        let keys = self
            .queue
            .iter()
            .chain(&self.in_flight)
            .chain(self.retry_of.keys());
        let services = keys.filter_map(|key| match key {
            QueueKey::Service(name) => Some(name.clone()),
            QueueKey::Pool(_) | QueueKey::CiliumPool(_) | QueueKey::Namespace(_) => None,
        });
        services
            .chain(self.waiting.served_by_change(changes))
            .chain(self.woken.keys().cloned())
            .collect()
    }

    /// The Service `name` waits for an address, in the class and for what
    /// `outcome` says; failing again keeps its place (§4.6).
    fn wait(&mut self, name: &str, outcome: &SyncOutcome) {
        let since = match self.waiting.since(name) {
            Some(since) => since,
            None => self.seq(),
        };
        let wake_on = outcome.wake_on.clone();
        self.waiting
            .insert(name, since, outcome.waiting_class, wake_on);
        self.waiting.set_alike(name, outcome.alike);
        self.book_waiting_retry(&QueueKey::Service(name.to_owned()));
    }

    /// Queues the second of the two passes: Pool and Namespace keys already
    /// queued first, then the Services in `pass` order, then any other
    /// queued Service.
    ///
    /// A settled Service is left out (its reconciliation would do nothing),
    /// even when an earlier event queued it, since the first pass saw its
    /// current object: unless an event came during the first pass (the
    /// object may have changed since), or it waits or retries (its
    /// reconciliation books that).
    fn queue_second_pass(&mut self, pass: SecondPass) {
        self.clear_wakes();
        let exact = self.events == pass.events;
        self.alike = AlikeFailures::default();
        if exact {
            let without = pass.first.iter().skip(pass.released);
            let quiet = without.filter_map(|key| Some((key.clone(), self.quiet_alike(key)?)));
            self.alike.quiet = quiet.collect();
        }
        let mut left_out = HashSet::new();
        let mut order = pass.first;
        for (key, settled) in pass.kept {
            let busy = self.waiting.since(&key).is_some()
                || self.retry_of.contains_key(&QueueKey::Service(key.clone()));
            if settled && exact && !busy {
                left_out.insert(key);
            } else {
                order.push(key);
            }
        }
        let old = std::mem::take(&mut self.queue);
        self.queued.clear();
        let (services, others): (Vec<_>, Vec<_>) = old
            .into_iter()
            .partition(|key| matches!(key, QueueKey::Service(_)));
        others.into_iter().for_each(|key| self.enqueue(key));
        order
            .into_iter()
            .for_each(|key| self.enqueue(QueueKey::Service(key)));
        for key in services {
            // Queued before the pass: its event is still to be reconciled.
            self.alike.quiet.remove(key.name());
            if !left_out.contains(key.name()) {
                self.enqueue(key);
            }
        }
    }

    /// How alike the Service `key` is, if it waits and is due no retry.
    fn quiet_alike(&self, key: &str) -> Option<u64> {
        let alike = *self.waiting.alike.get(key)?;
        (!self.waiting_retries.contains(key)).then_some(alike)
    }

    /// The outcome of the quiet waiting Service `key`, `alike` as it is,
    /// at `epoch` if one alike failed again at it.
    fn failed_alike(&self, key: &str, alike: u64, epoch: u64) -> Option<SyncOutcome> {
        if self.alike.failed.get(&alike) != Some(&epoch) {
            return None;
        }
        let (_, class) = self.waiting.entries.get(key)?;
        let ClassId::Demand(demand) = class else {
            return None;
        };
        let wake_on = self.waiting.classes.get(class)?.wake_on.clone();
        let mut outcome = SyncOutcome::new(SyncState::Waiting);
        outcome.waiting_class = Some(*demand);
        outcome.alike = Some(alike);
        outcome.wake_on = wake_on;
        Some(outcome)
    }
}

struct Inner<C> {
    store: Arc<dyn Store>,
    controller: Arc<C>,
    config: ManagerConfig,
    state: Mutex<State>,
    /// Wakes the worker: a key was queued or sync was requested.
    work: Notify,
    /// Whether [`State::is_idle`] holds.
    idle: watch::Sender<bool>,
    started: AtomicBool,
}

/// Queues Service, pool and Namespace keys from the subscriber handler traits
/// and reconciles them, one at a time, through a [`Controller`].
///
/// Cheap to clone; every clone is the same manager. Register it on the host's
/// chains, [`start`](Manager::start) its worker, and call
/// [`mark_synced`](Manager::mark_synced) once the host's initial list is in.
pub struct Manager<C> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for Manager<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C> fmt::Debug for Manager<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("Manager")
            .field("synced", &state.synced)
            .field("queued", &state.queue.len())
            .field("in_flight", &state.in_flight)
            .field("waiting", &state.waiting.len())
            .field("waking", &state.waking.len())
            .field("retries", &state.retries.len())
            .finish_non_exhaustive()
    }
}

impl<C> Manager<C> {
    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the state under the lock and publishes idleness.
    fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self.state();
        let result = f(&mut state);
        let idle = state.is_idle();
        self.inner
            .idle
            .send_if_modified(|old| std::mem::replace(old, idle) != idle);
        result
    }

    /// Records the event of `key` with `f` and queues it.
    fn push(&self, key: QueueKey, f: impl FnOnce(&mut State)) {
        self.with_state(|state| {
            state.events = state.events.wrapping_add(1);
            if let QueueKey::Service(name) = &key {
                state.alike.quiet.remove(name);
            }
            f(state);
            state.enqueue(key);
        });
        self.inner.work.notify_one();
    }

    /// The host's initial list is complete: the worker, when it runs, applies
    /// the queued pools and Namespaces, restores every Service's held
    /// addresses, and from then on decides (docs/allocation.md §4.5).
    pub fn mark_synced(&self) {
        self.with_state(|state| state.sync_requested = true);
        self.inner.work.notify_one();
    }

    /// Whether [`mark_synced`](Manager::mark_synced) was called (the worker
    /// may still be running the sync passes; [`idle`](Manager::idle) waits
    /// for them).
    pub fn is_synced(&self) -> bool {
        self.state().sync_requested
    }

    /// The Services waiting for an address, the one that has waited longest
    /// first.
    pub fn waiting_keys(&self) -> Vec<String> {
        self.state().waiting.in_order()
    }

    /// Resolves once the sync passes are done, the queue is empty, no key is
    /// in flight and no retry is pending.
    pub async fn idle(&self) {
        let mut idle = self.inner.idle.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = idle.wait_for(|idle| *idle).await;
    }
}

impl<C: Controller> Manager<C> {
    /// A manager that reads objects from `store` and decides through
    /// `controller`; nothing runs until [`start`](Manager::start).
    pub fn new(store: Arc<dyn Store>, controller: Arc<C>, config: ManagerConfig) -> Self {
        let inner = Inner {
            store,
            controller,
            config,
            state: Mutex::new(State::default()),
            work: Notify::new(),
            idle: watch::Sender::new(false),
            started: AtomicBool::new(false),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Spawns the worker on the current tokio runtime. When `cancel` fires,
    /// the key in flight finishes, nothing else starts, and the task returns.
    /// There is one worker: a second call returns a task that does nothing.
    pub fn start(&self, cancel: CancellationToken) -> JoinHandle<()> {
        if self.inner.started.swap(true, Ordering::SeqCst) {
            tracing::warn!("Manager::start called again; the worker is already running");
            return tokio::spawn(async {});
        }
        let manager = self.clone();
        tokio::spawn(async move { manager.run(cancel).await })
    }

    async fn run(self, cancel: CancellationToken) {
        tracing::debug!("worker started");
        loop {
            if cancel.is_cancelled() {
                return;
            }
            if self.state().sync_requested {
                break;
            }
            tokio::select! {
                biased;
                () = cancel.cancelled() => return,
                () = self.inner.work.notified() => {}
            }
        }
        if !self.sync(&cancel).await {
            return;
        }
        while !cancel.is_cancelled() {
            let now = Instant::now();
            let next = self.with_state(|state| {
                state
                    .pop(now)
                    .ok_or_else(|| state.retries.keys().next().map(|(at, _)| *at))
            });
            match next {
                Ok(key) => self.process(key, Stage::Steady).await,
                Err(deadline) => {
                    let retry = async {
                        match deadline {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        biased;
                        () = cancel.cancelled() => {}
                        () = self.inner.work.notified() => {}
                        () = retry => {}
                    }
                }
            }
        }
        tracing::debug!("worker stopped");
    }

    /// The sync passes of docs/allocation.md §4.5; false when cancelled midway.
    async fn sync(&self, cancel: &CancellationToken) -> bool {
        tracing::info!("synced: applying pools and Namespaces, restoring Services");
        while let Some(key) = self.with_state(State::pop_non_service) {
            self.process(key, Stage::Sync).await;
            if cancel.is_cancelled() {
                return false;
            }
        }
        let pass = self.restore_pass(FirstPass::AtSync).await;
        self.inner.controller.mark_synced();
        self.with_state(|state| {
            state.queue_second_pass(pass);
            state.synced = true;
        });
        tracing::info!("sync passes done");
        true
    }

    /// The first of the two passes of docs/allocation.md §4.5 (at sync and after a
    /// pool or Namespace change): every known Service, in first-seen order,
    /// keeps its status addresses if still allowed or releases them. Returns
    /// the second pass: those that had to release first, then those without
    /// addresses (with a PreferDualStack one that kept one family and waits
    /// for the other, at its first-seen place), then those that kept theirs.
    ///
    /// After a change ([`FirstPass::AfterChange`]), only the Services the change may have
    /// touched ([`Controller::touched_by_change`]) and those that wait,
    /// retry or had an event are looked at: the others hold what the
    /// change left as it was.
    async fn restore_pass(&self, pass: FirstPass) -> SecondPass {
        let touched = if pass == FirstPass::AfterChange {
            self.inner.controller.touched_by_change()
        } else {
            None
        };
        let (known, events) = self.with_state(|state| {
            let known = match touched {
                Some(touched) => state.touched_in_order(touched),
                None => State::in_order(&state.first_seen)
                    .into_iter()
                    .map(|key| (key, false))
                    .collect(),
            };
            (known, state.events)
        });
        let (mut kept, mut release, mut nothing) = (Vec::new(), Vec::new(), Vec::new());
        for (key, quiet) in known {
            if quiet {
                // Its first pass would keep what it holds, if anything.
                nothing.push(key);
                continue;
            }
            let restored = match self.inner.store.service(&key) {
                Some(service) => self.inner.controller.restore(&key, &service).await,
                None => RestoreOutcome::Nothing,
            };
            tracing::debug!(key, ?restored, "restored");
            match restored {
                RestoreOutcome::Kept => kept.push((key, false)),
                // Waits for its other family: among the others, at its
                // first-seen place (§4.5).
                RestoreOutcome::KeptIncomplete => nothing.push(key),
                RestoreOutcome::Settled => kept.push((key, true)),
                RestoreOutcome::MustRelease => release.push(key),
                RestoreOutcome::Nothing => nothing.push(key),
            }
        }
        let released = release.len();
        release.append(&mut nothing);
        SecondPass {
            first: release,
            released,
            kept,
            events,
        }
    }

    /// Reconciles `key`, which is in flight, and books the outcome.
    async fn process(&self, key: QueueKey, stage: Stage) {
        let (kind, name) = (key.kind(), key.name());
        tracing::debug!(kind, key = name, "processing");
        let controller = &self.inner.controller;
        let store = &self.inner.store;
        let (outcome, deleted) = match &key {
            QueueKey::Service(name) => self.reconcile_service(name).await,
            QueueKey::Pool(name) => {
                let pool = store.pool(name);
                (
                    controller.set_pool(name, pool.as_deref()).await,
                    pool.is_none(),
                )
            }
            QueueKey::CiliumPool(name) => {
                let pool = store.cilium_pool(name);
                (
                    controller.set_cilium_pool(name, pool.as_deref()).await,
                    pool.is_none(),
                )
            }
            QueueKey::Namespace(name) => {
                let namespace = store.namespace(name);
                (
                    controller.set_namespace(name, namespace.as_deref()).await,
                    namespace.is_none(),
                )
            }
        };
        tracing::debug!(kind, key = name, deleted, ?outcome, "processed");
        let reconsider_all = stage == Stage::Steady && outcome.reconsider == Reconsider::All;
        let config = &self.inner.config;
        self.with_state(|state| state.finish(key, deleted, outcome, stage, config));
        if reconsider_all {
            let pass = self.restore_pass(FirstPass::AfterChange).await;
            self.with_state(|state| state.queue_second_pass(pass));
        }
    }

    /// Reconciles the Service `name`, unless it is a quiet waiting one and
    /// one alike failed again at this epoch (see [`AlikeFailures`]);
    /// returns the outcome and whether it is deleted.
    async fn reconcile_service(&self, name: &str) -> (SyncOutcome, bool) {
        let controller = &self.inner.controller;
        // The alike bookkeeping leaves idleness as it is: no `with_state`.
        let alike = self.state().alike.quiet.remove(name);
        let epoch = alike.and_then(|_| controller.failure_epoch());
        if let (Some(alike), Some(epoch)) = (alike, epoch) {
            if let Some(outcome) = self.state().failed_alike(name, alike, epoch) {
                tracing::trace!(key = name, "fails as one alike did");
                return (outcome, false);
            }
        }
        let service = self.inner.store.service(name);
        let outcome = controller.set_balancer(name, service.as_deref()).await;
        let stable = epoch.is_some() && controller.failure_epoch() == epoch;
        if let (true, Some(epoch), SyncState::Waiting, Some(alike)) =
            (stable, epoch, &outcome.state, outcome.alike)
        {
            self.state().alike.failed.insert(alike, epoch);
        }
        (outcome, service.is_none())
    }

    /// An update the controller called settled is not queued once the
    /// manager decides (before that, every event is kept for the sync
    /// passes) and the key is known; returns whether it was left out.
    fn settled_update(&self, key: &str) -> bool {
        self.with_state(|state| {
            if !state.synced || !state.first_seen.contains_key(key) {
                return false;
            }
            state.events = state.events.wrapping_add(1);
            true
        })
    }

    /// A Service event: the key is first seen now unless it is known.
    fn service_event(&self, key: String) {
        let entry = key.clone();
        self.push(QueueKey::Service(key), |state| {
            if !state.first_seen.contains_key(&entry) {
                let seq = state.seq();
                state.first_seen.insert(entry, seq);
            }
        });
    }
}

/// Services: an update the controller calls settled may be left out (see
/// `settled_update`); a delete forgets the key.
#[async_trait]
impl<C: Controller> Handler<Service> for Manager<C> {
    async fn on_add(&self, service: &Service) -> Result<(), Error> {
        self.service_event(service.key()?);
        Ok(())
    }

    async fn on_update(&self, old: &Service, new: &Service) -> Result<(), Error> {
        let key = new.key()?;
        if self.inner.controller.is_settled_update(&key, old, new) && self.settled_update(&key) {
            return Ok(());
        }
        self.service_event(key);
        Ok(())
    }

    async fn on_delete(&self, service: &Service) -> Result<(), Error> {
        let key = service.key()?;
        let forget = key.clone();
        // Forgotten now, so a re-created Service is new at its next event
        // (first seen and waiting afresh).
        self.push(QueueKey::Service(key), |state| {
            state.first_seen.remove(&forget);
            state.waiting.remove(&forget);
        });
        Ok(())
    }
}

/// Pools, Cilium pools (under a key of their own kind, docs/cilium.md §2)
/// and Namespaces: every event queues the object's name; the worker reads
/// the object (or its absence) from the store.
trait QueuedByName: Keyed + Send + Sync + 'static {
    fn queue_key(name: String) -> QueueKey;
}

impl QueuedByName for IPAddressPool {
    fn queue_key(name: String) -> QueueKey {
        QueueKey::Pool(name)
    }
}

impl QueuedByName for CiliumLoadBalancerIPPool {
    fn queue_key(name: String) -> QueueKey {
        QueueKey::CiliumPool(name)
    }
}

impl QueuedByName for Namespace {
    fn queue_key(name: String) -> QueueKey {
        QueueKey::Namespace(name)
    }
}

#[async_trait]
impl<C: Controller, K: QueuedByName> Handler<K> for Manager<C> {
    async fn on_add(&self, object: &K) -> Result<(), Error> {
        self.push(K::queue_key(object.key()?), |_| {});
        Ok(())
    }

    async fn on_update(&self, _old: &K, new: &K) -> Result<(), Error> {
        self.on_add(new).await
    }

    async fn on_delete(&self, object: &K) -> Result<(), Error> {
        self.on_add(object).await
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tokio::sync::Semaphore;
    use tokio::time::timeout;

    use super::*;
    use crate::controller::Shortcuts;
    use crate::DashMapStore;

    /// Records every call as a line (with the time it came) and answers with
    /// scripted outcomes (default: success, restore `Nothing`). The one
    /// `gate`d key blocks in `set_balancer` until a permit is added.
    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<(String, Instant)>>,
        outcomes: Mutex<HashMap<String, VecDeque<SyncOutcome>>>,
        restores: Mutex<HashMap<String, RestoreOutcome>>,
        /// Keys whose updates the fake calls settled.
        settled_updates: Mutex<HashSet<String>>,
        /// Keys the fake calls settled without a look after a change.
        touched: Mutex<Option<Touched>>,
        gate: Mutex<Option<(String, Arc<Semaphore>)>>,
        entered: Notify,
    }

    impl Fake {
        fn call(&self, call: String, key: &str) -> SyncOutcome {
            self.calls.lock().unwrap().push((call, Instant::now()));
            let mut outcomes = self.outcomes.lock().unwrap();
            outcomes
                .get_mut(key)
                .and_then(VecDeque::pop_front)
                .unwrap_or_else(SyncOutcome::success)
        }
    }

    fn deleted(present: bool) -> &'static str {
        if present {
            ""
        } else {
            "-"
        }
    }

    #[async_trait]
    impl Controller for Fake {
        async fn set_balancer(&self, key: &str, service: Option<&Service>) -> SyncOutcome {
            let outcome = self.call(format!("svc{} {key}", deleted(service.is_some())), key);
            let gate = self.gate.lock().unwrap().take_if(|(gated, _)| gated == key);
            if let Some((_, permits)) = gate {
                self.entered.notify_one();
                permits.acquire().await.unwrap().forget();
            }
            outcome
        }

        async fn set_pool(&self, name: &str, pool: Option<&IPAddressPool>) -> SyncOutcome {
            self.call(format!("pool{} {name}", deleted(pool.is_some())), name)
        }

        async fn set_cilium_pool(
            &self,
            name: &str,
            pool: Option<&CiliumLoadBalancerIPPool>,
        ) -> SyncOutcome {
            self.call(format!("cilium{} {name}", deleted(pool.is_some())), name)
        }

        async fn set_namespace(&self, name: &str, namespace: Option<&Namespace>) -> SyncOutcome {
            self.call(format!("ns{} {name}", deleted(namespace.is_some())), name)
        }

        async fn restore(&self, key: &str, _: &Service) -> RestoreOutcome {
            self.calls
                .lock()
                .unwrap()
                .push((format!("restore {key}"), Instant::now()));
            self.restores
                .lock()
                .unwrap()
                .get(key)
                .copied()
                .unwrap_or(RestoreOutcome::Nothing)
        }

        fn mark_synced(&self) {
            self.calls
                .lock()
                .unwrap()
                .push(("synced".to_owned(), Instant::now()));
        }
    }

    impl Shortcuts for Fake {
        fn is_settled_update(&self, key: &str, _: &Service, _: &Service) -> bool {
            self.settled_updates.lock().unwrap().contains(key)
        }

        fn touched_by_change(&self) -> Option<Touched> {
            self.touched.lock().unwrap().clone()
        }
    }

    struct Harness {
        store: Arc<DashMapStore>,
        fake: Arc<Fake>,
        manager: Manager<Fake>,
        cancel: CancellationToken,
    }

    fn harness(config: ManagerConfig) -> Harness {
        let store = Arc::new(DashMapStore::default());
        let fake = Arc::new(Fake::default());
        let manager = Manager::new(
            Arc::clone(&store) as Arc<dyn Store>,
            Arc::clone(&fake),
            config,
        );
        Harness {
            store,
            fake,
            manager,
            cancel: CancellationToken::new(),
        }
    }

    fn service(key: &str, with_address: bool) -> Service {
        let (namespace, name) = key.split_once('/').unwrap();
        let ingress = vec![LoadBalancerIngress {
            ip: Some("10.0.0.1".into()),
            ..Default::default()
        }];
        Service {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            status: with_address.then(|| ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(ingress),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn outcome(state: SyncState) -> SyncOutcome {
        SyncOutcome::new(state)
    }

    impl Harness {
        fn start(&self) -> JoinHandle<()> {
            self.manager.start(self.cancel.clone())
        }

        /// Starts the worker, syncs with an empty store and forgets the calls.
        async fn synced(&self) -> JoinHandle<()> {
            let worker = self.start();
            self.manager.mark_synced();
            self.manager.idle().await;
            self.take_calls();
            worker
        }

        /// Adds `keys`, each failing to get an address in one class (in
        /// that waiting order), and forgets the calls.
        async fn waiting_in_one_class(&self, keys: impl IntoIterator<Item = &str>) {
            for key in keys {
                let in_class = SyncOutcome {
                    waiting_class: Some(7),
                    ..outcome(SyncState::Waiting)
                };
                self.script(key, [in_class]);
                self.add(key, false).await;
            }
            self.manager.idle().await;
            self.take_calls();
        }

        async fn add(&self, key: &str, with_address: bool) {
            let service = service(key, with_address);
            self.store
                .services
                .insert(key.into(), Arc::new(service.clone()));
            self.manager.on_add(&service).await.unwrap();
        }

        async fn update(&self, key: &str) {
            let service = service(key, false);
            self.manager.on_update(&service, &service).await.unwrap();
        }

        async fn delete(&self, key: &str) {
            self.store.services.remove(key);
            self.manager.on_delete(&service(key, false)).await.unwrap();
        }

        async fn add_pool(&self, name: &str) {
            let pool = IPAddressPool {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            self.store.pools.insert(name.into(), Arc::new(pool.clone()));
            self.manager.on_add(&pool).await.unwrap();
        }

        /// Adds the `CiliumLoadBalancerIPPool` `name`, or updates it.
        async fn add_cilium_pool(&self, name: &str) {
            let pool = CiliumLoadBalancerIPPool {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let old = self
                .store
                .cilium_pools
                .insert(name.into(), Arc::new(pool.clone()));
            match old {
                Some(old) => self.manager.on_update(&*old, &pool).await.unwrap(),
                None => self.manager.on_add(&pool).await.unwrap(),
            }
        }

        async fn delete_cilium_pool(&self, name: &str) {
            let (_, old) = self.store.cilium_pools.remove(name).unwrap();
            self.manager.on_delete(&*old).await.unwrap();
        }

        async fn add_namespace(&self, name: &str) {
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            self.store
                .namespaces
                .insert(name.into(), Arc::new(namespace.clone()));
            self.manager.on_add(&namespace).await.unwrap();
        }

        fn script(&self, key: &str, outcomes: impl IntoIterator<Item = SyncOutcome>) {
            self.fake
                .outcomes
                .lock()
                .unwrap()
                .entry(key.into())
                .or_default()
                .extend(outcomes);
        }

        /// Once the gated reconciliation is in flight, an update of `key`;
        /// then lets it go (`permits`) and waits until idle.
        async fn update_while_in_flight(&self, key: &str, permits: &Semaphore) {
            self.fake.entered.notified().await;
            self.update(key).await;
            permits.add_permits(1);
            self.manager.idle().await;
        }

        /// Makes the next `set_balancer(key)` block until a permit is added.
        fn gate(&self, key: &str) -> Arc<Semaphore> {
            let permits = Arc::new(Semaphore::new(0));
            *self.fake.gate.lock().unwrap() = Some((key.into(), Arc::clone(&permits)));
            permits
        }

        fn take_calls(&self) -> Vec<String> {
            let calls = std::mem::take(&mut *self.fake.calls.lock().unwrap());
            calls.into_iter().map(|(call, _)| call).collect()
        }

        fn call_times(&self) -> Vec<Instant> {
            self.fake
                .calls
                .lock()
                .unwrap()
                .iter()
                .map(|(_, at)| *at)
                .collect()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_decided_before_sync_then_pools_restore_and_ordered_queue() {
        let h = harness(ManagerConfig::default());
        h.add("ns/s1", false).await;
        h.add_pool("p1").await;
        h.add("ns/s2", true).await;
        h.add_namespace("n1").await;
        h.add("ns/s3", true).await;
        h.add("ns/s4", true).await;
        h.add_pool("p2").await;
        h.add("ns/s1", false).await;
        h.store
            .services
            .insert("ns/unseen".into(), Arc::new(service("ns/unseen", true)));
        let restores = [
            ("ns/s2", RestoreOutcome::MustRelease),
            ("ns/s3", RestoreOutcome::Kept),
        ];
        h.fake
            .restores
            .lock()
            .unwrap()
            .extend(restores.map(|(k, r)| (k.to_owned(), r)));
        h.fake
            .restores
            .lock()
            .unwrap()
            .insert("ns/s4".into(), RestoreOutcome::Kept);
        // Ignored in the sync pass: everything is considered next anyway.
        h.script(
            "p1",
            [SyncOutcome {
                wake_waiting: true,
                ..outcome(SyncState::Success)
            }],
        );
        h.script(
            "n1",
            [SyncOutcome {
                reconsider: Reconsider::All,
                ..SyncOutcome::success()
            }],
        );

        let worker = h.start();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(h.take_calls().is_empty());
        assert!(!h.manager.is_synced());
        assert!(timeout(Duration::from_secs(1), h.manager.idle())
            .await
            .is_err());

        h.manager.mark_synced();
        assert!(h.manager.is_synced());
        h.manager.idle().await;
        assert_eq!(
            h.take_calls(),
            [
                "pool p1",
                "ns n1",
                "pool p2",
                "restore ns/s1",
                "restore ns/s2",
                "restore ns/s3",
                "restore ns/s4",
                "synced",
                "svc ns/s2",
                "svc ns/s1",
                "svc ns/s3",
                "svc ns/s4",
            ]
        );
        h.cancel.cancel();
        worker.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn mark_synced_before_start_and_deleted_then_recreated_is_new() {
        let h = harness(ManagerConfig::default());
        h.add("ns/a", true).await;
        h.add("ns/b", true).await;
        h.update("ns/a").await;
        h.delete("ns/a").await;
        h.add("ns/c", false).await;
        h.delete("ns/c").await;
        h.add("ns/a", true).await;
        h.manager.mark_synced();
        let _worker = h.start();
        h.manager.idle().await;
        // `c` is gone and unknown; its queued delete still reaches the controller.
        assert_eq!(
            h.take_calls(),
            [
                "restore ns/b",
                "restore ns/a",
                "synced",
                "svc ns/b",
                "svc ns/a",
                "svc- ns/c"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_queued_twice_runs_once_and_one_readded_in_flight_runs_again_after() {
        let h = harness(ManagerConfig::default());
        let _worker = h.synced().await;
        let permits = h.gate("ns/x");
        h.add("ns/x", false).await;
        h.fake.entered.notified().await;
        h.add("ns/b", false).await;
        h.update("ns/x").await;
        h.update("ns/b").await;
        h.add("ns/c", false).await;
        h.update("ns/x").await;
        h.update("ns/b").await;
        permits.add_permits(1);
        h.manager.idle().await;
        assert_eq!(
            h.take_calls(),
            ["svc ns/x", "svc ns/b", "svc ns/c", "svc ns/x"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retries_back_off_exponentially_up_to_the_cap_and_reset_after_success() {
        let config = ManagerConfig::default()
            .retry_base(Duration::from_millis(10))
            .retry_cap(Duration::from_millis(50));
        let h = harness(config);
        let _worker = h.synced().await;
        let retry = || outcome(SyncState::Retry("conflict".into()));
        h.script(
            "ns/a",
            [
                retry(),
                retry(),
                retry(),
                retry(),
                retry(),
                SyncOutcome::success(),
            ],
        );
        h.script("ns/a", [retry(), SyncOutcome::success()]);
        h.add("ns/a", false).await;
        h.manager.idle().await;
        h.update("ns/a").await;
        h.manager.idle().await;
        let times = h.call_times();
        let gaps: Vec<u128> = times
            .windows(2)
            .map(|pair| (pair[1] - pair[0]).as_millis())
            .collect();
        // 10, 20, 40, then capped at 50; the update comes at once; reset to 10.
        assert_eq!(gaps, [10, 20, 40, 50, 50, 0, 10]);
        assert_eq!(h.take_calls().len(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_before_a_retry_fires_replaces_the_retry() {
        let config = ManagerConfig::default().retry_base(Duration::from_millis(100));
        let h = harness(config);
        let _worker = h.synced().await;
        h.script("ns/a", [outcome(SyncState::Retry("conflict".into()))]);
        h.add("ns/a", false).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        h.update("ns/a").await;
        h.manager.idle().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(h.take_calls(), ["svc ns/a", "svc ns/a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_keys_wake_longest_waiting_first_and_keep_their_place() {
        let h = harness(ManagerConfig::default());
        let _worker = h.synced().await;
        let waiting = || outcome(SyncState::Waiting);
        h.add("ns/d", false).await;
        for key in ["ns/c", "ns/a", "ns/b"] {
            h.script(key, [waiting()]);
            h.add(key, false).await;
        }
        h.manager.idle().await;
        assert_eq!(h.manager.waiting_keys(), ["ns/c", "ns/a", "ns/b"]);
        // Failing again does not reset the wait.
        h.script("ns/a", [waiting()]);
        h.update("ns/a").await;
        h.manager.idle().await;
        assert_eq!(h.manager.waiting_keys(), ["ns/c", "ns/a", "ns/b"]);
        h.take_calls();

        // `d` goes and wakes them; `b`, queued meanwhile, keeps its place.
        h.script(
            "ns/d",
            [SyncOutcome {
                wake_waiting: true,
                ..SyncOutcome::success()
            }],
        );
        h.script("ns/a", [waiting()]);
        h.script("ns/b", [outcome(SyncState::Invalid)]);
        let permits = h.gate("ns/d");
        h.delete("ns/d").await;
        h.update_while_in_flight("ns/b", &permits).await;
        assert_eq!(
            h.take_calls(),
            ["svc- ns/d", "svc ns/b", "svc ns/c", "svc ns/a"]
        );
        // `c` got an address, `b` is invalid: neither waits; `a` still does.
        assert_eq!(h.manager.waiting_keys(), ["ns/a"]);

        // A deleted Service stops waiting, whatever the controller says.
        h.script("ns/b", [waiting()]);
        h.update("ns/b").await;
        h.manager.idle().await;
        assert_eq!(h.manager.waiting_keys(), ["ns/a", "ns/b"]);
        h.script("ns/a", [outcome(SyncState::Retry("conflict".into()))]);
        h.delete("ns/a").await;
        h.manager.idle().await;
        assert_eq!(h.manager.waiting_keys(), ["ns/b"]);
        h.script("ns/b", [waiting()]);
        h.delete("ns/b").await;
        h.manager.idle().await;
        assert!(h.manager.waiting_keys().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_runs_the_rest_of_a_class_only_while_its_first_gets_addresses() {
        let h = harness(ManagerConfig::default());
        let _worker = h.synced().await;
        let in_class = |class| SyncOutcome {
            waiting_class: Some(class),
            ..outcome(SyncState::Waiting)
        };
        let waker = || SyncOutcome {
            wake_waiting: true,
            ..SyncOutcome::success()
        };
        for key in ["ns/a", "ns/b", "ns/c"] {
            h.script(key, [in_class(7)]);
            h.add(key, false).await;
        }
        h.script("ns/u", [outcome(SyncState::Waiting)]);
        h.add("ns/u", false).await;
        h.script("ns/o", [in_class(9)]);
        h.add("ns/o", false).await;
        h.manager.idle().await;
        h.take_calls();

        // `a` fails again: `b` and `c` (its class) would too and are not
        // run; `u` (no class) and `o` (another class) are.
        for key in ["ns/a", "ns/u", "ns/o"] {
            let again = if key == "ns/u" {
                outcome(SyncState::Waiting)
            } else {
                in_class(if key == "ns/o" { 9 } else { 7 })
            };
            h.script(key, [again]);
        }
        h.script("ns/w1", [waker()]);
        h.add("ns/w1", false).await;
        h.manager.idle().await;
        assert_eq!(
            h.take_calls(),
            ["svc ns/w1", "svc ns/a", "svc ns/u", "svc ns/o"]
        );
        assert_eq!(
            h.manager.waiting_keys(),
            ["ns/a", "ns/b", "ns/c", "ns/u", "ns/o"]
        );

        // `a` gets an address: `b` is run next, in waiting order before `u`,
        // and fails: `c` is not run.
        h.script("ns/a", [SyncOutcome::success()]);
        h.script("ns/b", [in_class(7)]);
        h.script("ns/u", [outcome(SyncState::Waiting)]);
        h.script("ns/o", [in_class(9)]);
        h.script("ns/w2", [waker()]);
        h.add("ns/w2", false).await;
        h.manager.idle().await;
        assert_eq!(
            h.take_calls(),
            ["svc ns/w2", "svc ns/a", "svc ns/b", "svc ns/u", "svc ns/o"]
        );
        assert_eq!(h.manager.waiting_keys(), ["ns/b", "ns/c", "ns/u", "ns/o"]);
    }

    /// Found by `skipping_waiting_services_alike_changes_nothing`: a
    /// waiting Service that releases an address and stops waiting, but
    /// whose write fails, stays booked waiting until its retry; the wake it
    /// makes must not take it for its class, which then went unwoken.
    #[tokio::test(start_paused = true)]
    async fn a_waker_booked_waiting_only_for_its_retry_does_not_stand_for_its_class() {
        let h = harness(ManagerConfig::default());
        let _worker = h.synced().await;
        h.waiting_in_one_class(["ns/a", "ns/b"]).await;

        let released_but_unwritten = SyncOutcome {
            wake_waiting: true,
            ..outcome(SyncState::Retry("injected".to_owned()))
        };
        h.script("ns/a", [released_but_unwritten]);
        h.script("ns/b", [SyncOutcome::success()]);
        h.update("ns/a").await;
        h.manager.idle().await;
        let calls = h.take_calls();
        assert_eq!(calls.first().map(String::as_str), Some("svc ns/a"));
        assert_eq!(
            calls.get(1).map(String::as_str),
            Some("svc ns/b"),
            "{calls:?}"
        );
    }

    /// The first of a class is queued (its event not yet run) when a wake
    /// comes: it is run from the queue, and the rest of its class follows
    /// when it gets an address, as they would after a wake of it.
    #[tokio::test(start_paused = true)]
    async fn a_queued_first_of_a_class_continues_its_class() {
        let h = harness(ManagerConfig::default());
        let _worker = h.synced().await;
        h.waiting_in_one_class(["ns/a", "ns/b"]).await;

        let waker = SyncOutcome {
            wake_waiting: true,
            ..SyncOutcome::success()
        };
        h.script("ns/w", [waker]);
        h.script("ns/a", [SyncOutcome::success()]);
        h.script("ns/b", [SyncOutcome::success()]);
        // Both events queued before the worker runs: `w` wakes while `a`
        // waits in the queue.
        h.add("ns/w", false).await;
        h.update("ns/a").await;
        h.manager.idle().await;
        assert_eq!(h.take_calls(), ["svc ns/w", "svc ns/a", "svc ns/b"]);
        assert!(h.manager.waiting_keys().is_empty());
    }

    /// A woken Service that takes an address wakes those refused it that
    /// the wake has yet to reach (`c`, waiting after it, and the rest of
    /// its class while they get addresses), not those it has passed (`a`);
    /// once the wake is through, a take wakes no one.
    #[tokio::test(start_paused = true)]
    async fn a_take_during_a_wake_wakes_those_refused_it_after_the_taker() {
        let h = harness(ManagerConfig::default());
        let _worker = h.synced().await;
        let taken = WakeOn::Holders("10.0.0.1".parse().unwrap());
        let pool = WakeOn::UnpinnedPool(allocator::Family::V4);
        let waits_on = |class, key: &WakeOn| SyncOutcome {
            waiting_class: Some(class),
            wake_on: Some(vec![key.clone()]),
            ..outcome(SyncState::Waiting)
        };
        let takes = || SyncOutcome {
            joined: vec![taken.clone()],
            ..SyncOutcome::success()
        };
        for (key, waits) in [
            ("ns/a", waits_on(7, &taken)),
            ("ns/w", waits_on(8, &pool)),
            ("ns/c", waits_on(7, &taken)),
            ("ns/f", waits_on(7, &taken)),
        ] {
            h.script(key, [waits]);
            h.add(key, false).await;
        }
        h.manager.idle().await;
        h.take_calls();

        let frees_pool = SyncOutcome {
            wake_waiting: true,
            freed: vec![pool.clone()],
            ..SyncOutcome::success()
        };
        h.script("ns/d", [frees_pool]);
        h.script("ns/w", [takes()]);
        h.script("ns/c", [waits_on(7, &taken)]);
        h.add("ns/d", false).await;
        h.manager.idle().await;
        assert_eq!(h.take_calls(), ["svc ns/d", "svc ns/w", "svc ns/c"]);
        assert_eq!(h.manager.waiting_keys(), ["ns/a", "ns/c", "ns/f"]);

        h.script("ns/e", [takes()]);
        h.add("ns/e", false).await;
        h.manager.idle().await;
        assert_eq!(h.take_calls(), ["svc ns/e"]);
    }

    /// The same for the next of a class: queued (its event came while the
    /// woken one before it ran) when that one gets an address, it is run
    /// from the queue and the rest of its class follows.
    #[tokio::test(start_paused = true)]
    async fn a_queued_next_of_a_class_continues_its_class() {
        let h = harness(ManagerConfig::default());
        let _worker = h.synced().await;
        h.waiting_in_one_class(["ns/a", "ns/b", "ns/c"]).await;

        let waker = SyncOutcome {
            wake_waiting: true,
            ..SyncOutcome::success()
        };
        h.script("ns/w", [waker]);
        for key in ["ns/a", "ns/b", "ns/c"] {
            h.script(key, [SyncOutcome::success()]);
        }
        let permits = h.gate("ns/a");
        h.add("ns/w", false).await;
        // `a`, woken, is in flight: `b`'s event queues it.
        h.update_while_in_flight("ns/b", &permits).await;
        assert_eq!(
            h.take_calls(),
            ["svc ns/w", "svc ns/a", "svc ns/b", "svc ns/c"]
        );
        assert!(h.manager.waiting_keys().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn cilium_pools_are_applied_with_the_other_pools_before_services_at_sync() {
        let h = harness(ManagerConfig::default());
        h.add("ns/s1", true).await;
        h.add_cilium_pool("blue").await;
        h.add_pool("p1").await;
        h.add("ns/s2", true).await;
        // Same name, other kind: another object, so another key (the
        // allocator rejects the newer of the two, docs/cilium.md §2.6).
        h.add_pool("blue").await;
        h.add_cilium_pool("green").await;
        let worker = h.start();
        h.manager.mark_synced();
        h.manager.idle().await;
        assert_eq!(
            h.take_calls(),
            [
                "cilium blue",
                "pool p1",
                "pool blue",
                "cilium green",
                "restore ns/s1",
                "restore ns/s2",
                "synced",
                "svc ns/s1",
                "svc ns/s2",
            ]
        );
        h.cancel.cancel();
        worker.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_cilium_pool_event_reads_the_store_and_may_reconsider_every_service() {
        let h = harness(ManagerConfig::default());
        h.add("ns/s1", true).await;
        let worker = h.synced().await;

        // An update, twice before the worker runs: one key, processed once.
        h.add_cilium_pool("blue").await;
        h.add_cilium_pool("blue").await;
        h.manager.idle().await;
        assert_eq!(h.take_calls(), ["cilium blue"]);

        // A change the controller says may move addresses: both passes.
        h.script(
            "blue",
            [SyncOutcome {
                reconsider: Reconsider::All,
                ..SyncOutcome::success()
            }],
        );
        h.delete_cilium_pool("blue").await;
        h.manager.idle().await;
        assert_eq!(
            h.take_calls(),
            ["cilium- blue", "restore ns/s1", "svc ns/s1"]
        );

        // Without a name: an error, never a panic.
        let error = h
            .manager
            .on_add(&CiliumLoadBalancerIPPool::default())
            .await
            .unwrap_err();
        assert!(matches!(
            error,
            Error::MissingName {
                kind: "CiliumLoadBalancerIPPool"
            }
        ));
        h.cancel.cancel();
        worker.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_change_only_quiet_services_are_settled_without_a_look() {
        let h = harness(ManagerConfig::default());
        for key in ["ns/s1", "ns/s2", "ns/s3"] {
            h.add(key, true).await;
        }
        // The change touches none of them.
        *h.fake.touched.lock().unwrap() = Some(Touched::default());
        // Not at sync: every Service is restored.
        let worker = h.start();
        h.manager.mark_synced();
        h.manager.idle().await;
        let calls = h.take_calls();
        assert_eq!(
            &calls[..3],
            ["restore ns/s1", "restore ns/s2", "restore ns/s3"]
        );

        // After a pool change: s2, with an event queued behind the pool's,
        // is restored (its object may have changed); the others are not
        // looked at, and the second pass leaves them out.
        h.script(
            "p",
            [SyncOutcome {
                reconsider: Reconsider::All,
                ..SyncOutcome::success()
            }],
        );
        h.add_pool("p").await;
        h.update("ns/s2").await;
        h.manager.idle().await;
        assert_eq!(h.take_calls(), ["pool p", "restore ns/s2", "svc ns/s2"]);
        h.cancel.cancel();
        worker.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn settled_services_are_left_out_of_the_second_pass_unless_busy() {
        let hour = Duration::from_secs(3600);
        let h = harness(ManagerConfig::default().retry_base(hour).retry_cap(hour));
        for key in ["ns/s1", "ns/s2", "ns/s3", "ns/s4"] {
            h.add(key, true).await;
        }
        // At sync, even though their events queued them.
        h.fake.restores.lock().unwrap().extend([
            ("ns/s1".to_owned(), RestoreOutcome::Settled),
            ("ns/s2".to_owned(), RestoreOutcome::Settled),
            ("ns/s3".to_owned(), RestoreOutcome::Kept),
            ("ns/s4".to_owned(), RestoreOutcome::Settled),
        ]);
        let worker = h.start();
        h.manager.mark_synced();
        h.manager.idle().await;
        assert_eq!(
            h.take_calls(),
            [
                "restore ns/s1",
                "restore ns/s2",
                "restore ns/s3",
                "restore ns/s4",
                "synced",
                "svc ns/s3"
            ]
        );

        // After a pool change: a waiting one and one due for a retry are
        // reconciled all the same, in their places.
        h.script("ns/s2", [outcome(SyncState::Waiting)]);
        h.update("ns/s2").await;
        h.manager.idle().await;
        h.script("ns/s4", [outcome(SyncState::Retry("conflict".into()))]);
        h.update("ns/s4").await;
        // Not idle while the retry waits (an hour): the pool comes first.
        while h.fake.calls.lock().unwrap().len() < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(h.take_calls(), ["svc ns/s2", "svc ns/s4"]);
        h.script(
            "p",
            [SyncOutcome {
                reconsider: Reconsider::All,
                ..SyncOutcome::success()
            }],
        );
        h.add_pool("p").await;
        h.manager.idle().await;
        assert_eq!(
            h.take_calls(),
            [
                "pool p",
                "restore ns/s1",
                "restore ns/s2",
                "restore ns/s3",
                "restore ns/s4",
                "svc ns/s2",
                "svc ns/s3",
                "svc ns/s4"
            ]
        );
        assert_eq!(h.manager.waiting_keys(), Vec::<String>::new());
        h.cancel.cancel();
        worker.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_settled_update_is_not_queued_once_synced() {
        let h = harness(ManagerConfig::default());
        h.add("ns/s1", true).await;
        h.fake
            .settled_updates
            .lock()
            .unwrap()
            .insert("ns/s1".to_owned());
        // Before sync every event counts: it is what the sync passes see.
        h.update("ns/s1").await;
        let worker = h.start();
        h.manager.mark_synced();
        h.manager.idle().await;
        assert_eq!(h.take_calls(), ["restore ns/s1", "synced", "svc ns/s1"]);
        h.update("ns/s1").await;
        h.manager.idle().await;
        assert!(h.take_calls().is_empty());
        // Another key's update is queued as ever.
        h.add("ns/s2", false).await;
        h.update("ns/s2").await;
        h.manager.idle().await;
        assert_eq!(h.take_calls(), ["svc ns/s2"]);
        h.cancel.cancel();
        worker.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn reconsider_queues_the_keys_or_every_service_in_two_passes() {
        let h = harness(ManagerConfig::default());
        h.add("ns/s1", false).await;
        h.add("ns/s2", true).await;
        h.add("ns/s3", false).await;
        h.add("ns/s4", true).await;
        let _worker = h.synced().await;

        let all = || SyncOutcome {
            reconsider: Reconsider::All,
            ..SyncOutcome::success()
        };
        // Two passes, as at sync: restore everything in first-seen order,
        // then those that released, those without addresses, those kept.
        h.fake.restores.lock().unwrap().extend([
            ("ns/s2".to_owned(), RestoreOutcome::Kept),
            ("ns/s4".to_owned(), RestoreOutcome::MustRelease),
        ]);
        h.script("p", [all()]);
        h.add_pool("p").await;
        h.manager.idle().await;
        assert_eq!(
            h.take_calls(),
            [
                "pool p",
                "restore ns/s1",
                "restore ns/s2",
                "restore ns/s3",
                "restore ns/s4",
                "svc ns/s4",
                "svc ns/s1",
                "svc ns/s3",
                "svc ns/s2"
            ]
        );

        // Deleted and re-created: last in its group.
        h.delete("ns/s2").await;
        h.add("ns/s2", true).await;
        h.manager.idle().await;
        h.take_calls();
        h.script("n", [all()]);
        h.add_namespace("n").await;
        h.manager.idle().await;
        assert_eq!(
            h.take_calls(),
            [
                "ns n",
                "restore ns/s1",
                "restore ns/s3",
                "restore ns/s4",
                "restore ns/s2",
                "svc ns/s4",
                "svc ns/s1",
                "svc ns/s3",
                "svc ns/s2"
            ]
        );

        // Explicit keys, never the reconciled key itself.
        let keys = Reconsider::Keys(vec!["ns/s3".into(), "ns/s1".into(), "ns/s4".into()]);
        h.script(
            "ns/s1",
            [SyncOutcome {
                reconsider: keys,
                ..SyncOutcome::success()
            }],
        );
        h.update("ns/s1").await;
        h.manager.idle().await;
        assert_eq!(h.take_calls(), ["svc ns/s1", "svc ns/s3", "svc ns/s4"]);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_finishes_the_key_in_flight_and_starts_nothing_else() {
        let h = harness(ManagerConfig::default());
        let worker = h.synced().await;
        let permits = h.gate("ns/a");
        h.add("ns/a", false).await;
        h.fake.entered.notified().await;
        h.add("ns/b", false).await;
        h.cancel.cancel();
        assert!(!worker.is_finished());
        permits.add_permits(1);
        timeout(Duration::from_secs(1), worker)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(h.take_calls(), ["svc ns/a"]);

        // Before sync, too, the worker just stops.
        let h = harness(ManagerConfig::default());
        h.add("ns/a", false).await;
        let worker = h.start();
        h.cancel.cancel();
        timeout(Duration::from_secs(1), worker)
            .await
            .unwrap()
            .unwrap();
        assert!(h.take_calls().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_waits_for_sync_queue_in_flight_and_retries() {
        let config = ManagerConfig::default().retry_base(Duration::from_millis(100));
        let h = harness(config);
        h.add("ns/a", false).await;
        let _worker = h.start();
        assert!(timeout(Duration::from_secs(1), h.manager.idle())
            .await
            .is_err());

        h.script("ns/a", [outcome(SyncState::Retry("conflict".into()))]);
        let start = Instant::now();
        h.manager.mark_synced();
        assert!(timeout(Duration::from_millis(50), h.manager.idle())
            .await
            .is_err());
        h.manager.idle().await;
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        assert_eq!(
            h.take_calls(),
            ["restore ns/a", "synced", "svc ns/a", "svc ns/a"]
        );

        // In flight is not idle.
        let permits = h.gate("ns/a");
        h.update("ns/a").await;
        h.fake.entered.notified().await;
        assert!(timeout(Duration::from_secs(1), h.manager.idle())
            .await
            .is_err());
        permits.add_permits(1);
        h.manager.idle().await;
    }

    #[tokio::test(start_paused = true)]
    async fn bad_metadata_is_an_error_and_queues_nothing() {
        let h = harness(ManagerConfig::default());
        let _worker = h.synced().await;
        let nameless = Service::default();
        let error = h.manager.on_add(&nameless).await.unwrap_err();
        assert!(matches!(error, Error::MissingName { kind: "Service" }));
        let mut no_namespace = service("ns/a", false);
        no_namespace.metadata.namespace = None;
        let error = h.manager.on_delete(&no_namespace).await.unwrap_err();
        assert!(matches!(error, Error::MissingNamespace { .. }));
        assert!(h.manager.on_add(&IPAddressPool::default()).await.is_err());
        assert!(h
            .manager
            .on_update(&Namespace::default(), &Namespace::default())
            .await
            .is_err());
        h.manager.idle().await;
        assert!(h.take_calls().is_empty());
    }

    #[test]
    fn a_change_looks_at_the_waiting_parked_on_it_and_every_other_waiting() {
        let mut waiting = Waiting::default();
        let pool = |name: &str| WakeOn::PoolChanged(name.to_owned());
        let namespace = WakeOn::NamespaceChanged("ns".to_owned());
        waiting.insert(
            "ns/a1",
            1,
            Some(7),
            Some(vec![pool("a"), namespace.clone()]),
        );
        waiting.insert(
            "ns/a2",
            2,
            Some(7),
            Some(vec![pool("a"), namespace.clone()]),
        );
        waiting.insert("ns/b", 3, None, Some(vec![pool("b"), namespace.clone()]));
        waiting.insert(
            "ns/full",
            4,
            None,
            Some(vec![WakeOn::UnpinnedPool(allocator::Family::V4)]),
        );
        waiting.insert("ns/any", 5, None, None);
        waiting.insert("ns/config", 6, None, Some(Vec::new()));
        let served = |waiting: &Waiting, changes: Option<&[WakeOn]>| {
            let mut keys = waiting.served_by_change(changes);
            keys.sort();
            keys
        };
        let others = ["ns/any", "ns/config", "ns/full"];
        assert_eq!(served(&waiting, Some(&[])), others);
        assert_eq!(
            served(&waiting, Some(&[pool("a")])),
            ["ns/a1", "ns/a2", "ns/any", "ns/config", "ns/full"]
        );
        assert_eq!(served(&waiting, Some(&[namespace])).len(), 6);
        assert_eq!(served(&waiting, None).len(), 6);
        // Leaving, the last of a class takes its keys along.
        waiting.remove("ns/a1");
        waiting.remove("ns/a2");
        assert_eq!(served(&waiting, Some(&[pool("a")])), others);
        assert!(!waiting.on_key.contains_key(&pool("a")));
        waiting.remove("ns/any");
        assert!(waiting.unparked.len() == 2 && waiting.on_any.is_empty());
    }

    #[test]
    fn backoff_doubles_and_saturates_at_the_cap() {
        let config = ManagerConfig::default();
        let delays: Vec<u128> = [0, 1, 2, 9, 31, 32, 1000]
            .map(|a| config.backoff(a).as_millis())
            .into();
        assert_eq!(delays, [10, 20, 40, 5000, 5000, 5000, 5000]);
    }
}
