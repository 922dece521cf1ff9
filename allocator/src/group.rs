//! Where a sharing group may stack: the addresses one group (sharing key
//! and backend key) holds in one pool and family, and for each port the
//! runs of those addresses that already have it, so that "the first address
//! of the group, in search order, that has none of these ports" is a few
//! lookups, however many addresses the group holds and however many of them
//! are blocked (docs/allocation.md §4.4 and §4.9).
//!
//! Addresses are ordered by [`Rank`]: the position of their entry in
//! `spec.addresses`, then the address. A run of a port is a maximal stretch
//! of the group's addresses, consecutive in that order, that all have the
//! port; so the member after a run never has it, and skipping a port costs
//! one lookup whatever the length of the run.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

use crate::request::Port;
use crate::small_map::SmallMap;

/// An address's place in the search order: its entry's index in
/// `spec.addresses`, then the address.
pub(crate) type Rank = (u32, u128);

/// The hasher of the per-port maps (ports come from the cluster's objects).
type FastHash = foldhash::fast::RandomState;

#[derive(Debug, Default)]
pub(crate) struct GroupIndex {
    /// The group's addresses, with how many of their holders have each port
    /// (one, unless the allocator is handed an inconsistent holding).
    members: BTreeMap<Rank, SmallMap<Port, u32>>,
    /// Per port: start → end of each run of members that have it.
    runs: HashMap<Port, SmallMap<Rank, Rank>, FastHash>,
}

impl<K: Ord + Clone> SmallMap<K, u32> {
    /// Counts one more of `key`; the new count.
    fn add_one(&mut self, key: K) -> u32 {
        if let Some(count) = self.get_mut(&key) {
            *count = count.saturating_add(1);
            return *count;
        }
        self.insert(key, 1);
        1
    }
}

impl GroupIndex {
    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    fn before(&self, rank: Rank) -> Option<Rank> {
        self.members.range(..rank).next_back().map(|(r, _)| *r)
    }

