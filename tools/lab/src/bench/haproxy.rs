//! The `haproxy` strategy: the whole daemon feeding a real HAProxy it runs itself
//! (`--haproxy-config`), measured where a client sees it, by TLS handshakes.
//!
//! In the client process (so that its CPU figures are certwatch's alone; HAProxy is a
//! process of its own):
//!
//! - the daemon starts, writes its files, and starts HAProxy on them;
//! - **ready on disk**: the daemon's files are ready (every route decided, bundles and
//!   crt-list written);
//! - **ready served**: from then on, a sample of routes (200, spread over the crt-list)
//!   is asked by real TLS handshakes (SNI) until each presents the certificate of its
//!   bundle; the daemon's own `/readyz` moment is reported beside it;
//! - **HAProxy's cold load**: a second HAProxy, on a copy of the configuration (other
//!   ports and sockets), loads the same crt-list from its files; the time from its start
//!   to its worker serving.
//!
//! In the benchmark process, once the client is ready:
//!
//! - **HAProxy's own rate**: `set ssl cert` + `commit ssl cert` of up to 1,000 of the
//!   certificates (their own material again), pipelined over one runtime API connection
//!   of the benchmark's: what this machine's HAProxy takes per second;
//! - **rotations** at 50/s, at 80 % of that rate, and at 500/s (each for
//!   `--rotation-seconds`): new certificates written through the API (secret PATCHes as
//!   the admin), each for a different route; a sample of them (at most 50 per second) is
//!   followed to its file (the bundle on disk holds the new certificate) and to being
//!   served (a handshake presents it). Latencies count from the moment the PATCH is sent;
//!   certwatch's and HAProxy's CPU over the phase are reported in cores.
//!
//! The bounds checked: served at start-up within 1.1 × HAProxy's cold
//! load after the files are ready; p99 ≤ 1 s at 50/s with certwatch under a quarter of a
//! core; p99 ≤ 2 s up to 80 % of HAProxy's own rate. Beyond that rate the backlog is
//! coalesced (only the newest version of a certificate is pushed): the figures show it,
//! and no probe may go unserved.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use certwatch::haproxy::process::{HaproxyProcess, ProcessOptions};
use certwatch::haproxy::runtime::{Command, Payload, RuntimeClient, RuntimeOptions};
use certwatch::haproxy::{HaproxyOptions, HaproxyState};
use certwatch::{Daemon, DaemonOptions};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube_common::sync;
use serde::Serialize;

use super::BenchError;
use super::protocol::{
    ClientSpec, ErrorLog, HaproxyCheck, HaproxyReady, HaproxyResources, HaproxyStart, ReadyReport,
};
use super::scenario::Check;

pub(super) mod startup;

/// Routes sampled by handshakes at start-up.
pub(super) const STARTUP_SAMPLE: usize = 200;
/// Certificates of HAProxy's own rate measurement at most.
const OWN_RATE_SAMPLE: usize = 1_000;
/// Rotations followed per second at most.
pub(super) const PROBES_PER_SECOND: f64 = 50.0;
/// How long a probe waits for its rotation before counting it as never seen.
const PROBE_DEADLINE: Duration = Duration::from_secs(60);
/// How often the backlog is read from certwatch's metrics during a rotation phase while
/// the last read showed routes waiting for HAProxy.
pub(super) const BACKLOG_SAMPLE: Duration = Duration::from_secs(1);
/// How often it is read while the last read showed none waiting: a scrape encodes every
/// route's series (at 100,000 routes 12.8 MB, about 0.1 CPU seconds of certwatch's), so
/// reading every second would put the benchmark's own scrapes into certwatch's CPU figure
/// of a phase HAProxy keeps up with; every 10 s is what a Prometheus scraping that often
/// costs it.
const QUIET_BACKLOG_SAMPLE: Duration = Duration::from_secs(10);
/// How often a probe looks at the file, and asks HAProxy, at first.
pub(super) const FILE_POLL: Duration = Duration::from_millis(5);
pub(super) const HANDSHAKE_POLL: Duration = Duration::from_millis(10);
/// Handshakes all of a phase's probes make a second at most. Every handshake costs
/// HAProxy a signature on the threads beside the one that commits the changes, on the
/// same cores: unpaced, a backlog of hundreds of waiting probes made about as much
/// HAProxy CPU as the commits it measured. At this pace a probe waits for its slot at
/// most (probes waiting) / 400 s, which only the phases with a backlog of seconds reach.
pub(super) const PROBE_HANDSHAKES_PER_SECOND: u32 = 400;

/// Paces the probes' handshakes of one phase to `PROBE_HANDSHAKES_PER_SECOND`, in the
/// order probes ask, and counts them.
pub(super) struct HandshakePacer {
    /// The earliest moment the next handshake may start.
    next: Mutex<Instant>,
    interval: Duration,
    made: std::sync::atomic::AtomicUsize,
}

