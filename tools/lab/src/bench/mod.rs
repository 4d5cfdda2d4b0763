//! `certwatch-lab bench`: start-up scenarios against the simulator, the reference
//! router's behaviour next to the product's, measured in one run.
//!
//! # How a run is measured
//!
//! Three kinds of process, so that each figure belongs to what it describes:
//!
//! * the **benchmark** (`certwatch-lab bench`) runs the scenarios and talks to the
//!   simulator only through its admin API (`/sim/...`);
//! * per scenario, one **simulator** (`certwatch-lab sim`, this same binary), which
//!   generates the cluster and counts every request, connection and watch;
//! * per scenario and strategy, one **client** (`certwatch-lab bench-client`, hidden),
//!   which connects with the simulator's kubeconfig as the router identity, runs the
//!   strategy until ready and reports. Its peak memory (`VmHWM`) and CPU time
//!   (`CLOCK_PROCESS_CPUTIME_ID`) are therefore the client's alone.
//!
//! Per strategy: wait until the simulator is idle (the previous client's watches are
//! gone), reset its counters, start the client, wait for its ready report, let the
//! simulator settle (nothing in flight, the watch count stable), read the simulator's
//! counters, then ask the client for its figures and end it.
//!
//! # Example
//!
//! ```text
//! certwatch-lab bench                                   # the five built-in scenarios
//! certwatch-lab bench --scenarios customer-2000 --json  # one JSON object per strategy
//! certwatch-lab bench --routes 20 --latency 10ms --serial-routes 0 --json
//! # bad input at scale: 100 invalid secrets, then every secret re-issued in a minute
//! certwatch-lab bench --routes 100000 --latency 100ms --strategy daemon \
//!     --bad-secrets 100 --reissue 60s --timeout 20m
//! # the same, followed to HAProxy too (served by handshakes)
//! certwatch-lab bench --routes 100000 --latency 100ms --strategy haproxy \
//!     --bad-secrets 100 --reissue 60s --timeout 40m
//! ```

mod bad_input;
mod client_process;
mod concurrent;
mod daemon;
mod deployment;
mod haproxy;
mod process_stats;
mod protocol;
mod real_server;
mod report;
mod scenario;
mod serial;
mod sim_process;
mod socket_push;

use std::time::{Duration, Instant};

use clap::Args;
use tokio::io::{AsyncBufReadExt, BufReader};

pub use serial::{CACHE_SYNC_POLL, modelled_startup, registration_time};

use client_process::ClientProcess;
use protocol::{
    ClientMessage, ClientSpec, ErrorLog, HttpProtocol, MEASURE, Measurement, RouteListing,
};
use real_server::RealServer;
use report::{RunInputs, RunResult, human_ms};
use scenario::{BUDGET_PRESETS, PRESETS, Scenario, Strategy};
use sim_process::{Generated, SimProcess};

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The command line does not describe a runnable benchmark.
    #[error("{0}")]
    Usage(String),
    /// An I/O operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The simulator process misbehaved.
    #[error("simulator: {message}")]
    Simulator {
        /// What went wrong.
        message: String,
    },
    /// An admin API request failed.
    #[error("simulator admin API {path}: {message}")]
    Admin {
        /// The admin path.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// A client child process misbehaved.
    #[error("client process: {message}")]
    Client {
        /// What went wrong.
        message: String,
    },
    /// A strategy could not become ready.
    #[error("{strategy} strategy: {message}")]
    Strategy {
        /// The strategy.
        strategy: &'static str,
        /// What went wrong.
        message: String,
    },
    /// Some runs failed (their rows say why).
    #[error("{failed} of {total} runs failed")]
    RunsFailed {
        /// Failed runs.
        failed: usize,
        /// All runs.
        total: usize,
    },
}

fn duration_arg(s: &str) -> Result<Duration, String> {
    kube_common::duration::parse(s).map_err(|e| e.to_string())
}

