//! Why an address could not be given or kept.

use std::fmt;
use std::net::IpAddr;

use crate::addr::Family;
use crate::request::{FamilyPolicy, Port};

/// Why an address on a shared address cannot be shared.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShareConflict {
    /// The requester has no sharing key.
    #[error("it is in use by {holder}")]
    InUse { holder: String },
    /// Another sharing key.
    #[error("it is in use by {holder} with another sharing key")]
    OtherKey { holder: String },
    /// Same key, but another backend (externalTrafficPolicy Local selector).
    #[error("it is in use by {holder} with another backend (externalTrafficPolicy/selector)")]
    OtherBackend { holder: String },
    /// A holder in another namespace, and the two do not both admit each
    /// other's namespace.
    #[error("it is in use by {holder} in another namespace not allowed by lbipam.cilium.io/sharing-cross-namespace")]
    Namespace { holder: String },
    /// A port in common.
    #[error("port {port} is already used on it by {holder}")]
    Port { holder: String, port: Port },
}

/// Why an address could not be given, or a held address kept.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// No accepted pool has that name.
    #[error("unknown pool {pool:?}")]
    UnknownPool { pool: String },
    /// The pool's serviceAllocation does not cover the Service.
    #[error("pool {pool:?} does not serve this service")]
    PoolDoesNotServe { pool: String },
    /// `metallb.io/address-pool` names a Cilium pool (docs/cilium.md §4.1).
    #[error("unknown pool {pool:?} (a CiliumLoadBalancerIPPool {pool:?} exists; Cilium pools are chosen by their serviceSelector)")]
    CiliumPoolNamed { pool: String },
    /// The pool is disabled (Cilium `spec.disabled`): it gives no new
    /// address.
    #[error("pool {pool:?} is disabled")]
    PoolDisabled { pool: String },
    /// No pool with autoAssign serves the Service.
    #[error("no pool with autoAssign serves this service")]
    NoPool,
    /// Pools were tried and none had a fitting address.
    #[error("no available IPs: no pool has {needed} free (tried {tried})")]
    NoAvailable { needed: String, tried: Tried },
    /// An address outside every accepted pool.
    #[error("{ip} is not in any pool")]
    NotInAnyPool { ip: IpAddr },
    /// An address avoided by the pool's avoidBuggyIPs.
    #[error("{ip} is avoided by pool {pool:?} (avoidBuggyIPs)")]
    Avoided { ip: IpAddr, pool: String },
    /// A reserved end of a Cilium block (`allowFirstLastIPs: No`).
    #[error("{ip} is reserved by pool {pool:?} (allowFirstLastIPs: No)")]
    AddressReserved { ip: IpAddr, pool: String },
    /// The addresses are in different pools.
    #[error("{first} and {second} are in different pools ({first_pool:?}, {second_pool:?})")]
    DifferentPools {
        first: IpAddr,
        second: IpAddr,
        first_pool: String,
        second_pool: String,
    },
    /// The addresses are not in the requested pool.
    #[error("{ip} is in pool {pool:?}, not in the requested pool {requested:?}")]
    NotInRequestedPool {
        ip: IpAddr,
        pool: String,
        requested: String,
    },
    /// The address cannot be shared with its holders.
    #[error("{ip} cannot be used: {conflict}")]
    Taken { ip: IpAddr, conflict: ShareConflict },
    /// The addresses do not match the Service's families.
    #[error("addresses [{}] do not match the service's IP families ({policy})", list(.ips))]
    WrongFamily {
        ips: Vec<IpAddr>,
        policy: FamilyPolicy,
    },
    /// Held addresses differ from the requested ones.
    #[error("addresses [{}] are not the requested [{}]", list(.held), list(.requested))]
    NotRequested {
        held: Vec<IpAddr>,
        requested: Vec<IpAddr>,
    },
    /// A pool with no address of the needed family at all.
    #[error("pool {pool:?} has no {family} addresses")]
    NoFamilyInPool { pool: String, family: Family },
}

