//! The real OpenShift router (openshift/router with its HAProxy template), run from the
//! project's shared tool (`<workspace>/../shared/tools/openshift-router`, or the directory
//! named by `CERTWATCH_TEST_OPENSHIFT_ROUTER`) against a [`ControlPlane`](crate::ControlPlane):
//! the judge of differential tests (the `Admitted` condition it writes under its router
//! name, the certificates its HAProxy serves) and the reference row of start-up
//! measurements.
//!
//! ```no_run
//! # async fn example() -> Result<(), testenv::TestEnvError> {
//! use testenv::openshift_router::{OpenShiftRouter, RouterOptions};
//! use testenv::{ControlPlane, ControlPlaneOptions};
//!
//! let control_plane = ControlPlane::start_with(ControlPlaneOptions::from_env()).await?;
//! OpenShiftRouter::grant_cluster_rights(&control_plane.admin_client().await?).await?;
//! let router = OpenShiftRouter::start(control_plane.kubeconfig_path(), RouterOptions::new("real")).await?;
//! let _https = router.https_port();
//! # Ok(()) }
//! ```
//!
//! - **The tool runs as it is.** `start DIR` lays out the router image's HAProxy tree,
//!   picks free ports, starts the router in its own session and waits until its health
//!   port answers; `stop DIR` ends the router and every HAProxy it started. Nothing here
//!   re-implements either.
//! - **Lifetime.** Dropping an [`OpenShiftRouter`] runs `stop DIR`. A test process that
//!   is killed outright runs no destructor, so a small `sh` watchdog holds a pipe whose
//!   other end only this process has, and runs `stop DIR` when it closes (as
//!   [`process`](crate::process) does for the control plane).
//! - **Nothing is skipped.** A missing tool or a missing `haproxy` on `PATH` is an error
//!   that says how to get it.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams};

use crate::error::TestEnvError;

/// The variable naming another tool directory than the shared one.
pub const OPENSHIFT_ROUTER_ENV: &str = "CERTWATCH_TEST_OPENSHIFT_ROUTER";

/// The field manager of the cluster rights' server-side applies.
const FIELD_MANAGER: &str = "certwatch-testenv";

/// The watchdog: waits for end-of-file on stdin (this process's end of the pipe closing,
/// however it ends), then runs the tool's `stop DIR`. It ignores SIGINT, SIGHUP and
/// SIGTERM so that a signal to the whole process group (a Ctrl-C, `timeout`) that ends
/// the test process leaves it alive to clean up.
const WATCHDOG: &str = r#"
trap '' INT HUP TERM
while read -r _; do :; done
exec "$1" "$2" >/dev/null 2>&1
"#;

/// Which build of the router runs (the tool's `ROUTER_VARIANT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RouterVariant {
    /// The router as released: external certificates checked one route at a time.
    #[default]
    Release,
    /// The router with upstream's asynchronous external-certificate fix (access reviews
    /// in the background, cached; secrets watched per namespace where it may list them).
    Async,
}

impl RouterVariant {
    /// The tool's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Release => "release",
            Self::Async => "async",
        }
    }
}

/// How to start the router.
#[derive(Clone, Debug)]
pub struct RouterOptions {
    /// The name it writes route status under (`--name`).
    pub name: String,
    /// Which build runs.
    pub variant: RouterVariant,
    /// The OpenSSL security level its HAProxy loads certificates under (the image's: 1).
    pub openssl_seclevel: u8,
    /// Route label selector (`--labels`).
    pub labels: Option<String>,
    /// Namespace label selector (`--namespace-labels`).
    pub namespace_labels: Option<String>,
    /// The router's own environment variables (`ROUTER_ALLOW_WILDCARD_ROUTES`, ...).
    pub env: BTreeMap<String, String>,
    /// Extra router flags (`--v=4`, ...).
    pub args: Vec<String>,
}

impl RouterOptions {
    /// The released router under `name`, HAProxy at the image's security level 1.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            variant: RouterVariant::Release,
            openssl_seclevel: 1,
            labels: None,
            namespace_labels: None,
            env: BTreeMap::new(),
            args: Vec::new(),
        }
    }

    /// Runs `variant`.
    pub fn variant(mut self, variant: RouterVariant) -> Self {
        self.variant = variant;
        self
    }

    /// Sets one of the router's environment variables.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Adds a router flag.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }
}

