//! Writes each route's outcome into its status, off the pipeline's path.
//!
//! Writes go through the `status` subresource with the route's resourceVersion, so a
//! concurrent change by someone else is a 409 and the write is redone on a fresh copy;
//! other routers' `status.ingress[]` entries are never overwritten. Updates for one
//! route coalesce (only the latest outcome is written) and a bounded number of writes
//! run at once, so thousands of outcomes at start-up cost no pipeline time.
//!
//! Under the process's adaptive limiter ([`StatusWriter::spawn_with_limiter`]) every
//! write and re-read waits for a permit, and a request the API server refuses for load
//! (429, 5xx) is re-queued in its place until it is answered: a busy server delays a
//! route's status, it never loses it, and the refusal costs no re-read (the server did
//! nothing, so the copy in hand is still current).
//!
//! Any other failed write is retried on a fresh copy after the retry policy's next
//! delay ([`StatusWriterOptions::retry`], [`kube_common::backoff`]); a conflict at once.
//! After five attempts the write is given up until the route's next outcome.
//!
//! Under an election ([`StatusWriterOptions::leadership`]) every PUT is sent only while
//! [`Leadership::is_leader`] says this replica's term lasts, checked right before the
//! request goes out (after any wait for a permit). A write that meets a term run out is
//! held, not lost: it goes out when a renewal extends the term, or is left to the
//! other replica when this one stops leading.
//!
//! When this replica starts leading, the pipeline records every route's outcome again
//! on its latest copy, then says so ([`StatusWriter::rerecorded`]); until then the
//! writer holds what it is given. A route decided in between is then written once,
//! from the re-record, instead of a second time on a copy older than its first write
//! (a 409 and a re-read, for every route decided while the re-record waited its turn).
//!
//! A write that would not change the status is skipped. Together with the pipeline
//! ignoring route events that change nothing but status, this keeps the router from
//! reacting to its own writes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use jiff::Timestamp;
use kube::Client;
use kube::api::ListParams;
use kube_common::adaptive::AdaptiveLimiter;
use kube_common::backoff::{Backoff, BackoffPolicy};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, warn};

use super::leader::Leadership;
use super::paced;
use crate::route::admission::{Admission, RouterIdentity, clear_router_status, record_admission};
use crate::route::{Route, RouteKey};

/// How many times a write is attempted (conflicts and transient errors) before it is
/// given up until the route's next outcome.
const WRITE_ATTEMPTS: u32 = 5;

/// Under a limiter, how many times one request refused for load is re-queued: without
/// end, in effect. Each refusal waits for the server's `Retry-After` (or the backoff
/// delay), so this is no busy loop, and giving up would lose the route's status.
const LOAD_REFUSALS: u32 = u32::MAX;

/// How many updates wait at most for the writer to file them.
const UPDATE_QUEUE: usize = 1024;

/// Counters of a [`StatusWriter`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusStats {
    /// Status updates sent (PUT requests, including ones that failed).
    pub writes: u64,
    /// Writes that met a 409 Conflict and were redone.
    pub conflicts: u64,
    /// Outcomes that needed no write: the status already said so.
    pub skipped: u64,
    /// Outcomes given up after repeated failures.
    pub failed: u64,
    /// Outcomes the status now records (a write accepted).
    pub recorded: u64,
    /// Outcomes not written because another replica writes status (this one does not
    /// lead): it writes them, and this one writes what is still not as desired when it
    /// leads ([`StatusWriterOptions::leadership`]).
    pub followed: u64,
}

#[derive(Default)]
struct Counters {
    writes: AtomicU64,
    conflicts: AtomicU64,
    skipped: AtomicU64,
    failed: AtomicU64,
    recorded: AtomicU64,
    followed: AtomicU64,
}

/// Records route outcomes in `status.ingress[]` for one router, in the background.
#[derive(Clone, Debug)]
pub struct StatusWriter {
    sender: mpsc::Sender<Message>,
    counters: Arc<Counters>,
    leadership: Leadership,
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters").finish_non_exhaustive()
    }
}

/// What the writer is sent, in order.
enum Message {
    /// A route's status to write.
    Update(Update),
    /// Every route's outcome has been recorded again since this replica last started
    /// leading: writes may go out.
    Rerecorded,
}

