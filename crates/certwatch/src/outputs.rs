//! From route outcomes to the proxies: the task that consumes the pipeline's outcomes,
//! keeps the cert directory and metrics current, triggers reloads, tells the proxies
//! ([`crate::proxy`]) and decides when the daemon is ready.
//!
//! Outcomes are taken in batches (everything queued at the moment), so that a burst,
//! like start-up, costs one crt-list write and one reload, not one per route. Each
//! batch is one [`CertDir::flush`], whose changed certificates, and the routes decided
//! meanwhile, go to every proxy ([`Proxy::flushed`]).
//!
//! Ready means: the pipeline has decided every route present at start-up, every
//! admitted route's bundle is on disk with its current material, the crt-list naming
//! them is written ("files ready"), and every proxy says it is ready (a HAProxy serves
//! every route present at start-up and answers now, and, with routing, holds the
//! routes' configuration). Only once start-up is
//! decided is the crt-list written for the first time, are bundles of routes that no
//! longer exist removed, does a proxy get any change and does the reload command
//! run: until then the proxy keeps what it had, and a running one may only add the
//! routes decided so far ([`Flushed::decided`]). While writes fail (a full or read-only cert
//! dir) the daemon stays not ready, says why in `/readyz`, and retries with
//! [`kube_common::backoff`]. Once the files are ready they stay so (they keep being
//! served if the API server goes away later; later write failures are counted and
//! logged); readiness then follows the proxies: not ready while one is not.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use kube_common::backoff::{Backoff, BackoffPolicy};
use kube_common::time::sleep_until;
use route_secrets::api::pipeline::{AdmittedRoute, Readiness, RejectedRoute, RouteOutcome};
use route_secrets::machine::Sni;
use route_secrets::route::RouteKey;
use route_secrets::tls::TlsWarning;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::cert_dir::{CertDir, FlushReport, ServedCert};
use crate::haproxy::HaproxyStatus;
use crate::logging::{Repeats, Seen, StateLog};
use crate::metrics::{Metrics, RouteState, RouteStates};
use crate::proxy::{Flushed, Proxy, ProxyReport, ProxyState, RouteDecision, RouteServed};
use crate::reload::Reloader;

/// How often a lasting condition (failing writes, a route rejected the same way again)
/// is logged again, with a count.
const REPEAT_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Why a decided daemon is not ready yet: its files are not all on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteProblem {
    /// Served routes whose current bundle is on disk.
    pub written: usize,
    /// Served routes.
    pub served: usize,
    /// Whether the crt-list is on disk as it should be.
    pub crt_list_written: bool,
    /// The last failure's kind (e.g. `StorageFull`), if a write failed.
    pub error: Option<io::ErrorKind>,
}

/// The daemon's state, for `/readyz`, progress and callers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DaemonStatus {
    /// The pipeline's start-up progress.
    pub readiness: Readiness,
    /// Whether the daemon is ready (see the [module documentation](self)).
    pub ready: bool,
    /// Time from start to the first ready.
    pub ready_after: Option<Duration>,
    /// Whether the files are ready: every route present at start-up decided, its
    /// bundle and the crt-list on disk.
    pub files_ready: bool,
    /// Time from start to the files being ready.
    pub files_ready_after: Option<Duration>,
    /// What the HAProxy controller says, when certwatch feeds a HAProxy.
    pub haproxy: Option<HaproxyStatus>,
    /// With routing (`--haproxy-config-dir`): whether HAProxy has loaded the routes'
    /// configuration.
    pub routed: Option<bool>,
    /// Routes served now.
    pub admitted: usize,
    /// Routes rejected now.
    pub rejected: usize,
    /// Bundles on disk now.
    pub bundles: usize,
    /// Set while every route is decided but the files are not all written.
    pub waiting_for_files: Option<WriteProblem>,
}

