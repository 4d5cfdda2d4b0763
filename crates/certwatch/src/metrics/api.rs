//! The Kubernetes API: every request, the failures, the open connections.
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_api_errors_total` | counter | `source`, `code` | failed API requests: HTTP code, or `transport`/`timeout` |
//! | `certwatch_api_connections` | gauge | `protocol` | open connections to the API server |
//! | `certwatch_api_requests_total` | counter | `resource`, `verb`, `code` | every API request by resource (with subresource), verb (as kube-apiserver names it) and HTTP code (`none`: no response), 429s included |
//! | `certwatch_api_retries_total` | counter | `resource`, `verb` | of those, requests that were retries |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use secret_monitor::{MonitorError, MonitorErrorKind};

use super::clamp;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiErrorLabels {
    source: &'static str,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    resource: String,
    verb: &'static str,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RetryLabels {
    resource: String,
    verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabels {
    protocol: &'static str,
}

/// Kubernetes API requests, errors and connections.
#[derive(Debug)]
pub struct ApiMetrics {
    errors: Family<ApiErrorLabels, Counter>,
    connections: Family<ProtocolLabels, Gauge>,
    requests: Family<RequestLabels, Counter>,
    retries: Family<RetryLabels, Counter>,
}

impl ApiMetrics {
    pub(super) fn new() -> Self {
        Self {
            errors: Family::default(),
            connections: Family::default(),
            requests: Family::default(),
            retries: Family::default(),
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "api_errors",
            "Failed Kubernetes API requests by source and HTTP code (or transport/timeout)",
            self.errors.clone(),
        );
        registry.register(
            "api_connections",
            "Open connections to the Kubernetes API server by protocol",
            self.connections.clone(),
        );
        registry.register(
            "api_requests",
            "Kubernetes API requests by resource, verb and HTTP code (none: no response)",
            self.requests.clone(),
        );
        registry.register(
            "api_retries",
            "Kubernetes API requests that were retries, by resource and verb",
            self.retries.clone(),
        );
    }

    /// A failed API request from `source` (`routes`, `namespaces`, `secrets`), with its
    /// HTTP code or `transport` / `timeout`.
    pub fn error(&self, source: &'static str, code: String) {
        self.errors
            .get_or_create(&ApiErrorLabels { source, code })
            .inc();
    }

    /// A route or namespace watch failed.
    pub fn watcher_error(&self, source: &'static str, error: &kube::runtime::watcher::Error) {
        use kube::runtime::watcher::Error as E;
        let code = match error {
            E::InitialListFailed(error) | E::WatchStartFailed(error) | E::WatchFailed(error) => {
                kube_error_code(error)
            }
            E::WatchError(status) => status.code.to_string(),
            E::NoResourceVersion => "invalid".to_owned(),
        };
        self.error(source, code);
    }

    /// A secret's watch failed.
    pub fn monitor_error(&self, error: &MonitorError) {
        let code = match error.kind() {
            MonitorErrorKind::SyncTimeout { .. } => "timeout".to_owned(),
            MonitorErrorKind::NotFound => "404".to_owned(),
            _ => error
                .status_code()
                .map_or_else(|| "transport".to_owned(), |code| code.to_string()),
        };
        self.error("secrets", code);
    }

    /// Open connections to the API server (before a scrape).
    pub fn set_connections(&self, http2: u64, http1: u64) {
        self.connections
            .get_or_create(&ProtocolLabels { protocol: "http2" })
            .set(clamp(http2));
        self.connections
            .get_or_create(&ProtocolLabels { protocol: "http1" })
            .set(clamp(http1));
    }

    /// An API request was answered (or got no answer).
    pub fn response(&self, record: &kube_h2::ResponseRecord<'_>) {
        let verb = record.verb.as_str();
        self.requests
            .get_or_create(&RequestLabels {
                resource: record.resource.to_owned(),
                verb,
                code: record
                    .code
                    .map_or_else(|| "none".to_owned(), |code| code.to_string()),
            })
            .inc();
        if record.retry {
            self.retries
                .get_or_create(&RetryLabels {
                    resource: record.resource.to_owned(),
                    verb,
                })
                .inc();
        }
    }
}

/// The HTTP code of a kube error, or `transport`.
pub fn kube_error_code(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if status.code != 0 => status.code.to_string(),
        _ => "transport".to_owned(),
    }
}
