//! The allocator: accepted pools, who holds which address, and the rules of
//! docs/allocation.md §4.4 for choosing and keeping addresses, at the costs
//! of §4.9: every question asked per Service event is answered from an
//! index (free entries, pools with room, a group's addresses by port,
//! holders by port), never by a walk over pools, entries or holders.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use pool_types::cilium::CiliumLoadBalancerIPPoolSpec;

use crate::addr::{from_int, to_int, Family};
use crate::auto::{AutoKey, AutoSet};
use crate::count::{AddressCount, WideCount};
use crate::error::{AllocError, PinnedTried, ShareConflict, Tried, UnpinnedTried};
use crate::group::{GroupIndex, Rank};
use crate::holders::{tenancies_agree, Holders, Tenancy};
use crate::label_keys::LabelKeys;
use crate::label_readers::LabelReaders;
use crate::pinned::Fact;
use crate::pool::{AddrRange, Conflict, Pool, PoolError, PoolKind, Rules};
use crate::rejected_ranges::RejectedRanges;
use crate::request::{FamilyPolicy, Port, Request, SharingNamespaces, SharingRule};
use crate::spec::IPAddressPoolSpec;
use crate::used::UsedSet;

/// The hasher of the maps every allocation touches: SipHash's DoS resistance
/// buys nothing for keys the cluster's own objects make, and costs a tenth
/// of an allocation.
type FastHash = foldhash::fast::RandomState;

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

// A child module, to read the private state it explains.
#[path = "explain.rs"]
mod explain;
pub use explain::{Explanation, PoolVerdict, Step, Verdict};

/// Addresses and pool of one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    /// The pool of its first address (the IPv4 one, if any).
    pub pool: String,
    /// IPv4 first.
    pub ips: Vec<IpAddr>,
    /// The pool of its IPv6 address when that is not `pool`: only when
    /// both lie in `CiliumLoadBalancerIPPool`s, which Cilium fills per
    /// family (docs/cilium.md §3.5, §4.3 item 4).
    pub other_pool: Option<String>,
}

impl Holding {
    /// The pool that `ip` (one of its addresses) lies in.
    pub fn pool_of(&self, ip: IpAddr) -> &str {
        match &self.other_pool {
            Some(other) if ip.is_ipv6() => other,
            _ => &self.pool,
        }
    }
}

/// The pools of a holding: that of its first address (IPv4 first), and
/// that of its IPv6 address when it differs (both Cilium pools).
type Pools = (Arc<str>, Option<Arc<str>>);

/// What a keep keeps: the pools, the addresses, and the address let go
/// with its reason (a pair held per address).
type Kept = (Pools, Vec<IpAddr>, Option<(IpAddr, AllocError)>);

/// Usable and assigned addresses of one family in one pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FamilyStats {
    /// Addresses (after avoidBuggyIPs, reserved ends included), up to 2^128.
    pub total: AddressCount,
    /// Addresses in use; a shared address counts once.
    pub assigned: u128,
    /// Reserved ends (Cilium `allowFirstLastIPs: No`): never handed out.
    pub reserved: u128,
}

/// Counters of one accepted pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolStats {
    pub name: String,
    pub kind: PoolKind,
    pub ipv4: FamilyStats,
    pub ipv6: FamilyStats,
}

/// Cilium's counts of one pool, both families summed, exact at any size
/// (docs/cilium.md §2.8): the messages of its `cilium.io/IPsTotal`,
/// `IPsUsed` and `IPsAvailable` conditions, written with `to_string()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CiliumCounts {
    /// Every address of every block, reserved ends included.
    pub total: WideCount,
    /// Distinct held addresses plus reserved ends.
    pub used: WideCount,
    /// `total - used`.
    pub available: WideCount,
}

impl PoolStats {
    /// Cilium's counts of the pool (meaningful for either kind).
    pub fn cilium_counts(&self) -> CiliumCounts {
        let total = WideCount::sum(self.ipv4.total, self.ipv6.total);
        let used = WideCount::from(self.ipv4.assigned + self.ipv4.reserved)
            .plus(WideCount::from(self.ipv6.assigned + self.ipv6.reserved));
        CiliumCounts {
            total,
            used,
            available: total.minus(used),
        }
    }
}

/// A pool object that is not accepted, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedPool {
    pub name: String,
    pub kind: PoolKind,
    pub reason: String,
    /// For a pool rejected for an overlap (with an older pool, or within
    /// itself): the two ranges and the other pool, for Cilium's
    /// `cilium.io/PoolConflict` message ([`Conflict::cilium_message`]).
    pub conflict: Option<Conflict>,
}

/// A Service whose addresses a pool change released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    pub key: String,
    pub ips: Vec<IpAddr>,
    pub reason: String,
}

/// What a pool change did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolChange {
    /// Services released because their addresses left every pool, sorted by key.
    pub released: Vec<Released>,
    /// The pools whose definition or acceptance the change changed, sorted:
    /// an accepted pool not listed kept its definition and its holdings.
    pub changed: Vec<String>,
    /// The pools the change left rejected anew or for another reason, the
    /// changed pool whenever it is rejected, sorted by name.
    pub rejected: Vec<RejectedPool>,
}

/// A pool object as given.
#[derive(Debug)]
struct PoolObject {
    /// Shared with the pool's state while it is accepted.
    parsed: Result<Arc<Pool>, PoolError>,
    order: OrderKey,
}

/// Names of pool objects, per kind (indexed by [`PoolKind::index`]).
type Objects = [HashMap<String, PoolObject, FastHash>; 2];

/// Creation order: by `metadata.creationTimestamp` (nanoseconds since the
/// epoch) where known, pools without one after those with one, arrival
/// order breaking ties.
type OrderKey = (bool, Option<i128>, u64);

/// Why a pool object is rejected, and the pool name that blocks it (an
/// overlap, or an older pool of the other kind with the same name):
/// removing or changing a pool of that name may bring it in.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rejection {
    reason: String,
    blocker: Option<Arc<str>>,
    /// Boxed: rare, and large.
    conflict: Option<Box<Conflict>>,
}

impl Rejection {
    /// The rejection as reported, of the pool `name` of `kind`.
    fn report(&self, name: &str, kind: PoolKind) -> RejectedPool {
        RejectedPool {
            name: name.to_owned(),
            kind,
            reason: self.reason.clone(),
            conflict: self.conflict.as_deref().cloned(),
        }
    }

    /// A rejection for `error`, of a pool named `name` of kind `kind`.
    fn of(error: &PoolError, name: &str, kind: PoolKind) -> Self {
        let conflict = match error {
            PoolError::BlockOverlap { ranges, .. } => Some(Box::new(Conflict {
                range: ranges.0,
                other_range: ranges.1,
                other_pool: name.to_owned(),
                other_kind: kind,
            })),
            _ => None,
        };
        Rejection {
            reason: error.to_string(),
            blocker: None,
            conflict,
        }
    }
}

/// The sharing key and backend key of a Service that has a sharing key, in
/// one unambiguous string: the Services one address may stack.
type Group = Arc<str>;

/// The group of a Service with sharing key `sharing` (empty: none) under
/// `rule`: the rule's tag, the key's length, the key, the backend key.
fn group_of(rule: SharingRule, sharing: &str, backend: &str) -> Option<String> {
    (!sharing.is_empty()).then(|| format!("{}{}:{sharing}{backend}", rule.tag(), sharing.len()))
}

/// The group of `request`.
fn group_of_request(request: &Request<'_>) -> Option<String> {
    group_of(
        request.sharing_rule,
        request.sharing_key,
        request.backend_key,
    )
}

/// The namespace part of a Service key `namespace/name` (the whole key
/// when it has no `/`).
fn namespace_of_key(key: &str) -> &str {
    key.split_once('/').map_or(key, |(namespace, _)| namespace)
}

/// The rule tag and sharing key part of a group.
fn sharing_part(group: &str) -> &str {
    group
        .split_once(':')
        .and_then(|(len, rest)| rest.get(..len.get(1..)?.parse::<usize>().ok()?))
        .unwrap_or_default()
}

/// Whether two groups' rules are the same (their first character).
fn same_rule(a: &str, b: &str) -> bool {
    a.chars().next() == b.chars().next()
}

/// One family of an accepted pool: what is used, which entries have room,
/// and where each sharing group may stack.
#[derive(Debug)]
struct FamilyState {
    /// Held addresses and reserved ends.
    used: UsedSet,
    total: AddressCount,
    /// How many of `used` are reserved ends.
    reserved: u128,
    /// The pool's entries of this family as (first, last, index in
    /// `spec.addresses`), sorted by first address, to find an address's
    /// entry. A sorted slice, not a map: it never changes, and a map node
    /// per pool (~0.5 KB for one entry) was most of a small pool's memory.
    entries: Box<[(u128, u128, u32)]>,
    /// Indexes of the entries with a free usable address: the first is
    /// where the lowest free address in search order lies.
    open: BTreeSet<u32>,
    groups: HashMap<Group, GroupIndex, FastHash>,
}

impl FamilyState {
    fn new(pool: &Pool, family: Family) -> Self {
        let mut used = UsedSet::new(pool.usable(family));
        // Reserved ends are in use by nobody, as Cilium allocates them with
        // no owner: never free, never held. O(1) per range.
        for range in pool
            .ranges
            .iter()
            .filter(|r| r.family == family && r.reserve_ends)
        {
            used.insert(range.first);
            used.insert(range.last);
        }
        let mut entries = Vec::new();
        let mut open = BTreeSet::new();
        for (index, range) in pool.ranges.iter().enumerate() {
            let Ok(index) = u32::try_from(index) else {
                break;
            };
            if range.family != family {
                continue;
            }
            entries.push((range.first, range.last, index));
            if used.lowest_free(range.first, range.last).is_some() {
                open.insert(index);
            }
        }
        // Distinct first addresses: the entries of a parsed pool never
        // overlap (`Pool::parse` and `Pool::parse_cilium` reject that).
        entries.sort_unstable_by_key(|&(first, _, _)| first);
        Self {
            used,
            total: pool.total(family),
            reserved: pool.reserved(family),
            entries: entries.into_boxed_slice(),
            open,
            groups: HashMap::default(),
        }
    }

    /// The search-order rank of `value`, if it lies in an entry.
    fn rank(&self, value: u128) -> Option<Rank> {
        let after = self
            .entries
            .partition_point(|&(first, _, _)| first <= value);
        let &(_, last, index) = self.entries.get(after.checked_sub(1)?)?;
        (last >= value).then_some((index, value))
    }

    /// Whether `value` is a reserved end of its entry. O(log entries).
    fn is_reserved(&self, pool: &Pool, value: u128) -> bool {
        self.rank(value)
            .and_then(|(index, _)| self.entry(pool, index))
            .is_some_and(|range| range.reserves(value))
    }

    /// Addresses held by Services (reserved ends aside).
    fn held(&self) -> u128 {
        self.used.len().saturating_sub(self.reserved)
    }

    /// The entry `index`'s bounds.
    fn entry(&self, pool: &Pool, index: u32) -> Option<AddrRange> {
        pool.ranges.get(usize::try_from(index).ok()?).copied()
    }

    /// Marks `value` used and books its entry full if it is now. Returns
    /// whether the family just ran out of room.
    fn take(&mut self, pool: &Pool, value: u128) -> bool {
        if !self.used.insert(value) {
            return false;
        }
        if let Some((index, _)) = self.rank(value) {
            let full = self
                .entry(pool, index)
                .is_none_or(|r| self.used.lowest_free(r.first, r.last).is_none());
            if full {
                self.open.remove(&index);
                return self.open.is_empty();
            }
        }
        false
    }

    /// Marks `value` free: its entry has room. Returns whether the family
    /// had none before.
    fn free(&mut self, value: u128) -> bool {
        if self.used.remove(value) {
            if let Some((index, _)) = self.rank(value) {
                let had_none = self.open.is_empty();
                self.open.insert(index);
                return had_none;
            }
        }
        false
    }

    /// The lowest free address in search order, with its rank.
    fn lowest_free(&self, pool: &Pool) -> Option<Rank> {
        let index = *self.open.first()?;
        let range = self.entry(pool, index)?;
        let value = self.used.lowest_free(range.first, range.last)?;
        Some((index, value))
    }
}

/// An accepted pool and the addresses in use in it.
#[derive(Debug)]
struct PoolState {
    pool: Arc<Pool>,
    name: Arc<str>,
    families: [FamilyState; 2],
    /// Its place in the automatic order, if it has autoAssign.
    auto: Option<AutoKey>,
    /// What it requires of a Service, if pinned and the rules tell
    /// (see [`Pool::guard`]).
    /// Sorted, each fact once: a slice, as most guards hold one fact.
    guard: Option<Box<[Fact]>>,
    /// Its rules, if it is pinned.
    rules: Option<Arc<Rules>>,
}

impl PoolState {
    fn new(pool: Arc<Pool>) -> Self {
        let families = [
            FamilyState::new(&pool, Family::V4),
            FamilyState::new(&pool, Family::V6),
        ];
        let name: Arc<str> = Arc::from(pool.name.as_str());
        // A disabled pool is never a candidate (docs/cilium.md §2.5).
        let auto = (pool.auto_assign && !pool.disabled)
            .then(|| (!pool.is_pinned(), pool.priority_rank(), Arc::clone(&name)));
        let guard = pool.guard().map(|facts| facts.into_iter().collect());
        let rules = pool.rules().map(Arc::new);
        Self {
            pool,
            name,
            families,
            auto,
            guard,
            rules,
        }
    }

