//! What the unguarded rules of an [`crate::auto::AutoSet`] answered,
//! kept for Services alike (docs/allocation.md §4.9).
//!
//! Rules that name no fact (`NotIn`, `Exists`, `DoesNotExist`, no
//! selector) have no guard in the index, so every Service would ask each
//! set of them: N such sets that all refuse a Service cost O(N) for every
//! Service. But such rules compare what they read of a Service (its name,
//! namespace, labels and Namespace labels) only with the values they list,
//! or look only at whether a label is there: two Services that agree on
//! each key those rules read, as *absent*, as *a listed value* (which one)
//! or as *another value*, get the same answer from every one of them.
//! That agreement is the Service's *signature*; the answers are kept per
//! signature, as far as walks have asked, and a change of the unguarded
//! rules is replayed on them when they are next read.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;

use crate::auto::RulesKey;
use crate::pool::{Subject, SubjectField};
use crate::selector::shared_keys;
use crate::small_map::SmallSet;

type FastHash = foldhash::fast::RandomState;

/// The most changes kept to replay: an answer older than them is asked
/// again from the start.
/// (Few in this crate's tests, so that they reach it.)
const KEPT_CHANGES: usize = if cfg!(test) { 4 } else { 256 };

/// The most answers kept (signatures plus the serving rules under them):
/// past it, all are dropped, so that many Services unalike cost memory
/// bounded by this, not by their number.
const KEPT_ANSWERS: usize = if cfg!(test) { 16 } else { 1 << 16 };

/// Per field and label key read by the unguarded rules, how many reads
/// name it, and per value compared with, how many compare with it.
#[derive(Debug, Default)]
struct KeyReads {
    readers: usize,
    values: HashMap<String, usize, FastHash>,
}

impl KeyReads {
    fn count(&mut self, value: Option<&str>, add: bool) {
        bump(&mut self.readers, add);
        if let Some(value) = value {
            let count = self.values.entry(value.to_owned()).or_default();
            bump(count, add);
            if *count == 0 {
                self.values.remove(value);
            }
        }
    }

    /// `value` as a signature holds it: itself when listed, `None` for
    /// any other.
    fn canonical<'s>(&self, value: &'s str) -> Option<&'s str> {
        self.values.contains_key(value).then_some(value)
    }
}

fn bump(count: &mut usize, add: bool) {
    *count = if add {
        count.saturating_add(1)
    } else {
        count.saturating_sub(1)
    };
}

/// What the unguarded rules read, counted so that taking rules out
/// forgets what no remaining rules read.
#[derive(Debug, Default)]
struct Reads {
    name: KeyReads,
    namespace: KeyReads,
    labels: HashMap<String, KeyReads, FastHash>,
    namespace_labels: HashMap<String, KeyReads, FastHash>,
}

impl Reads {
    fn count(&mut self, key: &RulesKey, add: bool) {
        key.1.reads(|field, label, value| {
            let by_key = match field {
                SubjectField::Name => return self.name.count(value, add),
                SubjectField::Namespace => return self.namespace.count(value, add),
                SubjectField::Label => &mut self.labels,
                SubjectField::NamespaceLabel => &mut self.namespace_labels,
            };
            let reads = by_key.entry(label.to_owned()).or_default();
            reads.count(value, add);
            if reads.readers == 0 {
                by_key.remove(label);
            }
        });
    }

    /// The signature of `subject`: per field and key read (labels in key
    /// order), the canonical value, or nothing when the label is absent.
    /// Costs the Service's labels, not the rules.
    fn signature<'s>(&self, subject: &Subject<'s>) -> Vec<Part<'s>> {
        let mut parts = Vec::new();
        for (field, reads, value) in [
            (SubjectField::Name, &self.name, subject.name),
            (SubjectField::Namespace, &self.namespace, subject.namespace),
        ] {
            if reads.readers > 0 {
                parts.push((field, "", reads.canonical(value)));
            }
        }
        for (field, by_key, labels) in [
            (SubjectField::Label, &self.labels, subject.labels),
            (
                SubjectField::NamespaceLabel,
                &self.namespace_labels,
                subject.namespace_labels,
            ),
        ] {
            if by_key.is_empty() {
                continue;
            }
            let start = parts.len();
            shared_keys(labels, by_key, |key, value, reads| {
                parts.push((field, key, reads.canonical(value)));
            });
            // Found from the smaller side, in no set order: sorted by key, so
            // that equal signatures hash alike.
            if let Some(added) = parts.get_mut(start..) {
                added.sort_unstable_by(|a, b| a.1.cmp(b.1));
            }
        }
        parts
    }
}

/// One thing of a signature: the field, the label key, the canonical
/// value.
type Part<'s> = (SubjectField, &'s str, Option<&'s str>);

