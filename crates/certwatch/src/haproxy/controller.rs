//! The HAProxy controller: one task that owns how HAProxy gets certwatch's state.
//!
//! Every decision below is [`super::machine`]'s, a pure state machine; this task is
//! its driver: it feeds the machine what was published, the answers of the runtime
//! API, and the ends of starts and reloads, and performs what the machine asks (runtime
//! API batches, starts, reloads through the master CLI, refusal reports, metrics).
//!
//! **Start-up.**
//!
//! - when certwatch runs HAProxy ([`HaproxyMode::Managed`]), nothing reaches HAProxy
//!   before the cert directory is complete (every route present at start-up decided,
//!   its bundle and the crt-list on disk); then certwatch starts it on those files:
//!   HAProxy loads every certificate itself, which is its fastest way to hold
//!   thousands of them. The runtime API is used for changes only;
//! - when HAProxy runs on its own ([`HaproxyMode::External`]), certwatch reads what it
//!   holds (`show ssl cert`, each certificate's SHA-1, `show ssl crt-list -n`) as soon
//!   as the first route is decided, and pushes each decided route's certificate that
//!   HAProxy holds nothing of while the others are still being decided
//!   ([`Haproxy::publish_decided`]); what it would remove or replace waits for the
//!   complete listing, since a half-built set must not take anything away from a
//!   running HAProxy. Then the whole difference goes; with its master socket, a
//!   difference larger than a reload costs is loaded by a reload instead.
//!
//! **Changes** ([`Haproxy::publish`]) are coalesced per certificate (only the newest
//! version is pushed), oldest change first, in batches pipelined over one runtime API
//! connection ([`super::runtime`]); a batch's work is its certificates' commands
//! ([`super::certs`]). Changes that arrive while a batch runs wait for the next one.
//!
//! **Reloads** (through the master CLI, [`super::process`]) happen for a certificate
//! too large for the runtime API (its file is loaded instead), for a backlog longer to
//! push than HAProxy takes to load its files, and on request ([`Haproxy::request_reload`],
//! after a new configuration). They are coalesced and at least
//! [`HaproxyOptions::min_reload_interval`] apart. While HAProxy loads, the old worker
//! keeps serving and changes keep going to it; once the new worker serves, what changed
//! after the reload began is pushed to it again (it may have loaded an older file).
//!
//! **What is known.** Knowledge of what HAProxy holds belongs to one process (its pid
//! and start time). After certwatch's own start or reload, the new worker holds what
//! the files held when it loaded them: every certificate that did not change since the
//! reload began is known without asking (two `show` commands check names and lines).
//! A process certwatch did not load (a restart by someone else, or a first contact) is
//! read certificate by certificate. Any answer that contradicts the knowledge makes it
//! read again.
//!
//! **Isolation.** Every certificate's commands stand alone: one HAProxy refuses
//! (material it rejects; a bundle too large for one request when no reload can load
//! its file) is refused alone, counted in `certwatch_haproxy_refusals_total`, logged
//! once per version, and is not retried until its material changes; every other
//! certificate goes on.
//!
//! **Served.** [`HaproxyStatus`] says whether HAProxy answers, how many admitted routes
//! it does not serve yet, since when the oldest change waits, and whether every route of
//! the first complete listing (start-up) has been served: `/readyz` waits for that.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kube_common::backoff::BackoffPolicy;
use kube_common::sync;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::machine::{
    Action, Count, Event, HaproxyStatus, Loaded, Machine, MachineOptions, Report,
};
use super::process::{Drain, HaproxyProcess, MasterCli, ProcessError, ProcessOptions, Reloaded};
use super::runtime::{RuntimeClient, RuntimeOptions, current_instance};
use crate::cert_dir::{CrtChange, CrtEntry};
use crate::file_loads::FileLoads;
use crate::metrics::Metrics;
use crate::metrics::haproxy::{RefusalReason, ReloadReason};

