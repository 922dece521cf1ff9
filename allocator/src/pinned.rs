//! An index of pinned pools by what they require of a Service
//! (docs/allocation.md §4.9): a Service visits only the pinned pools that
//! may serve it, not every pinned pool of the cluster.
//!
//! Each pinned pool has a *guard* ([`crate::Pool::guard`]): facts of which
//! a Service must have at least one for the pool to serve it, or none when
//! the pool's rules name no such fact (it is then *unguarded*, and every
//! Service visits it). A guard is necessary, not sufficient: the pools a
//! Service visits must still be asked whether they serve it.

use std::collections::HashMap;
use std::iter::Peekable;

use crate::pool::Subject;
use crate::selector::shared_keys;
use crate::small_map::{Keys, SmallSet};

type FastHash = foldhash::fast::RandomState;

/// One thing a Service may have that a pinned pool may require.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Fact {
    /// It lives in this namespace.
    Namespace(String),
    /// It has this name (Cilium's pseudo-label `io.kubernetes.service.name`).
    Name(String),
    /// It has this label (key, value).
    Label(String, String),
    /// Its Namespace has this label (key, value).
    NamespaceLabel(String, String),
    /// It lives in this namespace and has this label (namespace, key,
    /// value): a pool requiring both is not visited by every Service of
    /// the namespace, nor by every Service of the label.
    NamespacedLabel(String, String, String),
}

/// Per label key and value, the pools needing it.
type ByPair<K> = HashMap<String, HashMap<String, SmallSet<K>, FastHash>, FastHash>;

/// Pinned pools (by their sort key `K`) per fact they may require.
#[derive(Debug)]
pub(crate) struct PinnedIndex<K> {
    /// Every pool in the index, guarded or not.
    all: SmallSet<K>,
    /// Pools whose rules name no fact.
    unguarded: SmallSet<K>,
    namespaces: HashMap<String, SmallSet<K>, FastHash>,
    names: HashMap<String, SmallSet<K>, FastHash>,
    labels: ByPair<K>,
    namespace_labels: ByPair<K>,
    /// Per namespace, the pools needing a label of a Service there.
    namespaced_labels: HashMap<String, ByPair<K>, FastHash>,
}

impl<K> Default for PinnedIndex<K> {
    fn default() -> Self {
        PinnedIndex {
            all: SmallSet::default(),
            unguarded: SmallSet::default(),
            namespaces: HashMap::default(),
            names: HashMap::default(),
            labels: HashMap::default(),
            namespace_labels: HashMap::default(),
            namespaced_labels: HashMap::default(),
        }
    }
}

impl<K: Ord + Clone> PinnedIndex<K> {
    /// Adds `key` under each fact of `guard` (under none: unguarded);
    /// whether it was not there yet.
    pub(crate) fn insert(&mut self, key: &K, guard: Option<&[Fact]>) -> bool {
        if self.all.insert(key.clone(), ()).is_some() {
            return false;
        }
        let Some(facts) = guard else {
            self.unguarded.insert(key.clone(), ());
            return true;
        };
        for fact in facts {
            let set = match fact {
                Fact::Namespace(n) => self.namespaces.entry(n.clone()).or_default(),
                Fact::Name(n) => self.names.entry(n.clone()).or_default(),
                Fact::Label(k, v) => pair_entry(&mut self.labels, k, v),
                Fact::NamespaceLabel(k, v) => pair_entry(&mut self.namespace_labels, k, v),
                Fact::NamespacedLabel(n, k, v) => {
                    pair_entry(self.namespaced_labels.entry(n.clone()).or_default(), k, v)
                }
            };
            set.insert(key.clone(), ());
        }
        true
    }

    /// Takes `key` out; `guard` must be the one it was added with. Whether
    /// it was there.
    pub(crate) fn remove(&mut self, key: &K, guard: Option<&[Fact]>) -> bool {
        if self.all.remove(key).is_none() {
            return false;
        }
        let Some(facts) = guard else {
            self.unguarded.remove(key);
            return true;
        };
        for fact in facts {
            match fact {
                Fact::Namespace(n) => remove_from(&mut self.namespaces, n, key),
                Fact::Name(n) => remove_from(&mut self.names, n, key),
                Fact::Label(k, v) => remove_pair(&mut self.labels, k, v, key),
                Fact::NamespaceLabel(k, v) => remove_pair(&mut self.namespace_labels, k, v, key),
                Fact::NamespacedLabel(n, k, v) => {
                    if let Some(pairs) = self.namespaced_labels.get_mut(n) {
                        remove_pair(pairs, k, v, key);
                        if pairs.is_empty() {
                            self.namespaced_labels.remove(n);
                        }
                    }
                }
            }
        }
        true
    }

