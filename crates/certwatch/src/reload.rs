//! The reload command: debounced, single-flight.
//!
//! A change starts a quiet period; every further change restarts it, so a burst of
//! changes coalesces into one run once changes stop for [`ReloadOptions::debounce`]
//! (or, under a steady stream of changes, once [`ReloadOptions::max_delay`] has passed
//! since the first). Runs never overlap: changes that arrive while the command runs are
//! remembered and cause exactly one more run after it, however many they are.
//!
//! A change is announced *before* its files are written ([`Reloader::begin_change`])
//! and the run waits until every announced write is finished. So a run never sees
//! half-written state, and whoever sees a file on disk knows that the run covering it
//! is already scheduled: the number of runs follows from the order of events, not
//! from timing.
//!
//! A writer that ends up changing nothing withdraws its announcement
//! ([`ChangeGuard::finish`]), so a flush that found everything already in place costs
//! no reload.
//!
//! The command runs with `sh -c`, with `CERTWATCH_CERT_DIR` and `CERTWATCH_CRT_LIST`
//! in its environment. A non-zero exit, a spawn failure or a run longer than
//! [`ReloadOptions::timeout`] (the command is then killed) is logged and counted in
//! `certwatch_reload_failures_total`, and retried with [`ReloadOptions::retry`]
//! (client-go's backoff: 0.8 s doubling to 30 s), whether or not anything changes
//! meanwhile: the proxy must not stay on old files because the last run failed.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kube_common::backoff::{Backoff, BackoffPolicy};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::metrics::Metrics;

/// Settings of the reload command.
#[derive(Clone, Debug)]
pub struct ReloadOptions {
    /// Shell command line, run with `sh -c`.
    pub command: String,
    /// Quiet period that ends a burst of changes.
    pub debounce: Duration,
    /// Longest delay between a change and the run that covers it, even while changes
    /// keep coming.
    pub max_delay: Duration,
    /// Longest run; the command is killed after it.
    pub timeout: Duration,
    /// Delays between retries of a failed run.
    pub retry: BackoffPolicy,
}

impl ReloadOptions {
    /// `command` with the defaults of `certwatch run`: 1 s debounce, 30 s longest
    /// delay, 60 s timeout, client-go's backoff for retries.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            debounce: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            timeout: Duration::from_secs(60),
            retry: BackoffPolicy::default(),
        }
    }
}

/// State shared by the [`Reloader`], its [`ChangeGuard`]s and its worker.
#[derive(Debug, Default)]
struct Shared {
    /// Whether some change is not yet covered by a run that has started.
    pending: AtomicBool,
    /// Changes being written now; a run waits until there are none.
    writing: AtomicUsize,
    /// Signalled when `writing` drops to zero.
    written: Notify,
}

/// Runs the reload command after changes; see the [module documentation](self).
#[derive(Debug)]
pub struct Reloader {
    changes: mpsc::Sender<()>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    task: JoinHandle<()>,
}

/// A change being written. [`ChangeGuard::finish`] says whether it changed anything;
/// dropping it unfinished counts as a change.
#[derive(Debug)]
pub struct ChangeGuard {
    changes: mpsc::Sender<()>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    changed: bool,
}

impl ChangeGuard {
    /// The write is done; `changed`: whether it changed any file (if not, no reload
    /// is due for it).
    pub fn finish(mut self, changed: bool) {
        self.changed = changed;
    }
}

impl Drop for ChangeGuard {
    fn drop(&mut self) {
        if self.changed {
            // Before the write counts as done: a run waiting for it then sees it.
            self.shared.pending.store(true, Ordering::SeqCst);
            self.metrics.reload.set_pending(true);
        }
        if self.shared.writing.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.written.notify_waiters();
        }
        if self.changed {
            // The quiet period counts from the end of the write. Full: a wake-up is
            // already queued; closed: the worker is gone.
            let _ = self.changes.try_send(());
        }
    }
}

impl Reloader {
    /// Starts the reloader task. `cert_dir` and `crt_list` are passed to the command
    /// in its environment.
    pub fn spawn(
        options: ReloadOptions,
        cert_dir: PathBuf,
        crt_list: PathBuf,
        metrics: Arc<Metrics>,
    ) -> Self {
        // One slot is enough: a full channel already says "something changed".
        let (changes, receiver) = mpsc::channel(1);
        let shared = Arc::new(Shared::default());
        let task = tokio::spawn(
            Worker {
                options,
                cert_dir,
                crt_list,
                metrics: Arc::clone(&metrics),
                shared: Arc::clone(&shared),
            }
            .run(receiver),
        );
        Self {
            changes,
            shared,
            metrics,
            task,
        }
    }