/// Who runs HAProxy.
#[derive(Clone, Debug)]
pub enum HaproxyMode {
    /// HAProxy runs on its own (certificates only: its configuration is the user's).
    External {
        /// Its master CLI socket, when it runs in master-worker mode: lets certwatch
        /// reload it for what the runtime API cannot carry.
        master_socket: Option<PathBuf>,
    },
    /// certwatch runs HAProxy as its child, once the files are complete.
    Managed(ProcessOptions),
}

/// Settings of the HAProxy controller.
#[derive(Clone, Debug)]
pub struct HaproxyOptions {
    /// HAProxy's stats socket (`stats socket PATH level admin`): the runtime API.
    pub socket: PathBuf,
    /// Who runs HAProxy.
    pub mode: HaproxyMode,
    /// How long the runtime API may stay silent while answers are due.
    pub command_timeout: Duration,
    /// Delays between retries after a failure (client-go's backoff: 0.8 s doubling
    /// to 30 s).
    pub retry: BackoffPolicy,
    /// How often HAProxy's identity is checked when nothing changes (to notice a
    /// restart that loaded other files, or HAProxy going away).
    pub check_interval: Duration,
    /// Certificates per batch at most.
    pub batch_limit: usize,
    /// Bytes of payload per batch at most.
    pub batch_bytes: usize,
    /// Least time between two reloads.
    pub min_reload_interval: Duration,
    /// How long a managed HAProxy may take to finish its connections when certwatch
    /// stops, and the cut that stops it at once.
    pub drain: Drain,
    /// The loads of the cert directory's files ([`crate::cert_dir::CertDir::file_loads`]):
    /// each start or reload certwatch asks of HAProxy is one, so that no file a crt-list
    /// it may read names is removed while it loads.
    pub file_loads: FileLoads,
    /// Certificates HAProxy refused before (an earlier run's refusals, kept in the cert
    /// directory): name → the refused material's digest. Refused from the start: not
    /// pushed again until their material changes.
    pub refused: HashMap<String, [u8; 32]>,
}

impl HaproxyOptions {
    /// HAProxy run by someone else, its runtime API at `socket`.
    pub fn external(socket: impl Into<PathBuf>) -> Self {
        Self::with_mode(
            socket,
            HaproxyMode::External {
                master_socket: None,
            },
        )
    }

    /// HAProxy run by someone else, its runtime API at `socket`, its master CLI at
    /// `master_socket` when it has one.
    pub fn with_master(socket: impl Into<PathBuf>, master_socket: Option<PathBuf>) -> Self {
        Self::with_mode(socket, HaproxyMode::External { master_socket })
    }

    /// HAProxy run by certwatch as `process` says, its runtime API at `socket` (the
    /// configuration's `stats socket`).
    pub fn managed(socket: impl Into<PathBuf>, process: ProcessOptions) -> Self {
        Self::with_mode(socket, HaproxyMode::Managed(process))
    }

    fn with_mode(socket: impl Into<PathBuf>, mode: HaproxyMode) -> Self {
        Self {
            socket: socket.into(),
            mode,
            command_timeout: Duration::from_secs(10),
            retry: BackoffPolicy::default(),
            check_interval: Duration::from_secs(5),
            batch_limit: 256,
            batch_bytes: 2 * 1024 * 1024,
            min_reload_interval: Duration::from_secs(5),
            drain: Drain::default(),
            file_loads: FileLoads::new(),
            refused: HashMap::new(),
        }
    }
}

/// Changes waiting for the controller task, coalesced per certificate.
#[derive(Debug, Default)]
struct InboxState {
    /// Certificate name → its newest line (`None`: gone) and when its oldest
    /// unhandled change came.
    changes: HashMap<String, (Option<CrtEntry>, std::time::Instant)>,
    /// Certificates decided before the first complete listing: name → line and
    /// when it was published (see [`Haproxy::publish_decided`]).
    decided: HashMap<String, (CrtEntry, std::time::Instant)>,
    /// A complete listing was published.
    complete: bool,
    resync: bool,
    reload: Option<ReloadReason>,
    closed: bool,
}

