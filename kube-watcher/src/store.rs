//! The shared cache: [`manager::Store`] over the reflector stores of
//! Services, both kinds of pools and Namespaces.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::runtime::reflector::{self, ObjectRef};
use kube::{Resource, ResourceExt};
use subscriber::{CiliumLoadBalancerIPPool, IPAddressPool};
use tokio::sync::watch;

use crate::cilium::{self, CiliumPoolResource};
use crate::crd::{to_subscriber, IPAddressPoolResource};

/// Readers of the Service, pool and Namespace reflector stores. Cheap to
/// clone; every read copies an `Arc` out and releases the lock at once.
#[derive(Clone)]
pub struct KubeStore {
    services: reflector::Store<Service>,
    pools: reflector::Store<IPAddressPoolResource>,
    namespaces: reflector::Store<Namespace>,
    /// Empty unless the host watches Cilium pools (their CRD is served).
    cilium_pools: reflector::Store<CiliumPoolResource>,
    /// Bumped by the Service driver after each event it applied.
    changed: watch::Sender<u64>,
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore")
            .field("services", &self.services.len())
            .field("pools", &self.pools.len())
            .field("namespaces", &self.namespaces.len())
            .field("cilium_pools", &self.cilium_pools.len())
            .finish()
    }
}

impl KubeStore {
    /// A store over these readers.
    pub fn new(
        services: reflector::Store<Service>,
        pools: reflector::Store<IPAddressPoolResource>,
        namespaces: reflector::Store<Namespace>,
    ) -> Self {
        Self {
            services,
            pools,
            namespaces,
            cilium_pools: reflector::store().0,
            changed: watch::Sender::new(0),
        }
    }

    /// Also reads `CiliumLoadBalancerIPPool`s from `cilium_pools`.
    #[must_use]
    pub fn with_cilium_pools(mut self, cilium_pools: reflector::Store<CiliumPoolResource>) -> Self {
        self.cilium_pools = cilium_pools;
        self
    }

    /// The Cilium pool reader.
    pub fn cilium_pools(&self) -> &reflector::Store<CiliumPoolResource> {
        &self.cilium_pools
    }

    /// The Cilium pool object named `name` (cluster-scoped).
    pub fn cilium_pool_resource(&self, name: &str) -> Option<Arc<CiliumPoolResource>> {
        self.cilium_pools.get(&ObjectRef::new(name))
    }

    /// What the Service driver bumps after applying an event, so that
    /// [`wait_for_service`](Self::wait_for_service) wakes up.
    pub fn service_changes(&self) -> watch::Sender<u64> {
        self.changed.clone()
    }

