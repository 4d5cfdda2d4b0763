//! The pool of HTTP/2 connections: stream slots, when to open another connection, and
//! dropping dead ones.
//!
//! # Accounting
//!
//! Every HTTP/2 connection has a limit, `min(cap, server's SETTINGS_MAX_CONCURRENT_STREAMS)`,
//! read from h2 each time a slot is handed out (a server may change it mid-connection).
//! A request takes a *slot* on a connection before it opens its stream and gives it back
//! when its response body ends or is dropped (see [`StreamSlot`]). Slots are counted under
//! the origin's lock, so requests racing for the last slot cannot over-subscribe a
//! connection: the pool never asks h2 for more streams than the server allows, so h2's
//! internal queue of streams beyond the limit (which is what makes hyper's legacy client
//! hang the 101st watch) is never used.
//!
//! # Opening connections
//!
//! A request that finds no free slot registers as *waiting*. The connections are planned
//! for *long-lived* requests (watches, which hold their stream for minutes, and requests
//! marked [`kube_common::hint::LongLived`], such as the list a watch follows): an origin
//! wants `ceil(long / limit)` connections for the long-lived requests in flight or
//! waiting, plus at most one more for everything else (lists, gets, access reviews,
//! status writes), and never more than all its requests fill. Short requests beyond
//! that wait for a slot, which they get back within a round trip. So 10,000 watches and
//! a few hundred access reviews started together open 101 connections, not 103, and
//! 1,000 watches arriving at once open about 1,000 / 100 connections, concurrently,
//! rather than one or a thousand. While the origin's protocol and limit are still
//! unknown, only one connection is opened; its SETTINGS then tell how many more are
//! needed. Connection attempts run in their own task, so a request that gives up does
//! not abort a connect others wait for.
//!
//! A failed connection attempt fails every request that was waiting when it failed
//! (their callers retry with backoff); the next request starts a fresh attempt.
//!
//! # Dead connections
//!
//! Each connection is driven by its own task ([`connection::drive`]). After every poll
//! the task checks whether h2 still accepts new streams; once a GOAWAY arrived (or the
//! connection failed) the pool stops placing streams on it and drops its handle, so the
//! connection closes after its last stream. When the task ends (closed, I/O error,
//! keep-alive PING unanswered) the connection leaves the pool; streams still on it fail
//! with [`Error::ConnectionLost`](crate::Error::ConnectionLost).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicU64, Ordering},
    },
    task::Context,
};

use bytes::Bytes;
use h2::client::SendRequest;
use kube_common::sync::lock;
use tokio::sync::Notify;

use crate::{
    connection::{self, CloseReason, ConnectionOwner, Handshaken, Keepalive, SendPace},
    error::{ConnectError, Error},
    options::Protocol,
    stats::{ConnectionInfo, Counters},
    transport::{Connector, Origin, Purpose, with_timeout},
};

/// Settings every origin pool shares.
pub(crate) struct PoolConfig {
    /// Opens TCP/TLS connections.
    pub(crate) connector: Arc<Connector>,
    /// Which HTTP versions to speak.
    pub(crate) protocol: Protocol,
    /// Cap on streams per connection (at least 1).
    pub(crate) stream_cap: usize,
    /// Keep-alive PING timing.
    pub(crate) keepalive: Keepalive,
    /// Idle HTTP/2 connections kept per origin.
    pub(crate) max_idle: usize,
    /// Shared counters.
    pub(crate) counters: Arc<Counters>,
}

/// All HTTP/2 connections of one client, per origin.
pub(crate) struct Pool {
    config: Arc<PoolConfig>,
    /// Source of connection ids, unique across origins.
    next_connection_id: Arc<AtomicU64>,
    /// Guards the table of origins; held only to look up or insert an entry.
    origins: Mutex<HashMap<Origin, Arc<OriginPool>>>,
}

impl Pool {
    pub(crate) fn new(config: PoolConfig) -> Self {
        Self {
            config: Arc::new(config),
            next_connection_id: Arc::new(AtomicU64::new(1)),
            origins: Mutex::new(HashMap::new()),
        }
    }