    /// Files are about to change: schedule a run, which waits until the returned
    /// guard is dropped (the write is done).
    pub fn begin_change(&self) -> ChangeGuard {
        self.shared.writing.fetch_add(1, Ordering::SeqCst);
        ChangeGuard {
            changes: self.changes.clone(),
            shared: Arc::clone(&self.shared),
            metrics: Arc::clone(&self.metrics),
            changed: true,
        }
    }

    /// Files changed: schedule a run.
    pub fn trigger(&self) {
        drop(self.begin_change());
    }

    /// Stops accepting changes, runs a reload still pending (a proxy that outlives
    /// certwatch should see the last files), and waits for the worker to end.
    pub async fn close(self) {
        let Self { changes, task, .. } = self;
        drop(changes);
        let _ = task.await;
    }
}

struct Worker {
    options: ReloadOptions,
    cert_dir: PathBuf,
    crt_list: PathBuf,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
}

impl Worker {
    async fn run(self, mut changes: mpsc::Receiver<()>) {
        let mut closed = false;
        let mut retry_at: Option<Instant> = None;
        let mut backoff = Backoff::new(self.options.retry);
        while !closed {
            tokio::select! {
                change = changes.recv() => closed = change.is_none(),
                () = sleep_until(retry_at), if retry_at.is_some() => retry_at = None,
            }
            let first = Instant::now();
            let mut last = first;
            while !closed {
                let deadline = (last + self.options.debounce).min(first + self.options.max_delay);
                tokio::select! {
                    biased;
                    change = changes.recv() => match change {
                        Some(()) => last = Instant::now(),
                        None => {
                            closed = true;
                            break;
                        }
                    },
                    () = tokio::time::sleep_until(deadline) => break,
                }
            }
            self.wait_for_writes().await;
            // A wake-up queued by a change that the previous run already covered.
            if !self.shared.pending.swap(false, Ordering::SeqCst) {
                continue;
            }
            self.metrics
                .reload
                .set_pending(self.shared.pending.load(Ordering::SeqCst));
            // Changes during the run set `pending` again and queue a wake-up, which
            // the next round picks up.
            if self.run_once().await {
                retry_at = None;
            } else if !closed {
                // Retried even if nothing changes: the proxy must get the files.
                self.shared.pending.store(true, Ordering::SeqCst);
                self.metrics.reload.set_pending(true);
                let delay = backoff.next_delay();
                warn!(retry_in = ?delay, "the reload command will be retried");
                retry_at = Some(Instant::now() + delay);
            }
        }
    }

    /// Returns once no announced change is being written.
    async fn wait_for_writes(&self) {
        loop {
            let written = self.shared.written.notified();
            tokio::pin!(written);
            // Registered before the check, so a drop to zero in between is not missed.
            written.as_mut().enable();
            if self.shared.writing.load(Ordering::SeqCst) == 0 {
                return;
            }
            written.await;
        }
    }

