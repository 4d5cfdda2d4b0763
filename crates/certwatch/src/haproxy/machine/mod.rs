//! HAProxy's decisions, as a pure state machine: what certwatch wants HAProxy to
//! hold, what it knows HAProxy holds, and what to do next. Events in (a certificate
//! changed, an answer came, the process started, reloaded or exited, time passed);
//! actions out (send these runtime API commands, start or reload HAProxy, reconnect,
//! report a refusal). No I/O, no clock, no tokio: the caller passes the time in, and
//! [`super::controller`] performs the actions and feeds their results back. The shape
//! is route-secrets' machine (a state plus a step function, driven by a thin shell).
//!
//! # The cycle
//!
//! [`Event::Timer`] is the driver's turn: the machine decides what is due. At most one
//! exchange with HAProxy is outstanding ([`Action::CheckIdentity`] or
//! [`Action::Execute`]); its answer ([`Event::Identity`], [`Event::Answered`]) carries
//! the cycle on, in this order:
//!
//! 1. a managed HAProxy waits for the first complete listing, then is started
//!    ([`Action::Start`]) and nothing else happens until it serves; a HAProxy run by
//!    others is reached as soon as a route is decided ([`Event::Decided`]), and only
//!    adds go to it before the first complete listing (see *Before the listing* below);
//! 2. every [`MachineOptions::check_interval`], unless a reload runs, HAProxy's
//!    identity is checked: another process answering the persistent connection means
//!    a reconnect and a new reading;
//! 3. without knowledge of the answering process (or with knowledge an answer
//!    contradicted) HAProxy is read ([`discover`]);
//! 4. a reload starts when one is wanted and allowed ([`Action::Reload`]);
//! 5. the oldest pending certificates go out in one pipelined batch ([`push`]).
//!
//! # Decisions
//!
//! * **Batching.** Pending certificates go oldest change first, at most
//!   [`MachineOptions::batch_limit`] certificates or [`MachineOptions::batch_bytes`] of
//!   payload per batch; a certificate whose commands are not due yet (deferred) waits.
//!   The pending set is kept in that order ([`pending`]), so a batch and the status
//!   after it cost in proportion to the batch, not to everything pending (100,000
//!   certificates at a large start).
//! * **Deferring.** A step that failed (knowledge gone wrong) defers its certificate
//!   along the retry backoff; one HAProxy could not do now (its certificate operations
//!   locked, another transaction open) is tried again after [`BUSY_RETRY`], its open
//!   transaction aborted first.
//! * **Refusing.** A failed `new`, `set`, `commit` or `add ssl crt-list` that says the
//!   material is the problem is that certificate's refusal
//!   ([`RefusalReason::Rejected`]), as is a bundle too large for one request when no
//!   reload can load its file ([`RefusalReason::TooLarge`]); a refusal holds until the
//!   material changes ([`Action::Report`]).
//! * **Reloading.** Wanted for a bundle too large for the runtime API, for a backlog
//!   that would take longer to push than HAProxy takes to load its files, and on
//!   request; at least [`MachineOptions::min_reload_interval`] apart; possible only with
//!   a master CLI. After a start or a reload, the new worker holds what did not change
//!   since it began: that is known without asking.
//! * **While a reload runs.** The old worker serves until the new one is up, and keeps
//!   getting changes, unless what is pending is itself worth a reload: then the new
//!   worker loads it from the files faster than the old one would take it, and pushing
//!   it to the old worker too would only take HAProxy's CPU from the load. Removals
//!   still go to the old worker at once (a route gone or refused stops being served).
//! * **After a start or a reload.** A certificate changed once while HAProxy loaded
//!   may be in the new worker at either version: its leaf is asked (`show ssl cert
//!   <name>`) when the two versions' leaves differ, and pushed only if the worker read
//!   the older file. One changed more than once meanwhile, or whose leaf stayed the
//!   same (the chain or the line changed), is pushed.
//! * **Before the listing.** Until the first complete listing, the set of routes is
//!   half-built: what HAProxy holds and certwatch does not want yet may be a route not
//!   decided yet. So a HAProxy run by others gets only adds then: a decided route's
//!   certificate that HAProxy holds nothing of under its name (no store, no line) goes
//!   to it at once; removals (strays HAProxy holds), replacements of what it holds, and
//!   reloads wait for the complete listing. A decided route the complete listing does
//!   not name (removed or refused meanwhile) is removed then.
//! * **Answers.** What each answer means for the knowledge is [`super::certs`]'s
//!   ([`Known::apply`]); an answer from another process than the known one voids the
//!   knowledge; a broken batch makes it stale.

mod discover;
mod pending;
mod push;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kube_common::backoff::{Backoff, BackoffPolicy};
use tracing::{debug, error, info, warn};

