//! One result per scenario and strategy: the JSON line and the table row.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kube_sim::{ProtocolCounts, SimStats};
use serde::Serialize;

use super::process_stats::mib;
use super::protocol::{Measurement, ReadyReport};
use super::scenario::{Check, Scenario, Strategy, Targets};

/// The result of one strategy in one scenario. Serialized as one JSON line.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// Scenario name.
    pub scenario: String,
    /// `serial`, `concurrent` or `daemon`.
    pub strategy: &'static str,
    /// Routes in the cluster.
    pub routes: usize,
    /// Distinct secrets in the cluster.
    pub secrets: usize,
    /// Namespaces in the cluster.
    pub namespaces: usize,
    /// Simulator latency per request.
    pub latency_ms: u64,
    /// Simulator concurrency limit, if any.
    pub max_inflight: Option<usize>,
    /// Simulator queue length behind the limit (only meaningful with a limit).
    pub queue: Option<usize>,
    /// The product's bound on concurrent first syncs, if any.
    pub max_concurrent_syncs: Option<usize>,
    /// From the first request until every measured route was admitted or rejected.
    /// For `serial` with a sample, this is the sample's time (see `measured_routes`).
    pub ready_ms: Option<u64>,
    /// Routes the strategy applied (fewer than `routes` for a serial sample).
    pub measured_routes: usize,
    /// Distinct secrets of those routes.
    pub measured_secrets: usize,
    /// Serial only: measured time per route.
    pub per_route_ms: Option<f64>,
    /// Serial only: measured time per registered secret.
    pub per_secret_ms: Option<f64>,
    /// Serial sample only: NOT MEASURED. `routes_listed` plus `per_secret_ms` times
    /// `secrets`: what the whole cluster would take at the measured rate.
    pub extrapolated_ready_ms: Option<u64>,
    /// Serial only: the reference's start-up by its formula (one registration per
    /// secret, each the latency rounded up to the next 100 ms poll); `None` against a
    /// server whose latency is not injected.
    pub model_ready_ms: Option<u64>,
    /// Requests the simulator served, by verb, then resource.
    pub requests: BTreeMap<String, BTreeMap<String, u64>>,
    /// Sum of `requests`.
    pub requests_total: u64,
    /// `requests_total / measured_secrets`.
    pub requests_per_secret: f64,
    /// The product's strategies: what they need without any retry (one streaming
    /// watch per secret, one rules review per namespace, the route listing, and the
    /// streaming probe).
    pub requests_needed: Option<u64>,
    /// Highest number of requests in flight at the simulator.
    pub peak_inflight: u64,
    /// Highest number of requests waiting in the simulator's queue.
    pub peak_queued: u64,
    /// Requests the simulator rejected with 429.
    pub rejected_429: u64,
    /// The product's strategies: requests beyond `requests_needed`, i.e. retries (of
    /// 429s and of anything else that failed).
    pub retries: Option<u64>,
    /// Responses by status code.
    pub responses: BTreeMap<String, u64>,
    /// Connections the client opened (kube-h2 pool counts).
    pub connections: u64,
    /// The same, by protocol.
    pub connections_by_protocol: ProtocolCounts,
    /// Client connections still open once start-up settled.
    pub connections_open: u64,
    /// Connections the simulator accepted from the client (cross-check of
    /// `connections`; the benchmark's own admin connections are subtracted).
    pub sim_connections: u64,
    /// Secret watches open at the simulator once start-up settled.
    pub open_watches: u64,
    /// Every watch open at the simulator then, by resource (the route watch too).
    pub open_watches_by_resource: BTreeMap<String, u64>,
    /// The client process's peak resident memory (VmHWM).
    pub rss_bytes: u64,
    /// Its resident memory at the measurement.
    pub rss_now_bytes: u64,
    /// Its CPU time (user + system, all threads) from process start.
    pub cpu_ms: u64,
    /// CPU time the simulator process used from the counter reset to the
    /// measurement (it shares the machine's cores with the client).
    pub sim_cpu_ms: Option<u64>,
    /// Failed syncs and watches, rejected routes, failures of the run.
    pub errors: u64,
    /// The first few error messages.
    pub error_samples: Vec<String>,
    /// Milestones in milliseconds since the first request.
    pub phases: BTreeMap<String, u64>,
    /// The product's strategies only: each target from the issue, measured.
    pub targets: Option<BTreeMap<&'static str, Check>>,
    /// The product's strategies only: whether every target was met.
    pub targets_met: Option<bool>,
    /// The `haproxy` strategy only: start-up served, HAProxy's own rate, rotations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub haproxy: Option<super::haproxy::HaproxyFigures>,
    /// `--bad-secrets`: the secrets made invalid before the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bad_secrets: Option<super::bad_input::BadSecrets>,
    /// `--reissue`: every secret rewritten by a new CA once ready, followed to the files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reissue: Option<super::bad_input::ReissueFigures>,
}

