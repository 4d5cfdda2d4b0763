//! The HAProxy controller: one task that owns how HAProxy gets certwatch's state.
//!
//! **Start-up.** Nothing reaches HAProxy before the cert directory is complete (every
//! route present at start-up decided, its bundle and the crt-list on disk). Then:
//!
//! - when certwatch runs HAProxy ([`HaproxyMode::Managed`]), it starts it on those
//!   files: HAProxy loads every certificate itself, which is its fastest way to hold
//!   thousands of them. The runtime API is used for changes only;
//! - when HAProxy runs on its own ([`HaproxyMode::External`]), certwatch reads what it
//!   holds (`show ssl cert`, each certificate's SHA-1, `show ssl crt-list -n`) and
//!   pushes the difference; with its master socket, a difference larger than a reload
//!   costs is loaded by a reload instead.
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

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kube_common::backoff::{Backoff, BackoffPolicy};
use kube_common::sync;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::certs::{self, Applied, Held, HeldLine, Known, Planned, Unplannable};
use super::process::{Drain, HaproxyProcess, MasterCli, ProcessError, ProcessOptions, Reloaded};
use super::runtime::{
    BatchOutcome, Command, Connected, RuntimeClient, RuntimeError, RuntimeOptions, current_instance,
};
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

/// Where HAProxy is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HaproxyState {
    /// Waiting for the complete files.
    #[default]
    WaitingForFiles,
    /// certwatch started HAProxy, which is loading its files.
    Starting,
    /// HAProxy answers; the changes reach it.
    Serving,
    /// HAProxy does not answer (or certwatch could not start it); retrying.
    Down,
}

/// What the controller says about HAProxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HaproxyStatus {
    /// Where HAProxy is.
    pub state: HaproxyState,
    /// The worker answering the runtime API.
    pub worker: Option<u32>,
    /// Successful starts and reloads by certwatch.
    pub loads: u64,
    /// Whether a reload is in progress.
    pub reloading: bool,
    /// Routes of the first complete listing (start-up).
    pub startup_routes: usize,
    /// Of those, routes HAProxy did not serve yet (refused ones not counted).
    pub startup_unserved: usize,
    /// Admitted routes HAProxy does not serve at their current version yet.
    pub unserved: usize,
    /// Admitted routes HAProxy refused.
    pub refused: usize,
}

impl HaproxyStatus {
    /// Whether HAProxy serves every route present at start-up (it did once, and
    /// answers now): what `/readyz` waits for.
    pub fn ready(&self) -> bool {
        self.state == HaproxyState::Serving
            && self.startup_routes_known()
            && self.startup_unserved == 0
    }

    fn startup_routes_known(&self) -> bool {
        self.state != HaproxyState::WaitingForFiles
    }
}