struct Update {
    route: Arc<Route>,
    key: RouteKey,
    change: Change,
}

/// What a status update does to this router's `status.ingress[]` entry.
enum Change {
    /// Records the route's outcome.
    Record(Admission),
    /// Removes the entry: the route left this router's selection.
    Clear,
}

/// How a [`StatusWriter`] writes.
#[derive(Clone)]
pub struct StatusWriterOptions {
    /// At most this many writes run at once.
    pub concurrency: usize,
    /// Every request (writes, and re-reads after a failed write) sent under this
    /// limiter, and requests the server refuses for load re-queued until answered;
    /// `None`: only `concurrency` paces the writes.
    pub limiter: Option<AdaptiveLimiter>,
    /// Delays between attempts at a write that failed for another reason than a
    /// conflict (which is redone at once).
    pub retry: BackoffPolicy,
    /// Whether this replica writes: outcomes recorded while it does not lead are not
    /// written (another replica writes them). When it starts leading, the pipeline
    /// records every route's outcome again ([`StatusWriter::leadership`]), and only
    /// what the status does not already say is written.
    pub leadership: Leadership,
}

impl StatusWriterOptions {
    /// `concurrency` writes at once, no limiter, the default retry policy, always
    /// writing.
    pub fn new(concurrency: usize) -> Self {
        Self {
            concurrency,
            limiter: None,
            retry: BackoffPolicy::default(),
            leadership: Leadership::always(),
        }
    }
}

impl std::fmt::Debug for StatusWriterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriterOptions")
            .field("concurrency", &self.concurrency)
            .field("limiter", &self.limiter.as_ref().map(|_| "AdaptiveLimiter"))
            .field("retry", &self.retry)
            .field("leadership", &self.leadership)
            .finish()
    }
}

impl StatusWriter {
    /// Starts the writer: at most `concurrency` writes run at once. It stops when every
    /// clone of the writer is dropped.
    pub fn spawn(client: Client, router: RouterIdentity, concurrency: usize) -> Self {
        Self::spawn_with(client, router, StatusWriterOptions::new(concurrency))
    }

    /// The same, with every request (writes, and re-reads after a failed write) sent
    /// under `limiter`, and requests the server refuses for load re-queued until
    /// answered.
    pub fn spawn_with_limiter(
        client: Client,
        router: RouterIdentity,
        concurrency: usize,
        limiter: AdaptiveLimiter,
    ) -> Self {
        let options = StatusWriterOptions {
            limiter: Some(limiter),
            ..StatusWriterOptions::new(concurrency)
        };
        Self::spawn_with(client, router, options)
    }

    /// Starts the writer as `options` say. It stops when every clone of the writer is
    /// dropped.
    pub fn spawn_with(
        client: Client,
        router: RouterIdentity,
        options: StatusWriterOptions,
    ) -> Self {
        let (sender, receiver) = mpsc::channel(UPDATE_QUEUE);
        let counters = Arc::new(Counters::default());
        let leadership = options.leadership;
        let worker = Worker {
            client,
            leading: leadership.subscribe(),
            leadership: leadership.clone(),
            limiter: options.limiter,
            retry: options.retry,
            router: Arc::new(router),
            concurrency: options.concurrency.max(1),
            counters: Arc::clone(&counters),
            awaiting_rerecord: false,
            pending: HashMap::new(),
            order: VecDeque::new(),
            running: HashMap::new(),
            writes: JoinSet::new(),
        };
        tokio::spawn(worker.run(receiver));
        Self {
            sender,
            counters,
            leadership,
        }
    }

    /// Whether this replica writes, and its changes: on each change to leading, every
    /// route's outcome is to be recorded again.
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// Asks for `admission` to be recorded on `route` (the latest copy the caller has;
    /// it is re-read on conflict). Waits only while the writer's queue is full: the
    /// writer files each update at once (the latest per route), whatever its writes
    /// are doing.
    pub async fn record(&self, route: Arc<Route>, admission: Admission) {
        self.send(route, Change::Record(admission)).await;
    }

