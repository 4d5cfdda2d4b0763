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
//! A write that would not change the status is skipped. Together with the pipeline
//! ignoring route events that change nothing but status, this keeps the router from
//! reacting to its own writes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jiff::Timestamp;
use kube::Client;
use kube::api::ListParams;
use kube_common::adaptive::AdaptiveLimiter;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use super::paced;
use crate::route::admission::{Admission, RouterIdentity, record_admission};
use crate::route::{Route, RouteKey};

/// How many times a write is attempted (conflicts and transient errors) before it is
/// given up until the route's next outcome.
const WRITE_ATTEMPTS: u32 = 5;

/// Under a limiter, how many times one request refused for load is re-queued: without
/// end, in effect. Each refusal waits for the server's `Retry-After` (or the backoff
/// delay), so this is no busy loop, and giving up would lose the route's status.
const LOAD_REFUSALS: u32 = u32::MAX;

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
}

#[derive(Default)]
struct Counters {
    writes: AtomicU64,
    conflicts: AtomicU64,
    skipped: AtomicU64,
    failed: AtomicU64,
}

/// Records route outcomes in `status.ingress[]` for one router, in the background.
#[derive(Clone, Debug)]
pub struct StatusWriter {
    sender: mpsc::UnboundedSender<Update>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters").finish_non_exhaustive()
    }
}

struct Update {
    route: Arc<Route>,
    key: RouteKey,
    admission: Admission,
}

impl StatusWriter {
    /// Starts the writer: at most `concurrency` writes run at once. It stops when every
    /// clone of the writer is dropped.
    pub fn spawn(client: Client, router: RouterIdentity, concurrency: usize) -> Self {
        Self::start(client, router, concurrency, None)
    }

    /// The same, with every request (writes, and re-reads after a conflict) sent under
    /// `limiter`, and requests the server refuses for load re-queued until answered.
    pub fn spawn_with_limiter(
        client: Client,
        router: RouterIdentity,
        concurrency: usize,
        limiter: AdaptiveLimiter,
    ) -> Self {
        Self::start(client, router, concurrency, Some(limiter))
    }

    fn start(
        client: Client,
        router: RouterIdentity,
        concurrency: usize,
        limiter: Option<AdaptiveLimiter>,
    ) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let worker = Worker {
            client,
            limiter,
            router: Arc::new(router),
            concurrency: concurrency.max(1),
            counters: Arc::clone(&counters),
            pending: HashMap::new(),
            order: VecDeque::new(),
            running: HashMap::new(),
            writes: JoinSet::new(),
        };
        tokio::spawn(worker.run(receiver));
        Self { sender, counters }
    }

    /// Asks for `admission` to be recorded on `route` (the latest copy the caller has;
    /// it is re-read on conflict).
    pub fn record(&self, route: Arc<Route>, admission: Admission) {
        let Some(key) = route.key() else {
            return;
        };
        // The worker only stops when every sender is gone, so this cannot fail while
        // `self` exists.
        let _ = self.sender.send(Update {
            route,
            key,
            admission,
        });
    }

    /// The writer's counters.
    pub fn stats(&self) -> StatusStats {
        StatusStats {
            writes: self.counters.writes.load(Ordering::Relaxed),
            conflicts: self.counters.conflicts.load(Ordering::Relaxed),
            skipped: self.counters.skipped.load(Ordering::Relaxed),
            failed: self.counters.failed.load(Ordering::Relaxed),
        }
    }
}

struct Worker {
    client: Client,
    /// Paces writes by what the API server accepts; `None`: only `concurrency` does.
    limiter: Option<AdaptiveLimiter>,
    router: Arc<RouterIdentity>,
    concurrency: usize,
    counters: Arc<Counters>,
    /// Latest wanted outcome per route not yet being written.
    pending: HashMap<RouteKey, Update>,
    /// Routes with a pending update, oldest first.
    order: VecDeque<RouteKey>,
    /// Routes being written, by task id: at most one write per route at a time.
    running: HashMap<tokio::task::Id, RouteKey>,
    writes: JoinSet<()>,
}

