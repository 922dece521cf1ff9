//! Kubernetes label selectors (matchLabels and matchExpressions), validated.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::hash::BuildHasher;

use crate::spec::LabelSelectorSpec;

type FastHash = foldhash::fast::RandomState;

/// A validated label selector.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Requirement {
    Equals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

/// Why a selector is malformed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// An operator other than In, NotIn, Exists and DoesNotExist.
    #[error("unknown operator {operator:?} for key {key:?}")]
    UnknownOperator { key: String, operator: String },
    /// In and NotIn need values.
    #[error("operator {operator} for key {key:?} needs at least one value")]
    MissingValues { key: String, operator: String },
    /// Exists and DoesNotExist take no values.
    #[error("operator {operator} for key {key:?} takes no values")]
    UnexpectedValues { key: String, operator: String },
    /// A requirement without a key.
    #[error("a requirement has an empty key")]
    EmptyKey,
}

impl Selector {
    /// Validates `spec`. An empty selector matches everything, as in Kubernetes.
    pub fn parse(spec: &LabelSelectorSpec) -> Result<Selector, SelectorError> {
        let mut requirements = Vec::new();
        for (key, value) in &spec.match_labels {
            if key.is_empty() {
                return Err(SelectorError::EmptyKey);
            }
            requirements.push(Requirement::Equals(key.clone(), value.clone()));
        }
        for expression in &spec.match_expressions {
            let key = expression.key.clone();
            if key.is_empty() {
                return Err(SelectorError::EmptyKey);
            }
            let values: BTreeSet<String> = expression.values.iter().cloned().collect();
            let operator = expression.operator.as_str();
            let needs_values = matches!(operator, "In" | "NotIn");
            if needs_values && values.is_empty() {
                return Err(SelectorError::MissingValues {
                    key,
                    operator: operator.to_owned(),
                });
            }
            if matches!(operator, "Exists" | "DoesNotExist") && !values.is_empty() {
                return Err(SelectorError::UnexpectedValues {
                    key,
                    operator: operator.to_owned(),
                });
            }
            requirements.push(match operator {
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                _ => {
                    return Err(SelectorError::UnknownOperator {
                        key,
                        operator: operator.to_owned(),
                    })
                }
            });
        }
        Ok(Selector { requirements })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(|key| labels.get(key).map(String::as_str))
    }

    /// Whether the labels `label` looks up satisfy every requirement: for
    /// label sets that are not one map (Cilium's pseudo-labels).
    pub fn matches_with<'l>(&self, label: impl Fn(&str) -> Option<&'l str>) -> bool {
        self.requirements
            .iter()
            .all(|requirement| match requirement {
                Requirement::Equals(key, value) => label(key) == Some(value.as_str()),
                Requirement::In(key, values) => label(key).is_some_and(|v| values.contains(v)),
                Requirement::NotIn(key, values) => label(key).is_none_or(|v| !values.contains(v)),
                Requirement::Exists(key) => label(key).is_some(),
                Requirement::DoesNotExist(key) => label(key).is_none(),
            })
    }
}

impl Selector {
    /// Label pairs of which every label set the selector matches has at
    /// least one: the values of its most selective `matchLabels` entry or
    /// `In` expression (the fewest values; among equals, the key `prefer`
    /// ranks lowest, then the first), among the keys `prefer` ranks at
    /// all. `None` when it has neither (only `NotIn`, `Exists`,
    /// `DoesNotExist`, or nothing): then no one pair is needed. For
    /// indexing pinned pools by what they require (docs/allocation.md
    /// §4.9).
    pub(crate) fn required_pairs(
        &self,
        prefer: impl Fn(&str) -> Option<u8>,
    ) -> Option<Vec<(&str, &str)>> {
        let mut best: Option<(&str, Vec<&str>)> = None;
        for requirement in &self.requirements {
            let (key, values): (&str, Vec<&str>) = match requirement {
                Requirement::Equals(key, value) => (key, vec![value.as_str()]),
                Requirement::In(key, values) => (key, values.iter().map(String::as_str).collect()),
                _ => continue,
            };
            if prefer(key).is_none() {
                continue;
            }
            let better =
                |(k, b): &(&str, Vec<&str>)| (values.len(), prefer(key)) < (b.len(), prefer(k));
            if best.as_ref().is_none_or(better) {
                best = Some((key, values));
            }
        }
        let (key, values) = best?;
        Some(values.into_iter().map(|value| (key, value)).collect())
    }
}

