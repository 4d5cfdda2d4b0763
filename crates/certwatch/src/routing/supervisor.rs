//! The HAProxy process certwatch runs on its configuration: master-worker mode (`-W`),
//! in the foreground (`-db`), reloaded by `SIGUSR2` to the master (new workers load the
//! configuration as it is on disk; the old ones finish their connections), stopped
//! softly by `SIGUSR1`. Its output is logged line by line.
//!
//! HAProxy outlives no certwatch: it runs under [`crate::haproxy::watchdog`], which
//! stops it when certwatch ends, however it ends (a `SIGKILL` runs no destructor), and
//! an HAProxy left on the same configuration by an earlier run is stopped before this
//! one starts.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tracing::{info, warn};

use crate::haproxy::process::{
    Drain, LogTail, MasterCli, ProcessError as LoadError, Processes, Stopped, stop_master,
};
use crate::haproxy::runtime::{RuntimeError, one_shot};
use crate::haproxy::watchdog::{self, Watched};

/// How long an HAProxy left by an earlier run gets to end on `SIGTERM` (then on
/// `SIGKILL`).
const LEFTOVER_PATIENCE: Duration = Duration::from_secs(5);

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
    /// The end of HAProxy's output: why a load failed, in its words.
    tail: LogTail,
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
    /// HAProxy's master CLI could not be asked to reload.
    #[error(transparent)]
    Load(#[from] LoadError),
}

impl HaproxyProcess {
    /// Starts `binary` on `config`, once any HAProxy left running on `config` by an
    /// earlier run has ended; with `access_log`, HAProxy's standard output (where its
    /// configuration sends the access log) is certwatch's own, line for line.
    pub async fn start(
        binary: &Path,
        config: &Path,
        access_log: bool,
    ) -> Result<Self, ProcessError> {
        watchdog::stop_leftovers(config, LEFTOVER_PATIENCE).await;
        let pid_file = config.with_file_name("haproxy.pid");
        let _ = std::fs::remove_file(&pid_file);
        let mut master = master_socket(config).into_os_string();
        master.push(",mode,600");
        // Certificates load at certwatch's OpenSSL security level.
        let openssl_conf = config.with_file_name(super::render::OPENSSL_CONF_FILE);
        let Watched {
            mut child,
            lifeline,
        } = watchdog::spawn(
            binary,
            &[
                OsStr::new("-W"),
                OsStr::new("-db"),
                OsStr::new("-S"),
                &master,
                OsStr::new("-f"),
                config.as_os_str(),
                OsStr::new("-p"),
                pid_file.as_os_str(),
            ],
            &[("OPENSSL_CONF", openssl_conf.as_os_str())],
            access_log,
        )
        .map_err(|source| ProcessError::Spawn {
            binary: binary.to_owned(),
            config: config.to_owned(),
            source,
        })?;
        let tail = LogTail::default();
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
            let tail = tail.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(output).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tail.push(line.clone());
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
        Ok(Self {
            child,
            lifeline,
            config: config.to_owned(),
            pid_file,
            tail,
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

    /// Asks the master to load the configuration and its files again (its master
    /// CLI's `reload`: the old worker serves until the new one does); returns what the
    /// master said before, for [`HaproxyProcess::load_failed`].
    pub async fn begin_reload(
        &mut self,
        command_timeout: Duration,
    ) -> Result<Processes, ProcessError> {
        let master = MasterCli::new(master_socket(&self.config), command_timeout);
        // Just after a reload the master re-executes itself, and its CLI refuses
        // connections for a moment: it is asked again until it answers, HAProxy exits,
        // or `command_timeout` has passed (HAProxy is not given up for that moment).
        let deadline = tokio::time::Instant::now() + command_timeout;
        let before = loop {
            match master.processes().await {
                Ok(before) => break before,
                Err(error) if tokio::time::Instant::now() >= deadline || !self.running() => {
                    return Err(error.into());
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        // The master closes the connection when it re-executes; what it says before
        // does not matter.
        match one_shot(master.socket(), "reload", command_timeout).await {
            Ok(_) | Err(RuntimeError::Io { .. } | RuntimeError::Closed { .. }) => Ok(before),
            Err(error) => Err(LoadError::from(error).into()),
        }
    }

    /// HAProxy's words when the load begun after `before` failed (its old worker keeps
    /// serving); `None` while it loads, once it has loaded, or while the master does not
    /// answer.
    pub async fn load_failed(
        &self,
        before: &Processes,
        command_timeout: Duration,
    ) -> Option<String> {
        let master = MasterCli::new(master_socket(&self.config), command_timeout);
        let now = master.processes().await.ok()?;
        (now.master.reloads > before.master.reloads && now.failed_reloads > 0)
            .then(|| self.tail.text())
    }

    /// Whether HAProxy still runs.
    pub fn running(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Stops HAProxy: a soft stop (its connections finish) for at most `drain`'s
    /// bound or until its cut, then a hard stop, then `SIGKILL`. The lifeline stays
    /// open meanwhile: closing it would have the watchdog end the drain after its
    /// own short patience, which is for a certwatch that died.
    pub async fn stop(mut self, drain: &Drain) -> Stopped {
        let master = self.pid().ok();
        let stopped = stop_master(&mut self.child, master, drain).await;
        drop(self.lifeline.take());
        info!(config = %self.config.display(), ?stopped, "HAProxy stopped");
        stopped
    }
}
