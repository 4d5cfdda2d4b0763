//! One HTTP/2 connection: the handshake, learning the server's stream limit, and the
//! task that drives the connection until it dies.

use std::{
    fmt,
    future::poll_fn,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use h2::{
    Ping, PingPong,
    client::{Connection, SendRequest},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;

use crate::transport::Io;

/// Receive window of one stream. A watch rarely has more than one event in flight;
/// 512 KiB holds a large Secret without waiting for a WINDOW_UPDATE round trip.
const STREAM_WINDOW: u32 = 512 * 1024;
/// Upper bound of the connection-level receive window (HTTP/2 maximum is 2^31 - 1).
const MAX_CONNECTION_WINDOW: u32 = 1 << 30;

/// How much a connection reads in one go before it lets the tasks it woke run (see
/// [`PacedIo`]): a few watch events of a TLS Secret, one TLS record.
const READ_BURST: usize = 16 * 1024;

/// How many requests may be queued on a connection between two polls of its task (see
/// [`SendPace`]).
const SEND_BURST: usize = 8;

/// The connection window is the sum of all stream windows, so that one watch whose
/// consumer stopped reading cannot use up the window every other watch on the same
/// connection needs.
fn connection_window(stream_cap: usize) -> u32 {
    u32::try_from(stream_cap)
        .unwrap_or(u32::MAX)
        .saturating_mul(STREAM_WINDOW)
        .clamp(STREAM_WINDOW, MAX_CONNECTION_WINDOW)
}

/// An HTTP/2 connection whose server SETTINGS are known.
pub(crate) struct Handshaken {
    /// Handle to open streams.
    pub(crate) send: SendRequest<Bytes>,
    /// The connection state machine; must be polled (by [`drive`]) for anything to move.
    pub(crate) conn: Connection<PacedIo, Bytes>,
    /// PING handle for keep-alive.
    pub(crate) pings: PingPong,
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS (`usize::MAX` if it sent none).
    pub(crate) server_limit: usize,
    /// Paces the requests queued on the connection between polls of its task.
    pub(crate) pace: Arc<SendPace>,
}

/// The HTTP/2 exchange failed before the server's SETTINGS were seen.
#[derive(Debug)]
pub(crate) struct HandshakeFailed {
    /// The h2 error, or `None` if the server closed the connection cleanly.
    pub(crate) source: Option<h2::Error>,
}

impl fmt::Display for HandshakeFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(e) => write!(f, "{e}"),
            None => f.write_str("the server closed the connection before sending HTTP/2 SETTINGS"),
        }
    }
}

/// Sends the client preface and waits until the server's SETTINGS have been applied.
///
/// A server's first frame must be SETTINGS, and h2 applies received SETTINGS before
/// it reads the next frame; so once the answer to our PING arrives, the server's
/// SETTINGS_MAX_CONCURRENT_STREAMS is known. Until then h2 would assume "unlimited",
/// which is why the pool never hands out a connection before this returns.
pub(crate) async fn handshake(io: Io, stream_cap: usize) -> Result<Handshaken, HandshakeFailed> {
    let failed = |e: h2::Error| HandshakeFailed { source: Some(e) };
    let (send, mut conn) = h2::client::Builder::new()
        .enable_push(false)
        .initial_max_send_streams(stream_cap)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(connection_window(stream_cap))
        .handshake::<_, Bytes>(PacedIo::new(io))
        .await
        .map_err(failed)?;
    let Some(mut pings) = conn.ping_pong() else {
        // `ping_pong` only returns None when taken twice; this is the first take.
        return Err(HandshakeFailed { source: None });
    };
    {
        let pong = pings.ping(Ping::opaque());
        tokio::pin!(pong);
        tokio::select! {
            result = &mut pong => {
                result.map_err(failed)?;
            }
            result = &mut conn => {
                return Err(HandshakeFailed { source: result.err() });
            }
        }
    }
    let server_limit = conn.max_concurrent_send_streams();
    Ok(Handshaken {
        send,
        conn,
        pings,
        server_limit,
        pace: Arc::new(SendPace::new(SEND_BURST)),
    })
}

