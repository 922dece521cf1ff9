//! The ranges of rejected pool objects, by first address: finding the
//! rejected pools a range overlaps (the overlap rule of docs/allocation.md
//! §3.1, at the cost of §4.9) looks at those near it, not at every
//! rejected pool.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::addr::Family;
use crate::pool::{AddrRange, PoolKind};

type FastHash = foldhash::fast::RandomState;

/// A rejected pool object: its kind and name.
type PoolKey = (PoolKind, Arc<str>);

/// Rejected ranges may overlap one another (each overlaps an accepted
/// pool, or a range of its own pool), so no order of first addresses
/// alone finds every range that reaches a point. Ranges are kept apart by
/// span class (the bit length of last − first): a search looks, in each
/// class present, from as far below as that class can reach, so one wide
/// range (a rejected `0.0.0.0/0`) does not make every search scan all.
#[derive(Debug, Default)]
pub(crate) struct RejectedRanges {
    /// (family, span class, first) → (last, pool) for each range.
    starts: BTreeMap<(Family, u8, u128), Vec<(u128, PoolKey)>>,
    /// How many ranges each (family, span class) holds.
    classes: BTreeMap<(Family, u8), u32>,
    /// The ranges each pool was added with, to take them out again.
    pools: HashMap<PoolKey, Box<[AddrRange]>, FastHash>,
}

impl RejectedRanges {
    /// Adds the rejected pool `name` of `kind` with its `ranges`, in place
    /// of those it had.
    pub(crate) fn insert(&mut self, kind: PoolKind, name: &str, ranges: &[AddrRange]) {
        self.remove(kind, name);
        if ranges.is_empty() {
            return;
        }
        let key: PoolKey = (kind, Arc::from(name));
        for range in ranges {
            self.starts
                .entry(start_key(range))
                .or_default()
                .push((range.last, key.clone()));
            *self.classes.entry(class_key(range)).or_insert(0) += 1;
        }
        self.pools.insert(key, ranges.into());
    }

    /// Takes out the pool `name` of `kind`, if present.
    pub(crate) fn remove(&mut self, kind: PoolKind, name: &str) {
        let Some(ranges) = self.pools.remove(&(kind, Arc::from(name))) else {
            return;
        };
        for range in ranges.iter() {
            let start = start_key(range);
            if let Some(here) = self.starts.get_mut(&start) {
                let at = here
                    .iter()
                    .position(|(last, (k, n))| *last == range.last && *k == kind && **n == *name);
                if let Some(at) = at {
                    here.swap_remove(at);
                }
                if here.is_empty() {
                    self.starts.remove(&start);
                }
            }
            if let Some(count) = self.classes.get_mut(&class_key(range)) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.classes.remove(&class_key(range));
                }
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }

    /// The rejected pools with a range overlapping `range`, a pool once
    /// per range of it that does; `visit` is called for each range looked
    /// at. Costs O(log ranges) per span class present, plus the ranges of
    /// each class that start within that class's reach below `range`.
    pub(crate) fn overlapping<'a>(
        &'a self,
        range: &AddrRange,
        visit: impl Fn() + 'a,
    ) -> impl Iterator<Item = (PoolKind, &'a str)> + 'a {
        let family = range.family;
        let (first, last) = (range.first, range.last);
        self.classes
            .range((family, 0)..=(family, u8::MAX))
            .flat_map(move |(&(_, class), _)| {
                let lowest = first.saturating_sub(widest_span(class));
                self.starts
                    .range((family, class, lowest)..=(family, class, last))
                    .flat_map(|(_, here)| here.iter())
            })
            .inspect(move |_| visit())
            .filter(move |(their_last, _)| *their_last >= first)
            .map(|(_, (kind, name))| (*kind, &**name))
    }
}

/// The span class of `range`: the bit length of last − first (0 for a
/// single address).
fn class_of(range: &AddrRange) -> u8 {
    let span = range.last.saturating_sub(range.first);
    u8::try_from(u128::BITS - span.leading_zeros()).unwrap_or(u8::MAX)
}

