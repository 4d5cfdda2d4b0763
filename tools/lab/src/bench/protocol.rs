//! What the benchmark's parent and a client child process say to each other: the
//! child gets a [`ClientSpec`] on its command line and writes one JSON
//! [`ClientMessage`] per line on its standard output; the parent writes `measure` on
//! the child's standard input to ask for its figures, and closes it to end the child.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::deployment::HaproxyConfig;
use super::process_stats::ProcessStats;
use super::scenario::Strategy;

/// The line the parent sends to ask for a [`Measurement`].
pub const MEASURE: &str = "measure";

/// How the routes' initial state is listed (the pipeline's route watcher).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RouteListing {
    /// One unpaginated LIST from the API server's cache (`resourceVersion=0`), then a
    /// WATCH, as the daemon lists routes: works with every API server.
    #[default]
    List,
    /// LIST in pages of 500 (kube-runtime's and client-go's default), then a WATCH.
    Paged,
    /// One WATCH with `sendInitialEvents=true` (needs the WatchList feature).
    Streaming,
}

/// How the haproxy strategy's HAProxy starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HaproxyStart {
    /// certwatch starts HAProxy on its complete files (`--haproxy-config`): HAProxy
    /// loads every certificate itself.
    #[default]
    Managed,
    /// HAProxy runs before certwatch starts, with no route certificate; certwatch
    /// pushes every certificate through its runtime API (`--haproxy-socket`).
    Running,
}

/// HTTP versions the client may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HttpProtocol {
    /// HTTP/2 where the server offers it, else HTTP/1.1.
    #[default]
    Auto,
    /// HTTP/1.1 only: one connection per concurrent request or watch.
    Http1,
    /// HTTP/2 only.
    Http2,
}

impl From<HttpProtocol> for kube_h2::Protocol {
    fn from(protocol: HttpProtocol) -> Self {
        match protocol {
            HttpProtocol::Auto => Self::Auto,
            HttpProtocol::Http1 => Self::Http1Only,
            HttpProtocol::Http2 => Self::Http2Only,
        }
    }
}

/// What one client child process runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientSpec {
    /// The strategy to run.
    pub strategy: Strategy,
    /// The simulator's kubeconfig; the child uses its `router` context.
    pub kubeconfig: PathBuf,
    /// Serial only: how many routes (oldest first) to measure; 0 means all.
    pub serial_routes: usize,
    /// Concurrent only: bound on concurrent first syncs.
    pub max_concurrent_syncs: Option<usize>,
    /// HTTP versions.
    pub protocol: HttpProtocol,
    /// Concurrent only: how routes are listed.
    pub route_listing: RouteListing,
    /// Concurrent only: record outcomes in the routes' status.
    pub status_writes: bool,
    /// How long the strategy may take to become ready.
    pub timeout_ms: u64,
    /// The haproxy strategy: HAProxy's `nbthread` (`None`: its default, one thread per
    /// CPU).
    #[serde(default)]
    pub haproxy_threads: Option<u16>,
    /// The haproxy strategy: how its HAProxy starts.
    #[serde(default)]
    pub haproxy_start: HaproxyStart,
    /// The haproxy strategy: the configuration and the HAProxy it runs
    /// (`--haproxy-config`).
    #[serde(default)]
    pub haproxy_config: HaproxyConfig,
    /// Routes the scenario's invalid secrets make the product reject (`--bad-secrets`):
    /// a rejection is an error only beyond them, and so is admitting any of them.
    #[serde(default)]
    pub expected_rejected: usize,
}

/// One line from the child.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientMessage {
    /// The strategy is ready: every route it measures has been admitted or rejected.
    Ready(ReadyReport),
    /// The strategy could not become ready.
    Failed {
        /// Why.
        message: String,
    },
    /// The answer to [`MEASURE`].
    Measured(Measurement),
}