use self::pending::Pending;
use super::certs::{self, Known};
use super::process::ProcessError;
use super::runtime::{BatchOutcome, Command, Connected, Instance, RuntimeError};
use crate::cert_dir::CrtEntry;
use crate::metrics::haproxy::{RefusalReason, ReloadReason};

/// Failures to reach a runtime API whose socket is not there yet, before the first
/// answer, after which the wait is warned about (about 9 s with the default backoff).
const STARTING_FAILURES: u32 = 5;

/// How soon a step HAProxy could not do now (its certificate operations locked) is
/// tried again.
pub const BUSY_RETRY: Duration = Duration::from_millis(100);

/// A backlog shorter than this is pushed, however fast HAProxy loads its files.
const BACKLOG_RELOAD_MIN: usize = 1_000;

/// How the machine decides.
#[derive(Clone, Debug)]
pub struct MachineOptions {
    /// HAProxy's stats socket (named in errors).
    pub socket: PathBuf,
    /// The crt-list's path as HAProxy's configuration names it.
    pub list: String,
    /// Certificates whose names start with this are certwatch's.
    pub prefix: String,
    /// certwatch starts HAProxy (and reloads it through the started master).
    pub managed: bool,
    /// An HAProxy run by someone else has a master CLI certwatch may reload it through.
    pub external_master: bool,
    /// Delays between retries after a failure.
    pub retry: BackoffPolicy,
    /// How often HAProxy's identity is checked.
    pub check_interval: Duration,
    /// Certificates per batch at most.
    pub batch_limit: usize,
    /// Bytes of payload per batch at most.
    pub batch_bytes: usize,
    /// Least time between two reloads.
    pub min_reload_interval: Duration,
    /// Certificates HAProxy refused before: name → the refused material's digest.
    pub refused: HashMap<String, [u8; 32]>,
    /// Seeds the jitter of retry delays.
    pub seed: u64,
}

/// A start or a reload that succeeded: the worker that serves now, and how long its
/// load took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loaded {
    /// The new worker's pid.
    pub worker: u32,
    /// How long HAProxy took to load its files.
    pub took: Duration,
}

/// What happened, fed to [`Machine::step`].
#[derive(Debug)]
pub enum Event {
    /// A certificate's line changed in the cert directory (`None`: gone); `arrived` is
    /// when its oldest unhandled change was published.
    Changed {
        /// The certificate's name.
        name: String,
        /// Its newest line.
        entry: Option<CrtEntry>,
        /// When the change was published.
        arrived: Instant,
    },
    /// A route's certificate decided before the first complete listing (its bundle on
    /// disk): pushed at once to a HAProxy run by others that holds nothing under its
    /// name; ignored once the listing is complete, and by a managed HAProxy (started
    /// on the complete files). The complete listing names it again, or it is removed
    /// then.
    Decided {
        /// The certificate's name.
        name: String,
        /// Its line.
        entry: CrtEntry,
        /// When it was published.
        arrived: Instant,
    },
    /// The first complete listing is in: start-up decided.
    ListingComplete,
    /// Forget what HAProxy is believed to hold; read it again.
    Resync,
    /// Reload HAProxy (a new configuration is in place).
    ReloadRequested(ReloadReason),
    /// The start asked by [`Action::Start`] ended.
    Started(Result<Loaded, ProcessError>),
    /// The reload asked by [`Action::Reload`] ended.
    Reloaded(Result<Loaded, ProcessError>),
    /// The HAProxy certwatch started exited.
    Exited,
    /// The answer to [`Action::CheckIdentity`]: the process a fresh connection reaches,
    /// and the one the persistent connection reaches.
    Identity {
        /// A fresh connection's process.
        current: Result<Instance, RuntimeError>,
        /// The persistent connection's process, if it is open.
        connected: Option<Connected>,
    },
    /// The answers to [`Action::Execute`].
    Answered(BatchOutcome),
    /// The driver's turn: decide what is due now.
    Timer,
    /// certwatch stops: what is pending goes out (one batch at most), nothing else.
    Closing,
}

/// What the driver does, in the order given.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Start HAProxy on the complete files; answer with [`Event::Started`].
    Start,
    /// Reload HAProxy through its master CLI; answer with [`Event::Reloaded`].
    Reload(ReloadReason),
    /// Drop the reload in progress (its process is gone).
    CancelReload,
    /// Close the runtime API connection (the next command opens one to the current
    /// process).
    Reconnect,
    /// Ask a fresh connection which process answers; answer with [`Event::Identity`].
    CheckIdentity,
    /// Send these commands, pipelined, over the runtime API connection; answer with
    /// [`Event::Answered`].
    Execute(Vec<Command>),
    /// Tell the outputs about a certificate.
    Report(Report),
    /// Count in the metrics.
    Count(Count),
}

