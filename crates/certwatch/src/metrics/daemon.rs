//! The daemon as a whole: readiness, start-up time, build information.
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_ready` | gauge | | 1 once every route present at start-up is decided and its files are written |
//! | `certwatch_startup_duration_seconds` | gauge | | time from start to ready |
//! | `certwatch_build_info` | gauge | `version` | always 1 |

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// Readiness, start-up time and build information.
#[derive(Debug)]
pub struct DaemonMetrics {
    ready: Gauge,
    startup_seconds: Gauge<f64, AtomicU64>,
    build_info: Family<BuildLabels, Gauge>,
}

impl DaemonMetrics {
    pub(super) fn new() -> Self {
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        Self {
            ready: Gauge::default(),
            startup_seconds: Gauge::default(),
            build_info,
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
            "certwatch's version; always 1",
            self.build_info.clone(),
        );
    }

    /// Marks the daemon ready after `startup`.
    pub fn set_ready(&self, startup: Duration) {
        self.startup_seconds.set(startup.as_secs_f64());
        self.ready.set(1);
    }
}
