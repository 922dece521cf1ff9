//! The one handler shape, and the keys that identify the objects it handles.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::{CiliumLoadBalancerIPPool, Error, IPAddressPool};

/// Receives the events of one kind `K` (a Service, a pool, a Namespace):
/// the same three calls for every kind, as a watch delivers them.
/// Implementations should be cheap (queue the work, do no I/O): a chain
/// calls its handlers one after the other.
#[async_trait]
pub trait Handler<K: Send + Sync + 'static>: Send + Sync {
    /// An object appeared.
    async fn on_add(&self, object: &K) -> Result<(), Error>;
    /// An object changed from `old` to `new`.
    async fn on_update(&self, old: &K, new: &K) -> Result<(), Error>;
    /// An object is gone; `object` is its last known state.
    async fn on_delete(&self, object: &K) -> Result<(), Error>;
}

/// A kind whose objects have a key, the name handlers know them by. The key
/// is the name unless the kind says otherwise (a Service's is
/// `namespace/name`); an object without one is an error, never a panic.
pub trait Keyed {
    /// The kind, as errors name it (e.g. `Service`).
    const KIND: &'static str;

    /// The object's metadata.
    fn metadata(&self) -> &ObjectMeta;

    /// The object's key: its `metadata.name` by default.
    fn key(&self) -> Result<String, Error> {
        name_of(self.metadata(), Self::KIND).map(str::to_owned)
    }
}

/// Keyed `namespace/name`, as in client-go.
impl Keyed for Service {
    const KIND: &'static str = "Service";

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn key(&self) -> Result<String, Error> {
        let name = name_of(&self.metadata, Self::KIND)?;
        match self.metadata.namespace.as_deref() {
            // Not `format!`: a key is built on every event, and this is one
            // copy where the formatter's machinery costs ten.
            Some(namespace) if !namespace.is_empty() => Ok([namespace, "/", name].concat()),
            _ => Err(Error::MissingNamespace {
                name: name.to_owned(),
            }),
        }
    }
}

/// Keyed by name: the namespace a pool lives in does not matter.
impl Keyed for IPAddressPool {
    const KIND: &'static str = "IPAddressPool";

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
}

/// Keyed by name: cluster-scoped, and one name space with `IPAddressPool`s
/// (docs/cilium.md §2.6).
impl Keyed for CiliumLoadBalancerIPPool {
    const KIND: &'static str = "CiliumLoadBalancerIPPool";

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
}

impl Keyed for Namespace {
    const KIND: &'static str = "Namespace";

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
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
        assert_eq!(service(Some("ns"), Some("web")).key().unwrap(), "ns/web");
    }

    #[test]
    fn service_without_name_or_namespace_has_no_key() {
        for name in [None, Some("")] {
            let error = service(Some("ns"), name).key().unwrap_err();
            assert!(
                matches!(error, Error::MissingName { kind: "Service" }),
                "{error}"
            );
        }
        for namespace in [None, Some("")] {
            let error = service(namespace, Some("web")).key().unwrap_err();
            assert!(matches!(&error, Error::MissingNamespace { name } if name == "web"));
            assert_eq!(
                error.to_string(),
                "Service \"web\" has no metadata.namespace, so it has no key"
            );
        }
    }

    #[test]
    fn pool_and_namespace_keys_are_their_names() {
        let pool = IPAddressPool {
            metadata: meta(Some("metallb"), Some("p")),
            ..Default::default()
        };
        assert_eq!(pool.key().unwrap(), "p");
        let error = IPAddressPool::default().key().unwrap_err();
        assert!(matches!(
            error,
            Error::MissingName {
                kind: "IPAddressPool"
            }
        ));

        let cilium = CiliumLoadBalancerIPPool {
            metadata: meta(None, Some("blue")),
            ..Default::default()
        };
        assert_eq!(cilium.key().unwrap(), "blue");
        let error = CiliumLoadBalancerIPPool::default().key().unwrap_err();
        assert_eq!(
            error.to_string(),
            "a CiliumLoadBalancerIPPool without metadata.name has no key"
        );

        let namespace = Namespace {
            metadata: meta(None, Some("ns")),
            ..Default::default()
        };
        assert_eq!(namespace.key().unwrap(), "ns");
        let error = Namespace::default().key().unwrap_err();
        assert!(matches!(error, Error::MissingName { kind: "Namespace" }));
        assert_eq!(
            error.to_string(),
            "a Namespace without metadata.name has no key"
        );
    }
}
