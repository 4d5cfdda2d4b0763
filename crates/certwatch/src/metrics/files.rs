//! The cert directory: bundles on disk, and their writes.
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_bundles` | gauge | | bundles on disk in the cert directory (files really written) |
//! | `certwatch_bundle_writes_total` | counter | | bundles written or removed |
//! | `certwatch_bundle_write_failures_total` | counter | | failed writes or removals (retried) |

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::to_i64;

/// Bundles and the crt-list in the cert directory.
#[derive(Debug)]
pub struct FileMetrics {
    bundles: Gauge,
    writes: Counter,
    write_failures: Counter,
}

impl FileMetrics {
    pub(super) fn new() -> Self {
        Self {
            bundles: Gauge::default(),
            writes: Counter::default(),
            write_failures: Counter::default(),
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "bundles",
            "Bundles in the cert directory",
            self.bundles.clone(),
        );
        registry.register(
            "bundle_writes",
            "Bundles written or removed",
            self.writes.clone(),
        );
        registry.register(
            "bundle_write_failures",
            "Failed bundle or crt-list writes and removals (retried)",
            self.write_failures.clone(),
        );
    }

    /// Bundles on disk, and the writes and failures of a flush.
    pub fn flushed(&self, bundles: usize, writes: usize, failures: usize) {
        self.bundles.set(to_i64(bundles));
        self.writes.inc_by(writes as u64);
        self.write_failures.inc_by(failures as u64);
    }
}