    fn family(&self, family: Family) -> &FamilyState {
        match family {
            Family::V4 => &self.families[0],
            Family::V6 => &self.families[1],
        }
    }

    fn family_mut(&mut self, family: Family) -> &mut FamilyState {
        match family {
            Family::V4 => &mut self.families[0],
            Family::V6 => &mut self.families[1],
        }
    }

    fn has_family(&self, family: Family) -> bool {
        !self.family(family).entries.is_empty()
    }

    fn is_open(&self, family: Family) -> bool {
        !self.family(family).open.is_empty()
    }

    /// Every address in use, as (family, value).
    fn used_values(&self) -> impl Iterator<Item = (Family, u128)> + '_ {
        FAMILIES
            .into_iter()
            .flat_map(move |family| self.family(family).used.values().map(move |v| (family, v)))
    }
}

/// What one Service holds. Kept small: this and its entry in
/// `Allocator::addresses` are the allocator's memory per address.
#[derive(Debug)]
struct Held {
    pool: Arc<str>,
    /// The IPv6 address's pool when it is not `pool` (two Cilium pools).
    pool6: Option<Arc<str>>,
    /// IPv4 first.
    ips: Box<[IpAddr]>,
    /// `None` without a sharing key (ports matter only to Services that
    /// may stack on one address).
    sharing: Option<Box<Sharing>>,
}

/// How a Service with a sharing key holds its addresses.
#[derive(Debug, PartialEq, Eq)]
struct Sharing {
    group: Group,
    ports: Box<[Port]>,
    /// Its namespace and the other namespaces it admits.
    tenancy: Tenancy,
}

/// A request's namespaces as a holder keeps them: `None` for any, else
/// sorted and without repeats (so equal lists are one tenancy).
fn admits_of(namespaces: SharingNamespaces<'_>) -> Option<Arc<[Box<str>]>> {
    match namespaces {
        SharingNamespaces::Any => None,
        SharingNamespaces::Listed(list) if list.iter().any(|n| n == "*") => None,
        SharingNamespaces::Listed(list) => {
            let set: BTreeSet<&str> = list.iter().map(String::as_str).collect();
            Some(set.into_iter().map(Box::from).collect())
        }
    }
}

impl Held {
    /// The pool that `ip` (one of its addresses) lies in.
    fn pool_of(&self, ip: IpAddr) -> &Arc<str> {
        match &self.pool6 {
            Some(other) if ip.is_ipv6() => other,
            _ => &self.pool,
        }
    }

    fn holding(&self) -> Holding {
        Holding {
            pool: self.pool.to_string(),
            ips: self.ips.to_vec(),
            other_pool: self.pool6.as_deref().map(str::to_owned),
        }
    }

    fn group(&self) -> Option<&str> {
        self.sharing.as_deref().map(|s| &*s.group)
    }

    fn ports(&self) -> &[Port] {
        self.sharing.as_deref().map_or(&[], |s| &s.ports)
    }

    fn tenancy(&self) -> Option<&Tenancy> {
        self.sharing.as_deref().map(|s| &s.tenancy)
    }
}

/// Whether a Service of `request` (admitting `admits`) and a holder may
/// share across their namespaces: one namespace, or each admits the
/// other's (docs/cilium.md §3.4, rule 2).
fn namespaces_agree(request: &Request<'_>, admits: Option<&[Box<str>]>, holder: &Sharing) -> bool {
    let (namespace, theirs) = &holder.tenancy;
    tenancies_agree(
        request.subject.namespace,
        admits,
        namespace,
        theirs.as_deref(),
    )
}

/// The automatic pools with room, per question asked: a free address of
/// one family, of both, or an address where a group holds addresses.
#[derive(Debug, Default)]
struct AutoIndex {
    /// Every pool with autoAssign.
    all: AutoSet,
    /// Those with a free address of IPv4, of IPv6.
    open: [AutoSet; 2],
    /// Those with a free address of both families.
    open_both: AutoSet,
    /// Per family and group: those where the group holds addresses.
    groups: [HashMap<Group, BTreeSet<AutoKey>, FastHash>; 2],
    /// Cilium pools with addresses of IPv4, of IPv6: where a half-served
    /// Service may get its other family ([`Allocator::cilium_groups`]),
    /// found without a walk over the pools of the other kind or family.
    cilium: [AutoSet; 2],
}

/// What kind of automatic pool a pool is, for the waiting Services that
/// tried a kind as a whole ([`Tried`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AutoGroup {
    /// Without serviceAllocation or serviceSelector: it serves every
    /// Service.
    Unpinned,
    /// Pinned, with the rules of this fingerprint ([`PinnedTried::rules`]).
    Pinned(u64),
}

/// The addresses whose holders changed (see [`Allocator::take_regrouped`]).
#[derive(Debug, Default)]
pub struct Regrouped {
    /// Each address a holder left, with its pool.
    pub left: Vec<(Arc<str>, IpAddr)>,
    /// Each address another holder joined.
    pub joined: Vec<IpAddr>,
}

/// Held keys (`namespace/name`) per namespace.
type NamespaceHolders = HashMap<Box<str>, BTreeSet<Arc<str>>, FastHash>;

/// Pools, holdings and the allocation rules. Plain data: no I/O, no async,
/// deterministic, and every method is total (no panic on any input).
#[derive(Debug, Default)]
pub struct Allocator {
    /// Every pool object, per kind, by name.
    objects: Objects,
    /// Pool objects in creation order.
    order: BTreeMap<OrderKey, (PoolKind, String)>,
    next_seq: u64,
    /// Accepted pools by name: both kinds share one name space, the
    /// older object of a name taking it.
    /// Boxed: a map node holds 11 values, and a state by value made each
    /// node (half empty after splits) ~5 KB.
    pools: BTreeMap<Arc<str>, Box<PoolState>>,
    /// Pool objects by the Namespace labels their `namespaceSelectors`
    /// read: a Namespace change that none reads touches no holder.
    namespace_readers: LabelReaders,
    /// The Service label keys the pool objects read.
    label_keys: LabelKeys,
    /// Rejected pools by name and kind.
    rejected: BTreeMap<(String, PoolKind), Rejection>,
    /// The ranges of the rejected pools that parsed, by first address.
    rejected_ranges: RejectedRanges,
    /// How many rejected pools each accepted pool blocks.
    blocking: HashMap<Arc<str>, u32, FastHash>,
    /// Accepted pools' ranges: (family, first) → (last, pool), for locating
    /// an address in O(log pools).
    index: BTreeMap<(Family, u128), (u128, Arc<str>)>,
    auto: AutoIndex,
    services: HashMap<Arc<str>, Held, FastHash>,
    /// How many of `services` each namespace has (keys `namespace/name`):
    /// a Namespace change with none there looks at no key.
    holders_per_namespace: HashMap<Box<str>, u32, FastHash>,
    /// The keys of `services` per namespace, made by the first Namespace
    /// change that touches holders (one walk of every key) and kept from
    /// then on: a cluster whose Namespaces never change that way does not
    /// pay for it.
    namespace_holders: Option<NamespaceHolders>,
    addresses: HashMap<IpAddr, Holders, FastHash>,
    /// Each address a holder left (or left and took again on other terms)
    /// since [`Allocator::take_regrouped`], with its pool: where a Service
    /// that may share could fit now, free or not.
    departures: BTreeSet<(Arc<str>, IpAddr)>,
    /// Each address that got another holder since
    /// [`Allocator::take_regrouped`]: with `departures`, where the holder
    /// a refused Service's message names may have changed.
    joins: BTreeSet<IpAddr>,
    /// Per family: whether `departures` or `joins` has an address of it.
    regrouped_families: [bool; 2],
    /// See [`Allocator::loosenings`].
    loosenings: u64,
    /// Search steps taken (entries, runs, holders and pools looked at):
    /// what cost tests count.
    steps: Cell<u64>,
    /// Tests: place every holding again on every pool change, by the full
    /// recomputation, to compare with the shortcuts.
    #[cfg(test)]
    pub(crate) rebuild_all: bool,
    /// Tests: walk every pinned pool with room, not only those the index
    /// of what they require leads to, to compare the choices.
    #[cfg(test)]
    pub(crate) every_pinned: bool,
    /// Tests: decide every pool change by the full recomputation (keeping
    /// unchanged pools' holdings), to compare the shortcuts' reports.
    #[cfg(test)]
    pub(crate) whole_recompute: bool,
}

impl Allocator {
    /// An allocator without pools.
    pub fn new() -> Self {
        Self::default()
    }

    /// Search steps taken so far: entries, runs of a group, holders and
    /// pools looked at. For tests that check cost by counting work.
    pub fn steps(&self) -> u64 {
        self.steps.get()
    }

    fn step(&self, n: u64) {
        self.steps.set(self.steps.get().saturating_add(n));
    }

    // ----- pools -----

    /// Adds or replaces the `IPAddressPool` `name` (a replaced pool keeps
    /// its creation position) and recomputes which pools are accepted.
    pub fn set_pool(&mut self, name: &str, spec: &IPAddressPoolSpec) -> PoolChange {
        self.set_pool_created(name, spec, None)
    }

    /// [`Allocator::set_pool`] for a pool whose `metadata.creationTimestamp`
    /// (nanoseconds since the epoch) is known: pools are ordered by it (so
    /// the older of two overlapping pools stays whatever order a host lists
    /// them in), pools without one after those with one, in arrival order.
    pub fn set_pool_created(
        &mut self,
        name: &str,
        spec: &IPAddressPoolSpec,
        created: Option<i128>,
    ) -> PoolChange {
        let parsed = Pool::parse(name, spec);
        self.set_object(PoolKind::IPAddressPool, name, parsed, created)
    }

    /// Adds or replaces the `CiliumLoadBalancerIPPool` `name`
    /// ([`Pool::parse_cilium`]), as [`Allocator::set_pool`] does for an
    /// `IPAddressPool`: one creation order and one name space for both
    /// kinds (docs/allocation.md §3.3).
    pub fn set_cilium_pool(
        &mut self,
        name: &str,
        spec: &CiliumLoadBalancerIPPoolSpec,
    ) -> PoolChange {
        self.set_cilium_pool_created(name, spec, None)
    }

    /// [`Allocator::set_cilium_pool`] with a known creation time, as
    /// [`Allocator::set_pool_created`].
    pub fn set_cilium_pool_created(
        &mut self,
        name: &str,
        spec: &CiliumLoadBalancerIPPoolSpec,
        created: Option<i128>,
    ) -> PoolChange {
        let parsed = Pool::parse_cilium(name, spec);
        self.set_object(PoolKind::CiliumLoadBalancerIPPool, name, parsed, created)
    }

    fn set_object(
        &mut self,
        kind: PoolKind,
        name: &str,
        parsed: Result<Pool, PoolError>,
        created: Option<i128>,
    ) -> PoolChange {
        let parsed = parsed.map(Arc::new);
        let objects = self.objects_mut(kind);
        let order = match objects.get(name) {
            Some(old) => {
                let created = created.or(old.order.1);
                let order = (created.is_none(), created, old.order.2);
                if old.order == order && old.parsed == parsed && !self.forced_rebuild() {
                    // The same object again: nothing changes.
                    return PoolChange::default();
                }
                order
            }
            None => {
                let seq = self.next_seq;
                self.next_seq += 1;
                (created.is_none(), created, seq)
            }
        };
        self.loosen();
        // The old object's readers go before the new one's come: the two
        // may read the same labels.
        let new = parsed.as_ref().ok().map(Arc::clone);
        let mut old_ranges = Vec::new();
        if let Some(old) = self
            .objects_mut(kind)
            .insert(name.to_owned(), PoolObject { parsed, order })
        {
            self.order.remove(&old.order);
            self.read_labels(name, old.parsed.as_ref().ok(), false);
            if let Ok(pool) = &old.parsed {
                old_ranges.clone_from(&pool.ranges);
            }
        }
        self.read_labels(name, new.as_ref(), true);
        self.order.insert(order, (kind, name.to_owned()));
        let newest = self.order.last_key_value().map(|(key, _)| *key) == Some(order);
        // A name used by both kinds is decided by the full recomputation.
        let shared_name = self.object(kind.other(), name).is_some();
        if shared_name || self.forced_recompute() {
            self.recompute_pools(name)
        } else if !self.is_blocking(name) && (newest || !self.overlaps_another(kind, name)) {
            self.set_alone(kind, name)
        } else {
            self.recompute_overlapping(kind, name, old_ranges)
        }
    }