    /// Runs the command once; returns whether it succeeded.
    async fn run_once(&self) -> bool {
        self.metrics.reload.started();
        let started = Instant::now();
        let mut command = tokio::process::Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(&self.options.command)
            .env("CERTWATCH_CERT_DIR", &self.cert_dir)
            .env("CERTWATCH_CRT_LIST", &self.crt_list)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let ok = match command.spawn() {
            Err(error) => {
                warn!(command = %self.options.command, %error, "cannot start the reload command");
                false
            }
            Ok(child) => {
                match tokio::time::timeout(self.options.timeout, child.wait_with_output()).await {
                    Err(_) => {
                        warn!(command = %self.options.command, timeout = ?self.options.timeout, "the reload command timed out and was killed");
                        false
                    }
                    Ok(Err(error)) => {
                        warn!(command = %self.options.command, %error, "waiting for the reload command failed");
                        false
                    }
                    Ok(Ok(output)) if output.status.success() => {
                        info!(command = %self.options.command, "reload command succeeded");
                        true
                    }
                    Ok(Ok(output)) => {
                        warn!(
                            command = %self.options.command,
                            status = %output.status,
                            stderr = %redacted_tail(&output.stderr),
                            "the reload command failed"
                        );
                        false
                    }
                }
            }
        };
        self.metrics.reload.finished(ok, started.elapsed());
        ok
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The end of a command's stderr for a log line: at most 512 bytes, with anything
/// that looks like PEM material replaced (a command might print a file it reads).
fn redacted_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let cleaned: Vec<&str> = text
        .lines()
        .map(|line| {
            if line.contains("-----BEGIN") || line.contains("-----END") || looks_like_base64(line) {
                "<redacted>"
            } else {
                line
            }
        })
        .collect();
    let joined = cleaned.join("\n");
    let start = joined.len().saturating_sub(512);
    let start = (start..=joined.len())
        .find(|&i| joined.is_char_boundary(i))
        .unwrap_or(joined.len());
    joined[start..].trim().to_owned()
}

fn looks_like_base64(line: &str) -> bool {
    line.len() >= 40
        && line
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reloader(
        dir: &std::path::Path,
        command: String,
        debounce: Duration,
    ) -> (Reloader, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let reloader = Reloader::spawn(
            ReloadOptions {
                debounce,
                max_delay: Duration::from_secs(60),
                retry: BackoffPolicy::default()
                    .with_bounds(Duration::from_millis(20), Duration::from_millis(100)),
                ..ReloadOptions::new(command)
            },
            dir.to_owned(),
            dir.join("crt-list"),
            Arc::clone(&metrics),
        );
        (reloader, metrics)
    }

    fn runs(log: &std::path::Path) -> usize {
        std::fs::read_to_string(log).map_or(0, |text| text.lines().count())
    }

    async fn wait_for(mut condition: impl FnMut() -> bool) {
        for _ in 0..6000 {
            if condition() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached");
    }

    #[tokio::test]
    async fn changes_during_a_run_cause_exactly_one_more() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runs");
        let hold = dir.path().join("hold");
        std::fs::write(&hold, b"").unwrap();
        let command = format!(
            "echo run >> '{}'; while [ -e '{}' ]; do sleep 0.02; done",
            log.display(),
            hold.display()
        );
        let (reloader, metrics) = reloader(dir.path(), command, Duration::from_millis(20));
        reloader.trigger();
        wait_for(|| runs(&log) == 1).await;
        // The first run is held; every change now lands while it runs.
        for _ in 0..20 {
            reloader.trigger();
        }
        std::fs::remove_file(&hold).unwrap();
        wait_for(|| runs(&log) == 2).await;
        reloader.close().await;
        assert_eq!(runs(&log), 2);
        let text = metrics.encode();
        assert!(text.contains("certwatch_reloads_total 2\n"), "{text}");
        assert!(text.contains("certwatch_reload_pending 0\n"), "{text}");
    }

    #[tokio::test]
    async fn a_run_waits_for_the_write_it_covers() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runs");
        let marker = dir.path().join("written");
        // The run records whether the write it covers had finished.
        let command = format!(
            "if [ -e '{}' ]; then echo after >> '{}'; else echo before >> '{}'; fi",
            marker.display(),
            log.display(),
            log.display()
        );
        let (reloader, _metrics) = reloader(dir.path(), command, Duration::from_millis(1));
        let change = reloader.begin_change();
        // However long the write takes, the run waits for it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        std::fs::write(&marker, b"").unwrap();
        drop(change);
        wait_for(|| runs(&log) == 1).await;
        reloader.close().await;
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "after\n");
    }

    #[tokio::test]
    async fn failures_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let (reloader, metrics) =
            reloader(dir.path(), "exit 3".to_owned(), Duration::from_millis(1));
        reloader.trigger();
        wait_for(|| {
            metrics
                .encode()
                .contains("certwatch_reload_failures_total 1\n")
        })
        .await;
        reloader.close().await;
    }

    /// A failed run is retried with backoff without any new change, until it
    /// succeeds; then nothing more runs.
    #[tokio::test]
    async fn a_failed_run_is_retried_until_it_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runs");
        // Fails twice, then succeeds.
        let command = format!(
            "echo run >> '{log}'; [ $(wc -l < '{log}') -ge 3 ]",
            log = log.display()
        );
        let (reloader, metrics) = reloader(dir.path(), command, Duration::from_millis(1));
        reloader.trigger();
        wait_for(|| {
            metrics.encode().contains("certwatch_reloads_total 3\n")
                && metrics.encode().contains("certwatch_reload_pending 0\n")
        })
        .await;
        reloader.close().await;
        assert_eq!(runs(&log), 3);
        let text = metrics.encode();
        assert!(
            text.contains("certwatch_reload_failures_total 2\n"),
            "{text}"
        );
        assert!(
            text.contains("certwatch_reload_duration_seconds_count 3\n"),
            "{text}"
        );
    }

    /// A write that changed nothing causes no run.
    #[tokio::test]
    async fn a_write_that_changed_nothing_costs_no_run() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runs");
        let command = format!("echo run >> '{}'", log.display());
        let (reloader, _metrics) = reloader(dir.path(), command, Duration::from_millis(1));
        reloader.begin_change().finish(false);
        reloader.begin_change().finish(true);
        reloader.close().await;
        assert_eq!(runs(&log), 1);
    }

    #[tokio::test]
    async fn a_pending_change_is_reloaded_on_close() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runs");
        let command = format!("echo run >> '{}'", log.display());
        let (reloader, _metrics) = reloader(dir.path(), command, Duration::from_secs(3600));
        reloader.trigger();
        reloader.close().await;
        assert_eq!(runs(&log), 1);
    }

    #[test]
    fn pem_is_redacted() {
        let stderr = b"cannot load\n-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----\n";
        let text = redacted_tail(stderr);
        assert!(text.starts_with("cannot load"));
        assert!(!text.contains("MIIE"));
        assert!(!text.contains("PRIVATE"));
    }
}