/// The tool directory beside the workspace, as the project lays it out.
pub fn default_tool_dir() -> PathBuf {
    // CARGO_MANIFEST_DIR is <workspace>/tools/testenv.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/openshift-router")
}

/// The tool directory this run uses: `CERTWATCH_TEST_OPENSHIFT_ROUTER` if set, else the
/// shared one. Fails, saying how to get one, when it holds no router.
pub fn tool_dir() -> Result<PathBuf, TestEnvError> {
    let (dir, from_env) = match std::env::var_os(OPENSHIFT_ROUTER_ENV) {
        Some(dir) if !dir.is_empty() => (PathBuf::from(dir), true),
        _ => (default_tool_dir(), false),
    };
    let complete = ["start", "stop", "rbac.yaml"]
        .iter()
        .all(|file| dir.join(file).is_file());
    if !complete {
        return Err(TestEnvError::RouterNotFound { dir, from_env });
    }
    Ok(dir.canonicalize().unwrap_or(dir))
}

/// `haproxy` on `PATH`, which the router needs (its reload script runs it).
fn haproxy_on_path() -> Result<PathBuf, TestEnvError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("haproxy"))
        .find(|candidate| candidate.is_file())
        .ok_or(TestEnvError::HaproxyNotFound)
}

/// What the tool's `start` wrote into `DIR/env`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterEnv {
    /// The router's process id.
    pub pid: u32,
    /// The name it writes route status under.
    pub name: String,
    /// Its health and metrics port.
    pub stats_port: u16,
    /// HAProxy's HTTP port.
    pub http_port: u16,
    /// HAProxy's HTTPS port.
    pub https_port: u16,
    /// `http://127.0.0.1:STATS/healthz/ready`: 200 once every route it selected is processed.
    pub health_url: String,
    /// The user for `/metrics`.
    pub stats_user: String,
    /// Its password.
    pub stats_password: String,
    /// The router's log file.
    pub log: PathBuf,
    /// HAProxy's pid file.
    pub haproxy_pid_file: PathBuf,
}

impl RouterEnv {
    fn parse(text: &str) -> Result<Self, TestEnvError> {
        let values: BTreeMap<&str, &str> = text
            .lines()
            .filter_map(|line| line.split_once('='))
            .collect();
        let get = |name: &str| {
            values
                .get(name)
                .map(|value| (*value).to_owned())
                .ok_or_else(|| TestEnvError::format("the router's env file", format!("no {name}")))
        };
        let number = |name: &str| -> Result<u32, TestEnvError> {
            get(name)?.parse().map_err(|error| {
                TestEnvError::format(format!("the router's env file, {name}"), error)
            })
        };
        let port = |name: &str| -> Result<u16, TestEnvError> {
            u16::try_from(number(name)?).map_err(|error| {
                TestEnvError::format(format!("the router's env file, {name}"), error)
            })
        };
        Ok(Self {
            pid: number("ROUTER_PID")?,
            name: get("ROUTER_NAME")?,
            stats_port: port("ROUTER_STATS_PORT")?,
            http_port: port("ROUTER_HTTP_PORT")?,
            https_port: port("ROUTER_HTTPS_PORT")?,
            health_url: get("ROUTER_HEALTH_URL")?,
            stats_user: get("ROUTER_STATS_USER")?,
            stats_password: get("ROUTER_STATS_PASSWORD")?,
            log: PathBuf::from(get("ROUTER_LOG")?),
            haproxy_pid_file: PathBuf::from(get("ROUTER_HAPROXY_PID_FILE")?),
        })
    }
}

/// A running router; stopped when dropped.
#[derive(Debug)]
pub struct OpenShiftRouter {
    env: RouterEnv,
    started: Instant,
    stop_script: PathBuf,
    watchdog: Option<Child>,
    /// The write end of the watchdog's stdin; closing it stops the router.
    lifeline: Option<ChildStdin>,
    /// Everything of this router (removed on drop, after it stopped).
    dir: tempfile::TempDir,
}