/// The consumer of the pipeline's outputs.
pub(crate) struct Outputs {
    pub(crate) cert_dir: CertDir,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) reloader: Option<Reloader>,
    /// The proxies told of every flush (see [`crate::proxy`]).
    pub(crate) proxies: Vec<Box<dyn Proxy>>,
    pub(crate) status: watch::Sender<DaemonStatus>,
    pub(crate) started: Instant,
    /// Re-synchronisation requests ([`crate::Daemon::resync`]).
    pub(crate) resync: watch::Receiver<u64>,
    /// Route decisions for the proxies that route, told once the flush that writes
    /// their files is done (so that a reload loads a crt-list that names their
    /// certificates); kept only when a proxy routes.
    pub(crate) routes_pending: Vec<RouteDecision>,
}

/// The outputs task's own state besides its parts.
struct Progress {
    states: RouteStates,
    /// Start-up is decided (the cert dir is complete).
    decided: bool,
    /// The files are ready (see the module documentation); never goes back.
    files_ready: bool,
    /// When the files were first ready, and when the daemon was first ready.
    files_ready_after: Option<Duration>,
    ready_after: Option<Duration>,
    retry_at: Option<Instant>,
    backoff: Backoff,
    /// Write failures: the first logged at once, repeats once a minute with a count.
    write_failures: Repeats,
    failing: bool,
    /// The kind of the last write failure while writes fail.
    last_error: Option<io::ErrorKind>,
    /// Each route's last rejection or warnings, to log only changes.
    route_log: StateLog<route_secrets::route::RouteKey>,
}

/// What the log compares of a certificate warning: its kind, and for a host not
/// covered the host (a route moved to another host is told again).
/// Logs an admitted route's warnings when they first apply to it, in one line: what is
/// compared is which warnings apply (and the host a certificate fails to cover), not
/// each certificate version's dates, so a secret rotated to certificates with the same
/// faults is logged once (it is counted in the metrics at every admission).
fn log_warnings(progress: &mut Progress, admitted: &AdmittedRoute, now: std::time::Instant) {
    let faults: Vec<String> = admitted.warnings.iter().map(fault).collect();
    let log = |repeats: Option<u64>| {
        let codes: Vec<&str> = admitted.warnings.iter().map(TlsWarning::code).collect();
        let text: Vec<String> = admitted.warnings.iter().map(ToString::to_string).collect();
        let text = text.join("; ");
        match repeats {
            None => warn!(
                route = %admitted.route,
                secret = admitted.secret().unwrap_or_default(),
                warnings = %codes.join(","),
                "{text}"
            ),
            Some(count) => warn!(
                route = %admitted.route,
                secret = admitted.secret().unwrap_or_default(),
                warnings = %codes.join(","),
                repeats = count,
                "{text} (and {count} unchanged decisions, of all routes, not logged since the last such line)"
            ),
        }
    };
    match progress
        .route_log
        .observe(admitted.route.clone(), &("admitted", &faults), now)
    {
        Seen::Changed if !faults.is_empty() => log(None),
        Seen::RepeatDue(count) if !faults.is_empty() => log(Some(count)),
        Seen::Changed | Seen::RepeatDue(_) | Seen::Repeat => {}
    }
}

fn fault(warning: &TlsWarning) -> String {
    match warning {
        TlsWarning::HostNotCovered { host, .. } => format!("{} {host}", warning.code()),
        _ => warning.code().to_owned(),
    }
}