    /// Decides again the pool object `name` of `kind`, just changed or
    /// removed (its old ranges `old_ranges`), and every pool object it may
    /// sway: those overlapping its old or new ranges, and those
    /// overlapping these, and so on. No other pool's acceptance, nor the
    /// reason of a rejected one, can change: each is decided against the
    /// older accepted pools it overlaps, all outside this set. Costs the
    /// set's entries × log pools, plus the rejected pools' entries per
    /// range looked at, not every pool: a pool that blocks a newer one,
    /// changed N times beside N pools, is not N².
    fn recompute_overlapping(
        &mut self,
        kind: PoolKind,
        name: &str,
        old_ranges: Vec<AddrRange>,
    ) -> PoolChange {
        let Some(swayed) = self.overlapping_closure(kind, name, old_ranges) else {
            return self.recompute_pools(name);
        };
        let mut old_states = HashMap::<Arc<str>, Box<PoolState>, FastHash>::default();
        let mut old_rejected = BTreeMap::new();
        // Listed first: a removed object is not among those decided.
        let this = (kind, name.to_owned());
        for (kind, object_name) in std::iter::once(&this).chain(swayed.values()) {
            if self
                .pools
                .get(object_name.as_str())
                .is_some_and(|s| s.pool.kind == *kind)
            {
                if let Some(state) = self.remove_state(object_name) {
                    old_states.insert(Arc::clone(&state.name), state);
                }
            }
            if let Some(rejection) = self.forget_rejection(*kind, object_name) {
                old_rejected.insert((object_name.clone(), *kind), rejection.reason);
            }
        }
        let mut kept = BTreeSet::new();
        let mut moving = Vec::new();
        for (kind, object_name) in swayed.values() {
            self.step(1);
            self.decide_object(*kind, object_name, &mut old_states, &mut kept, &mut moving);
        }
        moving.extend(old_states.into_values());
        let decided = swayed.values().map(|(kind, name)| (*kind, name.as_str()));
        self.finish_change(name, decided, &kept, &moving, &old_rejected)
    }

    /// The pool object `name` of `kind` and, transitively, every pool
    /// object (accepted or rejected) whose ranges overlap those of one in
    /// the set, `old_ranges` counting as `name`'s too; in creation order.
    /// `None` once finding them has looked at more than twice as many
    /// ranges as there are pool objects: the full recomputation is then
    /// no dearer.
    fn overlapping_closure(
        &self,
        kind: PoolKind,
        name: &str,
        old_ranges: Vec<AddrRange>,
    ) -> Option<BTreeMap<OrderKey, (PoolKind, String)>> {
        let budget = 2 * self.order.len() as u64 + 16;
        let start = self.steps.get();
        let mut swayed = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut ranges = old_ranges;
        let mut add = |kind: PoolKind, name: &str, ranges: &mut Vec<AddrRange>| {
            if !seen.insert((kind, name.to_owned())) {
                return;
            }
            let Some(object) = self.object(kind, name) else {
                return;
            };
            swayed.insert(object.order, (kind, name.to_owned()));
            if let Ok(pool) = &object.parsed {
                ranges.extend(pool.ranges.iter().copied());
            }
        };
        add(kind, name, &mut ranges);
        while let Some(range) = ranges.pop() {
            let mut found = Vec::new();
            self.step(1);
            if self.steps.get().saturating_sub(start) > budget {
                return None;
            }
            for owner in self.accepted_overlapping(&range) {
                if let Some(state) = self.pools.get(owner) {
                    found.push((state.pool.kind, owner.to_string()));
                }
            }
            for (other_kind, other) in self.rejected_overlapping(&range) {
                found.push((other_kind, other.to_owned()));
            }
            for (kind, name) in found {
                add(kind, &name, &mut ranges);
            }
        }
        Some(swayed)
    }

    /// Whether the pool object `name` of `kind`, as defined now, overlaps
    /// any other pool, accepted or rejected. One that does not, and blocks
    /// no other, is decided alone wherever it stands in creation order:
    /// no other pool's acceptance, nor the reason of a rejected one, can
    /// change with it. Costs O(entries × log pools), plus the rejected
    /// pools' entries (few: a rejection is a configuration error).
    fn overlaps_another(&self, kind: PoolKind, name: &str) -> bool {
        let Some(Ok(pool)) = self.object(kind, name).map(|object| &object.parsed) else {
            return false;
        };
        // Its own old ranges (still in the index) and rejection are skipped.
        pool.ranges.iter().any(|range| {
            self.accepted_overlapping(range)
                .any(|owner| **owner != *name)
                || self
                    .rejected_overlapping(range)
                    .any(|(other_kind, other)| other != name || other_kind != kind)
        })
    }

