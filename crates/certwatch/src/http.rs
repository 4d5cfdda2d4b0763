//! The plain HTTP endpoint (`--listen`): `/healthz` (the process runs), `/readyz` (200
//! once ready, 503 before, with the progress in the body) and, unless the metrics have
//! an authorized endpoint of their own ([`crate::secure_metrics`]), `/metrics`
//! (Prometheus text format).
//!
//! Connections are bounded and timed out as [`crate::listener`] says, so that idle or
//! slow clients cannot starve the probes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::haproxy::HaproxyState;
use crate::metrics::{CONTENT_TYPE, Metrics};
use crate::outputs::DaemonStatus;

/// Refreshes gauges that are read from elsewhere (secret counts, connections) right
/// before a scrape.
pub(crate) type Refresh = Arc<dyn Fn() + Send + Sync>;

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    status: watch::Receiver<DaemonStatus>,
    refresh: Refresh,
    /// Set once the process is stopping: not ready from then on.
    draining: Arc<AtomicBool>,
}

/// Binds `addr` and serves until `shutdown` is cancelled; `/metrics` only with
/// `with_metrics`; `/readyz` answers 503 once `draining` is set.
pub(crate) async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    with_metrics: bool,
    status: watch::Receiver<DaemonStatus>,
    draining: Arc<AtomicBool>,
    refresh: Refresh,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    if with_metrics {
        app = app.route("/metrics", get(metrics_text));
    }
    let app = app.with_state(AppState {
        metrics,
        status,
        refresh,
        draining,
    });
    // Idle and slow clients cannot starve the probes (see `crate::listener`).
    let task = tokio::spawn(crate::listener::serve(
        listener,
        app,
        |stream| std::future::ready(Ok(stream)),
        crate::listener::Limits::default(),
        shutdown,
    ));
    Ok((local, task))
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let status = *state.status.borrow();
    let progress = status.readiness;
    if state.draining.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: stopping (SIGTERM); still serving until the shutdown delay ends\n"
                .to_owned(),
        )
    } else if status.ready {
        (
            StatusCode::OK,
            format!(
                "ready: {} routes admitted, {} rejected\n",
                status.admitted, status.rejected
            ),
        )
    } else if let Some(haproxy) = status.haproxy.filter(|_| status.files_ready) {
        let why = match haproxy.state {
            HaproxyState::Starting => "HAProxy was started on them and is loading them".to_owned(),
            HaproxyState::Down | HaproxyState::WaitingForFiles => {
                "HAProxy does not answer (see certwatch's log); retrying".to_owned()
            }
            HaproxyState::Serving if status.routed == Some(false) => {
                "HAProxy has not loaded the routes' configuration yet".to_owned()
            }
            HaproxyState::Serving => format!(
                "HAProxy serves {} of the {} routes present at start-up",
                haproxy.startup_routes - haproxy.startup_unserved,
                haproxy.startup_routes
            ),
        };
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: every route present at start-up is decided and its files are written, but {why}\n"
            ),
        )
    } else if let Some(files) = status.waiting_for_files {
        let cause = files
            .error
            .map(|kind| format!(": writes fail ({kind})"))
            .unwrap_or_default();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: every route present at start-up is decided, but {} of {} bundles are written {}{cause}; retrying\n",
                files.written,
                files.served,
                if files.crt_list_written {
                    "(the crt-list names only those)"
                } else {
                    "and the crt-list is not written"
                },
            ),
        )
    } else if !progress.listed {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for the list of routes\n".to_owned(),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: {} of {} routes present at start-up decided\n",
                progress.initial_done, progress.initial_routes
            ),
        )
    }
}

async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    (state.refresh)();
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        state.metrics.encode(),
    )
}
