//! Which pools' `namespaceSelectors` read which Namespace labels
//! (docs/allocation.md §4.6): a change of a Namespace's labels that no
//! selector reads lets every pool serve in that Namespace what it served,
//! so it touches no Service there.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::selector::Selector;

type FastHash = foldhash::fast::RandomState;

/// Pools by name, per label key and value their selectors name, and per
/// key for the selectors that read a key whatever its value.
#[derive(Debug, Default)]
pub(crate) struct LabelReaders {
    by_value: HashMap<String, HashMap<String, BTreeSet<String>, FastHash>, FastHash>,
    by_key: HashMap<String, BTreeSet<String>, FastHash>,
}

impl LabelReaders {
    /// Adds the pool `pool` under what its `selectors` read.
    pub(crate) fn insert(&mut self, pool: &str, selectors: &[Selector]) {
        for selector in selectors {
            selector.reads(|key, value| {
                let pools = match value {
                    Some(value) => self
                        .by_value
                        .entry(key.to_owned())
                        .or_default()
                        .entry(value.to_owned())
                        .or_default(),
                    None => self.by_key.entry(key.to_owned()).or_default(),
                };
                pools.insert(pool.to_owned());
            });
        }
    }

    /// Takes the pool `pool` out; `selectors` must be those it was added
    /// with.
    pub(crate) fn remove(&mut self, pool: &str, selectors: &[Selector]) {
        for selector in selectors {
            selector.reads(|key, value| match value {
                Some(value) => {
                    let Some(values) = self.by_value.get_mut(key) else {
                        return;
                    };
                    if let Some(pools) = values.get_mut(value) {
                        pools.remove(pool);
                        if pools.is_empty() {
                            values.remove(value);
                        }
                    }
                    if values.is_empty() {
                        self.by_value.remove(key);
                    }
                }
                None => {
                    if let Some(pools) = self.by_key.get_mut(key) {
                        pools.remove(pool);
                        if pools.is_empty() {
                            self.by_key.remove(key);
                        }
                    }
                }
            });
        }
    }

    /// The pools whose selectors may judge the labels `old` and `new`
    /// differently: those reading a key whose value differs, by its old or
    /// its new value, or whatever its value. A pool may come more than
    /// once. Costs the labels of both, not the pools.
    pub(crate) fn concerned<'a>(
        &'a self,
        old: &'a BTreeMap<String, String>,
        new: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a str> + 'a {
        let gone = old
            .iter()
            .filter(|(key, value)| new.get(*key) != Some(*value))
            .map(|(key, value)| (key, Some(value), new.get(key)));
        let came = new
            .iter()
            .filter(|(key, _)| !old.contains_key(*key))
            .map(|(key, value)| (key, None, Some(value)));
        gone.chain(came).flat_map(move |(key, before, after)| {
            let values = self.by_value.get(key);
            let by_value = [before, after]
                .into_iter()
                .flatten()
                .filter_map(move |value| values?.get(value));
            by_value
                .chain(self.by_key.get(key))
                .flatten()
                .map(String::as_str)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::tests::{labels, spec};

    fn selector(pairs: &[(&str, &str)], expressions: &[(&str, &str, &[&str])]) -> Selector {
        Selector::parse(&spec(pairs, expressions)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn concerned(
        readers: &LabelReaders,
        old: &[(&str, &str)],
        new: &[(&str, &str)],
    ) -> Vec<String> {
        let (old, new) = (labels(old), labels(new));
        let mut pools: Vec<String> = readers.concerned(&old, &new).map(str::to_owned).collect();
        pools.sort();
        pools.dedup();
        pools
    }

    #[test]
    fn a_change_concerns_the_pools_naming_its_old_or_new_value() {
        let mut readers = LabelReaders::default();
        readers.insert("red", &[selector(&[("team", "red")], &[])]);
        readers.insert(
            "blue",
            &[selector(&[], &[("team", "In", &["blue", "navy"])])],
        );
        readers.insert(
            "not-green",
            &[selector(&[], &[("team", "NotIn", &["green"])])],
        );
        readers.insert("has-tier", &[selector(&[], &[("tier", "Exists", &[])])]);

        assert_eq!(
            concerned(&readers, &[("team", "red")], &[("team", "blue")]),
            ["blue", "red"]
        );
        assert_eq!(
            concerned(&readers, &[("team", "x")], &[("team", "navy")]),
            ["blue"]
        );
        assert_eq!(
            concerned(&readers, &[], &[("team", "green")]),
            ["not-green"]
        );
        // A key no selector reads, or a value none names, concerns none.
        assert!(concerned(
            &readers,
            &[("team", "x"), ("rev", "1")],
            &[("team", "y"), ("rev", "2")]
        )
        .is_empty());
        assert!(concerned(&readers, &[("team", "red")], &[("team", "red")]).is_empty());
        // Exists and DoesNotExist read the key whatever its value.
        assert_eq!(
            concerned(&readers, &[("tier", "1")], &[("tier", "2")]),
            ["has-tier"]
        );
        assert_eq!(concerned(&readers, &[("tier", "1")], &[]), ["has-tier"]);
    }

    #[test]
    fn a_removed_pool_leaves_nothing_behind() {
        let mut readers = LabelReaders::default();
        let selectors = [
            selector(&[("team", "red")], &[("tier", "DoesNotExist", &[])]),
            selector(&[], &[("env", "In", &["a", "b"])]),
        ];
        readers.insert("p", &selectors);
        readers.insert("q", &selectors[..1]);
        readers.remove("p", &selectors);
        assert_eq!(concerned(&readers, &[], &[("team", "red")]), ["q"]);
        readers.remove("q", &selectors[..1]);
        assert!(readers.by_value.is_empty() && readers.by_key.is_empty());
    }
}
