//! `certwatch-lab sim`: run the simulator as a standalone server (arguments and the run
//! loop; the binary only wires this into its subcommands).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::admin::ENDPOINTS;
use crate::auth::users::ROUTER_USER;
use crate::config::{FlowControlConfig, LatencyConfig, LimitsConfig, ServerFeatures, SimConfig};
use crate::error::SimError;
use crate::generator::generate::GenerateSpec;
use crate::kubeconfig::{ADMIN_CONTEXT, ROUTER_CONTEXT};
use crate::simulator::Simulator;
use kube_common::Verb;
use kube_common::duration::parse as parse_duration;

fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

fn verb_latency_arg(s: &str) -> Result<(Verb, Duration), String> {
    let (verb, d) = s
        .split_once('=')
        .ok_or_else(|| format!("expected VERB=DURATION (e.g. list=2s), got {s:?}"))?;
    let verb = verb.parse::<Verb>().map_err(|e| e.to_string())?;
    Ok((verb, duration_arg(d)?))
}

/// One `--feature-gates` entry, as kube-apiserver spells them (`WatchList=false`).
/// Only the gates the simulator models are accepted.
fn feature_gate_arg(s: &str) -> Result<(String, bool), String> {
    let (gate, value) = s
        .split_once('=')
        .ok_or_else(|| format!("expected GATE=true|false (e.g. WatchList=false), got {s:?}"))?;
    let enabled = value
        .parse::<bool>()
        .map_err(|_| format!("invalid value of {gate}: {value:?} (true or false)"))?;
    match gate {
        "WatchList" => Ok((gate.to_string(), enabled)),
        other => Err(format!(
            "unrecognized feature gate: {other} (the simulator models WatchList)"
        )),
    }
}

fn generate_arg(s: &str) -> Result<GenerateSpec, String> {
    s.parse::<GenerateSpec>().map_err(|e| e.to_string())
}

fn admin_help() -> String {
    let mut s = String::from(
        "Admin API (JSON, no authentication, at the server's URL; never under /api or /apis):\n",
    );
    for (method, path, what) in ENDPOINTS {
        s.push_str(&format!("  {method:<8} {path:<28} {what}\n"));
    }
    s.push_str(&format!(
        "\nThe kubeconfig has two contexts: {ROUTER_CONTEXT:?} (current; user {ROUTER_USER}, with only a router's rights)\nand {ADMIN_CONTEXT:?} (system:masters). Durations: 1400ms, 1.4s, 2m, 1h, 90d.\n\nExample:\n  certwatch-lab sim --listen 127.0.0.1:6443 --latency 1.4s --generate routes=2000,namespaces=50 \\\n      --write-kubeconfig /tmp/sim.kubeconfig\n  kubectl --kubeconfig /tmp/sim.kubeconfig --context admin get routes -A\n  curl -s http://127.0.0.1:6443/sim/stats\n"
    ));
    s
}

