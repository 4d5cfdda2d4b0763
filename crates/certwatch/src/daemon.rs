//! The daemon as a library: [`Daemon::start`] wires the route pipeline to the cert
//! directory, the reload command, HAProxy, the routing task, metrics and the HTTP
//! endpoint, on one kube client over a pool of HTTP/2 connections.
//!
//! ```text
//! route watch(es) ─▶ scope filter ─▶ RoutePipeline ─▶ outcomes ─▶ Outputs ─┬▶ cert dir (bundles, crt-list)
//!                                      │   ▲                                ├▶ reload command (debounced)
//!                          SecretManager   AccessChecker                    ├▶ proxies (proxy::Proxy): HAProxy's
//!                          (one watch per secret, shared)                   │  runtime API and routing task
//!                                                                           └▶ metrics, readiness
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kube_common::adaptive::{AdaptiveLimiter, LimiterSnapshot};
use kube_common::reconnect::Reconnect;
use kube_h2::{ClientOptions, PoolHandle, PoolStats};
use route_secrets::api::access::{AccessChecker, AccessOptions, AccessPolicy, AccessStats};
use route_secrets::api::leader::{LeaderElector, Leadership, LeaseOptions};
use route_secrets::api::manager::{SecretManager, TlsSecretMonitor};
use route_secrets::api::pipeline::{
    HostPolicy, PipelineError, PipelineOptions, PipelineOutputs, Readiness, RoutePipeline,
};
use route_secrets::api::status_writer::{StatusWriter, StatusWriterOptions};
use route_secrets::route::Route;
use route_secrets::route::admission::RouterIdentity;
use route_secrets::tls::{SecurityLevel, TlsValidator};
use secret_monitor::{MonitorObserver, MonitorOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cert_dir::CertDir;
use crate::files::LINKS_DIR;
use crate::haproxy::crt_list::{CrtList, CrtListOptions};
use crate::haproxy::process::Drain;
use crate::haproxy::{Haproxy, HaproxyHandle, HaproxyOptions};
use crate::http;
use crate::metrics::Metrics;
use crate::outputs::{DaemonStatus, Outputs};
use crate::progress::{self, ProgressMode};
use crate::proxy::Proxy;
use crate::proxy::haproxy::HaproxyProxy;
use crate::reload::{ReloadOptions, Reloader};
use crate::routing::{Routing, RoutingOptions};
use crate::secure_metrics::auth::AuthStats;
use crate::secure_metrics::{self, SecureMetrics, SecureMetricsError, SecureMetricsOptions};
use crate::throttle;
use route_secrets::api::route_watch::{RouteScope, scoped_route_events};

/// The route name the streaming probe ([`secret_monitor::ObjectMonitor::probe_streaming`])
/// asks about: one no route has, so the answer carries no object.
pub const STREAMING_PROBE_NAME: &str = "certwatch-streaming-list-probe";

/// How long [`Daemon::shutdown`] waits for the API connections to close once the last
/// watch is released.
const CLOSE_PATIENCE: Duration = Duration::from_secs(5);

/// Everything the daemon can be told.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    /// Which routes to serve.
    pub scope: RouteScope,
    /// Where bundles and the crt-list go.
    pub cert_dir: PathBuf,
    /// The reload command, if any.
    pub reload: Option<ReloadOptions>,
    /// The HAProxy certwatch feeds (its runtime API, and whether certwatch runs it), if
    /// any.
    pub haproxy: Option<HaproxyOptions>,
    /// HAProxy's whole configuration for the served routes (frontends, maps, backends
    /// with their servers from EndpointSlices), and the HAProxy certwatch runs on it.
    pub routing: Option<RoutingOptions>,
    /// How crt-list lines are written (ALPN).
    pub crt_list: CrtListOptions,
    /// Address of `/healthz`, `/readyz` (and `/metrics` without `secure_metrics`);
    /// `None`: no HTTP endpoint.
    pub listen: Option<SocketAddr>,
    /// `/metrics` over HTTPS for authorized scrapers only, instead of on `listen`.
    pub secure_metrics: Option<SecureMetricsOptions>,
    /// Without `secure_metrics`: serve `/metrics` on `listen` to anyone (off: no
    /// metrics endpoint at all; the metrics name every tenant's routes and secrets).
    pub unauthenticated_metrics: bool,
    /// Router name of the `status.ingress[]` entry.
    pub router_name: String,
    /// Record admissions and rejections in route status.
    pub write_status: bool,
    /// Concurrent status writes.
    pub status_concurrency: usize,
    /// With `write_status`: one status writer among the replicas of `router_name`,
    /// elected on this Lease (an empty namespace: the client's, i.e. the pod's own);
    /// `None`: this replica always writes.
    pub leader_election: Option<LeaseOptions>,
    /// How the router identity's access to each secret is checked.
    pub access_policy: AccessPolicy,
    /// How long access answers are cached.
    pub access_ttl: Duration,
    /// How long a cached *denial* is trusted (a grant added later is noticed after
    /// at most this long, at the route's next retry).
    pub access_denied_ttl: Duration,
    /// How rejection messages name the router identity.
    pub identity: String,
    /// Which hosts are admitted (wildcard routes, namespace ownership of hosts).
    pub hosts: HostPolicy,
    /// The router's domain: routes with `spec.subdomain` and no `spec.host` are served,
    /// and their status written, as `<subdomain>.<domain>` (the router's
    /// `ROUTER_DOMAIN`).
    pub router_domain: Option<String>,
    /// The OpenSSL security level of the HAProxy the certificates are for: keys it
    /// would refuse to load are rejected (default: the router image's, 1).
    pub openssl_security_level: SecurityLevel,
    /// The upper bound of the adaptive limiter's window: at most this many first syncs
    /// of secrets and access reviews at once (`None`: as many as the API server takes).
    pub max_concurrent_syncs: Option<usize>,
    /// Deadline of a secret's first sync.
    pub sync_timeout: Duration,
    /// The API client's connection pool.
    pub client: ClientOptions,
    /// Bundle writes in flight at once.
    pub write_concurrency: usize,
    /// How start-up progress is shown.
    pub progress: ProgressMode,
    /// When the HAProxy certwatch runs (`haproxy`'s managed mode, or `routing`'s) is
    /// stopped: how long its connections may take to finish, and the cut that stops it
    /// at once ([`Daemon::haproxy_drain`]). It replaces both options' own.
    pub haproxy_drain: Drain,
}