/// Start-up as the child saw it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReadyReport {
    /// From the first API request to ready.
    pub ready_ms: u64,
    /// Routes the strategy applied (all, or the serial sample).
    pub measured_routes: usize,
    /// Distinct secrets those routes reference.
    pub measured_secrets: usize,
    /// Routes admitted.
    pub admitted: usize,
    /// Routes rejected.
    pub rejected: usize,
    /// Milestones, in milliseconds since the first request (e.g. `routes_listed`).
    pub phases: BTreeMap<String, u64>,
    /// Serial only: the time per route, for the labelled extrapolation.
    pub per_route_ms: Option<f64>,
    /// Serial only: the time per secret it registered (the sample's time divided by
    /// its distinct secrets: a secret already registered costs nothing).
    pub per_secret_ms: Option<f64>,
    /// The `haproxy` strategy only: where HAProxy is and how its start-up went.
    #[serde(default)]
    pub haproxy: Option<Box<HaproxyReady>>,
    /// The daemon and haproxy strategies: certwatch's cert directory, where the
    /// benchmark follows a re-issue to the routes' files.
    #[serde(default)]
    pub cert_dir: Option<PathBuf>,
}

/// Records as errors the difference between the routes a strategy rejected and those
/// it was expected to reject (the routes of the scenario's invalid secrets).
pub fn record_rejections(errors: &ErrorLog, rejected: usize, expected: usize) {
    for _ in expected..rejected {
        errors.record("a route was rejected (see the daemon's log)");
    }
    for _ in rejected..expected {
        errors.record("a route of an invalid secret was admitted (see the daemon's log)");
    }
}

/// The child's resource use and client figures at the moment the parent asked.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Measurement {
    /// Memory and CPU of the child.
    pub process: ProcessStats,
    /// HTTP/2 connections the pool opened.
    pub http2_connections_opened: u64,
    /// HTTP/1.1 connections the pool opened.
    pub http1_connections_opened: u64,
    /// Connections open now.
    pub connections_open: u64,
    /// Requests the client sent.
    pub client_requests: u64,
    /// The most streams on one HTTP/2 connection.
    pub peak_streams_per_connection: u64,
    /// Connections lost (errors, unanswered pings).
    pub connections_lost: u64,
    /// Errors so far: failed syncs, failed watches, rejected routes, failed requests.
    pub errors: u64,
    /// The first few error messages.
    pub error_samples: Vec<String>,
}

impl Measurement {
    /// Figures of this process and its client pool now.
    pub fn take(pool: &kube_h2::PoolStats, errors: &ErrorLog) -> Self {
        let (count, samples) = errors.snapshot();
        Self {
            process: ProcessStats::now(),
            http2_connections_opened: pool.http2_connections_opened,
            http1_connections_opened: pool.http1_connections_opened,
            connections_open: pool.http2_connections_open + pool.http1_connections_open,
            client_requests: pool.requests,
            peak_streams_per_connection: pool.peak_streams_per_connection,
            connections_lost: pool.connections_lost,
            errors: count,
            error_samples: samples,
        }
    }
}

/// How many error messages are kept as samples.
const ERROR_SAMPLES: usize = 5;

/// Counts errors and keeps the first few messages. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ErrorLog {
    count: Arc<AtomicU64>,
    /// Guards the first [`ERROR_SAMPLES`] messages.
    samples: Arc<Mutex<Vec<String>>>,
}

impl ErrorLog {
    /// Records one error.
    pub fn record(&self, message: impl Into<String>) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut samples = kube_common::sync::lock(&self.samples);
        if samples.len() < ERROR_SAMPLES {
            samples.push(message.into());
        }
    }

    /// The count and the sampled messages.
    pub fn snapshot(&self) -> (u64, Vec<String>) {
        let samples = kube_common::sync::lock(&self.samples).clone();
        (self.count.load(Ordering::Relaxed), samples)
    }
}

