//! Who holds one address: almost always one Service, kept inline; several
//! only when they share it (docs/allocation.md §4.4), and then indexed by
//! key, by port and by tenancy (namespace and the namespaces it admits), so
//! that checking a newcomer costs O(log H) for H holders (and, under the
//! namespace rule, O(T) for T distinct tenancies), not a walk over them.

use std::collections::BTreeSet;
use std::ops::Bound::{Included, Unbounded};
use std::sync::Arc;

use std::collections::BTreeMap;

use crate::request::Port;

/// A holder's namespace and the other namespaces it admits (`None`: any),
/// for Cilium's cross-namespace rule (docs/cilium.md §3.4, rule 2).
pub(crate) type Tenancy = (Arc<str>, Option<Arc<[Box<str>]>>);

/// Whether Services of tenancies `a` and `b` may share an address: one
/// namespace, or each admits the other's.
pub(crate) fn tenancies_agree(
    a_namespace: &str,
    a_admits: Option<&[Box<str>]>,
    b_namespace: &str,
    b_admits: Option<&[Box<str>]>,
) -> bool {
    let admits = |list: Option<&[Box<str>]>, namespace: &str| {
        list.is_none_or(|list| list.iter().any(|n| &**n == namespace))
    };
    a_namespace == b_namespace || (admits(a_admits, b_namespace) && admits(b_admits, a_namespace))
}

#[derive(Debug)]
pub(crate) enum Holders {
    One(Arc<str>),
    /// Boxed, so that `Holders` is as small as `One`: a shared address is
    /// rare, and every address pays for the size.
    Shared(Box<Shared>),
}

/// The holders of a shared address. They all have the same sharing group
/// (the allocator lets no other in).
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Sorted by key: the order does not depend on history (which a
    /// refusal naming the first holder would show).
    keys: BTreeSet<Arc<str>>,
    /// Each holder's ports, by port: who already has a port on the address.
    ports: BTreeSet<(Port, Arc<str>)>,
    /// How many holders have each tenancy: the namespace rule asks once
    /// per distinct tenancy, not per holder.
    tenancies: BTreeMap<Tenancy, u32>,
    /// How many holders restrict the namespaces they admit: none (MetalLB's
    /// default) lets an unrestricted newcomer in without a look.
    restricted: u32,
}

impl Shared {
    fn count_tenancy(&mut self, tenancy: Option<&Tenancy>) {
        let Some(tenancy) = tenancy else {
            return;
        };
        *self.tenancies.entry(tenancy.clone()).or_insert(0) += 1;
        if tenancy.1.is_some() {
            self.restricted += 1;
        }
    }

    fn uncount_tenancy(&mut self, tenancy: Option<&Tenancy>) {
        let Some(tenancy) = tenancy else {
            return;
        };
        if let Some(count) = self.tenancies.get_mut(tenancy) {
            *count -= 1;
            if *count == 0 {
                self.tenancies.remove(tenancy);
            }
            if tenancy.1.is_some() {
                self.restricted = self.restricted.saturating_sub(1);
            }
        }
    }
}

