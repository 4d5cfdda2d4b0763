//! certwatch: serves the certificates of OpenShift routes whose TLS material lives in
//! Kubernetes secrets (`spec.tls.externalCertificate`) to an ingress proxy.
//!
//! - [`run`]: the daemon (`certwatch run`): one shared watch per secret, every route's
//!   bundle in a cert directory with a crt-list, a debounced reload command, HAProxy's
//!   runtime API, `/healthz`, `/readyz`, `/metrics`. [`run::Daemon`] is the same daemon
//!   as a library.
//! - [`demo`]: `certwatch demo`, the seed's scale against the embedded simulator.
//! - [`logging`]: text or JSON logs that stay clear of the progress bar.
//!
//! # Example
//!
//! The daemon against a simulated cluster, in-process:
//!
//! ```no_run
//! use certwatch::run::{Daemon, DaemonOptions};
//! use kube_sim::{GenerateSpec, SimConfig, Simulator};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let simulator = Simulator::start(SimConfig::default()).await?;
//! simulator.generate(&GenerateSpec::new(100, 5))?;
//!
//! let cert_dir = tempfile::tempdir()?;
//! let daemon = Daemon::start(
//!     simulator.client_config("router").await?,
//!     DaemonOptions::new(cert_dir.path()),
//! )
//! .await?;
//! let status = daemon.wait_ready().await?;
//! assert_eq!(status.admitted, 100);
//! assert!(cert_dir.path().join("app-0:route-0.pem").exists());
//! daemon.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod bench;
pub mod demo;
pub mod logging;
pub mod run;
