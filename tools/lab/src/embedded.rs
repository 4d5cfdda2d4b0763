//! `certwatch-lab run --embedded`: `certwatch run` against a simulated cluster
//! (kube-sim) started in this process, connected as the router identity with real RBAC.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kube_sim::{GenerateSpec, LatencyConfig, SimConfig, Simulator};
use tracing::info;

fn duration_arg(text: &str) -> Result<Duration, String> {
    kube_common::duration::parse(text).map_err(|error| error.to_string())
}

fn generate_arg(text: &str) -> Result<GenerateSpec, String> {
    text.parse::<GenerateSpec>()
        .map_err(|error| error.to_string())
}

/// Arguments of `certwatch-lab run`: the daemon's own, and the simulated cluster's.
#[derive(Debug, Clone, Args)]
#[command(
    about = "Run the daemon (certwatch run), against a simulated cluster with --embedded",
    long_about = "Run the daemon exactly as `certwatch run` does. With --embedded, against a \
simulated Kubernetes API server (kube-sim) started in this process with a generated cluster, as \
the router identity with real RBAC; without it, against the cluster of the Kubernetes \
configuration, as the production binary would."
)]
pub struct LabRunArgs {
    /// The simulated cluster.
    #[command(flatten)]
    pub embedded: EmbeddedArgs,

    /// The daemon's options (`certwatch run --help`).
    #[command(flatten)]
    pub run: certwatch::RunArgs,
}

/// The simulated cluster of an embedded run.
#[derive(Debug, Clone, Args)]
pub struct EmbeddedArgs {
    /// Start a simulated Kubernetes API server (kube-sim) in-process with a generated
    /// cluster, and connect to it as the router identity (with real RBAC).
    #[arg(long, env = "CERTWATCH_EMBEDDED", value_parser = clap::builder::BoolishValueParser::new(), help_heading = "Simulated cluster")]
    pub embedded: bool,

    /// With --embedded: what to generate: routes=N,namespaces=K[,secrets=S]
    /// [,host=PATTERN][,validity=90d][,shards=2][,endpoints=true] (endpoints: each
    /// route's Service with one ready endpoint).
    #[arg(
        long,
        env = "CERTWATCH_EMBEDDED_GENERATE",
        value_name = "SPEC",
        value_parser = generate_arg,
        default_value = "routes=2000,namespaces=20",
        help_heading = "Simulated cluster"
    )]
    pub embedded_generate: GenerateSpec,

    /// With --embedded: the simulated API server's latency per request.
    #[arg(long, env = "CERTWATCH_EMBEDDED_LATENCY", value_name = "D", value_parser = duration_arg, default_value = "0s", help_heading = "Simulated cluster")]
    pub embedded_latency: Duration,

    /// With --embedded: write an admin/router kubeconfig for the simulated cluster
    /// here (to look at it with kubectl).
    #[arg(
        long,
        env = "CERTWATCH_EMBEDDED_KUBECONFIG",
        value_name = "PATH",
        help_heading = "Simulated cluster"
    )]
    pub embedded_kubeconfig: Option<PathBuf>,
}

/// Why an embedded run failed.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// The embedded simulator failed.
    #[error("embedded simulator: {0}")]
    Simulator(#[from] kube_sim::SimError),
    /// The daemon failed.
    #[error(transparent)]
    Run(#[from] certwatch::RunError),
}

/// Runs the daemon until SIGTERM or SIGINT, against the simulator with `--embedded`,
/// otherwise against the configured cluster.
pub async fn run(args: LabRunArgs) -> Result<(), EmbeddedError> {
    let LabRunArgs { embedded, run } = args;
    if !embedded.embedded {
        return Ok(certwatch::cli::run(run).await?);
    }
    let simulator = Simulator::start(SimConfig {
        latency: LatencyConfig::fixed(embedded.embedded_latency),
        ..SimConfig::default()
    })
    .await?;
    let cluster = simulator.generate(&embedded.embedded_generate)?;
    if let Some(path) = &embedded.embedded_kubeconfig {
        simulator.write_kubeconfig(path)?;
    }
    info!(
        url = %simulator.url(),
        routes = cluster.routes.len(),
        secrets = cluster.secrets,
        namespaces = cluster.namespaces.len(),
        "embedded simulator started"
    );
    let config = simulator.client_config("router").await?;
    let result = certwatch::cli::run_with_config(run, config).await;
    simulator.shutdown().await;
    Ok(result?)
}
