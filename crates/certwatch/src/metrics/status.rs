//! Route status writes (`--write-status`) and the one writer among replicas.
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_status_leader` | gauge | | 1 while this replica writes route status (it holds the Lease, or elects none) |
//! | `certwatch_status_writes_enabled` | gauge | | 1 when this replica takes part in writing route status (`--write-status`), 0 otherwise |
//! | `certwatch_status_writes_total` | counter | `outcome`: `written`, `unchanged`, `conflict`, `failed`, `following` | status writes a route's outcome asked for, by what became of them: written, already shown in the status (no request), met a 409 and redone on a fresh copy, given up after its attempts, left to the replica that writes status |
//! | `certwatch_status_requests_total` | counter | | status update requests sent (PUT routes/status) |

use std::sync::Mutex;

use kube_common::sync;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use route_secrets::api::status_writer::StatusStats;

/// The `outcome` label of `certwatch_status_writes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

const OUTCOMES: [&str; 5] = ["written", "unchanged", "conflict", "failed", "following"];

/// Status writes and leadership.
#[derive(Debug)]
pub struct StatusMetrics {
    leader: Gauge,
    /// Tells "no writer" from "status writes off": the leader gauge is 0 in both.
    enabled: Gauge,
    updates: Family<Outcome, Counter>,
    writes: Counter,
    /// What was counted so far (the writer's counters are totals): each refresh adds
    /// the difference. Guards only this copy; never held across an await.
    counted: Mutex<StatusStats>,
}

impl StatusMetrics {
    pub(super) fn new() -> Self {
        let updates = Family::<Outcome, Counter>::default();
        for outcome in OUTCOMES {
            let _ = updates.get_or_create(&Outcome { outcome });
        }
        Self {
            leader: Gauge::default(),
            enabled: Gauge::default(),
            updates,
            writes: Counter::default(),
            counted: Mutex::new(StatusStats::default()),
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "status_leader",
            "1 while this replica writes route status (it holds the Lease, or elects none)",
            self.leader.clone(),
        );
        registry.register(
            "status_writes_enabled",
            "1 when this replica takes part in writing route status (--write-status)",
            self.enabled.clone(),
        );
        registry.register(
            "status_writes",
            "Status writes a route's outcome asked for, by what became of them",
            self.updates.clone(),
        );
        registry.register(
            "status_requests",
            "Status update requests sent (PUT routes/status)",
            self.writes.clone(),
        );
    }

    /// Brings the metrics up to the writer's counters and this replica's leadership.
    pub fn set(&self, stats: StatusStats, leading: bool) {
        self.enabled.set(1);
        self.leader.set(i64::from(leading));
        let mut counted = sync::lock(&self.counted);
        let add = |outcome: &'static str, now: u64, before: u64| {
            self.updates
                .get_or_create(&Outcome { outcome })
                .inc_by(now.saturating_sub(before));
        };
        add("written", stats.recorded, counted.recorded);
        add("unchanged", stats.skipped, counted.skipped);
        add("conflict", stats.conflicts, counted.conflicts);
        add("failed", stats.failed, counted.failed);
        add("following", stats.followed, counted.followed);
        self.writes
            .inc_by(stats.writes.saturating_sub(counted.writes));
        *counted = stats;
    }
}
