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
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use kube_common::sync;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use self::auth::{DelegatedAuth, Refusal};
use self::tls::{CertFiles, ServingCert};
use crate::http::Refresh;
use crate::logging::Repeats;
use crate::metrics::{CONTENT_TYPE, Metrics};
use crate::tls_policy::{TlsPolicy, TlsPolicyError};

/// Connections served at once; more wait in the kernel's backlog.
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
}

impl SecureMetricsOptions {
    /// On `listen`, with a self-signed certificate and answers cached for 10 s.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            cert: None,
            cache_ttl: Duration::from_secs(10),
            tls: TlsPolicy::default(),
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
        .with_state(AppState {
            metrics,
            refresh,
            auth: auth.clone(),
            refusals: Arc::new(Mutex::new(Repeats::new(REFUSAL_LOG_INTERVAL))),
        });
    let task = tokio::spawn(accept(listener, acceptor, app, shutdown));
    Ok(SecureMetrics { addr, task, auth })
}

async fn accept(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    shutdown: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let slot = tokio::select! {
            () = shutdown.cancelled() => break,
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let (stream, _peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: wait instead of spinning.
                    tracing::warn!(%error, "the metrics endpoint cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, app, watcher) = (acceptor.clone(), app.clone(), graceful.watcher());
        tokio::spawn(async move {
            let _slot = slot;
            let Ok(Ok(tls)) = tokio::time::timeout(CLIENT_TIMEOUT, acceptor.accept(stream)).await
            else {
                return;
            };
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(CLIENT_TIMEOUT);
            let connection = builder
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                .into_owned();
            // A client that goes away mid-request is not the daemon's problem.
            let _ = watcher.watch(connection).await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
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
        Err(refusal) => {
            let (status, result) = match &refusal {
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
    }
}
