//! A [`kube::Client`] on a pool of HTTP/2 connections, so that thousands of long-lived
//! watches share a few connections; HTTP/1.1 where the server does not offer HTTP/2.
//!
//! kube's default client speaks HTTP/1.1 only: every open watch is its own TCP+TLS
//! connection. hyper-util's legacy client in `http2_only` mode goes the other way and
//! queues every request beyond the server's `SETTINGS_MAX_CONCURRENT_STREAMS` on its one
//! connection; since a watch never ends, the 101st watch would wait forever. This crate
//! does what Go's HTTP/2 transport (and so client-go) does: it keeps each connection
//! under the limit the server advertises (kube-apiserver: 100) and opens another
//! connection when all are full.
//!
//! # Example
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::Secret;
//! use kube::{Api, api::WatchParams};
//! use kube_h2::{ClientOptions, build_client};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = kube::Config::infer().await?;
//! let pooled = build_client(config, ClientOptions::default())?;
//! let secrets: Api<Secret> = Api::namespaced(pooled.client(), "router");
//!
//! // One watch per secret, as an RBAC rule with resourceNames requires; a few hundred of
//! // these share a handful of HTTP/2 connections.
//! let params = WatchParams::default().fields("metadata.name=route-cert");
//! let _events = secrets.watch(&params, "0").await?;
//!
//! let stats = pooled.stats();
//! println!(
//!     "{} streams over {} HTTP/2 connections",
//!     stats.active_streams, stats.http2_connections_open
//! );
//! # Ok(())
//! # }
//! ```
//!
//! # Design
//!
//! - **h2 directly, not hyper's HTTP/2 client.** The pool must know each connection's
//!   stream limit before it places a stream on it; hyper does not expose the server's
//!   SETTINGS, h2 does ([`h2::client::SendRequest::current_max_send_streams`]). A new
//!   connection joins the pool only after a PING round trip, which guarantees the
//!   server's first SETTINGS frame has been applied.
//! - **Stream slots** are counted per connection under the origin's lock; a slot is held
//!   from sending the request until the response body ends, fails or is dropped, and the
//!   pool never asks h2 for more streams than `min(cap, advertised)`. Requests that find
//!   no free slot wait; a new connection is opened when the waiting requests outnumber
//!   what the connections being opened will hold, so 1,000 watches started at once open
//!   about ten connections, concurrently. Connections that receive a GOAWAY stop taking
//!   streams and close after their last one; connections that fail leave the pool, and
//!   streams on them fail with [`Error::ConnectionLost`] (kube's watcher retries).
//! - **Fallback.** Over TLS, ALPN offers `h2` and `http/1.1` ([`Protocol::Auto`]); over
//!   plain TCP, HTTP/2 with prior knowledge is tried first. An origin that answers
//!   HTTP/1.1 is remembered and served by hyper-util's HTTP/1.1 client from then on.
//! - **No deadline on bodies.** Only the response *headers* may have a deadline
//!   ([`ClientOptions::response_headers_timeout`]); an idle watch lives until the server
//!   ends it (its `timeoutSeconds`). Dead peers are found by HTTP/2 keep-alive PINGs
//!   instead, as client-go does (30 s interval, 15 s timeout).
//! - **Errors** are typed ([`Error`]). kube wraps errors of a request in
//!   `kube::Error::Service` and errors while reading a watch in an `std::io::Error`
//!   (`kube::Error::ReadEvents`); both can be downcast to [`Error`] along the source
//!   chain.
//! - **Every request is counted** ([`PoolHandle::requests`]): by resource and verb, read
//!   from the method and path as kube-apiserver's request-info reads them, and by HTTP
//!   status (429s included; `None` when no response came), with retries apart (requests
//!   marked [`kube_common::backoff::Retry`] by whoever retried). An optional
//!   [`RequestObserver`] sees each outcome with its `Retry-After`. kube's own retry layer
//!   is *not* installed: it would repeat 429s and 5xx below every counter and log.
//! - **`User-Agent: certwatch/<version>`** on every request that sets none
//!   ([`ClientOptions::user_agent`]), so the API server's audit log names the client.
//! - **One crypto back-end.** [`build_client`] installs rustls's ring provider as the
//!   process default if none is installed, so kube's TLS setup never panics for want of
//!   one.
//!
//! # Limitations
//!
//! - Proxies (`proxy_url` in the kube config) are refused with
//!   [`Error::ProxyNotSupported`]; the client connects to the API server directly.
//! - HTTP upgrades (kube's `ws` feature: exec, attach, port-forward) need HTTP/1.1 and
//!   are not routed specially; certwatch does not use them.
//! - Request trailers are not sent; kube never sets them. Request bodies are buffered
//!   before sending (kube's bodies are already in memory).
//! - Over plain TCP, a server that neither answers the HTTP/2 preface nor closes the
//!   connection within the connect timeout is a connect error, not a fallback.
//!
//! # Locks
//!
//! Three kinds of `std::sync::Mutex`, never held across an `.await`: the pool's table of
//! origins (lookup/insert only), one per origin guarding its connection list, slot
//! counts and connect bookkeeping, and the request accounting's counts (one map update
//! per request). Pool statistics are atomics.

mod accounting;
mod body;
mod client;
mod connection;
mod error;
mod http1;
mod options;
mod pool;
mod service;
mod stats;
mod token_file;
mod transport;

pub use accounting::{RequestObserver, RequestStats, ResponseCount, ResponseRecord, RetryCount};
pub use client::{PoolHandle, PooledClient, build_client};
pub use error::{ConnectError, Error};
pub use options::{
    ClientOptions, DEFAULT_MAX_STREAMS_PER_CONNECTION, DEFAULT_USER_AGENT, Protocol,
};
pub use stats::{ConnectionInfo, PoolStats};
