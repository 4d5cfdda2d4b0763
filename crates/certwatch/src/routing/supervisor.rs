//! The HAProxy process certwatch runs on its configuration: master-worker mode (`-W`),
//! in the foreground (`-db`), reloaded by `SIGUSR2` to the master (new workers load the
//! configuration as it is on disk; the old ones finish their connections), stopped
//! softly by `SIGUSR1`. Its output is logged line by line.
//!
//! HAProxy outlives no certwatch: it runs under a small `sh` that holds a pipe whose
//! other end only certwatch has, and stops HAProxy softly when the pipe closes, however
//! certwatch ends (a `SIGKILL` runs no destructor).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tracing::{info, warn};

/// The watchdog: starts HAProxy (`$0` on configuration `$1`, master pid in `$2`, master
/// CLI at `$3`), waits for end-of-file on its stdin, then stops HAProxy softly, and for
/// good (`SIGKILL` to the master, whose workers follow it) if it has not ended within
/// 10 s: a soft stop waits for open connections, which may never close.
const WATCHDOG: &str = r#"trap '' INT HUP
"$0" -W -db -S "$3",mode,600 -f "$1" -p "$2" <&- &
child=$!
while read -r _; do :; done
kill -USR1 "$child" 2>/dev/null
i=0
while kill -0 "$child" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i+1)); done
kill -KILL "$child" 2>/dev/null
wait "$child""#;

/// Where the master CLI of the HAProxy run on `config` listens (`run/master.sock` beside
/// it): the certificates' controller reloads HAProxy through it for what its runtime
/// API cannot carry.
pub fn master_socket(config: &Path) -> PathBuf {
    config.with_file_name("run").join("master.sock")
}

/// A running HAProxy.
#[derive(Debug)]
pub struct HaproxyProcess {
    /// The watchdog shell; HAProxy's master is its child.
    child: Child,
    /// Its stdin: HAProxy stops when this closes.
    lifeline: Option<tokio::process::ChildStdin>,
    config: PathBuf,
    pid_file: PathBuf,
}

/// Why HAProxy could not be started or signalled.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The binary could not be started.
    #[error("cannot start {binary} -f {config}: {source}")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The configuration.
        config: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The process has ended.
    #[error("HAProxy (master process of {config}) has ended: {status}")]
    Ended {
        /// The configuration.
        config: PathBuf,
        /// How it ended.
        status: String,
    },
    /// A signal could not be sent.
    #[error("cannot signal HAProxy's master process: {0}")]
    Signal(std::io::Error),
}

impl HaproxyProcess {
    /// Starts `binary` on `config`; with `access_log`, HAProxy's standard output (where
    /// its configuration sends the access log) is certwatch's own, line for line.
    pub fn start(binary: &Path, config: &Path, access_log: bool) -> Result<Self, ProcessError> {
        let pid_file = config.with_file_name("haproxy.pid");
        let _ = std::fs::remove_file(&pid_file);
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg(binary)
            .arg(config)
            .arg(&pid_file)
            .arg(master_socket(config))
            // Certificates load at certwatch's OpenSSL security level.
            .env(
                "OPENSSL_CONF",
                config.with_file_name(super::render::OPENSSL_CONF_FILE),
            )
            .stdin(Stdio::piped())
            .stdout(if access_log {
                Stdio::inherit()
            } else {
                Stdio::piped()
            })
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ProcessError::Spawn {
                binary: binary.to_owned(),
                config: config.to_owned(),
                source,
            })?;
        for output in [
            child
                .stdout
                .take()
                .map(|out| Box::new(out) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            child
                .stderr
                .take()
                .map(|err| Box::new(err) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ]
        .into_iter()
        .flatten()
        {
            tokio::spawn(async move {
                let mut lines = BufReader::new(output).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    // HAProxy's warnings are mostly its normal life (proxies stopped
                    // by a reload, servers leaving maintenance): alerts only are ours.
                    if line.contains("[ALERT]") {
                        warn!(target: "haproxy", "{line}");
                    } else {
                        info!(target: "haproxy", "{line}");
                    }
                }
            });
        }
        info!(config = %config.display(), "HAProxy started");
        let lifeline = child.stdin.take();
        Ok(Self {
            child,
            lifeline,
            config: config.to_owned(),
            pid_file,
        })
    }

    /// HAProxy's master process, from its pid file.
    fn pid(&mut self) -> Result<rustix::process::Pid, ProcessError> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Err(ProcessError::Ended {
                config: self.config.clone(),
                status: status.to_string(),
            });
        }
        std::fs::read_to_string(&self.pid_file)
            .ok()
            .and_then(|text| text.trim().parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| ProcessError::Ended {
                config: self.config.clone(),
                status: format!("no pid in {}", self.pid_file.display()),
            })
    }

    /// Asks the master to load the configuration again.
    pub fn reload(&mut self) -> Result<(), ProcessError> {
        let pid = self.pid()?;
        rustix::process::kill_process(pid, rustix::process::Signal::USR2)
            .map_err(|errno| ProcessError::Signal(errno.into()))
    }

    /// Whether HAProxy still runs.
    pub fn running(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Stops HAProxy: soft stop (its connections finish), killed after `grace`.
    pub async fn stop(mut self, grace: Duration) {
        let master = self.pid().ok();
        drop(self.lifeline.take());
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            if let Some(pid) = master {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            let _ = self.child.kill().await;
        }
        info!(config = %self.config.display(), "HAProxy stopped");
    }
}