    /// Every pool in the index, in order.
    pub(crate) fn all(&self) -> &SmallSet<K> {
        &self.all
    }

    /// The pools whose rules name no fact: every Service may be served by
    /// them.
    pub(crate) fn unguarded(&self) -> &SmallSet<K> {
        &self.unguarded
    }

    /// The guarded pools `subject` may be served by, in order, each once:
    /// those under one of its facts ([`PinnedIndex::unguarded`] aside).
    /// One lookup per fact of the Service (namespace, name, labels, labels
    /// in its namespace, Namespace labels); the pools come lazily, so a
    /// walk that stops early pays only for what it visited.
    pub(crate) fn candidates(&self, subject: &Subject<'_>) -> Merge<'_, K> {
        let mut sets = Vec::new();
        sets.extend(self.namespaces.get(subject.namespace).map(SmallSet::keys));
        sets.extend(self.names.get(subject.name).map(SmallSet::keys));
        for (labels, index) in [
            (subject.labels, Some(&self.labels)),
            (
                subject.labels,
                self.namespaced_labels.get(subject.namespace),
            ),
            (subject.namespace_labels, Some(&self.namespace_labels)),
        ] {
            let Some(index) = index.filter(|index| !index.is_empty()) else {
                continue;
            };
            shared_keys(labels, index, |_, value, values| {
                sets.extend(values.get(value).map(SmallSet::keys));
            });
        }
        Merge::new(sets)
    }
}

fn pair_entry<'a, K>(index: &'a mut ByPair<K>, key: &str, value: &str) -> &'a mut SmallSet<K> {
    index
        .entry(key.to_owned())
        .or_default()
        .entry(value.to_owned())
        .or_default()
}

fn remove_from<K: Ord + Clone>(
    index: &mut HashMap<String, SmallSet<K>, FastHash>,
    fact: &str,
    key: &K,
) {
    if let Some(set) = index.get_mut(fact) {
        set.remove(key);
        if set.is_empty() {
            index.remove(fact);
        }
    }
}

fn remove_pair<K: Ord + Clone>(index: &mut ByPair<K>, label: &str, value: &str, key: &K) {
    if let Some(values) = index.get_mut(label) {
        remove_from(values, value, key);
        if values.is_empty() {
            index.remove(label);
        }
    }
}

/// Sorted sets merged lazily into one sorted sequence without repeats.
/// Each step costs one comparison per set: a Service matches few facts.
#[derive(Debug)]
pub(crate) struct Merge<'a, K> {
    heads: Vec<Peekable<Keys<'a, K, ()>>>,
    last: Option<&'a K>,
}

impl<'a, K: Ord> Merge<'a, K> {
    pub(crate) fn new(sets: Vec<Keys<'a, K, ()>>) -> Self {
        Merge {
            heads: sets
                .into_iter()
                .map(Iterator::peekable)
                .filter_map(|mut set| set.peek().is_some().then_some(set))
                .collect(),
            last: None,
        }
    }
}

impl<'a, K: Ord> Iterator for Merge<'a, K> {
    type Item = &'a K;

