//! Pool statistics: counters updated by the pool, snapshots for callers.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// Live counters shared by the pool, its connections and its response bodies.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) http2_opened: AtomicU64,
    pub(crate) http1_opened: AtomicU64,
    pub(crate) http2_open: AtomicU64,
    pub(crate) http1_open: AtomicU64,
    pub(crate) active_streams: AtomicU64,
    pub(crate) peak_streams_per_connection: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) connect_failures: AtomicU64,
    pub(crate) http1_fallbacks: AtomicU64,
    pub(crate) connections_lost: AtomicU64,
    /// Wakes whoever waits for the last open connection to close.
    closed: Notify,
}

impl Counters {
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn dec(counter: &AtomicU64) {
        counter.fetch_sub(1, Ordering::Relaxed);
    }

    /// A connection counted in `open` (`http2_open` or `http1_open`) closed.
    pub(crate) fn connection_closed(&self, open: &AtomicU64) {
        Self::dec(open);
        self.closed.notify_waiters();
    }

    /// Returns once no connection is open.
    pub(crate) async fn all_closed(&self) {
        loop {
            // Registered before the check, so that a close between the check and the
            // wait is not missed.
            let closed = self.closed.notified();
            let mut closed = std::pin::pin!(closed);
            closed.as_mut().enable();
            let open =
                self.http2_open.load(Ordering::SeqCst) + self.http1_open.load(Ordering::SeqCst);
            if open == 0 {
                return;
            }
            closed.await;
        }
    }

    pub(crate) fn snapshot(&self) -> PoolStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PoolStats {
            http2_connections_opened: get(&self.http2_opened),
            http1_connections_opened: get(&self.http1_opened),
            http2_connections_open: get(&self.http2_open),
            http1_connections_open: get(&self.http1_open),
            active_streams: get(&self.active_streams),
            peak_streams_per_connection: get(&self.peak_streams_per_connection),
            requests: get(&self.requests),
            connect_failures: get(&self.connect_failures),
            http1_fallbacks: get(&self.http1_fallbacks),
            connections_lost: get(&self.connections_lost),
        }
    }
}

/// A snapshot of the pool's counters.
///
/// Counters are read one by one without a common lock: a snapshot taken while requests
/// start or end may mix moments, but every counter on its own is exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// HTTP/2 connections opened since the client was built.
    pub http2_connections_opened: u64,
    /// HTTP/1.1 connections opened since the client was built (where the server does not
    /// speak HTTP/2, or with [`Protocol::Http1Only`](crate::Protocol::Http1Only)).
    pub http1_connections_opened: u64,
    /// HTTP/2 connections open now (including ones draining after a GOAWAY).
    pub http2_connections_open: u64,
    /// HTTP/1.1 connections open now (busy or idle in hyper's keep-alive pool).
    pub http1_connections_open: u64,
    /// Requests in flight now: from sending until the response body ended or was
    /// dropped. An open watch counts for its whole life.
    pub active_streams: u64,
    /// The most streams ever open at once on a single HTTP/2 connection.
    pub peak_streams_per_connection: u64,
    /// Requests sent since the client was built.
    pub requests: u64,
    /// Connection attempts that failed (TCP, TLS, HTTP/2 handshake, timeout).
    pub connect_failures: u64,
    /// Times an origin was found not to speak HTTP/2 and was switched to HTTP/1.1.
    /// The probing connection is closed and not counted as opened.
    pub http1_fallbacks: u64,
    /// HTTP/2 connections that ended with an error or an unanswered keep-alive PING.
    pub connections_lost: u64,
}

/// One HTTP/2 connection as the pool sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionInfo {
    /// The pool's id of the connection (ids increase in opening order).
    pub id: u64,
    /// `scheme://host:port`.
    pub origin: String,
    /// Streams open on it now.
    pub active_streams: usize,
    /// The most streams ever open on it at once.
    pub peak_streams: usize,
    /// Its effective stream limit: `min(cap, server's SETTINGS_MAX_CONCURRENT_STREAMS)`.
    pub stream_limit: usize,
    /// `false` once it is draining (GOAWAY received, or retired as surplus idle).
    pub accepting_streams: bool,
}
