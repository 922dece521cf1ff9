//! The allocator: accepted pools, who holds which address, and the rules of
//! DESIGN.md §4.4 for choosing and keeping addresses.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The hasher of the maps every allocation touches: SipHash's DoS resistance
/// buys nothing for keys the cluster's own objects make, and costs a tenth
/// of an allocation.
type FastHash = foldhash::fast::RandomState;
use std::net::IpAddr;
use std::sync::Arc;

use crate::addr::{from_int, to_int, Family};
use crate::count::AddressCount;
use crate::error::{AllocError, ShareConflict};
use crate::pool::{AddrRange, Pool, PoolError};
use crate::request::{FamilyPolicy, Port, Request};
use crate::spec::IPAddressPoolSpec;
use crate::used::UsedSet;

/// Addresses and pool of one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub pool: String,
    /// IPv4 first.
    pub ips: Vec<IpAddr>,
}

/// Usable and assigned addresses of one family in one pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FamilyStats {
    /// Usable addresses (after avoidBuggyIPs), up to 2^128.
    pub total: AddressCount,
    /// Addresses in use; a shared address counts once.
    pub assigned: u128,
}

/// Counters of one accepted pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolStats {
    pub name: String,
    pub ipv4: FamilyStats,
    pub ipv6: FamilyStats,
}

/// A pool object that is not accepted, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedPool {
    pub name: String,
    pub reason: String,
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
    /// Accepted pools the change left as they were (same definition, still
    /// accepted, holdings untouched), sorted.
    pub unchanged: Vec<String>,
}

/// A pool object as given.
#[derive(Debug)]
struct PoolObject {
    name: String,
    parsed: Result<Pool, PoolError>,
    /// `metadata.creationTimestamp` in nanoseconds since the epoch, if known.
    created: Option<i128>,
    /// Arrival order: the creation order of pools without a timestamp, and
    /// the tie-break of equal ones.
    seq: u64,
}

/// The sharing key and backend key of a Service that has a sharing key, in
/// one unambiguous string: the Services one address may stack.
type Group = Arc<str>;

/// The group of a Service with sharing key `sharing` (empty: none).
fn group_of(sharing: &str, backend: &str) -> Option<String> {
    (!sharing.is_empty()).then(|| format!("{}:{sharing}{backend}", sharing.len()))
}

/// The sharing key part of a group.
fn sharing_part(group: &str) -> &str {
    group
        .split_once(':')
        .and_then(|(len, rest)| rest.get(..len.parse::<usize>().ok()?))
        .unwrap_or_default()
}

/// Who holds one address: almost always one Service, so that one is kept
/// inline.
#[derive(Debug)]
enum Holders {
    One(Arc<str>),
    /// Boxed, so that `Holders` is as small as `One` (a shared address is
    /// rare; every address pays for the size). A `Box<[_]>` would be a
    /// wide pointer, and the enum 24 bytes again.
    #[allow(clippy::box_collection)]
    Many(Box<Vec<Arc<str>>>),
}

impl Holders {
    fn iter(&self) -> std::slice::Iter<'_, Arc<str>> {
        match self {
            Holders::One(holder) => std::slice::from_ref(holder).iter(),
            Holders::Many(holders) => holders.iter(),
        }
    }

    fn contains(&self, key: &str) -> bool {
        self.iter().any(|holder| &**holder == key)
    }

    fn add(&mut self, key: Arc<str>) {
        if self.contains(&key) {
            return;
        }
        // Sorted by key: the order does not depend on history (which a
        // refusal naming the first holder would show).
        match self {
            Holders::One(first) => {
                let mut both = vec![Arc::clone(first), key];
                both.sort();
                *self = Holders::Many(Box::new(both));
            }
            Holders::Many(holders) => {
                let at = holders.partition_point(|holder| *holder < key);
                holders.insert(at, key);
            }
        }
    }

    /// Removes `key`; false when nobody is left.
    fn remove(&mut self, key: &str) -> bool {
        match self {
            Holders::One(holder) => &**holder != key,
            Holders::Many(holders) => {
                holders.retain(|holder| &**holder != key);
                if let [only] = holders.as_slice() {
                    *self = Holders::One(Arc::clone(only));
                }
                !matches!(self, Holders::Many(h) if h.is_empty())
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Holders::One(_) => 1,
            Holders::Many(holders) => holders.len(),
        }
    }
}

