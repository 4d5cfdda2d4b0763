//! Options that shape the connection pool underneath the kube client.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::accounting::RequestObserver;

/// Which HTTP versions the client may speak to the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Prefer HTTP/2 and fall back to HTTP/1.1 where the server does not offer it.
    ///
    /// Over TLS the server's ALPN choice decides (`h2` offered first, then `http/1.1`).
    /// Over plain TCP the client first tries HTTP/2 with prior knowledge (h2c); if the
    /// server rejects the HTTP/2 connection preface, the origin is remembered as
    /// HTTP/1.1-only for the life of the client.
    #[default]
    Auto,
    /// Speak HTTP/1.1 only: one request (one watch) per connection, as kube's default
    /// client does.
    Http1Only,
    /// Speak HTTP/2 only. A server that does not offer HTTP/2 is an error.
    Http2Only,
}

/// Default cap on concurrent streams per HTTP/2 connection.
///
/// kube-apiserver advertises `SETTINGS_MAX_CONCURRENT_STREAMS = 100`; the cap keeps the
/// pool spreading load over several connections even where a server advertises more.
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 100;

/// `User-Agent` of every request that does not set its own: `certwatch/<version>`, so
/// that the API server's audit log and metrics can tell certwatch apart.
pub const DEFAULT_USER_AGENT: &str = concat!("certwatch/", env!("CARGO_PKG_VERSION"));

/// Tuning for [`build_client`](crate::build_client).
///
/// `ClientOptions::default()` is the setting for talking to a Kubernetes API server:
/// HTTP/2 where offered, at most 100 streams per connection (fewer if the server says
/// so), keep-alive pings every 30 s that drop a connection whose peer stopped answering,
/// and no deadline on response bodies, so idle watches live until the server ends them.
#[derive(Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Which HTTP versions to speak.
    pub protocol: Protocol,
    /// Cap on concurrent streams per HTTP/2 connection. The effective limit of a
    /// connection is `min(cap, server's SETTINGS_MAX_CONCURRENT_STREAMS)`. `None` means
    /// [`DEFAULT_MAX_STREAMS_PER_CONNECTION`]. A value of 0 is treated as 1.
    pub max_streams_per_connection: Option<u32>,
    /// Deadline for opening a connection: TCP connect, TLS handshake and the HTTP/2
    /// SETTINGS exchange. `None` takes `kube::Config::connect_timeout`; if that is unset
    /// too, connects have no deadline.
    pub connect_timeout: Option<Duration>,
    /// Deadline for the response *headers* of a request. The response body (a watch
    /// stream) is never subject to it. `None` takes `kube::Config::read_timeout` (unset
    /// by default in kube 5).
    pub response_headers_timeout: Option<Duration>,
    /// Interval of HTTP/2 PING frames on each connection; `None` disables keep-alive.
    /// A connection whose peer does not answer a PING within
    /// [`keepalive_timeout`](Self::keepalive_timeout) is dropped, which fails the
    /// streams on it (so watchers reconnect) instead of leaving them hanging on a dead
    /// peer.
    pub keepalive_interval: Option<Duration>,
    /// How long to wait for the answer to a keep-alive PING.
    pub keepalive_timeout: Duration,
    /// How many HTTP/2 connections per origin may stay open with no stream on them.
    /// Connections beyond this are closed as soon as their last stream ends.
    pub max_idle_connections_per_origin: usize,
    /// `User-Agent` of requests that set none. `None` means [`DEFAULT_USER_AGENT`].
    pub user_agent: Option<String>,
    /// Told about every response (see [`RequestObserver`]); counting happens whether
    /// or not one is set ([`PoolHandle::requests`](crate::PoolHandle::requests)).
    pub observer: Option<Arc<dyn RequestObserver>>,
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("protocol", &self.protocol)
            .field(
                "max_streams_per_connection",
                &self.max_streams_per_connection,
            )
            .field("connect_timeout", &self.connect_timeout)
            .field("response_headers_timeout", &self.response_headers_timeout)
            .field("keepalive_interval", &self.keepalive_interval)
            .field("keepalive_timeout", &self.keepalive_timeout)
            .field(
                "max_idle_connections_per_origin",
                &self.max_idle_connections_per_origin,
            )
            .field("user_agent", &self.user_agent)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            protocol: Protocol::Auto,
            max_streams_per_connection: None,
            connect_timeout: None,
            response_headers_timeout: None,
            keepalive_interval: Some(Duration::from_secs(30)),
            keepalive_timeout: Duration::from_secs(15),
            max_idle_connections_per_origin: 1,
            user_agent: None,
            observer: None,
        }
    }
}

impl ClientOptions {
    /// Sets [`protocol`](Self::protocol).
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Sets [`max_streams_per_connection`](Self::max_streams_per_connection).
    pub fn max_streams_per_connection(mut self, cap: u32) -> Self {
        self.max_streams_per_connection = Some(cap);
        self
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Sets [`response_headers_timeout`](Self::response_headers_timeout).
    pub fn response_headers_timeout(mut self, timeout: Duration) -> Self {
        self.response_headers_timeout = Some(timeout);
        self
    }

    /// Sets [`keepalive_interval`](Self::keepalive_interval) (`None` disables PINGs).
    pub fn keepalive(mut self, interval: Option<Duration>, timeout: Duration) -> Self {
        self.keepalive_interval = interval;
        self.keepalive_timeout = timeout;
        self
    }

    /// Sets [`max_idle_connections_per_origin`](Self::max_idle_connections_per_origin).
    pub fn max_idle_connections_per_origin(mut self, max: usize) -> Self {
        self.max_idle_connections_per_origin = max;
        self
    }

    /// Sets [`user_agent`](Self::user_agent).
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = Some(user_agent.into());
        self
    }

    /// Sets [`observer`](Self::observer).
    pub fn observer(mut self, observer: Arc<dyn RequestObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The stream cap actually applied: at least 1.
    pub(crate) fn stream_cap(&self) -> usize {
        let cap = self
            .max_streams_per_connection
            .unwrap_or(DEFAULT_MAX_STREAMS_PER_CONNECTION);
        usize::try_from(cap.max(1)).unwrap_or(usize::MAX)
    }
}
