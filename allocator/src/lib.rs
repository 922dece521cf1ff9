//! Everything about addresses, with no Kubernetes client, no async and no I/O.
//!
//! The model: pool objects of both kinds arrive in creation order
//! ([`Allocator::set_pool`] for MetalLB's `IPAddressPool`,
//! [`Allocator::set_cilium_pool`] for Cilium's `CiliumLoadBalancerIPPool`);
//! each is parsed on its own ([`Pool::parse`], [`Pool::parse_cilium`]) into
//! one [`Pool`] type and accepted unless it overlaps a pool accepted before
//! it or an older pool of the other kind has its name. Services arrive as plain [`Request`]s (key,
//! namespace and labels, families, sharing and backend keys, ports, requested
//! pool and addresses); the allocator keeps a held address if the rules still
//! allow it ([`Allocator::keep`]) or picks the lowest fitting one
//! ([`Allocator::allocate`]) following docs/allocation.md §4.3–4.4.
//!
//! Addresses of both families are `u128`s. Each pool keeps the addresses in
//! use as coalesced runs (module `used`), so the lowest free address is one
//! `BTreeMap` lookup whatever the pool size (an IPv6 /64 costs what a /30
//! does), and memory grows with addresses in use, never with pool size.
//! Sharing Services are also indexed by (sharing key, backend key), so a
//! Service stacks onto the lowest address of its group without a scan.

mod addr;
mod alloc;
mod auto;
mod count;
mod error;
mod group;
mod holders;
mod label_keys;
mod label_readers;
mod pinned;
mod pool;
mod rejected_ranges;
mod request;
mod selector;
mod small_map;
mod used;
mod verdicts;

#[cfg(test)]
mod tests;

pub use pool_types::cilium;
/// The `IPAddressPool` spec types, which live in `pool_types::metallb`.
pub use pool_types::metallb as spec;

pub use addr::{push_ip, Family};
pub use alloc::{
    Allocator, AutoGroup, CiliumCounts, Explanation, FamilyStats, Holding, PoolChange, PoolStats,
    PoolVerdict, Regrouped, RejectedPool, Released, Step, Verdict,
};
pub use count::{AddressCount, WideCount};
pub use error::{AllocError, PinnedTried, ShareConflict, Tried, UnpinnedTried};
pub use pool::{
    parse_entry, AddrRange, Conflict, Pool, PoolError, PoolKind, ServiceAllocation, Subject,
    Unserved, SERVICE_NAMESPACE_LABEL, SERVICE_NAME_LABEL,
};
pub use request::{FamilyPolicy, Port, Protocol, Request, SharingNamespaces, SharingRule};
pub use selector::{Selector, SelectorError};