#[derive(Debug, Default)]
struct Inbox {
    /// Guards the changes published and not yet taken by the task.
    state: Mutex<InboxState>,
    notify: Notify,
}

impl Inbox {
    fn update(&self, update: impl FnOnce(&mut InboxState)) {
        update(&mut sync::lock(&self.state));
        self.notify.notify_one();
    }

    fn take(&self) -> InboxState {
        let mut state = sync::lock(&self.state);
        let closed = state.closed;
        let taken = std::mem::take(&mut *state);
        state.closed = closed;
        taken
    }
}

/// Handle of the controller task.
#[derive(Debug)]
pub struct Haproxy {
    inbox: Arc<Inbox>,
    status: watch::Receiver<HaproxyStatus>,
    rejected: watch::Receiver<Rejected>,
    runtime: RuntimeClient,
    task: JoinHandle<()>,
}

impl Haproxy {
    /// Starts the controller. `crt_list` is the list's path as HAProxy's configuration
    /// names it; certificates whose names start with `managed_prefix` are certwatch's.
    pub fn spawn(
        options: HaproxyOptions,
        crt_list: String,
        managed_prefix: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        let runtime = RuntimeClient::spawn(RuntimeOptions {
            socket: options.socket.clone(),
            timeout: options.command_timeout,
        });
        let inbox = Arc::new(Inbox::default());
        let (status_tx, status) = watch::channel(HaproxyStatus::default());
        let (rejected_tx, rejected) = watch::channel(Arc::new(options.refused.clone()));
        let external_master = match &options.mode {
            HaproxyMode::External {
                master_socket: Some(socket),
            } => Some(MasterCli::new(socket, options.command_timeout)),
            _ => None,
        };
        let machine = Machine::new(MachineOptions {
            socket: options.socket.clone(),
            list: crt_list,
            prefix: managed_prefix,
            managed: matches!(options.mode, HaproxyMode::Managed(_)),
            external_master: external_master.is_some(),
            retry: options.retry,
            check_interval: options.check_interval,
            batch_limit: options.batch_limit,
            batch_bytes: options.batch_bytes,
            min_reload_interval: options.min_reload_interval,
            refused: options.refused.clone(),
            seed: rand::random(),
        });
        let controller = Controller {
            options,
            machine,
            metrics,
            runtime: runtime.clone(),
            inbox: Arc::clone(&inbox),
            status: status_tx,
            rejected: rejected_tx,
            process: None,
            external_master,
            start_task: None,
            reload_task: None,
        };
        let task = tokio::spawn(controller.run());
        Self {
            inbox,
            status,
            rejected,
            runtime,
            task,
        }
    }

    /// The certificates whose material HAProxy rejected, and their changes: their lines
    /// must stay out of the crt-list file until their material changes.
    pub fn rejected(&self) -> watch::Receiver<Rejected> {
        self.rejected.clone()
    }

    /// Lines changed in the cert directory (files written): bring HAProxy there.
    /// `complete` marks the first complete listing (start-up decided).
    pub fn publish(&self, changes: Vec<CrtChange>, complete: bool) {
        if changes.is_empty() && !complete {
            return;
        }
        let now = std::time::Instant::now();
        self.inbox.update(|state| {
            state.complete |= complete;
            for change in changes {
                match state.changes.get_mut(&change.name) {
                    Some(slot) => slot.0 = change.entry,
                    None => {
                        state.changes.insert(change.name, (change.entry, now));
                    }
                }
            }
        });
    }

    /// Routes' certificates decided before start-up is (their bundles on disk), for a
    /// HAProxy run by others: each goes to it at once if it holds nothing under that
    /// name; anything else waits for the complete listing ([`Haproxy::publish`]), which
    /// names them again. Only entries with a line count.
    pub fn publish_decided(&self, decided: &[CrtChange]) {
        if decided.is_empty() {
            return;
        }
        let now = std::time::Instant::now();
        self.inbox.update(|state| {
            for change in decided {
                if let Some(entry) = &change.entry {
                    state
                        .decided
                        .insert(change.name.clone(), (entry.clone(), now));
                }
            }
        });
    }

