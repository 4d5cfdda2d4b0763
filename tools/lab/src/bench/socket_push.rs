//! `--strategy haproxy --haproxy-start running`: certwatch's start-up push to a HAProxy
//! that runs already (`certwatch run --haproxy-socket`), measured by TLS handshakes.
//!
//! In the client process:
//!
//! - the benchmark starts HAProxy itself (master-worker, as `haproxy -W` runs), on a
//!   configuration whose crt-list is certwatch's, empty: no route certificate yet;
//! - once its worker serves, certwatch starts (the clock starts here), attached to that
//!   HAProxy by its stats socket only (no master CLI: no reload may stand in for the
//!   push). It reads what HAProxy holds (nothing of its own) and pushes every
//!   certificate through the runtime API once its files are ready;
//! - **the first routes served**: from certwatch's start, the cert directory is read
//!   until its first bundles appear (certwatch writes the routes it has decided before
//!   its crt-list); up to [`FIRST_ROUTES`] of them are asked by handshakes, each by the
//!   DNS name its certificate holds, until one presents its bundle's certificate;
//! - a sample of routes (200, picked at random over the crt-list: certwatch pushes in
//!   an order of its own) is asked by handshakes, in rounds, from the files being ready
//!   until each presents its bundle's certificate: when the first, half and every
//!   sampled route were served. A round follows the one before it after a tenth of the
//!   time elapsed so far (at least 100 ms), so each moment is known within about 10 %
//!   and the handshakes take little of HAProxy's CPU; how many there were is reported;
//! - **every route served**: the later of every sampled route served and certwatch's
//!   ready (HAProxy answered `Success!` to the commands of every start-up route);
//! - HAProxy's worker's and certwatch's CPU from certwatch's start to every route
//!   served, and the runtime API commands certwatch sent (its metrics);
//! - **HAProxy's cold load** of the same crt-list by a second HAProxy, and
//!   `haproxy -c` of it, as the managed mode measures them.
//!
//! The bounds: the first routes served within 5 s of certwatch's start, every route
//! within 1.25 × HAProxy's cold load. No rotation phases follow.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use certwatch::haproxy::HaproxyOptions;
use certwatch::haproxy::process::{HaproxyProcess, ProcessOptions};
use certwatch::{Daemon, DaemonOptions};
use serde::{Deserialize, Serialize};

use super::BenchError;
use super::haproxy::{
    HaproxyFigures, HaproxyRun, HaproxySetup, STARTUP_SAMPLE, crt_list_lines, failed, free_port,
    io, leaf_of_file, ms, presented, self_signed, startup, write_config,
};
use super::process_stats::{mib, other_process_cpu_ms, process_cpu_time};
use super::protocol::{ClientSpec, ErrorLog, HaproxyReady, HaproxyResources, ReadyReport};
use super::scenario::Check;

/// The least pause between two rounds of handshakes.
const ROUND_PAUSE: Duration = Duration::from_millis(100);
/// Handshakes in flight at once within a round.
const ROUND_CONCURRENCY: usize = 16;
/// The first routes must be served within this of certwatch's start.
const FIRST_SERVED_BOUND_MS: f64 = 5_000.0;
/// How many of the first bundles written are asked for the first routes served.
const FIRST_ROUTES: usize = 4;
/// How often the cert directory is read for its first bundles.
const FIRST_BUNDLES_POLL: Duration = Duration::from_millis(20);
/// Every sampled route must be served within this many times HAProxy's cold load.
const ALL_SERVED_BOUND: f64 = 1.25;

