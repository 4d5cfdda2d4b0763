//! Start-up progress: a progress bar on a terminal, periodic log lines otherwise.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kube_common::adaptive::AdaptiveLimiter;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::info;

use crate::logging;
use crate::outputs::DaemonStatus;
use crate::throttle;

/// How start-up progress is shown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, log lines otherwise.
    #[default]
    Auto,
    /// Always a bar (on stderr).
    Bar,
    /// Log lines every few seconds.
    Log,
    /// Nothing.
    Off,
}

/// Secrets watched, and how many finished their first sync.
pub(crate) type SecretCounts = Arc<dyn Fn() -> (usize, usize) + Send + Sync>;

const BAR_TICK: Duration = Duration::from_millis(100);
const LOG_TICK: Duration = Duration::from_secs(5);

/// Shows progress until the daemon is ready (or stops), and whether the API server
/// throttles start-up (from the process's adaptive `limiter`).
pub(crate) fn spawn(
    mode: ProgressMode,
    status: watch::Receiver<DaemonStatus>,
    secrets: SecretCounts,
    limiter: AdaptiveLimiter,
) -> JoinHandle<()> {
    let bar = match mode {
        ProgressMode::Off => return tokio::spawn(async {}),
        ProgressMode::Bar => true,
        ProgressMode::Log => false,
        ProgressMode::Auto => std::io::stderr().is_terminal(),
    };
    if bar {
        tokio::spawn(show_bar(status, secrets, limiter))
    } else {
        tokio::spawn(log_lines(status, secrets, limiter))
    }
}

fn describe(
    status: &DaemonStatus,
    watched: usize,
    synced: usize,
    limiter: &AdaptiveLimiter,
) -> String {
    let progress = status.readiness;
    if !progress.listed {
        return "listing routes…".to_owned();
    }
    format!(
        "secrets synced {synced}/{watched} · routes decided {}/{} · rejected {}{}",
        progress.initial_done,
        progress.initial_routes,
        status.rejected,
        throttling(limiter)
    )
}

/// ` · throttled: …` while the API server holds start-up back, else nothing.
fn throttling(limiter: &AdaptiveLimiter) -> String {
    let snapshot = limiter.snapshot();
    if snapshot.throttled {
        format!(" · {}", throttle::describe(&snapshot))
    } else {
        String::new()
    }
}

async fn show_bar(
    mut status: watch::Receiver<DaemonStatus>,
    secrets: SecretCounts,
    limiter: AdaptiveLimiter,
) {
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    bar.set_message("listing routes…");
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} routes · {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    logging::set_progress_bar(Some(bar.clone()));
    let mut tick = tokio::time::interval(BAR_TICK);
    loop {
        let current = *status.borrow_and_update();
        let (watched, synced) = secrets();
        if current.readiness.listed {
            bar.set_length(current.readiness.initial_routes as u64);
            bar.set_position(current.readiness.initial_done as u64);
            bar.set_message(format!(
                "secrets {synced}/{watched} synced · {} rejected{}",
                current.rejected,
                throttling(&limiter)
            ));
        }
        if current.ready {
            bar.finish_with_message(format!(
                "ready in {:.1} s · {} admitted · {} rejected",
                current.ready_after.unwrap_or_default().as_secs_f64(),
                current.admitted,
                current.rejected
            ));
            // End the bar's line, so that what follows starts on a line of its own.
            eprintln!();
            break;
        }
        tokio::select! {
            changed = status.changed() => if changed.is_err() { bar.abandon(); break },
            _ = tick.tick() => {}
        }
    }
    logging::set_progress_bar(None);
}

async fn log_lines(
    mut status: watch::Receiver<DaemonStatus>,
    secrets: SecretCounts,
    limiter: AdaptiveLimiter,
) {
    let started = Instant::now();
    let mut next = started + LOG_TICK;
    loop {
        if status.borrow().ready {
            return;
        }
        tokio::select! {
            changed = status.changed() => if changed.is_err() { return },
            () = tokio::time::sleep_until(next) => {
                next += LOG_TICK;
                let current = *status.borrow();
                let (watched, synced) = secrets();
                info!(elapsed = ?started.elapsed(), "starting: {}", describe(&current, watched, synced, &limiter));
            }
        }
    }
}
