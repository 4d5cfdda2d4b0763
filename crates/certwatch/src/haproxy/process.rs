//! HAProxy as certwatch's child, in master-worker mode, and its master CLI.
//!
//! [`HaproxyProcess::start`] runs `haproxy -W -S <master socket> -f <config>` under
//! [`super::watchdog`] (so that it ends with certwatch, `SIGKILL` included, and once
//! any HAProxy left on the same configuration by an earlier run has ended): the
//! master process stays in the foreground, forks a worker that serves, and answers its
//! master CLI on the master socket. With [`ProcessOptions::security_level`], HAProxy
//! runs with an `OPENSSL_CONF` certwatch writes at that level, the one certwatch
//! validates certificates at. HAProxy loads every certificate its configuration
//! names from the files (the crt-list), which is why it is started only once they are
//! complete: loading the files is HAProxy's fastest way to hold thousands of
//! certificates.
//!
//! [`MasterCli::reload`] sends the master CLI's `reload` (what `kill -USR2` does): the
//! master re-executes itself, loads the configuration and the files again, forks a new
//! worker and lets the old one finish its connections. While it loads, the old worker
//! keeps serving, and a runtime API connection opened to it before keeps working. The
//! master CLI is unreachable during the load; [`MasterCli::reload`] waits until it
//! answers again and says whether the load succeeded (`show proc`: the master's
//! reload count went up, with no failure) and which worker serves now. A failed load
//! leaves the old worker serving (HAProxy's own behaviour), and the failure is
//! reported with the end of HAProxy's log.
//!
//! From HAProxy 3.1 the master no longer loads the configuration: it forks the worker,
//! which loads it, and `show proc` lists that worker from its fork. For those versions
//! (read from `show proc`'s version column) a start or a reload is over when the master
//! CLI's `_loadstatus`, which answers once no worker is loading, says `Success=1`;
//! `Success=0` is a refused configuration, with HAProxy's start-up messages.
//!
//! A [`MasterCli`] also works on a master socket certwatch did not create (HAProxy
//! run by someone else in master-worker mode, `--haproxy-master-socket`).
//!
//! HAProxy's own output (stdout and stderr) goes to certwatch's log, a line per event,
//! at the level HAProxy gave it (`[ALERT]` as error, `[WARNING]` as warning, the rest
//! as info), with target `haproxy`.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube_common::sync;
use route_secrets::tls::SecurityLevel;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::runtime::{RuntimeError, one_shot};

/// Lines of HAProxy's output kept for error messages.
const LOG_TAIL: usize = 20;

/// How often the master CLI is asked while waiting for a start or a reload.
const POLL: Duration = Duration::from_millis(20);

