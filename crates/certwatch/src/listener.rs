//! How certwatch's HTTP endpoints (`--listen`, and `--metrics-listen` over TLS) serve
//! connections so that idle or slow clients cannot starve them: health probes,
//! readiness and authorized scrapes keep answering while hundreds of clients hold
//! connections open.
//!
//! - **A bound**: at most [`Limits::max_connections`] connections are served at once.
//!   A connection accepted beyond it takes the place of the connection idle the
//!   longest (no request in progress: a TLS handshake not finished, an HTTP/2
//!   connection past its preface, a keep-alive HTTP/1 connection), which is closed; only
//!   when every connection has a request in progress does the new one wait.
//! - **Timeouts**: a TLS handshake gets [`Limits::handshake_timeout`], an HTTP/1
//!   request's headers [`Limits::header_timeout`] (a client dribbling them is cut),
//!   and a connection with no request in progress and no bytes either way for
//!   [`Limits::idle_timeout`] is closed, HTTP/2 included.
//!
//! Closing is graceful first (HTTP/2 `GOAWAY`, HTTP/1 after the response in progress),
//! then for good after [`CLOSE_GRACE`].

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use kube_common::sync;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// How long a connection being closed may take to finish before it is dropped.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The limits of one endpoint.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Time for a client to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time for a client to send an HTTP/1 request's headers.
    pub header_timeout: Duration,
    /// Time a connection may stay with no request in progress and no bytes either way.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// What one connection is doing.
#[derive(Debug)]
struct Activity {
    /// When bytes last went either way, in milliseconds since `epoch`.
    last: AtomicU64,
    /// Requests in progress.
    requests: AtomicUsize,
    epoch: Instant,
}

impl Activity {
    fn new(epoch: Instant) -> Self {
        let activity = Self {
            last: AtomicU64::new(0),
            requests: AtomicUsize::new(0),
            epoch,
        };
        activity.touch();
        activity
    }

    fn touch(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, Ordering::Relaxed);
    }

    /// Since when the connection is idle; `None` while a request is in progress.
    fn idle_since(&self) -> Option<u64> {
        (self.requests.load(Ordering::Relaxed) == 0).then(|| self.last.load(Ordering::Relaxed))
    }

    fn idle_for(&self) -> Option<Duration> {
        let since = self.idle_since()?;
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        Some(Duration::from_millis(now.saturating_sub(since)))
    }
}

/// A request in progress, for as long as it lives.
struct InProgress(Arc<Activity>);

impl InProgress {
    fn new(activity: Arc<Activity>) -> Self {
        activity.requests.fetch_add(1, Ordering::Relaxed);
        Self(activity)
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.touch();
        self.0.requests.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that records when bytes go through it.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(written)) if written > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(written)) if written > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The connections served now.
#[derive(Default)]
struct Registry {
    /// Guards the live connections by id: what each does and how to close it.
    live: Mutex<HashMap<u64, (Arc<Activity>, CancellationToken)>>,
    /// Notified when a connection ends.
    ended: Notify,
}

impl Registry {
    /// Makes room for one more connection: true when there is room, closing the
    /// connection idle the longest if the bound is reached; false when every
    /// connection has a request in progress.
    fn make_room(&self, max: usize) -> bool {
        let mut live = sync::lock(&self.live);
        if live.len() < max {
            return true;
        }
        let oldest = live
            .iter()
            .filter_map(|(id, (activity, _))| activity.idle_since().map(|since| (since, *id)))
            .min();
        let Some((_, id)) = oldest else {
            return false;
        };
        if let Some((_, close)) = live.remove(&id) {
            close.cancel();
        }
        true
    }

    fn remove(&self, id: u64) {
        sync::lock(&self.live).remove(&id);
        self.ended.notify_waiters();
    }

    fn close_all(&self) {
        for (_, close) in sync::lock(&self.live).values() {
            close.cancel();
        }
    }

    fn is_empty(&self) -> bool {
        sync::lock(&self.live).is_empty()
    }
}

/// Serves `app` on the connections of `listener` within `limits` until `shutdown` is
/// cancelled; `handshake` turns each TCP connection into the stream HTTP runs on
/// (TLS, or the connection itself). Then closes every connection, waiting at most
/// [`CLOSE_GRACE`] for responses in progress.
pub(crate) async fn serve<H, F, S>(
    listener: TcpListener,
    app: Router,
    handshake: H,
    limits: Limits,
    shutdown: CancellationToken,
) where
    H: Fn(TcpStream) -> F + Clone + Send + 'static,
    F: Future<Output = io::Result<S>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let registry = Arc::new(Registry::default());
    let epoch = Instant::now();
    let mut next_id = 0_u64;
    loop {
        let (stream, _peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: wait instead of spinning.
                    tracing::warn!(%error, "an HTTP endpoint cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Room for it: the longest idle connection makes way, or (every connection
        // busy) the first to end.
        loop {
            let ended = registry.ended.notified();
            if registry.make_room(limits.max_connections) {
                break;
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = ended => {}
            }
        }
        if shutdown.is_cancelled() {
            break;
        }
        let id = next_id;
        next_id += 1;
        let activity = Arc::new(Activity::new(epoch));
        let close = shutdown.child_token();
        sync::lock(&registry.live).insert(id, (Arc::clone(&activity), close.clone()));
        let (registry, app, handshake) = (Arc::clone(&registry), app.clone(), handshake.clone());
        tokio::spawn(async move {
            serve_one(stream, app, handshake, limits, activity, close).await;
            registry.remove(id);
        });
    }
    drop(listener);
    registry.close_all();
    let deadline = Instant::now() + CLOSE_GRACE;
    while !registry.is_empty() {
        let ended = registry.ended.notified();
        if registry.is_empty() || tokio::time::timeout_at(deadline, ended).await.is_err() {
            break;
        }
    }
}

async fn serve_one<H, F, S>(
    stream: TcpStream,
    app: Router,
    handshake: H,
    limits: Limits,
    activity: Arc<Activity>,
    close: CancellationToken,
) where
    H: Fn(TcpStream) -> F,
    F: Future<Output = io::Result<S>>,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let stream = tokio::select! {
        () = close.cancelled() => return,
        done = tokio::time::timeout(limits.handshake_timeout, handshake(stream)) => match done {
            Ok(Ok(stream)) => stream,
            // A client that does not finish its handshake is not the daemon's problem.
            Ok(Err(_)) | Err(_) => return,
        },
    };
    let io = Watched {
        inner: stream,
        activity: Arc::clone(&activity),
    };
    let requests = Arc::clone(&activity);
    let service = hyper::service::service_fn(move |request| {
        let in_progress = InProgress::new(Arc::clone(&requests));
        let response = app.clone().oneshot(request);
        async move {
            let response = response.await;
            drop(in_progress);
            response
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let mut check = tokio::time::interval(limits.idle_timeout / 4);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // A client that goes away mid-request is not the daemon's problem.
            _ = connection.as_mut() => return,
            () = close.cancelled() => break,
            _ = check.tick() => {
                if activity.idle_for().is_some_and(|idle| idle >= limits.idle_timeout) {
                    break;
                }
            }
        }
    }
    connection.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(CLOSE_GRACE, connection).await;
}