    /// The pool of one origin, created on first use.
    pub(crate) fn origin(&self, origin: &Origin) -> Arc<OriginPool> {
        let mut origins = lock(&self.origins);
        if let Some(existing) = origins.get(origin) {
            return existing.clone();
        }
        let created = Arc::new(OriginPool {
            origin: origin.clone(),
            label: origin.to_string().into(),
            config: self.config.clone(),
            next_connection_id: self.next_connection_id.clone(),
            state: Mutex::new(OriginState::default()),
            changed: Notify::new(),
        });
        origins.insert(origin.clone(), created.clone());
        created
    }

    /// Every HTTP/2 connection of every origin, in opening order.
    pub(crate) fn connections(&self) -> Vec<ConnectionInfo> {
        let origins: Vec<Arc<OriginPool>> = lock(&self.origins).values().cloned().collect();
        let mut all: Vec<ConnectionInfo> = origins.iter().flat_map(|o| o.connections()).collect();
        all.sort_by_key(|c| c.id);
        all
    }
}

/// What the origin's protocol turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Learned {
    /// No connection attempt has finished yet.
    #[default]
    Unknown,
    /// The server speaks HTTP/2.
    Http2,
    /// The server does not speak HTTP/2 (ALPN chose http/1.1, or the h2c preface was
    /// rejected): every later request goes over HTTP/1.1.
    Http1,
}

/// One HTTP/2 connection in the pool.
struct ConnEntry {
    /// The pool's id of the connection.
    id: u64,
    /// Handle to open streams; `None` once the connection stopped accepting streams
    /// (GOAWAY, error) or was retired as surplus idle. Dropping the last handle lets h2
    /// close the connection once its streams are done.
    send: Option<SendRequest<Bytes>>,
    /// Effective stream limit: `min(cap, server's SETTINGS_MAX_CONCURRENT_STREAMS)`.
    /// Cached (refreshed by the driver after each poll, which is when h2 applies new
    /// SETTINGS), so that scanning for a free slot does not take h2's lock per entry.
    limit: usize,
    /// Slots taken now.
    in_use: usize,
    /// Of those, slots taken by long-lived requests (watches).
    long_in_use: usize,
    /// Most slots ever taken at once.
    peak: usize,
    /// A stream on it failed because the connection failed.
    failed: bool,
    /// Paces the requests queued on it between runs of its task.
    pace: Arc<SendPace>,
}

/// A slot [`OriginState::take_slot`] found.
struct TakenSlot {
    connection: u64,
    send: SendRequest<Bytes>,
    /// Slots of the connection in use, this one included.
    in_use: usize,
    pace: Arc<SendPace>,
}

/// The mutable state of one origin.
#[derive(Default)]
struct OriginState {
    protocol: Learned,
    /// Connections in opening order; a request takes the first with a free slot.
    connections: Vec<ConnEntry>,
    /// Connection attempts in flight.
    connecting: usize,
    /// Requests waiting for a slot.
    waiting: usize,
    /// Of those, long-lived requests (watches).
    waiting_long: usize,
    /// The server's stream limit as of the latest new connection.
    learned_limit: Option<usize>,
    /// Number of failed connection attempts so far; a waiter that sees it change fails.
    failed_connects: u64,
    /// Why the latest attempt failed.
    last_connect_error: Option<Arc<ConnectError>>,
}

impl OriginState {
    fn take_slot(&mut self, long_lived: bool) -> Option<TakenSlot> {
        self.connections.iter_mut().find_map(|entry| {
            if entry.in_use >= entry.limit {
                return None;
            }
            let send = entry.send.clone()?;
            entry.in_use += 1;
            entry.long_in_use += usize::from(long_lived);
            entry.peak = entry.peak.max(entry.in_use);
            Some(TakenSlot {
                connection: entry.id,
                send,
                in_use: entry.in_use,
                pace: Arc::clone(&entry.pace),
            })
        })
    }

