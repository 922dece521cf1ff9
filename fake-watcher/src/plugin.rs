//! The plugin wired as a host wires it: the [`ReplayStore`] as the shared
//! cache, the [`MemoryClient`], the controller, and the manager registered
//! on the Service, pool and Namespace chains with its worker running. The
//! replay drives it line by line; the benchmarks drive it directly.

use std::sync::Arc;

use manager::{AllocatingController, Client, ControllerConfig, Manager, Store};
use subscriber::{
    NamespaceChain, NamespaceHandler, PoolChain, PoolHandler, ServiceChain, ServiceHandler,
};
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
    services: Arc<ServiceChain>,
    pools: PoolChain,
    namespaces: NamespaceChain,
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
        let mut services = ServiceChain::new();
        services.register("manager", Arc::clone(&handler) as Arc<dyn ServiceHandler>);
        let mut pools = PoolChain::new();
        pools.register("manager", Arc::clone(&handler) as Arc<dyn PoolHandler>);
        let mut namespaces = NamespaceChain::new();
        namespaces.register("manager", handler as Arc<dyn NamespaceHandler>);
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
            namespaces,
            cancel,
            worker: Some(worker),
        }
    }

    /// Delivers a store change to the chain of its kind, as a watch would.
    pub async fn deliver(&self, change: &Change) -> Result<(), subscriber::Error> {
        match change {
            Change::Service(delta) => match delta {
                Delta::Added(new) => self.services.on_add_service(new).await,
                Delta::Updated { old, new } => self.services.on_update_service(old, new).await,
                Delta::Deleted(old) => self.services.on_delete_service(old).await,
                Delta::Unchanged => Ok(()),
            },
            Change::Pool(delta) => match delta {
                Delta::Added(new) => self.pools.on_add_pool(new).await,
                Delta::Updated { old, new } => self.pools.on_update_pool(old, new).await,
                Delta::Deleted(old) => self.pools.on_delete_pool(old).await,
                Delta::Unchanged => Ok(()),
            },
            Change::Namespace(delta) => match delta {
                Delta::Added(new) => self.namespaces.on_add_namespace(new).await,
                Delta::Updated { old, new } => self.namespaces.on_update_namespace(old, new).await,
                Delta::Deleted(old) => self.namespaces.on_delete_namespace(old).await,
                Delta::Unchanged => Ok(()),
            },
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