    /// A handle for others beside the certificates (backends, servers, maps): the
    /// runtime API connection, reload requests, the status.
    pub fn handle(&self) -> HaproxyHandle {
        HaproxyHandle {
            inbox: Arc::clone(&self.inbox),
            status: self.status.clone(),
            runtime: self.runtime.clone(),
        }
    }

    /// Forget what HAProxy is believed to hold, read it again and bring it to the
    /// published state.
    pub fn resync(&self) {
        self.inbox.update(|state| state.resync = true);
    }

    /// Reload HAProxy (a new configuration is in place), as soon as the least interval
    /// between reloads allows; requests coalesce. Needs a master CLI (managed HAProxy,
    /// or an external one with its master socket); without one it is logged and
    /// dropped.
    pub fn request_reload(&self, reason: ReloadReason) {
        self.inbox.update(|state| state.reload = Some(reason));
    }

    /// The controller's state, and its changes.
    pub fn status(&self) -> watch::Receiver<HaproxyStatus> {
        self.status.clone()
    }

    /// The runtime API client (one persistent connection, shared): for commands about
    /// servers, maps and backends, beside the certificates.
    pub fn runtime(&self) -> RuntimeClient {
        self.runtime.clone()
    }

    /// Pushes what is pending, stops a HAProxy certwatch runs (letting it finish its
    /// connections), and ends the task.
    pub async fn close(self) {
        let Self { inbox, task, .. } = self;
        inbox.update(|state| state.closed = true);
        let _ = task.await;
    }
}

/// What others than the certificates' controller may do with HAProxy; cheap to clone.
#[derive(Clone, Debug)]
pub struct HaproxyHandle {
    inbox: Arc<Inbox>,
    status: watch::Receiver<HaproxyStatus>,
    runtime: RuntimeClient,
}

impl HaproxyHandle {
    /// The runtime API client (the controller's persistent connection, shared).
    pub fn runtime(&self) -> RuntimeClient {
        self.runtime.clone()
    }

    /// Reload HAProxy (see [`Haproxy::request_reload`]).
    pub fn request_reload(&self, reason: ReloadReason) {
        self.inbox.update(|state| state.reload = Some(reason));
    }

    /// The controller's state, and its changes.
    pub fn status(&self) -> watch::Receiver<HaproxyStatus> {
        self.status.clone()
    }
}

/// Certificates whose material HAProxy rejected (name → bundle digest): their lines
/// are left out of the crt-list file, so that HAProxy's next load of its files (a
/// reload, a restart) does not fail on them and take every other route down.
pub type Rejected = Arc<HashMap<String, [u8; 32]>>;

/// A start's result: the process and its first worker.
type StartResult = Result<(Box<HaproxyProcess>, u32), ProcessError>;

/// What woke the task.
enum Wake {
    Inbox,
    Started(StartResult),
    Reloaded(Result<Reloaded, ProcessError>),
    Timer,
}

/// The driver: performs the [`Machine`]'s actions over the runtime API connection,
/// the master CLI and the process, and feeds their results back.
struct Controller {
    options: HaproxyOptions,
    machine: Machine,
    metrics: Arc<Metrics>,
    runtime: RuntimeClient,
    inbox: Arc<Inbox>,
    status: watch::Sender<HaproxyStatus>,
    rejected: watch::Sender<Rejected>,
    /// The HAProxy certwatch runs, once started.
    process: Option<HaproxyProcess>,
    /// An external HAProxy's master CLI, when it has one.
    external_master: Option<MasterCli>,
    start_task: Option<JoinHandle<StartResult>>,
    reload_task: Option<JoinHandle<Result<Reloaded, ProcessError>>>,
}

async fn join_start(task: &mut Option<JoinHandle<StartResult>>) -> StartResult {
    match task {
        Some(handle) => {
            let result = match handle.await {
                Ok(result) => result,
                Err(join) => Err(ProcessError::Task {
                    what: "start",
                    source: join,
                }),
            };
            *task = None;
            result
        }
        None => std::future::pending().await,
    }
}

