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
    /// HAProxy refuses the TLS policy, or it could not be checked.
    #[error(transparent)]
    TlsPolicy(#[from] crate::tls_policy::TlsPolicyError),
}

/// Runs the daemon against the cluster the arguments' Kubernetes configuration names
/// (`--kubeconfig`/`--context`, `$KUBECONFIG`, `~/.kube/config`, or the in-cluster
/// service account) until SIGTERM or SIGINT.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    // Options that do not fit together are refused before anything is connected.
    let options = args.daemon_options()?;
    check_tls_policy(&args, &options)?;
    let config = connect::kube_config(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    serve(&args, options, config).await
}

/// Runs the daemon against the cluster `config` reaches (the lab's embedded simulator,
/// for example) until SIGTERM or SIGINT; the arguments' Kubernetes configuration
/// options are not read.
pub async fn run_with_config(args: RunArgs, config: kube::Config) -> Result<(), RunError> {
    let options = args.daemon_options()?;
    check_tls_policy(&args, &options)?;
    serve(&args, options, config).await
}

/// Refuses a TLS policy the HAProxy certwatch writes a configuration for would refuse
/// (`haproxy -c`), before anything starts; skipped when that HAProxy's binary is not
/// here (a sidecar's: it refuses the configuration itself, and says why in its log).
fn check_tls_policy(args: &RunArgs, options: &DaemonOptions) -> Result<(), RunError> {
    let Some(routing) = &options.routing else {
        return Ok(());
    };
    if !routing
        .render
        .tls
        .check_with_haproxy(&args.haproxy_binary)?
    {
        info!(
            binary = %args.haproxy_binary.display(),
            "HAProxy is not installed here: the TLS policy is checked by the HAProxy that loads the configuration"
        );
    }
    Ok(())
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
    let mut stops = signals::Stops::new().map_err(RunError::Signals)?;
    let unauthenticated_metrics = options.unauthenticated_metrics;
    let daemon = Daemon::start(config, options).await?;
    if let Some(addr) = daemon.http_addr() {
        let secure = daemon.secure_metrics_addr();
        let probes = if secure.is_none() && unauthenticated_metrics {
            tracing::warn!(
                address = %addr,
                "serving /metrics WITHOUT authentication (--metrics-unauthenticated): anyone who reaches this address reads every route's and secret's name"
            );
            "/healthz, /readyz and /metrics"
        } else {
            "/healthz and /readyz"
        };
        match args.log_format {
            // On stdout, for people and scripts (tests read the ports from it).
            LogFormat::Text => {
                let mut stdout = std::io::stdout().lock();
                let _ = write!(stdout, "certwatch: serving {probes} on http://{addr}");
                if secure.is_none() && !unauthenticated_metrics {
                    let _ = write!(stdout, " (no /metrics: see --metrics-listen)");
                }
                let _ = writeln!(stdout);
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
    let signal = loop {
        tokio::select! {
            signal = stops.next() => break signal,
            _ = hangups.recv() => {
                info!("SIGHUP: re-reading HAProxy's state and running the reload command (configuration is not re-read)");
                daemon.resync();
            }
        }
    };
    let delay = args.shutdown_delay;
    let drain = daemon.haproxy_drain();
    if !delay.is_zero() {
        // Load balancers and endpoints take the replica out on /readyz while it still
        // serves: no connection is refused before they stop sending new ones.
        daemon.drain();
        info!(
            signal,
            ?delay,
            "stopping after the shutdown delay: /readyz answers 503, HAProxy keeps serving (a second SIGTERM or SIGINT stops at once)"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            second = stops.next() => {
                info!(signal = second, "second signal: stopping at once");
                drain.cut();
            }
        }
    }
    // The HAProxy certwatch runs, if any, stops softly: its connections finish for at
    // most the drain's bound, or until a second signal.
    info!(
        haproxy_drain = ?drain.bound,
        "stopping: closing watches and finishing writes"
    );
    let shutdown = daemon.shutdown();
    tokio::pin!(shutdown);
    tokio::select! {
        () = &mut shutdown => {}
        second = stops.next(), if !drain.is_cut() => {
            info!(signal = second, "second signal: stopping at once");
            drain.cut();
            shutdown.await;
        }
    }
    info!("stopped");
    Ok(())
}
