//! HAProxy: the runtime API and the controller (`--haproxy-socket`, or the HAProxy of
//! `--haproxy-config-dir`). These metrics are in the registry only when HAProxy is
//! configured
//! ([`Metrics::register_haproxy`](super::Metrics::register_haproxy)).
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_haproxy_commands_total` | counter | `command`, `result` | runtime API commands sent |
//! | `certwatch_haproxy_sync_failures_total` | counter | | attempts to bring HAProxy up to date that failed, retried |
//! | `certwatch_haproxy_in_sync` | gauge | | 1 when HAProxy holds exactly the crt-list's certificates |
//! | `certwatch_routes_admitted_not_served` | gauge | | admitted routes whose current certificate and line HAProxy does not hold yet (refused ones not included) |
//! | `certwatch_oldest_unserved_change_age_seconds` | gauge | | age of the oldest change (new, changed or removed route) HAProxy does not serve yet; 0 when none |
//! | `certwatch_haproxy_refused_routes` | gauge | | admitted routes HAProxy refused (too large for its runtime API with no reload to fall back on, or material it rejects) |
//! | `certwatch_haproxy_refusals_total` | counter | `reason` | refusals, by `too_large` and `rejected` |
//! | `certwatch_haproxy_reloads_total` | counter | `reason`, `result` | HAProxy starts and reloads certwatch made, by why ([`ReloadReason`]: `start`, `routes`, `too_large`, `backlog`) and `ok`/`failed` |
//! | `certwatch_haproxy_load_duration_seconds` | gauge | | how long HAProxy's last start or reload took to load its files |
//! | `certwatch_haproxy_up` | gauge | | 1 while HAProxy answers and (when certwatch runs it) its worker serves |
//! | `certwatch_haproxy_pushed_certificates_total` | counter | | certificates pushed through the runtime API (new or changed material) |

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    command: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    reason: &'static str,
    result: &'static str,
}

/// Why HAProxy was started or reloaded (the `reason` label of its loads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadReason {
    /// The first load: HAProxy started.
    Start,
    /// The routes' configuration changed.
    Routes,
    /// More certificates changed than the runtime API takes in good time.
    Backlog,
    /// A certificate does not fit in one runtime API request: only a reload loads it.
    TooLarge,
}

impl ReloadReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Routes => "routes",
            Self::Backlog => "backlog",
            Self::TooLarge => "too_large",
        }
    }
}

/// Why HAProxy did not take a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// The bundle does not fit in one runtime API request (`tune.bufsize`), and no
    /// reload can load it from its file.
    TooLarge,
    /// HAProxy rejected the material (`set ssl cert` or `commit ssl cert` failed).
    Rejected,
}

impl RefusalReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooLarge => "too_large",
            Self::Rejected => "rejected",
        }
    }
}

/// HAProxy's runtime API commands, and what the controller says about HAProxy.
#[derive(Debug)]
pub struct HaproxyMetrics {
    commands: Family<CommandLabels, Counter>,
    sync_failures: Counter,
    in_sync: Gauge,
    not_served: Gauge,
    oldest_age: Gauge<f64, AtomicU64>,
    /// Unix milliseconds of the oldest unserved change; 0: none.
    oldest_since_ms: AtomicU64,
    refused_routes: Gauge,
    refusals: Family<RefusalLabels, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    load_seconds: Gauge<f64, AtomicU64>,
    up: Gauge,
    pushed: Counter,
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

impl HaproxyMetrics {
    pub(super) fn new() -> Self {
        let refusals = Family::<RefusalLabels, Counter>::default();
        for reason in [RefusalReason::TooLarge, RefusalReason::Rejected] {
            drop(refusals.get_or_create(&RefusalLabels {
                reason: reason.as_str(),
            }));
        }
        Self {
            commands: Family::default(),
            sync_failures: Counter::default(),
            in_sync: Gauge::default(),
            not_served: Gauge::default(),
            oldest_age: Gauge::default(),
            oldest_since_ms: AtomicU64::new(0),
            refused_routes: Gauge::default(),
            refusals,
            reloads: Family::default(),
            load_seconds: Gauge::default(),
            up: Gauge::default(),
            pushed: Counter::default(),
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "haproxy_commands",
            "HAProxy runtime API commands sent, by command and result",
            self.commands.clone(),
        );
        registry.register(
            "haproxy_sync_failures",
            "Attempts to bring HAProxy up to date that failed (retried)",
            self.sync_failures.clone(),
        );
        registry.register(
            "haproxy_in_sync",
            "1 when HAProxy holds exactly the crt-list's certificates",
            self.in_sync.clone(),
        );
        registry.register(
            "routes_admitted_not_served",
            "Admitted routes whose current certificate and line HAProxy does not hold yet",
            self.not_served.clone(),
        );
        registry.register(
            "oldest_unserved_change_age_seconds",
            "Age of the oldest change HAProxy does not serve yet (0: none)",
            self.oldest_age.clone(),
        );
        registry.register(
            "haproxy_refused_routes",
            "Admitted routes HAProxy refused",
            self.refused_routes.clone(),
        );
        registry.register(
            "haproxy_refusals",
            "Certificates HAProxy refused, by reason",
            self.refusals.clone(),
        );
        registry.register(
            "haproxy_reloads",
            "HAProxy starts and reloads made by certwatch, by reason and result",
            self.reloads.clone(),
        );
        registry.register(
            "haproxy_load_duration_seconds",
            "How long HAProxy's last start or reload took to load its files",
            self.load_seconds.clone(),
        );
        registry.register(
            "haproxy_up",
            "1 while HAProxy answers and its worker serves",
            self.up.clone(),
        );
        registry.register(
            "haproxy_pushed_certificates",
            "Certificates pushed through the runtime API",
            self.pushed.clone(),
        );
    }

    /// A runtime API command was sent (`command`: its verb, e.g. `set ssl cert`).
    pub fn command(&self, command: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.commands
            .get_or_create(&CommandLabels { command, result })
            .inc();
    }

    /// An attempt to bring HAProxy up to date ended.
    pub fn synced(&self, ok: bool) {
        if !ok {
            self.sync_failures.inc();
        }
        self.in_sync.set(i64::from(ok));
    }

    /// Whether HAProxy holds every certificate as the crt-list says.
    pub fn set_in_sync(&self, in_sync: bool) {
        self.in_sync.set(i64::from(in_sync));
    }

    /// Routes not served, routes refused, and when the oldest unserved change came.
    pub fn set_serving(&self, not_served: usize, refused: usize, oldest: Option<SystemTime>) {
        self.not_served
            .set(i64::try_from(not_served).unwrap_or(i64::MAX));
        self.refused_routes
            .set(i64::try_from(refused).unwrap_or(i64::MAX));
        self.oldest_since_ms
            .store(oldest.map_or(0, unix_ms), Ordering::Relaxed);
        self.refresh();
    }

    /// Brings the age gauge to now (before a scrape).
    pub fn refresh(&self) {
        let since = self.oldest_since_ms.load(Ordering::Relaxed);
        let age = if since == 0 {
            0.0
        } else {
            let now = unix_ms(SystemTime::now());
            Duration::from_millis(now.saturating_sub(since)).as_secs_f64()
        };
        self.oldest_age.set(age);
    }

    /// A certificate HAProxy refused.
    pub fn refused(&self, reason: RefusalReason) {
        self.refusals
            .get_or_create(&RefusalLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// A start or reload ended.
    pub fn reloaded(&self, reason: ReloadReason, ok: bool, took: Option<Duration>) {
        let result = if ok { "ok" } else { "failed" };
        self.reloads
            .get_or_create(&ReloadLabels {
                reason: reason.as_str(),
                result,
            })
            .inc();
        if let Some(took) = took {
            self.load_seconds.set(took.as_secs_f64());
        }
    }

    /// Whether HAProxy answers.
    pub fn set_up(&self, up: bool) {
        self.up.set(i64::from(up));
    }

    /// Certificates pushed.
    pub fn pushed(&self, certificates: usize) {
        self.pushed
            .inc_by(u64::try_from(certificates).unwrap_or(u64::MAX));
    }
}
