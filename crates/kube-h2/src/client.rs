//! Building the `kube::Client`: kube's middleware (base URI, auth, extra headers) on top
//! of the pooled transport. Deliberately without kube's retry layer: a request the
//! server refused (429, 5xx) is retried by the caller, where it is counted and logged.

use std::sync::{Arc, Weak};

use kube::client::ConfigExt;
use tower::{BoxError, ServiceBuilder};

use crate::{
    accounting::{Accounting, RequestStats},
    connection::Keepalive,
    error::Error,
    http1,
    options::{ClientOptions, DEFAULT_USER_AGENT},
    pool::{Pool, PoolConfig},
    service::{Dispatcher, PoolService},
    stats::{ConnectionInfo, Counters, PoolStats},
    token_file,
    transport::{Connector, Origin},
};

/// A `kube::Client` on the pooled transport, and a handle to watch the pool.
#[derive(Clone)]
pub struct PooledClient {
    client: kube::Client,
    pool: PoolHandle,
}

impl PooledClient {
    /// The kube client (cheap to clone; all clones share the pool).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The pool's statistics handle.
    pub fn pool(&self) -> &PoolHandle {
        &self.pool
    }

    /// Shortcut for `self.pool().stats()`.
    pub fn stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Splits into the kube client and the pool handle.
    pub fn into_parts(self) -> (kube::Client, PoolHandle) {
        (self.client, self.pool)
    }
}

impl std::fmt::Debug for PooledClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledClient")
            .field("stats", &self.pool.stats())
            .finish_non_exhaustive()
    }
}

/// Read access to the pool's statistics.
///
/// The handle does not keep the pool alive: once every clone of the kube client is
/// dropped, the connections close and [`connections`](Self::connections) is empty.
#[derive(Clone)]
pub struct PoolHandle {
    counters: Arc<Counters>,
    accounting: Arc<Accounting>,
    pool: Weak<Pool>,
}

impl PoolHandle {
    /// The pool's counters now.
    pub fn stats(&self) -> PoolStats {
        self.counters.snapshot()
    }

    /// Every request sent so far, by resource, verb and HTTP status, and the retries
    /// among them. Cheap enough to call on every metrics scrape.
    pub fn requests(&self) -> RequestStats {
        self.accounting.snapshot()
    }

    /// Returns once no connection to the API server is open (at once if none is): after
    /// the last clone of the client is dropped, once the pool has closed them all.
    pub async fn closed(&self) {
        self.counters.all_closed().await;
    }

    /// The HTTP/2 connections in the pool now, in opening order.
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        self.pool
            .upgrade()
            .map(|pool| pool.connections())
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for PoolHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolHandle")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Builds a `kube::Client` whose requests share a pool of HTTP/2 connections.
///
/// The service stack mirrors kube's default one, minus its HTTP/1.1-only connector and
/// its retry layer: base URI, the auth layer (bearer token, refreshing token file, exec
/// plugin, basic auth), extra and impersonation headers, then the pooled transport,
/// which sets `User-Agent` and counts every outcome ([`PoolHandle::requests`]).
/// `config.default_retry` is ignored: kube's retry layer would repeat 429s and 5xx
/// below every counter and log; callers retry with their own backoff instead. TLS uses
/// `config.rustls_client_config()` (CA, client certificate, `accept_invalid_certs`,
/// rotating CA file), with ALPN set from [`ClientOptions::protocol`].
///
/// Must be called within a Tokio runtime (as `kube::Client::new`). Proxies
/// (`config.proxy_url`) are not supported and yield [`Error::ProxyNotSupported`].
pub fn build_client(config: kube::Config, options: ClientOptions) -> Result<PooledClient, Error> {
    ensure_crypto_provider();
    if let Some(proxy) = &config.proxy_url {
        return Err(Error::ProxyNotSupported {
            proxy: proxy.to_string(),
        });
    }
    let origin = Origin::from_uri(&config.cluster_url)?;
    let tls = if origin.tls {
        Some(config.rustls_client_config().map_err(Error::TlsConfig)?)
    } else {
        None
    };
    let connector = Arc::new(Connector::new(
        tls,
        options.protocol,
        config.tls_server_name.as_deref(),
        options.connect_timeout.or(config.connect_timeout),
    )?);
    let user_agent = options.user_agent.as_deref().unwrap_or(DEFAULT_USER_AGENT);
    let user_agent = http::HeaderValue::from_str(user_agent)
        .map_err(|_| Error::InvalidUserAgent(user_agent.to_owned()))?;
    let counters = Arc::new(Counters::default());
    let accounting = Arc::new(Accounting::new(options.observer.clone()));
    let pool = Arc::new(Pool::new(PoolConfig {
        connector: connector.clone(),
        protocol: options.protocol,
        stream_cap: options.stream_cap(),
        keepalive: Keepalive {
            interval: options.keepalive_interval,
            timeout: options.keepalive_timeout,
        },
        max_idle: options.max_idle_connections_per_origin,
        counters: counters.clone(),
    }));
    let dispatcher = Dispatcher {
        pool: pool.clone(),
        http1: http1::client(connector, counters.clone()),
        protocol: options.protocol,
        response_headers_timeout: options.response_headers_timeout.or(config.read_timeout),
        counters: counters.clone(),
        accounting: accounting.clone(),
        user_agent,
    };

    // A token file is read here, trimmed and re-read as client-go does (kube sends it
    // untrimmed); every other kind of credential goes through kube's auth layer.
    let (auth, token_file) = match token_file::token_file_of(&config) {
        Some(path) => (
            None,
            Some(token_file::TokenFileLayer::new(std::path::Path::new(path))?),
        ),
        None => (config.auth_layer().map_err(Error::Auth)?, None),
    };
    let extra_headers = config.extra_headers_layer().map_err(Error::Headers)?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(auth)
        .option_layer(token_file)
        .layer(extra_headers)
        .map_err(BoxError::from)
        .service(PoolService::new(dispatcher));

    let client = kube::Client::new(service, config.default_namespace.clone())
        .with_valid_until(exec_identity_expiry(&config));
    Ok(PooledClient {
        client,
        pool: PoolHandle {
            counters,
            accounting,
            pool: Arc::downgrade(&pool),
        },
    })
}

/// Makes sure rustls has a process-wide crypto provider before kube builds its TLS
/// configuration (kube uses `ClientConfig::builder()`, which panics when no provider is
/// installed and the crate features enable more than one). This workspace builds
/// rustls with ring only; ring is installed unless something else installed a provider
/// first.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race against another installer is fine: a provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// When a client certificate from an exec plugin expires, as kube's default builder
/// records it. kube computes this only inside its own builder, so for exec-based configs
/// a throwaway default client is built (no connection is opened; the plugin runs once
/// more).
fn exec_identity_expiry(config: &kube::Config) -> Option<jiff::Timestamp> {
    config.auth_info.exec.as_ref()?;
    kube::Client::try_from(config.clone())
        .ok()
        .and_then(|client| *client.valid_until())
}
