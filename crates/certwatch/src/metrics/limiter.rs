//! The adaptive limiter that paces start-up requests (first syncs of secrets, access
//! reviews) to what the API server accepts.
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_startup_window` | gauge | | requests the adaptive limiter lets out at once; `+Inf` until the API server first refuses one when `--max-concurrent-syncs` is not set |
//! | `certwatch_startup_in_flight` | gauge | | of those, out now |
//! | `certwatch_startup_waiting` | gauge | | requests waiting for the window (refused ones re-queued included) |
//! | `certwatch_startup_throttled` | gauge | | 1 while the API server's load holds requests back (refused requests waiting out their `Retry-After`, or work waiting behind a window shrunk below its bound) |
//! | `certwatch_startup_refusals_total` | counter | | requests of the limiter the API server refused for load (429, 5xx) |
//! | `certwatch_startup_window_decreases_total` | counter | | times the window was shrunk |

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use kube_common::adaptive::LimiterSnapshot;
use kube_common::sync;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::to_i64;

/// The adaptive limiter's window and counters.
#[derive(Debug)]
pub struct LimiterMetrics {
    window: Gauge<f64, AtomicU64>,
    in_flight: Gauge,
    waiting: Gauge,
    throttled: Gauge,
    refusals: Counter,
    decreases: Counter,
    /// Guards nothing but the order of the counter updates: concurrent scrapes must
    /// add each refusal and decrease once.
    update: Mutex<()>,
}

impl LimiterMetrics {
    pub(super) fn new() -> Self {
        Self {
            window: Gauge::default(),
            in_flight: Gauge::default(),
            waiting: Gauge::default(),
            throttled: Gauge::default(),
            refusals: Counter::default(),
            decreases: Counter::default(),
            update: Mutex::new(()),
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "startup_window",
            "Requests (first syncs of secrets, access reviews) the adaptive limiter lets out at once; +Inf while unbounded",
            self.window.clone(),
        );
        registry.register(
            "startup_in_flight",
            "Requests of the adaptive limiter out now",
            self.in_flight.clone(),
        );
        registry.register(
            "startup_waiting",
            "Requests waiting for the adaptive limiter's window, refused ones re-queued included",
            self.waiting.clone(),
        );
        registry.register(
            "startup_throttled",
            "1 while the API server's load holds requests back (Retry-After pause, or work waiting behind a shrunk window)",
            self.throttled.clone(),
        );
        registry.register(
            "startup_refusals",
            "Requests of the adaptive limiter the API server refused for load (429, 5xx)",
            self.refusals.clone(),
        );
        registry.register(
            "startup_window_decreases",
            "Times the adaptive limiter's window was shrunk",
            self.decreases.clone(),
        );
    }

    /// The limiter's window and counters (before a scrape).
    pub fn set(&self, snapshot: &LimiterSnapshot) {
        self.window.set(
            snapshot
                .window
                .map_or(f64::INFINITY, |window| window as f64),
        );
        self.in_flight.set(to_i64(snapshot.in_flight));
        self.waiting.set(to_i64(snapshot.waiting));
        self.throttled.set(i64::from(snapshot.throttled));
        let _order = sync::lock(&self.update);
        for (counter, total) in [
            (&self.refusals, snapshot.refused),
            (&self.decreases, snapshot.decreases),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::*;

    #[test]
    fn the_limiters_window_and_counters_follow_its_snapshots() {
        let metrics = Metrics::new();
        let mut snapshot = LimiterSnapshot::default();
        metrics.limiter.set(&snapshot);
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
        metrics.limiter.set(&snapshot);
        metrics.limiter.set(&snapshot);
        snapshot.refused = 297;
        snapshot.decreases = 2;
        metrics.limiter.set(&snapshot);
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