/// The push to a running HAProxy, as the client measured it. Times count from
/// certwatch's start (HAProxy already serving).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PushStartup {
    /// HAProxy's own start with no route certificate (spawn to its worker serving),
    /// before certwatch's.
    pub haproxy_empty_start_ms: u64,
    /// Files ready (every route decided, bundles and crt-list written).
    pub files_ready_ms: u64,
    /// The first of the first routes decided served (asked from certwatch's start);
    /// `None` when none was.
    #[serde(default)]
    pub first_route_served_ms: Option<u64>,
    /// The first sampled route served (a handshake presents its certificate).
    pub first_served_ms: u64,
    /// Half of the sampled routes served.
    pub half_served_ms: u64,
    /// Every sampled route served.
    pub sampled_served_ms: u64,
    /// Every route served: the later of every sampled route served and certwatch's
    /// ready (HAProxy answered `Success!` to every start-up route's commands).
    pub all_served_ms: u64,
    /// Routes sampled.
    pub sampled: usize,
    /// Handshakes the sampler made.
    pub handshakes: u64,
    /// Every route served over HAProxy's cold load of the same crt-list.
    pub all_over_cold_load: f64,
    /// Certificates certwatch committed (`commit ssl cert` that succeeded) until every
    /// route was served.
    pub pushed: u64,
    /// Certificates per second from certwatch's start to every route served (the push
    /// begins with the first routes decided, before the files are ready).
    pub push_rate_per_s: f64,
    /// HAProxy's worker's CPU from certwatch's start to every route served.
    pub haproxy_cpu_ms: u64,
    /// This client's CPU (certwatch, and the sampler's handshakes) over the same time.
    pub certwatch_cpu_ms: u64,
    /// HAProxy's worker's CPU per certificate pushed, in milliseconds.
    pub haproxy_cpu_per_cert_ms: f64,
    /// Runtime API commands certwatch sent, by command and result
    /// (`certwatch_haproxy_commands_total`), at every route served.
    pub commands: BTreeMap<String, u64>,
}

/// The running HAProxy the benchmark starts before certwatch.
struct Running {
    process: HaproxyProcess,
    worker: u32,
    took: Duration,
}

async fn start_running(
    config: &std::path::Path,
    master: std::path::PathBuf,
    timeout_ms: u64,
) -> Result<Running, BenchError> {
    let mut options = ProcessOptions::new("haproxy", config, master);
    options.load_timeout = Duration::from_millis(timeout_ms);
    let (process, worker) = HaproxyProcess::start(options)
        .await
        .map_err(|e| failed(format!("starting HAProxy with no route certificate: {e}")))?;
    let took = process.start_duration();
    Ok(Running {
        process,
        worker,
        took,
    })
}

