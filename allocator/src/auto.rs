//! Automatic pools for one question (every one, or those with room of a
//! family or of both), found for a Service at the cost of
//! docs/allocation.md §4.9.
//!
//! Pinned pools with equal rules serve the same Services, so they are kept
//! together, and each set of rules is indexed by what it requires of a
//! Service ([`PinnedIndex`]) under its first pool. A Service then asks
//! once per set of rules its facts lead to, not once per pool: many pools
//! pinned alike that do not serve it, or that are full, cost it one step.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{btree_set, BTreeSet, BinaryHeap, HashMap};
use std::iter::Peekable;
use std::sync::Arc;

use crate::pinned::{Fact, Merge, PinnedIndex};
use crate::pool::{Rules, Subject};
use crate::small_map::{Keys, SmallSet};
use crate::verdicts::{UnguardedWalk, Verdicts};

type FastHash = foldhash::fast::RandomState;

/// A pool's place in the §4.4 step 4 order: pinned pools by priority (1
/// first, unset last) then name, then the others by name.
pub(crate) type AutoKey = (bool, u64, Arc<str>);

/// A set of rules under the first of its pools in an [`AutoSet`].
pub(crate) type RulesKey = (AutoKey, Arc<Rules>);

/// Automatic pools for one question, in the §4.4 order.
#[derive(Debug, Default)]
pub(crate) struct AutoSet {
    /// Per rules, its pinned pools in the set.
    pinned: HashMap<Arc<Rules>, SmallSet<AutoKey>, FastHash>,
    /// Each rules with pools in the set, under its first pool, indexed by
    /// what it requires of a Service.
    index: PinnedIndex<RulesKey>,
    /// Every pinned pool in the set.
    pinned_keys: BTreeSet<AutoKey>,
    /// The pools that serve every Service.
    unpinned: BTreeSet<AutoKey>,
    /// What the rules that name no fact answered, per kind of Service.
    verdicts: Verdicts,
}

impl AutoSet {
    /// Adds the pool `key`; `rules` and `guard` are the pool's (`None`
    /// for an unpinned one).
    pub(crate) fn insert(
        &mut self,
        key: &AutoKey,
        guard: Option<&[Fact]>,
        rules: Option<&Arc<Rules>>,
    ) {
        let Some(rules) = rules.filter(|_| !key.0) else {
            self.unpinned.insert(key.clone());
            return;
        };
        if !self.pinned_keys.insert(key.clone()) {
            return;
        }
        let pools = self.pinned.entry(Arc::clone(rules)).or_default();
        let old_first = pools.first_key().cloned();
        pools.insert(key.clone(), ());
        if old_first.as_ref().is_none_or(|first| key < first) {
            if let Some(old) = old_first {
                self.index_remove(&(old, Arc::clone(rules)), guard);
            }
            self.index_insert(&(key.clone(), Arc::clone(rules)), guard);
        }
    }

    fn index_insert(&mut self, key: &RulesKey, guard: Option<&[Fact]>) {
        if self.index.insert(key, guard) && guard.is_none() {
            self.verdicts.changed(key, true);
        }
    }

    fn index_remove(&mut self, key: &RulesKey, guard: Option<&[Fact]>) {
        if self.index.remove(key, guard) && guard.is_none() {
            self.verdicts.changed(key, false);
        }
    }

    /// Takes out the pool `key` (see [`AutoSet::insert`]).
    pub(crate) fn remove(
        &mut self,
        key: &AutoKey,
        guard: Option<&[Fact]>,
        rules: Option<&Arc<Rules>>,
    ) {
        let Some(rules) = rules.filter(|_| !key.0) else {
            self.unpinned.remove(key);
            return;
        };
        if !self.pinned_keys.remove(key) {
            return;
        }
        let Some(pools) = self.pinned.get_mut(rules) else {
            return;
        };
        let was_first = pools.first_key() == Some(key);
        pools.remove(key);
        if !was_first {
            return;
        }
        let next = pools.first_key().cloned();
        self.index_remove(&(key.clone(), Arc::clone(rules)), guard);
        match next {
            Some(next) => self.index_insert(&(next, Arc::clone(rules)), guard),
            None => {
                self.pinned.remove(rules);
            }
        }
    }