/// Why HAProxy could not be started, reloaded or asked.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The binary could not be run.
    #[error("cannot run {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// HAProxy exited.
    #[error("HAProxy exited ({status}); its last lines: {log}")]
    Exited {
        /// Its exit status.
        status: ExitStatus,
        /// The end of its output.
        log: String,
    },
    /// HAProxy refused its configuration (`haproxy -c`, or a reload that failed to
    /// load: the old worker keeps serving).
    #[error("HAProxy refused its configuration {config}: {log}")]
    ConfigRefused {
        /// The configuration file.
        config: PathBuf,
        /// HAProxy's words.
        log: String,
    },
    /// No worker served within the deadline.
    #[error("HAProxy did not {what} within {timeout:?}{last_error}")]
    Timeout {
        /// Start or reload.
        what: &'static str,
        /// The deadline.
        timeout: Duration,
        /// The last master CLI error seen, if any (`: ...`).
        last_error: String,
    },
    /// The OpenSSL configuration could not be written.
    #[error("cannot write HAProxy's OpenSSL configuration {path}: {source}")]
    OpensslConf {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The master CLI failed.
    #[error("HAProxy's master CLI: {0}")]
    Master(#[from] RuntimeError),
    /// The task starting or reloading HAProxy ended without a result (it panicked or
    /// was aborted).
    #[error("HAProxy's {what} task failed: {source}")]
    Task {
        /// Start or reload.
        what: &'static str,
        /// The cause.
        #[source]
        source: tokio::task::JoinError,
    },
    /// The master CLI answered something unexpected.
    #[error("HAProxy's master CLI at {socket}: unexpected answer to `{command}`: {answer}")]
    Unexpected {
        /// The socket.
        socket: PathBuf,
        /// The command.
        command: &'static str,
        /// Its answer, summarised.
        answer: String,
    },
}

/// How to run HAProxy.
#[derive(Clone, Debug)]
pub struct ProcessOptions {
    /// The `haproxy` binary.
    pub binary: PathBuf,
    /// Its configuration (`-f`).
    pub config: PathBuf,
    /// The master CLI socket certwatch creates (`-S <path>,mode,600`).
    pub master_socket: PathBuf,
    /// How long a start or a reload may take (HAProxy loads every certificate: about
    /// 25 s for 10,000 on a small machine).
    pub load_timeout: Duration,
    /// How long one master CLI exchange may take.
    pub command_timeout: Duration,
    /// The OpenSSL security level HAProxy runs at: an `OPENSSL_CONF` at that level is
    /// written beside the master socket ([`ProcessOptions::openssl_conf`]). `None`:
    /// the daemon's `openssl_security_level` (run alone: the system's OpenSSL
    /// configuration, Debian's at 2).
    pub security_level: Option<SecurityLevel>,
    /// Without `security_level`: an `OPENSSL_CONF` written by others for HAProxy (the
    /// routes' configuration has one beside it).
    pub openssl_conf_file: Option<PathBuf>,
    /// HAProxy's standard output is certwatch's own, line for line (where a
    /// configuration's access log goes); off: it is logged.
    pub inherit_stdout: bool,
    /// HAProxy's warnings are its routine (on a configuration certwatch writes:
    /// proxies stopped by a reload, servers leaving maintenance): logged as
    /// information, and its alerts as warnings.
    pub routine_warnings: bool,
}

impl ProcessOptions {
    /// `binary` on `config`, its master socket at `master_socket`; 10 minutes for a
    /// load, 10 s for a master CLI command.
    pub fn new(
        binary: impl Into<PathBuf>,
        config: impl Into<PathBuf>,
        master_socket: impl Into<PathBuf>,
    ) -> Self {
        Self {
            binary: binary.into(),
            config: config.into(),
            master_socket: master_socket.into(),
            load_timeout: Duration::from_secs(600),
            command_timeout: Duration::from_secs(10),
            security_level: None,
            openssl_conf_file: None,
            inherit_stdout: false,
            routine_warnings: false,
        }
    }

    /// Where the `OPENSSL_CONF` for [`ProcessOptions::security_level`] is written: the
    /// master socket's path with `.openssl.cnf` added.
    pub fn openssl_conf(&self) -> PathBuf {
        let mut path = self.master_socket.clone().into_os_string();
        path.push(".openssl.cnf");
        PathBuf::from(path)
    }
}

/// How long an HAProxy left by an earlier run gets to end on `SIGTERM` (then on
/// `SIGKILL`).
const LEFTOVER_PATIENCE: Duration = Duration::from_secs(5);

/// One line of `show proc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proc {
    /// Its pid.
    pub pid: u32,
    /// Reloads it survived (for the master: reloads done).
    pub reloads: u32,
}

/// The master CLI's `show proc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Processes {
    /// The master.
    pub master: Proc,
    /// Reloads that failed (since the last that succeeded), from the master's line.
    pub failed_reloads: u32,
    /// Current workers (one, with `nbproc` gone).
    pub workers: Vec<Proc>,
    /// Workers of earlier loads still finishing their connections.
    pub old_workers: Vec<Proc>,
    /// The master's HAProxy version (major, minor), from its line's last column.
    pub version: Option<(u32, u32)>,
}

impl Processes {
    /// The worker of the latest load.
    pub fn current_worker(&self) -> Option<u32> {
        self.workers
            .iter()
            .min_by_key(|worker| worker.reloads)
            .map(|worker| worker.pid)
    }

    /// Whether a worker listed here may still be loading the configuration. From
    /// HAProxy 3.1 the master forks the worker first and the worker loads (the master
    /// CLI's `_loadstatus` answers once it has); earlier masters loaded the
    /// configuration before forking, so a listed worker had loaded it.
    pub fn lists_loading_workers(&self) -> bool {
        self.version.is_some_and(|version| version >= (3, 1))
    }
}

/// What the master CLI's `_loadstatus` says of the latest load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadStatus {
    /// The worker loaded the configuration and serves.
    Loaded,
    /// The load failed; HAProxy's start-up messages.
    Failed(String),
}

/// Parses `_loadstatus`: `Success=1` or `Success=0`, then after a `--` line the
/// start-up messages.
pub fn parse_load_status(answer: &str) -> Option<LoadStatus> {
    let mut lines = answer.lines();
    match lines.next()?.trim() {
        "Success=1" => Some(LoadStatus::Loaded),
        "Success=0" => {
            let log: Vec<&str> = lines.skip_while(|line| line.trim() == "--").collect();
            Some(LoadStatus::Failed(log.join("\n").trim().to_owned()))
        }
        _ => None,
    }
}