/// Changes waiting for the controller task, coalesced per certificate.
#[derive(Debug, Default)]
struct InboxState {
    /// Certificate name → its newest line (`None`: gone) and when its oldest
    /// unhandled change came.
    changes: HashMap<String, (Option<CrtEntry>, SystemTime)>,
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
        let refused = options
            .refused
            .iter()
            .map(|(name, digest)| {
                let refusal = Refusal {
                    digest: *digest,
                    reason: RefusalReason::Rejected,
                };
                (name.clone(), refusal)
            })
            .collect();
        let master = match &options.mode {
            HaproxyMode::External {
                master_socket: Some(socket),
            } => Some(MasterCli::new(socket, options.command_timeout)),
            _ => None,
        };
        let controller = Controller {
            backoff: Backoff::new(options.retry),
            options,
            list: crt_list,
            prefix: managed_prefix,
            metrics,
            runtime: runtime.clone(),
            inbox: Arc::clone(&inbox),
            status: status_tx,
            rejected: rejected_tx,
            process: None,
            master,
            wanted: HashMap::new(),
            version: 0,
            pending: HashMap::new(),
            awaiting_reload: HashMap::new(),
            refused,
            deferred: HashMap::new(),
            aborts: HashSet::new(),
            startup: None,
            startup_routes: 0,
            listing_complete: false,
            known: None,
            limits: None,
            loaded: None,
            reload_wanted: None,
            reload_task: None,
            last_reload: None,
            load_time: None,
            start_task: None,
            loads: 0,
            failures: 0,
            retry_at: None,
            next_check: Instant::now(),
            up: false,
            answered_once: false,
            push_rate: None,
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
        let now = SystemTime::now();
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

/// A certificate's wanted state.
#[derive(Debug)]
struct Want {
    entry: Option<CrtEntry>,
    /// The controller's change counter when it last changed.
    version: u64,
}

/// Failures to reach a runtime API whose socket is not there yet, before the first
/// answer, after which the wait is warned about (about 9 s with the default backoff).
const STARTING_FAILURES: u32 = 5;

/// How soon a step HAProxy could not do now (its certificate operations locked) is
/// tried again.
const BUSY_RETRY: Duration = Duration::from_millis(100);

/// A refused certificate, until its material changes.
#[derive(Debug)]
struct Refusal {
    digest: [u8; 32],
    reason: RefusalReason,
}

/// Certificates whose material HAProxy rejected (name → bundle digest): their lines
/// are left out of the crt-list file, so that HAProxy's next load of its files (a
/// reload, a restart) does not fail on them and take every other route down.
pub type Rejected = Arc<HashMap<String, [u8; 32]>>;

/// A start's result: the process and its first worker.
type StartResult = Result<(Box<HaproxyProcess>, u32), ProcessError>;

/// A start in progress, with the change counter when it began.
struct StartTask {
    epoch: u64,
    handle: JoinHandle<StartResult>,
}

/// A reload in progress, with the change counter when it began and why.
struct ReloadTask {
    epoch: u64,
    handle: JoinHandle<Result<Reloaded, ProcessError>>,
    reason: ReloadReason,
}

/// What woke the task.
enum Wake {
    Inbox,
    Started(StartResult),
    Reloaded(ReloadReason, Result<Reloaded, ProcessError>),
    Timer,
}

struct Controller {
    options: HaproxyOptions,
    list: String,
    prefix: String,
    metrics: Arc<Metrics>,
    runtime: RuntimeClient,
    inbox: Arc<Inbox>,
    status: watch::Sender<HaproxyStatus>,
    rejected: watch::Sender<Rejected>,
    /// The HAProxy certwatch runs, once started.
    process: Option<HaproxyProcess>,
    /// The master CLI, when HAProxy can be reloaded.
    master: Option<MasterCli>,
    wanted: HashMap<String, Want>,
    /// Counts changes taken from the inbox.
    version: u64,
    /// Certificates whose wanted state HAProxy may not hold, with when their oldest
    /// unserved change came.
    pending: HashMap<String, SystemTime>,
    /// Certificates too large for the runtime API, waiting for a reload to load their
    /// file.
    awaiting_reload: HashMap<String, SystemTime>,
    refused: HashMap<String, Refusal>,
    /// Certificates whose last step failed, with their failures so far and when they
    /// are due again: one certificate's failures never hold the others back.
    deferred: HashMap<String, (Backoff, Instant)>,
    /// Certificates whose transaction may have been left open (a `commit` HAProxy
    /// could not do then): aborted at the start of the next batch, since an open
    /// transaction blocks every other certificate's `set`.
    aborts: HashSet<String>,
    /// Names of the first complete listing not served yet (`None` before it).
    startup: Option<HashSet<String>>,
    startup_routes: usize,
    listing_complete: bool,
    known: Option<Known>,
    /// The connection's process and limits, from the last batch.
    limits: Option<Connected>,
    /// The worker certwatch's last start or reload made, and the change counter when
    /// it began: that worker holds every certificate not changed since.
    loaded: Option<(u32, u64)>,
    reload_wanted: Option<ReloadReason>,
    reload_task: Option<ReloadTask>,
    last_reload: Option<Instant>,
    /// How long HAProxy took to load its files last time.
    load_time: Option<Duration>,
    start_task: Option<StartTask>,
    loads: u64,
    backoff: Backoff,
    failures: u32,
    retry_at: Option<Instant>,
    next_check: Instant,
    up: bool,
    /// Whether the runtime API has answered once: before that, a socket that is not
    /// there yet is HAProxy still starting, not a failure worth a warning.
    answered_once: bool,
    /// Certificates pushed per second, as measured over the last batches.
    push_rate: Option<f64>,
}

async fn join_start(task: &mut Option<StartTask>) -> StartResult {
    match task {
        Some(task) => match (&mut task.handle).await {
            Ok(result) => result,
            Err(join) => Err(ProcessError::Task {
                what: "start",
                source: join,
            }),
        },
        None => std::future::pending().await,
    }
}

async fn join_reload(
    task: &mut Option<ReloadTask>,
) -> (ReloadReason, Result<Reloaded, ProcessError>) {
    match task {
        Some(ReloadTask { handle, reason, .. }) => {
            let result = match handle.await {
                Ok(result) => result,
                Err(join) => Err(ProcessError::Task {
                    what: "reload",
                    source: join,
                }),
            };
            (*reason, result)
        }
        None => std::future::pending().await,
    }
}

impl Controller {
    async fn run(mut self) {
        loop {
            let wake_at = self.next_wake();
            let wake = tokio::select! {
                () = self.inbox.notify.notified() => Wake::Inbox,
                started = join_start(&mut self.start_task) => Wake::Started(started),
                (reason, reloaded) = join_reload(&mut self.reload_task) => Wake::Reloaded(reason, reloaded),
                () = tokio::time::sleep_until(wake_at) => Wake::Timer,
            };
            match wake {
                Wake::Started(result) => self.started(result).await,
                Wake::Reloaded(reason, result) => self.reloaded(reason, result).await,
                Wake::Inbox | Wake::Timer => {}
            }
            let closed = self.take_inbox();
            self.step().await;
            self.publish_status();
            if closed {
                break;
            }
        }
        self.shutdown().await;
    }

    fn managed(&self, name: &str) -> bool {
        name.starts_with(&self.prefix)
    }

    fn is_managed_mode(&self) -> bool {
        matches!(self.options.mode, HaproxyMode::Managed(_))
    }

    /// When to wake without news: a retry, the identity check, or at once while work
    /// is pending.
    fn next_wake(&self) -> Instant {
        let now = Instant::now();
        let mut at = self.next_check;
        if self.up && self.retry_at.is_none() && self.ready_to_push() {
            for name in self.pending.keys() {
                match self.deferred.get(name) {
                    None => return now,
                    Some((_, due)) => at = at.min(*due),
                }
            }
        }
        if let Some(retry) = self.retry_at {
            at = at.min(retry);
        }
        if let (Some(_), Some(last)) = (self.reload_wanted, self.last_reload) {
            at = at.min(last + self.options.min_reload_interval);
        }
        at.max(now)
    }

    fn ready_to_push(&self) -> bool {
        self.listing_complete && self.start_task.is_none() && self.known.is_some()
    }

    /// Takes the published changes; returns whether the controller is closing.
    fn take_inbox(&mut self) -> bool {
        let taken = self.inbox.take();
        if taken.resync {
            info!(socket = %self.options.socket.display(), "re-reading HAProxy's certificates");
            self.known = None;
            self.loaded = None;
        }
        if let Some(reason) = taken.reload {
            self.reload_wanted = Some(reason);
        }
        let first = taken.complete && !self.listing_complete;
        for (name, (entry, arrived)) in taken.changes {
            self.version += 1;
            // A refusal holds until the material changes. A rejected certificate's line
            // leaves the crt-list because of the refusal itself: that is no change.
            if let Some(refusal) = self.refused.get(&name) {
                let changed = match &entry {
                    Some(entry) => entry.digest != refusal.digest,
                    None => refusal.reason != RefusalReason::Rejected,
                };
                if changed {
                    let reason = refusal.reason;
                    self.refused.remove(&name);
                    if reason == RefusalReason::Rejected {
                        self.rejected.send_modify(|rejected| {
                            Arc::make_mut(rejected).remove(&name);
                        });
                    }
                }
            }
            if entry.is_none()
                && let Some(startup) = self.startup.as_mut()
            {
                startup.remove(&name);
            }
            // A change waiting for a reload keeps the time it has waited.
            let since = self.awaiting_reload.remove(&name).unwrap_or(arrived);
            self.deferred.remove(&name);
            self.pending.entry(name.clone()).or_insert(since);
            self.wanted.insert(
                name,
                Want {
                    entry,
                    version: self.version,
                },
            );
        }
        if first {
            self.listing_complete = true;
            let names: HashSet<String> = self
                .wanted
                .iter()
                .filter(|(_, want)| want.entry.is_some())
                .map(|(name, _)| name.clone())
                .collect();
            self.startup_routes = names.len();
            self.startup = Some(names);
            info!(
                routes = self.startup_routes,
                "the cert directory is complete; bringing HAProxy there"
            );
        }
        taken.closed
    }

    async fn step(&mut self) {
        if !self.listing_complete {
            return;
        }
        self.watch_process();
        if self.is_managed_mode() && self.process.is_none() {
            self.start_if_due();
            return;
        }
        if self.start_task.is_some() {
            return;
        }
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        self.retry_at = None;
        // While HAProxy reloads, the connection reaches the old worker on purpose (it
        // serves until the new one is up); the reload's end says when to move.
        if Instant::now() >= self.next_check && self.reload_task.is_none() {
            self.next_check = Instant::now() + self.options.check_interval;
            self.check_identity().await;
        }
        if self.known.as_ref().is_none_or(|known| known.stale) {
            match self.discover().await {
                Ok(true) => self.succeeded(),
                Ok(false) => {
                    debug!("HAProxy's certificate operations are locked; asking again shortly");
                    self.retry_at = Some(Instant::now() + BUSY_RETRY);
                    return;
                }
                Err(error) => {
                    self.failed(&error.to_string());
                    return;
                }
            }
        }
        self.maybe_reload();
        if !self.pending.is_empty() {
            match self.push_batch().await {
                Ok(()) => self.succeeded(),
                Err(error) => self.failed(&error.to_string()),
            }
        }
    }

    /// A managed HAProxy that exited is started again (after the backoff).
    fn watch_process(&mut self) {
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
        self.master = None;
        if let Some(reload) = self.reload_task.take() {
            reload.handle.abort();
        }
        self.known = None;
        self.loaded = None;
        self.up = false;
        self.metrics.haproxy.set_up(false);
        let delay = self.backoff.next_delay();
        self.retry_at = Some(Instant::now() + delay);
    }

    fn start_if_due(&mut self) {
        if self.start_task.is_some() || self.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let HaproxyMode::Managed(options) = &self.options.mode else {
            return;
        };
        self.retry_at = None;
        let options = options.clone();
        info!(
            binary = %options.binary.display(),
            config = %options.config.display(),
            "starting HAProxy on the complete files"
        );
        // The load lasts as long as the task (ended, or aborted).
        let loading = self.options.file_loads.begin();
        self.start_task = Some(StartTask {
            epoch: self.version,
            handle: tokio::spawn(async move {
                let _loading = loading;
                HaproxyProcess::start(options)
                    .await
                    .map(|(process, worker)| (Box::new(process), worker))
            }),
        });
    }

    async fn started(&mut self, result: StartResult) {
        let Some(StartTask { epoch, .. }) = self.start_task.take() else {
            return;
        };
        match result {
            Ok((process, worker)) => {
                let process = *process;
                self.master = Some(process.master().clone());
                self.process = Some(process);
                self.loaded = Some((worker, epoch));
                self.loads += 1;
                self.last_reload = Some(Instant::now());
                // The runtime API reaches the new worker from now on.
                self.runtime.reconnect().await;
                self.known = None;
                let took = self.start_took();
                self.load_time = took;
                self.metrics
                    .haproxy
                    .reloaded(ReloadReason::Start, true, took);
                self.failures = 0;
                self.backoff = Backoff::new(self.options.retry);
            }
            Err(error) => {
                self.metrics
                    .haproxy
                    .reloaded(ReloadReason::Start, false, None);
                self.failed(&format!("cannot start HAProxy: {error}"));
            }
        }
    }

    /// The start's duration, from the metrics HAProxy's start logged (the process does
    /// not say): measured by the caller instead.
    fn start_took(&self) -> Option<Duration> {
        self.process.as_ref().map(HaproxyProcess::start_duration)
    }

    async fn reloaded(&mut self, reason: ReloadReason, result: Result<Reloaded, ProcessError>) {
        let Some(ReloadTask { epoch, .. }) = self.reload_task.take() else {
            return;
        };
        match result {
            Ok(reloaded) => {
                info!(
                    reason = reason.as_str(),
                    worker = reloaded.worker,
                    took = ?reloaded.took,
                    "HAProxy reloaded; its new worker serves"
                );
                self.metrics
                    .haproxy
                    .reloaded(reason, true, Some(reloaded.took));
                self.load_time = Some(reloaded.took);
                self.loads += 1;
                self.loaded = Some((reloaded.worker, epoch));
                // The old worker finishes its connections once ours is closed.
                self.runtime.reconnect().await;
                self.known = None;
            }
            Err(error) => {
                self.metrics.haproxy.reloaded(reason, false, None);
                error!(reason = reason.as_str(), %error, "HAProxy's reload failed; its previous worker keeps serving");
                // Certificates waiting for it stay waiting: the next reload will try.
                if !self.awaiting_reload.is_empty() {
                    self.reload_wanted.get_or_insert(reason);
                }
            }
        }
    }

    /// Starts a reload when one is wanted and allowed now.
    fn maybe_reload(&mut self) {
        if self.reload_task.is_some() {
            return;
        }
        let Some(master) = self.master.clone() else {
            if let Some(reason) = self.reload_wanted.take() {
                warn!(
                    reason = reason.as_str(),
                    "a reload of HAProxy was asked for, but certwatch cannot reload it (no master socket)"
                );
            }
            return;
        };
        if self.reload_wanted.is_none() && self.backlog_worth_a_reload() {
            self.reload_wanted = Some(ReloadReason::Backlog);
        }
        let Some(reason) = self.reload_wanted else {
            return;
        };
        if self
            .last_reload
            .is_some_and(|last| last.elapsed() < self.options.min_reload_interval)
        {
            return;
        }
        self.reload_wanted = None;
        self.last_reload = Some(Instant::now());
        let timeout = match &self.options.mode {
            HaproxyMode::Managed(options) => options.load_timeout,
            HaproxyMode::External { .. } => Duration::from_secs(600),
        };
        info!(
            reason = reason.as_str(),
            waiting = self.awaiting_reload.len(),
            pending = self.pending.len(),
            "reloading HAProxy"
        );
        // The load lasts as long as the task (ended, or aborted).
        let loading = self.options.file_loads.begin();
        self.reload_task = Some(ReloadTask {
            epoch: self.version,
            handle: tokio::spawn(async move {
                let _loading = loading;
                master.reload(timeout).await
            }),
            reason,
        });
    }

    /// Whether pushing what is pending takes longer than HAProxy loading its files.
    fn backlog_worth_a_reload(&self) -> bool {
        let (Some(rate), Some(load)) = (self.push_rate, self.load_time) else {
            return false;
        };
        let backlog = self.pending.len() as f64;
        backlog > 1_000.0 && backlog / rate > load.as_secs_f64()
    }

    /// Whether the runtime API connection still reaches HAProxy's current process;
    /// closes it when not.
    async fn check_identity(&mut self) {
        let current = current_instance(&self.options.socket, self.options.command_timeout).await;
        match (current, self.runtime.connected()) {
            (Ok(current), Some(connected)) if connected.instance != current => {
                info!(
                    old = connected.instance.pid,
                    new = current.pid,
                    "HAProxy's process changed; reconnecting and reading its certificates"
                );
                self.runtime.reconnect().await;
                self.known = None;
            }
            (Ok(_), _) => {}
            (Err(error), _) => {
                if self.up {
                    self.failed(&error.to_string());
                }
            }
        }
    }

    /// Reads what HAProxy holds (see the module documentation).
    /// Returns `false` when HAProxy's certificate operations were locked (by another
    /// CLI session or HAProxy itself): nothing was learnt, ask again shortly.
    async fn discover(&mut self) -> Result<bool, RuntimeError> {
        let list = self.list.clone();
        let outcome = self
            .execute(vec![
                Command::new("show ssl cert"),
                Command::new(format!("show ssl crt-list -n {list}")),
            ])
            .await?;
        let connected = outcome.connected.ok_or(RuntimeError::Stopped)?;
        if outcome
            .replies
            .iter()
            .any(|reply| reply.contains("currently locked"))
        {
            return Ok(false);
        }
        let (committed, transactions) = certs::parse_certificates(outcome.replies[0].text());
        let shown = outcome.replies[1].text();
        if shown.starts_with("didn't find") || shown.contains("Can't") {
            return Err(RuntimeError::Protocol {
                socket: self.options.socket.clone(),
                problem: format!(
                    "show ssl crt-list {list}: {} (HAProxy's configuration must load this crt-list by this exact path)",
                    outcome.replies[1].summary()
                ),
            });
        }
        let mut known = Known::new(connected.instance);
        // Left by an interrupted update: it would block the next `set ssl cert`.
        let aborts: Vec<Command> = transactions
            .iter()
            .filter(|name| self.managed(name))
            .map(|name| Command::new(format!("abort ssl cert {name}")))
            .collect();
        if !aborts.is_empty() {
            self.execute(aborts).await?;
        }
        let loaded_epoch = self
            .loaded
            .filter(|(worker, _)| *worker == connected.instance.pid)
            .map(|(_, epoch)| epoch);
        let managed: Vec<String> = committed
            .into_iter()
            .filter(|name| self.managed(name))
            .collect();
        match loaded_epoch {
            Some(epoch) => {
                for name in &managed {
                    let held = match self.wanted.get(name) {
                        Some(Want {
                            entry: Some(entry),
                            version,
                        }) if *version <= epoch => Held::Bundle(entry.digest),
                        _ => Held::Unknown,
                    };
                    known.certs.insert(name.clone(), held);
                }
            }
            None => {
                // A process certwatch did not load: each certificate is asked.
                for chunk in managed.chunks(self.options.batch_limit.max(1) * 4) {
                    let commands = chunk
                        .iter()
                        .map(|name| Command::new(format!("show ssl cert {name}")))
                        .collect();
                    let outcome = self.execute(commands).await?;
                    for (name, reply) in chunk.iter().zip(&outcome.replies) {
                        let held =
                            certs::parse_sha1(reply.text()).map_or(Held::Unknown, Held::Leaf);
                        known.certs.insert(name.clone(), held);
                    }
                }
            }
        }
        for (name, number, rest) in certs::parse_crt_list(shown) {
            if self.managed(&name) {
                known.lines.entry(name).or_default().push(HeldLine {
                    number: Some(number),
                    rest,
                });
            }
        }
        // What HAProxy holds of certwatch's and certwatch no longer wants goes.
        let now = SystemTime::now();
        let strays: Vec<String> = known
            .certs
            .keys()
            .chain(known.lines.keys())
            .filter(|name| !self.wanted.contains_key(*name))
            .cloned()
            .collect();
        for name in strays {
            self.version += 1;
            self.wanted.insert(
                name,
                Want {
                    entry: None,
                    version: self.version,
                },
            );
        }
        // Everything HAProxy does not hold as wanted is pending; what it holds is
        // served.
        let mut served = Vec::new();
        for (name, want) in &self.wanted {
            if known.holds(name, want.entry.as_ref()) {
                served.push(name.clone());
            } else if !self.awaiting_reload.contains_key(name) && !self.is_refused(name, want) {
                self.pending.entry(name.clone()).or_insert(now);
            }
        }
        for name in served {
            self.served(&name);
        }
        debug!(
            pid = connected.instance.pid,
            certificates = known.certs.len(),
            lines = known.lines.len(),
            pending = self.pending.len(),
            read_each = loaded_epoch.is_none(),
            "read HAProxy's certificates"
        );
        self.limits = Some(connected);
        self.known = Some(known);
        Ok(true)
    }

    fn is_refused(&self, name: &str, want: &Want) -> bool {
        match (self.refused.get(name), &want.entry) {
            (Some(refusal), Some(entry)) => refusal.digest == entry.digest,
            _ => false,
        }
    }

    /// `name` is as wanted in HAProxy now.
    fn served(&mut self, name: &str) {
        self.pending.remove(name);
        self.deferred.remove(name);
        self.awaiting_reload.remove(name);
        if let Some(startup) = self.startup.as_mut() {
            startup.remove(name);
        }
        if self
            .wanted
            .get(name)
            .is_some_and(|want| want.entry.is_none())
        {
            self.wanted.remove(name);
        }
    }

    /// Runs commands, counting them; an incomplete batch is an error (after the
    /// answers it got are returned through `outcome`).
    async fn execute(&mut self, commands: Vec<Command>) -> Result<BatchOutcome, RuntimeError> {
        let mut outcome = self.runtime.execute(commands).await;
        if let Some(connected) = outcome.connected {
            self.limits = Some(connected);
        }
        match outcome.error.take() {
            Some(error) => Err(error),
            None => Ok(outcome),
        }
    }

    /// One batch: the oldest pending certificates' commands, pipelined.
    async fn push_batch(&mut self) -> Result<(), RuntimeError> {
        let Some(known) = self.known.as_ref() else {
            return Ok(());
        };
        let max_request = self
            .limits
            .map_or(super::runtime::DEFAULT_BUFSIZE - 1, |limits| {
                limits.max_request
            });
        let mut order: Vec<(SystemTime, String)> = self
            .pending
            .iter()
            .map(|(name, since)| (*since, name.clone()))
            .collect();
        order.sort_unstable();
        let mut planned: Vec<Planned> = Vec::new();
        let mut batch: Vec<(String, std::ops::Range<usize>)> = Vec::new();
        let mut bytes = 0;
        let mut served = Vec::new();
        let mut too_large = Vec::new();
        let mut stale = false;
        let now = Instant::now();
        for (_, name) in order {
            if batch.len() >= self.options.batch_limit || bytes >= self.options.batch_bytes {
                break;
            }
            if self.deferred.get(&name).is_some_and(|(_, due)| now < *due) {
                continue;
            }
            let Some(want) = self.wanted.get(&name) else {
                served.push(name);
                continue;
            };
            match certs::plan(&name, want.entry.as_ref(), known, &self.list, max_request) {
                Ok(steps) if steps.is_empty() => served.push(name),
                Ok(steps) => {
                    let start = planned.len();
                    bytes += steps
                        .iter()
                        .map(|p| p.command.request_size())
                        .sum::<usize>();
                    planned.extend(steps);
                    batch.push((name, start..planned.len()));
                }
                Err(Unplannable::TooLarge { size, limit }) => too_large.push((name, size, limit)),
                Err(Unplannable::LinesUnknown) => stale = true,
            }
        }
        for name in served {
            self.served(&name);
        }
        for (name, size, limit) in too_large {
            self.too_large(name, size, limit);
        }
        if stale && let Some(known) = self.known.as_mut() {
            known.stale = true;
        }
        if planned.is_empty() && self.aborts.is_empty() {
            return Ok(());
        }
        // Transactions a busy `commit` may have left open go first.
        let aborts: Vec<Planned> = self
            .aborts
            .drain()
            .map(|name| Planned {
                step: certs::Step::Abort,
                command: Command::new(format!("abort ssl cert {name}")),
                name,
            })
            .collect();
        let offset = aborts.len();
        for (_, range) in &mut batch {
            *range = range.start + offset..range.end + offset;
        }
        planned.splice(0..0, aborts);
        let started = std::time::Instant::now();
        let commands: Vec<Command> = planned.iter().map(|p| p.command.clone()).collect();
        let outcome = self.runtime.execute(commands).await;
        if let Some(connected) = outcome.connected {
            self.limits = Some(connected);
            if self
                .known
                .as_ref()
                .is_some_and(|known| known.instance != connected.instance)
            {
                // Another process answered: nothing it said is about what is known.
                self.known = None;
                return Err(RuntimeError::ProcessChanged {
                    socket: self.options.socket.clone(),
                });
            }
        }
        let answered = outcome.replies.len();
        let mut pushed = 0;
        let mut refusals = Vec::new();
        let mut done = Vec::new();
        let mut failed = Vec::new();
        let mut busy = Vec::new();
        {
            let Some(known) = self.known.as_mut() else {
                return Ok(());
            };
            for (name, range) in &batch {
                let want = self.wanted.get(name).and_then(|want| want.entry.as_ref());
                let mut complete = range.end <= answered;
                let mut refused = None;
                for index in range.clone() {
                    let Some(reply) = outcome.replies.get(index) else {
                        break;
                    };
                    let step = &planned[index];
                    let applied = known.apply(step, want, reply);
                    self.metrics
                        .haproxy
                        .command(step.step.command(), applied == Applied::Done);
                    match applied {
                        Applied::Done => {
                            if step.step == certs::Step::Commit {
                                pushed += 1;
                            }
                        }
                        Applied::MaterialRefused(message) => {
                            refused.get_or_insert(message);
                        }
                        Applied::Failed(message) => {
                            debug!(certificate = %name, step = step.step.command(), %message, "runtime API step failed");
                            complete = false;
                            failed.push(name.clone());
                        }
                        Applied::Busy => {
                            complete = false;
                            busy.push((name.clone(), step.step == certs::Step::Commit));
                        }
                    }
                }
                if let Some(message) = refused {
                    refusals.push((name.clone(), message));
                } else if complete && known.holds(name, want) {
                    done.push(name.clone());
                }
            }
        }
        for name in done {
            self.served(&name);
        }
        for (name, commit) in busy {
            if commit {
                self.aborts.insert(name.clone());
            }
            self.deferred
                .entry(name)
                .or_insert_with(|| (Backoff::new(self.options.retry), now))
                .1 = now + BUSY_RETRY;
        }
        for name in failed {
            let mut backoff = self
                .deferred
                .remove(&name)
                .map_or_else(|| Backoff::new(self.options.retry), |(backoff, _)| backoff);
            let delay = backoff.next_delay();
            self.deferred.insert(name, (backoff, now + delay));
        }
        for (name, message) in refusals {
            self.rejected(name, &message);
        }
        self.metrics.haproxy.pushed(pushed);
        let elapsed = started.elapsed().as_secs_f64();
        if pushed >= 16 && elapsed > 0.0 {
            let rate = pushed as f64 / elapsed;
            self.push_rate = Some(self.push_rate.map_or(rate, |old| 0.7 * old + 0.3 * rate));
        }
        debug!(
            certificates = batch.len(),
            commands = planned.len(),
            answered,
            pushed,
            elapsed_ms = elapsed * 1e3,
            "runtime API batch"
        );
        match outcome.error {
            Some(error) => {
                // What the unanswered commands did is not known.
                if let Some(known) = self.known.as_mut() {
                    known.stale = true;
                }
                Err(error)
            }
            None => Ok(()),
        }
    }

    /// A bundle too large for one runtime API request: its file is loaded by a reload,
    /// or it is refused.
    fn too_large(&mut self, name: String, size: usize, limit: usize) {
        let Some(since) = self.pending.remove(&name) else {
            return;
        };
        if self.master.is_some() {
            if !self.awaiting_reload.contains_key(&name) {
                info!(
                    certificate = %name,
                    size,
                    limit,
                    "certificate too large for HAProxy's runtime API (tune.bufsize); HAProxy will load its file at a reload"
                );
                self.metrics.haproxy.refused(RefusalReason::TooLarge);
            }
            self.awaiting_reload.insert(name, since);
            self.reload_wanted.get_or_insert(ReloadReason::TooLarge);
            return;
        }
        warn!(
            certificate = %name,
            size,
            limit,
            "HAProxy cannot take this certificate through its runtime API (larger than tune.bufsize) and certwatch cannot reload it: not served until HAProxy next loads its files"
        );
        self.metrics.haproxy.refused(RefusalReason::TooLarge);
        self.refuse(name, RefusalReason::TooLarge);
    }

    /// HAProxy rejected a certificate's material.
    fn rejected(&mut self, name: String, message: &str) {
        warn!(
            certificate = %name,
            answer = %message,
            "HAProxy refused this certificate; it is not served until its material changes"
        );
        self.metrics.haproxy.refused(RefusalReason::Rejected);
        self.pending.remove(&name);
        self.refuse(name, RefusalReason::Rejected);
    }

    fn refuse(&mut self, name: String, reason: RefusalReason) {
        if let Some(startup) = self.startup.as_mut() {
            startup.remove(&name);
        }
        if let Some(Want {
            entry: Some(entry), ..
        }) = self.wanted.get(&name)
        {
            let digest = entry.digest;
            if reason == RefusalReason::Rejected {
                self.rejected.send_modify(|rejected| {
                    Arc::make_mut(rejected).insert(name.clone(), digest);
                });
            }
            self.refused.insert(name, Refusal { digest, reason });
        }
    }

    fn succeeded(&mut self) {
        if !self.up || self.failures > 0 {
            info!(socket = %self.options.socket.display(), "HAProxy's runtime API answers");
        }
        self.up = true;
        self.answered_once = true;
        self.failures = 0;
        self.retry_at = None;
        self.backoff = Backoff::new(self.options.retry);
        self.metrics.haproxy.set_up(true);
    }

    fn failed(&mut self, error: &str) {
        self.failures = self.failures.saturating_add(1);
        self.up = false;
        self.metrics.haproxy.set_up(false);
        self.metrics.haproxy.synced(false);
        let delay = self.backoff.next_delay();
        // HAProxy started beside certwatch (by its routing task, a sidecar) creates its
        // socket a moment after the files are complete: until it has answered once, a
        // missing socket is said at info, and warned about only once it lasts.
        let starting = !self.answered_once && !self.options.socket.exists();
        let warn_at = if starting { STARTING_FAILURES } else { 1 };
        if self.failures == warn_at {
            warn!(%error, retry_in = ?delay, "HAProxy: cannot bring it up to date; retrying");
        } else if self.failures == 1 {
            info!(
                socket = %self.options.socket.display(),
                "waiting for HAProxy's runtime API (HAProxy is starting)"
            );
        } else {
            debug!(%error, retry_in = ?delay, "HAProxy: still failing; retrying");
        }
        self.retry_at = Some(Instant::now() + delay);
    }

    fn publish_status(&mut self) {
        let unserved = self
            .pending
            .keys()
            .chain(self.awaiting_reload.keys())
            .filter(|name| {
                self.wanted
                    .get(*name)
                    .is_some_and(|want| want.entry.is_some())
            })
            .count();
        let oldest = self
            .pending
            .values()
            .chain(self.awaiting_reload.values())
            .min()
            .copied();
        let refused = self.refused.len();
        self.metrics.haproxy.set_serving(unserved, refused, oldest);
        if self.up {
            self.metrics.haproxy.set_in_sync(unserved == 0);
        }
        let state = if !self.listing_complete {
            HaproxyState::WaitingForFiles
        } else if self.start_task.is_some() {
            HaproxyState::Starting
        } else if self.up {
            HaproxyState::Serving
        } else {
            HaproxyState::Down
        };
        let status = HaproxyStatus {
            state,
            worker: self.known.as_ref().map(|known| known.instance.pid),
            loads: self.loads,
            reloading: self.reload_task.is_some(),
            startup_routes: self.startup_routes,
            startup_unserved: self.startup.as_ref().map_or(0, HashSet::len),
            unserved,
            refused,
        };
        self.status.send_if_modified(|current| {
            let changed = *current != status;
            *current = status;
            changed
        });
    }

    async fn shutdown(mut self) {
        // What is pending goes out before certwatch stops (one batch at most).
        if self.up && !self.pending.is_empty() {
            let _ = self.push_batch().await;
        }
        if let Some(start) = self.start_task.take()
            && let Ok(Ok((process, _))) = start.handle.await
        {
            self.process = Some(*process);
        }
        if let Some(reload) = self.reload_task.take() {
            let _ = reload.handle.await;
        }
        // An open runtime API connection would hold the soft stop.
        self.runtime.reconnect().await;
        if let Some(process) = self.process.take() {
            let stopped = process.stop(&self.options.drain).await;
            info!(?stopped, "HAProxy stopped");
        }
    }
}
