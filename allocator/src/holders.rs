//! Who holds one address: almost always one Service, kept inline; several
//! only when they share it (docs/allocation.md §4.4), and then indexed by
//! key and by port, so that checking a newcomer costs O(log H) for H
//! holders, not a walk over them.

use std::collections::BTreeSet;
use std::ops::Bound::{Included, Unbounded};
use std::sync::Arc;

use crate::request::Port;

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

    /// Adds `key` with its `ports`; `first_ports` are the ports of the one
    /// holder so far, needed when the address becomes shared.
    pub(crate) fn add(&mut self, key: Arc<str>, ports: &[Port], first_ports: &[Port]) {
        if self.contains(&key) {
            return;
        }
        if let Holders::One(first) = self {
            let mut shared = Shared::default();
            for port in first_ports {
                shared.ports.insert((port.clone(), Arc::clone(first)));
            }
            shared.keys.insert(Arc::clone(first));
            *self = Holders::Shared(Box::new(shared));
        }
        if let Holders::Shared(shared) = self {
            for port in ports {
                shared.ports.insert((port.clone(), Arc::clone(&key)));
            }
            shared.keys.insert(key);
        }
    }

    /// Removes `key` with its `ports`; false when nobody is left.
    pub(crate) fn remove(&mut self, key: &str, ports: &[Port]) -> bool {
        match self {
            Holders::One(holder) => &**holder != key,
            Holders::Shared(shared) => {
                let Some(removed) = shared.keys.take(key) else {
                    return true;
                };
                for port in ports {
                    shared.ports.remove(&(port.clone(), Arc::clone(&removed)));
                }
                if shared.keys.len() == 1 {
                    if let Some(only) = shared.keys.pop_first() {
                        *self = Holders::One(only);
                    }
                }
                !matches!(self, Holders::Shared(s) if s.keys.is_empty())
            }
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
