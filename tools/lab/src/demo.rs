//! `certwatch-lab demo`: the seed's scale, end to end, in well under a minute.
//!
//! Starts kube-sim in-process with 2,000 routes whose certificates live in 2,000
//! secrets over 20 namespaces, every API request taking about 1.4 s, and the router's
//! real RBAC (get/list/watch on exactly its secrets). Runs the daemon against it as
//! the router identity, shows the progress to ready, and compares the time with what
//! registering one secret at a time costs the reference at that latency (each
//! registration its latency rounded up to the next 100 ms poll, as the reference code
//! measured; the seed: 1,738 secrets took 40.9 minutes). Then rotates one certificate through the API and
//! shows the new one reach its file. With `haproxy` on `PATH`, the daemon also runs
//! HAProxy on the routes' configuration (`--haproxy-config-dir`), one route's service
//! gets a real backend (registered as its EndpointSlice), and the demo ends with an
//! HTTPS request through HAProxy to it: who answered, under which certificate.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use clap::Args;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube_sim::{GenerateSpec, LatencyConfig, SimConfig, Simulator};
use route_secrets::tls::Sha256Fingerprint;

use certwatch::daemon::{Daemon, DaemonError, DaemonOptions};
use certwatch::files;
use certwatch::logging::LogFormat;
use certwatch::progress::ProgressMode;

/// The seed's measurement: secrets and minutes of the reference router's start-up.
const SEED_SECRETS: usize = 1_738;
const SEED_MINUTES: f64 = 40.9;

fn duration_arg(text: &str) -> Result<Duration, String> {
    kube_common::duration::parse(text).map_err(|error| error.to_string())
}

/// Arguments of `certwatch-lab demo`.
#[derive(Debug, Clone, Args)]
#[command(
    about = "Run the daemon against an embedded simulated cluster at the seed's scale",
    long_about = "Start the embedded Kubernetes API simulator with 2,000 routes whose certificates \
live in secrets (the seed's scale) and ~1.4 s per API request, run certwatch to ready with a \
progress bar, compare the time with registering one secret at a time, rotate one certificate and \
show it reach its file. Everything runs in this process; nothing outside is touched except \
--cert-dir (a temporary directory by default; CERTWATCH_CERT_DIR, meant for `run`, is ignored)."
)]
pub struct DemoArgs {
    /// Routes (each with its own secret).
    #[arg(long, env = "CERTWATCH_DEMO_ROUTES", default_value_t = 2_000)]
    pub routes: usize,

    /// Namespaces the routes are spread over.
    #[arg(long, env = "CERTWATCH_DEMO_NAMESPACES", default_value_t = 20)]
    pub namespaces: usize,

    /// API latency per request.
    #[arg(long, env = "CERTWATCH_DEMO_LATENCY", value_name = "D", value_parser = duration_arg, default_value = "1.4s")]
    pub latency: Duration,

    /// Random deviation of the latency, uniform in [-D, +D].
    #[arg(long, env = "CERTWATCH_DEMO_JITTER", value_name = "D", value_parser = duration_arg, default_value = "100ms")]
    pub jitter: Duration,

    /// Where to write the bundles (default: a temporary directory, in /dev/shm when
    /// there is one, removed at the end). Only this flag moves them: the demo never
    /// reads `run`'s CERTWATCH_CERT_DIR, so it cannot overwrite a real cert directory.
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,

    /// Also serve /healthz, /readyz and /metrics on this address while the demo runs.
    #[arg(long, env = "CERTWATCH_DEMO_LISTEN", value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,

    /// Log format on stderr (level: RUST_LOG, default warn).
    #[arg(long, env = "CERTWATCH_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,

    /// Start-up progress: a bar on a terminal, log lines otherwise (auto).
    #[arg(long, env = "CERTWATCH_PROGRESS", value_enum, default_value_t)]
    pub progress: ProgressMode,
}