/// Client side: starts HAProxy with no route certificate, then the daemon attached to
/// it, and returns once every sampled route is served and HAProxy's cold load has been
/// measured.
pub async fn run(
    config: kube::Config,
    spec: &ClientSpec,
    errors: ErrorLog,
) -> Result<(ReadyReport, HaproxyRun), BenchError> {
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
    // HAProxy starts before certwatch: on certwatch's crt-list, empty.
    std::fs::write(&crt_list, "").map_err(io("writing an empty crt-list"))?;
    let setup = HaproxySetup {
        dir: root,
        default_pem: &default_pem,
        crt_list: &crt_list,
        threads: spec.haproxy_threads,
    };
    let haproxy_config = write_config(&setup, "haproxy.cfg", &socket, port)?;
    let running = start_running(&haproxy_config, root.join("master.sock"), spec.timeout_ms).await?;
    super::progress(&format!(
        "  haproxy (running): HAProxy serves with no route certificate after {} ms (worker {})",
        ms(running.took),
        running.worker
    ));

    let mut options = DaemonOptions::new(&certs);
    options.max_concurrent_syncs = spec.max_concurrent_syncs;
    options.write_status = spec.status_writes;
    options.identity = kube_sim::ROUTER_USER.to_owned();
    options.client = kube_h2::ClientOptions::default().protocol(spec.protocol.into());
    options.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    // On loopback, read by the bench itself.
    options.unauthenticated_metrics = true;
    // `--haproxy-socket`: the runtime API only, no master CLI to reload through.
    options.haproxy = Some(HaproxyOptions::external(&socket));
    let haproxy_cpu_before = other_process_cpu_ms(running.worker);
    let cpu_before = process_cpu_time();
    let started = Instant::now();
    let daemon = Daemon::start(config, options)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let first_routes = tokio::spawn(first_routes_served(
        port,
        certs.clone(),
        started,
        daemon.status(),
    ));

    let milestones = startup::Milestones::until_files_ready(&daemon, started).await?;
    let files_ready_ms = milestones.files_ready_ms;
    super::progress(&format!(
        "  haproxy (running): files ready at {files_ready_ms} ms"
    ));
    let lines = crt_list_lines(&certs);
    let samples: Vec<(String, Vec<u8>)> = scattered(lines.len(), STARTUP_SAMPLE)
        .into_iter()
        .filter_map(|index| {
            let (link, sni) = &lines[index];
            Some((sni.clone(), leaf_of_file(link)?))
        })
        .collect();
    let sampled = samples.len();
    let daemon_ready = startup::daemon_ready(&daemon, started);
    let (mut served, handshakes) = served_times(port, samples, started, daemon.status()).await;
    let sampled_served_ms = ms(started.elapsed());
    // Every route, not only the sample: certwatch is ready once HAProxy answered
    // `Success!` to every start-up route's commands.
    let daemon_ready_ms = startup::daemon_ready_ms(daemon_ready).await?;
    let all_served_ms = sampled_served_ms.max(daemon_ready_ms);
    let haproxy_cpu_ms = other_process_cpu_ms(running.worker)
        .zip(haproxy_cpu_before)
        .map_or(0, |(after, before)| after.saturating_sub(before));
    let certwatch_cpu_ms = ms(process_cpu_time().saturating_sub(cpu_before));
    let commands = commands_sent(&daemon.metrics_text());
    // Every route is served by now: the probe has answered.
    let (first_route_served_ms, first_handshakes) = first_routes
        .await
        .map_err(|e| failed(format!("the first routes' probe failed: {e}")))?;
    served.sort_unstable();
    let first_served_ms = served.first().copied().unwrap_or(sampled_served_ms);
    let half_served_ms = served
        .get(served.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(sampled_served_ms);
    super::progress(&format!(
        "  haproxy (running): first routes decided served at {} ({first_handshakes} handshakes)",
        first_route_served_ms.map_or_else(|| "never".to_owned(), |at| format!("{at} ms"))
    ));
    super::progress(&format!(
        "  haproxy (running): first sampled route served at {first_served_ms} ms, half at {half_served_ms} ms, all {sampled} at {sampled_served_ms} ms ({handshakes} handshakes), certwatch ready (every route) at {daemon_ready_ms} ms; HAProxy's worker CPU {haproxy_cpu_ms} ms, this client's {certwatch_cpu_ms} ms"
    ));
    let ready = *daemon.status().borrow();
    let served_haproxy = HaproxyResources::of_worker(running.worker);

    // HAProxy's own cold load of the same files, by a second HAProxy.
    let cold = startup::ColdLoad::measure(&setup, spec.timeout_ms).await?;
    let cold_load_ms = cold.ms;
    let pushed = commands
        .get("commit ssl cert/ok")
        .copied()
        .unwrap_or_default();
    let push_seconds = all_served_ms as f64 / 1000.0;
    let push = PushStartup {
        haproxy_empty_start_ms: ms(running.took),
        files_ready_ms,
        first_route_served_ms,
        first_served_ms,
        half_served_ms,
        sampled_served_ms,
        all_served_ms,
        sampled,
        handshakes,
        all_over_cold_load: ratio(all_served_ms, cold_load_ms),
        pushed,
        push_rate_per_s: if push_seconds > 0.0 {
            (pushed as f64 / push_seconds).round()
        } else {
            0.0
        },
        haproxy_cpu_ms,
        certwatch_cpu_ms,
        haproxy_cpu_per_cert_ms: if pushed > 0 {
            (haproxy_cpu_ms as f64 / pushed as f64 * 1000.0).round() / 1000.0
        } else {
            0.0
        },
        commands,
    };
    super::progress(&format!(
        "  haproxy (running): {}; all served / cold load = {:.2}; {} certificates pushed, {:.3} ms of HAProxy's CPU each",
        cold.summary(),
        push.all_over_cold_load,
        push.pushed,
        push.haproxy_cpu_per_cert_ms,
    ));

    if ready
        .haproxy
        .is_none_or(|haproxy| haproxy.startup_unserved != 0)
    {
        errors.record("certwatch's HAProxy status does not say every start-up route is served");
    }
    let haproxy = HaproxyReady {
        tls_port: port,
        stats_socket: socket,
        cert_dir: certs,
        worker: Some(running.worker),
        listed: lines.len(),
        files_ready_ms,
        daemon_ready_ms,
        served_ms: all_served_ms,
        sampled,
        haproxy_start_ms: ms(running.took),
        cold_load_ms,
        metrics_addr: daemon.http_addr(),
        threads: spec.haproxy_threads,
        served_haproxy,
        cold_haproxy: cold.haproxy,
        check: cold.check,
        push: Some(push),
        config: super::deployment::HaproxyConfig::Certificates,
        servers: 0,
    };
    let mut later = vec![
        ("first_served", first_served_ms),
        ("half_served", half_served_ms),
        ("served", all_served_ms),
    ];
    if let Some(at) = first_route_served_ms {
        later.push(("first_route_served", at));
    }
    Ok((
        startup::ready_report(&daemon, &milestones, &ready, &later, haproxy, spec, &errors),
        HaproxyRun {
            daemon,
            _haproxy: Some(running.process),
            _cert_dir: cert_dir,
            _run_dir: run_dir,
        },
    ))
}

/// The first routes certwatch decides, asked from its start: waits for the cert
/// directory's first bundles, takes up to [`FIRST_ROUTES`] of those there at that
/// moment, and asks each by handshakes (by the first DNS name of its certificate) until
/// one presents its bundle's certificate. Returns when that happened (milliseconds
/// since `started`; `None` if certwatch stopped first, or took every route without one
/// of them being seen served) and the handshakes made.
async fn first_routes_served(
    port: u16,
    cert_dir: std::path::PathBuf,
    started: Instant,
    mut status: tokio::sync::watch::Receiver<certwatch::DaemonStatus>,
) -> (Option<u64>, u64) {
    let mut handshakes = 0_u64;
    let mut first: Vec<(String, Vec<u8>)> = Vec::new();
    while first.is_empty() {
        first = first_bundles(&cert_dir);
        if first.is_empty() {
            tokio::select! {
                () = tokio::time::sleep(FIRST_BUNDLES_POLL) => {}
                changed = status.changed() => if changed.is_err() { return (None, handshakes) },
            }
        }
    }
    loop {
        let checks = first
            .iter()
            .map(|(sni, leaf)| async move { presented(port, sni).await.as_ref() == Some(leaf) });
        let results = futures::future::join_all(checks).await;
        handshakes += first.len() as u64;
        if results.into_iter().any(|served| served) {
            return (Some(ms(started.elapsed())), handshakes);
        }
        if status.borrow().ready {
            // Every route was taken, and none of these presents its certificate.
            return (None, handshakes);
        }
        tokio::select! {
            () = tokio::time::sleep(ROUND_PAUSE) => {}
            changed = status.changed() => if changed.is_err() { return (None, handshakes) },
        }
    }
}

/// Up to [`FIRST_ROUTES`] bundles in `cert_dir` now, each as (a DNS name its
/// certificate holds, its leaf).
fn first_bundles(cert_dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(cert_dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "pem"))
        .filter_map(|path| {
            let leaf = leaf_of_file(&path)?;
            let name = first_dns_name(&leaf)?;
            Some((name, leaf))
        })
        .take(FIRST_ROUTES)
        .collect()
}