    /// Whether the waiting requests need one more connection than the origin has or is
    /// opening: see the module docs.
    fn wants_connection(&self, cap: usize) -> bool {
        match self.protocol {
            Learned::Http1 => false,
            // One probe at a time until ALPN / SETTINGS tell what a connection holds.
            Learned::Unknown => self.connecting == 0,
            // A server that advertises no streams at all: do not storm it, probe again.
            Learned::Http2 if self.learned_limit == Some(0) => self.connecting == 0,
            Learned::Http2 => {
                if self.waiting == 0 {
                    return false;
                }
                let per_connection = self.learned_limit.unwrap_or(cap).clamp(1, cap);
                let (mut accepting, mut all, mut long) = (0, self.waiting, self.waiting_long);
                for entry in self.connections.iter().filter(|c| c.send.is_some()) {
                    accepting += 1;
                    all += entry.in_use;
                    long += entry.long_in_use;
                }
                accepting + self.connecting < connections_wanted(all, long, per_connection)
            }
        }
    }
}

/// How many connections `requests` streams need, `long_lived` of them watches, at
/// `per_connection` streams each: enough for the watches, plus at most one for the
/// rest (which take turns on it), and never more than all of them fill.
fn connections_wanted(requests: usize, long_lived: usize, per_connection: usize) -> usize {
    requests
        .div_ceil(per_connection)
        .min(long_lived.div_ceil(per_connection) + 1)
}

/// The connections of one origin.
pub(crate) struct OriginPool {
    /// Where the connections go.
    pub(crate) origin: Origin,
    /// `origin` rendered once, for errors and logs.
    pub(crate) label: Arc<str>,
    config: Arc<PoolConfig>,
    next_connection_id: Arc<AtomicU64>,
    /// Guards the connection list and the bookkeeping that decides when to open another:
    /// slots in use per connection, attempts in flight, waiting requests, what was
    /// learned about the protocol. Never held across an `.await`.
    state: Mutex<OriginState>,
    /// Woken when a slot may have come free, a connection was added, stopped accepting
    /// streams or closed, or a connection attempt finished.
    changed: Notify,
}

/// The outcome of [`OriginPool::acquire`].
pub(crate) enum Acquired {
    /// A slot on an HTTP/2 connection.
    Http2(Grant),
    /// The origin does not speak HTTP/2: use HTTP/1.1.
    Http1,
}

/// A slot on a connection and the handle to open the stream with.
pub(crate) struct Grant {
    /// The connection's id.
    pub(crate) connection: u64,
    /// A handle to that connection.
    pub(crate) send: SendRequest<Bytes>,
    /// Gives the slot back when dropped.
    pub(crate) slot: StreamSlot,
    /// The connection's pace: a permit is taken before the request is queued.
    pub(crate) pace: Arc<SendPace>,
}

/// Counts a request among the origin's waiting requests while it waits.
struct Waiter<'a> {
    origin: &'a OriginPool,
    /// Whether the request is long-lived (a watch).
    long_lived: bool,
    registered: bool,
    /// `failed_connects` when this request started waiting.
    epoch: u64,
}

impl Waiter<'_> {
    fn register(&mut self, state: &mut OriginState) {
        if !self.registered {
            state.waiting += 1;
            state.waiting_long += usize::from(self.long_lived);
            self.registered = true;
            self.epoch = state.failed_connects;
        }
    }

    fn leave(&mut self, state: &mut OriginState) {
        if self.registered {
            state.waiting -= 1;
            state.waiting_long -= usize::from(self.long_lived);
            self.registered = false;
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        // Only reached with `registered` when the request was cancelled while waiting.
        if self.registered {
            let mut state = lock(&self.origin.state);
            state.waiting -= 1;
            state.waiting_long -= usize::from(self.long_lived);
        }
    }
}