/// Why the demo failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The simulator failed.
    #[error("simulator: {0}")]
    Simulator(#[from] kube_sim::SimError),
    /// The daemon failed.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// The cert directory could not be created.
    #[error("cannot create a temporary cert directory: {0}")]
    TempDir(std::io::Error),
    /// Writing the rotated certificate failed.
    #[error("cannot rotate secret {namespace}/{secret}: {message}")]
    Rotate {
        /// Namespace of the secret.
        namespace: String,
        /// The secret.
        secret: String,
        /// What failed.
        message: String,
    },
    /// The rotated certificate did not reach its file in time.
    #[error("the rotated certificate did not reach {path} within {timeout:?}")]
    RotationNotSeen {
        /// The bundle.
        path: PathBuf,
        /// How long the demo waited.
        timeout: Duration,
    },
    /// There is nothing to demonstrate.
    #[error("--routes and --namespaces must be at least 1")]
    Empty,
    /// The request through HAProxy did not reach its backend.
    #[error("traffic through HAProxy: {0}")]
    Traffic(String),
}

/// `1234567` → `1,234,567`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn human(duration: Duration) -> String {
    let seconds = duration.as_secs_f64();
    if seconds >= 3600.0 {
        format!("{:.1} h", seconds / 3600.0)
    } else if seconds >= 60.0 {
        format!("{:.1} min", seconds / 60.0)
    } else {
        format!("{seconds:.1} s")
    }
}

fn short(fingerprint: Option<Sha256Fingerprint>) -> String {
    fingerprint.map_or_else(
        || "(none)".to_owned(),
        |fingerprint| {
            let text = fingerprint.to_string();
            format!("{}…", &text[..text.len().min(23)])
        },
    )
}

/// SHA-256 of the first certificate in the bundle at `path`.
fn file_fingerprint(path: &Path) -> Option<Sha256Fingerprint> {
    let text = std::fs::read_to_string(path).ok()?;
    files::first_certificate_der(&text).map(|der| Sha256Fingerprint::of(&der))
}

fn say(text: impl AsRef<str>) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", text.as_ref());
    let _ = stdout.flush();
}

/// Runs the demo.
pub async fn main(args: DemoArgs) -> Result<(), DemoError> {
    if args.routes == 0 || args.namespaces == 0 {
        return Err(DemoError::Empty);
    }
    say(format!(
        "certwatch demo: {} routes with external certificates in {} namespaces, {} ± {} per API request",
        thousands(args.routes),
        args.namespaces,
        human(args.latency),
        human(args.jitter),
    ));

    let simulator = Simulator::start(SimConfig {
        latency: LatencyConfig {
            default: args.latency,
            jitter: args.jitter,
            ..LatencyConfig::default()
        },
        ..SimConfig::default()
    })
    .await?;
    let generating = Instant::now();
    let cluster = simulator.generate(&GenerateSpec::new(args.routes, args.namespaces))?;
    say(format!(
        "  simulator: {} (in-process); generated {} routes, {} secrets, RBAC with resourceNames ({:.1} s)",
        simulator.url(),
        thousands(cluster.routes.len()),
        thousands(cluster.secrets),
        generating.elapsed().as_secs_f64()
    ));

    let (cert_dir, _temp) = match &args.cert_dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let temp =
                files::memory_backed_tempdir("certwatch-demo-").map_err(DemoError::TempDir)?;
            (temp.path().join("certs"), Some(temp))
        }
    };
    let mut options = DaemonOptions::new(&cert_dir);
    let serving = prepare_traffic(&simulator, &cluster, &mut options).await?;
    options.listen = args.listen;
    // The demo's endpoint is for the person running it (a loopback address).
    options.unauthenticated_metrics = true;
    options.progress = args.progress;
    options.identity = kube_sim::ROUTER_USER.to_owned();
    let config = simulator.client_config("router").await?;
    simulator.reset_stats();
    say(format!(
        "  daemon: router identity {}; cert dir {}",
        kube_sim::ROUTER_USER,
        cert_dir.display()
    ));
    let mut daemon = Daemon::start(config, options).await?;
    if let Some(addr) = daemon.http_addr() {
        say(format!("  endpoints: http://{addr}/readyz /metrics"));
    }
    let status = daemon.wait_ready().await?;
    daemon.progress_done().await;
    let ready_after = status.ready_after.unwrap_or_default();
    let stats = simulator.stats();
    let pool = daemon.pool_stats();
    let (watched, _) = daemon.secret_counts();

    say(format!(
        "ready in {}: {} routes admitted, {} rejected; {} secrets watched over {} HTTP/2 connection{}; {} API requests",
        human(ready_after),
        thousands(status.admitted),
        thousands(status.rejected),
        thousands(watched),
        pool.http2_connections_opened,
        if pool.http2_connections_opened == 1 {
            ""
        } else {
            "s"
        },
        thousands(stats.requests_total as usize),
    ));
    // The reference, as its code measured: one registration at a time, each its first
    // sync rounded up to WaitForCacheSync's next 100 ms poll.
    let serial = crate::bench::modelled_startup(cluster.secrets, args.latency);
    say(format!(
        "the reference, one secret at a time at this latency: {} × {} = {} (the seed measured {} secrets in {SEED_MINUTES} min); {:.0}× faster",
        thousands(cluster.secrets),
        human(crate::bench::registration_time(args.latency)),
        human(serial),
        thousands(SEED_SECRETS),
        serial.as_secs_f64() / ready_after.as_secs_f64().max(0.001),
    ));

    let mut result = rotate(&simulator, &daemon, &cluster).await;
    if let (Ok(rotated), Some(serving)) = (&result, &serving) {
        result = serve(serving, *rotated).await.map(|()| *rotated);
    }
    daemon.shutdown().await;
    simulator.shutdown().await;
    result.map(drop)
}

