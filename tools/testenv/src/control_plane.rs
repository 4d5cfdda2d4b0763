//! Starting and stopping one etcd + kube-apiserver pair on loopback.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::accounting::{AuditLog, Metrics};
use crate::binaries::{self, Binaries};
use crate::error::TestEnvError;
use crate::pki::ControlPlanePki;
use crate::process::Supervised;

/// The variable adding kube-apiserver flags to every control plane of a run (split on
/// whitespace), e.g. `--feature-gates=WatchList=false`.
pub const APISERVER_FLAGS_ENV: &str = "KUBE_APISERVER_FLAGS";

/// The variable naming another etcd executable (standard etcd flags), e.g. Debian's
/// etcd 3.4 at `/usr/bin/etcd`: storage without watch progress, as older clusters have.
pub const ETCD_BIN_ENV: &str = "ETCD_BIN";

pub use kube_sim::{
    ADMIN_CONTEXT, ADMIN_USER, ROUTER_CONTEXT, ROUTER_NAMESPACE, ROUTER_SERVICE_ACCOUNT,
    ROUTER_USER,
};

/// How long etcd and kube-apiserver get to become ready (~7 s on an idle machine; the
/// test machines are shared and slow).
const READY_PATIENCE: Duration = Duration::from_secs(180);

/// Audit everything but the API server's own loopback traffic, at Metadata level (who,
/// what, which object, which answer; never a body, so never a secret's bytes).
const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  users: [\"system:apiserver\"]
- level: Metadata
";

/// How a control plane is started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControlPlaneOptions {
    apiserver_flags: Vec<String>,
    etcd_bin: Option<PathBuf>,
    audit: bool,
}

impl ControlPlaneOptions {
    /// The options the environment asks for: extra flags from `KUBE_APISERVER_FLAGS`,
    /// another etcd from `ETCD_BIN`, and the audit log on.
    pub fn from_env() -> Self {
        let apiserver_flags = std::env::var(APISERVER_FLAGS_ENV)
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let etcd_bin = std::env::var_os(ETCD_BIN_ENV)
            .filter(|path| !path.is_empty())
            .map(PathBuf::from);
        Self {
            apiserver_flags,
            etcd_bin,
            audit: true,
        }
    }

    /// Adds a kube-apiserver flag (after the environment's, so it wins where the flag
    /// takes one value).
    pub fn apiserver_flag(mut self, flag: impl Into<String>) -> Self {
        self.apiserver_flags.push(flag.into());
        self
    }

    /// Runs this etcd executable (standard etcd flags) instead of the tool's.
    pub fn etcd_bin(mut self, path: impl Into<PathBuf>) -> Self {
        self.etcd_bin = Some(path.into());
        self
    }

    /// Whether the API server writes an audit log (on by default: it is the exact
    /// per-user request accounting).
    pub fn audit(mut self, audit: bool) -> Self {
        self.audit = audit;
        self
    }

    /// The extra kube-apiserver flags.
    pub fn apiserver_flags(&self) -> &[String] {
        &self.apiserver_flags
    }
}

/// A running etcd + kube-apiserver with the Route CRD installed, the `admin` and
/// `router` identities, and the Route CRD; both processes stop when it is dropped.
#[derive(Debug)]
pub struct ControlPlane {
    apiserver: Supervised,
    /// How kube-apiserver was started, to start it again on the same port.
    apiserver_command: (PathBuf, Vec<String>),
    etcd: Supervised,
    url: String,
    kubeconfig: Kubeconfig,
    kubeconfig_path: PathBuf,
    pki: ControlPlanePki,
    audit_log: Option<PathBuf>,
    /// Declared last: removed only after both processes are gone.
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Starts a control plane with [`ControlPlaneOptions::from_env`].
    pub async fn start() -> Result<Self, TestEnvError> {
        Self::start_with(ControlPlaneOptions::from_env()).await
    }