impl OriginPool {
    /// Waits for a free stream slot, opening connections as needed. `long_lived`
    /// requests (watches) are the ones connections are planned for.
    pub(crate) async fn acquire(self: &Arc<Self>, long_lived: bool) -> Result<Acquired, Error> {
        let cap = self.config.stream_cap;
        let mut waiter = Waiter {
            origin: self,
            long_lived,
            registered: false,
            epoch: 0,
        };
        loop {
            // Enabled before the state is inspected, so a change made between the
            // inspection and the `.await` still wakes us.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let start_connect = {
                let mut state = lock(&self.state);
                if state.protocol == Learned::Http1 {
                    waiter.leave(&mut state);
                    return Ok(Acquired::Http1);
                }
                if let Some(TakenSlot {
                    connection,
                    send,
                    in_use,
                    pace,
                }) = state.take_slot(long_lived)
                {
                    waiter.leave(&mut state);
                    drop(state);
                    let counters = &self.config.counters;
                    Counters::inc(&counters.active_streams);
                    counters
                        .peak_streams_per_connection
                        .fetch_max(in_use as u64, Ordering::Relaxed);
                    return Ok(Acquired::Http2(Grant {
                        connection,
                        send,
                        slot: StreamSlot::http2(self.clone(), connection, long_lived),
                        pace,
                    }));
                }
                if waiter.registered
                    && state.failed_connects != waiter.epoch
                    && let Some(source) = state.last_connect_error.clone()
                {
                    waiter.leave(&mut state);
                    return Err(Error::Connect {
                        origin: self.label.to_string(),
                        source,
                    });
                }
                waiter.register(&mut state);
                let start = state.wants_connection(cap);
                if start {
                    state.connecting += 1;
                }
                start
            };
            if start_connect {
                tokio::spawn(connect(self.clone()));
            }
            notified.await;
        }
    }

    /// Gives a slot back; retires the connection if it is now a surplus idle one.
    fn release(&self, connection: u64, long_lived: bool) {
        // First, so that whoever sees the effects of the release (a closed surplus
        // connection) also sees the stream gone from the count.
        Counters::dec(&self.config.counters.active_streams);
        let mut retired = None;
        let wake = {
            let mut state = lock(&self.state);
            let waiting = state.waiting;
            let idle = state
                .connections
                .iter()
                .filter(|c| c.in_use == 0 && c.send.is_some())
                .count();
            if let Some(entry) = state.connections.iter_mut().find(|c| c.id == connection) {
                entry.in_use = entry.in_use.saturating_sub(1);
                entry.long_in_use = entry.long_in_use.saturating_sub(usize::from(long_lived));
                // `idle` was counted before this release, so this entry is idle number
                // `idle + 1`.
                if entry.in_use == 0 && waiting == 0 && idle >= self.config.max_idle {
                    retired = entry.send.take();
                }
            }
            waiting > 0
        };
        if retired.is_some() {
            tracing::debug!(origin = %self.label, connection, "closing surplus idle HTTP/2 connection");
        }
        // Dropped outside the lock: it takes h2's own lock and may wake the driver.
        drop(retired);
        if wake {
            self.changed.notify_waiters();
        }
    }

    /// Stops placing streams on a connection that refused one (GOAWAY or error).
    pub(crate) fn stop_using(&self, connection: u64) {
        let dropped = lock(&self.state)
            .connections
            .iter_mut()
            .find(|c| c.id == connection)
            .and_then(|c| c.send.take());
        drop(dropped);
        self.changed.notify_waiters();
    }

    fn connections(&self) -> Vec<ConnectionInfo> {
        lock(&self.state)
            .connections
            .iter()
            .map(|c| ConnectionInfo {
                id: c.id,
                origin: self.label.to_string(),
                active_streams: c.in_use,
                peak_streams: c.peak,
                stream_limit: c.limit,
                accepting_streams: c.send.is_some(),
            })
            .collect()
    }
}

/// A connection attempt that ended: with HTTP/2, or the news that the origin speaks
/// HTTP/1.1 only.
enum Established {
    Http2(Box<Handshaken>),
    Http1,
}

