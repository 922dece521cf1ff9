//! A sorted set that stays a small vector while it is small: the indexes
//! of pinned pools keep one set per fact and per set of rules, and most of
//! them hold one pool (one pool per namespace is the common layout). A
//! `BTreeSet` of one element allocates a whole node (hundreds of bytes);
//! this allocates the element alone until the set grows past [`FEW`].

use std::collections::{btree_set, BTreeSet};

/// Above this many elements a set becomes a `BTreeSet`, so that adding to
/// or taking from a large set stays O(log n).
const FEW: usize = 16;

#[derive(Debug, Clone)]
pub(crate) enum SortedSet<K> {
    Few(Vec<K>),
    Many(BTreeSet<K>),
}

impl<K> Default for SortedSet<K> {
    fn default() -> Self {
        SortedSet::Few(Vec::new())
    }
}

impl<K: Ord> SortedSet<K> {
    /// Adds `key`; false if it was there.
    pub(crate) fn insert(&mut self, key: K) -> bool {
        match self {
            SortedSet::Few(few) => match few.binary_search(&key) {
                Ok(_) => false,
                Err(_) if few.len() >= FEW => {
                    let mut many: BTreeSet<K> = std::mem::take(few).into_iter().collect();
                    many.insert(key);
                    *self = SortedSet::Many(many);
                    true
                }
                Err(at) => {
                    // Exact: most sets keep the one element they got.
                    few.reserve_exact(1);
                    few.insert(at, key);
                    true
                }
            },
            SortedSet::Many(many) => many.insert(key),
        }
    }

    /// Takes `key` out; false if it was not there.
    pub(crate) fn remove(&mut self, key: &K) -> bool {
        match self {
            SortedSet::Few(few) => match few.binary_search(key) {
                Ok(at) => {
                    few.remove(at);
                    true
                }
                Err(_) => false,
            },
            SortedSet::Many(many) => {
                let removed = many.remove(key);
                if many.len() <= FEW / 2 {
                    *self = SortedSet::Few(std::mem::take(many).into_iter().collect());
                }
                removed
            }
        }
    }

    pub(crate) fn first(&self) -> Option<&K> {
        match self {
            SortedSet::Few(few) => few.first(),
            SortedSet::Many(many) => many.first(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            SortedSet::Few(few) => few.len(),
            SortedSet::Many(many) => many.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements, lowest first.
    pub(crate) fn iter(&self) -> SetIter<'_, K> {
        match self {
            SortedSet::Few(few) => SetIter::Few(few.iter()),
            SortedSet::Many(many) => SetIter::Many(many.iter()),
        }
    }
}

/// The elements of a [`SortedSet`] or of a `BTreeSet`, lowest first.
#[derive(Debug, Clone)]
pub(crate) enum SetIter<'a, K> {
    Few(std::slice::Iter<'a, K>),
    Many(btree_set::Iter<'a, K>),
}

impl<'a, K> From<&'a BTreeSet<K>> for SetIter<'a, K> {
    fn from(set: &'a BTreeSet<K>) -> Self {
        SetIter::Many(set.iter())
    }
}

impl<'a, K> Iterator for SetIter<'a, K> {
    type Item = &'a K;

    fn next(&mut self) -> Option<&'a K> {
        match self {
            SetIter::Few(few) => few.next(),
            SetIter::Many(many) => many.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a `BTreeSet`, through growing past `FEW` and shrinking back.
    #[test]
    fn behaves_as_a_btree_set_whatever_its_size() {
        let mut set = SortedSet::default();
        let mut model = BTreeSet::new();
        // A fixed scramble of 0..64, inserted then removed in other orders.
        let keys: Vec<u32> = (0..64).map(|i| (i * 37) % 64).collect();
        for (step, &key) in keys.iter().chain(keys.iter().take(8)).enumerate() {
            assert_eq!(set.insert(key), model.insert(key), "insert {key} at {step}");
            assert!(set.iter().eq(model.iter()));
            assert_eq!(set.first(), model.first());
        }
        assert!(matches!(set, SortedSet::Many(_)));
        for &key in keys.iter().rev().chain([99].iter()) {
            assert_eq!(set.remove(&key), model.remove(&key), "remove {key}");
            assert!(set.iter().eq(model.iter()));
            assert_eq!(set.len(), model.len());
        }
        assert!(set.is_empty() && matches!(set, SortedSet::Few(_)));
    }

    #[test]
    fn one_element_costs_one_element() {
        let mut set = SortedSet::default();
        set.insert(7_u64);
        let SortedSet::Few(few) = &set else {
            panic!("a set of one is a vector");
        };
        assert_eq!(few.capacity(), 1);
    }
}
