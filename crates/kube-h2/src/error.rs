//! Typed errors of the client builder and of the transport underneath kube.
//!
//! Errors raised while a request is in flight reach callers of `kube::Client` wrapped in
//! `kube::Error::Service`; they can be recovered with `downcast_ref::<kube_h2::Error>()`.

use std::{sync::Arc, time::Duration};

/// Everything that can go wrong building the client or carrying a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The cluster URL (or a request URI) is not `http://` or `https://`.
    #[error("URL {url} has an unsupported scheme: expected http or https")]
    UnsupportedScheme {
        /// The offending URL.
        url: String,
    },
    /// The cluster URL (or a request URI) names no host.
    #[error("URL {url} has no host")]
    MissingHost {
        /// The offending URL.
        url: String,
    },
    /// The kube config asks for a proxy; this transport connects directly.
    #[error(
        "the kube config sets proxy {proxy}, but kube-h2 connects to the API server directly and does not support proxies"
    )]
    ProxyNotSupported {
        /// The configured proxy URL.
        proxy: String,
    },
    /// `tls_server_name` (or the URL host) cannot be used to verify a certificate.
    #[error("TLS server name {name:?} is neither a valid DNS name nor an IP address")]
    InvalidServerName {
        /// The rejected name.
        name: String,
    },
    /// A request went to an `https://` origin but the client was built for `http://`.
    #[error("request to {origin} needs TLS, but the client was built for a plain-HTTP cluster URL")]
    TlsNotConfigured {
        /// The origin of the request.
        origin: String,
    },
    /// kube could not build the rustls client configuration (CA, client identity).
    #[error("building the TLS configuration from the kube config failed: {0}")]
    TlsConfig(#[source] kube::Error),
    /// kube could not build the authentication layer (token file, exec plugin, ...).
    #[error("building the authentication layer from the kube config failed: {0}")]
    Auth(#[source] kube::Error),
    /// The bearer token file cannot be used.
    #[error("bearer token file {path}: {problem}")]
    TokenFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it (never the token).
        problem: String,
    },
    /// kube could not build the extra-headers layer (impersonation headers, ...).
    #[error("building the extra request headers from the kube config failed: {0}")]
    Headers(#[source] kube::Error),
    /// Opening a connection to the API server failed.
    #[error("connecting to {origin} failed: {source}")]
    Connect {
        /// The origin (`scheme://host:port`).
        origin: String,
        /// Why. Shared, because one failed connection attempt fails every request that
        /// was waiting for it.
        #[source]
        source: Arc<ConnectError>,
    },
    /// The HTTP/2 connection carrying a request died (I/O error, GOAWAY, keep-alive
    /// PING unanswered). Retry: the pool opens a new connection.
    #[error("HTTP/2 connection #{connection} to {origin} was lost: {source}")]
    ConnectionLost {
        /// The origin.
        origin: String,
        /// The pool's id of the connection.
        connection: u64,
        /// The h2 error.
        #[source]
        source: h2::Error,
    },
    /// One HTTP/2 stream failed (reset by the server, protocol error) while its
    /// connection lives on.
    #[error("HTTP/2 stream on connection #{connection} to {origin} failed: {source}")]
    Stream {
        /// The origin.
        origin: String,
        /// The pool's id of the connection.
        connection: u64,
        /// The h2 error.
        #[source]
        source: h2::Error,
    },
    /// An HTTP/1.1 request failed.
    #[error("HTTP/1.1 request to {origin} failed: {source}")]
    Http1 {
        /// The origin.
        origin: String,
        /// The client error.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// Reading an HTTP/1.1 response body failed.
    #[error("reading an HTTP/1.1 response body from {origin} failed: {source}")]
    Http1Body {
        /// The origin.
        origin: String,
        /// The hyper error.
        #[source]
        source: hyper::Error,
    },
    /// No response headers arrived within the configured deadline.
    #[error("no response headers from {origin} within {timeout:?}")]
    ResponseTimeout {
        /// The origin.
        origin: String,
        /// The deadline that passed.
        timeout: Duration,
    },
    /// The request could not be turned into an HTTP/2 request.
    #[error("invalid request to {uri}: {reason}")]
    InvalidRequest {
        /// The request URI.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// [`ClientOptions::user_agent`](crate::ClientOptions::user_agent) cannot be sent
    /// as an HTTP header value.
    #[error("user agent {0:?} is not a valid HTTP header value")]
    InvalidUserAgent(String),
    /// Reading the request body (supplied by kube) failed.
    #[error("reading the request body failed: {0}")]
    RequestBody(#[source] tower::BoxError),
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The TCP connection (or name resolution) failed.
    #[error("TCP connect failed: {0}")]
    Tcp(#[source] std::io::Error),
    /// The TLS handshake failed (certificate, protocol, ...).
    #[error("TLS handshake failed: {0}")]
    Tls(#[source] std::io::Error),
    /// Opening the connection took longer than the connect timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The HTTP/2 handshake on an established TLS connection failed.
    #[error("HTTP/2 handshake failed: {0}")]
    Http2Handshake(#[source] h2::Error),
    /// The server closed the connection before it sent its HTTP/2 SETTINGS.
    #[error("the server closed the connection before sending HTTP/2 SETTINGS")]
    ClosedBeforeSettings,
    /// HTTP/2 was required, but the server's ALPN did not choose `h2`.
    #[error("HTTP/2 is required (Protocol::Http2Only), but the server did not choose h2 in ALPN")]
    Http2NotOffered,
    /// HTTP/2 was required, but the plain-TCP server rejected the HTTP/2 preface.
    #[error(
        "HTTP/2 is required (Protocol::Http2Only), but the server rejected the HTTP/2 prior-knowledge preface: {0}"
    )]
    Http2PrefaceRejected(String),
    /// The host in the URL cannot be used as a TLS server name.
    #[error("{name:?} cannot be used as a TLS server name")]
    InvalidServerName {
        /// The rejected name.
        name: String,
    },
    /// The URI a connection was asked for names no usable origin.
    #[error("cannot connect to {uri}: {reason}")]
    BadOrigin {
        /// The URI.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The client was built for plain HTTP and has no TLS configuration.
    #[error("no TLS configuration for an https origin")]
    TlsNotConfigured,
}