impl Holders {
    pub(crate) fn iter(&self) -> Box<dyn Iterator<Item = &Arc<str>> + '_> {
        match self {
            Holders::One(holder) => Box::new(std::iter::once(holder)),
            Holders::Shared(shared) => Box::new(shared.keys.iter()),
        }
    }

    pub(crate) fn contains(&self, key: &str) -> bool {
        match self {
            Holders::One(holder) => &**holder == key,
            Holders::Shared(shared) => shared.keys.contains(key),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Holders::One(_) => 1,
            Holders::Shared(shared) => shared.keys.len(),
        }
    }

    /// The first holder other than `key`, in key order.
    pub(crate) fn first_other(&self, key: &str) -> Option<&Arc<str>> {
        match self {
            Holders::One(holder) => (&**holder != key).then_some(holder),
            Holders::Shared(shared) => shared.keys.iter().take(2).find(|h| &***h != key),
        }
    }

    /// Adds `key` with its `ports` and tenancy; `first` are the ports and
    /// tenancy of the one holder so far, needed when the address becomes
    /// shared.
    pub(crate) fn add(
        &mut self,
        key: Arc<str>,
        (ports, tenancy): (&[Port], Option<&Tenancy>),
        first: (&[Port], Option<&Tenancy>),
    ) {
        if self.contains(&key) {
            return;
        }
        if let Holders::One(holder) = self {
            let mut shared = Shared::default();
            for port in first.0 {
                shared.ports.insert((port.clone(), Arc::clone(holder)));
            }
            shared.count_tenancy(first.1);
            shared.keys.insert(Arc::clone(holder));
            *self = Holders::Shared(Box::new(shared));
        }
        if let Holders::Shared(shared) = self {
            for port in ports {
                shared.ports.insert((port.clone(), Arc::clone(&key)));
            }
            shared.count_tenancy(tenancy);
            shared.keys.insert(key);
        }
    }

    /// Removes `key` with its `ports` and tenancy; false when nobody is left.
    pub(crate) fn remove(&mut self, key: &str, ports: &[Port], tenancy: Option<&Tenancy>) -> bool {
        match self {
            Holders::One(holder) => &**holder != key,
            Holders::Shared(shared) => {
                let Some(removed) = shared.keys.take(key) else {
                    return true;
                };
                for port in ports {
                    shared.ports.remove(&(port.clone(), Arc::clone(&removed)));
                }
                shared.uncount_tenancy(tenancy);
                if shared.keys.len() == 1 {
                    if let Some(only) = shared.keys.pop_first() {
                        *self = Holders::One(only);
                    }
                }
                !matches!(self, Holders::Shared(s) if s.keys.is_empty())
            }
        }
    }

    /// For a shared address: whether some holder (other than one of tenancy
    /// `own`, the requester's if it holds the address) refuses a newcomer
    /// in `namespace` admitting `admits` under the namespace rule, with the
    /// number of tenancies looked at. `None` for a single holder (the
    /// caller checks it). O(1) when neither the newcomer nor any holder
    /// restricts namespaces; else O(distinct tenancies).
    pub(crate) fn tenancy_refuses(
        &self,
        namespace: &str,
        admits: Option<&[Box<str>]>,
        own: Option<&Tenancy>,
    ) -> (Option<bool>, u64) {
        let Holders::Shared(shared) = self else {
            return (None, 0);
        };
        if shared.restricted == 0 && admits.is_none() {
            return (Some(false), 1);
        }
        let mut steps = 0;
        for (tenancy, count) in &shared.tenancies {
            steps += 1;
            let others = count - u32::from(own == Some(tenancy));
            if others > 0 && !tenancies_agree(namespace, admits, &tenancy.0, tenancy.1.as_deref()) {
                return (Some(true), steps);
            }
        }
        (Some(false), steps)
    }

    /// The tenancy counts of a shared address (for the invariant check).
    pub(crate) fn tenancy_counts(&self) -> Option<(&BTreeMap<Tenancy, u32>, u32)> {
        match self {
            Holders::One(_) => None,
            Holders::Shared(shared) => Some((&shared.tenancies, shared.restricted)),
        }
    }

    /// For a shared address: the first holder (in key order) other than
    /// `key` that has one of `ports`, with the number of lookups made.
    /// `None` for a single holder (the caller checks its ports).
    pub(crate) fn first_with_port(
        &self,
        key: &str,
        ports: &[Port],
    ) -> (Option<Option<&Arc<str>>>, u64) {
        let Holders::Shared(shared) = self else {
            return (None, 0);
        };
        let mut steps = 0;
        let mut best: Option<&Arc<str>> = None;
        for port in ports {
            let lower = (port.clone(), Arc::from(""));
            for (other_port, holder) in shared.ports.range((Included(&lower), Unbounded)) {
                steps += 1;
                if other_port != port {
                    break;
                }
                if &**holder != key {
                    if best.is_none_or(|b| holder < b) {
                        best = Some(holder);
                    }
                    break;
                }
            }
        }
        (Some(best), steps)
    }
}