impl Outputs {
    /// Runs until the pipeline ends (its outcome channel closes), then finishes the
    /// last writes, a pending reload and the HAProxy pass in progress.
    pub(crate) async fn run(
        mut self,
        mut outcomes: mpsc::Receiver<RouteOutcome>,
        mut readiness: watch::Receiver<Readiness>,
    ) {
        let mut progress = Progress {
            states: RouteStates::default(),
            decided: false,
            files_ready: false,
            files_ready_after: None,
            ready_after: None,
            retry_at: None,
            backoff: Backoff::new(BackoffPolicy::default()),
            write_failures: Repeats::new(REPEAT_LOG_INTERVAL),
            failing: false,
            last_error: None,
            route_log: StateLog::new(REPEAT_LOG_INTERVAL),
        };
        let mut readiness_open = true;
        let mut resync_open = true;
        // A removal waiting for a load to end is done by the flush after it ends.
        let mut file_loads = Some(self.cert_dir.file_loads().subscribe());
        loop {
            let removals_waiting = progress.decided && self.cert_dir.removals_waiting();
            tokio::select! {
                biased;
                outcome = outcomes.recv() => {
                    let Some(outcome) = outcome else { break };
                    self.absorb(&mut progress, outcome);
                    while let Ok(outcome) = outcomes.try_recv() {
                        self.absorb(&mut progress, outcome);
                    }
                    self.flush(&mut progress).await;
                }
                changed = readiness.changed(), if readiness_open && !progress.decided => {
                    readiness_open = changed.is_ok();
                }
                changed = self.resync.changed(), if resync_open => {
                    resync_open = changed.is_ok();
                    if resync_open && progress.decided {
                        if let Some(reloader) = &self.reloader {
                            reloader.trigger();
                        }
                        for proxy in &mut self.proxies {
                            proxy.resync();
                        }
                    }
                }
                () = sleep_until(progress.retry_at), if progress.retry_at.is_some() => {
                    progress.retry_at = None;
                    self.flush(&mut progress).await;
                }
                changed = changed_or_pending(&mut file_loads), if removals_waiting => {
                    if changed.is_err() {
                        file_loads = None;
                    } else {
                        self.flush(&mut progress).await;
                    }
                }
                report = next_report(&mut self.proxies) => {
                    self.take_report(&mut progress, report).await;
                }
            }
            let pipeline = *readiness.borrow();
            if !progress.decided && pipeline.is_ready() {
                // The pipeline sends a route's outcome before it counts the route as
                // done, so every start-up outcome is queued now: take them all before
                // writing the first crt-list.
                while let Ok(outcome) = outcomes.try_recv() {
                    self.absorb(&mut progress, outcome);
                }
                self.cert_dir.mark_complete();
                progress.decided = true;
                self.flush(&mut progress).await;
                for proxy in &mut self.proxies {
                    proxy.decided();
                }
            }
            self.publish_status(&mut progress, pipeline);
        }
        if let Some(reloader) = self.reloader.take() {
            reloader.close().await;
        }
        for proxy in self.proxies.drain(..) {
            proxy.close().await;
        }
    }

    /// Acts on what a proxy reported.
    async fn take_report(&mut self, progress: &mut Progress, report: ProxyReport) {
        match report {
            // Read by the status published after every turn.
            ProxyReport::State => {}
            ProxyReport::Refused(refused) => {
                self.cert_dir.set_excluded((*refused).clone());
                self.flush(progress).await;
            }
            ProxyReport::FilesMissing if progress.decided => {
                // The proxy could not load the files: whatever is missing is written
                // again before it loads them again.
                let missing = self.cert_dir.verify_files();
                if !missing.is_empty() {
                    warn!(
                        routes = ?missing,
                        "files the crt-list names were removed by others; writing them again"
                    );
                }
                self.flush(progress).await;
            }
            ProxyReport::FilesMissing => {}
        }
    }

    /// Declares ready when it is time, and sends the status if it changed.
    fn publish_status(&mut self, progress: &mut Progress, pipeline: Readiness) {
        let (admitted, rejected) = progress.states.counts();
        if progress.decided && !progress.files_ready && self.cert_dir.is_current() {
            progress.files_ready = true;
            let elapsed = self.started.elapsed();
            progress.files_ready_after = Some(elapsed);
            info!(
                routes = pipeline.initial_routes,
                admitted,
                rejected,
                bundles = self.cert_dir.bundles_on_disk(),
                elapsed = ?elapsed,
                cert_dir = %self.cert_dir.path().display(),
                "files ready: every route present at start-up is decided, and its bundle and the crt-list are on disk"
            );
        }
        let proxies = self.proxies.iter().map(|proxy| proxy.state()).fold(
            ProxyState {
                ready: true,
                haproxy: None,
                routed: None,
            },
            |all, proxy| ProxyState {
                ready: all.ready && proxy.ready,
                haproxy: all.haproxy.or(proxy.haproxy),
                routed: all.routed.or(proxy.routed),
            },
        );
        let (haproxy, routed) = (proxies.haproxy, proxies.routed);
        let ready = progress.files_ready && proxies.ready;
        if ready && progress.ready_after.is_none() {
            let elapsed = self.started.elapsed();
            progress.ready_after = Some(elapsed);
            self.metrics.daemon.set_ready(elapsed);
            match haproxy {
                Some(haproxy) => info!(
                    routes = haproxy.startup_routes,
                    refused = haproxy.refused,
                    elapsed = ?elapsed,
                    "ready: HAProxy serves every route present at start-up"
                ),
                None => info!(elapsed = ?elapsed, "ready"),
            }
        }
        self.metrics.daemon.set_ready_now(ready);
        let waiting_for_files = (progress.decided && !progress.files_ready).then(|| WriteProblem {
            written: self.cert_dir.served_on_disk(),
            served: self.cert_dir.served(),
            crt_list_written: self.cert_dir.index_current(),
            error: progress.last_error,
        });
        let bundles = self.cert_dir.bundles_on_disk();
        // One update with everything, so that a waiter that sees `ready` also sees
        // the counts it was reached with.
        self.status.send_if_modified(|status| {
            let new = DaemonStatus {
                readiness: pipeline,
                ready,
                ready_after: progress.ready_after,
                files_ready: progress.files_ready,
                files_ready_after: progress.files_ready_after,
                haproxy,
                routed,
                admitted,
                rejected,
                bundles,
                waiting_for_files,
            };
            let changed = new != *status;
            *status = new;
            changed
        });
    }