/// Arguments of `certwatch-lab bench`.
#[derive(Debug, Clone, Args)]
#[command(
    about = "Measure start-up against the simulator: the reference router's behaviour vs certwatch",
    long_about = "Runs start-up scenarios against the Kubernetes API simulator (a separate \
`certwatch-lab sim` process). In each scenario the `serial` strategy is the reference router as its \
code measured (routes one at a time; per new secret one streaming list that stays open as the \
watch, waited for under the secret monitor's global lock and polled every 100 ms as \
WaitForCacheSync does; a secret already registered costs nothing), `concurrent` runs \
certwatch's own pipeline and `daemon` the whole `certwatch run`. Each strategy runs in a client \
process of its own, so memory and CPU are the client's alone.\n\n\
Built-in scenarios: seed-112 (587 ms), seed-1738, customer-2000, scale-10000 (1,414 ms each; \
scale-10000 is 10,000 routes in 100 namespaces, the others one namespace per 40 routes) and \
apf-2000 (2,000 secrets at 1,414 ms with the simulator limited to 50 requests in flight, a queue \
of 300 and 429 beyond it; the product bounds its first syncs to 50). The budget scenarios, run \
with --scenarios budgets or by name: budget-4, budget-10 and budget-50 (300 routes at 10 ms, the \
simulator taking 4, 10 or 50 requests at once and answering 429 beyond them), the same with a \
queue of 50 (budget-4-queue, ...), and budget-unlimited; any of them at another size as \
NAME@ROUTES (budget-4@2000, or budgets@2000 for all). --routes defines a custom \
scenario instead. --latency, --namespaces, --max-inflight, --queue and --max-concurrent-syncs, \
when given, apply to every scenario that runs."
)]
pub struct BenchArgs {
    /// One JSON object per scenario and strategy per line, instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Built-in scenarios to run (comma-separated; `budgets` for every budget-* one,
    /// `budgets@2000` for all of them at 2,000 routes).
    /// Default: all but the budget ones, unless --routes is given.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub scenarios: Vec<String>,

    /// Routes of a custom scenario (runs instead of the built-in ones unless
    /// --scenarios is also given).
    #[arg(long, value_name = "N")]
    pub routes: Option<usize>,

    /// Distinct secrets of the custom scenario (default: one per route).
    #[arg(long, value_name = "N", requires = "routes")]
    pub secrets: Option<usize>,