    fn next(&mut self) -> Option<&'a K> {
        loop {
            let mut lowest: Option<(usize, &'a K)> = None;
            for (i, head) in self.heads.iter_mut().enumerate() {
                if let Some(&key) = head.peek() {
                    if lowest.is_none_or(|(_, low)| key < low) {
                        lowest = Some((i, key));
                    }
                }
            }
            let (i, key) = lowest?;
            self.heads.get_mut(i).and_then(Iterator::next);
            // A pool under two facts of the Service comes once.
            if self.last != Some(key) {
                self.last = Some(key);
                return Some(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// A guard as a pool keeps it: sorted, each fact once.
    fn facts(list: &[Fact]) -> Box<[Fact]> {
        let set: BTreeSet<Fact> = list.iter().cloned().collect();
        set.into_iter().collect()
    }

    fn ns(n: &str) -> Fact {
        Fact::Namespace(n.into())
    }

    fn label(k: &str, v: &str) -> Fact {
        Fact::Label(k.into(), v.into())
    }

    #[test]
    fn a_service_visits_the_pools_of_its_facts_in_order() {
        let mut index = PinnedIndex::default();
        index.insert(&5, Some(&*facts(&[ns("a"), label("app", "web")])));
        index.insert(&1, Some(&*facts(&[ns("b")])));
        index.insert(&3, None);
        index.insert(&2, Some(&*facts(&[Fact::Name("s".into())])));
        index.insert(
            &4,
            Some(&*facts(&[Fact::NamespaceLabel(
                "tier".into(),
                "gold".into(),
            )])),
        );
        index.insert(&6, Some(&*facts(&[label("app", "db")])));
        let labels: BTreeMap<String, String> = [("app".into(), "web".into())].into();
        let namespace_labels: BTreeMap<String, String> = [("tier".into(), "gold".into())].into();
        let subject = Subject {
            name: "s",
            namespace: "a",
            labels: &labels,
            namespace_labels: &namespace_labels,
        };
        let got: Vec<i32> = index.candidates(&subject).copied().collect();
        // 5 once although under two of its facts; 3 is unguarded.
        assert_eq!(got, [2, 4, 5]);
        assert!(index.unguarded().keys().eq([3].iter()));
        assert!(!index.insert(&3, None), "already there");
        assert!(index.remove(&5, Some(&*facts(&[ns("a"), label("app", "web")]))));
        assert!(index.remove(&3, None));
        assert!(!index.remove(&3, None), "already gone");
        let got: Vec<i32> = index.candidates(&subject).copied().collect();
        assert_eq!(got, [2, 4]);
        assert!(index.unguarded().is_empty());
        assert!(index.all().contains_key(&6) && !index.all().contains_key(&5));
        // Nothing is left behind once every pool is gone.
        index.remove(&1, Some(&*facts(&[ns("b")])));
        index.remove(&2, Some(&*facts(&[Fact::Name("s".into())])));
        index.remove(
            &4,
            Some(&*facts(&[Fact::NamespaceLabel(
                "tier".into(),
                "gold".into(),
            )])),
        );
        index.remove(&6, Some(&*facts(&[label("app", "db")])));
        assert!(index.all().is_empty());
        assert!(index.namespaces.is_empty() && index.names.is_empty());
        assert!(index.labels.is_empty() && index.namespace_labels.is_empty());
    }

    /// Labels are looked up from the smaller side, the Service's (or its
    /// Namespace's) or the index's: either way the same pools.
    #[test]
    fn many_labels_or_few_find_the_same_pools() {
        let mut index = PinnedIndex::default();
        index.insert(&1, Some(&*facts(&[label("app", "web")])));
        index.insert(&2, Some(&*facts(&[label("tier", "gold")])));
        index.insert(&3, Some(&*facts(&[label("zone", "a")])));
        let ns_gold = Fact::NamespaceLabel("tier".into(), "gold".into());
        index.insert(&4, Some(&*facts(&[ns_gold])));
        let few: BTreeMap<String, String> = [("tier".into(), "gold".into())].into();
        let mut many: BTreeMap<String, String> =
            (0..1000).map(|i| (format!("k{i}"), "x".into())).collect();
        many.insert("app".into(), "web".into());
        many.insert("zone".into(), "b".into());
        let no_labels = BTreeMap::new();
        let ask = |labels: &BTreeMap<String, String>,
                   namespace_labels: &BTreeMap<String, String>| {
            let subject = Subject {
                name: "s",
                namespace: "n",
                labels,
                namespace_labels,
            };
            index.candidates(&subject).copied().collect::<Vec<i32>>()
        };
        assert_eq!(ask(&few, &no_labels), [2]);
        assert_eq!(ask(&many, &no_labels), [1]);
        assert_eq!(ask(&few, &many), [2]);
        let mut many_gold = many.clone();
        many_gold.insert("tier".into(), "gold".into());
        assert_eq!(ask(&many_gold, &many_gold), [1, 2, 4]);
    }
}
