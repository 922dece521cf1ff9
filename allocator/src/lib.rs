//! Everything about addresses, with no Kubernetes client, no async and no I/O.
//!
//! The model: pool objects arrive in creation order ([`Allocator::set_pool`]);
//! each is parsed on its own ([`Pool::parse`]) and accepted unless it overlaps
//! a pool accepted before it. Services arrive as plain [`Request`]s (key,
//! namespace and labels, families, sharing and backend keys, ports, requested
//! pool and addresses); the allocator keeps a held address if the rules still
//! allow it ([`Allocator::keep`]) or picks the lowest fitting one
//! ([`Allocator::allocate`]) following docs/allocation.md §4.3–4.4.
//!
//! Addresses of both families are `u128`s. Each pool keeps the addresses in
//! use as coalesced runs ([`used`]), so the lowest free address is one
//! `BTreeMap` lookup whatever the pool size (an IPv6 /64 costs what a /30
//! does), and memory grows with addresses in use, never with pool size.
//! Sharing Services are also indexed by (sharing key, backend key), so a
//! Service stacks onto the lowest address of its group without a scan.

mod addr;
mod alloc;
mod count;
mod error;
mod group;
mod holders;
mod pool;
mod request;
mod selector;
mod used;

#[cfg(test)]
mod tests;

/// The `IPAddressPool` spec types, which live in `pool_types::metallb`.
pub use pool_types::metallb as spec;
pub use pool_types::cilium;

pub use addr::Family;
pub use alloc::{
    Allocator, Explanation, FamilyStats, Holding, PoolChange, PoolStats, PoolVerdict, RejectedPool,
    Released, Step, Verdict,
};
pub use count::AddressCount;
pub use error::{AllocError, ShareConflict};
pub use pool::{parse_entry, AddrRange, Pool, PoolError, ServiceAllocation, Subject, Unserved};
pub use request::{FamilyPolicy, Port, Protocol, Request};
pub use selector::{Selector, SelectorError};