/// What the client reports about HAProxy at ready.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HaproxyReady {
    /// HAProxy's TLS port (127.0.0.1).
    pub tls_port: u16,
    /// Its stats socket.
    pub stats_socket: PathBuf,
    /// certwatch's cert directory.
    pub cert_dir: PathBuf,
    /// The worker serving at ready.
    pub worker: Option<u32>,
    /// Routes in the crt-list.
    pub listed: usize,
    /// From the first request to the files being ready (ready on disk).
    pub files_ready_ms: u64,
    /// From the first request to the daemon's own ready (HAProxy serves every route).
    pub daemon_ready_ms: u64,
    /// From the first request to every sampled route presenting its certificate in a
    /// handshake (ready served).
    pub served_ms: u64,
    /// Routes sampled by handshakes.
    pub sampled: usize,
    /// HAProxy's start as certwatch ran it (spawn to the first worker serving).
    pub haproxy_start_ms: u64,
    /// HAProxy's own cold load of the same crt-list (a second HAProxy).
    pub cold_load_ms: u64,
    /// The daemon's HTTP endpoint (`/metrics`).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// HAProxy's `nbthread` (`None`: its default).
    #[serde(default)]
    pub threads: Option<u16>,
    /// The HAProxy certwatch runs, once every sampled route is served.
    #[serde(default)]
    pub served_haproxy: HaproxyResources,
    /// The second HAProxy of the cold load, once it serves: the certificates alone.
    #[serde(default)]
    pub cold_haproxy: HaproxyResources,
    /// `haproxy -c` of the same configuration: HAProxy's own load of every file,
    /// without a worker.
    #[serde(default)]
    pub check: HaproxyCheck,
    /// `--haproxy-start running` only: the push to the running HAProxy.
    #[serde(default)]
    pub push: Option<super::socket_push::PushStartup>,
    /// The configuration HAProxy ran on, and who ran it (`--haproxy-config`).
    #[serde(default)]
    pub config: HaproxyConfig,
    /// The deployment's configuration: servers HAProxy held in the routes' backends
    /// at served (one per route's endpoint).
    #[serde(default)]
    pub servers: usize,
}

/// Memory and CPU of a HAProxy (master and worker), from `/proc`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HaproxyResources {
    /// The worker's peak resident set (`VmHWM`), in bytes.
    pub worker_peak_rss_bytes: u64,
    /// The master's peak resident set, in bytes (it loads the configuration and its
    /// certificates too, before it starts the worker).
    pub master_peak_rss_bytes: u64,
    /// CPU (user + system) of master and worker since they started, in milliseconds.
    pub cpu_ms: u64,
    /// The master's pid, if it was found.
    #[serde(default)]
    pub master_pid: Option<u32>,
}

impl HaproxyResources {
    /// The figures of the HAProxy whose worker is `worker` (its master is the worker's
    /// parent).
    pub fn of_worker(worker: u32) -> Self {
        use super::process_stats::{other_process_cpu_ms, other_process_peak_rss_bytes};
        let master = super::process_stats::parent_pid(worker).filter(|pid| *pid > 1);
        Self {
            worker_peak_rss_bytes: other_process_peak_rss_bytes(worker).unwrap_or(0),
            master_peak_rss_bytes: master.and_then(other_process_peak_rss_bytes).unwrap_or(0),
            cpu_ms: other_process_cpu_ms(worker).unwrap_or(0)
                + master.and_then(other_process_cpu_ms).unwrap_or(0),
            master_pid: master,
        }
    }

    /// The master's newest worker now (a reload replaces the worker), if any.
    pub fn current_worker(&self) -> Option<u32> {
        super::process_stats::children(self.master_pid?)
            .last()
            .copied()
    }
}

/// `haproxy -c -q -f <config>`: wall time, and its resident set and CPU as last sampled
/// (every 20 ms) before it exited.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HaproxyCheck {
    /// Wall time from spawn to exit.
    pub ms: u64,
    /// Whether HAProxy accepted the configuration.
    pub ok: bool,
    /// Peak resident set, last sampled, in bytes.
    pub peak_rss_bytes: u64,
    /// CPU, last sampled, in milliseconds.
    pub cpu_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_rejections_beyond_or_short_of_the_expected_ones_are_errors() {
        let errors = ErrorLog::default();
        record_rejections(&errors, 4, 4);
        assert_eq!(errors.snapshot().0, 0);
        record_rejections(&errors, 6, 4);
        assert_eq!(errors.snapshot().0, 2);
        record_rejections(&errors, 1, 4);
        let (count, samples) = errors.snapshot();
        assert_eq!(count, 5);
        assert!(
            samples.iter().any(|s| s.contains("was admitted")),
            "{samples:?}"
        );
    }
}
