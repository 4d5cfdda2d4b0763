//! Errors, each naming the watched object and the cause.
//!
//! A [`MonitorError`] is one pointer wide: the object it is about and the cause
//! ([`MonitorErrorKind`]) live in a box, as kube-runtime's controller boxes its error
//! context, so that `Result<_, MonitorError>` stays small on the hot paths that never
//! fail.
//!
//! Messages carry what the API server said (its `Status` message) and never object
//! contents, so they are safe to log for Secrets.

use std::fmt;
use std::time::Duration;

use kube_common::Verb;

use crate::ObjectKey;

/// Everything the monitor can fail with: which object, and why.
///
/// Cloneable: one failed first sync fails every caller that waited for it, and each of
/// them gets the same error.
#[derive(Clone, PartialEq, Eq)]
pub struct MonitorError {
    inner: Box<ErrorInner>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct ErrorInner {
    resource: String,
    key: ObjectKey,
    kind: MonitorErrorKind,
}

/// Why the monitor failed, for the object a [`MonitorError`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MonitorErrorKind {
    /// The handle does not name a registered handler (never registered, or removed).
    NotRegistered {
        /// The handler's id.
        handler: u64,
    },
    /// The object does not exist (the watch cache knows it is absent).
    NotFound,
    /// The first sync did not complete in time.
    SyncTimeout {
        /// The configured limit.
        timeout: Duration,
    },
    /// The API server refused the request (403).
    Forbidden {
        /// The refused verb (`list`, `watch`).
        verb: Verb,
        /// The API server's message.
        message: String,
    },
    /// The API server did not accept the client's credentials (401).
    Unauthorized {
        /// The verb.
        verb: Verb,
        /// The API server's message.
        message: String,
    },
    /// Any other error status from the API server.
    Api {
        /// The verb.
        verb: Verb,
        /// HTTP status code.
        code: u16,
        /// The Status reason (e.g. `TooManyRequests`), possibly empty.
        reason: String,
        /// The API server's message.
        message: String,
    },
    /// The request never got an answer: connection refused or reset, TLS, decoding.
    Transport {
        /// The verb.
        verb: Verb,
        /// What failed.
        message: String,
    },
    /// The monitor shut down before the registration completed.
    Cancelled,
}

impl MonitorError {
    /// An error about `key` of the plural `resource` (e.g. `secrets`).
    pub fn new(resource: impl Into<String>, key: ObjectKey, kind: MonitorErrorKind) -> Self {
        Self {
            inner: Box::new(ErrorInner {
                resource: resource.into(),
                key,
                kind,
            }),
        }
    }

    /// The plural resource name of the object, e.g. `secrets`.
    pub fn resource(&self) -> &str {
        &self.inner.resource
    }

    /// The key the error is about.
    pub fn key(&self) -> &ObjectKey {
        &self.inner.key
    }

    /// What went wrong.
    pub fn kind(&self) -> &MonitorErrorKind {
        &self.inner.kind
    }

    /// The verb of the request that failed, when a request failed.
    pub fn verb(&self) -> Option<Verb> {
        match &self.inner.kind {
            MonitorErrorKind::Forbidden { verb, .. }
            | MonitorErrorKind::Unauthorized { verb, .. }
            | MonitorErrorKind::Api { verb, .. }
            | MonitorErrorKind::Transport { verb, .. } => Some(*verb),
            _ => None,
        }
    }

    /// The HTTP status code behind the error, when the API server answered.
    pub fn status_code(&self) -> Option<u16> {
        match &self.inner.kind {
            MonitorErrorKind::Forbidden { .. } => Some(403),
            MonitorErrorKind::Unauthorized { .. } => Some(401),
            MonitorErrorKind::Api { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether retrying the same request later may succeed without anyone changing
    /// anything (throttling, server errors, broken connections, timeouts).
    pub fn is_transient(&self) -> bool {
        match &self.inner.kind {
            MonitorErrorKind::Api { code, .. } => *code == 429 || *code == 410 || *code >= 500,
            MonitorErrorKind::Transport { .. } | MonitorErrorKind::SyncTimeout { .. } => true,
            _ => false,
        }
    }
}

impl fmt::Display for MonitorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ErrorInner {
            resource,
            key,
            kind,
        } = &*self.inner;
        match kind {
            MonitorErrorKind::NotRegistered { handler } => {
                write!(
                    f,
                    "no handler #{handler} is registered for {resource} {key}"
                )
            }
            MonitorErrorKind::NotFound => write!(f, "{resource} {key} not found"),
            MonitorErrorKind::SyncTimeout { timeout } => write!(
                f,
                "first sync of {resource} {key} did not complete within {}",
                kube_common::duration::Display(*timeout)
            ),
            MonitorErrorKind::Forbidden { verb, message } => {
                write!(f, "forbidden: cannot {verb} {resource} {key}: {message}")
            }
            MonitorErrorKind::Unauthorized { verb, message } => {
                write!(f, "unauthorized to {verb} {resource} {key}: {message}")
            }
            MonitorErrorKind::Api {
                verb,
                code,
                reason,
                message,
            } => write!(
                f,
                "API error {code} {reason} on {verb} {resource} {key}: {message}"
            ),
            MonitorErrorKind::Transport { verb, message } => {
                write!(f, "transport error on {verb} {resource} {key}: {message}")
            }
            MonitorErrorKind::Cancelled => write!(
                f,
                "registration of {resource} {key} was cancelled: the monitor shut down"
            ),
        }
    }
}

impl fmt::Debug for MonitorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MonitorError")
            .field("resource", &self.inner.resource)
            .field("key", &self.inner.key)
            .field("kind", &self.inner.kind)
            .finish()
    }
}

impl std::error::Error for MonitorError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_is_one_pointer_wide() {
        assert_eq!(
            std::mem::size_of::<MonitorError>(),
            std::mem::size_of::<usize>()
        );
    }

    #[test]
    fn messages_name_the_object_verb_and_cause() {
        let error = MonitorError::new(
            "secrets",
            ObjectKey::new("team-a", "shop-tls"),
            MonitorErrorKind::Forbidden {
                verb: Verb::Watch,
                message: "no".into(),
            },
        );
        assert_eq!(
            error.to_string(),
            "forbidden: cannot watch secrets team-a/shop-tls: no"
        );
        assert_eq!(error.verb(), Some(Verb::Watch));
        assert_eq!(error.status_code(), Some(403));
        assert!(!error.is_transient());
    }
}
