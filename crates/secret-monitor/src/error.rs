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
use std::sync::Arc;
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
    /// The request never got a usable answer: connection refused or reset, TLS, a
    /// broken or undecodable response.
    Transport {
        /// The verb.
        verb: Verb,
        /// What failed.
        cause: TransportError,
    },
    /// The API server answered without a resourceVersion to watch from (a list
    /// without one, or the bookmark that ends a streaming list's initial events).
    NoResourceVersion {
        /// The verb.
        verb: Verb,
    },
    /// The monitor shut down before the registration completed.
    Cancelled,
}

/// Why a request got no usable answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The request could not be sent, or no response arrived (connection refused or
    /// reset, TLS, timeout).
    #[error("the request failed: {0}")]
    Request(#[source] SharedError),
    /// Reading the response body failed.
    #[error("reading the response failed: {0}")]
    Body(#[source] SharedError),
    /// The response could not be decoded. Described by position only: the decoder's
    /// own message may quote the value, which for a Secret could be its data.
    #[error("could not decode the response ({category:?} error at line {line}, column {column})")]
    Decode {
        /// What kind of decoding error.
        category: serde_json::error::Category,
        /// Where in the response.
        line: usize,
        /// Where in the line.
        column: usize,
    },
    /// A watch event longer than `max` bytes arrived.
    #[error("a watch event longer than {max} bytes arrived")]
    EventTooLong {
        /// The longest event read.
        max: usize,
    },
    /// The watch outlived its timeout without the server ending it.
    #[error("the watch outlived its timeout without the server ending it")]
    Stalled,
}

impl TransportError {
    /// A decoding error, by its position only.
    pub(crate) fn decode(error: &serde_json::Error) -> Self {
        Self::Decode {
            category: error.classify(),
            line: error.line(),
            column: error.column(),
        }
    }
}

/// An error shared by every clone of the [`MonitorError`] that carries it (one failed
/// first sync fails every caller waiting for it with the same error). Two are equal
/// when they are the same error, or say the same.
#[derive(Clone)]
pub struct SharedError(Arc<dyn std::error::Error + Send + Sync>);

impl SharedError {
    /// Shares `error`.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }

    /// Shares an error already boxed.
    pub fn from_boxed(error: Box<dyn std::error::Error + Send + Sync>) -> Self {
        Self(Arc::from(error))
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for SharedError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for SharedError {}

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
            | MonitorErrorKind::Transport { verb, .. }
            | MonitorErrorKind::NoResourceVersion { verb } => Some(*verb),
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
            MonitorErrorKind::Transport { .. }
            | MonitorErrorKind::NoResourceVersion { .. }
            | MonitorErrorKind::SyncTimeout { .. } => true,
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
            MonitorErrorKind::Transport { verb, cause } => {
                write!(f, "transport error on {verb} {resource} {key}: {cause}")
            }
            MonitorErrorKind::NoResourceVersion { verb } => write!(
                f,
                "the {verb} response for {resource} {key} carried no resourceVersion to watch from"
            ),
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

impl std::error::Error for MonitorError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.inner.kind {
            MonitorErrorKind::Transport { cause, .. } => Some(cause),
            _ => None,
        }
    }
}

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
    fn a_transport_error_keeps_its_source_and_a_missing_version_no_made_up_code() {
        let key = || ObjectKey::new("team-a", "shop-tls");
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let error = MonitorError::new(
            "secrets",
            key(),
            MonitorErrorKind::Transport {
                verb: Verb::Watch,
                cause: TransportError::Body(SharedError::new(reset)),
            },
        );
        let cause = std::error::Error::source(&error).expect("the transport error");
        let io = std::error::Error::source(cause).expect("the I/O error");
        assert_eq!(io.to_string(), "connection reset");
        assert_eq!(error.status_code(), None);
        assert!(error.is_transient());
        let no_version = MonitorError::new(
            "secrets",
            key(),
            MonitorErrorKind::NoResourceVersion { verb: Verb::List },
        );
        assert_eq!(no_version.status_code(), None);
        assert!(no_version.is_transient());
        assert_eq!(
            no_version.to_string(),
            "the list response for secrets team-a/shop-tls carried no resourceVersion to watch from"
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