/// Parses `show proc`.
pub fn parse_processes(answer: &str) -> Option<Processes> {
    #[derive(PartialEq)]
    enum Section {
        Head,
        Workers,
        OldWorkers,
        Other,
    }
    let mut section = Section::Head;
    let mut master = None;
    let mut version = None;
    let mut failed_reloads = 0;
    let mut workers = Vec::new();
    let mut old_workers = Vec::new();
    for line in answer.lines().map(str::trim) {
        match line {
            "" => continue,
            "# workers" => section = Section::Workers,
            "# old workers" => section = Section::OldWorkers,
            _ if line.starts_with("# ") => section = Section::Other,
            _ if line.starts_with('#') => continue,
            _ => {
                let mut fields = line.split_whitespace();
                let (Some(pid), Some(kind), Some(reloads)) =
                    (fields.next(), fields.next(), fields.next())
                else {
                    continue;
                };
                let (Ok(pid), Ok(reloads)) = (pid.parse(), reloads.parse()) else {
                    continue;
                };
                let proc = Proc { pid, reloads };
                match (&section, kind) {
                    (Section::Head, "master") => {
                        // `5 [failed: 0]`
                        failed_reloads = line
                            .split_once("[failed:")
                            .and_then(|(_, rest)| rest.split_once(']'))
                            .and_then(|(count, _)| count.trim().parse().ok())
                            .unwrap_or(0);
                        version = line
                            .split_whitespace()
                            .next_back()
                            .and_then(super::runtime::major_minor);
                        master = Some(proc);
                    }
                    (Section::Workers, "worker") => workers.push(proc),
                    (Section::OldWorkers, "worker") => old_workers.push(proc),
                    _ => {}
                }
            }
        }
    }
    Some(Processes {
        master: master?,
        failed_reloads,
        workers,
        old_workers,
        version,
    })
}

/// A reload that succeeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reloaded {
    /// The worker serving now.
    pub worker: u32,
    /// How long the load took (from `reload` to the master answering again).
    pub took: Duration,
}

/// HAProxy's master CLI (`-S`).
#[derive(Clone, Debug)]
pub struct MasterCli {
    socket: PathBuf,
    timeout: Duration,
    /// The end of HAProxy's output when certwatch runs it, for failure messages.
    log: Option<LogTail>,
    /// The configuration, for failure messages.
    config: Option<PathBuf>,
}