    /// Takes in one decision of the route pipeline: metrics, logs, the route's state,
    /// its bundle, and the decision for the proxies that route.
    fn absorb(&mut self, progress: &mut Progress, outcome: RouteOutcome) {
        let now = std::time::Instant::now();
        match outcome {
            RouteOutcome::Admitted(admitted) => self.admitted(progress, admitted, now),
            RouteOutcome::Rejected(rejected) => self.rejected(progress, &rejected, now),
            RouteOutcome::Removed(route) => self.removed(progress, &route),
        }
    }

    /// A route to serve: its warnings, its state, its routing and its certificate.
    fn admitted(
        &mut self,
        progress: &mut Progress,
        admitted: AdmittedRoute,
        now: std::time::Instant,
    ) {
        self.metrics.routes.outcome("admitted", "");
        log_warnings(progress, &admitted, now);
        self.metrics
            .routes
            .served_with_warnings(&admitted.route, &admitted.warnings);
        progress.states.set(
            &self.metrics.routes,
            &admitted.route,
            Some(RouteState::Admitted),
        );
        if self.routes_wanted() {
            self.routes_pending.push(RouteDecision::Served(RouteServed {
                key: admitted.route.clone(),
                routing: Arc::clone(&admitted.routing),
                wildcard: matches!(admitted.sni, Sni::Subdomain { .. }),
                has_certificate: admitted.certificate.is_some(),
            }));
        }
        match admitted.certificate {
            Some(certificate) => {
                self.metrics.routes.certificate_served(
                    &admitted.route,
                    certificate.source.secret().unwrap_or_default(),
                    certificate.tls.not_after(),
                );
                let served = ServedCert {
                    route: admitted.route,
                    sni: admitted.sni,
                    created: admitted.created,
                    tls: certificate.tls,
                };
                if let Err(error) = self.cert_dir.set(served) {
                    warn!(%error, "bundle not written");
                }
            }
            // Served without a certificate of its own (no TLS, passthrough, the
            // default certificate): no bundle, no expiry series.
            None => {
                self.metrics.routes.removed(&admitted.route);
                self.cert_dir.remove(&admitted.route);
            }
        }
    }

    /// A route not to serve: logged (once per reason), its state, and out of the
    /// proxies and the cert directory.
    fn rejected(
        &mut self,
        progress: &mut Progress,
        rejected: &RejectedRoute,
        now: std::time::Instant,
    ) {
        let reason = rejected.reason.name();
        self.metrics.routes.outcome("rejected", reason);
        let message = rejected.reason.to_string();
        match progress
            .route_log
            .observe(rejected.route.clone(), &("rejected", &message), now)
        {
            Seen::Changed => {
                warn!(route = %rejected.route, reason, "route rejected: {message}");
            }
            Seen::RepeatDue(count) => {
                warn!(
                    route = %rejected.route,
                    reason,
                    repeats = count,
                    "route still rejected: {message} (and {count} unchanged decisions, of all routes, not logged since the last such line)"
                );
            }
            Seen::Repeat => {}
        }
        self.metrics.routes.not_served(&rejected.route);
        // The expiry series stays: the route still exists, and an alert on its
        // certificate must not clear because the route went dark.
        let cause = rejected.cause().as_str();
        progress.states.set(
            &self.metrics.routes,
            &rejected.route,
            Some(RouteState::Rejected { reason, cause }),
        );
        if self.routes_wanted() {
            self.routes_pending
                .push(RouteDecision::Gone(rejected.route.clone()));
        }
        self.cert_dir.remove(&rejected.route);
    }

