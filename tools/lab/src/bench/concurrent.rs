//! The `concurrent` strategy: the product's start-up path as the daemon wires it.
//!
//! Pooled HTTP/2 client → `SecretMonitor` (streaming lists, shared per-secret watches)
//! → `SecretManager` → `AccessChecker` (one rules review per namespace) →
//! `RoutePipeline`, fed by a route watcher on all namespaces. Routes are applied one at
//! a time, oldest first; the pipeline prefetches every secret and access answer the
//! moment the route listing arrives. Ready is the pipeline's own readiness signal:
//! every route present at start-up admitted or rejected.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use route_secrets::api::access::{AccessChecker, AccessPolicy};
use route_secrets::api::manager::{SecretManager, TlsSecretMonitor};
use route_secrets::api::pipeline::{PipelineError, PipelineOptions, RouteOutcome, RoutePipeline};
use route_secrets::api::route_watch::{RouteEvent, route_events};
use route_secrets::api::status_writer::StatusWriter;
use route_secrets::route::Route;
use route_secrets::route::admission::RouterIdentity;
use secret_monitor::{MonitorError, MonitorObserver, MonitorOptions, ObjectKey};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::BenchError;
use super::protocol::{ClientSpec, ErrorLog, ReadyReport, RouteListing};

/// How long cached access answers stay valid (longer than any start-up here).
const ACCESS_TTL: Duration = Duration::from_secs(600);
/// The router name status is recorded under, with `--status-writes`.
const ROUTER_NAME: &str = "default";
/// How long to wait, after ready, for the outcome counter to see every outcome.
const OUTCOME_DRAIN: Duration = Duration::from_secs(5);

/// Milliseconds since `started`.
fn ms_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Records when first syncs finish, and watch errors.
struct SyncObserver {
    started: Instant,
    errors: ErrorLog,
    synced: AtomicU64,
    /// Milliseconds from the start to the latest completed first sync.
    last_synced_ms: AtomicU64,
    /// The longest single first sync, in milliseconds.
    longest_sync_ms: AtomicU64,
}

impl MonitorObserver for SyncObserver {
    fn first_sync(&self, key: &ObjectKey, elapsed: Duration, outcome: Result<(), &MonitorError>) {
        match outcome {
            Ok(()) => {
                self.synced.fetch_add(1, Ordering::Relaxed);
                self.last_synced_ms
                    .fetch_max(ms_since(self.started), Ordering::Relaxed);
                let elapsed = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
                self.longest_sync_ms.fetch_max(elapsed, Ordering::Relaxed);
            }
            Err(error) => self
                .errors
                .record(format!("first sync of secret {key} failed: {error}")),
        }
    }

    fn watch_error(&self, key: &ObjectKey, error: &MonitorError) {
        self.errors
            .record(format!("watch of secret {key} failed: {error}"));
    }
}

/// A started product pipeline; dropping it stops everything.
pub struct ConcurrentRun {
    pipeline: JoinHandle<Result<(), PipelineError>>,
    outcomes: JoinHandle<()>,
    // Held so that the watches stay open until the parent has measured them.
    _manager: SecretManager,
    _status: Option<StatusWriter>,
}

impl Drop for ConcurrentRun {
    fn drop(&mut self) {
        self.pipeline.abort();
        self.outcomes.abort();
    }
}

/// Counts of the latest outcome per route.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct OutcomeCounts {
    admitted: usize,
    rejected: usize,
}