/// The pools a failed allocation tried, in the order tried. A failure
/// that tried the unpinned automatic pools tried all of them, and one that
/// tried the pinned pools of some rules tried every pool with those rules:
/// it keeps their number and first names, not a list as long as the
/// cluster's pools (docs/allocation.md §4.9).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tried {
    /// The pools tried one by one: the requested pool.
    pub named: Vec<String>,
    /// The pinned automatic pools that serve the Service, tried after
    /// `named` (boxed: most failures have none, and an error stays small).
    pub pinned: Option<Box<PinnedTried>>,
    /// The unpinned automatic pools, tried last.
    pub unpinned: Option<UnpinnedTried>,
}

/// Every pinned automatic pool that serves a Service, tried in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PinnedTried {
    /// The first of them, at most [`Tried::LISTED`].
    pub first: Vec<String>,
    /// How many there are.
    pub count: usize,
    /// Their rules, each as a fingerprint ([`crate::AutoGroup::Pinned`]):
    /// a free address in any pool with one of them may serve the Service.
    pub rules: Vec<u64>,
}

/// Every unpinned automatic pool, tried in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnpinnedTried {
    /// The first of them, at most [`Tried::LISTED`].
    pub first: Vec<String>,
    /// How many there are.
    pub count: usize,
}

impl Tried {
    /// The most pool names a message lists; the rest are counted.
    pub const LISTED: usize = 10;

    /// How many pools were tried.
    pub fn count(&self) -> usize {
        self.named
            .len()
            .saturating_add(self.pinned.as_ref().map_or(0, |p| p.count))
            .saturating_add(self.unpinned.as_ref().map_or(0, |u| u.count))
    }

    /// The one pool tried, if only one was.
    pub fn only(&self) -> Option<&str> {
        let first = self.listed().next();
        (self.count() == 1).then_some(first?.as_str())
    }

    /// The names known, in the order tried.
    fn listed(&self) -> impl Iterator<Item = &String> {
        let pinned = self.pinned.iter().flat_map(|p| &p.first);
        let unpinned = self.unpinned.iter().flat_map(|u| &u.first);
        self.named.iter().chain(pinned).chain(unpinned)
    }
}

/// `a, b, c`, or past [`Tried::LISTED`] names `a, b, … j and 12 more`.
impl fmt::Display for Tried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = 0_usize;
        for name in self.listed().take(Self::LISTED) {
            if shown > 0 {
                f.write_str(", ")?;
            }
            f.write_str(name)?;
            shown += 1;
        }
        match self.count().saturating_sub(shown) {
            0 => Ok(()),
            more => write!(f, " and {more} more"),
        }
    }
}

fn list(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn the_pools_tried_are_listed_up_to_ten_then_counted() {
        let few = Tried {
            named: Vec::new(),
            pinned: Some(Box::new(PinnedTried {
                first: names(&["pinned"]),
                count: 1,
                rules: vec![7],
            })),
            unpinned: Some(UnpinnedTried {
                first: names(&["a", "b"]),
                count: 2,
            }),
        };
        assert_eq!(few.to_string(), "pinned, a, b");
        assert_eq!(few.only(), None);
        let many = Tried {
            named: Vec::new(),
            pinned: Some(Box::new(PinnedTried {
                first: names(&["x", "y", "z"]),
                count: 40,
                rules: vec![1, 2],
            })),
            unpinned: Some(UnpinnedTried {
                first: names(&["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]),
                count: 500,
            }),
        };
        assert_eq!(many.count(), 540);
        assert_eq!(
            many.to_string(),
            "x, y, z, a, b, c, d, e, f, g and 530 more"
        );
        let one = Tried {
            named: Vec::new(),
            pinned: None,
            unpinned: Some(UnpinnedTried {
                first: names(&["only"]),
                count: 1,
            }),
        };
        assert_eq!(one.only(), Some("only"));
        assert_eq!(one.to_string(), "only");
        let requested = Tried {
            named: names(&["asked"]),
            ..Tried::default()
        };
        assert_eq!(requested.only(), Some("asked"));
    }
}
