//! certwatch's workshop: everything that runs the daemon against a simulated cluster,
//! kept out of the production build (the `certwatch` binary links neither the simulator
//! nor the test control planes).
//!
//! - [`demo`]: `certwatch-lab demo`, the seed's scale against the embedded simulator.
//! - [`embedded`]: `certwatch-lab run --embedded`, the daemon against a simulated
//!   cluster started in-process.
//! - [`bench`]: `certwatch-lab bench`, start-up scenarios (the reference behaviour,
//!   certwatch's pipeline, the whole daemon) against the simulator or a real control
//!   plane.
//! - [`traffic`]: the demo's backend and its HTTPS request through HAProxy.
//! - `certwatch-lab sim`: the simulator on its own ([`kube_sim::cli`]).
//!
//! The production `certwatch` binary has none of these commands: `certwatch demo`, `sim`,
//! `bench` and `run --embedded` fail there with a message naming the command here.
//!
//! # Example
//!
//! The daemon against a simulated cluster, in-process:
//!
//! ```no_run
//! use certwatch::{Daemon, DaemonOptions};
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
pub mod embedded;
pub mod traffic;