impl MasterCli {
    /// The master CLI at `socket`; each command must complete within `timeout`.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
            log: None,
            config: None,
        }
    }

    /// The socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `show proc`.
    pub async fn processes(&self) -> Result<Processes, ProcessError> {
        let answer = one_shot(&self.socket, "show proc", self.timeout).await?;
        parse_processes(&answer).ok_or_else(|| ProcessError::Unexpected {
            socket: self.socket.clone(),
            command: "show proc",
            answer: super::runtime::summarize(&answer),
        })
    }

    /// `_loadstatus` (HAProxy 3.1 and later): how the latest load went, answered once
    /// no worker is loading any more, waited for at most `timeout` (a load's, not a
    /// command's: HAProxy 3.2.0 keeps a `_loadstatus` its client gave up on for good,
    /// and ten of them fill the master CLI, so it is asked once and waited for).
    pub async fn load_status(&self, timeout: Duration) -> Result<LoadStatus, ProcessError> {
        let answer = one_shot(&self.socket, "_loadstatus", timeout).await?;
        parse_load_status(&answer).ok_or_else(|| ProcessError::Unexpected {
            socket: self.socket.clone(),
            command: "_loadstatus",
            answer: super::runtime::summarize(&answer),
        })
    }

    /// HAProxy refused its configuration: `log`, or the end of its output when
    /// certwatch runs it.
    fn refused(&self, log: Option<String>) -> ProcessError {
        let log = log.filter(|log| !log.is_empty()).unwrap_or_else(|| {
            self.log
                .as_ref()
                .map(LogTail::text)
                .unwrap_or_else(|| "see HAProxy's log".to_owned())
        });
        ProcessError::ConfigRefused {
            config: self.config.clone().unwrap_or_default(),
            log,
        }
    }

    /// Waits until the master answers `show proc` as `accept` wants, with a worker that
    /// has loaded ([`Processes::lists_loading_workers`]), for at most `timeout`; `alive`
    /// is asked between attempts (an exited HAProxy ends the wait).
    async fn wait_for_worker(
        &self,
        what: &'static str,
        timeout: Duration,
        mut accept: impl FnMut(&Processes) -> bool,
        mut alive: impl FnMut() -> Result<(), ProcessError>,
    ) -> Result<Processes, ProcessError> {
        let deadline = Instant::now() + timeout;
        let mut last_error = String::new();
        loop {
            alive()?;
            match self.processes().await {
                Ok(processes) if accept(&processes) => {
                    if !processes.lists_loading_workers() {
                        return Ok(processes);
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.load_status(left).await {
                        Ok(LoadStatus::Loaded) => return Ok(processes),
                        Ok(LoadStatus::Failed(log)) => return Err(self.refused(Some(log))),
                        // Not answered by the deadline (checked below), or the master
                        // went away meanwhile (`alive` says so).
                        Err(error) => last_error = format!(": {error}"),
                    }
                }
                Ok(_) => last_error.clear(),
                // Refused or unanswered while the master loads: expected.
                Err(error) => last_error = format!(": {error}"),
            }
            if Instant::now() >= deadline {
                return Err(ProcessError::Timeout {
                    what,
                    timeout,
                    last_error,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Reloads HAProxy (the master CLI's `reload`) and waits until the master answers
    /// again, for at most `timeout`: the new worker, or why the load failed (the old
    /// worker then keeps serving).
    pub async fn reload(&self, timeout: Duration) -> Result<Reloaded, ProcessError> {
        self.reload_watching(timeout, || Ok(())).await
    }

    async fn reload_watching(
        &self,
        timeout: Duration,
        alive: impl FnMut() -> Result<(), ProcessError>,
    ) -> Result<Reloaded, ProcessError> {
        let before = self.processes().await?;
        let started = Instant::now();
        send_reload(&self.socket, self.timeout).await?;
        let after = self
            .wait_for_worker(
                "reload",
                timeout,
                |processes| processes.master.reloads > before.master.reloads,
                alive,
            )
            .await?;
        let took = started.elapsed();
        if after.failed_reloads > 0 {
            return Err(self.refused(None));
        }
        let worker = after
            .current_worker()
            .ok_or_else(|| ProcessError::Unexpected {
                socket: self.socket.clone(),
                command: "show proc",
                answer: "no worker after the reload".to_owned(),
            })?;
        Ok(Reloaded { worker, took })
    }
}

/// Sends the master CLI's `reload`. How the reload went is read from `show proc`
/// afterwards: HAProxy 2.6's master closes the connection when it re-executes, and
/// later ones answer once the new worker has loaded, which can take longer than a
/// command's `timeout`; neither is a failure of the command.
async fn send_reload(socket: &Path, timeout: Duration) -> Result<(), RuntimeError> {
    match one_shot(socket, "reload", timeout).await {
        Ok(_)
        | Err(
            RuntimeError::Io { .. } | RuntimeError::Closed { .. } | RuntimeError::Timeout { .. },
        ) => Ok(()),
        Err(error) => Err(error),
    }
}

/// The last lines of HAProxy's output. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct LogTail {
    /// Guards the last [`LOG_TAIL`] lines.
    lines: Arc<Mutex<VecDeque<String>>>,
    /// Output streams still being read: HAProxy's last words (why it exited) may still
    /// be in a pipe when its exit is seen.
    open: Arc<tokio::sync::watch::Sender<usize>>,
}

impl LogTail {
    /// Waits until every output stream reached its end, for at most `patience` (a
    /// process HAProxy left behind may hold a pipe open).
    pub async fn settled(&self, patience: Duration) {
        let mut open = self.open.subscribe();
        let _ = tokio::time::timeout(patience, open.wait_for(|open| *open == 0)).await;
    }

    /// Keeps `line`, dropping the oldest beyond the last [`LOG_TAIL`].
    pub(crate) fn push(&self, line: String) {
        let mut lines = sync::lock(&self.lines);
        if lines.len() == LOG_TAIL {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The kept lines, joined (`|` between them).
    pub fn text(&self) -> String {
        let lines = sync::lock(&self.lines);
        if lines.is_empty() {
            return "(no output)".to_owned();
        }
        lines.iter().cloned().collect::<Vec<_>>().join(" | ")
    }
}

/// Forwards HAProxy's output to the log, keeping its end; with `routine_warnings`,
/// HAProxy's warnings are logged as information and its alerts as warnings.
fn forward(stream: impl AsyncRead + Unpin + Send + 'static, tail: LogTail, routine_warnings: bool) {
    tail.open.send_modify(|open| *open += 1);
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let line = line.trim_end().to_owned();
            if line.is_empty() {
                continue;
            }
            if routine_warnings {
                if line.contains("[ALERT]") {
                    warn!(target: "haproxy", "{line}");
                } else {
                    info!(target: "haproxy", "{line}");
                }
            } else if line.contains("[ALERT]") {
                error!(target: "haproxy", "{line}");
            } else if line.contains("[WARNING]") {
                warn!(target: "haproxy", "{line}");
            } else {
                info!(target: "haproxy", "{line}");
            }
            tail.push(line);
        }
        tail.open.send_modify(|open| *open = open.saturating_sub(1));
    });
}

/// HAProxy's master process, run under certwatch's watchdog. Dropping it stops
/// HAProxy (softly, then for good after 10 s); use [`HaproxyProcess::stop`] to choose
/// how long its connections get.
#[derive(Debug)]
pub struct HaproxyProcess {
    /// The watchdog; it exits with HAProxy's status when HAProxy exits.
    child: Child,
    /// The watchdog's stdin: closing it stops HAProxy.
    lifeline: Option<tokio::process::ChildStdin>,
    /// The master's pid, as its master CLI says.
    master_pid: u32,
    master: MasterCli,
    options: ProcessOptions,
    tail: LogTail,
    /// How long the start took (spawn to the first worker serving).
    start_duration: Duration,
}

impl HaproxyProcess {
    /// Starts HAProxy and waits until its first worker serves (it has loaded every
    /// file its configuration names); returns the process and that worker's pid.
    pub async fn start(options: ProcessOptions) -> Result<(Self, u32), ProcessError> {
        let mut process = Self::spawn(options).await?;
        let started = Instant::now();
        let waited = {
            let Self {
                child,
                master,
                tail,
                options,
                ..
            } = &mut process;
            master
                .wait_for_worker(
                    "start",
                    options.load_timeout,
                    |processes| processes.current_worker().is_some(),
                    || check_alive(child, tail),
                )
                .await
        };
        let processes = with_last_words(waited, &process.tail).await?;
        let worker = processes
            .current_worker()
            .ok_or_else(|| ProcessError::Unexpected {
                socket: process.master.socket.clone(),
                command: "show proc",
                answer: "no worker".to_owned(),
            })?;
        process.start_duration = started.elapsed();
        process.master_pid = processes.master.pid;
        info!(
            pid = process.master_pid,
            worker,
            took = ?process.start_duration,
            config = %process.options.config.display(),
            "HAProxy started"
        );
        Ok((process, worker))
    }

    /// Starts HAProxy and returns at once, without waiting for a worker (whoever
    /// starts it this way watches the load itself, e.g. through the runtime API), once
    /// any HAProxy left running on the same configuration by an earlier run has ended.
    pub async fn spawn(options: ProcessOptions) -> Result<Self, ProcessError> {
        super::watchdog::stop_leftovers(&options.config, LEFTOVER_PATIENCE).await;
        // A socket left by an earlier run would make HAProxy's bind fail.
        let _ = std::fs::remove_file(&options.master_socket);
        let openssl_conf = match (options.security_level, &options.openssl_conf_file) {
            (Some(level), _) => {
                let path = options.openssl_conf();
                std::fs::write(&path, level.openssl_conf()).map_err(|source| {
                    ProcessError::OpensslConf {
                        path: path.clone(),
                        source,
                    }
                })?;
                Some(path)
            }
            (None, file) => file.clone(),
        };
        let env: Vec<(&str, &OsStr)> = openssl_conf
            .iter()
            .map(|path| ("OPENSSL_CONF", path.as_os_str()))
            .collect();
        let mut master_arg = options.master_socket.clone().into_os_string();
        master_arg.push(",mode,600");
        // In the foreground whatever the configuration says (`-db`): the watchdog's
        // child must be HAProxy's master.
        let watched = super::watchdog::spawn(
            &options.binary,
            &[
                OsStr::new("-W"),
                OsStr::new("-db"),
                OsStr::new("-S"),
                &master_arg,
                OsStr::new("-f"),
                options.config.as_os_str(),
            ],
            &env,
            options.inherit_stdout,
        )
        .map_err(|source| ProcessError::Spawn {
            binary: options.binary.clone(),
            source,
        })?;
        let mut child = watched.child;
        let tail = LogTail::default();
        if let Some(stdout) = child.stdout.take() {
            forward(stdout, tail.clone(), options.routine_warnings);
        }
        if let Some(stderr) = child.stderr.take() {
            forward(stderr, tail.clone(), options.routine_warnings);
        }
        let master = MasterCli {
            socket: options.master_socket.clone(),
            timeout: options.command_timeout,
            log: Some(tail.clone()),
            config: Some(options.config.clone()),
        };
        debug!(config = %options.config.display(), "HAProxy spawned");
        Ok(Self {
            child,
            lifeline: watched.lifeline,
            master_pid: 0,
            master,
            options,
            tail,
            start_duration: Duration::ZERO,
        })
    }

    /// How long the start took: from spawning HAProxy to its first worker serving
    /// (HAProxy's own cold load of its files, plus its start).
    pub fn start_duration(&self) -> Duration {
        self.start_duration
    }

    /// The master CLI.
    pub fn master(&self) -> &MasterCli {
        &self.master
    }

    /// The master's pid (`None` once HAProxy has exited).
    pub fn pid(&self) -> Option<u32> {
        self.child.id().map(|_| self.master_pid)
    }

    /// The end of HAProxy's output.
    pub fn log_tail(&self) -> String {
        self.tail.text()
    }

    /// Whether HAProxy has exited (and how).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Reloads HAProxy (see [`MasterCli::reload`]); an exit meanwhile is an error.
    pub async fn reload(&mut self) -> Result<Reloaded, ProcessError> {
        let timeout = self.options.load_timeout;
        let Self {
            child,
            master,
            tail,
            ..
        } = self;
        let reloaded = master
            .reload_watching(timeout, || check_alive(child, tail))
            .await;
        let reloaded = with_last_words(reloaded, tail).await?;
        debug!(worker = reloaded.worker, took = ?reloaded.took, "HAProxy reloaded");
        Ok(reloaded)
    }

    /// Asks the master to load the configuration and its files again (its master
    /// CLI's `reload`: the old worker serves until the new one does) and returns at
    /// once with what the master said before, for [`HaproxyProcess::load_failed`].
    pub async fn begin_reload(
        &mut self,
        command_timeout: Duration,
    ) -> Result<Processes, ProcessError> {
        let master = MasterCli::new(self.master.socket.clone(), command_timeout);
        // Just after a reload the master re-executes itself, and its CLI refuses
        // connections for a moment: it is asked again until it answers, HAProxy exits,
        // or `command_timeout` has passed (HAProxy is not given up for that moment).
        let deadline = Instant::now() + command_timeout;
        let before = loop {
            match master.processes().await {
                Ok(before) => break before,
                Err(error) if Instant::now() >= deadline || !self.running() => {
                    return Err(error);
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        };
        send_reload(master.socket(), command_timeout).await?;
        Ok(before)
    }

    /// HAProxy's words when the load begun after `before` failed (its old worker keeps
    /// serving); `None` while it loads, once it has loaded, or while the master does not
    /// answer.
    pub async fn load_failed(
        &self,
        before: &Processes,
        command_timeout: Duration,
    ) -> Option<String> {
        let master = MasterCli::new(self.master.socket.clone(), command_timeout);
        let now = master.processes().await.ok()?;
        (now.master.reloads > before.master.reloads && now.failed_reloads > 0)
            .then(|| self.tail.text())
    }

    /// Whether HAProxy still runs.
    pub fn running(&mut self) -> bool {
        self.exited().is_none()
    }

    /// Stops HAProxy: a soft stop (`SIGUSR1`: listeners close, workers finish their
    /// connections) for at most `drain`'s bound, then a hard stop (`SIGTERM`), then
    /// `SIGKILL`; a cut of `drain` ends the soft stop at once. Says which ended it.
    pub async fn stop(mut self, drain: &Drain) -> Stopped {
        let master = if self.exited().is_some() {
            None
        } else if self.master_pid != 0 {
            rustix::process::Pid::from_raw(self.master_pid.cast_signed())
        } else {
            // Spawned without waiting for a worker: the watchdog's child is the master.
            self.child
                .id()
                .and_then(|watchdog| super::watchdog::master_of(watchdog, &self.options.config))
        };
        let stopped = stop_master(&mut self.child, master, drain).await;
        // The watchdog ends with HAProxy; closing its stdin is then a no-op.
        drop(self.lifeline.take());
        stopped
    }
}

/// How long HAProxy's connections may take to finish when certwatch stops HAProxy (a
/// soft stop), and a cut that ends that wait at once (a second stop signal). Cheap to
/// clone: every clone shares the cut.
#[derive(Clone, Debug)]
pub struct Drain {
    /// The longest a soft stop lasts before HAProxy is stopped hard.
    pub bound: Duration,
    cut: CancellationToken,
}

impl Drain {
    /// A soft stop of at most `bound`.
    pub fn new(bound: Duration) -> Self {
        Self {
            bound,
            cut: CancellationToken::new(),
        }
    }

    /// From now on HAProxy is stopped at once: a soft stop in progress ends now, and a
    /// stop still to come is hard from the start.
    pub fn cut(&self) {
        self.cut.cancel();
    }

    /// Whether [`Drain::cut`] was called.
    pub fn is_cut(&self) -> bool {
        self.cut.is_cancelled()
    }
}

impl Default for Drain {
    /// 10 s: for a HAProxy certwatch runs outside a deployment that says otherwise.
    fn default() -> Self {
        Self::new(Duration::from_secs(10))
    }
}

/// How often the soft stop's signal is sent while HAProxy drains.
const SOFT_STOP_REPEAT: Duration = Duration::from_secs(1);

/// How long HAProxy gets to exit on `SIGTERM` (a hard stop: it closes every
/// connection) before `SIGKILL`.
const HARD_STOP_PATIENCE: Duration = Duration::from_secs(5);

/// Stops the HAProxy master `master` whose exit `watched` (its watchdog, or itself)
/// reports: soft, then hard after `drain`'s bound or on its cut, then `SIGKILL`.
/// `master` `None` (HAProxy's pid is unknown): `watched` is killed at once, and the
/// caller's closing of the watchdog's lifeline has the watchdog stop HAProxy.
pub(crate) async fn stop_master(
    watched: &mut Child,
    master: Option<rustix::process::Pid>,
    drain: &Drain,
) -> Stopped {
    if matches!(watched.try_wait(), Ok(Some(_))) {
        return Stopped::AlreadyExited;
    }
    let Some(master) = master else {
        warn!("HAProxy's pid is unknown: its watchdog stops it");
        let _ = watched.kill().await;
        return Stopped::Killed;
    };
    let signal = |signal| {
        let _ = rustix::process::kill_process(master, signal);
    };
    let mut outcome = None;
    if !drain.is_cut() {
        info!(bound = ?drain.bound, "HAProxy stops softly: its connections finish, for at most the bound");
        let bound = tokio::time::sleep(drain.bound);
        tokio::pin!(bound);
        // A master in the middle of a reload (re-executing itself) does not hear the
        // signal: it is sent again until HAProxy has exited (a soft stop in progress
        // takes it as a no-op).
        let mut again = tokio::time::interval(SOFT_STOP_REPEAT);
        loop {
            tokio::select! {
                _ = watched.wait() => return Stopped::Soft,
                _ = again.tick() => signal(rustix::process::Signal::USR1),
                () = &mut bound => {
                    warn!(bound = ?drain.bound, "HAProxy did not finish its connections within the bound; stopping it hard");
                    outcome = Some(Stopped::Bound);
                    break;
                }
                () = drain.cut.cancelled() => break,
            }
        }
    }
    let outcome = outcome.unwrap_or_else(|| {
        info!("stopping HAProxy at once: its connections are closed");
        Stopped::Cut
    });
    signal(rustix::process::Signal::TERM);
    if tokio::time::timeout(HARD_STOP_PATIENCE, watched.wait())
        .await
        .is_ok()
    {
        return outcome;
    }
    signal(rustix::process::Signal::KILL);
    let _ = watched.kill().await;
    Stopped::Killed
}

/// How [`HaproxyProcess::stop`] ended HAProxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// It had exited already.
    AlreadyExited,
    /// The soft stop: every connection finished within the drain's bound.
    Soft,
    /// A hard stop (`SIGTERM`) at the drain's bound.
    Bound,
    /// A hard stop (`SIGTERM`) on the drain's cut.
    Cut,
    /// `SIGKILL`: it did not end on `SIGTERM`.
    Killed,
}

/// An exit's error with HAProxy's output read to its end: the exit is seen by its
/// status, possibly before the lines that say why were read from the pipes.
async fn with_last_words<T>(
    result: Result<T, ProcessError>,
    tail: &LogTail,
) -> Result<T, ProcessError> {
    match result {
        Err(ProcessError::Exited { status, .. }) => {
            tail.settled(Duration::from_secs(2)).await;
            Err(ProcessError::Exited {
                status,
                log: tail.text(),
            })
        }
        other => other,
    }
}

fn check_alive(child: &mut Child, tail: &LogTail) -> Result<(), ProcessError> {
    match child.try_wait() {
        Ok(Some(status)) => Err(ProcessError::Exited {
            status,
            log: tail.text(),
        }),
        _ => Ok(()),
    }
}

/// `haproxy -c -f config`: HAProxy's verdict on the configuration and every file it
/// loads (as long as a real load: every certificate is read).
pub async fn check_config(binary: &Path, config: &Path) -> Result<(), ProcessError> {
    let output = Command::new(binary)
        .arg("-c")
        .arg("-f")
        .arg(config)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| ProcessError::Spawn {
            binary: binary.to_owned(),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("[ALERT]") || line.contains("[WARNING]"))
        .collect();
    Err(ProcessError::ConfigRefused {
        config: config.to_owned(),
        log: if lines.is_empty() {
            super::runtime::summarize(&text)
        } else {
            lines.join(" | ")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_proc_is_read() {
        let answer = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
            21371           master          3 [failed: 0]   0d00h02m20s     2.6.12-1+deb12u4\n\
            # workers\n\
            29577           worker          0               0d00h00m02s     2.6.12-1+deb12u4\n\
            # old workers\n\
            27563           worker          2               0d00h00m26s     2.6.12-1+deb12u4\n\
            # programs\n\n";
        let processes = parse_processes(answer).unwrap();
        assert_eq!(
            processes.master,
            Proc {
                pid: 21371,
                reloads: 3
            }
        );
        assert_eq!(processes.failed_reloads, 0);
        assert_eq!(processes.current_worker(), Some(29577));
        assert_eq!(processes.old_workers.len(), 1);
        let failed = "#<PID> <type> <reloads> <uptime> <version>\n1 master 2 [failed: 1] 0d 2.6\n# workers\n7 worker 1 0d 2.6\n";
        let processes = parse_processes(failed).unwrap();
        assert_eq!(processes.failed_reloads, 1);
        assert_eq!(processes.current_worker(), Some(7));
        assert!(parse_processes("Unknown command").is_none());
    }

    #[test]
    fn the_master_version_says_whether_a_listed_worker_may_still_load() {
        let show_proc = |version: &str| {
            format!(
                "#<PID> <type> <reloads> <uptime> <version>\n\
                 10 master 0 [failed: 0] 0d00h00m01s {version}\n\
                 # workers\n\
                 11 worker 0 0d00h00m01s {version}\n"
            )
        };
        for (version, loading) in [
            ("2.6.12-1+deb12u4", false),
            ("3.0.11", false),
            ("3.1.0", true),
            ("3.2.0-e134140d2", true),
        ] {
            let processes = parse_processes(&show_proc(version)).unwrap();
            assert_eq!(processes.lists_loading_workers(), loading, "{version}");
        }
        assert_eq!(
            parse_processes(&show_proc("3.2.0-e134140d2"))
                .unwrap()
                .version,
            Some((3, 2))
        );
    }

    #[test]
    fn load_status_is_read() {
        assert_eq!(
            parse_load_status("Success=1\n--\n[NOTICE] loaded\n"),
            Some(LoadStatus::Loaded)
        );
        assert_eq!(
            parse_load_status(
                "Success=0\n--\n[ALERT] (7) : config : parsing [/c.cfg:3] : unknown keyword 'bogus'\n"
            ),
            Some(LoadStatus::Failed(
                "[ALERT] (7) : config : parsing [/c.cfg:3] : unknown keyword 'bogus'".to_owned()
            ))
        );
        assert_eq!(parse_load_status("Unknown command: '_loadstatus'\n"), None);
    }

    /// A master CLI as HAProxy 3.2's answers a reload: the reload count goes up and the
    /// new worker is listed at once, while `_loadstatus` is answered `outcome` only
    /// after `loading` (the worker loads meanwhile). Every command is logged.
    async fn serve_like_a_3_2_master(
        listener: tokio::net::UnixListener,
        loading: Duration,
        outcome: &'static str,
        log: Arc<Mutex<Vec<String>>>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut reloaded = false;
        let mut holding = Vec::new();
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut command = String::new();
            stream.read_to_string(&mut command).await.unwrap();
            let command = command.trim().to_owned();
            sync::lock(&log).push(command.clone());
            let answer = match command.as_str() {
                "show proc" => {
                    let (reloads, worker) = if reloaded { (1, 21) } else { (0, 20) };
                    format!(
                        "#<PID> <type> <reloads> <uptime> <version>\n\
                         10 master {reloads} [failed: 0] 0d00h00m01s 3.2.0-test\n\
                         # workers\n\
                         {worker} worker 0 0d00h00m00s 3.2.0-test\n"
                    )
                }
                "reload" => {
                    reloaded = true;
                    // Answered once the load is over; the client does not wait.
                    holding.push(stream);
                    continue;
                }
                "_loadstatus" => {
                    tokio::spawn(async move {
                        tokio::time::sleep(loading).await;
                        let _ = stream.write_all(outcome.as_bytes()).await;
                    });
                    continue;
                }
                _ => "Unknown command.\n".to_owned(),
            };
            stream.write_all(answer.as_bytes()).await.unwrap();
        }
    }

    async fn reload_a_3_2_master(
        loading: Duration,
        outcome: &'static str,
    ) -> (Result<Reloaded, ProcessError>, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("master.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let server = tokio::spawn(serve_like_a_3_2_master(
            listener,
            loading,
            outcome,
            Arc::clone(&log),
        ));
        let master = MasterCli::new(&socket, Duration::from_millis(100));
        let reloaded = master.reload(Duration::from_secs(60)).await;
        server.abort();
        let log = sync::lock(&log).clone();
        (reloaded, log)
    }

    /// The load outlasts a command's timeout (100 ms): `_loadstatus` is asked once and
    /// waited for (HAProxy 3.2.0 keeps every ask its client abandoned, for good).
    #[tokio::test]
    async fn a_3_2_reload_is_over_when_the_master_says_the_worker_loaded() {
        let (reloaded, log) =
            reload_a_3_2_master(Duration::from_millis(500), "Success=1\n--\n").await;
        let reloaded = reloaded.unwrap();
        assert_eq!(reloaded.worker, 21);
        let asks = log
            .iter()
            .filter(|command| *command == "_loadstatus")
            .count();
        assert_eq!(asks, 1, "{log:?}");
        assert_eq!(log.last().map(String::as_str), Some("_loadstatus"));
    }

    #[tokio::test]
    async fn a_3_2_reload_that_failed_says_what_haproxy_said() {
        let (reloaded, _) = reload_a_3_2_master(
            Duration::ZERO,
            "Success=0\n--\n[ALERT] (10) : unknown keyword 'bogus'\n",
        )
        .await;
        match reloaded {
            Err(ProcessError::ConfigRefused { log, .. }) => {
                assert_eq!(log, "[ALERT] (10) : unknown keyword 'bogus'");
            }
            other => panic!("{other:?}"),
        }
    }
}