/// Starts the product and returns once it is ready.
pub async fn run(
    client: kube::Client,
    spec: &ClientSpec,
    started: Instant,
    errors: ErrorLog,
) -> Result<(ReadyReport, ConcurrentRun), BenchError> {
    let observer = Arc::new(SyncObserver {
        started,
        errors: errors.clone(),
        synced: AtomicU64::new(0),
        last_synced_ms: AtomicU64::new(0),
        longest_sync_ms: AtomicU64::new(0),
    });
    let monitor = TlsSecretMonitor::with_options(
        client.clone(),
        MonitorOptions {
            max_concurrent_syncs: spec.max_concurrent_syncs,
            observer: Some(observer.clone()),
            ..MonitorOptions::default()
        },
    );
    // As the daemon does: one streaming probe, sent with the route listing.
    monitor.probe_streaming(
        <Route as kube::Resource>::url_path(&(), None),
        certwatch::daemon::STREAMING_PROBE_NAME,
    );
    let manager = SecretManager::new(monitor);
    let access = AccessChecker::new(client.clone(), AccessPolicy::SelfRules, ACCESS_TTL);
    let status = spec
        .status_writes
        .then(|| StatusWriter::spawn(client.clone(), RouterIdentity::new(ROUTER_NAME), 20));
    let (pipeline, outputs) = RoutePipeline::new(
        manager.clone(),
        access,
        status.clone(),
        PipelineOptions {
            identity: kube_sim::ROUTER_USER.to_owned(),
            ..PipelineOptions::default()
        },
    );

    let config = match spec.route_listing {
        // As the daemon lists them: one unpaginated list, served from the API
        // server's cache (resourceVersion=0).
        RouteListing::List => watcher::Config {
            page_size: None,
            ..watcher::Config::default().any_semantic()
        },
        RouteListing::Paged => watcher::Config::default(),
        RouteListing::Streaming => watcher::Config::default().streaming_lists(),
    };
    let route_errors = errors.clone();
    let listed = Arc::new(OnceLock::<(u64, usize, usize)>::new());
    let listed_in_stream = listed.clone();
    let events = route_events(Api::<Route>::all(client), config, move |error| {
        route_errors.record(format!("route watch failed: {error}"));
    })
    .inspect(move |event| {
        if let RouteEvent::Listed(routes) = event {
            let secrets: HashSet<(String, String)> = routes
                .iter()
                .filter_map(|route| {
                    Some((
                        route.key()?.namespace.to_string(),
                        route.external_certificate_name()?.to_owned(),
                    ))
                })
                .collect();
            listed_in_stream.get_or_init(|| (ms_since(started), routes.len(), secrets.len()));
        }
    });
    let pipeline_task = tokio::spawn(pipeline.run(events));

    let (counts_sender, mut counts) = watch::channel(OutcomeCounts::default());
    let outcome_errors = errors.clone();
    let mut outcome_receiver = outputs.outcomes;
    let outcomes_task = tokio::spawn(async move {
        // Whether each route's latest outcome admitted it, and the counts of both.
        let mut latest: HashMap<_, bool> = HashMap::new();
        let mut counts = OutcomeCounts::default();
        while let Some(outcome) = outcome_receiver.recv().await {
            let (route, admitted) = match outcome {
                RouteOutcome::Admitted(admitted) => (admitted.route, Some(true)),
                RouteOutcome::Rejected(rejected) => {
                    outcome_errors.record(format!(
                        "route {} rejected: {}",
                        rejected.route, rejected.reason
                    ));
                    (rejected.route, Some(false))
                }
                RouteOutcome::Removed(route) => (route, None),
            };
            let previous = match admitted {
                Some(admitted) => latest.insert(route, admitted),
                None => latest.remove(&route),
            };
            for (was_admitted, delta) in [(previous, -1), (admitted, 1)] {
                match was_admitted {
                    Some(true) => counts.admitted = counts.admitted.saturating_add_signed(delta),
                    Some(false) => counts.rejected = counts.rejected.saturating_add_signed(delta),
                    None => {}
                }
            }
            let _ = counts_sender.send(counts);
        }
    });

    let mut readiness = outputs.readiness;
    let ready = readiness
        .wait_for(|readiness| readiness.is_ready())
        .await
        .map(|readiness| *readiness);
    let ready_ms = ms_since(started);
    let readiness = ready.map_err(|_| BenchError::Strategy {
        strategy: "concurrent",
        message: "the pipeline stopped before it was ready".to_owned(),
    })?;
    let total = readiness.initial_routes;
    let counts = tokio::time::timeout(
        OUTCOME_DRAIN,
        counts.wait_for(|c| c.admitted + c.rejected >= total),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .map(|c| *c)
    .unwrap_or_else(|| *counts.borrow());

    let (listed_ms, _, distinct_secrets) = listed.get().copied().unwrap_or_default();
    let mut phases = std::collections::BTreeMap::new();
    phases.insert("routes_listed".to_owned(), listed_ms);
    phases.insert(
        "last_first_sync".to_owned(),
        observer.last_synced_ms.load(Ordering::Relaxed),
    );
    phases.insert(
        "longest_first_sync".to_owned(),
        observer.longest_sync_ms.load(Ordering::Relaxed),
    );
    phases.insert("ready".to_owned(), ready_ms);
    let report = ReadyReport {
        ready_ms,
        measured_routes: total,
        measured_secrets: distinct_secrets,
        admitted: counts.admitted,
        rejected: counts.rejected,
        phases,
        per_route_ms: None,
        per_secret_ms: None,
        haproxy: None,
        cert_dir: None,
    };
    Ok((
        report,
        ConcurrentRun {
            pipeline: pipeline_task,
            outcomes: outcomes_task,
            _manager: manager,
            _status: status,
        },
    ))
}