/// The answers for one signature.
#[derive(Debug)]
struct Answers {
    signature: Vec<(SubjectField, Box<str>, Option<Box<str>>)>,
    /// The last change replayed on them.
    version: u64,
    /// Every unguarded rules key up to this one has been asked, but for
    /// `unasked`.
    asked_through: Option<RulesKey>,
    /// Those of them that serve, in order.
    serving: Vec<RulesKey>,
    /// Rules that came since, among those asked: asked when a walk gets
    /// there, as the others.
    unasked: Vec<RulesKey>,
}

impl Answers {
    fn new(signature: &[Part<'_>], version: u64) -> Self {
        Answers {
            signature: signature
                .iter()
                .map(|(field, key, value)| (*field, Box::from(*key), value.map(Box::from)))
                .collect(),
            version,
            asked_through: None,
            serving: Vec::new(),
            unasked: Vec::new(),
        }
    }

    fn is_for(&self, signature: &[Part<'_>]) -> bool {
        self.signature.len() == signature.len()
            && self.signature.iter().zip(signature).all(
                |((field, key, value), (other_field, other_key, other_value))| {
                    field == other_field && &**key == *other_key && value.as_deref() == *other_value
                },
            )
    }

    fn asked(&self, key: &RulesKey) -> bool {
        self.asked_through
            .as_ref()
            .is_some_and(|through| key <= through)
    }

    /// Sets whether `key` is in `list` (sorted).
    fn set(list: &mut Vec<RulesKey>, key: &RulesKey, present: bool) {
        match (list.binary_search(key), present) {
            (Err(at), true) => list.insert(at, key.clone()),
            (Ok(at), false) => {
                list.remove(at);
            }
            _ => {}
        }
    }

    /// The next rules after `after`: those known to serve, or to ask
    /// (`false`), whichever comes first.
    fn next(
        &self,
        after: Option<&RulesKey>,
        unguarded: &SmallSet<RulesKey>,
    ) -> Option<(RulesKey, bool)> {
        let from = match (self.asked_through.as_ref(), after) {
            (Some(asked), Some(after)) => Some(asked.max(after)),
            (asked, after) => asked.or(after),
        };
        let known = first_above(&self.serving, after).map(|key| (key, true));
        let unasked = first_above(&self.unasked, after).map(|key| (key, false));
        let unseen = unguarded.first_above(from).map(|key| (key, false));
        [known, unasked, unseen]
            .into_iter()
            .flatten()
            .min()
            .map(|(key, known)| (key.clone(), known))
    }
}

/// The first of `list` (sorted) above `after`.
fn first_above<'l>(list: &'l [RulesKey], after: Option<&RulesKey>) -> Option<&'l RulesKey> {
    let at = after.map_or(0, |after| list.partition_point(|key| key <= after));
    list.get(at)
}

/// The answers of the unguarded rules of one [`crate::auto::AutoSet`],
/// per signature.
#[derive(Debug, Default)]
pub(crate) struct Verdicts {
    reads: Reads,
    /// The latest changes of the unguarded rules (added or taken out),
    /// the last one numbered `version`.
    changes: VecDeque<(RulesKey, bool)>,
    version: u64,
    /// By the hash of the signature; another signature of the same hash
    /// takes the place.
    answers: RefCell<HashMap<u64, Answers, FastHash>>,
    /// Signatures plus serving rules kept, against [`KEPT_ANSWERS`].
    kept: Cell<usize>,
    hasher: FastHash,
}

impl Verdicts {
    /// The unguarded rules `key` came (`added`) or went.
    pub(crate) fn changed(&mut self, key: &RulesKey, added: bool) {
        self.reads.count(key, added);
        self.version = self.version.wrapping_add(1);
        self.changes.push_back((key.clone(), added));
        if self.changes.len() > KEPT_CHANGES {
            self.changes.pop_front();
        }
    }

