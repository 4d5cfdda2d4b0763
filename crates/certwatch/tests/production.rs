//! Production traffic, through the binary with the HAProxy it runs
//! (`--haproxy-config-dir`) against the simulator, with real clients:
//!
//! - the cluster's TLS policy (`--tls-profile`, `--tls-ciphers`, `--tls-ciphersuites`,
//!   `--tls-min-version`) on HAProxy's TLS listener and on certwatch's own metrics
//!   endpoint, asked with `openssl s_client`; bad values refused at start;
//! - safe defaults: no `/metrics` without authentication unless asked, HAProxy's
//!   threads and `hard-stop-after`;
//! - shutdown: SIGTERM fails readiness at once while HAProxy keeps serving for
//!   `--shutdown-delay`, a second signal stops at once, and a rolling restart of two
//!   replicas behind a load balancer that health-checks `/readyz` fails no request.
//!
//! Traffic goes to loopback addresses and to a backend inside a network namespace
//! the test creates (EndpointSlices refuse loopback addresses).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::haproxy::{first_certificate, info_field, leaf_of, runtime_api, s_client};
use common::routing::RoutingLaunch;
use common::traffic::https_get;
use common::{
    Certwatch, Launch, PATIENCE, SimProcess, create_route_spec, create_tls_secret, eventually,
    eventually_async, free_port, grant_secret, run_to_exit,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};

const NS: &str = "app-0";

/// An edge route `name` for `host` to Service `web`, its secret created and granted.
async fn edge_route(admin: &kube::Client, name: &str, host: &str) {
    let secret = format!("{name}-tls");
    create_tls_secret(admin, NS, &secret, host).await;
    grant_secret(admin, NS, &secret).await;
    create_route_spec(
        admin,
        NS,
        name,
        serde_json::json!({
            "host": host,
            "to": {"kind": "Service", "name": "web"},
            "tls": {"termination": "edge", "externalCertificate": {"name": secret}},
        }),
    )
    .await;
}

/// The simulator with the edge route `policy` for `policy.example`.
async fn policy_route(dir: &Path) -> (SimProcess, kube::Client) {
    let sim = SimProcess::start(dir, &["--generate", "routes=1,namespaces=1"]);
    let admin = sim.client("admin").await;
    edge_route(&admin, "policy", "policy.example").await;
    (sim, admin)
}

/// A TLS handshake by `openssl s_client` with `args` to `127.0.0.1:port`: the leaf
/// certificate presented, `None` when the handshake is refused.
fn handshake(port: u16, sni: &str, args: &[&str]) -> Option<Vec<u8>> {
    handshake_at("127.0.0.1", port, sni, args)
}

/// [`handshake`] to `host` (`127.0.0.1`, `[::1]`).
fn handshake_at(host: &str, port: u16, sni: &str, args: &[&str]) -> Option<Vec<u8>> {
    let output = s_client(host, port, sni, args);
    if !output.status.success() {
        return None;
    }
    first_certificate(&output.stdout)
}

const TLS13: &[&str] = &["-tls1_3"];
const AEAD_TLS12: &[&str] = &[
    "-tls1_2",
    "-cipher",
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305",
];
const CBC_TLS12: &[&str] = &[
    "-tls1_2",
    "-cipher",
    "ECDHE-ECDSA-AES128-SHA:ECDHE-RSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA384:ECDHE-RSA-AES128-SHA256:AES128-SHA:AES256-SHA256",
];

/// A certwatch running HAProxy on its configuration, with its ports.
struct Router {
    certwatch: Certwatch,
    https: u16,
    config_dir: PathBuf,
}

/// Starts certwatch with HAProxy on free loopback ports (its directories under
/// `dir/name`), with `args`, and waits until it is ready.
async fn router(dir: &Path, sim: &SimProcess, name: &str, launch: &[&str]) -> Router {
    router_on(dir, sim, name, free_port(), free_port(), launch, |l| l).await
}