    /// A route gone: forgotten by the logs, the metrics, the proxies and the cert
    /// directory.
    fn removed(&mut self, progress: &mut Progress, route: &RouteKey) {
        self.metrics.routes.outcome("removed", "");
        info!(route = %route, "route no longer served");
        progress.route_log.forget(route);
        self.metrics.routes.removed(route);
        progress.states.set(&self.metrics.routes, route, None);
        if self.routes_wanted() {
            self.routes_pending.push(RouteDecision::Gone(route.clone()));
        }
        self.cert_dir.remove(route);
    }

    async fn flush(&mut self, progress: &mut Progress) {
        // Announced before the files change, so that a reload covering them is
        // scheduled by the time anyone can see them (and waits for the write); a flush
        // that changed nothing withdraws it.
        let change = match &self.reloader {
            Some(reloader) if progress.decided => Some(reloader.begin_change()),
            _ => None,
        };
        let report = self.cert_dir.flush().await;
        if let Some(change) = change {
            change.finish(report.changed());
        }
        self.metrics.files.flushed(
            self.cert_dir.bundles_on_disk(),
            report.written + report.removed,
            report.failed,
        );
        self.log_failures(progress, &report);
        if self.cert_dir.has_pending_work() {
            let delay = progress.backoff.next_delay();
            progress
                .retry_at
                .get_or_insert_with(|| Instant::now() + delay);
        }
        // Certificates change only once start-up is decided: a half-built set must not
        // remove anything from a running proxy. Before, it may add the routes decided.
        let routes = std::mem::take(&mut self.routes_pending);
        for proxy in &mut self.proxies {
            proxy.flushed(Flushed {
                routes: if proxy.routes() { &routes } else { &[] },
                certificates: &report.changes,
                complete: report.complete_listing,
                decided: &report.decided,
            });
        }
    }

    /// Whether a proxy routes, so that route decisions are kept for it.
    fn routes_wanted(&self) -> bool {
        self.proxies.iter().any(|proxy| proxy.routes())
    }

    fn log_failures(&mut self, progress: &mut Progress, report: &FlushReport) {
        progress.last_error = report.error.or(progress.last_error);
        match (&report.error_text, progress.failing) {
            (Some(text), _) => {
                progress.failing = true;
                if let Some(count) = progress.write_failures.occurred(std::time::Instant::now()) {
                    warn!(
                        failed = report.failed,
                        flushes = count,
                        cert_dir = %self.cert_dir.path().display(),
                        "{text}; will retry (failing flushes since the last such line: {count})"
                    );
                }
            }
            (None, true) if !self.cert_dir.has_pending_work() => {
                progress.failing = false;
                progress.last_error = None;
                let unlogged = progress.write_failures.reset();
                info!(
                    cert_dir = %self.cert_dir.path().display(),
                    unlogged,
                    "cert dir writes succeed again"
                );
            }
            _ => {}
        }
    }
}

/// Waits for the next report of any proxy; never, without one.
async fn next_report(proxies: &mut [Box<dyn Proxy>]) -> ProxyReport {
    if proxies.is_empty() {
        return std::future::pending().await;
    }
    let (report, _, _) =
        futures::future::select_all(proxies.iter_mut().map(|proxy| proxy.report())).await;
    report
}

/// Waits for the next change of `status`; never, without one.
async fn changed_or_pending<T>(
    status: &mut Option<watch::Receiver<T>>,
) -> Result<(), watch::error::RecvError> {
    match status {
        Some(status) => status.changed().await,
        None => std::future::pending().await,
    }
}
