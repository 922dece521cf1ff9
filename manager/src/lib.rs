//! The plugin's engine: [`Manager`] queues Service, pool and Namespace keys
//! from the subscriber traits and one worker reconciles them through an
//! [`AllocatingController`], which applies docs/allocation.md §4 on the
//! `allocator` crate and writes through a [`Client`].
//!
//! Start with [`Manager::new`], register it on a `subscriber` chain, call
//! [`Manager::mark_synced`] when the host's initial list is complete.

mod cilium_pool;
mod client;
mod controller;
mod manager;
mod store;

pub use cilium_pool::{cilium_pool_conditions, CiliumPoolFigures, PoolCondition};
pub use client::{
    capped, capped_note, pool_annotation, status_ips, truncated, CiliumConditionChange, Client,
    ClientError, ConditionKind, Event, EventType, ServiceCondition, ServiceWrite,
    CILIUM_CONDITION_TYPE, CONDITION_TYPE, MAX_EVENT_NOTE, POOL_ANNOTATION,
};
pub use controller::{
    AllocatingController, Asks, ControllerConfig, ControllerStats, Explanation, Judgement,
    NotHandled, ServiceHolding, SharingAcrossNamespaces, Shows,
};
pub use manager::{Manager, ManagerConfig};
pub use store::{DashMapStore, Store};

/// The README's code examples, compiled and run as doc tests.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
