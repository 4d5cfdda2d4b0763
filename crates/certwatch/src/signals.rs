//! Signals: SIGTERM and SIGINT stop the daemon; SIGHUP re-synchronises its outputs.
//!
//! SIGHUP's default action ends a process (status 129), and daemons are sent it by
//! tools that mean "reload". certwatch reads no configuration file, so it takes SIGHUP
//! as "bring the proxy up to date again": HAProxy's state is read afresh and brought
//! to the crt-list, and the reload command runs once. The handler is installed before
//! anything else starts, so a SIGHUP during start-up never ends the process either.

use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::warn;

/// SIGHUPs, from now on (installing this replaces the default action, which would end
/// the process).
pub fn hangups() -> std::io::Result<Signal> {
    signal(SignalKind::hangup())
}

/// Returns when the process receives SIGTERM or SIGINT (Ctrl-C).
pub async fn terminate() {
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(error) => {
            warn!(%error, "cannot listen for SIGTERM; only SIGINT stops certwatch");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
