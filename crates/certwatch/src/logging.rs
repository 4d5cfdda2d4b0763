//! Logging through `tracing`, as text or JSON on stderr, drawn around a progress bar.
//!
//! While a progress bar is on screen ([`set_progress_bar`]), every log line is written
//! with the bar hidden and redrawn after it, so the two never garble each other.

use std::io::{self, IsTerminal, Write};
use std::sync::Mutex;

use indicatif::ProgressBar;
use kube_common::sync;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (for log collectors).
    Json,
}

/// The least severe level logged (`--log-level`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// What an operator reads: start, readiness, changes, failures.
    #[default]
    Info,
    /// Each decision and request batch.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// The level as a filter directive.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warn => "warn",
            Self::Info => "info",
            Self::Debug => "debug",
            Self::Trace => "trace",
        }
    }
}

/// Libraries whose debug output is noise to an operator: kept at `info` whatever the
/// level (`RUST_LOG` can still ask for them by name).
const QUIET_LIBRARIES: &[&str] = &[
    "h2",
    "hyper",
    "hyper_util",
    "rustls",
    "tower",
    "kube_client",
];

/// The filter of `default_filter` with `level` as its global level (libraries that
/// are noise below `info` kept there), then `rust_log`'s directives: a directive for a
/// target (or the global level) replaces an earlier one for the same target.
pub fn merged_filter(
    default_filter: &str,
    level: Option<LogLevel>,
    rust_log: Option<&str>,
) -> String {
    let mut directives: Vec<(String, String)> = Vec::new();
    let mut put = |directive: &str| {
        let directive = directive.trim();
        if directive.is_empty() {
            return;
        }
        let target = match directive.rsplit_once('=') {
            Some((target, _)) => target.to_owned(),
            None => String::new(),
        };
        directives.retain(|(known, _)| *known != target);
        directives.push((target, directive.to_owned()));
    };
    default_filter.split(',').for_each(&mut put);
    if let Some(level) = level {
        put(level.as_str());
        if matches!(level, LogLevel::Debug | LogLevel::Trace) {
            for library in QUIET_LIBRARIES {
                put(&format!("{library}=info"));
            }
        }
    }
    if let Some(rust_log) = rust_log {
        rust_log.split(',').for_each(&mut put);
    }
    directives
        .into_iter()
        .map(|(_, directive)| directive)
        .collect::<Vec<_>>()
        .join(",")
}

/// Guards the progress bar currently on screen, if any. Held only to clone the bar
/// out or to swap it; never while writing.
static PROGRESS_BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Makes log lines go around `bar` while it is drawn; `None` when it is finished.
pub fn set_progress_bar(bar: Option<ProgressBar>) {
    *sync::lock(&PROGRESS_BAR) = bar;
}

fn current_bar() -> Option<ProgressBar> {
    sync::lock(&PROGRESS_BAR).clone()
}

/// Installs the global subscriber: `default_filter` (e.g. `"info"`) with `RUST_LOG`'s
/// directives merged in when it is set. Does nothing if a subscriber is already
/// installed.
pub fn init(format: LogFormat, default_filter: &str) {
    init_with_level(format, default_filter, None);
}

/// [`init`] with `level` (`--log-level`) as the global level, merged before
/// `RUST_LOG`.
pub fn init_with_level(format: LogFormat, default_filter: &str, level: Option<LogLevel>) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let merged = merged_filter(default_filter, level, rust_log.as_deref());
    let filter = EnvFilter::try_new(&merged).unwrap_or_else(|_| EnvFilter::new(default_filter));
    // Colour codes only for a person at a terminal: a log collector would store them
    // as text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(io::stderr().is_terminal())
        .with_writer(StderrAroundBar);
    // A second initialisation (tests, or a caller that set one up) is not an error.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

/// Hands out one [`BufferedLine`] per log event.
struct StderrAroundBar;

impl<'a> MakeWriter<'a> for StderrAroundBar {
    type Writer = BufferedLine;

    fn make_writer(&'a self) -> Self::Writer {
        BufferedLine(Vec::with_capacity(256))
    }
}

/// Collects one formatted event and writes it to stderr when dropped, with the
/// progress bar (if any) hidden meanwhile.
struct BufferedLine(Vec<u8>);

impl Write for BufferedLine {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for BufferedLine {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let write = || {
            // Nowhere to report a failing stderr.
            let _ = io::stderr().lock().write_all(&self.0);
        };
        match current_bar() {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }
}

/// Keeps a repeated log line to a bounded rate: the first occurrence is logged, then at
/// most one line per interval, carrying how many occurrences it stands for.
///
/// A daemon that logs every retry of a lasting condition floods its log collector
/// (one line per bundle per retry on a full disk); one that logs only the first hides
/// that the condition lasts. This does both at a bounded cost.
#[derive(Debug, Clone)]
pub struct Repeats {
    interval: std::time::Duration,
    last_logged: Option<std::time::Instant>,
    unlogged: u64,
}

impl Repeats {
    /// At most one line per `interval` after the first.
    pub fn new(interval: std::time::Duration) -> Self {
        Self {
            interval,
            last_logged: None,
            unlogged: 0,
        }
    }

