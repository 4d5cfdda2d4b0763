//! Routes: admitted and rejected now, every decision, and the expiry of the
//! certificate each route serves.
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_routes_admitted` | gauge | | routes served now |
//! | `certwatch_routes_rejected` | gauge | `reason`, `cause` | routes rejected now, by reason and cause class (`rbac`, `secret_missing`, `bad_pem`, ...: see docs/daemon.md) |
//! | `certwatch_route_outcomes_total` | counter | `outcome`, `reason` | every decision (`admitted`, `rejected`, `removed`) |
//! | `certwatch_certificate_expiration_timestamp_seconds` | gauge | `route_namespace`, `route`, `secret` | `notAfter` of the certificate last served for each route; stays while the route exists, also while it is rejected |
//! | `certwatch_certificate_warnings_total` | counter | `warning` | admissions of a route whose certificate has this warning (`expires_soon`, `host_not_covered`, ...: `TlsWarning::code`); the log names a route's warnings once, when they first apply to it |
//! | `certwatch_routes_with_certificate_warning` | gauge | `warning` | routes served now with a certificate that has this warning |

use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use kube_common::hash::NameMap;
use kube_common::sync;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use route_secrets::reason::{Reason, RejectionCause};
use route_secrets::route::RouteKey;
use route_secrets::tls::TlsWarning;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectedLabels {
    reason: &'static str,
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WarningLabels {
    warning: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    /// Not `namespace`: a scrape with `honor_labels: false` (what a ServiceMonitor
    /// generates) renames that `exported_namespace` and puts the namespace certwatch
    /// runs in in its place.
    route_namespace: Arc<str>,
    route: Arc<str>,
    secret: Arc<str>,
}

/// A route's current state, as the metrics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteState {
    /// Served.
    Admitted,
    /// Not served, for this reason (e.g. `ExternalCertificateValidationFailed`) and
    /// cause class (e.g. `secret_missing`).
    Rejected {
        /// The reason's name.
        reason: &'static str,
        /// The cause class's label.
        cause: &'static str,
    },
}

/// Routes admitted and rejected, decisions, certificates' expiry.
#[derive(Debug)]
pub struct RouteMetrics {
    admitted: Gauge,
    rejected: Family<RejectedLabels, Gauge>,
    outcomes: Family<OutcomeLabels, Counter>,
    expiration: Family<CertificateLabels, Gauge>,
    /// Guards the secret whose certificate each route's expiration series is labelled
    /// with (to replace the series when the route moves to another secret, and drop it
    /// when the route goes). Held only to read or update the map.
    expiration_secrets: Mutex<NameMap<RouteKey, Arc<str>>>,
    warnings: Family<WarningLabels, Counter>,
    routes_with_warning: Family<WarningLabels, Gauge>,
    /// Guards the warnings of the certificate each route serves now (to move the
    /// per-warning gauges when they change). Held only to read or update the map.
    served_warnings: Mutex<NameMap<RouteKey, Vec<&'static str>>>,
}

impl RouteMetrics {
    pub(super) fn new() -> Self {
        let metrics = Self {
            admitted: Gauge::default(),
            rejected: Family::default(),
            outcomes: Family::default(),
            expiration: Family::default(),
            expiration_secrets: Mutex::new(NameMap::default()),
            warnings: Family::default(),
            routes_with_warning: Family::default(),
            served_warnings: Mutex::new(NameMap::default()),
        };
        metrics.precreate();
        metrics
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "routes_admitted",
            "Routes served now",
            self.admitted.clone(),
        );
        registry.register(
            "routes_rejected",
            "Routes rejected now, by reason",
            self.rejected.clone(),
        );
        registry.register(
            "route_outcomes",
            "Decisions about routes: admitted, rejected (with reason), removed",
            self.outcomes.clone(),
        );
        registry.register(
            "certificate_expiration_timestamp_seconds",
            "notAfter of the certificate last served for each route, as a Unix time; kept while the route exists, also while it is rejected",
            self.expiration.clone(),
        );
        registry.register(
            "certificate_warnings",
            "Admissions of a route whose certificate has this warning (expires_soon, host_not_covered, ...)",
            self.warnings.clone(),
        );
        registry.register(
            "routes_with_certificate_warning",
            "Routes served now with a certificate that has this warning",
            self.routes_with_warning.clone(),
        );
    }

    /// Label sets known in advance, at 0 from the start.
    fn precreate(&self) {
        for cause in RejectionCause::ALL {
            drop(self.rejected.get_or_create(&RejectedLabels {
                reason: cause.reason_name(),
                cause: cause.as_str(),
            }));
        }
        for reason in Reason::NAMES {
            drop(self.outcomes.get_or_create(&OutcomeLabels {
                outcome: "rejected",
                reason,
            }));
        }
        for (outcome, reason) in [("admitted", ""), ("removed", "")] {
            drop(
                self.outcomes
                    .get_or_create(&OutcomeLabels { outcome, reason }),
            );
        }
        // The warnings about a certificate's dates and names, which alerts and
        // dashboards read; the others appear with their first occurrence.
        let epoch = Timestamp::UNIX_EPOCH;
        for warning in [
            TlsWarning::ExpiresSoon {
                not_after: epoch,
                days_left: 0,
            },
            TlsWarning::Expired { not_after: epoch },
            TlsWarning::NotYetValid { not_before: epoch },
            TlsWarning::HostNotCovered {
                host: String::new(),
                names: Vec::new(),
            },
        ] {
            let labels = WarningLabels {
                warning: warning.code(),
            };
            drop(self.warnings.get_or_create(&labels));
            drop(self.routes_with_warning.get_or_create(&labels));
        }
    }

    /// A route moved from state `old` to `new` (`None`: not known / removed).
    pub fn changed(&self, old: Option<RouteState>, new: Option<RouteState>) {
        if old == new {
            return;
        }
        match old {
            Some(RouteState::Admitted) => {
                self.admitted.dec();
            }
            Some(RouteState::Rejected { reason, cause }) => {
                self.rejected
                    .get_or_create(&RejectedLabels { reason, cause })
                    .dec();
            }
            None => {}
        }
        match new {
            Some(RouteState::Admitted) => {
                self.admitted.inc();
            }
            Some(RouteState::Rejected { reason, cause }) => {
                self.rejected
                    .get_or_create(&RejectedLabels { reason, cause })
                    .inc();
            }
            None => {}
        }
    }

    /// Counts a decision: `admitted`, `rejected` or `removed`, with the reason's name
    /// (empty when there is none).
    pub fn outcome(&self, outcome: &'static str, reason: &'static str) {
        self.outcomes
            .get_or_create(&OutcomeLabels { outcome, reason })
            .inc();
    }

    /// Records the `notAfter` of the certificate now served for `route`, from
    /// `secret` (replacing the series of an earlier secret).
    pub fn certificate_served(&self, route: &RouteKey, secret: &str, not_after: Timestamp) {
        // The labels share the route key's strings and one copy of the secret's name
        // with the map: a series per route costs no copies of them.
        let labels = |secret: Arc<str>| CertificateLabels {
            route_namespace: Arc::clone(&route.namespace),
            route: Arc::clone(&route.name),
            secret,
        };
        let (secret, previous) = {
            let mut secrets = sync::lock(&self.expiration_secrets);
            match secrets.get(route) {
                Some(known) if known.as_ref() == secret => (Arc::clone(known), None),
                _ => {
                    let secret: Arc<str> = Arc::from(secret);
                    let previous = secrets.insert(route.clone(), Arc::clone(&secret));
                    (secret, previous)
                }
            }
        };
        if let Some(previous) = previous {
            self.expiration.remove(&labels(previous));
        }
        self.expiration
            .get_or_create(&labels(secret))
            .set(not_after.as_second());
    }

    /// `route` is served with a certificate that has `warnings` (their codes): each is
    /// counted, and the per-warning gauges follow.
    pub fn served_with_warnings(&self, route: &RouteKey, warnings: &[TlsWarning]) {
        let mut codes: Vec<&'static str> = warnings.iter().map(TlsWarning::code).collect();
        codes.sort_unstable();
        codes.dedup();
        for warning in &codes {
            self.warnings
                .get_or_create(&WarningLabels { warning })
                .inc();
        }
        self.set_served_warnings(route, codes);
    }

    /// `route` is no longer served (rejected or gone): its certificate's warnings no
    /// longer count in the gauges.
    pub fn not_served(&self, route: &RouteKey) {
        self.set_served_warnings(route, Vec::new());
    }

    fn set_served_warnings(&self, route: &RouteKey, codes: Vec<&'static str>) {
        let old = {
            let mut served = sync::lock(&self.served_warnings);
            if codes.is_empty() {
                served.remove(route)
            } else {
                served.insert(route.clone(), codes.clone())
            }
        }
        .unwrap_or_default();
        for warning in old.iter().filter(|code| !codes.contains(code)) {
            self.routes_with_warning
                .get_or_create(&WarningLabels { warning })
                .dec();
        }
        for warning in codes.iter().filter(|code| !old.contains(code)) {
            self.routes_with_warning
                .get_or_create(&WarningLabels { warning })
                .inc();
        }
    }

    /// `route` no longer exists (or no longer has an external certificate): its
    /// expiration series goes, and its warnings no longer count.
    pub fn removed(&self, route: &RouteKey) {
        self.not_served(route);
        let previous = sync::lock(&self.expiration_secrets).remove(route);
        if let Some(secret) = previous {
            self.expiration.remove(&CertificateLabels {
                route_namespace: Arc::clone(&route.namespace),
                route: Arc::clone(&route.name),
                secret,
            });
        }
    }
}

/// Keeps each route's state so that gauges by state stay exact.
#[derive(Debug, Default)]
pub struct RouteStates {
    states: NameMap<RouteKey, RouteState>,
    /// Of those, routes admitted (so that the counts cost nothing per batch).
    admitted: usize,
}

impl RouteStates {
    /// Sets `route`'s state (`None`: forget it) and updates `metrics`.
    pub fn set(&mut self, metrics: &RouteMetrics, route: &RouteKey, state: Option<RouteState>) {
        let old = match state {
            Some(state) => self.states.insert(route.clone(), state),
            None => self.states.remove(route),
        };
        if old == Some(RouteState::Admitted) {
            self.admitted -= 1;
        }
        if state == Some(RouteState::Admitted) {
            self.admitted += 1;
        }
        metrics.changed(old, state);
    }

    /// Routes admitted and rejected now.
    pub fn counts(&self) -> (usize, usize) {
        (self.admitted, self.states.len() - self.admitted)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::*;

    #[test]
    fn gauges_follow_route_states() {
        let metrics = Metrics::new();
        let mut states = RouteStates::default();
        let a = RouteKey::new("ns", "a");
        let b = RouteKey::new("ns", "b");
        let deleted = RouteState::Rejected {
            reason: "ExternalCertificateValidationFailed",
            cause: "secret_missing",
        };
        states.set(&metrics.routes, &a, Some(RouteState::Admitted));
        states.set(&metrics.routes, &b, Some(deleted));
        states.set(&metrics.routes, &a, Some(deleted));
        states.set(&metrics.routes, &b, None);
        let text = metrics.encode();
        assert!(text.contains("certwatch_routes_admitted 0\n"), "{text}");
        assert!(
            text.contains(
                "certwatch_routes_rejected{reason=\"ExternalCertificateValidationFailed\",cause=\"secret_missing\"} 1\n"
            ),
            "{text}"
        );
        assert_eq!(states.counts(), (0, 1));
    }

    /// Warnings are counted per admission; the gauges follow what is served now.
    #[test]
    fn warnings_are_counted_and_gauged() {
        let metrics = Metrics::new();
        let (a, b) = (RouteKey::new("ns", "a"), RouteKey::new("ns", "b"));
        let soon = TlsWarning::ExpiresSoon {
            not_after: Timestamp::UNIX_EPOCH,
            days_left: 3,
        };
        let host = TlsWarning::HostNotCovered {
            host: "a.example".to_owned(),
            names: vec!["b.example".to_owned()],
        };
        metrics
            .routes
            .served_with_warnings(&a, &[soon.clone(), host.clone()]);
        metrics
            .routes
            .served_with_warnings(&a, &[soon.clone(), host]);
        metrics.routes.served_with_warnings(&b, &[soon]);
        let text = metrics.encode();
        for sample in [
            "certwatch_certificate_warnings_total{warning=\"expires_soon\"} 3\n",
            "certwatch_certificate_warnings_total{warning=\"host_not_covered\"} 2\n",
            "certwatch_certificate_warnings_total{warning=\"expired\"} 0\n",
            "certwatch_routes_with_certificate_warning{warning=\"expires_soon\"} 2\n",
            "certwatch_routes_with_certificate_warning{warning=\"host_not_covered\"} 1\n",
        ] {
            assert!(text.contains(sample), "{sample}in\n{text}");
        }
        metrics.routes.served_with_warnings(&a, &[]);
        metrics.routes.not_served(&b);
        metrics.routes.removed(&b);
        let text = metrics.encode();
        for sample in [
            "certwatch_routes_with_certificate_warning{warning=\"expires_soon\"} 0\n",
            "certwatch_routes_with_certificate_warning{warning=\"host_not_covered\"} 0\n",
            "certwatch_certificate_warnings_total{warning=\"expires_soon\"} 3\n",
        ] {
            assert!(text.contains(sample), "{sample}in\n{text}");
        }
    }

    /// The expiration series follows the route's secret and stays while the route
    /// is rejected; it goes with the route.
    #[test]
    fn expiration_stays_while_the_route_exists() {
        let metrics = Metrics::new();
        let route = RouteKey::new("ns", "shop");
        let at = Timestamp::from_second(2_000_000_000).unwrap();
        let series = |secret: &str| {
            format!(
                "certwatch_certificate_expiration_timestamp_seconds{{route_namespace=\"ns\",route=\"shop\",secret=\"{secret}\"}} 2000000000\n"
            )
        };
        metrics.routes.certificate_served(&route, "old", at);
        assert!(metrics.encode().contains(&series("old")));
        metrics.routes.certificate_served(&route, "new", at);
        let text = metrics.encode();
        assert!(text.contains(&series("new")), "{text}");
        assert!(!text.contains(&series("old")), "{text}");
        let mut states = RouteStates::default();
        states.set(
            &metrics.routes,
            &route,
            Some(RouteState::Rejected {
                reason: "ExternalCertificateValidationFailed",
                cause: "secret_missing",
            }),
        );
        assert!(metrics.encode().contains(&series("new")));
        metrics.routes.removed(&route);
        assert!(!metrics.encode().contains("expiration_timestamp_seconds{"));
    }
}