async fn router_on(
    dir: &Path,
    sim: &SimProcess,
    name: &str,
    https: u16,
    probes: u16,
    args: &[&str],
    adjust: impl FnOnce(Launch) -> Launch,
) -> Router {
    let root = dir.join(name);
    std::fs::create_dir_all(&root).unwrap();
    let routing = RoutingLaunch::on(sim, &root)
        .log(&root.join("log"))
        .https_port(https)
        .min_reload_interval("1s")
        .args(args)
        .adjust(|launch| adjust(launch.listen(&format!("127.0.0.1:{probes}"))))
        .ready()
        .await;
    Router {
        certwatch: routing.certwatch,
        https,
        config_dir: routing.config_dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_policy_refuses_cbc_and_takes_tls13_and_aead_tls12_on_every_listener() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, admin) = policy_route(dir.path()).await;
    let default = router(
        dir.path(),
        &sim,
        "default",
        &["--metrics-listen", "127.0.0.1:0"],
    )
    .await;
    let leaf = leaf_of(&admin, NS, "policy-tls").await;
    let https = default.https;
    let sni = "policy.example";

    assert_eq!(
        handshake(https, sni, TLS13).as_ref(),
        Some(&leaf),
        "TLS 1.3"
    );
    assert_eq!(
        handshake(https, sni, AEAD_TLS12).as_ref(),
        Some(&leaf),
        "TLS 1.2 with an AEAD suite"
    );
    assert_eq!(
        handshake(https, sni, CBC_TLS12),
        None,
        "TLS 1.2 with CBC suites"
    );
    assert_eq!(
        handshake(https, sni, &["-tls1_1", "-cipher", "ALL:@SECLEVEL=0"]),
        None,
        "TLS 1.1"
    );

    // certwatch's own TLS listener, under the same policy.
    let metrics = default.certwatch.metrics_addr.unwrap().port();
    assert!(handshake(metrics, "localhost", TLS13).is_some());
    assert!(handshake(metrics, "localhost", AEAD_TLS12).is_some());
    assert_eq!(handshake(metrics, "localhost", CBC_TLS12), None);

    // The same client's CBC handshake succeeds where the policy allows it: the
    // refusal above is the policy's.
    let old = router(dir.path(), &sim, "old", &["--tls-profile", "old"]).await;
    assert_eq!(
        handshake(old.https, sni, CBC_TLS12).as_ref(),
        Some(&leaf),
        "CBC under the old profile"
    );
    let config = std::fs::read_to_string(default.config_dir.join("haproxy.cfg")).unwrap();
    assert!(
        config.contains(
            "ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256\n"
        ),
        "{config}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_modern_profile_and_a_custom_policy_refuse_what_they_leave_out() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, admin) = policy_route(dir.path()).await;
    let leaf = leaf_of(&admin, NS, "policy-tls").await;
    let sni = "policy.example";

    let modern = router(
        dir.path(),
        &sim,
        "modern",
        &["--tls-profile", "modern", "--metrics-listen", "127.0.0.1:0"],
    )
    .await;
    assert_eq!(handshake(modern.https, sni, TLS13).as_ref(), Some(&leaf));
    assert_eq!(handshake(modern.https, sni, AEAD_TLS12), None);
    let metrics = modern.certwatch.metrics_addr.unwrap().port();
    assert!(handshake(metrics, "localhost", TLS13).is_some());
    assert_eq!(handshake(metrics, "localhost", AEAD_TLS12), None);

    // One TLS 1.2 suite and one TLS 1.3 suite, from the variables.
    let custom = router_on(
        dir.path(),
        &sim,
        "custom",
        free_port(),
        free_port(),
        &[],
        |launch| {
            launch
                .env("CERTWATCH_TLS_CIPHERS", "ECDHE-ECDSA-AES256-GCM-SHA384")
                .env("CERTWATCH_TLS_CIPHERSUITES", "TLS_AES_256_GCM_SHA384")
        },
    )
    .await;
    let https = custom.https;
    let tls12 = |cipher: &str| handshake(https, sni, &["-tls1_2", "-cipher", cipher]);
    assert_eq!(tls12("ECDHE-ECDSA-AES256-GCM-SHA384").as_ref(), Some(&leaf));
    assert_eq!(tls12("ECDHE-ECDSA-AES128-GCM-SHA256"), None);
    let tls13 = |suite: &str| handshake(https, sni, &["-tls1_3", "-ciphersuites", suite]);
    assert_eq!(tls13("TLS_AES_256_GCM_SHA384").as_ref(), Some(&leaf));
    assert_eq!(tls13("TLS_AES_128_GCM_SHA256"), None);
}

/// `certwatch run` with `args` and `env`, expected to be refused: its status and
/// standard error.
fn refused(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let cert_dir = tempfile::tempdir().unwrap();
    let mut command = vec!["run", "--cert-dir", cert_dir.path().to_str().unwrap()];
    command.extend_from_slice(args);
    let output = run_to_exit(&command, env);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{args:?} was accepted: {stderr}");
    (output.status.code().unwrap_or(-1), stderr)
}

#[test]
fn bad_tls_and_shutdown_settings_are_refused_at_start_naming_the_flag_and_the_fix() {
    let (code, stderr) = refused(&["--tls-profile", "strict"], &[]);
    assert_eq!(code, 2, "{stderr}");
    for needle in ["--tls-profile", "old", "intermediate", "modern"] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
    let (_, stderr) = refused(&[], &[("CERTWATCH_TLS_PROFILE", "Intermediate2")]);
    assert!(stderr.contains("--tls-profile"), "{stderr}");
    let (code, stderr) = refused(&["--tls-min-version", "TLSv1.4"], &[]);
    assert_eq!(code, 2, "{stderr}");
    for needle in ["--tls-min-version", "TLSv1.2", "TLSv1.3"] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
    let (_, stderr) = refused(&["--tls-ciphersuites", "TLS_AES_128_CBC_SHA"], &[]);
    assert!(
        stderr.contains("--tls-ciphersuites") && stderr.contains("TLS_AES_256_GCM_SHA384"),
        "{stderr}"
    );
    // A line break would write a directive of its own into HAProxy's configuration.
    let (_, stderr) = refused(&["--tls-ciphers", "AES128-SHA\n  stats socket /tmp/x"], &[]);
    assert!(stderr.contains("--tls-ciphers"), "{stderr}");

    // A cipher list HAProxy refuses (no cipher OpenSSL knows), checked with
    // `haproxy -c` before anything starts.
    let config_dir = tempfile::tempdir().unwrap();
    let (_, stderr) = refused(
        &[
            "--haproxy-config-dir",
            config_dir.path().to_str().unwrap(),
            "--tls-ciphers",
            "NO-SUCH-CIPHER:ALSO-NOT-ONE",
        ],
        &[],
    );
    for needle in ["HAProxy refuses", "--tls-ciphers", "NO-SUCH-CIPHER"] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }

    let (_, stderr) = refused(
        &[
            "--shutdown-delay",
            "2m",
            "--termination-grace-period",
            "90s",
        ],
        &[],
    );
    for needle in ["--shutdown-delay", "--termination-grace-period"] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_no_metrics_are_served_unauthenticated_and_haproxy_runs_a_thread_per_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, _) = policy_route(dir.path()).await;

    let default = router_on(
        dir.path(),
        &sim,
        "default",
        free_port(),
        free_port(),
        &[],
        // One CPU: HAProxy gets one thread, not the router's four (that cap is the
        // unit test's `haproxy_runs_the_router_s_four_threads_or_one_per_cpu_when_fewer`).
        |launch| {
            launch
                .env("CERTWATCH_METRICS_UNAUTHENTICATED", "false")
                .cpus("0")
        },
    )
    .await;
    let certwatch = &default.certwatch;
    assert_eq!(certwatch.get("/healthz").0, 200);
    assert_eq!(certwatch.get("/readyz").0, 200);
    let (status, _) = certwatch.get("/metrics");
    assert_eq!(status, 404, "/metrics without authentication");
    assert!(!certwatch.log_text().contains("WITHOUT authentication"));

    let socket = default.config_dir.join("run").join("haproxy.sock");
    assert_eq!(info_field(&socket, "Nbthread"), 1);
    let config = std::fs::read_to_string(default.config_dir.join("haproxy.cfg")).unwrap();
    assert!(config.contains("  hard-stop-after 3600000ms\n"), "{config}");

    // Asked for, and said so; HAProxy's own health endpoint for a liveness probe.
    let health = format!("127.0.0.1:{}", free_port());
    let explicit = router(
        dir.path(),
        &sim,
        "explicit",
        &[
            "--metrics-unauthenticated",
            "--haproxy-threads",
            "2",
            "--haproxy-hard-stop-after",
            "90s",
            "--haproxy-health-bind",
            &health,
        ],
    )
    .await;
    let (status, _) = common::http_request(health.parse().unwrap(), "GET", "/healthz", "");
    assert_eq!(status, 200, "HAProxy's /healthz");
    assert_eq!(explicit.certwatch.get("/metrics").0, 200);
    assert!(
        explicit
            .certwatch
            .log_text()
            .contains("serving /metrics WITHOUT authentication")
    );
    let socket = explicit.config_dir.join("run").join("haproxy.sock");
    assert_eq!(info_field(&socket, "Nbthread"), 2);
    let config = std::fs::read_to_string(explicit.config_dir.join("haproxy.cfg")).unwrap();
    assert!(config.contains("  hard-stop-after 90000ms\n"), "{config}");
}

