//! `GET /metrics`: the accounting in kube-apiserver's own metric names and labels, so
//! that a test or benchmark can read one server or the other the same way:
//!
//! - `apiserver_request_total` — resource requests by verb (`GET`, `LIST`, `WATCH`,
//!   `POST`, `PUT`, `PATCH`, `APPLY`, `DELETE`, `DELETECOLLECTION`), group, version,
//!   resource, subresource, scope and code. As on the real server, requests refused
//!   by authentication (401) or authorization (403) are not counted, and a watch is
//!   counted when it ends.
//! - `apiserver_longrunning_requests` — watches open now.
//! - `apiserver_flowcontrol_rejected_requests_total`,
//!   `apiserver_flowcontrol_nominal_limit_seats`,
//!   `apiserver_flowcontrol_current_limit_seats` — API Priority and Fairness, when on.

use kube_common::Verb;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::control::flow_control::FlowControlStats;

/// The labels of `apiserver_request_total` (in the real server's order).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub code: String,
    pub component: String,
    pub dry_run: String,
    pub group: String,
    pub resource: String,
    pub scope: String,
    pub subresource: String,
    pub system_client: String,
    pub verb: String,
    pub version: String,
}

/// The labels of `apiserver_longrunning_requests`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LongRunningLabels {
    pub component: String,
    pub group: String,
    pub resource: String,
    pub scope: String,
    pub subresource: String,
    pub verb: String,
    pub version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PriorityLevelLabel {
    priority_level: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectedLabels {
    flow_schema: String,
    priority_level: String,
    reason: String,
}

/// What a resource request is, as the request metrics label it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RequestKind {
    /// `GET`, `LIST`, `WATCH`, `POST`, ...
    pub verb: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub resource: &'static str,
    pub subresource: String,
    /// The scope of the route that served the request: `resource` (a URL naming an
    /// object, or a create), `namespace` or `cluster`. kube-apiserver labels a request
    /// its handler answered with it.
    pub route_scope: &'static str,
    /// The scope of the request as its request info reads it, where a list or watch
    /// with an exact `metadata.name` selector names an object too. kube-apiserver
    /// labels long-running watches and requests its filters refused with it.
    pub request_scope: &'static str,
    pub dry_run: bool,
}

impl RequestKind {
    /// kube-apiserver's metric verb: the API verb in capitals, `POST` for create,
    /// `PUT` for update, `APPLY` for a server-side apply patch.
    pub(crate) fn metric_verb(verb: Verb, apply: bool) -> &'static str {
        match verb {
            Verb::Get => "GET",
            Verb::List => "LIST",
            Verb::Watch => "WATCH",
            Verb::Create => "POST",
            Verb::Update => "PUT",
            Verb::Patch if apply => "APPLY",
            Verb::Patch => "PATCH",
            Verb::Delete => "DELETE",
            Verb::DeleteCollection => "DELETECOLLECTION",
        }
    }

    /// The scope label: a named request (or a create) is about one `resource`,
    /// otherwise the request spans a `namespace` or the `cluster`.
    pub(crate) fn scope(named: bool, verb: Verb, namespaced: bool) -> &'static str {
        if named || verb == Verb::Create {
            "resource"
        } else if namespaced {
            "namespace"
        } else {
            "cluster"
        }
    }

    fn request_labels(&self, code: u16, scope: &str) -> RequestLabels {
        RequestLabels {
            code: code.to_string(),
            component: "apiserver".to_string(),
            dry_run: if self.dry_run { "All" } else { "" }.to_string(),
            group: self.group.to_string(),
            resource: self.resource.to_string(),
            scope: scope.to_string(),
            subresource: self.subresource.clone(),
            system_client: String::new(),
            verb: self.verb.to_string(),
            version: self.version.to_string(),
        }
    }

    fn long_running_labels(&self) -> LongRunningLabels {
        LongRunningLabels {
            component: "apiserver".to_string(),
            group: self.group.to_string(),
            resource: self.resource.to_string(),
            scope: self.request_scope.to_string(),
            subresource: self.subresource.clone(),
            verb: self.verb.to_string(),
            version: self.version.to_string(),
        }
    }
}

/// The request metrics (families are internally synchronised).
#[derive(Default)]
pub(crate) struct RequestMetrics {
    requests: Family<RequestLabels, Counter>,
    long_running: Family<LongRunningLabels, Gauge>,
}

impl RequestMetrics {
    /// Counts a request its handler answered.
    pub(crate) fn finished(&self, kind: &RequestKind, code: u16) {
        self.requests
            .get_or_create(&kind.request_labels(code, kind.route_scope))
            .inc();
    }

