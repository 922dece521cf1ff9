//! Handler traits for the objects the allocator plugin watches — Services,
//! `IPAddressPool`s and Namespaces — and the chains through which a watcher
//! process fans each event out to every registered handler.

mod pool;

pub use pool::{IPAddressPool, POOL_API_VERSION, POOL_KIND};
