//! What the HAProxy start modes (`--haproxy-start managed` and `running`,
//! `--haproxy-config deployment`) measure alike at start-up, built in one place: the
//! daemon's milestones up to its files being ready, the sample of routes asked by
//! handshakes, the daemon's own ready, HAProxy's cold load (its progress line), and
//! the [`ReadyReport`] with its phases.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use certwatch::haproxy::process::{Drain, HaproxyProcess, ProcessOptions};
use certwatch::{Daemon, DaemonStatus};
use route_secrets::api::pipeline::Readiness;
use tokio::task::JoinHandle;

use super::{HaproxySetup, STARTUP_SAMPLE, check_load, failed, free_port, leaf_of_file, ms};
use crate::bench::BenchError;
use crate::bench::process_stats::mib;
use crate::bench::protocol::{
    ClientSpec, ErrorLog, HaproxyCheck, HaproxyReady, HaproxyResources, ReadyReport,
    record_rejections,
};

/// The daemon's start-up up to its files being ready, in milliseconds from its start.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Milestones {
    /// The routes were listed.
    pub(crate) routes_listed_ms: u64,
    /// The pipeline decided every route present at start-up.
    pub(crate) pipeline_ready_ms: u64,
    /// The pipeline's counts then.
    pub(crate) pipeline_ready: Readiness,
    /// Every route's bundle and the crt-list were on disk.
    pub(crate) files_ready_ms: u64,
}

impl Milestones {
    /// Awaits each milestone of `daemon`, started at `started`, in the order they
    /// happen, in this one task: each is observed as soon as the one before it, and
    /// they never come out of order.
    pub(crate) async fn until_files_ready(
        daemon: &Daemon,
        started: Instant,
    ) -> Result<Self, BenchError> {
        let mut pipeline = daemon.pipeline_readiness();
        let mut status = daemon.status();
        pipeline
            .wait_for(|readiness| readiness.listed)
            .await
            .map_err(|_| failed("the pipeline stopped before it was ready"))?;
        let routes_listed_ms = ms(started.elapsed());
        let pipeline_ready = *pipeline
            .wait_for(Readiness::is_ready)
            .await
            .map_err(|_| failed("the pipeline stopped before it was ready"))?;
        let pipeline_ready_ms = ms(started.elapsed());
        status
            .wait_for(|status| status.files_ready)
            .await
            .map_err(|_| failed("the daemon stopped before its files were ready"))?;
        Ok(Self {
            routes_listed_ms,
            pipeline_ready_ms,
            pipeline_ready,
            files_ready_ms: ms(started.elapsed()),
        })
    }
}

/// The routes asked by handshakes: at most [`STARTUP_SAMPLE`] of the crt-list's
/// `lines`, spread over it at a regular stride, each with its bundle's leaf.
pub(crate) fn spread_samples(lines: &[(PathBuf, String)]) -> Vec<(String, Vec<u8>)> {
    let step = (lines.len() / STARTUP_SAMPLE).max(1);
    lines
        .iter()
        .step_by(step)
        .take(STARTUP_SAMPLE)
        .filter_map(|(link, sni)| Some((sni.clone(), leaf_of_file(link)?)))
        .collect()
}

/// When `daemon`, started at `started`, says it is ready (milliseconds), or `None` if
/// it stops before.
pub(crate) fn daemon_ready(daemon: &Daemon, started: Instant) -> JoinHandle<Option<u64>> {
    let mut status = daemon.status();
    tokio::spawn(async move {
        status.wait_for(|status| status.ready).await.ok()?;
        Some(ms(started.elapsed()))
    })
}

/// The daemon's ready, awaited from [`daemon_ready`].
pub(crate) async fn daemon_ready_ms(ready: JoinHandle<Option<u64>>) -> Result<u64, BenchError> {
    ready
        .await
        .ok()
        .flatten()
        .ok_or_else(|| failed("the daemon stopped before it was ready"))
}

/// HAProxy's own cold load of a crt-list, and `haproxy -c` of its configuration.
#[derive(Clone, Debug)]
pub(crate) struct ColdLoad {
    /// From the start of a second HAProxy to its worker serving.
    pub(crate) ms: u64,
    /// That HAProxy once it serves: the certificates alone.
    pub(crate) haproxy: HaproxyResources,
    /// `haproxy -c` of the same configuration.
    pub(crate) check: HaproxyCheck,
}

impl ColdLoad {
    /// A second HAProxy on `setup`'s crt-list (its own socket and port in its
    /// directory), from its start to its worker serving; then `haproxy -c` of its
    /// configuration.
    pub(crate) async fn measure(
        setup: &HaproxySetup<'_>,
        timeout_ms: u64,
    ) -> Result<Self, BenchError> {
        let dir = setup.dir;
        let cold_socket = dir.join("cold.sock");
        let cold_config = super::write_config(setup, "cold.cfg", &cold_socket, free_port()?)?;
        let mut cold = ProcessOptions::new("haproxy", &cold_config, dir.join("cold-master.sock"));
        cold.load_timeout = Duration::from_millis(timeout_ms);
        let (cold_process, cold_worker) = HaproxyProcess::start(cold)
            .await
            .map_err(|e| failed(format!("HAProxy's cold load: {e}")))?;
        let cold_load_ms = ms(cold_process.start_duration());
        let haproxy = HaproxyResources::of_worker(cold_worker);
        cold_process
            .stop(&Drain::new(Duration::from_secs(10)))
            .await;
        // The load alone, no worker.
        let check = check_load(&cold_config, None).await?;
        Ok(Self {
            ms: cold_load_ms,
            haproxy,
            check,
        })
    }

    /// The progress line's words for it.
    pub(crate) fn summary(&self) -> String {
        format!(
            "cold load {} ms (worker peak {} MiB, master {} MiB); haproxy -c {} ms, peak {} MiB",
            self.ms,
            mib(self.haproxy.worker_peak_rss_bytes),
            mib(self.haproxy.master_peak_rss_bytes),
            self.check.ms,
            mib(self.check.peak_rss_bytes),
        )
    }
}

/// The client's start-up report of a HAProxy start mode: `haproxy` as the mode
/// measured it, its phases the daemon's milestones, its ready, and `later` (the
/// mode's own moments after the files were ready, e.g. `served`). The routes rejected
/// beyond (or short of) those the scenario expects are recorded as errors.
pub(crate) fn ready_report(
    daemon: &Daemon,
    milestones: &Milestones,
    ready: &DaemonStatus,
    later: &[(&str, u64)],
    haproxy: HaproxyReady,
    spec: &ClientSpec,
    errors: &ErrorLog,
) -> ReadyReport {
    record_rejections(errors, ready.rejected, spec.expected_rejected);
    let (watched, _synced) = daemon.secret_counts();
    let mut phases = BTreeMap::new();
    phases.insert("routes_listed".to_owned(), milestones.routes_listed_ms);
    phases.insert("pipeline_ready".to_owned(), milestones.pipeline_ready_ms);
    phases.insert("files_ready".to_owned(), milestones.files_ready_ms);
    phases.insert("ready".to_owned(), haproxy.daemon_ready_ms);
    for (phase, at) in later {
        phases.insert((*phase).to_owned(), *at);
    }
    ReadyReport {
        ready_ms: haproxy.daemon_ready_ms,
        measured_routes: milestones.pipeline_ready.initial_routes,
        measured_secrets: watched,
        admitted: ready.admitted,
        rejected: ready.rejected,
        phases,
        per_route_ms: None,
        per_secret_ms: None,
        cert_dir: Some(haproxy.cert_dir.clone()),
        haproxy: Some(Box::new(haproxy)),
    }
}
