//! Handler traits for the objects the allocator plugin watches — Services,
//! `IPAddressPool`s and Namespaces — and the chains through which a watcher
//! process fans each event out to every registered handler.
//!
//! A watcher calls one chain per kind ([`ServiceChain`], [`PoolChain`],
//! [`NamespaceChain`]); each chain calls every handler registered on it in
//! order and reports every failure at once ([`Error::Chain`]). Handlers name
//! objects by key: [`service_key`] (`namespace/name`), [`pool_name`] and
//! [`namespace_name`], which return an error, never panic, on bad metadata.

mod chain;
mod error;
mod handler;
mod pool;

pub use chain::{Chain, NamespaceChain, PoolChain, ServiceChain};
pub use error::{ChainError, Error};
pub use handler::{
    namespace_name, pool_name, service_key, NamespaceHandler, PoolHandler, ServiceHandler,
};
pub use pool::{
    CiliumLoadBalancerIPPool, IPAddressPool, CILIUM_POOL_API_VERSION,
    CILIUM_POOL_API_VERSION_V2ALPHA1, CILIUM_POOL_KIND, POOL_API_VERSION, POOL_KIND,
};
