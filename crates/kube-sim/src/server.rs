//! Transport: the accept loop, protocol detection (ALPN under TLS, the HTTP/2 preface
//! on plain TCP), per-connection HTTP/1.1 or HTTP/2 serving with the advertised stream
//! limit, and the state every request handler shares.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::config::LatencyConfig;
use crate::faults::{FaultControl, Faults};
use crate::limits::Limiter;
use crate::rbac::{Authorizer, Users};
use crate::stats::{Protocol, RequestLog, SimStats, Stats};
use crate::store::Store;

/// State shared by the accept loop, every connection and every request.
pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub authorizer: Authorizer,
    pub users: Users,
    pub stats: Arc<Stats>,
    pub log: RequestLog,
    pub limiter: Arc<Limiter>,
    /// Guards the current latency model (replaced whole by `set_latency`).
    pub latency: RwLock<LatencyConfig>,
    pub faults: Faults,
    pub bookmark_interval: Duration,
    pub max_concurrent_streams: u32,
    pub addr: SocketAddr,
    pub url: String,
    pub ca_pem: Option<String>,
    pub admin_token: String,
    pub router_token: String,
    pub runtime: tokio::runtime::Handle,
    /// Cancelled when the simulator shuts down.
    pub shutdown: CancellationToken,
}

impl Shared {
    pub(crate) fn latency_for(&self, verb: &str) -> Duration {
        self.latency
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .sample(verb)
    }

    pub(crate) fn latency(&self) -> LatencyConfig {
        self.latency
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_latency(&self, latency: LatencyConfig) {
        *self
            .latency
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = latency;
    }

    pub(crate) fn stats_snapshot(&self) -> SimStats {
        let (inflight, peak_inflight, peak_queued) = self.limiter.counters();
        self.stats.snapshot(inflight, peak_inflight, peak_queued)
    }

    pub(crate) fn reset_stats(&self) {
        self.stats.reset();
        self.limiter.reset_peaks();
    }

    pub(crate) fn faults_handle(self: &Arc<Self>) -> FaultControl {
        FaultControl {
            shared: self.clone(),
        }
    }
}

/// The HTTP/2 connection preface a prior-knowledge h2c client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A stream that replays bytes already read (while sniffing the protocol) before
/// reading from the inner stream.
struct Prefixed<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            if self.pos == self.prefix.len() {
                self.prefix = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
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
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Reads until the bytes seen either differ from the HTTP/2 preface (HTTP/1.1) or
/// complete it (HTTP/2).
async fn sniff<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<(Protocol, Vec<u8>)> {
    let mut seen = Vec::with_capacity(H2_PREFACE.len());
    let mut buf = [0u8; 24];
    loop {
        let want = H2_PREFACE.len() - seen.len();
        let n = stream.read(&mut buf[..want]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before a request",
            ));
        }
        seen.extend_from_slice(&buf[..n]);
        if !H2_PREFACE.starts_with(&seen) {
            return Ok((Protocol::H1, seen));
        }
        if seen.len() == H2_PREFACE.len() {
            return Ok((Protocol::H2, seen));
        }
    }
}

struct OpenConnection {
    shared: Arc<Shared>,
    protocol: Protocol,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.shared.stats.connection_closed(self.protocol);
    }
}

async fn serve_io<I>(shared: Arc<Shared>, io: I, protocol: Protocol)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    shared.stats.connection_opened(protocol);
    let _open = OpenConnection {
        shared: shared.clone(),
        protocol,
    };
    let close = shared.faults.connection_close_token();
    let shutdown = shared.shutdown.clone();
    let svc_shared = shared.clone();
    let service = service_fn(move |req| {
        let shared = svc_shared.clone();
        async move {
            let resp = if req.uri().path() == "/sim" || req.uri().path().starts_with("/sim/") {
                crate::admin::serve(shared, req).await
            } else {
                crate::api::serve(shared, req, protocol).await
            };
            Ok::<_, Infallible>(resp)
        }
    });
    let io = TokioIo::new(io);
    let result = match protocol {
        Protocol::H1 => {
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
            tokio::select! {
                r = conn => r.map_err(|e| e.to_string()),
                _ = close.cancelled() => Ok(()),
                _ = shutdown.cancelled() => Ok(()),
            }
        }
        Protocol::H2 => {
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .max_concurrent_streams(shared.max_concurrent_streams)
                .serve_connection(io, service);
            tokio::select! {
                r = conn => r.map_err(|e| e.to_string()),
                _ = close.cancelled() => Ok(()),
                _ = shutdown.cancelled() => Ok(()),
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, protocol = protocol.as_str(), "connection ended with an error");
    }
}

async fn handle_connection(shared: Arc<Shared>, stream: TcpStream, tls: Option<TlsAcceptor>) {
    let _ = stream.set_nodelay(true);
    match tls {
        Some(acceptor) => {
            let tls_stream = match acceptor.accept(stream).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
            };
            let protocol = match tls_stream.get_ref().1.alpn_protocol() {
                Some(b"h2") => Protocol::H2,
                _ => Protocol::H1,
            };
            serve_io(shared, tls_stream, protocol).await;
        }
        None => {
            let mut stream = stream;
            let (protocol, prefix) = match sniff(&mut stream).await {
                Ok(x) => x,
                Err(e) => {
                    tracing::trace!(error = %e, "connection closed before a request");
                    return;
                }
            };
            let io = Prefixed {
                prefix,
                pos: 0,
                inner: stream,
            };
            serve_io(shared, io, protocol).await;
        }
    }
}

/// Accepts connections until shutdown.
pub(crate) async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, _peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and similar: back off briefly instead of
                // spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if shared.faults.is_refusing() {
            // A refused connection: reset at once.
            let _ = stream.set_zero_linger();
            drop(stream);
            continue;
        }
        let shared = shared.clone();
        let tls = tls.clone();
        tokio::spawn(handle_connection(shared, stream, tls));
    }
}