    /// The accepted pools with a range overlapping `range`.
    fn accepted_overlapping<'a>(&'a self, range: &AddrRange) -> impl Iterator<Item = &'a Arc<str>> {
        // Disjoint ranges, latest start first: those ending before ours
        // starts end the search.
        let below = (range.family, 0)..=(range.family, range.last);
        let first = range.first;
        self.index
            .range(below)
            .rev()
            .inspect(|_| self.step(1))
            .take_while(move |(_, (last, _))| *last >= first)
            .map(|(_, (_, owner))| owner)
    }

    /// The rejected pool objects with a range overlapping `range`, a pool
    /// once per range of it that does.
    fn rejected_overlapping<'a>(
        &'a self,
        range: &AddrRange,
    ) -> impl Iterator<Item = (PoolKind, &'a str)> {
        self.rejected_ranges.overlapping(range, || self.step(1))
    }

    /// Removes the `IPAddressPool` `name`, if present, and recomputes
    /// acceptance: a pool it overlapped may now be accepted.
    pub fn remove_pool(&mut self, name: &str) -> PoolChange {
        self.remove_pool_of(PoolKind::IPAddressPool, name)
    }

    /// Removes the `CiliumLoadBalancerIPPool` `name`, as
    /// [`Allocator::remove_pool`].
    pub fn remove_cilium_pool(&mut self, name: &str) -> PoolChange {
        self.remove_pool_of(PoolKind::CiliumLoadBalancerIPPool, name)
    }

    /// Removes the pool object `name` of `kind`, if present: a pool it
    /// overlapped, or the newer pool of the other kind with its name, may
    /// now be accepted.
    pub fn remove_pool_of(&mut self, kind: PoolKind, name: &str) -> PoolChange {
        let Some(object) = self.objects_mut(kind).remove(name) else {
            return PoolChange::default();
        };
        self.loosen();
        self.order.remove(&object.order);
        self.read_labels(name, object.parsed.as_ref().ok(), false);
        // The newer object of the other kind with this name may come in.
        if self.forced_recompute() || self.object(kind.other(), name).is_some() {
            return self.recompute_pools(name);
        }
        if self.is_blocking(name) {
            let old_ranges = object.parsed.map(|pool| pool.ranges.clone());
            return self.recompute_overlapping(kind, name, old_ranges.unwrap_or_default());
        }
        // Nothing depends on a rejected pool, nor on an accepted one that
        // blocks no other: only its own holdings go.
        self.forget_rejection(kind, name);
        let mut change = PoolChange {
            changed: vec![name.to_owned()],
            ..PoolChange::default()
        };
        if self.pools.get(name).is_some_and(|s| s.pool.kind == kind) {
            if let Some(state) = self.remove_state(name) {
                change.released = self.rehome(&[state]);
            }
        }
        change
    }

    /// Adds (`read`) or takes out the pool object `name` from the readers
    /// of Namespace labels, if its namespace rule has selectors.
    /// Counts what `pool` (the object `name`) reads of Namespaces and
    /// Services in (`read`) or out.
    fn read_labels(&mut self, name: &str, pool: Option<&Arc<Pool>>, read: bool) {
        if let Some(pool) = pool {
            self.label_keys.count(pool, read);
        }
        let Some(selectors) = pool
            .and_then(|pool| pool.allocation.as_ref())
            .map(|allocation| allocation.namespace_selectors())
            .filter(|selectors| !selectors.is_empty())
        else {
            return;
        };
        if read {
            self.namespace_readers.insert(name, selectors);
        } else {
            self.namespace_readers.remove(name, selectors);
        }
    }

    fn objects_mut(&mut self, kind: PoolKind) -> &mut HashMap<String, PoolObject, FastHash> {
        match kind {
            PoolKind::IPAddressPool => &mut self.objects[0],
            PoolKind::CiliumLoadBalancerIPPool => &mut self.objects[1],
        }
    }

    fn object(&self, kind: PoolKind, name: &str) -> Option<&PoolObject> {
        self.objects.get(kind.index())?.get(name)
    }

    /// The rejection of `name` of `kind` for its name, when an older object
    /// of the other kind has it.
    fn name_taken(&self, kind: PoolKind, name: &str, order: OrderKey) -> Option<Rejection> {
        let other = self.object(kind.other(), name)?;
        (other.order < order).then(|| Rejection {
            reason: PoolError::NameTaken {
                other_pool: name.to_owned(),
                other_kind: kind.other(),
            }
            .to_string(),
            blocker: Some(Arc::from(name)),
            conflict: None,
        })
    }

    fn forced_rebuild(&self) -> bool {
        #[cfg(test)]
        if self.rebuild_all {
            return true;
        }
        false
    }

    /// [`Allocator::forced_rebuild`], or the full recomputation forced
    /// with reuse.
    fn forced_recompute(&self) -> bool {
        #[cfg(test)]
        if self.whole_recompute {
            return true;
        }
        self.forced_rebuild()
    }

    /// Which group of automatic pools `pool` is in, if it is an accepted
    /// automatic pool.
    pub fn auto_group(&self, pool: &str) -> Option<AutoGroup> {
        let state = self.pools.get(pool)?;
        let (unpinned, _, _) = state.auto.as_ref()?;
        if *unpinned {
            return Some(AutoGroup::Unpinned);
        }
        Some(AutoGroup::Pinned(state.rules.as_ref()?.fingerprint()))
    }

    fn walks_every_pinned(&self) -> bool {
        #[cfg(test)]
        if self.every_pinned {
            return true;
        }
        false
    }

    fn is_blocking(&self, name: &str) -> bool {
        self.blocking.get(name).is_some_and(|n| *n > 0)
    }

    fn forget_rejection(&mut self, kind: PoolKind, name: &str) -> Option<Rejection> {
        let rejection = self.rejected.remove(&(name.to_owned(), kind))?;
        self.rejected_ranges.remove(kind, name);
        if let Some(blocker) = &rejection.blocker {
            if let Some(count) = self.blocking.get_mut(blocker) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.blocking.remove(blocker);
                }
            }
        }
        Some(rejection)
    }

    fn reject(&mut self, kind: PoolKind, name: &str, rejection: Rejection) {
        if let Some(blocker) = &rejection.blocker {
            *self.blocking.entry(Arc::clone(blocker)).or_insert(0) += 1;
        }
        self.rejected.insert((name.to_owned(), kind), rejection);
        let ranges = self
            .object(kind, name)
            .and_then(|object| object.parsed.as_ref().ok())
            .map(|pool| pool.ranges.clone());
        if let Some(ranges) = ranges {
            self.rejected_ranges.insert(kind, name, &ranges);
        }
    }

    /// The pool `name` of `kind`, blocking no other and alone with its
    /// name, changed, and either the newest or overlapping no other pool
    /// ([`Allocator::overlaps_another`]): only its own acceptance is at
    /// stake, against the older accepted pools, and only its own holdings
    /// may move. O(entries × log pools).
    fn set_alone(&mut self, kind: PoolKind, name: &str) -> PoolChange {
        self.forget_rejection(kind, name);
        let old = self.remove_state(name);
        let parsed = match self.object(kind, name) {
            Some(object) => object.parsed.clone(),
            None => return PoolChange::default(),
        };
        let mut change = PoolChange {
            changed: vec![name.to_owned()],
            ..PoolChange::default()
        };
        let verdict = parsed.map_err(|error| Rejection::of(&error, name, kind));
        self.step(1);
        let verdict =
            verdict.and_then(
                |pool| match overlap_in_index(&self.index, &self.pools, &pool) {
                    Some(rejection) => Err(rejection),
                    None => Ok(pool),
                },
            );
        let mut moving = Vec::new();
        match verdict {
            Ok(pool) => {
                let state = match old {
                    Some(old) if old.pool == pool => old,
                    other => {
                        moving.extend(other);
                        Box::new(PoolState::new(pool))
                    }
                };
                self.insert_state(state);
            }
            Err(rejection) => {
                change.rejected.push(rejection.report(name, kind));
                self.reject(kind, name, rejection);
                moving.extend(old);
            }
        }
        change.released = self.rehome(&moving);
        change
    }

    /// Takes the accepted pool `name` out of every index; its holdings stay
    /// in `services` and `addresses` until [`Allocator::rehome`].
    fn remove_state(&mut self, name: &str) -> Option<Box<PoolState>> {
        let state = self.pools.remove(name)?;
        for range in &state.pool.ranges {
            self.index.remove(&(range.family, range.first));
        }
        if let Some(key) = &state.auto {
            let (guard, rules) = (state.guard.as_deref(), state.rules.as_ref());
            self.auto.all.remove(key, guard, rules);
            self.auto.open_both.remove(key, guard, rules);
            for family in FAMILIES {
                let i = family.index();
                for set in [&mut self.auto.open, &mut self.auto.cilium] {
                    if let Some(set) = set.get_mut(i) {
                        set.remove(key, guard, rules);
                    }
                }
                if let Some(groups) = self.auto.groups.get_mut(i) {
                    for group in state.family(family).groups.keys() {
                        if let Some(pools) = groups.get_mut(group) {
                            pools.remove(key);
                            if pools.is_empty() {
                                groups.remove(group);
                            }
                        }
                    }
                }
            }
        }
        Some(state)
    }

    /// Puts an accepted pool's state in every index.
    fn insert_state(&mut self, state: Box<PoolState>) {
        for range in &state.pool.ranges {
            self.index.insert(
                (range.family, range.first),
                (range.last, Arc::clone(&state.name)),
            );
        }
        if let Some(key) = &state.auto {
            let (guard, rules) = (state.guard.as_deref(), state.rules.as_ref());
            self.auto.all.insert(key, guard, rules);
            for family in FAMILIES {
                if state.is_open(family) {
                    if let Some(open) = self.auto.open.get_mut(family.index()) {
                        open.insert(key, guard, rules);
                    }
                }
                if state.pool.kind == PoolKind::CiliumLoadBalancerIPPool && state.has_family(family)
                {
                    if let Some(cilium) = self.auto.cilium.get_mut(family.index()) {
                        cilium.insert(key, guard, rules);
                    }
                }
                if let Some(groups) = self.auto.groups.get_mut(family.index()) {
                    for group in state.family(family).groups.keys() {
                        groups
                            .entry(Arc::clone(group))
                            .or_default()
                            .insert(key.clone());
                    }
                }
            }
            if state.is_open(Family::V4) && state.is_open(Family::V6) {
                self.auto.open_both.insert(key, guard, rules);
            }
        }
        self.pools.insert(Arc::clone(&state.name), state);
    }

    /// Books in the automatic index whether `pool` has room of `family`.
    fn update_open(&mut self, pool: &str, family: Family) {
        let Some(state) = self.pools.get(pool) else {
            return;
        };
        let Some(key) = &state.auto else {
            return;
        };
        let (guard, rules) = (state.guard.as_deref(), state.rules.as_ref());
        let (open, both) = (
            state.is_open(family),
            state.is_open(Family::V4) && state.is_open(Family::V6),
        );
        if let Some(set) = self.auto.open.get_mut(family.index()) {
            set.set(key, guard, rules, open);
        }
        self.auto.open_both.set(key, guard, rules, both);
    }

    /// Books in the automatic index whether `group` holds addresses of
    /// `family` in `pool`.
    fn update_group(&mut self, pool: &str, family: Family, group: &Group) {
        let Some(state) = self.pools.get(pool) else {
            return;
        };
        let Some(key) = state.auto.clone() else {
            return;
        };
        let holds = state.family(family).groups.contains_key(group);
        let Some(groups) = self.auto.groups.get_mut(family.index()) else {
            return;
        };
        if holds {
            groups.entry(Arc::clone(group)).or_default().insert(key);
        } else if let Some(pools) = groups.get_mut(group) {
            pools.remove(&key);
            if pools.is_empty() {
                groups.remove(group);
            }
        }
    }

    /// Every accepted pool's counters, sorted by name.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.pools
            .values()
            .map(|state| {
                let stats = |family| {
                    let f = state.family(family);
                    FamilyStats {
                        total: f.total,
                        assigned: f.held(),
                        reserved: f.reserved,
                    }
                };
                PoolStats {
                    name: state.pool.name.clone(),
                    kind: state.pool.kind,
                    ipv4: stats(Family::V4),
                    ipv6: stats(Family::V6),
                }
            })
            .collect()
    }

    /// Every rejected pool with its reason, sorted by name, then kind
    /// (`IPAddressPool` first).
    pub fn rejected_pools(&self) -> Vec<RejectedPool> {
        self.rejected
            .iter()
            .map(|((name, kind), rejection)| rejection.report(name, *kind))
            .collect()
    }

    /// The accepted pool `name`, of either kind (one name space).
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.get(name).map(|state| &*state.pool)
    }

    /// The ranges of every pool object named `name` that parses, of either
    /// kind, accepted or not: every address that pool name may serve now,
    /// or did before a change to another pool's acceptance.
    pub fn ranges_named(&self, name: &str) -> Vec<AddrRange> {
        self.objects
            .iter()
            .filter_map(|objects| objects.get(name)?.parsed.as_ref().ok())
            .flat_map(|pool| pool.ranges.iter().copied())
            .collect()
    }

    /// Recomputes acceptance of every pool in creation order (each against
    /// those accepted before it) and places again the holdings of every pool
    /// whose definition or acceptance changed. `name` is the pool whose
    /// change called for it. O(all entries): for the changes the shortcuts
    /// cannot decide alone (an older pool, or one that others depend on).
    fn recompute_pools(&mut self, name: &str) -> PoolChange {
        let mut old_pools = std::mem::take(&mut self.pools);
        let old_rejected = std::mem::take(&mut self.rejected);
        self.rejected_ranges.clear();
        // Tests: every holding placed again, as before pools kept theirs.
        let reuse = !self.forced_rebuild();
        self.index.clear();
        self.auto = AutoIndex::default();
        self.blocking.clear();
        let mut kept = BTreeSet::new();
        let mut moving = Vec::new();
        let names: Vec<(PoolKind, String)> = self.order.values().cloned().collect();
        let mut old_pools: HashMap<Arc<str>, Box<PoolState>, FastHash> = if reuse {
            old_pools.into_iter().collect()
        } else {
            moving.extend(std::mem::take(&mut old_pools).into_values());
            HashMap::default()
        };
        for (kind, object_name) in &names {
            self.step(1);
            self.decide_object(*kind, object_name, &mut old_pools, &mut kept, &mut moving);
        }
        moving.extend(old_pools.into_values());
        let old_reasons = old_rejected
            .into_iter()
            .map(|(key, rejection)| (key, rejection.reason))
            .collect();
        let decided = names.iter().map(|(kind, name)| (*kind, name.as_str()));
        self.finish_change(name, decided, &kept, &moving, &old_reasons)
    }

    /// Re-homes the holdings of the `moving` states and reports the change
    /// of the pool `name`, once the pool objects `decided` are decided
    /// again: it releases what the `moving` states
    /// held and no pool now takes; it changes `name`, the `moving` pools
    /// and those accepted but not `kept`; and it reports those rejected
    /// for another reason than `old_reasons` says, and `name` whenever it
    /// is rejected.
    fn finish_change<'a>(
        &mut self,
        name: &str,
        decided: impl Iterator<Item = (PoolKind, &'a str)>,
        kept: &BTreeSet<Arc<str>>,
        moving: &[Box<PoolState>],
        old_reasons: &BTreeMap<(String, PoolKind), String>,
    ) -> PoolChange {
        let mut changed: BTreeSet<String> = BTreeSet::new();
        let mut rejected = Vec::new();
        for (kind, object_name) in decided {
            let key = (object_name.to_owned(), kind);
            if let Some(r) = self.rejected.get(&key) {
                if object_name == name || old_reasons.get(&key) != Some(&r.reason) {
                    rejected.push(r.report(object_name, kind));
                }
            } else if self.pools.contains_key(object_name) && !kept.contains(object_name) {
                changed.insert(object_name.to_owned());
            }
        }
        rejected.sort_by(|a, b| (&a.name, a.kind).cmp(&(&b.name, b.kind)));
        changed.extend(moving.iter().map(|state| state.name.to_string()));
        changed.insert(name.to_owned());
        PoolChange {
            released: self.rehome(moving),
            changed: changed.into_iter().collect(),
            rejected,
        }
    }

    /// Decides the pool object `name` of `kind` against the accepted pools
    /// in the index (those older than it, when objects are decided in
    /// creation order): rejects it, or accepts it with its old state from
    /// `old_states` when the pool is the same (`kept`), else with a new
    /// one (the old state `moving`). Nothing when there is no such object.
    // Boxed states: they move between the pool map and these lists as
    // they are, never copied out of their box.
    #[allow(clippy::vec_box)]
    fn decide_object(
        &mut self,
        kind: PoolKind,
        name: &str,
        old_states: &mut HashMap<Arc<str>, Box<PoolState>, FastHash>,
        kept: &mut BTreeSet<Arc<str>>,
        moving: &mut Vec<Box<PoolState>>,
    ) {
        let Some(object) = self.object(kind, name) else {
            return;
        };
        if let Some(rejection) = self.name_taken(kind, name, object.order) {
            self.reject(kind, name, rejection);
            return;
        }
        let pool = match &object.parsed {
            Ok(pool) => Arc::clone(pool),
            Err(error) => {
                let rejection = Rejection::of(error, name, kind);
                self.reject(kind, name, rejection);
                return;
            }
        };
        if let Some(rejection) = overlap_in_index(&self.index, &self.pools, &pool) {
            self.reject(kind, name, rejection);
            return;
        }
        let state = match old_states.remove(name) {
            Some(old) if old.pool == pool => {
                kept.insert(Arc::clone(&old.name));
                old
            }
            other => {
                moving.extend(other);
                Box::new(PoolState::new(pool))
            }
        };
        self.insert_state(state);
    }

    /// Places again the holdings of the pools `gone` (no longer in any
    /// index): in the accepted pool that now contains their addresses, or
    /// nowhere (released). Costs the number of those holdings.
    fn rehome(&mut self, gone: &[Box<PoolState>]) -> Vec<Released> {
        let mut keys: BTreeSet<Arc<str>> = BTreeSet::new();
        for state in gone {
            for (family, value) in state.used_values() {
                if let Some(holders) = self.addresses.get(&from_int(family, value)) {
                    keys.extend(holders.iter().cloned());
                }
            }
        }
        let gone_names: BTreeSet<&str> = gone.iter().map(|state| &*state.name).collect();
        let mut services = Vec::with_capacity(keys.len());
        for key in &keys {
            if let Some(entry) = self.remove_service(key) {
                for &ip in entry.1.ips.iter() {
                    if gone_names.contains(&**entry.1.pool_of(ip)) {
                        // All holders of an address are in its one pool:
                        // they all move, and the entry goes.
                        self.addresses.remove(&ip);
                    } else {
                        // The other family of a pair in two Cilium pools,
                        // in a pool that stays: released there properly
                        // (others may share it), taken again below.
                        self.release_ip(&entry.0, &entry.1, ip);
                    }
                }
                services.push(entry);
            }
        }
        // In key order, so holders are listed the same way in every run.
        let mut released = Vec::new();
        for (key, mut held) in services {
            match self.pools_of(&held.ips) {
                Ok((pool, pool6)) => {
                    held.pool = pool;
                    held.pool6 = pool6;
                    self.insert_held(key, held);
                }
                Err(error) => match self.survivor(&held.ips) {
                    // Held per address (Cilium, docs/cilium.md §3.5): only
                    // the family whose pool went loses its address.
                    Some((ip, pool)) => {
                        released.push(Released {
                            key: key.to_string(),
                            ips: held.ips.iter().copied().filter(|i| *i != ip).collect(),
                            reason: error.to_string(),
                        });
                        held.pool = pool;
                        held.pool6 = None;
                        held.ips = Box::new([ip]);
                        self.insert_held(key, held);
                    }
                    None => released.push(Released {
                        key: key.to_string(),
                        ips: held.ips.into_vec(),
                        reason: error.to_string(),
                    }),
                },
            }
        }
        released
    }

    /// Of a pair of addresses that may not stay together, the one kept
    /// alone when the pair is held per address: no address of the pair
    /// lies in an `IPAddressPool` (those keep MetalLB's rule, both or
    /// neither) and this one lies in an accepted Cilium pool that allows
    /// it. IPv4 first.
    fn survivor(&self, ips: &[IpAddr]) -> Option<(IpAddr, Arc<str>)> {
        let [a, b] = *ips else {
            return None;
        };
        if a.is_ipv6() == b.is_ipv6()
            || ips
                .iter()
                .any(|ip| self.kind_at(*ip) == Some(PoolKind::IPAddressPool))
        {
            return None;
        }
        ips.iter().find_map(|&ip| {
            let state = self.locate(ip).ok()?;
            (state.pool.kind == PoolKind::CiliumLoadBalancerIPPool)
                .then(|| (ip, Arc::clone(&state.name)))
        })
    }

    /// The kind of the accepted pool whose range contains `ip`, usable or
    /// not.
    fn kind_at(&self, ip: IpAddr) -> Option<PoolKind> {
        let (family, value) = to_int(ip);
        let (_, (_, name)) = self
            .index
            .range(..=(family, value))
            .next_back()
            .filter(|((f, _), (last, _))| *f == family && *last >= value)?;
        self.pools.get(name).map(|state| state.pool.kind)
    }

    /// The accepted pool that contains `ip` and allows it.
    fn locate(&self, ip: IpAddr) -> Result<&PoolState, AllocError> {
        let (family, value) = to_int(ip);
        let (_, (_, name)) = self
            .index
            .range(..=(family, value))
            .next_back()
            .filter(|((f, _), (last, _))| *f == family && *last >= value)
            .ok_or(AllocError::NotInAnyPool { ip })?;
        let state = self
            .pools
            .get(name)
            .ok_or(AllocError::NotInAnyPool { ip })?;
        if !state.pool.usable(family).is_usable(value) {
            return Err(AllocError::Avoided {
                ip,
                pool: state.pool.name.clone(),
            });
        }
        if state.family(family).is_reserved(&state.pool, value) {
            return Err(AllocError::AddressReserved {
                ip,
                pool: state.pool.name.clone(),
            });
        }
        Ok(state)
    }

    /// The pools that allow the addresses of `ips`: one pool for all, or
    /// (a pair of one address per family, each in a Cilium pool) one per
    /// family, as Cilium keeps each family on its own (docs/cilium.md §3.5).
    fn pools_of(&self, ips: &[IpAddr]) -> Result<Pools, AllocError> {
        match self.pool_of_all(ips) {
            Ok(pool) => Ok((pool, None)),
            Err(error @ AllocError::DifferentPools { .. }) => {
                let [a, b] = *ips else {
                    return Err(error);
                };
                let (v4, v6) = match (a.is_ipv6(), b.is_ipv6()) {
                    (false, true) => (a, b),
                    (true, false) => (b, a),
                    _ => return Err(error),
                };
                let (first, second) = (self.locate(v4)?, self.locate(v6)?);
                let cilium = PoolKind::CiliumLoadBalancerIPPool;
                if first.pool.kind == cilium && second.pool.kind == cilium {
                    Ok((Arc::clone(&first.name), Some(Arc::clone(&second.name))))
                } else {
                    Err(error)
                }
            }
            Err(error) => Err(error),
        }
    }

    /// The one pool that allows every address of `ips`.
    fn pool_of_all(&self, ips: &[IpAddr]) -> Result<Arc<str>, AllocError> {
        let mut found: Option<(IpAddr, &PoolState)> = None;
        for &ip in ips {
            let state = self.locate(ip)?;
            if let Some((first, first_state)) = found {
                if first_state.name != state.name {
                    return Err(AllocError::DifferentPools {
                        first,
                        second: ip,
                        first_pool: first_state.pool.name.clone(),
                        second_pool: state.pool.name.clone(),
                    });
                }
            } else {
                found = Some((ip, state));
            }
        }
        found
            .map(|(_, state)| Arc::clone(&state.name))
            .ok_or(AllocError::WrongFamily {
                ips: Vec::new(),
                policy: FamilyPolicy::RequireDual,
            })
    }

    // ----- holdings -----

    /// What the Service `key` holds.
    pub fn holding(&self, key: &str) -> Option<Holding> {
        self.services.get(key).map(Held::holding)
    }

    /// What the Service `key` holds, borrowed: its pool and addresses (IPv4
    /// first). For checks that must not copy.
    pub fn held(&self, key: &str) -> Option<(&str, &[IpAddr])> {
        self.services.get(key).map(|held| (&*held.pool, &*held.ips))
    }

    /// Every holding, sorted by key.
    pub fn holdings(&self) -> Vec<(String, Holding)> {
        let mut all: Vec<(String, Holding)> = self
            .services
            .iter()
            .map(|(key, held)| (key.to_string(), held.holding()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Every held address with its holders in their stored order.
    #[cfg(test)]
    pub(crate) fn holder_lists(&self) -> Vec<(IpAddr, Vec<String>)> {
        let mut all: Vec<(IpAddr, Vec<String>)> = self
            .addresses
            .iter()
            .map(|(ip, holders)| (*ip, holders.iter().map(|h| h.to_string()).collect()))
            .collect();
        all.sort();
        all
    }

    /// The Services holding `ip`, sorted: costs their number (a shared
    /// address may have thousands; [`Allocator::is_held`] asks less).
    pub fn holders(&self, ip: IpAddr) -> Vec<String> {
        let Some(holders) = self.addresses.get(&ip) else {
            return Vec::new();
        };
        self.step(holders.len() as u64);
        holders.iter().map(|h| h.to_string()).collect()
    }

    /// Whether any Service holds `ip`, in O(1) (an address's entry goes
    /// with its last holder).
    pub fn is_held(&self, ip: IpAddr) -> bool {
        self.step(1);
        self.addresses.contains_key(&ip)
    }

    /// The Services holding addresses in `namespace` (keys
    /// `namespace/name`), sorted: for a Namespace change, which only they
    /// among the holders may feel. Costs their number; the first call that
    /// finds holders also indexes every holder by namespace, once.
    pub fn holders_in_namespace(&mut self, namespace: &str) -> Vec<String> {
        if !self.holders_per_namespace.contains_key(namespace) {
            return Vec::new();
        }
        let services = &self.services;
        let steps = &self.steps;
        let index = self.namespace_holders.get_or_insert_with(|| {
            steps.set(steps.get().saturating_add(services.len() as u64));
            let mut index = NamespaceHolders::default();
            for key in services.keys() {
                let namespace = namespace_of_key(key);
                index
                    .entry(namespace.into())
                    .or_default()
                    .insert(Arc::clone(key));
            }
            index
        });
        let keys: Vec<String> = index
            .get(namespace)
            .into_iter()
            .flatten()
            .map(|key| key.to_string())
            .collect();
        self.step(keys.len() as u64);
        keys
    }

    /// Whether changing the labels of Namespace `namespace` from `old` to
    /// `new` changes whether the namespace rule of any pool lets its
    /// Services in. If not, every Service there is allowed the pools it
    /// was (docs/allocation.md §4.6). Asks only the pools whose
    /// `namespaceSelectors` read a label that changed, by its old or new
    /// value: O(labels) and those pools, never every pool. Pools of either
    /// acceptance are asked, a rejected one only making the answer
    /// cautious.
    pub fn namespace_labels_matter(
        &self,
        namespace: &str,
        old: &BTreeMap<String, String>,
        new: &BTreeMap<String, String>,
    ) -> bool {
        self.namespace_readers.concerned(old, new).any(|name| {
            self.step(1);
            let object = self.object(PoolKind::IPAddressPool, name);
            let allocation = object.and_then(|object| {
                let pool = object.parsed.as_ref().ok()?;
                pool.allocation.as_ref()
            });
            allocation.is_some_and(|allocation| {
                allocation.admits_namespace(namespace, old)
                    != allocation.admits_namespace(namespace, new)
            })
        })
    }

    /// The Services holding addresses in the pool `name`, sorted: costs
    /// their number, not the pool's size.
    pub fn holders_in(&self, name: &str) -> Vec<String> {
        let Some(state) = self.pools.get(name) else {
            return Vec::new();
        };
        let mut keys: BTreeSet<&Arc<str>> = BTreeSet::new();
        for (family, value) in state.used_values() {
            if let Some(holders) = self.addresses.get(&from_int(family, value)) {
                keys.extend(holders.iter());
            }
        }
        keys.into_iter().map(|key| key.to_string()).collect()
    }

    /// The sharing key and ports `key` holds its addresses with, to tell
    /// whether they changed.
    pub fn sharing_of(&self, key: &str) -> Option<(&str, &[Port])> {
        self.services
            .get(key)
            .map(|held| (held.group().unwrap_or_default(), held.ports()))
    }

    /// Number of Services holding addresses.
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// Whether no Service holds an address.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// Releases whatever `key` holds; returns what it held.
    pub fn release(&mut self, key: &str) -> Option<Holding> {
        let (key, held) = self.remove_service(key)?;
        for &ip in held.ips.iter() {
            self.release_ip(&key, &held, ip);
        }
        Some(held.holding())
    }

    /// What the pools read of a Service's `labels`, as a number: two
    /// Services of one Namespace with the same number are served alike by
    /// every pool, now and (by the pools' rules) at any time the number
    /// is the same.
    pub fn labels_read(&self, labels: &BTreeMap<String, String>) -> u64 {
        self.label_keys.read_of(labels)
    }

    /// How many changes so far may have let a Service fit where it did
    /// not: a holder leaving an address (released, or taken again on
    /// other sharing terms) and any pool added, changed or removed.
    /// Between two equal counts only new holds happened, and a new holder
    /// only narrows what fits: a Service that failed still fails, alike.
    pub fn loosenings(&self) -> u64 {
        self.loosenings
    }

    fn loosen(&mut self) {
        self.loosenings = self.loosenings.wrapping_add(1);
    }

    /// Where holders left addresses (with the pool) and where they joined
    /// others on an address, since the last call, and forgets them: a
    /// change of a holder's sharing terms is a release and a new hold, so
    /// this names every address whose holders changed.
    pub fn take_regrouped(&mut self) -> Regrouped {
        self.regrouped_families = [false; 2];
        Regrouped {
            left: std::mem::take(&mut self.departures).into_iter().collect(),
            joined: std::mem::take(&mut self.joins).into_iter().collect(),
        }
    }

    /// Whether a holder left or joined an address of `family` since the
    /// last [`Allocator::take_regrouped`]: O(1).
    pub fn regrouped_since(&self, family: Family) -> bool {
        self.regrouped_families
            .get(family.index())
            .copied()
            .unwrap_or(true)
    }

    /// Takes `key` (whose holding was `held`) off `ip`, freeing it when no
    /// one else holds it.
    fn release_ip(&mut self, key: &Arc<str>, held: &Held, ip: IpAddr) {
        {
            let Some(holders) = self.addresses.get_mut(&ip) else {
                return;
            };
            let still_held = holders.remove(key, held.ports(), held.tenancy());
            let (family, value) = to_int(ip);
            let pool = held.pool_of(ip);
            self.departures.insert((Arc::clone(pool), ip));
            self.loosen();
            if let Some(pending) = self.regrouped_families.get_mut(Family::of(ip).index()) {
                *pending = true;
            }
            let Some(state) = self.pools.get_mut(pool) else {
                if !still_held {
                    self.addresses.remove(&ip);
                }
                return;
            };
            let family_state = state.family_mut(family);
            let rank = family_state.rank(value);
            let mut group_gone = None;
            if let (Some(sharing), Some(rank)) = (&held.sharing, rank) {
                if let Some(group) = family_state.groups.get_mut(&sharing.group) {
                    for port in sharing.ports.iter() {
                        group.remove_port(rank, port);
                    }
                    if !still_held {
                        group.leave(rank);
                        if group.is_empty() {
                            family_state.groups.remove(&sharing.group);
                            group_gone = Some(Arc::clone(&sharing.group));
                        }
                    }
                }
            }
            if !still_held {
                self.addresses.remove(&ip);
                if family_state.free(value) {
                    self.update_open(pool, family);
                }
            }
            if let Some(group) = group_gone {
                self.update_group(pool, family, &group);
            }
        }
    }

    fn insert_held(&mut self, key: Arc<str>, held: Held) {
        for &ip in held.ips.iter() {
            let (family, value) = to_int(ip);
            let new_address = match self.addresses.get_mut(&ip) {
                Some(holders) => {
                    let first = holders
                        .first_other(&key)
                        .and_then(|first| self.services.get(first));
                    let first = (
                        first.map_or(&[][..], Held::ports),
                        first.and_then(Held::tenancy),
                    );
                    holders.add(Arc::clone(&key), (held.ports(), held.tenancy()), first);
                    self.joins.insert(ip);
                    if let Some(pending) = self.regrouped_families.get_mut(Family::of(ip).index()) {
                        *pending = true;
                    }
                    false
                }
                None => {
                    self.addresses.insert(ip, Holders::One(Arc::clone(&key)));
                    true
                }
            };
            let pool_name = held.pool_of(ip);
            let Some(state) = self.pools.get_mut(pool_name) else {
                continue;
            };
            let pool = &state.pool;
            let family_state = match family {
                Family::V4 => &mut state.families[0],
                Family::V6 => &mut state.families[1],
            };
            let ran_out = new_address && family_state.take(pool, value);
            let mut group_new = None;
            if let (Some(sharing), Some(rank)) = (&held.sharing, family_state.rank(value)) {
                let group = match family_state.groups.get_mut(&sharing.group) {
                    Some(group) => group,
                    None => {
                        group_new = Some(Arc::clone(&sharing.group));
                        family_state
                            .groups
                            .entry(Arc::clone(&sharing.group))
                            .or_default()
                    }
                };
                group.join(rank);
                for port in sharing.ports.iter() {
                    group.add_port(rank, port);
                }
            }
            if ran_out {
                self.update_open(pool_name, family);
            }
            if let Some(group) = group_new {
                self.update_group(pool_name, family, &group);
            }
        }
        let counted = Arc::clone(&key);
        if self.services.insert(key, held).is_none() {
            let namespace = namespace_of_key(&counted);
            match self.holders_per_namespace.get_mut(namespace) {
                Some(count) => *count += 1,
                None => {
                    self.holders_per_namespace.insert(namespace.into(), 1);
                }
            }
            if let Some(index) = &mut self.namespace_holders {
                index.entry(namespace.into()).or_default().insert(counted);
            }
        }
    }

    /// Takes `key` out of the Services that hold addresses.
    fn remove_service(&mut self, key: &str) -> Option<(Arc<str>, Held)> {
        let entry = self.services.remove_entry(key)?;
        let namespace = namespace_of_key(key);
        if let Some(count) = self.holders_per_namespace.get_mut(namespace) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.holders_per_namespace.remove(namespace);
            }
        }
        if let Some(index) = &mut self.namespace_holders {
            if let Some(keys) = index.get_mut(namespace) {
                keys.remove(key);
                if keys.is_empty() {
                    index.remove(namespace);
                }
            }
        }
        Some(entry)
    }

    fn hold(&mut self, request: &Request<'_>, pools: Pools, mut ips: Vec<IpAddr>) -> Holding {
        ips.sort_by_key(|ip| ip.is_ipv6());
        let (pool, pool6) = pools;
        let group = group_of_request(request);
        let ports: &[Port] = if group.is_some() { request.ports } else { &[] };
        let holding = Holding {
            pool: pool.to_string(),
            ips: ips.clone(),
            other_pool: pool6.as_deref().map(str::to_owned),
        };
        // Keeping what is held already (every reconciliation of a settled
        // Service) changes nothing.
        if let Some(held) = self.services.get(request.key) {
            let same_namespaces = held.sharing.as_deref().is_none_or(|s| {
                *s.tenancy.0 == *request.subject.namespace
                    && s.tenancy.1 == admits_of(request.sharing_namespaces)
            });
            if held.pool == pool
                && held.pool6 == pool6
                && *held.ips == *ips
                && held.group() == group.as_deref()
                && held.ports() == ports
                && same_namespaces
            {
                return holding;
            }
        }
        self.release(request.key);
        let held = Held {
            pool,
            pool6,
            ips: ips.into_boxed_slice(),
            sharing: group.map(|group| {
                Box::new(Sharing {
                    group: Arc::from(group),
                    ports: ports.into(),
                    tenancy: (
                        Arc::from(request.subject.namespace),
                        admits_of(request.sharing_namespaces),
                    ),
                })
            }),
        };
        self.insert_held(Arc::from(request.key), held);
        holding
    }

    // ----- the rules -----

    /// Whether `ip` may be given to `request` (whose group is `group`), the
    /// Service's own holding aside: free, or every other holder shares it
    /// under §4.4. O(ports × log holders).
    fn fits(
        &self,
        ip: IpAddr,
        request: &Request<'_>,
        group: Option<&str>,
    ) -> Result<(), ShareConflict> {
        self.step(1);
        let Some(holders) = self.addresses.get(&ip) else {
            return Ok(());
        };
        let Some(first) = holders.first_other(request.key) else {
            return Ok(());
        };
        let Some(first_held) = self.services.get(first) else {
            return Ok(());
        };
        // Every holder of an address has the same group.
        let (Some(theirs), Some(ours)) = (first_held.group(), group) else {
            return Err(ShareConflict::InUse {
                holder: first.to_string(),
            });
        };
        if theirs != ours {
            let holder = first.to_string();
            let same_key = same_rule(theirs, ours) && sharing_part(theirs) == request.sharing_key;
            return Err(if same_key {
                ShareConflict::OtherBackend { holder }
            } else {
                ShareConflict::OtherKey { holder }
            });
        }
        if let Some(holder) = self.namespace_refusal(ip, request) {
            return Err(ShareConflict::Namespace {
                holder: holder.to_string(),
            });
        }
        let (shared, steps) = holders.first_with_port(request.key, request.ports);
        self.step(steps);
        let conflicting = match shared {
            Some(holder) => holder,
            // One holder: its own ports.
            None => Some(first),
        };
        let Some(holder) = conflicting else {
            return Ok(());
        };
        let Some(held) = self.services.get(holder) else {
            return Ok(());
        };
        match held.ports().iter().find(|p| request.ports.contains(p)) {
            Some(port) => Err(ShareConflict::Port {
                holder: holder.to_string(),
                port: port.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The first holder of `ip` (other than the requester, in key order)
    /// whose namespace rule refuses `request` (docs/cilium.md §3.4, rule 2).
    /// O(1) when neither the request nor any holder restricts namespaces
    /// (MetalLB's default); otherwise O(distinct tenancies of the holders),
    /// plus a walk over the holders to name one when it is refused.
    fn namespace_refusal(&self, ip: IpAddr, request: &Request<'_>) -> Option<&Arc<str>> {
        self.namespace_check(ip, request, true).err().flatten()
    }

    /// Whether the namespace rule refuses `request` on `ip`, without naming
    /// a holder: O(1) or O(distinct tenancies), never a walk over holders.
    fn namespace_refuses(&self, ip: IpAddr, request: &Request<'_>) -> bool {
        self.namespace_check(ip, request, false).is_err()
    }

    /// [`Allocator::namespace_refusal`]; `name`: find the refusing holder
    /// (a walk over the holders, on refusal only).
    fn namespace_check(
        &self,
        ip: IpAddr,
        request: &Request<'_>,
        name: bool,
    ) -> Result<(), Option<&Arc<str>>> {
        let Some(holders) = self.addresses.get(&ip) else {
            return Ok(());
        };
        let admits = admits_of(request.sharing_namespaces);
        let own = holders
            .contains(request.key)
            .then(|| self.services.get(request.key).and_then(Held::tenancy))
            .flatten();
        let (refused, steps) =
            holders.tenancy_refuses(request.subject.namespace, admits.as_deref(), own);
        self.step(steps);
        let walk = || {
            holders.iter().find(|holder| {
                ***holder != *request.key
                    && self
                        .services
                        .get(*holder)
                        .and_then(|held| held.sharing.as_deref())
                        .is_some_and(|sharing| {
                            !namespaces_agree(request, admits.as_deref(), sharing)
                        })
            })
        };
        if refused == Some(false) {
            #[cfg(all(test, debug_assertions))]
            assert_eq!(walk(), None, "the tenancy index disagrees with a walk");
            return Ok(());
        }
        if refused == Some(true) && !name {
            #[cfg(all(test, debug_assertions))]
            assert!(walk().is_some(), "the tenancy index disagrees with a walk");
            return Err(None);
        }
        // Refused, or a single holder (one look): name it.
        self.step(1);
        let found = walk();
        #[cfg(all(test, debug_assertions))]
        assert!(
            refused.is_none() || found.is_some(),
            "the tenancy index disagrees with a walk"
        );
        match found {
            Some(holder) => Err(Some(holder)),
            None => Ok(()),
        }
    }

    /// Checks `ips` against every rule for `request`: families, one pool
    /// that serves it (autoAssign aside) and allows them, sharing, and the
    /// requested addresses and pool. `partial` accepts one address of a
    /// PreferDualStack Service (a held or requested address), and of a
    /// RequireDualStack one when it lies in a Cilium pool (held per
    /// family, docs/cilium.md §3.5). `new`: the addresses are asked for,
    /// not held, so a disabled pool refuses them. Two addresses in two
    /// Cilium pools are checked each against its own pool.
    fn check(
        &self,
        request: &Request<'_>,
        ips: &[IpAddr],
        partial: bool,
        new: bool,
    ) -> Result<Pools, AllocError> {
        let half_cilium = || {
            partial
                && request.families == FamilyPolicy::RequireDual
                && ips.len() == 1
                && ips
                    .iter()
                    .all(|ip| self.kind_at(*ip) == Some(PoolKind::CiliumLoadBalancerIPPool))
        };
        if !request.families.accepts(ips, partial) && !half_cilium() {
            return Err(AllocError::WrongFamily {
                ips: ips.to_vec(),
                policy: request.families,
            });
        }
        if !request.addresses.is_empty() {
            let held: BTreeSet<&IpAddr> = ips.iter().collect();
            let requested: BTreeSet<&IpAddr> = request.addresses.iter().collect();
            if held != requested {
                return Err(AllocError::NotRequested {
                    held: ips.to_vec(),
                    requested: request.addresses.to_vec(),
                });
            }
        }
        let pools = self.pools_of(ips)?;
        let (first, second) = &pools;
        let v6 = ips.iter().copied().find(IpAddr::is_ipv6);
        let mut each = vec![(first, ips.first().copied())];
        if let Some(second) = second {
            each = vec![
                (first, ips.iter().copied().find(IpAddr::is_ipv4)),
                (second, v6),
            ];
        }
        for (pool, ip) in each {
            self.check_pool_for(request, pool, ip, new)?;
        }
        let group = group_of_request(request);
        for &ip in ips {
            self.fits(ip, request, group.as_deref())
                .map_err(|conflict| AllocError::Taken { ip, conflict })?;
        }
        Ok(pools)
    }

    /// The pool rules of [`Allocator::check`] for the pool `pool` that
    /// holds `ip`: the requested pool, serving the Service, not disabled
    /// for new addresses.
    fn check_pool_for(
        &self,
        request: &Request<'_>,
        pool: &Arc<str>,
        ip: Option<IpAddr>,
        new: bool,
    ) -> Result<(), AllocError> {
        let state = self.pools.get(pool);
        if let Some(requested) = request.pool {
            if **pool == *requested && state.is_some_and(|s| s.pool.kind != PoolKind::IPAddressPool)
            {
                return Err(AllocError::CiliumPoolNamed {
                    pool: requested.to_owned(),
                });
            }
            if **pool != *requested {
                return Err(AllocError::NotInRequestedPool {
                    ip: ip.unwrap_or(IpAddr::from([0, 0, 0, 0])),
                    pool: pool.to_string(),
                    requested: requested.to_owned(),
                });
            }
        }
        let serves = state.is_some_and(|s| s.pool.serves(&request.subject));
        if !serves {
            return Err(AllocError::PoolDoesNotServe {
                pool: pool.to_string(),
            });
        }
        if new && state.is_some_and(|s| s.pool.disabled) {
            return Err(AllocError::PoolDisabled {
                pool: pool.to_string(),
            });
        }
        Ok(())
    }

    /// Keeps `ips` (a Service's status addresses) for `request` if they are
    /// still allowed (§4.4 step 1): the Service then holds exactly them.
    /// Otherwise nothing changes and the error says why.
    ///
    /// A dual-stack pair held per address (no address of it in an
    /// `IPAddressPool`, nothing requested) keeps the address that is
    /// allowed when the other is not, as Cilium keeps each family on its
    /// own (docs/cilium.md §3.5, §3.7): see [`Allocator::keep_part`].
    pub fn keep(&mut self, request: &Request<'_>, ips: &[IpAddr]) -> Result<Holding, AllocError> {
        self.keep_part(request, ips).map(|(holding, _)| holding)
    }

    /// [`Allocator::keep`], saying which address was let go and why when
    /// only part of `ips` is kept.
    pub fn keep_part(
        &mut self,
        request: &Request<'_>,
        ips: &[IpAddr],
    ) -> Result<(Holding, Option<(IpAddr, AllocError)>), AllocError> {
        let (pools, kept, dropped) = self.check_keep(request, ips)?;
        Ok((self.hold(request, pools, kept), dropped))
    }

    /// Whether `keep` would succeed, without changing anything.
    pub fn can_keep(&self, request: &Request<'_>, ips: &[IpAddr]) -> Result<(), AllocError> {
        self.check_keep(request, ips).map(|_| ())
    }

    /// What [`Allocator::keep_part`] keeps: the pools, the addresses, and
    /// the address let go with its reason.
    fn check_keep(&self, request: &Request<'_>, ips: &[IpAddr]) -> Result<Kept, AllocError> {
        let error = match self.check(request, ips, true, false) {
            Ok(pools) => return Ok((pools, ips.to_vec(), None)),
            Err(error) => error,
        };
        let dual = matches!(
            request.families,
            FamilyPolicy::RequireDual | FamilyPolicy::PreferDual { .. }
        );
        if !dual || !request.addresses.is_empty() || self.survivor(ips).is_none() {
            return Err(error);
        }
        // Per address: the first (IPv4 first) that is allowed alone stays.
        let mut sorted = ips.to_vec();
        sorted.sort_by_key(IpAddr::is_ipv6);
        for &ip in &sorted {
            let Ok(pools) = self.check(request, &[ip], true, false) else {
                continue;
            };
            let Some(&other) = sorted.iter().find(|o| **o != ip) else {
                continue;
            };
            let why = self
                .locate(other)
                .err()
                .or_else(|| self.check(request, &[other], true, false).err())
                .unwrap_or(error);
            return Ok((pools, vec![ip], Some((other, why))));
        }
        Err(error)
    }

    /// Gives `request` new addresses (§4.4 steps 2–4), releasing whatever it
    /// held. On error the Service holds nothing.
    pub fn allocate(&mut self, request: &Request<'_>) -> Result<Holding, AllocError> {
        self.release(request.key);
        let (pools, ips) = self.choose_new(request)?;
        Ok(self.hold(request, pools, ips))
    }

    /// §4.4 steps 2–4 without changing anything: the pool and addresses
    /// `request` gets, its own holding aside (already released by
    /// [`Allocator::allocate`]). Shared with `explain`.
    pub(crate) fn choose_new(
        &self,
        request: &Request<'_>,
    ) -> Result<(Pools, Vec<IpAddr>), AllocError> {
        if !request.addresses.is_empty() {
            // A PreferDualStack Service may ask for one address of either
            // family, and then holds just that one (§4.2).
            let partial = matches!(request.families, FamilyPolicy::PreferDual { .. });
            let pools = self.check(request, request.addresses, partial, true)?;
            return Ok((pools, request.addresses.to_vec()));
        }
        match request.pool {
            Some(name) => {
                // `metallb.io/address-pool` names IPAddressPools only
                // (docs/cilium.md §4.1).
                let cilium_named = || AllocError::CiliumPoolNamed {
                    pool: name.to_owned(),
                };
                let state = self.pools.get(name).ok_or_else(|| {
                    if self
                        .object(PoolKind::CiliumLoadBalancerIPPool, name)
                        .is_some()
                    {
                        cilium_named()
                    } else {
                        AllocError::UnknownPool {
                            pool: name.to_owned(),
                        }
                    }
                })?;
                if state.pool.kind != PoolKind::IPAddressPool {
                    return Err(cilium_named());
                }
                if !state.pool.serves(&request.subject) {
                    return Err(AllocError::PoolDoesNotServe {
                        pool: name.to_owned(),
                    });
                }
                let candidates = [Arc::clone(&state.name)];
                self.choose(request, &candidates)
                    .map(|(pool, ips)| ((pool, None), ips))
            }
            None => self.choose_auto(request),
        }
    }

    /// For a dual-stack Service holding one address it did not request (a
    /// PreferDualStack one, or one whose other address was let go per
    /// address, docs/cilium.md §3.5): adds the missing family from the
    /// same pool if one fits; else, held in a Cilium pool, from the first
    /// candidate with a fitting address of that family if that is a Cilium
    /// pool too (the rule of a new allocation, §4.3 item 4). Returns the
    /// new holding when an address was added.
    pub fn complete_dual_stack(&mut self, request: &Request<'_>) -> Option<Holding> {
        if !matches!(
            request.families,
            FamilyPolicy::PreferDual { .. } | FamilyPolicy::RequireDual
        ) || !request.addresses.is_empty()
        {
            return None;
        }
        let held = self.services.get(request.key)?;
        // The held address must still be allowed for this request.
        self.check(request, &held.ips, true, false).ok()?;
        let [ip] = *held.ips else {
            return None;
        };
        let missing = Family::of(ip).other();
        let state = self.pools.get(&held.pool)?;
        let same = (!state.pool.disabled)
            .then(|| self.lowest_fit(state, missing, request))
            .flatten();
        let (pools, added) = match same {
            Some(value) => ((Arc::clone(&state.name), None), from_int(missing, value)),
            None if state.pool.kind == PoolKind::CiliumLoadBalancerIPPool => {
                let (other, ips) = self.first_cilium_fit(request, missing)?;
                let added = *ips.first()?;
                let pools = match missing {
                    Family::V6 => (Arc::clone(&state.name), Some(other)),
                    Family::V4 => (other, Some(Arc::clone(&state.name))),
                };
                (pools, added)
            }
            None => return None,
        };
        Some(self.hold(request, pools, vec![ip, added]))
    }

    /// The first automatic candidate (in order) with a fitting address of
    /// `family` for `request`, if it is a Cilium pool.
    fn first_cilium_fit(
        &self,
        request: &Request<'_>,
        family: Family,
    ) -> Option<(Arc<str>, Vec<IpAddr>)> {
        let group = group_of_request(request);
        let families = [family];
        let (with_room, stacking) = self.auto_candidates(&families, group.as_deref());
        let (pool, ips) = self.first_fit_of(request, &families, with_room, stacking)?;
        let kind = self.pools.get(&pool)?.pool.kind;
        (kind == PoolKind::CiliumLoadBalancerIPPool).then_some((pool, ips))
    }

    /// The groups of the automatic Cilium pools that serve `request` and
    /// have addresses of `family` ([`AutoGroup`]): where a Service held in
    /// a Cilium pool may get that family (see
    /// [`Allocator::complete_dual_stack`]), so what a waiting one waits on.
    /// Pools with equal rules serve the same Services, so one group stands
    /// for them all: it costs the rules that serve `request`, not a walk
    /// over the pools.
    pub fn cilium_groups(&self, request: &Request<'_>, family: Family) -> Vec<AutoGroup> {
        let Some(cilium) = self.auto.cilium.get(family.index()) else {
            return Vec::new();
        };
        let serving = cilium.serving(&request.subject, self.walks_every_pinned(), &self.steps);
        let pinned = serving.fingerprints().into_iter().map(AutoGroup::Pinned);
        let unpinned = (!cilium.unpinned().is_empty()).then_some(AutoGroup::Unpinned);
        let mut groups: Vec<AutoGroup> = pinned.chain(unpinned).collect();
        groups.sort_unstable();
        groups.dedup();
        groups
    }

    /// [`Allocator::cilium_groups`] the long way, for tests: the group of
    /// every automatic pool that serves `request`, walked one by one, if
    /// it is a Cilium pool with addresses of `family`.
    #[cfg(test)]
    pub(crate) fn cilium_groups_walked(
        &self,
        request: &Request<'_>,
        family: Family,
    ) -> Vec<AutoGroup> {
        let all = &self.auto.all;
        let serving = all.serving(&request.subject, true, &self.steps);
        let mut groups: Vec<AutoGroup> = (serving.pools().chain(all.unpinned().iter()))
            .filter_map(|key| self.pools.get(&key.2))
            .filter(|state| {
                state.pool.kind == PoolKind::CiliumLoadBalancerIPPool && state.has_family(family)
            })
            .filter_map(|state| self.auto_group(&state.name))
            .collect();
        groups.sort_unstable();
        groups.dedup();
        groups
    }

    /// §4.3 item 4 of docs/cilium.md: a dual-stack Service that no one
    /// pool serves with both families takes one from each of two Cilium
    /// pools: the first candidate with a fitting IPv4 address and the
    /// first with a fitting IPv6 one, when both are Cilium pools.
    fn split_fit(&self, request: &Request<'_>) -> Option<(Pools, Vec<IpAddr>)> {
        let (pool4, ips4) = self.first_cilium_fit(request, Family::V4)?;
        let (pool6, ips6) = self.first_cilium_fit(request, Family::V6)?;
        let ips = vec![*ips4.first()?, *ips6.first()?];
        let pool6 = (pool6 != pool4).then_some(pool6);
        Some(((pool4, pool6), ips))
    }

    /// The family passes of §4.3: the families one pool must give at once,
    /// in the order they are tried.
    fn passes(families: FamilyPolicy) -> &'static [&'static [Family]] {
        match families {
            FamilyPolicy::Single(Family::V4) => &[&[Family::V4]],
            FamilyPolicy::Single(Family::V6) => &[&[Family::V6]],
            FamilyPolicy::RequireDual => &[&[Family::V4, Family::V6]],
            FamilyPolicy::PreferDual {
                primary: Family::V4,
            } => &[&[Family::V4, Family::V6], &[Family::V4], &[Family::V6]],
            FamilyPolicy::PreferDual {
                primary: Family::V6,
            } => &[&[Family::V4, Family::V6], &[Family::V6], &[Family::V4]],
        }
    }

    /// The addresses of `families` that `state` gives `request`, if it has
    /// a fitting one of each.
    fn fit_all(
        &self,
        state: &PoolState,
        families: &[Family],
        request: &Request<'_>,
    ) -> Option<Vec<IpAddr>> {
        families
            .iter()
            .map(|&family| {
                self.lowest_fit(state, family, request)
                    .map(|v| from_int(family, v))
            })
            .collect()
    }

    /// §4.4 step 4 without a walk over the pools: per family pass, only the
    /// automatic pools that have room for it (a free address of each
    /// family, or addresses of the Service's group) are looked at, in
    /// order, and the first that serves the Service and fits wins.
    fn choose_auto(&self, request: &Request<'_>) -> Result<(Pools, Vec<IpAddr>), AllocError> {
        let group = group_of_request(request);
        if request.sharing_rule == SharingRule::Cilium {
            if let Some((pool, ips)) = self.join_first(request, group.as_deref()) {
                return Ok(((pool, None), ips));
            }
        }
        for families in Self::passes(request.families) {
            let (with_room, stacking) = self.auto_candidates(families, group.as_deref());
            if let Some((pool, ips)) = self.first_fit_of(request, families, with_room, stacking) {
                return Ok(((pool, None), ips));
            }
            // No one pool has both families: one from each of two Cilium
            // pools, before a PreferDualStack Service settles for one.
            if families.len() == 2 {
                if let Some(found) = self.split_fit(request) {
                    return Ok(found);
                }
            }
        }
        // No pool fits: the failure counts the pinned pools that serve it
        // by their rules (found by the index) and the unpinned ones, which
        // serve every Service, and names the first of them: it costs
        // nothing per pool (§4.9).
        let all = &self.auto.all;
        let serving = all.serving(&request.subject, self.walks_every_pinned(), &self.steps);
        let pinned = (!serving.is_empty()).then(|| {
            let first: Vec<String> = serving
                .pools()
                .take(Tried::LISTED)
                .map(|(_, _, name)| name.to_string())
                .collect();
            self.step(u64::try_from(first.len()).unwrap_or(u64::MAX));
            Box::new(PinnedTried {
                first,
                count: serving.count(),
                rules: serving.fingerprints(),
            })
        });
        let unpinned = (!all.unpinned().is_empty()).then(|| {
            let first: Vec<String> = all
                .unpinned()
                .iter()
                .take(Tried::LISTED)
                .map(|(_, _, name)| name.to_string())
                .collect();
            self.step(u64::try_from(first.len()).unwrap_or(u64::MAX));
            UnpinnedTried {
                first,
                count: all.unpinned().len(),
            }
        });
        let tried = Tried {
            named: Vec::new(),
            pinned,
            unpinned,
        };
        if tried.count() == 0 {
            return Err(AllocError::NoPool);
        }
        Err(self.no_fit(request, tried))
    }

    /// For a Cilium key: the first automatic pool (in order) where its
    /// group holds addresses it may join, of every family it needs
    /// (docs/cilium.md §4.3 step 3). Looks only at the pools where the
    /// group stands.
    fn join_first(
        &self,
        request: &Request<'_>,
        group: Option<&str>,
    ) -> Option<(Arc<str>, Vec<IpAddr>)> {
        group?;
        // Only the first family pass: a dual-stack Service joins both
        // families at once or goes on to the usual order, which still
        // prefers its group's addresses within each pool (lowest_fit), so
        // both families from one pool keep their precedence (§4.3).
        for families in Self::passes(request.families).iter().take(1) {
            let (_, stacking) = self.auto_candidates(families, group);
            for key in stacking {
                self.step(1);
                let Some(state) = self.pools.get(&key.2) else {
                    continue;
                };
                if !state.pool.serves(&request.subject) {
                    continue;
                }
                let joined: Option<Vec<IpAddr>> = families
                    .iter()
                    .map(|&family| {
                        self.first_joinable(state, family, request, (u32::MAX, u128::MAX))
                            .map(|(_, value)| from_int(family, value))
                    })
                    .collect();
                if let Some(ips) = joined {
                    return Some((Arc::clone(&key.2), ips));
                }
            }
        }
        None
    }

    /// The automatic pools that may fit `families` at once: those with a
    /// free address of each, and (few) those where `group` stacks for one
    /// family while the other is free or stacked too.
    fn auto_candidates(
        &self,
        families: &[Family],
        group: Option<&str>,
    ) -> (&AutoSet, BTreeSet<&AutoKey>) {
        let open = |family: Family| {
            let [v4, v6] = &self.auto.open;
            match family {
                Family::V4 => v4,
                Family::V6 => v6,
            }
        };
        let stacks = |family: Family| {
            group.and_then(|group| {
                self.auto
                    .groups
                    .get(family.index())
                    .and_then(|groups| groups.get(group))
            })
        };
        if let [family] = *families {
            return (open(family), stacks(family).into_iter().flatten().collect());
        }
        let mut stacking = BTreeSet::new();
        for (family, other) in [(Family::V4, Family::V6), (Family::V6, Family::V4)] {
            let other_stacks = stacks(other);
            for key in stacks(family).into_iter().flatten() {
                if open(other).contains(key) || other_stacks.is_some_and(|s| s.contains(key)) {
                    stacking.insert(key);
                }
            }
        }
        (&self.auto.open_both, stacking)
    }

    /// The first of the candidates (those of `with_room` that may serve
    /// `request`, and `stacking`, merged, lowest first) that serves
    /// `request` and fits `families`.
    fn first_fit_of(
        &self,
        request: &Request<'_>,
        families: &[Family],
        with_room: &AutoSet,
        mut stacking: BTreeSet<&AutoKey>,
    ) -> Option<(Arc<str>, Vec<IpAddr>)> {
        let every_pinned = self.walks_every_pinned();
        let mut with_room = with_room
            .candidates(request.subject, every_pinned, &self.steps)
            .peekable();
        loop {
            // Whether the pool is known to serve the request: the walk over
            // the rules asked those of each pool it yields (§4.9).
            let (key, serves) = match (with_room.peek(), stacking.first()) {
                (Some(a), Some(b)) if *b < *a => (stacking.pop_first()?, false),
                (Some(_), _) => (with_room.next()?, !every_pinned),
                (None, Some(_)) => (stacking.pop_first()?, false),
                (None, None) => return None,
            };
            stacking.remove(key);
            self.step(1);
            let name = &key.2;
            let Some(state) = self.pools.get(name) else {
                continue;
            };
            if !serves && !state.pool.serves(&request.subject) {
                continue;
            }
            if let Some(ips) = self.fit_all(state, families, request) {
                return Some((Arc::clone(name), ips));
            }
        }
    }

    /// The first candidate pool (in order) that satisfies the family rule of
    /// §4.3, with its addresses.
    fn choose(
        &self,
        request: &Request<'_>,
        candidates: &[Arc<str>],
    ) -> Result<(Arc<str>, Vec<IpAddr>), AllocError> {
        for families in Self::passes(request.families) {
            for name in candidates {
                let Some(state) = self.pools.get(name) else {
                    continue;
                };
                if let Some(ips) = self.fit_all(state, families, request) {
                    return Ok((Arc::clone(name), ips));
                }
            }
        }
        let tried = Tried {
            named: candidates.iter().map(|name| name.to_string()).collect(),
            ..Tried::default()
        };
        Err(self.no_fit(request, tried))
    }

    /// Why none of the pools `tried` fits `request`.
    fn no_fit(&self, request: &Request<'_>, tried: Tried) -> AllocError {
        if let Some(only) = tried.only() {
            let state = self.pools.get(only);
            let missing = match request.families {
                FamilyPolicy::Single(family) => Some(family),
                FamilyPolicy::RequireDual => [Family::V4, Family::V6]
                    .into_iter()
                    .find(|f| state.is_some_and(|s| !s.has_family(*f))),
                FamilyPolicy::PreferDual { .. } => None,
            };
            if let Some(family) = missing.filter(|f| state.is_some_and(|s| !s.has_family(*f))) {
                return AllocError::NoFamilyInPool {
                    pool: only.to_owned(),
                    family,
                };
            }
        }
        let needed = match request.families {
            FamilyPolicy::Single(family) => format!("an {family} address"),
            FamilyPolicy::RequireDual => "both an IPv4 and an IPv6 address".to_owned(),
            FamilyPolicy::PreferDual { .. } => "an IPv4 or IPv6 address".to_owned(),
        };
        AllocError::NoAvailable { needed, tried }
    }

    /// The lowest address of `family` in `state` that fits `request`:
    /// entries in `spec.addresses` order, each from its lowest address up.
    /// The lowest free address is the first open entry's; a sharing Service
    /// may also stack on an address of its group before it, where none of
    /// its ports is taken. O(log) either way.
    fn lowest_fit(&self, state: &PoolState, family: Family, request: &Request<'_>) -> Option<u128> {
        let family_state = state.family(family);
        let free = family_state.lowest_free(&state.pool);
        self.step(1);
        // A Cilium key joins an address of its group anywhere in the pool
        // before it takes a free one (docs/cilium.md §4.3 step 3).
        let joins_first = request.sharing_rule == SharingRule::Cilium;
        let until = match free {
            Some(free) if !joins_first => free,
            _ => (u32::MAX, u128::MAX),
        };
        let shared = self.first_joinable(state, family, request, until);
        let best = match (free, shared) {
            (_, Some(shared)) if joins_first => Some(shared),
            (Some(free), Some(shared)) => Some(free.min(shared)),
            (free, shared) => free.or(shared),
        };
        let found = best.map(|(_, value)| value);
        #[cfg(all(test, debug_assertions))]
        assert_eq!(
            found,
            self.lowest_fit_by_scan(state, family, request),
            "the indexes disagree with a scan of the pool"
        );
        found
    }

    /// The first address (in search order, before `until`) of `request`'s
    /// group in `state` that it may join: none of its ports taken there,
    /// and the namespace rule met with every holder. Each address the
    /// namespace rule refuses costs a lookup more (never for MetalLB's
    /// default, which refuses none).
    fn first_joinable(
        &self,
        state: &PoolState,
        family: Family,
        request: &Request<'_>,
        until: Rank,
    ) -> Option<Rank> {
        let group = group_of_request(request)?;
        let index = state.family(family).groups.get(group.as_str())?;
        let mut from: Rank = (0, 0);
        loop {
            let (found, steps) = index.first_without(request.ports, from, until);
            self.step(steps);
            let rank = found?;
            if !self.namespace_refuses(from_int(family, rank.1), request) {
                return Some(rank);
            }
            from = match rank.1.checked_add(1) {
                Some(next) => (rank.0, next),
                None => (rank.0.checked_add(1)?, 0),
            };
        }
    }

    /// [`Allocator::lowest_fit`] as a walk over every entry and every
    /// address of the group: what the indexes must answer.
    #[cfg(all(test, debug_assertions))]
    fn lowest_fit_by_scan(
        &self,
        state: &PoolState,
        family: Family,
        request: &Request<'_>,
    ) -> Option<u128> {
        let group = group_of_request(request);
        let admits = admits_of(request.sharing_namespaces);
        let used = &state.family(family).used;
        let joinable = |range: &AddrRange, upper: u128| {
            group.as_deref().and_then(|group| {
                used.values()
                    .filter(|v| *v >= range.first && *v <= upper)
                    .find(|&value| {
                        let ip = from_int(family, value);
                        self.addresses.get(&ip).is_some_and(|holders| {
                            holders.iter().all(|h| {
                                self.services.get(h).is_some_and(|held| {
                                    held.group() == Some(group)
                                        && !held.ports().iter().any(|p| request.ports.contains(p))
                                        && held.sharing.as_deref().is_some_and(|s| {
                                            namespaces_agree(request, admits.as_deref(), s)
                                        })
                                })
                            })
                        })
                    })
            })
        };
        let ranges = || state.pool.ranges.iter().filter(|r| r.family == family);
        if request.sharing_rule == SharingRule::Cilium {
            if let Some(found) = ranges().find_map(|range| joinable(range, range.last)) {
                return Some(found);
            }
        }
        for range in ranges() {
            let free = used.lowest_free(range.first, range.last);
            let upper = free.unwrap_or(range.last);
            let shared = joinable(range, upper);
            let best = match (free, shared) {
                (Some(free), Some(shared)) => Some(free.min(shared)),
                (free, shared) => free.or(shared),
            };
            if best.is_some() {
                return best;
            }
        }
        None
    }

    // ----- checks -----

    /// Checks the allocator's own invariants (docs/allocation.md §6): no
    /// address held by two Services unless they share it under §4.4, every
    /// held address inside an accepted pool that allows it, and counters
    /// equal to a recount. Returns every violation found.
    pub fn check_invariants(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let mut recount: BTreeMap<(&str, Family), u128> = BTreeMap::new();
        for (ip, holders) in &self.addresses {
            self.check_address(*ip, holders, &mut recount, &mut problems);
        }
        for (key, held) in &self.services {
            self.check_service(key, held, &mut problems);
        }
        for (name, state) in &self.pools {
            self.check_pool(name, state, &recount, &mut problems);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// [`Allocator::check_invariants`] for one held address: its pool, its
    /// holders and their sharing, and the tenancy index; counts it into
    /// `recount`.
    fn check_address<'a>(
        &'a self,
        ip: IpAddr,
        holders: &'a Holders,
        recount: &mut BTreeMap<(&'a str, Family), u128>,
        problems: &mut Vec<String>,
    ) {
        let helds: Vec<(&Arc<str>, Option<&Held>)> =
            holders.iter().map(|h| (h, self.services.get(h))).collect();
        let Some((_, Some(first))) = helds.first() else {
            problems.push(format!("{ip} is recorded with no holder that exists"));
            return;
        };
        let pool = first.pool_of(ip);
        match self.locate(ip) {
            Ok(state) if state.name == *pool => {}
            Ok(state) => problems.push(format!(
                "{ip} is held from pool {pool} but lies in {}",
                state.name
            )),
            Err(error) => problems.push(format!("{ip} is held but {error}")),
        }
        *recount.entry((&**pool, Family::of(ip))).or_default() += 1;
        if holders.len() > 1 {
            let mut tenancies: BTreeMap<Tenancy, u32> = BTreeMap::new();
            for tenancy in helds.iter().filter_map(|(_, h)| h.and_then(Held::tenancy)) {
                *tenancies.entry(tenancy.clone()).or_insert(0) += 1;
            }
            let restricting = tenancies
                .iter()
                .filter(|(t, _)| t.1.is_some())
                .map(|(_, n)| *n)
                .sum::<u32>();
            if holders.tenancy_counts() != Some((&tenancies, restricting)) {
                problems.push(format!("{ip}: the tenancy index is stale"));
            }
        }
        let mut seen: BTreeSet<&Port> = BTreeSet::new();
        for (holder, held) in &helds {
            let Some(held) = held else {
                problems.push(format!(
                    "{ip} lists {holder} as holder but {holder} holds nothing"
                ));
                continue;
            };
            if !held.ips.contains(&ip) || held.pool_of(ip) != pool {
                problems.push(format!(
                    "{ip} lists {holder} as holder but {holder} does not hold it"
                ));
            }
            if holders.len() > 1 {
                if held.group().is_none() || held.group() != first.group() {
                    problems.push(format!(
                        "{ip} is held by several services but {holder} may not share it"
                    ));
                }
                let namespaces_ok = helds.iter().all(|(_, other)| {
                    match (held.tenancy(), other.and_then(|o| o.tenancy())) {
                        (Some(a), Some(b)) => {
                            tenancies_agree(&a.0, a.1.as_deref(), &b.0, b.1.as_deref())
                        }
                        _ => true,
                    }
                });
                if !namespaces_ok {
                    problems.push(format!(
                        "{ip}: {holder} shares it with a namespace it does not admit"
                    ));
                }
                // A port a Service lists twice is one port of one Service
                // (the API server refuses such a Service; a stream may not).
                let own: BTreeSet<&Port> = held.ports().iter().collect();
                for port in own {
                    if !seen.insert(port) {
                        problems.push(format!("{ip}: port {port} is used twice"));
                    }
                }
            }
        }
    }

    /// [`Allocator::check_invariants`] for one Service: its pools, and each
    /// of its addresses listing it.
    fn check_service(&self, key: &Arc<str>, held: &Held, problems: &mut Vec<String>) {
        // Two pools only for one address per family, each in a Cilium
        // pool (docs/cilium.md §3.5).
        if let Some(other) = &held.pool6 {
            let kinds_ok = [&held.pool, other].iter().all(|name| {
                self.pools
                    .get(*name)
                    .is_some_and(|s| s.pool.kind == PoolKind::CiliumLoadBalancerIPPool)
            });
            let v4 = held.ips.iter().filter(|ip| ip.is_ipv4()).count();
            if *other == held.pool || !kinds_ok || (v4, held.ips.len() - v4) != (1, 1) {
                problems.push(format!(
                    "{key} holds addresses in pools {} and {other}, which is only for one address per family in two Cilium pools",
                    held.pool
                ));
            }
        }
        for ip in &held.ips {
            if !self
                .addresses
                .get(ip)
                .is_some_and(|holders| holders.contains(key))
            {
                problems.push(format!("{key} holds {ip} but the address does not list it"));
            }
        }
    }

    /// [`Allocator::check_invariants`] for one pool: counters equal to the
    /// recount, totals, entries with room and the automatic index current.
    fn check_pool(
        &self,
        name: &str,
        state: &PoolState,
        recount: &BTreeMap<(&str, Family), u128>,
        problems: &mut Vec<String>,
    ) {
        for family in FAMILIES {
            let family_state = state.family(family);
            let counted = recount.get(&(name, family)).copied().unwrap_or(0);
            if family_state.held() != counted {
                problems.push(format!(
                    "pool {name} {family}: counter {} but {counted} addresses held",
                    family_state.held()
                ));
            }
            if family_state.reserved != state.pool.reserved(family)
                || family_state.used.len() != counted + family_state.reserved
            {
                problems.push(format!("pool {name} {family}: reserved ends are stale"));
            }
            if family_state.total != state.pool.total(family) {
                problems.push(format!("pool {name} {family}: total is stale"));
            }
            let open = state.pool.ranges.iter().enumerate().filter(|(_, r)| {
                r.family == family && family_state.used.lowest_free(r.first, r.last).is_some()
            });
            let open: BTreeSet<u32> = open.filter_map(|(i, _)| u32::try_from(i).ok()).collect();
            if open != family_state.open {
                problems.push(format!("pool {name} {family}: entries with room are stale"));
            }
            if let Some(key) = &state.auto {
                let booked = self
                    .auto
                    .open
                    .get(family.index())
                    .is_some_and(|set| set.contains(key));
                let both = state.is_open(Family::V4) && state.is_open(Family::V6);
                if self.auto.open_both.contains(key) != both {
                    problems.push(format!(
                        "pool {name}: automatic index of both families is stale"
                    ));
                }
                if booked != state.is_open(family) {
                    problems.push(format!("pool {name} {family}: automatic index is stale"));
                }
                let cilium = state.pool.kind == PoolKind::CiliumLoadBalancerIPPool
                    && state.has_family(family);
                let booked =
                    (self.auto.cilium.get(family.index())).is_some_and(|set| set.contains(key));
                if booked != cilium {
                    problems.push(format!("pool {name} {family}: Cilium index is stale"));
                }
            }
        }
    }
}

/// The first overlap of `pool` with a range already in `index` (whose pools
/// are in `pools`), as the rejection it causes, in O(entries × log(ranges)).
fn overlap_in_index(
    index: &BTreeMap<(Family, u128), (u128, Arc<str>)>,
    pools: &BTreeMap<Arc<str>, Box<PoolState>>,
    pool: &Pool,
) -> Option<Rejection> {
    for range in &pool.ranges {
        // Ranges in the index are disjoint: only the one starting last at or
        // before our last address can overlap us.
        let Some(((family, first), (last, other))) =
            index.range(..=(range.family, range.last)).next_back()
        else {
            continue;
        };
        if *family == range.family && *last >= range.first {
            let theirs = pools.get(other).and_then(|state| {
                let rank = state.family(*family).rank(*first)?;
                Some((
                    state.family(*family).entry(&state.pool, rank.0)?,
                    state.pool.kind,
                ))
            });
            let (theirs, other_kind) = theirs.unwrap_or((
                AddrRange {
                    family: *family,
                    first: *first,
                    last: *last,
                    reserve_ends: false,
                },
                PoolKind::IPAddressPool,
            ));
            let error = PoolError::Overlap {
                entry: range.to_string(),
                other_pool: other.to_string(),
                other_kind,
                other_entry: theirs.to_string(),
            };
            return Some(Rejection {
                reason: error.to_string(),
                blocker: Some(Arc::clone(other)),
                conflict: Some(Box::new(Conflict {
                    range: *range,
                    other_range: theirs,
                    other_pool: other.to_string(),
                    other_kind,
                })),
            });
        }
    }
    None
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    /// Every address in use costs an `addresses` entry: keep it small.
    #[test]
    fn an_address_entry_is_small() {
        assert_eq!(std::mem::size_of::<Holders>(), 16);
        assert_eq!(std::mem::size_of::<(IpAddr, Holders)>(), 40);
    }
}