    /// Name of the custom scenario.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "custom",
        requires = "routes"
    )]
    pub name: String,

    /// Namespaces (default: one per 40 secrets).
    #[arg(long, value_name = "N")]
    pub namespaces: Option<usize>,

    /// Simulator latency per request (custom scenario default: 1414ms).
    #[arg(long, value_name = "D", value_parser = duration_arg)]
    pub latency: Option<Duration>,

    /// Latency of access and rules reviews (`create` requests), if different.
    #[arg(long, value_name = "D", value_parser = duration_arg)]
    pub review_latency: Option<Duration>,

    /// The simulator's concurrency limit (API Priority and Fairness model).
    #[arg(long, value_name = "N")]
    pub max_inflight: Option<usize>,

    /// Requests that may wait beyond --max-inflight before the simulator answers 429.
    #[arg(long, value_name = "N")]
    pub queue: Option<usize>,

    /// The product's bound on concurrent first syncs (MonitorOptions::max_concurrent_syncs).
    #[arg(long, value_name = "N")]
    pub max_concurrent_syncs: Option<usize>,

    /// Strategies to compare (comma-separated): serial (the reference router's
    /// behaviour), concurrent (certwatch's pipeline, ready when every route is decided),
    /// daemon (the whole `certwatch run`, ready when every route is decided and written),
    /// haproxy (the daemon with a real HAProxy it runs, `haproxy` on PATH: ready on disk,
    /// ready served by handshakes, HAProxy's cold load and own rate, rotations; not in
    /// the default list; its configuration: --haproxy-config).
    #[arg(
        long = "strategy",
        value_delimiter = ',',
        default_value = "serial,concurrent,daemon"
    )]
    pub strategies: Vec<String>,

    /// Routes the serial baseline measures, oldest first (0: all). Its figure for all
    /// routes is then reported as an extrapolation, labelled as such.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub serial_routes: usize,

    /// HTTP versions of the clients.
    #[arg(long, value_enum, default_value_t = HttpProtocol::Auto)]
    pub protocol: HttpProtocol,

    /// How the concurrent strategy lists routes at start-up (the daemon always uses
    /// `list`).
    #[arg(long, value_enum, default_value_t = RouteListing::List)]
    pub route_listing: RouteListing,

    /// Let the product record each outcome in the route's status (one write per route;
    /// off by default, as neither strategy's start-up waits for it).
    #[arg(long)]
    pub status_writes: bool,

    /// Plain HTTP (h2c) to the simulator instead of TLS.
    #[arg(long)]
    pub no_tls: bool,

    /// Run each client process under this command, e.g. "perf record -g -o client.data --"
    /// or "heaptrack -o client" (split on whitespace), to profile it.
    #[arg(long, value_name = "COMMAND")]
    pub client_wrapper: Option<String>,

    /// The haproxy strategy: how long each rotation phase writes (50/s, 80 % of
    /// HAProxy's own rate, 500/s).
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub rotation_seconds: f64,

    /// The haproxy strategy: HAProxy's `nbthread` (default: certwatch's
    /// `--haproxy-threads` default, the router's 4 or one per CPU when fewer). Each `commit ssl cert` takes the write lock of the SNI tree that every
    /// handshake reads, so with several threads serving handshakes HAProxy commits
    /// fewer certificates per second.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub haproxy_threads: Option<u16>,

    /// The haproxy strategy: how HAProxy starts. managed: certwatch starts it on its
    /// complete files (it loads every certificate itself); running: the benchmark
    /// starts HAProxy first with no route certificate, then certwatch with
    /// `--haproxy-socket` pushes every certificate through the runtime API, and the
    /// report says when the first, half and every sampled route were served
    /// (handshakes) against HAProxy's own cold load of the same crt-list (no rotation
    /// phases then).
    #[arg(long, value_enum, default_value_t = protocol::HaproxyStart::Managed)]
    pub haproxy_start: protocol::HaproxyStart,
    /// The haproxy strategy: which configuration HAProxy runs on, and who starts it.
    /// `deployment` also gives every route a service with one endpoint.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = deployment::HaproxyConfig::Certificates)]
    pub haproxy_config: deployment::HaproxyConfig,

    /// Make this many of the scenario's secrets invalid before the clients start
    /// (spread over them; four kinds in turn: not PEM, a truncated PEM block, a key of
    /// another certificate, an empty key). The product's strategies must reject exactly
    /// their routes and admit every other one; a difference counts as an error.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub bad_secrets: usize,

    /// The daemon and haproxy strategies: once ready, rewrite every secret with a
    /// certificate of a new CA, the writes spread evenly over this window (a CA
    /// re-issue), and follow every route until its file holds its new certificate;
    /// reports the latencies, the routes never updated, and certwatch's memory and CPU
    /// over it. With the haproxy strategy also a sample of the routes until a handshake
    /// presents the new certificate: served latencies, HAProxy's backlog and pushes, and
    /// HAProxy's memory and CPU; `--bad-secrets` routes are then asked too (HAProxy must
    /// not present their certificate).
    #[arg(long, value_name = "WINDOW", value_parser = duration_arg)]
    pub reissue: Option<Duration>,

    /// How long one strategy may take to become ready.
    #[arg(long, value_name = "D", value_parser = duration_arg, default_value = "10m")]
    pub timeout: Duration,

    /// Run against a real kube-apiserver + etcd instead of the simulator: a fresh one
    /// per scenario, started from the shared tool (`../shared/tools/kube-apiserver`
    /// beside the workspace, or $CERTWATCH_TEST_CONTROL_PLANE). No latency is injected
    /// (the server's own applies); a scenario's --max-inflight becomes the server's
    /// --max-requests-inflight (half of it for mutations). Requests are counted from
    /// the server's audit log, for the router identity only.
    #[arg(long, conflicts_with_all = ["latency", "review_latency", "queue", "no_tls"])]
    pub control_plane: bool,

    /// With --control-plane: an extra kube-apiserver flag (repeatable), e.g.
    /// --apiserver-flag=--feature-gates=WatchList=false.
    #[arg(
        long = "apiserver-flag",
        value_name = "FLAG",
        requires = "control_plane"
    )]
    pub apiserver_flags: Vec<String>,
}

