//! From route outcomes to the proxy: the task that consumes the pipeline's outcomes,
//! keeps the cert directory, metrics and HAProxy current, triggers reloads, and
//! decides when the daemon is ready.
//!
//! Outcomes are taken in batches (everything queued at the moment), so that a burst,
//! like start-up, costs one crt-list write and one reload, not one per route.
//!
//! Ready means: the pipeline has decided every route present at start-up, and every
//! outcome it emitted up to then is on disk. Only then is the crt-list written for the
//! first time, are bundles of routes that no longer exist removed, is HAProxy
//! synchronised and does the reload command run: until then the proxy keeps what it
//! had. Once ready, the daemon stays ready (the files keep being served if the API
//! server goes away later).

use std::sync::Arc;
use std::time::Duration;

use route_secrets::api::pipeline::{Readiness, RouteOutcome};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{info, warn};

use super::cert_dir::{CertDir, ServedCert};
use super::haproxy::HaproxySync;
use super::metrics::{Metrics, RouteState, RouteStates};
use super::reload::Reloader;

/// How long a failed write waits before it is tried again.
const RETRY_DELAY: Duration = Duration::from_secs(5);

/// The daemon's state, for `/readyz`, progress and callers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DaemonStatus {
    /// The pipeline's start-up progress.
    pub readiness: Readiness,
    /// Whether the daemon is ready (see the [module documentation](self)).
    pub ready: bool,
    /// Time from start to ready.
    pub ready_after: Option<Duration>,
    /// Routes served now.
    pub admitted: usize,
    /// Routes rejected now.
    pub rejected: usize,
}

/// The consumer of the pipeline's outputs.
pub(crate) struct Outputs {
    pub(crate) cert_dir: CertDir,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) reloader: Option<Reloader>,
    pub(crate) haproxy: Option<HaproxySync>,
    pub(crate) status: watch::Sender<DaemonStatus>,
    pub(crate) started: Instant,
}

impl Outputs {
    /// Runs until the pipeline ends (its outcome channel closes), then finishes the
    /// last writes, a pending reload and the HAProxy pass in progress.
    pub(crate) async fn run(
        mut self,
        mut outcomes: mpsc::UnboundedReceiver<RouteOutcome>,
        mut readiness: watch::Receiver<Readiness>,
    ) {
        let mut states = RouteStates::default();
        let mut ready = false;
        let mut readiness_open = true;
        let mut retry_at: Option<Instant> = None;
        loop {
            tokio::select! {
                biased;
                outcome = outcomes.recv() => {
                    let Some(outcome) = outcome else { break };
                    self.absorb(&mut states, outcome);
                    while let Ok(outcome) = outcomes.try_recv() {
                        self.absorb(&mut states, outcome);
                    }
                    self.flush(ready, &mut retry_at).await;
                }
                changed = readiness.changed(), if readiness_open && !ready => {
                    readiness_open = changed.is_ok();
                }
                () = sleep_until(retry_at), if retry_at.is_some() => {
                    retry_at = None;
                    self.flush(ready, &mut retry_at).await;
                }
            }
            let progress = *readiness.borrow();
            if !ready && progress.is_ready() {
                // The pipeline sends a route's outcome before it counts the route as
                // done, so every start-up outcome is queued now: take them all before
                // declaring ready.
                while let Ok(outcome) = outcomes.try_recv() {
                    self.absorb(&mut states, outcome);
                }
                self.cert_dir.mark_complete();
                ready = true;
                self.flush(true, &mut retry_at).await;
                let elapsed = self.started.elapsed();
                self.metrics.set_ready(elapsed);
                let (admitted, rejected) = states.counts();
                info!(
                    routes = progress.initial_routes,
                    admitted,
                    rejected,
                    elapsed = ?elapsed,
                    cert_dir = %self.cert_dir.path().display(),
                    "ready: every route present at start-up is decided and written"
                );
                self.status.send_modify(|status| {
                    status.readiness = progress;
                    status.admitted = admitted;
                    status.rejected = rejected;
                    status.ready = true;
                    status.ready_after = Some(elapsed);
                });
            }
            let (admitted, rejected) = states.counts();
            self.status.send_if_modified(|status| {
                let new = DaemonStatus {
                    readiness: progress,
                    admitted,
                    rejected,
                    ..*status
                };
                let changed = new != *status;
                *status = new;
                changed
            });
        }
        if let Some(reloader) = self.reloader.take() {
            reloader.close().await;
        }
        if let Some(haproxy) = self.haproxy.take() {
            haproxy.close().await;
        }
    }

    fn absorb(&mut self, states: &mut RouteStates, outcome: RouteOutcome) {
        match outcome {
            RouteOutcome::Admitted(admitted) => {
                self.metrics.route_outcome(
                    "admitted",
                    admitted.reason.as_ref().map_or("", |reason| reason.name()),
                );
                for warning in &admitted.warnings {
                    warn!(route = %admitted.route, secret = %admitted.secret, "{warning}");
                }
                self.metrics
                    .set_expiry(&admitted.route, Some(admitted.tls.not_after()));
                states.set(&self.metrics, &admitted.route, Some(RouteState::Admitted));
                self.cert_dir.set(ServedCert {
                    route: admitted.route,
                    host: admitted.host,
                    created: admitted.created,
                    tls: admitted.tls,
                });
            }
            RouteOutcome::Rejected(rejected) => {
                let reason = rejected.reason.name();
                self.metrics.route_outcome("rejected", reason);
                warn!(route = %rejected.route, reason, "route rejected: {}", rejected.reason);
                self.metrics.set_expiry(&rejected.route, None);
                states.set(
                    &self.metrics,
                    &rejected.route,
                    Some(RouteState::Rejected(reason)),
                );
                self.cert_dir.remove(&rejected.route);
            }
            RouteOutcome::Removed(route) => {
                self.metrics.route_outcome("removed", "");
                info!(route = %route, "route no longer served");
                self.metrics.set_expiry(&route, None);
                states.set(&self.metrics, &route, None);
                self.cert_dir.remove(&route);
            }
        }
    }

    async fn flush(&mut self, ready: bool, retry_at: &mut Option<Instant>) {
        let plan = self.cert_dir.plan();
        // Announced before the files change, so that the reload covering them is
        // scheduled by the time anyone can see them (and waits for the write).
        let change = match &self.reloader {
            Some(reloader) if ready && plan.changes() => Some(reloader.begin_change()),
            _ => None,
        };
        let report = self.cert_dir.execute(plan).await;
        drop(change);
        self.metrics.bundles_flushed(
            self.cert_dir.served(),
            report.written + report.removed,
            report.failed,
        );
        if self.cert_dir.has_failures() || self.cert_dir.crt_list_stale() {
            retry_at.get_or_insert_with(|| Instant::now() + RETRY_DELAY);
        }
        if !ready {
            return;
        }
        if let Some(haproxy) = &self.haproxy {
            haproxy.publish(self.cert_dir.entries());
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
