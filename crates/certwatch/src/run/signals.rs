//! Waiting for SIGTERM or SIGINT.

use tracing::warn;

/// Returns when the process receives SIGTERM or SIGINT (Ctrl-C).
pub async fn terminate() {
    use tokio::signal::unix::{SignalKind, signal};
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