    /// Asks for this router's `status.ingress[]` entry to be removed from `route`
    /// (which left the router's selection: its labels or its namespace's changed, or
    /// it is gone). Replaces an outcome still waiting for the same route; a route
    /// without the entry costs no request, a deleted one a write answered 404.
    pub async fn clear(&self, route: Arc<Route>) {
        self.send(route, Change::Clear).await;
    }

    /// Says that every route's outcome has been recorded again (through
    /// [`StatusWriter::record`]) since this replica started leading. A writer under an
    /// election holds its writes from the start of each leading until this comes:
    /// whoever drives the writer under an election calls it after each re-record (the
    /// pipeline does, on [`Input::RecordAll`](crate::machine::Input::RecordAll)).
    pub async fn rerecorded(&self) {
        // The worker only stops when every sender is gone, so this cannot fail while
        // `self` exists.
        let _ = self.sender.send(Message::Rerecorded).await;
    }

    async fn send(&self, route: Arc<Route>, change: Change) {
        let Some(key) = route.key() else {
            return;
        };
        // As in `rerecorded`: cannot fail while `self` exists.
        let _ = self
            .sender
            .send(Message::Update(Update { route, key, change }))
            .await;
    }

    /// The writer's counters.
    pub fn stats(&self) -> StatusStats {
        StatusStats {
            writes: self.counters.writes.load(Ordering::Relaxed),
            conflicts: self.counters.conflicts.load(Ordering::Relaxed),
            skipped: self.counters.skipped.load(Ordering::Relaxed),
            failed: self.counters.failed.load(Ordering::Relaxed),
            recorded: self.counters.recorded.load(Ordering::Relaxed),
            followed: self.counters.followed.load(Ordering::Relaxed),
        }
    }
}

struct Worker {
    client: Client,
    /// Whether this replica writes now, as the election last decided.
    leading: watch::Receiver<bool>,
    /// Whether this replica's term lasts now (checked before each request).
    leadership: Leadership,
    /// Paces writes by what the API server accepts; `None`: only `concurrency` does.
    limiter: Option<AdaptiveLimiter>,
    /// Delays between attempts at a failed write.
    retry: BackoffPolicy,
    router: Arc<RouterIdentity>,
    concurrency: usize,
    counters: Arc<Counters>,
    /// This replica started leading and the re-record of every outcome has not come
    /// yet ([`Message::Rerecorded`]): updates wait in `pending`, none is written.
    awaiting_rerecord: bool,
    /// Latest wanted outcome per route not yet being written.
    pending: HashMap<RouteKey, Update>,
    /// Routes with a pending update, oldest first.
    order: VecDeque<RouteKey>,
    /// Routes being written, by task id: at most one write per route at a time.
    running: HashMap<tokio::task::Id, RouteKey>,
    /// Each write gives its update back when this replica's term ran out before it
    /// could be sent.
    writes: JoinSet<Option<Update>>,
}

impl Worker {
    async fn run(mut self, mut messages: mpsc::Receiver<Message>) {
        // Wakes the loop on a change; `follow_election` takes the change in.
        let mut leading = self.leading.clone();
        let mut terms = self.leadership.terms();
        // Until the election ends (its last value then stays).
        let mut electing = true;
        let mut renewing = true;
        loop {
            tokio::select! {
                changed = terms.changed(), if renewing => {
                    if changed.is_err() {
                        renewing = false;
                    } else {
                        // A renewal: writes held while the term had run out go now.
                        terms.borrow_and_update();
                        self.start_writes();
                    }
                }
                changed = leading.changed(), if electing => {
                    if changed.is_err() {
                        electing = false;
                    } else {
                        leading.borrow_and_update();
                        self.follow_election();
                    }
                }
                message = messages.recv() => match message {
                    Some(message) => {
                        // A change of leading the loop has not woken for yet comes
                        // first: the pipeline's re-record follows the change it saw.
                        self.follow_election();
                        match message {
                            Message::Update(update) => self.enqueue(update),
                            Message::Rerecorded => {
                                self.awaiting_rerecord = false;
                                self.start_writes();
                            }
                        }
                    }
                    None if self.writes.is_empty() => return,
                    None => {
                        // Finish what is queued, then stop.
                        while let Some(done) = self.writes.join_next_with_id().await {
                            self.finished(done);
                        }
                        return;
                    }
                },
                Some(done) = self.writes.join_next_with_id(), if !self.writes.is_empty() => {
                    self.finished(done);
                }
            }
        }
    }

