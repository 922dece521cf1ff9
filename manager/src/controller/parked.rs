//! Services that wait on a change of configuration alone: of the pool they
//! asked for, of a pool with their requested addresses, or of their
//! Namespace's labels (docs/allocation.md §4.6, §4.9). A pool or Namespace
//! change looks at them only when it is one of those.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use allocator::{AddrRange, AllocError, Request};

use super::WakeOn;

/// See the manager's: the cluster's own names as keys.
type FastHash = foldhash::fast::RandomState;

/// What alone can end the wait of a Service that failed with `error`, if
/// that is a change of configuration only: a change of the pool it asked
/// for, of a pool that has (or had) one of the addresses it asked for, or
/// of its Namespace's labels. `None` for every other failure.
///
/// These failures (an unknown or Cilium pool named, a pool that is
/// disabled, does not serve the Service, lacks its family, or does not
/// hold its addresses; an address outside every pool, avoided, reserved)
/// depend only on the pools that hold its addresses or that it names, on
/// the Service and on its Namespace's labels: no release and no change of
/// another pool can end them. A change of a pool's acceptance is reported
/// as a change of that pool. Failures that depend on who holds what (a
/// full pool, a taken address) or on every pool (none serves) are not
/// parked.
pub(crate) fn parked_on(error: &AllocError, request: &Request<'_>) -> Option<Vec<WakeOn>> {
    let config_only = matches!(
        error,
        AllocError::UnknownPool { .. }
            | AllocError::CiliumPoolNamed { .. }
            | AllocError::PoolDisabled { .. }
            | AllocError::PoolDoesNotServe { .. }
            | AllocError::NoFamilyInPool { .. }
            | AllocError::NotInAnyPool { .. }
            | AllocError::Avoided { .. }
            | AllocError::AddressReserved { .. }
            | AllocError::DifferentPools { .. }
            | AllocError::NotInRequestedPool { .. }
    );
    if !config_only || (request.pool.is_none() && request.addresses.is_empty()) {
        return None;
    }
    let named = request
        .pool
        .map(|pool| WakeOn::PoolChanged(pool.to_owned()));
    let covering = request.addresses.iter().map(|ip| WakeOn::PoolCovering(*ip));
    let namespace = WakeOn::NamespaceChanged(request.subject.namespace.to_owned());
    Some(
        named
            .into_iter()
            .chain(covering)
            .chain([namespace])
            .collect(),
    )
}

/// Service keys by the changes they wait on ([`parked_on`]), both ways.
#[derive(Debug, Default)]
pub(crate) struct ParkedKeys {
    changes_of: HashMap<String, Vec<WakeOn>, FastHash>,
    by_change: HashMap<WakeOn, HashSet<String, FastHash>, FastHash>,
    /// The addresses of the [`WakeOn::PoolCovering`] keys, for a range
    /// query by a pool's addresses.
    covered: BTreeSet<IpAddr>,
}

impl ParkedKeys {
    /// Files `key` under `changes`, or under none.
    pub(crate) fn set(&mut self, key: &str, changes: Option<&[WakeOn]>) {
        if self.changes_of.get(key).map(Vec::as_slice) == changes {
            return;
        }
        self.remove(key);
        let Some(changes) = changes else {
            return;
        };
        for change in changes {
            if let WakeOn::PoolCovering(ip) = change {
                self.covered.insert(*ip);
            }
            self.by_change
                .entry(change.clone())
                .or_default()
                .insert(key.to_owned());
        }
        self.changes_of.insert(key.to_owned(), changes.to_vec());
    }

    pub(crate) fn remove(&mut self, key: &str) {
        let Some(changes) = self.changes_of.remove(key) else {
            return;
        };
        for change in changes {
            let Some(keys) = self.by_change.get_mut(&change) else {
                continue;
            };
            keys.remove(key);
            if keys.is_empty() {
                self.by_change.remove(&change);
                if let WakeOn::PoolCovering(ip) = change {
                    self.covered.remove(&ip);
                }
            }
        }
    }

