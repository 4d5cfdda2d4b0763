//! Secrets: the shared per-secret watches, their first syncs, and the routes
//! registered with them.
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_watched_secrets` | gauge | | secrets with a watch (one per distinct secret) |
//! | `certwatch_synced_secrets` | gauge | | of those, secrets whose first sync is done |
//! | `certwatch_registered_routes` | gauge | | routes registered with a secret |
//! | `certwatch_secret_first_sync_duration_seconds` | histogram | | time of each secret's first sync |
//! | `certwatch_secret_first_sync_failures_total` | counter | | first syncs that failed |

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::to_i64;

/// Watched secrets, their first syncs, and the routes registered with them.
#[derive(Debug)]
pub struct SecretMetrics {
    watched: Gauge,
    synced: Gauge,
    registered_routes: Gauge,
    first_sync: Histogram,
    first_sync_failures: Counter,
}

impl SecretMetrics {
    pub(super) fn new() -> Self {
        Self {
            watched: Gauge::default(),
            synced: Gauge::default(),
            registered_routes: Gauge::default(),
            // 5 ms to about 160 s.
            first_sync: Histogram::new(exponential_buckets(0.005, 2.0, 16)),
            first_sync_failures: Counter::default(),
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "watched_secrets",
            "Secrets with a watch (one per distinct secret)",
            self.watched.clone(),
        );
        registry.register(
            "synced_secrets",
            "Watched secrets whose first sync is done",
            self.synced.clone(),
        );
        registry.register(
            "registered_routes",
            "Routes registered with their secret",
            self.registered_routes.clone(),
        );
        registry.register_with_unit(
            "secret_first_sync_duration",
            "Time of each secret's first sync (list and watch, or streaming list)",
            Unit::Seconds,
            self.first_sync.clone(),
        );
        registry.register(
            "secret_first_sync_failures",
            "First syncs of a secret that failed",
            self.first_sync_failures.clone(),
        );
    }

    /// Secrets watched, and how many of them finished their first sync (before a
    /// scrape).
    pub fn set_counts(&self, watched: usize, synced: usize) {
        self.watched.set(to_i64(watched));
        self.synced.set(to_i64(synced));
    }

    /// Routes registered with a secret (before a scrape).
    pub fn set_registered_routes(&self, routes: usize) {
        self.registered_routes.set(to_i64(routes));
    }

    /// A secret's first sync ended after `elapsed`, successfully or not.
    pub fn first_sync(&self, elapsed: Duration, ok: bool) {
        self.first_sync.observe(elapsed.as_secs_f64());
        if !ok {
            self.first_sync_failures.inc();
        }
    }
}