/// What HAProxy made of a certificate, for the outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// HAProxy does not serve this material, and will not until it changes.
    Refused {
        /// The certificate's name.
        name: String,
        /// The refused material's digest.
        digest: [u8; 32],
        /// Why.
        reason: RefusalReason,
    },
    /// The refused material changed (or its line left): the refusal is over.
    RefusalLifted {
        /// The certificate's name.
        name: String,
        /// Why it had been refused.
        reason: RefusalReason,
    },
}

/// A metrics update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Count {
    /// A runtime API command was answered (`ok`: it succeeded).
    Command {
        /// The command's name.
        command: &'static str,
        /// Whether it succeeded.
        ok: bool,
    },
    /// Certificates committed by a batch.
    Pushed(usize),
    /// A certificate was refused.
    Refused(RefusalReason),
    /// A start or reload ended.
    Loaded {
        /// Why it was done.
        reason: ReloadReason,
        /// Whether it succeeded.
        ok: bool,
        /// How long the load took.
        took: Option<Duration>,
    },
    /// Whether HAProxy's runtime API answers.
    Up(bool),
    /// An attempt to bring HAProxy up to date failed.
    SyncFailed,
}

impl Eq for Count {}

/// What stopped a cycle.
#[derive(Debug)]
pub enum Failure {
    /// The runtime API.
    Runtime(RuntimeError),
    /// Starting HAProxy.
    Start(ProcessError),
}