    /// The keys filed under `change`.
    pub(crate) fn on<'a>(&'a self, change: &WakeOn) -> impl Iterator<Item = &'a String> + 'a {
        self.by_change.get(change).into_iter().flatten()
    }

    /// The [`WakeOn::PoolCovering`] keys filed for an address in `ranges`.
    /// Costs the ranges and the keys found, not the keys filed.
    pub(crate) fn covering(&self, ranges: &[AddrRange]) -> Vec<WakeOn> {
        let mut found: Vec<WakeOn> = ranges
            .iter()
            .flat_map(|range| self.covered.range(range.first()..=range.last()))
            .map(|ip| WakeOn::PoolCovering(*ip))
            .collect();
        found.sort();
        found.dedup();
        found
    }

    /// Every key filed.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &String> + '_ {
        self.changes_of.keys()
    }
}

#[cfg(test)]
mod tests {
    use allocator::{Family, FamilyPolicy, SharingNamespaces, SharingRule, Subject};

    use super::super::service::NO_LABELS;
    use super::*;

    fn request<'a>(pool: Option<&'a str>, addresses: &'a [IpAddr]) -> Request<'a> {
        Request {
            key: "ns/s",
            subject: Subject {
                name: "s",
                namespace: "ns",
                labels: &NO_LABELS,
                namespace_labels: &NO_LABELS,
            },
            families: FamilyPolicy::Single(Family::V4),
            sharing_key: "",
            sharing_rule: SharingRule::MetalLb,
            sharing_namespaces: SharingNamespaces::Any,
            backend_key: "",
            ports: &[],
            pool,
            addresses,
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_failure_of_configuration_waits_on_what_it_asked_for_and_its_namespace() {
        let unknown = AllocError::UnknownPool { pool: "a".into() };
        assert_eq!(
            parked_on(&unknown, &request(Some("a"), &[])),
            Some(vec![
                WakeOn::PoolChanged("a".into()),
                WakeOn::NamespaceChanged("ns".into())
            ])
        );
        let outside = AllocError::NotInAnyPool { ip: ip("10.0.0.1") };
        let asked = [ip("10.0.0.1"), ip("fd00::1")];
        assert_eq!(
            parked_on(&outside, &request(Some("a"), &asked)),
            Some(vec![
                WakeOn::PoolChanged("a".into()),
                WakeOn::PoolCovering(asked[0]),
                WakeOn::PoolCovering(asked[1]),
                WakeOn::NamespaceChanged("ns".into())
            ])
        );
    }

    #[test]
    fn a_failure_of_who_holds_what_or_of_every_pool_is_not_parked() {
        let full = AllocError::NoAvailable {
            needed: "1 IPv4".into(),
            tried: Default::default(),
        };
        assert_eq!(parked_on(&full, &request(Some("a"), &[])), None);
        assert_eq!(parked_on(&AllocError::NoPool, &request(None, &[])), None);
        let taken = AllocError::Taken {
            ip: ip("10.0.0.1"),
            conflict: allocator::ShareConflict::InUse {
                holder: "ns/t".into(),
            },
        };
        assert_eq!(parked_on(&taken, &request(None, &[ip("10.0.0.1")])), None);
    }

    #[test]
    fn keys_are_filed_under_their_changes_and_found_by_address_range() {
        let mut parked = ParkedKeys::default();
        let a = WakeOn::PoolChanged("a".into());
        let covering = |text| WakeOn::PoolCovering(ip(text));
        parked.set("ns/s1", Some(&[a.clone(), covering("10.0.0.5")]));
        parked.set("ns/s2", Some(&[a.clone(), covering("10.0.1.5")]));
        let on = |parked: &ParkedKeys, change: &WakeOn| {
            let mut keys: Vec<String> = parked.on(change).cloned().collect();
            keys.sort();
            keys
        };
        assert_eq!(on(&parked, &a), ["ns/s1", "ns/s2"]);
        let pool = allocator::Pool::parse(
            "p",
            &allocator::spec::IPAddressPoolSpec {
                addresses: vec!["10.0.0.0/24".into(), "fd00::/120".into()],
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(parked.covering(&pool.ranges), [covering("10.0.0.5")]);
        // Filed again under other changes: the old ones let go.
        parked.set("ns/s1", Some(&[covering("10.0.1.5")]));
        assert_eq!(on(&parked, &a), ["ns/s2"]);
        assert!(parked.covering(&pool.ranges).is_empty());
        assert_eq!(on(&parked, &covering("10.0.1.5")), ["ns/s1", "ns/s2"]);
        parked.set("ns/s2", None);
        parked.remove("ns/s1");
        assert_eq!(parked.keys().count(), 0);
        assert!(parked.by_change.is_empty() && parked.covered.is_empty());
    }
}