impl DaemonOptions {
    /// Defaults: every namespace, no reload command, no HAProxy, no HTTP endpoint,
    /// no status writes, one rules review per namespace.
    pub fn new(cert_dir: impl Into<PathBuf>) -> Self {
        Self {
            scope: RouteScope::default(),
            cert_dir: cert_dir.into(),
            reload: None,
            haproxy: None,
            routing: None,
            haproxy_drain: Drain::default(),
            crt_list: CrtListOptions::default(),
            listen: None,
            secure_metrics: None,
            unauthenticated_metrics: false,
            router_name: "certwatch".to_owned(),
            write_status: false,
            status_concurrency: 20,
            leader_election: None,
            access_policy: AccessPolicy::SelfRules,
            access_ttl: Duration::from_secs(600),
            access_denied_ttl: Duration::from_secs(30),
            identity: "certwatch's service account".to_owned(),
            hosts: HostPolicy::default(),
            router_domain: None,
            openssl_security_level: SecurityLevel::default(),
            max_concurrent_syncs: None,
            sync_timeout: Duration::from_secs(120),
            client: ClientOptions::default(),
            write_concurrency: 16,
            progress: ProgressMode::Off,
        }
    }
}

/// Why the daemon could not start or ended badly.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The API client could not be built from the configuration.
    #[error("cannot build the Kubernetes API client: {0}")]
    Client(#[from] kube_h2::Error),
    /// The cert directory could not be prepared.
    #[error("cannot prepare the cert directory {path}: {source}")]
    CertDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The HTTP endpoint could not listen.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The default certificate could not be read or made.
    #[error("cannot prepare the default certificate {path}: {source}")]
    DefaultCertificate {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The authorized metrics endpoint could not start.
    #[error(transparent)]
    SecureMetrics(#[from] SecureMetricsError),
    /// The daemon stopped before it was ready.
    #[error("the daemon stopped before it was ready")]
    Stopped,
}

/// Makes a self-signed default certificate at `path` when there is none (as the router
/// makes one when given none): HAProxy needs one for names no route has.
fn ensure_default_certificate(path: &Path) -> std::io::Result<()> {
    if path.exists() {
        return Ok(());
    }
    let key = rcgen::KeyPair::generate().map_err(std::io::Error::other)?;
    let mut params = rcgen::CertificateParams::new(vec!["certwatch-default.invalid".to_owned()])
        .map_err(std::io::Error::other)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "certwatch default certificate");
    let certificate = params.self_signed(&key).map_err(std::io::Error::other)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = tempfile::NamedTempFile::new_in(path.parent().unwrap_or(Path::new(".")))?;
    std::io::Write::write_all(
        &mut file,
        format!("{}{}", certificate.pem(), key.serialize_pem()).as_bytes(),
    )?;
    file.persist(path).map_err(|error| error.error)?;
    info!(path = %path.display(), "wrote a self-signed default certificate");
    Ok(())
}

/// The `notAfter` (Unix seconds) of the first certificate in the PEM file at `path`:
/// the one HAProxy serves (the rest of the file is its chain and key).
fn default_certificate_not_after(path: &Path) -> Option<i64> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;
    let bytes = std::fs::read(path).ok()?;
    let der = CertificateDer::pem_slice_iter(&bytes).next()?.ok()?;
    let (_, certificate) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some(certificate.validity().not_after.timestamp())
}

