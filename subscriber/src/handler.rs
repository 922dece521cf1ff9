//! The handler traits and the keys that identify the objects they handle.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::{Error, IPAddressPool};

/// Receives Service events. Implementations should be cheap (queue the work,
/// do no I/O): a chain calls its handlers one after the other.
#[async_trait]
pub trait ServiceHandler: Send + Sync {
    /// A Service appeared.
    async fn on_add_service(&self, service: &Service) -> Result<(), Error>;
    /// A Service changed from `old` to `new`.
    async fn on_update_service(&self, old: &Service, new: &Service) -> Result<(), Error>;
    /// A Service is gone; `service` is its last known state.
    async fn on_delete_service(&self, service: &Service) -> Result<(), Error>;
}

/// Receives `IPAddressPool` events; the same shape as [`ServiceHandler`].
#[async_trait]
pub trait PoolHandler: Send + Sync {
    /// A pool appeared.
    async fn on_add_pool(&self, pool: &IPAddressPool) -> Result<(), Error>;
    /// A pool changed from `old` to `new`.
    async fn on_update_pool(&self, old: &IPAddressPool, new: &IPAddressPool) -> Result<(), Error>;
    /// A pool is gone; `pool` is its last known state.
    async fn on_delete_pool(&self, pool: &IPAddressPool) -> Result<(), Error>;
}

/// Receives Namespace events; the same shape as [`ServiceHandler`].
#[async_trait]
pub trait NamespaceHandler: Send + Sync {
    /// A Namespace appeared.
    async fn on_add_namespace(&self, namespace: &Namespace) -> Result<(), Error>;
    /// A Namespace changed from `old` to `new`.
    async fn on_update_namespace(&self, old: &Namespace, new: &Namespace) -> Result<(), Error>;
    /// A Namespace is gone; `namespace` is its last known state.
    async fn on_delete_namespace(&self, namespace: &Namespace) -> Result<(), Error>;
}

/// The key of a Service, `namespace/name` as in client-go.
pub fn service_key(service: &Service) -> Result<String, Error> {
    let name = name_of(&service.metadata, "Service")?;
    match service.metadata.namespace.as_deref() {
        Some(namespace) if !namespace.is_empty() => Ok(format!("{namespace}/{name}")),
        _ => Err(Error::MissingNamespace {
            name: name.to_owned(),
        }),
    }
}

/// The name of a pool, its identity.
pub fn pool_name(pool: &IPAddressPool) -> Result<String, Error> {
    name_of(&pool.metadata, "IPAddressPool").map(str::to_owned)
}

/// The name of a Namespace.
pub fn namespace_name(namespace: &Namespace) -> Result<String, Error> {
    name_of(&namespace.metadata, "Namespace").map(str::to_owned)
}

fn name_of<'a>(metadata: &'a ObjectMeta, kind: &'static str) -> Result<&'a str, Error> {
    match metadata.name.as_deref() {
        Some(name) if !name.is_empty() => Ok(name),
        _ => Err(Error::MissingName { kind }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(namespace: Option<&str>, name: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
            ..ObjectMeta::default()
        }
    }

    fn service(namespace: Option<&str>, name: Option<&str>) -> Service {
        Service {
            metadata: meta(namespace, name),
            ..Service::default()
        }
    }

    #[test]
    fn service_key_is_namespace_slash_name() {
        assert_eq!(
            service_key(&service(Some("ns"), Some("web"))).unwrap(),
            "ns/web"
        );
    }

    #[test]
    fn service_without_name_or_namespace_has_no_key() {
        for name in [None, Some("")] {
            let error = service_key(&service(Some("ns"), name)).unwrap_err();
            assert!(
                matches!(error, Error::MissingName { kind: "Service" }),
                "{error}"
            );
        }
        for namespace in [None, Some("")] {
            let error = service_key(&service(namespace, Some("web"))).unwrap_err();
            assert!(matches!(&error, Error::MissingNamespace { name } if name == "web"));
            assert_eq!(
                error.to_string(),
                "Service \"web\" has no metadata.namespace, so it has no key"
            );
        }
    }

    #[test]
    fn pool_and_namespace_names() {
        let pool = IPAddressPool {
            metadata: meta(Some("metallb"), Some("p")),
            ..Default::default()
        };
        assert_eq!(pool_name(&pool).unwrap(), "p");
        let error = pool_name(&IPAddressPool::default()).unwrap_err();
        assert!(matches!(
            error,
            Error::MissingName {
                kind: "IPAddressPool"
            }
        ));

        let namespace = Namespace {
            metadata: meta(None, Some("ns")),
            ..Default::default()
        };
        assert_eq!(namespace_name(&namespace).unwrap(), "ns");
        let error = namespace_name(&Namespace::default()).unwrap_err();
        assert!(matches!(error, Error::MissingName { kind: "Namespace" }));
        assert_eq!(
            error.to_string(),
            "a Namespace without metadata.name has no key"
        );
    }
}
