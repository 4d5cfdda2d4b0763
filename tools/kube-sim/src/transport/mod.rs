//! Transport: the accept loop, protocol detection (ALPN under TLS, the HTTP/2 preface
//! on plain TCP) and per-connection HTTP/1.1 or HTTP/2 serving with the advertised
//! stream limit. What a request means is the handler's business: the transport only
//! hands each one over with the protocol it came on.
//!
//! Also here: the response body type ([`body`]) and the protobuf request decoder
//! ([`protobuf`]), the two pieces of the wire format below JSON.

pub(crate) mod body;
pub(crate) mod protobuf;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::control::faults::Faults;
use crate::control::stats::{Protocol, Stats};
use body::SimBody;

/// Serves one request; the transport calls it for every request on every connection.
pub(crate) trait Handler: Clone + Send + Sync + 'static {
    /// The response to `request`, which arrived over `protocol`.
    fn handle(
        &self,
        request: Request<Incoming>,
        protocol: Protocol,
    ) -> impl Future<Output = Response<SimBody>> + Send + use<Self>;
}

/// Everything the accept loop and its connections need.
pub(crate) struct Transport<H> {
    /// Where connections are counted.
    pub stats: Arc<Stats>,
    /// Outages close and refuse connections.
    pub faults: Arc<Faults>,
    /// Cancelled when the simulator stops: the loop and every connection end.
    pub shutdown: CancellationToken,
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` advertised on HTTP/2 connections.
    pub max_concurrent_streams: u32,
    /// Present when serving TLS (ALPN chooses the protocol).
    pub tls: Option<TlsAcceptor>,
    /// What answers the requests.
    pub handler: H,
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

/// Counts a connection as open for as long as it lives.
struct OpenConnection {
    stats: Arc<Stats>,
    protocol: Protocol,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.stats.connection_closed(self.protocol);
    }
}

async fn serve_io<H: Handler, I>(transport: Arc<Transport<H>>, io: I, protocol: Protocol)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    transport.stats.connection_opened(protocol);
    let _open = OpenConnection {
        stats: transport.stats.clone(),
        protocol,
    };
    let close = transport.faults.connection_close_token();
    let shutdown = transport.shutdown.clone();
    let handler = transport.handler.clone();
    let service = service_fn(move |req| {
        let answer = handler.handle(req, protocol);
        async move { Ok::<_, Infallible>(answer.await) }
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
                .max_concurrent_streams(transport.max_concurrent_streams)
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

async fn handle_connection<H: Handler>(transport: Arc<Transport<H>>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    match transport.tls.clone() {
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
            serve_io(transport, tls_stream, protocol).await;
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
            serve_io(transport, io, protocol).await;
        }
    }
}

/// Accepts connections until shutdown.
pub(crate) async fn accept_loop<H: Handler>(transport: Arc<Transport<H>>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            _ = transport.shutdown.cancelled() => return,
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
        if transport.faults.is_refusing() {
            // A refused connection: reset at once.
            let _ = stream.set_zero_linger();
            drop(stream);
            continue;
        }
        tokio::spawn(handle_connection(transport.clone(), stream));
    }
}
