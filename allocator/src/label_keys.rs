//! The Service label keys the pools read (docs/allocation.md §4.9): two
//! Services of one Namespace whose labels agree on every key a pool reads
//! are served alike by every pool, so a waiting one may be judged by
//! another.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::pool::{Pool, SubjectField};
use crate::selector::shared_keys;

type FastHash = foldhash::fast::RandomState;

/// The label keys the pool objects' rules read, each counted once per
/// pool, and a fingerprint of the set of them.
#[derive(Debug, Default)]
pub(crate) struct LabelKeys {
    pools_reading: HashMap<String, u32, FastHash>,
    /// The sum of the keys' hashes: the same for the same set however it
    /// was reached, and kept in O(1) per key.
    fingerprint: u64,
}

impl LabelKeys {
    /// Counts the keys `pool` reads in (`read`) or out; out must follow in
    /// with the same pool.
    pub(crate) fn count(&mut self, pool: &Pool, read: bool) {
        let Some(rules) = pool.rules() else {
            return;
        };
        let mut keys = BTreeSet::new();
        rules.reads(|field, key, _| {
            if field == SubjectField::Label {
                keys.insert(key.to_owned());
            }
        });
        for key in keys {
            let hash = hash_of(&key);
            if read {
                let pools = self.pools_reading.entry(key).or_default();
                if *pools == 0 {
                    self.fingerprint = self.fingerprint.wrapping_add(hash);
                }
                *pools = pools.saturating_add(1);
            } else if let Some(pools) = self.pools_reading.get_mut(&key) {
                *pools = pools.saturating_sub(1);
                if *pools == 0 {
                    self.pools_reading.remove(&key);
                    self.fingerprint = self.fingerprint.wrapping_sub(hash);
                }
            }
        }
    }

    /// What the pools read of `labels`, as a number: two label sets with
    /// the same number agree on every key a pool reads now (and were
    /// read, if at another time, by pools reading the same keys). Costs
    /// the smaller of the labels and the keys read.
    pub(crate) fn read_of(&self, labels: &BTreeMap<String, String>) -> u64 {
        let mut read: Vec<(&str, &str)> = Vec::new();
        shared_keys(labels, &self.pools_reading, |key, value, _| {
            read.push((key, value));
        });
        read.sort_unstable();
        hash_of(&(self.fingerprint, read))
    }
}

fn hash_of(value: &impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::tests::{labels, spec};
    use crate::spec::{IPAddressPoolSpec, ServiceAllocationSpec};

    fn pool(name: &str, selectors: &[&[(&str, &str)]]) -> Pool {
        let spec = IPAddressPoolSpec {
            addresses: vec!["10.0.0.0/30".to_owned()],
            service_allocation: Some(ServiceAllocationSpec {
                service_selectors: selectors.iter().map(|pairs| spec(pairs, &[])).collect(),
                ..ServiceAllocationSpec::default()
            }),
            ..IPAddressPoolSpec::default()
        };
        Pool::parse(name, &spec).unwrap_or_else(|error| panic!("{error}"))
    }

    #[test]
    fn labels_alike_on_the_keys_read_read_alike_until_a_pool_reads_another() {
        let mut keys = LabelKeys::default();
        let web_a = labels(&[("app", "web"), ("team", "a")]);
        let web_b = labels(&[("app", "web"), ("team", "b")]);
        let db = labels(&[("app", "db"), ("team", "a")]);
        // No pool reads a label: every label set alike.
        assert_eq!(keys.read_of(&web_a), keys.read_of(&db));
        let app = pool("app", &[&[("app", "web")]]);
        keys.count(&app, true);
        assert_eq!(keys.read_of(&web_a), keys.read_of(&web_b));
        assert_ne!(keys.read_of(&web_a), keys.read_of(&db));
        let before = keys.read_of(&web_a);
        // A pool reading `team` tells them apart, and changes the number of
        // what was alike before.
        let team = pool("team", &[&[("team", "a")], &[("app", "x")]]);
        keys.count(&team, true);
        assert_ne!(keys.read_of(&web_a), keys.read_of(&web_b));
        assert_ne!(keys.read_of(&web_a), before);
        // Gone again: as before, whatever the order.
        keys.count(&team, false);
        assert_eq!(keys.read_of(&web_a), before);
        keys.count(&app, false);
        assert_eq!(keys.read_of(&web_a), keys.read_of(&db));
        assert!(keys.pools_reading.is_empty());
        assert_eq!(keys.fingerprint, 0);
    }
}