    /// Waits until `check` holds for the cached Service `key` (`None`: not
    /// cached), at most `timeout`; returns whether it held. The client uses
    /// it to read its own writes: once a write returns, the cache shows it.
    pub async fn wait_for_service(
        &self,
        key: &str,
        timeout: std::time::Duration,
        check: impl Fn(Option<&Service>) -> bool,
    ) -> bool {
        let mut changed = self.changed.subscribe();
        let wait = async {
            loop {
                changed.borrow_and_update();
                if check(manager::Store::service(self, key).as_deref()) {
                    return;
                }
                if changed.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    /// The Service reader.
    pub fn services(&self) -> &reflector::Store<Service> {
        &self.services
    }

    /// The pool reader.
    pub fn pools(&self) -> &reflector::Store<IPAddressPoolResource> {
        &self.pools
    }

    /// The Namespace reader.
    pub fn namespaces(&self) -> &reflector::Store<Namespace> {
        &self.namespaces
    }

    /// The pool object named `name`. Pools are identified by name alone; if
    /// two namespaces hold a pool of one name, the one in the first namespace
    /// (by name) is used, so the choice does not depend on hash order.
    pub fn pool_resource(&self, name: &str) -> Option<Arc<IPAddressPoolResource>> {
        self.pools
            .state_filter(|pool| pool.metadata.name.as_deref() == Some(name))
            .into_iter()
            .min_by(|a, b| a.metadata.namespace.cmp(&b.metadata.namespace))
    }
}

/// Splits `namespace/name`.
pub(crate) fn split_key(key: &str) -> Option<(&str, &str)> {
    key.split_once('/')
        .filter(|(namespace, name)| !namespace.is_empty() && !name.is_empty())
}

impl manager::Store for KubeStore {
    fn service(&self, key: &str) -> Option<Arc<Service>> {
        let (namespace, name) = split_key(key)?;
        self.services
            .get(&ObjectRef::new(name).within(namespace))
            // The fallback of `get` to a cluster-scoped key must not
            // answer for a Service.
            .filter(|service| service.metadata.namespace.as_deref() == Some(namespace))
    }

    fn service_keys(&self) -> Vec<String> {
        self.services
            .state()
            .iter()
            .filter_map(|service| {
                let namespace = service.metadata.namespace.as_deref()?;
                Some(format!("{namespace}/{}", service.name_any()))
            })
            .collect()
    }

    fn pool(&self, name: &str) -> Option<Arc<IPAddressPool>> {
        self.pool_resource(name)
            .map(|pool| Arc::new(to_subscriber(&pool)))
    }

    fn pool_names(&self) -> Vec<String> {
        // A name in two namespaces is one pool.
        sorted_names(&self.pools)
    }

    fn namespace(&self, name: &str) -> Option<Arc<Namespace>> {
        self.namespaces.get(&ObjectRef::new(name))
    }

    fn cilium_pool(&self, name: &str) -> Option<Arc<CiliumLoadBalancerIPPool>> {
        self.cilium_pool_resource(name)
            .map(|pool| Arc::new(cilium::to_subscriber(&pool)))
    }

    fn cilium_pool_names(&self) -> Vec<String> {
        sorted_names(&self.cilium_pools)
    }
}

/// The names of the objects in `store`, sorted, each once.
fn sorted_names<K: Resource<DynamicType = ()> + Clone + 'static>(
    store: &reflector::Store<K>,
) -> Vec<String> {
    let mut names: Vec<String> = store
        .state()
        .iter()
        .filter_map(|object| object.meta().name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::watcher::Event;
    use manager::Store;

    use super::*;

    fn meta(namespace: Option<&str>, name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: namespace.map(str::to_owned),
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn reads_by_key_and_name() {
        let (services, mut service_writer) = reflector::store::<Service>();
        let (pools, mut pool_writer) = reflector::store::<IPAddressPoolResource>();
        let (namespaces, mut namespace_writer) = reflector::store::<Namespace>();
        service_writer.apply_watcher_event(&Event::Apply(Service {
            metadata: meta(Some("ns"), "web"),
            ..Service::default()
        }));
        for namespace in ["b", "a"] {
            pool_writer.apply_watcher_event(&Event::Apply(IPAddressPoolResource {
                metadata: meta(Some(namespace), "p"),
                spec: crate::crd::PoolSpec::default(),
                status: None,
            }));
        }
        namespace_writer.apply_watcher_event(&Event::Apply(Namespace {
            metadata: meta(None, "ns"),
            ..Namespace::default()
        }));
        let store = KubeStore::new(services, pools, namespaces);
        assert!(store.service("ns/web").is_some());
        assert!(store.service("other/web").is_none());
        assert!(store.service("web").is_none());
        assert!(store.service("/web").is_none());
        assert_eq!(store.service_keys(), ["ns/web"]);
        assert_eq!(store.pool_names(), ["p"]);
        let pool = store.pool("p").unwrap();
        assert_eq!(pool.metadata.namespace.as_deref(), Some("a"));
        assert!(store.pool("q").is_none());
        assert!(store.namespace("ns").is_some());
        assert!(store.namespace("web").is_none());
        assert!(store.cilium_pool("blue").is_none());
        assert!(store.cilium_pool_names().is_empty());
    }

    #[test]
    fn reads_cilium_pools_by_name() {
        let (services, _) = reflector::store::<Service>();
        let (pools, _) = reflector::store::<IPAddressPoolResource>();
        let (namespaces, _) = reflector::store::<Namespace>();
        let (cilium, mut writer) = reflector::store::<CiliumPoolResource>();
        for name in ["red", "blue"] {
            writer.apply_watcher_event(&Event::Apply(CiliumPoolResource(
                subscriber::CiliumLoadBalancerIPPool {
                    metadata: meta(None, name),
                    ..Default::default()
                },
            )));
        }
        let store = KubeStore::new(services, pools, namespaces).with_cilium_pools(cilium);
        assert_eq!(store.cilium_pool_names(), ["blue", "red"]);
        let blue = store.cilium_pool("blue").unwrap();
        assert_eq!(blue.metadata.name.as_deref(), Some("blue"));
        assert!(store.cilium_pool("green").is_none());
        assert!(store.pool("blue").is_none(), "the kinds are stored apart");
    }
}
