//! The daemon as a whole: readiness, start-up time, build information.
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_ready` | gauge | | 1 once every route present at start-up is decided and its files are written |
//! | `certwatch_startup_duration_seconds` | gauge | | time from start to ready |
//! | `certwatch_metrics_scrapes_total` | counter | `result` | requests for `/metrics` on `--metrics-listen`: `served`, `unauthenticated` (401), `forbidden` (403), `review_failed` (503) |
//! | `certwatch_build_info` | gauge | `version`, `commit` | always 1; `commit` is the git commit built from (`unknown` when the source had no git and the build was not told it) |

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScrapeLabels {
    result: &'static str,
}

/// The results of a scrape of the authorized metrics endpoint.
const SCRAPE_RESULTS: [&str; 4] = ["served", "unauthenticated", "forbidden", "review_failed"];

/// The git commit this binary is built from, or `unknown` (see `build.rs`).
pub const COMMIT: &str = env!("CERTWATCH_COMMIT");

/// Readiness, start-up time and build information.
#[derive(Debug)]
pub struct DaemonMetrics {
    ready: Gauge,
    startup_seconds: Gauge<f64, AtomicU64>,
    build_info: Family<BuildLabels, Gauge>,
    scrapes: Family<ScrapeLabels, Counter>,
}

impl DaemonMetrics {
    pub(super) fn new() -> Self {
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                commit: COMMIT,
            })
            .set(1);
        let scrapes = Family::<ScrapeLabels, Counter>::default();
        for result in SCRAPE_RESULTS {
            drop(scrapes.get_or_create(&ScrapeLabels { result }));
        }
        Self {
            ready: Gauge::default(),
            startup_seconds: Gauge::default(),
            build_info,
            scrapes,
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "ready",
            "1 once every route present at start-up is decided and its files are written",
            self.ready.clone(),
        );
        registry.register_with_unit(
            "startup_duration",
            "Time from start to ready",
            Unit::Seconds,
            self.startup_seconds.clone(),
        );
        registry.register(
            "build_info",
            "certwatch's version and the git commit it is built from; always 1",
            self.build_info.clone(),
        );
        registry.register(
            "metrics_scrapes",
            "Requests for /metrics on the authorized endpoint, by result (served, unauthenticated, forbidden, review_failed)",
            self.scrapes.clone(),
        );
    }

    /// A request for `/metrics` on the authorized endpoint ended with `result` (one of
    /// `served`, `unauthenticated`, `forbidden`, `review_failed`).
    pub fn scrape(&self, result: &'static str) {
        self.scrapes.get_or_create(&ScrapeLabels { result }).inc();
    }

    /// Marks the daemon ready after `startup`.
    pub fn set_ready(&self, startup: Duration) {
        self.startup_seconds.set(startup.as_secs_f64());
        self.ready.set(1);
    }
}