/// Waits for `child`'s exit, for at most [`PATIENCE`].
async fn exit_of(certwatch: &mut Certwatch) -> std::process::ExitStatus {
    eventually("certwatch's exit", || certwatch.exited()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_fails_readiness_at_once_serves_on_and_a_second_signal_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, admin) = policy_route(dir.path()).await;
    let leaf = leaf_of(&admin, NS, "policy-tls").await;
    // A delay no test waits out: what happens during it, and the second signal.
    let mut router = router(dir.path(), &sim, "r", &["--shutdown-delay", "1h"]).await;
    assert_eq!(
        handshake(router.https, "policy.example", TLS13).as_ref(),
        Some(&leaf)
    );

    router.certwatch.signal("TERM");
    let body = eventually("/readyz 503 after SIGTERM", || {
        let (status, body) = router.certwatch.get("/readyz");
        (status == 503).then_some(body)
    })
    .await;
    assert!(body.contains("stopping"), "{body}");
    // Still serving: the process, its probes, HAProxy's TLS listener.
    assert_eq!(router.certwatch.exited(), None);
    assert_eq!(router.certwatch.get("/healthz").0, 200);
    for _ in 0..5 {
        assert_eq!(
            handshake(router.https, "policy.example", TLS13).as_ref(),
            Some(&leaf)
        );
    }
    assert!(
        router
            .certwatch
            .log_text()
            .contains("stopping after the shutdown delay")
    );

    router.certwatch.signal("INT");
    let status = exit_of(&mut router.certwatch).await;
    assert!(status.success(), "{status}");
    assert!(router.certwatch.log_text().contains("second signal"));
    // HAProxy went with it.
    eventually("HAProxy's listener closed", || {
        std::net::TcpStream::connect(("127.0.0.1", router.https))
            .is_err()
            .then_some(())
    })
    .await;
}