/// Opens a connection and adds it to the pool (or records what went wrong).
async fn connect(origin: Arc<OriginPool>) {
    let config = origin.config.clone();
    let counters = &config.counters;
    let result = establish(&config, &origin.origin).await;
    let mut new_connection = None;
    {
        let mut state = lock(&origin.state);
        state.connecting -= 1;
        match result {
            Ok(Established::Http2(handshaken)) => {
                let id = origin.next_connection_id.fetch_add(1, Ordering::Relaxed);
                state.protocol = Learned::Http2;
                state.learned_limit = Some(handshaken.server_limit);
                state.connections.push(ConnEntry {
                    id,
                    send: Some(handshaken.send.clone()),
                    limit: handshaken.server_limit.min(config.stream_cap),
                    in_use: 0,
                    long_in_use: 0,
                    peak: 0,
                    failed: false,
                    pace: Arc::clone(&handshaken.pace),
                });
                Counters::inc(&counters.http2_opened);
                Counters::inc(&counters.http2_open);
                new_connection = Some((id, handshaken));
            }
            Ok(Established::Http1) => {
                state.protocol = Learned::Http1;
                Counters::inc(&counters.http1_fallbacks);
                tracing::info!(origin = %origin.label, "server does not speak HTTP/2; using HTTP/1.1");
            }
            Err(error) => {
                state.failed_connects += 1;
                tracing::warn!(origin = %origin.label, %error, "opening an HTTP/2 connection failed");
                state.last_connect_error = Some(Arc::new(error));
                Counters::inc(&counters.connect_failures);
            }
        }
    }
    // Spawned only after the entry is in the list, so the driver's removal on close
    // always finds it.
    if let Some((id, handshaken)) = new_connection {
        tracing::debug!(
            origin = %origin.label,
            connection = id,
            server_limit = handshaken.server_limit,
            "opened HTTP/2 connection"
        );
        let owner = Owner {
            origin: Arc::downgrade(&origin),
            counters: config.counters.clone(),
            label: origin.label.clone(),
            connection: id,
            accepting: true,
        };
        tokio::spawn(connection::drive(*handshaken, config.keepalive, owner));
    }
    origin.changed.notify_waiters();
}

/// TCP, TLS, and the HTTP/2 SETTINGS exchange, all under the connect timeout.
async fn establish(config: &PoolConfig, origin: &Origin) -> Result<Established, ConnectError> {
    let connector = &config.connector;
    with_timeout(connector.connect_timeout, async {
        let connected = connector
            .connect_untimed(origin, Purpose::Http2Pool)
            .await?;
        let require_h2 = config.protocol == Protocol::Http2Only;
        match connected.alpn_h2 {
            Some(false) if require_h2 => Err(ConnectError::Http2NotOffered),
            Some(false) => Ok(Established::Http1),
            Some(true) => match connection::handshake(connected.io, config.stream_cap).await {
                Ok(handshaken) => Ok(Established::Http2(Box::new(handshaken))),
                Err(failed) => Err(failed
                    .source
                    .map_or(ConnectError::ClosedBeforeSettings, ConnectError::Http2Handshake)),
            },
            // Plain TCP: only the preface exchange tells whether the server speaks h2c.
            None => match connection::handshake(connected.io, config.stream_cap).await {
                Ok(handshaken) => Ok(Established::Http2(Box::new(handshaken))),
                Err(failed) if require_h2 => {
                    Err(ConnectError::Http2PrefaceRejected(failed.to_string()))
                }
                Err(failed) => {
                    tracing::debug!(%origin, reason = %failed, "server rejected the HTTP/2 preface");
                    Ok(Established::Http1)
                }
            },
        }
    })
    .await
}

/// The pool's side of a connection's driver task.
struct Owner {
    origin: Weak<OriginPool>,
    counters: Arc<Counters>,
    label: Arc<str>,
    connection: u64,
    /// Cleared once the connection stopped accepting streams, to skip further checks.
    accepting: bool,
}

