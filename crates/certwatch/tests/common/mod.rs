//! Helpers for the end-to-end tests: the simulator in the test process, `certwatch run`
//! as a child process, HTTP over plain sockets, metrics parsing, certificates.

#![allow(dead_code)]
// Test helpers: a failure here is a test failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod delegation;
pub mod haproxy;
pub mod routing;
pub mod traffic;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use route_secrets::testing::{LeafSpec, Pki};

/// Generous bound for anything the tests wait for (CI machines are slow and shared);
/// never an assertion on how long something took.
pub const PATIENCE: Duration = Duration::from_secs(90);
/// How long a dropped certwatch may take to stop after SIGTERM before it is killed.
const STOP_PATIENCE: Duration = Duration::from_secs(20);

/// The binary under test: this build's, or the one `CERTWATCH_BIN` names (a measured
/// run of a release or dist build).
pub fn certwatch_binary() -> String {
    std::env::var("CERTWATCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_certwatch").to_owned())
}

/// Reads `child`'s stdout until the line with the HTTP address (and, when the
/// probes' line says that `/metrics` is elsewhere, the line with the HTTPS metrics
/// address), and keeps draining stdout in the background.
fn serving_addresses(child: &mut Child, what: &str) -> (String, Option<String>) {
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    let mut next_line = |reader: &mut BufReader<std::process::ChildStdout>| {
        line.clear();
        let read = reader
            .read_line(&mut line)
            .expect("reading the child's stdout");
        assert!(read > 0, "{what} exited before printing its addresses");
        line.trim_end().to_owned()
    };
    let (probes, separate) = loop {
        let line = next_line(&mut reader);
        if let Some(rest) =
            line.strip_prefix("certwatch: serving /healthz, /readyz and /metrics on http://")
        {
            break (rest.to_owned(), false);
        }
        if let Some(rest) = line.strip_prefix("certwatch: serving /healthz and /readyz on http://")
        {
            // No /metrics anywhere: the line says so after the address.
            let address = rest.split_whitespace().next().unwrap_or_default();
            break (address.to_owned(), !rest.contains("no /metrics"));
        }
    };
    let metrics = separate.then(|| {
        loop {
            let line = next_line(&mut reader);
            if let Some(rest) = line.strip_prefix("certwatch: serving /metrics on https://") {
                break rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
            }
        }
    });
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = reader.read_to_end(&mut sink);
    });
    (probes, metrics)
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

/// The simulator (kube-sim), started from `certwatch-lab sim`'s command line inside the
/// test process, on a thread and runtime of its own (so that it keeps answering while
/// a test blocks, and stops as a whole when dropped). The daemon under test is the
/// production binary, which does not contain the simulator.
pub struct SimProcess {
    pub url: String,
    pub addr: SocketAddr,
    pub kubeconfig: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// `certwatch-lab sim`'s arguments, parsed as the lab's command line parses them.
#[derive(clap::Parser)]
struct SimCommandLine {
    #[command(flatten)]
    sim: kube_sim::cli::SimArgs,
}

impl SimProcess {
    /// Starts the simulator with `args` (e.g. `--generate routes=4,namespaces=2`).
    pub fn start(dir: &Path, args: &[&str]) -> Self {
        Self::start_on(dir, "127.0.0.1:0", args)
    }