    /// Counts a request refused before its handler (a 429 of a concurrency limit), or
    /// a watch that ended.
    pub(crate) fn finished_outside_handler(&self, kind: &RequestKind, code: u16) {
        self.requests
            .get_or_create(&kind.request_labels(code, kind.request_scope))
            .inc();
    }

    /// A watch started streaming; counted as finished when [`LongRunning`] drops.
    pub(crate) fn watch_started(self: &std::sync::Arc<Self>, kind: RequestKind) -> LongRunning {
        self.long_running
            .get_or_create(&kind.long_running_labels())
            .inc();
        LongRunning {
            metrics: self.clone(),
            kind,
        }
    }

    /// The exposition text, with API Priority and Fairness's state when it is on.
    pub(crate) fn encode(&self, flow_control: Option<&FlowControlStats>) -> String {
        let mut registry = Registry::default();
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, group, version, resource, scope, component, and HTTP response code.",
            self.requests.clone(),
        );
        registry.register(
            "apiserver_longrunning_requests",
            "Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope and component.",
            self.long_running.clone(),
        );
        if let Some(flow) = flow_control {
            let nominal = Family::<PriorityLevelLabel, Gauge>::default();
            let current = Family::<PriorityLevelLabel, Gauge>::default();
            for (name, level) in &flow.priority_levels {
                let label = PriorityLevelLabel {
                    priority_level: name.clone(),
                };
                nominal
                    .get_or_create(&label)
                    .set(i64::from(level.nominal_limit));
                current
                    .get_or_create(&label)
                    .set(i64::from(level.current_limit));
            }
            let rejected = Family::<RejectedLabels, Counter>::default();
            for r in &flow.rejected {
                rejected
                    .get_or_create(&RejectedLabels {
                        flow_schema: r.flow_schema.clone(),
                        priority_level: r.priority_level.clone(),
                        reason: r.reason.clone(),
                    })
                    .inc_by(r.count);
            }
            registry.register(
                "apiserver_flowcontrol_nominal_limit_seats",
                "Nominal number of execution seats configured for each priority level",
                nominal,
            );
            registry.register(
                "apiserver_flowcontrol_current_limit_seats",
                "current derived number of execution seats available to each priority level",
                current,
            );
            registry.register(
                "apiserver_flowcontrol_rejected_requests",
                "Number of requests rejected by API Priority and Fairness subsystem",
                rejected,
            );
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}

/// An open watch in `apiserver_longrunning_requests`; on drop it leaves the gauge
/// and is counted in `apiserver_request_total` with code 200.
pub(crate) struct LongRunning {
    metrics: std::sync::Arc<RequestMetrics>,
    kind: RequestKind,
}

impl Drop for LongRunning {
    fn drop(&mut self) {
        self.metrics
            .long_running
            .get_or_create(&self.kind.long_running_labels())
            .dec();
        self.metrics.finished_outside_handler(&self.kind, 200);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_watches_are_exposed_with_kube_apiserver_labels() {
        let metrics = std::sync::Arc::new(RequestMetrics::default());
        let get = RequestKind {
            verb: RequestKind::metric_verb(Verb::Get, false),
            group: "",
            version: "v1",
            resource: "secrets",
            subresource: String::new(),
            route_scope: RequestKind::scope(true, Verb::Get, true),
            request_scope: RequestKind::scope(true, Verb::Get, true),
            dry_run: false,
        };
        metrics.finished(&get, 200);
        let watch = RequestKind {
            verb: "WATCH",
            route_scope: "namespace",
            ..get.clone()
        };
        let open = metrics.watch_started(watch);
        let text = metrics.encode(None);
        assert!(text.contains("apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"secrets\",scope=\"resource\",subresource=\"\",system_client=\"\",verb=\"GET\",version=\"v1\"} 1"), "{text}");
        assert!(text.contains("apiserver_longrunning_requests{component=\"apiserver\",group=\"\",resource=\"secrets\",scope=\"resource\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 1"), "{text}");
        assert!(!text.contains("verb=\"WATCH\",version=\"v1\"} 1\napiserver_request_total"));
        drop(open);
        let text = metrics.encode(None);
        assert!(text.contains("verb=\"WATCH\",version=\"v1\"} 0"), "{text}");
        assert!(
            text.contains("system_client=\"\",verb=\"WATCH\",version=\"v1\"} 1"),
            "{text}"
        );
        assert_eq!(RequestKind::scope(false, Verb::Create, true), "resource");
        assert_eq!(RequestKind::scope(false, Verb::List, false), "cluster");
        assert_eq!(RequestKind::metric_verb(Verb::Patch, true), "APPLY");
    }
}