/// Arguments of `certwatch-lab sim`.
#[derive(Debug, Clone, Args)]
#[command(
    about = "Run the embedded Kubernetes API simulator until interrupted",
    long_about = "Run kube-sim, an embedded Kubernetes API simulator speaking the real wire protocol \
(secrets, namespaces, OpenShift routes, RBAC, access reviews, watches, HTTP/1.1 and HTTP/2 on one port), \
with latency, a concurrency limit and fault injection. It prints where it listens and where the \
kubeconfig is, and runs until SIGINT or SIGTERM.",
    after_long_help = admin_help()
)]
pub struct SimArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,

    /// Serve HTTPS (ALPN h2 and http/1.1) with a freshly generated CA, written into
    /// the kubeconfig's certificate-authority-data. Without it: plain HTTP/1.1 and h2c
    /// (prior knowledge) on the same port. kubectl sends credentials only over TLS,
    /// so use --tls to drive the simulator with kubectl.
    #[arg(long)]
    pub tls: bool,

    /// Server-side latency applied to every request before it is answered (for a
    /// watch: before its response headers).
    #[arg(long, value_name = "D", value_parser = duration_arg, default_value = "0s")]
    pub latency: Duration,

    /// Random deviation of the latency, uniform in [-D, +D].
    #[arg(long, value_name = "D", value_parser = duration_arg, default_value = "0s")]
    pub jitter: Duration,

    /// Latency for one verb, overriding --latency (repeatable), e.g. --verb-latency list=2s.
    #[arg(long = "verb-latency", value_name = "VERB=D", value_parser = verb_latency_arg)]
    pub verb_latency: Vec<(Verb, Duration)>,

    /// A simple limit on concurrent in-flight requests (one FIFO queue, then 429);
    /// unlimited when absent. Idle open watches are not in flight.
    #[arg(long, value_name = "N")]
    pub max_inflight: Option<usize>,

    /// Requests that may wait for a slot beyond --max-inflight; more get 429.
    #[arg(long = "queue", value_name = "N", default_value_t = 50)]
    pub queue: usize,

    /// Turn API Priority and Fairness on, as kube-apiserver runs it: the default flow
    /// schemas and priority levels (the router's service account lands in
    /// workload-low), per-flow queues, 429 with Retry-After beyond them. Implied by
    /// --max-requests-inflight and --max-mutating-requests-inflight.
    #[arg(long)]
    pub priority_and_fairness: bool,

    /// kube-apiserver's --max-requests-inflight (default 400): with the next flag, the
    /// seats API Priority and Fairness divides among priority levels by their shares.
    #[arg(long, value_name = "N")]
    pub max_requests_inflight: Option<u32>,

    /// kube-apiserver's --max-mutating-requests-inflight (default 200).
    #[arg(long, value_name = "N")]
    pub max_mutating_requests_inflight: Option<u32>,

    /// Retry-After sent with 429 responses of the simple limit (--max-inflight).
    #[arg(long, value_name = "D", value_parser = duration_arg, default_value = "1s")]
    pub retry_after: Duration,

    /// Feature gates, as kube-apiserver takes them: `WatchList=false` refuses streaming
    /// lists (`sendInitialEvents`) with 422, as older clusters do.
    #[arg(long = "feature-gates", value_name = "GATE=BOOL", value_delimiter = ',', value_parser = feature_gate_arg)]
    pub feature_gates: Vec<(String, bool)>,

    /// Model storage without RequestWatchProgress (etcd 3.4): every streaming list is
    /// answered 200 with one ERROR event (code 500) and ends.
    #[arg(long)]
    pub storage_without_watch_progress: bool,

    /// SETTINGS_MAX_CONCURRENT_STREAMS advertised on HTTP/2 connections.
    #[arg(long = "max-streams", value_name = "N", default_value_t = 100)]
    pub max_streams: u32,

    /// Events kept in the watch history; older resourceVersions get 410 Expired.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub history: usize,

    /// Interval of periodic BOOKMARK events on watches that allow them.
    #[arg(long, value_name = "D", value_parser = duration_arg, default_value = "60s")]
    pub bookmark_interval: Duration,

    /// YAML or JSON manifests (multi-document) to load at start (repeatable).
    #[arg(long = "seed", value_name = "FILE")]
    pub seed: Vec<PathBuf>,

    /// Generate routes with external certificates, their secrets, namespaces and the
    /// router's RBAC: routes=N,namespaces=K, optionally followed by secrets=S (shared
    /// round-robin when fewer than routes), host=PATTERN (may use {route},
    /// {namespace}, {index}), validity=90d, shards=2, rbac=true, endpoints=true (each
    /// route's Service and an EndpointSlice with one ready endpoint; default false).
    #[arg(long, value_name = "SPEC", value_parser = generate_arg)]
    pub generate: Option<GenerateSpec>,

    /// Where to write the kubeconfig (contexts "router" (current) and "admin").
    #[arg(long, value_name = "PATH")]
    pub write_kubeconfig: PathBuf,

    /// Fixed bearer token for the admin user (random by default).
    #[arg(long, value_name = "TOKEN")]
    pub admin_token: Option<String>,

    /// Fixed bearer token for the router identity (random by default).
    #[arg(long, value_name = "TOKEN")]
    pub router_token: Option<String>,
}