    /// Starts the simulator listening on `listen`.
    pub fn start_on(dir: &Path, listen: &str, args: &[&str]) -> Self {
        use clap::Parser as _;
        let kubeconfig = dir.join("sim.kubeconfig");
        let command_line = ["sim", "--listen", listen, "--write-kubeconfig"]
            .into_iter()
            .map(str::to_owned)
            .chain([kubeconfig.display().to_string()])
            .chain(args.iter().map(|arg| (*arg).to_owned()));
        let sim_args = SimCommandLine::try_parse_from(command_line)
            .expect("simulator arguments")
            .sim;
        let (started, url) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("kube-sim".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("the simulator's runtime");
                runtime.block_on(async move {
                    let sim = match kube_sim::cli::start(&sim_args).await {
                        Ok(sim) => sim,
                        Err(error) => {
                            let _ = started.send(Err(error.to_string()));
                            return;
                        }
                    };
                    let _ = started.send(Ok(sim.url()));
                    let _ = stopped.await;
                    sim.shutdown().await;
                });
            })
            .expect("start the simulator's thread");
        let url = url
            .recv()
            .expect("the simulator's thread ended")
            .unwrap_or_else(|error| panic!("the simulator did not start: {error}"));
        let addr = url.trim_start_matches("http://").parse().unwrap();
        Self {
            url,
            addr,
            kubeconfig,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// A kube client for a context of the kubeconfig (`admin` or `router`).
    pub async fn client(&self, context: &str) -> kube::Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &KubeConfigOptions {
                context: Some(context.to_owned()),
                ..KubeConfigOptions::default()
            },
        )
        .await
        .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// Starts the simulator with `routes` routes in `namespaces` namespaces behind the
    /// smallest budget the daemon is held to: 4 requests at once, no queue (every request beyond
    /// is answered 429 at once), 10 ms per request.
    pub fn four_seats_without_a_queue(dir: &Path, routes: usize, namespaces: usize) -> Self {
        let generate = format!("routes={routes},namespaces={namespaces}");
        Self::start(
            dir,
            &[
                "--generate",
                &generate,
                "--max-inflight",
                "4",
                "--queue",
                "0",
                "--latency",
                "10ms",
            ],
        )
    }

    /// Calls the simulator's admin API.
    pub fn admin(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        http_request(self.addr, method, path, body)
    }

    /// Stops the simulator: its connections close, its port is free again.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How to start `certwatch run` ([`Certwatch::launch`]).
pub struct Launch {
    kubeconfig: PathBuf,
    cert_dir: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    listen: String,
    user: Option<(u32, u32)>,
    json: bool,
    default_log_level: bool,
    cpu_list: Option<String>,
}

impl Launch {
    /// `certwatch run --kubeconfig K --cert-dir D --listen 127.0.0.1:0 --progress log`,
    /// logging to `log`.
    pub fn new(kubeconfig: &Path, cert_dir: &Path, log: &Path) -> Self {
        Self {
            kubeconfig: kubeconfig.to_owned(),
            cert_dir: cert_dir.to_owned(),
            log: log.to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            listen: "127.0.0.1:0".to_owned(),
            user: None,
            json: false,
            default_log_level: false,
            cpu_list: None,
        }
    }

    /// The log level a deployment has (no `RUST_LOG`), instead of the tests' debug
    /// level for certwatch.
    pub fn default_log_level(mut self) -> Self {
        self.default_log_level = true;
        self
    }

    /// More arguments.
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Self {
        self.args
            .extend(args.iter().map(|arg| arg.as_ref().to_owned()));
        self
    }

    /// An environment variable.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// `--listen` (any port: the test finds it).
    pub fn listen(mut self, listen: &str) -> Self {
        self.listen = listen.to_owned();
        self
    }

    /// Run on these CPUs only (`taskset -c LIST`, which then runs certwatch in its
    /// place): what certwatch finds available.
    pub fn cpus(mut self, list: &str) -> Self {
        self.cpu_list = Some(list.to_owned());
        self
    }

    /// Run as this user and group (the test must run as root).
    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.user = Some((uid, gid));
        self
    }

    /// `--log-format json`: the address is read from the log; stdout goes to
    /// `<log>.stdout`.
    pub fn json(mut self) -> Self {
        self.json = true;
        self.args
            .extend(["--log-format".to_owned(), "json".to_owned()]);
        self
    }
}

/// `certwatch run` as a child process.
pub struct Certwatch {
    child: Child,
    pub addr: SocketAddr,
    /// The HTTPS metrics endpoint (`--metrics-listen`), if any.
    pub metrics_addr: Option<SocketAddr>,
    pub log: PathBuf,
}

impl Certwatch {
    /// Starts `certwatch run --kubeconfig K --cert-dir D --listen 127.0.0.1:0` with
    /// `args`; its log goes to `log`.
    pub fn start(kubeconfig: &Path, cert_dir: &Path, log: &Path, args: &[&str]) -> Self {
        Self::launch(Launch::new(kubeconfig, cert_dir, log).args(args))
    }

