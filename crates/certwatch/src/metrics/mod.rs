//! The daemon's Prometheus metrics (text format 0.0.4 at `/metrics`), by area.
//!
//! Each area is a struct of its own, a field of [`Metrics`]: it holds the metrics of
//! one part of the daemon, registers them and has the methods that update them, and
//! its module's documentation lists them. A new metric goes into its area's struct and
//! its area's `register`.
//!
//! | Area | Field | What it counts |
//! |---|---|---|
//! | [`daemon`] | [`Metrics::daemon`] | readiness, start-up time, build information |
//! | [`routes`] | [`Metrics::routes`] | routes admitted and rejected, decisions, certificates' expiry |
//! | [`secrets`] | [`Metrics::secrets`] | watched secrets, their first syncs, routes registered with them |
//! | [`files`] | [`Metrics::files`] | bundles and the crt-list in the cert directory |
//! | [`reload`] | [`Metrics::reload`] | the reload command |
//! | [`haproxy`] | [`Metrics::haproxy`] | HAProxy's runtime API (registered only when certwatch feeds a HAProxy: `--haproxy-socket` or `--haproxy-config-dir`) |
//! | [`routing`] | [`Metrics::routing`] | HAProxy's routes' configuration (registered only with `--haproxy-config-dir`) |
//! | [`api`] | [`Metrics::api`] | Kubernetes API requests, errors and connections |
//! | [`limiter`] | [`Metrics::limiter`] | the adaptive limiter of start-up requests |
//! | [`status`] | [`Metrics::status`] | route status writes, and whether this replica writes them |
//! | [`process`] | [`Metrics::process`] | the standard `process_*` metrics |
//!
//! Every counter and gauge without labels is exported from the start, at 0, and the
//! labelled ones whose label values are known in advance (reasons, outcomes) are too:
//! an alert's `rate()` or `> 0` works before the first event.
//!
//! No label ever carries secret material: routes are named by namespace and name only.

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use kube_common::sync;
use prometheus_client::registry::Registry;
use secret_monitor::{MonitorError, MonitorObserver, ObjectKey};

pub mod api;
pub mod daemon;
pub mod files;
pub mod haproxy;
pub mod limiter;
pub mod process;
pub mod reload;
pub mod routes;
pub mod routing;
pub mod secrets;
pub mod status;

pub use api::{ApiMetrics, kube_error_code};
pub use daemon::DaemonMetrics;
pub use files::FileMetrics;
pub use haproxy::HaproxyMetrics;
pub use limiter::LimiterMetrics;
pub use process::ProcessMetrics;
pub use reload::ReloadMetrics;
pub use routes::{RouteMetrics, RouteState, RouteStates};
pub use routing::RoutingMetrics;
pub use secrets::SecretMetrics;
pub use status::StatusMetrics;

/// Content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The prefix of every metric but the `process_*` ones.
const PREFIX: &str = "certwatch";

/// Every metric of the daemon, by area. Cheap to share behind an `Arc`; every method
/// takes `&self`.
pub struct Metrics {
    /// Guards the registry for encoding and for registering an area added later
    /// (HAProxy's); metrics themselves are atomics and updated without it.
    registry: Mutex<Registry>,
    /// Readiness, start-up time, build information.
    pub daemon: DaemonMetrics,
    /// Routes admitted and rejected, decisions, certificates' expiry.
    pub routes: RouteMetrics,
    /// Watched secrets and their first syncs.
    pub secrets: SecretMetrics,
    /// The cert directory's bundles.
    pub files: FileMetrics,
    /// The reload command.
    pub reload: ReloadMetrics,
    /// HAProxy's runtime API; in the registry only after [`Metrics::register_haproxy`].
    pub haproxy: HaproxyMetrics,
    /// Kubernetes API requests, errors and connections.
    pub api: ApiMetrics,
    /// The adaptive limiter of start-up requests.
    pub limiter: LimiterMetrics,
    /// HAProxy's routes' configuration; in the registry only after
    /// [`Metrics::register_routing`].
    pub routing: RoutingMetrics,
    /// Route status writes and leadership.
    pub status: StatusMetrics,
    /// CPU, memory, file descriptors and start time of this process.
    pub process: ProcessMetrics,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every area's metrics at zero (HAProxy's not registered).
    pub fn new() -> Self {
        let metrics = Self {
            registry: Mutex::new(Registry::default()),
            daemon: DaemonMetrics::new(),
            routes: RouteMetrics::new(),
            secrets: SecretMetrics::new(),
            files: FileMetrics::new(),
            reload: ReloadMetrics::new(),
            haproxy: HaproxyMetrics::new(),
            api: ApiMetrics::new(),
            limiter: LimiterMetrics::new(),
            routing: RoutingMetrics::new(),
            status: StatusMetrics::new(),
            process: ProcessMetrics::new(),
        };
        {
            let mut registry = metrics.registry();
            let prefixed = registry.sub_registry_with_prefix(PREFIX);
            metrics.daemon.register(prefixed);
            metrics.secrets.register(prefixed);
            metrics.routes.register(prefixed);
            metrics.files.register(prefixed);
            metrics.reload.register(prefixed);
            metrics.api.register(prefixed);
            metrics.limiter.register(prefixed);
            metrics.status.register(prefixed);
            // Unprefixed, as every Prometheus client library names them.
            metrics.process.register(&mut registry);
        }
        metrics
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        sync::lock(&self.registry)
    }

    /// Adds the HAProxy metrics to the registry: only a daemon that talks to HAProxy
    /// has them, so that an alert on HAProxy's sync state never fires (or stays
    /// silent) for a deployment without HAProxy.
    pub fn register_haproxy(&self) {
        let mut registry = self.registry();
        self.haproxy
            .register(registry.sub_registry_with_prefix(PREFIX));
    }

    /// Adds the routing metrics to the registry (a daemon that routes traffic).
    pub fn register_routing(&self) {
        let mut registry = self.registry();
        self.routing
            .register(registry.sub_registry_with_prefix(PREFIX));
    }

    /// Registers metrics kept elsewhere (the HAProxy controller's) under the
    /// `certwatch_` prefix.
    pub fn register_more(&self, register: impl FnOnce(&mut Registry)) {
        let mut registry = self.registry();
        register(registry.sub_registry_with_prefix(PREFIX));
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> String {
        let registry = self.registry();
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
        out
    }
}