/// An accepted pool and the addresses in use in it.
#[derive(Debug)]
struct PoolState {
    pool: Pool,
    name: Arc<str>,
    used: [UsedSet; 2],
    /// Addresses held by sharing services, by group, per family: where a
    /// Service with a sharing key may stack.
    shared: [HashMap<Group, BTreeSet<u128>>; 2],
    totals: [AddressCount; 2],
}

impl PoolState {
    fn new(pool: Pool) -> Self {
        let used = [
            UsedSet::new(pool.usable(Family::V4)),
            UsedSet::new(pool.usable(Family::V6)),
        ];
        let totals = [pool.total(Family::V4), pool.total(Family::V6)];
        let name = Arc::from(pool.name.as_str());
        Self {
            pool,
            name,
            used,
            shared: [HashMap::new(), HashMap::new()],
            totals,
        }
    }

    fn used(&self, family: Family) -> &UsedSet {
        match family {
            Family::V4 => &self.used[0],
            Family::V6 => &self.used[1],
        }
    }

    fn used_mut(&mut self, family: Family) -> &mut UsedSet {
        match family {
            Family::V4 => &mut self.used[0],
            Family::V6 => &mut self.used[1],
        }
    }

    fn shared(&self, family: Family) -> &HashMap<Group, BTreeSet<u128>> {
        match family {
            Family::V4 => &self.shared[0],
            Family::V6 => &self.shared[1],
        }
    }

    fn shared_mut(&mut self, family: Family) -> &mut HashMap<Group, BTreeSet<u128>> {
        match family {
            Family::V4 => &mut self.shared[0],
            Family::V6 => &mut self.shared[1],
        }
    }

    fn has_family(&self, family: Family) -> bool {
        self.pool.ranges.iter().any(|r| r.family == family)
    }
}

/// What one Service holds. Kept small: this and its entry in
/// `Allocator::addresses` are the allocator's memory per address.
#[derive(Debug)]
struct Held {
    pool: Arc<str>,
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
}

impl Held {
    fn group(&self) -> Option<&str> {
        self.sharing.as_deref().map(|s| &*s.group)
    }

    fn ports(&self) -> &[Port] {
        self.sharing.as_deref().map_or(&[], |s| &s.ports)
    }
}

/// Pools, holdings and the allocation rules. Plain data: no I/O, no async,
/// deterministic, and every method is total (no panic on any input).
#[derive(Debug, Default)]
pub struct Allocator {
    /// Every pool object, in creation order (see [`PoolObject::created`]).
    objects: Vec<PoolObject>,
    next_seq: u64,
    /// Accepted pools by name.
    pools: BTreeMap<Arc<str>, PoolState>,
    /// Rejected pools by name, with the reason.
    rejected: BTreeMap<String, String>,
    /// Accepted pools' ranges: (family, first) → (last, pool), for locating
    /// an address in O(log pools).
    index: BTreeMap<(Family, u128), (u128, Arc<str>)>,
    /// Pools for automatic allocation in §4.4 step 4 order (pinned by
    /// priority then name, then the others by name); autoAssign only.
    auto_order: Vec<Arc<str>>,
    services: HashMap<Arc<str>, Held, FastHash>,
    addresses: HashMap<IpAddr, Holders, FastHash>,
    /// Tests: place every holding again on every pool change, as before
    /// unchanged pools kept theirs, to compare the two.
    #[cfg(test)]
    pub(crate) rebuild_all: bool,
}

impl Allocator {
    /// An allocator without pools.
    pub fn new() -> Self {
        Self::default()
    }

    // ----- pools -----

    /// Adds or replaces the pool `name` (a replaced pool keeps its creation
    /// position) and recomputes which pools are accepted.
    pub fn set_pool(&mut self, name: &str, spec: &IPAddressPoolSpec) -> PoolChange {
        self.set_pool_created(name, spec, None)
    }