    /// Starts `certwatch run` as `launch` says, and waits until it serves HTTP.
    pub fn launch(launch: Launch) -> Self {
        use std::os::unix::process::CommandExt;
        let mut command = match &launch.cpu_list {
            Some(list) => {
                let mut taskset = Command::new("taskset");
                taskset.args(["-c", list]).arg(certwatch_binary());
                taskset
            }
            None => Command::new(certwatch_binary()),
        };
        command
            .arg("run")
            .arg("--kubeconfig")
            .arg(&launch.kubeconfig)
            .arg("--cert-dir")
            .arg(&launch.cert_dir)
            .args(["--listen", &launch.listen, "--progress", "log"])
            .args(&launch.args)
            .env(
                "RUST_LOG",
                "info,certwatch=debug,route_secrets::api::leader=debug",
            )
            // Tests read /metrics on their loopback --listen, and stop certwatch at
            // once; a test of either default overrides these with `env`.
            .env("CERTWATCH_METRICS_UNAUTHENTICATED", "true")
            .env("CERTWATCH_SHUTDOWN_DELAY", "0s")
            .envs(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(&launch.log).unwrap());
        if let Some((uid, gid)) = launch.user {
            command.uid(uid).gid(gid);
        }
        if launch.default_log_level {
            command.env_remove("RUST_LOG");
        }
        if launch.json {
            command.stdout(std::fs::File::create(launch.log.with_extension("stdout")).unwrap());
        } else {
            command.stdout(Stdio::piped());
        }
        let mut child = command.spawn().expect("start certwatch run");
        let (addr, metrics_addr) = if launch.json {
            address_from_json_log(&mut child, &launch.log)
        } else {
            serving_addresses(&mut child, "certwatch run")
        };
        Self {
            child,
            addr: addr.trim().parse().unwrap(),
            metrics_addr: metrics_addr.map(|addr| addr.trim().parse().unwrap()),
            log: launch.log,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. `HUP`) to the process.
    pub fn signal(&self, signal: &str) {
        send_signal(self.child.id(), signal);
    }

    /// Whether the process has exited, with its status.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        http_request(self.addr, "GET", path, "")
    }

    pub fn metrics(&self) -> String {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200, "{body}");
        body
    }

    /// The value of the sample `name` (with its labels exactly as printed, e.g.
    /// `certwatch_routes_rejected{reason="X",cause="y"}`), if present.
    pub fn metric(&self, sample: &str) -> Option<f64> {
        metric_value(&self.metrics(), sample)
    }

    pub fn is_ready(&self) -> bool {
        self.get("/readyz").0 == 200
    }

    pub async fn wait_ready(&self) {
        eventually("certwatch ready", || self.is_ready().then_some(())).await;
    }

    /// Waits until every route present at start-up is decided and its files are
    /// written: ready, or waiting for HAProxy only (which a test then starts).
    pub async fn wait_files_ready(&self) {
        eventually("certwatch's files ready", || {
            let (status, body) = self.get("/readyz");
            (status == 200 || body.contains("its files are written")).then_some(())
        })
        .await;
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal("TERM");
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "certwatch did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Certwatch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let state = match self.child.try_wait() {
                Ok(Some(status)) => format!("exited: {status}"),
                _ => "running".to_owned(),
            };
            eprintln!(
                "--- certwatch run log (pid {}, {state}) ---\n{}",
                self.child.id(),
                tail(&self.log)
            );
        }
        // SIGTERM first: certwatch stops the HAProxy it runs (a SIGKILL would leave that
        // child running, its ports bound, after the test).
        let running = |child: &mut Child| matches!(child.try_wait(), Ok(None));
        if running(&mut self.child) {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.child.id().to_string())
                .status();
            let deadline = Instant::now() + STOP_PATIENCE;
            while running(&mut self.child) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for the JSON log event that carries the HTTP address; returns it, and the
