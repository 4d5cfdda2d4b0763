//! `certwatch run` as a process: connect, start the [`Daemon`], serve until SIGTERM or
//! SIGINT, re-synchronise on SIGHUP (see [`signals`](crate::signals)).

use std::io::Write as _;

use tracing::info;

use crate::args::{self, RunArgs};
use crate::connect;
use crate::daemon::{Daemon, DaemonError, DaemonOptions};
use crate::logging::LogFormat;
use crate::signals;

/// Why `certwatch run` failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Options that do not fit together.
    #[error(transparent)]
    Args(#[from] args::ArgsError),
    /// No usable Kubernetes configuration.
    #[error(transparent)]
    Connect(#[from] connect::ConnectError),
    /// The daemon could not start.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// The signal handlers could not be installed.
    #[error("cannot install the signal handlers: {0}")]
    Signals(std::io::Error),
}

/// Runs the daemon against the cluster the arguments' Kubernetes configuration names
/// (`--kubeconfig`/`--context`, `$KUBECONFIG`, `~/.kube/config`, or the in-cluster
/// service account) until SIGTERM or SIGINT.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    // Options that do not fit together are refused before anything is connected.
    let options = args.daemon_options()?;
    let config = connect::kube_config(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    serve(&args, options, config).await
}

/// Runs the daemon against the cluster `config` reaches (the lab's embedded simulator,
/// for example) until SIGTERM or SIGINT; the arguments' Kubernetes configuration
/// options are not read.
pub async fn run_with_config(args: RunArgs, config: kube::Config) -> Result<(), RunError> {
    let options = args.daemon_options()?;
    serve(&args, options, config).await
}

async fn serve(
    args: &RunArgs,
    options: DaemonOptions,
    config: kube::Config,
) -> Result<(), RunError> {
    // The effective configuration, once: every flag after defaults and CERTWATCH_*
    // variables (paths and names only: no flag carries a secret).
    info!(configuration = ?args, "configuration");
    let mut hangups = signals::hangups().map_err(RunError::Signals)?;
    let daemon = Daemon::start(config, options).await?;
    if let Some(addr) = daemon.http_addr() {
        let secure = daemon.secure_metrics_addr();
        let probes = if secure.is_some() {
            "/healthz and /readyz"
        } else {
            "/healthz, /readyz and /metrics"
        };
        match args.log_format {
            // On stdout, for people and scripts (tests read the ports from it).
            LogFormat::Text => {
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "certwatch: serving {probes} on http://{addr}");
                if let Some(secure) = secure {
                    let _ = writeln!(
                        stdout,
                        "certwatch: serving /metrics on https://{secure} to authorized scrapers (TokenReview, SubjectAccessReview)"
                    );
                }
                let _ = stdout.flush();
            }
            // A log collector reads JSON only: the addresses are fields of a log event.
            LogFormat::Json => match secure {
                Some(secure) => info!(
                    address = %addr,
                    metrics_address = %secure,
                    "serving {probes}, and /metrics over HTTPS to authorized scrapers"
                ),
                None => info!(address = %addr, "serving {probes}"),
            },
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
    info!("stopped");
    Ok(())
}