impl BenchArgs {
    fn scenarios(&self) -> Result<Vec<Scenario>, BenchError> {
        let mut scenarios = Vec::new();
        let names: Vec<&str> = if self.scenarios.is_empty() && self.routes.is_none() {
            PRESETS.to_vec()
        } else {
            self.scenarios.iter().map(String::as_str).collect()
        };
        for name in names {
            match name.trim() {
                "budgets" => {
                    for budget in BUDGET_PRESETS {
                        scenarios.push(Scenario::preset(budget)?);
                    }
                }
                name if name.starts_with("budgets@") => {
                    let size = &name["budgets".len()..];
                    for budget in BUDGET_PRESETS {
                        scenarios.push(Scenario::preset(&format!("{budget}{size}"))?);
                    }
                }
                name => scenarios.push(Scenario::preset(name)?),
            }
        }
        if let Some(routes) = self.routes {
            let secrets = self.secrets.unwrap_or(routes);
            let mut custom = Scenario::new(&self.name, secrets, Duration::from_millis(1_414));
            custom.routes = routes;
            scenarios.push(custom);
        }
        for scenario in &mut scenarios {
            if let Some(namespaces) = self.namespaces {
                scenario.namespaces = namespaces;
            }
            if let Some(latency) = self.latency {
                scenario.latency = latency;
            }
            if self.review_latency.is_some() {
                scenario.review_latency = self.review_latency;
            }
            if self.max_inflight.is_some() {
                scenario.max_inflight = self.max_inflight;
            }
            if let Some(queue) = self.queue {
                scenario.queue = queue;
            }
            if self.max_concurrent_syncs.is_some() {
                scenario.max_concurrent_syncs = self.max_concurrent_syncs;
            }
            // The deployment's routing configuration has a backend per route: each
            // gets a server, as in a cluster.
            scenario.endpoints = self.haproxy_config == deployment::HaproxyConfig::Deployment;
            if self.control_plane {
                // A real server's latency is its own.
                scenario.latency = Duration::ZERO;
                scenario.latency_injected = false;
                scenario.review_latency = None;
            }
            scenario.validate()?;
        }
        Ok(scenarios)
    }

    fn strategies(&self) -> Result<Vec<Strategy>, BenchError> {
        let mut strategies: Vec<Strategy> = Vec::new();
        for name in &self.strategies {
            let strategy: Strategy = name.parse()?;
            if !strategies.contains(&strategy) {
                strategies.push(strategy);
            }
        }
        if strategies.is_empty() {
            return Err(BenchError::Usage("no strategy to run".to_owned()));
        }
        if self.haproxy_config != deployment::HaproxyConfig::Certificates
            && !strategies.contains(&Strategy::Haproxy)
        {
            return Err(BenchError::Usage(
                "--haproxy-config is the haproxy strategy's: add --strategy haproxy".to_owned(),
            ));
        }
        if self.haproxy_config == deployment::HaproxyConfig::Deployment
            && self.haproxy_start == protocol::HaproxyStart::Running
        {
            return Err(BenchError::Usage(
                "--haproxy-start running measures the certificates-only configuration: \
                 it cannot be combined with --haproxy-config deployment (the sidecar starts \
                 HAProxy there)"
                    .to_owned(),
            ));
        }
        let product_with_files = |s: &Strategy| matches!(s, Strategy::Daemon | Strategy::Haproxy);
        if (self.bad_secrets > 0 || self.reissue.is_some())
            && !strategies.iter().all(product_with_files)
        {
            return Err(BenchError::Usage(
                "--bad-secrets and --reissue need --strategy daemon or haproxy (or both)"
                    .to_owned(),
            ));
        }
        Ok(strategies)
    }
}