    /// Takes in the election's latest decision, if it changed: to following, what waits
    /// is the other replica's to write; to leading, writes wait for the re-record.
    fn follow_election(&mut self) {
        if !self.leading.has_changed().unwrap_or(false) {
            return;
        }
        if *self.leading.borrow_and_update() {
            self.awaiting_rerecord = true;
        } else {
            let dropped = self.pending.len() as u64;
            self.counters.followed.fetch_add(dropped, Ordering::Relaxed);
            self.pending.clear();
            self.order.clear();
        }
    }

    fn enqueue(&mut self, update: Update) {
        if !*self.leading.borrow() {
            self.counters.followed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let key = update.key.clone();
        if self.pending.insert(key.clone(), update).is_none() {
            self.order.push_back(key);
        }
        self.start_writes();
    }

    fn finished(
        &mut self,
        done: Result<(tokio::task::Id, Option<Update>), tokio::task::JoinError>,
    ) {
        let (id, held) = match done {
            Ok((id, held)) => (id, held),
            Err(error) => (error.id(), None),
        };
        self.running.remove(&id);
        if let Some(update) = held {
            if *self.leading.borrow() {
                // Written when the term is renewed, unless a newer outcome waits.
                let key = update.key.clone();
                if let std::collections::hash_map::Entry::Vacant(entry) =
                    self.pending.entry(key.clone())
                {
                    entry.insert(update);
                    self.order.push_front(key);
                }
            } else {
                self.counters.followed.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.start_writes();
    }

    fn start_writes(&mut self) {
        if self.awaiting_rerecord || !self.leadership.is_leader() {
            // Held until the re-record, a renewal (`terms`) or the end of leading
            // (cleared).
            return;
        }
        let mut deferred = Vec::new();
        while self.running.len() < self.concurrency {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            if self.running.values().any(|running| running == &key) {
                // Written after the current write for this route ends.
                deferred.push(key);
                continue;
            }
            let Some(update) = self.pending.remove(&key) else {
                continue;
            };
            let write = write_status(
                self.client.clone(),
                self.leadership.clone(),
                self.limiter.clone(),
                Arc::clone(&self.router),
                self.retry,
                update,
                Arc::clone(&self.counters),
            );
            let handle = self.writes.spawn(write);
            self.running.insert(handle.id(), key);
        }
        for key in deferred.into_iter().rev() {
            self.order.push_front(key);
        }
    }
}

/// What became of one status update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteOutcome {
    /// The status records the outcome now.
    Recorded,
    /// The status recorded it already: nothing was sent.
    Unchanged,
    /// The route is gone: there is no status to write.
    RouteGone,
    /// This replica's term ran out before the request could be sent.
    TermOver,
}

/// Why a route's status could not be written (the last failure of its attempts).
#[derive(Debug, thiserror::Error)]
pub enum StatusWriteError {
    /// The status update was refused or failed.
    #[error("the status update of route {route} failed: {source}")]
    Write {
        /// The route.
        route: RouteKey,
        /// The API server's answer, or the transport's failure.
        source: kube::Error,
    },
    /// The route could not be read again after a failed update.
    #[error("route {route} could not be read again for its status: {source}")]
    Reread {
        /// The route.
        route: RouteKey,
        /// The API server's answer, or the transport's failure.
        source: kube::Error,
    },
}

/// Writes `update`; gives it back when this replica's term ran out first.
async fn write_status(
    client: Client,
    leadership: Leadership,
    limiter: Option<AdaptiveLimiter>,
    router: Arc<RouterIdentity>,
    retry: BackoffPolicy,
    update: Update,
    counters: Arc<Counters>,
) -> Option<Update> {
    let key = update.key.clone();
    let sender = Sending {
        client: &client,
        leadership: &leadership,
        limiter: limiter.as_ref(),
    };
    match write_attempts(sender, &router, retry, &update, &counters).await {
        Ok(WriteOutcome::TermOver) => {
            debug!(route = %key, "the lease term ran out; status write held");
            return Some(update);
        }
        Ok(WriteOutcome::Recorded) => {
            counters.recorded.fetch_add(1, Ordering::Relaxed);
        }
        Ok(WriteOutcome::Unchanged) => {
            counters.skipped.fetch_add(1, Ordering::Relaxed);
        }
        Ok(WriteOutcome::RouteGone) => debug!(route = %key, "route is gone; status not written"),
        Err(error) => {
            warn!(
                route = %key,
                %error,
                "giving up writing the route's status after {WRITE_ATTEMPTS} attempts"
            );
            counters.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    None
}

/// What sends a status write: the client, under the limiter, while the term lasts.
#[derive(Clone, Copy)]
struct Sending<'a> {
    client: &'a Client,
    leadership: &'a Leadership,
    limiter: Option<&'a AdaptiveLimiter>,
}

/// Up to [`WRITE_ATTEMPTS`] attempts at recording `update`: a conflict is redone at
/// once on a fresh copy, another failure after the retry policy's next delay.
async fn write_attempts(
    sender: Sending<'_>,
    router: &RouterIdentity,
    retry: BackoffPolicy,
    update: &Update,
    counters: &Counters,
) -> Result<WriteOutcome, StatusWriteError> {
    let Sending {
        client,
        leadership,
        limiter,
    } = sender;
    let Update { route, key, change } = update;
    let mut backoff = Backoff::new(retry);
    // The last copy of the route read from the server (or handed in). Each attempt
    // records the admission on a fresh clone of it: were the admission recorded on
    // `base` itself, a failed re-read after a 409 would leave a copy that already
    // carries it, and the next attempt would wrongly skip the write as a no-op.
    let mut base = Route::clone(route);
    let mut attempt = 1;
    // A copy without this router's entry may predate a write of it still landing:
    // a removal looks once at the server's copy before it counts as done.
    let mut looked = false;
    loop {
        let mut route = base.clone();
        let changed = match change {
            Change::Record(admission) => {
                record_admission(&mut route, router, admission, Timestamp::now())
            }
            Change::Clear => clear_router_status(&mut route, &router.name),
        };
        if !changed {
            if matches!(change, Change::Clear) && !looked {
                looked = true;
                match reread(client, limiter, key).await {
                    Ok(Some(fresh)) => {
                        base = fresh;
                        continue;
                    }
                    Ok(None) => return Ok(WriteOutcome::RouteGone),
                    Err(_) => return Ok(WriteOutcome::Unchanged),
                }
            }
            return Ok(WriteOutcome::Unchanged);
        }
        let route = &route;
        let written = paced::send(limiter, LOAD_REFUSALS, |attempt| async move {
            // Checked here, after any wait for a permit: the last moment before sending.
            if !leadership.is_leader() {
                return Ok(None);
            }
            counters.writes.fetch_add(1, Ordering::Relaxed);
            paced::replace_status(client, &key.namespace, &key.name, route, attempt)
                .await
                .map(Some)
        })
        .await;
        let source = match written {
            Ok(None) => return Ok(WriteOutcome::TermOver),
            Ok(Some(_)) => return Ok(WriteOutcome::Recorded),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Ok(WriteOutcome::RouteGone);
            }
            Err(source) => source,
        };
        let conflict = matches!(&source, kube::Error::Api(status) if status.code == 409);
        if conflict {
            counters.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        let failure = StatusWriteError::Write {
            route: key.clone(),
            source,
        };
        if attempt == WRITE_ATTEMPTS {
            return Err(failure);
        }
        if !conflict {
            // A conflict is someone else's change, redone at once on a fresh copy; any
            // other failure waits for the retry policy's next delay (tokio's clock, so
            // that tests with a paused clock see the policy).
            debug!(route = %key, attempt, error = %failure, "status write failed; retrying");
            let now = tokio::time::Instant::now().into_std();
            tokio::time::sleep(backoff.next_delay_at(now, rand::random::<f64>())).await;
        }
        match reread(client, limiter, key).await {
            Ok(Some(fresh)) => base = fresh,
            Ok(None) => return Ok(WriteOutcome::RouteGone),
            Err(source) => {
                let failure = StatusWriteError::Reread {
                    route: key.clone(),
                    source,
                };
                debug!(route = %key, error = %failure, "retrying with the copy in hand");
            }
        }
        attempt += 1;
    }
}

/// What [`clear_router_entries`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClearReport {
    /// Routes listed (every namespace).
    pub routes: usize,
    /// Routes whose entry of the router name was removed.
    pub cleared: usize,
    /// Routes deleted before their entry could be removed.
    pub gone: usize,
}

/// Why [`clear_router_entries`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClearError {
    /// Routes could not be listed.
    #[error("cannot list routes: {0}")]
    List(#[source] kube::Error),
    /// One route's status could not be written (after re-reading it on conflicts).
    #[error(transparent)]
    Write(Box<StatusWriteError>),
}

/// Removes every `status.ingress[]` entry of `router_name` from every route the
/// client can list, as an uninstall or a renamed router needs: other routers' entries
/// stay as they are. Each write carries the route's resourceVersion; a conflict is
/// redone on a fresh copy, up to five attempts per route.
pub async fn clear_router_entries(
    client: &Client,
    router_name: &str,
) -> Result<ClearReport, ClearError> {
    let mut report = ClearReport::default();
    let api = kube::Api::<Route>::all(client.clone());
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.map_err(ClearError::List)?;
        report.routes += page.items.len();
        for route in page.items {
            if crate::route::admission::router_ingress(&route, router_name).is_none() {
                continue;
            }
            match clear_one(client, route, router_name).await {
                Ok(WriteOutcome::Recorded) => report.cleared += 1,
                Ok(WriteOutcome::RouteGone) => report.gone += 1,
                Ok(WriteOutcome::Unchanged | WriteOutcome::TermOver) => {}
                Err(error) => return Err(ClearError::Write(Box::new(error))),
            }
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(report),
        }
    }
}

/// Removes `router_name`'s entry from one route, re-read on conflicts.
async fn clear_one(
    client: &Client,
    route: Route,
    router_name: &str,
) -> Result<WriteOutcome, StatusWriteError> {
    let Some(key) = route.key() else {
        return Ok(WriteOutcome::Unchanged);
    };
    let mut base = route;
    let mut attempt = 1;
    loop {
        let mut route = base.clone();
        if !clear_router_status(&mut route, router_name) {
            return Ok(WriteOutcome::Unchanged);
        }
        let written = paced::replace_status(
            client,
            &key.namespace,
            &key.name,
            &route,
            kube_common::adaptive::Attempt::First,
        )
        .await;
        let source = match written {
            Ok(_) => return Ok(WriteOutcome::Recorded),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Ok(WriteOutcome::RouteGone);
            }
            Err(source) => source,
        };
        let conflict = matches!(&source, kube::Error::Api(status) if status.code == 409);
        if !conflict || attempt == WRITE_ATTEMPTS {
            return Err(StatusWriteError::Write { route: key, source });
        }
        match reread(client, None, &key).await {
            Ok(Some(fresh)) => base = fresh,
            Ok(None) => return Ok(WriteOutcome::RouteGone),
            Err(source) => return Err(StatusWriteError::Reread { route: key, source }),
        }
        attempt += 1;
    }
}

/// A fresh copy of one route, by a list narrowed to its name; `None` when it is gone.
///
/// A router may list and watch routes and update their status, but not get them (the
/// `system:router` role and deploy/base/clusterrole.yaml grant exactly that), so neither
/// `GET routes/<name>` nor `GET routes/<name>/status` is allowed.
/// Sent under `limiter` when there is one.
async fn reread(
    client: &Client,
    limiter: Option<&AdaptiveLimiter>,
    key: &RouteKey,
) -> Result<Option<Route>, kube::Error> {
    let params = ListParams::default().fields(&format!("metadata.name={}", key.name));
    let listed = paced::send(limiter, LOAD_REFUSALS, |attempt| {
        paced::list::<Route>(client, &key.namespace, &params, attempt)
    })
    .await;
    match listed {
        Ok(mut routes) => Ok(routes.items.pop()),
        // The collection itself is not served (the Route CRD was removed).
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(error) => Err(error),
    }
}