/// A running daemon. Stop it with [`Daemon::shutdown`].
pub struct Daemon {
    status: watch::Receiver<DaemonStatus>,
    /// The pipeline's own start-up progress, ahead of the outputs' `status`.
    pipeline_readiness: watch::Receiver<Readiness>,
    /// Counts re-synchronisation requests (SIGHUP) for the outputs task.
    resync: watch::Sender<u64>,
    metrics: Arc<Metrics>,
    pool: PoolHandle,
    limiter: AdaptiveLimiter,
    /// The status writer (with `--write-status`), for its counters.
    status_writes: Option<StatusWriter>,
    /// This replica's part in the election of the status writer.
    elector: Option<LeaderElector>,
    manager: SecretManager,
    access: AccessChecker,
    cert_dir: PathBuf,
    http_addr: Option<SocketAddr>,
    secure_metrics: Option<SecureMetrics>,
    /// Set when the daemon is told to stop soon: `/readyz` answers 503 from then on.
    draining: Arc<AtomicBool>,
    shutdown: CancellationToken,
    /// Ends with an error when the route watch was refused for good (e.g. an invalid
    /// route selector).
    pipeline: JoinHandle<Result<(), PipelineError>>,
    outputs: JoinHandle<()>,
    http: Option<JoinHandle<()>>,
    progress: Option<JoinHandle<()>>,
    throttle_log: JoinHandle<()>,
    /// The HAProxy controller's handle, when certwatch feeds a HAProxy.
    haproxy: Option<HaproxyHandle>,
    /// How the HAProxy certwatch runs is stopped.
    haproxy_drain: Drain,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("cert_dir", &self.cert_dir)
            .field("http_addr", &self.http_addr)
            .field("status", &*self.status.borrow())
            .finish_non_exhaustive()
    }
}

/// The daemon's parts, built and wired but not running: everything that depends on
/// the configuration and can fail on it, before any task of the daemon runs.
struct Parts {
    started: Instant,
    metrics: Arc<Metrics>,
    cert_dir: CertDir,
    client: kube::Client,
    pool: PoolHandle,
    limiter: AdaptiveLimiter,
    manager: SecretManager,
    access: AccessChecker,
    pipeline: RoutePipeline,
    pipeline_outputs: PipelineOutputs,
    reconnect: Reconnect,
    status_writes: Option<StatusWriter>,
    elector: Option<LeaderElector>,
}

