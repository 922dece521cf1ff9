//! Fan-out of one event to many handlers.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use crate::{ChainError, Error, Handler};

/// A list of named handlers of one kind `K` that is itself a handler: each
/// event is passed to every handler in registration order, one at a time. A
/// failing handler does not stop the others; the chain returns one
/// [`Error::Chain`] that lists every failure with the handler's registration
/// index and name. A chain can be registered in another chain.
pub struct Chain<K: Send + Sync + 'static> {
    handlers: Vec<(String, Arc<dyn Handler<K>>)>,
}

impl<K: Send + Sync + 'static> Chain<K> {
    pub fn new() -> Self {
        Self {
            handlers: Vec::new(),
        }
    }

    /// Adds `handler` at the end; `name` identifies it in errors.
    pub fn register(&mut self, name: impl Into<String>, handler: Arc<dyn Handler<K>>) {
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
        F: Fn(&'a dyn Handler<K>) -> Fut,
        Fut: Future<Output = Result<(), Error>>,
    {
        let mut failures = Vec::new();
        for (index, (name, handler)) in self.handlers.iter().enumerate() {
            if let Err(error) = call(handler.as_ref()).await {
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

impl<K: Send + Sync + 'static> Default for Chain<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Send + Sync + 'static> fmt::Debug for Chain<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.handlers.iter().map(|(name, _)| name))
            .finish()
    }
}

#[async_trait]
impl<K: Send + Sync + 'static> Handler<K> for Chain<K> {
    async fn on_add(&self, object: &K) -> Result<(), Error> {
        self.fan_out(|h| h.on_add(object)).await
    }
    async fn on_update(&self, old: &K, new: &K) -> Result<(), Error> {
        self.fan_out(|h| h.on_update(old, new)).await
    }
    async fn on_delete(&self, object: &K) -> Result<(), Error> {
        self.fan_out(|h| h.on_delete(object)).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::{Namespace, Service};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::{IPAddressPool, Keyed};

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
    impl<K: Keyed + Send + Sync + 'static> Handler<K> for Recorder {
        async fn on_add(&self, object: &K) -> Result<(), Error> {
            self.record("add", object.key())
        }
        async fn on_update(&self, _: &K, new: &K) -> Result<(), Error> {
            self.record("update", new.key())
        }
        async fn on_delete(&self, object: &K) -> Result<(), Error> {
            self.record("delete", object.key())
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

    fn chain<K: Keyed + Send + Sync + 'static>(
        failing: &[&str],
    ) -> (Chain<K>, Arc<Mutex<Vec<String>>>) {
        let (recorders, log) = recorders(failing);
        let mut chain = Chain::new();
        for recorder in recorders {
            chain.register(recorder.name, recorder);
        }
        (chain, log)
    }

    #[tokio::test]
    async fn calls_every_handler_in_registration_order() {
        let (chain, log) = chain::<Service>(&[]);
        assert_eq!(chain.len(), 3);
        let service = Service {
            metadata: meta("web"),
            ..Service::default()
        };
        chain.on_add(&service).await.unwrap();
        chain.on_update(&service, &service).await.unwrap();
        chain.on_delete(&service).await.unwrap();
        let expected: Vec<String> = ["add", "update", "delete"]
            .iter()
            .flat_map(|event| ["a", "b", "c"].map(|h| format!("{h}:{event}:ns/web")))
            .collect();
        assert_eq!(*log.lock().unwrap(), expected);
    }

    #[tokio::test]
    async fn a_failure_stops_no_one_and_every_failure_is_reported() {
        let (chain, log) = chain::<Service>(&["a", "c"]);
        let service = Service {
            metadata: meta("web"),
            ..Service::default()
        };
        let error = chain.on_add(&service).await.unwrap_err();
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
        let (chain, log) = chain::<Service>(&[]);
        let error = chain.on_add(&Service::default()).await.unwrap_err();
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
        let mut pools = Chain::<IPAddressPool>::new();
        let mut namespaces = Chain::<Namespace>::default();
        assert!(pools.is_empty() && namespaces.is_empty());
        for recorder in &recorders {
            pools.register(recorder.name, Arc::clone(recorder) as Arc<dyn Handler<_>>);
            namespaces.register(recorder.name, Arc::clone(recorder) as Arc<dyn Handler<_>>);
        }
        let mut outer = Chain::new();
        outer.register("inner", Arc::new(pools));
        let pool = IPAddressPool {
            metadata: meta("p"),
            ..IPAddressPool::default()
        };
        let error = outer.on_update(&pool, &pool).await.unwrap_err();
        assert!(error
            .to_string()
            .starts_with("1 handler(s) failed; #0 \"inner\": 1 handler(s)"));
        let namespace = Namespace {
            metadata: meta("n"),
            ..Namespace::default()
        };
        assert!(namespaces.on_delete(&namespace).await.is_err());
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