    /// A walk of the unguarded rules `unguarded` for `subject`.
    pub(crate) fn walk<'a>(
        &'a self,
        unguarded: &'a SmallSet<RulesKey>,
        subject: &Subject<'a>,
    ) -> UnguardedWalk<'a> {
        let signature = self.reads.signature(subject);
        let hash = self.hasher.hash_one(&signature);
        UnguardedWalk {
            verdicts: self,
            unguarded,
            hash,
            signature,
            after: None,
            peeked: None,
        }
    }

    /// Runs `then` on the answers for `signature`, brought up to date
    /// (the changes since they were last read replayed).
    fn with_answers<T>(
        &self,
        hash: u64,
        signature: &[Part<'_>],
        then: impl FnOnce(&mut Answers) -> T,
    ) -> T {
        let mut all = self.answers.borrow_mut();
        if !all
            .get(&hash)
            .is_some_and(|answers| answers.is_for(signature))
        {
            if self.kept.get() > KEPT_ANSWERS {
                all.clear();
                self.kept.set(0);
            }
            self.keep(signature.len().saturating_add(1));
            all.insert(hash, Answers::new(signature, self.version));
        }
        // Just inserted when missing.
        let answers = all
            .entry(hash)
            .or_insert_with(|| Answers::new(signature, self.version));
        self.catch_up(answers);
        then(answers)
    }

    fn keep(&self, more: usize) {
        self.kept.set(self.kept.get().saturating_add(more));
    }

    fn catch_up(&self, answers: &mut Answers) {
        let behind = self.version.wrapping_sub(answers.version);
        let Ok(behind) = usize::try_from(behind) else {
            return self.forget(answers);
        };
        if behind > self.changes.len() {
            return self.forget(answers);
        }
        let start = self.changes.len() - behind;
        for (key, added) in self.changes.range(start..) {
            // Rules past those asked are met by the walks anyway.
            if answers.asked(key) {
                Answers::set(&mut answers.serving, key, false);
                Answers::set(&mut answers.unasked, key, *added);
            }
        }
        answers.version = self.version;
    }

    /// Too far behind: asked again from the start.
    fn forget(&self, answers: &mut Answers) {
        answers.asked_through = None;
        answers.serving.clear();
        answers.unasked.clear();
        answers.version = self.version;
    }
}

/// The unguarded rules one Service may be served by, in order: those known
/// to serve it, and those not asked yet for its signature, which the
/// caller asks and reports ([`UnguardedWalk::answer`]); those known to
/// refuse it are passed over at no cost.
#[derive(Debug)]
pub(crate) struct UnguardedWalk<'a> {
    verdicts: &'a Verdicts,
    unguarded: &'a SmallSet<RulesKey>,
    hash: u64,
    signature: Vec<Part<'a>>,
    /// The last rules yielded.
    after: Option<RulesKey>,
    /// What [`UnguardedWalk::peek`] found, until the walk moves.
    peeked: Option<Option<(RulesKey, bool)>>,
}

impl UnguardedWalk<'_> {
    /// The next rules, and whether they are known to serve (`false`: not
    /// asked yet).
    pub(crate) fn peek(&mut self) -> Option<(RulesKey, bool)> {
        if let Some(peeked) = &self.peeked {
            return peeked.clone();
        }
        let (after, unguarded) = (self.after.as_ref(), self.unguarded);
        let next = self
            .verdicts
            .with_answers(self.hash, &self.signature, |answers| {
                answers.next(after, unguarded)
            });
        self.peeked = Some(next.clone());
        next
    }

    /// Moves past `key`, the rules [`UnguardedWalk::peek`] gave; `serves`
    /// is the answer when it was not known.
    pub(crate) fn answer(&mut self, key: RulesKey, serves: Option<bool>) {
        if let Some(serves) = serves {
            let unguarded = self.unguarded;
            let kept = self
                .verdicts
                .with_answers(self.hash, &self.signature, |answers| {
                    if answers.unasked.binary_search(&key).is_ok() {
                        Answers::set(&mut answers.unasked, &key, false);
                    } else if unguarded.first_above(answers.asked_through.as_ref()) == Some(&key) {
                        answers.asked_through = Some(key.clone());
                    } else {
                        // Not the next one: the answers were dropped during
                        // the walk, and start again from the first.
                        return false;
                    }
                    Answers::set(&mut answers.serving, &key, serves);
                    serves
                });
            if kept {
                self.verdicts.keep(1);
            }
        }
        self.after = Some(key);
        self.peeked = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn read(values: &[&str]) -> KeyReads {
        KeyReads {
            readers: 1,
            values: values.iter().map(|v| ((*v).to_owned(), 1)).collect(),
        }
    }

    /// A signature is the same whichever side its labels are read from
    /// (the Service's labels when fewer than the keys read, else the keys
    /// read), and in key order.
    #[test]
    fn a_signature_reads_the_smaller_side_in_key_order() {
        let mut reads = Reads::default();
        for key in ["team", "app", "zone", "tier"] {
            reads.labels.insert(key.to_owned(), read(&["x"]));
        }
        let few: BTreeMap<String, String> =
            [("app".into(), "x".into()), ("zone".into(), "y".into())].into();
        let mut many: BTreeMap<String, String> =
            (0..100).map(|i| (format!("k{i}"), "x".into())).collect();
        many.extend(few.clone());
        let no_labels = BTreeMap::new();
        let subject = |labels| Subject {
            name: "s",
            namespace: "n",
            labels,
            namespace_labels: &no_labels,
        };
        let expected = vec![
            (SubjectField::Label, "app", Some("x")),
            (SubjectField::Label, "zone", None),
        ];
        assert_eq!(reads.signature(&subject(&few)), expected);
        assert_eq!(reads.signature(&subject(&many)), expected);
    }
}