impl ConnectionOwner for Owner {
    fn after_poll(&mut self, cx: &mut Context<'_>) {
        if !self.accepting {
            return;
        }
        let Some(origin) = self.origin.upgrade() else {
            self.accepting = false;
            return;
        };
        let cap = origin.config.stream_cap;
        let mut limit_raised = false;
        let stopped = {
            let mut state = lock(&origin.state);
            match state
                .connections
                .iter_mut()
                .find(|c| c.id == self.connection)
            {
                Some(entry) => match entry.send.as_mut() {
                    Some(send) => {
                        if connection::accepts_new_streams(send, cx) {
                            let limit = send.current_max_send_streams().min(cap);
                            limit_raised = limit > entry.limit;
                            entry.limit = limit;
                            None
                        } else {
                            Some(entry.send.take())
                        }
                    }
                    None => Some(None),
                },
                None => Some(None),
            }
        };
        if limit_raised {
            origin.changed.notify_waiters();
        }
        if let Some(handle) = stopped {
            self.accepting = false;
            if handle.is_some() {
                tracing::debug!(
                    origin = %self.label,
                    connection = self.connection,
                    "HTTP/2 connection stopped accepting streams (GOAWAY); draining"
                );
                drop(handle);
                origin.changed.notify_waiters();
            }
        }
    }

    fn closed(self, reason: CloseReason) {
        let removed = self.origin.upgrade().and_then(|origin| {
            let removed = {
                let mut state = lock(&origin.state);
                let position = state
                    .connections
                    .iter()
                    .position(|c| c.id == self.connection);
                position.map(|i| state.connections.remove(i))
            };
            origin.changed.notify_waiters();
            removed
        });
        // h2 reports a peer's plain TCP close as a clean end; if streams were cut off by
        // it, it is a loss all the same. (Streams may have given their slots back before
        // this runs; they flag the entry then.)
        let streams_cut = removed.as_ref().map_or(0, |entry| entry.in_use);
        let failed = removed.as_ref().is_some_and(|entry| entry.failed);
        if matches!(reason, CloseReason::Closed) && streams_cut == 0 && !failed {
            tracing::debug!(
                origin = %self.label,
                connection = self.connection,
                "HTTP/2 connection closed"
            );
        } else {
            Counters::inc(&self.counters.connections_lost);
            tracing::warn!(
                origin = %self.label,
                connection = self.connection,
                %reason,
                streams_cut,
                "HTTP/2 connection lost"
            );
        }
        // Last, so that whoever sees the connection gone also sees it counted as lost.
        self.counters.connection_closed(&self.counters.http2_open);
        drop(removed);
    }
}

/// A request's hold on a stream slot, given back when dropped.
///
/// The response body owns it, so an open watch holds its slot for its whole life; an
/// error anywhere drops it, so failures give slots back too.
pub(crate) struct StreamSlot {
    release: Release,
}

enum Release {
    /// A slot on an HTTP/2 connection.
    Http2 {
        origin: Arc<OriginPool>,
        connection: u64,
        long_lived: bool,
    },
    /// An HTTP/1.1 request in flight (only counted).
    Http1 { counters: Arc<Counters> },
}

impl StreamSlot {
    fn http2(origin: Arc<OriginPool>, connection: u64, long_lived: bool) -> Self {
        Self {
            release: Release::Http2 {
                origin,
                connection,
                long_lived,
            },
        }
    }

    /// Records that this stream failed because its connection failed, so that the
    /// connection's end counts as a loss even if the peer closed it "cleanly".
    pub(crate) fn connection_failed(&self) {
        if let Release::Http2 {
            origin, connection, ..
        } = &self.release
            && let Some(entry) = lock(&origin.state)
                .connections
                .iter_mut()
                .find(|c| c.id == *connection)
        {
            entry.failed = true;
        }
    }