/// Why a connection's driver stopped.
#[derive(Debug)]
pub(crate) enum CloseReason {
    /// The connection shut down cleanly (GOAWAY handled, or nobody needs it any more).
    Closed,
    /// The connection failed (I/O error, protocol error, GOAWAY with an error code).
    Failed(h2::Error),
    /// A keep-alive PING was not answered in time.
    KeepaliveTimeout(Duration),
    /// Sending a keep-alive PING failed.
    KeepaliveFailed(h2::Error),
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::Closed => f.write_str("closed"),
            CloseReason::Failed(e) => write!(f, "failed: {e}"),
            CloseReason::KeepaliveTimeout(t) => write!(f, "keep-alive PING unanswered after {t:?}"),
            CloseReason::KeepaliveFailed(e) => write!(f, "keep-alive PING failed: {e}"),
        }
    }
}

/// What the driver reports to the pool that owns the connection.
pub(crate) trait ConnectionOwner: Send + 'static {
    /// Called after each poll that left the connection running, so the owner can notice
    /// a GOAWAY (or connection error) and stop placing streams on it.
    fn after_poll(&mut self, cx: &mut Context<'_>);
    /// Called once when the connection is gone.
    fn closed(self, reason: CloseReason);
}

/// Keep-alive timing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keepalive {
    /// Time between PINGs; `None` disables them.
    pub(crate) interval: Option<Duration>,
    /// Deadline for each PONG.
    pub(crate) timeout: Duration,
}

/// Drives the connection until it ends or stops answering PINGs, then tells the owner.
///
/// Dropping the h2 `Connection` (when keep-alive fails) fails every stream on it, so
/// watches see an error and reconnect instead of hanging on a dead peer.
pub(crate) async fn drive(
    handshaken: Handshaken,
    keepalive: Keepalive,
    mut owner: impl ConnectionOwner,
) {
    let Handshaken {
        send,
        mut conn,
        pings,
        pace,
        ..
    } = handshaken;
    // The pool keeps its own handle; holding one here would keep the connection open
    // after the pool has let go of it.
    drop(send);
    let run = poll_fn(|cx| {
        let polled = Pin::new(&mut conn).poll(cx);
        if polled.is_pending() {
            // h2 has written what was queued (as far as the socket took it).
            pace.refill();
            owner.after_poll(cx);
        }
        polled
    });
    let reason = tokio::select! {
        result = run => match result {
            Ok(()) => CloseReason::Closed,
            Err(e) => CloseReason::Failed(e),
        },
        reason = keep_alive(pings, keepalive) => reason,
    };
    drop(conn);
    // After the owner has taken the connection out of the pool, so that a request
    // turned away here cannot be given the same connection again.
    owner.closed(reason);
    pace.close();
}

/// Sends a PING every interval; returns when one goes unanswered.
async fn keep_alive(mut pings: PingPong, keepalive: Keepalive) -> CloseReason {
    let Some(interval) = keepalive.interval else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(keepalive.timeout, pings.ping(Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(e)) => return CloseReason::KeepaliveFailed(e),
            Err(_) => return CloseReason::KeepaliveTimeout(keepalive.timeout),
        }
    }
}

/// Whether the connection still accepts new streams: `false` once a GOAWAY arrived or
/// the connection failed (h2 then refuses `send_request`).
pub(crate) fn accepts_new_streams(send: &mut SendRequest<Bytes>, cx: &mut Context<'_>) -> bool {
    !matches!(send.poll_ready(cx), Poll::Ready(Err(_)))
}

/// How many requests may be queued on one connection before its task has run again.
///
/// h2 queues a request's HEADERS frame in a slab of frames to send, one per
/// connection, which its task empties into the socket when it next runs; the slab grows
/// to its largest fill and never shrinks. In a start-up burst every watch task placed on
/// a connection sends its request before that connection's task runs once, so a
/// hundred HEADERS frames (a couple of hundred bytes of slot each) wait there together
/// and the slab keeps room for them for the connection's life. A request takes a permit
/// before it queues its frame; the connection's task gives the permits back each time
/// it has run (its frames written), and closes the pace when it ends so that requests
/// waiting for a permit move to another connection.
pub(crate) struct SendPace {
    permits: Semaphore,
    burst: usize,
}