impl HandshakePacer {
    pub(super) fn new(per_second: u32) -> Self {
        Self {
            next: Mutex::new(Instant::now()),
            interval: Duration::from_secs(1) / per_second.max(1),
            made: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Reserves the next handshake slot at or after `now`: when it may start.
    pub(super) fn reserve(&self, now: Instant) -> Instant {
        self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut next = sync::lock(&self.next);
        let slot = (*next).max(now);
        *next = slot + self.interval;
        slot
    }

    pub(super) fn made(&self) -> usize {
        self.made.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The pause before a probe looks again, `waited` after its write: a tenth of the wait
/// so far, at least `least`. Each latency is then known within 10 %, and probes that
/// wait long do not flood HAProxy with handshakes (probes polling at a fixed pace
/// would multiply the handshakes HAProxy answers exactly when it falls behind, and
/// make it fall further behind).
pub(super) fn poll_pause(waited: Duration, least: Duration) -> Duration {
    least.max(waited / 10)
}

pub(super) fn failed(message: impl Into<String>) -> BenchError {
    BenchError::Strategy {
        strategy: "haproxy",
        message: message.into(),
    }
}

pub(super) fn io(what: &str) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        what: what.to_owned(),
        source,
    }
}

pub(super) fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A running daemon with its HAProxy; dropping it stops both.
pub struct HaproxyRun {
    pub(super) daemon: Daemon,
    /// The HAProxy the benchmark started itself (`--haproxy-start running`).
    pub(super) _haproxy: Option<HaproxyProcess>,
    pub(super) _cert_dir: tempfile::TempDir,
    pub(super) _run_dir: tempfile::TempDir,
}

impl HaproxyRun {
    /// The daemon's connection pool counters.
    pub fn pool_stats(&self) -> kube_h2::PoolStats {
        self.daemon.pool_stats()
    }
}

/// The end-entity certificate HAProxy at 127.0.0.1:`port` presents for `sni`, if a
/// handshake succeeds within 10 s.
pub(super) async fn presented(port: u16, sni: &str) -> Option<Vec<u8>> {
    tokio::time::timeout(
        Duration::from_secs(10),
        testenv::tls_probe::presented(("127.0.0.1", port), sni),
    )
    .await
    .ok()?
}

/// The server certificate (DER) at the start of a bundle file.
pub(super) fn leaf_of_file(path: &Path) -> Option<Vec<u8>> {
    let text = std::fs::read_to_string(path).ok()?;
    certwatch::files::first_certificate_der(&text)
}

pub(super) fn free_port() -> Result<u16, BenchError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io("finding a free port"))?
        .port())
}

/// Where and how a benchmark HAProxy runs.
pub(super) struct HaproxySetup<'a> {
    pub(super) dir: &'a Path,
    pub(super) default_pem: &'a Path,
    pub(super) crt_list: &'a Path,
    pub(super) threads: Option<u16>,
}

/// HAProxy's configuration: one TLS frontend on `port` with a default certificate and
/// certwatch's crt-list, the stats socket at level admin.
pub(super) fn write_config(
    setup: &HaproxySetup<'_>,
    name: &str,
    socket: &Path,
    port: u16,
) -> Result<PathBuf, BenchError> {
    let config = setup.dir.join(name);
    let threads = setup
        .threads
        .map(|threads| format!("  nbthread {threads}\n"))
        .unwrap_or_default();
    let text = format!(
        "global\n{threads}  stats socket {socket} level admin\n\
         defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
         frontend tls\n  bind 127.0.0.1:{port} ssl crt {default} crt-list {list}\n  default_backend nowhere\n\
         backend nowhere\n  server nowhere 127.0.0.1:9\n",
        socket = socket.display(),
        default = setup.default_pem.display(),
        list = setup.crt_list.display(),
    );
    std::fs::write(&config, text).map_err(io("writing HAProxy's configuration"))?;
    Ok(config)
}

pub(super) fn self_signed(host: &str) -> Result<String, BenchError> {
    let key = rcgen::KeyPair::generate().map_err(|e| failed(e.to_string()))?;
    let params =
        rcgen::CertificateParams::new(vec![host.to_owned()]).map_err(|e| failed(e.to_string()))?;
    let certificate = params
        .self_signed(&key)
        .map_err(|e| failed(e.to_string()))?;
    Ok(format!("{}{}", certificate.pem(), key.serialize_pem()))
}

/// The crt-list's lines as (link path, SNI).
pub(super) fn crt_list_lines(cert_dir: &Path) -> Vec<(PathBuf, String)> {
    std::fs::read_to_string(cert_dir.join("crt-list"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (path, rest) = line.split_once(' ')?;
            let sni = rest.rsplit(' ').next()?;
            Some((PathBuf::from(path), sni.to_owned()))
        })
        .collect()
}

