//! The addresses in use in one pool and family, as coalesced intervals, so
//! that the lowest free address is found in O(log n) whatever the pool size,
//! and memory grows with the runs of addresses in use, never with the pool.
//!
//! Two intervals merge when only unusable addresses (avoidBuggyIPs) lie
//! between them; an interval may therefore contain unusable addresses, which
//! are never held. So the first usable address after an interval is always
//! free, which is what makes [`UsedSet::lowest_free`] a single lookup.

use std::collections::BTreeMap;

use crate::addr::Usable;

#[derive(Clone, Debug)]
pub(crate) struct UsedSet {
    usable: Usable,
    /// start → end (inclusive) of each run of used addresses.
    runs: BTreeMap<u128, u128>,
    len: u128,
}

impl UsedSet {
    pub(crate) fn new(usable: Usable) -> Self {
        Self {
            usable,
            runs: BTreeMap::new(),
            len: 0,
        }
    }

    /// How many addresses are in use.
    pub(crate) fn len(&self) -> u128 {
        self.len
    }

    /// The run containing `value`, if any.
    fn run_containing(&self, value: u128) -> Option<(u128, u128)> {
        let (&start, &end) = self.runs.range(..=value).next_back()?;
        (end >= value).then_some((start, end))
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, value: u128) -> bool {
        self.usable.is_usable(value) && self.run_containing(value).is_some()
    }

    /// Marks `value` used; false if it already was or is unusable.
    pub(crate) fn insert(&mut self, value: u128) -> bool {
        if !self.usable.is_usable(value) || self.run_containing(value).is_some() {
            return false;
        }
        let mut start = value;
        let mut end = value;
        // Join the run that ends at the previous usable address.
        if let Some(prev) = value
            .checked_sub(1)
            .and_then(|v| self.usable.next_at_or_below(v))
        {
            if let Some((prev_start, prev_end)) = self.run_containing(prev) {
                if prev_end == prev {
                    self.runs.remove(&prev_start);
                    start = prev_start;
                }
            }
        }
        // Join the run that starts at the next usable address.
        if let Some(next) = value
            .checked_add(1)
            .and_then(|v| self.usable.next_at_or_above(v))
        {
            if let Some(next_end) = self.runs.remove(&next) {
                end = next_end;
            }
        }
        self.runs.insert(start, end);
        self.len += 1;
        true
    }

    /// Marks `value` free; false if it was not used.
    pub(crate) fn remove(&mut self, value: u128) -> bool {
        if !self.usable.is_usable(value) {
            return false;
        }
        let Some((start, end)) = self.run_containing(value) else {
            return false;
        };
        self.runs.remove(&start);
        if value > start {
            if let Some(left_end) = value
                .checked_sub(1)
                .and_then(|v| self.usable.next_at_or_below(v))
            {
                if left_end >= start {
                    self.runs.insert(start, left_end);
                }
            }
        }
        if value < end {
            if let Some(right_start) = value
                .checked_add(1)
                .and_then(|v| self.usable.next_at_or_above(v))
            {
                if right_start <= end {
                    self.runs.insert(right_start, end);
                }
            }
        }
        self.len -= 1;
        true
    }

    /// The lowest usable address in `first..=last` that is not in use.
    pub(crate) fn lowest_free(&self, first: u128, last: u128) -> Option<u128> {
        let mut candidate = self.usable.next_at_or_above(first)?;
        if let Some((_, end)) = self.run_containing(candidate) {
            candidate = end
                .checked_add(1)
                .and_then(|v| self.usable.next_at_or_above(v))?;
        }
        (candidate <= last).then_some(candidate)
    }

    /// Every address in use, lowest first: costs the number of runs plus
    /// the addresses in them (unusable ones inside a run are skipped).
    pub(crate) fn values(&self) -> impl Iterator<Item = u128> + '_ {
        let usable = self.usable;
        self.runs
            .iter()
            .flat_map(|(&start, &end)| RunValues {
                next: Some(start),
                end,
            })
            .filter(move |v| usable.is_usable(*v))
    }

    /// Number of runs: memory is proportional to this.
    #[cfg(test)]
    pub(crate) fn runs(&self) -> usize {
        self.runs.len()
    }
}

/// The values of one run, lowest first.
struct RunValues {
    next: Option<u128>,
    end: u128,
}

impl Iterator for RunValues {
    type Item = u128;

    fn next(&mut self) -> Option<u128> {
        let value = self.next.filter(|v| *v <= self.end)?;
        self.next = value.checked_add(1);
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::Family;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn set(avoid_buggy: bool) -> UsedSet {
        UsedSet::new(Usable {
            family: Family::V4,
            avoid_buggy,
        })
    }

    #[test]
    fn lowest_free_skips_runs() {
        let mut used = set(false);
        assert_eq!(used.lowest_free(10, 20), Some(10));
        for v in 10..15 {
            assert!(used.insert(v));
        }
        assert!(!used.insert(12));
        assert_eq!(used.runs(), 1);
        assert_eq!(used.lowest_free(10, 20), Some(15));
        assert_eq!(used.lowest_free(10, 14), None);
        assert!(used.remove(12));
        assert_eq!(used.runs(), 2);
        assert_eq!(used.lowest_free(10, 20), Some(12));
        assert_eq!(used.len(), 4);
    }

    #[test]
    fn runs_merge_across_avoided_addresses() {
        let mut used = set(true);
        assert_eq!(used.lowest_free(0, 300), Some(1));
        for v in 1..=254 {
            used.insert(v);
        }
        assert_eq!(used.lowest_free(0, 300), Some(257));
        used.insert(257);
        assert_eq!(used.runs(), 1);
        assert!(!used.insert(255));
        assert!(!used.insert(256));
        assert_eq!(used.lowest_free(0, 300), Some(258));
        assert!(used.remove(254));
        assert_eq!(used.lowest_free(0, 300), Some(254));
    }

    #[test]
    fn top_of_the_address_space() {
        let mut used = UsedSet::new(Usable {
            family: Family::V6,
            avoid_buggy: false,
        });
        assert!(used.insert(u128::MAX));
        assert_eq!(used.lowest_free(u128::MAX, u128::MAX), None);
        assert_eq!(
            used.lowest_free(u128::MAX - 1, u128::MAX),
            Some(u128::MAX - 1)
        );
        assert!(used.insert(0));
        assert!(used.remove(u128::MAX));
        assert_eq!(used.lowest_free(0, 1), Some(1));
    }

    proptest! {
        #[test]
        fn matches_a_plain_set(ops in prop::collection::vec((any::<bool>(), 0u128..600), 0..200),
                               avoid_buggy in any::<bool>(), first in 0u128..600, span in 0u128..600) {
            let mut used = set(avoid_buggy);
            let mut model = BTreeSet::new();
            let usable = Usable { family: Family::V4, avoid_buggy };
            for (insert, v) in ops {
                if insert {
                    prop_assert_eq!(used.insert(v), usable.is_usable(v) && model.insert(v));
                } else {
                    prop_assert_eq!(used.remove(v), model.remove(&v));
                }
                prop_assert_eq!(used.len(), model.len() as u128);
            }
            let last = first + span;
            let expected = (first..=last).find(|v| usable.is_usable(*v) && !model.contains(v));
            prop_assert_eq!(used.lowest_free(first, last), expected);
            for v in 0..600 {
                prop_assert_eq!(used.contains(v), model.contains(&v));
            }
        }
    }
}