/// The first DNS name in a certificate's subject alternative names.
fn first_dns_name(der: &[u8]) -> Option<String> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let names = certificate.subject_alternative_name().ok()??;
    names
        .value
        .general_names
        .iter()
        .find_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            _ => None,
        })
}

/// `count` indices of `0..len` scattered over it without a pattern (ordered by a hash
/// of the index): certwatch pushes in an order of its own, and a regular stride over
/// the crt-list could fall on routes it pushes together (one namespace's).
fn scattered(len: usize, count: usize) -> Vec<usize> {
    let mix = |index: usize| {
        // splitmix64's finalizer.
        let mut z = (index as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut indices: Vec<usize> = (0..len).collect();
    indices.sort_unstable_by_key(|index| mix(*index));
    indices.truncate(count);
    indices
}

fn ratio(value_ms: u64, base_ms: u64) -> f64 {
    if base_ms == 0 {
        return 0.0;
    }
    (value_ms as f64 / base_ms as f64 * 1000.0).round() / 1000.0
}

/// Asks every sample in rounds until each presents its certificate; returns when each
/// was first seen served (milliseconds since `started`) and the handshakes made. A
/// round also starts as soon as certwatch says HAProxy took every route, so that the
/// last samples are not seen late by a round's pause.
async fn served_times(
    port: u16,
    samples: Vec<(String, Vec<u8>)>,
    started: Instant,
    mut status: tokio::sync::watch::Receiver<certwatch::DaemonStatus>,
) -> (Vec<u64>, u64) {
    let mut ready_seen = false;
    let mut waiting = samples;
    let mut served = Vec::with_capacity(waiting.len());
    let mut handshakes = 0_u64;
    while !waiting.is_empty() {
        let mut still = Vec::with_capacity(waiting.len());
        for chunk in waiting.chunks(ROUND_CONCURRENCY) {
            let checks = chunk.iter().map(|(sni, leaf)| async move {
                (presented(port, sni).await.as_ref() == Some(leaf)).then(|| ms(started.elapsed()))
            });
            let results = futures::future::join_all(checks).await;
            handshakes += chunk.len() as u64;
            for (sample, result) in chunk.iter().zip(results) {
                match result {
                    Some(at) => served.push(at),
                    None => still.push(sample.clone()),
                }
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            let pause = tokio::time::sleep(ROUND_PAUSE.max(started.elapsed() / 10));
            tokio::select! {
                () = pause => {}
                ready = status.wait_for(|status| status.ready), if !ready_seen => {
                    ready_seen = true;
                    // A daemon gone ends nothing here: the rounds go on at their pace.
                    drop(ready);
                }
            }
        }
    }
    (served, handshakes)
}

/// `certwatch_haproxy_commands_total` by `command/result`.
fn commands_sent(metrics: &str) -> BTreeMap<String, u64> {
    let mut commands = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("certwatch_haproxy_commands_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix("=\""))
                .and_then(|value| value.strip_suffix('"'))
        };
        let (Some(command), Some(result), Ok(value)) = (
            label("command"),
            label("result"),
            value.trim().parse::<f64>(),
        ) else {
            continue;
        };
        if value > 0.0 {
            commands.insert(format!("{command}/{result}"), value as u64);
        }
    }
    commands
}