/// HTTPS metrics address when the event has one.
fn address_from_json_log(child: &mut Child, log: &Path) -> (String, Option<String>) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if let Some(address) = event["address"].as_str() {
                let metrics = event["metrics_address"].as_str().map(str::to_owned);
                return (address.to_owned(), metrics);
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("certwatch run exited ({status}) before serving:\n{text}");
        }
        assert!(
            Instant::now() < deadline,
            "no address in the JSON log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Leader election timed for tests: a lease of 6 s, renewed within 4 s, retried every
/// second.
pub const FAST_ELECTION: [&str; 6] = [
    "--lease-duration",
    "6s",
    "--lease-renew-deadline",
    "4s",
    "--lease-retry-period",
    "1s",
];

/// The real control plane (tools/testenv; its options from the environment) with the
/// cluster `spec` installed as the simulator's generator makes it; with an admin client.
pub async fn real_cluster(
    spec: &kube_sim::GenerateSpec,
) -> (
    testenv::ControlPlane,
    kube::Client,
    kube_sim::GeneratedCluster,
) {
    let control_plane = testenv::ControlPlane::start_with(testenv::ControlPlaneOptions::from_env())
        .await
        .unwrap();
    let admin = control_plane.admin_client().await.unwrap();
    let cluster = testenv::Installer::new(admin.clone())
        .generate(spec)
        .await
        .unwrap();
    (control_plane, admin, cluster)
}

/// Sends `signal` (e.g. `TERM`, `KILL`, `STOP`) to process `pid` with `kill`; panics
/// unless it succeeds.
pub fn send_signal(pid: impl std::fmt::Display, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Runs `certwatch` with `args` and `env` to its exit; returns the output.
pub fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(certwatch_binary());
    command.args(args).stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("certwatch {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `sample value` lines of a Prometheus text exposition.
pub fn metric_value(text: &str, sample: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(sample)?;
        let value = rest.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// The 429s certwatch's `/metrics` (the text in `metrics`) counts, over every
/// resource and verb.
pub fn counted_429s(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("certwatch_api_requests_total{") && line.contains("code=\"429\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// One HTTP/1.1 request over a fresh connection; returns status and body (0 and an
/// empty body when nothing listens).
pub fn http_request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return (0, String::new());
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut response = Vec::new();
    if stream.read_to_end(&mut response).is_err() {
        return (0, String::new());
    }
    let response = String::from_utf8_lossy(&response).into_owned();
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        return (0, String::new());
    };
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// Polls `check` until it returns `Some`, for at most [`PATIENCE`].
pub async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls an async `check` until it returns `Some`, for at most [`PATIENCE`].
pub async fn eventually_async<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `tls.crt` and `tls.key` of a secret.
pub fn tls_of(secret: &Secret) -> (Vec<u8>, Vec<u8>) {
    let data = secret.data.as_ref().expect("secret has data");
    (
        data.get("tls.crt").expect("tls.crt").0.clone(),
        data.get("tls.key").expect("tls.key").0.clone(),
    )
}

/// What a bundle for `secret` must contain: the chain, then the key.
pub fn expected_bundle(secret: &Secret) -> Vec<u8> {
    let (crt, key) = tls_of(secret);
    let mut out = crt;
    if !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(&key);
    out
}

/// A fresh certificate for `host` (leaf and intermediate) and its key, as secret data.
pub fn new_tls_data(host: &str) -> BTreeMap<String, ByteString> {
    let now = jiff::Timestamp::now();
    let pki = Pki::new(now);
    pki.issue(&LeafSpec::new(host, now)).data()
}

/// Replaces a secret's certificate and key with a fresh pair for `host`; returns the
/// new secret.
pub async fn rotate_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    host: &str,
) -> Secret {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let data = new_tls_data(host);
    let patch = serde_json::json!({ "data": data });
    secrets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap()
}

/// Lets the router identity read `secret` in `namespace` (adds it to the Role the
/// simulator's generator made there).
pub async fn grant_secret(admin: &kube::Client, namespace: &str, secret: &str) {
    use k8s_openapi::api::rbac::v1::Role;
    let roles = Api::<Role>::namespaced(admin.clone(), namespace);
    let mut role = roles.get("certwatch-router-secrets").await.unwrap();
    role.rules.as_mut().unwrap()[0]
        .resource_names
        .as_mut()
        .unwrap()
        .push(secret.to_owned());
    roles
        .replace(
            "certwatch-router-secrets",
            &kube::api::PostParams::default(),
            &role,
        )
        .await
        .unwrap();
}

/// Creates a `kubernetes.io/tls` secret with a fresh certificate for `host`.
pub async fn create_tls_secret(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    host: &str,
) -> Secret {
    let mut secret = Secret {
        data: Some(new_tls_data(host)),
        type_: Some("kubernetes.io/tls".to_owned()),
        ..Secret::default()
    };
    secret.metadata.name = Some(name.to_owned());
    Api::<Secret>::namespaced(admin.clone(), namespace)
        .create(&kube::api::PostParams::default(), &secret)
        .await
        .unwrap()
}

/// Creates an edge route whose certificate is in `secret`; `host: None` leaves
/// `spec.host` out.
pub async fn create_route(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    host: Option<&str>,
    secret: &str,
) {
    let mut spec = serde_json::json!({
        "to": {"kind": "Service", "name": "backend"},
        "tls": {"termination": "edge", "externalCertificate": {"name": secret}}
    });
    if let Some(host) = host {
        spec["host"] = host.into();
    }
    create_route_spec(admin, namespace, name, spec).await;
}

/// Routes whose status for `router` says `Admitted` is `admitted` (0 when the list
/// fails).
pub async fn routes_with_status(admin: &kube::Client, router: &str, admitted: bool) -> usize {
    use route_secrets::route::admission::{admitted_condition, router_ingress};
    use route_secrets::route::{ConditionStatus, Route};
    let Ok(routes) = Api::<Route>::all(admin.clone())
        .list(&kube::api::ListParams::default())
        .await
    else {
        return 0;
    };
    routes
        .items
        .iter()
        .filter(|route| {
            router_ingress(route, router)
                .and_then(admitted_condition)
                .is_some_and(|condition| (condition.status == ConditionStatus::True) == admitted)
        })
        .count()
}

/// Creates route `namespace/name` with `spec` as it is.
pub async fn create_route_spec(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    spec: serde_json::Value,
) {
    let route: route_secrets::route::Route = serde_json::from_value(serde_json::json!({
        "apiVersion": "route.openshift.io/v1",
        "kind": "Route",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }))
    .unwrap();
    Api::<route_secrets::route::Route>::namespaced(admin.clone(), namespace)
        .create(&kube::api::PostParams::default(), &route)
        .await
        .unwrap();
}

/// The crt-list in `cert_dir` as (link file name, SNI) pairs, in order; empty when
/// there is none. Every line must name an existing file in `cert_dir/links`, with an
/// SNI filter.
/// The crt-list as (link file name, SNI filter); every file it names must exist.
pub fn crt_list(cert_dir: &Path) -> Vec<(String, String)> {
    crt_list_lines(cert_dir)
        .into_iter()
        .map(|(name, rest)| {
            let sni = rest.rsplit(' ').next().unwrap_or_default().to_owned();
            (name, sni)
        })
        .collect()
}

/// The crt-list as (link file name, what follows it: options and SNI filter).
///
/// Every listed file must exist. The daemon may replace the list and remove a file it no
/// longer lists between this function's two reads, so a missing file counts only when
/// the list that names it is still the one on disk.
pub fn crt_list_lines(cert_dir: &Path) -> Vec<(String, String)> {
    let read = || std::fs::read_to_string(cert_dir.join("crt-list")).unwrap_or_default();
    let mut text = read();
    loop {
        let missing = text.lines().find(|line| {
            let path = line.split_once(' ').map_or(*line, |(path, _)| path);
            std::fs::metadata(path).is_err()
        });
        let Some(missing) = missing else {
            break;
        };
        let again = read();
        assert!(again != text, "{missing}: listed but missing");
        text = again;
    }
    text.lines()
        .map(|line| {
            let (path, sni) = line.split_once(' ').expect("every line has an SNI filter");
            let path = Path::new(path);
            assert_eq!(path.parent().unwrap(), cert_dir.join("links"), "{line}");
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, sni.to_owned())
        })
        .collect()
}

/// The file's bytes, or empty when it is absent.
pub fn read_or_empty(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_default()
}

/// A TCP port free right now on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
