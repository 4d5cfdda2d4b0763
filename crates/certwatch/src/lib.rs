//! certwatch: the daemon that serves the certificates of OpenShift routes whose TLS
//! material lives in Kubernetes secrets (`spec.tls.externalCertificate`) to an ingress
//! proxy, with one shared watch per secret.
//!
//! This crate is the production build: the `certwatch` binary and [`Daemon`], the same
//! daemon as a library. The simulator, the demo and the benchmarks are the lab's
//! (`tools/lab`, the `certwatch-lab` binary); the `certwatch` binary refuses them with a
//! message that names the `certwatch-lab` command to run instead.
//!
//! - [`cli`]: `certwatch run` as a process (signals, the address line); [`args`]: its
//!   command line.
//! - [`daemon`]: [`Daemon`], the wiring of the route pipeline to the outputs, on one
//!   kube client over a pool of HTTP/2 connections ([`connect`]: the configuration).
//! - [`outputs`]: from route outcomes to the proxies, and readiness.
//! - [`proxy`]: the seam between the outputs and a proxy, and HAProxy behind it.
//! - [`cert_dir`] and [`files`]: bundles, links and the crt-list on disk.
//! - [`reload`]: the debounced, single-flight reload command.
//! - [`haproxy`]: HAProxy's runtime API client and the synchronisation over it, the
//!   HAProxy process certwatch runs and its master CLI.
//! - [`routing`]: HAProxy's whole configuration for the served routes (frontends,
//!   maps, a backend per route with its servers from the services' EndpointSlices).
//! - [`metrics`] and [`process`]: the Prometheus metrics; `http`: `/healthz`,
//!   `/readyz` (and `/metrics` without an authorized endpoint); [`secure_metrics`]:
//!   `/metrics` over HTTPS for scrapers the API server authorizes.
//! - [`progress`]: the start-up progress bar or log lines; [`logging`]: text or JSON
//!   logs that stay clear of it.
//! - [`tls_policy`]: the cluster's TLS policy for every listener; [`signals`]:
//!   SIGTERM, SIGINT and SIGHUP; [`file_loads`]: HAProxy's loads in progress, which keep
//!   the files they may read in place; [`clear_status`]: `certwatch clear-status`.
//!
//! # Example
//!
//! The daemon against the cluster of the current kubeconfig context, until it is
//! ready:
//!
//! ```no_run
//! use certwatch::{Daemon, DaemonOptions};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = kube::Config::infer().await?;
//! let daemon = Daemon::start(config, DaemonOptions::new("/run/certwatch")).await?;
//! let status = daemon.wait_ready().await?;
//! println!("{} routes served, {} rejected", status.admitted, status.rejected);
//! daemon.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod args;
pub mod cert_dir;
pub mod clear_status;
pub mod cli;
pub mod connect;
pub mod daemon;
pub mod file_loads;
pub mod files;
pub mod haproxy;
mod http;
mod listener;
pub mod logging;
pub mod metrics;
pub mod outputs;
pub mod process;
pub mod progress;
pub mod proxy;
pub mod reload;
pub mod routing;
pub mod secure_metrics;
pub mod signals;
mod throttle;
pub mod tls_policy;

pub use args::RunArgs;
pub use cli::RunError;
pub use daemon::{Daemon, DaemonError, DaemonOptions};
pub use outputs::DaemonStatus;