impl Selector {
    /// What the selector reads of a label set, for finding the selectors a
    /// change of labels may concern: `each(key, Some(value))` for each
    /// value a `matchLabels` entry, an `In` or a `NotIn` expression names
    /// (its verdict can flip only when the key's value becomes or stops
    /// being one of them), `each(key, None)` for `Exists` and
    /// `DoesNotExist`, which a change of the key may concern whatever its
    /// values.
    pub(crate) fn reads<'a>(&'a self, mut each: impl FnMut(&'a str, Option<&'a str>)) {
        for requirement in &self.requirements {
            match requirement {
                Requirement::Equals(key, value) => each(key, Some(value)),
                Requirement::In(key, values) | Requirement::NotIn(key, values) => {
                    values.iter().for_each(|value| each(key, Some(value)));
                }
                Requirement::Exists(key) | Requirement::DoesNotExist(key) => each(key, None),
            }
        }
    }
}

/// Selectors of which any one may match (`serviceSelectors`,
/// `namespaceSelectors`). A long list is indexed by the label pairs each
/// selector requires (see [`Selector::required_pairs`]), so a label set is
/// checked against the selectors its labels lead to and those that
/// require none, not against every one (docs/allocation.md §4.9).
#[derive(Clone, Debug, Default)]
pub(crate) struct Selectors {
    list: Vec<Selector>,
    index: Option<Box<SelectorIndex>>,
}

/// The positions in a [`Selectors`] list by required label pair, and those
/// of the selectors that require none.
#[derive(Clone, Debug, Default)]
struct SelectorIndex {
    by_pair: HashMap<String, HashMap<String, Vec<usize>, FastHash>, FastHash>,
    unguarded: Vec<usize>,
}

/// Lists shorter than this are walked: an index would cost more.
const INDEXED_FROM: usize = 8;

impl Selectors {
    pub(crate) fn new(list: Vec<Selector>) -> Selectors {
        let index = (list.len() >= INDEXED_FROM).then(|| {
            let mut index = SelectorIndex::default();
            for (at, selector) in list.iter().enumerate() {
                match selector.required_pairs(|_| Some(0)) {
                    Some(pairs) => {
                        for (key, value) in pairs {
                            let values = index.by_pair.entry(key.to_owned()).or_default();
                            values.entry(value.to_owned()).or_default().push(at);
                        }
                    }
                    None => index.unguarded.push(at),
                }
            }
            Box::new(index)
        });
        Selectors { list, index }
    }

    /// Whether any selector matches `labels`.
    pub(crate) fn any_matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let matches = |at: &usize| self.list.get(*at).is_some_and(|s| s.matches(labels));
        let Some(index) = &self.index else {
            return self.list.iter().any(|s| s.matches(labels));
        };
        if index.unguarded.iter().any(matches) {
            return true;
        }
        let mut found = false;
        shared_keys(labels, &index.by_pair, |_, value, values| {
            found = found || values.get(value).is_some_and(|at| at.iter().any(matches));
        });
        found
    }
}

