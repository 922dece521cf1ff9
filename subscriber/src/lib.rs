//! The one handler shape for the objects the allocator plugin watches —
//! Services, `IPAddressPool`s and Namespaces — and the chains through which
//! a watcher process fans each event out to every registered handler.
//!
//! Every kind `K` has the same [`Handler<K>`]: `on_add`, `on_update(old,
//! new)`, `on_delete`. A watcher calls one [`Chain<K>`] per kind; the chain
//! calls every handler registered on it in order and reports every failure
//! at once ([`Error::Chain`]). Handlers name objects by [`Keyed::key`]
//! (`namespace/name` for a Service, the name otherwise), which returns an
//! error, never panics, on bad metadata.

mod chain;
mod error;
mod handler;
mod pool;

pub use chain::Chain;
pub use error::{ChainError, Error};
pub use handler::{Handler, Keyed};
pub use pool::{
    CiliumLoadBalancerIPPool, IPAddressPool, CILIUM_POOL_API_VERSION,
    CILIUM_POOL_API_VERSION_V2ALPHA1, CILIUM_POOL_KIND, POOL_API_VERSION, POOL_KIND,
};