/// Runs the benchmark and prints the table or the JSON lines.
pub async fn run(args: BenchArgs) -> Result<(), BenchError> {
    let scenarios = args.scenarios()?;
    let strategies = args.strategies()?;
    let exe = std::env::current_exe().map_err(|source| BenchError::Io {
        what: "finding the certwatch binary".to_owned(),
        source,
    })?;
    let run_started = Instant::now();
    let mut results = Vec::new();
    for scenario in &scenarios {
        progress(&format!(
            "{}: {} routes, {} secrets, {} namespaces, {} ms latency{}",
            scenario.name,
            scenario.routes,
            scenario.secrets,
            scenario.namespaces,
            scenario.latency_ms(),
            scenario
                .max_inflight
                .map(|m| format!(", max {m} in flight, queue {}", scenario.queue))
                .unwrap_or_default()
        ));
        let mut server = if args.control_plane {
            Server::Real(Box::new(
                RealServer::start(scenario, &args.apiserver_flags).await?,
            ))
        } else {
            Server::Sim(Box::new(
                SimProcess::start(&exe, scenario, !args.no_tls).await?,
            ))
        };
        let generating = Instant::now();
        let generated = server.generate(scenario).await?;
        progress(&format!(
            "  generated {} secrets in {} namespaces ({}; {} pid {})",
            generated.secrets,
            generated.namespaces.len(),
            human_ms(u64::try_from(generating.elapsed().as_millis()).unwrap_or(0)),
            server.kind(),
            server.pid().unwrap_or(0),
        ));
        let bad_secrets = match (&server, args.bad_secrets) {
            (_, 0) => None,
            (Server::Sim(sim), count) => {
                let bad = bad_input::corrupt(&sim.admin_client(), &generated.routes, count).await?;
                progress(&format!(
                    "  made {} secrets invalid ({} routes reference them): {:?}",
                    bad.secrets, bad.routes, bad.by_kind
                ));
                Some(bad)
            }
            (Server::Real(_), _) => {
                return Err(BenchError::Usage(
                    "--bad-secrets runs against the simulator only".to_owned(),
                ));
            }
        };
        for &strategy in &strategies {
            let result = match run_strategy(
                &exe,
                &mut server,
                scenario,
                &generated,
                bad_secrets.as_ref(),
                strategy,
                &args,
            )
            .await
            {
                Ok(result) => result,
                Err(error) => {
                    progress(&format!("  {}: FAILED: {error}", strategy.as_str()));
                    RunResult::failed(scenario, strategy, error.to_string())
                }
            };
            if let Some(ready) = result.ready_ms {
                progress(&format!(
                    "  {}: ready in {} ({} routes), {} requests, {} watches, {} connections",
                    strategy.as_str(),
                    human_ms(ready),
                    result.measured_routes,
                    result.requests_total,
                    result.open_watches,
                    result.connections,
                ));
            }
            if args.json {
                println!("{}", result.to_json_line());
            }
            results.push(result);
        }
        server.stop().await;
    }
    if !args.json {
        print!("{}", report::table(&results));
    }
    progress(&format!(
        "benchmark finished in {}",
        human_ms(u64::try_from(run_started.elapsed().as_millis()).unwrap_or(0))
    ));
    let failed = results.iter().filter(|r| r.ready_ms.is_none()).count();
    if failed > 0 {
        return Err(BenchError::RunsFailed {
            failed,
            total: results.len(),
        });
    }
    Ok(())
}

fn progress(line: &str) {
    eprintln!("bench: {line}");
}

/// The server a scenario runs against: the simulator, or a real control plane.
enum Server {
    // Both boxed: one server per scenario, and the two differ much in size.
    Sim(Box<SimProcess>),
    Real(Box<RealServer>),
}

impl Server {
    fn kind(&self) -> &'static str {
        match self {
            Self::Sim(_) => "simulator",
            Self::Real(_) => "kube-apiserver",
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Self::Sim(sim) => sim.pid(),
            Self::Real(real) => Some(real.pid()),
        }
    }

    async fn generate(&self, scenario: &Scenario) -> Result<Generated, BenchError> {
        match self {
            Self::Sim(sim) => sim.generate(scenario).await,
            Self::Real(real) => real.generate(scenario).await,
        }
    }

    fn kubeconfig(&self) -> &std::path::Path {
        match self {
            Self::Sim(sim) => sim.kubeconfig(),
            Self::Real(real) => real.kubeconfig(),
        }
    }

    fn cpu_ms(&self) -> Option<u64> {
        match self {
            Self::Sim(sim) => sim.cpu_ms(),
            Self::Real(real) => real.cpu_ms(),
        }
    }

    /// Connections the benchmark's own admin client opened (the real server's
    /// counts are the router's only, so none are).
    fn admin_connections_opened(&self) -> u64 {
        match self {
            Self::Sim(sim) => sim.admin_connections_opened(),
            Self::Real(_) => 0,
        }
    }

    async fn wait_idle(&self, timeout: Duration) -> Result<(), BenchError> {
        match self {
            Self::Sim(sim) => sim.wait_idle(timeout).await.map(drop),
            Self::Real(real) => real.wait_idle(timeout).await,
        }
    }

    async fn reset_stats(&mut self) -> Result<(), BenchError> {
        match self {
            Self::Sim(sim) => sim.reset_stats().await,
            Self::Real(real) => real.reset_stats(),
        }
    }

    async fn settle(&self, timeout: Duration) -> Result<kube_sim::SimStats, BenchError> {
        match self {
            Self::Sim(sim) => sim.settle(timeout).await,
            Self::Real(real) => real.settle(timeout).await,
        }
    }

    async fn stop(self) {
        match self {
            Self::Sim(sim) => (*sim).stop().await,
            // Dropping the control plane stops kube-apiserver and etcd.
            Self::Real(real) => drop(real),
        }
    }
}