/// The widest last − first a range of span class `class` may have.
fn widest_span(class: u8) -> u128 {
    match class {
        0 => 0,
        c if u32::from(c) >= u128::BITS => u128::MAX,
        c => (1u128 << c) - 1,
    }
}

fn start_key(range: &AddrRange) -> (Family, u8, u128) {
    (range.family, class_of(range), range.first)
}

fn class_key(range: &AddrRange) -> (Family, u8) {
    (range.family, class_of(range))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first: u128, last: u128) -> AddrRange {
        AddrRange {
            family: Family::V4,
            first,
            last,
            reserve_ends: false,
        }
    }

    fn found(index: &RejectedRanges, first: u128, last: u128) -> Vec<String> {
        let mut names: Vec<String> = index
            .overlapping(&range(first, last), || ())
            .map(|(_, name)| name.to_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    #[test]
    fn finds_ranges_that_start_below_and_reach_in() {
        let mut index = RejectedRanges::default();
        let kind = PoolKind::IPAddressPool;
        index.insert(kind, "wide", &[range(0, 100)]);
        index.insert(kind, "small", &[range(50, 52)]);
        index.insert(kind, "two", &[range(10, 11), range(200, 210)]);
        assert_eq!(found(&index, 51, 51), ["small", "wide"]);
        assert_eq!(found(&index, 101, 199), Vec::<String>::new());
        assert_eq!(found(&index, 205, 300), ["two"]);
        assert_eq!(found(&index, 11, 11), ["two", "wide"]);
        index.remove(kind, "wide");
        assert_eq!(found(&index, 51, 51), ["small"]);
        // Spans 1, 2 and 10 are left: classes 1, 2 and 4.
        let classes: Vec<u8> = index.classes.keys().map(|(_, class)| *class).collect();
        assert_eq!(classes, [1, 2, 4]);
        // Added again with other ranges: the old ones go.
        index.insert(kind, "two", &[range(90, 95)]);
        assert_eq!(found(&index, 11, 11), Vec::<String>::new());
        assert_eq!(found(&index, 95, 95), ["two"]);
        // The other family is apart.
        let v6 = AddrRange {
            family: Family::V6,
            ..range(0, u128::MAX)
        };
        assert_eq!(index.overlapping(&v6, || ()).count(), 0);
    }

    #[test]
    fn a_search_looks_only_near_the_range() {
        let mut index = RejectedRanges::default();
        for p in 0..1000u128 {
            index.insert(
                PoolKind::IPAddressPool,
                &format!("p{p}"),
                &[range(4 * p, 4 * p + 3)],
            );
        }
        let looked = std::cell::Cell::new(0);
        let names: Vec<_> = index
            .overlapping(&range(2000, 2001), || looked.set(looked.get() + 1))
            .collect();
        assert_eq!(names, [(PoolKind::IPAddressPool, "p500")]);
        assert!(looked.get() <= 2, "{}", looked.get());
        // One rejected range over everything: found, and the search
        // still looks only near the range among the small ones.
        index.insert(PoolKind::IPAddressPool, "all", &[range(0, u128::MAX)]);
        looked.set(0);
        let mut names: Vec<_> = index
            .overlapping(&range(2000, 2001), || looked.set(looked.get() + 1))
            .map(|(_, name)| name)
            .collect();
        names.sort_unstable();
        assert_eq!(names, ["all", "p500"]);
        assert!(looked.get() <= 3, "{}", looked.get());
    }

    #[test]
    fn span_classes_reach_as_far_as_their_widest_range() {
        for (first, last) in [
            (7, 7),
            (0, 1),
            (4, 7),
            (8, 15),
            (0, u128::MAX),
            (5, 1 << 100),
        ] {
            let range = range(first, last);
            assert!(last - first <= widest_span(class_of(&range)));
        }
        assert_eq!(class_of(&range(0, u128::MAX)), 128);
    }
}