    /// Counts an HTTP/1.1 request as an active stream until dropped.
    pub(crate) fn http1(counters: Arc<Counters>) -> Self {
        Counters::inc(&counters.active_streams);
        Self {
            release: Release::Http1 { counters },
        }
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        match &self.release {
            Release::Http2 {
                origin,
                connection,
                long_lived,
            } => origin.release(*connection, *long_lived),
            Release::Http1 { counters } => Counters::dec(&counters.active_streams),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An origin whose `waiting` requests are all watches.
    fn state(
        protocol: Learned,
        waiting: usize,
        connecting: usize,
        limit: Option<usize>,
    ) -> OriginState {
        OriginState {
            protocol,
            waiting,
            waiting_long: waiting,
            connecting,
            learned_limit: limit,
            ..OriginState::default()
        }
    }

    #[test]
    fn unknown_origin_probes_with_one_connection() {
        assert!(state(Learned::Unknown, 1000, 0, None).wants_connection(100));
        assert!(!state(Learned::Unknown, 1000, 1, None).wants_connection(100));
    }

    #[test]
    fn http2_origin_opens_one_connection_per_limit_of_waiters() {
        // 900 waiting at limit 100: connections 1..=9 are wanted, the 10th is not.
        for connecting in 0..9 {
            assert!(state(Learned::Http2, 900, connecting, Some(100)).wants_connection(100));
        }
        assert!(!state(Learned::Http2, 900, 9, Some(100)).wants_connection(100));
        // The server's lower limit wins over the cap.
        assert!(state(Learned::Http2, 25, 2, Some(10)).wants_connection(100));
        assert!(!state(Learned::Http2, 25, 3, Some(10)).wants_connection(100));
        // The cap wins over a higher server limit; "unlimited" is capped too.
        assert!(state(Learned::Http2, 25, 2, Some(usize::MAX)).wants_connection(10));
        assert!(!state(Learned::Http2, 25, 3, Some(usize::MAX)).wants_connection(10));
    }

    #[test]
    fn a_server_advertising_zero_streams_gets_one_attempt_at_a_time() {
        assert!(state(Learned::Http2, 50, 0, Some(0)).wants_connection(100));
        assert!(!state(Learned::Http2, 50, 1, Some(0)).wants_connection(100));
    }

    #[test]
    fn http1_origin_never_opens_http2_connections() {
        assert!(!state(Learned::Http1, 5, 0, None).wants_connection(100));
    }

    /// How many connections an origin without any opens for `waiting` requests,
    /// `waiting_long` of them watches, at limit 100.
    fn planned(waiting: usize, waiting_long: usize) -> usize {
        (0..10_000)
            .find(|&connecting| {
                !OriginState {
                    protocol: Learned::Http2,
                    waiting,
                    waiting_long,
                    connecting,
                    learned_limit: Some(100),
                    ..OriginState::default()
                }
                .wants_connection(100)
            })
            .unwrap_or(usize::MAX)
    }

    #[test]
    fn connections_are_planned_for_watches_plus_one_for_short_requests() {
        // 10,000 secret watches and the route watch, with 100 or 250 namespaces' access
        // reviews and the route list started at the same moment: 101 connections for the
        // watches, one more for the rest, however much there is (target: N/100 + 2).
        assert_eq!(planned(10_001 + 101, 10_001), 102);
        assert_eq!(planned(10_001 + 251, 10_001), 102);
        assert_eq!(connections_wanted(10_001 + 251, 10_001, 100), 102);
        // Watches alone: one connection per hundred.
        assert_eq!(planned(900, 900), 9);
        // Short requests alone share one connection, in waves.
        assert_eq!(planned(300, 0), 1);
        // Never more connections than all requests fill.
        assert_eq!(planned(150, 10), 2);
        assert_eq!(connections_wanted(0, 0, 100), 0);
    }

    #[test]
    fn connections_that_stopped_accepting_streams_are_not_counted() {
        // A connection draining after a GOAWAY holds streams but takes no new ones.
        let mut origin = OriginState {
            protocol: Learned::Http2,
            waiting: 50,
            waiting_long: 50,
            learned_limit: Some(100),
            ..OriginState::default()
        };
        origin.connections.push(ConnEntry {
            id: 1,
            send: None,
            limit: 100,
            in_use: 100,
            long_in_use: 100,
            peak: 100,
            failed: false,
            pace: Arc::new(SendPace::new(1)),
        });
        assert!(origin.wants_connection(100));
        origin.connecting = 1;
        assert!(!origin.wants_connection(100));
    }
}