/// A network namespace with a veth pair to this one: 198.18.N.1 here, 198.18.N.2
/// inside (RFC 2544's benchmarking range), removed when dropped.
struct NetNs {
    name: String,
    inside: std::net::Ipv4Addr,
}

fn ip(args: &[&str]) {
    let output = Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2)");
    assert!(
        output.status.success(),
        "ip {args:?}: {} (the test makes a network namespace: it runs as root)",
        String::from_utf8_lossy(&output.stderr)
    );
}

impl NetNs {
    fn new() -> Self {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let k = MADE.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let n = (pid as usize * 4 + k) % 250 + 1;
        let name = format!("cw-prod-{pid}-{k}");
        let (outer, inner) = (format!("cwp{pid}h{k}"), format!("cwp{pid}n{k}"));
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let ns = Self {
            name: name.clone(),
            inside: std::net::Ipv4Addr::new(198, 18, n as u8, 2),
        };
        ip(&[
            "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &name,
        ]);
        ip(&["addr", "add", &format!("198.18.{n}.1/30"), "dev", &outer]);
        ip(&["link", "set", &outer, "up"]);
        let inside = format!("198.18.{n}.2/30");
        for args in [
            vec!["addr", "add", inside.as_str(), "dev", inner.as_str()],
            vec!["link", "set", inner.as_str(), "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut all = vec!["netns", "exec", name.as_str(), "ip"];
            all.extend(args);
            ip(&all);
        }
        ns
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Removing the namespace removes the veth pair with it.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A HAProxy run for the test (`-db`), killed when dropped.
struct Haproxy(Child);

impl Haproxy {
    fn start(config: &Path, netns: Option<&str>) -> Self {
        let mut command = match netns {
            Some(ns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", ns, "haproxy"]);
                command
            }
            None => Command::new("haproxy"),
        };
        let child = command
            .arg("-db")
            .arg("-f")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(config.with_extension("log")).unwrap())
            .spawn()
            .unwrap();
        Self(child)
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A HAProxy inside `netns` answering every request on `addr` with 200 and
/// `x-backend: <answer>` (a log-format expression).
fn backend_in(netns: &NetNs, dir: &Path, addr: SocketAddr, answer: &str) -> Haproxy {
    let config = dir.join("backend.cfg");
    std::fs::write(
        &config,
        format!(
            "global\n  maxconn 2000\ndefaults\n  mode http\n  timeout connect 5s\n  \
             timeout client 30s\n  timeout server 30s\nfrontend web\n  bind {addr}\n  \
             http-request return status 200 content-type text/plain string web hdr x-backend \"{answer}\"\n"
        ),
    )
    .unwrap();
    Haproxy::start(&config, Some(&netns.name))
}

/// Service `web` with one ready endpoint, `addr`.
async fn web_service(admin: &kube::Client, addr: SocketAddr) {
    let service: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": NS,
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": addr.port(), "protocol": "TCP"}],
        "endpoints": [{"addresses": [addr.ip().to_string()], "conditions": {"ready": true}}],
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(admin.clone(), NS)
        .patch(
            "web-1",
            &PatchParams::apply("certwatch-test").force(),
            &Patch::Apply(&slice),
        )
        .await
        .unwrap();
}

/// A backend in a network namespace of its own (its answers' `x-backend` is `answer`,
/// a log-format expression), Service `web` on it, and the simulator with the edge route
/// `name` for `host` to it.
struct Web {
    sim: SimProcess,
    admin: kube::Client,
    _backend: Haproxy,
    _netns: NetNs,
}

async fn web_behind_edge_route(dir: &Path, answer: &str, name: &str, host: &str) -> Web {
    let netns = NetNs::new();
    let backend_addr = SocketAddr::from((netns.inside, 8080));
    let backend = backend_in(&netns, dir, backend_addr, answer);
    let sim = SimProcess::start(dir, &["--generate", "routes=1,namespaces=1"]);
    let admin = sim.client("admin").await;
    web_service(&admin, backend_addr).await;
    edge_route(&admin, name, host).await;
    Web {
        sim,
        admin,
        _backend: backend,
        _netns: netns,
    }
}

/// The plain route `plain` for `plain.example` to Service `web`.
async fn plain_route(admin: &kube::Client) {
    create_route_spec(
        admin,
        NS,
        "plain",
        serde_json::json!({"host": "plain.example", "to": {"kind": "Service", "name": "web"}}),
    )
    .await;
}

/// Requests sent and failed, by phase of the rollout.
#[derive(Default)]
struct Tally {
    ok: [AtomicUsize; 3],
    failed: [AtomicUsize; 3],
    failures: std::sync::Mutex<Vec<String>>,
}

/// Which servers of the balancer's backend it has up.
fn balancer_up(socket: &Path) -> Vec<String> {
    runtime_api(socket, "show stat")
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            (fields.len() > 17
                && fields[0] == "replicas"
                && fields[1] != "BACKEND"
                && fields[17] == "UP")
                .then(|| fields[1].to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_behind_a_load_balancer_checking_readyz_fails_no_request() {
    let dir = tempfile::tempdir().unwrap();
    // The route's backend, inside a network namespace.
    let web = web_behind_edge_route(dir.path(), "web", "rollout", "rollout.example").await;
    let sim = &web.sim;

    // Two replicas, each on fixed ports that its replacement takes over (a node's
    // host ports, say), and a balancer in TCP mode that checks their /readyz and, as a
    // cloud load balancer, does not retry a connection a replica refuses.
    let slots: Vec<(u16, u16)> = (0..2).map(|_| (free_port(), free_port())).collect();
    let delay = ["--shutdown-delay", "3s"];
    let mut replicas = Vec::new();
    for (n, (https, probes)) in slots.iter().enumerate() {
        let name = format!("replica-{n}-0");
        replicas.push(Some(
            router_on(dir.path(), sim, &name, *https, *probes, &[], |launch| {
                launch.args(&delay)
            })
            .await,
        ));
    }
    let balancer_port = free_port();
    let balancer_socket = dir.path().join("balancer.sock");
    let mut balancer_config = format!(
        "global\n  maxconn 2000\n  stats socket {} level admin\ndefaults\n  mode tcp\n  \
         timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n  timeout check 2s\n  \
         retries 0\n\
         frontend lb\n  bind 127.0.0.1:{balancer_port}\n  default_backend replicas\n\
         backend replicas\n  option httpchk GET /readyz\n",
        balancer_socket.display()
    );
    for (n, (https, probes)) in slots.iter().enumerate() {
        balancer_config.push_str(&format!(
            "  server r{n} 127.0.0.1:{https} check port {probes} inter 500ms fall 1 rise 1\n"
        ));
    }
    let balancer_cfg = dir.path().join("balancer.cfg");
    std::fs::write(&balancer_cfg, balancer_config).unwrap();
    let _balancer = Haproxy::start(&balancer_cfg, None);
    eventually("both replicas up at the balancer", || {
        (balancer_socket.exists() && balancer_up(&balancer_socket).len() == 2).then_some(())
    })
    .await;
    let lb = SocketAddr::from(([127, 0, 0, 1], balancer_port));
    eventually_async("the route served through the balancer", || async {
        https_get(lb, "rollout.example", "/", false)
            .await
            .filter(|response| response.backend.as_deref() == Some("web"))
    })
    .await;

    // The client: one request after another, each on a new connection, until the
    // rollout is done (at most a bound, so that it cannot run away).
    let tally = Arc::new(Tally::default());
    let phase = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let client = {
        let (tally, phase, done) = (Arc::clone(&tally), Arc::clone(&phase), Arc::clone(&done));
        tokio::spawn(async move {
            for _ in 0..200_000 {
                if done.load(Ordering::SeqCst) {
                    break;
                }
                let at = phase.load(Ordering::SeqCst);
                let response = https_get(lb, "rollout.example", "/", false).await;
                match response {
                    Some(response)
                        if response.status == 200 && response.backend.as_deref() == Some("web") =>
                    {
                        tally.ok[at].fetch_add(1, Ordering::SeqCst);
                    }
                    other => {
                        tally.failed[at].fetch_add(1, Ordering::SeqCst);
                        tally
                            .failures
                            .lock()
                            .unwrap()
                            .push(format!("phase {at}: {other:?}"));
                    }
                }
            }
        })
    };
    eventually("requests before the rollout", || {
        (tally.ok[0].load(Ordering::SeqCst) >= 20).then_some(())
    })
    .await;

    // Each replica in turn: SIGTERM, its exit, its replacement ready and taken back by
    // the balancer (what minReadySeconds and the readiness gate do in a Deployment).
    for (n, (https, probes)) in slots.iter().enumerate() {
        phase.store(n + 1, Ordering::SeqCst);
        let mut old = replicas[n].take().unwrap();
        old.certwatch.signal("TERM");
        let status = exit_of(&mut old.certwatch).await;
        assert!(status.success(), "replica {n}: {status}");
        drop(old);
        let name = format!("replica-{n}-1");
        replicas[n] = Some(
            router_on(dir.path(), sim, &name, *https, *probes, &[], |launch| {
                launch.args(&delay)
            })
            .await,
        );
        eventually("the replacement up at the balancer", || {
            (balancer_up(&balancer_socket).len() == 2).then_some(())
        })
        .await;
        let before = tally.ok[n + 1].load(Ordering::SeqCst);
        eventually("requests after the replacement", || {
            (tally.ok[n + 1].load(Ordering::SeqCst) >= before + 20).then_some(())
        })
        .await;
    }
    done.store(true, Ordering::SeqCst);
    tokio::time::timeout(PATIENCE, client)
        .await
        .unwrap()
        .unwrap();

    let ok: Vec<usize> = tally.ok.iter().map(|n| n.load(Ordering::SeqCst)).collect();
    let failed: usize = tally.failed.iter().map(|n| n.load(Ordering::SeqCst)).sum();
    println!(
        "rolling restart: {} requests, {failed} failed (ok by phase {ok:?})",
        ok.iter().sum::<usize>() + failed
    );
    assert_eq!(
        failed,
        0,
        "failed requests: {:?}",
        tally.failures.lock().unwrap()
    );
    assert!(ok.iter().all(|n| *n >= 20), "{ok:?}");
}

/// The sidecar's script, as a process; SIGINT stops it at once when dropped.
struct Sidecar {
    child: Child,
    stderr: PathBuf,
}

impl Sidecar {
    fn start(dir: &Path, name: &str, script: &str, env: &[(String, String)], delay: &str) -> Self {
        let stderr = dir.join(format!("{name}.stderr"));
        // SIGINT at its default: a shell cannot trap a signal ignored when it starts,
        // as it is for the tests when they run in a background job.
        let child = Command::new("env")
            .args(["--default-signal=INT", "sh", "-c"])
            .arg(script)
            .envs(env.iter().map(|(name, value)| (name, value)))
            .env("SHUTDOWN_DELAY", delay)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Self { child, stderr }
    }

    fn signal(&self, signal: &str) {
        common::send_signal(self.child.id(), signal);
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-INT")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// The Deployment's sidecar: the kubelet's SIGTERM does not stop HAProxy at once; it
/// serves on for the delay (here longer than the test), and a second SIGTERM stops it;
/// with a short delay it stops by itself, softly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_serves_through_the_shutdown_delay_and_then_stops_softly() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, admin) = policy_route(dir.path()).await;
    let leaf = leaf_of(&admin, NS, "policy-tls").await;
    let config_dir = dir.path().join("run-haproxy");
    let cert_dir = dir.path().join("certs");
    std::fs::create_dir_all(&config_dir).unwrap();
    let https = free_port();
    let (script, env) = common::haproxy::sidecar_of_the_deployment(&config_dir, &cert_dir);
    let sidecar = Sidecar::start(dir.path(), "haproxy", &script, &env, "3600");
    let certwatch = Certwatch::launch(
        Launch::new(
            &sim.kubeconfig,
            &cert_dir,
            &dir.path().join("certwatch.log"),
        )
        .env("CERTWATCH_HAPROXY_CONFIG_DIR", config_dir.to_str().unwrap())
        .env("CERTWATCH_RUN_HAPROXY", "false")
        .env(
            "CERTWATCH_HAPROXY_MASTER_SOCKET",
            config_dir.join("master.sock").to_str().unwrap(),
        )
        .env("CERTWATCH_HTTP_BIND", &format!("127.0.0.1:{}", free_port()))
        .env("CERTWATCH_HTTPS_BIND", &format!("127.0.0.1:{https}"))
        .args(&["--haproxy-max-connections", "2000"]),
    );
    certwatch.wait_ready().await;
    assert_eq!(
        handshake(https, "policy.example", TLS13).as_ref(),
        Some(&leaf)
    );

    sidecar.signal("TERM");
    eventually("the sidecar took SIGTERM", || {
        sidecar
            .stderr()
            .contains("SIGTERM: HAProxy serves")
            .then_some(())
    })
    .await;
    for _ in 0..5 {
        assert_eq!(
            handshake(https, "policy.example", TLS13).as_ref(),
            Some(&leaf)
        );
    }
    let mut sidecar = sidecar;
    assert_eq!(sidecar.child.try_wait().unwrap(), None);
    sidecar.signal("TERM");
    eventually("the sidecar's exit on a second SIGTERM", || {
        sidecar.child.try_wait().unwrap()
    })
    .await;
    eventually("HAProxy's listener closed", || {
        std::net::TcpStream::connect(("127.0.0.1", https))
            .is_err()
            .then_some(())
    })
    .await;

    // Started again (the container restarted) with a short delay: it stops by itself
    // after it, softly (status 0).
    let mut again = Sidecar::start(dir.path(), "haproxy-2", &script, &env, "1");
    eventually_async("HAProxy serving again", || async {
        handshake(https, "policy.example", TLS13)
    })
    .await;
    again.signal("TERM");
    let status = eventually("the sidecar's exit after the delay", || {
        again.child.try_wait().unwrap()
    })
    .await;
    assert!(status.success(), "{status}: {}", again.stderr());
    assert!(
        again
            .stderr()
            .contains("SIGTERM: HAProxy serves for 1s more")
    );
}

/// `:PORT` listens on IPv6 and IPv4 (this host has IPv6: `::1` at least), for
/// certwatch's endpoint and HAProxy's TLS listener; an explicit address on that
/// address only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_alone_listens_on_both_families_and_an_address_on_that_one_only() {
    assert!(
        std::net::TcpListener::bind("[::1]:0").is_ok(),
        "the test needs IPv6 on loopback"
    );
    let dir = tempfile::tempdir().unwrap();
    let (sim, admin) = policy_route(dir.path()).await;
    let leaf = leaf_of(&admin, NS, "policy-tls").await;
    let sni = "policy.example";
    let start = |name: &str, listen: String, https: String, health: String| {
        let root = dir.path().join(name);
        std::fs::create_dir_all(&root).unwrap();
        let config_dir = root.join("haproxy");
        Certwatch::launch(
            Launch::new(&sim.kubeconfig, &root.join("certs"), &root.join("log"))
                .listen(&listen)
                .env("CERTWATCH_HAPROXY_CONFIG_DIR", config_dir.to_str().unwrap())
                .env("CERTWATCH_HTTP_BIND", &format!("127.0.0.1:{}", free_port()))
                .env("CERTWATCH_HTTPS_BIND", &https)
                .env("CERTWATCH_HAPROXY_HEALTH_BIND", &health)
                .args(&["--haproxy-max-connections", "2000"]),
        )
    };
    let get =
        |addr: &str, path: &str| common::http_request(addr.parse().unwrap(), "GET", path, "").0;

    let (probes, https, health) = (free_port(), free_port(), free_port());
    let both = start(
        "both",
        format!(":{probes}"),
        format!(":{https}"),
        format!(":{health}"),
    );
    both.wait_ready().await;
    for host in ["127.0.0.1", "[::1]"] {
        assert_eq!(get(&format!("{host}:{probes}"), "/readyz"), 200, "{host}");
        assert_eq!(get(&format!("{host}:{health}"), "/healthz"), 200, "{host}");
        assert_eq!(
            handshake_at(host, https, sni, TLS13).as_ref(),
            Some(&leaf),
            "{host}"
        );
    }

    let (probes, https, health) = (free_port(), free_port(), free_port());
    let v4 = start(
        "v4",
        format!("127.0.0.1:{probes}"),
        format!("127.0.0.1:{https}"),
        format!("127.0.0.1:{health}"),
    );
    v4.wait_ready().await;
    assert_eq!(get(&format!("127.0.0.1:{probes}"), "/readyz"), 200);
    assert_eq!(
        get(&format!("[::1]:{probes}"), "/readyz"),
        0,
        "nothing on ::1"
    );
    assert_eq!(
        get(&format!("[::1]:{health}"), "/healthz"),
        0,
        "nothing on ::1"
    );
    assert_eq!(handshake_at("[::1]", https, sni, TLS13), None);
    assert_eq!(handshake(https, sni, TLS13).as_ref(), Some(&leaf));

    let (probes, https) = (free_port(), free_port());
    let v6 = start(
        "v6",
        format!("[::1]:{probes}"),
        format!("[::1]:{https}"),
        format!("[::1]:{}", free_port()),
    );
    v6.wait_ready().await;
    assert_eq!(get(&format!("[::1]:{probes}"), "/readyz"), 200);
    assert_eq!(
        get(&format!("127.0.0.1:{probes}"), "/readyz"),
        0,
        "nothing on 127.0.0.1"
    );
    assert_eq!(
        handshake_at("[::1]", https, sni, TLS13).as_ref(),
        Some(&leaf)
    );
    assert_eq!(handshake(https, sni, TLS13), None);
}

/// `--proxy-protocol`: the client's address from the PROXY header (v1 on the plain
/// listener, v2 from a balancer in front of the TLS one) reaches the backend in
/// `X-Forwarded-For` and `Forwarded`; a connection without the header gets no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_protocol_brings_the_clients_address_and_nothing_passes_without_it() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let web = web_behind_edge_route(
        dir.path(),
        "%[req.hdr(x-forwarded-for)]|%[req.hdr(forwarded)]",
        "secure",
        "secure.example",
    )
    .await;
    plain_route(&web.admin).await;
    let router = router(dir.path(), &web.sim, "proxied", &["--proxy-protocol"]).await;
    let config = std::fs::read_to_string(router.config_dir.join("haproxy.cfg")).unwrap();
    let http_port: u16 = config
        .split_once("frontend public\n  bind 127.0.0.1:")
        .and_then(|(_, rest)| rest.split_once(" accept-proxy\n"))
        .map(|(port, _)| port.parse().unwrap())
        .unwrap_or_else(|| panic!("no accept-proxy on the plain listener:\n{config}"));
    assert!(
        config.contains(&format!("bind 127.0.0.1:{} accept-proxy\n", router.https)),
        "{config}"
    );

    // Plain HTTP with a PROXY v1 header naming another client.
    let http = SocketAddr::from(([127, 0, 0, 1], http_port));
    let answer = eventually_async("the plain route through the PROXY protocol", || async {
        let mut stream = tokio::net::TcpStream::connect(http).await.ok()?;
        let request = format!(
            "PROXY TCP4 198.51.100.7 127.0.0.1 40000 {http_port}\r\n\
             GET / HTTP/1.1\r\nHost: plain.example\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        response
            .lines()
            .find_map(|line| line.strip_prefix("x-backend: ").map(str::to_owned))
    })
    .await;
    assert_eq!(
        answer,
        "198.51.100.7|for=198.51.100.7;host=plain.example;proto=http"
    );
    // Without the header: no answer at all.
    assert_eq!(
        common::traffic::http_get(http, "plain.example", "/").await,
        None
    );

    // TLS through a balancer that speaks PROXY v2 for a client it names itself.
    let balancer_port = free_port();
    let balancer_cfg = dir.path().join("balancer.cfg");
    std::fs::write(
        &balancer_cfg,
        format!(
            "defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  \
             timeout server 30s\nfrontend lb\n  bind 127.0.0.1:{balancer_port}\n  \
             tcp-request connection set-src ipv4(198.51.100.8)\n  default_backend replicas\n\
             backend replicas\n  server r 127.0.0.1:{} send-proxy-v2\n",
            router.https
        ),
    )
    .unwrap();
    let _balancer = Haproxy::start(&balancer_cfg, None);
    let lb = SocketAddr::from(([127, 0, 0, 1], balancer_port));
    let response = eventually_async("the TLS route through the balancer", || async {
        https_get(lb, "secure.example", "/", false).await
    })
    .await;
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(
        response.backend.as_deref(),
        Some("198.51.100.8|for=198.51.100.8;host=secure.example;proto=https")
    );
    assert_eq!(
        https_get(
            SocketAddr::from(([127, 0, 0, 1], router.https)),
            "secure.example",
            "/",
            false
        )
        .await,
        None,
        "TLS without the header"
    );
}

/// `--access-log`: one line per HTTP request (plain, and TLS-terminated) on certwatch's
/// standard output, naming the route's backend, with the status and request line;
/// nothing without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_one_line_per_request_on_stdout_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let web = web_behind_edge_route(dir.path(), "web", "secure", "secure.example").await;
    plain_route(&web.admin).await;
    let sim = &web.sim;
    let start = |name: &str, log: bool| {
        let name = name.to_owned();
        let root = dir.path().join(&name);
        async move {
            router_on(
                &root,
                sim,
                &name,
                free_port(),
                free_port(),
                if log { &["--access-log"][..] } else { &[][..] },
                Launch::json,
            )
            .await
        }
    };
    let logged = start("logged", true).await;
    let stdout = logged.certwatch.log.with_extension("stdout");
    // The plain listener router_on chose.
    let config = std::fs::read_to_string(logged.config_dir.join("haproxy.cfg")).unwrap();
    let http_port: u16 = config
        .split_once("frontend public\n  bind 127.0.0.1:")
        .and_then(|(_, rest)| rest.split_once('\n'))
        .map(|(port, _)| port.parse().unwrap())
        .unwrap();
    let http = SocketAddr::from(([127, 0, 0, 1], http_port));
    let https = SocketAddr::from(([127, 0, 0, 1], logged.https));
    for _ in 0..3 {
        let response = eventually_async("the plain route", || async {
            common::traffic::http_get(http, "plain.example", "/plain")
                .await
                .filter(|response| response.status == 200)
        })
        .await;
        assert_eq!(response.backend.as_deref(), Some("web"));
    }
    for _ in 0..2 {
        let response = https_get(https, "secure.example", "/secure", false)
            .await
            .unwrap();
        assert_eq!(response.status, 200);
    }
    let lines = |text: &str, needle: &str| text.lines().filter(|l| l.contains(needle)).count();
    let text = eventually("the requests' lines", || {
        let text = std::fs::read_to_string(&stdout).unwrap_or_default();
        (lines(&text, "GET /secure") == 2).then_some(text)
    })
    .await;
    let plain: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("\"GET /plain HTTP/1.1\""))
        .collect();
    assert_eq!(plain.len(), 3, "{text}");
    assert!(
        plain
            .iter()
            .all(|line| line.contains("be_http:app-0:plain") && line.contains(" 200 ")),
        "{text}"
    );
    let secure: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("\"GET /secure HTTP/1.1\""))
        .collect();
    assert!(
        secure
            .iter()
            .all(|line| line.contains("be_edge_http:app-0:secure") && line.contains(" 200 ")),
        "{text}"
    );
    // Nothing else is an access line (the start-up line is a JSON log event's).
    assert_eq!(lines(&text, "HTTP/1.1\""), 5, "{text}");

    // Off by default: HAProxy logs nothing.
    let quiet = start("quiet", false).await;
    let config = std::fs::read_to_string(quiet.config_dir.join("haproxy.cfg")).unwrap();
    assert!(!config.contains("  log "), "{config}");
    let response = https_get(
        SocketAddr::from(([127, 0, 0, 1], quiet.https)),
        "secure.example",
        "/secure",
        false,
    )
    .await
    .unwrap();
    assert_eq!(response.status, 200);
    let quiet_stdout =
        std::fs::read_to_string(quiet.certwatch.log.with_extension("stdout")).unwrap_or_default();
    assert_eq!(lines(&quiet_stdout, "HTTP/1.1\""), 0, "{quiet_stdout}");
}