impl SendPace {
    /// A pace of `burst` requests between two runs of the connection's task.
    pub(crate) fn new(burst: usize) -> Self {
        Self {
            permits: Semaphore::new(burst),
            burst,
        }
    }

    /// Waits until the connection takes another request. `false`: the connection's
    /// task has ended, the request must go elsewhere.
    pub(crate) async fn admit(&self) -> bool {
        match self.permits.acquire().await {
            Ok(permit) => {
                // Given back by `refill`, once the queued frame has been written.
                permit.forget();
                true
            }
            Err(_closed) => false,
        }
    }

    /// The connection's task has run: its queue is written, the whole burst is free
    /// again.
    fn refill(&self) {
        let missing = self.burst.saturating_sub(self.permits.available_permits());
        if missing > 0 {
            self.permits.add_permits(missing);
        }
    }

    /// The connection's task has ended: every waiting request is turned away.
    fn close(&self) {
        self.permits.close();
    }
}

/// The connection's byte stream, read at most [`READ_BURST`] bytes at a time before
/// the connection's task yields.
///
/// h2 reads every frame the socket has before its task returns, and keeps each
/// stream's frames (the response's headers, every DATA frame) in a slab, one slot per
/// frame not yet read by the stream's reader, that grows to its largest fill and never
/// shrinks. When a hundred watches on one connection are answered at once (a start-up,
/// every watch renewed together), the whole burst would wait there before any reader
/// ran: a slab of several hundred slots, a couple of hundred bytes each, kept for the
/// connection's life. Yielding after a burst's worth of bytes lets the readers the
/// frames woke take them first, so that the slab stays at the size of one burst. The
/// yield is a wake-up of the task itself: it runs again after the tasks already
/// queued, without waiting for the socket.
pub(crate) struct PacedIo<T = Io> {
    io: T,
    /// Bytes read since the task last yielded or found the socket empty.
    read_since_yield: usize,
}

impl<T> PacedIo<T> {
    fn new(io: T) -> Self {
        Self {
            io,
            read_since_yield: 0,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for PacedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read_since_yield >= READ_BURST {
            this.read_since_yield = 0;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) => {
                this.read_since_yield = this
                    .read_since_yield
                    .saturating_add(buf.filled().len().saturating_sub(before));
            }
            // The socket is empty: the task waits for it anyway.
            Poll::Pending => this.read_since_yield = 0,
            Poll::Ready(Err(_)) => {}
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for PacedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use super::*;

    #[test]
    fn connection_window_covers_all_streams_within_bounds() {
        assert_eq!(connection_window(1), STREAM_WINDOW);
        assert_eq!(connection_window(100), 100 * STREAM_WINDOW);
        assert_eq!(connection_window(100_000), MAX_CONNECTION_WINDOW);
    }

    /// Counts its wake-ups.
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A byte source that has `data` and, after every `gap` bytes, nothing for one
    /// poll (as a socket whose peer has not sent the rest yet).
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        gap: usize,
        since_gap: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            if this.since_gap >= this.gap {
                this.since_gap = 0;
                return Poll::Pending;
            }
            let n = buf
                .remaining()
                .min(this.data.len() - this.at)
                .min(this.gap - this.since_gap);
            buf.put_slice(&this.data[this.at..this.at + n]);
            this.at += n;
            this.since_gap += n;
            Poll::Ready(Ok(()))
        }
    }

