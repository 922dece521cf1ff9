//! Fan-out of one event to many handlers.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, Service};

use crate::{ChainError, Error, IPAddressPool, NamespaceHandler, PoolHandler, ServiceHandler};

/// A list of named handlers that is itself a handler: each event is passed to
/// every handler in registration order, one at a time. A failing handler does
/// not stop the others; the chain returns one [`Error::Chain`] that lists
/// every failure with the handler's registration index and name. A chain can
/// be registered in another chain.
pub struct Chain<H: ?Sized> {
    handlers: Vec<(String, Arc<H>)>,
}

/// A chain of [`ServiceHandler`]s.
pub type ServiceChain = Chain<dyn ServiceHandler>;
/// A chain of [`PoolHandler`]s.
pub type PoolChain = Chain<dyn PoolHandler>;
/// A chain of [`NamespaceHandler`]s.
pub type NamespaceChain = Chain<dyn NamespaceHandler>;

impl<H: ?Sized> Chain<H> {
    pub fn new() -> Self {
        Self {
            handlers: Vec::new(),
        }
    }

    /// Adds `handler` at the end; `name` identifies it in errors.
    pub fn register(&mut self, name: impl Into<String>, handler: Arc<H>) {
        self.handlers.push((name.into(), handler));
    }

    pub fn len(&self) -> usize {
        self.handlers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }

    async fn fan_out<'a, F, Fut>(&'a self, call: F) -> Result<(), Error>
    where
        F: Fn(&'a H) -> Fut,
        Fut: Future<Output = Result<(), Error>>,
    {
        let mut failures = Vec::new();
        for (index, (name, handler)) in self.handlers.iter().enumerate() {
            if let Err(error) = call(handler).await {
                failures.push((index, name.clone(), error));
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(ChainError { failures }.into())
        }
    }
}

impl<H: ?Sized> Default for Chain<H> {
    fn default() -> Self {
        Self::new()
    }
}

impl<H: ?Sized> fmt::Debug for Chain<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.handlers.iter().map(|(name, _)| name))
            .finish()
    }
}

#[async_trait]
impl ServiceHandler for ServiceChain {
    async fn on_add_service(&self, service: &Service) -> Result<(), Error> {
        self.fan_out(|h| h.on_add_service(service)).await
    }
    async fn on_update_service(&self, old: &Service, new: &Service) -> Result<(), Error> {
        self.fan_out(|h| h.on_update_service(old, new)).await
    }
    async fn on_delete_service(&self, service: &Service) -> Result<(), Error> {
        self.fan_out(|h| h.on_delete_service(service)).await
    }
}

#[async_trait]
impl PoolHandler for PoolChain {
    async fn on_add_pool(&self, pool: &IPAddressPool) -> Result<(), Error> {
        self.fan_out(|h| h.on_add_pool(pool)).await
    }
    async fn on_update_pool(&self, old: &IPAddressPool, new: &IPAddressPool) -> Result<(), Error> {
        self.fan_out(|h| h.on_update_pool(old, new)).await
    }
    async fn on_delete_pool(&self, pool: &IPAddressPool) -> Result<(), Error> {
        self.fan_out(|h| h.on_delete_pool(pool)).await
    }
}

#[async_trait]
impl NamespaceHandler for NamespaceChain {
    async fn on_add_namespace(&self, namespace: &Namespace) -> Result<(), Error> {
        self.fan_out(|h| h.on_add_namespace(namespace)).await
    }
    async fn on_update_namespace(&self, old: &Namespace, new: &Namespace) -> Result<(), Error> {
        self.fan_out(|h| h.on_update_namespace(old, new)).await
    }
    async fn on_delete_namespace(&self, namespace: &Namespace) -> Result<(), Error> {
        self.fan_out(|h| h.on_delete_namespace(namespace)).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::{namespace_name, pool_name, service_key};

    /// Records `name:event:key` into a shared log; fails when `fail` is set.
    struct Recorder {
        name: &'static str,
        fail: bool,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl Recorder {
        fn record(&self, event: &str, key: Result<String, Error>) -> Result<(), Error> {
            let key = key?;
            self.log
                .lock()
                .unwrap()
                .push(format!("{}:{event}:{key}", self.name));
            if self.fail {
                return Err(Error::Handler {
                    handler: self.name.to_owned(),
                    message: format!("cannot {event} {key}"),
                });
            }
            Ok(())
        }
    }

    #[async_trait]
    impl ServiceHandler for Recorder {
        async fn on_add_service(&self, s: &Service) -> Result<(), Error> {
            self.record("add", service_key(s))
        }
        async fn on_update_service(&self, _: &Service, s: &Service) -> Result<(), Error> {
            self.record("update", service_key(s))
        }
        async fn on_delete_service(&self, s: &Service) -> Result<(), Error> {
            self.record("delete", service_key(s))
        }
    }

    #[async_trait]
    impl PoolHandler for Recorder {
        async fn on_add_pool(&self, p: &IPAddressPool) -> Result<(), Error> {
            self.record("add", pool_name(p))
        }
        async fn on_update_pool(&self, _: &IPAddressPool, p: &IPAddressPool) -> Result<(), Error> {
            self.record("update", pool_name(p))
        }
        async fn on_delete_pool(&self, p: &IPAddressPool) -> Result<(), Error> {
            self.record("delete", pool_name(p))
        }
    }

    #[async_trait]
    impl NamespaceHandler for Recorder {
        async fn on_add_namespace(&self, n: &Namespace) -> Result<(), Error> {
            self.record("add", namespace_name(n))
        }
        async fn on_update_namespace(&self, _: &Namespace, n: &Namespace) -> Result<(), Error> {
            self.record("update", namespace_name(n))
        }
        async fn on_delete_namespace(&self, n: &Namespace) -> Result<(), Error> {
            self.record("delete", namespace_name(n))
        }
    }

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some("ns".to_owned()),
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        }
    }