    /// [`Allocator::set_pool`] for a pool whose `metadata.creationTimestamp`
    /// (nanoseconds since the epoch) is known: pools are ordered by it (so the older of two overlapping
    /// pools stays whatever order a host lists them in), pools without one
    /// after those with one, in arrival order.
    pub fn set_pool_created(
        &mut self,
        name: &str,
        spec: &IPAddressPoolSpec,
        created: Option<i128>,
    ) -> PoolChange {
        let parsed = Pool::parse(name, spec);
        match self.objects.iter_mut().find(|object| object.name == name) {
            Some(object) => {
                object.parsed = parsed;
                if created.is_some() {
                    object.created = created;
                }
            }
            None => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.objects.push(PoolObject {
                    name: name.to_owned(),
                    parsed,
                    created,
                    seq,
                });
            }
        }
        self.objects.sort_by(|a, b| {
            (a.created.is_none(), &a.created, a.seq).cmp(&(b.created.is_none(), &b.created, b.seq))
        });
        self.recompute_pools()
    }

    /// Removes the pool `name`, if present, and recomputes acceptance: a pool
    /// it overlapped may now be accepted.
    pub fn remove_pool(&mut self, name: &str) -> PoolChange {
        let before = self.objects.len();
        self.objects.retain(|object| object.name != name);
        if self.objects.len() == before {
            return PoolChange::default();
        }
        self.recompute_pools()
    }

    /// Every accepted pool's counters, sorted by name.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.pools
            .values()
            .map(|state| PoolStats {
                name: state.pool.name.clone(),
                ipv4: FamilyStats {
                    total: state.totals[0],
                    assigned: state.used[0].len(),
                },
                ipv6: FamilyStats {
                    total: state.totals[1],
                    assigned: state.used[1].len(),
                },
            })
            .collect()
    }

    /// Every rejected pool with its reason, sorted by name.
    pub fn rejected_pools(&self) -> Vec<RejectedPool> {
        self.rejected
            .iter()
            .map(|(name, reason)| RejectedPool {
                name: name.clone(),
                reason: reason.clone(),
            })
            .collect()
    }

    /// The accepted pool `name`.
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.get(name).map(|state| &state.pool)
    }

    /// Recomputes acceptance in creation order (each pool against those
    /// accepted before it), rebuilds the per-pool state from the holdings and
    /// releases holdings no accepted pool allows any more.
    fn recompute_pools(&mut self) -> PoolChange {
        // A pool accepted before and after, with the same definition, keeps
        // its state (used addresses, sharing index) and its holdings as
        // they are: its ranges are still its own (an overlapping pool is
        // rejected, or it would not be accepted). Only the holdings of the
        // other pools are placed again.
        let mut old_pools = std::mem::take(&mut self.pools);
        #[cfg(test)]
        if self.rebuild_all {
            old_pools.clear();
        }
        let mut kept = BTreeSet::new();
        let mut pools = BTreeMap::new();
        let mut rejected = BTreeMap::new();
        let mut index: BTreeMap<(Family, u128), (u128, Arc<str>)> = BTreeMap::new();
        for object in &self.objects {
            let pool = match &object.parsed {
                Ok(pool) => pool,
                Err(error) => {
                    rejected.insert(object.name.clone(), error.to_string());
                    continue;
                }
            };
            if let Some(error) = overlap_in_index(&index, pool) {
                rejected.insert(object.name.clone(), error.to_string());
                continue;
            }
            let state = match old_pools.remove(object.name.as_str()) {
                Some(old) if old.pool == *pool => {
                    kept.insert(Arc::clone(&old.name));
                    old
                }
                _ => PoolState::new(pool.clone()),
            };
            for range in &state.pool.ranges {
                index.insert(
                    (range.family, range.first),
                    (range.last, Arc::clone(&state.name)),
                );
            }
            pools.insert(Arc::clone(&state.name), state);
        }
        self.pools = pools;
        self.rejected = rejected;
        self.index = index;
        self.auto_order = auto_order(&self.pools);
        self.rehome_holdings(&kept)
    }

    /// Places again every holding outside the `kept` pools: in the pool that
    /// now contains its addresses, or nowhere (released).
    fn rehome_holdings(&mut self, kept: &BTreeSet<Arc<str>>) -> PoolChange {
        let moving: Vec<Arc<str>> = self
            .services
            .iter()
            .filter(|(_, held)| !kept.contains(&held.pool))
            .map(|(key, _)| Arc::clone(key))
            .collect();
        let mut services: Vec<(Arc<str>, Held)> = Vec::with_capacity(moving.len());
        for key in moving {
            if let Some(entry) = self.services.remove_entry(&key) {
                // All holders of an address are in its one pool: they all
                // move, and the entry goes.
                for ip in entry.1.ips.iter() {
                    self.addresses.remove(ip);
                }
                services.push(entry);
            }
        }
        // In key order, so holders are listed the same way in every run.
        services.sort_by(|a, b| a.0.cmp(&b.0));
        let mut released = Vec::new();
        for (key, mut held) in services {
            match self.pool_of_all(&held.ips) {
                Ok(pool) => {
                    held.pool = pool;
                    self.insert_held(key, held);
                }
                Err(error) => released.push(Released {
                    key: key.to_string(),
                    ips: held.ips.into_vec(),
                    reason: error.to_string(),
                }),
            }
        }
        released.sort_by(|a, b| a.key.cmp(&b.key));
        PoolChange {
            released,
            unchanged: kept.iter().map(|name| name.to_string()).collect(),
        }
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
        Ok(state)
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
        self.services.get(key).map(|held| Holding {
            pool: held.pool.to_string(),
            ips: held.ips.to_vec(),
        })
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
            .map(|(key, held)| {
                (
                    key.to_string(),
                    Holding {
                        pool: held.pool.to_string(),
                        ips: held.ips.to_vec(),
                    },
                )
            })
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

    /// The Services holding `ip`, sorted.
    pub fn holders(&self, ip: IpAddr) -> Vec<String> {
        let mut holders: Vec<String> = self
            .addresses
            .get(&ip)
            .map(|holders| holders.iter().map(|h| h.to_string()).collect())
            .unwrap_or_default();
        holders.sort();
        holders
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
        let (key, held) = self.services.remove_entry(key)?;
        for &ip in held.ips.iter() {
            let Some(holders) = self.addresses.get_mut(&ip) else {
                continue;
            };
            if holders.remove(&key) {
                continue;
            }
            self.addresses.remove(&ip);
            let (family, value) = to_int(ip);
            if let Some(state) = self.pools.get_mut(&held.pool) {
                state.used_mut(family).remove(value);
                if let Some(sharing) = &held.sharing {
                    remove_shared(state, family, &sharing.group, value);
                }
            }
        }
        Some(Holding {
            pool: held.pool.to_string(),
            ips: held.ips.into_vec(),
        })
    }

    fn insert_held(&mut self, key: Arc<str>, held: Held) {
        for &ip in held.ips.iter() {
            match self.addresses.get_mut(&ip) {
                Some(holders) => holders.add(Arc::clone(&key)),
                None => {
                    self.addresses.insert(ip, Holders::One(Arc::clone(&key)));
                    let (family, value) = to_int(ip);
                    if let Some(state) = self.pools.get_mut(&held.pool) {
                        state.used_mut(family).insert(value);
                        if let Some(sharing) = &held.sharing {
                            state
                                .shared_mut(family)
                                .entry(Arc::clone(&sharing.group))
                                .or_default()
                                .insert(value);
                        }
                    }
                }
            }
        }
        self.services.insert(key, held);
    }

    fn hold(&mut self, request: &Request<'_>, pool: Arc<str>, mut ips: Vec<IpAddr>) -> Holding {
        ips.sort_by_key(|ip| ip.is_ipv6());
        let group = group_of(request.sharing_key, request.backend_key);
        let ports: &[Port] = if group.is_some() { request.ports } else { &[] };
        let holding = Holding {
            pool: pool.to_string(),
            ips: ips.clone(),
        };
        // Keeping what is held already (every reconciliation of a settled
        // Service) changes nothing.
        if let Some(held) = self.services.get(request.key) {
            if held.pool == pool
                && *held.ips == *ips
                && held.group() == group.as_deref()
                && held.ports() == ports
            {
                return holding;
            }
        }
        self.release(request.key);
        let held = Held {
            pool,
            ips: ips.into_boxed_slice(),
            sharing: group.map(|group| {
                Box::new(Sharing {
                    group: Arc::from(group),
                    ports: ports.into(),
                })
            }),
        };
        self.insert_held(Arc::from(request.key), held);
        holding
    }

    // ----- the rules -----

    /// Whether `ip` may be given to `request` (whose group is `group`), the
    /// Service's own holding aside: free, or every other holder shares it
    /// under §4.4.
    fn fits(
        &self,
        ip: IpAddr,
        request: &Request<'_>,
        group: Option<&str>,
    ) -> Result<(), ShareConflict> {
        let Some(holders) = self.addresses.get(&ip) else {
            return Ok(());
        };
        for holder in holders.iter().filter(|h| ***h != *request.key) {
            let Some(held) = self.services.get(holder) else {
                continue;
            };
            let holder = holder.to_string();
            let (Some(theirs), Some(ours)) = (held.group(), group) else {
                return Err(ShareConflict::InUse { holder });
            };
            if theirs != ours {
                return Err(if sharing_part(theirs) != request.sharing_key {
                    ShareConflict::OtherKey { holder }
                } else {
                    ShareConflict::OtherBackend { holder }
                });
            }
            if let Some(port) = held.ports().iter().find(|p| request.ports.contains(p)) {
                return Err(ShareConflict::Port {
                    holder,
                    port: port.clone(),
                });
            }
        }
        Ok(())
    }

    /// Checks `ips` against every rule for `request`: families, one pool
    /// that serves it (autoAssign aside) and allows them, sharing, and the
    /// requested addresses and pool. `partial` accepts one address of a
    /// PreferDualStack Service (a held address; requests need both).
    fn check(
        &self,
        request: &Request<'_>,
        ips: &[IpAddr],
        partial: bool,
    ) -> Result<Arc<str>, AllocError> {
        if !request.families.accepts(ips, partial) {
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
        let pool = self.pool_of_all(ips)?;
        if let Some(requested) = request.pool {
            if *pool != *requested {
                let ip = ips.first().copied().unwrap_or(IpAddr::from([0, 0, 0, 0]));
                return Err(AllocError::NotInRequestedPool {
                    ip,
                    pool: pool.to_string(),
                    requested: requested.to_owned(),
                });
            }
        }
        let serves = self
            .pools
            .get(&pool)
            .is_some_and(|s| s.pool.serves(&request.subject));
        if !serves {
            return Err(AllocError::PoolDoesNotServe {
                pool: pool.to_string(),
            });
        }
        let group = group_of(request.sharing_key, request.backend_key);
        for &ip in ips {
            self.fits(ip, request, group.as_deref())
                .map_err(|conflict| AllocError::Taken { ip, conflict })?;
        }
        Ok(pool)
    }

    /// Keeps `ips` (a Service's status addresses) for `request` if they are
    /// still allowed (§4.4 step 1): the Service then holds exactly them.
    /// Otherwise nothing changes and the error says why.
    pub fn keep(&mut self, request: &Request<'_>, ips: &[IpAddr]) -> Result<Holding, AllocError> {
        let pool = self.check(request, ips, true)?;
        Ok(self.hold(request, pool, ips.to_vec()))
    }

    /// Whether `keep` would succeed, without changing anything.
    pub fn can_keep(&self, request: &Request<'_>, ips: &[IpAddr]) -> Result<(), AllocError> {
        self.check(request, ips, true).map(|_| ())
    }

    /// Gives `request` new addresses (§4.4 steps 2–4), releasing whatever it
    /// held. On error the Service holds nothing.
    pub fn allocate(&mut self, request: &Request<'_>) -> Result<Holding, AllocError> {
        self.release(request.key);
        if !request.addresses.is_empty() {
            let pool = self.check(request, request.addresses, false)?;
            return Ok(self.hold(request, pool, request.addresses.to_vec()));
        }
        let candidates: Vec<Arc<str>> = match request.pool {
            Some(name) => {
                let state = self
                    .pools
                    .get(name)
                    .ok_or_else(|| AllocError::UnknownPool {
                        pool: name.to_owned(),
                    })?;
                if !state.pool.serves(&request.subject) {
                    return Err(AllocError::PoolDoesNotServe {
                        pool: name.to_owned(),
                    });
                }
                vec![Arc::clone(&state.name)]
            }
            None => {
                let serving: Vec<Arc<str>> = self
                    .auto_order
                    .iter()
                    .filter(|name| {
                        self.pools
                            .get(*name)
                            .is_some_and(|s| s.pool.serves(&request.subject))
                    })
                    .cloned()
                    .collect();
                if serving.is_empty() {
                    return Err(AllocError::NoPool);
                }
                serving
            }
        };
        let (pool, ips) = self.choose(request, &candidates)?;
        Ok(self.hold(request, pool, ips))
    }

    /// For a PreferDualStack Service holding one address: adds the missing
    /// family from the same pool if one fits. Returns the new holding when
    /// an address was added.
    pub fn complete_dual_stack(&mut self, request: &Request<'_>) -> Option<Holding> {
        if !matches!(request.families, FamilyPolicy::PreferDual { .. }) {
            return None;
        }
        let held = self.services.get(request.key)?;
        // The held address must still be allowed for this request.
        self.check(request, &held.ips, true).ok()?;
        let [ip] = *held.ips else {
            return None;
        };
        let missing = Family::of(ip).other();
        let state = self.pools.get(&held.pool)?;
        let value = self.lowest_fit(state, missing, request)?;
        let ips = vec![ip, from_int(missing, value)];
        let pool = Arc::clone(&state.name);
        Some(self.hold(request, pool, ips))
    }

    /// The first candidate pool (in order) that satisfies the family rule of
    /// §4.3, with its addresses.
    fn choose(
        &self,
        request: &Request<'_>,
        candidates: &[Arc<str>],
    ) -> Result<(Arc<str>, Vec<IpAddr>), AllocError> {
        let passes: &[&[Family]] = match request.families {
            FamilyPolicy::Single(Family::V4) => &[&[Family::V4]],
            FamilyPolicy::Single(Family::V6) => &[&[Family::V6]],
            FamilyPolicy::RequireDual => &[&[Family::V4, Family::V6]],
            FamilyPolicy::PreferDual {
                primary: Family::V4,
            } => &[&[Family::V4, Family::V6], &[Family::V4], &[Family::V6]],
            FamilyPolicy::PreferDual {
                primary: Family::V6,
            } => &[&[Family::V4, Family::V6], &[Family::V6], &[Family::V4]],
        };
        for families in passes {
            for name in candidates {
                let Some(state) = self.pools.get(name) else {
                    continue;
                };
                let ips: Option<Vec<IpAddr>> = families
                    .iter()
                    .map(|&family| {
                        self.lowest_fit(state, family, request)
                            .map(|v| from_int(family, v))
                    })
                    .collect();
                if let Some(ips) = ips {
                    return Ok((Arc::clone(name), ips));
                }
            }
        }
        if let [only] = candidates {
            let state = self.pools.get(only);
            let missing = match request.families {
                FamilyPolicy::Single(family) => Some(family),
                FamilyPolicy::RequireDual => [Family::V4, Family::V6]
                    .into_iter()
                    .find(|f| state.is_some_and(|s| !s.has_family(*f))),
                FamilyPolicy::PreferDual { .. } => None,
            };
            if let Some(family) = missing.filter(|f| state.is_some_and(|s| !s.has_family(*f))) {
                return Err(AllocError::NoFamilyInPool {
                    pool: only.to_string(),
                    family,
                });
            }
        }
        let needed = match request.families {
            FamilyPolicy::Single(family) => format!("an {family} address"),
            FamilyPolicy::RequireDual => "both an IPv4 and an IPv6 address".to_owned(),
            FamilyPolicy::PreferDual { .. } => "an IPv4 or IPv6 address".to_owned(),
        };
        Err(AllocError::NoAvailable {
            needed,
            pools: candidates.iter().map(|name| name.to_string()).collect(),
        })
    }

    /// The lowest address of `family` in `state` that fits `request`:
    /// entries in `spec.addresses` order, each from its lowest address up.
    /// O(log n) for a free address; a sharing Service also looks at the
    /// addresses of its own group.
    fn lowest_fit(&self, state: &PoolState, family: Family, request: &Request<'_>) -> Option<u128> {
        let group = group_of(request.sharing_key, request.backend_key);
        let group_addresses = group.as_deref().and_then(|g| state.shared(family).get(g));
        for range in state.pool.ranges.iter().filter(|r| r.family == family) {
            let free = state.used(family).lowest_free(range.first, range.last);
            let shared = group_addresses.and_then(|addresses| {
                addresses
                    .range(range.first..=free.unwrap_or(range.last))
                    .copied()
                    .find(|&value| {
                        self.fits(from_int(family, value), request, group.as_deref())
                            .is_ok()
                    })
            });
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

    /// Checks the allocator's own invariants (DESIGN.md §6): no address held
    /// by two Services unless they share it under §4.4, every held address
    /// inside an accepted pool that allows it, and counters equal to a
    /// recount. Returns every violation found.
    pub fn check_invariants(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let mut recount: BTreeMap<(&str, Family), u128> = BTreeMap::new();
        for (ip, holders) in &self.addresses {
            let helds: Vec<(&Arc<str>, Option<&Held>)> =
                holders.iter().map(|h| (h, self.services.get(h))).collect();
            let Some((_, Some(first))) = helds.first() else {
                problems.push(format!("{ip} is recorded with no holder that exists"));
                continue;
            };
            match self.locate(*ip) {
                Ok(state) if state.name == first.pool => {}
                Ok(state) => problems.push(format!(
                    "{ip} is held from pool {} but lies in {}",
                    first.pool, state.name
                )),
                Err(error) => problems.push(format!("{ip} is held but {error}")),
            }
            *recount.entry((&*first.pool, Family::of(*ip))).or_default() += 1;
            let mut seen: BTreeSet<&Port> = BTreeSet::new();
            for (holder, held) in &helds {
                let Some(held) = held else {
                    problems.push(format!(
                        "{ip} lists {holder} as holder but {holder} holds nothing"
                    ));
                    continue;
                };
                if !held.ips.contains(ip) || held.pool != first.pool {
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
                    for port in held.ports() {
                        if !seen.insert(port) {
                            problems.push(format!("{ip}: port {port} is used twice"));
                        }
                    }
                }
            }
        }
        for (key, held) in &self.services {
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
        for (name, state) in &self.pools {
            for family in [Family::V4, Family::V6] {
                let counted = recount.get(&(&**name, family)).copied().unwrap_or(0);
                if state.used(family).len() != counted {
                    problems.push(format!(
                        "pool {name} {family}: counter {} but {counted} addresses held",
                        state.used(family).len()
                    ));
                }
                if state.totals.get(family.index()) != Some(&state.pool.total(family)) {
                    problems.push(format!("pool {name} {family}: total is stale"));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

fn remove_shared(state: &mut PoolState, family: Family, group: &Group, value: u128) {
    let shared = state.shared_mut(family);
    if let Some(addresses) = shared.get_mut(group) {
        addresses.remove(&value);
        if addresses.is_empty() {
            shared.remove(group);
        }
    }
}

/// The first overlap of `pool` with a range already in `index`, in
/// O(entries × log(ranges)).
fn overlap_in_index(
    index: &BTreeMap<(Family, u128), (u128, Arc<str>)>,
    pool: &Pool,
) -> Option<PoolError> {
    for range in &pool.ranges {
        // Ranges in the index are disjoint: only the one starting last at or
        // before our last address can overlap us.
        let Some(((family, first), (last, other))) =
            index.range(..=(range.family, range.last)).next_back()
        else {
            continue;
        };
        if *family == range.family && *last >= range.first {
            let theirs = AddrRange {
                family: *family,
                first: *first,
                last: *last,
            };
            return Some(PoolError::Overlap {
                entry: range.to_string(),
                other_pool: other.to_string(),
                other_entry: theirs.to_string(),
            });
        }
    }
    None
}

fn auto_order(pools: &BTreeMap<Arc<str>, PoolState>) -> Vec<Arc<str>> {
    let mut pinned: Vec<&PoolState> = pools
        .values()
        .filter(|s| s.pool.auto_assign && s.pool.is_pinned())
        .collect();
    pinned.sort_by(|a, b| {
        a.pool
            .priority_rank()
            .cmp(&b.pool.priority_rank())
            .then_with(|| a.name.cmp(&b.name))
    });
    let unpinned = pools
        .values()
        .filter(|s| s.pool.auto_assign && !s.pool.is_pinned());
    pinned
        .into_iter()
        .chain(unpinned)
        .map(|s| Arc::clone(&s.name))
        .collect()
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
