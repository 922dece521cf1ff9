//! Why an address could not be given or kept.

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
    #[error("no available IPs: no pool has {needed} free (tried {})", pools.join(", "))]
    NoAvailable { needed: String, pools: Vec<String> },
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

fn list(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