async fn join_reload(
    task: &mut Option<JoinHandle<Result<Reloaded, ProcessError>>>,
) -> Result<Reloaded, ProcessError> {
    match task {
        Some(handle) => {
            let result = match handle.await {
                Ok(result) => result,
                Err(join) => Err(ProcessError::Task {
                    what: "reload",
                    source: join,
                }),
            };
            *task = None;
            result
        }
        None => std::future::pending().await,
    }
}

impl Controller {
    async fn run(mut self) {
        loop {
            let wake_at = self.machine.next_wake(std::time::Instant::now());
            let sleep = async {
                match wake_at {
                    Some(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
                    None => std::future::pending().await,
                }
            };
            let wake = tokio::select! {
                () = self.inbox.notify.notified() => Wake::Inbox,
                started = join_start(&mut self.start_task) => Wake::Started(started),
                reloaded = join_reload(&mut self.reload_task) => Wake::Reloaded(reloaded),
                () = sleep => Wake::Timer,
            };
            match wake {
                Wake::Started(result) => {
                    let event = self.started(result);
                    self.feed(event).await;
                }
                Wake::Reloaded(result) => {
                    let loaded = result.map(|reloaded| Loaded {
                        worker: reloaded.worker,
                        took: reloaded.took,
                    });
                    self.feed(Event::Reloaded(loaded)).await;
                }
                Wake::Inbox | Wake::Timer => {}
            }
            let closed = self.take_inbox().await;
            self.watch_process().await;
            self.feed(Event::Timer).await;
            self.publish_status();
            if closed {
                break;
            }
        }
        self.shutdown().await;
    }

    /// Feeds `event` to the machine and performs what it says, feeding the answers
    /// back until it waits for nothing.
    async fn feed(&mut self, event: Event) {
        let mut actions: VecDeque<Action> =
            self.machine.step(std::time::Instant::now(), event).into();
        while let Some(action) = actions.pop_front() {
            if let Some(answer) = self.perform(action).await {
                let more = self.machine.step(std::time::Instant::now(), answer);
                actions.extend(more);
            }
        }
    }

    /// Performs one action; the event that answers it, when it is an exchange.
    async fn perform(&mut self, action: Action) -> Option<Event> {
        match action {
            Action::Execute(commands) => {
                return Some(Event::Answered(self.runtime.execute(commands).await));
            }
            Action::CheckIdentity => {
                let current =
                    current_instance(&self.options.socket, self.options.command_timeout).await;
                let connected = self.runtime.connected();
                return Some(Event::Identity { current, connected });
            }
            Action::Reconnect => self.runtime.reconnect().await,
            Action::Start => self.start(),
            Action::Reload(reason) => self.reload(reason),
            Action::CancelReload => {
                if let Some(reload) = self.reload_task.take() {
                    reload.abort();
                }
            }
            Action::Report(report) => self.report(report),
            Action::Count(count) => self.count(count),
        }
        None
    }

    /// Takes the published changes into the machine; returns whether the controller
    /// is closing.
    async fn take_inbox(&mut self) -> bool {
        let taken = self.inbox.take();
        if taken.resync {
            self.feed(Event::Resync).await;
        }
        if let Some(reason) = taken.reload {
            self.feed(Event::ReloadRequested(reason)).await;
        }
        for (name, (entry, arrived)) in taken.decided {
            self.feed(Event::Decided {
                name,
                entry,
                arrived,
            })
            .await;
        }
        for (name, (entry, arrived)) in taken.changes {
            self.feed(Event::Changed {
                name,
                entry,
                arrived,
            })
            .await;
        }
        if taken.complete {
            self.feed(Event::ListingComplete).await;
        }
        taken.closed
    }

    /// A managed HAProxy that exited is said to the machine.
    async fn watch_process(&mut self) {
        let Some(process) = self.process.as_mut() else {
            return;
        };
        let Some(status) = process.exited() else {
            return;
        };
        error!(
            %status,
            log = %process.log_tail(),
            "HAProxy exited; starting it again"
        );
        self.process = None;
        self.feed(Event::Exited).await;
    }

    fn start(&mut self) {
        let HaproxyMode::Managed(options) = &self.options.mode else {
            return;
        };
        let options = options.clone();
        info!(
            binary = %options.binary.display(),
            config = %options.config.display(),
            "starting HAProxy on the complete files"
        );
        // The load lasts as long as the task (ended, or aborted).
        let loading = self.options.file_loads.begin();
        self.start_task = Some(tokio::spawn(async move {
            let _loading = loading;
            HaproxyProcess::start(options)
                .await
                .map(|(process, worker)| (Box::new(process), worker))
        }));
    }

    fn started(&mut self, result: StartResult) -> Event {
        Event::Started(result.map(|(process, worker)| {
            let process = *process;
            let took = process.start_duration();
            self.process = Some(process);
            Loaded { worker, took }
        }))
    }

    fn reload(&mut self, reason: ReloadReason) {
        let master = match &self.options.mode {
            HaproxyMode::Managed(_) => self.process.as_ref().map(|p| p.master().clone()),
            HaproxyMode::External { .. } => self.external_master.clone(),
        };
        let Some(master) = master else {
            // The machine reloads only what it knows can be reloaded.
            warn!(
                reason = reason.as_str(),
                "no master CLI to reload HAProxy through"
            );
            return;
        };
        let timeout = match &self.options.mode {
            HaproxyMode::Managed(options) => options.load_timeout,
            HaproxyMode::External { .. } => Duration::from_secs(600),
        };
        // The load lasts as long as the task (ended, or aborted).
        let loading = self.options.file_loads.begin();
        self.reload_task = Some(tokio::spawn(async move {
            let _loading = loading;
            master.reload(timeout).await
        }));
    }

    fn report(&mut self, report: Report) {
        match report {
            Report::Refused {
                name,
                digest,
                reason: RefusalReason::Rejected,
            } => {
                self.rejected.send_modify(|rejected| {
                    Arc::make_mut(rejected).insert(name, digest);
                });
            }
            Report::RefusalLifted {
                name,
                reason: RefusalReason::Rejected,
            } => {
                self.rejected.send_modify(|rejected| {
                    Arc::make_mut(rejected).remove(&name);
                });
            }
            Report::Refused { .. } | Report::RefusalLifted { .. } => {}
        }
    }

    fn count(&self, count: Count) {
        let metrics = &self.metrics.haproxy;
        match count {
            Count::Command { command, ok } => metrics.command(command, ok),
            Count::Pushed(certificates) => metrics.pushed(certificates),
            Count::Refused(reason) => metrics.refused(reason),
            Count::Loaded { reason, ok, took } => metrics.reloaded(reason, ok, took),
            Count::Up(up) => metrics.set_up(up),
            Count::SyncFailed => metrics.synced(false),
        }
    }

    fn publish_status(&mut self) {
        let serving = self.machine.serving();
        let oldest = serving.oldest.and_then(|oldest| {
            let waited = std::time::Instant::now().saturating_duration_since(oldest);
            SystemTime::now().checked_sub(waited)
        });
        self.metrics
            .haproxy
            .set_serving(serving.unserved, serving.refused, oldest);
        if self.machine.up() {
            self.metrics.haproxy.set_in_sync(serving.unserved == 0);
        }
        let status = self.machine.status();
        self.status.send_if_modified(|current| {
            let changed = *current != status;
            *current = status;
            changed
        });
    }

    async fn shutdown(mut self) {
        // What is pending goes out before certwatch stops (one batch at most).
        self.feed(Event::Closing).await;
        if let Some(start) = self.start_task.take()
            && let Ok(Ok((process, _))) = start.await
        {
            self.process = Some(*process);
        }
        if let Some(reload) = self.reload_task.take() {
            let _ = reload.await;
        }
        // An open runtime API connection would hold the soft stop.
        self.runtime.reconnect().await;
        if let Some(process) = self.process.take() {
            let stopped = process.stop(&self.options.drain).await;
            info!(?stopped, "HAProxy stopped");
        }
    }
}