    fn after(&self, rank: Rank) -> Option<Rank> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.members
            .range((Excluded(rank), Unbounded))
            .next()
            .map(|(r, _)| *r)
    }

    /// Adds an address the group now holds, with no ports yet: runs that
    /// spanned its place are split there.
    pub(crate) fn join(&mut self, rank: Rank) {
        if self.members.contains_key(&rank) {
            return;
        }
        if let (Some(before), Some(after)) = (self.before(rank), self.after(rank)) {
            for port in self.common_ports(before, after) {
                let Some(runs) = self.runs.get_mut(&port) else {
                    continue;
                };
                if let Some((&start, &end)) = runs.last_at_or_below(&before) {
                    if end >= after {
                        runs.insert(start, before);
                        runs.insert(after, end);
                    }
                }
            }
        }
        self.members.insert(rank, SmallMap::Empty);
    }

    /// Removes an address the group no longer holds: its ports go first,
    /// and the runs on either side of it join.
    pub(crate) fn leave(&mut self, rank: Rank) {
        let Some(ports) = self.members.get(&rank) else {
            return;
        };
        let ports: Vec<Port> = ports.keys().cloned().collect();
        for port in ports {
            self.remove_port_fully(rank, &port);
        }
        self.members.remove(&rank);
        if let (Some(before), Some(after)) = (self.before(rank), self.after(rank)) {
            for port in self.common_ports(before, after) {
                let Some(runs) = self.runs.get_mut(&port) else {
                    continue;
                };
                if let Some(end) = runs.remove(&after) {
                    if let Some((_, left_end)) = runs.last_at_or_below_mut(&before) {
                        if *left_end == before {
                            *left_end = end;
                            continue;
                        }
                    }
                    runs.insert(after, end);
                }
            }
        }
    }

    /// The ports both members have: the runs that may span between them.
    fn common_ports(&self, a: Rank, b: Rank) -> Vec<Port> {
        let (Some(a), Some(b)) = (self.members.get(&a), self.members.get(&b)) else {
            return Vec::new();
        };
        let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
        small
            .keys()
            .filter(|port| large.contains_key(*port))
            .cloned()
            .collect()
    }

    /// One more holder of the member `rank` has `port`.
    pub(crate) fn add_port(&mut self, rank: Rank, port: &Port) {
        let Some(ports) = self.members.get_mut(&rank) else {
            return;
        };
        if ports.add_one(port.clone()) > 1 {
            return;
        }
        let before = self.before(rank);
        let after = self.after(rank);
        let runs = self.runs.entry(port.clone()).or_default();
        let mut start = rank;
        let mut end = rank;
        if let Some(before) = before {
            if let Some((&left_start, &left_end)) = runs.last_at_or_below(&before) {
                if left_end == before {
                    runs.remove(&left_start);
                    start = left_start;
                }
            }
        }
        if let Some(after) = after {
            if let Some(right_end) = runs.remove(&after) {
                end = right_end;
            }
        }
        runs.insert(start, end);
    }

    /// One holder of the member `rank` with `port` is gone.
    pub(crate) fn remove_port(&mut self, rank: Rank, port: &Port) {
        let Some(ports) = self.members.get_mut(&rank) else {
            return;
        };
        let Some(count) = ports.get_mut(port) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            self.remove_port_fully(rank, port);
        }
    }

    /// The member `rank` no longer has `port` at all: its run splits there.
    fn remove_port_fully(&mut self, rank: Rank, port: &Port) {
        if let Some(ports) = self.members.get_mut(&rank) {
            ports.remove(port);
        }
        let before = self.before(rank);
        let after = self.after(rank);
        let Entry::Occupied(mut entry) = self.runs.entry(port.clone()) else {
            return;
        };
        let runs = entry.get_mut();
        if let Some((&start, &end)) = runs.last_at_or_below(&rank) {
            if end >= rank {
                runs.remove(&start);
                if let Some(before) = before.filter(|b| start < rank && *b >= start) {
                    runs.insert(start, before);
                }
                if let Some(after) = after.filter(|a| rank < end && *a <= end) {
                    runs.insert(after, end);
                }
            }
        }
        if runs.is_empty() {
            entry.remove();
        }
    }

    /// The first member at or after `from` and before `until` that has none
    /// of `ports`, and the number of steps taken (each skips a whole run).
    pub(crate) fn first_without(
        &self,
        ports: &[Port],
        from: Rank,
        until: Rank,
    ) -> (Option<Rank>, u64) {
        let mut steps = 0;
        if from >= until {
            return (None, 1);
        }
        let Some((&first, _)) = self.members.range(from..until).next() else {
            return (None, 1);
        };
        let mut candidate = first;
        loop {
            let mut moved = false;
            for port in ports {
                steps += 1;
                let Some(runs) = self.runs.get(port) else {
                    continue;
                };
                let Some((_, &end)) = runs.last_at_or_below(&candidate) else {
                    continue;
                };
                if end < candidate {
                    continue;
                }
                match self.after(end) {
                    Some(next) if next < until => {
                        candidate = next;
                        moved = true;
                    }
                    _ => return (None, steps),
                }
            }
            if !moved {
                return (Some(candidate), steps);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Protocol;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn port(n: i32) -> Port {
        Port {
            protocol: Protocol::Tcp,
            port: n,
        }
    }

    #[test]
    fn skips_a_long_run_in_one_step() {
        let mut group = GroupIndex::default();
        for value in 0..1000 {
            group.join((0, value));
            group.add_port((0, value), &port(80));
        }
        let (found, steps) = group.first_without(&[port(80)], (0, 0), (1, 0));
        assert_eq!(found, None);
        assert_eq!(steps, 1);
        group.remove_port((0, 500), &port(80));
        let (found, steps) = group.first_without(&[port(80)], (0, 0), (1, 0));
        assert_eq!(found, Some((0, 500)));
        assert!(steps <= 2);
        assert_eq!(
            group.first_without(&[port(81)], (0, 3), (1, 0)).0,
            Some((0, 3))
        );
    }

    proptest! {
        /// The small map behaves as a `BTreeMap` through any sequence of
        /// inserts, removals and counts.
        #[test]
        fn small_map_matches_a_btree_map(ops in prop::collection::vec((0u8..3, 0u8..6), 0..60)) {
            let mut small: SmallMap<u8, u32> = SmallMap::default();
            let mut model: BTreeMap<u8, u32> = BTreeMap::new();
            for (op, key) in ops {
                match op {
                    0 => {
                        small.insert(key, u32::from(key) * 7);
                        model.insert(key, u32::from(key) * 7);
                    }
                    1 => prop_assert_eq!(small.remove(&key), model.remove(&key)),
                    _ => {
                        let count = model.entry(key).or_insert(0);
                        *count += 1;
                        prop_assert_eq!(small.add_one(key), *count);
                    }
                }
                prop_assert_eq!(small.len(), model.len());
                prop_assert_eq!(small.keys().copied().collect::<Vec<_>>(),
                                model.keys().copied().collect::<Vec<_>>());
                for probe in 0u8..7 {
                    prop_assert_eq!(small.last_at_or_below(&probe),
                                    model.range(..=probe).next_back());
                    prop_assert_eq!(small.contains_key(&probe), model.contains_key(&probe));
                }
            }
        }

        /// The index answers as a scan of the members would, after any
        /// sequence of joins, leaves and port changes.
        #[test]
        fn matches_a_scan(ops in prop::collection::vec((0u8..4, 0u128..24, 0i32..4), 0..120),
                          query in prop::collection::vec(0i32..4, 0..3),
                          from in 0u128..24, until in 0u128..26) {
            let mut group = GroupIndex::default();
            let mut model: BTreeMap<u128, BTreeSet<i32>> = BTreeMap::new();
            for (op, value, p) in ops {
                let rank = ((value % 3) as u32, value);
                match op {
                    0 => { group.join(rank); model.entry(value).or_default(); }
                    1 => {
                        if model.remove(&value).is_some() {
                            group.leave(rank);
                        }
                    }
                    2 => {
                        if let Some(ports) = model.get_mut(&value) {
                            if ports.insert(p) {
                                group.add_port(rank, &port(p));
                            }
                        }
                    }
                    _ => {
                        if let Some(ports) = model.get_mut(&value) {
                            if ports.remove(&p) {
                                group.remove_port(rank, &port(p));
                            }
                        }
                    }
                }
            }
            let ports: Vec<Port> = query.iter().map(|p| port(*p)).collect();
            let from = ((from % 3) as u32, from);
            let until = ((until % 3) as u32, until);
            let expected = model
                .iter()
                .map(|(v, ports)| (((v % 3) as u32, *v), ports))
                .filter(|(rank, ports)| *rank >= from && *rank < until
                        && query.iter().all(|p| !ports.contains(p)))
                .map(|(rank, _)| rank)
                .min();
            prop_assert_eq!(group.first_without(&ports, from, until).0, expected);
            prop_assert_eq!(group.is_empty(), model.is_empty());
        }
    }
}
