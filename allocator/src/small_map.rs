//! Small ordered collections that keep one entry inline.

use std::collections::{btree_map, BTreeMap};
use std::ops::Bound;

/// An ordered map that keeps one entry inline. A `BTreeMap` of one entry
/// allocates a whole node (hundreds of bytes), and many maps here hold one:
/// most ports of a sharing group have one run and most members one port (a
/// key over 100k Services, each on its own port, held 1.7 KB per Service
/// instead of ~0.7 KB); most pinned pools are alone under their fact (one
/// pool per namespace is the common layout).
#[derive(Debug, Default)]
pub(crate) enum SmallMap<K, V> {
    #[default]
    Empty,
    One(K, V),
    Many(BTreeMap<K, V>),
}

impl<K: Ord + Clone, V> SmallMap<K, V> {
    pub(crate) fn len(&self) -> usize {
        match self {
            SmallMap::Empty => 0,
            SmallMap::One(..) => 1,
            SmallMap::Many(map) => map.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        match self {
            SmallMap::Empty => None,
            SmallMap::One(k, v) => (k == key).then_some(v),
            SmallMap::Many(map) => map.get_mut(key),
        }
    }

    pub(crate) fn contains_key(&self, key: &K) -> bool {
        match self {
            SmallMap::Empty => false,
            SmallMap::One(k, _) => k == key,
            SmallMap::Many(map) => map.contains_key(key),
        }
    }

    /// The keys, lowest first.
    pub(crate) fn keys(&self) -> Keys<'_, K, V> {
        match self {
            SmallMap::Empty => Keys::One(None),
            SmallMap::One(k, _) => Keys::One(Some(k)),
            SmallMap::Many(map) => Keys::Many(map.keys()),
        }
    }

    /// The lowest key.
    pub(crate) fn first_key(&self) -> Option<&K> {
        self.keys().next()
    }

    /// The lowest key above `key` (the lowest of all for `None`).
    pub(crate) fn first_above(&self, key: Option<&K>) -> Option<&K> {
        let Some(key) = key else {
            return self.first_key();
        };
        match self {
            SmallMap::Empty => None,
            SmallMap::One(k, _) => (k > key).then_some(k),
            SmallMap::Many(map) => map
                .range((Bound::Excluded(key), Bound::Unbounded))
                .next()
                .map(|(k, _)| k),
        }
    }

    /// The entry of the greatest key at or below `key`.
    pub(crate) fn last_at_or_below(&self, key: &K) -> Option<(&K, &V)> {
        match self {
            SmallMap::Empty => None,
            SmallMap::One(k, v) => (k <= key).then_some((k, v)),
            SmallMap::Many(map) => map.range(..=key.clone()).next_back(),
        }
    }

    pub(crate) fn last_at_or_below_mut(&mut self, key: &K) -> Option<(&K, &mut V)> {
        match self {
            SmallMap::Empty => None,
            SmallMap::One(k, v) => (&*k <= key).then_some((&*k, v)),
            SmallMap::Many(map) => map.range_mut(..=key.clone()).next_back(),
        }
    }

    /// Sets `key` to `value`; the value it had, if any (as
    /// `BTreeMap::insert`).
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let (map, old) = match std::mem::take(self) {
            SmallMap::Empty => (SmallMap::One(key, value), None),
            SmallMap::One(k, old) if k == key => (SmallMap::One(k, value), Some(old)),
            SmallMap::One(k, v) => (SmallMap::Many(BTreeMap::from([(k, v), (key, value)])), None),
            SmallMap::Many(mut map) => {
                let old = map.insert(key, value);
                (SmallMap::Many(map), old)
            }
        };
        *self = map;
        old
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        match std::mem::take(self) {
            SmallMap::Empty => None,
            SmallMap::One(k, v) if &k == key => Some(v),
            one @ SmallMap::One(..) => {
                *self = one;
                None
            }
            SmallMap::Many(mut map) => {
                let removed = map.remove(key);
                *self = if map.len() == 1 {
                    match map.pop_first() {
                        Some((k, v)) => SmallMap::One(k, v),
                        None => SmallMap::Empty,
                    }
                } else {
                    SmallMap::Many(map)
                };
                removed
            }
        }
    }
}

/// A [`SmallMap`] used as an ordered set.
pub(crate) type SmallSet<K> = SmallMap<K, ()>;

/// The keys of a [`SmallMap`], lowest first.
#[derive(Debug, Clone)]
pub(crate) enum Keys<'a, K, V> {
    One(Option<&'a K>),
    Many(btree_map::Keys<'a, K, V>),
}

impl<'a, K, V> Iterator for Keys<'a, K, V> {
    type Item = &'a K;

    fn next(&mut self) -> Option<&'a K> {
        match self {
            Keys::One(one) => one.take(),
            Keys::Many(many) => many.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// As a set, against a `BTreeSet`, through growing and shrinking.
    #[test]
    fn behaves_as_a_btree_set_whatever_its_size() {
        let mut set = SmallSet::default();
        let mut model = BTreeSet::new();
        // A fixed scramble of 0..64, inserted then removed in other orders.
        let keys: Vec<u32> = (0..64).map(|i| (i * 37) % 64).collect();
        for &key in keys.iter().chain(keys.iter().take(8)) {
            assert_eq!(set.insert(key, ()).is_none(), model.insert(key));
            assert!(set.keys().eq(model.iter()));
            assert_eq!(set.first_key(), model.first());
            for probe in [0, key, key + 1, 99] {
                let above = model.range(probe + 1..).next();
                assert_eq!(set.first_above(Some(&probe)), above, "above {probe}");
            }
            assert_eq!(set.first_above(None), model.first());
        }
        assert!(matches!(set, SmallMap::Many(_)));
        for &key in keys.iter().rev().chain([99].iter()) {
            assert_eq!(
                set.remove(&key).is_some(),
                model.remove(&key),
                "remove {key}"
            );
            assert!(set.keys().eq(model.iter()));
            assert_eq!(set.len(), model.len());
        }
        assert!(set.is_empty() && matches!(set, SmallMap::Empty));
    }

    #[test]
    fn one_entry_is_kept_inline() {
        let mut set = SmallSet::default();
        set.insert(7_u64, ());
        assert!(matches!(set, SmallMap::One(7, ())));
    }
}