impl SimArgs {
    /// API Priority and Fairness as the flags ask for it, or `None` when off.
    pub fn flow_control(&self) -> Option<FlowControlConfig> {
        let asked = self.priority_and_fairness
            || self.max_requests_inflight.is_some()
            || self.max_mutating_requests_inflight.is_some();
        asked.then(|| {
            let defaults = FlowControlConfig::default();
            FlowControlConfig {
                max_requests_inflight: self
                    .max_requests_inflight
                    .unwrap_or(defaults.max_requests_inflight),
                max_mutating_requests_inflight: self
                    .max_mutating_requests_inflight
                    .unwrap_or(defaults.max_mutating_requests_inflight),
                ..defaults
            }
        })
    }

    /// The simulator configuration these arguments describe.
    pub fn config(&self) -> SimConfig {
        SimConfig {
            listen: self.listen,
            tls: self.tls,
            latency: LatencyConfig {
                default: self.latency,
                jitter: self.jitter,
                per_verb: self.verb_latency.iter().cloned().collect(),
            },
            max_concurrent_streams: self.max_streams,
            limits: LimitsConfig {
                max_inflight: self.max_inflight,
                queue_len: self.queue,
                retry_after: self.retry_after,
            },
            flow_control: self.flow_control(),
            history_limit: self.history,
            bookmark_interval: self.bookmark_interval,
            admin_token: self.admin_token.clone(),
            router_token: self.router_token.clone(),
            features: ServerFeatures {
                watch_list: self
                    .feature_gates
                    .iter()
                    .rev()
                    .find(|(gate, _)| gate == "WatchList")
                    .is_none_or(|(_, enabled)| *enabled),
                watch_progress: !self.storage_without_watch_progress,
            },
            ..SimConfig::default()
        }
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Starts the simulator, seeds it and generates what the arguments ask (saying so on
/// stdout), and writes the kubeconfig: everything [`run`] does before it serves.
pub async fn start(args: &SimArgs) -> Result<Simulator, SimError> {
    let sim = Simulator::start(args.config()).await?;
    for path in &args.seed {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Read {
            path: path.clone(),
            source,
        })?;
        let n = sim.load_manifests(&text)?;
        println!("seeded {n} objects from {}", path.display());
    }
    if let Some(spec) = &args.generate {
        let started = std::time::Instant::now();
        let generated = sim.generate(spec)?;
        println!(
            "generated {} routes with {} secrets in {} namespaces ({:.1}s)",
            generated.routes.len(),
            generated.secrets,
            generated.namespaces.len(),
            started.elapsed().as_secs_f64()
        );
    }
    sim.write_kubeconfig(&args.write_kubeconfig)?;
    Ok(sim)
}

/// Starts the simulator ([`start`]), prints where everything is, and serves until
/// SIGINT/SIGTERM.
pub async fn run(args: SimArgs) -> Result<(), SimError> {
    let sim = start(&args).await?;
    println!(
        "kube-sim listening on {} (HTTP/1.1 and HTTP/2{})",
        sim.url(),
        if args.tls { ", TLS with ALPN" } else { " h2c" }
    );
    println!(
        "kubeconfig: {} (contexts: {ROUTER_CONTEXT} (current), {ADMIN_CONTEXT})",
        args.write_kubeconfig.display()
    );
    println!(
        "admin API: {}/sim (stats: {}/sim/stats)",
        sim.url(),
        sim.url()
    );
    wait_for_signal().await;
    println!("shutting down");
    sim.shutdown().await;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn config(args: &[&str]) -> Result<SimConfig, clap::Error> {
        let argv = ["sim", "--write-kubeconfig", "/dev/null"]
            .iter()
            .chain(args);
        Cli::try_parse_from(argv).map(|cli| cli.sim.config())
    }

    #[test]
    fn feature_flags_read_as_kube_apiserver_spells_them() {
        let on = config(&[]).unwrap().features;
        assert!(on.watch_list && on.watch_progress);
        let off = config(&[
            "--feature-gates=WatchList=false",
            "--storage-without-watch-progress",
        ])
        .unwrap()
        .features;
        assert!(!off.watch_list && !off.watch_progress);
        assert!(
            config(&["--feature-gates=WatchList=true"])
                .unwrap()
                .features
                .watch_list
        );
        assert!(config(&["--feature-gates=Nope=false"]).is_err());
        assert!(config(&["--feature-gates=WatchList=maybe"]).is_err());
        assert!(
            config(&["--verb-latency=fetch=1s"]).is_err(),
            "verbs are typed"
        );
    }
}
