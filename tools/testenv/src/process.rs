//! Child processes that cannot outlive the test process.
//!
//! Dropping a [`Supervised`] process kills it, which covers a test that returns or
//! panics. A test binary that is killed outright (SIGKILL from a timeout, a crash) runs
//! no destructor, so each process is started under a small `sh` watchdog that holds the
//! read end of a pipe whose write end only the test process has: when the test process
//! ends, however it ends, the kernel closes that end, the watchdog reads end-of-file and
//! kills its child. (A parent-death signal would need `unsafe` `pre_exec`, which the
//! workspace forbids, and fires when the spawning *thread* exits, not the process.)

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::TestEnvError;

/// The watchdog: runs "$@" in the background with its output in the log file, writes
/// its pid, then waits for end-of-file on stdin and kills it. It ignores SIGINT, SIGHUP
/// and SIGTERM so that a signal to the whole process group (a Ctrl-C, `timeout`) that
/// ends the test process leaves it alive to clean up; the program gets them as usual.
const WATCHDOG: &str = r#"
trap '' INT HUP TERM
pidfile=$1; log=$2; shift 2
(trap - INT HUP TERM; exec "$@") </dev/null >"$log" 2>&1 &
child=$!
echo "$child" >"$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
while read -r _; do :; done
kill -KILL "$child" 2>/dev/null
wait "$child" 2>/dev/null
exit 0
"#;

/// A process started under a watchdog; killed when dropped or when the test process
/// ends.
#[derive(Debug)]
pub struct Supervised {
    name: &'static str,
    watchdog: Child,
    /// The write end of the watchdog's stdin; closing it stops the process.
    lifeline: Option<ChildStdin>,
    pid: u32,
    log: PathBuf,
}

impl Supervised {
    /// Starts `command` with `args`, its stdout and stderr going to `log`.
    pub fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Self, TestEnvError> {
        let pidfile = log.with_extension("pid");
        // A process started again in the same place must not be taken for the earlier.
        let _ = std::fs::remove_file(&pidfile);
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("testenv-watchdog")
            .arg(&pidfile)
            .arg(log)
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| TestEnvError::Io {
                what: format!("starting {name} under its watchdog (sh)"),
                source,
            })?;
        let lifeline = watchdog.stdin.take();
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|text| text.trim().parse().ok())
            {
                break pid;
            }
            if Instant::now() > deadline || matches!(watchdog.try_wait(), Ok(Some(_))) {
                let _ = watchdog.kill();
                let _ = watchdog.wait();
                return Err(TestEnvError::NotStarted {
                    process: name,
                    reason: "its watchdog did not report a pid".to_owned(),
                    log: log.to_path_buf(),
                    log_tail: log_tail(log),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Ok(Self {
            name,
            watchdog,
            lifeline,
            pid,
            log: log.to_path_buf(),
        })
    }

    /// The process id of the supervised program (not of its watchdog).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the program is still running (Linux: its `/proc` entry exists and is
    /// not a zombie).
    pub fn is_running(&self) -> bool {
        pid_is_running(self.pid)
    }

    /// The program's log file (stdout and stderr).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last lines of the program's log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// An error saying that this process did not start, with its log's tail.
    pub(crate) fn not_started(&self, reason: impl Into<String>) -> TestEnvError {
        TestEnvError::NotStarted {
            process: self.name,
            reason: reason.into(),
            log: self.log.clone(),
            log_tail: self.log_tail(),
        }
    }

    /// Kills the program and waits until it is gone.
    pub fn stop(&mut self) {
        // Closing the lifeline makes the watchdog kill and reap the program.
        drop(self.lifeline.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.watchdog.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    let _ = self.watchdog.kill();
                    let _ = self.watchdog.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether `pid` names a live (not zombie) process.
pub fn pid_is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: "pid (comm) S ...".
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The last 40 lines of a log file (empty when it cannot be read).
pub(crate) fn log_tail(path: &Path) -> String {
    let Ok(file) = File::open(path) else {
        return String::new();
    };
    let text = std::io::read_to_string(file).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
