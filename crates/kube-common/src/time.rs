//! Waiting for a deadline that may not be set, as the arms of a `tokio::select!` do.

use tokio::time::Instant;

/// Sleeps until `at`; never returns when `at` is `None` (a `select!` arm with nothing
/// scheduled).
pub async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