impl OpenShiftRouter {
    /// Gives the router identity (`system:serviceaccount:openshift-ingress:router`) the
    /// cluster rights the tool's `rbac.yaml` lists (cluster-ingress-operator's router
    /// ClusterRole and binding, and the namespace `openshift-ingress`), applied
    /// server-side through `admin`. Access to secrets is granted per secret
    /// ([`Installer::grant_router_secrets`](crate::Installer::grant_router_secrets)).
    pub async fn grant_cluster_rights(admin: &kube::Client) -> Result<(), TestEnvError> {
        let file = tool_dir()?.join("rbac.yaml");
        let text = std::fs::read_to_string(&file).map_err(|source| TestEnvError::Io {
            what: format!("reading {}", file.display()),
            source,
        })?;
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value: serde_json::Value = serde::Deserialize::deserialize(document)
                .map_err(|error| TestEnvError::format(format!("{}", file.display()), error))?;
            if value.is_null() {
                continue;
            }
            let kind = value["kind"].as_str().unwrap_or_default().to_owned();
            let name = value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let what = format!("applying {kind} {name} from {}", file.display());
            let result = match kind.as_str() {
                "Namespace" => Api::<Namespace>::all(admin.clone())
                    .patch(&name, &apply, &Patch::Apply(&value))
                    .await
                    .map(drop),
                "ClusterRole" => Api::<ClusterRole>::all(admin.clone())
                    .patch(&name, &apply, &Patch::Apply(&value))
                    .await
                    .map(drop),
                "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(admin.clone())
                    .patch(&name, &apply, &Patch::Apply(&value))
                    .await
                    .map(drop),
                other => {
                    return Err(TestEnvError::format(
                        what,
                        format!("unexpected kind {other:?}"),
                    ));
                }
            };
            result.map_err(|error| TestEnvError::kube(what, error))?;
        }
        Ok(())
    }

    /// Starts the router against the API server of `kubeconfig` (its `router`
    /// context: the router identity) and waits until its health port answers. The
    /// routes it selects are processed from then on; [`is_ready`](Self::is_ready) says
    /// when all are.
    pub async fn start(kubeconfig: &Path, options: RouterOptions) -> Result<Self, TestEnvError> {
        let kubeconfig = kubeconfig.to_path_buf();
        tokio::task::spawn_blocking(move || Self::start_blocking(&kubeconfig, &options))
            .await
            .map_err(|error| TestEnvError::format("starting the router", error))?
    }

    fn start_blocking(kubeconfig: &Path, options: &RouterOptions) -> Result<Self, TestEnvError> {
        let tool = tool_dir()?;
        haproxy_on_path()?;
        let dir = tempfile::Builder::new()
            .prefix("certwatch-router-")
            .tempdir()
            .map_err(|source| TestEnvError::Io {
                what: "creating the router's directory".to_owned(),
                source,
            })?;
        let mut command = Command::new(tool.join("start"));
        command
            .arg(dir.path())
            .env("KUBECONFIG", kubeconfig)
            .env("CONTEXT", crate::ROUTER_CONTEXT)
            .env("ROUTER_NAME", &options.name)
            .env("ROUTER_VARIANT", options.variant.as_str())
            .env("OPENSSL_SECLEVEL", options.openssl_seclevel.to_string())
            .env("ROUTER_ARGS", options.args.join(" "))
            .envs(&options.env)
            .stdin(Stdio::null());
        for (variable, value) in [
            ("ROUTER_LABELS", &options.labels),
            ("ROUTER_NAMESPACES", &options.namespace_labels),
        ] {
            match value {
                Some(value) => command.env(variable, value),
                None => command.env_remove(variable),
            };
        }
        let started = Instant::now();
        let output = command.output().map_err(|source| TestEnvError::Io {
            what: format!("running {}", tool.join("start").display()),
            source,
        })?;
        let stop_script = tool.join("stop");
        if !output.status.success() {
            // It may have left a router behind (it stops the one it timed out on itself).
            let _ = Command::new(&stop_script).arg(dir.path()).output();
            return Err(TestEnvError::RouterNotStarted {
                reason: format!(
                    "{} exited with {}: {}",
                    tool.join("start").display(),
                    output.status,
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
                log_tail: crate::process::log_tail(&dir.path().join("router.log")),
            });
        }
        let env_file = dir.path().join("env");
        let env = std::fs::read_to_string(&env_file)
            .map_err(|source| TestEnvError::Io {
                what: format!("reading {}", env_file.display()),
                source,
            })
            .and_then(|text| RouterEnv::parse(&text));
        let env = match env {
            Ok(env) => env,
            Err(error) => {
                let _ = Command::new(&stop_script).arg(dir.path()).output();
                return Err(error);
            }
        };
        // From here on a killed test process still stops the router.
        let spawned = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("testenv-router-watchdog")
            .arg(&stop_script)
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut watchdog = match spawned {
            Ok(watchdog) => watchdog,
            Err(source) => {
                let _ = Command::new(&stop_script).arg(dir.path()).output();
                return Err(TestEnvError::Io {
                    what: "starting the router's watchdog (sh)".to_owned(),
                    source,
                });
            }
        };
        let lifeline = watchdog.stdin.take();
        Ok(Self {
            env,
            started,
            stop_script,
            watchdog: Some(watchdog),
            lifeline,
            dir,
        })
    }

    /// What the tool reported about this router.
    pub fn env(&self) -> &RouterEnv {
        &self.env
    }

    /// The name it writes route status under.
    pub fn name(&self) -> &str {
        &self.env.name
    }

    /// HAProxy's HTTP port on 127.0.0.1.
    pub fn http_port(&self) -> u16 {
        self.env.http_port
    }

    /// HAProxy's HTTPS port on 127.0.0.1.
    pub fn https_port(&self) -> u16 {
        self.env.https_port
    }

    /// When `start` was run.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The router's working directory (the image's `/var/lib/haproxy`).
    pub fn haproxy_dir(&self) -> PathBuf {
        self.dir.path().join("haproxy")
    }

    /// The crt-list the router wrote for its HAProxy (`conf/cert_config.map`): one line
    /// per certificate it serves, `<file> [alpn ...] <sni>`. Empty before its first write.
    pub fn cert_config_map(&self) -> String {
        std::fs::read_to_string(self.haproxy_dir().join("conf/cert_config.map")).unwrap_or_default()
    }

    /// The HAProxy configuration the router rendered last.
    pub fn haproxy_config(&self) -> String {
        std::fs::read_to_string(self.haproxy_dir().join("conf/haproxy.config")).unwrap_or_default()
    }

    /// Whether `/healthz/ready` answers 200: every route the router selected at start
    /// has been processed.
    pub fn is_ready(&self) -> bool {
        self.get("/healthz/ready", None)
            .is_ok_and(|(status, _)| status == 200)
    }

    /// The router's `/metrics` (Prometheus text).
    pub fn metrics(&self) -> Result<String, TestEnvError> {
        let credentials = format!("{}:{}", self.env.stats_user, self.env.stats_password);
        let (status, body) = self.get("/metrics", Some(&credentials))?;
        if status != 200 {
            return Err(TestEnvError::format(
                "the router's /metrics",
                format!("status {status}"),
            ));
        }
        Ok(body)
    }

    /// Whether the router process still runs.
    pub fn is_running(&self) -> bool {
        crate::process::pid_is_running(self.env.pid)
    }

    /// The last lines of the router's log.
    pub fn log_tail(&self) -> String {
        crate::process::log_tail(&self.env.log)
    }

    /// A GET on the router's health and metrics port (HTTP/1.0, so the body ends with
    /// the connection).
    fn get(&self, path: &str, basic_auth: Option<&str>) -> Result<(u16, String), TestEnvError> {
        use base64::Engine as _;
        let io = |source| TestEnvError::Io {
            what: format!("GET {path} from the router"),
            source,
        };
        let mut stream = TcpStream::connect(("127.0.0.1", self.env.stats_port)).map_err(io)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(io)?;
        let auth = basic_auth
            .map(|credentials| {
                let encoded = base64::engine::general_purpose::STANDARD.encode(credentials);
                format!("Authorization: Basic {encoded}\r\n")
            })
            .unwrap_or_default();
        write!(
            stream,
            "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{auth}\r\n"
        )
        .map_err(io)?;
        let mut response = String::new();
        stream.read_to_string(&mut response).map_err(io)?;
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| {
                TestEnvError::format(format!("GET {path} from the router"), "no status")
            })?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    }

    /// Stops the router and its HAProxy now (dropping does the same).
    pub fn stop(&mut self) {
        // Closing the lifeline makes the watchdog run `stop DIR` (about 4 s).
        drop(self.lifeline.take());
        if let Some(mut watchdog) = self.watchdog.take() {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match watchdog.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = watchdog.kill();
                        let _ = watchdog.wait();
                        let _ = Command::new(&self.stop_script)
                            .arg(self.dir.path())
                            .output();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }
}

impl Drop for OpenShiftRouter {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- OpenShift router log ({}) ---\n{}",
                self.env.log.display(),
                self.log_tail()
            );
        }
        self.stop();
    }
}