/// Each label of `labels` whose key `map` holds, with the map's entry,
/// found from the smaller side (in no set order): a label set of thousands
/// costs the keys the map holds, not its every label (docs/allocation.md
/// §4.9).
pub(crate) fn shared_keys<'l, 'm, V, S: BuildHasher>(
    labels: &'l BTreeMap<String, String>,
    map: &'m HashMap<String, V, S>,
    mut each: impl FnMut(&'l str, &'l str, &'m V),
) {
    if labels.len() <= map.len() {
        for (key, value) in labels {
            if let Some(entry) = map.get(key.as_str()) {
                each(key, value, entry);
            }
        }
    } else {
        for (key, entry) in map {
            if let Some((key, value)) = labels.get_key_value(key.as_str()) {
                each(key, value, entry);
            }
        }
    }
}

impl std::ops::Deref for Selectors {
    type Target = [Selector];

    fn deref(&self) -> &[Selector] {
        &self.list
    }
}

impl<'a> IntoIterator for &'a Selectors {
    type Item = &'a Selector;
    type IntoIter = std::slice::Iter<'a, Selector>;

    fn into_iter(self) -> Self::IntoIter {
        self.list.iter()
    }
}

// Equal lists are equal selectors: the index follows from the list.
impl PartialEq for Selectors {
    fn eq(&self, other: &Selectors) -> bool {
        self.list == other.list
    }
}

impl Eq for Selectors {}

impl PartialOrd for Selectors {
    fn partial_cmp(&self, other: &Selectors) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Selectors {
    fn cmp(&self, other: &Selectors) -> std::cmp::Ordering {
        self.list.cmp(&other.list)
    }
}

impl std::hash::Hash for Selectors {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.list.hash(state);
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|requirement| match requirement {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::In(k, v) => format!("{k} in ({})", join(v)),
                Requirement::NotIn(k, v) => format!("{k} notin ({})", join(v)),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

fn join(values: &BTreeSet<String>) -> String {
    values
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::spec::LabelSelectorRequirementSpec;

    pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A selector of `pairs` (matchLabels) and `expressions` (key,
    /// operator, values); shared with the allocator's tests.
    pub(crate) fn spec(
        pairs: &[(&str, &str)],
        expressions: &[(&str, &str, &[&str])],
    ) -> LabelSelectorSpec {
        LabelSelectorSpec {
            match_labels: labels(pairs),
            match_expressions: expressions
                .iter()
                .map(|(key, operator, values)| LabelSelectorRequirementSpec {
                    key: key.to_string(),
                    operator: operator.to_string(),
                    values: values.iter().map(|v| v.to_string()).collect(),
                })
                .collect(),
        }
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelectorSpec {
        spec(&[], &[(key, operator, values)])
    }

    /// A long list, indexed, answers as the walk of every selector: for
    /// each label set over the keys and values the selectors name (and one
    /// they do not), with the list at every length from 1 (walked) to past
    /// the index's threshold.
    #[test]
    fn an_indexed_list_matches_as_any_of_its_selectors() {
        let specs = [
            spec(&[("app", "web")], &[]),
            spec(&[("app", "db"), ("tier", "gold")], &[]),
            expression("tier", "In", &["gold", "silver"]),
            expression("app", "NotIn", &["web"]),
            expression("zone", "Exists", &[]),
            spec(&[("zone", "a")], &[("app", "DoesNotExist", &[])]),
            expression("tier", "DoesNotExist", &[]),
            spec(&[("app", "api")], &[("tier", "In", &["bronze"])]),
            spec(&[("app", "web")], &[("zone", "NotIn", &["b"])]),
            expression("app", "In", &["cache", "queue"]),
            spec(&[], &[]),
        ];
        let selectors: Vec<Selector> = specs
            .iter()
            .filter_map(|s| Selector::parse(s).ok())
            .collect();
        assert_eq!(selectors.len(), specs.len());
        let values = |key| match key {
            "app" => ["web", "db", "api", "cache", "other"].as_slice(),
            "tier" => ["gold", "silver", "bronze", "other"].as_slice(),
            _ => ["a", "b"].as_slice(),
        };
        let mut label_sets = vec![BTreeMap::new()];
        for key in ["app", "tier", "zone"] {
            let mut more = Vec::new();
            for set in &label_sets {
                for value in values(key) {
                    let mut with = set.clone();
                    with.insert(key.to_owned(), (*value).to_owned());
                    more.push(with);
                }
            }
            label_sets.extend(more);
        }
        for length in 1..=selectors.len() {
            for start in 0..selectors.len() {
                let list: Vec<Selector> = selectors
                    .iter()
                    .cycle()
                    .skip(start)
                    .take(length)
                    .cloned()
                    .collect();
                let indexed = Selectors::new(list.clone());
                assert_eq!(indexed.index.is_some(), length >= INDEXED_FROM);
                for labels in &label_sets {
                    let walked = list.iter().any(|s| s.matches(labels));
                    assert_eq!(
                        indexed.any_matches(labels),
                        walked,
                        "{list:?} on {labels:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn operators() {
        let team_a = labels(&[("team", "a")]);
        let none = labels(&[]);
        let check = |op: &str, values: &[&str], on: &BTreeMap<String, String>| {
            Selector::parse(&expression("team", op, values))
                .unwrap()
                .matches(on)
        };
        assert!(check("In", &["a", "b"], &team_a));
        assert!(!check("In", &["b"], &team_a));
        assert!(!check("In", &["a"], &none));
        assert!(check("NotIn", &["b"], &team_a));
        assert!(check("NotIn", &["b"], &none));
        assert!(!check("NotIn", &["a"], &team_a));
        assert!(check("Exists", &[], &team_a));
        assert!(!check("Exists", &[], &none));
        assert!(check("DoesNotExist", &[], &none));
        assert!(!check("DoesNotExist", &[], &team_a));
    }

    #[test]
    fn match_labels_and_empty_selector() {
        let spec = LabelSelectorSpec {
            match_labels: labels(&[("team", "a"), ("tier", "web")]),
            match_expressions: vec![],
        };
        let selector = Selector::parse(&spec).unwrap();
        assert!(selector.matches(&labels(&[("team", "a"), ("tier", "web"), ("x", "y")])));
        assert!(!selector.matches(&labels(&[("team", "a")])));
        assert!(Selector::parse(&LabelSelectorSpec::default())
            .unwrap()
            .matches(&labels(&[])));
    }

    #[test]
    fn required_pairs_of_the_most_selective_requirement() {
        let parse = |labels: &[(&str, &str)], expressions: &[(&str, &str, &[&str])]| {
            Selector::parse(&spec(labels, expressions)).unwrap()
        };
        let pairs = |s: &Selector| s.required_pairs(|_| Some(0)).map(|p| format!("{p:?}"));
        assert_eq!(pairs(&parse(&[], &[])), None);
        let only_negative = parse(
            &[],
            &[
                ("a", "NotIn", &["x"]),
                ("b", "Exists", &[]),
                ("c", "DoesNotExist", &[]),
            ],
        );
        assert_eq!(pairs(&only_negative), None);
        let with_in = parse(&[], &[("a", "NotIn", &["x"]), ("t", "In", &["b", "a"])]);
        assert_eq!(
            pairs(&with_in).as_deref(),
            Some(r#"[("t", "a"), ("t", "b")]"#)
        );
        let both = parse(&[("z", "1")], &[("t", "In", &["a", "b"])]);
        assert_eq!(pairs(&both).as_deref(), Some(r#"[("z", "1")]"#));
        // Among equals, the preferred key.
        let two = parse(&[("a", "1"), ("z", "2")], &[]);
        assert_eq!(pairs(&two).as_deref(), Some(r#"[("a", "1")]"#));
        let z_first = two.required_pairs(|k| Some(u8::from(k != "z")));
        assert_eq!(format!("{z_first:?}"), r#"Some([("z", "2")])"#);
        // A key not ranked is not considered.
        let not_a = two.required_pairs(|k| (k != "a").then_some(0));
        assert_eq!(format!("{not_a:?}"), r#"Some([("z", "2")])"#);
        assert_eq!(two.required_pairs(|_| None), None);
        // Every label set the selector matches has one of the pairs.
        for selector in [with_in, both] {
            let required = selector.required_pairs(|_| Some(0)).unwrap();
            for labels in [
                labels(&[("t", "a")]),
                labels(&[("t", "b"), ("z", "1")]),
                labels(&[("z", "1")]),
                labels(&[("t", "c"), ("z", "2")]),
            ] {
                if selector.matches(&labels) {
                    assert!(required
                        .iter()
                        .any(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v)));
                }
            }
        }
    }

    #[test]
    fn malformed_selectors() {
        assert_eq!(
            Selector::parse(&expression("team", "Equals", &["a"])),
            Err(SelectorError::UnknownOperator {
                key: "team".into(),
                operator: "Equals".into()
            })
        );
        assert!(matches!(
            Selector::parse(&expression("team", "In", &[])),
            Err(SelectorError::MissingValues { .. })
        ));
        assert!(matches!(
            Selector::parse(&expression("team", "Exists", &["a"])),
            Err(SelectorError::UnexpectedValues { .. })
        ));
        assert_eq!(
            Selector::parse(&expression("", "Exists", &[])),
            Err(SelectorError::EmptyKey)
        );
    }
}
