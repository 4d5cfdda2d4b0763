//! `/metrics` for authorized scrapers only (`--metrics-listen`): HTTPS, and every
//! request's bearer token reviewed by the API server ([`auth`]), as kube-rbac-proxy and
//! OpenShift's components serve their metrics. The metrics name every tenant's
//! namespaces, routes and secrets, so they are not for anyone who can reach the pod.
//!
//! | Answer | When |
//! |---|---|
//! | 200 | the token's user may `get` the non-resource URL `/metrics` |
//! | 401 (`WWW-Authenticate: Bearer`) | no bearer token, or one the API server does not accept |
//! | 403 | the token's user may not `get` `/metrics` |
//! | 503 | a review could not be made (API server unreachable, or certwatch not allowed to create TokenReviews and SubjectAccessReviews); retried at the next scrape |
//!
//! Probes (`/healthz`, `/readyz`) stay plain HTTP on `--listen`: a kubelet probes
//! without credentials.

pub mod auth;
pub mod tls;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kube_common::sync;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use self::auth::{DelegatedAuth, Refusal};
use self::tls::{CertFiles, ServingCert};
use crate::http::Refresh;
use crate::logging::Repeats;
use crate::metrics::{CONTENT_TYPE, Metrics};
use crate::tls_policy::{TlsPolicy, TlsPolicyError};

/// Connections served at once; one more takes the place of the one idle the longest.
const MAX_CONNECTIONS: usize = 256;
/// Time for a client to finish the TLS handshake, and to send a request's headers.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Refused scrapes are logged once, then at most once per interval with a count.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(300);

/// How the metrics endpoint is served.
#[derive(Clone, Debug)]
pub struct SecureMetricsOptions {
    /// Where it listens.
    pub listen: SocketAddr,
    /// The serving certificate's files; `None`: a self-signed certificate.
    pub cert: Option<CertFiles>,
    /// How long a review's answer is trusted.
    pub cache_ttl: Duration,
    /// The TLS versions and suites it accepts (the cluster's policy).
    pub tls: TlsPolicy,
    /// The socket of HAProxy's Prometheus exporter: its series on `/metrics/haproxy`,
    /// to the same authorized scrapers; `None`: no such path.
    pub haproxy_metrics: Option<std::path::PathBuf>,
}

impl SecureMetricsOptions {
    /// On `listen`, with a self-signed certificate and answers cached for 10 s.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            cert: None,
            cache_ttl: Duration::from_secs(10),
            tls: TlsPolicy::default(),
            haproxy_metrics: None,
        }
    }
}

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum SecureMetricsError {
    /// The serving certificate cannot be used.
    #[error("the metrics endpoint's certificate: {0}")]
    Certificate(#[from] tls::ServingCertError),
    /// The address cannot be listened on.
    #[error("cannot listen on {addr} (--metrics-listen): {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// rustls refused the configuration.
    #[error("the metrics endpoint's TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The TLS policy leaves rustls nothing to accept.
    #[error(transparent)]
    TlsPolicy(#[from] TlsPolicyError),
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    refresh: Refresh,
    auth: DelegatedAuth,
    /// Guards the pace of refusal log lines. Held only to count one.
    refusals: Arc<Mutex<Repeats>>,
    /// HAProxy's exporter socket, for `/metrics/haproxy`.
    haproxy_metrics: Option<std::path::PathBuf>,
}

/// The running endpoint.
#[derive(Debug)]
pub(crate) struct SecureMetrics {
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    /// Ends after shutdown, once the connections in progress are done.
    pub(crate) task: JoinHandle<()>,
    /// The reviews made.
    pub(crate) auth: DelegatedAuth,
}

/// Binds `options.listen` and serves `/metrics` until `shutdown` is cancelled; reviews
/// go through `client`.
pub(crate) async fn serve(
    options: &SecureMetricsOptions,
    client: kube::Client,
    metrics: Arc<Metrics>,
    refresh: Refresh,
    shutdown: CancellationToken,
) -> Result<SecureMetrics, SecureMetricsError> {
    let cert = ServingCert::load(options.cert.clone())?;
    let mut config = options
        .tls
        .rustls_server_builder()?
        .with_no_client_auth()
        .with_cert_resolver(cert.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener =
        TcpListener::bind(options.listen)
            .await
            .map_err(|source| SecureMetricsError::Listen {
                addr: options.listen,
                source,
            })?;
    let addr = listener
        .local_addr()
        .map_err(|source| SecureMetricsError::Listen {
            addr: options.listen,
            source,
        })?;
    if let Some(leaf) = cert.leaf() {
        tracing::info!(
            metrics_address = %addr,
            sha256 = %tls::fingerprint(&leaf),
            self_signed = cert.is_self_signed(),
            "the metrics endpoint's certificate"
        );
    }
    cert.spawn_reloads(shutdown.clone());
    let auth = DelegatedAuth::new(client, options.cache_ttl);
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/metrics/haproxy", get(haproxy_metrics))
        .with_state(AppState {
            metrics,
            refresh,
            auth: auth.clone(),
            refusals: Arc::new(Mutex::new(Repeats::new(REFUSAL_LOG_INTERVAL))),
            haproxy_metrics: options.haproxy_metrics.clone(),
        });
    // Idle and slow clients (TLS handshakes, HTTP/2 connections past their preface)
    // cannot starve authorized scrapes (see `crate::listener`).
    let limits = crate::listener::Limits {
        max_connections: MAX_CONNECTIONS,
        handshake_timeout: CLIENT_TIMEOUT,
        header_timeout: CLIENT_TIMEOUT,
        ..crate::listener::Limits::default()
    };
    let task = tokio::spawn(crate::listener::serve(
        listener,
        app,
        move |stream| acceptor.clone().accept(stream),
        limits,
        shutdown,
    ));
    Ok(SecureMetrics { addr, task, auth })
}

async fn metrics_text(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    match state.auth.check(authorization).await {
        Ok(()) => {
            state.metrics.daemon.scrape("served");
            (state.refresh)();
            (
                [(header::CONTENT_TYPE, CONTENT_TYPE)],
                state.metrics.encode(),
            )
                .into_response()
        }
        Err(refusal) => refused(&state, &refusal),
    }
}

/// HAProxy's own series (its Prometheus exporter, `haproxy_frontend_*`,
/// `haproxy_backend_*` per route, `haproxy_server_*`, `haproxy_process_*`), for the
/// scrapers allowed `/metrics`: fetched from the exporter's socket in the configuration
/// directory at each scrape.
async fn haproxy_metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    if let Err(refusal) = state.auth.check(authorization).await {
        return refused(&state, &refusal);
    }
    let Some(socket) = state.haproxy_metrics.clone() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match tokio::time::timeout(CLIENT_TIMEOUT, exporter_text(&socket)).await {
        Ok(Ok((content_type, body))) => {
            state.metrics.daemon.scrape("served");
            ([(header::CONTENT_TYPE, content_type)], body).into_response()
        }
        Ok(Err(error)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "HAProxy's exporter at {} does not answer: {error}\n",
                socket.display()
            ),
        )
            .into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "HAProxy's exporter did not answer in time\n",
        )
            .into_response(),
    }
}

