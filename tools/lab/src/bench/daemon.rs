//! The `daemon` strategy: the whole `certwatch run` daemon ([`certwatch::Daemon`]),
//! writing every admitted route's bundle and the crt-list into a temporary cert
//! directory (under `/dev/shm` where it exists, as `certwatch-lab demo` does). Ready is the
//! daemon's own: every route present at start-up decided and written. The moments the
//! routes were listed (`routes_listed`) and the pipeline had decided every route
//! (`pipeline_ready`) are reported as phases, so that the first round trip and the
//! cost of the outputs show.

use std::collections::BTreeMap;
use std::time::Instant;

use super::BenchError;
use route_secrets::api::pipeline::Readiness;

use super::protocol::{ClientSpec, ErrorLog, ReadyReport};
use certwatch::{Daemon, DaemonOptions};

/// A running daemon and its cert directory; dropping it stops the daemon's tasks
/// with the process.
pub struct DaemonRun {
    daemon: Daemon,
    _cert_dir: tempfile::TempDir,
}

impl DaemonRun {
    /// The daemon's connection pool counters.
    pub fn pool_stats(&self) -> kube_h2::PoolStats {
        self.daemon.pool_stats()
    }
}

fn ms_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Starts the daemon and returns once it is ready.
pub async fn run(
    config: kube::Config,
    spec: &ClientSpec,
    started: Instant,
    errors: ErrorLog,
) -> Result<(ReadyReport, DaemonRun), BenchError> {
    let failed = |message: String| BenchError::Strategy {
        strategy: "daemon",
        message,
    };
    // Memory-backed where the system has /dev/shm, as the deployment's emptyDir
    // should be (bundles hold keys; a disk adds its metadata cost to every file).
    let cert_dir =
        certwatch::files::memory_backed_tempdir("certwatch-bench-certs-").map_err(|source| {
            BenchError::Io {
                what: "creating the cert directory".to_owned(),
                source,
            }
        })?;
    let mut options = DaemonOptions::new(cert_dir.path());
    options.max_concurrent_syncs = spec.max_concurrent_syncs;
    options.write_status = spec.status_writes;
    options.identity = kube_sim::ROUTER_USER.to_owned();
    options.client = kube_h2::ClientOptions::default().protocol(spec.protocol.into());
    let daemon = Daemon::start(config, options)
        .await
        .map_err(|e| failed(e.to_string()))?;

    // The milestones are awaited in the order they happen, in this one task, so that each
    // is observed as soon as the one before it: a spawned observer could be scheduled
    // after the daemon was already ready and report its phases out of order.
    let mut pipeline = daemon.pipeline_readiness();
    let mut status = daemon.status();
    let stopped = || failed("the pipeline stopped before it was ready".to_owned());
    pipeline
        .wait_for(|readiness| readiness.listed)
        .await
        .map_err(|_| stopped())?;
    let routes_listed_ms = ms_since(started);
    let pipeline_ready = *pipeline
        .wait_for(Readiness::is_ready)
        .await
        .map_err(|_| stopped())?;
    let pipeline_ready_ms = ms_since(started);
    let ready = *status
        .wait_for(|status| status.ready)
        .await
        .map_err(|_| failed("the daemon stopped before it was ready".to_owned()))?;
    let ready_ms = ms_since(started);
    super::protocol::record_rejections(&errors, ready.rejected, spec.expected_rejected);
    let (watched, _synced) = daemon.secret_counts();
    let mut phases = BTreeMap::new();
    phases.insert("routes_listed".to_owned(), routes_listed_ms);
    phases.insert("pipeline_ready".to_owned(), pipeline_ready_ms);
    phases.insert("ready".to_owned(), ready_ms);
    Ok((
        ReadyReport {
            ready_ms,
            measured_routes: pipeline_ready.initial_routes,
            measured_secrets: watched,
            admitted: ready.admitted,
            rejected: ready.rejected,
            phases,
            per_route_ms: None,
            per_secret_ms: None,
            haproxy: None,
            cert_dir: Some(cert_dir.path().to_path_buf()),
        },
        DaemonRun {
            daemon,
            _cert_dir: cert_dir,
        },
    ))
}
