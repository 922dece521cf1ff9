//! The shared cache: the watcher's object store as the manager reads it.

use std::sync::Arc;

use dashmap::DashMap;
use k8s_openapi::api::core::v1::{Namespace, Service};
use subscriber::{CiliumLoadBalancerIPPool, IPAddressPool};

/// Read access to the host's current objects. The worker reads the current
/// object of a key from here when it processes the key (absent: deleted), so
/// the queue only ever carries keys.
///
/// Implementations must be cheap: hand out an `Arc` and release any lock at
/// once (never hold a guard across an `.await`).
pub trait Store: Send + Sync + 'static {
    /// The Service with key `namespace/name`.
    fn service(&self, key: &str) -> Option<Arc<Service>>;
    /// Every Service key in the store, in no particular order.
    fn service_keys(&self) -> Vec<String>;
    /// The `IPAddressPool` named `name`.
    fn pool(&self, name: &str) -> Option<Arc<IPAddressPool>>;
    /// Every pool name in the store, in no particular order.
    fn pool_names(&self) -> Vec<String>;
    /// The Namespace named `name`.
    fn namespace(&self, name: &str) -> Option<Arc<Namespace>>;
    /// The `CiliumLoadBalancerIPPool` named `name`. The default is for a
    /// host that watches no Cilium pools (and so delivers no events of
    /// them): there are none.
    fn cilium_pool(&self, name: &str) -> Option<Arc<CiliumLoadBalancerIPPool>> {
        let _ = name;
        None
    }
    /// Every Cilium pool name in the store, in no particular order.
    fn cilium_pool_names(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A [`Store`] over four concurrent maps, for hosts without a store of their
/// own (and for tests).
#[derive(Debug, Default)]
pub struct DashMapStore {
    /// Services by `namespace/name`.
    pub services: DashMap<String, Arc<Service>>,
    /// Pools by name.
    pub pools: DashMap<String, Arc<IPAddressPool>>,
    /// Namespaces by name.
    pub namespaces: DashMap<String, Arc<Namespace>>,
    /// `CiliumLoadBalancerIPPool`s by name.
    pub cilium_pools: DashMap<String, Arc<CiliumLoadBalancerIPPool>>,
}

impl Store for DashMapStore {
    fn service(&self, key: &str) -> Option<Arc<Service>> {
        get(&self.services, key)
    }

    fn service_keys(&self) -> Vec<String> {
        keys(&self.services)
    }

    fn pool(&self, name: &str) -> Option<Arc<IPAddressPool>> {
        get(&self.pools, name)
    }

    fn pool_names(&self) -> Vec<String> {
        keys(&self.pools)
    }

    fn namespace(&self, name: &str) -> Option<Arc<Namespace>> {
        get(&self.namespaces, name)
    }

    fn cilium_pool(&self, name: &str) -> Option<Arc<CiliumLoadBalancerIPPool>> {
        get(&self.cilium_pools, name)
    }

    fn cilium_pool_names(&self) -> Vec<String> {
        keys(&self.cilium_pools)
    }
}

fn get<T>(map: &DashMap<String, Arc<T>>, key: &str) -> Option<Arc<T>> {
    map.get(key).map(|entry| Arc::clone(entry.value()))
}

fn keys<T>(map: &DashMap<String, T>) -> Vec<String> {
    map.iter().map(|entry| entry.key().clone()).collect()
}
