//! HAProxy's routes' configuration (`--haproxy-config-dir`). These metrics are in the
//! registry only when certwatch routes traffic
//! ([`Metrics::register_routing`](super::Metrics::register_routing)).
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_routing_loads_total` | counter | | HAProxy loads of the routes' configuration (start or reload) |
//! | `certwatch_routing_load_failures_total` | counter | | failed writes, starts or reloads (retried) |
//! | `certwatch_routing_last_load_seconds` | gauge | | time the last load took, from rendering to HAProxy answering |
//! | `certwatch_routing_routes` | gauge | | routes in the configuration HAProxy last loaded |
//! | `certwatch_routing_server_commands_total` | counter | `result` | runtime API commands that moved endpoints into or out of server slots |
//! | `certwatch_default_certificate_expiration_timestamp_seconds` | gauge | | `notAfter` of the default certificate (`--default-certificate`, or the one certwatch generated), as read at start |

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// Loads of HAProxy's configuration and endpoint changes without a reload.
#[derive(Debug)]
pub struct RoutingMetrics {
    loads: Counter,
    load_failures: Counter,
    last_load_seconds: Gauge<f64, AtomicU64>,
    routes: Gauge,
    server_commands: Family<ResultLabels, Counter>,
    default_certificate_expiration: Gauge,
}

impl RoutingMetrics {
    pub(super) fn new() -> Self {
        let metrics = Self {
            loads: Counter::default(),
            load_failures: Counter::default(),
            last_load_seconds: Gauge::default(),
            routes: Gauge::default(),
            server_commands: Family::default(),
            default_certificate_expiration: Gauge::default(),
        };
        for result in ["ok", "error"] {
            drop(
                metrics
                    .server_commands
                    .get_or_create(&ResultLabels { result }),
            );
        }
        metrics
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "routing_loads",
            "HAProxy loads of the routes' configuration (start or reload)",
            self.loads.clone(),
        );
        registry.register(
            "routing_load_failures",
            "Failed writes, starts or reloads of the routes' configuration (retried)",
            self.load_failures.clone(),
        );
        registry.register(
            "routing_last_load_seconds",
            "Time the last load took, from rendering to HAProxy answering",
            self.last_load_seconds.clone(),
        );
        registry.register(
            "routing_routes",
            "Routes in the configuration HAProxy last loaded",
            self.routes.clone(),
        );
        registry.register(
            "routing_server_commands",
            "Runtime API commands that moved endpoints into or out of server slots, by result",
            self.server_commands.clone(),
        );
        registry.register(
            "default_certificate_expiration_timestamp_seconds",
            "notAfter of the default certificate HAProxy serves for names no route has, as a Unix time",
            self.default_certificate_expiration.clone(),
        );
    }

    /// The default certificate expires at `not_after` (Unix seconds).
    pub fn default_certificate_expires(&self, not_after: i64) {
        self.default_certificate_expiration.set(not_after);
    }

    /// HAProxy loaded a configuration of `routes` routes, which took `took`.
    pub fn loaded(&self, took: Duration, routes: usize) {
        self.loads.inc();
        self.last_load_seconds.set(took.as_secs_f64());
        self.routes.set(i64::try_from(routes).unwrap_or(i64::MAX));
    }

    /// A load failed (it is retried).
    pub fn load_failed(&self) {
        self.load_failures.inc();
    }

    /// `count` server commands were sent; `ok`: HAProxy took them all.
    pub fn server_commands(&self, count: usize, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.server_commands
            .get_or_create(&ResultLabels { result })
            .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
    }
}
