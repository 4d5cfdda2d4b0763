//! A small HTTP/2 (h2c, prior knowledge) load generator for measuring the
//! simulator: raw requests and watches multiplexed over a few connections, opening a
//! new connection whenever the current ones are at their stream limit (as Go's
//! HTTP/2 transport does). Used by the capacity benchmark and the tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// Errors of the load generator.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Connecting failed.
    #[error("connect to {addr}: {source}")]
    Connect {
        /// Target.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// HTTP/2 failed.
    #[error("http/2: {0}")]
    Http(#[from] hyper::Error),
    /// A request could not be built.
    #[error("request: {0}")]
    Request(#[from] http::Error),
    /// The server answered with an unexpected status.
    #[error("unexpected status {status} for {path}: {body}")]
    Status {
        /// The status.
        status: StatusCode,
        /// The path requested.
        path: String,
        /// The response body.
        body: String,
    },
}

/// One HTTP/2 connection.
#[derive(Clone)]
pub struct H2Connection {
    sender: SendRequest<Full<Bytes>>,
    authority: String,
    token: Arc<str>,
    /// Streams this handle has open on the connection (watches count until dropped).
    active: Arc<AtomicUsize>,
}

impl H2Connection {
    /// Opens an h2c (prior knowledge) connection authenticated with `token`.
    pub async fn connect(addr: SocketAddr, token: &str) -> Result<H2Connection, LoadError> {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| LoadError::Connect { addr, source })?;
        let _ = tcp.set_nodelay(true);
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "load generator connection ended");
            }
        });
        Ok(H2Connection {
            sender,
            authority: addr.to_string(),
            token: token.into(),
            active: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Streams in use through this connection.
    pub fn active_streams(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Sends a request; returns the response with its body still to read (its headers,
    /// say, matter to the caller).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &str)>,
    ) -> Result<http::Response<Incoming>, LoadError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.authority))
            .header("authorization", format!("Bearer {}", self.token))
            .header("accept", "application/json");
        let body = match body {
            Some((b, ct)) => {
                builder = builder.header("content-type", ct);
                b
            }
            None => Bytes::new(),
        };
        let req = builder.body(Full::new(body))?;
        let mut sender = self.sender.clone();
        sender.ready().await?;
        Ok(sender.send_request(req).await?)
    }

    /// Sends a request and reads the whole response.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &str)>,
    ) -> Result<(StatusCode, Bytes), LoadError> {
        self.active.fetch_add(1, Ordering::Relaxed);
        let result = async {
            let resp = self.send(method, path, body).await?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await?.to_bytes();
            Ok((status, bytes))
        }
        .await;
        self.active.fetch_sub(1, Ordering::Relaxed);
        result
    }

    /// Starts a watch (`path` must carry `watch=true`); returns once the response
    /// headers arrived with 200.
    pub async fn watch(&self, path: &str) -> Result<WatchLines, LoadError> {
        let resp = self.send(Method::GET, path, None).await?;
        let status = resp.status();
        if status != StatusCode::OK {
            let body = resp.into_body().collect().await?.to_bytes();
            return Err(LoadError::Status {
                status,
                path: path.to_string(),
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        self.active.fetch_add(1, Ordering::Relaxed);
        Ok(WatchLines {
            body: resp.into_body(),
            buf: BytesMut::new(),
            active: self.active.clone(),
        })
    }
}

/// The events of one watch, as JSON lines.
pub struct WatchLines {
    body: Incoming,
    buf: BytesMut,
    active: Arc<AtomicUsize>,
}

impl Drop for WatchLines {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WatchLines {
    /// The next event line (without the newline), or `None` when the watch ended.
    pub async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line = self.buf.split_to(pos + 1);
                return Some(line.freeze().slice(..pos));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                _ => return None,
            }
        }
    }

    /// The next event, parsed.
    pub async fn next_event(&mut self) -> Option<serde_json::Value> {
        let line = self.next_line().await?;
        serde_json::from_slice(&line).ok()
    }
}

/// Connections to one server, with at most `streams_per_connection` streams each.
pub struct H2Pool {
    addr: SocketAddr,
    token: String,
    streams_per_connection: usize,
    /// Guards the connection list (never held across an await).
    connections: std::sync::Mutex<Vec<H2Connection>>,
}

impl H2Pool {
    /// A pool that opens connections on demand.
    pub fn new(addr: SocketAddr, token: &str, streams_per_connection: usize) -> H2Pool {
        H2Pool {
            addr,
            token: token.to_string(),
            streams_per_connection: streams_per_connection.max(1),
            connections: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Number of connections opened.
    pub fn connections(&self) -> usize {
        kube_common::sync::lock(&self.connections).len()
    }

    /// A connection with a free stream, opening a new one if all are full.
    /// Reservation is by count: call sequentially (or in batches no larger than the
    /// stream limit) to keep connections full.
    pub async fn connection(&self) -> Result<H2Connection, LoadError> {
        {
            let conns = kube_common::sync::lock(&self.connections);
            if let Some(c) = conns
                .iter()
                .find(|c| c.active_streams() < self.streams_per_connection)
            {
                return Ok(c.clone());
            }
        }
        let c = H2Connection::connect(self.addr, &self.token).await?;
        kube_common::sync::lock(&self.connections).push(c.clone());
        Ok(c)
    }

    /// Opens one watch per path, filling each connection up to the stream limit
    /// before opening the next (the watches of one connection start concurrently).
    pub async fn open_watches(&self, paths: &[String]) -> Result<Vec<WatchLines>, LoadError> {
        let mut out = Vec::with_capacity(paths.len());
        for chunk in paths.chunks(self.streams_per_connection) {
            let conn = H2Connection::connect(self.addr, &self.token).await?;
            kube_common::sync::lock(&self.connections).push(conn.clone());
            let started = futures::future::join_all(chunk.iter().map(|p| {
                let conn = conn.clone();
                async move { conn.watch(p).await }
            }))
            .await;
            for w in started {
                out.push(w?);
            }
        }
        Ok(out)
    }
}