/// What the demo's HTTPS request needs.
struct Serving {
    https: std::net::SocketAddr,
    host: String,
    backend: crate::traffic::DemoBackend,
    _config: tempfile::TempDir,
}

/// The first file called `name` on `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// With `haproxy` on `PATH` and an address for a backend: a backend for the route the
/// demo rotates, registered as its service's endpoint, and the daemon told to run
/// HAProxy on the routes' configuration.
async fn prepare_traffic(
    simulator: &Simulator,
    cluster: &kube_sim::GeneratedCluster,
    options: &mut DaemonOptions,
) -> Result<Option<Serving>, DemoError> {
    let Some(haproxy) = on_path("haproxy") else {
        say("  (no haproxy on PATH: no traffic through HAProxy at the end)");
        return Ok(None);
    };
    let host = match testenv::netns::TestHost::shared() {
        Ok(host) => host,
        Err(error) => {
            say(format!(
                "  (no test host for a backend: {error}; no traffic through HAProxy at the end)"
            ));
            return Ok(None);
        }
    };
    let index = cluster.routes.len() / 2;
    let Some(route) = cluster.routes.get(index) else {
        return Ok(None);
    };
    let traffic = |message: String| DemoError::Traffic(message);
    let backend = crate::traffic::DemoBackend::start("demo-backend", host)
        .await
        .map_err(|error| traffic(error.to_string()))?;
    let admin = simulator.client("admin").await?;
    // The generated routes send to `svc-<index>`, target port `https`.
    crate::traffic::register(
        &admin,
        &route.namespace,
        &format!("svc-{index}"),
        "https",
        &backend,
    )
    .await
    .map_err(|error| traffic(error.to_string()))?;
    let config = tempfile::tempdir().map_err(DemoError::TempDir)?;
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|error| traffic(error.to_string()))
    };
    let (http, https) = (free()?, free()?);
    let dir = config.path().join("haproxy");
    let socket = dir.join("run").join("haproxy.sock");
    let mut render = certwatch::routing::RenderOptions::new(
        &dir,
        PathBuf::new(),
        dir.join("default.pem"),
        &socket,
    );
    render.http_bind = http.to_string();
    render.https_bind = https.to_string();
    // Within a login shell's descriptor limit.
    render.max_connections = 2_000;
    let mut routing = certwatch::routing::RoutingOptions::new(render);
    routing.haproxy_binary = Some(haproxy.clone());
    options.routing = Some(routing);
    options.haproxy = Some(certwatch::haproxy::HaproxyOptions::external(&socket));
    say(format!(
        "  haproxy: {} on {} (configuration in {}); route {}/{} → service svc-{index} → {} at {}",
        haproxy.display(),
        https,
        dir.display(),
        route.namespace,
        route.route,
        backend.name,
        backend.addr
    ));
    Ok(Some(Serving {
        https,
        host: route.host.clone(),
        backend,
        _config: config,
    }))
}