    /// Three recorders `a`, `b`, `c` sharing one log; those in `failing` fail.
    fn recorders(failing: &[&str]) -> (Vec<Arc<Recorder>>, Arc<Mutex<Vec<String>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let recorders = ["a", "b", "c"]
            .into_iter()
            .map(|name| {
                let fail = failing.contains(&name);
                Arc::new(Recorder {
                    name,
                    fail,
                    log: Arc::clone(&log),
                })
            })
            .collect();
        (recorders, log)
    }

    fn service_chain(failing: &[&str]) -> (ServiceChain, Arc<Mutex<Vec<String>>>) {
        let (recorders, log) = recorders(failing);
        let mut chain = ServiceChain::new();
        for recorder in recorders {
            chain.register(recorder.name, recorder);
        }
        (chain, log)
    }

    #[tokio::test]
    async fn calls_every_handler_in_registration_order() {
        let (chain, log) = service_chain(&[]);
        assert_eq!(chain.len(), 3);
        let service = Service {
            metadata: meta("web"),
            ..Service::default()
        };
        chain.on_add_service(&service).await.unwrap();
        chain.on_update_service(&service, &service).await.unwrap();
        chain.on_delete_service(&service).await.unwrap();
        let expected: Vec<String> = ["add", "update", "delete"]
            .iter()
            .flat_map(|event| ["a", "b", "c"].map(|h| format!("{h}:{event}:ns/web")))
            .collect();
        assert_eq!(*log.lock().unwrap(), expected);
    }

    #[tokio::test]
    async fn a_failure_stops_no_one_and_every_failure_is_reported() {
        let (chain, log) = service_chain(&["a", "c"]);
        let service = Service {
            metadata: meta("web"),
            ..Service::default()
        };
        let error = chain.on_add_service(&service).await.unwrap_err();
        assert_eq!(
            *log.lock().unwrap(),
            ["a:add:ns/web", "b:add:ns/web", "c:add:ns/web"]
        );
        let Error::Chain(chain_error) = &error else {
            panic!("not a chain error: {error}")
        };
        let failed: Vec<_> = chain_error
            .failures
            .iter()
            .map(|(i, h, _)| (*i, h.as_str()))
            .collect();
        assert_eq!(failed, [(0, "a"), (2, "c")]);
        assert_eq!(
            error.to_string(),
            "2 handler(s) failed; #0 \"a\": handler \"a\" failed: cannot add ns/web; \
             #2 \"c\": handler \"c\" failed: cannot add ns/web"
        );
    }

    #[tokio::test]
    async fn bad_metadata_is_an_error_of_each_handler() {
        let (chain, log) = service_chain(&[]);
        let error = chain.on_add_service(&Service::default()).await.unwrap_err();
        let Error::Chain(chain_error) = error else {
            panic!("not a chain error")
        };
        assert_eq!(chain_error.failures.len(), 3);
        assert!(matches!(
            chain_error.failures[1].2,
            Error::MissingName { kind: "Service" }
        ));
        assert!(log.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn pool_and_namespace_chains_fan_out_and_nest() {
        let (recorders, log) = recorders(&["b"]);
        let mut pools = PoolChain::new();
        let mut namespaces = NamespaceChain::default();
        assert!(pools.is_empty() && namespaces.is_empty());
        for recorder in &recorders {
            pools.register(recorder.name, Arc::clone(recorder) as Arc<dyn PoolHandler>);
            namespaces.register(
                recorder.name,
                Arc::clone(recorder) as Arc<dyn NamespaceHandler>,
            );
        }
        let mut outer = PoolChain::new();
        outer.register("inner", Arc::new(pools));
        let pool = IPAddressPool {
            metadata: meta("p"),
            ..IPAddressPool::default()
        };
        let error = outer.on_update_pool(&pool, &pool).await.unwrap_err();
        assert!(error
            .to_string()
            .starts_with("1 handler(s) failed; #0 \"inner\": 1 handler(s)"));
        let namespace = Namespace {
            metadata: meta("n"),
            ..Namespace::default()
        };
        assert!(namespaces.on_delete_namespace(&namespace).await.is_err());
        assert_eq!(
            *log.lock().unwrap(),
            [
                "a:update:p",
                "b:update:p",
                "c:update:p",
                "a:delete:n",
                "b:delete:n",
                "c:delete:n"
            ]
        );
    }
}