impl Parts {
    /// Prepares the cert directory and builds the API client, the secret manager, the
    /// access checker, the status writer and the route pipeline on one adaptive
    /// limiter.
    async fn build(config: kube::Config, options: &DaemonOptions) -> Result<Self, DaemonError> {
        let started = Instant::now();
        let metrics = Arc::new(Metrics::new());
        if options.haproxy.is_some() {
            metrics.register_haproxy();
        }
        let index = Arc::new(CrtList::new(options.crt_list.clone()));
        let cert_dir = CertDir::open(&options.cert_dir, options.write_concurrency, index)
            .await
            .map_err(|source| DaemonError::CertDir {
                path: options.cert_dir.clone(),
                source,
            })?
            // The changed lines are for the HAProxy fed through its runtime API; one
            // run by others also gets the routes decided before start-up is complete.
            .with_change_report(options.haproxy.is_some())
            .with_decided_report(matches!(
                options.haproxy.as_ref().map(|haproxy| &haproxy.mode),
                Some(crate::haproxy::HaproxyMode::External { .. })
            ));
        if let Some(routing) = &options.routing {
            ensure_default_certificate(&routing.render.default_certificate).map_err(|source| {
                DaemonError::DefaultCertificate {
                    path: routing.render.default_certificate.clone(),
                    source,
                }
            })?;
            match default_certificate_not_after(&routing.render.default_certificate) {
                Some(not_after) => metrics.routing.default_certificate_expires(not_after),
                None => warn!(
                    path = %routing.render.default_certificate.display(),
                    "the default certificate has no readable certificate: its expiry is not exported"
                ),
            }
        }
        info!(
            cluster = %config.cluster_url,
            cert_dir = %cert_dir.path().display(),
            "starting"
        );
        log_assumed_security_level(options);
        let request_observer: Arc<dyn kube_h2::RequestObserver> = metrics.clone();
        let (client, pool) =
            kube_h2::build_client(config, options.client.clone().observer(request_observer))?
                .into_parts();
        // One window per process: every burst of requests (first syncs, access
        // reviews, status writes) draws from what the API server was seen to accept.
        let limiter = AdaptiveLimiter::new(options.max_concurrent_syncs);
        // One prober of the API server: after an outage (a control-plane restart)
        // every watch resumes as soon as it answers again.
        let reconnect = Reconnect::new(client.clone());
        let manager = secret_manager(&client, options, &metrics, &limiter, &reconnect);
        let access = AccessChecker::with_limiter(
            client.clone(),
            AccessOptions {
                policy: options.access_policy.clone(),
                ttl: options.access_ttl,
                // A denial is never trusted longer than an answer.
                denied_ttl: options.access_denied_ttl.min(options.access_ttl),
            },
            limiter.clone(),
        );
        // Every replica decides and serves; one writes status: the Lease's holder.
        let elector = options
            .leader_election
            .clone()
            .filter(|_| options.write_status)
            .map(|mut lease| {
                if lease.namespace.is_empty() {
                    lease.namespace = client.default_namespace().to_owned();
                }
                LeaderElector::spawn(client.clone(), lease)
            });
        let status_writer = options.write_status.then(|| {
            // Status writes follow the start-up burst: the same window paces them.
            StatusWriter::spawn_with(
                client.clone(),
                RouterIdentity {
                    domain: options.router_domain.clone(),
                    ..RouterIdentity::new(options.router_name.clone())
                },
                StatusWriterOptions {
                    limiter: Some(limiter.clone()),
                    leadership: elector
                        .as_ref()
                        .map_or_else(Leadership::always, LeaderElector::leadership),
                    ..StatusWriterOptions::new(options.status_concurrency)
                },
            )
        });
        let status_writes = status_writer.clone();
        let (pipeline, pipeline_outputs) = RoutePipeline::new(
            manager.clone(),
            access.clone(),
            status_writer,
            PipelineOptions {
                identity: options.identity.clone(),
                hosts: options.hosts,
                router_domain: options.router_domain.clone(),
                validator: TlsValidator::default().security_level(options.openssl_security_level),
                ..PipelineOptions::default()
            },
        );
        Ok(Self {
            started,
            metrics,
            cert_dir,
            client,
            pool,
            limiter,
            manager,
            access,
            pipeline,
            pipeline_outputs,
            reconnect,
            status_writes,
            elector,
        })
    }

