//! Says when the API server's load holds certwatch back: one log line when throttling
//! starts and one when it ends, never one per refused request.

use std::time::Duration;

use kube_common::adaptive::{AdaptiveLimiter, LimiterSnapshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often the limiter is looked at. Throttling that starts and ends within one
/// period goes unlogged (the counters in `/metrics` still show it).
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Logs the limiter's throttling changes until `shutdown`.
pub(crate) fn spawn_log(limiter: AdaptiveLimiter, shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut throttled = false;
        let mut tick = tokio::time::interval(LOOK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let snapshot = limiter.snapshot();
            if snapshot.throttled == throttled {
                continue;
            }
            throttled = snapshot.throttled;
            if throttled {
                warn!(
                    window = snapshot.window,
                    bound = snapshot.upper_bound,
                    waiting = snapshot.waiting,
                    refused = snapshot.refused,
                    paused_for = ?snapshot.paused_for,
                    "the API server is refusing requests for load (429/5xx): {}",
                    describe(&snapshot)
                );
            } else {
                info!(
                    window = snapshot.window,
                    refused = snapshot.refused,
                    "no longer throttled by the API server"
                );
            }
        }
    })
}

/// The throttling state in words, for the log and the progress display.
pub(crate) fn describe(snapshot: &LimiterSnapshot) -> String {
    let window = snapshot
        .window
        .map_or_else(|| "unbounded".to_owned(), |window| window.to_string());
    let mut text = format!(
        "throttled: {window} at once, {} waiting, {} refused so far",
        snapshot.waiting, snapshot.refused
    );
    if let Some(pause) = snapshot.paused_for {
        text.push_str(&format!(
            ", refused requests due again within {:.1} s (Retry-After)",
            pause.as_secs_f64()
        ));
    }
    text
}