/// Benchmark side: the figures and bounds of a push (no rotation phases).
pub fn figures(ready: &HaproxyReady, push: &PushStartup) -> HaproxyFigures {
    let mut bounds = BTreeMap::new();
    bounds.insert(
        "push_first_served_ms".to_owned(),
        Check::new(
            // Never seen on its own: served with every route at the latest.
            push.first_route_served_ms.unwrap_or(push.all_served_ms) as f64,
            FIRST_SERVED_BOUND_MS,
        ),
    );
    bounds.insert(
        "push_all_served_vs_cold_load".to_owned(),
        Check::new(
            push.all_served_ms as f64,
            ALL_SERVED_BOUND * ready.cold_load_ms as f64,
        ),
    );
    HaproxyFigures {
        startup: ready.clone(),
        served_after_files_ms: ready.served_ms.saturating_sub(ready.files_ready_ms),
        bounds,
        ..HaproxyFigures::default()
    }
}

/// The push's figures for people.
pub fn report(out: &mut String, scenario: &str, h: &HaproxyFigures, push: &PushStartup) {
    use std::fmt::Write as _;
    let s = &h.startup;
    let human = super::report::human_ms;
    let _ = writeln!(
        out,
        "\n{scenario} haproxy, running before certwatch ({} routes in the crt-list; HAProxy served with no route certificate after {}):",
        s.listed,
        human(push.haproxy_empty_start_ms),
    );
    let _ = writeln!(
        out,
        "  from certwatch's start: first routes decided served {}; files ready {}, first sampled route served {}, half {}, all {} ({} sampled at random, {} handshakes); certwatch's /readyz (HAProxy took every route) {}; every route served {}",
        push.first_route_served_ms
            .map_or_else(|| "never".to_owned(), human),
        human(push.files_ready_ms),
        human(push.first_served_ms),
        human(push.half_served_ms),
        human(push.sampled_served_ms),
        push.sampled,
        push.handshakes,
        human(s.daemon_ready_ms),
        human(push.all_served_ms),
    );
    let _ = writeln!(
        out,
        "  HAProxy's own cold load of the same crt-list {}: all served / cold load = {:.2}; haproxy -c {} ({})",
        human(s.cold_load_ms),
        push.all_over_cold_load,
        human(s.check.ms),
        if s.check.ok { "accepted" } else { "REFUSED" },
    );
    let _ = writeln!(
        out,
        "  {} certificates pushed, {:.0}/s from certwatch's start; HAProxy's worker CPU {:.2} s ({:.3} ms per certificate; the cold load's: {:.2} s), this client's {:.2} s",
        push.pushed,
        push.push_rate_per_s,
        push.haproxy_cpu_ms as f64 / 1000.0,
        push.haproxy_cpu_per_cert_ms,
        s.check.cpu_ms as f64 / 1000.0,
        push.certwatch_cpu_ms as f64 / 1000.0,
    );
    // How much of a core HAProxy had: the push from certwatch's start (the first
    // routes decided reach HAProxy before the files are ready) to every route served,
    // the cold load from spawn to serving. On a loaded machine the wall times say how
    // much CPU each got, the CPU what each cost.
    let busy = |cpu_ms: u64, wall_ms: u64| {
        if wall_ms == 0 {
            0.0
        } else {
            cpu_ms as f64 / wall_ms as f64
        }
    };
    let _ = writeln!(
        out,
        "  HAProxy's CPU: the push {:.2} s over {} ({:.2} cores); the cold load {:.2} s over {} ({:.2} cores)",
        push.haproxy_cpu_ms as f64 / 1000.0,
        human(push.all_served_ms),
        busy(push.haproxy_cpu_ms, push.all_served_ms),
        s.cold_haproxy.cpu_ms as f64 / 1000.0,
        human(s.cold_load_ms),
        busy(s.cold_haproxy.cpu_ms, s.cold_load_ms),
    );
    let _ = writeln!(
        out,
        "  HAProxy's worker peak {} MiB after the push, the cold load's {} MiB",
        mib(s.served_haproxy.worker_peak_rss_bytes),
        mib(s.cold_haproxy.worker_peak_rss_bytes),
    );
    let commands: Vec<String> = push
        .commands
        .iter()
        .map(|(command, count)| format!("{command} {count}"))
        .collect();
    let _ = writeln!(out, "  runtime API commands: {}", commands.join(", "));
    for (name, check) in &h.bounds {
        let _ = writeln!(
            out,
            "  bound {name}: {:.3} <= {:.3}: {}",
            check.value,
            check.limit,
            if check.met { "met" } else { "MISSED" }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_distinct_and_scattered() {
        let picked = scattered(10_000, 200);
        assert_eq!(picked.len(), 200);
        let distinct: std::collections::BTreeSet<usize> = picked.iter().copied().collect();
        assert_eq!(distinct.len(), 200);
        // No residue of a stride dominates (twenty namespaces, routes dealt in turn).
        let mut by_residue = [0_usize; 20];
        for index in &picked {
            by_residue[index % 20] += 1;
        }
        assert!(by_residue.iter().all(|count| *count < 30), "{by_residue:?}");
        assert_eq!(scattered(5, 200).len(), 5);
    }

    #[test]
    fn commands_are_read_from_the_metrics() {
        let text = "certwatch_haproxy_commands_total{command=\"commit ssl cert\",result=\"ok\"} 12\n\
                    certwatch_haproxy_commands_total{command=\"show info\",result=\"error\"} 0\n\
                    certwatch_haproxy_commands_total{command=\"new ssl cert\",result=\"error\"} 2\n\
                    other 3\n";
        let commands = commands_sent(text);
        assert_eq!(
            commands.into_iter().collect::<Vec<_>>(),
            vec![
                ("commit ssl cert/ok".to_owned(), 12),
                ("new ssl cert/error".to_owned(), 2)
            ]
        );
    }
}