    /// Starts the daemon's tasks: the HTTP endpoints first (binding them is the one
    /// step that can still fail, before anything else runs), then the route watches
    /// and the pipeline, the outputs (cert directory, reload command, HAProxy, routing), the
    /// progress display and the throttling log.
    async fn spawn(self, options: &DaemonOptions) -> Result<Daemon, DaemonError> {
        let Self {
            started,
            metrics,
            cert_dir,
            client,
            pool,
            limiter,
            manager,
            access,
            pipeline,
            pipeline_outputs,
            reconnect,
            status_writes,
            elector,
        } = self;
        let shutdown = CancellationToken::new();
        let draining = Arc::new(AtomicBool::new(false));
        let (status_sender, status) = watch::channel(DaemonStatus::default());
        // The endpoints come first: binding them is what can still fail, and nothing
        // runs yet that a failure would leave behind.
        let refresh = || refresher(&metrics, &manager, &pool, &limiter, status_writes.as_ref());
        let Endpoints {
            secure_metrics,
            http_addr,
            http,
        } = Endpoints::serve(
            options, &client, &metrics, refresh, &status, &draining, &shutdown,
        )
        .await?;

        // Whether the server serves streaming lists is asked once, with the routes'
        // own collection (which this identity lists anyway; the name exists nowhere),
        // while the routes are being listed: a server without them then refuses one
        // request, not the first sync of every secret.
        manager.monitor().probe_streaming(
            <Route as kube::Resource>::url_path(
                &(),
                options.scope.namespaces.first().map(String::as_str),
            ),
            STREAMING_PROBE_NAME,
        );
        let events = {
            let metrics = Arc::clone(&metrics);
            scoped_route_events(
                client.clone(),
                &options.scope,
                &limiter,
                Some(reconnect),
                move |source, error| {
                    metrics.api.watcher_error(source, error);
                },
            )
            .take_until(shutdown.clone().cancelled_owned())
        };
        let pipeline_readiness = pipeline_outputs.readiness.clone();
        let pipeline = tokio::spawn(pipeline.run(events));

        let cert_dir_path = cert_dir.path().to_owned();
        let routing = options.routing.clone().map(|mut routing| {
            // The crt-list by the path the certificates' synchronisation names it.
            routing.render.crt_list = cert_dir.index_path();
            // Its loads keep the files they may read in place.
            routing.file_loads = cert_dir.file_loads();
            routing.drain = options.haproxy_drain.clone();
            // The EndpointSlices' list goes out now, beside the routes': start-up keeps
            // its round trips. Paced by the same window.
            let paced = kube_common::adaptive::sequential_client(client.clone(), limiter.clone());
            Routing::spawn(paced, routing, Arc::clone(&metrics))
        });
        let (outputs, resync, haproxy_handle) = spawn_outputs(
            cert_dir,
            options,
            routing,
            &metrics,
            started,
            status_sender,
            pipeline_outputs,
        );
        let progress = {
            let manager = manager.clone();
            progress::spawn(
                options.progress,
                status.clone(),
                Arc::new(move || secret_counts(&manager)),
                limiter.clone(),
            )
        };
        let throttle_log = throttle::spawn_log(limiter.clone(), shutdown.clone());

        Ok(Daemon {
            status_writes,
            elector,
            status,
            pipeline_readiness,
            resync,
            metrics,
            pool,
            limiter,
            manager,
            access,
            cert_dir: cert_dir_path,
            http_addr,
            secure_metrics,
            draining,
            shutdown,
            pipeline,
            outputs,
            http,
            progress: Some(progress),
            throttle_log,
            haproxy: haproxy_handle,
            haproxy_drain: options.haproxy_drain.clone(),
        })
    }
}

/// The daemon's HTTP endpoints, bound.
struct Endpoints {
    secure_metrics: Option<SecureMetrics>,
    http_addr: Option<SocketAddr>,
    http: Option<JoinHandle<()>>,
}

impl Endpoints {
    /// Binds the authorized metrics endpoint and the plain HTTP endpoint that `options`
    /// ask for (`/metrics` on the plain one only without the authorized one); each
    /// gets its own `refresh`. A bind that fails stops what was started.
    async fn serve(
        options: &DaemonOptions,
        client: &kube::Client,
        metrics: &Arc<Metrics>,
        refresh: impl Fn() -> http::Refresh,
        status: &watch::Receiver<DaemonStatus>,
        draining: &Arc<AtomicBool>,
        shutdown: &CancellationToken,
    ) -> Result<Self, DaemonError> {
        let secure_metrics = match &options.secure_metrics {
            Some(secure) => Some(
                secure_metrics::serve(
                    secure,
                    client.clone(),
                    Arc::clone(metrics),
                    refresh(),
                    shutdown.clone(),
                )
                .await?,
            ),
            None => None,
        };
        let (http_addr, http) = match options.listen {
            Some(addr) => {
                let (local, task) = http::serve(
                    addr,
                    Arc::clone(metrics),
                    secure_metrics.is_none() && options.unauthenticated_metrics,
                    status.clone(),
                    Arc::clone(draining),
                    refresh(),
                    shutdown.clone(),
                )
                .await
                .map_err(|source| {
                    // Stops the authorized metrics endpoint, if it was started.
                    shutdown.cancel();
                    DaemonError::Listen { addr, source }
                })?;
                (Some(local), Some(task))
            }
            None => (None, None),
        };
        Ok(Self {
            secure_metrics,
            http_addr,
            http,
        })
    }
}

