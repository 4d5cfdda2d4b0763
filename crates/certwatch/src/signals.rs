//! Signals: SIGTERM and SIGINT stop the daemon (after the shutdown delay; a second one
//! at once); SIGHUP re-synchronises its outputs.
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

/// SIGTERM and SIGINT, each one received from the moment this is made (the first
/// starts the shutdown delay, a second one stops at once).
pub struct Stops {
    term: Option<Signal>,
    int: Signal,
}

impl Stops {
    /// Installs the handlers; without a SIGTERM handler only SIGINT is heard.
    pub fn new() -> std::io::Result<Self> {
        let int = signal(SignalKind::interrupt())?;
        let term = match signal(SignalKind::terminate()) {
            Ok(term) => Some(term),
            Err(error) => {
                warn!(%error, "cannot listen for SIGTERM; only SIGINT stops certwatch");
                None
            }
        };
        Ok(Self { term, int })
    }

    /// Returns at the next SIGTERM or SIGINT, with the signal's name.
    pub async fn next(&mut self) -> &'static str {
        match &mut self.term {
            Some(term) => tokio::select! {
                _ = self.int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            },
            None => {
                let _ = self.int.recv().await;
                "SIGINT"
            }
        }
    }
}
