//! Errors, each naming the watched object and the cause.
//!
//! Messages carry what the API server said (its `Status` message) and never object
//! contents, so they are safe to log for Secrets.

use std::time::Duration;

use crate::ObjectKey;

/// Everything the monitor can fail with.
///
/// Cloneable: one failed first sync fails every caller that waited for it, and each of
/// them gets the same error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MonitorError {
    /// The handle does not name a registered handler (never registered, or removed).
    #[error("no handler #{handler} is registered for {resource} {key}")]
    NotRegistered {
        /// Plural resource name, e.g. `secrets`.
        resource: String,
        /// The key the handle was for.
        key: ObjectKey,
        /// The handler's id.
        handler: u64,
    },

    /// The object does not exist (the watch cache knows it is absent).
    #[error("{resource} {key} not found")]
    NotFound {
        /// Plural resource name.
        resource: String,
        /// The missing object.
        key: ObjectKey,
    },

    /// The first sync did not complete in time.
    #[error("first sync of {resource} {key} did not complete within {timeout:?}")]
    SyncTimeout {
        /// Plural resource name.
        resource: String,
        /// The object being synced.
        key: ObjectKey,
        /// The configured limit.
        timeout: Duration,
    },

    /// The API server refused the request (403).
    #[error("forbidden: cannot {verb} {resource} {key}: {message}")]
    Forbidden {
        /// Plural resource name.
        resource: String,
        /// The object.
        key: ObjectKey,
        /// The refused verb (`list`, `watch`).
        verb: String,
        /// The API server's message.
        message: String,
    },

    /// The API server did not accept the client's credentials (401).
    #[error("unauthorized to {verb} {resource} {key}: {message}")]
    Unauthorized {
        /// Plural resource name.
        resource: String,
        /// The object.
        key: ObjectKey,
        /// The verb.
        verb: String,
        /// The API server's message.
        message: String,
    },

    /// Any other error status from the API server.
    #[error("API error {code} {reason} on {verb} {resource} {key}: {message}")]
    Api {
        /// Plural resource name.
        resource: String,
        /// The object.
        key: ObjectKey,
        /// The verb.
        verb: String,
        /// HTTP status code.
        code: u16,
        /// The Status reason (e.g. `TooManyRequests`), possibly empty.
        reason: String,
        /// The API server's message.
        message: String,
    },

    /// The request never got an answer: connection refused or reset, TLS, decoding.
    #[error("transport error on {verb} {resource} {key}: {message}")]
    Transport {
        /// Plural resource name.
        resource: String,
        /// The object.
        key: ObjectKey,
        /// The verb.
        verb: String,
        /// What failed.
        message: String,
    },

    /// The monitor shut down before the registration completed.
    #[error("registration of {resource} {key} was cancelled: the monitor shut down")]
    Cancelled {
        /// Plural resource name.
        resource: String,
        /// The object.
        key: ObjectKey,
    },
}

impl MonitorError {
    /// The key the error is about.
    pub fn key(&self) -> &ObjectKey {
        match self {
            Self::NotRegistered { key, .. }
            | Self::NotFound { key, .. }
            | Self::SyncTimeout { key, .. }
            | Self::Forbidden { key, .. }
            | Self::Unauthorized { key, .. }
            | Self::Api { key, .. }
            | Self::Transport { key, .. }
            | Self::Cancelled { key, .. } => key,
        }
    }

    /// The HTTP status code behind the error, when the API server answered.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            Self::Forbidden { .. } => Some(403),
            Self::Unauthorized { .. } => Some(401),
            Self::Api { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether retrying the same request later may succeed without anyone changing
    /// anything (throttling, server errors, broken connections, timeouts).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Api { code, .. } => *code == 429 || *code == 410 || *code >= 500,
            Self::Transport { .. } | Self::SyncTimeout { .. } => true,
            _ => false,
        }
    }
}