/// Starts the outputs task (cert directory, reload command, HAProxy, readiness) on the
/// pipeline's outcomes; returns it with the sender of re-synchronisation requests and
/// the HAProxy controller's handle. `routing` is the routing task, when routing is
/// configured.
fn spawn_outputs(
    cert_dir: CertDir,
    options: &DaemonOptions,
    routing: Option<Routing>,
    metrics: &Arc<Metrics>,
    started: Instant,
    status: watch::Sender<DaemonStatus>,
    pipeline: PipelineOutputs,
) -> (JoinHandle<()>, watch::Sender<u64>, Option<HaproxyHandle>) {
    let cert_dir_path = cert_dir.path().to_owned();
    let crt_list_path = cert_dir.index_path();
    let reloader = options.reload.clone().map(|reload| {
        Reloader::spawn(
            reload,
            cert_dir_path.clone(),
            crt_list_path.clone(),
            Arc::clone(metrics),
        )
    });
    let file_loads = cert_dir.file_loads();
    let refused = cert_dir.excluded().clone();
    let haproxy = options.haproxy.clone().map(|mut haproxy| {
        // Its starts and reloads keep the files they may read in place.
        haproxy.file_loads = file_loads.clone();
        // What it refused before stays refused (its lines are out of the crt-list).
        haproxy.refused = refused.clone();
        haproxy.drain = options.haproxy_drain.clone();
        // The HAProxy certwatch runs loads certificates at the level they were
        // validated at, unless told otherwise.
        if let crate::haproxy::HaproxyMode::Managed(process) = &mut haproxy.mode {
            process
                .security_level
                .get_or_insert(options.openssl_security_level);
        }
        Haproxy::spawn(
            haproxy,
            crt_list_path.to_string_lossy().into_owned(),
            format!("{}/", cert_dir_path.join(LINKS_DIR).display()),
            Arc::clone(metrics),
        )
    });
    let haproxy_handle = haproxy.as_ref().map(Haproxy::handle);
    // Route changes that need a reload of a HAProxy run by others go through the
    // controller's master CLI.
    if let (Some(routing), Some(handle)) = (&routing, &haproxy_handle) {
        routing.use_haproxy(handle.clone());
    }
    let (resync, resync_requests) = watch::channel(0);
    let outputs = tokio::spawn(
        Outputs {
            cert_dir,
            metrics: Arc::clone(metrics),
            reloader,
            // Every proxy certwatch feeds; a second one is one more entry here.
            proxies: [
                HaproxyProxy::new(haproxy, routing).map(|proxy| Box::new(proxy) as Box<dyn Proxy>)
            ]
            .into_iter()
            .flatten()
            .collect(),
            status,
            started,
            resync: resync_requests,
            routes_pending: Vec::new(),
        }
        .run(pipeline.outcomes, pipeline.readiness),
    );
    (outputs, resync, haproxy_handle)
}

/// The secret manager: one shared watch per secret, cached as only what serving reads.
fn secret_manager(
    client: &kube::Client,
    options: &DaemonOptions,
    metrics: &Arc<Metrics>,
    limiter: &AdaptiveLimiter,
    reconnect: &Reconnect,
) -> SecretManager {
    let observer: Arc<dyn MonitorObserver> = metrics.clone();
    // The cache keeps only what serving reads (the TLS entries and the version),
    // decoded without labels, annotations, managed fields or other entries: thousands
    // of secrets are cached for the process's life.
    SecretManager::new(TlsSecretMonitor::with_options(
        client.clone(),
        MonitorOptions {
            observer: Some(observer),
            // First syncs are paced by the process's one window.
            limiter: Some(limiter.clone()),
            max_concurrent_syncs: options.max_concurrent_syncs,
            sync_timeout: options.sync_timeout,
            reconnect: Some(reconnect.clone()),
            ..MonitorOptions::default()
        },
    ))
}

