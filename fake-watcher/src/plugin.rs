//! The plugin wired as a host wires it: the [`ReplayStore`] as the shared
//! cache, the [`MemoryClient`], the controller, and the manager registered
//! on the Service, pool (both kinds) and Namespace chains with its worker running. The
//! replay drives it line by line; the benchmarks drive it directly.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Service};
use manager::{AllocatingController, Client, ControllerConfig, Manager, Store};
use subscriber::{Chain, CiliumLoadBalancerIPPool, Handler, IPAddressPool};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::client::MemoryClient;
use crate::replay::ReplayOptions;
use crate::store::{Change, Delta, ReplayStore};

/// Why [`Plugin::idle`] gave up waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotIdle {
    /// The client refused a write past its limit
    /// ([`MemoryClient::limit_attempts`]): the controller does not converge.
    Overrun,
    /// The manager's worker stopped (it panicked, or was cancelled).
    Stopped(String),
}

/// See the module documentation. Dropping it cancels the worker.
pub struct Plugin {
    pub store: Arc<ReplayStore>,
    pub client: Arc<MemoryClient>,
    pub controller: Arc<AllocatingController>,
    pub manager: Manager<AllocatingController>,
    services: Arc<Chain<Service>>,
    pools: Chain<IPAddressPool>,
    cilium_pools: Chain<CiliumLoadBalancerIPPool>,
    namespaces: Chain<Namespace>,
    cancel: CancellationToken,
    /// `None` once joined.
    worker: Option<JoinHandle<()>>,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Plugin {
    /// Builds everything as `options` says (class, failures, retry timing,
    /// exhaustive mode) and starts the manager's worker on the current tokio
    /// runtime.
    pub fn start(options: &ReplayOptions) -> Self {
        let store = Arc::new(ReplayStore::new());
        let cache = store.cache();
        let client = Arc::new(MemoryClient::new(Arc::clone(&store), options.failures));
        if !options.trace {
            client.forget_writes();
        }
        let config = ControllerConfig {
            lb_class: options.lb_class.clone(),
            exhaustive: options.exhaustive,
            without_conditions: options.without_conditions,
            ..ControllerConfig::default()
        };
        let controller = Arc::new(AllocatingController::new(
            Arc::clone(&cache) as Arc<dyn Store>,
            Arc::clone(&client) as Arc<dyn Client>,
            config,
        ));
        let manager = Manager::new(
            cache as Arc<dyn Store>,
            Arc::clone(&controller),
            options.manager.clone(),
        );
        let handler = Arc::new(manager.clone());
        let mut services = Chain::new();
        services.register("manager", Arc::clone(&handler) as Arc<dyn Handler<_>>);
        let mut pools = Chain::new();
        pools.register("manager", Arc::clone(&handler) as Arc<dyn Handler<_>>);
        let mut cilium_pools = Chain::new();
        cilium_pools.register("manager", Arc::clone(&handler) as Arc<dyn Handler<_>>);
        let mut namespaces = Chain::new();
        namespaces.register("manager", handler as Arc<dyn Handler<_>>);
        let services = Arc::new(services);
        client.deliver_to(&services);
        let cancel = CancellationToken::new();
        let worker = manager.start(cancel.clone());
        Self {
            store,
            client,
            controller,
            manager,
            services,
            pools,
            cilium_pools,
            namespaces,
            cancel,
            worker: Some(worker),
        }
    }

    /// Delivers a store change to the chain of its kind, as a watch would.
    pub async fn deliver(&self, change: &Change) -> Result<(), subscriber::Error> {
        match change {
            Change::Service(delta) => deliver(self.services.as_ref(), delta).await,
            Change::Pool(delta) => deliver(&self.pools, delta).await,
            Change::CiliumPool(delta) => deliver(&self.cilium_pools, delta).await,
            Change::Namespace(delta) => deliver(&self.namespaces, delta).await,
            Change::None => Ok(()),
        }
    }

    /// Waits until the manager is idle, or until the client refused a write
    /// past its limit or the worker stopped.
    pub async fn idle(&mut self) -> Result<(), NotIdle> {
        let Some(worker) = self.worker.as_mut() else {
            return Err(NotIdle::Stopped("it is not running".to_owned()));
        };
        let joined = tokio::select! {
            () = self.manager.idle() => return Ok(()),
            () = self.client.overrun() => return Err(NotIdle::Overrun),
            joined = worker => joined,
        };
        self.worker = None;
        Err(NotIdle::Stopped(match joined {
            Ok(()) => "it returned".to_owned(),
            Err(error) => error.to_string(),
        }))
    }

    /// The token that stops the worker (after the key in flight).
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Stops the worker and waits for it; fails if it had panicked.
    pub async fn stop(&mut self) -> Result<(), String> {
        self.cancel.cancel();
        match self.worker.take() {
            Some(worker) => worker.await.map_err(|error| error.to_string()),
            None => Ok(()),
        }
    }
}

/// One store change of kind `K` as the handler call a watch would make.
async fn deliver<K: Send + Sync + 'static>(
    handler: &impl Handler<K>,
    delta: &Delta<K>,
) -> Result<(), subscriber::Error> {
    match delta {
        Delta::Added(new) => handler.on_add(new).await,
        Delta::Updated { old, new } => handler.on_update(old, new).await,
        Delta::Deleted(old) => handler.on_delete(old).await,
        Delta::Unchanged => Ok(()),
    }
}