impl Failure {
    /// Whether the runtime API's socket was not there: HAProxy starting beside
    /// certwatch.
    fn socket_missing(&self) -> bool {
        matches!(
            self,
            Self::Runtime(RuntimeError::Connect { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound
        )
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Runtime(error) => error.fmt(f),
            Self::Start(error) => write!(f, "cannot start HAProxy: {error}"),
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

/// A certificate's wanted state.
#[derive(Debug)]
struct Want {
    entry: Option<CrtEntry>,
    /// The machine's change counter when it last changed.
    version: u64,
}

/// A refused certificate, until its material changes.
#[derive(Debug)]
struct Refusal {
    digest: [u8; 32],
    reason: RefusalReason,
}

/// What a certificate changed while HAProxy loaded was before its first change since
/// the load began: what the new worker holds if it read the file before that change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BeforeLoad {
    /// Nothing under its name: an add.
    Nothing,
    /// A bundle whose leaf has this SHA-1 (as `show ssl cert <name>` shows it).
    Leaf([u8; 20]),
    /// Changed more than once meanwhile, or a leaf that could not be read: the worker
    /// may hold one of several versions, which the leaf alone cannot tell apart.
    Ambiguous,
}

/// A start or reload in progress: the change counter when it began (the new worker
/// holds every certificate not changed since), and why.
#[derive(Clone, Copy, Debug)]
struct Loading {
    epoch: u64,
    reason: ReloadReason,
}

/// The exchange with HAProxy the machine waits for.
#[derive(Debug, Default)]
enum Op {
    /// None.
    #[default]
    Idle,
    /// [`Action::CheckIdentity`].
    Identity,
    /// A reading of HAProxy.
    Discover(discover::Discovery),
    /// A batch.
    Push(push::Batch),
}

/// Draws in `[0, 1]` for retry jitter (xorshift: deterministic from the seed).
#[derive(Debug)]
struct Jitter(u64);

impl Jitter {
    fn draw(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// HAProxy's bookkeeping and decisions (see the [module documentation](self)).
#[derive(Debug)]
pub struct Machine {
    options: MachineOptions,
    wanted: HashMap<String, Want>,
    /// Counts changes.
    version: u64,
    /// Certificates whose wanted state HAProxy may not hold, with when their oldest
    /// unserved change came, oldest first.
    pending: Pending,
    /// Certificates too large for the runtime API, waiting for a reload to load their
    /// file.
    awaiting_reload: HashMap<String, Instant>,
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
    /// Names wanted from [`Event::Decided`] only, before the first complete listing:
    /// those the complete listing does not name are removed then.
    early: HashSet<String>,
    known: Option<Known>,
    /// The connection's process and limits, from the last exchange.
    limits: Option<Connected>,
    /// The worker certwatch's last start or reload made, and the change counter when
    /// it began.
    loaded: Option<(u32, u64)>,
    /// Certificates changed since the last start or reload began, with what each was
    /// before: read once after it, to tell what the new worker holds.
    changed_while_loading: HashMap<String, BeforeLoad>,
    /// A managed HAProxy runs (started, not exited).
    running: bool,
    /// A master CLI can reload HAProxy.
    can_reload: bool,
    starting: Option<u64>,
    reloading: Option<Loading>,
    reload_wanted: Option<ReloadReason>,
    last_reload: Option<Instant>,
    /// How long HAProxy took to load its files last time.
    load_time: Option<Duration>,
    loads: u64,
    backoff: Backoff,
    jitter: Jitter,
    failures: u32,
    retry_at: Option<Instant>,
    /// When HAProxy's identity is checked next (`None`: at once).
    next_check: Option<Instant>,
    up: bool,
    /// Whether the runtime API has answered once: before that, a socket that is not
    /// there yet is HAProxy still starting, not a failure worth a warning.
    answered_once: bool,
    /// Certificates pushed per second, as measured over the last batches.
    push_rate: Option<f64>,
    op: Op,
    closing: bool,
}

/// The figures `/metrics` shows about what HAProxy serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Serving {
    /// Admitted certificates HAProxy does not serve at their current version yet.
    pub unserved: usize,
    /// Certificates HAProxy refused.
    pub refused: usize,
    /// Since when the oldest unserved change waits.
    pub oldest: Option<Instant>,
}

impl Machine {
    /// A machine that knows nothing of HAProxy yet.
    pub fn new(options: MachineOptions) -> Self {
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
        Self {
            backoff: Backoff::new(options.retry),
            jitter: Jitter(options.seed | 1),
            can_reload: options.external_master,
            options,
            wanted: HashMap::new(),
            version: 0,
            pending: Pending::default(),
            awaiting_reload: HashMap::new(),
            refused,
            deferred: HashMap::new(),
            aborts: HashSet::new(),
            startup: None,
            startup_routes: 0,
            listing_complete: false,
            early: HashSet::new(),
            known: None,
            limits: None,
            loaded: None,
            changed_while_loading: HashMap::new(),
            running: false,
            starting: None,
            reloading: None,
            reload_wanted: None,
            last_reload: None,
            load_time: None,
            loads: 0,
            failures: 0,
            retry_at: None,
            next_check: None,
            up: false,
            answered_once: false,
            push_rate: None,
            op: Op::Idle,
            closing: false,
        }
    }

    /// Feeds `event`, happened at `now`; returns what to do.
    pub fn step(&mut self, now: Instant, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Changed {
                name,
                entry,
                arrived,
            } => {
                self.early.remove(&name);
                self.changed(name, entry, arrived, &mut out);
            }
            Event::Decided {
                name,
                entry,
                arrived,
            } => {
                if self.early_pushes() {
                    self.early.insert(name.clone());
                    self.changed(name, Some(entry), arrived, &mut out);
                }
            }
            Event::ListingComplete => self.listing_complete(now, &mut out),
            Event::Resync => {
                info!(socket = %self.options.socket.display(), "re-reading HAProxy's certificates");
                self.known = None;
                self.loaded = None;
            }
            Event::ReloadRequested(reason) => self.reload_wanted = Some(reason),
            Event::Started(result) => self.started(now, result, &mut out),
            Event::Reloaded(result) => self.reloaded(result, &mut out),
            Event::Exited => self.exited(now, &mut out),
            Event::Identity { current, connected } => {
                if matches!(self.op, Op::Identity) {
                    self.op = Op::Idle;
                    self.identity(now, current, connected, &mut out);
                    if !self.closing {
                        self.after_identity(now, &mut out);
                    }
                }
            }
            Event::Answered(outcome) => match std::mem::take(&mut self.op) {
                Op::Discover(discovery) => {
                    if self.discovered(now, discovery, outcome, &mut out) && !self.closing {
                        self.after_discover(now, &mut out);
                    }
                }
                Op::Push(batch) => self.pushed(now, batch, outcome, &mut out),
                other => self.op = other,
            },
            Event::Timer => {
                if matches!(self.op, Op::Idle) && !self.closing {
                    self.decide(now, &mut out);
                }
            }
            Event::Closing => {
                self.closing = true;
                if matches!(self.op, Op::Idle) && self.up && !self.pending.is_empty() {
                    self.push(now, &mut out);
                }
            }
        }
        out
    }

    /// When the driver should give the machine its turn without news (`None`: only
    /// on news). Only what the next turn would act on counts: a start, a reload or an
    /// exchange in progress ends with news, and a retry comes before anything else.
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        if !self.acting() || !matches!(self.op, Op::Idle) || self.closing {
            return None;
        }
        if self.starting.is_some() {
            return None;
        }
        if let Some(retry) = self.retry_at {
            return Some(retry.max(now));
        }
        if self.options.managed && !self.running {
            return Some(now);
        }
        let mut at: Option<Instant> = None;
        let mut earliest = |candidate: Instant| {
            at = Some(at.map_or(candidate, |at| at.min(candidate)));
        };
        if self.reloading.is_none() {
            earliest(self.next_check.unwrap_or(now));
            if self.reload_wanted.is_some() && self.can_reload && self.listing_complete {
                earliest(
                    self.last_reload
                        .map_or(now, |last| last + self.options.min_reload_interval),
                );
            }
        }
        if self.up && self.ready_to_push() {
            for name in self.pending.names().filter(|name| self.may_push(name)) {
                match self.deferred.get(name) {
                    None => return Some(now),
                    Some((_, due)) => earliest(*due),
                }
            }
        }
        at.map(|at| at.max(now))
    }

    /// What the controller says about HAProxy.
    pub fn status(&self) -> HaproxyStatus {
        let state = if !self.listing_complete {
            HaproxyState::WaitingForFiles
        } else if self.starting.is_some() {
            HaproxyState::Starting
        } else if self.up {
            HaproxyState::Serving
        } else {
            HaproxyState::Down
        };
        HaproxyStatus {
            state,
            worker: self.known.as_ref().map(|known| known.instance.pid),
            loads: self.loads,
            reloading: self.reloading.is_some(),
            startup_routes: self.startup_routes,
            startup_unserved: self.startup.as_ref().map_or(0, HashSet::len),
            unserved: self.serving().unserved,
            refused: self.refused.len(),
        }
    }

    /// What HAProxy serves, in figures.
    pub fn serving(&self) -> Serving {
        // Pending removals are not routes to serve; a certificate waits for a reload
        // only for its material, and those are few.
        let unserved = self.pending.to_serve()
            + self
                .awaiting_reload
                .keys()
                .filter(|name| {
                    self.wanted
                        .get(*name)
                        .is_some_and(|want| want.entry.is_some())
                })
                .count();
        let oldest = self
            .pending
            .oldest()
            .into_iter()
            .chain(self.awaiting_reload.values().copied())
            .min();
        Serving {
            unserved,
            refused: self.refused.len(),
            oldest,
        }
    }

    /// Whether HAProxy's runtime API answered the last exchange.
    pub fn up(&self) -> bool {
        self.up
    }

    fn managed(&self, name: &str) -> bool {
        name.starts_with(&self.options.prefix)
    }

    fn ready_to_push(&self) -> bool {
        self.acting() && self.starting.is_none() && self.known.is_some()
    }

    /// Whether decided routes go to HAProxy before the first complete listing: only
    /// to one run by others (a managed HAProxy starts on the complete files).
    fn early_pushes(&self) -> bool {
        !self.listing_complete && !self.options.managed
    }

    /// Whether the machine acts on HAProxy now: once the listing is complete, or
    /// before it for routes decided early ([`Event::Decided`]) and a HAProxy run by
    /// others.
    fn acting(&self) -> bool {
        self.listing_complete || (self.early_pushes() && !self.early.is_empty())
    }

    /// Whether `name`'s pending change may go to HAProxy now: any once the listing is
    /// complete; before it, only an add of a route decided early (a certificate HAProxy
    /// holds nothing of under its name), so that a half-built set neither removes nor
    /// replaces anything.
    fn may_push(&self, name: &str) -> bool {
        if self.listing_complete {
            return !self.holding_for_reload()
                || self
                    .wanted
                    .get(name)
                    .is_none_or(|want| want.entry.is_none());
        }
        let Some(known) = &self.known else {
            return false;
        };
        self.early.contains(name)
            && self
                .wanted
                .get(name)
                .is_some_and(|want| want.entry.is_some())
            && !known.certs.contains_key(name)
            && !known.lines.contains_key(name)
    }

    fn changed(
        &mut self,
        name: String,
        entry: Option<CrtEntry>,
        arrived: Instant,
        out: &mut Vec<Action>,
    ) {
        self.version += 1;
        // A refusal holds until the material changes. A rejected certificate's line
        // leaves the crt-list because of the refusal itself: that is no change.
        let refusal_holds = matches!(
            (self.refused.get(&name), &entry),
            (Some(refusal), Some(entry)) if refusal.digest == entry.digest
        );
        if let Some(refusal) = self.refused.get(&name) {
            let changed = match &entry {
                Some(entry) => entry.digest != refusal.digest,
                None => refusal.reason != RefusalReason::Rejected,
            };
            if changed {
                let reason = refusal.reason;
                self.refused.remove(&name);
                out.push(Action::Report(Report::RefusalLifted {
                    name: name.clone(),
                    reason,
                }));
            }
        }
        if entry.is_none()
            && let Some(startup) = self.startup.as_mut()
        {
            startup.remove(&name);
        }
        self.note_change_while_loading(&name);
        // A change waiting for a reload keeps the time it has waited.
        let since = self.awaiting_reload.remove(&name).unwrap_or(arrived);
        self.deferred.remove(&name);
        // The same refused material again (a route decided early, then named by the
        // complete listing) is not offered again: it would be refused, and counted,
        // twice.
        let serves = entry.is_some();
        if refusal_holds {
            self.pending.set_serves(&name, serves);
        } else {
            self.pending.insert_if_absent(&name, since, serves);
        }
        self.wanted.insert(
            name,
            Want {
                entry,
                version: self.version,
            },
        );
    }

    /// Records what `name` was before its first change since the load in progress
    /// began. Another change before the new worker is read (during the load or
    /// after it) makes it ambiguous.
    fn note_change_while_loading(&mut self, name: &str) {
        if let Some(before) = self.changed_while_loading.get_mut(name) {
            *before = BeforeLoad::Ambiguous;
            return;
        }
        if self.reloading.is_none() && self.starting.is_none() {
            return;
        }
        let before = match self.wanted.get(name) {
            None | Some(Want { entry: None, .. }) => BeforeLoad::Nothing,
            Some(Want {
                entry: Some(entry), ..
            }) => certs::leaf_sha1(&entry.tls).map_or(BeforeLoad::Ambiguous, BeforeLoad::Leaf),
        };
        self.changed_while_loading.insert(name.to_owned(), before);
    }

    fn listing_complete(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.listing_complete {
            return;
        }
        self.listing_complete = true;
        // Decided early, and not in the complete listing: removed or refused since.
        for name in std::mem::take(&mut self.early) {
            self.changed(name, None, now, out);
        }
        // What HAProxy holds of certwatch's and the complete set does not want goes.
        self.mark_strays(now);
        // Attempts made while HAProxy was not there yet (a sidecar that starts on the
        // complete files) do not delay the first one now.
        if !self.answered_once {
            self.failures = 0;
            self.retry_at = None;
            self.backoff = Backoff::new(self.options.retry);
        }
        // A route refused already is not waited for.
        let names: HashSet<String> = self
            .wanted
            .iter()
            .filter(|(name, want)| want.entry.is_some() && !self.is_refused(name, want))
            .map(|(name, _)| name.clone())
            .collect();
        self.startup_routes = names.len();
        self.startup = Some(names);
        info!(
            routes = self.startup_routes,
            "the cert directory is complete; bringing HAProxy there"
        );
    }

    fn started(
        &mut self,
        now: Instant,
        result: Result<Loaded, ProcessError>,
        out: &mut Vec<Action>,
    ) {
        let Some(epoch) = self.starting.take() else {
            return;
        };
        match result {
            Ok(loaded) => {
                self.running = true;
                self.can_reload = true;
                self.loaded = Some((loaded.worker, epoch));
                self.loads += 1;
                self.last_reload = Some(now);
                // The runtime API reaches the new worker from now on.
                out.push(Action::Reconnect);
                self.known = None;
                self.load_time = Some(loaded.took);
                out.push(Action::Count(Count::Loaded {
                    reason: ReloadReason::Start,
                    ok: true,
                    took: Some(loaded.took),
                }));
                self.failures = 0;
                self.backoff = Backoff::new(self.options.retry);
            }
            Err(error) => {
                out.push(Action::Count(Count::Loaded {
                    reason: ReloadReason::Start,
                    ok: false,
                    took: None,
                }));
                self.failed(now, &Failure::Start(error), out);
            }
        }
    }

    fn reloaded(&mut self, result: Result<Loaded, ProcessError>, out: &mut Vec<Action>) {
        let Some(Loading { epoch, reason }) = self.reloading.take() else {
            return;
        };
        match result {
            Ok(loaded) => {
                info!(
                    reason = reason.as_str(),
                    worker = loaded.worker,
                    took = ?loaded.took,
                    "HAProxy reloaded; its new worker serves"
                );
                out.push(Action::Count(Count::Loaded {
                    reason,
                    ok: true,
                    took: Some(loaded.took),
                }));
                self.load_time = Some(loaded.took);
                self.loads += 1;
                self.loaded = Some((loaded.worker, epoch));
                // The old worker finishes its connections once ours is closed.
                out.push(Action::Reconnect);
                self.known = None;
            }
            Err(error) => {
                out.push(Action::Count(Count::Loaded {
                    reason,
                    ok: false,
                    took: None,
                }));
                error!(reason = reason.as_str(), %error, "HAProxy's reload failed; its previous worker keeps serving");
                self.changed_while_loading.clear();
                // Certificates waiting for it stay waiting: the next reload will try.
                if !self.awaiting_reload.is_empty() {
                    self.reload_wanted.get_or_insert(reason);
                }
            }
        }
    }

    /// A managed HAProxy that exited is started again (after the backoff).
    fn exited(&mut self, now: Instant, out: &mut Vec<Action>) {
        if !self.running {
            return;
        }
        self.running = false;
        self.can_reload = false;
        if self.reloading.take().is_some() {
            out.push(Action::CancelReload);
        }
        self.known = None;
        self.loaded = None;
        self.up = false;
        out.push(Action::Count(Count::Up(false)));
        let delay = self.next_delay(now);
        self.retry_at = Some(now + delay);
    }

    fn next_delay(&mut self, now: Instant) -> Duration {
        let draw = self.jitter.draw();
        self.backoff.next_delay_at(now, draw)
    }

    /// Names HAProxy holds under certwatch's prefix that are not wanted become
    /// removals. Only with the complete listing: before it, such a name may be a route
    /// not decided yet.
    fn mark_strays(&mut self, now: Instant) {
        let Some(known) = &self.known else {
            return;
        };
        let strays: HashSet<String> = known
            .certs
            .keys()
            .chain(known.lines.keys())
            .filter(|name| !self.wanted.contains_key(*name))
            .cloned()
            .collect();
        for name in strays {
            self.version += 1;
            self.pending.insert_if_absent(&name, now, false);
            self.wanted.insert(
                name,
                Want {
                    entry: None,
                    version: self.version,
                },
            );
        }
    }

    /// The start of a cycle (see the [module documentation](self)).
    fn decide(&mut self, now: Instant, out: &mut Vec<Action>) {
        if !self.acting() {
            return;
        }
        if self.options.managed && !self.running {
            self.start_if_due(now, out);
            return;
        }
        if self.starting.is_some() {
            return;
        }
        if self.retry_at.is_some_and(|at| now < at) {
            return;
        }
        self.retry_at = None;
        // While HAProxy reloads, the connection reaches the old worker on purpose (it
        // serves until the new one is up); the reload's end says when to move.
        if self.next_check.is_none_or(|at| now >= at) && self.reloading.is_none() {
            self.next_check = Some(now + self.options.check_interval);
            self.op = Op::Identity;
            out.push(Action::CheckIdentity);
            return;
        }
        self.after_identity(now, out);
    }

    fn after_identity(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.known.as_ref().is_none_or(|known| known.stale) {
            self.discover(out);
            return;
        }
        self.after_discover(now, out);
    }

    fn after_discover(&mut self, now: Instant, out: &mut Vec<Action>) {
        // A reload loads the files, which are complete only with the listing.
        if self.listing_complete {
            self.maybe_reload(now, out);
        }
        if !self.pending.is_empty() && !self.push(now, out) {
            self.succeeded(out);
        }
    }

    fn start_if_due(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.starting.is_some() || self.retry_at.is_some_and(|at| now < at) {
            return;
        }
        self.retry_at = None;
        self.starting = Some(self.version);
        self.changed_while_loading.clear();
        out.push(Action::Start);
    }

    /// What the identity check found: another process behind the persistent
    /// connection means reconnecting and reading it.
    fn identity(
        &mut self,
        now: Instant,
        current: Result<Instance, RuntimeError>,
        connected: Option<Connected>,
        out: &mut Vec<Action>,
    ) {
        match (current, connected) {
            (Ok(current), Some(connected)) if connected.instance != current => {
                info!(
                    old = connected.instance.pid,
                    new = current.pid,
                    "HAProxy's process changed; reconnecting and reading its certificates"
                );
                out.push(Action::Reconnect);
                self.known = None;
            }
            (Ok(_), _) => {}
            (Err(error), _) => {
                if self.up {
                    self.failed(now, &Failure::Runtime(error), out);
                }
            }
        }
    }

    /// Starts a reload when one is wanted and allowed now.
    fn maybe_reload(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.reloading.is_some() {
            return;
        }
        if !self.can_reload {
            if let Some(reason) = self.reload_wanted.take() {
                warn!(
                    reason = reason.as_str(),
                    "a reload of HAProxy was asked for, but certwatch cannot reload it (no master socket)"
                );
            }
            return;
        }
        if self.reload_wanted.is_none() && self.backlog_worth_a_reload() {
            self.reload_wanted = Some(ReloadReason::Backlog);
        }
        let Some(reason) = self.reload_wanted else {
            return;
        };
        if self.last_reload.is_some_and(|last| {
            now.saturating_duration_since(last) < self.options.min_reload_interval
        }) {
            return;
        }
        self.reload_wanted = None;
        self.last_reload = Some(now);
        info!(
            reason = reason.as_str(),
            waiting = self.awaiting_reload.len(),
            pending = self.pending.len(),
            "reloading HAProxy"
        );
        self.reloading = Some(Loading {
            epoch: self.version,
            reason,
        });
        self.changed_while_loading.clear();
        out.push(Action::Reload(reason));
    }

    /// Whether changes other than removals wait for the reload in progress instead of
    /// going to the old worker: when what is pending would take longer to push than
    /// HAProxy takes to load its files, the new worker reads it from them.
    fn holding_for_reload(&self) -> bool {
        self.reloading.is_some() && self.backlog_worth_a_reload()
    }

    /// Whether pushing what is pending takes longer than HAProxy loading its files.
    fn backlog_worth_a_reload(&self) -> bool {
        let (Some(rate), Some(load)) = (self.push_rate, self.load_time) else {
            return false;
        };
        let backlog = self.pending.len();
        backlog > BACKLOG_RELOAD_MIN && backlog as f64 / rate > load.as_secs_f64()
    }

    /// `name` is as wanted in HAProxy now. A refused material HAProxy holds after all
    /// (loaded from its file by a restart) is refused no more.
    fn served(&mut self, name: &str, out: &mut Vec<Action>) {
        if self
            .wanted
            .get(name)
            .is_some_and(|want| want.entry.is_some())
            && let Some(refusal) = self.refused.remove(name)
        {
            out.push(Action::Report(Report::RefusalLifted {
                name: name.to_owned(),
                reason: refusal.reason,
            }));
        }
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

    fn is_refused(&self, name: &str, want: &Want) -> bool {
        match (self.refused.get(name), &want.entry) {
            (Some(refusal), Some(entry)) => refusal.digest == entry.digest,
            _ => false,
        }
    }

    /// A bundle too large for one runtime API request: its file is loaded by a reload,
    /// or it is refused.
    fn too_large(&mut self, name: String, size: usize, limit: usize, out: &mut Vec<Action>) {
        let Some(since) = self.pending.remove(&name) else {
            return;
        };
        if self.can_reload {
            if !self.awaiting_reload.contains_key(&name) {
                info!(
                    certificate = %name,
                    size,
                    limit,
                    "certificate too large for HAProxy's runtime API (tune.bufsize); HAProxy will load its file at a reload"
                );
                out.push(Action::Count(Count::Refused(RefusalReason::TooLarge)));
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
        out.push(Action::Count(Count::Refused(RefusalReason::TooLarge)));
        self.refuse(name, RefusalReason::TooLarge, out);
    }

    /// HAProxy rejected a certificate's material.
    fn rejected(&mut self, name: String, message: &str, out: &mut Vec<Action>) {
        warn!(
            certificate = %name,
            answer = %message,
            "HAProxy refused this certificate; it is not served until its material changes"
        );
        out.push(Action::Count(Count::Refused(RefusalReason::Rejected)));
        self.pending.remove(&name);
        self.refuse(name, RefusalReason::Rejected, out);
    }

    fn refuse(&mut self, name: String, reason: RefusalReason, out: &mut Vec<Action>) {
        if let Some(startup) = self.startup.as_mut() {
            startup.remove(&name);
        }
        if let Some(Want {
            entry: Some(entry), ..
        }) = self.wanted.get(&name)
        {
            let digest = entry.digest;
            out.push(Action::Report(Report::Refused {
                name: name.clone(),
                digest,
                reason,
            }));
            self.refused.insert(name, Refusal { digest, reason });
        }
    }

    fn succeeded(&mut self, out: &mut Vec<Action>) {
        if !self.up || self.failures > 0 {
            info!(socket = %self.options.socket.display(), "HAProxy's runtime API answers");
        }
        self.up = true;
        self.answered_once = true;
        self.failures = 0;
        self.retry_at = None;
        self.backoff = Backoff::new(self.options.retry);
        out.push(Action::Count(Count::Up(true)));
    }

    fn failed(&mut self, now: Instant, failure: &Failure, out: &mut Vec<Action>) {
        self.failures = self.failures.saturating_add(1);
        self.up = false;
        // HAProxy started beside certwatch (by its routing task, a sidecar) creates its
        // socket a moment after the files are complete: until it has answered once, a
        // missing socket is said at info, and warned about only once it lasts.
        let starting = !self.answered_once && failure.socket_missing();
        out.push(Action::Count(Count::Up(false)));
        if !starting || self.listing_complete {
            out.push(Action::Count(Count::SyncFailed));
        }
        let delay = self.next_delay(now);
        let warn_at = if starting { STARTING_FAILURES } else { 1 };
        if starting && !self.listing_complete {
            // Before the files are complete, HAProxy may well not run yet; the count
            // starts again with the complete listing.
            debug!(error = %failure, retry_in = ?delay, "HAProxy's runtime API is not there yet");
        } else if self.failures == warn_at {
            warn!(error = %failure, retry_in = ?delay, "HAProxy: cannot bring it up to date; retrying");
        } else if self.failures == 1 {
            info!(
                socket = %self.options.socket.display(),
                "waiting for HAProxy's runtime API (HAProxy is starting)"
            );
        } else {
            debug!(error = %failure, retry_in = ?delay, "HAProxy: still failing; retrying");
        }
        self.retry_at = Some(now + delay);
    }
}