impl kube_h2::RequestObserver for Metrics {
    fn response(&self, record: &kube_h2::ResponseRecord<'_>) {
        self.api.response(record);
    }
}

impl MonitorObserver for Metrics {
    fn first_sync(&self, _key: &ObjectKey, elapsed: Duration, outcome: Result<(), &MonitorError>) {
        self.secrets.first_sync(elapsed, outcome.is_ok());
    }

    fn watch_error(&self, _key: &ObjectKey, error: &MonitorError) {
        self.api.monitor_error(error);
    }
}

fn to_i64(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counters and known label sets exist from the start at 0; HAProxy's metrics
    /// only when HAProxy is configured; build and process information is there.
    #[test]
    fn what_exists_from_the_start() {
        let metrics = Metrics::new();
        metrics.process.refresh();
        let text = metrics.encode();
        for sample in [
            "certwatch_bundle_write_failures_total 0\n",
            "certwatch_reload_failures_total 0\n",
            "certwatch_routes_rejected{reason=\"ExternalCertificateValidationFailed\",cause=\"rbac\"} 0\n",
            "certwatch_routes_rejected{reason=\"ExtendedValidationFailed\",cause=\"bad_pem\"} 0\n",
            "certwatch_route_outcomes_total{outcome=\"removed\",reason=\"\"} 0\n",
            "certwatch_ready 0\n",
            "certwatch_reload_duration_seconds_count 0\n",
            "certwatch_secret_first_sync_failures_total 0\n",
            "certwatch_startup_refusals_total 0\n",
            &format!(
                "certwatch_build_info{{version=\"{}\",commit=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION"),
                daemon::COMMIT,
            ),
        ] {
            assert!(text.contains(sample), "{sample}in\n{text}");
        }
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(
                text.lines().any(|line| line.starts_with(name)),
                "{name}in\n{text}"
            );
        }
        assert!(!text.contains("haproxy"), "{text}");
        metrics.register_haproxy();
        let text = metrics.encode();
        assert!(text.contains("certwatch_haproxy_in_sync 0\n"), "{text}");
        assert!(
            text.contains("certwatch_haproxy_sync_failures_total 0\n"),
            "{text}"
        );
    }

    #[test]
    fn counters_carry_the_total_suffix() {
        let metrics = Metrics::new();
        metrics.reload.started();
        metrics.reload.finished(false, Duration::from_millis(10));
        metrics.api.error("routes", "503".to_owned());
        let text = metrics.encode();
        assert!(text.contains("certwatch_reloads_total 1\n"), "{text}");
        assert!(
            text.contains("certwatch_reload_failures_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("certwatch_api_errors_total{source=\"routes\",code=\"503\"} 1\n"),
            "{text}"
        );
    }

    /// Each reload reason is its own label value, as dashboards and alerts name them.
    #[test]
    fn reload_reasons_are_their_labels() {
        use haproxy::ReloadReason;
        let metrics = Metrics::new();
        metrics.register_haproxy();
        for reason in [
            ReloadReason::Start,
            ReloadReason::Routes,
            ReloadReason::Backlog,
            ReloadReason::TooLarge,
        ] {
            metrics.haproxy.reloaded(reason, true, None);
        }
        metrics.haproxy.reloaded(ReloadReason::Routes, false, None);
        let text = metrics.encode();
        for sample in [
            "certwatch_haproxy_reloads_total{reason=\"start\",result=\"ok\"} 1\n",
            "certwatch_haproxy_reloads_total{reason=\"routes\",result=\"ok\"} 1\n",
            "certwatch_haproxy_reloads_total{reason=\"backlog\",result=\"ok\"} 1\n",
            "certwatch_haproxy_reloads_total{reason=\"too_large\",result=\"ok\"} 1\n",
            "certwatch_haproxy_reloads_total{reason=\"routes\",result=\"failed\"} 1\n",
        ] {
            assert!(text.contains(sample), "{sample}in\n{text}");
        }
    }
}