/// Everything a result is made from.
pub struct RunInputs<'a> {
    /// The scenario.
    pub scenario: &'a Scenario,
    /// The strategy.
    pub strategy: Strategy,
    /// The child's report at ready.
    pub ready: &'a ReadyReport,
    /// The child's figures after settling.
    pub measurement: &'a Measurement,
    /// The simulator's counters after settling.
    pub sim: &'a SimStats,
    /// Admin connections opened during the run (subtracted from the simulator's).
    pub admin_connections: u64,
    /// CPU the simulator used during the run.
    pub sim_cpu_ms: Option<u64>,
    /// Whether routes are listed with a streaming list (one request instead of two).
    pub streaming_route_list: bool,
}

impl RunResult {
    /// Assembles the result and checks the targets.
    pub fn new(inputs: RunInputs<'_>) -> Self {
        let RunInputs {
            scenario,
            strategy,
            ready,
            measurement,
            sim,
            admin_connections,
            sim_cpu_ms,
            streaming_route_list,
        } = inputs;
        let measured_secrets = ready.measured_secrets;
        let requests_per_secret = if measured_secrets == 0 {
            0.0
        } else {
            round2(sim.requests_total as f64 / measured_secrets as f64)
        };
        let sampled = strategy == Strategy::Serial && ready.measured_routes < scenario.routes;
        let extrapolated_ready_ms = match (sampled, ready.per_secret_ms) {
            (true, Some(per_secret)) => {
                let listed = ready.phases.get("routes_listed").copied().unwrap_or(0);
                Some(listed + (per_secret * scenario.secrets as f64).round() as u64)
            }
            _ => None,
        };
        let model_ready_ms =
            (strategy == Strategy::Serial && scenario.latency_injected).then(|| {
                let model = super::serial::modelled_startup(scenario.secrets, scenario.latency);
                u64::try_from(model.as_millis()).unwrap_or(u64::MAX)
            });
        let product = strategy != Strategy::Serial;
        let requests_needed = product.then(|| {
            let route_listing = if streaming_route_list { 1 } else { 2 };
            // The product's one streaming probe, sent with the route listing.
            let probe = 1;
            scenario.secrets as u64 + scenario.namespaces_used() as u64 + route_listing + probe
        });
        let connections =
            measurement.http2_connections_opened + measurement.http1_connections_opened;
        let mut result = Self {
            scenario: scenario.name.clone(),
            strategy: strategy.as_str(),
            routes: scenario.routes,
            secrets: scenario.secrets,
            namespaces: scenario.namespaces,
            latency_ms: scenario.latency_ms(),
            max_inflight: scenario.max_inflight,
            queue: scenario.max_inflight.map(|_| scenario.queue),
            max_concurrent_syncs: match strategy {
                Strategy::Serial => Some(1),
                Strategy::Concurrent | Strategy::Daemon | Strategy::Haproxy => {
                    scenario.max_concurrent_syncs
                }
            },
            ready_ms: Some(ready.ready_ms),
            measured_routes: ready.measured_routes,
            measured_secrets,
            per_route_ms: ready.per_route_ms.map(round2),
            per_secret_ms: ready.per_secret_ms.map(round2),
            extrapolated_ready_ms,
            model_ready_ms,
            requests: sim.requests.clone(),
            requests_total: sim.requests_total,
            requests_per_secret,
            requests_needed,
            peak_inflight: sim.peak_inflight,
            peak_queued: sim.peak_queued,
            rejected_429: sim.rejected_429,
            retries: requests_needed.map(|needed| sim.requests_total.saturating_sub(needed)),
            responses: sim.responses.clone(),
            connections,
            connections_by_protocol: ProtocolCounts {
                h1: measurement.http1_connections_opened,
                h2: measurement.http2_connections_opened,
            },
            connections_open: measurement.connections_open,
            sim_connections: (sim.connections.h1 + sim.connections.h2)
                .saturating_sub(admin_connections),
            open_watches: sim
                .open_watches_by_resource
                .get("secrets")
                .copied()
                .unwrap_or(0),
            open_watches_by_resource: sim.open_watches_by_resource.clone(),
            rss_bytes: measurement.process.rss_peak_bytes,
            rss_now_bytes: measurement.process.rss_bytes,
            cpu_ms: measurement.process.cpu_ms,
            sim_cpu_ms,
            errors: measurement.errors,
            error_samples: measurement.error_samples.clone(),
            phases: ready.phases.clone(),
            targets: None,
            targets_met: None,
            haproxy: None,
            bad_secrets: None,
            reissue: None,
        };
        if product {
            let checks = result.check(&scenario.targets());
            result.targets_met = Some(checks.values().all(|c| c.met));
            result.targets = Some(checks);
        }
        result
    }

