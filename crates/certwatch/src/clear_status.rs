//! `certwatch clear-status`: removes one router name's entries from every route's
//! `status.ingress[]`, as an uninstall (or a renamed router) needs. A running router
//! removes its entry from a route that leaves its selection; this command is for the
//! entries left when no router of that name runs any more. Other routers' entries stay
//! as they are.

use std::path::PathBuf;

use clap::Args;
use route_secrets::api::status_writer::{ClearError, ClearReport, clear_router_entries};
use tracing::info;

use crate::connect::{self, ConnectError};

/// Arguments of `certwatch clear-status`.
#[derive(Debug, Clone, Args)]
#[command(
    about = "Remove one router name's entries from every route's status (after an uninstall)",
    long_about = "Remove every status.ingress[] entry whose routerName is --router-name from \
every route the credentials can list, leaving other routers' entries untouched. Run it after \
the last replica of that router name is gone (the uninstall in docs/deploy.md): a running \
router would write its entries again.\n\n\
Needs list on routes (all namespaces) and update on routes/status."
)]
pub struct ClearStatusArgs {
    /// The router name whose entries are removed (the `--router-name` the router ran
    /// with). No default: which router's entries go is always said.
    #[arg(long, env = "CERTWATCH_ROUTER_NAME", value_name = "NAME")]
    pub router_name: String,

    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then the in-cluster
    /// service account).
    #[arg(long, env = "CERTWATCH_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context (default: the current context).
    #[arg(long, env = "CERTWATCH_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,
}

/// Why `certwatch clear-status` failed.
#[derive(Debug, thiserror::Error)]
pub enum ClearStatusError {
    /// No client configuration.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The client could not be built.
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[from] kube_h2::Error),
    /// Listing or writing failed.
    #[error(transparent)]
    Clear(#[from] ClearError),
}

/// Removes `args.router_name`'s entries from every route; returns what was done.
pub async fn clear_status(args: &ClearStatusArgs) -> Result<ClearReport, ClearStatusError> {
    let config = connect::kube_config(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let client = kube_h2::build_client(config, kube_h2::ClientOptions::default())?.client();
    let report = clear_router_entries(&client, &args.router_name).await?;
    info!(
        router_name = %args.router_name,
        routes = report.routes,
        cleared = report.cleared,
        gone = report.gone,
        "cleared the router name's status entries"
    );
    Ok(report)
}