    /// Reads `source` to its end in 16 KiB reads; returns the bytes and, for every
    /// yield (a `Pending` that woke the task within the call), the bytes read since
    /// the last yield or empty source.
    fn read_all(source: Trickle) -> (Vec<u8>, Vec<usize>) {
        let mut paced = PacedIo::new(source);
        let wakes = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let (mut received, mut bursts, mut in_burst) = (Vec::new(), Vec::new(), 0);
        let mut chunk = vec![0_u8; 16 * 1024];
        loop {
            let mut buf = ReadBuf::new(&mut chunk);
            let wakes_before = wakes.0.load(Ordering::SeqCst);
            match Pin::new(&mut paced).poll_read(&mut cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
                Poll::Ready(Ok(())) => {
                    in_burst += buf.filled().len();
                    received.extend_from_slice(buf.filled());
                }
                Poll::Ready(Err(error)) => panic!("read failed: {error}"),
                Poll::Pending => {
                    if wakes.0.load(Ordering::SeqCst) > wakes_before {
                        bursts.push(in_burst);
                    }
                    in_burst = 0;
                }
            }
        }
        (received, bursts)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// With far more than a burst ready, reads stop after each burst with the task
    /// woken (a yield, not a wait for the socket) and go on at the next poll; every
    /// byte arrives, in order.
    #[test]
    fn reads_yield_after_each_burst_and_lose_nothing() {
        let data = pattern(READ_BURST * 5);
        let source = Trickle {
            data: data.clone(),
            at: 0,
            gap: usize::MAX,
            since_gap: 0,
        };
        let (received, bursts) = read_all(source);
        assert!(received == data, "bytes lost or reordered");
        assert_eq!(bursts, vec![READ_BURST; 5]);
    }

    /// A burst of requests is admitted at once, the next waits until the connection's
    /// task has run (its queue written), in the order they came; once the task has
    /// ended, waiting and later requests are turned away.
    #[tokio::test]
    async fn a_connection_queues_a_burst_of_requests_per_run_of_its_task() {
        use futures::FutureExt;

        let pace = Arc::new(SendPace::new(3));
        for _ in 0..3 {
            assert_eq!(pace.admit().now_or_never(), Some(true));
        }
        let waiting: Vec<_> = (0..4)
            .map(|i| {
                let pace = Arc::clone(&pace);
                tokio::spawn(async move { (i, pace.admit().await) })
            })
            .collect();
        tokio::task::yield_now().await;
        assert!(waiting.iter().all(|task| !task.is_finished()));
        assert_eq!(pace.admit().now_or_never(), None, "admitted past the burst");

        pace.refill();
        let mut admitted = Vec::new();
        let mut rest = Vec::new();
        for task in waiting {
            tokio::task::yield_now().await;
            if task.is_finished() {
                admitted.push(task.await.expect("task ran"));
            } else {
                rest.push(task);
            }
        }
        assert_eq!(admitted, vec![(0, true), (1, true), (2, true)]);
        assert_eq!(rest.len(), 1);
        // The next run admits the last waiter; runs never give back more than a burst.
        pace.refill();
        for task in rest {
            assert_eq!(task.await.expect("task ran"), (3, true));
        }
        pace.refill();
        pace.refill();
        assert_eq!(pace.permits.available_permits(), 3);

        for _ in 0..3 {
            assert_eq!(pace.admit().now_or_never(), Some(true));
        }
        let waiter = tokio::spawn({
            let pace = Arc::clone(&pace);
            async move { pace.admit().await }
        });
        tokio::task::yield_now().await;
        pace.close();
        assert!(
            !waiter.await.expect("task ran"),
            "a waiter admitted after close"
        );
        assert_eq!(pace.admit().now_or_never(), Some(false));
    }

    /// A source found empty starts the count over: the task waited for the socket
    /// then, and the readers it woke ran meanwhile.
    #[test]
    fn an_empty_socket_starts_the_burst_over() {
        let gap = READ_BURST * 3 / 4;
        let data = pattern(gap * 4);
        let source = Trickle {
            data: data.clone(),
            at: 0,
            gap,
            since_gap: 0,
        };
        let (received, bursts) = read_all(source);
        assert!(received == data, "bytes lost or reordered");
        assert!(bursts.is_empty(), "yielded between gaps: {bursts:?}");
    }
}