    /// Adds or takes out the pool `key`.
    pub(crate) fn set(
        &mut self,
        key: &AutoKey,
        guard: Option<&[Fact]>,
        rules: Option<&Arc<Rules>>,
        present: bool,
    ) {
        if present {
            self.insert(key, guard, rules);
        } else {
            self.remove(key, guard, rules);
        }
    }

    pub(crate) fn contains(&self, key: &AutoKey) -> bool {
        if key.0 {
            self.unpinned.contains(key)
        } else {
            self.pinned_keys.contains(key)
        }
    }

    /// The unpinned pools, in order.
    pub(crate) fn unpinned(&self) -> &BTreeSet<AutoKey> {
        &self.unpinned
    }

    /// The pools that may serve `subject`, in the §4.4 order: the pinned
    /// ones whose rules serve it, then every unpinned one. Each set of
    /// rules its facts lead to is asked once, and only when its first pool
    /// comes before every pool found so far (a walk that stops early pays
    /// for what it visited); a set that does not serve it counts a step in
    /// `steps`.
    /// `every_pinned` (tests): every pinned pool, unasked, as before the
    /// index.
    pub(crate) fn candidates<'a>(
        &'a self,
        subject: Subject<'a>,
        every_pinned: bool,
        steps: &'a Cell<u64>,
    ) -> Candidates<'a> {
        let pinned = if every_pinned {
            Pinned::Every(self.pinned_keys.iter())
        } else {
            Pinned::Grouped(Grouped {
                rules: self.index.candidates(&subject).peekable(),
                unguarded: self.unguarded_walk(&subject),
                heads: BinaryHeap::new(),
                rest: Vec::new(),
            })
        };
        Candidates {
            set: self,
            subject,
            steps,
            pinned,
            unpinned: self.unpinned.iter(),
        }
    }

    /// The pinned pools that serve `subject`, by their rules; each set of
    /// rules asked counts a step in `steps`. `every_pinned` (tests): every
    /// set asked, not only those its facts lead to.
    pub(crate) fn serving<'a>(
        &'a self,
        subject: &Subject<'_>,
        every_pinned: bool,
        steps: &Cell<u64>,
    ) -> Serving<'a> {
        let candidates = if every_pinned {
            Merge::new(vec![self.index.all().keys()])
        } else {
            self.index.candidates(subject)
        };
        let mut rules: Vec<_> = candidates
            .filter(|(_, rules)| {
                step(steps);
                rules.serves(subject)
            })
            .filter_map(|(_, rules)| self.pinned.get_key_value(rules))
            .collect();
        if let Some(mut walk) = self.unguarded_walk(subject).filter(|_| !every_pinned) {
            while let Some((key, known)) = walk.peek() {
                let serves = known || {
                    step(steps);
                    key.1.serves(subject)
                };
                if serves {
                    rules.extend(self.pinned.get_key_value(&key.1));
                }
                walk.answer(key, (!known).then_some(serves));
            }
            // By first pool, as the walk over the index gives them.
            rules.sort_unstable_by(|(_, a), (_, b)| a.first_key().cmp(&b.first_key()));
        }
        Serving { rules }
    }

    /// The walk of the unguarded rules for `subject`, if there are any.
    fn unguarded_walk<'a>(&'a self, subject: &Subject<'a>) -> Option<UnguardedWalk<'a>> {
        let unguarded = self.index.unguarded();
        (!unguarded.is_empty()).then(|| self.verdicts.walk(unguarded, subject))
    }
}

/// See [`AutoSet::serving`].
pub(crate) struct Serving<'a> {
    /// Each set of rules that serves, with its pools, by first pool.
    rules: Vec<(&'a Arc<Rules>, &'a SmallSet<AutoKey>)>,
}

impl<'a> Serving<'a> {
    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The pools, in order.
    pub(crate) fn pools(&self) -> Merge<'a, AutoKey> {
        Merge::new(self.rules.iter().map(|(_, pools)| pools.keys()).collect())
    }

    /// How many pools there are.
    pub(crate) fn count(&self) -> usize {
        self.rules.iter().map(|(_, pools)| pools.len()).sum()
    }

    /// The fingerprint of each set of rules.
    pub(crate) fn fingerprints(&self) -> Vec<u64> {
        self.rules
            .iter()
            .map(|(rules, _)| rules.fingerprint())
            .collect()
    }
}