/// One `GET /metrics` to HAProxy's exporter: its content type and body.
async fn exporter_text(socket: &std::path::Path) -> std::io::Result<(String, Vec<u8>)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::UnixStream::connect(socket).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: haproxy\r\n\r\n")
        .await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let split = answer
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP answer"))?;
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or_default().to_owned();
        return Err(std::io::Error::other(status));
    }
    let content_type = head
        .lines()
        .find_map(|line| {
            line.split_once(':')
                .filter(|(name, _)| name.eq_ignore_ascii_case("content-type"))
                .map(|(_, value)| value.trim().to_owned())
        })
        .unwrap_or_else(|| "text/plain; version=0.0.4".to_owned());
    let body = &answer[split + 4..];
    let chunked = head.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((content_type, body))
}

/// The body of a chunked HTTP/1.1 answer (the exporter streams its series).
fn dechunk(mut body: &[u8]) -> std::io::Result<Vec<u8>> {
    let bad = || std::io::Error::other("a malformed chunked answer");
    let mut out = Vec::with_capacity(body.len());
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").ok_or_else(bad)?;
        let size_text = std::str::from_utf8(&body[..line_end]).map_err(|_| bad())?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| bad())?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = body.get(..size).ok_or_else(bad)?;
        out.extend_from_slice(chunk);
        body = body.get(size + 2..).ok_or_else(bad)?;
    }
}

/// The answer to a refused scrape (counted, logged at a bounded pace).
fn refused(state: &AppState, refusal: &Refusal) -> Response {
    let (status, result) = match refusal {
        Refusal::NoToken | Refusal::NotAuthenticated => {
            (StatusCode::UNAUTHORIZED, "unauthenticated")
        }
        Refusal::Forbidden { .. } => (StatusCode::FORBIDDEN, "forbidden"),
        Refusal::ReviewFailed { .. } => (StatusCode::SERVICE_UNAVAILABLE, "review_failed"),
    };
    state.metrics.daemon.scrape(result);
    let due = sync::lock(&state.refusals).occurred(std::time::Instant::now());
    if let Some(count) = due {
        tracing::warn!(
            status = status.as_u16(),
            refused = count,
            "a scrape of /metrics was refused: {refusal} ({count} refused since the last such line; all are counted in certwatch_metrics_scrapes_total)"
        );
    }
    let mut response = (status, format!("{refusal}\n")).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"certwatch\""),
        );
    }
    response
}