    /// A result for a run that did not become ready.
    pub fn failed(scenario: &Scenario, strategy: Strategy, message: String) -> Self {
        Self {
            scenario: scenario.name.clone(),
            strategy: strategy.as_str(),
            routes: scenario.routes,
            secrets: scenario.secrets,
            namespaces: scenario.namespaces,
            latency_ms: scenario.latency_ms(),
            max_inflight: scenario.max_inflight,
            queue: scenario.max_inflight.map(|_| scenario.queue),
            max_concurrent_syncs: scenario.max_concurrent_syncs,
            ready_ms: None,
            measured_routes: 0,
            measured_secrets: 0,
            per_route_ms: None,
            per_secret_ms: None,
            extrapolated_ready_ms: None,
            model_ready_ms: None,
            requests: BTreeMap::new(),
            requests_total: 0,
            requests_per_secret: 0.0,
            requests_needed: None,
            peak_inflight: 0,
            peak_queued: 0,
            rejected_429: 0,
            retries: None,
            responses: BTreeMap::new(),
            connections: 0,
            connections_by_protocol: ProtocolCounts::default(),
            connections_open: 0,
            sim_connections: 0,
            open_watches: 0,
            open_watches_by_resource: BTreeMap::new(),
            rss_bytes: 0,
            rss_now_bytes: 0,
            cpu_ms: 0,
            sim_cpu_ms: None,
            errors: 1,
            error_samples: vec![message],
            phases: BTreeMap::new(),
            targets: None,
            targets_met: Some(false),
            haproxy: None,
            bad_secrets: None,
            reissue: None,
        }
    }

    fn check(&self, targets: &Targets) -> BTreeMap<&'static str, Check> {
        let mut checks = BTreeMap::new();
        // The haproxy strategy's ready includes HAProxy loading every certificate: its
        // own bounds check that; the daemon's part is its files being ready.
        let ready = match self.phases.get("files_ready") {
            Some(files_ready) if self.strategy == "haproxy" => *files_ready as f64,
            _ => self.ready_ms.unwrap_or(u64::MAX) as f64,
        };
        checks.insert("ready_ms", Check::new(ready, targets.ready_ms as f64));
        if let Some(rss) = targets.rss_bytes {
            checks.insert("rss_bytes", Check::new(self.rss_bytes as f64, rss as f64));
        }
        checks.insert(
            "connections",
            Check::new(self.connections as f64, targets.connections as f64),
        );
        checks.insert(
            "requests",
            Check::new(self.requests_total as f64, targets.requests as f64),
        );
        if let (Some(factor), Some(needed)) = (targets.retry_factor, self.requests_needed) {
            checks.insert(
                "requests_vs_needed",
                Check::new(self.requests_total as f64, (factor * needed as f64).floor()),
            );
        }
        if let (Some(fraction), Some(needed)) = (targets.refused_fraction, self.requests_needed) {
            // The first window is everything when the product is unbounded.
            let first_window = self
                .max_concurrent_syncs
                .map_or(needed, |bound| bound as u64);
            checks.insert(
                "rejected_429",
                Check::new(
                    self.rejected_429 as f64,
                    (fraction * needed as f64).floor() + first_window as f64,
                ),
            );
        }
        checks.insert(
            "errors",
            Check::new(self.errors as f64, targets.errors as f64),
        );
        checks
    }

    /// The JSON line.
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// A duration in milliseconds for people: `850 ms`, `3.12 s`, `4.2 min`, `3.9 h`.
pub fn human_ms(ms: u64) -> String {
    let secs = ms as f64 / 1000.0;
    if ms < 1_000 {
        format!("{ms} ms")
    } else if secs < 120.0 {
        format!("{secs:.2} s")
    } else if secs < 7_200.0 {
        format!("{:.1} min", secs / 60.0)
    } else {
        format!("{:.1} h", secs / 3_600.0)
    }
}

