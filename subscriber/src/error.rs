//! The errors handlers and chains return.

use std::fmt;

/// A handler could not take an event.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object has no `metadata.name` (or an empty one), so it has no key.
    #[error("a {kind} without metadata.name has no key")]
    MissingName {
        /// The object's kind, e.g. `Service`.
        kind: &'static str,
    },
    /// The Service has no `metadata.namespace` (or an empty one), so it has
    /// no `namespace/name` key.
    #[error("Service {name:?} has no metadata.namespace, so it has no key")]
    MissingNamespace {
        /// The Service's name.
        name: String,
    },
    /// A handler's own failure (for handlers outside this workspace).
    #[error("handler {handler:?} failed: {message}")]
    Handler {
        /// The failing handler's name.
        handler: String,
        /// What went wrong.
        message: String,
    },
    /// One or more handlers of a chain failed.
    #[error(transparent)]
    Chain(#[from] ChainError),
}

/// Every failure of one event fanned out by a chain, in registration order.
#[derive(Debug)]
pub struct ChainError {
    /// `(registration index, handler name, error)` of each failing handler.
    pub failures: Vec<(usize, String, Error)>,
}

impl fmt::Display for ChainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} handler(s) failed", self.failures.len())?;
        for (index, handler, error) in &self.failures {
            write!(f, "; #{index} {handler:?}: {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ChainError {}
