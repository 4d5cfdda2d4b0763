//! The state every request handler shares: the store and its authorizer, the users,
//! the accounting, the run-time knobs (latency, limits, faults) and the server's own
//! identity (address, CA, tokens). The simulator builds it once; the API and admin
//! handlers read it; nothing below them knows it exists.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube_common::Verb;
use tokio_util::sync::CancellationToken;

use crate::auth::rbac::Authorizer;
use crate::auth::users::Users;
use crate::config::{FlowControlConfig, LatencyConfig, ServerFeatures};
use crate::control::faults::{FaultControl, Faults};
use crate::control::flow_control::FlowControl;
use crate::control::limits::Limiter;
use crate::control::metrics::RequestMetrics;
use crate::control::stats::{RequestLog, SimStats, Stats};
use crate::storage::store::Store;

/// State shared by every connection and every request.
pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub authorizer: Authorizer,
    pub users: Users,
    pub stats: Arc<Stats>,
    pub metrics: Arc<RequestMetrics>,
    pub log: RequestLog,
    pub limiter: Arc<Limiter>,
    /// Guards the API Priority and Fairness filter, `None` when off; replaced whole
    /// when reconfigured (seats taken from the old one are given back to it).
    pub flow_control: RwLock<Option<Arc<FlowControl>>>,
    /// Guards the current latency model (replaced whole by `set_latency`).
    pub latency: RwLock<LatencyConfig>,
    pub faults: Arc<Faults>,
    /// Guards the server's features (replaced whole by `set_features`).
    pub features: RwLock<ServerFeatures>,
    /// Whether rules reviews say `incomplete`, as when an authorizer that cannot list
    /// its rules (a webhook) is in the chain.
    pub rules_incomplete: AtomicBool,
    pub bookmark_interval: Duration,
    pub addr: SocketAddr,
    pub url: String,
    pub ca_pem: Option<String>,
    pub admin_token: String,
    pub router_token: String,
    pub runtime: tokio::runtime::Handle,
    /// Cancelled when the simulator shuts down.
    pub shutdown: CancellationToken,
}

impl Shared {
    pub(crate) fn latency_for(&self, verb: Option<Verb>) -> Duration {
        kube_common::sync::read(&self.latency).sample(verb)
    }

    pub(crate) fn latency(&self) -> LatencyConfig {
        kube_common::sync::read(&self.latency).clone()
    }

    pub(crate) fn set_latency(&self, latency: LatencyConfig) {
        *kube_common::sync::write(&self.latency) = latency;
    }

    pub(crate) fn features(&self) -> ServerFeatures {
        *kube_common::sync::read(&self.features)
    }

    pub(crate) fn set_features(&self, features: ServerFeatures) {
        *kube_common::sync::write(&self.features) = features;
    }

    pub(crate) fn flow_control(&self) -> Option<Arc<FlowControl>> {
        kube_common::sync::read(&self.flow_control).clone()
    }

    pub(crate) fn set_flow_control(&self, config: Option<FlowControlConfig>) {
        *kube_common::sync::write(&self.flow_control) = config.map(FlowControl::new);
    }

    pub(crate) fn stats_snapshot(&self) -> SimStats {
        let (inflight, peak_inflight, peak_queued) = self.limiter.counters();
        let mut stats = self.stats.snapshot(inflight, peak_inflight, peak_queued);
        stats.flow_control = self.flow_control().map(|fc| fc.stats());
        stats
    }

    pub(crate) fn reset_stats(&self) {
        self.stats.reset();
        self.limiter.reset_peaks();
        if let Some(fc) = self.flow_control() {
            fc.reset_counters();
        }
    }

    pub(crate) fn faults_handle(&self) -> FaultControl {
        FaultControl {
            faults: self.faults.clone(),
            stats: self.stats.clone(),
            store: self.store.clone(),
            runtime: self.runtime.clone(),
        }
    }
}