fn step(steps: &Cell<u64>) {
    steps.set(steps.get().saturating_add(1));
}

/// See [`AutoSet::candidates`].
#[derive(Debug)]
pub(crate) struct Candidates<'a> {
    set: &'a AutoSet,
    subject: Subject<'a>,
    steps: &'a Cell<u64>,
    pinned: Pinned<'a>,
    unpinned: btree_set::Iter<'a, AutoKey>,
}

#[derive(Debug)]
enum Pinned<'a> {
    Every(btree_set::Iter<'a, AutoKey>),
    Grouped(Grouped<'a>),
}

/// The pinned pools of the rules that serve a Service, merged in order.
#[derive(Debug)]
struct Grouped<'a> {
    /// The rules the Service's facts lead to, by first pool.
    rules: Peekable<Merge<'a, RulesKey>>,
    /// The rules that name no fact, by first pool.
    unguarded: Option<UnguardedWalk<'a>>,
    /// The next pool of each set of rules that serves it, lowest first,
    /// with the set's place in `rest`.
    heads: BinaryHeap<Reverse<(&'a AutoKey, usize)>>,
    /// The pools after the head of each such set.
    rest: Vec<Keys<'a, AutoKey, ()>>,
}

impl<'a> Grouped<'a> {
    fn next(
        &mut self,
        set: &'a AutoSet,
        subject: &Subject<'_>,
        steps: &Cell<u64>,
    ) -> Option<&'a AutoKey> {
        loop {
            let top = self.heads.peek().map(|Reverse((key, _))| *key);
            let guarded = self.rules.peek().map(|(first, _)| first);
            let unguarded = self.unguarded.as_mut().and_then(|walk| walk.peek());
            // The next set of rules by first pool, of either kind.
            let (first, of_unguarded) = match (guarded, &unguarded) {
                (Some(first), Some(((other, _), _))) if other < first => (Some(other), true),
                (Some(first), _) => (Some(first), false),
                (None, Some(((other, _), _))) => (Some(other), true),
                (None, None) => (None, false),
            };
            // A set of rules whose first pool comes before every pool
            // found so far: ask it now.
            if first.is_some_and(|first| top.is_none_or(|top| first < top)) {
                let serving = match unguarded.filter(|_| of_unguarded) {
                    Some((key, known)) => self.ask_unguarded(set, key, known, subject),
                    None => {
                        let (_, rules) = self.rules.next()?;
                        rules.serves(subject).then_some(rules)
                    }
                };
                let Some(rules) = serving else {
                    // Counted as the walk over every pool would count its
                    // first pool; that of a set that serves is counted by
                    // the caller, who visits it.
                    step(steps);
                    continue;
                };
                let Some(pools) = set.pinned.get(rules) else {
                    continue;
                };
                let mut pools = pools.keys();
                if let Some(head) = pools.next() {
                    self.heads.push(Reverse((head, self.rest.len())));
                    self.rest.push(pools);
                }
                continue;
            }
            let Reverse((key, at)) = self.heads.pop()?;
            if let Some(next) = self.rest.get_mut(at).and_then(Iterator::next) {
                self.heads.push(Reverse((next, at)));
            }
            return Some(key);
        }
    }

    /// Moves the walk of the unguarded rules past `key`, asking it unless
    /// `known` to serve; the rules when they serve.
    fn ask_unguarded(
        &mut self,
        set: &'a AutoSet,
        key: RulesKey,
        known: bool,
        subject: &Subject<'_>,
    ) -> Option<&'a Arc<Rules>> {
        let serves = known || key.1.serves(subject);
        let rules = set.pinned.get_key_value(&key.1).map(|(rules, _)| rules);
        if let Some(walk) = self.unguarded.as_mut() {
            walk.answer(key, (!known).then_some(serves));
        }
        rules.filter(|_| serves)
    }
}

impl<'a> Iterator for Candidates<'a> {
    type Item = &'a AutoKey;

    fn next(&mut self) -> Option<&'a AutoKey> {
        let pinned = match &mut self.pinned {
            Pinned::Every(pools) => pools.next(),
            Pinned::Grouped(grouped) => grouped.next(self.set, &self.subject, self.steps),
        };
        pinned.or_else(|| self.unpinned.next())
    }
}
