//! What the controller writes: a Service's status and pool annotation, and
//! Kubernetes Events. The host implements [`Client`] over its API.

use std::fmt;
use std::net::IpAddr;

use async_trait::async_trait;

/// The annotation that names the pool a Service's addresses came from.
pub const POOL_ANNOTATION: &str = "metallb.io/ip-allocated-from-pool";

/// The fields of a Service that the controller owns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceWrite {
    /// `status.loadBalancer.ingress[].ip`, IPv4 first; empty clears it.
    pub ingress: Vec<IpAddr>,
    /// The `metallb.io/ip-allocated-from-pool` annotation; `None` removes it.
    pub pool: Option<String>,
}

/// `Normal` or `Warning`, as Kubernetes Events have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    /// The name Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Kubernetes Event about one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub event_type: EventType,
    /// CamelCase reason, e.g. `IPAllocated`.
    pub reason: String,
    pub message: String,
}

/// A write the host could not make.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The object changed under the write (HTTP 409): retry with a fresh read.
    #[error("conflict writing {key}: {message}")]
    Conflict { key: String, message: String },
    /// The object is gone.
    #[error("{key} not found")]
    NotFound { key: String },
    /// Anything else the host reports.
    #[error("writing {key} failed: {message}")]
    Failed { key: String, message: String },
}

/// Writes Service status and annotations, and emits Events.
#[async_trait]
pub trait Client: Send + Sync + 'static {
    /// Sets `status.loadBalancer.ingress` and the pool annotation of the
    /// Service `key` (`namespace/name`), touching nothing else.
    async fn write_service(&self, key: &str, write: &ServiceWrite) -> Result<(), ClientError>;
    /// Emits an Event on the Service `key`.
    async fn emit_event(&self, key: &str, event: &Event) -> Result<(), ClientError>;
}
