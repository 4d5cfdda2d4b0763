//! The reload command (`--reload-command`).
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_reloads_total` | counter | | runs of the reload command |
//! | `certwatch_reload_failures_total` | counter | | runs that failed (exit status, timeout, spawn error) |
//! | `certwatch_reload_duration_seconds` | histogram | | time each run of the reload command took |
//! | `certwatch_reload_pending` | gauge | | 1 while a change waits for a reload |
//! | `certwatch_reload_running` | gauge | | 1 while the reload command runs |

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The reload command's runs.
#[derive(Debug)]
pub struct ReloadMetrics {
    runs: Counter,
    failures: Counter,
    duration: Histogram,
    pending: Gauge,
    running: Gauge,
}

impl ReloadMetrics {
    pub(super) fn new() -> Self {
        Self {
            runs: Counter::default(),
            failures: Counter::default(),
            // 10 ms to about 160 s.
            duration: Histogram::new(exponential_buckets(0.01, 2.0, 15)),
            pending: Gauge::default(),
            running: Gauge::default(),
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register("reloads", "Runs of the reload command", self.runs.clone());
        registry.register(
            "reload_failures",
            "Runs of the reload command that failed",
            self.failures.clone(),
        );
        registry.register_with_unit(
            "reload_duration",
            "Time each run of the reload command took",
            Unit::Seconds,
            self.duration.clone(),
        );
        registry.register(
            "reload_pending",
            "1 while a change waits for the reload command",
            self.pending.clone(),
        );
        registry.register(
            "reload_running",
            "1 while the reload command runs",
            self.running.clone(),
        );
    }

    /// Whether a change waits for the reload command.
    pub fn set_pending(&self, pending: bool) {
        self.pending.set(i64::from(pending));
    }

    /// The reload command started.
    pub fn started(&self) {
        self.running.set(1);
    }

    /// The reload command ended, successfully or not. Counted here, after the fact,
    /// so that a scrape showing `reloads_total = n` and `reload_running = 0` has seen
    /// `n` complete runs.
    pub fn finished(&self, ok: bool, took: Duration) {
        self.duration.observe(took.as_secs_f64());
        self.runs.inc();
        if !ok {
            self.failures.inc();
        }
        self.running.set(0);
    }
}