/// One strategy in its own client process, against the scenario's server.
async fn run_strategy(
    exe: &std::path::Path,
    sim: &mut Server,
    scenario: &Scenario,
    generated: &Generated,
    bad_secrets: Option<&bad_input::BadSecrets>,
    strategy: Strategy,
    args: &BenchArgs,
) -> Result<RunResult, BenchError> {
    sim.wait_idle(Duration::from_secs(60)).await?;
    sim.reset_stats().await?;
    let admin_before = sim.admin_connections_opened();
    let sim_cpu_before = sim.cpu_ms();
    let spec = ClientSpec {
        strategy,
        kubeconfig: sim.kubeconfig().to_path_buf(),
        serial_routes: args.serial_routes,
        max_concurrent_syncs: scenario.max_concurrent_syncs,
        protocol: args.protocol,
        route_listing: args.route_listing,
        status_writes: args.status_writes,
        timeout_ms: u64::try_from(args.timeout.as_millis()).unwrap_or(u64::MAX),
        haproxy_threads: args.haproxy_threads.or_else(|| {
            let cpus = std::thread::available_parallelism().ok();
            u16::try_from(certwatch::args::default_haproxy_threads(cpus)).ok()
        }),
        haproxy_start: args.haproxy_start,
        haproxy_config: args.haproxy_config,
        expected_rejected: bad_secrets.map_or(0, |bad| bad.routes),
    };
    let wrapper: Vec<String> = args
        .client_wrapper
        .as_deref()
        .map(|w| w.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    let mut client = ClientProcess::spawn(exe, &spec, &wrapper)?;
    let answer_timeout = args.timeout + Duration::from_secs(60);
    let ready = match client.next_message(answer_timeout).await? {
        ClientMessage::Ready(ready) => ready,
        ClientMessage::Failed { message } => {
            client.finish().await;
            return Err(BenchError::Strategy {
                strategy: strategy.as_str(),
                message,
            });
        }
        ClientMessage::Measured(_) => {
            client.finish().await;
            return Err(BenchError::Client {
                message: "measured before it was ready".to_owned(),
            });
        }
    };
    // The last watches of the serial model open after its last route; a concurrent
    // client's route watch may still be on its way.
    let settle_timeout = scenario.latency * 2 + Duration::from_secs(10);
    let stats = sim.settle(settle_timeout).await?;
    let admin_connections = sim.admin_connections_opened() - admin_before;
    let sim_cpu_ms = sim
        .cpu_ms()
        .zip(sim_cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    client.request_measurement().await?;
    let measured = client.next_message(Duration::from_secs(30)).await;
    // Before the rotation phases, which rewrite secrets (bad ones among them).
    let bad_served = match (&ready.haproxy, bad_secrets) {
        (Some(startup), Some(bad)) => {
            let served = bad_input::check_served(startup.tls_port, &startup.cert_dir, bad).await;
            progress(&format!(
                "  haproxy: bad routes: {} asked, {} presenting their certificate; good routes beside them: {} of {} served",
                served.bad_routes_asked,
                served.bad_routes_presenting_their_certificate,
                served.good_routes_served,
                served.good_routes_asked,
            ));
            Some(served)
        }
        _ => None,
    };
    let haproxy = match (&ready.haproxy, &*sim) {
        (Some(startup), Server::Sim(sim_process)) => {
            match haproxy::measure(
                &sim_process.admin_client(),
                &generated.routes,
                startup,
                client.pid(),
                args.rotation_seconds,
            )
            .await
            {
                Ok(figures) => Some(figures),
                Err(error) => {
                    client.finish().await;
                    return Err(error);
                }
            }
        }
        (Some(_), Server::Real(_)) => {
            client.finish().await;
            return Err(BenchError::Usage(
                "the haproxy strategy runs against the simulator only".to_owned(),
            ));
        }
        (None, _) => None,
    };
    let reissue = match (args.reissue, &ready.cert_dir, &*sim) {
        (Some(window), Some(cert_dir), Server::Sim(sim_process)) => {
            progress(&format!(
                "  {}: re-issuing every secret over {}",
                strategy.as_str(),
                human_ms(u64::try_from(window.as_millis()).unwrap_or(u64::MAX))
            ));
            match bad_input::reissue(
                &sim_process.admin_client(),
                &generated.routes,
                cert_dir,
                window,
                client.pid(),
                ready
                    .haproxy
                    .as_ref()
                    .map(|startup| bad_input::ServedTarget {
                        tls_port: startup.tls_port,
                        metrics_addr: startup.metrics_addr,
                        haproxy_pid: startup.served_haproxy.master_pid.or(startup.worker),
                        own_rate_per_s: haproxy.as_ref().map_or(0.0, |h| h.own_rate_per_s),
                        cold_load_ms: startup.cold_load_ms,
                    }),
            )
            .await
            {
                Ok(figures) => Some(figures),
                Err(error) => {
                    client.finish().await;
                    return Err(error);
                }
            }
        }
        (Some(_), _, _) => {
            client.finish().await;
            return Err(BenchError::Usage(format!(
                "--reissue needs the daemon or haproxy strategy against the simulator, not {}",
                strategy.as_str()
            )));
        }
        (None, _, _) => None,
    };
    let measurement = match measured? {
        ClientMessage::Measured(measurement) => measurement,
        other => {
            client.finish().await;
            return Err(BenchError::Client {
                message: format!("expected its measurement, got {other:?}"),
            });
        }
    };
    client.finish().await;
    let mut result = RunResult::new(RunInputs {
        scenario,
        strategy,
        ready: &ready,
        measurement: &measurement,
        sim: &stats,
        admin_connections,
        sim_cpu_ms,
        streaming_route_list: strategy == Strategy::Concurrent
            && args.route_listing == RouteListing::Streaming,
    });
    result.bad_secrets = bad_secrets.cloned();
    let mut checks = Vec::new();
    if let (Some(bad), Some(served)) = (result.bad_secrets.as_mut(), bad_served) {
        checks.push((
            "bad_routes_presenting_their_certificate",
            scenario::Check::new(served.bad_routes_presenting_their_certificate as f64, 0.0),
        ));
        checks.push((
            "good_routes_beside_bad_not_served",
            scenario::Check::new(
                served
                    .good_routes_asked
                    .saturating_sub(served.good_routes_served) as f64,
                0.0,
            ),
        ));
        bad.served = Some(served);
    }
    if let Some(figures) = reissue {
        checks.push((
            "reissue_never_on_disk",
            scenario::Check::new(figures.never_on_disk as f64, 0.0),
        ));
        if let Some(served) = &figures.served {
            progress(&format!(
                "  haproxy: re-issue served p50 {} p99 {} max {} ({} probes, {} never served), backlog peak {} drained at {}, {} pushes for {} changes, {} reloads",
                human_ms(served.to_served.p50_ms),
                human_ms(served.to_served.p99_ms),
                human_ms(served.to_served.max_ms),
                served.probes,
                served.never_served,
                served.peak_unserved_routes,
                served
                    .drained_ms
                    .map_or_else(|| "never".to_owned(), human_ms),
                served.pushed_certificates,
                served.changes,
                served.reloads,
            ));
            checks.push((
                "reissue_never_served",
                scenario::Check::new(served.never_served as f64, 0.0),
            ));
            checks.push((
                "reissue_pushes_per_change",
                scenario::Check::new(
                    served.pushed_certificates as f64 / served.changes.max(1) as f64,
                    1.0,
                ),
            ));
        }
        result.reissue = Some(figures);
    }
    for (name, check) in checks {
        result.targets_met = Some(result.targets_met.unwrap_or(true) && check.met);
        if let Some(targets) = result.targets.as_mut() {
            targets.insert(name, check);
        }
    }
    if let Some(figures) = haproxy {
        let met = figures.bounds.values().all(|check| check.met);
        result.targets_met = Some(result.targets_met.unwrap_or(true) && met);
        result.haproxy = Some(figures);
    }
    Ok(result)
}

/// Arguments of the hidden `certwatch-lab bench-client` (one strategy run, started by
/// `certwatch-lab bench`).
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// The run, as JSON (written by `certwatch-lab bench`).
    #[arg(long)]
    pub spec: String,
}

/// The client child: runs one strategy, reports ready, answers `measure`, and exits
/// when its input closes.
pub async fn run_client(args: ClientArgs) -> Result<(), BenchError> {
    let spec: ClientSpec = serde_json::from_str(&args.spec)
        .map_err(|e| BenchError::Usage(format!("bench-client: invalid --spec: {e}")))?;
    let errors = ErrorLog::default();
    let (report, state) = match start_strategy(&spec, errors.clone()).await {
        Ok(started) => started,
        Err(error) => {
            emit(&ClientMessage::Failed {
                message: error.to_string(),
            });
            return Err(error);
        }
    };
    emit(&ClientMessage::Ready(report));
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = input.next_line().await {
        if line.trim() == MEASURE {
            emit(&ClientMessage::Measured(Measurement::take(
                &state.pool_stats(),
                &errors,
            )));
        }
    }
    drop(state);
    Ok(())
}

/// A started strategy: it keeps its watches open until the client exits (dropped
/// then), and knows its connection pool.
enum RunState {
    Serial {
        _run: serial::SerialRun,
        pool: kube_h2::PoolHandle,
    },
    Concurrent {
        _run: concurrent::ConcurrentRun,
        pool: kube_h2::PoolHandle,
    },
    Daemon(Box<daemon::DaemonRun>),
    Haproxy(Box<haproxy::HaproxyRun>),
    Deployment(Box<deployment::DeploymentRun>),
}

impl RunState {
    fn pool_stats(&self) -> kube_h2::PoolStats {
        match self {
            Self::Serial { pool, .. } | Self::Concurrent { pool, .. } => pool.stats(),
            Self::Daemon(run) => run.pool_stats(),
            Self::Haproxy(run) => run.pool_stats(),
            Self::Deployment(run) => run.pool_stats(),
        }
    }
}

async fn start_strategy(
    spec: &ClientSpec,
    errors: ErrorLog,
) -> Result<(protocol::ReadyReport, RunState), BenchError> {
    let config = sim_process::client_config(&spec.kubeconfig, kube_sim::ROUTER_CONTEXT).await?;
    let timeout = Duration::from_millis(spec.timeout_ms);
    let strategy = spec.strategy;
    let run = async {
        if strategy == Strategy::Daemon {
            // The daemon builds its own client from the configuration.
            let started = Instant::now();
            return daemon::run(config, spec, started, errors)
                .await
                .map(|(report, run)| (report, RunState::Daemon(Box::new(run))));
        }
        if strategy == Strategy::Haproxy
            && spec.haproxy_config == deployment::HaproxyConfig::Deployment
        {
            let started = Instant::now();
            return deployment::run(config, spec, started, errors)
                .await
                .map(|(report, run)| (report, RunState::Deployment(Box::new(run))));
        }
        if strategy == Strategy::Haproxy {
            let started = Instant::now();
            return haproxy::run(config, spec, started, errors)
                .await
                .map(|(report, run)| (report, RunState::Haproxy(Box::new(run))));
        }
        let options = kube_h2::ClientOptions::default().protocol(spec.protocol.into());
        let pooled = kube_h2::build_client(config, options).map_err(|e| BenchError::Client {
            message: format!("cannot build the kube client: {e}"),
        })?;
        let (client, pool) = pooled.into_parts();
        let started = Instant::now();
        match strategy {
            Strategy::Serial => serial::run(client, spec, started, errors)
                .await
                .map(|(report, run)| (report, RunState::Serial { _run: run, pool })),
            Strategy::Concurrent | Strategy::Daemon | Strategy::Haproxy => {
                concurrent::run(client, spec, started, errors)
                    .await
                    .map(|(report, run)| (report, RunState::Concurrent { _run: run, pool }))
            }
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| BenchError::Strategy {
            strategy: strategy.as_str(),
            message: format!("not ready within {timeout:?}"),
        })?
}

fn emit(message: &ClientMessage) {
    match serde_json::to_string(message) {
        Ok(line) => println!("{line}"),
        Err(error) => eprintln!("bench-client: cannot encode a message: {error}"),
    }
}