impl Daemon {
    /// Starts watching routes through `config` and serving their certificates as
    /// `options` say: builds the daemon's parts (nothing runs yet; a configuration they
    /// cannot be built with is an error), then starts their tasks. Returns once
    /// everything is started, long before it is ready (see [`Daemon::wait_ready`]); an
    /// unreachable API server is retried, not an error.
    pub async fn start(config: kube::Config, options: DaemonOptions) -> Result<Self, DaemonError> {
        Parts::build(config, &options).await?.spawn(&options).await
    }

    /// Waits until the start-up progress display is done (it ends when the daemon is
    /// ready), so that output printed next does not mix with the progress bar.
    pub async fn progress_done(&mut self) {
        if let Some(progress) = self.progress.take() {
            let _ = progress.await;
        }
    }

    /// The daemon's state now, and its changes.
    pub fn status(&self) -> watch::Receiver<DaemonStatus> {
        self.status.clone()
    }

    /// The route pipeline's start-up progress as it happens: routes listed, and every
    /// route present at start-up decided. The daemon is ready later, once the outputs
    /// have written what the pipeline decided ([`Daemon::status`]).
    pub fn pipeline_readiness(&self) -> watch::Receiver<Readiness> {
        self.pipeline_readiness.clone()
    }

    /// Waits until the daemon is ready.
    pub async fn wait_ready(&self) -> Result<DaemonStatus, DaemonError> {
        let mut status = self.status.clone();
        let ready = status
            .wait_for(|status| status.ready)
            .await
            .map_err(|_| DaemonError::Stopped)?;
        Ok(*ready)
    }

    /// Brings the proxy up to date again (what SIGHUP does): HAProxy's state is read
    /// afresh and synchronised, and the reload command runs once. Before start-up is
    /// decided there is nothing to re-synchronise and the request is dropped.
    pub fn resync(&self) {
        self.resync.send_modify(|count| *count += 1);
    }

    /// The HAProxy controller's handle (its runtime API connection, reload requests,
    /// its status), when certwatch feeds a HAProxy.
    pub fn haproxy(&self) -> Option<&HaproxyHandle> {
        self.haproxy.as_ref()
    }

    /// Where the HTTP endpoint listens.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// Where the authorized metrics endpoint listens (HTTPS), if there is one.
    pub fn secure_metrics_addr(&self) -> Option<SocketAddr> {
        self.secure_metrics.as_ref().map(|secure| secure.addr)
    }

    /// The token and access reviews the authorized metrics endpoint made.
    pub fn metrics_auth_stats(&self) -> Option<AuthStats> {
        self.secure_metrics
            .as_ref()
            .map(|secure| secure.auth.stats())
    }

    /// The cert directory (absolute).
    pub fn cert_dir(&self) -> &Path {
        &self.cert_dir
    }

    /// The metrics (refreshed) in Prometheus text format.
    pub fn metrics_text(&self) -> String {
        refresher(
            &self.metrics,
            &self.manager,
            &self.pool,
            &self.limiter,
            self.status_writes.as_ref(),
        )();
        self.metrics.encode()
    }

    /// The API client's connection pool counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// The adaptive limiter's window and counters.
    pub fn limiter_snapshot(&self) -> LimiterSnapshot {
        self.limiter.snapshot()
    }

    /// The access checker's request counters.
    pub fn access_stats(&self) -> AccessStats {
        self.access.stats()
    }

    /// Secrets watched, and how many finished their first sync.
    pub fn secret_counts(&self) -> (usize, usize) {
        secret_counts(&self.manager)
    }

    /// From now on `/readyz` answers 503 (the process is about to stop: load balancers
    /// and endpoints take this replica out) while everything keeps serving.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The drain of the HAProxy certwatch runs: [`Drain::cut`] during
    /// [`Daemon::shutdown`] stops HAProxy at once instead of letting its connections
    /// finish.
    pub fn haproxy_drain(&self) -> Drain {
        self.haproxy_drain.clone()
    }