    /// Another occurrence at `now`. `Some(n)`: log it now, standing for `n`
    /// occurrences (this one and the `n - 1` not logged since the last line); `None`:
    /// stay quiet.
    pub fn occurred(&mut self, now: std::time::Instant) -> Option<u64> {
        self.unlogged += 1;
        let due = self
            .last_logged
            .is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if !due {
            return None;
        }
        self.last_logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }

    /// A line about the condition was just logged elsewhere (its first occurrence, in
    /// its own words): the next summary is due an interval from now, not at once.
    pub fn logged(&mut self, now: std::time::Instant) {
        self.last_logged.get_or_insert(now);
    }

    /// The condition ended: the next occurrence is logged at once. Returns how many
    /// occurrences were not logged.
    pub fn reset(&mut self) -> u64 {
        self.last_logged = None;
        std::mem::take(&mut self.unlogged)
    }
}

/// What [`StateLog::observe`] says about a keyed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// New, or different from the last one for its key: log it.
    Changed,
    /// The same as last time, and a summary of repeats is due: log it as a repeat
    /// standing for this many occurrences (of any key).
    RepeatDue(u64),
    /// The same as last time: stay quiet.
    Repeat,
}

/// Logs a state per key (a route's rejection, its warnings) when it changes, and its
/// repeats (the pipeline re-deciding a route the same way) at a bounded rate over all
/// keys together.
#[derive(Debug)]
pub struct StateLog<K> {
    states: kube_common::hash::NameMap<K, u64>,
    repeats: Repeats,
}

impl<K: std::hash::Hash + Eq> StateLog<K> {
    /// Repeats summarised at most once per `interval`.
    pub fn new(interval: std::time::Duration) -> Self {
        Self {
            states: kube_common::hash::NameMap::default(),
            repeats: Repeats::new(interval),
        }
    }

    /// `key` is in `state` (any hashable description of it) at `now`.
    pub fn observe(
        &mut self,
        key: K,
        state: &impl std::hash::Hash,
        now: std::time::Instant,
    ) -> Seen {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let fingerprint = BuildHasherDefault::<DefaultHasher>::default().hash_one(state);
        if self.states.insert(key, fingerprint) == Some(fingerprint) {
            return match self.repeats.occurred(now) {
                Some(count) => Seen::RepeatDue(count),
                None => Seen::Repeat,
            };
        }
        self.repeats.logged(now);
        Seen::Changed
    }

    /// `key` is gone (its next state is logged).
    pub fn forget(&mut self, key: &K) {
        self.states.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn repeats_are_logged_at_a_bounded_rate_with_a_count() {
        let mut repeats = Repeats::new(Duration::from_secs(60));
        let start = Instant::now();
        let logged: Vec<Option<u64>> = (0..5)
            .map(|second| repeats.occurred(start + Duration::from_secs(second * 20)))
            .collect();
        // t=0 logged; 20 s and 40 s quiet; 60 s logged for three; 80 s quiet.
        assert_eq!(logged, [Some(1), None, None, Some(3), None]);
        assert_eq!(repeats.reset(), 1);
        assert_eq!(repeats.occurred(start + Duration::from_secs(81)), Some(1));
    }

    #[test]
    fn state_changes_are_logged_and_repeats_summarised() {
        let mut log = StateLog::new(Duration::from_secs(60));
        let now = Instant::now();
        let later = now + Duration::from_secs(61);
        let seen = [
            log.observe("a", &"denied", now),
            log.observe("b", &"denied", now),
            log.observe("a", &"denied", now),
            log.observe("a", &"denied", now),
            log.observe("a", &"bad pem", now),
            log.observe("b", &"denied", later),
        ];
        // Repeats are summarised a minute after the first line at the earliest.
        assert_eq!(
            seen,
            [
                Seen::Changed,
                Seen::Changed,
                Seen::Repeat,
                Seen::Repeat,
                Seen::Changed,
                Seen::RepeatDue(3),
            ]
        );
        log.forget(&"b");
        assert_eq!(log.observe("b", &"denied", later), Seen::Changed);
    }
}

#[cfg(test)]
mod filter_tests {
    use super::*;

    #[test]
    fn the_level_replaces_the_global_one_and_keeps_the_defaults_quiet_parts() {
        let default = "info,kube_runtime::watcher=error";
        assert_eq!(merged_filter(default, None, None), default);
        assert_eq!(
            merged_filter(default, Some(LogLevel::Warn), None),
            "kube_runtime::watcher=error,warn"
        );
        let debug = merged_filter(default, Some(LogLevel::Debug), None);
        assert!(
            debug.starts_with("kube_runtime::watcher=error,debug,h2=info"),
            "{debug}"
        );
    }

    #[test]
    fn rust_log_directives_replace_the_same_targets_only() {
        let default = "info,kube_runtime::watcher=error";
        assert_eq!(
            merged_filter(default, None, Some("debug")),
            "kube_runtime::watcher=error,debug"
        );
        assert_eq!(
            merged_filter(
                default,
                Some(LogLevel::Debug),
                Some("h2=trace,kube_runtime::watcher=warn")
            ),
            "debug,hyper=info,hyper_util=info,rustls=info,tower=info,kube_client=info,h2=trace,kube_runtime::watcher=warn"
        );
    }
}