    /// Starts a control plane with `options`.
    pub async fn start_with(options: ControlPlaneOptions) -> Result<Self, TestEnvError> {
        let binaries = tokio::task::spawn_blocking(binaries::binaries)
            .await
            .map_err(|error| TestEnvError::Io {
                what: "finding the control plane's binaries".to_owned(),
                source: std::io::Error::other(error.to_string()),
            })??;
        // Free ports are found by binding and releasing them, so another test can take
        // one before etcd or kube-apiserver binds it: try again with new ports.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(&binaries, &options).await {
                Err(TestEnvError::NotStarted { log_tail, .. })
                    if attempt < 3 && log_tail.contains("address already in use") => {}
                result => return result,
            }
        }
    }

    async fn start_once(
        binaries: &Binaries,
        options: &ControlPlaneOptions,
    ) -> Result<Self, TestEnvError> {
        let dir = tempfile::Builder::new()
            .prefix("certwatch-testenv-")
            .tempdir()
            .map_err(|source| io("creating the control plane's directory", source))?;
        let root = dir.path().to_path_buf();
        let pki = ControlPlanePki::generate()?;
        let files = Files::write(&root, &pki)?;
        let [api_port, etcd_port, peer_port, metrics_port] = free_ports()?;

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let metrics_url = format!("http://127.0.0.1:{metrics_port}");
        let data_dir = root.join("etcd").display().to_string();
        let (etcd_program, etcd_args) = match &options.etcd_bin {
            Some(program) => (
                program.clone(),
                vec![
                    format!("--data-dir={data_dir}"),
                    format!("--listen-client-urls={etcd_url}"),
                    format!("--advertise-client-urls={etcd_url}"),
                    format!("--listen-peer-urls={peer_url}"),
                    format!("--listen-metrics-urls={metrics_url}"),
                ],
            ),
            None => (
                binaries.etcd.clone(),
                vec![
                    "-data-dir".to_owned(),
                    data_dir,
                    "-client".to_owned(),
                    etcd_url.clone(),
                    "-peer".to_owned(),
                    peer_url,
                    "-metrics".to_owned(),
                    metrics_url,
                ],
            ),
        };
        let etcd = Supervised::spawn("etcd", &etcd_program, &etcd_args, &files.etcd_log)?;

        let path = |path: &Path| path.display().to_string();
        let mut apiserver_args = vec![
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={api_port}"),
            format!("--tls-cert-file={}", path(&files.serving_cert)),
            format!("--tls-private-key-file={}", path(&files.serving_key)),
            format!("--token-auth-file={}", path(&files.tokens)),
            "--authorization-mode=RBAC".to_owned(),
            format!(
                "--service-account-key-file={}",
                path(&files.service_account_public)
            ),
            format!(
                "--service-account-signing-key-file={}",
                path(&files.service_account_key)
            ),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--etcd-servers={etcd_url}"),
            "--service-cluster-ip-range=10.96.0.0/16".to_owned(),
            "--enable-priority-and-fairness=true".to_owned(),
            "--profiling=false".to_owned(),
            "--endpoint-reconciler-type=none".to_owned(),
        ];
        let audit_log = options.audit.then(|| root.join("logs").join("audit.log"));
        if let Some(audit_log) = &audit_log {
            apiserver_args.extend([
                format!("--audit-policy-file={}", path(&files.audit_policy)),
                format!("--audit-log-path={}", path(audit_log)),
                "--audit-log-format=json".to_owned(),
                // Never rotate during a test (the default rotates at 100 MB).
                "--audit-log-maxsize=100000".to_owned(),
            ]);
        }
        apiserver_args.extend(options.apiserver_flags.iter().cloned());
        let apiserver = Supervised::spawn(
            "kube-apiserver",
            &binaries.kube_apiserver,
            &apiserver_args,
            &files.apiserver_log,
        )?;
        let apiserver_command = (binaries.kube_apiserver.clone(), apiserver_args);

        let url = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = kubeconfig(&url, &pki)?;
        let kubeconfig_path = root.join("kubeconfig");
        write_private(&kubeconfig_path, &kubeconfig)?;
        let control_plane = Self {
            apiserver,
            apiserver_command,
            etcd,
            url,
            kubeconfig,
            kubeconfig_path,
            pki,
            audit_log,
            dir,
        };
        control_plane.wait_ready().await?;
        control_plane.install_route_crd(&binaries.route_crd).await?;
        Ok(control_plane)
    }

    /// Polls `/readyz` until the API server answers 200, failing as soon as either
    /// process has exited.
    async fn wait_ready(&self) -> Result<(), TestEnvError> {
        let admin = self.quiet_admin_client().await?;
        let deadline = Instant::now() + READY_PATIENCE;
        loop {
            if !self.etcd.is_running() {
                return Err(self.etcd.not_started("etcd exited"));
            }
            if !self.apiserver.is_running() {
                return Err(self.apiserver.not_started("kube-apiserver exited"));
            }
            let request = http::Request::get("/readyz").body(Vec::new());
            if let Ok(request) = request
                && admin.request_text(request).await.is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.apiserver.not_started(format!(
                    "/readyz did not answer 200 within {} s",
                    READY_PATIENCE.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates the Route CRD and waits until `route.openshift.io/v1` is served.
    async fn install_route_crd(&self, crd_file: &Path) -> Result<(), TestEnvError> {
        let text = std::fs::read_to_string(crd_file)
            .map_err(|source| io(&format!("reading {}", crd_file.display()), source))?;
        let crd: CustomResourceDefinition = serde_yaml::from_str(&text).map_err(|error| {
            TestEnvError::format(format!("parsing {}", crd_file.display()), error)
        })?;
        let admin = self.quiet_admin_client().await?;
        let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(TestEnvError::kube("creating the Route CRD", error)),
        }
        let deadline = Instant::now() + READY_PATIENCE;
        loop {
            let request = http::Request::get("/apis/route.openshift.io/v1").body(Vec::new());
            if let Ok(request) = request
                && admin.request_text(request).await.is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.apiserver.not_started(
                    "route.openshift.io/v1 was never served after the CRD was created",
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The API server's URL (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The kubeconfig file (mode 0600): contexts `router` (current) and `admin`.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The kubeconfig itself.
    pub fn kubeconfig(&self) -> &Kubeconfig {
        &self.kubeconfig
    }

    /// The CA certificate (PEM) that signed the API server's serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// The admin user's bearer token.
    pub fn admin_token(&self) -> &str {
        &self.pki.admin_token
    }

    /// The router identity's bearer token.
    pub fn router_token(&self) -> &str {
        &self.pki.router_token
    }

    /// The directory holding everything of this control plane (removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// kube-apiserver's log file.
    pub fn apiserver_log(&self) -> &Path {
        self.apiserver.log()
    }

    /// etcd's log file.
    pub fn etcd_log(&self) -> &Path {
        self.etcd.log()
    }

    /// Process ids of kube-apiserver and etcd (for checks that they are gone).
    pub fn pids(&self) -> [u32; 2] {
        [self.apiserver.pid(), self.etcd.pid()]
    }

    /// A client for a context of the kubeconfig ([`ADMIN_CONTEXT`] or
    /// [`ROUTER_CONTEXT`]).
    pub async fn client(&self, context: &str) -> Result<kube::Client, TestEnvError> {
        let config = kube::Config::from_custom_kubeconfig(
            self.kubeconfig.clone(),
            &KubeConfigOptions {
                context: Some(context.to_owned()),
                ..KubeConfigOptions::default()
            },
        )
        .await
        .map_err(|error| TestEnvError::format(format!("the {context} context"), error))?;
        kube::Client::try_from(config)
            .map_err(|error| TestEnvError::kube(format!("a client for {context}"), error))
    }

    /// An admin client without kube's tracing layer, for polling while the server
    /// starts: that layer logs every 5xx answer (a starting server's `/readyz`) as an
    /// error in the test's or benchmark's log.
    async fn quiet_admin_client(&self) -> Result<kube::Client, TestEnvError> {
        use kube::client::ConfigExt as _;
        let config = kube::Config::from_custom_kubeconfig(
            self.kubeconfig.clone(),
            &KubeConfigOptions {
                context: Some(ADMIN_CONTEXT.to_owned()),
                ..KubeConfigOptions::default()
            },
        )
        .await
        .map_err(|error| TestEnvError::format("the admin context", error))?;
        let connector = config
            .rustls_https_connector()
            .map_err(|error| TestEnvError::kube("a TLS connector", error))?;
        let auth = config
            .auth_layer()
            .map_err(|error| TestEnvError::kube("the admin's credentials", error))?;
        let service = tower::ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(auth)
            .map_err(tower::BoxError::from)
            .service(
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build(connector),
            );
        Ok(kube::Client::new(service, config.default_namespace))
    }

    /// A client for the admin user.
    pub async fn admin_client(&self) -> Result<kube::Client, TestEnvError> {
        self.client(ADMIN_CONTEXT).await
    }

    /// A client for the router identity.
    pub async fn router_client(&self) -> Result<kube::Client, TestEnvError> {
        self.client(ROUTER_CONTEXT).await
    }

    /// The API server's `/metrics` (read as admin).
    pub async fn metrics(&self) -> Result<Metrics, TestEnvError> {
        let admin = self.admin_client().await?;
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|error| TestEnvError::format("a /metrics request", error))?;
        let text = admin
            .request_text(request)
            .await
            .map_err(|error| TestEnvError::kube("reading the API server's /metrics", error))?;
        Ok(Metrics::parse(&text))
    }

    /// Every request audited so far (all users but the API server's own loopback
    /// traffic). Fails when the audit log is off.
    pub fn audit(&self) -> Result<AuditLog, TestEnvError> {
        let path = self.audit_log.as_deref().ok_or_else(|| {
            TestEnvError::format("the audit log", "this control plane was started without it")
        })?;
        AuditLog::read(path)
    }

    /// Kills kube-apiserver (SIGKILL, as a node losing it would) and waits until it is
    /// gone; etcd keeps running. Clients see refused connections until
    /// [`ControlPlane::start_apiserver`].
    pub fn kill_apiserver(&mut self) {
        self.apiserver.stop();
    }

    /// Starts kube-apiserver again, on the same port with the same flags and storage
    /// (an upgrade rolling the API server), and returns once `/readyz` answers 200:
    /// the instant is the caller's "the API answers again". Its log goes on in the
    /// same file (the earlier run's is kept beside it, `.1`).
    pub async fn start_apiserver(&mut self) -> Result<(), TestEnvError> {
        let log = self.apiserver.log().to_path_buf();
        let kept = log.with_extension("log.1");
        std::fs::rename(&log, &kept)
            .map_err(|source| io("keeping the earlier kube-apiserver log", source))?;
        let (program, args) = &self.apiserver_command;
        self.apiserver = Supervised::spawn("kube-apiserver", program, args, &log)?;
        self.wait_ready().await
    }

    /// Whether kube-apiserver is running.
    pub fn apiserver_running(&self) -> bool {
        self.apiserver.is_running()
    }

    /// Stops both processes now (dropping does the same).
    pub fn stop(&mut self) {
        self.apiserver.stop();
        self.etcd.stop();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- kube-apiserver log ({}) ---\n{}\n--- etcd log ---\n{}",
                self.apiserver.log().display(),
                self.apiserver.log_tail(),
                self.etcd.log_tail()
            );
        }
        self.stop();
    }
}

/// The files a control plane is started with.
struct Files {
    serving_cert: PathBuf,
    serving_key: PathBuf,
    service_account_key: PathBuf,
    service_account_public: PathBuf,
    tokens: PathBuf,
    audit_policy: PathBuf,
    etcd_log: PathBuf,
    apiserver_log: PathBuf,
}

impl Files {
    fn write(root: &Path, pki: &ControlPlanePki) -> Result<Self, TestEnvError> {
        let pki_dir = root.join("pki");
        let logs = root.join("logs");
        for dir in [&pki_dir, &logs] {
            std::fs::create_dir_all(dir)
                .map_err(|source| io(&format!("creating {}", dir.display()), source))?;
        }
        let files = Self {
            serving_cert: pki_dir.join("apiserver.crt"),
            serving_key: pki_dir.join("apiserver.key"),
            service_account_key: pki_dir.join("sa.key"),
            service_account_public: pki_dir.join("sa.pub"),
            tokens: pki_dir.join("tokens.csv"),
            audit_policy: root.join("audit-policy.yaml"),
            etcd_log: logs.join("etcd.log"),
            apiserver_log: logs.join("kube-apiserver.log"),
        };
        let tokens = format!(
            "{},{ADMIN_USER},admin-uid,\"system:masters\"\n\
             {},{ROUTER_USER},router-uid,\"system:serviceaccounts,system:serviceaccounts:{ROUTER_NAMESPACE}\"\n",
            pki.admin_token, pki.router_token
        );
        for (path, text) in [
            (pki_dir.join("ca.crt"), pki.ca_pem.as_str()),
            (files.serving_cert.clone(), &pki.serving_cert_pem),
            (files.serving_key.clone(), &pki.serving_key_pem),
            (
                files.service_account_key.clone(),
                &pki.service_account_key_pem,
            ),
            (
                files.service_account_public.clone(),
                &pki.service_account_public_pem,
            ),
            (files.tokens.clone(), &tokens),
            (files.audit_policy.clone(), AUDIT_POLICY),
        ] {
            std::fs::write(&path, text)
                .map_err(|source| io(&format!("writing {}", path.display()), source))?;
        }
        Ok(files)
    }
}

/// A kubeconfig with the `router` (current) and `admin` contexts.
fn kubeconfig(url: &str, pki: &ControlPlanePki) -> Result<Kubeconfig, TestEnvError> {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(&pki.ca_pem);
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": url, "certificate-authority-data": ca}}],
        "users": [
            {"name": ADMIN_CONTEXT, "user": {"token": pki.admin_token}},
            {"name": ROUTER_CONTEXT, "user": {"token": pki.router_token}},
        ],
        "contexts": [
            {"name": ADMIN_CONTEXT, "context": {"cluster": "test", "user": ADMIN_CONTEXT}},
            // The router identity is a service account of ROUTER_NAMESPACE: in a pod
            // its default namespace is that one (its Leases live there).
            {"name": ROUTER_CONTEXT, "context": {"cluster": "test", "user": ROUTER_CONTEXT, "namespace": ROUTER_NAMESPACE}},
        ],
        "current-context": ROUTER_CONTEXT,
    }))
    .map_err(|error| TestEnvError::format("building the kubeconfig", error))
}

fn write_private(path: &Path, kubeconfig: &Kubeconfig) -> Result<(), TestEnvError> {
    kube_common::kubeconfig::write(kubeconfig, path)
        .map_err(|error| TestEnvError::format("writing the kubeconfig", error))
}

/// Four distinct ports free right now on 127.0.0.1 (all bound at once, so distinct).
fn free_ports() -> Result<[u16; 4], TestEnvError> {
    let bind = || {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| Ok((listener.local_addr()?.port(), listener)))
            .map_err(|source| io("finding a free port", source))
    };
    let (a, _a) = bind()?;
    let (b, _b) = bind()?;
    let (c, _c) = bind()?;
    let (d, _d) = bind()?;
    Ok([a, b, c, d])
}

fn io(what: &str, source: std::io::Error) -> TestEnvError {
    TestEnvError::Io {
        what: what.to_owned(),
        source,
    }
}