    /// Stops the watches, finishes the writes in progress, a pending reload and the
    /// HAProxy pass in progress, and stops the HTTP endpoint.
    pub async fn shutdown(self) {
        let Self {
            shutdown,
            pipeline,
            outputs,
            http,
            secure_metrics,
            progress,
            throttle_log,
            manager,
            access,
            pool,
            elector,
            ..
        } = self;
        // First: a leader hands the Lease over, so that another replica writes status
        // at once (a rolling restart) instead of after the lease duration.
        if let Some(elector) = elector {
            elector.release().await;
        }
        shutdown.cancel();
        // The route stream ends, so the pipeline returns and drops its outcome sender;
        // the outputs task then drains what is left and ends.
        if let Ok(Err(error)) = pipeline.await {
            tracing::error!(%error, "the route pipeline stopped");
        }
        let _ = outputs.await;
        if let Some(http) = http {
            let _ = http.await;
        }
        if let Some(secure) = secure_metrics {
            let _ = secure.task.await;
        }
        if let Some(progress) = progress {
            progress.abort();
            let _ = progress.await;
        }
        let _ = throttle_log.await;
        // The last handles on the secret watches: their tasks end and the pool closes
        // its connections once the last client clone is gone.
        drop(access);
        drop(manager);
        if tokio::time::timeout(CLOSE_PATIENCE, pool.closed())
            .await
            .is_err()
        {
            debug!("API connections still open after {CLOSE_PATIENCE:?}; stopping anyway");
        }
        debug!("daemon stopped");
    }
}

fn secret_counts(manager: &SecretManager) -> (usize, usize) {
    let counts = manager.watched_counts();
    (counts.watched, counts.synced)
}

fn refresher(
    metrics: &Arc<Metrics>,
    manager: &SecretManager,
    pool: &PoolHandle,
    limiter: &AdaptiveLimiter,
    status: Option<&StatusWriter>,
) -> http::Refresh {
    let (metrics, manager, pool, limiter, status) = (
        Arc::clone(metrics),
        manager.clone(),
        pool.clone(),
        limiter.clone(),
        status.cloned(),
    );
    Arc::new(move || {
        if let Some(status) = &status {
            metrics
                .status
                .set(status.stats(), status.leadership().is_leader());
        }
        metrics.limiter.set(&limiter.snapshot());
        let (watched, synced) = secret_counts(&manager);
        metrics.secrets.set_counts(watched, synced);
        metrics.secrets.set_registered_routes(manager.route_count());
        let stats = pool.stats();
        metrics
            .api
            .set_connections(stats.http2_connections_open, stats.http1_connections_open);
        metrics.process.refresh();
        // The age of the oldest unserved change grows between the controller's updates.
        metrics.haproxy.refresh();
    })
}

/// Says at which OpenSSL security level certwatch validates certificates and whether
/// the HAProxy they are for is known to run at it: the HAProxy certwatch starts does
/// (its `OPENSSL_CONF` says so); one run by others is assumed to.
fn log_assumed_security_level(options: &DaemonOptions) {
    let level = options.openssl_security_level;
    let managed = matches!(
        options.haproxy.as_ref().map(|haproxy| &haproxy.mode),
        Some(crate::haproxy::HaproxyMode::Managed(_))
    ) || options
        .routing
        .as_ref()
        .is_some_and(|routing| routing.haproxy_binary.is_some());
    if managed {
        info!(%level, "HAProxy runs at certwatch's OpenSSL security level");
    } else if options.haproxy.is_some() || options.routing.is_some() {
        info!(
            %level,
            "certwatch does not start HAProxy: it assumes HAProxy's OpenSSL security level is \
             this one (--openssl-security-level); a certificate HAProxy refuses at a stricter \
             level is counted as refused"
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The generated default certificate's expiry is read back as a Unix time, and the
    /// metric shows it.
    #[test]
    fn the_default_certificates_expiry_is_exported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("default.pem");
        ensure_default_certificate(&path).unwrap();
        let pem = std::fs::read(&path).unwrap();
        let block = pem::parse_many(&pem)
            .unwrap()
            .into_iter()
            .find(|block| block.tag() == "CERTIFICATE")
            .unwrap();
        let (_, certificate) = x509_parser::parse_x509_certificate(block.contents()).unwrap();
        let expected = certificate.validity().not_after.timestamp();
        assert_eq!(default_certificate_not_after(&path), Some(expected));

        let metrics = Metrics::new();
        metrics.register_routing();
        metrics.routing.default_certificate_expires(expected);
        assert!(
            metrics.encode().contains(&format!(
                "certwatch_default_certificate_expiration_timestamp_seconds {expected}\n"
            )),
            "{}",
            metrics.encode()
        );

        // A file without a certificate: nothing to export.
        std::fs::write(dir.path().join("key-only.pem"), b"not a certificate").unwrap();
        assert_eq!(
            default_certificate_not_after(&dir.path().join("key-only.pem")),
            None
        );
    }
}