/// Handshakes with every sampled route until each presents its bundle's certificate.
///
/// A round asks the first waiting route alone, and the others only once it is served:
/// HAProxy serves nothing before it has loaded every file, and hundreds of refused
/// connections per round would take CPU from its load.
pub(super) async fn sample_until_served(port: u16, samples: Vec<(String, Vec<u8>)>) {
    let mut waiting = samples;
    while let Some((sni, leaf)) = waiting.first() {
        if presented(port, sni).await.as_ref() != Some(leaf) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        waiting.remove(0);
        let mut still = Vec::with_capacity(waiting.len());
        for chunk in waiting.chunks(16) {
            let checks = chunk.iter().map(|(sni, leaf)| async move {
                (presented(port, sni).await.as_ref() == Some(leaf)).then_some(())
            });
            let results = futures::future::join_all(checks).await;
            for (sample, result) in chunk.iter().zip(results) {
                if result.is_none() {
                    still.push(sample.clone());
                }
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Client side: starts the daemon with a HAProxy it runs, and returns once HAProxy
/// serves every sampled route and its cold load has been measured.
pub async fn run(
    config: kube::Config,
    spec: &ClientSpec,
    started: Instant,
    errors: ErrorLog,
) -> Result<(ReadyReport, HaproxyRun), BenchError> {
    if spec.haproxy_start == HaproxyStart::Running {
        return super::socket_push::run(config, spec, errors).await;
    }
    let cert_dir = certwatch::files::memory_backed_tempdir("certwatch-bench-certs-")
        .map_err(io("creating the cert directory"))?;
    let run_dir = certwatch::files::memory_backed_tempdir("certwatch-bench-haproxy-")
        .map_err(io("creating HAProxy's directory"))?;
    let root = run_dir.path();
    let certs = cert_dir
        .path()
        .canonicalize()
        .map_err(io("reading the cert directory's path"))?;
    let default_pem = root.join("default.pem");
    std::fs::write(&default_pem, self_signed("default.invalid")?)
        .map_err(io("writing the default certificate"))?;
    let socket = root.join("admin.sock");
    let port = free_port()?;
    let crt_list = certs.join("crt-list");
    let setup = HaproxySetup {
        dir: root,
        default_pem: &default_pem,
        crt_list: &crt_list,
        threads: spec.haproxy_threads,
    };
    let haproxy_config = write_config(&setup, "haproxy.cfg", &socket, port)?;
    let mut options = DaemonOptions::new(&certs);
    options.max_concurrent_syncs = spec.max_concurrent_syncs;
    options.write_status = spec.status_writes;
    options.identity = kube_sim::ROUTER_USER.to_owned();
    options.client = kube_h2::ClientOptions::default().protocol(spec.protocol.into());
    // The benchmark reads how many routes wait for HAProxy from the metrics.
    options.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    // On loopback, read by the bench itself.
    options.unauthenticated_metrics = true;
    let mut process = ProcessOptions::new("haproxy", &haproxy_config, root.join("master.sock"));
    process.load_timeout = Duration::from_millis(spec.timeout_ms);
    options.haproxy = Some(HaproxyOptions::managed(&socket, process));
    let daemon = Daemon::start(config, options)
        .await
        .map_err(|e| failed(e.to_string()))?;

    let milestones = startup::Milestones::until_files_ready(&daemon, started).await?;
    let files_ready_ms = milestones.files_ready_ms;
    let peak_mib =
        || super::process_stats::mib(super::process_stats::ProcessStats::now().rss_peak_bytes);
    super::progress(&format!(
        "  haproxy: files ready at {files_ready_ms} ms, peak memory so far {} MiB",
        peak_mib()
    ));
    // Ready served, by handshakes: a sample spread over the crt-list.
    let lines = crt_list_lines(&certs);
    let samples = startup::spread_samples(&lines);
    let sampled = samples.len();
    let daemon_ready = startup::daemon_ready(&daemon, started);
    sample_until_served(port, samples).await;
    let served_ms = ms(started.elapsed());
    super::progress(&format!(
        "  haproxy: served at {served_ms} ms, peak memory so far {} MiB (with the handshake sampler's)",
        peak_mib()
    ));
    let daemon_ready_ms = startup::daemon_ready_ms(daemon_ready).await?;
    let ready = *daemon.status().borrow();
    let haproxy_start_ms = metric_seconds(
        &daemon.metrics_text(),
        "certwatch_haproxy_load_duration_seconds",
    )
    .map_or(0, |seconds| ms(Duration::from_secs_f64(seconds)));
    let worker = ready.haproxy.and_then(|haproxy| haproxy.worker);
    let served_haproxy = worker.map(HaproxyResources::of_worker).unwrap_or_default();
    if ready
        .haproxy
        .is_some_and(|haproxy| haproxy.state != HaproxyState::Serving)
    {
        errors.record("HAProxy was not serving at ready");
    }

    // HAProxy's own cold load of the same files, by a second HAProxy.
    let cold = startup::ColdLoad::measure(&setup, spec.timeout_ms).await?;
    super::progress(&format!("  haproxy: {}", cold.summary()));

    let haproxy = HaproxyReady {
        tls_port: port,
        stats_socket: socket,
        cert_dir: certs,
        worker,
        listed: lines.len(),
        files_ready_ms,
        daemon_ready_ms,
        served_ms,
        sampled,
        haproxy_start_ms,
        cold_load_ms: cold.ms,
        metrics_addr: daemon.http_addr(),
        threads: spec.haproxy_threads,
        served_haproxy,
        cold_haproxy: cold.haproxy,
        check: cold.check,
        push: None,
        config: super::deployment::HaproxyConfig::Certificates,
        servers: 0,
    };
    let later = [("served", served_ms)];
    Ok((
        startup::ready_report(&daemon, &milestones, &ready, &later, haproxy, spec, &errors),
        HaproxyRun {
            daemon,
            _haproxy: None,
            _cert_dir: cert_dir,
            _run_dir: run_dir,
        },
    ))
}

/// `haproxy -c -q -f config`, timed; its memory and CPU sampled every 20 ms while it
/// runs (the last sample before it exits stands for its peak: `VmHWM` only grows).
/// `openssl_conf`: the `OPENSSL_CONF` HAProxy loads the certificates under, if not
/// the system's.
pub(super) async fn check_load(
    config: &Path,
    openssl_conf: Option<&Path>,
) -> Result<HaproxyCheck, BenchError> {
    use super::process_stats::{other_process_cpu_ms, other_process_peak_rss_bytes};
    let started = Instant::now();
    let mut command = tokio::process::Command::new("haproxy");
    command
        .arg("-c")
        .arg("-q")
        .arg("-f")
        .arg(config)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(conf) = openssl_conf {
        command.env("OPENSSL_CONF", conf);
    }
    let mut child = command.spawn().map_err(io("starting haproxy -c"))?;
    let mut check = HaproxyCheck::default();
    let status = loop {
        if let Some(pid) = child.id() {
            if let Some(peak) = other_process_peak_rss_bytes(pid) {
                check.peak_rss_bytes = check.peak_rss_bytes.max(peak);
            }
            if let Some(cpu) = other_process_cpu_ms(pid) {
                check.cpu_ms = check.cpu_ms.max(cpu);
            }
        }
        tokio::select! {
            status = child.wait() => break status.map_err(io("waiting for haproxy -c"))?,
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    };
    check.ms = ms(started.elapsed());
    check.ok = status.success();
    Ok(check)
}

pub(super) fn metric_seconds(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The daemon's metrics over plain HTTP/1.0.
pub(super) async fn fetch_metrics(addr: std::net::SocketAddr) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: certwatch\r\n\r\n")
            .await
            .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        Some(answer)
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .ok()
        .flatten()
}

/// The largest backlog certwatch reported during a phase, and how often it was read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct BacklogPeak {
    /// Routes admitted and not served, at most.
    pub(super) routes: f64,
    /// The oldest unserved change's age, at most, in seconds.
    pub(super) age_s: f64,
    /// `/metrics` reads made.
    pub(super) scrapes: usize,
}

impl BacklogPeak {
    /// Takes one read's figures in; returns the pause before the next read: short while
    /// routes wait for HAProxy, long while none do.
    pub(super) fn record(&mut self, routes: f64, age_s: f64) -> Duration {
        self.routes = self.routes.max(routes);
        self.age_s = self.age_s.max(age_s);
        if routes > 0.0 {
            BACKLOG_SAMPLE
        } else {
            QUIET_BACKLOG_SAMPLE
        }
    }
}

/// Samples certwatch's backlog (routes not served, age of the oldest unserved change)
/// until `stop` is set; returns the largest of each. The CPU certwatch's process
/// (`client_pid`) spent while each read was served is added to `scrape_cpu_ms`: at
/// 100,000 routes `/metrics` holds a series per route, and rendering it every second
/// is the benchmark's load, not the rotations'.
async fn watch_backlog(
    addr: Option<std::net::SocketAddr>,
    stop: Arc<tokio::sync::Notify>,
    client_pid: Option<u32>,
    scrape_cpu_ms: Arc<std::sync::atomic::AtomicU64>,
) -> BacklogPeak {
    let mut peak = BacklogPeak::default();
    let Some(addr) = addr else {
        return peak;
    };
    let cpu = || client_pid.and_then(super::process_stats::other_process_cpu_ms);
    loop {
        let mut pause = BACKLOG_SAMPLE;
        let before = cpu();
        let text = fetch_metrics(addr).await;
        if let (Some(before), Some(after)) = (before, cpu()) {
            scrape_cpu_ms.fetch_add(
                after.saturating_sub(before),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        if let Some(text) = text {
            peak.scrapes += 1;
            pause = peak.record(
                metric_seconds(&text, "certwatch_routes_admitted_not_served").unwrap_or(0.0),
                metric_seconds(&text, "certwatch_oldest_unserved_change_age_seconds")
                    .unwrap_or(0.0),
            );
        }
        tokio::select! {
            () = stop.notified() => return peak,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// Waits until certwatch has nothing unserved (the backlog of a phase drained).
async fn wait_drained(addr: Option<std::net::SocketAddr>, timeout: Duration) -> bool {
    let Some(addr) = addr else {
        return false;
    };
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(text) = fetch_metrics(addr).await
            && metric_seconds(&text, "certwatch_routes_admitted_not_served") == Some(0.0)
        {
            return true;
        }
        tokio::time::sleep(BACKLOG_SAMPLE).await;
    }
    false
}

/// Latency percentiles of a phase, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50_ms: u64,
    /// 95th percentile.
    pub p95_ms: u64,
    /// 99th percentile.
    pub p99_ms: u64,
    /// Largest.
    pub max_ms: u64,
}

impl Percentiles {
    /// The percentiles of `samples`.
    pub(super) fn of(mut samples: Vec<u64>) -> Self {
        samples.sort_unstable();
        let at = |q: f64| {
            if samples.is_empty() {
                return 0;
            }
            let index = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
            samples[index]
        };
        Self {
            count: samples.len(),
            p50_ms: at(0.50),
            p95_ms: at(0.95),
            p99_ms: at(0.99),
            max_ms: samples.last().copied().unwrap_or(0),
        }
    }
}

/// One rotation phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RotationFigures {
    /// Rotations per second asked for.
    pub rate_per_s: f64,
    /// Rotations written.
    pub rotations: usize,
    /// Writes the API server refused.
    pub write_errors: usize,
    /// Wall time from the first write to the last write.
    pub writing_ms: u64,
    /// From each write's request to its answer: the API server's own time (with its
    /// latency), part of every latency below.
    pub write: Percentiles,
    /// Rotations followed.
    pub probes: usize,
    /// From the write to the new certificate in its bundle file.
    pub to_file: Percentiles,
    /// From the write to the new certificate in a handshake.
    pub to_served: Percentiles,
    /// Followed rotations never seen on disk within the deadline.
    pub never_on_disk: usize,
    /// Followed rotations never served within the deadline.
    pub never_served: usize,
    /// certwatch's CPU over the phase, in cores.
    pub certwatch_cores: Option<f64>,
    /// Of `certwatch_cores`, what certwatch's process spent while it served this
    /// benchmark's `/metrics` reads made during the phase (anything else it did during
    /// a read counts too, so certwatch's own work is at least the difference).
    pub scrape_cores: Option<f64>,
    /// HAProxy's worker's CPU over the phase, in cores.
    pub haproxy_cores: Option<f64>,
    /// The most routes certwatch reported waiting for HAProxy during the phase
    /// (`certwatch_routes_admitted_not_served`, read every second while routes wait,
    /// every 10 s while none do).
    pub peak_unserved_routes: f64,
    /// The oldest unserved change it reported, at most, in seconds.
    pub peak_unserved_age_s: f64,
    /// Reads of certwatch's `/metrics` for the two figures above, from the phase's first
    /// write until it drained; the CPU of those made before its last probe ended is in
    /// `certwatch_cores`.
    pub backlog_scrapes: usize,
    /// TLS handshakes the probes made to see their rotations served (at most 400 a
    /// second together): HAProxy's CPU for them is in `haproxy_cores`.
    pub probe_handshakes: usize,
    /// Whether the backlog drained (nothing unserved) within 120 s after the phase.
    pub drained: bool,
}

/// Everything the strategy measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HaproxyFigures {
    /// Start-up.
    pub startup: HaproxyReady,
    /// Ready served minus ready on disk.
    pub served_after_files_ms: u64,
    /// `served_after_files_ms` divided by HAProxy's own cold load of the same
    /// configuration (the start-up bound is 1.1).
    pub served_vs_cold_load: f64,
    /// HAProxy's own `set ssl cert` + `commit ssl cert` per second (pipelined, one
    /// connection).
    pub own_rate_per_s: f64,
    /// Certificates of that measurement.
    pub own_rate_sample: usize,
    /// The rotation phases.
    pub rotations: Vec<RotationFigures>,
    /// The HAProxy certwatch runs, after the rotation phases (peak memory and CPU
    /// since its start).
    pub after_rotations: Option<HaproxyResources>,
    /// The bounds, measured.
    pub bounds: BTreeMap<String, Check>,
}

/// The leaves written to one route's secret during a phase, in order: a rotation
/// counts as served when a handshake presents it or a later one (the controller pushes
/// only the newest version of a certificate).
type Written = Arc<Mutex<Vec<Vec<u8>>>>;

/// The rotation of one route: where its secret is, the host, and the new material.
struct Rotation {
    /// The route's leaves of this phase.
    written: Written,
    namespace: String,
    secret: String,
    host: String,
    bundle: PathBuf,
    crt: String,
    key: String,
    leaf: Vec<u8>,
}

fn rotation_material(host: &str) -> Result<(String, String, Vec<u8>), BenchError> {
    let key = rcgen::KeyPair::generate().map_err(|e| failed(e.to_string()))?;
    let mut params =
        rcgen::CertificateParams::new(vec![host.to_owned()]).map_err(|e| failed(e.to_string()))?;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    // Longer than certwatch's renewal warning, which would otherwise log every rotation.
    params.not_after = now + time::Duration::days(90);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, host.to_owned());
    let certificate = params
        .self_signed(&key)
        .map_err(|e| failed(e.to_string()))?;
    Ok((
        certificate.pem(),
        key.serialize_pem(),
        certificate.der().to_vec(),
    ))
}

/// Measures HAProxy's own rate: `set ssl cert` + `commit ssl cert` of the certificates
/// in `lines` (their own bundles again), pipelined in batches of 100 over one
/// connection.
async fn own_rate(socket: &Path, lines: &[(PathBuf, String)]) -> Result<(f64, usize), BenchError> {
    let client = RuntimeClient::spawn(RuntimeOptions::new(socket));
    let mut batches = Vec::new();
    for chunk in lines.chunks(100) {
        let mut commands = Vec::with_capacity(chunk.len() * 2);
        for (link, _) in chunk {
            let bundle = std::fs::read_to_string(link).map_err(io("reading a bundle"))?;
            let name = link.display().to_string();
            commands.push(Command::with_payload(
                format!("set ssl cert {name}"),
                Payload::new(bundle),
            ));
            commands.push(Command::new(format!("commit ssl cert {name}")));
        }
        batches.push(commands);
    }
    // The connection is opened before the clock starts.
    let opened = client.execute(vec![Command::new("show info")]).await;
    if let Some(error) = opened.error {
        return Err(failed(format!("HAProxy's runtime API: {error}")));
    }
    let started = Instant::now();
    let mut committed = 0;
    for commands in batches {
        let outcome = client.execute(commands).await;
        if let Some(error) = outcome.error {
            return Err(failed(format!("HAProxy's runtime API: {error}")));
        }
        committed += outcome
            .replies
            .iter()
            .filter(|reply| reply.contains("Success!"))
            .count();
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-6);
    Ok((committed as f64 / elapsed, committed))
}

/// Whether `seen` is the rotation at `index` of its route, or a later one.
fn this_or_later(written: &Written, index: usize, seen: Option<&Vec<u8>>) -> bool {
    let Some(seen) = seen else {
        return false;
    };
    sync::lock(written)
        .iter()
        .skip(index)
        .any(|leaf| leaf == seen)
}

/// Follows one rotation: to its file, then to a handshake.
async fn follow(
    port: u16,
    bundle: PathBuf,
    host: String,
    written: Written,
    index: usize,
    sent: Instant,
    pacer: Arc<HandshakePacer>,
) -> (Option<u64>, Option<u64>) {
    let deadline = sent + PROBE_DEADLINE;
    let mut on_disk = None;
    while Instant::now() < deadline {
        if this_or_later(&written, index, leaf_of_file(&bundle).as_ref()) {
            on_disk = Some(ms(sent.elapsed()));
            break;
        }
        tokio::time::sleep(poll_pause(sent.elapsed(), FILE_POLL)).await;
    }
    if on_disk.is_none() {
        return (None, None);
    }
    while Instant::now() < deadline {
        let slot = pacer.reserve(Instant::now());
        tokio::time::sleep_until(tokio::time::Instant::from_std(slot)).await;
        if this_or_later(&written, index, presented(port, &host).await.as_ref()) {
            return (on_disk, Some(ms(sent.elapsed())));
        }
        tokio::time::sleep(poll_pause(sent.elapsed(), HANDSHAKE_POLL)).await;
    }
    (on_disk, None)
}

/// One rotation phase at `rate` per second for `seconds`.
#[allow(clippy::too_many_arguments)]
async fn rotate(
    admin: &kube::Client,
    routes: &[kube_sim::GeneratedRoute],
    first: usize,
    ready: &HaproxyReady,
    rate: f64,
    seconds: f64,
    client_pid: Option<u32>,
    worker: Option<u32>,
) -> Result<RotationFigures, BenchError> {
    let count = ((rate * seconds).round() as usize).max(1);
    let every = (rate / PROBES_PER_SECOND).ceil().max(1.0) as usize;
    let mut rotations = Vec::with_capacity(count);
    let mut by_route: std::collections::HashMap<usize, Written> = std::collections::HashMap::new();
    for i in 0..count {
        let index = (first + i) % routes.len();
        let written = Arc::clone(by_route.entry(index).or_default());
        let route = &routes[index];
        let names = certwatch::files::bundle_names(&route_secrets::route::RouteKey::new(
            route.namespace.as_str(),
            route.route.as_str(),
        ))
        .map_err(|e| failed(e.to_string()))?;
        let (crt, key, leaf) = rotation_material(&route.host)?;
        rotations.push(Rotation {
            written,
            namespace: route.namespace.clone(),
            secret: route.secret.clone(),
            host: route.host.clone(),
            bundle: ready.cert_dir.join(names.bundle),
            crt,
            key,
            leaf,
        });
    }
    let cpu = |pid: Option<u32>| pid.and_then(super::process_stats::other_process_cpu_ms);
    let (certwatch_before, haproxy_before) = (cpu(client_pid), cpu(worker));
    let pacer = Arc::new(HandshakePacer::new(PROBE_HANDSHAKES_PER_SECOND));
    let stop = Arc::new(tokio::sync::Notify::new());
    let scrape_cpu_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let backlog = tokio::spawn(watch_backlog(
        ready.metrics_addr,
        Arc::clone(&stop),
        client_pid,
        Arc::clone(&scrape_cpu_ms),
    ));
    let started = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut writes = Vec::with_capacity(count);
    let mut probes = Vec::new();
    let b64 = base64::engine::general_purpose::STANDARD;
    for (i, rotation) in rotations.into_iter().enumerate() {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            started + interval * i as u32,
        ))
        .await;
        use base64::Engine as _;
        let patch = serde_json::json!({
            "data": {
                "tls.crt": b64.encode(&rotation.crt),
                "tls.key": b64.encode(&rotation.key),
            }
        });
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), &rotation.namespace);
        let secret = rotation.secret.clone();
        let position = {
            let mut written = sync::lock(&rotation.written);
            written.push(rotation.leaf.clone());
            written.len() - 1
        };
        let sent = Instant::now();
        writes.push(tokio::spawn(async move {
            let written = secrets
                .patch(&secret, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok();
            (written, ms(sent.elapsed()))
        }));
        if i % every == 0 {
            probes.push(tokio::spawn(follow(
                ready.tls_port,
                rotation.bundle,
                rotation.host,
                rotation.written,
                position,
                sent,
                Arc::clone(&pacer),
            )));
        }
    }
    let writing_ms = ms(started.elapsed());
    let mut write_errors = 0;
    let mut write_ms = Vec::with_capacity(writes.len());
    for write in writes {
        match write.await {
            Ok((true, took)) => write_ms.push(took),
            _ => write_errors += 1,
        }
    }
    let mut to_file = Vec::new();
    let mut to_served = Vec::new();
    let (mut never_on_disk, mut never_served) = (0, 0);
    let probed = probes.len();
    for probe in probes {
        let (disk, served) = probe.await.unwrap_or((None, None));
        match disk {
            Some(disk) => to_file.push(disk),
            None => never_on_disk += 1,
        }
        match served {
            Some(served) => to_served.push(served),
            None => never_served += 1,
        }
    }
    let wall = started.elapsed().as_secs_f64().max(1e-3);
    let cores = |before: Option<u64>, after: Option<u64>| {
        before
            .zip(after)
            .map(|(before, after)| (after.saturating_sub(before) as f64 / 1000.0) / wall)
    };
    let (certwatch_cores, haproxy_cores) = (
        cores(certwatch_before, cpu(client_pid)),
        cores(haproxy_before, cpu(worker)),
    );
    let scrape_cores = certwatch_cores
        .map(|_| scrape_cpu_ms.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1000.0 / wall);
    let drained = wait_drained(ready.metrics_addr, Duration::from_secs(120)).await;
    // `notify_one` keeps the permit if the sampler is between reads.
    stop.notify_one();
    let backlog = backlog.await.unwrap_or_default();
    Ok(RotationFigures {
        rate_per_s: rate,
        rotations: count,
        write_errors,
        writing_ms,
        write: Percentiles::of(write_ms),
        probes: probed,
        to_file: Percentiles::of(to_file),
        to_served: Percentiles::of(to_served),
        never_on_disk,
        never_served,
        certwatch_cores,
        scrape_cores,
        haproxy_cores,
        peak_unserved_routes: backlog.routes,
        peak_unserved_age_s: backlog.age_s,
        backlog_scrapes: backlog.scrapes,
        probe_handshakes: pacer.made(),
        drained,
    })
}

/// Benchmark side: HAProxy's own rate, then the rotation phases, then the bounds.
pub async fn measure(
    admin: &kube::Client,
    routes: &[kube_sim::GeneratedRoute],
    ready: &HaproxyReady,
    client_pid: Option<u32>,
    seconds: f64,
) -> Result<HaproxyFigures, BenchError> {
    if let Some(push) = &ready.push {
        return Ok(super::socket_push::figures(ready, push));
    }
    if routes.is_empty() {
        return Err(failed("no routes to rotate"));
    }
    let lines = crt_list_lines(&ready.cert_dir);
    let sample: Vec<(PathBuf, String)> = lines.iter().take(OWN_RATE_SAMPLE).cloned().collect();
    let (own_rate_per_s, own_rate_sample) = own_rate(&ready.stats_socket, &sample).await?;
    super::progress(&format!(
        "  haproxy: HAProxy's own rate: {own_rate_per_s:.0} set+commit/s ({own_rate_sample} certificates)"
    ));
    let bound_rate = (0.8 * own_rate_per_s).floor().max(1.0);
    let mut rates = vec![50.0, bound_rate, 500.0];
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    let mut phases = Vec::new();
    let mut first = 0;
    for rate in rates {
        let figures = rotate(
            admin,
            routes,
            first,
            ready,
            rate,
            seconds,
            client_pid,
            // A reload since (HAProxy's controller may reload under a backlog)
            // replaced the worker of the start.
            ready.served_haproxy.current_worker().or(ready.worker),
        )
        .await?;
        first += figures.rotations;
        super::progress(&format!(
            "  haproxy: {rate:.0} rotations/s: write p99 {}, to file p50 {} p99 {}, served p50 {} p99 {} max {} ({} probes, {} never served), certwatch {} cores ({} of them serving this benchmark's /metrics reads)",
            figures.write.p99_ms,
            figures.to_file.p50_ms,
            figures.to_file.p99_ms,
            figures.to_served.p50_ms,
            figures.to_served.p99_ms,
            figures.to_served.max_ms,
            figures.probes,
            figures.never_served,
            figures
                .certwatch_cores
                .map_or("?".to_owned(), |cores| format!("{cores:.3}")),
            figures
                .scrape_cores
                .map_or("?".to_owned(), |cores| format!("{cores:.3}")),
        ));
        phases.push(figures);
    }
    let served_after_files_ms = ready.served_ms.saturating_sub(ready.files_ready_ms);
    let mut bounds = BTreeMap::new();
    bounds.insert(
        "startup_served_vs_cold_load".to_owned(),
        Check::new(
            served_after_files_ms as f64,
            1.1 * ready.cold_load_ms as f64,
        ),
    );
    for phase in &phases {
        let never = |phase: &RotationFigures| (phase.never_served + phase.never_on_disk) as f64;
        if phase.rate_per_s <= 50.0 {
            bounds.insert(
                "p99_served_ms_at_50".to_owned(),
                Check::new(phase.to_served.p99_ms as f64, 1_000.0),
            );
            if let Some(cores) = phase.certwatch_cores {
                bounds.insert("certwatch_cores_at_50".to_owned(), Check::new(cores, 0.25));
            }
        }
        if phase.rate_per_s > 50.0 && phase.rate_per_s <= bound_rate {
            bounds.insert(
                format!("p99_served_ms_at_{:.0}", phase.rate_per_s),
                Check::new(phase.to_served.p99_ms as f64, 2_000.0),
            );
        }
        bounds.insert(
            format!("never_served_at_{:.0}", phase.rate_per_s),
            Check::new(never(phase), 0.0),
        );
        bounds.insert(
            format!("not_drained_at_{:.0}", phase.rate_per_s),
            Check::new(if phase.drained { 0.0 } else { 1.0 }, 0.0),
        );
    }
    Ok(HaproxyFigures {
        startup: ready.clone(),
        served_after_files_ms,
        served_vs_cold_load: (served_after_files_ms as f64 / ready.cold_load_ms.max(1) as f64
            * 1000.0)
            .round()
            / 1000.0,
        own_rate_per_s: (own_rate_per_s * 10.0).round() / 10.0,
        own_rate_sample,
        rotations: phases,
        after_rotations: ready
            .served_haproxy
            .current_worker()
            .or(ready.worker)
            .map(HaproxyResources::of_worker),
        bounds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_slow_down_in_proportion_to_their_wait() {
        let least = Duration::from_millis(10);
        assert_eq!(poll_pause(Duration::ZERO, least), least);
        assert_eq!(poll_pause(Duration::from_millis(50), least), least);
        assert_eq!(
            poll_pause(Duration::from_secs(3), least),
            Duration::from_millis(300)
        );
    }

    #[test]
    fn the_backlog_is_read_often_only_while_routes_wait() {
        let mut peak = BacklogPeak::default();
        assert_eq!(peak.record(0.0, 0.0), QUIET_BACKLOG_SAMPLE);
        assert_eq!(peak.record(120.0, 2.5), BACKLOG_SAMPLE);
        assert_eq!(peak.record(40.0, 3.0), BACKLOG_SAMPLE);
        assert_eq!(peak.record(0.0, 0.0), QUIET_BACKLOG_SAMPLE);
        assert_eq!((peak.routes, peak.age_s), (120.0, 3.0));
    }

    #[test]
    fn handshake_slots_are_spaced_in_the_order_asked_and_counted() {
        let pacer = HandshakePacer::new(400);
        let now = Instant::now();
        let first = pacer.reserve(now);
        let second = pacer.reserve(now);
        let third = pacer.reserve(now);
        assert_eq!(first, now);
        assert_eq!(second - first, Duration::from_micros(2_500));
        assert_eq!(third - second, Duration::from_micros(2_500));
        // A probe asking after the queue has emptied starts at once.
        let later = now + Duration::from_secs(1);
        assert_eq!(pacer.reserve(later), later);
        assert_eq!(pacer.made(), 4);
    }

    #[test]
    fn percentiles_take_the_sample_at_or_above_the_rank() {
        let figures = Percentiles::of((1..=100).collect());
        assert_eq!(
            (
                figures.count,
                figures.p50_ms,
                figures.p99_ms,
                figures.max_ms
            ),
            (100, 50, 99, 100)
        );
        assert_eq!(Percentiles::of(Vec::new()).max_ms, 0);
    }
}