impl Worker {
    async fn run(mut self, mut updates: mpsc::UnboundedReceiver<Update>) {
        loop {
            tokio::select! {
                update = updates.recv() => match update {
                    Some(update) => self.enqueue(update),
                    None if self.writes.is_empty() => return,
                    None => {
                        // Finish what is queued, then stop.
                        while let Some(done) = self.writes.join_next_with_id().await {
                            self.finished(done.map(|(id, ())| id).unwrap_or_else(|err| err.id()));
                        }
                        return;
                    }
                },
                Some(done) = self.writes.join_next_with_id(), if !self.writes.is_empty() => {
                    self.finished(done.map(|(id, ())| id).unwrap_or_else(|err| err.id()));
                }
            }
        }
    }

    fn enqueue(&mut self, update: Update) {
        let key = update.key.clone();
        if self.pending.insert(key.clone(), update).is_none() {
            self.order.push_back(key);
        }
        self.start_writes();
    }

    fn finished(&mut self, id: tokio::task::Id) {
        self.running.remove(&id);
        self.start_writes();
    }

    fn start_writes(&mut self) {
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
                self.limiter.clone(),
                Arc::clone(&self.router),
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

async fn write_status(
    client: Client,
    limiter: Option<AdaptiveLimiter>,
    router: Arc<RouterIdentity>,
    update: Update,
    counters: Arc<Counters>,
) {
    let Update {
        route,
        key,
        admission,
    } = update;
    // The last copy of the route read from the server (or handed in). Each attempt
    // records the admission on a fresh clone of it: were the admission recorded on
    // `base` itself, a failed re-read after a 409 would leave a copy that already
    // carries it, and the next attempt would wrongly skip the write as a no-op.
    let mut base = (*route).clone();
    for attempt in 1..=WRITE_ATTEMPTS {
        let mut route = base.clone();
        if !record_admission(&mut route, &router, &admission, Timestamp::now()) {
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let written = paced::send(limiter.as_ref(), LOAD_REFUSALS, |attempt| {
            counters.writes.fetch_add(1, Ordering::Relaxed);
            paced::replace_status(&client, &key.namespace, &key.name, &route, attempt)
        })
        .await;
        let refreshed = match written {
            Ok(_) => return,
            Err(kube::Error::Api(status)) if status.code == 404 => {
                debug!(route = %key, "route is gone; status not written");
                return;
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                counters.conflicts.fetch_add(1, Ordering::Relaxed);
                reread(&client, limiter.as_ref(), &key).await
            }
            Err(err) => {
                debug!(route = %key, attempt, error = %err, "status write failed; retrying");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                reread(&client, limiter.as_ref(), &key).await
            }
        };
        match refreshed {
            Ok(fresh) => base = fresh,
            Err(kube::Error::Api(status)) if status.code == 404 => return,
            Err(err) => debug!(route = %key, error = %err, "cannot re-read route for its status"),
        }
    }
    warn!(route = %key, "giving up writing the route's status after {WRITE_ATTEMPTS} attempts");
    counters.failed.fetch_add(1, Ordering::Relaxed);
}

/// A fresh copy of one route, by a list narrowed to its name.
///
/// A router may list and watch routes and update their status, but not get them (the
/// `system:router` role and deploy/base/clusterrole.yaml grant exactly that), so neither
/// `GET routes/<name>` nor `GET routes/<name>/status` is allowed.
/// Sent under `limiter` when there is one.
async fn reread(
    client: &Client,
    limiter: Option<&AdaptiveLimiter>,
    key: &RouteKey,
) -> Result<Route, kube::Error> {
    let name = &key.name;
    let params = ListParams::default().fields(&format!("metadata.name={name}"));
    let mut routes = paced::send(limiter, LOAD_REFUSALS, |attempt| {
        paced::list::<Route>(client, &key.namespace, &params, attempt)
    })
    .await?
    .items;
    match routes.pop() {
        Some(route) => Ok(route),
        None => Err(kube::Error::Api(
            kube::core::Status::failure(&format!("route {name} not found"), "NotFound")
                .with_code(404)
                .boxed(),
        )),
    }
}