/// The table for people.
pub fn table(results: &[RunResult]) -> String {
    let header = [
        "scenario",
        "strategy",
        "routes",
        "secrets",
        "latency",
        "ready",
        "req",
        "req/secret",
        "429",
        "retries",
        "peak infl",
        "conns",
        "watches",
        "rss MiB",
        "cpu s",
        "errors",
        "targets",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    let mut notes = Vec::new();
    for r in results {
        let ready = match (r.ready_ms, r.extrapolated_ready_ms) {
            (None, _) => "FAILED".to_owned(),
            (Some(ms), Some(extrapolated)) => {
                notes.push(format!(
                    "{} serial: measured {} routes ({} secrets) in {} ({:.0} ms per secret); all {} secrets extrapolated: {}{}",
                    r.scenario,
                    r.measured_routes,
                    r.measured_secrets,
                    human_ms(ms),
                    r.per_secret_ms.unwrap_or(0.0),
                    r.secrets,
                    human_ms(extrapolated),
                    r.model_ready_ms
                        .map(|model| format!(" (formula: {})", human_ms(model)))
                        .unwrap_or_default(),
                ));
                format!(
                    "{} [{} routes] ~{}*",
                    human_ms(ms),
                    r.measured_routes,
                    human_ms(extrapolated)
                )
            }
            (Some(ms), None) => human_ms(ms),
        };
        let targets = match (&r.targets, r.targets_met) {
            (Some(_), Some(true)) => "met".to_owned(),
            (Some(checks), _) => {
                let missed: Vec<&str> = checks
                    .iter()
                    .filter(|(_, c)| !c.met)
                    .map(|(name, _)| *name)
                    .collect();
                format!("missed: {}", missed.join(","))
            }
            (None, Some(false)) => "failed".to_owned(),
            (None, _) => "-".to_owned(),
        };
        rows.push(vec![
            r.scenario.clone(),
            r.strategy.to_owned(),
            r.routes.to_string(),
            r.secrets.to_string(),
            format!("{} ms", r.latency_ms),
            ready,
            r.requests_total.to_string(),
            format!("{:.2}", r.requests_per_secret),
            r.rejected_429.to_string(),
            r.retries
                .map_or_else(|| "-".to_owned(), |retries| retries.to_string()),
            r.peak_inflight.to_string(),
            r.connections.to_string(),
            r.open_watches.to_string(),
            mib(r.rss_bytes),
            format!("{:.2}", r.cpu_ms as f64 / 1000.0),
            r.errors.to_string(),
            targets,
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|row| row[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (n, row) in rows.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, width))| {
                if i < 2 || i == 5 || i == header.len() - 1 {
                    format!("{cell:<width$}")
                } else {
                    format!("{cell:>width$}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
        if n == 0 {
            let _ = writeln!(
                out,
                "{}",
                "-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1))
            );
        }
    }
    if !notes.is_empty() {
        out.push('\n');
        let _ = writeln!(
            out,
            "* extrapolated, not measured: the serial baseline ran on a sample of the oldest routes."
        );
        for note in notes {
            let _ = writeln!(out, "  {note}");
        }
    }
    for r in results {
        if let Some(haproxy) = &r.haproxy {
            haproxy_section(&mut out, r, haproxy);
        }
        bad_input_section(&mut out, r);
    }
    out
}

/// `--bad-secrets` and `--reissue` figures for people.
fn bad_input_section(out: &mut String, r: &RunResult) {
    if let Some(bad) = &r.bad_secrets {
        let _ = writeln!(
            out,
            "\n{} {}: {} invalid secrets ({} routes): {} admitted, errors {}",
            r.scenario,
            r.strategy,
            bad.secrets,
            bad.routes,
            r.measured_routes.saturating_sub(bad.routes),
            r.errors,
        );
        if let Some(served) = &bad.served {
            let _ = writeln!(
                out,
                "  haproxy: {} bad routes asked, {} presenting their certificate, {} without a handshake; {} of {} good routes beside them served",
                served.bad_routes_asked,
                served.bad_routes_presenting_their_certificate,
                served.bad_routes_without_handshake,
                served.good_routes_served,
                served.good_routes_asked,
            );
        }
    }
    if let Some(re) = &r.reissue {
        let mib = super::process_stats::mib;
        let _ = writeln!(
            out,
            "\n{} {}: CA re-issue of {} secrets over {} ({} routes followed):",
            r.scenario,
            r.strategy,
            re.secrets,
            human_ms(re.window_ms),
            re.routes,
        );
        let _ = writeln!(
            out,
            "  writes sent in {}, refused {}; to file p50 / p99 / max {} / {} / {}; all on disk {}; never on disk {}",
            human_ms(re.writing_ms),
            re.write_errors,
            human_ms(re.to_file.p50_ms),
            human_ms(re.to_file.p99_ms),
            human_ms(re.to_file.max_ms),
            re.all_on_disk_ms
                .map_or_else(|| "never".to_owned(), human_ms),
            re.never_on_disk,
        );
        let _ = writeln!(
            out,
            "  certwatch: resident {} MiB before, at most {} MiB during, peak (start-up included) {} MiB; cpu {}",
            mib(re.rss_before_bytes),
            mib(re.rss_max_bytes),
            mib(re.rss_peak_after_bytes),
            re.cpu_ms.map_or_else(
                || "?".to_owned(),
                |ms| format!("{:.1} s", ms as f64 / 1000.0)
            ),
        );
        if let Some(served) = &re.served {
            let seconds = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
            let _ = writeln!(
                out,
                "  served ({} probes, {} handshakes): p50 / p95 / p99 / max {} / {} / {} / {}; all sampled served {}; never served {} (followed {} after the last write)",
                served.probes,
                served.probe_handshakes,
                human_ms(served.to_served.p50_ms),
                human_ms(served.to_served.p95_ms),
                human_ms(served.to_served.p99_ms),
                human_ms(served.to_served.max_ms),
                served
                    .all_sampled_served_ms
                    .map_or_else(|| "never".to_owned(), human_ms),
                served.never_served,
                human_ms(served.follow_deadline_ms),
            );
            let _ = writeln!(
                out,
                "  HAProxy's backlog: peak {} routes (oldest {:.1} s), drained {}; pushes {} (set {}, commit {}, errors {}) for {} changes; reloads {}",
                served.peak_unserved_routes,
                served.peak_unserved_age_s,
                served
                    .drained_ms
                    .map_or_else(|| "never".to_owned(), human_ms),
                served.pushed_certificates,
                served.set_ssl_cert,
                served.commit_ssl_cert,
                served.command_errors,
                served.changes,
                served.reloads,
            );
            let _ = writeln!(
                out,
                "  over {}: certwatch cpu {}; HAProxy resident {} MiB before, at most {} MiB, cpu {}",
                human_ms(served.phase_ms),
                served
                    .certwatch_cpu_ms
                    .map_or_else(|| "?".to_owned(), seconds),
                mib(served.haproxy_rss_before_bytes),
                mib(served.haproxy_rss_max_bytes),
                seconds(served.haproxy_cpu_ms),
            );
        }
    }
}

/// The `haproxy` strategy's figures for people.
fn haproxy_section(out: &mut String, r: &RunResult, h: &super::haproxy::HaproxyFigures) {
    let s = &h.startup;
    if let Some(push) = &s.push {
        super::socket_push::report(out, &r.scenario, h, push);
        return;
    }
    let _ = writeln!(
        out,
        "\n{} haproxy ({} routes in the crt-list):",
        r.scenario, s.listed
    );
    let _ = writeln!(
        out,
        "  ready on disk {}, served (all {} sampled routes in a handshake) {}, certwatch's /readyz {}",
        human_ms(s.files_ready_ms),
        s.sampled,
        human_ms(s.served_ms),
        human_ms(s.daemon_ready_ms),
    );
    let (configuration, start) = match s.config {
        super::deployment::HaproxyConfig::Certificates => (
            "the benchmark's, certificates only; HAProxy run by certwatch",
            "HAProxy's start as certwatch ran it",
        ),
        super::deployment::HaproxyConfig::Deployment => (
            "the deployment's routing configuration; HAProxy run by the sidecar's script",
            "HAProxy's start as the sidecar ran it, from the files",
        ),
    };
    let _ = writeln!(
        out,
        "  configuration: {configuration}{}",
        if s.servers > 0 {
            format!(" ({} servers in the routes' backends)", s.servers)
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "  served {} after the files were ready ({:.2} x the cold load); {start} {}; HAProxy's own cold load of the same configuration {}",
        human_ms(h.served_after_files_ms),
        h.served_vs_cold_load,
        human_ms(s.haproxy_start_ms),
        human_ms(s.cold_load_ms),
    );
    let _ = writeln!(
        out,
        "  haproxy -c of the same configuration: {} ({}), peak {} MiB, cpu {:.2} s (sampled every 20 ms)",
        human_ms(s.check.ms),
        if s.check.ok { "accepted" } else { "REFUSED" },
        mib(s.check.peak_rss_bytes),
        s.check.cpu_ms as f64 / 1000.0,
    );
    let resources = |name: &str, r: &super::protocol::HaproxyResources| {
        format!(
            "{name}: worker peak {} MiB, master peak {} MiB, cpu {:.2} s",
            mib(r.worker_peak_rss_bytes),
            mib(r.master_peak_rss_bytes),
            r.cpu_ms as f64 / 1000.0
        )
    };
    let _ = writeln!(
        out,
        "  {}; {}",
        resources("the HAProxy served from, at served", &s.served_haproxy),
        resources("the cold load's HAProxy, serving", &s.cold_haproxy),
    );
    if let Some(after) = &h.after_rotations {
        let _ = writeln!(
            out,
            "  {}",
            resources("the HAProxy served from, after the rotations", after)
        );
    }
    let _ = writeln!(
        out,
        "  HAProxy's own rate: {:.0} set ssl cert + commit ssl cert per second ({} certificates, pipelined, one connection); nbthread {}",
        h.own_rate_per_s,
        h.own_rate_sample,
        s.threads
            .map_or("HAProxy's default (one per CPU)".to_owned(), |threads| {
                threads.to_string()
            }),
    );
    let _ = writeln!(
        out,
        "  {:>8}  {:>9}  {:>6}  {:>28}  {:>28}  {:>6}  {:>15}  {:>9}  {:>14}",
        "rate/s",
        "rotations",
        "probes",
        "to file p50/p95/p99/max ms",
        "served p50/p95/p99/max ms",
        "never",
        "certwatch (scr)",
        "haproxy",
        "backlog peak"
    );
    for phase in &h.rotations {
        let p = |x: &super::haproxy::Percentiles| {
            format!("{}/{}/{}/{}", x.p50_ms, x.p95_ms, x.p99_ms, x.max_ms)
        };
        let cores = |c: Option<f64>| c.map_or("?".to_owned(), |c| format!("{c:.3}"));
        let _ = writeln!(
            out,
            "  {:>8.0}  {:>9}  {:>6}  {:>28}  {:>28}  {:>6}  {:>15}  {:>9}  {:>14}",
            phase.rate_per_s,
            phase.rotations,
            phase.probes,
            p(&phase.to_file),
            p(&phase.to_served),
            phase.never_served + phase.never_on_disk,
            format!(
                "{} ({})",
                cores(phase.certwatch_cores),
                cores(phase.scrape_cores)
            ),
            cores(phase.haproxy_cores),
            format!(
                "{:.0} / {:.1} s{}",
                phase.peak_unserved_routes,
                phase.peak_unserved_age_s,
                if phase.drained { "" } else { " !" }
            ),
        );
    }
    let _ = writeln!(
        out,
        "  (cores: CPU over the phase; scr: certwatch's CPU while it served this benchmark's /metrics reads; never: followed rotations not served within 60 s; backlog peak: most routes waiting for HAProxy / oldest wait, ! = not drained in 120 s)"
    );
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
    fn human_durations() {
        assert_eq!(human_ms(850), "850 ms");
        assert_eq!(human_ms(3_120), "3.12 s");
        assert_eq!(human_ms(252_000), "4.2 min");
        assert_eq!(human_ms(14_040_000), "3.9 h");
    }
}
