//! HAProxy's runtime API (`--haproxy-socket`). These metrics are in the registry only
//! when HAProxy is configured ([`Metrics::register_haproxy`](super::Metrics::register_haproxy)).
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `certwatch_haproxy_commands_total` | counter | `command`, `result` | runtime API commands sent |
//! | `certwatch_haproxy_sync_failures_total` | counter | | synchronisations that failed, retried |
//! | `certwatch_haproxy_in_sync` | gauge | | 1 when HAProxy holds exactly the crt-list's certificates |

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

/// HAProxy's runtime API commands and synchronisations.
#[derive(Debug)]
pub struct HaproxyMetrics {
    commands: Family<CommandLabels, Counter>,
    sync_failures: Counter,
    in_sync: Gauge,
}

impl HaproxyMetrics {
    pub(super) fn new() -> Self {
        Self {
            commands: Family::default(),
            sync_failures: Counter::default(),
            in_sync: Gauge::default(),
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
            "Synchronisations with HAProxy that failed (retried)",
            self.sync_failures.clone(),
        );
        registry.register(
            "haproxy_in_sync",
            "1 when HAProxy holds exactly the crt-list's certificates",
            self.in_sync.clone(),
        );
    }

    /// A runtime API command was sent (`command`: its verb, e.g. `set ssl cert`).
    pub fn command(&self, command: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.commands
            .get_or_create(&CommandLabels { command, result })
            .inc();
    }

    /// A synchronisation with HAProxy ended.
    pub fn synced(&self, ok: bool) {
        if !ok {
            self.sync_failures.inc();
        }
        self.in_sync.set(i64::from(ok));
    }
}
