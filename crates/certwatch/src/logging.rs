//! Logging through `tracing`, as text or JSON on stderr, drawn around a progress bar.
//!
//! While a progress bar is on screen ([`set_progress_bar`]), every log line is written
//! with the bar hidden and redrawn after it, so the two never garble each other.

use std::io::{self, Write};
use std::sync::{Mutex, PoisonError};

use indicatif::ProgressBar;
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

/// Guards the progress bar currently on screen, if any. Held only to clone the bar
/// out or to swap it; never while writing.
static PROGRESS_BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Makes log lines go around `bar` while it is drawn; `None` when it is finished.
pub fn set_progress_bar(bar: Option<ProgressBar>) {
    *PROGRESS_BAR.lock().unwrap_or_else(PoisonError::into_inner) = bar;
}

fn current_bar() -> Option<ProgressBar> {
    PROGRESS_BAR
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Installs the global subscriber: `RUST_LOG` when set, `default_filter` otherwise
/// (e.g. `"info"`). Does nothing if a subscriber is already installed.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
