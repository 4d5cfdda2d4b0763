//! The daemon's Prometheus metrics (text format 0.0.4 at `/metrics`).
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_ready` | gauge | | 1 once every route present at start-up is decided and its files are written |
//! | `certwatch_startup_duration_seconds` | gauge | | time from start to ready |
//! | `certwatch_watched_secrets` | gauge | | secrets with a watch (one per distinct secret) |
//! | `certwatch_synced_secrets` | gauge | | of those, secrets whose first sync is done |
//! | `certwatch_registered_routes` | gauge | | routes registered with a secret |
//! | `certwatch_secret_first_sync_duration_seconds` | histogram | | time of each secret's first sync |
//! | `certwatch_secret_first_sync_failures_total` | counter | | first syncs that failed |
//! | `certwatch_routes_admitted` | gauge | | routes served now |
//! | `certwatch_routes_rejected` | gauge | `reason`, `cause` | routes rejected now, by reason and cause class (`rbac`, `secret_missing`, `bad_pem`, ...: see docs/daemon.md) |
//! | `certwatch_route_outcomes_total` | counter | `outcome`, `reason` | every decision (`admitted`, `rejected`, `removed`) |
//! | `certwatch_certificate_expiration_timestamp_seconds` | gauge | `namespace`, `route`, `secret` | `notAfter` of the certificate last served for each route; stays while the route exists, also while it is rejected |
//! | `certwatch_bundles` | gauge | | bundles on disk in the cert directory (files really written) |
//! | `certwatch_bundle_writes_total` | counter | | bundles written or removed |
//! | `certwatch_bundle_write_failures_total` | counter | | failed writes or removals (retried) |
//! | `certwatch_reloads_total` | counter | | runs of the reload command |
//! | `certwatch_reload_failures_total` | counter | | runs that failed (exit status, timeout, spawn error) |
//! | `certwatch_reload_duration_seconds` | histogram | | time each run of the reload command took |
//! | `certwatch_reload_pending` | gauge | | 1 while a change waits for a reload |
//! | `certwatch_reload_running` | gauge | | 1 while the reload command runs |
//! | `certwatch_haproxy_commands_total` | counter | `command`, `result` | runtime API commands sent (only with `--haproxy-socket`) |
//! | `certwatch_haproxy_sync_failures_total` | counter | | synchronisations that failed, retried (only with `--haproxy-socket`) |
//! | `certwatch_haproxy_in_sync` | gauge | | 1 when HAProxy holds exactly the crt-list's certificates (only with `--haproxy-socket`) |
//! | `certwatch_routes_admitted_not_served`, `certwatch_oldest_unserved_change_age_seconds`, `certwatch_haproxy_*` | | | the HAProxy controller's: see [`crate::haproxy::metrics`] |
//! | `certwatch_api_errors_total` | counter | `source`, `code` | failed API requests: HTTP code, or `transport`/`timeout` |
//! | `certwatch_api_connections` | gauge | `protocol` | open connections to the API server |
//! | `certwatch_api_requests_total` | counter | `resource`, `verb`, `code` | every API request by resource (with subresource), verb (as kube-apiserver names it) and HTTP code (`none`: no response), 429s included |
//! | `certwatch_api_retries_total` | counter | `resource`, `verb` | of those, requests that were retries |
//! | `certwatch_startup_window` | gauge | | requests (first syncs of secrets, access reviews) the adaptive limiter lets out at once; `+Inf` until the API server first refuses one when `--max-concurrent-syncs` is not set |
//! | `certwatch_startup_in_flight` | gauge | | of those, out now |
//! | `certwatch_startup_waiting` | gauge | | requests waiting for the window (refused ones re-queued included) |
//! | `certwatch_startup_throttled` | gauge | | 1 while the API server's load holds requests back (refused requests waiting out their `Retry-After`, or work waiting behind a window shrunk below its bound) |
//! | `certwatch_startup_refusals_total` | counter | | requests of the limiter the API server refused for load (429, 5xx) |
//! | `certwatch_startup_window_decreases_total` | counter | | times the window was shrunk |
//! | `certwatch_build_info` | gauge | `version` | always 1 |
//! | `process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`, `process_start_time_seconds` | | | the standard process metrics |
//!
//! Every counter and gauge without labels is exported from the start, at 0, and the
//! labelled ones whose label values are known in advance (reasons, outcomes) are too:
//! an alert's `rate()` or `> 0` works before the first event.
//!
//! No label ever carries secret material: routes are named by namespace and name only.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use kube_common::adaptive::LimiterSnapshot;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::process::{ProcessSample, start_time_seconds};
use route_secrets::reason::{Reason, RejectionCause};
use route_secrets::route::RouteKey;
use secret_monitor::{MonitorError, MonitorErrorKind, MonitorObserver, ObjectKey};

/// Content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

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
struct CertificateLabels {
    namespace: String,
    route: String,
    secret: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    command: &'static str,
    result: &'static str,
}

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

/// A route's current state, as the metrics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteState {
    /// Served.
    Admitted,
    /// Not served, for this reason (e.g. `ExternalCertificateSecretDeleted`) and cause
    /// class (e.g. `secret_deleted`).
    Rejected {
        /// The reason's name.
        reason: &'static str,
        /// The cause class's label.
        cause: &'static str,
    },
}

/// Every metric of the daemon. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct Metrics {
    /// Guards the registry for encoding; metrics themselves are atomics and updated
    /// without it.
    registry: Mutex<Registry>,
    ready: Gauge,
    startup_seconds: Gauge<f64, AtomicU64>,
    watched_secrets: Gauge,
    synced_secrets: Gauge,
    registered_routes: Gauge,
    first_sync: Histogram,
    first_sync_failures: Counter,
    routes_admitted: Gauge,
    routes_rejected: Family<RejectedLabels, Gauge>,
    route_outcomes: Family<OutcomeLabels, Counter>,
    expiration: Family<CertificateLabels, Gauge>,
    /// Guards the secret whose certificate each route's expiration series is labelled
    /// with (to replace the series when the route moves to another secret, and drop it
    /// when the route goes). Held only to read or update the map.
    expiration_secrets: Mutex<HashMap<RouteKey, String>>,
    bundles: Gauge,
    bundle_writes: Counter,
    bundle_write_failures: Counter,
    reloads: Counter,
    reload_failures: Counter,
    reload_duration: Histogram,
    reload_pending: Gauge,
    reload_running: Gauge,
    haproxy_commands: Family<CommandLabels, Counter>,
    haproxy_sync_failures: Counter,
    haproxy_in_sync: Gauge,
    api_errors: Family<ApiErrorLabels, Counter>,
    api_connections: Family<ProtocolLabels, Gauge>,
    api_requests: Family<RequestLabels, Counter>,
    api_retries: Family<RetryLabels, Counter>,
    startup_window: Gauge<f64, AtomicU64>,
    startup_in_flight: Gauge,
    startup_waiting: Gauge,
    startup_throttled: Gauge,
    startup_refusals: Counter,
    startup_decreases: Counter,
    /// Guards nothing but the order of the limiter's counter updates: concurrent
    /// scrapes must add each refusal and decrease once.
    startup_update: Mutex<()>,
    process_cpu: Counter<f64, AtomicU64>,
    /// Guards nothing but the order of CPU-counter updates: concurrent scrapes must
    /// add each CPU second once.
    process_cpu_update: Mutex<()>,
    process_resident: Gauge,
    process_virtual: Gauge,
    process_open_fds: Gauge,
    process_max_fds: Gauge,
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
    /// A registry with every metric at zero.
    pub fn new() -> Self {
        let metrics = Self {
            registry: Mutex::new(Registry::default()),
            ready: Gauge::default(),
            startup_seconds: Gauge::default(),
            watched_secrets: Gauge::default(),
            synced_secrets: Gauge::default(),
            registered_routes: Gauge::default(),
            // 5 ms to about 160 s.
            first_sync: Histogram::new(exponential_buckets(0.005, 2.0, 16)),
            first_sync_failures: Counter::default(),
            routes_admitted: Gauge::default(),
            routes_rejected: Family::default(),
            route_outcomes: Family::default(),
            expiration: Family::default(),
            expiration_secrets: Mutex::new(HashMap::new()),
            bundles: Gauge::default(),
            bundle_writes: Counter::default(),
            bundle_write_failures: Counter::default(),
            reloads: Counter::default(),
            reload_failures: Counter::default(),
            // 10 ms to about 160 s.
            reload_duration: Histogram::new(exponential_buckets(0.01, 2.0, 15)),
            reload_pending: Gauge::default(),
            reload_running: Gauge::default(),
            haproxy_commands: Family::default(),
            haproxy_sync_failures: Counter::default(),
            haproxy_in_sync: Gauge::default(),
            api_errors: Family::default(),
            api_connections: Family::default(),
            api_requests: Family::default(),
            api_retries: Family::default(),
            startup_window: Gauge::default(),
            startup_in_flight: Gauge::default(),
            startup_waiting: Gauge::default(),
            startup_throttled: Gauge::default(),
            startup_refusals: Counter::default(),
            startup_decreases: Counter::default(),
            startup_update: Mutex::new(()),
            process_cpu: Counter::default(),
            process_cpu_update: Mutex::new(()),
            process_resident: Gauge::default(),
            process_virtual: Gauge::default(),
            process_open_fds: Gauge::default(),
            process_max_fds: Gauge::default(),
        };
        metrics.precreate();
        {
            let mut registry = metrics
                .registry
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let r = registry.sub_registry_with_prefix("certwatch");
            r.register(
                "ready",
                "1 once every route present at start-up is decided and its files are written",
                metrics.ready.clone(),
            );
            r.register_with_unit(
                "startup_duration",
                "Time from start to ready",
                Unit::Seconds,
                metrics.startup_seconds.clone(),
            );
            r.register(
                "watched_secrets",
                "Secrets with a watch (one per distinct secret)",
                metrics.watched_secrets.clone(),
            );
            r.register(
                "synced_secrets",
                "Watched secrets whose first sync is done",
                metrics.synced_secrets.clone(),
            );
            r.register(
                "registered_routes",
                "Routes registered with their secret",
                metrics.registered_routes.clone(),
            );
            r.register_with_unit(
                "secret_first_sync_duration",
                "Time of each secret's first sync (list and watch, or streaming list)",
                Unit::Seconds,
                metrics.first_sync.clone(),
            );
            r.register(
                "secret_first_sync_failures",
                "First syncs of a secret that failed",
                metrics.first_sync_failures.clone(),
            );
            r.register(
                "routes_admitted",
                "Routes served now",
                metrics.routes_admitted.clone(),
            );
            r.register(
                "routes_rejected",
                "Routes rejected now, by reason",
                metrics.routes_rejected.clone(),
            );
            r.register(
                "route_outcomes",
                "Decisions about routes: admitted, rejected (with reason), removed",
                metrics.route_outcomes.clone(),
            );
            r.register(
                "certificate_expiration_timestamp_seconds",
                "notAfter of the certificate last served for each route, as a Unix time; kept while the route exists, also while it is rejected",
                metrics.expiration.clone(),
            );
            r.register(
                "bundles",
                "Bundles in the cert directory",
                metrics.bundles.clone(),
            );
            r.register(
                "bundle_writes",
                "Bundles written or removed",
                metrics.bundle_writes.clone(),
            );
            r.register(
                "bundle_write_failures",
                "Failed bundle or crt-list writes and removals (retried)",
                metrics.bundle_write_failures.clone(),
            );
            r.register(
                "reloads",
                "Runs of the reload command",
                metrics.reloads.clone(),
            );
            r.register(
                "reload_failures",
                "Runs of the reload command that failed",
                metrics.reload_failures.clone(),
            );
            r.register_with_unit(
                "reload_duration",
                "Time each run of the reload command took",
                Unit::Seconds,
                metrics.reload_duration.clone(),
            );
            r.register(
                "reload_pending",
                "1 while a change waits for the reload command",
                metrics.reload_pending.clone(),
            );
            r.register(
                "reload_running",
                "1 while the reload command runs",
                metrics.reload_running.clone(),
            );
            r.register(
                "api_errors",
                "Failed Kubernetes API requests by source and HTTP code (or transport/timeout)",
                metrics.api_errors.clone(),
            );
            r.register(
                "api_connections",
                "Open connections to the Kubernetes API server by protocol",
                metrics.api_connections.clone(),
            );
            r.register(
                "api_requests",
                "Kubernetes API requests by resource, verb and HTTP code (none: no response)",
                metrics.api_requests.clone(),
            );
            r.register(
                "api_retries",
                "Kubernetes API requests that were retries, by resource and verb",
                metrics.api_retries.clone(),
            );
            register_startup_metrics(r, &metrics);
            let build_info = Family::<BuildLabels, Gauge>::default();
            build_info
                .get_or_create(&BuildLabels {
                    version: env!("CARGO_PKG_VERSION"),
                })
                .set(1);
            r.register("build_info", "certwatch's version; always 1", build_info);
            register_process_metrics(&mut registry, &metrics);
        }
        metrics
    }

    /// Adds the HAProxy metrics to the registry: only a daemon that talks to HAProxy
    /// has them, so that an alert on HAProxy's sync state never fires (or stays
    /// silent) for a deployment without HAProxy.
    pub fn register_haproxy(&self) {
        let mut registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let r = registry.sub_registry_with_prefix("certwatch");
        r.register(
            "haproxy_commands",
            "HAProxy runtime API commands sent, by command and result",
            self.haproxy_commands.clone(),
        );
        r.register(
            "haproxy_sync_failures",
            "Synchronisations with HAProxy that failed (retried)",
            self.haproxy_sync_failures.clone(),
        );
        r.register(
            "haproxy_in_sync",
            "1 when HAProxy holds exactly the crt-list's certificates",
            self.haproxy_in_sync.clone(),
        );
    }

    /// Registers metrics kept elsewhere (the HAProxy controller's) under the
    /// `certwatch_` prefix.
    pub fn register_more(&self, register: impl FnOnce(&mut Registry)) {
        let mut registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        register(registry.sub_registry_with_prefix("certwatch"));
    }

    /// Label sets known in advance, at 0 from the start.
    fn precreate(&self) {
        for cause in RejectionCause::ALL {
            drop(self.routes_rejected.get_or_create(&RejectedLabels {
                reason: cause.reason_name(),
                cause: cause.as_str(),
            }));
        }
        for reason in Reason::NAMES {
            drop(self.route_outcomes.get_or_create(&OutcomeLabels {
                outcome: "rejected",
                reason,
            }));
        }
        for (outcome, reason) in [
            ("admitted", ""),
            ("admitted", "ExternalCertificateSecretRecreated"),
            ("removed", ""),
        ] {
            drop(
                self.route_outcomes
                    .get_or_create(&OutcomeLabels { outcome, reason }),
            );
        }
    }

    /// Reads this process's CPU, memory and file descriptors into the `process_*`
    /// metrics (before a scrape).
    pub fn refresh_process(&self) {
        let sample = ProcessSample::now();
        {
            let _order = self
                .process_cpu_update
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let delta = sample.cpu_seconds - self.process_cpu.get();
            if delta > 0.0 {
                self.process_cpu.inc_by(delta);
            }
        }
        self.process_resident.set(clamp(sample.resident_bytes));
        self.process_virtual.set(clamp(sample.virtual_bytes));
        self.process_open_fds.set(clamp(sample.open_fds));
        self.process_max_fds.set(clamp(sample.max_fds));
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> String {
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
        out
    }

    /// Marks the daemon ready after `startup`.
    pub fn set_ready(&self, startup: Duration) {
        self.startup_seconds.set(startup.as_secs_f64());
        self.ready.set(1);
    }

    /// Whether the daemon is ready now (it can stop being ready while HAProxy does not
    /// answer).
    pub fn set_ready_now(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Secrets watched, and how many of them finished their first sync.
    pub fn set_secrets(&self, watched: usize, synced: usize) {
        self.watched_secrets.set(to_i64(watched));
        self.synced_secrets.set(to_i64(synced));
    }

    /// The adaptive limiter's window and counters (before a scrape).
    pub fn set_limiter(&self, snapshot: &LimiterSnapshot) {
        self.startup_window.set(
            snapshot
                .window
                .map_or(f64::INFINITY, |window| window as f64),
        );
        self.startup_in_flight.set(to_i64(snapshot.in_flight));
        self.startup_waiting.set(to_i64(snapshot.waiting));
        self.startup_throttled.set(i64::from(snapshot.throttled));
        let _order = self
            .startup_update
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (counter, total) in [
            (&self.startup_refusals, snapshot.refused),
            (&self.startup_decreases, snapshot.decreases),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    /// Routes registered with a secret.
    pub fn set_registered_routes(&self, routes: usize) {
        self.registered_routes.set(to_i64(routes));
    }

    /// A route moved from state `old` to `new` (`None`: not known / removed).
    pub fn route_changed(&self, old: Option<RouteState>, new: Option<RouteState>) {
        if old == new {
            return;
        }
        match old {
            Some(RouteState::Admitted) => {
                self.routes_admitted.dec();
            }
            Some(RouteState::Rejected { reason, cause }) => {
                self.routes_rejected
                    .get_or_create(&RejectedLabels { reason, cause })
                    .dec();
            }
            None => {}
        }
        match new {
            Some(RouteState::Admitted) => {
                self.routes_admitted.inc();
            }
            Some(RouteState::Rejected { reason, cause }) => {
                self.routes_rejected
                    .get_or_create(&RejectedLabels { reason, cause })
                    .inc();
            }
            None => {}
        }
    }

    /// Counts a decision: `admitted`, `rejected` or `removed`, with the reason's name
    /// (empty when there is none).
    pub fn route_outcome(&self, outcome: &'static str, reason: &'static str) {
        self.route_outcomes
            .get_or_create(&OutcomeLabels { outcome, reason })
            .inc();
    }

    /// Records the `notAfter` of the certificate now served for `route`, from
    /// `secret` (replacing the series of an earlier secret).
    pub fn certificate_served(&self, route: &RouteKey, secret: &str, not_after: Timestamp) {
        let labels = |secret: String| CertificateLabels {
            namespace: route.namespace.to_string(),
            route: route.name.to_string(),
            secret,
        };
        let previous = self
            .expiration_secrets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(route.clone(), secret.to_owned());
        if let Some(previous) = previous.filter(|previous| previous != secret) {
            self.expiration.remove(&labels(previous));
        }
        self.expiration
            .get_or_create(&labels(secret.to_owned()))
            .set(not_after.as_second());
    }

    /// `route` no longer exists (or no longer has an external certificate): its
    /// expiration series goes.
    pub fn route_removed(&self, route: &RouteKey) {
        let previous = self
            .expiration_secrets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(route);
        if let Some(secret) = previous {
            self.expiration.remove(&CertificateLabels {
                namespace: route.namespace.to_string(),
                route: route.name.to_string(),
                secret,
            });
        }
    }

    /// Bundles on disk, and the writes and failures of a flush.
    pub fn bundles_flushed(&self, bundles: usize, writes: usize, failures: usize) {
        self.bundles.set(to_i64(bundles));
        self.bundle_writes.inc_by(writes as u64);
        self.bundle_write_failures.inc_by(failures as u64);
    }

    /// Whether a change waits for the reload command.
    pub fn set_reload_pending(&self, pending: bool) {
        self.reload_pending.set(i64::from(pending));
    }

    /// The reload command started.
    pub fn reload_started(&self) {
        self.reload_running.set(1);
    }

    /// The reload command ended, successfully or not. Counted here, after the fact,
    /// so that a scrape showing `reloads_total = n` and `reload_running = 0` has seen
    /// `n` complete runs.
    pub fn reload_finished(&self, ok: bool, took: Duration) {
        self.reload_duration.observe(took.as_secs_f64());
        self.reloads.inc();
        if !ok {
            self.reload_failures.inc();
        }
        self.reload_running.set(0);
    }

    /// A runtime API command was sent (`command`: its verb, e.g. `set ssl cert`).
    pub fn haproxy_command(&self, command: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.haproxy_commands
            .get_or_create(&CommandLabels { command, result })
            .inc();
    }

    /// A synchronisation with HAProxy ended.
    pub fn haproxy_synced(&self, ok: bool) {
        if !ok {
            self.haproxy_sync_failures.inc();
        }
        self.haproxy_in_sync.set(i64::from(ok));
    }

    /// Whether HAProxy holds every certificate as the crt-list says.
    pub fn haproxy_in_sync(&self, in_sync: bool) {
        self.haproxy_in_sync.set(i64::from(in_sync));
    }

    /// A failed API request from `source` (`routes`, `namespaces`, `secrets`), with its
    /// HTTP code or `transport` / `timeout`.
    pub fn api_error(&self, source: &'static str, code: String) {
        self.api_errors
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
        self.api_error(source, code);
    }

    /// Open connections to the API server.
    pub fn set_api_connections(&self, http2: u64, http1: u64) {
        self.api_connections
            .get_or_create(&ProtocolLabels { protocol: "http2" })
            .set(i64::try_from(http2).unwrap_or(i64::MAX));
        self.api_connections
            .get_or_create(&ProtocolLabels { protocol: "http1" })
            .set(i64::try_from(http1).unwrap_or(i64::MAX));
    }
}

/// The HTTP code of a kube error, or `transport`.
pub fn kube_error_code(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if status.code != 0 => status.code.to_string(),
        _ => "transport".to_owned(),
    }
}

fn monitor_error_code(error: &MonitorError) -> String {
    match error.kind() {
        MonitorErrorKind::SyncTimeout { .. } => "timeout".to_owned(),
        MonitorErrorKind::NotFound => "404".to_owned(),
        _ => error
            .status_code()
            .map_or_else(|| "transport".to_owned(), |code| code.to_string()),
    }
}

fn to_i64(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The `process_*` metrics, unprefixed as every Prometheus client library names them.
fn register_startup_metrics(registry: &mut Registry, metrics: &Metrics) {
    registry.register(
        "startup_window",
        "Requests (first syncs of secrets, access reviews) the adaptive limiter lets out at once; +Inf while unbounded",
        metrics.startup_window.clone(),
    );
    registry.register(
        "startup_in_flight",
        "Requests of the adaptive limiter out now",
        metrics.startup_in_flight.clone(),
    );
    registry.register(
        "startup_waiting",
        "Requests waiting for the adaptive limiter's window, refused ones re-queued included",
        metrics.startup_waiting.clone(),
    );
    registry.register(
        "startup_throttled",
        "1 while the API server's load holds requests back (Retry-After pause, or work waiting behind a shrunk window)",
        metrics.startup_throttled.clone(),
    );
    registry.register(
        "startup_refusals",
        "Requests of the adaptive limiter the API server refused for load (429, 5xx)",
        metrics.startup_refusals.clone(),
    );
    registry.register(
        "startup_window_decreases",
        "Times the adaptive limiter's window was shrunk",
        metrics.startup_decreases.clone(),
    );
}

fn register_process_metrics(registry: &mut Registry, metrics: &Metrics) {
    registry.register_with_unit(
        "process_cpu",
        "Total user and system CPU time spent",
        Unit::Seconds,
        metrics.process_cpu.clone(),
    );
    registry.register_with_unit(
        "process_resident_memory",
        "Resident memory size",
        Unit::Bytes,
        metrics.process_resident.clone(),
    );
    registry.register_with_unit(
        "process_virtual_memory",
        "Virtual memory size",
        Unit::Bytes,
        metrics.process_virtual.clone(),
    );
    registry.register(
        "process_open_fds",
        "Number of open file descriptors",
        metrics.process_open_fds.clone(),
    );
    registry.register(
        "process_max_fds",
        "Maximum number of open file descriptors",
        metrics.process_max_fds.clone(),
    );
    let start = Gauge::<f64, AtomicU64>::default();
    if let Some(started) = start_time_seconds() {
        start.set(started);
    }
    registry.register_with_unit(
        "process_start_time",
        "Start time of the process since the Unix epoch",
        Unit::Seconds,
        start,
    );
}

impl kube_h2::RequestObserver for Metrics {
    fn response(&self, record: &kube_h2::ResponseRecord<'_>) {
        let verb = record.verb.as_str();
        self.api_requests
            .get_or_create(&RequestLabels {
                resource: record.resource.to_owned(),
                verb,
                code: record
                    .code
                    .map_or_else(|| "none".to_owned(), |code| code.to_string()),
            })
            .inc();
        if record.retry {
            self.api_retries
                .get_or_create(&RetryLabels {
                    resource: record.resource.to_owned(),
                    verb,
                })
                .inc();
        }
    }
}

impl MonitorObserver for Metrics {
    fn first_sync(&self, _key: &ObjectKey, elapsed: Duration, outcome: Result<(), &MonitorError>) {
        self.first_sync.observe(elapsed.as_secs_f64());
        if outcome.is_err() {
            self.first_sync_failures.inc();
        }
    }

    fn watch_error(&self, _key: &ObjectKey, error: &MonitorError) {
        self.api_error("secrets", monitor_error_code(error));
    }
}

/// Keeps each route's state so that gauges by state stay exact.
#[derive(Debug, Default)]
pub struct RouteStates {
    states: HashMap<RouteKey, RouteState>,
    /// Of those, routes admitted (so that the counts cost nothing per batch).
    admitted: usize,
}

impl RouteStates {
    /// Sets `route`'s state (`None`: forget it) and updates `metrics`.
    pub fn set(&mut self, metrics: &Metrics, route: &RouteKey, state: Option<RouteState>) {
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
        metrics.route_changed(old, state);
    }

    /// Routes admitted and rejected now.
    pub fn counts(&self) -> (usize, usize) {
        (self.admitted, self.states.len() - self.admitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_follow_route_states() {
        let metrics = Metrics::new();
        let mut states = RouteStates::default();
        let a = RouteKey::new("ns", "a");
        let b = RouteKey::new("ns", "b");
        states.set(&metrics, &a, Some(RouteState::Admitted));
        states.set(
            &metrics,
            &b,
            Some(RouteState::Rejected {
                reason: "ExternalCertificateSecretDeleted",
                cause: "secret_deleted",
            }),
        );
        states.set(
            &metrics,
            &a,
            Some(RouteState::Rejected {
                reason: "ExternalCertificateSecretDeleted",
                cause: "secret_deleted",
            }),
        );
        states.set(&metrics, &b, None);
        let text = metrics.encode();
        assert!(text.contains("certwatch_routes_admitted 0\n"), "{text}");
        assert!(
            text.contains(
                "certwatch_routes_rejected{reason=\"ExternalCertificateSecretDeleted\",cause=\"secret_deleted\"} 1\n"
            ),
            "{text}"
        );
        assert_eq!(states.counts(), (0, 1));
    }

    /// Counters and known label sets exist from the start at 0; HAProxy's metrics
    /// only when HAProxy is configured; build and process information is there.
    #[test]
    fn what_exists_from_the_start() {
        let metrics = Metrics::new();
        metrics.refresh_process();
        let text = metrics.encode();
        for sample in [
            "certwatch_bundle_write_failures_total 0\n",
            "certwatch_reload_failures_total 0\n",
            "certwatch_routes_rejected{reason=\"ExternalCertificateValidationFailed\",cause=\"rbac\"} 0\n",
            "certwatch_routes_rejected{reason=\"ExtendedValidationFailed\",cause=\"bad_pem\"} 0\n",
            "certwatch_route_outcomes_total{outcome=\"removed\",reason=\"\"} 0\n",
            "certwatch_ready 0\n",
            "certwatch_reload_duration_seconds_count 0\n",
            &format!(
                "certwatch_build_info{{version=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION")
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

    /// The expiration series follows the route's secret and stays while the route
    /// is rejected; it goes with the route.
    #[test]
    fn expiration_stays_while_the_route_exists() {
        let metrics = Metrics::new();
        let route = RouteKey::new("ns", "shop");
        let at = Timestamp::from_second(2_000_000_000).unwrap();
        let series = |secret: &str| {
            format!(
                "certwatch_certificate_expiration_timestamp_seconds{{namespace=\"ns\",route=\"shop\",secret=\"{secret}\"}} 2000000000\n"
            )
        };
        metrics.certificate_served(&route, "old", at);
        assert!(metrics.encode().contains(&series("old")));
        metrics.certificate_served(&route, "new", at);
        let text = metrics.encode();
        assert!(text.contains(&series("new")), "{text}");
        assert!(!text.contains(&series("old")), "{text}");
        let mut states = RouteStates::default();
        states.set(
            &metrics,
            &route,
            Some(RouteState::Rejected {
                reason: "ExternalCertificateSecretDeleted",
                cause: "secret_deleted",
            }),
        );
        assert!(metrics.encode().contains(&series("new")));
        metrics.route_removed(&route);
        assert!(!metrics.encode().contains("expiration_timestamp_seconds{"));
    }

    #[test]
    fn counters_carry_the_total_suffix() {
        let metrics = Metrics::new();
        metrics.reload_started();
        metrics.reload_finished(false, Duration::from_millis(10));
        metrics.api_error("routes", "503".to_owned());
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

    #[test]
    fn the_limiters_window_and_counters_follow_its_snapshots() {
        let metrics = Metrics::new();
        let mut snapshot = LimiterSnapshot::default();
        metrics.set_limiter(&snapshot);
        let text = metrics.encode();
        assert!(text.contains("certwatch_startup_window +Inf\n"), "{text}");
        assert!(
            text.contains("certwatch_startup_refusals_total 0\n"),
            "{text}"
        );
        snapshot = LimiterSnapshot {
            window: Some(4),
            in_flight: 4,
            waiting: 200,
            throttled: true,
            refused: 296,
            decreases: 1,
            ..snapshot
        };
        // Scraped twice: the counters add each refusal once.
        metrics.set_limiter(&snapshot);
        metrics.set_limiter(&snapshot);
        snapshot.refused = 297;
        snapshot.decreases = 2;
        metrics.set_limiter(&snapshot);
        let text = metrics.encode();
        for sample in [
            "certwatch_startup_window 4.0\n",
            "certwatch_startup_in_flight 4\n",
            "certwatch_startup_waiting 200\n",
            "certwatch_startup_throttled 1\n",
            "certwatch_startup_refusals_total 297\n",
            "certwatch_startup_window_decreases_total 2\n",
        ] {
            assert!(text.contains(sample), "{sample} in {text}");
        }
    }
}
