//! `certwatch run`: the daemon that serves route certificates to a proxy.
//!
//! - [`args`]: the command line ([`RunArgs`]).
//! - [`daemon`]: [`Daemon`], the wiring, usable as a library (the demo and the
//!   benchmark run it in-process).
//! - [`scope`]: namespace list, namespace selector and route selector;
//!   [`selector`]: their syntax, checked at start-up.
//! - [`cert_dir`] and [`files`]: bundles, links and the crt-list on disk.
//! - [`reload`]: the debounced, single-flight reload command.
//! - [`haproxy`]: HAProxy's runtime API client and the synchronisation over it.
//! - [`metrics`] and [`process`]: the Prometheus metrics; `http`: `/healthz`,
//!   `/readyz`, `/metrics`.
//! - [`progress`]: the start-up progress bar or log lines.

pub mod args;
pub mod cert_dir;
pub mod connect;
pub mod daemon;
pub mod files;
pub mod haproxy;
mod http;
pub mod metrics;
pub mod outputs;
pub mod process;
pub mod progress;
pub mod reload;
pub mod scope;
pub mod selector;
pub mod signals;
mod throttle;

use std::io::Write as _;

use kube_sim::{SimConfig, Simulator};

use crate::logging::LogFormat;
use tracing::info;

pub use args::RunArgs;
pub use daemon::{Daemon, DaemonError, DaemonOptions};
pub use outputs::DaemonStatus;

/// Why `certwatch run` failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Options that do not fit together.
    #[error(transparent)]
    Args(#[from] args::ArgsError),
    /// No usable Kubernetes configuration.
    #[error(transparent)]
    Connect(#[from] connect::ConnectError),
    /// The embedded simulator failed.
    #[error("embedded simulator: {0}")]
    Simulator(#[from] kube_sim::SimError),
    /// The daemon could not start.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// The signal handlers could not be installed.
    #[error("cannot install the signal handlers: {0}")]
    Signals(std::io::Error),
}

/// Runs the daemon until SIGTERM or SIGINT, then stops it cleanly; SIGHUP
/// re-synchronises the outputs (see [`signals`]).
pub async fn main(args: RunArgs) -> Result<(), RunError> {
    let mut hangups = signals::hangups().map_err(RunError::Signals)?;
    let options = args.daemon_options()?;
    let (config, simulator) = if args.embedded {
        let simulator = Simulator::start(SimConfig {
            latency: kube_sim::LatencyConfig::fixed(args.embedded_latency),
            ..SimConfig::default()
        })
        .await?;
        let cluster = simulator.generate(&args.embedded_generate)?;
        if let Some(path) = &args.embedded_kubeconfig {
            simulator.write_kubeconfig(path)?;
        }
        info!(
            url = %simulator.url(),
            routes = cluster.routes.len(),
            secrets = cluster.secrets,
            namespaces = cluster.namespaces.len(),
            "embedded simulator started"
        );
        (simulator.client_config("router").await?, Some(simulator))
    } else {
        let config =
            connect::kube_config(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
        (config, None)
    };

    let daemon = Daemon::start(config, options).await?;
    if let Some(addr) = daemon.http_addr() {
        match args.log_format {
            // On stdout, for people and scripts (tests read the port from it).
            LogFormat::Text => {
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(
                    stdout,
                    "certwatch: serving /healthz, /readyz and /metrics on http://{addr}"
                );
                let _ = stdout.flush();
            }
            // A log collector reads JSON only: the address is a field of a log event.
            LogFormat::Json => info!(address = %addr, "serving /healthz, /readyz and /metrics"),
        }
    }
    let terminate = signals::terminate();
    tokio::pin!(terminate);
    loop {
        tokio::select! {
            () = &mut terminate => break,
            _ = hangups.recv() => {
                info!("SIGHUP: re-reading HAProxy's state and running the reload command (configuration is not re-read)");
                daemon.resync();
            }
        }
    }
    info!("stopping: closing watches and finishing writes");
    daemon.shutdown().await;
    if let Some(simulator) = simulator {
        simulator.shutdown().await;
    }
    info!("stopped");
    Ok(())
}
