//! Kubernetes label selectors (matchLabels and matchExpressions), validated.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::spec::LabelSelectorSpec;

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