/// Sends an HTTPS request for the rotated route's host through HAProxy until the
/// backend answers under the rotated certificate, and says so.
async fn serve(serving: &Serving, rotated: Sha256Fingerprint) -> Result<(), DemoError> {
    let started = Instant::now();
    let timeout = Duration::from_secs(120);
    loop {
        let answer = crate::traffic::https_get(serving.https, &serving.host).await;
        if let Some(answer) = &answer
            && answer.status == 200
            && answer.certificate == Some(rotated)
        {
            say(format!(
                "HTTPS request https://{}/ through HAProxy ({}, SNI {}): {} from {} ({}): \"{}\", under certificate {} (the rotated one)",
                serving.host,
                serving.https,
                serving.host,
                answer.status,
                answer.backend.as_deref().unwrap_or("HAProxy itself"),
                serving.backend.addr,
                answer.body,
                short(answer.certificate),
            ));
            return Ok(());
        }
        if started.elapsed() > timeout {
            return Err(DemoError::Traffic(format!(
                "no answer from {} through HAProxy under the rotated certificate within {timeout:?} (last: {answer:?})",
                serving.backend.name
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes a new certificate into one route's secret and waits for its bundle to
/// change to it; returns the new certificate's fingerprint.
async fn rotate(
    simulator: &Simulator,
    daemon: &Daemon,
    cluster: &kube_sim::GeneratedCluster,
) -> Result<Sha256Fingerprint, DemoError> {
    let Some(route) = cluster.routes.get(cluster.routes.len() / 2) else {
        return Err(DemoError::Empty);
    };
    let failed = |message: String| DemoError::Rotate {
        namespace: route.namespace.clone(),
        secret: route.secret.clone(),
        message,
    };
    let route_key =
        route_secrets::route::RouteKey::new(route.namespace.as_str(), route.route.as_str());
    let names = files::bundle_names(&route_key).map_err(|error| failed(error.to_string()))?;
    let bundle = daemon.cert_dir().join(names.bundle);
    let before = file_fingerprint(&bundle);

    let key = rcgen::KeyPair::generate().map_err(|error| failed(error.to_string()))?;
    let mut params = rcgen::CertificateParams::new(vec![route.host.clone()])
        .map_err(|error| failed(error.to_string()))?;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(90);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, route.host.clone());
    let certificate = params
        .self_signed(&key)
        .map_err(|error| failed(error.to_string()))?;
    let expected = Sha256Fingerprint::of(certificate.der());

    let admin = simulator.client("admin").await?;
    let secrets: Api<Secret> = Api::namespaced(admin, &route.namespace);
    let b64 = base64::engine::general_purpose::STANDARD;
    let patch = serde_json::json!({
        "data": {
            "tls.crt": b64.encode(certificate.pem()),
            "tls.key": b64.encode(key.serialize_pem()),
        }
    });
    say(format!(
        "rotating secret {}/{} (route {}): writing a new certificate through the API",
        route.namespace, route.secret, route.route
    ));
    let started = Instant::now();
    secrets
        .patch(
            &route.secret,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|error| failed(error.to_string()))?;

    let timeout = Duration::from_secs(60);
    loop {
        let now = file_fingerprint(&bundle);
        if now == Some(expected) {
            say(format!(
                "  {}: {} → {} after {} (matches the new certificate)",
                bundle.display(),
                short(before),
                short(now),
                human(started.elapsed())
            ));
            return Ok(expected);
        }
        if started.elapsed() > timeout {
            return Err(DemoError::RotationNotSeen {
                path: bundle,
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(2000), "2,000");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(human(Duration::from_secs_f64(2800.0)), "46.7 min");
        assert_eq!(human(Duration::from_millis(1400)), "1.4 s");
    }
}
